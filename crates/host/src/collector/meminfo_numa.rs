//! `meminfo_numa`: per-NUMA-node memory statistics from
//! /sys/devices/system/node/node<N>/{meminfo,numastat}. Each meminfo field
//! becomes the gauge `node_memory_numa_<field>{node}` (`Active(anon)` is
//! named `Active_anon`, values in kB are given in bytes), with `node` taken
//! from the line; each numastat counter becomes
//! `node_memory_numa_<name>_total{node}`, with `node` the directory's number.
//! As in node_exporter, no node directories is success without samples, and
//! a node without either file, or a malformed line, fails the collector.

use std::borrow::Cow;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

const PREFIX: &str = "node_memory_numa_";

/// One meminfo field of a node.
#[derive(Debug, PartialEq)]
pub struct MeminfoField<'a> {
    /// The field name, `(x)` made `_x` (`Active(anon)` -> `Active_anon`).
    pub name: Cow<'a, str>,
    /// The node number as the line gives it.
    pub node: &'a str,
    /// In bytes when the line had a `kB` unit.
    pub value: f64,
}

/// node_exporter's field name: trailing `:` removed, then its regexp
/// `\((.*)\)` replaced by `_$1` (from the first `(` to the last `)`).
fn field_name(raw: &str) -> Cow<'_, str> {
    let name = raw.trim_end_matches(':');
    match (name.find('('), name.rfind(')')) {
        (Some(open), Some(close)) if close > open => {
            Cow::Owned(format!("{}_{}{}", &name[..open], &name[open + 1..close], &name[close + 1..]))
        }
        _ => Cow::Borrowed(name),
    }
}

/// Parses a node's meminfo (`Node <n> <Field>: <value> [kB]`) as
/// node_exporter does: blank lines are skipped, any other line needs four
/// fields, or five with the unit `kB`.
pub fn parse_meminfo(text: &str) -> Result<Vec<MeminfoField<'_>>, String> {
    let mut fields = Vec::new();
    for line in crate::parse::go_lines(text) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 4 {
            return Err(format!("invalid line in meminfo: {line}"));
        }
        let mut value = crate::parse::parse_go_float(parts[3]).ok_or_else(|| format!("invalid value in meminfo: {:?}", parts[3]))?;
        match parts.len() {
            4 => {}
            5 if parts[4] == "kB" => value *= 1024.0,
            _ => return Err(format!("invalid line in meminfo: {line}")),
        }
        fields.push(MeminfoField { name: field_name(parts[2]), node: parts[1], value });
    }
    Ok(fields)
}

/// Parses a node's numastat (`<name> <count>` lines) as node_exporter does:
/// blank lines are skipped, any other line needs exactly two fields.
pub fn parse_numastat(text: &str) -> Result<Vec<(&str, f64)>, String> {
    let mut counters = Vec::new();
    for line in crate::parse::go_lines(text) {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [name, value] = parts[..] else { return Err(format!("line scan did not return 2 fields: {line}")) };
        let value = crate::parse::parse_go_float(value).ok_or_else(|| format!("invalid value in numastat: {value:?}"))?;
        counters.push((name, value));
    }
    Ok(counters)
}

/// The number of a node directory: the digits after `node` of a name
/// matching node_exporter's glob `node[0-9]*`; `None` for other names.
pub fn node_number(name: &[u8]) -> Option<&str> {
    let rest = name.strip_prefix(b"node")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // ASCII digits: valid UTF-8.
    (digits > 0).then(|| std::str::from_utf8(&rest[..digits]).ok()).flatten()
}

/// Sets `name` and `help` to those of the family of `field` + `suffix`.
fn set_name(name: &mut String, help: &mut String, field: &str, suffix: &str) {
    name.clear();
    name.extend([PREFIX, field, suffix]);
    help.clear();
    help.extend(["Memory information field ", field, suffix, "."]);
}

pub struct Collector {
    dir: PathBuf,
    buf: Vec<u8>,
    /// The family name and help being written.
    name: String,
    help: String,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("devices/system/node"), buf: Vec::with_capacity(4096), name: String::new(), help: String::new() }
    }

    /// The node directories, sorted as Go's `filepath.Glob` sorts them. As
    /// the glob, an unreadable or missing directory has no matches.
    fn nodes(&self) -> Vec<std::ffi::OsString> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).filter(|n| node_number(n.as_bytes()).is_some()).collect();
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        names
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for dir_name in self.nodes() {
            let Some(node) = node_number(dir_name.as_bytes()) else { continue };
            let node_dir = self.dir.join(&dir_name);

            let path = node_dir.join("meminfo");
            crate::io::read_required(&path, &mut self.buf)?;
            let text = String::from_utf8_lossy(&self.buf);
            for f in parse_meminfo(&text).map_err(|m| Error::parse(&path, m))? {
                set_name(&mut self.name, &mut self.help, &f.name, "");
                sink.family(&self.name, &self.help, Kind::Gauge).sample(&[("node", f.node)], f.value);
            }

            let path = node_dir.join("numastat");
            crate::io::read_required(&path, &mut self.buf)?;
            let text = String::from_utf8_lossy(&self.buf);
            for (name, value) in parse_numastat(&text).map_err(|m| Error::parse(&path, m))? {
                set_name(&mut self.name, &mut self.help, name, "_total");
                sink.family(&self.name, &self.help, Kind::Counter).sample(&[("node", node)], value);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;
    use std::path::Path;

    const MEMINFO: &str = "\
Node 1 MemTotal:       134217728 kB
Node 1 MemFree:        39634788 kB
Node 1 Active(anon):     590464 kB
Node 1 Inactive(file): 71165504 kB
Node 1 HugePages_Total:     0
Node 1 HugePages_Free:      0
";

    const NUMASTAT: &str = "\
numa_hit 326720946761
numa_miss 59858626709
numa_foreign 12624528
interleave_hit 57286
local_node 326719046550
other_node 59860526920
";

    #[test]
    fn parses_meminfo() {
        let f = parse_meminfo(MEMINFO).unwrap();
        assert_eq!(f.len(), 6);
        assert_eq!(f[0], MeminfoField { name: "MemTotal".into(), node: "1", value: 134217728.0 * 1024.0 });
        assert_eq!(f[2], MeminfoField { name: "Active_anon".into(), node: "1", value: 590464.0 * 1024.0 });
        assert_eq!(f[3].name, "Inactive_file");
        assert_eq!(f[4], MeminfoField { name: "HugePages_Total".into(), node: "1", value: 0.0 });
    }

    #[test]
    fn field_names_follow_the_regexp() {
        assert_eq!(field_name("Active(anon):"), "Active_anon");
        assert_eq!(field_name("A(b)c(d)::"), "A_b)c(d");
        assert_eq!(field_name("Odd)(x"), "Odd)(x");
        assert_eq!(field_name("Plain"), "Plain");
    }

    #[test]
    fn rejects_malformed_meminfo() {
        assert!(parse_meminfo("Node 0 MemTotal: x kB\n").unwrap_err().contains("invalid value"));
        assert!(parse_meminfo("Node 0 MemTotal: 1 MB\n").unwrap_err().contains("invalid line"));
        assert!(parse_meminfo("Node 0 MemTotal: 1 kB extra\n").unwrap_err().contains("invalid line"));
        // node_exporter would index out of range here; this is an error instead.
        assert!(parse_meminfo("Node 0 MemTotal:\n").is_err());
        assert_eq!(parse_meminfo("\n  \nNode 0 X: 2\n").unwrap().len(), 1, "blank lines are skipped");
    }

    #[test]
    fn parses_numastat() {
        let c = parse_numastat(NUMASTAT).unwrap();
        assert_eq!(c.len(), 6);
        assert_eq!(c[0], ("numa_hit", 326720946761.0));
        assert_eq!(c[5], ("other_node", 59860526920.0));
        assert!(parse_numastat("numa_hit 1 2\n").unwrap_err().contains("2 fields"));
        assert!(parse_numastat("numa_hit\n").is_err());
        assert!(parse_numastat("numa_hit x\n").unwrap_err().contains("invalid value"));
    }

    #[test]
    fn node_numbers_match_the_glob() {
        assert_eq!(node_number(b"node0"), Some("0"));
        assert_eq!(node_number(b"node12x"), Some("12"));
        assert_eq!(node_number(b"node"), None);
        assert_eq!(node_number(b"nodex1"), None);
        assert_eq!(node_number(b"possible"), None);
    }

    fn scrape(root: &Path) -> Result<Vec<crate::testutil::Row>, Error> {
        let mut c = Collector::new(&crate::testutil::paths(root));
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn update_reads_every_node() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap().is_empty(), "no nodes: success without samples");
        crate::testutil::write(dir.path(), "sys/devices/system/node/node1/meminfo", MEMINFO);
        crate::testutil::write(dir.path(), "sys/devices/system/node/node1/numastat", NUMASTAT);
        crate::testutil::write(dir.path(), "sys/devices/system/node/possible", "0-1\n");
        let rows = scrape(dir.path()).unwrap();
        assert_eq!(rows.len(), 12);
        let node = |v: &str| vec![("node".to_string(), v.to_string())];
        assert!(rows.contains(&("node_memory_numa_Active_anon".into(), node("1"), 590464.0 * 1024.0)));
        assert!(rows.contains(&("node_memory_numa_other_node_total".into(), node("1"), 59860526920.0)));

        // A node without numastat fails, as in node_exporter.
        crate::testutil::write(dir.path(), "sys/devices/system/node/node0/meminfo", MEMINFO);
        assert!(matches!(scrape(dir.path()), Err(Error::Io { .. })));
    }
}
