//! `ebpf_runqueue`: run-queue wait, from wakeup (or preemption) to running.
//! Raw tracepoints keyed by task address where sched_switch passes the
//! previous task's state (Linux >= 5.18); classic tracepoints keyed by pid
//! with offsets from tracefs elsewhere.

use agent_common::pods::{RUNQ, RUNQ_WAITS, RUNQ_WAIT_NS};
use agent_common::runqueue::Offsets;
use agent_common::Hist;
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, raw_tracepoint, tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::{RawTracePointContext, TracePointContext},
    Global,
};

use crate::helpers::{inc, now_ns, record};
use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static RUNQ_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static RUNQ_START: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);
/// Enqueue times by task_struct address, for the raw-tracepoint variant:
/// one entry per task that was ever runnable, written in place when it is
/// enqueued and marked done (0) when it runs, rather than inserted and
/// deleted per wait (an insert takes an element from the free list and
/// links it under the bucket's lock, a delete unlinks and frees it; a
/// write after the lookup does neither). LRU, so the entries of exited
/// tasks (all marked done: a dying task's last switch is not a wait) are
/// the ones reused when the map is full; a task waits in the run queue for
/// milliseconds, far too short for 32768 other tasks to run meanwhile.
#[map]
static RUNQ_TASK_START: LruHashMap<u64, u64> = LruHashMap::with_max_entries(32768, 0);
#[map]
static RUNQ_HIST: PerCpuArray<Hist> = PerCpuArray::with_max_entries(1, 0);
#[map]
static RUNQ_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn enqueued(pid: u32) {
    if pid == 0 {
        return;
    }
    if RUNQ_START.insert(pid, now_ns(), 0).is_err() {
        inc(&RUNQ_DROPPED, 0);
    }
}

fn try_wakeup(ctx: &TracePointContext) -> Result<(), i32> {
    let off = RUNQ_OFFSETS.load();
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
    let off = RUNQ_OFFSETS.load();
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
    let Some(start) = (unsafe { RUNQ_START.get(next) }).copied() else { return Ok(()) };
    let now = now_ns();
    let _ = RUNQ_START.remove(next);
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

// Raw-tracepoint variant: keyed by task_struct address, no record to fill,
// no field reads — the cheapest hooks the kernel offers without BTF programs.

#[inline(always)]
fn task_enqueued(task: u64) {
    let now = now_ns();
    if let Some(t) = RUNQ_TASK_START.get_ptr_mut(task) {
        // SAFETY: a live entry of the map; a task is enqueued and run one
        // event at a time (the scheduler holds its run queue's lock).
        unsafe { *t = now };
    } else if RUNQ_TASK_START.insert(task, now, 0).is_err() {
        inc(&RUNQ_DROPPED, 0);
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

fn try_switch_raw(ctx: &RawTracePointContext) -> Result<(), i32> {
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
    let Some(t) = RUNQ_TASK_START.get_ptr_mut(next) else { return Ok(()) };
    // SAFETY: a live entry of the map, read and marked done by the one
    // switch that runs `next` (under its run queue's lock).
    let start = unsafe { core::ptr::replace(t, 0) };
    if start == 0 {
        // Not enqueued since it last ran (or never seen).
        return Ok(());
    }
    let wait = now_ns().saturating_sub(start);
    if let Some(h) = RUNQ_HIST.get_ptr_mut(0) {
        record(h, wait);
    }
    let off = pods::offsets();
    if off.events & RUNQ != 0 {
        if let Some(cgroup) = pods::task_cgroup_id(next, &off) {
            pods::add(cgroup, RUNQ_WAIT_NS, wait);
            pods::add(cgroup, RUNQ_WAITS, 1);
        }
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn rq_switch_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_switch_raw(&ctx);
    0
}
