//! One scrape: run the selected collectors, time them, and encode their
//! families with the agent's own metrics in the requested format.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::registry::Registry;

use crate::collector::{Collector, Error};
use crate::metrics::{Exposition, Kind, Sink};
use crate::process::ProcessMetrics;

/// The exposition format of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4.
    Text,
    /// OpenMetrics 1.0.0.
    OpenMetrics,
}

impl Format {
    /// Chooses the format from an Accept header, as client_golang does.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

struct Entry {
    name: &'static str,
    state: Mutex<(Box<dyn Collector>, Sink)>,
}

/// Which collectors a request asked for (`collect[]` / `exclude[]`).
#[derive(Debug, Default, Clone)]
pub struct Selection {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

/// The collectors of a running agent.
pub struct Scraper {
    entries: Vec<Entry>,
    exporter_metrics: bool,
    process: Mutex<ProcessMetrics>,
    /// Size of the last response, to size the next buffer at once.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Scraper {
    pub fn new(collectors: Vec<(&'static str, Box<dyn Collector>)>, exporter_metrics: bool) -> Self {
        Scraper {
            entries: collectors.into_iter().map(|(name, c)| Entry { name, state: Mutex::new((c, Sink::new())) }).collect(),
            exporter_metrics,
            process: Mutex::new(ProcessMetrics::new()),
            last_len: std::sync::atomic::AtomicUsize::new(64 * 1024),
        }
    }

    /// The names of the enabled collectors.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// Checks a selection against the enabled collectors.
    pub fn validate(&self, sel: &Selection) -> Result<(), String> {
        if !sel.include.is_empty() && !sel.exclude.is_empty() {
            return Err("cannot use both collect[] and exclude[]".into());
        }
        for n in sel.include.iter().chain(&sel.exclude) {
            if !self.entries.iter().any(|e| e.name == n) {
                return Err(format!("missing collector: {n}"));
            }
        }
        Ok(())
    }

    fn selected(&self, sel: &Selection, name: &str) -> bool {
        if !sel.include.is_empty() {
            return sel.include.iter().any(|n| n == name);
        }
        !sel.exclude.iter().any(|n| n == name)
    }

    /// Runs one scrape and returns the encoded body.
    pub fn scrape(&self, sel: &Selection, format: Format) -> Vec<u8> {
        let mut sinks: Vec<Sink> = Vec::with_capacity(self.entries.len() + 2);
        let mut taken: Vec<usize> = Vec::with_capacity(self.entries.len());
        let mut meta = Sink::new();
        for (i, e) in self.entries.iter().enumerate() {
            if !self.selected(sel, e.name) {
                continue;
            }
            let start = Instant::now();
            let (result, sink) = match e.state.lock() {
                Ok(mut guard) => {
                    let (collector, sink) = &mut *guard;
                    let mut sink = std::mem::take(sink);
                    sink.clear();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.update(&mut sink)))
                        .unwrap_or_else(|_| Err(Error::NoData("collector panicked".into())));
                    (r, sink)
                }
                Err(_) => (Err(Error::NoData("collector state poisoned by an earlier panic".into())), Sink::new()),
            };
            let secs = start.elapsed().as_secs_f64();
            let ok = match &result {
                Ok(()) => true,
                Err(err) if err.is_no_data() => {
                    tracing::debug!(collector = e.name, err = %err, "collector returned no data");
                    false
                }
                Err(err) => {
                    tracing::error!(collector = e.name, duration_seconds = secs, err = %err, "collector failed");
                    false
                }
            };
            meta.family("node_scrape_collector_duration_seconds", "node_exporter: Duration of a collector scrape.", Kind::Gauge)
                .sample(&[("collector", e.name)], secs);
            meta.family("node_scrape_collector_success", "node_exporter: Whether a collector succeeded.", Kind::Gauge)
                .sample(&[("collector", e.name)], if ok { 1.0 } else { 0.0 });
            // A failed collector's partial output is dropped: all or nothing.
            let mut sink = sink;
            if !ok {
                sink.clear();
            }
            sinks.push(sink);
            taken.push(i);
        }
        sinks.push(meta);
        if self.exporter_metrics {
            let mut own = Sink::new();
            if let Ok(mut p) = self.process.lock() {
                p.collect(&mut own);
            }
            sinks.push(own);
        }

        let exposition = Arc::new(Exposition { sinks: Mutex::new(sinks) });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&exposition)));
        let mut out = String::with_capacity(self.last_len.load(std::sync::atomic::Ordering::Relaxed) + 4096);
        let res = match format {
            Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry),
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
        };
        if let Err(e) = res {
            tracing::error!(err = %e, "encoding metrics failed");
        }
        drop(registry);
        self.last_len.store(out.len(), std::sync::atomic::Ordering::Relaxed);

        // Hand the sinks back so their buffers are reused next time.
        if let Ok(mut returned) = exposition.sinks.lock() {
            for (i, sink) in taken.into_iter().zip(returned.drain(..)) {
                if let Ok(mut g) = self.entries[i].state.lock() {
                    g.1 = sink;
                }
            }
        }
        out.into_bytes()
    }
}

/// Gzips a body at the fast level.
pub fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::fast());
    enc.write_all(body)?;
    enc.finish()
}
