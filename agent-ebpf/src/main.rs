//! node-agent's eBPF programs: tracepoints and raw tracepoints only, every
//! event aggregated in the kernel (per-CPU arrays, log2 histograms); nothing
//! per event reaches user space. Entry points wrap a `try_` function; no
//! panics. Field offsets come from the agent (read from tracefs) through the
//! `OFFSETS` global.

#![no_std]
#![no_main]
// Atomic adds: the bpf target has no compare-and-swap, so core::sync::atomic
// offers no fetch_add there, while the BPF instruction set has an atomic add.
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use agent_common::{
    log2_bucket, BioKey, BioReq, BioStart, Hist, Offsets, PodCounters, SyscallCounts, CNT_DROPPED_BIO, CNT_DROPPED_POD, CNT_DROPPED_RUNQ,
    CNT_EXECS, CNT_EXITS, CNT_FORKS, CNT_OOM_KILLS, CNT_TCP_RETRANS_V4, CNT_TCP_RETRANS_V6, COUNTERS, MAX_SYSCALLS, OP_DISCARD, OP_FLUSH,
    OP_READ, OP_WRITE, PODS_BLOCK, PODS_OOM, PODS_RUNQ, PODS_SYSCALLS, PODS_TCP, POD_MAX_CGROUPS, POD_OOM_KILLS, POD_READ_BYTES,
    POD_RUNQ_WAITS, POD_RUNQ_WAIT_NS, POD_SYSCALL_ERRORS, POD_TCP_RETRANSMITS, POD_WRITE_BYTES,
};
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::{RawTracePointContext, TracePointContext},
    Global,
};
use aya_log_ebpf::warn;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::override_global) and nothing else defines it.
#[unsafe(no_mangle)]
static OFFSETS: Global<Offsets> = Global::new(Offsets {
    wakeup_pid: 0,
    switch_prev_pid: 0,
    switch_prev_state: 0,
    switch_next_pid: 0,
    rq_issue_dev: 0,
    rq_issue_sector: 0,
    rq_issue_rwbs: 0,
    rq_complete_dev: 0,
    rq_complete_sector: 0,
    rq_complete_rwbs: 0,
    tcp_family: 0,
    switch_state_mask: 0xff,
    regs_syscall_nr: 0,
    tcp_err: 0,
    pods: 0,
    task_cgroups: 0,
    css_set_dfl_cgrp: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    sock_cgroup: 0,
    tcp_skaddr: 0,
    io_start_bytes: 0,
    io_start_rwbs: 0,
    bio_merge_nr_sector: 0,
    bio_merge_rwbs: 0,
});

/// A zeroed histogram in read-only data, used to create map entries.
static ZERO_HIST: Hist = Hist::ZERO;

#[map]
static RUNQ_START: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);
/// Enqueue times by task_struct address, for the raw-tracepoint variant.
#[map]
static RUNQ_TASK_START: HashMap<u64, u64> = HashMap::with_max_entries(32768, 0);
#[map]
static RUNQ_HIST: PerCpuArray<Hist> = PerCpuArray::with_max_entries(1, 0);
#[map]
static BIO_START: LruHashMap<BioReq, BioStart> = LruHashMap::with_max_entries(16384, 0);
#[map]
static BIO_HIST: PerCpuHashMap<BioKey, Hist> = PerCpuHashMap::with_max_entries(1024, 0);
#[map]
static SYSCALLS: PerCpuArray<SyscallCounts> = PerCpuArray::with_max_entries(1, 0);
#[map]
static EVENTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

/// Pod attribution: event counters per cgroup v2 id.
#[map]
static POD_STATS: HashMap<u64, PodCounters> = HashMap::with_max_entries(POD_MAX_CGROUPS, 0);

/// A zeroed counter set in read-only data, used to create map entries.
static ZERO_POD: PodCounters = PodCounters {
    runq_wait_ns: 0,
    runq_waits: 0,
    oom_kills: 0,
    tcp_retransmits: 0,
    read_bytes: 0,
    write_bytes: 0,
    syscall_errors: 0,
    _reserved: 0,
};

#[inline(always)]
fn inc(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU with preemption off.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn record(h: *mut Hist, delta_ns: u64) {
    let b = log2_bucket(delta_ns);
    // SAFETY: `h` points to this CPU's map value; `b` < HIST_BUCKETS.
    unsafe {
        if let Some(slot) = (*h).buckets.get_mut(b) {
            *slot += 1;
        }
        (*h).sum_ns += delta_ns;
        (*h).count += 1;
    }
}

// ---- pod attribution: counters per cgroup ------------------------------

/// Adds `v` to word `field` of the cgroup's counters, creating them first.
/// Every CPU adds to the same entry, so the add is atomic.
#[inline(always)]
fn pod_add(cgroup: u64, field: usize, v: u64) {
    let p = match POD_STATS.get_ptr_mut(&cgroup) {
        Some(p) => p,
        None => {
            // BPF_NOEXIST: another CPU may have created it meanwhile.
            let _ = POD_STATS.insert(&cgroup, &ZERO_POD, 1);
            match POD_STATS.get_ptr_mut(&cgroup) {
                Some(p) => p,
                None => {
                    inc(&EVENTS, CNT_DROPPED_POD);
                    return;
                }
            }
        }
    };
    // SAFETY: `p` points to the map value, a `PodCounters` of eight
    // aligned u64 words, and `field` is one of the POD_* word indices.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((p as *mut u64).add(field), v) };
}

/// Reads a kernel pointer or integer at `base + off`.
#[inline(always)]
fn read_kernel<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one fails.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// The cgroup v2 id (`cgroup->kn->id`) of a `struct cgroup *`.
#[inline(always)]
fn cgroup_id(cgroup: u64, off: &Offsets) -> Option<u64> {
    let kn: u64 = read_kernel(cgroup, off.cgroup_kn)?;
    read_kernel(kn, off.kernfs_node_id)
}

/// The cgroup v2 id of a task, as bpf_get_current_cgroup_id gives for the
/// current one: `task->cgroups->dfl_cgrp->kn->id`.
#[inline(always)]
fn task_cgroup_id(task: u64, off: &Offsets) -> Option<u64> {
    let css_set: u64 = read_kernel(task, off.task_cgroups)?;
    let cgroup: u64 = read_kernel(css_set, off.css_set_dfl_cgrp)?;
    cgroup_id(cgroup, off)
}

#[inline(always)]
fn current_cgroup_id() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

// ---- run-queue latency -------------------------------------------------

#[inline(always)]
fn enqueued(pid: u32) {
    if pid == 0 {
        return;
    }
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if RUNQ_START.insert(&pid, &now, 0).is_err() {
        inc(&EVENTS, CNT_DROPPED_RUNQ);
    }
}

fn try_wakeup(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    // SAFETY: the offset comes from this tracepoint's format file.
    let pid: i32 = unsafe { ctx.read_at(off.wakeup_pid as usize)? };
    enqueued(pid as u32);
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_wakeup")]
pub fn sched_wakeup(ctx: TracePointContext) -> u32 {
    let _ = try_wakeup(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: TracePointContext) -> u32 {
    let _ = try_wakeup(&ctx);
    0
}

fn try_switch(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    // SAFETY: offsets come from this tracepoint's format file.
    let (prev_pid, prev_state, next_pid) = unsafe {
        (
            ctx.read_at::<i32>(off.switch_prev_pid as usize)?,
            ctx.read_at::<i64>(off.switch_prev_state as usize)?,
            ctx.read_at::<i32>(off.switch_next_pid as usize)?,
        )
    };
    // Preempted (or yielding) tasks stay runnable: they wait again from now.
    if prev_state & (off.switch_state_mask as i64) == 0 {
        enqueued(prev_pid as u32);
    }
    let next = next_pid as u32;
    if next == 0 {
        return Ok(());
    }
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { RUNQ_START.get(&next) }).copied() else { return Ok(()) };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = RUNQ_START.remove(&next);
    if let Some(h) = RUNQ_HIST.get_ptr_mut(0) {
        record(h, now.saturating_sub(start));
    }
    Ok(())
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn sched_switch(ctx: TracePointContext) -> u32 {
    let _ = try_switch(&ctx);
    0
}

// Raw-tracepoint variant (kernels >= 5.18, where sched_switch passes
// prev_state): keyed by task_struct address, no record to fill, no field
// reads — the cheapest hooks the kernel offers without BTF programs.

#[inline(always)]
fn task_enqueued(task: u64) {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if RUNQ_TASK_START.insert(&task, &now, 0).is_err() {
        inc(&EVENTS, CNT_DROPPED_RUNQ);
    }
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn rq_wakeup_raw(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(struct task_struct *p)
    task_enqueued(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn rq_wakeup_new_raw(ctx: RawTracePointContext) -> i32 {
    task_enqueued(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn rq_switch_raw(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
    let preempt: u64 = ctx.arg(0);
    let prev: u64 = ctx.arg(1);
    let next: u64 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    // A preempted (or yielding) task stays runnable. The idle task — the
    // current task here is `prev`, with tgid 0 — never waits.
    if (preempt & 1 != 0 || prev_state as u32 == 0) && bpf_get_current_pid_tgid() >> 32 != 0 {
        task_enqueued(prev);
    }
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { RUNQ_TASK_START.get(&next) }).copied() else { return 0 };
    let _ = RUNQ_TASK_START.remove(&next);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let wait = now.saturating_sub(start);
    if let Some(h) = RUNQ_HIST.get_ptr_mut(0) {
        record(h, wait);
    }
    let off = OFFSETS.load();
    if off.pods & PODS_RUNQ != 0 {
        if let Some(cgroup) = task_cgroup_id(next, &off) {
            pod_add(cgroup, POD_RUNQ_WAIT_NS, wait);
            pod_add(cgroup, POD_RUNQ_WAITS, 1);
        }
    }
    0
}

// ---- block I/O latency -------------------------------------------------

#[inline(always)]
fn rwbs_op(rwbs: [u8; 4]) -> Option<u32> {
    // A leading 'F' is REQ_PREFLUSH when an operation letter follows.
    let c = if rwbs[0] == b'F' && matches!(rwbs[1], b'R' | b'W' | b'D' | b'F' | b'N') { rwbs[1] } else { rwbs[0] };
    match c {
        b'R' => Some(OP_READ),
        b'W' => Some(OP_WRITE),
        b'F' => Some(OP_FLUSH),
        b'D' => Some(OP_DISCARD),
        _ => None,
    }
}

fn try_rq_issue(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    // SAFETY: offsets come from this tracepoint's format file.
    let (dev, sector, rwbs) = unsafe {
        (
            ctx.read_at::<u32>(off.rq_issue_dev as usize)?,
            ctx.read_at::<u64>(off.rq_issue_sector as usize)?,
            ctx.read_at::<[u8; 4]>(off.rq_issue_rwbs as usize)?,
        )
    };
    let Some(op) = rwbs_op(rwbs) else { return Ok(()) };
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    let key = BioReq { dev, _pad: 0, sector };
    if BIO_START.insert(&key, &BioStart { ts_ns, op, _pad: 0 }, 0).is_err() {
        inc(&EVENTS, CNT_DROPPED_BIO);
    }
    Ok(())
}

#[tracepoint(category = "block", name = "block_rq_issue")]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    let _ = try_rq_issue(&ctx);
    0
}

fn try_rq_complete(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    // SAFETY: offsets come from this tracepoint's format file.
    let (dev, sector) =
        unsafe { (ctx.read_at::<u32>(off.rq_complete_dev as usize)?, ctx.read_at::<u64>(off.rq_complete_sector as usize)?) };
    let req = BioReq { dev, _pad: 0, sector };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { BIO_START.get(&req) }).copied() else { return Ok(()) };
    let _ = BIO_START.remove(&req);
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let delta = unsafe { bpf_ktime_get_ns() }.saturating_sub(start.ts_ns);
    let key = BioKey { dev, op: start.op };
    let h = match BIO_HIST.get_ptr_mut(&key) {
        Some(h) => h,
        None => {
            if BIO_HIST.insert(&key, &ZERO_HIST, 1 /* BPF_NOEXIST */).is_err() {
                // Another CPU may have created it meanwhile; otherwise the map is full.
                if BIO_HIST.get_ptr_mut(&key).is_none() {
                    inc(&EVENTS, CNT_DROPPED_BIO);
                    warn!(ctx, "block I/O histogram map full, dropping device {}", dev);
                    return Ok(());
                }
            }
            match BIO_HIST.get_ptr_mut(&key) {
                Some(h) => h,
                None => return Ok(()),
            }
        }
    };
    record(h, delta);
    Ok(())
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    let _ = try_rq_complete(&ctx);
    0
}

// ---- syscalls ----------------------------------------------------------

fn try_sys_exit(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(struct pt_regs *regs, long ret): one program per syscall,
    // counting the call and, when it failed, the error. (exit and
    // exit_group never return, so they are not seen.)
    let regs: *const u8 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    let off = OFFSETS.load();
    // SAFETY: reads the syscall number from the kernel's pt_regs at the
    // architecture's offset; a failed read returns an error.
    let id: u32 = unsafe { bpf_probe_read_kernel(regs.add(off.regs_syscall_nr as usize) as *const u32)? };
    let slot = if id < MAX_SYSCALLS { id as usize } else { MAX_SYSCALLS as usize - 1 };
    if let Some(c) = SYSCALLS.get_ptr_mut(0) {
        // SAFETY: this CPU's value; `slot` is bounds-checked by `get_mut`.
        unsafe {
            if let Some(n) = (*c).calls.get_mut(slot) {
                *n += 1;
            }
            if (-4095..0).contains(&ret) {
                if let Some(n) = (*c).errors.get_mut(slot) {
                    *n += 1;
                }
            }
        }
    }
    if off.pods & PODS_SYSCALLS != 0 && (-4095..0).contains(&ret) {
        pod_add(current_cgroup_id(), POD_SYSCALL_ERRORS, 1);
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
}

/// A test fixture the agent never attaches: it dereferences a raw
/// tracepoint argument directly, which the verifier refuses. The truth
/// tests load it to check that a rejected program is reported down and
/// leaves everything else running.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn verifier_rejects(ctx: RawTracePointContext) -> i32 {
    let regs: *const u64 = ctx.arg(0);
    // SAFETY: deliberately unsound (a kernel pointer read without
    // bpf_probe_read_kernel): the verifier must reject this program.
    unsafe { core::ptr::read_volatile(regs) as i32 }
}

/// An empty program (attached to sys_exit by the benchmark): the floor of a
/// probe's cost on this kernel.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn empty(_ctx: RawTracePointContext) -> i32 {
    0
}

// ---- TCP retransmits, OOM kills, process churn --------------------------

fn try_tcp_retransmit(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    // SAFETY: the offset comes from this tracepoint's format file.
    let family: u16 = unsafe { ctx.read_at(off.tcp_family as usize)? };
    // Count retransmits that went out, as RetransSegs does.
    if off.tcp_err != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        let err: i32 = unsafe { ctx.read_at(off.tcp_err as usize)? };
        if err != 0 {
            return Ok(());
        }
    }
    match family {
        2 => inc(&EVENTS, CNT_TCP_RETRANS_V4),
        10 => inc(&EVENTS, CNT_TCP_RETRANS_V6),
        _ => {}
    }
    // Retransmits mostly run from timers, in no task's context: the socket
    // carries the cgroup of the task that created it.
    if off.pods & PODS_TCP != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        let sk: u64 = unsafe { ctx.read_at(off.tcp_skaddr as usize)? };
        let cgroup: u64 = read_kernel(sk, off.sock_cgroup).ok_or(0)?;
        if let Some(id) = cgroup_id(cgroup, &off) {
            pod_add(id, POD_TCP_RETRANSMITS, 1);
        }
    }
    Ok(())
}

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_retransmit(&ctx);
    0
}

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(_ctx: TracePointContext) -> u32 {
    inc(&EVENTS, CNT_OOM_KILLS);
    0
}

// ---- pod attribution: OOM kills and block I/O --------------------------

/// The OOM victim's cgroup (Linux >= 6.8: TP_PROTO(struct task_struct *task, uid_t uid)).
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn pod_oom_victim(ctx: RawTracePointContext) -> i32 {
    let off = OFFSETS.load();
    if off.pods & PODS_OOM != 0 {
        if let Some(cgroup) = task_cgroup_id(ctx.arg(0), &off) {
            pod_add(cgroup, POD_OOM_KILLS, 1);
        }
    }
    0
}

/// Older kernels pass only the victim's pid: the cgroup of the task that
/// ran out of memory is used, the victim's own for a cgroup's OOM.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn pod_oom_current(_ctx: TracePointContext) -> u32 {
    let off = OFFSETS.load();
    if off.pods & PODS_OOM != 0 {
        pod_add(current_cgroup_id(), POD_OOM_KILLS, 1);
    }
    0
}

#[inline(always)]
fn pod_block(op: Option<u32>, bytes: u64) {
    match op {
        Some(OP_READ) => pod_add(current_cgroup_id(), POD_READ_BYTES, bytes),
        Some(OP_WRITE) => pod_add(current_cgroup_id(), POD_WRITE_BYTES, bytes),
        _ => {}
    }
}

/// A new request, made from a bio by the submitting task (Linux >= 6.5).
fn try_pod_io_start(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    if off.pods & PODS_BLOCK == 0 {
        return Ok(());
    }
    // SAFETY: offsets come from this tracepoint's format file.
    let (bytes, rwbs) = unsafe { (ctx.read_at::<u32>(off.io_start_bytes as usize)?, ctx.read_at::<[u8; 4]>(off.io_start_rwbs as usize)?) };
    pod_block(rwbs_op(rwbs), bytes as u64);
    Ok(())
}

#[tracepoint(category = "block", name = "block_io_start")]
pub fn pod_io_start(ctx: TracePointContext) -> u32 {
    let _ = try_pod_io_start(&ctx);
    0
}

/// A bio merged into a request already made: its bytes, for its submitter.
fn try_pod_bio_merge(ctx: &TracePointContext) -> Result<(), i32> {
    let off = OFFSETS.load();
    if off.pods & PODS_BLOCK == 0 {
        return Ok(());
    }
    // SAFETY: offsets come from this tracepoint's format file.
    let (sectors, rwbs) =
        unsafe { (ctx.read_at::<u32>(off.bio_merge_nr_sector as usize)?, ctx.read_at::<[u8; 4]>(off.bio_merge_rwbs as usize)?) };
    pod_block(rwbs_op(rwbs), sectors as u64 * 512);
    Ok(())
}

#[tracepoint(category = "block", name = "block_bio_backmerge")]
pub fn pod_bio_backmerge(ctx: TracePointContext) -> u32 {
    let _ = try_pod_bio_merge(&ctx);
    0
}

#[tracepoint(category = "block", name = "block_bio_frontmerge")]
pub fn pod_bio_frontmerge(ctx: TracePointContext) -> u32 {
    let _ = try_pod_bio_merge(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    inc(&EVENTS, CNT_EXECS);
    0
}

#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn sched_process_fork(_ctx: TracePointContext) -> u32 {
    inc(&EVENTS, CNT_FORKS);
    0
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    // Count processes, not threads: the exiting task leads its thread group.
    let id = bpf_get_current_pid_tgid();
    if (id >> 32) as u32 == id as u32 {
        inc(&EVENTS, CNT_EXITS);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// SAFETY: the kernel reads the program's license from this section and
// symbol; nothing else is placed there.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
