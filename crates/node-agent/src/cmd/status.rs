//! `node-agent status`: list NodeAgents like `kubectl get ds`.

use std::process::ExitCode;

use clap::{Arg, ArgAction, ArgMatches, Command};
use controller::crd::NodeAgent;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use super::Error;

pub fn command() -> Command {
    Command::new("status")
        .about("List NodeAgents like `kubectl get ds`.")
        .arg(super::namespace_arg())
        .arg(Arg::new("all-namespaces").long("all-namespaces").short('A').action(ArgAction::SetTrue))
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let all = m.get_flag("all-namespaces");
    let ns = m.get_one::<String>("namespace").cloned().unwrap_or_default();
    super::runtime()?.block_on(async move {
        let client = Client::try_default().await?;
        let api: Api<NodeAgent> = if all { Api::all(client) } else { Api::namespaced(client, &ns) };
        let list = api.list(&ListParams::default()).await?;
        print!("{}", controller::report::status_table(&list.items, Timestamp::now(), all));
        Ok(ExitCode::SUCCESS)
    })
}
