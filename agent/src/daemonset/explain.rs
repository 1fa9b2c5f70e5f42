//! `node-agent explain`: reads a DaemonSet, the nodes, its pods and its
//! revisions through kube-rs, plans with the same library, and says for each
//! node without an agent pod why not and what would fix it.

use std::fmt::Write;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::Client;

use super::plan::{self, Plan, REVISION_LABEL};
use super::SYSTEM_NODE_CRITICAL;

/// Errors of `explain`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("DaemonSet {0}: {1}")]
    Invalid(String, plan::Invalid),
    #[error("node {0} not found")]
    NoNode(String),
}

/// What `explain` found.
#[derive(Debug)]
pub struct Report {
    pub daemonset: String,
    pub plan: Plan,
    /// Nodes without a pod of the DaemonSet.
    pub missing: Vec<String>,
    pub warnings: Vec<String>,
}

fn selector_string(ds: &DaemonSet) -> String {
    let sel = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    let mut parts: Vec<String> = sel.match_labels.unwrap_or_default().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    for e in sel.match_expressions.unwrap_or_default() {
        let values = e.values.unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// The hash of the DaemonSet's newest ControllerRevision, as the cluster's
/// own controller computed it.
fn current_hash(revisions: &[ControllerRevision], ds: &DaemonSet) -> Option<String> {
    let uid = ds.metadata.uid.as_deref();
    revisions
        .iter()
        .filter(|r| r.metadata.owner_references.as_ref().is_some_and(|o| o.iter().any(|o| Some(o.uid.as_str()) == uid || uid.is_none())))
        .max_by_key(|r| r.revision)
        .and_then(|r| r.metadata.labels.as_ref()?.get(REVISION_LABEL).cloned())
}

/// Reads the cluster and explains placement for `node` (or every node
/// without an agent pod).
pub async fn explain(client: Client, namespace: &str, name: &str, node: Option<&str>, now: Timestamp) -> Result<Report, Error> {
    let ds: DaemonSet = Api::namespaced(client.clone(), namespace).get(name).await?;
    let nodes: Vec<Node> = Api::<Node>::all(client.clone()).list(&ListParams::default()).await?.items;
    let lp = ListParams::default().labels(&selector_string(&ds));
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), namespace).list(&lp).await?.items;
    let revisions: Vec<ControllerRevision> = Api::<ControllerRevision>::namespaced(client.clone(), namespace).list(&lp).await?.items;
    let hash = current_hash(&revisions, &ds);
    let plan = plan::plan(&ds, &nodes, &pods, now, hash.as_deref()).map_err(|e| Error::Invalid(format!("{namespace}/{name}"), e))?;
    if let Some(n) = node {
        if !plan.nodes.iter().any(|p| p.node == n) {
            return Err(Error::NoNode(n.to_string()));
        }
    }
    let with_pod: std::collections::HashSet<String> = pods.iter().filter_map(plan::target_node).collect();
    let missing: Vec<String> = plan
        .nodes
        .iter()
        .filter(|p| node.is_none_or(|n| n == p.node))
        .filter(|p| node.is_some() || !with_pod.contains(&p.node))
        .map(|p| p.node.clone())
        .collect();

    // Priority: infrastructure agents should not be the first evicted.
    let mut warnings = Vec::new();
    let template = ds.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap_or_default();
    let priority = match (&template.priority_class_name, template.priority) {
        (_, Some(p)) => Some(p),
        (Some(pc), None) => Api::<PriorityClass>::all(client).get_opt(pc).await?.map(|pc| pc.value),
        (None, None) => None,
    };
    let pressured: Vec<String> = nodes
        .iter()
        .filter(|n| {
            n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| matches!(c.type_.as_str(), "MemoryPressure" | "DiskPressure" | "PIDPressure") && c.status == "True")
            })
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    if !pressured.is_empty() {
        match priority {
            None => warnings.push(format!(
                "the DaemonSet runs without a PriorityClass while nodes are under pressure ({}): its pods may be evicted or preempted first; set spec.template.spec.priorityClassName: system-node-critical (or a class of at least {SYSTEM_NODE_CRITICAL})",
                pressured.join(", ")
            )),
            Some(p) if p < SYSTEM_NODE_CRITICAL => warnings.push(format!(
                "the DaemonSet's priority {p} is below system-node-critical ({SYSTEM_NODE_CRITICAL}) while nodes are under pressure ({})",
                pressured.join(", ")
            )),
            _ => {}
        }
    }
    Ok(Report { daemonset: format!("{namespace}/{name}"), plan, missing, warnings })
}

/// Renders a report for a person.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "DaemonSet {} (revision {})", r.daemonset, r.plan.revision.hash);
    if r.missing.is_empty() {
        let _ = writeln!(s, "Every node runs an agent pod.");
    }
    for n in &r.missing {
        let Some(p) = r.plan.nodes.iter().find(|p| &p.node == n) else { continue };
        if p.should_run {
            let _ = writeln!(s, "node {n}: eligible; the controller will create its pod (nothing blocks it)");
            continue;
        }
        let _ = writeln!(s, "node {n}: no agent pod, because:");
        for reason in &p.reasons {
            let _ = writeln!(s, "  - {reason}");
        }
    }
    for w in &r.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    s
}
