//! `meminfo`: memory statistics from /proc/meminfo, one gauge per field,
//! named as node_exporter names them (`Active(anon)` → `Active_anon`, kB
//! values in bytes with a `_bytes` suffix).

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::{fields, lines, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
    name: String,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("meminfo"), buf: Vec::new(), name: String::new() }
    }
}

/// Calls `f(key, value, in_bytes)` for each line; `kB` values are converted.
pub fn parse<'a>(buf: &'a [u8], mut f: impl FnMut(&'a [u8], f64, bool)) -> Option<()> {
    for line in lines(buf) {
        let colon = line.iter().position(|&c| c == b':')?;
        let key = &line[..colon];
        let mut it = fields(&line[colon + 1..]);
        let v = parse_u64(it.next()?)?;
        match it.next() {
            Some(b"kB") => f(key, v as f64 * 1024.0, true),
            None => f(key, v as f64, false),
            Some(_) => return None,
        }
    }
    Some(())
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let name = &mut self.name;
        let mut bad = false;
        parse(&self.buf, |key, v, bytes| {
            name.clear();
            name.push_str("node_memory_");
            for &c in key {
                match c {
                    b'(' => name.push('_'),
                    b')' => {}
                    c if c.is_ascii_alphanumeric() || c == b'_' => name.push(c as char),
                    _ => bad = true,
                }
            }
            if bytes {
                name.push_str("_bytes");
            }
            sink.single(name, "Memory information field.", Kind::Gauge, v);
        })
        .ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
        if bad {
            return Err(Error::parse(&self.path, "unexpected character in field name"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let mut got = Vec::new();
        super::parse(b"MemTotal:  3742148 kB\nHugePages_Total:       0\nActive(anon):  1 kB\n", |k, v, b| {
            got.push((String::from_utf8(k.to_vec()).unwrap(), v, b))
        })
        .unwrap();
        assert_eq!(got[0], ("MemTotal".into(), 3742148.0 * 1024.0, true));
        assert_eq!(got[1], ("HugePages_Total".into(), 0.0, false));
        assert!(super::parse(b"MemTotal 12 kB\n", |_, _, _| {}).is_none());
        assert!(super::parse(b"MemTotal: 12 MB\n", |_, _, _| {}).is_none());
    }
}
