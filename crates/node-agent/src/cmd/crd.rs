//! `node-agent crd`: print the NodeAgent CustomResourceDefinition.

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use super::Error;

pub fn command() -> Command {
    Command::new("crd").about("Print the NodeAgent CustomResourceDefinition (YAML).")
}

pub fn run(_: &ArgMatches) -> Result<ExitCode, Error> {
    let y = controller::crd::crd_yaml().map_err(|e| Error::Failed(format!("CRD: {e}")))?;
    print!("{y}");
    Ok(ExitCode::SUCCESS)
}
