//! Network namespaces of a test's own (`ip netns add`), configured with
//! iproute2, entered by one thread; and a sysfs of such a namespace.

use std::os::fd::AsRawFd;
use std::process::Command;

use host::Paths;

/// A named network namespace, deleted when dropped.
pub struct Netns(pub String);

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("na-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        ip(&["netns", "add", &name]);
        Netns(name)
    }

    /// Runs `ip -n <ns> args`.
    pub fn ip(&self, args: &[&str]) {
        let mut v = vec!["-n", &self.0];
        v.extend_from_slice(args);
        ip(&v);
    }

    /// Runs `ip -n <ns> -batch -` over `lines`, one command each.
    pub fn batch(&self, lines: &str) {
        use std::io::Write;
        let mut child =
            Command::new("ip").args(["-n", &self.0, "-batch", "-"]).stdin(std::process::Stdio::piped()).spawn().expect("run ip (iproute2)");
        child.stdin.take().expect("stdin").write_all(lines.as_bytes()).expect("write batch");
        assert!(child.wait().expect("ip -batch").success(), "ip -batch failed");
    }

    /// Runs `f` on a thread that has joined the namespace, with /proc paths
    /// of that thread (so /proc/net is the namespace's).
    pub fn run<T: Send>(&self, f: impl FnOnce(&Paths) -> T + Send) -> T {
        let file = std::fs::File::open(format!("/run/netns/{}", self.0)).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: setns on a valid namespace fd; it changes the
                // namespace of this thread only (CLONE_NEWNET), which the
                // scope joins before returning.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                let paths = Paths {
                    procfs: "/proc/thread-self".into(),
                    sysfs: "/sys".into(),
                    rootfs: "/".into(),
                    udev_data: "/run/udev/data".into(),
                };
                f(&paths)
            })
            .join()
            .expect("netns thread")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `ip args`; panics when it fails (test support).
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Mounts a sysfs of the calling thread's network namespace at `dir`
/// (sysfs shows the devices of its mounter's namespace); unmounted when
/// dropped.
pub struct SysfsMount(std::path::PathBuf);

impl SysfsMount {
    pub fn new(dir: &std::path::Path) -> SysfsMount {
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (src, target, fstype) = (c("sysfs"), c(dir.to_str().expect("utf-8 path")), c("sysfs"));
        // SAFETY: valid NUL-terminated strings that outlive the call; no data.
        let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
        assert_eq!(rc, 0, "mount sysfs: {}", std::io::Error::last_os_error());
        SysfsMount(dir.to_path_buf())
    }
}

impl Drop for SysfsMount {
    fn drop(&mut self) {
        if let Ok(t) = std::ffi::CString::new(self.0.to_string_lossy().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
