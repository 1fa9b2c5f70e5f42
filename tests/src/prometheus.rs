//! A real Prometheus (Debian's `prometheus` package, 2.42) for the tests
//! that must see what it ingests: started on a free loopback port with a
//! given configuration and storage in a temporary directory, queried
//! through its HTTP API, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{compare, Kill};

/// Prometheus 2.42's Accept header with `--enable-feature=native-histograms`
/// (scrape.go, `scrapeAcceptHeaderWithProtobuf`): protobuf first.
pub const ACCEPT_PROTOBUF: &str = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// Prometheus 2.42's Accept header without it (`scrapeAcceptHeader`):
/// OpenMetrics first.
pub const ACCEPT_OPENMETRICS: &str =
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The classic text format alone, which Prometheus 2.42 cannot be told to
/// ask for (it has no `scrape_protocols`).
pub const ACCEPT_TEXT: &str = "text/plain;version=0.0.4";

/// `prog` on PATH; without it the test skips with a message, except in CI
/// (`CI` set), where it fails: `cargo xtask test` installs it.
pub fn need(prog: &str) -> Option<PathBuf> {
    let p = compare::which(prog);
    if p.is_none() {
        assert!(std::env::var_os("CI").is_none(), "{prog} is required in CI (cargo xtask test installs it)");
        eprintln!("SKIP: {prog} not installed (cargo xtask test installs it)");
    }
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A running Prometheus.
pub struct Prometheus {
    _child: Kill,
    pub base: String,
    log: PathBuf,
}

impl Prometheus {
    /// Starts `bin` with `config` (prometheus.yml's text), its storage in
    /// `dir`, and `flags` (say `--enable-feature=native-histograms`); waits
    /// until it is ready.
    pub fn start(bin: &Path, dir: &Path, config: &str, flags: &[&str]) -> Prometheus {
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).expect("write prometheus.yml");
        let port = free_port();
        let log = dir.join("prometheus.log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=info")
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create prometheus.log"))
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { _child: Kill(child), base: format!("http://127.0.0.1:{port}"), log };
        p.wait_for("ready", Duration::from_secs(60), || {
            ureq::get(&format!("{}/-/ready", p.base)).timeout(Duration::from_secs(2)).call().ok().filter(|r| r.status() == 200).map(|_| ())
        });
        p
    }

    /// The last 30 lines of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Polls `f` every 200 ms until it gives a value; fails after `limit`
    /// with Prometheus's log.
    pub fn wait_for<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(start.elapsed() < limit, "prometheus: no {what} after {limit:?}; its log:\n{}", self.log_tail());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `GET /api/v1/<path>` with `params`: its `data`.
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<serde_json::Value, String> {
        let url = format!("{}/api/v1/{path}", self.base);
        let mut req = ureq::get(&url).timeout(Duration::from_secs(10));
        for (k, v) in params {
            req = req.query(k, v);
        }
        let text = req.call().map_err(|e| format!("{path} {params:?}: {e}"))?.into_string().map_err(|e| format!("{path}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))?;
        if v["status"] != "success" {
            return Err(format!("{path} {params:?}: {v}"));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result vector (`/api/v1/query`).
    pub fn query(&self, q: &str) -> Result<Vec<serde_json::Value>, String> {
        let data = self.api("query", &[("query", q)])?;
        data["result"].as_array().cloned().ok_or_else(|| format!("{q}: no result vector: {data}"))
    }

    /// The single float value of an instant query.
    pub fn scalar(&self, q: &str) -> f64 {
        let r = self.query(q).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 1, "{q}: one series expected: {r:?}");
        value(&r[0]).unwrap_or_else(|| panic!("{q}: no float value: {r:?}"))
    }

    /// The active targets (`/api/v1/targets`).
    pub fn targets(&self) -> Vec<serde_json::Value> {
        self.api("targets", &[("state", "active")]).ok().and_then(|d| d["activeTargets"].as_array().cloned()).unwrap_or_default()
    }
}

/// The float value of one instant-vector element (`NaN`, `+Inf` included).
pub fn value(sample: &serde_json::Value) -> Option<f64> {
    sample["value"][1].as_str().and_then(expo::text::parse_value)
}
