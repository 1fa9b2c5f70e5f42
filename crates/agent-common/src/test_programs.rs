//! Programs for the test suite and the benchmark only, compiled into the
//! object with `agent-ebpf`'s `test-programs` feature (never shipped).

use crate::program::{Hook, Program, SkbDirection, SockAddrHook};

/// Dereferences a raw tracepoint argument directly: the verifier refuses it.
pub const VERIFIER_REJECTS: Program = Program::raw("verifier_rejects", "sys_exit");
/// Does nothing, on sys_exit: the floor of a probe's cost on that hook.
pub const EMPTY: Program = Program::raw("empty", "sys_exit");

/// An empty program on every hook a probe of the benchmark uses.
pub const EMPTY_ON_HOOKS: [Program; 16] = [
    EMPTY,
    Program::raw("empty_sys_enter", "sys_enter"),
    Program::raw("empty_process_exec", "sched_process_exec"),
    Program::raw("empty_process_fork", "sched_process_fork"),
    Program::raw("empty_process_exit", "sched_process_exit"),
    Program::raw("empty_rq_issue", "block_rq_issue"),
    Program::raw("empty_rq_complete", "block_rq_complete"),
    Program::raw("empty_set_state", "inet_sock_set_state"),
    Program::raw("empty_kfree_skb", "kfree_skb"),
    Program::raw("empty_wakeup", "sched_wakeup"),
    Program::raw("empty_wakeup_new", "sched_wakeup_new"),
    Program::raw("empty_switch", "sched_switch"),
    Program { name: "empty_skb_egress", hook: Hook::CgroupSkb(SkbDirection::Egress) },
    Program { name: "empty_skb_ingress", hook: Hook::CgroupSkb(SkbDirection::Ingress) },
    Program { name: "empty_sendmsg4", hook: Hook::CgroupSockAddr(SockAddrHook::UdpSendmsg4) },
    Program { name: "empty_sendmsg6", hook: Hook::CgroupSockAddr(SockAddrHook::UdpSendmsg6) },
];

/// The empty program on `hook`, if there is one.
pub fn empty_on(hook: Hook) -> Option<Program> {
    EMPTY_ON_HOOKS.iter().find(|p| p.hook == hook).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_empty_program_has_a_hook_and_a_name_of_its_own() {
        for (i, p) in EMPTY_ON_HOOKS.iter().enumerate() {
            assert_eq!(empty_on(p.hook), Some(*p), "{}", p.name);
            assert!(EMPTY_ON_HOOKS[..i].iter().all(|q| q.name != p.name && q.hook != p.hook), "{} twice", p.name);
        }
        assert_eq!(empty_on(Hook::TracePoint("raw_syscalls", "sys_exit")), None);
    }
}
