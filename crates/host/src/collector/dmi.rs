//! `dmi`: the firmware's Desktop Management Interface identity from
//! /sys/class/dmi/id (BIOS, board, chassis, product and vendor strings),
//! exported as the labels of `node_dmi_info`. As node_exporter, it reads the
//! files once (they don't change until a reboot), skips those only root may
//! read (product_serial, product_uuid, ...), and reports no data on a host
//! without DMI.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

const HELP: &str = "A metric with a constant '1' value labeled by bios_date, bios_release, bios_vendor, bios_version, \
board_asset_tag, board_name, board_serial, board_vendor, board_version, chassis_asset_tag, chassis_serial, \
chassis_vendor, chassis_version, product_family, product_name, product_serial, product_sku, product_uuid, \
product_version, system_vendor if provided by DMI.";

/// The label a DMI file is exported as (chassis_type is read, not exported).
pub fn label_of(file: &str) -> Option<&'static str> {
    Some(match file {
        "bios_date" => "bios_date",
        "bios_release" => "bios_release",
        "bios_vendor" => "bios_vendor",
        "bios_version" => "bios_version",
        "board_asset_tag" => "board_asset_tag",
        "board_name" => "board_name",
        "board_serial" => "board_serial",
        "board_vendor" => "board_vendor",
        "board_version" => "board_version",
        "chassis_asset_tag" => "chassis_asset_tag",
        "chassis_serial" => "chassis_serial",
        "chassis_vendor" => "chassis_vendor",
        "chassis_version" => "chassis_version",
        "product_family" => "product_family",
        "product_name" => "product_name",
        "product_serial" => "product_serial",
        "product_sku" => "product_sku",
        "product_uuid" => "product_uuid",
        "product_version" => "product_version",
        "sys_vendor" => "system_vendor",
        _ => return None,
    })
}

/// Why the DMI files could not be read.
enum ReadError {
    /// Something is absent: node_exporter then treats the host as having no DMI.
    Absent,
    Failed(Error),
}

/// One read of at most 128 bytes, trimmed, as procfs's SysReadFile; `None`
/// when only root may read the file.
fn read_attr(path: &Path) -> Result<Option<String>, ReadError> {
    let fail = |e: std::io::Error| match e.kind() {
        ErrorKind::PermissionDenied => Ok(None),
        ErrorKind::NotFound => Err(ReadError::Absent),
        _ => Err(ReadError::Failed(Error::io(path, e))),
    };
    match crate::io::sys_read_file(path) {
        Ok(b) => Ok(Some(crate::parse::to_valid_utf8(&b).trim().to_string())),
        Err(e) => fail(e.into_io()),
    }
}

/// The DMI labels of `dir`, sorted by name.
fn read_dmi(dir: &Path) -> Result<BTreeMap<&'static str, String>, ReadError> {
    let rd = std::fs::read_dir(dir).map_err(|e| match e.kind() {
        ErrorKind::NotFound => ReadError::Absent,
        _ => ReadError::Failed(Error::io(dir, e)),
    })?;
    let mut files: Vec<String> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "modalias" && n != "uevent")
        .collect();
    files.sort();
    let mut labels = BTreeMap::new();
    for name in files {
        // Every regular file is read (a failure fails the collector), as in
        // node_exporter, even those it does not export.
        let Some(value) = read_attr(&dir.join(&name))? else { continue };
        if let Some(label) = label_of(&name) {
            labels.insert(label, value);
        }
    }
    Ok(labels)
}

pub struct Collector {
    dir: PathBuf,
    /// The labels, once read; `None` until a read succeeds.
    labels: Option<BTreeMap<&'static str, String>>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        let mut c = Collector { dir: p.sys("class/dmi/id"), labels: None };
        // node_exporter reads DMI once, when it starts, and refuses to start
        // when that fails; here a failure is reported by each scrape instead,
        // and the read retried, until it succeeds.
        if let Err(e) = c.load() {
            tracing::warn!("dmi: {e}");
        }
        c
    }

    fn load(&mut self) -> Result<&BTreeMap<&'static str, String>, Error> {
        if self.labels.is_none() {
            self.labels = Some(match read_dmi(&self.dir) {
                Ok(l) => l,
                Err(ReadError::Absent) => BTreeMap::new(),
                Err(ReadError::Failed(e)) => return Err(e),
            });
        }
        Ok(self.labels.get_or_insert_with(BTreeMap::new))
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let labels = self.load()?;
        if labels.is_empty() {
            return Err(Error::NoData("no DMI information".into()));
        }
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        sink.new_family("node_dmi_info", HELP, Kind::Gauge).sample(&l, 1.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector(root: &Path) -> Collector {
        let p = Paths { procfs: root.into(), sysfs: root.into(), rootfs: root.into(), udev_data: root.into() };
        Collector::new(&p)
    }

    #[test]
    fn reads_the_labels() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("class/dmi/id");
        std::fs::create_dir_all(id.join("power")).unwrap();
        for (f, v) in [
            ("bios_date", &b"04/12/2021\n"[..]),
            ("sys_vendor", b"Dell Inc.\n"),
            ("chassis_asset_tag", b"\n"),
            ("chassis_type", b"23\n"),
            ("product_version", b"\xef\xbf\xbd\x1c[\xff\xfe\n"),
            ("modalias", b"dmi:bvnDellInc.\n"),
        ] {
            std::fs::write(id.join(f), v).unwrap();
        }
        std::os::unix::fs::symlink("../../../class", id.join("subsystem")).unwrap();
        let mut c = collector(dir.path());
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        let got: Vec<_> = fams[0].samples().collect();
        assert_eq!(
            got,
            vec![(
                vec![
                    ("bios_date", "04/12/2021"),
                    ("chassis_asset_tag", ""),
                    ("product_version", "\u{FFFD}\u{1c}[\u{FFFD}"),
                    ("system_vendor", "Dell Inc."),
                ],
                1.0
            )]
        );
    }

    #[test]
    fn no_dmi_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        let e = crate::Collector::update(&mut collector(dir.path()), &mut Sink::new()).unwrap_err();
        assert!(e.is_no_data(), "{e}");
    }

    #[test]
    fn a_failed_read_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let id = dir.path().join("class/dmi/id");
        std::fs::create_dir_all(dir.path().join("class/dmi")).unwrap();
        // A file where the directory should be: ENOTDIR, an error (not absence).
        std::fs::write(&id, "x").unwrap();
        let mut c = collector(dir.path());
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data(), "{e}");
        std::fs::remove_file(&id).unwrap();
        std::fs::create_dir_all(&id).unwrap();
        std::fs::write(id.join("board_name"), "07PXPY\n").unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        assert_eq!(sink.families()[0].samples().next().unwrap().0, vec![("board_name", "07PXPY")]);
    }

    #[test]
    fn utf8() {
        assert_eq!(label_of("sys_vendor"), Some("system_vendor"));
        assert_eq!(label_of("chassis_type"), None);
    }
}
