//! `node-agent manifests`: write deploy/ from the code (`cargo xtask manifests`).

use std::process::ExitCode;

use clap::{Arg, ArgMatches, Command};

use super::Error;

pub fn command() -> Command {
    Command::new("manifests")
        .about("Write deploy/ from the code (what `cargo xtask manifests` runs).")
        .hide(true)
        .arg(Arg::new("root").long("root").value_name("DIR").default_value(".").help("The repository root."))
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let root = std::path::PathBuf::from(m.get_one::<String>("root").cloned().unwrap_or_else(|| ".".into()));
    let changed = crate::manifests::write(&root).map_err(|e| Error::Failed(e.to_string()))?;
    for c in &changed {
        println!("wrote {c}");
    }
    if changed.is_empty() {
        println!("deploy/ is up to date");
    }
    Ok(ExitCode::SUCCESS)
}
