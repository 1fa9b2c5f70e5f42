//! Conformance with node_exporter: node-agent runs on node_exporter's own
//! end-to-end fixture trees with the equivalent flags, and every family both
//! print must match node_exporter's `e2e-output.txt` exactly (TYPE, label
//! names and values, sample values; HELP may differ).

use std::collections::{BTreeMap, BTreeSet};

use expo::text::{self as expfmt, Family};
use expo::Format;
use host::scrape::Selection;

/// node_exporter's own skip list for its end-to-end comparison.
const SKIP: &str = r"^(go_|node_exporter_build_info|node_scrape_collector_duration_seconds|process_|node_textfile_mtime_seconds|node_time_(zone|seconds)|node_network_(receive|transmit)_(bytes|packets)_total)";

/// Family prefixes that node-agent's collectors are responsible for.
const OURS: &[&str] = &[
    "node_arp_",
    "node_nf_conntrack_",
    "node_cpu_",
    "node_disk_",
    "node_entropy_",
    "node_filefd_",
    "node_filesystem_",
    "node_hwmon_",
    "node_load",
    "node_memory_",
    "node_network_",
    "node_netstat_",
    "node_os_",
    "node_pressure_",
    "node_schedstat_",
    "node_sockstat_",
    "node_softnet_",
    "node_intr_total",
    "node_context_switches_total",
    "node_forks_total",
    "node_boot_time_seconds",
    "node_procs_",
    "node_softirqs_total",
    "node_textfile_",
    "node_thermal_zone_",
    "node_cooling_device_",
    "node_time_",
    "node_udp_queues",
    "node_uname_",
    "node_vmstat_",
    "node_timex_",
    "node_selinux_",
    "testmetric",
];

/// Families matching OURS that other node_exporter collectors print.
const NOT_OURS: &[(&str, &str)] = &[
    ("node_memory_numa_", "meminfo_numa collector"),
    ("node_cpu_vulnerabilities_info", "cpu_vulnerabilities collector"),
    ("node_network_receive_nohandler_total", "netdev over rtnetlink only; the fixtures carry no /proc/net/dev"),
];

/// Families of our collectors that node_exporter prints and we don't, each
/// with its reason. Keep it short.
const KNOWN_GAPS: &[(&str, &str)] = &[
    // node_exporter 1.12 reads netdev counters over rtnetlink from the live
    // test machine (see the fixtures' README); there is no /proc/net/dev.
    ("node_network_receive_compressed_total", "netdev: live-machine data in e2e-output.txt"),
    ("node_network_receive_drop_total", "netdev: live-machine data"),
    ("node_network_receive_errs_total", "netdev: live-machine data"),
    ("node_network_receive_fifo_total", "netdev: live-machine data"),
    ("node_network_receive_frame_total", "netdev: live-machine data"),
    ("node_network_receive_multicast_total", "netdev: live-machine data"),
    ("node_network_transmit_carrier_total", "netdev: live-machine data"),
    ("node_network_transmit_colls_total", "netdev: live-machine data"),
    ("node_network_transmit_compressed_total", "netdev: live-machine data"),
    ("node_network_transmit_drop_total", "netdev: live-machine data"),
    ("node_network_transmit_errs_total", "netdev: live-machine data"),
    ("node_network_transmit_fifo_total", "netdev: live-machine data"),
];

/// Collectors whose `node_scrape_collector_success` legitimately differs.
const SUCCESS_DIFFERS: &[(&str, &str)] =
    &[("netdev", "no /proc/net/dev in the fixtures; node_exporter used rtnetlink on the live machine")];

fn ours(name: &str) -> bool {
    OURS.iter().any(|p| name.starts_with(p)) && !NOT_OURS.iter().any(|(p, _)| name.starts_with(p))
}

type SampleSet = BTreeSet<(Vec<(String, String)>, String)>;

fn sample_set(f: &Family) -> SampleSet {
    f.samples
        .iter()
        .map(|s| {
            let mut labels = s.labels.clone();
            labels.sort();
            // Compare values as floats, exactly (both sides print round-trip floats).
            let v = if s.value.is_nan() { "NaN".to_string() } else { format!("{:?}", s.value) };
            (std::iter::once(("__name__".to_string(), s.name.clone())).chain(labels).collect(), v)
        })
        .collect()
}

fn run_agent(root: &std::path::Path, fixtures: &std::path::Path) -> String {
    let mut args = node_agent_tests::fixture_flags(root, &fixtures.join("textfile/two_metric_files"));
    args.extend(
        [
            "--collector.cpu.info.bugs-include=^(cpu_meltdown|spectre_.*|mds)$",
            "--collector.cpu.info.flags-include=^(aes|avx.?|constant_tsc)$",
            "--collector.hwmon.chip-include=(applesmc|asus_nb_wmi|coretemp|hwmon4|ieee80211|nct6779)",
            "--collector.netclass.ignore-invalid-speed",
            "--collector.netclass.ignored-devices=(dmz|int)",
            "--collector.netdev.device-include=lo",
            "--collector.stat.softirq",
            "--collector.arp.device-exclude=nope",
            "--no-collector.arp.netlink",
            "--no-collector.filesystem",
            "--no-collector.uname",
            "--no-collector.timex",
            "--no-collector.selinux",
            "--web.disable-exporter-metrics",
        ]
        .map(String::from),
    );
    // Kernel-event collectors have no node_exporter counterpart.
    args.extend(node_agent::manifests::ebpf_collectors().iter().map(|c| format!("--no-collector.{c}")));
    let m = node_agent::cmd::command().try_get_matches_from(args).expect("flags parse");
    let cfg = node_agent::config::resolve(&m).expect("config resolves");
    let scraper = node_agent::agent::scraper(cfg.collectors, cfg.exporter_metrics);
    String::from_utf8(scraper.scrape(&Selection::default(), Format::Text)).expect("utf-8")
}

#[test]
fn matches_node_exporter_e2e_output() {
    let Some(fixtures) = node_agent_tests::conformance_dir() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let restored = node_agent_tests::materialize(&fixtures, tmp.path()).expect("copy fixtures");
    assert!(restored > 50, "expected the flattened sysfs links to be restored, got {restored}");

    let ours_text = run_agent(tmp.path(), &fixtures);
    let theirs_text = std::fs::read_to_string(fixtures.join("e2e-output.txt")).expect("read e2e-output.txt");
    let ours_f = expfmt::parse(&ours_text).expect("node-agent output parses");
    let theirs_f = expfmt::parse(&theirs_text).expect("e2e output parses");
    let skip = regex::Regex::new(SKIP).expect("skip regex");

    let ours_by: BTreeMap<&str, &Family> = ours_f.iter().map(|f| (f.name.as_str(), f)).collect();
    let theirs_by: BTreeMap<&str, &Family> = theirs_f.iter().map(|f| (f.name.as_str(), f)).collect();

    let mut problems = Vec::new();
    let mut compared = 0;
    for (name, theirs) in &theirs_by {
        if skip.is_match(name) {
            continue;
        }
        let gap = KNOWN_GAPS.iter().find(|(g, _)| g == name);
        let Some(mine) = ours_by.get(name) else {
            if ours(name) && gap.is_none() {
                problems.push(format!("missing family {name} (not in KNOWN_GAPS)"));
            }
            continue;
        };
        if let Some((g, why)) = gap {
            problems.push(format!("{g} is listed as a gap ({why}) but node-agent prints it: update KNOWN_GAPS"));
        }
        compared += 1;
        if mine.kind != theirs.kind {
            problems.push(format!("{name}: TYPE {} vs node_exporter's {}", mine.kind.as_str(), theirs.kind.as_str()));
        }
        let (mut a, mut b) = (sample_set(mine), sample_set(theirs));
        if *name == "node_scrape_collector_success" {
            // Compare only collectors node-agent has.
            let names: BTreeSet<String> = a.iter().map(|(l, _)| l[1].1.clone()).collect();
            b.retain(|(l, _)| names.contains(&l[1].1));
            for (c, _) in SUCCESS_DIFFERS {
                a.retain(|(l, _)| l[1].1 != *c);
                b.retain(|(l, _)| l[1].1 != *c);
            }
        }
        for x in a.difference(&b) {
            problems.push(format!("{name}: node-agent has {x:?} which node_exporter lacks"));
        }
        for x in b.difference(&a) {
            problems.push(format!("{name}: node_exporter has {x:?} which node-agent lacks"));
        }
    }
    // Every one of our families must also exist in node_exporter's output
    // (apart from the skip list): nothing invented under its names.
    for name in ours_by.keys() {
        if !skip.is_match(name) && !theirs_by.contains_key(name) {
            problems.push(format!("node-agent prints {name}, which node_exporter does not print for these fixtures"));
        }
    }
    eprintln!("compared {compared} families");
    assert!(compared > 200, "too few families compared: {compared}");
    assert!(problems.is_empty(), "{} conformance problems:\n{}", problems.len(), problems.join("\n"));
}
