//! The health gate: scrape a new agent pod's /metrics and require every
//! eBPF program up and every required collector succeeding.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;

use super::crd::HealthGate;
use super::rollout::{GateResult, GateTarget};
use expo::text as expfmt;

/// Largest /metrics body the gate reads.
const MAX_BODY: usize = 16 << 20;
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Judges one scrape's text. Failure messages name the metric, never raw
/// bodies, and stay short (they go into conditions and events).
pub fn check(text: &str, gate: &HealthGate) -> GateResult {
    let families = match expfmt::parse(text) {
        Ok(f) => f,
        Err(e) => return GateResult::Fail(format!("unparsable /metrics (line {}: {})", e.line, e.msg)),
    };
    let mut down: Vec<String> = Vec::new();
    let mut collectors: Vec<(String, f64)> = Vec::new();
    for f in &families {
        for s in &f.samples {
            let get = |k: &str| s.labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            match s.name.as_str() {
                "node_ebpf_program_up" if s.value != 1.0 => down.push(get("program")),
                "node_scrape_collector_success" => collectors.push((get("collector"), s.value)),
                _ => {}
            }
        }
    }
    if !down.is_empty() {
        down.sort();
        return GateResult::Fail(format!("node_ebpf_program_up is 0 for {}", down.join(", ")));
    }
    for want in &gate.required_collectors {
        match collectors.iter().find(|(c, _)| c == want) {
            None => return GateResult::Fail(format!("required collector {want} is not reported")),
            Some((_, v)) if *v != 1.0 => return GateResult::Fail(format!("node_scrape_collector_success{{collector=\"{want}\"}} is {v}")),
            Some(_) => {}
        }
    }
    GateResult::Pass
}

/// Scrapes a gate target; a trait so tests and the simulation can serve
/// fake agents.
pub trait Probe: Send + Sync {
    fn probe<'a>(&'a self, target: &'a GateTarget, gate: &'a HealthGate) -> Pin<Box<dyn Future<Output = GateResult> + Send + 'a>>;
}

/// Scrapes `http://POD_IP:PORT/PATH` over HTTP/1.1 with a timeout.
pub struct HttpProbe;

async fn fetch(target: &GateTarget, gate: &HealthGate) -> Result<String, String> {
    let addr = if target.ip.contains(':') { format!("[{}]:{}", target.ip, gate.port) } else { format!("{}:{}", target.ip, gate.port) };
    let stream = tokio::net::TcpStream::connect(&addr).await.map_err(|e| format!("connect {addr}: {}", e.kind()))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| format!("http: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(&gate.path).header("host", &addr).body(Empty::<Bytes>::new()).map_err(|e| format!("request: {e}"))?;
    let resp = send.send_request(req).await.map_err(|e| format!("http: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("{} answered {}", gate.path, resp.status().as_u16()));
    }
    let body = Limited::new(resp.into_body(), MAX_BODY).collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".to_string())
}

impl Probe for HttpProbe {
    fn probe<'a>(&'a self, target: &'a GateTarget, gate: &'a HealthGate) -> Pin<Box<dyn Future<Output = GateResult> + Send + 'a>> {
        Box::pin(async move {
            match tokio::time::timeout(TIMEOUT, fetch(target, gate)).await {
                Err(_) => {
                    GateResult::Fail(format!("no answer from {}:{}{} within {}s", target.ip, gate.port, gate.path, TIMEOUT.as_secs()))
                }
                Ok(Err(e)) => GateResult::Fail(e),
                Ok(Ok(text)) => check(&text, gate),
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
    fn fails_on_garbage() {
        assert!(matches!(check("node_ebpf_program_up{ 1\n", &gate(&[])), GateResult::Fail(m) if m.starts_with("unparsable")));
    }
}
