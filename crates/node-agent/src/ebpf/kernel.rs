//! What the running kernel offers the probes, probed once: tracefs (mounted
//! when we may), tracepoint formats (field offsets, so no layout is
//! compiled in), the release, and the features that follow from them.
//! Probes ask here; none probes the kernel itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The kernel facts the probes need.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The tracefs mount aya uses, when there is one.
    pub tracefs: Option<PathBuf>,
    /// `uname -r`, e.g. `6.18.44-fc-v669`.
    pub release: String,
}

/// One tracepoint's `format` file: its fields' offsets and the text.
#[derive(Debug, Default, Clone)]
pub struct Format {
    pub fields: HashMap<String, u32>,
    pub text: String,
}

impl Format {
    /// The offset of `field`, 0 when the tracepoint has no such field.
    pub fn offset(&self, field: &str) -> u32 {
        self.fields.get(field).copied().unwrap_or(0)
    }

    pub fn has(&self, field: &str) -> bool {
        self.fields.contains_key(field)
    }
}

impl Kernel {
    /// The running kernel, probed once per process (mounting tracefs at
    /// /sys/kernel/tracing when it is nowhere and we are permitted to).
    pub fn get() -> &'static Kernel {
        static K: OnceLock<Kernel> = OnceLock::new();
        K.get_or_init(|| Kernel {
            tracefs: ensure_tracefs(),
            release: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        })
    }

    /// A tracepoint's format (empty when tracefs or the tracepoint is missing).
    pub fn format(&self, category: &str, name: &str) -> Format {
        let Some(t) = &self.tracefs else { return Format::default() };
        let text = std::fs::read_to_string(t.join("events").join(category).join(name).join("format")).unwrap_or_default();
        Format { fields: parse_format(&text), text }
    }

    /// Whether the release is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        release_at_least(&self.release, major, minor)
    }

    /// sched_switch passes the previous task's state to raw tracepoint
    /// programs (Linux >= 5.18).
    pub fn raw_sched_switch(&self) -> bool {
        self.at_least(5, 18)
    }

    /// oom:mark_victim passes the victim task (Linux >= 6.8, whose format
    /// grew `uid` with the new prototype) rather than its pid.
    pub fn oom_passes_task(&self) -> bool {
        self.format("oom", "mark_victim").has("uid")
    }

    /// kfree_skb's drop reasons and argument positions, from the kernel's
    /// BTF: why not, when the kernel has none.
    pub fn drop_reasons(&self) -> Result<&'static DropReasons, &'static str> {
        btf_facts().drop_reasons.as_ref().map_err(String::as_str)
    }

    /// What the TCP latency program reads, from the kernel's BTF: why not,
    /// when the kernel cannot serve it.
    pub fn tcp_latency(&self) -> Result<agent_common::tcp_latency::Offsets, &'static str> {
        btf_facts().tcp_latency.as_ref().copied().map_err(String::as_str)
    }

    /// Where the TCP peers program reads (attribution off: the caller
    /// turns it on), from the kernel's BTF: why not, without it.
    pub fn tcp_peers(&self) -> Result<agent_common::tcp_peers::Offsets, &'static str> {
        btf_facts().tcp_peers.as_ref().copied().map_err(String::as_str)
    }

    /// How pod attribution goes from a task or socket to its cgroup, from
    /// the kernel's BTF: why not, without it.
    pub fn cgroup_walk(&self) -> Result<CgroupWalk, &'static str> {
        btf_facts().cgroup_walk.as_ref().copied().map_err(String::as_str)
    }

    /// Where the raw tcp_retransmit_skb program finds a socket's family,
    /// from the kernel's BTF: why not, when only the classic tracepoint can
    /// serve.
    pub fn retransmit_raw(&self) -> Result<u32, &'static str> {
        btf_facts().retransmit_raw.as_ref().copied().map_err(String::as_str)
    }

    /// `sock.__sk_common.skc_family`, from the kernel's BTF: where a
    /// classic tracepoint without a `family` field (tcp_retransmit_skb
    /// before Linux 5.12 or so) finds its socket's family.
    pub fn sock_family(&self) -> Result<u32, &'static str> {
        btf_facts().sock_family.as_ref().copied().map_err(String::as_str)
    }

    /// Where the raw block_rq_issue and block_rq_complete programs find a
    /// request's device and operation, from the kernel's BTF: why not, when
    /// only the classic tracepoints can serve.
    pub fn block_raw(&self) -> Result<BlockRaw, &'static str> {
        btf_facts().block_raw.as_ref().copied().map_err(String::as_str)
    }

    /// Where the syscall number is in `struct pt_regs`: orig_ax on x86_64,
    /// syscallno on aarch64.
    pub fn regs_syscall_nr(&self) -> u32 {
        if cfg!(target_arch = "aarch64") {
            280
        } else {
            120
        }
    }
}

/// The facts the probes read from the kernel's BTF
/// (`/sys/kernel/btf/vmlinux`), parsed once per process (and only when a
/// probe asks) and kept only as these few numbers and names.
struct BtfFacts {
    drop_reasons: Result<DropReasons, String>,
    tcp_latency: Result<agent_common::tcp_latency::Offsets, String>,
    tcp_peers: Result<agent_common::tcp_peers::Offsets, String>,
    block_raw: Result<BlockRaw, String>,
    retransmit_raw: Result<u32, String>,
    sock_family: Result<u32, String>,
    cgroup_walk: Result<CgroupWalk, String>,
}

/// What pod attribution reads to go from a task or a socket to its cgroup
/// v2 id: `task_struct.cgroups`, `css_set.dfl_cgrp`, `cgroup.kn`,
/// `kernfs_node.id`, and `sock.sk_cgrp_data.cgroup` (None without it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupWalk {
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub sock_cgroup: Option<u32>,
}

/// Pod attribution's offsets from a parsed BTF.
pub fn cgroup_walk(btf: &crate::ebpf::btf::Btf) -> Result<CgroupWalk, String> {
    let off = |s: &str, m: &[&str]| btf.offset(s, m).map_err(|e| e.to_string());
    Ok(CgroupWalk {
        task_cgroups: off("task_struct", &["cgroups"])?,
        css_set_dfl_cgrp: off("css_set", &["dfl_cgrp"])?,
        cgroup_kn: off("cgroup", &["kn"])?,
        kernfs_node_id: off("kernfs_node", &["id"])?,
        // Before Linux 5.15 `sock_cgroup_data` is a union whose first word
        // is the cgroup pointer (or net_prio's and net_cls's data, which
        // the programs' `cgroup_id` tells apart by its low bits).
        sock_cgroup: off("sock", &["sk_cgrp_data", "cgroup"]).or_else(|_| off("sock", &["sk_cgrp_data"])).ok(),
    })
}

fn btf_facts() -> &'static BtfFacts {
    static F: OnceLock<BtfFacts> = OnceLock::new();
    F.get_or_init(|| {
        let path = "/sys/kernel/btf/vmlinux";
        let parsed = read_btf(Path::new(path)).map_err(|e| format!("no kernel BTF ({path}): {e}")).and_then(|data| {
            let btf = crate::ebpf::btf::Btf::parse(&data).map_err(|e| format!("kernel BTF unusable: {e}"))?;
            Ok(BtfFacts {
                drop_reasons: drop_reasons(&btf),
                tcp_latency: tcp_latency(&btf),
                tcp_peers: tcp_peers(&btf),
                block_raw: block_raw(&btf),
                retransmit_raw: retransmit_raw(&btf),
                sock_family: btf.offset("sock", &["__sk_common", "skc_family"]).map_err(|e| e.to_string()),
                cgroup_walk: cgroup_walk(&btf),
            })
        });
        parsed.unwrap_or_else(|e| BtfFacts {
            drop_reasons: Err(e.clone()),
            tcp_latency: Err(e.clone()),
            tcp_peers: Err(e.clone()),
            block_raw: Err(e.clone()),
            retransmit_raw: Err(e.clone()),
            sock_family: Err(e.clone()),
            cgroup_walk: Err(e),
        })
    })
}

/// The raw tcp_retransmit_skb program's `sock.__sk_common.skc_family`
/// offset: an error unless the tracepoint passes `(const struct sock *,
/// const struct sk_buff *, int err)` (Linux >= 6.17), which the program
/// reads.
pub fn retransmit_raw(btf: &crate::ebpf::btf::Btf) -> Result<u32, String> {
    let p = btf.typedef_params("btf_trace_tcp_retransmit_skb").map_err(|e| format!("no tcp_retransmit_skb: {e}"))?;
    let args: Vec<&str> = p.iter().skip(1).map(String::as_str).collect();
    if args != ["struct sock *", "struct sk_buff *", "int"] {
        return Err(format!("tcp_retransmit_skb passes {args:?}, not (struct sock *, struct sk_buff *, int err) (Linux < 6.17)"));
    }
    btf.offset("sock", &["__sk_common", "skc_family"]).map_err(|e| e.to_string())
}

/// Member offsets the raw block programs read: `request.q`,
/// `request.cmd_flags`, `request_queue.disk`, `gendisk.major`,
/// `gendisk.first_minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRaw {
    pub rq_q: u32,
    pub rq_cmd_flags: u32,
    pub q_disk: u32,
    pub disk_major: u32,
    pub disk_first_minor: u32,
}

/// The raw block programs' offsets from a parsed BTF: an error when
/// block_rq_issue does not pass the request alone (Linux < 5.11) or
/// block_rq_complete does not pass it first.
pub fn block_raw(btf: &crate::ebpf::btf::Btf) -> Result<BlockRaw, String> {
    let args = |tp: &str| -> Result<Vec<String>, String> {
        let p = btf.typedef_params(tp).map_err(|e| format!("no {tp}: {e}"))?;
        Ok(p.into_iter().skip(1).collect())
    };
    let issue = args("btf_trace_block_rq_issue")?;
    if issue != ["struct request *"] {
        return Err(format!("block_rq_issue passes {issue:?}, not (struct request *) (Linux < 5.11)"));
    }
    let complete = args("btf_trace_block_rq_complete")?;
    if complete.first().map(String::as_str) != Some("struct request *") {
        return Err(format!("block_rq_complete passes {complete:?}, not the request first"));
    }
    let off = |s: &str, m: &str| btf.offset(s, &[m]).map_err(|e| e.to_string());
    Ok(BlockRaw {
        rq_q: off("request", "q")?,
        rq_cmd_flags: off("request", "cmd_flags")?,
        q_disk: off("request_queue", "disk")?,
        disk_major: off("gendisk", "major")?,
        disk_first_minor: off("gendisk", "first_minor")?,
    })
}

/// What the kfree_skb program needs to know: the raw tracepoint argument
/// indices (`btf_trace_kfree_skb`'s parameters after its leading `void *`),
/// `sk_buff.sk`, and the names of `enum skb_drop_reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropReasons {
    /// `enum skb_drop_reason` (Linux >= 5.17; None before: drops are
    /// counted as `unknown`).
    pub reason_arg: Option<u32>,
    pub skb_arg: u32,
    /// `struct sock *rx_sk` (Linux >= 6.9).
    pub rx_sk_arg: Option<u32>,
    /// Byte offset of `sk_buff.sk`, when the BTF has it.
    pub skb_sk: Option<u32>,
    /// (value, name), the `SKB_DROP_REASON_` (or `SKB_`) prefix stripped,
    /// in the enum's order.
    pub names: Vec<(u64, String)>,
}

/// kfree_skb's drop-reason facts from a parsed BTF: an error (the probe's
/// reason to be down) when there is no kfree_skb tracepoint or it passes no
/// packet; no reason argument and no names where it passes no reason
/// (Linux < 5.17).
pub fn drop_reasons(btf: &crate::ebpf::btf::Btf) -> Result<DropReasons, String> {
    let params = btf.typedef_params("btf_trace_kfree_skb").map_err(|e| format!("no kfree_skb tracepoint: {e}"))?;
    // The first parameter is the tracepoint's own `void *__data`.
    let args: Vec<&str> = params.iter().skip(1).map(String::as_str).collect();
    let find = |ty: &str| args.iter().position(|a| *a == ty).map(|i| i as u32);
    let reason_arg = find("enum skb_drop_reason");
    let skb_arg = find("struct sk_buff *").ok_or("kfree_skb passes no struct sk_buff *")?;
    let names = match reason_arg {
        Some(_) => btf
            .enumerators("skb_drop_reason")
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(n, v)| (v, n.strip_prefix("SKB_DROP_REASON_").or_else(|| n.strip_prefix("SKB_")).unwrap_or(n).to_string()))
            .collect(),
        None => Vec::new(),
    };
    Ok(DropReasons { reason_arg, skb_arg, rx_sk_arg: find("struct sock *"), skb_sk: btf.offset("sk_buff", &["sk"]).ok(), names })
}

/// The TCP latency program's offsets from a parsed BTF: an error (the
/// probe's reason to be down) when inet_sock_set_state's arguments are not
/// the `(const struct sock *, int, int)` the program reads.
pub fn tcp_latency(btf: &crate::ebpf::btf::Btf) -> Result<agent_common::tcp_latency::Offsets, String> {
    let params = btf.typedef_params("btf_trace_inet_sock_set_state").map_err(|e| format!("no inet_sock_set_state tracepoint: {e}"))?;
    let args: Vec<&str> = params.iter().skip(1).map(String::as_str).collect();
    if args != ["struct sock *", "int", "int"] {
        return Err(format!("inet_sock_set_state passes {args:?}, not (struct sock *, int, int)"));
    }
    let sk_protocol = btf.offset("sock", &["sk_protocol"]).map_err(|e| e.to_string())?;
    let srtt_us = btf.offset("tcp_sock", &["srtt_us"]).map_err(|e| e.to_string())?;
    Ok(agent_common::tcp_latency::Offsets { sk_protocol, srtt_us })
}

/// The TCP peers program's offsets from a parsed BTF, attribution off (the
/// socket's cgroup offsets are filled in, `attribute` left 0): an error
/// (the probe's reason to be down) when inet_sock_set_state's arguments
/// are not `(const struct sock *, int, int)` or a member is missing.
pub fn tcp_peers(btf: &crate::ebpf::btf::Btf) -> Result<agent_common::tcp_peers::Offsets, String> {
    let lat = tcp_latency(btf)?;
    let off = |s: &str, m: &[&str]| btf.offset(s, m).map_err(|e| e.to_string());
    let common = |m: &str| off("sock", &["__sk_common", m]);
    let done = btf
        .enumerators("sock_flags")
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|(n, _)| *n == "SOCK_DONE")
        .map(|(_, v)| v as u32)
        .ok_or("no SOCK_DONE in enum sock_flags")?;
    Ok(agent_common::tcp_peers::Offsets {
        attribute: 0,
        sk_protocol: lat.sk_protocol,
        skc_family: common("skc_family")?,
        skc_daddr: common("skc_daddr")?,
        skc_dport: common("skc_dport")?,
        skc_num: common("skc_num")?,
        skc_v6_daddr: common("skc_v6_daddr")?,
        skc_state: common("skc_state")?,
        sk_err: off("sock", &["sk_err"])?,
        sk_err_soft: off("sock", &["sk_err_soft"])?,
        // `sk_flags` moved into sock_common as `skc_flags` (Linux 6.x).
        sk_flags: off("sock", &["sk_flags"]).or_else(|_| common("skc_flags"))?,
        sock_done_bit: done,
        // Before Linux 5.15 `sock_cgroup_data` is a union whose `val` (its
        // first word) holds the cgroup pointer, or with its low two bits
        // set net_prio's and net_cls's data (the program then attributes
        // nothing).
        sock_cgroup: off("sock", &["sk_cgrp_data", "cgroup"]).or_else(|_| off("sock", &["sk_cgrp_data"])).unwrap_or(0),
        cgroup_kn: off("cgroup", &["kn"]).unwrap_or(0),
        kernfs_node_id: off("kernfs_node", &["id"]).unwrap_or(0),
        bytes_acked: off("tcp_sock", &["bytes_acked"])?,
        bytes_received: off("tcp_sock", &["bytes_received"])?,
        total_retrans: off("tcp_sock", &["total_retrans"])?,
        snd_una: off("tcp_sock", &["snd_una"])?,
        write_seq: off("tcp_sock", &["write_seq"])?,
    })
}

/// The (value, name) pairs of a tracepoint format's `__print_symbolic` list.
pub fn print_symbolic(format: &str) -> Vec<(u64, &str)> {
    let Some(list) = format.split("__print_symbolic(").nth(1) else { return Vec::new() };
    list.split("{ ")
        .skip(1)
        .filter_map(|e| {
            let (v, rest) = e.split_once(',')?;
            let v = v.trim();
            let v = v.strip_prefix("0x").map_or_else(|| v.parse().ok(), |h| u64::from_str_radix(h, 16).ok())?;
            Some((v, rest.split('"').nth(1)?))
        })
        .collect()
}

/// Whether a kernel release (`6.18.44-...`) is at least `major.minor`.
pub fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// The tracefs mount aya uses (it looks at these two places only).
pub fn tracefs() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"].iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

/// Where tracefs is, as far as this process can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracefs {
    Found(PathBuf),
    /// Mounted, but not readable with this process's privileges.
    Denied(PathBuf),
    Absent,
}

/// Looks for tracefs without mounting it.
pub fn tracefs_status() -> Tracefs {
    if let Some(p) = tracefs() {
        return Tracefs::Found(p);
    }
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::read_dir(p.join("events")).is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied))
        .map_or(Tracefs::Absent, Tracefs::Denied)
}

/// Mounts tracefs at /sys/kernel/tracing when it is nowhere to be found and
/// we are permitted to.
fn ensure_tracefs() -> Option<PathBuf> {
    match tracefs_status() {
        Tracefs::Found(p) => return Some(p),
        // Mounted, but not ours to read: say so, and mount nothing.
        Tracefs::Denied(p) => {
            tracing::warn!(path = %p.display(), "tracefs is mounted but not readable without privileges: tracepoint programs will be down");
            return None;
        }
        Tracefs::Absent => {}
    }
    let target = std::ffi::CString::new("/sys/kernel/tracing").ok()?;
    let fstype = std::ffi::CString::new("tracefs").ok()?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        tracing::warn!(err = %std::io::Error::last_os_error(), "tracefs is not mounted and mounting it failed: tracepoint programs will be down");
        return None;
    }
    tracing::info!(path = "/sys/kernel/tracing", "mounted tracefs");
    tracefs()
}

/// A syscall the eBPF programs need, which a seccomp filter may refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// bpf(2): maps and programs, raw tracepoints.
    Bpf,
    /// perf_event_open(2): attaching tracepoint programs.
    PerfEventOpen,
}

impl Call {
    pub fn name(self) -> &'static str {
        match self {
            Call::Bpf => "bpf",
            Call::PerfEventOpen => "perf_event_open",
        }
    }
}

/// The seccomp mode of this process (`Seccomp:` in /proc/self/status: 0
/// none, 1 strict, 2 filter), when the kernel says.
pub fn parse_seccomp_mode(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

/// Whether a seccomp filter of this thread refuses `call` outright. The
/// call is made with arguments the kernel itself rejects before doing
/// anything (an unknown bpf command, a NULL perf_event_attr: EINVAL or
/// EFAULT), so EPERM or ENOSYS can only come from a filter, and only when
/// /proc says one is installed.
pub fn seccomp_refuses(call: Call) -> bool {
    // SAFETY: both calls pass no memory the kernel writes: bpf with a
    // command number no kernel has and a NULL, zero-sized attribute (the
    // kernel returns EINVAL), perf_event_open with a NULL attribute (EFAULT).
    // Neither creates anything.
    seccomp_refuses_call(|| unsafe {
        match call {
            Call::Bpf => libc::syscall(libc::SYS_bpf, 0x7fff_i64, std::ptr::null::<u8>(), 0_i64),
            Call::PerfEventOpen => libc::syscall(libc::SYS_perf_event_open, std::ptr::null::<u8>(), 0_i64, -1_i64, -1_i64, 0_i64),
        }
    })
}

/// Whether this thread runs under a seccomp filter and `call` (a syscall
/// made with arguments the kernel itself rejects, never with EPERM, ENOSYS
/// or EACCES) fails with one of those: the filter refused it.
pub fn seccomp_refuses_call(call: impl FnOnce() -> libc::c_long) -> bool {
    let filtered = std::fs::read_to_string("/proc/thread-self/status").ok().as_deref().and_then(parse_seccomp_mode).is_some_and(|m| m == 2);
    if !filtered {
        return false;
    }
    let rc = call();
    let errno = std::io::Error::last_os_error().raw_os_error();
    rc == -1 && matches!(errno, Some(libc::EPERM) | Some(libc::ENOSYS) | Some(libc::EACCES))
}

/// Field offsets of one tracepoint, from its tracefs `format` file.
pub fn parse_format(text: &str) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else { continue };
        let mut parts = rest.split(';');
        let decl = parts.next().unwrap_or("").trim();
        let name = decl.rsplit(' ').next().unwrap_or("");
        let name = name.split('[').next().unwrap_or(name);
        let offset = parts.find_map(|p| p.trim().strip_prefix("offset:")).and_then(|o| o.trim().parse::<u32>().ok());
        if let Some(o) = offset {
            out.insert(name.to_string(), o);
        }
    }
    out
}

/// The largest flag of sched_switch's `prev_state` print format: the state
/// bits are everything below twice that (the bit above marks preemption).
pub fn switch_state_mask(format: &str) -> u32 {
    let Some(flags) = format.split("__print_flags(").nth(1) else { return 0xff };
    let max = flags
        .split("{ 0x")
        .skip(1)
        .filter_map(|s| u32::from_str_radix(s.split(',').next().unwrap_or("").trim(), 16).ok())
        .max()
        .unwrap_or(0x80);
    max.saturating_mul(2).saturating_sub(1)
}

/// The kernel's BTF, as [`read_btf`] got it.
enum BtfBytes {
    /// Mapped read-only (Linux 6.16+ lets `/sys/kernel/btf/vmlinux` be
    /// mapped, as libbpf does): the kernel's own pages, not copied, and not
    /// counted in our RSS.
    Mapped(memmap2::Mmap),
    /// Read into memory (older kernels, other files).
    Read(Vec<u8>),
}

impl std::ops::Deref for BtfBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            BtfBytes::Mapped(m) => m,
            BtfBytes::Read(v) => v,
        }
    }
}

/// The kernel's BTF (about 5.5 MB on Linux 6.18), for the offsets and names
/// above: mapped where the kernel allows it, read otherwise.
fn read_btf(path: &Path) -> std::io::Result<BtfBytes> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    // A size of 0 (procfs, or an empty file) says nothing: read it.
    let mapped = match file.metadata()?.len() {
        0 => None,
        // SAFETY: a private read-only mapping; the kernel's BTF never
        // changes while it runs, and nothing writes the file. A regular
        // file that shrank under us would fault: callers pass the kernel's
        // BTF only.
        _ => unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }.ok(),
    };
    match mapped {
        Some(m) => Ok(BtfBytes::Mapped(m)),
        None => {
            let mut data = Vec::new();
            file.read_to_end(&mut data)?;
            Ok(BtfBytes::Read(data))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = "name: sched_switch\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n\nprint fmt: \"x\", (REC->prev_state & 0xff) ? __print_flags(REC->prev_state & 0xff, \"|\", { 0x00000001, \"S\" }, { 0x00000002, \"D\" }, { 0x00000080, \"I\" }) : \"R\"";

    #[test]
    fn parses_format_offsets() {
        let f = parse_format(SWITCH);
        assert_eq!(f["prev_pid"], 24);
        assert_eq!(f["prev_state"], 32);
        assert_eq!(f["next_pid"], 56);
        assert_eq!(f["prev_comm"], 8);
        assert_eq!(switch_state_mask(SWITCH), 0xff);
        assert_eq!(switch_state_mask("no flags"), 0xff);
    }

    #[test]
    fn print_symbolic_lists() {
        let f = "print fmt: \"reason: %s\", __print_symbolic(REC->reason, { 2, \"NOT_SPECIFIED\" }, { 3, \"NO_SOCKET\" })";
        assert_eq!(print_symbolic(f), [(2, "NOT_SPECIFIED"), (3, "NO_SOCKET")]);
        assert_eq!(print_symbolic("__print_symbolic(x, { 0x10, \"A\" })"), [(16, "A")]);
        assert!(print_symbolic("print fmt: \"x\"").is_empty());
    }

    #[test]
    fn seccomp_modes() {
        assert_eq!(parse_seccomp_mode("Name:\tx\nSeccomp:\t2\nSeccomp_filters:\t1\n"), Some(2));
        assert_eq!(parse_seccomp_mode("Seccomp:\t0\n"), Some(0));
        assert_eq!(parse_seccomp_mode("Name:\tx\n"), None);
    }

    /// A thread with a seccomp filter that refuses bpf(2) with EPERM (as
    /// container runtimes' default profiles do): bpf is found refused,
    /// perf_event_open is not; the test's other threads have no filter.
    #[test]
    fn a_filter_refusing_bpf_is_found() {
        let filtered = std::thread::spawn(|| {
            let code = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
            let mut prog = [
                code(0x20, 0, 0, 0),                                // ld [0]: the syscall number
                code(0x15, 0, 1, libc::SYS_bpf as u32),             // jeq SYS_bpf
                code(0x06, 0, 0, 0x0005_0000 | libc::EPERM as u32), // ret ERRNO(EPERM)
                code(0x06, 0, 0, 0x7fff_0000),                      // ret ALLOW
            ];
            let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
            // SAFETY: no_new_privs and a filter on this thread only (no
            // TSYNC); the program is valid classic BPF that outlives the call.
            let ok = unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                    && libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) == 0
            };
            assert!(ok, "installing the filter: {}", std::io::Error::last_os_error());
            (seccomp_refuses(Call::Bpf), seccomp_refuses(Call::PerfEventOpen))
        })
        .join()
        .unwrap();
        assert_eq!(filtered, (true, false));
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        if parse_seccomp_mode(&status) == Some(0) {
            assert!(!seccomp_refuses(Call::Bpf));
            assert!(!seccomp_refuses(Call::PerfEventOpen));
        }
    }

    #[test]
    fn kernel_releases() {
        assert!(release_at_least("6.18.44-fc-v669", 5, 18));
        assert!(release_at_least("5.18.0", 5, 18));
        assert!(!release_at_least("5.15.0-91-generic", 5, 18));
        assert!(!release_at_least("", 5, 18));
    }

    #[test]
    fn btf_is_mapped_where_the_kernel_allows_it_and_read_otherwise() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("btf");
        std::fs::write(&file, b"\x9f\xeb\x01\x00rest").expect("write");
        let got = read_btf(&file).expect("reads");
        assert!(matches!(got, BtfBytes::Mapped(_)), "a regular file maps");
        assert_eq!(&got[..], b"\x9f\xeb\x01\x00rest");
        std::fs::write(&file, b"").expect("write");
        let empty = read_btf(&file).expect("reads");
        assert!(matches!(empty, BtfBytes::Read(_)), "an empty file cannot map: read instead");
        assert!(empty.is_empty());
        assert!(read_btf(&dir.path().join("absent")).is_err());
        // A sysfs attribute that cannot be mapped is read.
        if let Ok(want) = std::fs::read("/sys/kernel/uevent_seqnum") {
            let got = read_btf(Path::new("/sys/kernel/uevent_seqnum")).expect("reads");
            assert!(matches!(got, BtfBytes::Read(_)), "sysfs text attributes have no mmap");
            assert!(!got.is_empty() && got.len() == want.len(), "{:?} against {want:?}", &got[..]);
        }
        // Linux 6.16+ lets its own BTF be mapped (pages not in our RSS).
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if let Ok(vmlinux) = read_btf(Path::new("/sys/kernel/btf/vmlinux")) {
            if release_at_least(release.trim(), 6, 16) {
                assert!(matches!(vmlinux, BtfBytes::Mapped(_)), "{release}");
            }
            assert!(crate::ebpf::btf::Btf::parse(&vmlinux).is_ok());
        }
    }
}
