//! `ebpf_runqueue`: how long runnable tasks wait for a CPU, from wakeup (or
//! preemption) to running.

use crate::program::Program;

/// The read-only global with this probe's tracepoint offsets.
pub const OFFSETS: &str = "RUNQ_OFFSETS";
/// Per-CPU `Hist` (one entry): the wait times.
pub const HIST: &str = "RUNQ_HIST";
/// Enqueue times by pid (classic tracepoints).
pub const START: &str = "RUNQ_START";
/// Enqueue times by task_struct address (raw tracepoints).
pub const TASK_START: &str = "RUNQ_TASK_START";
/// Per-CPU `u64` (one entry): wakeups not recorded because a map was full.
pub const DROPPED: &str = "RUNQ_DROPPED";

/// Raw tracepoints keyed by task address: Linux >= 5.18, whose
/// sched_switch passes the previous task's state.
pub const RAW_PROGRAMS: [Program; 3] = [
    Program::raw("rq_wakeup_raw", "sched_wakeup"),
    Program::raw("rq_wakeup_new_raw", "sched_wakeup_new"),
    Program::raw("rq_switch_raw", "sched_switch"),
];

/// Classic tracepoints with field offsets from tracefs: older kernels.
pub const TP_PROGRAMS: [Program; 3] = [
    Program::tracepoint("sched_wakeup", "sched", "sched_wakeup"),
    Program::tracepoint("sched_wakeup_new", "sched", "sched_wakeup_new"),
    Program::tracepoint("sched_switch", "sched", "sched_switch"),
];

/// Field offsets of sched_wakeup(_new) and sched_switch, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// sched_wakeup / sched_wakeup_new: `pid`.
    pub wakeup_pid: u32,
    /// sched_switch: `prev_pid`, `prev_state`, `next_pid`.
    pub switch_prev_pid: u32,
    pub switch_prev_state: u32,
    pub switch_next_pid: u32,
    /// Bits of `prev_state` that mean "not runnable"; a switched-out task
    /// with none of them set (running, or preempted) is still on a run queue.
    pub switch_state_mask: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets =
        Offsets { wakeup_pid: 0, switch_prev_pid: 0, switch_prev_state: 0, switch_next_pid: 0, switch_state_mask: 0xff };
}

crate::pod!(Offsets);
