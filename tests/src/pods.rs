//! Pods for the pod attribution tests: the objects an in-memory API server
//! serves (pods A and B on this node, one on another), and their cgroups
//! made under the real hierarchy with kubelet-style paths, in which the
//! test runs real workloads.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apiserver::{pod, Api};

pub const NODE: &str = "truth-node";
pub const UID_A: &str = "6a0d1c2e-3f4a-4b5c-8d6e-7f8091a2b3c4";
pub const UID_B: &str = "7b1e2d3f-4a5b-4c6d-9e7f-8091a2b3c4d5";
pub const UID_OTHER: &str = "8c2f3e4a-5b6c-4d7e-af80-91a2b3c4d5e6";
pub const CID_A: &str = "aaaa1111bbbb2222cccc3333dddd4444eeee5555ffff6666aaaa7777bbbb8888";
pub const CID_B: &str = "bbbb1111cccc2222dddd3333eeee4444ffff5555aaaa6666bbbb7777cccc8888";

/// A pod UID of this test process's own (a UUID: the process id, then
/// `n`), so that tests running at once in other processes, which count
/// every cgroup of the node, never count for it.
pub fn uid(n: u16) -> String {
    format!("{:08x}-{n:04x}-4000-8000-{:012x}", std::process::id(), 0xa9e47)
}

/// A container id of this test process's own (64 hex digits: the process
/// id, then `n`).
pub fn cid(n: u16) -> String {
    format!("{:08x}{n:04x}{}", std::process::id(), "c".repeat(52))
}

/// An API server's objects: pods A (web/web-0, container app) and B (db/db-0,
/// container pg) on this node, and one pod on another node.
pub fn api() -> Arc<Api> {
    let api = Arc::new(Api::new());
    {
        let mut st = api.state.lock().expect("state");
        for (uid, ns, name, node, c, cid) in [
            (UID_A, "web", "web-0", NODE, "app", CID_A),
            (UID_B, "db", "db-0", NODE, "pg", CID_B),
            (UID_OTHER, "web", "web-1", "other-node", "app", CID_A),
        ] {
            api.put(&mut st, "pods", ns, name, pod(uid, ns, name, node, c, cid), false);
        }
    }
    api
}

/// An API server's objects for the peer truth tests: pods of this node
/// (uid, namespace, name, container, container id, address) with their
/// addresses, and ClusterIP Services (namespace, name, address, port,
/// protocol).
pub fn api_with_addresses(pods: &[(&str, &str, &str, &str, &str, &str)], services: &[(&str, &str, &str, u16, &str)]) -> Arc<Api> {
    let api = Arc::new(Api::new());
    {
        let mut st = api.state.lock().expect("state");
        for (uid, ns, name, c, cid, ip) in pods {
            let mut p = pod(uid, ns, name, NODE, c, cid);
            p["status"]["podIP"] = (*ip).into();
            p["status"]["podIPs"] = serde_json::json!([{ "ip": ip }]);
            api.put(&mut st, "pods", ns, name, p, false);
        }
        for (i, (ns, name, ip, port, proto)) in services.iter().enumerate() {
            let svc = serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": ns, "uid": format!("5e7c0000-0000-4000-8000-{i:012}")},
                "spec": {"clusterIP": ip, "clusterIPs": [ip], "ports": [{"port": port, "protocol": proto}]}
            });
            api.put(&mut st, "services", ns, name, svc, false);
        }
    }
    api
}

/// A shell that fails to open a missing file `n` times (a redirection of
/// the regular builtin `true`: one failed openat each, nothing else).
pub fn failing_opens(n: u32) -> String {
    format!("/bin/sh -c 'i=0; while [ $i -lt {n} ]; do true < /nonexistent; i=$((i+1)); done 2>/dev/null'")
}

/// A pod's cgroups, made by the test, removed when dropped: the container's
/// cgroup in the v2 hierarchy and, for memory limits on a hybrid host, the
/// same path in the v1 memory hierarchy.
pub struct PodCgroup {
    pub made: Vec<PathBuf>,
    pub v2: PathBuf,
    pub memory: Option<PathBuf>,
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in self.made.iter().rev() {
            // A just-killed task may still be leaving.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn v2_root() -> PathBuf {
    node_agent::pods::cgroup::v2_root(Path::new("/sys")).expect("a cgroup v2 hierarchy (unified or hybrid)")
}

pub fn mkdirs(root: &Path, rel: &str, made: &mut Vec<PathBuf>) -> PathBuf {
    let mut p = root.to_path_buf();
    for c in rel.split('/') {
        p.push(c);
        if !p.exists() {
            std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
            made.push(p.clone());
        }
    }
    p
}

/// The container cgroup of pod A (cgroupfs naming) or B (systemd naming),
/// optionally memory-limited.
pub fn pod_cgroup(which: char, memory_limit: Option<u64>) -> PodCgroup {
    let rel = match which {
        'A' => format!("kubepods/burstable/pod{UID_A}/{CID_A}"),
        _ => format!(
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CID_B}.scope",
            UID_B.replace('-', "_")
        ),
    };
    cgroup_at(&rel, memory_limit)
}

/// A cgroup at `rel` under the v2 hierarchy's root (a container's, with a
/// kubelet path; or the host's), optionally memory-limited.
pub fn cgroup_at(rel: &str, memory_limit: Option<u64>) -> PodCgroup {
    let rel = rel.to_string();
    let root = v2_root();
    let mut made = Vec::new();
    let mut memory = None;
    if let Some(limit) = memory_limit {
        let v2_has_memory =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default().split_whitespace().any(|c| c == "memory");
        if v2_has_memory {
            // Enable the memory controller down the path, then limit the leaf.
            let mut p = root.clone();
            for c in rel.split('/') {
                let _ = std::fs::write(p.join("cgroup.subtree_control"), "+memory");
                p.push(c);
                if !p.exists() {
                    std::fs::create_dir(&p).expect("mkdir");
                    made.push(p.clone());
                }
            }
            std::fs::write(p.join("memory.max"), limit.to_string()).expect("memory.max");
            let _ = std::fs::write(p.join("memory.swap.max"), "0");
        } else {
            let m = mkdirs(Path::new("/sys/fs/cgroup/memory"), &rel, &mut made);
            std::fs::write(m.join("memory.limit_in_bytes"), limit.to_string()).expect("memory.limit_in_bytes");
            let _ = std::fs::write(m.join("memory.swappiness"), "0");
            memory = Some(m);
        }
    }
    let v2 = mkdirs(&root, &rel, &mut made);
    PodCgroup { made, v2, memory }
}

impl PodCgroup {
    /// Runs a shell command inside the pod's cgroups.
    pub fn spawn(&self, cmd: &str) -> Child {
        self.command(cmd).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn in pod")
    }

    /// As `spawn`, with stdout and stderr kept.
    pub fn spawn_piped(&self, cmd: &str) -> Child {
        self.command(cmd).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn in pod")
    }

    pub fn command(&self, cmd: &str) -> Command {
        let mut join = format!("echo $$ > {}/cgroup.procs", self.v2.display());
        if let Some(m) = &self.memory {
            join.push_str(&format!(" && echo $$ > {}/cgroup.procs", m.display()));
        }
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(format!("{join} && exec {cmd}"));
        c
    }
}

/// The agent binary watching the pods of `node` through a kubeconfig (with
/// ebpf_pods and whatever else `flags` turn on), its stderr in a file;
/// killed when dropped. For the pod-watch tests, against the in-memory API
/// server or a real one.
pub struct WatchingAgent {
    child: crate::Kill,
    url: String,
    log: tempfile::NamedTempFile,
}

impl WatchingAgent {
    /// Starts it and waits (up to 30 s) until it serves /metrics.
    pub fn start(kubeconfig: &Path, node: &str, flags: &[&str]) -> WatchingAgent {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let child = Command::new(crate::agent_binary())
            .args([
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--collector.disable-defaults".into(),
                "--collector.ebpf_pods".into(),
                format!("--collector.ebpf_pods.kubeconfig={}", kubeconfig.display()),
                format!("--collector.ebpf_pods.node-name={node}"),
            ])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log"))
            .spawn()
            .expect("start node-agent");
        let a = WatchingAgent { child: crate::Kill(child), url: format!("http://127.0.0.1:{port}/metrics"), log };
        let t = Instant::now();
        while crate::compare::http_get(&a.url).is_err() {
            assert!(t.elapsed() < Duration::from_secs(30), "node-agent did not come up:\n{}", a.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        let _ = self.log.reopen().and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    /// The sample of `name` with `labels` (0 when there is none).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = crate::compare::http_get(&self.url).expect("scrape");
        crate::samples(&text, name)
            .into_iter()
            .find(|(l, _)| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map_or(0.0, |(_, v)| v)
    }

    /// The pod watch's current sync-state reason.
    pub fn reason(&self) -> String {
        let text = crate::compare::http_get(&self.url).expect("scrape");
        crate::samples(&text, "node_ebpf_pod_attribution_sync_state")
            .into_iter()
            .find(|(_, v)| *v == 1.0)
            .map(|(l, _)| l["reason"].clone())
            .unwrap_or_default()
    }

    /// Waits until `f` holds (checked every 100 ms), up to `within`.
    pub fn until(&self, within: Duration, what: &str, mut f: impl FnMut(&WatchingAgent) -> bool) {
        let t = Instant::now();
        while !f(self) {
            assert!(t.elapsed() < within, "{what} did not happen within {within:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A line of /proc/PID/status, in KiB.
    pub fn status_kib(&self, key: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.0.id())).expect("status");
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse().ok())
            .expect("status key")
    }

    /// Its log lines holding `with`.
    pub fn lines(&self, with: &str) -> Vec<String> {
        self.log().lines().filter(|l| l.contains(with)).map(str::to_string).collect()
    }
}
