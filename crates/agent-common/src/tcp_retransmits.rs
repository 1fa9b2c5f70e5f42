//! `ebpf_tcp_retransmits`: TCP segments retransmitted, by address family.

use crate::program::Program;

pub const OFFSETS: &str = "TCP_OFFSETS";
/// Per-CPU `u64` counters, indexed by `V4`, `V6`.
pub const RETRANSMITS: &str = "TCP_RETRANSMITS";
pub const V4: u32 = 0;
pub const V6: u32 = 1;
pub const COUNTERS: u32 = 2;

/// `tcp_retransmit_skb`, which also counts retransmits for pod attribution.
pub const RETRANSMIT_SKB: Program = Program::tracepoint("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb");
pub const PROGRAMS: [Program; 1] = [RETRANSMIT_SKB];

/// Field offsets of tcp_retransmit_skb, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub family: u32,
    /// `err` (kernels >= 6.10 also trace failed retransmits); 0 when the
    /// field does not exist.
    pub err: u32,
    /// `skaddr`, the socket (for pod attribution).
    pub skaddr: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets { family: 0, err: 0, skaddr: 0 };
}

crate::pod!(Offsets);
