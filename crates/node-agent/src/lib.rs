//! The node-agent binary's library: the command line ([`cmd`]), the agent
//! runtime ([`agent`]), the HTTP server, web configuration and
//! capabilities, the eBPF loader ([`ebpf`]) and probes ([`probes`]), pod
//! attribution ([`pods`]), and the manifests in deploy/.
//!
//! Host collectors, the exposition, the planner and the controller are
//! crates of their own (`host`, `expo`, `planner`, `controller`); this
//! crate composes them. See ARCHITECTURE.md.

pub mod admission;
pub mod agent;
pub mod caps;
pub mod cmd;
pub mod config;
pub mod descriptors;
pub mod ebpf;
pub mod httpstats;
pub mod logging;
#[cfg(feature = "cluster")]
pub mod manifests;
pub mod pods;
pub mod probes;
pub mod process;
pub mod server;
pub mod turns;
pub mod webconfig;
