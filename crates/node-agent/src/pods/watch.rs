//! The pods of this node from the API server: a kube-rs watcher with the
//! field selector `spec.nodeName=<node>`, on a thread of its own (with its
//! own small runtime, so the scrape path never waits on it), feeding a
//! shared `PodIndex`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};

use super::index::PodIndex;

/// Where the API server's address and credentials come from, found without
/// network I/O (so start-up can decide at once whether attribution is on).
pub enum Source {
    Kubeconfig(Box<Kubeconfig>),
    InCluster(Box<Config>),
}

/// The kubeconfig file given, or else a kubeconfig (`KUBECONFIG` or
/// `~/.kube/config`) first, then the pod's service account, as kube's
/// `Config::infer` does.
pub fn source(kubeconfig: Option<&std::path::Path>) -> Result<Source, String> {
    if let Some(path) = kubeconfig {
        return Kubeconfig::read_from(path)
            .map(|k| Source::Kubeconfig(Box::new(k)))
            .map_err(|e| format!("kubeconfig {}: {e}", path.display()));
    }
    match Kubeconfig::read() {
        Ok(kc) => Ok(Source::Kubeconfig(Box::new(kc))),
        Err(kc_err) => match Config::incluster() {
            Ok(c) => Ok(Source::InCluster(Box::new(c))),
            Err(e) => Err(format!("no kubeconfig ({kc_err}) and not in a cluster ({e})")),
        },
    }
}

/// The running watch; dropping it stops the thread.
pub struct Watch {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(index: &Mutex<PodIndex>) -> std::sync::MutexGuard<'_, PodIndex> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

async fn run(source: Source, node: String, index: Arc<Mutex<PodIndex>>) {
    let config = match source {
        Source::Kubeconfig(kc) => match Config::from_custom_kubeconfig(*kc, &KubeConfigOptions::default()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(err = %e, "pod attribution: unusable kubeconfig; pods stay unnamed");
                return;
            }
        },
        Source::InCluster(c) => *c,
    };
    let client = match Client::try_from(config) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(err = %e, "pod attribution: no Kubernetes client; pods stay unnamed");
            return;
        }
    };
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let mut failing = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                // Init comes before the list is even tried: not a recovery yet.
                if failing && !matches!(ev, Event::Init) {
                    tracing::info!(node = %node, "pod attribution: watching pods again");
                    failing = false;
                }
                let mut idx = lock(&index);
                match ev {
                    Event::Init => idx.begin_list(),
                    Event::InitApply(p) | Event::Apply(p) => idx.apply(&p),
                    Event::Delete(p) => idx.delete(&p, Instant::now()),
                    Event::InitDone => {
                        let first = !idx.synced;
                        idx.end_list(Instant::now());
                        if first {
                            tracing::info!(node = %node, pods = idx.len(), "pod attribution: pods of this node listed");
                        }
                    }
                }
            }
            Err(e) if !failing => {
                tracing::warn!(node = %node, err = %e, "pod attribution: watching pods failed; retrying with backoff");
                failing = true;
            }
            Err(e) => tracing::debug!(err = %e, "pod attribution: watch still failing"),
        }
    }
}

/// Starts watching the pods of `node` into `index`.
pub fn spawn(source: Source, node: String, index: Arc<Mutex<PodIndex>>) -> std::io::Result<Watch> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let thread = std::thread::Builder::new().name("pod-watch".into()).spawn(move || {
        rt.block_on(async move {
            tokio::select! {
                _ = rx => {}
                _ = run(source, node, index) => {}
            }
        });
    })?;
    Ok(Watch { stop: Some(tx), thread: Some(thread) })
}
