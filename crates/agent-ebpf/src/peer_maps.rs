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

use crate::helpers::inc;

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
        let _ = self.made.insert(cgroup, NO_ENTRIES, NOEXIST);
        self.made.get_ptr_mut(cgroup)
    }

    /// The cgroup's record if it holds fewer than `limit` keys by `word`
    /// (then the caller may make one and [`Ledger::count`] it); None if it
    /// holds that many, or has no record and the ledger no room for one.
    #[inline(always)]
    pub fn room(&self, cgroup: u64, word: usize, limit: u32) -> Option<*mut Entries> {
        let p = self.record(cgroup)?;
        // SAFETY: a map value of WORDS u64; a plain read of one word others
        // add to atomically (a stale value errs by what they add meanwhile).
        let made = unsafe { (*p).words.get(word).copied().unwrap_or(0) };
        // SAFETY: a copy of the agent's value, which it replaces whole.
        let gone = unsafe { self.gone.get(cgroup) }.and_then(|g| g.words.get(word).copied()).unwrap_or(0);
        ledger::room(ledger::live(made, gone), limit).then_some(p)
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
    if let Some(p) = map.get_ptr_mut(peer) {
        return Some((p, *peer));
    }
    if !peer.is_other() && make_within(map, ledger, peer, limits.stats) {
        if let Some(p) = map.get_ptr_mut(peer) {
            return Some((p, *peer));
        }
    }
    let other = PeerKey::other(peer.cgroup, peer.dir);
    if let Some(p) = map.get_ptr_mut(other) {
        return Some((p, other));
    }
    if make(map, &other, &ZERO) {
        if let Some(r) = ledger.record(other.cgroup) {
            Ledger::count(r, STATS, 1);
        }
    }
    match map.get_ptr_mut(other) {
        Some(p) => Some((p, other)),
        None => {
            inc(dropped, drop);
            None
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

/// Records a latency of `ns` for the record `c` at key `at` (as
/// [`counters`] gave them) in the latency map `lat`: one in its native
/// bucket, and in `c` its count (word `count`) and sum (`LATENCY_NS`).
/// A bucket the cgroup has no room for (`limits.lat_peers`) goes to its
/// other's (of `stats`, room up to `limits.lat`), with the count and sum;
/// what neither can take is counted in slot `drop` of `dropped`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn latency(
    stats: &HashMap<PeerKey, PeerCounters>,
    lat: &HashMap<LatKey, u64>,
    ledger: &Ledger,
    limits: &Limits,
    c: *mut PeerCounters,
    at: &PeerKey,
    count: usize,
    ns: u64,
    dropped: &PerCpuArray<u64>,
    drop: u32,
) {
    let slot = native_bucket(ns.max(1)) as u32;
    let key = LatKey { peer: *at, slot, pad: 0 };
    let limit = if at.is_other() { limits.lat } else { limits.lat_peers };
    if count_within(lat, ledger, at.cgroup, LAT, limit, &key) {
        add(c, count, 1);
        add(c, LATENCY_NS, ns);
        return;
    }
    if at.is_other() {
        inc(dropped, drop);
        return;
    }
    let Some((oc, other)) = counters(stats, ledger, limits, &PeerKey::other(at.cgroup, at.dir), dropped, drop) else { return };
    let key = LatKey { peer: other, slot, pad: 0 };
    if count_within(lat, ledger, other.cgroup, LAT, limits.lat, &key) {
        add(oc, count, 1);
        add(oc, LATENCY_NS, ns);
    } else {
        inc(dropped, drop);
    }
}
