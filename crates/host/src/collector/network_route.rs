//! `network_route`: the unicast routes of every routing table and family,
//! read as node_exporter 1.12 reads them (an RTM_GETROUTE netlink dump and
//! an RTM_GETLINK dump for the device names): `node_network_route_info`, one
//! series per route or per next hop of a multipath route (labels device,
//! src, dest, gw, priority, proto, weight), and `node_network_routes`, the
//! number of those per device.

use std::collections::{HashMap, HashSet};

use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};

use crate::netlink::{attr, Route};
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// One `node_network_route_info` series' labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteInfo {
    pub device: String,
    pub src: String,
    pub dest: String,
    pub gw: String,
    pub priority: String,
    pub proto: String,
    pub weight: String,
}

/// The address bytes of a route attribute, as Go's `net.IP` holds them.
fn bytes(a: &RouteAddress) -> Vec<u8> {
    match a {
        RouteAddress::Inet(v4) => v4.octets().to_vec(),
        RouteAddress::Inet6(v6) => v6.octets().to_vec(),
        RouteAddress::Mpls(l) => {
            let word = (l.label << 12) | (u32::from(l.traffic_class & 7) << 9) | (u32::from(l.bottom_of_stack) << 8) | u32::from(l.ttl);
            word.to_be_bytes().to_vec()
        }
        RouteAddress::Other(v) => v.clone(),
        _ => Vec::new(),
    }
}

/// Go's `net.IP.To4`: four bytes, or an IPv4-mapped IPv6 address.
fn to4(ip: &[u8]) -> Option<std::net::Ipv4Addr> {
    match ip.len() {
        4 => Some(std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
        16 if ip[..10].iter().all(|b| *b == 0) && ip[10] == 0xff && ip[11] == 0xff => {
            Some(std::net::Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]))
        }
        _ => None,
    }
}

fn to16(ip: &[u8]) -> Option<std::net::Ipv6Addr> {
    <[u8; 16]>::try_from(ip).ok().map(std::net::Ipv6Addr::from)
}

/// Go's `net.IP.String` ("" for no address).
pub fn ip_string(ip: &[u8]) -> String {
    if ip.is_empty() {
        return String::new();
    }
    if let Some(v4) = to4(ip) {
        return v4.to_string();
    }
    if let Some(v6) = to16(ip) {
        return v6.to_string();
    }
    let mut s = String::from("?");
    for b in ip {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// node_exporter's destination label: "default" for a zero-length prefix,
/// else Go's `net.IPNet.String` of the address and prefix length.
pub fn dest_string(ip: &[u8], len: u8) -> String {
    if len == 0 {
        return "default".into();
    }
    match (to4(ip), to16(ip)) {
        (Some(v4), _) if len <= 32 => format!("{v4}/{len}"),
        (None, Some(v6)) if len <= 128 => format!("{v6}/{len}"),
        _ => "<nil>".into(),
    }
}

/// The routing protocol's name, from the kernel's `rtnetlink.h`.
pub fn proto_name(p: u8) -> &'static str {
    match p {
        0 => "unspec",
        1 => "redirect",
        2 => "kernel",
        3 => "boot",
        4 => "static",
        8 => "gated",
        9 => "ra",
        10 => "mrt",
        11 => "zebra",
        12 => "bird",
        13 => "dnrouted",
        14 => "xorp",
        15 => "ntk",
        16 => "dhcp",
        17 => "mrouted",
        42 => "babel",
        186 => "bgp",
        187 => "isis",
        188 => "ospf",
        189 => "rip",
        192 => "eigrp",
        _ => "unknown",
    }
}

/// The series of one route: none unless it is unicast; one per next hop of
/// a multipath route (weight = hops + 1), else one with an empty weight.
/// A device the link dump did not name is "".
pub fn route_infos(r: &RouteMessage, names: &HashMap<u32, String>) -> Vec<RouteInfo> {
    if r.header.kind != RouteType::Unicast {
        return Vec::new();
    }
    let (mut dst, mut src, mut gw, mut oif, mut priority, mut hops) = (Vec::new(), Vec::new(), Vec::new(), 0, 0, Vec::new());
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = bytes(d),
            RouteAttribute::PrefSource(s) => src = bytes(s),
            RouteAttribute::Gateway(g) => gw = bytes(g),
            RouteAttribute::Oif(i) => oif = *i,
            RouteAttribute::Priority(p) => priority = *p,
            RouteAttribute::MultiPath(m) => hops.extend(m.iter()),
            _ => {}
        }
    }
    let name = |i: u32| names.get(&i).cloned().unwrap_or_default();
    let base = RouteInfo {
        device: String::new(),
        src: ip_string(&src),
        dest: dest_string(&dst, r.header.destination_prefix_length),
        gw: String::new(),
        priority: priority.to_string(),
        proto: proto_name(u8::from(r.header.protocol)).to_string(),
        weight: String::new(),
    };
    if hops.is_empty() {
        return vec![RouteInfo { device: name(oif), gw: ip_string(&gw), ..base }];
    }
    hops.iter()
        .map(|h| {
            let gw = h.attributes.iter().rev().find_map(|a| match a {
                RouteAttribute::Gateway(g) => Some(bytes(g)),
                _ => None,
            });
            RouteInfo {
                device: name(h.interface_index),
                gw: ip_string(&gw.unwrap_or_default()),
                weight: (u16::from(h.hops) + 1).to_string(),
                ..base.clone()
            }
        })
        .collect()
}

pub struct Collector {
    route: Route,
}

impl Collector {
    pub fn new(_p: &Paths) -> Self {
        Collector { route: Route::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let names: HashMap<u32, String> = self
            .route
            .links_with(&[attr::IFNAME])?
            .into_iter()
            .filter_map(|l| {
                let index = l.header.index;
                l.attributes
                    .into_iter()
                    .find_map(|a| match a {
                        LinkAttribute::IfName(n) => Some(n),
                        _ => None,
                    })
                    .map(|n| (index, n))
            })
            .collect();
        let routes = self.route.routes()?;
        let infos: Vec<RouteInfo> = routes.iter().flat_map(|r| route_infos(r, &names)).collect();

        // node_exporter counts every series, but its registry drops a
        // repeated label set (the same route in two tables) from the
        // exposition: the first is kept.
        let mut seen = HashSet::new();
        let mut per_device: Vec<(&str, u64)> = Vec::new();
        let mut f = sink.family("node_network_route_info", "network routing table information", Kind::Gauge);
        for i in &infos {
            match per_device.iter_mut().find(|(d, _)| *d == i.device) {
                Some((_, n)) => *n += 1,
                None => per_device.push((&i.device, 1)),
            }
            if !seen.insert(i) {
                continue;
            }
            f.sample(
                &[
                    ("dest", &i.dest),
                    ("device", &i.device),
                    ("gw", &i.gw),
                    ("priority", &i.priority),
                    ("proto", &i.proto),
                    ("src", &i.src),
                    ("weight", &i.weight),
                ],
                1.0,
            );
        }
        let mut f = sink.family("node_network_routes", "network routes by interface", Kind::Gauge);
        for (device, n) in per_device {
            f.sample(&[("device", device)], n as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::route::{RouteHeader, RouteNextHop, RouteProtocol};
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn names() -> HashMap<u32, String> {
        [(2, "eth0".to_string()), (3, "eth1".to_string())].into()
    }

    fn route(kind: RouteType, len: u8, attributes: Vec<RouteAttribute>) -> RouteMessage {
        let mut m = RouteMessage::default();
        m.header = RouteHeader { kind, destination_prefix_length: len, protocol: RouteProtocol::Static, ..Default::default() };
        m.attributes = attributes;
        m
    }

    #[test]
    fn a_plain_route() {
        let r = route(
            RouteType::Unicast,
            24,
            vec![
                RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 0))),
                RouteAttribute::PrefSource(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 5))),
                RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 1))),
                RouteAttribute::Oif(2),
                RouteAttribute::Priority(100),
            ],
        );
        assert_eq!(
            route_infos(&r, &names()),
            vec![RouteInfo {
                device: "eth0".into(),
                src: "10.0.0.5".into(),
                dest: "10.0.0.0/24".into(),
                gw: "10.0.0.1".into(),
                priority: "100".into(),
                proto: "static".into(),
                weight: "".into(),
            }]
        );
        // Only unicast routes count.
        assert!(route_infos(&route(RouteType::Local, 32, vec![]), &names()).is_empty());
        // A default route, an unknown device.
        let d = route_infos(&route(RouteType::Unicast, 0, vec![RouteAttribute::Oif(9)]), &names());
        assert_eq!((d[0].dest.as_str(), d[0].device.as_str(), d[0].priority.as_str()), ("default", "", "0"));
    }

    #[test]
    fn a_multipath_route_is_one_series_per_next_hop() {
        let hop = |ifindex: u32, hops: u8, gw: Ipv6Addr| {
            let mut h = RouteNextHop::default();
            h.interface_index = ifindex;
            h.hops = hops;
            h.attributes = vec![RouteAttribute::Gateway(RouteAddress::Inet6(gw))];
            h
        };
        let r = route(
            RouteType::Unicast,
            64,
            vec![
                RouteAttribute::Destination(RouteAddress::Inet6("2001:db8:1::".parse().unwrap())),
                RouteAttribute::MultiPath(vec![hop(2, 0, "fe80::1".parse().unwrap()), hop(3, 4, "fe80::2".parse().unwrap())]),
            ],
        );
        let got = route_infos(&r, &names());
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].device.as_str(), got[0].gw.as_str(), got[0].weight.as_str()), ("eth0", "fe80::1", "1"));
        assert_eq!((got[1].device.as_str(), got[1].gw.as_str(), got[1].weight.as_str()), ("eth1", "fe80::2", "5"));
        assert_eq!(got[1].dest, "2001:db8:1::/64");
    }

    #[test]
    fn addresses_as_go_prints_them() {
        assert_eq!(ip_string(&[]), "");
        assert_eq!(ip_string(&[1, 2, 3, 4]), "1.2.3.4");
        let mapped: Ipv6Addr = "::ffff:1.2.3.4".parse().unwrap();
        assert_eq!(ip_string(&mapped.octets()), "1.2.3.4");
        let v6: Ipv6Addr = "2001:db8:0:0:1:0:0:1".parse().unwrap();
        assert_eq!(ip_string(&v6.octets()), "2001:db8::1:0:0:1");
        let one_zero: Ipv6Addr = "2001:db8:0:1:1:1:1:1".parse().unwrap();
        assert_eq!(ip_string(&one_zero.octets()), "2001:db8:0:1:1:1:1:1");
        assert_eq!(ip_string(&[0xab, 1]), "?ab01");
        assert_eq!(dest_string(&[], 0), "default");
        assert_eq!(dest_string(&[], 8), "<nil>");
        assert_eq!(dest_string(&[10, 0, 0, 0], 33), "<nil>");
        assert_eq!(dest_string(&Ipv6Addr::UNSPECIFIED.octets(), 0), "default");
        assert_eq!(dest_string(&"fe80::".parse::<Ipv6Addr>().unwrap().octets(), 64), "fe80::/64");
        assert_eq!(proto_name(2), "kernel");
        assert_eq!(proto_name(200), "unknown");
    }

    /// Against this kernel: at least the dump works and every series has
    /// its seven labels.
    #[test]
    fn dumps_this_hosts_routes() {
        let mut c = Collector::new(&crate::testutil::paths(std::path::Path::new("/")));
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).expect("route dump");
        for (name, labels, _) in crate::testutil::rows(&sink) {
            if name == "node_network_route_info" {
                assert_eq!(labels.len(), 7);
            }
        }
    }
}
