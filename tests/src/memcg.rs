//! Memory cgroups of a test's own, read the kubelet's way (issue #34):
//! the kubelet does not read RSS, it reports and evicts on the container's
//! cgroup, `container_memory_working_set_bytes` (usage minus inactive file
//! pages, as cAdvisor computes it) and the cgroup's peak.
//!
//! v2 where the host has the memory controller on its unified hierarchy
//! (`/sys/fs/cgroup/cgroup.controllers` lists `memory`), v1 otherwise
//! (`/sys/fs/cgroup/memory/`).

use std::ffi::CString;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a [`MemCg`] lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One reading of a memory cgroup, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    /// memory.current (v2), memory.usage_in_bytes (v1).
    pub usage: u64,
    /// usage minus inactive file pages, floored at 0 (cAdvisor's
    /// `container_memory_working_set_bytes`).
    pub working_set: u64,
    /// memory.peak (v2), memory.max_usage_in_bytes (v1): since the cgroup
    /// was made, or since [`MemCg::reset_peak`].
    pub peak: u64,
    /// What the working set is made of: anonymous memory (memory.stat's
    /// `anon`, v1's `total_rss`), kernel memory (v2's `kernel`, v1's
    /// memory.kmem.usage_in_bytes: page tables, sockets, eBPF maps and
    /// programs, slab) and active file pages (`active_file`,
    /// `total_active_file`). Their sum is close to the working set, not
    /// equal: v1's kmem and its page counts are updated in batches.
    pub anon: u64,
    pub kernel: u64,
    pub active_file: u64,
}

/// A memory cgroup made for one process, removed when dropped (after the
/// process has exited: drop the process's guard first).
pub struct MemCg {
    dir: PathBuf,
    version: Version,
    /// v2's peak is reset per open file (Linux 6.12+): the file written to
    /// reads the peak since that write.
    peak_file: Option<std::fs::File>,
}

/// The hierarchy this host's memory controller is on.
pub fn host_version() -> Option<Version> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
    if v2.split_whitespace().any(|c| c == "memory") {
        Some(Version::V2)
    } else if Path::new("/sys/fs/cgroup/memory/memory.usage_in_bytes").exists() {
        Some(Version::V1)
    } else {
        None
    }
}

/// A field of memory.stat (`key value` lines).
pub fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The working set as cAdvisor computes it from usage and memory.stat:
/// usage minus `total_inactive_file` (v1, the hierarchical count) or
/// `inactive_file` (v2), never below 0.
pub fn working_set(version: Version, usage: u64, stat: &str) -> u64 {
    let key = match version {
        Version::V1 => "total_inactive_file",
        Version::V2 => "inactive_file",
    };
    usage.saturating_sub(stat_field(stat, key).unwrap_or(0))
}

fn read_u64(path: &Path) -> std::io::Result<u64> {
    let s = std::fs::read_to_string(path)?;
    s.trim().parse().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
}

impl MemCg {
    /// Makes a memory cgroup named `name` (made unique with this process's
    /// id) at the top of the hierarchy.
    pub fn new(name: &str) -> std::io::Result<MemCg> {
        let version = host_version().ok_or_else(|| std::io::Error::other("no memory cgroup controller on this host"))?;
        let base = match version {
            Version::V2 => {
                // Children of the root get the memory controller only when
                // the root passes it down (systemd hosts do).
                let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
                PathBuf::from("/sys/fs/cgroup")
            }
            Version::V1 => PathBuf::from("/sys/fs/cgroup/memory"),
        };
        let dir = base.join(format!("node-agent-bench-{name}-{}", std::process::id()));
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir)?;
        Ok(MemCg { dir, version, peak_file: None })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }

    /// Has `cmd`'s child move itself into the cgroup between fork and exec,
    /// before it allocates anything of its own (writing 0 to cgroup.procs
    /// moves the writer, in v1 and v2).
    pub fn join_on_exec(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let procs = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(self.dir.join("cgroup.procs").as_os_str()))
            .expect("no NUL in a cgroup path");
        // SAFETY: between fork and exec the closure only makes
        // async-signal-safe system calls (open, write, close) on memory
        // prepared before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if n == 1 {
                    Ok(())
                } else {
                    Err(err)
                }
            });
        }
    }

    /// Usage, working set and peak now.
    pub fn read(&mut self) -> std::io::Result<Reading> {
        let (usage_f, peak_f) = match self.version {
            Version::V2 => ("memory.current", "memory.peak"),
            Version::V1 => ("memory.usage_in_bytes", "memory.max_usage_in_bytes"),
        };
        let usage = read_u64(&self.dir.join(usage_f))?;
        let stat = std::fs::read_to_string(self.dir.join("memory.stat"))?;
        let peak = match self.peak_file.as_mut() {
            Some(f) => {
                let mut s = String::new();
                f.rewind()?;
                f.read_to_string(&mut s)?;
                s.trim().parse().unwrap_or(0)
            }
            None => read_u64(&self.dir.join(peak_f)).unwrap_or(0),
        };
        let (anon, kernel, active_file) = match self.version {
            Version::V2 => (stat_field(&stat, "anon"), stat_field(&stat, "kernel"), stat_field(&stat, "active_file")),
            Version::V1 => (
                stat_field(&stat, "total_rss"),
                read_u64(&self.dir.join("memory.kmem.usage_in_bytes")).ok(),
                stat_field(&stat, "total_active_file"),
            ),
        };
        Ok(Reading {
            usage,
            working_set: working_set(self.version, usage, &stat),
            peak,
            anon: anon.unwrap_or(0),
            kernel: kernel.unwrap_or(0),
            active_file: active_file.unwrap_or(0),
        })
    }

    /// Resets the peak to the usage now; false where the kernel cannot
    /// (v2 before Linux 6.12), when the peak stays the whole life's.
    pub fn reset_peak(&mut self) -> bool {
        match self.version {
            Version::V1 => std::fs::write(self.dir.join("memory.max_usage_in_bytes"), "0").is_ok(),
            Version::V2 => {
                let f = std::fs::OpenOptions::new().read(true).write(true).open(self.dir.join("memory.peak"));
                match f {
                    Ok(mut f) => {
                        let ok = f.write_all(b"reset\n").is_ok();
                        self.peak_file = ok.then_some(f);
                        ok
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

impl Drop for MemCg {
    fn drop(&mut self) {
        self.peak_file = None;
        // The process may take a moment to leave once killed and reaped.
        for _ in 0..100 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        eprintln!("memcg: could not remove {}", self.dir.display());
    }
}

/// Resident set of `pid` (VmRSS), in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    crate::status_kb(&pid.to_string(), "VmRSS") * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_STAT: &str = "cache 4096\nrss 8192\ninactive_file 1000\nactive_file 2000\ntotal_cache 40960\ntotal_rss 81920\ntotal_inactive_file 30000\ntotal_active_file 10960\n";
    const V2_STAT: &str = "anon 8192\nfile 40960\nkernel 1234\nactive_anon 0\ninactive_file 30000\nactive_file 10960\n";

    #[test]
    fn fields_match_whole_keys_only() {
        assert_eq!(stat_field(V1_STAT, "inactive_file"), Some(1000));
        assert_eq!(stat_field(V1_STAT, "total_inactive_file"), Some(30000));
        assert_eq!(stat_field(V1_STAT, "total_inactive"), None);
        assert_eq!(stat_field("garbage\nx y\n", "x"), None);
    }

    #[test]
    fn working_set_is_usage_less_inactive_file() {
        // v1 takes the hierarchical count, as cAdvisor does.
        assert_eq!(working_set(Version::V1, 100_000, V1_STAT), 70_000);
        assert_eq!(working_set(Version::V2, 100_000, V2_STAT), 70_000);
        // Never below zero, and the whole usage when the field is missing.
        assert_eq!(working_set(Version::V2, 10_000, V2_STAT), 0);
        assert_eq!(working_set(Version::V2, 10_000, "anon 1\n"), 10_000);
    }
}
