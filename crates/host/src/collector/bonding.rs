//! `bonding`: Linux bonding interfaces, from /sys/class/net. It reads the
//! masters listed in `bonding_masters`, each master's `bonding/slaves` and
//! every slave's `lower_<slave>/bonding_slave/mii_status` (`slave_<slave>`
//! on older kernels), and exports per master the number of configured
//! slaves (`node_bonding_slaves`) and of slaves whose MII status is `up`
//! (`node_bonding_active`). A missing file anywhere is "no data", as in
//! node_exporter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The names of a whitespace-separated list (`bonding_masters`, `slaves`).
pub fn parse_names(text: &str) -> impl Iterator<Item = &str> {
    text.split_whitespace()
}

/// Whether a slave's `mii_status` says the link is up.
pub fn mii_up(status: &str) -> bool {
    status.trim() == "up"
}

/// An interface name as one path component: kernel names never hold `/`
/// and are never `.` or `..`; anything else cannot exist under the class
/// directory.
fn component(name: &str) -> Option<&str> {
    (!name.contains('/') && name != "." && name != "..").then_some(name)
}

pub struct Collector {
    /// /sys/class/net.
    dir: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("class/net"), buf: Vec::with_capacity(256) }
    }

    /// Reads a whole file as text into `self.buf`; a missing file is no data.
    fn read(&mut self, path: &Path) -> Result<String, Error> {
        crate::io::read_file(path, &mut self.buf)?;
        Ok(String::from_utf8_lossy(&self.buf).into_owned())
    }

    fn missing(path: &Path) -> Error {
        Error::NoData(format!("{} does not exist", path.display()))
    }

    /// (configured, active) slaves of one master.
    fn master(&mut self, master: &str) -> Result<(u64, u64), Error> {
        let Some(m) = component(master) else { return Err(Self::missing(&self.dir.join("bonding_masters"))) };
        let slaves_path = self.dir.join(m).join("bonding/slaves");
        let slaves = self.read(&slaves_path)?;
        let (mut configured, mut active) = (0, 0);
        for slave in parse_names(&slaves) {
            let Some(s) = component(slave) else { return Err(Self::missing(&slaves_path)) };
            let lower = self.dir.join(m).join(format!("lower_{s}/bonding_slave/mii_status"));
            let status = match self.read(&lower) {
                Err(Error::NoData(_)) => self.read(&self.dir.join(m).join(format!("slave_{s}/bonding_slave/mii_status")))?,
                r => r?,
            };
            configured += 1;
            if mii_up(&status) {
                active += 1;
            }
        }
        Ok((configured, active))
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let masters = self.read(&self.dir.join("bonding_masters")).inspect_err(|e| {
            if e.is_no_data() {
                tracing::debug!("not collecting bonding: {e}");
            }
        })?;
        let mut stats = BTreeMap::new();
        for master in parse_names(&masters) {
            if !stats.contains_key(master) {
                let s = self.master(master)?;
                stats.insert(master.to_string(), s);
            }
        }
        if stats.is_empty() {
            return Ok(());
        }
        let mut f = sink.new_family("node_bonding_slaves", "Number of configured slaves per bonding interface.", Kind::Gauge);
        for (master, (configured, _)) in &stats {
            f.sample(&[("master", master)], *configured as f64);
        }
        let mut f = sink.new_family("node_bonding_active", "Number of active slaves per bonding interface.", Kind::Gauge);
        for (master, (_, active)) in &stats {
            f.sample(&[("master", master)], *active as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::write;
    use crate::Collector as _;

    fn paths(sys: &Path) -> Paths {
        Paths { procfs: "/nonexistent".into(), sysfs: sys.into(), rootfs: "/".into(), udev_data: "/nonexistent".into() }
    }

    fn values(sink: &Sink, name: &str) -> Vec<(String, f64)> {
        let fams = sink.families();
        let f = fams.iter().find(|f| f.name() == name).unwrap();
        assert_eq!(f.kind(), Kind::Gauge);
        f.samples().map(|(l, v)| (l[0].1.to_string(), v)).collect()
    }

    /// node_exporter's fixture: bond0 without slaves, dmz with two slaves
    /// up, int with one of two up (the old `slave_` prefix).
    fn fixture(root: &Path) {
        write(root, "class/net/bonding_masters", "bond0 dmz int\n");
        write(root, "class/net/bond0/bonding/slaves", "");
        write(root, "class/net/dmz/bonding/slaves", "eth0 eth4\n");
        write(root, "class/net/dmz/slave_eth0/bonding_slave/mii_status", "up\n");
        write(root, "class/net/dmz/slave_eth4/bonding_slave/mii_status", "up\n");
        write(root, "class/net/int/bonding/slaves", "eth5 eth1\n");
        write(root, "class/net/int/lower_eth5/bonding_slave/mii_status", "up\n");
        write(root, "class/net/int/slave_eth1/bonding_slave/mii_status", "down\n");
    }

    #[test]
    fn counts_configured_and_active_slaves() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let mut c = Collector::new(&paths(dir.path()));
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let s = |v: &[(&str, f64)]| v.iter().map(|(a, b)| (a.to_string(), *b)).collect::<Vec<_>>();
        assert_eq!(values(&sink, "node_bonding_slaves"), s(&[("bond0", 0.0), ("dmz", 2.0), ("int", 2.0)]));
        assert_eq!(values(&sink, "node_bonding_active"), s(&[("bond0", 0.0), ("dmz", 2.0), ("int", 1.0)]));
    }

    #[test]
    fn a_missing_file_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Collector::new(&paths(dir.path()));
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data(), "no bonding_masters");
        fixture(dir.path());
        std::fs::remove_file(dir.path().join("class/net/int/slave_eth1/bonding_slave/mii_status")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data(), "a slave without mii_status");
        write(dir.path(), "class/net/bonding_masters", "/etc\n");
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data(), "a name that is no interface");
    }

    #[test]
    fn duplicate_masters_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        write(dir.path(), "class/net/bonding_masters", "dmz dmz\n");
        let mut c = Collector::new(&paths(dir.path()));
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert_eq!(values(&sink, "node_bonding_slaves"), vec![("dmz".to_string(), 2.0)]);
    }

    #[test]
    fn parsers() {
        assert_eq!(parse_names(" a\tb\n c ").collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(mii_up("up\n") && !mii_up("down") && !mii_up("going back"));
    }
}
