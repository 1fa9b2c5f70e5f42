//! `ebpf_syscalls`: every syscall's calls and errors, counted per CPU on
//! the raw sys_exit tracepoint (and failed calls per cgroup for pods).

use agent_common::pods::{SYSCALLS as PODS_SYSCALLS, SYSCALL_ERRORS};
use agent_common::syscalls::{Offsets, SyscallCounts, MAX_SYSCALLS};
use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
    Global,
};

use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static SYSCALL_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static SYSCALLS: PerCpuArray<SyscallCounts> = PerCpuArray::with_max_entries(1, 0);

fn try_sys_exit(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(struct pt_regs *regs, long ret): one program per syscall,
    // counting the call and, when it failed, the error. (exit and
    // exit_group never return, so they are not seen.)
    let regs: *const u8 = ctx.arg(0);
    let ret: i64 = ctx.arg(1);
    let off = SYSCALL_OFFSETS.load();
    // SAFETY: reads the syscall number from the kernel's pt_regs at the
    // architecture's offset; a failed read returns an error.
    let id: u32 = unsafe { bpf_probe_read_kernel(regs.add(off.regs_syscall_nr as usize) as *const u32)? };
    let slot = if id < MAX_SYSCALLS { id as usize } else { MAX_SYSCALLS as usize - 1 };
    let failed = (-4095..0).contains(&ret);
    if let Some(c) = SYSCALLS.get_ptr_mut(0) {
        // SAFETY: this CPU's value; `slot` is bounds-checked by `get_mut`.
        unsafe {
            if let Some(n) = (*c).calls.get_mut(slot) {
                *n += 1;
            }
            if failed {
                if let Some(n) = (*c).errors.get_mut(slot) {
                    *n += 1;
                }
            }
        }
    }
    if failed && pods::on(PODS_SYSCALLS) {
        pods::add(pods::current_cgroup_id(), SYSCALL_ERRORS, 1);
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let _ = try_sys_exit(&ctx);
    0
}
