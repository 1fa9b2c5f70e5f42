//! `ebpf_tcp_latency`: TCP connect latency and smoothed round-trip time, in
//! native histograms, and connects that failed, from the raw
//! `inet_sock_set_state` tracepoint.

use crate::program::Program;

pub const OFFSETS: &str = "TCP_LAT_OFFSETS";
/// Per-CPU `NativeHist`, entries `CONNECT` and `RTT`.
pub const HISTS: &str = "TCP_LAT_HISTS";
/// Per-CPU counters, entries `FAILED` and `DROPPED`.
pub const COUNTERS: &str = "TCP_LAT_COUNTERS";
/// Connects in flight: socket address to the time it entered SYN_SENT.
pub const STARTS: &str = "TCP_CONNECT_STARTS";

pub const SET_STATE: Program = Program::raw("tcp_set_state", "inet_sock_set_state");
pub const PROGRAMS: [Program; 1] = [SET_STATE];

/// `HISTS` entries.
pub const CONNECT: u32 = 0;
pub const RTT: u32 = 1;
pub const NUM_HISTS: u32 = 2;

/// `COUNTERS` entries: connects that ended in CLOSE from SYN_SENT (refused,
/// timed out, reset); connects not timed because `STARTS` was full.
pub const FAILED: u32 = 0;
pub const DROPPED: u32 = 1;
pub const NUM_COUNTERS: u32 = 2;

/// Connects timed at once, at most.
pub const MAX_IN_FLIGHT: u32 = 16384;

/// TCP states (include/net/tcp_states.h).
pub const TCP_ESTABLISHED: i32 = 1;
pub const TCP_SYN_SENT: i32 = 2;
pub const TCP_SYN_RECV: i32 = 3;
pub const TCP_CLOSE: i32 = 7;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u16 = 6;

/// Where the program reads, from the kernel's BTF (the tracepoint's
/// arguments are `(const struct sock *sk, int oldstate, int newstate)`
/// since Linux 4.16; the agent checks them in `btf_trace_inet_sock_set_state`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Byte offset of `sock.sk_protocol` (a u16 since Linux 5.6).
    pub sk_protocol: u32,
    /// Byte offset of `tcp_sock.srtt_us` (smoothed RTT in µs, times 8).
    pub srtt_us: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets { sk_protocol: 0, srtt_us: 0 };
}

crate::pod!(Offsets);
