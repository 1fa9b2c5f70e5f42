//! `cpu`: seconds each CPU spent in each mode (/proc/stat), thermal throttle
//! counts, isolated CPUs, and with `--collector.cpu.info` the /proc/cpuinfo
//! info, flag and bug series.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Arg;

use crate::flags::{self, BoolFlag, Flags, StringFlag};
use procfs_core::FromRead;
use regex::Regex;

use crate::io::read_file;
use crate::parse::{lines, proc_stat_cpu};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The kernel's USER_HZ, fixed at 100 on every architecture node_exporter supports.
const USER_HZ: f64 = 100.0;
const MODES: [&str; 8] = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"];

/// The collector's flags, parsed once.
pub struct Options {
    pub guest: bool,
    pub info: bool,
    pub flags_include: Option<Regex>,
    pub bugs_include: Option<Regex>,
}

pub const GUEST: BoolFlag = BoolFlag { name: "collector.cpu.guest", default: true, help: "Enables metric node_cpu_guest_seconds_total" };
pub const INFO: BoolFlag = BoolFlag { name: "collector.cpu.info", default: false, help: "Enables metric cpu_info" };
pub const FLAGS_INCLUDE: StringFlag = StringFlag {
    name: "collector.cpu.info.flags-include",
    default: "",
    help: "Filter the `flags` field in cpuInfo with a value that must be a regular expression",
};
pub const BUGS_INCLUDE: StringFlag = StringFlag {
    name: "collector.cpu.info.bugs-include",
    default: "",
    help: "Filter the `bugs` field in cpuInfo with a value that must be a regular expression",
};

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&GUEST, &INFO, &FLAGS_INCLUDE, &BUGS_INCLUDE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { guest: GUEST.get(f), info: INFO.get(f), flags_include: FLAGS_INCLUDE.regex(f)?, bugs_include: BUGS_INCLUDE.regex(f)? })
    }
}

/// One CPU's line of /proc/stat, in USER_HZ ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    /// user nice system idle iowait irq softirq steal
    pub modes: [u64; 8],
    pub guest: u64,
    pub guest_nice: u64,
}

/// Parses the per-CPU `cpuN` lines of /proc/stat (not the `cpu` total).
pub fn parse_stat(buf: &[u8]) -> Option<Vec<(u32, CpuTimes)>> {
    let mut out = Vec::new();
    for line in lines(buf) {
        if !line.starts_with(b"cpu") {
            continue;
        }
        // The total line is checked too: node_exporter fails on it.
        let (cpu, vals) = proc_stat_cpu(line)?;
        let Some(cpu) = cpu else { continue };
        let mut t = CpuTimes::default();
        t.modes.copy_from_slice(&vals[..8]);
        t.guest = vals[8];
        t.guest_nice = vals[9];
        out.push((cpu, t));
    }
    Some(out)
}

/// Parses a kernel CPU list such as `1,3-5,9`.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65536 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

pub struct Collector {
    stat: PathBuf,
    cpuinfo: PathBuf,
    sys_cpu: PathBuf,
    guest: bool,
    info: bool,
    flags_include: Option<Regex>,
    bugs_include: Option<Regex>,
    isolated: Vec<u32>,
    buf: Vec<u8>,
    /// Last values reported per CPU: counters never go backwards.
    last: BTreeMap<u32, CpuTimes>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let sys_cpu = p.sys("devices/system/cpu");
        let isolated = crate::io::read_trimmed(&sys_cpu.join("isolated")).and_then(|s| parse_cpu_list(&s)).unwrap_or_default();
        Ok(Collector {
            stat: p.proc("stat"),
            cpuinfo: p.proc("cpuinfo"),
            sys_cpu,
            guest: o.guest,
            info: o.info,
            flags_include: o.flags_include,
            bugs_include: o.bugs_include,
            isolated,
            buf: Vec::new(),
            last: BTreeMap::new(),
        })
    }

    /// Applies node_exporter's guard: a counter that goes backwards keeps its
    /// last value, except after an idle reset (a CPU taken offline and back).
    fn stabilise(&mut self, cpu: u32, new: CpuTimes) -> CpuTimes {
        let Some(old) = self.last.get_mut(&cpu) else {
            self.last.insert(cpu, new);
            return new;
        };
        const IDLE: usize = 3;
        if new.modes[IDLE] < old.modes[IDLE] {
            // Idle jumped backwards: the CPU was hot-plugged; start over.
            *old = new;
            return new;
        }
        for (o, n) in old.modes.iter_mut().zip(new.modes) {
            *o = (*o).max(n);
        }
        old.guest = old.guest.max(new.guest);
        old.guest_nice = old.guest_nice.max(new.guest_nice);
        *old
    }

    fn update_info(&self, sink: &mut Sink) -> Result<(), Error> {
        let file = crate::io::open_nonblocking(&self.cpuinfo).map_err(|e| Error::from_read(&self.cpuinfo, e))?;
        let info = procfs_core::CpuInfo::from_read(file).map_err(|e| Error::parse(&self.cpuinfo, e.to_string()))?;
        for i in 0..info.num_cores() {
            let get = |k: &str| info.get_field(i, k).unwrap_or("").to_string();
            let cpu = get("processor");
            let labels = [
                ("cachesize", get("cache size")),
                ("core", get("core id")),
                ("cpu", cpu.clone()),
                ("family", get("cpu family")),
                ("microcode", get("microcode")),
                ("model", get("model")),
                ("model_name", get("model name")),
                ("package", get("physical id")),
                ("stepping", get("stepping")),
                ("vendor", get("vendor_id")),
            ];
            let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            sink.family("node_cpu_info", "CPU information from /proc/cpuinfo.", Kind::Gauge).sample(&l, 1.0);
            if let Some(mhz) = info.get_field(i, "cpu MHz").and_then(|v| v.trim().parse::<f64>().ok()) {
                sink.family("node_cpu_frequency_hertz", "CPU frequency in hertz from /proc/cpuinfo.", Kind::Gauge)
                    .sample(&[("core", &labels[1].1), ("cpu", &cpu), ("package", &labels[7].1)], mhz * 1e6);
            }
        }
        // Flags and bugs of the first CPU, filtered, as node_exporter does.
        for (field, name, label, re) in
            [("flags", "node_cpu_flag_info", "flag", &self.flags_include), ("bugs", "node_cpu_bug_info", "bug", &self.bugs_include)]
        {
            let Some(re) = re else { continue };
            let values: BTreeSet<&str> = info.get_field(0, field).unwrap_or("").split_whitespace().filter(|v| re.is_match(v)).collect();
            for v in values {
                sink.family(name, "The `flags`/`bugs` field of CPU information from /proc/cpuinfo taken from the first core.", Kind::Gauge)
                    .sample(&[(label, v)], 1.0);
            }
        }
        Ok(())
    }

    fn update_throttles(&self, sink: &mut Sink) {
        let Ok(dir) = std::fs::read_dir(&self.sys_cpu) else { return };
        let mut cores: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        let mut packages: BTreeMap<u64, u64> = BTreeMap::new();
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix("cpu")) else { continue };
            if n.parse::<u32>().is_err() {
                continue;
            }
            let base = e.path();
            // The counters first: most virtual machines have none, and then
            // the topology is not read at all (two files less per CPU).
            let tt = base.join("thermal_throttle");
            let core_count = crate::io::read_u64(&tt.join("core_throttle_count"));
            let package_count = crate::io::read_u64(&tt.join("package_throttle_count"));
            if core_count.is_none() && package_count.is_none() {
                continue;
            }
            let topo = |f: &str| crate::io::read_u64(&base.join("topology").join(f));
            let (Some(pkg), Some(core)) = (topo("physical_package_id"), topo("core_id")) else { continue };
            if let Some(v) = core_count {
                cores.entry((pkg, core)).or_insert(v);
            }
            if let Some(v) = package_count {
                packages.entry(pkg).or_insert(v);
            }
        }
        let mut a = itoa::Buffer::new();
        let mut b = itoa::Buffer::new();
        for ((pkg, core), v) in cores {
            sink.family("node_cpu_core_throttles_total", "Number of times this CPU core has been throttled.", Kind::Counter)
                .sample(&[("core", a.format(core)), ("package", b.format(pkg))], v as f64);
        }
        for (pkg, v) in packages {
            sink.family("node_cpu_package_throttles_total", "Number of times this CPU package has been throttled.", Kind::Counter)
                .sample(&[("package", a.format(pkg))], v as f64);
        }
    }
}

fn is_dir(p: &Path) -> bool {
    p.is_dir()
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.stat, &mut self.buf)?;
        let cpus = parse_stat(&self.buf).ok_or_else(|| Error::parse(&self.stat, "malformed cpu line"))?;
        let mut ib = itoa::Buffer::new();
        for (cpu, t) in cpus {
            let t = self.stabilise(cpu, t);
            let cpu = ib.format(cpu);
            let mut f = sink.family("node_cpu_seconds_total", "Seconds the CPUs spent in each mode.", Kind::Counter);
            for (mode, v) in MODES.iter().zip(t.modes) {
                f.sample(&[("cpu", cpu), ("mode", mode)], v as f64 / USER_HZ);
            }
            if self.guest {
                sink.family("node_cpu_guest_seconds_total", "Seconds the CPUs spent in guests (VMs) for each mode.", Kind::Counter)
                    .sample(&[("cpu", cpu), ("mode", "nice")], t.guest_nice as f64 / USER_HZ)
                    .sample(&[("cpu", cpu), ("mode", "user")], t.guest as f64 / USER_HZ);
            }
        }
        for c in &self.isolated {
            sink.family(
                "node_cpu_isolated",
                "Whether each core is isolated, information from /sys/devices/system/cpu/isolated.",
                Kind::Gauge,
            )
            .sample(&[("cpu", ib.format(*c))], 1.0);
        }
        if is_dir(&self.sys_cpu) {
            self.update_throttles(sink);
        }
        if self.info {
            self.update_info(sink)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat() {
        let b = b"cpu  301854 612 111922 8979004 3552 2 3944 0 44 36\ncpu0 44490 19 21045 1087069 220 1 3410 0 2 1\nintr 1 2\n";
        let v = parse_stat(b).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, 0);
        assert_eq!(v[0].1.modes[0], 44490);
        assert_eq!((v[0].1.guest, v[0].1.guest_nice), (2, 1));
        // Old kernels: only four columns.
        let v = parse_stat(b"cpu3 1 2 3 4\n").unwrap();
        assert_eq!(v[0].1.modes[3], 4);
        assert_eq!(parse_stat(b"cpu0 1 2\n").map(|v| v[0].1.modes[1]), Some(2), "short lines are zero-filled, as procfs does");
        assert!(parse_stat(b"cpu  1 2 x\n").is_none(), "a malformed total fails, as in node_exporter");
        assert!(parse_stat(b"cpu0 1 x 3 4\n").is_none());
    }

    #[test]
    fn cpu_list() {
        assert_eq!(parse_cpu_list("1,3-5,9\n"), Some(vec![1, 3, 4, 5, 9]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("5-3"), None);
    }
}
