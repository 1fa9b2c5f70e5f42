//! `pod_cpu_throttling`: CFS bandwidth throttling of this node's pods and
//! containers that have a CPU limit, read from their cgroups' `cpu.stat`
//! (`nr_periods`, `nr_throttled`, and `throttled_usec` on cgroup v2 or
//! `throttled_time` on v1) and their limit (`cpu.max` on v2;
//! `cpu.cfs_quota_us` and `cpu.cfs_period_us` on v1, whose `cpu`
//! hierarchy is used when the v2 one has no CPU controller).
//!
//! Why `cpu.stat` and not eBPF: the kernel has no tracepoint where a
//! cgroup's run queue is throttled or unthrottled (`throttle_cfs_rq` and
//! `unthrottle_cfs_rq` are plain functions, reachable only by kprobes or
//! fentry), while `cpu.stat` is the kernel's own exact count. The counters
//! are therefore exact. The histogram of throttle durations observes, for
//! each cgroup and scrape, the mean throttled time of the periods throttled
//! since the previous scrape, once per such period: its count is exactly
//! `nr_throttled` and its sum exactly `throttled_usec`, and its buckets are
//! exact when the throttled periods between two scrapes were alike (a
//! steady CPU-bound container is throttled for the same part of every
//! period).
//!
//! Shares pod attribution's watch on the API server and its flags
//! (`--collector.ebpf_pods.*`); without a Kubernetes API it is off, as
//! attribution is. Series: one per pod (`container=""`, the pod's own
//! cgroup, limited when every container has a limit) and one per container
//! with a CPU limit, kept `--collector.ebpf_pods.grace-period` after the
//! pod's deletion; counts carry over container restarts (a new cgroup adds
//! to the same series).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::pods::cgroup;
use crate::pods::Watched;

/// Upper bounds of the throttle duration histogram, in seconds: a period
/// is 1 ms to 1 s (the kubelet's default is 100 ms).
pub const BOUNDS: [f64; 11] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0];

pub fn args() -> Vec<Arg> {
    Vec::new()
}

/// A cgroup's `cpu.stat` bandwidth counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub periods: u64,
    pub throttled: u64,
    pub throttled_ns: u64,
}

/// Parses `cpu.stat` (v2's `throttled_usec` or v1's `throttled_time` in
/// ns); None without the bandwidth counters.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (mut p, mut n, mut t) = (None, None, None);
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(k), Some(v), None) = (f.next(), f.next(), f.next()) else { continue };
        let v = v.parse::<u64>().ok();
        match k {
            "nr_periods" => p = v,
            "nr_throttled" => n = v,
            "throttled_usec" => t = v.and_then(|us| us.checked_mul(1000)),
            "throttled_time" => t = v,
            _ => {}
        }
    }
    Some(Stat { periods: p?, throttled: n?, throttled_ns: t? })
}

/// Parses cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`: the
/// limit in cores, None when unlimited (`-1`).
pub fn parse_v1_limit(quota: &str, period: &str) -> Result<Option<f64>, String> {
    let quota: i64 = quota.trim().parse().map_err(|_| format!("bad quota {quota:?}"))?;
    let period: u64 = period.trim().parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("bad period {period:?}"))?;
    Ok((quota >= 0).then(|| quota as f64 / period as f64))
}

/// Parses `cpu.max` (`$MAX $PERIOD`): the limit in cores, None when
/// unlimited (`max`).
pub fn parse_max(text: &str) -> Result<Option<f64>, String> {
    let mut f = text.split_whitespace();
    let (Some(quota), Some(period), None) = (f.next(), f.next(), f.next()) else { return Err(format!("not \"$MAX $PERIOD\": {text:?}")) };
    let period: u64 = period.parse().ok().filter(|p| *p > 0).ok_or_else(|| format!("bad period {period:?}"))?;
    if quota == "max" {
        return Ok(None);
    }
    let quota: u64 = quota.parse().map_err(|_| format!("bad quota {quota:?}"))?;
    Ok(Some(quota as f64 / period as f64))
}

/// One series' totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub periods: u64,
    pub throttled: u64,
    pub throttled_ns: u64,
    /// Throttled periods by duration bucket (`BOUNDS`, then `+Inf`).
    pub buckets: [u64; BOUNDS.len() + 1],
    /// The current limit in cores (of the newest cgroup seen).
    pub limit: f64,
}

impl Series {
    /// Adds what a cgroup counted since its previous reading `prev`
    /// (zero when first seen): the throttled periods between the two
    /// readings are observed at their mean duration.
    pub fn add(&mut self, prev: Stat, now: Stat) {
        // Counters only grow; a smaller value is a new cgroup's.
        let d = |a: u64, b: u64| if b >= a { b - a } else { b };
        let (periods, n, ns) = (d(prev.periods, now.periods), d(prev.throttled, now.throttled), d(prev.throttled_ns, now.throttled_ns));
        self.periods += periods;
        self.throttled += n;
        self.throttled_ns += ns;
        if n > 0 {
            let mean = ns as f64 / 1e9 / n as f64;
            let i = BOUNDS.iter().position(|b| mean <= *b).unwrap_or(BOUNDS.len());
            self.buckets[i] += n;
        }
    }
}

/// A series: namespace, pod, container ("" for the pod's own cgroup).
type Key = (String, String, String);

/// Which cgroup hierarchy has the CPU controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The hierarchy the limits are in: the v2 one when it has the CPU
/// controller, else v1's `cpu` hierarchy.
fn hierarchy(sysfs: &std::path::Path) -> Option<(PathBuf, Version)> {
    if let Some(v2) = cgroup::v2_root(sysfs) {
        let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "cpu") {
            return Some((v2, Version::V2));
        }
    }
    ["cpu", "cpu,cpuacct", "cpuacct,cpu"]
        .iter()
        .map(|n| sysfs.join("fs/cgroup").join(n))
        .find(|p| p.join("cpu.cfs_quota_us").exists())
        .map(|p| (p, Version::V1))
}

struct Active {
    pods: Arc<Watched>,
    root: PathBuf,
    version: Version,
    /// Expire deleted pods from the shared index (when `ebpf_pods`, which
    /// otherwise does, is off).
    expires: bool,
    grace: Duration,
    /// Each limited cgroup's previous reading, by id.
    last: HashMap<u64, Stat>,
    /// Totals by series, with the pod UID they expire with.
    series: BTreeMap<Key, (String, Series)>,
}

pub struct Collector {
    active: Option<Active>,
}

pub fn build(f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let grace = super::ebpf_pods::GRACE_PERIOD.get(f)?;
    let Some(pods) = ctx.pods()? else { return Ok(Box::new(Collector { active: None })) };
    let Some((root, version)) = hierarchy(&p.sysfs) else {
        tracing::warn!(sysfs = %p.sysfs.display(), "no cgroup hierarchy with the CPU controller: pod CPU throttling is off");
        return Ok(Box::new(Collector { active: None }));
    };
    let expires = !ctx.pods_attribution;
    let active = Active { pods, root, version, expires, grace, last: HashMap::new(), series: BTreeMap::new() };
    Ok(Box::new(Collector { active: Some(active) }))
}

/// A limited cgroup read this scrape.
struct Reading {
    id: u64,
    uid: String,
    container: Option<String>,
    stat: Stat,
    limit: f64,
}

/// Reads the pods' own and containers' cgroups that have a CPU limit.
/// Files that cannot be read (a cgroup going away, or without the CPU
/// controller) leave that cgroup out; a malformed one fails the collector.
fn read(root: &std::path::Path, version: Version) -> Result<Vec<Reading>, host::Error> {
    let mut out = Vec::new();
    for (id, c) in cgroup::walk_pods(root) {
        let Some(pod) = c.pod.filter(|_| cgroup::is_own(&c.path)) else { continue };
        let dir = root.join(&c.path);
        let limit = match version {
            Version::V2 => {
                let path = dir.join("cpu.max");
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                parse_max(&text).map_err(|m| host::Error::parse(&path, m))?
            }
            Version::V1 => {
                let (q, p) = (dir.join("cpu.cfs_quota_us"), dir.join("cpu.cfs_period_us"));
                let (Ok(quota), Ok(period)) = (std::fs::read_to_string(&q), std::fs::read_to_string(&p)) else { continue };
                parse_v1_limit(&quota, &period).map_err(|m| host::Error::parse(&q, m))?
            }
        };
        let Some(limit) = limit else { continue };
        let path = dir.join("cpu.stat");
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let stat = parse_stat(&text)
            .ok_or_else(|| host::Error::parse(&path, "no nr_periods, nr_throttled and throttled_usec (or throttled_time)"))?;
        out.push(Reading { id, uid: pod.uid, container: pod.container, stat, limit });
    }
    Ok(out)
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let Some(a) = &mut self.active else { return Ok(()) };
        let readings = read(&a.root, a.version)?;
        let now = Instant::now();
        {
            let mut idx = a.pods.lock();
            if a.expires {
                idx.expire(now, a.grace);
            }
            let mut seen = HashSet::new();
            for r in &readings {
                let Some((uid, meta)) = idx.get(&r.uid) else { continue };
                let container = match &r.container {
                    None => String::new(),
                    // A container the API server has not named yet: read
                    // again next scrape, nothing lost.
                    Some(id) => match meta.containers.get(id) {
                        Some(name) => name.clone(),
                        None => continue,
                    },
                };
                seen.insert(r.id);
                let prev = a.last.insert(r.id, r.stat).unwrap_or_default();
                let key = (meta.namespace.clone(), meta.name.clone(), container);
                let (_, s) = a.series.entry(key).or_insert_with(|| (uid.to_string(), Series::default()));
                s.add(prev, r.stat);
                s.limit = r.limit;
            }
            a.last.retain(|id, _| seen.contains(id));
            let live: HashSet<&str> = idx.live(now, a.grace).map(|(u, _)| u.as_str()).collect();
            a.series.retain(|_, (uid, _)| live.contains(uid.as_str()));
        }
        emit(sink, &a.series);
        Ok(())
    }
}

fn emit(sink: &mut Sink, series: &BTreeMap<Key, (String, Series)>) {
    fn labels((ns, pod, c): &Key) -> [(&str, &str); 3] {
        [("container", c.as_str()), ("namespace", ns.as_str()), ("pod", pod.as_str())]
    }
    let mut f = sink.family(
        "node_pod_cpu_cfs_periods_total",
        "CFS bandwidth periods that elapsed with the cgroup runnable (cpu.stat nr_periods), for pods and containers with a CPU limit.",
        Kind::Counter,
    );
    for (k, (_, s)) in series {
        f.sample(&labels(k), s.periods as f64);
    }
    let mut f = sink.family(
        "node_pod_cpu_cfs_throttled_periods_total",
        "CFS bandwidth periods in which the cgroup was throttled for using up its CPU limit (cpu.stat nr_throttled).",
        Kind::Counter,
    );
    for (k, (_, s)) in series {
        f.sample(&labels(k), s.throttled as f64);
    }
    let mut f = sink.family(
        "node_pod_cpu_cfs_throttled_seconds_total",
        "Time the cgroup's tasks were throttled for using up its CPU limit (cpu.stat throttled_usec, or throttled_time on cgroup v1).",
        Kind::Counter,
    );
    for (k, (_, s)) in series {
        f.sample(&labels(k), s.throttled_ns as f64 / 1e9);
    }
    let mut f = sink.family("node_pod_cpu_cfs_limit_cores", "The cgroup's CPU limit (cpu.max quota over period), in cores.", Kind::Gauge);
    for (k, (_, s)) in series {
        f.sample(&labels(k), s.limit);
    }
    let mut f = sink.family(
        "node_pod_cpu_cfs_throttle_duration_seconds",
        "Throttled periods by how long they were throttled (each scrape's mean per throttled period, from cpu.stat).",
        Kind::Histogram,
    );
    let mut cum = Vec::with_capacity(BOUNDS.len());
    for (k, (_, s)) in series {
        cum.clear();
        let mut c = 0;
        for (b, n) in BOUNDS.iter().zip(s.buckets) {
            c += n;
            cum.push((*b, c));
        }
        f.histogram(&labels(k), s.throttled_ns as f64 / 1e9, s.throttled, &cum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_stat_and_max() {
        let text = "usage_usec 91234\nuser_usec 90000\nsystem_usec 1234\nnr_periods 52\nnr_throttled 47\nthrottled_usec 4211000\nnr_bursts 0\nburst_usec 0\n";
        assert_eq!(parse_stat(text), Some(Stat { periods: 52, throttled: 47, throttled_ns: 4_211_000_000 }));
        let v1 = "nr_periods 52\nnr_throttled 47\nthrottled_time 4211000123\nnr_bursts 0\nburst_time 0\n";
        assert_eq!(parse_stat(v1), Some(Stat { periods: 52, throttled: 47, throttled_ns: 4_211_000_123 }));
        assert_eq!(parse_v1_limit("10000\n", "100000\n"), Ok(Some(0.1)));
        assert_eq!(parse_v1_limit("-1\n", "100000\n"), Ok(None));
        assert!(parse_v1_limit("x", "100000").is_err() && parse_v1_limit("10000", "0").is_err());
        assert_eq!(parse_stat("usage_usec 5\nuser_usec 5\nsystem_usec 0\n"), None, "no CPU controller");
        assert_eq!(parse_stat("nr_periods x\nnr_throttled 1\nthrottled_usec 1\n"), None, "malformed");
        assert_eq!(parse_max("10000 100000\n"), Ok(Some(0.1)));
        assert_eq!(parse_max("250000 100000"), Ok(Some(2.5)));
        assert_eq!(parse_max("max 100000\n"), Ok(None));
        for bad in ["10000 0", "", "10000", "x 100000", "1 2 3", "-5 100000"] {
            assert!(parse_max(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn series_add_deltas_and_observe_the_mean_per_throttled_period() {
        let mut s = Series::default();
        // First reading: the whole history, 10 periods of 90 ms each.
        s.add(Stat::default(), Stat { periods: 12, throttled: 10, throttled_ns: 900_000_000 });
        // Then 5 more at 40 ms.
        s.add(
            Stat { periods: 12, throttled: 10, throttled_ns: 900_000_000 },
            Stat { periods: 20, throttled: 15, throttled_ns: 1_100_000_000 },
        );
        // Nothing throttled: no observation.
        s.add(
            Stat { periods: 20, throttled: 15, throttled_ns: 1_100_000_000 },
            Stat { periods: 25, throttled: 15, throttled_ns: 1_100_000_000 },
        );
        assert_eq!((s.periods, s.throttled, s.throttled_ns), (25, 15, 1_100_000_000));
        let at = |s: &Series, b: f64| s.buckets[BOUNDS.iter().position(|x| *x == b).expect("bound")];
        assert_eq!(at(&s, 0.1), 10, "90 ms");
        assert_eq!(at(&s, 0.05), 5, "40 ms");
        assert_eq!(s.buckets.iter().sum::<u64>(), s.throttled, "the count is nr_throttled");
        // A recreated cgroup's smaller counters count from zero.
        s.add(Stat { periods: 25, throttled: 15, throttled_ns: 1_100_000_000 }, Stat { periods: 3, throttled: 2, throttled_ns: 4_000_000 });
        assert_eq!((s.periods, s.throttled, s.throttled_ns), (28, 17, 1_104_000_000));
        assert_eq!(at(&s, 0.0025), 2, "2 ms each");
    }

    #[test]
    fn long_throttles_go_to_inf() {
        let mut s = Series::default();
        s.add(Stat::default(), Stat { periods: 1, throttled: 1, throttled_ns: 3_000_000_000 });
        assert_eq!(s.buckets[BOUNDS.len()], 1);
    }

    const UID: &str = "0f9e2c6a-1b3d-4e5f-8a7b-9c0d1e2f3a4b";
    const CID: &str = "4c5d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

    fn write(dir: &std::path::Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).expect("mkdir");
        for (f, t) in files {
            std::fs::write(dir.join(f), t).expect("write");
        }
    }

    #[test]
    fn reads_limited_pod_and_container_cgroups_of_either_version() {
        let tmp = std::env::temp_dir().join(format!("na-throttle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let stat = "nr_periods 5\nnr_throttled 4\nthrottled_usec 360000\n";
        // v2: the pod limited, its container limited, the conmon cgroup and
        // an unlimited container left out.
        let pod = tmp.join(format!("v2/kubepods/burstable/pod{UID}"));
        write(&pod, &[("cpu.max", "20000 100000\n"), ("cpu.stat", stat)]);
        write(&pod.join(CID), &[("cpu.max", "10000 100000\n"), ("cpu.stat", stat)]);
        write(&pod.join(CID.replace('4', "5")), &[("cpu.max", "max 100000\n"), ("cpu.stat", stat)]);
        write(&pod.join(CID).join("sub"), &[("cpu.max", "10000 100000\n"), ("cpu.stat", stat)]);
        let mut got: Vec<(Option<String>, f64, Stat)> =
            read(&tmp.join("v2"), Version::V2).expect("reads").into_iter().map(|r| (r.container, r.limit, r.stat)).collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let s = Stat { periods: 5, throttled: 4, throttled_ns: 360_000_000 };
        assert_eq!(got, [(None, 0.2, s), (Some(CID.to_string()), 0.1, s)]);
        // v1 names.
        let c1 = tmp.join(format!("v1/kubepods/pod{UID}/{CID}"));
        write(
            &c1,
            &[
                ("cpu.cfs_quota_us", "10000\n"),
                ("cpu.cfs_period_us", "100000\n"),
                ("cpu.stat", "nr_periods 5\nnr_throttled 4\nthrottled_time 360000000\n"),
            ],
        );
        write(&tmp.join(format!("v1/kubepods/pod{UID}")), &[("cpu.cfs_quota_us", "-1\n"), ("cpu.cfs_period_us", "100000\n")]);
        let got: Vec<(Option<String>, Stat)> =
            read(&tmp.join("v1"), Version::V1).expect("reads").into_iter().map(|r| (r.container, r.stat)).collect();
        assert_eq!(got, [(Some(CID.to_string()), s)]);
        // A malformed limit fails the collector, naming the file.
        write(&c1, &[("cpu.cfs_quota_us", "lots\n")]);
        let err = read(&tmp.join("v1"), Version::V1).err().map(|e| e.to_string()).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(err.contains("cpu.cfs_quota_us") && err.contains("lots"), "{err}");
    }
}
