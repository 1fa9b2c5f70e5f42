//! `ebpf_oom_kills`: tasks chosen by the OOM killer.

use crate::program::Program;

/// Per-CPU `u64` (one entry).
pub const KILLS: &str = "OOM_KILLS";

/// The classic tracepoint (Linux < 4.17, without raw tracepoints).
pub const PROGRAMS: [Program; 1] = [Program::tracepoint("oom_mark_victim", "oom", "mark_victim")];
/// The raw tracepoint: the program reads no argument, so it serves every
/// prototype (the victim's pid before Linux 6.8, its task since).
pub const RAW_PROGRAMS: [Program; 1] = [Program::raw("oom_mark_victim_raw", "mark_victim")];
