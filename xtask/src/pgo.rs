//! Profile-guided optimization of the release build.
//!
//! `cargo xtask pgo` builds node-agent instrumented (`-Cprofile-generate`),
//! runs it under `pgo/train.sh` (the benchmark's workload: every default
//! collector, every probe and pod attribution, then without eBPF; every
//! exposition format), merges the counts with Debian's `llvm-profdata-22`
//! (the eBPF toolchain's LLVM) and commits them gzipped,
//! `pgo/node-agent.profdata.gz` (16 MB of mostly zero counts: every
//! function the training never ran is in it, which is what marks it cold).
//!
//! Release builds (`cargo xtask run`, `cargo xtask bench`, the Dockerfile)
//! compile with that profile (`-Cprofile-use`), and link with
//! `-z keep-text-section-prefix`: LLVM puts the functions the training never
//! ran in `.text.unlikely`, the hot ones in `.text.hot`, and the linker keeps
//! each group together, so the code a running agent touches shares few pages
//! (the mapped binary is most of its resident memory) and runs faster.
//!
//! The profile stays usable as the code changes: a function whose code
//! changed since the training simply has no counts (LLVM drops a mismatched
//! function's profile), it is compiled as without PGO. Rerun `cargo xtask pgo`
//! after larger changes; `cargo xtask bench` reports the result. A rustc whose
//! LLVM major version is not the profile's cannot read it: the build then
//! goes on without it, with a warning.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The merged profile, gzipped and committed.
pub const PROFILE: &str = "pgo/node-agent.profdata.gz";
/// Where builds read it from, unpacked.
const UNPACKED: &str = "target/pgo/node-agent.profdata";
/// The LLVM major version the profile was written with (rustc's).
const PROFILE_LLVM: &str = "pgo/llvm-version";
const PROFDATA_TOOL: &str = "llvm-profdata-22";

/// The LLVM major version of the `rustc` cargo uses.
fn rustc_llvm_major() -> Option<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("-vV").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = text.lines().find_map(|l| l.strip_prefix("LLVM version: "))?;
    v.split('.').next().map(str::to_string)
}

/// `CARGO_ENCODED_RUSTFLAGS` for a release build with the committed profile,
/// or `None` (with a warning) when this rustc cannot use it.
pub fn use_flags(root: &Path) -> Option<String> {
    let packed = root.join(PROFILE);
    if !packed.exists() {
        eprintln!("xtask: warning: no {PROFILE} (`cargo xtask pgo` writes it); building without PGO");
        return None;
    }
    let want = std::fs::read_to_string(root.join(PROFILE_LLVM)).unwrap_or_default().trim().to_string();
    let have = rustc_llvm_major().unwrap_or_default();
    if want.is_empty() || want != have {
        eprintln!("xtask: warning: {PROFILE} is from LLVM {want:?}, rustc has LLVM {have:?}; building without PGO");
        return None;
    }
    let profile = match unpack(&packed, &root.join(UNPACKED)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtask: warning: unpacking {PROFILE}: {e:#}; building without PGO");
            return None;
        }
    };
    Some(encoded(&[&format!("-Cprofile-use={}", profile.display()), "-Cllvm-args=-no-pgo-warn-mismatch", COLD_ARG, LINK_ARG, RELR_ARG]))
}

/// `packed` gunzipped to `out`, unless `out` is already that (as new).
fn unpack(packed: &Path, out: &Path) -> Result<PathBuf> {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if matches!((mtime(out), mtime(packed)), (Some(o), Some(p)) if o >= p) {
        return Ok(out.to_path_buf());
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("tmp");
    let file = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let status = Command::new("gzip").arg("-dc").arg(packed).stdout(file).status().context("starting gzip")?;
    if !status.success() {
        bail!("gzip -dc {} failed ({status})", packed.display());
    }
    std::fs::rename(&tmp, out).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(out.to_path_buf())
}

/// Keeps `.text.hot` / `.text.unlikely` apart in the output (lld; GNU ld's
/// default script groups them anyway).
const LINK_ARG: &str = "-Clink-arg=-Wl,-z,keep-text-section-prefix";
/// Relative relocations packed (DT_RELR, glibc 2.36 and later: Debian 12,
/// the image's distroless base): 540 KiB of `.rela.dyn`, which the dynamic
/// loader reads whole at start-up, become a few KiB.
pub const RELR_ARG: &str = "-Clink-arg=-Wl,-z,pack-relative-relocs";
/// Cold means never run in the training: by default LLVM also counts as
/// cold whatever runs less than the profile summary's cut-off (the start-up
/// code, run once against the scrapes' thousands of times), which then sits
/// among the never-run code and pulls its pages in (start-up runs in
/// 64 KiB fault-around windows there): 0.7 MB more resident with eBPF.
const COLD_ARG: &str = "-Cllvm-args=-profile-summary-cold-count=0";

fn encoded(flags: &[&str]) -> String {
    flags.join("\x1f")
}

/// Builds node-agent instrumented, trains it, and writes the merged profile.
pub fn generate(root: &Path, cargo: &str) -> Result<()> {
    let target = root.join("target/pgo");
    let raw = target.join("raw");
    let instrument = encoded(&[&format!("-Cprofile-generate={}", raw.display()), LINK_ARG, RELR_ARG]);
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "node-agent", "--target-dir"])
        .arg(&target)
        .env("CARGO_ENCODED_RUSTFLAGS", instrument)
        .status()
        .context("starting cargo")?;
    if !status.success() {
        bail!("the instrumented build failed ({status})");
    }
    // Build scripts ran instrumented too: only the training's counts count.
    if raw.exists() {
        std::fs::remove_dir_all(&raw).with_context(|| format!("clearing {}", raw.display()))?;
    }
    let bin = target.join("release/node-agent");
    let status = Command::new("bash").arg(root.join("pgo/train.sh")).arg(&bin).status().context("starting pgo/train.sh")?;
    if !status.success() {
        bail!("pgo/train.sh failed ({status})");
    }
    let profiles: Vec<PathBuf> = std::fs::read_dir(&raw)
        .with_context(|| format!("reading {}", raw.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "profraw"))
        .collect();
    if profiles.is_empty() {
        bail!("the training wrote no profile into {}", raw.display());
    }
    let merged = root.join(UNPACKED);
    let status = Command::new(PROFDATA_TOOL)
        .args(["merge", "-o"])
        .arg(&merged)
        .args(&profiles)
        .status()
        .with_context(|| format!("starting {PROFDATA_TOOL} (Debian's llvm-22)"))?;
    if !status.success() {
        bail!("{PROFDATA_TOOL} merge failed ({status})");
    }
    // -n: no name or time stamp in the header, so the same counts give the same file.
    let out = root.join(PROFILE);
    let file = std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
    let status = Command::new("gzip").args(["-9", "-n", "-c"]).arg(&merged).stdout(file).status().context("starting gzip")?;
    if !status.success() {
        bail!("gzip {} failed ({status})", merged.display());
    }
    let major = rustc_llvm_major().context("reading rustc's LLVM version")?;
    std::fs::write(root.join(PROFILE_LLVM), format!("{major}\n")).context("writing the profile's LLVM version")?;
    eprintln!("xtask: wrote {} from {} profile file(s) of the training", out.display(), profiles.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-pgo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_committed_profile_unpacks_and_is_used_with_the_link_order_flag() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let out = tmp("unpack").join("p.profdata");
        let p = unpack(&root.join(PROFILE), &out).expect("gunzip");
        // An indexed LLVM profile: its magic, little-endian.
        let head = std::fs::read(&p).unwrap();
        assert_eq!(&head[..8], b"\xfflprofi\x81", "not an indexed profile");
        // Up to date: not unpacked again.
        let before = std::fs::metadata(&p).unwrap().modified().unwrap();
        unpack(&root.join(PROFILE), &out).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().modified().unwrap(), before);
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }

    /// The image is built as `cargo xtask run` builds: the same flags.
    #[test]
    fn the_dockerfile_builds_with_the_same_flags() {
        let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
        let line = dockerfile.lines().find(|l| l.contains("RUSTFLAGS=")).expect("the Dockerfile sets RUSTFLAGS");
        let flags: Vec<&str> = line.split('"').nth(1).unwrap_or_default().split(' ').collect();
        for want in [COLD_ARG, LINK_ARG, RELR_ARG, "-Cllvm-args=-no-pgo-warn-mismatch"] {
            assert!(flags.contains(&want), "{want} is not among the Dockerfile's {flags:?}");
        }
        assert!(flags.iter().any(|f| f.starts_with("-Cprofile-use=")), "{flags:?}");
    }

    #[test]
    fn flags_name_the_profile_or_there_is_none() {
        let root = tmp("flags");
        assert_eq!(use_flags(&root), None, "no profile, no PGO");
        std::fs::create_dir_all(root.join("pgo")).unwrap();
        let gz = std::process::Command::new("sh").arg("-c").arg(format!("printf x | gzip -c > {}", root.join(PROFILE).display())).status();
        assert!(gz.unwrap().success());
        std::fs::write(root.join(PROFILE_LLVM), "0\n").unwrap();
        assert_eq!(use_flags(&root), None, "another LLVM's profile is not used");
        std::fs::write(root.join(PROFILE_LLVM), format!("{}\n", rustc_llvm_major().unwrap())).unwrap();
        let flags = use_flags(&root).expect("flags");
        let flags: Vec<&str> = flags.split('\x1f').collect();
        assert_eq!(flags[0], format!("-Cprofile-use={}", root.join(UNPACKED).display()));
        assert!(flags.contains(&LINK_ARG));
        assert!(flags.contains(&COLD_ARG));
        assert!(flags.contains(&RELR_ARG));
        assert_eq!(std::fs::read(root.join(UNPACKED)).unwrap(), b"x");
        let _ = std::fs::remove_dir_all(&root);
    }
}
