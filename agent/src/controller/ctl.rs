//! The controller's commands: `controller`, `crd`, `status`, and
//! `rollout status|history|undo|pause|resume`. Rendering is pure; the API
//! calls are thin.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::crd::{crd_yaml, NodeAgent};
use super::rollout::revision_template;
use super::NAME_LABEL;
use crate::daemonset::plan::REVISION_LABEL;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Controller(#[from] super::Error),
}

fn namespace_arg() -> Arg {
    Arg::new("namespace").long("namespace").short('n').value_name("NS").default_value("monitoring").help("The NodeAgent's namespace.")
}

pub fn controller_command() -> Command {
    Command::new("controller")
        .about("Run the NodeAgent controller (leader-elected; metrics on their own port).")
        .arg(Arg::new("namespace").long("namespace").value_name("NS").help("Watch NodeAgents in this namespace only [default: all]."))
        .arg(
            Arg::new("metrics-address")
                .long("metrics-address")
                .value_name("ADDR")
                .default_value("0.0.0.0:9101")
                .value_parser(clap::value_parser!(SocketAddr)),
        )
        .arg(Arg::new("lease-namespace").long("lease-namespace").value_name("NS").env("POD_NAMESPACE").default_value("monitoring"))
        .arg(Arg::new("lease-name").long("lease-name").value_name("NAME").default_value("node-agent-controller"))
        .arg(
            Arg::new("identity")
                .long("identity")
                .value_name("ID")
                .env("POD_NAME")
                .help("This replica's lease identity [default: the hostname]."),
        )
        .arg(
            Arg::new("lease-duration")
                .long("lease-duration")
                .value_name("SECONDS")
                .default_value("15")
                .value_parser(clap::value_parser!(u64).range(3..)),
        )
}

pub fn manifests_command() -> Command {
    Command::new("manifests")
        .about("Write deploy/ from the code (what `cargo xtask manifests` runs).")
        .hide(true)
        .arg(Arg::new("root").long("root").value_name("DIR").default_value(".").help("The repository root."))
}

pub fn manifests(m: &ArgMatches) -> ExitCode {
    let root = std::path::PathBuf::from(m.get_one::<String>("root").cloned().unwrap_or_else(|| ".".into()));
    match crate::manifests::write(&root) {
        Ok(changed) => {
            for c in &changed {
                println!("wrote {c}");
            }
            if changed.is_empty() {
                println!("deploy/ is up to date");
            }
            ExitCode::SUCCESS
        }
        Err(e) => finish(Err(Error::Usage(e.to_string()))),
    }
}

pub fn crd_command() -> Command {
    Command::new("crd").about("Print the NodeAgent CustomResourceDefinition (YAML).")
}

pub fn status_command() -> Command {
    Command::new("status")
        .about("List NodeAgents like `kubectl get ds`.")
        .arg(namespace_arg())
        .arg(Arg::new("all-namespaces").long("all-namespaces").short('A').action(ArgAction::SetTrue))
}

pub fn rollout_command() -> Command {
    let name = || Arg::new("name").required(true).value_name("NAME");
    Command::new("rollout")
        .about("Manage a NodeAgent's rollout.")
        .subcommand_required(true)
        .subcommand(
            Command::new("status")
                .about("Follow the rollout until it completes (exit 0) or halts (exit 1).")
                .arg(name())
                .arg(namespace_arg())
                .arg(
                    Arg::new("watch")
                        .long("watch")
                        .short('w')
                        .action(ArgAction::Set)
                        .default_value("true")
                        .value_parser(clap::value_parser!(bool)),
                )
                .arg(Arg::new("timeout").long("timeout").value_name("SECONDS").value_parser(clap::value_parser!(u64))),
        )
        .subcommand(Command::new("history").about("List the recorded revisions.").arg(name()).arg(namespace_arg()))
        .subcommand(
            Command::new("undo")
                .about("Put the template of an earlier revision back (default: the previous one).")
                .arg(name())
                .arg(namespace_arg())
                .arg(Arg::new("to-revision").long("to-revision").value_name("N").value_parser(clap::value_parser!(i64))),
        )
        .subcommand(Command::new("pause").about("Stop replacing pods.").arg(name()).arg(namespace_arg()))
        .subcommand(Command::new("resume").about("Resume a paused or halted rollout.").arg(name()).arg(namespace_arg()))
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| Error::Usage(format!("tokio runtime: {e}")))
}

fn finish(r: Result<ExitCode, Error>) -> ExitCode {
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("node-agent: {e}");
            ExitCode::FAILURE
        }
    }
}

pub fn crd(_: &ArgMatches) -> ExitCode {
    match crd_yaml() {
        Ok(y) => {
            print!("{y}");
            ExitCode::SUCCESS
        }
        Err(e) => finish(Err(Error::Usage(format!("CRD: {e}")))),
    }
}

pub fn controller(m: &ArgMatches) -> ExitCode {
    crate::logging::init(tracing::Level::INFO, crate::config::LogFormat::Logfmt);
    let identity = m
        .get_one::<String>("identity")
        .cloned()
        .unwrap_or_else(|| crate::sys::uname().map(|u| u.nodename).unwrap_or_else(|_| "node-agent-controller".into()));
    let opts = super::Options {
        namespace: m.get_one::<String>("namespace").cloned(),
        metrics_address: m.get_one::<SocketAddr>("metrics-address").copied().unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 9101))),
        lease_namespace: m.get_one::<String>("lease-namespace").cloned().unwrap_or_default(),
        lease_name: m.get_one::<String>("lease-name").cloned().unwrap_or_default(),
        identity,
        lease_duration: Duration::from_secs(m.get_one::<u64>("lease-duration").copied().unwrap_or(15)),
    };
    finish(runtime().and_then(|rt| {
        rt.block_on(async move {
            let client = Client::try_default().await?;
            super::run(client, opts).await?;
            Ok(ExitCode::SUCCESS)
        })
    }))
}

fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    let Some(c) = created else { return "<unknown>".into() };
    let s = (now.as_second() - c.as_second()).max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The `kubectl get ds`-style table.
pub fn status_table(agents: &[NodeAgent], now: Timestamp, with_namespace: bool) -> String {
    let mut rows: Vec<Vec<String>> = vec![["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "WAVE", "STATE", "AGE"]
        .iter()
        .map(|s| s.to_string())
        .collect()];
    if with_namespace {
        rows[0].insert(0, "NAMESPACE".into());
    }
    for a in agents {
        let s = a.status.clone().unwrap_or_default();
        let state = if s.halted_revision.is_some() {
            "Halted"
        } else if a.spec.rollout.paused {
            "Paused"
        } else if s.current_revision.is_some() && s.current_revision == s.update_revision {
            "Complete"
        } else {
            "Rolling"
        };
        let mut row = vec![
            a.name_any(),
            s.desired_number_scheduled.to_string(),
            s.current_number_scheduled.to_string(),
            s.number_ready.to_string(),
            s.updated_number_scheduled.to_string(),
            s.number_available.to_string(),
            s.current_wave.clone().unwrap_or_else(|| "-".into()),
            state.into(),
            age(a.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
        ];
        if with_namespace {
            row.insert(0, a.namespace().unwrap_or_default());
        }
        rows.push(row);
    }
    table(&rows)
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols).map(|c| rows.iter().map(|r| r.get(c).map_or(0, |s| s.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, s)| format!("{s:<w$}", w = widths[i])).collect();
        let _ = writeln!(out, "{}", line.join("   ").trim_end());
    }
    out
}

/// Where a rollout stands, for `rollout status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    Halted,
    Waiting,
}

/// One progress line, e.g. `[##########----------] 12/24 updated, 11 available, wave canary`.
pub fn progress(a: &NodeAgent) -> (String, Outcome) {
    let s = a.status.clone().unwrap_or_default();
    let observed = s.observed_generation.is_some() && s.observed_generation == a.metadata.generation;
    let desired = s.desired_number_scheduled.max(0) as usize;
    let updated = (s.updated_number_scheduled.max(0) as usize).min(desired);
    const WIDTH: usize = 30;
    let filled = (updated * WIDTH).checked_div(desired).unwrap_or(WIDTH);
    let bar = format!("[{}{}]", "#".repeat(filled), "-".repeat(WIDTH - filled));
    let mut line = format!("{bar} {updated}/{desired} updated, {} available", s.number_available);
    if let Some(w) = &s.current_wave {
        let _ = write!(line, ", wave {w}");
    }
    let halted = s.conditions.iter().find(|c| c.type_ == "RolloutHalted" && c.status == "True");
    let outcome = if !observed {
        line.push_str(" (waiting for the controller to observe the change)");
        Outcome::Waiting
    } else if let Some(h) = halted {
        let _ = write!(line, "\nrollout halted: {}", h.message);
        Outcome::Halted
    } else if s.update_revision.is_some() && s.current_revision == s.update_revision && s.number_available as usize >= desired {
        line.push_str("\nrollout complete");
        Outcome::Complete
    } else {
        if a.spec.rollout.paused {
            line.push_str(" (paused)");
        }
        Outcome::Waiting
    };
    (line, outcome)
}

/// The revision history table, oldest first.
pub fn history_table(revs: &[ControllerRevision], current: Option<&str>) -> String {
    let mut v: Vec<&ControllerRevision> = revs.iter().collect();
    v.sort_by_key(|r| r.revision);
    let mut rows = vec![vec!["REVISION".to_string(), "HASH".into(), "IMAGES".into(), "".into()]];
    for r in v {
        let hash = r.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
        let images = revision_template(r)
            .and_then(|t| t.spec)
            .map(|s| s.containers.iter().filter_map(|c| c.image.clone()).collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        let mark = if Some(hash.as_str()) == current { "(current)" } else { "" };
        rows.push(vec![r.revision.to_string(), hash, images, mark.into()]);
    }
    table(&rows)
}

/// The revision `undo` goes back to: `to` if given, else the newest one
/// older than the template's own.
pub fn undo_target<'a>(revs: &'a [ControllerRevision], update_hash: &str, to: Option<i64>) -> Result<&'a ControllerRevision, String> {
    if let Some(n) = to {
        return revs.iter().find(|r| r.revision == n).ok_or_else(|| format!("no revision {n} (see `node-agent rollout history`)"));
    }
    let hash = |r: &ControllerRevision| r.labels().get(REVISION_LABEL).cloned().unwrap_or_default();
    revs.iter().filter(|r| hash(r) != update_hash).max_by_key(|r| r.revision).ok_or_else(|| "no earlier revision to undo to".to_string())
}

async fn revisions(client: &Client, ns: &str, name: &str) -> Result<Vec<ControllerRevision>, Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}"))).await?.items)
}

pub fn status(m: &ArgMatches) -> ExitCode {
    let all = m.get_flag("all-namespaces");
    let ns = m.get_one::<String>("namespace").cloned().unwrap_or_default();
    finish(runtime().and_then(|rt| {
        rt.block_on(async move {
            let client = Client::try_default().await?;
            let api: Api<NodeAgent> = if all { Api::all(client) } else { Api::namespaced(client, &ns) };
            let list = api.list(&ListParams::default()).await?;
            print!("{}", status_table(&list.items, Timestamp::now(), all));
            Ok(ExitCode::SUCCESS)
        })
    }))
}

pub fn rollout(m: &ArgMatches) -> ExitCode {
    let Some((cmd, sub)) = m.subcommand() else { return finish(Err(Error::Usage("rollout: a subcommand is required".into()))) };
    let name = sub.get_one::<String>("name").cloned().unwrap_or_default();
    let ns = sub.get_one::<String>("namespace").cloned().unwrap_or_default();
    let cmd = cmd.to_string();
    let sub = sub.clone();
    finish(runtime().and_then(|rt| {
        rt.block_on(async move {
            let client = Client::try_default().await?;
            rollout_cmd(client, &cmd, &sub, &ns, &name).await
        })
    }))
}

/// `rollout SUBCOMMAND` against a client (tests pass a mock).
pub async fn rollout_cmd(client: Client, cmd: &str, sub: &ArgMatches, ns: &str, name: &str) -> Result<ExitCode, Error> {
    let api: Api<NodeAgent> = Api::namespaced(client.clone(), ns);
    match cmd {
        "status" => {
            let watch = sub.get_one::<bool>("watch").copied().unwrap_or(true);
            let deadline = sub.get_one::<u64>("timeout").map(|s| tokio::time::Instant::now() + Duration::from_secs(*s));
            let mut last = String::new();
            loop {
                let a = api.get(name).await?;
                let (line, outcome) = progress(&a);
                if line != last {
                    println!("{line}");
                    last = line;
                }
                match outcome {
                    Outcome::Complete => return Ok(ExitCode::SUCCESS),
                    Outcome::Halted => return Ok(ExitCode::FAILURE),
                    Outcome::Waiting if !watch => return Ok(ExitCode::from(3)),
                    Outcome::Waiting => {}
                }
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    return Err(Error::Usage(format!("rollout of {ns}/{name} not finished within --timeout")));
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        "history" => {
            let a = api.get(name).await?;
            let revs = revisions(&client, ns, name).await?;
            let current = a.status.as_ref().and_then(|s| s.update_revision.clone());
            print!("{}", history_table(&revs, current.as_deref()));
            Ok(ExitCode::SUCCESS)
        }
        "undo" => {
            let a = api.get(name).await?;
            let revs = revisions(&client, ns, name).await?;
            let update = super::rollout::template_hash(&a);
            let target = undo_target(&revs, &update, sub.get_one::<i64>("to-revision").copied()).map_err(Error::Usage)?;
            let template =
                revision_template(target).ok_or_else(|| Error::Usage(format!("revision {} holds no template", target.revision)))?;
            let patch: json_patch::Patch =
                serde_json::from_value(json!([{ "op": "replace", "path": "/spec/template", "value": template }]))
                    .map_err(|e| Error::Usage(e.to_string()))?;
            api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await?;
            println!("nodeagent.nodeagent.io/{name} rolled back to revision {}", target.revision);
            Ok(ExitCode::SUCCESS)
        }
        "pause" | "resume" => {
            let paused = cmd == "pause";
            api.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "rollout": { "paused": paused } } }))).await?;
            if !paused {
                // A halted rollout resumes too: the halt is forgotten.
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": { "haltedRevision": null } }))).await?;
            }
            println!("nodeagent.nodeagent.io/{name} {}", if paused { "paused" } else { "resumed" });
            Ok(ExitCode::SUCCESS)
        }
        other => Err(Error::Usage(format!("rollout: unknown subcommand {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::crd::{NodeAgentSpec, NodeAgentStatus};
    use crate::controller::rollout::revision_object;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn agent(status: NodeAgentStatus) -> NodeAgent {
        let mut a = NodeAgent::new("node-agent", NodeAgentSpec::default());
        a.metadata.namespace = Some("monitoring".into());
        a.metadata.generation = Some(2);
        a.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000).unwrap()));
        a.status = Some(status);
        a
    }

    fn status(updated: i32, desired: i32, current: &str, update: &str) -> NodeAgentStatus {
        NodeAgentStatus {
            observed_generation: Some(2),
            desired_number_scheduled: desired,
            current_number_scheduled: desired,
            number_ready: desired,
            updated_number_scheduled: updated,
            number_available: desired,
            current_revision: Some(current.into()),
            update_revision: Some(update.into()),
            ..Default::default()
        }
    }

    #[test]
    fn progress_reports_bar_wave_and_outcome() {
        let mut s = status(5, 20, "old", "new");
        s.current_wave = Some("canary".into());
        let (line, o) = progress(&agent(s));
        assert_eq!(o, Outcome::Waiting);
        assert_eq!(line, format!("[{}{}] 5/20 updated, 20 available, wave canary", "#".repeat(7), "-".repeat(23)));
        let (line, o) = progress(&agent(status(20, 20, "new", "new")));
        assert_eq!(o, Outcome::Complete, "{line}");
        let mut s = status(1, 20, "old", "new");
        s.conditions = vec![Condition {
            type_: "RolloutHalted".into(),
            status: "True".into(),
            message: "pod x on node a failed the health gate".into(),
            reason: "HealthGateFailed".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }];
        let (line, o) = progress(&agent(s));
        assert_eq!(o, Outcome::Halted);
        assert!(line.ends_with("rollout halted: pod x on node a failed the health gate"), "{line}");
        // A spec change the controller has not seen yet is not "complete".
        let mut s = status(20, 20, "new", "new");
        s.observed_generation = Some(1);
        assert_eq!(progress(&agent(s)).1, Outcome::Waiting);
    }

    #[test]
    fn status_table_is_kubectl_shaped() {
        let t = status_table(&[agent(status(3, 5, "old", "new"))], Timestamp::from_second(1_000 + 3 * 3600).unwrap(), false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "WAVE", "STATE", "AGE"]
        );
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["node-agent", "5", "5", "5", "3", "5", "-", "Rolling", "3h"]);
    }

    #[test]
    fn history_and_undo_pick_revisions() {
        let mut a = agent(NodeAgentStatus::default());
        let t = |img: &str| PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![Container { name: "a".into(), image: Some(img.into()), ..Default::default() }],
                ..Default::default()
            }),
        };
        a.spec.template = t("agent:3");
        let revs = vec![
            revision_object(&a, "h1", 1, &t("agent:1")),
            revision_object(&a, "h3", 3, &t("agent:3")),
            revision_object(&a, "h2", 2, &t("agent:2")),
        ];
        let h = history_table(&revs, Some("h3"));
        let rows: Vec<Vec<&str>> = h.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[1], ["1", "h1", "agent:1"]);
        assert_eq!(rows[3], ["3", "h3", "agent:3", "(current)"]);
        assert_eq!(undo_target(&revs, "h3", None).map(|r| r.revision), Ok(2));
        assert_eq!(undo_target(&revs, "h3", Some(1)).map(|r| r.revision), Ok(1));
        assert!(undo_target(&revs, "h3", Some(9)).unwrap_err().contains("no revision 9"));
        assert!(undo_target(&revs[1..2], "h3", None).is_err());
    }
}
