//! The reconcile loop: read the informers' stores, scrape health gates,
//! decide (pure, `rollout::decide`), then act through the API with
//! server-side apply, bounded and slow-started, with Events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition, PodStatus};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use super::crd::{NodeAgent, NodeAgentStatus, FIELD_MANAGER, GATE_CONDITION};
use super::events::{Event, EventType, Recorder};
use super::gate::Probe;
use super::metrics::Metrics;
use super::migration;
use super::rollout::{self, Decision, Expectations, GateResult, Observed, Replaced};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("NodeAgent {0} is invalid: {1}")]
    Invalid(String, String),
}

impl Error {
    /// The `reason` label of `node_agent_controller_reconcile_errors_total`:
    /// one of a fixed set (invalid, forbidden, conflict, not_found,
    /// api_unavailable, api_rejected, transport).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Invalid(..) => "invalid",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Error::Kube(kube::Error::Api(s)) if s.code == 429 || s.code >= 500 => "api_unavailable",
            Error::Kube(kube::Error::Api(_)) => "api_rejected",
            Error::Kube(_) => "transport",
        }
    }
}

/// Requeue while a rollout moves, and otherwise now and then.
pub const ACTIVE_REQUEUE: Duration = Duration::from_secs(5);
pub const IDLE_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue while a taken node's old exporter pod is going.
pub const MIGRATION_REQUEUE: Duration = Duration::from_secs(1);
/// Health gates scraped at once.
const GATE_CONCURRENCY: usize = 16;
/// Failed-pod deletion backoff per node: 1s doubling to 15 min, as upstream.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(900);

/// What the reconciler needs: the client, the informers' stores, the gate
/// probe, metrics, and the per-node backoff.
pub struct Context {
    pub client: Client,
    pub nodes: Store<Node>,
    pub pods: Store<Pod>,
    pub revisions: Store<ControllerRevision>,
    pub probe: Arc<dyn Probe>,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    pub clock: fn() -> Timestamp,
    backoff: Mutex<BTreeMap<String, (Duration, Instant)>>,
    priority_ensured: Mutex<Vec<String>>,
    expectations: Mutex<BTreeMap<String, Expectations>>,
    /// Per NodeAgent, the resourceVersion its last status write was made
    /// from: while the cache still shows that version, it has not seen the
    /// write, and a sync from it would only conflict.
    written_from: Mutex<BTreeMap<String, String>>,
}

impl Context {
    /// Whether the node, pod and revision caches hold their first full list.
    pub fn synced(&self) -> bool {
        use futures::FutureExt as _;
        let ready = |w: Option<Result<(), kube::runtime::reflector::store::WriterDropped>>| matches!(w, Some(Ok(())));
        ready(self.nodes.wait_until_ready().now_or_never())
            && ready(self.pods.wait_until_ready().now_or_never())
            && ready(self.revisions.wait_until_ready().now_or_never())
    }

    pub fn new(
        client: Client,
        nodes: Store<Node>,
        pods: Store<Pod>,
        revisions: Store<ControllerRevision>,
        probe: Arc<dyn Probe>,
        metrics: Arc<Metrics>,
    ) -> Context {
        Context {
            recorder: Recorder::new(client.clone(), FIELD_MANAGER.into(), std::env::var("POD_NAME").ok()),
            client,
            nodes,
            pods,
            revisions,
            probe,
            metrics,
            clock: Timestamp::now,
            backoff: Mutex::new(BTreeMap::new()),
            priority_ensured: Mutex::new(Vec::new()),
            expectations: Mutex::new(BTreeMap::new()),
            written_from: Mutex::new(BTreeMap::new()),
        }
    }

    fn backed_off(&self, key: &str) -> bool {
        self.backoff.lock().map(|b| b.get(key).is_some_and(|(_, until)| Instant::now() < *until)).unwrap_or(false)
    }

    fn back_off(&self, key: String) {
        if let Ok(mut b) = self.backoff.lock() {
            let next = b.get(&key).map(|(d, _)| (*d * 2).min(BACKOFF_MAX)).unwrap_or(BACKOFF_START);
            b.insert(key, (next, Instant::now() + next));
        }
    }
}

fn objects<K>(store: &Store<K>, namespace: Option<&str>) -> Vec<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().filter(|o| namespace.is_none() || o.meta().namespace.as_deref() == namespace).map(|o| (**o).clone()).collect()
}

async fn ensure_priority_class(ctx: &Context, agent: &NodeAgent) -> Result<(), Error> {
    let p = &agent.spec.priority;
    if ctx.priority_ensured.lock().map(|v| v.contains(&p.class_name)).unwrap_or(false) {
        return Ok(());
    }
    let api: Api<PriorityClass> = Api::all(ctx.client.clone());
    if api.get_opt(&p.class_name).await?.is_none() {
        let pc = PriorityClass {
            metadata: ObjectMeta {
                name: Some(p.class_name.clone()),
                labels: Some([("app.kubernetes.io/managed-by".to_string(), FIELD_MANAGER.to_string())].into()),
                ..Default::default()
            },
            value: p.value,
            global_default: Some(false),
            preemption_policy: Some("PreemptLowerPriority".into()),
            description: Some("node-agent: per-node observability agents; preempts workloads so every node keeps its agent.".into()),
        };
        match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &pc).await {
            Ok(_) => tracing::info!(priority_class = %p.class_name, value = p.value, "created PriorityClass"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Ok(mut v) = ctx.priority_ensured.lock() {
        v.push(p.class_name.clone());
    }
    Ok(())
}

async fn publish(recorder: &Recorder, agent: &NodeAgent, type_: EventType, reason: &str, action: &str, note: String) {
    let ev = Event { type_, reason: reason.into(), action: action.into(), note };
    if let Err(e) = recorder.publish(&ev, &agent.object_ref(&())).await {
        tracing::warn!(reason, error = %e, "could not publish event");
    }
}

fn names(v: impl Iterator<Item = String>) -> String {
    let all: Vec<String> = v.collect();
    let shown: Vec<&str> = all.iter().take(10).map(String::as_str).collect();
    if all.len() > shown.len() {
        format!("{} and {} more", shown.join(", "), all.len() - shown.len())
    } else {
        shown.join(", ")
    }
}

/// One sync of one NodeAgent.
pub async fn reconcile(agent: Arc<NodeAgent>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = agent.namespace().unwrap_or_else(|| "default".into());
    let name = agent.name_any();
    ctx.metrics.reconciles.inc();
    let result = sync(&agent, &ctx, &ns, &name).await;
    if let Err(e) = &result {
        if let Some((reason, message)) = failure_condition(e) {
            record_failure(&agent, &ctx, reason, message).await;
        }
    }
    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
    result
}

/// The ReconcileFailed reason and message for errors a retry will not fix:
/// an invalid spec, a request RBAC or admission forbade, one the API server
/// rejected. Conflicts, 5xx and transport errors are retried, not reported.
pub fn failure_condition(e: &Error) -> Option<(&'static str, String)> {
    match e {
        Error::Invalid(_, m) => Some(("InvalidSpec", m.clone())),
        Error::Kube(kube::Error::Api(s)) if s.code == 403 => Some((
            "Forbidden",
            format!(
                "{}: the controller's ServiceAccount may not do this; the ClusterRole in deploy/overlays/controller grants what the controller needs, and deploy/overlays/takeover what taking over a DaemonSet adds",
                s.message
            ),
        )),
        Error::Kube(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => Some(("Rejected", s.message.clone())),
        _ => None,
    }
}

/// Writes ReconcileFailed=True into the status (the rest as it was); a
/// failure to write it is logged, the sync's own error stands.
async fn record_failure(agent: &NodeAgent, ctx: &Context, reason: &str, message: String) {
    let status = rollout::failed_status(agent, reason, message, (ctx.clock)());
    if agent.status.as_ref() == Some(&status) {
        return;
    }
    let ns = agent.namespace().unwrap_or_else(|| "default".into());
    let agents: Api<NodeAgent> = Api::namespaced(ctx.client.clone(), &ns);
    if let Err(e) = write_status(ctx, &agents, agent, &status).await {
        tracing::warn!(nodeagent = %agent.name_any(), error = %e, "could not record the failure in the status");
    }
}

async fn sync(agent: &NodeAgent, ctx: &Context, ns: &str, name: &str) -> Result<Action, Error> {
    if agent.metadata.deletion_timestamp.is_some() {
        // Pods and revisions go with their owner (garbage collection).
        return Ok(Action::await_change());
    }
    // Decide only on full caches, as the upstream controller waits for its
    // informers to sync before its workers start: a new leader whose pod or
    // revision list has not arrived would otherwise see no pods and no
    // revision for the current hash, and roll out at once.
    if !ctx.synced() {
        tracing::debug!(nodeagent = %format!("{ns}/{name}"), "waiting for the node, pod and revision caches to sync");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    ensure_priority_class(ctx, agent).await?;
    let mut nodes = objects(&ctx.nodes, None);
    // The informer's order is arbitrary; syncs are deterministic by node name.
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let pods = objects(&ctx.pods, Some(ns));
    let revisions = objects(&ctx.revisions, Some(ns));

    // Act only on a view that shows this controller's last creates and
    // deletes, and its last status write.
    let key = format!("{ns}/{name}");
    let unseen_write = ctx
        .written_from
        .lock()
        .ok()
        .and_then(|w| w.get(&key).cloned())
        .is_some_and(|rv| agent.metadata.resource_version.as_deref() == Some(rv.as_str()));
    if unseen_write {
        tracing::debug!(nodeagent = %key, "waiting for the informer to show the last status write");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let waiting = ctx.expectations.lock().ok().and_then(|e| e.get(&key).cloned()).is_some_and(|e| !e.satisfied(&pods, (ctx.clock)()));
    if waiting {
        tracing::debug!(nodeagent = %key, "waiting for the informer to show the last sync's pods");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // A takeover: the replaced DaemonSet and its pods, read at the source
    // (they are the user's objects: no informer holds them).
    let (replaced, old_pods) = match &agent.spec.replaces {
        Some(r) => replaced(ctx, r).await?,
        None => (None, Vec::new()),
    };

    // Health gates, scraped concurrently; on a node taken from a replaced
    // exporter, the gate also requires what that exporter served there.
    let mut targets = rollout::gate_targets(agent, &pods);
    if agent.spec.replaces.is_some() {
        for t in &mut targets {
            t.expect = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(t.node.as_str())).and_then(migration::expected);
        }
    }
    let mut gate = BTreeMap::new();
    if let Some(g) = &agent.spec.rollout.health_gate {
        let results: Vec<(String, GateResult)> = futures::stream::iter(targets)
            .map(|t| {
                let probe = ctx.probe.clone();
                let g = g.clone();
                async move {
                    let r = probe.probe(&t, &g).await;
                    (t.pod, r)
                }
            })
            .buffer_unordered(GATE_CONCURRENCY)
            .collect()
            .await;
        for (pod, r) in results {
            let outcome = if r == GateResult::Pass { "pass" } else { "fail" };
            ctx.metrics.gate_checks.get_or_create(&vec![("result".to_string(), outcome.to_string())]).inc();
            gate.insert(pod, r);
        }
    }

    let now = (ctx.clock)();
    let backoff_key = |node: &str| format!("{ns}/{name}/{node}");
    let backoff = |node: &str| ctx.backed_off(&backoff_key(node));
    let seen = agent.spec.replaces.as_ref().map(|_| Replaced { daemonset: replaced.as_ref(), pods: &old_pods });
    let d = rollout::decide(&Observed {
        agent,
        nodes: &nodes,
        pods: &pods,
        revisions: &revisions,
        gate: &gate,
        backoff: &backoff,
        now,
        replaced: seen,
    })
    .map_err(|e| Error::Invalid(format!("{ns}/{name}"), e.to_string()))?;
    let outcome = act(agent, ctx, ns, &d, now).await;
    let (created, deleted) = match &outcome {
        Ok(done) | Err((done, _)) => done.clone(),
    };
    if let Ok(mut e) = ctx.expectations.lock() {
        e.insert(key, Expectations::new(&created, &deleted, now));
    }
    outcome.map_err(|(_, e)| e)?;
    ctx.metrics.set_progress(
        ns,
        name,
        d.status.updated_number_scheduled,
        d.status.desired_number_scheduled,
        d.status.halted_revision.is_some(),
    );
    // A node waiting for the replaced exporter's pod to go (whose deletion
    // no informer here sees) is looked at again within a second.
    let waiting_on_old = d.migration.as_ref().is_some_and(|m| m.waiting_on_old);
    Ok(if waiting_on_old {
        Action::requeue(MIGRATION_REQUEUE)
    } else if d.progressing {
        Action::requeue(ACTIVE_REQUEUE)
    } else {
        Action::requeue(IDLE_REQUEUE)
    })
}

/// The replaced DaemonSet (None once deleted) and the pods it controls.
async fn replaced(ctx: &Context, r: &super::crd::Replaces) -> Result<(Option<DaemonSet>, Vec<Pod>), Error> {
    let ds = Api::<DaemonSet>::namespaced(ctx.client.clone(), &r.namespace).get_opt(&r.name).await?;
    let Some(ds) = ds else { return Ok((None, Vec::new())) };
    let selector = ds.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let uid = ds.metadata.uid.clone();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &r.namespace).list(&ListParams::default().labels(&selector.join(","))).await?;
    let owned = pods
        .items
        .into_iter()
        .filter(|p| p.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref()))
        .collect();
    Ok((Some(ds), owned))
}

/// The takeover's steps, before the pods': the replaced DaemonSet prepared
/// or put back, nodes sent back (before their agent pods are deleted, so a
/// new leader sees why), nodes released, then the nodes taken, each after
/// its old exporter is read.
async fn migrate(agent: &NodeAgent, ctx: &Context, m: &migration::Plan) -> Result<(), Error> {
    let Some(r) = &agent.spec.replaces else { return Ok(()) };
    let recorder = &ctx.recorder;
    let replaced = format!("{}/{}", r.namespace, r.name);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let merge = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    if let Some(patch) = &m.daemonset_patch {
        let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &r.namespace);
        let (what, result) = if patch.is_array() {
            let p: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|e| Error::Invalid(replaced.clone(), e.to_string()))?;
            ("put back as it was", api.patch(&r.name, &merge, &Patch::Json::<()>(p)).await)
        } else {
            ("set to OnDelete and to exclude the nodes taken", api.patch(&r.name, &merge, &Patch::Merge(patch)).await)
        };
        match result {
            Ok(_) => publish(recorder, agent, EventType::Normal, "ReplacedDaemonSetChanged", "Migrate", format!("{replaced} {what}")).await,
            // Changed since it was read: the next sync reads it again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some((node, message)) = &m.halt {
        ctx.metrics.halts.inc();
        tracing::warn!(nodeagent = %agent.name_any(), node = %node, "takeover halted by the health gate");
        publish(recorder, agent, EventType::Warning, "RolloutHalted", "Halt", message.clone()).await;
    }
    for n in &m.give_back {
        nodes.patch(n, &merge, &Patch::Merge(migration::give_back_patch())).await?;
    }
    if !m.give_back.is_empty() {
        publish(
            recorder,
            agent,
            EventType::Normal,
            "MigrationGivingBack",
            "Migrate",
            format!("giving back to {replaced}: {}", names(m.give_back.iter().cloned())),
        )
        .await;
    }
    for n in &m.release {
        nodes.patch(n, &merge, &Patch::Merge(migration::release_patch())).await?;
    }
    if !m.release.is_empty() {
        publish(
            recorder,
            agent,
            EventType::Normal,
            "MigrationGivenBack",
            "Migrate",
            format!("given back to {replaced}: {}", names(m.release.iter().cloned())),
        )
        .await;
    }
    for t in &m.take {
        let snapshot = match &t.read {
            Some(ip) => match ctx.probe.read_exporter(ip, r.port).await {
                Ok(s) => Some(s),
                Err(why) => {
                    // The node waits; the next sync reads it again.
                    publish(
                        recorder,
                        agent,
                        EventType::Warning,
                        "MigrationWaiting",
                        "Migrate",
                        format!("node {}: {replaced}'s pod could not be read ({why}); the node moves once it can be", t.node),
                    )
                    .await;
                    continue;
                }
            },
            None => None,
        };
        let patch = migration::take_patch(snapshot.as_ref().map(|s| (&s.families, &s.collectors)));
        nodes.patch(&t.node, &merge, &Patch::Merge(patch)).await?;
        let compared = snapshot.as_ref().map(|s| s.families.iter().filter(|f| migration::compared(f)).count());
        publish(
            recorder,
            agent,
            EventType::Normal,
            "MigrationNodeTaken",
            "Migrate",
            match compared {
                Some(n) => format!("node {} taken from {replaced}; the agent must serve its {n} families", t.node),
                None => format!("node {} taken from {replaced} (no ready pod of it there: nothing to compare)", t.node),
            },
        )
        .await;
    }
    Ok(())
}

/// Pods created and deleted (by name), also when a later step failed.
type Done = (Vec<String>, Vec<String>);

async fn act(agent: &NodeAgent, ctx: &Context, ns: &str, d: &Decision, now: Timestamp) -> Result<Done, (Done, Error)> {
    let mut done: Done = (Vec::new(), Vec::new());
    let r = act_steps(agent, ctx, ns, d, now, &mut done).await;
    match r {
        Ok(()) => Ok(done),
        Err(e) => Err((done, e)),
    }
}

async fn act_steps(agent: &NodeAgent, ctx: &Context, ns: &str, d: &Decision, now: Timestamp, done: &mut Done) -> Result<(), Error> {
    let recorder = &ctx.recorder;
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let revs: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), ns);
    let agents: Api<NodeAgent> = Api::namespaced(ctx.client.clone(), ns);
    let name = agent.name_any();

    // A node that failed its gate goes back, and the halt is what says why:
    // it is in the status before the node's label changes, so no failed
    // write can send the node back without halting the takeover.
    let halt_first = d.migration.as_ref().is_some_and(|m| m.halt.is_some());
    if halt_first && agent.status.as_ref() != Some(&d.status) {
        write_status(ctx, &agents, agent, &d.status).await?;
    }
    if let Some(m) = &d.migration {
        migrate(agent, ctx, m).await?;
    }

    if let Some(rev) = &d.revision {
        let rname = rev.name_any();
        revs.patch(&rname, &apply, &Patch::Apply(rev)).await?;
        publish(
            recorder,
            agent,
            EventType::Normal,
            "RevisionRecorded",
            "Record",
            format!("revision {} is template {}", rev.revision, d.update_hash),
        )
        .await;
    }

    for p in &d.gate_passed {
        let status = Pod {
            metadata: ObjectMeta { name: Some(p.clone()), namespace: Some(ns.into()), ..Default::default() },
            spec: None,
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: GATE_CONDITION.into(),
                    status: "True".into(),
                    reason: Some("HealthGatePassed".into()),
                    last_transition_time: Some(Time(now)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        };
        match pods.patch_status(p, &apply, &Patch::Apply(&status)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if !d.gate_passed.is_empty() {
        publish(
            recorder,
            agent,
            EventType::Normal,
            "HealthGatePassed",
            "Gate",
            format!("{} pod(s) passed the health gate: {}", d.gate_passed.len(), names(d.gate_passed.iter().cloned())),
        )
        .await;
    }

    if let Some(h) = &d.halt {
        ctx.metrics.halts.inc();
        tracing::warn!(nodeagent = %name, revision = %d.update_hash, pod = %h.pod, node = %h.node, "rollout halted by the health gate");
        publish(recorder, agent, EventType::Warning, "RolloutHalted", "Halt", format!("revision {}: {}", d.update_hash, h.message)).await;
    }
    if let Some((number, template)) = &d.rollback {
        // The halt is in the status before the template goes back: no reader
        // sees the rollback without the halt that caused it.
        write_status(ctx, &agents, agent, &d.status).await?;
        let patch = json!([{ "op": "replace", "path": "/spec/template", "value": template }]);
        agents
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Json::<()>(
                    serde_json::from_value::<json_patch::Patch>(patch).map_err(|e| Error::Invalid(name.clone(), e.to_string()))?,
                ),
            )
            .await?;
        ctx.metrics.rollbacks.inc();
        publish(
            recorder,
            agent,
            EventType::Warning,
            "RolledBack",
            "Rollback",
            format!("template put back to revision {number} ({}) after the health gate halted {}", d.current_hash, d.update_hash),
        )
        .await;
    }

    // Creates in slow-start batches (1, 2, 4, ...): a failing batch stops the rest.
    let mut created = Vec::new();
    let mut batch = 1usize;
    let mut i = 0usize;
    let mut create_error = None;
    while i < d.creates.len() && create_error.is_none() {
        let chunk = &d.creates[i..(i + batch).min(d.creates.len())];
        let results = futures::future::join_all(chunk.iter().map(|c| {
            let pods = pods.clone();
            let apply = apply.clone();
            async move { pods.patch(&c.pod.name_any(), &apply, &Patch::Apply(&c.pod)).await.map(|_| (c.node.clone(), c.pod.name_any())) }
        }))
        .await;
        for r in results {
            match r {
                Ok((node, pod)) => {
                    created.push(node);
                    done.0.push(pod);
                }
                Err(e) => create_error = Some(e),
            }
        }
        i += chunk.len();
        batch *= 2;
    }
    ctx.metrics.pods_created.inc_by(created.len() as u64);
    if !created.is_empty() {
        let revs: std::collections::BTreeSet<&str> = d.creates.iter().map(|c| c.hash.as_str()).collect();
        publish(
            recorder,
            agent,
            EventType::Normal,
            "SuccessfulCreate",
            "Create",
            format!(
                "created {} pod(s) (revision {}) on {}",
                created.len(),
                revs.into_iter().collect::<Vec<_>>().join(", "),
                names(created.into_iter())
            ),
        )
        .await;
    }
    if let Some(e) = create_error {
        publish(recorder, agent, EventType::Warning, "FailedCreate", "Create", format!("creating pods stopped: {e}")).await;
        return Err(e.into());
    }

    let mut deleted = Vec::new();
    for del in &d.deletes {
        if del.failed {
            ctx.back_off(format!("{ns}/{name}/{}", del.node));
        }
        match pods.delete(&del.pod, &DeleteParams::default()).await {
            Ok(_) => {
                done.1.push(del.pod.clone());
                deleted.push(format!("{} ({})", del.pod, del.reason));
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                publish(recorder, agent, EventType::Warning, "FailedDelete", "Delete", format!("deleting {}: {e}", del.pod)).await;
                return Err(e.into());
            }
        }
    }
    ctx.metrics.pods_deleted.inc_by(deleted.len() as u64);
    if !deleted.is_empty() {
        publish(
            recorder,
            agent,
            EventType::Normal,
            "SuccessfulDelete",
            "Delete",
            format!("deleted {} pod(s): {}", deleted.len(), names(deleted.into_iter())),
        )
        .await;
    }

    for r in &d.prune {
        match revs.delete(r, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }

    // (With a rollback or a takeover's halt the status went out before
    // them, and the object has moved on since: the next sync writes the
    // next one.)
    if agent.status.as_ref() != Some(&d.status) && d.rollback.is_none() && !halt_first {
        write_status(ctx, &agents, agent, &d.status).await?;
    }
    Ok(())
}

/// Applies the whole status, on the condition that the NodeAgent is still
/// the version the decision was made from: a `rollout resume` (or another
/// writer) in between makes it a conflict, and the next sync decides again
/// instead of writing back a halt that was just cleared.
async fn write_status(ctx: &Context, agents: &Api<NodeAgent>, agent: &NodeAgent, status: &NodeAgentStatus) -> Result<(), Error> {
    let name = agent.name_any();
    let mut metadata = json!({ "name": name });
    if let Some(rv) = &agent.metadata.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    let body = json!({ "apiVersion": NodeAgent::api_version(&()), "kind": NodeAgent::kind(&()), "metadata": metadata, "status": status });
    agents.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    if let (Some(rv), Ok(mut w)) = (&agent.metadata.resource_version, ctx.written_from.lock()) {
        w.insert(format!("{}/{name}", agent.namespace().unwrap_or_else(|| "default".into())), rv.clone());
    }
    Ok(())
}

/// On error: count it, log it, retry soon.
pub fn error_policy(agent: Arc<NodeAgent>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(err.metric_label());
    tracing::warn!(nodeagent = %agent.name_any(), error = %err, "reconcile failed; retrying");
    Action::requeue(ACTIVE_REQUEUE)
}

#[cfg(test)]
mod tests {
    use super::Error;

    fn api(code: u16) -> Error {
        Error::Kube(kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() })))
    }

    #[test]
    fn error_reasons_are_a_fixed_set() {
        assert_eq!(Error::Invalid("a".into(), "b".into()).metric_label(), "invalid");
        assert_eq!(api(403).metric_label(), "forbidden");
        assert_eq!(api(409).metric_label(), "conflict");
        assert_eq!(api(404).metric_label(), "not_found");
        assert_eq!(api(500).metric_label(), "api_unavailable");
        assert_eq!(api(429).metric_label(), "api_unavailable");
        assert_eq!(api(422).metric_label(), "api_rejected");
        assert_eq!(Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded).metric_label(), "transport");
    }
}
