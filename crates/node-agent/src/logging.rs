//! Log set-up: `--log.level` and `--log.format` (logfmt or json) to stderr.

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Logfmt,
    Json,
}

/// Installs the global subscriber; a second call is a no-op.
pub fn init(level: tracing::Level, format: Format) {
    let filter = tracing_subscriber::filter::LevelFilter::from_level(level);
    let res = match format {
        Format::Json => tracing_subscriber::fmt().json().with_max_level(filter).with_writer(std::io::stderr).try_init(),
        Format::Logfmt => {
            use tracing_subscriber::layer::SubscriberExt;
            let sub = tracing_subscriber::registry().with(filter).with(tracing_logfmt::builder().layer().with_writer(std::io::stderr));
            tracing::subscriber::set_global_default(sub).map_err(|e| e.into())
        }
    };
    let _ = res;
}
