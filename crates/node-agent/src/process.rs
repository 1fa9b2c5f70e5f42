//! The agent's own process metrics (`process_*`), `node_agent_build_info`,
//! and `node_exporter_build_info` (node-mixin's dashboards list instances
//! by it; its labels say node-agent), read from its own /proc/self (not the
//! host's --path.procfs).

use procfs_core::FromRead;

use expo::{Kind, Sink};

pub struct ProcessMetrics {
    ticks: f64,
    page: f64,
    start_time: Option<f64>,
    /// The effective capabilities at start-up.
    caps: u64,
    /// Also serve `node_exporter_build_info`.
    node_exporter_build_info: bool,
}

impl Default for ProcessMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessMetrics {
    pub fn new() -> Self {
        // SAFETY: sysconf has no memory-safety preconditions.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
        let btime = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok())));
        let start_time = btime.and_then(|b| {
            let stat = procfs_core::process::Stat::from_read(std::fs::File::open("/proc/self/stat").ok()?).ok()?;
            Some(b + stat.starttime as f64 / ticks)
        });
        ProcessMetrics {
            ticks,
            page: host::sys::page_size() as f64,
            start_time,
            caps: crate::caps::effective(),
            node_exporter_build_info: true,
        }
    }

    /// Without `node_exporter_build_info` (`--no-compat.node-exporter-build-info`).
    pub fn without_node_exporter_build_info(mut self) -> Self {
        self.node_exporter_build_info = false;
        self
    }

    pub fn collect(&mut self, sink: &mut Sink) {
        if let Some(stat) = std::fs::File::open("/proc/self/stat").ok().and_then(|f| procfs_core::process::Stat::from_read(f).ok()) {
            sink.single(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                Kind::Counter,
                (stat.utime + stat.stime) as f64 / self.ticks,
            );
            sink.single("process_virtual_memory_bytes", "Virtual memory size in bytes.", Kind::Gauge, stat.vsize as f64);
            sink.single("process_resident_memory_bytes", "Resident memory size in bytes.", Kind::Gauge, stat.rss as f64 * self.page);
        }
        if let Some(n) = host::sys::open_fds() {
            sink.single("process_open_fds", "Number of open file descriptors.", Kind::Gauge, n as f64);
        }
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `lim` is a valid, writable rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            sink.single("process_max_fds", "Maximum number of open file descriptors.", Kind::Gauge, lim.rlim_cur as f64);
        }
        let kept = host::io::kept_stats();
        sink.single(
            "node_agent_kept_fds",
            "File descriptors of proc and sys files and directories kept open between scrapes.",
            Kind::Gauge,
            kept.kept as f64,
        );
        sink.single(
            "node_agent_kept_fds_max",
            "The most file descriptors kept open between scrapes: what the open-file limit leaves after start-up, connections and a reserve (at most a quarter of the limit, at most 512).",
            Kind::Gauge,
            kept.budget as f64,
        );
        sink.single(
            "node_agent_kept_fds_releases_total",
            "Times every kept file descriptor was closed because an open ran out of descriptors.",
            Kind::Counter,
            kept.releases as f64,
        );
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `lim` is a valid, writable rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0 {
            // Unlimited is RLIM_INFINITY (2^64 - 1), as client_golang reports it.
            sink.single(
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                Kind::Gauge,
                lim.rlim_cur as f64,
            );
        }
        if let Some(t) = self.start_time {
            sink.single("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", Kind::Gauge, t);
        }
        for (name, present, _) in crate::caps::report(self.caps) {
            sink.family(
                "node_agent_capability",
                "Whether node-agent holds the Linux capability (1) or not (0); the log says what a missing one disables.",
                Kind::Gauge,
            )
            .sample(&[("capability", name)], if present { 1.0 } else { 0.0 });
        }
        sink.family(
            "node_agent_build_info",
            "A metric with a constant '1' value labeled by version, revision, rustc and pgo (whether the build is profile-guided).",
            Kind::Gauge,
        )
        .sample(
            &[
                ("pgo", env!("NODE_AGENT_PGO")),
                ("revision", env!("NODE_AGENT_REVISION")),
                ("rustc", env!("NODE_AGENT_RUSTC")),
                ("version", env!("CARGO_PKG_VERSION")),
            ],
            1.0,
        );
        if self.node_exporter_build_info {
            sink.family(
                "node_exporter_build_info",
                "A metric with a constant '1' value labeled by version, revision, branch, goversion from which node_exporter was built, and the goos and goarch for the build.",
                Kind::Gauge,
            )
            .sample(
                &[
                    ("branch", ""),
                    ("goarch", GOARCH),
                    ("goos", "linux"),
                    ("goversion", concat!("rustc", env!("NODE_AGENT_RUSTC"))),
                    ("revision", env!("NODE_AGENT_REVISION")),
                    ("tags", "node-agent"),
                    ("version", concat!("node-agent-", env!("CARGO_PKG_VERSION"))),
                ],
                1.0,
            );
        }
    }
}

/// Go's name of this architecture, as node_exporter's `goarch` label has it.
const GOARCH: &str = if cfg!(target_arch = "x86_64") {
    "amd64"
} else if cfg!(target_arch = "aarch64") {
    "arm64"
} else {
    std::env::consts::ARCH
};

impl host::Collector for ProcessMetrics {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.collect(sink);
        Ok(())
    }
}
