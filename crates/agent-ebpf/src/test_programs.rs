//! Programs for the test suite and the benchmark (the `test-programs`
//! feature; never in the shipped object).

use aya_ebpf::{
    macros::{cgroup_skb, cgroup_sock_addr, raw_tracepoint},
    programs::{RawTracePointContext, SkBuffContext, SockAddrContext},
};

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

/// Empty programs, one per hook a probe uses: the benchmark attaches them
/// in a probe's place for the floor of its cost on this kernel (the
/// kernel's own dispatch to a program on that hook). Each needs a name of
/// its own: a program is loaded and attached by name.
macro_rules! empty_programs {
    ($($name:ident on $hook:tt),* $(,)?) => {
        $(
            #[raw_tracepoint(tracepoint = $hook)]
            pub fn $name(_ctx: RawTracePointContext) -> i32 {
                0
            }
        )*
    };
}

empty_programs! {
    empty on "sys_exit",
    empty_sys_enter on "sys_enter",
    empty_process_exec on "sched_process_exec",
    empty_process_fork on "sched_process_fork",
    empty_process_exit on "sched_process_exit",
    empty_rq_issue on "block_rq_issue",
    empty_rq_complete on "block_rq_complete",
    empty_set_state on "inet_sock_set_state",
    empty_kfree_skb on "kfree_skb",
    empty_wakeup on "sched_wakeup",
    empty_wakeup_new on "sched_wakeup_new",
    empty_switch on "sched_switch",
}

/// Empty cgroup socket-buffer programs (they let every packet through), in
/// `ebpf_dns`'s place.
#[cgroup_skb(egress)]
pub fn empty_skb_egress(_ctx: SkBuffContext) -> i32 {
    1
}

#[cgroup_skb(ingress)]
pub fn empty_skb_ingress(_ctx: SkBuffContext) -> i32 {
    1
}

/// Empty cgroup socket-address programs on sendmsg (they let every call
/// through), in `ebpf_dns`'s place.
#[cgroup_sock_addr(sendmsg4)]
pub fn empty_sendmsg4(_ctx: SockAddrContext) -> i32 {
    1
}

#[cgroup_sock_addr(sendmsg6)]
pub fn empty_sendmsg6(_ctx: SockAddrContext) -> i32 {
    1
}
