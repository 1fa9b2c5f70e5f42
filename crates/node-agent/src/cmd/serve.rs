//! `node-agent serve` (the default): serve node metrics until SIGTERM.

use std::process::ExitCode;

use clap::{ArgMatches, Command};

use super::Error;

/// The command, with every serve flag.
pub fn command() -> Command {
    with_args(Command::new("serve").about("Serve metrics (the default)."))
}

/// Adds the serve flags to a command (the root takes them too).
pub fn with_args(cmd: Command) -> Command {
    cmd.args(crate::config::serve_args())
}

/// Serves until SIGTERM or SIGINT.
pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    crate::agent::serve(m)?;
    Ok(ExitCode::SUCCESS)
}
