//! The exposition formats a response can have.

/// The exposition format of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4.
    Text,
    /// OpenMetrics 1.0.0.
    OpenMetrics,
    /// Prometheus's protobuf format: length-delimited
    /// `io.prometheus.client.MetricFamily` messages ([`crate::proto`]), the
    /// only one that carries native histograms.
    Protobuf,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Protobuf => "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
        }
    }
}
