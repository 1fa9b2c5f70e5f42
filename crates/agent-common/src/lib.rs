//! Types shared by the eBPF programs (`agent-ebpf`) and the agent, one
//! module per probe: its map key and value types (`#[repr(C)]`, explicit
//! padding), the layout of its read-only global of tracepoint offsets, and
//! the names of its maps, global and programs, as constants the user side
//! uses. (The eBPF side names its statics after them; an unprivileged test
//! checks every name against the compiled object.)
//!
//! `no_std`; the `user` feature adds `aya::Pod`.

#![no_std]

pub mod block_io;
pub mod dns;
pub mod hist;
pub mod ledger;
pub mod oom_kills;
pub mod pods;
pub mod process;
pub mod program;
pub mod runqueue;
pub mod skb_drops;
pub mod syscall_latency;
pub mod syscalls;
pub mod tcp_latency;
pub mod tcp_peers;
pub mod tcp_retransmits;
pub mod test_programs;

pub use hist::{log2_bucket, native_bucket, Hist, NativeHist, HIST_BUCKETS, NATIVE_OFFSET, NATIVE_SCHEMA, NATIVE_SLOTS};
pub use program::{Hook, Program, SkbDirection, SockAddrHook};

/// The licence the eBPF object declares to the kernel (its `license`
/// section), which must agree with `agent-ebpf`'s Cargo licence.
pub const LICENSE: &str = "Dual MIT/GPL";

/// Every map the user side opens by name, every read-only global it sets
/// and every program it attaches, by probe: a test checks them against the
/// compiled object (and that the object has nothing else).
pub const MAPS: &[&str] = &[
    block_io::START,
    block_io::RQ_START,
    block_io::HIST,
    block_io::DROPPED,
    dns::PENDING,
    dns::STATS,
    dns::LAT,
    dns::DROPPED,
    dns::NAMES,
    dns::NAME_SCRATCH,
    dns::MADE,
    dns::GONE,
    dns::CONNS,
    dns::SENT,
    dns::IN_SCRATCH,
    dns::OUT_SCRATCH,
    dns::OUT_DEPTH,
    oom_kills::KILLS,
    pods::STATS,
    pods::DROPPED,
    process::EVENTS,
    runqueue::HIST,
    runqueue::START,
    runqueue::TASK_START,
    runqueue::DROPPED,
    skb_drops::COUNTS,
    syscall_latency::START,
    syscall_latency::HIST,
    syscall_latency::DROPPED,
    syscall_latency::CONFIG,
    syscalls::COUNTS,
    tcp_latency::HISTS,
    tcp_latency::COUNTERS,
    tcp_latency::STARTS,
    tcp_peers::SOCKS,
    tcp_peers::STATS,
    tcp_peers::LAT,
    tcp_peers::DROPPED,
    tcp_peers::MADE,
    tcp_peers::GONE,
    tcp_peers::BATON,
    tcp_retransmits::RETRANSMITS,
];
pub const GLOBALS: &[&str] = &[
    block_io::OFFSETS,
    dns::CONFIG,
    dns::LIMITS,
    pods::OFFSETS,
    runqueue::OFFSETS,
    skb_drops::OFFSETS,
    syscall_latency::FAMILIES,
    syscalls::OFFSETS,
    tcp_latency::OFFSETS,
    tcp_peers::OFFSETS,
    tcp_peers::LIMITS,
    tcp_retransmits::OFFSETS,
];
pub const PROGRAMS: &[&[Program]] = &[
    &block_io::PROGRAMS,
    &block_io::RAW_PROGRAMS,
    &dns::PROGRAMS,
    &oom_kills::PROGRAMS,
    &oom_kills::RAW_PROGRAMS,
    &[pods::OOM_VICTIM, pods::OOM_CURRENT],
    &pods::BLOCK_PROGRAMS,
    &process::PROGRAMS,
    &process::RAW_PROGRAMS,
    &runqueue::RAW_PROGRAMS,
    &runqueue::TP_PROGRAMS,
    &skb_drops::PROGRAMS,
    &syscall_latency::PROGRAMS,
    &syscalls::PROGRAMS,
    &tcp_latency::PROGRAMS,
    &tcp_peers::PROGRAMS,
    &tcp_retransmits::PROGRAMS,
    &tcp_retransmits::RAW_PROGRAMS,
];
/// Compiled in only with `agent-ebpf`'s `test-programs` feature.
pub const TEST_PROGRAMS: &[&[Program]] = &[&[test_programs::VERIFIER_REJECTS], &test_programs::EMPTY_ON_HOOKS];

/// Implements `aya::Pod` for plain-data map types (user side only).
#[macro_export]
#[doc(hidden)]
macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: the type is #[repr(C)], made only of integers, with
            // explicit padding fields, so every bit pattern is valid.
            #[cfg(feature = "user")]
            unsafe impl aya::Pod for $t {}
        )*
    };
}
