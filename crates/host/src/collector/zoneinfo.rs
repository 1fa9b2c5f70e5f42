//! `zoneinfo`: per memory zone statistics from /proc/zoneinfo. For each
//! `Node <n>, zone <name>` block it exports the fields prometheus/procfs
//! knows (free pages, watermarks, spanned/present/managed pages, the LRU,
//! slab, dirty and writeback page counts as gauges; dirtied/written pages
//! and the NUMA allocation counts as counters) and each entry of the
//! `protection:` array as `node_zoneinfo_protection_<i>`, labelled by node
//! and zone. The per-node stats the kernel prints in a node's first zone
//! count for that zone, as in node_exporter. A missing file is an error.

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// A zoneinfo field: its key in the file, its family, help and type.
struct Field {
    key: &'static str,
    family: &'static str,
    help: &'static str,
    kind: Kind,
}

const fn gauge(key: &'static str, family: &'static str, help: &'static str) -> Field {
    Field { key, family, help, kind: Kind::Gauge }
}

const fn counter(key: &'static str, family: &'static str, help: &'static str) -> Field {
    Field { key, family, help, kind: Kind::Counter }
}

/// The fields procfs's `Zoneinfo` holds, in its order.
const FIELDS: [Field; 34] = [
    gauge("nr_free_pages", "node_zoneinfo_nr_free_pages", "Total number of free pages in the zone"),
    gauge("min", "node_zoneinfo_min_pages", "Zone watermark pages_min"),
    gauge("low", "node_zoneinfo_low_pages", "Zone watermark pages_low"),
    gauge("high", "node_zoneinfo_high_pages", "Zone watermark pages_high"),
    gauge("scanned", "node_zoneinfo_scanned_pages", "Pages scanned since last reclaim"),
    gauge("spanned", "node_zoneinfo_spanned_pages", "Total pages spanned by the zone, including holes"),
    gauge("present", "node_zoneinfo_present_pages", "Physical pages existing within the zone"),
    gauge("managed", "node_zoneinfo_managed_pages", "Present pages managed by the buddy system"),
    gauge("nr_active_anon", "node_zoneinfo_nr_active_anon_pages", "Number of anonymous pages recently more used"),
    gauge("nr_inactive_anon", "node_zoneinfo_nr_inactive_anon_pages", "Number of anonymous pages recently less used"),
    gauge("nr_isolated_anon", "node_zoneinfo_nr_isolated_anon_pages", "Temporary isolated pages from anon lru"),
    gauge("nr_anon_pages", "node_zoneinfo_nr_anon_pages", "Number of anonymous pages currently used by the system"),
    gauge(
        "nr_anon_transparent_hugepages",
        "node_zoneinfo_nr_anon_transparent_hugepages",
        "Number of anonymous transparent huge pages currently used by the system",
    ),
    gauge("nr_active_file", "node_zoneinfo_nr_active_file_pages", "Number of active pages with file-backing"),
    gauge("nr_inactive_file", "node_zoneinfo_nr_inactive_file_pages", "Number of inactive pages with file-backing"),
    gauge("nr_isolated_file", "node_zoneinfo_nr_isolated_file_pages", "Temporary isolated pages from file lru"),
    gauge("nr_file_pages", "node_zoneinfo_nr_file_pages", "Number of file pages"),
    gauge("nr_slab_reclaimable", "node_zoneinfo_nr_slab_reclaimable_pages", "Number of reclaimable slab pages"),
    gauge("nr_slab_unreclaimable", "node_zoneinfo_nr_slab_unreclaimable_pages", "Number of unreclaimable slab pages"),
    gauge("nr_mlock_stack", "node_zoneinfo_nr_mlock_stack_pages", "mlock()ed pages found and moved off LRU"),
    gauge("nr_kernel_stack", "node_zoneinfo_nr_kernel_stacks", "Number of kernel stacks"),
    gauge("nr_mapped", "node_zoneinfo_nr_mapped_pages", "Number of mapped pages"),
    gauge("nr_dirty", "node_zoneinfo_nr_dirty_pages", "Number of dirty pages"),
    gauge("nr_writeback", "node_zoneinfo_nr_writeback_pages", "Number of writeback pages"),
    gauge("nr_unevictable", "node_zoneinfo_nr_unevictable_pages", "Number of unevictable pages"),
    gauge("nr_shmem", "node_zoneinfo_nr_shmem_pages", "Number of shmem pages (included tmpfs/GEM pages)"),
    counter("nr_dirtied", "node_zoneinfo_nr_dirtied_total", "Page dirtyings since bootup"),
    counter("nr_written", "node_zoneinfo_nr_written_total", "Page writings since bootup"),
    counter("numa_hit", "node_zoneinfo_numa_hit_total", "Allocated in intended node"),
    counter("numa_miss", "node_zoneinfo_numa_miss_total", "Allocated in non intended node"),
    counter("numa_foreign", "node_zoneinfo_numa_foreign_total", "Was intended here, hit elsewhere"),
    counter("numa_interleave", "node_zoneinfo_numa_interleave_total", "Interleaver preferred this zone"),
    counter("numa_local", "node_zoneinfo_numa_local_total", "Allocation from local node"),
    counter("numa_other", "node_zoneinfo_numa_other_total", "Allocation from other node"),
];

/// One block of /proc/zoneinfo.
#[derive(Debug, PartialEq)]
pub struct Zone<'a> {
    /// Empty when the block has no `Node <n>, zone <name>` line.
    pub node: &'a str,
    pub zone: &'a str,
    /// The value of each of [`FIELDS`] the block has, by index.
    pub values: [Option<i64>; FIELDS.len()],
    pub protection: Vec<i64>,
}

impl Default for Zone<'_> {
    fn default() -> Self {
        Zone { node: "", zone: "", values: [None; FIELDS.len()], protection: Vec::new() }
    }
}

/// RE2's `\s`.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ')
}

/// RE2's `\w`.
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The leftmost match of procfs's `(\d+), zone\s+(\w+)` in `line`: the node
/// and zone.
fn node_zone(line: &str) -> Option<(&str, &str)> {
    let b = line.as_bytes();
    line.match_indices(", zone").find_map(|(at, sep)| {
        let start = b[..at].iter().rposition(|c| !c.is_ascii_digit()).map_or(0, |i| i + 1);
        let after = at + sep.len();
        let spaces = b[after..].iter().take_while(|&&c| is_space(c)).count();
        let word = b[after + spaces..].iter().take_while(|&&c| is_word(c)).count();
        // Both ends sit next to ASCII bytes: char boundaries.
        (start < at && spaces > 0 && word > 0).then(|| (&line[start..at], &line[after + spaces..after + spaces + word]))
    })
}

/// The values of a `protection: (a, b, ...)` line as procfs reads them:
/// the text after the first `:` without its first `(` and `)`, split at
/// `", "`; `None` unless every value is a decimal integer.
fn protection(line: &str) -> Option<Vec<i64>> {
    let inner = line.split(':').nth(1)?.replacen('(', "", 1).replacen(')', "", 1);
    inner.trim().split(", ").map(|v| v.parse().ok()).collect()
}

/// Parses /proc/zoneinfo as prometheus/procfs does: one zone per block
/// (the text split at `"\nNode"`); a field's value that is not an integer
/// reads as 0 and an unparsable protection array is ignored, so parsing
/// never fails.
pub fn parse_zoneinfo(text: &str) -> Vec<Zone<'_>> {
    text.split("\nNode")
        .map(|block| {
            let mut zone = Zone::default();
            for line in block.split('\n') {
                if let Some((node, name)) = node_zone(line) {
                    (zone.node, zone.zone) = (node, name);
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (Some(key), Some(value)) = (parts.next(), parts.next()) else { continue };
                if key == "protection:" {
                    if let Some(p) = protection(line) {
                        zone.protection = p;
                    }
                } else if let Some(i) = FIELDS.iter().position(|f| f.key == key) {
                    // procfs's value parser yields 0, not nothing, for a bad value.
                    zone.values[i] = Some(crate::parse::parse_go_int(value).unwrap_or(0));
                }
            }
            zone
        })
        .collect()
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
    /// Family names and help texts of the protection entries, by index.
    protection: Vec<(String, String)>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("zoneinfo"), buf: Vec::with_capacity(16 * 1024), protection: Vec::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (not "no data") when the file is missing.
        crate::io::read_required(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        for zone in parse_zoneinfo(&text) {
            let labels = [("node", zone.node), ("zone", zone.zone)];
            for (f, v) in FIELDS.iter().zip(zone.values) {
                if let Some(v) = v {
                    sink.family(f.family, f.help, f.kind).sample(&labels, v as f64);
                }
            }
            while self.protection.len() < zone.protection.len() {
                let i = self.protection.len();
                self.protection.push((format!("node_zoneinfo_protection_{i}"), format!("Protection array {i}. field")));
            }
            for ((name, help), &v) in self.protection.iter().zip(&zone.protection) {
                sink.family(name, help, Kind::Gauge).sample(&labels, v as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Row;
    use crate::Collector as _;

    const FIXTURE: &str = "\
Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 95612
      nr_active_anon 1175853
      nr_dirtied   1189097
      nr_kernel_misc_reclaimable 0
  pages free     2949
        min      8
        low      11
        high     14
        spanned  4095
        present  3997
        managed  3973
        protection: (0, 2039, 31932, 31932, 31932)
      nr_free_pages 2949
      nr_kernel_stack 0
      numa_hit     1
  pagesets
    cpu: 0
              count: 0
              high:  0
              batch: 1
  vm stats threshold: 8
  node_unreclaimable:  0
  start_pfn:           1
Node 0, zone   Normal
  pages free     4539739
        min      15809
        protection: (0, 0, 0, 0, 0)
      nr_kernel_stack 18864
      numa_hit     62836441
Node 1, zone  Movable
  pages free     0
        min      0
        protection: (0, 0, 0)";

    fn field(name: &str) -> usize {
        FIELDS.iter().position(|f| f.key == name).unwrap()
    }

    #[test]
    fn parses_zones_and_per_node_stats() {
        let zones = parse_zoneinfo(FIXTURE);
        assert_eq!(zones.len(), 3);
        let dma = &zones[0];
        assert_eq!((dma.node, dma.zone), ("0", "DMA"));
        assert_eq!(dma.values[field("nr_inactive_anon")], Some(95612), "per-node stats count for the first zone");
        assert_eq!(dma.values[field("nr_dirtied")], Some(1189097));
        assert_eq!(dma.values[field("high")], Some(14), "the pageset's `high:` is another key");
        assert_eq!(dma.values[field("min")], Some(8));
        assert_eq!(dma.values[field("nr_free_pages")], Some(2949));
        assert_eq!(dma.values[field("scanned")], None);
        assert_eq!(dma.protection, [0, 2039, 31932, 31932, 31932]);
        let normal = &zones[1];
        assert_eq!((normal.node, normal.zone), ("0", "Normal"));
        assert_eq!(normal.values[field("nr_kernel_stack")], Some(18864));
        assert_eq!(normal.values[field("nr_inactive_anon")], None);
        assert_eq!((zones[2].node, zones[2].zone, zones[2].protection.len()), ("1", "Movable", 3));
    }

    #[test]
    fn odd_input_is_read_as_procfs_reads_it() {
        let z = parse_zoneinfo("Node 0, zone DMA\n min x\n low 0x10\n high 010\n protection: (1, y)\n");
        assert_eq!(z[0].values[field("min")], Some(0), "a bad value is 0");
        assert_eq!(z[0].values[field("low")], Some(16), "base prefixes as ParseInt(s, 0, 64)");
        assert_eq!(z[0].values[field("high")], Some(8));
        assert!(z[0].protection.is_empty(), "a bad protection array is ignored");
        let z = parse_zoneinfo("");
        assert_eq!(z, vec![Zone::default()]);
        let z = parse_zoneinfo("junk\n min 3\nNode 12, zone  Normal \n");
        assert_eq!((z[0].node, z[0].zone, z[0].values[field("min")]), ("", "", Some(3)));
        assert_eq!((z[1].node, z[1].zone), ("12", "Normal"));
    }

    #[test]
    fn node_zone_is_the_leftmost_match() {
        assert_eq!(node_zone("Node 0, zone      DMA"), Some(("0", "DMA")));
        assert_eq!(node_zone(" 10, zone\tDMA32 x"), Some(("10", "DMA32")));
        assert_eq!(node_zone("x, zone A 3, zone B"), Some(("3", "B")));
        assert_eq!(node_zone("Node 0, zone "), None);
        assert_eq!(node_zone("Node 0, zoneX"), None);
        assert_eq!(node_zone("pages free 3"), None);
    }

    fn rows(text: &str) -> Vec<Row> {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/zoneinfo", text);
        let mut c = Collector::new(&crate::testutil::paths(dir.path()));
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        crate::testutil::rows(&sink)
    }

    #[test]
    fn update_writes_fields_and_protection() {
        let rows = rows(FIXTURE);
        let labels = |n: &str, z: &str| vec![("node".to_string(), n.to_string()), ("zone".to_string(), z.to_string())];
        assert!(rows.contains(&("node_zoneinfo_nr_free_pages".into(), labels("0", "DMA"), 2949.0)));
        assert!(rows.contains(&("node_zoneinfo_numa_hit_total".into(), labels("0", "Normal"), 62836441.0)));
        assert!(rows.contains(&("node_zoneinfo_protection_1".into(), labels("0", "DMA"), 2039.0)));
        assert!(rows.contains(&("node_zoneinfo_protection_2".into(), labels("1", "Movable"), 0.0)));
        assert!(!rows.iter().any(|(n, l, _)| n == "node_zoneinfo_protection_3" && *l == labels("1", "Movable")));
        // DMA: 12 fields + 5 protection; Normal: 3 + 5; Movable: 1 + 3.
        assert_eq!(rows.len(), 17 + 8 + 4);
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(&crate::testutil::paths(dir.path()));
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Io { .. })));
    }
}
