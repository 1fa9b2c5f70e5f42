//! `softirqs`: the softirq counts per CPU and vector from /proc/softirqs,
//! exported as `node_softirqs_functions_total{cpu,type}` (`type` is the
//! kernel's vector name: HI, TIMER, NET_TX, NET_RX, BLOCK, IRQ_POLL,
//! TASKLET, SCHED, HRTIMER, RCU), as node_exporter does; other rows are
//! ignored, and a missing, empty or malformed file fails the collector.

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

const FUNCTIONS: &str = "node_softirqs_functions_total";
const FUNCTIONS_HELP: &str = "Softirq counts per CPU.";

/// The vectors prometheus/procfs reads, in its order: the row's name in the
/// file (without its colon) is the `type` label.
pub const VECTORS: [&str; 10] = ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"];

/// procfs reads the file through `ReadFileNoStat`, which stops at 1 MiB.
const READ_LIMIT: usize = 1024 * 1024;

/// The per-CPU counts of each vector of [`VECTORS`] (same index); a vector
/// the file does not list is `None`.
pub type Softirqs = [Option<Vec<u64>>; 10];

/// Parses /proc/softirqs as prometheus/procfs's `parseSoftirqs` does: the
/// first line (the CPU header) must be there and is skipped; a row of a
/// known vector with at least one count has all its counts parsed (a bad
/// one fails the file), a later row of the same vector replaces an earlier
/// one, and any other row is skipped.
pub fn parse_softirqs(text: &str) -> Result<Softirqs, String> {
    let mut out: Softirqs = Default::default();
    let mut lines = crate::parse::go_scan_lines(text);
    match lines.next() {
        None => return Err("softirqs empty".to_string()),
        Some(header) => {
            header?;
        }
    }
    for line in lines {
        let mut parts = line?.split_whitespace();
        let Some(name) = parts.next() else { continue };
        let counts: Vec<&str> = parts.collect();
        if counts.is_empty() {
            continue;
        }
        let Some(i) = name.strip_suffix(':').and_then(|n| VECTORS.iter().position(|v| *v == n)) else { continue };
        let values = counts
            .iter()
            .enumerate()
            .map(|(cpu, c)| crate::parse::parse_go_dec_uint(c).map_err(|_| format!("couldn't parse {c:?} ({}{cpu})", VECTORS[i])))
            .collect::<Result<Vec<u64>, String>>()?;
        out[i] = Some(values);
    }
    Ok(out)
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
    /// The `cpu` label values "0", "1", ..., kept from scrape to scrape.
    cpus: Vec<String>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("softirqs"), buf: Vec::with_capacity(4096), cpus: Vec::new() }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // node_exporter fails (not "no data") when the file is missing.
        crate::io::read_required(&self.path, &mut self.buf)?;
        self.buf.truncate(READ_LIMIT);
        let text = String::from_utf8_lossy(&self.buf);
        let softirqs = parse_softirqs(&text).map_err(|m| Error::parse(&self.path, m))?;
        let widest = softirqs.iter().flatten().map(Vec::len).max().unwrap_or(0);
        while self.cpus.len() < widest {
            self.cpus.push(self.cpus.len().to_string());
        }
        let mut family = sink.family(FUNCTIONS, FUNCTIONS_HELP, Kind::Counter);
        for (name, counts) in VECTORS.iter().zip(&softirqs) {
            for (v, cpu) in counts.iter().flatten().zip(&self.cpus) {
                family.sample(&[("cpu", cpu), ("type", name)], *v as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    const FIXTURE: &str = "                    CPU0       CPU1       
          HI:          7          1
       TIMER:     424191     108342
      NET_TX:       2301       2430
      NET_RX:      43066     104508
       BLOCK:      23776      24115
    IRQ_POLL:          0          0
     TASKLET:        372       1899
       SCHED:     378895     152852
     HRTIMER:         40        346
         RCU:     155929     146631
";

    #[test]
    fn parses_the_fixture() {
        let s = parse_softirqs(FIXTURE).unwrap();
        assert_eq!(s[0], Some(vec![7, 1]));
        assert_eq!(s[1], Some(vec![424191, 108342]));
        assert_eq!(s[5], Some(vec![0, 0]));
        assert_eq!(s[9], Some(vec![155929, 146631]));
        assert!(s.iter().all(Option::is_some));
    }

    #[test]
    fn rejects_malformed_input() {
        assert!(parse_softirqs("").unwrap_err().contains("empty"));
        assert!(parse_softirqs("CPU0\nHI: x\n").unwrap_err().contains("HI0"));
        assert!(parse_softirqs("CPU0 CPU1\nRCU: 1 -2\n").unwrap_err().contains("RCU1"));
        assert!(parse_softirqs("CPU0\nHI: +1\n").is_err(), "ParseUint takes no sign");
        assert!(parse_softirqs("CPU0\nHI: 18446744073709551616\n").is_err(), "overflow");
        assert!(parse_softirqs(&format!("CPU0\nHI: 1 {}\n", "0".repeat(crate::parse::GO_MAX_LINE))).unwrap_err().contains("too long"));
    }

    #[test]
    fn edge_cases_follow_procfs() {
        // Only the header: nothing, but no error.
        assert!(parse_softirqs("CPU0\n").unwrap().iter().all(Option::is_none));
        // Unknown rows, rows without counts and names without a colon are skipped.
        let s = parse_softirqs("CPU0\nFOO: x\nHI:\nTIMER 5\nBLOCK: 3\r\n").unwrap();
        assert_eq!((s[0].as_ref(), s[1].as_ref(), s[4].as_ref()), (None, None, Some(&vec![3])));
        // A repeated row replaces the earlier one; a header of any shape is skipped.
        let s = parse_softirqs("\nHI: 1 2\nHI: 3\n").unwrap();
        assert_eq!(s[0], Some(vec![3]));
    }

    #[test]
    fn update_writes_counts_and_fails_without_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        assert!(matches!(c.update(&mut sink), Err(Error::Io { .. })));
        crate::testutil::write(dir.path(), "proc/softirqs", FIXTURE);
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        assert_eq!(rows.len(), 20);
        let want = vec![("cpu".to_string(), "1".to_string()), ("type".to_string(), "NET_RX".to_string())];
        assert!(rows.iter().any(|(n, l, v)| n == FUNCTIONS && *l == want && *v == 104508.0));
        crate::testutil::write(dir.path(), "proc/softirqs", "CPU0\nHI: x\n");
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
    }
}
