//! node_exporter's three deprecated collectors against the real peers, each
//! started by the test in a temp dir on loopback and killed at the end:
//! `ntp` against chronyd (`-x`: it never touches the clock) serving `local
//! stratum 7` on a test port, compared with `chronyc tracking`; `runit`
//! against runsv supervising two services, compared with `sv status`
//! before and after `sv down`/`sv up`; `supervisord` against supervisord
//! with two programs (one in a group, one that exits 3), over HTTP with
//! basic auth and over its unix socket, compared with `supervisorctl
//! status` before and after `supervisorctl stop`. In CI the tools are
//! installed and the tests never skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use expo::Sink;
use host::collector::{ntp, runit, supervisord};
use host::Collector;

type Samples = BTreeMap<(String, Vec<(String, String)>), f64>;

fn paths() -> host::Paths {
    host::Paths { procfs: "/proc".into(), sysfs: "/sys".into(), rootfs: "/".into(), udev_data: "/run/udev/data".into() }
}

fn collect(c: &mut dyn Collector) -> Result<Samples, String> {
    let mut sink = Sink::new();
    c.update(&mut sink).map_err(|e| e.to_string())?;
    let mut out = Samples::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            let l = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert!(out.insert((f.name().to_string(), l), v).is_none(), "duplicate series in {}", f.name());
        }
    }
    Ok(out)
}

fn get(s: &Samples, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let l: Vec<(String, String)> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    s.get(&(family.to_string(), l)).copied()
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Whether every tool is on PATH (or in /usr/sbin); in CI a missing one fails.
fn have(tools: &[&str], what: &str) -> bool {
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .collect();
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !dirs.iter().any(|d| d.join(t).is_file())).collect();
    if missing.is_empty() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{what}: {missing:?} must be installed in CI (cargo xtask test installs them)");
    eprintln!("SKIP: {what}: {missing:?} not installed");
    false
}

fn tool(name: &str) -> PathBuf {
    for d in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(d).join(name);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(name)
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(tool(cmd)).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let t = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if t.elapsed() > limit => panic!("{what}: not ready after {limit:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A child process stopped when dropped: by `stop` if set, else SIGTERM;
/// killed (SIGKILL) if it is still running 3 s later, and reaped.
struct Guard {
    child: Child,
    stop: Option<Box<dyn FnMut()>>,
}

impl Guard {
    fn spawn(cmd: &mut Command) -> Guard {
        let child = cmd.stdin(Stdio::null()).spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        Guard { child, stop: None }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        match self.stop.as_mut() {
            Some(stop) => stop(),
            None => {
                if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                    // SAFETY: kill takes no pointers; `pid` is our unreaped child, so it names no other process.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port(udp: bool) -> u16 {
    free_ports::<1>(udp)[0]
}

/// `N` distinct free loopback ports: all bound at once, then released (one
/// bound and dropped after another could come back the same).
fn free_ports<const N: usize>(udp: bool) -> [u16; N] {
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    let ports = std::array::from_fn(|_| {
        if udp {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = s.local_addr().unwrap().port();
            held.push(Box::new(s));
            port
        } else {
            let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = s.local_addr().unwrap().port();
            held.push(Box::new(s));
            port
        }
    });
    drop(held);
    ports
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------- ntp

fn ntp_options(port: u16) -> ntp::Options {
    ntp::Options {
        server: "127.0.0.1".into(),
        port: i64::from(port),
        version: 4,
        server_is_local: false,
        ip_ttl: 1,
        max_distance: 3_466_080_000,
        offset_tolerance: 1_000_000,
    }
}

/// `chronyc -c tracking`: refid, name, stratum, ref time, system offset,
/// last offset, rms, freq, residual freq, skew, root delay, root
/// dispersion, update interval, leap status.
fn tracking(cmdport: u16) -> Result<Vec<String>, String> {
    let out = run("chronyc", &["-h", "127.0.0.1", "-p", &cmdport.to_string(), "-c", "tracking"]);
    let f: Vec<String> = out.trim().split(',').map(str::to_string).collect();
    if f.len() < 14 {
        return Err(format!("chronyc tracking: {out:?}"));
    }
    Ok(f)
}

#[test]
fn ntp_equals_chronyd() {
    if !have(&["chronyd", "chronyc"], "ntp truth test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let [port, cmdport] = free_ports::<2>(true);
    assert_ne!(port, cmdport);
    let conf = d.join("chrony.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 7\ncmdport {cmdport}\n\
             bindcmdaddress 127.0.0.1\nbindcmdaddress /\npidfile {0}/chronyd.pid\ndriftfile {0}/drift\n",
            d.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(d.join("chronyd.log")).unwrap();
    let mut cmd = Command::new(tool("chronyd"));
    cmd.args(["-x", "-d", "-f"]).arg(&conf).stdout(log.try_clone().unwrap()).stderr(log);
    if is_root() {
        cmd.args(["-u", "root"]);
    }
    let _chronyd = Guard::spawn(&mut cmd);

    // until chronyd answers as its local reference (stratum 7, in sync)
    let p = paths();
    let mut c = ntp::Collector::new(ntp_options(port), &p).expect("collector");
    let (before, got) = poll("chronyd", Duration::from_secs(20), || {
        let t = tracking(cmdport)?;
        let got = collect(&mut c)?;
        if t[2] != "7" || get(&got, "node_ntp_stratum", &[]) != Some(7.0) {
            return Err(format!("not yet stratum 7: tracking {t:?}, got {got:?}"));
        }
        Ok((t, got))
    });
    let after = tracking(cmdport).unwrap();
    let log = std::fs::read_to_string(d.join("chronyd.log")).unwrap_or_default();
    eprintln!("chronyc tracking: {after:?}\nnode-agent: {got:?}\nchronyd log:\n{log}");

    let f = |n: &str| get(&got, n, &[]).unwrap_or_else(|| panic!("{n} missing"));
    let num = |t: &[String], i: usize| t[i].parse::<f64>().unwrap_or_else(|_| panic!("tracking field {i}: {:?}", t[i]));
    assert_eq!(got.len(), 8, "eight families, one sample each: {got:?}");
    assert_eq!(f("node_ntp_stratum"), num(&after, 2), "stratum as chronyc tracking reports it");
    assert_eq!(f("node_ntp_stratum"), 7.0, "the configured local stratum");
    assert_eq!(after[13], "Normal");
    assert_eq!(f("node_ntp_leap"), 0.0, "leap status Normal");
    // chronyd -x serves this host's own clock: both sides read one clock, so
    // the offset lies within half the round trip (less chronyd's fuzzing of
    // the bits below its precision), however slow a loaded machine answers
    let rtt = f("node_ntp_rtt_seconds");
    assert!((0.0..1.0).contains(&rtt), "loopback rtt {rtt}");
    let off = f("node_ntp_offset_seconds");
    assert!(off.abs() <= rtt / 2.0 + 1e-5, "offset {off} beyond half the rtt {rtt}");
    // the reference time chronyd reports, within the NTP format's resolution
    let reft = f("node_ntp_reference_timestamp_seconds");
    assert!(
        [num(&before, 3), num(&after, 3)].iter().any(|t| (t - reft).abs() < 1e-6),
        "reference time {reft} vs tracking {} / {}",
        before[3],
        after[3]
    );
    assert!((reft - now()).abs() < 3600.0, "a recent reference time: {reft}");
    // root delay as tracking (Q16.16: 15 us steps); dispersion grows from it
    assert!((f("node_ntp_root_delay_seconds") - num(&after, 10)).abs() < 2e-5, "root delay");
    let disp = f("node_ntp_root_dispersion_seconds");
    assert!(disp + 2e-5 >= num(&before, 11) && disp < 0.05, "root dispersion {disp} vs tracking {}", after[11]);
    assert_eq!(f("node_ntp_sanity"), 1.0, "a sane local server");

    // the configured limits apply: no root distance is small enough for 0 s
    let mut strict = ntp::Collector::new(ntp::Options { max_distance: 0, ..ntp_options(port) }, &p).unwrap();
    assert_eq!(get(&collect(&mut strict).unwrap(), "node_ntp_sanity", &[]), Some(0.0));
    // protocol versions 2 and 3, and no TTL set (0), are answered too
    for (version, ip_ttl) in [(2, 1), (3, 0)] {
        let mut c = ntp::Collector::new(ntp::Options { version, ip_ttl, ..ntp_options(port) }, &p).unwrap();
        let got = collect(&mut c).unwrap_or_else(|e| panic!("version {version}: {e}"));
        assert_eq!(get(&got, "node_ntp_stratum", &[]), Some(7.0), "version {version}");
        assert_eq!(get(&got, "node_ntp_sanity", &[]), Some(1.0), "version {version}");
    }
    // start-up validation: a non-loopback server is refused unless certified local
    assert!(ntp::Collector::new(ntp::Options { server: "192.0.2.1".into(), ..ntp_options(port) }, &p).is_err());
}

// ---------------------------------------------------------------- runit

/// `sv status` of one service: (state, desired, seconds since the change).
fn sv_status(svc: &Path) -> Result<(u8, u8, f64), String> {
    let out = run("sv", &["status", svc.to_str().unwrap()]);
    let line = out.lines().next().unwrap_or("").to_string();
    let (state, rest) = line.split_once(": ").ok_or_else(|| format!("sv status: {out:?}"))?;
    let state = match state {
        "run" => 1,
        "down" => 0,
        "finish" => 2,
        _ => return Err(format!("sv status: {line:?}")),
    };
    let rest = rest.split_once(": ").map(|(_, r)| r).ok_or_else(|| format!("sv status: {line:?}"))?;
    let rest = if rest.starts_with("(pid ") { rest.split_once(") ").map(|(_, r)| r).unwrap_or("") } else { rest };
    let secs: f64 = rest.split('s').next().unwrap_or("").parse().map_err(|_| format!("sv status: {line:?}"))?;
    // sv notes a want that differs from the state
    let desired = if state == 1 { u8::from(!line.contains("want down")) } else { u8::from(line.contains("want up")) };
    Ok((state, desired, secs))
}

fn check_runit(svdir: &Path, services: &[&str], normally_up: &[f64]) {
    let mut c = runit::Collector::new(runit::Options { servicedir: svdir.to_path_buf() }, &paths()).unwrap();
    let got = collect(&mut c).unwrap();
    let t = now();
    assert_eq!(got.len(), 4 * services.len(), "four families per service: {got:?}");
    for (svc, normal) in services.iter().zip(normally_up) {
        let (state, desired, secs) = sv_status(&svdir.join(svc)).unwrap();
        let l = [("service", *svc), ("supervisor", "runit")];
        assert_eq!(get(&got, "node_service_state", &l), Some(f64::from(state)), "{svc} state vs sv status");
        assert_eq!(get(&got, "node_service_desired_state", &l), Some(f64::from(desired)), "{svc} want vs sv status");
        let changed = get(&got, "node_service_state_last_change_timestamp_seconds", &l).unwrap();
        assert!((t - secs - changed).abs() <= 2.0, "{svc}: changed at {changed}, sv says {secs}s ago (now {t})");
        assert_eq!(get(&got, "node_service_normal_state", &l), Some(*normal), "{svc} normal state");
    }
}

#[test]
fn runit_equals_sv_status() {
    if !have(&["runsv", "sv"], "runit truth test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let svdir = dir.path().join("service");
    for svc in ["alpha", "beta"] {
        let s = svdir.join(svc);
        std::fs::create_dir_all(&s).unwrap();
        std::fs::write(s.join("run"), "#!/bin/sh\nexec sleep 1000\n").unwrap();
        std::fs::set_permissions(s.join("run"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    // beta is normally down (runsv reads `down` in the service directory)
    std::fs::write(svdir.join("beta/down"), "").unwrap();
    // a file in the service directory is no service
    std::fs::write(svdir.join("README"), "not a service").unwrap();
    let _guards: Vec<Guard> = ["alpha", "beta"]
        .iter()
        .map(|svc| {
            let path = svdir.join(svc);
            let mut g = Guard::spawn(Command::new(tool("runsv")).arg(&path).stdout(Stdio::null()).stderr(Stdio::null()));
            g.stop = Some(Box::new(move || {
                let _ = Command::new(tool("sv")).args(["-w", "2", "force-stop"]).arg(&path).stdout(Stdio::null()).status();
                let _ = Command::new(tool("sv")).arg("exit").arg(&path).stdout(Stdio::null()).status();
            }));
            g
        })
        .collect();
    poll("runsv", Duration::from_secs(10), || match (sv_status(&svdir.join("alpha"))?, sv_status(&svdir.join("beta"))?) {
        ((1, ..), (0, ..)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let status = |s: &str| run("sv", &["status", svdir.join(s).to_str().unwrap()]);
    eprintln!("sv status:\n{}{}", status("alpha"), status("beta"));
    // go-runit (and so node_exporter) looks for supervise/down, not the
    // service's `down`: both read as normally up though sv calls beta normally down
    check_runit(&svdir, &["alpha", "beta"], &[1.0, 1.0]);
    std::fs::write(svdir.join("beta/supervise/down"), "").unwrap();
    check_runit(&svdir, &["alpha", "beta"], &[1.0, 0.0]);
    std::fs::remove_file(svdir.join("beta/supervise/down")).unwrap();

    // a state change: alpha down, beta up
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = runit::Collector::new(runit::Options { servicedir: svdir.clone() }, &paths()).unwrap();
    let first = collect(&mut c).unwrap();
    run("sv", &["-w", "5", "down", svdir.join("alpha").to_str().unwrap()]);
    run("sv", &["-w", "5", "up", svdir.join("beta").to_str().unwrap()]);
    poll("sv down/up", Duration::from_secs(10), || match (sv_status(&svdir.join("alpha"))?, sv_status(&svdir.join("beta"))?) {
        ((0, 0, _), (1, 1, _)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    eprintln!("after sv down alpha, sv up beta:\n{}{}", status("alpha"), status("beta"));
    check_runit(&svdir, &["alpha", "beta"], &[1.0, 1.0]);
    let second = collect(&mut c).unwrap();
    let ts = |s: &Samples, svc: &str| {
        get(s, "node_service_state_last_change_timestamp_seconds", &[("service", svc), ("supervisor", "runit")]).unwrap()
    };
    for svc in ["alpha", "beta"] {
        assert!(ts(&second, svc) > ts(&first, svc), "{svc}: the change time moved on");
    }
    assert_eq!(get(&second, "node_service_state", &[("service", "alpha"), ("supervisor", "runit")]), Some(0.0));
    assert_eq!(get(&second, "node_service_desired_state", &[("service", "alpha"), ("supervisor", "runit")]), Some(0.0));
}

// ---------------------------------------------------------------- supervisord

fn state_code(name: &str) -> f64 {
    match name {
        "STOPPED" => 0.0,
        "STARTING" => 10.0,
        "RUNNING" => 20.0,
        "BACKOFF" => 30.0,
        "STOPPING" => 40.0,
        "EXITED" => 100.0,
        "FATAL" => 200.0,
        _ => 1000.0,
    }
}

/// `supervisorctl status`: (group, name) -> (state name, uptime seconds when running).
fn ctl_status(conf: &Path) -> BTreeMap<(String, String), (String, Option<f64>)> {
    let out = run("supervisorctl", &["-c", conf.to_str().unwrap(), "status"]);
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let mut it = line.split_whitespace();
        let (Some(full), Some(state)) = (it.next(), it.next()) else { continue };
        let (group, name) = full.split_once(':').map(|(g, n)| (g.to_string(), n.to_string())).unwrap_or((full.into(), full.into()));
        let uptime = line.split("uptime ").nth(1).and_then(|u| {
            let (days, hms) = match u.split_once(" days, ").or_else(|| u.split_once(" day, ")) {
                Some((d, r)) => (d.trim().parse::<f64>().ok()?, r),
                None => (0.0, u),
            };
            let p: Vec<f64> = hms.trim().split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
            (p.len() == 3).then(|| days * 86400.0 + p[0] * 3600.0 + p[1] * 60.0 + p[2])
        });
        m.insert((group, name), (state.to_string(), uptime));
    }
    m
}

fn check_supervisord(got: &Samples, conf: &Path) {
    let t = now();
    let ctl = ctl_status(conf);
    eprintln!("supervisorctl status: {ctl:?}\nnode-agent: {got:?}");
    assert!(!ctl.is_empty());
    let mut series = 0;
    for ((group, name), (state, uptime)) in &ctl {
        let l = [("group", group.as_str()), ("name", name.as_str())];
        assert_eq!(get(got, "node_supervisord_state", &l), Some(state_code(state)), "{group}:{name} {state}");
        let running = matches!(state.as_str(), "STARTING" | "RUNNING" | "STOPPING");
        assert_eq!(get(got, "node_supervisord_up", &l), Some(if running { 1.0 } else { 0.0 }), "{group}:{name} up");
        assert!(get(got, "node_supervisord_exit_status", &l).is_some());
        series += 3;
        match (running, get(got, "node_supervisord_start_time_seconds", &l)) {
            (true, Some(start)) => {
                series += 1;
                if let Some(up) = uptime {
                    assert!((t - up - start).abs() <= 2.0, "{group}:{name}: started {start}, uptime {up} (now {t})");
                }
            }
            (false, None) => {}
            other => panic!("{group}:{name}: start time {other:?}"),
        }
    }
    assert_eq!(got.len(), series, "exactly supervisorctl's processes: {got:?}");
}

#[test]
fn supervisord_equals_supervisorctl() {
    if !have(&["supervisord", "supervisorctl"], "supervisord truth test") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port(false);
    let conf = d.join("supervisord.conf");
    let sock = d.join("supervisor.sock");
    std::fs::write(
        &conf,
        format!(
            "[supervisord]\nnodaemon=true\nlogfile={d}/supervisord.log\npidfile={d}/supervisord.pid\nchildlogdir={d}\nuser=root\n\
             [inet_http_server]\nport=127.0.0.1:{port}\nusername=agent\npassword=s3cret\n\
             [unix_http_server]\nfile={sock}\n\
             [rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\
             [supervisorctl]\nserverurl=unix://{sock}\n\
             [program:sleeper]\ncommand=sleep 1000\nstartsecs=1\n\
             [group:pool]\nprograms=sleeper\n\
             [program:quitter]\ncommand=sh -c \"exit 3\"\nstartsecs=0\nautorestart=false\nexitcodes=0\n",
            d = d.display(),
            sock = sock.display(),
        )
        .replace("user=root\n", if is_root() { "user=root\n" } else { "" }),
    )
    .unwrap();
    let mut g = Guard::spawn(Command::new(tool("supervisord")).arg("-n").arg("-c").arg(&conf).stdout(Stdio::null()).stderr(Stdio::null()));
    let c2 = conf.clone();
    g.stop = Some(Box::new(move || {
        let _ = Command::new(tool("supervisorctl")).arg("-c").arg(&c2).arg("shutdown").stdout(Stdio::null()).status();
    }));
    let _supervisord = g;
    poll("supervisord", Duration::from_secs(20), || {
        let s = ctl_status(&conf);
        let st = |g: &str, n: &str| s.get(&(g.to_string(), n.to_string())).map(|v| v.0.clone());
        match (st("pool", "sleeper").as_deref(), st("quitter", "quitter").as_deref()) {
            (Some("RUNNING"), Some("EXITED")) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });

    let p = paths();
    let http = format!("http://agent:s3cret@127.0.0.1:{port}/RPC2");
    let unix = format!("unix://{}", sock.display());
    for url in [&http, &unix] {
        let mut c = supervisord::Collector::new(supervisord::Options { url: url.clone() }, &p).unwrap();
        let got = collect(&mut c).unwrap_or_else(|e| panic!("{url}: {e}"));
        check_supervisord(&got, &conf);
        let l = |g: &'static str, n: &'static str| [("group", g), ("name", n)];
        assert_eq!(get(&got, "node_supervisord_exit_status", &l("quitter", "quitter")), Some(3.0), "sh -c 'exit 3'");
        assert_eq!(get(&got, "node_supervisord_exit_status", &l("pool", "sleeper")), Some(0.0));
    }
    // the wrong password is a failed scrape (supervisord answers 401), its error without the password
    let bad = format!("http://agent:wr0ngpass@127.0.0.1:{port}/RPC2");
    let mut c = supervisord::Collector::new(supervisord::Options { url: bad }, &p).unwrap();
    let e = collect(&mut c).unwrap_err();
    assert!(e.contains("401") && e.contains("agent:***@") && !e.contains("wr0ngpass"), "{e}");

    // stopping a program: STOPPED, down, no start time
    run("supervisorctl", &["-c", conf.to_str().unwrap(), "stop", "pool:sleeper"]);
    let mut c = supervisord::Collector::new(supervisord::Options { url: unix }, &p).unwrap();
    let got = poll("supervisorctl stop", Duration::from_secs(10), || {
        let got = collect(&mut c)?;
        match get(&got, "node_supervisord_state", &[("group", "pool"), ("name", "sleeper")]) {
            Some(0.0) => Ok(got),
            other => Err(format!("{other:?}")),
        }
    });
    check_supervisord(&got, &conf);
    assert_eq!(get(&got, "node_supervisord_up", &[("group", "pool"), ("name", "sleeper")]), Some(0.0));
}
