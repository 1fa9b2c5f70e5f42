//! Hostile host trees, generated: 256 CPUs, 10,000 mounts, 2,000 network
//! devices (in /proc/net/dev and in /sys/class/net), values at u64::MAX,
//! unknown new fields and columns, a truncated file, an empty file, a file
//! that is a directory, missing files. The scrape stays correct for what is
//! readable, each broken collector reports success 0 alone, and a scrape
//! stays under the stated bound (10 s in a debug build; the figures are
//! printed).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use expo::Format;
use runtime::{Scraper, Selection};

const CPUS: usize = 256;
const MOUNTS: usize = 10_000;
const DEVICES: usize = 2_000;
const MAX: u64 = u64::MAX;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

fn tree(root: &Path) {
    let mut stat = String::from("cpu  10 0 10 1000 5 0 1 0 0 0\n");
    for c in 0..CPUS {
        let _ = writeln!(stat, "cpu{c} {MAX} 0 {MAX} {MAX} 5 0 1 0 0 0 42 43");
    }
    stat.push_str("intr 100 1 2\nctxt 1000\nbtime 1700000000\nprocesses 500\nprocs_running 2\nprocs_blocked 0\nsoftirq 10 1 2 3 4 5 6 7 8 9 10\nnew_line_from_2030 1 2 3\n");
    write(root, "proc/stat", &stat);
    write(
        root,
        "proc/meminfo",
        &format!("MemTotal:       {MAX} kB\nMemFree:        1000 kB\nNewField2030:   5 kB\nHugePages_Total: {MAX}\n"),
    );
    let mut dev = String::from("Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n");
    for d in 0..DEVICES {
        let _ = writeln!(dev, "veth{d:05}: {MAX} 1 0 0 0 0 0 0 {MAX} 1 0 0 0 0 0 0");
    }
    write(root, "proc/net/dev", &dev);
    for d in 0..DEVICES {
        let base = format!("sys/class/net/veth{d:05}");
        write(root, &format!("{base}/operstate"), "up\n");
        write(root, &format!("{base}/mtu"), "1500\n");
        write(root, &format!("{base}/address"), "02:00:00:00:00:01\n");
        write(root, &format!("{base}/speed"), &format!("{MAX}\n"));
    }
    let mut mounts = String::new();
    for m in 0..MOUNTS {
        let _ = writeln!(mounts, "{} 1 0:{} / /mnt/m{m} rw,relatime shared:1 - tmpfs tmpfs rw,size=1k", 100 + m, 100 + m);
    }
    write(root, "proc/1/mountinfo", &mounts);
    // Truncated mid-line.
    write(root, "proc/loadavg", "0.21 0.3");
    // Empty.
    write(root, "proc/vmstat", "");
    // More columns than any kernel has today, and u64::MAX.
    write(root, "proc/diskstats", &format!("   8       0 sda {MAX} 0 {MAX} 1 2 0 3 4 0 5 6 7 0 8 9 10 11 12 13 14 15\n"));
    // A directory where a file should be.
    std::fs::create_dir_all(root.join("proc/pressure/cpu")).expect("mkdir");
    // /proc/net/snmp is missing altogether (netstat: no data).
    std::fs::create_dir_all(root.join("root")).expect("mkdir");
}

fn scraper(root: &Path) -> Scraper {
    let mut args = vec![
        "node-agent".to_string(),
        format!("--path.procfs={}", root.join("proc").display()),
        format!("--path.sysfs={}", root.join("sys").display()),
        format!("--path.rootfs={}", root.join("root").display()),
        "--collector.disable-defaults".into(),
        // Only the mounts under /mnt are of interest here.
        "--collector.filesystem.mount-points-exclude=^/(dev|proc|sys)($|/)".into(),
        // The synthetic /proc/net/dev, not this machine's rtnetlink.
        "--no-collector.netdev.netlink".into(),
    ];
    for c in ["cpu", "stat", "meminfo", "netdev", "netclass", "filesystem", "loadavg", "vmstat", "diskstats", "pressure", "netstat"] {
        args.push(format!("--collector.{c}"));
    }
    let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
    let cfg = node_agent::config::resolve(&m).expect("config");
    node_agent::agent::scraper(cfg.collectors, false)
}

fn success(text: &str, collector: &str) -> Option<f64> {
    let key = format!("node_scrape_collector_success{{collector=\"{collector}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok())
}

fn value(text: &str, series: &str) -> Option<f64> {
    let key = format!("{series} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok())
}

fn count(text: &str, prefix: &str) -> usize {
    text.lines().filter(|l| l.starts_with(prefix)).count()
}

#[test]
fn huge_odd_and_broken_trees_scrape_correctly_and_in_bounded_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let made = Instant::now();
    tree(dir.path());
    eprintln!("tree made in {:?}", made.elapsed());
    let s = scraper(dir.path());
    let mut times = Vec::new();
    let mut text = String::new();
    for _ in 0..3 {
        let t = Instant::now();
        text = String::from_utf8(s.scrape(&Selection::default(), Format::Text)).expect("utf-8");
        times.push(t.elapsed());
    }
    eprintln!("scrape times {times:?}, {} bytes", text.len());
    assert!(times.iter().all(|t| *t < Duration::from_secs(10)), "scrape bound exceeded: {times:?}");

    // Readable and well-formed: correct, complete.
    assert_eq!(success(&text, "cpu"), Some(1.0));
    assert_eq!(count(&text, "node_cpu_seconds_total{cpu=\"255\","), 8, "256 CPUs, every mode of the last one");
    assert_eq!(count(&text, "node_cpu_seconds_total{"), CPUS * 8);
    assert_eq!(success(&text, "stat"), Some(1.0));
    assert_eq!(success(&text, "meminfo"), Some(1.0));
    let total: f64 =
        text.lines().find_map(|l| l.strip_prefix("node_memory_MemTotal_bytes ")).and_then(|v| v.parse().ok()).expect("MemTotal");
    assert_eq!(total, MAX as f64 * 1024.0, "u64::MAX kB, in bytes, as a float");
    assert!(text.contains("node_memory_NewField2030_bytes 5120"), "an unknown meminfo field is exported as node_exporter does");
    assert_eq!(success(&text, "netdev"), Some(1.0));
    assert_eq!(count(&text, "node_network_receive_bytes_total{"), DEVICES);
    assert_eq!(value(&text, "node_network_receive_bytes_total{device=\"veth01999\"}"), Some(MAX as f64));
    assert_eq!(success(&text, "netclass"), Some(1.0));
    assert_eq!(count(&text, "node_network_mtu_bytes{"), DEVICES);
    assert_eq!(success(&text, "filesystem"), Some(1.0));
    assert_eq!(
        count(&text, "node_filesystem_device_error{"),
        MOUNTS,
        "every mount reported, each with its error (nothing is mounted under the fake root)"
    );
    assert_eq!(success(&text, "diskstats"), Some(1.0));
    assert_eq!(value(&text, "node_disk_reads_completed_total{device=\"sda\"}"), Some(MAX as f64), "u64::MAX counters survive");

    // Broken: that collector alone reports 0, and none of its partial output leaks.
    assert_eq!(success(&text, "loadavg"), Some(0.0), "truncated /proc/loadavg");
    assert!(!text.contains("node_load1 "));
    assert_eq!(success(&text, "pressure"), Some(0.0), "a directory where /proc/pressure/cpu should be");
    assert_eq!(success(&text, "netstat"), Some(0.0), "missing /proc/net/snmp");
    assert!(success(&text, "vmstat").is_some(), "an empty /proc/vmstat is reported, not fatal");
}
