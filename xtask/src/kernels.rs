//! `cargo xtask kernels`: the probes' truth suites on the kernels users run.
//!
//! Each kernel is Debian's own cloud kernel, fetched by package name from
//! Debian's registry (`linux-image-cloud-amd64` of bullseye, bookworm and
//! trixie, with an apt configuration of our own under `target/kernels/apt`,
//! so the machine's sources are left alone) and cached under
//! `target/kernels/<series>/`. It boots under Debian's `qemu-system-x86`
//! with a small initramfs of our own (busybox, and the kernel's own
//! virtio and virtiofs modules where they are not built in) that mounts the
//! host's root directory read-only through virtiofs (`virtiofsd`, from
//! qemu-system-common) and switches to it: the guest runs the test binaries
//! the host built, with the host's iproute2, iptables and python3, on a
//! cgroup v2 hierarchy of its own. A second, writable share is where the
//! guest leaves its results (`target/kernels/out/<series>/`).
//!
//! KVM is used where it boots a kernel (`/dev/kvm` opens and a probe boot
//! succeeds); otherwise TCG, the emulator. Which one ran is in the table.
//!
//! The results are written to `docs/kernels.md`: every program up or down
//! with its reason, and every truth test passed, skipped (with the test's
//! reason) or failed, per kernel. The run fails if a test fails.
//!
//! `--bench` runs the benchmark's binary in each guest instead of the
//! suites (every probe's programs, the kernel's own run time per program
//! run), and natively on the host, and rewrites BENCHMARKS.md's section
//! "eBPF on older kernels" from what they measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A Debian suite whose cloud kernel is part of the matrix.
pub struct Suite {
    /// The suite (its security updates are searched too).
    pub name: &'static str,
    /// The kernel series it carries, the matrix's short name for it.
    pub series: &'static str,
    /// Who runs this series (for the table).
    pub users: &'static str,
}

/// The kernels of the matrix, oldest first.
pub const SUITES: &[Suite] = &[
    Suite { name: "bullseye", series: "5.10", users: "Debian 11, Amazon Linux 2 (5.10), Bottlerocket 1.x" },
    Suite { name: "bookworm", series: "6.1", users: "Debian 12, Amazon Linux 2023" },
    Suite { name: "trixie", series: "6.12", users: "Debian 13" },
];

/// The test suites that load the agent's eBPF programs and check what they
/// count against what the test caused.
pub const SUITES_IN_GUEST: &[&str] =
    &["ebpf_truth", "tcp_peers_truth", "dns_truth", "pod_attribution", "peers_lifecycle_truth", "perf_truth"];

/// The tests of each suite that `cargo xtask test` runs in every guest:
/// those whose outcome the kernel decides (each program's counting, its
/// maps, its verifier), within CI's time under TCG. `cargo xtask kernels
/// --all` runs every test of every suite.
pub const CI_TESTS: &[(&str, &[&str])] = &[
    (
        "ebpf_truth",
        &[
            "block_io_matches_diskstats",
            "map_memory_and_entries_exported",
            "missing_tracepoint_reported_down",
            "oom_kill_counted_once",
            "process_churn_counted",
            "skb_drops_by_reason_match_what_the_test_sent",
            "syscall_latency_of_nanosleep_in_its_native_buckets",
            "syscalls_counted_with_errors",
            "tcp_retransmits_match_netns_snmp",
            "verifier_rejected_program_reported_down_others_unaffected",
        ],
    ),
    ("tcp_peers_truth", &[]),
    ("dns_truth", &[]),
    (
        "pod_attribution",
        &[
            "accept_queue_overflows_are_the_pods_namespaces",
            "direct_io_bytes_are_the_writing_pods",
            "oom_kill_counted_for_its_pod_and_container_only",
            "skb_drops_are_the_receiving_pods",
            "syscall_errors_are_the_failing_pods",
            "tcp_retransmits_are_the_sending_pods",
        ],
    ),
    (
        "peers_lifecycle_truth",
        &["an_init_container_gone_between_two_scrapes_is_counted_for_its_pod", "connections_from_the_nodes_own_address_are_the_nodes"],
    ),
    ("perf_truth", &[]),
];

/// Debian packages the matrix needs on the host.
pub const PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "kmod", "xz-utils", "zstd", "e2fsprogs"];

/// Where the generated table goes.
pub const TABLE: &str = "docs/kernels.md";

/// Options of a run.
pub struct Options {
    /// Only these series (`5.10`, `6.1`, `6.12`); all when empty.
    pub only: Vec<String>,
    /// Only these test suites; all of [`SUITES_IN_GUEST`] when empty.
    pub tests: Vec<String>,
    /// What to do with docs/kernels.md.
    pub table: Table,
    /// Every test of each suite, not only [`CI_TESTS`].
    pub all: bool,
    /// The benchmark's binary: instead of the suites, each guest (and the
    /// host) measures every probe's cost per event with it, and BENCHMARKS.md's
    /// section on older kernels is rewritten from what they measured.
    pub bench: Option<PathBuf>,
}

/// docs/kernels.md and a run.
#[derive(Clone, Copy, PartialEq)]
pub enum Table {
    /// Leave it alone (a partial run).
    Leave,
    /// Write it (`cargo xtask kernels`).
    Write,
    /// Fail when the run saw something else (`cargo xtask test`); the
    /// run's own is written to target/kernels/kernels.md.
    Check,
}

/// A kernel fetched and unpacked.
struct Kernel {
    suite: &'static Suite,
    /// The Debian package version (`5.10.223-1`).
    version: String,
    /// `uname -r` (`5.10.0-32-cloud-amd64`).
    release: String,
    /// The unpacked package.
    root: PathBuf,
}

impl Kernel {
    fn vmlinuz(&self) -> PathBuf {
        self.root.join("boot").join(format!("vmlinuz-{}", self.release))
    }
}

/// What one kernel's run saw.
#[derive(Default)]
struct Outcome {
    accel: String,
    boot_s: f64,
    total_s: f64,
    /// program → None when up, Some(reason) when down.
    programs: BTreeMap<String, Option<String>>,
    /// suite → test → result.
    tests: BTreeMap<String, BTreeMap<String, TestResult>>,
    /// suite → seconds.
    suite_s: BTreeMap<String, f64>,
    /// Whatever went wrong with the run itself (no results, a crash).
    trouble: Vec<String>,
}

#[derive(Clone, PartialEq)]
enum TestResult {
    Passed,
    Skipped(String),
    Failed,
}

/// Runs the matrix; Ok(false) when a test failed or a kernel gave no results.
pub fn run(root: &Path, cargo: &str, opts: &Options) -> Result<bool> {
    let work = root.join("target/kernels");
    fs::create_dir_all(&work)?;
    let started = Instant::now();
    let apt = Apt::new(&work)?;
    let mut kernels = Vec::new();
    for s in SUITES.iter().filter(|s| opts.only.is_empty() || opts.only.iter().any(|o| o == s.series)) {
        kernels.push(fetch(&apt, &work, s).with_context(|| format!("fetching Debian {}'s kernel", s.name))?);
    }
    if kernels.is_empty() {
        bail!("no kernel of the matrix matches {:?} (the series are {:?})", opts.only, SUITES.iter().map(|s| s.series).collect::<Vec<_>>());
    }
    let tests: Vec<&str> = SUITES_IN_GUEST
        .iter()
        .copied()
        .filter(|t| opts.bench.is_none() && (opts.tests.is_empty() || opts.tests.iter().any(|o| o == t)))
        .collect();
    let (agent, exes) = build(root, cargo, &tests)?;
    eprintln!("xtask: kernels fetched and tests built in {:.0} s", started.elapsed().as_secs_f64());
    let accel = accel(&work, &kernels[0]);
    let mut outcomes = Vec::new();
    for k in &kernels {
        let t = Instant::now();
        let out = boot(root, &work, k, &accel, &agent, &exes, opts).with_context(|| format!("booting {}", k.release))?;
        eprintln!(
            "xtask: Linux {} ({}): {} programs up of {}, tests {} passed, {} skipped, {} failed, in {:.0} s",
            k.release,
            out.accel,
            out.programs.values().filter(|d| d.is_none()).count(),
            out.programs.len(),
            count(&out, |r| *r == TestResult::Passed),
            count(&out, |r| matches!(r, TestResult::Skipped(_))),
            count(&out, |r| *r == TestResult::Failed),
            t.elapsed().as_secs_f64()
        );
        for trouble in &out.trouble {
            eprintln!("xtask: Linux {}: {trouble}", k.release);
        }
        outcomes.push(out);
    }
    if let Some(bench) = &opts.bench {
        let ok = outcomes.iter().all(|o| o.trouble.is_empty());
        bench_section(root, &work, bench, &kernels, &outcomes)?;
        eprintln!("xtask: the kernel matrix's costs took {:.0} s", started.elapsed().as_secs_f64());
        return Ok(ok);
    }
    let host = host_programs(&agent).unwrap_or_else(|e| {
        eprintln!("xtask: the host kernel's programs could not be read: {e:#}");
        BTreeMap::new()
    });
    let table = render(&kernels, &outcomes, &host, &tests);
    let mut ok = outcomes.iter().all(|o| o.trouble.is_empty() && count(o, |r| *r == TestResult::Failed) == 0);
    match opts.table {
        Table::Leave => {}
        Table::Write => {
            fs::write(root.join(TABLE), &table)?;
            eprintln!("xtask: {TABLE} written");
        }
        Table::Check => {
            fs::write(work.join("kernels.md"), &table)?;
            let committed = fs::read_to_string(root.join(TABLE)).unwrap_or_default();
            if let Some(d) = differs(&committed, &table) {
                eprintln!("xtask: this run saw what {TABLE} does not say (the run's own: target/kernels/kernels.md; `cargo xtask kernels` rewrites it):\n{d}");
                ok = false;
            }
        }
    }
    eprintln!("xtask: the kernel matrix took {:.0} s: {}", started.elapsed().as_secs_f64(), if ok { "passed" } else { "FAILED" });
    Ok(ok)
}

fn count(o: &Outcome, f: impl Fn(&TestResult) -> bool) -> usize {
    o.tests.values().flat_map(|t| t.values()).filter(|r| f(r)).count()
}

/// apt with a configuration of our own: Debian's suites of the matrix, the
/// machine's own sources and state untouched.
struct Apt {
    opts: Vec<String>,
    updated: std::cell::Cell<bool>,
}

impl Apt {
    fn new(work: &Path) -> Result<Apt> {
        let dir = work.join("apt");
        for d in ["state/lists/partial", "cache/archives/partial", "etc/sources.list.d", "etc/preferences.d"] {
            fs::create_dir_all(dir.join(d))?;
        }
        let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
        let mut list = String::new();
        for s in SUITES {
            let _ = writeln!(list, "deb [signed-by={key}] http://deb.debian.org/debian {} main", s.name);
            let _ = writeln!(list, "deb [signed-by={key}] http://deb.debian.org/debian-security {}-security main", s.name);
        }
        fs::write(dir.join("etc/sources.list"), list)?;
        let d = dir.display();
        let opts = vec![
            format!("-oDir::State={d}/state"),
            format!("-oDir::Cache={d}/cache"),
            format!("-oDir::Etc::SourceList={d}/etc/sources.list"),
            format!("-oDir::Etc::SourceParts={d}/etc/sources.list.d"),
            format!("-oDir::Etc::Preferences={d}/etc/preferences"),
            format!("-oDir::Etc::PreferencesParts={d}/etc/preferences.d"),
            "-oAcquire::Languages=none".into(),
            "-oAPT::Sandbox::User=root".into(),
        ];
        Ok(Apt { opts, updated: std::cell::Cell::new(false) })
    }

    fn command(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.args(&self.opts).env("DEBIAN_FRONTEND", "noninteractive");
        c
    }

    fn update(&self) -> Result<()> {
        if !self.updated.get() {
            super::run(self.command("apt-get").args(["update", "-qq"]))?;
            self.updated.set(true);
        }
        Ok(())
    }

    /// Versions of `pkg` in `suite` or its security updates, newest first.
    fn versions(&self, pkg: &str, suite: &str) -> Result<Vec<String>> {
        let out = self.command("apt-cache").args(["madison", pkg]).output()?;
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('|').map(str::trim).collect();
                let from = f.get(2)?;
                (from.contains(&format!(" {suite}/")) || from.contains(&format!(" {suite}-security/"))).then(|| f[1].to_string())
            })
            .collect();
        v.sort_by(|a, b| if dpkg_newer(a, b) { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater });
        v.dedup();
        Ok(v)
    }

    /// Downloads `pkg=version` into `dir`; the .deb's path.
    fn download(&self, pkg: &str, version: &str, dir: &Path) -> Result<PathBuf> {
        let status = self
            .command("apt-get")
            .current_dir(dir)
            .args(["download", "-qq", &format!("{pkg}={version}")])
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("apt-get download {pkg}={version} failed ({status})");
        }
        let stem = format!("{pkg}_");
        for e in fs::read_dir(dir)? {
            let p = e?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with(&stem) && name.ends_with(".deb") && name.contains(&version.replace(':', "%3a")) {
                return Ok(p);
            }
        }
        bail!("apt-get download {pkg}={version} left no .deb in {}", dir.display())
    }
}

/// Whether Debian version `a` is newer than `b`.
fn dpkg_newer(a: &str, b: &str) -> bool {
    Command::new("dpkg").args(["--compare-versions", a, "gt", b]).status().map(|s| s.success()).unwrap_or(false)
}

/// The suite's newest cloud kernel, unpacked under target/kernels/<series>
/// (kept: a second run fetches nothing; remove the directory to take
/// Debian's updates).
fn fetch(apt: &Apt, work: &Path, s: &'static Suite) -> Result<Kernel> {
    let dir = work.join(s.series);
    let stamp = dir.join("kernel.json");
    if let Ok(text) = fs::read_to_string(&stamp) {
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let k = Kernel {
            suite: s,
            version: v["version"].as_str().unwrap_or_default().to_string(),
            release: v["release"].as_str().unwrap_or_default().to_string(),
            root: dir.join("root"),
        };
        if k.vmlinuz().is_file() {
            return Ok(k);
        }
    }
    apt.update()?;
    let debs = dir.join("debs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&debs)?;
    // The metapackage names the kernel package; a version the index lists
    // may be gone from the mirror (a superseded security update): the next
    // one is tried.
    let mut meta = None;
    for v in apt.versions("linux-image-cloud-amd64", s.name)? {
        match apt.download("linux-image-cloud-amd64", &v, &debs) {
            Ok(p) => {
                meta = Some((p, v));
                break;
            }
            Err(e) => eprintln!("xtask: {e:#}; trying an older version"),
        }
    }
    let Some((meta, version)) = meta else { bail!("no linux-image-cloud-amd64 of {} could be downloaded", s.name) };
    let depends = output(Command::new("dpkg-deb").args(["-f"]).arg(&meta).arg("Depends"))?;
    let image = depends
        .split(',')
        .map(str::trim)
        .find_map(|d| d.split_whitespace().next().filter(|n| n.starts_with("linux-image-")))
        .context("the metapackage depends on no linux-image package")?
        .to_string();
    let deb = apt.download(&image, &version, &debs)?;
    let root = dir.join("root");
    super::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    let release = image.strip_prefix("linux-image-").unwrap_or(&image).to_string();
    // trixie keeps modules under /usr/lib/modules; depmod and modprobe -d
    // look in <base>/lib/modules.
    if !root.join("lib/modules").exists() && root.join("usr/lib/modules").is_dir() {
        fs::create_dir_all(root.join("lib"))?;
        std::os::unix::fs::symlink("../usr/lib/modules", root.join("lib/modules"))?;
    }
    super::run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
    let k = Kernel { suite: s, version, release, root };
    if !k.vmlinuz().is_file() {
        bail!("{} holds no {}", deb.display(), k.vmlinuz().display());
    }
    let _ = fs::remove_dir_all(&debs);
    fs::write(&stamp, serde_json::json!({ "version": k.version, "release": k.release }).to_string())?;
    eprintln!("xtask: Debian {}'s kernel {} ({}) unpacked in {}", s.name, k.release, k.version, dir.display());
    Ok(k)
}

fn output(c: &mut Command) -> Result<String> {
    let shown = format!("{c:?}");
    let out = c.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds the agent (debug, as the tests run it) and the test binaries;
/// the agent's path and each suite's executable.
fn build(root: &Path, cargo: &str, tests: &[&str]) -> Result<(PathBuf, Vec<(String, PathBuf)>)> {
    super::run(Command::new(cargo).current_dir(root).args(["build", "-q", "-p", "node-agent", "--bin", "node-agent"]))?;
    if tests.is_empty() {
        return Ok((root.join("target/debug/node-agent"), Vec::new()));
    }
    // As `cargo xtask test` built them (the workspace's features unified),
    // so that after the suite nothing is built again.
    let mut c = Command::new(cargo);
    c.current_dir(root).env("CI", "1").args(["test", "-q", "--workspace", "--no-run", "--message-format=json"]);
    for t in tests {
        c.args(["--test", t]);
    }
    let text = output(&mut c)?;
    let mut exes = Vec::new();
    for line in text.lines() {
        let Ok(m) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = m["target"]["name"].as_str().unwrap_or_default();
        if m["reason"] == "compiler-artifact" && tests.contains(&name) {
            if let Some(exe) = m["executable"].as_str() {
                exes.push((name.to_string(), PathBuf::from(exe)));
            }
        }
    }
    exes.sort_by_key(|(n, _)| tests.iter().position(|t| t == n));
    if exes.len() != tests.len() {
        bail!("cargo built {} of the {} test suites ({:?})", exes.len(), tests.len(), exes);
    }
    Ok((root.join("target/debug/node-agent"), exes))
}

/// KVM where it boots a kernel here, else TCG. Nested virtualization can
/// open /dev/kvm and still fail (seen here: an emulation error in the
/// kernel's decompressor), so a short probe boot decides.
fn accel(work: &Path, k: &Kernel) -> String {
    if fs::File::open("/dev/kvm").is_err() {
        return "tcg".into();
    }
    let probe = work.join("kvm-probe.cpio");
    let init = "#!/bin/busybox sh\n/bin/busybox echo NODE_AGENT_KVM_OK\n/bin/busybox poweroff -f\n";
    if initramfs(&probe, init, &[]).is_err() {
        return "tcg".into();
    }
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "kvm", "-cpu", "host", "-m", "512", "-nographic", "-no-reboot", "-kernel"])
        .arg(k.vmlinuz())
        .arg("-initrd")
        .arg(&probe)
        .args(["-append", "console=ttyS0 panic=-1 quiet"]);
    let out = run_for(&mut c, Duration::from_secs(15)).unwrap_or_default();
    if out.contains("NODE_AGENT_KVM_OK") {
        "kvm".into()
    } else {
        eprintln!(
            "xtask: /dev/kvm opens but a kernel does not boot with it here: the matrix runs under TCG (emulated, about ten times slower)"
        );
        "tcg".into()
    }
}

/// Runs `c` with its output captured, killed after `limit`.
fn run_for(c: &mut Command, limit: Duration) -> Result<String> {
    let mut child = c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let t = Instant::now();
    while child.try_wait()?.is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned())
}

/// Writes an uncompressed newc initramfs: `/init` (mode 0755), busybox at
/// /bin/busybox and `files` (name in the archive, contents).
fn initramfs(path: &Path, init: &str, files: &[(String, Vec<u8>)]) -> Result<()> {
    let busybox = fs::read("/bin/busybox").context("reading /bin/busybox (Debian's busybox-static)")?;
    let mut out = Vec::new();
    let mut ino = 1u32;
    let mut entry = |out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]| {
        let mut h = format!("070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}", 0, 0, 1, 0, data.len());
        h.push_str(&format!("{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}", 0, 0, 0, 0, name.len() + 1, 0));
        ino += 1;
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    };
    for d in ["bin", "dev", "proc", "sys", "newroot", "mods"] {
        entry(&mut out, d, 0o040755, &[]);
    }
    entry(&mut out, "init", 0o100755, init.as_bytes());
    entry(&mut out, "bin/busybox", 0o100755, &busybox);
    for (name, data) in files {
        entry(&mut out, name, 0o100644, data);
    }
    entry(&mut out, "TRAILER!!!", 0, &[]);
    fs::write(path, out)?;
    Ok(())
}

/// The initramfs's /init: loads the modules virtiofs needs, mounts the
/// host's root read-only and switches to it, running the script named on
/// the command line as the guest's first process.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for m in $($B cat /mods/order); do $B insmod /mods/$m || echo "NODE_AGENT_VM insmod $m failed"; done
for a in $($B cat /proc/cmdline); do case $a in node_agent.script=*) S=${a#node_agent.script=};; esac; done
$B mount -t virtiofs root /newroot -o ro || { echo "NODE_AGENT_VM the host's root did not mount"; $B poweroff -f; }
$B umount /proc
$B umount /dev
exec $B switch_root /newroot /bin/bash "$S"
"#;

/// The modules virtio_pci and virtiofs need on this kernel (none where
/// they are built in), in load order, uncompressed.
fn modules(k: &Kernel) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for m in ["virtio_pci", "virtiofs"] {
        let text = output(Command::new("modprobe").arg("-d").arg(&k.root).args(["-S", &k.release, "--show-depends", m]))?;
        for line in text.lines() {
            let Some(path) = line.strip_prefix("insmod ").map(str::trim) else { continue };
            let file = Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let (name, data) = if let Some(stem) = file.strip_suffix(".xz") {
                (stem.to_string(), output_bytes(Command::new("xz").args(["-dc", path]))?)
            } else if let Some(stem) = file.strip_suffix(".zst") {
                (stem.to_string(), output_bytes(Command::new("zstd").args(["-dcq", path]))?)
            } else {
                (file.clone(), fs::read(path)?)
            };
            let name = format!("mods/{name}");
            if !files.iter().any(|(n, _)| *n == name) {
                files.push((name, data));
            }
        }
    }
    let order: String = files.iter().map(|(n, _)| format!("{}\n", n.trim_start_matches("mods/"))).collect();
    files.push(("mods/order".into(), order.into_bytes()));
    Ok(files)
}

fn output_bytes(c: &mut Command) -> Result<Vec<u8>> {
    let out = c.output()?;
    if !out.status.success() {
        bail!("{c:?} failed");
    }
    Ok(out.stdout)
}

/// The guest's script: its own mounts, the agent's programs as it reports
/// them, then each suite, results into `out`.
fn guest_script(root: &Path, k: &Kernel, out: &Path, agent: &Path, exes: &[(String, PathBuf)], opts: &Options) -> String {
    let mut s = String::new();
    // The guest's scratch directory: /tmp, a tmpfs of its own, unless the
    // repository is under /tmp (then /run).
    let tmp = if root.starts_with("/tmp") { "/run" } else { "/tmp" };
    let _ = writeln!(
        s,
        "set -u\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME={tmp} CI=1 TMPDIR={tmp} RUST_BACKTRACE=1"
    );
    let _ = writeln!(s, "export NODE_AGENT_TEST_BINARY={}", agent.display());
    s.push_str("mount -t proc proc /proc\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\nmkdir -p /dev/pts /dev/shm\nmount -t devpts devpts /dev/pts\nmount -t tmpfs tmpfs /dev/shm\n");
    // Writable places, but never over the repository (a clone under /tmp or /run).
    for d in ["/tmp", "/run", "/var/lib", "/var/log", "/var/cache"] {
        if !root.starts_with(d) {
            let _ = writeln!(s, "mount -t tmpfs tmpfs {d}");
        }
    }
    s.push_str("mount -t cgroup2 cgroup2 /sys/fs/cgroup\nmount -t bpf bpf /sys/fs/bpf\nmount -t tracefs tracefs /sys/kernel/tracing\nmount -t debugfs debugfs /sys/kernel/debug\n");
    // The kernel's modules stay where they were unpacked (the host may
    // have no /usr/lib/modules to mount them over): modprobe is pointed at
    // them, and so is the kernel's own module loading (`request_module`,
    // as `ip link add … type veth` or iptables' DNAT ask).
    let _ = writeln!(
        s,
        r#"printf '#!/bin/sh\nexec /usr/sbin/modprobe -d {root} "$@"\n' > {tmp}/modprobe
chmod +x {tmp}/modprobe
echo {tmp}/modprobe > /proc/sys/kernel/modprobe"#,
        root = k.root.display()
    );
    let _ = writeln!(s, "mount -t virtiofs out {}", out.display());
    // What the tests use that this kernel builds as modules (the host's
    // kernel may have them built in), and the controllers a kubelet's
    // hierarchy delegates.
    // /var/tmp on a disk of its own (ext4 on virtio-blk), where the block
    // I/O tests keep their loop devices' files: tmpfs takes no O_DIRECT
    // before Linux 6.6.
    if !root.starts_with("/var/tmp") {
        let _ = writeln!(s, "{tmp}/modprobe -q virtio_blk\nfor i in $(seq 50); do [ -b /dev/vda ] && break; sleep 0.1; done\nmount -t ext4 /dev/vda /var/tmp || mount -t tmpfs tmpfs /var/tmp");
    }
    let _ = writeln!(
        s,
        "for m in loop tun veth ip_tables iptable_nat iptable_filter nf_nat xt_nat xt_conntrack; do {tmp}/modprobe -q $m; done"
    );
    s.push_str("echo '+cpu +memory +io +pids' > /sys/fs/cgroup/cgroup.subtree_control\n");
    s.push_str("ip link set lo up\nhostname node-agent-vm\necho \"NODE_AGENT_VM up $(cut -d' ' -f1 /proc/uptime)\"\n");
    // The programs the agent loads with every probe on, as it reports them.
    let _ = writeln!(
        s,
        r#"{agent} --web.listen-address=127.0.0.1:19100 > {out}/agent.log 2>&1 &
a=$!
for i in $(seq 900); do
  if exec 3<>/dev/tcp/127.0.0.1/19100 2>/dev/null; then
    printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3 > {tmp}/metrics; exec 3<&-
    grep -q '^node_ebpf_program_up' {tmp}/metrics && break
  fi
  sleep 1
done
grep -E '^node_ebpf_program_(up|down_reason)' {tmp}/metrics > {out}/programs.txt
kill $a; wait $a 2>/dev/null
echo "NODE_AGENT_VM programs $(cut -d' ' -f1 /proc/uptime)""#,
        agent = agent.display(),
        out = out.display()
    );
    let _ = writeln!(s, "cd {}", root.join("tests").display());
    for (name, exe) in exes {
        let _ = writeln!(
            s,
            r#"t=$(cut -d' ' -f1 /proc/uptime)
{exe}{filters} --show-output --logfile {out}/{name}.results > {out}/{name}.out 2>&1
echo "{name} $? $t $(cut -d' ' -f1 /proc/uptime)" >> {out}/suites.txt
echo "NODE_AGENT_VM {name} done $(cut -d' ' -f1 /proc/uptime)""#,
            exe = exe.display(),
            out = out.display(),
            filters =
                if opts.all { String::new() } else { selected(name).iter().map(|t| format!(" {t}")).collect::<String>() + " --exact" },
        );
    }
    if let Some(bench) = &opts.bench {
        let _ = writeln!(
            s,
            "{} --kernel-costs {out}/costs.tsv > {out}/bench.out 2>&1\necho \"NODE_AGENT_VM bench $? $(cut -d' ' -f1 /proc/uptime)\"",
            bench.display(),
            out = out.display()
        );
    }
    s.push_str("sync\necho \"NODE_AGENT_VM end\"\necho o > /proc/sysrq-trigger\nsleep 10\n");
    s
}

/// The tests of `suite` in [`CI_TESTS`] (empty: all of them).
fn selected(suite: &str) -> &'static [&'static str] {
    CI_TESTS.iter().find(|(s, _)| *s == suite).map(|(_, t)| *t).unwrap_or(&[])
}

/// Boots `k` and runs the suites in it.
fn boot(root: &Path, work: &Path, k: &Kernel, accel: &str, agent: &Path, exes: &[(String, PathBuf)], opts: &Options) -> Result<Outcome> {
    let out = work.join("out").join(k.suite.series);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let initrd = work.join(k.suite.series).join("initramfs.cpio");
    initramfs(&initrd, INIT, &modules(k)?)?;
    let scratch = work.join(k.suite.series).join("scratch.img");
    let _ = fs::remove_file(&scratch);
    fs::File::create(&scratch)?.set_len(512 << 20)?;
    super::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&scratch))?;
    let script = work.join(k.suite.series).join("guest.sh");
    fs::write(&script, guest_script(root, k, &out, agent, exes, opts))?;
    let sock = |tag: &str| work.join(format!("{}-{tag}.sock", k.suite.series));
    let mut daemons = Vec::new();
    for (tag, dir) in [("root", Path::new("/")), ("out", out.as_path())] {
        let _ = fs::remove_file(sock(tag));
        let child = Command::new("/usr/lib/qemu/virtiofsd")
            .arg(format!("--socket-path={}", sock(tag).display()))
            .arg("-o")
            .arg(format!("source={}", dir.display()))
            .args(["-o", "cache=auto", "-o", "sandbox=chroot", "-o", "log_level=err"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting /usr/lib/qemu/virtiofsd (Debian's qemu-system-common)")?;
        daemons.push(Daemon(child));
    }
    let t = Instant::now();
    while !(sock("root").exists() && sock("out").exists()) {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("virtiofsd made no socket in 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mem = "3072";
    let mut c = Command::new("qemu-system-x86_64");
    if accel == "kvm" {
        c.args(["-accel", "kvm", "-cpu", "host"]);
    } else {
        // One host thread for both vCPUs: with a thread each (MTTCG), a
        // guest's live code patching (text_poke's int3, as a static key
        // flips when a cgroup program attaches) was seen to oops the guest
        // kernel ("Oops: int3" in sk_filter_trim_cap, 6.12 under qemu 7.2).
        c.args(["-accel", "tcg,thread=single", "-cpu", "max"]);
    }
    c.args(["-m", mem, "-smp", "2", "-nographic", "-no-reboot", "-kernel"])
        .arg(k.vmlinuz())
        .arg("-initrd")
        .arg(&initrd)
        .arg("-append")
        .arg(format!("console=ttyS0 panic=-1 quiet loglevel=3 node_agent.script={}", script.display()))
        .args(["-object", &format!("memory-backend-memfd,id=mem,size={mem}M,share=on"), "-numa", "node,memdev=mem"]);
    c.arg("-drive").arg(format!("file={},format=raw,if=virtio,cache=unsafe", scratch.display()));
    for tag in ["root", "out"] {
        c.args(["-chardev", &format!("socket,id={tag},path={}", sock(tag).display())]);
        c.args(["-device", &format!("vhost-user-fs-pci,chardev={tag},tag={tag}")]);
    }
    let console = run_for(&mut c, Duration::from_secs(GUEST_LIMIT_S))?;
    let total_s = t.elapsed().as_secs_f64();
    drop(daemons);
    let _ = fs::remove_file(&scratch);
    fs::write(out.join("console.log"), &console)?;
    let mut o = Outcome { accel: accel.to_string(), total_s, ..Outcome::default() };
    o.boot_s = console.lines().find_map(|l| l.split("NODE_AGENT_VM up ").nth(1)).and_then(|v| v.trim().parse().ok()).unwrap_or(f64::NAN);
    if !console.contains("NODE_AGENT_VM end") {
        o.trouble.push(format!("the guest did not finish (a crash, or over {GUEST_LIMIT_S} s): see {}", out.join("console.log").display()));
    }
    parse_programs(&fs::read_to_string(out.join("programs.txt")).unwrap_or_default(), &mut o.programs);
    if o.programs.is_empty() {
        o.trouble.push(format!("the agent reported no programs: see {}", out.join("agent.log").display()));
    }
    if opts.bench.is_some() && !out.join("costs.tsv").exists() {
        o.trouble.push(format!("the benchmark left no costs: see {}", out.join("bench.out").display()));
    }
    let suites = fs::read_to_string(out.join("suites.txt")).unwrap_or_default();
    for (name, _) in exes {
        let results = fs::read_to_string(out.join(format!("{name}.results"))).unwrap_or_default();
        let text = fs::read_to_string(out.join(format!("{name}.out"))).unwrap_or_default();
        let tests = parse_results(&results, &text);
        let line = suites.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()));
        let f: Vec<f64> = line.map(|l| l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect()).unwrap_or_default();
        if let [rc, start, end] = f[..] {
            o.suite_s.insert(name.clone(), end - start);
            if rc != 0.0 && !tests.values().any(|r| *r == TestResult::Failed) {
                o.trouble.push(format!("{name} exited with {rc} without a failed test: see {}", out.join(format!("{name}.out")).display()));
            }
        } else {
            o.trouble.push(format!("{name} did not run to its end"));
        }
        if !opts.all {
            for t in selected(name).iter().filter(|t| !tests.contains_key(**t)) {
                o.trouble.push(format!("{name}::{t} is in the CI set (kernels.rs CI_TESTS) but did not run: renamed?"));
            }
        }
        o.tests.insert(name.clone(), tests);
    }
    Ok(o)
}

/// BENCHMARKS.md's section on older kernels: each guest's costs (and the
/// host's, measured here natively, as the guests did) rendered by the
/// benchmark's binary.
fn bench_section(root: &Path, work: &Path, bench: &Path, kernels: &[Kernel], outcomes: &[Outcome]) -> Result<()> {
    let dir = work.join("costs");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    for (k, o) in kernels.iter().zip(outcomes) {
        let from = work.join("out").join(k.suite.series).join("costs.tsv");
        if from.exists() {
            fs::copy(&from, dir.join(format!("{}.{}.tsv", k.suite.series, o.accel)))?;
        }
    }
    super::run(Command::new(bench).arg("--kernel-costs").arg(dir.join("host.native.tsv")))?;
    super::run(Command::new(bench).arg("--kernels-section").arg(&dir).arg("--out").arg(root.join("BENCHMARKS.md")))?;
    eprintln!("xtask: BENCHMARKS.md's section on older kernels written");
    Ok(())
}

/// The longest a guest may run.
const GUEST_LIMIT_S: u64 = 3600;

/// A daemon killed with its owner.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `node_ebpf_program_up` and `…_down_reason` lines into program → reason.
fn parse_programs(text: &str, programs: &mut BTreeMap<String, Option<String>>) {
    let label = |l: &str, k: &str| l.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next()).map(str::to_string);
    for l in text.lines() {
        let Some(p) = label(l, "program") else { continue };
        if l.starts_with("node_ebpf_program_up{") {
            let up = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) == 1.0;
            programs.entry(p).or_insert(if up { None } else { Some("unknown".into()) });
        } else if l.starts_with("node_ebpf_program_down_reason{") && (l.ends_with(" 1") || l.ends_with(" 1.0")) {
            if let Some(r) = label(l, "reason") {
                programs.insert(p, Some(r));
            }
        }
    }
}

/// libtest's log file (`ok NAME`, `failed NAME`, `ignored NAME`) with the
/// skips read from each test's output (`SKIP: reason`, as the tests print
/// it) under `--show-output`.
fn parse_results(results: &str, output: &str) -> BTreeMap<String, TestResult> {
    let mut skips: BTreeMap<String, String> = BTreeMap::new();
    let mut current = None;
    for l in output.lines() {
        if let Some(name) = l.strip_prefix("---- ").and_then(|r| r.strip_suffix(" stdout ----")) {
            current = Some(name.to_string());
        } else if let (Some(t), Some(reason)) = (&current, l.split("SKIP: ").nth(1)) {
            // The kernel's release (`host::kernel_or_skip` names it) stays
            // out: Debian's next build of the series skips for the same reason.
            let reason = reason.split(" (this is ").next().unwrap_or(reason);
            skips.entry(t.clone()).or_insert_with(|| reason.trim().to_string());
        }
    }
    let mut tests = BTreeMap::new();
    for l in results.lines() {
        let (status, name) = l.split_once(' ').unwrap_or((l, ""));
        let r = match status {
            "ok" => skips.get(name).map(|r| TestResult::Skipped(r.clone())).unwrap_or(TestResult::Passed),
            "ignored" => TestResult::Skipped("ignored".into()),
            _ => TestResult::Failed,
        };
        tests.insert(name.to_string(), r);
    }
    tests
}

/// The host kernel's programs, the agent started here as in the guests.
fn host_programs(agent: &Path) -> Result<BTreeMap<String, Option<String>>> {
    let mut child =
        Daemon(Command::new(agent).arg("--web.listen-address=127.0.0.1:19109").stdout(Stdio::null()).stderr(Stdio::null()).spawn()?);
    let t = Instant::now();
    let mut programs = BTreeMap::new();
    while t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:19109") else { continue };
        use std::io::Write as _;
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        parse_programs(&text, &mut programs);
        if !programs.is_empty() {
            break;
        }
    }
    let _ = child.0.kill();
    Ok(programs)
}

fn uname_r() -> String {
    output(Command::new("uname").arg("-r")).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The heading of docs/kernels.md's last section, the run's own figures
/// (times, package versions), which a later run does not repeat exactly;
/// what comes before it must.
const RUN_HEADING: &str = "## The run this was written from";

/// docs/kernels.md.
fn render(kernels: &[Kernel], outcomes: &[Outcome], host: &BTreeMap<String, Option<String>>, tests: &[&str]) -> String {
    let mut s = String::new();
    s.push_str("# Kernel compatibility\n\nWritten by `cargo xtask kernels` from what its run saw, not typed by hand; `cargo xtask test` runs the same matrix and fails when what it sees differs from this page above its last section.\n\n");
    s.push_str("Each kernel is Debian's cloud kernel, fetched from Debian's registry by package name and booted under qemu with the host's root shared read-only (virtiofs). In each, the agent runs with every probe on, then the probes' truth suites run as on the host, each test counting only what it caused. How: [development.md](development.md#the-kernel-matrix).\n\n");
    let _ = writeln!(s, "| kernel | Debian suite | who runs it |\n|---|---|---|");
    for k in kernels {
        let _ = writeln!(s, "| {} | {} | {} |", k.suite.series, k.suite.name, k.suite.users);
    }
    s.push_str("| host | — | the machine the run was on |\n\n");
    s.push_str("## Programs\n\nWhether each eBPF program loads and attaches (`node_ebpf_program_up`), and why not where it does not (`node_ebpf_program_down_reason`: `verifier`, the kernel's verifier refused it; `kernel`, the kernel lacks the hook or a field the program needs).\n\n");
    let _ = write!(s, "| program |");
    for k in kernels {
        let _ = write!(s, " {} |", k.suite.series);
    }
    let _ = writeln!(s, " host |");
    let _ = writeln!(s, "|---|{}---|", "---|".repeat(kernels.len()));
    let mut names: Vec<&String> = outcomes.iter().flat_map(|o| o.programs.keys()).chain(host.keys()).collect();
    names.sort();
    names.dedup();
    let cell = |d: Option<&Option<String>>| match d {
        Some(None) => "up".to_string(),
        Some(Some(r)) => format!("**down** ({r})"),
        None => "—".to_string(),
    };
    for n in names {
        let _ = write!(s, "| `{n}` |");
        for o in outcomes {
            let _ = write!(s, " {} |", cell(o.programs.get(n)));
        }
        let _ = writeln!(s, " {} |", cell(host.get(n)));
    }
    s.push_str("\n## Truth tests\n\nThe tests `cargo xtask test` runs in each guest (`CI_TESTS` in xtask/src/kernels.rs: those whose outcome the kernel decides; `cargo xtask kernels --all` runs every test of each suite). On the host every test of every suite runs in the main suite.\n\n");
    let _ = write!(s, "| suite |");
    for k in kernels {
        let _ = write!(s, " {} |", k.suite.series);
    }
    let _ = writeln!(s, "\n|---|{}", "---|".repeat(kernels.len()));
    for t in tests {
        let _ = write!(s, "| `{t}` |");
        for o in outcomes {
            let r = o.tests.get(*t);
            let n = |f: &dyn Fn(&TestResult) -> bool| r.map(|m| m.values().filter(|x| f(x)).count()).unwrap_or(0);
            let (passed, skipped, failed) =
                (n(&|x| *x == TestResult::Passed), n(&|x| matches!(x, TestResult::Skipped(_))), n(&|x| *x == TestResult::Failed));
            let mut cell = format!("{passed} passed");
            if skipped > 0 {
                let _ = write!(cell, ", {skipped} skipped");
            }
            if failed > 0 {
                let _ = write!(cell, ", **{failed} failed**");
            }
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    let mut notes = String::new();
    for (k, o) in kernels.iter().zip(outcomes) {
        for (suite, results) in &o.tests {
            for (test, r) in results {
                match r {
                    TestResult::Skipped(why) => {
                        let _ = writeln!(notes, "| {} | `{suite}::{test}` | skipped: {why} |", k.suite.series);
                    }
                    TestResult::Failed => {
                        let _ = writeln!(notes, "| {} | `{suite}::{test}` | **failed** |", k.suite.series);
                    }
                    TestResult::Passed => {}
                }
            }
        }
    }
    if !notes.is_empty() {
        s.push_str("\nThe tests that did not pass:\n\n| kernel | test | result |\n|---|---|---|\n");
        s.push_str(&notes);
    }
    let _ = writeln!(s, "\n{RUN_HEADING}\n");
    let _ = writeln!(s, "| kernel | package | accelerator | boot | programs | suites | whole run |\n|---|---|---|---|---|---|---|");
    for (k, o) in kernels.iter().zip(outcomes) {
        let suites: Vec<String> = o.suite_s.iter().map(|(n, t)| format!("{n} {t:.0} s")).collect();
        let _ = writeln!(
            s,
            "| {} | linux-image-{} {} | {} | {:.1} s | {} up of {} | {} | {:.0} s |",
            k.suite.series,
            k.release,
            k.version,
            o.accel,
            o.boot_s,
            o.programs.values().filter(|d| d.is_none()).count(),
            o.programs.len(),
            suites.join(", "),
            o.total_s
        );
    }
    let _ =
        writeln!(s, "| host | {} | — | — | {} up of {} | — | — |", uname_r(), host.values().filter(|d| d.is_none()).count(), host.len());
    s
}

/// What `fresh` (a run's docs/kernels.md) says that `committed` does not,
/// above the run's own section; None when they agree.
pub fn differs(committed: &str, fresh: &str) -> Option<String> {
    let head = |t: &str| t.split(RUN_HEADING).next().unwrap_or_default().to_string();
    let (a, b) = (head(committed), head(fresh));
    if a == b {
        return None;
    }
    let old: Vec<&str> = a.lines().collect();
    let new: Vec<&str> = b.lines().collect();
    let mut d = String::new();
    for l in old.iter().filter(|l| !new.contains(l)) {
        let _ = writeln!(d, "- {l}");
    }
    for l in new.iter().filter(|l| !old.contains(l)) {
        let _ = writeln!(d, "+ {l}");
    }
    Some(d)
}
