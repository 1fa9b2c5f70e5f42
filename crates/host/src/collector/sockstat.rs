//! `sockstat`: socket statistics from /proc/net/sockstat and sockstat6.

use std::path::PathBuf;

use crate::io::read_into;
use crate::parse::{fields, lines, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    v4: PathBuf,
    v6: PathBuf,
    buf: Vec<u8>,
    name: String,
    page_size: f64,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector {
            v4: p.proc("net/sockstat"),
            v6: p.proc("net/sockstat6"),
            buf: Vec::new(),
            name: String::new(),
            page_size: crate::sys::page_size() as f64,
        }
    }
}

/// Calls `f(protocol, key, value)` for every pair in a sockstat file.
pub fn parse<'a>(buf: &'a [u8], mut f: impl FnMut(&'a [u8], &'a [u8], u64)) -> Option<()> {
    for line in lines(buf) {
        let colon = line.iter().position(|&c| c == b':')?;
        let proto = &line[..colon];
        let mut it = fields(&line[colon + 1..]);
        while let Some(k) = it.next() {
            let v = parse_u64(it.next()?)?;
            f(proto, k, v);
        }
    }
    Some(())
}

impl Collector {
    fn emit(&mut self, sink: &mut Sink, v6: bool) -> Result<(), Error> {
        let path = if v6 { &self.v6 } else { &self.v4 };
        let (name, page) = (&mut self.name, self.page_size);
        let mut bad = false;
        parse(&self.buf, |proto, key, value| {
            let (Ok(proto), Ok(key)) = (std::str::from_utf8(proto), std::str::from_utf8(key)) else {
                bad = true;
                return;
            };
            name.clear();
            if proto == "sockets" {
                name.push_str("node_sockstat_sockets_");
            } else {
                name.push_str("node_sockstat_");
                name.push_str(proto);
                name.push('_');
            }
            name.push_str(key);
            let help = "Number of sockets in state.";
            sink.single(name, help, Kind::Gauge, value as f64);
            if key == "mem" {
                name.push_str("_bytes");
                sink.single(name, "Memory used by sockets, in bytes.", Kind::Gauge, value as f64 * page);
            }
        })
        .ok_or_else(|| Error::parse(path, "malformed line"))?;
        if bad {
            return Err(Error::parse(path, "invalid UTF-8"));
        }
        Ok(())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // Either file may be absent (no IPv4 or no IPv6 in this network
        // namespace); node_exporter skips it and succeeds.
        match read_into(&self.v4, &mut self.buf) {
            Ok(()) => self.emit(sink, false)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&self.v4, e)),
        }
        match read_into(&self.v6, &mut self.buf) {
            Ok(()) => self.emit(sink, true),
            // IPv6 disabled: no sockstat6.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&self.v6, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let mut got = Vec::new();
        super::parse(b"sockets: used 229\nTCP: inuse 4 orphan 0 mem 1\n", |p, k, v| got.push((p.to_vec(), k.to_vec(), v))).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[3], (b"TCP".to_vec(), b"mem".to_vec(), 1));
        assert!(super::parse(b"TCP: inuse\n", |_, _, _| {}).is_none());
        assert!(super::parse(b"no colon\n", |_, _, _| {}).is_none());
    }
}
