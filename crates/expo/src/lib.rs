//! Exposition: what collectors write and how it is served.
//!
//! - [`sink`]: the [`Sink`] a collector writes one scrape's families into,
//!   reused from scrape to scrape, and its encoding through
//!   prometheus-client ([`encode`]), as Prometheus text 0.0.4 or
//!   OpenMetrics 1.0, and as Prometheus's protobuf format ([`encode_to`]).
//! - [`proto`]: the `io.prometheus.client` messages of the protobuf format
//!   (prost), with native histograms' spans and deltas.
//! - [`text`]: a strict parser of the text format (textfiles, health gates,
//!   conformance tests).

pub mod negotiate;
pub mod proto;
pub mod sink;
pub mod text;

pub use sink::{
    encode, encode_to, reconcile, Conflict, Exposition, Family, FamilyMut, FamilyRef, Format, Kind, Native, NativeSample, Sink,
};
