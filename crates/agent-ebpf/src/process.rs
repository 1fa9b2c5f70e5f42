//! `ebpf_process`: execs, forks (processes and threads, as node_forks_total
//! counts them) and exits of processes (thread-group leaders).

use agent_common::process::{COUNTERS, EXECS, EXITS, FORKS};
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
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

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    // Count processes, not threads: the exiting task leads its thread group.
    let id = bpf_get_current_pid_tgid();
    if (id >> 32) as u32 == id as u32 {
        inc(&PROCESS_EVENTS, EXITS);
    }
    0
}
