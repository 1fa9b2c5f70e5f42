//! One stuck read never takes the agent down. A FIFO where a file is
//! expected (a textfile, a hwmon attribute, a NIC attribute) is refused at
//! once; a read that really hangs (a FUSE file that never answers, standing
//! in for a hung hwmon device or NFS) is cut off at `--collector.timeout`,
//! skipped by later scrapes without waiting, holds one thread however many
//! scrapes follow, makes `/readyz` fail after three deadlines, and is run
//! again once it answers. `/healthz` and `collect[]` scrapes are never
//! delayed, and SIGTERM stops the process whatever is stuck.
//!
//! The agent runs as its own process (the release of a stuck thread, the
//! exit on SIGTERM and the thread count are the process's).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use node_agent_tests::fuse::{Fuse, Hold};

struct Agent {
    child: std::process::Child,
    addr: SocketAddr,
    /// A FUSE mount the agent reads: released before the agent is killed,
    /// since a request the server took holds the agent until answered.
    fuse: Option<Fuse>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        drop(self.fuse.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    fn fuse(&mut self) -> &mut Fuse {
        self.fuse.as_mut().expect("a FUSE mount")
    }
}

fn start(flags: &[String]) -> Agent {
    start_reading(flags, None)
}

fn start_reading(flags: &[String], fuse: Option<Fuse>) -> Agent {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let child = std::process::Command::new(node_agent_tests::agent_binary())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(flags)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("node-agent starts");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let t = Instant::now();
    while get(addr, "/healthz", Duration::from_secs(1)).is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "node-agent did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    Agent { child, addr, fuse }
}

fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Option<(u16, String)> {
    node_agent_tests::http_get(addr, path, timeout)
}

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0)
}

fn mkfifo(p: &Path) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// A host tree whose textfile, hwmon attribute and NIC attribute are FIFOs.
fn fifo_tree(root: &Path) {
    write(root, "proc/loadavg", "0.21 0.37 0.39 1/719 19737\n");
    write(root, "textfile/good.prom", "good_metric 1\n");
    mkfifo(&root.join("textfile/x.prom"));
    write(root, "sys/class/hwmon/hwmon0/name", "coretemp\n");
    mkfifo(&root.join("sys/class/hwmon/hwmon0/temp1_input"));
    for (attr, v) in [("operstate", "up"), ("mtu", "1500"), ("address", "02:00:00:00:00:01"), ("ifindex", "2")] {
        write(root, &format!("sys/class/net/eth0/{attr}"), &format!("{v}\n"));
    }
    mkfifo(&root.join("sys/class/net/eth0/speed"));
}

fn flags(root: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--path.procfs={}", root.join("proc").display()),
        format!("--path.sysfs={}", root.join("sys").display()),
        format!("--collector.textfile.directory={}", root.join("textfile").display()),
        "--collector.disable-defaults".into(),
        "--collector.textfile".into(),
        "--collector.hwmon".into(),
        "--collector.netclass".into(),
        "--collector.loadavg".into(),
        "--web.disable-exporter-metrics".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn sigterm_exits(agent: &mut Agent, within: Duration) -> Duration {
    let t = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) };
    loop {
        if let Ok(Some(status)) = agent.child.try_wait() {
            assert!(status.success(), "exits cleanly: {status}");
            return t.elapsed();
        }
        assert!(t.elapsed() < within, "still running {:?} after SIGTERM", t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reproduction: FIFOs under textfile, hwmon and netclass, 13
/// scrapes; `collect[]=loadavg` still answers, and SIGTERM stops it.
#[test]
fn fifos_where_files_should_be_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    fifo_tree(dir.path());
    let mut agent = start(&flags(dir.path(), &[]));
    for i in 0..13 {
        let t = Instant::now();
        let (status, body) = get(agent.addr, "/metrics", Duration::from_secs(5)).unwrap_or_else(|| panic!("scrape {i} answered"));
        assert_eq!(status, 200);
        assert!(t.elapsed() < Duration::from_secs(2), "scrape {i} took {:?}", t.elapsed());
        assert!(body.contains("node_textfile_scrape_error 1"), "the FIFO textfile is an error: {body}");
        assert!(body.contains("good_metric 1"), "the good textfile is read: {body}");
        assert!(body.contains("node_scrape_collector_success{collector=\"loadavg\"} 1"), "{body}");
        assert!(!body.contains("node_hwmon_temp_celsius"), "no temperature from a FIFO: {body}");
    }
    let (status, body) = get(agent.addr, "/metrics?collect[]=loadavg", Duration::from_secs(2)).expect("collect[] answers");
    assert!(status == 200 && body.contains("node_load1 0.21"), "{body}");
    assert_eq!(get(agent.addr, "/readyz", Duration::from_secs(1)).map(|r| r.0), Some(200), "nothing is stuck");
    sigterm_exits(&mut agent, Duration::from_secs(5));
}

fn root_with_fuse() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with /dev/fuse");
        eprintln!("SKIP: needs root and /dev/fuse");
        return false;
    }
    true
}

/// An agent running `collector` and loadavg on `root`, with `fuse` (the
/// mount the collector will hang on) and a per-collector `timeout`.
fn start_hung(root: &Path, collector: &str, fuse: Fuse, timeout: Duration) -> Agent {
    start_reading(
        &[
            format!("--path.procfs={}", root.join("proc").display()),
            format!("--path.sysfs={}", root.join("sys").display()),
            "--collector.disable-defaults".into(),
            format!("--collector.{collector}"),
            "--collector.loadavg".into(),
            "--web.disable-exporter-metrics".into(),
            format!("--collector.timeout={}ms", timeout.as_millis()),
        ],
        Some(fuse),
    )
}

/// The first scrape is cut off at `timeout` with `collector` failed and
/// loadavg served; the next `scrapes` skip the stuck collector at once,
/// and no thread piles up.
fn cut_off_then_skipped(agent: &mut Agent, collector: &str, timeout: Duration, scrapes: usize) {
    let failed = format!("node_scrape_collector_success{{collector=\"{collector}\"}} 0");
    let t = Instant::now();
    let (status, first) = get(agent.addr, "/metrics", Duration::from_secs(10)).expect("the first scrape answers");
    let took = t.elapsed();
    assert_eq!(status, 200);
    assert!(took >= timeout && took < timeout + Duration::from_secs(2), "cut off at the deadline: {took:?}");
    assert!(first.contains(&failed), "{first}");
    assert!(first.contains("node_scrape_collector_success{collector=\"loadavg\"} 1") && first.contains("node_load1 0.21"), "{first}");
    assert!(agent.fuse().held() > 0, "the collector is inside a held FUSE request");
    let pid = agent.child.id();
    let before = threads(pid);
    for i in 0..scrapes {
        let t = Instant::now();
        let (_, body) = get(agent.addr, "/metrics", Duration::from_secs(5)).unwrap_or_else(|| panic!("scrape {i}"));
        assert!(t.elapsed() < Duration::from_millis(500), "scrape {i} skipped the stuck collector at once: {:?}", t.elapsed());
        assert!(body.contains(&failed) && body.contains("node_load1"), "{body}");
        let t = Instant::now();
        assert_eq!(get(agent.addr, "/healthz", Duration::from_secs(1)).map(|r| r.0), Some(200));
        assert!(t.elapsed() < Duration::from_millis(200), "/healthz is never delayed");
    }
    assert!(threads(pid) <= before + 1, "no thread piles up: {before} -> {}", threads(pid));
}

/// A hwmon chip whose files never answer (a FUSE mount holding every
/// request): cut off at the deadline, then skipped, one thread held, ready
/// fails after three deadlines, and it runs again once it answers.
#[test]
fn a_hung_hwmon_read_is_cut_off_skipped_and_recovered() {
    if !root_with_fuse() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "proc/loadavg", "0.21 0.37 0.39 1/719 19737\n");
    write(root, "sys/class/hwmon/hwmon0/name", "coretemp\n");
    write(root, "sys/class/hwmon/hwmon0/temp1_input", "42000\n");
    std::fs::create_dir_all(root.join("sys/class/hwmon/hwmon1")).expect("mkdir");
    let fuse = Fuse::mount_holding(&root.join("sys/class/hwmon/hwmon1"), Hold::Everything).expect("FUSE mount");
    let timeout = Duration::from_millis(800);
    let mut agent = start_hung(root, "hwmon", fuse, timeout);
    cut_off_then_skipped(&mut agent, "hwmon", timeout, 30);
    let t = Instant::now();
    let (status, body) = get(agent.addr, "/metrics?collect[]=loadavg", Duration::from_secs(2)).expect("collect[]");
    assert!(status == 200 && body.contains("node_load1"), "{body}");

    // Stuck past three deadlines: not ready, and it says which.
    std::thread::sleep((timeout * 3).saturating_sub(t.elapsed()) + Duration::from_millis(200));
    let (status, body) = get(agent.addr, "/readyz", Duration::from_secs(1)).expect("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("hwmon"), "{body}");

    // It answers: it runs again, and the agent is ready again.
    agent.fuse().release();
    let t = Instant::now();
    loop {
        let (_, body) = get(agent.addr, "/metrics", Duration::from_secs(5)).expect("scrape");
        if body.contains("node_scrape_collector_success{collector=\"hwmon\"} 1") {
            assert!(
                body.contains("node_hwmon_temp_celsius{chip=\"platform_coretemp\"") || body.contains("node_hwmon_temp_celsius"),
                "{body}"
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "hwmon back within 10 s: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(agent.addr, "/readyz", Duration::from_secs(1)).map(|r| r.0), Some(200));
    sigterm_exits(&mut agent, Duration::from_secs(5));
}

/// SIGTERM while a collector is stuck inside the kernel on a request its
/// server has not taken (killable, as a hard NFS mount is): the process
/// exits within the grace period all the same. (A request the server has
/// taken and never answers leaves the thread in uninterruptible sleep, which
/// no signal ends, for node_exporter neither.)
#[test]
fn sigterm_exits_while_a_collector_is_stuck() {
    if !root_with_fuse() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "proc/loadavg", "0.21 0.37 0.39 1/719 19737\n");
    std::fs::create_dir_all(root.join("sys/class/hwmon/hwmon0")).expect("mkdir");
    let fuse = Fuse::mount_holding(&root.join("sys/class/hwmon/hwmon0"), Hold::Unread).expect("FUSE mount");
    let mut agent = start_reading(
        &[
            format!("--path.procfs={}", root.join("proc").display()),
            format!("--path.sysfs={}", root.join("sys").display()),
            "--collector.disable-defaults".into(),
            "--collector.hwmon".into(),
            "--collector.loadavg".into(),
            "--collector.timeout=500ms".into(),
        ],
        Some(fuse),
    );
    for _ in 0..5 {
        let (_, body) = get(agent.addr, "/metrics", Duration::from_secs(5)).expect("scrape");
        assert!(body.contains("node_scrape_collector_success{collector=\"hwmon\"} 0"), "{body}");
    }
    let took = sigterm_exits(&mut agent, Duration::from_secs(15));
    eprintln!("exited {took:?} after SIGTERM with a stuck collector");
}

/// The nfs collector's /proc/net/rpc/nfs on a mount that never answers (a
/// FUSE mount at proc/net/rpc holding every request, as a wedged NFS client
/// would): cut off at the deadline, skipped while stuck without piling up
/// threads, and run again once the mount answers.
#[test]
fn a_hung_nfs_read_is_cut_off_skipped_and_recovered() {
    if !root_with_fuse() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    write(root, "proc/loadavg", "0.21 0.37 0.39 1/719 19737\n");
    std::fs::create_dir_all(root.join("proc/net/rpc")).expect("mkdir");
    let fuse = Fuse::mount_holding(&root.join("proc/net/rpc"), Hold::Everything).expect("FUSE mount");
    let timeout = Duration::from_millis(600);
    let mut agent = start_hung(root, "nfs", fuse, timeout);
    cut_off_then_skipped(&mut agent, "nfs", timeout, 20);
    assert_eq!(agent.fuse().held(), 1, "one stuck read, not one per scrape: held opcodes {:?}", agent.fuse().held_opcodes());

    // The mount answers (ENOENT: no NFS client statistics): the collector
    // is no longer stuck and the agent is ready.
    agent.fuse().release();
    let t = Instant::now();
    while get(agent.addr, "/readyz", Duration::from_secs(1)).map(|r| r.0) != Some(200) {
        assert!(t.elapsed() < Duration::from_secs(10), "ready again within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, body) = get(agent.addr, "/metrics", Duration::from_secs(5)).expect("scrape");
    assert!(body.contains("node_scrape_collector_success{collector=\"nfs\"}") && body.contains("node_load1"), "{body}");
    sigterm_exits(&mut agent, Duration::from_secs(5));
}
