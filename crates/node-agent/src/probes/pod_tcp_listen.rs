//! `pod_tcp_listen`: TCP accept-queue overflows of this node's pods: the
//! kernel's own `TcpExt: ListenOverflows` and `ListenDrops` of each pod's
//! network namespace (`/proc/<pid>/net/netstat` of one of its tasks).
//!
//! Why not eBPF: a SYN that finds the accept queue full is dropped without
//! any tracepoint (the kernel consumes it), and only a full queue met by a
//! handshake's last ACK is a `kfree_skb` with reason `TCP_LISTEN_OVERFLOW`
//! (counted by `ebpf_skb_drops`), so no probe sees every overflow; the
//! namespace's counters do, exactly. A pod on the host's network
//! (`hostNetwork` in its spec, or a task in the host's namespace) shares the
//! host's counters (`node_netstat_TcpExt_*`) and is left out. Shares pod attribution's watch and flags; off without a
//! Kubernetes API. Cardinality: one series per pod with its own network
//! namespace, per family; a pod's series go with its last task.
//!
//! Cost: each pod's task is found by walking the pods' cgroups, which is
//! done again only when it may have changed (the pods known changed, a
//! task found before is gone or in another namespace, or [`WALK_EVERY`]
//! passed, for containers started since); a scrape reads one namespace
//! link and one `net/netstat` per pod.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Each pod's task (by UID) and its network namespace link, from the
    /// last walk.
    tasks: BTreeMap<String, (u32, PathBuf)>,
    /// When the last walk was, and how many pods the index held then.
    walked: Option<(Instant, usize)>,
}

/// The longest a pod's first task can go unseen once its containers run.
pub const WALK_EVERY: Duration = Duration::from_secs(10);

/// Whether the pods' cgroups are walked again for their tasks: never
/// walked, the index's pod count changed since, a task found then is gone
/// or in another namespace (`stale`), or [`WALK_EVERY`] passed.
fn walk_due(walked: Option<(Instant, usize)>, pods: usize, stale: bool, now: Instant) -> bool {
    match walked {
        None => true,
        Some((at, n)) => stale || n != pods || now.duration_since(at) >= WALK_EVERY,
    }
}

pub struct Collector {
    active: Option<Active>,
}

pub fn build(_f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let Some(pods) = ctx.pods()? else { return Ok(Box::new(Collector { active: None })) };
    let mut roots: Vec<PathBuf> = cgroup::v2_root(&p.sysfs).into_iter().collect();
    roots.extend(["cpu", "memory"].iter().map(|h| p.sysfs.join("fs/cgroup").join(h)).filter(|r| r.join("cgroup.procs").exists()));
    Ok(Box::new(Collector { active: Some(Active { pods, procfs: p.procfs.clone(), roots, tasks: BTreeMap::new(), walked: None }) }))
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

impl Active {
    /// Each known pod's task and namespace: the last walk's while all of
    /// them are still there and nothing else is due, else a new walk's.
    fn tasks(&mut self, now: Instant) -> Vec<(String, u32, PathBuf)> {
        let pods = self.pods.lock().len();
        let mut now_ns = Vec::with_capacity(self.tasks.len());
        let mut stale = false;
        for (uid, (pid, ns)) in &self.tasks {
            match netns(&self.procfs, &pid.to_string()) {
                Some(n) if n == *ns => now_ns.push((uid.clone(), *pid, n)),
                _ => stale = true,
            }
        }
        if !walk_due(self.walked, pods, stale, now) {
            return now_ns;
        }
        self.tasks = pod_tasks(&self.roots)
            .into_iter()
            .filter_map(|(uid, pid)| netns(&self.procfs, &pid.to_string()).map(|ns| (uid, (pid, ns))))
            .collect();
        self.walked = Some((now, pods));
        self.tasks.iter().map(|(uid, (pid, ns))| (uid.clone(), *pid, ns.clone())).collect()
    }
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let Some(a) = &mut self.active else { return Ok(()) };
        let host_ns = netns(&a.procfs, "1");
        let mut series: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        let tasks = a.tasks(Instant::now());
        // Pods on the host's network are left out by their spec, which
        // holds where the host's namespace cannot be read (a procfs that
        // hides pid 1's) and before the task's namespace can be compared.
        let names: HashMap<String, (String, String)> = {
            let idx = a.pods.lock();
            tasks
                .iter()
                .filter_map(|(uid, _, _)| {
                    idx.get(uid).filter(|(_, m)| !m.host_network).map(|(_, m)| (uid.clone(), (m.namespace.clone(), m.name.clone())))
                })
                .collect()
        };
        for (uid, pid, ns) in tasks {
            let Some(name) = names.get(&uid) else { continue };
            // A task in the host's network: not a namespace of the pod's own.
            if host_ns.as_ref() == Some(&ns) {
                continue;
            }
            let path = a.procfs.join(pid.to_string()).join("net/netstat");
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
    fn walks_again_only_when_the_tasks_may_have_changed() {
        let t = Instant::now();
        assert!(walk_due(None, 0, false, t));
        let last = Some((t, 3));
        assert!(!walk_due(last, 3, false, t + Duration::from_secs(9)));
        assert!(walk_due(last, 4, false, t + Duration::from_millis(1)), "a pod added");
        assert!(walk_due(last, 2, false, t + Duration::from_millis(1)), "a pod expired");
        assert!(walk_due(last, 3, true, t + Duration::from_millis(1)), "a task gone");
        assert!(walk_due(last, 3, false, t + WALK_EVERY), "containers started since");
    }

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
