//! Loading the eBPF object once per agent, with every probe's read-only
//! global set, and attaching programs. A program that cannot be loaded or
//! attached is reported down (`node_ebpf_program_up 0`, the error logged
//! once at warn, and why in `node_ebpf_program_down_reason{reason}`: a
//! [`Reason`]), never fatal. A seccomp filter refusing bpf(2) or
//! perf_event_open(2) is said once, at error, with the remedy. Dropping the
//! last handle detaches and unloads everything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_common::{Hook, Program, SkbDirection};

use crate::ebpf::kernel::{self, Call};
use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr, RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};
use expo::{Kind, Sink};

/// Why the eBPF object is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Built with `NODE_AGENT_SKIP_EBPF=1`: the binary embeds no programs.
    #[error("this node-agent was built without its eBPF programs (NODE_AGENT_SKIP_EBPF=1)")]
    NotBuilt,
    /// The kernel refused the object (or its maps): no privileges, no BPF.
    #[error("loading eBPF programs: {msg}")]
    Load { msg: String, reason: Reason },
}

/// Why a program is down: the `reason` label of
/// `node_ebpf_program_down_reason`, one of nine values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The binary embeds no programs (`NODE_AGENT_SKIP_EBPF=1`).
    NotBuilt,
    /// A seccomp filter refuses bpf(2) or perf_event_open(2).
    Seccomp,
    /// Refused (EPERM) and the capability is not held.
    Capability,
    /// Refused with the capability held and no seccomp filter to blame
    /// (an LSM, kernel lockdown, a sysctl).
    Denied,
    /// The verifier refused the program.
    Verifier,
    /// The running kernel lacks what the program needs.
    Kernel,
    /// Attaching failed otherwise (tracefs, the hook).
    Attach,
    /// The open-file limit leaves no descriptor for it (`crate::descriptors`).
    Descriptors,
    /// Anything else.
    Error,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::NotBuilt,
        Reason::Seccomp,
        Reason::Capability,
        Reason::Denied,
        Reason::Verifier,
        Reason::Kernel,
        Reason::Attach,
        Reason::Descriptors,
        Reason::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::NotBuilt => "not_built",
            Reason::Seccomp => "seccomp",
            Reason::Capability => "capability",
            Reason::Denied => "denied",
            Reason::Verifier => "verifier",
            Reason::Kernel => "kernel",
            Reason::Attach => "attach",
            Reason::Descriptors => "descriptors",
            Reason::Error => "error",
        }
    }
}

/// An error's message with its causes (aya's top-level message alone
/// drops the errno), and the first OS error number among them.
fn chain(e: &(dyn std::error::Error + 'static)) -> (String, Option<i32>) {
    fn io(c: &(dyn std::error::Error + 'static)) -> Option<i32> {
        c.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error)
    }
    let mut msg = e.to_string();
    let mut errno = io(e);
    let mut cur = e.source();
    while let Some(c) = cur {
        errno = errno.or(io(c));
        let text = c.to_string();
        // thiserror's `{0}` repeats a cause in its parent's message.
        if !msg.ends_with(&text) {
            msg = format!("{msg}: {text}");
        }
        cur = c.source();
    }
    (msg, errno)
}

/// Why `call` failed with `errno`, given the effective capabilities held
/// (`needed`: the capability the call needs; SYS_ADMIN stands in for it).
pub fn classify(call: Call, errno: Option<i32>, caps: u64, refused_by_seccomp: impl Fn(Call) -> bool) -> Reason {
    use crate::caps::{has, BPF, PERFMON, SYS_ADMIN};
    let needed = match call {
        Call::Bpf => BPF,
        Call::PerfEventOpen => PERFMON,
    };
    match errno {
        Some(libc::EMFILE) | Some(libc::ENFILE) => Reason::Descriptors,
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS) if refused_by_seccomp(call) => Reason::Seccomp,
        Some(libc::EPERM) if !has(caps, needed) && !has(caps, SYS_ADMIN) => Reason::Capability,
        Some(libc::EPERM) => Reason::Denied,
        Some(libc::ENOSYS) => Reason::Kernel,
        _ => Reason::Error,
    }
}

/// What a cluster admin can do about a seccomp filter refusing `call`.
pub fn seccomp_remedy(call: Call) -> String {
    format!(
        "the seccomp profile of the container refuses {}(2) although the capability is held: run the agent under the seccomp profile \
         node-agent ships (`node-agent seccomp-profile`; deploy/overlays/seccomp-profile installs it on each node and sets \
         seccompProfile type Localhost), or with seccompProfile type Unconfined (deploy/overlays/seccomp-unconfined). \
         RuntimeDefault allows bpf and perf_event_open with CAP_BPF and CAP_PERFMON on containerd 1.7+, containerd 1.6 since \
         2022 (1.6.20 as Debian 12 ships it) and Docker 23+, not on CRI-O, podman 4 or older containerd",
        call.name()
    )
}

/// Says once per process, at error, that seccomp keeps the programs down.
fn log_seccomp_once(call: Call) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::error!(syscall = call.name(), "eBPF programs are down: {}", seccomp_remedy(call));
    }
}

/// The reason of a failed bpf(2) or perf_event_open(2) step, logging the
/// seccomp remedy once when that is it.
fn reason_of(call: Call, errno: Option<i32>) -> Reason {
    let r = classify(call, errno, crate::caps::effective(), kernel::seccomp_refuses);
    if r == Reason::Seccomp {
        log_seccomp_once(call);
    }
    r
}

impl LoadError {
    pub fn reason(&self) -> Reason {
        match self {
            LoadError::NotBuilt => Reason::NotBuilt,
            LoadError::Load { reason, .. } => *reason,
        }
    }
}

/// Why one program is down.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Object(#[from] LoadError),
    #[error("no program {0} in the object")]
    Missing(&'static str),
    #[error("program {program}: {msg}")]
    Type { program: &'static str, msg: String },
    /// The verifier (or the kernel) refused the program; its log is kept.
    #[error("loading: {msg}")]
    Load { msg: String, reason: Reason },
    #[error("attaching to {hook}: {msg}")]
    Attach { hook: String, msg: String, reason: Reason },
    #[error("eBPF state poisoned by an earlier panic")]
    Poisoned,
    /// The running kernel lacks what the program needs (never attached).
    #[error("not on this kernel: {0}")]
    Kernel(String),
    /// The open-file limit leaves it no descriptor (never loaded).
    #[error("{0}")]
    Descriptors(String),
}

impl AttachError {
    pub fn reason(&self) -> Reason {
        match self {
            AttachError::Object(e) => e.reason(),
            AttachError::Load { reason, .. } | AttachError::Attach { reason, .. } => *reason,
            AttachError::Kernel(_) => Reason::Kernel,
            AttachError::Descriptors(_) => Reason::Descriptors,
            AttachError::Missing(_) | AttachError::Type { .. } | AttachError::Poisoned => Reason::Error,
        }
    }
}

/// The read-only globals to set before loading: symbol name and bytes;
/// the maps sized at load time for this node; the node's cgroup v2 root,
/// where cgroup programs attach; and the descriptors the object may take
/// (`crate::descriptors`).
#[derive(Debug, Default, Clone)]
pub struct Globals(
    Vec<(&'static str, Vec<u8>)>,
    Vec<(&'static str, u32)>,
    Option<std::path::PathBuf>,
    Option<crate::descriptors::Ceiling>,
    Vec<(&'static str, &'static str)>,
);

impl Globals {
    /// Sets global `name` to `value`'s bytes.
    pub fn set<T: aya::Pod>(&mut self, name: &'static str, value: &T) {
        // SAFETY: `T: Pod` is plain data without padding bytes of
        // undefined value (explicit padding fields), so its bytes may be read.
        let bytes = unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, bytes.to_vec()));
    }

    /// Creates map `name` with `entries` entries instead of the object's
    /// `max_entries` (at least 1).
    pub fn max_entries(&mut self, name: &'static str, entries: u32) {
        self.1.retain(|(n, _)| *n != name);
        self.1.push((name, entries.max(1)));
    }

    /// Program `name` is the object's function `symbol` (a variant of it
    /// for this kernel); it keeps its name everywhere else.
    pub fn symbol(&mut self, name: &'static str, symbol: &'static str) {
        self.4.retain(|(n, _)| *n != name);
        self.4.push((name, symbol));
    }

    /// The cgroup v2 root the cgroup programs attach to.
    pub fn cgroup_root(&mut self, root: Option<std::path::PathBuf>) {
        self.2 = root;
    }

    /// Loads the object, and attaches each program, only while the
    /// process's descriptors stay under `ceiling`; what does not fit is
    /// down with the reason `descriptors`.
    pub fn descriptors(&mut self, ceiling: Option<crate::descriptors::Ceiling>) {
        self.3 = ceiling;
    }
}

/// aya-log's ring buffer, and the size we give it.
pub const LOG_MAP: &str = "AYA_LOGS";
const LOG_RING_BYTES: u32 = 16 << 10;

/// The loaded object, shared by the eBPF collectors.
pub struct Shared {
    ebpf: Mutex<Ebpf>,
    /// Programs attached so far, by name (collectors may share programs).
    attached: Mutex<HashMap<&'static str, Result<(), AttachError>>>,
    stats: bool,
    _stats_fd: Option<std::os::fd::OwnedFd>,
    log_stop: Arc<AtomicBool>,
    /// The maps' figures, written by the first probe attached (one place
    /// for the whole object: the maps are shared).
    map_stats: crate::ebpf::map_stats::MapStats,
    maps_claimed: AtomicBool,
    /// The node's cgroup v2 root, for cgroup programs.
    cgroup_root: Option<std::path::PathBuf>,
    /// A program is loaded only while it fits under this.
    fds: Option<crate::descriptors::Ceiling>,
    /// Programs served by another function of the object (`Globals::symbol`).
    symbols: Vec<(&'static str, &'static str)>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.log_stop.store(true, Ordering::Relaxed);
    }
}

/// Forwards aya-log records from the programs to `tracing`, at debug.
struct LogBridge;

impl log::Log for LogBridge {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        tracing::debug!(target: "node_agent::ebpf::program", level = %record.level(), "{}", record.args());
    }
    fn flush(&self) {}
}

impl Shared {
    /// Loads `object` with `globals` set. `stats` asks the kernel for
    /// run-time statistics of BPF programs for as long as the agent runs.
    pub fn load(object: &[u8], globals: &Globals, stats: bool) -> Result<Arc<Shared>, LoadError> {
        if object.is_empty() {
            return Err(LoadError::NotBuilt);
        }
        if let Some(ceiling) = globals.3 {
            // Every map of the object is created at load (a descriptor
            // each), whichever probes are on.
            let maps = aya_obj::Object::parse(object).map(|o| o.maps.len()).unwrap_or(agent_common::MAPS.len() + 2);
            let need = maps + crate::descriptors::OBJECT_EXTRA;
            ceiling
                .fits_now(need, &format!("the eBPF object ({maps} maps)"))
                .map_err(|msg| LoadError::Load { msg, reason: Reason::Descriptors })?;
        }
        let mut loader = EbpfLoader::new();
        // No CO-RE relocations are used (offsets come from tracefs and the
        // BTF parse of pod attribution), so aya need not use the kernel's BTF.
        loader.btf(None);
        for (name, bytes) in &globals.0 {
            loader.override_global(name, bytes.as_slice(), true);
        }
        // aya-log's ring buffer is 128 KiB, and a ring buffer's pages are
        // all resident once mapped (its data twice): 260 kB of the agent's
        // RSS for the rare warnings our programs log. 16 KiB holds dozens.
        loader.map_max_entries(LOG_MAP, LOG_RING_BYTES);
        for (name, entries) in &globals.1 {
            loader.map_max_entries(name, *entries);
        }
        let mut ebpf = loader.load(object).map_err(|e| {
            let (msg, errno) = chain(&e);
            LoadError::Load { msg, reason: reason_of(Call::Bpf, errno) }
        })?;
        let log_stop = Arc::new(AtomicBool::new(false));
        match aya_log::EbpfLogger::init_with_logger(&mut ebpf, LogBridge) {
            Ok(mut logger) => {
                let stop = Arc::clone(&log_stop);
                let _ = std::thread::Builder::new().name("ebpf-log".into()).spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        logger.flush();
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
            }
            Err(e) => tracing::debug!(err = %e, "eBPF programs log nothing (no aya-log buffer)"),
        }
        let stats_fd = if stats {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!(err = %e, "cannot enable BPF run-time statistics");
                    None
                }
            }
        } else {
            None
        };
        let stats = stats_fd.is_some() || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|s| s.trim() == "1");
        Ok(Arc::new(Shared {
            ebpf: Mutex::new(ebpf),
            attached: Mutex::new(HashMap::new()),
            stats,
            _stats_fd: stats_fd,
            log_stop,
            map_stats: Default::default(),
            maps_claimed: AtomicBool::new(false),
            cgroup_root: globals.2.clone(),
            fds: globals.3,
            symbols: globals.4.clone(),
        }))
    }

    /// The object's function that serves program `name`.
    fn symbol<'a>(&self, name: &'a str) -> &'a str {
        self.symbols.iter().find(|(n, _)| *n == name).map_or(name, |(_, s)| *s)
    }

    /// The loaded object, locked.
    pub fn lock(&self) -> Option<MutexGuard<'_, Ebpf>> {
        self.ebpf.lock().ok()
    }

    /// Loads and attaches a program, once: later calls return the first
    /// call's result.
    pub fn attach(&self, program: &Program) -> Result<(), AttachError> {
        let mut attached = self.attached.lock().map_err(|_| AttachError::Poisoned)?;
        if let Some(r) = attached.get(program.name) {
            return r.clone();
        }
        let r = self.attach_now(program);
        attached.insert(program.name, r.clone());
        r
    }

    fn attach_now(&self, program: &Program) -> Result<(), AttachError> {
        if let Some(ceiling) = self.fds {
            ceiling.fits_now(crate::descriptors::PER_PROGRAM, &format!("program {}", program.name)).map_err(AttachError::Descriptors)?;
        }
        let mut ebpf = self.lock().ok_or(AttachError::Poisoned)?;
        let name = program.name;
        let prog = ebpf.program_mut(self.symbol(name)).ok_or(AttachError::Missing(name))?;
        let kind = |e: aya::programs::ProgramError| AttachError::Type { program: name, msg: e.to_string() };
        // A program the kernel refuses to load: the verifier (EINVAL,
        // EACCES with a log), or bpf(2) itself refused.
        let load = |e: aya::programs::ProgramError| {
            let (msg, errno) = chain(&e);
            let reason = match errno {
                Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EMFILE) | Some(libc::ENFILE) => reason_of(Call::Bpf, errno),
                _ if matches!(e, aya::programs::ProgramError::LoadError { .. }) => Reason::Verifier,
                _ => Reason::Error,
            };
            AttachError::Load { msg, reason }
        };
        // Tracepoints attach through perf_event_open(2), raw tracepoints
        // through bpf(2).
        let attach = |hook: String, call: Call, e: aya::programs::ProgramError| {
            let (msg, errno) = chain(&e);
            let reason = match errno {
                Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS) | Some(libc::EMFILE) | Some(libc::ENFILE) => {
                    reason_of(call, errno)
                }
                _ => Reason::Attach,
            };
            AttachError::Attach { hook, msg, reason }
        };
        match program.hook {
            Hook::TracePoint(category, event) => {
                let p: &mut TracePoint = prog.try_into().map_err(kind)?;
                p.load().map_err(load)?;
                p.attach(category, event).map_err(|e| attach(format!("{category}:{event}"), Call::PerfEventOpen, e))?;
            }
            Hook::RawTracePoint(event) => {
                let p: &mut RawTracePoint = prog.try_into().map_err(kind)?;
                p.load().map_err(load)?;
                p.attach(event).map_err(|e| attach(format!("raw tracepoint {event}"), Call::Bpf, e))?;
            }
            Hook::Run => {
                // Loaded only: the probe runs it (`Shared::run`).
                let p: &mut RawTracePoint = prog.try_into().map_err(kind)?;
                p.load().map_err(load)?;
            }
            Hook::CgroupSkb(_) | Hook::CgroupSockAddr(_) => {
                // Loading a cgroup skb or socket-address program needs
                // CAP_NET_ADMIN; attaching it, the cgroup directory opened
                // (read-only is enough).
                let root = self.cgroup_root.as_ref().ok_or_else(|| AttachError::Kernel("no cgroup v2 hierarchy mounted".into()))?;
                let what = match program.hook {
                    Hook::CgroupSkb(dir) => format!("{dir:?}"),
                    _ => "sendmsg".to_string(),
                };
                let hook = format!("cgroup {} {what}", root.display());
                let cgroup = std::fs::File::open(root).map_err(|e| AttachError::Attach {
                    hook: hook.clone(),
                    msg: e.to_string(),
                    reason: if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                        Reason::Descriptors
                    } else {
                        Reason::Attach
                    },
                })?;
                let needs_net_admin = |e: aya::programs::ProgramError| {
                    let (msg, errno) = chain(&e);
                    match errno {
                        Some(libc::EPERM) if !crate::caps::has(crate::caps::effective(), crate::caps::NET_ADMIN) => AttachError::Load {
                            msg: format!("{msg} (a cgroup network program needs CAP_NET_ADMIN)"),
                            reason: Reason::Capability,
                        },
                        _ => load(e),
                    }
                };
                // A bpf_link (Linux 5.7+) always runs beside the cgroup's
                // other programs, and takes no attach flags (the kernel
                // refuses BPF_F_ALLOW_MULTI there with EINVAL).
                match program.hook {
                    Hook::CgroupSkb(dir) => {
                        let p: &mut CgroupSkb = prog.try_into().map_err(kind)?;
                        p.load().map_err(needs_net_admin)?;
                        let t = match dir {
                            SkbDirection::Ingress => CgroupSkbAttachType::Ingress,
                            SkbDirection::Egress => CgroupSkbAttachType::Egress,
                        };
                        p.attach(&cgroup, t, CgroupAttachMode::Single).map_err(|e| attach(hook, Call::Bpf, e))?;
                    }
                    _ => {
                        // The attach type (sendmsg4 or sendmsg6) is the
                        // program's section's, given at load.
                        let p: &mut CgroupSockAddr = prog.try_into().map_err(kind)?;
                        p.load().map_err(needs_net_admin)?;
                        p.attach(&cgroup, CgroupAttachMode::Single).map_err(|e| attach(hook, Call::Bpf, e))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs loaded program `name` (a [`Hook::Run`] one) once per argument
    /// array (BPF_PROG_TEST_RUN): the eBPF lock is held throughout.
    pub fn run(&self, name: &str, batches: impl Iterator<Item = [u64; 12]>) -> Result<usize, AttachError> {
        use aya::programs::{RawTracePointRunOptions, TestRun};
        let mut ebpf = self.lock().ok_or(AttachError::Poisoned)?;
        let prog: &mut RawTracePoint = ebpf
            .program_mut(self.symbol(name))
            .ok_or_else(|| AttachError::Type { program: "run", msg: format!("no program {name}") })?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| AttachError::Type { program: "run", msg: e.to_string() })?;
        let mut runs = 0;
        for args in batches {
            prog.test_run(RawTracePointRunOptions { args, cpu: None }).map_err(|e| {
                let (msg, errno) = chain(&e);
                AttachError::Load { msg, reason: reason_of(Call::Bpf, errno) }
            })?;
            runs += 1;
        }
        Ok(runs)
    }

    /// What the kernel says of a loaded program, in one
    /// BPF_OBJ_GET_INFO_BY_FD call: the runs it skipped because another BPF
    /// program was running on that CPU (`recursion_misses`, Linux 5.12+:
    /// events the probe could not see) and, when run-time statistics are on
    /// (kernel.bpf_stats_enabled), its run time and runs.
    pub fn program_stats(&self, program: &str) -> Option<ProgramStats> {
        use std::os::fd::{AsFd, AsRawFd};
        let ebpf = self.lock()?;
        let fd = ebpf.program(self.symbol(program))?.fd().ok()?.as_fd().as_raw_fd();
        #[repr(C)]
        struct InfoAttr {
            bpf_fd: u32,
            info_len: u32,
            info: u64,
        }
        // SAFETY: bpf_prog_info is plain integers; all-zero is valid.
        let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
        let mut attr = InfoAttr { bpf_fd: fd as u32, info_len: std::mem::size_of_val(&info) as u32, info: &mut info as *mut _ as u64 };
        // SAFETY: BPF_OBJ_GET_INFO_BY_FD (15) writes at most info_len bytes
        // into `info`, which lives until after the call; its pointer fields
        // are zero, so the kernel copies out nothing through them.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, 15, &mut attr as *mut InfoAttr, std::mem::size_of::<InfoAttr>()) };
        (rc == 0).then(|| ProgramStats {
            misses: info.recursion_misses,
            run: self.stats.then(|| (std::time::Duration::from_nanos(info.run_time_ns).as_secs_f64(), info.run_cnt)),
        })
    }

    /// Notes the entries a collector counted reading `map` whole, for the
    /// next `node_ebpf_map_entries` ([`crate::ebpf::map_stats::MapStats::note_entries`]).
    pub fn note_entries(&self, map: &'static str, entries: usize) {
        self.map_stats.note_entries(map, entries as u64);
    }

    /// Writes the `node_ebpf_map_*` families of every map of the object.
    pub fn map_metrics(&self, sink: &mut Sink) {
        if let Some(ebpf) = self.lock() {
            self.map_stats.write(&ebpf, sink);
        }
    }
}

/// A loaded program's figures from the kernel ([`Shared::program_stats`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgramStats {
    /// Runs skipped for recursion (`recursion_misses`).
    pub misses: u64,
    /// (seconds, runs) while run-time statistics are on.
    pub run: Option<(f64, u64)>,
}

/// The programs of one probe collector and their state.
pub struct Probe {
    pub shared: Option<Arc<Shared>>,
    programs: Vec<(&'static str, Result<(), AttachError>)>,
    /// This probe writes the object's `node_ebpf_map_*` families (the
    /// first probe attached to it does).
    reports_maps: bool,
    /// Which of its programs this probe reports (`node_ebpf_program_*`).
    reports: Reports,
}

/// The programs the agent's probes report, by name: a program several
/// probes attach (pod attribution shares the node probes' programs) is
/// reported by one, so that each has one series per family.
#[derive(Debug, Default)]
pub struct Claims(Mutex<std::collections::HashSet<&'static str>>);

impl Claims {
    fn lock(&self) -> MutexGuard<'_, std::collections::HashSet<&'static str>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Which of a probe's programs it reports.
#[derive(Debug)]
enum Reports {
    /// All of them (a probe made outside the agent's registry: tests, the bench).
    All,
    /// Those it claimed first, when it was made.
    Claimed(std::collections::HashSet<&'static str>),
    /// Those no other probe claimed, as it stands when the probe reports
    /// (every probe is made by then): pod attribution's, whose shared
    /// programs are the node probes' to report while those are on.
    Unclaimed(Arc<Claims>),
}

impl Probe {
    /// Attaches `programs`; failures are logged once and reported down.
    pub fn attach(shared: Result<Arc<Shared>, LoadError>, programs: &[Program]) -> Probe {
        match shared {
            Ok(s) => {
                let programs = programs
                    .iter()
                    .map(|p| {
                        let r = s.attach(p);
                        if let Err(e) = &r {
                            tracing::warn!(program = p.name, err = %e, "eBPF program down");
                        }
                        (p.name, r)
                    })
                    .collect();
                let reports_maps = !s.maps_claimed.swap(true, Ordering::Relaxed);
                Probe { shared: Some(s), programs, reports_maps, reports: Reports::All }
            }
            Err(e) => {
                for p in programs {
                    tracing::warn!(program = p.name, err = %e, "eBPF program down");
                }
                Probe {
                    shared: None,
                    programs: programs.iter().map(|p| (p.name, Err(AttachError::Object(e.clone())))).collect(),
                    reports_maps: false,
                    reports: Reports::All,
                }
            }
        }
    }

    /// Programs the running kernel cannot serve (`why`): reported down,
    /// logged once, never loaded.
    pub fn down(programs: &[Program], why: &str) -> Probe {
        for p in programs {
            tracing::warn!(program = p.name, err = why, "eBPF program down: not on this kernel");
        }
        Probe {
            shared: None,
            programs: programs.iter().map(|p| (p.name, Err(AttachError::Kernel(why.to_string())))).collect(),
            reports_maps: false,
            reports: Reports::All,
        }
    }

    /// Reports only the programs no probe claimed before it (claiming them).
    pub fn claim(mut self, claims: &Claims) -> Probe {
        let mut taken = claims.lock();
        self.reports = Reports::Claimed(self.programs.iter().map(|(n, _)| *n).filter(|n| taken.insert(n)).collect());
        self
    }

    /// Reports only the programs no probe claims, as that stands at each
    /// scrape (see [`Reports::Unclaimed`]).
    pub fn defer_to(mut self, claims: Arc<Claims>) -> Probe {
        self.reports = Reports::Unclaimed(claims);
        self
    }

    fn reports(&self, program: &str) -> bool {
        match &self.reports {
            Reports::All => true,
            Reports::Claimed(mine) => mine.contains(program),
            Reports::Unclaimed(claims) => !claims.lock().contains(program),
        }
    }

    /// All programs attached.
    pub fn up(&self) -> bool {
        self.shared.is_some() && self.programs.iter().all(|(_, r)| r.is_ok())
    }

    /// Why each program that is down is down.
    pub fn errors(&self) -> impl Iterator<Item = (&'static str, &AttachError)> {
        self.programs.iter().filter_map(|(n, r)| r.as_ref().err().map(|e| (*n, e)))
    }

    /// The loaded object, when every program is up.
    pub fn ebpf(&self) -> Option<&Arc<Shared>> {
        self.shared.as_ref().filter(|_| self.up())
    }

    /// Writes `node_ebpf_program_up` and, when enabled, the run statistics
    /// (and, from the first probe attached, the maps' figures).
    pub fn self_metrics(&self, sink: &mut Sink) {
        if let Some(s) = self.shared.as_ref().filter(|_| self.reports_maps) {
            s.map_metrics(sink);
        }
        for (name, r) in self.programs.iter().filter(|(n, _)| self.reports(n)) {
            sink.family("node_ebpf_program_up", "Whether the eBPF program is loaded and attached (1) or not (0).", Kind::Gauge)
                .sample(&[("program", name)], if r.is_ok() { 1.0 } else { 0.0 });
            if let Err(e) = r {
                sink.family(
                    "node_ebpf_program_down_reason",
                    "Why the eBPF program is down (1 while it is; absent while it is up): seccomp, capability, denied, verifier, kernel, attach, descriptors (the open-file limit leaves it none), not_built or error. The agent's log has the error.",
                    Kind::Gauge,
                )
                .sample(&[("program", name), ("reason", e.reason().label())], 1.0);
                continue;
            }
            let Some(stats) = self.shared.as_ref().and_then(|s| s.program_stats(name)) else { continue };
            sink.family(
                    "node_ebpf_program_misses_total",
                    "Runs of the eBPF program the kernel skipped because another BPF program was running on that CPU: events the probe did not see.",
                    Kind::Counter,
                )
            .sample(&[("program", name)], stats.misses as f64);
            if let Some((secs, runs)) = stats.run {
                sink.family(
                    "node_ebpf_program_run_seconds_total",
                    "Time the kernel spent running the eBPF program (kernel.bpf_stats_enabled).",
                    Kind::Counter,
                )
                .sample(&[("program", name)], secs);
                sink.family("node_ebpf_program_runs_total", "Runs of the eBPF program (kernel.bpf_stats_enabled).", Kind::Counter)
                    .sample(&[("program", name)], runs as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::{BPF, PERFMON, SYS_ADMIN};

    const EPERM: Option<i32> = Some(libc::EPERM);

    /// The programs a probe writes `node_ebpf_program_up` for.
    fn reported(p: &Probe) -> Vec<String> {
        let mut sink = Sink::new();
        p.self_metrics(&mut sink);
        let families = sink.families();
        let up = families.iter().find(|f| f.name() == "node_ebpf_program_up");
        up.map(|f| f.samples().map(|(l, _)| l[0].1.to_string()).collect()).unwrap_or_default()
    }

    #[test]
    fn a_program_two_probes_share_is_reported_by_one() {
        let program = |name: &'static str| Program::raw(name, "tp");
        let (a, b, own) = (program("a"), program("b"), program("own"));
        let claims = Arc::new(Claims::default());
        let pods = Probe::down(&[a, b, own], "x").defer_to(Arc::clone(&claims));
        let first = Probe::down(&[a], "x").claim(&claims);
        let second = Probe::down(&[a, b], "x").claim(&claims);
        assert_eq!(reported(&first), ["a"]);
        assert_eq!(reported(&second), ["b"], "a is the first probe's");
        assert_eq!(reported(&pods), ["own"], "the deferring probe reports what no other probe claimed");
        let alone = Probe::down(&[a, own], "x").defer_to(Arc::new(Claims::default()));
        assert_eq!(reported(&alone), ["a", "own"], "and all of its programs when no other probe has them");
        assert_eq!(reported(&Probe::down(&[a], "x")), ["a"], "a probe outside the registry reports all");
    }

    #[test]
    fn refusals_are_told_apart() {
        let with = |caps: &[u32]| caps.iter().fold(0u64, |s, c| s | 1 << c);
        // A filter refusing the call comes first, whatever is held.
        assert_eq!(classify(Call::Bpf, EPERM, with(&[BPF, PERFMON]), |_| true), Reason::Seccomp);
        assert_eq!(classify(Call::PerfEventOpen, Some(libc::ENOSYS), with(&[BPF, PERFMON]), |c| c == Call::PerfEventOpen), Reason::Seccomp);
        // No filter: the capability, or something else that denies.
        assert_eq!(classify(Call::Bpf, EPERM, with(&[PERFMON]), |_| false), Reason::Capability);
        assert_eq!(classify(Call::PerfEventOpen, EPERM, with(&[BPF]), |_| false), Reason::Capability);
        assert_eq!(classify(Call::Bpf, EPERM, with(&[SYS_ADMIN]), |_| false), Reason::Denied, "SYS_ADMIN stands in for BPF");
        assert_eq!(classify(Call::Bpf, EPERM, with(&[BPF]), |_| false), Reason::Denied);
        assert_eq!(classify(Call::Bpf, Some(libc::ENOSYS), with(&[BPF]), |_| false), Reason::Kernel);
        assert_eq!(classify(Call::Bpf, Some(libc::EINVAL), with(&[BPF]), |_| true), Reason::Error, "not a refusal");
        assert_eq!(classify(Call::Bpf, None, 0, |_| true), Reason::Error);
        // Out of descriptors is neither the verifier's nor a refusal.
        assert_eq!(classify(Call::Bpf, Some(libc::EMFILE), with(&[BPF]), |_| true), Reason::Descriptors);
        assert_eq!(classify(Call::PerfEventOpen, Some(libc::ENFILE), 0, |_| false), Reason::Descriptors);
    }

    /// aya's message alone says "failed to create map `X`": the errno is
    /// in its cause, and the message keeps it.
    #[test]
    fn the_errno_is_found_in_the_causes() {
        let e = aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: "RUNQ_DROPPED".into(),
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        let (msg, errno) = chain(&e);
        assert_eq!(errno, EPERM);
        assert!(msg.contains("RUNQ_DROPPED") && msg.contains("Operation not permitted"), "{msg}");
    }

    #[test]
    fn labels_are_distinct() {
        let labels: std::collections::BTreeSet<&str> = Reason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
    }

    #[test]
    fn the_remedy_names_seccomp_and_both_overlays() {
        let r = seccomp_remedy(Call::Bpf);
        for want in ["seccomp", "bpf(2)", "deploy/overlays/seccomp-profile", "deploy/overlays/seccomp-unconfined", "Localhost"] {
            assert!(r.contains(want), "{want} not in {r}");
        }
    }
}
