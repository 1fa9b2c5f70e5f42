//! The sample model collectors write into, and its encoding through
//! prometheus-client.
//!
//! A [`Sink`] holds the metric families one collector produced in one scrape.
//! It is owned by the collector and reused from scrape to scrape: families,
//! their label arenas and sample vectors keep their capacity, so a steady-state
//! scrape allocates next to nothing. Label names and values of all samples of a
//! family live in one `String` arena; a sample refers to a range of it.
//!
//! Encoding goes through prometheus-client's [`Collector`] trait, so the same
//! families are written as Prometheus text 0.0.4 or OpenMetrics 1.0 by the
//! library's encoders.

use std::fmt;
use std::ops::Range;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;

/// The type of a metric family, as node_exporter declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Untyped,
    Histogram,
}

/// One sample: a label range in the family's arena and a value.
#[derive(Clone, Debug)]
struct Sample {
    /// Indices into `Family::labels`.
    labels: Range<u32>,
    value: f64,
    /// For histograms: bucket upper bounds and cumulative counts are stored in
    /// `Family::buckets[buckets]`, `value` is the sum and `count` the count.
    buckets: Range<u32>,
    count: u64,
}

/// A label: `arena[start..mid]` is the name, `arena[mid..end]` the value.
#[derive(Clone, Copy, Debug)]
struct LabelRef {
    start: u32,
    mid: u32,
    end: u32,
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    name: String,
    help: String,
    kind: Kind,
    arena: String,
    labels: Vec<LabelRef>,
    samples: Vec<Sample>,
    buckets: Vec<(f64, u64)>,
}

impl Family {
    fn new() -> Self {
        Family {
            name: String::new(),
            help: String::new(),
            kind: Kind::Gauge,
            arena: String::new(),
            labels: Vec::new(),
            samples: Vec::new(),
            buckets: Vec::new(),
        }
    }

    fn reset(&mut self, name: &str, help: &str, kind: Kind) {
        self.name.clear();
        self.name.push_str(name);
        self.help.clear();
        self.help.push_str(help);
        self.kind = kind;
        self.arena.clear();
        self.labels.clear();
        self.samples.clear();
        self.buckets.clear();
    }

    /// The full family name as exposed (counters include `_total`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    fn push_labels(&mut self, labels: &[(&str, &str)]) -> Range<u32> {
        let first = self.labels.len() as u32;
        for (k, v) in labels {
            let start = self.arena.len() as u32;
            self.arena.push_str(k);
            let mid = self.arena.len() as u32;
            self.arena.push_str(v);
            let end = self.arena.len() as u32;
            self.labels.push(LabelRef { start, mid, end });
        }
        first..self.labels.len() as u32
    }

    /// Adds a sample. Label names should be given in ascending order, as
    /// client_golang sorts them.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let labels = self.push_labels(labels);
        self.samples.push(Sample { labels, value, buckets: 0..0, count: 0 });
        self
    }

    /// Adds a histogram sample: `buckets` are (upper bound, cumulative count)
    /// pairs without the `+Inf` bucket, which is `count`.
    pub fn histogram(&mut self, labels: &[(&str, &str)], sum: f64, count: u64, buckets: &[(f64, u64)]) -> &mut Self {
        let labels = self.push_labels(labels);
        let b0 = self.buckets.len() as u32;
        self.buckets.extend_from_slice(buckets);
        let b1 = self.buckets.len() as u32;
        self.samples.push(Sample { labels, value: sum, buckets: b0..b1, count });
        self
    }

    /// Iterates over (labels, value) pairs; for tests and comparisons.
    pub fn samples(&self) -> impl Iterator<Item = (Vec<(&str, &str)>, f64)> + '_ {
        self.samples.iter().map(|s| {
            let labels = self.labels[s.labels.start as usize..s.labels.end as usize]
                .iter()
                .map(|l| (&self.arena[l.start as usize..l.mid as usize], &self.arena[l.mid as usize..l.end as usize]))
                .collect();
            (labels, s.value)
        })
    }

    fn descriptor(&self) -> (&str, MetricType) {
        match self.kind {
            Kind::Counter => (self.name.strip_suffix("_total").unwrap_or(&self.name), MetricType::Counter),
            Kind::Gauge => (self.name.as_str(), MetricType::Gauge),
            Kind::Untyped => (self.name.as_str(), MetricType::Unknown),
            Kind::Histogram => (self.name.as_str(), MetricType::Histogram),
        }
    }

    fn encode_samples(&self, family: &mut MetricEncoder) -> Result<(), fmt::Error> {
        for s in &self.samples {
            let labels = SampleLabels { family: self, range: s.labels.clone() };
            let sample = SampleValue {
                kind: self.kind,
                value: s.value,
                count: s.count,
                buckets: &self.buckets[s.buckets.start as usize..s.buckets.end as usize],
            };
            sample.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// Encodes this family, with the samples of `more` families of the same
    /// name and type appended (several collectors may share a family).
    fn encode_with(&self, more: &[&Family], encoder: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
        let (name, metric_type) = self.descriptor();
        let mut family = encoder.encode_descriptor(name, &self.help, None, metric_type)?;
        self.encode_samples(&mut family)?;
        for f in more {
            f.encode_samples(&mut family)?;
        }
        Ok(())
    }
}

struct SampleLabels<'a> {
    family: &'a Family,
    range: Range<u32>,
}

impl EncodeLabelSet for SampleLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        use std::fmt::Write;
        let f = self.family;
        for l in &f.labels[self.range.start as usize..self.range.end as usize] {
            let mut label = encoder.encode_label();
            let mut key = label.encode_label_key()?;
            key.write_str(&f.arena[l.start as usize..l.mid as usize])?;
            let mut value = key.encode_label_value()?;
            value.write_str(&f.arena[l.mid as usize..l.end as usize])?;
            value.finish()?;
        }
        Ok(())
    }
}

struct SampleValue<'a> {
    kind: Kind,
    value: f64,
    count: u64,
    buckets: &'a [(f64, u64)],
}

impl EncodeMetric for SampleValue<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        match self.kind {
            Kind::Counter => encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, f64, f64>(&self.value, None),
            Kind::Gauge | Kind::Untyped => encoder.encode_gauge(&self.value),
            Kind::Histogram => {
                // prometheus-client expects per-bucket (not cumulative) counts
                // and appends the +Inf bucket itself from the remainder.
                let mut prev = 0;
                let mut per_bucket: Vec<(f64, u64)> = Vec::with_capacity(self.buckets.len() + 1);
                for &(le, cum) in self.buckets {
                    per_bucket.push((le, cum.saturating_sub(prev)));
                    prev = cum;
                }
                per_bucket.push((f64::INFINITY, self.count.saturating_sub(prev)));
                encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(self.value, self.count, &per_bucket, None)
            }
        }
    }

    fn metric_type(&self) -> MetricType {
        match self.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Untyped => MetricType::Unknown,
            Kind::Histogram => MetricType::Histogram,
        }
    }
}

/// The families one collector produced in one scrape; reused across scrapes.
#[derive(Debug, Default)]
pub struct Sink {
    families: Vec<Family>,
    live: usize,
}

impl Sink {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets all families, keeping their allocations for reuse.
    pub fn clear(&mut self) {
        self.live = 0;
    }

    /// The family `name`, created empty if this scrape has not produced it yet.
    /// `name` is the full exposed name (counters end in `_total`).
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Family {
        // Most writes continue the family written last.
        let found = match self.live.checked_sub(1) {
            Some(last) if self.families[last].name == name => Some(last),
            _ => self.families[..self.live].iter().position(|f| f.name == name),
        };
        match found {
            Some(i) => &mut self.families[i],
            None => self.new_family(name, help, kind),
        }
    }

    /// A new family, without looking for an existing one of that name: for
    /// collectors whose family names are unique by construction (one per
    /// field of a file). A repeated name is still merged at encoding.
    pub fn new_family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Family {
        if self.live == self.families.len() {
            self.families.push(Family::new());
        }
        let i = self.live;
        self.live += 1;
        let f = &mut self.families[i];
        f.reset(name, help, kind);
        f
    }

    /// Shorthand for a new family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) {
        self.new_family(name, help, kind).sample(&[], value);
    }

    /// The families of this scrape, in the order they were first written.
    pub fn families(&self) -> &[Family] {
        &self.families[..self.live]
    }

    /// Removes the families for which `keep` returns false.
    pub fn retain(&mut self, mut keep: impl FnMut(&Family) -> bool) {
        let mut i = 0;
        while i < self.live {
            if keep(&self.families[i]) {
                i += 1;
            } else {
                self.families[i..self.live].rotate_left(1);
                self.live -= 1;
            }
        }
    }
}

/// Several sinks exposed through prometheus-client as one [`Collector`].
#[derive(Debug, Default)]
pub struct Exposition {
    pub sinks: std::sync::Mutex<Vec<Sink>>,
}

impl Collector for Exposition {
    /// Encodes every non-empty family once: a family several sinks produce
    /// (e.g. `node_ebpf_program_up` of each eBPF probe) is written under one
    /// descriptor with all their samples. A later family of the same name but
    /// another type is dropped rather than break the exposition.
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let sinks = self.sinks.lock().map_err(|_| fmt::Error)?;
        let mut seen: rustc_hash::FxHashMap<&str, usize> = rustc_hash::FxHashMap::default();
        seen.reserve(1024);
        let mut groups: Vec<(&Family, Vec<&Family>)> = Vec::with_capacity(1024);
        for f in sinks.iter().flat_map(|s| s.families()).filter(|f| !f.is_empty()) {
            match seen.get(f.name()) {
                Some(&i) if groups[i].0.kind == f.kind => groups[i].1.push(f),
                Some(_) => tracing::warn!(family = f.name(), "family produced with two different types; dropping the later"),
                None => {
                    seen.insert(f.name(), groups.len());
                    groups.push((f, Vec::new()));
                }
            }
        }
        for (first, more) in &groups {
            first.encode_with(more, &mut encoder)?;
        }
        Ok(())
    }
}

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

/// Encodes the families of `sinks` (merged as [`Exposition`] does) in
/// `format`, appending to `out`; the sinks are handed back for reuse.
pub fn encode(sinks: Vec<Sink>, format: Format, out: &mut String) -> Vec<Sink> {
    let exposition = std::sync::Arc::new(Exposition { sinks: std::sync::Mutex::new(sinks) });
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(std::sync::Arc::clone(&exposition)));
    let res = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(out, &registry),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(out, &registry),
    };
    if let Err(e) = res {
        tracing::error!(err = %e, "encoding metrics failed");
    }
    drop(registry);
    match std::sync::Arc::try_unwrap(exposition) {
        Ok(e) => e.sinks.into_inner().unwrap_or_default(),
        Err(e) => e.sinks.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;
    use std::sync::Arc;

    fn render(sink: Sink, openmetrics: bool) -> String {
        let exp = Arc::new(Exposition { sinks: std::sync::Mutex::new(vec![sink]) });
        let mut reg = Registry::default();
        reg.register_collector(Box::new(exp));
        let mut out = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &reg).unwrap();
        }
        out
    }

    #[test]
    fn encodes_text_and_openmetrics() {
        let mut s = Sink::new();
        s.family("node_cpu_seconds_total", "Seconds.", Kind::Counter).sample(&[("cpu", "0"), ("mode", "idle")], 1.5);
        s.single("node_load1", "1m load average.", Kind::Gauge, 0.25);
        s.family("node_vmstat_pgfault", "x", Kind::Untyped).sample(&[], 7.0);
        s.family("node_x_seconds", "h", Kind::Histogram).histogram(&[("a", "q\"\n")], 3.5, 5, &[(0.5, 1), (1.0, 4)]);
        let text = render(s, false);
        assert!(text.contains("# TYPE node_cpu_seconds_total counter\n"));
        assert!(text.contains("node_cpu_seconds_total{cpu=\"0\",mode=\"idle\"} 1.5\n"));
        assert!(text.contains("# TYPE node_vmstat_pgfault untyped\n"));
        assert!(text.contains("node_x_seconds_bucket{a=\"q\\\"\\n\",le=\"1\"} 4\n"), "{text}");
        assert!(text.contains("node_x_seconds_bucket{a=\"q\\\"\\n\",le=\"+Inf\"} 5\n"), "{text}");
        assert!(text.contains("node_x_seconds_count{a=\"q\\\"\\n\"} 5\n"), "{text}");
        assert!(!text.contains("# EOF"));

        let mut s = Sink::new();
        s.family("node_cpu_seconds_total", "Seconds.", Kind::Counter).sample(&[("cpu", "0")], 2.0);
        s.family("node_vmstat_pgfault", "x", Kind::Untyped).sample(&[], 7.0);
        let om = render(s, true);
        assert!(om.contains("# TYPE node_cpu_seconds counter\n"), "{om}");
        assert!(om.contains("node_cpu_seconds_total{cpu=\"0\"} 2.0\n"), "{om}");
        assert!(om.contains("# TYPE node_vmstat_pgfault unknown\n"), "{om}");
        assert!(om.ends_with("# EOF\n"));
    }

    #[test]
    fn merges_families_across_sinks() {
        let mut a = Sink::new();
        a.family("x_up", "h", Kind::Gauge).sample(&[("p", "a")], 1.0);
        let mut b = Sink::new();
        b.family("x_up", "h", Kind::Gauge).sample(&[("p", "b")], 0.0);
        b.family("x_up2", "h", Kind::Counter);
        let exp = Arc::new(Exposition { sinks: std::sync::Mutex::new(vec![a, b]) });
        let mut reg = Registry::default();
        reg.register_collector(Box::new(exp));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &reg).unwrap();
        assert_eq!(out.matches("# TYPE x_up gauge").count(), 1, "{out}");
        assert!(out.contains("x_up{p=\"a\"} 1") && out.contains("x_up{p=\"b\"} 0"), "{out}");
        assert!(!out.contains("x_up2"), "empty families are not written: {out}");
    }

    #[test]
    fn sink_reuses_families() {
        let mut s = Sink::new();
        s.single("a", "", Kind::Gauge, 1.0);
        s.single("b", "", Kind::Gauge, 2.0);
        s.clear();
        s.single("b", "", Kind::Gauge, 3.0);
        assert_eq!(s.families().len(), 1);
        assert_eq!(s.families()[0].name(), "b");
        assert_eq!(s.families()[0].samples().next().unwrap().1, 3.0);
        s.single("c", "", Kind::Gauge, 3.0);
        s.retain(|f| f.name() != "b");
        assert_eq!(s.families().len(), 1);
        assert_eq!(s.families()[0].name(), "c");
    }
}
