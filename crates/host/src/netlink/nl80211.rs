//! The nl80211 generic netlink family (cfg80211): interface, scan (BSS)
//! and station dumps, with only the attributes the wifi collector reads
//! decoded (by `wl-nl80211`), as mdlayher/wifi reads them.

use netlink_packet_core::{
    DecodeError, NlaBuffer, NlasIterator, Parseable, ParseableParametrized, NLA_TYPE_MASK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use wl_nl80211::{Nl80211Attr, Nl80211BssInfo, Nl80211Command, Nl80211Message, Nl80211RateInfo, Nl80211StationInfo};

use super::{genl_family_id, Channel, Error};

/// A NETLINK_GENERIC socket speaking nl80211.
pub struct Nl80211(Channel);

impl Default for Nl80211 {
    fn default() -> Self {
        Nl80211::new()
    }
}

impl Nl80211 {
    /// Opens nothing yet: the socket is opened by the first request.
    pub fn new() -> Self {
        Nl80211(Channel::generic())
    }

    /// The id of the "nl80211" family, asked again on every call (the
    /// family comes and goes with cfg80211).
    pub fn family(&mut self) -> Result<u16, Error> {
        genl_family_id(&mut self.0, Nl80211Message::family_name())
    }

    /// The attributes of every message of one `cmd` dump of `family`, for
    /// one interface (by index, and MAC when known) or all.
    pub fn dump(
        &mut self,
        family: u16,
        request: &'static str,
        cmd: Nl80211Command,
        ifindex: Option<u32>,
        mac: Option<[u8; 6]>,
    ) -> Result<Vec<Vec<Nl80211Attr>>, Error> {
        let mut attributes = Vec::new();
        if let Some(i) = ifindex {
            attributes.push(Nl80211Attr::IfIndex(i));
            if let Some(mac) = mac {
                attributes.push(Nl80211Attr::Mac(mac));
            }
        }
        let answer: Vec<GenlMessage<Reply>> = self.0.request(request, NLM_F_DUMP | NLM_F_REQUEST, || {
            let mut m = GenlMessage::from_payload(Nl80211Message { cmd, attributes: attributes.clone() });
            m.set_resolved_family_id(family);
            m
        })?;
        Ok(answer.into_iter().map(|m| m.payload.0).collect())
    }
}

/// nl80211 attribute numbers (linux/nl80211.h) of what is decoded.
mod nl {
    pub const ATTR_IFINDEX: u16 = 3;
    pub const ATTR_IFNAME: u16 = 4;
    pub const ATTR_MAC: u16 = 6;
    pub const ATTR_STA_INFO: u16 = 21;
    pub const ATTR_WIPHY_FREQ: u16 = 38;
    pub const ATTR_BSS: u16 = 47;

    pub const BSS_BSSID: u16 = 1;
    pub const BSS_INFORMATION_ELEMENTS: u16 = 6;
    pub const BSS_STATUS: u16 = 9;

    pub const STA_INFO_INACTIVE_TIME: u16 = 1;
    pub const STA_INFO_RX_BYTES: u16 = 2;
    pub const STA_INFO_TX_BYTES: u16 = 3;
    pub const STA_INFO_SIGNAL: u16 = 7;
    pub const STA_INFO_TX_BITRATE: u16 = 8;
    pub const STA_INFO_RX_PACKETS: u16 = 9;
    pub const STA_INFO_TX_PACKETS: u16 = 10;
    pub const STA_INFO_TX_RETRIES: u16 = 11;
    pub const STA_INFO_TX_FAILED: u16 = 12;
    pub const STA_INFO_RX_BITRATE: u16 = 14;
    pub const STA_INFO_CONNECTED_TIME: u16 = 16;
    pub const STA_INFO_BEACON_LOSS: u16 = 18;
    pub const STA_INFO_RX_BYTES64: u16 = 23;
    pub const STA_INFO_TX_BYTES64: u16 = 24;

    pub const RATE_INFO_BITRATE: u16 = 1;
    pub const RATE_INFO_BITRATE32: u16 = 5;
}

/// An nl80211 answer with only the attributes the collector reads decoded
/// (by `wl-nl80211`), in their order; the rest (dozens of kinds, some of
/// them vendor-specific) are skipped unread, as mdlayher/wifi skips them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reply(pub Vec<Nl80211Attr>);

impl ParseableParametrized<[u8], GenlHeader> for Reply {
    fn parse_with_param(buf: &[u8], _header: GenlHeader) -> Result<Self, DecodeError> {
        decode_reply(buf).map(Reply)
    }
}

/// The attributes of one nl80211 answer's payload (after the genl header).
pub fn decode_reply(buf: &[u8]) -> Result<Vec<Nl80211Attr>, DecodeError> {
    let mut out = Vec::new();
    for nla in NlasIterator::new(buf) {
        let nla = nla?;
        match nla.kind() & NLA_TYPE_MASK {
            nl::ATTR_IFINDEX | nl::ATTR_IFNAME | nl::ATTR_MAC | nl::ATTR_WIPHY_FREQ => out.push(Nl80211Attr::parse(&nla)?),
            nl::ATTR_BSS => out.push(Nl80211Attr::Bss(nested(nla.value(), decode_bss_attr)?)),
            nl::ATTR_STA_INFO => out.push(Nl80211Attr::StationInfo(nested(nla.value(), decode_station_attr)?)),
            _ => {}
        }
    }
    Ok(out)
}

/// Decodes one nested attribute, or skips it (`None`).
type Keep<T> = fn(&NlaBuffer<&[u8]>) -> Result<Option<T>, DecodeError>;

/// The nested attributes of `buf` that `one` keeps.
fn nested<T>(buf: &[u8], one: Keep<T>) -> Result<Vec<T>, DecodeError> {
    let mut out = Vec::new();
    for nla in NlasIterator::new(buf) {
        if let Some(x) = one(&nla?)? {
            out.push(x);
        }
    }
    Ok(out)
}

fn decode_bss_attr(nla: &NlaBuffer<&[u8]>) -> Result<Option<Nl80211BssInfo>, DecodeError> {
    match nla.kind() & NLA_TYPE_MASK {
        nl::BSS_BSSID | nl::BSS_INFORMATION_ELEMENTS | nl::BSS_STATUS => Nl80211BssInfo::parse(nla).map(Some),
        _ => Ok(None),
    }
}

fn decode_station_attr(nla: &NlaBuffer<&[u8]>) -> Result<Option<Nl80211StationInfo>, DecodeError> {
    use nl::*;
    match nla.kind() & NLA_TYPE_MASK {
        STA_INFO_INACTIVE_TIME
        | STA_INFO_RX_BYTES
        | STA_INFO_TX_BYTES
        | STA_INFO_SIGNAL
        | STA_INFO_RX_PACKETS
        | STA_INFO_TX_PACKETS
        | STA_INFO_TX_RETRIES
        | STA_INFO_TX_FAILED
        | STA_INFO_CONNECTED_TIME
        | STA_INFO_BEACON_LOSS
        | STA_INFO_RX_BYTES64
        | STA_INFO_TX_BYTES64 => Nl80211StationInfo::parse(nla).map(Some),
        STA_INFO_TX_BITRATE => Ok(Some(Nl80211StationInfo::TxBitrate(nested(nla.value(), decode_rate_attr)?))),
        STA_INFO_RX_BITRATE => Ok(Some(Nl80211StationInfo::RxBitrate(nested(nla.value(), decode_rate_attr)?))),
        _ => Ok(None),
    }
}

fn decode_rate_attr(nla: &NlaBuffer<&[u8]>) -> Result<Option<Nl80211RateInfo>, DecodeError> {
    match nla.kind() & NLA_TYPE_MASK {
        nl::RATE_INFO_BITRATE | nl::RATE_INFO_BITRATE32 => Nl80211RateInfo::parse(nla).map(Some),
        _ => Ok(None),
    }
}
