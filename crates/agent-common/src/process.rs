//! `ebpf_process`: process churn: execs, forks (processes and threads) and
//! process exits.

use crate::program::Program;

/// Per-CPU `u64` counters, indexed by `EXECS`, `FORKS`, `EXITS`.
pub const EVENTS: &str = "PROCESS_EVENTS";
pub const EXECS: u32 = 0;
pub const FORKS: u32 = 1;
pub const EXITS: u32 = 2;
pub const COUNTERS: u32 = 3;

/// The classic tracepoints (kernels before raw tracepoints, Linux < 4.17).
pub const PROGRAMS: [Program; 3] = [
    Program::tracepoint("sched_process_exec", "sched", "sched_process_exec"),
    Program::tracepoint("sched_process_fork", "sched", "sched_process_fork"),
    Program::tracepoint("sched_process_exit", "sched", "sched_process_exit"),
];

/// The raw tracepoints: each program guarded on its own, so none is
/// skipped while another BPF program runs on the CPU.
pub const RAW_PROGRAMS: [Program; 3] = [
    Program::raw("sched_process_exec_raw", "sched_process_exec"),
    Program::raw("sched_process_fork_raw", "sched_process_fork"),
    Program::raw("sched_process_exit_raw", "sched_process_exit"),
];
