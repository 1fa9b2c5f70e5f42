//! `pod_tcp_listen`: TCP accept-queue overflows of this node's pods: the
//! kernel's own `TcpExt: ListenOverflows` and `ListenDrops` of each pod's
//! network namespace (`/proc/<pid>/net/netstat` of one of its tasks).
//!
//! Why not eBPF: a SYN that finds the accept queue full is dropped without
//! any tracepoint (the kernel consumes it), and only a full queue met by a
//! handshake's last ACK is a `kfree_skb` with reason `TCP_LISTEN_OVERFLOW`
//! (counted by `ebpf_skb_drops`), so no probe sees every overflow; the
//! namespace's counters do, exactly. A pod on the host's network
//! (`hostNetwork`) shares the host's counters (`node_netstat_TcpExt_*`) and
//! is left out. Shares pod attribution's watch and flags; off without a
//! Kubernetes API. Cardinality: one series per pod with its own network
//! namespace, per family; a pod's series go with its last task.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::pods::cgroup;
use crate::pods::Watched;

pub fn args() -> Vec<Arg> {
    Vec::new()
}

/// `TcpExt: ListenOverflows` and `ListenDrops` of a `net/netstat` file.
pub fn parse_netstat(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        let (Some(n), Some(v)) = (names.strip_prefix("TcpExt:"), values.strip_prefix("TcpExt:")) else { continue };
        let map: HashMap<&str, &str> = n.split_whitespace().zip(v.split_whitespace()).collect();
        let get = |k: &str| map.get(k).and_then(|v| v.parse::<u64>().ok());
        return Some((get("ListenOverflows")?, get("ListenDrops")?));
    }
    None
}

struct Active {
    pods: Arc<Watched>,
    procfs: PathBuf,
    /// The hierarchies to find the pods' tasks in: cgroup v2's, then v1's
    /// `cpu` and `memory` (where a kubelet on a hybrid host puts them).
    roots: Vec<PathBuf>,
}

pub struct Collector {
    active: Option<Active>,
}

pub fn build(_f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let Some(pods) = ctx.pods()? else { return Ok(Box::new(Collector { active: None })) };
    let mut roots: Vec<PathBuf> = cgroup::v2_root(&p.sysfs).into_iter().collect();
    roots.extend(["cpu", "memory"].iter().map(|h| p.sysfs.join("fs/cgroup").join(h)).filter(|r| r.join("cgroup.procs").exists()));
    Ok(Box::new(Collector { active: Some(Active { pods, procfs: p.procfs.clone(), roots }) }))
}

/// A task of each pod (by UID): the first pid listed in any of its cgroups.
fn pod_tasks(roots: &[PathBuf]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for root in roots {
        let mut cgroups: Vec<_> = cgroup::walk_pods(root).into_values().collect();
        cgroups.sort_by(|a, b| a.path.cmp(&b.path));
        for c in cgroups {
            let Some(pod) = c.pod else { continue };
            if out.contains_key(&pod.uid) {
                continue;
            }
            let procs = std::fs::read_to_string(root.join(&c.path).join("cgroup.procs")).unwrap_or_default();
            if let Some(pid) = procs.lines().find_map(|l| l.trim().parse::<u32>().ok()) {
                out.insert(pod.uid, pid);
            }
        }
    }
    out
}

/// The network namespace of a process (`/proc/PID/ns/net`'s link).
fn netns(procfs: &Path, pid: &str) -> Option<PathBuf> {
    std::fs::read_link(procfs.join(pid).join("ns/net")).ok()
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let Some(a) = &self.active else { return Ok(()) };
        let host_ns = netns(&a.procfs, "1");
        let mut series: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        let tasks = pod_tasks(&a.roots);
        let names: HashMap<String, (String, String)> = {
            let idx = a.pods.lock();
            tasks.keys().filter_map(|uid| idx.get(uid).map(|(_, m)| (uid.clone(), (m.namespace.clone(), m.name.clone())))).collect()
        };
        for (uid, pid) in tasks {
            let Some(name) = names.get(&uid) else { continue };
            let pid = pid.to_string();
            let ns = netns(&a.procfs, &pid);
            // The host's network (or a task gone meanwhile): not the pod's own.
            if ns.is_none() || ns == host_ns {
                continue;
            }
            let path = a.procfs.join(&pid).join("net/netstat");
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let counts = parse_netstat(&text).ok_or_else(|| host::Error::parse(&path, "no TcpExt ListenOverflows and ListenDrops"))?;
            series.insert(name.clone(), counts);
        }
        let mut f = sink.family(
            "node_pod_tcp_listen_overflows_total",
            "Times a listening socket of the pod's network namespace found its accept queue full (TcpExt ListenOverflows).",
            Kind::Counter,
        );
        for ((ns, pod), (overflows, _)) in &series {
            f.sample(&[("namespace", ns), ("pod", pod)], *overflows as f64);
        }
        let mut f = sink.family(
            "node_pod_tcp_listen_drops_total",
            "Connection requests the pod's listening sockets dropped, overflows included (TcpExt ListenDrops).",
            Kind::Counter,
        );
        for ((ns, pod), (_, drops)) in &series {
            f.sample(&[("namespace", ns), ("pod", pod)], *drops as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_listen_overflows_and_drops() {
        let text = "TcpExt: SyncookiesSent SyncookiesRecv ListenOverflows ListenDrops TCPHPHits\nTcpExt: 0 0 4 5 17\nIpExt: InNoRoutes InOctets\nIpExt: 0 1234\n";
        assert_eq!(parse_netstat(text), Some((4, 5)));
        let ip_first = "IpExt: InNoRoutes\nIpExt: 0\nTcpExt: ListenOverflows ListenDrops\nTcpExt: 1 2\n";
        assert_eq!(parse_netstat(ip_first), Some((1, 2)));
        assert_eq!(parse_netstat("TcpExt: ListenOverflows\nTcpExt: 1\n"), None, "no ListenDrops");
        assert_eq!(parse_netstat("TcpExt: ListenOverflows ListenDrops\nTcpExt: x 2\n"), None);
        assert_eq!(parse_netstat(""), None);
    }
}
