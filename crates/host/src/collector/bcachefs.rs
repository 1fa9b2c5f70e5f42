//! `bcachefs`: every mounted bcachefs filesystem under /sys/fs/bcachefs/<uuid>/
//! (btree_cache_size, compression_stats, errors, counters/*, btree_write_stats
//! and each dev-<n>/ device's label, state, bucket_size, nbuckets, durability,
//! io_done and io_errors), read as prometheus/procfs's bcachefs package reads
//! it (size strings such as "2.05G" in bytes, powers of 1024), exported as
//! node_exporter's `node_bcachefs_*` families: filesystem info, btree cache
//! size, compressed and uncompressed bytes per algorithm, error counts per
//! type, one `node_bcachefs_<counter>_total` family per counter (its value
//! since filesystem creation), btree writes and their average size per type,
//! and per device its info, bucket size and count, durability, IO bytes per
//! operation and data type, and IO errors per type since creation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;

use crate::parse::GoNumError;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// Go's `bufio.Scanner` token limit (a longer line is an error).
const SCAN_MAX: usize = 64 * 1024;
/// The limit procfs raises it to for compression_stats and btree_write_stats.
const SCAN_MAX_LARGE: usize = 1024 * 1024;
/// procfs reads single-value attributes through `ReadFileNoStat`, which
/// stops at 1 MiB.
const READ_LIMIT: usize = 1024 * 1024;
/// Counter names remembered with their family name and help.
const MAX_CACHED_COUNTERS: usize = 4096;

const INFO: &str = "node_bcachefs_info";
const BTREE_CACHE: &str = "node_bcachefs_btree_cache_size_bytes";
const COMPRESSED: &str = "node_bcachefs_compression_compressed_bytes";
const UNCOMPRESSED: &str = "node_bcachefs_compression_uncompressed_bytes";
const ERRORS: &str = "node_bcachefs_errors_total";
const BTREE_WRITES: &str = "node_bcachefs_btree_writes_total";
const BTREE_WRITE_SIZE: &str = "node_bcachefs_btree_write_average_size_bytes";
const DEV_INFO: &str = "node_bcachefs_device_info";
const DEV_BUCKET_SIZE: &str = "node_bcachefs_device_bucket_size_bytes";
const DEV_BUCKETS: &str = "node_bcachefs_device_buckets";
const DEV_DURABILITY: &str = "node_bcachefs_device_durability";
const DEV_IO_DONE: &str = "node_bcachefs_device_io_done_bytes_total";
const DEV_IO_ERRORS: &str = "node_bcachefs_device_io_errors_total";

/// Families of fixed label sets a counter's family must not land in.
const FIXED_COUNTER_FAMILIES: [&str; 4] = [ERRORS, BTREE_WRITES, DEV_IO_DONE, DEV_IO_ERRORS];

// ---- Go-compatible scalar parsing -------------------------------------------

/// Go's `strconv.ParseUint(s, 10, 64)`: ASCII digits only, no sign.
pub fn parse_uint(s: &str) -> Result<u64, String> {
    crate::parse::parse_go_dec_uint(s).map_err(|e| match e {
        GoNumError::Syntax => format!("invalid unsigned integer {s:?}"),
        GoNumError::Range => format!("unsigned integer {s:?} out of range"),
    })
}

/// Go's `strconv.ParseFloat(s, 64)` for the decimal forms (hexadecimal
/// floats are not accepted): "inf"/"infinity" with an optional sign, "nan"
/// without one, and a value out of range is an error, not ±Inf.
fn parse_float(s: &str) -> Option<f64> {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned.eq_ignore_ascii_case("inf") || unsigned.eq_ignore_ascii_case("infinity") {
        return Some(if s.starts_with('-') { f64::NEG_INFINITY } else { f64::INFINITY });
    }
    if unsigned.eq_ignore_ascii_case("nan") {
        return (unsigned.len() == s.len()).then_some(f64::NAN);
    }
    if !unsigned.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
        return None;
    }
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Go's `uint64(f)` on amd64 (node_exporter's release builds): values
/// below 2^63 convert as int64 (so negative ones wrap), the rest have 2^63
/// subtracted first; out of range and NaN give the "integer indefinite"
/// 1<<63.
fn go_f64_to_u64(x: f64) -> u64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    fn cvt(x: f64) -> i64 {
        if (-TWO63..TWO63).contains(&x) {
            x as i64
        } else {
            i64::MIN
        }
    }
    if x < TWO63 {
        cvt(x) as u64
    } else {
        cvt(x - TWO63) as u64 | 1 << 63
    }
}

/// A size as bcachefs prints it ("720", "28.2k", "2.05G", "10.8T"), in
/// bytes: one trailing k, M, G, T, P or E (either case) is a power of 1024;
/// the product is truncated to an integer.
pub fn parse_human_bytes(s: &str) -> Result<u64, String> {
    const K: f64 = 1024.0;
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last() {
        None => return Err("empty string".into()),
        Some(b'k' | b'K') => (&s[..s.len() - 1], K),
        Some(b'm' | b'M') => (&s[..s.len() - 1], K * K),
        Some(b'g' | b'G') => (&s[..s.len() - 1], K * K * K),
        Some(b't' | b'T') => (&s[..s.len() - 1], K * K * K * K),
        Some(b'p' | b'P') => (&s[..s.len() - 1], K * K * K * K * K),
        Some(b'e' | b'E') => (&s[..s.len() - 1], K * K * K * K * K * K),
        Some(_) => (s, 1.0),
    };
    let v = parse_float(num.trim()).ok_or_else(|| format!("invalid size {s:?}"))?;
    Ok(go_f64_to_u64(v * mult))
}

/// node_exporter's `SanitizeMetricName`: every match of
/// `_*[^0-9A-Za-z_]+_*` becomes one underscore.
pub fn sanitize_metric_name(name: &str) -> Cow<'_, str> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if name.chars().all(word) {
        return Cow::Borrowed(name);
    }
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let mut j = i;
        while j < chars.len() && chars[j] == '_' {
            j += 1;
        }
        let mut k = j;
        while k < chars.len() && !word(chars[k]) {
            k += 1;
        }
        if k > j {
            while k < chars.len() && chars[k] == '_' {
                k += 1;
            }
            out.push('_');
            i = k;
        } else {
            // No match from any of the underscores up to j: keep them.
            let end = j.max(i + 1);
            out.extend(&chars[i..end]);
            i = end;
        }
    }
    Cow::Owned(out)
}

// ---- file parsers -------------------------------------------------------------

/// Lines as Go's `bufio.Scanner` yields them (split at '\n', a trailing
/// '\r' dropped, no empty last line); a line of `max` bytes or more is an
/// error where the scanner reaches it.
struct Lines<'a> {
    rest: &'a str,
    max: usize,
}

fn scan(text: &str, max: usize) -> Lines<'_> {
    Lines { rest: text, max }
}

impl<'a> Iterator for Lines<'a> {
    type Item = Result<&'a str, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let (line, rest) = self.rest.split_once('\n').unwrap_or((self.rest, ""));
        self.rest = rest;
        if line.len() >= self.max {
            self.rest = "";
            return Some(Err(format!("line longer than {} bytes", self.max - 1)));
        }
        Some(Ok(line.strip_suffix('\r').unwrap_or(line)))
    }
}

/// One algorithm's line of compression_stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compression {
    pub compressed: u64,
    pub uncompressed: u64,
}

/// compression_stats: a header line, then `<algorithm>[:] <compressed>
/// <uncompressed> [<average extent size>]` (sizes; the average is checked,
/// not exported). Lines of fewer than three fields are skipped.
pub fn parse_compression_stats(text: &str) -> Result<BTreeMap<&str, Compression>, String> {
    let mut out = BTreeMap::new();
    table_rows(text, |alg, c, u, mut rest| {
        let compressed = parse_human_bytes(c)?;
        let uncompressed = parse_human_bytes(u)?;
        if let Some(avg) = rest.next() {
            parse_human_bytes(avg)?;
        }
        out.insert(alg, Compression { compressed, uncompressed });
        Ok(())
    })?;
    Ok(out)
}

/// The rows of a table file (compression_stats, btree_write_stats): after
/// a header line, `<name>[:] <a> <b> [...]`, handed to `row` as the name
/// (without its `:`), `a`, `b` and the fields after them. Lines of fewer
/// than three fields are skipped.
fn table_rows<'a>(
    text: &'a str,
    mut row: impl FnMut(&'a str, &'a str, &'a str, std::str::SplitWhitespace<'a>) -> Result<(), String>,
) -> Result<(), String> {
    for (n, line) in scan(text, SCAN_MAX_LARGE).enumerate() {
        let line = line?;
        if n == 0 {
            continue;
        }
        let mut f = line.split_whitespace();
        let (Some(name), Some(a), Some(b)) = (f.next(), f.next(), f.next()) else { continue };
        row(name.strip_suffix(':').unwrap_or(name), a, b, f)?;
    }
    Ok(())
}

/// errors: `<error type> <count> [<last time>]`; lines of fewer than two
/// fields are skipped. Returns the counts.
pub fn parse_errors(text: &str) -> Result<BTreeMap<&str, u64>, String> {
    let mut out = BTreeMap::new();
    for line in scan(text, SCAN_MAX) {
        let mut f = line?.split_whitespace();
        let (Some(name), Some(count)) = (f.next(), f.next()) else { continue };
        let count = parse_uint(count)?;
        if let Some(ts) = f.next() {
            parse_uint(ts)?;
        }
        out.insert(name, count);
    }
    Ok(out)
}

/// A counters/<name> file: `since mount: <n>` and `since filesystem
/// creation: <n>` (sizes). Returns the value since creation (0 when only
/// the one since mount is there); a file with neither line is an error.
pub fn parse_counter(text: &str) -> Result<u64, String> {
    let mut seen = false;
    let mut creation = 0;
    for line in scan(text, SCAN_MAX) {
        let line = line?;
        if let Some(v) = line.strip_prefix("since mount:") {
            parse_human_bytes(v)?;
            seen = true;
        } else if let Some(v) = line.strip_prefix("since filesystem creation:") {
            creation = parse_human_bytes(v)?;
            seen = true;
        }
    }
    if !seen {
        return Err("counter file format not recognized".into());
    }
    Ok(creation)
}

/// One type's line of btree_write_stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BtreeWrites {
    pub count: u64,
    pub size_bytes: u64,
}

/// btree_write_stats: a header line, then `<type>[:] <count> <average
/// size>`; lines of fewer than three fields are skipped.
pub fn parse_btree_write_stats(text: &str) -> Result<BTreeMap<&str, BtreeWrites>, String> {
    let mut out = BTreeMap::new();
    table_rows(text, |ty, count, size, _| {
        let count = parse_uint(count)?;
        let size_bytes = parse_human_bytes(size)?;
        out.insert(ty, BtreeWrites { count, size_bytes });
        Ok(())
    })?;
    Ok(out)
}

/// IO bytes per operation ("read", "write"), then per data type.
pub type IoDone<'a> = BTreeMap<&'a str, BTreeMap<&'a str, u64>>;

/// A device's io_done: `read:` and `write:` sections of `<data type>:
/// <bytes>` lines; lines before the first section or without a colon are
/// skipped.
pub fn parse_io_done(text: &str) -> Result<IoDone<'_>, String> {
    let mut out = IoDone::new();
    let mut op = None;
    for line in scan(text, SCAN_MAX) {
        let line = line?.trim();
        if line.is_empty() {
            continue;
        }
        if line == "read:" || line == "write:" {
            let name = &line[..line.len() - 1];
            out.entry(name).or_default();
            op = Some(name);
            continue;
        }
        let Some(op) = op else { continue };
        let Some((ty, v)) = line.split_once(':') else { continue };
        let v = parse_uint(v.trim())?;
        out.entry(op).or_default().insert(ty.trim(), v);
    }
    Ok(out)
}

/// A device's io_errors: the `<type>: <count>` lines of its "IO errors
/// since filesystem creation" section, which ends at the next "IO errors
/// since ..." heading.
pub fn parse_io_errors(text: &str) -> Result<BTreeMap<&str, u64>, String> {
    let mut out = BTreeMap::new();
    let mut in_creation = false;
    for line in scan(text, SCAN_MAX) {
        let line = line?;
        if line.starts_with("IO errors since filesystem creation") {
            in_creation = true;
            continue;
        }
        if line.starts_with("IO errors since ") {
            break;
        }
        if !in_creation {
            continue;
        }
        let Some((ty, v)) = line.trim().split_once(':') else { continue };
        out.insert(ty.trim(), parse_uint(v.trim())?);
    }
    Ok(out)
}

// ---- I/O -------------------------------------------------------------------------

/// Reads `path` into `buf`: `Ok(false)` (and an empty buffer) when it does
/// not exist, any other failure is an error.
fn read_opt(path: &Path, buf: &mut Vec<u8>) -> Result<bool, Error> {
    match crate::io::read_into(path, buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            buf.clear();
            Ok(false)
        }
        Err(e) => Err(Error::io(path, e)),
    }
}

/// A single-value attribute, trimmed and cut at `READ_LIMIT`: `None` when
/// it does not exist.
fn read_value<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Result<Option<Cow<'b, str>>, Error> {
    if !read_opt(path, buf)? {
        return Ok(None);
    }
    buf.truncate(READ_LIMIT);
    Ok(Some(trimmed(buf)))
}

/// An attribute read as procfs's `readSysfsFile` does: any failure is "".
fn read_label<'b>(path: &Path, buf: &'b mut Vec<u8>) -> Cow<'b, str> {
    if crate::io::read_into(path, buf).is_err() {
        buf.clear();
    }
    buf.truncate(READ_LIMIT);
    trimmed(buf)
}

fn trimmed(buf: &[u8]) -> Cow<'_, str> {
    match String::from_utf8_lossy(buf) {
        Cow::Borrowed(s) => Cow::Borrowed(s.trim()),
        Cow::Owned(s) => Cow::Owned(s.trim().to_string()),
    }
}

/// The directories of `dir` (not following symlinks), by name, sorted.
fn subdirs(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.push((e.file_name().to_string_lossy().into_owned(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// A counter's family: `None` when its name would land in a family of
/// another label set (client_golang rejects such a sample).
type CounterFamily = Option<(String, String)>;

pub struct Collector {
    base: PathBuf,
    buf: Vec<u8>,
    aux: Vec<u8>,
    /// Counter file name to its family (name and help).
    families: FxHashMap<String, CounterFamily>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { base: p.sys("fs/bcachefs"), buf: Vec::new(), aux: Vec::new(), families: FxHashMap::default() }
    }

    fn filesystem(&mut self, uuid: &str, dir: &Path, sink: &mut Sink) -> Result<(), Error> {
        let p = dir.join("btree_cache_size");
        let cache = match read_value(&p, &mut self.buf)? {
            Some(v) if !v.is_empty() => parse_human_bytes(&v).map_err(|m| Error::parse(&p, m))?,
            _ => 0,
        };
        sink.family(INFO, "Filesystem information.", Kind::Gauge).sample(&[("uuid", uuid)], 1.0);
        sink.family(BTREE_CACHE, "Btree cache memory usage in bytes.", Kind::Gauge).sample(&[("uuid", uuid)], cache as f64);

        let p = dir.join("compression_stats");
        if read_opt(&p, &mut self.buf)? {
            let text = String::from_utf8_lossy(&self.buf);
            let stats = parse_compression_stats(&text).map_err(|m| Error::parse(&p, m))?;
            if !stats.is_empty() {
                let mut f = sink.family(COMPRESSED, "Compressed size by algorithm.", Kind::Gauge);
                for (alg, c) in &stats {
                    f.sample(&[("algorithm", alg), ("uuid", uuid)], c.compressed as f64);
                }
                let mut f = sink.family(UNCOMPRESSED, "Uncompressed size by algorithm.", Kind::Gauge);
                for (alg, c) in &stats {
                    f.sample(&[("algorithm", alg), ("uuid", uuid)], c.uncompressed as f64);
                }
            }
        }

        let p = dir.join("errors");
        if read_opt(&p, &mut self.buf)? {
            let text = String::from_utf8_lossy(&self.buf);
            let errors = parse_errors(&text).map_err(|m| Error::parse(&p, m))?;
            if !errors.is_empty() {
                let mut f = sink.family(ERRORS, "Error count by error type.", Kind::Counter);
                for (ty, n) in &errors {
                    f.sample(&[("error_type", ty), ("uuid", uuid)], *n as f64);
                }
            }
        }

        self.counters(uuid, &dir.join("counters"), sink)?;

        let p = dir.join("btree_write_stats");
        if read_opt(&p, &mut self.buf)? {
            let text = String::from_utf8_lossy(&self.buf);
            let writes = parse_btree_write_stats(&text).map_err(|m| Error::parse(&p, m))?;
            if !writes.is_empty() {
                let mut f = sink.family(BTREE_WRITES, "Number of btree writes by type.", Kind::Counter);
                for (ty, w) in &writes {
                    f.sample(&[("type", ty), ("uuid", uuid)], w.count as f64);
                }
                let mut f = sink.family(BTREE_WRITE_SIZE, "Average btree write size by type.", Kind::Gauge);
                for (ty, w) in &writes {
                    f.sample(&[("type", ty), ("uuid", uuid)], w.size_bytes as f64);
                }
            }
        }

        let devices = subdirs(dir).map_err(|e| Error::from_read(dir, e))?;
        for (name, path) in &devices {
            if let Some(device) = name.strip_prefix("dev-") {
                self.device(uuid, device, path, sink)?;
            }
        }
        Ok(())
    }

    /// One family per counters/<name> file, valued since filesystem creation.
    fn counters(&mut self, uuid: &str, dir: &Path, sink: &mut Sink) -> Result<(), Error> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(dir, e)),
        };
        let mut files = Vec::new();
        for e in rd {
            let e = e.map_err(|e| Error::io(dir, e))?;
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                files.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        files.sort();
        if self.families.len() > MAX_CACHED_COUNTERS {
            self.families.clear();
        }
        let mut values = Vec::with_capacity(files.len());
        for name in files {
            let p = dir.join(&name);
            // A counter that went away since the listing counts 0, as in procfs.
            let value = if read_opt(&p, &mut self.buf)? {
                parse_counter(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&p, m))?
            } else {
                0
            };
            if !self.families.contains_key(&name) {
                let family = format!("node_bcachefs_{}_total", sanitize_metric_name(&name));
                let entry = (!FIXED_COUNTER_FAMILIES.contains(&family.as_str()))
                    .then(|| (family, format!("Bcachefs counter {name} since filesystem creation.")));
                self.families.insert(name.clone(), entry);
            }
            values.push((name, value));
        }
        // Names that sanitize alike: the first (by file name) wins, as a
        // repeated series would be dropped.
        let mut out: Vec<(&str, &str, u64)> =
            values.iter().filter_map(|(name, v)| self.families.get(name)?.as_ref().map(|(f, h)| (f.as_str(), h.as_str(), *v))).collect();
        out.sort_by(|a, b| a.0.cmp(b.0));
        out.dedup_by(|a, b| a.0 == b.0);
        for (family, help, v) in out {
            sink.family(family, help, Kind::Counter).sample(&[("uuid", uuid)], v as f64);
        }
        Ok(())
    }

    fn device(&mut self, uuid: &str, device: &str, dir: &Path, sink: &mut Sink) -> Result<(), Error> {
        let dev = [("device", device), ("uuid", uuid)];
        {
            let label = read_label(&dir.join("label"), &mut self.buf);
            let state = read_label(&dir.join("state"), &mut self.aux);
            sink.family(DEV_INFO, "Device information.", Kind::Gauge)
                .sample(&[("device", device), ("label", &label), ("state", &state), ("uuid", uuid)], 1.0);
        }

        let p = dir.join("bucket_size");
        let raw = read_label(&p, &mut self.buf);
        let bucket_size = if raw.is_empty() { 0 } else { parse_human_bytes(&raw).map_err(|m| Error::parse(&p, m))? };
        sink.family(DEV_BUCKET_SIZE, "Bucket size in bytes.", Kind::Gauge).sample(&dev, bucket_size as f64);

        for (file, family, help) in
            [("nbuckets", DEV_BUCKETS, "Total number of buckets."), ("durability", DEV_DURABILITY, "Device durability setting.")]
        {
            let p = dir.join(file);
            let v = match read_value(&p, &mut self.buf)? {
                Some(v) => parse_uint(&v).map_err(|m| Error::parse(&p, m))?,
                None => 0,
            };
            sink.family(family, help, Kind::Gauge).sample(&dev, v as f64);
        }

        let p = dir.join("io_done");
        if read_opt(&p, &mut self.buf)? {
            let text = String::from_utf8_lossy(&self.buf);
            let done = parse_io_done(&text).map_err(|m| Error::parse(&p, m))?;
            if done.values().any(|m| !m.is_empty()) {
                let mut f = sink.family(DEV_IO_DONE, "IO bytes by operation type and data type.", Kind::Counter);
                for (op, types) in &done {
                    for (ty, v) in types {
                        f.sample(&[("data_type", ty), ("device", device), ("operation", op), ("uuid", uuid)], *v as f64);
                    }
                }
            }
        }

        let p = dir.join("io_errors");
        if read_opt(&p, &mut self.buf)? {
            let text = String::from_utf8_lossy(&self.buf);
            let errors = parse_io_errors(&text).map_err(|m| Error::parse(&p, m))?;
            if !errors.is_empty() {
                let mut f = sink.family(DEV_IO_ERRORS, "IO errors by error type.", Kind::Counter);
                for (ty, v) in &errors {
                    f.sample(&[("device", device), ("type", ty), ("uuid", uuid)], *v as f64);
                }
            }
        }
        Ok(())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let filesystems = subdirs(&self.base).map_err(|e| Error::from_read(&self.base, e))?;
        if filesystems.is_empty() {
            return Err(Error::NoData(format!("no bcachefs filesystems in {}", self.base.display())));
        }
        for (uuid, dir) in &filesystems {
            self.filesystem(uuid, dir, sink)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, write};
    use crate::Collector as _;

    const COMPRESSION: &str = "\
typetype          compressed    uncompressed     average extent size
lz4_old                    0               0                       0
gzip                       0               0                       0
lz4                    48.9G           71.2G                   62.5k
zstd                    226G            603G                    115k
incompressible         10.8T           10.8T                   90.4k
";

    const ERRORS_FILE: &str = "\
btree_node_data_missing                         2       1753593586
alloc_key_to_missing_lru_entry                  4517    1771754289
extent_io_opts_not_set                          11299659571772285102
";

    const BTREE_WRITE_STATS: &str = "\
                   nr        size
initial:           3298401   100k
init_next_bset:    4055926   28.2k
cache_reclaim:     14401     720
journal_reclaim:   66903805  697
interior:          3035363   1.26k
";

    const IO_DONE: &str = "\
read:
sb          :       86016
journal     :           0
btree       :     8912896
user        :610019098624
write:
sb          :      677376
user        :562070339584
";

    const IO_ERRORS: &str = "\
IO errors since filesystem creation
  read:    18828
  write:   1
  checksum:5
IO errors since 8 y ago
  read:    7
  write:   7
  checksum:7
";

    #[test]
    fn sizes_are_powers_of_1024_truncated() {
        assert_eq!(parse_human_bytes("2.05G"), Ok(2_201_170_739));
        assert_eq!(parse_human_bytes("10.8T"), Ok(11_874_725_579_980));
        assert_eq!(parse_human_bytes("18.9T"), Ok(20_780_769_764_966));
        assert_eq!(parse_human_bytes("28.2k"), Ok(28_876));
        assert_eq!(parse_human_bytes("512k"), Ok(524_288));
        assert_eq!(parse_human_bytes("2.00M"), Ok(2_097_152));
        assert_eq!(parse_human_bytes(" 720 \n"), Ok(720));
        assert_eq!(parse_human_bytes("1p"), Ok(1 << 50));
        assert_eq!(parse_human_bytes("1E"), Ok(1 << 60));
        assert_eq!(parse_human_bytes("3 K"), Ok(3072));
        // An exponent is a number's; a trailing e is exa.
        assert_eq!(parse_human_bytes("1e3"), Ok(1000));
        assert_eq!(parse_human_bytes("1e3K"), Ok(1_024_000));
        assert_eq!(parse_human_bytes("1e"), Ok(1 << 60));
    }

    #[test]
    fn malformed_sizes_are_errors() {
        for bad in ["", "   ", "K", "1.2X", "5KB", "abc", "1_000", "0x1p4", "1e400", "-nan", "1..2", "1,5M"] {
            assert!(parse_human_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn out_of_range_sizes_convert_as_go_does_on_amd64() {
        assert_eq!(parse_human_bytes("-1"), Ok(u64::MAX));
        assert_eq!(parse_human_bytes("-0.5"), Ok(0));
        assert_eq!(parse_human_bytes("inf"), Ok(1 << 63));
        assert_eq!(parse_human_bytes("-Infinity"), Ok(1 << 63));
        assert_eq!(parse_human_bytes("NaN"), Ok(1 << 63));
        assert_eq!(parse_human_bytes("20E"), Ok(1 << 63));
        assert_eq!(parse_human_bytes("15E"), Ok(15 << 60));
    }

    #[test]
    fn unsigned_integers_as_go_parses_them() {
        assert_eq!(parse_uint("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_uint("000000000000000000000042"), Ok(42));
        for bad in ["", "+1", "-1", "1 ", "18446744073709551616", "1.0"] {
            assert!(parse_uint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn metric_names_are_sanitized_as_node_exporter_does() {
        assert!(matches!(sanitize_metric_name("data_read_split"), Cow::Borrowed("data_read_split")));
        assert_eq!(sanitize_metric_name("a-b"), "a_b");
        assert_eq!(sanitize_metric_name("a__-__b"), "a_b");
        assert_eq!(sanitize_metric_name("a-_-b"), "a__b");
        assert_eq!(sanitize_metric_name("__a.b__"), "__a_b__");
        assert_eq!(sanitize_metric_name("x..y"), "x_y");
        assert_eq!(sanitize_metric_name("é"), "_");
        assert_eq!(sanitize_metric_name("a_"), "a_");
        assert_eq!(sanitize_metric_name("-"), "_");
    }

    #[test]
    fn parses_compression_stats() {
        let m = parse_compression_stats(COMPRESSION).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m["lz4_old"], Compression::default());
        assert_eq!(m["lz4"], Compression { compressed: 52_505_975_193, uncompressed: 76_450_417_868 });
        assert_eq!(m["zstd"], Compression { compressed: 242_665_652_224, uncompressed: 647_466_319_872 });
        assert_eq!(m["incompressible"].compressed, 11_874_725_579_980);
        // The header is skipped whatever it says, short lines too, a colon is dropped.
        let m = parse_compression_stats("lz4 1 2\nshort 1\n\nlz4: 1k 2k\n").unwrap();
        assert_eq!(m.into_iter().collect::<Vec<_>>(), vec![("lz4", Compression { compressed: 1024, uncompressed: 2048 })]);
        // The average extent size is checked though not exported.
        assert!(parse_compression_stats("h\nlz4 1 2 x\n").is_err());
        assert!(parse_compression_stats("h\nlz4 1 -x\n").is_err());
        assert_eq!(parse_compression_stats("").unwrap().len(), 0);
    }

    #[test]
    fn parses_errors() {
        let m = parse_errors(ERRORS_FILE).unwrap();
        assert_eq!(m["btree_node_data_missing"], 2);
        assert_eq!(m["alloc_key_to_missing_lru_entry"], 4517);
        // A count run into its timestamp is one (large) count.
        assert_eq!(m["extent_io_opts_not_set"], 11_299_659_571_772_285_102);
        assert_eq!(parse_errors("lonely\n\n").unwrap().len(), 0);
        assert!(parse_errors("x 1.5 2\n").is_err());
        assert!(parse_errors("x 1 y\n").is_err());
        assert!(parse_errors("x 99999999999999999999\n").is_err());
    }

    #[test]
    fn parses_counters() {
        assert_eq!(parse_counter("since mount:                   346G\nsince filesystem creation:     18.9T\n"), Ok(20_780_769_764_966));
        assert_eq!(parse_counter("since mount:                   302707\nsince filesystem creation:     1515147\n"), Ok(1_515_147));
        assert_eq!(parse_counter("since mount: 5\n"), Ok(0));
        assert!(parse_counter("").is_err());
        assert!(parse_counter("  since mount: 5\n").is_err(), "the prefix is matched at the start of the line");
        assert!(parse_counter("since mount: x\nsince filesystem creation: 1\n").is_err());
        assert!(parse_counter("since filesystem creation:\n").is_err());
    }

    #[test]
    fn parses_btree_write_stats() {
        let m = parse_btree_write_stats(BTREE_WRITE_STATS).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m["initial"], BtreeWrites { count: 3_298_401, size_bytes: 102_400 });
        assert_eq!(m["init_next_bset"], BtreeWrites { count: 4_055_926, size_bytes: 28_876 });
        assert_eq!(m["interior"], BtreeWrites { count: 3_035_363, size_bytes: 1290 });
        assert_eq!(m["cache_reclaim"].size_bytes, 720);
        assert!(parse_btree_write_stats("h\ninitial: 1k 100k\n").is_err());
        assert!(parse_btree_write_stats("h\ninitial: 1 1q\n").is_err());
        assert_eq!(parse_btree_write_stats("initial: x y\n").unwrap().len(), 0, "the header line is skipped");
    }

    #[test]
    fn parses_io_done() {
        let m = parse_io_done(IO_DONE).unwrap();
        assert_eq!(m["read"]["sb"], 86016);
        assert_eq!(m["read"]["btree"], 8_912_896);
        assert_eq!(m["read"]["user"], 610_019_098_624);
        assert_eq!(m["write"].len(), 2);
        assert_eq!(m["write"]["sb"], 677_376);
        // Lines before a section and lines without a colon are skipped.
        let m = parse_io_done("sb: x\nwrite:\nnothing here\n").unwrap();
        assert!(m["write"].is_empty());
        assert!(parse_io_done("read:\nsb: -1\n").is_err());
        assert!(parse_io_done("read:\nsb:\n").is_err());
    }

    #[test]
    fn parses_io_errors_of_the_creation_section_only() {
        let m = parse_io_errors(IO_ERRORS).unwrap();
        assert_eq!(m.into_iter().collect::<Vec<_>>(), vec![("checksum", 5), ("read", 18828), ("write", 1)]);
        assert_eq!(parse_io_errors("read: 5\n").unwrap().len(), 0, "no section, nothing");
        assert!(parse_io_errors("IO errors since filesystem creation\n  read: x\n").is_err());
        // What follows the creation section is never read.
        let after = format!("IO errors since filesystem creation\n read: 1\nIO errors since 1 s ago\n read: x\n{}\n", "a".repeat(SCAN_MAX));
        assert_eq!(parse_io_errors(&after).unwrap()["read"], 1);
    }

    #[test]
    fn lines_past_the_scanner_limit_are_errors() {
        let long = format!("since mount: 1\n{}\n", "x".repeat(SCAN_MAX));
        assert!(parse_counter(&long).is_err());
        let fits = format!("since mount: 1\n{}\n", "x".repeat(SCAN_MAX - 1));
        assert_eq!(parse_counter(&fits), Ok(0));
        let big = format!("h\n{}\n", "y".repeat(SCAN_MAX + 10));
        assert_eq!(parse_compression_stats(&big).unwrap().len(), 0, "compression_stats allows 1 MiB lines");
        let lines: Vec<_> = scan("a\r\nb\n\nc", 10).collect();
        assert_eq!(lines, vec![Ok("a"), Ok("b"), Ok(""), Ok("c")]);
    }

    /// A family as written: name, type and (labels as "k=v,...", value) samples.
    type Written = (String, Kind, Vec<(String, f64)>);

    fn scrape(root: &Path) -> (Result<(), Error>, Vec<Written>) {
        let mut c = Collector::new(&paths(root));
        let mut sink = Sink::new();
        let res = c.update(&mut sink);
        let families = sink
            .families()
            .iter()
            .map(|f| {
                let samples =
                    f.samples().map(|(l, v)| (l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), v)).collect();
                (f.name().to_string(), f.kind(), samples)
            })
            .collect();
        (res, families)
    }

    const FS: &str = "sys/fs/bcachefs/deadbeef-1234";

    fn tree(root: &Path) {
        write(root, &format!("{FS}/btree_cache_size"), "2.05G\n");
        write(root, &format!("{FS}/compression_stats"), COMPRESSION);
        write(root, &format!("{FS}/errors"), ERRORS_FILE);
        write(root, &format!("{FS}/btree_write_stats"), BTREE_WRITE_STATS);
        write(root, &format!("{FS}/counters/fsync"), "since mount:                   302707\nsince filesystem creation:     1515147\n");
        write(root, &format!("{FS}/counters/data_write"), "since mount:                   346G\nsince filesystem creation:     18.9T\n");
        write(root, &format!("{FS}/counters/odd-name"), "since filesystem creation: 3\n");
        write(root, &format!("{FS}/counters/errors"), "since filesystem creation: 4\n");
        write(root, &format!("{FS}/dev-6/label"), "disk-6\n");
        write(root, &format!("{FS}/dev-6/state"), "[rw] ro evacuating spare \n");
        write(root, &format!("{FS}/dev-6/bucket_size"), "2.00M\n");
        write(root, &format!("{FS}/dev-6/nbuckets"), "953864\n");
        write(root, &format!("{FS}/dev-6/durability"), "1\n");
        write(root, &format!("{FS}/dev-6/io_done"), IO_DONE);
        write(root, &format!("{FS}/dev-6/io_errors"), IO_ERRORS);
        // A device directory with nothing in it still has its info and zeros.
        std::fs::create_dir_all(root.join(format!("{FS}/dev-7"))).unwrap();
        // Not a device, not a filesystem.
        std::fs::create_dir_all(root.join(format!("{FS}/options"))).unwrap();
        write(root, "sys/fs/bcachefs/not-a-dir", "x");
    }

    fn value(families: &[Written], name: &str, labels: &str) -> Option<f64> {
        families.iter().find(|f| f.0 == name)?.2.iter().find(|s| s.0 == labels).map(|s| s.1)
    }

    #[test]
    fn exports_a_filesystem_as_node_exporter_does() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        let (res, fams) = scrape(dir.path());
        res.unwrap();
        let u = "uuid=deadbeef-1234";
        assert_eq!(value(&fams, "node_bcachefs_info", u), Some(1.0));
        assert_eq!(value(&fams, "node_bcachefs_btree_cache_size_bytes", u), Some(2_201_170_739.0));
        assert_eq!(value(&fams, "node_bcachefs_compression_compressed_bytes", &format!("algorithm=lz4,{u}")), Some(52_505_975_193.0));
        assert_eq!(value(&fams, "node_bcachefs_compression_uncompressed_bytes", &format!("algorithm=zstd,{u}")), Some(647_466_319_872.0));
        assert_eq!(value(&fams, "node_bcachefs_errors_total", &format!("error_type=btree_node_data_missing,{u}")), Some(2.0));
        assert_eq!(value(&fams, "node_bcachefs_fsync_total", u), Some(1_515_147.0));
        assert_eq!(value(&fams, "node_bcachefs_data_write_total", u), Some(20_780_769_764_966.0));
        assert_eq!(value(&fams, "node_bcachefs_odd_name_total", u), Some(3.0));
        assert_eq!(fams.iter().find(|f| f.0 == "node_bcachefs_errors_total").unwrap().2.len(), 3, "the counter `errors` is not mixed in");
        assert_eq!(value(&fams, "node_bcachefs_btree_writes_total", &format!("type=initial,{u}")), Some(3_298_401.0));
        assert_eq!(value(&fams, "node_bcachefs_btree_write_average_size_bytes", &format!("type=interior,{u}")), Some(1290.0));
        assert_eq!(
            value(&fams, "node_bcachefs_device_info", &format!("device=6,label=disk-6,state=[rw] ro evacuating spare,{u}")),
            Some(1.0)
        );
        assert_eq!(value(&fams, "node_bcachefs_device_info", &format!("device=7,label=,state=,{u}")), Some(1.0));
        assert_eq!(value(&fams, "node_bcachefs_device_bucket_size_bytes", &format!("device=6,{u}")), Some(2_097_152.0));
        assert_eq!(value(&fams, "node_bcachefs_device_buckets", &format!("device=6,{u}")), Some(953_864.0));
        assert_eq!(value(&fams, "node_bcachefs_device_buckets", &format!("device=7,{u}")), Some(0.0));
        assert_eq!(value(&fams, "node_bcachefs_device_durability", &format!("device=6,{u}")), Some(1.0));
        assert_eq!(
            value(&fams, "node_bcachefs_device_io_done_bytes_total", &format!("data_type=user,device=6,operation=write,{u}")),
            Some(562_070_339_584.0)
        );
        assert_eq!(value(&fams, "node_bcachefs_device_io_errors_total", &format!("device=6,type=checksum,{u}")), Some(5.0));
        let kinds: Vec<_> = fams.iter().map(|f| (f.0.as_str(), f.1)).collect();
        assert!(kinds.contains(&("node_bcachefs_fsync_total", Kind::Counter)));
        assert!(kinds.contains(&("node_bcachefs_device_io_done_bytes_total", Kind::Counter)));
        assert!(kinds.contains(&("node_bcachefs_device_buckets", Kind::Gauge)));
        assert!(fams.iter().all(|f| !f.2.is_empty()), "no empty family");

        // A second scrape (cached counter names) gives the same.
        let mut c = Collector::new(&paths(dir.path()));
        let (mut a, mut b) = (Sink::new(), Sink::new());
        c.update(&mut a).unwrap();
        c.update(&mut b).unwrap();
        assert_eq!(a.families().len(), b.families().len());
    }

    #[test]
    fn missing_or_empty_sysfs_dir_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).0.unwrap_err().is_no_data());
        std::fs::create_dir_all(dir.path().join("sys/fs/bcachefs")).unwrap();
        write(dir.path(), "sys/fs/bcachefs/stray-file", "x");
        assert!(scrape(dir.path()).0.unwrap_err().is_no_data());
    }

    #[test]
    fn a_filesystem_without_its_files_still_reports_info() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(FS)).unwrap();
        let (res, fams) = scrape(dir.path());
        res.unwrap();
        let names: Vec<_> = fams.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, vec!["node_bcachefs_info", "node_bcachefs_btree_cache_size_bytes"]);
        assert_eq!(value(&fams, "node_bcachefs_btree_cache_size_bytes", "uuid=deadbeef-1234"), Some(0.0));
    }

    #[test]
    fn malformed_files_fail_the_scrape_with_a_parse_error() {
        for (file, text) in [
            ("btree_cache_size", "lots\n"),
            ("compression_stats", "h\nlz4 x y\n"),
            ("errors", "a b\n"),
            ("btree_write_stats", "h\ninitial: 1 z\n"),
            ("counters/fsync", "garbage\n"),
            ("dev-6/bucket_size", "2.00Q\n"),
            ("dev-6/nbuckets", "\n"),
            ("dev-6/durability", "-1\n"),
            ("dev-6/io_done", "read:\nuser: 1.5\n"),
            ("dev-6/io_errors", "IO errors since filesystem creation\n read: many\n"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            tree(dir.path());
            write(dir.path(), &format!("{FS}/{file}"), text);
            match scrape(dir.path()).0 {
                Err(Error::Parse { path, .. }) => assert!(path.ends_with(file), "{file}: {}", path.display()),
                other => panic!("{file}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_counters_file_instead_of_a_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &format!("{FS}/counters"), "x");
        assert!(matches!(scrape(dir.path()).0, Err(Error::Io { .. })));
    }
}
