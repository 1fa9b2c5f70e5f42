//! One sync of the NodeAgent controller as a pure function: the DaemonSet
//! planner (manage, rolling update, status) with the NodeAgent's rollout
//! safety on top — partition, pause, waves, the health gate's halt and
//! rollback — and the revision history. No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodReadinessGate, PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::crd::{HealthGate, NodeAgent, NodeAgentStatus, GATE_CONDITION};
use super::migration;
use planner::plan::{self, Action, Invalid, Options, REVISION_LABEL};
use planner::scheduling::daemon_tolerations;

/// The condition type that says the last sync failed for a reason a person
/// must fix (an invalid spec, a forbidden or rejected request).
pub const FAILED_CONDITION: &str = "ReconcileFailed";

/// Characters a condition's message keeps.
pub const MAX_MESSAGE: usize = 1024;

/// The RolloutHalted reason of a halt the controller rolled back.
pub const REASON_ROLLED_BACK: &str = "HealthGateFailedRolledBack";

/// Old revisions kept when the spec does not say.
pub const DEFAULT_HISTORY_LIMIT: usize = 10;

/// The outcome of one pod's health gate this sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateResult {
    Pass,
    Fail(String),
}

/// A pod whose health gate is to be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateTarget {
    pub pod: String,
    pub node: String,
    pub ip: String,
    /// On a node taken from a replaced exporter: what that exporter served.
    pub expect: Option<migration::Expected>,
}

/// What the controller sees in one sync.
pub struct Observed<'a> {
    pub agent: &'a NodeAgent,
    pub nodes: &'a [Node],
    /// All pods of the namespace the informer holds; only the owned ones count.
    pub pods: &'a [Pod],
    pub revisions: &'a [ControllerRevision],
    /// Health gate results of this sync, by pod name.
    pub gate: &'a BTreeMap<String, GateResult>,
    /// Nodes whose failed pods are not to be deleted yet (per-node backoff).
    pub backoff: &'a dyn Fn(&str) -> bool,
    pub now: Timestamp,
    /// With `spec.replaces`: the replaced DaemonSet and its pods.
    pub replaced: Option<Replaced<'a>>,
}

/// The DaemonSet a takeover replaces, as read this sync.
#[derive(Clone, Copy)]
pub struct Replaced<'a> {
    /// None once it is deleted.
    pub daemonset: Option<&'a DaemonSet>,
    /// The pods it controls.
    pub pods: &'a [Pod],
}

#[derive(Debug, Clone, PartialEq)]
pub struct Create {
    pub node: String,
    pub hash: String,
    pub pod: Pod,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    pub node: String,
    pub pod: String,
    pub reason: String,
    /// A failed pod: its deletion is backed off per node.
    pub failed: bool,
}

/// Why the rollout halts this sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    pub pod: String,
    pub node: String,
    pub message: String,
}

/// Everything one sync decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub update_hash: String,
    pub current_hash: String,
    /// A ControllerRevision to apply (new, or an old one renumbered newest).
    pub revision: Option<ControllerRevision>,
    /// Old ControllerRevisions beyond the history limit.
    pub prune: Vec<String>,
    /// Pods whose gate condition is to be set True.
    pub gate_passed: Vec<String>,
    pub creates: Vec<Create>,
    pub deletes: Vec<Delete>,
    /// Failed-pod deletions held back by the per-node backoff.
    pub backed_off: usize,
    pub halt: Option<Halt>,
    /// With autoRollback on a halt: (revision number, template) to put back.
    pub rollback: Option<(i64, PodTemplateSpec)>,
    pub status: NodeAgentStatus,
    /// Work remains that a later sync must do (rolling, gating, backoff).
    pub progressing: bool,
    /// The takeover's decision, with `spec.replaces`.
    pub migration: Option<migration::Plan>,
}

/// The DaemonSet the planner sees for a NodeAgent and a template.
pub fn as_daemonset(agent: &NodeAgent, template: &PodTemplateSpec) -> DaemonSet {
    let s = &agent.spec;
    let strategy = s.update_strategy.clone().unwrap_or_default();
    DaemonSet {
        metadata: ObjectMeta {
            name: agent.metadata.name.clone(),
            namespace: agent.metadata.namespace.clone(),
            uid: agent.metadata.uid.clone(),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: s.selector.clone(),
            template: template.clone(),
            min_ready_seconds: s.min_ready_seconds,
            revision_history_limit: s.revision_history_limit,
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: strategy.type_.clone(),
                rolling_update: strategy
                    .rolling_update
                    .map(|r| RollingUpdateDaemonSet { max_unavailable: r.max_unavailable, max_surge: r.max_surge }),
            }),
        }),
        status: None,
    }
}

/// The revision hash of the NodeAgent's template.
pub fn template_hash(agent: &NodeAgent) -> String {
    plan::revision_hash(&as_daemonset(agent, &agent.spec.template))
}

fn owner_ref(agent: &NodeAgent) -> OwnerReference {
    OwnerReference {
        api_version: NodeAgent::api_version(&()).into_owned(),
        kind: NodeAgent::kind(&()).into_owned(),
        name: agent.name_any(),
        uid: agent.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn controlled_by(meta: &ObjectMeta, agent: &NodeAgent) -> bool {
    let uid = agent.metadata.uid.as_deref();
    meta.owner_references.iter().flatten().any(|r| {
        r.controller == Some(true)
            && r.kind == "NodeAgent"
            && r.name == agent.name_any()
            && (uid.is_none() || r.uid.is_empty() || Some(r.uid.as_str()) == uid)
    })
}

fn label(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.labels.as_ref().and_then(|l| l.get(key)).cloned()
}

fn condition_since(pod: &Pod, kind: &str) -> Option<Option<Timestamp>> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind)?;
    (c.status == "True").then(|| c.last_transition_time.as_ref().map(|t| t.0))
}

/// The pod's readiness gate condition is True.
pub fn gate_passed(pod: &Pod) -> bool {
    condition_since(pod, GATE_CONDITION).is_some()
}

fn gated(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.condition_type == GATE_CONDITION))
}

/// A deterministic pod name: the same node and revision always give the
/// same name, so a create retried after a lost response is idempotent.
pub fn pod_name(agent: &str, hash: &str, node: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in node.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    let suffix = format!("{h:08x}");
    let base: String = agent.chars().take(63 - 2 - hash.len() - 8).collect();
    format!("{base}-{hash}-{suffix}")
}

/// The pod the controller creates on `node` from a revision's template: the
/// revision label, the controller reference, the priority class, the default
/// daemon tolerations, the health gate, and a required node affinity
/// `metadata.name In [node]` so the scheduler binds it (and preemption works).
pub fn pod_for(agent: &NodeAgent, node: &str, hash: &str, template: &PodTemplateSpec) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), hash.into());
    labels.insert(super::NAME_LABEL.into(), agent.name_any());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.tolerations = Some(daemon_tolerations(&spec));
    if spec.priority_class_name.is_none() {
        spec.priority_class_name = Some(agent.spec.priority.class_name.clone());
    }
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        match_expressions: None,
    };
    let mut affinity = spec.affinity.take().unwrap_or_default();
    let mut na = affinity.node_affinity.take().unwrap_or_default();
    na.required_during_scheduling_ignored_during_execution = Some(NodeSelector { node_selector_terms: vec![term] });
    affinity.node_affinity = Some(NodeAffinity { ..na });
    spec.affinity = Some(Affinity { ..affinity });
    if agent.spec.rollout.health_gate.is_some() {
        let gates = spec.readiness_gates.get_or_insert_with(Vec::new);
        if !gates.iter().any(|g| g.condition_type == GATE_CONDITION) {
            gates.push(PodReadinessGate { condition_type: GATE_CONDITION.into() });
        }
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&agent.name_any(), hash, node)),
            namespace: agent.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: tmeta.annotations,
            owner_references: Some(vec![owner_ref(agent)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Adds the replaced DaemonSet's template labels to a pod, its own
/// labels winning.
fn inherit(pod: &mut Pod, labels: &BTreeMap<String, String>) {
    let own = pod.metadata.labels.get_or_insert_with(Default::default);
    for (k, v) in labels {
        own.entry(k.clone()).or_insert_with(|| v.clone());
    }
}

/// The ControllerRevision recording `template` as revision `number`.
pub fn revision_object(agent: &NodeAgent, hash: &str, number: i64, template: &PodTemplateSpec) -> ControllerRevision {
    let mut labels = agent.spec.selector.match_labels.clone().unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), hash.into());
    labels.insert(super::NAME_LABEL.into(), agent.name_any());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", agent.name_any())),
            namespace: agent.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner_ref(agent)]),
            ..Default::default()
        },
        revision: number,
        data: Some(RawExtension(serde_json::json!({ "spec": { "template": template } }))),
    }
}

/// The template a ControllerRevision records.
pub fn revision_template(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let v = rev.data.as_ref()?.0.get("spec")?.get("template")?.clone();
    serde_json::from_value(v).ok()
}

/// The agent's revisions, by hash.
fn revisions_by_hash<'a>(agent: &NodeAgent, all: &'a [ControllerRevision]) -> BTreeMap<String, &'a ControllerRevision> {
    all.iter().filter(|r| controlled_by(&r.metadata, agent)).filter_map(|r| label(&r.metadata, REVISION_LABEL).map(|h| (h, r))).collect()
}

/// Pods whose health gate is to be checked this sync: gated, containers
/// ready, gate not yet passed, with an IP.
pub fn gate_targets(agent: &NodeAgent, pods: &[Pod]) -> Vec<GateTarget> {
    if agent.spec.rollout.health_gate.is_none() {
        return Vec::new();
    }
    pods.iter()
        .filter(|p| controlled_by(&p.metadata, agent) && p.metadata.deletion_timestamp.is_none())
        .filter(|p| gated(p) && !gate_passed(p) && condition_since(p, "ContainersReady").is_some())
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone().filter(|ip| !ip.is_empty())?;
            Some(GateTarget { pod: p.name_any(), node: plan::target_node(p)?, ip, expect: None })
        })
        .collect()
}

/// The pod shares the node's ports: host network, or any host port.
fn uses_host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    spec.host_network == Some(true)
        || spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| c.ports.iter().flatten().any(|p| p.host_port.is_some_and(|h| h > 0)))
}

fn wave_of(agent: &NodeAgent, node: &Node) -> Result<usize, Invalid> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (i, w) in agent.spec.rollout.waves.iter().enumerate() {
        if plan::selector_matches(&w.selector, &labels)? {
            return Ok(i);
        }
    }
    Ok(agent.spec.rollout.waves.len())
}

/// Where a condition is written: the new list, the old one (for transition
/// times), the time and the generation observed.
struct Conditions<'a> {
    out: Vec<Condition>,
    old: &'a [Condition],
    now: Timestamp,
    generation: Option<i64>,
}

impl Conditions<'_> {
    /// Adds a condition, keeping its transition time while its status holds.
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" }.to_string();
        let since = match self.old.iter().find(|c| c.type_ == type_) {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Time(self.now),
        };
        self.out.push(Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            // Bounded: a status apply has a size limit (the API server
            // refuses a whole request over it, halts and all).
            message: message.chars().take(MAX_MESSAGE).collect(),
            last_transition_time: since,
            observed_generation: self.generation,
        });
    }
}

/// The NodeAgent's status with ReconcileFailed set True for `reason` (the
/// rest as it was): what the reconciler writes when a request fails for a
/// reason a retry will not fix.
pub fn failed_status(agent: &NodeAgent, reason: &str, message: String, now: Timestamp) -> NodeAgentStatus {
    let mut status = agent.status.clone().unwrap_or_default();
    let mut conditions = Conditions { out: Vec::new(), old: &status.conditions, now, generation: agent.metadata.generation };
    conditions.set(FAILED_CONDITION, true, reason, message);
    let failed = conditions.out;
    status.conditions.retain(|c| c.type_ != FAILED_CONDITION);
    status.conditions.extend(failed);
    status
}

/// Why a pod that has not passed its health gate is past the deadline
/// (None: not yet), which counts from the last resume at the earliest.
fn overdue(p: &Pod, g: &HealthGate, o: &Observed) -> Option<String> {
    let node = plan::target_node(p).unwrap_or_default();
    let resumed = o.agent.status.as_ref().and_then(|s| s.resumed_at.as_ref()).map(|t| t.0.as_second());
    let late =
        |t: Option<Timestamp>| t.is_some_and(|t| o.now.as_second() - t.as_second().max(resumed.unwrap_or(i64::MIN)) > g.deadline_seconds);
    match condition_since(p, "ContainersReady") {
        Some(since) if late(since) => Some(match o.gate.get(&p.name_any()) {
            Some(GateResult::Fail(why)) => {
                format!("pod {} on node {node} failed the health gate for {}s: {why}", p.name_any(), g.deadline_seconds)
            }
            _ => format!("pod {} on node {node} has not passed the health gate within {}s", p.name_any(), g.deadline_seconds),
        }),
        Some(_) => None,
        None if late(p.metadata.creation_timestamp.as_ref().map(|t| t.0)) => {
            Some(format!("pod {} on node {node} has not become ready within {}s", p.name_any(), g.deadline_seconds))
        }
        None => None,
    }
}

/// The nodes with the synthetic label the planner's template requires
/// where the takeover allows the agent.
fn allow(nodes: &[Node], allowed: &BTreeSet<String>) -> Vec<Node> {
    nodes
        .iter()
        .map(|n| {
            let mut n = n.clone();
            if n.metadata.name.as_ref().is_some_and(|name| allowed.contains(name)) {
                n.metadata.labels.get_or_insert_with(Default::default).insert(ALLOWED_LABEL.into(), "true".into());
            }
            n
        })
        .collect()
}

/// The label (never written to a node) that marks, for the planner alone,
/// the nodes a takeover allows the agent on.
const ALLOWED_LABEL: &str = "nodeagent.io/planner-allowed";

/// The planner's template: the agent's, required onto allowed nodes.
fn restrict(t: &mut PodTemplateSpec) {
    let req = NodeSelectorRequirement { key: ALLOWED_LABEL.into(), operator: "In".into(), values: Some(vec!["true".into()]) };
    let affinity = t.spec.get_or_insert_with(Default::default).affinity.get_or_insert_with(Default::default);
    migration::require_in_every_term(affinity, &req);
}

/// The takeover's decision: the gate failure of a moving node (a pod on a
/// taken node past its deadline, other than the update revision's while a
/// rollout rolls: the rollout's halt judges those), then `migration::plan`.
#[allow(clippy::too_many_arguments)]
fn migration_plan(
    o: &Observed,
    r: &super::crd::Replaces,
    seen: Replaced,
    spec: &plan::Spec,
    order: &[(usize, String)],
    update_hash: &str,
    rolling: bool,
    owned: &[&Pod],
) -> Result<migration::Plan, Invalid> {
    let agent = o.agent;
    let min_ready = spec.min_ready_seconds;
    let taken: BTreeSet<&str> = o.nodes.iter().filter(|n| migration::taken(n)).filter_map(|n| n.metadata.name.as_deref()).collect();
    let live = |p: &&&Pod| p.metadata.deletion_timestamp.is_none();
    let mut gate_failed = None;
    if let Some(g) = &agent.spec.rollout.health_gate {
        for p in owned.iter().filter(live) {
            let Some(node) = plan::target_node(p) else { continue };
            let newest = label(&p.metadata, REVISION_LABEL).as_deref() == Some(update_hash);
            if !taken.contains(node.as_str())
                || gate_passed(p)
                || o.gate.get(&p.name_any()) == Some(&GateResult::Pass)
                || (rolling && newest)
            {
                continue;
            }
            if let Some(why) = overdue(p, g, o) {
                gate_failed = Some((node, why));
                break;
            }
        }
    }
    let done = |node: &str| {
        owned.iter().filter(live).any(|p| {
            plan::target_node(p).as_deref() == Some(node)
                && (gate_passed(p) || o.gate.get(&p.name_any()) == Some(&GateResult::Pass))
                && plan::is_available(p, min_ready, o.now)
        })
    };
    let present = |node: &str| owned.iter().any(|p| plan::target_node(p).as_deref() == Some(node));
    let status = agent.status.clone().unwrap_or_default();
    let halted_before = status
        .conditions
        .iter()
        .find(|c| c.type_ == "RolloutHalted" && c.status == "True" && c.reason == migration::REASON_HALTED)
        .map(|_| status.migration.as_ref().and_then(|m| m.halted_node.clone()).unwrap_or_default());
    let wave_names: Vec<String> = agent.spec.rollout.waves.iter().map(|w| w.name.clone()).collect();
    let max_moving = spec.rolling_counts(order.len()).1.max(1);
    Ok(migration::plan(&migration::Input {
        replaces: r,
        daemonset: seen.daemonset,
        old_pods: seen.pods,
        nodes: o.nodes,
        order,
        wave_names: &wave_names,
        partition: agent.spec.rollout.partition.unwrap_or(0).max(0) as usize,
        paused: agent.spec.rollout.paused,
        max_moving,
        halted_before,
        agent_done: &done,
        agent_pod: &present,
        gate_failed,
    }))
}

/// Decides one sync.
pub fn decide(o: &Observed) -> Result<Decision, Invalid> {
    let agent = o.agent;
    let old_status = agent.status.clone().unwrap_or_default();
    let update_hash = template_hash(agent);
    let revisions = revisions_by_hash(agent, o.revisions);
    let max_revision = revisions.values().map(|r| r.revision).max().unwrap_or(0);

    // Owned pods, and how many live ones run each revision.
    let owned: Vec<&Pod> = o.pods.iter().filter(|p| controlled_by(&p.metadata, agent)).collect();
    let mut live_per_hash: BTreeMap<String, usize> = BTreeMap::new();
    for p in owned.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        if let Some(h) = label(&p.metadata, REVISION_LABEL) {
            *live_per_hash.entry(h).or_default() += 1;
        }
    }

    // The current revision: the last completed rollout's, if its template is
    // known. Without one (status never written, or lost: a restore from
    // backup does not bring status back), the recorded revision most live
    // pods run: taking the update revision as current would roll out at once,
    // past pause, partition and waves.
    let current_hash = old_status
        .current_revision
        .clone()
        .filter(|h| *h == update_hash || revisions.contains_key(h))
        .or_else(|| {
            live_per_hash
                .iter()
                .filter(|(h, _)| **h != update_hash)
                .filter_map(|(h, n)| revisions.get(h).map(|r| ((*n, r.revision), h.clone())))
                .max()
                .map(|(_, h)| h)
        })
        .unwrap_or_else(|| update_hash.clone());
    let current_template = if current_hash == update_hash {
        agent.spec.template.clone()
    } else {
        revisions.get(&current_hash).and_then(|r| revision_template(r)).unwrap_or_else(|| agent.spec.template.clone())
    };
    let rolling = current_hash != update_hash;
    let halted = rolling && old_status.halted_revision.as_deref() == Some(update_hash.as_str());
    // A halt the controller rolled back stays reported after the rollback,
    // until the template changes again or `rollout resume` clears it.
    let old_halt = old_status.conditions.iter().find(|c| c.type_ == "RolloutHalted" && c.status == "True");
    let rolled_back_earlier = !rolling
        && old_status.halted_revision.as_ref().is_some_and(|h| *h != update_hash)
        && old_halt.is_some_and(|c| c.reason == REASON_ROLLED_BACK);

    // The update revision is recorded, and renumbered newest when an old one comes back.
    let revision = match revisions.get(&update_hash) {
        None => Some(revision_object(agent, &update_hash, max_revision + 1, &agent.spec.template)),
        Some(r) if r.revision < max_revision => Some(revision_object(agent, &update_hash, max_revision + 1, &agent.spec.template)),
        Some(_) => None,
    };

    let mut ds = as_daemonset(agent, &agent.spec.template);
    let mut spec = plan::Spec::from_daemonset(&ds)?;
    let min_ready = spec.min_ready_seconds;
    if agent.spec.replaces.is_some() && agent.spec.rollout.health_gate.is_none() {
        return Err(Invalid {
            field: "spec.rollout.healthGate".into(),
            msg: "is required with spec.replaces: each node's move is gated on the agent serving what the old exporter served".into(),
        });
    }
    if spec.rolling_counts(1).0 > 0 && uses_host_ports(&spec.template) {
        return Err(Invalid {
            field: "spec.updateStrategy.rollingUpdate.maxSurge".into(),
            msg: "must be 0 when the template uses the host's network or host ports: a surge pod would run beside the old one on \
                  the same node and both would bind the same port (use maxUnavailable)"
                .into(),
        });
    }

    // Owned pods by node.
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in &owned {
        if let Some(n) = plan::target_node(p) {
            by_node.entry(n).or_default().push(p);
        }
    }
    let updated_available = |node: &str| {
        by_node.get(node).is_some_and(|v| {
            v.iter().any(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && label(&p.metadata, REVISION_LABEL).as_deref() == Some(update_hash.as_str())
                    && plan::is_available(p, min_ready, o.now)
            })
        })
    };

    // The nodes the agent should run on, in rollout order: wave, then name.
    let order = |spec: &plan::Spec, nodes: &[Node]| -> Result<Vec<(usize, String)>, Invalid> {
        let mut eligible = Vec::new();
        for n in nodes {
            let d = planner::scheduling::should_run(&spec.template, n)
                .map_err(|m| Invalid { field: "spec.template.spec.affinity".into(), msg: m })?;
            if d.should_run {
                eligible.push((wave_of(agent, n)?, n.metadata.name.clone().unwrap_or_default()));
            }
        }
        eligible.sort();
        Ok(eligible)
    };

    // A takeover: the nodes the agent may run on now, and the nodes moving.
    let migration = match (&agent.spec.replaces, o.replaced) {
        (Some(r), Some(seen)) => Some(migration_plan(o, r, seen, &spec, &order(&spec, o.nodes)?, &update_hash, rolling, &owned)?),
        // Deciding without the replaced DaemonSet's view would start the
        // agent beside node_exporter everywhere.
        (Some(_), None) => {
            return Err(Invalid { field: "spec.replaces".into(), msg: "the replaced DaemonSet was not read this sync".into() });
        }
        (None, _) => None,
    };
    let marked: Vec<Node>;
    let nodes: &[Node] = match &migration {
        Some(m) => {
            marked = allow(o.nodes, &m.allowed);
            if let Some(s) = ds.spec.as_mut() {
                restrict(&mut s.template);
            }
            spec = plan::Spec::from_daemonset(&ds)?;
            &marked
        }
        None => o.nodes,
    };
    let eligible = order(&spec, nodes)?;
    let partition = agent.spec.rollout.partition.unwrap_or(0).max(0) as usize;
    let in_partition = eligible.len().saturating_sub(partition);
    let mut rollable: BTreeSet<String> = BTreeSet::new();
    let mut current_wave: Option<String> = None;
    let mut blocked_at: Option<usize> = None;
    for (i, (wave, name)) in eligible.iter().enumerate() {
        if i >= in_partition {
            break;
        }
        if let Some(b) = blocked_at {
            if *wave > b {
                break;
            }
        }
        rollable.insert(name.clone());
        if blocked_at.is_none() && !updated_available(name) {
            blocked_at = Some(*wave);
            current_wave = Some(agent.spec.rollout.waves.get(*wave).map(|w| w.name.clone()).unwrap_or_else(|| "(remaining nodes)".into()));
        }
    }
    let paused = agent.spec.rollout.paused;
    let held = |node: &str| rolling && (paused || halted || !rollable.contains(node));

    // The health gate: passes to record, and a halt past the deadline.
    let gate_cfg = agent.spec.rollout.health_gate.clone();
    let gate_passed_now: Vec<String> = o.gate.iter().filter(|(_, r)| **r == GateResult::Pass).map(|(p, _)| p.clone()).collect();
    let mut halt = None;
    if let (Some(g), true, false) = (&gate_cfg, rolling, halted) {
        for p in owned.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            if label(&p.metadata, REVISION_LABEL).as_deref() != Some(update_hash.as_str())
                || gate_passed(p)
                || gate_passed_now.contains(&p.name_any())
            {
                continue;
            }
            if let Some(message) = overdue(p, g, o) {
                halt = Some(Halt { pod: p.name_any(), node: plan::target_node(p).unwrap_or_default(), message });
                break;
            }
        }
    }
    let halted = halted || halt.is_some();
    let held = |node: &str| held(node) || (rolling && halted);
    // With autoRollback, a halted update is rolled back: at the halt, and
    // again at the next sync if that rollback's patch failed.
    let rollback = match &gate_cfg {
        Some(g) if g.auto_rollback && rolling && halted => {
            revisions.get(&current_hash).and_then(|r| revision_template(r).map(|t| (r.revision, t)))
        }
        _ => None,
    };

    // The planner, with the held nodes and the NodeAgent as owner.
    let p = plan::plan_with(&ds, nodes, o.pods, o.now, Some(&update_hash), &Options { owner_kind: "NodeAgent", held: &held })?;
    // In a takeover, the agent's pods carry the replaced pods' labels, so
    // the Service, ServiceMonitor or PodMonitor that selected those selects
    // them (a pod another controller owns is never adopted).
    let replaced_labels = o
        .replaced
        .and_then(|r| r.daemonset)
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone());
    let mut creates = Vec::new();
    let mut deletes = Vec::new();
    let mut backed_off = 0;
    for a in &p.actions {
        match a {
            Action::Create { node } => {
                let (hash, template) = if held(node) { (&current_hash, &current_template) } else { (&update_hash, &agent.spec.template) };
                let mut pod = pod_for(agent, node, hash, template);
                if let Some(labels) = &replaced_labels {
                    inherit(&mut pod, labels);
                }
                creates.push(Create { node: node.clone(), hash: hash.clone(), pod });
            }
            Action::Delete { node, pod, reason } => {
                let failed = reason == "failed";
                if failed && (o.backoff)(node) {
                    backed_off += 1;
                    continue;
                }
                deletes.push(Delete { node: node.clone(), pod: pod.clone(), reason: reason.clone(), failed });
            }
        }
    }
    // While halted without rollback, creates keep the current revision; a
    // rollback replaces the template, and the next sync rolls back.
    if rollback.is_some() {
        creates.clear();
        deletes.retain(|d| !d.reason.starts_with("rolling update") && !d.reason.starts_with("surge"));
    }

    // History: keep the limit of old revisions, and any a live pod uses.
    let limit = agent.spec.revision_history_limit.map(|l| l.max(0) as usize).unwrap_or(DEFAULT_HISTORY_LIMIT);
    let live: BTreeSet<String> = owned.iter().filter_map(|p| label(&p.metadata, REVISION_LABEL)).collect();
    let mut old: Vec<&ControllerRevision> =
        revisions.iter().filter(|(h, _)| **h != update_hash && **h != current_hash && !live.contains(*h)).map(|(_, r)| *r).collect();
    old.sort_by_key(|r| r.revision);
    let prune: Vec<String> = old.iter().take(old.len().saturating_sub(limit)).filter_map(|r| r.metadata.name.clone()).collect();

    // Status.
    let s = p.status;
    let complete =
        s.updated_number_scheduled == s.desired_number_scheduled && s.number_available == s.desired_number_scheduled && partition == 0;
    let new_current = if complete { update_hash.clone() } else { current_hash.clone() };
    let generation = agent.metadata.generation;
    let mut conditions = Conditions { out: Vec::new(), old: &old_status.conditions, now: o.now, generation };
    let halted_message = match (&halt, &rollback) {
        (Some(h), Some((number, _))) => Some(format!("{}; template rolled back to revision {number} ({current_hash})", h.message)),
        (Some(h), None) => Some(h.message.clone()),
        _ => old_halt.map(|c| c.message.clone()),
    };
    let still_halted = (halted && !complete) || rolled_back_earlier;
    let halt_reason = if rollback.is_some() || rolled_back_earlier { REASON_ROLLED_BACK } else { "HealthGateFailed" };
    let migration_halted = migration.as_ref().filter(|m| m.halted && !still_halted);
    match migration_halted {
        Some(m) => {
            let message = m.halt.as_ref().map(|(_, why)| why.clone()).or_else(|| old_halt.map(|c| c.message.clone()));
            conditions.set("RolloutHalted", true, migration::REASON_HALTED, message.unwrap_or_default());
        }
        None => conditions.set(
            "RolloutHalted",
            still_halted,
            if still_halted { halt_reason } else { "NotHalted" },
            if still_halted { halted_message.unwrap_or_default() } else { String::new() },
        ),
    }
    let halted_revision = if rolled_back_earlier { old_status.halted_revision.clone() } else { Some(update_hash.clone()) };
    let (progressing, reason, message) = if rolled_back_earlier {
        (
            false,
            REASON_ROLLED_BACK,
            format!(
                "revision {} halted and rolled back; revision {update_hash} runs on {}/{} nodes",
                halted_revision.clone().unwrap_or_default(),
                s.updated_number_scheduled,
                s.desired_number_scheduled
            ),
        )
    } else if let Some(m) = migration.as_ref().filter(|m| !matches!(m.status.phase.as_str(), "Complete" | "GivenBack" | "Replaced")) {
        let st = &m.status;
        let what = format!(
            "taking over {}: {} node(s) moved, {} moving, {} on the old exporter",
            st.replaced, st.node_agent_nodes, st.moving_nodes, st.old_exporter_nodes
        );
        match st.phase.as_str() {
            "Halted" => (false, "MigrationHalted", what),
            "Paused" => (false, "RolloutPaused", what),
            "GivingBack" => (true, "GivingBack", what),
            _ => (true, "Migrating", what),
        }
    } else if complete {
        (false, "RolloutComplete", format!("revision {update_hash} runs on all {} nodes", s.desired_number_scheduled))
    } else if still_halted {
        (false, "RolloutHalted", format!("{}/{} nodes updated; halted", s.updated_number_scheduled, s.desired_number_scheduled))
    } else if paused {
        (false, "RolloutPaused", format!("{}/{} nodes updated; paused", s.updated_number_scheduled, s.desired_number_scheduled))
    } else {
        (
            true,
            "Rolling",
            format!("{}/{} nodes updated, {} available", s.updated_number_scheduled, s.desired_number_scheduled, s.number_available),
        )
    };
    conditions.set("Progressing", progressing, reason, message);
    // This sync's decision was made; the reconciler sets it True when a
    // request fails for a reason a retry will not fix.
    conditions.set(FAILED_CONDITION, false, "Synced", String::new());
    let status = NodeAgentStatus {
        observed_generation: generation,
        desired_number_scheduled: s.desired_number_scheduled as i32,
        current_number_scheduled: s.current_number_scheduled as i32,
        number_misscheduled: s.number_misscheduled as i32,
        number_ready: s.number_ready as i32,
        updated_number_scheduled: s.updated_number_scheduled as i32,
        number_available: s.number_available as i32,
        number_unavailable: s.number_unavailable as i32,
        current_revision: Some(new_current),
        update_revision: Some(update_hash.clone()),
        halted_revision: if still_halted { halted_revision } else { None },
        current_wave: if complete || agent.spec.rollout.waves.is_empty() { None } else { current_wave },
        resumed_at: old_status.resumed_at.clone(),
        conditions: conditions.out,
        migration: migration.as_ref().map(|m| m.status.clone()),
    };
    let gate_pending = !gate_targets(agent, o.pods).is_empty();
    let work = !creates.is_empty() || !deletes.is_empty() || backed_off > 0 || gate_pending || revision.is_some();
    Ok(Decision {
        update_hash,
        current_hash,
        revision,
        prune,
        gate_passed: gate_passed_now,
        creates,
        deletes,
        backed_off,
        halt,
        rollback,
        status,
        progressing: work || (!complete && !still_halted && !paused) || migration.as_ref().is_some_and(|m| m.progressing),
        migration,
    })
}

/// The creates and deletes a sync made, which the informer must show
/// before the next sync acts (the upstream controller's expectations): a
/// stale cache must not make it delete or create twice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectations {
    pub creates: BTreeSet<String>,
    pub deletes: BTreeSet<String>,
    pub since: Option<Timestamp>,
}

/// Expectations older than this are dropped, as upstream does.
pub const EXPECTATIONS_TTL_SECONDS: i64 = 300;

impl Expectations {
    pub fn new(created: &[String], deleted: &[String], now: Timestamp) -> Expectations {
        Expectations { creates: created.iter().cloned().collect(), deletes: deleted.iter().cloned().collect(), since: Some(now) }
    }

    /// Whether `pods` (the informer's view) reflects every create and delete.
    pub fn satisfied(&self, pods: &[Pod], now: Timestamp) -> bool {
        if self.since.is_some_and(|t| now.as_second() - t.as_second() > EXPECTATIONS_TTL_SECONDS) {
            return true;
        }
        let live: BTreeMap<String, bool> = pods.iter().map(|p| (p.name_any(), p.metadata.deletion_timestamp.is_some())).collect();
        self.creates.iter().all(|c| live.contains_key(c)) && self.deletes.iter().all(|d| live.get(d).is_none_or(|deleting| *deleting))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NodeAgentSpec, Rollout, Wave};
    use k8s_openapi::api::core::v1::{Container, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use planner::builders::{at, node};

    fn agent(gate: bool) -> NodeAgent {
        let labels: BTreeMap<String, String> = [("app".to_string(), "node-agent".to_string())].into();
        let mut a = NodeAgent::new(
            "node-agent",
            NodeAgentSpec {
                selector: LabelSelector { match_labels: Some(labels.clone()), ..Default::default() },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                    spec: Some(PodSpec {
                        containers: vec![Container { name: "agent".into(), image: Some("agent:1".into()), ..Default::default() }],
                        ..Default::default()
                    }),
                },
                rollout: Rollout {
                    health_gate: gate.then(Default::default),
                    waves: vec![Wave {
                        name: "canary".into(),
                        selector: LabelSelector {
                            match_labels: Some([("canary".to_string(), "yes".to_string())].into()),
                            ..Default::default()
                        },
                    }],
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        a.metadata.namespace = Some("monitoring".into());
        a.metadata.uid = Some("uid-1".into());
        a
    }

    #[test]
    fn pods_are_pinned_gated_prioritised_and_owned() {
        let a = agent(true);
        let p = pod_for(&a, "worker-1", "abc", &a.spec.template);
        let spec = p.spec.clone().unwrap();
        let terms =
            spec.affinity.unwrap().node_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap().node_selector_terms;
        assert_eq!(terms.len(), 1);
        let f = &terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!((f.key.as_str(), f.operator.as_str(), f.values.clone().unwrap()), ("metadata.name", "In", vec!["worker-1".to_string()]));
        assert_eq!(spec.priority_class_name.as_deref(), Some("node-agent-critical"));
        assert_eq!(spec.readiness_gates.unwrap()[0].condition_type, GATE_CONDITION);
        assert!(spec.tolerations.unwrap().iter().any(|t| t.key.as_deref() == Some("node.kubernetes.io/unschedulable")));
        let labels = p.metadata.labels.clone().unwrap();
        assert_eq!(labels.get(REVISION_LABEL).map(String::as_str), Some("abc"));
        assert_eq!(labels.get(crate::NAME_LABEL).map(String::as_str), Some("node-agent"));
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("NodeAgent", "uid-1", Some(true)));
        // Same node and revision, same name; names stay within 63 characters.
        assert_eq!(p.metadata.name, pod_for(&a, "worker-1", "abc", &a.spec.template).metadata.name);
        assert_ne!(p.metadata.name, pod_for(&a, "worker-2", "abc", &a.spec.template).metadata.name);
        assert!(pod_name(&"x".repeat(100), "abcdefghij", "n").len() <= 63);
        // No gate configured: no readiness gate.
        assert!(pod_for(&agent(false), "w", "abc", &a.spec.template).spec.unwrap().readiness_gates.is_none());
    }

    fn running(a: &NodeAgent, node: &str, hash: &str, ready: bool, gate: bool, ip: Option<&str>) -> Pod {
        let mut p = pod_for(a, node, hash, &a.spec.template);
        p.metadata.creation_timestamp = Some(Time(at(100)));
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        let c = |t: &str, on: bool| PodCondition {
            type_: t.into(),
            status: if on { "True" } else { "False" }.into(),
            last_transition_time: Some(Time(at(200))),
            ..Default::default()
        };
        p.status = Some(PodStatus {
            phase: Some("Running".into()),
            pod_ip: ip.map(str::to_string),
            conditions: Some(vec![c("ContainersReady", ready), c("Ready", ready && gate), c(GATE_CONDITION, gate)]),
            ..Default::default()
        });
        p
    }

    #[test]
    fn gate_targets_are_ready_ungated_pods_with_an_ip() {
        let a = agent(true);
        let pods = vec![
            running(&a, "a", "h", true, false, Some("10.0.0.1")),
            running(&a, "b", "h", true, true, Some("10.0.0.2")),
            running(&a, "c", "h", false, false, Some("10.0.0.3")),
            running(&a, "d", "h", true, false, None),
        ];
        let t = gate_targets(&a, &pods);
        assert_eq!(t, vec![GateTarget { pod: pods[0].name_any(), node: "a".into(), ip: "10.0.0.1".into(), expect: None }]);
        assert!(gate_targets(&agent(false), &pods).is_empty());
    }

    #[test]
    fn the_canary_wave_goes_first_and_a_late_gate_halts() {
        let mut a = agent(true);
        let old = template_hash(&a);
        let rev1 = revision_object(&a, &old, 1, &a.spec.template);
        a.spec.template.spec.as_mut().unwrap().containers[0].image = Some("agent:2".into());
        let new = template_hash(&a);
        a.status = Some(NodeAgentStatus { current_revision: Some(old.clone()), ..Default::default() });
        let nodes = vec![node("a", &[], &[]), node("b", &[], &[]), node("z", &[("canary", "yes")], &[])];
        let pods: Vec<Pod> = ["a", "b", "z"].iter().map(|n| running(&a, n, &old, true, true, Some("10.0.0.9"))).collect();
        let gate = BTreeMap::new();
        let obs = |pods: &'_ [Pod], gate: &'_ BTreeMap<String, GateResult>, now: i64| {
            decide(&Observed {
                agent: &a,
                nodes: &nodes,
                pods,
                revisions: std::slice::from_ref(&rev1),
                gate,
                backoff: &|_| false,
                now: at(now),
                replaced: None,
            })
            .unwrap()
        };
        let d = obs(&pods, &gate, 300);
        // The new revision is recorded as revision 2; the canary z is replaced first.
        assert_eq!(d.revision.as_ref().map(|r| r.revision), Some(2));
        assert_eq!(d.deletes.iter().map(|x| x.node.as_str()).collect::<Vec<_>>(), vec!["z"]);
        assert_eq!(d.status.current_wave.as_deref(), Some("canary"));

        // z now runs the new revision, containers ready since t=200, gate failing.
        let mut pods2 = pods.clone();
        pods2[2] = running(&a, "z", &new, true, false, Some("10.0.0.9"));
        let failing: BTreeMap<String, GateResult> =
            [(pods2[2].name_any(), GateResult::Fail("node_ebpf_program_up is 0 for sys_exit".into()))].into();
        // Within the deadline (300s): wait, nothing else moves (a, b are a later wave).
        let d = obs(&pods2, &failing, 400);
        assert!(d.halt.is_none() && d.deletes.is_empty() && d.creates.is_empty(), "{d:?}");
        // Past it: halt, naming the pod, the node and the reason.
        let d = obs(&pods2, &failing, 501);
        let h = d.halt.clone().expect("halt");
        assert!(h.message.contains("on node z failed the health gate for 300s: node_ebpf_program_up is 0 for sys_exit"), "{}", h.message);
        assert_eq!(d.status.halted_revision.as_deref(), Some(new.as_str()));
        assert!(d.rollback.is_none(), "autoRollback is off");
        // A passing gate instead is recorded, and the next wave waits for Ready.
        let passing: BTreeMap<String, GateResult> = [(pods2[2].name_any(), GateResult::Pass)].into();
        let d = obs(&pods2, &passing, 400);
        assert_eq!(d.gate_passed, vec![pods2[2].name_any()]);
        assert!(d.deletes.is_empty());
    }

    #[test]
    fn failed_pods_are_deleted_unless_their_node_is_backed_off() {
        let a = agent(false);
        let h = template_hash(&a);
        let mut failed = running(&a, "a", &h, false, false, None);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let pods = [failed];
        let nodes = [node("a", &[], &[])];
        let run = |backoff: &dyn Fn(&str) -> bool| {
            decide(&Observed {
                agent: &a,
                nodes: &nodes,
                pods: &pods,
                revisions: &[],
                gate: &BTreeMap::new(),
                backoff,
                now: at(300),
                replaced: None,
            })
            .unwrap()
        };
        let d = run(&|_| false);
        assert_eq!(d.deletes.len(), 1);
        assert!(d.deletes[0].failed && d.deletes[0].reason == "failed");
        let d = run(&|n| n == "a");
        assert!(d.deletes.is_empty());
        assert_eq!(d.backed_off, 1);
        assert!(d.progressing, "a backed-off deletion is retried");
    }

    #[test]
    fn expectations_wait_for_the_informer() {
        let a = agent(false);
        let p = running(&a, "a", "h", true, true, None);
        let e = Expectations::new(&[p.name_any()], &["gone".to_string()], at(1000));
        assert!(!e.satisfied(&[], at(1001)), "create not seen yet");
        assert!(e.satisfied(std::slice::from_ref(&p), at(1001)));
        let mut still = running(&a, "b", "h", true, true, None);
        still.metadata.name = Some("gone".into());
        assert!(!e.satisfied(&[p.clone(), still.clone()], at(1001)), "delete not seen yet");
        still.metadata.deletion_timestamp = Some(Time(at(1000)));
        assert!(e.satisfied(&[p, still], at(1001)));
        assert!(e.satisfied(&[], at(1000 + EXPECTATIONS_TTL_SECONDS + 1)), "expired");
    }
}
