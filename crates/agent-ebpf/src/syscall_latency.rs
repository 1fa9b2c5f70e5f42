//! `ebpf_syscall_latency`: every syscall timed from the raw sys_enter to
//! the raw sys_exit tracepoint, into this CPU's native histogram of the
//! syscall's family (and, over the slow threshold, the task's cgroup's
//! slow-syscall counter for pods).

use agent_common::pods::{SLOW, SLOW_SYSCALLS};
use agent_common::syscall_latency::{Families, Start, MAX_IN_FLIGHT, MAX_SYSCALLS, NOT_TIMED, NUM_FAMILIES, OTHER};
use agent_common::NativeHist;
use aya_ebpf::{
    helpers::generated::bpf_get_current_task,
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::RawTracePointContext,
    Global,
};

use crate::helpers::{inc, now_ns, record_native, BPF_F_NO_PREALLOC};
use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static SYSLAT_FAMILIES: Global<Families> = Global::new(Families::DEFAULT);

/// Each task's syscall in flight, by task address: one entry per task that
/// made a timed syscall, written in place on every sys_enter and marked
/// done (`ns` 0) on sys_exit rather than inserted and deleted per syscall
/// (a hash update takes an element from the free list and links it; an
/// in-place write after the lookup does neither); sched_process_exit
/// deletes it. Nearly every thread is inside some syscall at any time, so
/// this holds about as many entries as per-syscall inserts would. A plain
/// hash map, not an LRU one: an LRU map would silently evict the entry of a
/// task blocked in a long syscall (an epoll_wait for hours) and lose its
/// latency; here a full map is counted in `SYSLAT_DROPPED`. Not
/// preallocated (`BPF_F_NO_PREALLOC`): its memory follows the node's
/// threads, not `MAX_IN_FLIGHT` (5.8 MB preallocated); an element is
/// allocated once per thread, at its first timed syscall (Linux 6.1+
/// allocates for tracing programs from per-CPU caches, bpf_mem_alloc).
#[map]
static SYSLAT_START: HashMap<u64, Start> = HashMap::with_max_entries(MAX_IN_FLIGHT, BPF_F_NO_PREALLOC);
#[map]
static SYSLAT_HIST: PerCpuArray<NativeHist> = PerCpuArray::with_max_entries(NUM_FAMILIES, 0);
#[map]
static SYSLAT_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
static SYSLAT_CONFIG: Array<u64> = Array::with_max_entries(1, 0);

/// The family of syscall `nr`, read in place from the read-only global
/// (a copy of the 512-byte table would not fit the stack).
#[inline(always)]
fn family(nr: u64) -> u8 {
    if nr >= MAX_SYSCALLS as u64 {
        return OTHER;
    }
    let table = &SYSLAT_FAMILIES as *const Global<Families> as *const u8;
    // SAFETY: Global is #[repr(transparent)] over the Families value, whose
    // only field is the table; `nr` is below its length.
    unsafe { core::ptr::read_volatile(table.add(nr as usize)) }
}

#[inline(always)]
fn current_task() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_task() }
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn syslat_sys_enter(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(struct pt_regs *regs, long id)
    let nr: u64 = ctx.arg(1);
    let family = family(nr);
    if family == NOT_TIMED {
        return 0;
    }
    let (task, ns) = (current_task(), now_ns());
    if let Some(s) = SYSLAT_START.get_ptr_mut(task) {
        // SAFETY: the entry of the current task, which only this task's own
        // syscalls (these programs, in its context) and its exit touch.
        unsafe {
            (*s).ns = ns;
            (*s).family = family as u32;
        }
        return 0;
    }
    if SYSLAT_START.insert(task, Start { ns, family: family as u32, _pad: 0 }, 0).is_err() {
        inc(&SYSLAT_DROPPED, 0);
    }
    0
}

fn try_sys_exit() -> Result<(), i32> {
    let task = current_task();
    let s = SYSLAT_START.get_ptr_mut(task).ok_or(0)?;
    // SAFETY: the current task's own entry (see sys_enter); copied out,
    // then marked done.
    let start = unsafe { *s };
    if start.ns == 0 {
        // No syscall in flight: this one's family is not timed.
        return Ok(());
    }
    // SAFETY: as above.
    unsafe { (*s).ns = 0 };
    let ns = now_ns().saturating_sub(start.ns);
    let h = SYSLAT_HIST.get_ptr_mut(start.family).ok_or(0)?;
    record_native(h, ns);
    if pods::on(SLOW) {
        let slow = SYSLAT_CONFIG.get(0).copied().unwrap_or(0);
        if slow != 0 && ns >= slow {
            pods::add(pods::current_cgroup_id(), SLOW_SYSCALLS, 1);
        }
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn syslat_sys_exit(_ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit();
    0
}

/// The exiting task is the current one (do_exit).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn syslat_task_exit(_ctx: RawTracePointContext) -> i32 {
    let _ = SYSLAT_START.remove(current_task());
    0
}
