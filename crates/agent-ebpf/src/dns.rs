//! `ebpf_dns`: two cgroup socket-buffer programs on the cgroup v2 root,
//! which every socket of the node passes, and two cgroup socket-address
//! programs beside them. Egress: a UDP datagram to port 53, or a message
//! of a followed TCP connection to port 53, that is a DNS query is counted
//! by type for its socket's cgroup, server and transport, and waits in
//! `DNS_PENDING` by (socket, server, id). Ingress: one from port 53 that
//! is a DNS response is counted by rcode; the query waiting with its id on
//! that socket for that server gives the latency, and its entry is deleted
//! (the agent deletes the ones waiting longer than the timeout, as
//! timeouts: whoever deletes it first counts it). All four always let the
//! call or the packet through.
//!
//! The server is the address the socket asked for, not the packet's
//! destination, which NAT below the socket may have rewritten (kube-proxy's
//! DNAT of a ClusterIP in nat OUTPUT, for host-network sockets, happens
//! before the cgroup egress hook; the answer is rewritten back before the
//! ingress hook): a connected socket's own destination, an unconnected
//! one's address given to sendmsg (`dns_sendmsg4`, `dns_sendmsg6`, which
//! see it before any NAT, keep it in `DNS_SENT`).
//!
//! TCP: a connection to port 53 is followed from its SYN (`DNS_CONNS`, by
//! socket): the sequence number where its next query starts, and from the
//! SYN-ACK where its next answer starts; a segment is read only where it
//! covers the next message's start, which then moves on by the message's
//! two-byte length, so that an answer of many segments is read once, at
//! its start, several messages in one segment (pipelining, super-segments)
//! each, and a retransmitted segment or one ahead of a lost one not again.
//! A connection whose SYN was not seen is not read. Its entry goes at a
//! RST, or once FINs went both ways (the agent forgets connections idle for
//! `CONN_IDLE_NS`).
//!
//! One cgroup holds at most `PENDING_PER_CGROUP` waiting queries and
//! `CONNS_PER_CGROUP` followed connections (`DNS_INFLIGHT`, less what the
//! agent deleted, `DNS_REAPED`), so that no cgroup can fill the node's
//! maps for the others.

// Map keys and values are passed by reference: by value, each call would
// copy them on the BPF stack, whose 512 bytes a call chain shares.
#![allow(clippy::needless_borrows_for_generic_args)]

use core::intrinsics::{atomic_xadd, AtomicOrdering};
use core::ptr::{addr_of, read_volatile};

use agent_common::dns::{
    failing, qtype_word, rcode_word, Config, Conn, InFlight, NameKey, Pending, PendingKey, Reaped, Sent, Stream, CONNS_PER_CGROUP,
    DROP_CONNS, DROP_LAT, DROP_NAMES, DROP_PENDING, DROP_STATS, DROP_STREAM, FLAG_QR, FLAG_TC, LATE, MATCHED, MAX_CGROUPS,
    MAX_CONNS, MAX_LABELS, MAX_LAT, MAX_MESSAGES, MAX_NAMES, MAX_PENDING, MAX_SENT, MAX_SERVERS, MAX_SKIPPED, NAME_BYTES, NUM_DROPS,
    PENDING_ALIAS, PENDING_PER_CGROUP, PENDING_QUERY, PENDING_WITH_ALIAS, PORT, RCODE_MASK, RETRANSMITS, STAGE_LEN, STAGE_LEN_LOW,
    STAGE_LOST, STAGE_MESSAGE, STAGE_UNKNOWN, TRANSPORT_TCP, TRANSPORT_UDP, TRUNCATED,
};
use agent_common::ledger::{Entries, Limits, AUX};
use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};
use aya_ebpf::{
    bindings::{__sk_buff, bpf_sock},
    macros::{cgroup_skb, cgroup_sock_addr, map},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{SkBuffContext, SockAddrContext},
    EbpfContext, Global,
};

use crate::helpers::{inc, now_ns, BPF_F_NO_PREALLOC};
use crate::peer_maps::{self, add, Ledger};

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static DNS_CONFIG: Global<Config> = Global::new(Config::DEFAULT);

// SAFETY: as above; the agent sets it from the maps' sizes.
#[unsafe(no_mangle)]
static DNS_LIMITS: Global<Limits> = Global::new(Limits::UNBOUNDED);

#[map]
static DNS_PENDING: HashMap<PendingKey, Pending> = HashMap::with_max_entries(MAX_PENDING, BPF_F_NO_PREALLOC);
#[map]
static DNS_STATS: HashMap<PeerKey, PeerCounters> = HashMap::with_max_entries(MAX_SERVERS, BPF_F_NO_PREALLOC);
#[map]
static DNS_LAT: HashMap<LatKey, u64> = HashMap::with_max_entries(MAX_LAT, BPF_F_NO_PREALLOC);
#[map]
static DNS_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(NUM_DROPS, 0);
#[map]
static DNS_NAMES: HashMap<NameKey, u64> = HashMap::with_max_entries(MAX_NAMES, BPF_F_NO_PREALLOC);
#[map]
static DNS_NAME_SCRATCH: PerCpuArray<NameKey> = PerCpuArray::with_max_entries(1, 0);
/// The ledger of the keys of DNS_STATS, DNS_LAT and DNS_NAMES by cgroup
/// (`agent_common::ledger`).
#[map]
static DNS_MADE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static DNS_GONE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);

static LEDGER: Ledger = Ledger { made: &DNS_MADE, gone: &DNS_GONE };
#[map]
static DNS_CONNS: HashMap<u64, Conn> = HashMap::with_max_entries(MAX_CONNS, BPF_F_NO_PREALLOC);
#[map]
static DNS_INFLIGHT: HashMap<u64, InFlight> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static DNS_REAPED: HashMap<u64, Reaped> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static DNS_SENT: LruHashMap<u64, Sent> = LruHashMap::with_max_entries(MAX_SENT, 0);
/// Per-CPU scratch of a response's keys (beside the TCP walk's frame, a
/// response's own would not fit the 512 bytes of stack).
#[map]
static DNS_IN_SCRATCH: PerCpuArray<InScratch> = PerCpuArray::with_max_entries(1, 0);

/// A response's lookup key, the key of its query's other entry, and what it
/// is counted under.
#[repr(C)]
struct InScratch {
    key: PendingKey,
    alias: PendingKey,
    peer: PeerKey,
}

const IPPROTO_UDP: u8 = 17;
const IPPROTO_TCP: u8 = 6;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
/// BPF_NOEXIST: insert only if absent.
const NOEXIST: u64 = 1;
/// The packet (or the call) goes through (a cgroup program returning 0
/// would drop it, or fail the call with EPERM).
const PASS: i32 = 1;

/// A zeroed per-cgroup record in read-only data, to create entries with.
static NO_INFLIGHT: InFlight = InFlight { pending_added: 0, pending_removed: 0, conns_added: 0, conns_removed: 0 };

/// The counters `peer`'s events go to and their key: its own record, or
/// (beyond its cgroup's limit) its cgroup's other.
#[inline(always)]
fn counters(peer: &PeerKey) -> Option<(*mut PeerCounters, PeerKey)> {
    peer_maps::counters(&DNS_STATS, &LEDGER, &DNS_LIMITS.load(), peer, &DNS_DROPPED, DROP_STATS)
}

/// A matched response's latency, in the buckets of the record `c` (key
/// `at`) or, beyond its cgroup's limit, its other's, with their count
/// (MATCHED) and sum.
#[inline(always)]
fn latency(c: *mut PeerCounters, at: &PeerKey, ns: u64) {
    peer_maps::latency(&DNS_STATS, &DNS_LAT, &LEDGER, &DNS_LIMITS.load(), c, at, MATCHED, ns, &DNS_DROPPED, DROP_LAT);
}

/// An address (IPv4 as `::ffff:a.b.c.d`), 8-byte aligned so that the
/// programs copy and compare it by words, not byte by byte.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Addr([u8; 16]);

impl Addr {
    #[inline(always)]
    fn from_words(w: [u64; 2]) -> Addr {
        // SAFETY: 16 bytes either way, every bit pattern valid.
        Addr(unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(w) })
    }

    #[inline(always)]
    fn words(&self) -> [u64; 2] {
        // SAFETY: as above.
        unsafe { core::mem::transmute::<[u8; 16], [u64; 2]>(self.0) }
    }

    #[inline(always)]
    fn same(&self, other: &Addr) -> bool {
        self.words() == other.words()
    }
}

/// An IPv4 address (its 4 bytes as loaded: network order in memory) as
/// `::ffff:a.b.c.d`.
#[inline(always)]
fn mapped(v4: u32) -> Addr {
    Addr::from_words([0, 0xffff_0000 | (v4 as u64) << 32])
}

/// An IPv6 address from its four 4-byte words as loaded.
#[inline(always)]
fn v6(w: [u32; 4]) -> Addr {
    Addr::from_words([w[0] as u64 | (w[1] as u64) << 32, w[2] as u64 | (w[3] as u64) << 32])
}

/// A packet to or from port 53: its remote address, transport protocol
/// and transport header's offset.
#[repr(C)]
struct Packet {
    addr: Addr,
    l4: usize,
    proto: u8,
}

/// The packet, from the network header on (where a cgroup skb program's
/// data starts), when it is UDP or TCP and its remote port is 53. `out`:
/// the remote end is the destination.
#[inline(always)]
fn dns_packet(ctx: &SkBuffContext, out: bool) -> Option<Packet> {
    // Two loads for a packet that is not DNS, the node's usual: the first
    // 20 bytes of the network header (all of IPv4's but options; IPv6's
    // version and next header), then the two ports.
    let h: [u8; 20] = ctx.load(0).ok()?;
    let (proto, l4) = match h[0] >> 4 {
        // A fragment after the first has no transport header.
        4 if u16::from_be_bytes([h[6], h[7]]) & 0x1fff == 0 => (h[9], ((h[0] & 0x0f) as usize) * 4),
        // Extension headers are not followed: DNS packets carry none.
        6 => (h[6], 40),
        _ => return None,
    };
    if proto != IPPROTO_UDP && proto != IPPROTO_TCP {
        return None;
    }
    let ports: [u8; 4] = ctx.load(l4).ok()?;
    let remote = if out { u16::from_be_bytes([ports[2], ports[3]]) } else { u16::from_be_bytes([ports[0], ports[1]]) };
    if remote != PORT {
        return None;
    }
    let addr = if h[0] >> 4 == 4 {
        let at = if out { 16 } else { 12 };
        mapped(u32::from_ne_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]))
    } else {
        Addr::from_words(ctx.load(if out { 24 } else { 8 }).ok()?)
    };
    Some(Packet { addr, l4, proto })
}

/// A `u32` at a constant offset from a socket or context pointer, loaded
/// as the verifier wants it: one load at that offset from the pointer
/// itself (it allows no arithmetic on a socket pointer, nor a load
/// through a context pointer moved first).
macro_rules! load_u32 {
    ($p:expr, $off:literal) => {{
        let v: u64;
        // SAFETY: one 4-byte load from `$p`, a non-null socket or context
        // pointer, at an offset the verifier checks for the program type;
        // no memory is written.
        unsafe { core::arch::asm!(concat!("{v} = *(u32 *)({p} + ", $off, ")"), v = out(reg) v, p = in(reg) $p, options(readonly, nostack)) };
        v as u32
    }};
}

// The offsets `load_u32!` reads at, as the kernel's uapi headers have them.
const _: () = {
    use aya_ebpf::bindings::{bpf_sock, bpf_sock_addr};
    use core::mem::offset_of;
    assert!(offset_of!(bpf_sock, family) == 4);
    assert!(offset_of!(bpf_sock, dst_port) == 48);
    assert!(offset_of!(bpf_sock, dst_ip4) == 52);
    assert!(offset_of!(bpf_sock, dst_ip6) == 56);
    assert!(offset_of!(bpf_sock_addr, user_ip4) == 4);
    assert!(offset_of!(bpf_sock_addr, user_ip6) == 8);
    assert!(offset_of!(bpf_sock_addr, user_port) == 24);
    assert!(offset_of!(aya_ebpf::bindings::bpf_tcp_sock, rcv_nxt) == 16);
};

/// The packet's socket (the context's `sk`), if it has one.
#[inline(always)]
fn sock(ctx: &SkBuffContext) -> Option<*mut bpf_sock> {
    // SAFETY: the context's `sk` field, read as the verifier allows (its
    // own 8 bytes); a null pointer when the packet has no socket.
    let sk = unsafe { read_volatile(addr_of!((*ctx.skb.skb).__bindgen_anon_2.sk)) };
    (!sk.is_null()).then_some(sk)
}

/// The sequence number the packet's TCP socket expects next (`rcv_nxt`:
/// every byte before it has arrived), before this packet.
#[inline(always)]
fn rcv_nxt(ctx: &SkBuffContext) -> Option<u32> {
    // SAFETY: bpf_tcp_sock takes the context's socket (non-null) and
    // returns its TCP socket or null.
    let tp = unsafe { aya_ebpf::helpers::bpf_tcp_sock(sock(ctx)?) };
    (!tp.is_null()).then(|| load_u32!(tp, 16))
}

/// The destination the packet's socket is connected to, when it is port
/// 53: what the socket asked for, before any NAT below it. None for an
/// unconnected socket (and a packet without one).
#[inline(always)]
fn connected_to(ctx: &SkBuffContext) -> Option<Addr> {
    let sk = sock(ctx)?;
    // Fields of `struct bpf_sock` a cgroup skb program may read (its
    // common part). `dst_port` is read as the 4 bytes every kernel since
    // 5.1 allows: the port in network order in the first two.
    if u16::from_be(load_u32!(sk, 48) as u16) != PORT {
        return None;
    }
    match load_u32!(sk, 4) {
        AF_INET => Some(mapped(load_u32!(sk, 52))),
        AF_INET6 => Some(v6([load_u32!(sk, 56), load_u32!(sk, 60), load_u32!(sk, 64), load_u32!(sk, 68)])),
        _ => None,
    }
}

/// The server a UDP query of this packet is for: the address its socket
/// asked for (connected: its destination; unconnected: the address it gave
/// sendmsg for this datagram), if known.
#[inline(always)]
fn asked(ctx: &SkBuffContext, cookie: u64) -> Option<Addr> {
    if let Some(a) = connected_to(ctx) {
        return Some(a);
    }
    // An unconnected socket gives an address with every datagram, so the
    // one kept is this datagram's (set at its sendmsg, just before). Taken:
    // the map holds only datagrams on their way (and those whose send
    // failed after the program, until the LRU evicts them), so that a new
    // entry never pushes out one still on its way.
    let sent = DNS_SENT.get_ptr(cookie)?;
    // SAFETY: a copy taken at once from a map value, deleted just after.
    let a = Addr(unsafe { (*sent).addr });
    let _ = DNS_SENT.remove(cookie);
    Some(a)
}

/// The DNS header's id and flags at `dns`.
#[inline(always)]
fn header(ctx: &SkBuffContext, dns: usize) -> Option<(u16, u16)> {
    let id = u16::from_be(ctx.load::<u16>(dns).ok()?);
    let flags = u16::from_be(ctx.load::<u16>(dns + 2).ok()?);
    Some((id, flags))
}

/// The first question's type: after its name (labels up to a zero length;
/// a question's name has no compression pointers).
#[inline(always)]
fn qtype(ctx: &SkBuffContext, dns: usize) -> Option<u16> {
    let mut off = dns + 12;
    for _ in 0..MAX_LABELS {
        let len: u8 = ctx.load(off).ok()?;
        if len == 0 {
            return Some(u16::from_be(ctx.load::<u16>(off + 1).ok()?));
        }
        if len & 0xc0 != 0 {
            return None;
        }
        off += len as usize + 1;
    }
    None
}

/// The socket's cgroup v2 id: what the bounds of the maps are kept by,
/// whether or not counts are attributed.
#[inline(always)]
fn owner(ctx: &SkBuffContext) -> u64 {
    // SAFETY: the program's own context.
    unsafe { aya_ebpf::helpers::bpf_skb_cgroup_id(ctx.skb.skb) }
}

/// The cgroup counts go under: the owner, or 0 when sockets are not
/// attributed.
#[inline(always)]
fn label(owner: u64) -> u64 {
    if DNS_CONFIG.load().attribute == 0 {
        0
    } else {
        owner
    }
}

#[inline(always)]
fn cookie(ctx: &SkBuffContext) -> u64 {
    // SAFETY: the program's own context.
    unsafe { aya_ebpf::helpers::bpf_get_socket_cookie(ctx.as_ptr()) }
}

/// Counts a failing answer by its cgroup, rcode and question name (read
/// byte by byte up to NAME_BYTES: failing answers are few).
#[inline(always)]
fn record_name(ctx: &SkBuffContext, dns: usize, cgroup: u64, rcode: u8) -> Option<()> {
    let k = DNS_NAME_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot, used by one program at a time.
    let k = unsafe { &mut *k };
    *k = NameKey::ZERO;
    k.cgroup = cgroup;
    k.rcode = rcode;
    let mut next = 0usize;
    for i in 0..NAME_BYTES {
        let b: u8 = ctx.load(dns + 12 + i).ok()?;
        if let Some(slot) = k.name.get_mut(i) {
            *slot = b;
        }
        if i == next {
            if b == 0 {
                k.len = (i + 1) as u8;
                break;
            }
            if b & 0xc0 != 0 {
                return None;
            }
            next = i + b as usize + 1;
        }
    }
    count_name(k);
    Some(())
}

/// Counts a failing answer's name (the key in this CPU's scratch slot): its
/// own key, made while its cgroup holds fewer than its limit, else its
/// cgroup's other name for the rcode; what neither can take is dropped.
#[inline(always)]
fn count_name(k: &mut NameKey) {
    let aux = DNS_LIMITS.load().aux;
    if peer_maps::count_within(&DNS_NAMES, &LEDGER, k.cgroup, AUX, aux, k) {
        return;
    }
    let (cgroup, rcode) = (k.cgroup, k.rcode);
    *k = NameKey::ZERO;
    k.cgroup = cgroup;
    k.rcode = rcode;
    // Other names are made whatever the count: three per cgroup at most.
    if !peer_maps::count_exempt(&DNS_NAMES, &LEDGER, cgroup, AUX, k) {
        inc(&DNS_DROPPED, DROP_NAMES);
    }
}

/// `owner`'s record of what it holds, made first if need be (None when
/// the map of cgroups is full: nothing is admitted then).
#[inline(always)]
fn inflight(owner: u64) -> Option<*mut InFlight> {
    if let Some(p) = DNS_INFLIGHT.get_ptr_mut(owner) {
        return Some(p);
    }
    let _ = DNS_INFLIGHT.insert(owner, NO_INFLIGHT, NOEXIST);
    DNS_INFLIGHT.get_ptr_mut(owner)
}

/// Words of an `InFlight` record.
const PENDING_ADDED: usize = 0;
const PENDING_REMOVED: usize = 1;
const CONNS_ADDED: usize = 2;
const CONNS_REMOVED: usize = 3;
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(InFlight, pending_added) == PENDING_ADDED * 8);
    assert!(offset_of!(InFlight, pending_removed) == PENDING_REMOVED * 8);
    assert!(offset_of!(InFlight, conns_added) == CONNS_ADDED * 8);
    assert!(offset_of!(InFlight, conns_removed) == CONNS_REMOVED * 8);
    assert!(core::mem::size_of::<InFlight>() == 32);
};

/// Adds one to word `w` of the `InFlight` record `f`, atomically (every CPU
/// adds to it).
#[inline(always)]
fn bump(f: *mut InFlight, w: usize) {
    if w <= CONNS_REMOVED {
        // SAFETY: `f` points to a map value of four aligned u64 words; `w`
        // is in range.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((f as *mut u64).add(w), 1) };
    }
}

/// Whether `owner` may take one more entry of `DNS_PENDING` (`conns`
/// false) or `DNS_CONNS` (true), below its bound; if so it is counted as
/// taken. Two CPUs admitting for one cgroup at once may take it one past.
#[inline(always)]
fn admit(owner: u64, conns: bool) -> bool {
    let Some(f) = inflight(owner) else { return false };
    // SAFETY: copies of map values, taken at once.
    let (held, reaped) = unsafe { (read_volatile(f), DNS_REAPED.get_ptr(owner).map(|r| read_volatile(r)).unwrap_or_default()) };
    let (now, bound) = if conns { (held.conns(&reaped), CONNS_PER_CGROUP) } else { (held.pending(&reaped), PENDING_PER_CGROUP) };
    if now >= bound as u64 {
        return false;
    }
    bump(f, if conns { CONNS_ADDED } else { PENDING_ADDED });
    true
}

/// An entry `owner` took is deleted (by a program: the agent's own
/// deletions are in `DNS_REAPED`).
#[inline(always)]
fn release(owner: u64, conns: bool) {
    if let Some(f) = DNS_INFLIGHT.get_ptr_mut(owner) {
        bump(f, if conns { CONNS_REMOVED } else { PENDING_REMOVED });
    }
}

/// Puts a query in `DNS_PENDING` under `key`, within its owner's bound.
#[inline(always)]
fn wait(key: &PendingKey, value: &Pending) -> bool {
    if !admit(value.owner, false) {
        return false;
    }
    if DNS_PENDING.insert(key, value, NOEXIST).is_err() {
        // Full, or sent again meanwhile on another CPU.
        release(value.owner, false);
        return false;
    }
    true
}

/// A message's place and the socket it belongs to: the DNS header's
/// offset, the server (the address the socket asked for), the packet's
/// remote address, the transport, the socket's cgroup and cookie.
#[repr(C)]
struct Msg {
    server: Addr,
    remote: Addr,
    cookie: u64,
    owner: u64,
    dns: usize,
    transport: u8,
    /// 0: a query whose answer cannot be read (its connection's answers
    /// are not followed), counted but not timed.
    timed: u8,
}

/// A query leaving: counted by type; waits for its answer, under the
/// server its socket asked for and, when the packet left for another
/// address (NAT below the socket, or a socket load balancer), under that
/// one too, as the answer may come from either.
#[inline(always)]
fn query(ctx: &SkBuffContext, m: &Msg) -> Option<()> {
    let (id, flags) = header(ctx, m.dns)?;
    if flags & FLAG_QR != 0 {
        return None;
    }
    let word = qtype_word(qtype(ctx, m.dns).unwrap_or(0));
    let aliased = !m.remote.same(&m.server);
    let mut w = Pending {
        peer: PeerKey { cgroup: label(m.owner), addr: m.server.0, port: PORT, dir: m.transport, pad: [0; 5] },
        start_ns: 0,
        owner: m.owner,
        other: m.remote.0,
        kind: if aliased { PENDING_WITH_ALIAS } else { PENDING_QUERY },
        pad: [0; 7],
    };
    let mut key = PendingKey { cookie: m.cookie, server: m.server.0, id, pad: [0; 6] };
    let (c, _) = counters(&w.peer)?;
    if DNS_PENDING.get_ptr(&key).is_some() {
        add(c, RETRANSMITS, 1);
        return Some(());
    }
    w.start_ns = now_ns();
    if m.timed == 0 {
        inc(&DNS_DROPPED, DROP_STREAM);
    } else if !wait(&key, &w) {
        // Counted, not timed.
        inc(&DNS_DROPPED, DROP_PENDING);
    } else if aliased {
        w.other = m.server.0;
        w.kind = PENDING_ALIAS;
        key.server = m.remote.0;
        // Without room, the query waits under its socket's server alone.
        let _ = wait(&key, &w);
    }
    add(c, word, 1);
    Some(())
}

/// A response arriving: counted by rcode; the query waiting for it on its
/// socket from its server gives the latency.
#[inline(never)]
fn response(skb: *mut __sk_buff, m: &Msg) -> i32 {
    let _ = answer(&SkBuffContext::new(skb), m);
    0
}

#[inline(always)]
fn answer(ctx: &SkBuffContext, m: &Msg) -> Option<()> {
    let (id, flags) = header(ctx, m.dns)?;
    if flags & FLAG_QR == 0 {
        return None;
    }
    let sc = DNS_IN_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot of the ingress program, which runs in
    // softirq, once at a time on a CPU (as DNS_NAME_SCRATCH).
    let sc = unsafe { &mut *sc };
    sc.key = PendingKey { cookie: m.cookie, server: m.remote.0, id, pad: [0; 6] };
    let mut start_ns = 0;
    // Whoever deletes the entry that counts the query (this program or
    // the agent, at the timeout) counts it, once.
    let mut matched = false;
    if let Some(p) = DNS_PENDING.get_ptr(&sc.key) {
        // The entry that counts the query, and the query's other entry,
        // if any: `key` found one of them. Copies taken at once, as the
        // entries are deleted just after.
        sc.alias = sc.key;
        // SAFETY: a map value, read before its entry is deleted.
        let (kind, owner) = unsafe {
            sc.peer = (*p).peer;
            start_ns = (*p).start_ns;
            match (*p).kind {
                PENDING_ALIAS => sc.key.server = (*p).other,
                PENDING_WITH_ALIAS => sc.alias.server = (*p).other,
                _ => {}
            }
            ((*p).kind, (*p).owner)
        };
        matched = DNS_PENDING.remove(&sc.key).is_ok();
        if matched {
            release(owner, false);
        }
        if kind != PENDING_QUERY && DNS_PENDING.remove(&sc.alias).is_ok() {
            release(owner, false);
        }
    }
    if !matched {
        sc.peer = PeerKey { cgroup: label(m.owner), addr: m.remote.0, port: PORT, dir: m.transport, pad: [0; 5] };
    }
    let (c, at) = counters(&sc.peer)?;
    add(c, rcode_word(flags & RCODE_MASK), 1);
    if flags & FLAG_TC != 0 {
        add(c, TRUNCATED, 1);
    }
    if matched {
        latency(c, &at, now_ns().saturating_sub(start_ns));
    } else {
        add(c, LATE, 1);
    }
    let rcode = flags & RCODE_MASK;
    if failing(rcode) && DNS_CONFIG.load().names != 0 {
        record_name(ctx, m.dns, sc.peer.cgroup, rcode as u8);
    }
    Some(())
}

/// A TCP segment's sequence number, flags, payload offset and length.
struct Segment {
    seq: u32,
    flags: u8,
    payload: usize,
    len: u32,
}

#[inline(always)]
fn segment(ctx: &SkBuffContext, l4: usize) -> Option<Segment> {
    // Ports, sequence and acknowledgement numbers, data offset, flags.
    let h: [u8; 14] = ctx.load(l4).ok()?;
    let payload = l4 + ((h[12] >> 4) as usize) * 4;
    // The packet from its network header (a GSO or GRO super-segment
    // whole): what is past the TCP header is payload.
    let len = (ctx.len() as usize).saturating_sub(payload) as u32;
    Some(Segment { seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]), flags: h[13], payload, len })
}

/// Moves `s` over the length of its next message where this segment
/// (payload at `payload`, `len` bytes from sequence number `start`) holds
/// it (its two bytes maybe in two segments): the message's offset in the
/// segment, when the message starts in it. None when the stream's next
/// byte is not in this segment: a later one, or (wrapping) an earlier one,
/// sent again or lost before this one.
#[inline(always)]
fn next_message(ctx: &SkBuffContext, s: &mut Stream, start: u32, payload: usize, len: u32) -> Option<u32> {
    let off = s.next.wrapping_sub(start);
    if off >= len {
        return None;
    }
    let at = payload + off as usize;
    if s.stage == STAGE_LEN_LOW {
        let lo: u8 = ctx.load(at).ok()?;
        s.len = u16::from_be_bytes([s.hi, lo]);
        s.next = s.next.wrapping_add(1);
        s.stage = STAGE_MESSAGE;
    } else if s.stage == STAGE_LEN {
        if off + 1 == len {
            // The length's first byte ends the segment.
            s.hi = ctx.load(at).ok()?;
            s.next = s.next.wrapping_add(1);
            s.stage = STAGE_LEN_LOW;
            return None;
        }
        s.len = u16::from_be_bytes(ctx.load(at).ok()?);
        s.next = s.next.wrapping_add(2);
        s.stage = STAGE_MESSAGE;
    } else if s.stage != STAGE_MESSAGE {
        return None;
    }
    let off = s.next.wrapping_sub(start);
    (off < len).then_some(off)
}

/// Reads the messages of stream `st` that start in this segment: each
/// where the segment holds its header, counted (`out`: a query, else an
/// answer), at most `MAX_MESSAGES`; then up to `MAX_SKIPPED` more passed
/// over by their lengths alone (not read: dropped events), so that the
/// stream keeps its place; past those, its place is lost.
#[inline(always)]
fn walk(ctx: &SkBuffContext, s: &mut Stream, start: u32, payload: usize, len: u32, m: &mut Msg, out: bool) {
    for _ in 0..MAX_MESSAGES {
        let Some(off) = next_message(ctx, s, start, payload, len) else { return };
        if s.len >= 12 && off + 12 <= len {
            m.dns = payload + off as usize;
            if out {
                let _ = query(ctx, m);
            } else {
                response(ctx.skb.skb, m);
            }
        } else {
            // A header split across two segments (or none): not read.
            inc(&DNS_DROPPED, DROP_STREAM);
        }
        s.next = s.next.wrapping_add(s.len as u32);
        s.stage = STAGE_LEN;
    }
    for _ in 0..MAX_SKIPPED {
        if next_message(ctx, s, start, payload, len).is_none() {
            return;
        }
        inc(&DNS_DROPPED, DROP_STREAM);
        s.next = s.next.wrapping_add(s.len as u32);
        s.stage = STAGE_LEN;
    }
    if s.next.wrapping_sub(start) < len {
        s.stage = STAGE_LOST;
        inc(&DNS_DROPPED, DROP_STREAM);
    }
}

/// Forgets a connection (at a RST, or once FINs went both ways).
#[inline(always)]
fn forget(cookie: u64, owner: u64) {
    if DNS_CONNS.remove(cookie).is_ok() {
        release(owner, true);
    }
}

/// Follows a connection from its SYN (sent again: from its new first
/// byte), within its cgroup's bound: its queries start at `first`.
#[inline(always)]
fn follow(cookie: u64, owner: u64, first: u32) -> i32 {
    let out = Stream { next: first, len: 0, stage: STAGE_LEN, hi: 0 };
    if let Some(c) = DNS_CONNS.get_ptr_mut(cookie) {
        // SAFETY: a field of this connection's map value.
        unsafe { (*c).out = out };
        return 0;
    }
    let c = Conn {
        owner,
        last_ns: now_ns(),
        out,
        inb: Stream { next: 0, len: 0, stage: STAGE_UNKNOWN, hi: 0 },
        fin_out: 0,
        fin_in: 0,
        pad: [0; 6],
    };
    if !admit(owner, true) {
        inc(&DNS_DROPPED, DROP_CONNS);
    } else if DNS_CONNS.insert(cookie, &c, NOEXIST).is_err() {
        release(owner, true);
        inc(&DNS_DROPPED, DROP_CONNS);
    }
    0
}

/// A TCP segment out to port 53: a SYN starts following its connection
/// (within its cgroup's bound); a followed connection's queries are read.
/// Each of the four paths (UDP and TCP, out and in) is a function of its
/// own in the program (a BPF-to-BPF call), so that the entry point's stack
/// frame holds none of theirs (the frames of a call chain share 512 bytes).
#[inline(never)]
fn tcp_out(skb: *mut __sk_buff, l4: usize, w0: u64, w1: u64) -> i32 {
    let _ = follow_out(&SkBuffContext::new(skb), l4, Addr::from_words([w0, w1]));
    0
}

#[inline(always)]
fn follow_out(ctx: &SkBuffContext, l4: usize, remote: Addr) -> Option<()> {
    let seg = segment(ctx, l4)?;
    let cookie = cookie(ctx);
    let mut start = seg.seq;
    if seg.flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        // The first byte of data (in this SYN with Fast Open) follows the SYN.
        start = seg.seq.wrapping_add(1);
        follow(cookie, owner(ctx), start);
    }
    // Not followed: its SYN was not seen (or found no room).
    let c = DNS_CONNS.get_ptr_mut(cookie)?;
    // SAFETY: this connection's map value. Its query stream is written by
    // this program alone, for one packet of the connection at a time (the
    // socket's lock serializes its transmissions); the answer stream's
    // stage is only read.
    let (st, inb, owner) = unsafe { (&mut *(addr_of!((*c).out) as *mut Stream), read_volatile(addr_of!((*c).inb.stage)), (*c).owner) };
    // SAFETY: as above (every field is written whole).
    unsafe { (*c).last_ns = now_ns() };
    if seg.len > 0 {
        // Answers on a stream not followed (its SYN-ACK not seen, or its
        // place lost) are not read: its queries are counted, not timed.
        let timed = matches!(inb, STAGE_LEN | STAGE_LEN_LOW | STAGE_MESSAGE) as u8;
        let mut m = Msg { server: connected_to(ctx).unwrap_or(remote), remote, cookie, owner, dns: 0, transport: TRANSPORT_TCP, timed };
        walk(ctx, st, start, seg.payload, seg.len, &mut m, true);
    }
    // SAFETY: as above (`c` is not used once the entry is deleted).
    unsafe {
        if seg.flags & TCP_RST != 0 {
            forget(cookie, (*c).owner);
        } else if seg.flags & TCP_FIN != 0 {
            (*c).fin_out = 1;
            if read_volatile(addr_of!((*c).fin_in)) != 0 {
                forget(cookie, (*c).owner);
            }
        }
    }
    Some(())
}

/// A TCP segment in from port 53 on a followed connection: the SYN-ACK
/// says where answers start; answers are read.
#[inline(never)]
fn tcp_in(skb: *mut __sk_buff, l4: usize, w0: u64, w1: u64) -> i32 {
    let _ = follow_in(&SkBuffContext::new(skb), l4, Addr::from_words([w0, w1]));
    0
}

#[inline(always)]
fn follow_in(ctx: &SkBuffContext, l4: usize, remote: Addr) -> Option<()> {
    let seg = segment(ctx, l4)?;
    let cookie = cookie(ctx);
    let c = DNS_CONNS.get_ptr_mut(cookie)?;
    // SAFETY: this connection's map value. Its answer stream is written by
    // this program alone, for one packet of the connection at a time (its
    // flow's packets arrive on one CPU, in softirq).
    let st = unsafe { &mut *(addr_of!((*c).inb) as *mut Stream) };
    let mut start = seg.seq;
    if seg.flags & TCP_SYN != 0 {
        start = seg.seq.wrapping_add(1);
        *st = Stream { next: start, len: 0, stage: STAGE_LEN, hi: 0 };
    }
    // SAFETY: as above (every field is written whole).
    unsafe { (*c).last_ns = now_ns() };
    if seg.len > 0 {
        // SAFETY: as above.
        let owner = unsafe { (*c).owner };
        let mut m = Msg { server: remote, remote, cookie, owner, dns: 0, transport: TRANSPORT_TCP, timed: 1 };
        walk(ctx, st, start, seg.payload, seg.len, &mut m, false);
    }
    // A message starting in a segment that came ahead of a lost one, before
    // the stream knew where it starts, has arrived and will not come again:
    // the socket expects bytes past it. The stream's place is lost (its
    // later answers are not read, its later queries not timed).
    if seg.flags & TCP_SYN == 0
        && matches!(st.stage, STAGE_LEN | STAGE_LEN_LOW | STAGE_MESSAGE)
        && rcv_nxt(ctx).is_some_and(|r| (r.wrapping_sub(st.next) as i32) > 0)
    {
        st.stage = STAGE_LOST;
        inc(&DNS_DROPPED, DROP_STREAM);
    }
    // SAFETY: as above (`c` is not used once the entry is deleted).
    unsafe {
        if seg.flags & TCP_RST != 0 {
            forget(cookie, (*c).owner);
        } else if seg.flags & TCP_FIN != 0 {
            (*c).fin_in = 1;
            if read_volatile(addr_of!((*c).fin_out)) != 0 {
                forget(cookie, (*c).owner);
            }
        }
    }
    Some(())
}

/// A UDP datagram out to port 53: a query, to the server its socket asked for.
#[inline(never)]
fn udp_out(skb: *mut __sk_buff, l4: usize, w0: u64, w1: u64) -> i32 {
    let ctx = &SkBuffContext::new(skb);
    let cookie = cookie(ctx);
    let dst = Addr::from_words([w0, w1]);
    let m = Msg {
        server: asked(ctx, cookie).unwrap_or(dst),
        remote: dst,
        cookie,
        owner: owner(ctx),
        dns: l4 + 8,
        transport: TRANSPORT_UDP,
        timed: 1,
    };
    let _ = query(ctx, &m);
    0
}

/// The entry points pass the packet to their paths as arguments (the
/// address as two words), so that their own frames stay small.
fn try_egress(ctx: &SkBuffContext) -> Option<()> {
    let p = dns_packet(ctx, true)?;
    let [w0, w1] = p.addr.words();
    if p.proto == IPPROTO_TCP {
        tcp_out(ctx.skb.skb, p.l4, w0, w1);
    } else {
        udp_out(ctx.skb.skb, p.l4, w0, w1);
    }
    Some(())
}

/// A UDP datagram in from port 53: a response.
#[inline(never)]
fn udp_in(skb: *mut __sk_buff, l4: usize, w0: u64, w1: u64) -> i32 {
    let ctx = &SkBuffContext::new(skb);
    let from = Addr::from_words([w0, w1]);
    let m = Msg { server: from, remote: from, cookie: cookie(ctx), owner: owner(ctx), dns: l4 + 8, transport: TRANSPORT_UDP, timed: 1 };
    let _ = answer(ctx, &m);
    0
}

fn try_ingress(ctx: &SkBuffContext) -> Option<()> {
    let p = dns_packet(ctx, false)?;
    let [w0, w1] = p.addr.words();
    if p.proto == IPPROTO_TCP {
        tcp_in(ctx.skb.skb, p.l4, w0, w1);
    } else {
        udp_in(ctx.skb.skb, p.l4, w0, w1);
    }
    Some(())
}

/// Keeps the address an unconnected UDP socket gives sendmsg for port 53
/// (IPv6: `V6`), before any NAT: the egress program takes it as the
/// query's server.
#[inline(always)]
fn try_sendmsg<const V6: bool>(ctx: &SockAddrContext) -> Option<()> {
    let sa = ctx.sock_addr;
    // Fields of the program's own context, as the verifier allows for this
    // attach type (`user_ip6` for sendmsg6 only, `user_ip4` for sendmsg4
    // only); `user_port` holds the port in network order in its first two
    // bytes.
    if u16::from_be(load_u32!(sa, 24) as u16) != PORT {
        return None;
    }
    let addr = if V6 { v6([load_u32!(sa, 8), load_u32!(sa, 12), load_u32!(sa, 16), load_u32!(sa, 20)]) } else { mapped(load_u32!(sa, 4)) };
    // SAFETY: the program's own context.
    let cookie = unsafe { aya_ebpf::helpers::bpf_get_socket_cookie(ctx.as_ptr()) };
    DNS_SENT.insert(cookie, Sent { addr: addr.0 }, 0).ok()
}

#[cgroup_skb(egress)]
pub fn dns_egress(ctx: SkBuffContext) -> i32 {
    let _ = try_egress(&ctx);
    PASS
}

#[cgroup_skb(ingress)]
pub fn dns_ingress(ctx: SkBuffContext) -> i32 {
    let _ = try_ingress(&ctx);
    PASS
}

#[cgroup_sock_addr(sendmsg4)]
pub fn dns_sendmsg4(ctx: SockAddrContext) -> i32 {
    let _ = try_sendmsg::<false>(&ctx);
    PASS
}

#[cgroup_sock_addr(sendmsg6)]
pub fn dns_sendmsg6(ctx: SockAddrContext) -> i32 {
    let _ = try_sendmsg::<true>(&ctx);
    PASS
}
