//! Builds and embeds the eBPF programs, and records the git revision and
//! rustc version for `node_agent_build_info`.
//!
//! The agent is built with its eBPF programs: when the eBPF toolchain is
//! missing the build fails with a message naming `cargo xtask build-ebpf`,
//! which installs it. `NODE_AGENT_SKIP_EBPF=1` (in the spirit of aya-build's
//! `AYA_BUILD_SKIP`) builds without them: no programs are embedded and every
//! probe reports `node_ebpf_program_up 0` with the reason. CI keeps the
//! strict build.

use std::path::PathBuf;
use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    // The image build has no .git: it passes the revision in.
    let rev = std::env::var("NODE_AGENT_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| output("git", &["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version =
        output(&rustc, &["--version"]).and_then(|v| v.split_whitespace().nth(1).map(str::to_string)).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=NODE_AGENT_REVISION={rev}");
    println!("cargo:rustc-env=NODE_AGENT_RUSTC={version}");
    // Whether this build is profile-guided (the release builds of `cargo
    // xtask run`, `bench` and the image): rustc's own flags say so.
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let pgo = flags.split('\x1f').any(|f| f.starts_with("-Cprofile-use="));
    println!("cargo:rustc-env=NODE_AGENT_PGO={pgo}");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs");
    println!("cargo:rerun-if-env-changed=NODE_AGENT_SKIP_EBPF");
    println!("cargo:rerun-if-env-changed=NODE_AGENT_REVISION");

    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("agent-ebpf.o");
    if std::env::var("NODE_AGENT_SKIP_EBPF").is_ok_and(|v| v == "1") {
        println!("cargo:warning=NODE_AGENT_SKIP_EBPF=1: building without eBPF programs; every probe will report node_ebpf_program_up 0");
        if let Err(e) = std::fs::write(&out, b"") {
            panic!("writing {}: {e}", out.display());
        }
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let crates = manifest.parent().map(PathBuf::from).unwrap_or_default();
    let root = crates.parent().map(PathBuf::from).unwrap_or_default();
    for p in [
        "agent-ebpf/src",
        "agent-ebpf/Cargo.toml",
        "agent-ebpf/Cargo.lock",
        "agent-ebpf/build.sh",
        "agent-common/src",
        "agent-common/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", crates.join(p).display());
    }
    let target_dir = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target")).join("ebpf");
    let status = Command::new("bash").arg(crates.join("agent-ebpf/build.sh")).arg(&target_dir).env_remove("CARGO_TARGET_DIR").status();
    let object = target_dir.join("bpfel-unknown-none/release/agent-ebpf");
    match status {
        Ok(s) if s.success() && object.is_file() => {}
        _ => panic!(
            "\n\nnode-agent: building the eBPF programs failed (see above).\n\
             Run `cargo xtask build-ebpf`: it installs the eBPF toolchain (Debian rustc-web, \
             libstd-rust-web-dev-bpf, llvm-22-dev, bpf-linker) and builds agent-ebpf,\n\
             or build without the programs with NODE_AGENT_SKIP_EBPF=1 (every probe is then reported down).\n\n"
        ),
    }
    if let Err(e) = std::fs::copy(&object, &out) {
        panic!("copying {} to {}: {e}", object.display(), out.display());
    }
}
