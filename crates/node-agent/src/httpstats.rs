//! The HTTP server's own metrics: node_exporter's metric-handler families
//! (`promhttp_metric_handler_*`, with client_golang's meaning: counted per
//! request to the metrics path) and connection admission's
//! (`node_agent_http_connections_*`). Served with the exporter's own
//! metrics, unless `--web.disable-exporter-metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use expo::{Kind, Sink};

use crate::admission::Admission;

/// The status codes the metrics handler answers with, as client_golang
/// pre-declares them (a 400 for a bad `collect[]` is answered before the
/// instrumented handler, as in node_exporter, and not counted).
const CODES: [(u16, &str); 3] = [(200, "200"), (500, "500"), (503, "503")];

/// Why the metrics handler failed (`promhttp_metric_handler_errors_total{cause}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The answer could not be encoded (or compressed).
    Encoding,
    /// The scrape produced no answer.
    Gathering,
}

/// Requests to the metrics path: in flight, done by status code, failed by cause.
#[derive(Default)]
pub struct HandlerStats {
    in_flight: AtomicU64,
    by_code: [AtomicU64; CODES.len()],
    errors: [AtomicU64; 2],
}

/// A request to the metrics path, in flight until dropped.
pub struct InFlight<'a>(&'a HandlerStats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

impl HandlerStats {
    /// A request enters the handler.
    pub fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Relaxed);
        InFlight(self)
    }

    /// A request answered with `code` (codes outside [`CODES`] are not
    /// counted: the label's values stay these three).
    pub fn answered(&self, code: u16) {
        if let Some(i) = CODES.iter().position(|(c, _)| *c == code) {
            self.by_code[i].fetch_add(1, Relaxed);
        }
    }

    pub fn failed(&self, cause: Cause) {
        self.errors[cause as usize].fetch_add(1, Relaxed);
    }
}

/// The collector of the server's own metrics.
pub struct HttpMetrics {
    pub handler: Arc<HandlerStats>,
    pub admission: Arc<Admission>,
}

impl HttpMetrics {
    pub fn collect(&self, sink: &mut Sink) {
        let h = &self.handler;
        let mut f = sink.family(
            "promhttp_metric_handler_errors_total",
            "Total number of internal errors encountered by the promhttp metric handler.",
            Kind::Counter,
        );
        f.sample(&[("cause", "encoding")], h.errors[Cause::Encoding as usize].load(Relaxed) as f64);
        f.sample(&[("cause", "gathering")], h.errors[Cause::Gathering as usize].load(Relaxed) as f64);
        sink.single(
            "promhttp_metric_handler_requests_in_flight",
            "Current number of scrapes being served.",
            Kind::Gauge,
            h.in_flight.load(Relaxed) as f64,
        );
        let mut f = sink.family("promhttp_metric_handler_requests_total", "Total number of scrapes by HTTP status code.", Kind::Counter);
        for (i, (_, code)) in CODES.iter().enumerate() {
            f.sample(&[("code", code)], h.by_code[i].load(Relaxed) as f64);
        }
        let a = &self.admission;
        sink.single("node_agent_http_connections_open", "HTTP connections held now.", Kind::Gauge, a.open() as f64);
        sink.single(
            "node_agent_http_connections_max",
            "The most HTTP connections held at once (--web.max-connections, lowered to two thirds of what the open-file limit leaves after start-up).",
            Kind::Gauge,
            a.max() as f64,
        );
        sink.single(
            "node_agent_http_connections_per_peer_max",
            "The most HTTP connections one peer (an IPv4 address or an IPv6 /64) holds at once.",
            Kind::Gauge,
            a.per_peer() as f64,
        );
        let mut f = sink.family(
            "node_agent_http_connections_closed_total",
            "HTTP connections closed by admission, by reason: first_byte_timeout (silent after accepting), peer_cap (a peer's oldest idle or waiting-for-its-password-check one, for its new one), connection_cap (at --web.max-connections: the oldest idle or waiting one of the peer holding the most, or the oldest of a peer over its share), refused (new, every one busy), descriptors (an accept out of file descriptors: the one connection_cap would close).",
            Kind::Counter,
        );
        for (why, n) in a.closed() {
            f.sample(&[("reason", why.label())], n as f64);
        }
    }
}

impl host::Collector for HttpMetrics {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.collect(sink);
        Ok(())
    }
}
