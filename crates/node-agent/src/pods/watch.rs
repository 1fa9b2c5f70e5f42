//! The pods of this node from the API server: a kube-rs watcher with the
//! field selector `spec.nodeName=<node>`, on a thread of its own (with its
//! own small runtime, so the scrape path never waits on it), feeding a
//! shared `PodIndex`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};

use super::index::{PodIndex, Reason};
use super::services::ServiceIndex;

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

fn lock<S>(index: &Mutex<S>) -> std::sync::MutexGuard<'_, S> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a watch fills: the pods of this node ([`PodIndex`]), or the
/// cluster's Services (`services::ServiceIndex`).
pub trait Store: Send + 'static {
    type Object: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static;
    /// What is watched, for the log: "pods", "services"; and what a list
    /// holds: "pods of this node".
    const WHAT: &'static str;
    const LISTED: &'static str;
    /// A full list begins (at start, or again after the watch expired).
    fn begin_list(&mut self);
    fn apply(&mut self, o: &Self::Object);
    fn delete(&mut self, o: &Self::Object, now: Instant);
    /// The full list is in: objects missing from it were deleted meanwhile.
    fn end_list(&mut self, now: Instant);
    /// Forgets what was deleted at least `grace` ago.
    fn expire(&mut self, now: Instant, grace: Duration);
    fn reason(&self) -> Reason;
    fn set_reason(&mut self, r: Reason, now: Instant);
    fn synced(&self) -> bool;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Store for PodIndex {
    type Object = Pod;
    const WHAT: &'static str = "pods";
    const LISTED: &'static str = "pods of this node";
    fn begin_list(&mut self) {
        PodIndex::begin_list(self);
    }
    fn apply(&mut self, o: &Pod) {
        PodIndex::apply(self, o);
    }
    fn delete(&mut self, o: &Pod, now: Instant) {
        PodIndex::delete(self, o, now);
    }
    fn end_list(&mut self, now: Instant) {
        PodIndex::end_list(self, now);
    }
    fn expire(&mut self, now: Instant, grace: Duration) {
        PodIndex::expire(self, now, grace);
    }
    fn reason(&self) -> Reason {
        PodIndex::reason(self)
    }
    fn set_reason(&mut self, r: Reason, now: Instant) {
        PodIndex::set_reason(self, r, now);
    }
    fn synced(&self) -> bool {
        self.synced
    }
    fn len(&self) -> usize {
        PodIndex::len(self)
    }
}

/// How the watch runs.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long a deleted pod is kept (`--collector.ebpf_pods.grace-period`).
    pub grace: Duration,
    /// How long a list may take before it is dropped and retried
    /// (`--collector.ebpf_pods.list-timeout`).
    pub list_timeout: Duration,
}

/// How often the watch forgets pods deleted more than the grace period ago
/// (and looks whether a failed watch has recovered).
const TICK: Duration = Duration::from_secs(1);

/// Retries after a failure wait 1 s, 2 s, 4 s, ... up to [`BACKOFF_MAX`]
/// (plus up to a quarter more, at random, so that the nodes of a cluster
/// spread out), and start at 1 s again only after [`BACKOFF_RESET`] with no
/// failure: a watch that fails right after each list (410 Gone every time)
/// re-lists once a minute, not every second.
const BACKOFF_BASE: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
const BACKOFF_RESET: Duration = Duration::from_secs(120);

/// A failed watch counts as recovered (logged, `synced` again) after this
/// long without a failure.
const RECOVERED_AFTER: Duration = Duration::from_secs(30);

/// The delay before the next retry. Pure.
#[derive(Debug, Default)]
pub struct Backoff {
    attempt: u32,
    last_failure: Option<Instant>,
}

impl Backoff {
    /// A failure at `now`: how long to wait before trying again.
    pub fn failed(&mut self, now: Instant) -> Duration {
        if self.last_failure.is_some_and(|t| now.saturating_duration_since(t) >= BACKOFF_RESET) {
            self.attempt = 0;
        }
        self.last_failure = Some(now);
        let d = BACKOFF_BASE.saturating_mul(1u32.checked_shl(self.attempt).unwrap_or(u32::MAX)).min(BACKOFF_MAX);
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// No failure for `RECOVERED_AFTER` (or ever).
    pub fn recovered(&self, now: Instant) -> bool {
        self.last_failure.is_none_or(|t| now.saturating_duration_since(t) >= RECOVERED_AFTER)
    }
}

/// The reason a watch error stands for.
pub fn classify(e: &watcher::Error) -> Reason {
    let client = match e {
        watcher::Error::InitialListFailed(c) => c,
        watcher::Error::WatchStartFailed(c) | watcher::Error::WatchFailed(c) => {
            return match c {
                kube::Error::Api(s) if s.code == 401 || s.code == 403 => Reason::Forbidden,
                c if super::bound::too_large(c).is_some() => Reason::TooLarge,
                _ => Reason::WatchFailed,
            };
        }
        watcher::Error::WatchError(s) if s.code == 410 => return Reason::Expired,
        watcher::Error::WatchError(s) if s.code == 401 || s.code == 403 => return Reason::Forbidden,
        watcher::Error::WatchError(_) => return Reason::WatchFailed,
        watcher::Error::NoResourceVersion => return Reason::ListFailed,
    };
    match client {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Reason::Forbidden,
        c if super::bound::too_large(c).is_some() => Reason::TooLarge,
        _ => Reason::ListFailed,
    }
}

/// What to log as the watch's state changes: a failure once per kind (not
/// per attempt), a recovery once it has lasted. Pure.
#[derive(Debug, Default)]
pub struct Logged {
    /// The failure last logged, until a recovery is logged.
    failure: Option<Reason>,
}

impl Logged {
    /// A failure: whether to log it.
    pub fn failure(&mut self, r: Reason) -> bool {
        let new = self.failure != Some(r);
        self.failure = Some(r);
        new
    }

    /// The watch healthy for a while: whether to log a recovery.
    pub fn recovered(&mut self) -> bool {
        self.failure.take().is_some()
    }
}

/// One failure: the reason, the log line (once per kind), the backoff.
fn failed<S: Store>(index: &Mutex<S>, logged: &mut Logged, backoff: &mut Backoff, node: &str, r: Reason, err: &str) -> Duration {
    lock(index).set_reason(r, Instant::now());
    let delay = backoff.failed(Instant::now());
    // Up to a quarter more, from the clock's nanoseconds.
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let delay = delay.mul_f64(1.0 + f64::from(ns % 1000) / 4000.0);
    if logged.failure(r) {
        tracing::warn!(node = %node, reason = r.label(), err = %err, retry_in = ?delay, "pod attribution: watching {} failed; retrying with backoff", S::WHAT);
    } else {
        tracing::debug!(what = S::WHAT, reason = r.label(), err = %err, retry_in = ?delay, "pod attribution: watch still failing");
    }
    delay
}

async fn client(source: Source) -> Option<Client> {
    let config = match source {
        Source::Kubeconfig(kc) => match Config::from_custom_kubeconfig(*kc, &KubeConfigOptions::default()).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(err = %e, "pod attribution: unusable kubeconfig; pods stay unnamed");
                return None;
            }
        },
        Source::InCluster(c) => *c,
    };
    // The watch loop retries with backoff of its own and says why in the
    // sync state; kube's retries of 429, 503 and 504 (15, up to minutes
    // apart) would hide an API server out of reach behind a load balancer
    // answering 503, and the pods it did not list would count as gone.
    let mut config = config;
    config.default_retry = false;
    match kube::client::ClientBuilder::try_from(config) {
        Ok(b) => Some(b.with_layer(&super::bound::Layer::default()).build()),
        Err(e) => {
            tracing::warn!(err = %e, "pod attribution: no Kubernetes client; pods stay unnamed");
            None
        }
    }
}

async fn run(source: Source, node: String, index: Arc<Mutex<PodIndex>>, services: Option<Arc<Mutex<ServiceIndex>>>, settings: Settings) {
    let Some(client) = client(source).await else { return };
    let pods = watch(
        Api::all(client.clone()),
        watcher::Config::default().fields(&format!("spec.nodeName={node}")).page_size(super::bound::LIST_PAGE),
        &node,
        index,
        settings,
    );
    match services {
        Some(s) => {
            let services = watch(Api::all(client), watcher::Config::default().page_size(super::bound::LIST_PAGE), &node, s, settings);
            tokio::join!(pods, services);
        }
        None => pods.await,
    }
}

/// Watches `api` into `index`, for ever: lists with a deadline, retries
/// with backoff, and keeps the store's reason.
async fn watch<S: Store>(api: Api<S::Object>, cfg: watcher::Config, node: &str, index: Arc<Mutex<S>>, settings: Settings) {
    let mut backoff = Backoff::default();
    let mut logged = Logged::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The stream (and any request in flight) goes before the wait.
        let mut stream = Box::pin(watcher::watcher(api.clone(), cfg.clone()));
        // When the list in progress began.
        let mut listing: Option<tokio::time::Instant> = None;
        let retry = loop {
            let deadline = listing.map(|t| t + settings.list_timeout);
            let next = async {
                match deadline {
                    Some(d) => tokio::time::timeout_at(d, stream.next()).await.ok(),
                    None => Some(stream.next().await),
                }
            };
            let ev = tokio::select! {
                ev = next => ev,
                _ = tick.tick() => {
                    let now = Instant::now();
                    let mut idx = lock(&index);
                    idx.expire(now, settings.grace);
                    if idx.synced() && listing.is_none() && backoff.recovered(now) {
                        idx.set_reason(Reason::Synced, now);
                        drop(idx);
                        if logged.recovered() {
                            tracing::info!(node = %node, "pod attribution: watching {} again", S::WHAT);
                        }
                    }
                    continue;
                }
            };
            match ev {
                // The list did not complete in time: start over.
                None => {
                    let err = format!("the {} list did not complete within {:?}", S::WHAT, settings.list_timeout);
                    break failed(&index, &mut logged, &mut backoff, node, Reason::ListTimeout, &err);
                }
                Some(None) => break failed(&index, &mut logged, &mut backoff, node, Reason::WatchFailed, "the watch ended"),
                Some(Some(Ok(ev))) => {
                    let mut idx = lock(&index);
                    match ev {
                        Event::Init => {
                            listing = Some(tokio::time::Instant::now());
                            idx.begin_list();
                            // A failure's reason stays until the list is in.
                            if !idx.reason().failed() {
                                idx.set_reason(Reason::Listing, Instant::now());
                            }
                        }
                        Event::InitApply(p) | Event::Apply(p) => idx.apply(&p),
                        Event::Delete(p) => idx.delete(&p, Instant::now()),
                        Event::InitDone => {
                            listing = None;
                            let first = !idx.synced();
                            idx.end_list(Instant::now());
                            if first {
                                tracing::info!(node = %node, count = idx.len(), "pod attribution: {} listed", S::LISTED);
                                logged.recovered();
                            }
                        }
                    }
                }
                Some(Some(Err(e))) => {
                    let r = classify(&e);
                    let delay = failed(&index, &mut logged, &mut backoff, node, r, &e.to_string());
                    // The watcher goes on from where it failed (a failed list
                    // lists again): a list in progress gets its whole time
                    // again after the wait, so the wait is not taken for a
                    // list that did not answer.
                    expire_while(&index, settings.grace, delay).await;
                    listing = listing.map(|_| tokio::time::Instant::now());
                }
            }
        };
        drop(stream);
        expire_while(&index, settings.grace, retry).await;
    }
}

/// Forgets expired pods while the watch waits out a backoff (the loop's
/// own tick runs only while it polls the watch).
async fn expire_while<S: Store>(index: &Mutex<S>, grace: Duration, wait: Duration) {
    let end = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep_until(end.min(tokio::time::Instant::now() + TICK)).await;
        lock(index).expire(Instant::now(), grace);
    }
}

/// Starts watching the pods of `node` into `index`, and the cluster's
/// Services into `services` when given, on one thread.
pub fn spawn(
    source: Source,
    node: String,
    index: Arc<Mutex<PodIndex>>,
    services: Option<Arc<Mutex<ServiceIndex>>>,
    settings: Settings,
) -> std::io::Result<Watch> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let thread = std::thread::Builder::new().name("pod-watch".into()).spawn(move || {
        rt.block_on(async move {
            tokio::select! {
                _ = rx => {}
                _ = run(source, node, index, services, settings) => {}
            }
        });
    })?;
    Ok(Watch { stop: Some(tx), thread: Some(thread) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn backoff_grows_to_a_minute_and_resets_only_after_two_quiet_minutes() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.recovered(t0));
        let delays: Vec<u64> = (0..9).map(|i| b.failed(t0 + Duration::from_secs(i)).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        // A failure after each list, a minute apart: no reset, no tight loop.
        assert_eq!(b.failed(t0 + Duration::from_secs(70)).as_secs(), 60);
        assert!(!b.recovered(t0 + Duration::from_secs(99)));
        assert!(b.recovered(t0 + Duration::from_secs(100)));
        assert_eq!(b.failed(t0 + Duration::from_secs(190)).as_secs(), 1);
    }

    #[test]
    fn one_log_line_per_kind_of_failure_until_recovered() {
        let mut l = Logged::default();
        assert!(!l.recovered(), "nothing to recover from");
        assert!(l.failure(Reason::Expired));
        assert!(!l.failure(Reason::Expired));
        assert!(!l.failure(Reason::Expired));
        assert!(l.failure(Reason::ListTimeout), "a new kind is logged");
        assert!(l.recovered());
        assert!(!l.recovered());
        assert!(l.failure(Reason::Expired));
    }

    #[test]
    fn errors_name_their_reason() {
        let status = |code: u16| Box::new(Status { code, ..Default::default() });
        assert_eq!(classify(&watcher::Error::WatchError(status(410))), Reason::Expired);
        assert_eq!(classify(&watcher::Error::WatchError(status(500))), Reason::WatchFailed);
        assert_eq!(classify(&watcher::Error::InitialListFailed(kube::Error::Api(status(403)))), Reason::Forbidden);
        assert_eq!(classify(&watcher::Error::WatchStartFailed(kube::Error::Api(status(401)))), Reason::Forbidden);
        assert_eq!(classify(&watcher::Error::InitialListFailed(kube::Error::Api(status(500)))), Reason::ListFailed);
        let long = std::io::Error::other(Box::new(super::super::bound::TooLarge::Line(8)) as Box<dyn std::error::Error + Send + Sync>);
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::ReadEvents(long))), Reason::TooLarge);
        let eof = std::io::Error::other("reset");
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::ReadEvents(eof))), Reason::WatchFailed);
        assert_eq!(classify(&watcher::Error::NoResourceVersion), Reason::ListFailed);
    }
}
