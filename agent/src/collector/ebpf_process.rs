//! `ebpf_process`: process churn counted in the kernel — execs
//! (sched_process_exec), forks of processes and threads
//! (sched_process_fork, as node_forks_total counts them), and exits of
//! processes (sched_process_exit of a thread-group leader).

use agent_common::{CNT_EXECS, CNT_EXITS, CNT_FORKS};
use aya::maps::PerCpuArray;
use aya::Ebpf;

use super::{BuildContext, Error, Paths};
use crate::ebpf::{Hook, Probe};
use crate::metrics::{Kind, Sink};

const PROGRAMS: [(&str, Hook); 3] = [
    ("sched_process_exec", Hook::TracePoint("sched", "sched_process_exec")),
    ("sched_process_fork", Hook::TracePoint("sched", "sched_process_fork")),
    ("sched_process_exit", Hook::TracePoint("sched", "sched_process_exit")),
];

fn map_err(e: impl std::fmt::Display) -> Error {
    Error::parse(std::path::Path::new("bpf map EVENTS"), e.to_string())
}

/// One slot of the shared per-CPU event counters, summed over CPUs.
pub fn read_counter(ebpf: &Ebpf, index: u32) -> Result<u64, Error> {
    let map = ebpf.map("EVENTS").ok_or_else(|| map_err("missing"))?;
    let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(map).map_err(map_err)?;
    let v = arr.get(&index, 0).map_err(map_err)?;
    Ok(v.iter().fold(0u64, |a, b| a.wrapping_add(*b)))
}

/// A counter of the shared event array: slot, family, help, labels.
pub type Counter<'a> = (u32, &'a str, &'a str, &'a [(&'a str, &'a str)]);

/// Emits counters from the shared event array for a probe whose programs are up.
pub fn emit_counters(probe: &Probe, sink: &mut Sink, counters: &[Counter]) -> Result<(), Error> {
    probe.self_metrics(sink);
    let (Some(shared), true) = (&probe.shared, probe.up()) else { return Ok(()) };
    let ebpf = shared.lock().ok_or_else(|| map_err("eBPF state poisoned"))?;
    for (index, name, help, labels) in counters {
        let v = read_counter(&ebpf, *index)?;
        sink.family(name, help, Kind::Counter).sample(labels, v as f64);
    }
    Ok(())
}

/// A probe whose programs only bump slots of the shared event counters.
pub struct CounterProbe {
    probe: Probe,
    counters: &'static [Counter<'static>],
}

impl CounterProbe {
    pub fn new(ctx: &mut BuildContext, programs: &[(&'static str, Hook)], counters: &'static [Counter<'static>]) -> Self {
        CounterProbe { probe: Probe::attach(ctx.ebpf(), programs), counters }
    }
}

impl super::Collector for CounterProbe {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        emit_counters(&self.probe, sink, self.counters)
    }
}

const COUNTERS: &[Counter<'static>] = &[
    (CNT_EXECS, "node_ebpf_process_execs_total", "Successful execve calls (sched_process_exec).", &[]),
    (CNT_FORKS, "node_ebpf_process_forks_total", "Tasks created, processes and threads (sched_process_fork).", &[]),
    (CNT_EXITS, "node_ebpf_process_exits_total", "Processes exited (sched_process_exit of a thread-group leader).", &[]),
];

/// The collector: the shared counter probe with this module's programs.
pub fn new(_p: &Paths, ctx: &mut BuildContext) -> CounterProbe {
    CounterProbe::new(ctx, &PROGRAMS, COUNTERS)
}
