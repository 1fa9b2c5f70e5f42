//! deploy/'s DaemonSet run by a real kubelet: kubelet v1.36.2 over
//! Debian's containerd 1.6 and runc with a CNI bridge
//! (`node_agent_tests::kubelet`), registered with a real control plane
//! (etcd, kube-apiserver, kube-scheduler, and kube-controller-manager's
//! DaemonSet, ServiceAccount, root-CA publisher and EndpointSlice
//! controllers), the image
//! `cargo xtask image` built imported into containerd. What a cluster
//! admin sees after `kubectl apply -k deploy/`:
//! - the pod becomes Ready through its real probes, with no `Unhealthy`
//!   event;
//! - host metrics on hostPort 9100 at the node's address, and every eBPF
//!   program up under RuntimeDefault (containerd 1.6.20's profile allows
//!   bpf and perf_event_open with CAP_BPF and CAP_PERFMON);
//! - a real pod on the node (its syscalls failing, ENOENT) named in the
//!   per-pod families, through the agent's pod watch, which reaches the
//!   API server by the `kubernetes` Service's ClusterIP;
//! - a Service through real kube-proxy (iptables mode): a client pod's five
//!   connections to its ClusterIP counted exactly for the Service, and the
//!   server pod's five accepts for the client pod; a pod's five queries to
//!   a DNS Service's ClusterIP (kube-proxy's UDP DNAT to a resolver on the
//!   node) counted exactly for the Service, answered;
//! - the kubelet's own figure for the agent's memory (`/stats/summary`,
//!   the working set it evicts by) within deploy/'s request;
//! - a re-apply of the unchanged tree says `unchanged` for every object;
//! - a deleted pod is gone within its grace period, and the next one is
//!   Ready on the same port, again with no `Unhealthy` event;
//! - overlays/seccomp-profile rolls the pod to the shipped profile
//!   (Localhost, written by its init container), every program still up.
//!
//! One test: the node holds hostPort 9100 and a share of two CPUs. It
//! needs root, containerd, ../shared and the image; without them it skips
//! with a message, except in CI.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use node_agent_tests::cluster::{ControlPlane, KUBELET_NODE};
use node_agent_tests::host::root_or_skip;
use node_agent_tests::kubelet::{agent_metrics, unhealthy, AgentPod, Node, BUSYBOX_IMAGE, NODE_IP};
use node_agent_tests::samples;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The image deploy/'s DaemonSet names.
fn manifest_image() -> String {
    let text = std::fs::read_to_string(root().join("deploy/agent/daemonset.yaml")).expect("deploy/agent/daemonset.yaml");
    let line = text.lines().find(|l| l.trim_start().starts_with("image:")).expect("an image line");
    line.trim_start().trim_start_matches("image:").trim().to_string()
}

/// The image under test in podman (`$NODE_AGENT_IMAGE`, else the
/// manifests' reference), or None (skip) outside CI.
fn image() -> Option<String> {
    let image = std::env::var("NODE_AGENT_IMAGE").ok().filter(|s| !s.is_empty()).unwrap_or_else(manifest_image);
    let held = Command::new("podman").args(["image", "exists", &image]).status().is_ok_and(|s| s.success());
    if !held {
        assert!(std::env::var_os("CI").is_none(), "no image {image} in podman: cargo xtask test builds it, and CI must run this test");
        eprintln!("SKIP: no image {image} in podman (cargo xtask image builds it)");
        return None;
    }
    Some(image)
}

fn ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl(args);
    assert!(out.status.success(), "kubectl {}: {}\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr), cp.log_tail());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl apply` of `yaml`.
fn apply(cp: &ControlPlane, yaml: &str) {
    let file = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(file.path(), yaml).expect("written");
    ok(cp, &["apply", "-f", &file.path().display().to_string()]);
}

fn ready(cp: &ControlPlane, node: &Node, not: Option<&str>) -> AgentPod {
    node.ready_agent(cp, not, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"))
}

fn no_probe_failures(cp: &ControlPlane, pod: &str, when: &str) {
    let events = unhealthy(cp, pod).unwrap_or_else(|e| panic!("{e}"));
    assert!(events.is_empty(), "probe failures {when}: {events:?}");
}

/// Every eBPF program's `node_ebpf_program_up`, by program.
fn programs(body: &str) -> BTreeMap<String, f64> {
    samples(body, "node_ebpf_program_up").into_iter().map(|(l, v)| (l.get("program").cloned().unwrap_or_default(), v)).collect()
}

fn all_up(body: &str, what: &str) {
    let programs = programs(body);
    assert!(programs.len() >= 10, "{what}: node_ebpf_program_up for {} programs only: {programs:?}", programs.len());
    let down: Vec<&String> = programs.iter().filter(|(_, v)| **v != 1.0).map(|(p, _)| p).collect();
    let reasons: Vec<String> =
        body.lines().filter(|l| l.starts_with("node_ebpf_program_down_reason") && l.ends_with(" 1")).map(String::from).collect();
    assert!(down.is_empty(), "{what}: programs down: {down:?}\n{}", reasons.join("\n"));
}

const WORKER: &str = "apiVersion: v1
kind: Pod
metadata: {name: worker, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: worker
      image: IMAGE
      imagePullPolicy: Never
      # A system call that fails (ENOENT) a few times a second.
      command: [/busybox, sh, -c, 'while true; do /busybox cat /nonexistent 2>/dev/null; /busybox sleep 0.2; done']
";

/// Waits until the host's nat table has, for each group of `lines`, a
/// line holding all of that group (kube-proxy's rules for a Service: its
/// ClusterIP's jump, its endpoint's DNAT).
fn dnat_rules(node: &Node, lines: &[&[&str]]) {
    let t = Instant::now();
    loop {
        let rules = Command::new("iptables").args(["-w", "-t", "nat", "-S"]).output().expect("iptables");
        let rules = String::from_utf8_lossy(&rules.stdout);
        if lines.iter().all(|group| rules.lines().any(|l| group.iter().all(|n| l.contains(n)))) {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no rules with {lines:?} in 90 s:\n{rules}\nkube-proxy:\n{}",
            node.kube_proxy_log(30)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sum of `family`'s samples whose labels include `want`.
fn count(body: &str, family: &str, want: &[(&str, &str)]) -> f64 {
    samples(body, family).iter().filter(|(l, _)| want.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))).map(|(_, v)| v).sum()
}

/// Waits (60 s at most) until both counts reach `want`, then, 3 s later
/// (nothing more may arrive), asserts both are exactly `want`.
fn exactly(what: &str, counts: [(&str, &[(&str, &str)]); 2], want: f64) -> (f64, f64) {
    let both = |body: &str| (count(body, counts[0].0, counts[0].1), count(body, counts[1].0, counts[1].1));
    let t = Instant::now();
    loop {
        let (a, b) = both(&agent_metrics().unwrap_or_default());
        if a >= want && b >= want {
            std::thread::sleep(Duration::from_secs(3));
            let settled = both(&agent_metrics().unwrap_or_default());
            assert_eq!(settled, (want, want), "{what}");
            return settled;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let body = agent_metrics().unwrap_or_default();
            let lines: Vec<&str> =
                body.lines().filter(|l| l.starts_with("node_ebpf_pod_") && l.contains("namespace=\"default\"")).collect();
            panic!("{what}: not counted in 60 s ({a}, {b}):\n{}", lines.join("\n"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The connections the client makes to the Service.
const CONNECTIONS: f64 = 5.0;

/// A web server and its Service.
const SERVER: &str = "apiVersion: v1
kind: Pod
metadata: {name: echo, namespace: default, labels: {app: echo}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: httpd
      image: IMAGE
      imagePullPolicy: Never
      command: [/busybox, httpd, -f, -p, '8080', -h, /]
      ports: [{name: http, containerPort: 8080}]
      readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: default}
spec:
  selector: {app: echo}
  ports: [{name: http, port: 8080, targetPort: 8080}]
";

/// A client fetching from the Service's ClusterIP, CONNECTIONS times.
const CLIENT: &str = "apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: wget
      image: IMAGE
      imagePullPolicy: Never
      command: [/busybox, sh, -c, 'for i in 1 2 3 4 5; do /busybox wget -q -O /dev/null http://CLUSTERIP:8080/busybox; done; exec /busybox sleep 2147483647']
";

/// The queries the asker sends to the DNS Service.
const QUERIES: f64 = 5.0;

/// A DNS Service with no selector: its one endpoint is the node's
/// address, port 5353, where [`resolver`] answers.
const DNS: &str = "apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  ports: [{name: dns, port: 53, targetPort: 5353, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
endpoints: [{addresses: [NODE_IP], conditions: {ready: true}}]
ports: [{name: dns, port: 5353, protocol: UDP}]
";

/// A pod resolving one name through the DNS Service's ClusterIP, QUERIES
/// times (an A query each).
const ASKER: &str = "apiVersion: v1
kind: Pod
metadata: {name: asker, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: nslookup
      image: IMAGE
      imagePullPolicy: Never
      command: [/busybox, sh, -c, 'for i in 1 2 3 4 5; do /busybox nslookup -type=a web.test CLUSTERIP; done; exec /busybox sleep 2147483647']
";

/// A resolver on the node's address, UDP port 5353, answering every
/// query with one A record (10.0.0.1), until the process ends.
fn resolver() -> std::thread::JoinHandle<()> {
    let sock = std::net::UdpSocket::bind(format!("{NODE_IP}:5353")).expect("the resolver's socket");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            // The header (12 bytes) and the question, which ends 4 bytes
            // after its name's zero byte.
            if n < 12 {
                continue;
            }
            let Some(end) = buf[12..n].iter().position(|b| *b == 0).map(|z| 12 + z + 5) else { continue };
            if end > n {
                continue;
            }
            let mut answer = buf[..end].to_vec();
            answer[2] = 0x81; // a response, recursion desired
            answer[3] = 0x80; // recursion available, NOERROR
            answer[6..12].copy_from_slice(&[0, 1, 0, 0, 0, 0]); // one answer
            answer.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1]);
            let _ = sock.send_to(&answer, from);
        }
    })
}

#[test]
fn deploy_runs_under_a_real_kubelet() {
    if !root_or_skip("the real kubelet test") {
        return;
    }
    let Some(image) = image() else { return };
    let Some(mut cp) = ControlPlane::start_or_skip("the real kubelet test") else { return };
    cp.start_scheduler().expect("kube-scheduler");
    cp.start_controller_manager("daemonset,serviceaccount,root-ca-cert-publisher,endpointslice").expect("kube-controller-manager");
    let started = Instant::now();
    let wanted = manifest_image();
    let mut node = Node::start(&cp, &[&image], &[(&image, &wanted)]).unwrap_or_else(|e| panic!("the node did not start: {e}"));
    eprintln!("node {KUBELET_NODE} Ready {:.1}s after the control plane", started.elapsed().as_secs_f64());

    // A pod of a user's on the node, to be named by the agent.
    let t = Instant::now();
    while !cp.kubectl(&["get", "serviceaccount", "default"]).status.success() {
        assert!(t.elapsed() < Duration::from_secs(60), "no default ServiceAccount in 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    apply(&cp, &WORKER.replace("IMAGE", BUSYBOX_IMAGE));

    let deploy = root().join("deploy").display().to_string();
    let applied = Instant::now();
    ok(&cp, &["apply", "-k", &deploy]);
    let first = ready(&cp, &node, None);
    let pod = first.name.clone();
    eprintln!("agent pod {pod} Ready {:.1}s after the apply", applied.elapsed().as_secs_f64());
    no_probe_failures(&cp, &pod, "at a normal start");

    let body = agent_metrics().expect("the agent answers on hostPort 9100 at the node's address");
    for family in
        ["node_cpu_seconds_total", "node_memory_MemAvailable_bytes", "node_network_receive_bytes_total", "node_filesystem_avail_bytes"]
    {
        assert!(!samples(&body, family).is_empty(), "no {family} on :9100");
    }
    all_up(&body, "RuntimeDefault");

    // The user's pod, named: its failing system calls counted for it.
    let t = Instant::now();
    loop {
        let body = agent_metrics().unwrap_or_default();
        let errors: f64 = samples(&body, "node_ebpf_pod_syscall_errors_total")
            .iter()
            .filter(|(l, _)| {
                l.get("namespace").map(String::as_str) == Some("default") && l.get("pod").map(String::as_str) == Some("worker")
            })
            .map(|(_, v)| v)
            .sum();
        if errors > 0.0 {
            eprintln!("pod default/worker named: {errors} failed system calls");
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let sync: Vec<&str> = body.lines().filter(|l| l.starts_with("node_ebpf_pod_attribution")).collect();
            panic!("default/worker not named in 60 s:\n{}", sync.join("\n"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    // A Service through real kube-proxy rules: the client's connections
    // to the ClusterIP are the Service's, the server's the client pod's.
    node.start_kube_proxy(&cp).unwrap_or_else(|e| panic!("{e}"));
    apply(&cp, &SERVER.replace("IMAGE", BUSYBOX_IMAGE));
    let ip = ok(&cp, &["get", "service", "echo", "-o", "jsonpath={.spec.clusterIP}"]);
    dnat_rules(&node, &[&[&format!("-d {ip}/32"), "KUBE-SVC-"], &["default/echo:http", "-j DNAT"]]);
    apply(&cp, &CLIENT.replace("IMAGE", BUSYBOX_IMAGE).replace("CLUSTERIP", &ip));
    let out: &[(&str, &str)] = &[
        ("namespace", "default"),
        ("pod", "client"),
        ("peer_kind", "service"),
        ("peer", "default/echo"),
        ("port", "8080"),
        ("result", "established"),
    ];
    let accepted: &[(&str, &str)] =
        &[("namespace", "default"), ("pod", "echo"), ("peer_kind", "pod"), ("peer", "default/client"), ("port", "8080")];
    let (o, a) = exactly(
        "the client's connections to the Service, and the server's from the client",
        [("node_ebpf_pod_tcp_peer_connects_total", out), ("node_ebpf_pod_tcp_peer_accepted_total", accepted)],
        CONNECTIONS,
    );
    eprintln!("through kube-proxy's DNAT: {o} connections of default/client to service default/echo, {a} accepted by default/echo from it");

    // A DNS Service through kube-proxy's rules: a resolver on the node
    // behind it, a pod querying its ClusterIP; the queries are the pod's,
    // to the Service.
    let _resolver = resolver();
    apply(&cp, &DNS.replace("NODE_IP", NODE_IP));
    let dns_ip = ok(&cp, &["get", "service", "dns", "-o", "jsonpath={.spec.clusterIP}"]);
    dnat_rules(&node, &[&[&format!("-d {dns_ip}/32"), "KUBE-SVC-"], &["default/dns:dns", "-j DNAT", &format!("{NODE_IP}:5353")]]);
    apply(&cp, &ASKER.replace("IMAGE", BUSYBOX_IMAGE).replace("CLUSTERIP", &dns_ip));
    let asked: &[(&str, &str)] =
        &[("namespace", "default"), ("pod", "asker"), ("server_kind", "service"), ("server", "default/dns"), ("transport", "udp")];
    let (q, r) = exactly(
        "the pod's queries to the DNS Service, and their answers",
        [("node_ebpf_pod_dns_queries_total", asked), ("node_ebpf_pod_dns_responses_total", asked)],
        QUERIES,
    );
    eprintln!("through kube-proxy's DNAT: {q} queries of default/asker to service default/dns, {r} answered");

    // The kubelet's view of the agent's memory, within deploy/'s request.
    let ws = node.memory(&cp, &pod, "node-agent").unwrap_or_else(|e| panic!("{e}\nkubelet:\n{}", node.kubelet_log(30))).working_set;
    eprintln!("kubelet /stats/summary: the agent's working set {:.1} MiB (request 48 MiB, limit 192 MiB)", ws / 1048576.0);
    assert!(ws > 0.0 && ws <= 48.0 * 1048576.0, "working set {ws} beyond deploy/'s 48Mi request");

    // Re-applying the unchanged tree changes nothing.
    let again = ok(&cp, &["apply", "-k", &deploy]);
    let changed: Vec<&str> = again.lines().filter(|l| !l.ends_with(" unchanged")).collect();
    assert!(changed.is_empty(), "a re-apply of an unchanged deploy/ changed: {changed:?}");

    // A deleted pod ends within its grace period; the next is Ready on
    // the same port, without probe failures.
    let spec: serde_json::Value = serde_json::from_str(&ok(&cp, &["-n", "monitoring", "get", "pod", &pod, "-o", "json"])).expect("JSON");
    let grace = spec["spec"]["terminationGracePeriodSeconds"].as_f64().unwrap_or(30.0);
    let t = Instant::now();
    ok(&cp, &["-n", "monitoring", "delete", "pod", &pod, "--wait=true", "--timeout=120s"]);
    let gone = t.elapsed();
    eprintln!("pod {pod} gone {:.2}s after its deletion (grace period {grace}s)", gone.as_secs_f64());
    assert!(gone.as_secs_f64() < grace, "the pod took {gone:?} to end, beyond its {grace}s grace period");
    let next = ready(&cp, &node, Some(&first.uid));
    eprintln!("replacement {} Ready {:.1}s after the deletion", next.name, t.elapsed().as_secs_f64());
    assert!(agent_metrics().is_some(), "the replacement serves on :9100");
    no_probe_failures(&cp, &next.name, "at the replacement's start");

    // The shipped seccomp profile: overlays/seccomp-profile rolls the pod.
    let overlay = root().join("deploy/overlays/seccomp-profile").display().to_string();
    let t = Instant::now();
    ok(&cp, &["apply", "-k", &overlay]);
    let profiled = ready(&cp, &node, Some(&next.uid)).name;
    eprintln!("pod {profiled} under the shipped profile Ready {:.1}s after the apply", t.elapsed().as_secs_f64());
    let spec: serde_json::Value =
        serde_json::from_str(&ok(&cp, &["-n", "monitoring", "get", "pod", &profiled, "-o", "json"])).expect("JSON");
    assert_eq!(spec["spec"]["containers"][0]["securityContext"]["seccompProfile"]["type"], "Localhost", "{spec}");
    all_up(&agent_metrics().expect("the agent under the profile answers"), "the shipped profile (Localhost)");
    no_probe_failures(&cp, &profiled, "under the profile");

    // The node's Drop kills its pods and undoes its network.
    drop(node);
}
