//! `node-agent status`: list NodeAgents like `kubectl get ds`.

use std::process::ExitCode;

use clap::{ArgMatches, Command};
use controller::crd::NodeAgent;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use super::{Error, NamespaceArg};

// The flags of `status`.
#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    namespace: NamespaceArg,
    #[arg(long = "all-namespaces", short = 'A')]
    all_namespaces: bool,
}

pub fn command() -> Command {
    let cmd = Command::new("status").about("List NodeAgents like `kubectl get ds`.");
    <StatusArgs as clap::Args>::augment_args(cmd)
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let StatusArgs { namespace: NamespaceArg { namespace: ns }, all_namespaces: all } = super::args(m)?;
    super::runtime()?.block_on(async move {
        let client = Client::try_default().await?;
        let api: Api<NodeAgent> = if all { Api::all(client) } else { Api::namespaced(client, &ns) };
        let list = api.list(&ListParams::default()).await?;
        print!("{}", controller::report::status_table(&list.items, Timestamp::now(), all));
        Ok(ExitCode::SUCCESS)
    })
}
