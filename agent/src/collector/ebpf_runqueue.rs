//! `ebpf_runqueue`: how long runnable tasks wait for a CPU, measured in the
//! kernel from wakeup (or preemption) to running (sched_wakeup,
//! sched_wakeup_new, sched_switch), as `node_ebpf_runqueue_latency_seconds`.

use agent_common::{Hist, CNT_DROPPED_RUNQ};
use aya::maps::{PerCpuArray, PerCpuValues};

use super::{BuildContext, Error, Paths};
use crate::ebpf::{to_prometheus, Hook, Probe};
use crate::metrics::{Kind, Sink};

const PROGRAMS: [(&str, Hook); 3] = [
    ("sched_wakeup", Hook::TracePoint("sched", "sched_wakeup")),
    ("sched_wakeup_new", Hook::TracePoint("sched", "sched_wakeup_new")),
    ("sched_switch", Hook::TracePoint("sched", "sched_switch")),
];

pub struct Collector {
    probe: Probe,
}

impl Collector {
    pub fn new(_p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), &PROGRAMS) }
    }
}

fn map_err(e: impl std::fmt::Display) -> Error {
    Error::parse(std::path::Path::new("bpf map"), e.to_string())
}

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        self.probe.self_metrics(sink);
        let (Some(shared), true) = (&self.probe.shared, self.probe.up()) else { return Ok(()) };
        let ebpf = shared.lock().ok_or_else(|| map_err("eBPF state poisoned"))?;
        let map = ebpf.map("RUNQ_HIST").ok_or_else(|| map_err("no RUNQ_HIST map"))?;
        let hist: PerCpuArray<_, Hist> = PerCpuArray::try_from(map).map_err(map_err)?;
        let per_cpu: PerCpuValues<Hist> = hist.get(&0, 0).map_err(map_err)?;
        let (buckets, sum, count) = to_prometheus(&per_cpu);
        sink.family("node_ebpf_runqueue_latency_seconds", "Time runnable tasks waited on a run queue before running.", Kind::Histogram)
            .histogram(&[], sum, count, &buckets);
        let dropped = crate::collector::ebpf_process::read_counter(&ebpf, CNT_DROPPED_RUNQ)?;
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "runqueue")], dropped as f64);
        Ok(())
    }
}
