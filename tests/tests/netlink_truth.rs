//! The rtnetlink paths of netdev and arp against ground truth, in a network
//! namespace of the test's own (`ip netns add`): traffic the test sends
//! itself, addresses and neighbours it adds with iproute2, and the same
//! collectors' /proc paths (`--no-collector.*.netlink`) read from the same
//! namespace. Needs root (in CI it runs, never skips).

use std::collections::BTreeMap;

use expo::Sink;
use host::collector::{arp, netdev};
use host::filter::DeviceFilter;
use host::{Collector, Paths};
use node_agent_tests::netns::{Netns, SysfsMount};

type Series = BTreeMap<(String, Vec<(String, String)>), f64>;

fn collect(c: &mut dyn Collector) -> Series {
    let mut sink = Sink::new();
    c.update(&mut sink).expect("collector succeeds");
    let mut out = Series::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            out.insert((f.name().to_string(), labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()), v);
        }
    }
    out
}

fn get(s: &Series, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.get(&(name.to_string(), labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())).copied()
}

fn netdev_options(netlink: bool, address_info: bool) -> netdev::Options {
    // ifalias: over netlink from the link message; the /proc path reads
    // sysfs, which shows the namespace of its mounter, not the thread's.
    netdev::Options { filter: DeviceFilter::default(), netlink, detailed: false, address_info, label_ifalias: netlink }
}

#[test]
fn netdev_counters_over_netlink_equal_proc_net_dev_and_the_traffic_sent() {
    if !node_agent_tests::host::root_or_skip("netlink truth tests") {
        return;
    }
    let ns = Netns::new("dev");
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "set", "lo", "alias", "loopback of the test"]);
    const PACKETS: u64 = 250;
    const PAYLOAD: usize = 100;
    let (netlink, procfs) = ns.run(|paths| {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        for _ in 0..PACKETS {
            tx.send_to(&[7u8; PAYLOAD], rx.local_addr().expect("addr")).expect("send");
        }
        let mut buf = [0u8; 2048];
        for _ in 0..PACKETS {
            assert_eq!(rx.recv(&mut buf).expect("recv"), PAYLOAD);
        }
        let mut nl = netdev::Collector::new(netdev_options(true, false), paths).expect("collector");
        let mut pr = netdev::Collector::new(netdev_options(false, false), paths).expect("collector");
        (collect(&mut nl), collect(&mut pr))
    });
    let lo = [("device", "lo"), ("ifalias", "loopback of the test")];
    // The namespace's loopback carried the test's datagrams and nothing else.
    assert_eq!(get(&netlink, "node_network_receive_packets_total", &lo), Some(PACKETS as f64), "{netlink:?}");
    assert_eq!(get(&netlink, "node_network_transmit_packets_total", &lo), Some(PACKETS as f64));
    let bytes = get(&netlink, "node_network_receive_bytes_total", &lo).expect("bytes");
    // Payload, UDP and IPv4 headers (loopback counts no link-layer header).
    assert_eq!(bytes, (PACKETS as usize * (PAYLOAD + 8 + 20)) as f64);
    assert_eq!(get(&netlink, "node_network_receive_nohandler_total", &lo), Some(0.0));
    // Every family the /proc path prints, netlink prints with the same
    // value; netlink adds receive_nohandler only.
    let netlink: Series =
        netlink.into_iter().map(|((n, l), v)| ((n, l.into_iter().filter(|(k, _)| k != "ifalias").collect()), v)).collect();
    for ((name, labels), v) in &procfs {
        assert_eq!(netlink.get(&(name.clone(), labels.clone())), Some(v), "{name} {labels:?}");
    }
    let extra: Vec<_> = netlink.keys().filter(|k| !procfs.contains_key(k)).map(|(n, _)| n.as_str()).collect();
    assert_eq!(extra, ["node_network_receive_nohandler_total"]);
}

#[test]
fn address_info_lists_the_addresses_iproute2_added() {
    if !node_agent_tests::host::root_or_skip("netlink truth tests") {
        return;
    }
    let ns = Netns::new("addr");
    ns.ip(&["link", "set", "lo", "up"]);
    ns.ip(&["link", "add", "d0", "type", "veth", "peer", "name", "d1"]);
    ns.ip(&["link", "set", "d0", "up"]);
    ns.ip(&["addr", "add", "10.77.0.1/24", "dev", "d0"]);
    ns.ip(&["addr", "add", "2001:db8::7/64", "dev", "d0", "nodad"]);
    ns.ip(&["addr", "add", "10.78.0.1", "peer", "10.78.0.2/32", "dev", "d0"]);
    let s = ns.run(|paths| {
        let mut c = netdev::Collector::new(netdev_options(true, true), paths).expect("collector");
        collect(&mut c)
    });
    let info = |dev: &str, addr: &str, mask: &str, scope: &str| {
        get(&s, "node_network_address_info", &[("address", addr), ("device", dev), ("netmask", mask), ("scope", scope)])
    };
    assert_eq!(info("lo", "127.0.0.1", "8", "link-local"), Some(1.0), "{s:?}");
    assert_eq!(info("lo", "::1", "128", "link-local"), Some(1.0));
    assert_eq!(info("d0", "10.77.0.1", "24", "global"), Some(1.0));
    assert_eq!(info("d0", "2001:db8::7", "64", "global"), Some(1.0));
    // A point-to-point address is reported by its local end, as Go does.
    assert_eq!(info("d0", "10.78.0.1", "32", "global"), Some(1.0));
    let addrs = s.keys().filter(|(n, _)| n == "node_network_address_info").count();
    // Nothing else: d0's peer d1 is down, so d0 has no carrier and the
    // kernel gave it no IPv6 link-local address; d1 has none either.
    assert_eq!(addrs, 5, "{s:?}");
}

#[test]
fn arp_entries_and_states_over_netlink_match_what_was_added() {
    if !node_agent_tests::host::root_or_skip("netlink truth tests") {
        return;
    }
    let ns = Netns::new("arp");
    ns.ip(&["link", "add", "d0", "type", "veth", "peer", "name", "d1"]);
    ns.ip(&["link", "set", "d0", "up"]);
    ns.ip(&["addr", "add", "10.77.0.1/24", "dev", "d0"]);
    for (ip, state) in
        [("10.77.0.2", "permanent"), ("10.77.0.3", "permanent"), ("10.77.0.4", "stale"), ("10.77.0.5", "reachable"), ("10.77.0.6", "noarp")]
    {
        ns.ip(&["neigh", "add", ip, "lladdr", "02:00:00:00:00:01", "dev", "d0", "nud", state]);
    }
    // An IPv6 neighbour is not an ARP entry.
    ns.ip(&["addr", "add", "2001:db8::1/64", "dev", "d0", "nodad"]);
    ns.ip(&["neigh", "add", "2001:db8::2", "lladdr", "02:00:00:00:00:02", "dev", "d0", "nud", "permanent"]);
    let (nl, pr) = ns.run(|paths| {
        let opts = |netlink| arp::Options { filter: DeviceFilter::default(), netlink };
        let mut nl = arp::Collector::new(opts(true), paths).expect("collector");
        let mut pr = arp::Collector::new(opts(false), paths).expect("collector");
        (collect(&mut nl), collect(&mut pr))
    });
    // /proc/net/arp leaves out NOARP entries; so does the netlink path.
    assert_eq!(get(&pr, "node_arp_entries", &[("device", "d0")]), Some(4.0), "{pr:?}");
    assert_eq!(get(&nl, "node_arp_entries", &[("device", "d0")]), Some(4.0), "{nl:?}");
    let state = |s: &str| get(&nl, "node_arp_states", &[("device", "d0"), ("state", s)]);
    assert_eq!((state("permanent"), state("stale"), state("reachable")), (Some(2.0), Some(1.0), Some(1.0)));
    assert_eq!(nl.keys().filter(|(n, _)| n == "node_arp_states").count(), 3, "{nl:?}");
    // The /proc path has no states.
    assert!(!pr.keys().any(|(n, _)| n == "node_arp_states"));
}

#[test]
fn netclass_over_netlink_agrees_with_sysfs() {
    use host::collector::netclass;
    if !node_agent_tests::host::root_or_skip("netlink truth tests") {
        return;
    }
    let ns = Netns::new("class");
    ns.ip(&["link", "add", "d0", "type", "veth", "peer", "name", "d1"]);
    ns.ip(&["link", "set", "d0", "alias", "uplink"]);
    ns.ip(&["link", "property", "add", "dev", "d0", "altname", "uplink0"]);
    ns.ip(&["link", "set", "d0", "mtu", "1400"]);
    ns.ip(&["link", "set", "d0", "up"]);
    ns.ip(&["link", "set", "d1", "up"]);
    ns.ip(&["link", "set", "lo", "up"]);
    // node_network_up is the operational state, which follows the carrier
    // asynchronously (a run beside a build saw d0 still down).
    ns.wait_until_up("d0");
    let dir = tempfile::tempdir().expect("tempdir");
    let (nl, sys) = ns.run(|paths| {
        let _mount = SysfsMount::new(dir.path());
        let paths = Paths { sysfs: dir.path().to_path_buf(), ..paths.clone() };
        let opts = |netlink| netclass::Options { ignored: None, ignore_invalid_speed: false, netlink, with_stats: true };
        let mut nl = netclass::Collector::new(opts(true), &paths).expect("collector");
        let mut sys = netclass::Collector::new(opts(false), &paths).expect("collector");
        (collect(&mut nl), collect(&mut sys))
    });
    // Ground truth: what the test configured, and veth's 10 Gb/s full duplex.
    let d0 = [("device", "d0")];
    assert_eq!(get(&nl, "node_network_mtu_bytes", &d0), Some(1400.0), "{nl:?}");
    assert_eq!(get(&nl, "node_network_up", &d0), Some(1.0));
    assert_eq!(get(&nl, "node_network_speed_bytes", &d0), Some(10_000.0 * 1e6 / 8.0));
    assert_eq!(get(&nl, "node_network_altnames_info", &[("altname", "uplink0"), ("device", "d0")]), Some(1.0));
    let info = |s: &Series, dev: &str| {
        s.iter()
            .find(|((n, l), _)| n == "node_network_info" && l.iter().any(|(k, v)| k == "device" && v == dev))
            .map(|((_, l), _)| l.iter().filter(|(k, _)| k != "adminstate").cloned().collect::<Vec<_>>())
    };
    let d0_info = info(&nl, "d0").expect("d0 info");
    assert!(d0_info.contains(&("duplex".into(), "full".into())) && d0_info.contains(&("ifalias".into(), "uplink".into())), "{d0_info:?}");
    // Every family both paths have, for every device, has the same value,
    // apart from `dormant`, which node_exporter's rtnl path fills with the
    // link mode, and `flags`: netlink's ifi_flags add the kernel's runtime
    // bits (IFF_RUNNING, IFF_LOWER_UP) to the device flags sysfs shows.
    for dev in ["lo", "d0", "d1"] {
        assert_eq!(info(&nl, dev), info(&sys, dev), "node_network_info of {dev}");
    }
    let mut compared = 0;
    for ((name, labels), v) in &sys {
        if name == "node_network_flags" {
            let (a, b) = (nl[&(name.clone(), labels.clone())] as u32, *v as u32);
            assert_eq!(a & b, b, "{labels:?}: netlink flags {a:#x} hold sysfs's {b:#x}");
            assert_eq!(a & !b & !(libc::IFF_RUNNING as u32 | libc::IFF_LOWER_UP as u32), 0, "{labels:?}: {a:#x} vs {b:#x}");
            continue;
        }
        if name == "node_network_info" || name == "node_network_dormant" {
            continue;
        }
        assert_eq!(nl.get(&(name.clone(), labels.clone())), Some(v), "{name} {labels:?}");
        compared += 1;
    }
    assert!(compared >= 3 * 15, "compared {compared} series");
    // With stats: the device's counters, as gauges.
    assert!(get(&nl, "node_network_receive_nohandler_total", &d0).is_some());
}
