//! A simulated cluster driven by the planner through whole rollouts: a
//! kubelet that starts pods after a delay, makes them Ready, and (with
//! faults) fails some; deletions that take a tick. Every tick checks the
//! invariants a DaemonSet owner relies on.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::builders;
use super::plan::{self, Action, Invalid, Spec, Status, Strategy};

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// Ticks (seconds) from creation to Running, and from Running to Ready.
    pub start_delay: i64,
    pub ready_delay: i64,
    /// Probability that a new pod fails instead of starting.
    pub fail_rate: f64,
    pub max_ticks: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { seed: 1, start_delay: 2, ready_delay: 1, fail_rate: 0.0, max_ticks: 100_000 }
    }
}

/// One tick of the timeline.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tick {
    pub t: i64,
    pub created: usize,
    pub deleted: usize,
    pub status: Status,
}

/// The outcome of a simulation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub ticks: Vec<Tick>,
    pub converged: bool,
    pub violations: Vec<String>,
    pub max_unavailable_seen: usize,
    pub max_extra_pods_seen: usize,
}

/// Simulator state of a pod: when a deleted pod disappears, and whether the
/// kubelet will fail it.
#[derive(Clone, Copy)]
struct SimState {
    gone_at: Option<i64>,
    fails: bool,
}

/// The simulated cluster.
pub struct Cluster {
    pub ds: DaemonSet,
    pub nodes: Vec<Node>,
    pods: Vec<Pod>,
    state: Vec<SimState>,
    now: i64,
    next: u64,
    rng: SmallRng,
    cfg: Config,
}

impl Cluster {
    /// A cluster where every eligible node already runs a Ready pod of
    /// `old` (a DaemonSet of the previous revision).
    pub fn new(ds: DaemonSet, old: &DaemonSet, nodes: Vec<Node>, cfg: Config) -> Result<Cluster, Invalid> {
        let mut c = Cluster {
            ds,
            nodes,
            pods: Vec::new(),
            state: Vec::new(),
            now: 1_000_000,
            next: 0,
            rng: SmallRng::seed_from_u64(cfg.seed),
            cfg,
        };
        let old_plan = plan::plan(old, &c.nodes, &[], builders::at(c.now), None)?;
        for n in old_plan.nodes.iter().filter(|n| n.should_run) {
            let name = c.name();
            let t = builders::at(c.now - 1000);
            c.pods.push(builders::pod(&name, &n.node, &old_plan.revision.hash, t, "Running", Some(t)));
            c.state.push(SimState { gone_at: None, fails: false });
        }
        Ok(c)
    }

    fn name(&mut self) -> String {
        self.next += 1;
        format!("{}-{:05x}", builders::DS_NAME, self.next)
    }

    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    fn kubelet(&mut self) {
        let now = self.now;
        let mut i = 0;
        while i < self.pods.len() {
            if self.state[i].gone_at.is_some_and(|g| g <= now) {
                self.pods.swap_remove(i);
                self.state.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let (start, ready) = (self.cfg.start_delay, self.cfg.ready_delay);
        for (pod, st) in self.pods.iter_mut().zip(&self.state) {
            if st.gone_at.is_some() {
                continue;
            }
            let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(now);
            let status = pod.status.get_or_insert_with(Default::default);
            let phase = status.phase.clone().unwrap_or_default();
            if phase == "Pending" && now >= created + start {
                status.phase = Some(if st.fails { "Failed" } else { "Running" }.into());
            }
            if status.phase.as_deref() == Some("Running") && status.conditions.is_none() && now >= created + start + ready {
                status.conditions = Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(builders::at(now))),
                    ..Default::default()
                }]);
            }
        }
    }

    /// Runs syncs until nothing is left to do or `max_ticks`.
    pub fn run(&mut self) -> Result<Outcome, Invalid> {
        let spec = Spec::from_daemonset(&self.ds)?;
        let mut out =
            Outcome { ticks: Vec::new(), converged: false, violations: Vec::new(), max_unavailable_seen: 0, max_extra_pods_seen: 0 };
        let mut quiet = 0;
        for _ in 0..self.cfg.max_ticks {
            self.now += 1;
            self.kubelet();
            let p = plan::plan(&self.ds, &self.nodes, &self.pods, builders::at(self.now), None)?;
            self.check(&spec, &p, &mut out);
            let (mut created, mut deleted) = (0, 0);
            for a in &p.actions {
                match a {
                    Action::Create { node } => {
                        let name = self.name();
                        let fails = self.cfg.fail_rate > 0.0 && self.rng.random_bool(self.cfg.fail_rate.clamp(0.0, 1.0));
                        self.pods.push(builders::pod(&name, node, &p.revision.hash, builders::at(self.now), "Pending", None));
                        self.state.push(SimState { gone_at: None, fails });
                        created += 1;
                    }
                    Action::Delete { pod, .. } => {
                        if let Some(i) = self.pods.iter().position(|p| p.metadata.name.as_deref() == Some(pod.as_str())) {
                            if self.state[i].gone_at.is_none() {
                                self.pods[i].metadata.deletion_timestamp = Some(Time(builders::at(self.now)));
                                self.state[i].gone_at = Some(self.now + 1);
                                deleted += 1;
                            }
                        }
                    }
                }
            }
            out.ticks.push(Tick { t: self.now, created, deleted, status: p.status });
            let s = p.status;
            let done = p.actions.is_empty()
                && s.updated_number_scheduled == s.desired_number_scheduled
                && s.number_available == s.desired_number_scheduled
                && s.number_misscheduled == 0
                && self.state.iter().all(|st| st.gone_at.is_none());
            quiet = if done { quiet + 1 } else { 0 };
            if quiet >= 2 {
                out.converged = true;
                break;
            }
        }
        Ok(out)
    }

    /// The invariants, checked on the state a sync sees.
    fn check(&self, spec: &Spec, p: &plan::Plan, out: &mut Outcome) {
        let desired = p.status.desired_number_scheduled;
        let (max_surge, max_unavailable) = spec.rolling_counts(desired);
        let now = builders::at(self.now);
        let mut unavailable = 0;
        let mut extra = 0;
        let mut live_by_node: std::collections::HashMap<String, Vec<&Pod>> = std::collections::HashMap::new();
        for (pod, st) in self.pods.iter().zip(&self.state) {
            if st.gone_at.is_none() {
                if let Some(n) = plan::target_node(pod) {
                    live_by_node.entry(n).or_default().push(pod);
                }
            }
        }
        for n in &p.nodes {
            let live: &[&Pod] = live_by_node.get(&n.node).map(Vec::as_slice).unwrap_or(&[]);
            if n.should_run && !live.iter().any(|pd| plan::is_available(pd, spec.min_ready_seconds, now)) {
                unavailable += 1;
            }
            let limit = if max_surge > 0 { 2 } else { 1 };
            if live.len() > limit {
                out.violations.push(format!("t={}: {} pods on node {}", self.now, live.len(), n.node));
            }
            extra += live.len().saturating_sub(1);
        }
        out.max_unavailable_seen = out.max_unavailable_seen.max(unavailable);
        out.max_extra_pods_seen = out.max_extra_pods_seen.max(extra);
        if self.cfg.fail_rate == 0.0 {
            if max_surge == 0 && unavailable > max_unavailable {
                out.violations.push(format!("t={}: {unavailable} nodes unavailable > maxUnavailable {max_unavailable}", self.now));
            }
            if max_surge > 0 && extra > max_surge {
                out.violations.push(format!("t={}: {extra} extra pods > maxSurge {max_surge}", self.now));
            }
        }
        if matches!(spec.strategy, Strategy::OnDelete)
            && p.actions
                .iter()
                .any(|a| matches!(a, Action::Delete { reason, .. } if reason.starts_with("rolling update") || reason.starts_with("surge")))
        {
            out.violations.push(format!("t={}: OnDelete deleted a pod for an update", self.now));
        }
        let s = p.status;
        if !(s.current_number_scheduled <= s.desired_number_scheduled
            && s.number_ready <= s.current_number_scheduled
            && s.number_available <= s.number_ready
            && s.updated_number_scheduled <= s.current_number_scheduled
            && s.number_unavailable == s.desired_number_scheduled - s.number_available)
        {
            out.violations.push(format!("t={}: inconsistent status {s:?}", self.now));
        }
    }
}

/// Whether the converged cluster has exactly one updated, ready pod on every
/// eligible node and none elsewhere.
pub fn final_state_ok(c: &Cluster) -> Result<(), String> {
    let p = plan::plan(&c.ds, &c.nodes, &c.pods, builders::at(c.now), None).map_err(|e| e.to_string())?;
    let mut by_node: std::collections::HashMap<String, Vec<&Pod>> = std::collections::HashMap::new();
    for pd in &c.pods {
        if let Some(n) = plan::target_node(pd) {
            by_node.entry(n).or_default().push(pd);
        }
    }
    for n in &p.nodes {
        let on: &[&Pod] = by_node.get(&n.node).map(Vec::as_slice).unwrap_or(&[]);
        let updated =
            on.iter().filter(|pd| pd.metadata.labels.as_ref().and_then(|l| l.get(plan::REVISION_LABEL)) == Some(&p.revision.hash)).count();
        if n.should_run && (on.len() != 1 || updated != 1 || !plan::is_ready(on[0])) {
            return Err(format!("node {}: {} pods, {} updated", n.node, on.len(), updated));
        }
        if !n.should_run && !n.should_continue_running && !on.is_empty() {
            return Err(format!("node {} is ineligible but has {} pods", n.node, on.len()));
        }
    }
    Ok(())
}
