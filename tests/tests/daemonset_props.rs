//! Property tests of the DaemonSet planner over random clusters, driving
//! whole rollouts through the simulator: maxUnavailable (and with surge,
//! maxSurge) is never exceeded, every eligible node converges to exactly one
//! updated, ready pod, no pod is left on an ineligible node, OnDelete never
//! deletes for an update, and every sync's status is consistent.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use planner::builders::{daemonset, node};
use planner::simulate::{final_state_ok, Cluster, Config};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Strat {
    Unavailable(IntOrString),
    Surge(IntOrString),
    OnDelete,
}

fn strat() -> impl Strategy<Value = Strat> {
    prop_oneof![
        (1..5i32).prop_map(|i| Strat::Unavailable(IntOrString::Int(i))),
        (10..60u32).prop_map(|p| Strat::Unavailable(IntOrString::String(format!("{p}%")))),
        (1..4i32).prop_map(|i| Strat::Surge(IntOrString::Int(i))),
        (10..40u32).prop_map(|p| Strat::Surge(IntOrString::String(format!("{p}%")))),
        Just(Strat::OnDelete),
    ]
}

/// Node kinds: plain, control plane, dedicated (NoExecute), not ready, zone b.
fn nodes(kinds: &[u8]) -> Vec<Node> {
    kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let name = format!("node-{i:05}");
            match k % 5 {
                0 => node(&name, &[("zone", "a")], &[]),
                1 => node(&name, &[("zone", "a")], &[("node-role.kubernetes.io/control-plane", None, "NoSchedule")]),
                2 => node(&name, &[("zone", "b")], &[("dedicated", Some("db"), "NoExecute")]),
                3 => node(&name, &[("zone", "a")], &[("node.kubernetes.io/not-ready", None, "NoExecute")]),
                _ => node(&name, &[("zone", "b")], &[]),
            }
        })
        .collect()
}

fn ds(image: &str, s: &Strat, tolerate_all: bool, zone_a: bool) -> DaemonSet {
    let mut d = match s {
        Strat::Unavailable(u) => daemonset(image, Some(u.clone()), None, false),
        Strat::Surge(x) => daemonset(image, Some(IntOrString::Int(0)), Some(x.clone()), false),
        Strat::OnDelete => daemonset(image, None, None, true),
    };
    let spec = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()).expect("template");
    if tolerate_all {
        spec.tolerations = Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]);
    }
    if zone_a {
        spec.node_selector = Some([("zone".to_string(), "a".to_string())].into());
    }
    d
}

fn check(kinds: Vec<u8>, s: Strat, tolerate_all: bool, zone_a: bool, start: i64, ready: i64, seed: u64) -> Result<(), TestCaseError> {
    let nodes = nodes(&kinds);
    let old = ds("agent:1", &s, tolerate_all, zone_a);
    let new = ds("agent:2", &s, tolerate_all, zone_a);
    let on_delete = matches!(s, Strat::OnDelete);
    let cfg = Config { seed, start_delay: start, ready_delay: ready, fail_rate: 0.0, max_ticks: if on_delete { 30 } else { 20_000 } };
    let mut c = Cluster::new(new, &old, nodes, cfg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let out = c.run().map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(out.violations.is_empty(), "{:?}", &out.violations[..out.violations.len().min(5)]);
    if on_delete {
        prop_assert!(out.ticks.iter().all(|t| t.deleted == 0), "OnDelete deleted pods");
        return Ok(());
    }
    prop_assert!(out.converged, "no convergence in {} ticks", out.ticks.len());
    final_state_ok(&c).map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn rollouts_keep_invariants(kinds in proptest::collection::vec(any::<u8>(), 1..60), s in strat(), tolerate_all: bool, zone_a: bool,
                                start in 0i64..3, ready in 0i64..3, seed: u64) {
        check(kinds, s, tolerate_all, zone_a, start, ready, seed)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// Large clusters, up to 5,000 nodes, with percentage budgets.
    #[test]
    fn large_rollouts_keep_invariants(n in 1000usize..=5000, pct in 20u32..50, surge: bool, seed: u64) {
        let kinds: Vec<u8> = (0..n).map(|i| (i * 7 % 11) as u8).collect();
        let s = if surge { Strat::Surge(IntOrString::String(format!("{pct}%"))) } else { Strat::Unavailable(IntOrString::String(format!("{pct}%"))) };
        check(kinds, s, false, false, 1, 1, seed)?;
    }
}
