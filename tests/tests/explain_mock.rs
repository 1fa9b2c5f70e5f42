//! `explain` against an HTTP-level mock of the API server (kube's
//! tower-test style): real JSON objects served, and the exact requests
//! (method, path, query) asserted in order.

use http::{Method, Request, Response};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::client::Body;
use planner::builders::{at, daemonset, node, pod, DS_UID};
use planner::explain::{explain, render};
use serde_json::json;

fn list(kind: &str, items: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items})).expect("json")
}

#[tokio::test]
async fn explain_reads_the_cluster_and_names_each_reason() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");

    let mut ds = daemonset("node-agent:2", None, None, false);
    if let Some(spec) = ds.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.priority_class_name = Some("agents".into());
    }
    let mut pressured = node("worker-1", &[], &[]);
    pressured.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition { type_: "MemoryPressure".into(), status: "True".into(), ..Default::default() }]),
        ..Default::default()
    });
    let nodes = vec![
        node("cp-1", &[], &[("node-role.kubernetes.io/control-plane", None, "NoSchedule")]),
        node("db-1", &[], &[("dedicated", Some("database"), "NoExecute")]),
        pressured,
    ];
    let pods = vec![pod("node-agent-abcde", "worker-1", "cluster-hash", at(100), "Running", Some(at(200)))];
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some("node-agent-cluster-hash".into()),
            namespace: Some("monitoring".into()),
            labels: Some([("controller-revision-hash".to_string(), "cluster-hash".to_string())].into()),
            owner_references: Some(vec![OwnerReference {
                uid: DS_UID.into(),
                kind: "DaemonSet".into(),
                name: "node-agent".into(),
                api_version: "apps/v1".into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        revision: 3,
        data: None,
    };

    let responses: Vec<(Method, &str, Option<&str>, Vec<u8>)> = vec![
        (Method::GET, "/apis/apps/v1/namespaces/monitoring/daemonsets/node-agent", None, serde_json::to_vec(&ds).expect("json")),
        (Method::GET, "/api/v1/nodes", None, list("NodeList", serde_json::to_value(&nodes).expect("json"))),
        (
            Method::GET,
            "/api/v1/namespaces/monitoring/pods",
            Some("labelSelector=app%3Dnode-agent"),
            list("PodList", serde_json::to_value(&pods).expect("json")),
        ),
        (
            Method::GET,
            "/apis/apps/v1/namespaces/monitoring/controllerrevisions",
            Some("labelSelector=app%3Dnode-agent"),
            list("ControllerRevisionList", json!([revision])),
        ),
        (
            Method::GET,
            "/apis/scheduling.k8s.io/v1/priorityclasses/agents",
            None,
            serde_json::to_vec(
                &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "agents"}, "value": 1000}),
            )
            .expect("json"),
        ),
    ];
    let server = tokio::spawn(async move {
        for (method, path, query, body) in responses {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(req.method(), method);
            assert_eq!(req.uri().path(), path);
            if let Some(q) = query {
                assert!(req.uri().query().unwrap_or("").contains(q), "query of {path}: {:?}", req.uri().query());
            }
            send.send_response(Response::builder().body(Body::from(body)).expect("response"));
        }
        // No further request is made (the client goes away, or nothing comes).
        let more = tokio::time::timeout(std::time::Duration::from_millis(100), handle.next_request()).await;
        assert!(matches!(more, Err(_) | Ok(None)), "unexpected extra request");
    });

    let cluster = node_agent::cmd::explain::read(client, "monitoring", "node-agent").await.expect("read the cluster");
    let report = explain(&cluster, "monitoring", "node-agent", None, at(10_000)).expect("explain");
    server.await.expect("mock server");
    // The cluster's own hash comes from the newest ControllerRevision.
    assert_eq!(report.plan.revision.hash, "cluster-hash");
    assert_eq!(report.missing, vec!["cp-1", "db-1"]);
    let text = render(&report);
    assert!(text.contains("node cp-1: no agent pod"), "{text}");
    assert!(text.contains("taint node-role.kubernetes.io/control-plane:NoSchedule is not tolerated"), "{text}");
    assert!(text.contains("{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}"), "{text}");
    assert!(text.contains("taint dedicated=database:NoExecute is not tolerated"), "{text}");
    assert!(text.contains("priority 1000 is below system-node-critical"), "{text}");
}

/// Run in-cluster as the agent's ServiceAccount (`kubectl exec`), which may
/// read pods only: the first read RBAC forbids fails with what was denied
/// and every permission `explain` needs.
#[tokio::test]
async fn a_forbidden_read_names_the_permissions_explain_needs() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("a request");
        assert_eq!(req.uri().path(), "/apis/apps/v1/namespaces/monitoring/daemonsets/node-agent");
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": "daemonsets.apps \"node-agent\" is forbidden: User \"system:serviceaccount:monitoring:node-agent\" cannot get resource \"daemonsets\" in API group \"apps\" in the namespace \"monitoring\""});
        send.send_response(Response::builder().status(403).body(Body::from(serde_json::to_vec(&body).expect("json"))).expect("response"));
    });
    let err = node_agent::cmd::explain::read(client, "monitoring", "node-agent").await.expect_err("403");
    server.await.expect("mock server");
    let text = err.to_string();
    assert!(text.starts_with("explain may not get the DaemonSet: daemonsets.apps \"node-agent\" is forbidden"), "{text}");
    assert!(text.contains(node_agent::cmd::explain::NEEDS), "{text}");
    assert!(text.contains("run it with your own kubeconfig"), "{text}");
}
