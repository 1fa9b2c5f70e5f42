//! Loading node-agent's eBPF programs (built from `agent-ebpf`, embedded in
//! the binary) and sharing them between the eBPF collectors.
//!
//! One object is loaded per agent, with the tracepoint field offsets read
//! from tracefs `format` files set as a read-only global. Each collector
//! attaches its own programs; a program that cannot be loaded or attached is
//! reported down (`node_ebpf_program_up 0`, the reason logged once at warn),
//! never fatal. Dropping the last handle detaches and unloads everything.

pub mod btf;
pub mod syscalls;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_common::Offsets;
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};

use crate::metrics::{Kind, Sink};

/// The compiled eBPF object, built by `agent-ebpf/build.sh` from build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent-ebpf.o"));

/// Where a program attaches.
#[derive(Clone, Copy, Debug)]
pub enum Hook {
    TracePoint(&'static str, &'static str),
    RawTracePoint(&'static str),
}

/// The loaded object, shared by the eBPF collectors.
pub struct Shared {
    ebpf: Mutex<Ebpf>,
    /// Programs attached so far, by name (collectors may share programs).
    attached: Mutex<HashMap<&'static str, Result<(), String>>>,
    /// `PODS_*` bits: the events the programs attribute to cgroups.
    pub pods: u32,
    stats: bool,
    _stats_fd: Option<std::os::fd::OwnedFd>,
    log_stop: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.log_stop.store(true, Ordering::Relaxed);
    }
}

/// Why the eBPF object is not available.
pub type LoadError = String;

/// The tracefs mount aya uses (it looks at these two places only).
pub fn tracefs() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"].iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// Mounts tracefs at /sys/kernel/tracing when it is nowhere to be found and
/// we are permitted to.
fn ensure_tracefs() -> Option<PathBuf> {
    if let Some(p) = tracefs() {
        return Some(p);
    }
    let target = std::ffi::CString::new("/sys/kernel/tracing").ok()?;
    let fstype = std::ffi::CString::new("tracefs").ok()?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        tracing::warn!(err = %std::io::Error::last_os_error(), "tracefs is not mounted and mounting it failed: tracepoint programs will be down");
        return None;
    }
    tracing::info!(path = "/sys/kernel/tracing", "mounted tracefs");
    tracefs()
}

/// Field offsets of one tracepoint, from its tracefs `format` file.
pub fn parse_format(text: &str) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else { continue };
        let mut parts = rest.split(';');
        let decl = parts.next().unwrap_or("").trim();
        let name = decl.rsplit(' ').next().unwrap_or("");
        let name = name.split('[').next().unwrap_or(name);
        let offset = parts.find_map(|p| p.trim().strip_prefix("offset:")).and_then(|o| o.trim().parse::<u32>().ok());
        if let Some(o) = offset {
            out.insert(name.to_string(), o);
        }
    }
    out
}

/// The largest flag of sched_switch's `prev_state` print format: the state
/// bits are everything below twice that (the bit above marks preemption).
pub fn switch_state_mask(format: &str) -> u32 {
    let Some(flags) = format.split("__print_flags(").nth(1) else { return 0xff };
    let max = flags
        .split("{ 0x")
        .skip(1)
        .filter_map(|s| u32::from_str_radix(s.split(',').next().unwrap_or("").trim(), 16).ok())
        .max()
        .unwrap_or(0x80);
    max.saturating_mul(2).saturating_sub(1)
}

fn read_format(tracefs: &Path, category: &str, name: &str) -> (HashMap<String, u32>, String) {
    let text = std::fs::read_to_string(tracefs.join("events").join(category).join(name).join("format")).unwrap_or_default();
    (parse_format(&text), text)
}

fn offsets(tracefs: Option<&Path>) -> Offsets {
    let mut o = Offsets {
        switch_state_mask: 0xff,
        // struct pt_regs: orig_ax on x86_64, syscallno on aarch64.
        regs_syscall_nr: if cfg!(target_arch = "aarch64") { 280 } else { 120 },
        ..Default::default()
    };
    let Some(t) = tracefs else { return o };
    let get = |m: &HashMap<String, u32>, f: &str| m.get(f).copied().unwrap_or(0);
    let (w, _) = read_format(t, "sched", "sched_wakeup");
    o.wakeup_pid = get(&w, "pid");
    let (s, text) = read_format(t, "sched", "sched_switch");
    o.switch_prev_pid = get(&s, "prev_pid");
    o.switch_prev_state = get(&s, "prev_state");
    o.switch_next_pid = get(&s, "next_pid");
    o.switch_state_mask = switch_state_mask(&text);
    let (i, _) = read_format(t, "block", "block_rq_issue");
    o.rq_issue_dev = get(&i, "dev");
    o.rq_issue_sector = get(&i, "sector");
    o.rq_issue_rwbs = get(&i, "rwbs");
    let (c, _) = read_format(t, "block", "block_rq_complete");
    o.rq_complete_dev = get(&c, "dev");
    o.rq_complete_sector = get(&c, "sector");
    o.rq_complete_rwbs = get(&c, "rwbs");
    let (tcp, _) = read_format(t, "tcp", "tcp_retransmit_skb");
    o.tcp_family = get(&tcp, "family");
    o.tcp_err = get(&tcp, "err");
    o.tcp_skaddr = get(&tcp, "skaddr");
    let (io, _) = read_format(t, "block", "block_io_start");
    o.io_start_bytes = get(&io, "bytes");
    o.io_start_rwbs = get(&io, "rwbs");
    let (merge, _) = read_format(t, "block", "block_bio_backmerge");
    o.bio_merge_nr_sector = get(&merge, "nr_sector");
    o.bio_merge_rwbs = get(&merge, "rwbs");
    o
}

/// Whether oom:mark_victim passes the victim task (Linux >= 6.8, whose
/// format grew `uid` with the new prototype) rather than its pid.
pub fn oom_passes_task() -> bool {
    tracefs().is_some_and(|t| read_format(&t, "oom", "mark_victim").0.contains_key("uid"))
}

/// Sets up pod attribution in `o` and returns the `PODS_*` bits it can
/// serve on this kernel: syscall errors always; block I/O with the
/// block_io_start tracepoint (Linux >= 6.5); run-queue wait, OOM kills and
/// TCP retransmits with the kernel's BTF, read from `btf_path`.
fn pod_offsets(o: &mut Offsets, btf_path: &Path) -> u32 {
    use agent_common::{PODS_BLOCK, PODS_OOM, PODS_RUNQ, PODS_SYSCALLS, PODS_TCP};
    let mut bits = PODS_SYSCALLS;
    if o.io_start_bytes != 0 && o.io_start_rwbs != 0 && o.bio_merge_nr_sector != 0 && o.bio_merge_rwbs != 0 {
        bits |= PODS_BLOCK;
    } else {
        tracing::info!("no block_io_start tracepoint (Linux < 6.5): block I/O is not attributed to pods");
    }
    let data = match std::fs::read(btf_path) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(path = %btf_path.display(), err = %e, "no kernel BTF: run-queue wait, OOM kills and TCP retransmits are not attributed to pods");
            return bits;
        }
    };
    let walk = btf::Btf::parse(&data).and_then(|b| {
        Ok((
            [
                b.offset("task_struct", &["cgroups"])?,
                b.offset("css_set", &["dfl_cgrp"])?,
                b.offset("cgroup", &["kn"])?,
                b.offset("kernfs_node", &["id"])?,
            ],
            b.offset("sock", &["sk_cgrp_data", "cgroup"]),
        ))
    });
    match walk {
        Ok(([task, css, kn, id], sock)) => {
            (o.task_cgroups, o.css_set_dfl_cgrp, o.cgroup_kn, o.kernfs_node_id) = (task, css, kn, id);
            bits |= PODS_OOM;
            if crate::collector::ebpf_runqueue::raw_supported() {
                bits |= PODS_RUNQ;
            }
            match sock {
                Ok(off) if o.tcp_skaddr != 0 => {
                    o.sock_cgroup = off;
                    bits |= PODS_TCP;
                }
                Ok(_) => tracing::info!("tcp_retransmit_skb has no skaddr: TCP retransmits are not attributed to pods"),
                Err(e) => tracing::info!(err = %e, "TCP retransmits are not attributed to pods"),
            }
        }
        Err(e) => tracing::warn!(err = %e, "kernel BTF unusable: run-queue wait, OOM kills and TCP retransmits are not attributed to pods"),
    }
    bits
}

/// Forwards aya-log records from the programs to `tracing`, at debug.
struct LogBridge;

impl log::Log for LogBridge {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        tracing::debug!(target: "node_agent::ebpf::program", level = %record.level(), "{}", record.args());
    }
    fn flush(&self) {}
}

impl Shared {
    /// Loads the embedded object. `stats` asks the kernel for run-time
    /// statistics of BPF programs for as long as the agent runs.
    /// `pods_btf`, when set, turns pod attribution on, with the kernel's
    /// BTF read from there.
    pub fn load(stats: bool, pods_btf: Option<&Path>) -> Result<Arc<Shared>, LoadError> {
        let tfs = ensure_tracefs();
        let mut offsets = offsets(tfs.as_deref());
        if let Some(btf) = pods_btf {
            offsets.pods = pod_offsets(&mut offsets, btf);
        }
        // No CO-RE relocations are used (offsets come from tracefs), so the
        // kernel's BTF is not parsed: that keeps megabytes off the heap.
        let mut ebpf = EbpfLoader::new()
            .btf(None)
            .override_global("OFFSETS", &offsets, true)
            .load(OBJECT)
            .map_err(|e| format!("loading eBPF programs: {e}"))?;
        let log_stop = Arc::new(AtomicBool::new(false));
        match aya_log::EbpfLogger::init_with_logger(&mut ebpf, LogBridge) {
            Ok(mut logger) => {
                let stop = Arc::clone(&log_stop);
                let _ = std::thread::Builder::new().name("ebpf-log".into()).spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        logger.flush();
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
            }
            Err(e) => tracing::debug!(err = %e, "eBPF programs log nothing (no aya-log buffer)"),
        }
        let stats_fd = if stats {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!(err = %e, "cannot enable BPF run-time statistics");
                    None
                }
            }
        } else {
            None
        };
        let stats = stats_fd.is_some() || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1");
        // aya's loader parses the kernel's whole BTF when it is created (we
        // then tell it not to use it): hand that memory back to the system.
        // SAFETY: malloc_trim only releases free memory.
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(Arc::new(Shared {
            ebpf: Mutex::new(ebpf),
            attached: Mutex::new(HashMap::new()),
            pods: offsets.pods,
            stats,
            _stats_fd: stats_fd,
            log_stop,
        }))
    }

    /// The loaded object, locked.
    pub fn lock(&self) -> Option<MutexGuard<'_, Ebpf>> {
        self.ebpf.lock().ok()
    }

    /// Loads and attaches a program, once: later calls return the first
    /// call's result.
    pub fn attach(&self, program: &'static str, hook: Hook) -> Result<(), String> {
        let mut attached = self.attached.lock().map_err(|_| "eBPF state poisoned")?;
        if let Some(r) = attached.get(program) {
            return r.clone();
        }
        let r = self.attach_now(program, hook);
        attached.insert(program, r.clone());
        r
    }

    fn attach_now(&self, program: &str, hook: Hook) -> Result<(), String> {
        let mut ebpf = self.lock().ok_or("eBPF state poisoned")?;
        let prog = ebpf.program_mut(program).ok_or_else(|| format!("no program {program} in the object"))?;
        match hook {
            Hook::TracePoint(category, name) => {
                let p: &mut TracePoint = prog.try_into().map_err(|e| format!("{e}"))?;
                p.load().map_err(|e| format!("loading: {e}"))?;
                p.attach(category, name).map_err(|e| format!("attaching to {category}:{name}: {e}"))?;
            }
            Hook::RawTracePoint(name) => {
                let p: &mut RawTracePoint = prog.try_into().map_err(|e| format!("{e}"))?;
                p.load().map_err(|e| format!("loading: {e}"))?;
                p.attach(name).map_err(|e| format!("attaching to raw tracepoint {name}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Runs of a program the kernel skipped because another BPF program
    /// was running on that CPU (`recursion_misses`, Linux 5.12+): events
    /// the probe could not see.
    pub fn misses(&self, program: &str) -> Option<u64> {
        use std::os::fd::{AsFd, AsRawFd};
        let ebpf = self.lock()?;
        let fd = ebpf.program(program)?.fd().ok()?.as_fd().as_raw_fd();
        #[repr(C)]
        struct InfoAttr {
            bpf_fd: u32,
            info_len: u32,
            info: u64,
        }
        // SAFETY: bpf_prog_info is plain integers; all-zero is valid.
        let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
        let mut attr = InfoAttr { bpf_fd: fd as u32, info_len: std::mem::size_of_val(&info) as u32, info: &mut info as *mut _ as u64 };
        // SAFETY: BPF_OBJ_GET_INFO_BY_FD (15) writes at most info_len bytes
        // into `info`, which lives until after the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, 15, &mut attr as *mut InfoAttr, std::mem::size_of::<InfoAttr>()) };
        (rc == 0).then_some(info.recursion_misses)
    }

    /// Kernel run-time statistics of a program: (seconds, runs).
    pub fn run_stats(&self, program: &str) -> Option<(f64, u64)> {
        if !self.stats {
            return None;
        }
        let ebpf = self.lock()?;
        let info = ebpf.program(program)?.info().ok()?;
        Some((info.run_time().as_secs_f64(), info.run_count()))
    }
}

/// The programs of one probe collector and their state.
pub struct Probe {
    pub shared: Option<Arc<Shared>>,
    programs: Vec<(&'static str, Result<(), String>)>,
}

impl Probe {
    /// Attaches `programs`; failures are logged once and reported down.
    pub fn attach(shared: Result<Arc<Shared>, LoadError>, programs: &[(&'static str, Hook)]) -> Probe {
        match shared {
            Ok(s) => {
                let programs = programs
                    .iter()
                    .map(|(name, hook)| {
                        let r = s.attach(name, *hook);
                        if let Err(e) = &r {
                            tracing::warn!(program = name, err = %e, "eBPF program down");
                        }
                        (*name, r)
                    })
                    .collect();
                Probe { shared: Some(s), programs }
            }
            Err(e) => {
                for (name, _) in programs {
                    tracing::warn!(program = name, err = %e, "eBPF program down");
                }
                Probe { shared: None, programs: programs.iter().map(|(n, _)| (*n, Err(e.clone()))).collect() }
            }
        }
    }

    /// All programs attached.
    pub fn up(&self) -> bool {
        self.shared.is_some() && self.programs.iter().all(|(_, r)| r.is_ok())
    }

    /// Writes `node_ebpf_program_up` and, when enabled, the run statistics.
    pub fn self_metrics(&self, sink: &mut Sink) {
        for (name, r) in &self.programs {
            sink.family("node_ebpf_program_up", "Whether the eBPF program is loaded and attached (1) or not (0).", Kind::Gauge)
                .sample(&[("program", name)], if r.is_ok() { 1.0 } else { 0.0 });
            if r.is_err() {
                continue;
            }
            if let Some(m) = self.shared.as_ref().and_then(|s| s.misses(name)) {
                sink.family("node_ebpf_program_misses_total", "Runs of the eBPF program the kernel skipped because another BPF program was running on that CPU: events the probe did not see.", Kind::Counter)
                    .sample(&[("program", name)], m as f64);
            }
            if let Some((secs, runs)) = self.shared.as_ref().and_then(|s| s.run_stats(name)) {
                sink.family(
                    "node_ebpf_program_run_seconds_total",
                    "Time the kernel spent running the eBPF program (kernel.bpf_stats_enabled).",
                    Kind::Counter,
                )
                .sample(&[("program", name)], secs);
                sink.family("node_ebpf_program_runs_total", "Runs of the eBPF program (kernel.bpf_stats_enabled).", Kind::Counter)
                    .sample(&[("program", name)], runs as f64);
            }
        }
    }
}

/// Histogram bounds exposed: `le` = 2^i ns for i in this range (1.024 µs to
/// about 275 s); smaller kernel buckets fold into the first.
pub const FIRST_BUCKET: usize = 10;

/// Sums per-CPU histograms and converts them to Prometheus form: cumulative
/// (le seconds, count) pairs, sum in seconds, count.
pub fn to_prometheus(per_cpu: &[agent_common::Hist]) -> (Vec<(f64, u64)>, f64, u64) {
    let mut buckets = [0u64; agent_common::HIST_BUCKETS];
    let (mut sum, mut count) = (0u64, 0u64);
    for h in per_cpu {
        for (b, v) in buckets.iter_mut().zip(h.buckets) {
            *b = b.wrapping_add(v);
        }
        sum = sum.wrapping_add(h.sum_ns);
        count = count.wrapping_add(h.count);
    }
    let mut out = Vec::with_capacity(agent_common::HIST_BUCKETS - FIRST_BUCKET);
    let mut cum = 0u64;
    for (i, b) in buckets.iter().enumerate().take(agent_common::HIST_BUCKETS - 1) {
        cum += b;
        if i >= FIRST_BUCKET {
            out.push(((1u64 << i) as f64 / 1e9, cum));
        }
    }
    (out, sum as f64 / 1e9, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = "name: sched_switch\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n\nprint fmt: \"x\", (REC->prev_state & 0xff) ? __print_flags(REC->prev_state & 0xff, \"|\", { 0x00000001, \"S\" }, { 0x00000002, \"D\" }, { 0x00000080, \"I\" }) : \"R\"";

    #[test]
    fn parses_format_offsets() {
        let f = parse_format(SWITCH);
        assert_eq!(f["prev_pid"], 24);
        assert_eq!(f["prev_state"], 32);
        assert_eq!(f["next_pid"], 56);
        assert_eq!(f["prev_comm"], 8);
        assert_eq!(switch_state_mask(SWITCH), 0xff);
        assert_eq!(switch_state_mask("no flags"), 0xff);
    }

    #[test]
    fn histogram_conversion() {
        let mut h = agent_common::Hist::ZERO;
        h.buckets[0] = 1; // <= 1 ns
        h.buckets[11] = 2; // (1024, 2048] ns
        h.buckets[agent_common::HIST_BUCKETS - 1] = 1; // overflow: only in +Inf
        h.sum_ns = 2_000_000_000;
        h.count = 4;
        let (b, sum, count) = to_prometheus(&[h, agent_common::Hist::ZERO]);
        assert_eq!(b[0], (1024.0 / 1e9, 1));
        assert_eq!(b[1], (2048.0 / 1e9, 3));
        assert_eq!(b.last().map(|x| x.1), Some(3));
        assert_eq!((sum, count), (2.0, 4));
    }
}
