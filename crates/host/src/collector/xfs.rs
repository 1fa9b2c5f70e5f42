//! `xfs`: per-filesystem XFS runtime statistics. Reads
//! `/sys/fs/xfs/<device>/stats/stats` for every mounted XFS filesystem
//! (kernel 4.4 and later) and exports 39 counters, `node_xfs_*_total` with
//! a `device` label: extent allocation, allocation and block-map B-trees,
//! block mapping, directory and inode operations, read/write calls and
//! vnode activity. A host with no XFS filesystem succeeds with no samples,
//! as node_exporter does.

use std::path::{Path, PathBuf};

use crate::parse;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The counters of one stats file that are exported (the lines of
/// `stats/stats` this collector reads; the other lines are only checked).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Stats {
    pub extent_alloc: [u32; 4],
    pub abt: [u32; 4],
    pub blk_map: [u32; 7],
    pub bmbt: [u32; 4],
    pub dir: [u32; 4],
    pub ig: [u32; 7],
    pub rw: [u32; 2],
    pub vnodes: [u32; 8],
}

impl Stats {
    /// The values of line `label` (one of those in [`METRICS`]).
    fn line(&self, label: &str) -> &[u32] {
        match label {
            "extent_alloc" => &self.extent_alloc,
            "abt" => &self.abt,
            "blk_map" => &self.blk_map,
            "bmbt" => &self.bmbt,
            "dir" => &self.dir,
            "ig" => &self.ig,
            "rw" => &self.rw,
            "vnodes" => &self.vnodes,
            _ => &[],
        }
    }
}

/// (line label, index in the line, family suffix, help): every exported
/// counter. Names and help from node_exporter, after
/// <http://xfs.org/index.php/Runtime_Stats>.
pub const METRICS: [(&str, usize, &str, &str); 39] = [
    ("extent_alloc", 0, "extent_allocation_extents_allocated_total", "Number of extents allocated for a filesystem."),
    ("extent_alloc", 1, "extent_allocation_blocks_allocated_total", "Number of blocks allocated for a filesystem."),
    ("extent_alloc", 2, "extent_allocation_extents_freed_total", "Number of extents freed for a filesystem."),
    ("extent_alloc", 3, "extent_allocation_blocks_freed_total", "Number of blocks freed for a filesystem."),
    ("abt", 0, "allocation_btree_lookups_total", "Number of allocation B-tree lookups for a filesystem."),
    ("abt", 1, "allocation_btree_compares_total", "Number of allocation B-tree compares for a filesystem."),
    ("abt", 2, "allocation_btree_records_inserted_total", "Number of allocation B-tree records inserted for a filesystem."),
    ("abt", 3, "allocation_btree_records_deleted_total", "Number of allocation B-tree records deleted for a filesystem."),
    ("blk_map", 0, "block_mapping_reads_total", "Number of block map for read operations for a filesystem."),
    ("blk_map", 1, "block_mapping_writes_total", "Number of block map for write operations for a filesystem."),
    ("blk_map", 2, "block_mapping_unmaps_total", "Number of block unmaps (deletes) for a filesystem."),
    ("blk_map", 3, "block_mapping_extent_list_insertions_total", "Number of extent list insertions for a filesystem."),
    ("blk_map", 4, "block_mapping_extent_list_deletions_total", "Number of extent list deletions for a filesystem."),
    ("blk_map", 5, "block_mapping_extent_list_lookups_total", "Number of extent list lookups for a filesystem."),
    ("blk_map", 6, "block_mapping_extent_list_compares_total", "Number of extent list compares for a filesystem."),
    ("bmbt", 0, "block_map_btree_lookups_total", "Number of block map B-tree lookups for a filesystem."),
    ("bmbt", 1, "block_map_btree_compares_total", "Number of block map B-tree compares for a filesystem."),
    ("bmbt", 2, "block_map_btree_records_inserted_total", "Number of block map B-tree records inserted for a filesystem."),
    ("bmbt", 3, "block_map_btree_records_deleted_total", "Number of block map B-tree records deleted for a filesystem."),
    (
        "dir",
        0,
        "directory_operation_lookup_total",
        "Number of file name directory lookups which miss the operating systems directory name lookup cache.",
    ),
    ("dir", 1, "directory_operation_create_total", "Number of times a new directory entry was created for a filesystem."),
    // node_exporter's help says "created" here, a copy-paste slip.
    ("dir", 2, "directory_operation_remove_total", "Number of times an existing directory entry was removed for a filesystem."),
    (
        "dir",
        3,
        "directory_operation_getdents_total",
        "Number of times the directory getdents operation was performed for a filesystem.",
    ),
    ("ig", 0, "inode_operation_attempts_total", "Number of times the OS looked for an XFS inode in the inode cache."),
    ("ig", 1, "inode_operation_found_total", "Number of times the OS looked for and found an XFS inode in the inode cache."),
    (
        "ig",
        2,
        "inode_operation_recycled_total",
        "Number of times the OS found an XFS inode in the cache, but could not use it as it was being recycled.",
    ),
    ("ig", 3, "inode_operation_missed_total", "Number of times the OS looked for an XFS inode in the cache, but did not find it."),
    (
        "ig",
        4,
        "inode_operation_duplicates_total",
        "Number of times the OS tried to add a missing XFS inode to the inode cache, but found it had already been added by another process.",
    ),
    (
        "ig",
        5,
        "inode_operation_reclaims_total",
        "Number of times the OS reclaimed an XFS inode from the inode cache to free memory for another purpose.",
    ),
    ("ig", 6, "inode_operation_attribute_changes_total", "Number of times the OS explicitly changed the attributes of an XFS inode."),
    // The kernel prints writes before reads.
    ("rw", 1, "read_calls_total", "Number of read(2) system calls made to files in a filesystem."),
    ("rw", 0, "write_calls_total", "Number of write(2) system calls made to files in a filesystem."),
    ("vnodes", 0, "vnode_active_total", "Number of vnodes not on free lists for a filesystem."),
    ("vnodes", 1, "vnode_allocate_total", "Number of times vn_alloc called for a filesystem."),
    ("vnodes", 2, "vnode_get_total", "Number of times vn_get called for a filesystem."),
    ("vnodes", 3, "vnode_hold_total", "Number of times vn_hold called for a filesystem."),
    ("vnodes", 4, "vnode_release_total", "Number of times vn_rele called for a filesystem."),
    ("vnodes", 5, "vnode_reclaim_total", "Number of times vn_reclaim called for a filesystem."),
    ("vnodes", 6, "vnode_remove_total", "Number of times vn_remove called for a filesystem."),
];

/// The number of values a known line must have, as (at least, at most).
fn expected_len(label: &str) -> Option<(usize, usize)> {
    Some(match label {
        "extent_alloc" | "abt" | "bmbt" | "dir" | "attr" => (4, 4),
        "blk_map" | "ig" => (7, 7),
        "trans" | "icluster" => (3, 3),
        "log" => (5, 5),
        "rw" | "xstrat" => (2, 2),
        "vnodes" => (7, 8),
        "buf" => (9, 9),
        "push_ail" => (10, 10),
        "abtb2" | "abtc2" | "bmbt2" | "ibt2" | "fibt2" | "rmapbt" | "refcntbt" | "rmapbt_mem" | "rcbagbt" | "rtrmapbt" | "rtrmapbt_mem"
        | "rtrefcntbt" => (15, 15),
        "qm" => (8, 9),
        "debug" => (1, 1),
        "zoned" => (3, usize::MAX),
        "metafile" => (1, usize::MAX),
        _ => return None,
    })
}

fn utf8(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// Parses an XFS stats file (`/sys/fs/xfs/<dev>/stats/stats` or
/// `/proc/fs/xfs/stat`), as procfs does: every line of a label and values;
/// `xpc`, `defer_relog` and `gc xpc` hold 64-bit values, all others 32-bit
/// ones (an unknown label is accepted but its values must still be 32-bit
/// numbers); a known line with the wrong number of values is an error.
/// Lines with fewer than two fields are skipped.
pub fn parse_stats(text: &[u8]) -> Result<Stats, String> {
    let mut s = Stats::default();
    let mut values: Vec<u32> = Vec::with_capacity(16);
    for line in parse::lines(text) {
        let mut f = parse::fields(line).peekable();
        let (Some(label), Some(first)) = (f.next(), f.next()) else { continue };
        let wide = match label {
            b"xpc" => Some((Some(first), 3)),
            b"defer_relog" => Some((Some(first), 1)),
            b"gc" if first == b"xpc" && f.peek().is_some() => Some((None, 1)),
            _ => None,
        };
        if let Some((first, want)) = wide {
            let mut n = 0;
            for v in first.into_iter().chain(f) {
                parse::parse_u64(v).ok_or_else(|| format!("{}: invalid value {:?}", utf8(label), utf8(v)))?;
                n += 1;
            }
            if n != want {
                return Err(format!("{}: {n} values, want {want}", utf8(label)));
            }
            continue;
        }
        values.clear();
        for v in std::iter::once(first).chain(f) {
            let n = parse::parse_u64(v)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{}: invalid value {:?}", utf8(label), utf8(v)))?;
            values.push(n);
        }
        let label = std::str::from_utf8(label).unwrap_or("");
        let Some((min, max)) = expected_len(label) else { continue };
        if values.len() < min || values.len() > max {
            return Err(format!("{label}: {} values, want {min}", values.len()));
        }
        let dst: &mut [u32] = match label {
            "extent_alloc" => &mut s.extent_alloc,
            "abt" => &mut s.abt,
            "blk_map" => &mut s.blk_map,
            "bmbt" => &mut s.bmbt,
            "dir" => &mut s.dir,
            "ig" => &mut s.ig,
            "rw" => &mut s.rw,
            "vnodes" => &mut s.vnodes,
            _ => continue,
        };
        // vnodes may lack its last value (free) on older kernels: zero.
        dst.fill(0);
        dst[..values.len()].copy_from_slice(&values);
    }
    Ok(s)
}

pub struct Collector {
    dir: PathBuf,
    names: Vec<String>,
    buf: Vec<u8>,
    found: Vec<(String, Stats)>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector {
            dir: p.sys("fs/xfs"),
            names: METRICS.iter().map(|(_, _, suffix, _)| format!("node_xfs_{suffix}")).collect(),
            buf: Vec::with_capacity(4096),
            found: Vec::new(),
        }
    }
}

/// The filesystems that have `<dir>/<name>/stats/stats`, sorted by name (as
/// node_exporter's glob `fs/xfs/*/stats/stats` finds them). A missing
/// `dir` has none.
fn stats_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let stats = e.path().join("stats");
            let file = stats.join("stats");
            (stats.is_dir() && std::fs::symlink_metadata(&file).is_ok()).then(|| (e.file_name().to_string_lossy().into_owned(), file))
        })
        .collect();
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    out
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        self.found.clear();
        for (device, path) in stats_files(&self.dir) {
            crate::io::read_file(&path, &mut self.buf)?;
            let stats = parse_stats(&self.buf).map_err(|m| Error::parse(&path, m))?;
            self.found.push((device, stats));
        }
        if self.found.is_empty() {
            return Ok(());
        }
        for ((label, index, _, help), name) in METRICS.iter().zip(&self.names) {
            let mut f = sink.new_family(name, help, Kind::Counter);
            for (device, stats) in &self.found {
                let v = stats.line(label).get(*index).copied().unwrap_or(0);
                f.sample(&[("device", device)], v as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter's fixture sys/fs/xfs/sda1/stats/stats.
    const SDA1: &str = "extent_alloc 1 872 0 0
abt 0 0 0 0
blk_map 61 29 1 1 1 91 0
bmbt 0 0 0 0
dir 3 2 1 52
trans 4 40 0
ig 5 1 0 4 0 0 1
log 8 21 0 5821 4
push_ail 44 0 1102 15 0 2 0 2 0 2
xstrat 1 0
rw 28 0
attr 0 0 0 0
icluster 2 2 2
vnodes 4 0 0 0 1 1 1 0
buf 22 25 14 0 0 8 0 8 8
abtb2 1 1 0 0 0 0 0 0 0 0 0 0 0 0 0
abtc2 2 1 1 1 0 0 0 0 0 0 0 0 0 0 0
bmbt2 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
ibt2 3 3 0 0 0 0 0 0 0 0 0 0 0 0 0
fibt2 3 3 0 0 0 0 0 0 0 0 0 0 0 0 0
rmapbt 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
qm 0 0 0 0 0 0 0 0
xpc 3571712 3568056 0
debug 0
";

    #[test]
    fn parses_the_fixture() {
        let s = parse_stats(SDA1.as_bytes()).unwrap();
        assert_eq!(s.extent_alloc, [1, 872, 0, 0]);
        assert_eq!(s.blk_map, [61, 29, 1, 1, 1, 91, 0]);
        assert_eq!(s.dir, [3, 2, 1, 52]);
        assert_eq!(s.ig, [5, 1, 0, 4, 0, 0, 1]);
        assert_eq!(s.rw, [28, 0]);
        assert_eq!(s.vnodes, [4, 0, 0, 0, 1, 1, 1, 0]);
    }

    #[test]
    fn metrics_read_the_right_values() {
        let s = parse_stats(SDA1.as_bytes()).unwrap();
        let get = |suffix: &str| {
            let (label, i, _, _) = METRICS.iter().find(|m| m.2 == suffix).unwrap();
            s.line(label)[*i]
        };
        assert_eq!(get("write_calls_total"), 28);
        assert_eq!(get("read_calls_total"), 0);
        assert_eq!(get("extent_allocation_blocks_allocated_total"), 872);
        assert_eq!(get("directory_operation_getdents_total"), 52);
        assert_eq!(get("vnode_remove_total"), 1);
        let mut names: Vec<&str> = METRICS.iter().map(|m| m.2).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 39);
        assert!(METRICS.iter().all(|(l, i, _, _)| *i < Stats::default().line(l).len()));
    }

    #[test]
    fn accepts_old_and_new_kernels() {
        // vnodes without free, qm with unused, newer lines and 64-bit ones.
        let s = parse_stats(
            b"vnodes 1 2 3 4 5 6 7\nqm 1 2 3 4 5 6 7 8 9\nzoned 1 2 3 4\nmetafile 5\ndefer_relog 18446744073709551615\n\
gc xpc 123\nnewline 4294967295\n\nshort\n",
        )
        .unwrap();
        assert_eq!(s.vnodes, [1, 2, 3, 4, 5, 6, 7, 0]);
    }

    #[test]
    fn rejects_malformed_input() {
        for bad in [
            "extent_alloc 1 2 3\n",
            "blk_map 1 2 3 4 5 6 7 8\n",
            "vnodes 1 2 3 4 5 6\n",
            "rw 1 x\n",
            "rw 4294967296 0\n",
            "unknown -1\n",
            "xpc 1 2\n",
            "xpc 1 2 x\n",
            "defer_relog 1 2\n",
            "gc xpc\n",
            "gc xpc 1 2\n",
            "abtb2 0 0\n",
            "zoned 1 2\n",
        ] {
            assert!(parse_stats(bad.as_bytes()).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn finds_per_filesystem_stats_only() {
        let d = tempfile::tempdir().unwrap();
        for dev in ["sdb1", "sda1"] {
            std::fs::create_dir_all(d.path().join(dev).join("stats")).unwrap();
            std::fs::write(d.path().join(dev).join("stats/stats"), SDA1).unwrap();
        }
        // The global stats (/sys/fs/xfs/stats/stats) are not a filesystem.
        std::fs::create_dir_all(d.path().join("stats")).unwrap();
        std::fs::write(d.path().join("stats/stats"), SDA1).unwrap();
        std::fs::create_dir_all(d.path().join("nostats")).unwrap();
        let found: Vec<String> = stats_files(d.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(found, ["sda1", "sdb1"]);
        assert!(stats_files(&d.path().join("missing")).is_empty());
    }

    #[test]
    fn exports_every_counter_per_device() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("fs/xfs/sda1/stats")).unwrap();
        std::fs::write(d.path().join("fs/xfs/sda1/stats/stats"), SDA1).unwrap();
        let p = Paths {
            procfs: d.path().join("proc"),
            sysfs: d.path().to_path_buf(),
            rootfs: d.path().to_path_buf(),
            udev_data: d.path().to_path_buf(),
        };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 39);
        let w = fams.iter().find(|f| f.name() == "node_xfs_write_calls_total").unwrap();
        assert_eq!(w.samples().collect::<Vec<_>>(), vec![(vec![("device", "sda1")], 28.0)]);

        std::fs::write(d.path().join("fs/xfs/sda1/stats/stats"), "rw 1\n").unwrap();
        let mut sink = Sink::new();
        assert!(matches!(crate::Collector::update(&mut c, &mut sink), Err(Error::Parse { .. })));

        let p = Paths { sysfs: d.path().join("none"), ..p };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        assert!(sink.families().is_empty());
    }
}
