//! The benchmark driver behind `cargo xtask bench`: node-agent beside
//! Debian's node_exporter in one run on one machine, the per-event cost of
//! each eBPF probe against the empty-program floor, and the planner; writes
//! BENCHMARKS.md. Run as root (the eBPF part loads programs).
//!
//! Usage: node-agent-bench --agent PATH [--out FILE] [--quick]
//!        node-agent-bench --only network [--quick]   (that section alone, printed)
//!        node-agent-bench --only skb_drops [--quick] (ebpf_skb_drops's per-event cost alone, printed)
//!        node-agent-bench --only syscall_latency [--quick] (ebpf_syscall_latency's per-syscall cost, and bpftrace's, printed)
//!        node-agent-bench --only bpftrace [--probe NAME] [--quick]  (each probe, or NAME, against its bpftrace equivalent, printed)
//!        node-agent-bench --only collectors --agent PATH [--quick] (each collector's CPU per scrape, printed)
//!        node-agent-bench --only growth --agent PATH [--quick] (cost as the node grows: devices, mounts, pods; printed)
//!        node-agent-bench --only memory --agent PATH [--quick] (memory the kubelet's way, both side-by-side runs; printed)
//!        node-agent-bench --only services --agent PATH [--quick] (the Service watch's memory at 0, 1,000, 10,000 Services; printed)
//!        node-agent-bench --only tricks --agent PATH [--quick] (each memory trick of runtime::memory turned off in turn, the working set; printed)
//!        node-agent-bench --only sweep [--quick] (ebpf_tcp_peers's collector time with 0, 1,000, 5,000 connections open, sweeping or not; printed)
//!        node-agent-bench --only dns [--quick] (ebpf_dns's programs' kernel run time per event, UDP and TCP; printed)
//!        node-agent-bench --image-only [--out FILE]  (rewrites FILE's Image section alone, from `cargo xtask image`'s record)

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use node_agent_tests::compare::{self, COMMON_FLAGS};
use node_agent_tests::memcg::{self, MemCg};

type Res<T> = Result<T, String>;

use node_agent_tests::Kill;

fn start(bin: &Path, flags: &[String]) -> Res<(Kill, String, u32)> {
    node_agent_tests::start_exporter(bin, flags)
}

/// Drops `bin`'s clean pages from the page cache (those no process maps),
/// so that the exporter about to start faults its code in again and the
/// memory cgroup it starts in is charged for it, as a pod's first start is
/// (the page cache charges a page to the cgroup that first read it).
fn uncache(bin: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(bin) {
        // SAFETY: an advisory call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// Both exporters' binaries copied onto a disk that reads ahead as a
/// node's does ([`node_agent_tests::disk`]); the disk lives as long as the
/// first of the three.
fn staged(agent: &Path, ne: &Path) -> Res<(node_agent_tests::disk::Disk, PathBuf, PathBuf)> {
    // Room for both binaries and the file system's own (a debug build of
    // the agent is over 100 MiB).
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len() >> 20);
    let mib = (size(agent) + size(ne) + 64).max(128);
    let disk = node_agent_tests::disk::Disk::new(mib, node_agent_tests::disk::DEFAULT_READAHEAD_KB)?;
    let (a, n) = (disk.stage(agent)?, disk.stage(ne)?);
    Ok((disk, a, n))
}

/// [`start`] with the exporter in the memory cgroup `cg`, which it joins
/// between fork and exec.
fn start_in(bin: &Path, flags: &[String], cg: &MemCg) -> Res<(Kill, String, u32)> {
    uncache(bin);
    node_agent_tests::start_exporter_prepared(bin, flags, std::process::Stdio::null(), |c| cg.join_on_exec(c))
}

/// A memory cgroup's reading (zero when unreadable) and the process's RSS.
fn mem_now(cg: &mut MemCg, pid: u32) -> MemAt {
    MemAt { cg: cg.read().unwrap_or_default(), rss: memcg::rss_bytes(pid) }
}

/// Memory the kubelet's way (the cgroup's) beside RSS, at one moment.
#[derive(Default, Clone, Copy)]
struct MemAt {
    cg: memcg::Reading,
    rss: u64,
}

fn ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (user, system) CPU seconds a process has used (all its threads, alive or gone).
fn cpu_split(pid: u32) -> (f64, f64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let v = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (v(11) / ticks(), v(12) / ticks())
}

fn vm_hwm_kb(pid: u32) -> u64 {
    node_agent_tests::status_kb(&pid.to_string(), "VmHWM")
}

/// Resets VmHWM to the current RSS (Linux 4.0+: `clear_refs` value 5).
fn reset_hwm(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// (anonymous, file-backed) resident kB, from smaps_rollup.
fn rss_split_kb(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let get = |k: &str| {
        text.lines().find_map(|l| l.strip_prefix(k).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())).unwrap_or(0)
    };
    let (rss, anon) = (get("Rss:"), get("Anonymous:"));
    (anon, rss.saturating_sub(anon))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Default, Clone)]
struct ScrapeFigures {
    cpu_ms: f64,
    user_ms: f64,
    sys_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    rps_c1: f64,
    p99_c1_ms: f64,
    rps_c4: f64,
    p99_c4_ms: f64,
    rss_mb: f64,
    rss_load_mb: f64,
    anon_mb: f64,
    file_mb: f64,
    bytes: usize,
    bytes_gzip: usize,
    samples: usize,
    /// At start (answered its first scrapes), after the load, after idle.
    mem: [MemAt; 3],
    /// The cgroup's peak over the whole life, and during the load only.
    cg_peak_mb: f64,
    cg_peak_load_mb: f64,
}

/// Sequential keep-alive scrapes, interleaved between targets in rounds;
/// CPU per scrape from /proc/PID/stat, latency per request.
fn sequential(targets: &[(&str, u32)], rounds: usize, per_round: usize) -> Vec<((f64, f64), Vec<f64>)> {
    let agent = ureq::AgentBuilder::new().build();
    let mut out: Vec<((f64, f64), Vec<f64>)> = vec![((0.0, 0.0), Vec::new()); targets.len()];
    for _ in 0..rounds {
        for (i, (url, pid)) in targets.iter().enumerate() {
            let c0 = cpu_split(*pid);
            for _ in 0..per_round {
                let t = Instant::now();
                let ok = agent.get(url).call().ok().and_then(|r| {
                    let mut b = Vec::new();
                    r.into_reader().read_to_end(&mut b).ok().map(|_| b.len())
                });
                if ok.is_some() {
                    out[i].1.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            let c1 = cpu_split(*pid);
            out[i].0 .0 += c1.0 - c0.0;
            out[i].0 .1 += c1.1 - c0.1;
        }
    }
    for o in &mut out {
        o.1.sort_by(f64::total_cmp);
    }
    out
}

/// wrk's requests/s and p99 (ms).
fn wrk(url: &str, conns: usize, secs: u64) -> Res<(f64, f64)> {
    let threads = conns.min(2).to_string();
    let out = Command::new("wrk")
        .args(["-t", &threads, "-c", &conns.to_string(), "-d", &format!("{secs}s"), "--latency", url])
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text.lines().find_map(|l| l.strip_prefix("Requests/sec:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0);
    let p99 = text.lines().find_map(|l| l.trim().strip_prefix("99%")).map(|v| parse_wrk_time(v.trim())).unwrap_or(0.0);
    Ok((rps, p99))
}

fn parse_wrk_time(v: &str) -> f64 {
    let (num, mult) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e3)
    } else {
        (v, 1.0)
    };
    num.parse::<f64>().map(|x| x * mult).unwrap_or(0.0)
}

fn body_sizes(url: &str) -> (usize, usize, usize) {
    let plain = compare::http_get(url).unwrap_or_default();
    let samples = plain.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    let gz = ureq::get(url)
        .set("Accept-Encoding", "gzip")
        .call()
        .ok()
        .and_then(|r| {
            let mut b = Vec::new();
            r.into_reader().read_to_end(&mut b).ok().map(|_| b.len())
        })
        .unwrap_or(0);
    (plain.len(), gz, samples)
}

/// The node the bench's pods run on.
const BENCH_NODE: &str = "bench-node";
/// Pods on it: a full node (the kubelet's default limit), as issue #34
/// asks of memory the kubelet's way.
const BENCH_PODS: usize = 110;

/// An in-memory API server with `BENCH_PODS` pods on `BENCH_NODE` and as
/// many elsewhere (which the agent's field selector leaves out).
fn bench_cluster() -> Res<node_agent_tests::apiserver::Running> {
    use node_agent_tests::apiserver::{pod, Api, Running};
    let api = std::sync::Arc::new(Api::new());
    {
        let mut st = api.state.lock().map_err(|_| "API state poisoned".to_string())?;
        for i in 0..BENCH_PODS * 2 {
            let node = if i < BENCH_PODS { BENCH_NODE } else { "other-node" };
            let (uid, name) = (format!("00000000-0000-4000-8000-{i:012}"), format!("app-{i}"));
            let cid = format!("{:064x}", i + 1);
            api.put(&mut st, "pods", "bench", &name, pod(&uid, "bench", &name, node, "app", &cid), false);
        }
    }
    Running::start(api).map_err(|e| format!("API server: {e}"))
}

/// `--only hold`: the agent as the kubelet table runs it with eBPF (every
/// probe, pod attribution against the in-memory API server's pods), in a
/// memory cgroup of its own, warmed up with 20 scrapes and then left idle
/// for `secs`, its address, PID and cgroup printed: for looking inside it
/// (smaps, the cgroup's memory.stat, a profiler) between bench runs.
fn hold(agent: &Path, secs: Duration) -> Res<()> {
    let mut flags: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    let api = bench_cluster()?;
    flags.extend(pod_flags(&api));
    // From the bench's own disk, as the memory table's agents run.
    let disk = node_agent_tests::disk::Disk::new(
        (std::fs::metadata(agent).map_or(0, |m| m.len() >> 20) + 64).max(128),
        node_agent_tests::disk::DEFAULT_READAHEAD_KB,
    )?;
    let agent = &disk.stage(agent)?;
    let mut cg = MemCg::new("agent").map_err(|e| format!("memory cgroup: {e}"))?;
    let (_a, url, pid) = start_in(agent, &flags, &cg)?;
    let r0 = cg.read().unwrap_or_default();
    wait_for_sample(&url, "node_ebpf_pod_attribution_synced", 1.0)?;
    sequential(&[(&url, pid)], 1, 20);
    let r = cg.read().unwrap_or_default();
    println!(
        "url {url} pid {pid} cgroup {} working_set {} anon {} kernel {} active_file {} usage {} peak {} start_usage {}",
        cg.path().display(),
        r.working_set,
        r.anon,
        r.kernel,
        r.active_file,
        r.usage,
        r.peak,
        r0.usage
    );
    std::thread::sleep(secs);
    Ok(())
}

/// The flags that point the agent's pod attribution at `api`, for the
/// bench's node.
fn pod_flags(api: &node_agent_tests::apiserver::Running) -> [String; 2] {
    [
        format!("--collector.ebpf_pods.kubeconfig={}", api.kubeconfig.path().display()),
        format!("--collector.ebpf_pods.node-name={BENCH_NODE}"),
    ]
}

/// Waits (up to 20 s) until a scrape of `url` has the unlabelled sample
/// `name` at `value`.
fn wait_for_sample(url: &str, name: &str, value: f64) -> Res<()> {
    let t = Instant::now();
    let has = |body: String| {
        body.lines().any(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse::<f64>().ok()) == Some(value))
    };
    while t.elapsed() < Duration::from_secs(20) {
        if compare::http_get(url).map(has).unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{url} never showed {name} {value}"))
}

/// How the agent was built: `--pgo` when `cargo xtask bench` built it with
/// the PGO profile (GNU ld, the image's linker, groups the never-run code at
/// the start of `.text` without a section of its own, so the binary does
/// not tell).
fn build_kind(pgo: bool) -> &'static str {
    if pgo {
        "release build with profile-guided optimization (`pgo/node-agent.profdata.gz`, trained with the image's toolchain on the agent's build; the code its training never ran grouped apart)"
    } else {
        "release build (without profile-guided optimization)"
    }
}

/// The commit the bench measures, `+ uncommitted changes` when the work
/// tree differs from it (the figures are then of no commit).
fn commit() -> String {
    let git = |args: &[&str]| Command::new("git").args(args).output().ok().filter(|o| o.status.success());
    let Some(rev) = git(&["rev-parse", "--short=12", "HEAD"]) else { return "unknown (no git)".into() };
    let rev = String::from_utf8_lossy(&rev.stdout).trim().to_string();
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(o) if o.stdout.is_empty() => rev,
        _ => format!("{rev} + uncommitted changes"),
    }
}

/// Bytes in the bench's "MB" (its RSS figures are kB / 1024).
const MB: f64 = 1024.0 * 1024.0;

/// How long both stay idle after the load before their steady RSS is read.
fn settle_secs(quick: bool) -> u64 {
    if quick {
        6
    } else {
        8
    }
}

fn scrape_phase(agent_bin: &Path, ne_bin: &Path, ebpf: bool, quick: bool) -> Res<(ScrapeFigures, ScrapeFigures)> {
    let common: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    let mut agent_flags = common.clone();
    // With eBPF, pod attribution is on too: an API server (in memory, plain
    // HTTP) lists the node's pods to the agent, which watches them.
    let _api = if ebpf {
        let api = bench_cluster()?;
        agent_flags.extend(pod_flags(&api));
        Some(api)
    } else {
        agent_flags.extend(node_agent::manifests::agent_only_collectors().iter().map(|c| format!("--no-collector.{c}")));
        None
    };
    // Each in a memory cgroup of its own, as the kubelet sees a container
    // (declared before the processes: removed after they are gone).
    let cg = |name: &str| MemCg::new(name).map_err(|e| format!("memory cgroup {name}: {e}"));
    let (mut cg_a, mut cg_n) = (cg("agent")?, cg("node-exporter")?);
    let (_a, ua, pa) = start_in(agent_bin, &agent_flags, &cg_a)?;
    if ebpf {
        wait_for_sample(&ua, "node_ebpf_pod_attribution_synced", 1.0)?;
    }
    let (_n, un, pn) = start_in(ne_bin, &common, &cg_n)?;
    let mem_start = [mem_now(&mut cg_a, pa), mem_now(&mut cg_n, pn)];
    let (rounds, per_round, secs) = if quick { (4, 25, 3) } else { (10, 50, 10) };
    // Warm up both; from here on, the peak is the load's (start-up, e.g.
    // parsing the kernel's BTF when eBPF programs load, is reported apart).
    sequential(&[(&ua, pa), (&un, pn)], 1, 20);
    let start_hwm = (vm_hwm_kb(pa), vm_hwm_kb(pn));
    reset_hwm(pa);
    reset_hwm(pn);
    let cg_peak_start = [cg_a.read().map_or(0, |r| r.peak), cg_n.read().map_or(0, |r| r.peak)];
    let peak_reset = cg_a.reset_peak() & cg_n.reset_peak();
    let seq = sequential(&[(&ua, pa), (&un, pn)], rounds, per_round);
    let n = (rounds * per_round) as f64;
    let mut figs = [ScrapeFigures::default(), ScrapeFigures::default()];
    for (f, ((user, sys), lat)) in figs.iter_mut().zip(&seq) {
        f.user_ms = user / n * 1e3;
        f.sys_ms = sys / n * 1e3;
        f.cpu_ms = f.user_ms + f.sys_ms;
        f.p50_ms = percentile(lat, 0.5);
        f.p99_ms = percentile(lat, 0.99);
    }
    for (f, url) in figs.iter_mut().zip([&ua, &un]) {
        let (b, g, s) = body_sizes(url);
        f.bytes = b;
        f.bytes_gzip = g;
        f.samples = s;
    }
    // wrk, interleaved: agent c1, node_exporter c1, agent c4, node_exporter c4.
    for conns in [1usize, 4] {
        for (f, url) in figs.iter_mut().zip([&ua, &un]) {
            let (rps, p99) = wrk(url, conns, secs)?;
            if conns == 1 {
                f.rps_c1 = rps;
                f.p99_c1_ms = p99;
            } else {
                f.rps_c4 = rps;
                f.p99_c4_ms = p99;
            }
        }
    }
    let mem_load = [mem_now(&mut cg_a, pa), mem_now(&mut cg_n, pn)];
    // Steady state: both idle for a while after the load, as between two
    // of Prometheus's scrapes (15 s and more apart), before the RSS split.
    // (node-agent gives back the heap of overlapping scrapes on its 5 s
    // tick; node_exporter's Go runtime keeps what it freed until its
    // scavenger returns it in the background.)
    std::thread::sleep(std::time::Duration::from_secs(settle_secs(quick)));
    for (f, (pid, hwm_start)) in figs.iter_mut().zip([(pa, start_hwm.0), (pn, start_hwm.1)]) {
        let load = vm_hwm_kb(pid);
        f.rss_load_mb = load as f64 / 1024.0;
        f.rss_mb = load.max(hwm_start) as f64 / 1024.0;
        let (anon, file) = rss_split_kb(pid);
        f.anon_mb = anon as f64 / 1024.0;
        f.file_mb = file as f64 / 1024.0;
    }
    let mem_idle = [mem_now(&mut cg_a, pa), mem_now(&mut cg_n, pn)];
    for (i, f) in figs.iter_mut().enumerate() {
        f.mem = [mem_start[i], mem_load[i], mem_idle[i]];
        let load_peak = f.mem[1].cg.peak.max(f.mem[2].cg.peak);
        f.cg_peak_load_mb = if peak_reset { load_peak as f64 / MB } else { f64::NAN };
        f.cg_peak_mb = load_peak.max(cg_peak_start[i]) as f64 / MB;
    }
    let [a, b] = figs;
    Ok((a, b))
}

// ---- Where a scrape's CPU goes ------------------------------------------

/// CPU time (ns) of a process's live threads, from their schedstat (exact
/// to the nanosecond, where /proc/PID/stat counts 10 ms ticks).
fn task_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// One keep-alive scrape, whole body read.
fn scrape_once(http: &ureq::Agent, url: &str) -> bool {
    http.get(url).call().ok().and_then(|r| r.into_reader().read_to_end(&mut Vec::new()).ok()).is_some()
}

/// (lower quartile, median, upper quartile).
type Quartiles = (f64, f64, f64);

struct CollectorCost {
    name: String,
    /// Over rounds, µs of CPU per scrape.
    us: Quartiles,
}

/// Each of the scrape table's collectors (node_exporter's defaults) alone,
/// in an agent of its own, against an agent with no collector at all (its
/// HTTP, encoding and process_* metrics), and the whole default set in one
/// agent; CPU per scrape of each agent's threads in interleaved rounds.
/// Returns (the empty agent, the whole set, each collector's cost above
/// the empty agent, costliest first).
fn collector_costs(agent_bin: &Path, quick: bool) -> Res<(Quartiles, Quartiles, Vec<CollectorCost>)> {
    let common: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    let agent_only = node_agent::manifests::agent_only_collectors();
    let names: Vec<&str> = host::catalog::collectors().filter(|c| c.1).map(|c| c.0).filter(|c| !agent_only.contains(c)).collect();
    let mut agents = Vec::new();
    let all: Vec<String> = agent_only.iter().map(|c| format!("--no-collector.{c}")).collect();
    agents.push(("(all)".to_string(), start(agent_bin, &[common.clone(), all].concat())?));
    agents.push(("(none)".to_string(), start(agent_bin, &[common.clone(), vec!["--collector.disable-defaults".into()]].concat())?));
    for name in &names {
        let flags = [common.clone(), vec!["--collector.disable-defaults".into(), format!("--collector.{name}")]].concat();
        agents.push((name.to_string(), start(agent_bin, &flags)?));
    }
    let (rounds, per_round) = if quick { (3, 50) } else { (9, 200) };
    let http = ureq::AgentBuilder::new().build();
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); agents.len()];
    for _ in 0..rounds {
        for (i, (_, (_, url, pid))) in agents.iter().enumerate() {
            for _ in 0..5 {
                scrape_once(&http, url);
            }
            let c0 = task_cpu_ns(*pid);
            for _ in 0..per_round {
                scrape_once(&http, url);
            }
            per[i].push(task_cpu_ns(*pid).saturating_sub(c0) as f64 / per_round as f64 / 1e3);
        }
    }
    let (all, empty) = (quartiles(&per[0]), quartiles(&per[1]));
    let mut costs: Vec<CollectorCost> = agents
        .iter()
        .zip(&per)
        .skip(2)
        .map(|((name, _), v)| {
            let above: Vec<f64> = v.iter().zip(&per[1]).map(|(c, e)| c - e).collect();
            CollectorCost { name: name.clone(), us: quartiles(&above) }
        })
        .collect();
    costs.sort_by(|a, b| b.us.1.total_cmp(&a.us.1));
    Ok((empty, all, costs))
}

const COLLECTOR_COST_METHOD: &str = "Each collector of the scrape table (node_exporter's default set) alone in an agent of its own, against an agent with no collector (HTTP, encoding, the process_* and scrape metrics), and the whole set in one agent; CPU per scrape of the agent's threads from their schedstat, in interleaved rounds of sequential keep-alive scrapes; medians over the rounds, interquartile range in brackets. A collector's cost is its agent's minus the empty agent's, round by round. The kernel's share is the kernel generating the files read (mountinfo, /proc/net/udp's walk of the whole UDP hash table, per-CPU sums of snmp6 and vmstat): `perf record -e cpu-clock -g` of the default agent shows the same order.";

fn collector_cost_table(empty: Quartiles, all: Quartiles, costs: &[CollectorCost]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "| part | CPU per scrape (IQR) |");
    let _ = writeln!(md, "|---|---|");
    let _ = writeln!(md, "| the whole default set in one agent | {:.0} µs ({:.0}–{:.0}) |", all.1, all.0, all.2);
    let _ = writeln!(md, "| an agent with no collector | {:.0} µs ({:.0}–{:.0}) |", empty.1, empty.0, empty.2);
    let top = 15.min(costs.len());
    for c in &costs[..top] {
        let _ = writeln!(md, "| {} | {:.0} µs ({:.0}–{:.0}) |", c.name, c.us.1, c.us.0, c.us.2);
    }
    let rest: f64 = costs[top..].iter().map(|c| c.us.1).sum();
    let _ = writeln!(md, "| the other {} collectors together | {:.0} µs |", costs.len() - top, rest);
    let sum: f64 = costs.iter().map(|c| c.us.1).sum::<f64>() + empty.1;
    let _ = writeln!(md, "| sum of the parts | {sum:.0} µs |");
    md
}

// ---- eBPF per-event costs ----------------------------------------------

fn getpid_loop(n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    t.elapsed().as_secs_f64()
}

/// `n` UDP datagrams over loopback to a port just closed: each one is
/// dropped (kfree_skb, reason NO_SOCKET).
fn closed_port_loop(n: usize) -> f64 {
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).expect("bind");
    let t = Instant::now();
    for _ in 0..n {
        let _ = sender.send_to(b"x", closed);
    }
    t.elapsed().as_secs_f64()
}

/// `n` UDP datagrams over loopback to a socket whose classic BPF filter
/// drops everything (kfree_skb, reason SOCKET_FILTER, with the receiving
/// socket, whose cgroup pod attribution reads).
fn filtered_loop(n: usize) -> f64 {
    use std::os::fd::AsRawFd;
    let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut insn = [libc::sock_filter { code: 0x06 /* BPF_RET|BPF_K */, jt: 0, jf: 0, k: 0 }];
    let prog = libc::sock_fprog { len: 1, filter: insn.as_mut_ptr() };
    // SAFETY: a valid socket and an option value sized as SO_ATTACH_FILTER requires.
    let rc = unsafe {
        libc::setsockopt(
            rx.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    assert_eq!(rc, 0, "SO_ATTACH_FILTER: {}", std::io::Error::last_os_error());
    let to = rx.local_addr().expect("addr");
    let t = Instant::now();
    for _ in 0..n {
        let _ = sender.send_to(b"x", to);
    }
    t.elapsed().as_secs_f64()
}

/// `n` DNS exchanges over UDP on loopback in one thread: a query (type A)
/// from a client socket to a server socket on port `port` of 127.0.0.153,
/// read there and answered (NXDOMAIN), the answer read by the client. With
/// `port` 53 each exchange is one query and one response for ebpf_dns;
/// with another port the same four packet passes are traffic it only
/// looks at and lets through (its cost on every other packet of the node).
fn dns_loop(n: usize, port: u16) -> f64 {
    let server = std::net::UdpSocket::bind(("127.0.0.153", port)).expect("bind the DNS server (127.0.0.153)");
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    client.connect(("127.0.0.153", port)).expect("connect");
    let mut query = [0x12u8, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'p', b'i', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1];
    let mut buf = [0u8; 512];
    let t = Instant::now();
    for i in 0..n {
        query[..2].copy_from_slice(&(i as u16).to_be_bytes());
        client.send(&query).expect("send");
        let (len, from) = server.recv_from(&mut buf).expect("recv");
        buf[2] = 0x81;
        buf[3] = 0x83;
        server.send_to(&buf[..len], from).expect("answer");
        let _ = client.recv(&mut buf).expect("recv the answer");
    }
    t.elapsed().as_secs_f64()
}

/// `n` UDP datagrams on loopback in one thread from an unconnected socket
/// (sendto, with the address each time: musl's resolver sends so, as
/// QUIC and other UDP servers answer), to a socket on port `port` of
/// 127.0.0.153 that reads each. With `port` 53 each is a query for
/// ebpf_dns (its server from its sendmsg program); with another port, the
/// cost every such datagram of the node pays for the sendmsg programs
/// being there (the kernel locks the socket around them) and the packet
/// programs looking at it.
fn sendto_loop(n: usize, port: u16) -> f64 {
    let server = std::net::UdpSocket::bind(("127.0.0.153", port)).expect("bind the server (127.0.0.153)");
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = std::net::SocketAddr::from(([127, 0, 0, 153], port));
    let mut query = [0x12u8, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'p', b'i', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1];
    let mut buf = [0u8; 512];
    let t = Instant::now();
    for i in 0..n {
        query[..2].copy_from_slice(&(i as u16).to_be_bytes());
        client.send_to(&query, to).expect("send");
        let _ = server.recv(&mut buf).expect("recv");
    }
    t.elapsed().as_secs_f64()
}

/// `n` DNS exchanges over TCP on loopback in one thread, one connection
/// each: connect to 127.0.0.153 port 53, a query, an answer of
/// `answer_bytes` read whole, close; a thread of its own serves them.
fn tcp_dns_loop(n: usize, answer_bytes: usize) -> f64 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind(("127.0.0.153", 53)).expect("bind the DNS server (127.0.0.153:53)");
    let server = std::thread::spawn(move || {
        for c in l.incoming().take(n) {
            let Ok(mut c) = c else { continue };
            let mut h = [0u8; 2];
            let mut q = [0u8; 512];
            if c.read_exact(&mut h).is_err() || c.read_exact(&mut q[..u16::from_be_bytes(h) as usize]).is_err() {
                continue;
            }
            let mut a = vec![0u8; 2 + answer_bytes];
            a[..2].copy_from_slice(&(answer_bytes as u16).to_be_bytes());
            a[2..4].copy_from_slice(&q[..2]);
            a[4] = 0x81;
            a[5] = 0x80;
            let _ = c.write_all(&a);
        }
    });
    let query = [0u8, 26, 0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'p', b'i', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1];
    let mut buf = vec![0u8; 2 + answer_bytes];
    let t = Instant::now();
    for _ in 0..n {
        let mut c = std::net::TcpStream::connect(("127.0.0.153", 53)).expect("connect");
        c.write_all(&query).expect("query");
        c.read_exact(&mut buf).expect("answer");
    }
    let secs = t.elapsed().as_secs_f64();
    let _ = server.join();
    secs
}

/// One workload of [`dns_program_time`]: what it is, and per program of
/// ebpf_dns its run time and runs per event.
struct DnsTime {
    what: &'static str,
    per_program: Vec<(&'static str, f64, f64)>,
}

/// ebpf_dns's programs attached with the kernel's run-time statistics on,
/// and for each workload the run time and runs of each program per event
/// (every packet of the node they see meanwhile is in it too).
fn dns_program_time(quick: bool) -> Res<Vec<DnsTime>> {
    let (u, t) = if quick { (20_000, 1000) } else { (100_000, 5000) };
    let (shared, _probe) = attach_programs(&agent_common::dns::PROGRAMS, false, true)?;
    let runs = || -> Vec<(f64, u64)> {
        agent_common::dns::PROGRAMS.iter().map(|p| shared.program_stats(p.name).and_then(|s| s.run).unwrap_or((0.0, 0))).collect()
    };
    type Work = Box<dyn Fn() -> f64>;
    let cases: [(&str, usize, Work); 4] = [
        ("DNS query + response over UDP, connected client (loopback)", u, Box::new(move || dns_loop(u, 53))),
        ("the same exchange on port 5353 (other traffic)", u, Box::new(move || dns_loop(u, 5353))),
        ("UDP datagram to port 5353 from an unconnected socket (sendto)", u, Box::new(move || sendto_loop(u, 5353))),
        ("DNS over TCP: connect, query, 12,000-byte answer, close (loopback)", t, Box::new(move || tcp_dns_loop(t, 12_000))),
    ];
    let mut out = Vec::new();
    for (what, events, work) in cases {
        let before = runs();
        work();
        let after = runs();
        let per_program = agent_common::dns::PROGRAMS
            .iter()
            .zip(before.iter().zip(&after))
            .filter(|(_, (b, a))| a.1 > b.1)
            .map(|(p, (b, a))| (p.name, (a.0 - b.0) / (a.1 - b.1) as f64 * 1e9, (a.1 - b.1) as f64 / events as f64))
            .collect();
        out.push(DnsTime { what, per_program });
    }
    Ok(out)
}

fn dns_time_section(rows: &[DnsTime]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## ebpf_dns: program time per event\n");
    let _ = writeln!(md, "ebpf_dns's programs alone, with the kernel's run-time statistics (kernel.bpf_stats_enabled): for each workload, the programs' run time per event, summed, and each program's time per run and runs per event (the kernel's own dispatch, and the socket lock a sendmsg program takes, are not in it; every packet of the node the programs see meanwhile is). `node-agent-bench --only dns` prints the same.\n");
    let _ = writeln!(md, "| event | program time per event | per program: time per run × runs per event |\n|---|---|---|");
    for r in rows {
        let total: f64 = r.per_program.iter().map(|(_, ns, n)| ns * n).sum();
        let each: Vec<String> = r.per_program.iter().map(|(p, ns, n)| format!("{p} {ns:.0} ns × {n:.1}")).collect();
        let _ = writeln!(md, "| {} | {total:.0} ns | {} |", r.what, each.join(", "));
    }
    md
}

/// bpftrace's nearest equivalent of ebpf_dns, with no cgroup skb programs
/// (and no kprobes here): every packet queued to a device, its UDP ports
/// and DNS header read from the skb, queries timed by id and counted by
/// cgroup, responses by cgroup and rcode, latencies in a log2 histogram.
/// It sees loopback's packets once each (ebpf_dns sees each twice: out of
/// one socket, into the other).
const BPFTRACE_DNS: &str = "tracepoint:net:net_dev_queue { $skb = (struct sk_buff *)args->skbaddr; $ip = (struct iphdr *)($skb->head + $skb->network_header); if ($ip->protocol == 17) { $udp = (struct udphdr *)($skb->head + $skb->transport_header); $d = $udp->dest; $dport = (($d & 0xff) << 8) | ($d >> 8); $s = $udp->source; $sport = (($s & 0xff) << 8) | ($s >> 8); $dns = $skb->head + $skb->transport_header + 8; $id = *(uint16 *)$dns; $fl = *(uint16 *)($dns + 2); if ($dport == 53) { @start[$id] = nsecs; @q[cgroup] = count(); } else if ($sport == 53) { $t = @start[$id]; if ($t) { @lat[cgroup] = hist(nsecs - $t); delete(@start[$id]); } @r[cgroup, ($fl >> 8) & 15] = count(); } } }";

/// This process's cgroup v2 id (the inode of its directory), as bpftrace's
/// `cgroup` names it; 0 when unknown.
fn own_cgroup_v2_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let rel = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("0::").map(|p| p.trim_start_matches('/').to_string())))
        .unwrap_or_default();
    node_agent::pods::cgroup::v2_root(Path::new("/sys")).and_then(|root| std::fs::metadata(root.join(rel)).ok()).map_or(0, |m| m.ino())
}

/// A drop case: probe, event, pod attribution on, the workload.
type DropCase = (&'static str, &'static str, bool, fn(usize) -> f64);

/// The cost of ebpf_skb_drops per dropped packet: without a socket, and at
/// a socket with and without pod attribution's walk to its cgroup.
fn skb_drop_costs(quick: bool) -> Res<Vec<EventCost>> {
    let (reps, d) = if quick { (2, 20_000) } else { (5, 100_000) };
    let mut out = Vec::new();
    let cases: [DropCase; 3] = [
        ("ebpf_skb_drops", "UDP datagram to a closed port (loopback)", false, closed_port_loop),
        ("ebpf_skb_drops", "UDP datagram dropped by a socket filter (loopback)", false, filtered_loop),
        ("ebpf_skb_drops + ebpf_pods", "UDP datagram dropped by a socket filter (loopback)", true, filtered_loop),
    ];
    for (probe, event, pods, work) in cases {
        let (b, w, s) = with_without(reps, &agent_common::skb_drops::PROGRAMS, pods, || work(d))?;
        let (t, runs) = s.values().fold((0.0, 0u64), |a, s| (a.0 + s.0, a.1 + s.1));
        out.push(EventCost {
            probe,
            event,
            base_ns: b / d as f64 * 1e9,
            with_ns: w / d as f64 * 1e9,
            kernel_ns: (runs > 0).then(|| t / runs as f64 * 1e9),
        });
    }
    Ok(out)
}

/// bpftrace's equivalent of ebpf_syscall_latency: a start time per thread
/// on sys_enter, a log2 histogram per syscall number on sys_exit (bpftrace
/// has no native buckets; `hist()` is its cheapest).
const BPFTRACE_SYSLAT: &str = "tracepoint:raw_syscalls:sys_enter { @s[tid] = nsecs; } \
tracepoint:raw_syscalls:sys_exit /@s[tid]/ { @h[args->id] = hist(nsecs - @s[tid]); delete(@s[tid]); }";

/// `work` without and with bpftrace running `script` on `tracepoints`
/// tracepoints (minimum over `reps` alternations), through the same runner
/// as the peer table; None when bpftrace is not installed or does not
/// attach (said on stderr).
fn with_without_bpftrace(reps: usize, script: &str, tracepoints: usize, mut work: impl FnMut() -> f64) -> Option<(f64, f64)> {
    compare::which("bpftrace")?;
    let (mut base, mut with) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        base = base.min(work());
        let mut bt = Bpftrace::start(script, tracepoints).map_err(|e| eprintln!("bench: {e}")).ok()?;
        with = with.min(work());
        bt.stop();
    }
    Some((base, with))
}

/// ebpf_syscall_latency per syscall (getpid, the cheapest), alone and with
/// pod attribution on, and bpftrace's equivalent.
fn syscall_latency_costs(quick: bool) -> Res<Vec<EventCost>> {
    let (reps, n) = if quick { (2, 500_000) } else { (5, 2_000_000) };
    let mut out = Vec::new();
    for (probe, pods) in [("ebpf_syscall_latency", false), ("ebpf_syscall_latency + ebpf_pods", true)] {
        let (b, w, s) = with_without(reps, &agent_common::syscall_latency::PROGRAMS, pods, || getpid_loop(n))?;
        let (t, runs) = s.values().fold((0.0, 0u64), |a, s| (a.0 + s.0, a.1 + s.1));
        out.push(EventCost {
            probe,
            event: "syscall (getpid; two programs run per syscall)",
            base_ns: b / n as f64 * 1e9,
            with_ns: w / n as f64 * 1e9,
            kernel_ns: (runs > 0).then(|| t / runs as f64 * 1e9),
        });
    }
    match with_without_bpftrace(reps, BPFTRACE_SYSLAT, 2, || getpid_loop(n)) {
        Some((b, w)) => out.push(EventCost {
            probe: "bpftrace (raw_syscalls enter/exit, hist by id)",
            event: "syscall (getpid)",
            base_ns: b / n as f64 * 1e9,
            with_ns: w / n as f64 * 1e9,
            kernel_ns: None,
        }),
        None => eprintln!("bench: bpftrace not installed (or not attaching): no bpftrace row"),
    }
    Ok(out)
}

fn proc_ctxt() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("ctxt ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Pins the calling thread to CPU 0.
fn pin_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A two-thread ping-pong on one CPU (every hand-off is a context switch,
/// with no idle wake-ups); (seconds, context switches).
fn ping_pong(rounds: usize) -> (f64, u64) {
    use std::io::Write;
    pin_cpu0();
    let (Ok((mut a_r, mut a_w)), Ok((mut b_r, mut b_w))) = (std::io::pipe(), std::io::pipe()) else { return (0.0, 0) };
    let c0 = proc_ctxt();
    let t = Instant::now();
    let th = std::thread::spawn(move || {
        pin_cpu0();
        let mut buf = [0u8; 1];
        for _ in 0..rounds {
            if a_r.read_exact(&mut buf).is_err() || b_w.write_all(&buf).is_err() {
                return;
            }
        }
    });
    let mut buf = [1u8; 1];
    for _ in 0..rounds {
        if a_w.write_all(&buf).is_err() || b_r.read_exact(&mut buf).is_err() {
            break;
        }
    }
    let _ = th.join();
    (t.elapsed().as_secs_f64(), proc_ctxt() - c0)
}

const SPAWN_EVENT: &str = "process start + exit + wait (clone with CLONE_VFORK)";

/// A new process that exits at once, waited for, `n` times: clone with
/// `CLONE_VM | CLONE_VFORK` (what posix_spawn does), so the same
/// sched_process_fork and sched_process_exit events as a fork, without
/// copying the bench's page tables: a fork of this process takes about
/// 290 µs and varies by tens of µs between runs, which buried the probes'
/// cost; this takes about a seventh of it.
fn spawn_loop(n: usize) -> f64 {
    extern "C" fn child(_: *mut libc::c_void) -> libc::c_int {
        // SAFETY: _exit ends the child at once; it touches nothing shared.
        unsafe { libc::_exit(0) }
    }
    let mut stack = vec![0u8; 64 * 1024];
    // The stack grows down from its end, 16-byte aligned.
    let top = ((stack.as_mut_ptr() as usize + stack.len()) & !15) as *mut libc::c_void;
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: the child runs `child` on its own stack (inside `stack`,
        // alive until after the loop) and only calls _exit; with
        // CLONE_VFORK this thread waits until it has.
        let pid = unsafe { libc::clone(child, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, std::ptr::null_mut()) };
        if pid > 0 {
            let mut status = 0;
            // SAFETY: reaps the child just created; `status` is writable.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        }
    }
    drop(stack);
    t.elapsed().as_secs_f64()
}

struct LoopDev {
    path: String,
    _file: tempfile::NamedTempFile,
}
impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.path]).status();
    }
}

fn loop_dev() -> Res<LoopDev> {
    let file = tempfile::NamedTempFile::new_in("/var/tmp").map_err(|e| e.to_string())?;
    file.as_file().set_len(64 << 20).map_err(|e| e.to_string())?;
    let out = Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(file.path()).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    Ok(LoopDev { path: String::from_utf8_lossy(&out.stdout).trim().to_string(), _file: file })
}

/// The unbound workqueues' CPU mask (the loop device's workers run there).
const WQ_CPUMASK: &str = "/sys/devices/virtual/workqueue/cpumask";

/// While alive, the calling thread and the unbound workqueues' workers
/// (the loop device's) share CPU 0: every read hands off to the loop worker
/// and back on one CPU, a context switch each way with no idle CPU woken
/// through the hypervisor, whose wake-up latency (tens of µs at times)
/// otherwise swamps a probe's cost. Restores the mask and the thread's
/// affinity when dropped.
struct OneCpu {
    mask: Option<String>,
    affinity: libc::cpu_set_t,
}

impl OneCpu {
    fn pin() -> OneCpu {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; both calls only
        // read or write the set passed, for this thread.
        let affinity = unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old);
            old
        };
        let mask = std::fs::read_to_string(WQ_CPUMASK).ok().filter(|_| std::fs::write(WQ_CPUMASK, "1").is_ok());
        pin_cpu0();
        OneCpu { mask, affinity }
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        if let Some(m) = &self.mask {
            let _ = std::fs::write(WQ_CPUMASK, m.trim());
        }
        // SAFETY: restores the set read in pin() for this thread.
        unsafe {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.affinity);
        }
    }
}

fn direct_reads(dev: &str, n: usize) -> f64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let _one_cpu = OneCpu::pin();
    let Ok(f) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev) else { return 0.0 };
    let Ok(layout) = std::alloc::Layout::from_size_align(4096, 4096) else { return 0.0 };
    // SAFETY: non-zero layout; freed below.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return 0.0;
    }
    // SAFETY: 4096 bytes we own.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 4096) };
    let t = Instant::now();
    for i in 0..n {
        let _ = f.read_at(buf, ((i % 16000) * 4096) as u64);
    }
    let e = t.elapsed().as_secs_f64();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    e
}

/// Runs `work` with no probe and with the probe attached, alternating
/// `reps` times, and returns the minimum of each (seconds); then once more
/// with the kernel's BPF statistics on, for the programs' own run time
/// (statistics cost time themselves, so they are off while timing).
/// (seconds without, seconds with, kernel statistics per program).
type Timings = (f64, f64, BTreeMap<String, (f64, u64)>);

/// `pods`: with pod attribution on (cgroup lookups in the programs).
/// Loads the test object and attaches `programs` (detached when dropped).
fn attach_programs(
    programs: &[agent_common::Program],
    pods: bool,
    stats: bool,
) -> Res<(std::sync::Arc<node_agent::ebpf::Shared>, node_agent::ebpf::Probe)> {
    let mut ctx = node_agent::probes::Context::with_object(node_agent_tests::TEST_OBJECT, stats);
    ctx.attribute = pods;
    // ebpf_tcp_peers reads each socket's cgroup, as on a node with a
    // Kubernetes API (nothing else reads this).
    ctx.kube = true;
    let shared = ctx.ebpf().map_err(|e| e.to_string())?;
    if pods && ctx.pod_events != agent_common::pods::ALL {
        return Err(format!("pod attribution serves only events {:#x} here", ctx.pod_events));
    }
    let p = node_agent::ebpf::Probe::attach(Ok(shared.clone()), programs);
    if !p.up() {
        return Err(format!("probe {:?} did not attach", programs.iter().map(|x| x.name).collect::<Vec<_>>()));
    }
    Ok((shared, p))
}

fn with_without(reps: usize, programs: &[agent_common::Program], pods: bool, mut work: impl FnMut() -> f64) -> Res<Timings> {
    let attach = |stats: bool| attach_programs(programs, pods, stats);
    let (mut base, mut probe) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        base = base.min(work());
        let _attached = attach(false)?;
        probe = probe.min(work());
    }
    let (shared, _p) = attach(true)?;
    work();
    let mut stats = BTreeMap::new();
    for p in programs {
        let name = p.name;
        if let Some(s) = shared.program_stats(name).and_then(|s| s.run) {
            stats.insert(name.to_string(), s);
        }
    }
    Ok((base, probe, stats))
}

struct EventCost {
    probe: &'static str,
    event: &'static str,
    base_ns: f64,
    with_ns: f64,
    kernel_ns: Option<f64>,
}

/// close(-1) in a loop: a syscall that fails (EBADF) every time.
fn failing_loop(n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: closing an invalid descriptor only fails.
        unsafe { libc::close(-1) };
    }
    t.elapsed().as_secs_f64()
}

fn ebpf_costs(quick: bool) -> Res<Vec<EventCost>> {
    let reps = if quick { 2 } else { 5 };
    let mut out = Vec::new();
    let kernel = |stats: &BTreeMap<String, (f64, u64)>| {
        let (t, n) = stats.values().fold((0.0, 0u64), |a, s| (a.0 + s.0, a.1 + s.1));
        (n > 0).then(|| t / n as f64 * 1e9)
    };

    let n = if quick { 500_000 } else { 2_000_000 };
    let (b, w, s) = with_without(reps, &[agent_common::test_programs::EMPTY], false, || getpid_loop(n))?;
    out.push(EventCost {
        probe: "empty program (floor)",
        event: "syscall (getpid)",
        base_ns: b / n as f64 * 1e9,
        with_ns: w / n as f64 * 1e9,
        kernel_ns: kernel(&s),
    });
    let (b, w, s) = with_without(reps, &agent_common::syscalls::PROGRAMS, false, || getpid_loop(n))?;
    out.push(EventCost {
        probe: "ebpf_syscalls",
        event: "syscall (getpid)",
        base_ns: b / n as f64 * 1e9,
        with_ns: w / n as f64 * 1e9,
        kernel_ns: kernel(&s),
    });
    let sys_exit = agent_common::syscalls::PROGRAMS;
    let (b, w, s) = with_without(reps, &sys_exit, false, || failing_loop(n))?;
    out.push(EventCost {
        probe: "ebpf_syscalls",
        event: "failed syscall (close(-1))",
        base_ns: b / n as f64 * 1e9,
        with_ns: w / n as f64 * 1e9,
        kernel_ns: kernel(&s),
    });
    let (b, w, s) = with_without(reps, &sys_exit, true, || failing_loop(n))?;
    out.push(EventCost {
        probe: "ebpf_syscalls + ebpf_pods",
        event: "failed syscall (close(-1))",
        base_ns: b / n as f64 * 1e9,
        with_ns: w / n as f64 * 1e9,
        kernel_ns: kernel(&s),
    });

    let rounds = if quick { 20_000 } else { 100_000 };
    let (_, switches) = ping_pong(rounds);
    let switches = switches.max(1) as f64;
    let (b, w, s) =
        with_without(reps, node_agent::probes::ebpf_runqueue::programs(node_agent::ebpf::kernel::Kernel::get()), false, || {
            ping_pong(rounds).0
        })?;
    out.push(EventCost {
        probe: "ebpf_runqueue",
        event: "context switch (ping-pong)",
        base_ns: b / switches * 1e9,
        with_ns: w / switches * 1e9,
        kernel_ns: kernel(&s),
    });
    let (b, w, s) = with_without(reps, node_agent::probes::ebpf_runqueue::programs(node_agent::ebpf::kernel::Kernel::get()), true, || {
        ping_pong(rounds).0
    })?;
    out.push(EventCost {
        probe: "ebpf_runqueue + ebpf_pods",
        event: "context switch (ping-pong)",
        base_ns: b / switches * 1e9,
        with_ns: w / switches * 1e9,
        kernel_ns: kernel(&s),
    });

    let k = if quick { 10_000 } else { 50_000 };
    let (b, w, s) = with_without(reps, &agent_common::process::RAW_PROGRAMS, false, || spawn_loop(k))?;
    out.push(EventCost {
        probe: "ebpf_process",
        event: SPAWN_EVENT,
        base_ns: b / k as f64 * 1e9,
        with_ns: w / k as f64 * 1e9,
        kernel_ns: kernel(&s),
    });

    let dev = loop_dev()?;
    let m = if quick { 5_000 } else { 20_000 };
    let (b, w, s) =
        with_without(reps, node_agent::probes::ebpf_block_io::programs(node_agent::ebpf::kernel::Kernel::get()), false, || {
            direct_reads(&dev.path, m)
        })?;
    out.push(EventCost {
        probe: "ebpf_block_io",
        event: "O_DIRECT 4 KiB read (loop device, reader and loop worker on one CPU)",
        base_ns: b / m as f64 * 1e9,
        with_ns: w / m as f64 * 1e9,
        kernel_ns: kernel(&s),
    });
    let (b, w, s) = with_without(reps, &agent_common::pods::BLOCK_PROGRAMS, true, || direct_reads(&dev.path, m))?;
    out.push(EventCost {
        probe: "ebpf_pods (block I/O)",
        event: "O_DIRECT 4 KiB read (loop device, reader and loop worker on one CPU)",
        base_ns: b / m as f64 * 1e9,
        with_ns: w / m as f64 * 1e9,
        kernel_ns: kernel(&s),
    });
    out.extend(skb_drop_costs(quick)?);
    out.extend(syscall_latency_costs(quick)?);
    Ok(out)
}

// ---- bpftrace peers ----------------------------------------------------

/// `n` loopback TCP connects, each accepted, then both ends closed (the
/// client with SO_LINGER 0: a reset, so no TIME_WAIT piles up over rounds).
fn tcp_connect_loop(n: usize) -> f64 {
    use std::os::fd::AsRawFd;
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else { return 0.0 };
    let Ok(addr) = listener.local_addr() else { return 0.0 };
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    let t = Instant::now();
    for _ in 0..n {
        let Ok(c) = std::net::TcpStream::connect(addr) else { break };
        // SAFETY: a valid socket and an option value sized as SO_LINGER requires.
        unsafe {
            libc::setsockopt(
                c.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
        };
        let accepted = listener.accept();
        drop(c);
        drop(accepted);
    }
    t.elapsed().as_secs_f64()
}

/// CPUs online (bpftrace opens one perf ring buffer on each).
fn cpus_online() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    text.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?),
            None => r.parse::<usize>().ok().map(|_| 1),
        })
        .sum::<usize>()
        .max(1)
}

fn perf_event_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("perf_event")))
                .count()
        })
        .unwrap_or(0)
}

/// A bpftrace program, running and attached.
struct Bpftrace {
    child: Option<std::process::Child>,
    out: Option<std::thread::JoinHandle<String>>,
}

impl Bpftrace {
    /// Starts `bpftrace -e program` and returns once its `tracepoints`
    /// probes are attached: bpftrace holds one perf event per CPU (its
    /// output ring) and one per tracepoint it attaches, opened, given the
    /// program and enabled back to back (its BEGIN printf does not
    /// reliably reach a pipe on bpftrace 0.17, so no "ready" line).
    fn start(program: &str, tracepoints: usize) -> Res<Bpftrace> {
        use std::process::Stdio;
        let mut child = Command::new("bpftrace")
            .args(["-B", "line", "-e", program])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("bpftrace: {e}"))?;
        let pid = child.id();
        let read = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_string(&mut s);
                }
                s
            })
        };
        let out = read(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
        let err = read(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
        let mut bt = Bpftrace { child: Some(child), out: Some(out) };
        let want = cpus_online() + tracepoints;
        let t = Instant::now();
        while perf_event_fds(pid) < want {
            let exited = bt.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let e = err.join().unwrap_or_default();
                return Err(format!("bpftrace exited ({status}) before attaching: {}\n{program}", e.trim()));
            }
            if t.elapsed().as_secs() > 120 {
                return Err(format!("bpftrace did not attach {tracepoints} tracepoints in 120 s:\n{program}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        Ok(bt)
    }

    /// SIGINT, then its output (the maps it prints on exit). bpftrace 0.17
    /// misses a SIGINT that lands between attaching and its poll loop (it
    /// then sleeps in epoll_wait for good), so the signal is repeated every
    /// 2 s, and SIGKILL after 30 s.
    fn stop(&mut self) -> String {
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            for i in 0..=150 {
                if i % 10 == 0 {
                    // SAFETY: signalling our own child, not yet reaped.
                    unsafe { libc::kill(pid, if i == 150 { libc::SIGKILL } else { libc::SIGINT }) };
                }
                if !matches!(c.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            let _ = c.wait();
        }
        self.out.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The count bpftrace printed for `key` (e.g. `@calls[39]`).
fn bpftrace_count(out: &str, key: &str) -> Option<u64> {
    out.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(": ")?.trim().parse().ok())
}

/// One probe against its bpftrace equivalent.
struct PeerCase {
    probe: &'static str,
    event: &'static str,
    programs: &'static [agent_common::Program],
    bpftrace: String,
    /// Tracepoints the bpftrace program attaches.
    tracepoints: usize,
    /// A key bpftrace must have counted at least once per event, as a check
    /// that it was attached while the workload ran.
    check: Option<String>,
    /// Events per workload run.
    events: usize,
    /// Rounds, as a multiple of the other cases' (a workload whose time
    /// drifts between runs needs more for the same spread of its median).
    rounds_x: usize,
    work: Box<dyn FnMut() -> f64>,
}

struct PeerRow {
    probe: &'static str,
    event: &'static str,
    base_ns: f64,
    /// Added ns per event, per round: node-agent's, bpftrace's, and empty
    /// programs' on node-agent's hooks (none when a hook has no empty
    /// program, and for the first row, which is itself the empty program).
    agent: Vec<f64>,
    bpftrace: Vec<f64>,
    floor: Vec<f64>,
}

/// (25th percentile, median, 75th percentile).
fn quartiles(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (percentile(&s, 0.25), percentile(&s, 0.5), percentile(&s, 0.75))
}

/// Rounds of: the workload alone, with node-agent's programs attached,
/// with the bpftrace program running, and (when every hook of the probe
/// has one) with empty programs on the same hooks; the order rotates every
/// round.
/// Without `bpftrace`, its arm is left out (the kernel matrix's guests
/// have no bpftrace to compare with: `row.bpftrace` stays empty).
fn peer_rounds(rounds: usize, first: bool, c: &mut PeerCase, bpftrace: bool) -> Res<PeerRow> {
    let per = |secs: f64| secs / c.events as f64 * 1e9;
    // Programs the agent runs itself (a sweep) have no hook to stand in for.
    let empties: Option<Vec<agent_common::Program>> =
        c.programs.iter().filter(|p| p.hook != agent_common::Hook::Run).map(|p| agent_common::test_programs::empty_on(p.hook)).collect();
    let empties = empties.filter(|_| !first);
    // The arms: 0 the workload alone, 1 with node-agent's programs, 2 with
    // bpftrace's, 3 with empty programs on node-agent's hooks.
    let arms: Vec<usize> = [0, 1, 2, 3].into_iter().filter(|a| (*a != 2 || bpftrace) && (*a != 3 || empties.is_some())).collect();
    let mut row = PeerRow { probe: c.probe, event: c.event, base_ns: 0.0, agent: Vec::new(), bpftrace: Vec::new(), floor: Vec::new() };
    let mut bases = Vec::new();
    for r in 0..rounds {
        let mut t = [0.0f64; 4];
        for k in 0..arms.len() {
            let which = arms[(r + k) % arms.len()];
            t[which] = match which {
                0 => (c.work)(),
                1 => {
                    let _attached = attach_programs(c.programs, false, false)?;
                    (c.work)()
                }
                2 => {
                    let mut bt = Bpftrace::start(&c.bpftrace, c.tracepoints)?;
                    let secs = (c.work)();
                    let out = bt.stop();
                    if let Some(key) = &c.check {
                        let n = bpftrace_count(&out, key).unwrap_or(0);
                        if n < c.events as u64 {
                            return Err(format!("bpftrace counted {n} {key}, fewer than the {} events run:\n{out}", c.events));
                        }
                    }
                    secs
                }
                _ => {
                    let _attached = attach_programs(empties.as_deref().unwrap_or_default(), false, false)?;
                    (c.work)()
                }
            };
        }
        bases.push(per(t[0]));
        row.agent.push(per(t[1]) - per(t[0]));
        if bpftrace {
            row.bpftrace.push(per(t[2]) - per(t[0]));
        }
        if empties.is_some() {
            row.floor.push(per(t[3]) - per(t[0]));
        }
    }
    row.base_ns = quartiles(&bases).1;
    Ok(row)
}

/// node-agent's probes against the same aggregation written in bpftrace,
/// and the empty program (ours and bpftrace's) for the floor.
/// `probe`: that probe's rows alone (`--only bpftrace --probe NAME`).
fn bpftrace_peers(quick: bool, probe: Option<&str>) -> Res<Vec<PeerRow>> {
    let rounds = if quick { 5 } else { 9 };
    let mut cases = peer_cases(quick, 1)?;
    let first = cases[0].probe;
    cases.retain(|c| probe.is_none_or(|p| c.probe == p));
    let mut rows = Vec::new();
    for case in cases.iter_mut() {
        eprintln!("bench: bpftrace peer: {} ({})", case.probe, case.event);
        rows.push(peer_rounds(rounds * case.rounds_x, case.probe == first, case, true)?);
    }
    Ok(rows)
}

/// Every probe's workload, the empty program's first; `scale` divides the
/// events per run (an emulated machine runs the same rounds in a
/// reasonable time).
fn peer_cases(quick: bool, scale: usize) -> Res<Vec<PeerCase>> {
    use node_agent::ebpf::kernel::Kernel;
    let (n, k, m, c) = if quick { (200_000, 5000, 5000, 1000) } else { (1_000_000, 20_000, 20_000, 4000) };
    let (d, r) = if quick { (20_000, 20_000) } else { (100_000, 100_000) };
    let u = if quick { 20_000 } else { 50_000 };
    let scale = scale.max(1);
    let (n, k, m, c, d, r, u) = (n / scale, k / scale, m / scale, c / scale, d / scale, r / scale, u / scale);
    let getpid = libc::SYS_getpid;
    let close = libc::SYS_close;
    let syscalls_bt = "tracepoint:raw_syscalls:sys_exit { @calls[args->id] = count(); if (args->ret < 0) { @err[args->id] = count(); } }";
    // The loop device lives as long as the case that reads it.
    let dev = loop_dev()?;
    let cases = vec![
        PeerCase {
            probe: "empty program (floor)",
            event: "syscall (getpid)",
            programs: &[agent_common::test_programs::EMPTY],
            bpftrace: "tracepoint:raw_syscalls:sys_exit { }".into(),
            tracepoints: 1,
            check: None,
            events: n,
            rounds_x: 1,
            work: Box::new(move || getpid_loop(n)),
        },
        PeerCase {
            probe: "ebpf_syscalls",
            event: "syscall (getpid)",
            programs: &agent_common::syscalls::PROGRAMS,
            bpftrace: syscalls_bt.into(),
            tracepoints: 1,
            check: Some(format!("@calls[{getpid}]")),
            events: n,
            rounds_x: 1,
            work: Box::new(move || getpid_loop(n)),
        },
        PeerCase {
            probe: "ebpf_syscalls",
            event: "failed syscall (close(-1))",
            programs: &agent_common::syscalls::PROGRAMS,
            bpftrace: syscalls_bt.into(),
            tracepoints: 1,
            check: Some(format!("@err[{close}]")),
            events: n,
            rounds_x: 1,
            work: Box::new(move || failing_loop(n)),
        },
        PeerCase {
            probe: "ebpf_syscall_latency",
            event: "syscall (getpid)",
            programs: &agent_common::syscall_latency::PROGRAMS,
            bpftrace: "tracepoint:raw_syscalls:sys_enter { @s[tid] = nsecs; } \
                       tracepoint:raw_syscalls:sys_exit /@s[tid]/ { @h = hist(nsecs - @s[tid]); delete(@s[tid]); } \
                       tracepoint:sched:sched_process_exit { delete(@s[tid]); }"
                .into(),
            tracepoints: 3,
            check: None,
            events: n,
            rounds_x: 1,
            work: Box::new(move || getpid_loop(n)),
        },
        PeerCase {
            probe: "ebpf_process",
            event: SPAWN_EVENT,
            programs: &agent_common::process::RAW_PROGRAMS,
            bpftrace: "tracepoint:sched:sched_process_exec { @exec = count(); } \
                       tracepoint:sched:sched_process_fork { @fork = count(); } \
                       tracepoint:sched:sched_process_exit { @exit = count(); }"
                .into(),
            tracepoints: 3,
            check: Some("@fork".into()),
            events: k,
            rounds_x: 1,
            work: Box::new(move || spawn_loop(k)),
        },
        PeerCase {
            probe: "ebpf_block_io",
            event: "O_DIRECT 4 KiB read (loop device, reader and loop worker on one CPU)",
            programs: node_agent::probes::ebpf_block_io::programs(Kernel::get()),
            bpftrace: "tracepoint:block:block_rq_issue { @s[args->dev, args->sector] = nsecs; } \
                       tracepoint:block:block_rq_complete /@s[args->dev, args->sector]/ { \
                       @h[args->dev] = hist(nsecs - @s[args->dev, args->sector]); delete(@s[args->dev, args->sector]); }"
                .into(),
            tracepoints: 2,
            check: None,
            events: m,
            rounds_x: 3,
            work: Box::new(move || direct_reads(&dev.path, m)),
        },
        PeerCase {
            probe: "ebpf_tcp_latency",
            event: "TCP connect + accept + close (loopback)",
            programs: &agent_common::tcp_latency::PROGRAMS,
            bpftrace: "tracepoint:sock:inet_sock_set_state /args->protocol == 6/ { \
                       if (args->newstate == 2) { @start[args->skaddr] = nsecs; } \
                       else if (args->oldstate == 2) { \
                         if (args->newstate == 1) { @connect = hist(nsecs - @start[args->skaddr]); \
                           @rtt = hist((((struct tcp_sock *)args->skaddr)->srtt_us >> 3) * 1000); } \
                         else if (args->newstate == 7) { @failed = count(); } \
                         delete(@start[args->skaddr]); } \
                       else if ((args->oldstate == 3 && args->newstate == 1) || args->oldstate == 1) { \
                         @rtt = hist((((struct tcp_sock *)args->skaddr)->srtt_us >> 3) * 1000); } }"
                .into(),
            tracepoints: 1,
            check: None,
            events: c,
            rounds_x: 1,
            work: Box::new(move || tcp_connect_loop(c)),
        },
        PeerCase {
            probe: "ebpf_tcp_peers",
            event: "TCP connect + accept + close (loopback)",
            programs: &agent_common::tcp_peers::PROGRAMS,
            bpftrace: "tracepoint:sock:inet_sock_set_state /args->protocol == 6/ { \
                       $sk = (struct sock *)args->skaddr; $d = $sk->__sk_common.skc_daddr; \
                       if (args->newstate == 2) { @start[args->skaddr] = nsecs; @attempts[cgroup, $d, args->dport] = count(); } \
                       else if (args->oldstate == 2) { \
                         if (args->newstate == 1) { @lat[cgroup, $d, args->dport] = hist(nsecs - @start[args->skaddr]); @open[args->skaddr] = 1; } \
                         else if (args->newstate == 7) { @failed[cgroup, $d, args->dport, $sk->sk_err] = count(); } \
                         delete(@start[args->skaddr]); } \
                       else if (args->oldstate == 3 && args->newstate == 1) { @accepted[cgroup, $d, args->sport] = count(); @open[args->skaddr] = 1; } \
                       else if (args->newstate == 7 && @open[args->skaddr]) { $tp = (struct tcp_sock *)args->skaddr; \
                         @sent[cgroup, $d, args->dport] = sum($tp->bytes_acked); @rcvd[cgroup, $d, args->dport] = sum($tp->bytes_received); \
                         @closed[cgroup, $d, args->dport] = count(); delete(@open[args->skaddr]); } }"
                .into(),
            tracepoints: 1,
            check: None,
            events: c,
            rounds_x: 1,
            work: Box::new(move || tcp_connect_loop(c)),
        },
        PeerCase {
            probe: "ebpf_skb_drops",
            event: "UDP datagram to a closed port (loopback)",
            programs: &agent_common::skb_drops::PROGRAMS,
            bpftrace: "tracepoint:skb:kfree_skb { @drops[args->reason] = count(); }".into(),
            tracepoints: 1,
            check: None,
            events: d,
            rounds_x: 1,
            work: Box::new(move || closed_port_loop(d)),
        },
        PeerCase {
            probe: "ebpf_dns",
            event: "DNS query + response over UDP (loopback, one thread)",
            programs: &agent_common::dns::PROGRAMS,
            bpftrace: BPFTRACE_DNS.into(),
            tracepoints: 1,
            check: Some(format!("@q[{}]", own_cgroup_v2_id())),
            events: u,
            rounds_x: 1,
            work: Box::new(move || dns_loop(u, 53)),
        },
        PeerCase {
            probe: "ebpf_dns",
            event: "the same exchange on port 5353 (other traffic)",
            programs: &agent_common::dns::PROGRAMS,
            bpftrace: BPFTRACE_DNS.into(),
            tracepoints: 1,
            check: None,
            events: u,
            rounds_x: 1,
            work: Box::new(move || dns_loop(u, 5353)),
        },
        PeerCase {
            probe: "ebpf_dns",
            event: "UDP datagram to port 5353 from an unconnected socket (sendto, other traffic)",
            programs: &agent_common::dns::PROGRAMS,
            bpftrace: BPFTRACE_DNS.into(),
            tracepoints: 1,
            check: None,
            events: u,
            rounds_x: 1,
            work: Box::new(move || sendto_loop(u, 5353)),
        },
        // Last: the ping-pong pins the bench to CPU 0.
        PeerCase {
            probe: "ebpf_runqueue",
            event: "ping-pong round trip (2 context switches)",
            programs: node_agent::probes::ebpf_runqueue::programs(Kernel::get()),
            bpftrace: "tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new { @q[args->pid] = nsecs; } \
                       tracepoint:sched:sched_switch { if (args->prev_state == 0) { @q[args->prev_pid] = nsecs; } \
                       $t = @q[args->next_pid]; if ($t) { @h = hist(nsecs - $t); delete(@q[args->next_pid]); } }"
                .into(),
            tracepoints: 3,
            check: None,
            events: r,
            rounds_x: 1,
            work: Box::new(move || ping_pong(r).0),
        },
    ];
    Ok(cases)
}

// ---- on older kernels (cargo xtask kernels --bench) --------------------

/// BENCHMARKS.md's section written by `cargo xtask kernels --bench` (the
/// full bench keeps it as it is).
const KERNELS_HEADING: &str = "## eBPF on older kernels\n";

/// Rounds per case, and the divisor of the bpftrace section's events per
/// run: an emulated guest is tens of times slower.
const KERNEL_ROUNDS: usize = 5;
const KERNEL_SCALE: usize = 10;

/// Every probe's workload alone, with the probe and with empty programs on
/// its hooks (the bpftrace section's rounds without bpftrace), then as many
/// times with the kernel's statistics on; written to `out` as lines of tab-
/// separated fields: `release`, then per case `row probe event base_ns
/// q1 median q3 floor_median kernel_ns` (`-` where there is none) or
/// `down probe event error` where the probe did not load.
fn kernel_costs(out: &Path) -> Res<()> {
    let mut text = String::new();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(text, "release\t{}", release.trim());
    let mut cases = peer_cases(true, KERNEL_SCALE)?;
    let first = cases[0].probe;
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    for c in cases.iter_mut() {
        eprintln!("bench: on this kernel: {} ({})", c.probe, c.event);
        let row = match peer_rounds(KERNEL_ROUNDS * c.rounds_x, c.probe == first, c, false) {
            Ok(row) => row,
            Err(e) => {
                let _ = writeln!(text, "down\t{}\t{}\t{}", c.probe, c.event, e.replace(['\t', '\n'], " "));
                continue;
            }
        };
        // The programs' own run time, statistics on (they cost time
        // themselves, so they were off above): the median of as many
        // passes as rounds, each with the programs loaded afresh.
        let mut per_run = Vec::new();
        for _ in 0..KERNEL_ROUNDS {
            let (shared, _p) = attach_programs(c.programs, false, true)?;
            (c.work)();
            let (t, n) = c
                .programs
                .iter()
                .filter_map(|p| shared.program_stats(p.name).and_then(|s| s.run))
                .fold((0.0, 0u64), |a, s| (a.0 + s.0, a.1 + s.1));
            if n > 0 {
                per_run.push(t / n as f64 * 1e9);
            }
        }
        let kernel_ns = (!per_run.is_empty()).then(|| quartiles(&per_run).1);
        let (q1, med, q3) = quartiles(&row.agent);
        let floor = (!row.floor.is_empty()).then(|| quartiles(&row.floor).1);
        let _ = writeln!(
            text,
            "row\t{}\t{}\t{:.1}\t{q1:.1}\t{med:.1}\t{q3:.1}\t{}\t{}",
            c.probe,
            c.event,
            row.base_ns,
            opt(floor),
            opt(kernel_ns)
        );
    }
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
}

/// One kernel's figures, as [`kernel_costs`] wrote them.
struct KernelCosts {
    /// The column's name (`5.10`, …, `host`) and how it ran (`tcg`, `kvm`,
    /// `native`).
    column: String,
    how: String,
    release: String,
    /// (probe, event) and what was measured for it.
    cases: Vec<((String, String), CaseCost)>,
}

/// Ok(((q1, median, q3) added ns per event, kernel ns per program run)),
/// or Err(why the probe did not load).
type CaseCost = Result<((f64, f64, f64), Option<f64>), String>;

fn parse_kernel_costs(column: &str, how: &str, text: &str) -> KernelCosts {
    let mut k = KernelCosts { column: column.into(), how: how.into(), release: String::new(), cases: Vec::new() };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        match f.first() {
            Some(&"release") => k.release = f.get(1).unwrap_or(&"").to_string(),
            Some(&"row") if f.len() >= 9 => {
                let key = (f[1].to_string(), f[2].to_string());
                if let (Some(q1), Some(med), Some(q3)) = (num(4), num(5), num(6)) {
                    k.cases.push((key, Ok(((q1, med, q3), num(8)))));
                }
            }
            Some(&"down") if f.len() >= 4 => k.cases.push(((f[1].to_string(), f[2].to_string()), Err(f[3..].join(" ")))),
            _ => {}
        }
    }
    k
}

/// The section from the files `cargo xtask kernels --bench` left in
/// `dir`: `<column>.<how>.tsv` per kernel, `host.native.tsv` for the host.
fn kernels_section(dir: &Path) -> Res<String> {
    let mut kernels = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".tsv") else { continue };
        let Some((column, how)) = stem.rsplit_once('.') else { continue };
        let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
        kernels.push(parse_kernel_costs(column, how, &text));
    }
    // Oldest first, the host last.
    let order = |c: &str| -> (u32, u32) {
        let mut v = c.split('.').map(|x| x.parse::<u32>().unwrap_or(u32::MAX));
        (v.next().unwrap_or(u32::MAX), v.next().unwrap_or(0))
    };
    kernels.sort_by_key(|k| order(&k.column));
    if kernels.is_empty() {
        return Err(format!("no kernel's figures in {}", dir.display()));
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    for k in &kernels {
        for (key, _) in &k.cases {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
    }
    let floor_of =
        |k: &KernelCosts| keys.first().and_then(|f| k.cases.iter().find(|(key, _)| key == f)).and_then(|(_, r)| r.as_ref().ok()).cloned();
    let mut md = String::from(KERNELS_HEADING);
    let hows: Vec<String> = kernels.iter().map(|k| format!("{} ({}, {})", k.column, k.release, k.how)).collect();
    // The newest emulated kernel is what the older ones are compared with:
    // the emulator slows a program that reads maps more than the empty one,
    // so only columns run the same way compare.
    let newest = kernels.iter().rfind(|k| k.how != "native");
    let _ = writeln!(
        md,
        "\nWritten by `cargo xtask kernels --bench`, not by `cargo xtask bench` (which keeps this section as it is): {}. In each kernel of the matrix ([docs/kernels.md](docs/kernels.md)), booted under qemu, and on the host's own kernel natively, each probe's workload from the bpftrace section above (a tenth of its events) runs {KERNEL_ROUNDS} times with the probe's programs attached afresh and the kernel's BPF statistics on (kernel.bpf_stats_enabled): the kernel's own run time per program run, summed over the probe's programs, the median of those runs, as a multiple of an empty program's on the syscall exit in the same kernel (the first row, in ns). The emulator (TCG) slows code that reads and writes memory (map lookups) more than the empty program, so the emulated columns compare with each other, and the native host column only says how the same programs weigh there. The time each event takes with and without the probe is measured too ({KERNEL_ROUNDS} rounds), but under emulation its rounds differ by more than a probe's cost, so it is not shown. \"down\" where the probe did not load on that kernel (the reason in docs/kernels.md).\n",
        hows.join("; ")
    );
    let _ = writeln!(md, "| probe | event | {} |", kernels.iter().map(|k| k.column.as_str()).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(md, "|---|---|{}", "---|".repeat(kernels.len()));
    let mut differs = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let ratio = |k: &KernelCosts| -> Option<f64> {
            let (_, r) = k.cases.iter().find(|(c, _)| c == key)?;
            let run = r.as_ref().ok()?.1?;
            let floor = floor_of(k)?.1?;
            (floor > 0.0).then(|| run / floor)
        };
        let cells: Vec<String> = kernels
            .iter()
            .map(|k| match k.cases.iter().find(|(c, _)| c == key).map(|(_, r)| r) {
                Some(Err(_)) => "down".into(),
                Some(Ok((_, Some(run)))) if i == 0 => format!("{run:.0} ns"),
                _ => ratio(k).map_or("-".into(), |r| format!("{r:.1}×")),
            })
            .collect();
        let _ = writeln!(md, "| {} | {} | {} |", key.0, key.1, cells.join(" | "));
        if let Some((n, base)) = newest.and_then(|n| Some((n, ratio(n)?))).filter(|_| i > 0) {
            for k in kernels.iter().filter(|k| k.how != "native" && k.column != n.column) {
                if let Some(r) = ratio(k).filter(|r| *r > 1.5 * base || *r < base / 1.5) {
                    differs.push(format!("{} on {} ({}: {r:.1}×, {} {base:.1}×)", key.0, k.column, key.1, n.column));
                }
            }
        }
    }
    let _ = writeln!(
        md,
        "\nMore than 1.5 times the newest emulated kernel's multiple{}, or less than two thirds of it: {}.",
        newest.map(|n| format!(" ({})", n.column)).unwrap_or_default(),
        if differs.is_empty() { "none".to_string() } else { differs.join("; ") }
    );
    Ok(md)
}

/// `md` with the section under `heading` (up to the next `## `) replaced
/// by `section`, or `section` put before the heading `before` (else at the
/// end) when there is none.
fn with_section(md: &str, heading: &str, section: &str, before: Option<&str>) -> String {
    match md.find(heading) {
        Some(start) => {
            let rest = &md[start + heading.len()..];
            let end = rest.find("\n## ").map_or(md.len(), |i| start + heading.len() + i + 1);
            format!("{}{section}{}", &md[..start], &md[end..])
        }
        None => match before.and_then(|b| md.find(b)) {
            Some(at) => format!("{}{section}\n{}", &md[..at], &md[at..]),
            None => format!("{md}\n{section}"),
        },
    }
}

/// The section under `heading` in `md`, up to the next `## `.
fn section_of<'a>(md: &'a str, heading: &str) -> Option<&'a str> {
    let start = md.find(heading)?;
    let rest = &md[start + heading.len()..];
    Some(&md[start..rest.find("\n## ").map_or(md.len(), |i| start + heading.len() + i + 1)])
}

/// How the bpftrace section is measured, for BENCHMARKS.md.
const BPFTRACE_METHOD: &str = "Each probe against the same in-kernel aggregation written as a bpftrace program (Debian's bpftrace; maps only, nothing printed per event), in the same run: every round runs the workload alone, with node-agent's programs attached and with the bpftrace program running (started, waited for until its tracepoints are attached, SIGINT after), in an order that rotates each round. Added cost per event is the round's time minus that round's workload alone; medians over the rounds, interquartile range in brackets; the ratio is the median of the rounds' node-agent/bpftrace ratios with their interquartile range (rounds where bpftrace added nothing measurable left out; \"-\" when bpftrace's median added cost is not above zero), \"within noise\" when the two added costs' ranges overlap. The first row is an empty program on the same hook (ours a raw tracepoint, bpftrace's a tracepoint). Every other round also runs the workload with empty programs (a raw tracepoint program that returns at once) on each of node-agent's hooks for that probe, in the same rotation: the kernel's own cost of running a program there, the floor no program on those hooks can go under. Block I/O reads run with the reader and the unbound workqueues' workers (the loop device's) on one CPU, so that each read is a hand-off to the loop worker and back with no idle CPU to wake through the hypervisor (whose wake-up latency otherwise swamps any probe's cost, either way), over three times the rounds. Target: node-agent's median added cost at most 0.50× bpftrace's with the two ranges apart (\"met\"); otherwise \"at the floor\" when it is no more than the empty programs' upper quartile, \"undecided (noise)\" when the two ranges overlap, \"not met\" else.";

/// The section's table, markdown.
fn bpftrace_table(rows: &[PeerRow]) -> String {
    let mut md = String::new();
    let first_floor = rows.first().map(|r| quartiles(&r.agent)).unwrap_or_default();
    let _ = writeln!(md, "| probe | event | workload alone | node-agent added (IQR) | bpftrace added (IQR) | empty programs on node-agent's hooks (IQR) | node-agent / bpftrace (IQR) | target ≤ 0.50× or the floor |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for (i, r) in rows.iter().enumerate() {
        let (a25, a50, a75) = quartiles(&r.agent);
        let (b25, b50, b75) = quartiles(&r.bpftrace);
        // This probe's own floor when it was measured, else the first row's.
        let floor = if r.floor.is_empty() { first_floor } else { quartiles(&r.floor) };
        let floor_cell = if r.floor.is_empty() { "-".to_string() } else { format!("{:.0} ns ({:.0}–{:.0})", floor.1, floor.0, floor.2) };
        // Rounds where bpftrace added nothing measurable give no ratio.
        let ratios: Vec<f64> = r.agent.iter().zip(&r.bpftrace).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
        let noise = a75 >= b25 && b75 >= a25;
        let ratio = if b50 <= 0.0 || ratios.len() * 2 < r.bpftrace.len() {
            "-".to_string()
        } else {
            let (r25, r50, r75) = quartiles(&ratios);
            format!("{r50:.2}× ({r25:.2}–{r75:.2})")
        };
        let ratio = if noise { format!("{ratio} — within noise") } else { ratio };
        let target = if r.floor.is_empty() && i == 0 {
            "(floor)".to_string()
        } else if !noise && a50 <= 0.5 * b50 {
            "met".into()
        } else if a50 <= floor.2 {
            "at the floor".into()
        } else if noise {
            "undecided (noise)".into()
        } else {
            "not met".into()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} ns | {a50:.0} ns ({a25:.0}–{a75:.0}) | {b50:.0} ns ({b25:.0}–{b75:.0}) | {floor_cell} | {ratio} | {target} |",
            r.probe, r.event, r.base_ns
        );
    }
    md
}

fn planner(quick: bool) -> Vec<(usize, f64)> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use planner::builders::{at, daemonset, node, pod};
    use planner::plan::{plan, revision_hash};
    let mut out = Vec::new();
    for n in [100usize, 1000, 5000] {
        let ds = daemonset("agent:2", Some(IntOrString::String("10%".into())), None, false);
        let hash = revision_hash(&ds);
        let nodes: Vec<_> = (0..n).map(|i| node(&format!("node-{i:05}"), &[], &[])).collect();
        let pods: Vec<_> = (0..n)
            .map(|i| {
                pod(
                    &format!("agent-{i:05}"),
                    &format!("node-{i:05}"),
                    if i % 2 == 0 { &hash } else { "old" },
                    at(100),
                    "Running",
                    Some(at(200)),
                )
            })
            .collect();
        let mut times: Vec<f64> = (0..if quick { 5 } else { 20 })
            .map(|_| {
                let t = Instant::now();
                let _ = plan(&ds, &nodes, &pods, at(10_000), None);
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        out.push((n, percentile(&times, 0.5)));
    }
    out
}

/// One way of reading the network devices, measured.
struct NetRead {
    what: &'static str,
    /// Median per-scrape user and kernel CPU of the collecting thread, µs.
    user_us: f64,
    sys_us: f64,
    /// Min and max over rounds of this read's CPU over its counterpart's.
    ratio_range: Option<(f64, f64)>,
}

fn thread_cpu_us() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage of the right size.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    (us(u.ru_utime), us(u.ru_stime))
}

/// netdev and netclass over rtnetlink against /proc/net/dev and
/// /sys/class/net, in a namespace of `pairs` veth pairs, interleaved rounds.
fn netlink_vs_files(quick: bool) -> Res<(usize, Vec<NetRead>)> {
    use host::collector::{netclass, netdev};
    use node_agent_tests::netns::{Netns, SysfsMount};
    let pairs = 100;
    let ns = Netns::new("bench");
    let mut batch = String::from("link set lo up\n");
    for i in 0..pairs {
        let _ = writeln!(batch, "link add va{i} type veth peer name vb{i}\nlink set va{i} up\nlink set vb{i} up");
    }
    ns.batch(&batch);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (rounds, per_round) = if quick { (5, 20) } else { (15, 50) };
    let rows = ns.run(|paths| {
        let _mount = SysfsMount::new(dir.path());
        let paths = host::Paths { sysfs: dir.path().to_path_buf(), ..paths.clone() };
        let dev =
            |netlink| netdev::Options { filter: Default::default(), netlink, detailed: false, address_info: false, label_ifalias: false };
        let class = |netlink| netclass::Options { ignored: None, ignore_invalid_speed: false, netlink, with_stats: false };
        let mut cs: Vec<(&'static str, Box<dyn host::Collector>)> = vec![
            ("netdev over rtnetlink", Box::new(netdev::Collector::new(dev(true), &paths).expect("netdev"))),
            ("netdev from /proc/net/dev", Box::new(netdev::Collector::new(dev(false), &paths).expect("netdev"))),
            ("netclass over rtnetlink + ethtool", Box::new(netclass::Collector::new(class(true), &paths).expect("netclass"))),
            ("netclass from /sys/class/net", Box::new(netclass::Collector::new(class(false), &paths).expect("netclass"))),
        ];
        let mut per: Vec<Vec<(f64, f64)>> = vec![Vec::new(); cs.len()];
        let mut sink = expo::Sink::new();
        for _ in 0..rounds {
            for (i, (_, c)) in cs.iter_mut().enumerate() {
                let (u0, s0) = thread_cpu_us();
                for _ in 0..per_round {
                    sink.clear();
                    c.update(&mut sink).expect("collector succeeds");
                }
                let (u1, s1) = thread_cpu_us();
                per[i].push(((u1 - u0) / per_round as f64, (s1 - s0) / per_round as f64));
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            percentile(v, 0.5)
        };
        (0..cs.len())
            .map(|i| {
                let pair = i ^ 1;
                let ratios: Vec<f64> = per[i].iter().zip(&per[pair]).map(|(a, b)| (a.0 + a.1) / (b.0 + b.1).max(1e-9)).collect();
                let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = ratios.iter().copied().fold(0.0, f64::max);
                NetRead {
                    what: cs[i].0,
                    user_us: median(&mut per[i].iter().map(|x| x.0).collect()),
                    sys_us: median(&mut per[i].iter().map(|x| x.1).collect()),
                    ratio_range: (i % 2 == 0).then_some((lo, hi)),
                }
            })
            .collect()
    });
    Ok((2 * pairs + 1, rows))
}

/// The kubelet-view memory section, from the two side-by-side runs
/// (node-agent, node_exporter, node-agent + eBPF, node_exporter).
fn kubelet_memory_section(quick: bool, f: [&ScrapeFigures; 4]) -> String {
    let mut md = String::from("## Memory the kubelet's way\n\n");
    let _ = writeln!(md, "{}\n", kubelet_memory_method(quick));
    let _ = writeln!(md, "| measure | node-agent | node_exporter | ratio | node-agent + eBPF | node_exporter (same run) | ratio |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let mut row = |name: &str, v: &dyn Fn(&ScrapeFigures) -> f64| {
        let x = f.map(v);
        let _ = writeln!(
            md,
            "| {name} | {:.1} MB | {:.1} MB | {} | {:.1} MB | {:.1} MB | {} |",
            x[0],
            x[1],
            ratio(x[0], x[1]),
            x[2],
            x[3],
            ratio(x[2], x[3])
        );
    };
    for (i, when) in ["at start", "after the load", "after idle"].iter().enumerate() {
        row(&format!("working set, {when}"), &|f| f.mem[i].cg.working_set as f64 / MB);
        if i == 2 {
            row("of which anonymous (heap, stacks)", &|f| f.mem[i].cg.anon as f64 / MB);
            row("of which kernel (eBPF maps and programs, page tables, sockets, slab)", &|f| f.mem[i].cg.kernel as f64 / MB);
            row("of which active file pages (code and data read often)", &|f| f.mem[i].cg.active_file as f64 / MB);
        }
        row(&format!("cgroup usage, {when}"), &|f| f.mem[i].cg.usage as f64 / MB);
        row(&format!("RSS, {when}"), &|f| f.mem[i].rss as f64 / MB);
    }
    row("cgroup peak, whole life", &|f| f.cg_peak_mb);
    row("cgroup peak during the load", &|f| f.cg_peak_load_mb);
    let ws0 = f[0].mem[2].cg.working_set as f64 / (f[1].mem[2].cg.working_set as f64).max(1.0);
    let ws = f[2].mem[2].cg.working_set as f64 / (f[3].mem[2].cg.working_set as f64).max(1.0);
    let peak = f[2].cg_peak_mb / f[3].cg_peak_mb.max(1e-9);
    let verdict = |r: f64, target: f64| if r <= target { "met" } else { "not met" };
    let _ = writeln!(
        md,
        "\nTargets (issue #51): working set after idle ≤ 0.45× node_exporter's without eBPF: {ws0:.2}× ({}); ≤ 0.75× with every probe and pod attribution: {ws:.2}× ({}); cgroup peak over the whole life, with every probe, ≤ 0.90×: {peak:.2}× ({}).",
        verdict(ws0, 0.45),
        verdict(ws, 0.75),
        verdict(peak, 0.90)
    );
    md
}

/// The memory policy's tricks (`runtime::memory`), each turned off in turn
/// through `runtime::memory::OFF_ENV`: (what the row is, the variable's value).
const TRICKS: &[(&str, &str)] = &[
    ("as shipped: one arena, trims", ""),
    ("glibc's default arenas (one arena off)", "arena"),
    ("no trims", "trim"),
    ("neither", "arena,trim"),
];

/// One run of the agent with every probe and pod attribution on, some
/// tricks off: its cgroup's working set after the load and after idle, its
/// cgroup peak during the load, its RSS after idle (bytes).
#[derive(Clone, Copy, Default)]
struct TrickRun {
    ws_load: u64,
    ws_idle: u64,
    anon_idle: u64,
    peak_load: u64,
    rss_idle: u64,
}

fn trick_run(agent_bin: &Path, off: &str, quick: bool) -> Res<TrickRun> {
    let api = bench_cluster()?;
    let mut flags: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    flags.extend(pod_flags(&api));
    let mut cg = MemCg::new("tricks").map_err(|e| format!("memory cgroup: {e}"))?;
    uncache(agent_bin);
    let (_a, url, pid) = node_agent_tests::start_exporter_prepared(agent_bin, &flags, std::process::Stdio::null(), |c| {
        c.env(runtime::memory::OFF_ENV, off);
        cg.join_on_exec(c)
    })?;
    wait_for_sample(&url, "node_ebpf_pod_attribution_synced", 1.0)?;
    let (rounds, per_round, secs) = if quick { (4, 25, 3) } else { (10, 50, 10) };
    sequential(&[(&url, pid)], 1, 20);
    cg.reset_peak();
    sequential(&[(&url, pid)], rounds, per_round);
    wrk(&url, 4, secs)?;
    let load = mem_now(&mut cg, pid);
    std::thread::sleep(Duration::from_secs(settle_secs(quick)));
    let idle = mem_now(&mut cg, pid);
    Ok(TrickRun {
        ws_load: load.cg.working_set,
        ws_idle: idle.cg.working_set,
        anon_idle: idle.cg.anon,
        peak_load: load.cg.peak.max(idle.cg.peak),
        rss_idle: idle.rss,
    })
}

/// Each memory trick's effect on the working set the kubelet sees: the
/// agent run with each combination turned off, the combinations in turn,
/// `reps` times over.
fn trick_runs(agent_bin: &Path, quick: bool) -> Res<Vec<Vec<TrickRun>>> {
    let reps = if quick { 1 } else { 3 };
    let mut out = vec![Vec::new(); TRICKS.len()];
    for _ in 0..reps {
        for (i, (_, off)) in TRICKS.iter().enumerate() {
            out[i].push(trick_run(agent_bin, off, quick)?);
        }
    }
    Ok(out)
}

fn tricks_section(quick: bool, runs: &[Vec<TrickRun>]) -> String {
    let mut md = String::from(
        "### Each memory trick, as the kubelet sees it

",
    );
    let _ = writeln!(
        md,
        "node-agent alone, with every probe and pod attribution on ({BENCH_PODS} pods), in a memory cgroup of its own as above, with the memory policy's tricks (`runtime::memory`) turned off in turn through `{}`; each combination run {}, in turn, each a fresh process: 20 scrapes to warm up, the cgroup's peak reset, {} sequential scrapes, wrk at 4 connections for {} s (overlapping scrapes, what the trims are for), then {} s idle. Median (least–most) of the runs, MB. A trick whose row barely differs from \"neither\" is one the kubelet cannot see.\n",
        runtime::memory::OFF_ENV,
        match runs.first().map_or(0, Vec::len) {
            1 => "once".to_string(),
            n => format!("{n} times"),
        },
        if quick { 100 } else { 500 },
        if quick { 3 } else { 10 },
        settle_secs(quick)
    );
    let _ = writeln!(
        md,
        "| tricks | working set after the load | working set after idle | of it anonymous | cgroup peak during the load | RSS after idle |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let cell = |xs: Vec<u64>| {
        let mut v: Vec<f64> = xs.into_iter().map(|x| x as f64 / MB).collect();
        v.sort_by(f64::total_cmp);
        match v.as_slice() {
            [] => "—".to_string(),
            [x] => format!("{x:.2}"),
            _ => format!("{:.2} ({:.2}–{:.2})", v[v.len() / 2], v[0], v[v.len() - 1]),
        }
    };
    for ((name, _), r) in TRICKS.iter().zip(runs) {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} |",
            cell(r.iter().map(|x| x.ws_load).collect()),
            cell(r.iter().map(|x| x.ws_idle).collect()),
            cell(r.iter().map(|x| x.anon_idle).collect()),
            cell(r.iter().map(|x| x.peak_load).collect()),
            cell(r.iter().map(|x| x.rss_idle).collect())
        );
    }
    md
}

/// How the kubelet-view memory table is measured.
fn kubelet_memory_method(quick: bool) -> String {
    let v = match memcg::host_version() {
        Some(memcg::Version::V2) => {
            "cgroup v2: memory.current, memory.peak (reset through a write to it, Linux 6.12+), inactive_file of memory.stat"
        }
        Some(memcg::Version::V1) => {
            "cgroup v1: memory.usage_in_bytes, memory.max_usage_in_bytes (reset by writing 0), total_inactive_file of memory.stat"
        }
        None => "no memory cgroup controller on this host",
    };
    format!(
        "The kubelet reports and evicts on the container's memory cgroup, not on RSS: each exporter of the two side-by-side runs above starts in a memory cgroup of its own (joined between fork and exec, before it allocates; its binary's pages dropped from the page cache first, so that its cgroup is charged for its code as a pod's first start is; both binaries run from an ext4 on a loop device of the bench's own that reads ahead 128 KiB, the kernel's default and a typical node disk's, where this VM's disk reads ahead 8 MiB and would charge each cgroup for nearly its whole binary at its first faults), and its working set (usage minus inactive file pages, floored at 0: cAdvisor's `container_memory_working_set_bytes`), usage and peak are read beside its RSS ({v}) when it has started and answered its first scrape, after the load, and after {} s idle. The cgroup counts what RSS does not (kernel memory: page tables, sockets, eBPF maps, which are charged to the cgroup of the process that makes them) and leaves out file pages another cgroup read first (shared libraries); a file page faulted in once (or read ahead) sits on the inactive list, which the working set leaves out and RSS (when mapped) counts, until something marks it accessed (a read(2) of it, or unmapping it while its accessed bit is set). The peak during the load is the cgroup's peak reset once both have answered 20 scrapes.",
        settle_secs(quick)
    )
}

// ---- Cost as the node grows ---------------------------------------------

/// The open-file limit both exporters run under in the growth runs.
const GROWTH_NOFILE: u64 = 4096;
/// node-agent's descriptors beside the ones its budget keeps (a quarter of
/// the limit): tests/tests/fd_budget.rs's FIXED.
const FIXED_FDS: usize = 64;
/// Growth counted as at most linear when the cost at the largest count is
/// at most this many times the straight line through the two counts below.
const LINEAR_SLACK: f64 = 1.5;

/// How a growth run's exporter sees the node.
enum View {
    /// The network namespace of the thread that starts it, with a sysfs of
    /// that namespace on /sys (in a mount namespace of its own).
    NetnsSysfs,
    /// A mount namespace of its own with a tmpfs on each of these
    /// directories, and a PID namespace of its own with /proc mounted for
    /// it: node-agent and node_exporter both read /proc/1/mountinfo.
    Mounts(Vec<std::ffi::CString>),
    /// The host's, as is.
    Host,
}

struct Spawned {
    _kill: Kill,
    pid: u32,
    url: String,
}

/// The process whose parent is `ppid` (the exporter `unshare --fork` runs).
fn child_of(ppid: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let parent: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        (parent == ppid).then_some(pid)
    })
}

fn scrape_body(http: &ureq::Agent, url: &str) -> Option<String> {
    http.get(url).call().ok()?.into_string().ok()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Starts `bin` listening on `addr`, in the memory cgroup `cg`, under
/// [`GROWTH_NOFILE`], seeing `view`; waits until it answers.
fn spawn_viewing(bin: &Path, flags: &[String], addr: &str, cg: &MemCg, view: &View, http: &ureq::Agent) -> Res<Spawned> {
    use std::ffi::CString;
    use std::os::unix::process::CommandExt;
    let mut cmd = match view {
        View::NetnsSysfs | View::Host => Command::new(bin),
        View::Mounts(_) => {
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"]).arg(bin);
            c
        }
    };
    cmd.arg(format!("--web.listen-address={addr}")).args(flags).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    uncache(bin);
    cg.join_on_exec(&mut cmd);
    let targets: Vec<CString> = match view {
        View::Mounts(t) => t.clone(),
        View::NetnsSysfs | View::Host => Vec::new(),
    };
    let sysfs = matches!(view, View::NetnsSysfs);
    let wrapped = matches!(view, View::Mounts(_));
    let c = |s: &str| CString::new(s).expect("no NUL");
    let (none, root, sys, sysfs_fs, tmpfs) = (c("none"), c("/"), c("/sys"), c("sysfs"), c("tmpfs"));
    let lim = libc::rlimit { rlim_cur: GROWTH_NOFILE, rlim_max: GROWTH_NOFILE };
    // SAFETY: between fork and exec the closure only makes system calls
    // (setrlimit, unshare, mount) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: i32| if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
            let null = std::ptr::null();
            check(libc::setrlimit(libc::RLIMIT_NOFILE, &lim))?;
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(none.as_ptr(), root.as_ptr(), null, libc::MS_REC | libc::MS_PRIVATE, null.cast()))?;
            if sysfs {
                check(libc::mount(sysfs_fs.as_ptr(), sys.as_ptr(), sysfs_fs.as_ptr(), 0, null.cast()))?;
            }
            for t in &targets {
                check(libc::mount(tmpfs.as_ptr(), t.as_ptr(), tmpfs.as_ptr(), 0, null.cast()))?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("starting {}: {e}", bin.display()))?;
    let kill = Kill(child);
    let spawned_pid = kill.0.id();
    let url = format!("http://{addr}/metrics");
    let t = Instant::now();
    let mut pid = None;
    while t.elapsed() < Duration::from_secs(60) {
        pid = pid.or_else(|| if wrapped { child_of(spawned_pid) } else { Some(spawned_pid) });
        if pid.is_some() && scrape_body(http, &url).is_some() {
            return Ok(Spawned { _kill: kill, pid: pid.unwrap_or(spawned_pid), url });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{} did not come up on {addr}", bin.display()))
}

/// What one exporter cost at one count.
#[derive(Default, Clone, Copy)]
struct GrowthCost {
    cpu_ms: f64,
    bytes: usize,
    working_set: u64,
    peak: u64,
    fds: usize,
    /// Series of the per-unit family in the answer (`unit_series`).
    seen: usize,
    failed: usize,
    /// Scrapes the CPU figure is over.
    scrapes: usize,
}

/// The least time a growth point's round scrapes one exporter: its CPU is
/// read from /proc/PID/stat, which counts 10 ms ticks, so a round of at
/// least 400 ms of scrapes reads it to about 3 % (the whole point's 5
/// rounds to about 1 %), where a fixed handful of scrapes read a 3 ms
/// scrape to 30 %.
const GROWTH_ROUND: Duration = Duration::from_millis(400);

/// node-agent and node_exporter, each in a memory cgroup of its own and
/// seeing `view`, scraped in interleaved rounds; what each cost.
/// `fixed_ports`: listen on these (in a network namespace of the bench's
/// own) rather than on free ports of the host's.
fn growth_point(agent: &Path, ne: &Path, view: &View, fixed_ports: bool, unit_series: &str, quick: bool) -> Res<[GrowthCost; 2]> {
    let common: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    let mut agent_flags = common.clone();
    agent_flags.extend(node_agent::manifests::agent_only_collectors().iter().map(|c| format!("--no-collector.{c}")));
    growth_point_with(agent, &agent_flags, ne, &common, view, fixed_ports, unit_series, &|_| Ok(()), quick)
}

/// [`growth_point`] with both exporters' flags given, and `ready` run on
/// node-agent's URL once it answers (say, to wait for its pods to be
/// listed).
#[allow(clippy::too_many_arguments)]
fn growth_point_with(
    agent: &Path,
    agent_flags: &[String],
    ne: &Path,
    ne_flags: &[String],
    view: &View,
    fixed_ports: bool,
    unit_series: &str,
    ready: &dyn Fn(&str) -> Res<()>,
    quick: bool,
) -> Res<[GrowthCost; 2]> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let cg = |name: &str| MemCg::new(name).map_err(|e| format!("memory cgroup {name}: {e}"));
    let mut cgs = [cg("grow-agent")?, cg("grow-node-exporter")?];
    let addr = |fixed: u16| {
        let port = if fixed_ports {
            fixed
        } else {
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(fixed)
        };
        format!("127.0.0.1:{port}")
    };
    let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(120)).build();
    let procs = [
        spawn_viewing(agent, agent_flags, &addr(19101), &cgs[0], view, &http)?,
        spawn_viewing(ne, ne_flags, &addr(19102), &cgs[1], view, &http)?,
    ];
    ready(&procs[0].url)?;
    for p in &procs {
        for _ in 0..2 {
            scrape_body(&http, &p.url);
        }
    }
    let (rounds, per_round) = if quick { (2, 3) } else { (5, 6) };
    let pids = [procs[0].pid, procs[1].pid];
    let stop = AtomicBool::new(false);
    let fds = [AtomicUsize::new(open_fds(pids[0])), AtomicUsize::new(open_fds(pids[1]))];
    let mut out = [GrowthCost::default(); 2];
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for (f, pid) in fds.iter().zip(pids) {
                    f.fetch_max(open_fds(pid), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        for _ in 0..rounds {
            for (o, p) in out.iter_mut().zip(&procs) {
                let c0 = cpu_split(p.pid);
                let t0 = Instant::now();
                let mut n = 0;
                while n < per_round || (!quick && t0.elapsed() < GROWTH_ROUND) {
                    match scrape_body(&http, &p.url) {
                        Some(body) => {
                            o.bytes = body.len();
                            o.seen = body.lines().filter(|l| l.starts_with(unit_series)).count();
                        }
                        None => o.failed += 1,
                    }
                    n += 1;
                }
                o.scrapes += n;
                let c1 = cpu_split(p.pid);
                o.cpu_ms += (c1.0 + c1.1 - c0.0 - c0.1) * 1e3;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    for ((o, cg), f) in out.iter_mut().zip(&mut cgs).zip(&fds) {
        o.cpu_ms /= o.scrapes.max(1) as f64;
        let r = cg.read().unwrap_or_default();
        o.working_set = r.working_set;
        o.peak = r.peak;
        o.fds = f.load(Ordering::Relaxed);
    }
    drop(procs);
    Ok(out)
}

/// Network devices (veth pairs and lo) in a network namespace of the
/// bench's own, both exporters inside it with its sysfs on /sys.
fn device_growth(agent: &Path, ne: &Path, counts: &[usize], quick: bool) -> Res<Vec<(usize, [GrowthCost; 2])>> {
    use node_agent_tests::netns::Netns;
    let mut rows = Vec::new();
    for &count in counts {
        let made = Instant::now();
        let ns = Netns::new(&format!("grow{count}"));
        ns.ip(&["link", "set", "lo", "up"]);
        let batch: String = (0..count / 2).map(|i| format!("link add v{i}a type veth peer name v{i}b\n")).collect();
        if !batch.is_empty() {
            ns.batch(&batch);
        }
        eprintln!("bench: growth: {count} network devices made in {:.1} s", made.elapsed().as_secs_f64());
        let costs = ns.run(|_| growth_point(agent, ne, &View::NetnsSysfs, true, "node_network_receive_bytes_total{", quick))?;
        rows.push((count, costs));
    }
    Ok(rows)
}

/// tmpfs mounts in a mount namespace of each exporter's own.
fn mount_growth(agent: &Path, ne: &Path, counts: &[usize], quick: bool) -> Res<Vec<(usize, [GrowthCost; 2])>> {
    use std::os::unix::ffi::OsStrExt;
    let mut rows = Vec::new();
    for &count in counts {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let mut targets = Vec::with_capacity(count);
        for i in 0..count {
            let p = dir.path().join(format!("m{i}"));
            std::fs::create_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            targets.push(std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|e| e.to_string())?);
        }
        eprintln!("bench: growth: {count} tmpfs mounts");
        rows.push((count, growth_point(agent, ne, &View::Mounts(targets), false, "node_filesystem_size_bytes{", quick)?));
    }
    Ok(rows)
}

/// The collectors reading per-CPU files, node_exporter's defaults among
/// them: the CPUs growth table runs both exporters with these alone.
const PER_CPU_COLLECTORS: [&str; 5] = ["cpu", "cpufreq", "softnet", "schedstat", "stat"];

/// A procfs and a sysfs of `cpus` CPUs under `root` (`proc/`, `sys/`),
/// holding the files the per-CPU collectors read, in the running kernel's
/// formats: /proc/stat (this machine's, its cpu lines repeated), softnet
/// rows, schedstat (version 15) and each CPU's cpufreq, topology and
/// thermal_throttle directories, with /sys/bus/cpu/devices' links.
fn cpu_tree(root: &Path, cpus: usize) -> Res<()> {
    let write = |rel: &str, text: &str| -> Res<()> {
        let p = root.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let cpu0 = stat.lines().find(|l| l.starts_with("cpu0 ")).ok_or("/proc/stat has no cpu0 line")?;
    let fields: Vec<u64> = cpu0.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let mut text = String::new();
    let total: Vec<String> = fields.iter().map(|f| (f * cpus as u64).to_string()).collect();
    let _ = writeln!(text, "cpu  {}", total.join(" "));
    for i in 0..cpus {
        let own: Vec<String> = fields.iter().map(|f| (f + i as u64).to_string()).collect();
        let _ = writeln!(text, "cpu{i} {}", own.join(" "));
    }
    for l in stat.lines().filter(|l| !l.starts_with("cpu")) {
        let _ = writeln!(text, "{l}");
    }
    write("proc/stat", &text)?;
    let softnet = std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default();
    let row: Vec<&str> = softnet.lines().next().map(|l| l.split_whitespace().collect()).unwrap_or_default();
    let row = if row.len() >= 13 { row } else { vec!["00000000"; 13] };
    let mut text = String::new();
    for i in 0..cpus {
        let mut r: Vec<String> = row.iter().map(|c| c.to_string()).collect();
        r[12] = format!("{i:08x}");
        let _ = writeln!(text, "{}", r.join(" "));
    }
    write("proc/net/softnet_stat", &text)?;
    let mut text = String::from("version 15\ntimestamp 4295000000\n");
    for i in 0..cpus {
        let _ = writeln!(text, "cpu{i} 0 0 0 0 0 0 {} {} {}", 2_000_000_000u64 + i as u64, 300_000_000u64 + i as u64, 40_000 + i);
        let _ = writeln!(text, "domain0 {:016x} {}", 1u64 << (i % 64), ["0"; 36].join(" "));
    }
    write("proc/schedstat", &text)?;
    let range = format!("0-{}\n", cpus - 1);
    for f in ["online", "present", "possible"] {
        write(&format!("sys/devices/system/cpu/{f}"), &range)?;
    }
    write("sys/devices/system/cpu/offline", "\n")?;
    write("sys/devices/system/cpu/isolated", "\n")?;
    std::fs::create_dir_all(root.join("sys/bus/cpu/devices")).map_err(|e| format!("sys/bus/cpu/devices: {e}"))?;
    for i in 0..cpus {
        let d = format!("sys/devices/system/cpu/cpu{i}");
        let files: [(&str, String); 14] = [
            ("cpufreq/cpuinfo_max_freq", "3700000".into()),
            ("cpufreq/cpuinfo_min_freq", "800000".into()),
            ("cpufreq/cpuinfo_transition_latency", "0".into()),
            ("cpufreq/related_cpus", i.to_string()),
            ("cpufreq/scaling_available_governors", "performance powersave".into()),
            ("cpufreq/scaling_cur_freq", (1_700_000 + i).to_string()),
            ("cpufreq/scaling_driver", "intel_pstate".into()),
            ("cpufreq/scaling_governor", "powersave".into()),
            ("cpufreq/scaling_max_freq", "3700000".into()),
            ("cpufreq/scaling_min_freq", "800000".into()),
            ("cpufreq/scaling_setspeed", "<unsupported>".into()),
            ("topology/core_id", (i / 2).to_string()),
            ("topology/physical_package_id", (i * 2 / cpus).to_string()),
            ("thermal_throttle/core_throttle_count", (i % 7).to_string()),
        ];
        for (f, v) in files {
            write(&format!("{d}/{f}"), &format!("{v}\n"))?;
        }
        write(&format!("{d}/thermal_throttle/package_throttle_count"), "3\n")?;
        let link = root.join(format!("sys/bus/cpu/devices/cpu{i}"));
        std::os::unix::fs::symlink(format!("../../../devices/system/cpu/cpu{i}"), &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(())
}

/// Both exporters with the per-CPU collectors alone, reading a procfs and
/// sysfs of each count of CPUs ([`cpu_tree`]).
fn cpu_growth(agent: &Path, ne: &Path, counts: &[usize], quick: bool) -> Res<Vec<(usize, [GrowthCost; 2])>> {
    let mut rows = Vec::new();
    for &count in counts {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        cpu_tree(dir.path(), count)?;
        let mut flags = vec![
            "--collector.disable-defaults".to_string(),
            format!("--path.procfs={}", dir.path().join("proc").display()),
            format!("--path.sysfs={}", dir.path().join("sys").display()),
        ];
        flags.extend(PER_CPU_COLLECTORS.iter().map(|c| format!("--collector.{c}")));
        eprintln!("bench: growth: {count} CPUs");
        rows.push((
            count,
            growth_point_with(agent, &flags, ne, &flags, &View::Host, false, "node_cpu_scaling_frequency_hertz{", &|_| Ok(()), quick)?,
        ));
    }
    Ok(rows)
}

/// The eBPF maps' memory that grows with the node's CPUs, from node-agent
/// with every probe (its default): the per-CPU maps' charge per possible
/// CPU (their memlock over this machine's possible CPUs, from the process's
/// fdinfo), and the bytes per entry of the run queue's map of enqueue
/// times, sized `ENTRIES_PER_CPU` a CPU within its floor and cap
/// (`node_agent::probes::ebpf_runqueue::entries_for`).
fn ebpf_bytes_per_cpu(agent: &Path) -> Res<(f64, f64)> {
    let (_kill, url, pid) = node_agent_tests::start_exporter_prepared(agent, &[] as &[&str], std::process::Stdio::null(), |_| {})?;
    let body = compare::http_get(&url).map_err(|e| format!("scrape: {e}"))?;
    let sample = |name: &str| {
        body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).ok_or(format!("{name} not in the answer"))
    };
    let per_entry =
        sample("node_ebpf_map_memory_bytes{map=\"RUNQ_TASK_START\"}")? / sample("node_ebpf_map_max_entries{map=\"RUNQ_TASK_START\"}")?;
    use node_agent::ebpf::map_stats;
    // BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE.
    const PER_CPU_TYPES: [u32; 4] = [5, 6, 10, 21];
    let per_cpu: u64 = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .map_err(|e| format!("fdinfo: {e}"))?
        .flatten()
        .filter_map(|e| map_stats::parse_fdinfo(&std::fs::read_to_string(e.path()).ok()?))
        .filter(|m| PER_CPU_TYPES.contains(&m.map_type))
        .map(|m| m.memlock)
        .sum();
    let possible = map_stats::possible_cpus().max(1);
    Ok((per_cpu as f64 / possible as f64, per_entry))
}

/// The Service watch's memory (`ebpf_tcp_peers` names peers by ClusterIP):
/// node-agent with `ebpf_pods` and `ebpf_tcp_peers` alone, in a memory
/// cgroup of its own, against an in-memory API server with the bench's
/// pods and `count` Services; the working set (and RSS) once every Service
/// is listed and after 10 scrapes.
fn services_memory(agent: &Path, counts: &[usize]) -> Res<Vec<(usize, MemAt)>> {
    use node_agent_tests::apiserver::{pod, Api, Running};
    let mut rows = Vec::new();
    for &count in counts {
        let api = std::sync::Arc::new(Api::new());
        {
            let mut st = api.state.lock().map_err(|_| "API state poisoned".to_string())?;
            for i in 0..BENCH_PODS {
                let (uid, name) = (format!("00000000-0000-4000-8000-{i:012}"), format!("app-{i}"));
                api.put(&mut st, "pods", "bench", &name, pod(&uid, "bench", &name, BENCH_NODE, "app", &format!("{:064x}", i + 1)), false);
            }
            for i in 0..count {
                let name = format!("svc-{i}");
                let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
                let svc = serde_json::json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": format!("ns-{}", i % 100), "uid": format!("20000000-0000-4000-8000-{i:012}"),
                                 "labels": {"app": name, "team": "bench"}},
                    "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                             "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}], "selector": {"app": name}}
                });
                api.put(&mut st, "services", &format!("ns-{}", i % 100), &name, svc, false);
            }
        }
        let running = Running::start(api).map_err(|e| format!("API server: {e}"))?;
        let mut flags: Vec<String> =
            vec!["--collector.disable-defaults".into(), "--collector.ebpf_pods".into(), "--collector.ebpf_tcp_peers".into()];
        flags.extend(pod_flags(&running));
        let mut cg = MemCg::new(&format!("services{count}")).map_err(|e| format!("memory cgroup: {e}"))?;
        let (guard, url, pid) = start_in(agent, &flags, &cg)?;
        wait_for_sample(&url, "node_ebpf_pod_attribution_synced", 1.0)?;
        let t = Instant::now();
        while !compare::http_get(&url).is_ok_and(|b| b.contains(&format!("node_ebpf_tcp_peers_tracked{{what=\"services\"}} {count}"))) {
            if t.elapsed() > Duration::from_secs(60) {
                return Err(format!("the agent never listed {count} Services"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for _ in 0..10 {
            let _ = compare::http_get(&url);
        }
        std::thread::sleep(Duration::from_secs(2));
        rows.push((count, mem_now(&mut cg, pid)));
        drop(guard);
    }
    Ok(rows)
}

/// The ebpf_tcp_peers collector's time per scrape with `n` loopback
/// connections held open (2n sockets followed), sweeping at every scrape
/// (`--collector.ebpf_tcp_peers.sweep-interval=1s`, scrapes 1.05 s apart)
/// and never (1h): median of the rounds' `node_scrape_collector_duration_seconds`.
fn sweep_costs(quick: bool) -> Res<Vec<(usize, f64, f64)>> {
    // Two file descriptors per connection, and the listener's.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write one rlimit we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let counts: &[usize] = if quick { &[0, 1000] } else { &[0, 1000, 5000] };
    let rounds = if quick { 3 } else { 7 };
    let mut rows = Vec::new();
    for &n in counts {
        let mut times = [0.0f64; 2];
        for (i, interval) in ["1s", "1h"].iter().enumerate() {
            let args = vec![
                "node-agent".to_string(),
                "--collector.disable-defaults".into(),
                "--collector.ebpf_tcp_peers".into(),
                format!("--collector.ebpf_tcp_peers.sweep-interval={interval}"),
            ];
            let m = node_agent::cmd::command().try_get_matches_from(args).map_err(|e| e.to_string())?;
            let cfg = node_agent::config::resolve(&m).map_err(|e| e.to_string())?;
            let scraper = node_agent::agent::scraper(cfg.collectors, false);
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let mut held = Vec::with_capacity(2 * n);
            for _ in 0..n {
                let c = std::net::TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
                let (a, _) = listener.accept().map_err(|e| e.to_string())?;
                held.push(c);
                held.push(a);
            }
            let duration = || -> f64 {
                let text = String::from_utf8(scraper.scrape(&runtime::Selection::default(), expo::Format::Text)).unwrap_or_default();
                node_agent_tests::samples(&text, "node_scrape_collector_duration_seconds")
                    .into_iter()
                    .find(|(l, _)| l.get("collector").map(String::as_str) == Some("ebpf_tcp_peers"))
                    .map_or(f64::NAN, |s| s.1)
            };
            // The first scrape sweeps in both; the rounds after, only with 1s.
            duration();
            let mut d: Vec<f64> = (0..rounds)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(1050));
                    duration() * 1e3
                })
                .collect();
            d.sort_by(f64::total_cmp);
            times[i] = percentile(&d, 0.5);
            drop(held);
        }
        rows.push((n, times[0], times[1]));
    }
    Ok(rows)
}

fn sweep_section(rows: &[(usize, f64, f64)]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Open connections' bytes (ebpf_tcp_peers' sweep)\n");
    let _ = writeln!(md, "The ebpf_tcp_peers collector's time per scrape (`node_scrape_collector_duration_seconds`, median of the rounds) with loopback connections held open, both ends followed, sweeping at every scrape or never; the sweep reads the followed sockets' keys (one bpf(2) call each) and runs `tcp_peers_sweep` over them, 12 per BPF_PROG_TEST_RUN. Run in the bench's process.\n");
    let _ = writeln!(md, "| connections open | sockets followed | scrape, sweeping | scrape, not sweeping | sweep per socket |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (n, with, without) in rows {
        let per = if *n > 0 { format!("{:.0} ns", (with - without) * 1e6 / (2 * n) as f64) } else { "-".into() };
        let _ = writeln!(md, "| {n} | {} | {with:.2} ms | {without:.2} ms | {per} |", 2 * n);
    }
    md
}

/// The Service watch's memory, markdown.
fn services_section(rows: &[(usize, MemAt)]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "## Services watched (ebpf_tcp_peers)\n");
    let _ = writeln!(md, "node-agent with `ebpf_pods` and `ebpf_tcp_peers` only, in a memory cgroup of its own, against an in-memory API server with {BENCH_PODS} pods on its node and the given number of Services (ClusterIP, one port, a selector, two labels), read once every Service is listed and 10 scrapes later. The watch keeps each Service's addresses and name, not the object.\n");
    let _ = writeln!(md, "| Services | working set | anonymous | RSS | cgroup peak |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (n, m) in rows {
        let _ = writeln!(
            md,
            "| {n} | {:.1} MB | {:.1} MB | {:.1} MB | {:.1} MB |",
            m.cg.working_set as f64 / MB,
            m.cg.anon as f64 / MB,
            m.rss as f64 / MB,
            m.cg.peak as f64 / MB
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let per = (last.1.cg.working_set as f64 - first.1.cg.working_set as f64) / (last.0 - first.0).max(1) as f64;
        let _ = writeln!(md, "\nPer Service, from {} to {}: {:.0} bytes of working set.", first.0, last.0, per);
    }
    md
}

/// Containers per pod in the pods' growth.
const CONTAINERS_PER_POD: usize = 3;

/// Pods with attribution on (node-agent with every probe): `count` pods of
/// [`CONTAINERS_PER_POD`] containers each on the bench's node, listed by an
/// in-memory API server (as many elsewhere), each container with a cgroup
/// of its own (the kubelet's cgroupfs naming, in the v2 hierarchy) in which
/// a short process runs once both exporters are up.
fn pod_growth(agent: &Path, ne: &Path, counts: &[usize], quick: bool) -> Res<Vec<(usize, [GrowthCost; 2])>> {
    use node_agent_tests::apiserver::{pod, Api, Running};
    use node_agent_tests::pods::{mkdirs, v2_root, PodCgroup};
    let mut rows = Vec::new();
    for &count in counts {
        let api = std::sync::Arc::new(Api::new());
        let root = v2_root();
        let mut made = Vec::new();
        let mut leaves = Vec::new();
        {
            let mut st = api.state.lock().map_err(|_| "API state poisoned".to_string())?;
            for i in 0..count * 2 {
                let node = if i < count { BENCH_NODE } else { "other-node" };
                let (uid, name) = (format!("10000000-0000-4000-8000-{i:012}"), format!("grow-{i}"));
                let cid = |c: usize| format!("{:056x}{c:08x}", i + 1);
                let mut p = pod(&uid, "grow", &name, node, "c0", &cid(0));
                for c in 1..CONTAINERS_PER_POD {
                    if let Some(v) = p["spec"]["containers"].as_array_mut() {
                        v.push(serde_json::json!({"name": format!("c{c}"), "image": "x"}));
                    }
                    if let Some(v) = p["status"]["containerStatuses"].as_array_mut() {
                        v.push(serde_json::json!({"name": format!("c{c}"), "containerID": format!("containerd://{}", cid(c)), "image": "x", "imageID": "x", "ready": true, "restartCount": 0}));
                    }
                }
                api.put(&mut st, "pods", "grow", &name, p, false);
                if i < count {
                    for c in 0..CONTAINERS_PER_POD {
                        leaves.push(mkdirs(&root, &format!("kubepods/burstable/pod{uid}/{}", cid(c)), &mut made));
                    }
                }
            }
        }
        let _cgroups = PodCgroup { made, v2: root.clone(), memory: None };
        let running = Running::start(api).map_err(|e| format!("API server: {e}"))?;
        let mut flags: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
        flags.extend(pod_flags(&running));
        let ready = |url: &str| {
            wait_for_sample(url, "node_ebpf_pod_attribution_synced", 1.0)?;
            // A short process in each container's cgroup, for the probes to count.
            for leaf in &leaves {
                let status = Command::new("/bin/sh")
                    .arg("-c")
                    .arg(format!("echo $$ > {}/cgroup.procs && exec /bin/sleep 0.01", leaf.display()))
                    .status()
                    .map_err(|e| format!("sh: {e}"))?;
                if !status.success() {
                    return Err(format!("a process in {}: {status}", leaf.display()));
                }
            }
            Ok(())
        };
        eprintln!("bench: growth: {count} pods of {CONTAINERS_PER_POD} containers");
        let common: Vec<String> = COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
        rows.push((
            count,
            growth_point_with(agent, &flags, ne, &common, &View::Host, false, "node_ebpf_pod_runqueue_waits_total{", &ready, quick)?,
        ));
    }
    Ok(rows)
}

/// The cost at the largest count over the straight line through the two
/// counts below it (≤ [`LINEAR_SLACK`]: at most linear), and the cost per
/// unit from the smallest count to the largest.
fn linearity(rows: &[(usize, f64)]) -> (f64, f64) {
    let k = rows.len();
    if k < 3 {
        return (f64::NAN, f64::NAN);
    }
    let ((n0, v0), (n1, v1), (n2, v2)) = (rows[k - 3], rows[k - 2], rows[k - 1]);
    let slope_below = ((v1 - v0) / (n1 - n0) as f64).max(0.0);
    let line = v1 + slope_below * (n2 - n1) as f64;
    let per_unit = (v2 - rows[0].1) / (n2 - rows[0].0) as f64;
    (if line > 0.0 { v2 / line } else { f64::NAN }, per_unit)
}

/// A growth table's measure: its name, its value, the scale to its unit, the unit.
type GrowthMeasure<'a> = (&'a str, &'a dyn Fn(&GrowthCost) -> f64, f64, &'a str);

/// One growth table and its constants.
fn growth_table(unit: &str, rows: &[(usize, [GrowthCost; 2])]) -> String {
    let mut md = String::new();
    let pair = |f: &dyn Fn(&GrowthCost) -> String, c: &[GrowthCost; 2]| format!("{} / {}", f(&c[0]), f(&c[1]));
    let _ = writeln!(
        md,
        "| {unit} | CPU per scrape | answer | working set | cgroup peak | open fds, most | {unit} in the answer | failed scrapes |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for (n, c) in rows {
        let _ = writeln!(
            md,
            "| {n} | {} ms | {} kB | {} MB | {} MB | {} | {} | {} |",
            pair(&|g| format!("{:.2}", g.cpu_ms), c),
            pair(&|g| format!("{:.1}", g.bytes as f64 / 1000.0), c),
            pair(&|g| format!("{:.1}", g.working_set as f64 / MB), c),
            pair(&|g| format!("{:.1}", g.peak as f64 / MB), c),
            pair(&|g| g.fds.to_string(), c),
            pair(&|g| g.seen.to_string(), c),
            pair(&|g| g.failed.to_string(), c),
        );
    }
    let budget = GROWTH_NOFILE as usize / 4 + FIXED_FDS;
    let _ = writeln!(md, "\n(node-agent / node_exporter in each cell.)\n");
    let _ = writeln!(md, "| per {unit} | node-agent | node_exporter | node-agent: largest count over the line through the two below (≤ {LINEAR_SLACK}: at most linear) | node_exporter: same |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    let measures: [GrowthMeasure; 4] = [
        ("CPU per scrape", &|g| g.cpu_ms, 1e3, "µs"),
        ("answer", &|g| g.bytes as f64, 1.0, "bytes"),
        ("working set", &|g| g.working_set as f64, 1.0 / 1024.0, "kB"),
        ("cgroup peak", &|g| g.peak as f64, 1.0 / 1024.0, "kB"),
    ];
    let mut all_linear = true;
    for (name, f, scale, u) in measures {
        let lin = |i: usize| linearity(&rows.iter().map(|(n, c)| (*n, f(&c[i]))).collect::<Vec<_>>());
        let ((ra, pa), (rn, pn)) = (lin(0), lin(1));
        all_linear &= ra.is_nan() || ra <= LINEAR_SLACK;
        let _ = writeln!(md, "| {name} | {:.2} {u} | {:.2} {u} | {ra:.2} | {rn:.2} |", pa * scale, pn * scale);
    }
    let most = rows.iter().map(|(_, c)| c[0].fds).max().unwrap_or(0);
    let _ = writeln!(
        md,
        "\nnode-agent's growth at most linear in all four: {}. Its open descriptors, at most {most} at any count, against its budget under RLIMIT_NOFILE {GROWTH_NOFILE} (a quarter of the limit kept, plus {FIXED_FDS} of its own): {budget}: {}.",
        if all_linear { "yes" } else { "no" },
        if most <= budget { "within" } else { "OVER" }
    );
    md
}

/// The growth section: network devices, mounts, then pods.
fn growth_section(agent: &Path, ne: &Path, quick: bool) -> Res<String> {
    let devices = device_growth(agent, ne, &[10, 100, 500, 2000], quick)?;
    let mounts = mount_growth(agent, ne, &[10, 500, 5000], quick)?;
    let pods = pod_growth(agent, ne, &[10, 110, 250], quick)?;
    let cpu_rows = cpu_growth(agent, ne, &CPU_COUNTS, quick)?;
    let ebpf_per_cpu = ebpf_bytes_per_cpu(agent)?;
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").map(|m| m.lines().count()).unwrap_or(0);
    let (rounds, per_round) = if quick { (2, 3) } else { (5, 6) };
    let mut md = String::from("\n## Cost as the node grows\n\n");
    let _ = writeln!(md, "Both exporters (node-agent without its eBPF collectors; both with their default collectors and `{}`), each in a memory cgroup of its own and under RLIMIT_NOFILE {GROWTH_NOFILE}, at each count: CPU per scrape from /proc/PID/stat over {rounds} interleaved rounds, each of {per_round} scrapes or {} ms of them, whichever is more (after 2 to warm up; /proc/PID/stat counts 10 ms ticks), the answer's size, the cgroup's working set after them and its peak over the whole life, the most descriptors open (/proc/PID/fd, sampled every 5 ms during the scrapes). Per unit: from the smallest count to the largest.\n", COMMON_FLAGS.join(" "), if quick { 0 } else { GROWTH_ROUND.as_millis() });
    let _ = writeln!(md, "### Network devices\n\nveth pairs (and lo) in a network namespace of the bench's own; both exporters run inside it, with a sysfs of it mounted on /sys in a mount namespace of their own.\n");
    md.push_str(&growth_table("devices", &devices));
    let _ = writeln!(md, "\n### Mounts\n\ntmpfs mounts in a private mount namespace of each exporter's own, beside the {host_mounts} it copies from the host's; each exporter runs as PID 1 of a PID namespace of its own (`unshare --pid --fork --mount-proc`), so that /proc/1/mountinfo, which both read, is its namespace's.\n");
    md.push_str(&growth_table("mounts", &mounts));
    let _ = writeln!(md, "\n### Pods\n\nnode-agent with every probe and pod attribution on: an in-memory API server lists the pods, {CONTAINERS_PER_POD} containers each, on the agent's node (and as many elsewhere), each container with a cgroup of its own (kubepods/burstable/pod<uid>/<container id> in the v2 hierarchy) in which a short process ran once the pods were listed; node_exporter beside it as it is (it has no pods: its figures are the floor). The pods in the answer: the series of `node_ebpf_pod_runqueue_waits_total`, one per pod with counts and one for the host's own tasks.\n");
    md.push_str(&growth_table("pods", &pods));
    md.push_str(&cpus_section(&cpu_rows, ebpf_per_cpu));
    md.push_str(&sizing(&devices, &pods, &cpu_rows, ebpf_per_cpu));
    Ok(md)
}

/// The CPU counts of the CPUs table: this machine's and the large nodes'.
const CPU_COUNTS: [usize; 4] = [2, 32, 96, 192];

/// The eBPF maps' bytes beyond this machine's at `cpus` CPUs, from
/// [`ebpf_bytes_per_cpu`]'s figures.
fn ebpf_growth_at(cpus: usize, (per_cpu, runq_entry): (f64, f64)) -> f64 {
    use node_agent::probes::ebpf_runqueue::entries_for;
    let here = node_agent::ebpf::map_stats::possible_cpus();
    let runq = |c: u64| f64::from(entries_for(0, c)) * runq_entry;
    per_cpu * (cpus as f64 - here as f64) + runq(cpus as u64) - runq(here)
}

fn cpus_section(rows: &[(usize, [GrowthCost; 2])], ebpf: (f64, f64)) -> String {
    use node_agent::probes::ebpf_runqueue;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n### CPUs\n\nThis machine has {} CPUs online, so the CPUs here are a procfs and a sysfs of each count made for the purpose, in this kernel's formats (/proc/stat with its cpu lines repeated, /proc/net/softnet_stat's rows, /proc/schedstat version 15, each CPU's cpufreq, topology and thermal_throttle files), read by both exporters with the collectors that read per-CPU files alone: `--collector.disable-defaults` and {} (interrupts, whose columns are per CPU, is off by default in both). What this leaves out is the kernel's own cost of writing the real files, which grows with the CPUs for both exporters alike (/proc/stat sums every CPU's counters). These files are regular files, which node-agent never keeps open (procfs and sysfs files it keeps, within its budget of descriptors), so it opens and closes each at every scrape, as node_exporter does.\n",
        cpus_online(),
        PER_CPU_COLLECTORS.iter().map(|c| format!("`--collector.{c}`")).collect::<Vec<_>>().join(", ")
    );
    md.push_str(&growth_table("CPUs", rows));
    let at: Vec<String> = CPU_COUNTS[1..].iter().map(|&c| format!("{:.1} MB at {c}", ebpf_growth_at(c, ebpf) / MB)).collect();
    let _ = writeln!(
        md,
        "\neBPF maps, which these tables leave out (node-agent with every probe): the per-CPU maps charge {:.1} kB per possible CPU (their memlock over this machine's {} possible CPUs), and the run queue's map of enqueue times takes {} entries a CPU within [{}, {}] entries at {:.0} bytes each. Beyond this machine's: {}.",
        ebpf.0 / 1024.0,
        node_agent::ebpf::map_stats::possible_cpus(),
        ebpf_runqueue::ENTRIES_PER_CPU,
        ebpf_runqueue::ENTRIES_FLOOR,
        ebpf_runqueue::ENTRIES_CAP,
        ebpf.1,
        at.join(", ")
    );
    md
}

/// Headroom of the memory request over the working set it is derived from.
const REQUEST_HEADROOM: f64 = 1.25;
/// Headroom of the memory limit over the cgroup peak it is derived from
/// (an outsized textfile, a burst of connections, a page cache not yet
/// reclaimed: none of them in the growth runs).
const LIMIT_HEADROOM: f64 = 2.0;
/// Devices of the large node the limit is sized for.
const SIZING_DEVICES: usize = 2000;
/// CPUs of the large node the request and limit are sized for (the most
/// the growth tables' nodes have).
const SIZING_CPUS: usize = 192;

/// The DaemonSet's memory request and limit derived from the growth
/// tables, against what deploy/ asks: the request from the working set at
/// the most pods measured (every probe and pod attribution on) with one
/// veth device per pod added at the devices table's cost per device; the
/// limit from the cgroup peak at those pods and [`SIZING_DEVICES`] devices;
/// both on a node of [`SIZING_CPUS`] CPUs.
fn sizing(
    devices: &[(usize, [GrowthCost; 2])],
    pods: &[(usize, [GrowthCost; 2])],
    cpus: &[(usize, [GrowthCost; 2])],
    ebpf: (f64, f64),
) -> String {
    let (Some(d0), Some(d1), Some((npods, p))) = (devices.first(), devices.last(), pods.last()) else { return String::new() };
    let (Some(c0), Some(c1)) = (cpus.first(), cpus.last()) else { return String::new() };
    let per = |a: &(usize, [GrowthCost; 2]), b: &(usize, [GrowthCost; 2]), f: &dyn Fn(&GrowthCost) -> u64| {
        (f(&b.1[0]) as f64 - f(&a.1[0]) as f64).max(0.0) / (b.0 - a.0).max(1) as f64
    };
    let per_device = |f: &dyn Fn(&GrowthCost) -> u64| per(d0, d1, f);
    let here = std::fs::read_dir("/sys/class/net").map(|d| d.count()).unwrap_or(1);
    // The CPUs beyond this machine's: the per-CPU files' cost (the CPUs
    // table) and the eBPF maps that grow with them.
    let more_cpus = SIZING_CPUS.saturating_sub(cpus_online()) as f64;
    let ebpf_more = ebpf_growth_at(SIZING_CPUS, ebpf);
    let cpus_ws = per(c0, c1, &|g| g.working_set) * more_cpus + ebpf_more;
    let cpus_peak = per(c0, c1, &|g| g.peak) * more_cpus + ebpf_more;
    let ws = p[0].working_set as f64 + per_device(&|g| g.working_set) * npods.saturating_sub(here) as f64 + cpus_ws;
    let peak = p[0].peak as f64 + per_device(&|g| g.peak) * SIZING_DEVICES.saturating_sub(here) as f64 + cpus_peak;
    let mib = 1024.0 * 1024.0;
    // Rounded up to whole multiples of 16 MiB.
    let round = |b: f64| ((b / mib / 16.0).ceil() * 16.0) as u64;
    let (request, limit) = (round(ws * REQUEST_HEADROOM), round(peak * LIMIT_HEADROOM));
    let deploy = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/agent/daemonset.yaml")).unwrap_or_default();
    let asked = |key: &str| {
        deploy
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|r| r.split("memory: ").nth(1))
            .and_then(|m| m.trim_end_matches(['}', ' ']).strip_suffix("Mi")?.parse::<u64>().ok())
    };
    let (req_asked, lim_asked) = (asked("requests:"), asked("limits:"));
    let verdict = |asked: Option<u64>, derived: u64| match asked {
        Some(a) if a == derived => format!("{a}Mi: as derived"),
        Some(a) if a > derived => format!("{a}Mi: above it, by {:.0}%", (a as f64 / derived as f64 - 1.0) * 100.0),
        Some(a) => format!("{a}Mi: BELOW it"),
        None => "not found".to_string(),
    };
    let mut md = String::from("\n### Sizing the DaemonSet\n\n");
    let _ = writeln!(
        md,
        "From the tables above, node-agent with every probe and pod attribution on, on a node of {SIZING_CPUS} CPUs (the CPUs table's cost per CPU and the eBPF maps that grow with the CPUs, beyond this machine's {}: {:.1} MB of working set, {:.1} MB of peak). Memory request: the working set at {npods} pods ({:.1} MB) plus one veth device per pod beyond the {here} here at the devices table's working set per device, plus the CPUs, {:.1} MB, times {REQUEST_HEADROOM} headroom, rounded up to 16 MiB: **{request}Mi**; deploy/ asks {}. Memory limit: the cgroup peak at {npods} pods ({:.1} MB) plus {SIZING_DEVICES} devices at the devices table's peak per device, plus the CPUs, {:.1} MB, times {LIMIT_HEADROOM} headroom (an outsized textfile, a burst of connections, page cache not yet reclaimed), rounded up to 16 MiB: **{limit}Mi**; deploy/ asks {}. A node beyond {SIZING_DEVICES} devices, 5,000 mounts or {SIZING_CPUS} CPUs adds the tables' cost per device, per mount and per CPU to the limit.",
        cpus_online(),
        cpus_ws / MB,
        cpus_peak / MB,
        p[0].working_set as f64 / MB,
        ws / MB,
        verdict(req_asked, request),
        p[0].peak as f64 / MB,
        peak / MB,
        verdict(lim_asked, limit),
    );
    md
}

fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "-".into()
    } else {
        format!("{:.2}×", a / b)
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|v| v.split_once(':')).map(|x| x.1.trim().to_string()))
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default().lines().next().unwrap_or("").to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    format!("{cores} × {cpu}; {}; Linux {}", mem.split_whitespace().skip(1).collect::<Vec<_>>().join(" "), kernel.trim())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node-agent-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let get = |k: &str| args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--image-only") {
        let out_path = PathBuf::from(get("--out").unwrap_or_else(|| "BENCHMARKS.md".into()));
        let md = std::fs::read_to_string(&out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
        let section = image_section()?;
        let md = with_section(&md, IMAGE_HEADING, &section, None);
        std::fs::write(&out_path, &md).map_err(|e| format!("{}: {e}", out_path.display()))?;
        print!("{section}");
        return Ok(());
    }
    if let Some(image) = get("--kubelet") {
        let out_path = PathBuf::from(get("--out").unwrap_or_else(|| "BENCHMARKS.md".into()));
        let md = std::fs::read_to_string(&out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
        let section = kubelet_section(&image, &md)?;
        std::fs::write(&out_path, with_section(&md, KUBELET_HEADING, &section, Some("## Where a scrape's CPU goes")))
            .map_err(|e| format!("{}: {e}", out_path.display()))?;
        print!("{section}");
        return Ok(());
    }
    // In a guest of the kernel matrix (`cargo xtask kernels --bench`).
    if let Some(out) = get("--kernel-costs") {
        return kernel_costs(Path::new(&out));
    }
    if let Some(dir) = get("--kernels-section") {
        let out_path = PathBuf::from(get("--out").unwrap_or_else(|| "BENCHMARKS.md".into()));
        let md = std::fs::read_to_string(&out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
        let section = kernels_section(Path::new(&dir))?;
        std::fs::write(&out_path, with_section(&md, KERNELS_HEADING, &section, Some("## Network devices")))
            .map_err(|e| format!("{}: {e}", out_path.display()))?;
        print!("{section}");
        return Ok(());
    }
    if get("--only").as_deref() == Some("network") {
        let (devices, net) = netlink_vs_files(quick)?;
        for r in &net {
            println!("{devices} devices: {}: user {:.0} µs, kernel {:.0} µs, ratio {:?}", r.what, r.user_us, r.sys_us, r.ratio_range);
        }
        return Ok(());
    }
    if get("--only").as_deref() == Some("collectors") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let (empty, all, costs) = collector_costs(&agent, quick)?;
        print!("{}", collector_cost_table(empty, all, &costs));
        return Ok(());
    }
    if get("--only").as_deref() == Some("growth") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
        let (_disk, agent, ne) = staged(&agent, &ne)?;
        print!("{}", growth_section(&agent, &ne, quick)?);
        return Ok(());
    }
    if get("--only").as_deref() == Some("pods") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
        let (_disk, agent, ne) = staged(&agent, &ne)?;
        let counts: Vec<usize> =
            get("--pods").unwrap_or_else(|| "10,110,250".into()).split(',').filter_map(|c| c.trim().parse().ok()).collect();
        print!("{}", growth_table("pods", &pod_growth(&agent, &ne, &counts, quick)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("cpus") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
        let (_disk, agent, ne) = staged(&agent, &ne)?;
        print!("{}", cpus_section(&cpu_growth(&agent, &ne, &CPU_COUNTS, quick)?, ebpf_bytes_per_cpu(&agent)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("memory") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
        let (_disk, agent, ne) = staged(&agent, &ne)?;
        let (a, n) = scrape_phase(&agent, &ne, false, quick)?;
        let (ae, ne2) = scrape_phase(&agent, &ne, true, quick)?;
        for (what, x, y) in [("without eBPF", &a, &n), ("with every probe", &ae, &ne2)] {
            println!(
                "CPU per scrape, {what}: {:.3} ms (user {:.3}) against {:.3} ms, {}",
                x.cpu_ms,
                x.user_ms,
                y.cpu_ms,
                ratio(x.cpu_ms, y.cpu_ms)
            );
        }
        print!("{}", kubelet_memory_section(quick, [&a, &n, &ae, &ne2]));
        return Ok(());
    }
    if get("--only").as_deref() == Some("hold") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let secs: u64 = get("--hold-secs").and_then(|s| s.parse().ok()).unwrap_or(600);
        return hold(&agent, Duration::from_secs(secs));
    }
    if get("--only").as_deref() == Some("services") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let counts = if quick { vec![0, 1000] } else { vec![0, 1000, 10_000] };
        print!("{}", services_section(&services_memory(&agent, &counts)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("sweep") {
        print!("{}", sweep_section(&sweep_costs(quick)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("tricks") {
        let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
        let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
        let (_disk, agent, _ne) = staged(&agent, &ne)?;
        print!("{}", tricks_section(quick, &trick_runs(&agent, quick)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("dns") {
        print!("{}", dns_time_section(&dns_program_time(quick)?));
        return Ok(());
    }
    if get("--only").as_deref() == Some("bpftrace") {
        print!("{}", bpftrace_table(&bpftrace_peers(quick, get("--probe").as_deref())?));
        return Ok(());
    }
    let only = match get("--only").as_deref() {
        Some("skb_drops") => Some(skb_drop_costs(quick)?),
        Some("syscall_latency") => Some(syscall_latency_costs(quick)?),
        _ => None,
    };
    if let Some(costs) = only {
        for c in costs {
            println!(
                "{}: {}: without {:.0} ns, with {:.0} ns, added {:.0} ns per event, kernel run time {} per program run",
                c.probe,
                c.event,
                c.base_ns,
                c.with_ns,
                c.with_ns - c.base_ns,
                c.kernel_ns.map_or("n/a".into(), |k| format!("{k:.0} ns"))
            );
        }
        return Ok(());
    }
    let agent = PathBuf::from(get("--agent").ok_or("--agent PATH is required")?);
    let out_path = PathBuf::from(get("--out").unwrap_or_else(|| "BENCHMARKS.md".into()));
    let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
    let ne_version = Command::new(&ne)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string()
                + String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("")
        })
        .unwrap_or_default();
    let (_disk, agent, ne) = staged(&agent, &ne)?;

    eprintln!("bench: scrapes, node-agent without eBPF vs node_exporter");
    let (a, n) = scrape_phase(&agent, &ne, false, quick)?;
    eprintln!("bench: scrapes, node-agent with every eBPF probe vs node_exporter");
    let (ae, ne2) = scrape_phase(&agent, &ne, true, quick)?;
    eprintln!("bench: each memory trick's effect on the working set");
    let tricks = trick_runs(&agent, quick)?;
    eprintln!("bench: each collector's CPU per scrape");
    let (empty, all, collectors) = collector_costs(&agent, quick)?;
    eprintln!("bench: eBPF per-event costs");
    let costs = ebpf_costs(quick)?;
    eprintln!("bench: eBPF per-event costs against bpftrace");
    let peers = bpftrace_peers(quick, None)?;
    eprintln!("bench: ebpf_dns's program time per event");
    let dns_times = dns_program_time(quick)?;
    eprintln!("bench: network devices, rtnetlink vs /proc and /sys");
    let (devices, net) = netlink_vs_files(quick)?;
    eprintln!("bench: cost as the node grows");
    let growth = growth_section(&agent, &ne, quick)?;
    eprintln!("bench: the Service watch's memory");
    let services = services_memory(&agent, &if quick { vec![0, 1000] } else { vec![0, 1000, 10_000] })?;
    eprintln!("bench: the sweep of open connections");
    let sweeps = sweep_costs(quick)?;
    eprintln!("bench: planner");
    let plans = planner(quick);

    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmarks\n\nProduced by `cargo xtask bench`{} — not typed by hand.\n",
        if quick { " --quick (short runs)" } else { "" }
    );
    let _ = writeln!(md, "- Machine: {}", machine());
    let _ = writeln!(md, "- Date: {date}");
    let _ = writeln!(md, "- Commit: {}", commit());
    let _ = writeln!(md, "- Peer: {} (Debian), default collectors; both with `{}`", ne_version.trim(), COMMON_FLAGS.join(" "));
    let _ = writeln!(md, "- node-agent: {}; first without its eBPF collectors (the same families as node_exporter where both have them), then with every probe attached and pod attribution on: an in-memory API server lists {BENCH_PODS} pods on the agent's node (and {BENCH_PODS} elsewhere), which the agent watches.", build_kind(args.iter().any(|a| a == "--pgo")));
    let _ = writeln!(md, "- These machines are noisy: compare ratios within one run.\n");
    let _ = writeln!(md, "## Scrapes, side by side\n");
    let _ = writeln!(md, "CPU per scrape from /proc/PID/stat over interleaved rounds of sequential keep-alive scrapes; latency of those scrapes; wrk for {}s at 1 and 4 connections; peak RSS (VmHWM) over the process's whole life and during the load only (VmHWM reset through /proc/PID/clear_refs once both have started and answered 20 scrapes), and the RSS after the load and {} s idle (as between two of Prometheus's scrapes) split into anonymous memory (heap, stacks, eBPF maps) and file-backed pages (the binary's and libraries' code and data, shared with the page cache).\n", if quick { 3 } else { 10 }, settle_secs(quick));
    let _ = writeln!(md, "| measure | node-agent | node_exporter | ratio | node-agent + eBPF | node_exporter (same run) | ratio |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let row = |md: &mut String, name: &str, f: &dyn Fn(&ScrapeFigures) -> f64, unit: &str| {
        let _ = writeln!(
            md,
            "| {name} | {:.3} {unit} | {:.3} {unit} | {} | {:.3} {unit} | {:.3} {unit} | {} |",
            f(&a),
            f(&n),
            ratio(f(&a), f(&n)),
            f(&ae),
            f(&ne2),
            ratio(f(&ae), f(&ne2))
        );
    };
    row(&mut md, "CPU per scrape", &|f| f.cpu_ms, "ms");
    row(&mut md, "… of which user", &|f| f.user_ms, "ms");
    row(&mut md, "… of which kernel", &|f| f.sys_ms, "ms");
    row(&mut md, "latency median (keep-alive)", &|f| f.p50_ms, "ms");
    row(&mut md, "latency p99 (keep-alive)", &|f| f.p99_ms, "ms");
    row(&mut md, "requests/s, 1 connection", &|f| f.rps_c1, "");
    row(&mut md, "p99, 1 connection", &|f| f.p99_c1_ms, "ms");
    row(&mut md, "requests/s, 4 connections", &|f| f.rps_c4, "");
    row(&mut md, "p99, 4 connections", &|f| f.p99_c4_ms, "ms");
    row(&mut md, "peak RSS, whole life (VmHWM)", &|f| f.rss_mb, "MB");
    row(&mut md, "peak RSS during the load", &|f| f.rss_load_mb, "MB");
    row(&mut md, "… RSS after it: anonymous", &|f| f.anon_mb, "MB");
    row(&mut md, "… RSS after it: file-backed", &|f| f.file_mb, "MB");
    row(&mut md, "bytes per scrape", &|f| f.bytes as f64 / 1000.0, "kB");
    row(&mut md, "bytes per scrape, gzip", &|f| f.bytes_gzip as f64 / 1000.0, "kB");
    row(&mut md, "samples per scrape", &|f| f.samples as f64, "");
    let _ = writeln!(md, "\nThe kernel part is mostly the kernel generating the /proc and /sys files both exporters read (the same data set), so it bounds the CPU ratio from below: node-agent's kernel time alone is {:.2}× node_exporter's total CPU here.", a.sys_ms / n.cpu_ms.max(1e-9));
    let verdict = |r: f64, target: f64| if r <= target { "met" } else { "not met" };
    let (cpu, cpu_e) = (a.cpu_ms / n.cpu_ms.max(1e-9), ae.cpu_ms / ne2.cpu_ms.max(1e-9));
    let (user, user_e) = (a.user_ms / n.cpu_ms.max(1e-9), ae.user_ms / ne2.cpu_ms.max(1e-9));
    let _ = writeln!(md, "\nTargets (issue #51): total CPU per scrape ≤ 0.15× node_exporter's without eBPF: {cpu:.2}× ({}); ≤ 0.20× with every probe and pod attribution: {cpu_e:.2}× ({}). The part node-agent controls, its user time (everything but the kernel generating the files), against node_exporter's total: {user:.2}× without eBPF, {user_e:.2}× with every probe. Memory targets are the kubelet's, in the next section.", verdict(cpu, 0.15), verdict(cpu_e, 0.20));
    let _ = writeln!(md, "\nFamilies differ where only one side has them (node-agent's `node_ebpf_*`, `node_filesystem_mount_info` and newer netstat/softnet fields; node_exporter's `go_*`): see `cargo xtask compare-node-exporter`.\n");
    md.push_str(&kubelet_memory_section(quick, [&a, &n, &ae, &ne2]));
    // A subsection of the memory section: before the next `## ` heading,
    // which `--kubelet` rewrites up to the heading after it.
    md.push('\n');
    md.push_str(&tricks_section(quick, &tricks));
    md.push('\n');
    // Written by `cargo xtask bench --kubelet`: kept as it is.
    if let Some(kept) = std::fs::read_to_string(&out_path).ok().as_deref().and_then(|old| section_of(old, KUBELET_HEADING)) {
        md.push_str(kept.trim_end());
        md.push_str("\n\n");
    }
    let _ = writeln!(md, "## Where a scrape's CPU goes\n");
    let _ = writeln!(md, "{COLLECTOR_COST_METHOD}\n");
    md.push_str(&collector_cost_table(empty, all, &collectors));
    md.push('\n');
    let _ = writeln!(md, "## eBPF: cost per event\n");
    let _ = writeln!(md, "A tight loop triggering the event, without and with the probe attached (minimum of interleaved runs), and the kernel's own run-time statistics of the programs (kernel.bpf_stats_enabled, summed over the probe's programs per run).\n");
    let _ = writeln!(md, "| probe | event | without | with | added per event | kernel run time per program run |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for c in &costs {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} ns | {:.0} ns | {:.0} ns | {} |",
            c.probe,
            c.event,
            c.base_ns,
            c.with_ns,
            c.with_ns - c.base_ns,
            c.kernel_ns.map(|k| format!("{k:.0} ns")).unwrap_or_else(|| "-".into())
        );
    }
    let _ = writeln!(md, "\n## eBPF: cost per event against bpftrace\n");
    let _ = writeln!(md, "{BPFTRACE_METHOD}\n");
    md.push_str(&bpftrace_table(&peers));
    md.push('\n');
    md.push_str(&dns_time_section(&dns_times));
    // Written by `cargo xtask kernels --bench`: kept as it is.
    if let Some(kept) = std::fs::read_to_string(&out_path).ok().as_deref().and_then(|old| section_of(old, KERNELS_HEADING)) {
        md.push('\n');
        md.push_str(kept.trim_end());
        md.push('\n');
    }
    let _ = writeln!(md, "\n## Network devices: rtnetlink against /proc and /sys\n");
    let _ = writeln!(md, "The netdev and netclass collectors alone, in a network namespace of {devices} devices (veth pairs and lo), CPU of the collecting thread (getrusage RUSAGE_THREAD) per scrape, median of interleaved rounds; the ratio is the rtnetlink read's CPU over the file read's, lowest and highest round. node_exporter 1.12 reads netdev over rtnetlink by default, netclass from sysfs (`--collector.netclass.netlink` switches).\n");
    let _ = writeln!(md, "| read | user | kernel | CPU vs the file read (min–max) |\n|---|---|---|---|");
    for r in &net {
        let range = r.ratio_range.map(|(lo, hi)| format!("{lo:.2}×–{hi:.2}×")).unwrap_or_else(|| "-".into());
        let _ = writeln!(md, "| {} | {:.0} µs | {:.0} µs | {range} |", r.what, r.user_us, r.sys_us);
    }
    md.push_str(&growth);
    md.push('\n');
    md.push_str(&services_section(&services));
    md.push('\n');
    md.push_str(&sweep_section(&sweeps));
    let _ = writeln!(md, "\n## Planner\n\nOne `plan` (a full controller sync, mid-rollout, as many pods as nodes), median; `cargo bench -p node-agent-planner --bench plan` runs the same with criterion.\n");
    let _ = writeln!(md, "| nodes | time |\n|---|---|");
    for (n, ms) in &plans {
        let _ = writeln!(md, "| {n} | {ms:.2} ms |");
    }
    match image_section() {
        Ok(section) => {
            md.push('\n');
            md.push_str(&section);
        }
        Err(e) => eprintln!("bench: no Image section: {e}"),
    }
    std::fs::write(&out_path, &md).map_err(|e| format!("{}: {e}", out_path.display()))?;
    print!("{md}");
    Ok(())
}

const KUBELET_HEADING: &str = "## Under a real kubelet\n";

/// How many times the kubelet section starts the agent's pod.
const KUBELET_STARTS: usize = 5;

/// deploy/ applied to a one-node cluster of this machine (kubelet v1.36.2
/// over containerd and runc, `node_agent_tests::kubelet`), the pod started
/// [`KUBELET_STARTS`] times (the apply, then a deletion each): how soon
/// it is Ready, its probe failures, and its memory as the kubelet's
/// `/stats/summary` reports it after 20 scrapes and 8 s idle.
fn kubelet_section(image: &str, md_now: &str) -> Res<String> {
    use node_agent_tests::cluster::ControlPlane;
    use node_agent_tests::kubelet::{self, Node};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let daemonset = std::fs::read_to_string(root.join("deploy/agent/daemonset.yaml")).map_err(|e| e.to_string())?;
    let wanted = daemonset
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("image:"))
        .map(|i| i.trim().to_string())
        .ok_or("no image in deploy/agent/daemonset.yaml")?;
    let mut cp = ControlPlane::start()?;
    cp.start_scheduler()?;
    cp.start_controller_manager("daemonset,serviceaccount,root-ca-cert-publisher")?;
    let node = Node::start(&cp, &[image], &[(image, &wanted)])?;
    let kubectl = |args: &[&str]| -> Res<()> {
        let out = cp.kubectl(args);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)))
        }
    };
    let deploy = root.join("deploy").display().to_string();
    let mut asked = Instant::now();
    kubectl(&["apply", "-k", &deploy])?;
    let (mut ready, mut failures, mut ws, mut usage, mut rss) = (Vec::new(), 0, Vec::new(), Vec::new(), Vec::new());
    let mut previous: Option<String> = None;
    for _ in 0..KUBELET_STARTS {
        let pod = node.ready_agent(&cp, previous.as_deref(), Duration::from_secs(120))?;
        ready.push(asked.elapsed().as_secs_f64());
        for _ in 0..20 {
            kubelet::agent_metrics().ok_or("the agent did not answer on :9100")?;
        }
        std::thread::sleep(Duration::from_secs(8));
        let m = node.memory(&cp, &pod.name, "node-agent")?;
        ws.push(m.working_set / 1e6);
        usage.push(m.usage / 1e6);
        rss.push(m.rss / 1e6);
        failures += kubelet::unhealthy(&cp, &pod.name)?.len();
        kubectl(&["-n", "monitoring", "delete", "pod", &pod.name, "--wait=true", "--timeout=120s"])?;
        asked = Instant::now();
        previous = Some(pod.uid);
    }
    let range = |v: &[f64], unit: &str| {
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        format!("{:.1}{unit} ({lo:.1}–{hi:.1})", sorted[sorted.len() / 2])
    };
    // The bench's own figure for the same thing, from this file's memory
    // section (every probe, 110 pods from an in-memory API server).
    let own = md_now
        .lines()
        .find(|l| l.starts_with("| working set, after idle |"))
        .and_then(|l| l.split('|').nth(5))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|| "-".into());
    // The revision `cargo xtask image` recorded for this image.
    let record = std::fs::read_to_string(root.join("target/image/build.json")).unwrap_or_default();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap_or_default();
    let revision = match record["tag"].as_str() {
        Some(t) if t == image => format!(" (revision {})", record["revision"].as_str().unwrap_or("?")),
        _ => String::new(),
    };
    let mut md = String::from(KUBELET_HEADING);
    let _ = writeln!(
        md,
        "\n`cargo xtask bench --kubelet`: `kubectl apply -k deploy/` on a one-node cluster of this machine (kubelet v1.36.2 from ../shared/k8s, Debian 12's containerd 1.6.20 and runc 1.1.5, cgroupfs driver, a CNI bridge; `tests/src/kubelet.rs`), image `{image}`{revision} imported into containerd, as deploy/ ships it (default collectors, every probe; the node runs the agent and a few control-plane processes, no other pods). The pod started {KUBELET_STARTS} times: the apply, then a deletion each time. Ready: from the apply, or from the previous pod gone, to the pod's Ready condition as the API server reports it. Memory: the kubelet's `/stats/summary` for the agent's container after 20 scrapes and 8 s idle (the working set is what the kubelet evicts by and compares with the limit). Median (least–most).\n"
    );
    let _ = writeln!(md, "| measure | value |\n|---|---|");
    let _ = writeln!(md, "| Ready after the pod was asked for | {} |", range(&ready, " s"));
    let _ = writeln!(md, "| probe failures (`Unhealthy` events: startup, readiness, liveness), all starts | {failures} |");
    let _ = writeln!(md, "| working set (`workingSetBytes`) | {} |", range(&ws, " MB"));
    let _ = writeln!(md, "| cgroup usage (`usageBytes`) | {} |", range(&usage, " MB"));
    let _ = writeln!(md, "| RSS (`rssBytes`) | {} |", range(&rss, " MB"));
    let _ = writeln!(md, "| deploy/'s request and limit | 48Mi (50.3 MB), 192Mi (201.3 MB) |");
    let _ = writeln!(md, "| the bench's own working set after idle, every probe, 110 pods (\"Memory the kubelet's way\") | {own} |");
    drop(node);
    Ok(md)
}

const IMAGE_HEADING: &str = "## Image\n";

/// The Image section: the last `cargo xtask image` build (its record,
/// target/image/build.json) beside node_exporter's binary.
fn image_section() -> Res<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/image/build.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e} (run cargo xtask image)", path.display()))?;
    let r: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let num = |k: &str| r[k].as_u64().unwrap_or(0);
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let ne = compare::which("prometheus-node-exporter").ok_or("prometheus-node-exporter is not installed")?;
    let ne_size = std::fs::metadata(&ne).map_err(|e| format!("{}: {e}", ne.display()))?.len();
    let mut md = String::from(IMAGE_HEADING);
    let _ = writeln!(
        md,
        "\n`cargo xtask image` on this machine: podman and runc from Debian 12, both bases made from Debian 12's packages (no registry), the PGO release build inside the build stage. Sizes as podman reports them (uncompressed); node_exporter's binary is Debian's 1.5.0 (Go).\n"
    );
    let _ = writeln!(md, "| | size |\n|---|---|");
    let _ = writeln!(
        md,
        "| node-agent image `{}` (revision {}) | {} |",
        r["tag"].as_str().unwrap_or("?"),
        r["revision"].as_str().unwrap_or("?"),
        mb(num("size"))
    );
    let _ = writeln!(
        md,
        "| … its runtime base (glibc, libgcc, CA certificates, users: distroless/cc's content) | {} |",
        mb(num("runtime_base_size"))
    );
    let _ = writeln!(
        md,
        "| … its binary, /usr/bin/node-agent (eBPF programs embedded; built without the cluster commands, symbols stripped) | {} |",
        mb(num("binary_size"))
    );
    if let Some(controller) = r["controller_tag"].as_str() {
        let _ = writeln!(md, "| the controller's image `{controller}` (same build stage and base) | {} |", mb(num("controller_size")));
        let _ = writeln!(
            md,
            "| … its binary, the whole node-agent (controller, plan, explain, simulate, status, rollout, crd, manifests too) | {} |",
            mb(num("controller_binary_size"))
        );
    }
    let _ = writeln!(md, "| node_exporter's binary, {} | {} |", ne.display(), mb(ne_size));
    let _ = writeln!(md, "\nThe build took {} s (the Debian bases cached; the build stage's time depends on what its kept target directory already holds, and on what else the machine runs).", num("seconds"));
    if let Some(again) = r["rebuilt_from_nothing_seconds"].as_u64() {
        let _ = writeln!(
            md,
            "`--twice`: rebuilt with no layer cache and an empty target directory in {again} s, to the same image ID and digest (`{}`).",
            r["digest"].as_str().unwrap_or("?")
        );
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_is_replaced_kept_or_put_before_the_next() {
        let md = "# B\n\n## A\nold a\n\n## Network devices\nn\n## Image\ni\n";
        let k = "## eBPF on older kernels\nk1\n";
        let with = with_section(md, KERNELS_HEADING, k, Some("## Network devices"));
        assert_eq!(with, "# B\n\n## A\nold a\n\n## eBPF on older kernels\nk1\n\n## Network devices\nn\n## Image\ni\n");
        assert_eq!(section_of(&with, KERNELS_HEADING), Some("## eBPF on older kernels\nk1\n\n"));
        let again = with_section(&with, KERNELS_HEADING, "## eBPF on older kernels\nk2\n", None);
        assert_eq!(again.matches("## eBPF on older kernels").count(), 1);
        assert!(again.contains("k2\n") && !again.contains("k1"));
        assert_eq!(with_section(md, IMAGE_HEADING, "## Image\nj\n", None), "# B\n\n## A\nold a\n\n## Network devices\nn\n## Image\nj\n");
        assert_eq!(with_section("# B\n", IMAGE_HEADING, "## Image\nj\n", None), "# B\n\n## Image\nj\n");
    }

    #[test]
    fn the_kernels_section_gives_multiples_of_each_kernels_empty_program() {
        let dir = tempfile::tempdir().unwrap();
        let floor = "empty program (floor)\tsyscall (getpid)";
        std::fs::write(
            dir.path().join("5.10.tcg.tsv"),
            format!("release\t5.10.0-32-cloud-amd64\nrow\t{floor}\t9000\t900\t1000\t1100\t-\t800\nrow\tebpf_x\tev\t9000\t1800\t2000\t2200\t1000\t4000\ndown\tebpf_y\tev2\tverifier: no\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("host.native.tsv"),
            format!("release\t6.18.44\nrow\t{floor}\t560\t45\t46\t47\t-\t46\nrow\tebpf_x\tev\t560\t90\t92\t94\t46\t92\nrow\tebpf_y\tev2\t600\t10\t11\t12\t-\t-\n"),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("6.12.tcg.tsv"),
            format!("release\t6.12.118\nrow\t{floor}\t9000\t900\t1000\t1100\t-\t100\nrow\tebpf_x\tev\t9000\t1800\t2000\t2200\t1000\t200\nrow\tebpf_y\tev2\t9000\t1\t2\t3\t-\t150\n"),
        )
        .unwrap();
        let md = kernels_section(dir.path()).unwrap();
        assert!(md.starts_with(KERNELS_HEADING), "{md}");
        // Oldest first, the host last; the empty program's run time in ns,
        // the rest multiples of it in the same kernel.
        assert!(md.contains("| probe | event | 5.10 | 6.12 | host |"), "{md}");
        assert!(md.contains(&format!("| {floor} | 800 ns | 100 ns | 46 ns |").replace('\t', " | ")), "{md}");
        assert!(md.contains("| ebpf_x | ev | 5.0× | 2.0× | 2.0× |"), "{md}");
        assert!(md.contains("| ebpf_y | ev2 | down | 1.5× | - |"), "{md}");
        // 5.10 against the newest emulated kernel, not against the host.
        assert!(md.contains("ebpf_x on 5.10 (ev: 5.0×, 6.12 2.0×)"), "{md}");
        assert!(!md.contains("on host"), "{md}");
    }
}
