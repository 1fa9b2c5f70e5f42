//! `stat`: kernel activity from /proc/stat — interrupts, context switches,
//! forks, boot time, runnable and blocked tasks, and with
//! `--collector.stat.softirq` the softirqs per vector.

use std::path::PathBuf;

use clap::Arg;

use crate::flags::{BoolFlag, Flags};

use crate::io::read_file;
use crate::parse::{fields, lines, parse_u64, proc_stat_cpu};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

const SOFTIRQ_VECTORS: [&str; 10] = ["hi", "timer", "net_tx", "net_rx", "block", "block_iopoll", "tasklet", "sched", "hrtimer", "rcu"];

pub const SOFTIRQ: BoolFlag = BoolFlag { name: "collector.stat.softirq", default: false, help: "Export softirq calls per vector" };

/// The collector's flags, parsed once.
pub struct Options {
    pub softirq: bool,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        SOFTIRQ.args().into()
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { softirq: SOFTIRQ.get(f) })
    }
}

/// The totals of /proc/stat.
#[derive(Debug, Default, PartialEq)]
pub struct Stat {
    pub intr: Option<u64>,
    pub ctxt: Option<u64>,
    pub btime: Option<u64>,
    pub processes: Option<u64>,
    pub procs_running: Option<u64>,
    pub procs_blocked: Option<u64>,
    pub softirq: Option<[u64; 10]>,
}

/// Parses /proc/stat's totals as prometheus/procfs's `parseStat` does:
/// a line of one field is skipped; every `cpu` line, every `intr` column,
/// a `softirq` line of fewer than eleven numbers and a malformed value of
/// a known key fail the file (and so the collector, as in node_exporter).
pub fn parse(buf: &[u8]) -> Option<Stat> {
    let mut s = Stat::default();
    for line in lines(buf) {
        let mut f = fields(line).peekable();
        let Some(key) = f.next() else { continue };
        if f.peek().is_none() {
            continue;
        }
        let slot = match key {
            b"intr" => {
                s.intr = Some(parse_u64(f.next()?)?);
                for x in f {
                    parse_u64(x)?;
                }
                continue;
            }
            b"ctxt" => &mut s.ctxt,
            b"btime" => &mut s.btime,
            b"processes" => &mut s.processes,
            b"procs_running" => &mut s.procs_running,
            b"procs_blocked" => &mut s.procs_blocked,
            b"softirq" => {
                let _total = parse_u64(f.next()?)?;
                let mut v = [0u64; 10];
                for slot in v.iter_mut() {
                    *slot = parse_u64(f.next()?)?;
                }
                s.softirq = Some(v);
                continue;
            }
            k if k.starts_with(b"cpu") => {
                proc_stat_cpu(line)?;
                continue;
            }
            _ => continue,
        };
        *slot = Some(parse_u64(f.next()?)?);
    }
    Some(s)
}

pub struct Collector {
    path: PathBuf,
    softirq: bool,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { path: p.proc("stat"), softirq: o.softirq, buf: Vec::new() })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let s = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        let items = [
            (s.intr, "node_intr_total", "Total number of interrupts serviced.", Kind::Counter),
            (s.ctxt, "node_context_switches_total", "Total number of context switches.", Kind::Counter),
            (s.processes, "node_forks_total", "Total number of forks.", Kind::Counter),
            (s.btime, "node_boot_time_seconds", "Node boot time, in unixtime.", Kind::Gauge),
            (s.procs_running, "node_procs_running", "Number of processes in runnable state.", Kind::Gauge),
            (s.procs_blocked, "node_procs_blocked", "Number of processes blocked waiting for I/O to complete.", Kind::Gauge),
        ];
        for (v, name, help, kind) in items {
            if let Some(v) = v {
                sink.single(name, help, kind, v as f64);
            }
        }
        if self.softirq {
            if let Some(v) = s.softirq {
                let mut f = sink.family("node_softirqs_total", "Number of softirq calls.", Kind::Counter);
                for (vector, v) in SOFTIRQ_VECTORS.iter().zip(v) {
                    f.sample(&[("vector", vector)], v as f64);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"cpu 1 2 3 4\nintr 8885917 17 0\nctxt 38014093\nbtime 1418183276\nprocesses 26442\nprocs_running 2\nprocs_blocked 0\nsoftirq 5057579 250191 1481983 1647 211099 186066 0 1783454 622196 12499 508444\n";
        let s = super::parse(b).unwrap();
        assert_eq!(s.intr, Some(8885917));
        assert_eq!(s.btime, Some(1418183276));
        assert_eq!(s.softirq.unwrap()[4], 186066);
        assert!(super::parse(b"ctxt x\n").is_none());
        // node_exporter 1.12 (procfs parseStat) fails on each of these.
        for bad in ["cpu  1 2 x\n", "intr 5 x\n", "softirq 1 2\n", "cpu7 1 y\n"] {
            assert!(super::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
        // ... and skips a key without a value.
        assert_eq!(super::parse(b"ctxt\nbtime 7\n").map(|s| s.btime), Some(Some(7)));
    }
}
