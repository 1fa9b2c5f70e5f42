//! The pod watch against a broken or hostile API server (the in-memory one
//! with its pod faults): an endless watch line is cut at the bound with the
//! agent's memory bounded; a list that never answers times out, is logged
//! once, shows its reason and recovers; a watch answered 410 every time
//! re-lists with backoff and one log line; deleted pods are forgotten on
//! the watch's timer, with no scrape.
//!
//! The agent runs as the real binary (the families need the eBPF object:
//! root only; outside CI without root these skip with a message), except
//! the expiry test, which runs the watch in process.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use node_agent_tests::apiserver::Running;
use node_agent_tests::host::root_or_skip;
use node_agent_tests::pods::{api, WatchingAgent, NODE};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pod_lists(c: &Running) -> usize {
    c.api.requests.lock().expect("requests").iter().filter(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true")).count()
}

/// The server sends 300 MB on one watch line: the agent cuts the line at
/// 16 MiB, says so once, keeps the pods it listed, and its peak memory
/// grows by far less than what was sent (before: by all of it).
#[test]
fn an_endless_watch_line_is_cut_at_the_bound_and_memory_stays_bounded() {
    if !root_or_skip("pod watch tests") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Running::start(api()).expect("API server");
    c.api.pod_faults.hang_lists.store(true, Ordering::Relaxed);
    let agent = WatchingAgent::start(c.kubeconfig.path(), NODE, &[]);
    let hwm0 = agent.status_kib("VmHWM");
    c.api.pod_faults.endless_line.store(300 << 20, Ordering::Relaxed);
    c.api.pod_faults.hang_lists.store(false, Ordering::Relaxed);
    agent.until(Duration::from_secs(30), "the list", |a| a.value("node_ebpf_pod_attribution_synced", &[]) == 1.0);
    agent.until(Duration::from_secs(30), "reason too_large", |a| a.reason() == "too_large");
    // Two more cut lines (backoff 1 s, then 2 s).
    let sent0 = c.api.pod_faults.endless_sent.load(Ordering::Relaxed);
    agent.until(Duration::from_secs(30), "more cut lines", |_| c.api.pod_faults.endless_sent.load(Ordering::Relaxed) >= sent0 + (32 << 20));
    let sent = c.api.pod_faults.endless_sent.load(Ordering::Relaxed);
    let hwm = agent.status_kib("VmHWM");
    let rss = agent.status_kib("VmRSS");
    eprintln!(
        "sent {} MiB on endless lines; VmHWM {} MiB before, {} MiB after (+{} MiB); VmRSS now {} MiB",
        sent >> 20,
        hwm0 >> 10,
        hwm >> 10,
        (hwm - hwm0) >> 10,
        rss >> 10
    );
    assert!(sent >= 48 << 20, "three lines of 16 MiB at least: {sent}");
    assert!(hwm - hwm0 < 96 << 10, "peak memory grew by {} MiB for a 16 MiB line bound", (hwm - hwm0) >> 10);
    let warned = agent.lines("watching pods failed");
    assert_eq!(warned.len(), 1, "one line for the failure, not one per attempt:\n{}", agent.log());
    assert!(warned[0].contains("too_large") && warned[0].contains("16777216"), "{}", warned[0]);
    assert_eq!(agent.value("node_ebpf_pod_attribution_synced", &[]), 1.0, "the listed pods are kept");
    assert_eq!(agent.value("node_ebpf_pod_attribution_pods", &[]), 2.0);
}

/// The server never answers the pod list: after --collector.ebpf_pods.list-timeout
/// the agent logs one line, shows reason list_timeout with synced 0, retries
/// with backoff, and recovers once the server answers (before: synced 0
/// forever, no log line).
#[test]
fn a_list_that_never_answers_times_out_and_recovers() {
    if !root_or_skip("pod watch tests") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Running::start(api()).expect("API server");
    c.api.pod_faults.hang_lists.store(true, Ordering::Relaxed);
    let agent = WatchingAgent::start(c.kubeconfig.path(), NODE, &["--collector.ebpf_pods.list-timeout=2s"]);
    assert_eq!(agent.reason(), "listing");
    agent.until(Duration::from_secs(10), "reason list_timeout", |a| a.reason() == "list_timeout");
    assert_eq!(agent.value("node_ebpf_pod_attribution_synced", &[]), 0.0);
    // Retried with backoff: the second list times out too, logged once.
    agent.until(Duration::from_secs(15), "a second list", |_| pod_lists(&c) >= 2);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(agent.reason(), "list_timeout");
    let warned = agent.lines("watching pods failed");
    assert_eq!(warned.len(), 1, "one line for the failure:\n{}", agent.log());
    assert!(warned[0].contains("list_timeout") && warned[0].contains("did not complete within 2s"), "{}", warned[0]);
    c.api.pod_faults.hang_lists.store(false, Ordering::Relaxed);
    agent.until(Duration::from_secs(20), "recovery", |a| a.value("node_ebpf_pod_attribution_synced", &[]) == 1.0);
    assert_eq!(agent.reason(), "synced");
    assert_eq!(agent.value("node_ebpf_pod_attribution_pods", &[]), 2.0);
    assert_eq!(agent.lines("pods of this node listed").len(), 1, "{}", agent.log());
}

/// Every watch is answered 410 Gone: the agent re-lists with backoff (1, 2,
/// 4 s, ...) rather than every second, with one log line in all (before: a
/// re-list every 1.3 s and two lines each).
#[test]
fn a_watch_gone_every_time_relists_with_backoff_and_one_line() {
    if !root_or_skip("pod watch tests") {
        return;
    }
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Running::start(api()).expect("API server");
    c.api.pod_faults.gone_watches.store(true, Ordering::Relaxed);
    let agent = WatchingAgent::start(c.kubeconfig.path(), NODE, &[]);
    agent.until(Duration::from_secs(20), "the list", |a| a.value("node_ebpf_pod_attribution_synced", &[]) == 1.0);
    let t = Instant::now();
    let lists0 = pod_lists(&c);
    std::thread::sleep(Duration::from_secs(12));
    let lists = pod_lists(&c) - lists0;
    eprintln!("{lists} pod lists in {:?} with every watch answered 410", t.elapsed());
    assert!(lists <= 4, "re-listed {lists} times in 12 s: backoff 1, 2, 4, 8 s allows 3 or 4");
    let log = agent.log();
    let pod_lines: Vec<&str> = log.lines().filter(|l| l.contains("pod attribution")).collect();
    let warned: Vec<&&str> = pod_lines.iter().filter(|l| l.contains("watching pods failed")).collect();
    assert_eq!(warned.len(), 1, "one line for the failure:\n{log}");
    assert!(warned[0].contains("expired"), "{}", warned[0]);
    assert!(!log.contains("watching pods again"), "no recovery line per re-list:\n{log}");
    assert_eq!(agent.value("node_ebpf_pod_attribution_pods", &[]), 2.0);
}

/// Deleted pods leave the index once their grace period is over, with no
/// scrape (no collector runs at all): the watch forgets them on its timer.
#[test]
fn deleted_pods_are_forgotten_on_a_timer_without_a_scrape() {
    let c = Running::start(api()).expect("API server");
    let source = node_agent::pods::watch::source(Some(c.kubeconfig.path())).expect("kubeconfig");
    let settings = node_agent::pods::watch::Settings { grace: Duration::from_secs(1), list_timeout: Duration::from_secs(60) };
    let w = node_agent::pods::Watched::start(source, NODE.to_string(), settings, false).expect("watch");
    let t = Instant::now();
    while !w.lock().synced {
        assert!(t.elapsed() < Duration::from_secs(20), "never listed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(w.lock().len(), 2);
    c.api.write("DELETE", "pods", "db", Some("db-0"), None, "", serde_json::Value::Null);
    let t = Instant::now();
    while w.lock().len() != 1 {
        assert!(t.elapsed() < Duration::from_secs(10), "the deleted pod was never forgotten");
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = t.elapsed();
    eprintln!("db-0 forgotten {after:?} after its deletion (grace 1s), no scrape");
    assert!(after >= Duration::from_millis(900), "{after:?}");
    assert!(w.lock().get(node_agent_tests::pods::UID_B).is_none());
}
