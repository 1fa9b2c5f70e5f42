//! `ebpf_dns`: two cgroup socket-buffer programs on the cgroup v2 root,
//! which every socket of the node passes. Egress: a UDP datagram (or a TCP
//! segment starting with a message) to port 53 that is a DNS query is
//! counted by type for its socket's cgroup, server and transport, and
//! waits in `DNS_PENDING` by (socket, id). Ingress: one from port 53 that
//! is a DNS response is counted by rcode; the
//! query waiting with its id on that socket gives the latency, and its
//! entry is deleted (the agent deletes the ones waiting longer than the
//! timeout, as timeouts: whoever deletes it first counts it). Both always
//! let the packet through.

use agent_common::dns::{
    failing, qtype_word, rcode_word, Config, NameKey, Pending, PendingKey, DROP_LAT, DROP_NAMES, DROP_PENDING, DROP_STATS, FLAG_QR,
    FLAG_TC, LATE, MATCHED, MAX_CGROUPS, MAX_LABELS, MAX_LAT, MAX_NAMES, MAX_PENDING, MAX_SERVERS, NAME_BYTES, NUM_DROPS, PORT, RCODE_MASK,
    RETRANSMITS, TRANSPORT_TCP, TRANSPORT_UDP, TRUNCATED,
};
use agent_common::ledger::{Entries, Limits, AUX};
use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};
use aya_ebpf::{
    macros::{cgroup_skb, map},
    maps::{HashMap, PerCpuArray},
    programs::SkBuffContext,
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

const IPPROTO_UDP: u8 = 17;
const IPPROTO_TCP: u8 = 6;
/// The packet lets through (a cgroup skb program returning 0 would drop it).
const PASS: i32 = 1;

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

/// A DNS packet's remote address (IPv4 as `::ffff:a.b.c.d`), its
/// transport and the offset of its DNS header, from the network
/// header on (where a cgroup skb program's data starts): a UDP datagram,
/// or a TCP segment with a payload, which for DNS starts with a message's
/// two-byte length (a message is read only where a segment starts with
/// one), when the remote port is 53. `out`: the remote end is the
/// destination.
#[inline(always)]
fn dns_packet(ctx: &SkBuffContext, out: bool) -> Option<([u8; 16], u8, usize)> {
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
    let mut addr = [0u8; 16];
    if h[0] >> 4 == 4 {
        let at = if out { 16 } else { 12 };
        addr[10] = 0xff;
        addr[11] = 0xff;
        addr[12] = h[at];
        addr[13] = h[at + 1];
        addr[14] = h[at + 2];
        addr[15] = h[at + 3];
    } else {
        addr = ctx.load(if out { 24 } else { 8 }).ok()?;
    }
    if proto == IPPROTO_UDP {
        return Some((addr, TRANSPORT_UDP, l4 + 8));
    }
    let payload = l4 + ((ctx.load::<u8>(l4 + 12).ok()? >> 4) as usize) * 4;
    // A segment without a message's length and header (a SYN, an ACK).
    if (ctx.len() as usize) < payload + 2 + 12 {
        return None;
    }
    Some((addr, TRANSPORT_TCP, payload + 2))
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

#[inline(always)]
fn cgroup(ctx: &SkBuffContext) -> u64 {
    if DNS_CONFIG.load().attribute == 0 {
        return 0;
    }
    // SAFETY: the program's own context.
    unsafe { aya_ebpf::helpers::bpf_skb_cgroup_id(ctx.skb.skb) }
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

fn try_egress(ctx: &SkBuffContext) -> Option<()> {
    let (addr, transport, dns) = dns_packet(ctx, true)?;
    let (id, flags) = header(ctx, dns)?;
    if flags & FLAG_QR != 0 {
        return None;
    }
    let word = qtype_word(qtype(ctx, dns).unwrap_or(0));
    let peer = PeerKey { cgroup: cgroup(ctx), addr, port: PORT, dir: transport, pad: [0; 5] };
    let key = PendingKey { cookie: cookie(ctx), id, pad: [0; 6] };
    let (c, _) = counters(&peer)?;
    if DNS_PENDING.get_ptr(key).is_some() {
        add(c, RETRANSMITS, 1);
        return Some(());
    }
    if DNS_PENDING.insert(key, Pending { peer, start_ns: now_ns() }, 1).is_err() {
        // Full (or sent again meanwhile on another CPU): counted, not timed.
        inc(&DNS_DROPPED, DROP_PENDING);
    }
    add(c, word, 1);
    Some(())
}

fn try_ingress(ctx: &SkBuffContext) -> Option<()> {
    let (addr, transport, dns) = dns_packet(ctx, false)?;
    let (id, flags) = header(ctx, dns)?;
    if flags & FLAG_QR == 0 {
        return None;
    }
    let key = PendingKey { cookie: cookie(ctx), id, pad: [0; 6] };
    // SAFETY: a copy is taken at once; the entry is deleted just after.
    let waiting = DNS_PENDING.get_ptr(key).map(|p| unsafe { *p });
    // Whoever deletes the entry (this program or the agent, at the
    // timeout) counts the query, once.
    let matched = match waiting {
        Some(w) if DNS_PENDING.remove(key).is_ok() => Some(w),
        _ => None,
    };
    let peer = match &matched {
        Some(w) => w.peer,
        None => PeerKey { cgroup: cgroup(ctx), addr, port: PORT, dir: transport, pad: [0; 5] },
    };
    let (c, at) = counters(&peer)?;
    add(c, rcode_word(flags & RCODE_MASK), 1);
    if flags & FLAG_TC != 0 {
        add(c, TRUNCATED, 1);
    }
    match matched {
        Some(w) => {
            latency(c, &at, now_ns().saturating_sub(w.start_ns));
        }
        None => add(c, LATE, 1),
    }
    let rcode = flags & RCODE_MASK;
    if failing(rcode) && DNS_CONFIG.load().names != 0 {
        record_name(ctx, dns, peer.cgroup, rcode as u8);
    }
    Some(())
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
