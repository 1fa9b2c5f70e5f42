//! One sync of the upstream DaemonSet controller, as a pure function: the
//! manage step (create where a pod must run and none exists; delete failed,
//! succeeded, duplicate and misplaced pods), then, in a sync where manage
//! did nothing, the rolling update (maxUnavailable, or maxSurge), and the
//! DaemonSet status as the controller counts it. No I/O, no clock: `now` is
//! an input.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::scheduling::{should_run, Decision};

/// The label pods carry with their template's revision hash.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// The deprecated template-generation label and annotation.
pub const GENERATION_LABEL: &str = "pod-template-generation";
pub const GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";
/// The controller creates or deletes at most this many pods per sync.
pub const BURST_REPLICAS: usize = 250;

/// Why a DaemonSet cannot be planned, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {msg}")]
pub struct Invalid {
    pub field: String,
    pub msg: String,
}

fn invalid(field: &str, msg: impl Into<String>) -> Invalid {
    Invalid { field: field.into(), msg: msg.into() }
}

/// The update strategy, resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    OnDelete,
    RollingUpdate { max_unavailable: IntOrString, max_surge: IntOrString },
}

/// What the planner needs of a DaemonSet, validated and defaulted.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
    pub selector: LabelSelector,
    pub template: PodSpec,
    pub strategy: Strategy,
    pub min_ready_seconds: i64,
    pub template_generation: Option<String>,
    pub priority_class_name: Option<String>,
    pub priority: Option<i32>,
    /// The kind named by the pods' controller reference.
    pub owner_kind: String,
}

fn int_or_percent(v: &IntOrString, total: usize, field: &str) -> Result<usize, Invalid> {
    match v {
        IntOrString::Int(i) if *i >= 0 => Ok(*i as usize),
        IntOrString::Int(i) => Err(invalid(field, format!("must be non-negative, got {i}"))),
        IntOrString::String(s) => {
            let p: u64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| invalid(field, format!("must be an integer or a percentage, got {s:?}")))?;
            if p > 100 {
                return Err(invalid(field, format!("must not be more than 100%, got {s}")));
            }
            // Rounded up, as the controller scales it.
            Ok(((p * total as u64).div_ceil(100)) as usize)
        }
    }
}

fn is_zero(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(i) => *i == 0,
        IntOrString::String(s) => s.strip_suffix('%').and_then(|p| p.parse::<u64>().ok()) == Some(0),
    }
}

impl Spec {
    /// Validates a DaemonSet and applies apps/v1 defaults.
    pub fn from_daemonset(ds: &DaemonSet) -> Result<Spec, Invalid> {
        let spec = ds.spec.as_ref().ok_or_else(|| invalid("spec", "missing"))?;
        let template = spec.template.spec.clone().ok_or_else(|| invalid("spec.template.spec", "missing"))?;
        let selector = spec.selector.clone();
        if selector.match_labels.as_ref().is_none_or(|m| m.is_empty()) && selector.match_expressions.as_ref().is_none_or(|m| m.is_empty()) {
            return Err(invalid("spec.selector", "empty selector: it would select every pod"));
        }
        let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        if !selector_matches(&selector, &labels)? {
            return Err(invalid("spec.template.metadata.labels", "do not match spec.selector"));
        }
        let strategy = match spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate") {
            "OnDelete" => Strategy::OnDelete,
            "RollingUpdate" => {
                let ru = spec.update_strategy.as_ref().and_then(|s| s.rolling_update.clone()).unwrap_or_default();
                let max_unavailable = ru.max_unavailable.unwrap_or(IntOrString::Int(1));
                let max_surge = ru.max_surge.unwrap_or(IntOrString::Int(0));
                int_or_percent(&max_unavailable, 100, "spec.updateStrategy.rollingUpdate.maxUnavailable")?;
                int_or_percent(&max_surge, 100, "spec.updateStrategy.rollingUpdate.maxSurge")?;
                if !is_zero(&max_unavailable) && !is_zero(&max_surge) {
                    return Err(invalid("spec.updateStrategy.rollingUpdate.maxSurge", "may not be set when maxUnavailable is non-zero"));
                }
                Strategy::RollingUpdate { max_unavailable, max_surge }
            }
            other => return Err(invalid("spec.updateStrategy.type", format!("unsupported value {other:?} (RollingUpdate, OnDelete)"))),
        };
        let min_ready_seconds = spec.min_ready_seconds.unwrap_or(0);
        if min_ready_seconds < 0 {
            return Err(invalid("spec.minReadySeconds", "must be non-negative"));
        }
        Ok(Spec {
            name: ds.metadata.name.clone().ok_or_else(|| invalid("metadata.name", "missing"))?,
            namespace: ds.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            uid: ds.metadata.uid.clone(),
            selector,
            priority_class_name: template.priority_class_name.clone(),
            priority: template.priority,
            template,
            strategy,
            min_ready_seconds: min_ready_seconds as i64,
            owner_kind: "DaemonSet".into(),
            template_generation: ds.metadata.annotations.as_ref().and_then(|a| a.get(GENERATION_ANNOTATION).cloned()),
        })
    }

    /// (maxSurge, maxUnavailable) for `desired` nodes; both zero means
    /// maxUnavailable 1, as the controller falls back.
    pub fn rolling_counts(&self, desired: usize) -> (usize, usize) {
        match &self.strategy {
            Strategy::OnDelete => (0, 0),
            Strategy::RollingUpdate { max_unavailable, max_surge } => {
                let surge = int_or_percent(max_surge, desired, "").unwrap_or(0);
                let mut unavailable = int_or_percent(max_unavailable, desired, "").unwrap_or(1);
                if desired > 0 && surge == 0 && unavailable == 0 {
                    unavailable = 1;
                }
                (surge, unavailable)
            }
        }
    }

    fn allows_surge(&self) -> bool {
        self.rolling_counts(1).0 > 0
    }
}

/// Whether a label selector matches labels.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<bool, Invalid> {
    for (k, v) in sel.match_labels.clone().unwrap_or_default() {
        if labels.get(&k) != Some(&v) {
            return Ok(false);
        }
    }
    for e in sel.match_expressions.clone().unwrap_or_default() {
        let values = e.values.clone().unwrap_or_default();
        let have = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => !have.is_some_and(|v| values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            op => return Err(invalid("spec.selector.matchExpressions", format!("unknown operator {op:?}"))),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The template's revision hash: FNV-1a (32-bit) of the template's canonical
/// JSON, its decimal digits spelled in Kubernetes' "safe" alphabet, as the
/// controller spells its hashes. Stable across runs and machines; it is not
/// byte-identical to the hash kube-controller-manager computes (that one
/// hashes Go's in-memory dump of the object), so plans of pods created by
/// the real controller should be given the cluster's hash (`--revision-hash`,
/// or read from the DaemonSet's ControllerRevisions by `explain`).
pub fn revision_hash(ds: &DaemonSet) -> String {
    let template = ds.spec.as_ref().map(|s| &s.template);
    let json = serde_json::to_value(template).and_then(|v| serde_json::to_vec(&v)).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in json {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string().bytes().map(|b| ALPHANUMS[b as usize % ALPHANUMS.len()] as char).collect()
}

/// A pod's controller reference names this DaemonSet.
fn owned_by(pod: &Pod, spec: &Spec) -> bool {
    if pod.metadata.namespace.as_deref().unwrap_or("default") != spec.namespace {
        return false;
    }
    pod.metadata.owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| {
            r.controller == Some(true)
                && r.kind == spec.owner_kind
                && r.name == spec.name
                && match (&spec.uid, r.uid.is_empty()) {
                    (Some(uid), false) => &r.uid == uid,
                    _ => true,
                }
        })
    })
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Failed" | "Succeeded")
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The node a daemon pod is bound or targeted to: spec.nodeName, else the
/// `metadata.name In [node]` field affinity the controller sets.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let terms = spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .clone();
    terms.iter().flat_map(|t| t.match_fields.clone().unwrap_or_default()).find_map(|f| {
        (f.key == "metadata.name" && f.operator == "In")
            .then(|| f.values.clone().unwrap_or_default())
            .and_then(|v| (v.len() == 1).then(|| v[0].clone()))
    })
}

/// Ready: condition Ready is True.
pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    (c.status == "True").then(|| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Available: Ready for at least minReadySeconds at `now`.
pub fn is_available(pod: &Pod, min_ready_seconds: i64, now: Timestamp) -> bool {
    match ready_since(pod) {
        None => false,
        Some(_) if min_ready_seconds == 0 => true,
        Some(None) => false,
        Some(Some(t)) => {
            t.as_second().saturating_add(min_ready_seconds) < now.as_second()
                || (t.as_second().saturating_add(min_ready_seconds) == now.as_second() && t.subsec_nanosecond() < now.subsec_nanosecond())
        }
    }
}

fn is_updated(pod: &Pod, hash: &str, generation: Option<&str>) -> bool {
    let labels = pod.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    (!hash.is_empty() && get(REVISION_LABEL) == Some(hash)) || (generation.is_some() && get(GENERATION_LABEL) == generation)
}

/// Scheduled pods first, then oldest, then by name.
fn by_age(a: &&Pod, b: &&Pod) -> std::cmp::Ordering {
    let scheduled = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    scheduled(b)
        .cmp(&scheduled(a))
        .then_with(|| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
        })
        .then_with(|| pod_name(a).cmp(&pod_name(b)))
}

/// One node's decision, as reported.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    pub node: String,
    pub should_run: bool,
    pub should_continue_running: bool,
    pub reasons: Vec<String>,
}

/// One action of the sync.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Action {
    Create { node: String },
    Delete { node: String, pod: String, reason: String },
}

/// The DaemonSet status the controller would write.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub desired_number_scheduled: usize,
    pub current_number_scheduled: usize,
    pub number_misscheduled: usize,
    pub number_ready: usize,
    pub updated_number_scheduled: usize,
    pub number_available: usize,
    pub number_unavailable: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Revision {
    pub hash: String,
}

/// The plan of one sync.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Plan {
    pub revision: Revision,
    pub nodes: Vec<NodePlan>,
    pub actions: Vec<Action>,
    pub status: Status,
}

/// What a controller built on the planner changes in one sync.
pub struct Options<'a> {
    /// The kind the pods' controller reference names.
    pub owner_kind: &'a str,
    /// Nodes the rolling update must not touch this sync (paused, a later
    /// wave, a partition, a halted rollout): their old pods are neither
    /// replaced nor surged.
    pub held: &'a dyn Fn(&str) -> bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options { owner_kind: "DaemonSet", held: &|_| false }
    }
}

/// Plans one sync. `hash` overrides the computed revision hash.
pub fn plan(ds: &DaemonSet, nodes: &[Node], pods: &[Pod], now: Timestamp, hash: Option<&str>) -> Result<Plan, Invalid> {
    plan_with(ds, nodes, pods, now, hash, &Options::default())
}

/// [`plan`] with a controller's [`Options`].
pub fn plan_with(
    ds: &DaemonSet,
    nodes: &[Node],
    pods: &[Pod],
    now: Timestamp,
    hash: Option<&str>,
    opts: &Options,
) -> Result<Plan, Invalid> {
    let mut spec = Spec::from_daemonset(ds)?;
    spec.owner_kind = opts.owner_kind.to_string();
    let hash = hash.map(str::to_string).unwrap_or_else(|| revision_hash(ds));
    let generation = spec.template_generation.as_deref();

    // The DaemonSet's pods by target node; terminal pods being deleted are gone.
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in pods {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if !owned_by(p, &spec) || !selector_matches(&spec.selector, &labels)? {
            continue;
        }
        if terminal(p) && deleting(p) {
            continue;
        }
        if let Some(n) = target_node(p) {
            by_node.entry(n).or_default().push(p);
        }
    }
    for v in by_node.values_mut() {
        v.sort_by(by_age);
    }

    let mut decisions: Vec<(String, Decision)> = Vec::with_capacity(nodes.len());
    for n in nodes {
        let name = n.metadata.name.clone().ok_or_else(|| invalid("node metadata.name", "missing"))?;
        let d = should_run(&spec.template, n).map_err(|m| invalid("spec.template.spec.affinity", m))?;
        decisions.push((name, d));
    }

    // ---- manage ----
    let surge = spec.allows_surge();
    let mut creates: Vec<String> = Vec::new();
    let mut deletes: Vec<Action> = Vec::new();
    let del = |deletes: &mut Vec<Action>, node: &str, pod: &Pod, reason: &str| {
        deletes.push(Action::Delete { node: node.to_string(), pod: pod_name(pod), reason: reason.to_string() });
    };
    for (node, d) in &decisions {
        let daemon_pods = by_node.get(node);
        let exists = daemon_pods.is_some_and(|v| !v.is_empty());
        if d.should_run && !exists {
            creates.push(node.clone());
        } else if d.should_continue_running {
            let mut running: Vec<&Pod> = Vec::new();
            for p in daemon_pods.into_iter().flatten() {
                if deleting(p) {
                    continue;
                }
                match phase(p) {
                    "Failed" => del(&mut deletes, node, p, "failed"),
                    "Succeeded" => del(&mut deletes, node, p, "succeeded"),
                    _ => running.push(p),
                }
            }
            if !surge {
                for p in running.iter().skip(1) {
                    del(&mut deletes, node, p, "duplicate: keeping the oldest pod on the node");
                }
                continue;
            }
            if running.is_empty() {
                if d.should_run {
                    creates.push(node.clone());
                }
                continue;
            }
            if running.len() == 1 {
                continue;
            }
            let (mut oldest_new, mut oldest_old) = (None, None);
            for p in &running {
                if is_updated(p, &hash, generation) {
                    if oldest_new.is_none() {
                        oldest_new = Some(*p);
                        continue;
                    }
                } else if oldest_old.is_none() {
                    oldest_old = Some(*p);
                    continue;
                }
                del(&mut deletes, node, p, "duplicate: keeping the oldest new and the oldest old pod");
            }
            if let (Some(new), Some(old)) = (oldest_new, oldest_old) {
                if !is_ready(old) {
                    del(&mut deletes, node, old, "surge: old pod not ready, the new pod replaces it");
                } else if is_available(new, spec.min_ready_seconds, now) {
                    del(&mut deletes, node, old, "surge: new pod available, the old pod is retired");
                }
            }
        } else if exists {
            for p in daemon_pods.into_iter().flatten() {
                if !deleting(p) {
                    del(&mut deletes, node, p, "node no longer eligible (see its reasons)");
                }
            }
        }
    }
    // Unscheduled pods targeted at nodes that do not exist.
    let known: std::collections::HashSet<&str> = decisions.iter().map(|(n, _)| n.as_str()).collect();
    for (node, v) in &by_node {
        if known.contains(node.as_str()) {
            continue;
        }
        for p in v {
            let unscheduled = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty);
            if unscheduled && !deleting(p) {
                del(&mut deletes, node, p, "unscheduled pod for a node that does not exist");
            }
        }
    }
    let mut actions = cap(creates, deletes);

    // ---- rolling update: only in a sync where manage did nothing ----
    if actions.is_empty() {
        if let Strategy::RollingUpdate { .. } = spec.strategy {
            let (creates, deletes) = rolling_update(&spec, &decisions, &by_node, &hash, now, opts.held);
            actions = cap(creates, deletes);
        }
    }

    let status = status(&spec, &decisions, &by_node, &hash, now);
    let nodes = decisions
        .into_iter()
        .map(|(node, d)| NodePlan {
            node,
            should_run: d.should_run,
            should_continue_running: d.should_continue_running,
            reasons: d.reasons,
        })
        .collect();
    Ok(Plan { revision: Revision { hash }, nodes, actions, status })
}

/// Creates and deletes of one sync, each capped at the burst size.
fn cap(creates: Vec<String>, deletes: Vec<Action>) -> Vec<Action> {
    let mut out: Vec<Action> = creates.into_iter().take(BURST_REPLICAS).map(|node| Action::Create { node }).collect();
    out.extend(deletes.into_iter().take(BURST_REPLICAS));
    out
}

/// `findUpdatedPodsOnNode`: at most one new and one old non-deleted pod.
fn new_and_old<'a>(pods: &[&'a Pod], hash: &str, generation: Option<&str>) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for p in pods.iter().filter(|p| !deleting(p)) {
        let slot = if is_updated(p, hash, generation) { &mut new } else { &mut old };
        if slot.is_some() {
            return None;
        }
        *slot = Some(*p);
    }
    Some((new, old))
}

fn rolling_update(
    spec: &Spec,
    decisions: &[(String, Decision)],
    by_node: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    now: Timestamp,
    held: &dyn Fn(&str) -> bool,
) -> (Vec<String>, Vec<Action>) {
    let generation = spec.template_generation.as_deref();
    let desired = decisions.iter().filter(|(_, d)| d.should_run).count();
    let (max_surge, max_unavailable) = spec.rolling_counts(desired);
    let available = |p: &Pod| is_available(p, spec.min_ready_seconds, now);
    let delete =
        |node: &str, p: &Pod, reason: &str| Action::Delete { node: node.to_string(), pod: pod_name(p), reason: reason.to_string() };

    if max_surge == 0 {
        let mut unavailable = 0usize;
        let mut replacements: Vec<Action> = Vec::new();
        let mut candidates: Vec<Action> = Vec::new();
        for (node, pods) in by_node {
            let Some((new, old)) = new_and_old(pods, hash, generation) else {
                unavailable += 1;
                continue;
            };
            if held(node) {
                if !matches!((new, old), (Some(n), None) if available(n)) && !matches!((new, old), (None, Some(o)) if available(o)) {
                    unavailable += 1;
                }
                continue;
            }
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(n), None) => {
                    if !available(n) {
                        unavailable += 1;
                    }
                }
                (None, Some(o)) => {
                    if !available(o) {
                        replacements.push(delete(node, o, "rolling update: old pod not available, replacing at once"));
                        unavailable += 1;
                    } else if unavailable < max_unavailable {
                        candidates.push(delete(node, o, "rolling update: replacing old pod within maxUnavailable"));
                    }
                }
            }
        }
        let remaining = max_unavailable.saturating_sub(unavailable).min(candidates.len());
        replacements.extend(candidates.into_iter().take(remaining));
        return (Vec::new(), replacements);
    }

    let eligible: BTreeMap<&str, bool> = decisions.iter().map(|(n, d)| (n.as_str(), d.should_run)).collect();
    let mut old_to_delete: Vec<Action> = Vec::new();
    let mut should_not_run: Vec<Action> = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    let mut allowed: Vec<String> = Vec::new();
    let (mut surging, mut available_count) = (0usize, 0usize);
    for (node, pods) in by_node {
        let Some((new, old)) = new_and_old(pods, hash, generation) else {
            surging += 1;
            continue;
        };
        match (old, new) {
            (Some(o), _) if available(o) => available_count += 1,
            (None, Some(n)) if available(n) => available_count += 1,
            _ => {}
        }
        let runs_here = eligible.get(node.as_str()).copied().unwrap_or(false);
        match (old, new) {
            (None, _) => {}
            (Some(o), None) => {
                if held(node) && runs_here {
                    continue;
                }
                if !available(o) {
                    if !runs_here {
                        old_to_delete.push(delete(node, o, "rolling update: old pod not available on an ineligible node"));
                        continue;
                    }
                    allowed.push(node.clone());
                } else {
                    if !runs_here {
                        should_not_run.push(delete(node, o, "rolling update: old pod on an ineligible node"));
                        continue;
                    }
                    if surging >= max_surge {
                        continue;
                    }
                    candidates.push(node.clone());
                }
            }
            (Some(o), Some(n)) => {
                if !available(n) {
                    surging += 1;
                    continue;
                }
                old_to_delete.push(delete(node, o, "surge: new pod available, the old pod is retired"));
            }
        }
    }
    // Pods on nodes that no longer qualify go only once enough others are available.
    let deletable = available_count.saturating_sub(desired).min(should_not_run.len());
    old_to_delete.extend(should_not_run.into_iter().take(deletable));
    let remaining = max_surge.saturating_sub(surging).min(candidates.len());
    allowed.extend(candidates.into_iter().take(remaining));
    (allowed, old_to_delete)
}

fn status(spec: &Spec, decisions: &[(String, Decision)], by_node: &BTreeMap<String, Vec<&Pod>>, hash: &str, now: Timestamp) -> Status {
    let mut s = Status::default();
    for (node, d) in decisions {
        let pods = by_node.get(node).filter(|v| !v.is_empty());
        if d.should_run {
            s.desired_number_scheduled += 1;
            let Some(pods) = pods else { continue };
            s.current_number_scheduled += 1;
            let pod = pods[0];
            if is_ready(pod) {
                s.number_ready += 1;
                if is_available(pod, spec.min_ready_seconds, now) {
                    s.number_available += 1;
                }
            }
            if is_updated(pod, hash, spec.template_generation.as_deref()) {
                s.updated_number_scheduled += 1;
            }
        } else if pods.is_some() {
            s.number_misscheduled += 1;
        }
    }
    s.number_unavailable = s.desired_number_scheduled.saturating_sub(s.number_available);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::{at, daemonset, node, pod};

    const NOW: i64 = 10_000;

    fn ds() -> DaemonSet {
        daemonset("agent:2", None, None, false)
    }

    fn h(d: &DaemonSet) -> String {
        revision_hash(d)
    }

    fn ready(name: &str, n: &str, hash: &str) -> Pod {
        pod(name, n, hash, at(100), "Running", Some(at(200)))
    }

    fn creates(p: &Plan) -> Vec<&str> {
        p.actions.iter().filter_map(|a| if let Action::Create { node } = a { Some(node.as_str()) } else { None }).collect()
    }

    fn deletes(p: &Plan) -> Vec<(&str, &str)> {
        p.actions
            .iter()
            .filter_map(|a| if let Action::Delete { pod, reason, .. } = a { Some((pod.as_str(), reason.as_str())) } else { None })
            .collect()
    }

    fn run(d: &DaemonSet, nodes: &[Node], pods: &[Pod]) -> Plan {
        plan(d, nodes, pods, at(NOW), None).unwrap()
    }

    #[test]
    fn creates_where_missing_and_keeps_the_rest() {
        let d = ds();
        let nodes = [node("a", &[], &[]), node("b", &[], &[])];
        let p = run(&d, &nodes, &[ready("pa", "a", &h(&d))]);
        assert_eq!(creates(&p), vec!["b"]);
        assert!(deletes(&p).is_empty());
        assert_eq!(
            p.status,
            Status {
                desired_number_scheduled: 2,
                current_number_scheduled: 1,
                number_ready: 1,
                updated_number_scheduled: 1,
                number_available: 1,
                number_unavailable: 1,
                number_misscheduled: 0
            }
        );
    }

    #[test]
    fn failed_pods_are_deleted_without_a_create_in_the_same_sync() {
        let d = ds();
        let p = run(&d, &[node("a", &[], &[])], &[pod("pa", "a", &h(&d), at(100), "Failed", None)]);
        assert_eq!(deletes(&p), vec![("pa", "failed")]);
        assert!(creates(&p).is_empty());
        let p = run(&d, &[node("a", &[], &[])], &[pod("pa", "a", &h(&d), at(100), "Succeeded", None)]);
        assert_eq!(deletes(&p), vec![("pa", "succeeded")]);
    }

    #[test]
    fn duplicates_keep_the_oldest() {
        let d = ds();
        let old = pod("older", "a", &h(&d), at(50), "Running", Some(at(60)));
        let young = pod("younger", "a", &h(&d), at(70), "Running", Some(at(80)));
        let p = run(&d, &[node("a", &[], &[])], &[young, old]);
        assert_eq!(deletes(&p).iter().map(|x| x.0).collect::<Vec<_>>(), vec!["younger"]);
    }

    #[test]
    fn pods_being_deleted_are_skipped_and_block_creation() {
        let d = ds();
        let mut p0 = ready("pa", "a", &h(&d));
        p0.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(NOW - 1)));
        let p = run(&d, &[node("a", &[], &[])], &[p0]);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
    }

    #[test]
    fn ineligible_nodes_lose_their_pods() {
        let d = ds();
        let tainted = node("a", &[], &[("dedicated", Some("db"), "NoExecute")]);
        let p = run(&d, &[tainted], &[ready("pa", "a", &h(&d))]);
        assert_eq!(deletes(&p)[0].0, "pa");
        assert_eq!(p.status.number_misscheduled, 1);
        assert_eq!(p.status.desired_number_scheduled, 0);
        // NoSchedule only: the pod may stay, no new one comes.
        let ns = node("a", &[], &[("dedicated", Some("db"), "NoSchedule")]);
        let p = run(&d, std::slice::from_ref(&ns), &[ready("pa", "a", &h(&d))]);
        assert!(p.actions.is_empty());
        assert!(creates(&run(&d, &[ns], &[])).is_empty());
    }

    #[test]
    fn unscheduled_pods_for_missing_nodes_are_deleted() {
        let d = ds();
        let mut orphan = ready("pz", "gone", &h(&d));
        orphan.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            affinity: Some(k8s_openapi::api::core::v1::Affinity {
                node_affinity: Some(k8s_openapi::api::core::v1::NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(k8s_openapi::api::core::v1::NodeSelector {
                        node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
                            match_fields: Some(vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
                                key: "metadata.name".into(),
                                operator: "In".into(),
                                values: Some(vec!["gone".into()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let p = run(&d, &[node("a", &[], &[])], &[ready("pa", "a", &h(&d)), orphan]);
        assert_eq!(deletes(&p), vec![("pz", "unscheduled pod for a node that does not exist")]);
    }

    #[test]
    fn pods_of_others_are_ignored() {
        let d = ds();
        let mut other = ready("x", "a", &h(&d));
        other.metadata.owner_references.as_mut().unwrap()[0].uid = "another-uid".into();
        let p = run(&d, &[node("a", &[], &[])], &[other]);
        assert_eq!(creates(&p), vec!["a"]);
    }

    fn old_cluster(n: usize) -> (Vec<Node>, Vec<Pod>) {
        let nodes: Vec<Node> = (0..n).map(|i| node(&format!("n{i}"), &[], &[])).collect();
        let pods = (0..n).map(|i| ready(&format!("p{i}"), &format!("n{i}"), "oldhash")).collect();
        (nodes, pods)
    }

    #[test]
    fn rolling_update_respects_max_unavailable() {
        let (nodes, pods) = old_cluster(10);
        let d = daemonset("agent:2", Some(IntOrString::Int(3)), None, false);
        let p = run(&d, &nodes, &pods);
        assert_eq!(deletes(&p).len(), 3);
        assert!(deletes(&p).iter().all(|(_, r)| r.starts_with("rolling update")));
        // Percentages round up: 25% of 10 is 3.
        let d = daemonset("agent:2", Some(IntOrString::String("25%".into())), None, false);
        assert_eq!(deletes(&run(&d, &nodes, &pods)).len(), 3);
        // An unavailable new pod uses up the budget.
        let d = daemonset("agent:2", Some(IntOrString::Int(1)), None, false);
        let mut pods2 = pods.clone();
        pods2[0] = pod("p0", "n0", &h(&d), at(NOW - 1), "Running", None);
        assert!(run(&d, &nodes, &pods2).actions.is_empty());
    }

    #[test]
    fn unavailable_old_pods_are_replaced_at_once() {
        let (nodes, mut pods) = old_cluster(4);
        pods[1] = pod("p1", "n1", "oldhash", at(100), "Running", None);
        pods[2] = pod("p2", "n2", "oldhash", at(100), "Running", None);
        let d = daemonset("agent:2", Some(IntOrString::Int(1)), None, false);
        let p = run(&d, &nodes, &pods);
        let names: Vec<&str> = deletes(&p).iter().map(|x| x.0).collect();
        assert_eq!(names, vec!["p1", "p2"], "both unavailable old pods go, no available one");
    }

    #[test]
    fn rolling_update_waits_for_manage() {
        let (mut nodes, pods) = old_cluster(3);
        nodes.push(node("new", &[], &[]));
        let d = daemonset("agent:2", Some(IntOrString::Int(1)), None, false);
        let p = run(&d, &nodes, &pods);
        assert_eq!(creates(&p), vec!["new"]);
        assert!(deletes(&p).is_empty(), "no update in a sync where manage acted");
    }

    #[test]
    fn min_ready_seconds_gate_availability() {
        let d = {
            let mut d = daemonset("agent:2", Some(IntOrString::Int(1)), None, false);
            d.spec.as_mut().unwrap().min_ready_seconds = Some(30);
            d
        };
        let (nodes, mut pods) = old_cluster(3);
        pods[0] = pod("p0", "n0", &h(&d), at(NOW - 100), "Running", Some(at(NOW - 10)));
        let p = run(&d, &nodes, &pods);
        assert!(p.actions.is_empty(), "new pod Ready for 10s < 30s is unavailable");
        assert_eq!((p.status.number_ready, p.status.number_available), (3, 2));
        pods[0] = pod("p0", "n0", &h(&d), at(NOW - 100), "Running", Some(at(NOW - 31)));
        assert_eq!(deletes(&run(&d, &nodes, &pods)).len(), 1);
    }

    #[test]
    fn surge_creates_beside_old_pods() {
        let (nodes, pods) = old_cluster(10);
        let d = daemonset("agent:2", Some(IntOrString::Int(0)), Some(IntOrString::Int(2)), false);
        let p = run(&d, &nodes, &pods);
        assert_eq!(creates(&p).len(), 2);
        assert!(deletes(&p).is_empty());
        // A new, available pod retires the old one.
        let mut pods2 = pods.clone();
        pods2.push(pod("new0", "n0", &h(&d), at(NOW - 50), "Running", Some(at(NOW - 40))));
        let p = run(&d, &nodes, &pods2);
        assert!(deletes(&p).contains(&("p0", "surge: new pod available, the old pod is retired")), "{:?}", p.actions);
        // An unavailable old pod gets its replacement at once.
        let mut pods3 = pods.clone();
        pods3[5] = pod("p5", "n5", "oldhash", at(100), "Running", None);
        let p = run(&d, &nodes, &pods3);
        assert!(creates(&p).contains(&"n5"));
        assert_eq!(creates(&p).len(), 3, "the unavailable node plus maxSurge candidates");
    }

    #[test]
    fn surge_manage_keeps_oldest_new_and_oldest_old() {
        let d = daemonset("agent:2", Some(IntOrString::Int(0)), Some(IntOrString::Int(1)), false);
        let old = pod("old", "a", "oldhash", at(10), "Running", Some(at(20)));
        let new_ready = pod("new", "a", &h(&d), at(NOW - 100), "Running", Some(at(NOW - 50)));
        let p = run(&d, &[node("a", &[], &[])], &[old.clone(), new_ready]);
        assert_eq!(deletes(&p), vec![("old", "surge: new pod available, the old pod is retired")]);
        let new_pending = pod("new", "a", &h(&d), at(NOW - 1), "Pending", None);
        assert!(run(&d, &[node("a", &[], &[])], &[old.clone(), new_pending]).actions.is_empty());
        let old_unready = pod("old", "a", "oldhash", at(10), "Running", None);
        let new_pending = pod("new", "a", &h(&d), at(NOW - 1), "Pending", None);
        let p = run(&d, &[node("a", &[], &[])], &[old_unready, new_pending]);
        assert_eq!(deletes(&p), vec![("old", "surge: old pod not ready, the new pod replaces it")]);
    }

    #[test]
    fn on_delete_never_deletes_for_an_update() {
        let (nodes, pods) = old_cluster(5);
        let d = daemonset("agent:2", None, None, true);
        let p = run(&d, &nodes, &pods);
        assert!(p.actions.is_empty());
        assert_eq!(p.status.updated_number_scheduled, 0);
    }

    #[test]
    fn both_zero_means_one_unavailable() {
        let (nodes, pods) = old_cluster(5);
        let d = daemonset("agent:2", Some(IntOrString::Int(0)), Some(IntOrString::Int(0)), false);
        assert_eq!(deletes(&run(&d, &nodes, &pods)).len(), 1);
    }

    #[test]
    fn validation_names_the_field() {
        let d = daemonset("agent:2", Some(IntOrString::Int(1)), Some(IntOrString::Int(1)), false);
        let e = plan(&d, &[], &[], at(0), None).unwrap_err();
        assert_eq!(e.field, "spec.updateStrategy.rollingUpdate.maxSurge");
        let d = daemonset("agent:2", Some(IntOrString::String("150%".into())), None, false);
        assert_eq!(plan(&d, &[], &[], at(0), None).unwrap_err().field, "spec.updateStrategy.rollingUpdate.maxUnavailable");
        let mut d = ds();
        d.spec.as_mut().unwrap().template.metadata.as_mut().unwrap().labels = Some([("app".into(), "other".into())].into());
        assert_eq!(plan(&d, &[], &[], at(0), None).unwrap_err().field, "spec.template.metadata.labels");
    }

    #[test]
    fn creates_and_deletes_are_capped_per_sync() {
        let d = ds();
        let nodes: Vec<Node> = (0..600).map(|i| node(&format!("n{i}"), &[], &[])).collect();
        assert_eq!(creates(&run(&d, &nodes, &[])).len(), BURST_REPLICAS);
    }

    #[test]
    fn hash_is_stable_and_follows_the_template() {
        let a = daemonset("agent:1", None, None, false);
        let b = daemonset("agent:2", None, None, false);
        assert_eq!(revision_hash(&a), revision_hash(&a.clone()));
        assert_ne!(revision_hash(&a), revision_hash(&b));
        assert!(revision_hash(&a).chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)));
        // The strategy is not part of the template.
        let c = daemonset("agent:1", Some(IntOrString::Int(5)), None, false);
        assert_eq!(revision_hash(&a), revision_hash(&c));
    }
}
