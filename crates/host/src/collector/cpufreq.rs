//! `cpufreq`: CPU frequency scaling from /sys/devices/system/cpu/cpu*/cpufreq.

use std::path::PathBuf;

use crate::io::{read_number, read_trimmed};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    sys_cpu: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { sys_cpu: p.sys("devices/system/cpu") }
    }
}

const KHZ: [(&str, &str, &str); 6] = [
    ("cpuinfo_cur_freq", "node_cpu_frequency_hertz", "Current CPU thread frequency in hertz."),
    ("cpuinfo_max_freq", "node_cpu_frequency_max_hertz", "Maximum CPU thread frequency in hertz."),
    ("cpuinfo_min_freq", "node_cpu_frequency_min_hertz", "Minimum CPU thread frequency in hertz."),
    ("scaling_cur_freq", "node_cpu_scaling_frequency_hertz", "Current scaled CPU thread frequency in hertz."),
    ("scaling_max_freq", "node_cpu_scaling_frequency_max_hertz", "Maximum scaled CPU thread frequency in hertz."),
    ("scaling_min_freq", "node_cpu_scaling_frequency_min_hertz", "Minimum scaled CPU thread frequency in hertz."),
];

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let dir = std::fs::read_dir(&self.sys_cpu).map_err(|e| Error::from_read(&self.sys_cpu, e))?;
        let mut cpus: Vec<(u32, PathBuf)> = dir
            .flatten()
            .filter_map(|e| {
                let n: u32 = e.file_name().to_str()?.strip_prefix("cpu")?.parse().ok()?;
                let p = e.path().join("cpufreq");
                p.is_dir().then_some((n, p))
            })
            .collect();
        // No cpufreq at all (a VM, a container) is a success with no
        // samples, as in node_exporter 1.12.
        cpus.sort();
        let mut ib = itoa::Buffer::new();
        for (n, dir) in &cpus {
            let cpu = ib.format(*n);
            for (file, name, help) in KHZ {
                // Absent or root-only files are skipped; a malformed one
                // fails the collector, as procfs's parseCpufreqCpuinfo does.
                if let Some(khz) = read_number::<u64>(&dir.join(file))? {
                    sink.family(name, help, Kind::Gauge).sample(&[("cpu", cpu)], khz as f64 * 1000.0);
                }
            }
            let current = read_trimmed(&dir.join("scaling_governor")).unwrap_or_default();
            if let Some(avail) = read_trimmed(&dir.join("scaling_available_governors")) {
                let mut f = sink.family("node_cpu_scaling_governor", "Current enabled CPU frequency governor.", Kind::Gauge);
                for g in avail.split_whitespace() {
                    f.sample(&[("cpu", cpu), ("governor", g)], if g == current { 1.0 } else { 0.0 });
                }
            }
        }
        Ok(())
    }
}
