//! `ebpf_oom_kills`: OOM kills counted in the kernel (oom:mark_victim).

use agent_common::oom_kills::{KILLS, PROGRAMS};
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
    Ok(Box::new(CounterProbe::new(ctx, &PROGRAMS, KILLS, COUNTERS)))
}
