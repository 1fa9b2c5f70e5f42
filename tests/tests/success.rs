//! `node_scrape_collector_success` agrees with node_exporter 1.12.1 for the
//! same input: each case is a small host tree, one collector, and the value
//! node_exporter reports for it (read from its source and prometheus/procfs
//! v0.21.1; the reason is given per case). Runs the real scraper in-process.

use runtime::Selection;

fn success(collector: &str, files: &[(&str, &str)], dirs: &[&str]) -> Option<f64> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    for (rel, text) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }
    let args = [
        "node-agent".to_string(),
        format!("--path.procfs={}", root.join("proc").display()),
        format!("--path.sysfs={}", root.join("sys").display()),
        format!("--path.rootfs={}", root.display()),
        "--collector.disable-defaults".into(),
        format!("--collector.{collector}"),
        "--web.disable-exporter-metrics".into(),
    ];
    let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags");
    let cfg = node_agent::config::resolve(&m).expect("config");
    let scraper = node_agent::agent::scraper(cfg.collectors, cfg.exporter_metrics);
    let text = String::from_utf8(scraper.scrape(&Selection::default(), expo::Format::Text)).expect("utf-8");
    let want = format!("node_scrape_collector_success{{collector=\"{collector}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&want)).and_then(|v| v.trim().parse().ok())
}

/// (collector, files, directories, node_exporter's success, why).
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a str], f64, &'a str);

#[test]
fn no_data_and_bad_data_as_node_exporter_reports_them() {
    let cases: &[Case] = &[
        ("cpufreq", &[], &["sys/devices/system/cpu/cpu0"], 1.0, "no cpufreq dirs: SystemCpufreq returns no entries, Update returns nil"),
        (
            "cpufreq",
            &[
                ("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_cur_freq", "x\n"),
                ("sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "1000\n"),
            ],
            &[],
            0.0,
            "a malformed frequency: parseCpufreqCpuinfo fails",
        ),
        ("cpufreq", &[("sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", "1000\n")], &[], 1.0, "the readable files are read"),
        ("thermal_zone", &[], &["sys/class/thermal"], 1.0, "an empty class: the glob finds nothing, Update returns nil"),
        ("thermal_zone", &[], &["sys/class"], 1.0, "no class at all: likewise"),
        (
            "thermal_zone",
            &[("sys/class/thermal/cooling_device0/type", "Fan\n"), ("sys/class/thermal/cooling_device0/max_state", "x\n")],
            &[],
            0.0,
            "a malformed max_state: parseCoolingDeviceStats fails",
        ),
        ("cpu", &[("proc/stat", "cpu  1 2 x\n")], &[], 0.0, "parseCPUStat fails on the total line"),
        ("stat", &[("proc/stat", "cpu  1 2 x\n")], &[], 0.0, "parseStat parses every cpu line"),
        ("stat", &[("proc/stat", "intr 5 x\nctxt 1\n")], &[], 0.0, "parseStat parses every intr column"),
        ("stat", &[("proc/stat", "softirq 1 2\n")], &[], 0.0, "parseSoftIRQStat needs eleven numbers"),
        ("stat", &[("proc/stat", "ctxt\nbtime 7\n")], &[], 1.0, "a line of one field is skipped"),
        ("sockstat", &[], &["proc/net"], 1.0, "neither sockstat file: both are skipped on ErrNotExist"),
        (
            "schedstat",
            &[("proc/schedstat", "version 15\ntimestamp 1\ncpu0 1 2 3\ncpu1 1 2 3 4 5 6 7 8 9\n")],
            &[],
            1.0,
            "a line that does not match procfs's pattern is skipped",
        ),
        ("vmstat", &[("proc/vmstat", "pgfault 5\nfoo x\n")], &[], 0.0, "every value is parsed before the field filter"),
        ("diskstats", &[("proc/diskstats", "8 1 sda1 1 2 3 4\n")], &[], 1.0, "a short line: Sscanf's EOF is tolerated"),
    ];
    let mut wrong = Vec::new();
    for (collector, files, dirs, want, why) in cases {
        let got = success(collector, files, dirs);
        if got != Some(*want) {
            wrong.push(format!("{collector} {files:?}: success {got:?}, node_exporter {want} ({why})"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
