//! Who owns a cgroup and what an address is, for the probes that count by
//! cgroup and peer (`ebpf_tcp_peers`, `ebpf_dns`): the followed cgroup
//! hierarchy (`hierarchy`) that turns cgroup ids into pod UIDs, the pod
//! index that names them, and the Service index, the pod addresses and the
//! node's own addresses that name peers, gathered for one
//! [`Peers::update`] pass.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_common::tcp_peers::{LatKey, PeerCounters, PeerKey};

use super::attrib::gives_up;
use super::hierarchy::{Hierarchy, Lookup, Whose};
use super::peers::{self, Kind, Owner, Pass, Peers, Resolution};
use super::Watched;

/// The node's own addresses are read again, when an address to be named
/// is not among them, at most this often.
pub const NODE_ADDRESSES_EVERY: Duration = Duration::from_secs(1);

/// The node's addresses (those of the agent's network namespace, the
/// node's: the agent runs on the host's network), read with RTM_GETADDR
/// when a new peer's address is not among them and they were read more
/// than [`NODE_ADDRESSES_EVERY`] ago (an address added since is found,
/// and a node talking to many new addresses dumps them at most once a
/// second).
pub struct NodeAddresses {
    /// The node's name, the peer label of its addresses.
    pub name: String,
    route: host::netlink::route::Route,
    addrs: HashSet<IpAddr>,
    read: Option<Instant>,
}

impl NodeAddresses {
    pub fn new(name: String) -> NodeAddresses {
        NodeAddresses { name, route: host::netlink::route::Route::new(), addrs: HashSet::new(), read: None }
    }

    /// Whether `addr` is one of the node's.
    fn contains(&mut self, addr: IpAddr, now: Instant) -> bool {
        if self.addrs.contains(&addr) {
            return true;
        }
        if self.read.is_some_and(|t| now.saturating_duration_since(t) < NODE_ADDRESSES_EVERY) {
            return false;
        }
        self.read = Some(now);
        match self.route.local_addresses() {
            Ok(a) => self.addrs = a.into_iter().filter(|a| !a.is_loopback()).collect(),
            Err(e) => tracing::debug!(err = %e, "the node's addresses could not be read; they keep their last value"),
        }
        self.addrs.contains(&addr)
    }
}

/// What a probe keeps to name owners and peers between scrapes.
pub struct Resolver {
    pods: Option<Arc<Watched>>,
    /// The pods' cgroups (None without a cgroup v2 hierarchy: all the host's).
    hierarchy: Option<Arc<Hierarchy>>,
    /// Address blocks external peers are grouped by.
    pub cidrs: Vec<peers::Cidr>,
    node: NodeAddresses,
}

impl Resolver {
    /// `pods`: the pod watch, when there is a Kubernetes API; `hierarchy`:
    /// the node's pods' cgroups, when it has a cgroup v2 hierarchy; `node`:
    /// this node's name.
    pub fn new(pods: Option<Arc<Watched>>, hierarchy: Option<Arc<Hierarchy>>, node: String) -> Resolver {
        Resolver { pods, hierarchy, cidrs: Vec::new(), node: NodeAddresses::new(node) }
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
        // The node's addresses, read only when a new peer is to be named.
        let node_name = self.node.name.clone();
        let node = std::cell::RefCell::new(&mut self.node);
        let node_of = |addr: IpAddr| -> bool { node.borrow_mut().contains(addr, now) };
        let Some(w) = &self.pods else {
            let cidrs = &self.cidrs;
            let named =
                |addr: IpAddr| name.map_or_else(|| peers::name(addr, None, &HashMap::new(), (&node_name, &node_of), cidrs), |f| f(addr));
            return (peers.update(stats, lat, |_, _| Resolution::Owner(Owner::default()), |_| true, named, now), 0);
        };
        let view = self.hierarchy.as_ref().map(|h| h.view());
        let idx = w.lock();
        let grace = peers.grace;
        let live: HashSet<Owner> = idx.live(now, grace).map(|(_, m)| (m.namespace.clone(), m.name.clone())).collect();
        // Pod addresses, only when a new peer is to be named.
        let by_ip = std::cell::OnceCell::new();
        let pods_by_ip = || -> HashMap<IpAddr, String> {
            idx.live(now, grace).flat_map(|(_, m)| m.ips.iter().map(|ip| (*ip, format!("{}/{}", m.namespace, m.workload)))).collect()
        };
        let resolve = |cg: u64, seen: Instant| {
            // No cgroup v2 hierarchy to name anything with: all the host's.
            let whose = view.as_ref().map_or(Whose::Host, |v| v.whose(cg, seen));
            match whose {
                Whose::Host => Resolution::Owner(Owner::default()),
                Whose::NotYet => Resolution::Pending,
                Whose::Pod(r) => match idx.get(&r.uid) {
                    Some((_, m)) => Resolution::Owner((m.namespace.clone(), m.name.clone())),
                    None if gives_up(&idx, seen, grace, now) => Resolution::Unattributable,
                    None => Resolution::Pending,
                },
            }
        };
        let services = w.services.as_ref().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()));
        let known = services.as_ref().map_or(0, |s| s.len());
        let named = |addr: IpAddr| match name {
            Some(f) => f(addr),
            None => peers::name(addr, services.as_deref(), by_ip.get_or_init(pods_by_ip), (&node_name, &node_of), &self.cidrs),
        };
        (peers.update(stats, lat, resolve, |o| o.0.is_empty() || live.contains(o), named, now), known)
    }
}
