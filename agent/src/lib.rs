//! node-agent: node_exporter-compatible host metrics, kernel events through
//! eBPF, and DaemonSet planning, for one Kubernetes node.

pub mod caps;
pub mod cli;
pub mod collector;
pub mod config;
pub mod controller;
pub mod daemonset;
pub mod ebpf;
pub mod expfmt;
pub mod logging;
pub mod manifests;
pub mod metrics;
pub mod plan_cli;
pub mod pods;
pub mod process;
pub mod scrape;
pub mod server;
pub mod sys;
pub mod webconfig;
