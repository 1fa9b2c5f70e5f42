//! `conntrack`: connection tracking table size, limit and statistics.

use std::path::PathBuf;

use crate::io::{read_file, read_into};
use crate::parse::{fields, lines, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

const STATS: [&str; 8] = ["found", "invalid", "ignore", "insert", "insert_failed", "drop", "early_drop", "search_restart"];

pub struct Collector {
    count: PathBuf,
    max: PathBuf,
    stat: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector {
            count: p.proc("sys/net/netfilter/nf_conntrack_count"),
            max: p.proc("sys/net/netfilter/nf_conntrack_max"),
            stat: p.proc("net/stat/nf_conntrack"),
            buf: Vec::new(),
        }
    }

    fn read_int(&mut self, count: bool) -> Result<f64, Error> {
        let path = if count { &self.count } else { &self.max };
        read_into(path, &mut self.buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::NoData("conntrack is not loaded".into())
            } else {
                Error::io(path, e)
            }
        })?;
        parse_u64(self.buf.trim_ascii()).map(|v| v as f64).ok_or_else(|| Error::parse(path, "not an integer"))
    }
}

/// Sums the per-CPU hexadecimal columns of /proc/net/stat/nf_conntrack,
/// returned in the order of [`STATS`] (absent columns are `None`).
pub fn parse_stat(buf: &[u8]) -> Option<[Option<u64>; 8]> {
    let mut it = lines(buf);
    let header: Vec<&[u8]> = fields(it.next()?).collect();
    let idx: Vec<Option<usize>> = STATS.iter().map(|s| header.iter().position(|h| *h == s.as_bytes())).collect();
    let mut sums: [Option<u64>; 8] = [None; 8];
    for line in it {
        let cols: Vec<u64> =
            fields(line).map(|c| std::str::from_utf8(c).ok().and_then(|c| u64::from_str_radix(c, 16).ok())).collect::<Option<_>>()?;
        if cols.len() != header.len() {
            return None;
        }
        for (sum, i) in sums.iter_mut().zip(&idx) {
            if let Some(i) = i {
                *sum = Some(sum.unwrap_or(0).wrapping_add(cols[*i]));
            }
        }
    }
    Some(sums)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let count = self.read_int(true)?;
        sink.single("node_nf_conntrack_entries", "Number of currently allocated flow entries for connection tracking.", Kind::Gauge, count);
        let max = self.read_int(false)?;
        sink.single("node_nf_conntrack_entries_limit", "Maximum size of connection tracking table.", Kind::Gauge, max);
        match read_file(&self.stat, &mut self.buf) {
            Ok(()) => {}
            Err(Error::NoData(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        let sums = parse_stat(&self.buf).ok_or_else(|| Error::parse(&self.stat, "malformed statistics"))?;
        let mut name = String::new();
        for (stat, v) in STATS.iter().zip(sums) {
            if let Some(v) = v {
                name.clear();
                name.push_str("node_nf_conntrack_stat_");
                name.push_str(stat);
                sink.single(&name, "Connection tracking statistic, summed over CPUs.", Kind::Gauge, v as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_stat() {
        let b = b"entries  searched found new invalid ignore\n00000021  00000000 00000000 00000000 00000003 0000588a\n00000021  00000000 00000001 00000000 00000002 000056a4\n";
        let s = super::parse_stat(b).unwrap();
        assert_eq!(s[0], Some(1));
        assert_eq!(s[1], Some(5));
        assert_eq!(s[2], Some(0x588a + 0x56a4));
        assert_eq!(s[3], None);
        assert!(super::parse_stat(b"a b\n1\n").is_none());
    }
}
