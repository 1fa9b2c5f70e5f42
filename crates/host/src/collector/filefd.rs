//! `filefd`: allocated and maximum file handles from /proc/sys/fs/file-nr.

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::{fields, parse_u64};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("sys/fs/file-nr"), buf: Vec::new() }
    }
}

/// Parses file-nr: (allocated, maximum).
pub fn parse(buf: &[u8]) -> Option<(u64, u64)> {
    let f: Vec<&[u8]> = fields(buf).collect();
    if f.len() != 3 {
        return None;
    }
    Some((parse_u64(f[0])?, parse_u64(f[2])?))
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let (alloc, max) = parse(&self.buf).ok_or_else(|| Error::parse(&self.path, "expected 3 fields"))?;
        sink.single("node_filefd_allocated", "File descriptor statistics: allocated.", Kind::Gauge, alloc as f64);
        sink.single("node_filefd_maximum", "File descriptor statistics: maximum.", Kind::Gauge, max as f64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        assert_eq!(super::parse(b"1024\t0\t1631329\n"), Some((1024, 1631329)));
        assert_eq!(super::parse(b"1024\t0\n"), None);
    }
}
