//! `hwmon`: hardware sensors from /sys/class/hwmon, named as node_exporter
//! names them: chip labels from the device path (disambiguated when several
//! hwmon nodes share one device), sensor labels as an annotation metric.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{self, Flags, StringFlag};

use crate::filter::DeviceFilter;
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

const SENSOR_TYPES: [&str; 14] = [
    "vrm",
    "beep_enable",
    "update_interval",
    "in",
    "cpu",
    "fan",
    "pwm",
    "temp",
    "curr",
    "power",
    "energy",
    "humidity",
    "intrusion",
    "freq",
];

/// The collector's flags, parsed once.
pub struct Options {
    pub chips: DeviceFilter,
    pub sensors: DeviceFilter,
}

pub const CHIP_INCLUDE: StringFlag = StringFlag {
    name: "collector.hwmon.chip-include",
    default: "",
    help: "Regexp of hwmon chip to include (mutually exclusive to device-exclude).",
};
pub const CHIP_EXCLUDE: StringFlag = StringFlag {
    name: "collector.hwmon.chip-exclude",
    default: "",
    help: "Regexp of hwmon chip to exclude (mutually exclusive to device-include).",
};
pub const SENSOR_INCLUDE: StringFlag = StringFlag {
    name: "collector.hwmon.sensor-include",
    default: "",
    help: "Regexp of hwmon sensor to include (mutually exclusive to sensor-exclude).",
};
pub const SENSOR_EXCLUDE: StringFlag = StringFlag {
    name: "collector.hwmon.sensor-exclude",
    default: "",
    help: "Regexp of hwmon sensor to exclude (mutually exclusive to sensor-include).",
};

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&CHIP_INCLUDE, &CHIP_EXCLUDE, &SENSOR_INCLUDE, &SENSOR_EXCLUDE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { chips: flags::filter(f, &CHIP_EXCLUDE, &CHIP_INCLUDE)?, sensors: flags::filter(f, &SENSOR_EXCLUDE, &SENSOR_INCLUDE)? })
    }
}

/// Lower-cases and replaces every character outside `[a-z0-9:_]` with `_`,
/// trimming underscores, as node_exporter's cleanMetricName does.
pub fn clean_name(s: &str) -> String {
    let lower = s.to_lowercase();
    let replaced: String =
        lower.chars().map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == ':' || c == '_' { c } else { '_' }).collect();
    replaced.trim_matches('_').to_string()
}

/// Splits `temp1_crit_alarm` into ("temp", "1", "crit_alarm") like
/// node_exporter's `^([^0-9]+)([0-9]*)?(_(.+))?$`: a name without digits is
/// all type (`beep_enable`).
pub fn explode(filename: &str) -> Option<(&str, &str, &str)> {
    let Some(type_end) = filename.find(|c: char| c.is_ascii_digit()) else {
        return (!filename.is_empty()).then_some((filename, "", ""));
    };
    if type_end == 0 {
        return None;
    }
    let (ty, rest) = filename.split_at(type_end);
    let id_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (id, rest) = rest.split_at(id_end);
    if rest.is_empty() {
        return Some((ty, id, ""));
    }
    match rest.strip_prefix('_') {
        Some(p) if !p.is_empty() => Some((ty, id, p)),
        _ => None,
    }
}

type SensorData = BTreeMap<String, BTreeMap<String, String>>;

fn collect_sensor_data(dir: &Path, data: &mut SensorData) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(name) = e.file_name().into_string() else { continue };
        let Some((ty, id, prop)) = explode(&name) else { continue };
        if !SENSOR_TYPES.contains(&ty) {
            continue;
        }
        // Sysfs attributes are small; a bounded read avoids drivers that never end.
        let Some(value) = read_small(&dir.join(&name)) else { continue };
        let id = if id.is_empty() { "0" } else { id };
        let id: u64 = id.parse().unwrap_or(0);
        data.entry(format!("{ty}{id}")).or_default().insert(prop.to_string(), value);
    }
}

fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut f = crate::io::open_nonblocking(path).ok()?;
    let mut buf = [0u8; 128];
    let n = f.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).trim_end_matches('\n').to_string())
}

/// The chip label from the device path, as node_exporter's hwmonName: the
/// device's parent directory and name, else the `name` file, else hwmonN.
fn base_chip_name(dir: &Path) -> Option<String> {
    if let Ok(dev) = std::fs::canonicalize(dir.join("device")) {
        let name = dev.file_name().map(|n| clean_name(&n.to_string_lossy())).unwrap_or_default();
        let ty = dev.parent().and_then(|p| p.file_name()).map(|n| clean_name(&n.to_string_lossy())).unwrap_or_default();
        if !ty.is_empty() && !name.is_empty() {
            return Some(format!("{ty}_{name}"));
        }
        if !name.is_empty() {
            return Some(name);
        }
    }
    if let Some(n) = human_name(dir) {
        return Some(n);
    }
    let real = std::fs::canonicalize(dir).ok()?;
    let n = clean_name(&real.file_name()?.to_string_lossy());
    (!n.is_empty()).then_some(n)
}

/// The cleaned content of the `name` file.
fn human_name(dir: &Path) -> Option<String> {
    let n = clean_name(&crate::io::read_text(&dir.join("name")).ok()?);
    (!n.is_empty()).then_some(n)
}

pub struct Collector {
    dir: PathBuf,
    chips: DeviceFilter,
    sensors: DeviceFilter,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("class/hwmon"), chips: o.chips, sensors: o.sensors })
    }

    fn chip(&self, sink: &mut Sink, dir: &Path, chip: &str) {
        let mut data = SensorData::new();
        collect_sensor_data(dir, &mut data);
        if dir.join("device").exists() {
            collect_sensor_data(&dir.join("device"), &mut data);
        }
        if let Some(name) = human_name(dir) {
            sink.family("node_hwmon_chip_names", "Annotation metric for human-readable chip names", Kind::Gauge)
                .sample(&[("chip", chip), ("chip_name", &name)], 1.0);
        }
        for (sensor, props) in &data {
            if self.sensors.ignored(&format!("{chip};{sensor}")) {
                continue;
            }
            let Some((ty, _, _)) = explode(sensor) else { continue };
            let l = [("chip", chip), ("sensor", sensor.as_str())];
            let label = props.get("label").map(|s| s.trim()).filter(|s| !s.is_empty());
            if let Some(label) = label {
                sink.family("node_hwmon_sensor_label", "Label for given chip and sensor", Kind::Gauge)
                    .sample(&[("chip", chip), ("label", label), ("sensor", sensor)], 1.0);
            }
            let plain = props.get("").and_then(|v| v.trim().parse::<f64>().ok());
            match ty {
                "beep_enable" => {
                    let v = if props.get("").map(String::as_str) == Some("1") { 1.0 } else { 0.0 };
                    sink.family("node_hwmon_beep_enabled", "Hardware beep enabled", Kind::Gauge).sample(&l, v);
                    continue;
                }
                "vrm" => {
                    if let Some(v) = plain {
                        sink.family("node_hwmon_voltage_regulator_version", "Hardware voltage regulator", Kind::Gauge).sample(&l, v);
                    }
                    continue;
                }
                "update_interval" => {
                    if let Some(v) = plain {
                        sink.family("node_hwmon_update_interval_seconds", "Hardware monitor update interval", Kind::Gauge)
                            .sample(&l, v * 0.001);
                    }
                    continue;
                }
                "freq" => {
                    if let Some(v) = props.get("input").and_then(|v| v.trim().parse::<f64>().ok()) {
                        let s = label.map(clean_name).unwrap_or_else(|| sensor.clone());
                        sink.family("node_hwmon_freq_freq_mhz", "Hardware monitor for GPU frequency in MHz", Kind::Gauge)
                            .sample(&[("chip", chip), ("sensor", &s)], v / 1e6);
                    }
                    continue;
                }
                _ => {}
            }
            for (element, value) in props {
                if element == "label" {
                    continue;
                }
                let Ok(v) = value.trim().parse::<f64>() else { continue };
                let mut name = format!("node_hwmon_{ty}");
                if element == "input" {
                    if props.contains_key("") {
                        name.push_str("_input");
                    }
                } else if !element.is_empty() {
                    name.push('_');
                    name.push_str(&clean_name(element));
                }
                let e = element.as_str();
                let (name, value, kind) = if e == "fault" || e == "alarm" {
                    (name, v, Kind::Gauge)
                } else if e == "beep" {
                    (name + "_enabled", v, Kind::Gauge)
                } else if ty == "in" || ty == "cpu" {
                    (name + "_volts", v * 0.001, Kind::Gauge)
                } else if ty == "temp" && e != "type" {
                    (name + "_celsius", v * 0.001, Kind::Gauge)
                } else if ty == "curr" {
                    (name + "_amps", v * 0.001, Kind::Gauge)
                } else if ty == "energy" {
                    (name + "_joule_total", v / 1e6, Kind::Counter)
                } else if ty == "power" && e == "accuracy" {
                    (name, v / 1e6, Kind::Gauge)
                } else if ty == "power" && matches!(e, "average_interval" | "average_interval_min" | "average_interval_max") {
                    (name + "_seconds", v * 0.001, Kind::Gauge)
                } else if ty == "power" {
                    (name + "_watt", v / 1e6, Kind::Gauge)
                } else if ty == "humidity" {
                    (name, v / 1e6, Kind::Gauge)
                } else if ty == "fan" && matches!(e, "input" | "min" | "max" | "target") {
                    (name + "_rpm", v, Kind::Gauge)
                } else {
                    (name, v, Kind::Gauge)
                };
                sink.family(&name, &format!("Hardware monitor {ty} element {e}"), kind).sample(&l, value);
            }
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| Error::from_read(&self.dir, e))?;
        let mut dirs: Vec<(String, PathBuf)> =
            rd.flatten().filter(|e| e.path().is_dir()).filter_map(|e| Some((e.file_name().into_string().ok()?, e.path()))).collect();
        dirs.sort();
        // Pass 1: base chip names and their collisions.
        let bases: Vec<Option<String>> = dirs.iter().map(|(_, d)| base_chip_name(d)).collect();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for b in bases.iter().flatten() {
            *counts.entry(b).or_default() += 1;
        }
        // Pass 2: disambiguate shared names with the `name` file, else hwmonN.
        for ((hw, dir), base) in dirs.iter().zip(&bases) {
            let Some(base) = base else { continue };
            let chip = if counts[base.as_str()] > 1 {
                match human_name(dir) {
                    Some(n) => format!("{base}_{n}"),
                    None => format!("{base}_{}", clean_name(hw)),
                }
            } else {
                base.clone()
            };
            if self.chips.ignored(&chip) {
                continue;
            }
            self.chip(sink, dir, &chip);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explodes() {
        assert_eq!(explode("temp1_crit_alarm"), Some(("temp", "1", "crit_alarm")));
        assert_eq!(explode("in0_input"), Some(("in", "0", "input")));
        assert_eq!(explode("pwm1"), Some(("pwm", "1", "")));
        assert_eq!(explode("beep_enable"), Some(("beep_enable", "", "")));
        assert_eq!(explode("temp1_"), None);
        assert_eq!(explode("name"), Some(("name", "", "")));
        assert_eq!(explode("1abc"), None);
    }

    #[test]
    fn cleans() {
        assert_eq!(clean_name("Core 0\n"), "core_0");
        assert_eq!(clean_name("coretemp.0"), "coretemp_0");
        assert_eq!(clean_name("asus-nb-wmi"), "asus_nb_wmi");
    }
}
