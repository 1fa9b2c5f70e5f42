//! `node-agent controller`: run the NodeAgent controller.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgMatches, Command};
use kube::Client;

use super::Error;

pub fn command() -> Command {
    Command::new("controller")
        .about("Run the NodeAgent controller (leader-elected; metrics on their own port).")
        .arg(Arg::new("namespace").long("namespace").value_name("NS").help("Watch NodeAgents in this namespace only [default: all]."))
        .arg(
            Arg::new("metrics-address")
                .long("metrics-address")
                .value_name("ADDR")
                .default_value("0.0.0.0:9101")
                .value_parser(clap::value_parser!(SocketAddr)),
        )
        .arg(Arg::new("lease-namespace").long("lease-namespace").value_name("NS").env("POD_NAMESPACE").default_value("monitoring"))
        .arg(Arg::new("lease-name").long("lease-name").value_name("NAME").default_value("node-agent-controller"))
        .arg(
            Arg::new("identity")
                .long("identity")
                .value_name("ID")
                .env("POD_NAME")
                .help("This replica's lease identity [default: the hostname]."),
        )
        .arg(
            Arg::new("lease-duration")
                .long("lease-duration")
                .value_name("SECONDS")
                .default_value("15")
                .value_parser(clap::value_parser!(u64).range(3..)),
        )
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    crate::logging::init(tracing::Level::INFO, crate::logging::Format::Logfmt);
    let identity = m
        .get_one::<String>("identity")
        .cloned()
        .unwrap_or_else(|| host::sys::uname().map(|u| u.nodename).unwrap_or_else(|_| "node-agent-controller".into()));
    let opts = controller::Options {
        namespace: m.get_one::<String>("namespace").cloned(),
        metrics_address: m.get_one::<SocketAddr>("metrics-address").copied().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 9101))),
        lease_namespace: m.get_one::<String>("lease-namespace").cloned().unwrap_or_default(),
        lease_name: m.get_one::<String>("lease-name").cloned().unwrap_or_default(),
        identity,
        lease_duration: Duration::from_secs(m.get_one::<u64>("lease-duration").copied().unwrap_or(15)),
    };
    super::runtime()?.block_on(async move {
        let client = Client::try_default().await?;
        controller::run(client, opts).await?;
        Ok(ExitCode::SUCCESS)
    })
}
