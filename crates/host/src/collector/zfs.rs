//! `zfs`: ZFS on Linux statistics from the SPL kstat files under
//! /proc/spl/kstat/zfs, as node_exporter exports them: every integer row of
//! the global kstat files (arcstats, abdstats, dbufstats, dmu_tx, dnodestats,
//! fm, vdev_cache_stats, vdev_mirror_stats, xuio_stats, zfetchstats, zil) as
//! an untyped `node_zfs_<subsystem>_<name>`, each pool's `io` counters as
//! untyped `node_zfs_zpool_<field>{zpool}`, the unsigned rows of each pool's
//! `objset-*` files as untyped `node_zfs_zpool_dataset_<name>{dataset,zpool}`,
//! and each pool's `state` as the gauge `node_zfs_zpool_state{state,zpool}`.
//! Without /proc/spl/kstat/zfs there is no data.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::io::{open_nonblocking, read_into, read_required};
use crate::parse::parse_u64;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The global kstat files: (metric subsystem, file name).
const SUBSYSTEMS: [(&str, &str); 11] = [
    ("zfs_abd", "abdstats"),
    ("zfs_arc", "arcstats"),
    ("zfs_dbuf", "dbufstats"),
    ("zfs_dmu_tx", "dmu_tx"),
    ("zfs_dnode", "dnodestats"),
    ("zfs_fm", "fm"),
    ("zfs_vdev_cache", "vdev_cache_stats"),
    ("zfs_vdev_mirror", "vdev_mirror_stats"),
    ("zfs_xuio", "xuio_stats"),
    ("zfs_zfetch", "zfetchstats"),
    ("zfs_zil", "zil"),
];

/// The states of `node_zfs_zpool_state`, in node_exporter's order.
pub const POOL_STATES: [&str; 7] = ["online", "degraded", "faulted", "offline", "removed", "unavail", "suspended"];

/// kstat data types (lib/libspl/include/sys/kstat.h) node_exporter reads.
const KSTAT_DATA_INT64: &str = "3";
const KSTAT_DATA_UINT64: &str = "4";

pub struct Collector {
    base: PathBuf,
    /// One path per entry of `SUBSYSTEMS`.
    files: Vec<PathBuf>,
    buf: Vec<u8>,
    out: Out,
}

/// What one scrape has written so far, and reusable name buffers.
#[derive(Default)]
struct Out {
    name: String,
    help: String,
    /// Hashes of the series written in this scrape: a repeated series keeps
    /// its first value, as client_golang's registry does.
    seen: rustc_hash::FxHashSet<u64>,
    /// The per-pool families, by name, and their index in the sink.
    index: rustc_hash::FxHashMap<String, usize>,
    next: usize,
}

impl Out {
    /// Sets `name` to `prefix` followed by `key` as a metric name, and
    /// `help` to `help_prefix` followed by `key`.
    fn names(&mut self, prefix: &str, help_prefix: &str, key: &str) {
        self.name.clear();
        self.name.push_str(prefix);
        push_metric_name(&mut self.name, key);
        self.help.clear();
        self.help.push_str(help_prefix);
        self.help.push_str(key);
    }

    /// True the first time this scrape sees the series `name{labels}`.
    fn first(&mut self, labels: &[(&str, &str)]) -> bool {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.name.hash(&mut h);
        labels.hash(&mut h);
        self.seen.insert(h.finish())
    }

    /// Adds a sample to the family `name`, found through `index` (families
    /// repeat once per pool or dataset).
    fn sample(&mut self, sink: &mut Sink, kind: Kind, labels: &[(&str, &str)], value: f64) {
        if !self.first(labels) {
            return;
        }
        if let Some(&i) = self.index.get(self.name.as_str()) {
            if let Some(mut f) = sink.family_at(i) {
                f.sample(labels, value);
                return;
            }
        }
        self.index.insert(self.name.clone(), self.next);
        self.next += 1;
        sink.new_family(&self.name, &self.help, kind).sample(labels, value);
    }
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        let base = p.proc("spl/kstat/zfs");
        let files = SUBSYSTEMS.iter().map(|(_, file)| base.join(file)).collect();
        Collector { base, files, buf: Vec::new(), out: Out::default() }
    }
}

/// A kstat row name as a metric name: its last dot-separated part, with `-`
/// (and any other character not allowed in a metric name) as `_`.
pub fn metric_name(key: &str) -> String {
    let mut s = String::with_capacity(key.len());
    push_metric_name(&mut s, key);
    s
}

fn push_metric_name(out: &mut String, key: &str) {
    let last = key.rsplit('.').next().unwrap_or(key);
    out.extend(last.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == ':' { c } else { '_' }));
}

fn is_header(parts: &[&str]) -> bool {
    parts == ["name", "type", "data"]
}

/// Parses a named kstat file (`name type data` rows after the header):
/// calls `f(name, value)` for each signed or unsigned 64-bit integer row;
/// other types are skipped. A file without the header is an error.
pub fn parse_kstat<'a>(text: &'a str, mut f: impl FnMut(&'a str, f64)) -> Result<(), String> {
    kstat_rows(text, |_, parts| {
        let value = match parts[1] {
            KSTAT_DATA_UINT64 => {
                parse_u64(parts[2].as_bytes()).ok_or_else(|| format!("invalid unsigned integer for {:?}", parts[0]))? as f64
            }
            KSTAT_DATA_INT64 => parts[2].parse::<i64>().map_err(|_| format!("invalid signed integer for {:?}", parts[0]))? as f64,
            _ => return Ok(()),
        };
        f(parts[0], value);
        Ok(())
    })
}

/// The rows of a named kstat file after its `name type data` header: calls
/// `row(line, fields)` for each line of at least three fields. A file
/// without the header is an error.
fn kstat_rows<'a>(text: &'a str, mut row: impl FnMut(&'a str, &[&'a str]) -> Result<(), String>) -> Result<(), String> {
    let mut started = false;
    let mut parts: Vec<&str> = Vec::with_capacity(4);
    for line in crate::parse::go_lines(text) {
        parts.clear();
        parts.extend(line.split_whitespace());
        if !started {
            started = is_header(&parts);
            continue;
        }
        if parts.len() < 3 {
            continue;
        }
        row(line, &parts)?;
    }
    if started {
        Ok(())
    } else {
        Err("no `name type data` header".into())
    }
}

/// Parses a pool's `io` kstat (a header row starting with `nread` of at
/// least 12 fields, then rows of values): calls `f(field, value)` for each
/// field of each row. Before the header, lines are ignored; none is no data.
pub fn parse_pool_io<'a>(text: &'a str, mut f: impl FnMut(&'a str, f64)) -> Result<(), String> {
    let mut header: Vec<&str> = Vec::new();
    for line in crate::parse::go_lines(text) {
        if header.is_empty() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            if parts.len() >= 12 && parts[0] == "nread" {
                header = parts;
            }
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let mut values = line.split_whitespace();
        for field in &header {
            let v = values.next().ok_or_else(|| format!("no value for {field:?}"))?;
            let v = parse_u64(v.as_bytes()).ok_or_else(|| format!("invalid integer for {field:?}: {v:?}"))?;
            f(field, v as f64);
        }
    }
    Ok(())
}

/// Parses a pool's `objset-*` kstat: calls `f(dataset, name, value)` for
/// each unsigned 64-bit row, `dataset` being the `dataset_name` row's value
/// seen so far (the rest of its line, spaces and all), if any. A file
/// without the header is an error.
pub fn parse_objset<'a>(text: &'a str, mut f: impl FnMut(Option<&'a str>, &'a str, f64)) -> Result<(), String> {
    let mut dataset = None;
    kstat_rows(text, |line, parts| {
        if parts[0] == "dataset_name" {
            // node_exporter takes the line from the first occurrence of the value.
            dataset = line.find(parts[2]).map(|i| &line[i..]);
        } else if parts[1] == KSTAT_DATA_UINT64 {
            let v = parse_u64(parts[2].as_bytes()).ok_or_else(|| format!("invalid unsigned integer for {:?}", parts[0]))?;
            f(dataset, parts[0], v as f64);
        }
        Ok(())
    })
}

/// A pool's `state` file: its first line, lower-cased (not trimmed).
pub fn parse_state(text: &str) -> String {
    crate::parse::go_lines(text).next().unwrap_or("").to_lowercase()
}

/// Reads a global kstat file; `Ok(false)` when it cannot be opened (this ZFS
/// has no such statistics), an error when it opens but cannot be read.
fn read_optional(path: &Path, buf: &mut Vec<u8>) -> Result<bool, Error> {
    match read_into(path, buf) {
        Ok(()) => Ok(true),
        Err(e) => match open_nonblocking(path) {
            Err(_) => {
                tracing::debug!(path = %path.display(), "cannot open file for reading");
                Ok(false)
            }
            Ok(_) => Err(Error::io(path, e)),
        },
    }
}

fn text<'b>(path: &Path, buf: &'b [u8]) -> Result<&'b str, Error> {
    std::str::from_utf8(buf).map_err(|_| Error::parse(path, "invalid UTF-8"))
}

/// The sorted names of a directory's entries (none when it can't be listed).
fn sorted_names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| match e.file_name().into_string() {
            Ok(n) => Some(n),
            Err(n) => {
                tracing::debug!(dir = %dir.display(), name = ?n, "skipping a name that is not UTF-8");
                None
            }
        })
        .collect();
    names.sort_unstable();
    names
}

/// The files of one pool directory: its `io`, `objset-*` (sorted) and `state`.
struct PoolFiles {
    name: String,
    io: Option<PathBuf>,
    objsets: Vec<PathBuf>,
    state: Option<PathBuf>,
}

impl Collector {
    fn update_global(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let Collector { files, buf, out, .. } = self;
        for ((subsystem, file), path) in SUBSYSTEMS.iter().zip(files.iter()) {
            if !read_optional(path, buf)? {
                continue;
            }
            let prefix = format!("node_{subsystem}_");
            let help_prefix = format!("kstat.zfs.misc.{file}.");
            parse_kstat(text(path, buf)?, |key, value| {
                out.names(&prefix, &help_prefix, key);
                // A repeated row keeps its first value; no two subsystems' prefixes overlap.
                if out.first(&[]) {
                    sink.new_family(&out.name, &out.help, Kind::Untyped).sample(&[], value);
                }
            })
            .map_err(|m| Error::parse(path, format!("did not parse a single {file:?} metric: {m}")))?;
        }
        Ok(())
    }

    fn pools(&self) -> Vec<PoolFiles> {
        let mut pools = Vec::new();
        for name in sorted_names(&self.base) {
            let dir = self.base.join(&name);
            if !std::fs::metadata(&dir).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let mut pool = PoolFiles { name, io: None, objsets: Vec::new(), state: None };
            for entry in sorted_names(&dir) {
                match entry.as_str() {
                    "io" => pool.io = Some(dir.join(entry)),
                    "state" => pool.state = Some(dir.join(entry)),
                    e if e.starts_with("objset-") => pool.objsets.push(dir.join(entry)),
                    _ => {}
                }
            }
            if pool.io.is_some() || pool.state.is_some() || !pool.objsets.is_empty() {
                pools.push(pool);
            }
        }
        pools
    }

    fn update_pools(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let pools = self.pools();
        let Collector { buf, out, .. } = self;
        out.next = sink.families().len();
        for pool in &pools {
            let zpool = pool.name.as_str();
            if let Some(path) = &pool.io {
                read_required(path, buf)?;
                parse_pool_io(text(path, buf)?, |field, value| {
                    out.names("node_zfs_zpool_", "kstat.zfs.misc.io.", field);
                    out.sample(sink, Kind::Untyped, &[("zpool", zpool)], value);
                })
                .map_err(|m| Error::parse(path, m))?;
            }
            for path in &pool.objsets {
                read_required(path, buf)?;
                parse_objset(text(path, buf)?, |dataset, key, value| {
                    // Rows before `dataset_name` have neither label value, as in node_exporter.
                    let (dataset, zpool) = dataset.map_or(("", ""), |d| (d, zpool));
                    out.names("node_zfs_zpool_dataset_", "kstat.zfs.misc.objset.", key);
                    out.sample(sink, Kind::Untyped, &[("dataset", dataset), ("zpool", zpool)], value);
                })
                .map_err(|m| Error::parse(path, format!("did not parse a single metric: {m}")))?;
            }
        }
        for pool in &pools {
            let Some(path) = &pool.state else { continue };
            read_required(path, buf)?;
            let state = parse_state(text(path, buf)?);
            out.name.clear();
            out.name.push_str("node_zfs_zpool_state");
            out.help.clear();
            out.help.push_str("kstat.zfs.misc.state");
            for s in POOL_STATES {
                out.sample(sink, Kind::Gauge, &[("state", s), ("zpool", &pool.name)], if state == s { 1.0 } else { 0.0 });
            }
        }
        Ok(())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        if std::fs::metadata(&self.base).is_err() {
            tracing::debug!(path = %self.base.display(), "cannot open file for reading");
            return Err(Error::NoData("ZFS / ZFS statistics are not available".into()));
        }
        self.out.seen.clear();
        self.out.index.clear();
        self.update_global(sink)?;
        self.update_pools(sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARCSTATS: &str = "6 1 0x01 91 4368 5266997922 97951858082072
name                            type data
anon_evictable_data             4    0
anon_size                       4    1917440
hits                            4    8772612
memory_available_bytes          3    -922337203685477580
some_string                     7    hello
";

    const FM: &str = "0 1 0x01 4 192 8007255140 354329591145385
name                            type data
erpt-dropped                    4    18
erpt-set-failed                 4    0
";

    const IO: &str = "12 3 0x00 1 80 79205351707403 395818011156865
nread    nwritten reads    writes   wtime    wlentime wupdate  rtime    rlentime rupdate  wcnt     rcnt    
1884160  3206144  22       132      7155162  104112268 79210489694949 24168078 104112268 79210489849220 0        0       
";

    const OBJSET: &str = "24 1 0x01 7 2160 221611904716 7145015038451
name                            type data
dataset_name                    7    pool3/dataset with  space
writes                          4    4
nwritten                        4    12302
nunlinked                       4    3
";

    fn kstat(text: &str) -> Result<Vec<(String, f64)>, String> {
        let mut out = Vec::new();
        parse_kstat(text, |k, v| out.push((k.to_string(), v)))?;
        Ok(out)
    }

    #[test]
    fn parses_kstat_files() {
        let rows = kstat(ARCSTATS).unwrap();
        assert_eq!(
            rows,
            vec![
                ("anon_evictable_data".to_string(), 0.0),
                ("anon_size".to_string(), 1917440.0),
                ("hits".to_string(), 8772612.0),
                ("memory_available_bytes".to_string(), -922337203685477580.0),
            ]
        );
        let rows = kstat(FM).unwrap();
        assert_eq!(rows[0], ("erpt-dropped".to_string(), 18.0));
        assert_eq!(metric_name("erpt-set-failed"), "erpt_set_failed");
        assert_eq!(metric_name("a.b.c-d"), "c_d");
    }

    #[test]
    fn rejects_malformed_kstat_files() {
        assert!(kstat("").is_err());
        assert!(kstat("6 1 0x01\nhits 4 1\n").is_err());
        assert!(kstat("name type data\nhits 4 -1\n").is_err());
        assert!(kstat("name type data\nhits 4 +1\n").is_err());
        assert!(kstat("name type data\nhits 3 x\n").is_err());
        assert!(kstat("name type data\nhits 4 99999999999999999999999\n").is_err());
        // Short rows and unknown types are skipped.
        assert_eq!(kstat("name type data\nhits 4\n\nx 9 y\n").unwrap(), vec![]);
        assert_eq!(kstat("name type data\r\nhits 4 7\r\n").unwrap(), vec![("hits".to_string(), 7.0)]);
    }

    #[test]
    fn parses_pool_io() {
        let mut rows = Vec::new();
        parse_pool_io(IO, |k, v| rows.push((k, v))).unwrap();
        assert_eq!(rows.len(), 12);
        assert_eq!(rows[0], ("nread", 1884160.0));
        assert_eq!(rows[6], ("wupdate", 79210489694949.0));
        assert_eq!(rows[11], ("rcnt", 0.0));
        // No header: no data, no error.
        rows.clear();
        parse_pool_io("12 3 0x00\n1 2 3\n", |k, v| rows.push((k, v))).unwrap();
        assert!(rows.is_empty());
        // A short or bad row is an error.
        let header = IO.lines().take(2).collect::<Vec<_>>().join("\n");
        assert!(parse_pool_io(&format!("{header}\n1 2 3\n"), |_, _| {}).is_err());
        assert!(parse_pool_io(&format!("{header}\n1 2 3 4 5 6 7 8 9 10 11 x\n"), |_, _| {}).is_err());
    }

    #[test]
    fn parses_objsets() {
        let mut rows = Vec::new();
        parse_objset(OBJSET, |d, k, v| rows.push((d, k, v))).unwrap();
        assert_eq!(
            rows,
            vec![
                (Some("pool3/dataset with  space"), "writes", 4.0),
                (Some("pool3/dataset with  space"), "nwritten", 12302.0),
                (Some("pool3/dataset with  space"), "nunlinked", 3.0),
            ]
        );
        rows.clear();
        parse_objset("name type data\nwrites 4 1\nsigned 3 -1\n", |d, k, v| rows.push((d, k, v))).unwrap();
        assert_eq!(rows, vec![(None, "writes", 1.0)]);
        assert!(parse_objset("writes 4 1\n", |_, _, _| {}).is_err());
        assert!(parse_objset("name type data\nwrites 4 z\n", |_, _, _| {}).is_err());
    }

    #[test]
    fn parses_state() {
        assert_eq!(parse_state("ONLINE\n"), "online");
        assert_eq!(parse_state("SUSPENDED\nx\n"), "suspended");
        assert_eq!(parse_state(""), "");
        assert_eq!(parse_state("ONLINE \n"), "online ");
    }

    fn paths(root: &Path) -> Paths {
        Paths { procfs: root.join("proc"), sysfs: root.join("sys"), rootfs: root.to_path_buf(), udev_data: root.join("udev") }
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    type Labels = Vec<(String, String)>;
    type Scraped = Vec<(String, Kind, Vec<(Labels, f64)>)>;

    fn scrape(root: &Path) -> Result<Scraped, Error> {
        let mut c = Collector::new(&paths(root));
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        let mut out: Vec<_> = sink
            .families()
            .iter()
            .map(|f| {
                let samples =
                    f.samples().map(|(l, v)| (l.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), v)).collect::<Vec<_>>();
                (f.name().to_string(), f.kind(), samples)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    #[test]
    fn no_kstat_directory_is_no_data() {
        let dir = tempdir();
        assert!(scrape(&dir).unwrap_err().is_no_data());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!("zfs-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn collects_a_tree() {
        let dir = tempdir();
        let zfs = dir.join("proc/spl/kstat/zfs");
        write(&zfs.join("arcstats"), ARCSTATS);
        write(&zfs.join("fm"), FM);
        write(&zfs.join("pool3/io"), IO);
        write(&zfs.join("pool3/objset-2"), OBJSET);
        write(&zfs.join("pool3/state"), "DEGRADED\n");
        let out = scrape(&dir).unwrap();
        let names: Vec<&str> = out.iter().map(|f| f.0.as_str()).collect();
        assert!(names.contains(&"node_zfs_arc_hits"));
        assert!(names.contains(&"node_zfs_fm_erpt_dropped"));
        assert!(names.contains(&"node_zfs_zpool_nread"));
        let ds = out.iter().find(|f| f.0 == "node_zfs_zpool_dataset_nwritten").unwrap();
        assert_eq!(ds.1, Kind::Untyped);
        assert_eq!(ds.2, vec![(vec![("dataset".into(), "pool3/dataset with  space".into()), ("zpool".into(), "pool3".into())], 12302.0)]);
        let state = out.iter().find(|f| f.0 == "node_zfs_zpool_state").unwrap();
        assert_eq!(state.1, Kind::Gauge);
        assert_eq!(state.2.len(), 7);
        assert_eq!(state.2.iter().filter(|s| s.1 == 1.0).count(), 1);
        assert_eq!(state.2[1].0[0].1, "degraded");
        assert_eq!(state.2[1].1, 1.0);
        // 12 io fields, 3 objset rows, 4 arcstats and 2 fm rows, one state family.
        assert_eq!(out.len(), 12 + 3 + 4 + 2 + 1);

        write(&zfs.join("zil"), "garbage\n");
        assert!(matches!(scrape(&dir), Err(Error::Parse { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_kstat_directory_is_success() {
        let dir = tempdir();
        std::fs::create_dir_all(dir.join("proc/spl/kstat/zfs")).unwrap();
        assert!(scrape(&dir).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
