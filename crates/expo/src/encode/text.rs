//! The text formats through prometheus-client's [`Collector`] trait, so
//! that the same families are written as Prometheus text 0.0.4 or
//! OpenMetrics 1.0 by the library's encoders.

use std::fmt;
use std::ops::Range;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;

use super::groups;
use crate::model::{Family, Kind, Sink, Store};

/// Several sinks exposed through prometheus-client as one [`Collector`].
#[derive(Debug, Default)]
pub struct Exposition {
    pub sinks: std::sync::Mutex<Vec<Sink>>,
    /// Escape HELP text ourselves: prometheus-client's OpenMetrics encoder
    /// writes it as given (its text 0.0.4 encoder escapes it).
    pub escape_help: bool,
}

/// OpenMetrics' escaping of a HELP text: backslash, newline and double
/// quote (OpenMetrics 1.0, "escaped-string").
pub fn escape_openmetrics(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

impl Collector for Exposition {
    /// Encodes every non-empty family once, merged across sinks as
    /// [`groups`] says.
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let sinks = self.sinks.lock().map_err(|_| fmt::Error)?;
        for ((first, store), more) in &groups(&sinks) {
            first.encode_with(store, more, &mut encoder, self.escape_help)?;
        }
        Ok(())
    }
}

impl Family {
    fn descriptor(&self) -> (&str, MetricType) {
        match self.kind {
            Kind::Counter => (self.name.strip_suffix("_total").unwrap_or(&self.name), MetricType::Counter),
            Kind::Gauge => (self.name.as_str(), MetricType::Gauge),
            Kind::Untyped => (self.name.as_str(), MetricType::Unknown),
            Kind::Histogram => (self.name.as_str(), MetricType::Histogram),
        }
    }

    fn encode_samples(&self, store: &Store, family: &mut MetricEncoder) -> Result<(), fmt::Error> {
        for s in &self.samples {
            let labels = SampleLabels { store, range: s.labels.clone() };
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
    fn encode_with(
        &self,
        store: &Store,
        more: &[(&Family, &Store)],
        encoder: &mut DescriptorEncoder,
        escape_help: bool,
    ) -> Result<(), fmt::Error> {
        let (name, metric_type) = self.descriptor();
        let escaped;
        let help = if escape_help && self.help.contains(['\\', '\n', '"']) {
            escaped = escape_openmetrics(&self.help);
            escaped.as_str()
        } else {
            self.help.as_str()
        };
        let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
        self.encode_samples(store, &mut family)?;
        for (f, st) in more {
            f.encode_samples(st, &mut family)?;
        }
        Ok(())
    }
}

struct SampleLabels<'a> {
    store: &'a Store,
    range: Range<u32>,
}

impl EncodeLabelSet for SampleLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
        use std::fmt::Write;
        for (k, v) in self.store.labels(&self.range) {
            let mut label = encoder.encode_label();
            let mut key = label.encode_label_key()?;
            key.write_str(k)?;
            let mut value = key.encode_label_value()?;
            value.write_str(v)?;
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
