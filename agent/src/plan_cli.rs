//! The `plan`, `explain` and `simulate` commands.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, ArgAction, ArgMatches, Command};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::daemonset::{builders, explain as ex, input, plan, simulate};

fn output_arg() -> Arg {
    Arg::new("output").long("output").short('o').value_parser(["json", "table"]).default_value("json").help("Output format.")
}

pub fn plan_command() -> Command {
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

pub fn explain_command() -> Command {
    Command::new("explain")
        .about("Explain, against a live cluster, why nodes have no agent pod and what would fix it.")
        .arg(Arg::new("daemonset").long("daemonset").value_name("NAMESPACE/NAME").default_value("monitoring/node-agent"))
        .arg(Arg::new("node").long("node").value_name("NAME").help("Explain this node only."))
}

pub fn simulate_command() -> Command {
    Command::new("simulate")
        .about("Roll a DaemonSet out over a simulated cluster and check every invariant on the way.")
        .arg(Arg::new("daemonset").long("daemonset").required(true).value_name("FILE"))
        .arg(Arg::new("nodes").long("nodes").required(true).value_name("N").value_parser(clap::value_parser!(usize)))
        .arg(Arg::new("seed").long("seed").value_name("S").default_value("1").value_parser(clap::value_parser!(u64)))
        .arg(
            Arg::new("faults")
                .long("faults")
                .value_name("pod-failure=RATE")
                .action(ArgAction::Set)
                .help("Fail this fraction of new pods, e.g. pod-failure=0.05."),
        )
        .arg(output_arg())
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("node-agent: {msg}");
    ExitCode::from(2)
}

fn now_arg(m: &ArgMatches) -> Result<Timestamp, String> {
    match m.get_one::<String>("now") {
        Some(s) => s.parse::<Timestamp>().map_err(|e| format!("--now {s:?}: {e}")),
        None => Ok(Timestamp::now()),
    }
}

fn one_daemonset(path: &std::path::Path) -> Result<DaemonSet, String> {
    let mut v: Vec<DaemonSet> = input::read(path, "DaemonSet").map_err(|e| e.to_string())?;
    match v.len() {
        1 => Ok(v.remove(0)),
        n => Err(format!("{}: expected one DaemonSet, found {n}", path.display())),
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

pub fn plan(m: &ArgMatches) -> ExitCode {
    let get = |k: &str| m.get_one::<String>(k).map(PathBuf::from);
    let res = (|| -> Result<(DaemonSet, plan::Plan), String> {
        let ds_path = get("daemonset").ok_or("--daemonset is required")?;
        let ds = one_daemonset(&ds_path)?;
        let nodes: Vec<Node> = input::read(&get("nodes").ok_or("--nodes is required")?, "Node").map_err(|e| e.to_string())?;
        let pods: Vec<Pod> = match get("pods") {
            Some(p) => input::read(&p, "Pod").map_err(|e| e.to_string())?,
            None => Vec::new(),
        };
        let now = now_arg(m)?;
        let hash = m.get_one::<String>("revision-hash").map(String::as_str);
        let p = plan::plan(&ds, &nodes, &pods, now, hash).map_err(|e| format!("{}: {e}", ds_path.display()))?;
        Ok((ds, p))
    })();
    match res {
        Ok((ds, p)) => {
            if m.get_one::<String>("output").map(String::as_str) == Some("table") {
                print!("{}", table(&ds, &p));
            } else {
                match serde_json::to_string_pretty(&p) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(e),
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn explain(m: &ArgMatches) -> ExitCode {
    let target = m.get_one::<String>("daemonset").cloned().unwrap_or_default();
    let Some((ns, name)) = target.split_once('/') else {
        return fail(format!("--daemonset {target:?}: expected NAMESPACE/NAME"));
    };
    let node = m.get_one::<String>("node").cloned();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    let res = rt.block_on(async {
        let client =
            kube::Client::try_default().await.map_err(|e| format!("no cluster (kubeconfig or in-cluster service account): {e}"))?;
        ex::explain(client, ns, name, node.as_deref(), Timestamp::now()).await.map_err(|e| e.to_string())
    });
    match res {
        Ok(r) => {
            print!("{}", ex::render(&r));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("node-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn simulate(m: &ArgMatches) -> ExitCode {
    let res = (|| -> Result<simulate::Outcome, String> {
        let path = PathBuf::from(m.get_one::<String>("daemonset").cloned().unwrap_or_default());
        let ds = one_daemonset(&path)?;
        let n = m.get_one::<usize>("nodes").copied().unwrap_or(10);
        let mut cfg = simulate::Config { seed: m.get_one::<u64>("seed").copied().unwrap_or(1), ..Default::default() };
        if let Some(f) = m.get_one::<String>("faults") {
            let rate = f
                .strip_prefix("pod-failure=")
                .and_then(|r| r.parse::<f64>().ok())
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("--faults {f:?}: expected pod-failure=RATE with RATE in [0, 1]"))?;
            cfg.fail_rate = rate;
        }
        // The previous revision: the same DaemonSet with another template.
        let mut old = ds.clone();
        if let Some(t) = old.spec.as_mut().map(|s| &mut s.template) {
            t.metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert("node-agent.io/simulated-revision".into(), "previous".into());
        }
        let nodes: Vec<Node> = (0..n).map(|i| builders::node(&format!("node-{i:05}"), &[], &[])).collect();
        let mut c = simulate::Cluster::new(ds, &old, nodes, cfg).map_err(|e| format!("{}: {e}", path.display()))?;
        let out = c.run().map_err(|e| e.to_string())?;
        if let Err(e) = simulate::final_state_ok(&c) {
            let mut out = out;
            out.violations.push(format!("final state: {e}"));
            return Ok(out);
        }
        Ok(out)
    })();
    match res {
        Ok(out) => {
            if m.get_one::<String>("output").map(String::as_str) == Some("table") {
                println!(
                    "{:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>9}",
                    "T", "CREATED", "DELETED", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"
                );
                for t in &out.ticks {
                    if t.created + t.deleted == 0 {
                        continue;
                    }
                    let s = &t.status;
                    println!(
                        "{:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>9}",
                        t.t,
                        t.created,
                        t.deleted,
                        s.desired_number_scheduled,
                        s.current_number_scheduled,
                        s.number_ready,
                        s.updated_number_scheduled,
                        s.number_available
                    );
                }
                println!(
                    "converged: {}; ticks: {}; max unavailable: {}; max extra pods: {}",
                    out.converged,
                    out.ticks.len(),
                    out.max_unavailable_seen,
                    out.max_extra_pods_seen
                );
                for v in &out.violations {
                    println!("VIOLATION: {v}");
                }
                println!("invariants held: {}", out.violations.is_empty());
            } else {
                match serde_json::to_string_pretty(&out) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(e),
                }
            }
            if out.violations.is_empty() && out.converged {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(e),
    }
}
