//! `node-agent controller`: our own controller for per-node agents
//! (NodeAgent resources), built on the DaemonSet planner, with partition,
//! pause, waves, a health gate, halt and rollback.

pub mod crd;
pub mod events;
pub mod gate;
pub mod lease;
pub mod metrics;
pub mod migration;
pub mod reconcile;
pub mod report;
pub mod rollout;

use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, Controller, PredicateConfig, WatchStreamExt};
use kube::{Api, Client};

use crd::NodeAgent;
use reconcile::{error_policy, reconcile, Context};

/// Every pod and revision the controller makes carries this label (the
/// NodeAgent's name), so its informers watch only those.
pub const NAME_LABEL: &str = "nodeagent.io/name";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("--metrics-address {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("lost the leader Lease {0}: another replica may act now, so this one stops")]
    LeaseLost(String),
}

pub struct Options {
    /// Watch NodeAgents of this namespace only (None: all).
    pub namespace: Option<String>,
    pub metrics_address: SocketAddr,
    pub lease_namespace: String,
    pub lease_name: String,
    pub identity: String,
    pub lease_duration: Duration,
}

/// The part of a node that can change where agents run: labels, taints,
/// unschedulable, and condition statuses (not heartbeat times).
fn node_key(n: &Node) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    n.metadata.labels.hash(&mut h);
    if let Some(s) = &n.spec {
        s.unschedulable.hash(&mut h);
        for t in s.taints.iter().flatten() {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    for c in n.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten() {
        (&c.type_, &c.status).hash(&mut h);
    }
    Some(h.finish())
}

async fn serve_metrics(listener: tokio::net::TcpListener, metrics: Arc<metrics::Metrics>) {
    use hyper::service::service_fn;
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                let body = metrics.encode();
                async move {
                    hyper::Response::builder()
                        .header("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
                        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await;
        });
    }
}

/// Runs the controller until SIGTERM/SIGINT or a lost lease.
pub async fn run(client: Client, opts: Options) -> Result<(), Error> {
    run_until(client, opts, shutdown_signal()).await
}

/// Runs the controller until `shutdown` completes (then gives the lease up)
/// or the lease is lost (an error: the process should exit).
pub async fn run_until(
    client: Client,
    opts: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(metrics::Metrics::new());
    let listener =
        tokio::net::TcpListener::bind(opts.metrics_address).await.map_err(|e| Error::Listen(opts.metrics_address.to_string(), e))?;
    tokio::spawn(serve_metrics(listener, metrics.clone()));

    // Leader election: wait for the lease, then renew it in the background.
    let lock = Arc::new(lease::LeaseLock::new(
        Api::<Lease>::namespaced(client.clone(), &opts.lease_namespace),
        &opts.lease_name,
        &opts.identity,
        opts.lease_duration,
    ));
    let retry = opts.lease_duration / 3;
    let mut shutdown = Box::pin(shutdown);
    loop {
        match lock.try_acquire_or_renew(Timestamp::now()).await {
            Ok(true) => break,
            Ok(false) => {
                tracing::info!(lease = %opts.lease_name, identity = %opts.identity, "standing by: another replica holds the lease")
            }
            Err(e) => tracing::warn!(lease = %opts.lease_name, error = %e, "lease"),
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = &mut shutdown => return Ok(()),
        }
    }
    metrics.leader.set(1);
    tracing::info!(lease = %opts.lease_name, identity = %opts.identity, "leading");
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let renewer = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(retry).await;
                match lock.try_acquire_or_renew(Timestamp::now()).await {
                    Ok(true) => last_ok = tokio::time::Instant::now(),
                    Ok(false) => break,
                    Err(e) => tracing::warn!(error = %e, "renewing the lease"),
                }
                if last_ok.elapsed() >= lock.duration() {
                    break;
                }
            }
            let _ = lost_tx.send(());
        })
    };

    let agents: Api<NodeAgent> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let owned = watcher::Config::default().labels(NAME_LABEL);
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    let pods = watcher(Api::<Pod>::all(client.clone()), owned.clone()).default_backoff().reflect(pod_writer).touched_objects();
    let (rev_store, rev_writer) = reflector::store::<ControllerRevision>();
    let revs = watcher(Api::<ControllerRevision>::all(client.clone()), owned).default_backoff().reflect(rev_writer).touched_objects();
    let (node_store, node_writer) = reflector::store::<Node>();
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer)
        .touched_objects()
        .predicate_filter(node_key, PredicateConfig::default());

    let ctx = Arc::new(Context::new(client.clone(), node_store, pod_store, rev_store, Arc::new(gate::HttpProbe), metrics.clone()));
    let controller = Controller::new(agents, watcher::Config::default()).owns_stream(pods).owns_stream(revs);
    let store = controller.store();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<bool>();
    tokio::spawn(async move {
        let lost = tokio::select! {
            _ = lost_rx => true,
            _ = shutdown => false,
        };
        let _ = stop_tx.send(lost);
    });
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let mut lost = false;
    let run = controller
        .watches_stream(nodes, move |_node: Node| store.state().iter().map(|a| ObjectRef::from(a.as_ref())).collect::<Vec<_>>())
        .graceful_shutdown_on(async move {
            let _ = done_rx.await;
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller");
            }
        });
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => {}
        r = stop_rx => {
            lost = r.unwrap_or(false);
            let _ = done_tx.send(());
            run.await;
        }
    }
    renewer.abort();
    metrics.leader.set(0);
    if lost {
        return Err(Error::LeaseLost(opts.lease_name));
    }
    if let Err(e) = lock.release().await {
        tracing::warn!(error = %e, "releasing the lease");
    }
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::node_key;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use planner::builders::{at, node};

    #[test]
    fn node_triggers_ignore_heartbeats_but_not_labels_taints_or_conditions() {
        let with = |hb: i64, ready: &str| {
            let mut n = node("a", &[("zone", "x")], &[]);
            n.status = Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_heartbeat_time: Some(Time(at(hb))),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            n
        };
        let base = node_key(&with(1, "True"));
        assert_eq!(base, node_key(&with(2, "True")), "a heartbeat alone triggers nothing");
        assert_ne!(base, node_key(&with(1, "False")), "a condition flip does");
        let mut relabelled = with(1, "True");
        relabelled.metadata.labels = Some([("zone".to_string(), "y".to_string())].into());
        assert_ne!(base, node_key(&relabelled));
        let mut tainted = with(1, "True");
        tainted.spec = node("a", &[], &[("dedicated", Some("db"), "NoSchedule")]).spec;
        assert_ne!(base, node_key(&tainted));
    }
}
