//! `time`: the system time, the local time zone's offset, and clock sources.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::io::read_trimmed;
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    clocksource: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { clocksource: p.sys("devices/system/clocksource") }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        sink.single("node_time_seconds", "System time in seconds since epoch (1970).", Kind::Gauge, now);
        let (zone, offset) = crate::sys::local_zone(now as i64);
        sink.family("node_time_zone_offset_seconds", "System time zone offset in seconds.", Kind::Gauge)
            .sample(&[("time_zone", &zone)], offset as f64);
        if let Ok(rd) = std::fs::read_dir(&self.clocksource) {
            let mut devs: Vec<(String, PathBuf)> =
                rd.flatten().filter_map(|e| Some((e.file_name().into_string().ok()?, e.path()))).collect();
            devs.sort();
            for (name, path) in devs {
                let Some(dev) = name.strip_prefix("clocksource") else { continue };
                if let Some(avail) = read_trimmed(&path.join("available_clocksource")) {
                    for cs in avail.split_whitespace() {
                        sink.family(
                            "node_time_clocksource_available_info",
                            "Available clocksources read from '/sys/devices/system/clocksource'.",
                            Kind::Gauge,
                        )
                        .sample(&[("clocksource", cs), ("device", dev)], 1.0);
                    }
                }
                if let Some(cur) = read_trimmed(&path.join("current_clocksource")) {
                    sink.family(
                        "node_time_clocksource_current_info",
                        "Current clocksource read from '/sys/devices/system/clocksource'.",
                        Kind::Gauge,
                    )
                    .sample(&[("clocksource", &cur), ("device", dev)], 1.0);
                }
            }
        }
        Ok(())
    }
}
