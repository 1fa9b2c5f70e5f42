//! The perf collector against ground truth on this machine (root; in CI it
//! runs, never skips):
//! - software counters: a thread pinned to one CPU faults in N fresh pages
//!   of an mmap'ed region (THP off for it) and plays M pipe round trips with
//!   a second thread pinned to the same CPU; the collector's per-CPU deltas
//!   read around the workload must be at least the known counts (and at
//!   least what getrusage(RUSAGE_THREAD) says our own threads did), in every
//!   attempt. Upper bounds are relative to the noise of the other tasks on
//!   the CPU (CI and builds share the two cores), measured with the same
//!   collector over an idle window right before the workload (our threads
//!   asleep) and scaled to the workload's duration: page faults at most
//!   our own + 3 x noise + 256; context switches at most 2 x our own +
//!   3 x noise + 256 (every switch on the CPU is out of one of our threads,
//!   which rusage counts, or out of another task, which got the CPU either
//!   from one of ours, at most as many, or from someone else, the noise).
//!   They must hold in one of three attempts;
//! - tracepoints `syscalls:sys_enter_getppid` and `sched:sched_process_fork`
//!   (one event group per CPU): K getppid calls and F spawned `/bin/true`
//!   from the pinned thread give deltas of at least K and F on that CPU in
//!   every attempt, and, in one of three attempts, at most K + 3 x noise +
//!   10 and F + 3 x noise + 30 there, and at most 3 x noise + 10 getppid on
//!   each other CPU (noise: the same delta over an idle window of the same
//!   length right before; any process, a bash starting, may call getppid);
//! - hardware and cache profilers on this PMU-less VM: as node_exporter
//!   1.12.1 (perf-utils skips events it cannot open), the collector builds
//!   and succeeds, exports the software families for every CPU and no
//!   hardware or cache family; through the real node-agent binary,
//!   `node_scrape_collector_success{collector="perf"} 1` on every scrape
//!   and the reason logged once; the hardware profilers alone (nothing
//!   can be opened without a PMU) give success 0, logged once; and a
//!   tracepoint that does not exist gives success 0 without failing the
//!   scrape, logged once.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use expo::Sink;
use host::collector::perf;
use host::Collector;

type Values = BTreeMap<(String, String), f64>;

/// The workloads of two tests on the same CPU would be each other's noise.
static ONE_WORKLOAD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn paths() -> host::Paths {
    host::Paths { procfs: "/proc".into(), sysfs: "/sys".into(), rootfs: "/".into(), udev_data: "/run/udev/data".into() }
}

fn collect(c: &mut perf::Collector) -> Values {
    let mut sink = Sink::new();
    c.update(&mut sink).expect("perf collector succeeds");
    let mut out = Values::new();
    for f in sink.families() {
        for (labels, v) in f.samples() {
            let cpu = labels.iter().find(|(k, _)| *k == "cpu").map(|(_, v)| v.to_string()).expect("cpu label");
            assert_eq!(labels.len(), 1, "{}: only a cpu label", f.name());
            out.insert((f.name().to_string(), cpu), v);
        }
    }
    out
}

fn delta(before: &Values, after: &Values, family: &str, cpu: usize) -> f64 {
    let k = (family.to_string(), cpu.to_string());
    let (Some(a), Some(b)) = (after.get(&k), before.get(&k)) else { panic!("{family}{{cpu={cpu}}} missing: {after:?}") };
    a - b
}

/// The CPUs of this thread's affinity mask, counted: the collector's own
/// source for its default CPUs 0..N-1 (not available_parallelism, which
/// also heeds a cgroup CPU quota).
fn ncpus() -> usize {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    // SAFETY: `set` was filled by sched_getaffinity.
    usize::try_from(unsafe { libc::CPU_COUNT(&set) }).expect("CPU count")
}

/// What the other tasks on the CPU add to `family` over a window as long
/// as the workload's: the delta over the idle window, scaled to `work`.
fn noise(idle: (&Values, &Values, Duration), family: &str, cpu: usize, work: Duration) -> f64 {
    let (start, end, window) = idle;
    delta(start, end, family, cpu).max(0.0) * work.as_secs_f64() / window.as_secs_f64().max(1e-6)
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (a 2-CPU machine); `set` is valid.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// (minor faults, voluntary + involuntary context switches) of this thread.
fn rusage_thread() -> (i64, i64) {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid rusage to write into.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    assert_eq!(rc, 0);
    (r.ru_minflt, r.ru_nvcsw + r.ru_nivcsw)
}

/// Maps `n` fresh anonymous pages (no transparent huge pages) and writes one
/// byte to each: `n` minor page faults.
fn touch_fresh_pages(n: usize) {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page size");
    let len = n * page;
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing; no existing memory is touched.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    // SAFETY: [p, p+len) is the mapping just made.
    let rc = unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    assert_eq!(rc, 0, "madvise: {}", std::io::Error::last_os_error());
    for i in 0..n {
        // SAFETY: i*page < len, inside the writable mapping.
        unsafe { std::ptr::write_volatile(p.cast::<u8>().add(i * page), 1) };
    }
    // SAFETY: unmaps exactly the mapping made above, no longer used.
    unsafe { libc::munmap(p, len) };
}

/// One attempt: the collector's values at the start and end of an idle
/// window and at the end of the workload right after it, the two windows'
/// lengths, and what getrusage says our threads did in the workload.
struct Run {
    idle_start: Values,
    before: Values,
    after: Values,
    idle: Duration,
    work: Duration,
    own_faults: i64,
    own_switches: i64,
}

impl Run {
    fn noise(&self, family: &str, cpu: usize) -> f64 {
        noise((&self.idle_start, &self.before, self.idle), family, cpu, self.work)
    }
}

#[test]
fn software_counters_count_a_known_workload_on_its_cpu() {
    if !node_agent_tests::host::root_or_skip("perf truth tests") {
        return;
    }
    let _one = ONE_WORKLOAD.lock().unwrap_or_else(|e| e.into_inner());
    const PAGES: usize = 16384;
    const ROUND_TRIPS: usize = 4000;
    let cpu = ncpus() - 1;
    let o = perf::Options { cpus: Some(vec![cpu]), hardware: false, cache: false, ..perf::Options::default() };
    let mut c = perf::Collector::new(o, &paths()).expect("build");
    let mut report = Vec::new();
    // The idle window lasts as long as the previous attempt's workload
    // (the first: a guess); its noise is scaled to this workload's length.
    let mut idle_for = Duration::from_millis(100);
    for attempt in 1..=3 {
        let run = std::thread::scope(|s| {
            let (mut from_a, mut to_b) = std::io::pipe().expect("pipe");
            let (mut from_b, mut to_a) = std::io::pipe().expect("pipe");
            let b = s.spawn(move || {
                pin(cpu);
                let mut byte = [0u8; 1];
                // Counted from the first byte on: the block before it falls
                // before the workload window.
                from_a.read_exact(&mut byte).expect("read");
                let start = rusage_thread().1;
                to_a.write_all(&byte).expect("write");
                for _ in 1..ROUND_TRIPS {
                    from_a.read_exact(&mut byte).expect("read");
                    to_a.write_all(&byte).expect("write");
                }
                rusage_thread().1 - start
            });
            let c = &mut c;
            let a = s.spawn(move || {
                pin(cpu);
                std::thread::sleep(Duration::from_millis(5)); // let B pin itself and block
                let idle_start = collect(c);
                let t = Instant::now();
                std::thread::sleep(idle_for);
                let before = collect(c);
                let idle = t.elapsed();
                let t = Instant::now();
                let (f0, s0) = rusage_thread();
                touch_fresh_pages(PAGES);
                let mut byte = [7u8; 1];
                for _ in 0..ROUND_TRIPS {
                    to_b.write_all(&byte).expect("write");
                    from_b.read_exact(&mut byte).expect("read");
                }
                let (f1, s1) = rusage_thread();
                let after = collect(c);
                Run { idle_start, before, after, idle, work: t.elapsed(), own_faults: f1 - f0, own_switches: s1 - s0 }
            });
            let mut run = a.join().expect("thread A");
            run.own_switches += b.join().expect("thread B");
            run
        });
        idle_for = run.work;
        let (before, after) = (&run.before, &run.after);
        let (own_faults, own_switches) = (run.own_faults, run.own_switches);
        let pf = delta(before, after, "node_perf_page_faults_total", cpu);
        let minor = delta(before, after, "node_perf_minor_faults_total", cpu);
        let cs = delta(before, after, "node_perf_context_switches_total", cpu);
        let n_pf = run.noise("node_perf_page_faults_total", cpu);
        let n_minor = run.noise("node_perf_minor_faults_total", cpu);
        let n_cs = run.noise("node_perf_context_switches_total", cpu);
        let line = format!(
            "attempt {attempt}: cpu {cpu}, workload {:?} after an idle window of {:?}: page_faults +{pf} (noise {n_pf:.0}), \
             minor_faults +{minor} (noise {n_minor:.0}); workload {PAGES}, own thread {own_faults}; context_switches +{cs} \
             (noise {n_cs:.0}; workload >= {}, own threads {own_switches})",
            run.work,
            run.idle,
            2 * ROUND_TRIPS - 1
        );
        eprintln!("{line}");
        report.push(line.clone());
        // Lower bounds: always.
        assert!(own_faults >= PAGES as i64, "{line}");
        assert!(own_switches >= 2 * ROUND_TRIPS as i64 - 1, "{line}");
        assert!(pf >= own_faults as f64 && minor >= own_faults as f64, "{line}");
        assert!(cs >= own_switches as f64, "{line}");
        for fam in ["node_perf_major_faults_total", "node_perf_cpu_migrations_total"] {
            assert!(after.contains_key(&(fam.to_string(), cpu.to_string())), "{fam} missing");
        }
        assert!(after.keys().all(|(_, c)| *c == cpu.to_string()), "only the CPU asked for: {after:?}");
        assert_eq!(after.len(), 5, "the five software families: {after:?}");
        // Upper bounds: relative to the measured noise of other tasks.
        let within = pf <= own_faults as f64 + 3.0 * n_pf + 256.0
            && minor <= own_faults as f64 + 3.0 * n_minor + 256.0
            && cs <= 2.0 * own_switches as f64 + 3.0 * n_cs + 256.0;
        if within {
            return;
        }
    }
    panic!("deltas above the workload + 3 x measured noise + margin in all three attempts:\n{}", report.join("\n"));
}

#[test]
fn tracepoints_count_getppid_calls_and_forks() {
    if !node_agent_tests::host::root_or_skip("perf truth tests") {
        return;
    }
    let _one = ONE_WORKLOAD.lock().unwrap_or_else(|e| e.into_inner());
    const GETPPID: usize = 1000;
    const FORKS: usize = 10;
    const G: &str = "node_perf_syscalls_sys_enter_getppid";
    const F: &str = "node_perf_sched_sched_process_fork";
    let n = ncpus();
    let cpu = n - 1;
    let tracepoints =
        perf::parse_tracepoints(&["syscalls:sys_enter_getppid".to_string(), "sched:sched_process_fork".to_string()]).expect("flags");
    let o = perf::Options { tracepoints, hardware: false, software: false, cache: false, ..perf::Options::default() };
    let mut c = perf::Collector::new(o, &paths()).expect("build");
    let mut report = Vec::new();
    let mut idle_for = Duration::from_millis(50);
    for attempt in 1..=3 {
        let run = std::thread::scope(|s| {
            let c = &mut c;
            s.spawn(move || {
                pin(cpu);
                let idle_start = collect(c);
                let t = Instant::now();
                std::thread::sleep(idle_for);
                let before = collect(c);
                let idle = t.elapsed();
                let t = Instant::now();
                for _ in 0..GETPPID {
                    // SAFETY: getppid has no preconditions.
                    std::hint::black_box(unsafe { libc::getppid() });
                }
                for _ in 0..FORKS {
                    let st = Command::new("/bin/true").stdin(Stdio::null()).status().expect("spawn /bin/true");
                    assert!(st.success());
                }
                let after = collect(c);
                Run { idle_start, before, after, idle, work: t.elapsed(), own_faults: 0, own_switches: 0 }
            })
            .join()
            .expect("workload thread")
        });
        idle_for = run.work;
        let (before, after) = (&run.before, &run.after);
        assert_eq!(after.len(), 2 * n, "two tracepoint families for every CPU: {after:?}");
        let g = delta(before, after, G, cpu);
        let f = delta(before, after, F, cpu);
        let (n_g, n_f) = (run.noise(G, cpu), run.noise(F, cpu));
        let others: Vec<(f64, f64)> = (0..n).filter(|&o| o != cpu).map(|o| (delta(before, after, G, o), run.noise(G, o))).collect();
        let line = format!(
            "attempt {attempt}: cpu {cpu}, workload {:?} after an idle window of {:?}: getppid +{g} (made {GETPPID}, noise {n_g:.1}), \
             forks +{f} (made {FORKS}, noise {n_f:.1}); getppid on other CPUs (delta, noise) {others:?}",
            run.work, run.idle
        );
        eprintln!("{line}");
        report.push(line.clone());
        assert!(g >= GETPPID as f64 && f >= FORKS as f64, "{line}");
        if g <= GETPPID as f64 + 3.0 * n_g + 10.0
            && f <= FORKS as f64 + 3.0 * n_f + 30.0
            && others.iter().all(|&(d, noise)| d <= 3.0 * noise + 10.0)
        {
            return;
        }
    }
    panic!("tracepoint deltas above the known counts + 3 x measured noise + margin in all three attempts:\n{}", report.join("\n"));
}

fn has_cpu_pmu() -> bool {
    Path::new("/sys/bus/event_source/devices/cpu").exists()
}

#[test]
fn hardware_profilers_without_a_pmu_are_skipped_as_node_exporter_does() {
    if !node_agent_tests::host::root_or_skip("perf truth tests") {
        return;
    }
    // The collector counts the affinity mask of the thread building it:
    // this one, as ncpus() does.
    let n = ncpus();
    let mut c = perf::Collector::new(perf::Options::default(), &paths()).expect("build with every profiler on");
    let v = collect(&mut c);
    let v2 = collect(&mut c);
    let cpus: std::collections::BTreeSet<&str> = v.keys().map(|(_, c)| c.as_str()).collect();
    let want: Vec<String> = (0..n).map(|c| c.to_string()).collect();
    assert_eq!(cpus, want.iter().map(String::as_str).collect(), "the CPUs of the affinity mask, 0..{n}");
    for e in perf::SOFTWARE {
        for cpu in 0..n {
            assert!(v.contains_key(&(e.family.to_string(), cpu.to_string())), "{}{{cpu={cpu}}} missing", e.family);
        }
    }
    let hw: Vec<&str> = perf::HARDWARE.iter().chain(perf::CACHES).map(|e| e.family).collect();
    let present: Vec<&String> = v.keys().map(|(f, _)| f).filter(|f| hw.contains(&f.as_str())).collect();
    if has_cpu_pmu() {
        assert!(v.keys().any(|(f, _)| f == "node_perf_cpucycles_total"), "a PMU but no cycles: {v:?}");
    } else {
        assert!(present.is_empty(), "no PMU here, yet hardware/cache families: {present:?}");
        assert_eq!(v.len(), 5 * n, "only the software families: {v:?}");
    }
    assert_eq!(v.len(), v2.len());
    // A tracepoint that does not exist: built (the agent starts), success 0.
    let o =
        perf::Options { tracepoints: perf::parse_tracepoints(&["nosuch:event".to_string()]).expect("flag"), ..perf::Options::default() };
    let mut c = perf::Collector::new(o, &paths()).expect("build");
    let err = c.update(&mut Sink::new()).expect_err("no such tracepoint");
    assert!(err.is_no_data(), "{err}");
}

/// Runs node-agent with `flags`, scrapes it three times more once it
/// answers, and returns the bodies and what it logged.
fn run_agent(flags: &[&str]) -> (Vec<String>, String) {
    let bin: PathBuf = node_agent_tests::agent_binary();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("stderr");
    let mut args = vec!["--collector.disable-defaults", "--collector.perf"];
    args.extend_from_slice(flags);
    let stderr = std::fs::File::create(&log).expect("log file");
    let (guard, url, _) = node_agent_tests::start_exporter_with_stderr(&bin, &args, stderr.into()).expect("start node-agent");
    let bodies: Vec<String> = (0..3).map(|_| node_agent_tests::compare::http_get(&url).expect("scrape")).collect();
    drop(guard);
    (bodies, std::fs::read_to_string(&log).expect("read log"))
}

#[test]
fn agent_reports_perf_success_and_logs_the_reason_once() {
    if !node_agent_tests::host::root_or_skip("perf truth tests") {
        return;
    }
    let (bodies, log) = run_agent(&[]);
    for b in &bodies {
        assert!(b.contains("node_scrape_collector_success{collector=\"perf\"} 1"), "{b}");
        assert!(b.contains("node_perf_context_switches_total{cpu=\"0\"}"), "{b}");
        if !has_cpu_pmu() {
            assert!(!b.contains("node_perf_cpucycles_total") && !b.contains("node_perf_cache_"), "{b}");
        }
    }
    if !has_cpu_pmu() {
        let lines = log.lines().filter(|l| l.contains("perf events unavailable")).count();
        assert_eq!(lines, 1, "the missing PMU logged once, not per scrape:\n{log}");
        assert!(log.contains("cpucycles_total"), "{log}");
    }

    // The hardware profilers alone: on a machine without a PMU nothing can
    // be opened, so success 0, the reason logged once.
    let (bodies, log) = run_agent(&["--collector.perf.disable-software-profilers", "--collector.perf.disable-cache-profilers"]);
    for b in &bodies {
        let success = if has_cpu_pmu() { 1 } else { 0 };
        assert!(b.contains(&format!("node_scrape_collector_success{{collector=\"perf\"}} {success}")), "{b}");
    }
    if !has_cpu_pmu() {
        let lines = log.lines().filter(|l| l.contains("no perf event could be opened")).count();
        assert_eq!(lines, 1, "the missing PMU logged once, not per scrape:\n{log}");
    }

    // A tracepoint, through the agent's own exposition: node_exporter's
    // series name (no `_total`), the family untyped.
    let (bodies, _) = run_agent(&["--collector.perf.tracepoint=sched:sched_process_fork"]);
    for b in &bodies {
        assert!(b.contains("node_scrape_collector_success{collector=\"perf\"} 1"), "{b}");
        assert!(b.contains("node_perf_sched_sched_process_fork{cpu=\"0\"}"), "{b}");
        assert!(b.contains("# TYPE node_perf_sched_sched_process_fork untyped"), "{b}");
        assert!(!b.contains("node_perf_sched_sched_process_fork_total"), "{b}");
    }

    let (bodies, log) = run_agent(&["--collector.perf.tracepoint=nosuch:event"]);
    for b in &bodies {
        assert!(b.contains("node_scrape_collector_success{collector=\"perf\"} 0"), "{b}");
        assert!(!b.contains("node_perf_"), "{b}");
    }
    let lines = log.lines().filter(|l| l.contains("perf tracepoints could not be set up")).count();
    assert_eq!(lines, 1, "the failed tracepoint logged once:\n{log}");
}
