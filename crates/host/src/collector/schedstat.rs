//! `schedstat`: per-CPU scheduler statistics from /proc/schedstat.

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::{fields, lines, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("schedstat"), buf: Vec::new() }
    }
}

/// One CPU's line: (cpu, running ns, waiting ns, timeslices).
#[derive(Debug, PartialEq)]
pub struct CpuSched<'a> {
    pub cpu: &'a [u8],
    pub running_ns: u64,
    pub waiting_ns: u64,
    pub timeslices: u64,
}

/// Parses the `cpuN` lines of /proc/schedstat.
pub fn parse(buf: &[u8]) -> Option<Vec<CpuSched<'_>>> {
    let mut out = Vec::new();
    for line in lines(buf) {
        let Some(cpu) = line.strip_prefix(b"cpu") else { continue };
        // A line that is not ten numbers is skipped, as procfs's
        // Schedstat does (its line pattern does not match it).
        let f: Vec<&[u8]> = fields(cpu).collect();
        if f.len() < 10 || f[..10].iter().any(|x| parse_u64(x).is_none()) {
            continue;
        }
        let n = |i: usize| parse_u64(f[i]).unwrap_or_default();
        out.push(CpuSched { cpu: f[0], running_ns: n(7), waiting_ns: n(8), timeslices: n(9) });
    }
    Some(out)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let cpus = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed cpu line"))?;
        for c in &cpus {
            let cpu = std::str::from_utf8(c.cpu).map_err(|_| Error::parse(&self.path, "cpu id"))?;
            sink.family("node_schedstat_running_seconds_total", "Number of seconds CPU spent running a process.", Kind::Counter)
                .sample(&[("cpu", cpu)], c.running_ns as f64 / 1e9);
            sink.family(
                "node_schedstat_waiting_seconds_total",
                "Number of seconds spent by processing waiting for this CPU.",
                Kind::Counter,
            )
            .sample(&[("cpu", cpu)], c.waiting_ns as f64 / 1e9);
            sink.family("node_schedstat_timeslices_total", "Number of timeslices executed by CPU.", Kind::Counter)
                .sample(&[("cpu", cpu)], c.timeslices as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"version 15\ntimestamp 1\ncpu0 498494191 0 3533438552 2553969831 3853684107 2465731542 2045936778163039 343796328169361 4767485306\ndomain0 00000000,00000003 1 2\n";
        let v = super::parse(b).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].cpu, b"0");
        assert_eq!(v[0].running_ns, 2045936778163039);
        assert_eq!(v[0].timeslices, 4767485306);
        assert_eq!(super::parse(b"cpu0 1 2 3\ncpu1 1 2 3 4 5 6 7 8 9\n").map(|v| v.len()), Some(1), "short lines are skipped");
    }
}
