//! `netdev`: network device counters, as node_exporter 1.12 reads them: by
//! default one rtnetlink link dump (`IFLA_STATS64`, with `receive_nohandler`),
//! with `--no-collector.netdev.netlink` from /proc/net/dev. The counters
//! get node_exporter's legacy names (`receive_drop`, `transmit_colls`, …)
//! unless `--collector.netdev.enable-detailed-metrics`; optional labels
//! `ifalias` (`--collector.netdev.label-ifalias`) and the
//! `node_network_address_info` family (`--collector.netdev.address-info`).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Arg;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use rustc_hash::FxHashMap;

use crate::filter::DeviceFilter;
use crate::flags::{self, BoolFlag, Flags, StringFlag};
use crate::io::{read_file, read_text};
use crate::netlink::route::{link_counters, Counters};
use crate::netlink::{attr, Route};
use crate::parse::{fields, lines, parse_u64};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
    pub netlink: bool,
    pub detailed: bool,
    pub address_info: bool,
    pub label_ifalias: bool,
}

pub const DEVICE_INCLUDE: StringFlag = StringFlag {
    name: "collector.netdev.device-include",
    default: "",
    help: "Regexp of net devices to include (mutually exclusive to device-exclude).",
};
pub const DEVICE_EXCLUDE: StringFlag = StringFlag {
    name: "collector.netdev.device-exclude",
    default: "",
    help: "Regexp of net devices to exclude (mutually exclusive to device-include).",
};
pub const NETLINK: BoolFlag =
    BoolFlag { name: "collector.netdev.netlink", default: true, help: "Use netlink to gather stats instead of /proc/net/dev." };
pub const DETAILED: BoolFlag = BoolFlag {
    name: "collector.netdev.enable-detailed-metrics",
    default: false,
    help: "Use (incompatible) metric names that provide more detailed stats on Linux",
};
pub const ADDRESS_INFO: BoolFlag =
    BoolFlag { name: "collector.netdev.address-info", default: false, help: "Collect address-info for every device" };
pub const LABEL_IFALIAS: BoolFlag = BoolFlag { name: "collector.netdev.label-ifalias", default: false, help: "Add ifAlias label" };

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&DEVICE_INCLUDE, &DEVICE_EXCLUDE, &NETLINK, &DETAILED, &ADDRESS_INFO, &LABEL_IFALIAS])
    }

    /// The device patterns may be given as the deprecated
    /// `--collector.netdev.device-blacklist` / `-whitelist`.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options {
            filter: flags::filter(f, &DEVICE_EXCLUDE, &DEVICE_INCLUDE)?,
            netlink: NETLINK.get(f),
            detailed: DETAILED.get(f),
            address_info: ADDRESS_INFO.get(f),
            label_ifalias: LABEL_IFALIAS.get(f),
        })
    }
}

/// /proc/net/dev's 16 columns under node_exporter's keys.
const PROC_KEYS: [&str; 16] = [
    "receive_bytes",
    "receive_packets",
    "receive_errors",
    "receive_dropped",
    "receive_fifo",
    "receive_frame",
    "receive_compressed",
    "receive_multicast",
    "transmit_bytes",
    "transmit_packets",
    "transmit_errors",
    "transmit_dropped",
    "transmit_fifo",
    "transmit_colls",
    "transmit_carrier",
    "transmit_compressed",
];

/// node_exporter's legacy names (its default): the kernel's detailed error
/// counters folded as /proc/net/dev folds them
/// (net/core/net-procfs.c, `dev_seq_printf_stats`).
pub fn legacy(c: &mut Counters) {
    fn pop(c: &mut Counters, key: &str) -> Option<u64> {
        let i = c.iter().position(|(k, _)| *k == key)?;
        Some(c.remove(i).1)
    }
    fn popz(c: &mut Counters, keys: &[&str]) -> u64 {
        keys.iter().map(|k| pop(c, k).unwrap_or(0)).sum()
    }
    let rules: [(&str, &'static str, &[&str]); 10] = [
        ("receive_errors", "receive_errs", &[]),
        ("receive_dropped", "receive_drop", &["receive_missed_errors"]),
        ("receive_fifo_errors", "receive_fifo", &[]),
        ("receive_frame_errors", "receive_frame", &["receive_length_errors", "receive_over_errors", "receive_crc_errors"]),
        ("multicast", "receive_multicast", &[]),
        ("transmit_errors", "transmit_errs", &[]),
        ("transmit_dropped", "transmit_drop", &[]),
        ("transmit_fifo_errors", "transmit_fifo", &[]),
        ("collisions", "transmit_colls", &[]),
        (
            "transmit_carrier_errors",
            "transmit_carrier",
            &["transmit_aborted_errors", "transmit_heartbeat_errors", "transmit_window_errors"],
        ),
    ];
    for (from, to, folded) in rules {
        if let Some(v) = pop(c, from) {
            let v = v.wrapping_add(popz(c, folded));
            c.push((to, v));
        }
    }
}

/// One device line of /proc/net/dev: name, 8 receive and 8 transmit counters.
pub type DevLine<'a> = (&'a [u8], [u64; 16]);

/// Parses /proc/net/dev (two header lines, then `name: 16 counters`).
pub fn parse(buf: &[u8]) -> Option<Vec<DevLine<'_>>> {
    let mut out = Vec::new();
    for line in lines(buf).skip(2) {
        let colon = line.iter().position(|&c| c == b':')?;
        let name = line[..colon].trim_ascii();
        let mut v = [0u64; 16];
        let mut n = 0;
        for (slot, f) in v.iter_mut().zip(fields(&line[colon + 1..])) {
            *slot = parse_u64(f)?;
            n += 1;
        }
        if n != 16 {
            return None;
        }
        out.push((name, v));
    }
    Some(out)
}

/// One `node_network_address_info` series: device, address, prefix length, scope.
#[derive(Debug, PartialEq)]
pub struct AddrInfo {
    pub index: u32,
    pub address: IpAddr,
    pub prefix: u8,
}

/// The address Go's `net.Interface.Addrs` reports for one RTM_NEWADDR
/// message: the local address of a point-to-point link, else the address.
pub fn addr_info(m: &AddressMessage) -> Option<AddrInfo> {
    let mut address = None;
    let mut local = None;
    for a in &m.attributes {
        match a {
            AddressAttribute::Address(ip) => address = address.or(Some(*ip)),
            AddressAttribute::Local(ip) => local = local.or(Some(*ip)),
            _ => {}
        }
    }
    Some(AddrInfo { index: m.header.index, address: local.or(address)?, prefix: m.header.prefix_len })
}

/// node_exporter's `scope` label, which follows Go's `net.IP` predicates
/// (so 127.0.0.1 is "link-local", as there).
pub fn scope(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let link_local_multicast = o[0] == 224 && o[1] == 0 && o[2] == 0;
            if v4.is_loopback() || v4.is_link_local() || link_local_multicast {
                "link-local"
            } else if v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() {
                ""
            } else {
                "global"
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return scope(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let link_local_unicast = s[0] & 0xffc0 == 0xfe80;
            let link_local_multicast = s[0] & 0xff0f == 0xff02;
            let interface_local_multicast = s[0] & 0xff0f == 0xff01;
            if v6.is_loopback() || link_local_unicast || link_local_multicast {
                "link-local"
            } else if interface_local_multicast {
                "interface-local"
            } else if v6.is_unspecified() || v6.is_multicast() {
                ""
            } else {
                "global"
            }
        }
    }
}

fn link_name(l: &LinkMessage) -> Option<&str> {
    l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

fn link_alias(l: &LinkMessage) -> &str {
    l.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfAlias(n) => Some(n.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

pub struct Collector {
    proc_dev: PathBuf,
    class_net: PathBuf,
    o: Options,
    buf: Vec<u8>,
    route: Route,
    /// Family name and HELP of each key, made once.
    names: FxHashMap<&'static str, (String, String)>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            proc_dev: p.proc("net/dev"),
            class_net: p.sys("class/net"),
            o,
            buf: Vec::new(),
            route: Route::new(),
            names: FxHashMap::default(),
        })
    }

    /// (device, ifalias, counters) of every device the filter keeps.
    fn devices(&mut self, links: Option<&[LinkMessage]>) -> Result<Vec<(String, String, Counters)>, Error> {
        let mut out = Vec::new();
        if let Some(links) = links {
            for l in links {
                let Some(name) = link_name(l) else { continue };
                if self.o.filter.ignored(name) {
                    continue;
                }
                let Some(c) = link_counters(l) else {
                    tracing::debug!(device = name, "no netlink stats, skipping");
                    continue;
                };
                out.push((name.to_string(), link_alias(l).to_string(), c));
            }
            return Ok(out);
        }
        read_file(&self.proc_dev, &mut self.buf)?;
        let devs = parse(&self.buf).ok_or_else(|| Error::parse(&self.proc_dev, "malformed line"))?;
        for (name, v) in devs {
            let dev = std::str::from_utf8(name).map_err(|_| Error::parse(&self.proc_dev, "invalid UTF-8"))?;
            if self.o.filter.ignored(dev) {
                continue;
            }
            let alias = if self.o.label_ifalias { self.sysfs_alias(dev) } else { String::new() };
            out.push((dev.to_string(), alias, PROC_KEYS.iter().copied().zip(v).collect()));
        }
        Ok(out)
    }

    fn sysfs_alias(&self, dev: &str) -> String {
        read_text(&self.class_net.join(dev).join("ifalias")).map(|s| s.trim_end_matches('\n').to_string()).unwrap_or_default()
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let links = if self.o.netlink || self.o.address_info {
            Some(self.route.links_with(&[attr::IFNAME, attr::IFALIAS, attr::STATS, attr::STATS64])?)
        } else {
            None
        };
        let devices = self.devices(if self.o.netlink { links.as_deref() } else { None })?;
        for (dev, alias, mut counters) in devices {
            if !self.o.detailed {
                legacy(&mut counters);
            }
            for (key, v) in counters {
                let (name, help) = self
                    .names
                    .entry(key)
                    .or_insert_with(|| (format!("node_network_{key}_total"), format!("Network device statistic {key}.")));
                let mut f = sink.family(name, help, Kind::Counter);
                if self.o.label_ifalias {
                    f.sample(&[("device", &dev), ("ifalias", &alias)], v as f64);
                } else {
                    f.sample(&[("device", &dev)], v as f64);
                }
            }
        }
        if self.o.address_info {
            let names: FxHashMap<u32, &str> = links.iter().flatten().filter_map(|l| Some((l.header.index, link_name(l)?))).collect();
            let addrs = self.route.addresses()?;
            let mut f = sink.family("node_network_address_info", "node network address by device", Kind::Gauge);
            for a in addrs.iter().filter_map(addr_info) {
                let Some(dev) = names.get(&a.index) else { continue };
                if self.o.filter.ignored(dev) {
                    continue;
                }
                let (address, prefix) = (a.address.to_string(), a.prefix.to_string());
                f.sample(&[("address", &address), ("device", dev), ("netmask", &prefix), ("scope", scope(a.address))], 1.0);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::address::AddressMessage;
    use netlink_packet_route::link::{Stats, Stats64};

    #[test]
    fn parses() {
        let b = b"Inter-|   Receive\n face |bytes\n    lo: 100 2 0 0 0 0 0 0 100 2 0 0 0 0 0 0\n  eth0:1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n";
        let d = super::parse(b).unwrap();
        assert_eq!(d[0].0, b"lo");
        assert_eq!(d[1].1[15], 16);
        assert_eq!(d[1].1[0], 1);
        assert!(super::parse(b"a\nb\n lo: 1 2 3\n").is_none());
    }

    fn stats() -> Stats64 {
        let mut s = Stats64::default();
        s.rx_packets = 1;
        s.tx_packets = 2;
        s.rx_bytes = 3;
        s.tx_bytes = 4;
        s.rx_errors = 5;
        s.tx_errors = 6;
        s.rx_dropped = 7;
        s.tx_dropped = 8;
        s.multicast = 9;
        s.collisions = 10;
        s.rx_length_errors = 11;
        s.rx_over_errors = 12;
        s.rx_crc_errors = 13;
        s.rx_frame_errors = 14;
        s.rx_fifo_errors = 15;
        s.rx_missed_errors = 16;
        s.tx_aborted_errors = 17;
        s.tx_carrier_errors = 18;
        s.tx_fifo_errors = 19;
        s.tx_heartbeat_errors = 20;
        s.tx_window_errors = 21;
        s.rx_compressed = 22;
        s.tx_compressed = 23;
        s.rx_nohandler = 24;
        s.rx_otherhost_dropped = 25;
        s
    }

    fn get(c: &Counters, k: &str) -> Option<u64> {
        c.iter().find(|(key, _)| *key == k).map(|(_, v)| *v)
    }

    #[test]
    fn legacy_names_fold_the_detailed_errors_as_proc_net_dev_does() {
        let mut l = LinkMessage::default();
        l.attributes.push(LinkAttribute::Stats64(stats()));
        let mut c = link_counters(&l).unwrap();
        assert_eq!(c.len(), 24);
        legacy(&mut c);
        let want = [
            ("receive_packets", 1),
            ("transmit_packets", 2),
            ("receive_bytes", 3),
            ("transmit_bytes", 4),
            ("receive_errs", 5),
            ("receive_drop", 7 + 16),
            ("receive_fifo", 15),
            ("receive_frame", 14 + 11 + 12 + 13),
            ("receive_multicast", 9),
            ("transmit_errs", 6),
            ("transmit_drop", 8),
            ("transmit_fifo", 19),
            ("transmit_colls", 10),
            ("transmit_carrier", 18 + 17 + 20 + 21),
            ("receive_compressed", 22),
            ("transmit_compressed", 23),
            ("receive_nohandler", 24),
        ];
        assert_eq!(c.len(), want.len(), "{c:?}");
        for (k, v) in want {
            assert_eq!(get(&c, k), Some(v), "{k}");
        }
    }

    #[test]
    fn proc_net_dev_keys_get_the_same_legacy_names() {
        let mut c: Counters = PROC_KEYS.iter().copied().zip(1..=16).collect();
        legacy(&mut c);
        let mut keys: Vec<_> = c.iter().map(|(k, _)| *k).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "receive_bytes",
                "receive_compressed",
                "receive_drop",
                "receive_errs",
                "receive_fifo",
                "receive_frame",
                "receive_multicast",
                "receive_packets",
                "transmit_bytes",
                "transmit_carrier",
                "transmit_colls",
                "transmit_compressed",
                "transmit_drop",
                "transmit_errs",
                "transmit_fifo",
                "transmit_packets"
            ]
        );
        assert_eq!(get(&c, "receive_drop"), Some(4));
    }

    #[test]
    fn stats_32_bit_are_used_when_there_are_no_others() {
        let mut l = LinkMessage::default();
        assert!(link_counters(&l).is_none());
        let mut s = Stats::default();
        s.rx_nohandler = 7;
        s.rx_bytes = u32::MAX;
        l.attributes.push(LinkAttribute::Stats(s));
        let c = link_counters(&l).unwrap();
        assert_eq!(get(&c, "receive_nohandler"), Some(7));
        assert_eq!(get(&c, "receive_bytes"), Some(u32::MAX as u64));
    }

    #[test]
    fn scopes_follow_go() {
        for (ip, want) in [
            ("127.0.0.1", "link-local"),
            ("169.254.1.2", "link-local"),
            ("224.0.0.251", "link-local"),
            ("10.0.0.5", "global"),
            ("8.8.8.8", "global"),
            ("239.1.2.3", ""),
            ("0.0.0.0", ""),
            ("255.255.255.255", ""),
            ("::1", "link-local"),
            ("fe80::1", "link-local"),
            ("ff02::1", "link-local"),
            ("ff01::1", "interface-local"),
            ("2001:db8::1", "global"),
            ("fd00::1", "global"),
            ("ff05::2", ""),
            ("::", ""),
            ("::ffff:10.1.2.3", "global"),
        ] {
            assert_eq!(scope(ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn point_to_point_links_report_the_local_address() {
        let mut m = AddressMessage::default();
        m.header.index = 3;
        m.header.prefix_len = 32;
        assert!(addr_info(&m).is_none());
        m.attributes.push(AddressAttribute::Address("10.0.0.2".parse().unwrap()));
        assert_eq!(addr_info(&m).unwrap().address, "10.0.0.2".parse::<IpAddr>().unwrap());
        m.attributes.push(AddressAttribute::Local("10.0.0.1".parse().unwrap()));
        let a = addr_info(&m).unwrap();
        assert_eq!((a.index, a.address, a.prefix), (3, "10.0.0.1".parse().unwrap(), 32));
    }
}
