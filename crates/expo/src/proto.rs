//! The Prometheus protobuf exposition: `io.prometheus.client.MetricFamily`
//! messages, each length-delimited (a varint length, then the message), as
//! Prometheus asks for first when its native histograms are on.
//!
//! The messages mirror prometheus/client_model's
//! `io/prometheus/client/metrics.proto` (proto2: every scalar is optional,
//! repeated scalars are not packed), declared by hand with prost's derive:
//! no protoc and no build script. Fields node-agent never writes
//! (summaries, exemplars, created timestamps, float histograms' counts) are
//! left out; a decoder skips them as unknown fields.

/// `io.prometheus.client.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `io.prometheus.client.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    Counter = 0,
    Gauge = 1,
    Summary = 2,
    Untyped = 3,
    Histogram = 4,
    GaugeHistogram = 5,
}

/// `io.prometheus.client.Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

/// `io.prometheus.client.Counter` (without its exemplar and created
/// timestamp).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Counter {
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

/// `io.prometheus.client.Untyped`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Untyped {
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

/// `io.prometheus.client.Histogram`: classic buckets in `bucket`, native
/// (exponential) ones in `schema` .. `positive_delta`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    #[prost(uint64, optional, tag = "1")]
    pub sample_count: Option<u64>,
    #[prost(double, optional, tag = "4")]
    pub sample_count_float: Option<f64>,
    #[prost(double, optional, tag = "2")]
    pub sample_sum: Option<f64>,
    /// Classic buckets, ascending by upper bound; the `+Inf` bucket is
    /// implicit (`sample_count`).
    #[prost(message, repeated, tag = "3")]
    pub bucket: Vec<Bucket>,
    #[prost(sint32, optional, tag = "5")]
    pub schema: Option<i32>,
    #[prost(double, optional, tag = "6")]
    pub zero_threshold: Option<f64>,
    #[prost(uint64, optional, tag = "7")]
    pub zero_count: Option<u64>,
    #[prost(double, optional, tag = "8")]
    pub zero_count_float: Option<f64>,
    #[prost(message, repeated, tag = "9")]
    pub negative_span: Vec<BucketSpan>,
    #[prost(sint64, repeated, packed = "false", tag = "10")]
    pub negative_delta: Vec<i64>,
    #[prost(double, repeated, packed = "false", tag = "11")]
    pub negative_count: Vec<f64>,
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    /// Each bucket's count minus the previous bucket's (the first's minus 0).
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    pub positive_delta: Vec<i64>,
    #[prost(double, repeated, packed = "false", tag = "14")]
    pub positive_count: Vec<f64>,
}

/// `io.prometheus.client.Bucket` (without its exemplar).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    #[prost(uint64, optional, tag = "1")]
    pub cumulative_count: Option<u64>,
    #[prost(double, optional, tag = "4")]
    pub cumulative_count_float: Option<f64>,
    #[prost(double, optional, tag = "2")]
    pub upper_bound: Option<f64>,
}

/// `io.prometheus.client.BucketSpan`: `length` consecutive buckets, `offset`
/// buckets after the end of the previous span (the first span's offset is
/// its first bucket's index).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketSpan {
    #[prost(sint32, optional, tag = "1")]
    pub offset: Option<i32>,
    #[prost(uint32, optional, tag = "2")]
    pub length: Option<u32>,
}

/// `io.prometheus.client.Metric` (without the summary).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Gauge>,
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Counter>,
    #[prost(message, optional, tag = "5")]
    pub untyped: Option<Untyped>,
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
    #[prost(int64, optional, tag = "6")]
    pub timestamp_ms: Option<i64>,
}

/// `io.prometheus.client.MetricFamily`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricFamily {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub help: Option<String>,
    #[prost(enumeration = "MetricType", optional, tag = "3")]
    pub r#type: Option<i32>,
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
    #[prost(string, optional, tag = "5")]
    pub unit: Option<String>,
}

/// Why the protobuf exposition could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("encoding a MetricFamily: {0}")]
    Encode(#[from] prost::EncodeError),
    #[error("decoding a MetricFamily: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// The spans and deltas of native buckets given as (index, count) pairs:
/// buckets of consecutive indices share a span, empty buckets are left out.
/// The pairs may come in any order, and an index may repeat (its counts
/// add up).
pub fn spans_and_deltas(buckets: &[(i32, u64)], spans: &mut Vec<BucketSpan>, deltas: &mut Vec<i64>) {
    let ascending = buckets.windows(2).all(|w| w[0].0 < w[1].0);
    let sorted;
    let buckets = if ascending {
        buckets
    } else {
        let mut v = buckets.to_vec();
        v.sort_by_key(|b| b.0);
        v.dedup_by(|b, a| {
            let same = a.0 == b.0;
            if same {
                a.1 = a.1.saturating_add(b.1);
            }
            same
        });
        sorted = v;
        sorted.as_slice()
    };
    let mut prev: i64 = 0;
    // The index right after the last bucket written.
    let mut next: Option<i32> = None;
    for &(i, n) in buckets.iter().filter(|b| b.1 > 0) {
        match (next, spans.last_mut()) {
            (Some(next), Some(span)) if i == next => span.length = Some(span.length.unwrap_or(0) + 1),
            _ => spans.push(BucketSpan { offset: Some(next.map_or(i, |next| i.saturating_sub(next))), length: Some(1) }),
        }
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        deltas.push(n.saturating_sub(prev));
        prev = n;
        next = Some(i.saturating_add(1));
    }
}

/// Appends `family` to `out`, length-delimited.
pub fn write_delimited(family: &MetricFamily, out: &mut Vec<u8>) -> Result<(), Error> {
    prost::Message::encode_length_delimited(family, out)?;
    Ok(())
}

/// Reads every length-delimited `MetricFamily` of `body`.
pub fn read_delimited(mut body: &[u8]) -> Result<Vec<MetricFamily>, Error> {
    let mut out = Vec::new();
    while !body.is_empty() {
        out.push(<MetricFamily as prost::Message>::decode_length_delimited(&mut body)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(buckets: &[(i32, u64)]) -> (Vec<(i32, u32)>, Vec<i64>) {
        let (mut s, mut d) = (Vec::new(), Vec::new());
        spans_and_deltas(buckets, &mut s, &mut d);
        (s.iter().map(|s| (s.offset.unwrap_or(0), s.length.unwrap_or(0))).collect(), d)
    }

    #[test]
    fn spans_cover_runs_and_gaps() {
        assert_eq!(spans(&[]), (vec![], vec![]));
        assert_eq!(spans(&[(-3, 2)]), (vec![(-3, 1)], vec![2]));
        // -3,-2 | gap -1,0 | 1,2,3 | gap 4 | 5
        assert_eq!(spans(&[(-3, 2), (-2, 5), (1, 1), (2, 1), (3, 4), (5, 3)]), (vec![(-3, 2), (2, 3), (1, 1)], vec![2, 3, -4, 0, 3, -1]));
        assert_eq!(spans(&[(0, 1), (1, 0), (2, 1)]), (vec![(0, 1), (1, 1)], vec![1, 0]), "an empty bucket is a gap");
        assert_eq!(spans(&[(2, 1), (0, 1), (2, 2)]), (vec![(0, 1), (1, 1)], vec![1, 2]), "unsorted and repeated indices");
    }

    #[test]
    fn the_wire_format_is_metrics_proto() {
        // Bytes written by hand from metrics.proto's field numbers and types.
        let h = Histogram {
            sample_count: Some(3),
            schema: Some(-1),
            positive_span: vec![BucketSpan { offset: Some(-2), length: Some(1) }],
            positive_delta: vec![-1],
            ..Default::default()
        };
        let mut b = Vec::new();
        prost::Message::encode(&h, &mut b).unwrap();
        // 1: varint 3; 5: sint32 -1 (zigzag 1); 12: {1: sint32 -2 (zigzag 3), 2: 1}; 13: sint64 -1 (zigzag 1), unpacked.
        assert_eq!(b, [0x08, 3, 0x28, 1, 0x62, 4, 0x08, 3, 0x10, 1, 0x68, 1]);
        let f = MetricFamily { name: Some("a".into()), r#type: Some(MetricType::Histogram as i32), ..Default::default() };
        let mut b = Vec::new();
        write_delimited(&f, &mut b).unwrap();
        assert_eq!(b, [5, 0x0a, 1, b'a', 0x18, 4]);
        assert_eq!(read_delimited(&b).unwrap(), [f]);
    }
}
