//! One scrape: run the selected collectors, time them, and encode their
//! families with the exporter's own metrics in the requested format.

use std::sync::Mutex;
use std::time::Instant;

use expo::{Format, Kind, Sink};

use crate::{Collector, Error, Named};

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
    /// The exporter's own metrics (process_*, build info): written after the
    /// collectors' families, not reported as collectors.
    own: Vec<Mutex<Box<dyn Collector>>>,
    /// Size of the last response, to size the next buffer at once.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Scraper {
    pub fn new(collectors: Vec<Named>) -> Self {
        Scraper {
            entries: collectors.into_iter().map(|(name, c)| Entry { name, state: Mutex::new((c, Sink::new())) }).collect(),
            own: Vec::new(),
            last_len: std::sync::atomic::AtomicUsize::new(64 * 1024),
        }
    }

    /// Adds the exporter's own metrics to every scrape.
    pub fn with_own(mut self, c: Box<dyn Collector>) -> Self {
        self.own.push(Mutex::new(c));
        self
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
                        .unwrap_or_else(|p| Err(Error::Panicked(panic_message(p.as_ref()))));
                    (r, sink)
                }
                Err(_) => (Err(Error::Panicked("its state was poisoned by an earlier panic".into())), Sink::new()),
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
        for c in &self.own {
            let mut own = Sink::new();
            if let Ok(mut c) = c.lock() {
                if let Err(e) = c.update(&mut own) {
                    tracing::debug!(err = %e, "exporter metrics incomplete");
                }
            }
            sinks.push(own);
        }
        let mut out = String::with_capacity(self.last_len.load(std::sync::atomic::Ordering::Relaxed) + 4096);
        let returned = expo::encode(sinks, format, &mut out);
        self.last_len.store(out.len(), std::sync::atomic::Ordering::Relaxed);
        // Hand the sinks back so their buffers are reused next time.
        for (i, sink) in taken.into_iter().zip(returned) {
            if let Ok(mut g) = self.entries[i].state.lock() {
                g.1 = sink;
            }
        }
        out.into_bytes()
    }
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Panics;
    impl Collector for Panics {
        fn update(&mut self, _: &mut Sink) -> Result<(), Error> {
            panic!("boom")
        }
    }

    struct Fine;
    impl Collector for Fine {
        fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
            sink.single("fine_value", "h", Kind::Gauge, 1.0);
            Ok(())
        }
    }

    #[test]
    fn a_panic_fails_its_collector_only_every_time() {
        let s = Scraper::new(vec![("panics", Box::new(Panics)), ("fine", Box::new(Fine))]);
        for _ in 0..2 {
            let text = String::from_utf8(s.scrape(&Selection::default(), Format::Text)).unwrap();
            assert!(text.contains("node_scrape_collector_success{collector=\"panics\"} 0"), "{text}");
            assert!(text.contains("node_scrape_collector_success{collector=\"fine\"} 1"), "{text}");
            assert!(text.contains("fine_value 1"), "{text}");
        }
        let e = Error::Panicked(panic_message(&"boom"));
        assert_eq!(e.to_string(), "collector panicked: boom");
        assert!(!e.is_no_data(), "a panic is a fault, not a missing feature");
    }
}
