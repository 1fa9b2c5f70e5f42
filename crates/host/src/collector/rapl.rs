//! `rapl`: Intel/AMD RAPL energy counters from /sys/class/powercap. Each
//! zone directory with a `name` file is a zone; its `energy_uj` counter is
//! exported in joules as `node_rapl_<name>_joules_total{index, path}`, the
//! index taken from a `-N` suffix of the name or counted over zones of the
//! same name, or, with `--collector.rapl.enable-zone-label`, as
//! `node_rapl_joules_total{index, path, rapl_zone}`, as node_exporter does.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use clap::Arg;

use crate::flags::{BoolFlag, Flags};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// node_exporter's help text, copied from another collector, as it is.
pub const ZONE_LABEL: BoolFlag =
    BoolFlag { name: "collector.rapl.enable-zone-label", default: false, help: "Enables service unit metric unit_start_time_seconds" };

/// The collector's flags, parsed once.
pub struct Options {
    pub zone_label: bool,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        ZONE_LABEL.args().into()
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { zone_label: ZONE_LABEL.get(f) })
    }
}

/// A zone's index and name from its `name` file: `package-0` is index 0 of
/// `package`; a name without a numeric suffix (`core`, `dram`) takes the
/// number of zones of that name seen before it. `seen` counts the uses.
pub fn index_and_name(seen: &mut HashMap<String, i64>, raw: &str) -> (i64, String) {
    let parts: Vec<&str> = raw.split('-').collect();
    let (index, name) = match parts.as_slice() {
        [name, index] => match index.parse::<i64>() {
            Ok(i) => (i, name.to_string()),
            Err(_) => (seen.get(raw).copied().unwrap_or(0), raw.to_string()),
        },
        _ => (seen.get(raw).copied().unwrap_or(0), raw.to_string()),
    };
    seen.insert(name.clone(), index.wrapping_add(1));
    (index, name)
}

/// node_exporter's SanitizeMetricName: every run of characters outside
/// `[0-9A-Za-z_]`, with the underscores around it, becomes one `_`.
pub fn sanitize(name: &str) -> String {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        let run_end = chars[i..].iter().position(|&c| c != '_').map_or(chars.len(), |n| i + n);
        if run_end < chars.len() && !valid(chars[run_end]) {
            // Leading underscores, the invalid run, trailing underscores.
            let mut j = run_end;
            while j < chars.len() && !valid(chars[j]) {
                j += 1;
            }
            while j < chars.len() && chars[j] == '_' {
                j += 1;
            }
            out.push('_');
            i = j;
        } else if run_end > i {
            out.extend(&chars[i..run_end]);
            i = run_end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Go's `filepath.Clean`, lexically: no `.`, no `x/..`, no repeated or
/// trailing separators (the `path` label is printed as Go prints it).
pub fn clean(path: &Path) -> String {
    let rooted = path.has_root();
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => {
                if parts.last().is_some_and(|p| p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..".into());
                }
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// A decimal counter file (Go's `ParseUint(TrimSpace(s), 10, 64)`).
pub fn parse_uint(text: &str) -> Option<u64> {
    crate::parse::parse_u64(text.trim().as_bytes())
}

struct Zone {
    name: String,
    index: String,
    path: String,
    energy: PathBuf,
}

pub struct Collector {
    dir: PathBuf,
    zone_label: bool,
    buf: Vec<u8>,
}

/// Reads a small sysfs file as text (kept open between scrapes).
fn read_lossy(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<String> {
    crate::io::read_into(path, buf)?;
    Ok(String::from_utf8_lossy(buf).into_owned())
}

/// Absent or unreadable powercap files mean no data, as in node_exporter.
fn no_data_if_absent(path: &Path, e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => Error::NoData(format!("{}: {e}", path.display())),
        _ => Error::io(path, e),
    }
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("class/powercap"), zone_label: o.zone_label, buf: Vec::with_capacity(256) })
    }

    /// The zones, in directory order, as procfs's GetRaplZones.
    fn zones(&mut self) -> Result<Vec<Zone>, Error> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| no_data_if_absent(&self.dir, e))?;
        let mut entries: Vec<std::ffi::OsString> = rd.flatten().map(|e| e.file_name()).collect();
        entries.sort();
        let mut seen = HashMap::new();
        let mut zones = Vec::new();
        for entry in entries {
            let dir = self.dir.join(&entry);
            // Not a zone (no readable name): skipped.
            let Ok(raw) = read_lossy(&dir.join("name"), &mut self.buf) else { continue };
            let (index, name) = index_and_name(&mut seen, raw.trim());
            let max = dir.join("max_energy_range_uj");
            let text = read_lossy(&max, &mut self.buf).map_err(|e| no_data_if_absent(&max, e))?;
            parse_uint(&text).ok_or_else(|| Error::parse(&max, format!("invalid number {:?}", text.trim())))?;
            zones.push(Zone { name, index: index.to_string(), path: clean(&dir), energy: dir.join("energy_uj") });
        }
        Ok(zones)
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for z in self.zones()? {
            let text = read_lossy(&z.energy, &mut self.buf).map_err(|e| {
                if e.kind() == ErrorKind::PermissionDenied {
                    Error::NoData(format!("{}: {e}", z.energy.display()))
                } else {
                    Error::io(&z.energy, e)
                }
            })?;
            let uj = parse_uint(&text).ok_or_else(|| Error::parse(&z.energy, format!("invalid number {:?}", text.trim())))?;
            let joules = uj as f64 / 1_000_000.0;
            if self.zone_label {
                sink.family("node_rapl_joules_total", "Current RAPL value in joules", Kind::Counter)
                    .sample(&[("index", &z.index), ("path", &z.path), ("rapl_zone", &z.name)], joules);
            } else {
                let family = format!("node_rapl_{}_joules_total", sanitize(&z.name));
                let help = format!("Current RAPL {} value in joules", z.name);
                sink.family(&family, &help, Kind::Counter).sample(&[("index", &z.index), ("path", &z.path)], joules);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::Row;

    #[test]
    fn indices_and_names() {
        let mut seen = HashMap::new();
        assert_eq!(index_and_name(&mut seen, "package-0"), (0, "package".into()));
        assert_eq!(index_and_name(&mut seen, "core"), (0, "core".into()));
        assert_eq!(index_and_name(&mut seen, "dram"), (0, "dram".into()));
        assert_eq!(index_and_name(&mut seen, "dram"), (1, "dram".into()));
        assert_eq!(index_and_name(&mut seen, "package-1"), (1, "package".into()));
        assert_eq!(index_and_name(&mut seen, "psys-x"), (0, "psys-x".into()));
        assert_eq!(index_and_name(&mut seen, "a-b-2"), (0, "a-b-2".into()));
        assert_eq!(index_and_name(&mut seen, "a-+3"), (3, "a".into()));
    }

    #[test]
    fn sanitizes_names() {
        assert_eq!(sanitize("package"), "package");
        assert_eq!(sanitize("psys-x"), "psys_x");
        assert_eq!(sanitize("a__-._b"), "a_b");
        assert_eq!(sanitize("__a__"), "__a__");
        assert_eq!(sanitize("-x"), "_x");
        assert_eq!(sanitize("x-"), "x_");
        assert_eq!(sanitize("é1"), "_1");
        assert_eq!(sanitize(""), "");
    }

    #[test]
    fn cleans_paths_as_go() {
        assert_eq!(clean(Path::new("/sys/class/powercap/intel-rapl:0")), "/sys/class/powercap/intel-rapl:0");
        assert_eq!(clean(Path::new("./sys//class/./powercap/x")), "sys/class/powercap/x");
        assert_eq!(clean(Path::new("/host/../sys/")), "/sys");
        assert_eq!(clean(Path::new("../sys")), "../sys");
        assert_eq!(clean(Path::new("/..")), "/");
    }

    #[test]
    fn counters() {
        assert_eq!(parse_uint("240422366267\n"), Some(240422366267));
        assert_eq!(parse_uint("-1"), None);
        assert_eq!(parse_uint(""), None);
    }

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (f, v) in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
    }

    fn scrape(root: &Path, zone_label: bool) -> Result<Vec<Row>, Error> {
        let p = Paths { procfs: root.into(), sysfs: root.into(), rootfs: root.into(), udev_data: root.into() };
        let mut c = Collector::new(Options { zone_label }, &p).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn scrapes_zones() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            &[
                ("class/powercap/intel-rapl/enabled", "1\n"),
                ("class/powercap/intel-rapl:0/name", "package-0\n"),
                ("class/powercap/intel-rapl:0/energy_uj", "240422366267\n"),
                ("class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850\n"),
                ("class/powercap/intel-rapl:0:0/name", "core\n"),
                ("class/powercap/intel-rapl:0:0/energy_uj", "118821284256\n"),
                ("class/powercap/intel-rapl:0:0/max_energy_range_uj", "262143328850\n"),
            ],
        );
        let base = clean(&root.join("class/powercap"));
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            scrape(root, false).unwrap(),
            vec![
                ("node_rapl_package_joules_total".into(), vec![s("index", "0"), s("path", &format!("{base}/intel-rapl:0"))], 240422.366267),
                ("node_rapl_core_joules_total".into(), vec![s("index", "0"), s("path", &format!("{base}/intel-rapl:0:0"))], 118821.284256),
            ]
        );
        let with_zone = scrape(root, true).unwrap();
        assert_eq!(with_zone.len(), 2);
        assert_eq!(with_zone[1].0, "node_rapl_joules_total");
        assert_eq!(with_zone[1].1[2], s("rapl_zone", "core"));

        write(root, &[("class/powercap/intel-rapl:0:0/energy_uj", "lots\n")]);
        assert!(matches!(scrape(root, false), Err(Error::Parse { .. })));
        std::fs::remove_file(root.join("class/powercap/intel-rapl:0:0/energy_uj")).unwrap();
        let e = scrape(root, false).unwrap_err();
        assert!(!e.is_no_data(), "a zone without its counter is an error: {e}");
        std::fs::remove_file(root.join("class/powercap/intel-rapl:0:0/max_energy_range_uj")).unwrap();
        assert!(scrape(root, false).unwrap_err().is_no_data());
    }

    #[test]
    fn no_powercap_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path(), false).unwrap_err().is_no_data());
    }
}
