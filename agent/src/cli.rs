//! The `node-agent` command line: `serve` (the default) and its flags.

use std::sync::Arc;
use std::time::Duration;

use clap::{ArgMatches, Command};

use crate::collector;
use crate::config;

/// The root command. With no subcommand it serves, taking serve's flags.
pub fn command() -> Command {
    let defs = collector::definitions();
    let root = Command::new("node-agent")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Node metrics compatible with node_exporter, kernel events through eBPF, and DaemonSet planning.")
        .args_conflicts_with_subcommands(true);
    let root = config::with_serve_args(root, &defs);
    root.subcommand(config::with_serve_args(Command::new("serve").about("Serve metrics (the default)."), &defs))
}

/// Errors of running a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] config::Error),
    #[error(transparent)]
    Server(#[from] crate::server::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs `serve` with the given matches until SIGTERM or SIGINT.
pub fn serve(m: &ArgMatches) -> Result<(), Error> {
    let defs = collector::definitions();
    let cfg = config::resolve(m, &defs)?;
    crate::logging::init(cfg.log_level, cfg.log_format);
    let names: Vec<&str> = cfg.collectors.iter().map(|(n, _)| *n).collect();
    tracing::info!(collectors = %names.join(","), procfs = %cfg.paths.procfs.display(), sysfs = %cfg.paths.sysfs.display(), rootfs = %cfg.paths.rootfs.display(), "starting node-agent");
    let scraper = Arc::new(crate::scrape::Scraper::new(cfg.collectors, cfg.exporter_metrics));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    rt.block_on(async move {
        let listeners = crate::server::bind(&cfg.listen).await?;
        for l in &listeners {
            if let Ok(a) = l.local_addr() {
                tracing::info!(address = %a, "listening");
            }
        }
        let state = Arc::new(crate::server::State {
            scraper,
            telemetry_path: cfg.telemetry_path,
            limit: (cfg.max_requests > 0).then(|| Arc::new(tokio::sync::Semaphore::new(cfg.max_requests))),
        });
        crate::server::serve(listeners, state, shutdown_signal(), Duration::from_secs(10)).await;
        Ok::<(), Error>(())
    })
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
