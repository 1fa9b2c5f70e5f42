//! Ground truth from the host for the eBPF truth tests: /proc/vmstat,
//! /proc/diskstats, loop devices, and the root check.

/// Whether the test can run (root); outside CI it skips with a message
/// naming `what`, in CI it fails.
pub fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "{what} must run as root in CI");
    eprintln!("SKIP: {what} need root");
    false
}

/// Whether the running kernel is at least `major.minor`. When it is not,
/// the test skips, saying what needs which kernel (also in CI: the kernel
/// matrix runs the suites on older kernels, and docs/kernels.md lists such
/// skips with this reason). Only for what docs/ebpf.md says needs that
/// kernel.
#[cfg(feature = "agent")]
pub fn kernel_or_skip(major: u32, minor: u32, what: &str) -> bool {
    let k = node_agent::ebpf::kernel::Kernel::get();
    if k.at_least(major, minor) {
        return true;
    }
    eprintln!("SKIP: {what} needs Linux {major}.{minor} or later (this is {})", k.release);
    false
}

/// A /proc/vmstat counter.
pub fn vmstat(field: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// The numeric fields of a device's /proc/diskstats line (reads completed
/// first, sectors read third, writes completed fifth, sectors written
/// seventh).
pub fn diskstats(dev: &str) -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&dev))
        .map(|f| f[3..].iter().map(|v| v.parse().unwrap_or(0)).collect())
        .unwrap_or_else(|| panic!("{dev} not in /proc/diskstats"))
}

/// A loop device over a 64 MiB file in /var/tmp, with direct I/O (so its
/// requests are the test's own); detached when dropped.
pub struct Loop {
    pub dev: String,
    _file: tempfile::NamedTempFile,
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup").args(["-d", &format!("/dev/{}", self.dev)]).status();
    }
}

pub fn loop_device() -> Loop {
    let file = tempfile::NamedTempFile::new_in("/var/tmp").expect("backing file");
    file.as_file().set_len(64 << 20).expect("size");
    let out =
        std::process::Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(file.path()).output().expect("losetup");
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Loop { dev: path.trim_start_matches("/dev/").to_string(), _file: file }
}
