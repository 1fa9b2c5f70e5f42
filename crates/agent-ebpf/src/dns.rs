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
//! `CONNS_PER_CGROUP` followed connections, counted in the ledger that
//! bounds its share of the counting maps (`DNS_MADE`, `DNS_GONE`; words
//! `LEDGER_PENDING` and `LEDGER_CONNS`), so that no cgroup can fill the
//! node's maps for the others.

// Map keys and values are passed by reference: by value, each call would
// copy them on the BPF stack, whose 512 bytes a call chain shares.
#![allow(clippy::needless_borrows_for_generic_args)]

use core::ptr::{addr_of, read_volatile};

use agent_common::dns::{
    failing, qtype_word, rcode_word, Config, Conn, NameKey, Pending, PendingKey, Sent, Stream, CONNS_PER_CGROUP, DROP_CONNS, DROP_LAT,
    DROP_NAMES, DROP_PENDING, DROP_STATS, DROP_STREAM, FLAG_QR, FLAG_TC, LATE, LEDGER_CONNS, LEDGER_PENDING, MATCHED, MAX_CGROUPS,
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

use crate::helpers::{copy, inc, now_ns, store, BPF_F_NO_PREALLOC};
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
/// The ledger of the keys of DNS_STATS, DNS_LAT, DNS_NAMES, DNS_PENDING
/// and DNS_CONNS by cgroup (`agent_common::ledger`): the first three by
/// the cgroup counts go under, the last two by the socket's own.
#[map]
static DNS_MADE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);
#[map]
static DNS_GONE: HashMap<u64, Entries> = HashMap::with_max_entries(MAX_CGROUPS, BPF_F_NO_PREALLOC);

static LEDGER: Ledger = Ledger { made: &DNS_MADE, gone: &DNS_GONE };
#[map]
static DNS_CONNS: HashMap<u64, Conn> = HashMap::with_max_entries(MAX_CONNS, BPF_F_NO_PREALLOC);
#[map]
static DNS_SENT: LruHashMap<u64, Sent> = LruHashMap::with_max_entries(MAX_SENT, 0);
/// Per-CPU scratch of the ingress program (which runs in softirq, once at
/// a time on a CPU): the socket of the messages read and a response's
/// keys. In a map, not on the stack: the 512 bytes of stack are shared by
/// a call chain, and what a function leaves in map memory is not a state
/// of the verifier's (every path of a function that wrote it there returns
/// to its caller in one state; see `dns_answer`).
#[map]
static DNS_IN_SCRATCH: PerCpuArray<InScratch> = PerCpuArray::with_max_entries(1, 0);

/// The socket of the messages read, a response's lookup key, the key of
/// its query's other entry, what it is counted under (`peer`, as the query
/// was; `at`, the record it went to; `lat`, its latency's bucket), and
/// whether it found its query (`matched`, sent at `start_ns`).
#[repr(C)]
struct InScratch {
    msg: Msg,
    key: PendingKey,
    alias: PendingKey,
    peer: PeerKey,
    at: PeerKey,
    lat: LatKey,
    start_ns: u64,
    matched: u64,
}

/// Per-CPU scratch of the egress program (a query's socket, key and
/// value), as the ingress program's, for the same reasons. The egress hook
/// runs in process context too, where a softirq that sends (and so runs
/// the program again) may interrupt it on the same CPU: each run takes the
/// slot at the CPU's depth (`DNS_OUT_DEPTH`) and puts the depth back
/// before it returns, so an interrupted run finds its slot as it left it;
/// a run deeper than `OUT_SLOTS` reads nothing (a dropped event). On a
/// kernel that preempts a task inside a BPF program (full or real-time
/// preemption), a run preempted between its read of the depth and its
/// write (the next instructions) can share its slot with the run that
/// preempted it: that query may then be counted or wait under the other's
/// socket or server (the maps stay sound; BPF on 5.10 has no atomic
/// exchange to make the depth's read and write one step).
#[map]
static DNS_OUT_SCRATCH: PerCpuArray<OutScratch> = PerCpuArray::with_max_entries(OUT_SLOTS, 0);
#[map]
static DNS_OUT_DEPTH: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Nested runs of the egress program on one CPU with a scratch slot: a
/// run in process context and one in a softirq interrupting it.
const OUT_SLOTS: u32 = 2;

/// A query's socket, its type, its key and value in `DNS_PENDING`.
#[repr(C)]
struct OutScratch {
    msg: Msg,
    qtype: u64,
    key: PendingKey,
    value: Pending,
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

// How the programs are cut, for the verifier: it walks every path of a
// program, and a static BPF-to-BPF function (`#[inline(never)]`) on each
// call, in the caller's state; every path through one returns to its
// caller in the same state when it leaves its results in map memory or
// returns only a scalar or a map pointer, so that the paths within it (a
// record found or made, its cgroup's share, the ledger's record made or
// not) add up instead of multiplying with those of the caller. That is
// not enough on older kernels: a verifier before Linux 6.4 cannot follow
// a value's precision back across a call of the program's own, and then
// marks every value of the path precise, which keeps paths apart that a
// newer one merges, so that a static function is walked again for many
// states of its callers (dns_ingress went past 1,000,000 instructions on
// 5.10 and 6.1). So the steps a message or a response goes through are
// global functions (`#[unsafe(no_mangle)] extern "C"`, BTF linkage
// global, Linux 5.6): the verifier walks each once, on its own, for any
// arguments, and a call of one costs its caller a few instructions. What
// 5.10 allows a global function: scalars and the context as arguments (at
// most five), a scalar returned; so they are given the scratch slot's
// index, not a pointer to it, and find their maps as statics. A message
// of a TCP segment (up to MAX_MESSAGES of them) thus costs a call of
// `dns_query` or `dns_answer`, whose steps (`dns_take_query`,
// `dns_tally`, `dns_record_name`) are walked once each.

/// The counters the events of the server key at `peer` go to: its own
/// record, or (beyond its cgroup's limit) its cgroup's other; the key of
/// the record is written to `at` (when not null; it may be `peer`); null
/// when neither can be had (a dropped event).
#[inline(never)]
fn counters(peer: *const PeerKey, at: *mut PeerKey) -> *mut PeerCounters {
    peer_maps::find(&DNS_STATS, &LEDGER, &DNS_LIMITS.load(), peer, at, &DNS_DROPPED, DROP_STATS)
}

/// A matched response's latency (since its query left, `sc.start_ns`), in
/// the buckets of the record `c` (key `sc.at`) or, beyond its cgroup's
/// limit, its other's, with their count (MATCHED) and sum; the bucket's key
/// is built in `sc.lat`.
#[inline(never)]
fn latency(sc: *mut InScratch, c: *mut PeerCounters) -> i32 {
    // SAFETY: this CPU's scratch slot (see `dns_take_query`).
    let ns = now_ns().saturating_sub(unsafe { (*sc).start_ns });
    let others = |k: &mut PeerKey| {
        store(k, peer_maps::other_key(k.cgroup, k.dir));
        let p = counters(k, k);
        (!p.is_null()).then_some(p)
    };
    // SAFETY: this CPU's scratch slot (see `dns_take_query`).
    let key = unsafe {
        copy(addr_of!((*sc).lat.peer) as *mut PeerKey, addr_of!((*sc).at));
        &mut (*sc).lat
    };
    peer_maps::latency(others, &DNS_LAT, &LEDGER, &DNS_LIMITS.load(), c, key, MATCHED, ns, &DNS_DROPPED, DROP_LAT);
    0
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

/// A waiting query's key, written by words (a byte array of zeros, the
/// padding, would be filled by a call to memset, a loop the verifier
/// walks byte by byte).
#[inline(always)]
fn pending_key(cookie: u64, server: &Addr, id: u16) -> PendingKey {
    let [s0, s1] = server.words();
    // SAFETY: PendingKey is 32 bytes of plain integers, the id in the low
    // 16 bits of its last word (checked below).
    unsafe { core::mem::transmute::<[u64; 4], PendingKey>([cookie, s0, s1, id as u64]) }
}

/// The key a server's counts go under.
#[inline(always)]
fn server_key(cgroup: u64, server: &Addr, transport: u8) -> PeerKey {
    let [s0, s1] = server.words();
    peer_maps::key_of([cgroup, s0, s1, PORT as u64 | (transport as u64) << 16])
}

/// A waiting query's value, written by words as its key is.
#[inline(always)]
fn pending(peer: &PeerKey, start_ns: u64, owner: u64, other: &Addr, kind: u8) -> Pending {
    // SAFETY: as for PendingKey: 72 bytes of plain integers (checked below).
    let p = unsafe { core::mem::transmute::<PeerKey, [u64; 4]>(*peer) };
    let [o0, o1] = other.words();
    // SAFETY: as above.
    unsafe { core::mem::transmute::<[u64; 9], Pending>([p[0], p[1], p[2], p[3], start_ns, owner, o0, o1, kind as u64]) }
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<PendingKey>() == 32 && offset_of!(PendingKey, server) == 8 && offset_of!(PendingKey, id) == 24);
    assert!(size_of::<Pending>() == 72 && offset_of!(Pending, start_ns) == 32 && offset_of!(Pending, owner) == 40);
    assert!(offset_of!(Pending, other) == 48 && offset_of!(Pending, kind) == 64);
    assert!(size_of::<NameKey>() == 16 + NAME_BYTES && offset_of!(NameKey, rcode) == 8 && offset_of!(NameKey, len) == 9);
    assert!(NAME_BYTES.is_multiple_of(8));
    assert!(size_of::<Conn>() == 40 && offset_of!(Conn, last_ns) == 8 && offset_of!(Conn, out) == 16 && offset_of!(Conn, inb) == 24);
    assert!(size_of::<Stream>() == 8);
};

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
    let (proto, l4, v4) = match h[0] >> 4 {
        // A fragment after the first has no transport header.
        4 if u16::from_be_bytes([h[6], h[7]]) & 0x1fff == 0 => (h[9], ((h[0] & 0x0f) as usize) * 4, true),
        // Extension headers are not followed: DNS packets carry none.
        6 => (h[6], 40, false),
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
    // The address is loaded again rather than kept from the first load:
    // the bytes kept would be spilled to the entry point's stack frame,
    // which every call chain of the program starts with.
    let addr =
        if v4 { mapped(ctx.load(if out { 16 } else { 12 }).ok()?) } else { Addr::from_words(ctx.load(if out { 24 } else { 8 }).ok()?) };
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
    let h: [u8; 4] = ctx.load(dns).ok()?;
    Some((u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]])))
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

/// `x & 127`, computed where the verifier sees it: LLVM drops a mask it
/// can prove needless, and an older verifier may not prove the bound.
#[inline(always)]
fn mask127(x: u64) -> u64 {
    let mut v = x;
    // SAFETY: arithmetic on a register, no memory touched.
    unsafe { core::arch::asm!("{v} &= 127", v = inout(reg) v, options(pure, nomem, nostack)) };
    v
}

/// Writes a name key's first two words (its cgroup; its rcode and length)
/// and zeroes its name, word by word (volatile: LLVM would merge the
/// zeros into a call to memset).
#[inline(always)]
fn name_key(k: *mut NameKey, cgroup: u64, rcode: u8, len: u8) {
    let w = k as *mut u64;
    // SAFETY: `k` points to a map value of NAME_BYTES / 8 + 2 aligned u64
    // words (checked above).
    unsafe {
        core::ptr::write_volatile(w, cgroup);
        core::ptr::write_volatile(w.add(1), rcode as u64 | (len as u64) << 8);
        for i in 0..NAME_BYTES / 8 {
            core::ptr::write_volatile(w.add(2 + i), 0);
        }
    }
}

/// Counts a failing answer by its cgroup, rcode and question name: the
/// bytes after the header copied in one load (at most NAME_BYTES: a longer
/// name is kept cut), its labels walked in the copy to find its end (a
/// question's name has no compression pointers; a label is at least two
/// bytes, so MAX_LABELS labels pass NAME_BYTES), then the name alone
/// copied again into a zeroed key (no branch per byte or word: the
/// verifier would walk every combination).
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_record_name(skb: *mut __sk_buff, dns: u64, cgroup: u64, rcode: u64) -> i32 {
    let _ = try_record_name(&SkBuffContext::new(skb), dns as usize, cgroup, rcode as u8);
    0
}

/// Copies `n` bytes (1 to NAME_BYTES, masked for the verifier) of the
/// packet at `start` into the name of the key at `k`.
#[inline(always)]
fn load_name(ctx: &SkBuffContext, start: usize, k: *mut NameKey, n: u64) -> Option<()> {
    let n = mask127(n - 1) + 1;
    // SAFETY: `k` is this CPU's scratch slot, its name NAME_BYTES long.
    let r =
        unsafe { aya_ebpf::helpers::bpf_skb_load_bytes(ctx.skb.skb as *const _, start as u32, addr_of!((*k).name) as *mut _, n as u32) };
    (r == 0).then_some(())
}

#[inline(always)]
fn try_record_name(ctx: &SkBuffContext, dns: usize, cgroup: u64, rcode: u8) -> Option<()> {
    let start = dns + 12;
    let have = (ctx.len() as usize).checked_sub(start)?;
    if have == 0 {
        return None;
    }
    let k = DNS_NAME_SCRATCH.get_ptr_mut(0)?;
    // The bytes to copy go through the map too: a length the helper is
    // given must be precise, and the verifier would follow its precision
    // back to the message's offset in the caller, making every offset a
    // path of its own there.
    name_key(k, cgroup, rcode, have.min(NAME_BYTES) as u8);
    // SAFETY: this CPU's scratch slot, used by one program at a time (the
    // ingress program runs in softirq).
    let n = unsafe { read_volatile(addr_of!((*k).len)) } as u64;
    if n == 0 {
        return None;
    }
    load_name(ctx, start, k, n)?;
    // SAFETY: as above.
    let name = unsafe { addr_of!((*k).name) as *const u8 };
    let mut off = 0u64;
    let mut len = 0u64;
    for _ in 0..MAX_LABELS {
        if off >= n {
            break;
        }
        // SAFETY: a byte of the name, `off` < n <= NAME_BYTES (and masked
        // for the verifier).
        let b = unsafe { read_volatile(name.add(mask127(off) as usize)) } as u64;
        if b == 0 {
            len = off + 1;
            break;
        }
        if b & 0xc0 != 0 {
            return None;
        }
        off += b + 1;
    }
    if len == 0 && n < NAME_BYTES as u64 {
        // The packet ends before the name does.
        return None;
    }
    // The length goes through the map: each exit of the walk has one of
    // its own, which would part the paths after it.
    name_key(k, cgroup, rcode, len as u8);
    // SAFETY: as above.
    let len = unsafe { read_volatile(addr_of!((*k).len)) } as u64;
    load_name(ctx, start, k, if len == 0 { NAME_BYTES as u64 } else { len })?;
    // SAFETY: as above.
    count_name(unsafe { &mut *k });
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
    name_key(k, cgroup, rcode, 0);
    // Other names are made whatever the count: three per cgroup at most.
    if !peer_maps::count_exempt(&DNS_NAMES, &LEDGER, cgroup, AUX, k) {
        inc(&DNS_DROPPED, DROP_NAMES);
    }
}

/// Puts `value` in `map` under `key` (BPF_NOEXIST) if `owner` holds fewer
/// than `bound` entries of it (ledger word `word`), counted in the ledger
/// if it was put: whether it was. Two CPUs admitting for one cgroup at
/// once may take it one past.
#[inline(always)]
fn admit<K, V>(map: &HashMap<K, V>, key: &K, value: &V, owner: u64, word: usize, bound: u32) -> bool {
    let Some(r) = LEDGER.room(owner, word, bound) else { return false };
    // Full, or (a query) sent again meanwhile on another CPU: not put.
    if map.insert(key, value, NOEXIST).is_err() {
        return false;
    }
    Ledger::count(r, word, 1);
    true
}

/// Puts a query in `DNS_PENDING` under `key`, within its owner's bound:
/// whether it waits there.
#[inline(never)]
fn wait(key: *const PendingKey, value: *const Pending) -> i32 {
    // SAFETY: the caller's scratch slot.
    let (key, value) = unsafe { (&*key, &*value) };
    admit(&DNS_PENDING, key, value, value.owner, LEDGER_PENDING, PENDING_PER_CGROUP) as i32
}

/// The socket a message belongs to: the server (the address the socket
/// asked for), the packet's remote address, the socket's cookie and
/// cgroup, the transport. Words only (no padding), so that it is stored
/// by words (`helpers::store`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Msg {
    server: Addr,
    remote: Addr,
    cookie: u64,
    owner: u64,
    transport: u64,
    /// 0: a query whose answer cannot be read (its connection's answers
    /// are not followed), counted but not timed.
    timed: u64,
}

/// A query leaving (a UDP datagram, or a message of a TCP segment; its
/// DNS header at `dns`) on the socket in the scratch slot `sc` (`msg`):
/// counted by type; waits for its answer, under the server its socket
/// asked for and, when the packet left for another address (NAT below the
/// socket, or a socket load balancer), under that one too, as the answer
/// may come from either.
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_query(skb: *mut __sk_buff, slot: u64, dns: u64) -> i32 {
    if let Some(sc) = DNS_OUT_SCRATCH.get_ptr_mut(slot as u32) {
        let _ = try_query(&SkBuffContext::new(skb), sc, dns as usize);
    }
    0
}

#[inline(always)]
fn try_query(ctx: &SkBuffContext, sc: *mut OutScratch, dns: usize) -> Option<()> {
    let (id, flags) = header(ctx, dns)?;
    if flags & FLAG_QR != 0 {
        return None;
    }
    // The question's name is walked once, before `counters`, whose paths
    // may return in states the verifier does not prune; the type's word
    // (a constant on each path, which would part them) is found where it
    // is counted.
    // SAFETY: this run's scratch slot (see DNS_OUT_SCRATCH); its fields
    // reached through the pointer, no reference held across a call. What
    // differs from path to path is kept there (the type, whether the query
    // takes two entries), not in registers, so the paths meet again.
    unsafe {
        (*sc).qtype = qtype(ctx, dns).unwrap_or(0) as u64;
        let m = addr_of!((*sc).msg);
        let (key, value) = (addr_of!((*sc).key) as *mut PendingKey, addr_of!((*sc).value) as *mut Pending);
        let kind = if (*m).remote.same(&(*m).server) { PENDING_QUERY } else { PENDING_WITH_ALIAS };
        let peer = server_key(label((*m).owner), &(*m).server, (*m).transport as u8);
        store(value, pending(&peer, 0, (*m).owner, &(*m).remote, kind));
        let c = counters(addr_of!((*value).peer), core::ptr::null_mut());
        if c.is_null() {
            return None;
        }
        store(key, pending_key((*m).cookie, &(*m).server, id));
        if DNS_PENDING.get_ptr(&*key).is_some() {
            add(c, RETRANSMITS, 1);
            return Some(());
        }
        add(c, qtype_word(read_volatile(addr_of!((*sc).qtype)) as u16), 1);
        (*value).start_ns = now_ns();
        if (*m).timed == 0 {
            inc(&DNS_DROPPED, DROP_STREAM);
        } else if wait(key, value) == 0 {
            // Counted, not timed.
            inc(&DNS_DROPPED, DROP_PENDING);
        } else if read_volatile(addr_of!((*value).kind)) == PENDING_WITH_ALIAS {
            copy(addr_of!((*value).other) as *mut Addr, addr_of!((*m).server));
            (*value).kind = PENDING_ALIAS;
            copy(addr_of!((*key).server) as *mut Addr, addr_of!((*m).remote));
            // Without room, the query waits under its socket's server alone.
            let _ = wait(key, value);
        }
    }
    Some(())
}

/// A response arriving (a UDP datagram, or a message of a TCP segment; its
/// DNS header at `dns`) on the socket in this CPU's scratch (`msg`):
/// counted by rcode; the query waiting for it on its socket from its
/// server gives the latency. Its steps leave what they find in the
/// scratch, so each returns in one state.
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_answer(skb: *mut __sk_buff, dns: u64) -> i32 {
    let ctx = &SkBuffContext::new(skb);
    let Some((id, flags)) = header(ctx, dns as usize) else { return 0 };
    if flags & FLAG_QR == 0 {
        return 0;
    }
    let Some(sc) = DNS_IN_SCRATCH.get_ptr_mut(0) else { return 0 };
    dns_take_query(id as u64);
    dns_tally(flags as u64);
    let rcode = flags & RCODE_MASK;
    if failing(rcode) && DNS_CONFIG.load().names != 0 {
        // SAFETY: this CPU's scratch slot (see `dns_take_query`).
        dns_record_name(skb, dns, unsafe { (*sc).peer.cgroup }, rcode as u64);
    }
    0
}

/// Takes the query a response with `id` on the socket `sc.msg` answers
/// out of `DNS_PENDING` (both its entries): in `sc`, what the response is
/// counted under, and whether it matched a query (whose start it gives).
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_take_query(id: u64) -> i32 {
    let Some(sc) = DNS_IN_SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: this CPU's scratch slot of the ingress program, which runs in
    // softirq, once at a time on a CPU (as DNS_NAME_SCRATCH); fields
    // reached through the pointer, no reference held across a call.
    unsafe {
        store(addr_of!((*sc).key) as *mut PendingKey, pending_key((*sc).msg.cookie, &(*sc).msg.remote, id as u16));
        core::ptr::write_volatile(addr_of!((*sc).matched) as *mut u64, 0);
        core::ptr::write_volatile(addr_of!((*sc).start_ns) as *mut u64, 0);
        // Whoever deletes the entry that counts the query (this program or
        // the agent, at the timeout) counts it, once.
        if let Some(p) = DNS_PENDING.get_ptr(&(*sc).key) {
            // The entry that counts the query, and the query's other entry,
            // if any: `key` found one of them. Copies taken at once, as the
            // entries are deleted just after (a map value, read before its
            // entry is deleted).
            copy(addr_of!((*sc).alias) as *mut PendingKey, addr_of!((*sc).key));
            copy(addr_of!((*sc).peer) as *mut PeerKey, addr_of!((*p).peer));
            (*sc).start_ns = (*p).start_ns;
            let (kind, owner) = ((*p).kind, (*p).owner);
            let other = addr_of!((*p).other) as *const Addr;
            match kind {
                PENDING_ALIAS => copy(addr_of!((*sc).key.server) as *mut Addr, other),
                PENDING_WITH_ALIAS => copy(addr_of!((*sc).alias.server) as *mut Addr, other),
                _ => {}
            }
            if DNS_PENDING.remove(&(*sc).key).is_ok() {
                (*sc).matched = 1;
                LEDGER.free(owner, LEDGER_PENDING);
            }
            if kind != PENDING_QUERY && DNS_PENDING.remove(&(*sc).alias).is_ok() {
                LEDGER.free(owner, LEDGER_PENDING);
            }
        }
        if (*sc).matched == 0 {
            store(addr_of!((*sc).peer) as *mut PeerKey, server_key(label((*sc).msg.owner), &(*sc).msg.remote, (*sc).msg.transport as u8));
        }
    }
    0
}

/// Counts a response (`flags`, its header's) under `sc.peer`: its rcode,
/// truncation, and its latency if it matched a query, else as late.
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_tally(flags: u64) -> i32 {
    let Some(sc) = DNS_IN_SCRATCH.get_ptr_mut(0) else { return 0 };
    // SAFETY: this CPU's scratch slot (see `dns_take_query`).
    let c = unsafe { counters(&(*sc).peer, addr_of!((*sc).at) as *mut PeerKey) };
    if c.is_null() {
        return 0;
    }
    // The latency first: the paths of the rcode's word and truncation
    // would each walk it again.
    // SAFETY: as above.
    unsafe {
        if (*sc).matched != 0 {
            latency(sc, c);
        } else {
            add(c, LATE, 1);
        }
    }
    add(c, rcode_word(flags as u16 & RCODE_MASK), 1);
    if flags & FLAG_TC as u64 != 0 {
        add(c, TRUNCATED, 1);
    }
    0
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

/// Reads the messages of the stream at `st` that start in this segment:
/// each where the segment holds its header, counted (`each`, given the DNS
/// header's offset), at most `MAX_MESSAGES`; then up to `MAX_SKIPPED` more
/// passed over by their lengths alone (not read: dropped events), so that
/// the stream keeps its place; past those, its place is lost. The stream
/// is read into a local copy and written back once: in the map, its stage
/// would be unknown to the verifier at every step, in a local it is known
/// after the first message.
#[inline(always)]
fn walk(ctx: &SkBuffContext, st: *mut Stream, start: u32, payload: usize, len: u32, each: impl Fn(usize)) {
    // SAFETY: `st` points to a stream of this connection's map value.
    let mut s = unsafe { read_volatile(st) };
    walk_local(ctx, &mut s, start, payload, len, each);
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(st, s) };
}

#[inline(always)]
fn walk_local(ctx: &SkBuffContext, s: &mut Stream, start: u32, payload: usize, len: u32, each: impl Fn(usize)) {
    for _ in 0..MAX_MESSAGES {
        let Some(off) = next_message(ctx, s, start, payload, len) else { return };
        if s.len >= 12 && off + 12 <= len {
            each(payload + off as usize);
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

/// Whether a connection whose answer stream is at `stage` reads answers
/// (its queries are timed): the stream is followed (STAGE_LEN,
/// STAGE_LEN_LOW, STAGE_MESSAGE), by a shift rather than a branch.
#[inline(always)]
fn timed(stage: u8) -> u64 {
    const FOLLOWED: u64 = 1 << STAGE_LEN | 1 << STAGE_LEN_LOW | 1 << STAGE_MESSAGE;
    (FOLLOWED >> (stage & 7)) & 1
}

/// Forgets a connection (at a RST, or once FINs went both ways).
#[inline(always)]
fn forget(cookie: u64, owner: u64) {
    if DNS_CONNS.remove(cookie).is_ok() {
        LEDGER.free(owner, LEDGER_CONNS);
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
    let mut c = core::mem::MaybeUninit::<Conn>::uninit();
    let inb = Stream { next: 0, len: 0, stage: STAGE_UNKNOWN, hi: 0 };
    // SAFETY: Conn is five words: owner, last_ns, the two streams, and the
    // FINs (zero) with padding (checked below).
    let c = unsafe {
        let w = [owner, now_ns(), core::mem::transmute::<Stream, u64>(out), core::mem::transmute::<Stream, u64>(inb)];
        store(c.as_mut_ptr() as *mut [u64; 4], w);
        core::ptr::write_volatile((c.as_mut_ptr() as *mut u64).add(4), 0);
        c.assume_init_ref()
    };
    if !admit(&DNS_CONNS, &cookie, c, owner, LEDGER_CONNS, CONNS_PER_CGROUP) {
        inc(&DNS_DROPPED, DROP_CONNS);
    }
    0
}

/// A TCP segment out to port 53: a SYN starts following its connection
/// (within its cgroup's bound); a followed connection's queries are read.
/// Each of the four paths (UDP and TCP, out and in) is a global function
/// of its own (walked once by the verifier, given the egress run's scratch
/// slot by its index), so that the entry point's stack frame holds none of
/// theirs (the frames of a call chain share 512 bytes).
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_tcp_out(skb: *mut __sk_buff, slot: u64, l4: u64, w0: u64, w1: u64) -> i32 {
    let _ = follow_out(&SkBuffContext::new(skb), slot, l4 as usize, Addr::from_words([w0, w1]));
    0
}

#[inline(always)]
fn follow_out(ctx: &SkBuffContext, slot: u64, l4: usize, remote: Addr) -> Option<()> {
    let sc = DNS_OUT_SCRATCH.get_ptr_mut(slot as u32)?;
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
    let (st, inb, owner) = unsafe { (addr_of!((*c).out) as *mut Stream, read_volatile(addr_of!((*c).inb.stage)), (*c).owner) };
    // SAFETY: as above (every field is written whole).
    unsafe { (*c).last_ns = now_ns() };
    if seg.len > 0 {
        // Answers on a stream not followed (its SYN-ACK not seen, or its
        // place lost) are not read: its queries are counted, not timed.
        // Computed without a branch: a value known on each path would make
        // each a path of its own through the walk.
        let timed = timed(inb);
        let m = Msg { server: connected_to(ctx).unwrap_or(remote), remote, cookie, owner, transport: TRANSPORT_TCP as u64, timed };
        // SAFETY: this run's scratch slot (see DNS_OUT_SCRATCH).
        store(unsafe { addr_of!((*sc).msg) as *mut Msg }, m);
        let skb = ctx.skb.skb;
        walk(ctx, st, start, seg.payload, seg.len, |dns| {
            dns_query(skb, slot, dns as u64);
        });
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
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_tcp_in(skb: *mut __sk_buff, l4: u64, w0: u64, w1: u64) -> i32 {
    let _ = follow_in(&SkBuffContext::new(skb), l4 as usize, Addr::from_words([w0, w1]));
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
    let st = unsafe { addr_of!((*c).inb) as *mut Stream };
    let mut start = seg.seq;
    if seg.flags & TCP_SYN != 0 {
        start = seg.seq.wrapping_add(1);
        // SAFETY: as above.
        unsafe { *st = Stream { next: start, len: 0, stage: STAGE_LEN, hi: 0 } };
    }
    // SAFETY: as above (every field is written whole).
    unsafe { (*c).last_ns = now_ns() };
    if seg.len > 0 {
        let sc = DNS_IN_SCRATCH.get_ptr_mut(0)?;
        // SAFETY: a field of this connection's map value.
        let m = Msg { server: remote, remote, cookie, owner: unsafe { (*c).owner }, transport: TRANSPORT_TCP as u64, timed: 1 };
        // SAFETY: this CPU's scratch slot of the ingress program (see
        // `dns_take_query`): the socket of the messages `dns_answer` reads.
        store(unsafe { addr_of!((*sc).msg) as *mut Msg }, m);
        let skb = ctx.skb.skb;
        walk(ctx, st, start, seg.payload, seg.len, |dns| {
            dns_answer(skb, dns as u64);
        });
    }
    // SAFETY: as above.
    let s = unsafe { read_volatile(st) };
    // A message starting in a segment that came ahead of a lost one, before
    // the stream knew where it starts, has arrived and will not come again:
    // the socket expects bytes past it. The stream's place is lost (its
    // later answers are not read, its later queries not timed). The flags
    // are read again (volatile): the SYN bit as tested above is known on
    // each path, and would part them for the whole walk.
    // SAFETY: a local.
    let flags = unsafe { read_volatile(&seg.flags) };
    if flags & TCP_SYN == 0
        && matches!(s.stage, STAGE_LEN | STAGE_LEN_LOW | STAGE_MESSAGE)
        && rcv_nxt(ctx).is_some_and(|r| (r.wrapping_sub(s.next) as i32) > 0)
    {
        // SAFETY: as above.
        unsafe { (*st).stage = STAGE_LOST };
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
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_udp_out(skb: *mut __sk_buff, slot: u64, l4: u64, w0: u64, w1: u64) -> i32 {
    let ctx = &SkBuffContext::new(skb);
    let Some(sc) = DNS_OUT_SCRATCH.get_ptr_mut(slot as u32) else { return 0 };
    let cookie = cookie(ctx);
    let dst = Addr::from_words([w0, w1]);
    let m = Msg {
        server: asked(ctx, cookie).unwrap_or(dst),
        remote: dst,
        cookie,
        owner: owner(ctx),
        transport: TRANSPORT_UDP as u64,
        timed: 1,
    };
    // SAFETY: this run's scratch slot (see DNS_OUT_SCRATCH).
    store(unsafe { addr_of!((*sc).msg) as *mut Msg }, m);
    dns_query(skb, slot, l4 + 8);
    0
}

/// The entry points pass the packet to their paths as arguments (the
/// address as two words), so that their own frames stay small.
fn try_egress(ctx: &SkBuffContext) -> Option<()> {
    let p = dns_packet(ctx, true)?;
    let [w0, w1] = p.addr.words();
    let depth = DNS_OUT_DEPTH.get_ptr_mut(0)?;
    // SAFETY: this CPU's depth, written only by runs on this CPU, each of
    // which puts it back before it returns (an interrupting run has
    // returned before the interrupted one goes on).
    let d = unsafe { *depth };
    if d >= OUT_SLOTS {
        inc(&DNS_DROPPED, DROP_STREAM);
        return None;
    }
    // SAFETY: as above.
    unsafe { *depth = d + 1 };
    if p.proto == IPPROTO_TCP {
        dns_tcp_out(ctx.skb.skb, d as u64, p.l4 as u64, w0, w1);
    } else {
        dns_udp_out(ctx.skb.skb, d as u64, p.l4 as u64, w0, w1);
    }
    // SAFETY: as above.
    unsafe { *depth = d };
    Some(())
}

/// A UDP datagram in from port 53: a response.
// SAFETY: a global function of the program (see above); no other symbol
// of the object has its name, and nothing outside the program uses it.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn dns_udp_in(skb: *mut __sk_buff, l4: u64, w0: u64, w1: u64) -> i32 {
    let ctx = &SkBuffContext::new(skb);
    let Some(sc) = DNS_IN_SCRATCH.get_ptr_mut(0) else { return 0 };
    let from = Addr::from_words([w0, w1]);
    let m = Msg { server: from, remote: from, cookie: cookie(ctx), owner: owner(ctx), transport: TRANSPORT_UDP as u64, timed: 1 };
    // SAFETY: this CPU's scratch slot of the ingress program (see
    // `dns_take_query`): the socket of the message `dns_answer` reads.
    store(unsafe { addr_of!((*sc).msg) as *mut Msg }, m);
    dns_answer(skb, l4 + 8);
    0
}

fn try_ingress(ctx: &SkBuffContext) -> Option<()> {
    let p = dns_packet(ctx, false)?;
    let [w0, w1] = p.addr.words();
    if p.proto == IPPROTO_TCP {
        dns_tcp_in(ctx.skb.skb, p.l4 as u64, w0, w1);
    } else {
        dns_udp_in(ctx.skb.skb, p.l4 as u64, w0, w1);
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
