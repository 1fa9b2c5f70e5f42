//! `ebpf_syscall_latency`: how long system calls take, from sys_enter to
//! sys_exit, in native histograms (`hist::NativeHist`) by syscall family.

use crate::program::Program;

/// The read-only global: the family of every syscall number (`Families`).
pub const FAMILIES: &str = "SYSLAT_FAMILIES";
/// Task (`task_struct` address) to `Start`: syscalls in flight.
pub const START: &str = "SYSLAT_START";
/// Per-CPU `NativeHist`, one entry per family (`FAMILY_NAMES` order).
pub const HIST: &str = "SYSLAT_HIST";
/// Per-CPU `u64` (one entry): syscalls not timed because `START` was full.
pub const DROPPED: &str = "SYSLAT_DROPPED";
/// `u64` array (one entry): the slow-syscall threshold in ns for pod
/// attribution (0: none counted), set by user space after loading.
pub const CONFIG: &str = "SYSLAT_CONFIG";

pub const SYS_ENTER: Program = Program::raw("syslat_sys_enter", "sys_enter");
pub const SYS_EXIT: Program = Program::raw("syslat_sys_exit", "sys_exit");
/// Deletes the exiting task's entry (a thread that exits inside a syscall,
/// or a syscall that never returns, leaves one behind).
pub const TASK_EXIT: Program = Program::raw("syslat_task_exit", "sched_process_exit");
pub const PROGRAMS: [Program; 3] = [TASK_EXIT, SYS_EXIT, SYS_ENTER];

/// Syscalls in flight tracked at once (one per task at most).
pub const MAX_IN_FLIGHT: u32 = 65536;

/// Syscall numbers with a family of their own (larger numbers: `OTHER`).
pub const MAX_SYSCALLS: usize = 512;

/// The families, by index (the `family` label).
pub const FAMILY_NAMES: [&str; 10] = ["read", "write", "poll", "futex", "net", "file", "memory", "process", "sleep", "other"];
pub const READ: u8 = 0;
pub const WRITE: u8 = 1;
pub const POLL: u8 = 2;
pub const FUTEX: u8 = 3;
pub const NET: u8 = 4;
pub const FILE: u8 = 5;
pub const MEMORY: u8 = 6;
pub const PROCESS: u8 = 7;
pub const SLEEP: u8 = 8;
pub const OTHER: u8 = 9;
pub const NUM_FAMILIES: u32 = FAMILY_NAMES.len() as u32;
/// Not timed: syscalls that never return (exit, exit_group).
pub const NOT_TIMED: u8 = u8::MAX;

/// The family of every syscall number of the running architecture.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub by_nr: [u8; MAX_SYSCALLS],
}

impl Families {
    pub const DEFAULT: Families = Families { by_nr: [OTHER; MAX_SYSCALLS] };
}

/// A syscall in flight: when it entered, and its family.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    pub ns: u64,
    pub family: u32,
    pub _pad: u32,
}

crate::pod!(Families, Start);
