//! `ebpf_tcp_retransmits`: TCP segments retransmitted, by address family.

use crate::program::Program;

pub const OFFSETS: &str = "TCP_OFFSETS";
/// Per-CPU `u64` counters, indexed by `V4`, `V6`.
pub const RETRANSMITS: &str = "TCP_RETRANSMITS";
pub const V4: u32 = 0;
pub const V6: u32 = 1;
pub const COUNTERS: u32 = 2;

/// `tcp_retransmit_skb` on the classic tracepoint (without kernel BTF),
/// which also counts retransmits for pod attribution.
pub const RETRANSMIT_SKB: Program = Program::tracepoint("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb");
pub const PROGRAMS: [Program; 1] = [RETRANSMIT_SKB];
/// The same on the raw tracepoint, guarded on its own (a classic one is
/// skipped while another BPF program runs on the CPU).
pub const RETRANSMIT_SKB_RAW: Program = Program::raw("tcp_retransmit_skb_raw", "tcp_retransmit_skb");
pub const RAW_PROGRAMS: [Program; 1] = [RETRANSMIT_SKB_RAW];

/// Field offsets of tcp_retransmit_skb, from tracefs (classic program),
/// and from the kernel's BTF (raw program: `TP_PROTO(const struct sock *sk,
/// const struct sk_buff *skb[, int err])`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub family: u32,
    /// `err` (kernels >= 6.17 also trace failed retransmits); 0 when the
    /// field does not exist.
    pub err: u32,
    /// `skaddr`, the socket (for pod attribution).
    pub skaddr: u32,
    /// Byte offset of `sock.__sk_common.skc_family` (the raw program's,
    /// and the classic one's where the tracepoint has no `family`, 0).
    pub sk_family: u32,
    /// 1 when the raw tracepoint passes `err` as its third argument.
    pub raw_err: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets { family: 0, err: 0, skaddr: 0, sk_family: 0, raw_err: 0 };
}

crate::pod!(Offsets);
