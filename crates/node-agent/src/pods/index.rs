//! The pods of this node as the API server describes them: UID to
//! namespace, name and container names (by runtime container id), fed by a
//! watch on `spec.nodeName`. Pure; the watch lives in `watch.rs`.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// One pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// Runtime container id (without `containerd://`) to container name.
    pub containers: HashMap<String, String>,
    /// Container names from the spec (series exist for each from the start).
    pub container_names: BTreeSet<String>,
    /// When the API server said it was deleted.
    pub deleted: Option<Instant>,
    /// Its addresses (`status.podIPs`, else `status.podIP`), unless it
    /// runs in the host's network namespace (`spec.hostNetwork`), where
    /// they are the node's.
    pub ips: Vec<std::net::IpAddr>,
    /// It runs in the host's network namespace (`spec.hostNetwork`).
    pub host_network: bool,
    /// What runs it: a Deployment's name (its ReplicaSet's minus the
    /// `pod-template-hash`), else the controller's name (StatefulSet,
    /// DaemonSet, Job...), else the pod's own.
    pub workload: String,
}

impl PodMeta {
    pub fn from_pod(pod: &Pod) -> Option<(String, PodMeta)> {
        let uid = pod.metadata.uid.clone()?;
        let mut containers = HashMap::new();
        if let Some(st) = &pod.status {
            let all = st
                .container_statuses
                .iter()
                .flatten()
                .chain(st.init_container_statuses.iter().flatten())
                .chain(st.ephemeral_container_statuses.iter().flatten());
            for c in all {
                if let Some(id) = c.container_id.as_deref() {
                    let id = id.split_once("://").map_or(id, |(_, id)| id);
                    containers.insert(id.to_string(), c.name.clone());
                }
                // The previous run of a restarted container keeps its id here.
                if let Some(id) = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).and_then(|t| t.container_id.as_deref()) {
                    let id = id.split_once("://").map_or(id, |(_, id)| id);
                    containers.insert(id.to_string(), c.name.clone());
                }
            }
        }
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let mut ips: Vec<std::net::IpAddr> = Vec::new();
        if let Some(st) = pod.status.as_ref().filter(|_| !host_network) {
            let all = st.pod_ips.iter().flatten().map(|p| p.ip.as_str()).chain(st.pod_ip.as_deref());
            for ip in all.filter_map(|ip| ip.parse().ok()) {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        let container_names =
            pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten())).map(|c| c.name.clone()).collect();
        Some((
            uid,
            PodMeta {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                containers,
                container_names,
                deleted: None,
                ips,
                host_network,
                workload: workload(pod),
            },
        ))
    }
}

/// The workload a pod belongs to ([`PodMeta::workload`]).
pub fn workload(pod: &Pod) -> String {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let Some(owner) = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true)) else { return name };
    if owner.kind == "ReplicaSet" {
        let hash = pod.metadata.labels.as_ref().and_then(|l| l.get("pod-template-hash"));
        if let Some(deployment) = hash.and_then(|h| owner.name.strip_suffix(h.as_str())).and_then(|n| n.strip_suffix('-')) {
            return deployment.to_string();
        }
    }
    owner.name.clone()
}

/// The kubelet's annotation on a static pod's mirror: the static pod's
/// hash, which its cgroups are named with.
const MIRROR: &str = "kubernetes.io/config.mirror";

/// The most pods tracked. The kubelet runs at most `--max-pods` pods, 110
/// by default, and Kubernetes' large-cluster guidance stays at or below
/// 110 per node (some distributions allow 250); 1,000 leaves room for
/// those plus the deleted pods kept for their grace period under churn,
/// while bounding the index (about 1 KiB a pod) and the series (see
/// `attrib::MAX_LABEL_SETS`) whatever the API server sends.
pub const MAX_PODS: usize = 1000;

/// Why the pods are (or are not) known: the watch's state, one of a fixed
/// set (exported as `node_ebpf_pod_attribution_sync_state{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reason {
    /// Listing the pods (at start, or again after the watch expired).
    #[default]
    Listing,
    /// Listed, and watching.
    Synced,
    /// The list did not complete within its timeout.
    ListTimeout,
    /// The list failed (connection, server error, bad answer).
    ListFailed,
    /// The API server refused the credentials (401) or the access (403).
    Forbidden,
    /// The API server sent a watch line or a list over the bound.
    TooLarge,
    /// The watch failed (connection, server error, bad event).
    WatchFailed,
    /// The watch's resource version expired (410 Gone): listing again.
    Expired,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Listing,
        Reason::Synced,
        Reason::ListTimeout,
        Reason::ListFailed,
        Reason::Forbidden,
        Reason::TooLarge,
        Reason::WatchFailed,
        Reason::Expired,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Listing => "listing",
            Reason::Synced => "synced",
            Reason::ListTimeout => "list_timeout",
            Reason::ListFailed => "list_failed",
            Reason::Forbidden => "forbidden",
            Reason::TooLarge => "too_large",
            Reason::WatchFailed => "watch_failed",
            Reason::Expired => "expired",
        }
    }

    /// A failure (not listing or synced).
    pub fn failed(self) -> bool {
        !matches!(self, Reason::Listing | Reason::Synced)
    }
}

/// What the index refused or cut short to stay within [`MAX_PODS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dropped {
    /// Pod events (added, changed, listed) for a new pod not tracked: the
    /// index was full of pods not deleted.
    pub pods_cap: u64,
    /// Deleted pods forgotten before their grace period ended, to make room
    /// for a pod not deleted.
    pub deleted_early: u64,
}

/// The node's pods by UID (and static pods by hash).
#[derive(Debug)]
pub struct PodIndex {
    pods: HashMap<String, PodMeta>,
    mirrors: HashMap<String, String>,
    /// UIDs seen since the watch (re)started listing.
    relist: Option<Vec<String>>,
    /// A full list has been received.
    pub synced: bool,
    /// The watch's state ([`PodIndex::set_reason`]).
    reason: Reason,
    /// Since when the watch is synced without a failure: what the index
    /// says of a pod missing from it is true from then on.
    healthy_since: Option<Instant>,
    /// The most pods tracked.
    pub max_pods: usize,
    pub dropped: Dropped,
}

impl Default for PodIndex {
    fn default() -> Self {
        PodIndex::with_max(MAX_PODS)
    }
}

impl PodIndex {
    /// An index of at most `max_pods` pods.
    pub fn with_max(max_pods: usize) -> Self {
        PodIndex {
            pods: HashMap::new(),
            mirrors: HashMap::new(),
            relist: None,
            synced: false,
            reason: Reason::default(),
            healthy_since: None,
            max_pods,
            dropped: Dropped::default(),
        }
    }

    /// A pod added or changed. A new pod when the index is full takes the
    /// place of the pod deleted longest ago, or is not tracked (counted).
    pub fn apply(&mut self, pod: &Pod) {
        let Some((uid, meta)) = PodMeta::from_pod(pod) else { return };
        if !self.pods.contains_key(&uid) && self.pods.len() >= self.max_pods && !self.evict_oldest_deleted() {
            self.dropped.pods_cap += 1;
            return;
        }
        if let Some(hash) = pod.metadata.annotations.as_ref().and_then(|a| a.get(MIRROR)) {
            self.mirrors.insert(hash.clone(), uid.clone());
        }
        if let Some(r) = &mut self.relist {
            r.push(uid.clone());
        }
        let deleted = self.pods.get(&uid).and_then(|p| p.deleted);
        self.pods.insert(uid, PodMeta { deleted, ..meta });
    }

    /// Forgets the pod deleted longest ago, if any.
    fn evict_oldest_deleted(&mut self) -> bool {
        let Some(uid) = self.pods.iter().filter_map(|(u, p)| p.deleted.map(|d| (d, u))).min().map(|(_, u)| u.clone()) else {
            return false;
        };
        self.pods.remove(&uid);
        self.mirrors.retain(|_, u| *u != uid);
        self.dropped.deleted_early += 1;
        true
    }

    /// A pod deleted.
    pub fn delete(&mut self, pod: &Pod, now: Instant) {
        if let Some(p) = pod.metadata.uid.as_ref().and_then(|u| self.pods.get_mut(u)) {
            p.deleted.get_or_insert(now);
        }
    }

    /// The watch starts (again) with a full list.
    pub fn begin_list(&mut self) {
        self.relist = Some(Vec::new());
    }

    /// The full list is in: pods missing from it were deleted meanwhile.
    pub fn end_list(&mut self, now: Instant) {
        let Some(seen) = self.relist.take() else { return };
        let seen: std::collections::HashSet<String> = seen.into_iter().collect();
        for (uid, p) in &mut self.pods {
            if !seen.contains(uid) {
                p.deleted.get_or_insert(now);
            }
        }
        self.synced = true;
        self.set_reason(Reason::Synced, now);
    }

    /// The watch's state.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The watch's state changes at `now`: a failure ends the healthy
    /// time, synced (again) starts it.
    pub fn set_reason(&mut self, r: Reason, now: Instant) {
        self.reason = r;
        if r.failed() {
            self.healthy_since = None;
        } else if r == Reason::Synced {
            self.healthy_since.get_or_insert(now);
        }
    }

    /// Since when the index has been synced with no failure (None while it
    /// is listing or failing): a pod it does not know by then is not on
    /// this node (it was deleted, or never listed).
    pub fn healthy_since(&self) -> Option<Instant> {
        self.healthy_since
    }

    /// A pod by the UID (or static pod hash) its cgroups are named with.
    pub fn get(&self, uid: &str) -> Option<(&str, &PodMeta)> {
        if let Some((k, p)) = self.pods.get_key_value(uid) {
            return Some((k, p));
        }
        let real = self.mirrors.get(uid)?;
        self.pods.get_key_value(real).map(|(k, p)| (k.as_str(), p))
    }

    /// Pods not deleted, or deleted less than `grace` ago.
    pub fn live(&self, now: Instant, grace: Duration) -> impl Iterator<Item = (&String, &PodMeta)> {
        self.pods.iter().filter(move |(_, p)| p.deleted.is_none_or(|d| now.duration_since(d) < grace))
    }

    /// Forgets pods deleted at least `grace` ago (the watch does, on a
    /// timer); returns their UIDs. Whoever keeps state by pod notices a
    /// forgotten pod by [`PodIndex::contains`].
    pub fn expire(&mut self, now: Instant, grace: Duration) -> Vec<String> {
        let gone: Vec<String> =
            self.pods.iter().filter(|(_, p)| p.deleted.is_some_and(|d| now.duration_since(d) >= grace)).map(|(u, _)| u.clone()).collect();
        if gone.is_empty() {
            return gone;
        }
        for u in &gone {
            self.pods.remove(u);
        }
        let gone_set: std::collections::HashSet<&String> = gone.iter().collect();
        self.mirrors.retain(|_, uid| !gone_set.contains(uid));
        gone
    }

    /// Whether the pod with this UID (not a static pod's hash) is tracked.
    pub fn contains(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod as the API server would send it.
    pub fn pod(uid: &str, ns: &str, name: &str, containers: &[(&str, &str)]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"uid": uid, "namespace": ns, "name": name},
            "spec": {"containers": containers.iter().map(|(n, _)| serde_json::json!({"name": n})).collect::<Vec<_>>()},
            "status": {"containerStatuses": containers.iter().map(|(n, id)| serde_json::json!({
                "name": n, "containerID": format!("containerd://{id}"), "image": "x", "imageID": "x",
                "ready": true, "restartCount": 0
            })).collect::<Vec<_>>()}
        }))
        .expect("pod json")
    }

    #[test]
    fn addresses_and_workloads() {
        let with = |extra: serde_json::Value| -> PodMeta {
            let mut v =
                serde_json::json!({"metadata": {"uid": "u", "namespace": "n", "name": "web-7d9f8-abcde"}, "spec": {"containers": []}});
            for (k, x) in extra.as_object().into_iter().flatten() {
                for (k2, x2) in x.as_object().into_iter().flatten() {
                    v[k][k2] = x2.clone();
                }
            }
            let pod: Pod = serde_json::from_value(v).expect("pod json");
            PodMeta::from_pod(&pod).expect("meta").1
        };
        let rs = serde_json::json!({"metadata": {
            "labels": {"pod-template-hash": "7d9f8"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8", "uid": "r", "controller": true}]
        }});
        assert_eq!(with(rs).workload, "web");
        let sts = serde_json::json!({"metadata": {
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s", "controller": true}]
        }});
        assert_eq!(with(sts).workload, "db");
        assert_eq!(with(serde_json::json!({})).workload, "web-7d9f8-abcde");
        let ips = serde_json::json!({"status": {"podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]}});
        let m = with(ips.clone());
        assert_eq!(m.ips, ["10.1.0.5".parse::<std::net::IpAddr>().unwrap(), "fd00::5".parse().unwrap()]);
        let mut host = ips;
        host["spec"] = serde_json::json!({"hostNetwork": true});
        let host = with(host);
        assert!(host.ips.is_empty(), "a host-network pod's addresses are the node's");
        assert!(host.host_network && !m.host_network);
    }

    #[test]
    fn containers_by_runtime_id_and_static_pods_by_hash() {
        let mut idx = PodIndex::default();
        let mut p = pod("u1", "kube-system", "etcd-n1", &[("etcd", "abc")]);
        p.metadata.annotations = Some([(MIRROR.to_string(), "hash1".to_string())].into());
        idx.apply(&p);
        let (uid, m) = idx.get("hash1").expect("by hash");
        assert_eq!((uid, m.name.as_str(), m.containers.get("abc").map(String::as_str)), ("u1", "etcd-n1", Some("etcd")));
        assert_eq!(m.container_names.iter().collect::<Vec<_>>(), ["etcd"]);
        assert!(idx.get("nope").is_none());
    }

    #[test]
    fn deletes_and_relists_expire_after_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut idx = PodIndex::default();
        idx.apply(&pod("a", "ns", "a", &[]));
        idx.apply(&pod("b", "ns", "b", &[]));
        idx.delete(&pod("a", "ns", "a", &[]), t0);
        assert_eq!(idx.live(t0 + Duration::from_secs(59), grace).count(), 2);
        assert_eq!(idx.live(t0 + grace, grace).count(), 1);
        // A relist without b: b was deleted while the watch was down.
        idx.begin_list();
        idx.apply(&pod("c", "ns", "c", &[]));
        idx.end_list(t0 + Duration::from_secs(30));
        assert!(idx.synced);
        assert_eq!(idx.expire(t0 + grace, grace), vec!["a".to_string()]);
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.expire(t0 + Duration::from_secs(90), grace), vec!["b".to_string()]);
        assert!(idx.get("c").is_some());
    }

    #[test]
    fn at_most_max_pods_deleted_ones_make_room_and_the_rest_is_counted() {
        let t0 = Instant::now();
        let mut idx = PodIndex::with_max(3);
        for u in ["a", "b", "c"] {
            idx.apply(&pod(u, "ns", u, &[]));
        }
        idx.apply(&pod("d", "ns", "d", &[]));
        idx.apply(&pod("d", "ns", "d", &[]));
        assert_eq!((idx.len(), idx.get("d").is_none()), (3, true));
        assert_eq!(idx.dropped, Dropped { pods_cap: 2, deleted_early: 0 });
        // A change to a tracked pod is never refused.
        idx.apply(&pod("a", "ns", "a2", &[]));
        assert_eq!(idx.get("a").map(|(_, m)| m.name.as_str()), Some("a2"));
        // The pod deleted longest ago makes room for a live one.
        let mut m = pod("b", "ns", "b", &[]);
        m.metadata.annotations = Some([(MIRROR.to_string(), "hash-b".to_string())].into());
        idx.apply(&m);
        idx.delete(&pod("c", "ns", "c", &[]), t0 + Duration::from_secs(1));
        idx.delete(&pod("b", "ns", "b", &[]), t0);
        idx.apply(&pod("e", "ns", "e", &[]));
        assert!(!idx.contains("b") && idx.get("hash-b").is_none() && idx.contains("c") && idx.contains("e"));
        assert_eq!(idx.dropped, Dropped { pods_cap: 2, deleted_early: 1 });
        assert_eq!(idx.len(), 3);
    }

    #[test]
    fn reasons_are_a_fixed_set() {
        let labels: BTreeSet<&str> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
        assert_eq!(Reason::default(), Reason::Listing);
        assert!(!Reason::Synced.failed() && Reason::ListTimeout.failed());
        let mut idx = PodIndex::default();
        idx.begin_list();
        let t0 = Instant::now();
        idx.end_list(t0);
        assert_eq!((idx.synced, idx.reason()), (true, Reason::Synced));
        assert_eq!(idx.healthy_since(), Some(t0));
        idx.set_reason(Reason::Synced, t0 + Duration::from_secs(1));
        assert_eq!(idx.healthy_since(), Some(t0), "synced again changes nothing");
        idx.set_reason(Reason::WatchFailed, t0 + Duration::from_secs(2));
        assert_eq!(idx.healthy_since(), None);
        idx.set_reason(Reason::Listing, t0 + Duration::from_secs(3));
        assert_eq!(idx.healthy_since(), None, "listing is not healthy yet");
        idx.set_reason(Reason::Synced, t0 + Duration::from_secs(4));
        assert_eq!(idx.healthy_since(), Some(t0 + Duration::from_secs(4)));
    }
}
