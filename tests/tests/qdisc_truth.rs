//! The netlink paths of the qdisc and network_route collectors against
//! ground truth, in network namespaces of the test's own: a veth pair with
//! an htb root qdisc (and a pfifo child, which is not reported) carrying
//! the test's own datagrams, compared with `tc -s -j qdisc show`; and
//! routes added with iproute2 (plain, multipath, a duplicate in another
//! table, a blackhole, IPv6), compared with `ip -j route show table all`.
//! Needs root (in CI it runs, never skips).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use expo::Sink;
use host::collector::{network_route, qdisc};
use host::filter::DeviceFilter;
use host::Collector;
use node_agent_tests::netns::Netns;
use serde_json::Value;

type Labels = Vec<(String, String)>;

fn collect(c: &mut dyn Collector) -> Vec<(String, Labels, f64)> {
    let mut sink = Sink::new();
    c.update(&mut sink).expect("collector succeeds");
    let mut out = Vec::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            out.push((f.name().to_string(), labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), v));
        }
    }
    out
}

fn json(cmd: &str, args: &[&str]) -> Value {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{cmd} {args:?}: not JSON: {e}"))
}

fn tc(ns: &Netns, args: &[&str]) {
    let mut v = vec!["-n", &ns.0];
    v.extend_from_slice(args);
    let out = Command::new("tc").args(&v).output().expect("run tc (iproute2)");
    assert!(out.status.success(), "tc {v:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces joined by a veth pair: `va` 10.9.0.1 in the first, `vb`
/// 10.9.0.2 in the second.
fn pair(tag: &str) -> (Netns, Netns) {
    let a = Netns::new(&format!("{tag}a"));
    let b = Netns::new(&format!("{tag}b"));
    a.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b.0]);
    a.batch("addr add 10.9.0.1/24 dev va\naddr add 2001:db8::1/64 dev va nodad\nlink set va up\nlink set lo up\n");
    b.batch("addr add 10.9.0.2/24 dev vb\nlink set vb up\n");
    (a, b)
}

#[test]
fn qdisc_counters_equal_tc_and_the_traffic_sent() {
    if !node_agent_tests::host::root_or_skip("qdisc truth tests") {
        return;
    }
    let (a, _b) = pair("qd");
    tc(&a, &["qdisc", "add", "dev", "va", "root", "handle", "1:", "htb", "default", "10"]);
    tc(&a, &["class", "add", "dev", "va", "parent", "1:", "classid", "1:10", "htb", "rate", "100mbit", "quantum", "1514"]);
    tc(&a, &["qdisc", "add", "dev", "va", "parent", "1:10", "handle", "10:", "pfifo", "limit", "1000"]);
    const PACKETS: usize = 300;
    a.run(|_| {
        let tx = std::net::UdpSocket::bind("10.9.0.1:0").expect("bind");
        for _ in 0..PACKETS {
            tx.send_to(&[1u8; 200], "10.9.0.2:9").expect("send");
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The kernel sends packets of its own on a link just brought up (IPv6
    // router solicitations and MLD reports, for a few seconds), so tc is
    // read before and after the scrape, and a scrape is compared only when
    // the two readings agree: then nothing moved while it ran.
    let tc_roots = || -> Vec<Value> {
        let truth = json("tc", &["-n", &a.0, "-s", "-j", "qdisc", "show"]);
        truth.as_array().expect("array").iter().filter(|q| q["root"] == Value::Bool(true)).cloned().collect()
    };
    let (got, roots) = (0..20)
        .find_map(|_| {
            let before = tc_roots();
            let got = a.run(|paths| {
                let o = qdisc::Options { fixtures: None, filter: DeviceFilter::new(None, None) };
                collect(&mut qdisc::Collector::new(o, paths).expect("collector"))
            });
            let after = tc_roots();
            if before == after {
                return Some((got, after));
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
            None
        })
        .expect("the qdisc counters stood still across one of 20 scrapes");
    let truth = Value::Array(roots.clone());
    let fields = [
        ("node_qdisc_bytes_total", "bytes"),
        ("node_qdisc_packets_total", "packets"),
        ("node_qdisc_drops_total", "drops"),
        ("node_qdisc_requeues_total", "requeues"),
        ("node_qdisc_overlimits_total", "overlimits"),
        ("node_qdisc_current_queue_length", "qlen"),
        ("node_qdisc_backlog", "backlog"),
    ];
    let mut want = BTreeMap::new();
    for q in &roots {
        let labels = vec![
            ("device".to_string(), q["dev"].as_str().expect("dev").to_string()),
            ("kind".to_string(), q["kind"].as_str().expect("kind").to_string()),
        ];
        for (family, key) in fields {
            want.insert((family.to_string(), labels.clone()), q[key].as_f64().unwrap_or_else(|| panic!("{key} in {q}")));
        }
    }
    let got: BTreeMap<_, _> = got.into_iter().map(|(n, l, v)| ((n, l), v)).collect();
    assert_eq!(got, want, "tc: {truth}");
    // The htb root of va carried the datagrams (and ARP); its pfifo child
    // is not reported; lo's root is noqueue.
    let va = |f: &str| got[&(f.to_string(), vec![("device".into(), "va".into()), ("kind".into(), "htb".into())])];
    assert!(va("node_qdisc_packets_total") >= PACKETS as f64);
    assert!(va("node_qdisc_bytes_total") >= (PACKETS * (200 + 8 + 20 + 14)) as f64);
    assert!(got.keys().all(|(_, l)| l[1].1 != "pfifo"));
    assert!(got
        .contains_key(&("node_qdisc_packets_total".to_string(), vec![("device".into(), "lo".into()), ("kind".into(), "noqueue".into())])));
}

/// node_exporter's label set of one `ip -j route` entry (or next hop).
fn route_labels(r: &Value, hop: Option<&Value>, v6: bool) -> Labels {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let dst = s(r, "dst");
    let dest = if dst == "default" || dst.contains('/') { dst } else { format!("{dst}/{}", if v6 { 128 } else { 32 }) };
    let via = hop.unwrap_or(r);
    vec![
        ("dest".into(), dest),
        ("device".into(), s(via, "dev")),
        ("gw".into(), s(via, "gateway")),
        ("priority".into(), r.get("metric").and_then(Value::as_u64).unwrap_or(0).to_string()),
        // ip leaves out the protocol of routes it added itself (boot).
        ("proto".into(), r.get("protocol").and_then(Value::as_str).unwrap_or("boot").to_string()),
        ("src".into(), s(r, "prefsrc")),
        ("weight".into(), hop.map(|h| h["weight"].as_u64().expect("weight").to_string()).unwrap_or_default()),
    ]
}

#[test]
fn routes_equal_ip_route_show_table_all() {
    if !node_agent_tests::host::root_or_skip("network_route truth tests") {
        return;
    }
    let (a, _b) = pair("rt");
    a.batch(
        "route add 10.20.0.0/16 via 10.9.0.2 metric 50 proto bird\n\
         route add 10.20.0.0/16 via 10.9.0.2 metric 50 proto bird table 100\n\
         route add 10.30.0.0/16 proto static nexthop via 10.9.0.2 weight 3 nexthop via 10.9.0.3 weight 1\n\
         route add blackhole 10.40.0.0/16\n\
         route add default via 10.9.0.254 proto boot\n\
         route add 2001:db8:5::/48 via 2001:db8::2 metric 7\n",
    );
    let got = a.run(|paths| collect(&mut network_route::Collector::new(paths)));

    let mut want_info = BTreeSet::new();
    let mut want_count: BTreeMap<String, f64> = BTreeMap::new();
    for (flag, v6) in [("-4", false), ("-6", true)] {
        let truth = json("ip", &["-n", &a.0, "-j", flag, "route", "show", "table", "all"]);
        for r in truth.as_array().expect("array") {
            if r.get("type").and_then(Value::as_str).is_some_and(|t| t != "unicast") {
                continue;
            }
            let series: Vec<Labels> = match r.get("nexthops").and_then(Value::as_array) {
                Some(hops) => hops.iter().map(|h| route_labels(r, Some(h), v6)).collect(),
                None => vec![route_labels(r, None, v6)],
            };
            for l in series {
                *want_count.entry(l[1].1.clone()).or_default() += 1.0;
                want_info.insert(l);
            }
        }
    }
    let info: Vec<Labels> = got.iter().filter(|(n, _, _)| n == "node_network_route_info").map(|(_, l, _)| l.clone()).collect();
    let got_info: BTreeSet<Labels> = info.iter().cloned().collect();
    assert_eq!(info.len(), got_info.len(), "no repeated series");
    assert_eq!(got_info, want_info);
    let got_count: BTreeMap<String, f64> =
        got.iter().filter(|(n, _, _)| n == "node_network_routes").map(|(_, l, v)| (l[0].1.clone(), *v)).collect();
    assert_eq!(got_count, want_count);
    // The duplicate in table 100 is counted but exposed once; the
    // multipath route is one series per next hop.
    let weights: BTreeSet<&str> = info.iter().filter(|l| l[0].1 == "10.30.0.0/16").map(|l| l[6].1.as_str()).collect();
    assert_eq!(weights, ["1", "3"].into());
    assert!(got_info.iter().any(|l| l[0].1 == "default" && l[4].1 == "boot" && l[2].1 == "10.9.0.254"));
    assert!(got_info.iter().any(|l| l[0].1 == "2001:db8:5::/48" && l[2].1 == "2001:db8::2" && l[3].1 == "7"));
    assert!(!got_info.iter().any(|l| l[0].1 == "10.40.0.0/16"));
}
