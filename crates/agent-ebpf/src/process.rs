//! `ebpf_process`: execs, forks (processes and threads, as node_forks_total
//! counts them) and exits of processes (thread-group leaders).

use agent_common::process::{COUNTERS, EXECS, EXITS, FORKS};
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{RawTracePointContext, TracePointContext},
};

use crate::helpers::inc;

#[map]
static PROCESS_EVENTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    inc(&PROCESS_EVENTS, EXECS);
    0
}

#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn sched_process_fork(_ctx: TracePointContext) -> u32 {
    inc(&PROCESS_EVENTS, FORKS);
    0
}

/// Counts an exit of a process, not a thread: the exiting task (the
/// current one, in do_exit) leads its thread group.
#[inline(always)]
fn exit() {
    let id = bpf_get_current_pid_tgid();
    if (id >> 32) as u32 == id as u32 {
        inc(&PROCESS_EVENTS, EXITS);
    }
}

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    exit();
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec_raw(_ctx: RawTracePointContext) -> i32 {
    inc(&PROCESS_EVENTS, EXECS);
    0
}

#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork_raw(_ctx: RawTracePointContext) -> i32 {
    inc(&PROCESS_EVENTS, FORKS);
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit_raw(_ctx: RawTracePointContext) -> i32 {
    exit();
    0
}
