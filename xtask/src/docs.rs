//! `cargo xtask docs`: writes what the documentation generates from the
//! code.
//!
//! - `docs/reference/flags.md`: every flag of `node-agent` and of its
//!   subcommands, from the command line the binary builds (host collectors'
//!   and eBPF probes' registries, node_exporter's flag catalog), committed.
//!   Its generator is its staleness test, `tests/tests/docs.rs`, which
//!   writes the file instead of comparing it when `NODE_AGENT_DOCS_WRITE=1`
//!   (xtask depends on no workspace crate).
//! - `docs/reference/metrics.md`: every host collector's families, each
//!   collector run once on node_exporter's fixtures, and the exporter's
//!   own; the same test writes and checks it.
//! - `target/man/node-agent.1`: the man page, what `node-agent --help-man`
//!   prints (clap_mangen); not committed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The generated files under docs/, relative to the repository.
pub const GENERATED: &[&str] = &["docs/reference/flags.md", "docs/reference/metrics.md"];

/// Where the man page is written, relative to the repository.
pub const MAN_PAGE: &str = "target/man/node-agent.1";

/// Writes the generated references and the man page; returns the man
/// page's path.
pub fn write(root: &Path, cargo: &str) -> Result<PathBuf> {
    let mut test = Command::new(cargo);
    test.current_dir(root)
        .args(["test", "-q", "-p", "node-agent-tests", "--test", "docs", "--", "--exact", "generated_references_are_current"])
        .env("NODE_AGENT_DOCS_WRITE", "1");
    crate::run(&mut test)?;

    let out = Command::new(cargo)
        .current_dir(root)
        .args(["run", "-q", "-p", "node-agent", "--", "--help-man"])
        .output()
        .context("running node-agent --help-man")?;
    if !out.status.success() || !out.stdout.starts_with(b".") {
        bail!("node-agent --help-man failed with {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let man = root.join(MAN_PAGE);
    if let Some(dir) = man.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&man, &out.stdout).with_context(|| format!("writing {}", man.display()))?;
    Ok(man)
}
