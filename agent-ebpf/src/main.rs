//! node-agent's eBPF programs: tracepoints and raw tracepoints only, every
//! event aggregated in the kernel (per-CPU arrays, log2 histograms); nothing
//! per event reaches user space. Entry points wrap a `try_` function; no
//! panics. Field offsets come from the agent (read from tracefs) through the
//! `OFFSETS` global.

#![no_std]
#![no_main]

use agent_common::{
    log2_bucket, BioKey, BioReq, BioStart, Hist, Offsets, SyscallCounts, CNT_DROPPED_BIO, CNT_DROPPED_RUNQ, CNT_EXECS, CNT_EXITS, CNT_FORKS,
    CNT_OOM_KILLS, CNT_TCP_RETRANS_V4, CNT_TCP_RETRANS_V6, COUNTERS, MAX_SYSCALLS, OP_DISCARD, OP_FLUSH, OP_READ,
    OP_WRITE,
};
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
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
    if let Some(h) = RUNQ_HIST.get_ptr_mut(0) {
        record(h, now.saturating_sub(start));
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
    let (dev, sector) = unsafe {
        (ctx.read_at::<u32>(off.rq_complete_dev as usize)?, ctx.read_at::<u64>(off.rq_complete_sector as usize)?)
    };
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
    Ok(())
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
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
