//! The eBPF probes, one module per probe (its loader side: the tracepoint
//! offsets it reads for its global, the programs it attaches and the
//! families it writes), registered as collectors like the host's, and
//! named `ebpf_<probe>`. Their programs are in `agent-ebpf`, and their map
//! types and names in `agent-common`, in modules of the same name.
//!
//! Adding a probe: its module in each of the three crates, and one
//! `probe!` line in [`definitions`].
//!
//! `pod_cpu_throttling` and `pod_tcp_listen` are registered here too,
//! though they read cgroup and /proc files and no eBPF map: they name pods
//! through the pod watch the [`Context`] shares with `ebpf_pods`.

use std::sync::Arc;

use host::flags::{BoolFlag, Flags};
use host::registry::Definition;
use host::ConfigError;

use crate::ebpf::kernel::Kernel;
use crate::ebpf::loader::Claims;
use crate::ebpf::{Globals, LoadError, Probe, Shared};

/// `--ebpf.bpf-stats`, read by [`Context`]; listed among the serve flags by
/// `config` (declared here so that the probes need nothing from `config`).
pub const BPF_STATS: BoolFlag = BoolFlag {
    name: "ebpf.bpf-stats",
    default: false,
    help: "Enable the kernel's BPF run-time statistics while running, for node_ebpf_program_run_seconds_total and node_ebpf_program_runs_total.",
};

pub mod bounds;
pub mod counters;
pub mod ebpf_block_io;
pub mod ebpf_dns;
pub mod ebpf_oom_kills;
pub mod ebpf_pods;
pub mod ebpf_process;
pub mod ebpf_runqueue;
pub mod ebpf_skb_drops;
pub mod ebpf_syscall_latency;
pub mod ebpf_syscalls;
pub mod ebpf_tcp_latency;
pub mod ebpf_tcp_peers;
pub mod ebpf_tcp_retransmits;
pub mod pod_cpu_throttling;
pub mod pod_tcp_listen;

/// Sets a probe's read-only global from the kernel's facts.
pub type GlobalsFn = fn(&Kernel, &mut Context, &mut Globals);

/// State shared by the probes while they are built: the eBPF object is
/// loaded once, by the first probe that asks for it, with every probe's
/// global set.
pub struct Context {
    ebpf: Option<Result<Arc<Shared>, LoadError>>,
    object: &'static [u8],
    /// Ask the kernel for BPF run-time statistics.
    pub bpf_stats: bool,
    /// Pod attribution is on (enabled, with a Kubernetes API): its global
    /// is set from the kernel's facts when the programs load.
    pub attribute: bool,
    /// The pod collectors are on: where the Kubernetes API is, and this
    /// node's name (the watch starts when the first collector asks).
    pub pods_source: Option<(crate::pods::watch::Source, String, crate::pods::watch::Settings)>,
    pods_watch: Option<Arc<crate::pods::Watched>>,
    /// The pods' cgroups as they come and go, shared by the collectors that
    /// name cgroups (started by the first that asks).
    hierarchy: Option<Option<Arc<crate::pods::hierarchy::Hierarchy>>>,
    /// There is a Kubernetes API to name pods with ([`ebpf_pods::prepare`]).
    pub kube: bool,
    /// `ebpf_tcp_peers` or `ebpf_dns` is on: the watch names Services too.
    pub services: bool,
    /// Connections `ebpf_tcp_peers` follows at once (its map's size).
    pub tcp_connections: u32,
    /// `ebpf_dns` counts failing answers by name (`--collector.ebpf_dns.failing-domains` above 0).
    pub dns_names: bool,
    /// `ebpf_pods` is on: it expires deleted pods from the shared index.
    pub pods_attribution: bool,
    /// The events pod attribution serves on this kernel (`agent_common::pods` bits).
    pub pod_events: u32,
    /// The node's procfs and sysfs (`--path.procfs`, `--path.sysfs`), where
    /// the maps sized at load read the node's counts (threads, block
    /// queues).
    pub procfs: std::path::PathBuf,
    pub sysfs: std::path::PathBuf,
    /// The descriptors the eBPF object and its programs may take (the
    /// agent's share of the open-file limit: `crate::descriptors`); `None`,
    /// as many as the limit allows.
    pub fds: Option<crate::descriptors::Ceiling>,
    globals: Vec<GlobalsFn>,
    /// Which probe reports each program ([`Context::attach`]).
    claims: Arc<Claims>,
}

impl Context {
    /// The context for `probes`, from the flags: pod attribution is
    /// decided here, before the object loads, since it changes what loads.
    pub fn new(f: &Flags, paths: &host::Paths, probes: &[Definition<Context>]) -> Result<Context, ConfigError> {
        let mut ctx = Context::with_object(crate::ebpf::OBJECT, BPF_STATS.get(f));
        ctx.procfs.clone_from(&paths.procfs);
        ctx.sysfs.clone_from(&paths.sysfs);
        let on = |name: &str| probes.iter().any(|d| d.name == name && host::registry::enabled(f, d));
        ctx.pods_attribution = on("ebpf_pods");
        ctx.services = on("ebpf_tcp_peers") || on("ebpf_dns");
        ctx.tcp_connections = ebpf_tcp_peers::MAX_CONNECTIONS.get(f)?;
        ctx.dns_names = on("ebpf_dns") && ebpf_dns::FAILING_DOMAINS.get(f)? > 0;
        if ctx.pods_attribution || on("pod_cpu_throttling") || on("pod_tcp_listen") || on("ebpf_tcp_peers") || on("ebpf_dns") {
            ebpf_pods::prepare(f, &mut ctx)?;
        }
        Ok(ctx)
    }

    /// A context loading `object` (the test suite's has test programs too).
    pub fn with_object(object: &'static [u8], bpf_stats: bool) -> Context {
        Context {
            ebpf: None,
            object,
            bpf_stats,
            attribute: false,
            pods_source: None,
            pods_watch: None,
            hierarchy: None,
            kube: false,
            services: false,
            tcp_connections: agent_common::tcp_peers::MAX_SOCKS,
            dns_names: false,
            pods_attribution: false,
            pod_events: 0,
            procfs: "/proc".into(),
            sysfs: "/sys".into(),
            fds: None,
            globals: globals(),
            claims: Arc::default(),
        }
    }

    /// Attaches a probe's programs ([`Probe::attach`]); each program is
    /// reported by the first probe that attaches it.
    pub fn attach(&mut self, programs: &[agent_common::Program]) -> Probe {
        let shared = self.ebpf();
        self.claim(Probe::attach(shared, programs))
    }

    /// A probe's programs down on this kernel ([`Probe::down`]), reported
    /// by the first probe that has them.
    pub fn down(&self, programs: &[agent_common::Program], why: &str) -> Probe {
        self.claim(Probe::down(programs, why))
    }

    /// `probe` reports the programs no probe reports yet.
    pub fn claim(&self, probe: Probe) -> Probe {
        probe.claim(&self.claims)
    }

    /// `probe` reports only the programs no other probe reports (pod
    /// attribution, which shares the node probes' programs).
    pub fn defer(&self, probe: Probe) -> Probe {
        probe.defer_to(Arc::clone(&self.claims))
    }

    /// The watch on this node's pods, shared by the pod collectors: started
    /// by the first that asks; None when there is no Kubernetes API.
    pub fn pods(&mut self) -> Result<Option<Arc<crate::pods::Watched>>, ConfigError> {
        if let Some(w) = &self.pods_watch {
            return Ok(Some(Arc::clone(w)));
        }
        let Some((source, node, settings)) = self.pods_source.take() else { return Ok(None) };
        let w = crate::pods::Watched::start(source, node, settings, self.services)
            .map_err(|e| ConfigError::Invalid { flag: "collector.ebpf_pods".into(), msg: format!("starting the pod watch: {e}") })?;
        let w = Arc::new(w);
        self.pods_watch = Some(Arc::clone(&w));
        Ok(Some(w))
    }

    /// The pods' cgroups of the node's cgroup v2 hierarchy, followed as they
    /// come and go (gone ones kept for `retention`): started by the first
    /// collector that asks; None without a cgroup v2 hierarchy (every
    /// cgroup is then the host's).
    pub fn hierarchy(&mut self, retention: std::time::Duration) -> Result<Option<Arc<crate::pods::hierarchy::Hierarchy>>, ConfigError> {
        if let Some(h) = &self.hierarchy {
            return Ok(h.clone());
        }
        let h = match crate::pods::cgroup::v2_root(&self.sysfs) {
            Some(root) => Some(Arc::new(crate::pods::hierarchy::Hierarchy::start(root, retention).map_err(|e| ConfigError::Invalid {
                flag: "collector.ebpf_pods".into(),
                msg: format!("following the pods' cgroups: {e}"),
            })?)),
            None => {
                tracing::warn!(sysfs = %self.sysfs.display(), "no cgroup v2 hierarchy: every task's events count for the host");
                None
            }
        };
        self.hierarchy = Some(h.clone());
        Ok(h)
    }

    /// What `ebpf_tcp_peers` and `ebpf_dns` name cgroups and peers with:
    /// the pod watch and the pods' cgroups where there is a Kubernetes API
    /// (else every count is the host's), and this node's name.
    pub fn resolver(&mut self, grace: std::time::Duration) -> Result<crate::pods::resolve::Resolver, ConfigError> {
        let pods = if self.kube { self.pods()? } else { None };
        let hierarchy = if pods.is_some() { self.hierarchy(grace)? } else { None };
        let node = match &pods {
            Some(w) => w.node.clone(),
            None => host::sys::uname().map(|u| u.nodename.to_lowercase()).unwrap_or_default(),
        };
        Ok(crate::pods::resolve::Resolver::new(pods, hierarchy, node))
    }

    /// The loaded object: loaded on the first call, with every probe's global.
    pub fn ebpf(&mut self) -> Result<Arc<Shared>, LoadError> {
        if let Some(r) = &self.ebpf {
            return r.clone();
        }
        let kernel = Kernel::get();
        let mut globals = Globals::default();
        for g in self.globals.clone() {
            g(kernel, self, &mut globals);
        }
        globals.cgroup_root(crate::pods::cgroup::v2_root(&self.sysfs));
        globals.descriptors(self.fds);
        let r = Shared::load(self.object, &globals, self.bpf_stats);
        self.ebpf = Some(r.clone());
        r
    }
}

/// A probe: its collector and, when its programs read one, the setter of
/// its read-only global.
struct Entry {
    definition: Definition<Context>,
    globals: Option<GlobalsFn>,
}

macro_rules! probe {
    ($name:literal, $module:ident) => {
        Entry {
            definition: Definition { name: $name, enabled_by_default: true, args: $module::args, build: $module::build },
            globals: None,
        }
    };
    ($name:literal, $module:ident, globals) => {
        Entry {
            definition: Definition { name: $name, enabled_by_default: true, args: $module::args, build: $module::build },
            globals: Some($module::globals),
        }
    };
}

/// Every eBPF probe, on by default (each reports its programs down where
/// the kernel or the privileges do not allow them).
fn entries() -> Vec<Entry> {
    vec![
        probe!("ebpf_block_io", ebpf_block_io, globals),
        probe!("ebpf_dns", ebpf_dns, globals),
        probe!("ebpf_oom_kills", ebpf_oom_kills),
        probe!("ebpf_pods", ebpf_pods, globals),
        probe!("ebpf_process", ebpf_process),
        probe!("ebpf_runqueue", ebpf_runqueue, globals),
        probe!("ebpf_skb_drops", ebpf_skb_drops, globals),
        probe!("ebpf_syscall_latency", ebpf_syscall_latency, globals),
        probe!("ebpf_syscalls", ebpf_syscalls, globals),
        probe!("ebpf_tcp_latency", ebpf_tcp_latency, globals),
        probe!("ebpf_tcp_peers", ebpf_tcp_peers, globals),
        probe!("ebpf_tcp_retransmits", ebpf_tcp_retransmits, globals),
        probe!("pod_cpu_throttling", pod_cpu_throttling),
        probe!("pod_tcp_listen", pod_tcp_listen),
    ]
}

/// The probes' collector definitions.
pub fn definitions() -> Vec<Definition<Context>> {
    entries().into_iter().map(|e| e.definition).collect()
}

/// Every probe's global setter, whether the probe is enabled or not (the
/// object holds every program; a disabled probe's are never attached).
fn globals() -> Vec<GlobalsFn> {
    entries().into_iter().filter_map(|e| e.globals).collect()
}
