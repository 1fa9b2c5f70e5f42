//! `ethtool`: driver information, driver statistics and legacy link
//! settings of every network device in `<sysfs>/class/net`, as
//! node_exporter 1.12 reads them through github.com/safchain/ethtool: the
//! SIOCETHTOOL ioctl with ETHTOOL_GDRVINFO (`node_ethtool_info`),
//! ETHTOOL_GSTRINGS + ETHTOOL_GSTATS (one untyped `node_ethtool_<name>`
//! family per driver statistic, its name sanitised, lower-cased and with
//! `rx`/`tx` words spelled `received`/`transmitted`; `rx_bytes` and six
//! others keep node_exporter's `..._total` names; names that clash after
//! sanitising are dropped; `--collector.ethtool.metrics-include` filters
//! the sanitised names) and ETHTOOL_GSET (`node_network_supported_speed_bytes`,
//! `node_network_advertised_speed_bytes`, `node_network_supported_port_info`,
//! `node_network_{autonegotiate,pause,asymmetricpause}_{supported,advertised}`
//! and `node_network_autonegotiate`, from the 32-bit legacy link-mode masks
//! node_exporter reads). Devices are filtered by
//! `--collector.ethtool.device-include`/`-exclude`. The ioctl is written
//! here with `libc` because driver statistics (`ethtool -S`) exist only
//! through it: the ethtool netlink API has no driver string set, and the
//! `ethtool` crate's link modes are not the legacy 32-bit masks
//! node_exporter reports. A device that answers an ioctl with an error
//! (EOPNOTSUPP for `lo`, veth's missing parts, …) simply lacks those
//! series; the error is logged once per device and kind (at debug for
//! EOPNOTSUPP). The ioctl socket, opened when the collector is built,
//! answers for the network namespace it was opened in.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use regex::Regex;

use crate::filter::DeviceFilter;
use crate::flags::{self, Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const EXCLUDE: StringFlag = StringFlag {
    name: "collector.ethtool.device-exclude",
    default: "",
    help: "Regexp of ethtool devices to exclude (mutually exclusive to device-include).",
};
pub const INCLUDE: StringFlag = StringFlag {
    name: "collector.ethtool.device-include",
    default: "",
    help: "Regexp of ethtool devices to include (mutually exclusive to device-exclude).",
};
pub const METRICS: StringFlag =
    StringFlag { name: "collector.ethtool.metrics-include", default: ".*", help: "Regexp of ethtool stats to include." };

pub struct Options {
    /// node_exporter applies both patterns when both are given.
    pub filter: DeviceFilter,
    /// Matched (unanchored) against each sanitised statistic name; `None`
    /// (an empty flag) matches everything, as Go's empty regexp does.
    pub metrics: Option<Regex>,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&EXCLUDE, &INCLUDE, &METRICS])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let exclude = EXCLUDE.regex(f)?;
        let include = INCLUDE.regex(f)?;
        let metrics = METRICS.regex(f)?;
        for (flag, value) in [(INCLUDE, &include), (EXCLUDE, &exclude), (METRICS, &metrics)] {
            if let Some(r) = value {
                tracing::info!(flag = r.as_str(), "Parsed flag --{}", flag.name);
            }
        }
        Ok(Options { filter: DeviceFilter::new(exclude, include), metrics })
    }
}

pub struct Collector {
    o: Options,
    class_net: PathBuf,
    dev: ioctl::Ethtool,
    names: Names,
    /// (device, request, errno) already logged at their own level.
    logged: HashSet<(String, &'static str, i32)>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let dev = ioctl::Ethtool::open().map_err(|e| ConfigError::Invalid {
            flag: "collector.ethtool".into(),
            msg: format!("failed to initialize ethtool library: {e}"),
        })?;
        Ok(Collector { o, class_net: p.sys("class/net"), dev, names: Names::default(), logged: HashSet::new() })
    }

    /// Logs an ioctl failure as node_exporter does (debug for EOPNOTSUPP,
    /// error otherwise), but each (device, request, errno) only once at
    /// that level: the condition does not change between scrapes.
    fn log(&mut self, device: &str, what: &'static str, err: &ioctl::Failure) {
        let errno = match err {
            ioctl::Failure::Errno(e) => *e,
            ioctl::Failure::TooMany(_) => -1,
        };
        let first = self.logged.len() < 4096 && self.logged.insert((device.to_string(), what, errno));
        if errno == libc::EOPNOTSUPP || !first {
            tracing::debug!(device, errno, err = %err, "ethtool {what} error");
        } else {
            tracing::error!(device, errno, err = %err, "ethtool {what} error");
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let devices = match list_devices(&self.class_net) {
            Ok(d) => d,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => {
                tracing::debug!(err = %e, "Could not read netclass file");
                return Err(Error::NoData(format!("{}: {e}", self.class_net.display())));
            }
            Err(e) => return Err(Error::io(&self.class_net, e)),
        };
        if devices.is_empty() {
            return Err(Error::Other("no network devices found".into()));
        }
        let mut out = Vec::new();
        for device in &devices {
            if self.o.filter.ignored(device) {
                continue;
            }
            match self.dev.link_settings(device) {
                Ok(l) => link_series(device, &l, &mut out),
                Err(e) => self.log(device, "link info", &e),
            }
            match self.dev.driver_info(device) {
                Ok(info) => {
                    info_series(device, &info, &mut out);
                    match self.dev.stats(device, info.n_stats) {
                        Ok(stats) => stat_series(device, &stats, self.o.metrics.as_ref(), &mut self.names, &mut out),
                        Err(e) => self.log(device, "stats", &e),
                    }
                }
                Err(e) => {
                    self.log(device, "driver info", &e);
                    // node_exporter's Stats asks GDRVINFO again and fails alike.
                    self.log(device, "stats", &e);
                }
            }
        }
        emit(out, sink);
        Ok(())
    }
}

/// procfs' `NetClassDevices`: the entries of /sys/class/net that are not
/// regular files (links and directories), by name.
fn list_devices(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() {
            continue;
        }
        out.push(e.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

/// ETHTOOL_GDRVINFO's strings (up to their NUL) and statistics count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DriverInfo {
    pub driver: String,
    pub version: String,
    pub fw_version: String,
    pub bus_info: String,
    pub erom_version: String,
    pub n_stats: u32,
}

/// The ETHTOOL_GSET fields node_exporter reads: the legacy 32-bit
/// supported and advertised link-mode masks and the autoneg setting.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkSettings {
    pub supported: u32,
    pub advertising: u32,
    pub autoneg: u8,
}

/// One sample to write: family, help, type, labels (ascending names).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub help: String,
    pub kind: Kind,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

fn gauge(name: &str, help: &str, labels: Vec<(&'static str, String)>, value: f64) -> Series {
    Series { name: name.to_string(), help: help.to_string(), kind: Kind::Gauge, labels, value }
}

/// Writes the series sorted by family and label values, as client_golang
/// exposes them.
fn emit(mut out: Vec<Series>, sink: &mut Sink) {
    out.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.labels.iter().map(|l| &l.1).cmp(b.labels.iter().map(|l| &l.1))));
    for s in &out {
        let labels: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        sink.family(&s.name, &s.help, s.kind).sample(&labels, s.value);
    }
}

/// `node_ethtool_info`.
pub fn info_series(device: &str, i: &DriverInfo, out: &mut Vec<Series>) {
    out.push(gauge(
        "node_ethtool_info",
        "A metric with a constant '1' value labeled by bus_info, device, driver, expansion_rom_version, firmware_version, version.",
        vec![
            ("bus_info", i.bus_info.clone()),
            ("device", device.to_string()),
            ("driver", i.driver.clone()),
            ("expansion_rom_version", i.erom_version.clone()),
            ("firmware_version", i.fw_version.clone()),
            ("version", i.version.clone()),
        ],
        1.0,
    ));
}

// Bits of the kernel's ethtool_link_mode_bit_indices.
const AUTONEG: u32 = 6;
const PAUSE: u32 = 13;
const ASYM_PAUSE: u32 = 14;

/// node_exporter's port types: (label, bit).
const PORTS: [(&str, u32); 6] = [("TP", 7), ("AUI", 8), ("MII", 9), ("FIBRE", 10), ("BNC", 11), ("Backplane", 16)];

/// node_exporter's speed table, (bit, Mb/s, duplex, PHY), limited to the
/// bits below 32: node_exporter tests `mask & (1<<bit)` on the uint32
/// legacy masks, where a larger shift is 0, so its entries for bits 32 and
/// up (25000baseKR onwards, 2500baseT, 1000baseX, …) never match.
const SPEEDS: [(u32, u32, &str, &str); 22] = [
    (0, 10, "half", "T"),
    (1, 10, "full", "T"),
    (2, 100, "half", "T"),
    (3, 100, "full", "T"),
    (4, 1000, "half", "T"),
    (5, 1000, "full", "T"),
    (12, 10000, "full", "T"),
    (17, 1000, "full", "KX"),
    (18, 10000, "full", "KX4"),
    (19, 10000, "full", "KR"),
    (20, 10000, "full", "R_FEC"),
    (21, 20000, "full", "MLD2"),
    (22, 20000, "full", "KR2"),
    (23, 40000, "full", "KR4"),
    (24, 40000, "full", "CR4"),
    (25, 40000, "full", "SR4"),
    (26, 40000, "full", "LR4"),
    (27, 56000, "full", "KR4"),
    (28, 56000, "full", "CR4"),
    (29, 56000, "full", "SR4"),
    (30, 56000, "full", "LR4"),
    (31, 25000, "full", "CR"),
];

/// The link-settings series of one device, as node_exporter's
/// updateSpeeds / updatePortInfo / updatePortCapabilities write them.
pub fn link_series(device: &str, l: &LinkSettings, out: &mut Vec<Series>) {
    let dev = || vec![("device", device.to_string())];
    let bit = |mask: u32, b: u32| if mask & (1 << b) != 0 { 1.0 } else { 0.0 };
    let speeds = |out: &mut Vec<Series>, name: &str, help: &str, mask: u32| {
        for (b, mbps, duplex, phy) in SPEEDS {
            if mask & (1 << b) != 0 {
                let labels = vec![("device", device.to_string()), ("duplex", duplex.to_string()), ("mode", format!("{mbps}base{phy}"))];
                // Bytes per second, as netclass reports speeds.
                out.push(gauge(name, help, labels, f64::from(mbps) * 1_000_000.0 / 8.0));
            }
        }
    };
    speeds(out, "node_network_supported_speed_bytes", "Combination of speeds and features supported by network device", l.supported);
    for (ty, b) in PORTS {
        if l.supported & (1 << b) != 0 {
            let labels = vec![("device", device.to_string()), ("type", ty.to_string())];
            out.push(gauge("node_network_supported_port_info", "Type of ports or PHYs supported by network device", labels, 1.0));
        }
    }
    let s = l.supported;
    out.push(gauge("node_network_autonegotiate_supported", "If this port device supports autonegotiate", dev(), bit(s, AUTONEG)));
    out.push(gauge("node_network_pause_supported", "If this port device supports pause frames", dev(), bit(s, PAUSE)));
    out.push(gauge(
        "node_network_asymmetricpause_supported",
        "If this port device supports asymmetric pause frames",
        dev(),
        bit(s, ASYM_PAUSE),
    ));
    speeds(out, "node_network_advertised_speed_bytes", "Combination of speeds and features offered by network device", l.advertising);
    let a = l.advertising;
    out.push(gauge("node_network_autonegotiate_advertised", "If this port device offers autonegotiate", dev(), bit(a, AUTONEG)));
    out.push(gauge("node_network_pause_advertised", "If this port device offers pause capability", dev(), bit(a, PAUSE)));
    out.push(gauge(
        "node_network_asymmetricpause_advertised",
        "If this port device offers asymmetric pause capability",
        dev(),
        bit(a, ASYM_PAUSE),
    ));
    out.push(gauge("node_network_autonegotiate", "If this port is using autonegotiate", dev(), f64::from(l.autoneg)));
}

/// node_exporter's pre-made descriptors for seven statistics, keyed by
/// sanitised name: their family names and help replace the generic ones.
const KNOWN: [(&str, &str, &str); 7] = [
    ("rx_bytes", "node_ethtool_received_bytes_total", "Network interface bytes received"),
    ("rx_dropped", "node_ethtool_received_dropped_total", "Number of received frames dropped"),
    ("rx_errors", "node_ethtool_received_errors_total", "Number of received frames with errors"),
    ("rx_packets", "node_ethtool_received_packets_total", "Network interface packets received"),
    ("tx_bytes", "node_ethtool_transmitted_bytes_total", "Network interface bytes sent"),
    ("tx_errors", "node_ethtool_transmitted_errors_total", "Number of sent frames with errors"),
    ("tx_packets", "node_ethtool_transmitted_packets_total", "Network interface packets sent"),
];

/// The link-setting keys of node_exporter's descriptor map: a statistic
/// of one of these sanitised names would be written under a link family
/// (and crash node_exporter for the three with more labels); skipped.
const LINK_KEYS: [&str; 10] = [
    "supported_port",
    "supported_speed",
    "supported_autonegotiate",
    "supported_pause",
    "supported_asymmetricpause",
    "advertised_speed",
    "advertised_autonegotiate",
    "advertised_pause",
    "advertised_asymmetricpause",
    "autonegotiate",
];

/// node_exporter's `SanitizeMetricName`: every match of
/// `_*[^0-9A-Za-z_]+_*` becomes one `_`.
pub fn sanitize(name: &str) -> String {
    let c: Vec<char> = name.chars().collect();
    let other = |ch: char| !(ch.is_ascii_alphanumeric() || ch == '_');
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < c.len() {
        let mut j = i;
        while j < c.len() && c[j] == '_' {
            j += 1;
        }
        if j < c.len() && other(c[j]) {
            let mut k = j;
            while k < c.len() && other(c[k]) {
                k += 1;
            }
            while k < c.len() && c[k] == '_' {
                k += 1;
            }
            out.push('_');
            i = k;
        } else {
            // No match starts in this run of underscores nor at the
            // character ending it.
            let end = (j + 1).min(c.len());
            out.extend(&c[i..end]);
            i = end;
        }
    }
    out
}

/// Replaces every (non-overlapping, leftmost) match of `(^|_)word(_|$)`
/// with `${1}with${2}`, as Go's ReplaceAllString does.
fn replace_word(s: &str, word: &str, with: &str) -> String {
    let (b, w) = (s.as_bytes(), word.as_bytes());
    let mut out = String::with_capacity(s.len() + 16);
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        // (^|_), in that order: the start of the text, else an underscore;
        // then the word and (_|$).
        let found = [0usize, 1].into_iter().find_map(|lead| {
            let ok = if lead == 0 { i == 0 } else { b[i] == b'_' };
            let after = i + lead + w.len();
            if !ok || !b[i + lead..].starts_with(w) {
                return None;
            }
            match b.get(after) {
                None => Some((lead, after, 0)),
                Some(b'_') => Some((lead, after, 1)),
                Some(_) => None,
            }
        });
        match found {
            Some((lead, after, tail)) => {
                out.push_str(&s[copied..i + lead]);
                out.push_str(with);
                out.push_str(&s[after..after + tail]);
                i = after + tail;
                copied = i;
            }
            None => i += 1,
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// node_exporter's `buildEthtoolFQName`.
pub fn fq_name(stat: &str) -> String {
    let lower = sanitize(stat).to_lowercase();
    let name = lower.trim_start_matches('_');
    let name = replace_word(name, "rx", "received");
    let name = replace_word(&name, "tx", "transmitted");
    format!("node_ethtool_{name}")
}

/// Remembered names of statistics: raw name → sanitised name and family
/// name (`None`: filtered out by the metrics pattern).
#[derive(Debug, Default)]
pub struct Names {
    seen: HashMap<String, Option<(String, String)>>,
}

impl Names {
    fn resolve(&mut self, raw: &str, pattern: Option<&Regex>) -> Option<(String, String)> {
        if let Some(v) = self.seen.get(raw) {
            return v.clone();
        }
        let sanitized = sanitize(raw);
        let v = pattern.is_none_or(|p| p.is_match(&sanitized)).then(|| {
            let fq = fq_name(&sanitized);
            (sanitized, fq)
        });
        // Bounded: a driver with endless new names can't grow it forever.
        if self.seen.len() < 65536 {
            self.seen.insert(raw.to_string(), v.clone());
        }
        v
    }
}

/// The statistics series of one device: `stats` as the ioctl returned
/// them (a repeated name keeps its last value, as node_exporter's map
/// does); names that sanitise to the same family are all dropped.
pub fn stat_series(device: &str, stats: &[(String, u64)], pattern: Option<&Regex>, names: &mut Names, out: &mut Vec<Series>) {
    let mut unique: HashMap<&str, u64> = HashMap::with_capacity(stats.len());
    for (k, v) in stats {
        if !k.is_empty() {
            unique.insert(k, *v);
        }
    }
    // family name → (sanitised name, value), None once a clash is seen.
    let mut by_family: HashMap<String, Option<(String, u64)>> = HashMap::with_capacity(unique.len());
    for (raw, v) in unique {
        let Some((sanitized, fq)) = names.resolve(raw, pattern) else { continue };
        match by_family.get_mut(&fq) {
            Some(slot) => {
                tracing::debug!(device, metric_fq_name = fq, metric = sanitized, "dropping duplicate metric name");
                *slot = None;
            }
            None => {
                by_family.insert(fq, Some((sanitized, v)));
            }
        }
    }
    for (fq, slot) in by_family {
        let Some((sanitized, v)) = slot else { continue };
        if LINK_KEYS.contains(&sanitized.as_str()) {
            tracing::debug!(device, metric = sanitized, "skipping a statistic named like a link-settings metric");
            continue;
        }
        let (name, help) = match KNOWN.iter().find(|(k, _, _)| *k == sanitized) {
            Some((_, name, help)) => (name.to_string(), help.to_string()),
            None => (fq, format!("Network interface {sanitized}")),
        };
        out.push(Series { name, help, kind: Kind::Untyped, labels: vec![("device", device.to_string())], value: v as f64 });
    }
}

/// The SIOCETHTOOL ioctl: one AF_INET datagram socket, as safchain/ethtool
/// opens, and the buffers of the string and statistics requests.
mod ioctl {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use super::{DriverInfo, LinkSettings};

    const ETHTOOL_GSET: u32 = 0x01;
    const ETHTOOL_GDRVINFO: u32 = 0x03;
    const ETHTOOL_GSTRINGS: u32 = 0x1b;
    const ETHTOOL_GSTATS: u32 = 0x1d;
    const ETH_SS_STATS: u32 = 1;
    const ETH_GSTRING_LEN: usize = 32;
    /// safchain/ethtool's MAX_GSTRINGS: a device announcing more statistics
    /// is refused. The kernel ignores the length in the request: it writes
    /// as many strings and values as the driver reports at the moment of
    /// each call. The buffers hold this many entries, so they are safe
    /// exactly when that count, checked against this bound from GDRVINFO's
    /// `n_stats` just before, has not grown beyond it by the time of the
    /// GSTRINGS/GSTATS call (a driver's statistics set does not change
    /// size at run time in practice; safchain/ethtool relies on the same).
    /// Zeroed pages the kernel does not touch stay unmapped.
    const MAX_GSTRINGS: usize = 32768;
    const IFNAMSIZ: usize = 16;

    #[derive(Debug)]
    pub enum Failure {
        Errno(i32),
        TooMany(u32),
    }

    impl std::fmt::Display for Failure {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Failure::Errno(e) => write!(f, "{}", std::io::Error::from_raw_os_error(*e)),
                Failure::TooMany(n) => write!(f, "ethtool currently doesn't support more than {MAX_GSTRINGS} entries, received {n}"),
            }
        }
    }

    /// struct ifreq with its ifr_data member (40 bytes on 64-bit).
    #[repr(C)]
    struct Ifreq {
        name: [u8; IFNAMSIZ],
        data: *mut libc::c_void,
        pad: [u8; 24 - std::mem::size_of::<usize>()],
    }

    /// struct ethtool_drvinfo.
    #[repr(C)]
    struct RawDrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        n_priv_flags: u32,
        n_stats: u32,
        testinfo_len: u32,
        eedump_len: u32,
        regdump_len: u32,
    }
    const _: () = assert!(std::mem::size_of::<RawDrvInfo>() == 196);

    /// struct ethtool_cmd (ETHTOOL_GSET).
    #[repr(C)]
    #[derive(Default)]
    struct RawCmd {
        cmd: u32,
        supported: u32,
        advertising: u32,
        speed: u16,
        duplex: u8,
        port: u8,
        phy_address: u8,
        transceiver: u8,
        autoneg: u8,
        mdio_support: u8,
        maxtxpkt: u32,
        maxrxpkt: u32,
        speed_hi: u16,
        eth_tp_mdix: u8,
        eth_tp_mdix_ctrl: u8,
        lp_advertising: u32,
        reserved: [u32; 2],
    }
    const _: () = assert!(std::mem::size_of::<RawCmd>() == 44);

    pub struct Ethtool {
        fd: OwnedFd,
        /// struct ethtool_gstrings: cmd, string_set, len, then the strings.
        strings: Vec<u8>,
        /// struct ethtool_stats: cmd, n_stats, then the u64 values.
        stats: Vec<u8>,
    }

    /// A C string of a fixed-size field: up to its first NUL.
    fn c_string(b: &[u8]) -> String {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_ne_bytes).unwrap_or(0)
    }

    impl Ethtool {
        pub fn open() -> std::io::Result<Ethtool> {
            // SAFETY: socket(2) with constant arguments; no memory is passed.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::IPPROTO_IP) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `fd` was just returned by socket(2) and is owned by no
            // one else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(Ethtool { fd, strings: Vec::new(), stats: Vec::new() })
        }

        /// SIOCETHTOOL on `device` with the command block at `data`.
        ///
        /// # Safety
        ///
        /// `data` must point to a command block whose first `u32` is the
        /// ethtool command, and which is valid for reads and writes of
        /// every byte the kernel reads or writes for that command (its
        /// struct, and for GSTRINGS/GSTATS the entries that follow it, as
        /// many as the driver has at the time of the call), and not
        /// aliased by a live reference during the call.
        // SAFETY: unsafe because the kernel writes through `data`; the
        // contract is the `# Safety` section above, kept by every caller.
        unsafe fn call(&self, device: &str, data: *mut libc::c_void) -> Result<(), Failure> {
            let mut ifr = Ifreq { name: [0; IFNAMSIZ], data, pad: [0; 24 - std::mem::size_of::<usize>()] };
            let n = device.len().min(IFNAMSIZ - 1);
            ifr.name[..n].copy_from_slice(&device.as_bytes()[..n]);
            // SAFETY: the fd is our open socket; `ifr` is a valid, writable
            // ifreq for the duration of the call; its data pointer is the
            // caller's command block, valid for what the kernel reads and
            // writes there (this function's own safety contract).
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCETHTOOL as _, &mut ifr as *mut Ifreq) };
            if rc < 0 {
                return Err(Failure::Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)));
            }
            Ok(())
        }

        pub fn driver_info(&self, device: &str) -> Result<DriverInfo, Failure> {
            let mut d = RawDrvInfo {
                cmd: ETHTOOL_GDRVINFO,
                driver: [0; 32],
                version: [0; 32],
                fw_version: [0; 32],
                bus_info: [0; 32],
                erom_version: [0; 32],
                reserved2: [0; 12],
                n_priv_flags: 0,
                n_stats: 0,
                testinfo_len: 0,
                eedump_len: 0,
                regdump_len: 0,
            };
            // SAFETY: `d` is a live, exclusively borrowed struct
            // ethtool_drvinfo (196 bytes, asserted above) starting with
            // cmd = GDRVINFO; the kernel reads and writes exactly that
            // struct, and no reference to `d` is used during the call.
            unsafe { self.call(device, (&mut d as *mut RawDrvInfo).cast()) }?;
            Ok(DriverInfo {
                driver: c_string(&d.driver),
                version: c_string(&d.version),
                fw_version: c_string(&d.fw_version),
                bus_info: c_string(&d.bus_info),
                erom_version: c_string(&d.erom_version),
                n_stats: d.n_stats,
            })
        }

        pub fn link_settings(&self, device: &str) -> Result<LinkSettings, Failure> {
            let mut c = RawCmd { cmd: ETHTOOL_GSET, ..RawCmd::default() };
            // SAFETY: `c` is a live, exclusively borrowed struct ethtool_cmd
            // (44 bytes, asserted above) starting with cmd = GSET; the
            // kernel reads and writes exactly that struct.
            unsafe { self.call(device, (&mut c as *mut RawCmd).cast()) }?;
            Ok(LinkSettings { supported: c.supported, advertising: c.advertising, autoneg: c.autoneg })
        }

        /// ETHTOOL_GSTRINGS and ETHTOOL_GSTATS for the `n_stats` statistics
        /// GDRVINFO announced: (name, value) in the driver's order, empty
        /// names left out.
        pub fn stats(&mut self, device: &str, n_stats: u32) -> Result<Vec<(String, u64)>, Failure> {
            let n = n_stats as usize;
            if n > MAX_GSTRINGS {
                return Err(Failure::TooMany(n_stats));
            }
            if n == 0 {
                return Ok(Vec::new());
            }
            if self.strings.is_empty() {
                self.strings = vec![0; 12 + MAX_GSTRINGS * ETH_GSTRING_LEN];
                self.stats = vec![0; 8 + MAX_GSTRINGS * 8];
            }
            self.strings[0..4].copy_from_slice(&ETHTOOL_GSTRINGS.to_ne_bytes());
            self.strings[4..8].copy_from_slice(&ETH_SS_STATS.to_ne_bytes());
            self.strings[8..12].copy_from_slice(&n_stats.to_ne_bytes());
            let strings = self.strings.as_mut_ptr().cast();
            // `self.strings`: a struct ethtool_gstrings header (cmd =
            // GSTRINGS, string_set, len) and room for MAX_GSTRINGS strings
            // of ETH_GSTRING_LEN bytes, not otherwise borrowed meanwhile.
            // SAFETY: the kernel writes the header and as many strings as
            // the driver has now (not `len`): within the buffer as long as
            // that count has not grown past MAX_GSTRINGS since GDRVINFO's
            // `n_stats`, checked above (see MAX_GSTRINGS).
            unsafe { self.call(device, strings) }?;
            self.stats[0..4].copy_from_slice(&ETHTOOL_GSTATS.to_ne_bytes());
            self.stats[4..8].copy_from_slice(&n_stats.to_ne_bytes());
            let stats = self.stats.as_mut_ptr().cast();
            // `self.stats`: a struct ethtool_stats header (cmd = GSTATS,
            // n_stats) and room for MAX_GSTRINGS u64 values, not otherwise
            // borrowed meanwhile.
            // SAFETY: as for GSTRINGS, the kernel writes as many values as
            // the driver has now: within the buffer unless that count grew
            // past MAX_GSTRINGS since the check above.
            unsafe { self.call(device, stats) }?;
            // The counts the kernel wrote back in both headers bound the
            // parse (with `n_stats`, at most MAX_GSTRINGS), so nothing past
            // the buffers is read even if the set changed between calls.
            // This re-check comes after the kernel's writes: it cannot
            // prevent an overrun, only keep the parse within the buffers.
            let n = n.min(u32_at(&self.strings, 8) as usize).min(u32_at(&self.stats, 4) as usize);
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let name = c_string(&self.strings[12 + i * ETH_GSTRING_LEN..12 + (i + 1) * ETH_GSTRING_LEN]);
                let at = 8 + i * 8;
                let value = self.stats.get(at..at + 8).and_then(|s| s.try_into().ok()).map(u64::from_ne_bytes).unwrap_or(0);
                if !name.is_empty() {
                    out.push((name, value));
                }
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // node_exporter's fixtures (collector/fixtures/ethtool/eth0), as its
    // test's fake ethtool reads them.
    const DRIVER: &str = "# ethtool -i eth0
driver: e1000e
version: 5.11.0-22-generic
firmware-version: 0.5-4
expansion-rom-version: 
bus-info: 0000:00:1f.6
supports-statistics: yes
supports-test: yes
supports-eeprom-access: yes
supports-register-dump: yes
supports-priv-flags: yes
";

    const STATISTICS: &str = "# ethtool -S eth0
NIC statistics:
     tx_packets: 961500
     rx_packets: 1260062
     tx_errors: 0
     rx_errors: 0
     port.rx_dropped: 12028
     rx_missed: 401
     align_errors: 0
     tx_single_collisions: 0
     tx_multi_collisions: 0
     rx_unicast: 1230297
     rx_broadcast: 5792
     rx_multicast: 23973
     tx_aborted: 0
     tx_underrun: 0
     duplicate metric: 1
     duplicate_metric: 2
";

    const SETTINGS: &str = "# ethtool eth0
Settings for eth0:
\tSupported ports: [ TP\t MII ]
\tSupported link modes:   10baseT/Half 10baseT/Full
\t                        100baseT/Half 100baseT/Full
\t                        1000baseT/Full 10000baseT/Full
\tSupported pause frame use: Symmetric
\tSupports auto-negotiation: Yes
\tSupported FEC modes: Not reported
\tAdvertised link modes:  10baseT/Half 10baseT/Full
\t                        100baseT/Half 100baseT/Full
\t                        1000baseT/Full
\tAdvertised pause frame use: Symmetric
\tAdvertised auto-negotiation: Yes
\tAdvertised FEC modes: Not reported
\tSpeed: 1000Mb/s
\tDuplex: Full
\tAuto-negotiation: on
\tPort: Twisted Pair
\tPHYAD: 1
\tTransceiver: internal
\tMDI-X: off (auto)
netlink error: Operation not permitted
        Current message level: 0x00000007 (7)
                               drv probe link
\tLink detected: yes
";

    /// node_exporter's test fake: `ethtool -i` text → DrvInfo.
    fn fake_driver(text: &str) -> DriverInfo {
        let mut d = DriverInfo::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let items: Vec<&str> = line.trim_matches(' ').split(": ").collect();
            let v = items.get(1).map(|s| s.to_string()).unwrap_or_default();
            match items[0] {
                "driver" => d.driver = v,
                "version" => d.version = v,
                "firmware-version" => d.fw_version = v,
                "bus-info" => d.bus_info = v,
                "expansion-rom-version" => d.erom_version = v,
                _ => {}
            }
        }
        d
    }

    /// node_exporter's test fake: `ethtool -S` text → statistics.
    fn fake_stats(text: &str) -> Vec<(String, u64)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("NIC statistics:"))
            .map(|l| {
                let items: Vec<&str> = l.trim_matches(' ').split(": ").collect();
                (items[0].to_string(), items[1].parse().unwrap())
            })
            .collect()
    }

    fn modes(s: &str) -> u32 {
        let bits = [
            ("10baseT/Half", 0),
            ("10baseT/Full", 1),
            ("100baseT/Half", 2),
            ("100baseT/Full", 3),
            ("1000baseT/Half", 4),
            ("1000baseT/Full", 5),
            ("10000baseT/Full", 12),
        ];
        s.split(' ').filter_map(|m| bits.iter().find(|(n, _)| *n == m)).fold(0, |acc, (_, b)| acc | 1 << b)
    }

    /// node_exporter's test fake: `ethtool` text → EthtoolCmd.
    fn fake_settings(text: &str) -> LinkSettings {
        let mut l = LinkSettings::default();
        let (mut sup, mut adv) = (false, false);
        for line in text.lines() {
            if line.starts_with('#') || line.starts_with("Settings for") {
                continue;
            }
            let line = line.trim_matches([' ', '\t']);
            if (sup || adv) && line.contains(':') {
                (sup, adv) = (false, false);
            }
            if adv {
                l.advertising |= modes(line);
                continue;
            } else if sup {
                l.supported |= modes(line);
                continue;
            }
            let items: Vec<&str> = line.split(": ").collect();
            let v = items.get(1).copied().unwrap_or("");
            match items[0] {
                "Supported pause frame use" if v == "Symmetric" => l.supported |= 1 << PAUSE,
                "Supported pause frame use" if v == "Receive-only" => l.supported |= 1 << ASYM_PAUSE,
                "Advertised pause frame use" if v == "Symmetric" => l.advertising |= 1 << PAUSE,
                "Advertised pause frame use" if v == "Receive-only" => l.advertising |= 1 << ASYM_PAUSE,
                "Supported ports" => {
                    for p in v.split(' ').map(|p| p.trim_matches([' ', '\t'])) {
                        match p {
                            "TP" => l.supported |= 1 << 7,
                            "MII" => l.supported |= 1 << 9,
                            _ => {}
                        }
                    }
                }
                "Supported link modes" => {
                    l.supported |= modes(v);
                    sup = true;
                }
                "Advertised link modes" => {
                    l.advertising |= modes(v);
                    adv = true;
                }
                "Supports auto-negotiation" if v == "Yes" => l.supported |= 1 << AUTONEG,
                "Advertised auto-negotiation" if v == "Yes" => l.advertising |= 1 << AUTONEG,
                "Auto-negotiation" if v == "on" => l.autoneg = 1,
                _ => {}
            }
        }
        l
    }

    fn render(out: Vec<Series>) -> String {
        let mut sink = Sink::new();
        emit(out, &mut sink);
        let mut text = String::new();
        expo::encode(vec![sink], expo::Format::Text, &mut text);
        text
    }

    /// ethtool_linux_test.go's TestEthToolCollector, expected output as
    /// node_exporter prints it (values in Go's %g spelling there).
    const EXPECTED: &str = r#"node_ethtool_align_errors{device="eth0"} 0
node_ethtool_info{bus_info="0000:00:1f.6",device="eth0",driver="e1000e",expansion_rom_version="",firmware_version="0.5-4",version="5.11.0-22-generic"} 1
node_ethtool_port_received_dropped{device="eth0"} 12028
node_ethtool_received_broadcast{device="eth0"} 5792
node_ethtool_received_errors_total{device="eth0"} 0
node_ethtool_received_missed{device="eth0"} 401
node_ethtool_received_multicast{device="eth0"} 23973
node_ethtool_received_packets_total{device="eth0"} 1.260062e+06
node_ethtool_received_unicast{device="eth0"} 1.230297e+06
node_ethtool_transmitted_aborted{device="eth0"} 0
node_ethtool_transmitted_errors_total{device="eth0"} 0
node_ethtool_transmitted_multi_collisions{device="eth0"} 0
node_ethtool_transmitted_packets_total{device="eth0"} 961500
node_ethtool_transmitted_single_collisions{device="eth0"} 0
node_ethtool_transmitted_underrun{device="eth0"} 0
node_network_advertised_speed_bytes{device="eth0",duplex="full",mode="1000baseT"} 1.25e+08
node_network_advertised_speed_bytes{device="eth0",duplex="full",mode="100baseT"} 1.25e+07
node_network_advertised_speed_bytes{device="eth0",duplex="full",mode="10baseT"} 1.25e+06
node_network_advertised_speed_bytes{device="eth0",duplex="half",mode="100baseT"} 1.25e+07
node_network_advertised_speed_bytes{device="eth0",duplex="half",mode="10baseT"} 1.25e+06
node_network_asymmetricpause_advertised{device="eth0"} 0
node_network_asymmetricpause_supported{device="eth0"} 0
node_network_autonegotiate{device="eth0"} 1
node_network_autonegotiate_advertised{device="eth0"} 1
node_network_autonegotiate_supported{device="eth0"} 1
node_network_pause_advertised{device="eth0"} 1
node_network_pause_supported{device="eth0"} 1
node_network_supported_port_info{device="eth0",type="MII"} 1
node_network_supported_port_info{device="eth0",type="TP"} 1
node_network_supported_speed_bytes{device="eth0",duplex="full",mode="10000baseT"} 1.25e+09
node_network_supported_speed_bytes{device="eth0",duplex="full",mode="1000baseT"} 1.25e+08
node_network_supported_speed_bytes{device="eth0",duplex="full",mode="100baseT"} 1.25e+07
node_network_supported_speed_bytes{device="eth0",duplex="full",mode="10baseT"} 1.25e+06
node_network_supported_speed_bytes{device="eth0",duplex="half",mode="100baseT"} 1.25e+07
node_network_supported_speed_bytes{device="eth0",duplex="half",mode="10baseT"} 1.25e+06
"#;

    fn series_of(text: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse::<f64>().unwrap())
            })
            .collect()
    }

    #[test]
    fn node_exporters_fixture_gives_its_expected_output() {
        let mut out = Vec::new();
        link_series("eth0", &fake_settings(SETTINGS), &mut out);
        info_series("eth0", &fake_driver(DRIVER), &mut out);
        stat_series("eth0", &fake_stats(STATISTICS), Some(&Regex::new(".*").unwrap()), &mut Names::default(), &mut out);
        let text = render(out);
        assert_eq!(series_of(&text), series_of(EXPECTED), "{text}");
        // Types and help as node_exporter's.
        assert!(text.contains("# TYPE node_ethtool_align_errors untyped\n"), "{text}");
        assert!(text.contains("# HELP node_ethtool_align_errors Network interface align_errors\n"));
        assert!(text.contains("# HELP node_ethtool_port_received_dropped Network interface port_rx_dropped\n"));
        assert!(text.contains("# TYPE node_ethtool_received_packets_total untyped\n"));
        assert!(text.contains("# HELP node_ethtool_received_packets_total Network interface packets received\n"));
        assert!(text.contains("# TYPE node_network_supported_speed_bytes gauge\n"));
        assert!(text.contains("# TYPE node_ethtool_info gauge\n"));
        // The two names that sanitise alike are both dropped.
        assert!(!text.contains("duplicate"));
    }

    #[test]
    fn fq_names_as_node_exporters_test() {
        for (metric, want) in [
            ("port.rx_errors", "node_ethtool_port_received_errors"),
            ("rx_errors", "node_ethtool_received_errors"),
            ("Queue[0] AllocFails", "node_ethtool_queue_0_allocfails"),
            ("Tx LPI entry count", "node_ethtool_transmitted_lpi_entry_count"),
            ("port.VF_admin_queue_requests", "node_ethtool_port_vf_admin_queue_requests"),
            ("[3]: tx_bytes", "node_ethtool_3_transmitted_bytes"),
            ("     err", "node_ethtool_err"),
            // Go's ReplaceAllString: leftmost, non-overlapping.
            ("rx_rx", "node_ethtool_received_rx"),
            ("tx", "node_ethtool_transmitted"),
            ("rxq_rx", "node_ethtool_rxq_received"),
            ("a_tx_b_rx_c", "node_ethtool_a_transmitted_b_received_c"),
        ] {
            assert_eq!(fq_name(metric), want, "{metric}");
        }
    }

    /// The hand-written sanitiser and word replacement equal the regular
    /// expressions node_exporter uses, on names built from the tricky
    /// characters.
    #[test]
    fn hand_written_rules_equal_node_exporters_regexps() {
        let san = Regex::new(r"_*[^0-9A-Za-z_]+_*").unwrap();
        let rx = Regex::new(r"(^|_)rx(_|$)").unwrap();
        let atoms = ["_", ".", " ", "rx", "tx", "a", "0", "é", "[", "__", "x"];
        let mut names = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for n in &names {
                for a in atoms {
                    next.push(format!("{n}{a}"));
                }
            }
            names.extend(next);
        }
        for n in &names {
            assert_eq!(sanitize(n), san.replace_all(n, "_"), "sanitize {n:?}");
            assert_eq!(replace_word(n, "rx", "received"), rx.replace_all(n, "${1}received${2}"), "rx in {n:?}");
        }
    }

    #[test]
    fn the_metrics_include_filter_sees_sanitised_names() {
        let stats = fake_stats(STATISTICS);
        let mut out = Vec::new();
        // Unanchored, on the sanitised (not lower-cased, not renamed) name.
        stat_series("eth0", &stats, Some(&Regex::new("port_rx").unwrap()), &mut Names::default(), &mut out);
        let names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["node_ethtool_port_received_dropped"]);
        let mut out = Vec::new();
        stat_series("eth0", &stats, Some(&Regex::new("^tx_").unwrap()), &mut Names::default(), &mut out);
        let mut names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "node_ethtool_transmitted_aborted",
                "node_ethtool_transmitted_errors_total",
                "node_ethtool_transmitted_multi_collisions",
                "node_ethtool_transmitted_packets_total",
                "node_ethtool_transmitted_single_collisions",
                "node_ethtool_transmitted_underrun",
            ]
        );
        // Both of the fixture's duplicates sanitise to duplicate_metric
        // and match; names that clash only once lower-cased can be told
        // apart by the pattern, which keeps the one it matches.
        let mut out = Vec::new();
        stat_series("eth0", &stats, Some(&Regex::new("^duplicate_").unwrap()), &mut Names::default(), &mut out);
        assert!(out.is_empty());
        let pair = vec![("Foo".to_string(), 1), ("foo".to_string(), 2)];
        let mut out = Vec::new();
        stat_series("eth0", &pair, Some(&Regex::new("^f").unwrap()), &mut Names::default(), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].name.as_str(), out[0].value), ("node_ethtool_foo", 2.0));
        // No pattern (an empty flag) is everything.
        let mut out = Vec::new();
        stat_series("eth0", &stats, None, &mut Names::default(), &mut out);
        assert_eq!(out.len(), 14);
    }

    #[test]
    fn repeated_and_clashing_names() {
        let stats: Vec<(String, u64)> =
            [("rx_x", 1), ("rx_x", 2), ("", 9), ("RX_X", 3), ("a.b", 4), ("a_b", 5), ("a-b", 6), ("autonegotiate", 1)]
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect();
        let mut out = Vec::new();
        stat_series("d", &stats, None, &mut Names::default(), &mut out);
        // rx_x (last value 2) and RX_X clash after lower-casing; a.b, a_b
        // and a-b clash; the link key is skipped: nothing is left.
        assert!(out.is_empty(), "{out:?}");
        let stats = vec![("rx_x".to_string(), 1), ("rx_x".to_string(), 2)];
        let mut out = Vec::new();
        stat_series("d", &stats, None, &mut Names::default(), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].name.as_str(), out[0].value), ("node_ethtool_received_x", 2.0));
    }

    #[test]
    fn link_modes_above_bit_31_and_other_ports() {
        let l = LinkSettings { supported: 1 << 31 | 1 << 10 | 1 << 16 | 1 << 14, advertising: 1 << 23, autoneg: 0 };
        let mut out = Vec::new();
        link_series("d", &l, &mut out);
        let got = series_of(&render(out));
        let want: Vec<(String, f64)> = [
            ("node_network_advertised_speed_bytes{device=\"d\",duplex=\"full\",mode=\"40000baseKR4\"}", 5e9),
            ("node_network_asymmetricpause_advertised{device=\"d\"}", 0.0),
            ("node_network_asymmetricpause_supported{device=\"d\"}", 1.0),
            ("node_network_autonegotiate{device=\"d\"}", 0.0),
            ("node_network_autonegotiate_advertised{device=\"d\"}", 0.0),
            ("node_network_autonegotiate_supported{device=\"d\"}", 0.0),
            ("node_network_pause_advertised{device=\"d\"}", 0.0),
            ("node_network_pause_supported{device=\"d\"}", 0.0),
            ("node_network_supported_port_info{device=\"d\",type=\"Backplane\"}", 1.0),
            ("node_network_supported_port_info{device=\"d\",type=\"FIBRE\"}", 1.0),
            ("node_network_supported_speed_bytes{device=\"d\",duplex=\"full\",mode=\"25000baseCR\"}", 3.125e9),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        assert_eq!(got, want);
        // All-zero masks: only the capability gauges.
        let mut out = Vec::new();
        link_series("d", &LinkSettings::default(), &mut out);
        assert_eq!(out.len(), 7);
        assert!(out.iter().all(|s| s.value == 0.0));
    }

    #[test]
    fn lists_devices_as_procfs_and_fails_as_node_exporter() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("class/net");
        std::fs::create_dir_all(net.join("eth1")).unwrap();
        std::os::unix::fs::symlink("../../devices/virtual/net/lo", net.join("lo")).unwrap();
        std::fs::write(net.join("bonding_masters"), "bond0\n").unwrap();
        assert_eq!(list_devices(&net).unwrap(), ["eth1", "lo"]);

        let paths = |sys: &std::path::Path| Paths {
            procfs: "/proc".into(),
            sysfs: sys.into(),
            rootfs: "/".into(),
            udev_data: "/nonexistent".into(),
        };
        let o = || Options { filter: DeviceFilter::new(None, None), metrics: None };
        let mut sink = Sink::new();
        let mut c = Collector::new(o(), &paths(&dir.path().join("missing"))).unwrap();
        assert!(matches!(crate::Collector::update(&mut c, &mut sink), Err(Error::NoData(_))));
        std::fs::create_dir_all(dir.path().join("empty/class/net")).unwrap();
        let mut c = Collector::new(o(), &paths(&dir.path().join("empty"))).unwrap();
        assert!(matches!(crate::Collector::update(&mut c, &mut sink), Err(Error::Other(_))));
    }

    /// The host's own `lo` answers EOPNOTSUPP: no series, success.
    #[test]
    fn loopback_has_no_ethtool_series() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("class/net");
        std::fs::create_dir_all(net.join("lo")).unwrap();
        let paths = Paths { procfs: "/proc".into(), sysfs: dir.path().into(), rootfs: "/".into(), udev_data: "/nonexistent".into() };
        let mut c = Collector::new(Options { filter: DeviceFilter::new(None, None), metrics: None }, &paths).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        assert!(sink.families().is_empty());
        assert!(matches!(c.dev.driver_info("lo"), Err(ioctl::Failure::Errno(libc::EOPNOTSUPP))));
        assert!(matches!(c.dev.driver_info("no-such-dev0"), Err(ioctl::Failure::Errno(libc::ENODEV))));
    }
}
