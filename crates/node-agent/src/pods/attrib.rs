//! From per-cgroup kernel counters to per-pod series, with the bookkeeping
//! that keeps them counters and bounded: a cgroup's owner is decided once,
//! from the path it had (`hierarchy`, which names a cgroup when it is
//! made, so one that lives between two scrapes is still named) and the
//! pod watch; a kernel entry unchanged for a whole pass is taken out of
//! the kernel ([`Outcome::take`]) and its counts move to its owner's
//! "retired" total ([`Attribution::retire`]), so that the kernel map and
//! this state hold only the cgroups counted in the last interval, however
//! many come and go (short-lived host services, restarted containers), and
//! counters never go backwards; a deleted pod's series disappear once the
//! grace period is over. A pod cgroup whose pod is not known waits while
//! the pod watch is not synced (an API server outage), and for the grace
//! period once it is; then its counts are dropped and counted
//! ([`Outcome::unattributed`]). Pure: the caller passes the map entries,
//! the hierarchy and the pods.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use agent_common::pods::PodCounters;

use super::cgroup::PodRef;
use super::hierarchy::{Lookup, Whose};
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
    /// Its counts at the last pass (None before its first).
    last: Option<PodCounters>,
    /// Taken out to be dropped, not retired: its owner went, or none could
    /// be named.
    dropped: bool,
}

/// The result of one pass.
#[derive(Debug, Default)]
pub struct Outcome {
    pub series: BTreeMap<Labels, PodCounters>,
    /// Kernel map entries to take out (with their values, as
    /// `maps::hash_take` does) and hand to [`Attribution::retire`]: idle
    /// ones, whose counts move to their owner's total, and ones whose
    /// counts are dropped.
    pub take: Vec<u64>,
    /// Cgroups with counts whose owner is not known yet.
    pub pending: usize,
    pub attributed: usize,
    /// Label sets (pod and container) left out to stay within
    /// [`MAX_LABEL_SETS`].
    pub dropped_label_sets: usize,
    /// Cgroups whose counts this pass dropped: a pod's, whose pod the watch
    /// did not know within the grace period of being synced (deleted before
    /// it was listed, or beyond `index::MAX_PODS`).
    pub unattributed: usize,
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

/// Whether the counts of a pod cgroup whose pod is not known, first
/// counted at `seen`, are given up: the watch has been synced without a
/// failure for the grace period since it was counted (while the API server
/// cannot be reached, they wait).
pub fn gives_up(pods: &PodIndex, seen: Instant, grace: Duration, now: Instant) -> bool {
    pods.healthy_since().is_some_and(|h| now.saturating_duration_since(h.max(seen)) >= grace)
}

/// A pod cgroup's owner, or None while it cannot be told: its pod is not
/// known, or its container's id is not in the pod's status yet (for
/// `container_wait` after it was first counted at `seen`; then it is the
/// pod's own).
fn classify(r: &PodRef, seen: Instant, container_wait: Duration, pods: &PodIndex, now: Instant) -> Option<Owner> {
    let (uid, meta) = pods.get(&r.uid)?;
    let container = match &r.container {
        None => String::new(),
        Some(id) => match meta.containers.get(id) {
            Some(name) => name.clone(),
            None if now.duration_since(seen) >= container_wait => String::new(),
            None => return None,
        },
    };
    Some(Owner { uid: uid.to_string(), container })
}

/// The state kept between scrapes.
#[derive(Debug)]
pub struct Attribution {
    tracked: HashMap<u64, Tracked>,
    retired: HashMap<Owner, PodCounters>,
    /// How long a deleted pod is kept, and a pod cgroup waits for its pod.
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

    /// One pass over the kernel's entries.
    pub fn update(&mut self, entries: &[(u64, PodCounters)], cgroups: &impl Lookup, pods: &mut PodIndex, now: Instant) -> Outcome {
        let mut out = Outcome::default();
        // The watch expires deleted pods on its own timer; this pass's
        // clock may be ahead of it.
        pods.expire(now, self.grace);
        // Pods no longer in the index (expired, or cut short to make room):
        // their counts go, and their kernel entries are dropped.
        let known = |o: &Owner| o.uid.is_empty() || pods.contains(&o.uid);
        self.retired.retain(|o, _| known(o));
        for t in self.tracked.values_mut() {
            if t.owner.as_ref().is_some_and(|o| !known(o)) {
                t.dropped = true;
            }
        }
        let mut live: HashMap<Owner, PodCounters> = HashMap::new();
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        for (id, c) in entries {
            seen.insert(*id);
            let t = self.tracked.entry(*id).or_insert(Tracked { owner: None, first_seen: now, last: None, dropped: false });
            if t.dropped {
                out.take.push(*id);
                continue;
            }
            if t.owner.is_none() {
                t.owner = match cgroups.whose(*id, t.first_seen) {
                    Whose::Host => Some(Owner::default()),
                    Whose::NotYet => None,
                    Whose::Pod(r) => {
                        let owner = classify(r, t.first_seen, self.container_wait, pods, now);
                        if owner.is_none() && pods.get(&r.uid).is_none() && gives_up(pods, t.first_seen, self.grace, now) {
                            t.dropped = true;
                            out.take.push(*id);
                            out.unattributed += 1;
                            continue;
                        }
                        owner
                    }
                };
            }
            let Some(o) = &t.owner else {
                out.pending += 1;
                continue;
            };
            // Unchanged for a whole pass: out of the kernel, into the
            // owner's total (its counts stay in this pass's series).
            if t.last == Some(*c) {
                out.take.push(*id);
            }
            t.last = Some(*c);
            add(live.entry(o.clone()).or_default(), c);
            out.attributed += 1;
        }
        // Entries gone from the kernel without being taken: what they had
        // at the last pass stays their owner's.
        let retired = &mut self.retired;
        self.tracked.retain(|id, t| {
            if seen.contains(id) {
                return true;
            }
            if let (Some(o), Some(last), false) = (&t.owner, &t.last, t.dropped) {
                add(retired.entry(o.clone()).or_default(), last);
            }
            false
        });
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

    /// The entries [`Outcome::take`] named, as taken out of the kernel
    /// (each with its value when it was deleted; entries already gone are
    /// not among them): idle ones' counts join their owner's total, dropped
    /// ones' are forgotten.
    pub fn retire(&mut self, taken: &[(u64, PodCounters)]) {
        for (id, c) in taken {
            let Some(t) = self.tracked.remove(id) else { continue };
            if let (Some(o), false) = (t.owner, t.dropped) {
                add(self.retired.entry(o).or_default(), c);
            }
        }
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
    use super::super::cgroup::Cgroup;
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
        assert_eq!((out.attributed, out.pending, out.take.len()), (4, 0, 0));
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
    fn idle_entries_retire_into_their_owner_and_counts_never_go_backwards() {
        let t0 = Instant::now();
        let mut pods = PodIndex::default();
        pods.apply(&pod("u1", "web", "web-0", &[("app", CID), ("side", CID2)]));
        let cgroups: HashMap<u64, Cgroup> =
            [(10, cg(Some("u1"), Some(CID))), (12, cg(Some("u1"), Some(CID2))), (20, cg(None, None))].into();
        let mut a = Attribution::new(Duration::from_secs(60));
        let out = a.update(&[(10, errs(5)), (20, errs(2))], &cgroups, &mut pods, t0);
        assert!(out.take.is_empty(), "first seen: nothing idle yet");
        // 10 and 20 unchanged for a pass: taken out, their counts still shown.
        let t1 = t0 + Duration::from_secs(10);
        let out = a.update(&[(10, errs(5)), (20, errs(2)), (12, errs(1))], &cgroups, &mut pods, t1);
        let mut take = out.take.clone();
        take.sort();
        assert_eq!(take, vec![10, 20]);
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 5);
        assert_eq!(out.series[&labels("", "", "")].syscall_errors, 2);
        // Taken with what they held then (one more error came meanwhile).
        a.retire(&[(10, errs(6)), (20, errs(2))]);
        assert_eq!(a.tracked.len(), 1, "only the active cgroup is tracked");
        let out = a.update(&[(12, errs(2))], &cgroups, &mut pods, t1 + Duration::from_secs(10));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 6, "the error counted between the read and the take too");
        assert_eq!(out.series[&labels("", "", "")].syscall_errors, 2);
        // The kernel makes the entry again from zero: it adds.
        let out = a.update(&[(12, errs(2)), (10, errs(3))], &cgroups, &mut pods, t1 + Duration::from_secs(20));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 9);
        assert_eq!(out.series[&labels("web", "web-0", "side")].syscall_errors, 2);
        // An entry gone from the kernel without being taken keeps its last counts.
        let out = a.update(&[(12, errs(2))], &cgroups, &mut pods, t1 + Duration::from_secs(30));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 9);
    }

    /// A thousand short-lived host cgroups (timer units, sessions), one
    /// count each: the state and the kernel entries follow only the
    /// cgroups of the last interval; the host's total has every count.
    #[test]
    fn short_lived_cgroups_leave_nothing_behind_but_their_counts() {
        let mut t = Instant::now();
        let mut pods = PodIndex::default();
        let mut a = Attribution::new(Duration::from_secs(60));
        let none: HashMap<u64, Cgroup> = HashMap::new();
        let mut live: Vec<(u64, PodCounters)> = Vec::new();
        for batch in 0..10u64 {
            let new: Vec<(u64, PodCounters)> = (0..100).map(|i| (1000 + batch * 100 + i, errs(1))).collect();
            live.extend(new.iter().copied());
            t += Duration::from_secs(15);
            let out = a.update(&live, &none, &mut pods, t);
            // What was idle is taken out.
            let taken: Vec<(u64, PodCounters)> = live.iter().filter(|(id, _)| out.take.contains(id)).copied().collect();
            live.retain(|(id, _)| !out.take.contains(id));
            a.retire(&taken);
            assert!(a.tracked.len() <= 100, "batch {batch}: {} cgroups tracked", a.tracked.len());
        }
        let out = a.update(&live, &none, &mut pods, t + Duration::from_secs(15));
        assert_eq!(out.series[&Labels::default()].syscall_errors, 1000);
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
        assert_eq!(out.take, vec![10]);
        assert_eq!(out.series.len(), 1, "only the host: {:?}", out.series.keys());
        a.retire(&[(10, errs(5))]);
        assert!(a.retired.is_empty(), "a gone pod's counts are not kept");
    }

    #[test]
    fn host_cgroups_count_for_the_host_at_once() {
        let t0 = Instant::now();
        let mut pods = PodIndex::default();
        let mut a = Attribution::new(Duration::from_secs(60));
        let none = HashMap::new();
        let out = a.update(&[(99, errs(4))], &none, &mut pods, t0);
        assert_eq!((out.pending, out.series[&Labels::default()].syscall_errors), (0, 4));
    }

    /// The hierarchy cannot tell yet (it is walked, not followed, and no
    /// walk has run since the cgroup was counted): the counts wait.
    #[test]
    fn cgroups_the_hierarchy_cannot_name_yet_wait() {
        struct NotYet;
        impl Lookup for NotYet {
            fn whose(&self, _: u64, _: Instant) -> Whose<'_> {
                Whose::NotYet
            }
        }
        let t0 = Instant::now();
        let mut pods = PodIndex::default();
        let mut a = Attribution::new(Duration::from_secs(60));
        let out = a.update(&[(99, errs(4))], &NotYet, &mut pods, t0);
        assert_eq!((out.pending, out.series[&Labels::default()].syscall_errors), (1, 0));
        let host: HashMap<u64, Cgroup> = HashMap::new();
        let out = a.update(&[(99, errs(4))], &host, &mut pods, t0 + Duration::from_secs(1));
        assert_eq!((out.pending, out.series[&Labels::default()].syscall_errors), (0, 4));
    }

    /// The API server is out of reach longer than the grace period while a
    /// new pod counts: its counts wait and are its own once it is listed.
    /// A pod cgroup whose pod the synced watch never lists is dropped after
    /// the grace period, and counted.
    #[test]
    fn pod_cgroups_wait_for_their_pod_while_the_watch_is_down_and_then_for_the_grace_period() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(20);
        let mut pods = PodIndex::default();
        pods.begin_list();
        pods.end_list(t0);
        pods.set_reason(super::super::index::Reason::WatchFailed, t0 + Duration::from_secs(1));
        let cgroups: HashMap<u64, Cgroup> = [(10, cg(Some("u1"), Some(CID))), (11, cg(Some("u9"), None))].into();
        let mut a = Attribution::new(grace);
        for s in [2, 10, 20, 29] {
            let out = a.update(&[(10, errs(s)), (11, errs(1))], &cgroups, &mut pods, t0 + Duration::from_secs(s));
            assert_eq!((out.pending, out.unattributed), (2, 0), "at {s}s: waiting while the watch is down");
        }
        // Back: u1 is listed, u9 never is.
        pods.apply(&pod("u1", "web", "web-0", &[("app", CID)]));
        pods.set_reason(super::super::index::Reason::Synced, t0 + Duration::from_secs(30));
        let out = a.update(&[(10, errs(35)), (11, errs(1))], &cgroups, &mut pods, t0 + Duration::from_secs(35));
        assert_eq!(out.series[&labels("web", "web-0", "app")].syscall_errors, 35, "every count kept");
        assert_eq!((out.pending, out.unattributed), (1, 0), "u9 waits the grace period from the recovery");
        let out = a.update(&[(10, errs(35)), (11, errs(1))], &cgroups, &mut pods, t0 + Duration::from_secs(50));
        assert_eq!((out.pending, out.unattributed), (0, 1));
        assert!(out.take.contains(&11));
        a.retire(&[(11, errs(1))]);
        let out = a.update(&[(10, errs(35))], &cgroups, &mut pods, t0 + Duration::from_secs(51));
        assert_eq!(out.series.len(), 2, "web-0 and the host: {:?}", out.series.keys());
        assert_eq!(out.series[&Labels::default()].syscall_errors, 0, "u9's counts are nobody's");
    }

    #[test]
    fn pods_the_watch_expired_between_passes_lose_their_entries_and_counts() {
        let (t0, grace) = (Instant::now(), Duration::from_secs(60));
        let (mut a, mut pods, cgroups) = one_pod_counted_then_deleted(t0, grace);
        // The watch's timer, not a pass, forgets the pod.
        assert_eq!(pods.expire(t0 + grace, grace), vec!["u1".to_string()]);
        let out = a.update(&[(10, errs(5))], &cgroups, &mut pods, t0 + grace);
        assert_eq!(out.take, vec![10]);
        assert_eq!(out.series.len(), 1, "only the host: {:?}", out.series.keys());
        a.retire(&[(10, errs(5))]);
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
