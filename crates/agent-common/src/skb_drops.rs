//! `ebpf_skb_drops`: packets the kernel dropped, by drop reason
//! (skb:kfree_skb's `enum skb_drop_reason`, Linux >= 5.17; before, every
//! drop in slot [`UNKNOWN`]).

use crate::program::Program;

pub const OFFSETS: &str = "SKB_DROPS_OFFSETS";
/// Per-CPU `DropCounts` (one entry).
pub const COUNTS: &str = "SKB_DROPS";

/// The raw kfree_skb tracepoint (consume_skb, a different tracepoint,
/// carries the packets freed after use).
pub const KFREE_SKB: Program = Program::raw("skb_kfree_skb", "kfree_skb");
pub const PROGRAMS: [Program; 1] = [KFREE_SKB];

/// Reason slots: reason values below `MAX_REASONS - 1` count in their own
/// slot, every larger one (subsystem-coded reasons, whose high 16 bits name
/// the subsystem) in the last.
pub const MAX_REASONS: u32 = 256;
/// The slot of every reason value >= `OTHER`.
pub const OTHER: u32 = MAX_REASONS - 1;
/// The slot of every drop where kfree_skb passes no reason (Linux < 5.17:
/// `reason_arg` is `NO_ARG`).
pub const UNKNOWN: u32 = 0;

/// Drops per reason value: one value of a one-entry per-CPU array, so user
/// space reads every counter in one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DropCounts {
    pub reasons: [u64; MAX_REASONS as usize],
}

/// "No such argument" for the `*_arg` fields of `Offsets`.
pub const NO_ARG: u32 = u32::MAX;

/// Where kfree_skb's arguments are (raw tracepoint argument indices, from
/// the kernel's BTF: `btf_trace_kfree_skb`'s parameters after the leading
/// `void *`), and `sk_buff.sk` for pod attribution.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `enum skb_drop_reason reason`, `NO_ARG` where kfree_skb passes none
    /// (Linux < 5.17).
    pub reason_arg: u32,
    /// `struct sk_buff *skb`.
    pub skb_arg: u32,
    /// `struct sock *rx_sk` (Linux >= 6.9), else `NO_ARG`.
    pub rx_sk_arg: u32,
    /// Byte offset of `sk_buff.sk`.
    pub skb_sk: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets { reason_arg: NO_ARG, skb_arg: NO_ARG, rx_sk_arg: NO_ARG, skb_sk: 0 };
}

crate::pod!(DropCounts, Offsets);
