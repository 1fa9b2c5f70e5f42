//! `netclass`: network device properties from /sys/class/net.

use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{self, Flags};
use regex::Regex;

use crate::io::SysDir;
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The collector's flags, parsed once.
pub struct Options {
    pub ignored: Option<Regex>,
    pub ignore_invalid_speed: bool,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        let mut v =
            vec![flags::string_arg("collector.netclass.ignored-devices", "^$", "Regexp of net devices to ignore for netclass collector.")];
        v.extend(flags::bool_args("collector.netclass.ignore-invalid-speed", false, "Ignore devices where the speed is invalid."));
        v.extend(flags::bool_args("collector.netclass.netlink", false, "Accepted for compatibility; properties are read from sysfs."));
        v
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options {
            ignored: f.regex("collector.netclass.ignored-devices")?,
            ignore_invalid_speed: f.bool("collector.netclass.ignore-invalid-speed", false),
        })
    }
}

/// (sysfs attribute, metric suffix, kind): integer attributes exported as is.
const INT_ATTRS: [(&str, &str, Kind); 13] = [
    ("addr_assign_type", "address_assign_type", Kind::Gauge),
    ("carrier", "carrier", Kind::Gauge),
    ("carrier_changes", "carrier_changes_total", Kind::Counter),
    ("carrier_up_count", "carrier_up_changes_total", Kind::Counter),
    ("carrier_down_count", "carrier_down_changes_total", Kind::Counter),
    ("dev_id", "device_id", Kind::Gauge),
    ("dormant", "dormant", Kind::Gauge),
    ("flags", "flags", Kind::Gauge),
    ("ifindex", "iface_id", Kind::Gauge),
    ("iflink", "iface_link", Kind::Gauge),
    ("link_mode", "iface_link_mode", Kind::Gauge),
    ("mtu", "mtu_bytes", Kind::Gauge),
    ("netdev_group", "net_dev_group", Kind::Gauge),
];

/// Parses a sysfs integer, decimal or 0x-hexadecimal.
pub fn parse_int(s: &str) -> Option<i64> {
    match s.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

pub struct Collector {
    dir: PathBuf,
    ignored: Option<Regex>,
    ignore_invalid_speed: bool,
    names: Vec<String>,
    /// Each device's directory, its attributes kept open across scrapes.
    devices: rustc_hash::FxHashMap<String, SysDir>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            dir: p.sys("class/net"),
            ignored: o.ignored,
            ignore_invalid_speed: o.ignore_invalid_speed,
            names: INT_ATTRS.iter().map(|(_, s, _)| format!("node_network_{s}")).collect(),
            devices: Default::default(),
        })
    }

    fn device(&mut self, sink: &mut Sink, dev: &str, path: &Path) {
        if !self.devices.contains_key(dev) {
            let Ok(d) = SysDir::open(path) else { return };
            self.devices.insert(dev.to_string(), d);
        }
        let Some(d) = self.devices.get_mut(dev) else { return };
        let mut attr = |a: &str| d.read(a).map(str::to_string);
        let operstate = attr("operstate").unwrap_or_default();
        let address = attr("address").unwrap_or_default();
        let broadcast = attr("broadcast").unwrap_or_default();
        let duplex = attr("duplex").unwrap_or_default();
        let ifalias = attr("ifalias").unwrap_or_default();
        let mut int = |a: &str| d.read(a).and_then(parse_int);
        let flags = int("flags");
        let adminstate = match flags {
            None => "unknown",
            Some(f) if f & 1 == 1 => "up",
            Some(_) => "down",
        };
        sink.family("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.", Kind::Gauge)
            .sample(&[("device", dev)], if operstate == "up" { 1.0 } else { 0.0 });
        sink.family("node_network_info", "Non-numeric data from /sys/class/net/<iface>, value is always 1.", Kind::Gauge).sample(
            &[
                ("address", &address),
                ("adminstate", adminstate),
                ("broadcast", &broadcast),
                ("device", dev),
                ("duplex", &duplex),
                ("ifalias", &ifalias),
                ("operstate", &operstate),
            ],
            1.0,
        );
        for ((file, suffix, kind), name) in INT_ATTRS.iter().zip(&self.names) {
            if let Some(v) = int(file) {
                sink.family(name, &format!("Network device property: {suffix}"), *kind).sample(&[("device", dev)], v as f64);
            }
        }
        if let Some(v) = int("name_assign_type") {
            sink.family("node_network_name_assign_type", "Network device property: name_assign_type", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
        if let Some(speed) = int("speed") {
            if speed >= 0 || !self.ignore_invalid_speed {
                sink.family("node_network_speed_bytes", "Network device property: speed_bytes", Kind::Gauge)
                    .sample(&[("device", dev)], (speed * 1000 * 1000 / 8) as f64);
            }
        }
        if let Some(v) = int("tx_queue_len") {
            sink.family("node_network_transmit_queue_length", "Network device property: transmit_queue_length", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
        if let Some(v) = int("type") {
            sink.family("node_network_protocol_type", "Network device property: protocol_type", Kind::Gauge)
                .sample(&[("device", dev)], v as f64);
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                Error::NoData(format!("cannot read {}: {e}", self.dir.display()))
            }
            _ => Error::io(&self.dir, e),
        })?;
        let mut devs: Vec<(String, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let path = e.path();
                path.is_dir().then_some((name, path))
            })
            .collect();
        devs.sort();
        // Devices that went away release their kept attributes.
        self.devices.retain(|name, _| devs.iter().any(|(d, _)| d == name));
        for (dev, path) in devs {
            if self.ignored.as_ref().is_some_and(|r| r.is_match(&dev)) {
                continue;
            }
            self.device(sink, &dev, &path);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ints() {
        assert_eq!(super::parse_int("0x1303"), Some(4867));
        assert_eq!(super::parse_int("-1"), Some(-1));
        assert_eq!(super::parse_int(""), None);
    }
}
