//! `node-agent manifests`: write deploy/ from the code (`cargo xtask manifests`).

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use super::Error;

// The flags of `manifests`.
#[derive(clap::Args)]
struct ManifestsArgs {
    #[arg(long = "root", value_name = "DIR", default_value = ".", help = "The repository root.")]
    root: String,
}

pub fn command() -> Command {
    let cmd = Command::new("manifests").about("Write deploy/ from the code (what `cargo xtask manifests` runs).").hide(true);
    <ManifestsArgs as clap::Args>::augment_args(cmd)
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let a: ManifestsArgs = super::args(m)?;
    let root = std::path::PathBuf::from(a.root);
    let changed = crate::manifests::write(&root).map_err(|e| Error::Failed(e.to_string()))?;
    for c in &changed {
        println!("wrote {c}");
    }
    if changed.is_empty() {
        println!("deploy/ is up to date");
    }
    Ok(ExitCode::SUCCESS)
}
