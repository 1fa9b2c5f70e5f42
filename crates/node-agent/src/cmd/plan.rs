//! `node-agent plan`: one DaemonSet controller sync planned from files.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Command};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use planner::{input, plan};

use super::{one_daemonset, Error, Output, OutputArg};

// The flags of `plan` (files as strings: clap's PathBuf parser would refuse
// an empty one itself).
#[derive(clap::Args)]
struct PlanArgs {
    #[arg(long = "daemonset", value_name = "FILE", help = "The DaemonSet (YAML or JSON).")]
    daemonset: String,
    #[arg(long = "nodes", value_name = "FILE", help = "Nodes: objects, a NodeList, or YAML documents.")]
    nodes: String,
    #[arg(long = "pods", value_name = "FILE", help = "Pods of the DaemonSet (optional).")]
    pods: Option<String>,
    #[arg(long = "now", value_name = "RFC3339", help = "The time of the sync [default: now].")]
    now: Option<String>,
    #[arg(
        long = "revision-hash",
        value_name = "HASH",
        help = "The cluster's current revision hash (controller-revision-hash) instead of the computed one."
    )]
    revision_hash: Option<String>,
    #[command(flatten)]
    output: OutputArg,
}

pub fn command() -> Command {
    let cmd = Command::new("plan").about("Plan one DaemonSet controller sync from files: per-node decisions, actions, status, revision.");
    <PlanArgs as clap::Args>::augment_args(cmd)
}

fn now_arg(now: Option<&str>) -> Result<Timestamp, Error> {
    match now {
        Some(s) => s.parse::<Timestamp>().map_err(|e| Error::Usage(format!("--now {s:?}: {e}"))),
        None => Ok(Timestamp::now()),
    }
}

/// `kubectl get ds`-style summary and a per-node table.
pub fn table(ds: &DaemonSet, p: &plan::Plan) -> String {
    let name = ds.metadata.name.clone().unwrap_or_default();
    let sel = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.node_selector.clone())
        .filter(|m| !m.is_empty())
        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
        .unwrap_or_else(|| "<none>".into());
    let s = &p.status;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:>7} {:>7} {:>5} {:>10} {:>9}   NODE SELECTOR",
        "NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"
    );
    let _ = writeln!(
        out,
        "{:<20} {:>7} {:>7} {:>5} {:>10} {:>9}   {sel}\n",
        name, s.desired_number_scheduled, s.current_number_scheduled, s.number_ready, s.updated_number_scheduled, s.number_available
    );
    let _ = writeln!(out, "{:<24} {:<10} {:<10} {:<28} REASONS", "NODE", "SHOULD-RUN", "CONTINUE", "ACTION");
    for n in &p.nodes {
        let actions: Vec<String> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                plan::Action::Create { node } if node == &n.node => Some("create".to_string()),
                plan::Action::Delete { node, pod, .. } if node == &n.node => Some(format!("delete {pod}")),
                _ => None,
            })
            .collect();
        let action = if actions.is_empty() { "-".to_string() } else { actions.join(", ") };
        let _ =
            writeln!(out, "{:<24} {:<10} {:<10} {:<28} {}", n.node, n.should_run, n.should_continue_running, action, n.reasons.join("; "));
    }
    let _ = writeln!(out, "\nrevision {}", p.revision.hash);
    out
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let a: PlanArgs = super::args(m)?;
    let usage = |e: input::InputError| Error::Usage(e.to_string());
    let ds_path = PathBuf::from(&a.daemonset);
    let ds = one_daemonset(&ds_path)?;
    let nodes: Vec<Node> = input::read(&PathBuf::from(&a.nodes), "Node").map_err(usage)?;
    let pods: Vec<Pod> = match &a.pods {
        Some(p) => input::read(&PathBuf::from(p), "Pod").map_err(usage)?,
        None => Vec::new(),
    };
    let now = now_arg(a.now.as_deref())?;
    let p =
        plan::plan(&ds, &nodes, &pods, now, a.revision_hash.as_deref()).map_err(|e| Error::Usage(format!("{}: {e}", ds_path.display())))?;
    if a.output.output == Output::Table {
        print!("{}", table(&ds, &p));
    } else {
        println!("{}", serde_json::to_string_pretty(&p).map_err(|e| Error::Usage(e.to_string()))?);
    }
    Ok(ExitCode::SUCCESS)
}
