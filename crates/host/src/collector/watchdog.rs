//! `watchdog`: watchdog devices from /sys/class/watchdog. Per device its
//! numeric attributes (bootstatus, fw_version, nowayout, timeleft, timeout,
//! pretimeout, access_cs0) become gauges when present, and its text
//! attributes (options, identity, state, status, pretimeout_governor, empty
//! when absent) the labels of `node_watchdog_info`, as node_exporter does.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

type Family = (&'static str, &'static str);

/// The attribute files, in procfs's order, with their family (`None` for
/// the text attributes of the info family).
const ATTRIBUTES: [(&str, Option<Family>); 12] = [
    ("bootstatus", Some(("node_watchdog_bootstatus", "Value of /sys/class/watchdog/<watchdog>/bootstatus"))),
    ("options", None),
    ("fw_version", Some(("node_watchdog_fw_version", "Value of /sys/class/watchdog/<watchdog>/fw_version"))),
    ("identity", None),
    ("nowayout", Some(("node_watchdog_nowayout", "Value of /sys/class/watchdog/<watchdog>/nowayout"))),
    ("state", None),
    ("status", None),
    ("timeleft", Some(("node_watchdog_timeleft_seconds", "Value of /sys/class/watchdog/<watchdog>/timeleft"))),
    ("timeout", Some(("node_watchdog_timeout_seconds", "Value of /sys/class/watchdog/<watchdog>/timeout"))),
    ("pretimeout", Some(("node_watchdog_pretimeout_seconds", "Value of /sys/class/watchdog/<watchdog>/pretimeout"))),
    ("pretimeout_governor", None),
    ("access_cs0", Some(("node_watchdog_access_cs0", "Value of /sys/class/watchdog/<watchdog>/access_cs0"))),
];

/// One watchdog device.
#[derive(Debug, Default, PartialEq)]
pub struct Watchdog {
    /// (family, help, value) of the numeric attributes present.
    pub gauges: Vec<(&'static str, &'static str, f64)>,
    pub options: String,
    pub identity: String,
    pub state: String,
    pub status: String,
    pub pretimeout_governor: String,
}

impl Watchdog {
    /// Adds attribute `file`, read as `value` (trimmed); a number that does
    /// not parse is an error, as in node_exporter.
    pub fn add(&mut self, file: &str, value: &str) -> Result<(), String> {
        let Some((_, family)) = ATTRIBUTES.iter().find(|(f, _)| *f == file) else { return Ok(()) };
        if let Some((name, help)) = family {
            let v = crate::parse::parse_go_int(value).ok_or_else(|| format!("{file}: invalid integer {value:?}"))?;
            self.gauges.push((name, help, v as f64));
            return Ok(());
        }
        let slot = match file {
            "options" => &mut self.options,
            "identity" => &mut self.identity,
            "state" => &mut self.state,
            "status" => &mut self.status,
            _ => &mut self.pretimeout_governor,
        };
        *slot = value.to_string();
        Ok(())
    }
}

pub struct Collector {
    dir: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("class/watchdog") }
    }
}

/// node_exporter reports no data when the class, or a file of it, is absent
/// or unreadable; other failures are errors.
fn failure(path: &Path, e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => Error::NoData(format!("{}: {e}", path.display())),
        _ => Error::io(path, e),
    }
}

/// One read of at most 128 bytes, trimmed, as procfs's SysReadFile; `None`
/// when the file does not exist.
fn read_attr(path: &Path) -> Result<Option<String>, Error> {
    match crate::io::sys_read_file(path).map_err(crate::io::SysReadError::into_io) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_string())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(failure(path, e)),
    }
}

fn read_watchdog(dir: &Path) -> Result<Watchdog, Error> {
    let mut wd = Watchdog::default();
    for (file, _) in ATTRIBUTES {
        let path = dir.join(file);
        if let Some(v) = read_attr(&path)? {
            wd.add(file, &v).map_err(|m| Error::parse(&path, m))?;
        }
    }
    Ok(wd)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| failure(&self.dir, e))?;
        let mut names: Vec<String> = rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        let mut devices = Vec::with_capacity(names.len());
        for name in names {
            let wd = read_watchdog(&self.dir.join(&name))?;
            devices.push((name, wd));
        }
        for (name, wd) in &devices {
            for &(family, help, v) in &wd.gauges {
                sink.family(family, help, Kind::Gauge).sample(&[("name", name)], v);
            }
            sink.family("node_watchdog_info", "Info of /sys/class/watchdog/<watchdog>", Kind::Gauge).sample(
                &[
                    ("identity", &wd.identity),
                    ("name", name),
                    ("options", &wd.options),
                    ("pretimeout_governor", &wd.pretimeout_governor),
                    ("state", &wd.state),
                    ("status", &wd.status),
                ],
                1.0,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::Row;

    #[test]
    fn attributes() {
        let mut wd = Watchdog::default();
        for (f, v) in [("bootstatus", "1"), ("options", "0x8380"), ("timeout", "60"), ("status", "0x8000"), ("unknown", "x")] {
            wd.add(f, v).unwrap();
        }
        assert_eq!(
            wd.gauges,
            vec![
                ("node_watchdog_bootstatus", "Value of /sys/class/watchdog/<watchdog>/bootstatus", 1.0),
                ("node_watchdog_timeout_seconds", "Value of /sys/class/watchdog/<watchdog>/timeout", 60.0),
            ]
        );
        assert_eq!((wd.options.as_str(), wd.status.as_str(), wd.state.as_str()), ("0x8380", "0x8000", ""));
        assert!(Watchdog::default().add("timeleft", "soon").is_err());
    }

    fn scrape(root: &Path) -> Result<Vec<Row>, Error> {
        let p = Paths { procfs: root.into(), sysfs: root.into(), rootfs: root.into(), udev_data: root.into() };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink)?;
        Ok(crate::testutil::rows(&sink))
    }

    #[test]
    fn scrapes_devices() {
        let dir = tempfile::tempdir().unwrap();
        let wd0 = dir.path().join("class/watchdog/watchdog0");
        std::fs::create_dir_all(&wd0).unwrap();
        std::fs::create_dir_all(dir.path().join("class/watchdog/watchdog1")).unwrap();
        for (f, v) in [("identity", "Software Watchdog\n"), ("state", "active\n"), ("timeleft", "300\n"), ("pretimeout", "120\n")] {
            std::fs::write(wd0.join(f), v).unwrap();
        }
        let got = scrape(dir.path()).unwrap();
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        let info: Vec<_> = got.iter().filter(|g| g.0 == "node_watchdog_info").map(|g| g.1.clone()).collect();
        assert_eq!(
            info,
            vec![
                vec![
                    s("identity", "Software Watchdog"),
                    s("name", "watchdog0"),
                    s("options", ""),
                    s("pretimeout_governor", ""),
                    s("state", "active"),
                    s("status", "")
                ],
                vec![
                    s("identity", ""),
                    s("name", "watchdog1"),
                    s("options", ""),
                    s("pretimeout_governor", ""),
                    s("state", ""),
                    s("status", "")
                ],
            ]
        );
        assert!(got.contains(&("node_watchdog_timeleft_seconds".into(), vec![s("name", "watchdog0")], 300.0)));
        assert_eq!(got.len(), 4);

        std::fs::write(wd0.join("timeout"), "0x\n").unwrap();
        assert!(matches!(scrape(dir.path()), Err(Error::Parse { .. })));
    }

    #[test]
    fn no_class_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap_err().is_no_data());
        // A device that is not a directory is an error (ENOTDIR), as in node_exporter.
        std::fs::create_dir_all(dir.path().join("class/watchdog")).unwrap();
        std::fs::write(dir.path().join("class/watchdog/watchdog0"), "x").unwrap();
        assert!(matches!(scrape(dir.path()), Err(Error::Io { .. })));
    }
}
