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
use node_agent_tests::Kill;

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

    /// Pod web-0's series of `name`, by "server_kind server[ transport][ qtype|rcode]",
    /// non-zero ones only.
    fn client(&self, name: &str) -> BTreeMap<String, f64> {
        self.pod(name, "web", "web-0")
    }

    /// As [`Agent::client`], for the pod `namespace/pod`.
    fn pod(&self, name: &str, namespace: &str, pod: &str) -> BTreeMap<String, f64> {
        self.samples(name)
            .into_iter()
            .filter(|(l, v)| l.get("pod").map(String::as_str) == Some(pod) && *v != 0.0)
            .map(|(l, v)| {
                let g = |k: &str| l.get(k).cloned().unwrap_or_default();
                assert_eq!(g("namespace"), namespace);
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
    let (mut server, mut lines) = serve(&b, &ns, &server_py);

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
    let mut client = Kill(
        a.command(&format!("ip netns exec {} python3 {} '10.96.0.10 held.test 1 0' 5", ns.0, client_py.display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("client"),
    );
    // Once the client has sent it (its start may take a while on a busy
    // machine) and a second has passed, a scrape finds it timed out.
    let svc = "service kube-system/kube-dns";
    let t = std::time::Instant::now();
    while !agent.client("node_ebpf_pod_dns_timeouts_total").contains_key(svc) {
        assert!(t.elapsed() < Duration::from_secs(15), "the held query never timed out");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(svc), Some(&1.0), "the held query timed out, once");
    writeln!(server.0.stdin.as_mut().expect("stdin"), "release").expect("release");
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("released"));
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut client.0.stdout.take().expect("stdout"), &mut out).expect("the client's output");
    assert!(client.0.wait().expect("client").success(), "client failed");
    let seen = Seen::parse(&out);
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
    drop(server);
    let _ = std::io::stdout().flush();
}

/// This process's cgroup v2 id (its directory's inode number).
/// The test's DNS server (`script`), in `pod`'s cgroup and the namespace
/// `ns`, once it has said it is ready; the rest of what it prints. Killed
/// and reaped when dropped, whether the test passes or panics (before the
/// pods' cgroups, which cannot go while it is in one).
fn serve(
    pod: &node_agent_tests::pods::PodCgroup,
    ns: &Netns,
    script: &std::path::Path,
) -> (Kill, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut server = Kill(
        pod.command(&format!("ip netns exec {} python3 {}", ns.0, script.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("server"),
    );
    let mut lines = BufReader::new(server.0.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    (server, lines)
}

fn own_cgroup() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let rel = own.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 line").trim_start_matches('/').to_string();
    std::fs::metadata(node_agent_tests::pods::v2_root().join(rel)).expect("this process's cgroup").ino()
}

/// The most instructions the kernel's verifier may process for one DNS
/// program on this kernel: a fifth of its limit (1,000,000). Older
/// kernels' verifiers prune fewer paths and users run them (5.10 up), so
/// a program near the limit here would fail to load there; a change that
/// makes paths multiply again (as the per-message TCP walk times the
/// ledger's fallbacks did, past 1,000,000 on 6.18) fails here first.
/// (Before the steps became global functions, dns_ingress took 52,400
/// here and was refused on 5.10 and 6.1; now it takes about 2.5 times on
/// those what it takes on 6.18.)
const VERIFIER_BUDGET: u32 = 200_000;

/// Every DNS program loads, names on and off, with the verifier having
/// processed at most [`VERIFIER_BUDGET`] instructions of it (the kernel's
/// count, `verified_insns` of BPF_OBJ_GET_INFO_BY_FD, Linux 5.16 and up).
/// A kernel before 5.16 does not report the count: there each program's
/// loading, under the verifier's own limit, is the check (this test in
/// a 5.10 or 6.1 guest: the verifiers that prune least).
#[test]
fn the_programs_verify_with_room_for_older_kernels() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    for names in [false, true] {
        let mut ctx = node_agent::probes::Context::with_object(node_agent::ebpf::OBJECT, false);
        ctx.kube = true;
        ctx.dns_names = names;
        let shared = ctx.ebpf().expect("the object loads");
        let probe = node_agent::ebpf::Probe::attach(Ok(shared.clone()), &agent_common::dns::PROGRAMS);
        assert!(probe.up(), "the DNS programs load and attach (names {names})");
        let ebpf = shared.lock().expect("eBPF");
        for p in agent_common::dns::PROGRAMS {
            let info = ebpf.program(p.name).expect("the program").info().expect("its info");
            let Some(n) = info.verified_instruction_count() else {
                eprintln!("{} (names {names}): loaded; this kernel (before 5.16) does not say how many instructions", p.name);
                continue;
            };
            eprintln!("{} (names {names}): {n} instructions processed", p.name);
            assert!(n <= VERIFIER_BUDGET, "{} (names {names}): the verifier processed {n} instructions, over {VERIFIER_BUDGET}", p.name);
        }
    }
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

/// A DNS server for the scenarios below, in the cgroup and network
/// namespace it is started in: UDP and TCP on port 53 of each address of
/// argv[1] (`ADDRESS/DELAY_MS,...`, IPv4 or IPv6), answering each query
/// NOERROR after the address's delay (over TCP at once, every message of a
/// connection), except `drop.*` (never answered) and `pad-N.*` (NOERROR,
/// padded to N bytes with a NULL record). Prints "ready".
const SIMPLE_SERVER: &str = r#"
import socket, struct, sys, threading, time
def fam(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
def response(q):
    qid, flags = struct.unpack(">HH", q[:4])
    label = q[13:13 + q[12]].decode()
    if label.startswith("pad-"):
        head = struct.pack(">HHHHHH", qid, 0x8000 | (flags & 0x0100), 1, 1, 0, 0) + q[12:]
        rdlen = int(label[4:]) - len(head) - 12
        return head + struct.pack(">HHHIH", 0xc00c, 10, 1, 60, rdlen) + bytes((i * 7) & 255 for i in range(rdlen))
    return struct.pack(">HHHHHH", qid, 0x8000 | (flags & 0x0100), 1, 0, 0, 0) + q[12:]
def udp(addr, delay):
    s = socket.socket(fam(addr), socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(512)
        if q[13:13 + q[12]] == b"drop":
            continue
        if delay:
            threading.Timer(delay / 1000, s.sendto, (response(q), peer)).start()
        else:
            s.sendto(response(q), peer)
def conn(c):
    f = c.makefile("rb")
    while True:
        h = f.read(2)
        if len(h) < 2:
            break
        a = response(f.read(struct.unpack(">H", h)[0]))
        c.sendall(struct.pack(">H", len(a)) + a)
    f.close()
    c.close()
def tcp(addr):
    l = socket.socket(fam(addr), socket.SOCK_STREAM)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, 53))
    l.listen(64)
    while True:
        c, _ = l.accept()
        threading.Thread(target=conn, args=(c,), daemon=True).start()
for item in sys.argv[1].split(","):
    addr, delay = item.rsplit("/", 1)
    threading.Thread(target=udp, args=(addr, float(delay)), daemon=True).start()
    threading.Thread(target=tcp, args=(addr,), daemon=True).start()
time.sleep(0.3)
print("ready", flush=True)
sys.stdin.read()
"#;

/// A DNS client for the scenarios below: for each `KIND SERVERS NAME QTYPE
/// COUNT` of argv[1] (`;`-separated), from source addresses argv[2] (IPv4)
/// and argv[3] (IPv6):
/// - `conn`: COUNT times, a UDP socket connected to the server (as glibc's
///   resolver does), one query, its answer;
/// - `sendto`: the same from an unconnected socket (sendto, as musl does);
/// - `tcp`: the same over TCP, one connection each;
/// - `multi`: COUNT times, one unconnected socket sends the same query
///   (same id) to every server of SERVERS (`,`-separated) at once, as musl
///   asks all its nameservers, and reads every answer;
/// - `flood`: one unconnected socket sends COUNT queries (ids 0 to COUNT-1)
///   without reading anything;
/// - `syns`: COUNT non-blocking TCP connects to the server (never
///   answered), closed after 300 ms.
///
/// Prints JSON: answers by rcode, by the address they came from, the
/// microseconds each took by that address, and queries unanswered (1 s).
const SIMPLE_CLIENT: &str = r#"
import json, random, resource, socket, struct, sys, time
def query(qid, name, qtype):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack(">HH", qtype, 1)
def fam(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
src = {socket.AF_INET: sys.argv[2], socket.AF_INET6: sys.argv[3] if len(sys.argv) > 3 else "::"}
out = {"rcodes": {}, "from": {}, "lat_us": {}, "unanswered": 0}
def got(a, frm, t0):
    rc = str(struct.unpack(">H", a[2:4])[0] & 15)
    out["rcodes"][rc] = out["rcodes"].get(rc, 0) + 1
    out["from"][frm] = out["from"].get(frm, 0) + 1
    out["lat_us"].setdefault(frm, []).append(int((time.monotonic() - t0) * 1e6))
def sock(f, kind):
    s = socket.socket(f, kind)
    s.bind((src[f], 0))
    s.settimeout(1.0)
    return s
for item in sys.argv[1].split(";"):
    kind, servers, name, qtype, count = item.split()
    servers, qtype, count = servers.split(","), int(qtype), int(count)
    f = fam(servers[0])
    if kind == "flood":
        s = sock(f, socket.SOCK_DGRAM)
        for i in range(count):
            s.sendto(query(i, name, qtype), (servers[0], 53))
        s.close()
        continue
    if kind == "syns":
        resource.setrlimit(resource.RLIMIT_NOFILE, (count + 256, count + 256))
        keep = []
        for i in range(count):
            s = socket.socket(f, socket.SOCK_STREAM)
            s.setblocking(False)
            s.bind((src[f], 0))
            try:
                s.connect((servers[0], 53))
            except BlockingIOError:
                pass
            keep.append(s)
        time.sleep(0.3)
        for s in keep:
            s.close()
        continue
    for _ in range(count):
        q = query(random.randrange(65536), name, qtype)
        t0 = time.monotonic()
        try:
            if kind == "tcp":
                s = sock(f, socket.SOCK_STREAM)
                s.connect((servers[0], 53))
                s.sendall(struct.pack(">H", len(q)) + q)
                r = s.makefile("rb")
                got(r.read(struct.unpack(">H", r.read(2))[0]), servers[0], t0)
                r.close()
            elif kind == "conn":
                s = sock(f, socket.SOCK_DGRAM)
                s.connect((servers[0], 53))
                s.send(q)
                got(s.recv(512), servers[0], t0)
            else:
                s = sock(f, socket.SOCK_DGRAM)
                for server in servers:
                    s.sendto(q, (server, 53))
                for _ in servers:
                    a, frm = s.recvfrom(512)
                    got(a, frm[0], t0)
        except socket.timeout:
            out["unanswered"] += 1
        s.close()
print(json.dumps(out), flush=True)
"#;

/// Runs `script` with `args` in network namespace `ns` (and in `cgroup`,
/// when given), stdin piped; waits for its "ready" line. Killed and reaped
/// when dropped, whether the test passes or panics (before the cgroup,
/// which cannot go while it is in it: declare it after the cgroup).
fn start_py(cgroup: Option<&node_agent_tests::pods::PodCgroup>, ns: &Netns, script: &std::path::Path, args: &str) -> Kill {
    let cmd = format!("ip netns exec {} python3 {} {args}", ns.0, script.display());
    let mut c = match cgroup {
        Some(c) => c.command(&cmd),
        None => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c").arg(format!("exec {cmd}"));
            c
        }
    };
    let mut child = Kill(c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("python3"));
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("the server's first line");
    assert_eq!(line.trim(), "ready", "the server did not start");
    child
}

/// What [`SIMPLE_CLIENT`] saw.
#[derive(Debug)]
struct Answers {
    rcodes: BTreeMap<String, f64>,
    from: BTreeMap<String, f64>,
    lat_us: BTreeMap<String, Vec<u64>>,
    unanswered: f64,
}

/// Runs [`SIMPLE_CLIENT`] in `cgroup` and `ns` over `plan`, from `v4`
/// (and `v6`).
fn simple_client(
    cgroup: &node_agent_tests::pods::PodCgroup,
    ns: &Netns,
    script: &std::path::Path,
    plan: &[&str],
    v4: &str,
    v6: &str,
) -> Answers {
    let out = cgroup
        .command(&format!("ip netns exec {} python3 {} '{}' {v4} {v6}", ns.0, script.display(), plan.join(";")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("client");
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
    let map = |k: &str| -> BTreeMap<String, f64> {
        v[k].as_object().expect("an object").iter().map(|(k, n)| (k.clone(), n.as_f64().unwrap_or(-1.0))).collect()
    };
    let lat_us = v["lat_us"]
        .as_object()
        .expect("lat_us")
        .iter()
        .map(|(k, l)| (k.clone(), l.as_array().expect("a list").iter().filter_map(|x| x.as_u64()).collect()))
        .collect();
    Answers { rcodes: map("rcodes"), from: map("from"), lat_us, unanswered: v["unanswered"].as_f64().unwrap_or(-1.0) }
}

/// The sum of pod web-0's `name` buckets at `le` for the series of `server`.
fn bucket(agent: &Agent, server: &str, le: &str) -> f64 {
    agent
        .samples("node_ebpf_pod_dns_latency_seconds_bucket")
        .into_iter()
        .filter(|(l, _)| {
            l.get("pod").map(String::as_str) == Some("web-0")
                && l.get("le").map(String::as_str) == Some(le)
                && format!("{} {}", l["server_kind"], l["server"]) == server
        })
        .map(|s| s.1)
        .sum()
}

/// Issue #47, row 9: a resolver that asks all its nameservers at once with
/// one query id from one socket (musl, in Alpine images). Each server's
/// queries, answers and latencies are its own: 10.78.0.1 answers in 20 ms,
/// 10.78.0.2 at once; ten such queries make ten queries and ten answers per
/// server, none a retransmit, none late, the fast server's latencies all
/// at or below 15.6 ms and the slow one's all above.
#[test]
fn a_query_sent_to_several_servers_is_timed_per_server() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new("dnsmulti");
    ns.batch("link set lo up\naddr add 10.77.0.1/32 dev lo\nroute add local 10.78.0.0/24 dev lo\n");
    let cluster = Running::start(api()).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SIMPLE_SERVER).expect("server script");
    std::fs::write(&client_py, SIMPLE_CLIENT).expect("client script");
    let _server = start_py(Some(&b), &ns, &server_py, "10.78.0.1/20,10.78.0.2/0");
    let seen = simple_client(&a, &ns, &client_py, &["multi 10.78.0.1,10.78.0.2 ok.test 1 10"], "10.77.0.1", "::");
    eprintln!("the client saw {seen:?}");
    assert_eq!((seen.from.get("10.78.0.1"), seen.from.get("10.78.0.2"), seen.unanswered), (Some(&10.0), Some(&10.0), 0.0));
    let (slow, fast) = ("external 10.78.0.1", "external 10.78.0.2");
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    let r = agent.client("node_ebpf_pod_dns_responses_total");
    eprintln!("web-0: queries {q:?}\nresponses {r:?}");
    let want = |what: &str| -> BTreeMap<String, f64> { [slow, fast].iter().map(|s| (format!("{s} {what}"), 10.0)).collect() };
    assert_eq!(q, want("A"), "ten queries to each server");
    assert_eq!(r, want("NOERROR"), "ten answers from each");
    assert_eq!(agent.client("node_ebpf_pod_dns_retransmits_total"), BTreeMap::new(), "no retransmits");
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total"), BTreeMap::new(), "no late answers");
    let count = agent.client("node_ebpf_pod_dns_latency_seconds_count");
    assert_eq!((count.get(slow), count.get(fast)), (Some(&10.0), Some(&10.0)), "a latency per answer, per server");
    // Each server's own latencies: the fast one's at or below 15.6 ms (the
    // client's own times say so), the slow one's never.
    let fast_quick = seen.lat_us["10.78.0.2"].iter().filter(|us| **us <= 15_625).count() as f64;
    assert!(bucket(&agent, fast, "0.015625") >= fast_quick, "{fast_quick} fast answers the client timed under 15.6 ms");
    assert_eq!(bucket(&agent, slow, "0.015625"), 0.0, "the 20 ms server's answers above 15.6 ms");
}

/// Issue #47, row 11: a host-network pod (its task in the node's network
/// namespace, here one of the test's own) asks the cluster DNS Service by
/// its ClusterIP, which kube-proxy's iptables mode rewrites to the backend
/// (pod coredns-0) in nat OUTPUT, before the packet reaches the cgroup
/// egress hook; the answer is rewritten back before the ingress hook. From
/// a connected UDP socket (glibc), an unconnected one (sendto: musl) and
/// TCP, over IPv4 and IPv6 (a dual-stack Service), every query and answer
/// is the Service's, timed, and none the backend's.
#[test]
fn host_network_queries_to_a_service_are_the_services() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new("dnsnode");
    // The node: its address 10.77.0.1 (and fd00:77::1), the backend pod's
    // 10.77.0.2 (fd00:77::2); the Service range routed out of a veth.
    ns.batch(
        "link set lo up\naddr add 10.77.0.1/32 dev lo\naddr add 10.77.0.2/32 dev lo\n\
         addr add fd00:77::1/128 dev lo nodad\naddr add fd00:77::2/128 dev lo nodad\n\
         link add v0 type veth peer name v1\nlink set v1 up\nlink set v0 up\n\
         route add 10.96.0.0/12 dev v0\nroute add fd00:96::/108 dev v0\n",
    );
    for (tables, svc, backend) in [("iptables", "10.96.0.10", "10.77.0.2:53"), ("ip6tables", "fd00:96::a", "[fd00:77::2]:53")] {
        for proto in ["udp", "tcp"] {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &ns.0, tables, "-t", "nat", "-A", "OUTPUT", "-d", svc, "-p", proto, "--dport", "53"])
                .args(["-j", "DNAT", "--to-destination", backend])
                .output()
                .expect("iptables (Debian's iptables package)");
            assert!(out.status.success(), "the Service's DNAT rule: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let api = node_agent_tests::pods::api_with_addresses(
        &[(UID_A, "web", "web-0", "app", CID_A, "10.77.0.1"), (UID_B, "kube-system", "coredns-0", "coredns", CID_B, "10.77.0.2")],
        &[],
    );
    {
        let mut st = api.state.lock().expect("state");
        let mut web = node_agent_tests::apiserver::pod(UID_A, "web", "web-0", NODE, "app", CID_A);
        web["spec"]["hostNetwork"] = true.into();
        web["status"]["podIP"] = "10.77.0.1".into();
        web["status"]["podIPs"] = serde_json::json!([{"ip": "10.77.0.1"}, {"ip": "fd00:77::1"}]);
        api.put(&mut st, "pods", "web", "web-0", web, false);
        let mut coredns = node_agent_tests::apiserver::pod(UID_B, "kube-system", "coredns-0", NODE, "coredns", CID_B);
        coredns["status"]["podIP"] = "10.77.0.2".into();
        coredns["status"]["podIPs"] = serde_json::json!([{"ip": "10.77.0.2"}, {"ip": "fd00:77::2"}]);
        api.put(&mut st, "pods", "kube-system", "coredns-0", coredns, false);
        let svc = serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "uid": "5e7c0000-0000-4000-8000-000000000053"},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::a"], "ports": [{"port": 53, "protocol": "UDP"}]}
        });
        api.put(&mut st, "services", "kube-system", "kube-dns", svc, false);
    }
    let cluster = Running::start(api).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SIMPLE_SERVER).expect("server script");
    std::fs::write(&client_py, SIMPLE_CLIENT).expect("client script");
    let _server = start_py(Some(&b), &ns, &server_py, "10.77.0.2/0,fd00:77::2/0");
    let plan = [
        "conn 10.96.0.10 ok.test 1 3",
        "sendto 10.96.0.10 ok.test 1 3",
        "tcp 10.96.0.10 ok.test 1 3",
        "conn fd00:96::a ok.test 28 3",
        "sendto fd00:96::a ok.test 28 3",
        "tcp fd00:96::a ok.test 28 3",
    ];
    let seen = simple_client(&a, &ns, &client_py, &plan, "10.77.0.1", "fd00:77::1");
    eprintln!("the client saw {seen:?}");
    assert_eq!(seen.rcodes.get("0"), Some(&18.0), "every query answered");
    assert_eq!(seen.from.get("10.96.0.10").copied().unwrap_or(0.0) + seen.from.get("fd00:96::a").copied().unwrap_or(0.0), 18.0);
    let svc = "service kube-system/kube-dns";
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    let r = agent.client("node_ebpf_pod_dns_responses_total");
    eprintln!("web-0: queries {q:?}\nresponses {r:?}");
    let want = |udp: &str, tcp: &str| -> BTreeMap<String, f64> {
        [(format!("{svc} {udp}"), 6.0), (format!("{svc} tcp {udp}"), 3.0), (format!("{svc} {tcp}"), 6.0), (format!("{svc} tcp {tcp}"), 3.0)]
            .into_iter()
            .collect()
    };
    assert_eq!(q, want("A", "AAAA"), "the Service's queries (none the backend's)");
    let r_want: BTreeMap<String, f64> = [(format!("{svc} NOERROR"), 12.0), (format!("{svc} tcp NOERROR"), 6.0)].into_iter().collect();
    assert_eq!(r, r_want, "the Service's answers");
    let count = agent.client("node_ebpf_pod_dns_latency_seconds_count");
    assert_eq!((count.get(svc), count.get(&format!("{svc} tcp"))), (Some(&12.0), Some(&6.0)), "each answer timed");
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total"), BTreeMap::new(), "no late answers");

    // Answers from the backend's own address, as a socket-level load
    // balancer's are (Cilium's rewrites sendmsg's address in a program of
    // its own, before or after the agent's): here the backend's answers
    // bypass connection tracking, so nothing rewrites them back. A query
    // whose datagram left for another address than its socket asked for
    // waits under both: still the Service's, timed.
    let notrack = |op: &str| {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.0,
                "iptables",
                "-t",
                "raw",
                op,
                "OUTPUT",
                "-s",
                "10.77.0.2",
                "-p",
                "udp",
                "--sport",
                "53",
                "-j",
                "NOTRACK",
            ])
            .output()
            .expect("iptables");
        assert!(out.status.success(), "the NOTRACK rule: {}", String::from_utf8_lossy(&out.stderr));
    };
    notrack("-A");
    let seen = simple_client(&a, &ns, &client_py, &["sendto 10.96.0.10 ok.test 1 3"], "10.77.0.1", "fd00:77::1");
    notrack("-D");
    assert_eq!(seen.from.get("10.77.0.2"), Some(&3.0), "answers from the backend's address: {seen:?}");
    assert_eq!(agent.client("node_ebpf_pod_dns_queries_total").get(&format!("{svc} A")), Some(&9.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_responses_total").get(&format!("{svc} NOERROR")), Some(&15.0));
    assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(svc), Some(&15.0), "each answer timed");
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total"), BTreeMap::new(), "no late answers");
    // And once the timeout has passed, nothing waits: no timeouts (the
    // second entry of each query went with it).
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total"), BTreeMap::new(), "no timeouts");
}

/// Issue #47, point 3: the queries waiting for an answer are bounded per
/// cgroup in the kernel, so that one pod's unanswered queries cannot
/// stop another pod's from being timed. Pod A sends 10,000 queries that
/// are never answered (more than the 8,192 the node holds) and opens
/// 2,100 TCP connections to port 53 that are never accepted (more than the
/// node's followed connections); pod B's queries just after, over UDP and
/// TCP, are each matched to their answer and timed. Pod A's queries are
/// all counted, those beyond its bound untimed (no timeout) and counted as
/// dropped events.
#[test]
fn one_pods_unanswered_queries_do_not_blind_another() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = Netns::new("dnsbound");
    // 10.80.0.1 has a made-up neighbour: its SYNs go unanswered.
    ns.batch(
        "link set lo up\naddr add 10.77.0.1/32 dev lo\naddr add 10.77.0.2/32 dev lo\naddr add 10.77.0.3/32 dev lo\n\
         link add v0 type veth peer name v1\nlink set v1 up\nlink set v0 up\nroute add 10.80.0.0/24 dev v0\n\
         neigh add 10.80.0.1 lladdr 02:00:00:00:00:01 dev v0 nud permanent\n",
    );
    let cluster = Running::start(api()).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SIMPLE_SERVER).expect("server script");
    std::fs::write(&client_py, SIMPLE_CLIENT).expect("client script");
    let _server = start_py(None, &ns, &server_py, "10.77.0.3/0");
    let dropped = || -> f64 {
        agent
            .samples("node_ebpf_events_dropped_total")
            .into_iter()
            .find(|(l, _)| l.get("probe").map(String::as_str) == Some("dns"))
            .map_or(0.0, |s| s.1)
    };
    let dropped_before = dropped();
    let flood =
        simple_client(&a, &ns, &client_py, &["flood 10.77.0.3 drop.test 1 10000", "syns 10.80.0.1 x.test 1 2100"], "10.77.0.1", "::");
    assert_eq!(flood.unanswered, 0.0);
    let seen = simple_client(&b, &ns, &client_py, &["conn 10.77.0.3 ok.test 1 20", "tcp 10.77.0.3 pad-12000.test 1 2"], "10.77.0.2", "::");
    assert_eq!((seen.rcodes.get("0"), seen.unanswered), (Some(&22.0), 0.0), "the client's own counts");
    // Pod A's queries past the timeout (1 s): timeouts at this scrape.
    std::thread::sleep(Duration::from_millis(1100));
    let server_b = "external 10.77.0.3";
    let of_b = |name: &str| agent.pod(name, "kube-system", "coredns-0");
    let want: BTreeMap<String, f64> = [(server_b.to_string(), 20.0), (format!("{server_b} tcp"), 2.0)].into_iter().collect();
    eprintln!("coredns-0: responses {:?}", of_b("node_ebpf_pod_dns_responses_total"));
    assert_eq!(of_b("node_ebpf_pod_dns_latency_seconds_count"), want, "every answer of pod B matched and timed");
    assert_eq!(of_b("node_ebpf_pod_dns_late_responses_total"), BTreeMap::new(), "none late");
    let q = agent.client("node_ebpf_pod_dns_queries_total");
    assert_eq!(q.get(&format!("{server_b} A")), Some(&10_000.0), "pod A's queries, every one counted");
    // Pod A's queries beyond its bound waited in no map: past the timeout,
    // exactly the bound are timeouts, the rest dropped events.
    let bound = agent_common::dns::PENDING_PER_CGROUP as f64;
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(server_b), Some(&bound), "pod A's timed queries: its bound");
    let more = dropped() - dropped_before;
    let conns = agent_common::dns::CONNS_PER_CGROUP as f64;
    assert!(more >= 10_000.0 - bound + 2_100.0 - conns, "{more} dropped events: pod A's queries and connections beyond its bounds");
    // The agent's deletions (timeouts) give the bound back: pod A's next
    // 100 unanswered queries are timed again.
    simple_client(&a, &ns, &client_py, &["flood 10.77.0.3 drop.test 1 100"], "10.77.0.1", "::");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(server_b), Some(&(bound + 100.0)), "timed again");
}

/// A DNS server over TCP alone, on 10.77.0.2 port 53, for the segmented
/// answers: each query's first label says how to answer (`MODE-SIZE-N`):
/// a NOERROR answer of SIZE bytes (a NULL record pads it), written with its
/// two-byte length in one write (`one`), the length first and the message
/// 20 ms later (`apart`), the length's first byte and, 20 ms later, the
/// rest (`split`), or held until the connection's N queries have come and
/// all N answers written at once (`pipe`). Any number of messages per
/// connection; TCP_NODELAY. Prints "ready".
const SEG_SERVER: &str = r#"
import socket, struct, sys, threading, time
def answer(q, size):
    head = struct.pack(">HHHHHH", struct.unpack(">H", q[:2])[0], 0x8180, 1, 1, 0, 0) + q[12:]
    rdlen = size - len(head) - 12
    return head + struct.pack(">HHHIH", 0xc00c, 10, 1, 60, rdlen) + bytes((i * 7) & 255 for i in range(rdlen))
def conn(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    f = c.makefile("rb")
    held = []
    while True:
        h = f.read(2)
        if len(h) < 2:
            break
        q = f.read(struct.unpack(">H", h)[0])
        mode, size, n = q[13:13 + q[12]].decode().split("-")
        a = answer(q, int(size))
        w = struct.pack(">H", len(a)) + a
        if mode == "pipe":
            held.append(w)
            if len(held) == int(n):
                c.sendall(b"".join(held))
                held = []
        elif mode in ("apart", "split"):
            cut = 2 if mode == "apart" else 1
            c.sendall(w[:cut])
            time.sleep(0.02)
            c.sendall(w[cut:])
        else:
            c.sendall(w)
    f.close()
    c.close()
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("10.77.0.2", 53))
l.listen(64)
print("ready", flush=True)
while True:
    c, _ = l.accept()
    threading.Thread(target=conn, args=(c,), daemon=True).start()
"#;

/// Pod A's side of [`SEG_SERVER`]: for each `MODE SIZE N` of argv[1], one
/// connection from 10.77.0.1 carrying N queries (type A, the label
/// `MODE-SIZE-N`) written as the server writes its answers (`pipe`: all N
/// in one write, before reading any answer; else one after the other, each
/// answer read before the next query), every answer read whole and checked
/// (its id, its size). Prints JSON: answers by rcode, and the bytes read.
const SEG_CLIENT: &str = r#"
import json, random, socket, struct, sys, time
rcodes, total = {}, 0
def query(label):
    q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    q += bytes([len(label)]) + label.encode() + b"\4test\0" + struct.pack(">HH", 1, 1)
    return struct.pack(">H", len(q)) + q
def read(f, qid, size):
    global total
    n = struct.unpack(">H", f.read(2))[0]
    a = f.read(n)
    assert n == size and len(a) == size and a[:2] == qid, (n, size, a[:2], qid)
    rc = str(a[3] & 15)
    rcodes[rc] = rcodes.get(rc, 0) + 1
    total += 2 + n
for item in sys.argv[1].split(";"):
    mode, size, n = item.split()
    size, n = int(size), int(n)
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.bind(("10.77.0.1", 0))
    s.settimeout(10)
    s.connect(("10.77.0.2", 53))
    f = s.makefile("rb")
    qs = [query("%s-%d-%d" % (mode, size, n)) for _ in range(n)]
    if mode == "pipe":
        s.sendall(b"".join(qs))
        for q in qs:
            read(f, q[2:4], size)
    else:
        for q in qs:
            if mode in ("apart", "split"):
                cut = 2 if mode == "apart" else 1
                s.sendall(q[:cut])
                time.sleep(0.02)
                s.sendall(q[cut:])
            else:
                s.sendall(q)
            read(f, q[2:4], size)
    f.close()
    s.close()
print(json.dumps({"rcodes": rcodes, "bytes": total}), flush=True)
"#;

/// Packets device `dev` of `ns` received: each one skb (a GSO super-segment
/// passed through a veth counts once).
fn rx_packets(ns: &Netns, dev: &str) -> u64 {
    let out = std::process::Command::new("ip").args(["-n", &ns.0, "-s", "-j", "link", "show", "dev", dev]).output().expect("ip");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip's JSON");
    v[0]["stats64"]["rx"]["packets"].as_u64().expect("rx packets")
}

/// A counter of `Tcp:` in /proc/net/snmp of `ns`.
fn tcp_mib(ns: &Netns, field: &str) -> u64 {
    let out = std::process::Command::new("ip").args(["netns", "exec", &ns.0, "cat", "/proc/net/snmp"]).output().expect("ip netns exec");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let at = rows[0].split_whitespace().position(|h| h == field).expect("the field");
    rows[1].split_whitespace().nth(at).and_then(|v| v.parse().ok()).expect("a count")
}

/// Segments of the answers of `plan` at the MSS of a 1500-byte MTU with
/// TCP timestamps (1448 bytes): what arrives when nothing coalesces them.
fn segments(plan: &[String]) -> u64 {
    plan.iter()
        .map(|p| {
            let v: Vec<u64> = p.split_whitespace().skip(1).map(|x| x.parse().expect("a number")).collect();
            match p.starts_with("pipe") {
                true => ((v[0] + 2) * v[1]).div_ceil(1448),
                false => v[1] * (v[0] + 2).div_ceil(1448),
            }
        })
        .sum()
}

/// Issue #47, row 1: DNS over TCP whose answers span many segments. Pod A
/// (10.77.0.1) and pod B's server (10.77.0.2) are in two network
/// namespaces joined by a veth pair of MTU 1500 with GRO, GSO and TSO off,
/// so each answer of 8 to 16 KB arrives as separate segments of at most
/// 1448 bytes (checked: the packets the client's device received). Every
/// query and answer is counted once, as what it is: 25 exchanges; then
/// several messages in one segment both ways and answers whose boundaries
/// fall inside segments (pipelining), a length written apart from its
/// message and a length split across two segments; then segments lost and
/// retransmitted both ways (dropped by iptables, so that later segments
/// arrive before the lost one); then GSO super-segments (TSO on at the
/// server's end). Nothing is counted as a retransmit, late or truncated.
#[test]
fn tcp_answers_over_many_segments_are_read_by_message() {
    if !root_or_skip("the DNS truth test") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (c, s) = (Netns::new("dnsc"), Netns::new("dnss"));
    c.batch(&format!("link set lo up\nlink add vc type veth peer name vs netns {}\naddr add 10.77.0.1/24 dev vc\nlink set vc up\n", s.0));
    s.batch("link set lo up\naddr add 10.77.0.2/24 dev vs\nlink set vs up\n");
    let ethtool = |ns: &Netns, dev: &str, on: &str| {
        let st = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.0, "ethtool", "-K", dev, "gro", on, "gso", on, "tso", on])
            .status()
            .expect("ethtool");
        assert!(st.success(), "ethtool -K {dev}");
    };
    ethtool(&c, "vc", "off");
    ethtool(&s, "vs", "off");
    c.wait_until_up("vc");
    s.wait_until_up("vs");
    let cluster = Running::start(api()).expect("API server");
    let agent = Agent::new(&cluster);
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_py, client_py) = (dir.path().join("server.py"), dir.path().join("client.py"));
    std::fs::write(&server_py, SEG_SERVER).expect("server script");
    std::fs::write(&client_py, SEG_CLIENT).expect("client script");
    let _server = start_py(Some(&b), &s, &server_py, "");
    let run = |plan: &[String]| -> (BTreeMap<String, f64>, u64) {
        let out = a
            .command(&format!("ip netns exec {} python3 {} '{}'", c.0, client_py.display(), plan.join(";")))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("client");
        assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");
        let rcodes = v["rcodes"].as_object().expect("rcodes").iter().map(|(k, n)| (k.clone(), n.as_f64().unwrap_or(-1.0))).collect();
        (rcodes, v["bytes"].as_u64().unwrap_or(0))
    };
    let tcp = "pod kube-system/coredns-0 tcp";
    let check = |phase: &str, queries: f64| {
        let q = agent.client("node_ebpf_pod_dns_queries_total");
        let r = agent.client("node_ebpf_pod_dns_responses_total");
        eprintln!("{phase}, web-0: queries {q:?}\nresponses {r:?}");
        assert_eq!(q, [(format!("{tcp} A"), queries)].into_iter().collect(), "{phase}: every query once");
        assert_eq!(r, [(format!("{tcp} NOERROR"), queries)].into_iter().collect(), "{phase}: every answer once, NOERROR");
        assert_eq!(agent.client("node_ebpf_pod_dns_latency_seconds_count").get(tcp), Some(&queries), "{phase}: each answer timed");
        for f in ["late_responses", "retransmits", "truncated", "timeouts"] {
            assert_eq!(agent.client(&format!("node_ebpf_pod_dns_{f}_total")), BTreeMap::new(), "{phase}: no {f}");
        }
    };

    // Phase 1: 25 exchanges, answers of 8,000 to 16,000 bytes, one per
    // connection, each in separate segments.
    let plan: Vec<String> = (0..25).map(|i| format!("one {} 1", 8000 + i * 333)).collect();
    let rx = rx_packets(&c, "vc");
    let (rcodes, bytes) = run(&plan);
    let arrived = rx_packets(&c, "vc") - rx;
    assert_eq!(rcodes.get("0"), Some(&25.0), "the client's own count");
    assert!(arrived >= segments(&plan), "{arrived} packets for {bytes} bytes of answers: not segmented as on a 1500-byte MTU without GRO");
    check("phase 1", 25.0);

    // Phase 2: pipelining (several messages in one segment both ways, and
    // answer boundaries inside segments), lengths written apart and split.
    let plan: Vec<String> =
        ["pipe 3000 3", "pipe 200 4", "one 9000 3", "apart 10000 2", "split 12000 2", "split 100 1"].map(String::from).to_vec();
    let (rcodes, _) = run(&plan);
    assert_eq!(rcodes.get("0"), Some(&15.0), "the client's own count");
    check("phase 2", 40.0);

    // Phase 3: segments lost and retransmitted: every second query segment
    // lost on its way in to the server, every fourth answer segment on its
    // way in to the client (before its socket, and so before the ingress
    // hook), so that later segments arrive before the lost one.
    let rules = [
        (&s, "INPUT -p tcp --dport 53 -m length --length 80:65535 -m statistic --mode nth --every 2 --packet 0 -j DROP"),
        (&c, "INPUT -p tcp --sport 53 -m length --length 500:65535 -m statistic --mode nth --every 4 --packet 1 -j DROP"),
    ];
    let iptables = |ns: &Netns, args: &str| {
        let st = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.0, "iptables"])
            .args(args.split_whitespace())
            .status()
            .expect("iptables");
        assert!(st.success(), "iptables {args}");
    };
    for (ns, r) in rules {
        iptables(ns, &format!("-A {r}"));
    }
    let (retrans_c, retrans_s) = (tcp_mib(&c, "RetransSegs"), tcp_mib(&s, "RetransSegs"));
    let plan: Vec<String> = ["one 12000 1", "one 12000 1", "one 12000 1", "one 12000 1", "one 14000 2"].map(String::from).to_vec();
    let (rcodes, _) = run(&plan);
    for (ns, r) in rules {
        iptables(ns, &format!("-D {r}"));
    }
    assert_eq!(rcodes.get("0"), Some(&6.0), "the client's own count");
    let (more_c, more_s) = (tcp_mib(&c, "RetransSegs") - retrans_c, tcp_mib(&s, "RetransSegs") - retrans_s);
    assert!(more_c > 0 && more_s > 0, "segments retransmitted both ways: {more_c} by the client, {more_s} by the server");
    check("phase 3", 46.0);

    // Phase 4: GSO super-segments (TSO on at the server's end: each answer
    // crosses the veth in fewer packets than segments).
    ethtool(&s, "vs", "on");
    let plan: Vec<String> = (0..5).map(|i| format!("one {} 1", 30_000 + i * 1000)).collect();
    let rx = rx_packets(&c, "vc");
    let (rcodes, _) = run(&plan);
    let arrived = rx_packets(&c, "vc") - rx;
    assert_eq!(rcodes.get("0"), Some(&5.0), "the client's own count");
    assert!(arrived < segments(&plan), "{arrived} packets: no super-segments");
    check("phase 4", 51.0);

    // Phase 5: pipelined answers with a segment lost on its way in. Three
    // answers of 3,002 bytes in one write: the third segment (bytes 2,896
    // to 4,343 of the stream, where the second answer starts at 3,002) is
    // lost once, so the next three (the third answer starts at 6,004, in
    // the fifth) arrive before it. An answer whose start arrived ahead of a
    // lost segment, before the previous answer's length said where it
    // starts, cannot be read (docs/ebpf.md): the connection's place is
    // lost, a dropped event, and that answer's query times out. Nothing is
    // counted as what it is not.
    ethtool(&s, "vs", "off");
    let dropped = || -> f64 {
        agent
            .samples("node_ebpf_events_dropped_total")
            .into_iter()
            .find(|(l, _)| l.get("probe").map(String::as_str) == Some("dns"))
            .map_or(0.0, |s| s.1)
    };
    let dropped_before = dropped();
    // The third segment of 500 bytes or more each connection receives:
    // a fresh rule (its own count) per connection.
    let third = "INPUT -p tcp --sport 53 -m length --length 500:65535 -m statistic --mode nth --every 1000 --packet 2 -j DROP";
    let retrans = tcp_mib(&s, "RetransSegs");
    for _ in 0..3 {
        iptables(&c, &format!("-A {third}"));
        let (rcodes, _) = run(&["pipe 3000 3".to_string()]);
        iptables(&c, &format!("-D {third}"));
        assert_eq!(rcodes.get("0"), Some(&3.0), "the client's own count");
    }
    assert!(tcp_mib(&s, "RetransSegs") >= retrans + 3, "the lost segments were sent again");
    std::thread::sleep(Duration::from_millis(1100));
    let r = agent.client("node_ebpf_pod_dns_responses_total");
    eprintln!("phase 5: responses {r:?}");
    assert_eq!(r, [(format!("{tcp} NOERROR"), 51.0 + 6.0)].into_iter().collect(), "two answers of each connection read, NOERROR");
    assert_eq!(agent.client("node_ebpf_pod_dns_queries_total").get(&format!("{tcp} A")), Some(&60.0), "every query once");
    assert_eq!(agent.client("node_ebpf_pod_dns_late_responses_total"), BTreeMap::new(), "no late answers");
    assert_eq!(agent.client("node_ebpf_pod_dns_timeouts_total").get(tcp), Some(&3.0), "the third query of each connection");
    assert!(dropped() >= dropped_before + 3.0, "each connection whose place was lost is a dropped event");
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
    let (_server, _lines) = serve(&b, &ns, &server_py);
    let out = b.command(&format!("ip netns exec {} python3 {} 3000", ns.0, noisy_py.display())).output().expect("resolver");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3000", "{}", String::from_utf8_lossy(&out.stderr));
    let plan = queries(30, "10.77.0.2", "ok.test", 1, false);
    let seen = run_client(&a, &ns, &client_py, &plan, 1.0);
    assert_eq!(seen.rcodes.get("0"), Some(&30.0), "the client's own count");
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
}

/// A resolver's rounds: from one socket on 10.0.0.1, in each of four
/// rounds, one A query to each of 256 servers (10.1.0.1-128, 10.1.1.1-128)
/// named `w<ms>r<round>n<i>`, then their 256 answers; then one query to
/// each of 44 servers more (10.2.0.1-44), where nothing answers. Prints
/// the answers received.
const ROUNDS: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# Room for a round's 256 answers arriving at once (SO_RCVBUFFORCE, as root):
# the default buffer drops some when the reader is slow (an emulated guest).
s.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)
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
    let mut server = Kill(
        resolver
            .command(&format!("ip netns exec {} python3 {}", ns.0, server_py.display()))
            .stdout(Stdio::piped())
            .spawn()
            .expect("servers"),
    );
    let mut lines = BufReader::new(server.0.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    let out = resolver.command(&format!("ip netns exec {} python3 {}", ns.0, client_py.display())).output().expect("resolver");
    drop(server);
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
