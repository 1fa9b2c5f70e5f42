//! Thin wrappers over the few system calls node-agent makes directly.

use std::ffi::{CStr, CString};
use std::io;
use std::path::Path;

/// Returns freed heap memory to the system (after an outsized scrape).
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free memory back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// An entry of an ELF object's dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_val: u64,
}

/// Whether an object's dynamic section marks text relocations
/// (`DT_TEXTREL`, or `DF_TEXTREL` in `DT_FLAGS`): its read-only segments
/// were written at load time, so their pages are private copies, not the
/// file's.
///
/// # Safety
/// `dynamic` is the run-time address of the object's `PT_DYNAMIC`, as
/// `dl_iterate_phdr` reports it, `count` entries long at most.
// SAFETY: unsafe because it reads through `dynamic`; the contract is the
// `# Safety` section above, kept by its one caller.
unsafe fn has_text_relocations(dynamic: *const Dyn, count: usize) -> bool {
    const DT_TEXTREL: i64 = 22;
    const DT_FLAGS: i64 = 30;
    const DF_TEXTREL: u64 = 0x4;
    for i in 0..count {
        // SAFETY: within the dynamic section the caller names.
        let d = unsafe { &*dynamic.add(i) };
        match d.d_tag {
            0 => return false,
            DT_TEXTREL => return true,
            DT_FLAGS if d.d_val & DF_TEXTREL != 0 => return true,
            _ => {}
        }
    }
    false
}

/// The byte ranges of the read-only segments (code, constants, unwind and
/// relocation tables) of this executable and of the shared libraries it
/// loaded: whole pages, inside the segment, and never the RELRO data, which
/// sits in a writable segment. The vDSO (no file behind it) and objects
/// with text relocations (their read-only pages were written) are left out.
fn read_only_segments() -> Vec<(usize, usize)> {
    // SAFETY: called by dl_iterate_phdr only, with the pointers it
    // documents; `data` is the Vec passed below.
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr hands a valid info; data is our Vec.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut Vec<(usize, usize)>)) };
        // The executable comes first, named ""; libraries by their path;
        // the vDSO by a bare soname ("linux-vdso.so.1").
        // SAFETY: a NUL-terminated string dl_iterate_phdr owns.
        let name = if info.dlpi_name.is_null() { &[][..] } else { unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes() };
        if info.dlpi_phdr.is_null() || !(name.is_empty() || name.starts_with(b"/")) {
            return 0;
        }
        let page = page_size() as usize;
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let textrel = phdrs.iter().filter(|ph| ph.p_type == libc::PT_DYNAMIC).any(|ph| {
            let dynamic = (info.dlpi_addr + ph.p_vaddr) as *const Dyn;
            // SAFETY: the loaded dynamic section, p_memsz bytes long.
            unsafe { has_text_relocations(dynamic, ph.p_memsz as usize / std::mem::size_of::<Dyn>()) }
        });
        if textrel {
            return 0;
        }
        for ph in phdrs.iter().filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_W == 0) {
            let start = (info.dlpi_addr + ph.p_vaddr) as usize;
            let (lo, hi) = (start.div_ceil(page) * page, (start + ph.p_filesz as usize) / page * page);
            if hi > lo {
                out.push((lo, hi - lo));
            }
        }
        0
    }
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: the callback only reads the headers and pushes to `out`, which
    // outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<(usize, usize)>).cast());
    }
    out
}

/// Unmaps the pages of the read-only segments of this executable and its
/// libraries from the process; returns the bytes advised. Nothing is lost:
/// they are clean pages of the files, which the kernel maps back from the
/// page cache (as it does after reclaiming them under memory pressure) when
/// they run again. Called once start-up is over, it leaves resident the
/// code the scrapes use rather than every page start-up touched (the BTF
/// and ELF parsing, the loaders, the Kubernetes client's set-up, the
/// relocation tables, the dynamic loader's and libc's start-up paths)
/// together with their fault-around neighbours.
pub fn release_read_only_pages() -> io::Result<usize> {
    let mut total = 0;
    for (addr, len) in read_only_segments() {
        // SAFETY: the range is whole pages of a read-only file mapping of
        // this executable or a library without text relocations: dropping
        // them changes no content the process sees.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        total += len;
    }
    Ok(total)
}

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

    /// Resident pages of the files whose mappings `which` picks, from smaps.
    fn file_rss_kib(which: impl Fn(&std::path::Path) -> bool) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut ours = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if line.split_whitespace().next().is_some_and(|f| f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-')) {
                ours = line.split_whitespace().nth(5).is_some_and(|p| which(std::path::Path::new(p)));
            } else if let (true, Some(v)) = (ours, line.strip_prefix("Rss:")) {
                kib += v.trim().trim_end_matches(" kB").parse::<u64>().unwrap();
            }
        }
        kib
    }

    /// The code, constants and relocation tables of the executable and of
    /// libc leave the process's RSS and come back as they run; the
    /// relocated data (RELRO) stays: a dropped GOT or vtable would crash
    /// the calls below.
    #[test]
    fn read_only_pages_are_released_and_code_still_runs() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let is_exe = |p: &std::path::Path| p == exe;
        let is_libc = |p: &std::path::Path| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libc.so"));
        let segments = super::read_only_segments();
        assert!(segments.len() >= 4, "the executable and libc have at least a read-only and a code segment each: {segments:?}");
        // Touch libc's read-only pages so that some are resident for sure.
        assert!(!super::uname().unwrap().sysname.is_empty());
        let before = (file_rss_kib(is_exe), file_rss_kib(is_libc));
        let released = super::release_read_only_pages().unwrap();
        let after = (file_rss_kib(is_exe), file_rss_kib(is_libc));
        assert_eq!(released, segments.iter().map(|s| s.1).sum::<usize>());
        assert!(after.0 < before.0, "resident file pages of the executable: {} KiB before, {} KiB after", before.0, after.0);
        assert!(after.1 < before.1, "resident file pages of libc: {} KiB before, {} KiB after", before.1, after.1);
        // Dynamic dispatch, formatting, the allocator and libc, through the
        // GOT and the relocated vtables.
        let shown: Vec<String> = (0..64).map(|i| format!("{i:x}")).collect();
        assert_eq!(shown.concat().len(), 16 + 48 * 2);
        assert!(!super::uname().unwrap().sysname.is_empty());
    }

    /// The vDSO (no file) is never among the ranges: it is not an object
    /// dl_iterate_phdr names by path.
    #[test]
    fn the_vdso_is_left_alone() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let Some(vdso) = maps.lines().find(|l| l.ends_with("[vdso]")) else { return };
        let range = vdso.split_whitespace().next().unwrap();
        let (lo, hi) = range.split_once('-').unwrap();
        let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
        for (addr, len) in super::read_only_segments() {
            assert!(addr + len <= lo || addr >= hi, "range {addr:#x}+{len:#x} overlaps the vDSO {range}");
        }
    }
}
