//! Families to bytes: the text formats (Prometheus text 0.0.4 and
//! OpenMetrics 1.0) through prometheus-client ([`text`]), and Prometheus's
//! protobuf format ([`protobuf`]). Families several sinks produce are
//! merged the same way in every format ([`groups`]).

use crate::format::Format;
use crate::model::{Family, Sink, Store};

pub mod protobuf;
pub mod text;

pub use text::{escape_openmetrics, Exposition};

/// A family and the families of the same name and type from later sinks.
pub(crate) type Group<'a> = ((&'a Family, &'a Store), Vec<(&'a Family, &'a Store)>);

/// Every non-empty family of `sinks` once, in the order first written: a
/// family several sinks produce (e.g. `node_ebpf_program_up` of each eBPF
/// probe) is one group with all their samples. A later family of the same
/// name but another type is dropped rather than break the exposition.
pub(crate) fn groups(sinks: &[Sink]) -> Vec<Group<'_>> {
    let mut seen: rustc_hash::FxHashMap<&str, usize> = rustc_hash::FxHashMap::default();
    seen.reserve(1024);
    let mut groups: Vec<Group<'_>> = Vec::with_capacity(1024);
    for (f, store) in sinks.iter().flat_map(|s| s.live_families().iter().map(move |f| (f, &s.store))).filter(|(f, _)| !f.is_empty()) {
        match seen.get(f.name()) {
            Some(&i) if groups[i].0 .0.kind == f.kind => groups[i].1.push((f, store)),
            Some(_) => tracing::warn!(family = f.name(), "family produced with two different types; dropping the later"),
            None => {
                seen.insert(f.name(), groups.len());
                groups.push(((f, store), Vec::new()));
            }
        }
    }
    groups
}

/// Encodes the families of `sinks` (merged as [`Exposition`] does) in a
/// text format, appending to `out`; the sinks are handed back for reuse.
/// [`Format::Protobuf`] is binary: it goes through [`encode_to`], and here
/// writes nothing (logged as an error).
pub fn encode(sinks: Vec<Sink>, format: Format, out: &mut String) -> Vec<Sink> {
    if format == Format::Protobuf {
        tracing::error!("the protobuf format is binary: encode it with expo::encode_to");
        return sinks;
    }
    let exposition = std::sync::Arc::new(Exposition { sinks: std::sync::Mutex::new(sinks), escape_help: format == Format::OpenMetrics });
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(std::sync::Arc::clone(&exposition)));
    let res = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(out, &registry),
        Format::Text | Format::Protobuf => prometheus_client::encoding::prometheus_text::encode(out, &registry),
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

/// Encodes the families of `sinks` (merged as [`Exposition`] does) in any
/// format, appending bytes to `out`; the sinks are handed back for reuse.
pub fn encode_to(sinks: Vec<Sink>, format: Format, out: &mut Vec<u8>) -> Vec<Sink> {
    match format {
        Format::Protobuf => {
            if let Err(e) = protobuf::encode(&sinks, out) {
                tracing::error!(err = %e, "encoding metrics failed");
            }
            sinks
        }
        Format::Text | Format::OpenMetrics => match String::from_utf8(std::mem::take(out)) {
            // The usual case: `out` is empty (or text), and its buffer is reused.
            Ok(mut text) => {
                let sinks = encode(sinks, format, &mut text);
                *out = text.into_bytes();
                sinks
            }
            Err(e) => {
                *out = e.into_bytes();
                let mut text = String::new();
                let sinks = encode(sinks, format, &mut text);
                out.extend_from_slice(text.as_bytes());
                sinks
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, Native};
    use prometheus_client::registry::Registry;
    use std::sync::Arc;

    fn render(sink: Sink, openmetrics: bool) -> String {
        let mut out = String::new();
        encode(vec![sink], if openmetrics { Format::OpenMetrics } else { Format::Text }, &mut out);
        out
    }

    #[test]
    fn help_and_label_values_are_escaped_as_each_format_says() {
        let sink = || {
            let mut s = Sink::new();
            s.family("tf_esc", "a \n b \\ \"q\"", Kind::Gauge).sample(&[("l", "x\ny\\z\"w\"")], 1.0);
            s
        };
        let text = render(sink(), false);
        assert!(text.contains("# HELP tf_esc a \\n b \\\\ \"q\"\n"), "text 0.0.4 escapes backslash and newline in HELP: {text}");
        assert!(text.contains("tf_esc{l=\"x\\ny\\\\z\\\"w\\\"\"} 1"), "{text}");
        let om = render(sink(), true);
        assert!(om.contains("# HELP tf_esc a \\n b \\\\ \\\"q\\\"\n"), "OpenMetrics escapes the quote too: {om}");
        assert!(om.contains("tf_esc{l=\"x\\ny\\\\z\\\"w\\\"\"} 1"), "{om}");
        for out in [&text, &om] {
            assert_eq!(out.lines().filter(|l| l.starts_with("tf_esc")).count(), 1, "no raw line break: {out}");
        }
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
    fn native_histograms_give_exact_classic_buckets_at_schema_boundaries() {
        // Schema 3: bucket 8 is (2^(7/8), 2], bucket 9 (2, 2^(9/8)], ...
        let native = Native { schema: 3, zero_threshold: 0.0, zero_count: 1, buckets: &[(-8, 2), (0, 3), (8, 4), (9, 0), (16, 5)] };
        let mut classic = Vec::new();
        native.classic(&[0.5, 1.0, 2.0, 3.0, 4.0], &mut classic);
        assert_eq!(classic, [(0.5, 3), (1.0, 6), (2.0, 10), (3.0, 10), (4.0, 15)]);
        assert!((Native::upper(3, 9) - 2f64.powf(9.0 / 8.0)).abs() < 1e-12);
        let mut s = Sink::new();
        s.family("x_seconds", "h", Kind::Histogram).native_histogram(&[("f", "a")], 9.0, 15, &native, &[1.0, 2.0]);
        let text = render(s, false);
        assert!(text.contains("x_seconds_bucket{f=\"a\",le=\"1\"} 6\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{f=\"a\",le=\"2\"} 10\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{f=\"a\",le=\"+Inf\"} 15\n"), "{text}");
        let mut s = Sink::new();
        s.family("x_seconds", "h", Kind::Histogram).native_histogram(&[], 9.0, 15, &native, &[1.0]);
        let fams = s.families();
        let (n, b) = fams[0].natives().next().expect("stored");
        assert_eq!((n.sample, n.schema, n.zero_count), (0, 3, 1));
        assert_eq!(b, [(-8, 2), (0, 3), (8, 4), (16, 5)], "empty buckets are left out");
    }

    fn protobuf(sinks: Vec<Sink>) -> Vec<crate::proto::MetricFamily> {
        let mut out = Vec::new();
        encode_to(sinks, Format::Protobuf, &mut out);
        crate::proto::read_delimited(&out).expect("our own output decodes")
    }

    fn labels(m: &crate::proto::Metric) -> Vec<(&str, &str)> {
        m.label.iter().map(|l| (l.name.as_deref().unwrap_or(""), l.value.as_deref().unwrap_or(""))).collect()
    }

    fn spans(h: &crate::proto::Histogram) -> Vec<(i32, u32)> {
        h.positive_span.iter().map(|s| (s.offset.unwrap_or(99), s.length.unwrap_or(99))).collect()
    }

    #[test]
    fn protobuf_counters_gauges_untyped_and_classic_histograms() {
        use crate::proto::MetricType;
        let mut s = Sink::new();
        s.family("node_cpu_seconds_total", "Seconds \\ \"spent\".", Kind::Counter)
            .sample(&[("cpu", "0"), ("mode", "idle")], 1.5)
            .sample(&[("cpu", "1"), ("mode", "idle")], 2.5);
        s.single("node_load1", "1m load average.", Kind::Gauge, 0.25);
        s.family("node_vmstat_pgfault", "x", Kind::Untyped).sample(&[], 7.0);
        s.family("node_empty", "x", Kind::Gauge);
        s.family("node_x_seconds", "h", Kind::Histogram).histogram(&[("a", "q\"\n")], 3.5, 5, &[(0.5, 1), (1.0, 4)]);
        let fams = protobuf(vec![s]);
        let names: Vec<&str> = fams.iter().map(|f| f.name.as_deref().unwrap_or("")).collect();
        assert_eq!(
            names,
            ["node_cpu_seconds_total", "node_load1", "node_vmstat_pgfault", "node_x_seconds"],
            "counters keep _total, as client_golang; empty families are left out"
        );
        let types: Vec<i32> = fams.iter().map(|f| f.r#type.unwrap_or(-1)).collect();
        assert_eq!(types, [MetricType::Counter, MetricType::Gauge, MetricType::Untyped, MetricType::Histogram].map(|t| t as i32));
        assert_eq!(fams[0].help.as_deref(), Some("Seconds \\ \"spent\"."), "HELP as given, unescaped");
        let cpu = &fams[0].metric;
        assert_eq!(cpu.len(), 2);
        assert_eq!(labels(&cpu[1]), [("cpu", "1"), ("mode", "idle")]);
        assert_eq!(cpu[1].counter.as_ref().and_then(|c| c.value), Some(2.5));
        assert!(cpu[1].gauge.is_none() && cpu[1].untyped.is_none() && cpu[1].histogram.is_none());
        assert_eq!(fams[1].metric[0].gauge.as_ref().and_then(|g| g.value), Some(0.25));
        assert!(fams[1].metric[0].label.is_empty());
        assert_eq!(fams[2].metric[0].untyped.as_ref().and_then(|g| g.value), Some(7.0));
        let m = &fams[3].metric[0];
        assert_eq!(labels(m), [("a", "q\"\n")], "label values unescaped");
        let h = m.histogram.as_ref().expect("histogram");
        assert_eq!((h.sample_count, h.sample_sum), (Some(5), Some(3.5)));
        let b: Vec<(Option<f64>, Option<u64>)> = h.bucket.iter().map(|b| (b.upper_bound, b.cumulative_count)).collect();
        assert_eq!(b, [(Some(0.5), Some(1)), (Some(1.0), Some(4))], "cumulative, +Inf implicit");
        assert!(
            h.schema.is_none() && h.zero_threshold.is_none() && h.positive_span.is_empty() && h.positive_delta.is_empty(),
            "a classic histogram has no native fields: {h:?}"
        );
    }

    #[test]
    fn protobuf_native_histograms_spans_deltas_zero_bucket() {
        let mut s = Sink::new();
        let gaps = Native {
            schema: 3,
            zero_threshold: 1e-9,
            zero_count: 2,
            buckets: &[(-8, 2), (-7, 3), (0, 3), (1, 0), (8, 4), (9, 1), (10, 1), (16, 5)],
        };
        let zero_only = Native { schema: 0, zero_threshold: 0.001, zero_count: 4, buckets: &[] };
        let empty = Native { schema: 5, zero_threshold: 0.0, zero_count: 0, buckets: &[(3, 0)] };
        s.family("x_seconds", "h", Kind::Histogram)
            .histogram(&[("k", "classic")], 1.0, 1, &[(1.0, 1)])
            .native_histogram(&[("k", "gaps")], 70.0, 21, &gaps, &[1.0, 2.0])
            .native_histogram(&[("k", "zero")], 0.0, 4, &zero_only, &[])
            .native_histogram(&[("k", "empty")], 0.0, 0, &empty, &[1.0]);
        let fams = protobuf(vec![s]);
        let ms = &fams[0].metric;
        assert_eq!(ms.len(), 4);
        let h = |i: usize| ms[i].histogram.as_ref().expect("histogram");
        assert!(h(0).schema.is_none() && h(0).positive_span.is_empty(), "the classic sample stays classic");

        let g = h(1);
        assert_eq!((g.schema, g.zero_threshold, g.zero_count), (Some(3), Some(1e-9), Some(2)));
        assert_eq!((g.sample_count, g.sample_sum), (Some(21), Some(70.0)));
        // -8,-7 | gap -6..=-1 | 0 | 1 is empty: gap 1..=7 | 8,9,10 | gap 11..=15 | 16
        assert_eq!(spans(g), [(-8, 2), (6, 1), (7, 3), (5, 1)]);
        assert_eq!(g.positive_delta, [2, 1, 0, 1, -3, 0, 4]);
        assert!(g.negative_span.is_empty() && g.negative_delta.is_empty());
        let b: Vec<(Option<f64>, Option<u64>)> = g.bucket.iter().map(|b| (b.upper_bound, b.cumulative_count)).collect();
        assert_eq!(b, [(Some(1.0), Some(10)), (Some(2.0), Some(14))], "and the classic buckets derived from the native ones");

        let z = h(2);
        assert_eq!((z.schema, z.zero_threshold, z.zero_count), (Some(0), Some(0.001), Some(4)));
        assert_eq!(spans(z), [(0, 0)], "no bucket: a no-op span");
        assert!(z.positive_delta.is_empty());

        let e = h(3);
        assert_eq!((e.schema, e.sample_count, e.zero_count), (Some(5), Some(0), Some(0)));
        assert_eq!(spans(e), [(0, 0)], "an empty native histogram is marked by a no-op span");
        assert!(e.positive_delta.is_empty());
    }

    #[test]
    fn protobuf_merges_families_across_sinks_as_text_does() {
        let mut a = Sink::new();
        a.family("x_up", "h", Kind::Gauge).sample(&[("p", "a")], 1.0);
        let native = Native { schema: 0, zero_threshold: 0.0, zero_count: 0, buckets: &[(1, 2)] };
        a.family("x_seconds", "h", Kind::Histogram).native_histogram(&[("p", "a")], 1.5, 2, &native, &[]);
        let mut b = Sink::new();
        b.family("x_up", "h", Kind::Gauge).sample(&[("p", "b")], 0.0);
        b.family("x_up2", "h", Kind::Counter);
        b.family("x_seconds", "h", Kind::Histogram).native_histogram(&[("p", "b")], 3.0, 1, &Native { buckets: &[(2, 1)], ..native }, &[]);
        b.family("x_seconds", "other type", Kind::Gauge);
        let mut c = Sink::new();
        c.family("x_seconds", "other type", Kind::Gauge).sample(&[], 1.0);
        let fams = protobuf(vec![a, b, c]);
        let names: Vec<&str> = fams.iter().map(|f| f.name.as_deref().unwrap_or("")).collect();
        assert_eq!(names, ["x_up", "x_seconds"], "one family per name; the later type is dropped");
        assert_eq!(fams[0].metric.iter().map(|m| labels(m)[0].1).collect::<Vec<_>>(), ["a", "b"]);
        let hs: Vec<_> = fams[1].metric.iter().filter_map(|m| m.histogram.as_ref()).collect();
        assert_eq!(hs.len(), 2);
        assert_eq!((spans(hs[0]), hs[0].positive_delta.clone()), (vec![(1, 1)], vec![2]), "each sample keeps its own native buckets");
        assert_eq!((spans(hs[1]), hs[1].positive_delta.clone()), (vec![(2, 1)], vec![1]));
    }

    #[test]
    fn text_output_is_unchanged_by_the_protobuf_path() {
        let sink = || {
            let mut s = Sink::new();
            s.family("node_cpu_seconds_total", "Seconds.", Kind::Counter).sample(&[("cpu", "0")], 1.5);
            s.single("node_load1", "1m load average.", Kind::Gauge, 0.25);
            let native = Native { schema: 3, zero_threshold: 0.0, zero_count: 1, buckets: &[(0, 3), (8, 4)] };
            s.family("x_seconds", "h", Kind::Histogram).native_histogram(&[("f", "a")], 9.0, 8, &native, &[1.0, 2.0]);
            s
        };
        let expected = "# HELP node_cpu_seconds_total Seconds.\n# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu=\"0\"} 1.5\n\
                        # HELP node_load1 1m load average.\n# TYPE node_load1 gauge\nnode_load1 0.25\n\
                        # HELP x_seconds h\n# TYPE x_seconds histogram\n\
                        x_seconds_bucket{f=\"a\",le=\"1\"} 4\nx_seconds_bucket{f=\"a\",le=\"2\"} 8\nx_seconds_bucket{f=\"a\",le=\"+Inf\"} 8\n\
                        x_seconds_sum{f=\"a\"} 9.0\nx_seconds_count{f=\"a\"} 8\n";
        assert_eq!(render(sink(), false), expected);
        for format in [Format::Text, Format::OpenMetrics] {
            let mut text = String::new();
            encode(vec![sink()], format, &mut text);
            let mut bytes = Vec::new();
            encode_to(vec![sink()], format, &mut bytes);
            assert_eq!(String::from_utf8(bytes).expect("utf-8"), text, "encode_to writes what encode writes in {format:?}");
        }
        let mut nothing = String::new();
        let back = encode(vec![sink()], Format::Protobuf, &mut nothing);
        assert!(nothing.is_empty() && back.len() == 1, "no protobuf in a String, and the sink comes back");
    }

    #[test]
    fn merges_families_across_sinks() {
        let mut a = Sink::new();
        a.family("x_up", "h", Kind::Gauge).sample(&[("p", "a")], 1.0);
        let mut b = Sink::new();
        b.family("x_up", "h", Kind::Gauge).sample(&[("p", "b")], 0.0);
        b.family("x_up2", "h", Kind::Counter);
        let exp = Arc::new(Exposition { sinks: std::sync::Mutex::new(vec![a, b]), escape_help: false });
        let mut reg = Registry::default();
        reg.register_collector(Box::new(exp));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &reg).unwrap();
        assert_eq!(out.matches("# TYPE x_up gauge").count(), 1, "{out}");
        assert!(out.contains("x_up{p=\"a\"} 1") && out.contains("x_up{p=\"b\"} 0"), "{out}");
        assert!(!out.contains("x_up2"), "empty families are not written: {out}");
    }
}
