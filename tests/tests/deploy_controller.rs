//! deploy/controller/: the example NodeAgent plans one pod per node and
//! runs the same pod as the plain DaemonSet; RBAC grants exactly what the
//! controller does.

use std::path::{Path, PathBuf};

use controller::crd::NodeAgent;
use controller::rollout::{decide, Observed};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use planner::builders::at;
use planner::input;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn example_nodeagent_plans_one_pinned_pod_per_node_and_matches_the_daemonset() {
    let mut agents: Vec<NodeAgent> = input::read(&root().join("deploy/controller/nodeagent.yaml"), "NodeAgent").expect("nodeagent");
    let a = agents.remove(0);
    let nodes: Vec<Node> = input::read(&root().join("tests/fixtures/daemonset/nodes.yaml"), "Node").expect("nodes");
    let d = decide(&Observed {
        agent: &a,
        nodes: &nodes,
        pods: &[],
        revisions: &[],
        gate: &Default::default(),
        backoff: &|_| false,
        now: at(1_000),
        replaced: None,
    })
    .expect("decide");
    assert_eq!(d.creates.len(), nodes.len(), "one pod per node: {:?}", d.creates.iter().map(|c| &c.node).collect::<Vec<_>>());
    assert_eq!(d.status.desired_number_scheduled as usize, nodes.len());
    assert_eq!(d.revision.as_ref().map(|r| r.revision), Some(1));
    for c in &d.creates {
        let spec = c.pod.spec.as_ref().expect("spec");
        assert_eq!(spec.priority_class_name.as_deref(), Some("node-agent-critical"));
        assert!(spec.readiness_gates.as_ref().is_some_and(|g| g.len() == 1), "health gate");
    }
    let ds: Vec<DaemonSet> = input::read(&root().join("deploy/agent/daemonset.yaml"), "DaemonSet").expect("daemonset");
    let mut ds_pod = ds[0].spec.as_ref().expect("spec").template.spec.clone().expect("pod spec");
    // The DaemonSet names system-node-critical; the NodeAgent ensures its own class.
    ds_pod.priority_class_name = None;
    assert_eq!(a.spec.template.spec.clone().expect("pod spec"), ds_pod, "the NodeAgent runs the DaemonSet's pod");
}

#[test]
fn rbac_is_exactly_what_the_controller_does() {
    let roles: Vec<ClusterRole> = input::read(&root().join("deploy/controller/controller.yaml"), "ClusterRole").expect("role");
    let mut got: Vec<String> = Vec::new();
    for r in roles[0].rules.iter().flatten() {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                let mut verbs = r.verbs.clone();
                verbs.sort();
                got.push(format!("{g}/{res}: {}", verbs.join(",")));
            }
        }
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            "/nodes: get,list,watch",
            "/pods/status: patch",
            "/pods: create,delete,get,list,patch,watch",
            "apps/controllerrevisions: create,delete,get,list,patch,watch",
            "events.k8s.io/events: create,patch",
            "nodeagent.io/nodeagents/finalizers: update",
            "nodeagent.io/nodeagents/status: get,patch",
            "nodeagent.io/nodeagents: get,list,patch,watch",
            "scheduling.k8s.io/priorityclasses: create,get",
        ]
    );
}

/// Every `format` in the CRD's schema is one the API server knows (it
/// warns on others, e.g. schemars' `uint16`): the OpenAPI formats
/// apiextensions-apiserver validates.
#[test]
fn the_crd_uses_only_formats_the_api_server_knows() {
    const KNOWN: &[&str] = &[
        "int32",
        "int64",
        "float",
        "double",
        "byte",
        "binary",
        "date",
        "date-time",
        "datetime",
        "duration",
        "password",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
    ];
    let text = std::fs::read_to_string(root().join("deploy/crd/crd.yaml")).expect("crd");
    let formats: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("format: ")).collect();
    assert!(formats.len() >= 5, "{formats:?}");
    for f in &formats {
        assert!(KNOWN.contains(f), "format {f:?} is not one the API server knows");
    }
    assert!(!text.contains("minimum: 0.0"), "ports start at 1");
}
