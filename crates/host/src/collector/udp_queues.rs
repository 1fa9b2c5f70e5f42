//! `udp_queues`: summed UDP socket queue lengths, as node_exporter sums the
//! `tx_queue` and `rx_queue` columns of /proc/net/udp{,6}.
//!
//! When `--path.procfs` is the kernel's procfs, the same numbers come from
//! one inet_diag dump per family (NETLINK_SOCK_DIAG, every state, UDP):
//! the kernel walks its UDP hash table once per dump, where every read of
//! /proc/net/udp walks it from the start again (the read that finds the
//! end included), and the walk is most of what either costs. Both answer
//! for the agent's network namespace (/proc/net is /proc/self/net). A
//! kernel without UDP diag (`CONFIG_INET_UDP_DIAG`), or a procfs that is a
//! fixture tree, is read from the files as node_exporter does.

use std::path::PathBuf;

use netlink_packet_sock_diag::{AF_INET, AF_INET6, IPPROTO_UDP};

use crate::io::read_into;
use crate::netlink::{self, Channel};
use crate::parse::{fields, lines};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    v4: PathBuf,
    v6: PathBuf,
    buf: Vec<u8>,
    /// The inet_diag channel, while the kernel answers UDP dumps.
    diag: Option<Channel>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        let diag = crate::sys::is_procfs(&p.proc("net")).then(Channel::sock_diag);
        Collector { v4: p.proc("net/udp"), v6: p.proc("net/udp6"), buf: Vec::new(), diag }
    }

    /// (tx, rx) of the file `path`; `None` when it does not exist.
    fn from_file(path: &std::path::Path, buf: &mut Vec<u8>) -> Result<Option<(u64, u64)>, Error> {
        match read_into(path, buf) {
            Ok(()) => parse(buf).map(Some).ok_or_else(|| Error::parse(path, "malformed line")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// (tx, rx) of `family` over inet_diag; `Ok(None)` when the kernel has
    /// no UDP diag for it (the caller falls back to the file).
    fn from_diag(channel: &mut Channel, family: u8) -> Result<Option<(u64, u64)>, netlink::Error> {
        let name = if family == AF_INET6 { "inet_diag dump (udp6)" } else { "inet_diag dump (udp)" };
        match channel.inet_sockets(name, family, IPPROTO_UDP, u32::MAX) {
            Ok(socks) => Ok(Some(sum(&socks))),
            // No handler for the protocol or family: udp_diag not built.
            Err(netlink::Error::Kernel { errno, .. }) if NO_DIAG.contains(&errno) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// What the kernel answers a dump it has no UDP diag handler for.
const NO_DIAG: [i32; 4] = [libc::ENOENT, libc::EINVAL, libc::EOPNOTSUPP, libc::EAFNOSUPPORT];

/// The (tx, rx) sums of sockets' queues.
pub fn sum(socks: &[netlink::DiagHeader]) -> (u64, u64) {
    socks.iter().fold((0u64, 0u64), |(tx, rx), s| (tx.saturating_add(u64::from(s.send_queue)), rx.saturating_add(u64::from(s.recv_queue))))
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
        for (ip, family) in [("v4", AF_INET), ("v6", AF_INET6)] {
            let path = if family == AF_INET { &self.v4 } else { &self.v6 };
            let mut queues = None;
            if let Some(ch) = self.diag.as_mut() {
                // The file's absence is node_exporter's test for IPv6.
                if family == AF_INET || path.exists() {
                    match Self::from_diag(ch, family)? {
                        Some(q) => queues = Some(q),
                        None => self.diag = None,
                    }
                }
            }
            if self.diag.is_none() {
                queues = Self::from_file(path, &mut self.buf)?;
            }
            let Some((tx, rx)) = queues else { continue };
            found = true;
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
