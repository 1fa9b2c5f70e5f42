//! `slabinfo`: the kernel's slab caches from /proc/slabinfo (version 2.1):
//! per cache, its active and total objects, object size, objects per slab
//! and pages per slab, as `node_slabinfo_*{slab}` gauges, filtered by
//! `--collector.slabinfo.slabs-include`/`-exclude`, as node_exporter does.
//! A missing or malformed file fails the collector.

use std::path::PathBuf;

use clap::Arg;

use crate::filter::DeviceFilter;
use crate::flags::{self, Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const SLABS_EXCLUDE: StringFlag =
    StringFlag { name: "collector.slabinfo.slabs-exclude", default: "", help: "Regexp of slabs to exclude in slabinfo collector." };
pub const SLABS_INCLUDE: StringFlag =
    StringFlag { name: "collector.slabinfo.slabs-include", default: ".*", help: "Regexp of slabs to include in slabinfo collector." };

/// The families, in node_exporter's order, with their help.
const FAMILIES: [(&str, &str); 5] = [
    ("node_slabinfo_active_objects", "The number of objects that are currently active (i.e., in use)."),
    ("node_slabinfo_objects", "The total number of allocated objects (i.e., objects that are both in use and not in use)."),
    ("node_slabinfo_object_size_bytes", "The size of objects in this slab, in bytes."),
    ("node_slabinfo_objects_per_slab", "The number of objects stored in each slab."),
    ("node_slabinfo_pages_per_slab", "The number of pages allocated for each slab."),
];

/// procfs reads the file through `ReadFileNoStat`, which stops at 1 MiB.
const READ_LIMIT: usize = 1024 * 1024;

/// One slab cache: its name and, in [`FAMILIES`] order, active objects,
/// objects, object size, objects per slab and pages per slab.
#[derive(Debug, PartialEq)]
pub struct Slab<'a> {
    pub name: &'a str,
    pub values: [i64; 5],
}

/// Parses /proc/slabinfo as prometheus/procfs's `parseSlabInfo21` does:
/// lines holding `slabinfo -` or `# name` are headers; every other line
/// (a blank one too) must have exactly 16 fields once each run of
/// whitespace is one space (so no leading or trailing whitespace), with
/// the 11 numbers procfs reads being decimal integers.
pub fn parse_slabinfo(text: &str) -> Result<Vec<Slab<'_>>, String> {
    let mut slabs = Vec::new();
    // procfs does not check the scanner's error: the file silently ends
    // before a line longer than the scanner's limit.
    for line in crate::parse::go_scan_lines(text).map_while(Result::ok) {
        if line.contains("slabinfo -") || line.contains("# name") {
            continue;
        }
        // Go's `\s+` to one space, then a split at spaces.
        let parts: Vec<&str> = split_runs(line).collect();
        if parts.len() != 16 {
            return Err(format!("unable to parse: {line:?}"));
        }
        let int = |i: usize| parts[i].parse::<i64>().map_err(|_| format!("invalid number {:?} in {line:?}", parts[i]));
        for i in [8, 9, 10, 13, 14, 15] {
            int(i)?;
        }
        slabs.push(Slab { name: parts[0], values: [int(1)?, int(2)?, int(3)?, int(4)?, int(5)?] });
    }
    Ok(slabs)
}

/// Splits at runs of Go's `\s` (`[\t\n\f\r ]`), keeping the empty fields a
/// leading or trailing run leaves, as `strings.Split` on the collapsed line.
fn split_runs(line: &str) -> impl Iterator<Item = &str> {
    let space = |c: char| matches!(c, '\t' | '\n' | '\x0c' | '\r' | ' ');
    let mut rest = Some(line);
    std::iter::from_fn(move || {
        let s = rest?;
        match s.find(space) {
            Some(i) => {
                let tail = &s[i..];
                let skip = tail.find(|c: char| !space(c)).unwrap_or(tail.len());
                rest = Some(&tail[skip..]);
                Some(&s[..i])
            }
            None => {
                rest = None;
                Some(s)
            }
        }
    })
}

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&SLABS_EXCLUDE, &SLABS_INCLUDE])
    }

    /// node_exporter applies both patterns.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { filter: DeviceFilter::new(SLABS_EXCLUDE.regex(f)?, SLABS_INCLUDE.regex(f)?) })
    }
}

pub struct Collector {
    path: PathBuf,
    filter: DeviceFilter,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { path: p.proc("slabinfo"), filter: o.filter, buf: Vec::with_capacity(32 * 1024) })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (not "no data") when the file is missing.
        crate::io::read_required(&self.path, &mut self.buf)?;
        self.buf.truncate(READ_LIMIT);
        let text = String::from_utf8_lossy(&self.buf);
        let slabs = parse_slabinfo(&text).map_err(|m| Error::parse(&self.path, m))?;
        for (i, (name, help)) in FAMILIES.iter().enumerate() {
            let mut family = sink.family(name, help, Kind::Gauge);
            for slab in slabs.iter().filter(|s| !self.filter.ignored(s.name)) {
                family.sample(&[("slab", slab.name)], slab.values[i] as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;
    use regex::Regex;

    const FIXTURE: &str = "slabinfo - version: 2.1
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>
tw_sock_TCP          704    864    256   32    2 : tunables    0    0    0 : slabdata     27     27      0
dmaengine-unmap-128   1206   1320   1088   30    8 : tunables    0    0    0 : slabdata     44     44      0
kmalloc-8192         132    148   8192    4    8 : tunables    0    0    0 : slabdata     37     37      0
kmem_cache           320    320    256   32    2 : tunables    0    0    0 : slabdata     10     10      0
";

    #[test]
    fn parses_the_fixture() {
        let slabs = parse_slabinfo(FIXTURE).unwrap();
        assert_eq!(slabs.len(), 4);
        assert_eq!(slabs[1], Slab { name: "dmaengine-unmap-128", values: [1206, 1320, 1088, 30, 8] });
        assert_eq!(slabs[3], Slab { name: "kmem_cache", values: [320, 320, 256, 32, 2] });
    }

    #[test]
    fn rejects_malformed_input() {
        let line = "a 1 2 3 4 5 : tunables 0 0 0 : slabdata 1 1 0";
        assert_eq!(parse_slabinfo(line).unwrap().len(), 1);
        assert!(parse_slabinfo(&format!("{line}\n\n")).is_err(), "a blank line");
        assert!(parse_slabinfo(&format!(" {line}")).is_err(), "leading whitespace");
        assert!(parse_slabinfo(&format!("{line} ")).is_err(), "trailing whitespace");
        assert!(parse_slabinfo("a 1 2 3 4 5 : tunables 0 0 0 : slabdata 1 1").is_err(), "15 fields");
        assert!(parse_slabinfo(&line.replace(" 3 ", " x ")).is_err());
        assert!(parse_slabinfo(&line.replace("slabdata 1 1 0", "slabdata 1 1 y")).is_err(), "tunables are parsed too");
        assert!(parse_slabinfo(&line.replace("tunables", "x")).is_ok(), "the literal words are not checked");
    }

    #[test]
    fn edge_cases_follow_procfs() {
        assert_eq!(parse_slabinfo("").unwrap(), vec![]);
        let line = "a\t1  -2 3 4 +5 : tunables 0 0 0 : slabdata 1 1 0\r\n";
        assert_eq!(parse_slabinfo(line).unwrap(), vec![Slab { name: "a", values: [1, -2, 3, 4, 5] }]);
        // A header marker anywhere in the line skips it.
        assert_eq!(parse_slabinfo("x # name y\nfoo slabinfo - bar\n").unwrap(), vec![]);
        // procfs ignores the scanner's error: a too-long line ends the file.
        let long = format!("{}\n{}\n", line.trim_end(), "x".repeat(crate::parse::GO_MAX_LINE + 1));
        assert_eq!(parse_slabinfo(&long).unwrap().len(), 1);
    }

    fn scrape(filter: DeviceFilter) -> Result<Vec<crate::testutil::Row>, Error> {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/slabinfo", FIXTURE);
        let mut c = Collector::new(Options { filter }, &crate::testutil::paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn update_writes_filtered_slabs() {
        let rows = scrape(DeviceFilter::new(None, Some(Regex::new(".*").unwrap()))).unwrap();
        assert_eq!(rows.len(), 20);
        let want = vec![("slab".to_string(), "kmalloc-8192".to_string())];
        assert!(rows.iter().any(|(n, l, v)| n == "node_slabinfo_object_size_bytes" && *l == want && *v == 8192.0));
        let filter = DeviceFilter::new(Some(Regex::new("^kmem").unwrap()), Some(Regex::new("^k").unwrap()));
        let rows = scrape(filter).unwrap();
        assert_eq!(rows.len(), 5);
        assert!(rows.iter().all(|(_, l, _)| l[0].1 == "kmalloc-8192"));
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(Options { filter: DeviceFilter::default() }, &crate::testutil::paths(dir.path())).unwrap();
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Io { .. })));
    }
}
