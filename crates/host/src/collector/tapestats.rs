//! `tapestats`: SCSI tape drive statistics from
//! /sys/class/scsi_tape/st<N>/stats/* (I/Os in flight, read/write/other
//! command counts, bytes and times), exported as `node_tape_*` per device;
//! the rewind/mode variants (`nst0`, `st0a`, ...) are skipped and
//! `--collector.tapestats.ignored-devices` drops devices by name. Without
//! the class directory the collector has no data.

use std::path::PathBuf;

use clap::Arg;
use regex::Regex;

use crate::flags::{Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const IGNORED_DEVICES: StringFlag =
    StringFlag { name: "collector.tapestats.ignored-devices", default: "^$", help: "Regexp of devices to ignore for tapestats." };

/// The collector's flags, parsed once.
pub struct Options {
    /// Devices whose name matches are skipped (Go's regexp semantics: an
    /// empty pattern matches every name).
    pub ignored: Regex,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        vec![IGNORED_DEVICES.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { ignored: IGNORED_DEVICES.pattern(f)? })
    }
}

/// The counters of one tape drive (`stats/*`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    pub in_flight: u64,
    pub io_ns: u64,
    pub other_cnt: u64,
    pub read_byte_cnt: u64,
    pub read_cnt: u64,
    pub read_ns: u64,
    pub resid_cnt: u64,
    pub write_byte_cnt: u64,
    pub write_cnt: u64,
    pub write_ns: u64,
}

impl Counters {
    /// The counter a `stats/` file name fills, if it is one we know.
    fn slot(&mut self, file: &str) -> Option<&mut u64> {
        Some(match file {
            "in_flight" => &mut self.in_flight,
            "io_ns" => &mut self.io_ns,
            "other_cnt" => &mut self.other_cnt,
            "read_byte_cnt" => &mut self.read_byte_cnt,
            "read_cnt" => &mut self.read_cnt,
            "read_ns" => &mut self.read_ns,
            "resid_cnt" => &mut self.resid_cnt,
            "write_byte_cnt" => &mut self.write_byte_cnt,
            "write_cnt" => &mut self.write_cnt,
            "write_ns" => &mut self.write_ns,
            _ => return None,
        })
    }

    /// Sets the counter of `file` from its text; unknown files are ignored.
    pub fn set(&mut self, file: &str, text: &str) -> Result<(), String> {
        if let Some(slot) = self.slot(file) {
            *slot = crate::parse::parse_go_uint(text.trim()).ok_or_else(|| format!("invalid value {:?}", text.trim()))?;
        }
        Ok(())
    }
}

/// A device of the class that has statistics: `st` and a number (not the
/// `nst*` no-rewind nodes nor the `st<N>[alm]` mode nodes).
pub fn is_tape(name: &str) -> bool {
    name.strip_prefix("st").is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

pub struct Collector {
    dir: PathBuf,
    ignored: Regex,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("class/scsi_tape"), ignored: o.ignored, buf: Vec::new() })
    }

    /// Reads every file of `<tape>/stats`; any file that can't be read is
    /// an error, a missing stats directory means no data.
    fn counters(&mut self, tape: &str) -> Result<Counters, Error> {
        let stats = self.dir.join(tape).join("stats");
        let mut c = Counters::default();
        for file in crate::io::sorted_names(&stats)? {
            let path = stats.join(&file);
            crate::io::read_required(&path, &mut self.buf)?;
            let text = String::from_utf8_lossy(&self.buf);
            c.set(&file, &text).map_err(|m| Error::parse(&path, m))?;
        }
        Ok(c)
    }
}

const NS: f64 = 0.000000001;

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let names = crate::io::sorted_names(&self.dir)?;
        for name in names.iter().filter(|n| is_tape(n)) {
            let c = self.counters(name)?;
            if self.ignored.is_match(name) {
                tracing::debug!(device = %name, "ignoring tape device");
                continue;
            }
            let l: &[(&str, &str)] = &[("device", name)];
            let g = Kind::Gauge;
            let k = Kind::Counter;
            sink.family("node_tape_io_now", "The number of I/Os currently outstanding to this device.", g).sample(l, c.in_flight as f64);
            sink.family(
                "node_tape_io_time_seconds_total",
                "The amount of time spent waiting for all I/O to complete (including read and write). This includes tape movement commands such as seeking between file or set marks and implicit tape movement such as when rewind on close tape devices are used.",
                k,
            )
            .sample(l, c.io_ns as f64 * NS);
            sink.family(
                "node_tape_io_others_total",
                "The number of I/Os issued to the tape drive other than read or write commands. The time taken to complete these commands uses the following calculation io_time_seconds_total-read_time_seconds_total-write_time_seconds_total",
                k,
            )
            .sample(l, c.other_cnt as f64);
            sink.family("node_tape_read_bytes_total", "The number of bytes read from the tape drive.", k).sample(l, c.read_byte_cnt as f64);
            sink.family("node_tape_reads_completed_total", "The number of read requests issued to the tape drive.", k)
                .sample(l, c.read_cnt as f64);
            sink.family("node_tape_read_time_seconds_total", "The amount of time spent waiting for read requests to complete.", k)
                .sample(l, c.read_ns as f64 * NS);
            sink.family(
                "node_tape_residual_total",
                "The number of times during a read or write we found the residual amount to be non-zero. This should mean that a program is issuing a read larger than the block size on tape. For write not all data made it to tape.",
                k,
            )
            .sample(l, c.resid_cnt as f64);
            sink.family("node_tape_written_bytes_total", "The number of bytes written to the tape drive.", k)
                .sample(l, c.write_byte_cnt as f64);
            sink.family("node_tape_writes_completed_total", "The number of write requests issued to the tape drive.", k)
                .sample(l, c.write_cnt as f64);
            sink.family("node_tape_write_time_seconds_total", "The amount of time spent waiting for write requests to complete.", k)
                .sample(l, c.write_ns as f64 * NS);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::paths;
    use crate::Collector as _;

    #[test]
    fn tape_names() {
        for ok in ["st0", "st12"] {
            assert!(is_tape(ok), "{ok}");
        }
        for no in ["st", "nst0", "st0a", "st0l", "st0m", "sta", "xst0"] {
            assert!(!is_tape(no), "{no}");
        }
    }

    #[test]
    fn counters_from_files() {
        let mut c = Counters::default();
        // From node_exporter's fixture st0/stats.
        for (f, v) in [
            ("in_flight", "1\n"),
            ("io_ns", "9247011087720\n"),
            ("other_cnt", "1409\n"),
            ("read_byte_cnt", "979383912\n"),
            ("read_cnt", "3741\n"),
            ("read_ns", "33788355744\n"),
            ("resid_cnt", "19\n"),
            ("write_byte_cnt", "1496246784000\n"),
            ("write_cnt", "53772916\n"),
            ("write_ns", "5233597394395\n"),
            ("unknown", "not a number"),
        ] {
            c.set(f, v).unwrap();
        }
        assert_eq!(c.io_ns, 9247011087720);
        assert_eq!(c.write_cnt, 53772916);
        assert_eq!(c.io_ns as f64 * NS, 9247.01108772);
        assert_eq!(c.write_ns as f64 * NS, 5233.597394395);
        assert!(c.set("read_cnt", "lots").is_err());
        assert!(c.set("read_cnt", "").is_err());
    }

    fn options(pattern: &str) -> Options {
        Options { ignored: Regex::new(pattern).unwrap() }
    }

    #[test]
    fn reads_tapes_and_reports_no_data_without_the_class() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(options("^$"), &paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        assert!(c.update(&mut sink).unwrap_err().is_no_data());

        let class = dir.path().join("sys/class/scsi_tape");
        for t in ["st0", "nst0", "st0a", "st1"] {
            std::fs::create_dir_all(class.join(t).join("stats")).unwrap();
            std::fs::write(class.join(t).join("stats/read_cnt"), "7\n").unwrap();
        }
        std::fs::write(class.join("nst0/stats/read_cnt"), "garbage\n").unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 10);
        let reads = fams.iter().find(|f| f.name() == "node_tape_reads_completed_total").unwrap();
        assert_eq!(reads.kind(), Kind::Counter);
        assert_eq!(reads.samples().collect::<Vec<_>>(), vec![(vec![("device", "st0")], 7.0), (vec![("device", "st1")], 7.0)]);
        let now = fams.iter().find(|f| f.name() == "node_tape_io_now").unwrap();
        assert_eq!(now.kind(), Kind::Gauge);

        // Ignored devices are left out.
        let mut c = Collector::new(options("^st1$"), &paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams[0].samples().count(), 1);

        // A malformed counter is a parse error, a tape without stats no data.
        std::fs::write(class.join("st1/stats/read_cnt"), "x\n").unwrap();
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
        std::fs::remove_dir_all(class.join("st1/stats")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data());
    }
}
