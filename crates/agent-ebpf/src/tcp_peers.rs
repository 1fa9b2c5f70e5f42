//! `ebpf_tcp_peers`: on the raw inet_sock_set_state tracepoint, each TCP
//! connection counted for the cgroup of its socket and its peer: connects
//! started (CLOSE to SYN_SENT), their results (SYN_SENT to ESTABLISHED,
//! with the latency, or to CLOSE, with the reason from `sk_err`),
//! connections accepted (SYN_RECV to ESTABLISHED), and at close (any state
//! to CLOSE) the payload bytes and retransmits of its life. The socket
//! carries the cgroup of the task that made it (an accepted one, the
//! listener's), so counts go to the right cgroup though state changes run
//! in softirq.

use core::intrinsics::{atomic_xchg, AtomicOrdering};
use core::ptr::{read_volatile, write_volatile};

use agent_common::ledger::{Entries, Limits, AUX};
use agent_common::tcp_latency::IPPROTO_TCP;
use agent_common::tcp_peers::{
    failure, payload, LatKey, Offsets, PeerCounters, PeerKey, SockState, ACCEPTED, AF_INET, AF_INET6, ATTEMPTS, BATON_FLAG, BATON_FREE,
    BATON_TOMB, BYTES_RECEIVED, BYTES_SENT, CLOSED, DIR_IN, DIR_OUT, DROP_LAT, DROP_SOCKS, DROP_STATS, ESTABLISHED, ESTABLISHED_FLAG,
    MAX_CGROUPS, MAX_LAT, MAX_PEERS, MAX_SOCKS, NUM_DROPS, OPEN, RETRANSMITS, SWEEP_BATCH, TCP_CLOSE, TCP_ESTABLISHED, TCP_FIN_WAIT2,
    TCP_SYN_RECV, TCP_SYN_SENT, TIMED,
};
use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::RawTracePointContext,
    Global,
};

use crate::helpers::{inc, now_ns, read_kernel, BPF_F_NO_PREALLOC};
use crate::peer_maps::{self, add, Ledger};

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static TCP_PEERS_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

// SAFETY: as above; the agent sets it from the maps' sizes.
#[unsafe(no_mangle)]
static TCP_PEERS_LIMITS: Global<Limits> = Global::new(Limits::UNBOUNDED);

/// Connections followed, by socket. An entry is made when a connect starts
/// or a connection is accepted, and removed when the socket closes (every
/// socket ends in CLOSE). Not preallocated, as the maps below: their
/// memory follows the connections, peers and cgroups there are.
#[map]
static TCP_PEER_SOCKS: HashMap<u64, SockState> = HashMap::with_max_entries(MAX_SOCKS, BPF_F_NO_PREALLOC);
#[map]
static TCP_PEER_STATS: HashMap<PeerKey, PeerCounters> = HashMap::with_max_entries(MAX_PEERS, BPF_F_NO_PREALLOC);
#[map]
static TCP_PEER_LAT: HashMap<LatKey, u64> = HashMap::with_max_entries(MAX_LAT, BPF_F_NO_PREALLOC);
#[map]
static TCP_PEER_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(NUM_DROPS, 0);
/// The ledger of the three maps' keys by cgroup (`agent_common::ledger`):
/// sockets followed are counted here when followed, and again when they
/// close (freed); the other two maps' keys as made (the agent deletes
/// them).
#[map]
static TCP_PEER_MADE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static TCP_PEER_GONE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
/// Kernels without BPF's atomic exchange (before Linux 5.12): each
/// established socket's baton (`BATON_FREE`, or the close's `BATON_TOMB`),
/// see [`sweep_baton`]. Sized as the sockets' map by the agent, one entry
/// where the exchange serves.
#[map]
static TCP_PEER_BATON: HashMap<u64, u64> = HashMap::with_max_entries(MAX_SOCKS, BPF_F_NO_PREALLOC);

/// BPF_NOEXIST: fails if the key is there.
const NOEXIST: u64 = 1;
/// BPF_ANY.
const ANY: u64 = 0;

static LEDGER: Ledger = Ledger { made: &TCP_PEER_MADE, gone: &TCP_PEER_GONE };

/// The counters `peer`'s events go to and their key: its own record, or
/// (beyond its cgroup's limit) its cgroup's other.
#[inline(always)]
fn counters(peer: &PeerKey) -> Option<(*mut PeerCounters, PeerKey)> {
    peer_maps::counters(&TCP_PEER_STATS, &LEDGER, &TCP_PEERS_LIMITS.load(), peer, &TCP_PEER_DROPPED, DROP_STATS)
}

/// The socket's peer: its cgroup v2 id (0 without attribution), remote
/// address, and `port` (the remote one out, the local one in).
#[inline(always)]
fn peer_of(sk: u64, off: &Offsets, dir: u8) -> Option<PeerKey> {
    let family: u16 = read_kernel(sk, off.skc_family)?;
    let mut addr = [0u8; 16];
    if family == AF_INET {
        let v4: [u8; 4] = read_kernel(sk, off.skc_daddr)?;
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12] = v4[0];
        addr[13] = v4[1];
        addr[14] = v4[2];
        addr[15] = v4[3];
    } else if family == AF_INET6 {
        addr = read_kernel(sk, off.skc_v6_daddr)?;
    } else {
        return None;
    }
    let port = if dir == DIR_OUT {
        // skc_dport is in network order, skc_num in host order.
        u16::from_be(read_kernel::<u16>(sk, off.skc_dport)?)
    } else {
        read_kernel::<u16>(sk, off.skc_num)?
    };
    let mut cgroup = 0;
    if off.attribute != 0 {
        let cg: u64 = read_kernel(sk, off.sock_cgroup).unwrap_or(0);
        // Before Linux 5.15 the word may hold net_prio's and net_cls's data
        // instead, its low bits set (a cgroup pointer is aligned): no cgroup.
        let cg = if cg & 3 == 0 { cg } else { 0 };
        let kn: u64 = read_kernel(cg, off.cgroup_kn).unwrap_or(0);
        cgroup = read_kernel(kn, off.kernfs_node_id).unwrap_or(0);
    }
    Some(PeerKey { cgroup, addr, port, dir, pad: [0; 5] })
}

/// Follows a connection from now, if its cgroup follows fewer than its
/// limit and the map has room: whether it is followed (if not, counted as
/// dropped).
#[inline(always)]
fn follow(sk: u64, st: SockState) -> bool {
    let Some(r) = LEDGER.room(st.peer.cgroup, AUX, TCP_PEERS_LIMITS.load().aux) else {
        inc(&TCP_PEER_DROPPED, DROP_SOCKS);
        return false;
    };
    // A socket still followed from a life the program did not see end (it
    // always does: every socket ends in CLOSE) is counted out of its cgroup.
    if let Some(old) = TCP_PEER_SOCKS.get_ptr(sk) {
        // SAFETY: a copy of a map value's cgroup.
        unfollowed(unsafe { (*old).peer.cgroup });
    }
    if TCP_PEER_SOCKS.insert(sk, st, 0).is_err() {
        inc(&TCP_PEER_DROPPED, DROP_SOCKS);
        return false;
    }
    Ledger::count(r, AUX, 1);
    true
}

/// A followed socket is no longer: one fewer for its cgroup.
#[inline(always)]
fn unfollowed(cgroup: u64) {
    LEDGER.free(cgroup, AUX);
}

/// Stops following a connection (closed, or with no record to count it in).
#[inline(always)]
fn unfollow(sk: u64, cgroup: u64) {
    if TCP_PEER_SOCKS.remove(sk).is_ok() {
        unfollowed(cgroup);
    }
}

/// The counters a connection starts from when established; without the
/// atomic exchange, its baton too (made before its entry says so).
#[inline(always)]
fn baseline<const XCHG: bool>(sk: u64, off: &Offsets, st: &mut SockState) {
    st.base_acked = read_kernel(sk, off.bytes_acked).unwrap_or(0);
    st.base_received = read_kernel(sk, off.bytes_received).unwrap_or(0);
    st.base_retrans = read_kernel::<u32>(sk, off.total_retrans).unwrap_or(0) as u64;
    st.flags |= ESTABLISHED_FLAG;
    // BPF_ANY: a baton left by a socket that had this address before (none
    // is: the close or a sweep removes it) is replaced.
    if !XCHG && TCP_PEER_BATON.insert(sk, BATON_FREE, ANY).is_ok() {
        st.flags |= BATON_FLAG;
    }
}

/// A connect's latency, in the buckets of the record it was counted in
/// (or, beyond its cgroup's limit, its other's), with their count (TIMED).
#[inline(always)]
fn latency(c: *mut PeerCounters, at: &PeerKey, ns: u64) {
    let others = |k: &mut PeerKey| {
        let (c, o) = counters(&peer_maps::other_key(k.cgroup, k.dir))?;
        *k = o;
        Some(c)
    };
    let mut key = LatKey { peer: *at, slot: 0, pad: 0 };
    let limits = TCP_PEERS_LIMITS.load();
    peer_maps::latency(others, &TCP_PEER_LAT, &LEDGER, &limits, c, &mut key, TIMED, ns, &TCP_PEER_DROPPED, DROP_LAT);
}

/// Exchanges the last counted value at `p` for `v`: the old one. The sweep
/// and the close may count one socket at once; each delta goes to one.
#[inline(always)]
fn swap64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: `p` points into a map value, aligned for u64.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::Relaxed }>(p, v) }
}

/// Kernels without BPF's atomic exchange (before Linux 5.12; it came with
/// BPF_XCHG): the sweep and the close of a socket pass a baton instead, its
/// entry in `TCP_PEER_BATON`, there (`BATON_FREE`) while no sweep holds it.
/// Taking it is deleting it, which succeeds for one deleter only (the hash
/// map's bucket lock); every map operation on it is ordered by that lock,
/// and so are the plain writes before it and reads after it. The sweeps of
/// a socket are serial (the agent runs them from one thread); the close
/// runs once, maybe on another CPU, maybe in softirq inside a sweep on the
/// same CPU, so it never waits. The values counted so far (`base_*`) are
/// written only by a sweep holding the baton (and when established).
///
/// A sweep ([`sweep_baton`]): reads the socket's counters `v`; writes them
/// as its proposal (`prop_*`); takes the baton (fails: the close has it,
/// and counts everything; the sweep counts nothing); counts `v - base` and
/// sets `base = v`; gives the baton back with BPF_NOEXIST (fails: the close
/// put its tombstone there meanwhile, see below; the sweep removes it).
///
/// The close ([`close_baton`]) counts from the value it returns:
/// - it takes the baton: no sweep holds it, every sweep before has set
///   `base` before giving it back, and no sweep after can take it: `base`;
/// - else a sweep holds it (it has written its proposal before taking it,
///   and counts up to it, whatever happens next): the close puts its
///   tombstone in the baton's place (BPF_NOEXIST, succeeding while that
///   sweep holds it) and counts from that sweep's proposal; the next sweep
///   finds no free baton;
/// - the tombstone fails too: that sweep gave the baton back meanwhile,
///   with `base` set: the close tries again. A third try would need a
///   second sweep of this socket during one close (sweeps of a socket are
///   a sweep interval apart, at least 1s, and a close runs with preemption
///   off): after two, `base`.
///
/// So each byte is counted by exactly one of them, whichever comes first,
/// as with the exchange. The sweep leaves the baton alone when nothing was
/// sent or received since `base` (which only it writes).
#[inline(always)]
fn close_baton(sk: u64, p: *mut SockState) -> (u64, u64, u64) {
    // SAFETY: `p` is this socket's entry; its flags change only when made.
    if unsafe { (*p).flags } & BATON_FLAG != 0 {
        for _ in 0..2 {
            if TCP_PEER_BATON.remove(sk).is_ok() {
                return counted(p);
            }
            if TCP_PEER_BATON.insert(sk, BATON_TOMB, NOEXIST).is_ok() {
                return proposed(p);
            }
        }
    }
    counted(p)
}

/// A sweep's side of the baton ([`close_baton`]): the values counted so far,
/// `base` now set to `v`; None when the sweep must count nothing.
#[inline(always)]
fn sweep_baton(sk: u64, p: *mut SockState, flags: u32, v: (u64, u64, u64)) -> Option<(u64, u64, u64)> {
    if flags & BATON_FLAG == 0 {
        return None;
    }
    // Only sweeps write `base`: nothing to count, nothing to pass.
    if counted(p) == v {
        return None;
    }
    // SAFETY: a copy of the baton's value.
    if unsafe { TCP_PEER_BATON.get(sk) }.copied() != Some(BATON_FREE) {
        return None;
    }
    // SAFETY: `p` is the socket's entry; these words are written by sweeps
    // only, which are serial.
    unsafe {
        write_volatile(&raw mut (*p).prop_acked, v.0);
        write_volatile(&raw mut (*p).prop_received, v.1);
        write_volatile(&raw mut (*p).prop_retrans, v.2);
    }
    TCP_PEER_BATON.remove(sk).ok()?;
    let base = counted(p);
    // SAFETY: as above; the baton held.
    unsafe {
        write_volatile(&raw mut (*p).base_acked, v.0);
        write_volatile(&raw mut (*p).base_received, v.1);
        write_volatile(&raw mut (*p).base_retrans, v.2);
    }
    if TCP_PEER_BATON.insert(sk, BATON_FREE, NOEXIST).is_err() {
        // The close's tombstone: it counted from our proposal.
        let _ = TCP_PEER_BATON.remove(sk);
    }
    Some(base)
}

/// The values the socket was counted up to (`base_*`).
#[inline(always)]
fn counted(p: *mut SockState) -> (u64, u64, u64) {
    // SAFETY: `p` is a socket's entry, aligned.
    unsafe {
        (
            read_volatile(&raw const (*p).base_acked),
            read_volatile(&raw const (*p).base_received),
            read_volatile(&raw const (*p).base_retrans),
        )
    }
}

/// A sweep's proposal (`prop_*`).
#[inline(always)]
fn proposed(p: *mut SockState) -> (u64, u64, u64) {
    // SAFETY: as in `counted`.
    unsafe {
        (
            read_volatile(&raw const (*p).prop_acked),
            read_volatile(&raw const (*p).prop_received),
            read_volatile(&raw const (*p).prop_retrans),
        )
    }
}

/// A followed connection closes: its payload and retransmits since it was
/// last counted (established, or the last sweep), in the record its open
/// was counted in (which the agent keeps while it holds open connections).
#[inline(always)]
fn closed<const XCHG: bool>(sk: u64, off: &Offsets, old: i32, p: *mut SockState, peer: &PeerKey) {
    let Some((c, _)) = counters(peer) else { return };
    add(c, CLOSED, 1);
    add(c, OPEN, u64::MAX);
    let acked: u64 = read_kernel(sk, off.bytes_acked).unwrap_or(0);
    let received: u64 = read_kernel(sk, off.bytes_received).unwrap_or(0);
    let retrans: u32 = read_kernel(sk, off.total_retrans).unwrap_or(0);
    let snd_una: u32 = read_kernel(sk, off.snd_una).unwrap_or(0);
    let write_seq: u32 = read_kernel(sk, off.write_seq).unwrap_or(1);
    let flags: u64 = read_kernel(sk, off.sk_flags).unwrap_or(0);
    let peer_fin = (flags >> (off.sock_done_bit & 63)) & 1 == 1;
    let (base_acked, base_received, base_retrans) =
        if XCHG { swap_bases(p, (acked, received, retrans as u64)) } else { close_baton(sk, p) };
    let (sent, got) =
        payload(acked.saturating_sub(base_acked), received.saturating_sub(base_received), old, snd_una == write_seq, peer_fin);
    add(c, BYTES_SENT, sent);
    add(c, BYTES_RECEIVED, got);
    add(c, RETRANSMITS, (retrans as u64).saturating_sub(base_retrans));
}

/// The entry's bases exchanged for `now` (acked, received, retransmits):
/// what was counted up to, atomically (Linux >= 5.12).
#[inline(always)]
fn swap_bases(p: *mut SockState, now: (u64, u64, u64)) -> (u64, u64, u64) {
    // SAFETY: `p` is the socket's entry, which stays until its socket
    // closes (the close deletes it after its own exchange).
    unsafe {
        (swap64(&raw mut (*p).base_acked, now.0), swap64(&raw mut (*p).base_received, now.1), swap64(&raw mut (*p).base_retrans, now.2))
    }
}

/// Counts an open connection's payload and retransmits since it was last
/// counted. The counters are read before the state and the flags: a FIN
/// acknowledged or received meanwhile makes this count one byte short,
/// which the next sweep or the close makes up (never one too many).
#[inline(always)]
fn sweep_one<const XCHG: bool>(sk: u64, off: &Offsets) {
    let Some(p) = TCP_PEER_SOCKS.get_ptr_mut(sk) else { return };
    // SAFETY: a copy of the entry's peer and flags, which only change when
    // it is made.
    let (peer, flags) = unsafe { ((*p).peer, (*p).flags) };
    if flags & ESTABLISHED_FLAG == 0 {
        return;
    }
    let (Some(acked), Some(received), Some(retrans)) =
        (read_kernel::<u64>(sk, off.bytes_acked), read_kernel::<u64>(sk, off.bytes_received), read_kernel::<u32>(sk, off.total_retrans))
    else {
        return;
    };
    let state = read_kernel::<u8>(sk, off.skc_state).unwrap_or(0) as i32;
    if state == TCP_CLOSE {
        return;
    }
    let sk_flags: u64 = read_kernel(sk, off.sk_flags).unwrap_or(0);
    let peer_fin = (sk_flags >> (off.sock_done_bit & 63)) & 1 == 1;
    // Our FIN is acknowledged in FIN_WAIT2 (from CLOSING and LAST_ACK an
    // acknowledgement closes the socket); the peer's came with SOCK_DONE.
    let acked = acked.saturating_sub((state == TCP_FIN_WAIT2) as u64);
    let received = received.saturating_sub(peer_fin as u64);
    let (base_acked, base_received, base_retrans) = if XCHG {
        swap_bases(p, (acked, received, retrans as u64))
    } else {
        let Some(b) = sweep_baton(sk, p, flags, (acked, received, retrans as u64)) else { return };
        b
    };
    let (sent, got, again) =
        (acked.saturating_sub(base_acked), received.saturating_sub(base_received), (retrans as u64).saturating_sub(base_retrans));
    if sent == 0 && got == 0 && again == 0 {
        // An idle connection leaves its record as it was.
        return;
    }
    let Some((c, _)) = counters(&peer) else { return };
    add(c, BYTES_SENT, sent);
    add(c, BYTES_RECEIVED, got);
    add(c, RETRANSMITS, again);
}

/// XCHG: the kernel has BPF's atomic exchange (Linux >= 5.12); else the
/// baton serves ([`close_baton`]).
#[inline(always)]
fn try_set_state<const XCHG: bool>(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)
    let sk: u64 = ctx.arg(0);
    let old = ctx.arg::<u64>(1) as i32;
    let new = ctx.arg::<u64>(2) as i32;
    let off = TCP_PEERS_OFFSETS.load();
    let proto: u16 = read_kernel(sk, off.sk_protocol).ok_or(0)?;
    if proto != IPPROTO_TCP {
        return Ok(());
    }
    if new == TCP_SYN_SENT {
        // connect(): the destination is set before SYN_SENT.
        let peer = peer_of(sk, &off, DIR_OUT).ok_or(0)?;
        let at = match counters(&peer) {
            Some((c, at)) => {
                add(c, ATTEMPTS, 1);
                at
            }
            None => peer,
        };
        follow(sk, SockState { peer: at, start_ns: now_ns(), ..SockState::default() });
        return Ok(());
    }
    if old == TCP_SYN_RECV && new == TCP_ESTABLISHED {
        let peer = peer_of(sk, &off, DIR_IN).ok_or(0)?;
        let (c, at) = counters(&peer).ok_or(0)?;
        add(c, ACCEPTED, 1);
        let mut st = SockState { peer: at, ..SockState::default() };
        baseline::<XCHG>(sk, &off, &mut st);
        // Open only if followed: the close of a connection not followed
        // is not seen.
        if follow(sk, st) {
            add(c, OPEN, 1);
        } else if st.flags & BATON_FLAG != 0 {
            let _ = TCP_PEER_BATON.remove(sk);
        }
        return Ok(());
    }
    if new != TCP_ESTABLISHED && new != TCP_CLOSE {
        return Ok(());
    }
    let Some(p) = TCP_PEER_SOCKS.get_ptr_mut(sk) else { return Ok(()) };
    // SAFETY: the entry is this socket's: its state changes are serialised
    // by the socket lock, so nothing else writes it meanwhile.
    let mut st = unsafe { *p };
    if old == TCP_SYN_SENT && new == TCP_ESTABLISHED {
        let ns = now_ns().saturating_sub(st.start_ns);
        // Its record, or its cgroup's other if it was folded out meanwhile
        // and there is no room to make it again.
        let Some((c, at)) = counters(&st.peer) else {
            unfollow(sk, st.peer.cgroup);
            return Ok(());
        };
        add(c, ESTABLISHED, 1);
        add(c, OPEN, 1);
        latency(c, &at, ns);
        st.peer = at;
        baseline::<XCHG>(sk, &off, &mut st);
        // SAFETY: as above.
        unsafe { *p = st };
        return Ok(());
    }
    if new == TCP_CLOSE {
        if old == TCP_SYN_SENT {
            let err: i32 = read_kernel(sk, off.sk_err).unwrap_or(0);
            let soft: i32 = read_kernel(sk, off.sk_err_soft).unwrap_or(0);
            if let Some((c, _)) = counters(&st.peer) {
                add(c, failure(err, soft), 1);
            }
        } else if st.flags & ESTABLISHED_FLAG != 0 {
            closed::<XCHG>(sk, &off, old, p, &st.peer);
        }
        unfollow(sk, st.peer.cgroup);
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn tcp_peers_set_state(ctx: RawTracePointContext) -> i32 {
    let _ = try_set_state::<true>(&ctx);
    0
}

/// `tcp_peers_set_state` for kernels without BPF's atomic exchange (the
/// verifier refuses an object's function with one before Linux 5.12,
/// reached or not): the agent loads this one in its place there.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn tcp_peers_set_state_baton(ctx: RawTracePointContext) -> i32 {
    let _ = try_set_state::<false>(&ctx);
    0
}

/// Never attached: the agent runs it with up to SWEEP_BATCH followed
/// sockets' addresses as arguments (0 for none).
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn tcp_peers_sweep(ctx: RawTracePointContext) -> i32 {
    try_sweep::<true>(&ctx);
    0
}

/// `tcp_peers_sweep` for kernels without the atomic exchange.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn tcp_peers_sweep_baton(ctx: RawTracePointContext) -> i32 {
    try_sweep::<false>(&ctx);
    0
}

#[inline(always)]
fn try_sweep<const XCHG: bool>(ctx: &RawTracePointContext) {
    let off = TCP_PEERS_OFFSETS.load();
    // One read per argument at a constant offset: the verifier refuses a
    // context read at a computed one.
    macro_rules! each {
        ($($i:literal)*) => {
            $(
                let sk: u64 = ctx.arg($i);
                if sk != 0 {
                    sweep_one::<XCHG>(sk, &off);
                }
            )*
        };
    }
    each!(0 1 2 3 4 5 6 7 8 9 10 11);
}
const _: () = assert!(SWEEP_BATCH == 12);
