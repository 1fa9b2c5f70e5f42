//! From per-cgroup kernel counters to per-pod series, with the bookkeeping
//! that keeps them counters: a cgroup's owner is decided once; a cgroup
//! that is gone is kept for the grace period, then its counts move to a
//! "retired" total of its owner (so a restarted container's or an ended
//! host service's counts never go backwards) and its kernel entry is
//! deleted; a deleted pod's series disappear once the grace period is over.
//! Pure: the caller passes the map entries, the hierarchy and the pods.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use agent_common::pods::PodCounters;

use super::cgroup::Cgroup;
use super::index::PodIndex;

/// Whose counts these are: a pod's container (`uid` and `container` may be
/// empty: the pod's own cgroups), or the host (`uid` empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub uid: String,
    pub container: String,
}

/// Exported labels: namespace, pod, container (all empty for the host).
pub type Labels = (String, String, String);

#[derive(Debug)]
struct Tracked {
    owner: Option<Owner>,
    first_seen: Instant,
    gone_since: Option<Instant>,
    /// Its path named a pod.
    pod_cgroup: bool,
}

/// The result of one pass.
#[derive(Debug, Default)]
pub struct Outcome {
    pub series: BTreeMap<Labels, PodCounters>,
    /// Kernel map entries to delete (cgroups retired or dropped).
    pub delete: Vec<u64>,
    /// Cgroups with counts whose owner is not known yet.
    pub pending: usize,
    pub attributed: usize,
    /// Label sets (pod and container) left out to stay within
    /// [`MAX_LABEL_SETS`].
    pub dropped_label_sets: usize,
}

/// The most label sets (namespace, pod, container) exported per pass, the
/// host's included: five containers for each of `index::MAX_PODS` pods.
/// Each set is one series of the per-container family and, with the
/// other sets of its pod, one series of each per-pod family. Whole pods are
/// left out beyond it (the last ones in label order), so a pod's totals are
/// never partial.
pub const MAX_LABEL_SETS: usize = 5 * super::index::MAX_PODS;

pub fn add(a: &mut PodCounters, b: &PodCounters) {
    a.runq_wait_ns = a.runq_wait_ns.wrapping_add(b.runq_wait_ns);
    a.runq_waits = a.runq_waits.wrapping_add(b.runq_waits);
    a.oom_kills = a.oom_kills.wrapping_add(b.oom_kills);
    a.tcp_retransmits = a.tcp_retransmits.wrapping_add(b.tcp_retransmits);
    a.read_bytes = a.read_bytes.wrapping_add(b.read_bytes);
    a.write_bytes = a.write_bytes.wrapping_add(b.write_bytes);
    a.syscall_errors = a.syscall_errors.wrapping_add(b.syscall_errors);
    a.skb_drops = a.skb_drops.wrapping_add(b.skb_drops);
    a.slow_syscalls = a.slow_syscalls.wrapping_add(b.slow_syscalls);
    a.tcp_connect_failures = a.tcp_connect_failures.wrapping_add(b.tcp_connect_failures);
    a.tcp_rtt_ns = a.tcp_rtt_ns.wrapping_add(b.tcp_rtt_ns);
    a.tcp_rtt_samples = a.tcp_rtt_samples.wrapping_add(b.tcp_rtt_samples);
}

/// The state kept between scrapes.
#[derive(Debug)]
pub struct Attribution {
    tracked: HashMap<u64, Tracked>,
    retired: HashMap<Owner, PodCounters>,
    /// How long a gone cgroup or a deleted pod is kept.
    pub grace: Duration,
    /// How long a container's cgroup waits for its id to appear in the
    /// pod's status before it is counted as the pod's own.
    pub container_wait: Duration,
    /// The most label sets exported.
    pub max_label_sets: usize,
}

impl Attribution {
    pub fn new(grace: Duration) -> Self {
        Attribution {
            tracked: HashMap::new(),
            retired: HashMap::new(),
            grace,
            container_wait: Duration::from_secs(30).min(grace),
            max_label_sets: MAX_LABEL_SETS,
        }
    }

    /// Decides a present cgroup's owner, or None while it cannot be told.
    fn classify(&self, cg: &Cgroup, t: &Tracked, pods: &PodIndex, now: Instant) -> Option<Owner> {
        let Some(r) = &cg.pod else { return Some(Owner::default()) };
        let (uid, meta) = pods.get(&r.uid)?;
        let container = match &r.container {
            None => String::new(),
            Some(id) => match meta.containers.get(id) {
                Some(name) => name.clone(),
                None if now.duration_since(t.first_seen) >= self.container_wait => String::new(),
                None => return None,
            },
        };
        Some(Owner { uid: uid.to_string(), container })
    }

    /// One pass over the kernel's entries.
    pub fn update(&mut self, entries: &[(u64, PodCounters)], cgroups: &HashMap<u64, Cgroup>, pods: &mut PodIndex, now: Instant) -> Outcome {
        let mut out = Outcome::default();
        // The watch expires deleted pods on its own timer; this pass's
        // clock may be ahead of it.
        pods.expire(now, self.grace);
        // Pods no longer in the index (expired, or cut short to make room):
        // their counts and kernel entries go.
        let known = |o: &Owner| o.uid.is_empty() || pods.contains(&o.uid);
        self.retired.retain(|o, _| known(o));
        self.tracked.retain(|id, t| {
            let gone = t.owner.as_ref().is_some_and(|o| !known(o));
            if gone {
                out.delete.push(*id);
            }
            !gone
        });
        let mut live: HashMap<Owner, PodCounters> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for (id, c) in entries {
            if out.delete.contains(id) {
                continue;
            }
            seen.insert(*id);
            let mut t = self.tracked.remove(id).unwrap_or(Tracked { owner: None, first_seen: now, gone_since: None, pod_cgroup: false });
            match cgroups.get(id) {
                Some(cg) => {
                    t.gone_since = None;
                    t.pod_cgroup |= cg.pod.is_some();
                    if t.owner.is_none() {
                        t.owner = self.classify(cg, &t, pods, now);
                    }
                }
                None => {
                    let since = *t.gone_since.get_or_insert(now);
                    let waited = now.duration_since(since) >= self.grace;
                    match &t.owner {
                        // Never named: a host cgroup that came and went between walks.
                        None if waited && !t.pod_cgroup => t.owner = Some(Owner::default()),
                        None if waited => {
                            out.delete.push(*id);
                            continue;
                        }
                        Some(owner) if waited => {
                            add(self.retired.entry(owner.clone()).or_default(), c);
                            out.delete.push(*id);
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            match &t.owner {
                Some(o) => {
                    add(live.entry(o.clone()).or_default(), c);
                    out.attributed += 1;
                }
                None => out.pending += 1,
            }
            self.tracked.insert(*id, t);
        }
        self.tracked.retain(|id, _| seen.contains(id));
        // Every live pod and container has series from the start.
        live.entry(Owner::default()).or_default();
        for (uid, meta) in pods.live(now, self.grace) {
            for name in meta.container_names.iter().map(String::as_str).chain(meta.container_names.is_empty().then_some("")) {
                live.entry(Owner { uid: uid.clone(), container: name.to_string() }).or_default();
            }
        }
        for (o, c) in &self.retired {
            add(live.entry(o.clone()).or_default(), c);
        }
        for (o, c) in live {
            let labels = if o.uid.is_empty() {
                Labels::default()
            } else {
                match pods.get(&o.uid) {
                    Some((_, m)) => (m.namespace.clone(), m.name.clone(), o.container.clone()),
                    None => continue,
                }
            };
            add(out.series.entry(labels).or_default(), &c);
        }
        out.dropped_label_sets = cap_label_sets(&mut out.series, self.max_label_sets);
        out
    }
}

/// Keeps at most `max` label sets: the host's, then whole pods in label
/// order, each pod that fits in the room left (a pod too large to fit is
/// left out, and the pods after it still have their place); returns how
/// many were left out.
pub fn cap_label_sets(series: &mut BTreeMap<Labels, PodCounters>, max: usize) -> usize {
    if series.len() <= max {
        return 0;
    }
    let mut per_pod: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (ns, pod, _) in series.keys() {
        *per_pod.entry((ns, pod)).or_default() += 1;
    }
    let mut kept = std::collections::HashSet::new();
    let mut n = 0;
    // The host first ("" sorts first), then every whole pod that fits.
    for (pod, count) in per_pod {
        if n + count > max {
            continue;
        }
        n += count;
        kept.insert((pod.0.to_string(), pod.1.to_string()));
    }
    let before = series.len();
    series.retain(|(ns, pod, _), _| kept.contains(&(ns.clone(), pod.clone())));
    before - series.len()
}

#[cfg(test)]
mod tests {
    use super::super::cgroup::PodRef;
    use super::super::index::tests::pod;
    use super::*;

    const CID: &str = "4c5d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";
    const CID2: &str = "5c5d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d";

    fn errs(n: u64) -> PodCounters {
        PodCounters { syscall_errors: n, oom_kills: n, ..Default::default() }
    }

    fn cg(uid: Option<&str>, container: Option<&str>) -> Cgroup {
        Cgroup { path: "x".into(), pod: uid.map(|u| PodRef { uid: u.into(), container: container.map(str::to_string) }) }
    }

    fn labels(ns: &str, pod: &str, c: &str) -> Labels {
        (ns.into(), pod.into(), c.into())
    }

    #[test]
    fn pods_containers_and_host_with_zero_series_for_quiet_pods() {
        let now = Instant::now();
        let mut pods = PodIndex::default();
        pods.apply(&pod("u1", "web", "web-0", &[("app", CID)]));
        pods.apply(&pod("u2", "db", "db-0", &[("pg", CID2)]));
        let cgroups: HashMap<u64, Cgroup> =
            [(10, cg(Some("u1"), Some(CID))), (11, cg(Some("u1"), None)), (20, cg(None, None)), (21, cg(None, None))].into();
        let mut a = Attribution::new(Duration::from_secs(60));
        let out = a.update(&[(10, errs(5)), (11, errs(1)), (20, errs(7)), (21, errs(1))], &cgroups, &mut pods, now);
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 5);
        assert_eq!(out.series[&labels("web", "web-0", "")].syscall_errors, 1, "the pod's own cgroup");
        assert_eq!(out.series[&labels("", "", "")].syscall_errors, 8, "host");
        assert_eq!(out.series[&labels("db", "db-0", "pg")], PodCounters::default(), "a quiet pod is there at 0");
        assert_eq!((out.attributed, out.pending, out.delete.len()), (4, 0, 0));
    }

    #[test]
    fn unknown_pods_wait_and_unknown_containers_fall_back_to_the_pod() {
        let t0 = Instant::now();
        let mut pods = PodIndex::default();
        let cgroups: HashMap<u64, Cgroup> = [(10, cg(Some("u1"), Some(CID)))].into();
        let mut a = Attribution::new(Duration::from_secs(60));
        let out = a.update(&[(10, errs(3))], &cgroups, &mut pods, t0);
        assert_eq!((out.pending, out.series.len()), (1, 1), "held back, only the host series");
        // The pod is known, its container id not yet: wait for it...
        pods.apply(&pod("u1", "web", "web-0", &[]));
        let out = a.update(&[(10, errs(3))], &cgroups, &mut pods, t0 + Duration::from_secs(5));
        assert_eq!(out.pending, 1);
        // ...then count it as the pod's own, for good.
        let out = a.update(&[(10, errs(4))], &cgroups, &mut pods, t0 + Duration::from_secs(31));
        assert_eq!(out.series[&labels("web", "web-0", "")].syscall_errors, 4);
        pods.apply(&pod("u1", "web", "web-0", &[("app", CID)]));
        let out = a.update(&[(10, errs(6))], &cgroups, &mut pods, t0 + Duration::from_secs(32));
        assert_eq!(out.series[&labels("web", "web-0", "")].syscall_errors, 6, "the owner never changes");
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 0);
    }

    #[test]
    fn gone_cgroups_retire_into_their_owner_and_never_go_backwards() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut pods = PodIndex::default();
        pods.apply(&pod("u1", "web", "web-0", &[("app", CID), ("side", CID2)]));
        let mut cgroups: HashMap<u64, Cgroup> = [(10, cg(Some("u1"), Some(CID))), (20, cg(None, None))].into();
        let mut a = Attribution::new(grace);
        a.update(&[(10, errs(5)), (20, errs(2))], &cgroups, &mut pods, t0);
        // The container restarts (new cgroup 12 with the same name), the host service ends.
        let mut p = pod("u1", "web", "web-0", &[("app", CID2)]);
        if let Some(st) = p.status.as_mut().and_then(|s| s.container_statuses.as_mut()) {
            st[0].last_state = Some(
                serde_json::from_value(serde_json::json!({"terminated": {"exitCode": 137, "containerID": format!("containerd://{CID}")}}))
                    .expect("state"),
            );
        }
        pods.apply(&p);
        cgroups.remove(&10);
        cgroups.remove(&20);
        cgroups.insert(12, cg(Some("u1"), Some(CID2)));
        let t1 = t0 + Duration::from_secs(10);
        let out = a.update(&[(10, errs(5)), (20, errs(2)), (12, errs(1))], &cgroups, &mut pods, t1);
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 6);
        assert!(out.delete.is_empty(), "kept for the grace period");
        let out = a.update(&[(10, errs(5)), (20, errs(2)), (12, errs(2))], &cgroups, &mut pods, t1 + grace);
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 7);
        assert_eq!(out.series[&labels("", "", "")].syscall_errors, 2);
        let mut deleted = out.delete.clone();
        deleted.sort();
        assert_eq!(deleted, vec![10, 20]);
        // After the kernel entries are gone, the totals hold.
        let out = a.update(&[(12, errs(3))], &cgroups, &mut pods, t1 + grace + Duration::from_secs(1));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 8);
        assert_eq!(out.series[&labels("", "", "")].syscall_errors, 2);
    }

    /// One pod with one container (cgroup 10), 5 errors counted at `t0`,
    /// then the pod deleted at `t0`.
    fn one_pod_counted_then_deleted(t0: Instant, grace: Duration) -> (Attribution, PodIndex, HashMap<u64, Cgroup>) {
        let mut pods = PodIndex::default();
        let p = pod("u1", "web", "web-0", &[("app", CID)]);
        pods.apply(&p);
        let cgroups: HashMap<u64, Cgroup> = [(10, cg(Some("u1"), Some(CID)))].into();
        let mut a = Attribution::new(grace);
        a.update(&[(10, errs(5))], &cgroups, &mut pods, t0);
        pods.delete(&p, t0);
        (a, pods, cgroups)
    }

    #[test]
    fn deleted_pods_disappear_after_grace_and_their_entries_go() {
        let (t0, grace) = (Instant::now(), Duration::from_secs(60));
        let (mut a, mut pods, cgroups) = one_pod_counted_then_deleted(t0, grace);
        let out = a.update(&[(10, errs(5))], &cgroups, &mut pods, t0 + Duration::from_secs(59));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 5, "still there within the grace period");
        let out = a.update(&[(10, errs(5))], &cgroups, &mut pods, t0 + grace);
        assert_eq!(out.delete, vec![10]);
        assert_eq!(out.series.len(), 1, "only the host: {:?}", out.series.keys());
    }

    #[test]
    fn short_lived_cgroups_never_walked_count_as_host_after_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut pods = PodIndex::default();
        let mut a = Attribution::new(grace);
        let none = HashMap::new();
        let out = a.update(&[(99, errs(4))], &none, &mut pods, t0);
        assert_eq!((out.pending, out.series[&Labels::default()].syscall_errors), (1, 0));
        let out = a.update(&[(99, errs(4))], &none, &mut pods, t0 + grace);
        assert_eq!((out.pending, out.series[&Labels::default()].syscall_errors), (0, 4));
        let out = a.update(&[(99, errs(4))], &none, &mut pods, t0 + grace * 2);
        assert_eq!((out.delete.clone(), out.series[&Labels::default()].syscall_errors), (vec![99], 4));
    }

    #[test]
    fn pods_the_watch_expired_between_passes_lose_their_entries_and_counts() {
        let (t0, grace) = (Instant::now(), Duration::from_secs(60));
        let (mut a, mut pods, cgroups) = one_pod_counted_then_deleted(t0, grace);
        // The watch's timer, not a pass, forgets the pod.
        assert_eq!(pods.expire(t0 + grace, grace), vec!["u1".to_string()]);
        let out = a.update(&[(10, errs(5))], &cgroups, &mut pods, t0 + grace);
        assert_eq!(out.delete, vec![10]);
        assert_eq!(out.series.len(), 1, "only the host: {:?}", out.series.keys());
        assert!(a.tracked.is_empty() && a.retired.is_empty());
    }

    #[test]
    fn label_sets_are_capped_by_whole_pods_and_counted() {
        let now = Instant::now();
        let mut pods = PodIndex::default();
        pods.apply(&pod("u1", "a", "p1", &[("c1", CID), ("c2", CID2)]));
        pods.apply(&pod("u2", "b", "p2", &[("c1", "x")]));
        pods.apply(&pod("u3", "c", "p3", &[("c1", "y")]));
        let mut a = Attribution::new(Duration::from_secs(60));
        a.max_label_sets = 3;
        let out = a.update(&[], &HashMap::new(), &mut pods, now);
        let keys: Vec<_> = out.series.keys().cloned().collect();
        assert_eq!(keys, [labels("", "", ""), labels("a", "p1", "c1"), labels("a", "p1", "c2")]);
        assert_eq!(out.dropped_label_sets, 2);
        a.max_label_sets = 4;
        let out = a.update(&[], &HashMap::new(), &mut pods, now);
        assert_eq!((out.series.len(), out.dropped_label_sets), (4, 1));
        a.max_label_sets = 100;
        assert_eq!(a.update(&[], &HashMap::new(), &mut pods, now).dropped_label_sets, 0);
    }

    #[test]
    fn a_pod_too_large_to_fit_leaves_the_others_their_place() {
        let now = Instant::now();
        let mut pods = PodIndex::default();
        pods.apply(&pod("u1", "a", "small", &[("c1", CID)]));
        let huge: Vec<(String, String)> = (0..50).map(|i| (format!("c{i:02}"), format!("id{i}"))).collect();
        let huge: Vec<(&str, &str)> = huge.iter().map(|(n, id)| (n.as_str(), id.as_str())).collect();
        pods.apply(&pod("u2", "b", "huge", &huge));
        pods.apply(&pod("u3", "c", "after", &[("c1", CID2)]));
        let mut a = Attribution::new(Duration::from_secs(60));
        a.max_label_sets = 10;
        let out = a.update(&[], &HashMap::new(), &mut pods, now);
        let keys: Vec<_> = out.series.keys().cloned().collect();
        assert_eq!(
            keys,
            [labels("", "", ""), labels("a", "small", "c1"), labels("c", "after", "c1")],
            "only the pod too large is left out"
        );
        assert_eq!(out.dropped_label_sets, 50);
    }
}
