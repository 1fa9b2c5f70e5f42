//! `textfile`: metrics from `*.prom` files in `--collector.textfile.directory`
//! (each a directory or a glob of directories, as node_exporter 1.12), with
//! node_exporter's rules: families merged across files, missing labels
//! filled with "", a HELP from the first file that has one (else "Metric
//! read from FILES"), files with client-side timestamps or syntax errors
//! skipped and flagged in `node_textfile_scrape_error`.
//!
//! Bounded and fail-safe: only regular files are read (a FIFO, a device such
//! as a link to /dev/zero, a socket are refused at once), none larger than
//! `--collector.textfile.max-size`; a duplicate series, an inconsistent
//! HELP, a histogram whose buckets are not cumulative, and a family that
//! another collector produces are dropped and flagged, never silently
//! rewritten.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use clap::Arg;

use crate::flags::{self, Flags, SizeFlag, StringsFlag};
use crate::{ConfigError, Error, Paths};
use expo::text::{self as expfmt, Type};
use expo::{Kind, Sink};

pub const DIRECTORY: StringsFlag = StringsFlag {
    name: "collector.textfile.directory",
    value_name: "DIR",
    default: &[],
    help: "Directory to read text files with metrics from (a glob is expanded); repeatable.",
};
/// Its default: a textfile of 8 MiB already holds some 100,000 series.
pub const MAX_SIZE: SizeFlag = SizeFlag {
    name: "collector.textfile.max-size",
    default: "8MiB",
    help: "Largest textfile read (node-agent's own flag); a larger one, or one that is not a regular file, is skipped and flagged in node_textfile_scrape_error. Bytes, or with KiB, MiB, GiB.",
};

/// The collector's flags, parsed once.
pub struct Options {
    /// Directories or globs of directories.
    pub dirs: Vec<String>,
    pub max_bytes: u64,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&DIRECTORY, &MAX_SIZE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let dirs = DIRECTORY.get(f).into_iter().filter(|s| !s.is_empty()).collect();
        Ok(Options { dirs, max_bytes: MAX_SIZE.get(f)?.get() })
    }
}

pub struct Collector {
    dirs: Vec<String>,
    max_bytes: u64,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dirs: o.dirs, max_bytes: o.max_bytes })
    }
}

/// Reads a textfile: a regular file (links followed) of at most `max` bytes.
pub fn read_textfile(path: &Path, max: u64) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("failed to stat textfile: {e}"))?;
    if !meta.is_file() {
        return Err(format!("not a regular file ({}), skipped", file_kind(&meta)));
    }
    if meta.len() > max {
        return Err(format!("textfile is {} bytes, above --collector.textfile.max-size ({max} bytes), skipped", meta.len()));
    }
    let f = crate::io::open_nonblocking(path).map_err(|e| format!("failed to open textfile data file: {e}"))?;
    let mut text = String::with_capacity(meta.len() as usize);
    let n = f.take(max + 1).read_to_string(&mut text).map_err(|e| format!("failed to read textfile: {e}"))?;
    if n as u64 > max {
        return Err(format!("textfile grew above --collector.textfile.max-size ({max} bytes) while read, skipped"));
    }
    Ok(text)
}

fn file_kind(m: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// The directories a `--collector.textfile.directory` value names: the
/// matches of a glob, else the value itself (node_exporter's rule).
fn directories(value: &str) -> Vec<PathBuf> {
    let matches: Vec<PathBuf> = glob::glob(value).map(|g| g.flatten().collect()).unwrap_or_default();
    if matches.is_empty() {
        vec![PathBuf::from(value)]
    } else {
        matches
    }
}

/// Buckets (upper bound, cumulative count), sum, count and the `+Inf`
/// bucket's value, of one histogram series.
type HistogramParts = (Vec<(f64, u64)>, f64, u64, Option<f64>);

/// One family merged across files (pass 1).
#[derive(Debug)]
pub struct Merged {
    pub kind: Type,
    pub help: Option<String>,
    pub files: Vec<String>,
    /// Label names of all its samples, sorted (without a histogram's `le`,
    /// a summary's `quantile`).
    pub labels: BTreeSet<String>,
    /// Its samples, over all files.
    pub samples: usize,
}

/// The most label pairs the files' families may expand to once every
/// sample carries every label name of its family (node_exporter pads them
/// so): samples × label names, summed over families. A file past it is
/// refused whole, so a small file of samples that each have a label name
/// of their own cannot make an answer that grows with its square (5,000
/// such samples, 88 KB, were a 220 MB answer). 4 M pairs is about 100 MB of
/// text, well above what an 8 MiB file of ordinary series expands to.
pub const MAX_LABEL_PAIRS: usize = 4_000_000;

/// Families by name, in exposition order.
pub type Families = BTreeMap<String, Merged>;

/// A file that passed pass 1, with the families skipped from it.
pub struct Accepted {
    pub file: String,
    pub text: String,
    pub skipped: BTreeSet<String>,
}

/// Pass 1 over one file: the whole file must parse, carry no client-side
/// timestamp and agree with earlier files on types; a family whose HELP
/// differs from an earlier file's is skipped from this file
/// (node_exporter's rule). Returns the accepted file and the problems of
/// what it skipped.
pub fn merge(into: &mut Families, file: &str, text: String) -> Result<(Accepted, Vec<String>), String> {
    let decl = expfmt::Declarations::scan(&text).map_err(|e| format!("failed to parse textfile data: {e}"))?;
    let mut here: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut stamped = false;
    let mut reserved: Option<String> = None;
    decl.samples(&text, |fam, s| {
        stamped |= s.timestamp.is_some();
        *counts.entry(fam).or_default() += 1;
        if reserved.is_none() {
            reserved = s.labels.iter().find(|(k, _)| k.starts_with("__")).map(|(k, _)| k.to_string());
        }
        // `le` is a histogram's bucket and `quantile` a summary's, not
        // labels of their series; on any other family both are labels like
        // any other (node_exporter's parser keeps them).
        let bucket = match decl.kind(fam) {
            Type::Histogram => "le",
            Type::Summary => "quantile",
            _ => "",
        };
        here.entry(fam).or_default().extend(s.labels.iter().map(|(k, _)| *k).filter(|k| *k != bucket));
    });
    if stamped {
        return Err("textfile contains unsupported client-side timestamps, skipping entire file".into());
    }
    // What Prometheus would refuse, failing the whole scrape with it: a
    // reserved label name (`__name__` would be a duplicate label), and a
    // counter whose OpenMetrics family name, without `_total`, is empty.
    if let Some(k) = reserved {
        return Err(format!(
            "textfile has the reserved label name {k:?} (names starting with \"__\" are Prometheus's own), skipping entire file"
        ));
    }
    if let Some(fam) = here.keys().find(|f| decl.kind(f) == Type::Counter && f.strip_suffix("_total") == Some("")) {
        return Err(format!("counter {fam:?} has no name without its _total suffix, skipping entire file"));
    }
    for fam in here.keys() {
        if let Some(m) = into.get(*fam) {
            let kind = decl.kind(fam);
            if m.kind != kind {
                return Err(format!("metric {fam} has type {} here and {} in another file", kind.as_str(), m.kind.as_str()));
            }
        }
    }
    // The padded size with this file: over every family, samples × names.
    let padded = |fam: &str, labels: &BTreeSet<&str>| {
        let (old_samples, old_labels) = into.get(fam).map_or((0, 0), |m| (m.samples, m.labels.len()));
        let new_names = labels.iter().filter(|l| into.get(fam).is_none_or(|m| !m.labels.contains(**l))).count();
        (old_samples + counts.get(fam).copied().unwrap_or(0)).saturating_mul(old_labels + new_names)
    };
    let untouched: usize = into.iter().filter(|(f, _)| !here.contains_key(f.as_str())).map(|(_, m)| m.samples * m.labels.len()).sum();
    let total = here.iter().fold(untouched, |acc, (f, l)| acc.saturating_add(padded(f, l)));
    if total > MAX_LABEL_PAIRS {
        return Err(format!(
            "textfile would expand to {total} label pairs (samples × label names of their families) with the files before it, over the limit of {MAX_LABEL_PAIRS}: give the samples of a family the same label names; skipping entire file"
        ));
    }
    let mut problems = Vec::new();
    let mut skipped = BTreeSet::new();
    for (fam, labels) in here {
        let n = counts.get(fam).copied().unwrap_or(0);
        let help = decl.helps.get(fam);
        match into.get_mut(fam) {
            Some(m) => {
                if let (Some(a), Some(b)) = (&m.help, help) {
                    if a != b {
                        problems.push(format!("inconsistent metric help text for {fam}: {a:?} in {}, {b:?} here", m.files[0]));
                        skipped.insert(fam.to_string());
                        continue;
                    }
                }
                if m.help.is_none() {
                    m.help = help.cloned();
                }
                m.files.push(file.to_string());
                m.labels.extend(labels.into_iter().map(str::to_string));
                m.samples += n;
            }
            None => {
                let m = Merged {
                    kind: decl.kind(fam),
                    help: help.cloned(),
                    files: vec![file.to_string()],
                    labels: labels.into_iter().map(str::to_string).collect(),
                    samples: n,
                };
                into.insert(fam.to_string(), m);
            }
        }
    }
    drop(decl);
    Ok((Accepted { file: file.to_string(), text, skipped }, problems))
}

/// Checks a histogram series before it is exposed: buckets cumulative
/// (non-decreasing with `le`), and the `+Inf` bucket, when given, equal to
/// the count. Anything else would be re-counted on the way out.
fn histogram_problem(buckets: &[(f64, u64)], count: u64, inf: Option<f64>) -> Option<String> {
    if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
        return Some("histogram buckets are not cumulative".into());
    }
    if let Some(inf) = inf {
        if inf != count as f64 {
            return Some(format!("histogram +Inf bucket ({inf}) differs from its count ({count})"));
        }
    }
    if buckets.last().is_some_and(|b| b.1 > count) {
        return Some("histogram bucket above its count".into());
    }
    None
}

fn series_hash(family: usize, name: &str, labels: &[(&str, &str)], le: Option<f64>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    (family, name, labels, le.map(f64::to_bits)).hash(&mut h);
    h.finish()
}

/// Pass 2: writes every accepted file's samples into the sink, padding
/// missing labels with "", families in name order. Returns the problems of
/// what it dropped: duplicate series, histograms it could not expose as
/// given.
pub fn emit(sink: &mut Sink, families: &Families, files: &[Accepted]) -> Vec<String> {
    let mut problems = Vec::new();
    let kind_of = |m: &Merged, name: &str| match m.kind {
        Type::Counter if name.ends_with("_total") => Kind::Counter,
        Type::Counter | Type::Untyped | Type::Summary => Kind::Untyped,
        Type::Gauge => Kind::Gauge,
        Type::Histogram => Kind::Histogram,
    };
    let helps: Vec<String> =
        families.values().map(|m| m.help.clone().unwrap_or_else(|| format!("Metric read from {}", m.files.join(", ")))).collect();
    // Families (summaries become their untyped series, made as they come).
    let mut index: rustc_hash::FxHashMap<&str, (usize, Option<usize>)> = rustc_hash::FxHashMap::default();
    for (i, (name, m)) in families.iter().enumerate() {
        let slot = (m.kind != Type::Summary).then(|| {
            sink.new_family(name, &helps[i], kind_of(m, name));
            sink.families().len() - 1
        });
        index.insert(name.as_str(), (i, slot));
    }
    let merged: Vec<&Merged> = families.values().collect();
    // The families' types, agreed across files, say which family a sample
    // name (`x_bucket`) belongs to.
    let decl = expfmt::Declarations { types: families.iter().map(|(n, m)| (n.as_str(), m.kind)).collect(), helps: Default::default() };
    let mut seen: rustc_hash::FxHashSet<u64> = rustc_hash::FxHashSet::default();
    let mut histograms: BTreeMap<(usize, Vec<String>), HistogramParts> = BTreeMap::new();
    for f in files {
        decl.samples(&f.text, |fam, s| {
            if f.skipped.contains(fam) {
                return;
            }
            let Some(&(i, slot)) = index.get(fam) else { return };
            let m = merged[i];
            let labels: Vec<(&str, &str)> = m
                .labels
                .iter()
                .map(|n| (n.as_str(), s.labels.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_ref()).unwrap_or("")))
                .collect();
            match m.kind {
                Type::Histogram => {
                    let le = s.labels.iter().find(|(k, _)| *k == "le").and_then(|(_, v)| expfmt::parse_value(v));
                    if !seen.insert(series_hash(i, s.name, &labels, le)) {
                        problems.push(format!("duplicate series {} {labels:?}", s.name));
                        return;
                    }
                    let g = histograms.entry((i, labels.iter().map(|(_, v)| v.to_string()).collect())).or_default();
                    if s.name.ends_with("_bucket") {
                        match le {
                            Some(le) if le.is_finite() => g.0.push((le, s.value as u64)),
                            Some(_) => g.3 = Some(s.value),
                            None => {}
                        }
                    } else if s.name.ends_with("_sum") {
                        g.1 = s.value;
                    } else if s.name.ends_with("_count") {
                        g.2 = s.value as u64;
                    }
                }
                Type::Summary => {
                    // prometheus-client has no summary type: quantiles, sum and
                    // count are re-exposed as untyped series of the same names.
                    let mut l = labels;
                    if let Some((_, q)) = s.labels.iter().find(|(k, _)| *k == "quantile") {
                        l.push(("quantile", q.as_ref()));
                        l.sort_unstable();
                    }
                    if !seen.insert(series_hash(i, s.name, &l, None)) {
                        problems.push(format!("duplicate series {} {l:?}", s.name));
                        return;
                    }
                    sink.family(s.name, &helps[i], Kind::Untyped).sample(&l, s.value);
                }
                _ => {
                    if !seen.insert(series_hash(i, s.name, &labels, None)) {
                        problems.push(format!("duplicate series {fam} {labels:?}"));
                        return;
                    }
                    if let Some(mut f) = slot.and_then(|j| sink.family_at(j)) {
                        f.sample(&labels, s.value);
                    }
                }
            }
        });
    }
    let names: Vec<&String> = families.keys().collect();
    for ((i, values), (mut buckets, sum, count, inf)) in histograms {
        let (name, m) = (names[i], merged[i]);
        let labels: Vec<(&str, &str)> = m.labels.iter().map(String::as_str).zip(values.iter().map(String::as_str)).collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if let Some(p) = histogram_problem(&buckets, count, inf) {
            problems.push(format!("{name} {labels:?}: {p}; dropped"));
            continue;
        }
        if let Some(mut f) = index.get(name.as_str()).and_then(|(_, slot)| *slot).and_then(|j| sink.family_at(j)) {
            f.histogram(&labels, sum, count, &buckets);
        }
    }
    problems
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        sink.set_untrusted(SCRAPE_ERROR);
        let mut error = false;
        let mut families = Families::new();
        let mut accepted: Vec<Accepted> = Vec::new();
        let mut mtimes: BTreeMap<String, f64> = BTreeMap::new();
        for value in &self.dirs {
            for dir in directories(value) {
                let rd = match std::fs::read_dir(&dir) {
                    Ok(rd) => rd,
                    Err(e) => {
                        tracing::error!(path = %dir.display(), err = %e, "failed to read textfile collector directory");
                        error = true;
                        continue;
                    }
                };
                let mut files: Vec<PathBuf> =
                    rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "prom")).collect();
                files.sort();
                for path in files {
                    let file = path.display().to_string();
                    let res = read_textfile(&path, self.max_bytes).and_then(|text| merge(&mut families, &file, text));
                    match res {
                        Ok((a, problems)) => {
                            for p in problems {
                                tracing::error!(file = %file, problem = %p, "textfile metric dropped");
                                error = true;
                            }
                            accepted.push(a);
                        }
                        Err(e) => {
                            tracing::error!(file = %file, err = %e, "failed to collect textfile data");
                            error = true;
                            continue;
                        }
                    }
                    // Only stat a file once it has been parsed and merged, so
                    // that a failure does not look fresh (node_exporter's rule);
                    // whole seconds, as node_exporter exports them.
                    if let Ok(mtime) = std::fs::metadata(&path).and_then(|m| m.modified()) {
                        let secs = mtime.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as f64).unwrap_or(0.0);
                        mtimes.insert(file, secs);
                    }
                }
            }
        }
        for p in emit(sink, &families, &accepted) {
            tracing::error!(problem = %p, "textfile metric dropped");
            error = true;
        }
        drop(accepted);
        for (file, t) in &mtimes {
            sink.family("node_textfile_mtime_seconds", "Unixtime mtime of textfiles successfully read.", Kind::Gauge)
                .sample(&[("file", file)], *t);
        }
        sink.single(
            SCRAPE_ERROR,
            "1 if there was an error opening or reading a file, 0 otherwise",
            Kind::Gauge,
            if error { 1.0 } else { 0.0 },
        );
        Ok(())
    }
}

/// The collector's error gauge (also set when a textfile family is dropped
/// because another collector produces it).
const SCRAPE_ERROR: &str = "node_textfile_scrape_error";

#[cfg(test)]
mod tests {
    use super::*;

    /// Pass 1 then pass 2 over (file, text) pairs: the sink, and every problem.
    fn run(files: &[(&str, &str)]) -> (Sink, Vec<String>) {
        let mut fams = Families::new();
        let mut acc = Vec::new();
        let mut problems = Vec::new();
        for (f, t) in files {
            match merge(&mut fams, f, t.to_string()) {
                Ok((a, p)) => {
                    acc.push(a);
                    problems.extend(p);
                }
                Err(e) => problems.push(e),
            }
        }
        let mut sink = Sink::new();
        problems.extend(emit(&mut sink, &fams, &acc));
        (sink, problems)
    }

    fn family<'a>(sink: &'a Sink, n: &str) -> Option<expo::FamilyRef<'a>> {
        sink.families().into_iter().find(|f| f.name() == n && !f.is_empty())
    }

    #[test]
    fn refuses_what_prometheus_would_refuse_the_scrape_for() {
        let (sink, problems) = run(&[
            ("reserved", "a{__name__=\"b\"} 1\n"),
            ("reserved2", "a{x=\"1\",__meta=\"y\"} 1\n"),
            ("empty", "# TYPE _total counter\n_total 1\n"),
            ("fine", "# TYPE c_total counter\nc_total 1\n_x 2\n"),
        ]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("reserved label name \"__name__\""), "{problems:?}");
        assert!(problems[1].contains("\"__meta\""), "{problems:?}");
        assert!(problems[2].contains("counter \"_total\" has no name without its _total suffix"), "{problems:?}");
        assert!(family(&sink, "a").is_none() && family(&sink, "_total").is_none());
        assert!(family(&sink, "c_total").is_some() && family(&sink, "_x").is_some(), "names that only start with _ are fine");
    }

    /// 5,000 samples each with a label name of its own (88 KB) would pad to
    /// 25 M label pairs: refused, naming the limit; an ordinary file of as
    /// many series is fine.
    #[test]
    fn padding_is_bounded_by_label_pairs_not_bytes() {
        let mut bad = String::from("# TYPE m gauge\n");
        for i in 0..5000 {
            bad.push_str(&format!("m{{l{i}=\"v\"}} 1\n"));
        }
        assert!(bad.len() < 100_000);
        let mut good = String::from("# TYPE g gauge\n");
        for i in 0..5000 {
            good.push_str(&format!("g{{a=\"{i}\",b=\"x\"}} 1\n"));
        }
        let (sink, problems) = run(&[("bad", &bad), ("good", &good)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("25000000 label pairs") && problems[0].contains("limit of 4000000"), "{problems:?}");
        assert!(family(&sink, "m").is_none());
        assert_eq!(family(&sink, "g").unwrap().samples().count(), 5000);
    }

    /// `le` and `quantile` are only taken off histograms and summaries: on
    /// any other family they are labels, which node_exporter keeps (they were
    /// dropped, and two series differing only in them became duplicates).
    #[test]
    fn le_and_quantile_are_labels_outside_histograms_and_summaries() {
        let (sink, problems) = run(&[(
            "f",
            "# TYPE g gauge\ng{le=\"0.5\"} 1\ng{le=\"1\"} 2\nu_bucket{le=\"0.5\"} 3\nq{quantile=\"0.9\"} 4\nq{quantile=\"0.5\"} 5\n",
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let samples = |n: &str| family(&sink, n).map(|f| f.samples().collect::<Vec<_>>());
        assert_eq!(samples("g"), Some(vec![(vec![("le", "0.5")], 1.0), (vec![("le", "1")], 2.0)]));
        assert_eq!(samples("u_bucket"), Some(vec![(vec![("le", "0.5")], 3.0)]));
        assert_eq!(samples("q"), Some(vec![(vec![("quantile", "0.9")], 4.0), (vec![("quantile", "0.5")], 5.0)]));
    }

    #[test]
    fn merges_and_pads() {
        let (sink, problems) = run(&[("f1", "a{x=\"1\"} 1\n"), ("f2", "a{y=\"2\"} 2\n")]);
        assert!(problems.is_empty(), "{problems:?}");
        let s: Vec<_> = family(&sink, "a").unwrap().samples().collect();
        assert_eq!(s[0].0, vec![("x", "1"), ("y", "")]);
        assert_eq!(s[1].0, vec![("x", ""), ("y", "2")]);
    }

    #[test]
    fn rejects_timestamps_syntax_errors_and_type_conflicts() {
        let (sink, problems) =
            run(&[("t", "a 1 1000\n"), ("s", "b{x=1} 1\n"), ("g", "# TYPE c gauge\nc 1\n"), ("k", "# TYPE c counter\nc 1\n")]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(family(&sink, "a").is_none() && family(&sink, "b").is_none(), "rejected files give nothing");
        assert_eq!(family(&sink, "c").unwrap().kind(), Kind::Gauge, "the first file's type stays");
    }

    #[test]
    fn help_comes_from_the_first_file_or_names_the_files() {
        let (sink, problems) = run(&[
            ("/t/one.prom", "b 1\n"),
            ("/t/two.prom", "b{x=\"y\"} 1\n"),
            ("/t/3.prom", "# HELP c first\nc 1\n"),
            ("/t/4.prom", "# HELP c second\nc{x=\"1\"} 1\n"),
        ]);
        assert_eq!(problems.len(), 1, "an inconsistent HELP skips the family: {problems:?}");
        let f = |n: &str| family(&sink, n).map(|f| (f.len(), f.help().to_string()));
        assert_eq!(f("b"), Some((2, "Metric read from /t/one.prom, /t/two.prom".to_string())));
        assert_eq!(f("c"), Some((1, "first".to_string())));
    }

    #[test]
    fn duplicates_and_recounted_histograms_are_dropped_and_reported() {
        let hist = "# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"+Inf\"} 5\nh_sum 3\nh_count 5\n\
                    h_bucket{k=\"b\",le=\"1\"} 1\nh_bucket{k=\"b\",le=\"+Inf\"} 9\nh_sum{k=\"b\"} 1\nh_count{k=\"b\"} 2\n\
                    h_bucket{k=\"ok\",le=\"1\"} 1\nh_bucket{k=\"ok\",le=\"+Inf\"} 2\nh_sum{k=\"ok\"} 1\nh_count{k=\"ok\"} 2\n";
        let (sink, problems) = run(&[("f1", "d{x=\"1\"} 1\n"), ("f2", "d{x=\"1\"} 2\n"), ("f3", hist)]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        let d = family(&sink, "d").unwrap();
        assert_eq!(d.samples().map(|s| s.1).collect::<Vec<_>>(), [1.0], "the first of a duplicate is kept");
        assert_eq!(family(&sink, "h").unwrap().len(), 1, "only the consistent histogram series stays");
    }

    #[test]
    fn summaries_and_histograms_keep_their_series() {
        let text = "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
        let (sink, problems) = run(&[("f", text)]);
        assert!(problems.is_empty(), "{problems:?}");
        for n in ["s", "s_sum", "s_count", "h"] {
            assert!(family(&sink, n).is_some(), "{n}");
        }
    }

    #[test]
    fn only_regular_files_within_the_size_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("a.prom");
        std::fs::write(&small, "a 1\n").unwrap();
        assert_eq!(read_textfile(&small, 1024).unwrap(), "a 1\n");
        let big = dir.path().join("big.prom");
        std::fs::write(&big, vec![b'#'; 2048]).unwrap();
        assert!(read_textfile(&big, 1024).unwrap_err().contains("max-size"));
        let fifo = dir.path().join("f.prom");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        assert!(read_textfile(&fifo, 1024).unwrap_err().contains("FIFO"));
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "a FIFO is refused at once");
        let zero = dir.path().join("z.prom");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read_textfile(&zero, 1024).unwrap_err().contains("character device"));
    }
}
