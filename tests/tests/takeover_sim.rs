//! Taking over node_exporter's DaemonSet — the prometheus-community Helm
//! chart's, as rendered in tests/fixtures/takeover/helm-daemonset.yaml —
//! across a simulated 500-node cluster (issue #50). The DaemonSet
//! controller's decisions are the planner's (its real semantics: which
//! nodes it runs on, what it deletes, OnDelete), the NodeAgent
//! controller's are the real `rollout::decide` with the takeover's
//! `migration::plan`, its node, DaemonSet and pod writes applied as the
//! reconciler makes them (merge and JSON patches); a fake kubelet starts
//! pods (2 s) and confirms deletions, a scheduler binds a pod only where no
//! other pod holds hostPort 9100; fake exporters serve /metrics text read
//! by the real snapshot and gate code. Leaders change, writes fail,
//! the informer lags. One tick is one second; the scrape interval is 15 s.

use std::collections::{BTreeMap, BTreeSet};

use controller::crd::{HealthGate, NodeAgent, NodeAgentSpec, Replaces, RollingUpdate, Rollout, UpdateStrategy, Wave, GATE_CONDITION};
use controller::gate::{self, Sink};
use controller::migration::{self, EXPORTER_LABEL};
use controller::rollout::{self, decide, gate_targets, Expectations, GateResult, Observed, Replaced};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, PodStatus,
    PodTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use node_agent_tests::sim::{self, cond, set_cond, Rng};
use planner::builders::{at, node};
use planner::plan::{self, target_node, REVISION_LABEL};
use serde_json::Value;

const NODES: usize = 500;
const CANARIES: usize = 10;
const MAX_MOVING: i32 = 10;
const DEADLINE: i64 = 30;
const START_DELAY: i64 = 2;
const SCRAPE_INTERVAL: i64 = 15;
/// node_exporter's own families and those it shares with the agent.
const OWN: &[&str] = &["go_goroutines", "process_cpu_seconds_total", "promhttp_metric_handler_requests_total", "node_exporter_build_info"];
const SHARED: &[&str] = &["node_cpu_seconds_total", "node_load1", "node_memory_MemTotal_bytes", "node_filesystem_avail_bytes"];

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What a family list looks like on /metrics: a TYPE line and a sample
/// each, and the collectors' success.
fn exposition(families: &[&str], collectors: &[&str]) -> String {
    let mut s = String::new();
    for f in families {
        s.push_str(&format!("# TYPE {f} gauge\n{f} 1\n"));
    }
    s.push_str("# TYPE node_scrape_collector_success gauge\n");
    for c in collectors {
        s.push_str(&format!("node_scrape_collector_success{{collector=\"{c}\"}} 1\n"));
    }
    s
}

fn owner_kind(p: &Pod) -> String {
    p.metadata.owner_references.iter().flatten().next().map(|o| o.kind.clone()).unwrap_or_default()
}

fn nodeagent() -> NodeAgent {
    let labels: BTreeMap<String, String> = [("app.kubernetes.io/name".to_string(), "node-agent".to_string())].into();
    let mut a = NodeAgent::new(
        "node-agent",
        NodeAgentSpec {
            selector: LabelSelector { match_labels: Some(labels.clone()), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(PodSpec {
                    host_network: Some(true),
                    containers: vec![Container {
                        name: "node-agent".into(),
                        image: Some("agent:1".into()),
                        ports: Some(vec![ContainerPort {
                            name: Some("metrics".into()),
                            container_port: 9100,
                            host_port: Some(9100),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            update_strategy: Some(UpdateStrategy {
                type_: None,
                rolling_update: Some(RollingUpdate { max_unavailable: Some(IntOrString::Int(MAX_MOVING)), max_surge: None }),
            }),
            rollout: Rollout {
                waves: vec![Wave {
                    name: "canary".into(),
                    selector: LabelSelector {
                        match_labels: Some([("nodeagent.io/wave".to_string(), "canary".to_string())].into()),
                        ..Default::default()
                    },
                }],
                health_gate: Some(HealthGate { deadline_seconds: DEADLINE, min_programs: 0, ..Default::default() }),
                ..Default::default()
            },
            replaces: Some(Replaces {
                namespace: "monitoring".into(),
                name: "prometheus-node-exporter".into(),
                port: 9100,
                give_back: false,
            }),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("monitoring".into());
    a.metadata.uid = Some("nodeagent-uid".into());
    a.metadata.generation = Some(1);
    a
}

struct World {
    now: i64,
    nodes: Vec<Node>,
    ds: DaemonSet,
    pods: BTreeMap<String, Pod>,
    revisions: Vec<ControllerRevision>,
    agent: NodeAgent,
    /// Our pods as the informer saw them, by tick.
    history: Vec<(i64, Vec<Pod>)>,
    view_at: i64,
    expectations: Expectations,
    rng: Rng,
    restart: f64,
    lag: f64,
    write_failure: f64,
    /// The node whose node_exporter serves a family the agent does not.
    odd_node: Option<String>,
    seq: usize,
    leaders: usize,
    // What the invariants saw.
    most_exporters_on_a_node: usize,
    gap_since: BTreeMap<String, i64>,
    longest_gap: BTreeMap<String, i64>,
    most_without_exporter: usize,
    agent_first_seen: Vec<String>,
}

impl World {
    fn new(seed: u64, odd_node: Option<&str>) -> World {
        let mut dss: Vec<DaemonSet> = planner::input::read(&root().join("tests/fixtures/takeover/helm-daemonset.yaml"), "DaemonSet")
            .expect("the Helm chart's DaemonSet");
        let mut ds = dss.remove(0);
        ds.metadata.uid = Some("ds-uid".into());
        ds.metadata.resource_version = Some("1".into());
        let nodes = (0..NODES)
            .map(|i| {
                let name = format!("node-{i:03}");
                // The chart's DaemonSet selects kubernetes.io/os=linux.
                let labels: &[(&str, &str)] = if i % (NODES / CANARIES) == 7 {
                    &[("kubernetes.io/os", "linux"), ("nodeagent.io/wave", "canary")]
                } else {
                    &[("kubernetes.io/os", "linux")]
                };
                node(&name, labels, &[])
            })
            .collect();
        let mut w = World {
            now: 1_000,
            nodes,
            ds,
            pods: BTreeMap::new(),
            revisions: Vec::new(),
            agent: nodeagent(),
            history: Vec::new(),
            view_at: 0,
            expectations: Expectations::default(),
            rng: Rng::new(seed),
            restart: 0.0,
            lag: 0.0,
            write_failure: 0.0,
            odd_node: odd_node.map(str::to_string),
            seq: 0,
            leaders: 1,
            most_exporters_on_a_node: 0,
            gap_since: BTreeMap::new(),
            longest_gap: BTreeMap::new(),
            most_without_exporter: 0,
            agent_first_seen: Vec::new(),
        };
        // node_exporter on every node before the NodeAgent exists.
        for _ in 0..10 {
            w.now += 1;
            w.kubelet();
            w.daemonset_controller();
        }
        assert_eq!(w.old_pods().iter().filter(|p| cond(p, "Ready")).count(), NODES, "node_exporter runs everywhere first");
        w
    }

    fn ts(&self) -> Timestamp {
        at(self.now)
    }

    fn old_pods(&self) -> Vec<Pod> {
        self.pods.values().filter(|p| owner_kind(p) == "DaemonSet").cloned().collect()
    }

    fn migration(&self) -> controller::crd::MigrationStatus {
        self.agent.status.as_ref().and_then(|s| s.migration.clone()).unwrap_or_default()
    }

    fn halted(&self) -> bool {
        self.agent.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "RolloutHalted" && c.status == "True" && c.reason == migration::REASON_HALTED)
        })
    }

    /// A write under the faults: Ok, or Err(applied anyway: a lost response).
    fn write(&mut self) -> Result<(), bool> {
        let p = self.write_failure;
        if self.rng.chance(p) {
            return Err(self.rng.chance(0.5));
        }
        Ok(())
    }

    /// The kubelet: deletions confirmed, pods started after START_DELAY;
    /// the scheduler: a pod bound where no other bound pod holds the port.
    fn kubelet(&mut self) {
        let now = self.ts();
        self.pods.retain(|_, p| p.metadata.deletion_timestamp.is_none());
        let mut bound: BTreeSet<String> = self.pods.values().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
        for p in self.pods.values_mut() {
            let Some(node) = target_node(p) else { continue };
            let spec = p.spec.get_or_insert_with(Default::default);
            if spec.node_name.is_none() {
                if bound.contains(&node) {
                    continue;
                }
                spec.node_name = Some(node.clone());
                bound.insert(node);
                continue;
            }
            let created = p.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
            if self.now - created < START_DELAY {
                continue;
            }
            let st = p.status.get_or_insert_with(PodStatus::default);
            st.phase = Some("Running".into());
            st.pod_ip = Some(format!("10.1.{}", node));
            set_cond(p, "ContainersReady", true, now);
            let gated = p.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_some_and(|g| !g.is_empty());
            let ready = !gated || cond(p, GATE_CONDITION);
            set_cond(p, "Ready", ready, now);
        }
    }

    /// kube-controller-manager's DaemonSet controller, as the planner has it.
    fn daemonset_controller(&mut self) {
        let pods: Vec<Pod> = self.pods.values().cloned().collect();
        let hash = plan::revision_hash(&self.ds);
        let p = plan::plan(&self.ds, &self.nodes, &pods, self.ts(), Some(&hash)).expect("the DaemonSet plans");
        let template = self.ds.spec.as_ref().expect("spec").template.clone();
        for a in p.actions {
            match a {
                plan::Action::Create { node } => {
                    self.seq += 1;
                    let mut labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
                    labels.insert(REVISION_LABEL.into(), hash.clone());
                    let mut spec = template.spec.clone().unwrap_or_default();
                    let pin = NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.clone()]),
                        }]),
                        match_expressions: None,
                    };
                    let affinity = spec.affinity.get_or_insert_with(Default::default);
                    affinity.node_affinity = Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector { node_selector_terms: vec![pin] }),
                        ..Default::default()
                    });
                    let name = format!("prometheus-node-exporter-{:05}", self.seq);
                    let pod = Pod {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some("monitoring".into()),
                            labels: Some(labels),
                            creation_timestamp: Some(Time(self.ts())),
                            owner_references: Some(vec![OwnerReference {
                                api_version: "apps/v1".into(),
                                kind: "DaemonSet".into(),
                                name: "prometheus-node-exporter".into(),
                                uid: "ds-uid".into(),
                                controller: Some(true),
                                block_owner_deletion: Some(true),
                            }]),
                            ..Default::default()
                        },
                        spec: Some(spec),
                        status: None,
                    };
                    self.pods.insert(name, pod);
                }
                plan::Action::Delete { pod, .. } => {
                    if let Some(p) = self.pods.get_mut(&pod) {
                        p.metadata.deletion_timestamp.get_or_insert(Time(at(self.now)));
                    }
                }
            }
        }
    }

    /// The invariants, on the true state each tick.
    fn check(&mut self) {
        let mut on: BTreeMap<String, (usize, bool, bool)> = BTreeMap::new();
        for p in self.pods.values() {
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
            let e = on.entry(node).or_default();
            e.0 += 1;
            e.1 |= cond(p, "Ready");
            e.2 |= owner_kind(p) == "NodeAgent";
        }
        let mut without = 0;
        for n in &self.nodes {
            let name = n.name_any();
            let (count, ready, ours) = on.get(&name).copied().unwrap_or_default();
            self.most_exporters_on_a_node = self.most_exporters_on_a_node.max(count);
            if ours && !self.agent_first_seen.contains(&name) {
                self.agent_first_seen.push(name.clone());
            }
            if ready {
                if let Some(since) = self.gap_since.remove(&name) {
                    let g = self.longest_gap.entry(name).or_default();
                    *g = (*g).max(self.now - since);
                }
            } else {
                without += 1;
                self.gap_since.entry(name).or_insert(self.now);
            }
        }
        self.most_without_exporter = self.most_without_exporter.max(without);
    }

    fn view(&mut self) -> Vec<Pod> {
        let lag = if self.rng.chance(self.lag) { self.now % 4 } else { 0 };
        let want = (self.now - lag).max(self.view_at);
        self.view_at = want;
        self.history.iter().rev().find(|(t, _)| *t <= want).map(|(_, v)| v.clone()).unwrap_or_default()
    }

    /// What the old exporter on `node` serves.
    fn old_exporter(&self, node: &str) -> String {
        let mut families: Vec<&str> = OWN.iter().chain(SHARED).copied().collect();
        let mut collectors = vec!["cpu", "loadavg", "meminfo", "filesystem"];
        if self.odd_node.as_deref() == Some(node) {
            families.push("node_uname_info");
            collectors.push("uname");
        }
        exposition(&families, &collectors)
    }

    /// One reconcile, as `reconcile::sync` makes it.
    fn reconcile(&mut self) {
        let pods = self.view();
        if !self.expectations.satisfied(&pods, self.ts()) {
            return;
        }
        let gate_cfg = self.agent.spec.rollout.health_gate.clone().unwrap_or_default();
        let agent_text = exposition(SHARED, &["cpu", "loadavg", "meminfo", "filesystem"]);
        let mut results = BTreeMap::new();
        for t in gate_targets(&self.agent, &pods) {
            let expect = self.nodes.iter().find(|n| n.name_any() == t.node).and_then(migration::expected);
            let r = match self.pods.get(&t.pod) {
                Some(p) if p.metadata.deletion_timestamp.is_none() => {
                    let mut scan = gate::Scan::expecting(&gate_cfg, expect.as_ref());
                    for l in agent_text.lines() {
                        scan.line(l);
                    }
                    scan.finish()
                }
                _ => GateResult::Fail("connection refused".into()),
            };
            results.insert(t.pod, r);
        }
        let old = self.old_pods();
        let ds = self.ds.clone();
        let d = decide(&Observed {
            agent: &self.agent,
            nodes: &self.nodes,
            pods: &pods,
            revisions: &self.revisions,
            gate: &results,
            backoff: &|_| false,
            now: self.ts(),
            replaced: Some(Replaced { daemonset: Some(&ds), pods: &old }),
        })
        .expect("decide");
        let (mut created, mut deleted) = (Vec::new(), Vec::new());
        let _ = self.act(&d, &mut created, &mut deleted);
        self.expectations = Expectations::new(&created, &deleted, self.ts());
    }

    fn patch_node(&mut self, name: &str, patch: &Value) -> Result<(), ()> {
        let applied = self.write();
        if applied.is_ok() || applied == Err(true) {
            if let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == name) {
                let mut v = serde_json::to_value(&*n).expect("node json");
                json_patch::merge(&mut v, patch);
                *n = serde_json::from_value(v).expect("node");
            }
        }
        applied.map_err(|_| ())
    }

    fn act(&mut self, d: &rollout::Decision, created: &mut Vec<String>, deleted: &mut Vec<String>) -> Result<(), ()> {
        let now = self.ts();
        // As the reconciler: a halt goes into the status before its node goes back.
        let halt_first = d.migration.as_ref().is_some_and(|m| m.halt.is_some());
        if halt_first {
            let applied = self.write();
            if applied.is_ok() || applied == Err(true) {
                self.agent.status = Some(d.status.clone());
            }
            applied.map_err(|_| ())?;
        }
        if let Some(m) = &d.migration {
            if let Some(patch) = &m.daemonset_patch {
                if self.write().is_ok() {
                    let mut v = serde_json::to_value(&self.ds).expect("ds json");
                    if patch.is_array() {
                        let p: json_patch::Patch = serde_json::from_value(patch.clone()).expect("a JSON patch");
                        json_patch::patch(&mut v, &p).expect("the JSON patch applies");
                    } else {
                        json_patch::merge(&mut v, patch);
                    }
                    let rv: u64 = self.ds.metadata.resource_version.as_deref().unwrap_or("1").parse().unwrap_or(1);
                    self.ds = serde_json::from_value(v).expect("ds");
                    self.ds.metadata.resource_version = Some((rv + 1).to_string());
                }
            }
            for n in m.give_back.clone() {
                self.patch_node(&n, &migration::give_back_patch())?;
            }
            for n in m.release.clone() {
                self.patch_node(&n, &migration::release_patch())?;
            }
            for t in m.take.clone() {
                let snapshot = t.read.as_ref().map(|_| {
                    let mut snap = gate::Snapshot::default();
                    for l in self.old_exporter(&t.node).lines() {
                        snap.line(l);
                    }
                    snap.finish().expect("snapshot")
                });
                self.patch_node(&t.node, &migration::take_patch(snapshot.as_ref().map(|s| (&s.families, &s.collectors))))?;
            }
        }
        if let Some(rev) = &d.revision {
            self.revisions.retain(|r| r.name_any() != rev.name_any());
            self.revisions.push(rev.clone());
        }
        let (rng, p) = (&mut self.rng, self.write_failure);
        let mut write = || if rng.chance(p) { Err(rng.chance(0.5)) } else { Ok(()) };
        sim::gate_writes(&mut self.pods, d, now, &mut write).map_err(|_| ())?;
        sim::pod_writes(&mut self.pods, d, now, &mut write, &mut |_, _| {}, created, deleted).map_err(|_| ())?;
        if !halt_first && self.agent.status.as_ref() != Some(&d.status) && self.write().is_ok() {
            self.agent.status = Some(d.status.clone());
        }
        Ok(())
    }

    fn tick(&mut self) {
        self.now += 1;
        self.kubelet();
        self.daemonset_controller();
        self.check();
        let ours: Vec<Pod> = self.pods.values().filter(|p| owner_kind(p) == "NodeAgent").cloned().collect();
        self.history.push((self.now, ours));
        if self.history.len() > 8 {
            self.history.remove(0);
        }
        if self.rng.chance(self.restart) {
            // A new leader: no expectations, a fresh list.
            self.expectations = Expectations::default();
            self.view_at = self.now;
            self.leaders += 1;
        }
        self.reconcile();
    }

    fn run_until(&mut self, max_ticks: usize, done: impl Fn(&World) -> bool) -> bool {
        for _ in 0..max_ticks {
            self.tick();
            if done(self) {
                return true;
            }
        }
        false
    }

    fn is_canary(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n.name_any() == node && n.labels().contains_key("nodeagent.io/wave"))
    }

    /// Nodes running each kind of exporter (Ready, not being deleted).
    fn running(&self, kind: &str) -> BTreeSet<String> {
        self.pods
            .values()
            .filter(|p| owner_kind(p) == kind && cond(p, "Ready") && p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect()
    }
}

fn faulty(w: &mut World) {
    w.restart = 0.2;
    w.lag = 0.2;
    w.write_failure = 0.05;
}

/// 500 nodes move from the Helm chart's node_exporter to node-agent, the
/// canary wave first, at most maxUnavailable (10) nodes moving at once,
/// with a new leader on one sync in five, failed writes and a lagging
/// informer: no node ever has two exporter pods, none is without a Ready
/// exporter for longer than one scrape interval plus the agent's start,
/// and at the end the DaemonSet runs nowhere and its object stays.
#[test]
fn five_hundred_nodes_move_canaries_first_within_max_unavailable_across_leader_changes() {
    let mut w = World::new(1, None);
    faulty(&mut w);
    let original = serde_json::to_value(w.ds.spec.clone()).expect("json");
    assert!(w.run_until(20_000, |w| w.migration().phase == "Complete"), "the takeover did not complete: {:?}", w.migration());
    assert_eq!(w.running("NodeAgent").len(), NODES);
    assert!(w.running("DaemonSet").is_empty(), "node_exporter still runs somewhere");
    assert_eq!(w.most_exporters_on_a_node, 1, "a node had two exporter pods");
    let worst = w.longest_gap.iter().max_by_key(|(_, g)| **g).map(|(n, g)| (n.clone(), *g)).unwrap_or_default();
    assert!(worst.1 <= SCRAPE_INTERVAL + START_DELAY, "{} had no Ready exporter for {} s", worst.0, worst.1);
    assert!(w.most_without_exporter as i32 <= MAX_MOVING, "{} nodes without a Ready exporter at once", w.most_without_exporter);
    let canaries_first: Vec<bool> = w.agent_first_seen.iter().map(|n| w.is_canary(n)).collect();
    assert!(canaries_first[..CANARIES].iter().all(|c| *c), "the canary wave first: {:?}", &w.agent_first_seen[..CANARIES + 2]);
    assert!(w.leaders > 50, "leaders changed {} times", w.leaders);
    // The DaemonSet is still there, OnDelete and excluding every node; what it had is kept to put back.
    assert!(migration::prepared(&w.ds));
    assert_ne!(serde_json::to_value(w.ds.spec.clone()).expect("json"), original);
    assert!(w.migration().waiting.unwrap_or_default().contains("delete it"));
    eprintln!(
        "500 nodes: {} s, {} leaders, longest without a Ready exporter {} s ({}), at most {} nodes at once",
        w.now - 1_010,
        w.leaders,
        worst.1,
        worst.0,
        w.most_without_exporter
    );
}

/// A node whose node_exporter serves a family the agent does not (uname)
/// fails its gate past the deadline: it goes back to node_exporter alone,
/// the takeover halts and moves no other node; `giveBack` then returns
/// every node, and the DaemonSet's spec is put back exactly as it was.
#[test]
fn a_failing_node_goes_back_alone_and_halts_and_give_back_returns_every_node() {
    let mut w = World::new(2, Some("node-123"));
    faulty(&mut w);
    let original = serde_json::to_value(w.ds.spec.clone()).expect("json");
    assert!(w.run_until(20_000, |w| w.halted()), "no halt: {:?}", w.migration());
    assert!(
        w.run_until(200, |w| w.running("DaemonSet").contains("node-123")
            && !w.pods.values().any(|p| owner_kind(p) == "NodeAgent" && target_node(p).as_deref() == Some("node-123"))),
        "node-123 did not go back"
    );
    let moved = w.running("NodeAgent");
    let message = w.agent.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "RolloutHalted").map(|c| c.message.clone()));
    assert!(message.clone().unwrap_or_default().contains("node node-123") && message.unwrap_or_default().contains("node_uname_info"));
    assert_eq!(w.migration().halted_node.as_deref(), Some("node-123"));
    // Halted: nothing moves for a while.
    for _ in 0..120 {
        w.tick();
    }
    assert_eq!(w.running("NodeAgent"), moved, "nodes moved while halted");
    assert_eq!(w.most_exporters_on_a_node, 1);

    w.agent.spec.replaces.as_mut().expect("replaces").give_back = true;
    w.agent.metadata.generation = Some(2);
    assert!(w.run_until(5_000, |w| w.migration().phase == "GivenBack"), "not given back: {:?}", w.migration());
    assert!(w.run_until(50, |w| w.running("DaemonSet").len() == NODES), "node_exporter is not back everywhere");
    assert!(w.running("NodeAgent").is_empty());
    assert_eq!(serde_json::to_value(w.ds.spec.clone()).expect("json"), original, "the DaemonSet's spec is put back exactly");
    assert!(w.ds.metadata.annotations.as_ref().is_none_or(|a| !a.contains_key(migration::ORIGINAL_ANNOTATION)));
    assert!(w.nodes.iter().all(|n| !n.labels().contains_key(EXPORTER_LABEL)), "a node kept its label");
    assert_eq!(w.most_exporters_on_a_node, 1, "a node had two exporter pods");
    for (node, gap) in &w.longest_gap {
        let limit = if node == "node-123" { DEADLINE + SCRAPE_INTERVAL + START_DELAY } else { SCRAPE_INTERVAL + START_DELAY };
        assert!(*gap <= limit, "{node} had no Ready exporter for {gap} s");
    }
}
