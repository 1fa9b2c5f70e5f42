//! Taking over a DaemonSet (node_exporter's) node by node, as a pure
//! function of what the controller sees: which nodes the agent may run on,
//! which node moves next, which goes back, and what changes in the
//! replaced DaemonSet. No I/O, no clock.
//!
//! A node's state is its label `nodeagent.io/exporter`, so a new leader
//! reads it from the nodes alone:
//! - absent: the old exporter's node;
//! - `node-agent`: taken: the replaced DaemonSet excludes the node (the
//!   term below), its pod goes, and once it is gone the agent starts there
//!   and must pass its gate;
//! - `returning`: going back: the agent's pod goes, then the label does,
//!   and the DaemonSet controller starts the old exporter there again.
//!
//! The replaced DaemonSet gets `updateStrategy: OnDelete` and a required
//! node-affinity expression `nodeagent.io/exporter DoesNotExist` in every
//! term (none of its pods restarts: the real DaemonSet controller replaces
//! an OnDelete DaemonSet's pods only when they are deleted). What it had
//! before is kept in an annotation and put back when every node is back.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod};
use serde_json::{json, Value};

use super::crd::{MigrationStatus, Replaces};
use planner::plan;

/// The node label that says which exporter a node is given to.
pub const EXPORTER_LABEL: &str = "nodeagent.io/exporter";
/// The label's value on a node taken from the replaced DaemonSet.
pub const TAKEN: &str = "node-agent";
/// The label's value on a node on its way back to the replaced DaemonSet.
pub const RETURNING: &str = "returning";
/// On a taken node: the families the old exporter served there, comma-separated.
pub const FAMILIES_ANNOTATION: &str = "nodeagent.io/exporter-families";
/// On a taken node: the collectors that succeeded in the old exporter there.
pub const COLLECTORS_ANNOTATION: &str = "nodeagent.io/exporter-collectors";
/// On the replaced DaemonSet: its updateStrategy and affinity before the
/// takeover (JSON), put back when every node is back.
pub const ORIGINAL_ANNOTATION: &str = "nodeagent.io/replaced-spec";
/// The RolloutHalted reason of a node whose gate failed during a takeover.
pub const REASON_HALTED: &str = "MigrationGateFailed";
/// Families node_exporter serves about itself, which the agent need not
/// serve: its Go runtime, its process and its HTTP handler.
pub const OWN_FAMILY_PREFIXES: &[&str] = &["go_", "process_", "promhttp_", "node_exporter_"];
/// Moving nodes named in the status.
const NAMED: usize = 10;

/// Whether a family the old exporter served must be served by the agent.
pub fn compared(family: &str) -> bool {
    !OWN_FAMILY_PREFIXES.iter().any(|p| family.starts_with(p))
}

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// On the old exporter.
    Old,
    /// Taken; the old pod still exists.
    Leaving,
    /// Taken, the old pod gone; the agent not yet through its gate.
    Starting,
    /// Taken and the agent through its gate.
    Moved,
    /// On the way back.
    Returning,
}

/// What `plan` reads.
pub struct Input<'a> {
    pub replaces: &'a Replaces,
    /// The replaced DaemonSet; None once it is deleted.
    pub daemonset: Option<&'a DaemonSet>,
    /// The pods the replaced DaemonSet controls.
    pub old_pods: &'a [Pod],
    pub nodes: &'a [Node],
    /// The nodes the agent should run on, in rollout order (wave, name),
    /// with their wave's index.
    pub order: &'a [(usize, String)],
    pub wave_names: &'a [String],
    pub partition: usize,
    pub paused: bool,
    /// Nodes moving at once at most (the rollout's maxUnavailable, at least 1).
    pub max_moving: usize,
    /// A RolloutHalted condition of this kind is standing (not resumed).
    pub halted_before: Option<String>,
    /// The agent's pod on the node is available and through its gate.
    pub agent_done: &'a dyn Fn(&str) -> bool,
    /// Some pod of the agent's is on the node (terminating included).
    pub agent_pod: &'a dyn Fn(&str) -> bool,
    /// A taken node whose agent pod failed its gate past the deadline: (node, why).
    pub gate_failed: Option<(String, String)>,
}

/// A node to take this sync: the old exporter's pod there is read first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    pub node: String,
    /// The old pod's address, when it is ready to be read; None when the
    /// node has no ready old pod (nothing to compare).
    pub read: Option<String>,
}

/// What one sync of a takeover decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The nodes the agent's pods may run on now.
    pub allowed: BTreeSet<String>,
    /// A patch for the replaced DaemonSet: a merge patch that prepares it,
    /// or a JSON patch (an array) that puts it back.
    pub daemonset_patch: Option<Value>,
    pub take: Vec<Take>,
    /// Nodes to send back (label `returning`).
    pub give_back: Vec<String>,
    /// Nodes whose label (and snapshot) goes: back on the old exporter.
    pub release: Vec<String>,
    /// A node whose gate failed this sync: (node, message).
    pub halt: Option<(String, String)>,
    pub halted: bool,
    pub status: MigrationStatus,
    /// Work remains that a later sync must do.
    pub progressing: bool,
    /// A taken node's old pod is still there (its going is seen by reading
    /// again, not by an informer): look again soon.
    pub waiting_on_old: bool,
}

fn exporter_label(n: &Node) -> Option<&str> {
    n.metadata.labels.as_ref()?.get(EXPORTER_LABEL).map(String::as_str)
}

fn ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The exclusion every term of the replaced DaemonSet gets.
fn exclusion() -> NodeSelectorRequirement {
    NodeSelectorRequirement { key: EXPORTER_LABEL.into(), operator: "DoesNotExist".into(), values: None }
}

/// `affinity` with the exclusion in every required term (one term of its
/// own when there is none): a node with the label matches no term.
pub fn excluding(affinity: Option<&Affinity>) -> Affinity {
    let mut a = affinity.cloned().unwrap_or_default();
    require_in_every_term(&mut a, &exclusion());
    a
}

/// Adds `req` (once) to every required node-affinity term of `affinity`
/// (terms are ORed, so each must carry it), a term of its own when there
/// is none.
pub fn require_in_every_term(affinity: &mut Affinity, req: &NodeSelectorRequirement) {
    let na = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    let required =
        na.required_during_scheduling_ignored_during_execution.get_or_insert_with(|| NodeSelector { node_selector_terms: vec![] });
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for t in &mut required.node_selector_terms {
        let exprs = t.match_expressions.get_or_insert_with(Vec::new);
        if !exprs.contains(req) {
            exprs.push(req.clone());
        }
    }
}

/// The DaemonSet excludes taken nodes and replaces no pod by itself.
pub fn prepared(ds: &DaemonSet) -> bool {
    let Some(spec) = &ds.spec else { return false };
    let on_delete = spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("OnDelete");
    let terms = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    on_delete && !terms.is_empty() && terms.iter().all(|t| t.match_expressions.iter().flatten().any(|e| *e == exclusion()))
}

fn original(ds: &DaemonSet) -> Option<Value> {
    let raw = ds.metadata.annotations.as_ref()?.get(ORIGINAL_ANNOTATION)?;
    serde_json::from_str(raw).ok()
}

/// The merge patch that prepares the DaemonSet: OnDelete, the exclusion,
/// and what it had before in an annotation (kept from an earlier
/// preparation), on the condition of the version read.
pub fn prepare_patch(ds: &DaemonSet) -> Value {
    let spec = ds.spec.clone().unwrap_or_default();
    let affinity = spec.template.spec.as_ref().and_then(|s| s.affinity.clone());
    let before = original(ds).unwrap_or_else(|| json!({ "updateStrategy": spec.update_strategy, "affinity": affinity }));
    json!({
        "metadata": {
            "resourceVersion": ds.metadata.resource_version,
            "annotations": { ORIGINAL_ANNOTATION: before.to_string() },
        },
        "spec": {
            "updateStrategy": { "type": "OnDelete", "rollingUpdate": null },
            "template": { "spec": { "affinity": excluding(affinity.as_ref()) } },
        },
    })
}

/// The JSON patch that puts the DaemonSet back as it was (None when it
/// was never prepared by a takeover): the strategy and the affinity
/// replaced whole (a merge patch would merge our affinity into theirs),
/// the annotation removed, on the condition of the version read.
pub fn restore_patch(ds: &DaemonSet) -> Option<Value> {
    let before = original(ds)?;
    let strategy = before.get("updateStrategy").filter(|s| !s.is_null()).cloned().unwrap_or_else(|| json!({ "type": "RollingUpdate" }));
    let has_affinity = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()).is_some_and(|s| s.affinity.is_some());
    let mut ops = vec![
        json!({ "op": "test", "path": "/metadata/resourceVersion", "value": ds.metadata.resource_version }),
        json!({ "op": "replace", "path": "/spec/updateStrategy", "value": strategy }),
    ];
    match before.get("affinity").filter(|a| !a.is_null()) {
        Some(a) if has_affinity => ops.push(json!({ "op": "replace", "path": "/spec/template/spec/affinity", "value": a })),
        Some(a) => ops.push(json!({ "op": "add", "path": "/spec/template/spec/affinity", "value": a })),
        None if has_affinity => ops.push(json!({ "op": "remove", "path": "/spec/template/spec/affinity" })),
        None => {}
    }
    ops.push(json!({ "op": "remove", "path": format!("/metadata/annotations/{}", ORIGINAL_ANNOTATION.replace('/', "~1")) }));
    Some(Value::Array(ops))
}

/// Decides one sync of a takeover.
pub fn plan(i: &Input) -> Plan {
    let r = i.replaces;
    let replaced = format!("{}/{}", r.namespace, r.name);
    let label: BTreeMap<&str, Option<&str>> =
        i.nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, exporter_label(n)))).collect();
    let mut old_on: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in i.old_pods {
        if let Some(n) = plan::target_node(p) {
            old_on.entry(n).or_default().push(p);
        }
    }
    let state = |node: &str| match label.get(node).copied().flatten() {
        Some(TAKEN) if old_on.contains_key(node) => State::Leaving,
        Some(TAKEN) if (i.agent_done)(node) => State::Moved,
        Some(TAKEN) => State::Starting,
        Some(RETURNING) => State::Returning,
        _ => State::Old,
    };
    let mut out = Plan {
        allowed: BTreeSet::new(),
        daemonset_patch: None,
        take: Vec::new(),
        give_back: Vec::new(),
        release: Vec::new(),
        halt: None,
        halted: false,
        status: MigrationStatus { replaced: replaced.clone(), ..Default::default() },
        progressing: false,
        waiting_on_old: false,
    };
    // Nodes on their way back: released once the agent's pod is gone.
    let returning: Vec<String> = label.iter().filter(|(_, l)| **l == Some(RETURNING)).map(|(n, _)| n.to_string()).collect();
    for n in &returning {
        if !(i.agent_pod)(n) {
            out.release.push(n.clone());
        }
    }

    let Some(ds) = i.daemonset else {
        // The replaced DaemonSet is gone: every node is the agent's.
        out.allowed = label.keys().filter(|n| state(n) != State::Returning).map(|n| n.to_string()).collect();
        out.status.phase = "Replaced".into();
        out.status.node_agent_nodes = i.order.iter().filter(|(_, n)| (i.agent_done)(n)).count() as i32;
        out.status.waiting = Some(format!("{replaced} is deleted: spec.replaces can be removed"));
        out.progressing = !out.release.is_empty();
        return out;
    };

    if r.give_back {
        for (n, l) in &label {
            if *l == Some(TAKEN) {
                out.give_back.push(n.to_string());
            }
        }
        let still: usize = returning.len() + out.give_back.len();
        // The DaemonSet is put back once no node has an agent pod, before
        // the labels go: it makes its pods on the returning nodes from its
        // own template then, not from the changed one (whose pods its
        // rolling update would replace once more).
        if original(ds).is_some() {
            out.release.clear();
            if out.give_back.is_empty() && returning.iter().all(|n| !(i.agent_pod)(n)) {
                out.daemonset_patch = restore_patch(ds);
            }
        }
        let labelled = label.values().any(|l| l.is_some_and(|v| v == TAKEN || v == RETURNING));
        out.status.phase = if labelled || out.daemonset_patch.is_some() { "GivingBack" } else { "GivenBack" }.into();
        out.status.moving_nodes = still as i32;
        out.status.moving = out.give_back.iter().chain(returning.iter()).take(NAMED).cloned().collect();
        out.status.old_exporter_nodes = i.order.iter().filter(|(_, n)| state(n) == State::Old).count() as i32;
        out.progressing = labelled || out.daemonset_patch.is_some();
        return out;
    }

    // The agent runs where the node is taken and the old pod is gone.
    out.allowed = label.keys().filter(|n| matches!(state(n), State::Starting | State::Moved)).map(|n| n.to_string()).collect();

    // A gate that failed on a taken node sends that node back, and halts.
    if let Some((node, why)) = &i.gate_failed {
        if label.get(node.as_str()).copied().flatten() == Some(TAKEN) {
            out.give_back.push(node.clone());
            out.allowed.remove(node);
            out.halt = Some((node.clone(), format!("node {node}: {why}; the node went back to {replaced}")));
        }
    }
    out.halted = out.halt.is_some() || i.halted_before.is_some();
    out.status.halted_node = out.halt.as_ref().map(|(n, _)| n.clone()).or_else(|| i.halted_before.clone());

    let in_order: Vec<(usize, &str, State)> = i.order.iter().map(|(w, n)| (*w, n.as_str(), state(n))).collect();
    let count = |s: State| in_order.iter().filter(|(_, _, x)| *x == s).count();
    let moving: Vec<&str> = in_order
        .iter()
        .filter(|(_, n, s)| matches!(s, State::Leaving | State::Starting | State::Returning) || out.give_back.iter().any(|g| g == n))
        .map(|(_, n, _)| *n)
        .collect();
    out.waiting_on_old = count(State::Leaving) > 0;
    out.status.old_exporter_nodes = count(State::Old) as i32;
    out.status.node_agent_nodes = count(State::Moved) as i32;
    out.status.moving_nodes = moving.len() as i32;
    out.status.moving = moving.iter().take(NAMED).map(|n| n.to_string()).collect();

    // The nodes to take: in order, the partition's last nodes kept, a wave
    // once the earlier waves moved, at most max_moving moving at once.
    let movable = in_order.len().saturating_sub(i.partition);
    let mut candidates: Vec<&str> = Vec::new();
    let mut blocked: Option<usize> = None;
    for (w, n, s) in in_order.iter().take(movable) {
        if blocked.is_some_and(|b| *w > b) {
            break;
        }
        if *s != State::Moved {
            blocked.get_or_insert(*w);
        }
        if *s == State::Old {
            candidates.push(n);
        }
    }
    let budget = i.max_moving.max(1).saturating_sub(moving.len());
    let waiting_on = |what: &str| {
        let wave = blocked.map(|w| i.wave_names.get(w).cloned().unwrap_or_else(|| "(remaining nodes)".into()));
        match wave {
            Some(w) => format!("{what} (wave {w})"),
            None => what.to_string(),
        }
    };
    let done = count(State::Old) == 0 && moving.is_empty();
    if !prepared(ds) {
        out.daemonset_patch = Some(prepare_patch(ds));
        out.status.phase = "Preparing".into();
        out.status.waiting = Some(format!("{replaced} is being set to OnDelete and to exclude nodes labelled {EXPORTER_LABEL}"));
    } else if out.halted {
        out.status.phase = "Halted".into();
        out.status.waiting = Some("halted: `node-agent rollout resume` moves on, `giveBack: true` returns every node".into());
    } else if i.paused {
        out.status.phase = "Paused".into();
        out.status.waiting = Some("paused".into());
    } else if done {
        out.status.phase = "Complete".into();
        out.status.waiting = Some(format!(
            "{replaced} runs no pod on the agent's nodes: delete it (kubectl -n {} delete daemonset {})",
            r.namespace, r.name
        ));
    } else {
        out.status.phase = "Migrating".into();
        for n in candidates.iter().take(budget) {
            let live: Vec<&&Pod> = old_on.get(*n).into_iter().flatten().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            let read = live.iter().find(|p| ready(p)).and_then(|p| p.status.as_ref()?.pod_ip.clone()).filter(|ip| !ip.is_empty());
            out.take.push(Take { node: n.to_string(), read });
        }
        if out.take.is_empty() {
            out.status.waiting = Some(if !moving.is_empty() {
                waiting_on(&format!("{} node(s) moving, at most {} at once", moving.len(), i.max_moving.max(1)))
            } else if candidates.is_empty() && i.partition > 0 {
                format!("partition: the last {} node(s) stay on {replaced}", i.partition)
            } else {
                waiting_on("the earlier wave's nodes to pass their gate")
            });
        }
    }
    out.status.next = candidates.get(out.take.len()).map(|n| n.to_string()).or_else(|| {
        if out.take.is_empty() {
            candidates.first().map(|n| n.to_string())
        } else {
            None
        }
    });
    out.progressing = out.daemonset_patch.is_some()
        || !out.take.is_empty()
        || !out.give_back.is_empty()
        || !out.release.is_empty()
        || !moving.is_empty()
        || (!done && !out.halted && !i.paused);
    out
}

/// The label patch that takes a node: the label and the old exporter's
/// snapshot (None: nothing to compare).
pub fn take_patch(snapshot: Option<(&BTreeSet<String>, &BTreeSet<String>)>) -> Value {
    let (families, collectors) = match snapshot {
        Some((f, c)) => (
            Value::String(f.iter().filter(|f| compared(f)).cloned().collect::<Vec<_>>().join(",")),
            Value::String(c.iter().cloned().collect::<Vec<_>>().join(",")),
        ),
        None => (Value::Null, Value::Null),
    };
    json!({ "metadata": {
        "labels": { EXPORTER_LABEL: TAKEN },
        "annotations": { FAMILIES_ANNOTATION: families, COLLECTORS_ANNOTATION: collectors },
    }})
}

/// The label patch that sends a node back.
pub fn give_back_patch() -> Value {
    json!({ "metadata": { "labels": { EXPORTER_LABEL: RETURNING } } })
}

/// The patch that gives a node back to the old exporter: label and snapshot gone.
pub fn release_patch() -> Value {
    json!({ "metadata": {
        "labels": { EXPORTER_LABEL: null },
        "annotations": { FAMILIES_ANNOTATION: null, COLLECTORS_ANNOTATION: null },
    }})
}

/// What the agent must serve on a taken node: the old exporter's families
/// and successful collectors, from the node's annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    pub families: BTreeSet<String>,
    pub collectors: BTreeSet<String>,
}

/// The expectation on a node (None: not taken, or nothing recorded).
pub fn expected(node: &Node) -> Option<Expected> {
    if exporter_label(node) != Some(TAKEN) {
        return None;
    }
    let a = node.metadata.annotations.as_ref()?;
    let split = |k: &str| -> BTreeSet<String> {
        a.get(k).map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default()
    };
    let e = Expected { families: split(FAMILIES_ANNOTATION), collectors: split(COLLECTORS_ANNOTATION) };
    (!e.families.is_empty() || !e.collectors.is_empty()).then_some(e)
}

/// The node's label says it is taken.
pub fn taken(node: &Node) -> bool {
    exporter_label(node) == Some(TAKEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetUpdateStrategy};
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use planner::builders::node;

    fn ds(prepared_: bool) -> DaemonSet {
        let mut d = DaemonSet {
            metadata: ObjectMeta { name: Some("node-exporter".into()), resource_version: Some("7".into()), ..Default::default() },
            spec: Some(DaemonSetSpec {
                template: PodTemplateSpec { spec: Some(PodSpec::default()), ..Default::default() },
                update_strategy: Some(DaemonSetUpdateStrategy { type_: Some("RollingUpdate".into()), rolling_update: None }),
                ..Default::default()
            }),
            status: None,
        };
        if prepared_ {
            let s = d.spec.as_mut().unwrap();
            s.update_strategy = Some(DaemonSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None });
            s.template.spec.as_mut().unwrap().affinity = Some(excluding(None));
            d.metadata.annotations = Some(
                [(ORIGINAL_ANNOTATION.to_string(), r#"{"updateStrategy":{"type":"RollingUpdate"},"affinity":null}"#.to_string())].into(),
            );
        }
        d
    }

    fn old_pod(node: &str, ready_: bool, terminating: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("ne-{node}")),
                deletion_timestamp: terminating.then(|| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(planner::builders::at(1))),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
            status: Some(PodStatus {
                pod_ip: Some(format!("10.0.0.{}", node.len())),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready_ { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn labelled(name: &str, value: Option<&str>) -> Node {
        let mut n = node(name, &[], &[]);
        if let Some(v) = value {
            n.metadata.labels.get_or_insert_with(Default::default).insert(EXPORTER_LABEL.into(), v.into());
        }
        n
    }

    struct Case {
        replaces: Replaces,
        ds: Option<DaemonSet>,
        old: Vec<Pod>,
        nodes: Vec<Node>,
        order: Vec<(usize, String)>,
        partition: usize,
        paused: bool,
        max_moving: usize,
        halted_before: Option<String>,
        done: Vec<&'static str>,
        pods: Vec<&'static str>,
        gate_failed: Option<(String, String)>,
    }

    impl Case {
        fn new(nodes: &[(&str, Option<&str>)]) -> Case {
            Case {
                replaces: Replaces { namespace: "monitoring".into(), name: "node-exporter".into(), port: 9100, give_back: false },
                ds: Some(ds(true)),
                old: nodes.iter().filter(|(_, l)| l.is_none()).map(|(n, _)| old_pod(n, true, false)).collect(),
                nodes: nodes.iter().map(|(n, l)| labelled(n, *l)).collect(),
                order: nodes.iter().map(|(n, _)| (0, n.to_string())).collect(),
                partition: 0,
                paused: false,
                max_moving: 1,
                halted_before: None,
                done: vec![],
                pods: vec![],
                gate_failed: None,
            }
        }
        fn plan(&self) -> Plan {
            let done = |n: &str| self.done.contains(&n);
            let pods = |n: &str| self.pods.contains(&n) || self.done.contains(&n);
            plan(&Input {
                replaces: &self.replaces,
                daemonset: self.ds.as_ref(),
                old_pods: &self.old,
                nodes: &self.nodes,
                order: &self.order,
                wave_names: &["canary".to_string()],
                partition: self.partition,
                paused: self.paused,
                max_moving: self.max_moving,
                halted_before: self.halted_before.clone(),
                agent_done: &done,
                agent_pod: &pods,
                gate_failed: self.gate_failed.clone(),
            })
        }
    }

    #[test]
    fn the_daemonset_is_prepared_before_any_node_moves_and_put_back_exactly() {
        let mut c = Case::new(&[("a", None), ("b", None)]);
        c.ds = Some(ds(false));
        let p = c.plan();
        assert!(p.take.is_empty(), "{p:?}");
        assert_eq!(p.status.phase, "Preparing");
        let patch = p.daemonset_patch.expect("prepare");
        assert_eq!(patch["spec"]["updateStrategy"]["type"], "OnDelete");
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "conditional on the version read");
        let before: Value = serde_json::from_str(patch["metadata"]["annotations"][ORIGINAL_ANNOTATION].as_str().unwrap()).unwrap();
        assert_eq!(before["updateStrategy"]["type"], "RollingUpdate");
        assert!(before["affinity"].is_null());
        let terms = &patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"];
        assert_eq!(terms[0]["matchExpressions"][0], json!({"key": EXPORTER_LABEL, "operator": "DoesNotExist"}));

        // Every term of an affinity gets the exclusion (terms are ORed).
        let two = Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![
                        NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/os".into(),
                                operator: "In".into(),
                                values: Some(vec!["linux".into()]),
                            }]),
                            ..Default::default()
                        },
                        NodeSelectorTerm::default(),
                    ],
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ex = excluding(Some(&two));
        let terms = ex.node_affinity.unwrap().required_during_scheduling_ignored_during_execution.unwrap().node_selector_terms;
        assert!(terms.iter().all(|t| t.match_expressions.as_ref().unwrap().contains(&exclusion())));
        assert_eq!(terms[0].match_expressions.as_ref().unwrap().len(), 2, "the user's expression stays");

        // Put back: the strategy and the affinity as recorded, the annotation gone.
        let back = restore_patch(&ds(true)).expect("restore");
        assert_eq!(
            back,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "replace", "path": "/spec/updateStrategy", "value": {"type": "RollingUpdate"}},
                {"op": "remove", "path": "/spec/template/spec/affinity"},
                {"op": "remove", "path": "/metadata/annotations/nodeagent.io~1replaced-spec"},
            ])
        );
        assert!(restore_patch(&ds(false)).is_none(), "never prepared: nothing to put back");
    }

    #[test]
    fn nodes_move_in_order_at_most_max_moving_at_once_after_the_old_pod_is_gone() {
        let mut c = Case::new(&[("a", None), ("b", None), ("c", None)]);
        let p = c.plan();
        assert_eq!(p.take, vec![Take { node: "a".into(), read: Some("10.0.0.1".into()) }]);
        assert_eq!(p.status.next.as_deref(), Some("b"));
        assert!(p.allowed.is_empty());

        // a taken, its old pod terminating: not allowed yet, nothing else moves.
        c.nodes[0] = labelled("a", Some(TAKEN));
        c.old[0] = old_pod("a", true, true);
        let p = c.plan();
        assert!(p.take.is_empty() && p.allowed.is_empty(), "{p:?}");
        assert!(p.waiting_on_old, "the old pod's going is looked for again soon");
        assert_eq!(p.status.moving, vec!["a".to_string()]);
        assert!(p.status.waiting.as_deref().unwrap().contains("1 node(s) moving, at most 1 at once"), "{:?}", p.status.waiting);

        // The old pod gone: the agent may run on a; still moving until its gate passes.
        c.old.remove(0);
        let p = c.plan();
        assert_eq!(p.allowed, ["a".to_string()].into());
        assert!(p.take.is_empty());
        c.done = vec!["a"];
        let p = c.plan();
        assert_eq!(p.take.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(), vec!["b"]);
        assert_eq!((p.status.node_agent_nodes, p.status.old_exporter_nodes), (1, 2));

        // Two at once with max_moving 2; a node whose old pod is not ready is taken with nothing to read.
        c.max_moving = 2;
        c.old[1] = old_pod("c", false, false);
        let p = c.plan();
        assert_eq!(p.take, vec![Take { node: "b".into(), read: Some("10.0.0.1".into()) }, Take { node: "c".into(), read: None }]);
    }

    #[test]
    fn waves_partition_and_pause_hold_nodes_back() {
        let mut c = Case::new(&[("z", None), ("a", None), ("b", None)]);
        c.order = vec![(0, "z".into()), (1, "a".into()), (1, "b".into())];
        c.max_moving = 3;
        let p = c.plan();
        assert_eq!(p.take.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(), vec!["z"], "the canary wave alone");
        c.nodes[0] = labelled("z", Some(TAKEN));
        c.old.remove(0);
        let p = c.plan();
        assert!(p.take.is_empty());
        assert!(p.status.waiting.unwrap().contains("(wave canary)"));
        c.done = vec!["z"];
        c.partition = 1;
        let p = c.plan();
        assert_eq!(p.take.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(), vec!["a"], "b is the partition's");
        c.paused = true;
        let p = c.plan();
        assert!(p.take.is_empty());
        assert_eq!(p.status.phase, "Paused");
    }

    #[test]
    fn a_failed_gate_sends_its_node_back_and_halts_until_resumed() {
        let mut c = Case::new(&[("a", Some(TAKEN)), ("b", None)]);
        c.pods = vec!["a"];
        c.gate_failed = Some(("a".into(), "node_uname_info is not served".into()));
        let p = c.plan();
        assert_eq!(p.give_back, vec!["a".to_string()]);
        assert!(p.allowed.is_empty() && p.take.is_empty() && p.halted);
        assert_eq!(p.halt.unwrap().1, "node a: node_uname_info is not served; the node went back to monitoring/node-exporter");

        // Next syncs: a returning; the agent's pod goes (not allowed), then the label.
        c.gate_failed = None;
        c.halted_before = Some("a".into());
        c.nodes[0] = labelled("a", Some(RETURNING));
        let p = c.plan();
        assert!(p.release.is_empty() && !p.allowed.contains("a") && p.take.is_empty());
        assert_eq!(p.status.phase, "Halted");
        c.pods = vec![];
        let p = c.plan();
        assert_eq!(p.release, vec!["a".to_string()]);
        // Resumed: a moves again.
        c.nodes[0] = labelled("a", None);
        c.old.insert(0, old_pod("a", true, false));
        c.halted_before = None;
        assert_eq!(c.plan().take.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(), vec!["a"]);
    }

    #[test]
    fn give_back_returns_every_node_then_puts_the_daemonset_back() {
        let mut c = Case::new(&[("a", Some(TAKEN)), ("b", Some(TAKEN)), ("c", None)]);
        c.replaces.give_back = true;
        c.done = vec!["a", "b"];
        let p = c.plan();
        assert_eq!(p.give_back, vec!["a".to_string(), "b".to_string()]);
        assert!(p.allowed.is_empty() && p.daemonset_patch.is_none());
        c.nodes = vec![labelled("a", Some(RETURNING)), labelled("b", Some(RETURNING)), labelled("c", None)];
        c.done = vec![];
        c.pods = vec!["b"];
        let p = c.plan();
        assert!(p.release.is_empty() && p.daemonset_patch.is_none(), "b's agent pod is still there: {p:?}");
        c.pods = vec![];
        let p = c.plan();
        assert!(p.daemonset_patch.is_some(), "no agent pod left: the DaemonSet is put back first");
        assert!(p.release.is_empty(), "the labels go after it: {p:?}");
        c.ds = Some(ds(false));
        let p = c.plan();
        assert_eq!(p.release, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(p.status.phase, "GivingBack");
        c.nodes = vec![labelled("a", None), labelled("b", None), labelled("c", None)];
        let p = c.plan();
        assert_eq!(p.status.phase, "GivenBack");
        assert!(!p.progressing);
    }

    #[test]
    fn complete_and_replaced() {
        let mut c = Case::new(&[("a", Some(TAKEN)), ("b", Some(TAKEN))]);
        c.done = vec!["a", "b"];
        let p = c.plan();
        assert_eq!(p.status.phase, "Complete");
        assert!(p.status.waiting.unwrap().contains("kubectl -n monitoring delete daemonset node-exporter"));
        assert!(!p.progressing);
        c.ds = None;
        c.nodes.push(labelled("new", None));
        let p = c.plan();
        assert_eq!(p.status.phase, "Replaced");
        assert!(p.allowed.contains("new"), "with the DaemonSet gone every node is the agent's");
    }

    #[test]
    fn the_snapshot_leaves_out_node_exporters_own_families() {
        let f: BTreeSet<String> = ["go_goroutines", "node_cpu_seconds_total", "process_cpu_seconds_total", "node_exporter_build_info"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let c: BTreeSet<String> = ["cpu".to_string()].into();
        let p = take_patch(Some((&f, &c)));
        assert_eq!(p["metadata"]["annotations"][FAMILIES_ANNOTATION], "node_cpu_seconds_total");
        let mut n = labelled("a", Some(TAKEN));
        n.metadata.annotations = Some(
            [
                (FAMILIES_ANNOTATION.to_string(), "node_cpu_seconds_total".to_string()),
                (COLLECTORS_ANNOTATION.to_string(), "cpu".to_string()),
            ]
            .into(),
        );
        let e = expected(&n).unwrap();
        assert_eq!(e.families, ["node_cpu_seconds_total".to_string()].into());
        assert_eq!(e.collectors, c);
        assert!(expected(&labelled("a", None)).is_none());
    }
}
