//! `textfile`: metrics from `*.prom` files in `--collector.textfile.directory`,
//! with node_exporter's rules: families merged across files, missing labels
//! filled with "", files with client-side timestamps or syntax errors
//! skipped and flagged in `node_textfile_scrape_error`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::UNIX_EPOCH;

use clap::{Arg, ArgAction};

use crate::flags::Flags;

use crate::{ConfigError, Error, Paths};
use expo::text::{self as expfmt, Type};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub dirs: Vec<PathBuf>,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        vec![Arg::new("collector.textfile.directory")
            .long("collector.textfile.directory")
            .value_name("DIR")
            .action(ArgAction::Append)
            .help("Directory to read text files with metrics from; repeatable.")]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let dirs = f.strings("collector.textfile.directory").into_iter().filter(|s| !s.is_empty()).map(PathBuf::from).collect();
        Ok(Options { dirs })
    }
}

pub struct Collector {
    dirs: Vec<PathBuf>,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dirs: o.dirs })
    }
}

/// Buckets (upper bound, cumulative count), sum and count of one series.
type HistogramParts = (Vec<(f64, u64)>, f64, u64);

/// Families merged across files: name → (type, help, samples).
type Merged = BTreeMap<String, (Type, Option<String>, Vec<expfmt::Sample>)>;

/// Merges one file's families; a type conflict with an earlier file is an error.
pub fn merge(into: &mut Merged, families: Vec<expfmt::Family>) -> Result<(), String> {
    for f in &families {
        if f.samples.iter().any(|s| s.timestamp.is_some()) {
            return Err("textfile contains unsupported client-side timestamps".into());
        }
        if let Some((t, _, _)) = into.get(&f.name) {
            if *t != f.kind {
                return Err(format!("metric {} has type {} here and {} in another file", f.name, f.kind.as_str(), t.as_str()));
            }
        }
    }
    for f in families {
        let e = into.entry(f.name).or_insert((f.kind, f.help.clone(), Vec::new()));
        if e.1.is_none() {
            e.1 = f.help;
        }
        e.2.extend(f.samples);
    }
    Ok(())
}

/// Writes merged families into the sink, padding missing labels with "".
pub fn emit(sink: &mut Sink, merged: &Merged) {
    for (name, (kind, help, samples)) in merged {
        let help = help.as_deref().unwrap_or("Metric read from a textfile.");
        let mut names: Vec<&str> =
            samples.iter().flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str())).filter(|k| *k != "le" && *k != "quantile").collect();
        names.sort_unstable();
        names.dedup();
        fn padded<'a>(names: &[&'a str], s: &'a expfmt::Sample) -> Vec<(&'a str, &'a str)> {
            names.iter().map(|n| (*n, s.labels.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()).unwrap_or(""))).collect()
        }
        match kind {
            Type::Histogram => {
                // Group by the labels other than `le`.
                let mut groups: BTreeMap<Vec<(&str, &str)>, HistogramParts> = BTreeMap::new();
                for s in samples {
                    let g = groups.entry(padded(&names, s)).or_default();
                    if s.name.ends_with("_bucket") {
                        let le = s.labels.iter().find(|(k, _)| k == "le").and_then(|(_, v)| expfmt::parse_value(v));
                        if let Some(le) = le.filter(|le| le.is_finite()) {
                            g.0.push((le, s.value as u64));
                        }
                    } else if s.name.ends_with("_sum") {
                        g.1 = s.value;
                    } else if s.name.ends_with("_count") {
                        g.2 = s.value as u64;
                    }
                }
                let f = sink.family(name, help, Kind::Histogram);
                for (labels, (mut buckets, sum, count)) in groups {
                    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
                    f.histogram(&labels, sum, count, &buckets);
                }
            }
            Type::Summary => {
                // prometheus-client has no summary type: quantiles, sum and
                // count are re-exposed as untyped series of the same names.
                for s in samples {
                    let mut l = padded(&names, s);
                    if let Some((_, q)) = s.labels.iter().find(|(k, _)| k == "quantile") {
                        l.push(("quantile", q));
                        l.sort_unstable();
                    }
                    sink.family(&s.name, help, Kind::Untyped).sample(&l, s.value);
                }
            }
            t => {
                let kind = match t {
                    Type::Counter if name.ends_with("_total") => Kind::Counter,
                    Type::Gauge => Kind::Gauge,
                    _ => Kind::Untyped,
                };
                let f = sink.family(name, help, kind);
                for s in samples {
                    f.sample(&padded(&names, s), s.value);
                }
            }
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut error = false;
        let mut merged = Merged::new();
        let mut mtimes: Vec<(String, f64)> = Vec::new();
        for dir in &self.dirs {
            let rd = match std::fs::read_dir(dir) {
                Ok(rd) => rd,
                Err(e) => {
                    tracing::error!(dir = %dir.display(), err = %e, "failed to read textfile collector directory");
                    error = true;
                    continue;
                }
            };
            let mut files: Vec<PathBuf> =
                rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "prom") && !p.is_dir()).collect();
            files.sort();
            for path in files {
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::error!(file = %path.display(), err = %e, "failed to read textfile");
                        error = true;
                        continue;
                    }
                };
                let res = expfmt::parse(&text).map_err(|e| e.to_string()).and_then(|f| merge(&mut merged, f));
                if let Err(e) = res {
                    tracing::error!(file = %path.display(), err = %e, "failed to parse textfile");
                    error = true;
                    continue;
                }
                if let Ok(mtime) = std::fs::metadata(&path).and_then(|m| m.modified()) {
                    let secs = mtime.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as f64 / 1e9).unwrap_or(0.0);
                    mtimes.push((path.display().to_string(), secs));
                }
            }
        }
        emit(sink, &merged);
        for (file, t) in &mtimes {
            sink.family("node_textfile_mtime_seconds", "Unixtime mtime of textfiles successfully read.", Kind::Gauge)
                .sample(&[("file", file)], *t);
        }
        sink.single(
            "node_textfile_scrape_error",
            "1 if there was an error opening or reading a file, 0 otherwise",
            Kind::Gauge,
            if error { 1.0 } else { 0.0 },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_pads() {
        let mut m = Merged::new();
        merge(&mut m, expfmt::parse("a{x=\"1\"} 1\n").unwrap()).unwrap();
        merge(&mut m, expfmt::parse("a{y=\"2\"} 2\n").unwrap()).unwrap();
        let mut sink = Sink::new();
        emit(&mut sink, &m);
        let f = &sink.families()[0];
        let s: Vec<_> = f.samples().collect();
        assert_eq!(s[0].0, vec![("x", "1"), ("y", "")]);
        assert_eq!(s[1].0, vec![("x", ""), ("y", "2")]);
    }

    #[test]
    fn rejects_timestamps_and_type_conflicts() {
        let mut m = Merged::new();
        assert!(merge(&mut m, expfmt::parse("a 1 1000\n").unwrap()).is_err());
        merge(&mut m, expfmt::parse("# TYPE a gauge\na 1\n").unwrap()).unwrap();
        assert!(merge(&mut m, expfmt::parse("# TYPE a counter\na 1\n").unwrap()).is_err());
    }
}
