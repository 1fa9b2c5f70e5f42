//! `netclass`: network device properties. By default from
//! /sys/class/net, as node_exporter 1.12 does; with
//! `--collector.netclass.netlink` (node_exporter's `netclass_rtnl`) from one
//! rtnetlink link dump and one ethtool link-modes dump, plus the three
//! sysfs attributes netlink lacks, with node_exporter's rtnl label set (no
//! `adminstate`) and, with `--collector.netclass_rtnl.with-stats`, the
//! device statistics as gauges.

use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{self, BoolFlag, Flags, StringFlag};
use regex::Regex;

use ethtool::EthtoolLinkModeDuplex;
use netlink_packet_route::link::{LinkAttribute, LinkMessage, Prop, State};

use crate::io::SysDir;
use crate::netlink::{Ethtool, LinkMode, Route};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub ignored: Option<Regex>,
    pub ignore_invalid_speed: bool,
    pub netlink: bool,
    pub with_stats: bool,
}

pub const IGNORED_DEVICES: StringFlag = StringFlag {
    name: "collector.netclass.ignored-devices",
    default: "^$",
    help: "Regexp of net devices to ignore for netclass collector.",
};
pub const IGNORE_INVALID_SPEED: BoolFlag =
    BoolFlag { name: "collector.netclass.ignore-invalid-speed", default: false, help: "Ignore devices where the speed is invalid." };
pub const NETLINK: BoolFlag =
    BoolFlag { name: "collector.netclass.netlink", default: false, help: "Use netlink to gather stats instead of /proc/net/dev." };
pub const WITH_STATS: BoolFlag = BoolFlag {
    name: "collector.netclass_rtnl.with-stats",
    default: false,
    help: "Expose the statistics for each network device, replacing netdev collector.",
};

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&IGNORED_DEVICES, &IGNORE_INVALID_SPEED, &NETLINK, &WITH_STATS])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options {
            ignored: IGNORED_DEVICES.regex(f)?,
            ignore_invalid_speed: IGNORE_INVALID_SPEED.get(f),
            netlink: NETLINK.get(f),
            with_stats: WITH_STATS.get(f),
        })
    }
}

/// (sysfs attribute, metric suffix, kind): integer attributes exported as is.
const INT_ATTRS: [(&str, &str, Kind); 13] = [
    ("addr_assign_type", "address_assign_type", Kind::Gauge),
    ("carrier", "carrier", Kind::Gauge),
    ("carrier_changes", "carrier_changes_total", Kind::Counter),
    ("carrier_up_count", "carrier_up_changes_total", Kind::Counter),
    ("carrier_down_count", "carrier_down_changes_total", Kind::Counter),
    ("dev_id", "device_id", Kind::Gauge),
    ("dormant", "dormant", Kind::Gauge),
    ("flags", "flags", Kind::Gauge),
    ("ifindex", "iface_id", Kind::Gauge),
    ("iflink", "iface_link", Kind::Gauge),
    ("link_mode", "iface_link_mode", Kind::Gauge),
    ("mtu", "mtu_bytes", Kind::Gauge),
    ("netdev_group", "net_dev_group", Kind::Gauge),
];

/// Parses a sysfs integer, decimal or 0x-hexadecimal.
pub fn parse_int(s: &str) -> Option<i64> {
    match s.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// What one rtnetlink link message says of a device, under node_exporter's
/// rtnl names.
#[derive(Debug, Default, PartialEq)]
pub struct Link<'a> {
    pub name: &'a str,
    pub index: u32,
    pub flags: u32,
    pub protocol_type: u16,
    pub operstate: &'static str,
    pub address: String,
    pub broadcast: String,
    pub ifalias: &'a str,
    pub altnames: Vec<&'a str>,
    pub carrier: Option<u8>,
    pub carrier_changes: Option<u32>,
    pub carrier_up: Option<u32>,
    pub carrier_down: Option<u32>,
    pub link_mode: Option<u8>,
    pub iface_link: u32,
    pub mtu: Option<u32>,
    pub group: Option<u32>,
    pub txqlen: Option<u32>,
}

/// Go's `net.HardwareAddr.String()`: lower-case hex bytes joined by `:`.
pub fn hardware_addr(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 3);
    for (i, x) in b.iter().enumerate() {
        if i > 0 {
            s.push(':');
        }
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// node_exporter's names of IF_OPER_* (RFC 2863).
fn operstate(s: &State) -> &'static str {
    match s {
        State::Unknown => "unknown",
        State::NotPresent => "notpresent",
        State::Down => "down",
        State::LowerLayerDown => "lowerlayerdown",
        State::Testing => "testing",
        State::Dormant => "dormant",
        State::Up => "up",
        _ => "unknown",
    }
}

/// The device properties of one link message; `None` without a name.
pub fn link(m: &LinkMessage) -> Option<Link<'_>> {
    let mut l = Link {
        index: m.header.index,
        flags: m.header.flags.bits(),
        protocol_type: m.header.link_layer_type.into(),
        operstate: "unknown",
        iface_link: m.header.index,
        ..Default::default()
    };
    let mut named = false;
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => {
                l.name = n;
                named = true;
            }
            LinkAttribute::OperState(s) => l.operstate = operstate(s),
            LinkAttribute::Address(b) => l.address = hardware_addr(b),
            LinkAttribute::Broadcast(b) => l.broadcast = hardware_addr(b),
            LinkAttribute::IfAlias(a) => l.ifalias = a,
            LinkAttribute::PropList(props) => l.altnames.extend(props.iter().filter_map(|p| match p {
                Prop::AltIfName(n) if !n.is_empty() => Some(n.as_str()),
                _ => None,
            })),
            LinkAttribute::Carrier(c) => l.carrier = Some(*c),
            LinkAttribute::CarrierChanges(c) => l.carrier_changes = Some(*c),
            LinkAttribute::CarrierUpCount(c) => l.carrier_up = Some(*c),
            LinkAttribute::CarrierDownCount(c) => l.carrier_down = Some(*c),
            LinkAttribute::Mode(mode) => l.link_mode = Some((*mode).into()),
            // The kernel leaves IFLA_LINK out when it is the device itself.
            LinkAttribute::Link(i) if *i > 0 => l.iface_link = *i,
            LinkAttribute::Mtu(v) => l.mtu = Some(*v),
            LinkAttribute::Group(v) => l.group = Some(*v),
            LinkAttribute::TxQueueLen(v) => l.txqlen = Some(*v),
            _ => {}
        }
    }
    named.then_some(l)
}

/// The `duplex` label of ethtool's answer, as Go's ethtool package prints it.
fn duplex(d: Option<EthtoolLinkModeDuplex>) -> &'static str {
    match d {
        Some(EthtoolLinkModeDuplex::Half) => "half",
        Some(EthtoolLinkModeDuplex::Full) => "full",
        Some(_) => "unknown",
        None => "",
    }
}

pub struct Collector {
    dir: PathBuf,
    ignored: Option<Regex>,
    ignore_invalid_speed: bool,
    netlink: bool,
    with_stats: bool,
    route: Route,
    ethtool: Ethtool,
    /// Whether the ethtool family answered the last time.
    ethtool_ok: bool,
    names: Vec<String>,
    /// Each device's directory, kept across scrapes with what the
    /// kept-descriptor budget lets it keep open (see `SysDir`).
    devices: rustc_hash::FxHashMap<String, SysDir>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            dir: p.sys("class/net"),
            ignored: o.ignored,
            ignore_invalid_speed: o.ignore_invalid_speed,
            netlink: o.netlink,
            with_stats: o.with_stats,
            route: Route::new(),
            ethtool: Ethtool::new(),
            ethtool_ok: true,
            names: INT_ATTRS.iter().map(|(_, s, _)| format!("node_network_{s}")).collect(),
            devices: Default::default(),
        })
    }

    fn device(&mut self, sink: &mut Sink, dev: &str, path: &Path) {
        if !self.devices.contains_key(dev) {
            let Ok(d) = SysDir::open(path) else { return };
            self.devices.insert(dev.to_string(), d);
        }
        let Some(d) = self.devices.get_mut(dev) else { return };
        let mut attr = |a: &str| d.read(a).map(str::to_string);
        let operstate = attr("operstate").unwrap_or_default();
        let address = attr("address").unwrap_or_default();
        let broadcast = attr("broadcast").unwrap_or_default();
        let duplex = attr("duplex").unwrap_or_default();
        let ifalias = attr("ifalias").unwrap_or_default();
        let mut int = |a: &str| d.read(a).and_then(parse_int);
        let flags = int("flags");
        let adminstate = match flags {
            None => "unknown",
            Some(f) if f & 1 == 1 => "up",
            Some(_) => "down",
        };
        sink.family("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.", Kind::Gauge)
            .sample(&[("device", dev)], if operstate == "up" { 1.0 } else { 0.0 });
        sink.family("node_network_info", "Non-numeric data from /sys/class/net/<iface>, value is always 1.", Kind::Gauge).sample(
            &[
                ("address", &address),
                ("adminstate", adminstate),
                ("broadcast", &broadcast),
                ("device", dev),
                ("duplex", &duplex),
                ("ifalias", &ifalias),
                ("operstate", &operstate),
            ],
            1.0,
        );
        for ((file, suffix, kind), name) in INT_ATTRS.iter().zip(&self.names) {
            if let Some(v) = int(file) {
                sink.family(name, &format!("Network device property: {suffix}"), *kind).sample(&[("device", dev)], v as f64);
            }
        }
        if let Some(v) = int("name_assign_type") {
            sink.family("node_network_name_assign_type", "Network device property: name_assign_type", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
        if let Some(speed) = int("speed") {
            if speed >= 0 || !self.ignore_invalid_speed {
                sink.family("node_network_speed_bytes", "Network device property: speed_bytes", Kind::Gauge)
                    .sample(&[("device", dev)], (speed * 1000 * 1000 / 8) as f64);
            }
        }
        if let Some(v) = int("tx_queue_len") {
            sink.family("node_network_transmit_queue_length", "Network device property: transmit_queue_length", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
        if let Some(v) = int("type") {
            sink.family("node_network_protocol_type", "Network device property: protocol_type", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
        d.end();
    }
}

impl Collector {
    fn ignored(&self, dev: &str) -> bool {
        self.ignored.as_ref().is_some_and(|r| r.is_match(dev))
    }

    fn speed(&self, sink: &mut Sink, dev: &str, mbps: i64) {
        if mbps >= 0 || !self.ignore_invalid_speed {
            sink.family("node_network_speed_bytes", "Network device property: speed_bytes", Kind::Gauge)
                .sample(&[("device", dev)], (mbps * 1000 * 1000 / 8) as f64);
        }
    }

    fn update_netlink(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let modes: Vec<LinkMode> = match self.ethtool.link_modes() {
            Ok(m) => {
                self.ethtool_ok = true;
                m
            }
            Err(e) => {
                if self.ethtool_ok {
                    tracing::info!(err = %e, "ETHTOOL netlink interface unavailable, duplex and linkspeed are not scraped.");
                }
                self.ethtool_ok = false;
                Vec::new()
            }
        };
        let mut duplexes = rustc_hash::FxHashMap::default();
        for m in modes.iter().filter(|m| !self.ignored(&m.name)) {
            self.speed(sink, &m.name, m.speed.map_or(-1, i64::from));
            duplexes.insert(m.name.as_str(), duplex(m.duplex));
        }
        let messages = self.route.links()?;
        for m in &messages {
            let Some(l) = link(m) else { continue };
            if self.ignored(l.name) {
                continue;
            }
            let dev = l.name;
            sink.family("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.", Kind::Gauge)
                .sample(&[("device", dev)], if l.operstate == "up" { 1.0 } else { 0.0 });
            sink.family("node_network_info", "Non-numeric data of <iface>, value is always 1.", Kind::Gauge).sample(
                &[
                    ("address", &l.address),
                    ("broadcast", &l.broadcast),
                    ("device", dev),
                    ("duplex", duplexes.get(dev).copied().unwrap_or("")),
                    ("ifalias", l.ifalias),
                    ("operstate", l.operstate),
                ],
                1.0,
            );
            for alt in &l.altnames {
                sink.family("node_network_altnames_info", "Non-numeric data of <iface> altname, value is always 1.", Kind::Gauge)
                    .sample(&[("altname", alt), ("device", dev)], 1.0);
            }
            // The three attributes netlink lacks; they take a per-device
            // lock, not the RTNL lock.
            let (mut assign, mut dev_id, mut name_assign) = (None, None, None);
            if let Ok(mut d) = SysDir::open(&self.dir.join(dev)) {
                let mut int = |a: &str| d.read(a).and_then(parse_int);
                assign = int("addr_assign_type");
                dev_id = int("dev_id");
                name_assign = int("name_assign_type");
            }
            let prop = |sink: &mut Sink, suffix: &str, kind: Kind, v: Option<f64>| {
                if let Some(v) = v {
                    sink.family(&format!("node_network_{suffix}"), &format!("Network device property: {suffix}"), kind)
                        .sample(&[("device", dev)], v);
                }
            };
            let f = |v: Option<u32>| v.map(f64::from);
            prop(sink, "address_assign_type", Kind::Gauge, assign.map(|v| v as f64));
            prop(sink, "carrier", Kind::Gauge, l.carrier.map(f64::from));
            prop(sink, "carrier_changes_total", Kind::Counter, f(l.carrier_changes));
            prop(sink, "carrier_up_changes_total", Kind::Counter, f(l.carrier_up));
            prop(sink, "carrier_down_changes_total", Kind::Counter, f(l.carrier_down));
            prop(sink, "device_id", Kind::Gauge, dev_id.map(|v| v as f64));
            prop(sink, "flags", Kind::Gauge, Some(l.flags.into()));
            prop(sink, "iface_id", Kind::Gauge, Some(l.index.into()));
            prop(sink, "iface_link_mode", Kind::Gauge, l.link_mode.map(f64::from));
            // node_exporter's rtnl path reports the link mode as `dormant`
            // too; kept so that its dashboards show the same.
            prop(sink, "dormant", Kind::Gauge, l.link_mode.map(f64::from));
            prop(sink, "iface_link", Kind::Gauge, Some(l.iface_link.into()));
            prop(sink, "mtu_bytes", Kind::Gauge, f(l.mtu));
            prop(sink, "name_assign_type", Kind::Gauge, name_assign.map(|v| v as f64));
            prop(sink, "net_dev_group", Kind::Gauge, f(l.group));
            prop(sink, "transmit_queue_length", Kind::Gauge, f(l.txqlen));
            prop(sink, "protocol_type", Kind::Gauge, Some(l.protocol_type.into()));
            if self.with_stats {
                for (key, v) in crate::netlink::route::link_counters(m).into_iter().flatten() {
                    prop(sink, &format!("{key}_total"), Kind::Gauge, Some(v as f64));
                }
            }
        }
        Ok(())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        if self.netlink {
            return self.update_netlink(sink);
        }
        let rd = crate::io::retry_out_of_fds(|| std::fs::read_dir(&self.dir)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                Error::NoData(format!("cannot read {}: {e}", self.dir.display()))
            }
            _ => Error::io(&self.dir, e),
        })?;
        // Every entry but regular files (`bonding_masters`), as procfs's
        // NetClassDevices: devices are symlinks into /sys/devices, whose
        // type the directory entry tells without a stat of the target.
        let mut devs: Vec<(String, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                e.file_type().is_ok_and(|t| !t.is_file()).then(|| (name, e.path()))
            })
            .collect();
        devs.sort();
        // Devices that went away release their kept attributes.
        self.devices.retain(|name, _| devs.iter().any(|(d, _)| d == name));
        for (dev, path) in devs {
            if self.ignored.as_ref().is_some_and(|r| r.is_match(&dev)) {
                continue;
            }
            self.device(sink, &dev, &path);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ints() {
        assert_eq!(super::parse_int("0x1303"), Some(4867));
        assert_eq!(super::parse_int("-1"), Some(-1));
        assert_eq!(super::parse_int(""), None);
    }
}
