//! `ebpf_syscalls`: system calls and their errors, by syscall.

use crate::program::Program;

pub const OFFSETS: &str = "SYSCALL_OFFSETS";
/// Per-CPU `SyscallCounts` (one entry).
pub const COUNTS: &str = "SYSCALLS";

/// `sys_exit`, which also counts failed calls for pod attribution.
pub const SYS_EXIT: Program = Program::raw("sys_exit", "sys_exit");
pub const PROGRAMS: [Program; 1] = [SYS_EXIT];

/// Syscall numbers counted per syscall (larger numbers go to the last slot).
pub const MAX_SYSCALLS: u32 = 512;

/// Calls and failed calls per syscall number: one value of a one-entry
/// per-CPU array, so user space reads every counter in one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallCounts {
    pub calls: [u64; MAX_SYSCALLS as usize],
    pub errors: [u64; MAX_SYSCALLS as usize],
}

/// Where the syscall number is in `struct pt_regs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `orig_ax` on x86_64, `syscallno` on aarch64.
    pub regs_syscall_nr: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets { regs_syscall_nr: 0 };
}

crate::pod!(SyscallCounts, Offsets);
