//! `cargo xtask image`: the container image, built with Debian's podman
//! and runc from Debian's packages and crates.io alone (no image is pulled).
//!
//! 1. **The build base**: Debian 12 with the eBPF toolchain (the packages
//!    of `BUILD_PACKAGES`, bpf-linker from crates.io), made by mmdebstrap
//!    and imported once; cached as `localhost/node-agent-build-base:KEY`,
//!    KEY a hash of what goes in.
//! 2. **The runtime base**: distroless/cc's equivalent, extracted from
//!    Debian's .debs (`xtask/image/runtime-root.sh`: libc6, libgcc-s1,
//!    base-files, netbase, ca-certificates' bundle; root, nonroot and
//!    nobody; no shell, no dpkg, no apt), one layer built `FROM scratch`
//!    with a fixed time stamp, cached the same way.
//! 3. **The images**: the Dockerfile on those two bases, with no network,
//!    twice from one build stage: the agent's (stage `agent`, built without
//!    the cluster commands) and the controller's (stage `controller`, the
//!    whole binary), tagged `REPO:V` and `REPO-controller:V`;
//!    crates come from the host's cargo registry (fetched beforehand),
//!    mounted; `target/` is a volume under `target/image/` kept between
//!    builds. Every time stamp is `SOURCE_DATE_EPOCH` (the last commit's
//!    time unless set), so the same inputs give the same image ID and
//!    digest: `--twice` builds again from nothing (no layer cache, an
//!    empty target directory) and fails unless both are equal.
//!
//! podman's default runtime, crun, refuses hybrid cgroup hierarchies (this
//! kind of machine), so builds and runs use runc; podman's default ulimits
//! are above what a session without CAP_SYS_RESOURCE may set, so they are
//! set to the current hard limits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The image the manifests name.
pub fn default_tag() -> String {
    format!("ghcr.io/node-agent/node-agent:{}", env!("CARGO_PKG_VERSION"))
}

/// The controller's image beside the agent's `tag`: the same repository
/// with `-controller`, the same version (`REPO:V` gives `REPO-controller:V`).
pub fn controller_tag(tag: &str) -> String {
    match tag.rsplit_once(':').filter(|(repo, version)| !version.contains('/') && !repo.is_empty()) {
        Some((repo, version)) => format!("{repo}-controller:{version}"),
        None => format!("{tag}-controller"),
    }
}

/// What `cargo xtask image` installs on the host.
const HOST_PACKAGES: &[&str] = &["podman", "runc", "mmdebstrap"];
/// The OCI runtime: Debian's runc (crun refuses hybrid cgroups).
pub const RUNTIME: &str = "/usr/sbin/runc";
const SUITE: &str = "bookworm";

/// The build stage's packages (the Dockerfile installs the same on a plain
/// debian:bookworm).
const BUILD_PACKAGES: &[&str] =
    &["ca-certificates", "gcc", "libc6-dev", "rustc-web", "cargo-web", "libstd-rust-web-dev-bpf", "llvm-22-dev"];
/// The runtime's packages (distroless/cc-debian12's, less tzdata, libgomp,
/// libstdc++ and libssl, which nothing of ours links); gcc-12-base is
/// libgcc-s1's (copyright files only).
const RUNTIME_PACKAGES: &[&str] = &["base-files", "netbase", "libc6", "libgcc-s1", "gcc-12-base", "ca-certificates"];
/// The runtime base's fixed time stamp (Debian 12's release day): it does
/// not change with the source.
const BASE_EPOCH: u64 = 1_686_355_200;

pub struct Options {
    pub tag: String,
    /// Build a second time from nothing and compare.
    pub twice: bool,
    /// Rebuild both bases (to take Debian's updates).
    pub refresh: bool,
}

/// The image built: its reference, ID (the config's digest) and digest.
pub struct Built {
    pub tag: String,
    pub id: String,
    pub digest: String,
    pub size: u64,
}

/// FNV-1a, 64 bits: a stable cache key (std's hashers may change).
fn key(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The current hard limit of an rlimit, from /proc/self/limits.
fn hard_limit(name: &str) -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().nth(1)?.parse().ok()
}

/// The highest nproc limit runc may set here: podman starts conmon, and so
/// runc, with RLIMIT_NPROC 32768 whatever its own limit (seen on this
/// kind of machine: any value above it is refused with EPERM).
const CONMON_NPROC: u64 = 32_768;

/// `--ulimit` flags at or below what this session may set (it has no
/// CAP_SYS_RESOURCE, and podman's defaults are above its hard limits).
pub fn ulimits() -> Vec<String> {
    let mut v = Vec::new();
    for (flag, name, cap) in [("nofile", "Max open files", u64::MAX), ("nproc", "Max processes", CONMON_NPROC)] {
        if let Some(h) = hard_limit(name) {
            let n = h.min(cap);
            v.extend(["--ulimit".to_string(), format!("{flag}={n}:{n}")]);
        }
    }
    v
}

/// `podman SUB` with the runtime and ulimit flags this host needs, for
/// `build` and `run` alike.
pub fn podman(sub: &str) -> Command {
    let mut c = Command::new("podman");
    c.arg(sub).args(["--runtime", RUNTIME]).args(ulimits());
    c
}

fn exists(image: &str) -> bool {
    Command::new("podman").args(["image", "exists", image]).status().is_ok_and(|s| s.success())
}

fn inspect(image: &str, format: &str) -> Result<String> {
    let out = Command::new("podman").args(["image", "inspect", "--format", format, image]).output().context("starting podman")?;
    if !out.status.success() {
        bail!("podman image inspect {image}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The build base, made unless cached: Debian 12 with the toolchain.
fn build_base_name() -> String {
    format!("localhost/node-agent-build-base:{}", key(&[SUITE, &BUILD_PACKAGES.join(","), crate::BPF_LINKER_VERSION, "llvm-22", "v1"]))
}

/// After a build on a machine that will not build again (CI): drops what
/// only another build would reuse — the build base, the build stage's
/// layers, the release build's cargo target — several GB, freed before
/// the test suite runs. The image itself stays.
pub fn free_build_space(root: &Path) {
    let _ = std::fs::remove_dir_all(root.join("target/image/cargo-target"));
    let quiet = |args: &[&str]| {
        let _ = Command::new("podman").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
    };
    quiet(&["rmi", &build_base_name()]);
    quiet(&["image", "prune", "--force"]);
}

fn build_base(root: &Path, refresh: bool) -> Result<String> {
    let name = build_base_name();
    if exists(&name) && !refresh {
        return Ok(name);
    }
    eprintln!("xtask: making the build base {name} from Debian's packages (mmdebstrap; a few minutes)");
    let dir = root.join("target/image");
    std::fs::create_dir_all(&dir)?;
    let tar = dir.join("build-base.tar");
    // bpf-linker from crates.io, in the new root, trusting what the host
    // trusts (a proxy's CA), which is removed afterwards.
    let install = format!(
        "chroot \"$1\" env LLVM_PREFIX=/usr/lib/llvm-22 HOME=/root CARGO_HTTP_CAINFO=/tmp/xtask-ca.crt \
         cargo install bpf-linker --version {} --locked --no-default-features --features llvm-22 --root /usr/local",
        crate::BPF_LINKER_VERSION
    );
    crate::run(
        Command::new("mmdebstrap")
            .args(["--variant=apt", "--format=tar", "--quiet"])
            .arg(format!("--include={}", BUILD_PACKAGES.join(",")))
            .arg("--customize-hook=cp /etc/ssl/certs/ca-certificates.crt \"$1/tmp/xtask-ca.crt\"")
            .arg(format!("--customize-hook={install}"))
            .arg("--customize-hook=rm -rf \"$1/root/.cargo\" \"$1/tmp/xtask-ca.crt\"")
            .arg(SUITE)
            .arg(&tar),
    )?;
    crate::run(Command::new("podman").args(["import", "--quiet"]).arg(&tar).arg(&name).stdout(Stdio::null()))?;
    let _ = std::fs::remove_file(&tar);
    Ok(name)
}

/// Warns when the build base's cargo and rustc-web are not those the PGO
/// profile was trained with (the profile would not take: xtask/src/pgo.rs).
fn check_toolchain(root: &Path, base: &str) {
    let out = podman("run").args(["--rm", "--network=none", base, "sh", "-c", "rustc -V; cargo -V"]).output();
    let have = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let want = crate::pgo::trained_toolchain(root).unwrap_or_default();
    if have != want {
        eprintln!(
            "xtask: warning: the build base has {:?}, the PGO profile was trained with {:?}: it will not take \
             (`cargo xtask image --refresh` remakes the base, `cargo xtask pgo` the profile)",
            have.trim(),
            want.trim()
        );
    }
}

/// The runtime base, made unless cached: one layer from Debian's .debs.
fn runtime_base(root: &Path, refresh: bool) -> Result<String> {
    let script = root.join("xtask/image/runtime-root.sh");
    let recipe = std::fs::read_to_string(&script).with_context(|| format!("reading {}", script.display()))?;
    let name = format!("localhost/node-agent-runtime-base:{}", key(&[SUITE, &RUNTIME_PACKAGES.join(","), &recipe, "v1"]));
    if exists(&name) && !refresh {
        return Ok(name);
    }
    eprintln!("xtask: making the runtime base {name} from Debian's .debs (mmdebstrap --variant=extract)");
    let dir = root.join("target/image/runtime-base");
    let rootfs = dir.join("root");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // Packages named in --include are extracted with their hard
    // dependencies; the hook keeps the named ones' files only.
    let include: Vec<&str> = RUNTIME_PACKAGES.iter().copied().filter(|p| *p != "gcc-12-base").collect();
    crate::run(
        Command::new("mmdebstrap")
            .args(["--variant=extract", "--format=directory", "--quiet"])
            .arg(format!("--include={}", include.join(",")))
            .arg(format!("--extract-hook={} hook \"$1\"", script.display()))
            .arg(SUITE)
            .arg(&rootfs)
            .env("NODE_AGENT_KEEP", RUNTIME_PACKAGES.join(" "))
            .env("SOURCE_DATE_EPOCH", BASE_EPOCH.to_string()),
    )?;
    crate::run(Command::new("sh").arg(&script).arg("finish").arg(&rootfs))?;
    // A tar that depends on the files alone: names sorted, one time, numeric owners.
    crate::run(
        Command::new("tar")
            .args(["--sort=name", "--numeric-owner", "--format=posix", "--pax-option=delete=atime,delete=ctime"])
            .arg(format!("--mtime=@{BASE_EPOCH}"))
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(dir.join("rootfs.tar"))
            .arg("."),
    )?;
    std::fs::write(dir.join("Containerfile"), "FROM scratch\nADD rootfs.tar /\n")?;
    crate::run(
        podman("build")
            .args(["--pull=never", "--network=none", "--quiet", "--timestamp"])
            .arg(BASE_EPOCH.to_string())
            .args(["-t", &name, "-f"])
            .arg(dir.join("Containerfile"))
            .arg(&dir)
            .stdout(Stdio::null()),
    )?;
    let _ = std::fs::remove_dir_all(&rootfs);
    Ok(name)
}

/// The last commit's time, unless SOURCE_DATE_EPOCH is set.
fn source_date_epoch(root: &Path) -> Result<String> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return Ok(v);
    }
    let out = Command::new("git").current_dir(root).args(["log", "-1", "--format=%ct"]).output().context("starting git")?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v.is_empty() {
        bail!("no SOURCE_DATE_EPOCH and no commit to take it from");
    }
    Ok(v)
}

fn revision(root: &Path) -> String {
    Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The host's cargo registry, which the build mounts (`cargo fetch` fills it).
fn cargo_registry() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"));
    home.join("registry")
}

/// One build of the image of the Dockerfile's stage `stage`; `fresh`: no
/// layer cache, an empty target dir.
fn build_once(root: &Path, tag: &str, stage: &str, bases: (&str, &str), epoch: &str, fresh: bool) -> Result<()> {
    let target = root.join(if fresh { "target/image/cargo-target-fresh" } else { "target/image/cargo-target" });
    if fresh {
        let _ = std::fs::remove_dir_all(&target);
    }
    std::fs::create_dir_all(&target)?;
    let mut c = podman("build");
    c.current_dir(root)
        .args(["--pull=never", "--network=none", "--timestamp", epoch])
        .arg("--build-arg")
        .arg(format!("BUILD_BASE={}", bases.0))
        .arg("--build-arg")
        .arg(format!("RUNTIME_BASE={}", bases.1))
        .arg("--build-arg")
        .arg(format!("NODE_AGENT_REVISION={}", revision(root)))
        .args(["--build-arg", "CARGO_NET_OFFLINE=true"])
        .arg("-v")
        .arg(format!("{}:/root/.cargo/registry", cargo_registry().display()))
        .arg("-v")
        .arg(format!("{}:/src/target", target.display()))
        .args(["--target", stage, "-t", tag, "-f", "Dockerfile", "."]);
    if fresh {
        c.arg("--no-cache");
    }
    crate::run(&mut c)?;
    if fresh {
        let _ = std::fs::remove_dir_all(&target);
    }
    Ok(())
}

/// Builds the image (see the module's documentation).
pub fn build(root: &Path, opts: &Options) -> Result<Built> {
    crate::apt_install(HOST_PACKAGES)?;
    // Every crate of the build, into the registry the build mounts.
    crate::fetch_all()?;
    let bases = (build_base(root, opts.refresh)?, runtime_base(root, opts.refresh)?);
    check_toolchain(root, &bases.0);
    let epoch = source_date_epoch(root)?;
    let t = std::time::Instant::now();
    build_once(root, &opts.tag, "agent", (&bases.0, &bases.1), &epoch, false)?;
    // The controller's: the same build stage, from the layer cache (or, if
    // it runs again, from the kept target directory).
    let controller = controller_tag(&opts.tag);
    build_once(root, &controller, "controller", (&bases.0, &bases.1), &epoch, false)?;
    let built = Built {
        tag: opts.tag.clone(),
        id: inspect(&opts.tag, "{{.Id}}")?,
        digest: inspect(&opts.tag, "{{.Digest}}")?,
        size: inspect(&opts.tag, "{{.Size}}")?.parse().unwrap_or(0),
    };
    eprintln!(
        "xtask: image {} built in {:.0} s: ID {}, digest {}, {:.1} MB",
        built.tag,
        t.elapsed().as_secs_f64(),
        built.id,
        built.digest,
        built.size as f64 / 1e6
    );
    let mut record = serde_json::json!({
        "tag": built.tag,
        "revision": revision(root),
        "id": built.id,
        "digest": built.digest,
        "size": built.size,
        "seconds": t.elapsed().as_secs(),
        "runtime_base_size": inspect(&bases.1, "{{.Size}}")?.parse::<u64>().unwrap_or(0),
        "binary_size": binary_size(&built.tag).unwrap_or(0),
        "controller_tag": controller,
        "controller_size": inspect(&controller, "{{.Size}}")?.parse::<u64>().unwrap_or(0),
        "controller_binary_size": binary_size(&controller).unwrap_or(0),
    });
    if opts.twice {
        let again = format!("{}-rebuilt", opts.tag);
        let t = std::time::Instant::now();
        build_once(root, &again, "agent", (&bases.0, &bases.1), &epoch, true)?;
        let (id, digest) = (inspect(&again, "{{.Id}}")?, inspect(&again, "{{.Digest}}")?);
        let _ = Command::new("podman").args(["rmi", &again]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        eprintln!("xtask: rebuilt from nothing in {:.0} s: ID {id}, digest {digest}", t.elapsed().as_secs_f64());
        if id != built.id || digest != built.digest {
            bail!(
                "the image is not reproducible: the same inputs gave ID {} / digest {} and ID {id} / digest {digest}",
                built.id,
                built.digest
            );
        }
        eprintln!("xtask: reproducible: both builds are ID {id}, digest {digest}");
        record["rebuilt_from_nothing_seconds"] = t.elapsed().as_secs().into();
    }
    // For `cargo xtask bench`'s Image section.
    std::fs::write(root.join(RECORD), serde_json::to_string_pretty(&record)?)?;
    Ok(built)
}

/// Where the last build is described (read by the benchmark).
pub const RECORD: &str = "target/image/build.json";

/// The size of /usr/bin/node-agent in the image.
fn binary_size(tag: &str) -> Option<u64> {
    let out = Command::new("podman").args(["image", "mount", tag]).output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let size = std::fs::metadata(dir.join("usr/bin/node-agent")).ok().map(|m| m.len());
    let _ = Command::new("podman").args(["image", "unmount", tag]).stdout(Stdio::null()).status();
    size
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_depend_on_every_part() {
        // FNV-1a of "a\0": fixed, whatever the Rust version.
        assert_eq!(key(&["a"]), "089be207b544f1e4");
        assert_ne!(key(&["a", "b"]), key(&["ab"]));
        assert_ne!(key(&["a", "b"]), key(&["a", "c"]));
    }

    #[test]
    fn the_controller_image_is_the_repository_with_controller() {
        assert_eq!(controller_tag("ghcr.io/node-agent/node-agent:0.1.0"), "ghcr.io/node-agent/node-agent-controller:0.1.0");
        assert_eq!(controller_tag("localhost:5000/na"), "localhost:5000/na-controller");
        assert_eq!(controller_tag("localhost:5000/na:1"), "localhost:5000/na-controller:1");
    }

    #[test]
    fn hard_limits_are_read() {
        assert!(hard_limit("Max open files").is_some_and(|n| n > 0));
    }
}
