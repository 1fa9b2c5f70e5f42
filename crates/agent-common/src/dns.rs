//! `ebpf_dns`: DNS over UDP and TCP by cgroup and server, from two cgroup
//! socket-buffer programs on the cgroup v2 root (every socket of the node
//! passes them): queries by type as they leave, responses by rcode as they
//! arrive, matched to their query by socket and DNS id for the latency.
//! Queries never answered are found by the agent (an entry of [`PENDING`]
//! older than the timeout), which deletes the entry: whichever of the
//! agent and the response deletes it first counts it, once.
//!
//! The counts use `tcp_peers`' key and record ([`PeerKey`] with the server
//! address, port 53 and the transport ([`TRANSPORT_UDP`], [`TRANSPORT_TCP`]) as `dir`; [`PeerCounters`] with
//! the words below), so that the agent folds and bounds them the same way.

use crate::program::{Hook, Program};
#[cfg(doc)]
use crate::tcp_peers::PeerCounters;
use crate::tcp_peers::PeerKey;

pub const CONFIG: &str = "DNS_CONFIG";
/// Queries waiting for their response: [`PendingKey`] to [`Pending`].
pub const PENDING: &str = "DNS_PENDING";
/// [`PeerKey`] to [`PeerCounters`], cumulative (as `tcp_peers::STATS`).
pub const STATS: &str = "DNS_STATS";
/// `tcp_peers::LatKey` to a count: the non-empty native buckets of each
/// server's response latency.
pub const LAT: &str = "DNS_LAT";
/// Failing answers by name (opt-in): [`NameKey`] to a count, cumulative.
pub const NAMES: &str = "DNS_NAMES";
/// Per-CPU scratch for the [`NameKey`] being built (too big for the stack).
pub const NAME_SCRATCH: &str = "DNS_NAME_SCRATCH";
/// Per-CPU counters of events not recorded: [`DROP_PENDING`], [`DROP_STATS`], [`DROP_LAT`], [`DROP_NAMES`].
pub const DROPPED: &str = "DNS_DROPPED";
/// The per-cgroup ledger of the keys of [`STATS`], [`LAT`] and [`NAMES`]
/// (`crate::ledger`, words `STATS`, `LAT`, `AUX`), as `tcp_peers::MADE`.
pub const MADE: &str = "DNS_MADE";
pub const GONE: &str = "DNS_GONE";
/// The per-cgroup limits (`ledger::Limits`; `aux`: failing names).
pub const LIMITS: &str = "DNS_LIMITS";

pub const EGRESS: Program = Program { name: "dns_egress", hook: Hook::CgroupSkb(crate::program::SkbDirection::Egress) };
pub const INGRESS: Program = Program { name: "dns_ingress", hook: Hook::CgroupSkb(crate::program::SkbDirection::Ingress) };
pub const PROGRAMS: [Program; 2] = [EGRESS, INGRESS];

/// Queries waiting for an answer at once (the agent removes those older
/// than the timeout at each scrape).
pub const MAX_PENDING: u32 = 8192;
/// Distinct (cgroup, server) pairs with counts in the kernel at once.
pub const MAX_SERVERS: u32 = 2048;
/// Distinct (cgroup, server, latency bucket) triples at once.
pub const MAX_LAT: u32 = 8192;

pub const DROP_PENDING: u32 = 0;
pub const DROP_STATS: u32 = 1;
pub const DROP_LAT: u32 = 2;
pub const DROP_NAMES: u32 = 3;
pub const NUM_DROPS: u32 = 4;
/// Distinct (cgroup, rcode, name) triples of failing answers at once.
pub const MAX_NAMES: u32 = 1024;
/// Cgroups with keys in the maps at once (each holds one in [`STATS`] at
/// least): the ledger's size.
pub const MAX_CGROUPS: u32 = MAX_SERVERS;
/// One cgroup holds at most this share of [`NAMES`] (as of the others).
pub const NAMES_SHARE: u32 = 8;
/// Bytes of a name kept (wire format: length-prefixed labels, then 0);
/// longer names are kept cut.
pub const NAME_BYTES: usize = 128;

/// The port DNS servers listen on.
pub const PORT: u16 = 53;
/// [`PeerKey::dir`] of the DNS counts: the transport.
pub const TRANSPORT_UDP: u8 = 0;
pub const TRANSPORT_TCP: u8 = 1;

/// Words of the counters: queries by type (A, AAAA, SRV, PTR, other),
/// responses by rcode (NOERROR, NXDOMAIN, SERVFAIL, REFUSED, other),
/// responses truncated (TC set), queries sent again with the id of one
/// waiting (retransmits: not counted as queries again), responses with no
/// query waiting (late: after the timeout, or to a query sent before the
/// agent started), the sum of latencies of matched responses (their count
/// is the sum of the response words less `LATE`), and queries never
/// answered within the timeout (counted by the agent, in a record of its
/// own).
pub const Q_A: usize = 0;
pub const Q_AAAA: usize = 1;
pub const Q_SRV: usize = 2;
pub const Q_PTR: usize = 3;
pub const Q_OTHER: usize = 4;
pub const R_NOERROR: usize = 5;
pub const R_NXDOMAIN: usize = 6;
pub const R_SERVFAIL: usize = 7;
pub const R_REFUSED: usize = 8;
pub const R_OTHER: usize = 9;
pub const TRUNCATED: usize = 10;
pub const RETRANSMITS: usize = 11;
pub const LATE: usize = 12;
pub const LATENCY_NS: usize = 13;
pub const TIMEOUTS: usize = 14;
/// Matched responses (the latency histogram's count).
pub const MATCHED: usize = 15;
// The counters' record holds every word.
const _: () = assert!(MATCHED < crate::tcp_peers::NUM_WORDS);

/// The query word of a query type.
#[inline(always)]
pub fn qtype_word(qtype: u16) -> usize {
    match qtype {
        1 => Q_A,
        28 => Q_AAAA,
        33 => Q_SRV,
        12 => Q_PTR,
        _ => Q_OTHER,
    }
}

/// The response word of an rcode (the low 4 bits of the header's flags).
#[inline(always)]
pub fn rcode_word(rcode: u16) -> usize {
    match rcode {
        0 => R_NOERROR,
        3 => R_NXDOMAIN,
        2 => R_SERVFAIL,
        5 => R_REFUSED,
        _ => R_OTHER,
    }
}

/// The header's flags: QR (a response), TC (truncated), and the rcode.
pub const FLAG_QR: u16 = 0x8000;
pub const FLAG_TC: u16 = 0x0200;
pub const RCODE_MASK: u16 = 0x000f;

/// Labels of a question's name walked at most (a name has at most 127).
pub const MAX_LABELS: u32 = 64;

/// A query waiting, by the socket that sent it and its id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    /// `bpf_get_socket_cookie` of the sending socket.
    pub cookie: u64,
    pub id: u16,
    pub pad: [u8; 6],
}

/// What the response is counted under, and when the query left.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub peer: PeerKey,
    pub start_ns: u64,
}

/// The programs' settings; `attribute` is 0 when sockets are not
/// attributed to cgroups (every count under cgroup 0); `names` is not 0
/// when failing answers are counted by name ([`NAMES`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub attribute: u32,
    pub names: u32,
}

impl Config {
    pub const DEFAULT: Config = Config { attribute: 0, names: 0 };
}

/// A failing answer's cgroup, rcode and question name (wire format, the
/// rest zero); `len` is the name's length with its final 0, or 0 when it
/// is longer than [`NAME_BYTES`] (kept cut).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NameKey {
    pub cgroup: u64,
    pub rcode: u8,
    pub len: u8,
    pub pad: [u8; 6],
    pub name: [u8; NAME_BYTES],
}

impl NameKey {
    pub const ZERO: NameKey = NameKey { cgroup: 0, rcode: 0, len: 0, pad: [0; 6], name: [0; NAME_BYTES] };

    /// Whether this is its cgroup's *other* name for its rcode: the names
    /// it has no key of their own for (beyond its limit,
    /// `crate::ledger`), counted together. No name read has it: a cut
    /// name (`len` 0) starts with a label's length, never 0.
    #[inline(always)]
    pub fn is_other(&self) -> bool {
        self.len == 0 && self.name[0] == 0
    }
}

/// Whether an rcode's answers are counted by name: NXDOMAIN, SERVFAIL, REFUSED.
#[inline(always)]
pub fn failing(rcode: u16) -> bool {
    matches!(rcode, 2 | 3 | 5)
}

crate::pod!(PendingKey, Pending, Config, NameKey);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<PendingKey>(), 16);
        assert_eq!(core::mem::size_of::<Pending>(), 40);
        assert_eq!(core::mem::size_of::<Config>(), 8);
        assert_eq!(core::mem::size_of::<NameKey>(), 16 + NAME_BYTES);
    }

    #[test]
    fn other_names_are_no_names() {
        let mut k = NameKey::ZERO;
        k.cgroup = 7;
        k.rcode = 3;
        assert!(k.is_other());
        k.name[..2].copy_from_slice(&[0, 0]);
        k.len = 1;
        assert!(!k.is_other(), "the root");
        k.name[..3].copy_from_slice(&[63, b'a', b'a']);
        k.len = 0;
        assert!(!k.is_other(), "a name cut");
    }

    #[test]
    fn types_and_rcodes_have_their_words() {
        assert_eq!([qtype_word(1), qtype_word(28), qtype_word(33), qtype_word(12), qtype_word(16)], [Q_A, Q_AAAA, Q_SRV, Q_PTR, Q_OTHER]);
        assert_eq!(
            [rcode_word(0), rcode_word(3), rcode_word(2), rcode_word(5), rcode_word(1)],
            [R_NOERROR, R_NXDOMAIN, R_SERVFAIL, R_REFUSED, R_OTHER]
        );
    }
}
