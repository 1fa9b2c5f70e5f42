//! The cluster's Services by ClusterIP, fed by a watch on every Service
//! (started only for `ebpf_tcp_peers`): a socket connected to a Service
//! keeps the ClusterIP as its destination (the DNAT to a backend happens
//! below the socket, and kube-proxy's IPVS mode puts the ClusterIP on a
//! local device), so the address names the Service. Pure; the watch lives
//! in `watch.rs`.
//!
//! Kept per Service: its addresses and `namespace/name`, about 150 bytes
//! (no object is kept: kube's reflector store would hold each whole, with
//! its managedFields). At most [`MAX_SERVICES`]; beyond, counted.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;

use super::index::Reason;

/// The most Services tracked: ten times the largest clusters' (Kubernetes'
/// scalability envelope: 10,000 Services per cluster).
pub const MAX_SERVICES: usize = 100_000;

/// Services by ClusterIP.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    by_ip: HashMap<IpAddr, Arc<str>>,
    by_uid: HashMap<String, (Arc<str>, Vec<IpAddr>)>,
    relist: Option<HashSet<String>>,
    pub synced: bool,
    pub reason: Reason,
    /// Services not tracked: the index was full.
    pub dropped: u64,
}

/// A Service's uid, `namespace/name` and ClusterIPs (`spec.clusterIPs`,
/// else `spec.clusterIP`; headless ones, `None`, have none).
pub fn cluster_ips(s: &Service) -> Option<(String, String, Vec<IpAddr>)> {
    let uid = s.metadata.uid.clone()?;
    let name = format!("{}/{}", s.metadata.namespace.as_deref().unwrap_or_default(), s.metadata.name.as_deref().unwrap_or_default());
    let spec = s.spec.as_ref();
    let ips = spec
        .and_then(|s| s.cluster_ips.clone())
        .filter(|v| !v.is_empty())
        .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]));
    let ips = ips.unwrap_or_default().iter().filter_map(|ip| ip.parse().ok()).collect();
    Some((uid, name, ips))
}

impl ServiceIndex {
    /// The Service at `ip`, as `namespace/name`.
    pub fn get(&self, ip: &IpAddr) -> Option<&Arc<str>> {
        self.by_ip.get(ip)
    }

    fn remove(&mut self, uid: &str) {
        if let Some((name, ips)) = self.by_uid.remove(uid) {
            for ip in ips {
                if self.by_ip.get(&ip).is_some_and(|n| Arc::ptr_eq(n, &name)) {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }

    pub fn apply(&mut self, s: &Service) {
        let Some((uid, name, ips)) = cluster_ips(s) else { return };
        if let Some(r) = &mut self.relist {
            r.insert(uid.clone());
        }
        if !self.by_uid.contains_key(&uid) && self.by_uid.len() >= MAX_SERVICES {
            self.dropped += 1;
            return;
        }
        self.remove(&uid);
        let name: Arc<str> = name.into();
        for ip in &ips {
            self.by_ip.insert(*ip, Arc::clone(&name));
        }
        self.by_uid.insert(uid, (name, ips));
    }

    pub fn delete(&mut self, s: &Service) {
        if let Some(uid) = &s.metadata.uid {
            self.remove(uid);
        }
    }

    pub fn begin_list(&mut self) {
        self.relist = Some(HashSet::new());
    }

    pub fn end_list(&mut self) {
        let Some(seen) = self.relist.take() else { return };
        let gone: Vec<String> = self.by_uid.keys().filter(|u| !seen.contains(*u)).cloned().collect();
        for uid in gone {
            self.remove(&uid);
        }
        self.synced = true;
        self.reason = Reason::Synced;
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

impl super::watch::Store for ServiceIndex {
    type Object = Service;
    const WHAT: &'static str = "services";
    const LISTED: &'static str = "the cluster's services";
    fn begin_list(&mut self) {
        ServiceIndex::begin_list(self);
    }
    fn apply(&mut self, o: &Service) {
        ServiceIndex::apply(self, o);
    }
    fn delete(&mut self, o: &Service, _now: Instant) {
        ServiceIndex::delete(self, o);
    }
    fn end_list(&mut self, _now: Instant) {
        ServiceIndex::end_list(self);
    }
    fn expire(&mut self, _now: Instant, _grace: Duration) {}
    fn reason(&self) -> Reason {
        self.reason
    }
    fn set_reason(&mut self, r: Reason, _now: Instant) {
        self.reason = r;
    }
    fn synced(&self) -> bool {
        self.synced
    }
    fn len(&self) -> usize {
        ServiceIndex::len(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(uid: &str, ns: &str, name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"uid": uid, "namespace": ns, "name": name}, "spec": spec}))
            .expect("service json")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn cluster_ips_name_services_and_headless_ones_have_none() {
        let mut idx = ServiceIndex::default();
        idx.apply(&svc("u1", "web", "front", serde_json::json!({"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10"]})));
        idx.apply(&svc("u2", "db", "pg", serde_json::json!({"clusterIP": "10.96.0.20"})));
        idx.apply(&svc("u3", "db", "pg-headless", serde_json::json!({"clusterIP": "None", "clusterIPs": ["None"]})));
        assert_eq!(idx.get(&ip("10.96.0.10")).map(|s| &**s), Some("web/front"));
        assert_eq!(idx.get(&ip("fd00::10")).map(|s| &**s), Some("web/front"));
        assert_eq!(idx.get(&ip("10.96.0.20")).map(|s| &**s), Some("db/pg"));
        assert_eq!(idx.len(), 3);
        idx.delete(&svc("u2", "db", "pg", serde_json::json!({})));
        assert_eq!(idx.get(&ip("10.96.0.20")), None);
    }

    #[test]
    fn a_relist_forgets_services_missing_from_it() {
        let mut idx = ServiceIndex::default();
        idx.apply(&svc("u1", "a", "x", serde_json::json!({"clusterIP": "10.96.0.1"})));
        idx.apply(&svc("u2", "a", "y", serde_json::json!({"clusterIP": "10.96.0.2"})));
        idx.begin_list();
        idx.apply(&svc("u2", "a", "y", serde_json::json!({"clusterIP": "10.96.0.3"})));
        idx.end_list();
        assert_eq!(idx.get(&ip("10.96.0.1")), None);
        assert_eq!(idx.get(&ip("10.96.0.2")), None, "its old address went with the change");
        assert_eq!(idx.get(&ip("10.96.0.3")).map(|s| &**s), Some("a/y"));
        assert!(idx.synced);
    }
}
