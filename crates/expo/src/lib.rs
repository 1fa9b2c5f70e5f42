//! Exposition: what collectors write and how it is served. Each module has
//! one job, and imports point one way (model ← conflict, format ←
//! negotiate, model + format ← encode):
//!
//! - [`model`]: the [`Sink`] a collector writes one scrape's families into,
//!   reused from scrape to scrape.
//! - [`conflict`]: which family wins when two sinks produce one name
//!   ([`reconcile`]).
//! - [`format`]: the exposition formats ([`Format`]); [`negotiate`]: which
//!   one an `Accept` header prefers, and whether gzip is allowed.
//! - [`encode`]: families to bytes, as Prometheus text 0.0.4 or OpenMetrics
//!   1.0 through prometheus-client ([`encode()`]), and as Prometheus's
//!   protobuf format ([`encode_to`]).
//! - [`proto`]: the `io.prometheus.client` messages of the protobuf format
//!   (prost), with native histograms' spans and deltas.
//! - [`text`]: a strict parser of the text format (textfiles, health gates,
//!   conformance tests).

pub mod conflict;
pub mod encode;
pub mod format;
pub mod model;
pub mod negotiate;
pub mod proto;
pub mod text;

pub use conflict::{reconcile, Conflict};
pub use encode::{encode, encode_to, Exposition};
pub use format::Format;
pub use model::{Family, FamilyMut, FamilyRef, Kind, Native, NativeSample, Sink};
