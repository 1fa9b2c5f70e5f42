//! `ksmd`: Kernel Samepage Merging statistics from /sys/kernel/mm/ksm. Each
//! of its files (full_scans, general_profit, merge_across_nodes,
//! pages_shared, pages_sharing, pages_to_scan, pages_unshared,
//! pages_volatile, run, sleep_millisecs) becomes one unlabelled sample:
//! `full_scans` a counter, `sleep_millisecs` a gauge in seconds, the rest
//! gauges. As in node_exporter, a file that does not exist is skipped (so a
//! host without KSM succeeds with no samples), and any other read failure or
//! a value that is not an unsigned integer fails the collector.

use std::path::PathBuf;

use crate::parse::GoNumError;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// One file of /sys/kernel/mm/ksm and its family.
struct File {
    file: &'static str,
    family: &'static str,
    help: &'static str,
    kind: Kind,
    /// The file's value is divided by this (milliseconds to seconds).
    divisor: f64,
}

const fn gauge(file: &'static str, family: &'static str, help: &'static str) -> File {
    File { file, family, help, kind: Kind::Gauge, divisor: 1.0 }
}

/// node_exporter's files, in its order, with its help texts (from the
/// kernel's admin guide).
const FILES: [File; 10] = [
    File {
        file: "full_scans",
        family: "node_ksmd_full_scans_total",
        help: "How many times all mergeable areas have been scanned.",
        kind: Kind::Counter,
        divisor: 1.0,
    },
    gauge(
        "general_profit",
        "node_ksmd_general_profit_bytes",
        "How effective is KSM. ksm_saved_pages * sizeof(page) - (all_rmap_items) * sizeof(rmap_item)",
    ),
    gauge("merge_across_nodes", "node_ksmd_merge_across_nodes", "Specifies if pages from different NUMA nodes can be merged."),
    gauge("pages_shared", "node_ksmd_pages_shared", "How many shared pages are being used."),
    gauge("pages_sharing", "node_ksmd_pages_sharing", "How many more sites are sharing them i.e. how much saved."),
    gauge("pages_to_scan", "node_ksmd_pages_to_scan", "How many pages to scan before ksmd goes to sleep."),
    gauge("pages_unshared", "node_ksmd_pages_unshared", "How many pages unique but repeatedly checked for merging."),
    gauge("pages_volatile", "node_ksmd_pages_volatile", "How many pages changing too fast to be placed in a tree."),
    gauge("run", "node_ksmd_run", "The status of ksmd. stopped = 0, running = 1"),
    File {
        file: "sleep_millisecs",
        family: "node_ksmd_sleep_seconds",
        help: "How many seconds ksmd should sleep before next scan.",
        kind: Kind::Gauge,
        divisor: 1000.0,
    },
];

/// A ksm file's value as node_exporter reads it: Go's
/// `strconv.ParseUint(strings.TrimSpace(s), 10, 64)` (decimal digits only,
/// no sign, within 64 bits).
pub fn parse_value(text: &str) -> Result<u64, String> {
    let s = text.trim();
    crate::parse::parse_go_dec_uint(s).map_err(|e| match e {
        GoNumError::Syntax => format!("invalid unsigned integer {s:?}"),
        GoNumError::Range => format!("value {s:?} out of range"),
    })
}

pub struct Collector {
    paths: Vec<PathBuf>,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        let dir = p.sys("kernel/mm/ksm");
        Collector { paths: FILES.iter().map(|f| dir.join(f.file)).collect(), buf: Vec::with_capacity(64) }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for (f, path) in FILES.iter().zip(&self.paths) {
            match crate::io::read_file(path, &mut self.buf) {
                Ok(()) => {}
                Err(Error::NoData(_)) => {
                    tracing::debug!(file = f.file, "ksmd file not found, skipping");
                    continue;
                }
                Err(e) => return Err(e),
            }
            let v = parse_value(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(path, m))?;
            sink.new_family(f.family, f.help, f.kind).sample(&[], v as f64 / f.divisor);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn parses_values_as_go_parse_uint() {
        assert_eq!(parse_value("323\n"), Ok(323));
        assert_eq!(parse_value(" 0 "), Ok(0));
        assert_eq!(parse_value("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_value("000000000000000000000001"), Ok(1));
        for bad in ["", "\n", "+1", "-1", "1_0", "0x10", "1.5", "18446744073709551616", "abc"] {
            assert!(parse_value(bad).is_err(), "{bad:?}");
        }
    }

    fn fixture(root: &std::path::Path) {
        for (f, v) in [
            ("full_scans", "323"),
            ("general_profit", "1044480"),
            ("merge_across_nodes", "1"),
            ("pages_shared", "1"),
            ("pages_sharing", "255"),
            ("pages_to_scan", "100"),
            ("pages_unshared", "0"),
            ("pages_volatile", "0"),
            ("run", "1"),
            ("sleep_millisecs", "20"),
        ] {
            crate::testutil::write(root, &format!("sys/kernel/mm/ksm/{f}"), &format!("{v}\n"));
        }
    }

    fn scrape(root: &std::path::Path) -> Result<Vec<crate::testutil::Row>, Error> {
        let mut c = Collector::new(&crate::testutil::paths(root));
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn exports_every_file() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let rows = scrape(dir.path()).unwrap();
        let got: Vec<(&str, f64)> = rows.iter().map(|(n, _, v)| (n.as_str(), *v)).collect();
        assert_eq!(got.len(), 10);
        assert!(got.contains(&("node_ksmd_full_scans_total", 323.0)));
        assert!(got.contains(&("node_ksmd_general_profit_bytes", 1044480.0)));
        assert!(got.contains(&("node_ksmd_sleep_seconds", 0.02)));
        assert!(got.contains(&("node_ksmd_run", 1.0)));
    }

    #[test]
    fn missing_files_are_skipped_and_bad_values_fail() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap().is_empty(), "no KSM: success without samples");
        fixture(dir.path());
        std::fs::remove_file(dir.path().join("sys/kernel/mm/ksm/general_profit")).unwrap();
        assert_eq!(scrape(dir.path()).unwrap().len(), 9);
        crate::testutil::write(dir.path(), "sys/kernel/mm/ksm/general_profit", "-4096\n");
        assert!(matches!(scrape(dir.path()), Err(Error::Parse { .. })), "a negative profit fails, as ParseUint does");
    }
}
