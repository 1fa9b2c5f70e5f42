//! Counting by (cgroup, peer) in hash maps every CPU adds to: the record of
//! counter words (`PeerCounters`) made on first use, a word added to
//! atomically, and counts by key (latency buckets, names). Shared by
//! `tcp_peers` and `dns`, whose maps are their own.

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use agent_common::tcp_peers::{PeerCounters, PeerKey, NUM_WORDS};
use aya_ebpf::maps::{HashMap, PerCpuArray};

use crate::helpers::inc;

/// Zeroed counters in read-only data, to create map entries with.
static ZERO: PeerCounters = PeerCounters::ZERO;

/// The counters of `peer` in `map`, made first if need be (BPF_NOEXIST:
/// another CPU may make them meanwhile); a full map counts in slot `drop`
/// of `dropped`.
#[inline(always)]
pub fn counters(map: &HashMap<PeerKey, PeerCounters>, peer: &PeerKey, dropped: &PerCpuArray<u64>, drop: u32) -> Option<*mut PeerCounters> {
    if let Some(p) = map.get_ptr_mut(peer) {
        return Some(p);
    }
    let _ = map.insert(peer, ZERO, 1);
    let p = map.get_ptr_mut(peer);
    if p.is_none() {
        inc(dropped, drop);
    }
    p
}

/// Adds `v` to word `w` of `p`, atomically (every CPU adds to the same entry).
#[inline(always)]
pub fn add(p: *mut PeerCounters, w: usize, v: u64) {
    if w < NUM_WORDS {
        // SAFETY: `p` points to a map value of NUM_WORDS aligned u64 words; `w` is in range.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>((p as *mut u64).add(w), v) };
    }
}

/// Adds one to `key`'s count in `map`, made first if need be; a full map
/// counts in slot `drop` of `dropped`.
#[inline(always)]
pub fn count<K>(map: &HashMap<K, u64>, key: &K, dropped: &PerCpuArray<u64>, drop: u32) {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: a map value of one u64; every CPU adds to it, atomically.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1) };
        return;
    }
    // BPF_NOEXIST: if another CPU made it meanwhile, add to theirs.
    if map.insert(key, 1, 1).is_err() {
        match map.get_ptr_mut(key) {
            // SAFETY: as above.
            Some(p) => unsafe {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1);
            },
            None => inc(dropped, drop),
        }
    }
}
