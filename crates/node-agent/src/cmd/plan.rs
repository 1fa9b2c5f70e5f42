//! `node-agent plan`: one DaemonSet controller sync planned from files.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, ArgMatches, Command};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use planner::{input, plan};

use super::{one_daemonset, output_arg, Error};

pub fn command() -> Command {
    Command::new("plan")
        .about("Plan one DaemonSet controller sync from files: per-node decisions, actions, status, revision.")
        .arg(Arg::new("daemonset").long("daemonset").required(true).value_name("FILE").help("The DaemonSet (YAML or JSON)."))
        .arg(Arg::new("nodes").long("nodes").required(true).value_name("FILE").help("Nodes: objects, a NodeList, or YAML documents."))
        .arg(Arg::new("pods").long("pods").value_name("FILE").help("Pods of the DaemonSet (optional)."))
        .arg(Arg::new("now").long("now").value_name("RFC3339").help("The time of the sync [default: now]."))
        .arg(
            Arg::new("revision-hash")
                .long("revision-hash")
                .value_name("HASH")
                .help("The cluster's current revision hash (controller-revision-hash) instead of the computed one."),
        )
        .arg(output_arg())
}

fn now_arg(m: &ArgMatches) -> Result<Timestamp, Error> {
    match m.get_one::<String>("now") {
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
    let get = |k: &str| m.get_one::<String>(k).map(PathBuf::from);
    let usage = |e: input::InputError| Error::Usage(e.to_string());
    let ds_path = get("daemonset").ok_or_else(|| Error::Usage("--daemonset is required".into()))?;
    let ds = one_daemonset(&ds_path)?;
    let nodes: Vec<Node> = input::read(&get("nodes").ok_or_else(|| Error::Usage("--nodes is required".into()))?, "Node").map_err(usage)?;
    let pods: Vec<Pod> = match get("pods") {
        Some(p) => input::read(&p, "Pod").map_err(usage)?,
        None => Vec::new(),
    };
    let now = now_arg(m)?;
    let hash = m.get_one::<String>("revision-hash").map(String::as_str);
    let p = plan::plan(&ds, &nodes, &pods, now, hash).map_err(|e| Error::Usage(format!("{}: {e}", ds_path.display())))?;
    if m.get_one::<String>("output").map(String::as_str) == Some("table") {
        print!("{}", table(&ds, &p));
    } else {
        println!("{}", serde_json::to_string_pretty(&p).map_err(|e| Error::Usage(e.to_string()))?);
    }
    Ok(ExitCode::SUCCESS)
}
