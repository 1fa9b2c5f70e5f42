//! Thin wrappers over the few system calls node-agent makes directly.

use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

/// Raises the soft limit of open files to the hard limit (as the Go runtime
/// does for node_exporter); returns the soft limit in force.
pub fn raise_nofile_limit() -> Option<u64> {
    // SAFETY: rlimit is plain data; getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    Some(r.rlim_cur)
}

/// The soft limit of open files.
pub fn nofile_limit() -> Option<u64> {
    // SAFETY: rlimit is plain data; getrlimit fills it.
    let mut r: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid, writable rlimit.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0).then_some(r.rlim_cur)
}

/// The process's open file descriptors. Linux 6.2+ reports their count as
/// the size of /proc/self/fd (one bitmap count in the kernel); older
/// kernels report 0 there, and the directory is listed instead (a dentry
/// built per descriptor: it was the costliest part of these metrics).
pub fn open_fds() -> Option<usize> {
    let fd = Path::new("/proc/self/fd");
    match std::fs::metadata(fd) {
        Ok(m) if m.len() > 0 => Some(m.len() as usize),
        // The listing counts the descriptor it reads through, which is not
        // open otherwise.
        _ => std::fs::read_dir(fd).ok().map(|rd| rd.count().saturating_sub(1)),
    }
}

/// The system page size in bytes.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 {
        v as u64
    } else {
        4096
    }
}

/// The fields of uname(2).
#[derive(Debug, Clone)]
pub struct Uname {
    pub sysname: String,
    pub nodename: String,
    pub release: String,
    pub version: String,
    pub machine: String,
    pub domainname: String,
}

fn field(f: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub fn uname() -> io::Result<Uname> {
    // SAFETY: utsname is plain data; zeroed is a valid value, and uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Uname {
        sysname: field(&u.sysname),
        nodename: field(&u.nodename),
        release: field(&u.release),
        version: field(&u.version),
        machine: field(&u.machine),
        domainname: field(&u.domainname),
    })
}

/// The local time zone's abbreviation and offset from UTC in seconds at `t`.
pub fn local_zone(t: i64) -> (String, i64) {
    let t: libc::time_t = t as libc::time_t;
    // SAFETY: tm is plain data; localtime_r fills it from `t`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the duration of the call.
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    if !ok {
        return ("UTC".into(), 0);
    }
    let zone = if tm.tm_zone.is_null() {
        "UTC".to_string()
    } else {
        // SAFETY: tm_zone points to a NUL-terminated static string owned by libc.
        unsafe { CStr::from_ptr(tm.tm_zone) }.to_string_lossy().into_owned()
    };
    (zone, tm.tm_gmtoff)
}

/// What statfs(2) reports, in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FsStats {
    pub size: f64,
    pub free: f64,
    pub avail: f64,
    pub files: f64,
    pub files_free: f64,
}

pub fn statfs(path: &Path) -> io::Result<FsStats> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statfs is plain data; zeroed is valid and statfs fills it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let bsize = s.f_bsize as f64;
    Ok(FsStats {
        size: s.f_blocks as f64 * bsize,
        free: s.f_bfree as f64 * bsize,
        avail: s.f_bavail as f64 * bsize,
        files: s.f_files as f64,
        files_free: s.f_ffree as f64,
    })
}

/// Whether `path` is on a procfs mount (the kernel's own numbers, not a
/// fixture tree standing in for them).
pub fn is_procfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs is plain data; zeroed is valid and statfs fills it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return false;
    }
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    s.f_type as i64 == PROC_SUPER_MAGIC
}

/// A bounded, lower-case description of an I/O error (the errno text, as Go
/// prints it), suitable for a label value.
pub fn error_label(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            // SAFETY: strerror returns a pointer to a NUL-terminated string.
            let s = unsafe { CStr::from_ptr(libc::strerror(n)) }.to_string_lossy().into_owned();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
                None => s,
            }
        }
        None => "error".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn basics() {
        assert!(super::page_size() >= 4096);
        assert!(!super::uname().unwrap().sysname.is_empty());
        let s = super::statfs(std::path::Path::new("/")).unwrap();
        assert!(s.size > 0.0 && s.free <= s.size);
        let e = super::statfs(std::path::Path::new("/nonexistent/x")).unwrap_err();
        assert!(super::is_procfs(std::path::Path::new("/proc/net")));
        assert!(!super::is_procfs(std::path::Path::new("/")) && !super::is_procfs(std::path::Path::new("/nonexistent")));
        assert_eq!(super::error_label(&e), "no such file or directory");
    }

    #[test]
    fn open_fds_counts_this_processs_descriptors() {
        let before = super::open_fds().expect("count");
        let files: Vec<std::fs::File> = (0..64).map(|_| std::fs::File::open("/dev/null").expect("open")).collect();
        let during = super::open_fds().expect("count");
        drop(files);
        // Other test threads open and close files meanwhile: the 64 show
        // within a margin.
        assert!(during + 16 >= before + 64 && during <= before + 64 + 16, "{before} -> {during} with 64 more open");
        // The directory's listing says the same, less its own descriptor.
        let agrees = (0..50).any(|_| {
            let listed = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
            super::open_fds() == Some(listed.saturating_sub(1))
        });
        assert!(agrees, "the count agrees with a listing of /proc/self/fd");
    }
}
