//! `ebpf_oom_kills`: OOM kills counted in the kernel (oom:mark_victim).

use agent_common::CNT_OOM_KILLS;

use super::{BuildContext, Error, Paths};
use crate::ebpf::{Hook, Probe};
use crate::metrics::Sink;

const PROGRAMS: [(&str, Hook); 1] = [("oom_mark_victim", Hook::TracePoint("oom", "mark_victim"))];

pub struct Collector {
    probe: Probe,
}

impl Collector {
    pub fn new(_p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), &PROGRAMS) }
    }
}

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        super::ebpf_process::emit_counters(
            &self.probe,
            sink,
            &[(CNT_OOM_KILLS, "node_ebpf_oom_kills_total", "Processes chosen and killed by the OOM killer (oom:mark_victim).", &[])],
        )
    }
}
