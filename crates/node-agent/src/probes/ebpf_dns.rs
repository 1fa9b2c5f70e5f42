//! `ebpf_dns`: DNS over UDP and TCP by pod and server, from two cgroup
//! socket-buffer programs on the node's cgroup v2 root (every socket of
//! the node, any network namespace), and two on sendmsg beside them (the
//! address an unconnected UDP socket gives for port 53): queries by type (A, AAAA, SRV, PTR,
//! other), responses by rcode (NOERROR, NXDOMAIN, SERVFAIL, REFUSED,
//! other), responses truncated, queries retransmitted (sent again with the
//! id of one still waiting, to the same server), queries not answered within
//! `--collector.ebpf_dns.timeout`, responses that came later or matched no
//! query (late), and the latency from query to response (native histogram,
//! schema 3).
//!
//! The server is named as `ebpf_tcp_peers` names peers (`pods::peers`): a
//! Service by its ClusterIP (`server_kind="service"`, `server="kube-system/kube-dns"`),
//! a pod of this node, loopback (`local`), else `external` (the address).
//! No domain is exported.
//!
//! Over TCP, a connection is followed from its SYN by sequence number, and
//! each message read where it starts (answers of many segments once,
//! pipelined messages each). The server is the address the socket asked
//! for (before any NAT below it: kube-proxy's DNAT of a host-network
//! socket's query to a ClusterIP), and a query waits by socket, server and
//! id (a resolver may ask several servers with one id).
//!
//! Per cgroup, the kernel holds at most `PENDING_PER_CGROUP` waiting
//! queries and `CONNS_PER_CGROUP` followed connections, counted in the
//! same ledger as its share of the counting maps: the agent, which reads
//! both maps whole at each scrape (and deletes timed-out queries and idle
//! connections), reckons what each cgroup holds there as it does for the
//! other maps.
//!
//! Cardinality: per pod (and for the host, `namespace=""`) and transport,
//! at most `--collector.ebpf_dns.max-servers` servers (default 4) with
//! series of their own, the rest summed into `server_kind="other"`: with
//! 250 pods and the default, at most 250 × 2 × 5 = 2,500 label sets, in 6
//! counter families (queries × 5 types, responses × 5 rcodes) and one
//! histogram.
//!
//! In the kernel, each cgroup has a share of the maps (an eighth of the
//! records, latency buckets and failing names: `agent_common::ledger`, kept
//! with `ebpf::ledger`): a new server beyond is counted in the cgroup's own
//! other record (`server_kind="other"`), a name in its other name.
//!
//! Needs CAP_NET_ADMIN to load the programs (the agent drops it after),
//! and a cgroup v2 hierarchy (on cgroup v1 alone it is down).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use agent_common::dns::{
    Conn, NameKey, Pending, PendingKey, CONNS, CONN_IDLE_NS, DROPPED, GONE, LAT, LATE, LATENCY_NS, LEDGER_CONNS, LEDGER_PENDING, LIMITS,
    MADE, MATCHED, MAX_LAT, MAX_NAMES, NAMES, NAMES_SHARE, NUM_DROPS, PENDING, PENDING_ALIAS, PROGRAMS, Q_A, Q_AAAA, Q_OTHER, Q_PTR, Q_SRV,
    RETRANSMITS, R_NOERROR, R_NXDOMAIN, R_OTHER, R_REFUSED, R_SERVFAIL, STATS, TIMEOUTS, TRANSPORT_TCP, TRUNCATED,
};
use agent_common::ledger::{self, Entries, Limits};
use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};
use agent_common::NATIVE_OFFSET;
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::{self, Flags, ParsedFlag};
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::ledger::{self as book, Ledger};
use crate::ebpf::maps::{self, MapError, NativeSum};
use crate::ebpf::{Globals, Probe};
use crate::pods::peers::{Counts, Label, Owner, Peers};
use crate::pods::resolve::Resolver;

pub const TIMEOUT: ParsedFlag<Duration> = ParsedFlag {
    name: "collector.ebpf_dns.timeout",
    value_name: "DURATION",
    default: "5s",
    env: None,
    help: "A DNS query not answered within this time is counted as timed out (found at the next scrape), e.g. 2s, 5s, 1m.",
    parse: parse_timeout,
};

pub const MAX_SERVERS: ParsedFlag<usize> = ParsedFlag {
    name: "collector.ebpf_dns.max-servers",
    value_name: "N",
    default: "4",
    env: None,
    help: "DNS servers with series of their own per pod; later ones are summed into server_kind=\"other\".",
    parse: parse_max,
};

pub const FAILING_DOMAINS: ParsedFlag<usize> = ParsedFlag {
    name: "collector.ebpf_dns.failing-domains",
    value_name: "N",
    default: "0",
    env: None,
    help: "Count NXDOMAIN, SERVFAIL and REFUSED answers by question name too: at most N names per pod and rcode (the most frequent first), the rest summed into domain=\"\" (0: off).",
    parse: parse_domains,
};

fn parse_domains(s: &str) -> Result<usize, String> {
    super::bounds::count(s, 0, 100, "names (0: off)")
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    super::bounds::duration(s, Duration::from_secs(1), Duration::from_secs(600), "1s to 10m", "2s, 5s, 1m")
}

fn parse_max(s: &str) -> Result<usize, String> {
    super::bounds::count(s, 1, 100, "servers")
}

pub fn args() -> Vec<Arg> {
    flags::args(&[&TIMEOUT, &MAX_SERVERS, &FAILING_DOMAINS])
}

/// Queries are counted by cgroup when the pods are known (a Kubernetes API).
pub fn globals(_: &crate::ebpf::kernel::Kernel, ctx: &mut Context, g: &mut Globals) {
    let attribute = u32::from(ctx.kube);
    g.set(agent_common::dns::CONFIG, &agent_common::dns::Config { attribute, names: u32::from(ctx.dns_names) });
    g.set(LIMITS, &Limits::per_cgroup(ctx.kube, agent_common::dns::MAX_SERVERS, MAX_LAT, MAX_NAMES, NAMES_SHARE));
}

/// [`PeerKey::dir`] of the agent's own records of timeouts, beside the
/// kernel's of the same cgroup and server (one series: [`Peers::labelled_by`]).
const TIMEOUT_RECORD: u8 = 0x80;

pub struct Collector {
    probe: Probe,
    resolver: Resolver,
    peers: Peers,
    timeout: Duration,
    /// Timeouts counted since the record was last folded, by the kernel
    /// key (with [`TIMEOUT_RECORD`]): the agent's own "map", folded and
    /// deleted as the kernel's are.
    timeouts: HashMap<PeerKey, u64>,
    /// Failing answers by name, when asked for: each (cgroup, rcode, name)
    /// as a key of its own whose address is a digest of the name.
    names: Option<Peers>,
    /// The per-cgroup ledger's side the agent writes.
    ledger: Ledger,
    /// Cgroups whose counts were dropped, no pod being known for them.
    unattributed: u64,
}

/// A question name in wire format (`len` bytes with the final 0, or 0 when
/// cut) in presentation form: labels joined by dots, bytes other than
/// letters, digits, `-` and `_` as `\DDD`, `.` for the root; a cut name
/// ends with `...`.
pub fn decode_name(name: &[u8], len: u8) -> String {
    let end = if len == 0 { name.len() } else { (len as usize).min(name.len()) };
    let mut out = String::new();
    let mut i = 0;
    while i < end {
        let n = name[i] as usize;
        if n == 0 {
            break;
        }
        if !out.is_empty() {
            out.push('.');
        }
        for &b in name.get(i + 1..(i + 1 + n).min(end)).unwrap_or_default() {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\{b:03}"));
            }
        }
        i += 1 + n;
    }
    if len == 0 {
        out.push_str("...");
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

/// A failing answer's name as a key of [`Peers`]: its address a digest of
/// the rcode and name, its direction the rcode; the kernel's other name
/// of a cgroup and rcode is the cgroup's other record for that rcode.
fn name_key(k: &NameKey) -> PeerKey {
    use std::hash::{Hash, Hasher};
    if k.is_other() {
        return PeerKey::other(k.cgroup, k.rcode);
    }
    let mut addr = [0u8; 16];
    for (i, half) in addr.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i, k.rcode, k.len, &k.name[..]).hash(&mut h);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    PeerKey { cgroup: k.cgroup, addr, port: 0, dir: k.rcode, pad: [0; 5] }
}

fn rcode_name(rcode: u8) -> &'static str {
    match rcode {
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        5 => "REFUSED",
        _ => "other",
    }
}

/// How busy a server is: the queries sent to it.
fn queries(c: &Counts) -> u64 {
    c.words[Q_A..=Q_OTHER].iter().fold(0, |a, b| a.wrapping_add(*b))
}

pub fn build(f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let max = MAX_SERVERS.get(f)?;
    let timeout = TIMEOUT.get(f)?;
    let grace = super::ebpf_pods::GRACE_PERIOD.get(f)?;
    let resolver = ctx.resolver(grace)?;
    let probe = match crate::pods::cgroup::v2_root(&p.sysfs) {
        Some(_) => ctx.attach(&PROGRAMS),
        None => ctx.down(&PROGRAMS, "no cgroup v2 hierarchy mounted (cgroup socket-buffer and sendmsg programs attach to one)"),
    };
    Ok(Box::new(Collector {
        probe,
        resolver,
        peers: Peers::new(max, grace).ranked_by(queries).labelled_by(|d| d & !TIMEOUT_RECORD),
        timeout,
        timeouts: HashMap::new(),
        names: match FAILING_DOMAINS.get(f)? {
            0 => None,
            n => Some(Peers::new(n, grace).ranked_by(|c| c.words[0])),
        },
        ledger: Ledger::default(),
        unattributed: 0,
    }))
}

/// Nanoseconds since boot on the clock the programs read (CLOCK_MONOTONIC).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `ts`, which outlives the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// What one pass over the kernel's maps of waiting queries and followed
/// connections found: the queries timed out (their counting entries
/// deleted here), those still waiting, the connections followed, and the
/// entries of both maps each cgroup holds (those read and not deleted, for
/// the ledger).
struct Swept {
    timed_out: Vec<PeerKey>,
    in_flight: usize,
    conns: usize,
    kept: HashMap<u64, Entries>,
}

/// Deletes the queries waiting longer than `timeout` (those deleted here,
/// not by a response meanwhile, are timeouts, an alias entry never) and
/// the connections idle for `CONN_IDLE_NS`; the rest is what each cgroup
/// holds, by the socket's own cgroup (`owner`: the bounds are kept by it,
/// whether or not counts are attributed).
fn reap(shared: &crate::ebpf::loader::Shared, ebpf: &mut aya::Ebpf, timeout: Duration) -> Result<Swept, MapError> {
    let now = monotonic_ns();
    let cutoff = now.saturating_sub(timeout.as_nanos() as u64);
    let waiting: Vec<(PendingKey, Pending)> = maps::hash_entries(ebpf, PENDING)?;
    let conns: Vec<(u64, Conn)> = maps::hash_entries(ebpf, CONNS)?;
    let mut timed_out = Vec::new();
    {
        let mut m: aya::maps::HashMap<_, PendingKey, Pending> =
            aya::maps::HashMap::try_from(ebpf.map_mut(PENDING).ok_or(MapError::Missing(PENDING))?)
                .map_err(|source| MapError::Map { map: PENDING, source })?;
        for (k, v) in waiting.iter().filter(|(_, v)| v.start_ns <= cutoff) {
            if m.remove(k).is_ok() && v.kind != PENDING_ALIAS {
                timed_out.push(v.peer);
            }
        }
    }
    let in_flight = waiting.iter().filter(|(_, v)| v.start_ns > cutoff && v.kind != PENDING_ALIAS).count();
    let idle_since = now.saturating_sub(CONN_IDLE_NS);
    {
        let mut m: aya::maps::HashMap<_, u64, Conn> = aya::maps::HashMap::try_from(ebpf.map_mut(CONNS).ok_or(MapError::Missing(CONNS))?)
            .map_err(|source| MapError::Map { map: CONNS, source })?;
        for (k, _) in conns.iter().filter(|(_, c)| c.last_ns <= idle_since) {
            let _ = m.remove(k);
        }
    }
    // What is left of each: deleted here, or (a response, a RST) by a
    // program meanwhile, an entry is no longer held.
    let mut kept = HashMap::new();
    book::count(&mut kept, LEDGER_PENDING, waiting.iter().filter(|(_, v)| v.start_ns > cutoff), |(_, v)| v.owner);
    book::count(&mut kept, LEDGER_CONNS, conns.iter().filter(|(_, c)| c.last_ns > idle_since), |(_, c)| c.owner);
    // Read whole: the map's figure takes this count, not a walk of its own.
    shared.note_entries(CONNS, conns.len());
    Ok(Swept { timed_out, in_flight, conns: conns.len(), kept })
}

type Read = (Vec<(PeerKey, PeerCounters)>, Vec<(LatKey, u64)>, u64);

fn read(ebpf: &aya::Ebpf) -> Result<Read, MapError> {
    let mut drops = 0u64;
    for slot in 0..NUM_DROPS {
        drops = drops.wrapping_add(maps::counter(ebpf, DROPPED, slot)?);
    }
    Ok((maps::hash_entries(ebpf, STATS)?, maps::hash_entries(ebpf, LAT)?, drops))
}

/// Takes `keys` and `lat_keys` out of the kernel, with their values.
type Taken = (Vec<(PeerKey, PeerCounters)>, Vec<(LatKey, u64)>);

fn take(ebpf: &mut aya::Ebpf, keys: &[PeerKey], lat_keys: &[LatKey]) -> Result<Taken, MapError> {
    Ok((maps::hash_take(ebpf, STATS, keys)?, maps::hash_take(ebpf, LAT, lat_keys)?))
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.shared.clone() else { return Ok(()) };
        // The ledger's counts first: keys made after are then counted twice
        // (until the next scrape), never missed.
        let made = Ledger::read_made(&*shared.lock().ok_or(MapError::Poisoned)?, MADE)?;
        let reaped = reap(&shared, &mut *shared.lock().ok_or(MapError::Poisoned)?, self.timeout)?;
        for mut k in reaped.timed_out {
            k.dir |= TIMEOUT_RECORD;
            *self.timeouts.entry(k).or_default() += 1;
        }
        let (mut stats, lat, drops) = read(&*shared.lock().ok_or(MapError::Poisoned)?)?;
        // Read whole: the maps' figures take this count, not a walk of their own.
        shared.note_entries(STATS, stats.len());
        let kernel_keys = stats.len();
        stats.extend(self.timeouts.iter().map(|(k, n)| {
            let mut c = PeerCounters::ZERO;
            c.words[TIMEOUTS] = *n;
            (*k, c)
        }));
        let (pass, services_known) = self.resolver.pass(&mut self.peers, &stats, &lat, Instant::now());
        let (ours, kernels): (Vec<PeerKey>, Vec<PeerKey>) = pass.take.iter().partition(|k| k.dir & TIMEOUT_RECORD != 0);
        let (mut taken, taken_lat) = take(&mut *shared.lock().ok_or(MapError::Poisoned)?, &kernels, &pass.take_lat)?;
        // What each cgroup holds now: the keys read and not taken out.
        let mut kept = reaped.kept;
        let gone: std::collections::HashSet<&PeerKey> = taken.iter().map(|(k, _)| k).collect();
        let gone_lat: std::collections::HashSet<&LatKey> = taken_lat.iter().map(|(k, _)| k).collect();
        book::count(&mut kept, ledger::STATS, stats[..kernel_keys].iter().filter(|(k, _)| !gone.contains(k)), |(k, _)| k.cgroup);
        book::count(&mut kept, ledger::LAT, lat.iter().filter(|(k, _)| !gone_lat.contains(k)), |(k, _)| k.peer.cgroup);
        // The agent's own records are taken as the kernel's are.
        taken.extend(ours.into_iter().filter_map(|k| {
            let n = self.timeouts.remove(&k)?;
            let mut c = PeerCounters::ZERO;
            c.words[TIMEOUTS] = n;
            Some((k, c))
        }));
        self.peers.retire(&taken, &taken_lat);
        self.unattributed += pass.unattributed as u64;
        // The agent's timeout records and the kernel's counts of one
        // server share its label, hence its series.
        emit(sink, &pass.series);
        super::ebpf_pods::unattributed(sink, "ebpf_dns", self.unattributed);
        if let Some(names) = &mut self.names {
            let entries: Vec<(NameKey, u64)> = maps::hash_entries(&*shared.lock().ok_or(MapError::Poisoned)?, NAMES)?;
            let by_digest: HashMap<PeerKey, NameKey> = entries.iter().map(|(k, _)| (name_key(k), *k)).collect();
            let stats: Vec<(PeerKey, PeerCounters)> = entries
                .iter()
                .map(|(k, n)| {
                    let mut c = PeerCounters::ZERO;
                    c.words[0] = *n;
                    (name_key(k), c)
                })
                .collect();
            let by_addr: HashMap<[u8; 16], String> = by_digest.iter().map(|(d, k)| (d.addr, decode_name(&k.name, k.len))).collect();
            let name = |addr: std::net::IpAddr| {
                let raw = match addr {
                    std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                    std::net::IpAddr::V6(v6) => v6.octets(),
                };
                (crate::pods::peers::Kind::External, by_addr.get(&raw).cloned().unwrap_or_default())
            };
            let (npass, _) = self.resolver.pass_named(names, &stats, &[], Instant::now(), Some(&name));
            let gone: Vec<NameKey> = npass.take.iter().filter_map(|d| by_digest.get(d).copied()).collect();
            let taken: Vec<(NameKey, u64)> = maps::hash_take(&mut *shared.lock().ok_or(MapError::Poisoned)?, NAMES, &gone)?;
            let left: std::collections::HashSet<&NameKey> = taken.iter().map(|(k, _)| k).collect();
            book::count(&mut kept, ledger::AUX, entries.iter().filter(|(k, _)| !left.contains(k)), |(k, _)| k.cgroup);
            let taken: Vec<(PeerKey, PeerCounters)> = taken
                .iter()
                .map(|(k, n)| {
                    let mut c = PeerCounters::ZERO;
                    c.words[0] = *n;
                    (name_key(k), c)
                })
                .collect();
            names.retire(&taken, &[]);
            let mut f = sink.family(
                "node_ebpf_pod_dns_failing_domain_responses_total",
                "NXDOMAIN, SERVFAIL and REFUSED answers the pod received, by question name (at most --collector.ebpf_dns.failing-domains \
                 names per pod and rcode; the rest under domain=\"\").",
                Kind::Counter,
            );
            for ((o, l), c) in &npass.series {
                let domain = if l.kind == crate::pods::peers::Kind::Other { "" } else { l.peer.as_str() };
                f.sample(&[("namespace", &o.0), ("pod", &o.1), ("rcode", rcode_name(l.dir)), ("domain", domain)], c.words[0] as f64);
            }
        }
        // The programs' deletions, read after the maps (`ebpf::ledger`).
        let after = Ledger::read_made(&*shared.lock().ok_or(MapError::Poisoned)?, MADE)?;
        let settled = self.ledger.settle(&made, &after, &kept, [true; ledger::COUNTED]);
        Ledger::apply(&mut *shared.lock().ok_or(MapError::Poisoned)?, MADE, GONE, &settled)?;
        shared.note_entries(MADE, made.len());
        shared.note_entries(GONE, self.ledger.len());
        sink.family(
            "node_ebpf_dns_tracked",
            "What ebpf_dns keeps: servers with counts in user space, cgroups whose pod is not known yet, queries waiting for an answer, \
             TCP connections to port 53 followed, and Services known by ClusterIP.",
            Kind::Gauge,
        )
        .sample(&[("what", "servers")], pass.tracked as f64)
        .sample(&[("what", "pending_cgroups")], pass.pending as f64)
        .sample(&[("what", "queries_in_flight")], reaped.in_flight as f64)
        .sample(&[("what", "tcp_connections")], reaped.conns as f64)
        .sample(&[("what", "services")], services_known as f64);
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "dns")], drops as f64);
        Ok(())
    }
}

fn labels<'a>(o: &'a Owner, l: &'a Label) -> [(&'static str, &'a str); 5] {
    let transport = if l.dir == TRANSPORT_TCP { "tcp" } else { "udp" };
    [("namespace", &o.0), ("pod", &o.1), ("server_kind", l.kind.label()), ("server", &l.peer), ("transport", transport)]
}

fn emit(sink: &mut Sink, series: &BTreeMap<(Owner, Label), Counts>) {
    let mut f = sink.family(
        "node_ebpf_pod_dns_queries_total",
        "DNS queries the pod sent to the server, by query type (A, AAAA, SRV, PTR, other); retransmits not included.",
        Kind::Counter,
    );
    for ((o, l), c) in series {
        for (t, w) in [("A", Q_A), ("AAAA", Q_AAAA), ("SRV", Q_SRV), ("PTR", Q_PTR), ("other", Q_OTHER)] {
            let mut ls = labels(o, l).to_vec();
            ls.push(("qtype", t));
            f.sample(&ls, c.words[w] as f64);
        }
    }
    let mut f = sink.family(
        "node_ebpf_pod_dns_responses_total",
        "DNS responses the pod received from the server, by rcode (NOERROR, NXDOMAIN, SERVFAIL, REFUSED, other), late ones included.",
        Kind::Counter,
    );
    for ((o, l), c) in series {
        for (r, w) in
            [("NOERROR", R_NOERROR), ("NXDOMAIN", R_NXDOMAIN), ("SERVFAIL", R_SERVFAIL), ("REFUSED", R_REFUSED), ("other", R_OTHER)]
        {
            let mut ls = labels(o, l).to_vec();
            ls.push(("rcode", r));
            f.sample(&ls, c.words[w] as f64);
        }
    }
    for (name, help, w) in [
        (
            "node_ebpf_pod_dns_timeouts_total",
            "DNS queries of the pod to the server not answered within --collector.ebpf_dns.timeout (counted at the scrape after).",
            TIMEOUTS,
        ),
        ("node_ebpf_pod_dns_truncated_total", "DNS responses the pod received from the server truncated (TC set).", TRUNCATED),
        (
            "node_ebpf_pod_dns_retransmits_total",
            "DNS queries the pod sent to the server again (the same socket and id) while the first was waiting.",
            RETRANSMITS,
        ),
        (
            "node_ebpf_pod_dns_late_responses_total",
            "DNS responses the pod received from the server with no query waiting: after the timeout, or to a query sent before the agent started.",
            LATE,
        ),
    ] {
        let mut f = sink.family(name, help, Kind::Counter);
        for ((o, l), c) in series {
            f.sample(&labels(o, l), c.words[w] as f64);
        }
    }
    let mut f = sink.family(
        "node_ebpf_pod_dns_latency_seconds",
        "Time from the pod's DNS query leaving to its response arriving, by server (native buckets of schema 3).",
        Kind::Histogram,
    );
    for ((o, l), c) in series {
        let h = NativeSum {
            zero: 0,
            buckets: c.lat.iter().map(|(slot, n)| (*slot as i32 + NATIVE_OFFSET, *n)).collect(),
            sum: c.words[LATENCY_NS] as f64 / 1e9,
            count: c.words[MATCHED],
        };
        h.write(&mut f, &labels(o, l));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_bounded() {
        assert_eq!(parse_timeout("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_timeout("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_timeout("0s").is_err());
        assert!(parse_timeout("1h").is_err());
        assert!(parse_timeout("x").is_err());
        assert_eq!(parse_max("4"), Ok(4));
        assert!(parse_max("0").is_err());
        assert!(parse_max("101").is_err());
    }

    #[test]
    fn names_are_decoded_from_the_wire() {
        let wire = b"\x03api\x07example\x03com\x00";
        assert_eq!(decode_name(wire, wire.len() as u8), "api.example.com");
        assert_eq!(decode_name(b"\x00", 1), ".");
        assert_eq!(decode_name(b"\x03a b\x00", 5), "a\\032b");
        assert_eq!(decode_name(b"\x04ab\"c\x00", 6), "ab\\034c");
        // Cut: no final 0 within the bytes kept.
        assert_eq!(decode_name(b"\x03abc\x05de", 0), "abc.de...");
        // A length past the end reads what is there.
        assert_eq!(decode_name(b"\x09ab", 3), "ab");
        assert_eq!(parse_domains("0"), Ok(0));
        assert!(parse_domains("101").is_err());
    }

    #[test]
    fn name_keys_differ_by_rcode_and_name() {
        let mut a = NameKey::ZERO;
        a.name[..5].copy_from_slice(b"\x03abc\x00");
        a.len = 5;
        a.rcode = 3;
        let mut b = a;
        b.rcode = 2;
        let mut c = a;
        c.name[1] = b'x';
        assert_ne!(name_key(&a).addr, name_key(&b).addr);
        assert_ne!(name_key(&a).addr, name_key(&c).addr);
        assert_eq!(name_key(&a), name_key(&a));
        assert_eq!(name_key(&b).dir, 2);
    }

    #[test]
    fn busy_servers_are_those_queried_most() {
        let mut c = Counts::default();
        c.words[Q_A] = 3;
        c.words[Q_OTHER] = 2;
        c.words[R_NOERROR] = 9;
        assert_eq!(queries(&c), 5);
    }
}
