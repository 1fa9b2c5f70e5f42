//! Whole rollouts of the NodeAgent controller over a simulated 500-node
//! cluster: a fake kubelet (pods start, become ready, honour the health
//! gate readiness gate, go away when deleted), fake agents serving
//! /metrics text judged by the real gate check, a lagging informer, and API
//! faults. The controller's decisions are the real `rollout::decide` with
//! the reconciler's expectations; invariants are checked on every tick.

use std::collections::BTreeMap;

use controller::crd::{
    HealthGate, NodeAgent, NodeAgentSpec, NodeAgentStatus, RollingUpdate, Rollout, UpdateStrategy, Wave, GATE_CONDITION,
};
use controller::gate;
use controller::rollout::{self, decide, gate_targets, template_hash, Expectations, GateResult, Observed};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use node_agent_tests::sim::{self, cond, set_cond, Rng};
use planner::builders::{at, node};
use planner::plan::{target_node, REVISION_LABEL};

const NODES: usize = 500;
const CANARIES: usize = 10;
const MAX_UNAVAILABLE: i32 = 10;
const DEADLINE: i64 = 30;
const START_DELAY: i64 = 2;

fn template(image: &str) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some([("app".to_string(), "node-agent".to_string())].into()), ..Default::default() }),
        spec: Some(PodSpec {
            containers: vec![Container { name: "agent".into(), image: Some(image.into()), ..Default::default() }],
            host_network: Some(true),
            ..Default::default()
        }),
    }
}

fn agent(auto_rollback: bool) -> NodeAgent {
    let mut a = NodeAgent::new(
        "node-agent",
        NodeAgentSpec {
            selector: LabelSelector { match_labels: Some([("app".to_string(), "node-agent".to_string())].into()), ..Default::default() },
            template: template("agent:1"),
            update_strategy: Some(UpdateStrategy {
                type_: None,
                rolling_update: Some(RollingUpdate { max_unavailable: Some(IntOrString::Int(MAX_UNAVAILABLE)), max_surge: None }),
            }),
            rollout: Rollout {
                waves: vec![Wave {
                    name: "canary".into(),
                    selector: LabelSelector {
                        match_labels: Some([("nodeagent.io/wave".to_string(), "canary".to_string())].into()),
                        ..Default::default()
                    },
                }],
                health_gate: Some(HealthGate {
                    required_collectors: vec!["cpu".into()],
                    deadline_seconds: DEADLINE,
                    auto_rollback,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("monitoring".into());
    a.metadata.uid = Some("uid-na".into());
    a.metadata.generation = Some(1);
    a
}

/// What a fake agent of `image` serves on /metrics.
fn agent_metrics(image: &str) -> String {
    let up = if image.contains("bad") { 0 } else { 1 };
    format!(
        "# TYPE node_ebpf_program_up gauge\nnode_ebpf_program_up{{program=\"sys_exit\"}} {up}\nnode_ebpf_program_up{{program=\"rq_switch_raw\"}} 1\n# TYPE node_scrape_collector_success gauge\nnode_scrape_collector_success{{collector=\"cpu\"}} 1\n"
    )
}

fn image(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}

/// One write under the faults: Ok, or Err(applied anyway).
fn fault(rng: &mut Rng, f: &Faults) -> Result<(), bool> {
    if rng.chance(f.write_failure) {
        return Err(false);
    }
    if rng.chance(f.lost_response) {
        return Err(true);
    }
    Ok(())
}

#[derive(Default)]
struct Faults {
    /// Chance that an API write fails (409, 429, 500: the sync stops there).
    write_failure: f64,
    /// Chance that a write is applied but its response is lost.
    lost_response: f64,
    /// Chance that the informer view lags (by up to 3 ticks; never goes back).
    lag: f64,
    /// Chance that the leader changes before a sync: the new one starts
    /// from a fresh list (what `Context::synced` waits for) and no memory.
    restart: f64,
}

struct Cluster {
    now: i64,
    nodes: Vec<Node>,
    pods: BTreeMap<String, Pod>,
    revisions: Vec<ControllerRevision>,
    agent: NodeAgent,
    history: Vec<(i64, Vec<Pod>)>,
    view_at: i64,
    expectations: Expectations,
    rng: Rng,
    faults: Faults,
    /// Worst case seen: nodes with no available agent, and nodes with two.
    max_unavailable_seen: usize,
    max_pods_on_a_node: usize,
    halts: usize,
    rollbacks: usize,
    /// (tick, node) of every create, in order.
    creates: Vec<(i64, String, String)>,
    leaders: usize,
}

impl Cluster {
    fn new(auto_rollback: bool, seed: u64) -> Cluster {
        let mut nodes: Vec<Node> = (0..NODES)
            .map(|i| {
                let name = format!("node-{i:03}");
                if i % (NODES / CANARIES) == 7 {
                    node(&name, &[("nodeagent.io/wave", "canary")], &[])
                } else {
                    node(&name, &[], &[])
                }
            })
            .collect();
        // Three nodes the agent does not tolerate.
        for n in nodes.iter_mut().take(3) {
            *n = node(&n.name_any(), &[], &[("dedicated", Some("db"), "NoExecute")]);
        }
        let mut c = Cluster {
            now: 1_000,
            nodes,
            pods: BTreeMap::new(),
            revisions: Vec::new(),
            agent: agent(auto_rollback),
            history: Vec::new(),
            view_at: 0,
            expectations: Expectations::default(),
            rng: Rng::new(seed),
            faults: Faults::default(),
            max_unavailable_seen: 0,
            max_pods_on_a_node: 0,
            halts: 0,
            rollbacks: 0,
            creates: Vec::new(),
            leaders: 1,
        };
        // The first install, run to completion without faults.
        assert!(c.run_until(600, |c| c.complete()), "initial install did not complete");
        c.max_unavailable_seen = 0;
        c.creates.clear();
        c
    }

    fn ts(&self) -> Timestamp {
        at(self.now)
    }

    fn eligible(&self) -> usize {
        NODES - 3
    }

    fn status(&self) -> NodeAgentStatus {
        self.agent.status.clone().unwrap_or_default()
    }

    fn complete(&self) -> bool {
        let s = self.status();
        s.update_revision == Some(template_hash(&self.agent))
            && s.current_revision == s.update_revision
            && s.number_available as usize == self.eligible()
            && s.updated_number_scheduled as usize == self.eligible()
    }

    fn halted(&self) -> bool {
        self.status().conditions.iter().any(|c| c.type_ == "RolloutHalted" && c.status == "True")
    }

    fn set_image(&mut self, image: &str) {
        self.agent.spec.template = template(image);
        self.agent.metadata.generation = self.agent.metadata.generation.map(|g| g + 1);
    }

    /// The fake kubelet and scheduler, one tick.
    fn kubelet(&mut self) {
        let now = self.ts();
        let gone: Vec<String> = self.pods.values().filter(|p| p.metadata.deletion_timestamp.is_some()).map(|p| p.name_any()).collect();
        for g in gone {
            self.pods.remove(&g);
        }
        for p in self.pods.values_mut() {
            let created = p.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
            if self.now - created < START_DELAY {
                continue;
            }
            let st = p.status.get_or_insert_with(PodStatus::default);
            st.phase = Some("Running".into());
            st.pod_ip = Some("10.0.0.1".into());
            let containers_ready = !image(p).contains("crash");
            set_cond(p, "ContainersReady", containers_ready, now);
            let gated = p.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_some_and(|g| !g.is_empty());
            let ready = containers_ready && (!gated || cond(p, GATE_CONDITION));
            set_cond(p, "Ready", ready, now);
        }
    }

    /// The informer's view: lags now and then, never goes back in time.
    fn view(&mut self) -> Vec<Pod> {
        let lag = if self.rng.chance(self.faults.lag) { self.rng.below(4) as i64 } else { 0 };
        let want = (self.now - lag).max(self.view_at);
        self.view_at = want;
        self.history.iter().rev().find(|(t, _)| *t <= want).map(|(_, v)| v.clone()).unwrap_or_default()
    }

    /// An API write: Ok(applied) or Err(applied anyway) under the faults.
    fn write(&mut self) -> Result<(), bool> {
        fault(&mut self.rng, &self.faults)
    }

    /// One reconcile, as `reconcile::sync` runs it.
    fn reconcile(&mut self) {
        let pods = self.view();
        if !self.expectations.satisfied(&pods, self.ts()) {
            return;
        }
        // The health gates: scrape the live fake agents.
        let mut results = BTreeMap::new();
        let gate_cfg = self.agent.spec.rollout.health_gate.clone().unwrap_or_default();
        for t in gate_targets(&self.agent, &pods) {
            let r = match self.pods.get(&t.pod) {
                Some(p) if p.metadata.deletion_timestamp.is_none() => gate::check(&agent_metrics(&image(p)), &gate_cfg),
                _ => GateResult::Fail("connection refused".into()),
            };
            results.insert(t.pod, r);
        }
        let d = decide(&Observed {
            agent: &self.agent,
            nodes: &self.nodes,
            pods: &pods,
            revisions: &self.revisions,
            gate: &results,
            backoff: &|_| false,
            now: self.ts(),
            replaced: None,
        })
        .expect("decide");
        let (mut created, mut deleted) = (Vec::new(), Vec::new());
        let result = self.act(&d, &mut created, &mut deleted);
        self.expectations = Expectations::new(&created, &deleted, self.ts());
        let _ = result;
    }

    fn act(&mut self, d: &rollout::Decision, created: &mut Vec<String>, deleted: &mut Vec<String>) -> Result<(), ()> {
        let now = self.ts();
        if let Some(rev) = &d.revision {
            let applied = self.write();
            if applied.is_ok() || applied == Err(true) {
                self.revisions.retain(|r| r.name_any() != rev.name_any());
                self.revisions.push(rev.clone());
            }
            applied.map_err(|_| ())?;
        }
        let (rng, faults) = (&mut self.rng, &self.faults);
        sim::gate_writes(&mut self.pods, d, now, &mut || fault(rng, faults)).map_err(|_| ())?;
        if d.halt.is_some() {
            self.halts += 1;
        }
        if let Some((_, t)) = &d.rollback {
            // The halt goes into the status before the template goes back.
            self.write_status(d)?;
            let applied = self.write();
            if applied.is_ok() || applied == Err(true) {
                self.agent.spec.template = t.clone();
                self.agent.metadata.generation = self.agent.metadata.generation.map(|g| g + 1);
                self.rollbacks += 1;
            }
            applied.map_err(|_| ())?;
        }
        let (rng, faults, creates, tick) = (&mut self.rng, &self.faults, &mut self.creates, self.now);
        let mut place = |pod: &mut Pod, c: &rollout::Create| {
            // The scheduler binds it to the node its affinity names.
            let node = target_node(pod).expect("node affinity");
            pod.spec.as_mut().expect("spec").node_name = Some(node.clone());
            creates.push((tick, node, c.hash.clone()));
        };
        sim::pod_writes(&mut self.pods, d, now, &mut || fault(rng, faults), &mut place, created, deleted).map_err(|_| ())?;
        for r in &d.prune {
            let applied = self.write();
            if applied.is_ok() || applied == Err(true) {
                self.revisions.retain(|x| x.name_any() != *r);
            }
            applied.map_err(|_| ())?;
        }
        if self.agent.status.as_ref() != Some(&d.status) && d.rollback.is_none() {
            self.write_status(d)?;
        }
        Ok(())
    }

    fn write_status(&mut self, d: &rollout::Decision) -> Result<(), ()> {
        let applied = self.write();
        if applied.is_ok() || applied == Err(true) {
            self.agent.status = Some(d.status.clone());
        }
        applied.map_err(|_| ())
    }

    /// Invariants on the true state.
    fn check(&mut self) {
        let mut per_node: BTreeMap<String, (usize, bool)> = BTreeMap::new();
        for p in self.pods.values().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let n = target_node(p).expect("node");
            let e = per_node.entry(n).or_default();
            e.0 += 1;
            e.1 |= cond(p, "Ready");
        }
        let worst = per_node.values().map(|(n, _)| *n).max().unwrap_or(0);
        self.max_pods_on_a_node = self.max_pods_on_a_node.max(worst);
        let unavailable = self.nodes.iter().skip(3).filter(|n| !per_node.get(&n.name_any()).is_some_and(|(_, ready)| *ready)).count();
        self.max_unavailable_seen = self.max_unavailable_seen.max(unavailable);
    }

    fn tick(&mut self) {
        self.now += 1;
        self.kubelet();
        self.check();
        self.history.push((self.now, self.pods.values().cloned().collect()));
        if self.history.len() > 8 {
            self.history.remove(0);
        }
        if self.rng.chance(self.faults.restart) {
            self.new_leader();
        }
        self.reconcile();
    }

    /// A new leader (restart or fail-over): no expectations, and an informer
    /// that holds the full list as of now.
    fn new_leader(&mut self) {
        self.expectations = Expectations::default();
        self.view_at = self.now;
        self.leaders += 1;
    }

    /// The revision numbers by hash.
    fn revision_numbers(&self) -> BTreeMap<String, i64> {
        self.revisions.iter().map(|r| (r.labels().get(REVISION_LABEL).cloned().unwrap_or_default(), r.revision)).collect()
    }

    fn run_until(&mut self, max_ticks: usize, done: impl Fn(&Cluster) -> bool) -> bool {
        for _ in 0..max_ticks {
            self.tick();
            if done(self) {
                return true;
            }
        }
        false
    }

    fn nodes_on(&self, hash: &str) -> Vec<String> {
        self.pods.values().filter(|p| p.labels().get(REVISION_LABEL).map(String::as_str) == Some(hash)).filter_map(target_node).collect()
    }

    /// The last `n` eligible nodes in rollout order (canary wave first,
    /// then by name): the ones a partition of `n` holds.
    fn last_in_rollout_order(&self, n: usize) -> Vec<String> {
        let mut order: Vec<String> = self.nodes.iter().skip(3).map(|x| x.name_any()).filter(|x| !self.is_canary(x)).collect();
        order.sort();
        order.split_off(order.len() - n)
    }

    fn is_canary(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n.name_any() == node && n.labels().contains_key("nodeagent.io/wave"))
    }
}

#[test]
fn a_healthy_image_rolls_out_completely_canaries_first_within_max_unavailable() {
    let mut c = Cluster::new(false, 1);
    let old = template_hash(&c.agent);
    c.set_image("agent:2");
    let new = template_hash(&c.agent);
    assert!(c.run_until(5_000, |c| c.complete()), "rollout did not complete: {:?}", c.status());
    assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize, "unavailable {} > maxUnavailable", c.max_unavailable_seen);
    assert!(c.max_unavailable_seen > 0, "the rollout replaced pods");
    assert_eq!(c.max_pods_on_a_node, 1, "one agent per node");
    assert_eq!(c.nodes_on(&new).len(), NODES - 3);
    assert!(c.nodes_on(&old).is_empty());
    // Canaries first: the first non-canary create of the new revision comes
    // after every canary's.
    let new_creates: Vec<&(i64, String, String)> = c.creates.iter().filter(|(_, _, h)| *h == new).collect();
    let last_canary = new_creates.iter().filter(|(_, n, _)| c.is_canary(n)).map(|(t, _, _)| *t).max().expect("canaries");
    let first_other = new_creates.iter().filter(|(_, n, _)| !c.is_canary(n)).map(|(t, _, _)| *t).min().expect("others");
    assert!(last_canary < first_other, "canary wave must finish first ({last_canary} vs {first_other})");
    assert_eq!(c.status().current_revision.as_deref(), Some(new.as_str()));
    assert!(!c.halted());
}

#[test]
fn an_image_with_an_ebpf_program_down_halts_at_the_first_wave() {
    let mut c = Cluster::new(false, 2);
    let old = template_hash(&c.agent);
    c.set_image("agent:bad");
    let bad = template_hash(&c.agent);
    assert!(c.run_until(2_000, |c| c.halted()), "the gate did not halt: {:?}", c.status());
    // Let it sit: nothing more moves.
    for _ in 0..200 {
        c.tick();
    }
    let on_bad = c.nodes_on(&bad);
    assert!(!on_bad.is_empty() && on_bad.len() <= CANARIES, "bad pods only on canaries: {on_bad:?}");
    assert!(on_bad.iter().all(|n| c.is_canary(n)), "{on_bad:?}");
    assert_eq!(c.nodes_on(&old).len(), NODES - 3 - on_bad.len());
    assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize);
    assert_eq!(c.max_pods_on_a_node, 1);
    let s = c.status();
    assert_eq!(s.halted_revision.as_deref(), Some(bad.as_str()));
    let h = s.conditions.iter().find(|c| c.type_ == "RolloutHalted").expect("condition");
    assert!(h.message.contains("node_ebpf_program_up is 0 for sys_exit"), "{}", h.message);
    assert_eq!(c.halts, 1, "halted once");
}

#[test]
fn with_auto_rollback_a_bad_image_is_rolled_back() {
    let mut c = Cluster::new(true, 3);
    let old = template_hash(&c.agent);
    c.set_image("agent:bad");
    let bad = template_hash(&c.agent);
    assert!(c.run_until(3_000, |c| c.rollbacks > 0 && c.complete()), "no rollback to completion: {:?}", c.status());
    assert_eq!(template_hash(&c.agent), old, "the template is the old one again");
    assert_eq!(c.nodes_on(&old).len(), NODES - 3);
    // The halt stays reported after the rollback, saying what went back.
    for _ in 0..100 {
        c.tick();
    }
    assert!(c.halted(), "a rolled-back halt stays visible: {:?}", c.status());
    let s = c.status();
    assert_eq!(s.halted_revision.as_deref(), Some(bad.as_str()));
    let h = s.conditions.iter().find(|c| c.type_ == "RolloutHalted").expect("condition");
    assert_eq!(h.reason, rollout::REASON_ROLLED_BACK);
    assert!(h.message.contains("node_ebpf_program_up is 0 for sys_exit"), "{}", h.message);
    assert!(h.message.ends_with(&format!("template rolled back to revision 1 ({old})")), "{}", h.message);
    assert_eq!(c.rollbacks, 1, "rolled back once");
    // A new template starts a new rollout: the old halt is gone.
    c.set_image("agent:2");
    assert!(c.run_until(5_000, |c| c.complete()), "{:?}", c.status());
    assert!(!c.halted());
    assert_eq!(c.status().halted_revision, None);
    assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize);
    assert_eq!(c.max_pods_on_a_node, 1);
}

#[test]
fn a_partition_keeps_nodes_on_the_previous_revision() {
    let mut c = Cluster::new(false, 4);
    let old = template_hash(&c.agent);
    c.agent.spec.rollout.partition = Some(100);
    c.set_image("agent:2");
    let new = template_hash(&c.agent);
    assert!(c.run_until(5_000, |c| c.nodes_on(&new).len() == NODES - 3 - 100), "partition rollout stalled");
    for _ in 0..200 {
        c.tick();
    }
    assert_eq!(c.nodes_on(&new).len(), NODES - 3 - 100);
    assert_eq!(c.nodes_on(&old).len(), 100);
    // The held nodes are the last 100 in rollout order (canary wave first, then by name).
    let mut held = c.nodes_on(&old);
    held.sort();
    assert_eq!(held, c.last_in_rollout_order(100));
    assert_eq!(c.status().current_revision.as_deref(), Some(old.as_str()), "not complete while partitioned");
    // Lowering the partition finishes it.
    c.agent.spec.rollout.partition = None;
    assert!(c.run_until(2_000, |c| c.complete()));
}

#[test]
fn pause_holds_and_resume_finishes() {
    let mut c = Cluster::new(false, 5);
    c.set_image("agent:2");
    let new = template_hash(&c.agent);
    assert!(c.run_until(5_000, |c| c.nodes_on(&new).len() >= 100));
    c.agent.spec.rollout.paused = true;
    for _ in 0..20 {
        c.tick();
    }
    let at_pause = c.nodes_on(&new).len();
    for _ in 0..300 {
        c.tick();
    }
    assert_eq!(c.nodes_on(&new).len(), at_pause, "no pod replaced while paused");
    assert!(at_pause < NODES - 3);
    c.agent.spec.rollout.paused = false;
    assert!(c.run_until(5_000, |c| c.complete()));
}

#[test]
fn api_faults_and_a_lagging_informer_never_break_the_invariants() {
    for seed in 10..14 {
        let mut c = Cluster::new(seed % 2 == 0, seed);
        c.faults = Faults { write_failure: 0.15, lost_response: 0.05, lag: 0.3, restart: 0.05 };
        c.set_image(if seed % 2 == 0 { "agent:bad" } else { "agent:2" });
        let done = c.run_until(20_000, |c| if seed % 2 == 0 { c.rollbacks > 0 && c.complete() } else { c.complete() });
        assert!(done, "seed {seed}: did not converge: {:?}", c.status());
        assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize, "seed {seed}: unavailable {}", c.max_unavailable_seen);
        assert_eq!(c.max_pods_on_a_node, 1, "seed {seed}: two agents on a node");
    }
}

/// A leader change before every sync of a paused rollout, also with the
/// status lost (a restore from backup brings no status back): nothing is
/// replaced, nothing is renumbered, and no node runs two agents.
#[test]
fn a_new_leader_at_every_step_of_a_paused_rollout_moves_nothing() {
    for lose_status in [false, true] {
        let mut c = Cluster::new(false, 6);
        let old = template_hash(&c.agent);
        c.set_image("agent:2");
        let new = template_hash(&c.agent);
        assert!(c.run_until(5_000, |c| c.nodes_on(&new).len() >= 50));
        c.agent.spec.rollout.paused = true;
        for _ in 0..30 {
            c.tick();
        }
        let (on_new, numbers, creates) = (c.nodes_on(&new), c.revision_numbers(), c.creates.len());
        assert_eq!(numbers.get(&new), Some(&2));
        c.faults.restart = 1.0;
        for step in 0..300 {
            if lose_status && step % 50 == 0 {
                c.agent.status = None;
            }
            c.tick();
            assert_eq!(c.nodes_on(&new), on_new, "lose_status {lose_status}, step {step}: a paused rollout moved");
        }
        assert!(c.leaders > 300);
        assert_eq!(c.creates.len(), creates, "no pod created");
        assert_eq!(c.revision_numbers(), numbers, "revisions keep their numbers");
        assert_eq!(c.status().current_revision.as_deref(), Some(old.as_str()));
        assert_eq!(c.max_pods_on_a_node, 1);
        // Resumed, under the same churn of leaders, it finishes.
        c.agent.spec.rollout.paused = false;
        assert!(c.run_until(5_000, |c| c.complete()), "{:?}", c.status());
        assert_eq!(c.max_pods_on_a_node, 1);
        assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize);
    }
}

/// A leader change before every sync of a partitioned rollout: exactly the
/// partition stays on the old revision, the last nodes in rollout order.
#[test]
fn a_new_leader_at_every_step_of_a_partitioned_rollout_keeps_the_partition() {
    let mut c = Cluster::new(false, 7);
    let old = template_hash(&c.agent);
    c.agent.spec.rollout.partition = Some(100);
    c.faults.restart = 1.0;
    c.set_image("agent:2");
    let new = template_hash(&c.agent);
    assert!(c.run_until(5_000, |c| c.nodes_on(&new).len() == NODES - 3 - 100), "partition rollout stalled");
    for _ in 0..200 {
        c.tick();
    }
    assert_eq!(c.nodes_on(&old).len(), 100);
    let mut held = c.nodes_on(&old);
    held.sort();
    assert_eq!(held, c.last_in_rollout_order(100));
    assert_eq!(c.status().current_revision.as_deref(), Some(old.as_str()));
    assert_eq!(c.max_pods_on_a_node, 1);
    assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize);
}

/// A leader change before every sync of a waved rollout: the canary wave
/// still finishes before any other node is touched.
#[test]
fn a_new_leader_at_every_step_of_a_waved_rollout_keeps_the_waves() {
    let mut c = Cluster::new(false, 8);
    c.faults.restart = 1.0;
    c.set_image("agent:2");
    let new = template_hash(&c.agent);
    assert!(c.run_until(5_000, |c| c.complete()), "{:?}", c.status());
    let new_creates: Vec<&(i64, String, String)> = c.creates.iter().filter(|(_, _, h)| *h == new).collect();
    let last_canary = new_creates.iter().filter(|(_, n, _)| c.is_canary(n)).map(|(t, _, _)| *t).max().expect("canaries");
    let first_other = new_creates.iter().filter(|(_, n, _)| !c.is_canary(n)).map(|(t, _, _)| *t).min().expect("others");
    assert!(last_canary < first_other, "canary wave must finish first ({last_canary} vs {first_other})");
    assert_eq!(new_creates.len(), NODES - 3, "one create per node");
    assert_eq!(c.max_pods_on_a_node, 1);
    assert!(c.max_unavailable_seen <= MAX_UNAVAILABLE as usize);
}

/// `rollout resume` after a halt whose pod is still not ready: the gate's
/// deadline counts again from the resume, so the rollout does not re-halt
/// at once on the pod it forgave; it halts again only past that deadline.
#[test]
fn resume_forgives_the_overdue_pod_until_its_own_deadline() {
    let mut c = Cluster::new(false, 9);
    c.set_image("agent:bad");
    let bad = template_hash(&c.agent);
    assert!(c.run_until(2_000, |c| c.halted()));
    for _ in 0..100 {
        c.tick();
    }
    // What `node-agent rollout resume` writes.
    let halted = c.agent.clone();
    let now = c.ts();
    let patch = controller::report::resume_patch(&halted, now);
    let st = c.agent.status.as_mut().expect("status");
    st.halted_revision = None;
    st.conditions = serde_json::from_value(patch["status"]["conditions"].clone()).expect("conditions");
    st.resumed_at = Some(Time(now));
    let resumed_at = c.now;
    let halts = c.halts;
    assert!(c.run_until(DEADLINE as usize + 20, |c| c.halted()), "the bad pod halts again past its new deadline");
    assert!(c.now - resumed_at > DEADLINE, "re-halted {}s after the resume, within the deadline", c.now - resumed_at);
    assert_eq!(c.halts, halts + 1);
    assert_eq!(c.status().halted_revision.as_deref(), Some(bad.as_str()));
}
