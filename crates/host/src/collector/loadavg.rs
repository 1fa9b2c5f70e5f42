//! `loadavg`: 1, 5 and 15 minute load averages from /proc/loadavg.

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::{fields, parse_f64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("loadavg"), buf: Vec::new() }
    }
}

/// Parses /proc/loadavg into the three load averages.
pub fn parse(buf: &[u8]) -> Option<[f64; 3]> {
    let mut f = fields(buf);
    Some([parse_f64(f.next()?)?, parse_f64(f.next()?)?, parse_f64(f.next()?)?])
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let loads = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "expected three load averages"))?;
        sink.single("node_load1", "1m load average.", Kind::Gauge, loads[0]);
        sink.single("node_load5", "5m load average.", Kind::Gauge, loads[1]);
        sink.single("node_load15", "15m load average.", Kind::Gauge, loads[2]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        assert_eq!(super::parse(b"0.21 0.37 0.39 1/719 19737\n"), Some([0.21, 0.37, 0.39]));
        assert_eq!(super::parse(b"0.21 x"), None);
        assert_eq!(super::parse(b""), None);
    }
}
