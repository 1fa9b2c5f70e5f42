//! `thermal_zone`: thermal zone temperatures and cooling device states from
//! /sys/class/thermal.

use std::path::PathBuf;

use crate::io::{read_i64, read_number, read_trimmed};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    dir: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("class/thermal") }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // No thermal class, or an empty one, is a success with no samples
        // (node_exporter 1.12 globs the zones and finds none).
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::from_read(&self.dir, e)),
        };
        let mut entries: Vec<(String, PathBuf)> =
            rd.flatten().filter_map(|e| Some((e.file_name().into_string().ok()?, e.path()))).collect();
        entries.sort();
        for (name, path) in &entries {
            if let Some(zone) = name.strip_prefix("thermal_zone") {
                // A zone whose sensor can't be read (EIO, ENODATA) is skipped.
                let (Some(ty), Some(temp)) = (read_trimmed(&path.join("type")), read_i64(&path.join("temp"))) else { continue };
                sink.family("node_thermal_zone_temp", "Zone temperature in Celsius", Kind::Gauge)
                    .sample(&[("type", &ty), ("zone", zone)], temp as f64 / 1000.0);
            } else if let Some(dev) = name.strip_prefix("cooling_device") {
                let Some(ty) = read_trimmed(&path.join("type")) else { continue };
                // A state that is not a number fails the collector, as
                // procfs's parseCoolingDeviceStats does.
                if let Some(cur) = read_number::<i64>(&path.join("cur_state"))? {
                    sink.family("node_cooling_device_cur_state", "Current throttle state of the cooling device", Kind::Gauge)
                        .sample(&[("name", dev), ("type", &ty)], cur as f64);
                }
                if let Some(max) = read_number::<i64>(&path.join("max_state"))? {
                    sink.family("node_cooling_device_max_state", "Maximum throttle state of the cooling device", Kind::Gauge)
                        .sample(&[("name", dev), ("type", &ty)], max as f64);
                }
            }
        }
        Ok(())
    }
}
