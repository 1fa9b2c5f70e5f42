//! Supply chain: `cargo deny check licenses bans sources` (deny.toml) on the
//! workspace, on agent-ebpf and on the AFL++ harness (fuzz/): only the licenses listed, no OpenSSL, no
//! wildcard versions, crates from crates.io only. cargo-deny comes from
//! `cargo xtask test` (setup); without it this skips, except in CI. The
//! advisories check needs GitHub (the RustSec database) and is not run here.

use std::path::Path;
use std::process::Command;

fn deny(manifest: &Path) -> Option<(bool, String)> {
    let out = Command::new(env!("CARGO"))
        .args(["deny", "--offline", "--manifest-path"])
        .arg(manifest)
        .args(["check", "licenses", "bans", "sources"])
        .output()
        .ok()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&out.stdout));
    if text.contains("no such command") {
        return None;
    }
    Some((out.status.success(), text))
}

#[test]
fn licenses_bans_and_sources_pass_cargo_deny() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for manifest in [root.join("Cargo.toml"), root.join("crates/agent-ebpf/Cargo.toml"), root.join("fuzz/Cargo.toml")] {
        let Some((ok, text)) = deny(&manifest) else {
            assert!(std::env::var_os("CI").is_none(), "cargo-deny is required in CI (cargo xtask test installs it)");
            eprintln!("SKIP: cargo-deny not installed (cargo xtask test installs it)");
            return;
        };
        assert!(ok, "cargo deny on {}:\n{text}", manifest.display());
        assert!(text.contains("bans ok, licenses ok, sources ok"), "{text}");
    }
}
