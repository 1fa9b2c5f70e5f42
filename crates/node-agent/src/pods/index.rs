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
            },
        ))
    }
}

/// The kubelet's annotation on a static pod's mirror: the static pod's
/// hash, which its cgroups are named with.
const MIRROR: &str = "kubernetes.io/config.mirror";

/// The node's pods by UID (and static pods by hash).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<String, PodMeta>,
    mirrors: HashMap<String, String>,
    /// UIDs seen since the watch (re)started listing.
    relist: Option<Vec<String>>,
    /// A full list has been received.
    pub synced: bool,
}

impl PodIndex {
    /// A pod added or changed.
    pub fn apply(&mut self, pod: &Pod) {
        let Some((uid, meta)) = PodMeta::from_pod(pod) else { return };
        if let Some(hash) = pod.metadata.annotations.as_ref().and_then(|a| a.get(MIRROR)) {
            self.mirrors.insert(hash.clone(), uid.clone());
        }
        if let Some(r) = &mut self.relist {
            r.push(uid.clone());
        }
        let deleted = self.pods.get(&uid).and_then(|p| p.deleted);
        self.pods.insert(uid, PodMeta { deleted, ..meta });
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

    /// Forgets pods deleted at least `grace` ago; returns their UIDs.
    pub fn expire(&mut self, now: Instant, grace: Duration) -> Vec<String> {
        let gone: Vec<String> =
            self.pods.iter().filter(|(_, p)| p.deleted.is_some_and(|d| now.duration_since(d) >= grace)).map(|(u, _)| u.clone()).collect();
        for u in &gone {
            self.pods.remove(u);
        }
        self.mirrors.retain(|_, uid| !gone.contains(uid));
        gone
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
}
