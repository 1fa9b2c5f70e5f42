//! Builds the eBPF object with the test-only programs (`agent-ebpf`'s
//! `test-programs` feature: `verifier_rejects`, `empty`) for the truth tests
//! and the benchmark; the shipped object, embedded in node-agent, has none.
//! Skipped (an empty object) with `NODE_AGENT_SKIP_EBPF=1` and for the fuzz
//! harness, which builds this crate without its `agent` feature.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=NODE_AGENT_SKIP_EBPF");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_default()).join("agent-ebpf-test.o");
    let skip = std::env::var("NODE_AGENT_SKIP_EBPF").is_ok_and(|v| v == "1") || std::env::var_os("CARGO_FEATURE_AGENT").is_none();
    if skip {
        if let Err(e) = std::fs::write(&out, b"") {
            panic!("writing {}: {e}", out.display());
        }
        return;
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).parent().map(PathBuf::from).unwrap_or_default();
    let crates = root.join("crates");
    for p in ["agent-ebpf/src", "agent-ebpf/Cargo.toml", "agent-ebpf/Cargo.lock", "agent-ebpf/build.sh", "agent-common/src"] {
        println!("cargo:rerun-if-changed={}", crates.join(p).display());
    }
    let target_dir = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target")).join("ebpf-test");
    let status = Command::new("bash")
        .arg(crates.join("agent-ebpf/build.sh"))
        .arg(&target_dir)
        .arg("test-programs")
        .env_remove("CARGO_TARGET_DIR")
        .status();
    let object = target_dir.join("bpfel-unknown-none/release/agent-ebpf");
    match status {
        Ok(s) if s.success() && object.is_file() => {}
        _ => panic!("\n\nbuilding the eBPF test object failed (see above); `cargo xtask build-ebpf` installs the toolchain\n\n"),
    }
    if let Err(e) = std::fs::copy(&object, &out) {
        panic!("copying {} to {}: {e}", object.display(), out.display());
    }
}
