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
//!   lists and watches the pods of its node and the Services.
//!
//! The prometheus-operator overlay is left out here: its kinds need the
//! operator's CRDs, which nothing on this machine ships (deploy.rs checks
//! those objects against the operator's models).
//!
//! Without ../shared these tests skip with a message, except in CI.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use node_agent_tests::cluster::ControlPlane;

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
    let nobody = Agent::start(&cp.token_kubeconfig("monitoring", "nobody").expect("a token for nobody"));
    nobody.until("the refusal logged", &|| nobody.logs().to_lowercase().contains("forbidden"));
    assert_ne!(nobody.value("node_ebpf_pod_attribution_synced"), Some(1.0), "listed pods without any binding");
    drop(nobody);

    let agent = Agent::start(&cp.token_kubeconfig("monitoring", "node-agent").expect("a token for node-agent"));
    agent.until("the pods of node-a listed", &|| agent.value("node_ebpf_pod_attribution_synced") == Some(1.0));
    // ServiceAccount admission wants the namespace's default account,
    // which kube-controller-manager (not run here) would have made.
    ok(&cp, &["-n", "default", "create", "serviceaccount", "default"]);
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-0\n  namespace: default\nspec:\n  nodeName: node-a\n  containers:\n  - name: c\n    image: example.invalid/none\n";
    let file = tempfile::NamedTempFile::new().expect("tempfile");
    std::fs::write(file.path(), pod).expect("write");
    ok(&cp, &["apply", "-f", &file.path().display().to_string()]);
    agent.until("the pod bound to node-a seen through the watch", &|| {
        agent.value("node_ebpf_pod_attribution_pods").is_some_and(|v| v >= 1.0)
    });
    // Both watches (pods, Services) have run a while by now.
    std::thread::sleep(Duration::from_secs(2));
    let text = agent.logs();
    assert!(!text.to_lowercase().contains("forbidden"), "the agent was refused something:\n{text}");
}

/// The agent binary with ebpf_pods and ebpf_tcp_peers, authenticating with
/// `kubeconfig`, its stderr in a file.
struct Agent {
    _child: node_agent_tests::Kill,
    url: String,
    log: tempfile::NamedTempFile,
}

impl Agent {
    fn start(kubeconfig: &Path) -> Agent {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let log = tempfile::NamedTempFile::new().expect("log file");
        let child = Command::new(node_agent_tests::agent_binary())
            .args([
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--collector.disable-defaults".into(),
                "--collector.ebpf_pods".into(),
                "--collector.ebpf_tcp_peers".into(),
                "--collector.ebpf_pods.node-name=node-a".into(),
                format!("--collector.ebpf_pods.kubeconfig={}", kubeconfig.display()),
            ])
            .stdout(Stdio::null())
            .stderr(log.reopen().expect("log"))
            .spawn()
            .expect("start node-agent");
        Agent { _child: node_agent_tests::Kill(child), url: format!("http://127.0.0.1:{port}/metrics"), log }
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        let _ = self.log.reopen().and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    fn value(&self, name: &str) -> Option<f64> {
        let body = node_agent_tests::compare::http_get(&self.url).ok()?;
        body.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    fn until(&self, what: &str, f: &dyn Fn() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(60), "{what} within 60 s:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
