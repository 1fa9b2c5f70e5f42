//! Development commands: `cargo xtask <command>`.
//!
//! - `setup`: install what building, running and testing need (idempotent).
//! - `build-ebpf`: install the eBPF toolchain and build `agent-ebpf`.
//! - `run [-- FLAGS]`: set up, build in release mode and run the agent.
//! - `test`: set up, check formatting and lints (rustfmt, clippy with
//!   warnings denied, on every crate), build the container image (`image`),
//!   run the whole test suite (the image tests run that image under podman),
//!   then fuzz with AFL++ for a minute and run the kernel matrix (`kernels`).
//! - `compare-node-exporter`: node-agent beside Debian's node_exporter on this
//!   machine; prints family and stable-value differences.
//! - `manifests`: write deploy/ from the code.
//! - `docs`: write docs/reference/ from the code and the man page,
//!   target/man/node-agent.1 (`docs.rs`).
//! - `fuzz [--seconds N] [--seed S] [--afl]`: mutation-fuzz the collectors' parsers; with
//!   `--afl`, coverage-guided with AFL++ (afl.rs on stable Rust; harness in fuzz/).
//! - `image [--twice] [--refresh]`: build the container image with Debian's
//!   podman and runc from Debian's packages, pulling no image (`image.rs`).
//! - `seccomp-profile`: write deploy/seccomp/node-agent.json from the
//!   runtime's default profile (`seccomp.rs`).
//! - `truth-loop [--runs N]`: the eBPF, netlink, perf, pod attribution,
//!   TCP peers, DNS and pod lifecycle truth suites N times in a row (50 by default) while a build runs beside
//!   them; fails unless every run passes.
//! - `kernels [--kernel SERIES] [--test SUITE] [--all]`: the probes' truth
//!   suites on Debian's 5.10, 6.1 and 6.12 kernels under qemu; writes
//!   docs/kernels.md (`kernels.rs`). `test` runs it too and fails when it
//!   sees what docs/kernels.md does not say.
//! - `pgo`: rewrite the release build's PGO profile, `pgo/node-agent.profdata`
//!   (an instrumented build under `pgo/train.sh`; see `pgo.rs`).
//!
//! xtask depends on no workspace crate, so it builds on a machine that does
//! not have the eBPF toolchain yet.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod docs;
mod image;
mod kernels;
mod pgo;
mod seccomp;

#[derive(Parser)]
#[command(name = "xtask", about = "node-agent development commands")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building, running and testing need (idempotent).
    Setup,
    /// Set up, build in release mode and run node-agent with FLAGS.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        flags: Vec<String>,
    },
    /// Set up and run the whole test suite.
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run node-agent and Debian's node_exporter side by side and compare.
    CompareNodeExporter,
    /// Install the eBPF toolchain (idempotent) and build the eBPF programs.
    BuildEbpf,
    /// Benchmark node-agent beside node_exporter, the eBPF probes and the
    /// planner; writes BENCHMARKS.md.
    Bench {
        /// Short runs (for a quick look; the numbers are noisier).
        #[arg(long)]
        quick: bool,
        /// Rewrite only BENCHMARKS.md's Image section, from the last
        /// `cargo xtask image` (its target/image/build.json).
        #[arg(long)]
        image_only: bool,
        /// Only the cost as the node grows (network devices, mounts, pods), printed
        /// rather than written to BENCHMARKS.md.
        #[arg(long)]
        growth: bool,
        /// Only BENCHMARKS.md's "Under a real kubelet" section: deploy/ on a
        /// one-node cluster (kubelet, containerd) with the image built from
        /// this tree.
        #[arg(long)]
        kubelet: bool,
    },
    /// Mutation-fuzz every collector's parser for N seconds (stable Rust:
    /// cargo-fuzz needs nightly); with --afl, coverage-guided with AFL++.
    Fuzz {
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        #[arg(long)]
        seed: Option<u64>,
        /// Coverage-guided, with AFL++ (afl.rs) instead of the mutation fuzzer.
        #[arg(long)]
        afl: bool,
    },
    /// Write deploy/ from the code (a test fails when the committed files differ).
    Manifests,
    /// Write docs/reference/ from the code (a test fails when the committed
    /// files differ) and the man page, target/man/node-agent.1.
    Docs,
    /// Run the truth suites (eBPF, netlink, perf, pod attribution, TCP peers, DNS, pod lifecycle) RUNS
    /// times in a row while a build runs beside them: exact under load.
    TruthLoop {
        #[arg(long, default_value_t = 50)]
        runs: usize,
    },
    /// The probes' truth suites on Debian's 5.10, 6.1 and 6.12 kernels under
    /// qemu (`kernels.rs`); writes docs/kernels.md.
    Kernels {
        /// Only this kernel series (5.10, 6.1, 6.12); repeatable. A partial run
        /// leaves docs/kernels.md alone.
        #[arg(long = "kernel")]
        only: Vec<String>,
        /// Only this test suite; repeatable.
        #[arg(long = "test")]
        tests: Vec<String>,
        /// Every test of each suite, not only those `cargo xtask test` runs
        /// in the guests (kernels.rs CI_TESTS); leaves docs/kernels.md alone.
        #[arg(long)]
        all: bool,
        /// Instead of the suites, measure every probe's cost per event in
        /// each kernel (and natively on the host's) and rewrite BENCHMARKS.md's
        /// section on older kernels.
        #[arg(long)]
        bench: bool,
    },
    /// Rewrite the release build's PGO profile (pgo/node-agent.profdata): an
    /// instrumented build run under pgo/train.sh (the benchmark's workload).
    Pgo,
    /// Write deploy/seccomp/node-agent.json: the runtime's default seccomp
    /// profile (containers-common's, installed with podman) plus bpf and
    /// perf_event_open.
    SeccompProfile,
    /// Build the container image with podman, from Debian's packages
    /// (no image is pulled).
    Image {
        /// The image reference [default: the one the manifests name].
        #[arg(long)]
        tag: Option<String>,
        /// Build a second time from nothing and fail unless the image ID
        /// and digest are the same.
        #[arg(long)]
        twice: bool,
        /// Make the Debian bases again (to take Debian's updates).
        #[arg(long)]
        refresh: bool,
    },
}

/// Debian packages the test suite uses: promtool, the peer exporter,
/// losetup/ip for the eBPF truth tests, taskset and python3 for the pod
/// attribution workloads, the venv of the manifest validators, and a C
/// compiler and make for building AFL++ (cargo-afl).
const TEST_PACKAGES: &[&str] = &[
    "prometheus",
    "prometheus-node-exporter",
    "mount",
    "iproute2",
    // The Service's DNAT rule (kube-proxy's iptables mode) in the TCP peers
    // truth test.
    "iptables",
    "wrk",
    "util-linux",
    "python3",
    "python3-venv",
    "gcc",
    "make",
    // Real peers of the systemd, logind, supervisord, runit, ntp and
    // ethtool collectors' tests.
    "dbus",
    "python3-dbusmock",
    "supervisor",
    "runit",
    "chrony",
    "ethtool",
    // The peer of the eBPF probes' per-event cost in `cargo xtask bench`.
    "bpftrace",
    // The image, built and run as a kubelet runs it (`cargo xtask image`,
    // tests/tests/image.rs), and the runtime default seccomp profile.
    "podman",
    "runc",
    "mmdebstrap",
    // The node of the real-kubelet test (tests/src/kubelet.rs): Debian's
    // containerd 1.6 beside runc, and the CNI plugins (podman wants them too).
    "containerd",
    "containernetworking-plugins",
];

/// The offline eBPF toolchain (docs/development.md, "The offline eBPF toolchain"):
/// Debian's rustc-web with a prebuilt `core` for bpfel-unknown-none, and the
/// LLVM bpf-linker links against.
const EBPF_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf", "llvm-22-dev"];
/// Clippy for the eBPF crate: Debian's, of the same rustc-web.
const EBPF_LINT_PACKAGES: &[&str] = &["rust-web-clippy"];

/// The workspaces: the host one, the eBPF crate's and the AFL++ harness's.
const WORKSPACES: &[&str] = &["Cargo.toml", "crates/agent-ebpf/Cargo.toml", "fuzz/Cargo.toml"];

/// Downloads every crate of every workspace, for every target. `cargo deny
/// --offline` reads the whole graph (windows-sys, android crates, fuzz/'s
/// afl), which a Linux build never downloads, so a fresh machine needs this.
fn fetch_all() -> Result<()> {
    for w in WORKSPACES {
        run(Command::new(cargo()).current_dir(root()).args(["fetch", "--quiet", "--manifest-path", w]))?;
    }
    Ok(())
}

/// rustfmt on every crate (rustfmt.toml), and clippy with warnings denied:
/// the host workspace with every target, the agent's build without the
/// cluster commands, the eBPF crate for its own target.
fn lint() -> Result<()> {
    for w in WORKSPACES {
        let mut c = Command::new(cargo());
        c.current_dir(root()).args(["fmt", "--all", "--check", "--manifest-path", w]);
        run(&mut c).map_err(|e| anyhow::anyhow!("{e}: run `cargo fmt --all --manifest-path {w}`"))?;
    }
    run(Command::new(cargo()).current_dir(root()).args(["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"]))?;
    // The agent image's build: node-agent without the cluster commands.
    run(Command::new(cargo()).current_dir(root()).args([
        "clippy",
        "-p",
        "node-agent",
        "--no-default-features",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(Command::new("bash").arg(root().join("crates/agent-ebpf/build.sh")).arg(root().join("target/ebpf-clippy")).arg("").arg("clippy"))
}
const BPF_LINKER_VERSION: &str = "0.13.0";

/// cargo-deny, for the supply-chain test (licenses, bans, sources).
const CARGO_DENY_VERSION: &str = "0.20.2";

fn setup_cargo_deny() -> Result<()> {
    setup_cargo_tool("cargo-deny", "deny", CARGO_DENY_VERSION)
}

/// afl.rs: AFL++ for Rust on a stable compiler (installing it builds AFL++).
const CARGO_AFL_VERSION: &str = "0.18.2";
/// How long `cargo xtask test` runs afl-fuzz.
const AFL_CI_SECONDS: u64 = 60;

fn setup_cargo_afl() -> Result<()> {
    setup_cargo_tool("cargo-afl", "afl", CARGO_AFL_VERSION)
}

/// Installs a cargo subcommand at a pinned version unless it is there.
fn setup_cargo_tool(krate: &str, subcommand: &str, version: &str) -> Result<()> {
    let ok = Command::new(cargo())
        .args([subcommand, "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(version))
        .unwrap_or(false);
    if ok {
        return Ok(());
    }
    eprintln!("xtask: installing {krate} {version} (a few minutes)");
    run(Command::new(cargo()).args(["install", krate, "--version", version, "--locked"]))
}

/// Coverage-guided fuzzing with AFL++ for `seconds`: builds the
/// instrumented harness (fuzz/), seeds it from the fixture tree, runs
/// afl-fuzz, and fails on any crash or hang it saved.
fn fuzz_afl(seconds: u64) -> Result<()> {
    setup_ebpf()?;
    setup_cargo_afl()?;
    let target = root().join("target/afl");
    let mut build = Command::new(cargo());
    build.current_dir(root().join("fuzz")).args(["afl", "build", "--release", "--target-dir"]).arg(&target);
    run(&mut build)?;
    let harness = target.join("release/node-agent-afl");
    let (seeds, out, tree) = (target.join("seeds"), target.join("out"), target.join("tree"));
    for d in [&seeds, &out, &tree] {
        let _ = std::fs::remove_dir_all(d);
    }
    run(Command::new(&harness).arg("--seeds").arg(&seeds).env("NODE_AGENT_AFL_TREE", &tree))?;
    let mut afl = Command::new(cargo());
    afl.current_dir(root())
        .args(["afl", "fuzz", "-i"])
        .arg(&seeds)
        .arg("-o")
        .arg(&out)
        .args(["-V", &seconds.to_string(), "-t", "5000"])
        .arg(&harness)
        .env("NODE_AGENT_AFL_TREE", &tree)
        .env("AFL_NO_UI", "1")
        .env("AFL_SKIP_CPUFREQ", "1")
        .env("AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES", "1")
        .stdout(Stdio::null());
    run(&mut afl)?;
    let stats =
        std::fs::read_to_string(out.join("default/fuzzer_stats")).map_err(|e| anyhow::anyhow!("afl-fuzz left no statistics: {e}"))?;
    let stat = |k: &str| {
        stats.lines().find_map(|l| l.split_once(':').filter(|(n, _)| n.trim() == k).map(|(_, v)| v.trim().to_string())).unwrap_or_default()
    };
    eprintln!(
        "xtask: afl-fuzz {seconds}s: {} executions, {} corpus entries ({} found), edges {}, {} crashes, {} hangs",
        stat("execs_done"),
        stat("corpus_count"),
        stat("corpus_found"),
        stat("bitmap_cvg"),
        stat("saved_crashes"),
        stat("saved_hangs")
    );
    if stat("saved_crashes") != "0" || stat("saved_hangs") != "0" {
        anyhow::bail!("afl-fuzz found crashes or hangs: see {}/default/crashes and hangs (each file is an input: 2 bytes of file index, then the content)", out.display());
    }
    Ok(())
}

/// PyPI tools the manifest tests use, in a venv under target/tools: the
/// official Kubernetes schemas, and prometheus-operator's CRD models.
const PY_TOOLS: &[&str] = &["kubernetes-validate==1.37.0", "cloudcoil-models-prometheus-operator==0.80.1.0"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs missing Debian packages; does nothing when all are present.
fn apt_install(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let apt = |args: &[&str]| {
        let mut c = Command::new("apt-get");
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run(&mut c)
    };
    apt(&["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    // The packages' services (node_exporter on :9100, a Prometheus server)
    // must not start: the suite runs its own, and :9100 is node-agent's.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists() && std::fs::write(policy, "#!/bin/sh\nexit 101\n").is_ok();
    if ours {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755));
    }
    let res = apt(&args);
    if ours {
        let _ = std::fs::remove_file(policy);
    }
    res
}

fn bpf_linker_ok() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false)
}

/// Installs the eBPF toolchain when any piece is missing.
fn setup_ebpf() -> Result<()> {
    apt_install(EBPF_PACKAGES)?;
    if !bpf_linker_ok() {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        run(Command::new("/usr/bin/cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
                "--root",
                "/usr/local",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .env_remove("RUSTC")
            .env_remove("RUSTUP_TOOLCHAIN"))?;
    }
    Ok(())
}

/// The venv with PY_TOOLS; created or completed only when something is missing.
fn setup_python() -> Result<()> {
    let venv = root().join("target/tools/venv");
    let python = venv.join("bin/python");
    let check = || {
        Command::new(&python)
            .args(["-c", "import kubernetes_validate, cloudcoil.models.prometheus_operator"])
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if check() && pip_pinned(&python) {
        return Ok(());
    }
    eprintln!("xtask: installing {} into {}", PY_TOOLS.join(" "), venv.display());
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(PY_TOOLS))
}

fn pip_pinned(python: &Path) -> bool {
    let out = Command::new(python).args(["-m", "pip", "freeze", "--disable-pip-version-check"]).output();
    let Ok(out) = out else { return false };
    // pip spells names variously (`cloudcoil.models.prometheus_operator`): compare normalized.
    let norm = |s: &str| s.to_lowercase().replace(['.', '_'], "-");
    let text = norm(&String::from_utf8_lossy(&out.stdout));
    PY_TOOLS.iter().all(|p| text.lines().any(|l| l == norm(p)))
}

fn setup() -> Result<()> {
    setup_ebpf()?;
    apt_install(TEST_PACKAGES)?;
    apt_install(EBPF_LINT_PACKAGES)?;
    apt_install(kernels::PACKAGES)?;
    fetch_all()?;
    setup_python()?;
    setup_cargo_deny()?;
    setup_cargo_afl()?;
    // kustomize, as `kubectl kustomize`: machines of this kind carry kubectl
    // (with kustomize v5) in their image; Debian has no kustomize v5 to install.
    let ok = Command::new("kubectl")
        .args(["kustomize", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("xtask: warning: the deploy tests need `kubectl kustomize` (kubectl with kustomize v5) on PATH, and none is installed; they will fail in CI");
    }
    Ok(())
}

fn build_ebpf() -> Result<()> {
    setup_ebpf()?;
    let target = root().join("target/ebpf");
    run(Command::new("bash").arg(root().join("crates/agent-ebpf/build.sh")).arg(&target))?;
    eprintln!("xtask: eBPF programs at {}", target.join("bpfel-unknown-none/release/agent-ebpf").display());
    Ok(())
}

/// The release build, with the committed PGO profile (see `pgo.rs`): the
/// agent's binary, as its image has it (without the cluster commands), and
/// whether the profile went into it.
fn build_release() -> Result<(PathBuf, bool)> {
    // The image's toolchain, which the profile was trained with (xtask/src/pgo.rs).
    let mut c = pgo::image_cargo(&root());
    c.args(["build", "--release", "-p", "node-agent", "--no-default-features"]);
    let flags = pgo::use_flags(&root());
    let pgo = flags.is_some();
    c.env("CARGO_ENCODED_RUSTFLAGS", flags.unwrap_or_else(|| pgo::RELR_ARG.to_string()));
    run(&mut c)?;
    Ok((root().join("target/release/node-agent"), pgo))
}

/// The truth suites that check probes and collectors against the kernel.
const TRUTH_SUITES: &[&str] =
    &["ebpf_truth", "netlink_truth", "perf_truth", "pod_attribution", "tcp_peers_truth", "dns_truth", "peers_lifecycle_truth"];

/// Runs the truth suites `runs` times in a row, each run all of them, while
/// a debug build of two workspace crates is built and cleaned over and over
/// in a target directory of its own (the load of a parallel build, without
/// holding the suites' build lock). Ok(false) unless every run passed.
fn truth_loop(runs: usize) -> Result<bool> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut args = vec!["test", "-q", "-p", "node-agent-tests"];
    for s in TRUTH_SUITES {
        args.extend(["--test", s]);
    }
    // Built once before the load starts.
    let mut build = Command::new(cargo());
    build.current_dir(root()).env("CI", "1").args(&args).arg("--no-run");
    run(&mut build)?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = Arc::clone(&stop);
        let dir = root().join("target/truth-load");
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for step in [&["build", "-q", "-p", "node-agent-planner", "-p", "node-agent-expo"][..], &["clean", "-q"][..]] {
                    let spawned = Command::new(cargo())
                        .current_dir(root())
                        .args(step)
                        .arg("--target-dir")
                        .arg(&dir)
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn();
                    let Ok(mut c) = spawned else { return };
                    // The build runs until it ends or the loop is over.
                    while let Ok(None) = c.try_wait() {
                        if stop.load(Ordering::Relaxed) {
                            let _ = c.kill();
                            let _ = c.wait();
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                }
            }
        })
    };
    let mut failed = Vec::new();
    for i in 1..=runs {
        let t = std::time::Instant::now();
        let mut c = Command::new(cargo());
        c.current_dir(root()).env("CI", "1").args(&args);
        let ok = c.status().map(|s| s.success()).unwrap_or(false);
        let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        eprintln!(
            "xtask: truth run {i}/{runs}: {} in {:.0} s (load average {})",
            if ok { "passed" } else { "FAILED" },
            t.elapsed().as_secs_f64(),
            load_avg.split_whitespace().next().unwrap_or("?")
        );
        if !ok {
            failed.push(i);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = load.join();
    eprintln!("xtask: {} of {runs} consecutive truth runs passed beside a build; failed: {failed:?}", runs - failed.len());
    Ok(failed.is_empty())
}

/// Builds a node-agent-tests binary in the bench-tool profile (as [`tool`]
/// runs it); its path.
fn build_tool(bin: &str) -> Result<PathBuf> {
    run(Command::new(cargo()).current_dir(root()).args([
        "build",
        "--profile",
        "bench-tool",
        "-q",
        "-p",
        "node-agent-tests",
        "--bin",
        bin,
    ]))?;
    Ok(root().join("target/bench-tool").join(bin))
}

/// `cargo run` of a node-agent-tests binary (the benchmark, the fuzzer)
/// in the bench-tool profile, its own arguments to follow.
fn tool(bin: &str) -> Command {
    let mut c = Command::new(cargo());
    c.current_dir(root()).args(["run", "--profile", "bench-tool", "-q", "-p", "node-agent-tests", "--bin", bin, "--"]);
    c
}

fn cargo_test(args: &[&str]) -> Result<()> {
    let mut c = Command::new(cargo());
    c.current_dir(root()).arg("test").args(args);
    run(&mut c)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Setup => setup().map(|_| true),
        Cmd::BuildEbpf => build_ebpf().map(|_| true),
        Cmd::Run { flags } => setup_ebpf().and_then(|_| build_release()).and_then(|(bin, _)| {
            let mut c = Command::new(bin);
            c.args(flags);
            run(&mut c).map(|_| true)
        }),
        Cmd::Test { args } => setup().and_then(|_| {
            // A CI machine builds once from a clean clone: incremental
            // state (~3 GB for the suite) would only take disk.
            if std::env::var_os("CI").is_some() {
                std::env::set_var("CARGO_INCREMENTAL", "0");
            }
            let mut all = vec!["--workspace"];
            all.extend(args.iter().map(String::as_str));
            if args.is_empty() {
                lint()?;
                // The image tests (tests/tests/image.rs, real_kubelet.rs) run
                // the image built from this tree; a subset run uses the image
                // podman holds. The image's release build ends in one
                // single-threaded link (fat LTO): the test binaries build
                // meanwhile, on the other core.
                let t = std::time::Instant::now();
                let image = std::thread::spawn(|| {
                    let t = std::time::Instant::now();
                    let r = image::build(&root(), &image::Options { tag: image::default_tag(), twice: false, refresh: false });
                    eprintln!("xtask: the image built in {:.0} s", t.elapsed().as_secs_f64());
                    r
                });
                let mut no_run = all.clone();
                no_run.push("--no-run");
                let tests = cargo_test(&no_run);
                eprintln!("xtask: the test binaries built in {:.0} s", t.elapsed().as_secs_f64());
                let built = image.join().map_err(|_| anyhow::anyhow!("the image build panicked"))??;
                tests?;
                eprintln!("xtask: image and test binaries ready in {:.0} s", t.elapsed().as_secs_f64());
                std::env::set_var("NODE_AGENT_IMAGE", &built.tag);
                if std::env::var_os("CI").is_some() {
                    image::free_build_space(&root());
                }
            }
            cargo_test(&all)?;
            // The whole suite also fuzzes, coverage-guided, for a bounded
            // time, and runs the probes' truth tests on the kernels users
            // run (kernels.rs).
            if args.is_empty() {
                fuzz_afl(AFL_CI_SECONDS)?;
                let opts = kernels::Options { only: vec![], tests: vec![], table: kernels::Table::Check, all: false, bench: None };
                return kernels::run(&root(), &cargo(), &opts);
            }
            Ok(true)
        }),
        // The side-by-side test prints the full report.
        Cmd::Bench { quick: _, image_only: true, .. } => {
            let mut c = tool("node-agent-bench");
            c.args(["--image-only", "--out"]).arg(root().join("BENCHMARKS.md"));
            run(&mut c).map(|_| true)
        }
        Cmd::Bench { kubelet: true, .. } => setup().and_then(|_| {
            let built = image::build(&root(), &image::Options { tag: image::default_tag(), twice: false, refresh: false })?;
            let mut c = tool("node-agent-bench");
            c.args(["--kubelet", &built.tag, "--out"]).arg(root().join("BENCHMARKS.md"));
            run(&mut c).map(|_| true)
        }),
        Cmd::Bench { quick, image_only: false, growth, kubelet: false } => {
            setup().and_then(|_| build_release()).and_then(|(agent, pgo)| {
                let mut c = tool("node-agent-bench");
                c.arg("--agent").arg(&agent);
                if pgo {
                    c.arg("--pgo");
                }
                if growth {
                    c.args(["--only", "growth"]);
                } else {
                    c.arg("--out").arg(root().join("BENCHMARKS.md"));
                }
                if quick {
                    c.arg("--quick");
                }
                run(&mut c).map(|_| true)
            })
        }
        Cmd::Fuzz { seconds, afl: true, .. } => fuzz_afl(seconds).map(|_| true),
        Cmd::Fuzz { seconds, seed, afl: false } => setup_ebpf().and_then(|_| {
            let mut c = tool("node-agent-fuzz");
            c.args(["--seconds", &seconds.to_string()]);
            if let Some(s) = seed {
                c.args(["--seed", &s.to_string()]);
            }
            run(&mut c).map(|_| true)
        }),
        Cmd::TruthLoop { runs } => setup().and_then(|_| truth_loop(runs)),
        Cmd::Kernels { only, tests, all, bench } => setup().and_then(|_| {
            let table = if only.is_empty() && tests.is_empty() && !all && !bench { kernels::Table::Write } else { kernels::Table::Leave };
            let bench = if bench { Some(build_tool("node-agent-bench")?) } else { None };
            kernels::run(&root(), &cargo(), &kernels::Options { only, tests, table, all, bench })
        }),
        Cmd::Pgo => setup().and_then(|_| pgo::generate(&root())).map(|_| true),
        Cmd::Manifests => setup_ebpf().and_then(|_| {
            let mut c = Command::new(cargo());
            c.current_dir(root()).args(["run", "-q", "-p", "node-agent", "--", "manifests", "--root"]).arg(root());
            run(&mut c).map(|_| true)
        }),
        Cmd::Docs => setup_ebpf().and_then(|_| docs::write(&root(), &cargo())).map(|man| {
            eprintln!("xtask: {} and {} written", docs::GENERATED.join(", "), man.display());
            true
        }),
        Cmd::Image { tag, twice, refresh } => {
            image::build(&root(), &image::Options { tag: tag.unwrap_or_else(image::default_tag), twice, refresh }).map(|_| true)
        }
        Cmd::SeccompProfile => apt_install(&["podman"]).and_then(|_| seccomp::write(&root())).map(|changed| {
            eprintln!("xtask: {} {}", seccomp::PROFILE, if changed { "written" } else { "unchanged" });
            true
        }),
        Cmd::CompareNodeExporter => {
            setup().and_then(|_| cargo_test(&["-p", "node-agent-tests", "--test", "side_by_side", "--", "--nocapture"])).map(|_| true)
        }
    };
    match res {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
