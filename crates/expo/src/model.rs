//! The sample model collectors write into.
//!
//! A [`Sink`] holds the metric families one collector produced in one scrape.
//! It is owned by the collector and reused from scrape to scrape: families,
//! their label arenas and sample vectors keep their capacity, so a steady-state
//! scrape allocates next to nothing. Label names and values of all samples of a
//! family live in one `String` arena; a sample refers to a range of it.
//! How families become bytes is [`crate::encode`]'s job; which family wins
//! when two sinks produce the same name, [`crate::conflict`]'s.

use std::ops::Range;

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
pub(crate) struct Sample {
    /// Indices into `Store::refs`.
    pub(crate) labels: Range<u32>,
    pub(crate) value: f64,
    /// For histograms: bucket upper bounds and cumulative counts are stored in
    /// `Family::buckets[buckets]`, `value` is the sum and `count` the count.
    pub(crate) buckets: Range<u32>,
    pub(crate) count: u64,
}

/// A label: `arena[start..mid]` is the name, `arena[mid..end]` the value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LabelRef {
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
pub(crate) struct Store {
    pub(crate) arena: String,
    pub(crate) refs: Vec<LabelRef>,
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

    pub(crate) fn labels(&self, r: &Range<u32>) -> impl Iterator<Item = (&str, &str)> {
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
    pub(crate) name: String,
    pub(crate) help: String,
    pub(crate) kind: Kind,
    pub(crate) samples: Vec<Sample>,
    pub(crate) buckets: Vec<(f64, u64)>,
    /// The native (exponential) buckets of the histogram samples that have
    /// them, by sample index.
    pub(crate) natives: Vec<NativeSample>,
    pub(crate) native_buckets: Vec<(i32, u64)>,
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
    pub(crate) buckets: Range<u32>,
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

/// The families one collector produced in one scrape; reused across scrapes.
#[derive(Debug, Default)]
pub struct Sink {
    pub(crate) families: Vec<Family>,
    pub(crate) live: usize,
    pub(crate) store: Store,
    /// User data (textfiles): its families never displace a collector's,
    /// and this gauge of its own is set to 1 when one is dropped.
    pub(crate) untrusted: Option<&'static str>,
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

    pub(crate) fn live_families(&self) -> &[Family] {
        &self.families[..self.live]
    }

    /// Marks the sink as user data whose `error_family` gauge (a family of
    /// this sink with one unlabelled sample) says that something was
    /// dropped: see [`crate::reconcile`].
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

#[cfg(test)]
mod tests {
    use super::*;

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
