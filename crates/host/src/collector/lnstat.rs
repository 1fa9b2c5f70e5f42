//! `lnstat`: the per-CPU network cache statistics of every file under
//! /proc/net/stat (arp_cache, ndisc_cache, nf_conntrack, ...: a header line
//! of counter names, then one line of hexadecimal counters per CPU), as
//! procfs's `NetStat` reads them, exported as the counters
//! `node_lnstat_<name>_total{subsystem=<file>,cpu=<n>}`.

use std::path::PathBuf;

use crate::io::read_file;
use crate::{Error, Paths};
use expo::{Kind, Sink};

const HELP: &str = "linux network cache stats";

pub struct Collector {
    dir: PathBuf,
    buf: Vec<u8>,
    name: String,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.proc("net/stat"), buf: Vec::new(), name: String::new() }
    }
}

/// One counter of a stat file: its name and its value on each CPU, in line
/// order (a line with fewer fields adds nothing to the later counters).
#[derive(Debug, PartialEq)]
pub struct Counter<'a> {
    pub name: &'a str,
    pub per_cpu: Vec<u64>,
}

/// Parses one /proc/net/stat file: the first line names the counters, each
/// later line holds one CPU's values in hexadecimal. A repeated name
/// collects the values of all its columns, as procfs's map does. A value
/// that is not hexadecimal, or a line with more values than names, is an
/// error.
pub fn parse(text: &str) -> Result<Vec<Counter<'_>>, String> {
    let mut lines = text.lines();
    let headers: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let mut counters: Vec<Counter> = Vec::new();
    let slots: Vec<usize> = headers
        .iter()
        .map(|h| match counters.iter().position(|c| c.name == *h) {
            Some(i) => i,
            None => {
                counters.push(Counter { name: h, per_cpu: Vec::new() });
                counters.len() - 1
            }
        })
        .collect();
    for line in lines {
        for (i, field) in line.split_whitespace().enumerate() {
            let Some(&slot) = slots.get(i) else {
                return Err(format!("line {line:?} has more values than the {} names of the header", headers.len()));
            };
            counters[slot].per_cpu.push(parse_hex(field).ok_or_else(|| format!("value {field:?} is not hexadecimal"))?);
        }
    }
    Ok(counters)
}

/// Go's `strconv.ParseUint(s, 16, 64)`: hexadecimal digits only (no sign,
/// no prefix), within 64 bits.
fn parse_hex(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// A counter name makes a valid metric name after `node_lnstat_`.
fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // procfs globs net/stat/*: no directory is no files, and no metrics.
        let names = match crate::io::sorted_names(&self.dir) {
            Ok(names) => names,
            Err(e) if e.is_no_data() => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut ib = itoa::Buffer::new();
        for file in &names {
            let path = self.dir.join(file);
            if path.is_dir() {
                // procfs opens it, reads nothing, and reports nothing.
                continue;
            }
            read_file(&path, &mut self.buf)?;
            let text = String::from_utf8_lossy(&self.buf);
            let counters = parse(&text).map_err(|m| Error::parse(&path, m))?;
            for c in &counters {
                if !valid_name(c.name) {
                    return Err(Error::parse(&path, format!("counter name {:?} is not a valid metric name", c.name)));
                }
                self.name.clear();
                self.name.push_str("node_lnstat_");
                self.name.push_str(c.name);
                self.name.push_str("_total");
                let mut family = sink.family(&self.name, HELP, Kind::Counter);
                for (cpu, v) in c.per_cpu.iter().enumerate() {
                    family.sample(&[("cpu", ib.format(cpu)), ("subsystem", file)], *v as f64);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    const ARP_CACHE: &str = "entries  allocs destroys hash_grows  lookups hits  res_failed  rcv_probes_mcast rcv_probes_ucast  periodic_gc_runs forced_gc_runs unresolved_discards table_fulls
00000014  00000001 00000002 00000003  00000004 00000005  00000006  00000007 00000008  00000009 0000000a 0000000b 0000000c
00000014  0000000d 0000000e 0000000f  00000010 00000011  00000012  00000013 00000014  00000015 00000016 00000017 00000018
";

    #[test]
    fn parses_per_cpu_hex_counters() {
        let c = parse(ARP_CACHE).unwrap();
        assert_eq!(c.len(), 13);
        assert_eq!(c[0], Counter { name: "entries", per_cpu: vec![20, 20] });
        assert_eq!(c[12], Counter { name: "table_fulls", per_cpu: vec![12, 24] });
    }

    #[test]
    fn short_lines_repeated_names_and_empty_files() {
        let c = parse("a b\n1 2\n3\n\nff ff\n").unwrap();
        assert_eq!(c, vec![Counter { name: "a", per_cpu: vec![1, 3, 255] }, Counter { name: "b", per_cpu: vec![2, 255] }]);
        let c = parse("a a\n1 2\n").unwrap();
        assert_eq!(c, vec![Counter { name: "a", per_cpu: vec![1, 2] }]);
        assert!(parse("").unwrap().is_empty());
        assert!(parse("a b\n").unwrap().iter().all(|c| c.per_cpu.is_empty()));
    }

    #[test]
    fn rejects_malformed_files() {
        assert!(parse("a\n1 2\n").is_err(), "more values than names");
        assert!(parse("\n1\n").is_err(), "values without names");
        assert!(parse("a\nzz\n").is_err());
        assert!(parse("a\n+1\n").is_err());
        assert!(parse("a\n0x1\n").is_err());
        assert!(parse("a\n10000000000000000\n").is_err(), "beyond 64 bits");
    }

    #[test]
    fn writes_every_file_and_nothing_without_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert!(crate::testutil::rows(&sink).is_empty());

        crate::testutil::write(dir.path(), "proc/net/stat/arp_cache", ARP_CACHE);
        crate::testutil::write(dir.path(), "proc/net/stat/nf_conntrack", "entries searched\n00000021 00000000\n");
        std::fs::create_dir_all(dir.path().join("proc/net/stat/subdir")).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        assert_eq!(rows.len(), 26 + 2);
        let l = |cpu: &str, sub: &str| vec![("cpu".to_string(), cpu.to_string()), ("subsystem".to_string(), sub.to_string())];
        assert!(rows.contains(&("node_lnstat_entries_total".into(), l("1", "arp_cache"), 20.0)));
        assert!(rows.contains(&("node_lnstat_entries_total".into(), l("0", "nf_conntrack"), 33.0)));
        assert!(rows.contains(&("node_lnstat_table_fulls_total".into(), l("1", "arp_cache"), 24.0)));

        crate::testutil::write(dir.path(), "proc/net/stat/bad", "a\nxyz\n");
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
    }
}
