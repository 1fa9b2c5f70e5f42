//! Side-by-side comparison of node-agent and node_exporter outputs taken on
//! the same machine: families only one prints, and stable values that differ.

use std::collections::{BTreeMap, BTreeSet};

use expo::text::{self as expfmt, Family};

/// Flags given to both sides so they select the same devices: upstream
/// node_exporter 1.12's defaults (Debian's build patches wider mount excludes,
/// and 1.5's disk excludes predate zram).
pub const COMMON_FLAGS: &[&str] = &[
    "--collector.filesystem.mount-points-exclude=^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)",
    "--collector.diskstats.device-exclude=^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\\d+n\\d+p)\\d+$",
];

/// Families only node_exporter prints, and why.
pub const ONLY_NODE_EXPORTER: &[(&str, &str)] = &[
    ("go_", "Go runtime metrics"),
    ("node_exporter_build_info", "node-agent exports node_agent_build_info"),
    ("process_virtual_memory_max_bytes", "Go client only"),
    ("process_network_", "Go client only"),
];

/// Families only node-agent prints, and why.
pub const ONLY_NODE_AGENT: &[(&str, &str)] = &[
    ("node_agent_build_info", "node-agent's build info"),
    ("node_agent_capability", "node-agent's capabilities and what a missing one disables"),
    ("node_agent_http_connections_", "node-agent's connection admission: held, caps and what it closed"),
    ("node_agent_kept_fds", "node-agent's proc and sys files kept open, their budget and its releases"),
    ("node_arp_states", "ARP entries by state over rtnetlink (node_exporter's PR #3191, after 1.12)"),
    ("node_kernel_hung_", "the kernel_hung collector is newer than Debian's node_exporter"),
    ("node_ebpf_", "node-agent's kernel events through eBPF"),
    ("node_filesystem_mount_info", "node_exporter >= 1.8 (newer than Debian's)"),
    ("node_netstat_TcpExt_TCPOFOQueue", "default netstat field since node_exporter 1.7"),
    ("node_netstat_TcpExt_TCPRcvQDrop", "default netstat field since node_exporter 1.7"),
    ("node_netstat_TcpExt_TCPTimeouts", "default netstat field since node_exporter 1.7"),
    ("node_softnet_", "softnet columns added after node_exporter 1.5"),
];

/// Families whose values must agree (labels projected onto the names both
/// sides use), with an absolute tolerance.
pub const STABLE: &[(&str, f64)] = &[
    ("node_memory_MemTotal_bytes", 0.0),
    ("node_memory_SwapTotal_bytes", 0.0),
    ("node_boot_time_seconds", 1.0),
    ("node_filesystem_size_bytes", 0.0),
    ("node_filesystem_files", 0.0),
    ("node_filesystem_readonly", 0.0),
    ("node_uname_info", 0.0),
    ("node_os_info", 0.0),
    ("node_os_version", 0.0),
    ("node_filefd_maximum", 0.0),
    ("node_entropy_pool_size_bits", 0.0),
    ("node_network_mtu_bytes", 0.0),
    ("node_network_info", 0.0),
    ("node_network_up", 0.0),
    ("node_disk_info", 0.0),
    ("node_time_clocksource_current_info", 0.0),
    ("node_nf_conntrack_entries_limit", 0.0),
    ("node_timex_tick_seconds", 0.0),
    ("node_timex_sync_status", 0.0),
    ("node_selinux_enabled", 0.0),
];

fn explained(name: &str, table: &[(&str, &'static str)]) -> Option<&'static str> {
    table.iter().find(|(p, _)| name.starts_with(p)).map(|(_, why)| *why)
}

/// The outcome of a comparison.
#[derive(Debug, Default)]
pub struct Report {
    pub only_node_exporter: Vec<(String, Option<&'static str>)>,
    pub only_node_agent: Vec<(String, Option<&'static str>)>,
    pub cpu_counts: (usize, usize),
    pub value_diffs: Vec<String>,
    pub label_name_diffs: Vec<String>,
    pub compared_values: usize,
}

impl Report {
    /// No unexplained family and no differing stable value.
    pub fn ok(&self) -> bool {
        self.only_node_exporter.iter().all(|(_, w)| w.is_some())
            && self.only_node_agent.iter().all(|(_, w)| w.is_some())
            && self.value_diffs.is_empty()
            && self.cpu_counts.0 == self.cpu_counts.1
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let why = |w: &Option<&str>| w.map(|w| format!(" ({w})")).unwrap_or_else(|| " (UNEXPLAINED)".into());
        s.push_str("Families only node_exporter prints:\n");
        for (n, w) in &self.only_node_exporter {
            s.push_str(&format!("  {n}{}\n", why(w)));
        }
        s.push_str("Families only node-agent prints:\n");
        for (n, w) in &self.only_node_agent {
            s.push_str(&format!("  {n}{}\n", why(w)));
        }
        s.push_str(&format!("CPUs: node-agent {} node_exporter {}\n", self.cpu_counts.0, self.cpu_counts.1));
        s.push_str("Label names that differ (node_exporter version differences; values compared on common labels):\n");
        for d in &self.label_name_diffs {
            s.push_str(&format!("  {d}\n"));
        }
        s.push_str(&format!("Stable values compared: {}; differing: {}\n", self.compared_values, self.value_diffs.len()));
        for d in &self.value_diffs {
            s.push_str(&format!("  {d}\n"));
        }
        s.push_str(if self.ok() { "RESULT: no unexplained difference\n" } else { "RESULT: unexplained differences\n" });
        s
    }
}

fn label_names(f: &Family) -> BTreeSet<String> {
    f.samples.iter().flat_map(|s| s.labels.iter().map(|(k, _)| k.clone())).collect()
}

fn project(f: &Family, keep: &BTreeSet<String>) -> BTreeMap<Vec<(String, String)>, f64> {
    f.samples
        .iter()
        .map(|s| {
            let mut l: Vec<(String, String)> = s.labels.iter().filter(|(k, _)| keep.contains(k)).cloned().collect();
            l.sort();
            (l, s.value)
        })
        .collect()
}

fn cpus(fams: &BTreeMap<&str, &Family>) -> usize {
    fams.get("node_cpu_seconds_total")
        .map(|f| {
            f.samples
                .iter()
                .filter_map(|s| s.labels.iter().find(|(k, _)| k == "cpu").map(|(_, v)| v.clone()))
                .collect::<BTreeSet<_>>()
                .len()
        })
        .unwrap_or(0)
}

/// Compares two expositions taken at about the same time.
pub fn compare(node_agent: &str, node_exporter: &str) -> Result<Report, expfmt::ParseError> {
    let a = expfmt::parse(node_agent)?;
    let b = expfmt::parse(node_exporter)?;
    let am: BTreeMap<&str, &Family> = a.iter().map(|f| (f.name.as_str(), f)).collect();
    let bm: BTreeMap<&str, &Family> = b.iter().map(|f| (f.name.as_str(), f)).collect();
    let mut r = Report::default();
    for n in bm.keys().filter(|n| !am.contains_key(*n)) {
        r.only_node_exporter.push((n.to_string(), explained(n, ONLY_NODE_EXPORTER)));
    }
    for n in am.keys().filter(|n| !bm.contains_key(*n)) {
        r.only_node_agent.push((n.to_string(), explained(n, ONLY_NODE_AGENT)));
    }
    r.cpu_counts = (cpus(&am), cpus(&bm));
    for (name, tol) in STABLE {
        let (Some(fa), Some(fb)) = (am.get(name), bm.get(name)) else { continue };
        let (la, lb) = (label_names(fa), label_names(fb));
        if la != lb {
            r.label_name_diffs.push(format!(
                "{name}: node-agent only {:?}, node_exporter only {:?}",
                la.difference(&lb).collect::<Vec<_>>(),
                lb.difference(&la).collect::<Vec<_>>()
            ));
        }
        let common: BTreeSet<String> = la.intersection(&lb).cloned().collect();
        let (pa, pb) = (project(fa, &common), project(fb, &common));
        for (labels, va) in &pa {
            r.compared_values += 1;
            match pb.get(labels) {
                Some(vb) if (va - vb).abs() <= *tol => {}
                Some(vb) => r.value_diffs.push(format!("{name}{labels:?}: node-agent {va} node_exporter {vb}")),
                None => r.value_diffs.push(format!("{name}{labels:?}: only node-agent ({va})")),
            }
        }
        for (labels, vb) in &pb {
            if !pa.contains_key(labels) {
                r.value_diffs.push(format!("{name}{labels:?}: only node_exporter ({vb})"));
            }
        }
    }
    Ok(r)
}

/// `promtool check metrics` complaints about node-agent's output that it
/// does not also make about node_exporter's. camelCase names of meminfo,
/// netstat and sockstat are node_exporter's own and kept for compatibility.
pub fn promtool_extra(node_agent: &[String], node_exporter: &[String]) -> Vec<String> {
    let theirs: BTreeSet<&String> = node_exporter.iter().collect();
    node_agent
        .iter()
        .filter(|l| !theirs.contains(l))
        .filter(|l| {
            let compat = ["node_memory_", "node_netstat_", "node_sockstat_"].iter().any(|p| l.starts_with(p)) && l.contains("camelCase");
            !compat
        })
        .cloned()
        .collect()
}

/// Runs `promtool check metrics` on an exposition; its complaint lines.
pub fn promtool_check(promtool: &std::path::Path, text: &str) -> std::io::Result<Vec<String>> {
    use std::io::Write;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let all = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok(all.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
}

/// Plain HTTP GET of a URL on this machine; the body as text.
pub fn http_get(url: &str) -> Result<String, String> {
    ureq::get(url).call().map_err(|e| format!("GET {url}: {e}"))?.into_string().map_err(|e| format!("GET {url}: {e}"))
}

/// Finds a program on PATH.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(prog)).find(|p| p.is_file())
}
