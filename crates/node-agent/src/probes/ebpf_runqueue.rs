//! `ebpf_runqueue`: how long runnable tasks wait for a CPU, measured in the
//! kernel from wakeup (or preemption) to running (sched_wakeup,
//! sched_wakeup_new, sched_switch), as `node_ebpf_runqueue_latency_seconds`.

use agent_common::runqueue::{Offsets, DROPPED, HIST, OFFSETS, RAW_PROGRAMS, START, TASK_START, TP_PROGRAMS};
use agent_common::Program;
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::{switch_state_mask, Kernel};
use crate::ebpf::{map_stats, maps, Globals, Probe};

/// The programs for the running kernel: raw tracepoints keyed by task where
/// sched_switch passes the previous task's state, else classic ones.
pub fn programs(k: &Kernel) -> &'static [Program; 3] {
    if k.raw_sched_switch() {
        &RAW_PROGRAMS
    } else {
        &TP_PROGRAMS
    }
}

/// The entries of the map of enqueue times, for this node: a task's entry
/// is in flight only between its wakeup and its switch in (milliseconds),
/// so what must fit is the tasks woken meanwhile, which grows with the
/// CPUs, and the threads that could be runnable at once; the LRU reuses the
/// entries of tasks that ran. Twice the threads now, 512 a CPU, within
/// [4096, the object's 32768] (a thread or CPU added after start-up is
/// within the floor's and the factor's room). An eviction of an entry in
/// flight is not counted: the kernel's LRU evicts silently, and the switch
/// that finds no entry cannot tell it from a task woken before the
/// programs were attached.
pub fn start_entries(procfs: &std::path::Path) -> u32 {
    entries_for(map_stats::node_threads(procfs), map_stats::possible_cpus())
}

/// Entries of the map of enqueue times a CPU (see [`start_entries`]).
pub const ENTRIES_PER_CPU: u64 = 512;
/// The fewest and most entries of the map of enqueue times (the most is
/// the object's own size).
pub const ENTRIES_FLOOR: u32 = 4096;
pub const ENTRIES_CAP: u32 = 32768;

/// [`start_entries`] for `threads` threads and `cpus` possible CPUs.
pub fn entries_for(threads: u64, cpus: u64) -> u32 {
    map_stats::sized((2 * threads).max(ENTRIES_PER_CPU * cpus), ENTRIES_FLOOR, ENTRIES_CAP)
}

/// The classic tracepoints' field offsets (the raw programs read none), and
/// the size of the map of enqueue times the variant in use has (the other
/// variant's map is never written: one entry).
pub fn globals(k: &Kernel, ctx: &mut Context, g: &mut Globals) {
    let (used, unused) = if k.raw_sched_switch() { (TASK_START, START) } else { (START, TASK_START) };
    g.max_entries(used, start_entries(&ctx.procfs));
    g.max_entries(unused, 1);
    let w = k.format("sched", "sched_wakeup");
    let s = k.format("sched", "sched_switch");
    g.set(
        OFFSETS,
        &Offsets {
            wakeup_pid: w.offset("pid"),
            switch_prev_pid: s.offset("prev_pid"),
            switch_prev_state: s.offset("prev_state"),
            switch_next_pid: s.offset("next_pid"),
            switch_state_mask: switch_state_mask(&s.text),
        },
    );
}

pub struct Collector {
    probe: Probe,
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    Ok(Box::new(Collector { probe: ctx.attach(programs(Kernel::get())) }))
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        let ebpf = shared.lock().ok_or(maps::MapError::Poisoned)?;
        let (buckets, sum, count) = maps::to_prometheus(&maps::histogram(&ebpf, HIST)?);
        sink.family("node_ebpf_runqueue_latency_seconds", "Time runnable tasks waited on a run queue before running.", Kind::Histogram)
            .histogram(&[], sum, count, &buckets);
        let dropped = maps::counter(&ebpf, DROPPED, 0)?;
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "runqueue")], dropped as f64);
        Ok(())
    }
}
