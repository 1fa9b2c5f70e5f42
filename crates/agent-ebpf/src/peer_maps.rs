//! Counting by (cgroup, peer) in hash maps every CPU adds to: the record of
//! counter words (`PeerCounters`) made on first use, a word added to
//! atomically, and counts by key (latency buckets, names). Shared by
//! `tcp_peers` and `dns`, whose maps are their own.
//!
//! Every new key is made within its cgroup's limit (`agent_common::ledger`):
//! the probe's ledger counts the keys each cgroup made ([`Ledger`]); a
//! cgroup at its limit counts a new peer in its *other* record
//! (`PeerKey::other`), and its latencies in that record's buckets. What no
//! record can take (a map full) is counted in the probe's dropped events.

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use agent_common::ledger::{self, Entries, Limits, LAT, STATS};
use agent_common::native_bucket;
use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey, LATENCY_NS, NUM_WORDS};
use aya_ebpf::maps::{HashMap, PerCpuArray};

use crate::helpers::{copy, inc, store};

/// Zeroed counters in read-only data, to create map entries with.
static ZERO: PeerCounters = PeerCounters::ZERO;
static NO_ENTRIES: Entries = Entries::ZERO;

/// BPF_NOEXIST: another CPU may make the same key meanwhile.
const NOEXIST: u64 = 1;

/// A probe's ledger: the keys each cgroup made (written here) and those
/// the agent found gone (written by the agent), by word of `Entries`.
pub struct Ledger {
    pub made: &'static HashMap<u64, Entries>,
    pub gone: &'static HashMap<u64, Entries>,
}

impl Ledger {
    /// The cgroup's record of keys made, made first if need be (None: the
    /// ledger is full).
    #[inline(always)]
    pub fn record(&self, cgroup: u64) -> Option<*mut Entries> {
        if let Some(p) = self.made.get_ptr_mut(cgroup) {
            return Some(p);
        }
        // By reference: a value would be copied to the stack first, by a
        // call to memset (a byte loop the verifier walks).
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = self.made.insert(cgroup, &NO_ENTRIES, NOEXIST);
        self.made.get_ptr_mut(cgroup)
    }

    /// The cgroup's record if it holds fewer than `limit` keys by `word`
    /// (then the caller may make one and [`Ledger::count`] it); None if it
    /// holds that many, or has no record and the ledger no room for one.
    #[inline(always)]
    pub fn room(&self, cgroup: u64, word: usize, limit: u32) -> Option<*mut Entries> {
        let p = self.record(cgroup)?;
        // SAFETY: a map value of WORDS u64; plain reads of words others add
        // to atomically (a stale value errs by what they add meanwhile).
        let net = unsafe { (*p).net(word) };
        // SAFETY: a copy of the agent's value, which it replaces whole.
        let gone = unsafe { self.gone.get(cgroup) }.and_then(|g| g.words.get(word).copied()).unwrap_or(0);
        ledger::room(ledger::live(net, gone), limit).then_some(p)
    }

    /// A program deleted a key of the cgroup's by `word` (a map of the
    /// probe's own: [`ledger::freed`]): counted, if the cgroup has a record
    /// (none: the agent forgot it, and the key's making with it).
    #[inline(always)]
    pub fn free(&self, cgroup: u64, word: usize) {
        if let (Some(p), Some(f)) = (self.made.get_ptr_mut(cgroup), ledger::freed(word)) {
            Ledger::count(p, f, 1);
        }
    }

    /// Adds `v` (wrapping: `u64::MAX` takes one away) to word `word` of a
    /// record, atomically.
    #[inline(always)]
    pub fn count(p: *mut Entries, word: usize, v: u64) {
        if word < ledger::WORDS {
            // SAFETY: `p` points to a map value of WORDS aligned u64 words; `word` is in range.
            unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((p as *mut u64).add(word), v) };
        }
    }
}

/// The cgroup's *other* record for direction `dir` (`PeerKey::other`),
/// made of words (its all-ones address as a byte array would be filled by
/// a call to memset: `helpers::store`). Store it with `helpers::store`.
#[inline(always)]
pub fn other_key(cgroup: u64, dir: u8) -> PeerKey {
    key_of([cgroup, u64::MAX, u64::MAX, (dir as u64) << 16])
}

/// A key from its four words (little-endian: the fourth holds the port in
/// its low 16 bits, then the direction; the padding zero).
#[inline(always)]
pub fn key_of(w: [u64; 4]) -> PeerKey {
    // SAFETY: PeerKey is 32 bytes of plain integers (checked below).
    unsafe { core::mem::transmute::<[u64; 4], PeerKey>(w) }
}

/// Whether `k` is an other record (`PeerKey::is_other`), by words.
#[inline(always)]
pub fn is_other(k: &PeerKey) -> bool {
    // SAFETY: as above.
    let w = unsafe { core::mem::transmute::<PeerKey, [u64; 4]>(*k) };
    w[1] == u64::MAX && w[2] == u64::MAX && w[3] & 0xffff == 0
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<PeerKey>() == 32);
    assert!(offset_of!(PeerKey, addr) == 8);
    assert!(offset_of!(PeerKey, port) == 24);
    assert!(offset_of!(PeerKey, dir) == 26);
    assert!(cfg!(target_endian = "little"));
};

/// Makes `key` in `map` with `v` if it is not there (BPF_NOEXIST): whether
/// this call made it.
#[inline(always)]
fn make<K, V>(map: &HashMap<K, V>, key: &K, v: &V) -> bool {
    map.insert(key, v, NOEXIST).is_ok()
}

/// Makes `key` in `map` (zeroed counters) if its cgroup has room for it
/// under `limit`, counted in the ledger; whether it had room (the key is
/// then there, unless the map is full).
#[inline(always)]
fn make_within(map: &HashMap<PeerKey, PeerCounters>, ledger: &Ledger, key: &PeerKey, limit: u32) -> bool {
    let Some(r) = ledger.room(key.cgroup, STATS, limit) else { return false };
    if make(map, key, &ZERO) {
        Ledger::count(r, STATS, 1);
    }
    true
}

/// The counters `peer`'s events go to in `map`, and their key: its own
/// record, made if its cgroup holds fewer than `limits.stats` records,
/// else its cgroup's other record for its direction (made whatever the
/// count: one per direction). None, counted in slot `drop` of `dropped`,
/// when neither is there or can be made (the map full).
#[inline(always)]
pub fn counters(
    map: &HashMap<PeerKey, PeerCounters>,
    ledger: &Ledger,
    limits: &Limits,
    peer: &PeerKey,
    dropped: &PerCpuArray<u64>,
    drop: u32,
) -> Option<(*mut PeerCounters, PeerKey)> {
    let mut at = core::mem::MaybeUninit::<PeerKey>::uninit();
    let p = find(map, ledger, limits, peer, at.as_mut_ptr(), dropped, drop);
    // SAFETY: `find` wrote the key whenever it found counters.
    (!p.is_null()).then(|| (p, unsafe { at.assume_init() }))
}

/// [`counters`] with the key written to `at` (when not null; it may be
/// `peer`), and null for None: a probe may keep the key off the stack.
#[inline(always)]
pub fn find(
    map: &HashMap<PeerKey, PeerCounters>,
    ledger: &Ledger,
    limits: &Limits,
    peer: *const PeerKey,
    at: *mut PeerKey,
    dropped: &PerCpuArray<u64>,
    drop: u32,
) -> *mut PeerCounters {
    // SAFETY: `peer` points to the caller's key, read before `at` (maybe
    // the same) is written.
    let peer = unsafe { &*peer };
    if let Some(p) = map.get_ptr_mut(peer) {
        if !at.is_null() {
            copy(at, peer);
        }
        return p;
    }
    if !is_other(peer) && make_within(map, ledger, peer, limits.stats) {
        if let Some(p) = map.get_ptr_mut(peer) {
            if !at.is_null() {
                copy(at, peer);
            }
            return p;
        }
    }
    let mut other = core::mem::MaybeUninit::<PeerKey>::uninit();
    let cgroup = peer.cgroup;
    store(other.as_mut_ptr(), other_key(cgroup, peer.dir));
    // SAFETY: written just above.
    let other = unsafe { other.assume_init_ref() };
    let mut p = map.get_ptr_mut(other);
    if p.is_none() {
        if make(map, other, &ZERO) {
            if let Some(r) = ledger.record(cgroup) {
                Ledger::count(r, STATS, 1);
            }
        }
        p = map.get_ptr_mut(other);
    }
    match p {
        Some(p) => {
            if !at.is_null() {
                copy(at, other);
            }
            p
        }
        None => {
            inc(dropped, drop);
            core::ptr::null_mut()
        }
    }
}

/// Adds `v` to word `w` of `p`, atomically (every CPU adds to the same entry).
#[inline(always)]
pub fn add(p: *mut PeerCounters, w: usize, v: u64) {
    if w < NUM_WORDS {
        // SAFETY: `p` points to a map value of NUM_WORDS aligned u64 words; `w` is in range.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((p as *mut u64).add(w), v) };
    }
}

/// Adds one to `key`'s count in `map` if it is there.
#[inline(always)]
fn bump<K>(map: &HashMap<K, u64>, key: &K) -> bool {
    match map.get_ptr_mut(key) {
        Some(p) => {
            // SAFETY: a map value of one u64; every CPU adds to it, atomically.
            unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1) };
            true
        }
        None => false,
    }
}

/// Counts one for `key` in `map` (a count by key): added if it is there,
/// else made (at 1) if its cgroup holds fewer than `limit` keys by `word`
/// of the ledger; whether it was counted.
#[inline(always)]
pub fn count_within<K>(map: &HashMap<K, u64>, ledger: &Ledger, cgroup: u64, word: usize, limit: u32, key: &K) -> bool {
    if bump(map, key) {
        return true;
    }
    let Some(r) = ledger.room(cgroup, word, limit) else { return false };
    if make(map, key, &1) {
        Ledger::count(r, word, 1);
        return true;
    }
    // Made by another CPU meanwhile, or the map full.
    bump(map, key)
}

/// Counts one for `key` in `map` whatever its cgroup holds (a key of its
/// other: a few per cgroup), counted in the ledger if made; whether it was
/// counted.
#[inline(always)]
pub fn count_exempt<K>(map: &HashMap<K, u64>, ledger: &Ledger, cgroup: u64, word: usize, key: &K) -> bool {
    if bump(map, key) {
        return true;
    }
    if make(map, key, &1) {
        if let Some(r) = ledger.record(cgroup) {
            Ledger::count(r, word, 1);
        }
        return true;
    }
    bump(map, key)
}

/// Records a latency of `ns` for the record `c` (as [`counters`] gave it;
/// its key in `key.peer`) in the latency map `lat`: one in its native
/// bucket (`key`, filled in), and in `c` its count (word `count`) and sum
/// (`LATENCY_NS`). A bucket the cgroup has no room for (`limits.lat_peers`)
/// goes to its other's, with the count and sum: `others` turns `key.peer`
/// into the other's key and finds its counters, as [`counters`] does (room
/// up to `limits.lat`); what neither can take is counted in slot `drop` of
/// `dropped`. The key is the caller's, so that it may keep it off the
/// stack.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn latency(
    others: impl FnOnce(&mut PeerKey) -> Option<*mut PeerCounters>,
    lat: &HashMap<LatKey, u64>,
    ledger: &Ledger,
    limits: &Limits,
    c: *mut PeerCounters,
    key: &mut LatKey,
    count: usize,
    ns: u64,
    dropped: &PerCpuArray<u64>,
    drop: u32,
) {
    key.slot = native_bucket(ns.max(1)) as u32;
    key.pad = 0;
    let other = is_other(&key.peer);
    let limit = if other { limits.lat } else { limits.lat_peers };
    if count_within(lat, ledger, key.peer.cgroup, LAT, limit, key) {
        add(c, count, 1);
        add(c, LATENCY_NS, ns);
        return;
    }
    if other {
        inc(dropped, drop);
        return;
    }
    let Some(oc) = others(&mut key.peer) else { return };
    if count_within(lat, ledger, key.peer.cgroup, LAT, limits.lat, key) {
        add(oc, count, 1);
        add(oc, LATENCY_NS, ns);
    } else {
        inc(dropped, drop);
    }
}
