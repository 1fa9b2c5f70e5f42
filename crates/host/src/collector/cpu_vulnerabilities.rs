//! `cpu_vulnerabilities`: the CPU vulnerabilities the kernel reports in
//! /sys/devices/system/cpu/vulnerabilities, one file each, exported as
//! `node_cpu_vulnerabilities_info{codename,mitigation,state} 1` (`state` is
//! `not affected`, `vulnerable`, `mitigation` or `unknown`; `mitigation` the
//! rest of the file's text), as node_exporter does. No such directory is
//! success with no samples; a missing sysfs or an unreadable entry fails
//! the collector.

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

const INFO: &str = "node_cpu_vulnerabilities_info";
const INFO_HELP: &str = "Details of each CPU vulnerability reported by sysfs. The value of the series is an int encoded state of the vulnerability. The same state is stored as a string in the label";

/// One vulnerability file's state and mitigation.
#[derive(Debug, PartialEq)]
pub struct Vulnerability {
    pub state: &'static str,
    pub mitigation: String,
}

/// Parses a vulnerability file as prometheus/procfs's `parseVulnerability`
/// does: the trimmed text's prefix (any case) gives the state; after
/// `Vulnerable`, `Mitigation` or `Unknown` the remaining words, single-spaced,
/// are the mitigation; any other text is state `unknown` with the whole
/// trimmed text as its mitigation.
pub fn parse_vulnerability(raw: &str) -> Vulnerability {
    let text = raw.trim();
    let lower = text.to_lowercase();
    let rest = || text.split_whitespace().skip(1).collect::<Vec<_>>().join(" ");
    if lower.starts_with("not affected") {
        Vulnerability { state: "not affected", mitigation: String::new() }
    } else if let Some(state) = ["vulnerable", "mitigation", "unknown"].into_iter().find(|s| lower.starts_with(s)) {
        Vulnerability { state, mitigation: rest() }
    } else {
        Vulnerability { state: "unknown", mitigation: text.to_string() }
    }
}

pub struct Collector {
    sysfs: PathBuf,
    dir: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { sysfs: p.sysfs.clone(), dir: p.sys("devices/system/cpu/vulnerabilities") }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter opens sysfs first: it must be a directory.
        match std::fs::metadata(&self.sysfs) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::parse(&self.sysfs, "failed to open sysfs: not a directory")),
            Err(e) => return Err(Error::io(&self.sysfs, e)),
        }
        // procfs globs the directory: when it can't be listed, there is nothing.
        let Ok(names) = crate::io::sorted_names(&self.dir) else { return Ok(()) };
        let mut family = sink.family(INFO, INFO_HELP, Kind::Gauge);
        for name in &names {
            let path = self.dir.join(name);
            let text = crate::io::read_text(&path).map_err(|e| Error::io(&path, e))?;
            let v = parse_vulnerability(&text);
            family.sample(&[("codename", name), ("mitigation", &v.mitigation), ("state", v.state)], 1.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn parses_the_states() {
        let v = |s: &'static str, m: &str| Vulnerability { state: if s == "na" { "not affected" } else { s }, mitigation: m.to_string() };
        assert_eq!(parse_vulnerability("Not affected\n"), v("na", ""));
        assert_eq!(parse_vulnerability("Vulnerable\n"), v("vulnerable", ""));
        assert_eq!(
            parse_vulnerability("Mitigation: Retpolines, IBPB: conditional,  STIBP: always-on\n"),
            v("mitigation", "Retpolines, IBPB: conditional, STIBP: always-on")
        );
        assert_eq!(
            parse_vulnerability("Vulnerable: Clear CPU buffers attempted, no microcode"),
            v("vulnerable", "Clear CPU buffers attempted, no microcode")
        );
        assert_eq!(parse_vulnerability("unknown: No mitigations"), v("unknown", "No mitigations"));
        assert_eq!(parse_vulnerability("  Processor vulnerable  \n"), v("unknown", "Processor vulnerable"));
        assert_eq!(parse_vulnerability(""), v("unknown", ""));
        assert_eq!(parse_vulnerability("NOT AFFECTED at all"), v("na", ""));
    }

    #[test]
    fn update_reads_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Io { .. })), "no sysfs");
        std::fs::create_dir_all(dir.path().join("sys")).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert!(crate::testutil::rows(&sink).is_empty(), "no vulnerabilities directory: success, nothing");
        let vulns = "sys/devices/system/cpu/vulnerabilities";
        crate::testutil::write(dir.path(), &format!("{vulns}/mds"), "Vulnerable\n");
        crate::testutil::write(dir.path(), &format!("{vulns}/spectre_v1"), "Mitigation: usercopy/swapgs barriers\n");
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        let l =
            |c: &str, m: &str, s: &str| vec![("codename".into(), c.into()), ("mitigation".into(), m.into()), ("state".into(), s.into())];
        assert_eq!(
            rows,
            vec![
                (INFO.to_string(), l("mds", "", "vulnerable"), 1.0),
                (INFO.to_string(), l("spectre_v1", "usercopy/swapgs barriers", "mitigation"), 1.0)
            ]
        );
        std::fs::create_dir_all(dir.path().join(vulns).join("subdir")).unwrap();
        assert!(c.update(&mut Sink::new()).is_err(), "an entry that can't be read fails, as os.ReadFile does");
    }
}
