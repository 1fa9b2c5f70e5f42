//! `ebpf_oom_kills`: OOM kills counted in the kernel (oom:mark_victim, on
//! the raw tracepoint from Linux 4.17).

use agent_common::oom_kills::{KILLS, PROGRAMS, RAW_PROGRAMS};
use clap::Arg;
use host::flags::Flags;
use host::{Collector, ConfigError, Paths};

use super::counters::{Counter, CounterProbe};
use super::Context;

const COUNTERS: &[Counter] = &[(0, "node_ebpf_oom_kills_total", "Processes chosen and killed by the OOM killer (oom:mark_victim).", &[])];

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn Collector>, ConfigError> {
    let programs: &'static [agent_common::Program] =
        if crate::ebpf::kernel::Kernel::get().at_least(4, 17) { &RAW_PROGRAMS } else { &PROGRAMS };
    Ok(Box::new(CounterProbe::new(ctx, programs, KILLS, COUNTERS)))
}
