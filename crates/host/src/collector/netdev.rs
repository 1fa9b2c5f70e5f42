//! `netdev`: network device counters from /proc/net/dev.

use std::path::PathBuf;

use clap::Arg;

use crate::flags::{self, Flags};

use crate::filter::DeviceFilter;
use crate::io::read_file;
use crate::parse::{fields, lines, parse_u64};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

const RECEIVE: [&str; 8] = ["bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast"];
const TRANSMIT: [&str; 8] = ["bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed"];

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        let mut v = vec![
            flags::string_arg(
                "collector.netdev.device-include",
                "",
                "Regexp of net devices to include (mutually exclusive to device-exclude).",
            ),
            flags::string_arg(
                "collector.netdev.device-exclude",
                "",
                "Regexp of net devices to exclude (mutually exclusive to device-include).",
            ),
        ];
        // Accepted for compatibility: node-agent reads /proc/net/dev.
        v.extend(flags::bool_args("collector.netdev.netlink", true, "Accepted for compatibility; counters are read from /proc/net/dev."));
        v
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { filter: f.filter("collector.netdev.device-exclude", "collector.netdev.device-include")? })
    }
}

/// One device line of /proc/net/dev: name, 8 receive and 8 transmit counters.
pub type DevLine<'a> = (&'a [u8], [u64; 16]);

/// Parses /proc/net/dev (two header lines, then `name: 16 counters`).
pub fn parse(buf: &[u8]) -> Option<Vec<DevLine<'_>>> {
    let mut out = Vec::new();
    for line in lines(buf).skip(2) {
        let colon = line.iter().position(|&c| c == b':')?;
        let name = line[..colon].trim_ascii();
        let mut v = [0u64; 16];
        let mut n = 0;
        for (slot, f) in v.iter_mut().zip(fields(&line[colon + 1..])) {
            *slot = parse_u64(f)?;
            n += 1;
        }
        if n != 16 {
            return None;
        }
        out.push((name, v));
    }
    Some(out)
}

pub struct Collector {
    path: PathBuf,
    filter: DeviceFilter,
    buf: Vec<u8>,
    names: Vec<(String, String)>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let names = RECEIVE
            .iter()
            .zip(TRANSMIT)
            .map(|(r, t)| (format!("node_network_receive_{r}_total"), format!("node_network_transmit_{t}_total")))
            .collect();
        Ok(Collector { path: p.proc("net/dev"), filter: o.filter, buf: Vec::new(), names })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let devs = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        for (name, v) in devs {
            let dev = std::str::from_utf8(name).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
            if self.filter.ignored(dev) {
                continue;
            }
            for (i, (rx, tx)) in self.names.iter().enumerate() {
                sink.family(rx, "Network device statistic from /proc/net/dev.", Kind::Counter).sample(&[("device", dev)], v[i] as f64);
                sink.family(tx, "Network device statistic from /proc/net/dev.", Kind::Counter).sample(&[("device", dev)], v[8 + i] as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"Inter-|   Receive\n face |bytes\n    lo: 100 2 0 0 0 0 0 0 100 2 0 0 0 0 0 0\n  eth0:1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n";
        let d = super::parse(b).unwrap();
        assert_eq!(d[0].0, b"lo");
        assert_eq!(d[1].1[15], 16);
        assert_eq!(d[1].1[0], 1);
        assert!(super::parse(b"a\nb\n lo: 1 2 3\n").is_none());
    }
}
