//! `ebpf_dns` truth test (#36): two pods of this node, their cgroups made
//! by the test with kubelet-style paths, served by an in-memory API server
//! with the Service kube-system/kube-dns; both run in one network
//! namespace of the test's own: pod A (10.77.0.1) is the client, pod B
//! (10.77.0.2) a DNS server written here that answers by the query's first
//! label (NOERROR, NXDOMAIN, SERVFAIL, REFUSED, truncated, 20 ms late, never,
//! or only when the test says so), on its own address and on the Service's
//! ClusterIP 10.96.0.10 (on loopback, as kube-proxy's IPVS mode puts it).
//!
//! The agent's counts for pod A (only the test's own cgroups, so exact on a
//! busy node) are checked against the queries the client made and the
//! answers it received: queries by type, responses by rcode, truncated,
//! retransmitted, timed out, late, the latency of the 20 ms answers, the
//! Service's name, and the bound on servers per pod.
//!
//! Root only (CAP_BPF, CAP_NET_ADMIN, cgroups, network namespaces); outside
//! CI without root it skips with a message, in CI it must run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use node_agent_tests::apiserver::{Api, Running};
use node_agent_tests::host::root_or_skip;
use node_agent_tests::inproc::InProcess;
use node_agent_tests::netns::Netns;
use node_agent_tests::pods::{pod_cgroup, CID_A, CID_B, NODE, UID_A, UID_B};

/// Pod B: a DNS server on UDP port 53 of 10.77.0.2, 10.96.0.10 and
/// 10.78.0.1-10. It answers a query by its name's first label: `ok` NOERROR,
/// `nx` NXDOMAIN, `fail` SERVFAIL, `ref` REFUSED, `tc` NOERROR truncated,
/// `slow` NOERROR after 20 ms, `drop` never, `held` when its stdin says
/// `release`; and on TCP port 53 of 10.77.0.2, one query per connection.
/// Prints "ready".
const SERVER: &str = r#"
import socket, struct, sys, threading, time
held = []
lock = threading.Lock()
def response(q):
    qid, flags = struct.unpack(">HH", q[:4])
    label = q[13:13 + q[12]].decode()
    rcode = {"nx": 3, "fail": 2, "ref": 5}.get(label, 0)
    out = 0x8000 | (flags & 0x0100) | rcode | (0x0200 if label == "tc" else 0)
    return struct.pack(">HHHHHH", qid, out, 1, 0, 0, 0) + q[12:]
def answer(s, q, peer):
    s.sendto(response(q), peer)
def serve_tcp():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("10.77.0.2", 53))
    l.listen(16)
    while True:
        c, _ = l.accept()
        f = c.makefile("rb")
        n = struct.unpack(">H", f.read(2))[0]
        a = response(f.read(n))
        c.sendall(struct.pack(">H", len(a)) + a)
        f.close()
        c.close()
def serve(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(512)
        label = q[13:13 + q[12]].decode()
        if label == "drop":
            continue
        if label == "held":
            with lock:
                held.append((s, q, peer))
            continue
        if label == "slow":
            threading.Timer(0.02, answer, (s, q, peer)).start()
            continue
        answer(s, q, peer)
for a in ["10.77.0.2", "10.96.0.10"] + ["10.78.0.%d" % i for i in range(1, 11)]:
    threading.Thread(target=serve, args=(a,), daemon=True).start()
threading.Thread(target=serve_tcp, daemon=True).start()
time.sleep(0.2)
print("ready", flush=True)
for line in sys.stdin:
    with lock:
        for h in held:
            answer(*h)
        held.clear()
    print("released", flush=True)
"#;

/// Pod A: for each `server name qtype repeat` of argv[1] (`;`-separated),
/// one query from a new socket bound to 10.77.0.1 (sent twice with the same
/// id when `repeat` is 1; over TCP when the server is `tcp:ADDRESS`),
/// waiting up to `argv[2]` seconds for the answer.
/// Prints JSON: answers by rcode, truncated answers, queries unanswered,
/// and the microseconds each `slow` query took.
const CLIENT: &str = r#"
import json, random, socket, struct, sys, time
rcodes, tc, unanswered, slow = {}, 0, 0, []
for item in sys.argv[1].split(";"):
    server, name, qtype, repeat = item.split()
    tcp = server.startswith("tcp:")
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM)
    s.bind(("10.77.0.1", 0))
    s.connect((server.removeprefix("tcp:"), 53))
    s.settimeout(float(sys.argv[2]))
    q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", int(qtype), 1)
    t = time.monotonic()
    s.send(struct.pack(">H", len(q)) + q if tcp else q)
    if repeat == "1":
        s.send(q)
    try:
        if tcp:
            f = s.makefile("rb")
            a = f.read(struct.unpack(">H", f.read(2))[0])
            f.close()
        else:
            a = s.recv(512)
        flags = struct.unpack(">H", a[2:4])[0]
        rcodes[flags & 15] = rcodes.get(flags & 15, 0) + 1
        tc += 1 if flags & 0x0200 else 0
        if name.startswith("slow."):
            slow.append(int((time.monotonic() - t) * 1e6))
    except socket.timeout:
        unanswered += 1
    s.close()
print(json.dumps({"rcodes": rcodes, "tc": tc, "unanswered": unanswered, "slow": slow}), flush=True)
"#;

fn api() -> std::sync::Arc<Api> {
    node_agent_tests::pods::api_with_addresses(
        &[(UID_A, "web", "web-0", "app", CID_A, "10.77.0.1"), (UID_B, "kube-system", "coredns-0", "coredns", CID_B, "10.77.0.2")],
        &[("kube-system", "kube-dns", "10.96.0.10", 53, "UDP")],
    )
}

struct Agent(InProcess);

impl Agent {
    fn new(c: &Running) -> Agent {
        let a = Agent(InProcess::start(
            &[
                "--collector.disable-defaults".into(),
                "--collector.ebpf_pods".into(),
                "--collector.ebpf_dns".into(),
                "--collector.ebpf_dns.timeout=1s".into(),
                "--collector.ebpf_dns.max-servers=3".into(),
                "--collector.ebpf_dns.failing-domains=2".into(),
                format!("--collector.ebpf_pods.kubeconfig={}", c.kubeconfig.path().display()),
                format!("--collector.ebpf_pods.node-name={NODE}"),
            ],
            &["ebpf_pods", "ebpf_dns"],
        ));
        a.0.assert_up(&["dns_egress", "dns_ingress"], "they need CAP_NET_ADMIN and a cgroup v2 hierarchy");
        a.0.wait_for_pods_and_services("node_ebpf_dns_tracked", 1.0);
        a
    }

    fn samples(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.0.samples(name)
    }

    /// Pod web-0's series of `name`, by "server_kind server[ qtype|rcode]",
    /// non-zero ones only.
    fn client(&self, name: &str) -> BTreeMap<String, f64> {
        self.samples(name)
            .into_iter()
            .filter(|(l, v)| l.get("pod").map(String::as_str) == Some("web-0") && *v != 0.0)
            .map(|(l, v)| {
                let g = |k: &str| l.get(k).cloned().unwrap_or_default();
                assert_eq!(g("namespace"), "web");
                let mut key = format!("{} {}", g("server_kind"), g("server"));
                if g("transport") != "udp" {
                    key.push(' ');
                    key.push_str(&g("transport"));
                }
                for extra in ["qtype", "rcode"] {
                    if let Some(x) = l.get(extra) {
                        key.push(' ');
                        key.push_str(x);
                    }
                }
                (key, v)
            })
            .collect()
    }
}

/// What the client saw.
#[derive(Debug)]
struct Seen {
    rcodes: BTreeMap<String, f64>,
    tc: f64,
    unanswered: f64,
    slow: Vec<u64>,
}

impl Seen {
    fn parse(out: &[u8]) -> Seen {
        let v: serde_json::Value = serde_json::from_slice(out).expect("the client's JSON");
        let rcodes = v["rcodes"].as_object().expect("rcodes").iter().map(|(k, n)| (k.clone(), n.as_f64().unwrap_or(0.0))).collect();
        let slow = v["slow"].as_array().expect("slow").iter().filter_map(|x| x.as_u64()).collect();
        Seen { rcodes, tc: v["tc"].as_f64().unwrap_or(-1.0), unanswered: v["unanswered"].as_f64().unwrap_or(-1.0), slow }
    }
}

fn run_client(a: &node_agent_tests::pods::PodCgroup, ns: &Netns, script: &std::path::Path, plan: &[String], wait: f64) -> Seen {
    let out = a
        .command(&format!("ip netns exec {} python3 {} '{}' {wait}", ns.0, script.display(), plan.join(";")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("client");
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
    Seen::parse(&out.stdout)
}

/// `n` queries of `name` and `qtype` to `server`.
fn queries(n: usize, server: &str, name: &str, qtype: u16, repeat: bool) -> Vec<String> {
    (0..n).map(|_| format!("{server} {name} {qtype} {}", u8::from(repeat))).collect()
}

/// The tests share pods A and B's cgroups: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn queries_answers_timeouts_and_servers_are_the_pods_own() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new("dns");
    ns.batch(
        "link set lo up\naddr add 10.77.0.1/32 dev lo\naddr add 10.77.0.2/32 dev lo\naddr add 10.96.0.10/32 dev lo\n\
         route add local 10.78.0.0/24 dev lo\n",
    );
    let cluster = Running::start(api()).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SERVER).expect("server script");
    std::fs::write(&client_py, CLIENT).expect("client script");
    let mut server = b
        .command(&format!("ip netns exec {} python3 {}", ns.0, server_py.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("server");
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));

    // Phase 1: the pod coredns-0 by its address, every kind of answer.
    let pod = "10.77.0.2";
    let mut plan = Vec::new();
    plan.extend(queries(3, pod, "ok.test", 1, false));
    plan.extend(queries(2, pod, "ok.test", 28, false));
    plan.extend(queries(1, pod, "_x._tcp.ok.test", 33, false));
    plan.extend(queries(1, pod, "ok.in-addr.arpa", 12, false));
    plan.extend(queries(1, pod, "ok.test", 15, false));
    plan.extend(queries(2, pod, "nx.test", 1, false));
    plan.extend(queries(1, pod, "nx.one.test", 1, false));
    plan.extend(queries(1, pod, "nx.two.test", 1, false));
    plan.extend(queries(2, pod, "fail.test", 1, false));
    plan.extend(queries(1, pod, "ref.test", 28, false));
    plan.extend(queries(1, pod, "tc.test", 1, false));
    plan.extend(queries(4, pod, "slow.test", 1, false));
    plan.extend(queries(2, pod, "drop.test", 1, false));
    plan.extend(queries(1, pod, "drop.test", 28, true));
    let phase1 = plan.len() as f64;
    let seen = run_client(&a, &ns, &client_py, &plan, 0.3);
    eprintln!("phase 1, the client saw {seen:?}");
    assert_eq!(seen.unanswered, 3.0, "the client's own count");
    assert_eq!(seen.tc, 1.0);
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    let r = agent.client("node_ebpf_pod_dns_responses_total");
    eprintln!("phase 1, web-0: queries {q:?}\nresponses {r:?}");
    let p = "pod kube-system/coredns-0";
    let want_q: BTreeMap<String, f64> =
        [("A", 3.0 + 4.0 + 2.0 + 1.0 + 4.0 + 2.0), ("AAAA", 2.0 + 1.0 + 1.0), ("SRV", 1.0), ("PTR", 1.0), ("other", 1.0)]
            .into_iter()
            .map(|(t, n)| (format!("{p} {t}"), n))
            .collect();
    assert_eq!(q, want_q, "queries by type (the retransmit not among them)");
    let name = |code: &str| match code {
        "0" => "NOERROR",
        "3" => "NXDOMAIN",
        "2" => "SERVFAIL",
        "5" => "REFUSED",
        _ => "other",
    };
    let want_r: BTreeMap<String, f64> = seen.rcodes.iter().map(|(c, n)| (format!("{p} {}", name(c)), *n)).collect();
    assert_eq!(r, want_r, "responses by rcode: what the client received");
    assert_eq!(r.get(&format!("{p} NOERROR")), Some(&(3.0 + 2.0 + 1.0 + 1.0 + 1.0 + 1.0 + 4.0)));
    assert_eq!(r.get(&format!("{p} NXDOMAIN")), Some(&4.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_truncated_total").get(p), Some(&1.0));
    // The failing answers by name: two names per rcode, the busiest first,
    // the rest under domain="".
    let names: BTreeMap<String, f64> = agent
        .samples("node_ebpf_pod_dns_failing_domain_responses_total")
        .into_iter()
        .filter(|(l, _)| l.get("pod").map(String::as_str) == Some("web-0"))
        .map(|(l, v)| (format!("{} {}", l["rcode"], l["domain"]), v))
        .collect();
    let want: BTreeMap<String, f64> = [
        ("NXDOMAIN nx.test", 2.0),
        ("NXDOMAIN nx.one.test", 1.0),
        ("NXDOMAIN ", 1.0),
        ("SERVFAIL fail.test", 2.0),
        ("REFUSED ref.test", 1.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(names, want, "failing answers by name");
    assert_eq!(agent.client("node_ebpf_pod_dns_retransmits_total").get(p), Some(&1.0));
    let answered: f64 = seen.rcodes.values().sum();
    assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(p), Some(&answered), "one latency per answer");
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total").get(p), None);
    // The 20 ms answers: none in a bucket at or below 15.6 ms, and every
    // one the client timed under 31.25 ms in (15.6, 31.3] ms.
    let bucket = |le: &str| -> f64 {
        agent
            .samples("node_ebpf_pod_dns_latency_seconds_bucket")
            .into_iter()
            .filter(|(l, _)| l.get("pod").map(String::as_str) == Some("web-0") && l.get("le").map(String::as_str) == Some(le))
            .map(|s| s.1)
            .sum()
    };
    let quick = seen.slow.iter().filter(|us| **us < 31_250).count() as f64;
    let (fast, upto) = (bucket("0.015625"), bucket("0.03125"));
    assert!(fast <= answered - 4.0, "{fast} answers at or below 15.6 ms: the 20 ms ones are not among them");
    assert!(upto - fast >= quick, "{quick} slow answers the client timed under 31.25 ms, {} in (15.6, 31.3] ms", upto - fast);
    // Unanswered: timeouts once the timeout (1 s) has passed, found by a scrape.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(p), Some(&3.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(p), Some(&3.0), "counted once");

    // Phase 2: the Service by its ClusterIP; one answer held past the
    // timeout is a timeout, then a late response, counted once each.
    let client = a
        .command(&format!("ip netns exec {} python3 {} '10.96.0.10 held.test 1 0' 5", ns.0, client_py.display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    // Once the client has sent it (its start may take a while on a busy
    // machine) and a second has passed, a scrape finds it timed out.
    let svc = "service kube-system/kube-dns";
    let t = std::time::Instant::now();
    while !agent.client("node_ebpf_pod_dns_timeouts_total").contains_key(svc) {
        assert!(t.elapsed() < Duration::from_secs(15), "the held query never timed out");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(svc), Some(&1.0), "the held query timed out, once");
    writeln!(server.stdin.as_mut().expect("stdin"), "release").expect("release");
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("released"));
    let out = client.wait_with_output().expect("client");
    let seen = Seen::parse(&out.stdout);
    assert_eq!(seen.rcodes.get("0"), Some(&1.0), "the client got the held answer");
    let plan = queries(4, "10.96.0.10", "ok.test", 1, false);
    let seen = run_client(&a, &ns, &client_py, &plan, 1.0);
    assert_eq!(seen.rcodes.get("0"), Some(&4.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_queries_total").get(&format!("{svc} A")), Some(&5.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_responses_total").get(&format!("{svc} NOERROR")), Some(&5.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total").get(svc), Some(&1.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(svc), Some(&4.0), "the late answer has no latency");
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(svc), Some(&1.0));

    // Phase 3: over TCP, as after a truncated answer.
    let mut plan = queries(2, "tcp:10.77.0.2", "ok.test", 1, false);
    plan.extend(queries(1, "tcp:10.77.0.2", "nx.test", 28, false));
    let seen = run_client(&a, &ns, &client_py, &plan, 1.0);
    assert_eq!((seen.rcodes.get("0"), seen.rcodes.get("3")), (Some(&2.0), Some(&1.0)), "the client's own counts");
    let tcp = format!("{p} tcp");
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    assert_eq!((q.get(&format!("{tcp} A")), q.get(&format!("{tcp} AAAA"))), (Some(&2.0), Some(&1.0)), "{q:?}");
    let r = agent.client("node_ebpf_pod_dns_responses_total");
    assert_eq!((r.get(&format!("{tcp} NOERROR")), r.get(&format!("{tcp} NXDOMAIN"))), (Some(&2.0), Some(&1.0)), "{r:?}");
    assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(&tcp), Some(&3.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_retransmits_total").get(&tcp), None);

    // Phase 4: ten more servers; three per pod have series of their own.
    let plan: Vec<String> = (1..=10).map(|i| format!("10.78.0.{i} ok.test 1 0")).collect();
    let seen = run_client(&a, &ns, &client_py, &plan, 1.0);
    assert_eq!(seen.rcodes.get("0"), Some(&10.0));
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    eprintln!("phase 4, web-0: queries {q:?}");
    let servers: std::collections::BTreeSet<&str> =
        q.keys().filter(|k| !k.contains(" tcp ")).map(|k| k.rsplit_once(' ').map_or(k.as_str(), |x| x.0)).collect();
    assert!(servers.len() <= 4, "{} servers for web-0 with max-servers 3: {servers:?}", servers.len());
    assert!(servers.iter().any(|s| s.starts_with("other")), "no other series: {servers:?}");
    assert_eq!(q.values().sum::<f64>(), phase1 + 5.0 + 3.0 + 10.0, "every query, in some series");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::io::stdout().flush();
}

/// This process's cgroup v2 id (its directory's inode number).
fn own_cgroup() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let rel = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 line").trim_start_matches('/').to_string();
    std::fs::metadata(node_agent_tests::pods::v2_root().join(rel)).expect("this process's cgroup").ino()
}

/// The two programs see every packet of the node's sockets: whatever a
/// packet holds (DNS or not, whole or cut short, IPv4, IPv6, garbage),
/// they let it through (a cgroup skb program returning 0 drops it). Run
/// with BPF_PROG_TEST_RUN on made-up packets (an Ethernet header, then the
/// network one).
#[test]
fn every_packet_is_let_through() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    use aya::programs::{CgroupSkb, TestRun, TestRunOptions};
    let mut ctx = node_agent::probes::Context::with_object(node_agent::ebpf::OBJECT, false);
    // Counted by cgroup: the made-up packets' socket is the test-run's own,
    // of this process's cgroup, whose share of the maps the node's other
    // DNS traffic (another test's resolver) cannot take.
    ctx.kube = true;
    let cgroup = own_cgroup();
    let shared = ctx.ebpf().expect("the object loads");
    let probe = node_agent::ebpf::Probe::attach(Ok(shared.clone()), &agent_common::dns::PROGRAMS);
    assert!(probe.up(), "the DNS programs load and attach");
    let eth = |ethertype: [u8; 2]| -> Vec<u8> {
        let mut p = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        p.extend(ethertype);
        p
    };
    let dns = |response: bool| -> Vec<u8> {
        let mut d = vec![0x12, 0x34, if response { 0x81 } else { 0x01 }, if response { 0x83 } else { 0 }, 0, 1, 0, 0, 0, 0, 0, 0];
        d.extend([3, b'f', b'o', b'o', 0, 0, 1, 0, 1]);
        d
    };
    let ipv4 = |proto: u8, sport: u16, dport: u16, payload: &[u8]| -> Vec<u8> {
        let len = 20 + 8 + payload.len();
        let mut p = eth([0x08, 0x00]);
        p.extend([0x45, 0, (len >> 8) as u8, len as u8, 0, 0, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        p.extend(sport.to_be_bytes());
        p.extend(dport.to_be_bytes());
        p.extend([0, (8 + payload.len()) as u8, 0, 0]);
        p.extend(payload);
        p
    };
    let mut ipv6_query = eth([0x86, 0xdd]);
    let q = dns(false);
    ipv6_query.extend([0x60, 0, 0, 0, 0, (8 + q.len()) as u8, 17, 64]);
    ipv6_query.extend([0u8; 15].iter().chain(&[1u8]).chain(&[0u8; 15]).chain(&[2u8]));
    ipv6_query.extend(40000u16.to_be_bytes());
    ipv6_query.extend(53u16.to_be_bytes());
    ipv6_query.extend([0, (8 + q.len()) as u8, 0, 0]);
    ipv6_query.extend(&q);
    let mut cut = ipv4(17, 40000, 53, &dns(false));
    cut.truncate(14 + 20 + 8 + 5);
    let mut garbage = eth([0x08, 0x00]);
    garbage.extend((0..64u8).map(|i| i.wrapping_mul(37)));
    let mut labels = dns(false);
    labels.truncate(12);
    labels.extend(std::iter::repeat_n([63u8].into_iter().chain(std::iter::repeat_n(b'a', 63)), 8).flatten());
    let packets: Vec<(&str, Vec<u8>)> = vec![
        ("a query over UDP", ipv4(17, 40000, 53, &dns(false))),
        ("a response over UDP", ipv4(17, 53, 40000, &dns(true))),
        ("a query over IPv6", ipv6_query),
        ("a query cut short", cut),
        ("a name of 8 labels of 63 bytes, unterminated", ipv4(17, 40000, 53, &labels)),
        ("a datagram to another port", ipv4(17, 40000, 5353, &dns(false))),
        ("a TCP segment from port 53 without a payload", ipv4(6, 53, 40000, &[0x50, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
        ("garbage after an IPv4 ethertype", garbage),
    ];
    let mut ebpf = shared.lock().expect("eBPF");
    for name in ["dns_egress", "dns_ingress"] {
        let prog: &mut CgroupSkb = ebpf.program_mut(name).expect("program").try_into().expect("a cgroup skb program");
        for (what, packet) in &packets {
            let r = prog.test_run(TestRunOptions { data_in: Some(packet), repeat: 1, ..Default::default() }).expect("test run");
            assert_eq!(r.return_value, 1, "{name} on {what}: not let through");
        }
    }
    // And they read them: the query to 10.0.0.2 counted once as an A query
    // out (two more whose question cannot be read as other), the response from 10.0.0.1 once as an NXDOMAIN in (late: no
    // query waited for it on that socket).
    let stats: aya::maps::HashMap<_, agent_common::tcp_peers::PeerKey, agent_common::tcp_peers::PeerCounters> =
        aya::maps::HashMap::try_from(ebpf.map(agent_common::dns::STATS).expect("DNS_STATS")).expect("a hash map");
    let of = |last: u8| {
        stats
            .iter()
            .filter_map(Result::ok)
            .find(|(k, _)| k.cgroup == cgroup && k.addr[10..] == [0xff, 0xff, 10, 0, 0, last] && k.dir == agent_common::dns::TRANSPORT_UDP)
            .map(|(_, c)| c.words)
            .expect("counts for the address")
    };
    use agent_common::dns::{LATE, Q_A, Q_OTHER, R_NXDOMAIN};
    let (to, from) = (of(2), of(1));
    assert_eq!((to[Q_A], to[Q_OTHER]), (1, 2), "the query; the one cut short and the unterminated name, of no type read: {to:?}");
    assert_eq!((from[R_NXDOMAIN], from[LATE]), (1, 1), "{from:?}");
}

/// Pod B, the resolver, querying argv[1] servers, each another address of
/// 10.78.1.0-10.78.255.255 (nothing listens there), from 10.77.0.2; prints
/// the queries sent.
const NOISY: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.0.2", 0))
n = int(sys.argv[1])
for i in range(n):
    q = struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0) + b"\x05noisy\x04test\x00" + struct.pack(">HH", 1, 1)
    s.sendto(q, ("10.78.%d.%d" % (1 + i // 250, 1 + i % 250), 53))
print(n, flush=True)
"#;

/// A pod's series of `name`, summed.
fn pod_total(agent: &Agent, name: &str, pod: &str) -> f64 {
    agent.samples(name).into_iter().filter(|(l, _)| l.get("pod").map(String::as_str) == Some(pod)).map(|s| s.1).sum()
}

/// #47 row 12: a recursive resolver (pod B, coredns-0) meets 3,000 new DNS
/// servers at once, more than the node-wide map of (cgroup, server)
/// records holds; pod A then queries B. Every one of A's queries and
/// answers is counted, and every one of B's queries, those beyond its share
/// of the map in its `other`.
#[test]
fn a_noisy_resolver_does_not_blind_a_quiet_pod() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new("dnsnoisy");
    ns.batch(
        "link set lo up\naddr add 10.77.0.1/32 dev lo\naddr add 10.77.0.2/32 dev lo\naddr add 10.96.0.10/32 dev lo\n\
         route add local 10.78.0.0/16 dev lo\n",
    );
    let cluster = Running::start(api()).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py, noisy_py) = (dir.path().join("server.py"), dir.path().join("client.py"), dir.path().join("noisy.py"));
    std::fs::write(&server_py, SERVER).expect("server script");
    std::fs::write(&client_py, CLIENT).expect("client script");
    std::fs::write(&noisy_py, NOISY).expect("noisy script");
    let mut server = b
        .command(&format!("ip netns exec {} python3 {}", ns.0, server_py.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("server");
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let out = b.command(&format!("ip netns exec {} python3 {} 3000", ns.0, noisy_py.display())).output().expect("resolver");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3000", "{}", String::from_utf8_lossy(&out.stderr));
    let plan = queries(30, "10.77.0.2", "ok.test", 1, false);
    let seen = run_client(&a, &ns, &client_py, &plan, 1.0);
    assert_eq!(seen.rcodes.get("0"), Some(&30.0), "the client's own count");
    // The pods' cgroups are new to the agent: named at its next walk.
    std::thread::sleep(Duration::from_millis(1100));
    let p = "pod kube-system/coredns-0";
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    eprintln!("web-0: queries {q:?}");
    assert_eq!(q.get(&format!("{p} A")), Some(&30.0), "every query of the quiet pod");
    assert_eq!(agent.client("node_ebpf_pod_dns_responses_total").get(&format!("{p} NOERROR")), Some(&30.0), "and every answer");
    assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(p), Some(&30.0));
    let resolver = pod_total(&agent, "node_ebpf_pod_dns_queries_total", "coredns-0");
    let other: f64 = agent
        .samples("node_ebpf_pod_dns_queries_total")
        .into_iter()
        .filter(|(l, _)| l.get("pod").map(String::as_str) == Some("coredns-0") && l.get("server_kind").map(String::as_str) == Some("other"))
        .map(|s| s.1)
        .sum();
    eprintln!("coredns-0: {resolver} queries, {other} in other");
    assert_eq!(resolver, 3000.0, "every query of the resolver, in some series");
    let _ = server.kill();
    let _ = server.wait();
}

/// A resolver's rounds: from one socket on 10.0.0.1, in each of four
/// rounds, one A query to each of 256 servers (10.1.0.1-128, 10.1.1.1-128)
/// named `w<ms>r<round>n<i>`, then their 256 answers; then one query to
/// each of 44 servers more (10.2.0.1-44), where nothing answers. Prints
/// the answers received.
const ROUNDS: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.0.0.1", 0))
s.settimeout(10)
def query(qid, name, addr):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + bytes([len(name)]) + name + b"\x00" + struct.pack(">HH", 1, 1)
    s.sendto(q, (addr, 53))
answered = 0
for r, wait in enumerate([0, 20, 60, 140]):
    for i in range(256):
        query(r * 256 + i, b"w%dr%dn%d" % (wait, r, i), "10.1.%d.%d" % (i // 128, 1 + i % 128))
    for i in range(256):
        s.recvfrom(512)
        answered += 1
for i in range(44):
    query(5000 + i, b"x", "10.2.0.%d" % (1 + i))
print(answered, flush=True)
"#;

/// The rounds' servers: UDP port 53 of 10.1.0.1-128 and 10.1.1.1-128,
/// answering NXDOMAIN after the milliseconds the query's name says.
/// Prints "ready".
const ROUND_SERVERS: &str = r#"
import heapq, selectors, socket, struct, time
sel = selectors.DefaultSelector()
for i in range(256):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("10.1.%d.%d" % (i // 128, 1 + i % 128), 53))
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
due = []
print("ready", flush=True)
while True:
    for key, _ in sel.select(max(0, due[0][0] - time.monotonic()) if due else None):
        q, peer = key.fileobj.recvfrom(512)
        label = q[13:13 + q[12]]
        qid = struct.unpack(">H", q[:2])[0]
        a = struct.pack(">HHHHHH", qid, 0x8183, 1, 0, 0, 0) + q[12:]
        heapq.heappush(due, (time.monotonic() + int(label[1:label.index(b"r")]) / 1000, qid, key.fileobj, a, peer))
    while due and due[0][0] <= time.monotonic():
        _, _, s, a, peer = heapq.heappop(due)
        s.sendto(a, peer)
"#;

/// The per-cgroup bounds, in the kernel's maps (the test's own load of the
/// programs, attached to the node's cgroup v2 root, with attribution on and
/// failing names counted, read directly): a resolver in a cgroup of the
/// test's own asks 256 servers 4 times each, answered NXDOMAIN for a name
/// of its own after about 0, 20, 60 and 140 ms (4 latency buckets per
/// server), then 44 servers more. Its cgroup has records of its own for
/// 256 servers (an eighth of DNS_STATS), buckets of its own for 768 of its
/// peers' 1,024 (three quarters of its eighth of DNS_LAT) and 128 names
/// (an eighth of DNS_NAMES): every other query, latency and name is in its
/// other records, each record's buckets hold its own latencies, and the
/// totals are what was sent and answered. (Keys made by two CPUs at once
/// may pass a limit by one each.)
#[test]
fn a_cgroup_beyond_its_share_counts_in_its_other() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    use agent_common::dns::{NameKey, LAT, MATCHED, NAMES, Q_A, R_NXDOMAIN, STATS, TRANSPORT_UDP};
    use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};
    use std::os::unix::fs::MetadataExt;
    let mut ctx = node_agent::probes::Context::with_object(node_agent::ebpf::OBJECT, false);
    ctx.kube = true;
    ctx.dns_names = true;
    let shared = ctx.ebpf().expect("the object loads");
    let probe = node_agent::ebpf::Probe::attach(Ok(shared.clone()), &agent_common::dns::PROGRAMS);
    assert!(probe.up(), "the DNS programs load and attach");
    let ns = Netns::new("dnsshare");
    ns.batch("link set lo up\naddr add 10.0.0.1/32 dev lo\nroute add local 10.1.0.0/16 dev lo\nroute add local 10.2.0.0/16 dev lo\n");
    let mut made = Vec::new();
    let root = node_agent_tests::pods::v2_root();
    let v2 = node_agent_tests::pods::mkdirs(&root, &format!("na-truth-dnsshare-{}", std::process::id()), &mut made);
    // The kernel's cgroup id is its directory's inode number.
    let cgroup = std::fs::metadata(&v2).expect("the cgroup").ino();
    let resolver = node_agent_tests::pods::PodCgroup { made, v2, memory: None };
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("servers.py"), dir.path().join("rounds.py"));
    std::fs::write(&server_py, ROUND_SERVERS).expect("server script");
    std::fs::write(&client_py, ROUNDS).expect("client script");
    let mut server = resolver
        .command(&format!("ip netns exec {} python3 {}", ns.0, server_py.display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("servers");
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let out = resolver.command(&format!("ip netns exec {} python3 {}", ns.0, client_py.display())).output().expect("resolver");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1024", "answers the resolver got: {}", String::from_utf8_lossy(&out.stderr));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ebpf = shared.lock().expect("eBPF");
    let stats: Vec<(PeerKey, PeerCounters)> = node_agent::ebpf::maps::hash_entries(&ebpf, STATS).expect("DNS_STATS");
    let stats: Vec<_> = stats.into_iter().filter(|(k, _)| k.cgroup == cgroup).collect();
    let own: Vec<_> = stats.iter().filter(|(k, _)| !k.is_other()).collect();
    let other = stats.iter().find(|(k, _)| *k == PeerKey::other(cgroup, TRANSPORT_UDP)).map(|(_, c)| c.words).expect("the other record");
    let sum = |w: usize| stats.iter().map(|(_, c)| c.words[w]).sum::<u64>();
    assert_eq!(own.len(), 256, "records of its own: its share of DNS_STATS");
    assert!(own.iter().all(|(k, c)| k.addr[12..14] == [10, 1] && c.words[Q_A] == 4 && c.words[R_NXDOMAIN] == 4), "{own:?}");
    assert_eq!((other[Q_A], other[R_NXDOMAIN]), (44, 0), "the 44 servers beyond, in its other");
    assert_eq!((sum(Q_A), sum(R_NXDOMAIN), sum(MATCHED)), (1024 + 44, 1024, 1024), "every query, answer and latency");
    let lat: Vec<(LatKey, u64)> = node_agent::ebpf::maps::hash_entries(&ebpf, LAT).expect("DNS_LAT");
    let lat: Vec<_> = lat.into_iter().filter(|(k, _)| k.peer.cgroup == cgroup).collect();
    let own_buckets = lat.iter().filter(|(k, _)| !k.peer.is_other()).count();
    eprintln!("latency buckets: {own_buckets} of peers, {} of other", lat.len() - own_buckets);
    assert!((768..768 + cpus).contains(&own_buckets), "peers' buckets: three quarters of its share of DNS_LAT, {own_buckets}");
    // Each record's histogram is whole: its count is its buckets' sum.
    for (k, c) in &stats {
        let buckets: u64 = lat.iter().filter(|(l, _)| l.peer == *k).map(|(_, n)| n).sum();
        assert_eq!(buckets, c.words[MATCHED], "{k:?}: buckets and count");
    }
    let names: Vec<(NameKey, u64)> = node_agent::ebpf::maps::hash_entries(&ebpf, NAMES).expect("DNS_NAMES");
    let names: Vec<_> = names.into_iter().filter(|(k, _)| k.cgroup == cgroup).collect();
    let own_names = names.iter().filter(|(k, _)| !k.is_other()).count();
    let all_names: u64 = names.iter().filter(|(k, _)| k.rcode == 3).map(|(_, n)| n).sum();
    eprintln!("names: {own_names} of their own");
    assert!((128..128 + cpus).contains(&own_names), "names of its own: its share of DNS_NAMES, {own_names}");
    assert!(names.iter().any(|(k, _)| k.is_other()), "the rest in its other");
    assert_eq!(all_names, 1024, "every failing answer, by name or in other");
}
