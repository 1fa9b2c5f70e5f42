//! `arp`: ARP cache entries per device, as node_exporter 1.12 reads them:
//! by default one rtnetlink neighbour dump (IPv4, NOARP entries left out as
//! /proc/net/arp leaves them out), which also gives `node_arp_states`, the
//! entries by NUD state (as node_exporter's open PR #3191 names it); with
//! `--no-collector.arp.netlink` from /proc/net/arp (entries only).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Arg;

use netlink_packet_route::neighbour::NeighbourState;
use netlink_packet_route::AddressFamily;

use crate::filter::DeviceFilter;
use crate::flags::{self, BoolFlag, Flags, StringFlag};
use crate::io::read_file;
use crate::netlink::Route;
use crate::parse::{fields, lines};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
    pub netlink: bool,
}

pub const DEVICE_INCLUDE: StringFlag = StringFlag {
    name: "collector.arp.device-include",
    default: "",
    help: "Regexp of arp devices to include (mutually exclusive to device-exclude).",
};
pub const DEVICE_EXCLUDE: StringFlag = StringFlag {
    name: "collector.arp.device-exclude",
    default: "",
    help: "Regexp of arp devices to exclude (mutually exclusive to device-include).",
};
pub const NETLINK: BoolFlag =
    BoolFlag { name: "collector.arp.netlink", default: true, help: "Use netlink to gather stats instead of /proc/net/arp." };

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&DEVICE_INCLUDE, &DEVICE_EXCLUDE, &NETLINK])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { filter: flags::filter(f, &DEVICE_EXCLUDE, &DEVICE_INCLUDE)?, netlink: NETLINK.get(f) })
    }
}

/// Counts entries per device.
pub fn parse(buf: &[u8]) -> Option<BTreeMap<&[u8], u64>> {
    let mut out = BTreeMap::new();
    let mut it = lines(buf);
    it.next()?; // header
    for line in it {
        let dev = fields(line).nth(5)?;
        *out.entry(dev).or_insert(0) += 1;
    }
    Some(out)
}

/// The `state` label of a NUD state; `None` for NOARP entries, which
/// /proc/net/arp does not list either (and for states the kernel does not
/// give a neighbour cache entry).
pub fn state_label(s: NeighbourState) -> Option<&'static str> {
    Some(match s {
        NeighbourState::Incomplete => "incomplete",
        NeighbourState::Reachable => "reachable",
        NeighbourState::Stale => "stale",
        NeighbourState::Delay => "delay",
        NeighbourState::Probe => "probe",
        NeighbourState::Failed => "failed",
        NeighbourState::Permanent => "permanent",
        _ => return None,
    })
}

/// Entries per device, and per device and state.
pub type ByDevice<'a> = BTreeMap<&'a str, (u64, BTreeMap<&'static str, u64>)>;

/// Counts (interface index, NUD state) pairs per device name.
pub fn count_states<'a>(entries: impl IntoIterator<Item = (u32, NeighbourState)>, name: impl Fn(u32) -> Option<&'a str>) -> ByDevice<'a> {
    let mut out = ByDevice::new();
    for (index, state) in entries {
        let (Some(label), Some(dev)) = (state_label(state), name(index)) else { continue };
        let e = out.entry(dev).or_default();
        e.0 += 1;
        *e.1.entry(label).or_insert(0) += 1;
    }
    out
}

pub struct Collector {
    path: PathBuf,
    filter: DeviceFilter,
    netlink: bool,
    buf: Vec<u8>,
    route: Route,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { path: p.proc("net/arp"), filter: o.filter, netlink: o.netlink, buf: Vec::new(), route: Route::new() })
    }

    fn update_netlink(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let neighbours = self.route.neighbours(AddressFamily::Inet)?;
        let links = self.route.links_with(&[crate::netlink::attr::IFNAME])?;
        let names: rustc_hash::FxHashMap<u32, &str> = links
            .iter()
            .filter_map(|l| {
                l.attributes.iter().find_map(|a| match a {
                    netlink_packet_route::link::LinkAttribute::IfName(n) => Some((l.header.index, n.as_str())),
                    _ => None,
                })
            })
            .collect();
        let by = count_states(neighbours.iter().map(|n| (n.header.ifindex, n.header.state)), |i| names.get(&i).copied());
        let mut entries = sink.family("node_arp_entries", "ARP entries by device", Kind::Gauge);
        for (dev, (n, _)) in by.iter().filter(|(d, _)| !self.filter.ignored(d)) {
            entries.sample(&[("device", dev)], *n as f64);
        }
        let mut states = sink.family("node_arp_states", "ARP states by device", Kind::Gauge);
        for (dev, (_, by_state)) in by.iter().filter(|(d, _)| !self.filter.ignored(d)) {
            for (state, n) in by_state {
                states.sample(&[("device", dev), ("state", state)], *n as f64);
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
        read_file(&self.path, &mut self.buf)?;
        let entries = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        let mut f = sink.family("node_arp_entries", "ARP entries by device", Kind::Gauge);
        for (dev, n) in entries {
            let dev = std::str::from_utf8(dev).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
            if !self.filter.ignored(dev) {
                f.sample(&[("device", dev)], n as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"IP address HW type Flags HW address Mask Device\n192.168.1.1 0x1 0x2 cc:aa:dd:ee:aa:bb * eth0\n192.168.1.2 0x1 0x2 bb:cc:dd:ee:ff:aa * eth0\n10.0.0.1 0x1 0x2 de:ad:be:ef:00:00 * eth1\n";
        let m = super::parse(b).unwrap();
        assert_eq!(m[&b"eth0"[..]], 2);
        assert_eq!(m[&b"eth1"[..]], 1);
        assert!(super::parse(b"hdr\n1 2 3\n").is_none());
    }

    #[test]
    fn counts_states_and_leaves_out_noarp() {
        use super::NeighbourState as S;
        let names = |i: u32| match i {
            2 => Some("eth0"),
            3 => Some("eth1"),
            _ => None,
        };
        let by = super::count_states(
            [(2, S::Reachable), (2, S::Stale), (2, S::Stale), (2, S::Noarp), (3, S::Permanent), (9, S::Reachable)],
            names,
        );
        assert_eq!(by["eth0"].0, 3);
        assert_eq!(by["eth0"].1["stale"], 2);
        assert_eq!(by["eth0"].1.get("noarp"), None);
        assert_eq!(by["eth1"].0, 1);
        assert_eq!(by.len(), 2, "an index without a link is dropped");
    }
}
