//! `plan` on real Kubernetes YAML: the deploy/ manifest and the seeds'
//! examples (control-plane toleration, GPU nodeSelector, SSD + zone
//! affinity) over a realistic node list.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use planner::{input, plan};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn plan_file(ds: &str) -> plan::Plan {
    let ds: Vec<DaemonSet> = input::read(&root().join(ds), "DaemonSet").expect("daemonset");
    let nodes: Vec<Node> = input::read(&root().join("tests/fixtures/daemonset/nodes.yaml"), "Node").expect("nodes");
    plan::plan(&ds[0], &nodes, &[], planner::builders::at(1_000), None).expect("plan")
}

fn eligible(p: &plan::Plan) -> Vec<&str> {
    p.nodes.iter().filter(|n| n.should_run).map(|n| n.node.as_str()).collect()
}

#[test]
fn deploy_manifest_places_one_pod_on_every_node() {
    let p = plan_file("deploy/agent/daemonset.yaml");
    assert_eq!(p.nodes.len(), 6);
    assert_eq!(eligible(&p).len(), 6, "{:?}", p.nodes);
    assert_eq!(p.actions.len(), 6);
    assert_eq!(p.status.desired_number_scheduled, 6);
}

#[test]
fn seed_examples() {
    assert_eq!(eligible(&plan_file("tests/fixtures/daemonset/gpu-only.yaml")), vec!["gpu-1"]);
    assert_eq!(eligible(&plan_file("tests/fixtures/daemonset/ssd-zone-a.yaml")), vec!["ssd-1"]);
    let all = plan_file("tests/fixtures/daemonset/agent-all-nodes.yaml");
    assert_eq!(eligible(&all).len(), 6);
    // Without tolerations, the default daemon tolerations still admit the
    // not-ready and cordoned nodes; the control plane and the dedicated node
    // are refused with their taints named.
    let gpu = plan_file("tests/fixtures/daemonset/gpu-only.yaml");
    let cp = gpu.nodes.iter().find(|n| n.node == "cp-1").expect("cp-1");
    assert!(cp.reasons.iter().any(|r| r.contains("nodeSelector nvidia.com/gpu.present=true")));
}

#[test]
fn json_output_shape() {
    let p = plan_file("tests/fixtures/daemonset/gpu-only.yaml");
    let v = serde_json::to_value(&p).expect("json");
    let keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
    assert_eq!(keys, vec!["actions", "nodes", "revision", "status"]);
    assert_eq!(v["actions"][0], serde_json::json!({"type": "create", "node": "gpu-1"}));
    assert!(v["nodes"][0].get("shouldContinueRunning").is_some());
    assert!(v["status"].get("numberMisscheduled").is_some());
    assert!(v["revision"]["hash"].is_string());
}
