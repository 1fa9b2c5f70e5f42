//! The `NodeAgent` custom resource (nodeagent.io/v1alpha1): a DaemonSet's
//! spec plus the rollout safety a fleet-wide agent needs. The CRD is
//! generated from these types (`node-agent crd`).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "nodeagent.io";
pub const VERSION: &str = "v1alpha1";
/// The field manager of every server-side apply the controller makes.
pub const FIELD_MANAGER: &str = "node-agent-controller";
/// The pod readiness gate the health gate sets.
pub const GATE_CONDITION: &str = "nodeagent.io/health-gate";
pub const DEFAULT_PRIORITY_CLASS: &str = "node-agent-critical";
/// Below system-node-critical (2000001000) and system-cluster-critical.
pub const DEFAULT_PRIORITY_VALUE: i32 = 1_000_000_000;

/// A set of per-node agents: one pod on every eligible node, rolled out
/// with partition, pause, waves and a health gate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
#[kube(
    group = "nodeagent.io",
    version = "v1alpha1",
    kind = "NodeAgent",
    plural = "nodeagents",
    shortname = "na",
    namespaced,
    status = "NodeAgentStatus",
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredNumberScheduled"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.currentNumberScheduled"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.numberReady"}"#,
    printcolumn = r#"{"name":"Up-to-date","type":"integer","jsonPath":".status.updatedNumberScheduled"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.numberAvailable"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentSpec {
    /// Selects the agent pods; must match the template's labels.
    pub selector: LabelSelector,
    /// The agent pod template (a core/v1 PodTemplateSpec). Kept schemaless in
    /// the CRD so that `kubectl apply` (client-side) stays under the
    /// annotation size limit; the controller reads it as a PodTemplateSpec,
    /// and a template it cannot plan (labels not matching the selector, a bad
    /// affinity) fails the reconcile with the field named (logged, counted in
    /// node_agent_controller_reconcile_errors_total).
    #[schemars(schema_with = "preserve_unknown_object")]
    pub template: PodTemplateSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    /// Old revisions kept for `rollout undo` (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    #[serde(default)]
    pub rollout: Rollout,
    #[serde(default)]
    pub priority: Priority,
    /// A DaemonSet this NodeAgent takes over node by node (node_exporter's):
    /// see docs/controller.md, "Taking over from node_exporter".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<Replaces>,
}

/// The DaemonSet a NodeAgent takes over, one node at a time in the
/// rollout's order (waves, maxUnavailable, partition, pause), each node
/// gated on serving every family the old exporter served there.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Replaces {
    pub namespace: String,
    pub name: String,
    /// The port the replaced exporter serves /metrics on (read once per
    /// node, just before the node moves).
    #[serde(default = "default_port")]
    #[schemars(schema_with = "port_schema")]
    pub port: u16,
    /// Give every moved node back to the replaced DaemonSet and put its
    /// spec back as it was.
    #[serde(default)]
    pub give_back: bool,
}

/// As apps/v1 DaemonSetUpdateStrategy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// RollingUpdate (default) or OnDelete.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrString>,
}

/// Rollout safety beyond a DaemonSet's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Keep this many eligible nodes (the last in wave, then name order) on
    /// the previous revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// Stop replacing pods; pods on new nodes get the current revision.
    #[serde(default)]
    pub paused: bool,
    /// Rolled in order: a wave starts once every node of the earlier waves
    /// runs the new revision and is available. Nodes no wave selects come last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<Wave>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_gate: Option<HealthGate>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    pub name: String,
    pub selector: LabelSelector,
}

/// Before a new pod counts as ready, its /metrics must answer and report
/// every `node_ebpf_program_up` = 1 and every required collector's
/// `node_scrape_collector_success` = 1.
#[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthGate {
    #[serde(default = "default_port")]
    #[schemars(schema_with = "port_schema")]
    pub port: u16,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default)]
    pub required_collectors: Vec<String>,
    /// A new pod that has not passed the gate this long after its
    /// containers became ready (or after creation) halts the rollout.
    #[serde(default = "default_deadline")]
    pub deadline_seconds: i64,
    /// On a halt, put the template back to the current revision.
    #[serde(default)]
    pub auto_rollback: bool,
    /// Fewer `node_ebpf_program_up` series than this fails the gate (an
    /// agent that loaded no program); 0 for agents run without eBPF.
    #[serde(default = "default_min_programs")]
    pub min_programs: i32,
}

fn default_min_programs() -> i32 {
    1
}

fn default_port() -> u16 {
    9100
}

/// A port as the API server knows it (schemars would say `format: uint16`,
/// a format the API server does not know).
fn port_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer",
        "format": "int32",
        "minimum": 1,
        "maximum": 65535,
        "default": 9100
    })
}
fn default_path() -> String {
    "/metrics".into()
}
fn default_deadline() -> i64 {
    300
}

impl Default for HealthGate {
    fn default() -> Self {
        HealthGate {
            port: default_port(),
            path: default_path(),
            required_collectors: Vec::new(),
            deadline_seconds: default_deadline(),
            auto_rollback: false,
            min_programs: default_min_programs(),
        }
    }
}

/// The PriorityClass ensured (created when missing) and set on pods.
#[derive(Serialize, Deserialize, Clone, Debug, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Priority {
    #[serde(default = "default_class")]
    pub class_name: String,
    #[serde(default = "default_value")]
    pub value: i32,
}

fn default_class() -> String {
    DEFAULT_PRIORITY_CLASS.into()
}
fn default_value() -> i32 {
    DEFAULT_PRIORITY_VALUE
}

impl Default for Priority {
    fn default() -> Self {
        Priority { class_name: default_class(), value: default_value() }
    }
}

/// The DaemonSet status counts, the revisions and the conditions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub desired_number_scheduled: i32,
    #[serde(default)]
    pub current_number_scheduled: i32,
    #[serde(default)]
    pub number_misscheduled: i32,
    #[serde(default)]
    pub number_ready: i32,
    #[serde(default)]
    pub updated_number_scheduled: i32,
    #[serde(default)]
    pub number_available: i32,
    #[serde(default)]
    pub number_unavailable: i32,
    /// The revision hash every node ran when the last rollout completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// The revision hash of the template now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_revision: Option<String>,
    /// The revision whose rollout the health gate halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_revision: Option<String>,
    /// The wave being rolled (its name), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave: Option<String>,
    /// When `rollout resume` last cleared a halt (written by the CLI, kept
    /// by the controller): a pod's health-gate deadline counts from here at
    /// the earliest, so a resume never re-halts on the pod it forgave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where the takeover of `spec.replaces` stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStatus>,
}

/// The takeover of a DaemonSet: how many nodes run which exporter, which
/// moves next and why nothing moves.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// `namespace/name` of the replaced DaemonSet.
    pub replaced: String,
    /// Preparing, Migrating, Paused, Halted, Complete, GivingBack, GivenBack
    /// or Replaced (the replaced DaemonSet is gone).
    pub phase: String,
    /// Nodes (of those the agent should run on) still on the old exporter.
    #[serde(default)]
    pub old_exporter_nodes: i32,
    /// Nodes between the two: the old pod going, or the agent not yet
    /// through its gate, or on the way back.
    #[serde(default)]
    pub moving_nodes: i32,
    /// Nodes moved: the agent ready and through its gate.
    #[serde(default)]
    pub node_agent_nodes: i32,
    /// The moving nodes (the first ten).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moving: Vec<String>,
    /// The node that moves next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Why no node moves now, when none does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The node whose gate failed and that went back to the old exporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_node: Option<String>,
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// The CRD as YAML, as committed in deploy/.
pub fn crd_yaml() -> Result<String, serde_yaml_ng::Error> {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&NodeAgent::crd())
}
