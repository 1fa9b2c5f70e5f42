//! `dmmultipath`: device-mapper multipath maps from /sys/block/dm-* (those
//! whose `dm/uuid` starts with `mpath-`): their name, UUID, suspended
//! state and size, and each path device listed in `slaves/` with its
//! state from /sys/block/<path>/device/state (`running` or `live` count
//! as active), exported as `node_dmmultipath_*`. Without /sys/block, or
//! when a file it needs is missing or unreadable, the collector has no data.

use std::io;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// Bytes per sector of /sys/block/<dev>/size.
const SECTOR: u64 = 512;

/// A path is usable: SCSI `running` or NVMe `live`.
pub fn is_active(state: &str) -> bool {
    state == "running" || state == "live"
}

/// A multipath map's UUID (`mpath-<wwid>`).
pub fn is_multipath(uuid: &str) -> bool {
    uuid.starts_with("mpath-")
}

/// An unsigned decimal integer file (`size`, `dm/suspended`), surrounding
/// whitespace allowed.
pub fn parse_uint(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
        return Err(format!("invalid number {t:?}"));
    }
    t.parse().map_err(|e| format!("invalid number {t:?}: {e}"))
}

/// node_exporter reports no data when a file it needs is missing or not
/// readable (its errors wrap `ErrNotExist`/`ErrPermission`); other I/O
/// errors fail the scrape.
fn read_error(path: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => Error::NoData(format!("{}: {e}", path.display())),
        _ => Error::io(path, e),
    }
}

/// The names in `dir`, sorted; `None` when it does not exist.
fn sorted_names(dir: &Path) -> Result<Option<Vec<String>>, Error> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_error(dir, e)),
    };
    let mut names = Vec::new();
    for e in rd {
        let e = e.map_err(|e| read_error(dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort_unstable();
    Ok(Some(names))
}

/// One multipath map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub sysfs_name: String,
    pub uuid: String,
    pub suspended: bool,
    pub size_bytes: u64,
    /// `(path device, state)`, in directory order.
    pub paths: Vec<(String, String)>,
}

pub struct Collector {
    block: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { block: p.sys("block"), buf: Vec::new() }
    }

    /// A sysfs attribute, trimmed.
    fn attr(&mut self, path: &Path) -> io::Result<String> {
        crate::io::read_into(path, &mut self.buf)?;
        Ok(String::from_utf8_lossy(&self.buf).trim().to_string())
    }

    fn required(&mut self, path: &Path) -> Result<String, Error> {
        self.attr(path).map_err(|e| read_error(path, e))
    }

    fn number(&mut self, path: &Path) -> Result<u64, Error> {
        let t = self.required(path)?;
        parse_uint(&t).map_err(|m| Error::parse(path, m))
    }

    /// The map `dm` (`dm-5`), or `None` when it is not a multipath map.
    fn device(&mut self, dm: &str) -> Result<Option<Device>, Error> {
        let dir = self.block.join(dm);
        let uuid_path = dir.join("dm/uuid");
        let uuid = match self.attr(&uuid_path) {
            Ok(u) => u,
            // Not a device-mapper device.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(read_error(&uuid_path, e)),
        };
        if !is_multipath(&uuid) {
            return Ok(None);
        }
        let name = self.required(&dir.join("dm/name"))?;
        let suspended = self.number(&dir.join("dm/suspended"))? == 1;
        let sectors = self.number(&dir.join("size"))?;
        let mut paths = Vec::new();
        for slave in sorted_names(&dir.join("slaves"))?.unwrap_or_default() {
            let state = self.required(&self.block.join(&slave).join("device/state"))?;
            paths.push((slave, state));
        }
        Ok(Some(Device { name, sysfs_name: dm.to_string(), uuid, suspended, size_bytes: sectors.wrapping_mul(SECTOR), paths }))
    }
}

fn write(sink: &mut Sink, d: &Device) {
    let g = Kind::Gauge;
    let l: &[(&str, &str)] = &[("device", &d.name), ("sysfs_name", &d.sysfs_name)];
    sink.family("node_dmmultipath_device_info", "Non-numeric information about a DM-multipath device.", g)
        .sample(&[("device", &d.name), ("sysfs_name", &d.sysfs_name), ("uuid", &d.uuid)], 1.0);
    sink.family("node_dmmultipath_device_active", "Whether the multipath device-mapper device is active (1) or suspended (0).", g)
        .sample(l, if d.suspended { 0.0 } else { 1.0 });
    sink.family("node_dmmultipath_device_size_bytes", "Size of the multipath device in bytes, read from /sys/block/<dm>/size.", g)
        .sample(l, d.size_bytes as f64);
    let mut active = 0u64;
    {
        let mut f = sink.family(
            "node_dmmultipath_path_state",
            "Reports the underlying device state for a multipath path, as read from /sys/block/<dev>/device/state.",
            g,
        );
        for (path, state) in &d.paths {
            active += u64::from(is_active(state));
            f.sample(&[("device", &d.name), ("path", path), ("state", state)], 1.0);
        }
    }
    let total = d.paths.len() as u64;
    sink.family("node_dmmultipath_device_paths", "Number of paths for a multipath device.", g).sample(l, total as f64);
    sink.family(
        "node_dmmultipath_device_paths_active",
        "Number of paths in active state (SCSI running or NVMe live) for a multipath device.",
        g,
    )
    .sample(l, active as f64);
    sink.family("node_dmmultipath_device_paths_failed", "Number of paths not in active state for a multipath device.", g)
        .sample(l, (total - active) as f64);
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let Some(entries) = sorted_names(&self.block)? else {
            return Err(Error::NoData(format!("{} does not exist", self.block.display())));
        };
        for dm in entries.iter().filter(|n| n.starts_with("dm-")) {
            if let Some(d) = self.device(dm)? {
                write(sink, &d);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::paths;
    use crate::Collector as _;

    #[test]
    fn states_and_uuids() {
        assert!(is_active("running") && is_active("live"));
        assert!(!is_active("offline") && !is_active("blocked") && !is_active("Running"));
        assert!(is_multipath("mpath-3600508b1001c1234567890abcdef1234"));
        assert!(!is_multipath("LVM-abcdef1234567890abcdef1234567890") && !is_multipath("mpath"));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_uint("104857600\n"), Ok(104857600));
        assert_eq!(parse_uint(" 0 "), Ok(0));
        for bad in ["", "-1", "+1", "1.0", "x", "18446744073709551616"] {
            assert!(parse_uint(bad).is_err(), "{bad:?}");
        }
    }

    fn write_file(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn get(sink: &Sink, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        let fams = sink.families();
        let f = fams.iter().find(|f| f.name() == name).unwrap_or_else(|| panic!("{name} missing"));
        f.samples().map(|(l, v)| (l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v)).collect()
    }

    fn s(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn reads_multipath_maps() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut c = Collector::new(&paths(root));
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data(), "no /sys/block");

        // From node_exporter's fixtures (sys/block/dm-5, dm-7, sdi..sdl).
        for (f, v) in [
            ("dm-5/size", "104857600\n"),
            ("dm-5/dm/name", "mpathA\n"),
            ("dm-5/dm/suspended", "0\n"),
            ("dm-5/dm/uuid", "mpath-3600508b1001c1234567890abcdef1234\n"),
            ("dm-7/size", "41943040\n"),
            ("dm-7/dm/name", "vg0-root\n"),
            ("dm-7/dm/suspended", "0\n"),
            ("dm-7/dm/uuid", "LVM-abcdef1234567890abcdef1234567890\n"),
            ("dm-9/size", "8\n"),
            ("sdi/device/state", "running\n"),
            ("sdj/device/state", "running\n"),
            ("sdk/device/state", "running\n"),
            ("sdl/device/state", "offline\n"),
        ] {
            write_file(root, &format!("sys/block/{f}"), v);
        }
        for p in ["sdi", "sdj", "sdk", "sdl"] {
            std::fs::create_dir_all(root.join("sys/block/dm-5/slaves").join(p)).unwrap();
        }
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert_eq!(sink.families().len(), 7);
        let l = s(&[("device", "mpathA"), ("sysfs_name", "dm-5")]);
        assert_eq!(
            get(&sink, "node_dmmultipath_device_info"),
            vec![(s(&[("device", "mpathA"), ("sysfs_name", "dm-5"), ("uuid", "mpath-3600508b1001c1234567890abcdef1234")]), 1.0)]
        );
        assert_eq!(get(&sink, "node_dmmultipath_device_active"), vec![(l.clone(), 1.0)]);
        assert_eq!(get(&sink, "node_dmmultipath_device_size_bytes"), vec![(l.clone(), 5.36870912e+10)]);
        assert_eq!(get(&sink, "node_dmmultipath_device_paths"), vec![(l.clone(), 4.0)]);
        assert_eq!(get(&sink, "node_dmmultipath_device_paths_active"), vec![(l.clone(), 3.0)]);
        assert_eq!(get(&sink, "node_dmmultipath_device_paths_failed"), vec![(l.clone(), 1.0)]);
        let states = get(&sink, "node_dmmultipath_path_state");
        assert_eq!(states.len(), 4);
        assert_eq!(states[3], (s(&[("device", "mpathA"), ("path", "sdl"), ("state", "offline")]), 1.0));

        // A map without slaves/ has no paths.
        std::fs::remove_dir_all(root.join("sys/block/dm-5/slaves")).unwrap();
        write_file(root, "sys/block/dm-5/dm/suspended", "1\n");
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert_eq!(get(&sink, "node_dmmultipath_device_paths"), vec![(l.clone(), 0.0)]);
        assert_eq!(get(&sink, "node_dmmultipath_device_active"), vec![(l.clone(), 0.0)]);

        // A malformed number fails the scrape; a missing dm/name is no data.
        write_file(root, "sys/block/dm-5/size", "big\n");
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
        write_file(root, "sys/block/dm-5/size", "8\n");
        std::fs::remove_file(root.join("sys/block/dm-5/dm/name")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data());
    }
}
