//! The `tcpstat` and `ethtool` collectors against ground truth, in network
//! namespaces of the test's own. tcpstat: listeners (IPv4 and IPv6), established
//! pairs with unread received bytes, a sender whose peer does not read (so
//! its send queue holds unsent bytes), a half-closed pair (FIN-WAIT-2 /
//! CLOSE-WAIT), a TIME-WAIT socket and a connection waiting in an accept
//! queue, counted by the collector inside the namespace and by
//! `ss -tan -H` there (states, and the sums of Recv-Q and Send-Q as
//! `rx_queued_bytes` / `tx_queued_bytes`). ethtool: a veth pair and an ifb
//! device that the veth's ingress traffic is redirected through, after the
//! test's own datagrams, compared with `ethtool -S`, `ethtool -i` and
//! `ethtool` (link settings, read by ethtool over netlink, decoded with
//! node_exporter's own test reader), the statistic names derived with
//! node_exporter's regular expressions. Needs root (in CI it runs, never
//! skips).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

use expo::Sink;
use host::collector::{ethtool, tcpstat, udp_queues};
use host::filter::DeviceFilter;
use host::{Collector, Paths};
use node_agent_tests::netns::{Netns, SysfsMount};
use regex::Regex;

type Labels = Vec<(String, String)>;
type Series = BTreeMap<(String, Labels), f64>;

fn collect(c: &mut dyn Collector) -> Series {
    let mut sink = Sink::new();
    c.update(&mut sink).expect("collector succeeds");
    let mut out = BTreeMap::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            let labels: Labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert!(out.insert((f.name().to_string(), labels), v).is_none(), "repeated series in {}", f.name());
        }
    }
    out
}

/// `cmd args` inside namespace `ns`: (success, stdout).
fn in_ns(ns: &Netns, cmd: &str, args: &[&str]) -> (bool, String) {
    let mut v = vec!["netns", "exec", &ns.0, cmd];
    v.extend_from_slice(args);
    let out = Command::new("ip").args(&v).output().unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// ss's state names → node_exporter's labels.
fn ss_state(s: &str) -> &'static str {
    match s {
        "ESTAB" => "established",
        "SYN-SENT" => "syn_sent",
        "SYN-RECV" => "syn_recv",
        "FIN-WAIT-1" => "fin_wait1",
        "FIN-WAIT-2" => "fin_wait2",
        "TIME-WAIT" => "time_wait",
        "UNCONN" => "close",
        "CLOSE-WAIT" => "close_wait",
        "LAST-ACK" => "last_ack",
        "LISTEN" => "listen",
        "CLOSING" => "closing",
        other => panic!("ss state {other}"),
    }
}

/// `ss -tan -H` in `ns`, as node_exporter's states and queue sums.
fn ss_truth(ns: &Netns) -> BTreeMap<String, f64> {
    let (ok, text) = in_ns(ns, "ss", &["-tan", "-H"]);
    assert!(ok, "ss -tan -H failed");
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (rq, wq): (f64, f64) = (f[1].parse().expect("Recv-Q"), f[2].parse().expect("Send-Q"));
        *out.entry(ss_state(f[0]).to_string()).or_default() += 1.0;
        *out.entry("rx_queued_bytes".into()).or_default() += rq;
        *out.entry("tx_queued_bytes".into()).or_default() += wq;
    }
    out
}

fn tcp_states(s: &Series) -> BTreeMap<String, f64> {
    s.iter()
        .map(|((name, labels), v)| {
            assert_eq!(name, "node_tcp_connection_states");
            assert_eq!(labels.len(), 1);
            assert_eq!(labels[0].0, "state");
            (labels[0].1.clone(), *v)
        })
        .collect()
}

/// Writes to `s` until its send buffer is full (the peer does not read).
fn fill(s: &mut TcpStream) {
    s.set_nonblocking(true).expect("nonblocking");
    let chunk = vec![0x5au8; 65536];
    loop {
        match s.write(&chunk) {
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("write: {e}"),
        }
    }
}

#[test]
fn tcp_connection_states_equal_ss() {
    if !node_agent_tests::host::root_or_skip("tcpstat truth tests") {
        return;
    }
    let ns = Netns::new("tcps");
    ns.ip(&["link", "set", "lo", "up"]);
    let (got, truth) = ns.run(|paths| {
        let l4 = TcpListener::bind("127.0.0.1:0").expect("bind v4");
        let l6 = TcpListener::bind("[::1]:0").expect("bind v6");
        let (a4, a6) = (l4.local_addr().unwrap(), l6.local_addr().unwrap());
        let mut pairs = Vec::new();
        for addr in [a4, a4, a4, a6] {
            let c = TcpStream::connect(addr).expect("connect");
            let (s, _) = if addr == a4 { l4.accept() } else { l6.accept() }.expect("accept");
            pairs.push((c, s));
        }
        // Unread received bytes on both families.
        pairs[0].0.write_all(&[7u8; 1000]).unwrap();
        pairs[3].1.write_all(&[9u8; 333]).unwrap();
        // Unsent bytes: the peer of pairs[1].1 never reads.
        fill(&mut pairs[1].1);
        // Half-closed: the client FIN-WAIT-2, the server CLOSE-WAIT.
        pairs[2].0.shutdown(Shutdown::Write).unwrap();
        // TIME-WAIT: the client closes first, then the server.
        {
            let c = TcpStream::connect(a4).unwrap();
            let (s, _) = l4.accept().unwrap();
            drop(c);
            std::thread::sleep(Duration::from_millis(50));
            drop(s);
        }
        // Waiting in the IPv6 listener's accept queue (never accepted).
        let _pending = TcpStream::connect(a6).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        fill(&mut pairs[1].1);
        std::thread::sleep(Duration::from_millis(200));

        let mut c = tcpstat::Collector::new(paths);
        // The queues are still; retry a few times should ss catch a
        // moment of movement (window probes, a late FIN).
        let mut last = None;
        for _ in 0..5 {
            let got = tcp_states(&collect(&mut c));
            let truth = ss_truth(&ns);
            if got == truth {
                return (got, truth);
            }
            last = Some((got, truth));
            std::thread::sleep(Duration::from_millis(200));
        }
        last.expect("compared")
    });
    assert_eq!(got, truth, "collector vs ss -tan");
    // The sockets the test made: 2 listeners; 3 established pairs
    // (pairs 0, 1, 3) and the pending one; the half-closed pair; one
    // TIME-WAIT.
    let want_states: BTreeMap<&str, f64> =
        [("listen", 2.0), ("established", 8.0), ("fin_wait2", 1.0), ("close_wait", 1.0), ("time_wait", 1.0)].into();
    for (state, n) in &want_states {
        assert_eq!(got.get(*state), Some(n), "{state}: {got:?}");
    }
    assert_eq!(got.len(), want_states.len() + 2, "no other states: {got:?}");
    // 1000 + 333 unread bytes, the pending connection in the accept queue,
    // and the reader that never reads holding at least a window of data.
    assert!(got["rx_queued_bytes"] > 1334.0 + 65536.0, "{got:?}");
    // Two listeners' backlogs and the unsent data.
    assert!(got["tx_queued_bytes"] > 65536.0, "{got:?}");
}

/// `udp_queues` reads inet_diag on a real procfs: its sums equal those of
/// the /proc/net/udp{,6} files node_exporter reads, with unread datagrams
/// queued on sockets of both families (and sockets with nothing queued).
#[test]
fn udp_queues_over_inet_diag_equal_proc_net_udp() {
    if !node_agent_tests::host::root_or_skip("udp_queues truth tests") {
        return;
    }
    let ns = Netns::new("udpq");
    ns.ip(&["link", "set", "lo", "up"]);
    let (got, files, want_rx) = ns.run(|paths| {
        let mut socks = Vec::new();
        let mut want_rx = [0usize; 2];
        for (i, (bind, n)) in [("127.0.0.1:0", 3), ("127.0.0.1:0", 0), ("[::1]:0", 5), ("[::1]:0", 1)].into_iter().enumerate() {
            let r = UdpSocket::bind(bind).expect("bind");
            let s = UdpSocket::bind(if bind.starts_with('[') { "[::1]:0" } else { "127.0.0.1:0" }).expect("bind sender");
            for k in 0..n {
                s.send_to(&vec![k as u8; 100 + 10 * k], r.local_addr().unwrap()).expect("send");
            }
            want_rx[i / 2] += n;
            socks.push((r, s));
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut c = udp_queues::Collector::new(paths);
        let got = collect(&mut c);
        let mut files = BTreeMap::new();
        for (ip, f) in [("v4", "net/udp"), ("v6", "net/udp6")] {
            let text = std::fs::read(paths.proc(f)).expect("read /proc/net/udp");
            let (tx, rx) = udp_queues::parse(&text).expect("parse");
            files.insert((ip.to_string(), "rx".to_string()), rx as f64);
            files.insert((ip.to_string(), "tx".to_string()), tx as f64);
        }
        drop(socks);
        (got, files, want_rx)
    });
    let got: BTreeMap<(String, String), f64> = got
        .into_iter()
        .map(|((name, labels), v)| {
            assert_eq!(name, "node_udp_queues");
            let l = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).expect("label");
            ((l("ip"), l("queue")), v)
        })
        .collect();
    assert_eq!(got, files, "inet_diag sums vs /proc/net/udp{{,6}}");
    // Each queued datagram holds its buffer (more than its payload).
    for (i, ip) in ["v4", "v6"].iter().enumerate() {
        let rx = got[&(ip.to_string(), "rx".to_string())];
        assert!(rx >= (want_rx[i] * 100) as f64, "{ip}: rx {rx} for {} datagrams", want_rx[i]);
    }
}

/// node_exporter's metric-name rules (`SanitizeMetricName`,
/// `buildEthtoolFQName`, its pre-made `_total` descriptors), with the
/// regular expressions it uses.
fn ne_stat_family(stat: &str) -> String {
    let san = Regex::new(r"_*[^0-9A-Za-z_]+_*").unwrap();
    let sanitized = san.replace_all(stat, "_").to_string();
    let known = [
        ("rx_bytes", "node_ethtool_received_bytes_total"),
        ("rx_dropped", "node_ethtool_received_dropped_total"),
        ("rx_errors", "node_ethtool_received_errors_total"),
        ("rx_packets", "node_ethtool_received_packets_total"),
        ("tx_bytes", "node_ethtool_transmitted_bytes_total"),
        ("tx_errors", "node_ethtool_transmitted_errors_total"),
        ("tx_packets", "node_ethtool_transmitted_packets_total"),
    ];
    if let Some((_, name)) = known.iter().find(|(k, _)| *k == sanitized) {
        return name.to_string();
    }
    let lower = sanitized.to_lowercase();
    let name = lower.trim_start_matches('_');
    let name = Regex::new(r"(^|_)rx(_|$)").unwrap().replace_all(name, "${1}received${2}").to_string();
    let name = Regex::new(r"(^|_)tx(_|$)").unwrap().replace_all(&name, "${1}transmitted${2}").to_string();
    format!("node_ethtool_{name}")
}

/// `ethtool -S dev` → node_exporter's statistic series (none when ethtool
/// finds no statistics).
fn stats_truth(ns: &Netns, dev: &str, out: &mut Series) {
    let (ok, text) = in_ns(ns, "ethtool", &["-S", dev]);
    if !ok {
        return;
    }
    for line in text.lines().skip_while(|l| !l.starts_with("NIC statistics:")).skip(1) {
        let (name, value) = line.trim().rsplit_once(": ").unwrap_or_else(|| panic!("ethtool -S line {line:?}"));
        let labels = vec![("device".to_string(), dev.to_string())];
        out.insert((ne_stat_family(name), labels), value.parse().expect("value"));
    }
}

/// `ethtool -i dev` → `node_ethtool_info`.
fn info_truth(ns: &Netns, dev: &str, out: &mut Series) {
    let (ok, text) = in_ns(ns, "ethtool", &["-i", dev]);
    if !ok {
        return;
    }
    let field = |k: &str| {
        text.lines().find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix(':'))).map(|v| v.trim().to_string()).unwrap_or_default()
    };
    let labels = vec![
        ("bus_info".to_string(), field("bus-info")),
        ("device".to_string(), dev.to_string()),
        ("driver".to_string(), field("driver")),
        ("expansion_rom_version".to_string(), field("expansion-rom-version")),
        ("firmware_version".to_string(), field("firmware-version")),
        ("version".to_string(), field("version")),
    ];
    out.insert(("node_ethtool_info".to_string(), labels), 1.0);
}

/// `ethtool dev` → node_exporter's link series, decoded as node_exporter's
/// test fake (`EthtoolFixture.LinkInfo`) decodes that text; none when
/// ethtool reports no link modes.
fn link_truth(ns: &Netns, dev: &str, out: &mut Series) {
    let (_, text) = in_ns(ns, "ethtool", &[dev]);
    if !text.contains("Supported link modes:") {
        return;
    }
    let modes = |s: &str| -> u32 {
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
    };
    let (mut supported, mut advertising, mut autoneg) = (0u32, 0u32, 0.0);
    let (mut in_sup, mut in_adv) = (false, false);
    for line in text.lines().filter(|l| !l.starts_with("Settings for")) {
        let line = line.trim_matches([' ', '\t']);
        if (in_sup || in_adv) && line.contains(':') {
            (in_sup, in_adv) = (false, false);
        }
        if in_adv {
            advertising |= modes(line);
            continue;
        } else if in_sup {
            supported |= modes(line);
            continue;
        }
        let (k, v) = line.split_once(": ").unwrap_or((line, ""));
        match (k, v.trim()) {
            ("Supported pause frame use", "Symmetric") => supported |= 1 << 13,
            ("Supported pause frame use", "Receive-only") => supported |= 1 << 14,
            ("Advertised pause frame use", "Symmetric") => advertising |= 1 << 13,
            ("Advertised pause frame use", "Receive-only") => advertising |= 1 << 14,
            ("Supported ports", ports) => {
                for p in ports.split(' ').map(|p| p.trim_matches([' ', '\t'])) {
                    match p {
                        "TP" => supported |= 1 << 7,
                        "MII" => supported |= 1 << 9,
                        "FIBRE" => supported |= 1 << 10,
                        _ => {}
                    }
                }
            }
            ("Supported link modes", v) => {
                supported |= modes(v);
                in_sup = true;
            }
            ("Advertised link modes", v) => {
                advertising |= modes(v);
                in_adv = true;
            }
            ("Supports auto-negotiation", "Yes") => supported |= 1 << 6,
            ("Advertised auto-negotiation", "Yes") => advertising |= 1 << 6,
            ("Auto-negotiation", "on") => autoneg = 1.0,
            _ => {}
        }
    }
    let dev_l = || vec![("device".to_string(), dev.to_string())];
    let bit = |m: u32, b: u32| if m & (1 << b) != 0 { 1.0 } else { 0.0 };
    let speeds =
        [(0, 10, "half"), (1, 10, "full"), (2, 100, "half"), (3, 100, "full"), (4, 1000, "half"), (5, 1000, "full"), (12, 10000, "full")];
    for (prefix, mask) in [("supported", supported), ("advertised", advertising)] {
        for (b, mbps, duplex) in speeds {
            if mask & (1 << b) != 0 {
                let labels = vec![
                    ("device".to_string(), dev.to_string()),
                    ("duplex".to_string(), duplex.to_string()),
                    ("mode".to_string(), format!("{mbps}baseT")),
                ];
                out.insert((format!("node_network_{prefix}_speed_bytes"), labels), f64::from(mbps) * 125000.0);
            }
        }
        out.insert((format!("node_network_autonegotiate_{prefix}"), dev_l()), bit(mask, 6));
        out.insert((format!("node_network_pause_{prefix}"), dev_l()), bit(mask, 13));
        out.insert((format!("node_network_asymmetricpause_{prefix}"), dev_l()), bit(mask, 14));
    }
    for (ty, b) in [("TP", 7), ("MII", 9), ("FIBRE", 10)] {
        if supported & (1 << b) != 0 {
            out.insert(("node_network_supported_port_info".into(), vec![("device".into(), dev.into()), ("type".into(), ty.into())]), 1.0);
        }
    }
    out.insert(("node_network_autonegotiate".into(), dev_l()), autoneg);
}

fn tc(ns: &Netns, args: &str) {
    let mut v = vec!["-n", ns.0.as_str()];
    v.extend(args.split(' '));
    let out = Command::new("tc").args(&v).output().expect("run tc (iproute2)");
    assert!(out.status.success(), "tc {v:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn options(exclude: Option<&str>, include: Option<&str>, metrics: Option<&str>) -> ethtool::Options {
    let re = |s: Option<&str>| s.map(|s| Regex::new(s).unwrap());
    ethtool::Options { filter: DeviceFilter::new(re(exclude), re(include)), metrics: re(metrics) }
}

#[test]
fn ethtool_stats_info_and_link_settings_equal_ethtool() {
    if !node_agent_tests::host::root_or_skip("ethtool truth tests") {
        return;
    }
    let a = Netns::new("etha");
    let b = Netns::new("ethb");
    // No IPv6 chatter (router solicitations, MLD) moving counters between
    // the collector's reading and ethtool's.
    for ns in [&a, &b] {
        for key in ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"] {
            assert!(in_ns(ns, "sysctl", &["-qw", key]).0, "sysctl {key}");
        }
    }
    a.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b.0]);
    a.ip(&["link", "add", "ifb0", "type", "ifb"]);
    a.batch("addr add 10.9.2.1/24 dev va\nlink set va up\nlink set lo up\nlink set ifb0 up\n");
    b.batch("addr add 10.9.2.2/24 dev vb\nlink set vb up\n");
    // va's ingress goes through ifb0 (which counts it) and back.
    tc(&a, "qdisc add dev va handle ffff: ingress");
    tc(&a, "filter add dev va parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev ifb0");
    const PACKETS: usize = 200;
    b.run(|_| {
        let tx = UdpSocket::bind("10.9.2.2:0").expect("bind");
        for _ in 0..PACKETS {
            tx.send_to(&[1u8; 200], "10.9.2.1:9").expect("send");
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let sys = tempfile::tempdir().expect("tempdir");
    let (all, filtered, excluded) = a.run(|paths| {
        let _mount = SysfsMount::new(sys.path());
        let p = Paths { sysfs: sys.path().to_path_buf(), ..paths.clone() };
        let run = |o: ethtool::Options| collect(&mut ethtool::Collector::new(o, &p).expect("collector"));
        (run(options(None, None, None)), run(options(None, Some("^va$"), Some("peer"))), run(options(Some("."), None, None)))
    });

    let mut want = BTreeMap::new();
    for dev in ["ifb0", "lo", "va"] {
        stats_truth(&a, dev, &mut want);
        info_truth(&a, dev, &mut want);
        link_truth(&a, dev, &mut want);
    }
    assert_eq!(all, want, "collector vs ethtool -S / -i / ethtool");

    // What the truth holds: veth's and ifb's driver statistics, info,
    // veth's link settings; nothing for lo (EOPNOTSUPP).
    let dev = |d: &str| vec![("device".to_string(), d.to_string())];
    assert!(all.keys().all(|(_, l)| !l.iter().any(|(k, v)| k == "device" && v == "lo")), "lo has no series");
    let peer: f64 = {
        let out = Command::new("ip").args(["-n", &b.0, "-o", "link", "show", "vb"]).output().expect("ip link");
        String::from_utf8_lossy(&out.stdout).split(':').next().unwrap().trim().parse().unwrap()
    };
    assert_eq!(all[&("node_ethtool_peer_ifindex".to_string(), dev("va"))], peer);
    let rx = all[&("node_ethtool_received_queue_0_packets".to_string(), dev("ifb0"))];
    let rx_bytes = all[&("node_ethtool_received_queue_0_bytes".to_string(), dev("ifb0"))];
    assert!(rx >= PACKETS as f64, "ifb0 saw the datagrams: {rx}");
    assert!(rx_bytes >= (PACKETS * (200 + 8 + 20)) as f64, "{rx_bytes}");
    assert!(all[&("node_ethtool_transmitted_queue_0_packets".to_string(), dev("ifb0"))] >= PACKETS as f64);
    let info = all.keys().find(|(n, l)| n == "node_ethtool_info" && l[1].1 == "va").expect("va info");
    assert_eq!(info.1[2], ("driver".to_string(), "veth".to_string()));
    assert_eq!(all[&("node_network_autonegotiate".to_string(), dev("va"))], 0.0);

    // device-include and metrics-include: va's info, link settings and
    // its one statistic matching "peer".
    let want_filtered: Series = all
        .iter()
        .filter(|((n, l), _)| {
            l.iter().any(|(k, v)| k == "device" && v == "va")
                && (n == "node_ethtool_info" || n.starts_with("node_network_") || n == "node_ethtool_peer_ifindex")
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(filtered, want_filtered);
    assert!(excluded.is_empty(), "device-exclude . leaves nothing: {excluded:?}");
}
