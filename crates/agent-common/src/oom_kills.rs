//! `ebpf_oom_kills`: tasks chosen by the OOM killer.

use crate::program::Program;

/// Per-CPU `u64` (one entry).
pub const KILLS: &str = "OOM_KILLS";

pub const PROGRAMS: [Program; 1] = [Program::tracepoint("oom_mark_victim", "oom", "mark_victim")];
