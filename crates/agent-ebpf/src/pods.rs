//! Pod attribution: event counters per cgroup v2 id (`POD_STATS`), which
//! the run-queue, syscall and TCP programs add to as well, and the programs
//! that serve attribution only (OOM victims, block I/O bytes).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use agent_common::block_io::{OP_READ, OP_WRITE};
use agent_common::pods::{Offsets, PodCounters, BLOCK, MAX_CGROUPS, OOM, OOM_KILLS, READ_BYTES, WRITE_BYTES};
use aya_ebpf::{
    helpers::bpf_get_current_cgroup_id,
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{RawTracePointContext, TracePointContext},
    Global,
};

use crate::block_io::rwbs_op;
use crate::helpers::{inc, read_kernel, BPF_F_NO_PREALLOC};

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static POD_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

/// Not preallocated: its memory follows the cgroups seen, not `MAX_CGROUPS`.
#[map]
static POD_STATS: HashMap<u64, PodCounters> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static POD_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A zeroed counter set in read-only data, used to create map entries.
static ZERO_POD: PodCounters = PodCounters::ZERO;

/// This probe's offsets.
#[inline(always)]
pub fn offsets() -> Offsets {
    POD_OFFSETS.load()
}

/// Whether the events of `bit` are attributed.
#[inline(always)]
pub fn on(bit: u32) -> bool {
    POD_OFFSETS.load().events & bit != 0
}

/// Adds `v` to word `field` of the cgroup's counters, creating them first.
/// Every CPU adds to the same entry, so the add is atomic.
#[inline(always)]
pub fn add(cgroup: u64, field: usize, v: u64) {
    let p = match POD_STATS.get_ptr_mut(cgroup) {
        Some(p) => p,
        None => {
            // BPF_NOEXIST: another CPU may have created it meanwhile.
            let _ = POD_STATS.insert(cgroup, ZERO_POD, 1);
            match POD_STATS.get_ptr_mut(cgroup) {
                Some(p) => p,
                None => {
                    inc(&POD_DROPPED, 0);
                    return;
                }
            }
        }
    };
    // SAFETY: `p` points to the map value, a `PodCounters` of nine
    // aligned u64 words, and `field` is one of the word indices.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((p as *mut u64).add(field), v) };
}

/// The cgroup v2 id (`cgroup->kn->id`) of a `struct cgroup *`.
#[inline(always)]
pub fn cgroup_id(cgroup: u64, off: &Offsets) -> Option<u64> {
    // A socket's `sk_cgrp_data` before Linux 5.15 is a union whose word
    // holds the cgroup pointer, or net_prio's and net_cls's data with its
    // low bits set (a pointer is aligned): then there is no cgroup.
    if cgroup & 3 != 0 {
        return None;
    }
    let kn: u64 = read_kernel(cgroup, off.cgroup_kn)?;
    read_kernel(kn, off.kernfs_node_id)
}

/// The cgroup v2 id of a task, as bpf_get_current_cgroup_id gives for the
/// current one: `task->cgroups->dfl_cgrp->kn->id`.
#[inline(always)]
pub fn task_cgroup_id(task: u64, off: &Offsets) -> Option<u64> {
    let css_set: u64 = read_kernel(task, off.task_cgroups)?;
    let cgroup: u64 = read_kernel(css_set, off.css_set_dfl_cgrp)?;
    cgroup_id(cgroup, off)
}

#[inline(always)]
pub fn current_cgroup_id() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_cgroup_id() }
}

/// The OOM victim's cgroup (Linux >= 6.8: TP_PROTO(struct task_struct *task, uid_t uid)).
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn pod_oom_victim(ctx: RawTracePointContext) -> i32 {
    let off = offsets();
    if off.events & OOM != 0 {
        if let Some(cgroup) = task_cgroup_id(ctx.arg(0), &off) {
            add(cgroup, OOM_KILLS, 1);
        }
    }
    0
}

/// Older kernels pass only the victim's pid: the cgroup of the task that
/// ran out of memory is used, the victim's own for a cgroup's OOM.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn pod_oom_current(_ctx: TracePointContext) -> u32 {
    if on(OOM) {
        add(current_cgroup_id(), OOM_KILLS, 1);
    }
    0
}

#[inline(always)]
fn block(op: Option<u32>, bytes: u64) {
    match op {
        Some(OP_READ) => add(current_cgroup_id(), READ_BYTES, bytes),
        Some(OP_WRITE) => add(current_cgroup_id(), WRITE_BYTES, bytes),
        _ => {}
    }
}

/// A new request, made from a bio by the submitting task (Linux >= 6.5).
fn try_io_start(ctx: &TracePointContext) -> Result<(), i32> {
    let off = offsets();
    if off.events & BLOCK == 0 {
        return Ok(());
    }
    // SAFETY: offsets come from this tracepoint's format file.
    let (bytes, rwbs) = unsafe { (ctx.read_at::<u32>(off.io_start_bytes as usize)?, ctx.read_at::<[u8; 4]>(off.io_start_rwbs as usize)?) };
    block(rwbs_op(rwbs), bytes as u64);
    Ok(())
}

#[tracepoint(category = "block", name = "block_io_start")]
pub fn pod_io_start(ctx: TracePointContext) -> u32 {
    let _ = try_io_start(&ctx);
    0
}

/// A bio merged into a request already made: its bytes, for its submitter.
fn try_bio_merge(ctx: &TracePointContext) -> Result<(), i32> {
    let off = offsets();
    if off.events & BLOCK == 0 {
        return Ok(());
    }
    // SAFETY: offsets come from this tracepoint's format file.
    let (sectors, rwbs) =
        unsafe { (ctx.read_at::<u32>(off.bio_merge_nr_sector as usize)?, ctx.read_at::<[u8; 4]>(off.bio_merge_rwbs as usize)?) };
    block(rwbs_op(rwbs), sectors as u64 * 512);
    Ok(())
}

#[tracepoint(category = "block", name = "block_bio_backmerge")]
pub fn pod_bio_backmerge(ctx: TracePointContext) -> u32 {
    let _ = try_bio_merge(&ctx);
    0
}

#[tracepoint(category = "block", name = "block_bio_frontmerge")]
pub fn pod_bio_frontmerge(ctx: TracePointContext) -> u32 {
    let _ = try_bio_merge(&ctx);
    0
}
