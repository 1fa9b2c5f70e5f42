//! `swap`: the swap devices and files listed in /proc/swaps, as
//! node_exporter's swap collector exports them: size and use in bytes (the
//! file counts KiB) and priority, per device and swap type. A missing or
//! malformed /proc/swaps fails the collector, as in node_exporter.

use std::path::PathBuf;

use crate::io::read_required;
use crate::parse::go_scan_lines;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// One line of /proc/swaps; sizes in KiB, as the kernel prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    pub filename: String,
    pub kind: String,
    pub size_kib: i64,
    pub used_kib: i64,
    pub priority: i64,
}

/// Go's `strconv.Atoi`: an optional sign and decimal digits, in 64 bits.
fn atoi(s: &str, what: &str) -> Result<i64, String> {
    s.parse().map_err(|_| format!("invalid swap {what}: {s}"))
}

/// Parses one entry line: filename, type, size, used, priority (further
/// fields are ignored).
pub fn parse_swap_line(line: &str) -> Result<Swap, String> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 5 {
        return Err(format!("too few fields in swap string: {line}"));
    }
    Ok(Swap {
        filename: f[0].to_string(),
        kind: f[1].to_string(),
        size_kib: atoi(f[2], "size")?,
        used_kib: atoi(f[3], "used")?,
        priority: atoi(f[4], "priority")?,
    })
}

/// Parses /proc/swaps: a header line, then one line per swap area. As
/// procfs, any line after the header that does not parse (a blank one
/// too) fails the whole file.
pub fn parse_swaps(text: &str) -> Result<Vec<Swap>, String> {
    let mut lines = go_scan_lines(text);
    match lines.next() {
        None => return Ok(Vec::new()),
        Some(header) => {
            header?;
        }
    }
    lines.map(|l| parse_swap_line(l?)).collect()
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("swaps"), buf: Vec::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (rather than reporting no data) without the file.
        read_required(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        let swaps = parse_swaps(&text).map_err(|m| Error::parse(&self.path, m))?;
        if swaps.is_empty() {
            return Ok(());
        }
        // Go's int arithmetic: the KiB counts are multiplied as 64-bit integers.
        let bytes = |kib: i64| kib.wrapping_mul(1024) as f64;
        let mut size = sink.family("node_swap_size_bytes", "Swap device size in bytes.", Kind::Gauge);
        for s in &swaps {
            size.sample(&[("device", &s.filename), ("swap_type", &s.kind)], bytes(s.size_kib));
        }
        let mut used = sink.family("node_swap_used_bytes", "Swap device used in bytes.", Kind::Gauge);
        for s in &swaps {
            used.sample(&[("device", &s.filename), ("swap_type", &s.kind)], bytes(s.used_kib));
        }
        let mut prio = sink.family("node_swap_priority", "Swap device priority.", Kind::Gauge);
        for s in &swaps {
            prio.sample(&[("device", &s.filename), ("swap_type", &s.kind)], s.priority as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, rows, write};
    use crate::Collector as _;

    /// node_exporter's collector/fixtures/proc/swaps.
    const NE_SWAPS: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
/dev/zram0                              partition\t8388604\t\t76\t\t100\n";

    /// procfs's testdata fixtures/proc/swaps.
    const PROCFS_SWAPS: &str = "Filename\t\t\t\tType\t\tSize\tUsed\tPriority\n\
/dev/dm-2                               partition\t131068\t176\t-2\n";

    fn swap(filename: &str, kind: &str, size_kib: i64, used_kib: i64, priority: i64) -> Swap {
        Swap { filename: filename.into(), kind: kind.into(), size_kib, used_kib, priority }
    }

    #[test]
    fn parses_node_exporter_and_procfs_fixtures() {
        // node_exporter's TestSwap.
        assert_eq!(parse_swaps(NE_SWAPS).unwrap(), vec![swap("/dev/zram0", "partition", 8388604, 76, 100)]);
        // procfs's TestSwaps.
        assert_eq!(parse_swaps(PROCFS_SWAPS).unwrap(), vec![swap("/dev/dm-2", "partition", 131068, 176, -2)]);
    }

    #[test]
    fn parses_lines_as_procfs() {
        // procfs's TestParseSwapString.
        assert_eq!(
            parse_swap_line("/dev/dm-2                               partition       131068  1024    -2").unwrap(),
            swap("/dev/dm-2", "partition", 131068, 1024, -2)
        );
        assert_eq!(
            parse_swap_line("/foo                                    file            1048572 0       -3").unwrap(),
            swap("/foo", "file", 1048572, 0, -3)
        );
        assert!(parse_swap_line("/dev/sda2                               partition       hello   world   -2").is_err());
        assert!(parse_swap_line("/dev/dm-2                               partition       131068  1024").is_err());
        // Atoi: a sign is fine, a base prefix or `_` is not.
        assert_eq!(parse_swap_line("/a file +10 0 -1").unwrap().size_kib, 10);
        assert!(parse_swap_line("/a file 0x10 0 -1").is_err());
        assert!(parse_swap_line("/a file 1_0 0 -1").is_err());
    }

    #[test]
    fn header_only_or_empty_is_no_swap_and_junk_fails() {
        assert_eq!(parse_swaps("Filename\tType\tSize\tUsed\tPriority\n").unwrap(), vec![]);
        assert_eq!(parse_swaps("").unwrap(), vec![]);
        assert!(parse_swaps("Filename\tType\tSize\tUsed\tPriority\n\n").is_err(), "a blank line has too few fields");
        assert!(parse_swaps(&format!("{}\n", "x".repeat(70_000))).is_err(), "bufio.Scanner's line limit");
    }

    #[test]
    fn exports_node_exporters_series() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "proc/swaps", NE_SWAPS);
        let mut c = super::Collector::new(&paths(dir.path()));
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let l = |d: &str| vec![("device".to_string(), d.to_string()), ("swap_type".to_string(), "partition".to_string())];
        assert_eq!(
            rows(&sink),
            vec![
                ("node_swap_size_bytes".to_string(), l("/dev/zram0"), 8388604.0 * 1024.0),
                ("node_swap_used_bytes".to_string(), l("/dev/zram0"), 76.0 * 1024.0),
                ("node_swap_priority".to_string(), l("/dev/zram0"), 100.0),
            ]
        );
        assert!(sink.families().iter().all(|f| f.kind() == Kind::Gauge));
    }

    #[test]
    fn missing_file_fails_and_malformed_is_a_parse_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = super::Collector::new(&paths(dir.path()));
        let mut sink = Sink::new();
        assert!(matches!(c.update(&mut sink), Err(Error::Io { .. })), "node_exporter returns an error, not ErrNoData");
        write(dir.path(), "proc/swaps", "Filename Type Size Used Priority\n/dev/x partition 1 2\n");
        assert!(matches!(c.update(&mut sink), Err(Error::Parse { .. })));
        write(dir.path(), "proc/swaps", "Filename Type Size Used Priority\n");
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert!(rows(&sink).is_empty());
    }
}
