//! `wifi`: every WiFi interface's frequency, the BSS it is associated with
//! and the statistics of its stations (`node_wifi_*`), as node_exporter 1.12
//! reads them through mdlayher/wifi: over nl80211 generic netlink
//! (NL80211_CMD_GET_INTERFACE, GET_SCAN and GET_STATION dumps, decoded with
//! `wl-nl80211`'s attribute types), or, with `--collector.wifi.fixtures=DIR`,
//! from `DIR/interfaces.json` and `DIR/<iface>/{bss,stationinfo}.json`, Go
//! JSON encodings of mdlayher/wifi's structs. No nl80211 family (no
//! cfg80211) or no permission is "no data"; an interface without a BSS or
//! station information simply lacks those series.

use std::path::{Path, PathBuf};

use expo::{Kind, Sink};
use wl_nl80211::{Nl80211Attr, Nl80211BssInfo, Nl80211Command, Nl80211RateInfo, Nl80211StationInfo};

use crate::flags::{Flags, StringFlag};
use crate::netlink::nl80211::Nl80211;
use crate::{ConfigError, Error, Paths};

pub const FIXTURES: StringFlag =
    StringFlag { name: "collector.wifi.fixtures", default: "", help: "test fixtures to use for wifi collector metrics" };

pub struct Options {
    /// `--collector.wifi.fixtures`: read JSON fixtures instead of nl80211.
    pub fixtures: String,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        vec![FIXTURES.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { fixtures: FIXTURES.get(f) })
    }
}

/// What the collector uses of one mdlayher/wifi `Interface`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Interface {
    pub index: u32,
    pub name: String,
    /// `None` when the interface has no hardware address (no MAC attribute).
    pub mac: Option<Vec<u8>>,
    pub frequency_mhz: i64,
}

/// What the collector uses of one mdlayher/wifi `BSS`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Bss {
    pub ssid: String,
    pub bssid: Vec<u8>,
    /// nl80211's BSS status number, as mdlayher/wifi keeps it.
    pub status: i64,
}

/// What the collector uses of one mdlayher/wifi `StationInfo` (Go `int`s;
/// durations in nanoseconds).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Station {
    pub mac: Vec<u8>,
    pub connected_ns: i64,
    pub inactive_ns: i64,
    pub received_bytes: i64,
    pub transmitted_bytes: i64,
    pub received_packets: i64,
    pub transmitted_packets: i64,
    pub receive_bitrate: i64,
    pub transmit_bitrate: i64,
    pub signal: i64,
    pub transmit_retries: i64,
    pub transmit_failed: i64,
    pub beacon_loss: i64,
}

enum Source {
    Fixtures(PathBuf),
    Kernel(Nl80211),
}

pub struct Collector {
    source: Source,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        let source = if o.fixtures.is_empty() { Source::Kernel(Nl80211::new()) } else { Source::Fixtures(PathBuf::from(o.fixtures)) };
        Ok(Collector { source })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        match &mut self.source {
            Source::Fixtures(dir) => {
                let dir = dir.clone();
                let mut fx = Fixtures(&dir);
                collect(&mut fx, sink)
            }
            Source::Kernel(nl) => {
                let family = match nl.family() {
                    Ok(id) => id,
                    Err(e) if unavailable(&e) => {
                        tracing::debug!("wifi collector metrics are not available for this system: {e}");
                        return Err(Error::NoData("nl80211 is not available".into()));
                    }
                    Err(e) => return Err(other(format!("failed to access wifi data: {e}"))),
                };
                collect(&mut Kernel { nl, family }, sink)
            }
        }
    }
}

fn other(msg: String) -> Error {
    Error::Other(msg.into())
}

/// Whether node_exporter would call this failure "not available"
/// (`os.ErrNotExist` or `os.ErrPermission`): ENOENT, EPERM or EACCES.
fn unavailable(e: &crate::netlink::Error) -> bool {
    let errno = match e {
        crate::netlink::Error::Kernel { errno, .. } => Some(*errno),
        crate::netlink::Error::Socket(io) => io.raw_os_error(),
        crate::netlink::Error::Decode { .. } => None,
    };
    matches!(errno, Some(libc::ENOENT | libc::EPERM | libc::EACCES))
}

/// Where interfaces, BSSs and stations come from. `Ok(None)` is
/// mdlayher/wifi's `os.ErrNotExist`: the interface has none.
trait Stater {
    fn interfaces(&mut self) -> Result<Vec<Interface>, Error>;
    fn bss(&mut self, ifi: &Interface) -> Result<Option<Bss>, Error>;
    fn stations(&mut self, ifi: &Interface) -> Result<Option<Vec<Station>>, Error>;
}

fn collect(st: &mut dyn Stater, sink: &mut Sink) -> Result<(), Error> {
    let ifis = st.interfaces()?;
    for ifi in &ifis {
        // Some virtual devices have no name and are skipped.
        if ifi.name.is_empty() {
            continue;
        }
        let dev = ifi.name.as_str();
        sink.family(
            "node_wifi_interface_frequency_hertz",
            "The current frequency a WiFi interface is operating at, in hertz.",
            Kind::Gauge,
        )
        .sample(&[("device", dev)], ifi.frequency_mhz as f64 * 1000.0 * 1000.0);

        match st.bss(ifi)? {
            Some(bss) => {
                let bssid = mac_string(&bss.bssid);
                sink.family(
                    "node_wifi_station_info",
                    "Labeled WiFi interface station information as provided by the operating system.",
                    Kind::Gauge,
                )
                .sample(&[("bssid", &bssid), ("device", dev), ("mode", bss_mode(bss.status)), ("ssid", &bss.ssid)], 1.0);
            }
            None => tracing::debug!(device = dev, "BSS information not found for wifi device"),
        }

        match st.stations(ifi)? {
            Some(stations) => {
                for s in &stations {
                    station_samples(sink, dev, s);
                }
            }
            None => tracing::debug!(device = dev, "station information not found for wifi device"),
        }
    }
    Ok(())
}

fn station_samples(sink: &mut Sink, dev: &str, s: &Station) {
    let mac = mac_string(&s.mac);
    let labels = [("device", dev), ("mac_address", mac.as_str())];
    let rows: [(&str, &str, Kind, f64); 12] = [
        (
            "node_wifi_station_connected_seconds_total",
            "The total number of seconds a station has been connected to an access point.",
            Kind::Counter,
            go_seconds(s.connected_ns),
        ),
        (
            "node_wifi_station_inactive_seconds",
            "The number of seconds since any wireless activity has occurred on a station.",
            Kind::Gauge,
            go_seconds(s.inactive_ns),
        ),
        (
            "node_wifi_station_receive_bits_per_second",
            "The current WiFi receive bitrate of a station, in bits per second.",
            Kind::Gauge,
            s.receive_bitrate as f64,
        ),
        (
            "node_wifi_station_transmit_bits_per_second",
            "The current WiFi transmit bitrate of a station, in bits per second.",
            Kind::Gauge,
            s.transmit_bitrate as f64,
        ),
        (
            "node_wifi_station_receive_bytes_total",
            "The total number of bytes received by a WiFi station.",
            Kind::Counter,
            s.received_bytes as f64,
        ),
        (
            "node_wifi_station_transmit_bytes_total",
            "The total number of bytes transmitted by a WiFi station.",
            Kind::Counter,
            s.transmitted_bytes as f64,
        ),
        ("node_wifi_station_signal_dbm", "The current WiFi signal strength, in decibel-milliwatts (dBm).", Kind::Gauge, s.signal as f64),
        (
            "node_wifi_station_transmit_retries_total",
            "The total number of times a station has had to retry while sending a packet.",
            Kind::Counter,
            s.transmit_retries as f64,
        ),
        (
            "node_wifi_station_transmit_failed_total",
            "The total number of times a station has failed to send a packet.",
            Kind::Counter,
            s.transmit_failed as f64,
        ),
        (
            "node_wifi_station_beacon_loss_total",
            "The total number of times a station has detected a beacon loss.",
            Kind::Counter,
            s.beacon_loss as f64,
        ),
        (
            "node_wifi_station_transmitted_packets_total",
            "The total number of packets transmitted by a station.",
            Kind::Counter,
            s.transmitted_packets as f64,
        ),
        (
            "node_wifi_station_received_packets_total",
            "The total number of packets received by a station.",
            Kind::Counter,
            s.received_packets as f64,
        ),
    ];
    for (name, help, kind, v) in rows {
        sink.family(name, help, kind).sample(&labels, v);
    }
}

/// node_exporter's `mode` label of a BSS status. mdlayher/wifi numbers
/// its statuses authenticated 0, associated 1, not associated 2, IBSS
/// joined 3 while the kernel's IBSS joined is 2: kept as node_exporter
/// does it.
pub fn bss_mode(status: i64) -> &'static str {
    match status {
        0 | 1 => "client",
        3 => "ad-hoc",
        _ => "unknown",
    }
}

/// Go's `net.HardwareAddr.String()`.
pub fn mac_string(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 3);
    for (i, x) in b.iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Go's `time.Duration.Seconds()`.
pub fn go_seconds(ns: i64) -> f64 {
    let sec = ns / 1_000_000_000;
    let nsec = ns % 1_000_000_000;
    sec as f64 + nsec as f64 / 1e9
}

/// Go's byte-wise UTF-8 decoding: each invalid byte becomes U+FFFD.
pub fn go_lossy(mut b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    while !b.is_empty() {
        match std::str::from_utf8(b) {
            Ok(v) => {
                s.push_str(v);
                break;
            }
            Err(e) => {
                let good = e.valid_up_to();
                s.push_str(std::str::from_utf8(&b[..good]).unwrap_or_default());
                s.push(char::REPLACEMENT_CHARACTER);
                b = &b[good + 1..];
            }
        }
    }
    s
}

// ---------------------------------------------------------------------------
// The fixtures mode.

struct Fixtures<'a>(&'a Path);

impl Fixtures<'_> {
    /// The file's bytes; `Ok(None)` when it does not exist.
    fn read(&self, rel: &Path) -> Result<Option<(PathBuf, Vec<u8>)>, Error> {
        let path = self.0.join(rel);
        let mut buf = Vec::new();
        match crate::io::read_into(&path, &mut buf) {
            Ok(()) => Ok(Some((path, buf))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path, e)),
        }
    }
}

impl Stater for Fixtures<'_> {
    fn interfaces(&mut self) -> Result<Vec<Interface>, Error> {
        let rel = Path::new("interfaces.json");
        match self.read(rel)? {
            Some((path, b)) => {
                parse_interfaces_json(&b).map_err(|m| Error::parse(&path, format!("failed to retrieve wifi interfaces: {m}")))
            }
            None => {
                let path = self.0.join(rel);
                Err(Error::io(&path, std::io::ErrorKind::NotFound.into()))
            }
        }
    }

    fn bss(&mut self, ifi: &Interface) -> Result<Option<Bss>, Error> {
        match self.read(&Path::new(&ifi.name).join("bss.json"))? {
            Some((path, b)) => parse_bss_json(&b)
                .map(Some)
                .map_err(|m| Error::parse(&path, format!("failed to retrieve BSS for device {}: {m}", ifi.name))),
            None => Ok(None),
        }
    }

    fn stations(&mut self, ifi: &Interface) -> Result<Option<Vec<Station>>, Error> {
        match self.read(&Path::new(&ifi.name).join("stationinfo.json"))? {
            Some((path, b)) => parse_stations_json(&b)
                .map(Some)
                .map_err(|m| Error::parse(&path, format!("failed to retrieve station info for device {:?}: {m}", ifi.name))),
            None => Ok(None),
        }
    }
}

// The fixtures are Go JSON encodings of mdlayher/wifi v0.9's structs
// (field names, no tags), decoded here by serde into mirrors of them. Every
// field is decoded, read or not, so that a value of the wrong type or out of
// its field's range is an error as in Go; `null` leaves a field zero (nil
// for `[]byte`); unknown fields are ignored. Keys are the Go field name or
// it in lower case (as node_exporter's fixtures spell them); Go's other
// case-insensitive matches are not made, a repeated key is an error, and a
// lone UTF-16 surrogate escape is an error where Go reads U+FFFD. Invalid
// UTF-8 in a string is U+FFFD, as in Go.

/// mdlayher/wifi's `Interface`.
#[derive(serde::Deserialize)]
#[allow(dead_code)] // The fields the collector does not use: decoded for the type check.
struct GoInterface {
    #[serde(rename = "Index", alias = "index")]
    index: Option<i64>,
    #[serde(rename = "Name", alias = "name")]
    name: Option<String>,
    #[serde(rename = "HardwareAddr", alias = "hardwareaddr")]
    hardware_addr: Option<GoBytes>,
    #[serde(rename = "PHY", alias = "phy")]
    phy: Option<i64>,
    #[serde(rename = "Device", alias = "device")]
    device: Option<i64>,
    #[serde(rename = "Type", alias = "type")]
    kind: Option<i64>,
    #[serde(rename = "Frequency", alias = "frequency")]
    frequency: Option<i64>,
    #[serde(rename = "ChannelWidth", alias = "channelwidth")]
    channel_width: Option<i64>,
}

/// mdlayher/wifi's `BSSLoad`.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct GoBssLoad {
    #[serde(rename = "Version", alias = "version")]
    version: Option<i64>,
    #[serde(rename = "StationCount", alias = "stationcount")]
    station_count: Option<u16>,
    #[serde(rename = "ChannelUtilization", alias = "channelutilization")]
    channel_utilization: Option<u8>,
    #[serde(rename = "AvailableAdmissionCapacity", alias = "availableadmissioncapacity")]
    available_admission_capacity: Option<u16>,
}

/// mdlayher/wifi's `RSNInfo`.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct GoRsnInfo {
    #[serde(rename = "Version", alias = "version")]
    version: Option<u16>,
    #[serde(rename = "GroupCipher", alias = "groupcipher")]
    group_cipher: Option<u32>,
    #[serde(rename = "PairwiseCiphers", alias = "pairwiseciphers")]
    pairwise_ciphers: Option<Vec<Option<u32>>>,
    #[serde(rename = "AKMs", alias = "akms")]
    akms: Option<Vec<Option<u32>>>,
    #[serde(rename = "Capabilities", alias = "capabilities")]
    capabilities: Option<u16>,
    #[serde(rename = "GroupMgmtCipher", alias = "groupmgmtcipher")]
    group_mgmt_cipher: Option<u32>,
}

/// mdlayher/wifi's `BSS`.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct GoBss {
    #[serde(rename = "SSID", alias = "ssid")]
    ssid: Option<String>,
    #[serde(rename = "BSSID", alias = "bssid")]
    bssid: Option<GoBytes>,
    #[serde(rename = "Frequency", alias = "frequency")]
    frequency: Option<i64>,
    #[serde(rename = "BeaconInterval", alias = "beaconinterval")]
    beacon_interval: Option<i64>,
    #[serde(rename = "LastSeen", alias = "lastseen")]
    last_seen: Option<i64>,
    #[serde(rename = "Status", alias = "status")]
    status: Option<i64>,
    #[serde(rename = "Signal", alias = "signal")]
    signal: Option<i32>,
    #[serde(rename = "SignalUnspecified", alias = "signalunspecified")]
    signal_unspecified: Option<u32>,
    #[serde(rename = "Load", alias = "load")]
    load: Option<GoBssLoad>,
    #[serde(rename = "RSN", alias = "rsn")]
    rsn: Option<GoRsnInfo>,
}

/// mdlayher/wifi's `StationInfo` (durations in nanoseconds).
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct GoStationInfo {
    #[serde(rename = "InterfaceIndex", alias = "interfaceindex")]
    interface_index: Option<i64>,
    #[serde(rename = "HardwareAddr", alias = "hardwareaddr")]
    hardware_addr: Option<GoBytes>,
    #[serde(rename = "Connected", alias = "connected")]
    connected: Option<i64>,
    #[serde(rename = "Inactive", alias = "inactive")]
    inactive: Option<i64>,
    #[serde(rename = "ReceivedBytes", alias = "receivedbytes")]
    received_bytes: Option<i64>,
    #[serde(rename = "TransmittedBytes", alias = "transmittedbytes")]
    transmitted_bytes: Option<i64>,
    #[serde(rename = "ReceivedPackets", alias = "receivedpackets")]
    received_packets: Option<i64>,
    #[serde(rename = "TransmittedPackets", alias = "transmittedpackets")]
    transmitted_packets: Option<i64>,
    #[serde(rename = "ReceiveBitrate", alias = "receivebitrate")]
    receive_bitrate: Option<i64>,
    #[serde(rename = "TransmitBitrate", alias = "transmitbitrate")]
    transmit_bitrate: Option<i64>,
    #[serde(rename = "Signal", alias = "signal")]
    signal: Option<i64>,
    #[serde(rename = "SignalAverage", alias = "signalaverage")]
    signal_average: Option<i64>,
    #[serde(rename = "TransmitRetries", alias = "transmitretries")]
    transmit_retries: Option<i64>,
    #[serde(rename = "TransmitFailed", alias = "transmitfailed")]
    transmit_failed: Option<i64>,
    #[serde(rename = "BeaconLoss", alias = "beaconloss")]
    beacon_loss: Option<i64>,
}

/// A Go `[]byte`: a base64 string (Go's `StdEncoding`: padded, `\r` and
/// `\n` ignored, non-zero trailing bits allowed) or an array of bytes.
struct GoBytes(Vec<u8>);

impl<'de> serde::Deserialize<'de> for GoBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Base64(String),
            Octets(Vec<Option<u8>>),
        }
        match Repr::deserialize(d)? {
            Repr::Base64(s) => base64_decode(&s).map(GoBytes).map_err(serde::de::Error::custom),
            Repr::Octets(b) => Ok(GoBytes(b.into_iter().map(Option::unwrap_or_default).collect())),
        }
    }
}

/// Go's `base64.StdEncoding.DecodeString`.
fn base64_decode(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::{general_purpose::GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const GO_STD: GeneralPurpose =
        GeneralPurpose::new(&base64::alphabet::STANDARD, GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true));
    let b: Vec<u8> = s.bytes().filter(|c| *c != b'\r' && *c != b'\n').collect();
    GO_STD.decode(b)
}

/// Decodes one fixture file, its invalid UTF-8 first made U+FFFD as Go's
/// decoder does in strings (outside them it is a syntax error either way).
fn from_go_json<T: serde::de::DeserializeOwned>(text: &[u8]) -> Result<T, String> {
    serde_json::from_str(&go_lossy(text)).map_err(|e| e.to_string())
}

/// `interfaces.json`: a JSON array of mdlayher/wifi `Interface`s (a Go
/// `[]*Interface`: `null` is empty, a `null` element an error).
pub fn parse_interfaces_json(text: &[u8]) -> Result<Vec<Interface>, String> {
    let v: Option<Vec<GoInterface>> = from_go_json(text)?;
    Ok(v.unwrap_or_default()
        .into_iter()
        .map(|i| Interface {
            index: i.index.unwrap_or_default() as u32,
            name: i.name.unwrap_or_default(),
            mac: i.hardware_addr.map(|b| b.0),
            frequency_mhz: i.frequency.unwrap_or_default(),
        })
        .collect())
}

/// `<iface>/bss.json`: one mdlayher/wifi `BSS` (null is the zero BSS).
pub fn parse_bss_json(text: &[u8]) -> Result<Bss, String> {
    let v: Option<GoBss> = from_go_json(text)?;
    Ok(v.map(|b| Bss {
        ssid: b.ssid.unwrap_or_default(),
        bssid: b.bssid.map(|b| b.0).unwrap_or_default(),
        status: b.status.unwrap_or_default(),
    })
    .unwrap_or_default())
}

/// `<iface>/stationinfo.json`: a JSON array of mdlayher/wifi `StationInfo`s
/// (a Go `[]*StationInfo`: `null` is empty, a `null` element, a nil pointer
/// node_exporter would dereference, an error).
pub fn parse_stations_json(text: &[u8]) -> Result<Vec<Station>, String> {
    let v: Option<Vec<GoStationInfo>> = from_go_json(text)?;
    Ok(v.unwrap_or_default()
        .into_iter()
        .map(|s| Station {
            mac: s.hardware_addr.map(|b| b.0).unwrap_or_default(),
            connected_ns: s.connected.unwrap_or_default(),
            inactive_ns: s.inactive.unwrap_or_default(),
            received_bytes: s.received_bytes.unwrap_or_default(),
            transmitted_bytes: s.transmitted_bytes.unwrap_or_default(),
            received_packets: s.received_packets.unwrap_or_default(),
            transmitted_packets: s.transmitted_packets.unwrap_or_default(),
            receive_bitrate: s.receive_bitrate.unwrap_or_default(),
            transmit_bitrate: s.transmit_bitrate.unwrap_or_default(),
            signal: s.signal.unwrap_or_default(),
            transmit_retries: s.transmit_retries.unwrap_or_default(),
            transmit_failed: s.transmit_failed.unwrap_or_default(),
            beacon_loss: s.beacon_loss.unwrap_or_default(),
        })
        .collect())
}

// ---------------------------------------------------------------------------
// The nl80211 mode.

struct Kernel<'a> {
    nl: &'a mut Nl80211,
    family: u16,
}

impl Kernel<'_> {
    fn dump(
        &mut self,
        request: &'static str,
        cmd: Nl80211Command,
        ifi: Option<&Interface>,
    ) -> Result<Vec<Vec<Nl80211Attr>>, crate::netlink::Error> {
        let mac = ifi.and_then(|i| i.mac.as_deref()).and_then(|m| <[u8; 6]>::try_from(m).ok());
        self.nl.dump(self.family, request, cmd, ifi.map(|i| i.index), mac)
    }
}

/// mdlayher/wifi's `os.ErrNotExist` for an nl80211 answer: ENOENT.
fn not_exist(e: &crate::netlink::Error) -> bool {
    matches!(e, crate::netlink::Error::Kernel { errno, .. } if *errno == libc::ENOENT)
}

impl Stater for Kernel<'_> {
    fn interfaces(&mut self) -> Result<Vec<Interface>, Error> {
        let msgs = self
            .dump("NL80211_CMD_GET_INTERFACE", Nl80211Command::GetInterface, None)
            .map_err(|e| other(format!("failed to retrieve wifi interfaces: {e}")))?;
        Ok(msgs.iter().map(|m| interface_of(m)).collect())
    }

    fn bss(&mut self, ifi: &Interface) -> Result<Option<Bss>, Error> {
        let fail = |m: String| other(format!("failed to retrieve BSS for device {}: {m}", ifi.name));
        match self.dump("NL80211_CMD_GET_SCAN", Nl80211Command::GetScan, Some(ifi)) {
            Ok(msgs) => bss_of(&msgs).map_err(fail),
            Err(e) if not_exist(&e) => Ok(None),
            Err(e) => Err(fail(e.to_string())),
        }
    }

    fn stations(&mut self, ifi: &Interface) -> Result<Option<Vec<Station>>, Error> {
        match self.dump("NL80211_CMD_GET_STATION", Nl80211Command::GetStation, Some(ifi)) {
            Ok(msgs) => Ok(stations_of(&msgs)),
            Err(e) if not_exist(&e) => Ok(None),
            Err(e) => Err(other(format!("failed to retrieve station info for device {:?}: {e}", ifi.name))),
        }
    }
}

/// One interface of a GET_INTERFACE dump (the last attribute of a kind
/// wins, as in mdlayher/wifi).
pub fn interface_of(attrs: &[Nl80211Attr]) -> Interface {
    let mut ifi = Interface::default();
    for a in attrs {
        match a {
            Nl80211Attr::IfIndex(i) => ifi.index = *i,
            Nl80211Attr::IfName(n) => ifi.name = n.clone(),
            Nl80211Attr::Mac(m) => ifi.mac = Some(m.to_vec()),
            Nl80211Attr::WiphyFreq(f) => ifi.frequency_mhz = *f as i64,
            _ => {}
        }
    }
    ifi
}

/// The BSS of a GET_SCAN dump the interface is in: the first one with a
/// status. `Ok(None)` when there is none; malformed information elements
/// are an error.
pub fn bss_of(msgs: &[Vec<Nl80211Attr>]) -> Result<Option<Bss>, String> {
    for attrs in msgs {
        for a in attrs {
            let Nl80211Attr::Bss(info) = a else { continue };
            if !info.iter().any(|i| matches!(i, Nl80211BssInfo::Status(_))) {
                continue;
            }
            let mut bss = Bss::default();
            for i in info {
                match i {
                    Nl80211BssInfo::Bssid(b) => bss.bssid = b.to_vec(),
                    Nl80211BssInfo::Status(s) => bss.status = *s as i64,
                    Nl80211BssInfo::RawInformationElements(ies) => {
                        if let Some(ssid) = ssid_of(ies)? {
                            bss.ssid = ssid;
                        }
                    }
                    _ => {}
                }
            }
            return Ok(Some(bss));
        }
    }
    Ok(None)
}

/// The SSID element (id 0) of 802.11 information elements, the last one
/// if several; an element running past the end is an error.
pub fn ssid_of(mut ies: &[u8]) -> Result<Option<String>, String> {
    let mut ssid = None;
    while !ies.is_empty() {
        let [id, len, rest @ ..] = ies else { return Err("invalid 802.11 information element".into()) };
        let len = *len as usize;
        if rest.len() < len {
            return Err("invalid 802.11 information element".into());
        }
        if *id == 0 {
            ssid = Some(go_lossy(&rest[..len]));
        }
        ies = &rest[len..];
    }
    Ok(ssid)
}

/// The stations of a GET_STATION dump; `None` (mdlayher/wifi's
/// `os.ErrNotExist`) when one of its messages has no station information.
pub fn stations_of(msgs: &[Vec<Nl80211Attr>]) -> Option<Vec<Station>> {
    msgs.iter().map(|m| station_of(m)).collect()
}

/// One station: its MAC (if before the station information) and the
/// station information's counters.
pub fn station_of(attrs: &[Nl80211Attr]) -> Option<Station> {
    let mut s = Station::default();
    for a in attrs {
        match a {
            Nl80211Attr::Mac(m) => s.mac = m.to_vec(),
            Nl80211Attr::StationInfo(info) => {
                station_info(&mut s, info);
                return Some(s);
            }
            _ => {}
        }
    }
    None
}

fn station_info(s: &mut Station, info: &[Nl80211StationInfo]) {
    for i in info {
        match i {
            Nl80211StationInfo::ConnectedTime(t) => s.connected_ns = *t as i64 * 1_000_000_000,
            Nl80211StationInfo::InactiveTime(t) => s.inactive_ns = *t as i64 * 1_000_000,
            Nl80211StationInfo::RxBytes64(b) => s.received_bytes = *b as i64,
            Nl80211StationInfo::TxBytes64(b) => s.transmitted_bytes = *b as i64,
            // The 32-bit counters only count while no 64-bit one was seen.
            Nl80211StationInfo::RxBytes(b) if s.received_bytes == 0 => s.received_bytes = *b as i64,
            Nl80211StationInfo::TxBytes(b) if s.transmitted_bytes == 0 => s.transmitted_bytes = *b as i64,
            Nl80211StationInfo::Signal(d) => s.signal = *d as i64,
            Nl80211StationInfo::RxPackets(n) => s.received_packets = *n as i64,
            Nl80211StationInfo::TxPackets(n) => s.transmitted_packets = *n as i64,
            Nl80211StationInfo::TxRetries(n) => s.transmit_retries = *n as i64,
            Nl80211StationInfo::TxFailed(n) => s.transmit_failed = *n as i64,
            Nl80211StationInfo::BeaconLoss(n) => s.beacon_loss = *n as i64,
            Nl80211StationInfo::RxBitrate(r) => s.receive_bitrate = bitrate(r),
            Nl80211StationInfo::TxBitrate(r) => s.transmit_bitrate = bitrate(r),
            _ => {}
        }
    }
}

/// A rate's bitrate in bit/s: the 32-bit attribute, else the 16-bit one
/// (both in 100 kbit/s).
fn bitrate(rate: &[Nl80211RateInfo]) -> i64 {
    let mut r: i64 = 0;
    for i in rate {
        match i {
            Nl80211RateInfo::Bitrate32(b) => r = *b as i64,
            Nl80211RateInfo::Bitrate(b) if r == 0 => r = *b as i64,
            _ => {}
        }
    }
    r * 100 * 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nl80211::{decode_reply, Reply};
    use crate::testutil::{rows, Row};
    use netlink_packet_core::{Emitable, NetlinkDeserializable, NetlinkHeader};
    use netlink_packet_generic::GenlMessage;
    use wl_nl80211::Nl80211Message;

    const INTERFACES: &str = r#"[
	{
		"name": "wlan0",
		"type": 2,
		"frequency": 2412
	},
	{
		"name": "wlan1",
		"type": 3,
		"frequency": 2412
	},
	{
		"type": 10
	}
]"#;
    const BSS_JSON: &str = r#"{
	"ssid": "Example",
	"bssid": "ABEiM0RV",
	"status": 1
}"#;
    const STATIONS: &str = r#"[
	{
		"hardwareaddr": "qrvM3e7/",
		"connected": 30000000000,
		"inactive": 400000000,
		"receivebitrate": 128000000,
		"transmitbitrate": 164000000,
		"signal": -52,
		"transmitretries": 10,
		"transmitfailed": 2,
		"beaconloss": 1
	},
	{
		"hardwareaddr": "AQIDBAUG",
		"connected": 60000000000,
		"inactive": 800000000,
		"receivebitrate": 256000000,
		"transmitbitrate": 328000000,
		"signal": -26,
		"transmitretries": 20,
		"transmitfailed": 4,
		"beaconloss": 2
	}
]
"#;

    fn scrape_fixtures(dir: &Path) -> Result<Vec<Row>, Error> {
        let o = Options { fixtures: dir.display().to_string() };
        let mut c = Collector::new(o, &crate::testutil::paths(dir)).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        Ok(rows(&sink))
    }

    fn value(rows: &[Row], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        rows.iter().find(|(n, l, _)| n == name && l.iter().map(|(a, b)| (a.as_str(), b.as_str())).eq(labels.iter().copied())).map(|r| r.2)
    }

    #[test]
    fn the_e2e_fixtures() {
        let d = tempfile::tempdir().unwrap();
        crate::testutil::write(d.path(), "interfaces.json", INTERFACES);
        crate::testutil::write(d.path(), "wlan0/bss.json", BSS_JSON);
        crate::testutil::write(d.path(), "wlan0/stationinfo.json", STATIONS);
        let r = scrape_fixtures(d.path()).unwrap();
        assert_eq!(r.len(), 2 + 1 + 24, "{r:#?}");
        assert_eq!(value(&r, "node_wifi_interface_frequency_hertz", &[("device", "wlan1")]), Some(2.412e9));
        assert_eq!(
            value(
                &r,
                "node_wifi_station_info",
                &[("bssid", "00:11:22:33:44:55"), ("device", "wlan0"), ("mode", "client"), ("ssid", "Example")]
            ),
            Some(1.0)
        );
        let sta = [("device", "wlan0"), ("mac_address", "aa:bb:cc:dd:ee:ff")];
        assert_eq!(value(&r, "node_wifi_station_inactive_seconds", &sta), Some(0.4));
        assert_eq!(value(&r, "node_wifi_station_connected_seconds_total", &sta), Some(30.0));
        assert_eq!(value(&r, "node_wifi_station_signal_dbm", &sta), Some(-52.0));
        assert_eq!(value(&r, "node_wifi_station_transmit_bits_per_second", &sta), Some(1.64e8));
        assert_eq!(value(&r, "node_wifi_station_receive_bytes_total", &sta), Some(0.0));
        let sta = [("device", "wlan0"), ("mac_address", "01:02:03:04:05:06")];
        assert_eq!(value(&r, "node_wifi_station_beacon_loss_total", &sta), Some(2.0));
    }

    #[test]
    fn fixture_errors_are_as_node_exporters() {
        // No interfaces.json: node_exporter fails (not "no data").
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(scrape_fixtures(d.path()), Err(Error::Io { .. })));
        // A malformed bss.json fails the scrape; a missing one does not.
        crate::testutil::write(d.path(), "interfaces.json", r#"[{"Name":"wlan0","Frequency":5180}]"#);
        assert_eq!(scrape_fixtures(d.path()).unwrap().len(), 1);
        crate::testutil::write(d.path(), "wlan0/bss.json", r#"{"status": "1"}"#);
        assert!(matches!(scrape_fixtures(d.path()), Err(Error::Parse { .. })));
        crate::testutil::write(d.path(), "wlan0/bss.json", "null");
        let r = scrape_fixtures(d.path()).unwrap();
        assert_eq!(value(&r, "node_wifi_station_info", &[("bssid", ""), ("device", "wlan0"), ("mode", "client"), ("ssid", "")]), Some(1.0));
        crate::testutil::write(d.path(), "wlan0/stationinfo.json", "[null]");
        assert!(scrape_fixtures(d.path()).is_err());
        crate::testutil::write(d.path(), "wlan0/stationinfo.json", "[]");
        assert_eq!(scrape_fixtures(d.path()).unwrap().len(), 2);
    }

    #[test]
    fn go_json_decoding() {
        // The Go name or its lower case; other spellings are unknown fields.
        let i = parse_interfaces_json(br#"[{"NAME":"a","name":"b","Frequency":1,"Index":null,"hardwareaddr":[1,255]}]"#).unwrap();
        assert_eq!(i, [Interface { index: 0, name: "b".into(), mac: Some(vec![1, 255]), frequency_mhz: 1 }]);
        assert_eq!(parse_interfaces_json(br#"[{"HardwareAddr":null}, {}]"#).unwrap()[0].mac, None);
        assert_eq!(parse_interfaces_json(b"null").unwrap(), []);
        for bad in [
            &b""[..],
            b"[",
            b"{}",
            b"[null]",
            br#"[{"frequency":1.5}]"#,
            br#"[{"frequency":1e3}]"#,
            br#"[{"name":1}]"#,
            br#"[{"type":"2"}]"#,
            br#"[{"hardwareaddr":[256]}]"#,
            br#"[{"hardwareaddr":"AQI"}]"#,
            br#"[{"hardwareaddr":{}}]"#,
            br#"[{"Name":"a","name":"b"}]"#,
            b"[] x",
            b"[01]",
            b"[\"\x01\"]",
        ] {
            assert!(parse_interfaces_json(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse_interfaces_json(&[b'['; 20_000]).is_err());
        // Unknown fields and their types do not matter; known nested ones do.
        assert!(parse_bss_json(br#"{"x":[{}],"load":{"stationcount":1},"RSN":{"AKMs":[1,null]}}"#).is_ok());
        assert!(parse_bss_json(br#"{"load":{"stationcount":-1}}"#).is_err());
        assert!(parse_bss_json(br#"{"rsn":{"pairwiseciphers":[-1]}}"#).is_err());
        assert!(parse_bss_json(br#"{"signal":2147483648}"#).is_err());
        assert!(parse_bss_json(b"[]").is_err());
        assert_eq!(parse_bss_json(br#"{"ssid":"a\u00e9\ud83d\ude00x\"","status":3}"#).unwrap().ssid, "a\u{e9}\u{1f600}x\"");
        assert_eq!(parse_bss_json(b"{\"ssid\":\"\xff\xe2\x82\"}").unwrap().ssid, "\u{fffd}\u{fffd}\u{fffd}");
        assert_eq!(parse_bss_json(br#"{"bssid":null,"status":null}"#).unwrap(), Bss::default());
        assert_eq!(parse_stations_json(br#"[{"Connected":5,"receivedbytes":7}]"#).unwrap()[0].received_bytes, 7);
        assert!(parse_stations_json(br#"[{"inactive":9223372036854775808}]"#).is_err());
    }

    #[test]
    fn base64_as_go() {
        assert_eq!(base64_decode("ABEiM0RV").unwrap(), [0, 0x11, 0x22, 0x33, 0x44, 0x55]);
        assert_eq!(base64_decode("qrvM\r\n3e7/").unwrap(), [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
        assert_eq!(base64_decode("AQ==").unwrap(), [1]);
        assert_eq!(base64_decode("AR==").unwrap(), [1], "non-zero trailing bits are allowed");
        assert_eq!(base64_decode("AQI=").unwrap(), [1, 2]);
        assert_eq!(base64_decode("").unwrap(), Vec::<u8>::new());
        for bad in ["AQ", "A===", "AQ==AQ==", "A*==", "AQ=A"] {
            assert!(base64_decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn labels_and_values_as_go() {
        assert_eq!(mac_string(&[0, 0x11, 0xaa]), "00:11:aa");
        assert_eq!(mac_string(&[]), "");
        assert_eq!(go_seconds(400_000_000), 0.4);
        assert_eq!(go_seconds(-1_500_000_000), -1.5);
        assert_eq!([0, 1, 2, 3, 4].map(bss_mode), ["client", "client", "unknown", "ad-hoc", "unknown"]);
    }

    /// Serializes `m` as the kernel would send it and decodes it back the
    /// way the collector does.
    fn round_trip(attributes: Vec<Nl80211Attr>) -> Vec<Nl80211Attr> {
        let m = GenlMessage::from_payload(Nl80211Message { cmd: Nl80211Command::NewStation, attributes });
        let mut buf = vec![0; m.buffer_len()];
        m.emit(&mut buf);
        let header = NetlinkHeader::default();
        <GenlMessage<Reply> as NetlinkDeserializable>::deserialize(&header, &buf).unwrap().payload.0
    }

    #[test]
    fn decodes_an_interface_message() {
        let attrs = round_trip(vec![
            Nl80211Attr::IfIndex(3),
            Nl80211Attr::IfName("wlp2s0".into()),
            Nl80211Attr::Wiphy(0),
            Nl80211Attr::IfType(wl_nl80211::Nl80211InterfaceType::Station),
            Nl80211Attr::Wdev(1),
            Nl80211Attr::Mac([2, 0, 0, 0, 0, 1]),
            Nl80211Attr::Generation(5),
            Nl80211Attr::WiphyFreq(5180),
        ]);
        assert_eq!(attrs.len(), 4, "only the attributes read are kept: {attrs:?}");
        assert_eq!(
            interface_of(&attrs),
            Interface { index: 3, name: "wlp2s0".into(), mac: Some(vec![2, 0, 0, 0, 0, 1]), frequency_mhz: 5180 }
        );
    }

    #[test]
    fn decodes_a_station_message() {
        use Nl80211StationInfo as S;
        let attrs = round_trip(vec![
            Nl80211Attr::IfIndex(3),
            Nl80211Attr::Mac([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]),
            Nl80211Attr::Generation(9),
            Nl80211Attr::StationInfo(vec![
                S::InactiveTime(400),
                S::RxBytes(7),
                S::RxBytes64(5_000_000_000),
                S::TxBytes(11),
                S::Signal(-52),
                S::SignalAvg(-50),
                S::TxBitrate(vec![Nl80211RateInfo::Bitrate(1640), Nl80211RateInfo::Mcs(7), Nl80211RateInfo::ShortGi]),
                S::RxBitrate(vec![Nl80211RateInfo::Bitrate(100), Nl80211RateInfo::Bitrate32(12_800)]),
                S::RxPackets(3),
                S::TxPackets(4),
                S::TxRetries(10),
                S::TxFailed(2),
                S::ConnectedTime(30),
                S::BeaconLoss(1),
                S::ExpectedThroughput(1000),
            ]),
        ]);
        let s = station_of(&attrs).unwrap();
        assert_eq!(
            s,
            Station {
                mac: vec![0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff],
                connected_ns: 30_000_000_000,
                inactive_ns: 400_000_000,
                received_bytes: 5_000_000_000,
                transmitted_bytes: 11,
                received_packets: 3,
                transmitted_packets: 4,
                receive_bitrate: 1_280_000_000,
                transmit_bitrate: 164_000_000,
                signal: -52,
                transmit_retries: 10,
                transmit_failed: 2,
                beacon_loss: 1,
            }
        );
        // A message without station information: none for the interface.
        assert_eq!(stations_of(&[attrs, vec![Nl80211Attr::IfIndex(3)]]), None);
        assert_eq!(stations_of(&[]), Some(vec![]));
    }

    #[test]
    fn decodes_a_scan_message() {
        let ies = [0, 7, b'E', b'x', b'a', b'm', b'p', b'l', b'e', 1, 2, 0x82, 0x84];
        let other = round_trip(vec![Nl80211Attr::Bss(vec![Nl80211BssInfo::Bssid([9; 6]), Nl80211BssInfo::Frequency(2412)])]);
        let ours = round_trip(vec![
            Nl80211Attr::Generation(1),
            Nl80211Attr::IfIndex(3),
            Nl80211Attr::Bss(vec![
                Nl80211BssInfo::Bssid([0, 0x11, 0x22, 0x33, 0x44, 0x55]),
                Nl80211BssInfo::Frequency(2412),
                Nl80211BssInfo::RawInformationElements(ies.to_vec()),
                Nl80211BssInfo::SignalMbm(-5200),
                Nl80211BssInfo::Status(1),
                Nl80211BssInfo::SeenMsAgo(20),
            ]),
        ]);
        let bss = bss_of(&[other.clone(), ours]).unwrap().unwrap();
        assert_eq!(bss, Bss { ssid: "Example".into(), bssid: vec![0, 0x11, 0x22, 0x33, 0x44, 0x55], status: 1 });
        assert_eq!(bss_of(&[other]).unwrap(), None, "a BSS without status is not the interface's");
        let bad =
            round_trip(vec![Nl80211Attr::Bss(vec![Nl80211BssInfo::Status(0), Nl80211BssInfo::RawInformationElements(vec![0, 5, b'a'])])]);
        assert!(bss_of(&[bad]).is_err());
        assert_eq!(ssid_of(&[]).unwrap(), None);
        assert!(ssid_of(&[0]).is_err());
    }

    #[test]
    fn malformed_messages_are_errors() {
        // An IFINDEX attribute of 2 bytes.
        let buf = [8, 0, 3, 0, 1, 0, 0, 0, 6, 0, 3, 0, 1, 0, 0, 0];
        assert!(decode_reply(&buf[..8]).is_ok());
        assert!(decode_reply(&buf[8..]).is_err());
        // An attribute longer than the message.
        assert!(decode_reply(&[20, 0, 4, 0, b'w']).is_err());
    }

    /// Without wireless hardware (and so, usually, without the nl80211
    /// family), the collector says "no data" as node_exporter does
    /// (ErrNoData when the family is missing or netlink is not permitted);
    /// with the family but no interface, it succeeds with no series.
    #[test]
    fn this_host_without_wifi() {
        let family = Nl80211::new().family();
        let o = Options { fixtures: String::new() };
        let mut c = Collector::new(o, &crate::testutil::paths(Path::new("/nonexistent"))).unwrap();
        let mut sink = Sink::new();
        let got = crate::Collector::update(&mut c, &mut sink);
        eprintln!("nl80211 family: {family:?}; update: {got:?}");
        match family {
            Err(e) if unavailable(&e) => assert!(matches!(got, Err(Error::NoData(_))), "{got:?}"),
            Err(e) => panic!("probing nl80211: {e}"),
            Ok(_) => {
                let wiphys = std::fs::read_dir("/sys/class/ieee80211").map(|d| d.count()).unwrap_or(0);
                if wiphys == 0 {
                    got.unwrap();
                    assert!(rows(&sink).is_empty());
                }
            }
        }
    }
}
