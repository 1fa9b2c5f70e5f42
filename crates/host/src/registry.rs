//! The collector registry: every host collector by name, with its default
//! state, its own flags and its constructor, and the host's flags
//! (`--path.*`, `--collector.<name>`, `--collector.disable-defaults`).
//!
//! [`Definition`] is generic over what building needs (`()` for host
//! collectors), so that the binary registers its eBPF probes the same way.

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Command};

use crate::collector::*;
use crate::flags::{self, BoolFlag, Flags, StringFlag};
use crate::{Collector, ConfigError, Named, Paths};

/// Builds a collector from its flags, the host paths and shared state `C`.
pub type Builder<C> = fn(&Flags, &Paths, &mut C) -> Result<Box<dyn Collector>, ConfigError>;

/// What a collector module registers.
pub struct Definition<C = ()> {
    /// Its name: its flag `--collector.<name>`, its `collector` label and
    /// its module's file name.
    pub name: &'static str,
    pub enabled_by_default: bool,
    /// Its own flags (`--collector.<name>.*`).
    pub args: fn() -> Vec<Arg>,
    pub build: Builder<C>,
}

/// No flags of its own.
pub fn no_args() -> Vec<Arg> {
    Vec::new()
}

/// A collector without flags of its own: `Collector::new(&Paths) -> Collector`.
macro_rules! simple {
    ($name:literal, $default:expr, $module:ident) => {
        Definition { name: $name, enabled_by_default: $default, args: no_args, build: |_f, p, _c| Ok(Box::new($module::Collector::new(p))) }
    };
}

/// A collector with flags: `Options::args()` declares them (its
/// `host::flags` consts), `Options::from_flags(&Flags)` reads them, then
/// `Collector::new(Options, &Paths) -> Result<Collector, ConfigError>`.
macro_rules! with_options {
    ($name:literal, $default:expr, $module:ident) => {
        Definition {
            name: $name,
            enabled_by_default: $default,
            args: $module::Options::args,
            build: |f, p, _c| Ok(Box::new($module::Collector::new($module::Options::from_flags(f)?, p)?)),
        }
    };
}

/// Every host collector, with node_exporter's default states.
pub fn definitions() -> Vec<Definition> {
    vec![
        with_options!("arp", true, arp),
        with_options!("bcache", true, bcache),
        simple!("bcachefs", true, bcachefs),
        simple!("bonding", true, bonding),
        simple!("btrfs", true, btrfs),
        simple!("buddyinfo", false, buddyinfo),
        simple!("cgroups", false, cgroups),
        simple!("conntrack", true, conntrack),
        with_options!("cpu", true, cpu),
        simple!("cpu_vulnerabilities", false, cpu_vulnerabilities),
        simple!("cpufreq", true, cpufreq),
        with_options!("diskstats", true, diskstats),
        simple!("dmi", true, dmi),
        simple!("dmmultipath", true, dmmultipath),
        simple!("drbd", false, drbd),
        simple!("drm", false, drm),
        simple!("edac", true, edac),
        simple!("entropy", true, entropy),
        with_options!("ethtool", false, ethtool),
        simple!("fibrechannel", true, fibrechannel),
        simple!("filefd", true, filefd),
        with_options!("filesystem", true, filesystem),
        with_options!("hwmon", true, hwmon),
        with_options!("infiniband", true, infiniband),
        with_options!("interrupts", false, interrupts),
        with_options!("ipvs", true, ipvs),
        simple!("kernel_hung", true, kernel_hung),
        simple!("ksmd", false, ksmd),
        simple!("lnstat", false, lnstat),
        simple!("loadavg", true, loadavg),
        with_options!("logind", false, logind),
        simple!("mdadm", true, mdadm),
        simple!("meminfo", true, meminfo),
        simple!("meminfo_numa", false, meminfo_numa),
        simple!("mountstats", false, mountstats),
        with_options!("netclass", true, netclass),
        with_options!("netdev", true, netdev),
        with_options!("netstat", true, netstat),
        simple!("network_route", false, network_route),
        simple!("nfs", true, nfs),
        simple!("nfsd", true, nfsd),
        with_options!("ntp", false, ntp),
        simple!("nvme", true, nvme),
        simple!("nvmesubsystem", false, nvmesubsystem),
        simple!("os", true, os),
        with_options!("pcidevice", false, pcidevice),
        with_options!("perf", false, perf),
        with_options!("powersupplyclass", true, powersupplyclass),
        simple!("pressure", true, pressure),
        simple!("processes", false, processes),
        with_options!("qdisc", false, qdisc),
        with_options!("rapl", true, rapl),
        with_options!("runit", false, runit),
        simple!("schedstat", true, schedstat),
        simple!("selinux", true, selinux),
        with_options!("slabinfo", false, slabinfo),
        simple!("sockstat", true, sockstat),
        simple!("softirqs", false, softirqs),
        simple!("softnet", true, softnet),
        with_options!("stat", true, stat),
        with_options!("supervisord", false, supervisord),
        simple!("swap", false, swap),
        with_options!("sysctl", false, sysctl),
        with_options!("systemd", false, systemd),
        with_options!("tapestats", true, tapestats),
        simple!("tcpstat", false, tcpstat),
        with_options!("textfile", true, textfile),
        simple!("thermal_zone", true, thermal_zone),
        simple!("time", true, time),
        simple!("timex", true, timex),
        simple!("udp_queues", true, udp_queues),
        simple!("uname", true, uname),
        with_options!("vmstat", true, vmstat),
        simple!("watchdog", true, watchdog),
        with_options!("wifi", false, wifi),
        simple!("xfrm", false, xfrm),
        simple!("xfs", true, xfs),
        simple!("zfs", true, zfs),
        simple!("zoneinfo", false, zoneinfo),
    ]
}

pub const PROCFS: StringFlag = StringFlag { name: "path.procfs", default: "/proc", help: "procfs mountpoint." };
pub const SYSFS: StringFlag = StringFlag { name: "path.sysfs", default: "/sys", help: "sysfs mountpoint." };
pub const ROOTFS: StringFlag = StringFlag { name: "path.rootfs", default: "/", help: "rootfs mountpoint." };
pub const UDEV_DATA: StringFlag = StringFlag { name: "path.udev.data", default: "/run/udev/data", help: "udev data path." };
pub const DISABLE_DEFAULTS: BoolFlag =
    BoolFlag { name: "collector.disable-defaults", default: false, help: "Set all collectors to disabled by default." };

/// `--path.*`: where the host's filesystems are.
pub fn path_args() -> Vec<Arg> {
    flags::args(&[&PROCFS, &SYSFS, &ROOTFS, &UDEV_DATA])
}

/// The host paths from `--path.*`.
pub fn paths(f: &Flags) -> Paths {
    let p = |flag: StringFlag| PathBuf::from(flag.get(f));
    Paths { procfs: p(PROCFS), sysfs: p(SYSFS), rootfs: p(ROOTFS), udev_data: p(UDEV_DATA) }
}

/// `--collector.disable-defaults`.
pub fn disable_defaults_args() -> [Arg; 2] {
    DISABLE_DEFAULTS.args()
}

/// `--collector.<name>` / `--no-collector.<name>` and the collector's own
/// flags, for each definition.
pub fn collector_args<C>(defs: &[Definition<C>]) -> Vec<Arg> {
    let mut v = Vec::new();
    for d in defs {
        v.extend(flags::bool_args(&format!("collector.{}", d.name), d.enabled_by_default, &format!("Enable the {} collector", d.name)));
        v.extend((d.args)());
    }
    v
}

/// Whether the collector of `d` is on, given `--collector.disable-defaults`.
pub fn enabled<C>(f: &Flags, d: &Definition<C>) -> bool {
    let default = d.enabled_by_default && !DISABLE_DEFAULTS.get(f);
    f.bool(&format!("collector.{}", d.name), default)
}

/// Builds the enabled collectors of `defs`, in order.
pub fn build<C>(f: &Flags, paths: &Paths, defs: &[Definition<C>], ctx: &mut C) -> Result<Vec<Named>, ConfigError> {
    let mut out = Vec::new();
    for d in defs {
        if enabled(f, d) {
            out.push((d.name, (d.build)(f, paths, ctx)?));
        }
    }
    Ok(out)
}

/// The flags of node_exporter's catalog not declared in `declared`: those
/// of collectors node-agent does not have (each `--collector.<name>` with
/// node_exporter's default state), so that a node_exporter command line is
/// accepted whole. Returns the args.
pub fn catalog_args(declared: &[Arg]) -> Vec<Arg> {
    let have: std::collections::HashSet<&str> = declared.iter().map(|a| a.get_id().as_str()).collect();
    let mut v = Vec::new();
    for spec in crate::catalog::FLAGS {
        if have.contains(spec.name) || spec.collector.is_none() {
            continue;
        }
        let help = match spec.collector {
            Some(c) if spec.enables => format!("{} (node-agent has no {c} collector yet: accepted, nothing is collected)", spec.help),
            _ => format!("{} (node_exporter's flag: accepted, not used by node-agent yet)", spec.help),
        };
        match spec.kind {
            crate::catalog::FlagKind::Bool => {
                v.extend(flags::bool_args(spec.name, spec.default == "true", &help).map(|a| a.hide(spec.hidden)))
            }
            crate::catalog::FlagKind::Strings => v.push(flags::strings_arg(spec.name, &help).hide(spec.hidden)),
            _ => v.push(flags::string_arg(spec.name, spec.default, &help).hide(spec.hidden)),
        }
    }
    v
}

/// node_exporter's collectors on Linux that `defs` do not implement.
pub fn unimplemented<C>(defs: &[Definition<C>]) -> Vec<(&'static str, bool)> {
    crate::catalog::collectors().filter(|(n, _)| !defs.iter().any(|d| d.name == *n)).collect()
}

/// Warns once for each collector node_exporter has, node-agent does not,
/// and the command line turns on (explicitly or by default).
pub fn warn_unimplemented<C>(f: &Flags, defs: &[Definition<C>]) {
    let defaults_off = DISABLE_DEFAULTS.get(f);
    for (name, default) in unimplemented(defs) {
        if f.bool(&format!("collector.{name}"), default && !defaults_off) {
            tracing::warn!(
                collector = name,
                "node-agent has no such collector yet: --collector.{name} and its flags are accepted, and nothing is collected"
            );
        }
    }
}

/// A command with the host's flags only: paths, collectors and their own
/// flags (for tools that scrape host collectors without the agent: the
/// fuzzers, the conformance harness).
pub fn command() -> Command {
    let defs = definitions();
    let mut args: Vec<Arg> = path_args().into_iter().chain(disable_defaults_args()).chain(collector_args(&defs)).collect();
    args.extend(catalog_args(&args));
    Command::new("node-agent-host").args(args)
}

/// The host paths and the enabled host collectors of a command line parsed
/// by [`command`].
pub fn resolve(m: &ArgMatches) -> Result<(Paths, Vec<Named>), ConfigError> {
    let f = Flags::new(m);
    let paths = paths(&f);
    let collectors = build(&f, &paths, &definitions(), &mut ())?;
    Ok((paths, collectors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_sorted() {
        let names: Vec<&str> = definitions().iter().map(|d| d.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn default_states_are_node_exporter_s() {
        for d in definitions() {
            let theirs = crate::catalog::collectors().find(|(n, _)| *n == d.name).map(|(_, on)| on);
            assert_eq!(theirs, Some(d.enabled_by_default), "{}: node_exporter's default state", d.name);
        }
    }

    #[test]
    fn a_node_exporter_command_line_is_accepted_whole() {
        let m = command()
            .try_get_matches_from([
                "x",
                "--collector.bcache",
                "--collector.bcache.priorityStats",
                "--no-collector.wifi",
                "--collector.sysctl.include=a",
                "--collector.sysctl.include=b",
            ])
            .unwrap();
        assert!(Flags::new(&m).bool("collector.bcache.priorityStats", false));
        assert_eq!(Flags::new(&m).strings("collector.sysctl.include"), ["a", "b"]);
        assert!(command().try_get_matches_from(["x", "--collector.bcache.nope"]).is_err());
    }

    #[test]
    fn defaults_and_toggles() {
        let names = |args: &[&str]| {
            let m = command().no_binary_name(true).try_get_matches_from(args).unwrap();
            resolve(&m).unwrap().1.into_iter().map(|(n, _)| n).collect::<Vec<_>>()
        };
        assert!(names(&[]).contains(&"cpu"));
        assert_eq!(names(&["--no-collector.cpu", "--collector.disable-defaults", "--collector.meminfo"]), ["meminfo"]);
        assert_eq!(names(&["--collector.disable-defaults", "--collector.cpu", "--no-collector.cpu", "--collector.loadavg"]), ["loadavg"]);
    }
}
