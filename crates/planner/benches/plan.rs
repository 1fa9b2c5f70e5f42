//! One `plan` (a full controller sync) at 100, 1,000 and 5,000 nodes with as
//! many pods, mid-rollout: `cargo bench -p node-agent-planner --bench plan`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use planner::builders::{at, daemonset, node, pod};
use planner::plan::{plan, revision_hash};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    for n in [100usize, 1000, 5000] {
        let ds = daemonset("agent:2", Some(IntOrString::String("10%".into())), None, false);
        let hash = revision_hash(&ds);
        let nodes: Vec<_> = (0..n)
            .map(|i| {
                let taints: &[(&str, Option<&str>, &str)] =
                    if i % 50 == 0 { &[("node-role.kubernetes.io/control-plane", None, "NoSchedule")] } else { &[] };
                node(&format!("node-{i:05}"), &[("zone", if i % 2 == 0 { "a" } else { "b" })], taints)
            })
            .collect();
        // Half the pods updated, half old, all ready.
        let pods: Vec<_> = (0..n)
            .map(|i| {
                pod(
                    &format!("agent-{i:05}"),
                    &format!("node-{i:05}"),
                    if i % 2 == 0 { &hash } else { "old" },
                    at(100),
                    "Running",
                    Some(at(200)),
                )
            })
            .collect();
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| plan(&ds, &nodes, &pods, at(10_000), None).map(|p| p.actions.len()))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
