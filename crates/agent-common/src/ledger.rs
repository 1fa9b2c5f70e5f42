//! Per-cgroup bounds on the node-wide maps of the probes that count by
//! (cgroup, peer) (`tcp_peers`, `dns`), so that one cgroup cannot fill a
//! map and blind the others.
//!
//! Each probe keeps a ledger of two hash maps keyed by cgroup v2 id, one
//! word per bounded map ([`STATS`], [`LAT`], [`AUX`], [`AUX2`], [`AUX3`]):
//!
//! - **made**, written by the programs only: the keys they made for the
//!   cgroup (an atomic add once an insert succeeded), and, for a map whose
//!   keys the programs delete themselves (`tcp_peers`' followed sockets,
//!   `dns`'s waiting queries and followed connections), the keys they
//!   deleted, in a word of its own ([`freed`]);
//! - **gone**, written by the agent only: the cgroup's keys no longer in
//!   the maps, as the agent last reckoned them: what *made* said before it
//!   read the maps, less what *freed* said after, less the keys it found
//!   there and kept.
//!
//! A cgroup holds `made - freed - gone` keys ([`live`]); a program makes a
//! new key for one of its peers only while that is below the cgroup's
//! limit ([`Limits`]), and beyond counts the event in the cgroup's own
//! *other* record (`tcp_peers::PeerKey::other`), or not at all (a query
//! not timed, a connection not followed). The agent reckons *gone* again
//! at every scrape from what it reads, so an error (an add lost to the
//! agent deleting an idle cgroup's record as a program made a key) lasts
//! until its next scrape, never longer. Between scrapes the count only
//! errs high: a key made or deleted while the agent read counts in both
//! what it read and what the programs counted since, and one deleted by
//! the agent after it read *made* still counts. That is why deletions
//! have a word apart, read after the maps: in the same word as the adds
//! (one less), a key deleted by a program between the agent's read of
//! *made* and its read of the map would count neither in *made* nor in
//! what it kept, so the cgroup would count one key fewer than it holds
//! until the next scrape, and could pass its limit by as many (a busy
//! resolver's answers during the read: tens). Two CPUs making keys for
//! one cgroup at the same instant may both pass the check: the limit can
//! be passed by one key per CPU doing so.

/// Words of [`Entries`]: the probe's stats map, its latency map, and up to
/// three maps of its own (`tcp_peers`: the followed sockets; `dns`: the
/// failing names, the waiting queries, the followed connections); then
/// the keys the programs deleted of each of those three ([`freed`]).
pub const STATS: usize = 0;
pub const LAT: usize = 1;
pub const AUX: usize = 2;
pub const AUX2: usize = 3;
pub const AUX3: usize = 4;
/// The words of maps, counted up as keys are made (and [`freed`]): the
/// agent's reckoning of *gone* is for these.
pub const COUNTED: usize = 5;
pub const WORDS: usize = 8;

/// The word of the keys the programs deleted of a map of the probe's own
/// (`AUX`, `AUX2`, `AUX3`); None for the stats and latency maps, whose
/// keys only the agent deletes.
#[inline(always)]
pub const fn freed(word: usize) -> Option<usize> {
    if word >= AUX && word < COUNTED {
        Some(word + COUNTED - AUX)
    } else {
        None
    }
}

/// A cgroup's keys, by map ([`STATS`], [`LAT`], [`AUX`], [`AUX2`],
/// [`AUX3`], and the [`freed`] words): made (the programs' map) or gone
/// (the agent's, whose freed words are 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    pub words: [u64; WORDS],
}

impl Entries {
    pub const ZERO: Entries = Entries { words: [0; WORDS] };

    /// The keys made by word `word`, less those the programs deleted.
    #[inline(always)]
    pub fn net(&self, word: usize) -> u64 {
        let made = self.words.get(word).copied().unwrap_or(0);
        let freed = freed(word).and_then(|f| self.words.get(f).copied()).unwrap_or(0);
        made.wrapping_sub(freed)
    }
}

/// The most keys one cgroup may hold: in the stats map for its peers (its
/// other records, one per direction, are made whatever the count), in the
/// latency map for its peers' buckets (`lat_peers`) and for its other's
/// (`lat`, the rest kept for those), and in the probe's third map ([`AUX`];
/// the limits of a fourth and fifth are the probe's constants,
/// `dns::PENDING_PER_CGROUP` and `dns::CONNS_PER_CGROUP`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub stats: u32,
    pub lat_peers: u32,
    pub lat: u32,
    pub aux: u32,
}

impl Limits {
    /// Limits for maps of `stats`, `lat` and `aux` entries: an eighth of
    /// the stats and latency maps per cgroup (of the latency map's, the
    /// last quarter kept for the cgroup's other), so that it takes at least
    /// eight cgroups at their limit to fill one, and a `1/aux_share` of the
    /// third; without attribution (every count under cgroup 0) the whole
    /// maps.
    pub const fn per_cgroup(attribute: bool, stats: u32, lat: u32, aux: u32, aux_share: u32) -> Limits {
        if !attribute {
            return Limits { stats, lat_peers: lat, lat, aux };
        }
        let lat_cg = lat / 8;
        Limits { stats: stats / 8, lat_peers: lat_cg - lat_cg / 4, lat: lat_cg, aux: aux / if aux_share == 0 { 1 } else { aux_share } }
    }

    /// Every key allowed (a placeholder the agent overwrites at load).
    pub const UNBOUNDED: Limits = Limits { stats: u32::MAX, lat_peers: u32::MAX, lat: u32::MAX, aux: u32::MAX };
}

/// The keys a cgroup holds by one word of its ledger: `net - gone`, `net`
/// being what it made less what the programs deleted ([`Entries::net`]),
/// signed (below 0 when the agent's reckoning caught a lost add; none
/// held).
#[inline(always)]
pub fn live(net: u64, gone: u64) -> i64 {
    net.wrapping_sub(gone) as i64
}

/// Whether a cgroup holding `live` keys may make one more under `limit`.
#[inline(always)]
pub fn room(live: i64, limit: u32) -> bool {
    live < limit as i64
}

crate::pod!(Entries, Limits);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<Entries>(), 8 * WORDS);
        assert_eq!(core::mem::size_of::<Limits>(), 16);
    }

    #[test]
    fn the_maps_programs_delete_from_have_a_word_of_deletions_each() {
        assert_eq!([freed(STATS), freed(LAT)], [None, None]);
        assert_eq!([freed(AUX), freed(AUX2), freed(AUX3)], [Some(5), Some(6), Some(7)]);
        assert_eq!(freed(COUNTED), None);
        let mut e = Entries::ZERO;
        e.words[AUX2] = 10;
        e.words[6] = 3;
        e.words[STATS] = 4;
        assert_eq!((e.net(AUX2), e.net(STATS), e.net(AUX3)), (7, 4, 0));
    }

    #[test]
    fn a_cgroup_gets_a_share_of_each_map() {
        let l = Limits::per_cgroup(true, 4096, 8192, 16384, 4);
        assert_eq!(l, Limits { stats: 512, lat_peers: 768, lat: 1024, aux: 4096 });
        assert_eq!(Limits::per_cgroup(true, 2048, 8192, 1024, 8).aux, 128);
        assert_eq!(Limits::per_cgroup(true, 2048, 8192, 1024, 0).aux, 1024);
        // Without attribution there is one cgroup, the node's.
        assert_eq!(Limits::per_cgroup(false, 4096, 8192, 16384, 4), Limits { stats: 4096, lat_peers: 8192, lat: 8192, aux: 16384 });
    }

    #[test]
    fn live_keys_survive_wrapping_and_lost_adds() {
        assert_eq!(live(10, 4), 6);
        // The agent reckoned gone as made - kept with made behind (an add lost
        // as the record was deleted): gone wraps, live is still right.
        let gone = 0u64.wrapping_sub(3);
        assert_eq!(live(0, gone), 3);
        assert_eq!(live(2, gone), 5);
        // A key removed whose add was lost: below 0, and room.
        assert_eq!(live(u64::MAX, 0), -1);
        assert!(room(-1, 1));
        assert!(room(511, 512));
        assert!(!room(512, 512));
        assert!(room(i64::from(u32::MAX) - 1, u32::MAX));
    }
}
