//! `udp_queues`: summed UDP socket queue lengths from /proc/net/udp{,6}.

use std::path::PathBuf;

use crate::io::read_into;
use crate::parse::{fields, lines};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    v4: PathBuf,
    v6: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { v4: p.proc("net/udp"), v6: p.proc("net/udp6"), buf: Vec::new() }
    }
}

/// Sums the tx and rx queue columns (`tx:rx` in hex).
pub fn parse(buf: &[u8]) -> Option<(u64, u64)> {
    let (mut tx, mut rx) = (0u64, 0u64);
    let mut it = lines(buf);
    it.next()?; // header
    for line in it {
        let q = fields(line).nth(4)?;
        let colon = q.iter().position(|&c| c == b':')?;
        let h = |b: &[u8]| std::str::from_utf8(b).ok().and_then(|s| u64::from_str_radix(s, 16).ok());
        tx = tx.saturating_add(h(&q[..colon])?);
        rx = rx.saturating_add(h(&q[colon + 1..])?);
    }
    Some((tx, rx))
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut found = false;
        for (ip, path) in [("v4", &self.v4), ("v6", &self.v6)] {
            match read_into(path, &mut self.buf) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(path, e)),
            }
            found = true;
            let (tx, rx) = parse(&self.buf).ok_or_else(|| Error::parse(path, "malformed line"))?;
            sink.family("node_udp_queues", "Number of allocated memory in the kernel for UDP datagrams in bytes.", Kind::Gauge)
                .sample(&[("ip", ip), ("queue", "rx")], rx as f64)
                .sample(&[("ip", ip), ("queue", "tx")], tx as f64);
        }
        if !found {
            return Err(Error::NoData("no /proc/net/udp or udp6".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"  sl  local_address rem_address   st tx_queue rx_queue tr\n   0: 00000000:0016 00000000:0000 0A 00000015:00000001 00:00000000\n";
        assert_eq!(super::parse(b), Some((0x15, 1)));
        assert!(super::parse(b"hdr\n 0: a b c\n").is_none());
    }
}
