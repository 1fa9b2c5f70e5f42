//! What the controller's end-to-end tests share, whichever API server they
//! run against: a real agent for the health gate to scrape, and a
//! controller replica's options.

use std::net::SocketAddr;
use std::time::Duration;

/// node-agent in the test's process serving loadavg and meminfo on a free
/// loopback port (the agent runs its own runtime); the health gate scrapes
/// it at the pods' IP (127.0.0.1 in these tests) and `port()`.
pub fn agent() -> Result<node_agent::agent::Agent, String> {
    let m = node_agent::cmd::command()
        .try_get_matches_from([
            "node-agent",
            "--web.listen-address=127.0.0.1:0",
            "--collector.disable-defaults",
            "--collector.loadavg",
            "--collector.meminfo",
        ])
        .map_err(|e| e.to_string())?;
    node_agent::agent::Agent::start(&m).map_err(|e| e.to_string())
}

/// A controller replica's options: its lease identity (the Lease
/// `monitoring/node-agent-controller`, 3 s) and metrics address.
pub fn replica(identity: &str, metrics: SocketAddr) -> controller::Options {
    controller::Options {
        namespace: None,
        metrics_address: metrics,
        lease_namespace: "monitoring".into(),
        lease_name: "node-agent-controller".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
    }
}
