//! The flags of `serve`, compatible with node_exporter's: the web and log
//! flags, the host's (`--path.*`, every collector's `--collector.<name>` /
//! `--no-collector.<name>` and its own flags, from the registries, so the
//! flag set cannot drift from the code) and the eBPF ones.

use clap::{Arg, ArgMatches};
use host::flags::{self, Flags};
use host::{registry, ConfigError, Named, Paths};

use crate::logging::Format as LogFormat;

/// Everything `serve` needs, resolved from flags.
pub struct ServeConfig {
    pub listen: Vec<String>,
    pub telemetry_path: String,
    pub max_requests: usize,
    /// `--web.config.file`: TLS and basic auth (exporter-toolkit format).
    pub web_config: Option<std::path::PathBuf>,
    pub exporter_metrics: bool,
    pub paths: Paths,
    /// Enabled collectors, built: the host's, then the eBPF probes.
    pub collectors: Vec<Named>,
    pub log_level: tracing::Level,
    pub log_format: LogFormat,
    /// `--security.drop-capabilities`.
    pub drop_capabilities: bool,
}

/// A bad flag value, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Collector(#[from] ConfigError),
    #[error("--{flag}: {msg}")]
    Invalid { flag: &'static str, msg: String },
}

/// The port node-agent serves on, as node_exporter (`--web.listen-address` default).
pub const DEFAULT_PORT: u16 = 9100;

/// The flags of `serve` (also accepted with no subcommand).
pub fn serve_args() -> Vec<Arg> {
    let mut v = vec![
        Arg::new("web.listen-address")
            .long("web.listen-address")
            .value_name("ADDR")
            .action(clap::ArgAction::Append)
            .help("Addresses on which to expose metrics and web interface; repeatable. [default: :9100]"),
        flags::string_arg("web.telemetry-path", "/metrics", "Path under which to expose metrics."),
        flags::string_arg("web.max-requests", "40", "Maximum number of parallel scrape requests; 0 disables the limit."),
        flags::string_arg(
            "web.config.file",
            "",
            "Path to a configuration file that enables TLS or authentication (Prometheus exporter-toolkit format).",
        ),
        flags::string_arg("log.level", "info", "Only log messages with the given severity or above: debug, info, warn, error."),
        flags::string_arg("log.format", "logfmt", "Output format of log messages: logfmt or json."),
    ];
    v.extend(registry::path_args());
    v.extend(flags::bool_args(
        "web.disable-exporter-metrics",
        false,
        "Exclude metrics about the exporter itself (process_*, node_agent_build_info).",
    ));
    v.extend(registry::disable_defaults_args());
    v.extend(flags::bool_args(
        "security.drop-capabilities",
        false,
        "Once the eBPF programs are attached, drop every capability but BPF, SYS_PTRACE and DAC_READ_SEARCH, in every thread.",
    ));
    v.extend(flags::bool_args(
        "ebpf.bpf-stats",
        false,
        "Enable the kernel's BPF run-time statistics while running, for node_ebpf_program_run_seconds_total and node_ebpf_program_runs_total.",
    ));
    v.extend(registry::collector_args(&registry::definitions()));
    v.extend(registry::collector_args(&crate::probes::definitions()));
    v
}

/// `--log.level` and `--log.format`, needed before anything else logs.
pub fn log_settings(m: &ArgMatches) -> Result<(tracing::Level, LogFormat), Error> {
    let f = Flags::new(m);
    let lvl = f.string("log.level");
    let log_level = match lvl.as_str() {
        "debug" => tracing::Level::DEBUG,
        "info" => tracing::Level::INFO,
        "warn" => tracing::Level::WARN,
        "error" => tracing::Level::ERROR,
        _ => return Err(Error::Invalid { flag: "log.level", msg: format!("unknown level {lvl:?} (debug, info, warn, error)") }),
    };
    let fmt = f.string("log.format");
    let log_format = match fmt.as_str() {
        "logfmt" => LogFormat::Logfmt,
        "json" => LogFormat::Json,
        _ => return Err(Error::Invalid { flag: "log.format", msg: format!("unknown format {fmt:?} (logfmt, json)") }),
    };
    Ok((log_level, log_format))
}

/// Resolves flags into a configuration, building the enabled collectors.
pub fn resolve(m: &ArgMatches) -> Result<ServeConfig, Error> {
    let f = Flags::new(m);
    let paths = registry::paths(&f);
    let max = f.string("web.max-requests");
    let max_requests = max.parse().map_err(|_| Error::Invalid { flag: "web.max-requests", msg: format!("not a number: {max:?}") })?;
    let telemetry_path = f.string("web.telemetry-path");
    if !telemetry_path.starts_with('/') {
        return Err(Error::Invalid { flag: "web.telemetry-path", msg: "must start with /".into() });
    }
    let (log_level, log_format) = log_settings(m)?;
    let mut listen = f.strings("web.listen-address");
    if listen.is_empty() {
        listen.push(format!(":{DEFAULT_PORT}"));
    }
    for l in &listen {
        parse_listen(l).map_err(|msg| Error::Invalid { flag: "web.listen-address", msg })?;
    }
    let mut collectors = registry::build(&f, &paths, &registry::definitions(), &mut ())?;
    let probes = crate::probes::definitions();
    let mut ctx = crate::probes::Context::new(&f, &paths, &probes)?;
    collectors.extend(registry::build(&f, &paths, &probes, &mut ctx)?);
    Ok(ServeConfig {
        listen,
        telemetry_path,
        max_requests,
        web_config: Some(f.string("web.config.file")).filter(|s| !s.is_empty()).map(std::path::PathBuf::from),
        exporter_metrics: !f.bool("web.disable-exporter-metrics", false),
        paths,
        collectors,
        log_level,
        log_format,
        drop_capabilities: f.bool("security.drop-capabilities", false),
    })
}

/// Parses a Go-style listen address (`:9100`, `127.0.0.1:9100`, `[::1]:9100`)
/// into the socket addresses to bind. A bare port binds every interface.
pub fn parse_listen(s: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("invalid port in {s:?}"))?;
        return Ok(vec![std::net::SocketAddr::from(([0u8; 16], port))]);
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = s.to_socket_addrs().map_err(|e| format!("invalid address {s:?}: {e}"))?.collect();
    if addrs.is_empty() {
        return Err(format!("address {s:?} resolves to nothing"));
    }
    Ok(addrs)
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("telemetry_path", &self.telemetry_path)
            .field("collectors", &self.collectors.iter().map(|(n, _)| *n).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn resolve_args(args: &[&str]) -> Result<ServeConfig, String> {
        let m = crate::cmd::command().no_binary_name(true).try_get_matches_from(args).map_err(|e| e.to_string())?;
        resolve(&m).map_err(|e| e.to_string())
    }

    fn names(c: &ServeConfig) -> Vec<&str> {
        c.collectors.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn defaults_and_toggles() {
        let c = resolve_args(&["--no-collector.ebpf_pods"]).unwrap();
        assert!(names(&c).contains(&"cpu"));
        assert_eq!(c.listen, vec![":9100"]);
        let c = resolve_args(&["--no-collector.cpu", "--collector.disable-defaults", "--collector.meminfo"]).unwrap();
        assert_eq!(names(&c), vec!["meminfo"]);
        // Last one wins, as with kingpin.
        let c = resolve_args(&["--collector.disable-defaults", "--collector.cpu", "--no-collector.cpu", "--collector.loadavg"]).unwrap();
        assert_eq!(names(&c), vec!["loadavg"]);
    }

    #[test]
    fn both_value_forms() {
        let c = resolve_args(&[
            "--collector.disable-defaults",
            "--web.listen-address=127.0.0.1:1",
            "--web.listen-address",
            "[::1]:2",
            "--path.procfs",
            "/x",
        ])
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.paths.procfs, PathBuf::from("/x"));
    }

    #[test]
    fn bad_flags_name_themselves() {
        let e = resolve_args(&["--collector.nope"]).unwrap_err();
        assert!(e.contains("--collector.nope"), "{e}");
        let e = resolve_args(&["--collector.disable-defaults", "--collector.vmstat", "--collector.vmstat.fields=(("]).unwrap_err();
        assert!(e.contains("--collector.vmstat.fields"), "{e}");
        let e = resolve_args(&["--web.max-requests=x"]).unwrap_err();
        assert!(e.contains("--web.max-requests"), "{e}");
        let e = resolve_args(&["--web.listen-address=:99999"]).unwrap_err();
        assert!(e.contains("--web.listen-address"), "{e}");
        let e = resolve_args(&["--log.level=loud"]).unwrap_err();
        assert!(e.contains("--log.level"), "{e}");
    }
}
