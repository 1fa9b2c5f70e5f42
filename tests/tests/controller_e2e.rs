//! `controller::run` end to end over real HTTP: a small in-memory API
//! server (list, watch with resourceVersion replay, create, replace,
//! apply / merge / JSON patch, delete, status subresources, label
//! selectors), a fake kubelet, and a real node-agent serving /metrics that
//! the health gate scrapes. Two controller replicas share one Lease: one
//! leads, the other stands by and takes over when the leader stops.
//!
//! The fake server keeps the real one's semantics where the controller
//! depends on them (field-managed server-side apply, resourceVersion
//! preconditions, status subresources, generations, and optionally
//! OwnerReferencesPermissionEnforcement judged by the shipped ClusterRole:
//! see node_agent_tests::apiserver); it has no garbage collection and
//! deletes are immediate. It is here to run the controller's own wiring
//! (informers, triggers, leader election, gate scrapes) for real; the
//! exact requests are asserted in controller_mock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use node_agent_tests::apiserver::{now, serve, Api};
use node_agent_tests::gate::replica;
use serde_json::{json, Value};

/// The fake kubelet: pods run on 127.0.0.1, containers ready at once,
/// Ready when every readiness gate condition is True.
fn kubelet_pass(api: &Api) {
    let mut st = api.state.lock().expect("state");
    let pods: Vec<((String, String, String), Value)> =
        st.objects.iter().filter(|((r, _, _), _)| r == "pods").map(|(k, v)| (k.clone(), v.clone())).collect();
    for ((_, ns, name), mut p) in pods {
        let gates: Vec<String> = p["spec"]["readinessGates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["conditionType"].as_str().map(str::to_string))
            .collect();
        let conds = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let is_true = |t: &str| conds.iter().any(|c| c["type"] == t && c["status"] == "True");
        let ready = gates.iter().all(|g| is_true(g));
        if p["status"]["phase"] == "Running" && is_true("Ready") == ready {
            continue;
        }
        let mut next: Vec<Value> = conds.iter().filter(|c| c["type"] != "Ready" && c["type"] != "ContainersReady").cloned().collect();
        next.push(json!({"type": "ContainersReady", "status": "True", "lastTransitionTime": now()}));
        next.push(json!({"type": "Ready", "status": if ready { "True" } else { "False" }, "lastTransitionTime": now()}));
        p["status"]["phase"] = json!("Running");
        p["status"]["podIP"] = json!("127.0.0.1");
        p["status"]["conditions"] = json!(next);
        api.put(&mut st, "pods", &ns, &name, p, false);
    }
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

fn scrape(addr: SocketAddr) -> String {
    ureq::get(&format!("http://{addr}/metrics")).call().ok().and_then(|r| r.into_string().ok()).unwrap_or_default()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok())).unwrap_or(0.0)
}

async fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn cluster(agent_port: u16) -> Arc<Api> {
    let api = Arc::new(Api::new());
    {
        let mut st = api.state.lock().expect("state");
        for i in 0..5 {
            let labels = if i == 3 { json!({"nodeagent.io/wave": "canary"}) } else { json!({}) };
            let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("n{i}"), "labels": labels}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
            api.put(&mut st, "nodes", "", &format!("n{i}"), node, true);
        }
        let na = json!({
            "apiVersion": "nodeagent.io/v1alpha1", "kind": "NodeAgent",
            "metadata": {"name": "node-agent", "namespace": "monitoring"},
            "spec": {
                "selector": {"matchLabels": {"app": "node-agent"}},
                "template": {"metadata": {"labels": {"app": "node-agent"}}, "spec": {"containers": [{"name": "agent", "image": "agent:1"}]}},
                "updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}},
                "rollout": {
                    "waves": [{"name": "canary", "selector": {"matchLabels": {"nodeagent.io/wave": "canary"}}}],
                    "healthGate": {"port": agent_port, "requiredCollectors": ["loadavg", "meminfo"], "deadlineSeconds": 60, "minPrograms": 0}
                }
            }
        });
        api.put(&mut st, "nodeagents", "monitoring", "node-agent", na, true);
    }
    api
}

#[test]
fn two_replicas_one_leader_gated_rollout_over_real_http_and_failover() {
    with_agent(scenario);
}

/// Runs `f(port)` on a runtime of its own, beside a real agent on `port`
/// for the health gate to scrape (the agent runs its own runtime).
fn with_agent<F: std::future::Future<Output = ()>>(f: impl FnOnce(u16) -> F) {
    let agent = node_agent_tests::gate::agent().expect("agent");
    let port = agent.addrs[0].port();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("runtime");
    rt.block_on(f(port));
    drop(agent);
}

async fn scenario(agent_port: u16) {
    let api = cluster(agent_port);
    let addr = serve(api.clone()).await;
    let kubelet = kubelet(api.clone());
    let client = || client(addr);
    let (ma, mb) = (free_port(), free_port());
    let (stop_a, rx_a) = tokio::sync::oneshot::channel::<()>();
    let (stop_b, rx_b) = tokio::sync::oneshot::channel::<()>();
    let a = tokio::spawn(controller::run_until(client(), replica("replica-a", ma), async move {
        let _ = rx_a.await;
    }));
    // Let replica-a take the lease first.
    wait_for("replica-a to lead", 30, || metric(&scrape(ma), "node_agent_controller_leader") == 1.0).await;
    let b = tokio::spawn(controller::run_until(client(), replica("replica-b", mb), async move {
        let _ = rx_b.await;
    }));

    wait_for("the first install", 30, || complete(&api, "agent:1")).await;
    // The gate passed on every pod, through a real scrape of the agent.
    let pods = api.list("pods", "monitoring", "nodeagent.io/name=node-agent", "");
    for p in pods["items"].as_array().expect("pods") {
        let conds = p["status"]["conditions"].as_array().expect("conditions");
        assert!(conds.iter().any(|c| c["type"] == "nodeagent.io/health-gate" && c["status"] == "True"), "{p}");
    }
    let revs = api.list("controllerrevisions", "monitoring", "nodeagent.io/name=node-agent", "");
    assert_eq!(revs["items"].as_array().map(Vec::len), Some(1));
    let pc = api.get("priorityclasses", "", "node-agent-critical");
    assert_eq!(pc.0, 200, "PriorityClass created");
    let (ta, tb) = (scrape(ma), scrape(mb));
    assert_eq!(metric(&tb, "node_agent_controller_leader"), 0.0, "replica-b stands by");
    assert_eq!(metric(&tb, "node_agent_controller_reconciles_total"), 0.0, "the standby never reconciles");
    assert!(metric(&ta, "node_agent_controller_pods_created_total") >= 5.0, "{ta}");

    // Roll out agent:2: canary first, then the rest, within maxUnavailable 2.
    let first_rv = api.state.lock().expect("state").rv;
    api.write(
        "PATCH",
        "nodeagents",
        "monitoring",
        Some("node-agent"),
        None,
        "application/merge-patch+json",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "agent:2"}]}}}}),
    );
    wait_for("the agent:2 rollout", 60, || complete(&api, "agent:2")).await;
    // Server-side apply is field-managed: the wave the controller no longer
    // applies once the rollout is complete is gone, not left behind.
    wait_for("currentWave to go", 10, || api.get("nodeagents", "monitoring", "node-agent").1["status"].get("currentWave").is_none()).await;
    {
        let st = api.state.lock().expect("state");
        let created: Vec<(u64, String)> = st
            .log
            .iter()
            .filter(|(rv, r, _, t, o)| *rv > first_rv && r == "pods" && *t == "ADDED" && o["spec"]["containers"][0]["image"] == "agent:2")
            .map(|(rv, _, _, _, o)| {
                (
                    *rv,
                    o["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                        ["matchFields"][0]["values"][0]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            })
            .collect();
        assert_eq!(created.len(), 5, "{created:?}");
        assert_eq!(created[0].1, "n3", "the canary first: {created:?}");
    }
    // Never more than maxUnavailable nodes without a pod (deletes are immediate here).
    let (worst, _) = worst_since(&api, first_rv);
    assert!(worst <= 2, "at most maxUnavailable nodes without a pod, saw {worst}");
    assert_eq!(metric(&scrape(mb), "node_agent_controller_reconciles_total"), 0.0, "the standby still never reconciled");

    // Failover: the leader stops and gives the lease up; the standby leads and acts.
    let _ = stop_a.send(());
    a.await.expect("join").expect("replica-a stops cleanly");
    wait_for("replica-b to lead", 10, || metric(&scrape(mb), "node_agent_controller_leader") == 1.0).await;
    api.write(
        "PATCH",
        "nodeagents",
        "monitoring",
        Some("node-agent"),
        None,
        "application/merge-patch+json",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "agent:3"}]}}}}),
    );
    wait_for("the agent:3 rollout by replica-b", 60, || complete(&api, "agent:3")).await;
    assert!(metric(&scrape(mb), "node_agent_controller_reconciles_total") > 0.0);
    let lease = api.get("leases", "monitoring", "node-agent-controller").1;
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");

    let _ = stop_b.send(());
    b.await.expect("join").expect("replica-b stops cleanly");
    kubelet.abort();
}

/// The fake kubelet, every 100 ms.
fn kubelet(api: Arc<Api>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            kubelet_pass(&api);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

fn client(addr: SocketAddr) -> kube::Client {
    kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("uri"))).expect("client")
}

/// The rollout of `image` is complete: status and pods agree.
fn complete(api: &Api, image: &str) -> bool {
    let v = api.get("nodeagents", "monitoring", "node-agent").1;
    let s = &v["status"];
    let pods = api.list("pods", "monitoring", "", "");
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let ready =
        |p: &Value| p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    let on_image = items.iter().filter(|p| p["spec"]["containers"][0]["image"] == image && ready(p)).count();
    s["numberAvailable"] == 5
        && s["updatedNumberScheduled"] == 5
        && s["currentRevision"] == s["updateRevision"]
        && on_image == 5
        && items.len() == 5
}

/// Over the pod events after `from`: the most nodes without a pod at once,
/// and the most pods on one node at once.
fn worst_since(api: &Api, from: u64) -> (usize, i64) {
    let st = api.state.lock().expect("state");
    let mut live: BTreeMap<String, i64> = (0..5).map(|i| (format!("n{i}"), 1)).collect();
    let (mut without, mut most) = (0usize, 1i64);
    for (_, _, _, t, o) in st.log.iter().filter(|(rv, r, ..)| *rv > from && r == "pods") {
        let node = o["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchFields"][0]["values"][0]
            .as_str()
            .unwrap_or("")
            .to_string();
        match *t {
            "ADDED" => *live.entry(node).or_default() += 1,
            "DELETED" => *live.entry(node).or_default() -= 1,
            _ => {}
        }
        without = without.max(live.values().filter(|v| **v == 0).count());
        most = most.max(live.values().copied().max().unwrap_or(0));
    }
    (without, most)
}

/// The real controller against an API server that fails 15 % of writes
/// (500, 429, 409, not applied) and drops watches at random: the rollout
/// still completes, never beyond maxUnavailable, never two agents on a node.
#[test]
fn api_faults_and_dropped_watches_never_break_the_invariants() {
    with_agent(|port| async move {
        let api = cluster(port);
        let addr = serve(api.clone()).await;
        let kubelet = kubelet(api.clone());
        let (client, opts) = (client(addr), replica("replica-a", free_port()));
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let controller = tokio::spawn(controller::run_until(client, opts, async move {
            let _ = rx.await;
        }));
        api.faults.store(15, std::sync::atomic::Ordering::Relaxed);
        wait_for("the first install under faults", 120, || complete(&api, "agent:1")).await;
        let from = api.state.lock().expect("state").rv;
        api.write(
            "PATCH",
            "nodeagents",
            "monitoring",
            Some("node-agent"),
            None,
            "application/merge-patch+json",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "agent:2"}]}}}}),
        );
        wait_for("the agent:2 rollout under faults", 180, || complete(&api, "agent:2")).await;
        let injected = api.injected.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!("faults injected: {injected}");
        assert!(injected >= 5, "faults were injected: {injected}");
        let (without, most) = worst_since(&api, from);
        assert!(without <= 2, "at most maxUnavailable (2) nodes without an agent, saw {without}");
        assert_eq!(most, 1, "never two agents on one node");
        let _ = stop.send(());
        controller.await.expect("join").expect("stops cleanly");
        kubelet.abort();
    });
}

/// The ClusterRole deploy/ ships for the controller, as rules.
fn shipped_cluster_role() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/controller/controller.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/controller/controller.yaml");
    for doc in text.split("\n---\n") {
        let v: Value = serde_yaml_ng::from_str(doc).expect("yaml");
        if v["kind"] == "ClusterRole" {
            return v["rules"].as_array().cloned().expect("rules");
        }
    }
    panic!("no ClusterRole in {}", path.display())
}

/// Under OwnerReferencesPermissionEnforcement (OpenShift, hardened
/// clusters), the shipped ClusterRole lets the controller create its
/// revisions and pods, whose owner references block the owner's deletion;
/// without `update` on nodeagents/finalizers nothing is created, and the
/// NodeAgent's status says why and what to do.
#[test]
fn owner_reference_admission_passes_with_the_shipped_role_and_is_reported_without_it() {
    with_agent(|port| async move {
        let rules = shipped_cluster_role();
        assert!(node_agent_tests::apiserver::rbac_allows(&rules, "nodeagent.io", "nodeagents/finalizers", "update"));
        for (with_finalizers, name) in [(true, "shipped"), (false, "without finalizers")] {
            let api = cluster(port);
            let granted: Vec<Value> =
                rules.iter().filter(|r| with_finalizers || r["resources"] != json!(["nodeagents/finalizers"])).cloned().collect();
            *api.owner_admission.lock().expect("admission") = Some(granted);
            let addr = serve(api.clone()).await;
            let kubelet = kubelet(api.clone());
            let (stop, rx) = tokio::sync::oneshot::channel::<()>();
            let controller = tokio::spawn(controller::run_until(client(addr), replica("replica-a", free_port()), async move {
                let _ = rx.await;
            }));
            if with_finalizers {
                wait_for("the install under owner-reference admission", 30, || complete(&api, "agent:1")).await;
            } else {
                let failed = || {
                    let v = api.get("nodeagents", "monitoring", "node-agent").1;
                    v["status"]["conditions"]
                        .as_array()
                        .and_then(|c| c.iter().find(|c| c["type"] == "ReconcileFailed" && c["status"] == "True"))
                        .cloned()
                };
                wait_for("ReconcileFailed in the status", 30, || failed().is_some()).await;
                let c = failed().unwrap_or_default();
                assert_eq!(c["reason"], "Forbidden", "{name}: {c}");
                let m = c["message"].as_str().unwrap_or_default();
                assert!(m.contains("cannot set blockOwnerDeletion") && m.contains("deploy/overlays/controller"), "{m}");
                assert!(api.list("pods", "monitoring", "", "")["items"].as_array().is_some_and(Vec::is_empty), "{name}: no pod");
                assert!(api.list("controllerrevisions", "monitoring", "", "")["items"].as_array().is_some_and(Vec::is_empty));
            }
            let _ = stop.send(());
            controller.await.expect("join").expect("stops cleanly");
            kubelet.abort();
        }
    });
}
