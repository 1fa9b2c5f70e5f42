//! A real node for the test control plane ([`crate::cluster`]): kubelet
//! v1.36.2 from `../shared/k8s/` over Debian's containerd 1.6 and runc,
//! with a CNI bridge (Debian's containernetworking-plugins) on a private
//! range that only this machine routes, as `../shared/k8s/README.md`
//! describes a node of this kind:
//!
//! - containerd runs in a mount namespace of its own whose mounts are
//!   shared (`unshare --propagation shared`), and the kubelet joins it: a
//!   hostPath with `mountPropagation: HostToContainer` (deploy/'s `/`)
//!   needs a shared or slave `/`, which a host without systemd does not
//!   have, and the host's own mounts stay as they are;
//! - the kubelet authenticates with a client certificate for
//!   `system:node:node-1` (the Node authorizer), serves on the bridge's
//!   address (the node's InternalIP) and authorizes the API server's
//!   requests through it (webhook), so `/stats/summary` is read as the
//!   kubelet reports it, through the API server's node proxy;
//! - no image can be pulled: the sandbox ("pause") image is busybox-static
//!   in a scratch image built here, and the images a test runs are copied
//!   from podman (`podman save`, `ctr images import`);
//! - the control plane listens on loopback: the `kubernetes` Service's
//!   ClusterIP is sent to it by a NAT rule (what kube-proxy's rule for that
//!   Service does), so in-cluster clients on the host network reach it;
//! - pod traffic stays on the machine: a FORWARD rule drops what the pod
//!   range sends elsewhere;
//! - where a test asks, kube-proxy v1.36.2 in iptables mode
//!   ([`Node::start_kube_proxy`]) makes the Services' ClusterIPs real DNAT
//!   rules.
//!
//! Everything is undone when the [`Node`] is dropped, in this order:
//! kube-proxy stopped and its rules removed (`--cleanup`); the containers
//! killed through containerd, then any process left in the `kubepods`
//! cgroups; the kubelet, containerd and its shims stopped by PID; the
//! `KUBE-` chains the kubelet made, the test's own rules and the bridge
//! removed; the empty `kubepods` cgroups removed; /var/lib/kubelet (where
//! deploy/'s seccomp-profile overlay writes its profile) removed if this
//! node made it. The images live in containerd's root under the node's
//! temporary directory and go with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{dies_with_us, free_port, kubeconfig, ControlPlane, Daemon, KUBELET_NODE};

/// The pods' range; its first address is the bridge's and the node's.
pub const POD_SUBNET: &str = "10.244.91.0/24";
/// The node's InternalIP: the bridge's address, where the kubelet and
/// hostNetwork pods' ports are reached.
pub const NODE_IP: &str = "10.244.91.1";
const BRIDGE: &str = "na-kube0";
/// The `kubernetes` Service's ClusterIP (the first of
/// [`crate::cluster::SERVICE_RANGE`]).
const KUBERNETES_SERVICE: &str = "10.96.0.1";
/// The sandbox image, and an image with a shell for test pods: `/busybox`.
pub const BUSYBOX_IMAGE: &str = "localhost/node-agent-test-busybox:1";
const CONTAINERD: &str = "/usr/bin/containerd";
const CTR: &str = "/usr/bin/ctr";

/// A running kubelet and containerd registered as [`KUBELET_NODE`].
pub struct Node {
    kube_proxy: Option<Daemon>,
    kubelet: Option<Daemon>,
    containerd: Option<Daemon>,
    /// iptables rules added (table, chain, rule), deleted when dropped.
    rules: Vec<(String, String, Vec<String>)>,
    bridge: bool,
    /// The `KUBE-` chains (tool, table, chain) there were before the
    /// kubelet made its own (KUBE-FIREWALL, KUBE-KUBELET-CANARY).
    kube_chains_before: Vec<(String, String, String)>,
    /// kube-proxy's binary once it ran, for its `--cleanup`.
    kube_proxy_bin: Option<PathBuf>,
    /// Whether this node made /var/lib/kubelet (then it removes it).
    made_var_lib_kubelet: bool,
    socket: PathBuf,
    /// The kubelet's `--root-dir`.
    pub root_dir: PathBuf,
    dir: tempfile::TempDir,
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!("{cmd:?}: {}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout)))
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The busybox image in podman: busybox-static as `/busybox` in an
/// otherwise empty image, sleeping (the sandbox's part) unless told
/// otherwise.
fn busybox_image(dir: &Path) -> Result<(), String> {
    if Command::new("podman").args(["image", "exists", BUSYBOX_IMAGE]).status().is_ok_and(|s| s.success()) {
        return Ok(());
    }
    let rootfs = dir.join("busybox-rootfs");
    std::fs::create_dir_all(rootfs.join("tmp")).map_err(|e| e.to_string())?;
    std::fs::copy("/bin/busybox", rootfs.join("busybox")).map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
    let tar = dir.join("busybox-rootfs.tar");
    run(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg("."))?;
    run(Command::new("podman")
        .args(["import", "--quiet", "--change", r#"CMD ["/busybox", "sleep", "2147483647"]"#])
        .arg(&tar)
        .arg(BUSYBOX_IMAGE))?;
    Ok(())
}

/// One of deploy/'s agent pods, as the API server has it.
#[derive(Clone, Debug)]
pub struct AgentPod {
    pub name: String,
    pub uid: String,
    pub ready: bool,
}

fn kubectl_json(cp: &ControlPlane, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = cp.kubectl(&a);
    if !out.status.success() {
        return Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl {}: {e}", args.join(" ")))
}

/// deploy/'s agent pods not being deleted.
pub fn agent_pods(cp: &ControlPlane) -> Result<Vec<AgentPod>, String> {
    let list = kubectl_json(cp, &["-n", "monitoring", "get", "pods", "-l", "app.kubernetes.io/name=node-agent"])?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    Ok(items
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| AgentPod {
            name: p["metadata"]["name"].as_str().unwrap_or("").to_string(),
            uid: p["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            ready: p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")),
        })
        .collect())
}

/// The `Unhealthy` events (failed probes) of the agent pod `name`.
pub fn unhealthy(cp: &ControlPlane, name: &str) -> Result<Vec<String>, String> {
    let selector = format!("reason=Unhealthy,involvedObject.name={name}");
    let list = kubectl_json(cp, &["-n", "monitoring", "get", "events", "--field-selector", &selector])?;
    Ok(list["items"].as_array().map(|i| i.iter().map(|e| e["message"].as_str().unwrap_or("").to_string()).collect()).unwrap_or_default())
}

/// `/metrics` from the agent on hostPort 9100 at the node's address.
pub fn agent_metrics() -> Option<String> {
    let addr: std::net::SocketAddr = format!("{NODE_IP}:9100").parse().ok()?;
    crate::http_get(addr, "/metrics", Duration::from_secs(10)).filter(|(code, _)| *code == 200).map(|(_, body)| body)
}

/// A container's memory as the kubelet reports it in `/stats/summary`.
#[derive(Clone, Copy, Debug)]
pub struct ContainerMemory {
    /// `workingSetBytes`: what the kubelet evicts by and the limit is
    /// checked against.
    pub working_set: f64,
    pub usage: f64,
    pub rss: f64,
}

impl Node {
    /// Waits for a Ready agent pod whose UID is not `not`.
    pub fn ready_agent(&self, cp: &ControlPlane, not: Option<&str>, within: Duration) -> Result<AgentPod, String> {
        let t = Instant::now();
        loop {
            let pods = agent_pods(cp)?;
            if let Some(p) = pods.iter().find(|p| p.ready && Some(p.uid.as_str()) != not) {
                return Ok(p.clone());
            }
            if t.elapsed() > within {
                let events = cp.kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
                return Err(format!(
                    "no Ready agent pod in {within:?}: {pods:?}\nevents:\n{}\nkubelet:\n{}\ncontainerd:\n{}",
                    String::from_utf8_lossy(&events.stdout),
                    self.kubelet_log(40),
                    self.containerd_log(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The memory of `container` in `pod` as the kubelet's
    /// `/stats/summary` reports it.
    pub fn memory(&self, cp: &ControlPlane, pod: &str, container: &str) -> Result<ContainerMemory, String> {
        let summary = self.stats_summary(cp)?;
        let pods = summary["pods"].as_array().ok_or("no pods in the kubelet's summary")?;
        let p = pods.iter().find(|p| p["podRef"]["name"] == pod).ok_or_else(|| format!("{pod} not in the kubelet's summary"))?;
        let c = p["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == container))
            .ok_or_else(|| format!("no container {container} in {pod}'s summary"))?;
        let m = &c["memory"];
        let num = |k: &str| m[k].as_f64().ok_or_else(|| format!("no {k} for {pod}/{container}: {m}"));
        Ok(ContainerMemory { working_set: num("workingSetBytes")?, usage: num("usageBytes")?, rss: num("rssBytes")? })
    }

    /// Starts containerd and a kubelet against `cp`, with `images` (held
    /// by podman) in containerd's store under their own names and under
    /// the names in `aliases` (`(held, alias)`), and waits until the node
    /// is Ready (its not-ready taint lifted, as the node lifecycle
    /// controller would). kube-controller-manager is not started here.
    pub fn start(cp: &ControlPlane, images: &[&str], aliases: &[(&str, &str)]) -> Result<Node, String> {
        for bin in [CONTAINERD, CTR] {
            if !Path::new(bin).exists() {
                return Err(format!("{bin} is absent: install Debian's containerd (cargo xtask setup does)"));
            }
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let d = dir.path().to_path_buf();
        let socket = d.join("containerd.sock");
        let mut node = Node {
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            rules: Vec::new(),
            bridge: false,
            kube_proxy_bin: None,
            kube_chains_before: kube_chains(),
            made_var_lib_kubelet: !Path::new("/var/lib/kubelet").exists(),
            socket: socket.clone(),
            root_dir: d.join("kubelet"),
            dir,
        };
        node.network(cp)?;
        node.containerd = Some(containerd(&d, &socket)?);
        busybox_image(&d)?;
        let mut all: Vec<&str> = vec![BUSYBOX_IMAGE];
        all.extend(images);
        for (i, image) in all.iter().enumerate() {
            let tar = d.join(format!("image-{i}.tar"));
            run(Command::new("podman").args(["save", "--quiet", "--format", "docker-archive", "-o"]).arg(&tar).arg(image))?;
            run(node.ctr().args(["images", "import"]).arg(&tar))?;
            let _ = std::fs::remove_file(&tar);
        }
        for (held, alias) in aliases {
            if held != alias {
                run(node.ctr().args(["images", "tag", "--force", held, alias]))?;
            }
        }
        node.kubelet = Some(node.kubelet(cp)?);
        let t = Instant::now();
        let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        loop {
            let out = cp.kubectl(&["get", "node", KUBELET_NODE, "-o", ready]);
            if String::from_utf8_lossy(&out.stdout).trim() == "True" {
                break;
            }
            if let Some(Ok(Some(status))) = node.kubelet.as_mut().map(|k| k.0.try_wait()) {
                return Err(format!("the kubelet exited ({status}):\n{}", node.kubelet_log(60)));
            }
            if t.elapsed() > Duration::from_secs(120) {
                return Err(format!("node {KUBELET_NODE} not Ready in 120 s:\n{}", node.kubelet_log(60)));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let out = cp.kubectl(&["taint", "node", KUBELET_NODE, "node.kubernetes.io/not-ready:NoSchedule-"]);
        if !out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("not found") {
            return Err(format!("lifting the not-ready taint: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(node)
    }

    /// `ctr` against this node's containerd, in the CRI's namespace.
    fn ctr(&self) -> Command {
        let mut c = Command::new(CTR);
        c.arg("--address").arg(&self.socket).args(["--namespace", "k8s.io"]);
        c
    }

    /// The bridge, the pods' FORWARD rule and the `kubernetes` Service's
    /// NAT rule; the CNI configuration that uses the bridge.
    fn network(&mut self, cp: &ControlPlane) -> Result<(), String> {
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).stderr(Stdio::null()).status();
        run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
        self.bridge = true;
        run(Command::new("ip").args(["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE]))?;
        run(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
        let port = cp.url.rsplit(':').next().unwrap_or_default().to_string();
        let rules: Vec<(&str, &str, Vec<String>)> = vec![
            ("filter", "FORWARD", ["-s", POD_SUBNET, "!", "-d", POD_SUBNET, "-j", "DROP"].map(String::from).to_vec()),
            (
                "nat",
                "OUTPUT",
                ["-d", KUBERNETES_SERVICE, "-p", "tcp", "--dport", "443", "-j", "REDIRECT", "--to-ports", &port].map(String::from).to_vec(),
            ),
        ];
        for (table, chain, rule) in rules {
            run(Command::new("iptables").args(["-w", "-t", table, "-I", chain]).args(&rule))?;
            self.rules.push((table.into(), chain.into(), rule));
        }
        let d = self.dir.path();
        std::fs::create_dir_all(d.join("cni")).map_err(|e| e.to_string())?;
        let conf = format!(
            r#"{{"cniVersion": "0.4.0", "name": "node-agent-test", "plugins": [{{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false, "hairpinMode": true, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_SUBNET}", "gateway": "{NODE_IP}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{}"}}}}]}}"#,
            d.join("cni-ipam").display()
        );
        std::fs::write(d.join("cni/10-node-agent-test.conflist"), conf).map_err(|e| e.to_string())
    }

    /// The kubelet, in containerd's mount namespace, with its
    /// configuration and client certificate.
    fn kubelet(&self, cp: &ControlPlane) -> Result<Daemon, String> {
        let d = self.dir.path();
        let c = cp.dir();
        let kc = d.join("kubelet.kubeconfig");
        let user =
            format!("    client-certificate: {}\n    client-key: {}\n", c.join("kubelet.crt").display(), c.join("kubelet.key").display());
        kubeconfig(&kc, &cp.url, &c.join("ca.crt"), &user)?;
        std::fs::create_dir_all(&self.root_dir).map_err(|e| e.to_string())?;
        // deploy/overlays/seccomp-profile writes its profile into the
        // default root's seccomp directory, as on a node of a distribution.
        std::fs::create_dir_all("/var/lib/kubelet/seccomp").map_err(|e| format!("/var/lib/kubelet/seccomp: {e}"))?;
        std::os::unix::fs::symlink("/var/lib/kubelet/seccomp", self.root_dir.join("seccomp")).map_err(|e| e.to_string())?;
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {logs}
resolvConf: /etc/resolv.conf
# This machine's disk and memory are shared with the rest of the tests:
# nothing is evicted or collected for them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 1Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}}
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
",
            port = free_port()?,
            healthz = free_port()?,
            ca = c.join("ca.crt").display(),
            socket = self.socket.display(),
            logs = d.join("pod-logs").display(),
        );
        std::fs::write(d.join("kubelet.yaml"), config).map_err(|e| e.to_string())?;
        let containerd = self.containerd.as_ref().ok_or("containerd is not running")?;
        let log = std::fs::File::create(d.join("kubelet.log")).map_err(|e| e.to_string())?;
        let child = dies_with_us(Command::new("nsenter").arg(format!("--mount=/proc/{}/ns/mnt", containerd.0.id())).arg("--"))
            .arg(cp.bin.join("kubelet"))
            .arg("--config")
            .arg(d.join("kubelet.yaml"))
            .arg("--kubeconfig")
            .arg(&kc)
            .arg("--root-dir")
            .arg(&self.root_dir)
            .arg("--cert-dir")
            .arg(d.join("kubelet-pki"))
            .args(["--hostname-override", KUBELET_NODE, "--node-ip", NODE_IP, "--v=1"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("kubelet: {e}"))?;
        Ok(Daemon(child))
    }

    /// kube-proxy v1.36.2 in iptables mode on this node (cluster-admin's
    /// credentials; the pod range as the cluster's), which writes the
    /// Services' DNAT rules into the host's nat table; it leaves the
    /// host's conntrack and route_localnet settings as they are. Returns
    /// once its KUBE-SERVICES chain is in place. Its rules are removed
    /// (`kube-proxy --cleanup`) when the node is dropped.
    pub fn start_kube_proxy(&mut self, cp: &ControlPlane) -> Result<(), String> {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("kube-proxy.log")).map_err(|e| e.to_string())?;
        let child = dies_with_us(&mut Command::new(cp.bin.join("kube-proxy")))
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .args(["--proxy-mode", "iptables", "--hostname-override", KUBELET_NODE, "--cluster-cidr", POD_SUBNET])
            .args(["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"])
            .arg("--iptables-localhost-nodeports=false")
            .args(["--metrics-bind-address", &format!("127.0.0.1:{}", free_port()?)])
            .args(["--healthz-bind-address", &format!("127.0.0.1:{}", free_port()?)])
            .arg("--v=1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("kube-proxy: {e}"))?;
        self.kube_proxy = Some(Daemon(child));
        self.kube_proxy_bin = Some(cp.bin.join("kube-proxy"));
        let t = Instant::now();
        loop {
            let ok = Command::new("iptables").args(["-w", "-t", "nat", "-S", "KUBE-SERVICES"]).output();
            if ok.is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.kube_proxy.as_mut().map(|k| k.0.try_wait()) {
                return Err(format!("kube-proxy exited ({status}):\n{}", self.kube_proxy_log(40)));
            }
            if t.elapsed() > Duration::from_secs(60) {
                return Err(format!("kube-proxy wrote no KUBE-SERVICES chain in 60 s:\n{}", self.kube_proxy_log(40)));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// kube-proxy's log, its last `n` lines.
    pub fn kube_proxy_log(&self, n: usize) -> String {
        tail(&self.dir.path().join("kube-proxy.log"), n)
    }

    /// The kubelet's log, its last `n` lines.
    pub fn kubelet_log(&self, n: usize) -> String {
        tail(&self.dir.path().join("kubelet.log"), n)
    }

    /// containerd's log, its last `n` lines.
    pub fn containerd_log(&self, n: usize) -> String {
        tail(&self.dir.path().join("containerd.log"), n)
    }

    /// The kubelet's `/stats/summary`, through the API server's node proxy.
    pub fn stats_summary(&self, cp: &ControlPlane) -> Result<serde_json::Value, String> {
        let out = cp.kubectl(&["get", "--raw", &format!("/api/v1/nodes/{KUBELET_NODE}/proxy/stats/summary")]);
        if !out.status.success() {
            return Err(format!("stats/summary: {}", String::from_utf8_lossy(&out.stderr)));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("stats/summary: {e}"))
    }

    /// Kills what runs on the node: every container and sandbox through
    /// containerd, then whatever is left in the kubepods cgroups.
    fn kill_pods(&self) {
        if let Ok(out) = self.ctr().args(["tasks", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.ctr().args(["tasks", "kill", "-s", "SIGKILL", id]).stderr(Stdio::null()).status();
            }
        }
        for _ in 0..50 {
            if kubepods_procs().is_empty() {
                break;
            }
            for pid in kubepods_procs() {
                // SAFETY: SIGKILL to a process of the node's pods.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The kubepods cgroup trees the kubelet makes (cgroupfs driver): under
/// each v1 hierarchy and the unified one.
fn kubepods_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for base in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if let Ok(rd) = std::fs::read_dir(base) {
            roots.extend(rd.flatten().map(|e| e.path().join("kubepods")).filter(|p| p.is_dir()));
        }
        let p = Path::new(base).join("kubepods");
        if p.is_dir() {
            roots.push(p);
        }
    }
    roots
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

fn kubepods_procs() -> Vec<i32> {
    let mut dirs = Vec::new();
    for r in kubepods_roots() {
        walk(&r, &mut dirs);
    }
    let mut pids: Vec<i32> = dirs
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.parse().ok()).collect::<Vec<_>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// containerd with its own root, state and socket under `d`, in a mount
/// namespace of its own whose mounts are shared; up once `ctr version`
/// answers.
fn containerd(d: &Path, socket: &Path) -> Result<Daemon, String> {
    let config = format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{BUSYBOX_IMAGE}"
  # No CAP_SYS_RESOURCE here: a container's oom_score_adj may not go
  # below containerd's own.
  restrict_oom_score_adj = true
  # The pods' network namespaces under the state directory, not
  # /run/netns: the node unmounts them when dropped (a namespace kept
  # mounted outlives containerd, and with it the pod's veth).
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
"#,
        d = d.display(),
        socket = socket.display(),
    );
    std::fs::write(d.join("containerd.toml"), config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(d.join("containerd.log")).map_err(|e| e.to_string())?;
    let child = dies_with_us(Command::new("unshare").args(["--mount", "--propagation", "shared", "--"]))
        .arg(CONTAINERD)
        .arg("--config")
        .arg(d.join("containerd.toml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("containerd: {e}"))?;
    let mut daemon = Daemon(child);
    let t = Instant::now();
    loop {
        let ok = Command::new(CTR).arg("--address").arg(socket).arg("version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if ok.is_ok_and(|s| s.success()) {
            return Ok(daemon);
        }
        if let Ok(Some(status)) = daemon.0.try_wait() {
            return Err(format!("containerd exited ({status}):\n{}", tail(&d.join("containerd.log"), 40)));
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("containerd not up in 30 s:\n{}", tail(&d.join("containerd.log"), 40)));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `KUBE-` chains in the host's filter, nat and mangle tables, v4
/// and v6: (tool, table, chain).
fn kube_chains() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(o) = Command::new(tool).args(["-w", "-t", table, "-S"]).output() else { continue };
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if let Some(c) = l.strip_prefix("-N ").filter(|c| c.starts_with("KUBE-")) {
                    out.push((tool.to_string(), table.to_string(), c.to_string()));
                }
            }
        }
    }
    out
}

/// Removes the `KUBE-` chains not in `before`, and every rule jumping to
/// them.
fn remove_kube_chains(before: &[(String, String, String)]) {
    let new: Vec<(String, String, String)> = kube_chains().into_iter().filter(|c| !before.contains(c)).collect();
    for (tool, table, chain) in &new {
        let Ok(o) = Command::new(tool).args(["-w", "-t", table, "-S"]).output() else { continue };
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if let Some(rule) = l.strip_prefix("-A ").filter(|r| r.ends_with(&format!("-j {chain}"))) {
                // Rules are as iptables -S prints them: no quoted spaces
                // but comments', which jump rules to these chains lack.
                let args: Vec<&str> = rule.split_whitespace().collect();
                let _ = Command::new(tool).args(["-w", "-t", table, "-D"]).args(&args).stderr(Stdio::null()).status();
            }
        }
    }
    for (tool, table, chain) in &new {
        let _ = Command::new(tool).args(["-w", "-t", table, "-F", chain]).stderr(Stdio::null()).status();
    }
    for (tool, table, chain) in &new {
        let _ = Command::new(tool).args(["-w", "-t", table, "-X", chain]).stderr(Stdio::null()).status();
    }
}

/// The PIDs of containerd's shims for the socket `socket` (they outlive
/// containerd).
fn shims(socket: &Path) -> Vec<i32> {
    let want = socket.display().to_string();
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("containerd-shim") && cmd.contains(&want)
        })
        .collect()
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.kube_proxy.take());
        if let Some(bin) = &self.kube_proxy_bin {
            let _ = Command::new(bin).args(["--cleanup", "--proxy-mode", "iptables"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
        self.kill_pods();
        drop(self.kubelet.take());
        drop(self.containerd.take());
        for pid in shims(&self.socket) {
            // SAFETY: SIGKILL to a shim of the containerd this node started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // The pods' network namespaces (netns_mounts_under_state_dir): each
        // is a bind mount that keeps the namespace, and its veth, alive.
        if let Ok(rd) = std::fs::read_dir(self.dir.path().join("containerd/state/io.containerd.grpc.v1.cri/netns")) {
            for e in rd.flatten() {
                if let Ok(path) = std::ffi::CString::new(e.path().as_os_str().as_encoded_bytes()) {
                    // SAFETY: a NUL-terminated path; detaching a mount has no other effect.
                    unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
                }
                let _ = std::fs::remove_file(e.path());
            }
        }
        remove_kube_chains(&self.kube_chains_before);
        for (table, chain, rule) in &self.rules {
            let _ = Command::new("iptables").args(["-w", "-t", table, "-D", chain]).args(rule).status();
        }
        if self.bridge {
            let _ = Command::new("ip").args(["link", "del", BRIDGE]).status();
        }
        if self.made_var_lib_kubelet {
            let _ = std::fs::remove_dir_all("/var/lib/kubelet");
        }
        // Deepest first: a cgroup goes once it has no children and no
        // processes.
        for r in kubepods_roots() {
            let mut dirs = Vec::new();
            walk(&r, &mut dirs);
            for d in dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}
