//! `ebpf_tcp_peers`: TCP connections by cgroup and peer (remote address and
//! port out, remote address and local port in), counted in the kernel from
//! the raw `inet_sock_set_state` tracepoint: connects started, their
//! results and latency, connections accepted, and the bytes and
//! retransmits of each connection when it closes.

use crate::program::Program;

pub const OFFSETS: &str = "TCP_PEERS_OFFSETS";
/// Connections followed: socket address to [`SockState`].
pub const SOCKS: &str = "TCP_PEER_SOCKS";
/// [`PeerKey`] to [`PeerCounters`], cumulative; user space deletes the
/// entries that stayed unchanged for a whole scrape interval.
pub const STATS: &str = "TCP_PEER_STATS";
/// [`LatKey`] to a count: the non-empty native buckets of each peer's
/// connect latency.
pub const LAT: &str = "TCP_PEER_LAT";
/// Per-CPU counters of events not recorded: [`DROP_SOCKS`], [`DROP_STATS`], [`DROP_LAT`].
pub const DROPPED: &str = "TCP_PEER_DROPPED";
/// The per-cgroup ledger of the keys of [`STATS`], [`LAT`] and [`SOCKS`]
/// (`crate::ledger`, words `STATS`, `LAT`, `AUX`): cgroup id to
/// `ledger::Entries`, made by the programs, gone by the agent.
pub const MADE: &str = "TCP_PEER_MADE";
pub const GONE: &str = "TCP_PEER_GONE";
/// The per-cgroup limits (`ledger::Limits`; `aux`: connections followed).
pub const LIMITS: &str = "TCP_PEERS_LIMITS";

pub const SET_STATE: Program = Program::raw("tcp_peers_set_state", "inet_sock_set_state");
/// Run by the agent at each scrape with up to [`SWEEP_BATCH`] followed
/// sockets as arguments: adds the bytes and retransmits of each since it
/// was last counted, so that a long-lived connection's bytes show before
/// it closes.
pub const SWEEP: Program = Program { name: "tcp_peers_sweep", hook: crate::program::Hook::Run };
pub const PROGRAMS: [Program; 2] = [SET_STATE, SWEEP];
/// The functions of the object that serve as [`SET_STATE`] and [`SWEEP`]
/// on kernels without BPF's atomic exchange (BPF_XCHG, Linux >= 5.12; an
/// object with one anywhere is refused before): the same programs, passing
/// a baton ([`BATON`]) instead.
pub const SET_STATE_BATON: &str = "tcp_peers_set_state_baton";
pub const SWEEP_BATON: &str = "tcp_peers_sweep_baton";
/// Sockets per run of [`SWEEP`]: a raw tracepoint's arguments.
pub const SWEEP_BATCH: usize = 12;

/// Connections followed at once, at most, unless the agent sizes the map
/// (`--collector.ebpf_tcp_peers.max-connections`). The hash maps are not
/// preallocated (an entry's memory, about 150 bytes, comes and goes with
/// it), but their bucket arrays are: 16 bytes per possible entry.
pub const MAX_SOCKS: u32 = 16384;
/// Distinct (cgroup, peer) pairs with counts in the kernel at once: those
/// active within one scrape interval (idle ones move to user space).
pub const MAX_PEERS: u32 = 4096;
/// Distinct (cgroup, peer, latency bucket) triples at once.
pub const MAX_LAT: u32 = 8192;
/// Cgroups with keys in the maps at once (each holds one at least in
/// [`STATS`], or a followed socket): the ledger's size.
pub const MAX_CGROUPS: u32 = MAX_PEERS;
/// One cgroup follows at most this share of the connections followed
/// (`1/4` of `--collector.ebpf_tcp_peers.max-connections`): more than the
/// eighth of the other maps, for the servers that hold many.
pub const SOCKS_SHARE: u32 = 4;

/// `DROPPED` entries: a connection not followed (`SOCKS` full), counts of
/// a peer not recorded (`STATS` full), a latency not recorded (`LAT` full).
pub const DROP_SOCKS: u32 = 0;
pub const DROP_STATS: u32 = 1;
pub const DROP_LAT: u32 = 2;
pub const NUM_DROPS: u32 = 3;

/// [`PeerKey::dir`]: a connection this cgroup's socket opened (the port is
/// the remote one), or one it accepted (the port is the local, listening one).
pub const DIR_OUT: u8 = 0;
pub const DIR_IN: u8 = 1;

/// Who talked to whom: the cgroup v2 id of the socket (0 when attribution
/// is off), the remote address (IPv4 as `::ffff:a.b.c.d`), the port, the
/// direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey {
    pub cgroup: u64,
    pub addr: [u8; 16],
    pub port: u16,
    pub dir: u8,
    pub pad: [u8; 5],
}

impl PeerKey {
    /// The cgroup's *other* record for direction `dir`: the peers it has no
    /// record of their own for (beyond its limit, `crate::ledger`), summed.
    /// Its address, all ones, is a multicast one no TCP socket connects to,
    /// and its port 0, which no DNS key has (53).
    #[inline(always)]
    pub const fn other(cgroup: u64, dir: u8) -> PeerKey {
        PeerKey { cgroup, addr: [0xff; 16], port: 0, dir, pad: [0; 5] }
    }

    #[inline(always)]
    pub fn is_other(&self) -> bool {
        self.port == 0 && self.addr == [0xff; 16]
    }
}

/// One native bucket of a peer's connect latency.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LatKey {
    pub peer: PeerKey,
    /// `native_bucket(ns)`: the native index is `slot + NATIVE_OFFSET`.
    pub slot: u32,
    pub pad: u32,
}

/// A followed connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// The record its counts go to: its peer's, or its cgroup's other
    /// ([`PeerKey::other`]) when it had no room for its peer's.
    pub peer: PeerKey,
    /// When it entered SYN_SENT (active opens).
    pub start_ns: u64,
    /// `tcp_sock.bytes_acked`, `bytes_received` and `total_retrans` when it
    /// was last counted (established: the handshake's SYNs are not
    /// payload; then each sweep, less a FIN already in them), exchanged
    /// atomically by the sweep and the close, so that each byte is counted
    /// once.
    pub base_acked: u64,
    pub base_received: u64,
    /// A u64 for its atomic exchange (BPF has none of 32 bits before v3).
    pub base_retrans: u64,
    /// [`ESTABLISHED_FLAG`] once established; [`BATON_FLAG`] once its
    /// baton is made (kernels without the atomic exchange).
    pub flags: u32,
    pub pad: u32,
    /// The values a sweep is about to count up to, written before it takes
    /// the baton (kernels without the atomic exchange: [`BATON`]); unused
    /// with the exchange.
    pub prop_acked: u64,
    pub prop_received: u64,
    pub prop_retrans: u64,
}

pub const ESTABLISHED_FLAG: u32 = 1;
pub const BATON_FLAG: u32 = 2;

/// On kernels without BPF's atomic exchange (before Linux 5.12): socket
/// address to [`BATON_FREE`] or [`BATON_TOMB`], the token the sweep and the
/// close pass so that each byte is counted once (`agent-ebpf`'s
/// `tcp_peers.rs` gives the argument). Sized as [`SOCKS`]; one entry where
/// the exchange serves.
pub const BATON: &str = "TCP_PEER_BATON";
/// The baton is there for a sweep to take.
pub const BATON_FREE: u64 = 0;
/// The close ran while a sweep held the baton: that sweep's counts stand.
pub const BATON_TOMB: u64 = 1;

/// Counters of one (cgroup, peer), u64 words added to atomically (named
/// below for this probe, and by `dns` for its own).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounters {
    pub words: [u64; NUM_WORDS],
}

/// Words of [`PeerCounters`]: connects started (SYN sent); their results:
/// established, refused (a reset answered the SYN), timed out, unreachable
/// (ICMP), reset, aborted (closed by the application while connecting),
/// other; connections accepted (established from SYN received); connections
/// closed after being established; payload bytes the peer acknowledged,
/// payload bytes received; segments retransmitted; the sum of connect
/// latencies in this record's buckets ([`LAT`]) and their count
/// ([`TIMED`]); the followed connections open ([`OPEN`]).
pub const ATTEMPTS: usize = 0;
pub const ESTABLISHED: usize = 1;
pub const REFUSED: usize = 2;
pub const TIMEOUT: usize = 3;
pub const UNREACHABLE: usize = 4;
pub const RESET: usize = 5;
pub const ABORTED: usize = 6;
pub const OTHER: usize = 7;
pub const ACCEPTED: usize = 8;
pub const CLOSED: usize = 9;
pub const BYTES_SENT: usize = 10;
pub const BYTES_RECEIVED: usize = 11;
pub const RETRANSMITS: usize = 12;
pub const LATENCY_NS: usize = 13;
/// Followed connections open: one more when a connection the program
/// follows ([`SOCKS`]) is established or accepted, one less (a wrapping
/// add) when it closes, both in the record its state names
/// ([`SockState::peer`]), so the close is counted where the open was. The
/// agent never deletes a record holding open connections.
pub const OPEN: usize = 14;
/// Connect latencies in this record's buckets: [`ESTABLISHED`] less those
/// counted in the cgroup's other's buckets (its peers' buckets beyond its
/// limit) or not at all (the latency map full).
pub const TIMED: usize = 15;
/// (`dns` uses words 14 and 15 for its own.)
pub const NUM_WORDS: usize = 16;

impl PeerCounters {
    pub const ZERO: PeerCounters = PeerCounters { words: [0; NUM_WORDS] };
}

/// The result word of a connect that went from SYN_SENT to CLOSE, from the
/// socket's `sk_err` (or, when 0, `sk_err_soft`: ICMP errors).
#[inline(always)]
pub fn failure(sk_err: i32, sk_err_soft: i32) -> usize {
    let e = if sk_err != 0 { sk_err } else { sk_err_soft };
    match e {
        0 => ABORTED,
        ECONNREFUSED => REFUSED,
        ETIMEDOUT => TIMEOUT,
        EHOSTUNREACH | ENETUNREACH => UNREACHABLE,
        ECONNRESET => RESET,
        _ => OTHER,
    }
}

pub const ENETUNREACH: i32 = 101;
pub const ECONNRESET: i32 = 104;
pub const ETIMEDOUT: i32 = 110;
pub const ECONNREFUSED: i32 = 111;
pub const EHOSTUNREACH: i32 = 113;

/// TCP states (include/net/tcp_states.h) the program tells apart.
pub const TCP_ESTABLISHED: i32 = 1;
pub const TCP_SYN_SENT: i32 = 2;
pub const TCP_SYN_RECV: i32 = 3;
pub const TCP_FIN_WAIT1: i32 = 4;
pub const TCP_FIN_WAIT2: i32 = 5;
pub const TCP_CLOSE: i32 = 7;
pub const TCP_LAST_ACK: i32 = 9;
pub const TCP_CLOSING: i32 = 11;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// The payload of a connection closing from state `old`: `acked` and
/// `received` are the growth of `bytes_acked` and `bytes_received` since it
/// was established, which count the FINs too (they take one sequence
/// number each). Our FIN was acknowledged when the socket closes from
/// FIN_WAIT2, CLOSING or LAST_ACK with nothing left unacknowledged
/// (`snd_una == write_seq`, the FIN included); the peer's FIN was received
/// when the socket has `SOCK_DONE` (set by `tcp_fin` alone).
#[inline(always)]
pub fn payload(acked: u64, received: u64, old: i32, all_acked: bool, peer_fin: bool) -> (u64, u64) {
    let our_fin = all_acked && (old == TCP_FIN_WAIT2 || old == TCP_CLOSING || old == TCP_LAST_ACK);
    (acked.saturating_sub(our_fin as u64), received.saturating_sub(peer_fin as u64))
}

/// Where the program reads, from the kernel's BTF; `attribute` is 0 when
/// sockets are not attributed to cgroups (every count under cgroup 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub attribute: u32,
    pub sk_protocol: u32,
    pub skc_family: u32,
    pub skc_daddr: u32,
    pub skc_dport: u32,
    pub skc_num: u32,
    pub skc_v6_daddr: u32,
    pub skc_state: u32,
    pub sk_err: u32,
    pub sk_err_soft: u32,
    /// `sock.sk_flags` and the bit of `SOCK_DONE` in it.
    pub sk_flags: u32,
    pub sock_done_bit: u32,
    /// `sock.sk_cgrp_data.cgroup` (before Linux 5.15, `sock.sk_cgrp_data`,
    /// whose first word is the pointer), `cgroup.kn`, `kernfs_node.id`.
    pub sock_cgroup: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    /// `tcp_sock` members.
    pub bytes_acked: u32,
    pub bytes_received: u32,
    pub total_retrans: u32,
    pub snd_una: u32,
    pub write_seq: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets {
        attribute: 0,
        sk_protocol: 0,
        skc_family: 0,
        skc_daddr: 0,
        skc_dport: 0,
        skc_num: 0,
        skc_v6_daddr: 0,
        skc_state: 0,
        sk_err: 0,
        sk_err_soft: 0,
        sk_flags: 0,
        sock_done_bit: 0,
        sock_cgroup: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        bytes_acked: 0,
        bytes_received: 0,
        total_retrans: 0,
        snd_una: 0,
        write_seq: 0,
    };
}

crate::pod!(PeerKey, LatKey, SockState, PeerCounters, Offsets);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<PeerKey>(), 32);
        assert_eq!(core::mem::size_of::<LatKey>(), 40);
        assert_eq!(core::mem::size_of::<SockState>(), 96);
        assert_eq!(core::mem::size_of::<PeerCounters>(), 8 * NUM_WORDS);
    }

    #[test]
    fn other_records_are_no_peers() {
        let o = PeerKey::other(7, DIR_IN);
        assert!(o.is_other());
        assert_eq!((o.cgroup, o.dir), (7, DIR_IN));
        let mut v4 = PeerKey { cgroup: 7, addr: [0; 16], port: 80, dir: DIR_OUT, pad: [0; 5] };
        v4.addr[10..].copy_from_slice(&[0xff, 0xff, 255, 255, 255, 255]);
        assert!(!v4.is_other(), "255.255.255.255");
        let mut dns = o;
        dns.port = 53;
        assert!(!dns.is_other());
        assert!(!PeerKey::default().is_other());
    }

    #[test]
    fn failures_by_errno() {
        assert_eq!(failure(ECONNREFUSED, 0), REFUSED);
        assert_eq!(failure(ETIMEDOUT, 0), TIMEOUT);
        assert_eq!(failure(ETIMEDOUT, EHOSTUNREACH), TIMEOUT);
        assert_eq!(failure(0, EHOSTUNREACH), UNREACHABLE);
        assert_eq!(failure(0, ENETUNREACH), UNREACHABLE);
        assert_eq!(failure(ECONNRESET, 0), RESET);
        assert_eq!(failure(0, 0), ABORTED);
        assert_eq!(failure(22, 0), OTHER);
    }

    #[test]
    fn fins_are_not_payload() {
        // We closed first: FIN_WAIT2 -> CLOSE when the peer's FIN came.
        assert_eq!(payload(101, 51, TCP_FIN_WAIT2, true, true), (100, 50));
        // The peer closed first: LAST_ACK -> CLOSE when our FIN was acked.
        assert_eq!(payload(101, 51, TCP_LAST_ACK, true, true), (100, 50));
        // LAST_ACK ended by a reset: our FIN never acknowledged.
        assert_eq!(payload(100, 51, TCP_LAST_ACK, false, true), (100, 50));
        // Reset while established.
        assert_eq!(payload(100, 50, TCP_ESTABLISHED, true, false), (100, 50));
        assert_eq!(payload(0, 0, TCP_FIN_WAIT2, true, true), (0, 0));
    }
}
