//! `node-agent explain`: read a DaemonSet, the nodes, its pods and its
//! revisions from a live cluster, and say for each node without an agent
//! pod why not and what would fix it (the report is the planner's, pure).

use std::process::ExitCode;

use clap::{ArgMatches, Command};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::Client;
use planner::explain::{self as ex, Cluster};

use super::Error;

// The flags of `explain`.
#[derive(clap::Args)]
struct ExplainArgs {
    #[arg(long = "daemonset", value_name = "NAMESPACE/NAME", default_value = "monitoring/node-agent")]
    daemonset: String,
    #[arg(long = "node", value_name = "NAME", help = "Explain this node only.")]
    node: Option<String>,
}

pub fn command() -> Command {
    let cmd = Command::new("explain").about("Explain, against a live cluster, why nodes have no agent pod and what would fix it.");
    <ExplainArgs as clap::Args>::augment_args(cmd)
}

/// Everything `explain` reads, for its error when RBAC forbids a read.
pub const NEEDS: &str = "get on daemonsets.apps in the DaemonSet's namespace, list on nodes, list on pods and \
                         controllerrevisions.apps in that namespace, and get on priorityclasses.scheduling.k8s.io";

/// A read RBAC forbade, said with what `explain` needs (the agent's own
/// ServiceAccount, which `kubectl exec` runs it as, has only pod reads).
fn forbidden(what: &str) -> impl Fn(kube::Error) -> Error + '_ {
    move |e| match e {
        kube::Error::Api(s) if s.code == 403 => Error::Failed(format!(
            "explain may not {what}: {}\nexplain needs {NEEDS}; run it with your own kubeconfig, or bind those to the identity it runs as",
            s.message
        )),
        e => Error::Kube(e),
    }
}

/// Reads what the report needs from the cluster.
pub async fn read(client: Client, namespace: &str, name: &str) -> Result<Cluster, Error> {
    let daemonset: DaemonSet = Api::namespaced(client.clone(), namespace).get(name).await.map_err(forbidden("get the DaemonSet"))?;
    let nodes: Vec<Node> = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map_err(forbidden("list nodes"))?.items;
    let lp = ListParams::default().labels(&ex::selector_string(&daemonset));
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), namespace).list(&lp).await.map_err(forbidden("list pods"))?.items;
    let revisions: Vec<ControllerRevision> = Api::<ControllerRevision>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(forbidden("list controllerrevisions"))?
        .items;
    let priority_class_value = match ex::priority_class(&daemonset) {
        Some(pc) => Api::<PriorityClass>::all(client).get_opt(&pc).await.map_err(forbidden("get the PriorityClass"))?.map(|pc| pc.value),
        None => None,
    };
    Ok(Cluster { daemonset, nodes, pods, revisions, priority_class_value })
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let ExplainArgs { daemonset: target, node } = super::args(m)?;
    let Some((ns, name)) = target.split_once('/') else {
        return Err(Error::Usage(format!("--daemonset {target:?}: expected NAMESPACE/NAME")));
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::Usage(e.to_string()))?;
    let report = rt.block_on(async {
        let client = Client::try_default()
            .await
            .map_err(|e| Error::Failed(format!("no cluster (kubeconfig or in-cluster service account): {e}")))?;
        let cluster = read(client, ns, name).await?;
        ex::explain(&cluster, ns, name, node.as_deref(), Timestamp::now()).map_err(|e| Error::Failed(e.to_string()))
    })?;
    print!("{}", ex::render(&report));
    Ok(ExitCode::SUCCESS)
}
