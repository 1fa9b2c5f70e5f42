//! Where a program attaches, named on both sides.

/// A tracepoint hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A classic (perf-event) tracepoint: category and name; the program
    /// reads the formatted record at offsets from tracefs.
    TracePoint(&'static str, &'static str),
    /// A raw tracepoint: the program gets the tracepoint's arguments.
    RawTracePoint(&'static str),
    /// A cgroup socket-buffer program (`BPF_PROG_TYPE_CGROUP_SKB`) on the
    /// cgroup v2 root: every socket's packets, one direction.
    CgroupSkb(SkbDirection),
    /// A cgroup socket-address program (`BPF_PROG_TYPE_CGROUP_SOCK_ADDR`)
    /// on the cgroup v2 root: every socket's calls of one kind, with the
    /// address the caller gave.
    CgroupSockAddr(SockAddrHook),
    /// A raw tracepoint program loaded but never attached: the agent runs
    /// it (BPF_PROG_TEST_RUN) with arguments of its own.
    Run,
}

/// The direction of a [`Hook::CgroupSkb`] program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkbDirection {
    Ingress,
    Egress,
}

/// The call a [`Hook::CgroupSockAddr`] program runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockAddrHook {
    /// sendmsg(2) and sendto(2) with an address on an unconnected UDP
    /// socket, IPv4 (`BPF_CGROUP_UDP4_SENDMSG`).
    UdpSendmsg4,
    /// The same, IPv6 (`BPF_CGROUP_UDP6_SENDMSG`).
    UdpSendmsg6,
}

/// A program of the object: its function name and its hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub hook: Hook,
}

impl Program {
    pub const fn tracepoint(name: &'static str, category: &'static str, event: &'static str) -> Program {
        Program { name, hook: Hook::TracePoint(category, event) }
    }

    pub const fn raw(name: &'static str, event: &'static str) -> Program {
        Program { name, hook: Hook::RawTracePoint(event) }
    }
}
