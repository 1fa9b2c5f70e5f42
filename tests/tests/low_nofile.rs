//! The agent under a low open-file limit (#47 row 8, and point 4 of "What
//! to build"): at `nofile` 64 and 256, with the default collectors and
//! every eBPF probe, beside 101 idle keep-alive connections, it starts,
//! answers the kubelet's probes and a scrape with the host's metrics, and
//! reports the eBPF programs that do not fit as down (reason
//! `descriptors`), never exiting for it; at 128, where only some of the
//! programs fit, those that do not. Before the descriptor budget
//! counted the eBPF object, the agent exited at 64 ("cannot start the async
//! runtime: Too many open files": the object's 74 descriptors took them
//! all), and at 256 the idle connections (up to half the limit, beside the
//! object's descriptors and a quarter kept for files) exhausted them: 194
//! accepts failed with EMFILE, no probe was answered and the next scrape
//! waited 6.5 s.
//!
//! The limit is set for the agent alone (soft and hard, between fork and
//! exec), as `ulimit -n` or a container runtime's `nofile` would.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use node_agent_tests::connect_from;

struct Agent {
    child: std::process::Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("KEEP_LOG").is_none() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// The agent with its default collectors under an open-file limit of
/// `nofile`, its log in a file of its own; why not when it does not come
/// up within 60 s (it exited, or never answered).
fn start(nofile: u64, dir: &std::path::Path) -> Result<Agent, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let log = dir.join(format!("agent-{nofile}.log"));
    let mut cmd = std::process::Command::new(node_agent_tests::agent_binary());
    cmd.arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let lim = libc::rlimit { rlim_cur: nofile, rlim_max: nofile };
    // SAFETY: setrlimit is async-signal-safe; it runs in the child between
    // fork and exec and touches nothing of the parent's.
    unsafe {
        cmd.pre_exec(move || if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
    let child = cmd.spawn().expect("node-agent starts");
    let mut agent = Agent { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), log };
    let t = Instant::now();
    while get(agent.addr, Ipv4Addr::LOCALHOST, "/healthz", Duration::from_secs(1)).0 != Some(200) {
        if let Ok(Some(status)) = agent.child.try_wait() {
            return Err(format!("exited ({status}): {}", tail(&agent.log)));
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!("not answering after 60 s: {}", tail(&agent.log)));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(agent)
}

/// The last lines of a log.
fn tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// `GET path` from `from` on a connection of its own: the status (`None`
/// when closed or reset unanswered, or nothing within `timeout`), the
/// body, and how long it took.
fn get(addr: SocketAddr, from: Ipv4Addr, path: &str, timeout: Duration) -> (Option<u16>, String, Duration) {
    let t = Instant::now();
    let answer = connect_from(from, addr, true).ok().and_then(|s| node_agent_tests::http_get_on(s, path, timeout));
    let (status, body) = answer.map_or((None, String::new()), |(s, b)| (Some(s), b));
    (status, body, t.elapsed())
}

/// `n` keep-alive connections, each having had one answer, held idle:
/// from five loopback addresses, so that no one address's share of the
/// connections keeps them all out.
fn idle_keep_alive(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        let from = Ipv4Addr::new(127, 0, 0, 2 + (i % 5) as u8);
        let Ok(mut s) = connect_from(from, addr, true) else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
            continue;
        }
        // The answer ("ok\n", 3 bytes of body) before the next request.
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(b"ok\n") {
            match s.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        held.push(s);
    }
    held
}

/// What one run saw.
struct Seen {
    probes: Vec<Option<(u16, Duration)>>,
    scrape: (Option<u16>, Duration),
    /// `node_ebpf_program_up` by program.
    up: Vec<(String, f64)>,
    /// `node_ebpf_program_down_reason` by program (1 set per down one).
    reasons: std::collections::BTreeMap<String, String>,
    /// `node_scrape_collector_success` of a few host collectors.
    host: Vec<(&'static str, f64)>,
    /// `process_open_fds` and `node_agent_http_connections_open` at the scrape.
    fds: f64,
    connections: f64,
    log: String,
}

fn run(nofile: u64) -> Option<Seen> {
    if !node_agent_tests::host::root_or_skip("the low-nofile tests (eBPF programs)") {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = match start(nofile, dir.path()) {
        Ok(a) => a,
        Err(e) => panic!("nofile {nofile}: the agent {e}"),
    };
    // Scraped before, as Prometheus does: the files it keeps open are open.
    let (first, _, _) = get(agent.addr, Ipv4Addr::LOCALHOST, "/metrics", Duration::from_secs(30));
    assert_eq!(first, Some(200), "nofile {nofile}: the first scrape");
    let idle = idle_keep_alive(agent.addr, 101);
    std::thread::sleep(Duration::from_millis(500));
    let probes: Vec<_> = (0..3)
        .map(|_| {
            let (status, _, took) = get(agent.addr, Ipv4Addr::LOCALHOST, "/healthz", Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(100));
            status.map(|s| (s, took))
        })
        .collect();
    let (status, body, took) = get(agent.addr, Ipv4Addr::LOCALHOST, "/metrics", Duration::from_secs(30));
    let alive = agent.child.id();
    assert!(std::path::Path::new(&format!("/proc/{alive}")).exists(), "nofile {nofile}: the agent is gone");
    let samples = |name| if status == Some(200) { node_agent_tests::samples(&body, name) } else { Vec::new() };
    let up = samples("node_ebpf_program_up").into_iter().map(|(l, v)| (l.get("program").cloned().unwrap_or_default(), v)).collect();
    let reasons = samples("node_ebpf_program_down_reason")
        .into_iter()
        .filter(|(_, v)| *v == 1.0)
        .map(|(l, _)| (l.get("program").cloned().unwrap_or_default(), l.get("reason").cloned().unwrap_or_default()))
        .collect();
    let success = samples("node_scrape_collector_success");
    let single = |name| samples(name).first().map_or(-1.0, |(_, v)| *v);
    let (fds, connections) = (single("process_open_fds"), single("node_agent_http_connections_open"));
    let host = ["cpu", "meminfo", "loadavg", "filesystem", "netdev", "diskstats"]
        .into_iter()
        .map(|c| (c, success.iter().find(|(l, _)| l.get("collector").map(String::as_str) == Some(c)).map_or(-1.0, |(_, v)| *v)))
        .collect();
    drop(idle);
    let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
    Some(Seen { probes, scrape: (status, took), up, reasons, host, fds, connections, log })
}

/// The checks both limits share: every probe and the scrape answered
/// within their bounds, the host collectors successful, and no accept
/// that ran out of descriptors.
fn check_serves(nofile: u64, seen: &Seen) {
    eprintln!(
        "nofile {nofile}: probes {:?}; scrape {:?}; {} programs, {} up; host {:?}; {} descriptors open, {} connections",
        seen.probes,
        seen.scrape,
        seen.up.len(),
        seen.up.iter().filter(|(_, v)| *v == 1.0).count(),
        seen.host,
        seen.fds,
        seen.connections,
    );
    // A probe is answered at once (the kubelet waits 1 s): before the fix
    // none was, at 256. The bound leaves a loaded machine ten times what
    // an unloaded one takes.
    for (i, p) in seen.probes.iter().enumerate() {
        let Some((code, took)) = p else { panic!("nofile {nofile}: probe {i} not answered") };
        assert_eq!(*code, 200, "nofile {nofile}: probe {i}");
        assert!(*took < Duration::from_secs(1), "nofile {nofile}: probe {i} took {took:?}");
    }
    let (status, took) = seen.scrape;
    assert_eq!(status, Some(200), "nofile {nofile}: the scrape after the idle connections ({took:?})");
    // Every default collector and probe in a debug build: under a second
    // unloaded; it waited 6.5 s before the fix.
    assert!(took < Duration::from_secs(4), "nofile {nofile}: the scrape took {took:?}");
    for (c, v) in &seen.host {
        assert_eq!(*v, 1.0, "nofile {nofile}: node_scrape_collector_success{{collector={c:?}}}");
    }
    let emfile: Vec<&str> = seen.log.lines().filter(|l| l.contains("accept failed") || l.contains("Too many open files")).take(5).collect();
    assert!(emfile.is_empty(), "nofile {nofile}: the agent ran out of descriptors:\n{}", emfile.join("\n"));
}

/// At 64 the eBPF object (its maps alone are over 30 descriptors) does not
/// fit beside the reserve and the connections: every program is down for
/// it, and everything else serves.
#[test]
fn at_nofile_64_the_agent_serves_host_metrics_with_ebpf_down() {
    let Some(seen) = run(64) else { return };
    check_serves(64, &seen);
    assert!(seen.up.len() >= 20, "node_ebpf_program_up for every program: {:?}", seen.up);
    for (program, v) in &seen.up {
        assert_eq!(*v, 0.0, "{program} is up at nofile 64");
        assert_eq!(seen.reasons.get(program).map(String::as_str), Some("descriptors"), "{program}: why it is down");
    }
    assert!(seen.log.contains("open-file limit"), "the log says why the programs are down");
}

/// At 128 the object's maps fit and some of its programs: those that do
/// not are down for it, the others up.
#[test]
fn at_nofile_128_the_programs_that_do_not_fit_are_down() {
    let Some(seen) = run(128) else { return };
    check_serves(128, &seen);
    let up = seen.up.iter().filter(|(_, v)| *v == 1.0).count();
    let no_room = seen.reasons.values().filter(|r| *r == "descriptors").count();
    assert!(up > 0 && no_room > 0, "at nofile 128, {up} programs up and {no_room} down for descriptors: {:?}", seen.reasons);
}

/// At 256 the object fits (74 descriptors for every probe's programs, maps
/// and links) beside the reserve, the connections and some kept files.
#[test]
fn at_nofile_256_the_agent_serves_idle_connections_and_every_probe() {
    let Some(seen) = run(256) else { return };
    check_serves(256, &seen);
    assert!(seen.up.len() >= 20, "node_ebpf_program_up for every program: {:?}", seen.up);
    // Every program this kernel serves is up (all of them on 6.x; on an
    // older kernel a few are down for `kernel`); none for want of room.
    let no_room: Vec<_> = seen.reasons.iter().filter(|(_, r)| *r == "descriptors").map(|(p, _)| p).collect();
    assert!(no_room.is_empty(), "programs down for descriptors at nofile 256: {no_room:?}");
    let up = seen.up.iter().filter(|(_, v)| *v == 1.0).count();
    assert!(up >= 10, "every probe's programs load: {up} up, down: {:?}", seen.reasons);
}
