//! File I/O for collectors: procfs and sysfs files kept open and re-read
//! from offset 0, sysfs directories read with openat, into reused buffers.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::Error;

/// procfs and sysfs files stay open between scrapes and are re-read from
/// offset 0 (the kernel regenerates them for a read at 0): no path walk,
/// open or close per file per scrape. A file is lent to one reader at a
/// time (a concurrent reader opens its own), so two readers never share a
/// file position; a read that fails drops the kept file and retries once
/// on a fresh open (a device that went away and came back). Regular files
/// are never kept (they are replaced by rename). Each kept file holds a
/// [`Slot`] of the one kept-descriptor budget ([`budget_for`]); without
/// one, a file is read and closed.
type Kept = rustc_hash::FxHashMap<std::path::PathBuf, (File, Whole, Slot)>;

fn kept() -> &'static std::sync::Mutex<Kept> {
    static KEPT: std::sync::OnceLock<std::sync::Mutex<Kept>> = std::sync::OnceLock::new();
    KEPT.get_or_init(Default::default)
}

fn take_kept(path: &Path) -> Option<(File, Whole, Slot)> {
    kept().lock().ok()?.remove(path)
}

/// Keeps `f` for the next reader of `path`, in the slot it was kept in
/// before (`slot`) or a new one; closes it when another reader's copy is
/// kept already, when the budget is spent, or when every kept file was
/// released since the slot was taken ([`release_all`]).
fn give_back(path: &Path, f: File, whole: Whole, slot: Option<Slot>) {
    let Ok(mut k) = kept().lock() else { return };
    if k.contains_key(path) {
        return;
    }
    let slot = match slot {
        Some(s) if s.is_current() => s,
        Some(_) => return,
        None => match BUDGET.acquire() {
            Some(s) => s,
            None => return,
        },
    };
    k.insert(path.to_path_buf(), (f, whole, slot));
}

/// At most this many descriptors are kept open between scrapes, however
/// high the open-file limit: each kept sysfs attribute also holds a page of
/// kernel memory (its `seq_file` buffer), charged to the agent's cgroup.
pub const MAX_KEPT: usize = 512;

/// The budget when the open-file limit cannot be read.
const KEPT_WITHOUT_LIMIT: usize = 64;

/// The kept-descriptor budget for an open-file limit (`RLIMIT_NOFILE`'s
/// soft value): a quarter of it, at most [`MAX_KEPT`]; lower still when the
/// agent caps it ([`cap_kept`]) with what its start-up left of the limit
/// (the eBPF object, the listener's connections and a reserve come first:
/// see the agent's `descriptors`).
pub fn budget_for(nofile: Option<u64>) -> usize {
    nofile.map_or(KEPT_WITHOUT_LIMIT, |n| usize::try_from(n / 4).unwrap_or(usize::MAX)).min(MAX_KEPT)
}

/// Keeps at most `n` descriptors open between scrapes (below
/// [`budget_for`]'s share of the limit): the agent's share for kept files,
/// set once at start-up. What collectors kept while they were built, past
/// `n`, is closed (the shared files now, each [`SysDir`]'s at its next
/// read) and kept again within the cap.
pub fn cap_kept(n: usize) {
    if BUDGET.cap_at(n) {
        if let Ok(mut k) = kept().lock() {
            k.clear();
        }
    }
}

/// One budget for every descriptor kept open between scrapes: the kept
/// procfs and sysfs files, and each [`SysDir`]'s directory and attributes.
/// A holder takes a [`Slot`] per descriptor ([`Budget::acquire`]), which
/// gives it back when dropped. When an open fails for want of descriptors
/// (EMFILE, ENFILE), every kept descriptor is released ([`release_all`]):
/// the shared files at once, each `SysDir`'s at its next read (it sees the
/// generation move on).
struct Budget {
    used: AtomicUsize,
    /// The most `used` may reach; `UNSET` until read from the open-file
    /// limit, and again after each release (the limit may have changed).
    limit: AtomicUsize,
    /// The most `limit` may be whatever the open-file limit ([`cap_kept`]).
    cap: AtomicUsize,
    generation: AtomicU64,
    releases: AtomicU64,
}

const UNSET: usize = usize::MAX;

static BUDGET: Budget = Budget::new();

impl Budget {
    const fn new() -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            limit: AtomicUsize::new(UNSET),
            cap: AtomicUsize::new(usize::MAX),
            generation: AtomicU64::new(0),
            releases: AtomicU64::new(0),
        }
    }

    fn limit(&self) -> usize {
        match self.limit.load(Ordering::Relaxed) {
            UNSET => {
                let l = budget_for(crate::sys::nofile_limit()).min(self.cap.load(Ordering::Relaxed));
                self.limit.store(l, Ordering::Relaxed);
                l
            }
            l => l,
        }
    }

    /// A slot of the budget, `None` when it is spent.
    fn acquire(&'static self) -> Option<Slot> {
        let limit = self.limit();
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| (u < limit).then_some(u + 1)).ok()?;
        Some(Slot { budget: self, generation: self.generation() })
    }

    /// A slot whether or not the budget has one left: for the few
    /// descriptors that must stay open to work at all (a mount table's
    /// change mark lives on its open file), counted all the same.
    fn counted(&'static self) -> Slot {
        self.used.fetch_add(1, Ordering::AcqRel);
        Slot { budget: self, generation: self.generation() }
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Moves to a new generation (holders release what they keep), and
    /// reads the open-file limit afresh at the next acquire.
    fn outdate(&self) {
        self.limit.store(UNSET, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Caps the budget at `n`; true when more are kept now (outdated:
    /// their holders close them and keep again within the cap).
    fn cap_at(&self, n: usize) -> bool {
        self.cap.store(n, Ordering::Relaxed);
        self.limit.store(UNSET, Ordering::Relaxed);
        let over = self.used.load(Ordering::Acquire) > n;
        if over {
            self.outdate();
        }
        over
    }

    /// [`Budget::outdate`], counted as a release for want of descriptors.
    fn begin_release(&self) {
        self.releases.fetch_add(1, Ordering::Relaxed);
        self.outdate();
    }
}

/// One kept descriptor's share of the [`Budget`], given back when dropped
/// (with the descriptor it is kept beside).
struct Slot {
    budget: &'static Budget,
    generation: u64,
}

impl Slot {
    /// Taken since the last release.
    fn is_current(&self) -> bool {
        self.generation == self.budget.generation()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The kept-descriptor budget as it stands, for the agent's own metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeptStats {
    /// Descriptors kept open now.
    pub kept: usize,
    /// The most that may be kept.
    pub budget: usize,
    /// How many times all were released because an open ran out of
    /// descriptors.
    pub releases: u64,
}

pub fn kept_stats() -> KeptStats {
    KeptStats { kept: BUDGET.used.load(Ordering::Relaxed), budget: BUDGET.limit(), releases: BUDGET.releases.load(Ordering::Relaxed) }
}

/// Whether an open failed because the process (EMFILE) or the system
/// (ENFILE) has no descriptor left.
fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Releases every descriptor kept in `budget`: the shared files now (the
/// process's budget keeps them), each [`SysDir`]'s at its next read.
/// `cause` is the failed open's error.
fn release_all(budget: &'static Budget, cause: &io::Error) {
    budget.begin_release();
    let shared = if std::ptr::eq(budget, &BUDGET) { kept().lock().map(|mut k| std::mem::take(&mut *k).len()).unwrap_or(0) } else { 0 };
    tracing::warn!(err = %cause, shared, "out of file descriptors: kept proc and sys files released");
}

/// Runs `open`; when it fails for want of descriptors, releases every kept
/// one ([`release_all`]) and runs it once more. For the opens of
/// collectors that are not made through this module (a directory listing).
pub fn retry_out_of_fds<T>(open: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    retry_in(&BUDGET, open)
}

fn retry_in<T>(budget: &'static Budget, mut open: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    match open() {
        Err(e) if out_of_fds(&e) => {
            release_all(budget, &e);
            open()
        }
        r => r,
    }
}

/// Whether a read that returns less than asked is the whole file, so that
/// no read at the end (returning 0) is needed to know it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Whole {
    /// A sysfs attribute: generated whole by one `show`, and returned
    /// whole by a read that has room for it (binary attributes come a page
    /// at a time: a full page is not the end).
    InOneRead,
    /// A procfs file: a `seq_file` returns at most its buffer's worth of
    /// records per read, however much room the read has.
    AtZero,
}

/// Where the file lives: procfs or sysfs (regenerated on every read at 0),
/// and how it ends; `None` for anything else.
fn pseudo_fs(f: &File) -> Option<Whole> {
    use std::os::fd::AsRawFd;
    // SAFETY: statfs is plain data, zeroed is valid; fstatfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a writable statfs.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    match st.f_type as i64 {
        SYSFS_MAGIC => Some(Whole::InOneRead),
        PROC_SUPER_MAGIC => Some(Whole::AtZero),
        _ => None,
    }
}

/// Reads `path` into `buf` (cleared first), keeping its capacity, from a
/// kept file when there is one (see [`Budget`]), straight into the buffer's
/// spare capacity, with no size probing.
pub fn read_into(path: &Path, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    if let Some((f, whole, slot)) = take_kept(path) {
        if pread_all(&f, buf, whole).is_ok() {
            give_back(path, f, whole, Some(slot));
            return Ok(());
        }
        buf.clear();
    }
    let f = open_nonblocking(path)?;
    let kind = pseudo_fs(&f);
    pread_all(&f, buf, kind.unwrap_or(Whole::AtZero))?;
    if let Some(whole) = kind {
        give_back(path, f, whole, None);
    }
    Ok(())
}

/// Opens a file to read with `O_NONBLOCK`: where a FIFO stands in for a
/// proc or sys file, the open returns at once (and the read fails) instead
/// of waiting for a writer; regular files and sysfs attributes ignore it.
/// Out of descriptors, it releases the kept ones and tries once more
/// ([`retry_out_of_fds`]).
pub fn open_nonblocking(path: &Path) -> io::Result<File> {
    retry_out_of_fds(|| open_nonblocking_once(path))
}

fn open_nonblocking_once(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)
}

/// Reads a small proc or sys file as text (see [`open_nonblocking`]).
pub fn read_text(path: &Path) -> io::Result<String> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut open_nonblocking(path)?, &mut s)?;
    Ok(s)
}

/// Reads `f` from offset 0 to its end into `buf`'s spare capacity (no
/// zero-filling of reused buffers); a file read whole in one read (see
/// [`Whole`]) ends at its first short read.
fn pread_all(f: &File, buf: &mut Vec<u8>, whole: Whole) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let start = buf.len();
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(4096.max(buf.capacity()));
        }
        let offset = (buf.len() - start) as libc::off_t;
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory of the given length owned by
        // `buf`; pread(2) initializes the first `n` bytes it reports.
        let n = unsafe { libc::pread(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), offset) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        let asked = spare.len();
        // SAFETY: pread(2) initialized `n` more bytes after the current length.
        unsafe { buf.set_len(buf.len() + n as usize) };
        if whole == Whole::InOneRead && (n as usize) < asked.min(PAGE) {
            return Ok(());
        }
    }
}

/// The page size sysfs binary attributes are read in (x86-64's, arm64's
/// smallest; a larger page only makes more reads look full).
const PAGE: usize = 4096;

/// A mount table (`/proc/PID/mountinfo`) held open. procfs marks such a
/// file with `POLLPRI` once a mount or unmount changes its namespace
/// (proc(5)), so a reader can keep what it parsed until then. Where the
/// file is not on procfs (a fixture tree) nothing says so, and every call
/// counts as a change. Its descriptor counts against the kept budget, and
/// is kept even when that is spent: the mark lives on the open file.
pub struct MountTable {
    file: File,
    pollable: bool,
    _slot: Slot,
}

impl MountTable {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = open_nonblocking(path)?;
        let pollable = pseudo_fs(&file).is_some();
        Ok(MountTable { file, pollable, _slot: BUDGET.counted() })
    }

    /// Whether the table may have changed since the last call (or since
    /// it was opened); resets the kernel's mark. Read it after this.
    pub fn changed(&self) -> bool {
        use std::os::fd::AsRawFd;
        if !self.pollable {
            return true;
        }
        let mut p = libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
        // SAFETY: one valid pollfd for the length given, and no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n != 0
    }

    /// Reads the whole table into `buf` (cleared first).
    pub fn read(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        buf.clear();
        pread_all(&self.file, buf, Whole::AtZero)
    }
}

/// A sysfs directory whose attributes are read one read each (sysfs
/// returns a whole attribute at once). Kept across scrapes, it keeps what
/// the kept-descriptor [`Budget`] allows open: the directory (attributes
/// are then opened relative to it, with openat) and each attribute (re-read
/// from offset 0). Without budget, an attribute is opened by its path, read
/// and closed, as node_exporter does. After a release ([`release_all`]) it
/// closes what it kept at its next read.
pub struct SysDir {
    budget: &'static Budget,
    path: std::path::PathBuf,
    dir: Option<(std::os::fd::OwnedFd, Slot)>,
    /// The directory opened outside the budget (none was left) while one
    /// device's attributes are read: one descriptor at a time, closed by
    /// [`SysDir::end`] (or on drop), so that attributes are still opened
    /// relative to it rather than by their whole path.
    transient: Option<std::os::fd::OwnedFd>,
    attrs: rustc_hash::FxHashMap<String, (File, Slot)>,
    buf: Vec<u8>,
    /// The budget's generation when it last released (or was opened).
    generation: u64,
}

fn open_dir(path: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid NUL-terminated path; the returned fd is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Opens attribute `name` of the directory `dir` to read.
fn open_at(dir: &std::os::fd::OwnedFd, name: &str) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let mut cname = [0u8; 256];
    if name.len() >= cname.len() || name.as_bytes().contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    cname[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `cname` is NUL-terminated; the fd is valid.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), cname.as_ptr().cast(), libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own; closed on drop.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

impl SysDir {
    /// The directory `path`, which must exist; kept open when the budget
    /// allows.
    pub fn open(path: &Path) -> io::Result<SysDir> {
        SysDir::open_in(&BUDGET, path)
    }

    fn open_in(budget: &'static Budget, path: &Path) -> io::Result<SysDir> {
        let fd = retry_in(budget, || open_dir(path))?;
        Ok(SysDir {
            budget,
            path: path.to_path_buf(),
            dir: budget.acquire().map(|slot| (fd, slot)),
            transient: None,
            attrs: Default::default(),
            buf: Vec::with_capacity(4096),
            generation: budget.generation(),
        })
    }

    /// Closes everything kept (the budget was released).
    fn release(&mut self) {
        self.attrs.clear();
        self.dir = None;
        self.transient = None;
        self.generation = self.budget.generation();
    }

    /// The reading of this directory is over for now: the descriptor
    /// opened outside the budget, if any, is closed.
    pub fn end(&mut self) {
        self.transient = None;
    }

    /// Opens attribute `name` afresh: relative to the kept directory, or,
    /// when that fails (the device went away and came back under the same
    /// name), to the directory opened again, kept if the budget allows, or
    /// else held until [`SysDir::end`].
    fn open_attr(&mut self, name: &str) -> io::Result<File> {
        let held = self.dir.as_ref().map(|(fd, _)| fd).or(self.transient.as_ref());
        if let Some(fd) = held {
            match open_at(fd, name) {
                Ok(f) => return Ok(f),
                Err(e) if out_of_fds(&e) => return Err(e),
                Err(_) => (self.dir, self.transient) = (None, None),
            }
        }
        let fd = open_dir(&self.path)?;
        let f = open_at(&fd, name);
        match self.budget.acquire() {
            Some(slot) => self.dir = Some((fd, slot)),
            None => self.transient = Some(fd),
        }
        f
    }

    fn read_attr(f: &File, buf: &mut Vec<u8>) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        buf.clear();
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` is writable memory owned by the buffer; pread(2)
        // initializes the first `n` bytes it reports.
        let n = unsafe { libc::pread(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pread(2) initialized `n` bytes.
        unsafe { buf.set_len(n as usize) };
        Ok(())
    }

    /// The attribute `name`, trimmed; `None` when it can't be read. An
    /// attribute that exists but has no value now (EINVAL for the speed of
    /// a link that is down) stays open; one whose device went away (ENODEV)
    /// is opened afresh, with the directory if need be. Out of descriptors,
    /// every kept one is released (this directory's too) and the open tried
    /// once more.
    pub fn read(&mut self, name: &str) -> Option<&str> {
        if self.generation != self.budget.generation() {
            self.release();
        }
        let kept = match self.attrs.get(name) {
            Some((f, _)) => match Self::read_attr(f, &mut self.buf) {
                Ok(()) => true,
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) || e.raw_os_error() == Some(libc::ESTALE) => false,
                Err(_) => return None,
            },
            None => false,
        };
        if !kept {
            self.attrs.remove(name);
            let f = match self.open_attr(name) {
                Ok(f) => f,
                Err(e) if out_of_fds(&e) => {
                    release_all(self.budget, &e);
                    self.release();
                    self.open_attr(name).ok()?
                }
                Err(_) => return None,
            };
            let res = Self::read_attr(&f, &mut self.buf);
            if let Some(slot) = self.budget.acquire() {
                self.attrs.insert(name.to_string(), (f, slot));
            }
            res.ok()?;
        }
        std::str::from_utf8(&self.buf).ok().map(str::trim)
    }

    pub fn read_i64(&mut self, name: &str) -> Option<i64> {
        self.read(name)?.parse().ok()
    }

    pub fn read_u64(&mut self, name: &str) -> Option<u64> {
        self.read(name)?.parse().ok()
    }
}

/// How much procfs's `util.SysReadFile` reads of a sysfs attribute.
pub const SYS_READ_MAX: usize = 128;

/// Where [`sys_read_file`] failed: procfs's callers treat a failed open and
/// a failed read apart.
#[derive(Debug, thiserror::Error)]
pub enum SysReadError {
    #[error("open: {0}")]
    Open(#[source] io::Error),
    #[error("read: {0}")]
    Read(#[source] io::Error),
}

impl SysReadError {
    /// The I/O error, whichever step it came from.
    pub fn into_io(self) -> io::Error {
        match self {
            SysReadError::Open(e) | SysReadError::Read(e) => e,
        }
    }
}

/// procfs's `util.SysReadFile`: opens `path` (see [`open_nonblocking`]) and
/// reads it once, at most [`SYS_READ_MAX`] bytes, as they are (untrimmed,
/// not decoded).
pub fn sys_read_file(path: &Path) -> Result<Vec<u8>, SysReadError> {
    let mut f = open_nonblocking(path).map_err(SysReadError::Open)?;
    let mut buf = vec![0u8; SYS_READ_MAX];
    let n = std::io::Read::read(&mut f, &mut buf).map_err(SysReadError::Read)?;
    buf.truncate(n);
    Ok(buf)
}

/// The names in directory `path`, sorted (lossily made UTF-8); a missing
/// directory is [`Error::NoData`], and any other failure of the listing an
/// error.
pub fn sorted_names(path: &Path) -> Result<Vec<String>, Error> {
    let rd = std::fs::read_dir(path).map_err(|e| Error::from_read(path, e))?;
    let mut names = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(path, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort_unstable();
    Ok(names)
}

/// Reads `path` into `buf`; a missing file is [`Error::NoData`].
pub fn read_file(path: &Path, buf: &mut Vec<u8>) -> Result<(), Error> {
    read_into(path, buf).map_err(|e| Error::from_read(path, e))
}

/// Reads `path` into `buf`; unlike [`read_file`], a missing file is an
/// [`Error::Io`], not no data (node_exporter fails the collector).
pub fn read_required(path: &Path, buf: &mut Vec<u8>) -> Result<(), Error> {
    read_into(path, buf).map_err(|e| Error::io(path, e))
}

/// Reads a small sysfs attribute, trimmed. `None` when it can't be read.
pub fn read_trimmed(path: &Path) -> Option<String> {
    let mut buf = Vec::with_capacity(256);
    read_into(path, &mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).trim().to_string())
}

/// Reads a sysfs attribute as an unsigned integer.
pub fn read_u64(path: &Path) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

/// Reads a sysfs attribute as a signed integer.
pub fn read_i64(path: &Path) -> Option<i64> {
    read_trimmed(path)?.parse().ok()
}

/// Reads a sysfs attribute as a number, as procfs's `ReadUintFromFile`
/// callers do: an absent or forbidden file is `None`, any other read
/// error and a value that is not a number are errors.
pub fn read_number<T: std::str::FromStr>(path: &Path) -> Result<Option<T>, crate::Error> {
    let mut buf = Vec::with_capacity(64);
    match read_into(path, &mut buf) {
        Ok(_) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied) => return Ok(None),
        Err(e) => return Err(crate::Error::from_read(path, e)),
    }
    let text = String::from_utf8_lossy(&buf);
    text.trim().parse().map(Some).map_err(|_| crate::Error::parse(path, format!("not a number: {:?}", text.trim())))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::Ordering;

    /// A budget of its own for a test, of `limit` descriptors.
    fn budget(limit: usize) -> &'static super::Budget {
        let b: &'static super::Budget = Box::leak(Box::new(super::Budget::new()));
        b.limit.store(limit, Ordering::Relaxed);
        b
    }

    fn used(b: &super::Budget) -> usize {
        b.used.load(Ordering::Relaxed)
    }

    /// A directory of attributes `a0` .. `a{n-1}`, each holding its number.
    fn attrs(n: usize) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for i in 0..n {
            std::fs::write(d.path().join(format!("a{i}")), format!("{i}\n")).unwrap();
        }
        d
    }

    #[test]
    fn the_budget_is_a_quarter_of_the_open_file_limit_at_most_max_kept() {
        assert_eq!(super::budget_for(None), 64);
        assert_eq!(super::budget_for(Some(0)), 0);
        assert_eq!(super::budget_for(Some(1024)), 256);
        assert_eq!(super::budget_for(Some(2047)), 511);
        assert_eq!(super::budget_for(Some(4096)), super::MAX_KEPT);
        assert_eq!(super::budget_for(Some(u64::MAX)), super::MAX_KEPT);
    }

    /// The agent's cap (what its start-up left of the open-file limit)
    /// holds below a quarter of the limit, and again after a release reads
    /// the limit afresh.
    #[test]
    fn a_cap_lowers_the_budget_and_outlives_a_release() {
        let b = budget(super::UNSET);
        let quarter = super::budget_for(crate::sys::nofile_limit());
        assert_eq!(b.limit(), quarter, "uncapped: a quarter of the limit");
        assert!(!b.cap_at(3), "nothing kept yet");
        assert_eq!(b.limit(), quarter.min(3));
        let slots: Vec<_> = std::iter::from_fn(|| b.acquire()).take(10).collect();
        assert_eq!(slots.len(), quarter.min(3));
        b.begin_release();
        assert_eq!(b.limit(), quarter.min(3), "still capped after a release");
    }

    /// Kept while the collectors were built, past the cap set afterwards:
    /// closed at the holder's next read, and kept again within the cap.
    #[test]
    fn a_cap_below_what_is_kept_closes_the_rest() {
        let d = attrs(3);
        let b = budget(super::UNSET);
        let mut s = super::SysDir::open_in(b, d.path()).unwrap();
        assert_eq!((s.read_u64("a1"), s.read_u64("a2")), (Some(1), Some(2)));
        assert_eq!(used(b), 3);
        assert!(b.cap_at(1), "three kept, one allowed");
        assert_eq!(s.read_u64("a0"), Some(0));
        assert_eq!((used(b), s.attrs.len()), (1, 0), "the directory alone kept");
        assert_eq!(b.releases.load(Ordering::Relaxed), 0, "not a release for want of descriptors");
    }

    #[test]
    fn slots_go_back_when_dropped_and_none_are_given_past_the_limit() {
        let b = budget(2);
        let (s1, s2) = (b.acquire().unwrap(), b.acquire().unwrap());
        assert!(b.acquire().is_none(), "the budget is spent");
        let forced = b.counted();
        assert_eq!(used(b), 3, "a descriptor that must stay open counts all the same");
        drop(s1);
        assert!(b.acquire().is_none(), "still at the limit with the counted one");
        drop(forced);
        let s3 = b.acquire().unwrap();
        assert!(s2.is_current() && s3.is_current());
        b.begin_release();
        assert!(!s2.is_current() && !s3.is_current(), "a release outdates every slot");
        drop((s2, s3));
        assert_eq!(used(b), 0);
    }

    #[test]
    fn a_sys_dir_keeps_what_its_budget_allows_and_reads_the_rest_relative_to_it() {
        let d = attrs(3);
        let none = budget(0);
        let mut s = super::SysDir::open_in(none, d.path()).unwrap();
        for i in 0..3 {
            assert_eq!(s.read_u64(&format!("a{i}")), Some(i as u64));
        }
        assert!(s.dir.is_none() && s.attrs.is_empty() && used(none) == 0, "nothing kept without budget");
        assert!(s.transient.is_some(), "the directory held outside the budget while it is read");
        s.end();
        assert!(s.transient.is_none(), "and closed when its reading ends");
        std::fs::write(d.path().join("a0"), "10\n").unwrap();
        assert_eq!(s.read_u64("a0"), Some(10), "read afresh");
        assert_eq!(s.read("absent"), None);

        let three = budget(3);
        let mut s = super::SysDir::open_in(three, d.path()).unwrap();
        for (i, want) in [10, 1, 2].into_iter().enumerate() {
            assert_eq!(s.read_u64(&format!("a{i}")), Some(want));
        }
        assert!(s.dir.is_some() && s.attrs.len() == 2 && used(three) == 3, "the directory and two attributes kept");
        assert_eq!(s.read_u64("a2"), Some(2), "the third read by path, every time");
        assert_eq!(s.read("absent"), None);
        assert_eq!(used(three), 3);
        drop(s);
        assert_eq!(used(three), 0, "a dropped SysDir gives its slots back");
    }

    #[test]
    fn after_a_release_a_sys_dir_closes_what_it_kept_at_its_next_read() {
        let d = attrs(3);
        let b = budget(8);
        let mut s = super::SysDir::open_in(b, d.path()).unwrap();
        assert_eq!((s.read_u64("a1"), s.read_u64("a2")), (Some(1), Some(2)));
        assert_eq!(used(b), 3);
        b.begin_release();
        b.limit.store(8, Ordering::Relaxed);
        assert_eq!(used(b), 3, "kept until its next read");
        assert_eq!(s.read_u64("a0"), Some(0));
        assert_eq!((used(b), s.attrs.len()), (2, 1), "the directory and the attribute read since");
    }

    #[test]
    fn out_of_descriptors_every_kept_one_is_released_and_the_open_tried_once_more() {
        let b = budget(4);
        let emfile = || std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut calls = 0;
        let r = super::retry_in(b, || {
            calls += 1;
            if calls == 1 {
                Err(emfile())
            } else {
                Ok(7)
            }
        });
        assert_eq!((r.unwrap(), calls), (7, 2));
        assert_eq!((b.releases.load(Ordering::Relaxed), b.generation()), (1, 1));
        let mut calls = 0;
        let r = super::retry_in(b, || -> std::io::Result<()> {
            calls += 1;
            Err(std::io::Error::from_raw_os_error(libc::ENFILE))
        });
        assert!(r.is_err() && calls == 2, "tried once more, not again");
        let mut calls = 0;
        let r = super::retry_in(b, || -> std::io::Result<()> {
            calls += 1;
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        });
        assert!(r.is_err() && calls == 1, "other errors are not retried");
        assert_eq!(b.releases.load(Ordering::Relaxed), 2);
    }

    /// With every descriptor of the process taken, a SysDir's read releases
    /// what is kept and succeeds, and so does a shared file's. Run in a
    /// child process of its own (this test binary again), whose open-file
    /// limit it lowers.
    #[test]
    fn reads_succeed_when_the_process_runs_out_of_descriptors() {
        const CHILD: &str = "NODE_AGENT_IO_EMFILE_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "io::tests::reads_succeed_when_the_process_runs_out_of_descriptors", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        // Room for what is open now, the test's 40 files and a few more.
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        let lim = libc::rlimit { rlim_cur: open + 64, rlim_max: open + 64 };
        // SAFETY: a valid rlimit; lowering needs no privilege.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        let d = attrs(40);
        let global = &super::BUDGET;
        global.limit.store(30, Ordering::Relaxed);
        let mut s = super::SysDir::open(d.path()).unwrap();
        for i in 0..28 {
            assert_eq!(s.read_u64(&format!("a{i}")), Some(i as u64));
        }
        let mut buf = Vec::new();
        super::read_into(Path::new("/proc/self/stat"), &mut buf).unwrap();
        assert_eq!((used(global), s.attrs.len()), (30, 28), "the budget is spent");
        // Take every descriptor left.
        let mut filler = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            filler.push(f);
            assert!(filler.len() < 64, "the open-file limit holds");
        }
        assert_eq!(std::fs::File::open("/dev/null").unwrap_err().raw_os_error(), Some(libc::EMFILE));
        // Not kept: its open fails, everything kept is released, the open is tried again.
        assert_eq!(s.read_u64("a39"), Some(39));
        assert_eq!(global.releases.load(Ordering::Relaxed), 1);
        assert!(super::kept().lock().unwrap().is_empty(), "the shared files were released");
        assert!(used(global) <= 2, "{} kept after the release", used(global));
        // A shared file reads as well (a descriptor is free again).
        drop(filler.pop());
        super::read_into(Path::new("/proc/self/status"), &mut buf).unwrap();
        assert!(buf.starts_with(b"Name:"));
    }

    /// procfs flags a mount and an unmount on a kept mount table, and only
    /// then (mounts a tmpfs in this namespace: root only; CI runs as root).
    #[test]
    fn mount_table_says_when_the_mounts_changed() {
        let d = tempfile::tempdir().unwrap();
        let t = super::MountTable::open(Path::new("/proc/self/mountinfo")).unwrap();
        let mut buf = Vec::new();
        t.read(&mut buf).unwrap();
        assert!(!buf.is_empty());
        let target = std::ffi::CString::new(d.path().as_os_str().as_encoded_bytes()).unwrap();
        let mount = || {
            // SAFETY: NUL-terminated strings that outlive the call; no data.
            unsafe { libc::mount(c"none".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) }
        };
        // Mounts elsewhere on this machine are not in this test's control:
        // each step is retried until it shows alone.
        let mut rounds = 0;
        loop {
            rounds += 1;
            let quiet = !t.changed();
            if mount() != 0 {
                let e = std::io::Error::last_os_error();
                assert!(std::env::var_os("CI").is_none(), "mount a tmpfs: {e}");
                eprintln!("skipped: cannot mount a tmpfs here ({e})");
                return;
            }
            let after_mount = t.changed();
            let then_quiet = !t.changed();
            t.read(&mut buf).unwrap();
            let listed = String::from_utf8_lossy(&buf).contains(&*d.path().to_string_lossy());
            // SAFETY: a NUL-terminated path that outlives the call.
            assert_eq!(unsafe { libc::umount(target.as_ptr()) }, 0, "unmount: {}", std::io::Error::last_os_error());
            let after_umount = t.changed();
            assert!(after_mount && after_umount && listed, "a mount and an unmount are flagged, and the read shows the mount");
            if quiet && then_quiet {
                break;
            }
            assert!(rounds < 20, "the table is flagged changed with no mount in between, 20 times over");
        }
        // A regular file says nothing: it always counts as changed.
        let f = d.path().join("mountinfo");
        std::fs::write(&f, "x").unwrap();
        let t = super::MountTable::open(&f).unwrap();
        assert!(t.changed() && t.changed());
    }

    #[test]
    fn numbers_absent_present_and_malformed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("ok"), "42\n").unwrap();
        std::fs::write(d.path().join("bad"), "x\n").unwrap();
        assert_eq!(super::read_number::<u64>(&d.path().join("ok")).unwrap(), Some(42));
        assert_eq!(super::read_number::<u64>(&d.path().join("absent")).unwrap(), None);
        assert!(super::read_number::<u64>(&d.path().join("bad")).is_err());
    }

    #[test]
    fn kept_proc_files_are_regenerated_on_every_read() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        // Uptime in hundredths of a second: it changes every 10 ms.
        let p = Path::new("/proc/uptime");
        super::read_into(p, &mut a).unwrap();
        assert!(super::kept().lock().unwrap().contains_key(p), "procfs files are kept");
        std::thread::sleep(std::time::Duration::from_millis(30));
        super::read_into(p, &mut b).unwrap();
        assert_ne!(a, b, "a kept file re-read from offset 0 shows new values");
        let fresh = std::fs::read(p).unwrap();
        assert!(!b.is_empty() && !fresh.is_empty());
    }

    #[test]
    fn files_larger_than_a_read_are_read_whole() {
        // A sysfs attribute ends at its first short read; a binary one comes
        // a page per read (the kernel's BTF: megabytes), and a procfs
        // seq_file a buffer's worth of records per read, short of the room
        // given: all must be read to their end.
        let mut buf = Vec::new();
        for p in ["/sys/kernel/btf/vmlinux", "/sys/kernel/btf/vmlinux", "/proc/self/mountinfo", "/sys/class/net/lo/mtu"] {
            let p = Path::new(p);
            let Ok(want) = std::fs::read(p) else { continue };
            super::read_into(p, &mut buf).unwrap();
            assert_eq!(buf.len(), want.len(), "{}", p.display());
            assert!(buf == want, "{}", p.display());
        }
        // Our own smaps changes as we read it: check it is whole instead
        // of equal (every mapping's entry ends with its VmFlags line).
        let p = Path::new("/proc/self/smaps");
        super::read_into(p, &mut buf).unwrap();
        assert!(buf.len() > 2 * super::PAGE, "{} bytes", buf.len());
        let text = String::from_utf8_lossy(&buf);
        let is_range = |l: &str| {
            l.split(' ')
                .next()
                .and_then(|r| r.split_once('-'))
                .is_some_and(|(a, b)| u64::from_str_radix(a, 16).is_ok() && u64::from_str_radix(b, 16).is_ok())
        };
        let mappings = text.lines().filter(|l| is_range(l)).count();
        assert_eq!(text.matches("\nVmFlags:").count(), mappings, "every mapping read to its end");
        assert!(text.lines().last().is_some_and(|l| l.starts_with("VmFlags:")));
    }

    #[test]
    fn regular_files_are_never_kept_so_a_replaced_file_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.prom");
        std::fs::write(&p, "one").unwrap();
        let mut buf = Vec::new();
        super::read_into(&p, &mut buf).unwrap();
        assert!(!super::kept().lock().unwrap().contains_key(&p));
        let tmp = dir.path().join("f.tmp");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        super::read_into(&p, &mut buf).unwrap();
        assert_eq!(buf, b"two");
    }

    #[test]
    fn kept_sysfs_attributes_follow_the_device() {
        let Ok(mut d) = super::SysDir::open(Path::new("/sys/class/net/lo/statistics")) else { return };
        let before: u64 = d.read_u64("tx_packets").unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..10 {
            sock.send_to(b"x", sock.local_addr().unwrap()).unwrap();
        }
        let after: u64 = d.read_u64("tx_packets").unwrap();
        assert!(after >= before + 10, "{before} -> {after}");
        assert_eq!(d.attrs.len(), 1, "the attribute stays open");
        assert_eq!(d.read("no_such_attribute"), None);
    }

    #[test]
    fn sys_read_file_reads_once_and_tells_open_from_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("attr");
        std::fs::write(&p, format!("{}\n", "x".repeat(200))).unwrap();
        let b = super::sys_read_file(&p).unwrap();
        assert_eq!(b.len(), super::SYS_READ_MAX);
        std::fs::write(&p, "42\n").unwrap();
        assert_eq!(super::sys_read_file(&p).unwrap(), b"42\n");
        let missing = super::sys_read_file(&dir.path().join("none")).unwrap_err();
        assert!(matches!(&missing, super::SysReadError::Open(e) if e.kind() == std::io::ErrorKind::NotFound), "{missing}");
        // A directory opens but does not read (EISDIR).
        assert!(matches!(super::sys_read_file(dir.path()), Err(super::SysReadError::Read(_))));
    }

    #[test]
    fn read_required_fails_on_a_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut buf = Vec::new();
        assert!(matches!(super::read_required(&p, &mut buf), Err(crate::Error::Io { .. })));
        assert!(super::read_file(&p, &mut buf).unwrap_err().is_no_data(), "read_file: no data");
        std::fs::write(&p, "x").unwrap();
        super::read_required(&p, &mut buf).unwrap();
        assert_eq!(buf, b"x");
    }

    #[test]
    fn sorted_names_lists_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b", "a", "c"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        assert_eq!(super::sorted_names(dir.path()).unwrap(), ["a", "b", "c"]);
        assert!(super::sorted_names(&dir.path().join("none")).unwrap_err().is_no_data());
        assert!(matches!(super::sorted_names(&dir.path().join("a")), Err(crate::Error::Io { .. })));
    }
}
