//! Who owns a cgroup and what an address is, for the probes that count by
//! cgroup and peer (`ebpf_tcp_peers`, `ebpf_dns`): the cgroup v2 walk that
//! turns cgroup ids into pod UIDs, the pod index that names them, and the
//! Service index and pod addresses that name peers, gathered for one
//! [`Peers::update`] pass.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};

use super::cgroup::{self, Cgroup};
use super::peers::{self, Kind, Owner, Pass, Peers, Resolution};
use super::Watched;

/// What a probe keeps to name owners and peers between scrapes.
pub struct Resolver {
    pods: Option<Arc<Watched>>,
    /// Address blocks external peers are grouped by.
    pub cidrs: Vec<peers::Cidr>,
    root: Option<PathBuf>,
    cgroups: HashMap<u64, Cgroup>,
    walked: Option<Instant>,
}

impl Resolver {
    /// `pods`: the pod watch, when there is a Kubernetes API; `sysfs`: the
    /// node's, where the cgroup v2 hierarchy is.
    pub fn new(pods: Option<Arc<Watched>>, sysfs: &std::path::Path) -> Resolver {
        let root = pods.as_ref().and_then(|_| cgroup::v2_root(sysfs));
        Resolver { pods, cidrs: Vec::new(), root, cgroups: HashMap::new(), walked: None }
    }

    /// One pass of `peers` over the kernel's entries, with owners and peer
    /// names as known now; and the number of Services known by ClusterIP.
    pub fn pass(&mut self, peers: &mut Peers, stats: &[(PeerKey, PeerCounters)], lat: &[(LatKey, u64)], now: Instant) -> (Pass, usize) {
        self.pass_named(peers, stats, lat, now, None)
    }

    /// As [`Resolver::pass`], with the keys' addresses named by `name`
    /// instead (keys whose address stands for something else).
    pub fn pass_named(
        &mut self,
        peers: &mut Peers,
        stats: &[(PeerKey, PeerCounters)],
        lat: &[(LatKey, u64)],
        now: Instant,
        name: Option<&dyn Fn(IpAddr) -> (Kind, String)>,
    ) -> (Pass, usize) {
        // A cgroup not seen before calls for a walk (at most one a second).
        if let Some(root) = &self.root {
            let unknown = stats.iter().any(|(k, _)| k.cgroup != 0 && !self.cgroups.contains_key(&k.cgroup));
            if self.walked.is_none_or(|w| now.duration_since(w) >= Duration::from_secs(if unknown { 1 } else { 10 })) {
                self.cgroups = cgroup::walk(root);
                self.walked = Some(now);
            }
        }
        let Some(w) = &self.pods else {
            let cidrs = &self.cidrs;
            let named = |addr: IpAddr| name.map_or_else(|| peers::name(addr, None, &HashMap::new(), cidrs), |f| f(addr));
            return (peers.update(stats, lat, |_| Resolution::Owner(Owner::default()), |_| true, named, now), 0);
        };
        let idx = w.lock();
        let grace = peers.grace;
        let live: HashSet<Owner> = idx.live(now, grace).map(|(_, m)| (m.namespace.clone(), m.name.clone())).collect();
        // Pod addresses, only when a new peer is to be named.
        let by_ip = std::cell::OnceCell::new();
        let pods_by_ip = || -> HashMap<IpAddr, String> {
            idx.live(now, grace).flat_map(|(_, m)| m.ips.iter().map(|ip| (*ip, format!("{}/{}", m.namespace, m.workload)))).collect()
        };
        let (cgroups, no_v2) = (&self.cgroups, self.root.is_none());
        let resolve = |cg: u64| match cgroups.get(&cg) {
            // No cgroup v2 hierarchy to name anything with: all the host's.
            _ if cg == 0 || no_v2 => Resolution::Owner(Owner::default()),
            Some(Cgroup { pod: None, .. }) => Resolution::Owner(Owner::default()),
            Some(Cgroup { pod: Some(r), .. }) => match idx.get(&r.uid) {
                Some((_, m)) => Resolution::Owner((m.namespace.clone(), m.name.clone())),
                None => Resolution::Pending,
            },
            None => Resolution::Pending,
        };
        let services = w.services.as_ref().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()));
        let known = services.as_ref().map_or(0, |s| s.len());
        let named = |addr: IpAddr| match name {
            Some(f) => f(addr),
            None => peers::name(addr, services.as_deref(), by_ip.get_or_init(pods_by_ip), &self.cidrs),
        };
        (peers.update(stats, lat, resolve, |o| o.0.is_empty() || live.contains(o), named, now), known)
    }
}
