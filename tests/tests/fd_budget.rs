//! One budget of kept file descriptors (issue #33, item 2): with thousands
//! of network devices and an open-file limit of 4096, netclass keeps what
//! the budget allows and reads the rest as node_exporter does; scrapes
//! succeed, the listener never runs out of descriptors, and the agent's
//! descriptors stay within a quarter of the limit plus its fixed ones.
//!
//! The devices are veth pairs in a network namespace of the test's own; the
//! agent runs in the host's namespace, under the limit, with
//! `--path.sysfs` on a sysfs mounted from inside that namespace (sysfs
//! shows its mounter's devices).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use node_agent_tests::http_get;
use node_agent_tests::netns::{Netns, SysfsMount};

/// The open-file limit the agent runs under (soft and hard).
const NOFILE: u64 = 4096;

/// The agent's descriptors beside the kept ones: stdin, stdout and stderr
/// (3), the listener (1), the async runtime's epoll and wakers (about 4),
/// the scrape runners' and collectors' transient ones (an open directory
/// listing, a file being read, netclass's netlink sockets: about 8), and
/// the connections of this test (one scrape and one health check at a
/// time, each with its accepted socket: 2). 64 leaves room to spare while
/// staying far below what one unbudgeted device directory per veth held
/// (about 23 descriptors each).
const FIXED: usize = 64;

struct Agent {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent with netclass (and two collectors that keep procfs files)
/// reading `sysfs`, under an open-file limit of `nofile`.
/// Its log goes to `log`.
fn start_agent(sysfs: &std::path::Path, nofile: u64, log: &std::path::Path) -> Agent {
    use std::os::unix::process::CommandExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let mut cmd = Command::new(node_agent_tests::agent_binary());
    cmd.arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--path.sysfs={}", sysfs.display()))
        .args(["--collector.disable-defaults", "--collector.netclass", "--collector.stat", "--collector.meminfo", "--log.level=warn"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    let lim = libc::rlimit { rlim_cur: nofile, rlim_max: nofile };
    // SAFETY: setrlimit is async-signal-safe; it runs in the child between
    // fork and exec and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(move || if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
    let child = cmd.spawn().expect("node-agent starts");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let agent = Agent { child, addr };
    assert!(node_agent_tests::web::eventually(20, || http_get(addr, "/healthz", Duration::from_secs(1)).is_some()), "node-agent came up");
    agent
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// A value of the scrape's `name` line with these labels (`name{labels} v`).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What a run saw.
struct Seen {
    max_fds: usize,
    netclass_secs: Vec<f64>,
}

/// `devices` network devices (veth pairs) in a fresh namespace; the agent
/// under `nofile`, scraped `scrapes` times while a client checks
/// `/healthz` without pause and another samples the agent's descriptors.
/// Every scrape must answer with netclass successful and every device in
/// it, and every health check must answer.
fn run(tag: &str, devices: usize, nofile: u64, scrapes: usize) -> Option<Seen> {
    if !node_agent_tests::host::root_or_skip("the fd budget tests") {
        return None;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "iproute2 is required in CI");
        eprintln!("SKIP: no iproute2 (ip) to make a network namespace");
        return None;
    }
    let ns = Netns::new(tag);
    let made = Instant::now();
    let batch: String = (0..devices / 2).map(|i| format!("link add v{i}a type veth peer name v{i}b\n")).collect();
    ns.batch(&batch);
    let dir = tempfile::tempdir().expect("tempdir");
    let _sysfs = ns.run(|_| SysfsMount::new(dir.path()));
    let listed = std::fs::read_dir(dir.path().join("class/net")).expect("the namespace's sysfs").count();
    assert!(listed > devices, "{listed} devices in the namespace's sysfs");
    eprintln!("{devices} devices made in {:?}", made.elapsed());

    let log = dir.path().with_extension("log");
    let agent = start_agent(dir.path(), nofile, &log);
    let (pid, addr) = (agent.child.id(), agent.addr);
    let stop = AtomicBool::new(false);
    let max_fds = AtomicUsize::new(open_fds(pid));
    let (checks, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let mut netclass_secs = Vec::new();
    let problems = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                max_fds.fetch_max(open_fds(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                checks.fetch_add(1, Ordering::Relaxed);
                if http_get(addr, "/healthz", Duration::from_secs(5)).is_none_or(|(code, _)| code != 200) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let mut problems = Vec::new();
        for i in 0..scrapes {
            match http_get(addr, "/metrics", Duration::from_secs(30)) {
                Some((200, body)) => {
                    let ok = value(&body, "node_scrape_collector_success{collector=\"netclass\"}");
                    let up = body.lines().filter(|l| l.starts_with("node_network_up{device=")).count();
                    if ok != Some(1.0) || up < devices {
                        problems.push(format!("scrape {i}: netclass success {ok:?}, {up} devices"));
                    }
                    if let Some(secs) = value(&body, "node_scrape_collector_duration_seconds{collector=\"netclass\"}") {
                        netclass_secs.push(secs);
                    }
                    if let (Some(kept), Some(max)) = (value(&body, "node_agent_kept_fds"), value(&body, "node_agent_kept_fds_max")) {
                        if kept > max {
                            problems.push(format!("scrape {i}: {kept} kept fds over their budget of {max}"));
                        }
                    }
                }
                other => problems.push(format!("scrape {i}: {:?}", other.map(|(code, body)| (code, body.len())))),
            }
        }
        stop.store(true, Ordering::Relaxed);
        problems
    });
    let (checks, failed, max_fds) = (checks.into_inner(), failed.into_inner(), max_fds.into_inner());
    netclass_secs.sort_by(f64::total_cmp);
    eprintln!(
        "{devices} devices, nofile {nofile}: at most {max_fds} fds open; netclass took {:?} s (sorted); {failed} of {checks} health checks failed",
        netclass_secs
    );
    // No accept (nor any other open) ran out of descriptors: the server
    // logs a failed accept, host::io a release of the kept files.
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(dir.path().with_extension("log"));
    let emfile: Vec<&str> = log.lines().filter(|l| l.contains("Too many open files") || l.contains("accept failed")).take(5).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(emfile.is_empty(), "the agent ran out of descriptors:\n{}", emfile.join("\n"));
    assert_eq!(failed, 0, "every health check answers: {failed} of {checks} failed");
    Some(Seen { max_fds, netclass_secs })
}

#[test]
fn two_thousand_devices_under_nofile_4096_scrape_and_stay_in_budget() {
    let Some(seen) = run("fd2k", 2000, NOFILE, 4) else { return };
    let budget = NOFILE as usize / 4 + FIXED;
    assert!(seen.max_fds <= budget, "at most {} fds (a quarter of {NOFILE} plus {FIXED}): held {}", budget, seen.max_fds);
}

#[test]
fn two_hundred_veths_under_nofile_4096_scrape_and_stay_in_budget() {
    let Some(seen) = run("fd200", 200, NOFILE, 5) else { return };
    let budget = NOFILE as usize / 4 + FIXED;
    assert!(seen.max_fds <= budget, "at most {} fds (a quarter of {NOFILE} plus {FIXED}): held {}", budget, seen.max_fds);
    assert_eq!(seen.netclass_secs.len(), 5);
}
