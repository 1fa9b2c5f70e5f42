//! `cgroups`: the summary of the kernel's cgroup controllers in
//! /proc/cgroups (one line per controller: name, hierarchy, number of
//! cgroups, enabled), exported per controller as `node_cgroups_cgroups`
//! and `node_cgroups_enabled`. As node_exporter (procfs), a missing or
//! malformed file is an error, not "no data".

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

const CGROUPS_HELP: &str = "Current cgroup number of the subsystem.";
// node_exporter gives both families the same help text.
const ENABLED_HELP: &str = "Current cgroup number of the subsystem.";

/// One line of /proc/cgroups.
#[derive(Debug, PartialEq)]
pub struct Summary<'a> {
    pub subsys_name: &'a str,
    pub hierarchy: i64,
    pub cgroups: i64,
    pub enabled: i64,
}

/// Parses /proc/cgroups: `#` lines are comments; every other line (an
/// empty one too) needs at least four fields, the last three integers.
pub fn parse_cgroups(text: &str) -> Result<Vec<Summary<'_>>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            return Err(format!("4+ fields required, found {} fields in cgroup info string: {line:?}", f.len()));
        }
        let int = |s: &str, what: &str| s.parse::<i64>().map_err(|_| format!("unable to parse {what} from {s:?}"));
        out.push(Summary {
            subsys_name: f[0],
            hierarchy: int(f[1], "hierarchy ID")?,
            cgroups: int(f[2], "cgroup num")?,
            enabled: int(f[3], "enabled")?,
        });
    }
    Ok(out)
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("cgroups"), buf: Vec::with_capacity(1024) }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (rather than reporting no data) without the file.
        crate::io::read_required(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        let rows = parse_cgroups(&text).map_err(|m| Error::parse(&self.path, m))?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut f = sink.new_family("node_cgroups_cgroups", CGROUPS_HELP, Kind::Gauge);
        for r in &rows {
            f.sample(&[("subsys_name", r.subsys_name)], r.cgroups as f64);
        }
        let mut f = sink.new_family("node_cgroups_enabled", ENABLED_HELP, Kind::Gauge);
        for r in &rows {
            f.sample(&[("subsys_name", r.subsys_name)], r.enabled as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    const FIXTURE: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t5\t47\t1
cpu\t3\t172\t1
memory\t7\t234\t1
rdma\t4\t1\t1";

    #[test]
    fn parses_the_fixture() {
        let s = parse_cgroups(FIXTURE).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(s[2], Summary { subsys_name: "memory", hierarchy: 7, cgroups: 234, enabled: 1 });
        assert_eq!(s[3], Summary { subsys_name: "rdma", hierarchy: 4, cgroups: 1, enabled: 1 });
        assert!(parse_cgroups("").unwrap().is_empty());
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(parse_cgroups("cpu\t3\t172").is_err());
        assert!(parse_cgroups("cpu\t3\tx\t1").is_err());
        assert!(parse_cgroups("cpu\t3\t1\t1\n\nmemory\t7\t2\t1").is_err());
        // Extra fields are allowed, signs too (Go's Atoi).
        assert_eq!(parse_cgroups("cpu 0 +2 -1 extra").unwrap()[0].enabled, -1);
    }

    #[test]
    fn collects_and_a_missing_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Collector::new(&testutil::paths(d.path()));
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data(), "{e}");
        testutil::write(d.path(), "proc/cgroups", FIXTURE);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let rows = testutil::rows(&sink);
        assert_eq!(rows.len(), 8);
        assert_eq!(rows[1], ("node_cgroups_cgroups".into(), vec![("subsys_name".into(), "cpu".into())], 172.0));
        assert_eq!(rows[7], ("node_cgroups_enabled".into(), vec![("subsys_name".into(), "rdma".into())], 1.0));
    }
}
