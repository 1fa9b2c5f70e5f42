//! Content negotiation with q-values (RFC 9110 §12.5): which exposition
//! format an `Accept` header prefers, and whether `Accept-Encoding` allows
//! gzip.

use crate::format::Format;

/// One element of an `Accept` or `Accept-Encoding` list: the value without
/// parameters, its parameters, and its q-value (1 when absent, 0 when
/// malformed).
fn elements(header: &str) -> impl Iterator<Item = (&str, Vec<(&str, &str)>, f64)> {
    header.split(',').filter_map(|el| {
        let mut parts = el.split(';').map(str::trim);
        let value = parts.next().filter(|v| !v.is_empty())?;
        let mut q = 1.0;
        let mut params = Vec::new();
        for p in parts {
            let (k, v) = p.split_once('=').map_or((p, ""), |(k, v)| (k.trim(), v.trim().trim_matches('"')));
            if k.eq_ignore_ascii_case("q") {
                q = v.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0);
            } else {
                params.push((k, v));
            }
        }
        Some((value, params, q))
    })
}

/// The q-value `accept` gives `media_type` (`type/subtype`): that of the
/// most specific matching range (exact, then `type/*`, then `*/*`); 0 when
/// none matches. Ranges with a `version` parameter match only that version.
fn quality(accept: &str, media_type: &str, version: &str) -> f64 {
    let (ty, _) = media_type.split_once('/').unwrap_or((media_type, ""));
    let mut best: Option<(u8, f64)> = None;
    for (range, params, q) in elements(accept) {
        let specificity = if range.eq_ignore_ascii_case(media_type) {
            3
        } else if range.strip_suffix("/*").is_some_and(|t| t.eq_ignore_ascii_case(ty)) {
            2
        } else if range == "*/*" {
            1
        } else {
            continue;
        };
        if params.iter().any(|(k, v)| k.eq_ignore_ascii_case("version") && *v != version) {
            continue;
        }
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, q));
        }
    }
    best.map_or(0.0, |(_, q)| q)
}

/// The format `accept` prefers: protobuf when asked for by name (see
/// [`protobuf_quality`]) with a q-value above zero and not below either
/// text format's; else OpenMetrics 1.0.0 when its q-value is above zero and
/// not below text's; text otherwise (also when nothing matches, as
/// Prometheus exporters answer anything).
pub fn format(accept: Option<&str>) -> Format {
    let Some(a) = accept else { return Format::Text };
    let om = quality(a, "application/openmetrics-text", "1.0.0").max(quality(a, "application/openmetrics-text", "0.0.1"));
    let text = quality(a, "text/plain", "0.0.4");
    let explicit_om = explicitly_openmetrics(a);
    let pb = protobuf_quality(a);
    if pb > 0.0 && pb >= text && (pb >= om || !explicit_om) {
        Format::Protobuf
    } else if om > 0.0 && om >= text && explicit_om {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// The media type of Prometheus's protobuf format, without parameters.
const PROTOBUF: &str = "application/vnd.google.protobuf";

/// The highest q-value of an `Accept` element naming the protobuf format
/// exactly: `application/vnd.google.protobuf` with
/// `proto=io.prometheus.client.MetricFamily` and `encoding=delimited` (what
/// Prometheus sends with native histograms on). Wildcards never select a
/// binary format; 0 when no element names it.
fn protobuf_quality(accept: &str) -> f64 {
    elements(accept)
        .filter(|(range, params, _)| {
            let param = |name: &str| params.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
            range.eq_ignore_ascii_case(PROTOBUF)
                && param("proto") == Some("io.prometheus.client.MetricFamily")
                && param("encoding").is_some_and(|e| e.eq_ignore_ascii_case("delimited"))
        })
        .map(|(_, _, q)| q)
        .fold(0.0, f64::max)
}

/// OpenMetrics only when asked for by name: `*/*` alone means text.
fn explicitly_openmetrics(accept: &str) -> bool {
    elements(accept).any(|(r, _, q)| q > 0.0 && (r.eq_ignore_ascii_case("application/openmetrics-text") || r == "application/*"))
}

/// Whether `Accept-Encoding` allows gzip: a `gzip` (or `x-gzip`) coding, or
/// `*`, with a q-value above zero, unless gzip itself is refused (`gzip;q=0`).
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    let Some(h) = accept_encoding else { return false };
    let mut gzip = None;
    let mut star = None;
    for (coding, _, q) in elements(h) {
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(q);
        } else if coding == "*" {
            star = Some(q);
        }
    }
    match (gzip, star) {
        (Some(q), _) => q > 0.0,
        (None, Some(q)) => q > 0.0,
        (None, None) => false,
    }
}

impl Format {
    /// Chooses the format from an Accept header by its q-values, as
    /// client_golang does (protobuf when asked for by name and preferred,
    /// OpenMetrics when it is preferred to text, text when nothing offered
    /// is acceptable).
    pub fn negotiate(accept: Option<&str>) -> Format {
        format(accept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_q_value() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(format(Some(prom)), Format::OpenMetrics);
        assert_eq!(format(Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")), Format::OpenMetrics);
        assert_eq!(format(Some("text/plain")), Format::Text);
        assert_eq!(format(None), Format::Text);
        assert_eq!(format(Some("*/*")), Format::Text);
        assert_eq!(format(Some("application/openmetrics-text;q=0")), Format::Text, "refused by q=0");
        assert_eq!(format(Some("application/openmetrics-text;q=0.2,text/plain;q=0.9")), Format::Text, "text preferred");
        assert_eq!(format(Some("application/openmetrics-text;version=9.9.9")), Format::Text, "a version we do not speak");
        assert_eq!(format(Some("application/json")), Format::Text);
    }

    #[test]
    fn protobuf_only_when_named_and_preferred() {
        // Prometheus 2.42's Accept header with --enable-feature=native-histograms
        // (scrape.go, scrapeAcceptHeaderWithProtobuf), and without it.
        let native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(format(Some(native)), Format::Protobuf);
        let classic = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(format(Some(classic)), Format::OpenMetrics);
        let pb = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";
        assert_eq!(format(Some(pb)), Format::Protobuf, "with spaces, as client_golang writes it");
        assert_eq!(
            format(Some("Application/Vnd.Google.Protobuf;Proto=io.prometheus.client.MetricFamily;Encoding=Delimited")),
            Format::Protobuf
        );
        assert_eq!(format(Some(&format!("{pb};q=0.5,text/plain;q=0.9"))), Format::Text, "text preferred");
        assert_eq!(
            format(Some(&format!("{pb};q=0.5,application/openmetrics-text;version=1.0.0"))),
            Format::OpenMetrics,
            "OpenMetrics preferred"
        );
        assert_eq!(format(Some(&format!("{pb};q=0.5,*/*"))), Format::Text, "*/* is text, preferred");
        assert_eq!(format(Some(&format!("{pb};q=0.5,*/*;q=0.1"))), Format::Protobuf);
        assert_eq!(format(Some(&format!("{pb},application/openmetrics-text;version=1.0.0"))), Format::Protobuf, "a tie goes to protobuf");
        assert_eq!(format(Some(&format!("{pb};q=0"))), Format::Text, "refused by q=0");
        assert_eq!(format(Some("application/vnd.google.protobuf")), Format::Text, "no proto=");
        assert_eq!(format(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily")), Format::Text, "no encoding=");
        assert_eq!(
            format(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text")),
            Format::Text,
            "the text encoding"
        );
        assert_eq!(
            format(Some("application/vnd.google.protobuf;proto=io.prometheus.client.Metric;encoding=delimited")),
            Format::Text,
            "another message"
        );
        assert_eq!(format(Some("application/*;q=1")), Format::OpenMetrics, "a wildcard never picks protobuf");
    }

    #[test]
    fn gzip_by_q_value() {
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("deflate, gzip;q=0.8")));
        assert!(accepts_gzip(Some("*")));
        assert!(accepts_gzip(Some("x-gzip")));
        assert!(!accepts_gzip(Some("gzip;q=0")));
        assert!(!accepts_gzip(Some("gzip;q=0.000")));
        assert!(!accepts_gzip(Some("gzipfoo")));
        assert!(!accepts_gzip(Some("*;q=0")));
        assert!(!accepts_gzip(Some("gzip;q=0, *")), "gzip refused by name");
        assert!(!accepts_gzip(Some("identity")));
        assert!(!accepts_gzip(None));
        assert!(!accepts_gzip(Some("gzip;q=x")), "a malformed q is 0");
    }
}
