//! `ebpf_pods`: kernel events per pod of this node — run-queue wait, OOM
//! kills, TCP retransmits, packet drops, block I/O bytes and failed syscalls, counted in
//! the kernel per cgroup v2 id and named in user space (see `crate::pods`).
//!
//! Needs the Kubernetes API (in-cluster service account, or a kubeconfig):
//! without one, attribution is off, one line says so at start-up, and no
//! program is attached for it. Processes outside any pod count under
//! `namespace=""`, `pod=""`. Cardinality: one series per pod of this node
//! (containers for OOM kills), kept `--collector.ebpf_pods.grace-period`
//! after a pod's deletion (forgotten by the watch on a timer, scraped or
//! not); at most `POD_MAX_CGROUPS` cgroups are counted in the kernel
//! (beyond that, events are counted as dropped), at most `index::MAX_PODS`
//! pods tracked and `attrib::MAX_LABEL_SETS` label sets exported (beyond
//! those, counted in `node_ebpf_pod_attribution_dropped_total`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_common::pods::{
    Offsets, PodCounters, BLOCK, BLOCK_PROGRAMS, DROPPED, OFFSETS, OOM, OOM_CURRENT, OOM_VICTIM, RUNQ, SKB, SLOW, STATS, SYSCALLS, TCP,
    TCP_CONN,
};
use agent_common::{runqueue, skb_drops, syscalls, tcp_latency, tcp_retransmits, Program};
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::{self, Flags, OptionalFlag, ParsedFlag};
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::maps::{self, MapError};
use crate::ebpf::{Globals, Probe};
use crate::pods::attrib::Attribution;
use crate::pods::hierarchy::Hierarchy;
use crate::pods::index::Reason;
use crate::pods::watch;

pub const NODE_NAME: OptionalFlag = OptionalFlag {
    name: "collector.ebpf_pods.node-name",
    value_name: "NAME",
    help: "This node's name, whose pods are watched [default: $NODE_NAME, else the host name].",
};
pub const KUBECONFIG: OptionalFlag = OptionalFlag {
    name: "collector.ebpf_pods.kubeconfig",
    value_name: "FILE",
    help: "Kubeconfig to reach the API server with [default: $KUBECONFIG or ~/.kube/config, else the pod's service account].",
};
/// Also read by `pod_cpu_throttling`.
pub const GRACE_PERIOD: ParsedFlag<Duration> = ParsedFlag {
    name: "collector.ebpf_pods.grace-period",
    value_name: "DURATION",
    default: "5m",
    env: None,
    help: "How long a deleted pod's series (and a gone cgroup's counts, and an idle peer's series) are kept, from 1s to 24h, e.g. 30s, 5m, 1h.",
    parse: parse_grace,
};
pub const LIST_TIMEOUT: ParsedFlag<Duration> = ParsedFlag {
    name: "collector.ebpf_pods.list-timeout",
    value_name: "DURATION",
    default: "60s",
    env: None,
    help: "How long listing this node's pods may take before it is dropped and retried with backoff, e.g. 30s, 2m.",
    parse: parse_duration,
};

pub fn args() -> Vec<Arg> {
    flags::args(&[&NODE_NAME, &KUBECONFIG, &GRACE_PERIOD, &LIST_TIMEOUT])
}

/// The grace period: at least a second (0 would forget a pod, a cgroup or
/// a peer in the pass that sees it), at most a day.
fn parse_grace(s: &str) -> Result<Duration, String> {
    super::bounds::duration(s, Duration::from_secs(1), Duration::from_secs(86_400), "1s to 24h", "30s, 5m, 1h")
}

/// A duration of the pod flags ([`crate::pods::parse_duration`]).
fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::pods::parse_duration(s).ok_or_else(|| format!("not a duration: {s:?} (e.g. 30s, 5m, 1h)"))
}

/// Decides before the eBPF object loads whether the pod collectors are
/// on: they need the Kubernetes API. Logs one line when they are off; a
/// kubeconfig named by the flag that cannot be read is a start-up error.
pub fn prepare(f: &Flags, ctx: &mut Context) -> Result<(), ConfigError> {
    let kubeconfig = KUBECONFIG.get(f).map(PathBuf::from);
    match watch::source(kubeconfig.as_deref()) {
        Ok(s) => {
            let node = NODE_NAME
                .get(f)
                .or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()))
                .or_else(|| host::sys::uname().ok().map(|u| u.nodename.to_lowercase()))
                .unwrap_or_default();
            let settings = watch::Settings { grace: GRACE_PERIOD.get(f)?, list_timeout: LIST_TIMEOUT.get(f)?.max(Duration::from_secs(1)) };
            ctx.pods_source = Some((s, node, settings));
            ctx.kube = true;
            ctx.attribute = ctx.pods_attribution;
        }
        Err(e) if kubeconfig.is_some() => return Err(KUBECONFIG.invalid(e)),
        Err(e) => tracing::info!(reason = %e, "pod attribution off: no Kubernetes API to name pods with"),
    }
    Ok(())
}

/// Sets up attribution's global and decides the events it serves on this
/// kernel: syscall errors always; block I/O with the block_io_start
/// tracepoint (Linux >= 6.5); run-queue wait, OOM kills, TCP retransmits and
/// packet drops (kfree_skb, with `sk_buff.sk`) with the kernel's
/// BTF (task and socket to cgroup). Off (0) unless
/// [`prepare`] turned attribution on.
pub fn globals(k: &Kernel, ctx: &mut Context, g: &mut Globals) {
    let mut o = Offsets::DEFAULT;
    if ctx.attribute {
        o = offsets(k);
    }
    ctx.pod_events = o.events;
    g.set(OFFSETS, &o);
}

fn offsets(k: &Kernel) -> Offsets {
    let mut o = Offsets { events: SYSCALLS | SLOW, ..Offsets::DEFAULT };
    let (io, merge) = (k.format("block", "block_io_start"), k.format("block", "block_bio_backmerge"));
    (o.io_start_bytes, o.io_start_rwbs, o.bio_merge_nr_sector, o.bio_merge_rwbs) =
        (io.offset("bytes"), io.offset("rwbs"), merge.offset("nr_sector"), merge.offset("rwbs"));
    if o.io_start_bytes != 0 && o.io_start_rwbs != 0 && o.bio_merge_nr_sector != 0 && o.bio_merge_rwbs != 0 {
        o.events |= BLOCK;
    } else {
        tracing::info!("no block_io_start tracepoint (Linux < 6.5): block I/O is not attributed to pods");
    }
    let walk = k.cgroup_walk();
    match walk {
        Ok(w) => {
            (o.task_cgroups, o.css_set_dfl_cgrp, o.cgroup_kn, o.kernfs_node_id) =
                (w.task_cgroups, w.css_set_dfl_cgrp, w.cgroup_kn, w.kernfs_node_id);
            o.events |= OOM;
            if k.raw_sched_switch() {
                o.events |= RUNQ;
            }
            match w.sock_cgroup {
                Some(off) => {
                    o.sock_cgroup = off;
                    if k.retransmit_raw().is_ok() || k.format("tcp", "tcp_retransmit_skb").has("skaddr") {
                        o.events |= TCP;
                    } else {
                        tracing::info!("tcp_retransmit_skb has no skaddr: TCP retransmits are not attributed to pods");
                    }
                    match k.drop_reasons() {
                        Ok(d) if d.skb_sk.is_some() => o.events |= SKB,
                        Ok(_) => tracing::info!("no sk_buff.sk in the kernel's BTF: packet drops are not attributed to pods"),
                        Err(e) => tracing::info!(reason = e, "packet drops are not attributed to pods"),
                    }
                    match k.tcp_latency() {
                        Ok(_) => o.events |= TCP_CONN,
                        Err(e) => tracing::info!(reason = e, "TCP connect failures and RTT are not attributed to pods"),
                    }
                }
                None => tracing::info!("no sock.sk_cgrp_data.cgroup in the kernel's BTF: TCP retransmits, connects and packet drops are not attributed to pods"),
            }
        }
        Err(e) => tracing::warn!(err = e, "no usable kernel BTF: run-queue wait, OOM kills and TCP retransmits are not attributed to pods"),
    }
    o
}

/// The programs serving the events `bits` says the loaded object has on.
/// (Slow syscalls are counted by ebpf_syscall_latency's programs, which
/// that collector attaches, with its threshold.)
fn programs(bits: u32, k: &Kernel) -> Vec<Program> {
    let mut p = Vec::new();
    if bits & SYSCALLS != 0 {
        p.push(syscalls::SYS_EXIT);
    }
    if bits & RUNQ != 0 {
        p.extend(runqueue::RAW_PROGRAMS);
    }
    if bits & TCP != 0 {
        // The same program as ebpf_tcp_retransmits: raw where it can be.
        p.push(if k.retransmit_raw().is_ok() { tcp_retransmits::RETRANSMIT_SKB_RAW } else { tcp_retransmits::RETRANSMIT_SKB });
    }
    if bits & SKB != 0 {
        p.push(skb_drops::KFREE_SKB);
    }
    if bits & TCP_CONN != 0 {
        p.push(tcp_latency::SET_STATE);
    }
    if bits & OOM != 0 {
        p.push(if k.oom_passes_task() { OOM_VICTIM } else { OOM_CURRENT });
    }
    if bits & BLOCK != 0 {
        p.extend(BLOCK_PROGRAMS);
    }
    p
}

struct Active {
    probe: Probe,
    pods: Arc<crate::pods::Watched>,
    attrib: Attribution,
    /// The pods' cgroups (None without a cgroup v2 hierarchy: all the host's).
    hierarchy: Option<Arc<Hierarchy>>,
    /// Label sets left out beyond `attrib::MAX_LABEL_SETS`, summed over scrapes.
    label_sets_dropped: u64,
    /// Cgroups whose counts were dropped, no pod being known for them.
    unattributed: u64,
}

pub struct Collector {
    active: Option<Active>,
}

pub fn build(f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    Ok(Box::new(new(f, p, ctx)?))
}

/// The collector.
pub fn new(f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Collector, ConfigError> {
    let grace = GRACE_PERIOD.get(f)?;
    let Some(pods) = ctx.pods()? else { return Ok(Collector { active: None }) };
    let hierarchy = ctx.hierarchy(grace)?;
    let shared = ctx.ebpf();
    let bits = if shared.is_ok() { ctx.pod_events } else { SYSCALLS };
    // Its programs shared with the node probes (run-queue, syscalls, TCP,
    // drops) are theirs to report while they are on.
    let probe = ctx.defer(Probe::attach(shared, &programs(bits, Kernel::get())));
    let names: Vec<&str> = [
        (SYSCALLS, "syscall_errors"),
        (RUNQ, "runqueue"),
        (OOM, "oom_kills"),
        (TCP, "tcp_retransmits"),
        (SKB, "skb_drops"),
        (BLOCK, "block_io"),
        (SLOW, "slow_syscalls"),
        (TCP_CONN, "tcp_connects"),
    ]
    .iter()
    .filter(|(b, _)| bits & b != 0)
    .map(|(_, n)| *n)
    .collect();
    tracing::info!(node = %pods.node, events = %names.join(","), "pod attribution on");
    Ok(Collector {
        active: Some(Active { probe, pods, attrib: Attribution::new(grace), hierarchy, label_sets_dropped: 0, unattributed: 0 }),
    })
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let Some(a) = &mut self.active else { return Ok(()) };
        let Some(shared) = a.probe.shared.clone() else {
            a.probe.self_metrics(sink);
            return Ok(());
        };
        let read = || -> Result<Vec<(u64, PodCounters)>, MapError> {
            let ebpf = shared.lock().ok_or(MapError::Poisoned)?;
            let entries: Vec<(u64, PodCounters)> = maps::hash_entries(&ebpf, STATS)?;
            // Read whole: the maps' figures take this count, not a walk of their own.
            shared.note_entries(STATS, entries.len());
            Ok(entries)
        };
        let read = read();
        a.probe.self_metrics(sink);
        let entries = read?;
        let now = Instant::now();
        let (out, pods, synced, reason, index_dropped, cgroups_refused) = {
            // No cgroup v2 hierarchy to name anything with: all the host's.
            let none = HashMap::new();
            let view = a.hierarchy.as_ref().map(|h| h.view());
            let mut idx = a.pods.lock();
            let out = match &view {
                Some(v) => a.attrib.update(&entries, &**v, &mut idx, now),
                None => a.attrib.update(&entries, &none, &mut idx, now),
            };
            let refused = view.as_ref().map_or(0, |v| v.refused);
            (out, idx.live(now, a.attrib.grace).count(), idx.synced, idx.reason(), idx.dropped, refused)
        };
        a.label_sets_dropped += out.dropped_label_sets as u64;
        a.unattributed += out.unattributed as u64;
        let dropped = {
            let mut ebpf = shared.lock().ok_or(MapError::Poisoned)?;
            let taken: Vec<(u64, PodCounters)> = maps::hash_take(&mut ebpf, STATS, &out.take)?;
            a.attrib.retire(&taken);
            maps::counter(&ebpf, DROPPED, 0)?
        };
        emit(sink, &out.series);
        sink.family(
            "node_ebpf_pod_attribution_cgroups",
            "Cgroups with counts in the kernel, by whether their pod (or the host) is known.",
            Kind::Gauge,
        )
        .sample(&[("state", "attributed")], out.attributed as f64)
        .sample(&[("state", "pending")], out.pending as f64);
        sink.family(
            "node_ebpf_pod_attribution_pods",
            "Pods of this node known from the API server (deleted ones until their grace period ends).",
            Kind::Gauge,
        )
        .sample(&[], pods as f64);
        sink.family("node_ebpf_pod_attribution_synced", "Whether the pods of this node have been listed from the API server.", Kind::Gauge)
            .sample(&[], if synced { 1.0 } else { 0.0 });
        let mut f = sink.family(
            "node_ebpf_pod_attribution_sync_state",
            "The pod watch's state: 1 for the current reason, 0 for the others. reason is one of listing, synced, list_timeout \
             (the list did not complete within --collector.ebpf_pods.list-timeout), list_failed, forbidden (401 or 403), too_large \
             (a watch line over 16 MiB or a list page over 64 MiB), watch_failed, expired (410 Gone: listing again).",
            Kind::Gauge,
        );
        for r in Reason::ALL {
            f.sample(&[("reason", r.label())], if r == reason { 1.0 } else { 0.0 });
        }
        sink.family(
            "node_ebpf_pod_attribution_dropped_total",
            "What pod attribution left out to stay bounded. reason is one of pods_cap (events of a new pod not tracked: 1,000 pods \
             not deleted are), deleted_early (deleted pods forgotten before their grace period to make room), series_cap (label \
             sets of whole pods left out of a scrape beyond 5,000, counted at each scrape), cgroups_cap (pods' cgroups not followed \
             beyond 16,384 kept: their counts are the host's).",
            Kind::Counter,
        )
        .sample(&[("reason", "pods_cap")], index_dropped.pods_cap as f64)
        .sample(&[("reason", "deleted_early")], index_dropped.deleted_early as f64)
        .sample(&[("reason", "series_cap")], a.label_sets_dropped as f64)
        .sample(&[("reason", "cgroups_cap")], cgroups_refused as f64);
        unattributed(sink, "ebpf_pods", a.unattributed);
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "pods")], dropped as f64);
        Ok(())
    }
}

/// Writes `node_ebpf_pod_attribution_unattributed_cgroups_total` for
/// `collector` (one of the three that name pods by cgroup: `ebpf_pods`,
/// `ebpf_tcp_peers`, `ebpf_dns`).
pub fn unattributed(sink: &mut Sink, collector: &str, cgroups: u64) {
    sink.family(
        "node_ebpf_pod_attribution_unattributed_cgroups_total",
        "Cgroups whose counts the collector dropped because it could not name their pod: a pod's cgroup whose pod the synced pod \
         watch did not list within --collector.ebpf_pods.grace-period (deleted before it was listed, or beyond the 1,000 pods tracked).",
        Kind::Counter,
    )
    .sample(&[("collector", collector)], cgroups as f64);
}

/// Writes the per-pod families (per container for OOM kills).
fn emit(sink: &mut Sink, series: &BTreeMap<(String, String, String), PodCounters>) {
    let mut pods: BTreeMap<(&str, &str), PodCounters> = BTreeMap::new();
    for ((ns, pod, _), c) in series {
        crate::pods::attrib::add(pods.entry((ns, pod)).or_default(), c);
    }
    let mut f =
        sink.family("node_ebpf_pod_runqueue_wait_seconds_total", "Time the pod's tasks waited on a run queue for a CPU.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.runq_wait_ns as f64 / 1e9);
    }
    let mut f = sink.family("node_ebpf_pod_runqueue_waits_total", "Times the pod's tasks waited on a run queue.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.runq_waits as f64);
    }
    let mut f = sink.family("node_ebpf_pod_oom_kills_total", "Tasks of the pod's containers killed by the OOM killer.", Kind::Counter);
    for ((ns, pod, container), c) in series {
        f.sample(&[("namespace", ns), ("pod", pod), ("container", container)], c.oom_kills as f64);
    }
    let mut f = sink.family("node_ebpf_pod_tcp_retransmits_total", "TCP segments retransmitted by the pod's sockets.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.tcp_retransmits as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_skb_drops_total",
        "Packets of the pod's sockets the kernel dropped (skb:kfree_skb, the receiving socket's or else the packet's own).",
        Kind::Counter,
    );
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.skb_drops as f64);
    }
    let mut f =
        sink.family("node_ebpf_pod_block_io_bytes_total", "Bytes of block I/O requests submitted by the pod's tasks.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod), ("operation", "read")], c.read_bytes as f64);
        f.sample(&[("namespace", ns), ("pod", pod), ("operation", "write")], c.write_bytes as f64);
    }
    let mut f = sink.family("node_ebpf_pod_syscall_errors_total", "System calls of the pod's tasks that returned an error.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.syscall_errors as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_slow_syscalls_total",
        "System calls of the pod's tasks that took at least --collector.ebpf_syscall_latency.slow-threshold (counted while ebpf_syscall_latency is on).",
        Kind::Counter,
    );
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.slow_syscalls as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_connect_failures_total",
        "TCP connects of the pod's sockets that failed (SYN sent to closed: refused, timed out, reset).",
        Kind::Counter,
    );
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.tcp_connect_failures as f64);
    }
    let mut f = sink.family(
        "node_ebpf_pod_tcp_rtt_seconds_total",
        "Sum of the smoothed RTT samples of the pod's TCP connections (when established and when leaving ESTABLISHED).",
        Kind::Counter,
    );
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.tcp_rtt_ns as f64 / 1e9);
    }
    let mut f = sink.family("node_ebpf_pod_tcp_rtt_samples_total", "Smoothed RTT samples of the pod's TCP connections.", Kind::Counter);
    for ((ns, pod), c) in &pods {
        f.sample(&[("namespace", ns), ("pod", pod)], c.tcp_rtt_samples as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_is_a_second_to_a_day() {
        assert_eq!(parse_grace("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_grace("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_grace("0s").unwrap_err().contains("1s to 24h"));
        assert!(parse_grace("0").is_err());
        assert!(parse_grace("25h").is_err());
    }

    #[test]
    fn help_texts_state_the_bounds() {
        // The help of sync_state and dropped_total names these numbers.
        assert_eq!(crate::pods::bound::WATCH_LINE_MAX, 16 << 20);
        assert_eq!(crate::pods::bound::BODY_MAX, 64 << 20);
        assert_eq!(crate::pods::index::MAX_PODS, 1000);
        assert_eq!(crate::pods::attrib::MAX_LABEL_SETS, 5000);
        assert_eq!(crate::pods::hierarchy::MAX_KEPT, 16_384);
    }

    #[test]
    fn programs_follow_the_kernel_features() {
        let k = Kernel { tracefs: None, release: "6.18.0".into() };
        assert_eq!(programs(SYSCALLS, &k).iter().map(|p| p.name).collect::<Vec<_>>(), ["sys_exit"]);
        let all = programs(SYSCALLS | RUNQ | TCP | SKB | BLOCK | TCP_CONN, &k);
        assert_eq!(all.len(), 1 + 3 + 1 + 1 + 3 + 1);
    }
}
