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
//! after larger changes; `cargo xtask bench` reports the result.
//!
//! A profile names functions by their mangled symbols, and those carry a
//! hash of the crate that cargo derives from the compiler's and cargo's
//! versions, the crate's features and the build profile's settings (not
//! RUSTFLAGS). So the training, the bench's build and the image's
//! build all use one toolchain, the image's: Debian's cargo and rustc-web
//! (installed with the eBPF toolchain), through [`image_cargo`], and one
//! feature set, the agent's (`--no-default-features`), with the release
//! profile as Cargo.toml has it. `pgo/toolchain`
//! records the toolchain the profile was trained with; a build with another
//! goes on without the profile (every function would miss it), with a
//! warning.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The merged profile, gzipped and committed.
pub const PROFILE: &str = "pgo/node-agent.profdata.gz";
/// Where builds read it from, unpacked.
const UNPACKED: &str = "target/pgo/node-agent.profdata";
/// `rustc -V` and `cargo -V` of the toolchain the profile was trained with.
const PROFILE_TOOLCHAIN: &str = "pgo/toolchain";
/// The image's toolchain (Dockerfile): Debian's cargo and rustc-web.
const IMAGE_CARGO: &str = "/usr/bin/cargo";
const IMAGE_RUSTC: &str = "/usr/bin/rustc";
const PROFDATA_TOOL: &str = "llvm-profdata-22";

/// A cargo command of the image's toolchain in `root`: Debian's cargo with
/// Debian's rustc-web, whatever rustup has in PATH.
pub fn image_cargo(root: &Path) -> Command {
    let mut c = Command::new(IMAGE_CARGO);
    c.current_dir(root).env("RUSTC", IMAGE_RUSTC).env_remove("RUSTUP_TOOLCHAIN").env_remove("RUSTC_WRAPPER");
    c
}

/// `rustc -V` and `cargo -V` of the toolchain the committed profile was
/// trained with, one per line.
pub fn trained_toolchain(root: &Path) -> Option<String> {
    std::fs::read_to_string(root.join(PROFILE_TOOLCHAIN)).ok()
}

/// `rustc -V` and `cargo -V` of the image's toolchain, one per line.
fn image_toolchain() -> Option<String> {
    let version = |bin: &str| {
        let out = Command::new(bin).arg("-V").env_remove("RUSTUP_TOOLCHAIN").output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    Some(format!("{}\n{}\n", version(IMAGE_RUSTC)?, version(IMAGE_CARGO)?))
}

/// `CARGO_ENCODED_RUSTFLAGS` for a release build with the committed profile,
/// with the image's toolchain, or `None` (with a warning) when the profile
/// is from another toolchain.
pub fn use_flags(root: &Path) -> Option<String> {
    let packed = root.join(PROFILE);
    if !packed.exists() {
        eprintln!("xtask: warning: no {PROFILE} (`cargo xtask pgo` writes it); building without PGO");
        return None;
    }
    let want = trained_toolchain(root).unwrap_or_default();
    let have = image_toolchain().unwrap_or_default();
    if want.trim().is_empty() || want != have {
        eprintln!(
            "xtask: warning: {PROFILE} is from {:?}, the image's toolchain is {:?}; building without PGO (run `cargo xtask pgo`)",
            want.trim(),
            have.trim()
        );
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
pub fn generate(root: &Path) -> Result<()> {
    let target = root.join("target/pgo");
    let raw = target.join("raw");
    let instrument = encoded(&[&format!("-Cprofile-generate={}", raw.display()), LINK_ARG, RELR_ARG]);
    let toolchain = image_toolchain().context("reading the image toolchain's versions (Debian's rustc-web and cargo)")?;
    // The agent's build, as the image and the bench build it.
    let status = image_cargo(root)
        .args(["build", "--release", "-p", "node-agent", "--no-default-features", "--target-dir"])
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
    std::fs::write(root.join(PROFILE_TOOLCHAIN), toolchain).context("writing the profile's toolchain")?;
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
        // The agent's build, which the profile was trained on; and a build
        // by another toolchain says it runs without the profile.
        assert!(dockerfile.contains("cargo build --release --locked -p node-agent --no-default-features"));
        assert!(dockerfile.contains(r#"[ "$(rustc -V; cargo -V)" != "$(cat pgo/toolchain)" ]"#));
    }

    #[test]
    fn flags_name_the_profile_or_there_is_none() {
        let root = tmp("flags");
        assert_eq!(use_flags(&root), None, "no profile, no PGO");
        std::fs::create_dir_all(root.join("pgo")).unwrap();
        let gz = std::process::Command::new("sh").arg("-c").arg(format!("printf x | gzip -c > {}", root.join(PROFILE).display())).status();
        assert!(gz.unwrap().success());
        let have = image_toolchain().expect("the image's toolchain (Debian's rustc-web and cargo) is installed");
        std::fs::write(root.join(PROFILE_TOOLCHAIN), have.replacen("rustc ", "rustc 0", 1)).unwrap();
        assert_eq!(use_flags(&root), None, "another toolchain's profile is not used");
        std::fs::write(root.join(PROFILE_TOOLCHAIN), &have).unwrap();
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
