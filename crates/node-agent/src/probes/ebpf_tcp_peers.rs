//! `ebpf_tcp_peers`: TCP by pod and peer, from one program on the raw
//! inet_sock_set_state tracepoint: connects started, their results
//! (established, refused, timed out, unreachable, reset, aborted, other) and
//! latency (native histogram, schema 3), connections accepted by local
//! port, connections open, and the payload bytes and retransmits of each
//! connection, counted when it closes.
//!
//! The peer is named in user space (`pods::peers`): a Service by its
//! ClusterIP (`peer_kind="service"`), a pod of this node by its address
//! (`peer_kind="pod"`, `peer="namespace/workload"`), loopback (`local`),
//! else `external`: the name of the first block of
//! `--collector.ebpf_tcp_peers.external-cidrs` holding it, or the address. Out, `port` is the remote port;
//! in, the local (listening) one, and the peer the client's address.
//!
//! Cardinality: per pod (and for the host, `namespace=""`), per direction,
//! at most `--collector.ebpf_tcp_peers.max-peers` peers (default 20) with
//! series of their own, the rest summed into `peer_kind="other"`: with 250
//! pods and the default, at most 250 × 2 × 21 = 10,500 label sets, each
//! in 9 counter families and one gauge, and the out ones in one histogram.
//! A peer idle for the grace period loses its series and its place; series
//! go with their pod (after the pod attribution grace period).
//!
//! In the kernel, each cgroup has a share of the maps (an eighth of the
//! records and latency buckets, a quarter of the connections followed:
//! `agent_common::ledger`, kept with `ebpf::ledger`): a new peer beyond is
//! counted in the cgroup's own other record, a connection beyond is not
//! followed (nor shown open). The gauge of connections open counts
//! exactly the connections whose close will be counted, in the record
//! their open was (kept in the kernel while they are open).
//! Connections open before the agent started are not counted, nor their
//! bytes (there is no event to find them by). Bytes and retransmits of a
//! connection are counted when it closes and, while it is open, by a sweep
//! at most every `--collector.ebpf_tcp_peers.sweep-interval` (10s) at
//! scrape time: a program run by the agent over every followed socket
//! (`tcp_peers_sweep`), which adds what each sent and received since it
//! was last counted (the close and the sweep exchange that mark
//! atomically, or before Linux 5.12 pass a baton, so nothing is counted
//! twice).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use agent_common::ledger::{self, Entries, Limits};
use agent_common::tcp_peers::{
    LatKey, Offsets, PeerCounters, PeerKey, SockState, ABORTED, ACCEPTED, ATTEMPTS, BATON, BYTES_RECEIVED, BYTES_SENT, CLOSED, DIR_IN,
    DROPPED, DROP_LAT, DROP_SOCKS, DROP_STATS, ESTABLISHED, GONE, LAT, LATENCY_NS, LIMITS, MADE, MAX_LAT, OFFSETS, OPEN, OTHER, PROGRAMS,
    REFUSED, RESET, RETRANSMITS, SET_STATE, SET_STATE_BATON, SOCKS, SOCKS_SHARE, STATS, SWEEP, SWEEP_BATCH, SWEEP_BATON, TIMED, TIMEOUT,
    UNREACHABLE,
};
use agent_common::NATIVE_OFFSET;
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::{self, Flags, ParsedFlag};
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::ledger::{self as book, Ledger};
use crate::ebpf::maps::{self, MapError, NativeSum};
use crate::ebpf::{Globals, Probe};
use crate::pods::peers::{Cidr, Counts, Label, Owner, Peers};
use crate::pods::resolve::Resolver;

pub const MAX_PEERS: ParsedFlag<usize> = ParsedFlag {
    name: "collector.ebpf_tcp_peers.max-peers",
    value_name: "N",
    default: "20",
    env: None,
    help: "Peers with series of their own per pod and direction; later ones are summed into peer_kind=\"other\".",
    parse: parse_max,
};

pub const MAX_CONNECTIONS: ParsedFlag<u32> = ParsedFlag {
    name: "collector.ebpf_tcp_peers.max-connections",
    value_name: "N",
    default: "16384",
    env: None,
    help: "TCP connections followed at once, a quarter of them at most by one cgroup (16 bytes of kernel memory each, charged to the agent's cgroup, plus about 130 for each followed); connections beyond are counted as dropped events, and neither their bytes nor their closes are counted (nor shown open).",
    parse: parse_connections,
};

pub const SWEEP_INTERVAL: ParsedFlag<Duration> = ParsedFlag {
    name: "collector.ebpf_tcp_peers.sweep-interval",
    value_name: "DURATION",
    default: "10s",
    env: None,
    help: "How often, at most, a scrape reads the bytes and retransmits of open connections (counted otherwise when they close), e.g. 5s, 30s.",
    parse: parse_sweep,
};

pub const EXTERNAL_CIDRS: ParsedFlag<Vec<Cidr>> = ParsedFlag {
    name: "collector.ebpf_tcp_peers.external-cidrs",
    value_name: "NAME=CIDR,...",
    default: "",
    env: None,
    help: "Group external peers by address block: a peer in the first block holding it is named by the block's name (peer_kind=\"external\"), e.g. corp=10.0.0.0/8,internet=0.0.0.0/0; at most 64 blocks.",
    parse: parse_cidrs,
};

fn parse_cidrs(s: &str) -> Result<Vec<Cidr>, String> {
    let cidrs = s.split(',').filter(|c| !c.trim().is_empty()).map(Cidr::parse).collect::<Result<Vec<_>, _>>()?;
    if cidrs.len() > 64 {
        return Err(format!("{} address blocks, at most 64", cidrs.len()));
    }
    Ok(cidrs)
}

fn parse_sweep(s: &str) -> Result<Duration, String> {
    super::bounds::duration(s, Duration::from_secs(1), Duration::from_secs(3600), "1s to 1h", "5s, 30s")
}

fn parse_connections(s: &str) -> Result<u32, String> {
    super::bounds::count(s, 1024, 1 << 20, "connections")
}

fn parse_max(s: &str) -> Result<usize, String> {
    super::bounds::count(s, 1, 1000, "peers")
}

pub fn args() -> Vec<Arg> {
    flags::args(&[&MAX_PEERS, &MAX_CONNECTIONS, &SWEEP_INTERVAL, &EXTERNAL_CIDRS])
}

/// The offsets, from the kernel's BTF; sockets are attributed to their
/// cgroup when the pods are known (a Kubernetes API) and the BTF has the
/// socket's cgroup.
pub fn globals(k: &Kernel, ctx: &mut Context, g: &mut Globals) {
    let mut o = k.tcp_peers().unwrap_or(Offsets::DEFAULT);
    if ctx.kube && o.sock_cgroup != 0 && o.cgroup_kn != 0 && o.kernfs_node_id != 0 {
        o.attribute = 1;
    }
    g.set(OFFSETS, &o);
    g.max_entries(SOCKS, ctx.tcp_connections);
    // BPF_XCHG came with Linux 5.12; before, the programs' baton variants
    // serve, with a baton per established socket followed.
    if k.at_least(5, 12) {
        g.max_entries(BATON, 1);
    } else {
        g.max_entries(BATON, ctx.tcp_connections);
        g.symbol(SET_STATE.name, SET_STATE_BATON);
        g.symbol(SWEEP.name, SWEEP_BATON);
    }
    g.set(LIMITS, &Limits::per_cgroup(o.attribute != 0, agent_common::tcp_peers::MAX_PEERS, MAX_LAT, ctx.tcp_connections, SOCKS_SHARE));
}

struct Active {
    probe: Probe,
    resolver: Resolver,
    peers: Peers,
    sweep_every: Duration,
    swept: Option<Instant>,
    /// The sweep failed once (said at warn, then at debug).
    sweep_failed: bool,
    /// The per-cgroup ledger's side the agent writes.
    ledger: Ledger,
    /// Cgroups whose counts were dropped, no pod being known for them.
    unattributed: u64,
}

pub struct Collector {
    active: Active,
}

pub fn build(f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let max = MAX_PEERS.get(f)?;
    let grace = super::ebpf_pods::GRACE_PERIOD.get(f)?;
    let k = Kernel::get();
    let mut resolver = ctx.resolver(grace)?;
    let probe = match k.tcp_peers() {
        Ok(_) if !k.at_least(5, 6) => ctx.down(&PROGRAMS, "sock.sk_protocol is a bitfield before Linux 5.6"),
        Ok(_) => ctx.attach(&PROGRAMS),
        Err(why) => ctx.down(&PROGRAMS, why),
    };
    let sweep_every = SWEEP_INTERVAL.get(f)?;
    resolver.cidrs = EXTERNAL_CIDRS.get(f)?;
    Ok(Box::new(Collector {
        active: Active {
            probe,
            resolver,
            peers: Peers::new(max, grace).open_in(OPEN),
            sweep_every,
            swept: None,
            sweep_failed: false,
            ledger: Ledger::default(),
            unattributed: 0,
        },
    }))
}

/// Counts the open connections' bytes and retransmits so far: the sweep
/// program run over every followed socket, [`SWEEP_BATCH`] at a time. Also
/// the sockets followed, by cgroup (the ledger's third word).
fn sweep(shared: &crate::ebpf::Shared) -> Result<HashMap<u64, Entries>, String> {
    let socks: Vec<(u64, SockState)> = {
        let ebpf = shared.lock().ok_or("eBPF state poisoned")?;
        maps::hash_entries(&ebpf, SOCKS).map_err(|e| e.to_string())?
    };
    let mut followed = HashMap::new();
    book::count(&mut followed, ledger::AUX, &socks, |(_, st)| st.peer.cgroup);
    let batches = socks.chunks(SWEEP_BATCH).map(|c| {
        let mut args = [0u64; 12];
        for (a, (sk, _)) in args.iter_mut().zip(c) {
            *a = *sk;
        }
        args
    });
    shared.run(SWEEP.name, batches).map_err(|e| e.to_string())?;
    Ok(followed)
}

/// The kernel's entries, and the events it could not record.
type Read = (Vec<(PeerKey, PeerCounters)>, Vec<(LatKey, u64)>, [u64; 3]);

fn read(ebpf: &aya::Ebpf) -> Result<Read, MapError> {
    let drops =
        [maps::counter(ebpf, DROPPED, DROP_SOCKS)?, maps::counter(ebpf, DROPPED, DROP_STATS)?, maps::counter(ebpf, DROPPED, DROP_LAT)?];
    Ok((maps::hash_entries(ebpf, STATS)?, maps::hash_entries(ebpf, LAT)?, drops))
}

/// Takes `keys` and `lat_keys` out of the kernel, with their values.
type Taken = (Vec<(PeerKey, PeerCounters)>, Vec<(LatKey, u64)>);

fn take(ebpf: &mut aya::Ebpf, keys: &[PeerKey], lat_keys: &[LatKey]) -> Result<Taken, MapError> {
    Ok((maps::hash_take(ebpf, STATS, keys)?, maps::hash_take(ebpf, LAT, lat_keys)?))
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let a = &mut self.active;
        a.probe.self_metrics(sink);
        let Some(shared) = a.probe.shared.clone() else { return Ok(()) };
        let now = Instant::now();
        // The ledger's counts first: keys made after are then counted twice
        // (until the next scrape), never missed.
        let made = Ledger::read_made(&*shared.lock().ok_or(MapError::Poisoned)?, MADE)?;
        let mut followed = None;
        if a.probe.up() && a.swept.is_none_or(|t| now.duration_since(t) >= a.sweep_every) {
            a.swept = Some(now);
            match sweep(&shared) {
                Ok(f) => followed = Some(f),
                Err(e) if !std::mem::replace(&mut a.sweep_failed, true) => {
                    tracing::warn!(err = %e, "ebpf_tcp_peers: reading open connections failed (their bytes are counted when they close)");
                }
                Err(e) => tracing::debug!(err = %e, "ebpf_tcp_peers: reading open connections failed"),
            }
        }
        let (stats, lat, drops) = read(&*shared.lock().ok_or(MapError::Poisoned)?)?;
        // Read whole: the maps' figures take this count, not a walk of their own.
        shared.note_entries(STATS, stats.len());
        let (pass, services_known) = a.resolver.pass(&mut a.peers, &stats, &lat, now);
        let mut ebpf = shared.lock().ok_or(MapError::Poisoned)?;
        let (taken, taken_lat) = take(&mut ebpf, &pass.take, &pass.take_lat)?;
        // What each cgroup holds now: the keys read and not taken out.
        let mut kept = followed.clone().unwrap_or_default();
        let gone: std::collections::HashSet<&PeerKey> = taken.iter().map(|(k, _)| k).collect();
        let gone_lat: std::collections::HashSet<&LatKey> = taken_lat.iter().map(|(k, _)| k).collect();
        book::count(&mut kept, ledger::STATS, stats.iter().filter(|(k, _)| !gone.contains(k)), |(k, _)| k.cgroup);
        book::count(&mut kept, ledger::LAT, lat.iter().filter(|(k, _)| !gone_lat.contains(k)), |(k, _)| k.peer.cgroup);
        // The programs' deletions (sockets closed), read after the maps
        // (`ebpf::ledger`).
        let after = Ledger::read_made(&ebpf, MADE)?;
        let settled = a.ledger.settle(&made, &after, &kept, [true, true, followed.is_some(), true, true]);
        Ledger::apply(&mut ebpf, MADE, GONE, &settled)?;
        drop(ebpf);
        a.peers.retire(&taken, &taken_lat);
        a.unattributed += pass.unattributed as u64;
        shared.note_entries(MADE, made.len());
        shared.note_entries(GONE, a.ledger.len());
        emit(sink, &pass.series);
        super::ebpf_pods::unattributed(sink, "ebpf_tcp_peers", a.unattributed);
        sink.family(
            "node_ebpf_tcp_peers_tracked",
            "Peers ebpf_tcp_peers keeps counts of in user space, cgroups whose pod is not known yet, and Services known by ClusterIP.",
            Kind::Gauge,
        )
        .sample(&[("what", "peers")], pass.tracked as f64)
        .sample(&[("what", "pending_cgroups")], pass.pending as f64)
        .sample(&[("what", "services")], services_known as f64);
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "tcp_peers")], drops.iter().sum::<u64>() as f64);
        Ok(())
    }
}

/// The series' labels.
fn labels<'a>(o: &'a Owner, l: &'a Label, port: &'a str) -> [(&'static str, &'a str); 6] {
    [
        ("namespace", &o.0),
        ("pod", &o.1),
        ("direction", if l.dir == DIR_IN { "in" } else { "out" }),
        ("peer_kind", l.kind.label()),
        ("peer", &l.peer),
        ("port", port),
    ]
}

fn emit(sink: &mut Sink, series: &BTreeMap<(Owner, Label), Counts>) {
    let ports: Vec<String> = series.keys().map(|(_, l)| l.port.map(|p| p.to_string()).unwrap_or_default()).collect();
    let rows: Vec<(&Owner, &Label, &str, &Counts)> = series.iter().zip(&ports).map(|(((o, l), c), p)| (o, l, p.as_str(), c)).collect();
    let out = || rows.iter().filter(|r| r.1.dir != DIR_IN);
    let mut f = sink.family(
        "node_ebpf_pod_tcp_peer_connect_attempts_total",
        "TCP connects the pod's sockets started to the peer (SYN sent).",
        Kind::Counter,
    );
    for (o, l, p, c) in out() {
        f.sample(&labels(o, l, p), c.words[ATTEMPTS] as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_peer_connects_total",
        "TCP connects of the pod's sockets to the peer, by result: established, refused (reset answered the SYN), timeout, \
         unreachable (ICMP), reset, aborted (closed by the application while connecting), other.",
        Kind::Counter,
    );
    for (o, l, p, c) in out() {
        for (result, w) in [
            ("established", ESTABLISHED),
            ("refused", REFUSED),
            ("timeout", TIMEOUT),
            ("unreachable", UNREACHABLE),
            ("reset", RESET),
            ("aborted", ABORTED),
            ("other", OTHER),
        ] {
            let mut ls = labels(o, l, p).to_vec();
            ls.push(("result", result));
            f.sample(&ls, c.words[w] as f64);
        }
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_peer_connect_latency_seconds",
        "Time the pod's TCP connects to the peer took from SYN sent to established (native buckets of schema 3).",
        Kind::Histogram,
    );
    for (o, l, p, c) in out() {
        let h = NativeSum {
            zero: 0,
            buckets: c.lat.iter().map(|(slot, n)| (*slot as i32 + NATIVE_OFFSET, *n)).collect(),
            sum: c.words[LATENCY_NS] as f64 / 1e9,
            count: c.words[TIMED],
        };
        h.write(&mut f, &labels(o, l, p));
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_peer_accepted_total",
        "TCP connections the pod's listening sockets accepted from the peer, by local port.",
        Kind::Counter,
    );
    for (o, l, p, c) in rows.iter().filter(|r| r.1.dir == DIR_IN) {
        f.sample(&labels(o, l, p), c.words[ACCEPTED] as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_peer_connections",
        "TCP connections of the pod with the peer open now (established or accepted since the agent started and followed, not closed).",
        Kind::Gauge,
    );
    for (o, l, p, c) in &rows {
        f.sample(&labels(o, l, p), (c.words[OPEN] as i64).max(0) as f64);
    }
    for (name, help, w) in [
        (
            "node_ebpf_pod_tcp_peer_sent_bytes_total",
            "Payload bytes the pod sent the peer and the peer acknowledged, counted while the connection is open (every sweep interval) and when it closes.",
            BYTES_SENT,
        ),
        (
            "node_ebpf_pod_tcp_peer_received_bytes_total",
            "Payload bytes the pod received from the peer, counted while the connection is open (every sweep interval) and when it closes.",
            BYTES_RECEIVED,
        ),
        (
            "node_ebpf_pod_tcp_peer_retransmits_total",
            "TCP segments the pod retransmitted to the peer, counted while the connection is open (every sweep interval) and when it closes.",
            RETRANSMITS,
        ),
        ("node_ebpf_pod_tcp_peer_closed_total", "TCP connections of the pod with the peer that closed after being established.", CLOSED),
    ] {
        let mut f = sink.family(name, help, Kind::Counter);
        for (o, l, p, c) in &rows {
            f.sample(&labels(o, l, p), c.words[w] as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_peers_is_bounded() {
        assert_eq!(parse_max("20"), Ok(20));
        assert!(parse_max("0").is_err());
        assert!(parse_max("1001").is_err());
        assert!(parse_max("x").is_err());
        assert_eq!(parse_connections("16384"), Ok(16384));
        assert!(parse_connections("100").is_err());
        assert!(parse_connections("2000000").is_err());
    }
}
