//! Programs for the test suite and the benchmark (the `test-programs`
//! feature; never in the shipped object).

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

/// Dereferences a raw tracepoint argument directly, which the verifier
/// refuses: the truth tests check that a rejected program is reported down
/// and leaves everything else running.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn verifier_rejects(ctx: RawTracePointContext) -> i32 {
    let regs: *const u64 = ctx.arg(0);
    // SAFETY: deliberately unsound (a kernel pointer read without
    // bpf_probe_read_kernel): the verifier must reject this program.
    unsafe { core::ptr::read_volatile(regs) as i32 }
}

/// An empty program (attached to sys_exit by the benchmark): the floor of
/// a probe's cost on this kernel.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn empty(_ctx: RawTracePointContext) -> i32 {
    0
}
