//! `node-agent controller`: run the NodeAgent controller.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgMatches, Command};
use kube::Client;

use super::Error;

// The flags of `controller`.
#[derive(clap::Args)]
struct ControllerArgs {
    #[arg(long = "namespace", value_name = "NS", help = "Watch NodeAgents in this namespace only [default: all].")]
    namespace: Option<String>,
    #[arg(long = "metrics-address", value_name = "ADDR", default_value = "0.0.0.0:9101")]
    metrics_address: SocketAddr,
    #[arg(long = "lease-namespace", value_name = "NS", env = "POD_NAMESPACE", default_value = "monitoring")]
    lease_namespace: String,
    #[arg(long = "lease-name", value_name = "NAME", default_value = "node-agent-controller")]
    lease_name: String,
    #[arg(long = "identity", value_name = "ID", env = "POD_NAME", help = "This replica's lease identity [default: the hostname].")]
    identity: Option<String>,
    #[arg(long = "lease-duration", value_name = "SECONDS", default_value = "15", value_parser = clap::value_parser!(u64).range(3..))]
    lease_duration: u64,
}

pub fn command() -> Command {
    let cmd = Command::new("controller").about("Run the NodeAgent controller (leader-elected; metrics on their own port).");
    <ControllerArgs as clap::Args>::augment_args(cmd)
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let a: ControllerArgs = super::args(m)?;
    crate::logging::init(tracing::Level::INFO, crate::logging::Format::Logfmt);
    let identity = a.identity.unwrap_or_else(|| host::sys::uname().map(|u| u.nodename).unwrap_or_else(|_| "node-agent-controller".into()));
    let opts = controller::Options {
        namespace: a.namespace,
        metrics_address: a.metrics_address,
        lease_namespace: a.lease_namespace,
        lease_name: a.lease_name,
        identity,
        lease_duration: Duration::from_secs(a.lease_duration),
    };
    super::runtime()?.block_on(async move {
        let client = Client::try_default().await?;
        controller::run(client, opts).await?;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_read_typed() {
        let m = command().no_binary_name(true).try_get_matches_from(["--lease-name", "x"]).unwrap();
        let a: ControllerArgs = super::super::args(&m).unwrap();
        assert_eq!(a.metrics_address, SocketAddr::from(([0, 0, 0, 0], 9101)));
        assert_eq!((a.lease_name.as_str(), a.lease_duration), ("x", 15));
        assert_eq!(a.namespace, None);
    }
}
