//! `arp`: ARP cache entries per device from /proc/net/arp.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Arg;

use crate::filter::DeviceFilter;
use crate::flags::{self, Flags};
use crate::io::read_file;
use crate::parse::{fields, lines};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        let mut v = vec![
            flags::string_arg(
                "collector.arp.device-include",
                "",
                "Regexp of arp devices to include (mutually exclusive to device-exclude).",
            ),
            flags::string_arg(
                "collector.arp.device-exclude",
                "",
                "Regexp of arp devices to exclude (mutually exclusive to device-include).",
            ),
        ];
        // Accepted for compatibility: node-agent always reads /proc/net/arp.
        v.extend(flags::bool_args("collector.arp.netlink", true, "Accepted for compatibility; entries are read from /proc/net/arp."));
        v
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { filter: f.filter("collector.arp.device-exclude", "collector.arp.device-include")? })
    }
}

/// Counts entries per device.
pub fn parse(buf: &[u8]) -> Option<BTreeMap<&[u8], u64>> {
    let mut out = BTreeMap::new();
    let mut it = lines(buf);
    it.next()?; // header
    for line in it {
        let dev = fields(line).nth(5)?;
        *out.entry(dev).or_insert(0) += 1;
    }
    Some(out)
}

pub struct Collector {
    path: PathBuf,
    filter: DeviceFilter,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { path: p.proc("net/arp"), filter: o.filter, buf: Vec::new() })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let entries = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        let mut f = sink.family("node_arp_entries", "ARP entries by device", Kind::Gauge);
        for (dev, n) in entries {
            let dev = std::str::from_utf8(dev).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
            if !self.filter.ignored(dev) {
                f.sample(&[("device", dev)], n as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"IP address HW type Flags HW address Mask Device\n192.168.1.1 0x1 0x2 cc:aa:dd:ee:aa:bb * eth0\n192.168.1.2 0x1 0x2 bb:cc:dd:ee:ff:aa * eth0\n10.0.0.1 0x1 0x2 de:ad:be:ef:00:00 * eth1\n";
        let m = super::parse(b).unwrap();
        assert_eq!(m[&b"eth0"[..]], 2);
        assert_eq!(m[&b"eth1"[..]], 1);
        assert!(super::parse(b"hdr\n1 2 3\n").is_none());
    }
}
