//! deploy/ and the agent judged by a real API server (etcd and
//! kube-apiserver v1.36.2 from ../shared/k8s, started by
//! `node_agent_tests::cluster`), not by our in-memory one:
//! - every kustomization applies server-side and client-side, and a
//!   re-apply of an unchanged tree changes nothing (`unchanged` for every
//!   object, resourceVersions kept);
//! - the NodeAgent CRD's schema and defaults as the server applies them;
//! - the agent's RBAC is least privilege as the real authorizer sees it: its
//!   ServiceAccount may do exactly get/list/watch on pods, services and
//!   nodes beyond what every authenticated identity may, and the agent,
//!   authenticating with a token the server issued for that ServiceAccount,
//!   lists and watches the pods of its node and the Services;
//! - the NodeAgent controller, two replicas authenticated as its
//!   ServiceAccount, with kube-scheduler binding its pods to Node objects
//!   (no kubelet: a loop here plays its part, marking bound pods running
//!   and confirming deletions): install through the health gate, canary
//!   first, maxUnavailable kept, failover to the standby; a gate failing
//!   past its deadline halts and rolls back, the status's counts agreeing
//!   with the pods after;
//! - the rollout's controls with a new controller leader before every
//!   step: a partition holds, a pause replaces nothing, `rollout resume`
//!   and `rollout undo` (the CLI) complete, the history is pruned to
//!   `revisionHistoryLimit`, and kube-controller-manager's garbage
//!   collector deletes a deleted NodeAgent's pods and revisions;
//! - `plan` against kube-controller-manager's DaemonSet controller: for
//!   five DaemonSets on the fixture cluster's nodes, the same nodes;
//! - the agent's pod watch across a restart of the API server (connection
//!   refused, then 403 while the restarted server's RBAC cache fills, then
//!   410 Gone for the old resourceVersion: seen here, each handled);
//! - the prometheus-operator overlay against the operator's CRDs as its
//!   published models describe them (`tests/operator_crds.py`): strict
//!   server-side and client-side apply, specs kept whole;
//! - what taking nodes over from a node_exporter DaemonSet relies on in
//!   the real DaemonSet controller: an `OnDelete` DaemonSet given an
//!   exclusion term keeps its pods, gives up one labelled node alone,
//!   adopts no pod another controller owns, and takes the node back;
//! - the takeover itself (`spec.replaces`) of the Helm chart's rendered
//!   node_exporter DaemonSet with deploy/overlays/takeover's RBAC: node by
//!   node, canary first, gated on a real node_exporter's families, never two
//!   exporters on a node, a failing node sent back and the takeover halted,
//!   `giveBack` returning every node and the DaemonSet's spec put back;
//!   and a real Prometheus scraping the chart's Service through one job
//!   while real node_exporters give way to real agents, missing no scrape.
//!
//! Without ../shared these tests skip with a message, except in CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use node_agent_tests::cluster::ControlPlane;
use node_agent_tests::gate::replica;
use node_agent_tests::pods::WatchingAgent;

/// The agent's flags beside ebpf_pods here: the Services watch too.
const PEERS: &[&str] = &["--collector.ebpf_tcp_peers"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The kustomizations a cluster admin applies, in the README's order (the
/// CRD before the controller's objects).
const APPLIED: &[&str] = &[
    "deploy",
    "deploy/overlays/no-ebpf",
    "deploy/overlays/gpu-only",
    "deploy/overlays/seccomp-unconfined",
    "deploy/overlays/seccomp-profile",
    "deploy/crd",
    "deploy/overlays/controller",
    "deploy/overlays/takeover",
];

fn ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {}: {}{}\nthe API server's log:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cp.log_tail()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dir(k: &str) -> String {
    root().join(k).display().to_string()
}

/// Every object's kind/name and resourceVersion in the tree `k` builds.
fn versions(cp: &ControlPlane, k: &str) -> Vec<String> {
    let built = ok(cp, &["kustomize", &dir(k)]);
    let mut out = Vec::new();
    for doc in built.split("\n---\n") {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).expect("yaml");
        let kind = v["kind"].as_str().unwrap_or_default().to_lowercase();
        let name = v["metadata"]["name"].as_str().unwrap_or_default();
        let mut args = vec!["get", &kind, name, "-o", "jsonpath={.metadata.resourceVersion}"];
        let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
        if let Some(ns) = &ns {
            args.extend(["-n", ns]);
        }
        out.push(format!("{kind}/{name}@{}", ok(cp, &args)));
    }
    out
}

#[test]
fn every_kustomization_applies_and_an_unchanged_reapply_changes_nothing() {
    let Some(cp) = ControlPlane::start_or_skip("deploy/ against a real API server") else { return };
    for k in APPLIED {
        // Server-side first, as a GitOps tool applies; then kubectl's
        // client-side apply over it, as the README says.
        let ssa = ok(&cp, &["apply", "--server-side", "--field-manager=gitops", "-k", &dir(k)]);
        assert!(!ssa.trim().is_empty(), "{k}: server-side apply printed nothing");
        if *k == "deploy/crd" {
            ok(&cp, &["wait", "--for=condition=Established", "crd/nodeagents.nodeagent.io", "--timeout=60s"]);
        }
        ok(&cp, &["apply", "-k", &dir(k)]);
        let before = versions(&cp, k);
        let again = ok(&cp, &["apply", "-k", &dir(k)]);
        let changed: Vec<&str> = again.lines().filter(|l| !l.ends_with(" unchanged")).collect();
        assert!(changed.is_empty(), "{k}: a re-apply of the unchanged tree changed objects:\n{}", changed.join("\n"));
        assert_eq!(versions(&cp, k), before, "{k}: a re-apply changed resourceVersions");
        eprintln!("{k}: applied server- and client-side; re-applied: {} objects unchanged", again.lines().count());
    }
}

/// deploy/overlays/prometheus-operator against prometheus-operator's CRDs
/// as the operator's published models describe them (no registry ships
/// the CRD manifests; `tests/operator_crds.py` makes them from
/// cloudcoil-models-prometheus-operator, generated from the operator's
/// CRDs): server-side apply with strict field validation (a field the
/// schema does not know is an error, not pruned), client-side apply, an
/// unchanged re-apply, the PodMonitor (the ServiceMonitor's alternative)
/// applied the same way, and every object's spec kept whole by the server.
#[test]
fn the_prometheus_operator_objects_apply_against_the_operators_crds() {
    let python = root().join("target/tools/venv/bin/python");
    if !python.is_file() {
        assert!(std::env::var_os("CI").is_none(), "{} is required in CI (cargo xtask setup makes it)", python.display());
        eprintln!("SKIP: the operator's CRDs need {} (cargo xtask setup)", python.display());
        return;
    }
    let Some(cp) = ControlPlane::start_or_skip("the prometheus-operator overlay against a real API server") else { return };
    let out = std::process::Command::new(&python).arg(root().join("tests/operator_crds.py")).output().expect("python runs");
    assert!(out.status.success(), "operator_crds.py: {}", String::from_utf8_lossy(&out.stderr));
    let crds = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(crds.path(), &out.stdout).expect("write");
    ok(&cp, &["apply", "--server-side", "-f", &crds.path().display().to_string()]);
    for crd in ["servicemonitors", "podmonitors", "prometheusrules"] {
        ok(&cp, &["wait", "--for=condition=Established", &format!("crd/{crd}.monitoring.coreos.com"), "--timeout=60s"]);
    }
    let k = "deploy/overlays/prometheus-operator";
    ok(&cp, &["apply", "--server-side", "--field-manager=gitops", "--validate=strict", "-k", &dir(k)]);
    ok(&cp, &["apply", "--validate=strict", "-k", &dir(k)]);
    let before = versions(&cp, k);
    let again = ok(&cp, &["apply", "-k", &dir(k)]);
    let changed: Vec<&str> = again.lines().filter(|l| !l.ends_with(" unchanged")).collect();
    assert!(changed.is_empty(), "{k}: a re-apply of the unchanged tree changed objects:\n{}", changed.join("\n"));
    assert_eq!(versions(&cp, k), before, "{k}: a re-apply changed resourceVersions");
    // The PodMonitor, the ServiceMonitor's alternative, on its own.
    let podmonitor = dir("deploy/prometheus/operator/podmonitor.yaml");
    ok(&cp, &["apply", "--server-side", "--field-manager=gitops", "--validate=strict", "-f", &podmonitor]);
    let built = ok(&cp, &["kustomize", &dir(k)]) + "\n---\n" + &std::fs::read_to_string(&podmonitor).expect("podmonitor.yaml");
    let mut checked = 0;
    for doc in built.split("\n---\n") {
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(doc).expect("yaml");
        if v["apiVersion"].as_str() != Some("monitoring.coreos.com/v1") {
            continue;
        }
        let (kind, name) = (v["kind"].as_str().unwrap_or_default().to_lowercase(), v["metadata"]["name"].as_str().unwrap_or_default());
        let ns = v["metadata"]["namespace"].as_str().unwrap_or("default");
        let held: serde_json::Value = serde_json::from_str(&ok(&cp, &["-n", ns, "get", &kind, name, "-o", "json"])).expect("json");
        let want: serde_json::Value = serde_json::to_value(&v["spec"]).expect("json");
        assert_eq!(held["spec"], want, "{kind}/{name}: the server did not keep the spec whole");
        checked += 1;
    }
    assert_eq!(checked, 3, "a ServiceMonitor, a PodMonitor and a PrometheusRule");
    // The negative control: the schema knows the fields, so a misspelt one
    // is refused.
    let typo = std::fs::read_to_string(dir("deploy/prometheus/operator/servicemonitor.yaml"))
        .expect("servicemonitor.yaml")
        .replace("name: node-agent\n", "name: typo\n")
        .replace("  endpoints:\n    - ", "  endpoints:\n    - scrapeIntervall: 30s\n      ");
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), &typo).expect("write");
    let out = cp.kubectl(&["apply", "--server-side", "--validate=strict", "-f", &file.path().display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("scrapeIntervall"), "a misspelt field was not refused:\n{typo}\n{err}");
    eprintln!("{k}: {checked} operator objects applied strictly and kept whole; re-applied: {} objects unchanged", again.lines().count());
}

#[test]
fn the_nodeagent_crd_validates_and_defaults_as_the_server_applies_it() {
    let Some(cp) = ControlPlane::start_or_skip("the NodeAgent CRD on a real API server") else { return };
    ok(&cp, &["apply", "-k", &dir("deploy/namespace")]);
    ok(&cp, &["apply", "-k", &dir("deploy/crd")]);
    ok(&cp, &["wait", "--for=condition=Established", "crd/nodeagents.nodeagent.io", "--timeout=60s"]);
    let sample = std::fs::read_to_string(root().join("deploy/controller/nodeagent.yaml")).expect("sample");
    ok(&cp, &["apply", "-f", &dir("deploy/controller/nodeagent.yaml")]);
    let got: serde_json::Value =
        serde_json::from_str(&ok(&cp, &["-n", "monitoring", "get", "nodeagent", "node-agent", "-o", "json"])).expect("json");
    let spec = &got["spec"];
    // What the sample leaves out, the server's defaulting fills in.
    assert!(!sample.contains("paused") && !sample.contains("minPrograms"), "the sample leaves these to the defaults");
    assert_eq!(spec["rollout"]["paused"], false, "{spec:#}");
    assert_eq!(spec["rollout"]["healthGate"]["minPrograms"], 1, "{spec:#}");
    // The sample's own values are kept.
    assert_eq!(spec["rollout"]["healthGate"]["autoRollback"], true, "{spec:#}");
    assert_eq!(spec["rollout"]["healthGate"]["port"], 9100, "{spec:#}");
    assert_eq!(spec["rollout"]["waves"][0]["name"], "canary", "{spec:#}");

    // A port out of range is refused, naming the field.
    assert!(sample.contains("port: 9100"), "the sample sets the gate's port");
    let bad = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(bad.path(), sample.replace("port: 9100", "port: 70000").replace("name: node-agent\n", "name: bad\n")).expect("write");
    let out = cp.kubectl(&["apply", "-f", &bad.path().display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("spec.rollout.healthGate.port"), "port 70000 was not refused by name: {err}");
}

/// `kubectl auth can-i --list` as `user`, in `namespace`: (resource, verb)
/// pairs, resource names left out (none of ours use them).
fn can_list(cp: &ControlPlane, user: &str, namespace: &str) -> BTreeSet<(String, String)> {
    let text = ok(cp, &["auth", "can-i", "--list", "--as", user, "-n", namespace]);
    let mut set = BTreeSet::new();
    for line in text.lines().skip(1) {
        // Resources   Non-Resource URLs   Resource Names   Verbs
        let (Some(open), Some(close)) = (line.rfind('['), line.rfind(']')) else { continue };
        let resource = line.split_whitespace().next().unwrap_or_default();
        if resource.starts_with('[') || resource.is_empty() {
            continue; // a non-resource URL row
        }
        for verb in line[open + 1..close].split_whitespace() {
            set.insert((resource.to_string(), verb.to_string()));
        }
    }
    set
}

#[test]
fn the_agents_rbac_is_least_privilege_and_enough_as_the_real_authorizer_sees_it() {
    let Some(cp) = ControlPlane::start_or_skip("the agent's RBAC on a real API server") else { return };
    ok(&cp, &["apply", "-k", &dir("deploy")]);
    // What any ServiceAccount may do with no binding of its own.
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "nobody"]);
    let baseline = can_list(&cp, "system:serviceaccount:monitoring:nobody", "monitoring");
    let agent = can_list(&cp, "system:serviceaccount:monitoring:node-agent", "monitoring");
    let extra: BTreeSet<_> = agent.difference(&baseline).cloned().collect();
    let want: BTreeSet<(String, String)> = ["pods", "services", "nodes"]
        .iter()
        .flat_map(|r| ["get", "list", "watch"].iter().map(move |v| (r.to_string(), v.to_string())))
        .collect();
    assert_eq!(extra, want, "the agent's ServiceAccount may do more or less than get/list/watch on pods, services and nodes");
    for (verb, what) in [("get", "secrets"), ("list", "configmaps"), ("create", "pods/exec"), ("delete", "pods"), ("patch", "nodes")] {
        let out = cp.kubectl(&["auth", "can-i", verb, what, "--all-namespaces", "--as", "system:serviceaccount:monitoring:node-agent"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no", "the agent may {verb} {what}");
    }

    // Enough: the agent itself, with a token the server issued for its
    // ServiceAccount, lists and watches the pods of its node and the
    // Services (ebpf_pods and ebpf_tcp_peers). A pod bound to the node is
    // created after it started and must be seen through the watch.
    if !node_agent_tests::host::root_or_skip("the agent's eBPF collectors") {
        return;
    }
    // The negative control first: with a ServiceAccount bound to nothing,
    // the agent is refused and says so (so the check below can fail).
    let nobody = WatchingAgent::start(&cp.token_kubeconfig("monitoring", "nobody").expect("a token for nobody"), "node-a", PEERS);
    nobody.until(Duration::from_secs(60), "the refusal logged", |a| a.log().to_lowercase().contains("forbidden"));
    assert_ne!(nobody.value("node_ebpf_pod_attribution_synced", &[]), 1.0, "listed pods without any binding");
    drop(nobody);

    let agent = WatchingAgent::start(&cp.token_kubeconfig("monitoring", "node-agent").expect("a token for node-agent"), "node-a", PEERS);
    agent.until(Duration::from_secs(60), "the pods of node-a listed", |a| a.value("node_ebpf_pod_attribution_synced", &[]) == 1.0);
    // ServiceAccount admission wants the namespace's default account,
    // which kube-controller-manager (not run here) would have made.
    ok(&cp, &["-n", "default", "create", "serviceaccount", "default"]);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: default\nspec:\n  nodeName: node-a\n  containers:\n  - name: c\n    image: example.invalid/none\n";
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), pod).expect("write");
    ok(&cp, &["apply", "-f", &file.path().display().to_string()]);
    agent.until(Duration::from_secs(60), "the pod bound to node-a seen through the watch", |a| {
        a.value("node_ebpf_pod_attribution_pods", &[]) >= 1.0
    });
    // Both watches (pods, Services) have run a while by now.
    std::thread::sleep(Duration::from_secs(2));
    let text = agent.log();
    assert!(!text.to_lowercase().contains("forbidden"), "the agent was refused something:\n{text}");
}

// ---- the NodeAgent controller against the real API server ---------------

/// A kube client from a kubeconfig file.
async fn kube_client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    kube::Client::try_from(cfg).expect("client")
}

/// What the kubelet does for the agent pods the scheduler bound, every
/// 100 ms (no kubelet runs here): a bound pod runs at 127.0.0.1 (an image
/// named `agent:bad` at 127.0.0.2, where no agent answers the health
/// gate; a DaemonSet's pod on n3 at 127.0.0.3, the takeover test's other
/// node_exporter), its containers ready at once, Ready when every readiness gate is
/// True (the health gate's condition, set by the controller); a pod being
/// deleted is gone at once (the kubelet confirms with a zero grace period).
fn kubelet(admin: kube::Client) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(admin, "monitoring");
        loop {
            for p in pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
                let name = p.metadata.name.clone().unwrap_or_default();
                if p.metadata.deletion_timestamp.is_some() {
                    let _ = pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await;
                    continue;
                }
                let Some(spec) = &p.spec else { continue };
                if spec.node_name.is_none() {
                    continue;
                }
                let conds = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                let is_true = |t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
                let ready = spec.readiness_gates.iter().flatten().all(|g| is_true(&g.condition_type));
                let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if running && is_true("Ready") == ready {
                    continue;
                }
                let now = node_agent_tests::apiserver::now();
                let bad = spec.containers.first().and_then(|c| c.image.as_deref()) == Some("agent:bad");
                let daemon_on_n3 =
                    spec.node_name.as_deref() == Some("n3") && p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet");
                let ip = if bad {
                    "127.0.0.2"
                } else if daemon_on_n3 {
                    "127.0.0.3"
                } else {
                    "127.0.0.1"
                };
                let patch = serde_json::json!({"status": {
                    "phase": "Running", "hostIP": "127.0.0.1", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now},
                    ],
                }});
                let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The rollout of `image` is complete on `nodes` nodes: the NodeAgent's
/// status and the pods agree, one Ready pod of `image` per node.
async fn complete(admin: &kube::Client, image: &str, nodes: usize) -> bool {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DynamicObject, ListParams};
    let gvk = kube::api::GroupVersionKind::gvk("nodeagent.io", "v1alpha1", "NodeAgent");
    let ar = kube::api::ApiResource::from_gvk(&gvk);
    let nas: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "monitoring", &ar);
    let Ok(na) = nas.get("e2e").await else { return false };
    let s = &na.data["status"];
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "monitoring");
    let items = pods.list(&ListParams::default().labels("nodeagent.io/name=e2e")).await.map(|l| l.items).unwrap_or_default();
    let ready = |p: &Pod| {
        p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let image_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default();
    let nodes_used: BTreeSet<String> = items.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    s["numberAvailable"] == nodes
        && s["updatedNumberScheduled"] == nodes
        && s["currentRevision"] == s["updateRevision"]
        && items.iter().filter(|p| image_of(p) == image && ready(p)).count() == nodes
        && items.len() == nodes
        && nodes_used.len() == nodes
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok())).unwrap_or(0.0)
}

fn scrape(addr: std::net::SocketAddr) -> String {
    node_agent_tests::compare::http_get(&format!("http://{addr}/metrics")).unwrap_or_default()
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port")
}

async fn wait_for(cp: &ControlPlane, what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}; the cluster:\n{}", state(cp));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster's state for a failure message: the agent pods, the
/// NodeAgent, the events, the scheduler's log.
fn state(cp: &ControlPlane) -> String {
    let show = |args: &[&str]| {
        let out = cp.kubectl(args);
        format!("$ kubectl {}\n{}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    [
        show(&["-n", "monitoring", "get", "pods", "-o", "wide"]),
        show(&["-n", "monitoring", "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions}{\"\\n\"}{end}"]),
        show(&["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "yaml"]),
        show(&["get", "events", "-A"]),
        show(&["get", "nodes", "-o", "yaml"]),
        format!("the scheduler's log:\n{}", cp.scheduler_log_tail()),
    ]
    .join("\n")
}

/// What the controller tests run against: the control plane with
/// kube-scheduler, deploy/'s CRD and controller RBAC, four Ready Node
/// objects (n2 the canary wave), the controller's token, a real agent for
/// the health gate (every pod's IP is 127.0.0.1 here, the gate's port this
/// agent's) and the test's NodeAgent `e2e` (agent:1, maxUnavailable 2, the
/// canary wave, the gate on loadavg and meminfo) in a file, not applied.
struct Bed {
    // The agent goes first, the control plane last.
    _agent: node_agent::agent::Agent,
    nodeagent: tempfile::NamedTempFile,
    sa: PathBuf,
    cp: ControlPlane,
}

const NODES: usize = 4;

impl Bed {
    fn start(what: &str, auto_rollback: bool) -> Option<Bed> {
        let mut cp = ControlPlane::start_or_skip(what)?;
        cp.start_scheduler().expect("kube-scheduler");
        ok(&cp, &["apply", "-k", &dir("deploy/crd")]);
        ok(&cp, &["wait", "--for=condition=Established", "crd/nodeagents.nodeagent.io", "--timeout=60s"]);
        ok(&cp, &["apply", "-k", &dir("deploy/overlays/controller")]);
        // The sample NodeAgent goes; the test's own follows. The namespace's
        // default ServiceAccount is what kube-controller-manager (not run
        // here) would have made.
        ok(&cp, &["-n", "monitoring", "delete", "nodeagent", "node-agent"]);
        ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "default"]);
        for i in 0..NODES {
            let labels: &[(&str, &str)] = if i == 2 { &[("nodeagent.io/wave", "canary")] } else { &[] };
            cp.node(&format!("n{i}"), labels).expect("node");
        }
        let sa = cp.token_kubeconfig("monitoring", "node-agent-controller").expect("the controller's token");
        let agent = node_agent_tests::gate::agent().expect("agent");
        let port = agent.addrs[0].port();
        let na = format!(
            "apiVersion: nodeagent.io/v1alpha1\nkind: NodeAgent\nmetadata:\n  name: e2e\n  namespace: monitoring\nspec:\n  selector:\n    matchLabels: {{app: e2e}}\n  template:\n    metadata:\n      labels: {{app: e2e}}\n    spec:\n      containers:\n      - {{name: agent, image: \"agent:1\"}}\n  updateStrategy:\n    rollingUpdate: {{maxUnavailable: 2}}\n  rollout:\n    waves:\n    - name: canary\n      selector:\n        matchLabels: {{nodeagent.io/wave: canary}}\n    healthGate: {{port: {port}, requiredCollectors: [loadavg, meminfo], deadlineSeconds: {deadline}, minPrograms: 0, autoRollback: {auto_rollback}}}\n",
            deadline = if auto_rollback { 8 } else { 60 },
        );
        let nodeagent = tempfile::NamedTempFile::new().expect("tempfile");
        std::fs::write(nodeagent.path(), na).expect("write");
        Some(Bed { _agent: agent, nodeagent, sa, cp })
    }
}

/// Two controller replicas, each authenticated as the controller's
/// ServiceAccount with deploy/'s RBAC, against the real API server (with
/// OwnerReferencesPermissionEnforcement) and the real scheduler binding
/// the pods to four Node objects: the install passes the health gate
/// through a real agent's /metrics, a new image goes to the canary node
/// first and never leaves more than maxUnavailable nodes without a Ready
/// agent, and when the leader stops the standby takes the lease and rolls
/// the next image out.
#[test]
fn the_controller_rolls_out_canary_first_and_fails_over_on_a_real_api_server() {
    let Some(bed) = Bed::start("the controller against a real API server", false) else { return };
    let (cp, sa, file) = (&bed.cp, &bed.sa, &bed.nodeagent);
    let patch_image = |image: &str| {
        let p = format!(r#"{{"spec":{{"template":{{"spec":{{"containers":[{{"name":"agent","image":"{image}"}}]}}}}}}}}"#);
        ok(cp, &["-n", "monitoring", "patch", "nodeagent", "e2e", "--type=merge", "-p", &p]);
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = kube_client(&cp.kubeconfig).await;
        let kubelet = kubelet(admin.clone());
        let (ma, mb) = (free_addr(), free_addr());
        let (stop_a, rx_a) = tokio::sync::oneshot::channel::<()>();
        let (stop_b, rx_b) = tokio::sync::oneshot::channel::<()>();
        let a = tokio::spawn(controller::run_until(kube_client(sa).await, replica("replica-a", ma), async move {
            let _ = rx_a.await;
        }));
        wait_for(cp, "replica-a to lead", 30, async || metric(&scrape(ma), "node_agent_controller_leader") == 1.0).await;
        let b = tokio::spawn(controller::run_until(kube_client(sa).await, replica("replica-b", mb), async move {
            let _ = rx_b.await;
        }));
        ok(cp, &["apply", "-f", &file.path().display().to_string()]);
        wait_for(cp, "the first install", 90, async || complete(&admin, "agent:1", NODES).await).await;
        let pods = ok(cp, &["-n", "monitoring", "get", "pods", "-l", "nodeagent.io/name=e2e", "-o", "json"]);
        let pods: serde_json::Value = serde_json::from_str(&pods).expect("json");
        for p in pods["items"].as_array().expect("pods") {
            let conds = p["status"]["conditions"].as_array().expect("conditions");
            assert!(conds.iter().any(|c| c["type"] == "nodeagent.io/health-gate" && c["status"] == "True"), "{p}");
        }
        ok(cp, &["get", "priorityclass", "node-agent-critical"]);
        assert_eq!(metric(&scrape(mb), "node_agent_controller_reconciles_total"), 0.0, "the standby never reconciles");

        // agent:2: the canary node (n2) first; never more than
        // maxUnavailable nodes without a Ready agent (polled).
        patch_image("agent:2");
        let mut order: Vec<String> = Vec::new();
        let mut worst = 0usize;
        wait_for(cp, "the agent:2 rollout", 120, async || {
            let out = cp.kubectl(&["-n", "monitoring", "get", "pods", "-l", "nodeagent.io/name=e2e", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let mut ready_nodes = BTreeSet::new();
            for p in v["items"].as_array().into_iter().flatten() {
                let node = p["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
                let ready =
                    p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                if ready && !node.is_empty() {
                    ready_nodes.insert(node.clone());
                }
                if p["spec"]["containers"][0]["image"] == "agent:2" && !node.is_empty() && !order.contains(&node) {
                    order.push(node);
                }
            }
            worst = worst.max(NODES - ready_nodes.len().min(NODES));
            complete(&admin, "agent:2", NODES).await
        })
        .await;
        assert_eq!(order.first().map(String::as_str), Some("n2"), "the canary first: {order:?}");
        assert!(worst <= 2, "at most maxUnavailable (2) nodes without a Ready agent, saw {worst}");

        // Failover.
        let _ = stop_a.send(());
        a.await.expect("join").expect("replica-a stops cleanly");
        wait_for(cp, "replica-b to lead", 20, async || metric(&scrape(mb), "node_agent_controller_leader") == 1.0).await;
        patch_image("agent:3");
        wait_for(cp, "the agent:3 rollout by replica-b", 120, async || complete(&admin, "agent:3", NODES).await).await;
        assert!(metric(&scrape(mb), "node_agent_controller_reconciles_total") > 0.0);
        let holder = ok(cp, &["-n", "monitoring", "get", "lease", "node-agent-controller", "-o", "jsonpath={.spec.holderIdentity}"]);
        assert_eq!(holder, "replica-b");
        let _ = stop_b.send(());
        b.await.expect("join").expect("replica-b stops cleanly");
        kubelet.abort();
    });
}

// ---- plan against the real DaemonSet controller ----------------------------

/// `plan` decides, node by node, where a DaemonSet runs exactly as the real
/// DaemonSet controller (kube-controller-manager v1.36.2, `--controllers
/// daemonset`) places its pods: the fixture cluster's nodes (a tainted
/// control plane, a NotReady worker, a GPU node, an SSD node in zone a, a
/// cordoned node, a NoExecute-dedicated node) made on the real server, and
/// deploy/'s DaemonSet, the GPU-only overlay's, the fixtures' and one with
/// no tolerations at all. The planner is given the nodes as the server
/// holds them (with what its admission added).
#[test]
fn plan_places_pods_on_the_nodes_the_real_daemonset_controller_does() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Node;
    use planner::{input, plan};
    let Some(mut cp) = ControlPlane::start_or_skip("plan against the real DaemonSet controller") else { return };
    cp.start_controller_manager("daemonset").expect("kube-controller-manager");
    ok(&cp, &["apply", "-k", &dir("deploy/namespace")]);
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "default"]);
    ok(&cp, &["apply", "-k", &dir("deploy/agent-rbac")]);
    let fixture = root().join("tests/fixtures/daemonset/nodes.yaml");
    let wanted: Vec<Node> = input::read(&fixture, "Node").expect("nodes");
    ok(&cp, &["apply", "-f", &fixture.display().to_string()]);
    for n in &wanted {
        let name = n.metadata.name.clone().unwrap_or_default();
        // Status goes through its subresource; the taint the server adds to
        // every new Node stays only where the fixture has it.
        if let Some(status) = &n.status {
            let p = serde_json::json!({"status": status}).to_string();
            ok(&cp, &["patch", "node", &name, "--subresource=status", "--type=merge", "-p", &p]);
        }
        let has = |effect: &str| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready" && t.effect == effect))
        };
        if !has("NoSchedule") {
            let _ = cp.kubectl(&["taint", "node", &name, "node.kubernetes.io/not-ready:NoSchedule-"]);
        }
    }
    let held = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(held.path(), ok(&cp, &["get", "nodes", "-o", "yaml"])).expect("write");
    let nodes: Vec<Node> = input::read(held.path(), "Node").expect("the server's nodes");
    assert_eq!(nodes.len(), wanted.len());

    let plain = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: plain, namespace: monitoring}\nspec:\n  selector: {matchLabels: {app: plain}}\n  template:\n    metadata: {labels: {app: plain}}\n    spec:\n      containers: [{name: c, image: \"plain:1\"}]\n";
    let plain_file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(plain_file.path(), plain).expect("write");
    let deploy_ds = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(deploy_ds.path(), ok(&cp, &["kustomize", &dir("deploy/agent")])).expect("write");
    let gpu_ds = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(gpu_ds.path(), ok(&cp, &["kustomize", &dir("deploy/overlays/gpu-only")])).expect("write");
    let cases: Vec<(&str, PathBuf)> = vec![
        ("deploy/", deploy_ds.path().to_path_buf()),
        ("deploy/overlays/gpu-only", gpu_ds.path().to_path_buf()),
        ("fixture gpu-only", root().join("tests/fixtures/daemonset/gpu-only.yaml")),
        ("fixture ssd-zone-a", root().join("tests/fixtures/daemonset/ssd-zone-a.yaml")),
        ("no tolerations", plain_file.path().to_path_buf()),
    ];
    for (what, file) in cases {
        let ds: DaemonSet = input::read::<DaemonSet>(&file, "DaemonSet").expect("daemonset").remove(0);
        let name = ds.metadata.name.clone().unwrap_or_default();
        let ns = ds.metadata.namespace.clone().unwrap_or_else(|| "monitoring".into());
        let planned = plan::plan(&ds, &nodes, &[], planner::builders::at(1_000), None).expect("plan");
        let want: BTreeSet<String> = planned.nodes.iter().filter(|n| n.should_run).map(|n| n.node.clone()).collect();
        // Only the DaemonSet: a kustomization's other objects are applied
        // too (the PriorityClass its pods name).
        ok(&cp, &["apply", "-f", &file.display().to_string()]);
        let t = Instant::now();
        let placed = loop {
            let out = ok(&cp, &["-n", &ns, "get", "pods", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_str(&out).expect("json");
            let placed: BTreeSet<String> = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["metadata"]["ownerReferences"][0]["name"] == name.as_str())
                .filter_map(|p| {
                    p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                        ["matchFields"][0]["values"][0]
                        .as_str()
                        .map(str::to_string)
                })
                .collect();
            let ds_status = ok(
                &cp,
                &["-n", &ns, "get", "daemonset", &name, "-o", "jsonpath={.status.observedGeneration} {.status.desiredNumberScheduled}"],
            );
            let settled = ds_status.split_whitespace().nth(1).and_then(|d| d.parse::<usize>().ok()) == Some(placed.len())
                && ds_status.starts_with('1');
            if settled && t.elapsed() > Duration::from_secs(2) {
                break placed;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{what}: the DaemonSet controller did not settle: {ds_status}, pods on {placed:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            placed, want,
            "{what}: the real DaemonSet controller placed pods on {placed:?}, plan says {want:?}: {:#?}",
            planned.nodes
        );
        eprintln!("{what}: plan and the DaemonSet controller agree on {} of {} nodes: {placed:?}", placed.len(), nodes.len());
        ok(&cp, &["-n", &ns, "delete", "daemonset", &name, "--cascade=background"]);
        ok(&cp, &["-n", &ns, "delete", "pods", "-l", &label_selector(&ds), "--grace-period=0", "--force"]);
    }
}

/// The DaemonSet's selector as a label selector string.
fn label_selector(ds: &k8s_openapi::api::apps::v1::DaemonSet) -> String {
    ds.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// The agent's pod watch across a restart of the real API server (as a
/// control-plane upgrade does): the watch breaks, the agent lists again
/// when the server is back, and the pods of its node it then knows are the
/// server's: two before, then one after both were deleted and another
/// made, then three. A 1 s grace period lets deleted pods go at once.
#[test]
fn the_pod_watch_follows_the_real_api_server_across_a_restart() {
    let Some(mut cp) = ControlPlane::start_or_skip("the pod watch across an API server restart") else { return };
    if !node_agent_tests::host::root_or_skip("the agent's eBPF collectors") {
        return;
    }
    ok(&cp, &["apply", "-k", &dir("deploy")]);
    ok(&cp, &["-n", "default", "create", "serviceaccount", "default"]);
    let kubeconfig = cp.token_kubeconfig("monitoring", "node-agent").expect("a token for node-agent");
    let agent = WatchingAgent::start(&kubeconfig, "node-a", &["--collector.ebpf_tcp_peers", "--collector.ebpf_pods.grace-period=1s"]);
    let files = tempfile::tempdir().expect("tempdir");
    let pods = |names: &[&str]| -> PathBuf {
        let text: String = names
            .iter()
            .map(|n| format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {n}\n  namespace: default\nspec:\n  nodeName: node-a\n  containers:\n  - name: c\n    image: example.invalid/none\n---\n"))
            .collect();
        let path = files.path().join(format!("{}.yaml", names.join("-")));
        std::fs::write(&path, text).expect("write");
        path
    };
    let known = |a: &WatchingAgent| a.value("node_ebpf_pod_attribution_pods", &[]);
    ok(&cp, &["apply", "-f", &pods(&["web-0", "web-1"]).display().to_string()]);
    agent.until(Duration::from_secs(60), "two pods known", |a| known(a) == 2.0);

    cp.restart_apiserver(Duration::from_secs(3)).expect("the API server back");
    ok(&cp, &["-n", "default", "delete", "pod", "web-0", "web-1", "--grace-period=0", "--force"]);
    ok(&cp, &["apply", "-f", &pods(&["web-2"]).display().to_string()]);
    agent.until(Duration::from_secs(60), "one pod known after the restart", |a| known(a) == 1.0);
    ok(&cp, &["apply", "-f", &pods(&["web-3", "web-4"]).display().to_string()]);
    agent.until(Duration::from_secs(60), "three pods known", |a| known(a) == 3.0);
    agent.until(Duration::from_secs(60), "the watch synced", |a| a.value("node_ebpf_pod_attribution_synced", &[]) == 1.0);
    let log = agent.log();
    eprintln!("the agent's log across the restart:\n{log}");
}

/// A new image whose pods fail the health gate (nothing answers at their
/// IP) on the real API server, with autoRollback: the canary's gate times
/// out, the rollout halts (RolloutHalted, an event), the template goes
/// back to the previous image, and the status's counts agree with the pods
/// once every node runs the previous image again; no node but the canary
/// ever ran the bad image.
#[test]
fn a_failing_gate_halts_and_rolls_back_on_a_real_api_server() {
    let Some(bed) = Bed::start("the controller's halt and rollback against a real API server", true) else { return };
    let (cp, sa) = (&bed.cp, &bed.sa);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = kube_client(&cp.kubeconfig).await;
        let kubelet = kubelet(admin.clone());
        let m = free_addr();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let c = tokio::spawn(controller::run_until(kube_client(sa).await, replica("replica-a", m), async move {
            let _ = rx.await;
        }));
        ok(cp, &["apply", "-f", &bed.nodeagent.path().display().to_string()]);
        wait_for(cp, "the first install", 90, async || complete(&admin, "agent:1", NODES).await).await;

        let p = r#"{"spec":{"template":{"spec":{"containers":[{"name":"agent","image":"agent:bad"}]}}}}"#;
        ok(cp, &["-n", "monitoring", "patch", "nodeagent", "e2e", "--type=merge", "-p", p]);
        let mut bad_nodes = BTreeSet::new();
        let halted = async || {
            let out = cp.kubectl(&["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            v["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "RolloutHalted" && c["status"] == "True"))
        };
        wait_for(cp, "the halt and the rollback", 120, async || {
            let out = cp.kubectl(&["-n", "monitoring", "get", "pods", "-l", "nodeagent.io/name=e2e", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            for p in v["items"].as_array().into_iter().flatten() {
                if p["spec"]["containers"][0]["image"] == "agent:bad" {
                    bad_nodes.insert(p["spec"]["nodeName"].as_str().unwrap_or("(unbound)").to_string());
                }
            }
            halted().await && complete(&admin, "agent:1", NODES).await
        })
        .await;
        let na: serde_json::Value =
            serde_json::from_str(&ok(cp, &["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "json"])).expect("json");
        assert_eq!(na["spec"]["template"]["spec"]["containers"][0]["image"], "agent:1", "the template went back: {na:#}");
        assert!(bad_nodes.iter().all(|n| n == "n2" || n == "(unbound)"), "only the canary ran the bad image: {bad_nodes:?}");
        let events = ok(cp, &["-n", "monitoring", "get", "events", "-o", "json"]);
        assert!(events.contains("RolloutHalted"), "no RolloutHalted event: {events}");
        assert!(metric(&scrape(m), "node_agent_controller_rollout_halts_total") >= 1.0, "{}", scrape(m));
        let _ = stop.send(());
        c.await.expect("join").expect("the controller stops cleanly");
        kubelet.abort();
    });
}

/// A running replica: how to stop it, and its task.
type Replica = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), controller::Error>>);

/// Controller replicas taking turns: each step of a test starts a new one
/// and stops the one before (it gives its lease up, as on SIGTERM), so a
/// new leader decides every step from the real API server's state alone.
struct Leaders {
    sa: PathBuf,
    n: usize,
    current: Option<Replica>,
}

impl Leaders {
    /// A new leader: the next replica started, the previous one stopped,
    /// the new one leading (its metric and the Lease's holder).
    async fn next(&mut self, cp: &ControlPlane) {
        let metrics = free_addr();
        let identity = format!("replica-{}", self.n);
        self.n += 1;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run_until(kube_client(&self.sa).await, replica(&identity, metrics), async move {
            let _ = rx.await;
        }));
        if let Some((stop, old)) = self.current.replace((tx, task)) {
            let _ = stop.send(());
            old.await.expect("join").expect("the previous replica stops cleanly");
        }
        wait_for(cp, &format!("{identity} to lead"), 30, async || metric(&scrape(metrics), "node_agent_controller_leader") == 1.0).await;
        let holder = ok(cp, &["-n", "monitoring", "get", "lease", "node-agent-controller", "-o", "jsonpath={.spec.holderIdentity}"]);
        assert_eq!(holder, identity);
    }

    async fn stop(&mut self) {
        if let Some((stop, old)) = self.current.take() {
            let _ = stop.send(());
            old.await.expect("join").expect("the replica stops cleanly");
        }
    }
}

/// The NodeAgent `e2e`'s pods by node: (image, Ready), pods being deleted
/// left out.
fn images_by_node(cp: &ControlPlane) -> std::collections::BTreeMap<String, (String, bool)> {
    let out = cp.kubectl(&["-n", "monitoring", "get", "pods", "-l", "nodeagent.io/name=e2e", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut by = std::collections::BTreeMap::new();
    for p in v["items"].as_array().into_iter().flatten() {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
        let image = p["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
        let ready = p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        if !node.is_empty() {
            by.insert(node, (image, ready));
        }
    }
    by
}

fn expect_images(cp: &ControlPlane, want: &[(&str, &str)]) -> bool {
    let by = images_by_node(cp);
    by.len() == want.len() && want.iter().all(|(node, image)| by.get(*node).is_some_and(|(i, ready)| i == image && *ready))
}

/// `node-agent rollout SUB e2e -n monitoring` as cluster-admin.
fn rollout(cp: &ControlPlane, sub: &str) -> String {
    let out = std::process::Command::new(node_agent_tests::agent_binary())
        .args(["rollout", sub, "e2e", "-n", "monitoring"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .expect("node-agent runs");
    assert!(out.status.success(), "node-agent rollout {sub}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rollout's controls on the real API server, with a new controller
/// leader before every step (the previous one stopped): a partition keeps
/// the last nodes in rollout order (the canary wave's n2, then n0, n1, n3)
/// on the old revision and holds across the change; a pause replaces
/// nothing; `rollout resume` completes it; `rollout undo` puts the
/// previous template back and rolls it out; the revision history keeps
/// `revisionHistoryLimit` old revisions; a gate failing without
/// autoRollback halts the canary alone, visibly (`rollout status` exits 1),
/// and `rollout undo` recovers; deleting the NodeAgent lets
/// kube-controller-manager's garbage collector delete its pods and
/// revisions (the controller's owner references, as the real collector
/// reads them).
#[test]
fn partition_pause_undo_history_halt_and_garbage_collection_hold_across_leader_changes_on_a_real_api_server() {
    let Some(mut bed) = Bed::start("the rollout controls against a real API server", false) else { return };
    bed.cp.start_controller_manager("garbage-collector-controller").expect("kube-controller-manager");
    let (cp, file) = (&bed.cp, &bed.nodeagent);
    let patch = |p: &str| {
        ok(cp, &["-n", "monitoring", "patch", "nodeagent", "e2e", "--type=merge", "-p", p]);
    };
    let image = |i: &str| format!(r#"{{"spec":{{"template":{{"spec":{{"containers":[{{"name":"agent","image":"{i}"}}]}}}}}}}}"#);
    let all = |i: &'static str| -> Vec<(&'static str, &'static str)> { vec![("n0", i), ("n1", i), ("n2", i), ("n3", i)] };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = kube_client(&cp.kubeconfig).await;
        let kubelet = kubelet(admin.clone());
        let mut leaders = Leaders { sa: bed.sa.clone(), n: 0, current: None };
        leaders.next(cp).await;
        ok(cp, &["apply", "-f", &file.path().display().to_string()]);
        patch(r#"{"spec":{"revisionHistoryLimit":2}}"#);
        wait_for(cp, "the install", 90, async || complete(&admin, "agent:1", NODES).await).await;

        // A partition of 2 with agent:2: n2 (canary) and n0 move, n1 and n3 stay.
        leaders.next(cp).await;
        patch(r#"{"spec":{"rollout":{"partition":2},"template":{"spec":{"containers":[{"name":"agent","image":"agent:2"}]}}}}"#);
        let split = [("n0", "agent:2"), ("n1", "agent:1"), ("n2", "agent:2"), ("n3", "agent:1")];
        wait_for(cp, "the partitioned rollout", 90, async || expect_images(cp, &split)).await;
        leaders.next(cp).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(expect_images(cp, &split), "a new leader kept the partition: {:?}", images_by_node(cp));
        let updated = ok(cp, &["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "jsonpath={.status.updatedNumberScheduled}"]);
        assert_eq!(updated, "2", "the status counts the partitioned rollout");

        // Paused, with the partition lifted: nothing is replaced.
        leaders.next(cp).await;
        assert!(rollout(cp, "pause").contains("paused"));
        patch(r#"{"spec":{"rollout":{"partition":0}}}"#);
        leaders.next(cp).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(expect_images(cp, &split), "a paused rollout replaced a pod: {:?}", images_by_node(cp));
        let reason = ok(
            cp,
            &["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "jsonpath={.status.conditions[?(@.type==\"Progressing\")].reason}"],
        );
        assert_eq!(reason, "RolloutPaused");

        // Resumed: complete.
        leaders.next(cp).await;
        assert!(rollout(cp, "resume").contains("resumed"));
        wait_for(cp, "the resumed rollout", 90, async || complete(&admin, "agent:2", NODES).await).await;

        // Undo: agent:1's template back, rolled out.
        leaders.next(cp).await;
        assert!(rollout(cp, "undo").contains("rolled back to revision"));
        wait_for(cp, "the undo", 90, async || complete(&admin, "agent:1", NODES).await && expect_images(cp, &all("agent:1"))).await;

        // Two more images: the history keeps the limit's 2 old revisions
        // beside the current one.
        for i in ["agent:3", "agent:4"] {
            leaders.next(cp).await;
            patch(&image(i));
            wait_for(cp, &format!("the {i} rollout"), 90, async || complete(&admin, i, NODES).await).await;
        }
        let revisions = |cp: &ControlPlane| -> usize {
            let names = ok(cp, &["-n", "monitoring", "get", "controllerrevisions", "-l", "nodeagent.io/name=e2e", "-o", "name"]);
            names.lines().count()
        };
        wait_for(cp, "the history pruned to the limit", 30, async || revisions(cp) == 3).await;

        // A bad image, the gate without autoRollback: the canary (n2)
        // halts within the deadline and nothing else moves, across a new
        // leader; `rollout status` exits 1; `rollout undo` rolls agent:4
        // back to the canary, which lifts the halt.
        leaders.next(cp).await;
        patch(r#"{"spec":{"rollout":{"healthGate":{"deadlineSeconds":8}},"template":{"spec":{"containers":[{"name":"agent","image":"agent:bad"}]}}}}"#);
        let halted = || {
            let out = cp.kubectl(&["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            v["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "RolloutHalted" && c["status"] == "True"))
        };
        wait_for(cp, "the halt", 60, async || halted()).await;
        leaders.next(cp).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let by = images_by_node(cp);
        assert_eq!(by.get("n2").map(|(i, _)| i.as_str()), Some("agent:bad"), "the canary ran the bad image: {by:?}");
        for n in ["n0", "n1", "n3"] {
            assert_eq!(by.get(n), Some(&("agent:4".to_string(), true)), "a halted rollout moved {n}: {by:?}");
        }
        assert!(halted(), "the halt stays reported under a new leader");
        let status = std::process::Command::new(node_agent_tests::agent_binary())
            .args(["rollout", "status", "e2e", "-n", "monitoring", "--watch=false"])
            .env("KUBECONFIG", &cp.kubeconfig)
            .output()
            .expect("node-agent runs");
        assert_eq!(status.status.code(), Some(1), "rollout status of a halted rollout: {}", String::from_utf8_lossy(&status.stdout));
        assert!(rollout(cp, "undo").contains("rolled back to revision"));
        wait_for(cp, "agent:4 back on the canary, the halt lifted", 90, async || {
            complete(&admin, "agent:4", NODES).await && !halted()
        })
        .await;

        // The NodeAgent deleted: the garbage collector deletes what it owned.
        leaders.stop().await;
        ok(cp, &["-n", "monitoring", "delete", "nodeagent", "e2e", "--wait=false"]);
        wait_for(cp, "the garbage collector to delete the pods and revisions", 60, async || {
            images_by_node(cp).is_empty() && revisions(cp) == 0
        })
        .await;
        kubelet.abort();
    });
}

/// Pods by node: node → (pod UID, its controller's name).
type ByNode = std::collections::BTreeMap<String, (String, String)>;

/// The pods `selector` selects in `monitoring` by the node their affinity
/// pins them to (else the node they are bound to).
fn daemon_pods(cp: &ControlPlane, selector: &str) -> ByNode {
    let out = ok(cp, &["-n", "monitoring", "get", "pods", "-l", selector, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let mut by = std::collections::BTreeMap::new();
    for p in v["items"].as_array().into_iter().flatten() {
        if !p["metadata"]["deletionTimestamp"].is_null() {
            continue;
        }
        let node = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchFields"][0]["values"][0]
            .as_str()
            .or(p["spec"]["nodeName"].as_str())
            .unwrap_or_default()
            .to_string();
        let owner = p["metadata"]["ownerReferences"][0]["name"].as_str().unwrap_or_default().to_string();
        by.insert(node, (p["metadata"]["uid"].as_str().unwrap_or_default().to_string(), owner));
    }
    by
}

/// What taking a node over from a node_exporter DaemonSet (issue #50)
/// relies on, as kube-controller-manager's DaemonSet controller does it:
/// a DaemonSet switched to `OnDelete` and given a required node-affinity
/// term excluding a label keeps every pod it has (the same UIDs: no
/// rolling restart of the fleet for the template change); labelling one
/// node removes that node's pod alone and the controller does not make it
/// again; a pod with the DaemonSet's labels that another controller owns
/// is neither adopted nor counted there; removing the label brings the
/// DaemonSet's pod back on that node.
#[test]
fn the_daemonset_controller_gives_up_one_node_of_an_on_delete_daemonset_and_adopts_no_owned_pod() {
    let Some(mut cp) = ControlPlane::start_or_skip("the DaemonSet controller's semantics for a takeover") else { return };
    cp.start_controller_manager("daemonset").expect("kube-controller-manager");
    // Bound pods, as on a real cluster: the controller finds a node's
    // daemon pods by the node they are bound to when a node changes.
    cp.start_scheduler().expect("kube-scheduler");
    ok(&cp, &["apply", "-k", &dir("deploy/namespace")]);
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "default"]);
    for n in ["n0", "n1", "n2"] {
        cp.node(n, &[]).expect("node");
    }
    // node_exporter as the Helm chart renders it, in short: a RollingUpdate
    // DaemonSet on the host network and port 9100.
    let ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: node-exporter, namespace: monitoring}\nspec:\n  selector: {matchLabels: {app.kubernetes.io/name: prometheus-node-exporter}}\n  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}\n  template:\n    metadata: {labels: {app.kubernetes.io/name: prometheus-node-exporter}}\n    spec:\n      hostNetwork: true\n      containers: [{name: node-exporter, image: \"quay.io/prometheus/node-exporter:v1.12.1\", ports: [{name: metrics, containerPort: 9100, hostPort: 9100}]}]\n";
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), ds).expect("write");
    ok(&cp, &["apply", "-f", &file.path().display().to_string()]);
    let selector = "app.kubernetes.io/name=prometheus-node-exporter";
    let settle = |what: &str, f: &dyn Fn(&ByNode) -> bool| {
        let t = Instant::now();
        loop {
            // No kubelet runs: a deleted pod's end is confirmed here, as a
            // kubelet would once its containers stopped.
            let terminating = ok(
                &cp,
                &[
                    "-n",
                    "monitoring",
                    "get",
                    "pods",
                    "-l",
                    selector,
                    "-o",
                    "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}",
                ],
            );
            for name in terminating.split_whitespace() {
                let _ = cp.kubectl(&["-n", "monitoring", "delete", "pod", name, "--grace-period=0", "--force"]);
            }
            let pods = daemon_pods(&cp, selector);
            if f(&pods) {
                return pods;
            }
            if t.elapsed() > Duration::from_secs(60) {
                let ds = cp.kubectl(&["-n", "monitoring", "get", "daemonset", "node-exporter", "-o", "yaml"]);
                let nodes = cp.kubectl(&["get", "nodes", "--show-labels"]);
                panic!(
                    "{what}: {pods:?}\n{}\n{}\n{}",
                    String::from_utf8_lossy(&ds.stdout),
                    String::from_utf8_lossy(&nodes.stdout),
                    cp.component_log_tail("kube-controller-manager")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let before = settle("a pod per node", &|p| p.len() == 3);

    // OnDelete, then the exclusion term: nothing restarts.
    let strategy = r#"{"spec":{"updateStrategy":{"type":"OnDelete","rollingUpdate":null}}}"#;
    ok(&cp, &["-n", "monitoring", "patch", "daemonset", "node-exporter", "--type=merge", "-p", strategy]);
    let exclude = r#"[{"op":"add","path":"/spec/template/spec/affinity","value":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"nodeagent.io/exporter","operator":"NotIn","values":["node-agent"]}]}]}}}}]"#;
    ok(&cp, &["-n", "monitoring", "patch", "daemonset", "node-exporter", "--type=json", "-p", exclude]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(daemon_pods(&cp, selector), before, "the template change restarted pods of an OnDelete DaemonSet");

    // One node taken over: its pod alone goes, and stays gone.
    ok(&cp, &["label", "node", "n1", "nodeagent.io/exporter=node-agent"]);
    let after = settle("n1's pod gone", &|p| !p.contains_key("n1"));
    std::thread::sleep(Duration::from_secs(3));
    let after_wait = daemon_pods(&cp, selector);
    assert_eq!(after_wait, after, "the controller made a pod again on the excluded node");
    for n in ["n0", "n2"] {
        assert_eq!(after.get(n), before.get(n), "{n}'s pod was replaced");
    }

    // A pod with the DaemonSet's labels, owned by another controller, on n1:
    // not adopted, not deleted, and no pod of the DaemonSet's beside it.
    ok(&cp, &["-n", "monitoring", "create", "configmap", "owner"]);
    let owner_uid = ok(&cp, &["-n", "monitoring", "get", "configmap", "owner", "-o", "jsonpath={.metadata.uid}"]);
    let owned = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: agent-n1\n  namespace: monitoring\n  labels: {{app.kubernetes.io/name: prometheus-node-exporter}}\n  ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: owner, uid: {owner_uid}, controller: true}}]\nspec:\n  nodeName: n1\n  containers: [{{name: agent, image: \"agent:1\"}}]\n"
    );
    std::fs::write(file.path(), owned).expect("write");
    ok(&cp, &["apply", "-f", &file.path().display().to_string()]);
    std::thread::sleep(Duration::from_secs(3));
    let with_owned = daemon_pods(&cp, selector);
    assert_eq!(with_owned.get("n1").map(|(_, o)| o.as_str()), Some("owner"), "the owned pod was adopted or deleted: {with_owned:?}");
    assert_eq!(with_owned.len(), 3, "the DaemonSet made a pod beside the owned one: {with_owned:?}");
    let status = ok(&cp, &["-n", "monitoring", "get", "daemonset", "node-exporter", "-o", "jsonpath={.status.desiredNumberScheduled}"]);
    assert_eq!(status, "2", "the excluded node is not the DaemonSet's");

    // Given back: the DaemonSet's pod returns to n1.
    ok(&cp, &["-n", "monitoring", "delete", "pod", "agent-n1", "--grace-period=0", "--force"]);
    ok(&cp, &["label", "node", "n1", "nodeagent.io/exporter-"]);
    let back = settle("n1's pod back", &|p| p.get("n1").is_some_and(|(_, o)| o == "node-exporter"));
    for n in ["n0", "n2"] {
        assert_eq!(back.get(n), before.get(n), "{n}'s pod was replaced when n1 was given back");
    }
}

// ---- taking over node_exporter's DaemonSet (#50) ----------------------------

/// A node_exporter (Debian's) on `ip:port` with `collectors`, stopped on drop.
struct NodeExporter(std::process::Child);

impl NodeExporter {
    fn start(ip: &str, port: u16, collectors: &[&str]) -> NodeExporter {
        let mut args = vec!["--collector.disable-defaults".to_string(), format!("--web.listen-address={ip}:{port}")];
        args.extend(collectors.iter().map(|c| format!("--collector.{c}")));
        let child = std::process::Command::new("prometheus-node-exporter")
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus-node-exporter (Debian's package; cargo xtask test installs it)");
        let t = Instant::now();
        while std::net::TcpStream::connect((ip, port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "node_exporter on {ip}:{port} did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        NodeExporter(child)
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every exporter pod (the replaced DaemonSet's and the NodeAgent's) by
/// the node it is bound to, terminating ones included: (owner kind, Ready).
fn exporters_by_node(pods: &[k8s_openapi::api::core::v1::Pod]) -> std::collections::BTreeMap<String, Vec<(String, bool)>> {
    let mut by: std::collections::BTreeMap<String, Vec<(String, bool)>> = std::collections::BTreeMap::new();
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
        let kind = p.metadata.owner_references.iter().flatten().next().map(|o| o.kind.clone()).unwrap_or_default();
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        by.entry(node).or_default().push((kind, ready));
    }
    by
}

async fn monitoring_pods(admin: &kube::Client) -> Option<Vec<k8s_openapi::api::core::v1::Pod>> {
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(admin.clone(), "monitoring");
    api.list(&Default::default()).await.ok().map(|l| l.items)
}

/// What a migration is judged by, polled every 100 ms for the whole test
/// (a task of its own): no node ever has two exporter pods (bound,
/// terminating included: both use hostPort 9100), the longest time each
/// node had no Ready exporter (a Service's endpoints, and so Prometheus,
/// see Ready pods only), and the order in which nodes got the agent.
#[derive(Default)]
struct Watch {
    worst_pods: usize,
    gap_since: std::collections::BTreeMap<String, Instant>,
    longest_gap: std::collections::BTreeMap<String, Duration>,
    agent_order: Vec<String>,
}

impl Watch {
    fn spawn(admin: kube::Client, nodes: usize) -> (std::sync::Arc<std::sync::Mutex<Watch>>, tokio::task::JoinHandle<()>) {
        let watch = std::sync::Arc::new(std::sync::Mutex::new(Watch::default()));
        let w = watch.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Some(pods) = monitoring_pods(&admin).await {
                    let by = exporters_by_node(&pods);
                    if let Ok(mut w) = w.lock() {
                        w.look(&by, nodes);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (watch, task)
    }

    fn look(&mut self, by: &std::collections::BTreeMap<String, Vec<(String, bool)>>, nodes: usize) {
        for n in 0..nodes {
            let node = format!("n{n}");
            let pods = by.get(&node).cloned().unwrap_or_default();
            self.worst_pods = self.worst_pods.max(pods.len());
            if pods.iter().any(|(kind, _)| kind == "NodeAgent") && !self.agent_order.contains(&node) {
                self.agent_order.push(node.clone());
            }
            if pods.iter().any(|(_, ready)| *ready) {
                if let Some(since) = self.gap_since.remove(&node) {
                    let longest = self.longest_gap.entry(node).or_default();
                    *longest = (*longest).max(since.elapsed());
                }
            } else {
                self.gap_since.entry(node).or_insert_with(Instant::now);
            }
        }
    }
}

/// `node-agent rollout status e2e --watch=false` as cluster-admin: (exit code, output).
fn rollout_status(cp: &ControlPlane) -> (i32, String) {
    let out = std::process::Command::new(node_agent_tests::agent_binary())
        .args(["rollout", "status", "e2e", "-n", "monitoring", "--watch=false"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .expect("node-agent runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Issue #50 on the real API server, kube-scheduler and
/// kube-controller-manager's DaemonSet controller, with deploy/'s
/// takeover RBAC (overlays/takeover) and a new controller leader for each
/// phase: the Helm chart's node_exporter DaemonSet (its shape, on five
/// nodes) is taken over node by node — the canary wave first, one node at
/// a time, the partition's last node (n4) kept — each node's old exporter
/// read first (a real node_exporter, Debian's) and the agent's gate
/// requiring its families there; no node ever has two exporter pods, no
/// node that moves is without a Ready exporter for a scrape interval, and
/// the agent's pods carry the old pods' labels without being adopted. On
/// n3 the old exporter serves a family the agent does not (uname): n3's
/// gate fails past its deadline, n3 goes back to node_exporter alone, and
/// the takeover halts visibly (status, event, `rollout status` exit 1).
/// `giveBack` then returns every node, and the DaemonSet's spec is put
/// back exactly as it was; n4's pod, never moved, is never restarted.
#[test]
fn a_node_exporter_daemonset_is_taken_over_node_by_node_and_given_back_on_a_real_cluster() {
    let Some(mut cp) = ControlPlane::start_or_skip("the takeover of node_exporter against a real control plane") else { return };
    cp.start_scheduler().expect("kube-scheduler");
    cp.start_controller_manager("daemonset").expect("kube-controller-manager");
    ok(&cp, &["apply", "-k", &dir("deploy/crd")]);
    ok(&cp, &["wait", "--for=condition=Established", "crd/nodeagents.nodeagent.io", "--timeout=60s"]);
    ok(&cp, &["apply", "-k", &dir("deploy/overlays/takeover")]);
    ok(&cp, &["-n", "monitoring", "delete", "nodeagent", "node-agent"]);
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "default"]);
    const TAKEOVER_NODES: usize = 5;
    for i in 0..TAKEOVER_NODES {
        // The chart's DaemonSet selects kubernetes.io/os=linux.
        let labels: &[(&str, &str)] =
            if i == 2 { &[("kubernetes.io/os", "linux"), ("nodeagent.io/wave", "canary")] } else { &[("kubernetes.io/os", "linux")] };
        cp.node(&format!("n{i}"), labels).expect("node");
    }
    let sa = cp.token_kubeconfig("monitoring", "node-agent-controller").expect("the controller's token");
    // The old exporter: node_exporter on 127.0.0.1 for n0..n2; on n3
    // (127.0.0.3, see `kubelet`) it serves uname too.
    let port = free_addr().port();
    let _ne = NodeExporter::start("127.0.0.1", port, &["loadavg", "meminfo"]);
    let _ne3 = NodeExporter::start("127.0.0.3", port, &["loadavg", "meminfo", "uname"]);
    let agent = node_agent_tests::gate::agent().expect("agent");
    let gate_port = agent.addrs[0].port();

    // node_exporter as the prometheus-community chart renders it (with its
    // ServiceAccount, which the chart renders too).
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "prometheus-node-exporter"]);
    ok(&cp, &["apply", "-f", &dir("tests/fixtures/takeover/helm-daemonset.yaml")]);
    let spec_before = ok(&cp, &["-n", "monitoring", "get", "daemonset", "prometheus-node-exporter", "-o", "jsonpath={.spec}"]);
    let selector = "app.kubernetes.io/name=prometheus-node-exporter";
    let na = format!(
        "apiVersion: nodeagent.io/v1alpha1\nkind: NodeAgent\nmetadata:\n  name: e2e\n  namespace: monitoring\nspec:\n  selector:\n    matchLabels: {{app: e2e}}\n  template:\n    metadata:\n      labels: {{app: e2e}}\n    spec:\n      hostNetwork: true\n      containers:\n      - {{name: agent, image: \"agent:1\", ports: [{{name: metrics, containerPort: 9100, hostPort: 9100}}]}}\n  updateStrategy:\n    rollingUpdate: {{maxUnavailable: 1}}\n  replaces: {{namespace: monitoring, name: prometheus-node-exporter, port: {port}}}\n  rollout:\n    partition: 1\n    waves:\n    - name: canary\n      selector:\n        matchLabels: {{nodeagent.io/wave: canary}}\n    healthGate: {{port: {gate_port}, requiredCollectors: [loadavg, meminfo], deadlineSeconds: 8, minPrograms: 0}}\n"
    );
    let na_file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(na_file.path(), na).expect("write");

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = kube_client(&cp.kubeconfig).await;
        let kubelet = kubelet(admin.clone());
        let cp = &cp;
        let ready_old = async || {
            let by = exporters_by_node(&monitoring_pods(&admin).await.unwrap_or_default());
            (0..TAKEOVER_NODES).all(|n| by.get(&format!("n{n}")).is_some_and(|p| p.len() == 1 && p[0].0 == "DaemonSet" && p[0].1))
        };
        wait_for(cp, "node_exporter on every node", 60, ready_old).await;
        let before = daemon_pods(cp, selector);

        let mut leaders = Leaders { sa: sa.clone(), n: 0, current: None };
        leaders.next(cp).await;
        ok(cp, &["apply", "-f", &na_file.path().display().to_string()]);
        let (watch, watcher) = Watch::spawn(admin.clone(), TAKEOVER_NODES);
        let agent_order = || watch.lock().map(|w| w.agent_order.clone()).unwrap_or_default();
        let status = |cp: &ControlPlane| -> serde_json::Value {
            serde_json::from_str(&ok(cp, &["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "json"])).unwrap_or_default()
        };
        // The canary node first; then a new leader carries on.
        wait_for(cp, "the canary node taken over", 60, async || status(cp)["status"]["migration"]["nodeAgentNodes"] == 1).await;
        assert_eq!(agent_order(), vec!["n2".to_string()], "the canary wave first");
        leaders.next(cp).await;
        let halted = async |cp: &ControlPlane| {
            status(cp)["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter().any(|c| c["type"] == "RolloutHalted" && c["status"] == "True" && c["reason"] == "MigrationGateFailed")
            })
        };
        wait_for(cp, "n0 and n1 taken over, n3's gate failed and n3 given back, n4 kept", 120, async || {
            let s = status(cp);
            let n3 = exporters_by_node(&monitoring_pods(&admin).await.unwrap_or_default()).get("n3").cloned();
            let n3_old = n3.is_some_and(|p| p.len() == 1 && p[0].0 == "DaemonSet" && p[0].1);
            halted(cp).await && s["status"]["migration"]["nodeAgentNodes"] == 3 && s["status"]["migration"]["movingNodes"] == 0 && n3_old
        })
        .await;
        assert_eq!(agent_order(), ["n2", "n0", "n1", "n3"].map(String::from).to_vec(), "one node at a time in rollout order");
        {
            let w = watch.lock().expect("watch");
            assert_eq!(w.worst_pods, 1, "a node had two exporter pods at once");
            for n in ["n0", "n1", "n2"] {
                let gap = w.longest_gap.get(n).copied().unwrap_or_default();
                assert!(gap <= Duration::from_secs(15), "{n} had no Ready exporter for {gap:?}, longer than a 15 s scrape interval");
            }
            eprintln!("takeover: the longest time without a Ready exporter, by node: {:?}", w.longest_gap);
        }
        let s = status(cp);
        let message = s["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "RolloutHalted")).cloned();
        let message = message.map(|c| c["message"].to_string()).unwrap_or_default();
        assert!(message.contains("node n3") && message.contains("node_uname_info"), "{message}");
        assert_eq!(s["status"]["migration"]["haltedNode"], "n3");
        let (code, out) = rollout_status(cp);
        assert_eq!(code, 1, "rollout status exits 1 on a halted takeover: {out}");
        assert!(out.contains("takeover halted: node n3"), "{out}");
        let events = ok(cp, &["-n", "monitoring", "get", "events", "-o", "json"]);
        assert!(events.contains("MigrationNodeTaken") && events.contains("RolloutHalted"), "{events}");

        // What the migrated nodes hold: the old exporter's families (not its
        // own), the agent's pods with the old pods' labels, owned by the
        // NodeAgent; the DaemonSet's pods on n3 alone.
        let families = ok(cp, &["get", "node", "n0", "-o", "jsonpath={.metadata.annotations.nodeagent\\.io/exporter-families}"]);
        assert!(families.contains("node_load1") && families.contains("node_memory_MemTotal_bytes"), "{families}");
        assert!(!families.contains("go_") && !families.contains("process_"), "{families}");
        let agent_pods: serde_json::Value =
            serde_json::from_str(&ok(cp, &["-n", "monitoring", "get", "pods", "-l", "nodeagent.io/name=e2e", "-o", "json"])).expect("json");
        for p in agent_pods["items"].as_array().expect("pods") {
            assert_eq!(p["metadata"]["labels"]["app.kubernetes.io/instance"], "prometheus-node-exporter", "{p}");
            assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "NodeAgent", "{p}");
        }
        let desired = ok(
            cp,
            &["-n", "monitoring", "get", "daemonset", "prometheus-node-exporter", "-o", "jsonpath={.status.desiredNumberScheduled}"],
        );
        assert_eq!(desired, "2", "the DaemonSet keeps n3 and n4 alone");
        assert_eq!(s["status"]["migration"]["oldExporterNodes"], 2, "{s:#}");

        // Give every node back.
        if let Ok(mut w) = watch.lock() {
            w.longest_gap.clear();
        }
        leaders.next(cp).await;
        ok(cp, &["-n", "monitoring", "patch", "nodeagent", "e2e", "--type=merge", "-p", r#"{"spec":{"replaces":{"giveBack":true}}}"#]);
        // Done when every node runs node_exporter again and the DaemonSet
        // reports every pod from its own template.
        wait_for(cp, "every node given back, the DaemonSet put back and its pods rolled", 120, async || {
            let ds = ok(
                cp,
                &[
                    "-n",
                    "monitoring",
                    "get",
                    "daemonset",
                    "prometheus-node-exporter",
                    "-o",
                    "jsonpath={.status.updatedNumberScheduled}/{.status.numberReady}",
                ],
            );
            status(cp)["status"]["migration"]["phase"] == "GivenBack"
                && ready_old().await
                && ds == format!("{TAKEOVER_NODES}/{TAKEOVER_NODES}")
        })
        .await;
        watcher.abort();
        let (worst_pods, longest_gap) = watch.lock().map(|w| (w.worst_pods, w.longest_gap.clone())).expect("watch");
        assert_eq!(worst_pods, 1, "a node had two exporter pods at once while given back");
        // n3 came back to node_exporter at the halt, while the DaemonSet
        // excluded taken nodes: its pod is from the changed template, and the
        // DaemonSet's own rolling update replaces it once its spec is back.
        for (node, gap) in &longest_gap {
            assert!(*gap <= Duration::from_secs(15), "{node} had no Ready exporter for {gap:?} while given back:\n{}", state(cp));
        }
        assert_eq!(daemon_pods(cp, selector).get("n4"), before.get("n4"), "n4's pod, never moved, was restarted");
        assert_eq!(
            ok(cp, &["-n", "monitoring", "get", "daemonset", "prometheus-node-exporter", "-o", "jsonpath={.spec}"]),
            spec_before,
            "the DaemonSet's spec is put back exactly"
        );
        let labels = ok(cp, &["get", "nodes", "-o", "jsonpath={.items[*].metadata.labels}"]);
        assert!(!labels.contains("nodeagent.io/exporter"), "{labels}");
        eprintln!("give-back: the longest time without a Ready exporter, by node: {longest_gap:?}");
        leaders.stop().await;
        kubelet.abort();
    });
    drop(agent);
}

/// A bridge (no ports: an interface of its own) holding the Prometheus test's node addresses
/// (10.244.92.10, .11, …: the API server refuses loopback addresses in
/// EndpointSlices), removed when dropped.
struct NodeAddresses(&'static str);

impl NodeAddresses {
    const LINK: &'static str = "na-takeover0";

    fn add(n: usize) -> Result<NodeAddresses, String> {
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        let _ = ip(&["link", "del", Self::LINK]);
        ip(&["link", "add", Self::LINK, "type", "bridge"])?;
        let link = NodeAddresses(Self::LINK);
        for i in 0..n {
            ip(&["addr", "add", &format!("{}/32", node_address(i)), "dev", Self::LINK])?;
        }
        ip(&["link", "set", Self::LINK, "up"])?;
        Ok(link)
    }
}

impl Drop for NodeAddresses {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", self.0]).output();
    }
}

/// Node nX's address in the Prometheus test.
fn node_address(x: usize) -> String {
    format!("10.244.92.{}", 10 + x)
}

/// The kubelet's part for the Prometheus test, with real processes: a pod
/// bound to node nX runs at node nX's address as a real exporter on `port` —
/// the DaemonSet's as Debian's node_exporter, the NodeAgent's as node-agent
/// (both with loadavg and meminfo) — started when the pod is bound and
/// Ready once it listens (and its readiness gates are True); a pod being
/// deleted has its process killed, then its deletion confirmed.
fn process_kubelet(admin: kube::Client, port: u16) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
    // Built before the first pod starts, not while it does.
    let agent = node_agent_tests::agent_binary();
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(admin, "monitoring");
        let mut running: std::collections::BTreeMap<String, node_agent_tests::Kill> = std::collections::BTreeMap::new();
        loop {
            for p in pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
                let name = p.metadata.name.clone().unwrap_or_default();
                if p.metadata.deletion_timestamp.is_some() {
                    running.remove(&name);
                    let _ = pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await;
                    continue;
                }
                let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
                let ip = node_address(node.trim_start_matches('n').parse().unwrap_or(0));
                if !running.contains_key(&name) {
                    let kind = p.metadata.owner_references.iter().flatten().next().map(|o| o.kind.clone()).unwrap_or_default();
                    let bin = if kind == "NodeAgent" { agent.clone() } else { "prometheus-node-exporter".into() };
                    let child = std::process::Command::new(bin)
                        .args(["--collector.disable-defaults", "--collector.loadavg", "--collector.meminfo"])
                        .arg(format!("--web.listen-address={ip}:{port}"))
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .expect("an exporter process");
                    running.insert(name.clone(), node_agent_tests::Kill(child));
                }
                if std::net::TcpStream::connect((ip.as_str(), port)).is_err() {
                    continue;
                }
                let conds = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                let is_true = |t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
                let ready =
                    p.spec.as_ref().and_then(|s| s.readiness_gates.clone()).unwrap_or_default().iter().all(|g| is_true(&g.condition_type));
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                if phase && is_true("ContainersReady") && is_true("Ready") == ready {
                    continue;
                }
                let now = node_agent_tests::apiserver::now();
                let patch = serde_json::json!({"status": {
                    "phase": "Running", "hostIP": ip, "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now},
                    ],
                }});
                let _ = pods.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The Service's targets as Prometheus's `kubernetes_sd_configs` (role
/// endpointslice) finds them, written for a `file_sd_configs` job (Debian
/// builds Prometheus without Kubernetes discovery): every endpoint of the
/// Service's EndpointSlices, ready or not (Prometheus keeps not-ready ones,
/// labelled, and kube-prometheus-stack's ServiceMonitor drops none), as
/// `address:port`, rewritten (atomically) whenever the slices change.
fn endpoints_to_file_sd(admin: kube::Client, service: &'static str, file: PathBuf) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, ListParams};
    tokio::spawn(async move {
        let slices: Api<EndpointSlice> = Api::namespaced(admin, "monitoring");
        let mut last = String::new();
        loop {
            let selector = format!("kubernetes.io/service-name={service}");
            if let Ok(list) = slices.list(&ListParams::default().labels(&selector)).await {
                let mut targets = BTreeSet::new();
                for s in &list.items {
                    let Some(port) = s.ports.iter().flatten().find_map(|p| p.port) else { continue };
                    for e in &s.endpoints {
                        targets.extend(e.addresses.iter().map(|a| format!("{a}:{port}")));
                    }
                }
                let text = serde_json::json!([{ "targets": targets, "labels": {} }]).to_string();
                if text != last {
                    let tmp = file.with_extension("tmp");
                    if std::fs::write(&tmp, &text).and_then(|_| std::fs::rename(&tmp, &file)).is_ok() {
                        last = text;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Issue #50's Prometheus check: a real Prometheus (Debian's) scrapes the
/// Helm chart's Service through an unchanged job — its ready endpoints as
/// kube-controller-manager's EndpointSlice controller keeps them, handed to
/// Prometheus as `kubernetes_sd_configs` would (see
/// `endpoints_to_file_sd`) — every 5 s while the controller takes three
/// nodes over from real node_exporters to real agents: every node misses
/// at most one scrape, and `up` and `node_load1` keep one series per node
/// with the same `job` and `instance` from before to after.
#[test]
fn prometheus_keeps_every_node_through_a_takeover_on_a_real_cluster() {
    let Some(prom) = node_agent_tests::prometheus::need("prometheus") else { return };
    let Some(mut cp) = ControlPlane::start_or_skip("Prometheus through a takeover against a real control plane") else { return };
    cp.start_scheduler().expect("kube-scheduler");
    cp.start_controller_manager("daemonset-controller,endpointslice-controller").expect("kube-controller-manager");
    ok(&cp, &["apply", "-k", &dir("deploy/crd")]);
    ok(&cp, &["wait", "--for=condition=Established", "crd/nodeagents.nodeagent.io", "--timeout=60s"]);
    ok(&cp, &["apply", "-k", &dir("deploy/overlays/takeover")]);
    ok(&cp, &["-n", "monitoring", "delete", "nodeagent", "node-agent"]);
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "default"]);
    ok(&cp, &["-n", "monitoring", "create", "serviceaccount", "prometheus-node-exporter"]);
    const N: usize = 3;
    for i in 0..N {
        cp.node(&format!("n{i}"), &[("kubernetes.io/os", "linux")]).expect("node");
    }
    let sa = cp.token_kubeconfig("monitoring", "node-agent-controller").expect("the controller's token");
    let _addresses = match NodeAddresses::add(N) {
        Ok(a) => a,
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "the node addresses (root in CI): {e}");
            eprintln!("SKIP: node addresses on an interface of their own need root: {e}");
            return;
        }
    };
    // The exporters listen on the node addresses, on a free port (9100 may
    // be another test's); the Service's targetPort says so.
    let port = free_addr().port();
    ok(&cp, &["apply", "-f", &dir("tests/fixtures/takeover/helm-daemonset.yaml")]);
    ok(&cp, &["apply", "-f", &dir("tests/fixtures/takeover/helm-service.yaml")]);
    let target = format!(r#"[{{"op":"replace","path":"/spec/ports/0/targetPort","value":{port}}}]"#);
    ok(&cp, &["-n", "monitoring", "patch", "service", "prometheus-node-exporter", "--type=json", "-p", &target]);
    let na = format!(
        "apiVersion: nodeagent.io/v1alpha1\nkind: NodeAgent\nmetadata:\n  name: e2e\n  namespace: monitoring\nspec:\n  selector:\n    matchLabels: {{app: e2e}}\n  template:\n    metadata:\n      labels: {{app: e2e}}\n    spec:\n      hostNetwork: true\n      containers:\n      - {{name: agent, image: \"agent:1\", ports: [{{name: metrics, containerPort: 9100}}]}}\n  updateStrategy:\n    rollingUpdate: {{maxUnavailable: 1}}\n  replaces: {{namespace: monitoring, name: prometheus-node-exporter, port: {port}}}\n  rollout:\n    healthGate: {{port: {port}, requiredCollectors: [loadavg, meminfo], deadlineSeconds: 60, minPrograms: 0}}\n"
    );
    let na_file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(na_file.path(), na).expect("write");
    const INTERVAL: u64 = 5;
    let pdir = tempfile::tempdir().expect("tempdir");
    let sd = pdir.path().join("targets.json");
    std::fs::write(&sd, "[]").expect("write");
    let config = format!(
        "global: {{scrape_interval: {INTERVAL}s, scrape_timeout: 4s}}\nscrape_configs:\n  - job_name: node-exporter\n    file_sd_configs:\n      - files: [{}]\n",
        sd.display()
    );

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(async {
        let admin = kube_client(&cp.kubeconfig).await;
        let kubelet = process_kubelet(admin.clone(), port);
        let discovery = endpoints_to_file_sd(admin.clone(), "prometheus-node-exporter", sd.clone());
        let cp = &cp;
        let p = node_agent_tests::prometheus::Prometheus::start(&prom, pdir.path(), &config, &[]);
        let instances: BTreeSet<String> = (0..N).map(|i| format!("{}:{port}", node_address(i))).collect();
        let up_everywhere = |p: &node_agent_tests::prometheus::Prometheus, samples: usize| {
            let r = p.query(&format!("count_over_time(up{{job=\"node-exporter\"}}[5m]) >= {samples}")).unwrap_or_default();
            r.len() == N
        };
        wait_for(cp, "Prometheus scraping node_exporter on every node", 90, async || up_everywhere(&p, 2)).await;
        let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();

        let mut leaders = Leaders { sa: sa.clone(), n: 0, current: None };
        leaders.next(cp).await;
        ok(cp, &["apply", "-f", &na_file.path().display().to_string()]);
        wait_for(cp, "the takeover complete", 120, async || {
            let v: serde_json::Value =
                serde_json::from_str(&ok(cp, &["-n", "monitoring", "get", "nodeagent", "e2e", "-o", "json"])).unwrap_or_default();
            v["status"]["migration"]["phase"] == "Complete"
        })
        .await;
        // Three scrapes of the agents after.
        tokio::time::sleep(Duration::from_secs(3 * INTERVAL + 2)).await;
        let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
        leaders.stop().await;

        // Every `up` sample from the start of the takeover on, by series.
        let window = format!("{}s", (end - start).ceil() as u64 + 1);
        let series = p.query(&format!("up{{job=\"node-exporter\"}}[{window}]")).expect("up");
        let labels: BTreeSet<String> = series.iter().map(|s| s["metric"].to_string()).collect();
        assert_eq!(series.len(), N, "one `up` series per node, its labels unchanged: {labels:?}");
        let mut worst = 0.0f64;
        for s in &series {
            let m = &s["metric"];
            assert_eq!(m.as_object().map(|o| o.len()), Some(3), "only __name__, job and instance: {m}");
            assert!(instances.contains(m["instance"].as_str().unwrap_or_default()), "{m}");
            // The longest time between two successful scrapes (and from the
            // window's start and to its end).
            let mut last = start;
            for v in s["values"].as_array().into_iter().flatten() {
                let t = v[0].as_f64().unwrap_or_default();
                if v[1] == "1" {
                    worst = worst.max(t - last);
                    last = t;
                }
            }
            worst = worst.max(end - last);
        }
        let missed = (worst / INTERVAL as f64).round() as i64 - 1;
        eprintln!("prometheus: the longest time between two successful scrapes of a node {worst:.1} s at a {INTERVAL} s interval ({missed} missed)");
        assert!(missed <= 1, "a node missed {missed} scrapes in a row ({worst:.1} s without a successful one)");
        // The agents' series are node_exporter's: node_load1 keeps one series per node.
        let load = p.query(&format!("count by (job, instance) (count_over_time(node_load1[{window}]))")).expect("node_load1");
        assert_eq!(load.len(), N, "{load:?}");
        let agent_served = p.query("node_scrape_collector_success{collector=\"loadavg\"}").expect("query");
        assert_eq!(agent_served.len(), N, "{agent_served:?}");
        discovery.abort();
        kubelet.abort();
    });
}
