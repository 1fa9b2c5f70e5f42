//! `ebpf_dns`: DNS over UDP and TCP by cgroup and server, from two cgroup
//! socket-buffer programs on the cgroup v2 root (every socket of the node
//! passes them) and two socket-address programs on sendmsg beside them: queries by type as they leave, responses by rcode as they
//! arrive, matched to their query by socket, server and DNS id for the
//! latency. Queries never answered are found by the agent (an entry of
//! [`PENDING`] older than the timeout), which deletes the entry: whichever
//! of the agent and the response deletes it first counts it, once.
//!
//! Over TCP a connection's messages are followed by sequence number
//! ([`CONNS`]: where the next message starts, each way), so that a message
//! is read where it starts and nowhere else. The server of a query is the
//! address its socket asked for (the socket's own destination, or the
//! address given to sendmsg, seen by two cgroup socket-address programs,
//! [`SENT`]), which NAT below the socket does not change.
//!
//! What one cgroup may hold in the node-wide maps of waiting queries and
//! followed connections is bounded ([`PENDING_PER_CGROUP`],
//! [`CONNS_PER_CGROUP`]), counted per cgroup in the ledger that bounds its
//! share of the counting maps ([`MADE`], [`GONE`]; words [`LEDGER_PENDING`]
//! and [`LEDGER_CONNS`]).
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
/// Per-CPU counters of events not recorded: [`DROP_PENDING`], [`DROP_STATS`], [`DROP_LAT`], [`DROP_NAMES`],
/// [`DROP_CONNS`], [`DROP_STREAM`].
pub const DROPPED: &str = "DNS_DROPPED";
/// The per-cgroup ledger of the keys of [`STATS`], [`LAT`] and [`NAMES`]
/// (`crate::ledger`, words `STATS`, `LAT`, `AUX`), as `tcp_peers::MADE`,
/// and of the entries of [`PENDING`] and [`CONNS`] (words
/// [`LEDGER_PENDING`], [`LEDGER_CONNS`], and their freed words: the
/// programs delete those too), by the socket's own cgroup.
pub const MADE: &str = "DNS_MADE";
pub const GONE: &str = "DNS_GONE";
/// The per-cgroup limits (`ledger::Limits`; `aux`: failing names).
pub const LIMITS: &str = "DNS_LIMITS";

/// TCP connections to port 53 followed: socket cookie to [`Conn`].
pub const CONNS: &str = "DNS_CONNS";
/// The ledger's words ([`MADE`], [`GONE`]) of the entries of [`PENDING`]
/// and [`CONNS`] a cgroup holds.
pub const LEDGER_PENDING: usize = crate::ledger::AUX2;
pub const LEDGER_CONNS: usize = crate::ledger::AUX3;
/// Per-CPU scratch of the ingress program (the message's socket, a
/// response's keys), and of the egress program (a query's socket, key and
/// value; a slot per nested run, the depth of this CPU's runs in
/// [`OUT_DEPTH`]): off the stack, whose 512 bytes a call chain shares, and
/// out of the verifier's states.
pub const IN_SCRATCH: &str = "DNS_IN_SCRATCH";
pub const OUT_SCRATCH: &str = "DNS_OUT_SCRATCH";
pub const OUT_DEPTH: &str = "DNS_OUT_DEPTH";
/// The address an unconnected UDP socket last gave sendmsg for port 53:
/// socket cookie to a [`Sent`] (an LRU map; the egress program takes it).
pub const SENT: &str = "DNS_SENT";

pub const EGRESS: Program = Program { name: "dns_egress", hook: Hook::CgroupSkb(crate::program::SkbDirection::Egress) };
pub const INGRESS: Program = Program { name: "dns_ingress", hook: Hook::CgroupSkb(crate::program::SkbDirection::Ingress) };
pub const SENDMSG4: Program = Program { name: "dns_sendmsg4", hook: Hook::CgroupSockAddr(crate::program::SockAddrHook::UdpSendmsg4) };
pub const SENDMSG6: Program = Program { name: "dns_sendmsg6", hook: Hook::CgroupSockAddr(crate::program::SockAddrHook::UdpSendmsg6) };
pub const PROGRAMS: [Program; 4] = [EGRESS, INGRESS, SENDMSG4, SENDMSG6];

/// Queries waiting for an answer at once (the agent removes those older
/// than the timeout at each scrape).
pub const MAX_PENDING: u32 = 8192;
/// Entries of [`PENDING`] one cgroup may hold: a query of a cgroup holding
/// as many is counted but not timed ([`DROP_PENDING`]). The map is full
/// only when 16 cgroups hold as many each.
pub const PENDING_PER_CGROUP: u32 = 512;
/// TCP connections to port 53 followed at once.
pub const MAX_CONNS: u32 = 2048;
/// Connections one cgroup may have followed at once: its further ones are
/// not read ([`DROP_CONNS`]). The map is full only when 16 cgroups have as
/// many each.
pub const CONNS_PER_CGROUP: u32 = 128;
/// [`SENT`]'s entries: each lives from a sendmsg to its datagram's egress,
/// microseconds later (an LRU map, preallocated).
pub const MAX_SENT: u32 = 1024;
/// A followed connection without a segment either way for this long is
/// forgotten by the agent (one that ended without a FIN or RST seen, e.g.
/// connects never answered).
pub const CONN_IDLE_NS: u64 = 120_000_000_000;
/// Messages read in one segment at most (pipelined messages, GSO and GRO
/// super-segments); up to [`MAX_SKIPPED`] more are passed over by their
/// lengths alone (not read, [`DROP_STREAM`]), so that the stream keeps its
/// place; a segment with more still loses it.
pub const MAX_MESSAGES: u32 = 8;
pub const MAX_SKIPPED: u32 = 128;
/// Distinct (cgroup, server) pairs with counts in the kernel at once.
pub const MAX_SERVERS: u32 = 2048;
/// Distinct (cgroup, server, latency bucket) triples at once.
pub const MAX_LAT: u32 = 8192;

pub const DROP_PENDING: u32 = 0;
pub const DROP_STATS: u32 = 1;
pub const DROP_LAT: u32 = 2;
pub const DROP_NAMES: u32 = 3;
/// A TCP connection not followed (its cgroup's bound, or [`CONNS`] full).
pub const DROP_CONNS: u32 = 4;
/// A TCP message not read (its header split across two segments; passed
/// over, past [`MAX_MESSAGES`] in a segment), a connection's place lost
/// (a message started in a segment that arrived ahead of a lost one, or
/// more than [`MAX_SKIPPED`] more in a segment), or a query counted but not
/// timed because its connection's answers are not read.
pub const DROP_STREAM: u32 = 5;
pub const NUM_DROPS: u32 = 6;
/// Distinct (cgroup, rcode, name) triples of failing answers at once.
pub const MAX_NAMES: u32 = 1024;
/// Cgroups with keys in the maps at once (each holds one in [`STATS`] at
/// least, or entries of [`PENDING`] or [`CONNS`]): the ledger's size
/// ([`MADE`], [`GONE`]; the agent deletes a cgroup's records once it holds
/// nothing). Full, a new cgroup's queries are counted, not timed, and its
/// connections not followed.
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

/// A query waiting, by the socket that sent it, the server its answer
/// will come from and its id (a resolver may send one id to several
/// servers at once from one socket, as musl's does).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    /// `bpf_get_socket_cookie` of the sending socket.
    pub cookie: u64,
    /// The server's address (IPv4 as `::ffff:a.b.c.d`).
    pub server: [u8; 16],
    pub id: u16,
    pub pad: [u8; 6],
}

/// [`Pending::kind`]: a query waiting under the address its socket asked for.
pub const PENDING_QUERY: u8 = 0;
/// A query whose datagram left for another address than its socket asked
/// for (NAT below the socket, or a socket load balancer after the agent's
/// sendmsg program): it waits under both, this entry holding the other's
/// server in [`Pending::other`].
pub const PENDING_WITH_ALIAS: u8 = 1;
/// The second entry of such a query, under the datagram's destination;
/// [`Pending::other`] is the first entry's server. Deleted with it, never
/// counted on its own.
pub const PENDING_ALIAS: u8 = 2;

/// What the response is counted under, when the query left, the cgroup
/// whose bound it takes ([`LEDGER_PENDING`]), and its other entry, if any.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub peer: PeerKey,
    pub start_ns: u64,
    /// The sending socket's cgroup (whether or not counts are attributed).
    pub owner: u64,
    pub other: [u8; 16],
    /// [`PENDING_QUERY`], [`PENDING_WITH_ALIAS`] or [`PENDING_ALIAS`].
    pub kind: u8,
    pub pad: [u8; 7],
}

/// Where a TCP stream (one direction of a connection) is: the sequence
/// number of the next byte to read (`next`) and what it is ([`STAGE_LEN`]:
/// a message's two-byte length; [`STAGE_LEN_LOW`]: its second byte, the
/// first in `hi`; [`STAGE_MESSAGE`]: a message of `len` bytes), or
/// [`STAGE_UNKNOWN`] (the start not seen yet) and [`STAGE_LOST`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    pub next: u32,
    pub len: u16,
    pub stage: u8,
    pub hi: u8,
}

pub const STAGE_UNKNOWN: u8 = 0;
pub const STAGE_LEN: u8 = 1;
pub const STAGE_LEN_LOW: u8 = 2;
pub const STAGE_MESSAGE: u8 = 3;
pub const STAGE_LOST: u8 = 4;

/// A followed TCP connection to port 53 (by its socket's cookie): its
/// cgroup (for the bound), the last segment either way, where its queries
/// (`out`) and answers (`inb`) are, and the FINs seen each way.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conn {
    pub owner: u64,
    pub last_ns: u64,
    pub out: Stream,
    pub inb: Stream,
    pub fin_out: u8,
    pub fin_in: u8,
    pub pad: [u8; 6],
}

/// The address an unconnected UDP socket gave sendmsg (IPv4 as
/// `::ffff:a.b.c.d`; aligned as an 8-byte word, so that programs copy it
/// by words).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    pub addr: [u8; 16],
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

crate::pod!(PendingKey, Pending, Config, NameKey, Stream, Conn, Sent);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<PendingKey>(), 32);
        assert_eq!(core::mem::size_of::<Pending>(), 72);
        assert_eq!(core::mem::size_of::<Stream>(), 8);
        assert_eq!(core::mem::size_of::<Conn>(), 40);
        assert_eq!(core::mem::size_of::<Sent>(), 16);
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
