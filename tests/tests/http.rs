//! The HTTP surface, end to end against an in-process agent on a crafted
//! host tree: formats, gzip, collect[]/exclude[], the request limit, health
//! endpoints, and a malformed /proc file failing only its collector.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use node_agent::agent::Agent;

fn host_tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().expect("tempdir");
    let proc = t.path().join("proc");
    std::fs::create_dir_all(proc.join("sys/kernel/random")).expect("mkdir");
    std::fs::write(proc.join("loadavg"), "0.21 0.37 0.39 1/719 19737\n").expect("write");
    std::fs::write(proc.join("meminfo"), "MemTotal:        3742148 kB\nHugePages_Total:       0\n").expect("write");
    std::fs::write(proc.join("sys/kernel/random/entropy_avail"), "256\n").expect("write");
    std::fs::write(proc.join("sys/kernel/random/poolsize"), "256\n").expect("write");
    t
}

fn start(root: &Path, extra: &[&str]) -> Agent {
    let mut args = vec![
        "node-agent".to_string(),
        "--web.listen-address=127.0.0.1:0".into(),
        format!("--path.procfs={}", root.join("proc").display()),
        format!("--path.sysfs={}", root.join("sys").display()),
        "--collector.disable-defaults".into(),
        "--collector.loadavg".into(),
        "--collector.meminfo".into(),
        "--collector.entropy".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
    Agent::start(&m).expect("agent starts")
}

/// A raw HTTP/1.1 request; returns (status, headers, body bytes).
fn request(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("status");
    (status, head.to_lowercase(), raw[split + 4..].to_vec())
}

fn body(addr: SocketAddr, path: &str) -> String {
    let (status, _, b) = request(addr, path, &[]);
    assert_eq!(status, 200, "{path}");
    String::from_utf8(b).expect("utf-8")
}

#[test]
fn serves_text_openmetrics_and_gzip() {
    let t = host_tree();
    let a = start(t.path(), &[]);
    let addr = a.addrs[0];
    let (status, head, b) = request(addr, "/metrics", &[]);
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    let text = String::from_utf8(b).expect("utf-8");
    assert!(text.contains("node_load1 0.21\n"), "{text}");
    assert!(text.contains("node_memory_MemTotal_bytes 3831959552"), "{text}");
    assert!(text.contains("node_scrape_collector_success{collector=\"loadavg\"} 1"), "{text}");
    assert!(text.contains("node_agent_build_info{"), "{text}");
    assert!(text.contains("process_resident_memory_bytes "), "{text}");
    // What node-mixin's dashboards and Node Exporter Full key on.
    assert!(text.contains("node_exporter_build_info{branch=\"\",goarch=\""), "{text}");
    assert!(text.contains("tags=\"node-agent\""), "it says it is node-agent: {text}");
    assert!(text.contains("process_virtual_memory_max_bytes "), "{text}");
    assert!(!text.contains("# EOF"));

    let (_, head, b) =
        request(addr, "/metrics", &[("Accept", "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")]);
    assert!(head.contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    let om = String::from_utf8(b).expect("utf-8");
    assert!(om.ends_with("# EOF\n"));
    assert!(om.contains("# TYPE process_cpu_seconds counter"), "{om}");

    let (_, head, b) = request(addr, "/metrics", &[("Accept-Encoding", "gzip, deflate")]);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&b[..]).read_to_string(&mut plain).expect("gunzip");
    assert!(plain.contains("node_load1 0.21\n"));

    // q-values are honoured: a refused coding or format is not used.
    for refused in ["gzip;q=0", "gzipfoo", "identity, gzip;q=0.000", "*;q=0"] {
        let (_, head, b) = request(addr, "/metrics", &[("Accept-Encoding", refused)]);
        assert!(!head.contains("content-encoding"), "{refused}: {head}");
        assert!(String::from_utf8_lossy(&b).contains("node_load1 0.21\n"), "{refused}");
    }
    let (_, head, _) = request(addr, "/metrics", &[("Accept", "application/openmetrics-text;q=0, text/plain;q=0.5")]);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "OpenMetrics refused by q=0: {head}");
}

/// What Prometheus 2.42 sends with `--enable-feature=native-histograms`.
const PROMETHEUS_NATIVE_ACCEPT: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn serves_protobuf_when_prometheus_asks_for_it() {
    let t = host_tree();
    let a = start(t.path(), &[]);
    let addr = a.addrs[0];
    let (status, head, b) = request(addr, "/metrics", &[("Accept", PROMETHEUS_NATIVE_ACCEPT)]);
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/vnd.google.protobuf; proto=io.prometheus.client.metricfamily; encoding=delimited"),
        "{head}"
    );
    let fams = expo::proto::read_delimited(&b).expect("length-delimited MetricFamily messages");
    let find = |name: &str| fams.iter().find(|f| f.name.as_deref() == Some(name)).unwrap_or_else(|| panic!("{name} missing"));
    let load = find("node_load1");
    assert_eq!(load.r#type, Some(expo::proto::MetricType::Gauge as i32));
    assert_eq!(load.metric[0].gauge.as_ref().and_then(|g| g.value), Some(0.21));
    let cpu = find("process_cpu_seconds_total");
    assert_eq!(cpu.r#type, Some(expo::proto::MetricType::Counter as i32), "counters keep _total in the protobuf format");
    assert!(cpu.metric[0].counter.as_ref().and_then(|c| c.value).is_some());
    let ok = find("node_scrape_collector_success");
    assert_eq!(ok.metric.len(), 3, "one family, every collector's sample");

    // The same families as the text format, by name.
    let text = body(addr, "/metrics");
    let mut text_names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let mut names: Vec<&str> = fams.iter().filter_map(|f| f.name.as_deref()).collect();
    text_names.sort_unstable();
    names.sort_unstable();
    assert_eq!(names, text_names);

    let (_, head, b) = request(addr, "/metrics", &[("Accept", PROMETHEUS_NATIVE_ACCEPT), ("Accept-Encoding", "gzip")]);
    assert!(head.contains("content-encoding: gzip") && head.contains("content-type: application/vnd.google.protobuf"), "{head}");
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&b[..]).read_to_end(&mut plain).expect("gunzip");
    let gz = expo::proto::read_delimited(&plain).expect("decodes after gunzip");
    assert_eq!(gz.len(), fams.len());

    // Asked for without encoding=delimited, or less preferred: text.
    let (_, head, _) = request(addr, "/metrics", &[("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily")]);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    let (_, head, _) = request(
        addr,
        "/metrics",
        &[("Accept", "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.3,text/plain;q=0.5")],
    );
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
}

#[test]
fn collect_and_exclude_parameters() {
    let t = host_tree();
    let a = start(t.path(), &[]);
    let addr = a.addrs[0];
    let only = body(addr, "/metrics?collect%5B%5D=loadavg");
    assert!(only.contains("node_load1 "));
    assert!(!only.contains("node_memory_"));
    assert!(!only.contains("collector=\"meminfo\""));
    let ex = body(addr, "/metrics?exclude[]=loadavg");
    assert!(!ex.contains("node_load1 "));
    assert!(ex.contains("node_memory_MemTotal_bytes"));
    let (status, _, b) = request(addr, "/metrics?collect[]=nope", &[]);
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&b).contains("missing collector: nope"));
}

#[test]
fn malformed_file_fails_only_its_collector() {
    let t = host_tree();
    std::fs::write(t.path().join("proc/meminfo"), "MemTotal: lots kB\n").expect("write");
    let a = start(t.path(), &[]);
    let text = body(a.addrs[0], "/metrics");
    assert!(text.contains("node_scrape_collector_success{collector=\"meminfo\"} 0"), "{text}");
    assert!(text.contains("node_scrape_collector_success{collector=\"loadavg\"} 1"), "{text}");
    assert!(text.contains("node_load1 0.21"));
    assert!(!text.contains("node_memory_"), "partial output of a failed collector must be dropped");
    // A missing file is "no data": success 0 as well, and the scrape goes on.
    std::fs::remove_file(t.path().join("proc/loadavg")).expect("rm");
    let text = body(a.addrs[0], "/metrics");
    assert!(text.contains("node_scrape_collector_success{collector=\"loadavg\"} 0"), "{text}");
}

#[test]
fn health_landing_and_unknown_paths() {
    let t = host_tree();
    let a = start(t.path(), &["--web.telemetry-path=/m"]);
    let addr = a.addrs[0];
    assert_eq!(request(addr, "/healthz", &[]).0, 200);
    assert_eq!(request(addr, "/readyz", &[]).0, 200);
    assert!(body(addr, "/").contains("href=\"/m\""));
    assert!(body(addr, "/m").contains("node_load1"));
    assert_eq!(request(addr, "/metrics", &[]).0, 404);
    // 405 says what is allowed.
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(b"POST /m HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").expect("send");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read");
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");
    assert!(raw.to_lowercase().contains("allow: get, head"), "{raw}");
}

#[test]
fn requests_above_the_limit_get_503() {
    // A textfile directory whose reads never answer (a FUSE mount holding
    // every request) keeps the only request slot until the textfile
    // collector's deadline.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with /dev/fuse");
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    let t = host_tree();
    let dir = t.path().join("textfile");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fuse = node_agent_tests::fuse::Fuse::mount_holding(&dir, node_agent_tests::fuse::Hold::Everything).expect("FUSE mount");
    let a = start(
        t.path(),
        &[
            "--web.max-requests=1",
            "--collector.timeout=2s",
            "--collector.textfile",
            &format!("--collector.textfile.directory={}", dir.display()),
        ],
    );
    let addr = a.addrs[0];
    let slow = std::thread::spawn(move || request(addr, "/metrics", &[]));
    // Wait until the slow scrape holds the slot.
    let mut refused = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let (status, _, b) = request(addr, "/metrics", &[]);
        if status == 503 {
            refused = Some(String::from_utf8_lossy(&b).to_string());
            break;
        }
    }
    // Health checks are not scrapes: never limited.
    assert_eq!(request(addr, "/healthz", &[]).0, 200);
    // The slow scrape answers at the deadline, without the stuck collector.
    let (status, _, b) = slow.join().expect("slow request");
    assert_eq!(status, 200);
    let body = String::from_utf8_lossy(&b).to_string();
    assert!(body.contains("node_scrape_collector_success{collector=\"textfile\"} 0") && body.contains("node_load1"), "{body}");
    let refusals = refused.expect("a concurrent scrape was refused");
    assert!(refusals.contains("Limit of concurrent requests"));
    // node_exporter's handler families count it all: by code (this scrape
    // is in flight, not yet counted), a bad collect[] not at all.
    assert_eq!(request(addr, "/metrics?collect[]=nonexistent", &[]).0, 400);
    let (status, _, b) = request(addr, "/metrics?collect[]=loadavg", &[]);
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&b).to_string();
    let value = |name: &str, label: Option<(&str, &str)>| {
        node_agent_tests::samples(&text, name)
            .into_iter()
            .find(|(l, _)| label.is_none_or(|(k, v)| l.get(k).map(String::as_str) == Some(v)))
            .map(|(_, v)| v)
    };
    let refused_503 = value("promhttp_metric_handler_requests_total", Some(("code", "503"))).expect("code 503");
    assert!(refused_503 >= 1.0, "503s counted: {refused_503}");
    assert_eq!(value("promhttp_metric_handler_requests_total", Some(("code", "200"))), Some(1.0), "the slow scrape");
    assert_eq!(value("promhttp_metric_handler_requests_total", Some(("code", "400"))), None, "a bad collect[] is not counted");
    assert_eq!(value("promhttp_metric_handler_requests_in_flight", None), Some(1.0), "this scrape");
    assert_eq!(value("promhttp_metric_handler_errors_total", Some(("cause", "encoding"))), Some(0.0));
    drop(a);
    drop(fuse);
}

/// `--web.systemd-socket`: served on a listening socket passed as systemd
/// does (descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` of the agent), with no
/// `--web.listen-address` of its own.
#[test]
fn serves_on_a_socket_passed_by_systemd() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let t = host_tree();
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let fd = l.as_raw_fd();
    let bin = node_agent_tests::agent_binary();
    let mut cmd = std::process::Command::new("sh");
    // exec keeps the shell's pid, so LISTEN_PID=$$ names the agent.
    cmd.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ LISTEN_FDS=1 exec {} --web.systemd-socket --path.procfs={} --collector.disable-defaults --collector.loadavg",
            bin.display(),
            t.path().join("proc").display()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe; they run in the child
    // before exec. (dup2 onto itself keeps close-on-exec: clear it then.)
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) } else { libc::dup2(fd, 3) };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
    }
    let child = cmd.spawn().expect("spawn");
    let _kill = node_agent_tests::Kill(child);
    drop(l);
    let t0 = std::time::Instant::now();
    let text = loop {
        if let Ok(mut s) = TcpStream::connect(addr) {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut raw = String::new();
            if s.read_to_string(&mut raw).is_ok() && raw.contains("200 OK") {
                break raw;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no answer on the passed socket");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("node_load1 0.21"), "{text}");
}

/// `LISTEN_FDS` out of range (as 4294967295 and 2147483647 once wrapped the
/// descriptor range to empty: no listener, no error) stops start-up naming
/// it; an empty `GOMAXPROCS` (templated manifests) is ignored, as kingpin
/// ignores empty environment variables, and the agent serves.
#[test]
fn listen_fds_out_of_range_fails_and_an_empty_gomaxprocs_is_ignored() {
    let t = host_tree();
    let bin = node_agent_tests::agent_binary();
    // And a descriptor the agent opened itself is never taken for the socket
    // (here fd 3 is not passed at all).
    for n in ["4294967295", "2147483647", "0", "-1", "1"] {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "LISTEN_PID=$$ LISTEN_FDS={n} exec {} --web.systemd-socket --path.procfs={} --collector.disable-defaults --collector.loadavg",
                bin.display(),
                t.path().join("proc").display()
            ))
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "LISTEN_FDS={n}: the agent must not start: {err}");
        assert!(err.contains("LISTEN_FDS"), "LISTEN_FDS={n}: the error names it: {err}");
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let child = std::process::Command::new(&bin)
        .env("GOMAXPROCS", "")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--path.procfs={}", t.path().join("proc").display()))
        .args(["--collector.disable-defaults", "--collector.loadavg"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let _kill = node_agent_tests::Kill(child);
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut raw = String::new();
            if s.read_to_string(&mut raw).is_ok() && raw.contains("node_load1 0.21") {
                break;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "GOMAXPROCS=\"\": the agent did not serve");
        std::thread::sleep(Duration::from_millis(100));
    }
}
