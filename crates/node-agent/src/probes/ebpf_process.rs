//! `ebpf_process`: process churn counted in the kernel — execs
//! (sched_process_exec), forks of processes and threads
//! (sched_process_fork, as node_forks_total counts them), and exits of
//! processes (sched_process_exit of a thread-group leader). On raw
//! tracepoints (Linux >= 4.17), each program guarded on its own; on the
//! classic ones before.

use agent_common::process::{EVENTS, EXECS, EXITS, FORKS, PROGRAMS, RAW_PROGRAMS};
use clap::Arg;
use host::flags::Flags;
use host::{Collector, ConfigError, Paths};

use super::counters::{Counter, CounterProbe};
use super::Context;

const COUNTERS: &[Counter] = &[
    (EXECS, "node_ebpf_process_execs_total", "Successful execve calls (sched_process_exec).", &[]),
    (FORKS, "node_ebpf_process_forks_total", "Tasks created, processes and threads (sched_process_fork).", &[]),
    (EXITS, "node_ebpf_process_exits_total", "Processes exited (sched_process_exit of a thread-group leader).", &[]),
];

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn Collector>, ConfigError> {
    let programs: &'static [agent_common::Program] =
        if crate::ebpf::kernel::Kernel::get().at_least(4, 17) { &RAW_PROGRAMS } else { &PROGRAMS };
    Ok(Box::new(CounterProbe::new(ctx, programs, EVENTS, COUNTERS)))
}
