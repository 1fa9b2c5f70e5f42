//! `softnet`: per-CPU packet processing statistics from /proc/net/softnet_stat.

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::{fields, lines};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("net/softnet_stat"), buf: Vec::new() }
    }
}

#[derive(Debug, Default, PartialEq)]
pub struct Softnet {
    pub cpu: u64,
    pub processed: u64,
    pub dropped: u64,
    pub time_squeezed: u64,
    pub cpu_collision: u64,
    pub received_rps: u64,
    pub flow_limit_count: u64,
    pub backlog_len: u64,
}

fn hex(b: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

/// Parses softnet_stat. Columns vary by kernel: 9 (2.6.x), 10, 11, 13 (5.10+
/// adds backlog length and the CPU index); the CPU is the line number unless
/// the kernel gives it.
pub fn parse(buf: &[u8]) -> Option<Vec<Softnet>> {
    let mut out = Vec::new();
    for (i, line) in lines(buf).enumerate() {
        let f: Vec<u64> = fields(line).map(hex).collect::<Option<_>>()?;
        if f.len() < 9 {
            return None;
        }
        let get = |i: usize| f.get(i).copied().unwrap_or(0);
        out.push(Softnet {
            cpu: if f.len() >= 13 { f[12] } else { i as u64 },
            processed: f[0],
            dropped: f[1],
            time_squeezed: f[2],
            cpu_collision: f[8],
            received_rps: get(9),
            flow_limit_count: get(10),
            backlog_len: get(11),
        });
    }
    Some(out)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let stats = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        let mut ib = itoa::Buffer::new();
        for s in &stats {
            let cpu = ib.format(s.cpu);
            let l = [("cpu", cpu)];
            sink.family("node_softnet_processed_total", "Number of processed packets", Kind::Counter).sample(&l, s.processed as f64);
            sink.family("node_softnet_dropped_total", "Number of dropped packets", Kind::Counter).sample(&l, s.dropped as f64);
            sink.family("node_softnet_times_squeezed_total", "Number of times processing packets ran out of quota", Kind::Counter)
                .sample(&l, s.time_squeezed as f64);
            sink.family(
                "node_softnet_cpu_collision_total",
                "Number of collision occur while obtaining device lock while transmitting",
                Kind::Counter,
            )
            .sample(&l, s.cpu_collision as f64);
            sink.family("node_softnet_received_rps_total", "Number of times cpu woken up received_rps", Kind::Counter)
                .sample(&l, s.received_rps as f64);
            sink.family("node_softnet_flow_limit_count_total", "Number of times flow limit has been reached", Kind::Counter)
                .sample(&l, s.flow_limit_count as f64);
            sink.family("node_softnet_backlog_len", "Softnet backlog status", Kind::Gauge).sample(&l, s.backlog_len as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"000dfb82 00000029 0000000a 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n";
        let v = super::parse(b).unwrap();
        assert_eq!(v[0].processed, 916354);
        assert_eq!(v[0].dropped, 41);
        assert_eq!(v[0].time_squeezed, 10);
        let b13 = b"1 2 3 0 0 0 0 0 4 5 6 7 3\n";
        let v = super::parse(b13).unwrap();
        assert_eq!((v[0].cpu, v[0].backlog_len, v[0].flow_limit_count), (3, 7, 6));
        assert!(super::parse(b"zz 1\n").is_none());
    }
}
