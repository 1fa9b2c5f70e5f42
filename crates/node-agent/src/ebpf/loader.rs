//! Loading the eBPF object once per agent, with every probe's read-only
//! global set, and attaching programs. A program that cannot be loaded or
//! attached is reported down (`node_ebpf_program_up 0`, the reason logged
//! once at warn), never fatal. Dropping the last handle detaches and
//! unloads everything.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agent_common::{Hook, Program};
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};
use expo::{Kind, Sink};

/// Why the eBPF object is not available.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// Built with `NODE_AGENT_SKIP_EBPF=1`: the binary embeds no programs.
    #[error("this node-agent was built without its eBPF programs (NODE_AGENT_SKIP_EBPF=1)")]
    NotBuilt,
    /// The kernel refused the object (or its maps): no privileges, no BPF.
    #[error("loading eBPF programs: {0}")]
    Load(String),
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
    #[error("loading: {0}")]
    Load(String),
    #[error("attaching to {hook}: {msg}")]
    Attach { hook: String, msg: String },
    #[error("eBPF state poisoned by an earlier panic")]
    Poisoned,
    /// The running kernel lacks what the program needs (never attached).
    #[error("not on this kernel: {0}")]
    Kernel(String),
}

/// The read-only globals to set before loading: symbol name and bytes.
#[derive(Debug, Default, Clone)]
pub struct Globals(Vec<(&'static str, Vec<u8>)>);

impl Globals {
    /// Sets global `name` to `value`'s bytes.
    pub fn set<T: aya::Pod>(&mut self, name: &'static str, value: &T) {
        // SAFETY: `T: Pod` is plain data without padding bytes of
        // undefined value (explicit padding fields), so its bytes may be read.
        let bytes = unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>()) };
        self.0.retain(|(n, _)| *n != name);
        self.0.push((name, bytes.to_vec()));
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
        let mut ebpf = loader.load(object).map_err(|e| LoadError::Load(e.to_string()))?;
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
        // aya's loader parses the kernel's whole BTF when it is created (we
        // then tell it not to use it): hand that memory back to the system.
        // SAFETY: malloc_trim only releases free memory.
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(Arc::new(Shared { ebpf: Mutex::new(ebpf), attached: Mutex::new(HashMap::new()), stats, _stats_fd: stats_fd, log_stop }))
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
        let mut ebpf = self.lock().ok_or(AttachError::Poisoned)?;
        let name = program.name;
        let prog = ebpf.program_mut(name).ok_or(AttachError::Missing(name))?;
        let kind = |e: aya::programs::ProgramError| AttachError::Type { program: name, msg: e.to_string() };
        match program.hook {
            Hook::TracePoint(category, event) => {
                let p: &mut TracePoint = prog.try_into().map_err(kind)?;
                p.load().map_err(|e| AttachError::Load(e.to_string()))?;
                p.attach(category, event).map_err(|e| AttachError::Attach { hook: format!("{category}:{event}"), msg: e.to_string() })?;
            }
            Hook::RawTracePoint(event) => {
                let p: &mut RawTracePoint = prog.try_into().map_err(kind)?;
                p.load().map_err(|e| AttachError::Load(e.to_string()))?;
                p.attach(event).map_err(|e| AttachError::Attach { hook: format!("raw tracepoint {event}"), msg: e.to_string() })?;
            }
        }
        Ok(())
    }

    /// Runs of a program the kernel skipped because another BPF program
    /// was running on that CPU (`recursion_misses`, Linux 5.12+): events
    /// the probe could not see.
    pub fn misses(&self, program: &str) -> Option<u64> {
        use std::os::fd::{AsFd, AsRawFd};
        let ebpf = self.lock()?;
        let fd = ebpf.program(program)?.fd().ok()?.as_fd().as_raw_fd();
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
        // into `info`, which lives until after the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, 15, &mut attr as *mut InfoAttr, std::mem::size_of::<InfoAttr>()) };
        (rc == 0).then_some(info.recursion_misses)
    }

    /// Kernel run-time statistics of a program: (seconds, runs).
    pub fn run_stats(&self, program: &str) -> Option<(f64, u64)> {
        if !self.stats {
            return None;
        }
        let ebpf = self.lock()?;
        let info = ebpf.program(program)?.info().ok()?;
        Some((info.run_time().as_secs_f64(), info.run_count()))
    }
}

/// The programs of one probe collector and their state.
pub struct Probe {
    pub shared: Option<Arc<Shared>>,
    programs: Vec<(&'static str, Result<(), AttachError>)>,
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
                Probe { shared: Some(s), programs }
            }
            Err(e) => {
                for p in programs {
                    tracing::warn!(program = p.name, err = %e, "eBPF program down");
                }
                Probe { shared: None, programs: programs.iter().map(|p| (p.name, Err(AttachError::Object(e.clone())))).collect() }
            }
        }
    }

    /// Programs the running kernel cannot serve (`why`): reported down,
    /// logged once, never loaded.
    pub fn down(programs: &[Program], why: &str) -> Probe {
        for p in programs {
            tracing::warn!(program = p.name, err = why, "eBPF program down: not on this kernel");
        }
        Probe { shared: None, programs: programs.iter().map(|p| (p.name, Err(AttachError::Kernel(why.to_string())))).collect() }
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

    /// Writes `node_ebpf_program_up` and, when enabled, the run statistics.
    pub fn self_metrics(&self, sink: &mut Sink) {
        for (name, r) in &self.programs {
            sink.family("node_ebpf_program_up", "Whether the eBPF program is loaded and attached (1) or not (0).", Kind::Gauge)
                .sample(&[("program", name)], if r.is_ok() { 1.0 } else { 0.0 });
            if r.is_err() {
                continue;
            }
            if let Some(m) = self.shared.as_ref().and_then(|s| s.misses(name)) {
                sink.family(
                    "node_ebpf_program_misses_total",
                    "Runs of the eBPF program the kernel skipped because another BPF program was running on that CPU: events the probe did not see.",
                    Kind::Counter,
                )
                .sample(&[("program", name)], m as f64);
            }
            if let Some((secs, runs)) = self.shared.as_ref().and_then(|s| s.run_stats(name)) {
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
