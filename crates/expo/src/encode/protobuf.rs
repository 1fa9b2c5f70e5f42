//! Prometheus's protobuf format: every family as a length-delimited
//! `io.prometheus.client.MetricFamily` message ([`crate::proto`]).

use super::groups;
use crate::model::{Family, Kind, Sink, Store};

/// Every family of `sinks`, merged as the text formats merge them, as
/// length-delimited `MetricFamily` messages.
pub(crate) fn encode(sinks: &[Sink], out: &mut Vec<u8>) -> Result<(), crate::proto::Error> {
    let mut message = crate::proto::MetricFamily::default();
    for ((first, store), more) in &groups(sinks) {
        message.name = Some(first.name.clone());
        message.help = Some(first.help.clone());
        message.r#type = Some(first.proto_type() as i32);
        message.metric.clear();
        first.proto_samples(store, &mut message.metric);
        for (f, st) in more {
            f.proto_samples(st, &mut message.metric);
        }
        crate::proto::write_delimited(&message, out)?;
    }
    Ok(())
}

impl Family {
    fn proto_type(&self) -> crate::proto::MetricType {
        use crate::proto::MetricType;
        match self.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Untyped => MetricType::Untyped,
            Kind::Histogram => MetricType::Histogram,
        }
    }

    /// This family's samples as `Metric` messages. Counters keep their
    /// `_total` in the family name, as client_golang writes them.
    fn proto_samples(&self, store: &Store, out: &mut Vec<crate::proto::Metric>) {
        use crate::proto::{Bucket, BucketSpan, Counter, Gauge, Histogram, LabelPair, Metric, Untyped};
        // Native histograms are stored by ascending sample index.
        let mut natives = self.natives.iter().peekable();
        for (index, s) in self.samples.iter().enumerate() {
            let mut m = Metric {
                label: store.labels(&s.labels).map(|(k, v)| LabelPair { name: Some(k.to_owned()), value: Some(v.to_owned()) }).collect(),
                ..Default::default()
            };
            match self.kind {
                Kind::Counter => m.counter = Some(Counter { value: Some(s.value) }),
                Kind::Gauge => m.gauge = Some(Gauge { value: Some(s.value) }),
                Kind::Untyped => m.untyped = Some(Untyped { value: Some(s.value) }),
                Kind::Histogram => {
                    let mut h = Histogram {
                        sample_count: Some(s.count),
                        sample_sum: Some(s.value),
                        // Without `+Inf`: its count is the sample count.
                        bucket: self.buckets[s.buckets.start as usize..s.buckets.end as usize]
                            .iter()
                            .filter(|(le, _)| *le < f64::INFINITY)
                            .map(|&(le, cum)| Bucket { cumulative_count: Some(cum), upper_bound: Some(le), ..Default::default() })
                            .collect(),
                        ..Default::default()
                    };
                    while natives.next_if(|n| (n.sample as usize) < index).is_some() {}
                    if let Some(n) = natives.next_if(|n| n.sample as usize == index) {
                        h.schema = Some(i32::from(n.schema));
                        h.zero_threshold = Some(n.zero_threshold);
                        h.zero_count = Some(n.zero_count);
                        let buckets = &self.native_buckets[n.buckets.start as usize..n.buckets.end as usize];
                        crate::proto::spans_and_deltas(buckets, &mut h.positive_span, &mut h.positive_delta);
                        if h.positive_span.is_empty() {
                            // metrics.proto: a no-op span marks a native
                            // histogram without observations.
                            h.positive_span.push(BucketSpan { offset: Some(0), length: Some(0) });
                        }
                    }
                    m.histogram = Some(h);
                }
            }
            out.push(m);
        }
    }
}
