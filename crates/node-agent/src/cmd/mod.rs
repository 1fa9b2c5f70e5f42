//! The `node-agent` command line: one module per subcommand, each with
//! `command()` and `run()`. With no subcommand, node-agent serves (taking
//! `serve`'s flags), as node_exporter does. The cluster-side commands are
//! in builds with the `cluster` feature (the default, and the controller
//! image's); the agent image's build names them and says where they are.

use std::process::ExitCode;

use clap::{ArgMatches, Command, FromArgMatches};

#[cfg(feature = "cluster")]
pub mod controller;
#[cfg(feature = "cluster")]
pub mod crd;
#[cfg(feature = "cluster")]
pub mod explain;
#[cfg(feature = "cluster")]
pub mod manifests;
#[cfg(feature = "cluster")]
pub mod plan;
#[cfg(feature = "cluster")]
pub mod rollout;
pub mod seccomp_profile;
pub mod serve;
#[cfg(feature = "cluster")]
pub mod simulate;
#[cfg(feature = "cluster")]
pub mod status;

/// The commands of the `cluster` feature.
pub const CLUSTER_COMMANDS: [&str; 8] = ["plan", "explain", "simulate", "controller", "crd", "manifests", "status", "rollout"];

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input: a flag, a file (exit status 2).
    #[error("{0}")]
    Usage(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[cfg(feature = "cluster")]
    #[error(transparent)]
    Controller(#[from] controller_crate::Error),
    #[error(transparent)]
    Serve(#[from] crate::agent::Error),
    #[error("{0}")]
    Failed(String),
}

#[cfg(feature = "cluster")]
use ::controller as controller_crate;

impl Error {
    /// The process exit status for the error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Usage(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// The root command.
pub fn command() -> Command {
    let root = Command::new("node-agent")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Node metrics compatible with node_exporter, kernel events through eBPF, and DaemonSet planning.")
        .args_conflicts_with_subcommands(true);
    let root = serve::with_args(root).subcommand(serve::command());
    #[cfg(feature = "cluster")]
    let root = root
        .subcommand(plan::command())
        .subcommand(explain::command())
        .subcommand(simulate::command())
        .subcommand(controller::command())
        .subcommand(crd::command())
        .subcommand(manifests::command())
        .subcommand(status::command())
        .subcommand(rollout::command());
    #[cfg(not(feature = "cluster"))]
    let root = CLUSTER_COMMANDS.iter().fold(root, |root, name| {
        root.subcommand(
            Command::new(*name)
                .hide(true)
                .disable_help_flag(true)
                .arg(clap::Arg::new("args").num_args(0..).trailing_var_arg(true).allow_hyphen_values(true).action(clap::ArgAction::Append)),
        )
    });
    root.subcommand(seccomp_profile::command())
}

/// Runs the command the matches name.
pub fn run(mut m: ArgMatches) -> Result<ExitCode, Error> {
    let Some((name, sub)) = m.remove_subcommand() else { return serve::run(m) };
    match name.as_str() {
        #[cfg(feature = "cluster")]
        "plan" => plan::run(&sub),
        #[cfg(feature = "cluster")]
        "explain" => explain::run(&sub),
        #[cfg(feature = "cluster")]
        "simulate" => simulate::run(&sub),
        #[cfg(feature = "cluster")]
        "controller" => controller::run(&sub),
        #[cfg(feature = "cluster")]
        "crd" => crd::run(&sub),
        #[cfg(feature = "cluster")]
        "manifests" => manifests::run(&sub),
        #[cfg(feature = "cluster")]
        "status" => status::run(&sub),
        #[cfg(feature = "cluster")]
        "rollout" => rollout::run(&sub),
        "seccomp-profile" => seccomp_profile::run(&sub),
        #[cfg(not(feature = "cluster"))]
        other if CLUSTER_COMMANDS.contains(&other) => Err(Error::Usage(format!(
            "`node-agent {other}` is not in this build: this is the agent image's binary, which serves metrics only. \
             Run it from the controller image (ghcr.io/node-agent/node-agent-controller) or a full build (`cargo install --path crates/node-agent`)."
        ))),
        _ => serve::run(sub),
    }
}

#[cfg(feature = "cluster")]
/// A multi-threaded runtime for the API commands.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| Error::Failed(format!("tokio runtime: {e}")))
}

/// A subcommand's flags, read from its matches. (The flag structs have `//`
/// comments: derive makes an Args struct's doc comment the about of the
/// command it is added to.)
pub(crate) fn args<T: FromArgMatches>(m: &ArgMatches) -> Result<T, Error> {
    T::from_arg_matches(m).map_err(|e| Error::Usage(e.to_string()))
}

#[cfg(feature = "cluster")]
// The `--namespace` of a NodeAgent.
#[derive(clap::Args)]
pub(crate) struct NamespaceArg {
    #[arg(long = "namespace", short = 'n', value_name = "NS", default_value = "monitoring", help = "The NodeAgent's namespace.")]
    pub namespace: String,
}

#[cfg(feature = "cluster")]
// `--output json|table` (value name `output`: derive's default is `OUTPUT`).
#[derive(clap::Args)]
pub(crate) struct OutputArg {
    #[arg(long = "output", short = 'o', value_name = "output", default_value = "json", help = "Output format.")]
    pub output: Output,
}

#[cfg(feature = "cluster")]
/// The format of `--output`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Json,
    Table,
}

#[cfg(feature = "cluster")]
/// Reads the one DaemonSet of a file.
pub(crate) fn one_daemonset(path: &std::path::Path) -> Result<k8s_openapi::api::apps::v1::DaemonSet, Error> {
    let mut v: Vec<k8s_openapi::api::apps::v1::DaemonSet> =
        planner::input::read(path, "DaemonSet").map_err(|e| Error::Usage(e.to_string()))?;
    match v.len() {
        1 => Ok(v.remove(0)),
        n => Err(Error::Usage(format!("{}: expected one DaemonSet, found {n}", path.display()))),
    }
}
