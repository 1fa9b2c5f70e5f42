//! Linux capabilities: which ones the agent runs with, and what each
//! missing one disables — logged once at start-up and exported as
//! `node_agent_capability{capability}` so a fleet can alert on nodes where
//! the agent runs degraded.

/// Capability numbers (linux/capability.h).
pub const SYS_PTRACE: u32 = 19;
pub const SYS_ADMIN: u32 = 21;
pub const PERFMON: u32 = 38;
pub const BPF: u32 = 39;

/// A capability the agent uses and what goes without it.
pub struct Use {
    pub cap: u32,
    pub name: &'static str,
    pub without: &'static str,
}

/// What the agent uses. BPF and PERFMON may be replaced by SYS_ADMIN
/// (kernels before 5.8 know only SYS_ADMIN).
pub const USES: &[Use] = &[
    Use { cap: BPF, name: "BPF", without: "the eBPF collectors are down (no program or map can be loaded) unless SYS_ADMIN is held" },
    Use { cap: PERFMON, name: "PERFMON", without: "the eBPF tracepoint programs cannot attach unless SYS_ADMIN is held" },
    Use {
        cap: SYS_PTRACE,
        name: "SYS_PTRACE",
        without: "the filesystem collector cannot read the host's mount table (/proc/1/mountinfo) and reports the agent's own mounts",
    },
];

/// The effective set from /proc/self/status (`CapEff:` in hex).
pub fn parse_effective(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

pub fn has(set: u64, cap: u32) -> bool {
    cap < 64 && set & (1 << cap) != 0
}

/// The calling thread's effective capabilities now (none if unreadable);
/// the agent's threads all hold the same.
pub fn effective() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status").ok().as_deref().and_then(parse_effective).unwrap_or(0)
}

/// For each capability the agent uses: present, or the sentence saying
/// what is disabled without it (`None` when SYS_ADMIN stands in for it).
pub fn report(set: u64) -> Vec<(&'static str, bool, Option<&'static str>)> {
    USES.iter()
        .map(|u| {
            let present = has(set, u.cap);
            let covered = matches!(u.cap, BPF | PERFMON) && has(set, SYS_ADMIN);
            (u.name, present, (!present && !covered).then_some(u.without))
        })
        .collect()
}

/// Logs the report once: info for what the agent has, warn per missing one.
pub fn log_report(set: u64) {
    let have: Vec<&str> = report(set).iter().filter(|(_, p, _)| *p).map(|(n, _, _)| *n).collect();
    tracing::info!(capabilities = %have.join(","), sys_admin = has(set, SYS_ADMIN), "capabilities");
    for (name, _, without) in report(set) {
        if let Some(w) = without {
            tracing::warn!(capability = name, "missing capability: {w}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_effective_set() {
        let status = "Name:\tnode-agent\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000080000\nCapBnd:\t000001ffffffffff\n";
        let set = parse_effective(status).unwrap();
        assert!(has(set, BPF) && has(set, PERFMON) && has(set, SYS_PTRACE));
        assert!(!has(set, SYS_ADMIN));
        assert_eq!(parse_effective("Name: x\n"), None);
    }

    #[test]
    fn reports_what_each_missing_capability_disables() {
        let r = report(1 << SYS_PTRACE);
        assert_eq!(r.iter().map(|(n, p, _)| (*n, *p)).collect::<Vec<_>>(), [("BPF", false), ("PERFMON", false), ("SYS_PTRACE", true)]);
        assert!(r[0].2.is_some_and(|w| w.contains("eBPF collectors are down")));
        // SYS_ADMIN stands in for BPF and PERFMON.
        let r = report(1 << SYS_ADMIN);
        assert!(r[0].2.is_none() && r[1].2.is_none());
        assert!(r[2].2.is_some_and(|w| w.contains("/proc/1/mountinfo")));
    }
}
