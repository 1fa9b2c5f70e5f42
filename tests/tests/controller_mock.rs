//! The NodeAgent reconciler and the leader Lease against an HTTP-level mock
//! of the API server (kube's tower-test style): every request the
//! controller makes is asserted in order — verb, path, query (field
//! manager, force), content type, body — and answered with real JSON.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use controller::crd::{HealthGate, NodeAgent, NodeAgentSpec, NodeAgentStatus, Rollout, GATE_CONDITION};
use controller::gate::Probe;
use controller::lease::LeaseLock;
use controller::metrics::Metrics;
use controller::reconcile::{reconcile, Context};
use controller::rollout::{pod_for, revision_object, template_hash, GateResult, GateTarget};
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use planner::builders::{at, node};
use serde_json::{json, Value};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const NOW: i64 = 10_000;

/// One expected request and the answer to it.
struct Expect {
    method: Method,
    path: String,
    query: Vec<&'static str>,
    content_type: Option<&'static str>,
    check: Box<dyn Fn(&Value) + Send>,
    status: u16,
    answer: Answer,
}

enum Answer {
    /// Echo the request body back (what apply and create return).
    Echo,
    Json(Value),
}

fn expect(method: Method, path: impl Into<String>) -> Expect {
    Expect { method, path: path.into(), query: Vec::new(), content_type: None, check: Box::new(|_| {}), status: 200, answer: Answer::Echo }
}

impl Expect {
    fn query(mut self, q: &[&'static str]) -> Self {
        self.query = q.to_vec();
        self
    }
    fn apply(self) -> Self {
        let mut e = self.query(&["fieldManager=node-agent-controller", "force=true"]);
        e.content_type = Some("application/apply-patch+yaml");
        e
    }
    fn content_type(mut self, c: &'static str) -> Self {
        self.content_type = Some(c);
        self
    }
    fn body(mut self, f: impl Fn(&Value) + Send + 'static) -> Self {
        self.check = Box::new(f);
        self
    }
    fn answer(mut self, status: u16, v: Value) -> Self {
        self.status = status;
        self.answer = Answer::Json(v);
        self
    }
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"})
}

/// Serves the expectations in order, then checks that nothing else comes.
fn serve(mut handle: Handle, expected: Vec<Expect>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for (i, e) in expected.into_iter().enumerate() {
            let (req, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
                .await
                .unwrap_or_else(|_| panic!("request #{i} ({} {}) never came", e.method, e.path))
                .expect("a request");
            let (parts, body) = req.into_parts();
            let what = format!("request #{i}: {} {}?{}", parts.method, parts.uri.path(), parts.uri.query().unwrap_or(""));
            assert_eq!(parts.method, e.method, "{what}");
            match e.path.strip_suffix('*') {
                Some(prefix) => assert!(parts.uri.path().starts_with(prefix), "{what}"),
                None => assert_eq!(parts.uri.path(), e.path, "{what}"),
            }
            for q in &e.query {
                assert!(parts.uri.query().unwrap_or("").split('&').any(|x| x == *q), "{what}: query lacks {q}");
            }
            if let Some(ct) = e.content_type {
                assert_eq!(parts.headers.get("content-type").and_then(|v| v.to_str().ok()), Some(ct), "{what}");
            }
            let bytes = body.collect().await.expect("body").to_bytes();
            let value: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"))
            };
            (e.check)(&value);
            let out = match e.answer {
                Answer::Echo => value,
                Answer::Json(v) => v,
            };
            let resp = Response::builder().status(e.status).body(Body::from(serde_json::to_vec(&out).expect("json"))).expect("response");
            send.send_response(resp);
        }
        let more = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        if let Ok(Some((req, _))) = more {
            panic!("unexpected extra request: {} {}", req.method(), req.uri());
        }
    })
}

struct FakeProbe(GateResult);
impl Probe for FakeProbe {
    fn probe<'a>(&'a self, _: &'a GateTarget, _: &'a HealthGate) -> Pin<Box<dyn Future<Output = GateResult> + Send + 'a>> {
        Box::pin(async move { self.0.clone() })
    }
}

fn filled<K>(objs: Vec<K>) -> (reflector::Store<K>, Writer<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    // As a watcher fills it: a first list, then done (the store is ready).
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objs {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    (store, writer)
}

fn template(image: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some([("app".to_string(), "node-agent".to_string())].into()), ..Default::default() }),
        spec: Some(PodSpec {
            containers: vec![Container { name: "agent".into(), image: Some(image.into()), ..Default::default() }],
            ..Default::default()
        }),
    }
}

fn agent(gate: Option<HealthGate>) -> NodeAgent {
    let mut a = NodeAgent::new(
        "node-agent",
        NodeAgentSpec {
            selector: LabelSelector { match_labels: Some([("app".to_string(), "node-agent".to_string())].into()), ..Default::default() },
            template: template("agent:1"),
            rollout: Rollout { health_gate: gate, ..Default::default() },
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("monitoring".into());
    a.metadata.uid = Some("uid-na".into());
    a.metadata.generation = Some(1);
    a
}

fn context(
    client: kube::Client,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    revs: Vec<ControllerRevision>,
    probe: GateResult,
) -> (Arc<Context>, Vec<Box<dyn std::any::Any>>) {
    let (ns, nw) = filled(nodes);
    let (ps, pw) = filled(pods);
    let (rs, rw) = filled(revs);
    let mut ctx = Context::new(client, ns, ps, rs, Arc::new(FakeProbe(probe)), Arc::new(Metrics::new()));
    ctx.clock = || at(NOW);
    (Arc::new(ctx), vec![Box::new(nw), Box::new(pw), Box::new(rw)])
}

const NS: &str = "/api/v1/namespaces/monitoring";
const REVS: &str = "/apis/apps/v1/namespaces/monitoring/controllerrevisions";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/monitoring/events";
const NA: &str = "/apis/nodeagent.io/v1alpha1/namespaces/monitoring/nodeagents/node-agent";
const PC: &str = "/apis/scheduling.k8s.io/v1/priorityclasses";

fn event(reason: &'static str, kind: &'static str) -> Expect {
    expect(Method::POST, EVENTS).body(move |b| {
        assert_eq!(b["reason"], reason, "{b}");
        assert_eq!(b["type"], kind, "{b}");
        assert_eq!(b["regarding"]["kind"], "NodeAgent");
        assert_eq!(b["reportingController"], "node-agent-controller");
    })
}

#[tokio::test]
async fn first_sync_ensures_the_priority_class_records_the_revision_and_creates_pods_by_apply() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let a = agent(Some(HealthGate::default()));
    let agent_json = serde_json::to_value(&a).expect("json");
    let hash = template_hash(&a);
    let pod_a = pod_for(&a, "worker-a", &hash, &a.spec.template).name_any();
    let pod_b = pod_for(&a, "worker-b", &hash, &a.spec.template).name_any();
    let hash2 = hash.clone();
    let expected = vec![
        expect(Method::GET, format!("{PC}/node-agent-critical")).answer(404, not_found()),
        expect(Method::POST, PC).query(&["fieldManager=node-agent-controller"]).body(|b| {
            assert_eq!(b["metadata"]["name"], "node-agent-critical");
            assert_eq!(b["value"], 1_000_000_000);
            assert_eq!(b["globalDefault"], false);
            assert_eq!(b["preemptionPolicy"], "PreemptLowerPriority");
        }),
        expect(Method::PATCH, format!("{REVS}/node-agent-{hash}")).apply().body(move |b| {
            assert_eq!(b["revision"], 1);
            assert_eq!(b["metadata"]["labels"]["controller-revision-hash"], hash2.as_str());
            assert_eq!(b["metadata"]["labels"]["nodeagent.io/name"], "node-agent");
            assert_eq!(b["metadata"]["ownerReferences"][0]["kind"], "NodeAgent");
            assert_eq!(b["data"]["spec"]["template"]["spec"]["containers"][0]["image"], "agent:1");
        }),
        event("RevisionRecorded", "Normal"),
        // Slow start: a batch of one, then two (one left).
        expect(Method::PATCH, format!("{NS}/pods/{pod_a}")).apply().body(|b| {
            assert_eq!(
                b["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                    ["matchFields"][0]["values"][0],
                "worker-a"
            );
            assert_eq!(b["spec"]["priorityClassName"], "node-agent-critical");
            assert_eq!(b["spec"]["readinessGates"][0]["conditionType"], GATE_CONDITION);
            assert_eq!(b["metadata"]["ownerReferences"][0]["controller"], true);
        }),
        expect(Method::PATCH, format!("{NS}/pods/{pod_b}")).apply(),
        event("SuccessfulCreate", "Normal").body(|b| assert!(b["note"].as_str().unwrap_or("").contains("created 2 pod(s)"), "{b}")),
        expect(Method::PATCH, format!("{NA}/status"))
            .apply()
            .body(|b| {
                assert_eq!(b["kind"], "NodeAgent");
                let s = &b["status"];
                assert_eq!(s["desiredNumberScheduled"], 2);
                assert_eq!(s["currentNumberScheduled"], 0);
                assert_eq!(s["observedGeneration"], 1);
                assert_eq!(s["conditions"][1]["type"], "Progressing");
                assert_eq!(s["conditions"][1]["status"], "True");
            })
            .answer(200, agent_json.clone()),
    ];
    let server = serve(handle, expected);
    let (ctx, _writers) = context(client, vec![node("worker-a", &[], &[]), node("worker-b", &[], &[])], vec![], vec![], GateResult::Pass);
    let action = reconcile(Arc::new(a), ctx.clone()).await.expect("reconcile");
    server.await.expect("mock API server");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(5)));
    assert!(ctx.metrics.encode().contains("node_agent_controller_pods_created_total 2"));
}

fn gated_pod(a: &NodeAgent, node: &str, hash: &str, ready_since: i64) -> Pod {
    let mut p = pod_for(a, node, hash, &a.spec.template);
    p.metadata.creation_timestamp = Some(Time(at(ready_since - 10)));
    p.spec.as_mut().expect("spec").node_name = Some(node.into());
    let c = |t: &str, on: bool| PodCondition {
        type_: t.into(),
        status: if on { "True" } else { "False" }.into(),
        last_transition_time: Some(Time(at(ready_since))),
        ..Default::default()
    };
    p.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.2.3".into()),
        conditions: Some(vec![c("ContainersReady", true), c("Ready", false)]),
        ..Default::default()
    });
    p
}

#[tokio::test]
async fn a_gate_failing_past_its_deadline_halts_and_rolls_back_by_json_patch() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let mut a = agent(Some(HealthGate { deadline_seconds: 60, auto_rollback: true, ..Default::default() }));
    let old = template_hash(&a);
    let rev1 = revision_object(&a, &old, 1, &a.spec.template);
    let old_pod = {
        let mut p = gated_pod(&a, "worker-b", &old, 100);
        let conds = p.status.as_mut().and_then(|s| s.conditions.as_mut()).expect("conditions");
        for c in conds.iter_mut() {
            c.status = "True".into();
        }
        conds.push(PodCondition { type_: GATE_CONDITION.into(), status: "True".into(), ..Default::default() });
        p
    };
    a.spec.template = template("agent:bad");
    let bad = template_hash(&a);
    let rev2 = revision_object(&a, &bad, 2, &a.spec.template);
    a.status = Some(NodeAgentStatus { current_revision: Some(old.clone()), update_revision: Some(bad.clone()), ..Default::default() });
    let bad_pod = gated_pod(&a, "worker-a", &bad, NOW - 61);

    let (bad2, old2) = (bad.clone(), old.clone());
    a.metadata.resource_version = Some("7".into());
    let agent_json = serde_json::to_value(&a).expect("json");
    let expected = vec![
        expect(Method::GET, format!("{PC}/node-agent-critical")).answer(200, json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "node-agent-critical"}, "value": 1000})),
        event("RolloutHalted", "Warning").body(|b| {
            let note = b["note"].as_str().unwrap_or("");
            assert!(note.contains("on node worker-a failed the health gate for 60s: node_ebpf_program_up is 0 for sys_exit"), "{note}");
        }),
        // The halt is in the status before the template goes back.
        expect(Method::PATCH, format!("{NA}/status"))
            .apply()
            .body(move |b| {
                let s = &b["status"];
                assert_eq!(b["metadata"]["resourceVersion"], "7", "conditional on the version decided from");
                assert_eq!(s["haltedRevision"], bad2.as_str());
                assert_eq!(s["conditions"][0]["type"], "RolloutHalted");
                assert_eq!(s["conditions"][0]["status"], "True");
                assert_eq!(s["conditions"][0]["reason"], "HealthGateFailedRolledBack");
                let m = s["conditions"][0]["message"].as_str().unwrap_or("");
                assert!(m.ends_with(&format!("template rolled back to revision 1 ({old2})")), "{m}");
            })
            .answer(200, agent_json.clone()),
        expect(Method::PATCH, NA)
            .content_type("application/json-patch+json")
            .body(|b| {
                assert_eq!(b[0]["op"], "replace");
                assert_eq!(b[0]["path"], "/spec/template");
                assert_eq!(b[0]["value"]["spec"]["containers"][0]["image"], "agent:1");
            })
            .answer(200, agent_json),
        event("RolledBack", "Warning"),
    ];
    let server = serve(handle, expected);
    let (ctx, _writers) = context(
        client,
        vec![node("worker-a", &[], &[]), node("worker-b", &[], &[])],
        vec![bad_pod, old_pod],
        vec![rev1, rev2],
        GateResult::Fail("node_ebpf_program_up is 0 for sys_exit".into()),
    );
    reconcile(Arc::new(a), ctx.clone()).await.expect("reconcile");
    server.await.expect("mock API server");
    let m = ctx.metrics.encode();
    assert!(m.contains("node_agent_controller_rollout_halts_total 1"), "{m}");
    assert!(m.contains("node_agent_controller_rollbacks_total 1"), "{m}");
    assert!(m.contains("node_agent_controller_health_gate_checks_total{result=\"fail\"} 1"), "{m}");
}

/// A new leader whose pod list has not arrived decides nothing: no request
/// at all, a requeue; once the list is in, the same sync goes ahead.
#[tokio::test]
async fn nothing_is_decided_before_the_caches_hold_their_first_list() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let a = agent(None);
    let (ns, _nw) = filled(vec![node("worker-a", &[], &[])]);
    let (rs, _rw) = filled(Vec::<ControllerRevision>::new());
    // The pods' watcher has started its list and not finished it.
    let (ps, mut pw) = reflector::store::<Pod>();
    pw.apply_watcher_event(&watcher::Event::Init);
    let mut ctx = Context::new(client, ns, ps, rs, Arc::new(FakeProbe(GateResult::Pass)), Arc::new(Metrics::new()));
    ctx.clock = || at(NOW);
    let ctx = Arc::new(ctx);
    assert!(!ctx.synced());
    let server = serve(handle, vec![]);
    let action = reconcile(Arc::new(a.clone()), ctx.clone()).await.expect("a requeue, not an error");
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(1)));
    // No request was made: `serve` with nothing expected fails on any.
    server.await.expect("no request before the caches sync");
    pw.apply_watcher_event(&watcher::Event::InitDone);
    assert!(ctx.synced(), "ready once the first list is done");
}

/// A request RBAC or admission forbids (here OwnerReferencesPermissionEnforcement
/// on the revision's blockOwnerDeletion) is reported in the NodeAgent's
/// status as ReconcileFailed, with what to do, not only in the log.
#[tokio::test]
async fn a_forbidden_request_is_a_reconcile_failed_condition_in_the_status() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let mut a = agent(None);
    a.metadata.resource_version = Some("3".into());
    let hash = template_hash(&a);
    let forbidden = "controllerrevisions.apps \"node-agent-x\" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on";
    let expected = vec![
        expect(Method::GET, format!("{PC}/node-agent-critical")).answer(200, json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "node-agent-critical"}, "value": 1000})),
        expect(Method::PATCH, format!("{REVS}/node-agent-{hash}")).apply().answer(
            403,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403, "message": forbidden}),
        ),
        expect(Method::PATCH, format!("{NA}/status")).apply().body(move |b| {
            assert_eq!(b["metadata"]["resourceVersion"], "3");
            let c = b["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "ReconcileFailed")).cloned().unwrap_or_default();
            assert_eq!(c["status"], "True", "{b}");
            assert_eq!(c["reason"], "Forbidden");
            let m = c["message"].as_str().unwrap_or("");
            assert!(m.starts_with(forbidden) && m.contains("deploy/overlays/controller"), "{m}");
        }),
    ];
    let server = serve(handle, expected);
    let (ctx, _writers) = context(client, vec![node("worker-a", &[], &[])], vec![], vec![], GateResult::Pass);
    let err = reconcile(Arc::new(a), ctx.clone()).await.expect_err("a 403 fails the sync");
    server.await.expect("mock API server");
    assert_eq!(err.metric_label(), "forbidden");
}

/// Events carry each decision's own note: the same note again is a series
/// on its event, a different note (a second halt, another revision) is a
/// new event, where kube-runtime's recorder would count it into the first.
#[tokio::test]
async fn each_distinct_note_is_its_own_event_and_a_repeat_is_a_series() {
    use controller::events::{Event, EventType, Recorder};
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let a = agent(None);
    let expected = vec![
        event("RolloutHalted", "Warning").body(|b| {
            assert_eq!(b["note"], "revision r1: pod a failed");
            assert!(b["series"].is_null());
        }),
        event("RolloutHalted", "Warning").body(|b| assert_eq!(b["note"], "revision r2: pod b failed", "a new note is a new event")),
        // The first note again: a series on its event, not a new one.
        expect(Method::PATCH, format!("{EVENTS}/node-agent.*")).content_type("application/merge-patch+json").body(|b| {
            assert_eq!(b["series"]["count"], 2, "{b}");
            assert!(b["series"]["lastObservedTime"].is_string());
        }),
        expect(Method::PATCH, format!("{EVENTS}/node-agent.*")).body(|b| assert_eq!(b["series"]["count"], 3, "{b}")),
    ];
    let server = serve(handle, expected);
    let rec = Recorder::new(client, "node-agent-controller".into(), None);
    let reference = kube::Resource::object_ref(&a, &());
    let ev = |note: &str| Event { type_: EventType::Warning, reason: "RolloutHalted".into(), action: "Halt".into(), note: note.into() };
    rec.publish(&ev("revision r1: pod a failed"), &reference).await.expect("first");
    rec.publish(&ev("revision r2: pod b failed"), &reference).await.expect("second");
    rec.publish(&ev("revision r1: pod a failed"), &reference).await.expect("repeat");
    rec.publish(&ev("revision r1: pod a failed"), &reference).await.expect("repeat");
    server.await.expect("mock API server");
}

#[tokio::test]
async fn a_server_error_fails_the_sync_and_no_later_step_runs() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let a = agent(None);
    let hash = template_hash(&a);
    let pod_a = pod_for(&a, "worker-a", &hash, &a.spec.template).name_any();
    let expected = vec![
        expect(Method::GET, format!("{PC}/node-agent-critical")).answer(200, json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "node-agent-critical"}, "value": 1000})),
        expect(Method::PATCH, format!("{REVS}/node-agent-{hash}")).apply(),
        event("RevisionRecorded", "Normal"),
        expect(Method::PATCH, format!("{NS}/pods/{pod_a}")).apply().answer(
            500,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "InternalError", "code": 500, "message": "etcd timeout"}),
        ),
        // Slow start: the failed first batch stops the second; a Warning says so; no status write.
        event("FailedCreate", "Warning"),
    ];
    let server = serve(handle, expected);
    let (ctx, _writers) = context(client, vec![node("worker-a", &[], &[]), node("worker-b", &[], &[])], vec![], vec![], GateResult::Pass);
    let err = reconcile(Arc::new(a.clone()), ctx.clone()).await.expect_err("a 500 fails the sync");
    server.await.expect("mock API server");
    assert!(err.to_string().contains("etcd timeout"), "{err}");
    let action = controller::reconcile::error_policy(Arc::new(a), &err, ctx.clone());
    assert_eq!(action, kube::runtime::controller::Action::requeue(Duration::from_secs(5)));
    assert!(ctx.metrics.encode().contains("node_agent_controller_reconcile_errors_total{reason=\"api_unavailable\"} 1"));
}

fn lease_json(holder: &str, renewed: i64, rv: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "node-agent-controller", "namespace": "monitoring", "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": Timestamp::from_second(renewed).expect("ts").to_string(), "acquireTime": Timestamp::from_second(renewed).expect("ts").to_string(), "leaseTransitions": 3}
    })
}

#[tokio::test]
async fn the_lease_is_taken_only_when_free_or_expired_and_a_lost_race_is_not_leadership() {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let lock =
        LeaseLock::new(Api::<Lease>::namespaced(client, "monitoring"), "node-agent-controller", "replica-a", Duration::from_secs(15));
    let path = "/apis/coordination.k8s.io/v1/namespaces/monitoring/leases";
    let conflict = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"});
    let expected = vec![
        // 1. No lease: create it.
        expect(Method::GET, format!("{path}/node-agent-controller")).answer(404, not_found()),
        expect(Method::POST, path).body(|b| {
            assert_eq!(b["spec"]["holderIdentity"], "replica-a");
            assert_eq!(b["spec"]["leaseDurationSeconds"], 15);
            assert_eq!(b["spec"]["leaseTransitions"], 0);
        }),
        // 2. Held by replica-b, renewed 5 s ago: stand by, no write.
        expect(Method::GET, format!("{path}/node-agent-controller")).answer(200, lease_json("replica-b", NOW - 5, "7")),
        // 3. Held by replica-b, expired: take it over with its resourceVersion.
        expect(Method::GET, format!("{path}/node-agent-controller")).answer(200, lease_json("replica-b", NOW - 60, "8")),
        expect(Method::PUT, format!("{path}/node-agent-controller")).body(|b| {
            assert_eq!(b["metadata"]["resourceVersion"], "8");
            assert_eq!(b["spec"]["holderIdentity"], "replica-a");
            assert_eq!(b["spec"]["leaseTransitions"], 4);
        }),
        // 4. Expired, but another replica wins the race (409): not leader.
        expect(Method::GET, format!("{path}/node-agent-controller")).answer(200, lease_json("replica-b", NOW - 60, "9")),
        expect(Method::PUT, format!("{path}/node-agent-controller")).answer(409, conflict),
        // 5. Ours: renew, keeping acquireTime and transitions.
        expect(Method::GET, format!("{path}/node-agent-controller")).answer(200, lease_json("replica-a", NOW - 5, "10")),
        expect(Method::PUT, format!("{path}/node-agent-controller")).body(|b| {
            assert_eq!(b["spec"]["leaseTransitions"], 3);
            assert_eq!(b["spec"]["renewTime"], Timestamp::from_second(NOW).expect("ts").to_string().replace('Z', ".000000Z"));
        }),
    ];
    let server = serve(handle, expected);
    let now = at(NOW);
    assert!(lock.try_acquire_or_renew(now).await.expect("1"));
    assert!(!lock.try_acquire_or_renew(now).await.expect("2"));
    assert!(lock.try_acquire_or_renew(now).await.expect("3"));
    assert!(!lock.try_acquire_or_renew(now).await.expect("4"));
    assert!(lock.try_acquire_or_renew(now).await.expect("5"));
    server.await.expect("mock API server");
}

#[tokio::test]
async fn rollout_undo_puts_the_previous_template_back_and_resume_clears_a_halt() {
    use node_agent::cmd::rollout::{command as rollout_command, run_with as rollout_cmd};
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let mut a = agent(None);
    let rev1 = revision_object(&a, &template_hash(&a), 1, &a.spec.template);
    a.spec.template = template("agent:2");
    let rev2 = revision_object(&a, &template_hash(&a), 2, &a.spec.template);
    let agent_json = serde_json::to_value(&a).expect("json");
    let mut halted = a.clone();
    halted.metadata.resource_version = Some("9".into());
    halted.status = Some(NodeAgentStatus {
        halted_revision: Some(template_hash(&a)),
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "RolloutHalted".into(),
            status: "True".into(),
            reason: "HealthGateFailed".into(),
            message: "pod x failed".into(),
            last_transition_time: Time(at(NOW - 100)),
            observed_generation: None,
        }],
        ..Default::default()
    });
    let halted_json = serde_json::to_value(&halted).expect("json");
    let list =
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevisionList", "metadata": {"resourceVersion": "1"}, "items": [rev1, rev2]});
    let expected = vec![
        expect(Method::GET, NA).answer(200, agent_json.clone()),
        expect(Method::GET, REVS).query(&["labelSelector=nodeagent.io%2Fname%3Dnode-agent"]).answer(200, list),
        expect(Method::PATCH, NA)
            .content_type("application/json-patch+json")
            .body(|b| {
                assert_eq!(b[0]["op"], "replace");
                assert_eq!(b[0]["value"]["spec"]["containers"][0]["image"], "agent:1");
            })
            .answer(200, agent_json.clone()),
        expect(Method::PATCH, NA)
            .content_type("application/merge-patch+json")
            .body(|b| assert_eq!(b, &json!({"spec": {"rollout": {"paused": false}}})))
            .answer(200, agent_json.clone()),
        // Resume reads the object, then clears the halt conditionally on
        // that version; a conflict (the controller wrote meanwhile) reads again.
        expect(Method::GET, NA).answer(200, halted_json.clone()),
        expect(Method::PATCH, format!("{NA}/status")).content_type("application/merge-patch+json").answer(
            409,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
        ),
        expect(Method::GET, NA).answer(200, halted_json.clone()),
        expect(Method::PATCH, format!("{NA}/status"))
            .content_type("application/merge-patch+json")
            .body(|b| {
                assert_eq!(b["metadata"]["resourceVersion"], "9");
                assert!(b["status"]["haltedRevision"].is_null(), "{b}");
                assert!(b["status"]["resumedAt"].is_string(), "{b}");
                assert_eq!(b["status"]["conditions"][0]["type"], "RolloutHalted");
                assert_eq!(b["status"]["conditions"][0]["status"], "False");
                assert_eq!(b["status"]["conditions"][0]["reason"], "Resumed");
            })
            .answer(200, halted_json),
    ];
    let server = serve(handle, expected);
    let m = rollout_command().no_binary_name(true).try_get_matches_from(["undo", "node-agent"]).expect("args");
    let (_, sub) = m.subcommand().expect("sub");
    rollout_cmd(client.clone(), "undo", sub, "monitoring", "node-agent").await.expect("undo");
    let m = rollout_command().no_binary_name(true).try_get_matches_from(["resume", "node-agent"]).expect("args");
    let (_, sub) = m.subcommand().expect("sub");
    rollout_cmd(client, "resume", sub, "monitoring", "node-agent").await.expect("resume");
    server.await.expect("mock API server");
}
