//! A block device of the bench's own that reads ahead as a node's disk
//! does, for the binaries whose memory the bench measures.
//!
//! A memory cgroup is charged for the page cache its process reads first,
//! including what the kernel reads ahead around each page fault of the
//! binary. The kernel's default readahead is 128 KiB (`VM_READAHEAD_PAGES`);
//! a disk may say otherwise (this VM's virtio disk reads ahead 8 MiB, which
//! charges an exporter's cgroup for nearly its whole binary at its first
//! faults). So the bench runs both exporters from an ext4 on a loop device
//! set to the default, with direct I/O to its backing file (no second copy
//! in the page cache, and none charged to anyone).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel's default readahead, in KiB.
pub const DEFAULT_READAHEAD_KB: u32 = 128;

/// A mounted ext4 on a loop device; unmounted, detached and removed when
/// dropped.
pub struct Disk {
    image: PathBuf,
    dir: PathBuf,
    device: String,
    mounted: bool,
}

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Disk {
    /// A disk of `mib` MiB reading ahead `readahead_kb`, mounted under
    /// /run (needs root, losetup and mkfs.ext4).
    pub fn new(mib: u64, readahead_kb: u32) -> Result<Disk, String> {
        let tag = format!("na-bench-disk-{}", std::process::id());
        let image = std::env::temp_dir().join(format!("{tag}.img"));
        let dir = PathBuf::from("/run").join(&tag);
        let f = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
        f.set_len(mib << 20).map_err(|e| format!("{}: {e}", image.display()))?;
        drop(f);
        let mut disk = Disk { image, dir, device: String::new(), mounted: false };
        let img = disk.image.to_string_lossy().into_owned();
        run("mkfs.ext4", &["-q", "-F", &img])?;
        disk.device = run("losetup", &["--find", "--show", "--direct-io=on", &img])?;
        let name = disk.device.trim_start_matches("/dev/");
        let ra = format!("/sys/block/{name}/queue/read_ahead_kb");
        std::fs::write(&ra, readahead_kb.to_string()).map_err(|e| format!("{ra}: {e}"))?;
        std::fs::create_dir_all(&disk.dir).map_err(|e| format!("{}: {e}", disk.dir.display()))?;
        let dir = disk.dir.to_string_lossy().into_owned();
        run("mount", &["-t", "ext4", &disk.device, &dir])?;
        disk.mounted = true;
        Ok(disk)
    }

    /// Copies `bin` onto the disk (same file name, executable) and returns
    /// the copy's path. The copy's pages are dropped from the page cache,
    /// so that the first process to run it is charged for them.
    pub fn stage(&self, bin: &Path) -> Result<PathBuf, String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::PermissionsExt;
        let name = bin.file_name().ok_or_else(|| format!("{}: no file name", bin.display()))?;
        let to = self.dir.join(name);
        std::fs::copy(bin, &to).map_err(|e| format!("copy {} to {}: {e}", bin.display(), to.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).map_err(|e| format!("{}: {e}", to.display()))?;
        let f = std::fs::File::open(&to).map_err(|e| format!("{}: {e}", to.display()))?;
        f.sync_all().map_err(|e| format!("{}: {e}", to.display()))?;
        // SAFETY: an advisory call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        Ok(to)
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &[&self.dir.to_string_lossy()]);
        }
        if !self.device.is_empty() {
            let _ = run("losetup", &["-d", &self.device]);
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.image);
    }
}
