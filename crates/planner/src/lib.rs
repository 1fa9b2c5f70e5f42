//! DaemonSet logic: the upstream daemon controller's decisions as a pure
//! library (placement, one sync's actions, status, revision hash), the input
//! files of `node-agent plan`, a cluster simulator for `node-agent simulate`,
//! and the report of `node-agent explain`. Pure: Kubernetes types and serde,
//! no API client, so it builds and tests on any machine with a stable Rust.

pub mod builders;
pub mod explain;
pub mod input;
pub mod plan;
pub mod scheduling;
pub mod simulate;

/// system-node-critical's priority: infrastructure DaemonSets under node
/// pressure should run at least this high.
pub const SYSTEM_NODE_CRITICAL: i32 = 2_000_001_000;
