//! `powersupplyclass`: batteries and mains adapters from
//! /sys/class/power_supply. Every regular attribute file of each supply is
//! read (as node_exporter's procfs does, one 128-byte read); the numeric ones
//! become `node_power_supply_<attribute>` gauges (µA, µV, µW, µWh, µAh scaled
//! to units, tenths of a degree to degrees) and the text ones the labels of
//! `node_power_supply_info`. Supplies matching
//! `--collector.powersupply.ignored-supplies` are left out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Arg;
use regex::Regex;

use crate::flags::{Flags, StringFlag};
use crate::io::SysReadError;
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const IGNORED_SUPPLIES: StringFlag = StringFlag {
    name: "collector.powersupply.ignored-supplies",
    default: "^$",
    help: "Regexp of power supplies to ignore for powersupplyclass collector.",
};

/// How an attribute file is used.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Use {
    /// A number exported as `name` (already prefixed), with its help, divided by the scale.
    Gauge(&'static str, &'static str, f64),
    /// A number node_exporter parses (so a bad value fails the scrape) but does not export.
    Parsed,
    /// A label of the info family, under the file's name.
    Info,
}

macro_rules! gauge {
    ($file:literal, $metric:literal, $scale:expr) => {
        (
            $file,
            Use::Gauge(
                concat!("node_power_supply_", $metric),
                concat!($metric, " value of /sys/class/power_supply/<power_supply>."),
                $scale,
            ),
        )
    };
}

/// Every attribute node_exporter's procfs knows, and how it is used.
const ATTRIBUTES: &[(&str, Use)] = &[
    gauge!("authentic", "authentic", 1.0),
    gauge!("calibrate", "calibrate", 1.0),
    gauge!("capacity", "capacity", 1.0),
    gauge!("capacity_alert_max", "capacity_alert_max", 1.0),
    gauge!("capacity_alert_min", "capacity_alert_min", 1.0),
    gauge!("cycle_count", "cyclecount", 1.0),
    gauge!("online", "online", 1.0),
    gauge!("present", "present", 1.0),
    gauge!("time_to_empty_now", "time_to_empty_seconds", 1.0),
    gauge!("time_to_full_now", "time_to_full_seconds", 1.0),
    gauge!("current_boot", "current_boot", 1e6),
    gauge!("current_max", "current_max", 1e6),
    gauge!("current_now", "current_ampere", 1e6),
    gauge!("energy_empty", "energy_empty", 1e6),
    gauge!("energy_empty_design", "energy_empty_design", 1e6),
    gauge!("energy_full", "energy_full", 1e6),
    gauge!("energy_full_design", "energy_full_design", 1e6),
    gauge!("energy_now", "energy_watthour", 1e6),
    gauge!("voltage_boot", "voltage_boot", 1e6),
    gauge!("voltage_max", "voltage_max", 1e6),
    gauge!("voltage_max_design", "voltage_max_design", 1e6),
    gauge!("voltage_min", "voltage_min", 1e6),
    gauge!("voltage_min_design", "voltage_min_design", 1e6),
    gauge!("voltage_now", "voltage_volt", 1e6),
    gauge!("voltage_ocv", "voltage_ocv", 1e6),
    gauge!("charge_control_limit", "charge_control_limit", 1e6),
    gauge!("charge_control_limit_max", "charge_control_limit_max", 1e6),
    gauge!("charge_counter", "charge_counter", 1e6),
    gauge!("charge_empty", "charge_empty", 1e6),
    gauge!("charge_empty_design", "charge_empty_design", 1e6),
    gauge!("charge_full", "charge_full", 1e6),
    gauge!("charge_full_design", "charge_full_design", 1e6),
    gauge!("charge_now", "charge_ampere", 1e6),
    gauge!("charge_term_current", "charge_term_current", 1e6),
    gauge!("constant_charge_current", "constant_charge_current", 1e6),
    gauge!("constant_charge_current_max", "constant_charge_current_max", 1e6),
    gauge!("constant_charge_voltage", "constant_charge_voltage", 1e6),
    gauge!("constant_charge_voltage_max", "constant_charge_voltage_max", 1e6),
    gauge!("precharge_current", "precharge_current", 1e6),
    gauge!("input_current_limit", "input_current_limit", 1e6),
    gauge!("power_now", "power_watt", 1e6),
    gauge!("temp", "temp_celsius", 10.0),
    gauge!("temp_alert_max", "temp_alert_max_celsius", 10.0),
    gauge!("temp_alert_min", "temp_alert_min_celsius", 10.0),
    gauge!("temp_ambient", "temp_ambient_celsius", 10.0),
    gauge!("temp_ambient_max", "temp_ambient_max_celsius", 10.0),
    gauge!("temp_ambient_min", "temp_ambient_min_celsius", 10.0),
    gauge!("temp_max", "temp_max_celsius", 10.0),
    gauge!("temp_min", "temp_min_celsius", 10.0),
    ("charge_avg", Use::Parsed),
    ("current_avg", Use::Parsed),
    ("energy_avg", Use::Parsed),
    ("power_avg", Use::Parsed),
    ("time_to_empty_avg", Use::Parsed),
    ("time_to_full_avg", Use::Parsed),
    ("voltage_avg", Use::Parsed),
    ("capacity_level", Use::Info),
    ("charge_type", Use::Info),
    ("health", Use::Info),
    ("manufacturer", Use::Info),
    ("model_name", Use::Info),
    ("scope", Use::Info),
    ("serial_number", Use::Info),
    ("status", Use::Info),
    ("technology", Use::Info),
    ("type", Use::Info),
    ("usb_type", Use::Info),
];

/// One power supply: its exported numbers and its info labels.
#[derive(Debug, Default, PartialEq)]
pub struct Supply {
    /// (family, help, value), in attribute-file order.
    pub gauges: Vec<(&'static str, &'static str, f64)>,
    /// Non-empty text attributes by label name (without `power_supply`).
    pub info: BTreeMap<&'static str, String>,
}

impl Supply {
    /// Adds attribute `file`, read as `value` (trimmed). A number that does not
    /// parse is an error, as in node_exporter; unknown files are ignored.
    pub fn add(&mut self, file: &str, value: &str) -> Result<(), String> {
        let Some((name, u)) = ATTRIBUTES.iter().find(|(f, _)| *f == file) else { return Ok(()) };
        match *u {
            Use::Gauge(family, help, scale) => {
                let v = crate::parse::parse_go_int(value).ok_or_else(|| format!("{file}: invalid integer {value:?}"))?;
                self.gauges.push((family, help, v as f64 / scale));
            }
            Use::Parsed => {
                crate::parse::parse_go_int(value).ok_or_else(|| format!("{file}: invalid integer {value:?}"))?;
            }
            Use::Info => {
                if !value.is_empty() {
                    self.info.insert(name, value.to_string());
                }
            }
        }
        Ok(())
    }
}

/// The collector's flags, parsed once.
pub struct Options {
    pub ignored: Regex,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        vec![IGNORED_SUPPLIES.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        // An empty pattern matches (ignores) every supply, as in Go.
        Ok(Options { ignored: IGNORED_SUPPLIES.pattern(f)? })
    }
}

pub struct Collector {
    dir: PathBuf,
    ignored: Regex,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("class/power_supply"), ignored: o.ignored })
    }
}

/// One read of at most 128 bytes, trimmed, as procfs's SysReadFile. `None`
/// for the failures procfs skips: a missing file, or a read refused with
/// EOPNOTSUPP or ENODEV.
fn read_attr(path: &Path) -> Result<Option<String>, Error> {
    match crate::io::sys_read_file(path) {
        Ok(b) => Ok(Some(crate::parse::to_valid_utf8(&b).trim().to_string())),
        Err(SysReadError::Open(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(SysReadError::Read(e)) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV)) => Ok(None),
        Err(e) => Err(Error::io(path, e.into_io())),
    }
}

fn read_supply(dir: &Path) -> Result<Supply, Error> {
    let mut files: Vec<(String, bool)> = std::fs::read_dir(dir)
        .map_err(|e| Error::from_read(dir, e))?
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?.is_file())))
        .collect();
    files.sort();
    let mut s = Supply::default();
    for (name, regular) in files {
        // Every regular file is read, known or not: a read failure fails
        // the scrape, as in node_exporter.
        if !regular {
            continue;
        }
        let path = dir.join(&name);
        let Some(value) = read_attr(&path)? else { continue };
        s.add(&name, &value).map_err(|m| Error::parse(&path, m))?;
    }
    Ok(s)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        use std::os::unix::ffi::OsStrExt;
        let mut names: Vec<std::ffi::OsString> =
            std::fs::read_dir(&self.dir).map_err(|e| Error::from_read(&self.dir, e))?.flatten().map(|e| e.file_name()).collect();
        names.sort();
        // node_exporter reads every supply before it drops the ignored ones,
        // so a bad file of an ignored supply still fails the scrape.
        let mut supplies = Vec::with_capacity(names.len());
        for n in &names {
            let supply = read_supply(&self.dir.join(n))?;
            let name = crate::parse::to_valid_utf8(n.as_bytes());
            if !self.ignored.is_match(&name) {
                supplies.push((name, supply));
            }
        }
        let mut labels: Vec<(&str, &str)> = Vec::new();
        for (name, s) in &supplies {
            for &(family, help, v) in &s.gauges {
                sink.family(family, help, Kind::Gauge).sample(&[("power_supply", name)], v);
            }
            labels.clear();
            labels.extend(s.info.iter().map(|(k, v)| (*k, v.as_str())));
            labels.push(("power_supply", name));
            labels.sort_unstable_by_key(|l| l.0);
            sink.family("node_power_supply_info", "info of /sys/class/power_supply/<power_supply>.", Kind::Gauge).sample(&labels, 1.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_scale_and_label() {
        let mut s = Supply::default();
        for (f, v) in [
            ("capacity", "81"),
            ("cycle_count", "0"),
            ("energy_now", "36580000"),
            ("power_now", "5002000"),
            ("temp", "-15"),
            ("voltage_avg", "12"),
            ("status", "Discharging"),
            ("health", ""),
            ("alarm", "not a number, not known"),
        ] {
            s.add(f, v).unwrap();
        }
        assert_eq!(
            s.gauges,
            vec![
                ("node_power_supply_capacity", "capacity value of /sys/class/power_supply/<power_supply>.", 81.0),
                ("node_power_supply_cyclecount", "cyclecount value of /sys/class/power_supply/<power_supply>.", 0.0),
                ("node_power_supply_energy_watthour", "energy_watthour value of /sys/class/power_supply/<power_supply>.", 36.58),
                ("node_power_supply_power_watt", "power_watt value of /sys/class/power_supply/<power_supply>.", 5.002),
                ("node_power_supply_temp_celsius", "temp_celsius value of /sys/class/power_supply/<power_supply>.", -1.5),
            ]
        );
        assert_eq!(s.info.into_iter().collect::<Vec<_>>(), vec![("status", "Discharging".to_string())]);
        assert!(Supply::default().add("capacity", "eighty").is_err());
        assert!(Supply::default().add("current_avg", "x").is_err(), "parsed even though not exported");
    }

    fn write(root: &Path, files: &[(&str, &[u8])]) {
        for (f, v) in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
    }

    fn collector(root: &Path, ignored: &str) -> Collector {
        let p = Paths { procfs: root.into(), sysfs: root.into(), rootfs: root.into(), udev_data: root.into() };
        Collector::new(Options { ignored: Regex::new(ignored).unwrap() }, &p).unwrap()
    }

    fn samples(sink: &Sink, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        let fams = sink.families();
        let Some(f) = fams.iter().find(|f| f.name() == name) else { return vec![] };
        f.samples().map(|(l, v)| (l.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v)).collect()
    }

    #[test]
    fn scrapes_a_tree() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("class/power_supply/AC/online", b"0\n"),
                ("class/power_supply/AC/type", b"Mains\n"),
                ("class/power_supply/AC/uevent", b"POWER_SUPPLY_NAME=AC\nPOWER_SUPPLY_ONLINE=0\n"),
                ("class/power_supply/BAT0/capacity", b"81\n"),
                ("class/power_supply/BAT0/model_name", b"LNV-45N1\xff\xfe\n"),
                ("class/power_supply/BAT0/type", b"Battery\n"),
                ("class/power_supply/BAT0/power/autosuspend_delay_ms", b"x\n"),
            ],
        );
        let mut c = collector(dir.path(), "^$");
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(samples(&sink, "node_power_supply_online"), vec![(vec![s("power_supply", "AC")], 0.0)]);
        assert_eq!(
            samples(&sink, "node_power_supply_info"),
            vec![
                (vec![s("power_supply", "AC"), s("type", "Mains")], 1.0),
                (vec![s("model_name", "LNV-45N1\u{FFFD}"), s("power_supply", "BAT0"), s("type", "Battery")], 1.0),
            ]
        );

        let mut c = collector(dir.path(), "^BAT");
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        assert!(samples(&sink, "node_power_supply_capacity").is_empty());
        assert_eq!(samples(&sink, "node_power_supply_info").len(), 1);

        // A bad number fails the scrape, even of an ignored supply.
        write(dir.path(), &[("class/power_supply/BAT0/capacity", b"lots\n")]);
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(matches!(e, Error::Parse { .. }), "{e}");
    }

    #[test]
    fn no_class_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        let e = crate::Collector::update(&mut collector(dir.path(), "^$"), &mut Sink::new()).unwrap_err();
        assert!(e.is_no_data(), "{e}");
    }
}
