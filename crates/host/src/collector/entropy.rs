//! `entropy`: available entropy and pool size of the kernel's random pool.

use std::path::PathBuf;

use crate::io::read_file;
use crate::parse::parse_u64;
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    avail: PathBuf,
    pool: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { avail: p.proc("sys/kernel/random/entropy_avail"), pool: p.proc("sys/kernel/random/poolsize"), buf: Vec::new() }
    }

    fn read(&mut self, which: bool) -> Result<f64, Error> {
        let path = if which { &self.avail } else { &self.pool };
        read_file(path, &mut self.buf)?;
        parse_u64(self.buf.trim_ascii()).map(|v| v as f64).ok_or_else(|| Error::parse(path, "not an integer"))
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let avail = self.read(true)?;
        sink.single("node_entropy_available_bits", "Bits of available entropy.", Kind::Gauge, avail);
        let pool = self.read(false)?;
        sink.single("node_entropy_pool_size_bits", "Bits of entropy pool.", Kind::Gauge, pool);
        Ok(())
    }
}
