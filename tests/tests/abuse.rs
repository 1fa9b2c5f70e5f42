//! Abusive clients: hundreds of idle connections, slowloris clients
//! dribbling headers, oversized headers and URLs, and SIGTERM in the middle
//! of a scrape. The agent stays up, its memory stays bounded, legitimate
//! scrapes keep succeeding, and it stops gracefully.
//!
//! Bounds stated here: 500 idle connections plus 100 slowloris clients add
//! less than 64 MiB to the process (agent and clients together); a client
//! that has not sent its headers after 10 s is disconnected
//! (`header_read_timeout`); headers above hyper's 400 KiB buffer are refused;
//! SIGTERM lets an in-flight scrape finish and the process exits 0 within
//! 5 s (the DaemonSet's grace period is 30 s).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn agent() -> node_agent::agent::Agent {
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent",
            "--web.listen-address=127.0.0.1:0",
            "--collector.disable-defaults",
            "--collector.loadavg",
            "--collector.meminfo",
            "--collector.stat",
        ])
        .expect("flags");
    node_agent::agent::Agent::start(&m).expect("agent")
}

fn scrape(addr: SocketAddr) -> Result<u16, String> {
    let r = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build().get(&format!("http://{addr}/metrics")).call();
    match r {
        Ok(r) => Ok(r.status()),
        Err(ureq::Error::Status(s, _)) => Ok(s),
        Err(e) => Err(e.to_string()),
    }
}

fn rss_kb() -> u64 {
    node_agent_tests::status_kb("self", "VmRSS")
}

/// The connection was closed by the server (EOF or reset).
fn closed(s: &mut TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut b = [0u8; 512];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn idle_connections_and_slowloris_clients_neither_block_scrapes_nor_grow_memory() {
    let a = agent();
    let addr = a.addrs[0];
    assert_eq!(scrape(addr), Ok(200));
    let before = rss_kb();
    let mut idle: Vec<TcpStream> = (0..500).map(|_| TcpStream::connect(addr).expect("connect")).collect();
    let mut slow: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("write");
            s
        })
        .collect();
    let start = Instant::now();
    let mut scrapes = 0;
    // For 12 s the slow clients send one byte each every 500 ms; scrapes go on.
    while start.elapsed() < Duration::from_secs(12) {
        for s in &mut slow {
            let _ = s.write_all(b"a");
        }
        assert_eq!(scrape(addr), Ok(200), "a legitimate scrape failed under abuse after {:?}", start.elapsed());
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let grown = rss_kb().saturating_sub(before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} kB with 600 abusive connections");
    // The header deadline (10 s) has closed every dribbling client, and the idle ones.
    let still_open = slow.iter_mut().map(closed).filter(|c| !c).count();
    assert_eq!(still_open, 0, "{still_open} slowloris connections still open after 12 s");
    let idle_open = idle.iter_mut().map(closed).filter(|c| !c).count();
    assert_eq!(idle_open, 0, "{idle_open} idle connections still open after 12 s");
    assert!(scrapes >= 15);
    assert_eq!(scrape(addr), Ok(200));
}

fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).lines().next().unwrap_or("").to_string()
}

#[test]
fn oversized_headers_and_urls_are_refused_and_the_agent_goes_on() {
    let a = agent();
    let addr = a.addrs[0];
    let big = "a".repeat(1 << 20);
    let status = raw(addr, format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes());
    assert!(status.is_empty() || status.contains(" 431 ") || status.contains(" 400 "), "1 MiB header: {status:?}");
    let status = raw(addr, format!("GET /metrics?{big} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes());
    assert!(status.is_empty() || status.contains(" 414 ") || status.contains(" 431 ") || status.contains(" 400 "), "1 MiB URL: {status:?}");
    let many: String = (0..2000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let status = raw(addr, format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes());
    assert!(status.is_empty() || status.contains(" 431 ") || status.contains(" 400 "), "2000 headers: {status:?}");
    let status = raw(addr, b"\x16\x03\x01\x02\x00garbage that is not HTTP\r\n\r\n");
    assert!(status.is_empty() || status.contains(" 400 "), "garbage: {status:?}");
    assert_eq!(scrape(addr), Ok(200));
}

#[test]
fn sigterm_lets_an_in_flight_scrape_finish_and_exits_cleanly() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let dir = tempfile::tempdir().expect("tempdir");
    // A textfile collector with a large file makes a scrape take a while
    // (about a second in a debug build).
    let mut big = String::new();
    for i in 0..50_000 {
        big.push_str(&format!("slow_metric{{i=\"{i}\"}} {i}\n"));
    }
    std::fs::write(dir.path().join("big.prom"), big).expect("write");
    let child = std::process::Command::new(node_agent_tests::agent_binary())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(["--collector.disable-defaults", "--collector.textfile"])
        .arg(format!("--collector.textfile.directory={}", dir.path().display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let mut guard = node_agent_tests::Kill(child);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let t = Instant::now();
    // Readiness through the landing page: a full scrape is the slow thing here.
    while ureq::get(&format!("http://{addr}/")).timeout(Duration::from_secs(5)).call().is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "agent did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let in_flight = std::thread::spawn(move || {
        let r = ureq::get(&format!("http://{addr}/metrics")).call().map_err(|e| e.to_string())?;
        let body = r.into_string().map_err(|e| e.to_string())?;
        Ok::<usize, String>(body.lines().filter(|l| l.starts_with("slow_metric")).count())
    });
    std::thread::sleep(Duration::from_millis(30));
    let pid = guard.0.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = guard.0.try_wait().expect("wait") {
            break s;
        }
        assert!(stopped.elapsed() < Duration::from_secs(30), "still running 30 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");
    assert_eq!(in_flight.join().expect("join"), Ok(50_000), "the in-flight scrape was answered in full");
    // And the port is free again.
    assert!(TcpStream::connect(addr).is_err());
}
