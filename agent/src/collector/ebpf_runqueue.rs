//! `ebpf_runqueue`: how long runnable tasks wait for a CPU, measured in the
//! kernel from wakeup (or preemption) to running (sched_wakeup,
//! sched_wakeup_new, sched_switch), as `node_ebpf_runqueue_latency_seconds`.

use agent_common::{Hist, CNT_DROPPED_RUNQ};
use aya::maps::{PerCpuArray, PerCpuValues};

use super::{BuildContext, Error, Paths};
use crate::ebpf::{to_prometheus, Hook, Probe};
use crate::metrics::{Kind, Sink};

/// Raw tracepoints keyed by task address: Linux >= 5.18, whose sched_switch
/// passes the previous task's state.
pub const RAW_PROGRAMS: [(&str, Hook); 3] = [
    ("rq_wakeup_raw", Hook::RawTracePoint("sched_wakeup")),
    ("rq_wakeup_new_raw", Hook::RawTracePoint("sched_wakeup_new")),
    ("rq_switch_raw", Hook::RawTracePoint("sched_switch")),
];
/// Tracepoints with field offsets from tracefs: older kernels.
pub const TP_PROGRAMS: [(&str, Hook); 3] = [
    ("sched_wakeup", Hook::TracePoint("sched", "sched_wakeup")),
    ("sched_wakeup_new", Hook::TracePoint("sched", "sched_wakeup_new")),
    ("sched_switch", Hook::TracePoint("sched", "sched_switch")),
];

/// Whether a kernel release (`6.18.44-...`) is at least `major.minor`.
pub fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// Whether the raw-tracepoint programs (keyed by task) serve this kernel.
pub fn raw_supported() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(release.trim(), 5, 18)
}

/// The programs for the running kernel.
pub fn programs() -> &'static [(&'static str, Hook); 3] {
    if raw_supported() {
        &RAW_PROGRAMS
    } else {
        &TP_PROGRAMS
    }
}

pub struct Collector {
    probe: Probe,
}

impl Collector {
    pub fn new(_p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), programs()) }
    }
}

/// The collector.
pub fn new(p: &Paths, ctx: &mut BuildContext) -> Collector {
    Collector::new(p, ctx)
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

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_releases() {
        assert!(super::release_at_least("6.18.44-fc-v669", 5, 18));
        assert!(super::release_at_least("5.18.0", 5, 18));
        assert!(!super::release_at_least("5.15.0-91-generic", 5, 18));
        assert!(!super::release_at_least("", 5, 18));
    }
}
