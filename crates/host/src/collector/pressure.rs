//! `pressure`: pressure stall information from /proc/pressure.

use std::path::PathBuf;

use crate::io::read_into;
use crate::parse::{fields, lines, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

const RESOURCES: [&str; 4] = ["cpu", "io", "memory", "irq"];

pub struct Collector {
    paths: [PathBuf; 4],
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { paths: RESOURCES.map(|r| p.proc(&format!("pressure/{r}"))), buf: Vec::new() }
    }
}

/// Parses a PSI file: the `total=` microseconds of its `some` and `full` lines.
pub fn parse(buf: &[u8]) -> Option<(Option<u64>, Option<u64>)> {
    let (mut some, mut full) = (None, None);
    for line in lines(buf) {
        let mut f = fields(line);
        let kind = f.next()?;
        let total = f.find_map(|kv| kv.strip_prefix(b"total=")).and_then(parse_u64)?;
        match kind {
            b"some" => some = Some(total),
            b"full" => full = Some(total),
            _ => return None,
        }
    }
    Some((some, full))
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for (res, path) in RESOURCES.iter().zip(&self.paths) {
            if let Err(e) = read_into(path, &mut self.buf) {
                if e.kind() == std::io::ErrorKind::NotFound {
                    if *res == "irq" {
                        continue; // only kernels >= 6.1 with CONFIG_IRQ_TIME_ACCOUNTING
                    }
                    return Err(Error::NoData("pressure information is unavailable: needs Linux >= 4.20 with CONFIG_PSI".into()));
                }
                return Err(Error::io(path, e));
            }
            let (some, full) = parse(&self.buf).ok_or_else(|| Error::parse(path, "malformed PSI line"))?;
            // Microseconds to seconds in two steps, exactly as node_exporter computes it.
            let secs = |us: u64| us as f64 / 1000.0 / 1000.0;
            match *res {
                "cpu" => {
                    if let Some(s) = some {
                        sink.single(
                            "node_pressure_cpu_waiting_seconds_total",
                            "Total time in seconds that processes have waited for CPU time",
                            Kind::Counter,
                            secs(s),
                        );
                    }
                }
                "io" => {
                    if let Some(s) = some {
                        sink.single(
                            "node_pressure_io_waiting_seconds_total",
                            "Total time in seconds that processes have waited due to IO congestion",
                            Kind::Counter,
                            secs(s),
                        );
                    }
                    if let Some(f) = full {
                        sink.single(
                            "node_pressure_io_stalled_seconds_total",
                            "Total time in seconds no process could make progress due to IO congestion",
                            Kind::Counter,
                            secs(f),
                        );
                    }
                }
                "memory" => {
                    if let Some(s) = some {
                        sink.single(
                            "node_pressure_memory_waiting_seconds_total",
                            "Total time in seconds that processes have waited for memory",
                            Kind::Counter,
                            secs(s),
                        );
                    }
                    if let Some(f) = full {
                        sink.single(
                            "node_pressure_memory_stalled_seconds_total",
                            "Total time in seconds no process could make progress due to memory congestion",
                            Kind::Counter,
                            secs(f),
                        );
                    }
                }
                _ => {
                    if let Some(f) = full {
                        sink.single(
                            "node_pressure_irq_stalled_seconds_total",
                            "Total time in seconds no process could make progress due to IRQ congestion",
                            Kind::Counter,
                            secs(f),
                        );
                    }
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
        let b = b"some avg10=0.18 avg60=0.34 avg300=0.10 total=159886802\nfull avg10=0.18 avg60=0.34 avg300=0.10 total=159229614\n";
        assert_eq!(super::parse(b), Some((Some(159886802), Some(159229614))));
        assert_eq!(super::parse(b"full total=8494"), Some((None, Some(8494))));
        assert_eq!(super::parse(b"some avg10=1"), None);
        assert_eq!(super::parse(b"weird total=1"), None);
    }
}
