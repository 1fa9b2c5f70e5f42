//! `node-agent rollout status|history|undo|pause|resume`: manage a
//! NodeAgent's rollout. Rendering is the controller crate's (pure); the API
//! calls are here, thin.

use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, ArgMatches, Command};
use controller::crd::NodeAgent;
use controller::report::{history_table, progress, undo_target, Outcome};
use controller::rollout::revision_template;
use controller::NAME_LABEL;
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::{Error, NamespaceArg};

// NAME and `--namespace`, which every rollout subcommand takes.
#[derive(clap::Args)]
struct Target {
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    namespace: NamespaceArg,
}

// The flags of `rollout status` besides the target (value name `watch`:
// derive's default is `WATCH`).
#[derive(clap::Args)]
struct StatusArgs {
    #[arg(long = "watch", short = 'w', value_name = "watch", action = ArgAction::Set, default_value = "true")]
    watch: bool,
    #[arg(long = "timeout", value_name = "SECONDS")]
    timeout: Option<u64>,
}

// The flags of `rollout undo` besides the target.
#[derive(clap::Args)]
struct UndoArgs {
    #[arg(long = "to-revision", value_name = "N")]
    to_revision: Option<i64>,
}

pub fn command() -> Command {
    let sub = |name: &'static str, about: &'static str| <Target as clap::Args>::augment_args(Command::new(name).about(about));
    Command::new("rollout")
        .about("Manage a NodeAgent's rollout.")
        .subcommand_required(true)
        .subcommand(<StatusArgs as clap::Args>::augment_args(sub(
            "status",
            "Follow the rollout until it completes (exit 0) or halts (exit 1).",
        )))
        .subcommand(sub("history", "List the recorded revisions."))
        .subcommand(<UndoArgs as clap::Args>::augment_args(sub(
            "undo",
            "Put the template of an earlier revision back (default: the previous one).",
        )))
        .subcommand(sub("pause", "Stop replacing pods."))
        .subcommand(sub("resume", "Resume a paused or halted rollout."))
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let Some((cmd, sub)) = m.subcommand() else { return Err(Error::Usage("rollout: a subcommand is required".into())) };
    let Target { name, namespace: NamespaceArg { namespace: ns } } = super::args(sub)?;
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
            let StatusArgs { watch, timeout } = super::args(sub)?;
            let deadline = timeout.map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
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
            let UndoArgs { to_revision } = super::args(sub)?;
            let a = api.get(name).await?;
            let revs = revisions(&client, ns, name).await?;
            let update = controller::rollout::template_hash(&a);
            let target = undo_target(&revs, &update, to_revision).map_err(Error::Failed)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(args: &[&str]) -> ArgMatches {
        let m = command().no_binary_name(true).try_get_matches_from(args).unwrap();
        m.subcommand().unwrap().1.clone()
    }

    #[test]
    fn every_subcommand_reads_its_target_and_flags() {
        let sub = matches(&["status", "a", "-n", "ns", "--watch", "false", "--timeout", "5"]);
        let t: Target = super::super::args(&sub).unwrap();
        assert_eq!((t.name.as_str(), t.namespace.namespace.as_str()), ("a", "ns"));
        let s: StatusArgs = super::super::args(&sub).unwrap();
        assert_eq!((s.watch, s.timeout), (false, Some(5)));
        let s: StatusArgs = super::super::args(&matches(&["status", "a"])).unwrap();
        assert_eq!((s.watch, s.timeout), (true, None));
        let u: UndoArgs = super::super::args(&matches(&["undo", "a", "--to-revision", "3"])).unwrap();
        assert_eq!(u.to_revision, Some(3));
        for cmd in ["history", "undo", "pause", "resume"] {
            let t: Target = super::super::args(&matches(&[cmd, "b"])).unwrap();
            assert_eq!((t.name.as_str(), t.namespace.namespace.as_str()), ("b", "monitoring"), "{cmd}");
        }
    }
}
