//! The ethtool generic netlink family (Linux 5.6+): every device's link
//! modes (speed, duplex), for netclass.

use ethtool::{EthtoolAttr, EthtoolHeader, EthtoolLinkModeAttr, EthtoolLinkModeDuplex, EthtoolMessage};
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_generic::{GenlFamily, GenlMessage};

use super::{genl_family_id, Channel, Error};

/// One device's link modes from the ethtool netlink family.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMode {
    pub index: u32,
    pub name: String,
    /// Mb/s; `None` when the device does not know (SPEED_UNKNOWN).
    pub speed: Option<u32>,
    pub duplex: Option<EthtoolLinkModeDuplex>,
}

/// The kernel's SPEED_UNKNOWN.
const SPEED_UNKNOWN: u32 = u32::MAX;

/// The link modes of one ETHTOOL_MSG_LINKMODES_GET answer.
pub fn link_mode(m: &EthtoolMessage) -> Option<LinkMode> {
    let mut lm = LinkMode { index: 0, name: String::new(), speed: None, duplex: None };
    let mut named = false;
    for a in &m.nlas {
        let EthtoolAttr::LinkMode(a) = a else { continue };
        match a {
            EthtoolLinkModeAttr::Header(h) => {
                for h in h {
                    match h {
                        EthtoolHeader::DevIndex(i) => lm.index = *i,
                        EthtoolHeader::DevName(n) => {
                            lm.name = n.clone();
                            named = true;
                        }
                        _ => {}
                    }
                }
            }
            EthtoolLinkModeAttr::Speed(s) => lm.speed = (*s != SPEED_UNKNOWN).then_some(*s),
            EthtoolLinkModeAttr::Duplex(d) => lm.duplex = Some(*d),
            _ => {}
        }
    }
    named.then_some(lm)
}

/// A NETLINK_GENERIC socket speaking the ethtool family.
pub struct Ethtool {
    ch: Channel,
    family: Option<u16>,
}

impl Default for Ethtool {
    fn default() -> Self {
        Ethtool::new()
    }
}

impl Ethtool {
    pub fn new() -> Self {
        Ethtool { ch: Channel::generic(), family: None }
    }

    /// The id of the "ethtool" generic netlink family (kernels since 5.6).
    fn family(&mut self) -> Result<u16, Error> {
        if let Some(id) = self.family {
            return Ok(id);
        }
        let id = genl_family_id(&mut self.ch, EthtoolMessage::family_name())?;
        self.family = Some(id);
        Ok(id)
    }

    /// Every device's link modes (ETHTOOL_MSG_LINKMODES_GET dump); devices
    /// whose driver has none are not in it.
    pub fn link_modes(&mut self) -> Result<Vec<LinkMode>, Error> {
        let id = self.family()?;
        let answer: Result<Vec<GenlMessage<EthtoolMessage>>, _> =
            self.ch.request("ETHTOOL_MSG_LINKMODES_GET", NLM_F_DUMP | NLM_F_REQUEST, || {
                let mut m = GenlMessage::from_payload(EthtoolMessage::new_link_mode_get(None));
                m.set_resolved_family_id(id);
                m
            });
        if answer.is_err() {
            // The family id may have changed (module reloaded).
            self.family = None;
        }
        Ok(answer?.iter().filter_map(|m| link_mode(&m.payload)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against this kernel: it has the ethtool family; lo has no link modes.
    #[test]
    fn dumps_this_hosts_link_modes() {
        let modes = Ethtool::new().link_modes().expect("ethtool link modes dump");
        assert!(modes.iter().all(|m| m.name != "lo"), "{modes:?}");
    }

    #[test]
    fn link_modes_of_an_ethtool_answer() {
        let m = EthtoolMessage {
            cmd: ethtool::EthtoolCmd::LinkModeGetReply,
            nlas: vec![
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Header(vec![EthtoolHeader::DevIndex(2), EthtoolHeader::DevName("eth0".into())])),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Speed(1000)),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Duplex(EthtoolLinkModeDuplex::Full)),
            ],
        };
        assert_eq!(
            link_mode(&m),
            Some(LinkMode { index: 2, name: "eth0".into(), speed: Some(1000), duplex: Some(EthtoolLinkModeDuplex::Full) })
        );
        let unknown = EthtoolMessage {
            cmd: ethtool::EthtoolCmd::LinkModeGetReply,
            nlas: vec![
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Header(vec![EthtoolHeader::DevName("veth0".into())])),
                EthtoolAttr::LinkMode(EthtoolLinkModeAttr::Speed(u32::MAX)),
            ],
        };
        assert_eq!(link_mode(&unknown).and_then(|m| m.speed), None);
        assert_eq!(link_mode(&EthtoolMessage { cmd: ethtool::EthtoolCmd::LinkModeGetReply, nlas: vec![] }), None);
    }
}
