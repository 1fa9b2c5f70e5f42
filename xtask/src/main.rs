//! Development commands: `cargo xtask <command>`.
//!
//! - `run [-- FLAGS]`: set up what the agent needs and run it (release build).
//! - `test`: set up what the test suite needs and run it.
//! - `compare-node-exporter`: node-agent beside Debian's node_exporter on this
//!   machine; prints family and stable-value differences.
//! - `setup`: install the apt packages the suite needs, idempotently.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

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
}

/// Debian packages the test suite uses: promtool and the peer exporter.
const TEST_PACKAGES: &[&str] = &["prometheus", "prometheus-node-exporter"];

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
    apt(&args)
}

fn setup() -> Result<()> {
    apt_install(TEST_PACKAGES)
}

fn build_release() -> Result<PathBuf> {
    run(Command::new(cargo()).current_dir(root()).args(["build", "--release", "-p", "node-agent"]))?;
    Ok(root().join("target/release/node-agent"))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_and_wait(bin: &Path, flags: &[String], url: &str) -> Result<Kill> {
    let child = Command::new(bin)
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let k = Kill(child);
    let start = Instant::now();
    while node_agent_tests::compare::http_get(url).is_err() {
        if start.elapsed() > Duration::from_secs(15) {
            bail!("{} did not answer on {url}", bin.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(k)
}

fn compare_node_exporter() -> Result<bool> {
    use node_agent_tests::compare;
    setup()?;
    let agent = build_release()?;
    let ne = compare::which("prometheus-node-exporter").context("prometheus-node-exporter not on PATH")?;
    let (pa, pn) = (free_port()?, free_port()?);
    let common: Vec<String> = compare::COMMON_FLAGS.iter().map(|s| s.to_string()).collect();
    let mut fa = vec![format!("--web.listen-address=127.0.0.1:{pa}")];
    fa.extend(common.clone());
    let mut fne = vec![format!("--web.listen-address=127.0.0.1:{pn}")];
    fne.extend(common);
    let (ua, un) = (format!("http://127.0.0.1:{pa}/metrics"), format!("http://127.0.0.1:{pn}/metrics"));
    let _a = spawn_and_wait(&agent, &fa, &ua)?;
    let _n = spawn_and_wait(&ne, &fne, &un)?;
    let ours = compare::http_get(&ua).map_err(anyhow::Error::msg)?;
    let theirs = compare::http_get(&un).map_err(anyhow::Error::msg)?;
    let report = compare::compare(&ours, &theirs)?;
    print!("{}", report.render());
    if let Some(promtool) = compare::which("promtool") {
        let extra = compare::promtool_extra(&compare::promtool_check(&promtool, &ours)?, &compare::promtool_check(&promtool, &theirs)?);
        println!("promtool check metrics: {} complaint(s) about node-agent beyond node_exporter's", extra.len());
        for l in &extra {
            println!("  {l}");
        }
        return Ok(report.ok() && extra.is_empty());
    }
    Ok(report.ok())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Setup => setup().map(|_| true),
        Cmd::Run { flags } => setup().and_then(|_| build_release()).and_then(|bin| {
            let mut c = Command::new(bin);
            c.args(flags);
            run(&mut c).map(|_| true)
        }),
        Cmd::Test { args } => setup().and_then(|_| {
            let mut c = Command::new(cargo());
            c.current_dir(root()).args(["test", "--workspace"]).args(args);
            run(&mut c).map(|_| true)
        }),
        Cmd::CompareNodeExporter => compare_node_exporter(),
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
