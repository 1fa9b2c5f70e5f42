//! `ebpf_oom_kills`: tasks chosen by the OOM killer (oom:mark_victim).

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
};

use crate::helpers::inc;

#[map]
static OOM_KILLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(_ctx: TracePointContext) -> u32 {
    inc(&OOM_KILLS, 0);
    0
}
