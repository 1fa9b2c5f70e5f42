//! `uname`: the kernel's uname(2) fields as `node_uname_info`.

use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector;

impl Collector {
    pub fn new(_p: &Paths) -> Self {
        Collector
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let u = crate::sys::uname().map_err(|e| Error::io(std::path::Path::new("uname(2)"), e))?;
        sink.family("node_uname_info", "Labeled system information as provided by the uname system call.", Kind::Gauge).sample(
            &[
                ("domainname", &u.domainname),
                ("machine", &u.machine),
                ("nodename", &u.nodename),
                ("release", &u.release),
                ("sysname", &u.sysname),
                ("version", &u.version),
            ],
            1.0,
        );
        Ok(())
    }
}
