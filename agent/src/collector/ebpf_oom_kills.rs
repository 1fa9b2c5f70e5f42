//! `ebpf_oom_kills`: OOM kills counted in the kernel (oom:mark_victim).

use agent_common::CNT_OOM_KILLS;

use super::ebpf_process::{Counter, CounterProbe};
use super::{BuildContext, Paths};
use crate::ebpf::Hook;

const PROGRAMS: [(&str, Hook); 1] = [("oom_mark_victim", Hook::TracePoint("oom", "mark_victim"))];

const COUNTERS: &[Counter<'static>] =
    &[(CNT_OOM_KILLS, "node_ebpf_oom_kills_total", "Processes chosen and killed by the OOM killer (oom:mark_victim).", &[])];

/// The collector: the shared counter probe with this module's programs.
pub fn new(_p: &Paths, ctx: &mut BuildContext) -> CounterProbe {
    CounterProbe::new(ctx, &PROGRAMS, COUNTERS)
}
