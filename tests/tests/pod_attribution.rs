//! Pod attribution truth tests: cgroups made by the test under the real
//! cgroup v2 hierarchy with kubelet-style paths (one pod with the cgroupfs
//! driver's naming, one with the systemd driver's), an in-memory API server
//! over HTTP serving the matching pods of this node (and one of another
//! node), the real eBPF programs in this kernel, and real workloads in the
//! pods' cgroups. The numbers are checked against the kernel's own ground
//! truth: /proc/vmstat, /proc/PID/schedstat, /proc/diskstats.
//!
//! Root only (CAP_BPF, cgroups); outside CI without root they skip with a
//! message, in CI they must run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use expo::Format;
use node_agent_tests::apiserver::Running;
use node_agent_tests::host::{diskstats, kernel_or_skip, loop_device, root_or_skip, vmstat};
use node_agent_tests::pods::{api, failing_opens, pod_cgroup, v2_root, PodCgroup, CID_A, NODE, UID_A};
use runtime::{Scraper, Selection};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cluster() -> Running {
    Running::start(api()).expect("API server")
}

/// One test's world, torn down in order: the agent, then the API server,
/// then the turn.
struct Truth {
    agent: Agent,
    cluster: Running,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// Takes the turn and starts the API server and the agent; None (skip)
/// when not root outside CI.
fn truth(grace: &str) -> Option<Truth> {
    truth_with(grace, &[])
}

/// The same, with more collectors or flags for the agent.
fn truth_with(grace: &str, flags: &[&str]) -> Option<Truth> {
    if !root_or_skip("pod attribution truth tests") {
        return None;
    }
    let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster();
    let agent = Agent::new(&cluster, grace, flags);
    Some(Truth { agent, cluster, _turn: turn })
}

/// The agent with only `ebpf_pods`, scraped in process.
struct Agent {
    scraper: Scraper,
}

impl Agent {
    fn new(c: &Running, grace: &str, flags: &[&str]) -> Agent {
        let mut args = vec![
            "node-agent".to_string(),
            "--collector.disable-defaults".into(),
            "--collector.ebpf_pods".into(),
            "--collector.pod_cpu_throttling".into(),
            "--collector.pod_tcp_listen".into(),
            format!("--collector.ebpf_pods.kubeconfig={}", c.kubeconfig.path().display()),
            format!("--collector.ebpf_pods.node-name={NODE}"),
            format!("--collector.ebpf_pods.grace-period={grace}"),
        ];
        args.extend(flags.iter().map(|f| f.to_string()));
        let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
        let cfg = node_agent::config::resolve(&m).expect("config");
        let a = Agent { scraper: node_agent::agent::scraper(cfg.collectors, false) };
        let programs = a.samples("node_ebpf_program_up");
        // Before Linux 6.5 there is no block_io_start tracepoint, and no
        // pod block I/O programs (pod_io_start and the two bio merges).
        let least = if node_agent::ebpf::kernel::Kernel::get().at_least(6, 5) { 8 } else { 5 };
        assert!(programs.len() >= least, "pod attribution programs: {programs:?}");
        for (labels, v) in programs {
            assert_eq!(v, 1.0, "eBPF program down: {labels:?}");
        }
        let t = Instant::now();
        while a.value("node_ebpf_pod_attribution_synced", &[]) != 1.0 {
            assert!(t.elapsed() < Duration::from_secs(20), "the pods of {NODE} were never listed");
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    fn samples(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let text = String::from_utf8(self.scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8");
        assert!(text.contains("node_scrape_collector_success{collector=\"ebpf_pods\"} 1"), "ebpf_pods failed:\n{text}");
        for c in ["pod_cpu_throttling", "pod_tcp_listen"] {
            assert!(text.contains(&format!("node_scrape_collector_success{{collector=\"{c}\"}} 1")), "{c} failed:\n{text}");
        }
        node_agent_tests::samples(&text, name)
    }

    /// The sample whose labels include `labels`; 0 when absent.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .into_iter()
            .find(|(l, _)| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map_or(0.0, |(_, v)| v)
    }

    /// One pod's value (`ns`, `pod` empty: the host).
    fn pod(&self, name: &str, ns: &str, pod: &str) -> f64 {
        self.value(name, &[("namespace", ns), ("pod", pod)])
    }
}

/// OOM kills the kernel counted for a pod's memory cgroup (`oom_kill` of
/// memory.events in cgroup v2, of memory.oom_control in v1's hierarchy).
fn pod_oom_kills(pod: &PodCgroup) -> u64 {
    let text = match &pod.memory {
        Some(v1) => std::fs::read_to_string(v1.join("memory.oom_control")),
        None => std::fs::read_to_string(pod.v2.join("memory.events")),
    }
    .expect("the pod's memory.events or memory.oom_control");
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok()).expect("an oom_kill count")
}

/// Pod A's container, limited to 32 MiB, runs a memory hog that is
/// OOM-killed: its cgroup counts exactly one kill, and so must web-0/app;
/// db-0 (idle) none. The host's series (kills outside any pod) is
/// node-wide: every other kill of the node meanwhile, which /proc/vmstat's
/// oom_kill (read before the agent and after) counts with the pod's, may be
/// in it, and nothing else: exactly 0 when the node had no other kill.
#[test]
fn oom_kill_counted_for_its_pod_and_container_only() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', Some(32 << 20));
    let b = pod_cgroup('B', None);
    let oom = |ns: &str, pod: &str, container: &str| {
        agent.value("node_ebpf_pod_oom_kills_total", &[("namespace", ns), ("pod", pod), ("container", container)])
    };
    let (vm0, own0) = (vmstat("oom_kill"), pod_oom_kills(&a));
    let (a0, b0, host0) = (oom("web", "web-0", "app"), oom("db", "db-0", "pg"), oom("", "", ""));
    assert_eq!((a0, b0), (0.0, 0.0), "series exist at 0 from the start");
    let mut idle = b.spawn("sleep 30");
    // `tail` keeps the endless line of /dev/zero in memory until killed.
    let status = a.spawn("tail /dev/zero").wait().expect("memory hog");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the memory hog was not OOM-killed: {status:?}");
    std::thread::sleep(Duration::from_millis(200));
    let (a1, b1, host1) = (oom("web", "web-0", "app"), oom("db", "db-0", "pg"), oom("", "", ""));
    let (vm, own) = (vmstat("oom_kill") - vm0, pod_oom_kills(&a) - own0);
    let _ = idle.kill();
    let _ = idle.wait();
    eprintln!(
        "web-0's cgroup oom_kill +{own}, /proc/vmstat oom_kill +{vm}; web-0/app +{}, db-0/pg +{}, host +{}",
        a1 - a0,
        b1 - b0,
        host1 - host0
    );
    assert_eq!(own, 1, "exactly one OOM kill in web-0's cgroup");
    assert_eq!(a1 - a0, 1.0, "the kill belongs to web-0/app");
    assert_eq!(b1 - b0, 0.0, "and not to db-0");
    assert!(vm >= own, "/proc/vmstat counts every kill of the node");
    assert!(host1 - host0 <= (vm - own) as f64, "the host's kills are the node's other kills: +{} of {}", host1 - host0, vm - own);
}

/// A container OOM-killed a moment after it started, its cgroup gone
/// before any scrape saw it (a crash loop at a 15-30 s scrape interval):
/// the kill is its pod's and container's, named by the path its cgroup had
/// when it was made.
#[test]
fn oom_kill_of_a_container_gone_before_any_scrape_is_its_pods() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let oom = || agent.value("node_ebpf_pod_oom_kills_total", &[("namespace", "web"), ("pod", "web-0"), ("container", "app")]);
    let host = || agent.value("node_ebpf_pod_oom_kills_total", &[("namespace", ""), ("pod", "")]);
    // A container of its own (the restarted "app" of web-0), so that its
    // cgroup is made and removed by this test whatever other tests left.
    const CID_OOM: &str = "cccc1111dddd2222eeee3333ffff4444aaaa5555bbbb6666cccc7777dddd8888";
    {
        let api = &t.cluster.api;
        let mut st = api.state.lock().expect("state");
        let p = node_agent_tests::apiserver::pod(UID_A, "web", "web-0", NODE, "app", CID_OOM);
        api.put(&mut st, "pods", "web", "web-0", p, false);
    }
    let (a0, host0, vm0) = (oom(), host(), vmstat("oom_kill"));
    {
        let a = node_agent_tests::pods::cgroup_at(&format!("kubepods/burstable/pod{UID_A}/{CID_OOM}"), Some(32 << 20));
        let status = a.spawn("tail /dev/zero").wait().expect("memory hog");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "the memory hog was not OOM-killed: {status:?}");
        assert_eq!(pod_oom_kills(&a), 1, "exactly one OOM kill in the container's cgroup");
        // The cgroup goes here, with no scrape since it was made.
    }
    assert!(!v2_root().join(format!("kubepods/burstable/pod{UID_A}/{CID_OOM}")).exists(), "the container's cgroup is gone");
    let (a1, host1, vm) = (oom(), host(), vmstat("oom_kill") - vm0);
    eprintln!("web-0/app +{}, host +{}, /proc/vmstat oom_kill +{vm}", a1 - a0, host1 - host0);
    assert_eq!(a1 - a0, 1.0, "the kill is web-0/app's");
    assert!(host1 - host0 <= (vm - 1) as f64, "and not the host's");
}

/// Run-queue wait of a task: /proc/PID/schedstat's second field, in ns.
fn run_delay_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

#[test]
fn cpu_contention_is_the_contending_pods_runqueue_wait() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let b = pod_cgroup('B', None);
    let wait = |ns: &str, p: &str| agent.pod("node_ebpf_pod_runqueue_wait_seconds_total", ns, p);
    let (a0, b0) = (wait("web", "web-0"), wait("db", "db-0"));
    // Three busy loops share CPU 0 in pod A; pod B sleeps.
    let mut busy: Vec<Child> = (0..3).map(|_| a.spawn("taskset -c 0 /bin/sh -c 'while :; do :; done'")).collect();
    let mut sleeper = b.spawn("sleep 1.5");
    std::thread::sleep(Duration::from_millis(1500));
    // The truth, read right before the loops end.
    let truth: u64 = busy.iter().map(|c| run_delay_ns(c.id())).sum();
    for c in &mut busy {
        let _ = c.kill();
    }
    for c in &mut busy {
        let _ = c.wait();
    }
    let _ = sleeper.wait();
    let (a1, b1) = (wait("web", "web-0"), wait("db", "db-0"));
    let (got, truth_s) = (a1 - a0, truth as f64 / 1e9);
    eprintln!("web-0 waited {got:.3}s (schedstat of its tasks {truth_s:.3}s); db-0 waited {:.6}s", b1 - b0);
    assert!(truth_s > 1.0, "three loops on one CPU for 1.5 s wait about 3 s in all, schedstat says {truth_s}");
    assert!(got >= truth_s * 0.9 && got <= truth_s * 1.1 + 0.05, "eBPF {got:.3}s vs schedstat {truth_s:.3}s");
    assert!(b1 - b0 < 0.05, "the sleeping pod hardly waited: {}", b1 - b0);
    assert!(agent.pod("node_ebpf_pod_runqueue_waits_total", "web", "web-0") >= 3.0);
}

#[test]
fn direct_io_bytes_are_the_writing_pods() {
    let Some(t) = truth("5m") else { return };
    // docs/ebpf.md: the pod's block I/O bytes need Linux 6.5.
    if !kernel_or_skip(6, 5, "a pod's block I/O bytes") {
        return;
    }
    let agent = &t.agent;
    let lo = loop_device();
    let a = pod_cgroup('A', None);
    let bytes = |ns: &str, p: &str, op: &str| {
        agent.value("node_ebpf_pod_block_io_bytes_total", &[("namespace", ns), ("pod", p), ("operation", op)])
    };
    let before = [bytes("web", "web-0", "write"), bytes("web", "web-0", "read"), bytes("db", "db-0", "write"), bytes("db", "db-0", "read")];
    let d0 = diskstats(&lo.dev);
    let dev = format!("/dev/{}", lo.dev);
    let ok = a.spawn(&format!("dd if=/dev/zero of={dev} bs=64k count=64 oflag=direct")).wait().expect("dd write").success();
    assert!(ok, "dd write");
    let ok = a.spawn(&format!("dd if={dev} of=/dev/null bs=64k count=32 iflag=direct")).wait().expect("dd read").success();
    assert!(ok, "dd read");
    let d1 = diskstats(&lo.dev);
    let (sectors_read, sectors_written) = (d1[2] - d0[2], d1[6] - d0[6]);
    let after = [bytes("web", "web-0", "write"), bytes("web", "web-0", "read"), bytes("db", "db-0", "write"), bytes("db", "db-0", "read")];
    let d: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    eprintln!(
        "{}: diskstats read {} B, written {} B; web-0 read {} B, wrote {} B; db-0 {} / {}",
        lo.dev,
        sectors_read * 512,
        sectors_written * 512,
        d[1],
        d[0],
        d[3],
        d[2]
    );
    assert_eq!(sectors_written * 512, 4 << 20, "dd wrote 4 MiB");
    assert_eq!(d[0], (4u64 << 20) as f64, "web-0 wrote what dd wrote");
    assert_eq!(sectors_read * 512, 2 << 20, "dd read 2 MiB");
    // Reads may include the pod's own program files, if not cached.
    assert!(d[1] >= (2u64 << 20) as f64 && d[1] <= (3u64 << 20) as f64, "web-0 read {} B", d[1]);
    assert_eq!((d[2], d[3]), (0.0, 0.0), "db-0 did no I/O");
}

#[test]
fn syscall_errors_are_the_failing_pods() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let b = pod_cgroup('B', None);
    let errs = |ns: &str, p: &str| agent.pod("node_ebpf_pod_syscall_errors_total", ns, p);
    let (a0, b0) = (errs("web", "web-0"), errs("db", "db-0"));
    // The same shell in both pods, failing 500 times in A and never in B:
    // the difference is exactly A's 500 failures.
    let _ = a.spawn(&failing_opens(500)).wait();
    let _ = b.spawn(&failing_opens(0)).wait();
    let (da, db) = (errs("web", "web-0") - a0, errs("db", "db-0") - b0);
    eprintln!("web-0 failed syscalls +{da}, db-0 +{db}: difference {}", da - db);
    assert!(db > 0.0, "starting a shell fails a few syscalls (loader probes)");
    assert!((da - db - 500.0).abs() <= 2.0, "web-0 failed 500 more than db-0: {da} vs {db}");
}

/// With ebpf_syscall_latency on (threshold 100 ms): pod A sleeps 250 ms
/// three times (sleep exec'd in the pod: one clock_nanosleep each), pod B
/// sleeps 0 s three times: A's slow syscalls rise by exactly 3, B's by 0.
#[test]
fn slow_syscalls_are_the_sleeping_pods() {
    let Some(t) = truth_with("5m", &["--collector.ebpf_syscall_latency", "--collector.ebpf_syscall_latency.slow-threshold=100ms"]) else {
        return;
    };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let b = pod_cgroup('B', None);
    let slow = |ns: &str, p: &str| agent.pod("node_ebpf_pod_slow_syscalls_total", ns, p);
    let (a0, b0) = (slow("web", "web-0"), slow("db", "db-0"));
    for _ in 0..3 {
        assert!(a.spawn("sleep 0.25").wait().expect("sleep").success());
        assert!(b.spawn("sleep 0").wait().expect("sleep").success());
    }
    let (da, db) = (slow("web", "web-0") - a0, slow("db", "db-0") - b0);
    eprintln!("slow syscalls: web-0 +{da}, db-0 +{db}");
    assert_eq!((da, db), (3.0, 0.0), "web-0 slept 3 times 250 ms, db-0 never slept");
}

/// The kernel's cgroup table full (filled from outside through the map's
/// id): the new pod's events are counted as dropped, nothing is
/// misattributed, and the scrape keeps succeeding; the fillers, idle, are
/// taken out by the agent after a pass, and counting resumes.
#[test]
fn full_cgroup_table_counts_dropped_events_and_keeps_serving() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let id = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str() == Some(agent_common::pods::STATS))
        .map(|m| m.id())
        .max()
        .expect("POD_STATS is loaded");
    let data = aya::maps::MapData::from_id(id).expect("open POD_STATS by id");
    let mut table: aya::maps::HashMap<_, u64, agent_common::pods::PodCounters> =
        aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).expect("map")).expect("a hash map");
    let dropped = || agent.value("node_ebpf_events_dropped_total", &[("probe", "pods")]);
    let (d0, e0) = (dropped(), agent.pod("node_ebpf_pod_syscall_errors_total", "web", "web-0"));
    // Filled with no scrape in between: the agent has not seen the fillers yet.
    let mut filled = 0u32;
    for k in 0..agent_common::pods::MAX_CGROUPS as u64 {
        if table.insert(u64::MAX - k, agent_common::pods::PodCounters::default(), 1 /* BPF_NOEXIST */).is_ok() {
            filled += 1;
        }
    }
    assert!(table.insert(1u64 << 62, agent_common::pods::PodCounters::default(), 1).is_err(), "the table is full");
    let _ = a.spawn(&failing_opens(300)).wait();
    let (d1, e1) = (dropped(), agent.pod("node_ebpf_pod_syscall_errors_total", "web", "web-0"));
    eprintln!("filled {filled} entries; dropped +{}, web-0 +{}", d1 - d0, e1 - e0);
    assert!(d1 - d0 >= 300.0, "web-0's failures had no entry to go to: dropped +{}", d1 - d0);
    assert_eq!(e1 - e0, 0.0, "nothing counted for web-0");
    // The fillers stayed unchanged over the pass between those two
    // scrapes: the agent took them out (a full table of idle entries
    // empties itself), and counting resumes without the test's help.
    let _ = a.spawn(&failing_opens(1)).wait();
    let left = table.keys().filter_map(Result::ok).filter(|k| *k > u64::MAX - agent_common::pods::MAX_CGROUPS as u64).count();
    assert!(
        agent.pod("node_ebpf_pod_syscall_errors_total", "web", "web-0") - e0 >= 1.0,
        "counting resumes once there is room ({left} fillers left)"
    );
    assert_eq!(left, 0, "every idle filler was taken out");
}

/// In a network namespace of its own: a connection over lo whose receiver
/// drops every segment for 1.7 s (a classic BPF socket filter), so the
/// sender retransmits; prints the namespace's RetransSegs and
/// TCPRetransFail increases.
const RETRANSMIT: &str = r#"
import ctypes, socket, struct, time
def counter(path, prefix, name):
    lines = [l.split() for l in open(path) if l.startswith(prefix)]
    return int(lines[1][lines[0].index(name)])
def retrans():
    return counter("/proc/net/snmp", "Tcp:", "RetransSegs")
def fails():
    return counter("/proc/net/netstat", "TcpExt:", "TCPRetransFail")
before, fails_before = retrans(), fails()
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname()); conn, _ = srv.accept()
cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
drop_all = (ctypes.c_uint64 * 1)(6)  # { code: BPF_RET|BPF_K, k: 0 }
conn.setsockopt(socket.SOL_SOCKET, 26, struct.pack("HL", 1, ctypes.addressof(drop_all)))  # SO_ATTACH_FILTER
cli.send(b"hello")
time.sleep(1.7)
conn.setsockopt(socket.SOL_SOCKET, 27, struct.pack("i", 0))  # SO_DETACH_FILTER
conn.settimeout(10)
got = b""
while len(got) < 5:
    got += conn.recv(5)
assert got == b"hello"
cli.close(); conn.close(); srv.close()
time.sleep(0.3)
print(retrans() - before, fails() - fails_before)
"#;

#[test]
fn tcp_retransmits_are_the_sending_pods() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), RETRANSMIT).expect("write script");
    let retrans = |ns: &str, p: &str| agent.pod("node_ebpf_pod_tcp_retransmits_total", ns, p);
    // Runs of the retransmit program the kernel skipped (another run of it
    // on that CPU, from anywhere on the node): events no probe saw.
    let misses = || -> f64 {
        let runs: Vec<f64> = agent
            .samples("node_ebpf_program_misses_total")
            .into_iter()
            .filter(|(l, _)| l.get("program").is_some_and(|p| p.contains("retransmit")))
            .map(|(_, v)| v)
            .collect();
        assert!(!runs.is_empty(), "the retransmit program's misses are exported");
        runs.iter().sum()
    };
    let (a0, b0, m0) = (retrans("web", "web-0"), retrans("db", "db-0"), misses());
    let child = a.spawn_piped(&format!("unshare -n /bin/sh -c 'ip link set lo up && exec python3 {}'", script.path().display()));
    let out = child.wait_with_output().expect("retransmitting workload");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "workload failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    let truth: Vec<f64> = text.split_whitespace().map(|n| n.parse().expect("a counter delta")).collect();
    let [segs, fails] = truth[..] else { panic!("RetransSegs and TCPRetransFail deltas, got {text:?}") };
    let (da, db, missed) = (retrans("web", "web-0") - a0, retrans("db", "db-0") - b0, misses() - m0);
    eprintln!("RetransSegs of web-0's namespace +{segs} (TCPRetransFail +{fails}); web-0 +{da}, db-0 +{db}; program misses +{missed}");
    assert!(segs >= 2.0, "the dropped segment was retransmitted: {segs}");
    // The probe counts retransmits that went out; RetransSegs also counts
    // those whose transmit then failed (TCPRetransFail), and a run the
    // kernel skipped is in the misses. With neither, the count is exact.
    assert!(
        da <= segs && da >= segs - fails - missed,
        "every retransmit of the namespace is web-0's sockets', less failed and missed ones"
    );
    if fails == 0.0 && missed == 0.0 {
        assert_eq!(da, segs, "every retransmit of the namespace is web-0's sockets'");
    }
    assert_eq!(db, 0.0);
}

/// In a network namespace of its own: 50 datagrams over lo to a bound UDP
/// socket whose classic BPF filter drops everything; prints the
/// namespace's `Udp: InErrors` increase.
const FILTERED: &str = r#"
import ctypes, socket, struct, time
def in_errors():
    lines = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
    return int(lines[1][lines[0].index("InErrors")])
before = in_errors()
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(("127.0.0.1", 0))
drop_all = (ctypes.c_uint64 * 1)(6)  # { code: BPF_RET|BPF_K, k: 0 }
rx.setsockopt(socket.SOL_SOCKET, 26, struct.pack("HL", 1, ctypes.addressof(drop_all)))  # SO_ATTACH_FILTER
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(50):
    tx.sendto(b"x", rx.getsockname())
time.sleep(0.2)
print(in_errors() - before)
"#;

/// Packets dropped at a pod's socket are the pod's (kfree_skb's receiving
/// socket, whose cgroup is the pod's), exactly as many as its namespace
/// counts.
/// In its own network namespace: 10 connects to a closed port (refused),
/// then 5 connections on loopback with one exchange each; prints the
/// refused count.
const CONNECTS: &str = r#"
import socket
probe = socket.socket()
probe.bind(("127.0.0.1", 0))
port = probe.getsockname()[1]
probe.close()
refused = 0
for _ in range(10):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except ConnectionRefusedError:
        refused += 1
    s.close()
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(16)
for _ in range(5):
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    c.sendall(b"ping")
    a.recv(4)
    a.sendall(b"pong")
    c.recv(4)
    c.close()
    a.close()
print(refused)
"#;

#[test]
fn tcp_connect_failures_and_rtt_are_the_connecting_pods() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), CONNECTS).expect("write script");
    let read = |ns: &str, p: &str| {
        (
            agent.pod("node_ebpf_pod_tcp_connect_failures_total", ns, p),
            agent.pod("node_ebpf_pod_tcp_rtt_samples_total", ns, p),
            agent.pod("node_ebpf_pod_tcp_rtt_seconds_total", ns, p),
        )
    };
    let (a0, b0) = (read("web", "web-0"), read("db", "db-0"));
    let child = a.spawn_piped(&format!("unshare -n /bin/sh -c 'ip link set lo up && exec python3 {}'", script.path().display()));
    let out = child.wait_with_output().expect("connecting workload");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "workload failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    let refused: f64 = text.trim().parse().expect("refused count");
    std::thread::sleep(Duration::from_millis(100));
    let (a1, b1) = (read("web", "web-0"), read("db", "db-0"));
    let (failures, samples, rtt) = (a1.0 - a0.0, a1.1 - a0.1, a1.2 - a0.2);
    eprintln!(
        "refused {refused}; web-0: failures +{failures}, RTT samples +{samples} summing {rtt:.6}s; db-0 +{:?}",
        (b1.0 - b0.0, b1.1 - b0.1)
    );
    assert_eq!(refused, 10.0);
    assert_eq!(failures, refused, "every refused connect is web-0's");
    // Each of the 5 connections: both sides when established and when
    // leaving ESTABLISHED.
    assert_eq!(samples, 20.0, "RTT samples");
    assert!(rtt > 0.0 && rtt < samples * 0.01, "loopback RTTs are microseconds: {rtt}s over {samples}");
    assert_eq!((b1.0 - b0.0, b1.1 - b0.1), (0.0, 0.0), "nothing of db-0's");
}

/// In its own network namespace: a listener with a backlog of 1 that never
/// accepts, and 6 connects to it, closed once they overflowed (else their
/// SYNs, sent again for seconds, overflow again); prints the namespace's
/// ListenOverflows, then waits for stdin to close (the scrapes read its
/// namespace meanwhile).
const OVERFLOWS: &str = r#"
import socket, sys, time
def overflows():
    lines = open("/proc/self/net/netstat").read().split("\n")
    for names, values in zip(lines[0::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:])))["ListenOverflows"]
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1)
kept = []
for _ in range(6):
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(l.getsockname())
    except BlockingIOError:
        pass
    kept.append(c)
    time.sleep(0.05)
time.sleep(0.3)
for c in kept:
    c.close()
time.sleep(0.1)
print(overflows(), flush=True)
sys.stdin.read()
"#;

#[test]
fn accept_queue_overflows_are_the_pods_namespaces() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), OVERFLOWS).expect("write script");
    let mut child = a
        .command(&format!("unshare -n /bin/sh -c 'ip link set lo up && exec python3 {}'", script.path().display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn in pod");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")), &mut line).expect("read");
    let truth: f64 = line.trim().parse().unwrap_or_else(|_| panic!("ListenOverflows, got {line:?}"));
    // The pods' tasks are looked for again when the pods change, a task
    // goes, or every WALK_EVERY: a task started since the last look is
    // found within that.
    let every = node_agent::probes::pod_tcp_listen::WALK_EVERY;
    let deadline = Instant::now() + every + Duration::from_secs(5);
    let exported = || !agent.samples("node_pod_tcp_listen_overflows_total").into_iter().all(|(l, _)| l["pod"] != "web-0");
    while !exported() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let got = agent.pod("node_pod_tcp_listen_overflows_total", "web", "web-0");
    let drops = agent.pod("node_pod_tcp_listen_drops_total", "web", "web-0");
    let others: Vec<_> = agent.samples("node_pod_tcp_listen_overflows_total").into_iter().filter(|(l, _)| l["pod"] != "web-0").collect();
    drop(child.stdin.take());
    let _ = child.wait();
    eprintln!("web-0's namespace: ListenOverflows {truth}; exported {got} (drops {drops}); other pods {others:?}");
    assert!(truth >= 3.0, "a backlog of 1 and 6 connects overflow: {truth}");
    assert_eq!(got, truth, "the pod's namespace's own count");
    assert!(drops >= got);
    assert!(others.is_empty(), "db-0 has no task, so no namespace to read: {others:?}");
}

/// A refused TCP connect and a DNS query (to a port nobody answers on),
/// so that the per-pod peer and DNS families have series.
const CONNECT_AND_QUERY: &str = r#"
import socket
s = socket.socket()
try:
    s.connect(("127.0.0.1", 9))
except OSError:
    pass
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x02ok\x00\x00\x01\x00\x01", ("127.0.0.1", 53))
"#;

/// The agent as deployed, every default collector and probe on, pod
/// attribution on, a pod with TCP and DNS traffic: every format's
/// exposition holds each series once (a duplicate series is an invalid
/// exposition, which Prometheus flags or drops), and every program has one
/// `node_ebpf_program_*` series.
#[test]
fn every_format_has_each_series_once_with_every_probe_and_pod_attribution() {
    if !root_or_skip("the exposition with every probe") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster();
    let args = [
        "node-agent".to_string(),
        format!("--collector.ebpf_pods.kubeconfig={}", cluster.kubeconfig.path().display()),
        format!("--collector.ebpf_pods.node-name={NODE}"),
    ];
    let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
    let cfg = node_agent::config::resolve(&m).expect("config");
    let scraper = node_agent::agent::scraper(cfg.collectors, false);
    let text = || String::from_utf8(scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8");
    let t = Instant::now();
    while !text().contains("node_ebpf_pod_attribution_synced 1") {
        assert!(t.elapsed() < Duration::from_secs(20), "the pods of {NODE} were never listed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = pod_cgroup('A', None);
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), CONNECT_AND_QUERY).expect("write script");
    let out = a.spawn_piped(&format!("python3 {}", script.path().display())).wait_with_output().expect("traffic");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The pod's cgroup is named within a second of its first counts.
    std::thread::sleep(Duration::from_millis(1500));
    let _ = text();
    let body = text();
    let up = node_agent_tests::samples(&body, "node_ebpf_program_up");
    let down: Vec<_> = up.iter().filter(|(_, v)| *v != 1.0).collect();
    assert!(down.is_empty(), "every program up as root: {down:?}");
    assert!(up.len() >= 20, "every probe's programs: {up:?}");
    for family in ["node_ebpf_pod_tcp_peer_connect_attempts_total", "node_ebpf_pod_dns_queries_total"] {
        let web = node_agent_tests::samples(&body, family).into_iter().filter(|(l, _)| l["pod"] == "web-0").count();
        assert!(web > 0, "web-0's {family} series: the per-pod families are in the exposition");
    }
    for format in [Format::Text, Format::OpenMetrics, Format::Protobuf] {
        let dups = node_agent_tests::duplicate_series(format, &scraper.scrape(&Selection::default(), format));
        assert!(dups.is_empty(), "{format:?}: series exposed more than once: {dups:#?}");
    }
}

/// A procfs as the agent is given one (`--path.procfs`) on a host whose
/// pid 1 cannot be read, even by root (EACCES on its `ns/net`): every
/// entry of /proc but `1`, as links; `add` links the pids started later.
struct ProcWithoutPid1(tempfile::TempDir);

impl ProcWithoutPid1 {
    fn new() -> ProcWithoutPid1 {
        let dir = tempfile::tempdir().expect("tempdir");
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let name = e.file_name();
            if name != "1" {
                let _ = std::os::unix::fs::symlink(Path::new("/proc").join(&name), dir.path().join(&name));
            }
        }
        ProcWithoutPid1(dir)
    }

    fn add(&self, pid: u32) {
        let _ = std::os::unix::fs::symlink(format!("/proc/{pid}"), self.0.path().join(pid.to_string()));
    }
}

/// web-0 runs on the host's network (`hostNetwork: true`, its task in the
/// node's namespace), db-0 in a namespace of its own, on a node whose pid
/// 1's namespace cannot be read: web-0 is left out (its counters would be
/// the host's `TcpExt` ones), db-0 is reported.
#[test]
fn host_network_pods_are_left_out_where_the_hosts_namespace_cannot_be_read() {
    let proc = ProcWithoutPid1::new();
    let Some(t) = truth_with("5m", &[&format!("--path.procfs={}", proc.0.path().display())]) else { return };
    {
        let api = &t.cluster.api;
        let mut st = api.state.lock().expect("state");
        let mut p = node_agent_tests::apiserver::pod(UID_A, "web", "web-0", NODE, "app", CID_A);
        p["spec"]["hostNetwork"] = true.into();
        api.put(&mut st, "pods", "web", "web-0", p, false);
    }
    let (a, b) = (pod_cgroup('A', None), pod_cgroup('B', None));
    let mut on_host = a.spawn("sleep 120");
    let mut own = b.spawn("unshare -n sleep 120");
    proc.add(on_host.id());
    proc.add(own.id());
    // The tasks are looked for at least every WALK_EVERY.
    let deadline = Instant::now() + node_agent::probes::pod_tcp_listen::WALK_EVERY + Duration::from_secs(5);
    let pods =
        || -> Vec<String> { t.agent.samples("node_pod_tcp_listen_overflows_total").into_iter().map(|(l, _)| l["pod"].clone()).collect() };
    while !pods().contains(&"db-0".to_string()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = pods();
    for c in [&mut on_host, &mut own] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(seen.contains(&"db-0".to_string()), "db-0's own namespace is reported: {seen:?}");
    assert!(!seen.contains(&"web-0".to_string()), "web-0 is on the host's network: {seen:?}");
}

#[test]
fn skb_drops_are_the_receiving_pods() {
    let Some(t) = truth("5m") else { return };
    // docs/ebpf.md: kfree_skb passes the receiving socket from Linux 6.9;
    // before, a received packet's drop is no pod's.
    if !kernel_or_skip(6, 9, "a received packet's drop counted for its receiving socket's pod") {
        return;
    }
    let agent = &t.agent;
    let a = pod_cgroup('A', None);
    let script = tempfile::NamedTempFile::new().expect("script");
    std::fs::write(script.path(), FILTERED).expect("write script");
    let drops = |ns: &str, p: &str| agent.pod("node_ebpf_pod_skb_drops_total", ns, p);
    let (a0, b0) = (drops("web", "web-0"), drops("db", "db-0"));
    let child = a.spawn_piped(&format!("unshare -n /bin/sh -c 'ip link set lo up && exec python3 {}'", script.path().display()));
    let out = child.wait_with_output().expect("dropping workload");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "workload failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    let truth: f64 = text.trim().parse().expect("InErrors delta");
    let (da, db) = (drops("web", "web-0") - a0, drops("db", "db-0") - b0);
    eprintln!("Udp InErrors of web-0's namespace +{truth}; web-0 +{da}, db-0 +{db}");
    assert_eq!(truth, 50.0, "the filter dropped every datagram");
    assert_eq!(da, truth, "every drop at web-0's socket is web-0's");
    assert_eq!(db, 0.0);
}

#[test]
fn only_this_nodes_pods_are_watched_and_deleted_pods_go_after_grace() {
    let Some(t) = truth("2s") else { return };
    let (c, agent) = (&t.cluster, &t.agent);
    let pods = |name: &str| -> Vec<String> {
        agent
            .samples(name)
            .into_iter()
            .map(|(l, _)| format!("{}/{}", l["namespace"], l["pod"]))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    assert_eq!(pods("node_ebpf_pod_syscall_errors_total"), ["/", "db/db-0", "web/web-0"], "the host and this node's pods only");
    let requests = c.api.requests.lock().expect("requests").clone();
    let pod_requests: Vec<&String> = requests.iter().filter(|r| r.contains("/api/v1/pods")).collect();
    assert!(!pod_requests.is_empty());
    for r in &pod_requests {
        assert!(
            r.starts_with("GET /api/v1/pods?") && r.contains("fieldSelector=spec.nodeName%3Dtruth-node"),
            "every pod request selects this node: {r}"
        );
    }
    assert!(pod_requests.iter().any(|r| r.contains("watch=true")), "the pods are watched: {pod_requests:?}");
    c.api.write("DELETE", "pods", "db", Some("db-0"), None, "", serde_json::Value::Null);
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert!(pods("node_ebpf_pod_syscall_errors_total").contains(&"db/db-0".to_string()), "kept within the grace period");
    while pods("node_ebpf_pod_syscall_errors_total").contains(&"db/db-0".to_string()) {
        assert!(t.elapsed() < Duration::from_secs(10), "db-0's series never went");
        std::thread::sleep(Duration::from_millis(100));
    }
    let gone_after = t.elapsed();
    eprintln!("db-0's series went {gone_after:?} after its deletion (grace 2s)");
    assert!(gone_after >= Duration::from_secs(2));
    assert_eq!(pods("node_ebpf_pod_oom_kills_total"), ["/", "web/web-0"]);
}

/// The hierarchy with the CPU controller, as the agent picks it: v2 when
/// its root offers `cpu`, else v1's `cpu` hierarchy. (root, is v2)
fn cpu_hierarchy() -> (PathBuf, bool) {
    let v2 = v2_root();
    if std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default().split_whitespace().any(|c| c == "cpu") {
        return (v2, true);
    }
    let v1 = ["cpu", "cpu,cpuacct"].iter().map(|n| Path::new("/sys/fs/cgroup").join(n)).find(|p| p.join("cpu.cfs_quota_us").exists());
    (v1.expect("a CPU controller in cgroup v2 or v1"), false)
}

/// cpu.stat's (nr_periods, nr_throttled, throttled time in ns).
fn cpu_stat(dir: &Path) -> (u64, u64, u64) {
    let text = std::fs::read_to_string(dir.join("cpu.stat")).expect("cpu.stat");
    let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    let ns = get("throttled_usec").map(|us| us * 1000).or_else(|| get("throttled_time")).expect("throttled time");
    (get("nr_periods").expect("nr_periods"), get("nr_throttled").expect("nr_throttled"), ns)
}

/// Pod A's container limited to 10 ms per 100 ms (its pod to 50 ms) runs a
/// busy loop for 1.5 s: the container is throttled in nearly every period,
/// for about 90 ms each, and the exported counters rise by exactly
/// cpu.stat's deltas; the pod, under its own larger limit, is not throttled.
#[test]
fn cpu_throttling_matches_cpu_stat() {
    let Some(t) = truth("5m") else { return };
    let agent = &t.agent;
    let (root, v2) = cpu_hierarchy();
    let rel = format!("kubepods/burstable/pod{UID_A}/{CID_A}");
    let mut made = Vec::new();
    let mut dir = root.clone();
    for c in rel.split('/') {
        if v2 {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+cpu");
        }
        dir.push(c);
        if !dir.exists() {
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            made.push(dir.clone());
        }
    }
    let cg = PodCgroup { made, v2: dir.clone(), memory: None };
    let pod_dir = dir.parent().expect("pod cgroup").to_path_buf();
    let limit = |d: &Path, quota: u64| {
        if v2 {
            std::fs::write(d.join("cpu.max"), format!("{quota} 100000")).expect("cpu.max");
        } else {
            std::fs::write(d.join("cpu.cfs_period_us"), "100000").expect("cpu.cfs_period_us");
            std::fs::write(d.join("cpu.cfs_quota_us"), quota.to_string()).expect("cpu.cfs_quota_us");
        }
    };
    limit(&pod_dir, 50_000);
    limit(&dir, 10_000);
    let labels = |container: &'static str| [("namespace", "web"), ("pod", "web-0"), ("container", container)];
    let read = |container: &'static str| {
        let l = labels(container);
        (
            agent.value("node_pod_cpu_cfs_periods_total", &l),
            agent.value("node_pod_cpu_cfs_throttled_periods_total", &l),
            agent.value("node_pod_cpu_cfs_throttled_seconds_total", &l),
        )
    };
    // The exported values and cpu.stat, read while cpu.stat stood still (a
    // period may still end just after the cgroup went idle). No scrape
    // before it has stood still for 200 ms: a scrape between the loop's
    // kill and that last, cut-short period would observe the period apart,
    // below 50 ms (a run beside a build saw it).
    let settled = || {
        for _ in 0..20 {
            let before = (cpu_stat(&dir), cpu_stat(&pod_dir));
            std::thread::sleep(Duration::from_millis(200));
            if (cpu_stat(&dir), cpu_stat(&pod_dir)) != before {
                continue;
            }
            let got = (read("app"), read(""));
            if (cpu_stat(&dir), cpu_stat(&pod_dir)) == before {
                return (got, before);
            }
        }
        panic!("cpu.stat never stood still");
    };
    let ((c0, p0), (truth_c0, truth_p0)) = settled();
    assert_eq!(agent.value("node_pod_cpu_cfs_limit_cores", &labels("app")), 0.1, "10 ms per 100 ms");
    assert_eq!(agent.value("node_pod_cpu_cfs_limit_cores", &labels("")), 0.5);
    let h0 = agent.value("node_pod_cpu_cfs_throttle_duration_seconds_count", &labels("app"));
    let le = |b: &'static str| agent.value("node_pod_cpu_cfs_throttle_duration_seconds_bucket", &[("container", "app"), ("le", b)]);
    let (b050, b100) = (le("0.05"), le("0.1"));

    let mut busy = cg.spawn("/bin/sh -c 'while :; do :; done'");
    std::thread::sleep(Duration::from_millis(2000));
    let _ = busy.kill();
    let _ = busy.wait();
    let ((c1, p1), (truth_c1, truth_p1)) = settled();

    let (dp, dn, dns) = (truth_c1.0 - truth_c0.0, truth_c1.1 - truth_c0.1, truth_c1.2 - truth_c0.2);
    eprintln!(
        "cpu.stat: +{dp} periods, +{dn} throttled, +{:.3}s; exported +{} periods, +{} throttled, +{:.3}s; the pod: +{} throttled",
        dns as f64 / 1e9,
        c1.0 - c0.0,
        c1.1 - c0.1,
        c1.2 - c0.2,
        truth_p1.1 - truth_p0.1
    );
    assert!(dn >= 10, "a busy loop under 10 ms/100 ms for 2 s is throttled in most of its ~20 periods: {dn}");
    assert_eq!(c1.0 - c0.0, dp as f64, "periods");
    assert_eq!(c1.1 - c0.1, dn as f64, "throttled periods");
    assert!(((c1.2 - c0.2) - dns as f64 / 1e9).abs() < 1e-6, "throttled seconds");
    assert_eq!(p1.1 - p0.1, (truth_p1.1 - truth_p0.1) as f64, "the pod's own cgroup, exactly too");
    assert_eq!(truth_p1.1 - truth_p0.1, 0, "the pod's 50 ms limit is never reached by a 10 ms container");
    // No scrape while the loop ran: the new throttled periods are observed
    // at their mean, up to 90 ms each (the period less the 10 ms the
    // container ran), at least 50 ms unless the machine is overloaded.
    let h1 = agent.value("node_pod_cpu_cfs_throttle_duration_seconds_count", &labels("app"));
    assert_eq!(h1 - h0, dn as f64, "the histogram counts every throttled period");
    let mean = dns as f64 / 1e9 / dn as f64;
    assert!(mean > 0.05 && mean <= 0.1, "50 to 90 ms throttled per 100 ms period: {mean}");
    assert_eq!((le("0.1") - b100, le("0.05") - b050), (dn as f64, 0.0), "in the (50 ms, 100 ms] buckets");
    drop(cg);
}

/// Started outside any cluster and without a kubeconfig, the agent runs
/// with attribution off, says so in one line, and attaches nothing for it.
#[test]
fn without_kubernetes_attribution_is_off_with_one_log_line() {
    if !root_or_skip("pod attribution truth tests") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let home = tempfile::tempdir().expect("home");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let child = Command::new(node_agent_tests::agent_binary())
        .args([
            &format!("--web.listen-address=127.0.0.1:{port}"),
            "--collector.disable-defaults",
            "--collector.ebpf_pods",
            "--collector.loadavg",
        ])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home.path())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node-agent");
    let mut guard = node_agent_tests::Kill(child);
    let url = format!("http://127.0.0.1:{port}/metrics");
    let t = Instant::now();
    let text = loop {
        if let Ok(t) = node_agent_tests::compare::http_get(&url) {
            break t;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "node-agent did not come up");
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(guard.0.id() as i32, libc::SIGTERM) };
    let out = guard.0.wait_with_output_ref();
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("pod attribution")).collect();
    assert_eq!(lines.len(), 1, "one line about pod attribution:\n{out}");
    assert!(lines[0].contains("pod attribution off"), "{}", lines[0]);
    assert!(text.contains("node_scrape_collector_success{collector=\"ebpf_pods\"} 1"), "{text}");
    assert!(!text.contains("node_ebpf_pod_") && !text.contains("node_ebpf_program_up"), "no pod series, no program:\n{text}");
    assert!(text.contains("node_load1 "), "the agent serves");
}

trait WaitOutput {
    fn wait_with_output_ref(&mut self) -> String;
}

impl WaitOutput for Child {
    fn wait_with_output_ref(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        let _ = self.wait();
        s
    }
}
