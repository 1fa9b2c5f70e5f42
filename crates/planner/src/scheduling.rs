//! Which nodes a DaemonSet's pod must run on, with the upstream daemon
//! controller's semantics (`NodeShouldRunDaemonPod`, Kubernetes 1.27+):
//! a simulated pod from the template plus the default daemon tolerations;
//! the template's `nodeName`, `nodeSelector` and required node affinity; and
//! the node's NoSchedule/NoExecute taints. Resources, host ports and the
//! node's Ready condition are not considered. Each decision comes with the
//! reasons a person needs: the expression that failed, the taint that is not
//! tolerated, and what would fix it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration};

/// The tolerations the controller adds to every daemon pod.
pub fn default_tolerations(host_network: bool) -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some(effect.to_string()),
        ..Default::default()
    };
    let mut v = vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        v.push(t("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    v
}

/// The template's tolerations with the defaults added (an existing
/// toleration for the same key and effect is kept).
pub fn daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut all = spec.tolerations.clone().unwrap_or_default();
    for d in default_tolerations(spec.host_network.unwrap_or(false)) {
        let present = all.iter().any(|t| t.key == d.key && t.effect == d.effect);
        if !present {
            all.push(d);
        }
    }
    all
}

/// Whether a toleration tolerates a taint (`v1.Toleration.ToleratesTaint`).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty()) {
        if e != taint.effect {
            return false;
        }
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => key == taint.key && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// Formats a taint as `key=value:Effect`.
pub fn taint_string(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={}:{}", t.key, v, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// Why a requirement did not match.
fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> Result<bool, String> {
    let values = r.values.clone().unwrap_or_default();
    Ok(match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let bound: i64 =
                values.first().and_then(|b| b.parse().ok()).ok_or_else(|| format!("{} {} needs one integer value", r.key, r.operator))?;
            match value.and_then(|v| v.parse::<i64>().ok()) {
                Some(v) if r.operator == "Gt" => v > bound,
                Some(v) => v < bound,
                None => false,
            }
        }
        op => return Err(format!("unknown operator {op:?} for {}", r.key)),
    })
}

fn requirement_string(r: &NodeSelectorRequirement) -> String {
    let values = r.values.clone().unwrap_or_default();
    match r.operator.as_str() {
        "Exists" | "DoesNotExist" => format!("{} {}", r.key, r.operator),
        _ => format!("{} {} [{}]", r.key, r.operator, values.join(", ")),
    }
}

/// A term matches when all its expressions and fields match. Returns the
/// first failing expression, described.
fn term_failure(term: &NodeSelectorTerm, node: &Node) -> Result<Option<String>, String> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let exprs = term.match_expressions.clone().unwrap_or_default();
    let fields = term.match_fields.clone().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches no objects.
        return Ok(Some("an empty nodeSelectorTerm matches no node".into()));
    }
    for r in &exprs {
        if !requirement_matches(r, labels.get(&r.key).map(String::as_str))? {
            let have = labels.get(&r.key).map(|v| format!("{}={v}", r.key)).unwrap_or_else(|| format!("no label {}", r.key));
            return Ok(Some(format!("label expression `{}` not satisfied (node has {have})", requirement_string(r))));
        }
    }
    for r in &fields {
        if r.key != "metadata.name" {
            return Err(format!("unsupported matchFields key {:?}", r.key));
        }
        if !requirement_matches(r, node.metadata.name.as_deref())? {
            return Ok(Some(format!("field expression `{}` not satisfied", requirement_string(r))));
        }
    }
    Ok(None)
}

/// The outcome for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub should_run: bool,
    pub should_continue_running: bool,
    /// Why not (empty when the pod should run), each with its fix.
    pub reasons: Vec<String>,
}

/// `NodeShouldRunDaemonPod`: (should run, should continue running), with reasons.
pub fn should_run(spec: &PodSpec, node: &Node) -> Result<Decision, String> {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let mut reasons = Vec::new();
    // A template naming another node.
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        if n != node_name {
            reasons.push(format!("the pod template sets nodeName {n:?}; remove spec.template.spec.nodeName to run on {node_name:?}"));
            return Ok(Decision { should_run: false, should_continue_running: false, reasons });
        }
    }
    // nodeSelector: every label must match.
    let labels: BTreeMap<String, String> = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in spec.node_selector.clone().unwrap_or_default() {
        if labels.get(&k) != Some(&v) {
            let have = labels.get(&k).map(|x| format!("{k}={x}")).unwrap_or_else(|| format!("no label {k}"));
            reasons.push(format!("nodeSelector {k}={v} does not match (node has {have}); fix: kubectl label node {node_name} {k}={v} --overwrite, or change the nodeSelector"));
        }
    }
    // Required node affinity: terms ORed.
    let required: Option<NodeSelector> = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.clone());
    if let Some(sel) = required {
        let mut failures = Vec::new();
        let mut matched = false;
        for term in &sel.node_selector_terms {
            match term_failure(term, node)? {
                None => {
                    matched = true;
                    break;
                }
                Some(f) => failures.push(f),
            }
        }
        if !matched {
            let fix = "fix: label the node to satisfy one term, or relax spec.template.spec.affinity.nodeAffinity";
            if failures.is_empty() {
                reasons.push(format!("required node affinity has no terms, so it matches no node; {fix}"));
            }
            for f in failures {
                reasons.push(format!("required node affinity: {f}; {fix}"));
            }
        }
    }
    if !reasons.is_empty() {
        return Ok(Decision { should_run: false, should_continue_running: false, reasons });
    }
    // Taints: NoSchedule and NoExecute count; PreferNoSchedule does not.
    let tolerations = daemon_tolerations(spec);
    let mut no_execute = false;
    for taint in node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default() {
        if taint.effect != "NoSchedule" && taint.effect != "NoExecute" {
            continue;
        }
        if tolerations.iter().any(|t| tolerates(t, &taint)) {
            continue;
        }
        no_execute |= taint.effect == "NoExecute";
        let toleration = match taint.value.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => format!("{{key: {}, operator: Equal, value: {v}, effect: {}}}", taint.key, taint.effect),
            None => format!("{{key: {}, operator: Exists, effect: {}}}", taint.key, taint.effect),
        };
        reasons.push(format!(
            "taint {} is not tolerated; fix: add the toleration {toleration} to spec.template.spec.tolerations",
            taint_string(&taint)
        ));
    }
    if reasons.is_empty() {
        return Ok(Decision { should_run: true, should_continue_running: true, reasons });
    }
    // Scheduled daemon pods keep running unless a NoExecute taint is untolerated.
    Ok(Decision { should_run: false, should_continue_running: !no_execute, reasons })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::node;
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity};

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn affinity(terms: Vec<NodeSelectorTerm>) -> PodSpec {
        PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector { node_selector_terms: terms }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn run(spec: &PodSpec, n: &Node) -> (bool, bool) {
        let d = should_run(spec, n).unwrap();
        (d.should_run, d.should_continue_running)
    }

    #[test]
    fn default_tolerations_cover_node_conditions() {
        let spec = PodSpec::default();
        for (k, e) in [
            ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
            ("node.kubernetes.io/disk-pressure", "NoSchedule"),
            ("node.kubernetes.io/memory-pressure", "NoSchedule"),
            ("node.kubernetes.io/pid-pressure", "NoSchedule"),
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
        ] {
            assert_eq!(run(&spec, &node("n", &[], &[(k, None, e)])), (true, true), "{k}");
        }
        // network-unavailable only with hostNetwork.
        let net = node("n", &[], &[("node.kubernetes.io/network-unavailable", None, "NoSchedule")]);
        assert_eq!(run(&spec, &net), (false, true));
        let host = PodSpec { host_network: Some(true), ..Default::default() };
        assert_eq!(run(&host, &net), (true, true));
    }

    #[test]
    fn node_name_mismatch() {
        let spec = PodSpec { node_name: Some("other".into()), ..Default::default() };
        assert_eq!(run(&spec, &node("n", &[], &[])), (false, false));
        let spec = PodSpec { node_name: Some("n".into()), ..Default::default() };
        assert_eq!(run(&spec, &node("n", &[], &[])), (true, true));
    }

    #[test]
    fn node_selector() {
        let spec = PodSpec { node_selector: Some([("gpu".to_string(), "true".to_string())].into()), ..Default::default() };
        assert_eq!(run(&spec, &node("n", &[("gpu", "true")], &[])), (true, true));
        let d = should_run(&spec, &node("n", &[("gpu", "false")], &[])).unwrap();
        assert_eq!((d.should_run, d.should_continue_running), (false, false));
        assert!(
            d.reasons[0].contains("nodeSelector gpu=true") && d.reasons[0].contains("kubectl label node n gpu=true"),
            "{:?}",
            d.reasons
        );
    }

    #[test]
    fn affinity_operators() {
        let n = node("n", &[("zone", "a"), ("cores", "8")], &[]);
        let one = |r| affinity(vec![NodeSelectorTerm { match_expressions: Some(vec![r]), ..Default::default() }]);
        assert_eq!(run(&one(req("zone", "In", &["a", "b"])), &n), (true, true));
        assert_eq!(run(&one(req("zone", "In", &["b"])), &n), (false, false));
        assert_eq!(run(&one(req("zone", "NotIn", &["b"])), &n), (true, true));
        assert_eq!(run(&one(req("zone", "NotIn", &["a"])), &n), (false, false));
        assert_eq!(run(&one(req("absent", "NotIn", &["a"])), &n), (true, true));
        assert_eq!(run(&one(req("zone", "Exists", &[])), &n), (true, true));
        assert_eq!(run(&one(req("ssd", "Exists", &[])), &n), (false, false));
        assert_eq!(run(&one(req("ssd", "DoesNotExist", &[])), &n), (true, true));
        assert_eq!(run(&one(req("cores", "Gt", &["4"])), &n), (true, true));
        assert_eq!(run(&one(req("cores", "Gt", &["8"])), &n), (false, false));
        assert_eq!(run(&one(req("cores", "Lt", &["9"])), &n), (true, true));
        assert_eq!(run(&one(req("zone", "Lt", &["9"])), &n), (false, false), "non-integer label never matches Gt/Lt");
        assert!(should_run(&one(req("cores", "Gt", &["x"])), &n).is_err());
        assert!(should_run(&one(req("cores", "Near", &["1"])), &n).is_err());
    }

    #[test]
    fn affinity_terms_or_expressions_and() {
        let n = node("n", &[("zone", "a"), ("disk", "ssd")], &[]);
        let and_fail = affinity(vec![NodeSelectorTerm {
            match_expressions: Some(vec![req("zone", "In", &["a"]), req("disk", "In", &["hdd"])]),
            ..Default::default()
        }]);
        assert_eq!(run(&and_fail, &n), (false, false));
        let or_ok = affinity(vec![
            NodeSelectorTerm { match_expressions: Some(vec![req("disk", "In", &["hdd"])]), ..Default::default() },
            NodeSelectorTerm { match_expressions: Some(vec![req("zone", "In", &["a"])]), ..Default::default() },
        ]);
        assert_eq!(run(&or_ok, &n), (true, true));
        let fields =
            affinity(vec![NodeSelectorTerm { match_fields: Some(vec![req("metadata.name", "In", &["n"])]), ..Default::default() }]);
        assert_eq!(run(&fields, &n), (true, true));
        assert_eq!(run(&fields, &node("m", &[], &[])), (false, false));
        let empty = affinity(vec![NodeSelectorTerm::default()]);
        assert_eq!(run(&empty, &n), (false, false));
        assert_eq!(run(&affinity(vec![]), &n), (false, false), "no terms match nothing");
    }

    #[test]
    fn taints() {
        let spec = PodSpec::default();
        let ns = node("n", &[], &[("dedicated", Some("gpu"), "NoSchedule")]);
        let d = should_run(&spec, &ns).unwrap();
        assert_eq!((d.should_run, d.should_continue_running), (false, true));
        assert!(
            d.reasons[0].contains("taint dedicated=gpu:NoSchedule") && d.reasons[0].contains("operator: Equal, value: gpu"),
            "{:?}",
            d.reasons
        );
        let ne = node("n", &[], &[("dedicated", None, "NoExecute")]);
        assert_eq!(run(&spec, &ne), (false, false));
        let pref = node("n", &[], &[("x", None, "PreferNoSchedule")]);
        assert_eq!(run(&spec, &pref), (true, true));
        let all =
            PodSpec { tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]), ..Default::default() };
        assert_eq!(run(&all, &ne), (true, true));
        let cp = node("cp", &[], &[("node-role.kubernetes.io/control-plane", None, "NoSchedule")]);
        assert_eq!(run(&spec, &cp), (false, true));
        let tol = PodSpec {
            tolerations: Some(vec![Toleration {
                key: Some("node-role.kubernetes.io/control-plane".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(run(&tol, &cp), (true, true));
    }

    #[test]
    fn toleration_matching() {
        let taint = Taint { key: "k".into(), value: Some("v".into()), effect: "NoSchedule".into(), ..Default::default() };
        let t = |k: Option<&str>, op: Option<&str>, v: Option<&str>, e: Option<&str>| Toleration {
            key: k.map(Into::into),
            operator: op.map(Into::into),
            value: v.map(Into::into),
            effect: e.map(Into::into),
            ..Default::default()
        };
        assert!(tolerates(&t(Some("k"), Some("Equal"), Some("v"), Some("NoSchedule")), &taint));
        assert!(tolerates(&t(Some("k"), None, Some("v"), None), &taint), "empty operator is Equal, empty effect any");
        assert!(!tolerates(&t(Some("k"), Some("Equal"), Some("w"), None), &taint));
        assert!(!tolerates(&t(Some("k"), Some("Exists"), None, Some("NoExecute")), &taint));
        assert!(tolerates(&t(None, Some("Exists"), None, None), &taint));
        assert!(!tolerates(&t(Some("j"), Some("Exists"), None, None), &taint));
    }
}
