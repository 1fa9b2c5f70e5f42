//! `ebpf_tcp_peers` and `ebpf_dns` truth tests for cgroups and pods that
//! come and go as they do on real nodes (#47): an init container that
//! lives a few seconds between two scrapes, an API server out of reach for
//! longer than the grace period while a new pod counts, thousands of
//! short-lived host cgroups, and a connection from the node's own address
//! (the kubelet's probes).
//!
//! Each test has a network namespace of its own with a server written here
//! (TCP on port 8080, DNS on port 53, of any address), pods web-0 and db-0
//! with kubelet-style cgroup paths and UIDs of this process's own, served
//! by an in-memory API server, addresses of 10.93.0.0/16 no other test
//! uses, and checks the agent's counts for them against what its client
//! did: exact on a busy node, other truth tests running at once included.
//!
//! Root only (CAP_BPF, CAP_NET_ADMIN, cgroups, network namespaces); outside
//! CI without root they skip with a message, in CI they must run.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use node_agent_tests::apiserver::{Api, Running};
use node_agent_tests::host::root_or_skip;
use node_agent_tests::inproc::InProcess;
use node_agent_tests::netns::Netns;
use node_agent_tests::pods::{cgroup_at, cid, uid, v2_root, PodCgroup, NODE};

/// The server: accepts and closes every connection on port 8080, answers
/// every DNS query on port 53 with NOERROR. Prints "ready"; runs until its
/// stdin closes.
const SERVER: &str = r#"
import socket, struct, sys, threading
def tcp():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", 8080))
    l.listen(1024)
    while True:
        c, _ = l.accept()
        c.close()
def dns():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 53))
    while True:
        q, peer = u.recvfrom(512)
        qid, flags = struct.unpack(">HH", q[:4])
        u.sendto(struct.pack(">HHHHHH", qid, 0x8000 | (flags & 0x0100), 1, 0, 0, 0) + q[12:], peer)
threading.Thread(target=tcp, daemon=True).start()
threading.Thread(target=dns, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"#;

/// The client: `client.py NETNS ADDRESS N [CHURN]` joins the network
/// namespace NETNS (itself: `ip netns exec` would mount a sysfs of its own
/// over the cgroup hierarchy), makes N connects to ADDRESS:8080 and N DNS
/// queries (each answered) to ADDRESS:53; with CHURN, a cgroup directory,
/// each pair from a cgroup of its own made in it and removed after (a
/// short-lived host service), a few milliseconds apart. Prints N.
const CLIENT: &str = r#"
import ctypes, os, socket, struct, sys, time
with open(sys.argv[1]) as ns:
    assert ctypes.CDLL(None, use_errno=True).setns(ns.fileno(), 0x40000000) == 0, "setns"
addr, n = sys.argv[2], int(sys.argv[3])
churn = sys.argv[4] if len(sys.argv) > 4 else None
pid = str(os.getpid())
for i in range(n):
    if churn:
        d = f"{churn}/c{i}"
        os.mkdir(d)
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(pid)
    s = socket.create_connection((addr, 8080), timeout=5)
    s.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0) + b"\x02ok\x00\x00\x01\x00\x01", (addr, 53))
    u.recv(512)
    u.close()
    if churn:
        with open(f"{churn}/cgroup.procs", "w") as f:
            f.write(pid)
        os.rmdir(d)
        time.sleep(0.002)
print(n, flush=True)
"#;

/// The tests share pods A and B's cgroups and addresses: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test's world: the namespace, the scripts, the server, the API
/// server and the agent (torn down in that order, reversed).
struct World {
    agent: InProcess,
    cluster: Running,
    server: Child,
    dir: tempfile::TempDir,
    ns: Netns,
    /// db-0's container's cgroup, where the server runs.
    _b: PodCgroup,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Drop for World {
    fn drop(&mut self) {
        drop(self.server.stdin.take());
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// web-0's address.
const A_IP: &str = "10.93.0.1";
/// db-0's address, where the server answers.
const B_IP: &str = "10.93.0.2";

/// The cgroup of web-0's container `c` (the cgroupfs driver's path).
fn a_cgroup(c: &str) -> PodCgroup {
    cgroup_at(&format!("kubepods/burstable/pod{}/{c}", uid(1)), None)
}

/// db-0's container's cgroup (the systemd driver's path).
fn b_cgroup() -> PodCgroup {
    let u = uid(2).replace('-', "_");
    cgroup_at(&format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{}.scope", cid(2)), None)
}

/// A pod of this node with one container and an address.
fn pod(uid: &str, ns: &str, name: &str, container: &str, cid: &str, ip: &str) -> serde_json::Value {
    let mut p = node_agent_tests::apiserver::pod(uid, ns, name, NODE, container, cid);
    p["status"]["podIP"] = ip.into();
    p["status"]["podIPs"] = serde_json::json!([{ "ip": ip }]);
    p
}

/// web-0 (container app) when `with_a`, and db-0 (container pg) at `b_ip`.
fn api(with_a: bool, b_ip: &str) -> std::sync::Arc<Api> {
    let api = std::sync::Arc::new(Api::new());
    {
        let mut st = api.state.lock().expect("state");
        api.put(&mut st, "pods", "db", "db-0", pod(&uid(2), "db", "db-0", "pg", &cid(2), b_ip), false);
        if with_a {
            api.put(&mut st, "pods", "web", "web-0", pod(&uid(1), "web", "web-0", "app", &cid(1), A_IP), false);
        }
    }
    api
}

impl World {
    /// The namespace with web-0's and db-0's addresses on its loopback, the
    /// server running in db-0's cgroup there, the agent with `flags`.
    fn new(tag: &str, api: std::sync::Arc<Api>, flags: &[&str]) -> Option<World> {
        if !root_or_skip("the peers lifecycle truth tests") {
            return None;
        }
        let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let b = b_cgroup();
        let ns = Netns::new(tag);
        ns.batch(&format!("link set lo up\naddr add {A_IP}/32 dev lo\naddr add {B_IP}/32 dev lo\n"));
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("server.py"), SERVER).expect("server script");
        std::fs::write(dir.path().join("client.py"), CLIENT).expect("client script");
        let mut server = b
            .command(&format!("ip netns exec {} python3 {}", ns.0, dir.path().join("server.py").display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("server");
        let mut line = String::new();
        BufReader::new(server.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("server ready");
        assert_eq!(line.trim(), "ready");
        let cluster = Running::start(api).expect("API server");
        let mut all = vec![
            "--collector.disable-defaults".to_string(),
            "--collector.ebpf_pods".into(),
            "--collector.ebpf_tcp_peers".into(),
            "--collector.ebpf_dns".into(),
            format!("--collector.ebpf_pods.kubeconfig={}", cluster.kubeconfig.path().display()),
            format!("--collector.ebpf_pods.node-name={NODE}"),
        ];
        all.extend(flags.iter().map(|f| f.to_string()));
        let agent = InProcess::start(&all, &["ebpf_pods", "ebpf_tcp_peers", "ebpf_dns"]);
        agent.assert_up(&["tcp_peers_set_state", "dns_egress", "dns_ingress"], "CAP_BPF, CAP_NET_ADMIN and the kernel's BTF");
        agent.wait_for_pods_and_services("node_ebpf_tcp_peers_tracked", 0.0);
        Some(World { agent, cluster, server, dir, ns, _b: b, _turn: turn })
    }

    /// Runs the client in `cgroup` (and the namespace) against `addr`.
    fn client(&self, cgroup: &PodCgroup, addr: &str, n: u32, churn: Option<&std::path::Path>) {
        let churn = churn.map(|c| format!(" {}", c.display())).unwrap_or_default();
        let script = self.dir.path().join("client.py");
        let out = cgroup
            .command(&format!("python3 {} /run/netns/{} {addr} {n}{churn}", script.display(), self.ns.0))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("client");
        assert!(out.status.success(), "client: {} {}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), n.to_string());
    }

    /// `family`'s samples of (`ns`, `pod`), summed by the label `by`.
    fn sum_by(&self, family: &str, ns: &str, pod: &str, by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (l, v) in self.agent.samples(family) {
            if l.get("namespace").map(String::as_str) == Some(ns) && l.get("pod").map(String::as_str) == Some(pod) {
                *out.entry(l.get(by).cloned().unwrap_or_default()).or_insert(0.0) += v;
            }
        }
        out
    }

    /// The pod's connects started to `peer`, and its DNS queries to `peer`.
    fn connects_and_queries(&self, ns: &str, pod: &str, peer: &str) -> (f64, f64) {
        let connects = self.sum_by("node_ebpf_pod_tcp_peer_connect_attempts_total", ns, pod, "peer").get(peer).copied().unwrap_or(0.0);
        let queries = self.sum_by("node_ebpf_pod_dns_queries_total", ns, pod, "server").get(peer).copied().unwrap_or(0.0);
        (connects, queries)
    }

    /// `family`'s samples summed by the label `by`, whatever the pod.
    fn by(&self, family: &str, by: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (l, v) in self.agent.samples(family) {
            *out.entry(l.get(by).cloned().unwrap_or_default()).or_insert(0.0) += v;
        }
        out
    }

    fn tracked(&self, family: &str, what: &str) -> f64 {
        self.agent.samples(family).into_iter().find(|(l, _)| l.get("what").map(String::as_str) == Some(what)).map_or(0.0, |s| s.1)
    }
}

/// An init container of pod A lives a few seconds, makes 10 connects and
/// 10 DNS queries, and its cgroup goes, all between two scrapes: every one
/// is web-0's (its init containers are a large share of a cluster's DNS
/// and TCP, as are Jobs' and CronJobs' pods).
#[test]
fn an_init_container_gone_between_two_scrapes_is_counted_for_its_pod() {
    let init_cid = cid(3);
    let api = api(true, B_IP);
    {
        let mut st = api.state.lock().expect("state");
        let key = ("pods".to_string(), "web".to_string(), "web-0".to_string());
        let mut p = st.objects.get(&key).cloned().expect("pod A");
        p["spec"]["initContainers"] = serde_json::json!([{"name": "init", "image": "x"}]);
        p["status"]["initContainerStatuses"] = serde_json::json!([{
            "name": "init", "containerID": format!("containerd://{init_cid}"), "image": "x", "imageID": "x",
            "ready": true, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}
        }]);
        api.put(&mut st, "pods", "web", "web-0", p, false);
    }
    let Some(w) = World::new("init", api, &[]) else { return };
    let before = w.connects_and_queries("web", "web-0", "db/db-0");
    {
        let init = a_cgroup(&init_cid);
        w.client(&init, B_IP, 10, None);
        // The init container's cgroup goes here, with no scrape since it was made.
    }
    assert!(!v2_root().join(format!("kubepods/burstable/pod{}/{init_cid}", uid(1))).exists(), "the init container's cgroup is gone");
    let after = w.connects_and_queries("web", "web-0", "db/db-0");
    let host = w.connects_and_queries("", "", "db/db-0");
    eprintln!("web-0 to db-0: connects and queries {before:?} -> {after:?}; the host's {host:?}");
    assert_eq!(after.0 - before.0, 10.0, "every connect of the init container is web-0's");
    assert_eq!(after.1 - before.1, 10.0, "every query of the init container is web-0's");
}

/// The API server is out of reach for longer than the grace period while a
/// new pod (not listed before) makes 10 connects and 10 queries; then 5
/// more once it is listed: all 15 and 15 are its own, none dropped.
#[test]
fn counts_of_a_pod_made_during_an_api_outage_longer_than_the_grace_period_wait_for_it() {
    let Some(w) = World::new("outage", api(false, B_IP), &["--collector.ebpf_pods.grace-period=3s"]) else { return };
    let faults = &w.cluster.api.pod_faults;
    faults.unreachable.store(true, Ordering::Relaxed);
    w.cluster.api.changed.notify_waiters();
    {
        let api = &w.cluster.api;
        let mut st = api.state.lock().expect("state");
        api.put(&mut st, "pods", "web", "web-0", pod(&uid(1), "web", "web-0", "app", &cid(1), A_IP), false);
    }
    let a = a_cgroup(&cid(1));
    w.client(&a, B_IP, 10, None);
    // Scraped all along for twice the grace period: the counts wait.
    let t = Instant::now();
    let mut waited = (0.0, 0.0);
    while t.elapsed() < Duration::from_secs(6) {
        waited = (w.tracked("node_ebpf_tcp_peers_tracked", "pending_cgroups"), w.tracked("node_ebpf_dns_tracked", "pending_cgroups"));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(w.connects_and_queries("web", "web-0", "db/db-0"), (0.0, 0.0), "web-0 is not known yet");
    faults.unreachable.store(false, Ordering::Relaxed);
    // Listed again once the watch's backoff is over.
    let t = Instant::now();
    while !w
        .agent
        .samples("node_ebpf_pod_tcp_peer_connect_attempts_total")
        .iter()
        .any(|(l, _)| l.get("pod").map(String::as_str) == Some("web-0"))
    {
        assert!(t.elapsed() < Duration::from_secs(60), "web-0 was never listed after the outage");
        std::thread::sleep(Duration::from_millis(200));
    }
    w.client(&a, B_IP, 5, None);
    let got = w.connects_and_queries("web", "web-0", "db/db-0");
    let dropped = w.by("node_ebpf_pod_attribution_unattributed_cgroups_total", "collector");
    eprintln!("pending during the outage (tcp, dns) {waited:?}; web-0 to db-0 after it {got:?}; unattributed {dropped:?}");
    assert!(waited.0 >= 1.0 && waited.1 >= 1.0, "web-0's cgroup waited for its pod in both collectors: {waited:?}");
    assert_eq!(got, (15.0, 15.0), "every connect and query is web-0's");
}

/// 3,000 short-lived host cgroups (timer units, sessions, nested
/// containers), one connect and one query each: every one is the host's,
/// and what the agent keeps follows only the cgroups of the last interval
/// (it rose by about 2.8 KB per gone cgroup, for good).
#[test]
fn thousands_of_short_lived_host_cgroups_are_the_hosts_and_leave_nothing_behind() {
    let Some(w) = World::new("churn", api(false, B_IP), &[]) else { return };
    // Not a pod's: the host's (the churning cgroups are made in it).
    let host = cgroup_at(&format!("na-churn-{}", std::process::id()), None);
    let churn = host.v2.clone();
    let before = w.connects_and_queries("", "", "db/db-0");
    let entries = || {
        let e = w.by("node_ebpf_map_entries", "map");
        (e.get(agent_common::tcp_peers::STATS).copied().unwrap_or(0.0), e.get(agent_common::dns::STATS).copied().unwrap_or(0.0))
    };
    let tracked_now = || (w.tracked("node_ebpf_tcp_peers_tracked", "peers"), w.tracked("node_ebpf_dns_tracked", "servers"));
    let (entries0, tracked0) = (entries(), tracked_now());
    // Scraped all along, as Prometheus would (every 250 ms here).
    let mut peaks = (0.0f64, 0.0f64);
    std::thread::scope(|s| {
        let client = s.spawn(|| w.client(&host, B_IP, 3000, Some(&churn)));
        while !client.is_finished() {
            peaks.0 = peaks.0.max(w.tracked("node_ebpf_tcp_peers_tracked", "peers"));
            peaks.1 = peaks.1.max(w.tracked("node_ebpf_dns_tracked", "servers"));
            std::thread::sleep(Duration::from_millis(250));
        }
        if let Err(e) = client.join() {
            std::panic::resume_unwind(e);
        }
    });
    // Two passes: the last cgroups' entries are idle, then taken out.
    let _ = w.agent.samples("node_ebpf_tcp_peers_tracked");
    let _ = w.agent.samples("node_ebpf_tcp_peers_tracked");
    let after = w.connects_and_queries("", "", "db/db-0");
    let (tracked, entries1) = (tracked_now(), entries());
    drop(host);
    eprintln!(
        "the host to db-0: {before:?} -> {after:?}; peers tracked (tcp, dns) {tracked0:?} -> {tracked:?} (at most {peaks:?} while \
         churning); kernel entries {entries0:?} -> {entries1:?}"
    );
    assert_eq!(after.0 - before.0, 3000.0, "every connect is the host's");
    assert_eq!(after.1 - before.1, 3000.0, "every query is the host's");
    assert!(tracked.0 - tracked0.0 <= 10.0 && tracked.1 - tracked0.1 <= 10.0, "peers kept per owner and peer, not per gone cgroup");
    assert!(
        entries1.0 - entries0.0 <= 100.0 && entries1.1 - entries0.1 <= 100.0,
        "the kernel's maps hold the last interval's entries only"
    );
}

/// A connection to pod B from the node's own address (the kubelet's
/// probes come from it): B's accepted connection is from `node`, named by
/// the node's name, not from the outside world.
#[test]
fn connections_from_the_nodes_own_address_are_the_nodes() {
    let Some(w) = World::new("node", api(false, "10.94.0.2"), &[]) else { return };
    // A veth from the agent's network namespace (the node's) to the test's:
    // 10.94.0.1 is an address of the node, 10.94.0.2 db-0's.
    let (here, there) = (format!("na-n{}", std::process::id() % 100_000), format!("na-p{}", std::process::id() % 100_000));
    struct Link(String);
    impl Drop for Link {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }
    node_agent_tests::netns::ip(&["link", "add", &here, "type", "veth", "peer", "name", &there]);
    let _link = Link(here.clone());
    node_agent_tests::netns::ip(&["link", "set", &there, "netns", &w.ns.0]);
    node_agent_tests::netns::ip(&["addr", "add", "10.94.0.1/24", "dev", &here]);
    node_agent_tests::netns::ip(&["link", "set", &here, "up"]);
    w.ns.batch(&format!("addr add 10.94.0.2/24 dev {there}\nlink set {there} up\n"));
    w.ns.wait_until_up(&there);
    // The probes: 5 connects from the node (the test's own cgroup, in the
    // node's namespace) to pod B's server, which accepts them.
    for _ in 0..5 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::net::TcpStream::connect_timeout(&"10.94.0.2:8080".parse().expect("address"), Duration::from_secs(1)) {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "connect to pod B from the node: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let accepted: Vec<_> = w
        .agent
        .samples("node_ebpf_pod_tcp_peer_accepted_total")
        .into_iter()
        .filter(|(l, _)| l.get("pod").map(String::as_str) == Some("db-0"))
        .collect();
    eprintln!("db-0's accepted connections: {accepted:?}");
    let from_node: f64 = accepted
        .iter()
        .filter(|(l, _)| l.get("peer_kind").map(String::as_str) == Some("node") && l.get("peer").map(String::as_str) == Some(NODE))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(from_node, 5.0, "db-0 accepted 5 connections from the node {NODE}");
    assert!(!accepted.iter().any(|(l, _)| l.get("peer_kind").map(String::as_str) == Some("external")), "none from the outside world");
}
