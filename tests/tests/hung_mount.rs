//! A mount whose statfs never returns: a real FUSE filesystem, served by a
//! minimal FUSE server in this test (it answers INIT and holds every STATFS
//! until told to answer). The scrape returns within the mount timeout with
//! `node_filesystem_device_error{device_error="mountpoint timeout"} 1`, later
//! scrapes skip the mount without waiting, the mount is reported again once
//! its statfs answers, and 1,000 scrapes leak no thread and no fd.

use std::time::{Duration, Instant};

use node_agent_tests::fuse::Fuse;

use expo::Format;
use runtime::Selection;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

#[test]
fn a_hung_fuse_mount_is_reported_skipped_and_recovered_without_leaks() {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/fuse").exists() {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root with /dev/fuse");
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("hang");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut fuse = Fuse::mount(&mnt).expect("a FUSE mount (root, /dev/fuse)");
    let label = mnt.display().to_string();
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent".to_string(),
            "--collector.disable-defaults".into(),
            "--collector.filesystem".into(),
            "--collector.filesystem.mount-timeout=1s".into(),
            format!("--collector.filesystem.mount-points-include=^{}$", regex::escape(&label)),
        ])
        .expect("flags");
    let cfg = node_agent::config::resolve(&m).expect("config");
    let scraper = node_agent::agent::scraper(cfg.collectors, false);
    let scrape = || String::from_utf8(scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8");
    let timeout_line = format!("node_filesystem_device_error{{device=\"node-agent-test\",device_error=\"mountpoint timeout\",fstype=\"fuse.hang\",mountpoint=\"{label}\"}} 1");

    // 1. The statfs hangs: the scrape comes back at the deadline, the mount marked.
    let t = Instant::now();
    let text = scrape();
    let first = t.elapsed();
    assert!(first >= Duration::from_millis(900) && first < Duration::from_secs(3), "first scrape took {first:?}");
    assert!(text.contains(&timeout_line), "{text}");
    assert!(text.contains("node_scrape_collector_success{collector=\"filesystem\"} 1") || !text.contains("collector=\"filesystem\"} 0"));
    assert!(fuse.held() > 0, "the kernel is waiting on our statfs");

    // 2. Skipped while it does not answer: no waiting, still reported.
    let t = Instant::now();
    let text = scrape();
    assert!(t.elapsed() < Duration::from_millis(500), "a stuck mount is not waited for again: {:?}", t.elapsed());
    assert!(text.contains(&timeout_line), "{text}");

    // 3. 1,000 scrapes: no thread, no fd grows.
    let (t0, f0) = (threads(), fds());
    for _ in 0..1000 {
        let _ = scrape();
    }
    assert!(threads() <= t0, "threads {t0} -> {}", threads());
    assert!(fds() <= f0, "fds {f0} -> {}", fds());

    // 4. It answers again: the pending statfs returns and the mount is back.
    fuse.release();
    let t = Instant::now();
    let text = loop {
        let text = scrape();
        if text.contains(&format!(
            "node_filesystem_size_bytes{{device=\"node-agent-test\",device_error=\"\",fstype=\"fuse.hang\",mountpoint=\"{label}\"}}"
        )) || t.elapsed() > Duration::from_secs(10)
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains("node_filesystem_size_bytes{") && text.contains(&label), "the mount is reported again once it answers:\n{text}");
    assert!(!text.contains(&timeout_line));
    drop(fuse);
}
