//! `perf`: per-CPU kernel perf counters, as node_exporter 1.12.1's perf
//! collector (with hodgesds/perf-utils v0.7.0). At construction it opens,
//! with perf_event_open(2) for every selected CPU (`pid = -1, cpu = N`: all
//! processes on that CPU), the hardware events (`node_perf_cpucycles_total`,
//! `node_perf_instructions_total`, ...), the software events
//! (`node_perf_page_faults_total`, `node_perf_context_switches_total`, ...),
//! the hardware-cache events (`node_perf_cache_l1d_read_hits_total`, ...)
//! and, per `--collector.perf.tracepoint=<subsystem>:<event>`, one event
//! group of tracepoints (`node_perf_<subsystem>_<event>`); every scrape
//! reads the raw counts (not scaled for multiplexing, as node_exporter) into
//! samples labelled `cpu`. The event families are counters; the tracepoint
//! families are UNTYPED here: node_exporter exposes them as counters whose
//! name lacks `_total`, which prometheus-client (node-agent's exposition)
//! cannot write (it appends `_total` to every counter sample), so the type
//! line differs (`untyped` for `counter`) to keep the series name and value
//! identical.
//!
//! Decisions, each checked against node_exporter's and perf-utils' source:
//! - **An event that cannot be opened is skipped, not an error.** perf-utils
//!   gathers open errors but its `HasProfilers()` is `len(..) >= 0`, always
//!   true, so node_exporter's `if err != nil && !HasProfilers()` never fails:
//!   on a machine without a hardware PMU (a VM: no
//!   `/sys/bus/event_source/devices/cpu`) node_exporter starts, reports
//!   `node_scrape_collector_success{collector="perf"} 1` and simply exports
//!   no hardware and no cache families. node-agent does the same, and in
//!   addition logs what it could not open ONCE, at construction (one
//!   `tracing::warn!` line summing up events, CPUs and errno), where
//!   node_exporter is silent. Only when NOTHING requested could be opened
//!   (say, the hardware profilers alone on a VM without a PMU) does the
//!   collector report `node_scrape_collector_success 0` at every scrape,
//!   the reason logged once, where node_exporter reports 1 with no series:
//!   a collector that can never export anything should say so.
//! - **A tracepoint that cannot be set up fails the collector.**
//!   node_exporter's constructor returns the error (unknown tracepoint, no
//!   tracefs mount, perf_event_open refused), which makes node_exporter
//!   panic at start-up. node-agent keeps running instead: the reason is
//!   logged ONCE (warn, at construction), nothing else is opened, and every
//!   scrape returns [`Error::NoData`] (so `node_scrape_collector_success 0`,
//!   logged at debug only, not at every scrape).
//! - Malformed flags (`--collector.perf.cpus`, a tracepoint without exactly
//!   one `:`) are a [`ConfigError`]: node-agent refuses to start, as
//!   node_exporter does. Beyond node_exporter, these are refused too: a
//!   stride of 0 (an endless loop in node_exporter), CPU numbers above
//!   65535, empty tracepoint parts, tracepoint names that do not make a
//!   valid metric name, and two tracepoints making the same family name.
//!   Duplicate CPUs and tracepoints are counted once (node_exporter would
//!   export duplicates and fail the gather).
//! - Profiler lists: unknown names are logged and ignored; when none of the
//!   given names is known, the selection is empty, which perf-utils reads as
//!   "all" (a node_exporter quirk, kept). Events that node_exporter opens but
//!   never exports (bus cycles, CPU/task clock, alignment and emulation
//!   faults, L1I read hits, node cache) are not opened.
//! - A read error at scrape time fails the scrape of this collector (an
//!   [`Error::Io`]), as perf-utils' `Profile` returns it.
//! - Without `--collector.perf.cpus`, the CPUs are 0..N-1 with N the number
//!   of CPUs in the process's affinity mask (Go's `runtime.NumCPU`).
//!
//! perf_event_open(2) is called through `libc::syscall` with a
//! `#[repr(C)]` `perf_event_attr` of the kernel's first layout
//! (`PERF_ATTR_SIZE_VER0`, 64 bytes: every field used here is in it),
//! rather than a crate: the `perf-event2` crate would cover per-CPU and
//! tracepoint events, but its builder's defaults differ (it excludes kernel
//! events, adds `PERF_FORMAT_ID`) and it brings a dependency tree for what is
//! one syscall, one ioctl and a read of fixed layout here.
//! The attributes are perf-utils': counting events `disabled | exclude_hv |
//! inherit`, read format total-time-enabled and -running, enabled with
//! `PERF_EVENT_IOC_ENABLE`; a tracepoint group's leader `disabled |
//! exclude_hv`, its members `exclude_hv`, read format `PERF_FORMAT_GROUP`
//! plus both times, enabled with `PERF_IOC_FLAG_GROUP`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::flags::{self, BoolFlag, Flags, StringFlag, StringsFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const CPUS: StringFlag =
    StringFlag { name: "collector.perf.cpus", default: "", help: "List of CPUs from which perf metrics should be collected" };
pub const TRACEPOINT: StringsFlag =
    StringsFlag { name: "collector.perf.tracepoint", value_name: "VALUE", default: &[], help: "perf tracepoint that should be collected" };
pub const NO_HW: BoolFlag =
    BoolFlag { name: "collector.perf.disable-hardware-profilers", default: false, help: "disable perf hardware profilers" };
pub const HW: StringsFlag = StringsFlag {
    name: "collector.perf.hardware-profilers",
    value_name: "VALUE",
    default: &[],
    help: "perf hardware profilers that should be collected",
};
pub const NO_SW: BoolFlag =
    BoolFlag { name: "collector.perf.disable-software-profilers", default: false, help: "disable perf software profilers" };
pub const SW: StringsFlag = StringsFlag {
    name: "collector.perf.software-profilers",
    value_name: "VALUE",
    default: &[],
    help: "perf software profilers that should be collected",
};
pub const NO_CACHE: BoolFlag =
    BoolFlag { name: "collector.perf.disable-cache-profilers", default: false, help: "disable perf cache profilers" };
pub const CACHE: StringsFlag = StringsFlag {
    name: "collector.perf.cache-profilers",
    value_name: "VALUE",
    default: &[],
    help: "perf cache profilers that should be collected",
};

/// The highest CPU number accepted in `--collector.perf.cpus`.
pub const MAX_CPU: usize = 65535;

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_TYPE_HW_CACHE: u32 = 3;

const fn cache(id: u64, op: u64, result: u64) -> u64 {
    id | (op << 8) | (result << 16)
}
const L1D: u64 = 0;
const L1I: u64 = 1;
const LL: u64 = 2;
const DTLB: u64 = 3;
const ITLB: u64 = 4;
const BPU: u64 = 5;
const READ: u64 = 0;
const WRITE: u64 = 1;
const ACCESS: u64 = 0;
const MISS: u64 = 1;

/// `perf_event_attr` flag bits.
const ATTR_DISABLED: u64 = 1 << 0;
const ATTR_INHERIT: u64 = 1 << 1;
const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;
const PERF_FORMAT_TOTAL_TIME_ENABLED: u64 = 1 << 0;
const PERF_FORMAT_TOTAL_TIME_RUNNING: u64 = 1 << 1;
const PERF_FORMAT_GROUP: u64 = 1 << 3;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const PERF_EVENT_IOC_ENABLE: u32 = 0x2400; // _IO('$', 0)
const PERF_IOC_FLAG_GROUP: libc::c_int = 1;

/// Which kind of profiler an event belongs to (its flags and its table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Profiler {
    Hardware,
    Software,
    Cache,
}

impl Profiler {
    pub fn table(self) -> &'static [Event] {
        match self {
            Profiler::Hardware => HARDWARE,
            Profiler::Software => SOFTWARE,
            Profiler::Cache => CACHES,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Profiler::Hardware => "hardware",
            Profiler::Software => "software",
            Profiler::Cache => "cache",
        }
    }
}

/// One exported perf event: its name in node_exporter's profiler flags, its
/// family (after `node_perf_`), its help and its perf type and config.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    pub profiler_name: &'static str,
    pub family: &'static str,
    pub help: &'static str,
    pub type_: u32,
    pub config: u64,
}

const fn ev(profiler_name: &'static str, family: &'static str, help: &'static str, type_: u32, config: u64) -> Event {
    Event { profiler_name, family, help, type_, config }
}

/// node_exporter's hardware profilers (`BusCycles` is not among them).
pub static HARDWARE: &[Event] = &[
    ev("CpuCycles", "node_perf_cpucycles_total", "Number of CPU cycles (frequency scaled)", PERF_TYPE_HARDWARE, 0),
    ev("CpuInstr", "node_perf_instructions_total", "Number of CPU instructions", PERF_TYPE_HARDWARE, 1),
    ev("CacheRef", "node_perf_cache_refs_total", "Number of cache references (non frequency scaled)", PERF_TYPE_HARDWARE, 2),
    ev("CacheMisses", "node_perf_cache_misses_total", "Number of cache misses", PERF_TYPE_HARDWARE, 3),
    ev("BranchInstr", "node_perf_branch_instructions_total", "Number of CPU branch instructions", PERF_TYPE_HARDWARE, 4),
    ev("BranchMisses", "node_perf_branch_misses_total", "Number of CPU branch misses", PERF_TYPE_HARDWARE, 5),
    ev("StalledCyclesFrontend", "node_perf_stalled_cycles_frontend_total", "Number of stalled frontend CPU cycles", PERF_TYPE_HARDWARE, 7),
    ev("StalledCyclesBackend", "node_perf_stalled_cycles_backend_total", "Number of stalled backend CPU cycles", PERF_TYPE_HARDWARE, 8),
    ev("RefCpuCycles", "node_perf_ref_cpucycles_total", "Number of CPU cycles", PERF_TYPE_HARDWARE, 9),
];

/// node_exporter's software profilers.
pub static SOFTWARE: &[Event] = &[
    ev("PageFault", "node_perf_page_faults_total", "Number of page faults", PERF_TYPE_SOFTWARE, 2),
    ev("ContextSwitch", "node_perf_context_switches_total", "Number of context switches", PERF_TYPE_SOFTWARE, 3),
    ev("CpuMigration", "node_perf_cpu_migrations_total", "Number of CPU process migrations", PERF_TYPE_SOFTWARE, 4),
    ev("MinorFault", "node_perf_minor_faults_total", "Number of minor page faults", PERF_TYPE_SOFTWARE, 5),
    ev("MajorFault", "node_perf_major_faults_total", "Number of major page faults", PERF_TYPE_SOFTWARE, 6),
];

/// node_exporter's cache profilers (its default set is all of these).
pub static CACHES: &[Event] = &[
    ev(
        "L1DataReadHit",
        "node_perf_cache_l1d_read_hits_total",
        "Number L1 data cache read hits",
        PERF_TYPE_HW_CACHE,
        cache(L1D, READ, ACCESS),
    ),
    ev(
        "L1DataReadMiss",
        "node_perf_cache_l1d_read_misses_total",
        "Number L1 data cache read misses",
        PERF_TYPE_HW_CACHE,
        cache(L1D, READ, MISS),
    ),
    ev(
        "L1DataWriteHit",
        "node_perf_cache_l1d_write_hits_total",
        "Number L1 data cache write hits",
        PERF_TYPE_HW_CACHE,
        cache(L1D, WRITE, ACCESS),
    ),
    ev(
        "L1InstrReadMiss",
        "node_perf_cache_l1_instr_read_misses_total",
        "Number instruction L1 instruction read misses",
        PERF_TYPE_HW_CACHE,
        cache(L1I, READ, MISS),
    ),
    ev("LLReadHit", "node_perf_cache_ll_read_hits_total", "Number last level read hits", PERF_TYPE_HW_CACHE, cache(LL, READ, ACCESS)),
    ev("LLReadMiss", "node_perf_cache_ll_read_misses_total", "Number last level read misses", PERF_TYPE_HW_CACHE, cache(LL, READ, MISS)),
    ev("LLWriteHit", "node_perf_cache_ll_write_hits_total", "Number last level write hits", PERF_TYPE_HW_CACHE, cache(LL, WRITE, ACCESS)),
    ev(
        "LLWriteMiss",
        "node_perf_cache_ll_write_misses_total",
        "Number last level write misses",
        PERF_TYPE_HW_CACHE,
        cache(LL, WRITE, MISS),
    ),
    ev(
        "DataTLBReadHit",
        "node_perf_cache_tlb_data_read_hits_total",
        "Number of data TLB read hits",
        PERF_TYPE_HW_CACHE,
        cache(DTLB, READ, ACCESS),
    ),
    ev(
        "DataTLBReadMiss",
        "node_perf_cache_tlb_data_read_misses_total",
        "Number of data TLB read misses",
        PERF_TYPE_HW_CACHE,
        cache(DTLB, READ, MISS),
    ),
    ev(
        "DataTLBWriteHit",
        "node_perf_cache_tlb_data_write_hits_total",
        "Number of data TLB write hits",
        PERF_TYPE_HW_CACHE,
        cache(DTLB, WRITE, ACCESS),
    ),
    ev(
        "DataTLBWriteMiss",
        "node_perf_cache_tlb_data_write_misses_total",
        "Number of data TLB write misses",
        PERF_TYPE_HW_CACHE,
        cache(DTLB, WRITE, MISS),
    ),
    ev(
        "InstrTLBReadHit",
        "node_perf_cache_tlb_instr_read_hits_total",
        "Number instruction TLB read hits",
        PERF_TYPE_HW_CACHE,
        cache(ITLB, READ, ACCESS),
    ),
    ev(
        "InstrTLBReadMiss",
        "node_perf_cache_tlb_instr_read_misses_total",
        "Number instruction TLB read misses",
        PERF_TYPE_HW_CACHE,
        cache(ITLB, READ, MISS),
    ),
    ev("BPUReadHit", "node_perf_cache_bpu_read_hits_total", "Number BPU read hits", PERF_TYPE_HW_CACHE, cache(BPU, READ, ACCESS)),
    ev("BPUReadMiss", "node_perf_cache_bpu_read_misses_total", "Number BPU read misses", PERF_TYPE_HW_CACHE, cache(BPU, READ, MISS)),
];

/// The events a profiler flag selects, as node_exporter: no names → all;
/// otherwise the known names (in table order); unknown names are returned
/// (node_exporter logs them); when no name is known the selection is empty,
/// which perf-utils reads as all. Returns (events, unknown names).
pub fn select(table: &'static [Event], names: &[String]) -> (Vec<&'static Event>, Vec<String>) {
    let unknown: Vec<String> = names.iter().filter(|n| !table.iter().any(|e| e.profiler_name == n.as_str())).cloned().collect();
    let chosen: Vec<&'static Event> = table.iter().filter(|e| names.iter().any(|n| n == e.profiler_name)).collect();
    if chosen.is_empty() {
        (table.iter().collect(), unknown)
    } else {
        (chosen, unknown)
    }
}

fn atoi(s: &str) -> Result<usize, String> {
    let n: i64 = s.parse().map_err(|_| format!("strconv.Atoi: parsing {s:?}: invalid syntax"))?;
    usize::try_from(n).ok().filter(|&n| n <= MAX_CPU).ok_or_else(|| format!("CPU {s:?} out of range 0-{MAX_CPU}"))
}

/// `--collector.perf.cpus` as node_exporter reads it: comma-separated
/// items, each a CPU (`3`), a range (`1-5`) or a range with a stride
/// (`1-8:2` → 1,3,5,7; with more than one `:` the stride is ignored, as in
/// node_exporter). Duplicates are kept here (the caller counts a CPU once).
pub fn parse_cpus(flag: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for item in flag.split(',') {
        if !item.contains('-') {
            cpus.push(atoi(item)?);
            continue;
        }
        let stride_set: Vec<&str> = item.split(':').collect();
        let stride = if stride_set.len() == 2 {
            let s: i64 = stride_set[1].parse().map_err(|_| format!("strconv.Atoi: parsing {:?}: invalid syntax", stride_set[1]))?;
            usize::try_from(s).ok().filter(|&s| s > 0).ok_or_else(|| format!("invalid stride {s} in {item:?}"))?
        } else {
            1
        };
        let range: Vec<&str> = stride_set[0].split('-').collect();
        if range.len() != 2 {
            return Err(format!("invalid flag value {flag:?}"));
        }
        let (start, end) = (atoi(range[0])?, atoi(range[1])?);
        cpus.extend((start..=end).step_by(stride));
    }
    Ok(cpus)
}

/// A configured tracepoint, `<subsystem>:<event>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracepoint {
    pub subsystem: String,
    pub event: String,
}

impl Tracepoint {
    /// Its family: `node_perf_<subsystem>_<event>` (no `_total`).
    pub fn family(&self) -> String {
        format!("node_perf_{}_{}", self.subsystem, self.event)
    }
    pub fn help(&self) -> String {
        format!("Perf tracepoint {}:{}", self.subsystem, self.event)
    }
}

fn valid_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `--collector.perf.tracepoint` values: each exactly `<subsystem>:<event>`
/// (node_exporter's "invalid tracepoint config"); duplicates are dropped.
pub fn parse_tracepoints(values: &[String]) -> Result<Vec<Tracepoint>, String> {
    let mut out: Vec<Tracepoint> = Vec::new();
    for v in values {
        let parts: Vec<&str> = v.split(':').collect();
        if parts.len() != 2 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(format!("invalid tracepoint config {v}"));
        }
        let t = Tracepoint { subsystem: parts[0].to_string(), event: parts[1].to_string() };
        if !valid_metric_name(&t.family()) {
            return Err(format!("tracepoint {v}: {} is not a valid metric name", t.family()));
        }
        if let Some(other) = out.iter().find(|o| o.family() == t.family() && **o != t) {
            return Err(format!("tracepoints {v} and {}:{} would both be {}", other.subsystem, other.event, t.family()));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

/// The first tracefs mount point in a mounts table (perf-utils'
/// `TraceFSMount`).
pub fn parse_tracefs_mount(mounts: &str) -> Option<&str> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 3 && f[2] == "tracefs").then_some(f[1])
    })
}

/// A tracepoint's `id` file: its first line, a decimal u64.
pub fn parse_tracepoint_id(text: &str) -> Result<u64, String> {
    let first = text.lines().next().unwrap_or("");
    first.trim().parse().map_err(|_| format!("invalid tracepoint id {first:?}"))
}

/// The value of a single event's read (read_format: total time enabled and
/// running): `value, time_enabled, time_running`, native-endian u64s.
pub fn decode_single(buf: &[u8]) -> Option<u64> {
    u64s(buf).first().copied().filter(|_| buf.len() == 24)
}

/// The values of a group's read (`PERF_FORMAT_GROUP` with both times):
/// `nr, time_enabled, time_running, value[nr]`; `None` unless `nr == n`.
pub fn decode_group(buf: &[u8], n: usize) -> Option<Vec<u64>> {
    let v = u64s(buf);
    (v.len() == 3 + n && v[0] == n as u64).then(|| v[3..].to_vec())
}

fn u64s(buf: &[u8]) -> Vec<u64> {
    buf.chunks_exact(8).map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
}

/// Writes one CPU's event values: one counter sample `{cpu}` per event.
pub fn emit_events(sink: &mut Sink, cpu: &str, values: &[(&Event, u64)]) {
    for (e, v) in values {
        sink.family(e.family, e.help, Kind::Counter).sample(&[("cpu", cpu)], *v as f64);
    }
}

/// Writes one CPU's tracepoint values, in the configured order, as untyped
/// samples: node_exporter's counter name has no `_total`, which a counter of
/// prometheus-client (node-agent's exposition) would append.
pub fn emit_tracepoints(sink: &mut Sink, cpu: &str, tracepoints: &[(String, String)], values: &[u64]) {
    for ((family, help), v) in tracepoints.iter().zip(values) {
        sink.family(family, help, Kind::Untyped).sample(&[("cpu", cpu)], *v as f64);
    }
}

/// The collector's flags, parsed.
#[derive(Clone, Debug)]
pub struct Options {
    /// The CPUs to profile; `None`: 0..N-1 (N from the affinity mask).
    pub cpus: Option<Vec<usize>>,
    pub tracepoints: Vec<Tracepoint>,
    pub hardware: bool,
    pub hardware_profilers: Vec<String>,
    pub software: bool,
    pub software_profilers: Vec<String>,
    pub cache: bool,
    pub cache_profilers: Vec<String>,
}

impl Default for Options {
    /// node_exporter's defaults: every profiler on, all CPUs, no tracepoint.
    fn default() -> Self {
        Options {
            cpus: None,
            tracepoints: Vec::new(),
            hardware: true,
            hardware_profilers: Vec::new(),
            software: true,
            software_profilers: Vec::new(),
            cache: true,
            cache_profilers: Vec::new(),
        }
    }
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&CACHE, &CPUS, &NO_CACHE, &NO_HW, &NO_SW, &HW, &SW, &TRACEPOINT])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let cpus = CPUS.parse_with(f, |v| if v.is_empty() { Ok(None) } else { parse_cpus(v).map(Some) })?;
        let tracepoints = TRACEPOINT.parse_with(f, parse_tracepoints)?;
        Ok(Options {
            cpus,
            tracepoints,
            hardware: !NO_HW.get(f),
            hardware_profilers: HW.get(f),
            software: !NO_SW.get(f),
            software_profilers: SW.get(f),
            cache: !NO_CACHE.get(f),
            cache_profilers: CACHE.get(f),
        })
    }
}

/// `perf_event_attr`, the kernel's first layout (`PERF_ATTR_SIZE_VER0`).
#[repr(C)]
#[derive(Default)]
struct Attr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

fn perf_event_open(type_: u32, config: u64, flags: u64, read_format: u64, cpu: usize, group: Option<&OwnedFd>) -> std::io::Result<OwnedFd> {
    let attr = Attr {
        type_,
        size: std::mem::size_of::<Attr>() as u32,
        config,
        sample_type: PERF_SAMPLE_IDENTIFIER,
        read_format,
        flags,
        ..Attr::default()
    };
    let cpu = libc::c_int::try_from(cpu).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let group_fd: libc::c_int = group.map_or(-1, |g| g.as_raw_fd());
    // SAFETY: `attr` is a valid, fully initialised perf_event_attr of the
    // size it declares and outlives the call; the other arguments are plain
    // integers. The kernel only reads `attr`.
    let fd =
        unsafe { libc::syscall(libc::SYS_perf_event_open, &attr as *const Attr, -1 as libc::c_int, cpu, group_fd, PERF_FLAG_FD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the syscall succeeded, so `fd` is a new descriptor owned by
    // nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn enable(fd: &OwnedFd, flag: libc::c_int) -> std::io::Result<()> {
    // SAFETY: PERF_EVENT_IOC_ENABLE takes an integer argument and touches no
    // memory of ours; `fd` is an open perf event descriptor.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, flag) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

struct Counter {
    event: &'static Event,
    file: File,
}

struct CpuCounters {
    cpu: String,
    counters: Vec<Counter>,
}

struct TraceGroup {
    cpu: String,
    leader: File,
    _members: Vec<OwnedFd>,
}

pub struct Collector {
    cpus: Vec<CpuCounters>,
    /// (family, help) of each tracepoint, in group order.
    tracepoints: Vec<(String, String)>,
    groups: Vec<TraceGroup>,
    /// Why the collector cannot work (a tracepoint could not be set up).
    failed: Option<String>,
    buf: Vec<u8>,
    values: Vec<(&'static Event, u64)>,
}

/// The CPUs of the process's affinity mask, counted (Go's runtime.NumCPU).
fn num_cpu() -> usize {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    // SAFETY: `set` was filled by sched_getaffinity.
    let n = unsafe { libc::CPU_COUNT(&set) };
    usize::try_from(n).unwrap_or(1).max(1)
}

fn tracepoint_id(p: &Paths, t: &Tracepoint) -> Result<u64, String> {
    let mounts_path = p.proc("mounts");
    let mounts = crate::io::read_text(&mounts_path).map_err(|e| format!("Failed to get tracefs mount: {e}"))?;
    let mount = parse_tracefs_mount(&mounts).ok_or("Mount for tracefs not mounted")?;
    let id_path = std::path::Path::new(mount).join("events").join(&t.subsystem).join(&t.event).join("id");
    let text =
        crate::io::read_text(&id_path).map_err(|e| format!("Failed to get tracepoint config for {}:{}: {e}", t.subsystem, t.event))?;
    parse_tracepoint_id(&text)
}

fn open_groups(p: &Paths, tracepoints: &[Tracepoint], cpus: &[usize]) -> Result<Vec<TraceGroup>, String> {
    let ids = tracepoints.iter().map(|t| tracepoint_id(p, t)).collect::<Result<Vec<u64>, String>>()?;
    let format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING | PERF_FORMAT_GROUP;
    let mut groups = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let mut leader: Option<OwnedFd> = None;
        let mut members = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let flags = if leader.is_none() { ATTR_DISABLED | ATTR_EXCLUDE_HV } else { ATTR_EXCLUDE_HV };
            let fd = perf_event_open(PERF_TYPE_TRACEPOINT, id, flags, format, cpu, leader.as_ref())
                .map_err(|e| format!("opening tracepoint {}:{} on CPU {cpu}: {e}", tracepoints[i].subsystem, tracepoints[i].event))?;
            match leader {
                None => leader = Some(fd),
                Some(_) => members.push(fd),
            }
        }
        if let Some(leader) = leader {
            enable(&leader, PERF_IOC_FLAG_GROUP).map_err(|e| format!("enabling tracepoints on CPU {cpu}: {e}"))?;
            groups.push(TraceGroup { cpu: cpu.to_string(), leader: File::from(leader), _members: members });
        }
    }
    Ok(groups)
}

/// Families (without `node_perf_`) and the CPUs where they failed.
type FamiliesOnCpus<'a> = (BTreeSet<&'a str>, BTreeSet<usize>);

/// One line summing up the events that could not be opened.
fn summarize(failures: &[(Profiler, &'static Event, usize, String)]) -> String {
    let mut by: BTreeMap<(Profiler, &str), FamiliesOnCpus> = BTreeMap::new();
    for (prof, e, cpu, err) in failures {
        let entry = by.entry((*prof, err.as_str())).or_default();
        entry.0.insert(e.family.trim_start_matches("node_perf_"));
        entry.1.insert(*cpu);
    }
    by.iter()
        .map(|((prof, err), (fams, cpus))| {
            let fams: Vec<&str> = fams.iter().copied().collect();
            let cpus: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
            format!("{} [{}] on CPUs {}: {err}", prof.word(), fams.join(","), cpus.join(","))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let mut cpus: Vec<usize> = o.cpus.clone().unwrap_or_else(|| (0..num_cpu()).collect());
        let mut seen = BTreeSet::new();
        cpus.retain(|c| seen.insert(*c));
        let mut c = Collector {
            cpus: Vec::new(),
            tracepoints: o.tracepoints.iter().map(|t| (t.family(), t.help())).collect(),
            groups: Vec::new(),
            failed: None,
            buf: vec![0; 24 + 8 * o.tracepoints.len()],
            values: Vec::new(),
        };
        if !o.tracepoints.is_empty() {
            match open_groups(p, &o.tracepoints, &cpus) {
                Ok(g) => c.groups = g,
                Err(reason) => {
                    tracing::warn!(collector = "perf", %reason, "perf tracepoints could not be set up; the perf collector reports success 0 (node_exporter 1.12.1 would not start)");
                    c.failed = Some(reason);
                    return Ok(c);
                }
            }
        }
        let mut selected: Vec<(Profiler, Vec<&'static Event>)> = Vec::new();
        for (prof, on, names) in [
            (Profiler::Hardware, o.hardware, &o.hardware_profilers),
            (Profiler::Software, o.software, &o.software_profilers),
            (Profiler::Cache, o.cache, &o.cache_profilers),
        ] {
            if !on {
                continue;
            }
            let (events, unknown) = select(prof.table(), names);
            for u in unknown {
                tracing::warn!(collector = "perf", "Unknown {} profiler: {u}", prof.word());
            }
            selected.push((prof, events));
        }
        let mut failures = Vec::new();
        let counting = ATTR_DISABLED | ATTR_EXCLUDE_HV | ATTR_INHERIT;
        let format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
        for &cpu in &cpus {
            let mut counters = Vec::new();
            for (prof, events) in &selected {
                for &event in events {
                    match perf_event_open(event.type_, event.config, counting, format, cpu, None).and_then(|fd| enable(&fd, 0).map(|()| fd))
                    {
                        Ok(fd) => counters.push(Counter { event, file: File::from(fd) }),
                        Err(e) => failures.push((*prof, event, cpu, e.to_string())),
                    }
                }
            }
            c.cpus.push(CpuCounters { cpu: cpu.to_string(), counters });
        }
        if !failures.is_empty() {
            let opened = c.cpus.iter().any(|cpu| !cpu.counters.is_empty()) || !c.groups.is_empty();
            if opened {
                tracing::warn!(
                    collector = "perf",
                    "perf events unavailable, not exported (as node_exporter 1.12.1, which skips them): {}",
                    summarize(&failures)
                );
            } else {
                // Nothing asked for could be opened (hardware profilers only,
                // on a machine without a PMU): success 0, said once here.
                let reason = format!("no perf event could be opened: {}", summarize(&failures));
                tracing::warn!(collector = "perf", %reason, "the perf collector reports success 0 (node_exporter 1.12.1 reports 1 with no series)");
                c.failed = Some(reason);
            }
        }
        Ok(c)
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        if let Some(reason) = &self.failed {
            return Err(Error::NoData(format!("perf: {reason}")));
        }
        let path = std::path::Path::new("perf_event");
        for cpu in &mut self.cpus {
            self.values.clear();
            for counter in &mut cpu.counters {
                let buf = &mut self.buf[..24];
                let n = counter.file.read(buf).map_err(|e| Error::io(path, e))?;
                let v = decode_single(&buf[..n])
                    .ok_or_else(|| Error::parse(path, format!("short read of {} ({n} bytes)", counter.event.family)))?;
                self.values.push((counter.event, v));
            }
            emit_events(sink, &cpu.cpu, &self.values);
        }
        for g in &mut self.groups {
            let n = g.leader.read(&mut self.buf).map_err(|e| Error::io(path, e))?;
            let values = decode_group(&self.buf[..n], self.tracepoints.len())
                .ok_or_else(|| Error::parse(path, format!("unexpected tracepoint group read ({n} bytes) on CPU {}", g.cpu)))?;
            emit_tracepoints(sink, &g.cpu, &self.tracepoints, &values);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cpus_as_node_exporter() {
        assert_eq!(parse_cpus("1").unwrap(), vec![1]);
        assert_eq!(parse_cpus("1-5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse_cpus("10").unwrap(), vec![10]);
        assert_eq!(parse_cpus("10-12").unwrap(), vec![10, 11, 12]);
        assert_eq!(parse_cpus("10-20:5").unwrap(), vec![10, 15, 20]);
        assert_eq!(parse_cpus("1-8:2").unwrap(), vec![1, 3, 5, 7]);
        assert_eq!(parse_cpus("0,2-3").unwrap(), vec![0, 2, 3]);
        // Overlapping ranges keep duplicates here; `new` counts each CPU once.
        assert_eq!(parse_cpus("1-3,2-4").unwrap(), vec![1, 2, 3, 2, 3, 4]);
        // More than one ':' ignores the stride, as node_exporter.
        assert_eq!(parse_cpus("1-3:2:9").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_cpus("5-3").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpus("+2").unwrap(), vec![2]);
    }

    #[test]
    fn bad_cpus_are_errors() {
        for bad in ["", "a", "1,", "1:2", "1-", "-1", "1-2-3", "1-4:x", "1-4:0", "1-4:-1", " 1", "70000", "0-70000"] {
            assert!(parse_cpus(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_cpus("1-2-3").unwrap_err(), "invalid flag value \"1-2-3\"");
    }

    #[test]
    fn tracepoints_as_node_exporter() {
        let t = parse_tracepoints(&strs(&["sched:sched_kthread_stop", "sched:sched_process_fork", "sched:sched_kthread_stop"])).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0], Tracepoint { subsystem: "sched".into(), event: "sched_kthread_stop".into() });
        assert_eq!(t[1].family(), "node_perf_sched_sched_process_fork");
        assert_eq!(t[1].help(), "Perf tracepoint sched:sched_process_fork");
        assert!(parse_tracepoints(&strs(&["a_b:c", "a:b_c"])).is_err(), "same family twice");
        for bad in ["sched", "a:b:c", ":x", "x:", "a-b:c"] {
            assert!(parse_tracepoints(&strs(&[bad])).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_tracepoints(&strs(&["sched"])).unwrap_err(), "invalid tracepoint config sched");
    }

    #[test]
    fn profiler_names_select_events() {
        let (all, unknown) = select(HARDWARE, &[]);
        assert_eq!(all.len(), 9);
        assert!(unknown.is_empty());
        let (two, unknown) = select(SOFTWARE, &strs(&["ContextSwitch", "PageFault", "Bogus", "PageFault"]));
        assert_eq!(two.iter().map(|e| e.family).collect::<Vec<_>>(), ["node_perf_page_faults_total", "node_perf_context_switches_total"]);
        assert_eq!(unknown, ["Bogus"]);
        // Only unknown names: perf-utils reads the empty set as "all".
        let (all, unknown) = select(CACHES, &strs(&["BusCycles"]));
        assert_eq!(all.len(), 16);
        assert_eq!(unknown, ["BusCycles"]);
        // "BusCycles" is not one of node_exporter's hardware profilers.
        assert_eq!(select(HARDWARE, &strs(&["BusCycles"])).0.len(), 9);
        let (one, _) = select(CACHES, &strs(&["DataTLBWriteMiss"]));
        assert_eq!(one[0].config, 3 | (1 << 8) | (1 << 16));
        assert_eq!(one[0].type_, PERF_TYPE_HW_CACHE);
        let (one, _) = select(HARDWARE, &strs(&["RefCpuCycles"]));
        assert_eq!((one[0].family, one[0].config), ("node_perf_ref_cpucycles_total", 9));
        let (one, _) = select(SOFTWARE, &strs(&["MajorFault"]));
        assert_eq!((one[0].family, one[0].type_, one[0].config), ("node_perf_major_faults_total", PERF_TYPE_SOFTWARE, 6));
    }

    #[test]
    fn families_are_unique_and_counters() {
        let mut seen = BTreeSet::new();
        for e in HARDWARE.iter().chain(SOFTWARE).chain(CACHES) {
            assert!(seen.insert(e.family), "{}", e.family);
            assert!(e.family.starts_with("node_perf_") && e.family.ends_with("_total"), "{}", e.family);
        }
        assert_eq!(seen.len(), 30);
    }

    #[test]
    fn tracefs_mount_and_id() {
        let mounts = "proc /proc proc rw 0 0\ntracefs /sys/kernel/tracing tracefs rw,relatime 0 0\ntracefs /t2 tracefs rw 0 0\n";
        assert_eq!(parse_tracefs_mount(mounts), Some("/sys/kernel/tracing"));
        assert_eq!(parse_tracefs_mount("proc /proc proc rw 0 0\n"), None);
        assert_eq!(parse_tracepoint_id("312\n"), Ok(312));
        assert!(parse_tracepoint_id("x\n").is_err());
        assert!(parse_tracepoint_id("").is_err());
    }

    fn bytes(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn reads_decode() {
        assert_eq!(decode_single(&bytes(&[42, 100, 100])), Some(42));
        assert_eq!(decode_single(&bytes(&[42, 100])), None);
        assert_eq!(decode_group(&bytes(&[2, 10, 10, 7, 9]), 2), Some(vec![7, 9]));
        assert_eq!(decode_group(&bytes(&[3, 10, 10, 7, 9]), 2), None);
        assert_eq!(decode_group(&bytes(&[2, 10, 10, 7]), 2), None);
    }

    #[test]
    fn samples_from_values() {
        let mut sink = Sink::new();
        let (sw, _) = select(SOFTWARE, &strs(&["PageFault", "ContextSwitch"]));
        emit_events(&mut sink, "1", &[(sw[0], 12), (sw[1], 34)]);
        emit_events(&mut sink, "0", &[(sw[0], 5)]);
        let tps = parse_tracepoints(&strs(&["sched:sched_process_fork"])).unwrap();
        let tps: Vec<(String, String)> = tps.iter().map(|t| (t.family(), t.help())).collect();
        emit_tracepoints(&mut sink, "0", &tps, &[3]);
        let mut got = Vec::new();
        for f in sink.families() {
            for (labels, v) in f.samples() {
                let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                got.push(format!("{}{{{}}} {v}", f.name(), labels.join(",")));
            }
        }
        got.sort();
        assert_eq!(
            got,
            [
                "node_perf_context_switches_total{cpu=1} 34",
                "node_perf_page_faults_total{cpu=0} 5",
                "node_perf_page_faults_total{cpu=1} 12",
                "node_perf_sched_sched_process_fork{cpu=0} 3",
            ]
        );
    }

    /// Through node-agent's own text encoding (prometheus-client): a
    /// tracepoint family keeps node_exporter's name, without `_total`.
    #[test]
    fn tracepoint_families_are_exposed_under_node_exporters_name() {
        let mut sink = Sink::new();
        let tps = parse_tracepoints(&strs(&["sched:sched_process_fork"])).unwrap();
        let tps: Vec<(String, String)> = tps.iter().map(|t| (t.family(), t.help())).collect();
        emit_tracepoints(&mut sink, "0", &tps, &[3]);
        let mut text = String::new();
        expo::encode(vec![sink], expo::Format::Text, &mut text);
        assert!(text.contains("node_perf_sched_sched_process_fork{cpu=\"0\"} 3"), "{text}");
        assert!(text.contains("# TYPE node_perf_sched_sched_process_fork untyped\n"), "{text}");
        assert!(!text.contains("_total"), "{text}");
    }

    fn options(args: &[&str]) -> Result<Options, ConfigError> {
        let cmd = clap::Command::new("x").no_binary_name(true).args(Options::args());
        let m = cmd.try_get_matches_from(args).unwrap();
        Options::from_flags(&Flags::new(&m))
    }

    #[test]
    fn flags_are_the_catalog_s() {
        let ours: Vec<String> = Options::args().iter().map(|a| a.get_id().to_string()).filter(|n| !n.starts_with("no-")).collect();
        let theirs: Vec<&crate::catalog::FlagSpec> =
            crate::catalog::FLAGS.iter().filter(|f| f.collector == Some("perf") && !f.enables).collect();
        assert_eq!(ours.len(), theirs.len());
        for spec in theirs {
            assert!(ours.iter().any(|n| n == spec.name), "{} not declared", spec.name);
        }
        let o = options(&[]).unwrap();
        assert!(o.hardware && o.software && o.cache && o.cpus.is_none() && o.tracepoints.is_empty());
        let o = options(&[
            "--collector.perf.cpus=0-3:2,1",
            "--collector.perf.tracepoint=sched:sched_switch",
            "--collector.perf.tracepoint=syscalls:sys_enter_getppid",
            "--collector.perf.disable-hardware-profilers",
            "--collector.perf.software-profilers=PageFault",
            "--collector.perf.software-profilers=MinorFault",
            "--collector.perf.cache-profilers=LLReadMiss",
        ])
        .unwrap();
        assert_eq!(o.cpus, Some(vec![0, 2, 1]));
        assert_eq!(o.tracepoints.len(), 2);
        assert!(!o.hardware && o.software && o.cache);
        assert_eq!(o.software_profilers, ["PageFault", "MinorFault"]);
        assert_eq!(o.cache_profilers, ["LLReadMiss"]);
        assert!(options(&["--collector.perf.cpus=1-x"]).is_err());
        assert!(options(&["--collector.perf.tracepoint=sched"]).is_err());
    }

    #[test]
    fn a_failed_tracepoint_is_no_data_at_every_scrape() {
        let dir = std::env::temp_dir().join(format!("perf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A mounts table without tracefs: the tracepoint cannot be resolved.
        std::fs::write(dir.join("mounts"), "proc /proc proc rw 0 0\n").unwrap();
        let p = Paths { procfs: dir.clone(), sysfs: dir.clone(), rootfs: dir.clone(), udev_data: dir.clone() };
        let o = Options { tracepoints: parse_tracepoints(&strs(&["sched:sched_switch"])).unwrap(), ..Options::default() };
        let mut c = Collector::new(o, &p).unwrap();
        for _ in 0..2 {
            let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
            assert!(e.is_no_data() && e.to_string().contains("Mount for tracefs not mounted"), "{e}");
        }
        assert!(c.cpus.is_empty(), "nothing else opened");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn summary_is_one_line() {
        let (hw, _) = select(HARDWARE, &strs(&["CpuCycles", "CpuInstr"]));
        let f = vec![
            (Profiler::Hardware, hw[0], 0, "No such file or directory (os error 2)".to_string()),
            (Profiler::Hardware, hw[1], 0, "No such file or directory (os error 2)".to_string()),
            (Profiler::Hardware, hw[0], 1, "No such file or directory (os error 2)".to_string()),
        ];
        assert_eq!(summarize(&f), "hardware [cpucycles_total,instructions_total] on CPUs 0,1: No such file or directory (os error 2)");
    }
}
