//! The agent runtime: resolve the serve flags, bind, build the collectors,
//! and serve on a runtime of its own until stopped.

use std::sync::Arc;
use std::time::Duration;

use clap::ArgMatches;

use crate::config;

/// Errors of running a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(transparent)]
    Server(#[from] crate::server::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    WebConfig(#[from] crate::webconfig::Error),
    #[error("--security.drop-capabilities: {0}")]
    DropCapabilities(#[from] crate::caps::DropError),
}

/// The scraper of the agent's collectors, with the exporter's own metrics
/// (`process_*`, build info) unless `--web.disable-exporter-metrics`.
pub fn scraper(collectors: Vec<host::Named>, exporter_metrics: bool) -> runtime::Scraper {
    let b = runtime::Scraper::builder(collectors);
    if exporter_metrics {
        b.own(Box::new(crate::process::ProcessMetrics::new())).build()
    } else {
        b.build()
    }
}

/// The agent's scraper, as its configuration says: each collector's
/// deadline (`--collector.timeout`) and the exporter's own metrics.
/// With the exporter's own metrics, the HTTP server's are served too
/// (`http`: its handler's and its connection admission's counts).
pub fn scraper_for(cfg: &mut config::ServeConfig, http: crate::httpstats::HttpMetrics) -> runtime::Scraper {
    let b = runtime::Scraper::builder(std::mem::take(&mut cfg.collectors)).timeouts(cfg.collector_timeout, runtime::DEFAULT_SLOW);
    if !cfg.exporter_metrics {
        return b.build();
    }
    let own = crate::process::ProcessMetrics::new();
    let own = if cfg.node_exporter_build_info { own } else { own.without_node_exporter_build_info() };
    b.own(Box::new(own)).own(Box::new(http)).build()
}

/// A running agent: its bound addresses, and a handle to stop it.
pub struct Agent {
    pub addrs: Vec<std::net::SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    /// Resolves the flags, binds every listen address and starts serving on
    /// a runtime of its own. Fails, naming the flag, on bad configuration.
    pub fn start(m: &ArgMatches) -> Result<Agent, Error> {
        // Logging first: building the collectors logs (eBPF programs down,
        // pod attribution off).
        let (level, format) = config::log_settings(m)?;
        crate::logging::init(level, format);
        // As Go programs do (node_exporter among them): the soft limit of open
        // files up to the hard one.
        let nofile = host::sys::raise_nofile_limit();
        // The flags first: a bad one fails here, before anything is loaded.
        let mut cfg = config::parse(m)?;
        // Then the runtime and the listeners, before anything slow is
        // loaded: a kubelet probes readiness as soon as the container runs,
        // and a probe that finds the port bound waits in its backlog for
        // the answer instead of failing (an `Unhealthy` event, and Ready
        // only a probe period later). A port in use fails here, at once.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.worker_threads)
            .max_blocking_threads(8)
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        let listeners = if cfg.systemd_socket {
            rt.block_on(async { crate::server::systemd_listeners() })?
        } else {
            rt.block_on(crate::server::bind(&cfg.listen))?
        };
        // Then the collectors: this loads and attaches the eBPF programs and
        // starts the pod watch, which need the capabilities the drop below
        // removes. The eBPF object takes only what the limit leaves beyond
        // a reserve and the fewest connections (crate::descriptors).
        cfg.collectors = config::build_collectors(m, &cfg.paths, nofile.map(crate::descriptors::Ceiling::bound))?;
        let names: Vec<&str> = cfg.collectors.iter().map(|(n, _)| *n).collect();
        tracing::info!(collectors = %names.join(","), procfs = %cfg.paths.procfs.display(), sysfs = %cfg.paths.sysfs.display(), rootfs = %cfg.paths.rootfs.display(), "starting node-agent");
        crate::caps::log_report(crate::caps::effective());
        if cfg.drop_capabilities {
            // The programs are attached and the watch started (above): keep
            // only what scrapes need.
            let before = crate::caps::effective();
            let keep = crate::caps::needed_after_start(before);
            crate::caps::restrict_all_threads(keep)?;
            tracing::info!(kept = format!("{keep:#x}"), dropped = format!("{:#x}", before & !keep), "capabilities dropped in every thread");
        }
        let web = match &cfg.web_config {
            Some(p) => crate::webconfig::Handle::open(p)?,
            None => crate::webconfig::Handle::none(),
        };
        let addrs: Vec<_> = listeners.iter().filter_map(|l| l.local_addr().ok()).collect();
        for a in &addrs {
            tracing::info!(address = %a, "listening");
        }
        if let Some(n) = nofile {
            share_descriptors(n, &mut cfg);
        }
        let admission = crate::admission::Admission::new(cfg.max_connections);
        let handler = Arc::new(crate::httpstats::HandlerStats::default());
        let http = crate::httpstats::HttpMetrics { handler: Arc::clone(&handler), admission: Arc::clone(&admission) };
        let scraper = Arc::new(scraper_for(&mut cfg, http));
        let state = Arc::new(crate::server::State {
            scraper,
            telemetry_path: cfg.telemetry_path,
            limit: (cfg.max_requests > 0).then(|| Arc::new(tokio::sync::Semaphore::new(cfg.max_requests))),
            web,
            admission,
            handler,
        });
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("node-agent-http".into())
            .spawn(move || {
                rt.block_on(crate::server::serve(
                    listeners,
                    state,
                    async move {
                        let _ = rx.await;
                    },
                    Duration::from_secs(10),
                ));
            })
            .map_err(Error::Runtime)?;
        Ok(Agent { addrs, stop: Some(tx), thread: Some(thread) })
    }

    /// Stops serving, letting in-flight requests finish.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Shares out what the open-file limit `nofile` leaves once the eBPF
/// object, the runtime and the listeners are up (counted now): connections
/// (`--web.max-connections` lowered to their share) and the proc and sys
/// files kept open between scrapes (`crate::descriptors::shares`).
fn share_descriptors(nofile: u64, cfg: &mut config::ServeConfig) {
    // Uncounted (no /proc/self/fd): a quarter of the limit, as the fixed
    // part of the limit was before the object was counted.
    let open = host::sys::open_fds().unwrap_or(usize::try_from(nofile / 4).unwrap_or(usize::MAX));
    let shares = crate::descriptors::shares(nofile, open, cfg.max_connections);
    if shares.connections < cfg.max_connections {
        tracing::warn!(
            max_connections = cfg.max_connections,
            nofile,
            open,
            used = shares.connections,
            "--web.max-connections above what the open-file limit leaves: lowered"
        );
        cfg.max_connections = shares.connections;
    }
    host::io::cap_kept(shares.kept);
    tracing::info!(nofile, open, connections = shares.connections, kept_files = shares.kept, "open-file limit shared out");
}

/// Runs `serve` with the given matches until SIGTERM or SIGINT.
pub fn serve(m: ArgMatches) -> Result<(), Error> {
    let agent = Agent::start(&m)?;
    // The agent holds what it read of its flags: the matches (a value or
    // a default for each of its flags, 230 kB measured with heaptrack)
    // would otherwise stay for its whole life.
    drop(m);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
    rt.block_on(shutdown_signal());
    tracing::info!("signal received, shutting down");
    agent.stop();
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
