//! `node-agent rollout status|history|undo|pause|resume`: manage a
//! NodeAgent's rollout. Rendering is the controller crate's (pure); the API
//! calls are here, thin.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};
use controller::crd::NodeAgent;
use controller::report::{history_table, progress, undo_target, Outcome};
use controller::rollout::revision_template;
use controller::NAME_LABEL;
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{namespace_arg, Error};

pub fn command() -> Command {
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

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let Some((cmd, sub)) = m.subcommand() else { return Err(Error::Usage("rollout: a subcommand is required".into())) };
    let name = sub.get_one::<String>("name").cloned().unwrap_or_default();
    let ns = sub.get_one::<String>("namespace").cloned().unwrap_or_default();
    super::runtime()?.block_on(async move {
        let client = Client::try_default().await?;
        run_with(client, cmd, sub, &ns, &name).await
    })
}

async fn revisions(client: &Client, ns: &str, name: &str) -> Result<Vec<ControllerRevision>, Error> {
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}"))).await?.items)
}

/// `rollout SUBCOMMAND` against a client (tests pass a mock).
pub async fn run_with(client: Client, cmd: &str, sub: &ArgMatches, ns: &str, name: &str) -> Result<ExitCode, Error> {
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
                    return Err(Error::Failed(format!("rollout of {ns}/{name} not finished within --timeout")));
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
            let update = controller::rollout::template_hash(&a);
            let target = undo_target(&revs, &update, sub.get_one::<i64>("to-revision").copied()).map_err(Error::Failed)?;
            let template =
                revision_template(target).ok_or_else(|| Error::Failed(format!("revision {} holds no template", target.revision)))?;
            let patch: json_patch::Patch =
                serde_json::from_value(json!([{ "op": "replace", "path": "/spec/template", "value": template }]))
                    .map_err(|e| Error::Failed(e.to_string()))?;
            api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await?;
            println!("nodeagent.nodeagent.io/{name} rolled back to revision {}", target.revision);
            Ok(ExitCode::SUCCESS)
        }
        "pause" | "resume" => {
            let paused = cmd == "pause";
            api.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "rollout": { "paused": paused } } }))).await?;
            if !paused {
                resume(&api, name).await?;
            }
            println!("nodeagent.nodeagent.io/{name} {}", if paused { "paused" } else { "resumed" });
            Ok(ExitCode::SUCCESS)
        }
        other => Err(Error::Usage(format!("rollout: unknown subcommand {other}"))),
    }
}

/// Clears a halt at once (haltedRevision, and RolloutHalted False, so a
/// `rollout status` right after does not read the old halt) and stamps
/// `resumedAt`, from which the health gate's deadline counts again. The
/// patch is conditional on the version read, so a controller write in
/// between is read again, not overwritten; the controller's own status
/// writes are conditional the same way.
async fn resume(api: &Api<NodeAgent>, name: &str) -> Result<(), Error> {
    let mut tries = 0;
    loop {
        let a = api.get(name).await?;
        let patch = controller::report::resume_patch(&a, k8s_openapi::jiff::Timestamp::now());
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch)).await {
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 5 => tries += 1,
            r => return r.map(|_| ()).map_err(Error::from),
        }
    }
}
