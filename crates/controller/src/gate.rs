//! The health gate: scrape a new agent pod's /metrics and require every
//! eBPF program up and every required collector succeeding.
//!
//! The body is judged line by line as it arrives: only the two families
//! the gate reads are kept (the failing programs' first names, the
//! required collectors), so a probe holds one chunk and one line at most
//! (≤ 64 KiB a line, ≤ 16 MiB a body), whatever the pod answers.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;

use super::crd::HealthGate;
use super::migration;
use super::rollout::{GateResult, GateTarget};
use expo::text::{self as expfmt, Line};

/// Largest /metrics body the gate reads.
const MAX_BODY: usize = 16 << 20;
/// Longest line the gate reads.
const MAX_LINE: usize = 64 << 10;
/// Down programs named in a failure (the rest are counted).
const NAMED: usize = 10;
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The gate's judgement of one scrape, built line by line in bounded
/// memory. Failure messages name the metric, never raw bodies, and stay
/// short (they go into conditions and events).
pub struct Scan<'g> {
    gate: &'g HealthGate,
    /// On a taken node: what the old exporter served there, and of it what
    /// this scrape served (bounded by the expectation).
    expect: Option<&'g migration::Expected>,
    families: BTreeSet<String>,
    succeeded: BTreeSet<String>,
    line: usize,
    error: Option<String>,
    programs: usize,
    down: usize,
    down_named: BTreeSet<String>,
    collectors: BTreeMap<String, f64>,
}

impl<'g> Scan<'g> {
    pub fn new(gate: &'g HealthGate) -> Scan<'g> {
        Scan::expecting(gate, None)
    }

    /// A scan that also requires the old exporter's families and collectors.
    pub fn expecting(gate: &'g HealthGate, expect: Option<&'g migration::Expected>) -> Scan<'g> {
        Scan {
            gate,
            expect,
            families: BTreeSet::new(),
            succeeded: BTreeSet::new(),
            line: 0,
            error: None,
            programs: 0,
            down: 0,
            down_named: BTreeSet::new(),
            collectors: BTreeMap::new(),
        }
    }

    /// Takes one line of the exposition (without its newline).
    pub fn line(&mut self, raw: &str) {
        self.line += 1;
        if self.error.is_some() {
            return;
        }
        let s = match expfmt::parse_line(raw, self.line) {
            Ok(Line::Sample(s)) => s,
            Ok(Line::Type { name, .. }) => {
                if self.expect.is_some_and(|e| e.families.contains(name)) {
                    self.families.insert(name.to_string());
                }
                return;
            }
            Ok(_) => return,
            Err(e) => {
                self.error = Some(format!("unparsable /metrics (line {}: {})", e.line, e.msg));
                return;
            }
        };
        let get = |k: &str| s.labels.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()).unwrap_or_default();
        match s.name {
            "node_ebpf_program_up" => {
                self.programs += 1;
                if s.value != 1.0 {
                    self.down += 1;
                    self.down_named.insert(get("program"));
                    if self.down_named.len() > NAMED {
                        self.down_named.pop_last();
                    }
                }
            }
            "node_scrape_collector_success" => {
                let c = get("collector");
                if s.value == 1.0 && self.expect.is_some_and(|e| e.collectors.contains(&c)) {
                    self.succeeded.insert(c.clone());
                }
                if self.gate.required_collectors.contains(&c) {
                    self.collectors.insert(c, s.value);
                }
            }
            _ => {}
        }
    }

    /// Fails the scan (a transport or size problem).
    pub fn fail(&mut self, why: String) {
        self.error.get_or_insert(why);
    }

    pub fn finish(self) -> GateResult {
        if let Some(e) = self.error {
            return GateResult::Fail(e);
        }
        if self.down > 0 {
            let mut names = self.down_named.into_iter().collect::<Vec<_>>().join(", ");
            if self.down > NAMED {
                names.push_str(&format!(" and {} more", self.down - NAMED));
            }
            return GateResult::Fail(format!("node_ebpf_program_up is 0 for {names}"));
        }
        if self.programs < self.gate.min_programs.max(0) as usize {
            return GateResult::Fail(format!(
                "{} node_ebpf_program_up series, fewer than minPrograms {}: the agent reports no eBPF program",
                self.programs, self.gate.min_programs
            ));
        }
        for want in &self.gate.required_collectors {
            match self.collectors.get(want) {
                None => return GateResult::Fail(format!("required collector {want} is not reported")),
                Some(v) if *v != 1.0 => return GateResult::Fail(format!("node_scrape_collector_success{{collector=\"{want}\"}} is {v}")),
                Some(_) => {}
            }
        }
        if let Some(e) = self.expect {
            let missing = |want: &BTreeSet<String>, got: &BTreeSet<String>| -> Option<String> {
                let m: Vec<&String> = want.difference(got).collect();
                let shown: Vec<&str> = m.iter().take(NAMED).map(|s| s.as_str()).collect();
                (!m.is_empty()).then(|| {
                    let more = if m.len() > NAMED { format!(" and {} more", m.len() - NAMED) } else { String::new() };
                    format!("{}{more}", shown.join(", "))
                })
            };
            if let Some(m) = missing(&e.families, &self.families) {
                return GateResult::Fail(format!("families the replaced exporter served on this node are not served: {m}"));
            }
            if let Some(m) = missing(&e.collectors, &self.succeeded) {
                return GateResult::Fail(format!("collectors that succeeded in the replaced exporter on this node do not: {m}"));
            }
        }
        GateResult::Pass
    }
}

/// What a replaced exporter served: its families (from `# TYPE` lines) and
/// the collectors that succeeded, at most `MAX_FAMILIES` families.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub families: BTreeSet<String>,
    pub collectors: BTreeSet<String>,
    line: usize,
    error: Option<String>,
}

/// Families a snapshot keeps (node_exporter serves a few hundred).
pub const MAX_FAMILIES: usize = 4096;

impl Sink for Snapshot {
    fn line(&mut self, raw: &str) {
        self.line += 1;
        if self.error.is_some() {
            return;
        }
        match expfmt::parse_line(raw, self.line) {
            Ok(Line::Type { name, .. }) => {
                if self.families.len() >= MAX_FAMILIES {
                    self.error = Some(format!("more than {MAX_FAMILIES} families"));
                } else {
                    self.families.insert(name.to_string());
                }
            }
            Ok(Line::Sample(s)) if s.name == "node_scrape_collector_success" && s.value == 1.0 => {
                if let Some((_, c)) = s.labels.iter().find(|(k, _)| *k == "collector") {
                    self.collectors.insert(c.to_string());
                }
            }
            Ok(_) => {}
            Err(e) => self.error = Some(format!("unparsable /metrics (line {}: {})", e.line, e.msg)),
        }
    }
    fn fail(&mut self, why: String) {
        self.error.get_or_insert(why);
    }
}

impl Snapshot {
    pub fn finish(self) -> Result<Snapshot, String> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self),
        }
    }
}

/// Where scraped lines go.
pub trait Sink {
    fn line(&mut self, raw: &str);
    fn fail(&mut self, why: String);
}

impl Sink for Scan<'_> {
    fn line(&mut self, raw: &str) {
        Scan::line(self, raw)
    }
    fn fail(&mut self, why: String) {
        Scan::fail(self, why)
    }
}

/// Judges one scrape's whole text.
pub fn check(text: &str, gate: &HealthGate) -> GateResult {
    let mut scan = Scan::new(gate);
    for l in text.lines() {
        scan.line(l);
    }
    scan.finish()
}

/// Splits a body's chunks into lines for a scan, holding at most one line.
struct Lines {
    pending: Vec<u8>,
    total: usize,
}

impl Lines {
    fn feed(&mut self, chunk: &[u8], scan: &mut dyn Sink) -> Result<(), String> {
        self.total += chunk.len();
        if self.total > MAX_BODY {
            return Err(format!("/metrics is larger than {} MiB", MAX_BODY >> 20));
        }
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|b| *b == b'\n') {
            self.push(&rest[..i])?;
            self.emit(scan)?;
            rest = &rest[i + 1..];
        }
        self.push(rest)
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.pending.len() + bytes.len() > MAX_LINE {
            return Err(format!("a /metrics line is longer than {} KiB", MAX_LINE >> 10));
        }
        self.pending.extend_from_slice(bytes);
        Ok(())
    }

    fn emit(&mut self, scan: &mut dyn Sink) -> Result<(), String> {
        let line = std::str::from_utf8(&self.pending).map_err(|_| "body is not UTF-8".to_string())?;
        scan.line(line);
        self.pending.clear();
        Ok(())
    }
}

/// Scrapes a gate target, and a replaced exporter before its node moves;
/// a trait so tests and the simulation can serve fake agents.
pub trait Probe: Send + Sync {
    fn probe<'a>(&'a self, target: &'a GateTarget, gate: &'a HealthGate) -> Pin<Box<dyn Future<Output = GateResult> + Send + 'a>>;

    /// What the exporter at `ip:port` serves (GET /metrics).
    fn read_exporter<'a>(&'a self, ip: &'a str, port: u16) -> Pin<Box<dyn Future<Output = Result<Snapshot, String>> + Send + 'a>> {
        Box::pin(async move {
            let mut snap = Snapshot::default();
            match tokio::time::timeout(TIMEOUT, fetch_into(ip, port, "/metrics", &mut snap)).await {
                Err(_) => Err(format!("no answer from {ip}:{port}/metrics within {}s", TIMEOUT.as_secs())),
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => snap.finish(),
            }
        })
    }
}

/// Scrapes `http://POD_IP:PORT/PATH` over HTTP/1.1 with a timeout.
pub struct HttpProbe;

async fn fetch(target: &GateTarget, gate: &HealthGate) -> Result<GateResult, String> {
    let mut scan = Scan::expecting(gate, target.expect.as_ref());
    fetch_into(&target.ip, gate.port, &gate.path, &mut scan).await?;
    Ok(scan.finish())
}

/// GET `http://ip:port/path`, each line of the body into `sink`.
async fn fetch_into(ip: &str, port: u16, path: &str, sink: &mut (dyn Sink + Send)) -> Result<(), String> {
    let addr = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let stream = tokio::net::TcpStream::connect(&addr).await.map_err(|e| format!("connect {addr}: {}", e.kind()))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path).header("host", &addr).body(Empty::<Bytes>::new()).map_err(|e| format!("request: {e}"))?;
    let resp = send.send_request(req).await.map_err(|e| format!("http: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{path} answered {}", resp.status().as_u16()));
    }
    let mut body = resp.into_body();
    let mut lines = Lines { pending: Vec::new(), total: 0 };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body: {e}"))?;
        if let Some(chunk) = frame.data_ref() {
            lines.feed(chunk, sink)?;
        }
    }
    if !lines.pending.is_empty() {
        lines.emit(sink)?;
    }
    Ok(())
}

impl Probe for HttpProbe {
    fn probe<'a>(&'a self, target: &'a GateTarget, gate: &'a HealthGate) -> Pin<Box<dyn Future<Output = GateResult> + Send + 'a>> {
        Box::pin(async move {
            match tokio::time::timeout(TIMEOUT, fetch(target, gate)).await {
                Err(_) => {
                    GateResult::Fail(format!("no answer from {}:{}{} within {}s", target.ip, gate.port, gate.path, TIMEOUT.as_secs()))
                }
                Ok(Err(e)) => GateResult::Fail(e),
                Ok(Ok(r)) => r,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(required: &[&str]) -> HealthGate {
        HealthGate { required_collectors: required.iter().map(|s| s.to_string()).collect(), ..Default::default() }
    }

    const HEALTHY: &str = "# TYPE node_ebpf_program_up gauge\nnode_ebpf_program_up{program=\"sys_exit\"} 1\nnode_ebpf_program_up{program=\"block_rq_issue\"} 1\n# TYPE node_scrape_collector_success gauge\nnode_scrape_collector_success{collector=\"cpu\"} 1\nnode_scrape_collector_success{collector=\"meminfo\"} 1\n";

    #[test]
    fn passes_when_everything_is_up() {
        assert_eq!(check(HEALTHY, &gate(&["cpu", "meminfo"])), GateResult::Pass);
    }

    #[test]
    fn fails_on_a_program_down_naming_it() {
        let t = HEALTHY.replace("{program=\"sys_exit\"} 1", "{program=\"sys_exit\"} 0");
        assert_eq!(check(&t, &gate(&[])), GateResult::Fail("node_ebpf_program_up is 0 for sys_exit".into()));
    }

    #[test]
    fn fails_on_a_required_collector_failing_or_missing() {
        let t = HEALTHY.replace("{collector=\"cpu\"} 1", "{collector=\"cpu\"} 0");
        assert_eq!(check(&t, &gate(&["cpu"])), GateResult::Fail("node_scrape_collector_success{collector=\"cpu\"} is 0".into()));
        assert_eq!(check(&t, &gate(&["meminfo"])), GateResult::Pass);
        assert_eq!(check(HEALTHY, &gate(&["diskstats"])), GateResult::Fail("required collector diskstats is not reported".into()));
    }

    #[test]
    fn the_message_names_ten_down_programs_and_counts_the_rest() {
        let mut t = String::from("# TYPE node_ebpf_program_up gauge\n");
        for i in 0..5000 {
            t.push_str(&format!("node_ebpf_program_up{{program=\"p{i:05}\"}} 0\n"));
        }
        let GateResult::Fail(m) = check(&t, &gate(&[])) else { panic!("passed") };
        assert_eq!(
            m,
            "node_ebpf_program_up is 0 for p00000, p00001, p00002, p00003, p00004, p00005, p00006, p00007, p00008, p00009 and 4990 more"
        );
    }

    #[test]
    fn no_program_reported_fails_unless_min_programs_is_zero() {
        let t = "# TYPE node_scrape_collector_success gauge\nnode_scrape_collector_success{collector=\"cpu\"} 1\n";
        assert!(matches!(check(t, &gate(&["cpu"])), GateResult::Fail(m) if m.contains("fewer than minPrograms 1")));
        let g = HealthGate { min_programs: 0, ..gate(&["cpu"]) };
        assert_eq!(check(t, &g), GateResult::Pass);
    }

    #[test]
    fn streamed_lines_hold_one_line_at_most() {
        let g = gate(&["cpu"]);
        let mut scan = Scan::new(&g);
        let mut lines = Lines { pending: Vec::new(), total: 0 };
        // HEALTHY in 7-byte chunks, lines split across chunks.
        for chunk in HEALTHY.as_bytes().chunks(7) {
            lines.feed(chunk, &mut scan).expect("feed");
            assert!(lines.pending.len() < 120);
        }
        assert_eq!(scan.finish(), GateResult::Pass);
        let mut scan = Scan::new(&g);
        let mut lines = Lines { pending: Vec::new(), total: 0 };
        let long = vec![b'a'; MAX_LINE + 1];
        assert!(lines.feed(&long, &mut scan).unwrap_err().contains("longer than 64 KiB"));
    }

    #[test]
    fn on_a_taken_node_every_family_and_collector_of_the_old_exporter_is_required() {
        let e = migration::Expected {
            families: ["node_ebpf_program_up".to_string(), "node_uname_info".to_string()].into(),
            collectors: ["cpu".to_string(), "uname".to_string()].into(),
        };
        let g = gate(&[]);
        let run = |text: &str| {
            let mut scan = Scan::expecting(&g, Some(&e));
            for l in text.lines() {
                scan.line(l);
            }
            scan.finish()
        };
        assert_eq!(
            run(HEALTHY),
            GateResult::Fail("families the replaced exporter served on this node are not served: node_uname_info".into())
        );
        let with_uname = format!("{HEALTHY}# TYPE node_uname_info gauge\nnode_uname_info{{sysname=\"Linux\"}} 1\n");
        assert_eq!(
            run(&with_uname),
            GateResult::Fail("collectors that succeeded in the replaced exporter on this node do not: uname".into())
        );
        let all = format!("{with_uname}node_scrape_collector_success{{collector=\"uname\"}} 1\n");
        assert_eq!(run(&all), GateResult::Pass);
        // The old exporter's snapshot: its TYPE lines and the collectors that succeeded.
        let mut snap = Snapshot::default();
        for l in all.lines().chain(["node_scrape_collector_success{collector=\"bad\"} 0"]) {
            Sink::line(&mut snap, l);
        }
        let snap = snap.finish().expect("snapshot");
        assert_eq!(snap.collectors, ["cpu".to_string(), "meminfo".to_string(), "uname".to_string()].into());
        assert!(snap.families.contains("node_uname_info") && snap.families.contains("node_scrape_collector_success"));
    }

    #[test]
    fn fails_on_garbage() {
        assert!(matches!(check("node_ebpf_program_up{ 1\n", &gate(&[])), GateResult::Fail(m) if m.starts_with("unparsable")));
    }
}
