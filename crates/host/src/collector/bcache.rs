//! `bcache`: Linux block-cache statistics from /sys/fs/bcache/<uuid>/ (the
//! cache set's btree and journal figures, its backing devices `bdev<N>`
//! with their dirty data, writeback controller and total hit/miss
//! counters, and its cache devices `cache<N>` with their error and write
//! counters, plus `priority_stats` with `--collector.bcache.priorityStats`),
//! exported as `node_bcache_*` labelled by `uuid` and `backing_device` or
//! `cache_device`. Sizes in bcache's human-readable form (`20.4G`) are
//! decoded as node_exporter does. A host without bcache exports nothing.

use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{BoolFlag, Flags};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const PRIORITY_STATS: BoolFlag =
    BoolFlag { name: "collector.bcache.priorityStats", default: false, help: "Expose expensive priority stats." };

/// The collector's flags, parsed once.
pub struct Options {
    /// Also read each cache device's `priority_stats` (expensive in the kernel).
    pub priority_stats: bool,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        PRIORITY_STATS.args().into()
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { priority_stats: PRIORITY_STATS.get(f) })
    }
}

/// Parses bcache's `bch_hprint` fraction: `20.4` is 20 + 4/10.24 (the
/// fraction is tenths of 1024ths, not a decimal fraction).
fn parse_pseudo_float(s: &str) -> Option<f64> {
    let mut parts = s.split('.');
    let int: f64 = parts.next()?.parse().ok()?;
    match parts.next() {
        None => Some(int),
        Some(frac) => Some(int + frac.parse::<f64>().ok()? / 10.24),
    }
}

/// Decodes a value bcache prints through `bch_hprint` (`1.1M`, `20.4G`,
/// `512`): a binary multiplier suffix `k`, `M`, `G`, `T`, `P`, `E`, `Z`,
/// `Y` (any other non-digit suffix multiplies by zero, as node_exporter's
/// parser does), truncated to an integer.
pub fn dehumanize(s: &str) -> Result<u64, String> {
    let Some(&last) = s.as_bytes().last() else { return Err("zero-length value".into()) };
    let bad = || format!("invalid value {s:?}");
    let value = if last > b'9' {
        let mul = match last {
            b'k' => 1u128 << 10,
            b'M' => 1 << 20,
            b'G' => 1 << 30,
            b'T' => 1 << 40,
            b'P' => 1 << 50,
            b'E' => 1 << 60,
            b'Z' => 1 << 70,
            b'Y' => 1 << 80,
            _ => 0,
        } as f64;
        // The suffix may be a non-ASCII byte: split bytes, not chars.
        let head = std::str::from_utf8(&s.as_bytes()[..s.len() - 1]).map_err(|_| bad())?;
        parse_pseudo_float(head).ok_or_else(bad)? * mul
    } else {
        s.parse::<f64>().map_err(|_| bad())?
    };
    Ok(value as u64)
}

/// [`dehumanize`] with an optional leading `-`.
pub fn dehumanize_signed(s: &str) -> Result<i64, String> {
    match s.strip_prefix('-') {
        Some(rest) => Ok((dehumanize(rest)? as i64).wrapping_neg()),
        None => Ok(dehumanize(s)? as i64),
    }
}

/// An unsigned decimal integer, digits only (Go's `ParseUint(s, 10, 64)`).
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The last whitespace-separated field of a line.
fn last_field(line: &str) -> &str {
    line.split_ascii_whitespace().last().unwrap_or("")
}

/// A backing device's `writeback_rate_debug`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WritebackRateDebug {
    pub rate: u64,
    pub dirty: u64,
    pub target: u64,
    pub proportional: i64,
    pub integral: i64,
    pub change: i64,
    pub next_io: i64,
}

/// Parses `writeback_rate_debug` (`rate:  1.1M/sec`, `target:  20.4G`,
/// `change:  321.5k/sec`, `next io:  17ms`, ...); unknown lines are ignored.
pub fn parse_writeback_rate_debug(text: &str) -> Result<WritebackRateDebug, String> {
    let mut w = WritebackRateDebug::default();
    for line in text.lines() {
        let v = last_field(line);
        let err = |m: String| format!("{line:?}: {m}");
        if line.starts_with("rate:") {
            w.rate = dehumanize(v.strip_suffix("/sec").unwrap_or(v)).map_err(err)?;
        } else if line.starts_with("dirty:") {
            w.dirty = dehumanize(v).map_err(err)?;
        } else if line.starts_with("target:") {
            w.target = dehumanize(v).map_err(err)?;
        } else if line.starts_with("proportional:") {
            w.proportional = dehumanize_signed(v).map_err(err)?;
        } else if line.starts_with("integral:") {
            w.integral = dehumanize_signed(v).map_err(err)?;
        } else if line.starts_with("change:") {
            w.change = dehumanize_signed(v.strip_suffix("/sec").unwrap_or(v)).map_err(err)?;
        } else if line.starts_with("next io:") {
            let ms = v.strip_suffix("ms").unwrap_or(v);
            w.next_io = ms.parse().map_err(|_| err(format!("invalid value {ms:?}")))?;
        }
    }
    Ok(w)
}

/// A cache device's `priority_stats` percentages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PriorityStats {
    pub unused_percent: u64,
    pub metadata_percent: u64,
}

/// Parses `priority_stats` (`Unused:  99%`, `Metadata:  0%`; the
/// quantiles and other lines are ignored).
pub fn parse_priority_stats(text: &str) -> Result<PriorityStats, String> {
    let mut p = PriorityStats::default();
    for line in text.lines() {
        let slot = if line.starts_with("Unused:") {
            &mut p.unused_percent
        } else if line.starts_with("Metadata:") {
            &mut p.metadata_percent
        } else {
            continue;
        };
        let v = last_field(line);
        let v = v.strip_suffix('%').unwrap_or(v);
        *slot = parse_decimal(v).ok_or_else(|| format!("{line:?}: invalid percentage {v:?}"))?;
    }
    Ok(p)
}

/// The period counters of `stats_total` (and `stats_five_minute`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeriodStats {
    pub bypassed: u64,
    pub cache_bypass_hits: u64,
    pub cache_bypass_misses: u64,
    pub cache_hits: u64,
    pub cache_miss_collisions: u64,
    pub cache_misses: u64,
    pub cache_readaheads: u64,
}

/// Reads sysfs attributes into one reused buffer.
struct Reader {
    buf: Vec<u8>,
}

impl Reader {
    /// The whole file as text; any failure to read it is an error.
    fn text(&mut self, path: &Path) -> Result<String, Error> {
        crate::io::read_required(path, &mut self.buf)?;
        Ok(String::from_utf8_lossy(&self.buf).into_owned())
    }

    /// A single (possibly humanized) value; a missing attribute reads as 0,
    /// as in node_exporter (older kernels lack some).
    fn value(&mut self, dir: &Path, name: &str) -> Result<u64, Error> {
        let path = dir.join(name);
        match crate::io::read_into(&path, &mut self.buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io(&path, e)),
        }
        let text = std::str::from_utf8(&self.buf).map_err(|_| Error::parse(&path, "invalid UTF-8"))?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        dehumanize(text).map_err(|m| Error::parse(&path, m))
    }

    fn period(&mut self, dir: &Path) -> Result<PeriodStats, Error> {
        Ok(PeriodStats {
            bypassed: self.value(dir, "bypassed")?,
            cache_bypass_hits: self.value(dir, "cache_bypass_hits")?,
            cache_bypass_misses: self.value(dir, "cache_bypass_misses")?,
            cache_hits: self.value(dir, "cache_hits")?,
            cache_miss_collisions: self.value(dir, "cache_miss_collisions")?,
            cache_misses: self.value(dir, "cache_misses")?,
            cache_readaheads: self.value(dir, "cache_readaheads")?,
        })
    }
}

/// The entries of `dir` whose names `keep` accepts, sorted (a directory
/// that can't be listed has none, as with Go's `filepath.Glob`).
fn entries(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<(String, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<(String, PathBuf)> =
        rd.flatten().filter_map(|e| e.file_name().to_str().filter(|n| keep(n)).map(|n| (n.to_string(), e.path()))).collect();
    v.sort_unstable();
    v
}

/// `<prefix>[0-9]*`: the prefix followed by a digit.
fn numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

pub struct Collector {
    dir: PathBuf,
    priority_stats: bool,
    reader: Reader,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("fs/bcache"), priority_stats: o.priority_stats, reader: Reader { buf: Vec::new() } })
    }

    fn cache_set(&mut self, sink: &mut Sink, uuid: &str, dir: &Path) -> Result<(), Error> {
        let r = &mut self.reader;
        let g = Kind::Gauge;
        let k = Kind::Counter;
        let l: &[(&str, &str)] = &[("uuid", uuid)];
        let set: [(&str, &str, Kind, f64); 6] = [
            ("average_key_size", "node_bcache_average_key_size_sectors", g, 1.0),
            ("btree_cache_size", "node_bcache_btree_cache_size_bytes", g, 1.0),
            ("cache_available_percent", "node_bcache_cache_available_percent", g, 1.0),
            ("congested", "node_bcache_congested", g, 1.0),
            ("root_usage_percent", "node_bcache_root_usage_percent", g, 1.0),
            ("tree_depth", "node_bcache_tree_depth", g, 1.0),
        ];
        let internal_dir = dir.join("internal");
        // node_exporter scales this microsecond file by 1e-9, as if it
        // held nanoseconds; kept for compatibility.
        let internal: [(&str, &str, Kind, f64); 4] = [
            ("active_journal_entries", "node_bcache_active_journal_entries", g, 1.0),
            ("btree_nodes", "node_bcache_btree_nodes", g, 1.0),
            ("btree_read_average_duration_us", "node_bcache_btree_read_average_duration_seconds", g, 1e-9),
            ("cache_read_races", "node_bcache_cache_read_races_total", k, 1.0),
        ];
        let mut values = [0u64; 10];
        for (i, (file, ..)) in set.iter().enumerate() {
            values[i] = r.value(dir, file)?;
        }
        for (i, (file, ..)) in internal.iter().enumerate() {
            values[set.len() + i] = r.value(&internal_dir, file)?;
        }
        // Read (and so validated) as node_exporter does, though not exported.
        r.period(&dir.join("stats_five_minute"))?;
        r.period(&dir.join("stats_total"))?;
        for ((_, name, kind, scale), v) in set.iter().chain(&internal).zip(values) {
            sink.family(name, help(name), *kind).sample(l, v as f64 * scale);
        }

        for (bdev, bdir) in entries(dir, |n| numbered(n, "bdev")) {
            let dirty = r.value(&bdir, "dirty_data")?;
            let wpath = bdir.join("writeback_rate_debug");
            let wtext = r.text(&wpath)?;
            let w = parse_writeback_rate_debug(&wtext).map_err(|m| Error::parse(&wpath, m))?;
            r.period(&bdir.join("stats_five_minute"))?;
            let t = r.period(&bdir.join("stats_total"))?;
            let l: &[(&str, &str)] = &[("backing_device", &bdev), ("uuid", uuid)];
            let mut put = |name: &str, kind: Kind, v: f64| {
                sink.family(name, help(name), kind).sample(l, v);
            };
            put("node_bcache_dirty_data_bytes", g, dirty as f64);
            put("node_bcache_dirty_target_bytes", g, w.target as f64);
            put("node_bcache_writeback_rate", g, w.rate as f64);
            put("node_bcache_writeback_rate_proportional_term", g, w.proportional as f64);
            put("node_bcache_writeback_rate_integral_term", g, w.integral as f64);
            put("node_bcache_writeback_change", g, w.change as f64);
            put("node_bcache_bypassed_bytes_total", k, t.bypassed as f64);
            put("node_bcache_cache_hits_total", k, t.cache_hits as f64);
            put("node_bcache_cache_misses_total", k, t.cache_misses as f64);
            put("node_bcache_cache_bypass_hits_total", k, t.cache_bypass_hits as f64);
            put("node_bcache_cache_bypass_misses_total", k, t.cache_bypass_misses as f64);
            put("node_bcache_cache_miss_collisions_total", k, t.cache_miss_collisions as f64);
            // node_exporter leaves the readahead counter out while it is 0.
            if t.cache_readaheads != 0 {
                put("node_bcache_cache_readaheads_total", k, t.cache_readaheads as f64);
            }
        }

        for (cache, cdir) in entries(dir, |n| numbered(n, "cache")) {
            let io_errors = r.value(&cdir, "io_errors")?;
            let metadata = r.value(&cdir, "metadata_written")?;
            let written = r.value(&cdir, "written")?;
            let prio = if self.priority_stats {
                let ppath = cdir.join("priority_stats");
                let ptext = r.text(&ppath)?;
                Some(parse_priority_stats(&ptext).map_err(|m| Error::parse(&ppath, m))?)
            } else {
                None
            };
            let l: &[(&str, &str)] = &[("cache_device", &cache), ("uuid", uuid)];
            let mut put = |name: &str, kind: Kind, v: f64| {
                sink.family(name, help(name), kind).sample(l, v);
            };
            put("node_bcache_io_errors", g, io_errors as f64);
            put("node_bcache_metadata_written_bytes_total", k, metadata as f64);
            put("node_bcache_written_bytes_total", k, written as f64);
            if let Some(p) = prio {
                put("node_bcache_priority_stats_unused_percent", g, p.unused_percent as f64);
                put("node_bcache_priority_stats_metadata_percent", g, p.metadata_percent as f64);
            }
        }
        Ok(())
    }
}

/// node_exporter's help text of each family.
fn help(name: &str) -> &'static str {
    match name.strip_prefix("node_bcache_").unwrap_or(name) {
        "average_key_size_sectors" => "Average data per key in the btree (sectors).",
        "btree_cache_size_bytes" => "Amount of memory currently used by the btree cache.",
        "cache_available_percent" => "Percentage of cache device without dirty data, usable for writeback (may contain clean cached data).",
        "congested" => "Congestion.",
        "root_usage_percent" => "Percentage of the root btree node in use (tree depth increases if too high).",
        "tree_depth" => "Depth of the btree.",
        "active_journal_entries" => "Number of journal entries that are newer than the index.",
        "btree_nodes" => "Total nodes in the btree.",
        "btree_read_average_duration_seconds" => "Average btree read duration.",
        "cache_read_races_total" => "Counts instances where while data was being read from the cache, the bucket was reused and invalidated - i.e. where the pointer was stale after the read completed.",
        "dirty_data_bytes" => "Amount of dirty data for this backing device in the cache.",
        "dirty_target_bytes" => "Current dirty data target threshold for this backing device in bytes.",
        "writeback_rate" => "Current writeback rate for this backing device in bytes.",
        "writeback_rate_proportional_term" => "Current result of proportional controller, part of writeback rate",
        "writeback_rate_integral_term" => "Current result of integral controller, part of writeback rate",
        "writeback_change" => "Last writeback rate change step for this backing device.",
        "bypassed_bytes_total" => "Amount of IO (both reads and writes) that has bypassed the cache.",
        "cache_hits_total" => "Hits counted per individual IO as bcache sees them.",
        "cache_misses_total" => "Misses counted per individual IO as bcache sees them.",
        "cache_bypass_hits_total" => "Hits for IO intended to skip the cache.",
        "cache_bypass_misses_total" => "Misses for IO intended to skip the cache.",
        "cache_miss_collisions_total" => "Instances where data insertion from cache miss raced with write (data already present).",
        "cache_readaheads_total" => "Count of times readahead occurred.",
        "io_errors" => "Number of errors that have occurred, decayed by io_error_halflife.",
        "metadata_written_bytes_total" => "Sum of all non data writes (btree writes and all other metadata).",
        "written_bytes_total" => "Sum of all data that has been written to the cache.",
        "priority_stats_unused_percent" => "The percentage of the cache that doesn't contain any data.",
        "priority_stats_metadata_percent" => "Bcache's metadata overhead.",
        _ => "",
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // Cache sets are named by their UUID (`*-*`); no bcache, no metrics
        // (node_exporter reports success with nothing).
        for (uuid, dir) in entries(&self.dir, |n| n.contains('-')) {
            self.cache_set(sink, &uuid, &dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, write};
    use crate::Collector as _;

    #[test]
    fn dehumanizes_like_bch_hprint() {
        assert_eq!(dehumanize("0"), Ok(0));
        assert_eq!(dehumanize("512"), Ok(512));
        assert_eq!(dehumanize("1.1M"), Ok(1150976));
        assert_eq!(dehumanize("20.4G"), Ok(21894266880));
        assert_eq!(dehumanize("427.5k"), Ok(437748));
        assert_eq!(dehumanize("790.0k"), Ok(808960));
        assert_eq!(dehumanize("2k"), Ok(2048));
        assert_eq!(dehumanize("1.5"), Ok(1), "no suffix: a plain float, truncated");
        assert_eq!(dehumanize("3q"), Ok(0), "an unknown suffix multiplies by zero");
        assert_eq!(dehumanize_signed("-321.5k"), Ok(-329204));
        assert_eq!(dehumanize_signed("321.5k"), Ok(329204));
        for bad in ["", "k", "x.5k", "1.k", ".5k", "abc", "-", "%", "12 ", "1é", "é"] {
            assert!(dehumanize_signed(bad).is_err(), "{bad:?}");
        }
    }

    // From node_exporter's fixture bdev0/writeback_rate_debug.
    const WRD: &str = "rate:           1.1M/sec\ndirty:          20.4G\ntarget:         20.4G\nproportional:   427.5k\nintegral:       790.0k\nchange:         321.5k/sec\nnext io:        17ms\n";

    #[test]
    fn parses_writeback_rate_debug() {
        let w = parse_writeback_rate_debug(WRD).unwrap();
        assert_eq!(
            w,
            WritebackRateDebug {
                rate: 1150976,
                dirty: 21894266880,
                target: 21894266880,
                proportional: 437748,
                integral: 808960,
                change: 329204,
                next_io: 17
            }
        );
        assert_eq!(parse_writeback_rate_debug("change: -1.0k/sec\nnext io: -5ms\n").unwrap().change, -1024);
        assert_eq!(parse_writeback_rate_debug("").unwrap(), WritebackRateDebug::default());
        for bad in ["rate:\n", "target: lots\n", "next io: soonms\n", "proportional: -x\n"] {
            assert!(parse_writeback_rate_debug(bad).is_err(), "{bad:?}");
        }
    }

    // From node_exporter's fixture cache0/priority_stats.
    const PRIO: &str = "Unused:\t\t99%\nMetadata:\t0%\nAverage:\t10473\nSectors per Q:\t64\nQuantiles:\t[0 0 0 20946 20946]\n";

    #[test]
    fn parses_priority_stats() {
        assert_eq!(parse_priority_stats(PRIO), Ok(PriorityStats { unused_percent: 99, metadata_percent: 0 }));
        for bad in ["Unused:\n", "Unused: 9.5%\n", "Metadata: -1%\n", "Unused: lots\n"] {
            assert!(parse_priority_stats(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names() {
        assert!(numbered("bdev0", "bdev") && numbered("cache12", "cache") && numbered("bdev1x", "bdev"));
        assert!(!numbered("bdev", "bdev") && !numbered("bdevx", "bdev") && !numbered("xcache0", "cache"));
    }

    fn samples(sink: &Sink, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        let fams = sink.families();
        let f = fams.iter().find(|f| f.name() == name).unwrap_or_else(|| panic!("{name} missing"));
        f.samples().map(|(l, v)| (l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v)).collect()
    }

    #[test]
    fn reads_a_cache_set() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut c = Collector::new(Options { priority_stats: true }, &paths(root)).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert!(sink.families().is_empty(), "no bcache: success with nothing");

        let u = "sys/fs/bcache/deaddd54-c735-46d5-868e-f331c5fd7c74";
        write(root, &format!("{u}/cache_available_percent"), "100\n");
        write(root, &format!("{u}/internal/btree_read_average_duration_us"), "1305\n");
        write(root, &format!("{u}/internal/active_journal_entries"), "1\n");
        write(root, &format!("{u}/bdev0/dirty_data"), "0\n");
        write(root, &format!("{u}/bdev0/writeback_rate_debug"), WRD);
        write(root, &format!("{u}/bdev0/stats_total/cache_hits"), "546\n");
        write(root, &format!("{u}/cache0/metadata_written"), "512\n");
        write(root, &format!("{u}/cache0/priority_stats"), PRIO);
        write(root, "sys/fs/bcache/register", "");

        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let uuid = ("uuid".to_string(), "deaddd54-c735-46d5-868e-f331c5fd7c74".to_string());
        let bdev = vec![("backing_device".to_string(), "bdev0".to_string()), uuid.clone()];
        let cache = vec![("cache_device".to_string(), "cache0".to_string()), uuid.clone()];
        assert_eq!(samples(&sink, "node_bcache_cache_available_percent"), vec![(vec![uuid.clone()], 100.0)]);
        assert_eq!(samples(&sink, "node_bcache_btree_read_average_duration_seconds"), vec![(vec![uuid.clone()], 1.305e-06)]);
        assert_eq!(samples(&sink, "node_bcache_tree_depth"), vec![(vec![uuid.clone()], 0.0)], "missing files read as 0");
        assert_eq!(samples(&sink, "node_bcache_dirty_target_bytes"), vec![(bdev.clone(), 2.189426688e+10)]);
        assert_eq!(samples(&sink, "node_bcache_writeback_change"), vec![(bdev.clone(), 329204.0)]);
        assert_eq!(samples(&sink, "node_bcache_cache_hits_total"), vec![(bdev.clone(), 546.0)]);
        assert_eq!(samples(&sink, "node_bcache_metadata_written_bytes_total"), vec![(cache.clone(), 512.0)]);
        assert_eq!(samples(&sink, "node_bcache_priority_stats_unused_percent"), vec![(cache.clone(), 99.0)]);
        let fams = sink.families();
        assert!(fams.iter().all(|f| f.name() != "node_bcache_cache_readaheads_total"), "left out while 0");
        assert_eq!(fams.iter().find(|f| f.name() == "node_bcache_written_bytes_total").unwrap().kind(), Kind::Counter);
        assert_eq!(fams.len(), 27);

        // Without the flag, no priority stats.
        let mut c2 = Collector::new(Options { priority_stats: false }, &paths(root)).unwrap();
        let mut sink = Sink::new();
        c2.update(&mut sink).unwrap();
        assert!(sink.families().iter().all(|f| !f.name().starts_with("node_bcache_priority_stats")));

        // A malformed value fails the scrape; so does a missing writeback_rate_debug.
        write(root, &format!("{u}/congested"), "lots\n");
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
        write(root, &format!("{u}/congested"), "0\n");
        std::fs::remove_file(root.join(u).join("bdev0/writeback_rate_debug")).unwrap();
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Io { .. })));
    }
}
