//! `ebpf_oom_kills`: tasks chosen by the OOM killer (oom:mark_victim).

use aya_ebpf::{
    macros::{map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{RawTracePointContext, TracePointContext},
};

use crate::helpers::inc;

#[map]
static OOM_KILLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(_ctx: TracePointContext) -> u32 {
    inc(&OOM_KILLS, 0);
    0
}

#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim_raw(_ctx: RawTracePointContext) -> i32 {
    inc(&OOM_KILLS, 0);
    0
}
