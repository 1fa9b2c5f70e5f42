//! Linux capabilities: which ones the agent runs with, and what each
//! missing one disables — logged once at start-up and exported as
//! `node_agent_capability{capability}` so a fleet can alert on nodes where
//! the agent runs degraded.

/// Capability numbers (linux/capability.h).
pub const DAC_READ_SEARCH: u32 = 2;
pub const NET_ADMIN: u32 = 12;
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
        cap: NET_ADMIN,
        name: "NET_ADMIN",
        without: "the ebpf_dns collector is down (its cgroup socket-buffer and sendmsg programs cannot be loaded) unless SYS_ADMIN is held",
    },
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
            let covered = matches!(u.cap, BPF | PERFMON | NET_ADMIN) && has(set, SYS_ADMIN);
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

/// What the agent still needs once its eBPF programs are attached: BPF (to
/// read and clean its maps; SYS_ADMIN where it stands in for BPF),
/// SYS_PTRACE (the host's mount table, read on every scrape) and
/// DAC_READ_SEARCH (reads only, for files root does not own) — of those it
/// holds. PERFMON and everything else can go.
pub fn needed_after_start(set: u64) -> u64 {
    let mut keep = 0u64;
    for cap in [BPF, SYS_PTRACE, DAC_READ_SEARCH] {
        if has(set, cap) {
            keep |= 1 << cap;
        }
    }
    if !has(set, BPF) && has(set, SYS_ADMIN) {
        keep |= 1 << SYS_ADMIN;
    }
    keep
}

/// Why capabilities could not be dropped.
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error("installing the signal handler: {0}")]
    Handler(std::io::Error),
    #[error("dropping capabilities in this thread: {0}")]
    Capset(std::io::Error),
    #[error("{0} threads did not drop their capabilities")]
    Threads(usize),
    #[error("thread {tid} still holds capabilities {eff:#x}")]
    Verify { tid: String, eff: u64 },
}

/// The set every thread moves to (effective and permitted), for the handler.
static KEEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static DONE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static FAILED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// capset(2) for the calling thread: effective = permitted = `keep`, no
/// inheritable. Async-signal-safe (one raw syscall, no allocation).
fn capset_thread(keep: u64) -> i64 {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header { version: 0x2008_0522, pid: 0 }; // _LINUX_CAPABILITY_VERSION_3
    let (lo, hi) = (keep as u32, (keep >> 32) as u32);
    let data = [Data { effective: lo, permitted: lo, inheritable: 0 }, Data { effective: hi, permitted: hi, inheritable: 0 }];
    // SAFETY: capset reads a valid v3 header and two data structs we own.
    unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) }
}

extern "C" fn on_drop_signal(_: libc::c_int) {
    use std::sync::atomic::Ordering;
    if capset_thread(KEEP.load(Ordering::SeqCst)) != 0 {
        FAILED.fetch_add(1, Ordering::SeqCst);
    }
    DONE.fetch_add(1, Ordering::SeqCst);
}

fn thread_ids() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Drops every capability but `keep` in every thread of the process.
/// Capabilities belong to threads, so each running thread is signalled to
/// drop its own (the way libcap's psx does it), then the caller drops
/// its; threads created later inherit the reduced sets. Verified by
/// reading every thread's CapEff.
pub fn restrict_all_threads(keep: u64) -> Result<(), DropError> {
    use std::sync::atomic::Ordering;
    let keep = keep & permitted_now();
    KEEP.store(keep, Ordering::SeqCst);
    DONE.store(0, Ordering::SeqCst);
    FAILED.store(0, Ordering::SeqCst);
    let sig = libc::SIGRTMIN() + 7;
    // SAFETY: a zeroed sigaction with a handler that only makes raw
    // syscalls and atomic updates (async-signal-safe).
    let old = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_drop_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, &sa, &mut old) != 0 {
            return Err(DropError::Handler(std::io::Error::last_os_error()));
        }
        old
    };
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut signalled = std::collections::HashSet::new();
    // Again until no new thread shows up: a thread not yet reduced may
    // have started another meanwhile.
    for _ in 0..10 {
        let fresh: Vec<i32> = thread_ids().into_iter().filter(|t| *t != me && !signalled.contains(t)).collect();
        if fresh.is_empty() {
            break;
        }
        for tid in fresh {
            // SAFETY: tgkill to a thread of our own process, with a signal
            // whose handler is installed above.
            if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) } == 0 {
                signalled.insert(tid);
            }
        }
        let t = std::time::Instant::now();
        while DONE.load(Ordering::SeqCst) < signalled.len() && t.elapsed() < std::time::Duration::from_secs(2) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let (done, failed) = (DONE.load(Ordering::SeqCst), FAILED.load(Ordering::SeqCst));
    // SAFETY: restores the previous action for the signal.
    unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
    if done < signalled.len() || failed > 0 {
        return Err(DropError::Threads(signalled.len() - done + failed));
    }
    if capset_thread(keep) != 0 {
        return Err(DropError::Capset(std::io::Error::last_os_error()));
    }
    for tid in thread_ids() {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap_or_default();
        let eff = parse_effective(&status).unwrap_or(0);
        if eff & !keep != 0 {
            return Err(DropError::Verify { tid: tid.to_string(), eff });
        }
    }
    Ok(())
}

/// The calling thread's permitted set (nothing can be added to it).
fn permitted_now() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("CapPrm:")).and_then(|h| u64::from_str_radix(h.trim(), 16).ok()).unwrap_or(0)
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
    fn keeps_only_what_runs_after_start() {
        let all = (1u64 << 41) - 1;
        assert_eq!(needed_after_start(all), 1 << BPF | 1 << SYS_PTRACE | 1 << DAC_READ_SEARCH);
        assert_eq!(needed_after_start(1 << BPF | 1 << PERFMON | 1 << SYS_PTRACE), 1 << BPF | 1 << SYS_PTRACE);
        // Before 5.8 SYS_ADMIN stands in for BPF.
        assert_eq!(needed_after_start(1 << SYS_ADMIN | 1 << SYS_PTRACE), 1 << SYS_ADMIN | 1 << SYS_PTRACE);
        assert_eq!(needed_after_start(0), 0);
    }

    #[test]
    fn reports_what_each_missing_capability_disables() {
        let r = report(1 << SYS_PTRACE);
        assert_eq!(
            r.iter().map(|(n, p, _)| (*n, *p)).collect::<Vec<_>>(),
            [("BPF", false), ("PERFMON", false), ("NET_ADMIN", false), ("SYS_PTRACE", true)]
        );
        assert!(r[0].2.is_some_and(|w| w.contains("eBPF collectors are down")));
        assert!(r[2].2.is_some_and(|w| w.contains("ebpf_dns")));
        // SYS_ADMIN stands in for BPF, PERFMON and NET_ADMIN.
        let r = report(1 << SYS_ADMIN);
        assert!(r[0].2.is_none() && r[1].2.is_none() && r[2].2.is_none());
        assert!(r[3].2.is_some_and(|w| w.contains("/proc/1/mountinfo")));
    }
}
