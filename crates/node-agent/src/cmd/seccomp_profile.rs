//! `node-agent seccomp-profile`: the seccomp profile the agent ships
//! (deploy/seccomp/node-agent.json, embedded: the runtime's default plus
//! bpf and perf_event_open), printed, written where the kubelet reads
//! Localhost profiles (the init container of
//! deploy/overlays/seccomp-profile), or checked against the filter this
//! process runs under.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use clap::{ArgMatches, Command};

use super::Error;
use crate::ebpf::kernel::{self, Call};

/// The profile, as committed (`cargo xtask seccomp-profile` writes it).
pub const PROFILE: &str = include_str!("../../../../deploy/seccomp/node-agent.json");

// The flags of `seccomp-profile`.
#[derive(clap::Args)]
struct SeccompProfileArgs {
    #[arg(
        long = "write",
        value_name = "FILE",
        help = "Write the profile to FILE (atomically, creating its directory), e.g. under the kubelet's seccomp directory."
    )]
    write: Option<String>,
    #[arg(
        long = "check",
        conflicts_with = "write",
        help = "Say which of the calls the profile decides about this process's seccomp filter refuses; exit 1 if the eBPF calls are refused."
    )]
    check: bool,
}

pub fn command() -> Command {
    let cmd = Command::new("seccomp-profile").about(
        "Print node-agent's seccomp profile (the runtime default plus bpf and perf_event_open), write it, or check the filter in force.",
    );
    <SeccompProfileArgs as clap::Args>::augment_args(cmd)
}

/// Writes `text` to `path` through a temporary file in the same directory,
/// so the kubelet never reads half a profile.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("profile")));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// A call the default profile refuses and ours keeps refusing: add_key(2)
/// with a NULL key type, which the kernel itself fails with EFAULT.
fn add_key_refused() -> bool {
    // SAFETY: NULL type and description: the kernel fails the copy from
    // user memory (EFAULT) and creates nothing.
    kernel::seccomp_refuses_call(|| unsafe {
        libc::syscall(libc::SYS_add_key, std::ptr::null::<u8>(), std::ptr::null::<u8>(), std::ptr::null::<u8>(), 0_i64, 0_i64)
    })
}

pub fn run(m: &ArgMatches) -> Result<ExitCode, Error> {
    let a: SeccompProfileArgs = super::args(m)?;
    if let Some(path) = &a.write {
        write_atomically(Path::new(path), PROFILE).map_err(|e| Error::Failed(format!("writing the seccomp profile to {path}: {e}")))?;
        println!("wrote {path}");
        return Ok(ExitCode::SUCCESS);
    }
    if a.check {
        let mode = std::fs::read_to_string("/proc/thread-self/status").ok().as_deref().and_then(kernel::parse_seccomp_mode);
        let mode = match mode {
            Some(0) => "none",
            Some(1) => "strict",
            Some(2) => "filter",
            _ => "unknown",
        };
        println!("seccomp: {mode}");
        let ebpf = [Call::Bpf, Call::PerfEventOpen].map(|c| (c.name(), kernel::seccomp_refuses(c)));
        for (name, refused) in ebpf.iter().copied().chain([("add_key", add_key_refused())]) {
            println!("{name}: {}", if refused { "refused" } else { "allowed" });
        }
        return Ok(if ebpf.iter().any(|(_, r)| *r) { ExitCode::FAILURE } else { ExitCode::SUCCESS });
    }
    print!("{PROFILE}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_profile_allows_the_ebpf_calls_and_refuses_by_default() {
        let p: serde_json::Value = serde_json::from_str(PROFILE).expect("JSON");
        assert!(p["defaultAction"].as_str().is_some_and(|a| a.starts_with("SCMP_ACT_ERRNO")), "{}", p["defaultAction"]);
        let unconditional = |name: &str| {
            p["syscalls"].as_array().unwrap().iter().any(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r["names"].as_array().unwrap().iter().any(|n| n == name)
                    && r["includes"].as_object().is_none_or(|o| o.is_empty())
                    && r["args"].as_array().is_none_or(|a| a.is_empty())
            })
        };
        assert!(unconditional("bpf") && unconditional("perf_event_open"));
        assert!(!unconditional("add_key"), "add_key is what --check shows refused");
    }

    #[test]
    fn written_whole_into_a_new_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seccomp/node-agent/node-agent.json");
        write_atomically(&path, PROFILE).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), PROFILE);
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary file left");
    }
}
