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

/// One sample: a label range in its sink's label store and a value.
#[derive(Clone, Debug)]
struct Sample {
    /// Indices into `Store::refs`.
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

/// How many recent label sets a sink remembers to share them: a collector
/// that writes the same labels to several families (a mount's size, free,
/// avail, ...; a disk's twenty counters) stores them once.
const RECENT: usize = 4;

/// The label names and values of every sample of a sink, in one arena.
#[derive(Debug, Default)]
struct Store {
    arena: String,
    refs: Vec<LabelRef>,
    /// The recent label sets and their fingerprints.
    recent: [(Range<u32>, u64); RECENT],
    next: usize,
}

/// A cheap digest of a label set (how many labels, their lengths, the last
/// bytes of each value), compared before the strings are: most label sets
/// differ from every recent one (a pod's labels recur only once every pod
/// has had its sample), and then no byte of them is compared.
fn fingerprint(labels: &[(&str, &str)]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = labels.len() as u64;
    for (k, v) in labels {
        let b = v.as_bytes();
        let tail = match b.len() {
            n if n >= 8 => u64::from_le_bytes([b[n - 8], b[n - 7], b[n - 6], b[n - 5], b[n - 4], b[n - 3], b[n - 2], b[n - 1]]),
            _ => b.iter().fold(0, |t, &c| t << 8 | u64::from(c)),
        };
        h = (h ^ ((k.len() as u64) << 32 | b.len() as u64)).wrapping_mul(K);
        h = (h ^ tail).wrapping_mul(K);
    }
    h
}

impl Store {
    fn clear(&mut self) {
        self.arena.clear();
        self.refs.clear();
        self.recent = Default::default();
        self.next = 0;
    }

    fn label(&self, l: &LabelRef) -> (&str, &str) {
        (&self.arena[l.start as usize..l.mid as usize], &self.arena[l.mid as usize..l.end as usize])
    }

    fn labels(&self, r: &Range<u32>) -> impl Iterator<Item = (&str, &str)> {
        self.refs[r.start as usize..r.end as usize].iter().map(|l| self.label(l))
    }

    fn same(&self, r: &Range<u32>, labels: &[(&str, &str)]) -> bool {
        r.len() == labels.len() && self.labels(r).zip(labels).all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    }

    /// Stores `labels` (or finds them among the recent sets) and returns
    /// their range.
    fn push(&mut self, labels: &[(&str, &str)]) -> Range<u32> {
        if labels.is_empty() {
            return 0..0;
        }
        let fp = fingerprint(labels);
        if let Some((r, _)) = self.recent.iter().find(|(r, f)| *f == fp && self.same(r, labels)) {
            return r.clone();
        }
        let first = self.refs.len() as u32;
        for (k, v) in labels {
            let start = self.arena.len() as u32;
            self.arena.push_str(k);
            let mid = self.arena.len() as u32;
            self.arena.push_str(v);
            let end = self.arena.len() as u32;
            self.refs.push(LabelRef { start, mid, end });
        }
        let r = first..self.refs.len() as u32;
        self.recent[self.next] = (r.clone(), fp);
        self.next = (self.next + 1) % RECENT;
        r
    }
}

/// One metric family.
#[derive(Debug)]
pub struct Family {
    name: String,
    help: String,
    kind: Kind,
    samples: Vec<Sample>,
    buckets: Vec<(f64, u64)>,
    /// The native (exponential) buckets of the histogram samples that have
    /// them, by sample index.
    natives: Vec<NativeSample>,
    native_buckets: Vec<(i32, u64)>,
}

/// A native histogram's buckets, as [`FamilyMut::native_histogram`] takes
/// them: Prometheus's exponential buckets of `schema` (bucket `i` counts
/// values in `(2^((i-1)·2^-schema), 2^(i·2^-schema)]`), with the values at
/// or below `zero_threshold` counted in `zero_count`.
#[derive(Clone, Copy, Debug)]
pub struct Native<'a> {
    pub schema: i8,
    pub zero_threshold: f64,
    pub zero_count: u64,
    /// (bucket index, count): ascending indices, per-bucket (not
    /// cumulative) counts; empty buckets may be left out.
    pub buckets: &'a [(i32, u64)],
}

/// A native histogram as stored: `buckets` index `Family::native_buckets`.
#[derive(Clone, Debug)]
pub struct NativeSample {
    pub sample: u32,
    pub schema: i8,
    pub zero_threshold: f64,
    pub zero_count: u64,
    buckets: Range<u32>,
}

impl Native<'_> {
    /// The upper bound of bucket `i`.
    pub fn upper(schema: i8, i: i32) -> f64 {
        (f64::from(i) * (-f64::from(schema)).exp2()).exp2()
    }

    /// Cumulative counts at the classic upper bounds `bounds` (ascending;
    /// each should be a bucket boundary of the schema, or the count is that
    /// of the buckets wholly below it).
    pub fn classic(&self, bounds: &[f64], out: &mut Vec<(f64, u64)>) {
        let mut cum = self.zero_count;
        let mut it = self.buckets.iter().peekable();
        for &b in bounds {
            // A bucket counts below `b` when its upper bound is `b` or less
            // (with room for rounding of the power).
            while let Some(&&(i, n)) = it.peek() {
                if Native::upper(self.schema, i) <= b * (1.0 + 1e-12) {
                    cum += n;
                    it.next();
                } else {
                    break;
                }
            }
            out.push((b, cum));
        }
    }
}

impl Family {
    fn new() -> Self {
        Family {
            name: String::new(),
            help: String::new(),
            kind: Kind::Gauge,
            samples: Vec::new(),
            buckets: Vec::new(),
            natives: Vec::new(),
            native_buckets: Vec::new(),
        }
    }

    fn reset(&mut self, name: &str, help: &str, kind: Kind) {
        self.name.clear();
        self.name.push_str(name);
        self.help.clear();
        self.help.push_str(help);
        self.kind = kind;
        self.samples.clear();
        self.buckets.clear();
        self.natives.clear();
        self.native_buckets.clear();
    }

    /// The full family name as exposed (counters include `_total`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn help(&self) -> &str {
        &self.help
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

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

/// A family being written: samples go to the family, labels to its sink's store.
pub struct FamilyMut<'a> {
    family: &'a mut Family,
    store: &'a mut Store,
}

impl FamilyMut<'_> {
    /// Adds a sample. Label names should be given in ascending order, as
    /// client_golang sorts them.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        let labels = self.store.push(labels);
        self.family.samples.push(Sample { labels, value, buckets: 0..0, count: 0 });
        self
    }

    /// Adds a histogram sample: `buckets` are (upper bound, cumulative count)
    /// pairs without the `+Inf` bucket, which is `count`.
    pub fn histogram(&mut self, labels: &[(&str, &str)], sum: f64, count: u64, buckets: &[(f64, u64)]) -> &mut Self {
        let labels = self.store.push(labels);
        let b0 = self.family.buckets.len() as u32;
        self.family.buckets.extend_from_slice(buckets);
        let b1 = self.family.buckets.len() as u32;
        self.family.samples.push(Sample { labels, value: sum, buckets: b0..b1, count });
        self
    }

    /// Adds a histogram sample with native buckets. Text formats (and
    /// classic scrapers) see classic buckets at `classic` upper bounds
    /// (without `+Inf`), counted from the native buckets: choose bounds that
    /// are boundaries of the schema (powers of two are, for every schema
    /// >= 0) so that they are exact.
    pub fn native_histogram(&mut self, labels: &[(&str, &str)], sum: f64, count: u64, native: &Native, classic: &[f64]) -> &mut Self {
        let labels = self.store.push(labels);
        let b0 = self.family.buckets.len() as u32;
        native.classic(classic, &mut self.family.buckets);
        let b1 = self.family.buckets.len() as u32;
        let n0 = self.family.native_buckets.len() as u32;
        self.family.native_buckets.extend(native.buckets.iter().filter(|(_, n)| *n > 0));
        let n1 = self.family.native_buckets.len() as u32;
        self.family.natives.push(NativeSample {
            sample: self.family.samples.len() as u32,
            schema: native.schema,
            zero_threshold: native.zero_threshold,
            zero_count: native.zero_count,
            buckets: n0..n1,
        });
        self.family.samples.push(Sample { labels, value: sum, buckets: b0..b1, count });
        self
    }

    /// Room for `samples` more samples.
    pub fn reserve(&mut self, samples: usize) -> &mut Self {
        self.family.samples.reserve(samples);
        self
    }

    pub fn len(&self) -> usize {
        self.family.len()
    }

    pub fn is_empty(&self) -> bool {
        self.family.is_empty()
    }
}

/// A family as written, with its labels: for tests and comparisons.
#[derive(Clone, Copy)]
pub struct FamilyRef<'a> {
    family: &'a Family,
    store: &'a Store,
}

impl<'a> FamilyRef<'a> {
    pub fn name(&self) -> &'a str {
        &self.family.name
    }

    pub fn kind(&self) -> Kind {
        self.family.kind
    }

    pub fn help(&self) -> &'a str {
        &self.family.help
    }

    pub fn len(&self) -> usize {
        self.family.len()
    }

    pub fn is_empty(&self) -> bool {
        self.family.is_empty()
    }

    /// The native histograms of the family's samples (by sample index),
    /// each with its (bucket index, count) pairs.
    pub fn natives(&self) -> impl Iterator<Item = (&'a NativeSample, &'a [(i32, u64)])> + 'a {
        let f = self.family;
        f.natives.iter().map(move |n| (n, &f.native_buckets[n.buckets.start as usize..n.buckets.end as usize]))
    }

    /// Iterates over (labels, value) pairs.
    pub fn samples(&self) -> impl Iterator<Item = (Vec<(&'a str, &'a str)>, f64)> + 'a {
        let store = self.store;
        self.family.samples.iter().map(move |s| (store.labels(&s.labels).collect(), s.value))
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

/// The families one collector produced in one scrape; reused across scrapes.
#[derive(Debug, Default)]
pub struct Sink {
    families: Vec<Family>,
    live: usize,
    store: Store,
    /// User data (textfiles): its families never displace a collector's,
    /// and this gauge of its own is set to 1 when one is dropped.
    untrusted: Option<&'static str>,
}

impl Sink {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets all families, keeping their allocations for reuse.
    pub fn clear(&mut self) {
        self.live = 0;
        self.store.clear();
    }

    /// The family `name`, created empty if this scrape has not produced it yet.
    /// `name` is the full exposed name (counters end in `_total`).
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> FamilyMut<'_> {
        // Most writes continue the family written last.
        let found = match self.live.checked_sub(1) {
            Some(last) if self.families[last].name == name => Some(last),
            _ => self.families[..self.live].iter().position(|f| f.name == name),
        };
        match found {
            Some(i) => FamilyMut { family: &mut self.families[i], store: &mut self.store },
            None => self.new_family(name, help, kind),
        }
    }

    /// A new family, without looking for an existing one of that name: for
    /// collectors whose family names are unique by construction (one per
    /// field of a file). A repeated name is still merged at encoding.
    pub fn new_family(&mut self, name: &str, help: &str, kind: Kind) -> FamilyMut<'_> {
        if self.live == self.families.len() {
            self.families.push(Family::new());
        }
        let i = self.live;
        self.live += 1;
        let f = &mut self.families[i];
        f.reset(name, help, kind);
        FamilyMut { family: f, store: &mut self.store }
    }

    /// The family at index `i` of this scrape's [`families`](Self::families).
    pub fn family_at(&mut self, i: usize) -> Option<FamilyMut<'_>> {
        let store = &mut self.store;
        self.families[..self.live].get_mut(i).map(|family| FamilyMut { family, store })
    }

    /// Shorthand for a new family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) {
        self.new_family(name, help, kind).sample(&[], value);
    }

    /// The families of this scrape, in the order they were first written.
    pub fn families(&self) -> Vec<FamilyRef<'_>> {
        self.live_families().iter().map(|family| FamilyRef { family, store: &self.store }).collect()
    }

    fn live_families(&self) -> &[Family] {
        &self.families[..self.live]
    }

    /// Marks the sink as user data whose `error_family` gauge (a family of
    /// this sink with one unlabelled sample) says that something was
    /// dropped: see [`reconcile`].
    pub fn set_untrusted(&mut self, error_family: &'static str) {
        self.untrusted = Some(error_family);
    }

    /// Bytes this sink holds for reuse (its buffers' capacity).
    pub fn retained_bytes(&self) -> usize {
        let families: usize = self
            .families
            .iter()
            .map(|f| {
                f.name.capacity()
                    + f.help.capacity()
                    + f.samples.capacity() * std::mem::size_of::<Sample>()
                    + f.buckets.capacity() * std::mem::size_of::<(f64, u64)>()
                    + f.natives.capacity() * std::mem::size_of::<NativeSample>()
                    + f.native_buckets.capacity() * std::mem::size_of::<(i32, u64)>()
                    + std::mem::size_of::<Family>()
            })
            .sum();
        families + self.store.arena.capacity() + self.store.refs.capacity() * std::mem::size_of::<LabelRef>()
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

/// A family of user data dropped because another sink has that name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub family: String,
    /// Indices of the sink that keeps the name and of the one that lost it.
    pub kept_by: usize,
    pub dropped_from: usize,
}

/// Before encoding: user-data sinks ([`Sink::set_untrusted`]) lose every
/// family whose name another sink produces (a collector's, or an earlier
/// user-data sink's), and their error gauge is set to 1. Returns what was
/// dropped, for the caller to log.
pub fn reconcile(sinks: &mut [Sink]) -> Vec<Conflict> {
    // First decide, borrowing the names (no copy of each family's name per
    // scrape); then drop, in the sinks that lose something (rare).
    let conflicts = {
        let order =
            (0..sinks.len()).filter(|&i| sinks[i].untrusted.is_none()).chain((0..sinks.len()).filter(|&i| sinks[i].untrusted.is_some()));
        let families = sinks.iter().map(|s| s.live).sum();
        let mut owner: rustc_hash::FxHashMap<&str, usize> = rustc_hash::FxHashMap::with_capacity_and_hasher(families, Default::default());
        let mut conflicts = Vec::new();
        for i in order {
            let own_error = sinks[i].untrusted;
            let first = conflicts.len();
            if own_error.is_some() {
                for f in sinks[i].live_families() {
                    match owner.get(f.name.as_str()) {
                        Some(&o) if o != i && Some(f.name.as_str()) != own_error => {
                            conflicts.push(Conflict { family: f.name.clone(), kept_by: o, dropped_from: i })
                        }
                        _ => {}
                    }
                }
            }
            let dropped = &conflicts[first..];
            for f in sinks[i].live_families() {
                if !dropped.iter().any(|c| c.family == f.name) {
                    owner.entry(f.name.as_str()).or_insert(i);
                }
            }
        }
        conflicts
    };
    let mut from = 0;
    while from < conflicts.len() {
        let i = conflicts[from].dropped_from;
        let to = from + conflicts[from..].iter().take_while(|c| c.dropped_from == i).count();
        let dropped = &conflicts[from..to];
        sinks[i].retain(|f| !dropped.iter().any(|c| c.family == f.name));
        if let Some(err) = sinks[i].untrusted {
            let live = sinks[i].live;
            for f in sinks[i].families[..live].iter_mut().filter(|f| f.name == err) {
                for s in &mut f.samples {
                    s.value = 1.0;
                }
            }
        }
        from = to;
    }
    conflicts
}

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

/// A family and the families of the same name and type from later sinks.
type Group<'a> = ((&'a Family, &'a Store), Vec<(&'a Family, &'a Store)>);

/// Every non-empty family of `sinks` once, in the order first written: a
/// family several sinks produce (e.g. `node_ebpf_program_up` of each eBPF
/// probe) is one group with all their samples. A later family of the same
/// name but another type is dropped rather than break the exposition.
fn groups(sinks: &[Sink]) -> Vec<Group<'_>> {
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
    /// Chooses the format from an Accept header by its q-values, as
    /// client_golang does (protobuf when asked for by name and preferred,
    /// OpenMetrics when it is preferred to text, text when nothing offered
    /// is acceptable).
    pub fn negotiate(accept: Option<&str>) -> Format {
        crate::negotiate::format(accept)
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Protobuf => "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
        }
    }
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
            if let Err(e) = encode_protobuf(&sinks, out) {
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

/// Every family of `sinks`, merged as the text formats merge them, as
/// length-delimited `MetricFamily` messages.
fn encode_protobuf(sinks: &[Sink], out: &mut Vec<u8>) -> Result<(), crate::proto::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn user_data_never_displaces_a_collector_family() {
        let mut collector = Sink::new();
        collector.family("node_cpu_seconds_total", "h", Kind::Counter).sample(&[("cpu", "0")], 1.0);
        let mut textfile = Sink::new();
        textfile.set_untrusted("node_textfile_scrape_error");
        textfile.family("node_cpu_seconds_total", "mine", Kind::Counter).sample(&[("cpu", "9")], 5.0);
        textfile.single("my_metric", "h", Kind::Gauge, 3.0);
        textfile.single("node_textfile_scrape_error", "h", Kind::Gauge, 0.0);
        let mut sinks = vec![textfile, collector];
        let c = reconcile(&mut sinks);
        assert_eq!(c, vec![Conflict { family: "node_cpu_seconds_total".into(), kept_by: 1, dropped_from: 0 }]);
        let names: Vec<&str> = sinks[0].families().iter().map(|f| f.name()).collect();
        assert_eq!(names, ["my_metric", "node_textfile_scrape_error"]);
        assert_eq!(sinks[0].families()[1].samples().next().map(|s| s.1), Some(1.0), "the error gauge says so");
        assert_eq!(sinks[1].families()[0].samples().next().map(|s| s.1), Some(1.0), "the collector's family is untouched");
        assert!(reconcile(&mut sinks).is_empty(), "nothing left to drop");
    }

    /// Label sets are shared only when equal: the same lengths and last
    /// bytes (one fingerprint) with another middle are not.
    #[test]
    fn recent_label_sets_are_shared_only_when_equal() {
        let mut s = Sink::new();
        s.family("a", "", Kind::Gauge).sample(&[("pod", "web-1-abcdefgh")], 1.0).sample(&[("pod", "web-2-abcdefgh")], 2.0);
        s.family("b", "", Kind::Gauge).sample(&[("pod", "web-1-abcdefgh")], 3.0).sample(&[("pod", "web-2-abcdefgh")], 4.0);
        s.family("c", "", Kind::Gauge).sample(&[("pod", "web-1-abcdefgh"), ("x", "")], 5.0).sample(&[("pod", "web-3-abcdefgh")], 6.0);
        type Row = (String, Vec<(String, String)>, f64);
        let got: Vec<Row> = s
            .families()
            .iter()
            .flat_map(|f| {
                f.samples()
                    .map(|(l, v)| (f.name().to_string(), l.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), v))
                    .collect::<Vec<_>>()
            })
            .collect();
        let l = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert_eq!(
            got,
            [
                ("a".into(), l(&[("pod", "web-1-abcdefgh")]), 1.0),
                ("a".into(), l(&[("pod", "web-2-abcdefgh")]), 2.0),
                ("b".into(), l(&[("pod", "web-1-abcdefgh")]), 3.0),
                ("b".into(), l(&[("pod", "web-2-abcdefgh")]), 4.0),
                ("c".into(), l(&[("pod", "web-1-abcdefgh"), ("x", "")]), 5.0),
                ("c".into(), l(&[("pod", "web-3-abcdefgh")]), 6.0),
            ]
        );
        // b's samples reused a's two label sets; c's are new (three labels).
        assert_eq!(s.store.refs.len(), 2 + 2 + 1);
        assert_eq!(fingerprint(&[("pod", "web-1-abcdefgh")]), fingerprint(&[("pod", "web-2-abcdefgh")]));
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
