//! `nvme`: NVMe controllers from /sys/class/nvme/<device> (model, serial,
//! firmware, state and controller id as `node_nvme_info`) and their
//! namespaces `nvme<C>n<N>` (ANA state, size, used space and logical block
//! size, in bytes), exported as `node_nvme_*`. Without the class directory,
//! or with a controller attribute missing, the collector has no data.

use std::io;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// One namespace of a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// The namespace number from the directory name (`nvme0n1` is `1`).
    pub id: String,
    /// `ana_state`, `unknown` without the file.
    pub ana_state: String,
    pub used_blocks: u64,
    pub size_blocks: u64,
    pub logical_block_size: u64,
}

impl Namespace {
    pub fn used_bytes(&self) -> u64 {
        self.used_blocks.wrapping_mul(self.logical_block_size)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_blocks.wrapping_mul(self.logical_block_size)
    }
}

/// A block count or size as the kernel prints it; anything else counts as
/// 0, as node_exporter ignores those parse errors.
pub fn parse_count(text: &str) -> u64 {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
        return 0;
    }
    t.parse().unwrap_or(0)
}

/// The namespace number of a controller directory entry: the digits of
/// the leftmost `nvme<digits>n<digits>` in it (node_exporter's unanchored
/// `nvme\d+n(\d+)`, ASCII digits).
pub fn namespace_id(entry: &str) -> Option<&str> {
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let mut from = 0;
    while let Some(at) = entry[from..].find("nvme") {
        let start = from + at + 4;
        let rest = &entry[start..];
        let c = digits(rest);
        if c > 0 {
            if let Some(ns) = rest[c..].strip_prefix('n') {
                let n = digits(ns);
                if n > 0 {
                    return Some(&ns[..n]);
                }
            }
        }
        from = start;
    }
    None
}

pub struct Collector {
    dir: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("class/nvme"), buf: Vec::new() }
    }

    /// A sysfs attribute, trimmed.
    fn attr(&mut self, path: &Path) -> io::Result<String> {
        crate::io::read_into(path, &mut self.buf)?;
        Ok(String::from_utf8_lossy(&self.buf).trim().to_string())
    }

    fn namespace(&mut self, dir: &Path, id: &str) -> Result<Namespace, Error> {
        let mut read = |name: &str| {
            let path = dir.join(name);
            self.attr(&path).map(|t| parse_count(&t)).map_err(|e| Error::from_read(&path, e))
        };
        let used_blocks = read("nuse")?;
        let size_blocks = read("size")?;
        let logical_block_size = read("queue/logical_block_size")?;
        // Not every controller reports ANA (asymmetric access) state.
        let ana_state = self.attr(&dir.join("ana_state")).unwrap_or_else(|_| "unknown".to_string());
        Ok(Namespace { id: id.to_string(), ana_state, used_blocks, size_blocks, logical_block_size })
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let devices = crate::io::sorted_names(&self.dir)?;
        for device in &devices {
            let ddir = self.dir.join(device);
            let mut info = [String::new(), String::new(), String::new(), String::new(), String::new()];
            for (slot, file) in info.iter_mut().zip(["cntlid", "firmware_rev", "model", "serial", "state"]) {
                let path = ddir.join(file);
                *slot = self.attr(&path).map_err(|e| Error::from_read(&path, e))?;
            }
            let mut namespaces = Vec::new();
            for entry in crate::io::sorted_names(&ddir)? {
                let Some(id) = namespace_id(&entry) else { continue };
                let id = id.to_string();
                namespaces.push(self.namespace(&ddir.join(&entry), &id)?);
            }

            let [cntlid, firmware, model, serial, state] = &info;
            sink.family("node_nvme_info", "Non-numeric data from /sys/class/nvme/<device>, value is always 1.", Kind::Gauge).sample(
                &[
                    ("cntlid", cntlid),
                    ("device", device),
                    ("firmware_revision", firmware),
                    ("model", model),
                    ("serial", serial),
                    ("state", state),
                ],
                1.0,
            );
            for ns in &namespaces {
                let l: &[(&str, &str)] = &[("device", device), ("nsid", &ns.id)];
                sink.family("node_nvme_namespace_info", "Information about NVMe namespaces. Value is always 1", Kind::Gauge)
                    .sample(&[("ana_state", &ns.ana_state), ("device", device), ("nsid", &ns.id)], 1.0);
                sink.family(
                    "node_nvme_namespace_capacity_bytes",
                    "Capacity of the NVMe namespace in bytes. Computed as namespace_size * namespace_logical_block_size",
                    Kind::Gauge,
                )
                .sample(l, ns.size_bytes() as f64);
                sink.family(
                    "node_nvme_namespace_size_bytes",
                    "Size of the NVMe namespace in bytes. Available in /sys/class/nvme/<device>/<namespace>/size",
                    Kind::Gauge,
                )
                .sample(l, ns.size_bytes() as f64);
                sink.family(
                    "node_nvme_namespace_used_bytes",
                    "Used space of the NVMe namespace in bytes. Available in /sys/class/nvme/<device>/<namespace>/nuse",
                    Kind::Gauge,
                )
                .sample(l, ns.used_bytes() as f64);
                sink.family(
                    "node_nvme_namespace_logical_block_size_bytes",
                    "Logical block size of the NVMe namespace in bytes. Usually 4Kb. Available in /sys/class/nvme/<device>/<namespace>/queue/logical_block_size",
                    Kind::Gauge,
                )
                .sample(l, ns.logical_block_size as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{paths, write};
    use crate::Collector as _;

    #[test]
    fn namespace_directories() {
        assert_eq!(namespace_id("nvme0n1"), Some("1"));
        assert_eq!(namespace_id("nvme12n34"), Some("34"));
        assert_eq!(namespace_id("xnvme0n2p1"), Some("2"), "unanchored, as node_exporter's");
        assert_eq!(namespace_id("nvmenvme0n3"), Some("3"));
        assert_eq!(namespace_id("nvme0nvme1n2"), Some("2"), "the leftmost match");
        for no in ["ng0n1", "nvme0c0n1", "nvme0", "hwmon3", "model", "nvme٣n1"] {
            assert_eq!(namespace_id(no), None, "{no}");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("3906250000\n"), 3906250000);
        assert_eq!(parse_count("4096"), 4096);
        for bad in ["", "-1", "+1", "4k", "1 2", "18446744073709551616"] {
            assert_eq!(parse_count(bad), 0, "{bad:?}");
        }
        let ns = Namespace {
            id: "1".into(),
            ana_state: "optimized".into(),
            used_blocks: 488281250,
            size_blocks: 3906250000,
            logical_block_size: 4096,
        };
        assert_eq!(ns.size_bytes(), 16_000_000_000_000);
        assert_eq!(ns.used_bytes(), 2_000_000_000_000);
    }

    fn owned(v: Vec<(Vec<(&str, &str)>, f64)>) -> Vec<(Vec<(String, String)>, f64)> {
        v.into_iter().map(|(l, x)| (l.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), x)).collect()
    }

    #[test]
    fn reads_controllers_and_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut c = Collector::new(&paths(root));
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data());

        // From node_exporter's fixture sys/class/nvme/nvme0.
        let d = "sys/class/nvme/nvme0";
        for (f, v) in [
            ("model", "Samsung SSD 970 PRO 512GB  \n"),
            ("serial", "S680HF8N190894I\n"),
            ("firmware_rev", "1B2QEXP7\n"),
            ("state", "live\n"),
            ("cntlid", "1997\n"),
            ("nvme0n1/nuse", "488281250\n"),
            ("nvme0n1/size", "3906250000\n"),
            ("nvme0n1/queue/logical_block_size", "4096\n"),
            ("nvme0n1/ana_state", "optimized\n"),
            ("nvme0n2/nuse", "x\n"),
            ("nvme0n2/size", "10\n"),
            ("nvme0n2/queue/logical_block_size", "512\n"),
            ("hwmon3/name", "nvme\n"),
        ] {
            write(root, &format!("{d}/{f}"), v);
        }
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 6);
        let get = |n: &str| owned(fams.iter().find(|f| f.name() == n).unwrap().samples().collect());
        let s = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(
            get("node_nvme_info"),
            vec![(
                s(&[
                    ("cntlid", "1997"),
                    ("device", "nvme0"),
                    ("firmware_revision", "1B2QEXP7"),
                    ("model", "Samsung SSD 970 PRO 512GB"),
                    ("serial", "S680HF8N190894I"),
                    ("state", "live")
                ]),
                1.0
            )]
        );
        assert_eq!(
            get("node_nvme_namespace_info"),
            vec![
                (s(&[("ana_state", "optimized"), ("device", "nvme0"), ("nsid", "1")]), 1.0),
                (s(&[("ana_state", "unknown"), ("device", "nvme0"), ("nsid", "2")]), 1.0)
            ]
        );
        assert_eq!(
            get("node_nvme_namespace_used_bytes"),
            vec![(s(&[("device", "nvme0"), ("nsid", "1")]), 2e12), (s(&[("device", "nvme0"), ("nsid", "2")]), 0.0)]
        );
        assert_eq!(get("node_nvme_namespace_capacity_bytes")[0].1, 1.6e13);
        assert_eq!(get("node_nvme_namespace_logical_block_size_bytes")[1].1, 512.0);

        // A controller attribute or namespace size missing: no data.
        std::fs::remove_file(root.join(d).join("nvme0n2/size")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data());
        write(root, &format!("{d}/nvme0n2/size"), "10\n");
        std::fs::remove_file(root.join(d).join("serial")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data());
    }
}
