//! Conformance with node_exporter: node-agent runs on node_exporter's own
//! end-to-end fixture trees with node_exporter's whole end-to-end command
//! line (`e2e-args.txt`, the fixture paths substituted), and every family
//! of `e2e-output.txt` must match exactly (TYPE, label names and values,
//! sample values; HELP may differ), apart from node_exporter's own skip
//! list, its Go-runtime families, the gaps below (each with its reason) and
//! the families of collectors node-agent does not have yet. Families read
//! from the live machine (`LIVE`) are compared without their values. It
//! prints `N/1181 families exact`.
//!
//! `CONFORMANCE_ONLY=prefix` prints the differences of the families with
//! that prefix in full (for work on one collector).

use std::collections::{BTreeMap, BTreeSet};

use expo::text::{self as expfmt, Family};

/// node_exporter's own skip list for its end-to-end comparison. Its metric
/// handler's families (`promhttp_metric_handler_*`) are compared: the run
/// goes through node-agent's HTTP server with the exporter's own metrics on,
/// as node_exporter's does.
const SKIP: &str = r"^(go_|node_exporter_build_info|node_scrape_collector_duration_seconds|process_|node_textfile_mtime_seconds|node_time_(zone|seconds)|node_network_(receive|transmit)_(bytes|packets)_total)";

/// Families no run of node-agent on these fixtures can reproduce, each with
/// its reason. Keep it short.
const KNOWN_GAPS: &[(&str, &str)] = &[];

/// Families both node_exporter and node-agent read from the live machine
/// (netdev over rtnetlink: the fixtures have no /proc/net/dev, and the
/// e2e command line keeps only `lo`). Compared by TYPE and label sets; the
/// values are the machine's own.
const LIVE: &[&str] = &[
    "node_network_receive_compressed_total",
    "node_network_receive_drop_total",
    "node_network_receive_errs_total",
    "node_network_receive_fifo_total",
    "node_network_receive_frame_total",
    "node_network_receive_multicast_total",
    "node_network_receive_nohandler_total",
    "node_network_transmit_carrier_total",
    "node_network_transmit_colls_total",
    "node_network_transmit_compressed_total",
    "node_network_transmit_drop_total",
    "node_network_transmit_errs_total",
    "node_network_transmit_fifo_total",
];

/// Links of the fixture trees that collectors read through (hwmon's class
/// entries, netclass, cpu and node's bus entries, pcidevice, thermal_zone,
/// tapestats, bcache, /proc/self): each must be a link to a directory once
/// the fixtures are materialized, whether they arrived with their links or
/// with the links flattened into files.
const NEEDED_LINKS: &[&str] = &[
    "proc/self",
    "sys/class/hwmon/hwmon0",
    "sys/class/net/eth0",
    "sys/bus/cpu/devices/cpu0",
    "sys/bus/node/devices/node0",
    "sys/bus/pci/devices/0000:01:00.0",
    "sys/class/thermal/thermal_zone0",
    "sys/class/scsi_tape/st0",
    "sys/fs/bcache/deaddd54-c735-46d5-868e-f331c5fd7c74/bdev0",
];

/// node_exporter collectors node-agent does not have yet, with the family
/// prefixes they own. Their families are not compared, and they are counted
/// as not matched.
const NOT_IMPLEMENTED: &[(&str, &[&str])] = &[];

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

/// node_exporter's end-to-end command line, the fixtures at `root`.
fn e2e_args(fixtures: &std::path::Path, root: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(fixtures.join("e2e-args.txt")).expect("e2e-args.txt");
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.trim().replace("FIXTURES", &root.display().to_string())).collect()
}

/// The first scrape of node-agent's /metrics, served as node_exporter's e2e
/// run serves it (over HTTP, the exporter's own metrics on).
fn run_agent(root: &std::path::Path, fixtures: &std::path::Path) -> String {
    let mut args = vec!["node-agent".to_string(), "--web.listen-address=127.0.0.1:0".to_string()];
    args.extend(e2e_args(fixtures, root));
    // node-agent's own collectors (eBPF, pods) have no node_exporter counterpart.
    args.extend(node_agent::manifests::agent_only_collectors().iter().map(|c| format!("--no-collector.{c}")));
    let m = node_agent::cmd::command()
        .try_get_matches_from(&args)
        .unwrap_or_else(|e| panic!("node_exporter's e2e command line is accepted: {e}"));
    let agent = node_agent::agent::Agent::start(&m).expect("the agent starts on node_exporter's e2e command line");
    let (status, body) =
        node_agent_tests::http_get(agent.addrs[0], "/metrics", std::time::Duration::from_secs(60)).expect("an answer from /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

fn not_implemented(name: &str) -> Option<&'static str> {
    NOT_IMPLEMENTED.iter().find(|(_, prefixes)| prefixes.iter().any(|p| name.starts_with(p))).map(|(c, _)| *c)
}

#[test]
fn matches_node_exporter_e2e_output() {
    let Some(fixtures) = node_agent_tests::conformance_dir() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let made = node_agent_tests::materialize(&fixtures, tmp.path()).expect("copy fixtures");
    eprintln!("fixture links: {} copied as links, {} restored from flattened files", made.copied, made.restored);
    assert!(made.links() > 50, "the fixtures' sysfs links, copied or restored: {made:?}");
    for link in NEEDED_LINKS {
        let p = tmp.path().join(link);
        let is_link = std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink());
        assert!(is_link && p.is_dir(), "{link} is a link to a directory in the materialized fixtures ({made:?})");
    }

    // Labels that carry a path (rapl's `path`) name the fixtures as
    // node_exporter's e2e run saw them: relative, under collector/fixtures.
    let ours_text = run_agent(tmp.path(), &fixtures).replace(&tmp.path().display().to_string(), "collector/fixtures");
    let theirs_text = std::fs::read_to_string(fixtures.join("e2e-output.txt")).expect("read e2e-output.txt");
    let ours_f = expfmt::parse(&ours_text).expect("node-agent output parses");
    let theirs_f = expfmt::parse(&theirs_text).expect("e2e output parses");
    let skip = regex::Regex::new(SKIP).expect("skip regex");
    let only = std::env::var("CONFORMANCE_ONLY").ok();

    let ours_by: BTreeMap<&str, &Family> = ours_f.iter().map(|f| (f.name.as_str(), f)).collect();
    let theirs_by: BTreeMap<&str, &Family> = theirs_f.iter().map(|f| (f.name.as_str(), f)).collect();
    let implemented: BTreeSet<String> = ours_by
        .get("node_scrape_collector_success")
        .map(|f| f.samples.iter().filter_map(|s| s.labels.iter().find(|(k, _)| k == "collector").map(|(_, v)| v.clone())).collect())
        .unwrap_or_default();

    let mut problems = Vec::new();
    let (mut comparable, mut exact) = (0, 0);
    let mut missing_by_collector: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, theirs) in &theirs_by {
        if skip.is_match(name) {
            continue;
        }
        comparable += 1;
        let gap = KNOWN_GAPS.iter().find(|(g, _)| g == name);
        let Some(mine) = ours_by.get(name) else {
            match (gap, not_implemented(name)) {
                (Some(_), _) => {}
                (None, Some(c)) if !implemented.contains(c) => *missing_by_collector.entry(c).or_default() += 1,
                _ => problems.push(format!("missing family {name}")),
            }
            continue;
        };
        if let Some((g, why)) = gap {
            problems.push(format!("{g} is listed as a gap ({why}) but node-agent prints it: update KNOWN_GAPS"));
        }
        let mut same = true;
        if mine.kind != theirs.kind {
            same = false;
            problems.push(format!("{name}: TYPE {} vs node_exporter's {}", mine.kind.as_str(), theirs.kind.as_str()));
        }
        let (mut a, mut b) = (sample_set(mine), sample_set(theirs));
        if LIVE.contains(name) {
            let labels_only = |s: SampleSet| -> SampleSet { s.into_iter().map(|(l, _)| (l, String::new())).collect() };
            (a, b) = (labels_only(a), labels_only(b));
        }
        if *name == "node_scrape_collector_success" {
            // Collectors node-agent lacks are counted above, by family.
            b.retain(|(l, _)| implemented.contains(&l[1].1));
        }
        let (extra, lacking): (Vec<_>, Vec<_>) = (a.difference(&b).collect(), b.difference(&a).collect());
        if !extra.is_empty() || !lacking.is_empty() {
            same = false;
            let detail = only.as_deref().is_some_and(|p| name.starts_with(p));
            let cut = if detail { usize::MAX } else { 3 };
            for x in extra.iter().take(cut) {
                problems.push(format!("{name}: node-agent has {x:?} which node_exporter lacks"));
            }
            for x in lacking.iter().take(cut) {
                problems.push(format!("{name}: node_exporter has {x:?} which node-agent lacks"));
            }
            let shown = extra.len().min(cut) + lacking.len().min(cut);
            if extra.len() + lacking.len() > shown {
                problems.push(format!("{name}: {} more differences", extra.len() + lacking.len() - shown));
            }
        }
        if same {
            exact += 1;
        }
    }
    // Every one of our families must also exist in node_exporter's output
    // (apart from the skip list and node-agent's own `node_agent_*`):
    // nothing invented under its names.
    for name in ours_by.keys() {
        if !skip.is_match(name) && !name.starts_with("node_agent_") && !theirs_by.contains_key(name) {
            problems.push(format!("node-agent prints {name}, which node_exporter does not print for these fixtures"));
        }
    }
    let gaps = KNOWN_GAPS.len();
    eprintln!("{exact}/{comparable} families exact ({gaps} known gaps; not yet implemented: {missing_by_collector:?})");
    if let Some(p) = &only {
        for x in problems.iter().filter(|x| x.contains(p.as_str())) {
            eprintln!("{x}");
        }
    }
    assert!(comparable >= 1100, "too few comparable families: {comparable}");
    assert!(problems.is_empty(), "{} conformance problems:\n{}", problems.len(), problems.join("\n"));
}
