//! Thin wrappers over the few system calls node-agent makes directly.

use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

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
        assert_eq!(super::error_label(&e), "no such file or directory");
    }
}
