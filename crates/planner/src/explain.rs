//! The report of `node-agent explain`: given a DaemonSet, the nodes, its
//! pods and its revisions (read from a live cluster by the binary), plan with
//! the same library and say for each node without an agent pod why not and
//! what would fix it. Pure: no API calls here.

use std::fmt::Write;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::plan::{self, Plan, REVISION_LABEL};
use crate::SYSTEM_NODE_CRITICAL;

/// Errors of `explain`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    /// With `--node` on a node that runs a pod: (node, pod, its state).
    pub running: Vec<(String, String, String)>,
    pub warnings: Vec<String>,
}

/// What was read from the cluster.
#[derive(Debug, Default)]
pub struct Cluster {
    pub daemonset: DaemonSet,
    pub nodes: Vec<Node>,
    /// The DaemonSet's pods (those its selector matches).
    pub pods: Vec<Pod>,
    pub revisions: Vec<ControllerRevision>,
    /// The value of the template's PriorityClass, when it names one (see
    /// [`priority_class`]).
    pub priority_class_value: Option<i32>,
}

/// The DaemonSet's selector as a label selector string, to list its pods
/// and revisions with.
pub fn selector_string(ds: &DaemonSet) -> String {
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

/// The PriorityClass whose value the report needs: the template's, when
/// it names one and sets no priority itself.
pub fn priority_class(ds: &DaemonSet) -> Option<String> {
    let template = ds.spec.as_ref()?.template.spec.as_ref()?;
    template.priority.is_none().then(|| template.priority_class_name.clone()).flatten()
}

/// Explains placement for `node` (or every node without an agent pod).
pub fn explain(c: &Cluster, namespace: &str, name: &str, node: Option<&str>, now: Timestamp) -> Result<Report, Error> {
    let Cluster { daemonset: ds, nodes, pods, revisions, priority_class_value } = c;
    let hash = current_hash(revisions, ds);
    let plan = plan::plan(ds, nodes, pods, now, hash.as_deref()).map_err(|e| Error::Invalid(format!("{namespace}/{name}"), e))?;
    if let Some(n) = node {
        if !plan.nodes.iter().any(|p| p.node == n) {
            return Err(Error::NoNode(n.to_string()));
        }
    }
    let live = || pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none());
    let with_pod: std::collections::HashSet<String> = live().filter_map(plan::target_node).collect();
    let missing: Vec<String> = plan
        .nodes
        .iter()
        .filter(|p| node.is_none_or(|n| n == p.node))
        .filter(|p| !with_pod.contains(&p.node))
        .map(|p| p.node.clone())
        .collect();
    // Asked about one node that runs its pod: say so, and how the pod is.
    let running: Vec<(String, String, String)> = match node {
        Some(n) => live()
            .filter(|p| plan::target_node(p).as_deref() == Some(n))
            .map(|p| (n.to_string(), p.metadata.name.clone().unwrap_or_default(), pod_state(p)))
            .collect(),
        None => Vec::new(),
    };

    // Priority: infrastructure agents should not be the first evicted.
    let mut warnings = Vec::new();
    let template = ds.spec.as_ref().and_then(|s| s.template.spec.clone()).unwrap_or_default();
    let priority = template.priority.or(*priority_class_value);
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
    Ok(Report { daemonset: format!("{namespace}/{name}"), plan, missing, running, warnings })
}

/// A pod's phase and readiness, e.g. `Running, Ready`.
fn pod_state(p: &Pod) -> String {
    let st = p.status.as_ref();
    let phase = st.and_then(|s| s.phase.clone()).unwrap_or_else(|| "Pending".into());
    let ready = st.and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    format!("{phase}, {}", if ready { "Ready" } else { "not Ready" })
}

/// Renders a report for a person.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "DaemonSet {} (revision {})", r.daemonset, r.plan.revision.hash);
    for (node, pod, state) in &r.running {
        let _ = writeln!(s, "node {node}: runs agent pod {pod} ({state})");
    }
    if r.missing.is_empty() && r.running.is_empty() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::{at, daemonset, node, pod};

    #[test]
    fn asked_about_a_node_that_runs_its_pod_it_says_so() {
        let ds = daemonset("agent:1", None, None, false);
        let c = Cluster {
            daemonset: ds,
            nodes: vec![node("a", &[], &[]), node("b", &[], &[])],
            pods: vec![pod("agent-a", "a", "h", at(0), "Running", Some(at(1)))],
            ..Default::default()
        };
        let r = explain(&c, "monitoring", "node-agent", Some("a"), at(100)).expect("report");
        assert!(r.missing.is_empty(), "{:?}", r.missing);
        let text = render(&r);
        assert!(text.contains("node a: runs agent pod agent-a (Running, Ready)"), "{text}");
        assert!(!text.contains("will create"), "{text}");
        // The node without one is still explained.
        let r = explain(&c, "monitoring", "node-agent", Some("b"), at(100)).expect("report");
        assert_eq!(r.missing, vec!["b".to_string()]);
        assert!(render(&r).contains("node b: eligible; the controller will create its pod"));
    }
}
