//! The controller's own metrics, served on their own port.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    pub reconciles: Counter,
    /// By [`crate::reconcile::Error::metric_label`].
    pub reconcile_errors: Family<Labels, Counter>,
    pub reconcile_duration: Histogram,
    pub pods_created: Counter,
    pub pods_deleted: Counter,
    pub halts: Counter,
    pub rollbacks: Counter,
    pub gate_checks: Family<Labels, Counter>,
    updated: Family<Labels, Gauge>,
    desired: Family<Labels, Gauge>,
    halted: Family<Labels, Gauge>,
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("node_agent_controller");
        let m = Metrics {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            pods_created: Counter::default(),
            pods_deleted: Counter::default(),
            halts: Counter::default(),
            rollbacks: Counter::default(),
            gate_checks: Family::default(),
            updated: Family::default(),
            desired: Family::default(),
            halted: Family::default(),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("reconciles", "NodeAgent reconciles run", m.reconciles.clone());
        registry.register(
            "reconcile_errors",
            "NodeAgent reconciles that failed (retried with backoff), by reason",
            m.reconcile_errors.clone(),
        );
        registry.register("reconcile_duration_seconds", "Time one reconcile took", m.reconcile_duration.clone());
        registry.register("pods_created", "Agent pods created", m.pods_created.clone());
        registry.register("pods_deleted", "Agent pods deleted", m.pods_deleted.clone());
        registry.register("rollout_halts", "Rollouts halted by the health gate", m.halts.clone());
        registry.register("rollbacks", "Automatic rollbacks after a halt", m.rollbacks.clone());
        registry.register("health_gate_checks", "Health gate scrapes of new pods, by result (pass, fail)", m.gate_checks.clone());
        registry.register("rollout_updated_nodes", "Nodes running the NodeAgent's update revision", m.updated.clone());
        registry.register("rollout_desired_nodes", "Nodes that should run the NodeAgent", m.desired.clone());
        registry.register("rollout_halted", "1 while the NodeAgent's rollout is halted by the health gate", m.halted.clone());
        registry.register("leader", "1 while this replica holds the leader Lease", m.leader.clone());
        Metrics { registry, ..m }
    }

    /// Rollout progress of one NodeAgent (labels: namespace, nodeagent).
    pub fn set_progress(&self, namespace: &str, name: &str, updated: i32, desired: i32, halted: bool) {
        let l = vec![("namespace".to_string(), namespace.to_string()), ("nodeagent".to_string(), name.to_string())];
        self.updated.get_or_create(&l).set(updated as i64);
        self.desired.get_or_create(&l).set(desired as i64);
        self.halted.get_or_create(&l).set(i64::from(halted));
    }

    /// Counts a failed reconcile under its bounded reason.
    pub fn reconcile_error(&self, reason: &'static str) {
        self.reconcile_errors.get_or_create(&vec![("reason".to_string(), reason.to_string())]).inc();
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
