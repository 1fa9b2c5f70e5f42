//! The flags of `serve`, compatible with node_exporter's: the web and log
//! flags, the host's (`--path.*`, every collector's `--collector.<name>` /
//! `--no-collector.<name>` and its own flags, from the registries, so the
//! flag set cannot drift from the code) and the eBPF ones.

use clap::{Arg, ArgMatches};
use host::flags::{self, BoolFlag, DurationFlag, Flag, Flags, Hidden, IntFlag, ParsedFlag, StringFlag, StringsFlag};
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
    /// `--collector.timeout`: each collector's deadline in a scrape.
    pub collector_timeout: std::time::Duration,
    /// `--web.max-connections`.
    pub max_connections: usize,
    /// `--compat.node-exporter-build-info`.
    pub node_exporter_build_info: bool,
    /// `--runtime.gomaxprocs`: the async runtime's worker threads.
    pub worker_threads: usize,
    /// `--web.systemd-socket`: serve on the sockets systemd passes.
    pub systemd_socket: bool,
}

/// A bad flag value, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Flag(#[from] ConfigError),
}

/// The port node-agent serves on, as node_exporter (`--web.listen-address` default).
pub const DEFAULT_PORT: u16 = 9100;

// The serve flags, in `--help`'s order (the host's paths and
// `--collector.disable-defaults` come from `host::registry`).

/// Its default listens on [`DEFAULT_PORT`] (a test checks they agree).
pub const LISTEN_ADDRESS: StringsFlag = StringsFlag {
    name: "web.listen-address",
    value_name: "ADDR",
    default: &[":9100"],
    help: "Addresses on which to expose metrics and web interface; repeatable.",
};
pub const TELEMETRY_PATH: StringFlag =
    StringFlag { name: "web.telemetry-path", default: "/metrics", help: "Path under which to expose metrics." };
pub const MAX_REQUESTS: ParsedFlag<i64> = ParsedFlag {
    name: "web.max-requests",
    value_name: "VALUE",
    default: "40",
    env: None,
    help: "Maximum number of parallel scrape requests; 0 disables the limit.",
    parse: flags::parse_kingpin_int,
};
pub const MAX_CONNECTIONS: IntFlag<usize> = IntFlag {
    name: "web.max-connections",
    default: 1024,
    help: "Maximum number of open connections (node-agent's own flag); at it, an idle connection (or one whose request waits for its password check) of the peer holding the most is closed to make room, or a new one refused when every connection is busy (one peer holds at most a quarter). Lowered to two thirds of what the open-file limit leaves after start-up.",
};
pub const WEB_CONFIG_FILE: StringFlag = StringFlag {
    name: "web.config.file",
    default: "",
    help: "Path to a configuration file that enables TLS or authentication (Prometheus exporter-toolkit format).",
};
pub const LOG_LEVEL: ParsedFlag<tracing::Level> = ParsedFlag {
    name: "log.level",
    value_name: "VALUE",
    default: "info",
    env: None,
    help: "Only log messages with the given severity or above: debug, info, warn, error.",
    parse: |s| match s {
        "debug" => Ok(tracing::Level::DEBUG),
        "info" => Ok(tracing::Level::INFO),
        "warn" => Ok(tracing::Level::WARN),
        "error" => Ok(tracing::Level::ERROR),
        _ => Err(format!("unknown level {s:?} (debug, info, warn, error)")),
    },
};
pub const LOG_FORMAT: ParsedFlag<LogFormat> = ParsedFlag {
    name: "log.format",
    value_name: "VALUE",
    default: "logfmt",
    env: None,
    help: "Output format of log messages: logfmt or json.",
    parse: |s| match s {
        "logfmt" => Ok(LogFormat::Logfmt),
        "json" => Ok(LogFormat::Json),
        _ => Err(format!("unknown format {s:?} (logfmt, json)")),
    },
};
pub const NODE_EXPORTER_BUILD_INFO: BoolFlag = BoolFlag {
    name: "compat.node-exporter-build-info",
    default: true,
    help: "Also serve node_exporter_build_info (its labels say node-agent: version=\"node-agent-VERSION\", tags=\"node-agent\"), which node-mixin's dashboards list instances by (node-agent's own flag).",
};
pub const DISABLE_EXPORTER_METRICS: BoolFlag = BoolFlag {
    name: "web.disable-exporter-metrics",
    default: false,
    help: "Exclude metrics about the exporter itself (process_*, promhttp_metric_handler_*, node_agent_*, node_exporter_build_info).",
};
pub const COLLECTOR_TIMEOUT: DurationFlag = DurationFlag {
    name: "collector.timeout",
    default: "8s",
    help: "Deadline of one collector in a scrape (node-agent's own flag): a collector that overruns it reports success 0, the scrape answers without it, and later scrapes skip it until it returns. A Prometheus scrape timeout (X-Prometheus-Scrape-Timeout-Seconds) shortens it.",
};
pub const DROP_CAPABILITIES: BoolFlag = BoolFlag {
    name: "security.drop-capabilities",
    default: false,
    help: "Once the eBPF programs are attached, drop every capability but BPF, SYS_PTRACE and DAC_READ_SEARCH, in every thread.",
};
pub const GOMAXPROCS: ParsedFlag<i64> = ParsedFlag {
    name: "runtime.gomaxprocs",
    value_name: "N",
    default: "1",
    env: Some("GOMAXPROCS"),
    help: "The target number of CPUs the agent's async runtime uses (its worker threads, as node_exporter's GOMAXPROCS); 0 or less: one per CPU.",
    parse: flags::parse_kingpin_int,
};
pub const SYSTEMD_SOCKET: BoolFlag = BoolFlag {
    name: "web.systemd-socket",
    default: false,
    help: "Use systemd socket activation listeners instead of port listeners (Linux only).",
};
// kingpin's shell completion flags, which node_exporter has: accepted;
// shell completions are not offered.
const COMPLETION_HELP: &str = "Accepted for node_exporter compatibility; prints nothing.";
const COMPLETIONS: [Hidden<BoolFlag>; 3] = [
    Hidden(BoolFlag { name: "completion-bash", default: false, help: COMPLETION_HELP }),
    Hidden(BoolFlag { name: "completion-script-bash", default: false, help: COMPLETION_HELP }),
    Hidden(BoolFlag { name: "completion-script-zsh", default: false, help: COMPLETION_HELP }),
];

/// The flags of `serve` (also accepted with no subcommand).
pub fn serve_args() -> Vec<Arg> {
    let mut v =
        flags::args(&[&LISTEN_ADDRESS, &TELEMETRY_PATH, &MAX_REQUESTS, &MAX_CONNECTIONS, &WEB_CONFIG_FILE, &LOG_LEVEL, &LOG_FORMAT]);
    v.extend(registry::path_args());
    v.extend(flags::args(&[&NODE_EXPORTER_BUILD_INFO, &DISABLE_EXPORTER_METRICS]));
    v.extend(registry::disable_defaults_args());
    v.extend(flags::args(&[&COLLECTOR_TIMEOUT, &DROP_CAPABILITIES, &crate::probes::BPF_STATS, &GOMAXPROCS, &SYSTEMD_SOCKET]));
    // kingpin's built-ins node_exporter has: the long help is the help
    // here, `--help-man` prints the man page (`cmd::serve` does, before
    // serving). Not declarations: clap actions of their own (help, and a
    // switch without `--no-`).
    v.push(Arg::new("help-long").long("help-long").action(clap::ArgAction::Help).hide(true).help("Generate long help."));
    v.push(Arg::new("help-man").long("help-man").action(clap::ArgAction::SetTrue).hide(true).help("Generate a man page."));
    v.extend(COMPLETIONS.iter().flat_map(Flag::declare));
    v.extend(registry::collector_args(&registry::definitions()));
    v.extend(registry::collector_args(&crate::probes::definitions()));
    let rest = registry::catalog_args(&v);
    v.extend(rest);
    v
}

/// `--log.level` and `--log.format`, needed before anything else logs.
pub fn log_settings(m: &ArgMatches) -> Result<(tracing::Level, LogFormat), Error> {
    let f = Flags::new(m);
    Ok((LOG_LEVEL.get(&f)?, LOG_FORMAT.get(&f)?))
}

/// Resolves flags into a configuration and builds the enabled collectors:
/// [`parse`], then [`build_collectors`].
pub fn resolve(m: &ArgMatches) -> Result<ServeConfig, Error> {
    let mut cfg = parse(m)?;
    cfg.collectors =
        build_collectors(m, &cfg.paths, host::sys::nofile_limit().map(|n| crate::descriptors::Ceiling::for_limit(n, cfg.listen.len())))?;
    Ok(cfg)
}

/// Step one of start-up: the flags, checked and parsed into a
/// configuration (a bad value fails here, naming its flag), with no
/// collector built yet (`collectors` is empty) and nothing opened, loaded
/// or started.
pub fn parse(m: &ArgMatches) -> Result<ServeConfig, Error> {
    let f = Flags::new(m);
    let paths = registry::paths(&f);
    let max_requests = MAX_REQUESTS.get(&f)?.max(0) as usize;
    let gomaxprocs = GOMAXPROCS.get(&f)?;
    let worker_threads = if gomaxprocs >= 1 { gomaxprocs as usize } else { std::thread::available_parallelism().map_or(1, |n| n.get()) };
    let telemetry_path = TELEMETRY_PATH.get(&f);
    if !telemetry_path.starts_with('/') {
        return Err(TELEMETRY_PATH.invalid("must start with /").into());
    }
    let (log_level, log_format) = log_settings(m)?;
    let listen = LISTEN_ADDRESS.get(&f);
    for l in &listen {
        parse_listen(l).map_err(|msg| LISTEN_ADDRESS.invalid(msg))?;
    }
    registry::warn_unimplemented(&f, &registry::definitions());
    let max_connections = MAX_CONNECTIONS.get(&f)?;
    if max_connections == 0 {
        return Err(MAX_CONNECTIONS.invalid("must be at least 1").into());
    }
    let collector_timeout = COLLECTOR_TIMEOUT.get(&f)?;
    if collector_timeout.is_zero() {
        return Err(COLLECTOR_TIMEOUT.invalid("must be above zero").into());
    }
    Ok(ServeConfig {
        listen,
        telemetry_path,
        max_requests,
        web_config: Some(WEB_CONFIG_FILE.get(&f)).filter(|s| !s.is_empty()).map(std::path::PathBuf::from),
        exporter_metrics: !DISABLE_EXPORTER_METRICS.get(&f),
        node_exporter_build_info: NODE_EXPORTER_BUILD_INFO.get(&f),
        paths,
        collectors: Vec::new(),
        log_level,
        log_format,
        drop_capabilities: DROP_CAPABILITIES.get(&f),
        collector_timeout,
        max_connections,
        worker_threads,
        systemd_socket: SYSTEMD_SOCKET.get(&f),
    })
}

/// Step two of start-up: every enabled collector, built from its flags.
/// Host collectors only read their options here; the eBPF probes load and
/// attach their programs and pod attribution starts its watch of the API
/// server, which need the capabilities (BPF, PERFMON, SYS_PTRACE) that
/// `--security.drop-capabilities` drops afterwards: this step must come
/// before the drop (`agent::Agent::start` keeps that order). The eBPF
/// object and its programs take descriptors only under `fds`
/// (`crate::descriptors`).
pub fn build_collectors(m: &ArgMatches, paths: &Paths, fds: Option<crate::descriptors::Ceiling>) -> Result<Vec<Named>, Error> {
    let f = Flags::new(m);
    let mut collectors = registry::build(&f, paths, &registry::definitions(), &mut ())?;
    let probes = crate::probes::definitions();
    let mut ctx = crate::probes::Context::new(&f, paths, &probes)?;
    ctx.fds = fds;
    collectors.extend(registry::build(&f, paths, &probes, &mut ctx)?);
    Ok(collectors)
}

/// Parses a listen address as Go's `net.Listen("tcp", ...)` reads it:
/// `:9100` and `[]:9100` (every interface), `127.0.0.1:9100`,
/// `[10.0.0.5]:9100` (brackets around IPv4 too, as the Helm chart's
/// `[$(HOST_IP)]:9100` gives), `[::1]:9100`, `host:9100`.
pub fn parse_listen(s: &str) -> Result<Vec<std::net::SocketAddr>, String> {
    let bad = |why: &str| format!("invalid address {s:?}: {why}");
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        (h, p.strip_prefix(':').ok_or_else(|| bad("missing port after ']'"))?)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or_else(|| bad("missing port"))?;
        if h.contains(':') {
            return Err(bad("an IPv6 address needs brackets, e.g. [::1]:9100"));
        }
        (h, p)
    };
    let port: u16 = port.parse().map_err(|_| bad("invalid port"))?;
    if host.is_empty() {
        return Ok(vec![std::net::SocketAddr::from(([0u8; 16], port))]);
    }
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![std::net::SocketAddr::new(ip, port)]);
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = (host, port).to_socket_addrs().map_err(|e| bad(&e.to_string()))?.collect();
    if addrs.is_empty() {
        return Err(bad("resolves to nothing"));
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
    fn listen_addresses_as_go_reads_them() {
        let one = |s: &str| parse_listen(s).map(|v| v[0].to_string());
        assert_eq!(one("[10.0.0.5]:9100").unwrap(), "10.0.0.5:9100", "the Helm chart's form with an IPv4 node IP");
        assert_eq!(one("[::1]:9100").unwrap(), "[::1]:9100");
        assert_eq!(one(":9100").unwrap(), "[::]:9100");
        assert_eq!(one("[]:9100").unwrap(), "[::]:9100");
        assert_eq!(one("127.0.0.1:9100").unwrap(), "127.0.0.1:9100");
        assert!(one("localhost:9100").is_ok());
        for bad in ["9100", "::1:9100", "[::1]9100", "[::1", "1.2.3.4:99999", "[1.2.3.4]:x"] {
            assert!(parse_listen(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_exporter_manifests_start_unchanged() {
        // The manifests' whole argument lists start a real agent in
        // tests/tests/dropin.rs; here the forms they use.
        resolve_args(&["--no-collector.wifi", "--no-collector.hwmon", "--no-collector.btrfs", "--no-collector.ebpf_pods"]).unwrap();
        let c = resolve_args(&["--web.listen-address=[127.0.0.1]:9100", "--no-collector.ebpf_pods"]).unwrap();
        assert_eq!(c.listen, ["[127.0.0.1]:9100"]);
        // node_exporter's own global flags.
        let c = resolve_args(&["--runtime.gomaxprocs=2.9", "--web.max-requests=1e1", "--collector.disable-defaults"]).unwrap();
        assert_eq!((c.worker_threads, c.max_requests), (2, 10), "kingpin reads integers as floats");
    }

    #[test]
    fn every_node_exporter_flag_is_accepted_with_its_default() {
        let mut cmd = crate::cmd::command();
        cmd.build();
        for spec in host::catalog::FLAGS {
            let arg = cmd.get_arguments().find(|a| a.get_id() == spec.name).unwrap_or_else(|| panic!("--{} is not accepted", spec.name));
            if spec.kind == host::catalog::FlagKind::Bool {
                if !matches!(spec.name, "help" | "version" | "help-long" | "help-man") {
                    assert!(
                        cmd.get_arguments().any(|a| a.get_id() == format!("no-{}", spec.name).as_str()),
                        "--no-{} is accepted",
                        spec.name
                    );
                }
                continue;
            }
            let default: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let ours = default.first().map(String::as_str).unwrap_or("");
            let theirs = if spec.name == "web.listen-address" { "" } else { spec.default };
            assert_eq!(ours, theirs, "--{}'s default", spec.name);
        }
    }

    #[test]
    fn deprecated_flags_still_work_with_their_warning_and_conflict() {
        let c = resolve_args(&["--collector.disable-defaults", "--collector.diskstats", "--collector.diskstats.ignored-devices=^sda$"])
            .unwrap();
        assert_eq!(names(&c), ["diskstats"]);
        let e = resolve_args(&[
            "--collector.disable-defaults",
            "--collector.diskstats",
            "--collector.diskstats.ignored-devices=^sda$",
            "--collector.diskstats.device-exclude=^sdb$",
        ])
        .unwrap_err();
        assert!(e.contains("mutually exclusive"), "{e}");
    }

    #[test]
    fn unknown_flags_still_fail_naming_themselves() {
        let e = resolve_args(&["--collector.nope"]).unwrap_err();
        assert!(e.contains("--collector.nope"), "{e}");
        let e = resolve_args(&["--collector.cpu.nope=1"]).unwrap_err();
        assert!(e.contains("--collector.cpu.nope"), "{e}");
    }

    #[test]
    fn the_listen_default_is_the_default_port() {
        assert_eq!(LISTEN_ADDRESS.default, [format!(":{DEFAULT_PORT}")]);
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
