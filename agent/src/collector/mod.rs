//! Host collectors, one module each, named as node_exporter names them.
//!
//! A collector's name is its flag (`--collector.<name>`), its `collector`
//! label and its module's file name. Each module keeps parsing (bytes to
//! samples) in pure functions with unit tests, and its I/O thin.

use std::io;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgMatches};

use crate::metrics::Sink;

pub mod arp;
pub mod conntrack;
pub mod cpu;
pub mod cpufreq;
pub mod diskstats;
pub mod ebpf_block_io;
pub mod ebpf_oom_kills;
pub mod ebpf_pods;
pub mod ebpf_process;
pub mod ebpf_runqueue;
pub mod ebpf_syscalls;
pub mod ebpf_tcp_retransmits;
pub mod entropy;
pub mod filefd;
pub mod filesystem;
pub mod hwmon;
pub mod loadavg;
pub mod meminfo;
pub mod netclass;
pub mod netdev;
pub mod netstat;
pub mod os;
pub mod pressure;
pub mod schedstat;
pub mod selinux;
pub mod sockstat;
pub mod softnet;
pub mod stat;
pub mod textfile;
pub mod thermal_zone;
pub mod time;
pub mod timex;
pub mod udp_queues;
pub mod uname;
pub mod util;
pub mod vmstat;

/// Why a collector failed in one scrape.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    /// The host has nothing for this collector (e.g. no hwmon chips); it is
    /// reported with success 0 and logged at debug, as node_exporter does.
    #[error("no data: {0}")]
    NoData(String),
}

impl Error {
    pub fn io(path: &Path, source: io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), source }
    }

    pub fn parse(path: &Path, msg: impl Into<String>) -> Self {
        Error::Parse { path: path.to_path_buf(), msg: msg.into() }
    }

    /// A missing file means the host lacks the feature: no data, not a fault.
    pub fn from_read(path: &Path, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            Error::NoData(format!("{} does not exist", path.display()))
        } else {
            Error::io(path, source)
        }
    }

    pub fn is_no_data(&self) -> bool {
        matches!(self, Error::NoData(_))
    }
}

/// A bad flag value found while building a collector.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--{flag}: invalid regular expression {value:?}: {source}")]
    Regex {
        flag: String,
        value: String,
        #[source]
        source: Box<regex::Error>,
    },
    #[error("--{flag}: {msg}")]
    Invalid { flag: String, msg: String },
}

/// Host paths, injected from `--path.*`.
#[derive(Clone, Debug)]
pub struct Paths {
    pub procfs: PathBuf,
    pub sysfs: PathBuf,
    pub rootfs: PathBuf,
    pub udev_data: PathBuf,
}

impl Paths {
    pub fn proc(&self, rel: &str) -> PathBuf {
        self.procfs.join(rel)
    }
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.sysfs.join(rel)
    }
}

/// One collector. `update` writes this scrape's samples into `sink`, which
/// the caller has cleared. A collector keeps its own read buffers.
pub trait Collector: Send {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error>;
}

/// What a collector module registers: its name, default state, own flags
/// and constructor.
/// Builds a collector from the flags, host paths and shared state.
pub type Builder = fn(&ArgMatches, &Paths, &mut BuildContext) -> Result<Box<dyn Collector>, ConfigError>;

/// State shared by collectors while they are built: the eBPF object is
/// loaded once, by the first eBPF collector that asks for it.
#[derive(Default)]
pub struct BuildContext {
    ebpf: Option<Result<std::sync::Arc<crate::ebpf::Shared>, crate::ebpf::LoadError>>,
    /// Ask the kernel for BPF run-time statistics.
    pub bpf_stats: bool,
    /// Pod attribution is on: the kernel's BTF, read when the programs load.
    pub pods_btf: Option<PathBuf>,
    /// Pod attribution is on: where the Kubernetes API is.
    pub pods_source: Option<crate::pods::watch::Source>,
}

impl BuildContext {
    pub fn ebpf(&mut self) -> Result<std::sync::Arc<crate::ebpf::Shared>, crate::ebpf::LoadError> {
        let stats = self.bpf_stats;
        let btf = self.pods_btf.clone();
        self.ebpf.get_or_insert_with(|| crate::ebpf::Shared::load(stats, btf.as_deref())).clone()
    }
}

pub struct Definition {
    pub name: &'static str,
    pub enabled_by_default: bool,
    pub args: fn() -> Vec<Arg>,
    pub build: Builder,
}

fn no_args() -> Vec<Arg> {
    Vec::new()
}

macro_rules! simple {
    ($name:literal, $default:expr, $module:ident) => {
        Definition {
            name: $name,
            enabled_by_default: $default,
            args: no_args,
            build: |_m, p, _ctx| Ok(Box::new($module::Collector::new(p))),
        }
    };
}

macro_rules! with_flags {
    ($name:literal, $default:expr, $module:ident) => {
        Definition {
            name: $name,
            enabled_by_default: $default,
            args: $module::args,
            build: |m, p, _ctx| Ok(Box::new($module::Collector::new(m, p)?)),
        }
    };
}

macro_rules! ebpf {
    ($name:literal, $module:ident) => {
        Definition { name: $name, enabled_by_default: true, args: no_args, build: |_m, p, ctx| Ok(Box::new($module::new(p, ctx))) }
    };
}

/// Every collector node-agent has, with node_exporter's default states.
pub fn definitions() -> Vec<Definition> {
    vec![
        with_flags!("arp", true, arp),
        simple!("conntrack", true, conntrack),
        with_flags!("cpu", true, cpu),
        simple!("cpufreq", true, cpufreq),
        with_flags!("diskstats", true, diskstats),
        ebpf!("ebpf_block_io", ebpf_block_io),
        ebpf!("ebpf_oom_kills", ebpf_oom_kills),
        Definition {
            name: "ebpf_pods",
            enabled_by_default: true,
            args: ebpf_pods::args,
            build: |m, p, ctx| Ok(Box::new(ebpf_pods::new(m, p, ctx)?)),
        },
        ebpf!("ebpf_process", ebpf_process),
        ebpf!("ebpf_runqueue", ebpf_runqueue),
        ebpf!("ebpf_syscalls", ebpf_syscalls),
        ebpf!("ebpf_tcp_retransmits", ebpf_tcp_retransmits),
        simple!("entropy", true, entropy),
        simple!("filefd", true, filefd),
        with_flags!("filesystem", true, filesystem),
        with_flags!("hwmon", true, hwmon),
        simple!("loadavg", true, loadavg),
        simple!("meminfo", true, meminfo),
        with_flags!("netclass", true, netclass),
        with_flags!("netdev", true, netdev),
        with_flags!("netstat", true, netstat),
        simple!("os", true, os),
        simple!("pressure", true, pressure),
        simple!("schedstat", true, schedstat),
        simple!("selinux", true, selinux),
        simple!("sockstat", true, sockstat),
        simple!("softnet", true, softnet),
        with_flags!("stat", true, stat),
        with_flags!("textfile", true, textfile),
        simple!("thermal_zone", true, thermal_zone),
        simple!("time", true, time),
        simple!("timex", true, timex),
        simple!("udp_queues", true, udp_queues),
        simple!("uname", true, uname),
        with_flags!("vmstat", true, vmstat),
    ]
}
