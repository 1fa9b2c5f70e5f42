//! Command-line flags, compatible with node_exporter's: every collector's
//! `--collector.<name>` / `--no-collector.<name>` and its own flags come from
//! the collector registry, so the flag set cannot drift from the code.

use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::collector::{self, util, ConfigError, Definition, Paths};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Logfmt,
    Json,
}

/// Everything `serve` needs, resolved from flags.
pub struct ServeConfig {
    pub listen: Vec<String>,
    pub telemetry_path: String,
    pub max_requests: usize,
    /// `--web.config.file`: TLS and basic auth (exporter-toolkit format).
    pub web_config: Option<std::path::PathBuf>,
    pub exporter_metrics: bool,
    pub paths: Paths,
    /// Enabled collectors, built.
    pub collectors: Vec<(&'static str, Box<dyn collector::Collector>)>,
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
pub fn serve_args(defs: &[Definition]) -> Vec<Arg> {
    let mut v = vec![
        Arg::new("web.listen-address")
            .long("web.listen-address")
            .value_name("ADDR")
            .action(ArgAction::Append)
            .help("Addresses on which to expose metrics and web interface; repeatable. [default: :9100]"),
        util::string_arg("web.telemetry-path", "/metrics", "Path under which to expose metrics."),
        util::string_arg("web.max-requests", "40", "Maximum number of parallel scrape requests; 0 disables the limit."),
        util::string_arg(
            "web.config.file",
            "",
            "Path to a configuration file that enables TLS or authentication (Prometheus exporter-toolkit format).",
        ),
        util::string_arg("path.procfs", "/proc", "procfs mountpoint."),
        util::string_arg("path.sysfs", "/sys", "sysfs mountpoint."),
        util::string_arg("path.rootfs", "/", "rootfs mountpoint."),
        util::string_arg("path.udev.data", "/run/udev/data", "udev data path."),
        util::string_arg("log.level", "info", "Only log messages with the given severity or above: debug, info, warn, error."),
        util::string_arg("log.format", "logfmt", "Output format of log messages: logfmt or json."),
    ];
    v.extend(util::bool_args(
        "web.disable-exporter-metrics",
        false,
        "Exclude metrics about the exporter itself (process_*, node_agent_build_info).",
    ));
    v.extend(util::bool_args("collector.disable-defaults", false, "Set all collectors to disabled by default."));
    v.extend(util::bool_args(
        "security.drop-capabilities",
        false,
        "Once the eBPF programs are attached, drop every capability but BPF, SYS_PTRACE and DAC_READ_SEARCH, in every thread.",
    ));
    v.extend(util::bool_args("ebpf.bpf-stats", false, "Enable the kernel's BPF run-time statistics while running, for node_ebpf_program_run_seconds_total and node_ebpf_program_runs_total."));
    for d in defs {
        let enable: &'static str = Box::leak(format!("collector.{}", d.name).into_boxed_str());
        let help: &'static str = Box::leak(format!("Enable the {} collector", d.name).into_boxed_str());
        v.extend(util::bool_args(enable, d.enabled_by_default, help));
        v.extend((d.args)());
    }
    v
}

/// Adds the serve flags to a command.
pub fn with_serve_args(cmd: Command, defs: &[Definition]) -> Command {
    cmd.args(serve_args(defs))
}

fn path(m: &ArgMatches, name: &str) -> PathBuf {
    PathBuf::from(util::string_flag(m, name))
}

/// `--log.level` and `--log.format`, needed before anything else logs.
pub fn log_settings(m: &ArgMatches) -> Result<(tracing::Level, LogFormat), Error> {
    let lvl = util::string_flag(m, "log.level");
    let log_level = match lvl.as_str() {
        "debug" => tracing::Level::DEBUG,
        "info" => tracing::Level::INFO,
        "warn" => tracing::Level::WARN,
        "error" => tracing::Level::ERROR,
        _ => return Err(Error::Invalid { flag: "log.level", msg: format!("unknown level {lvl:?} (debug, info, warn, error)") }),
    };
    let fmt = util::string_flag(m, "log.format");
    let log_format = match fmt.as_str() {
        "logfmt" => LogFormat::Logfmt,
        "json" => LogFormat::Json,
        _ => return Err(Error::Invalid { flag: "log.format", msg: format!("unknown format {fmt:?} (logfmt, json)") }),
    };
    Ok((log_level, log_format))
}

/// Resolves flags into a configuration, building the enabled collectors.
pub fn resolve(m: &ArgMatches, defs: &[Definition]) -> Result<ServeConfig, Error> {
    let paths = Paths {
        procfs: path(m, "path.procfs"),
        sysfs: path(m, "path.sysfs"),
        rootfs: path(m, "path.rootfs"),
        udev_data: path(m, "path.udev.data"),
    };
    let max = util::string_flag(m, "web.max-requests");
    let max_requests = max.parse().map_err(|_| Error::Invalid { flag: "web.max-requests", msg: format!("not a number: {max:?}") })?;
    let telemetry_path = util::string_flag(m, "web.telemetry-path");
    if !telemetry_path.starts_with('/') {
        return Err(Error::Invalid { flag: "web.telemetry-path", msg: "must start with /".into() });
    }
    let (log_level, log_format) = log_settings(m)?;
    let listen: Vec<String> = m
        .try_get_many::<String>("web.listen-address")
        .ok()
        .flatten()
        .map(|v| v.cloned().collect())
        .unwrap_or_else(|| vec![format!(":{DEFAULT_PORT}")]);
    for l in &listen {
        parse_listen(l).map_err(|msg| Error::Invalid { flag: "web.listen-address", msg })?;
    }
    let defaults_off = util::bool_flag(m, "collector.disable-defaults", false);
    let mut collectors = Vec::new();
    let mut ctx = collector::BuildContext::default();
    ctx.bpf_stats = util::bool_flag(m, "ebpf.bpf-stats", false);
    // Pod attribution changes how the eBPF programs load: decide it first.
    if defs.iter().any(|d| d.name == "ebpf_pods" && util::bool_flag(m, "collector.ebpf_pods", d.enabled_by_default && !defaults_off)) {
        collector::ebpf_pods::prepare(m, &paths, &mut ctx)?;
    }
    for d in defs {
        let default = d.enabled_by_default && !defaults_off;
        if util::bool_flag(m, &format!("collector.{}", d.name), default) {
            collectors.push((d.name, (d.build)(m, &paths, &mut ctx)?));
        }
    }
    Ok(ServeConfig {
        listen,
        telemetry_path,
        max_requests,
        web_config: Some(util::string_flag(m, "web.config.file")).filter(|s| !s.is_empty()).map(std::path::PathBuf::from),
        exporter_metrics: !util::bool_flag(m, "web.disable-exporter-metrics", false),
        paths,
        collectors,
        log_level,
        log_format,
        drop_capabilities: util::bool_flag(m, "security.drop-capabilities", false),
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

    fn cmd() -> Command {
        with_serve_args(Command::new("t").no_binary_name(true), &collector::definitions())
    }

    fn resolve_args(args: &[&str]) -> Result<ServeConfig, String> {
        let m = cmd().try_get_matches_from(args).map_err(|e| e.to_string())?;
        resolve(&m, &collector::definitions()).map_err(|e| e.to_string())
    }

    fn names(c: &ServeConfig) -> Vec<&str> {
        c.collectors.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn defaults_and_toggles() {
        let c = resolve_args(&[]).unwrap();
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
        let c = resolve_args(&["--web.listen-address=127.0.0.1:1", "--web.listen-address", "[::1]:2", "--path.procfs", "/x"]).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.paths.procfs, PathBuf::from("/x"));
    }

    #[test]
    fn bad_flags_name_themselves() {
        let e = resolve_args(&["--collector.nope"]).unwrap_err();
        assert!(e.contains("--collector.nope"), "{e}");
        let e = resolve_args(&["--collector.vmstat.fields=(("]).unwrap_err();
        assert!(e.contains("--collector.vmstat.fields"), "{e}");
        let e = resolve_args(&["--web.max-requests=x"]).unwrap_err();
        assert!(e.contains("--web.max-requests"), "{e}");
        let e = resolve_args(&["--web.listen-address=:99999"]).unwrap_err();
        assert!(e.contains("--web.listen-address"), "{e}");
        let e = resolve_args(&["--log.level=loud"]).unwrap_err();
        assert!(e.contains("--log.level"), "{e}");
    }
}
