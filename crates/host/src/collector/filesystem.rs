//! `filesystem`: size, free space and inodes of mounted filesystems.
//!
//! Mounts come from pid 1's mountinfo (falling back to our own), statfs runs
//! under `--path.rootfs`. Every statfs runs on a small pool of worker threads
//! with a deadline (`--collector.filesystem.mount-timeout`): a mount that does
//! not answer in time (a dead NFS server, a hung FUSE daemon) is reported with
//! `node_filesystem_device_error 1` and skipped in later scrapes until its
//! pending statfs returns, so it can never hang a scrape.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Arg;

use crate::flags::{self, DurationFlag, Flags, IntFlag, StringFlag};

use crate::filter::DeviceFilter;
use crate::sys::{self, FsStats};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

/// The label node_exporter gives a mount whose statfs timed out.
pub const TIMEOUT_LABEL: &str = "mountpoint timeout";
/// Upper bound on statfs threads, counting replacements for hung ones.
const MAX_WORKERS: usize = 32;

pub const MOUNT_POINTS_EXCLUDE: StringFlag = StringFlag {
    name: "collector.filesystem.mount-points-exclude",
    default: "^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)",
    help: "Regexp of mount points to exclude for filesystem collector.",
};
pub const MOUNT_POINTS_INCLUDE: StringFlag = StringFlag {
    name: "collector.filesystem.mount-points-include",
    default: "",
    help: "Regexp of mount points to include for filesystem collector (mutually exclusive to mount-points-exclude).",
};
pub const FS_TYPES_EXCLUDE: StringFlag = StringFlag {
    name: "collector.filesystem.fs-types-exclude",
    default: "^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|squashfs|erofs|sysfs|tracefs)$",
    help: "Regexp of filesystem types to exclude for filesystem collector.",
};
pub const FS_TYPES_INCLUDE: StringFlag = StringFlag {
    name: "collector.filesystem.fs-types-include",
    default: "",
    help: "Regexp of filesystem types to include for filesystem collector (mutually exclusive to fs-types-exclude).",
};
pub const MOUNT_TIMEOUT: DurationFlag = DurationFlag {
    name: "collector.filesystem.mount-timeout",
    default: "5s",
    help: "how long to wait for a mount to respond before marking it as stale",
};
pub const STAT_WORKERS: IntFlag<usize> =
    IntFlag { name: "collector.filesystem.stat-workers", default: 4, help: "how many stat calls to process simultaneously" };

/// The collector's flags, parsed once.
pub struct Options {
    pub mount_points: DeviceFilter,
    pub fs_types: DeviceFilter,
    pub timeout: Duration,
    pub workers: usize,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&MOUNT_POINTS_EXCLUDE, &MOUNT_POINTS_INCLUDE, &FS_TYPES_EXCLUDE, &FS_TYPES_INCLUDE, &MOUNT_TIMEOUT, &STAT_WORKERS])
    }

    /// The exclude patterns may be given as the deprecated
    /// `--collector.filesystem.ignored-*`.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let timeout = MOUNT_TIMEOUT.get(f)?;
        if timeout.is_zero() {
            return Err(MOUNT_TIMEOUT.invalid("must be above zero"));
        }
        let workers = STAT_WORKERS.get(f)?;
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(STAT_WORKERS.invalid(format!("must be a number from 1 to {MAX_WORKERS}, got {workers}")));
        }
        Ok(Options {
            mount_points: flags::filter(f, &MOUNT_POINTS_EXCLUDE, &MOUNT_POINTS_INCLUDE)?,
            fs_types: flags::filter(f, &FS_TYPES_EXCLUDE, &FS_TYPES_INCLUDE)?,
            timeout,
            workers,
        })
    }
}

/// One mount from mountinfo.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub major: String,
    pub minor: String,
    pub mount_point: String,
    pub fstype: String,
    pub device: String,
    pub read_only: bool,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/PID/mountinfo.
pub fn parse_mountinfo(text: &str) -> Result<Vec<Mount>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let sep = f.iter().position(|x| *x == "-").ok_or_else(|| format!("line {}: no separator", n + 1))?;
        if sep < 6 || f.len() < sep + 3 {
            return Err(format!("line {}: too few fields", n + 1));
        }
        let (major, minor) = f[2].split_once(':').ok_or_else(|| format!("line {}: bad major:minor", n + 1))?;
        let opts = f[5];
        let super_opts = f.get(sep + 3).copied().unwrap_or("");
        let read_only = opts.split(',').any(|o| o == "ro") || super_opts.split(',').any(|o| o == "ro");
        out.push(Mount {
            major: major.to_string(),
            minor: minor.to_string(),
            mount_point: unescape(f[4]),
            fstype: f[sep + 1].to_string(),
            device: unescape(f[sep + 2]),
            read_only,
        });
    }
    Ok(out)
}

type Reply = (usize, io::Result<FsStats>);

struct Job {
    index: usize,
    key: String,
    path: PathBuf,
    reply: Sender<Reply>,
}

/// Worker threads running statfs, and the mounts whose statfs is overdue.
struct Pool {
    jobs: Sender<Job>,
    queue: Arc<Mutex<Receiver<Job>>>,
    stuck: Arc<Mutex<HashSet<String>>>,
    workers: usize,
}

impl Pool {
    fn new(workers: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let mut p = Pool { jobs: tx, queue: Arc::new(Mutex::new(rx)), stuck: Arc::new(Mutex::new(HashSet::new())), workers: 0 };
        for _ in 0..workers {
            p.spawn();
        }
        p
    }

    fn spawn(&mut self) {
        let queue = Arc::clone(&self.queue);
        let stuck = Arc::clone(&self.stuck);
        let spawned = std::thread::Builder::new().name("statfs".into()).spawn(move || loop {
            let job = {
                let Ok(q) = queue.lock() else { return };
                match q.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            };
            let res = sys::statfs(&job.path);
            // Clear a timed-out mark and answer under the lock, so the
            // scrape that gives up on us sees either the answer or the mark.
            let Ok(mut s) = stuck.lock() else { return };
            if s.remove(&job.key) {
                tracing::info!(mountpoint = %job.key, "mount point responds again");
            }
            let _ = job.reply.send((job.index, res));
            drop(s);
        });
        match spawned {
            Ok(_) => self.workers += 1,
            Err(e) => tracing::warn!(err = %e, "cannot start statfs worker"),
        }
    }
}

pub struct Collector {
    procfs: PathBuf,
    rootfs: PathBuf,
    mount_points: crate::filter::DeviceFilter,
    fs_types: crate::filter::DeviceFilter,
    timeout: Duration,
    pool: Pool,
    text: Vec<u8>,
    /// The mount table read last, kept open while it says nothing changed,
    /// and the mounts selected from it then.
    table: Option<(crate::io::MountTable, PathBuf)>,
    selected: Vec<(Mount, String)>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector {
            procfs: p.procfs.clone(),
            rootfs: p.rootfs.clone(),
            mount_points: o.mount_points,
            fs_types: o.fs_types,
            timeout: o.timeout,
            pool: Pool::new(o.workers),
            text: Vec::new(),
            table: None,
            selected: Vec::new(),
        })
    }

    /// Opens pid 1's mount table (falling back to our own) and reads it.
    fn open_mounts(&mut self) -> Result<(crate::io::MountTable, PathBuf), Error> {
        let one = self.procfs.join("1/mountinfo");
        match crate::io::MountTable::open(&one).and_then(|t| t.read(&mut self.text).map(|()| t)) {
            Ok(t) => Ok((t, one)),
            Err(e) => {
                tracing::debug!(path = %one.display(), err = %e, "reading pid 1 mountinfo failed, falling back to self");
                let own = self.procfs.join("self/mountinfo");
                let t = crate::io::MountTable::open(&own).and_then(|t| t.read(&mut self.text).map(|()| t));
                Ok((t.map_err(|e| Error::from_read(&own, e))?, own))
            }
        }
    }

    /// The mounts to report, re-read and re-selected only when the mount
    /// table changed (a kept table that fails to read is reopened).
    fn refresh_mounts(&mut self) -> Result<(), Error> {
        let (table, path) = match self.table.take() {
            Some((t, path)) if !t.changed() => {
                self.table = Some((t, path));
                return Ok(());
            }
            Some((t, path)) if t.read(&mut self.text).is_ok() => (t, path),
            _ => self.open_mounts()?,
        };
        let text = std::str::from_utf8(&self.text).map_err(|_| Error::parse(&path, "invalid UTF-8"))?;
        let mounts = parse_mountinfo(text).map_err(|m| Error::parse(&path, m))?;
        let mut seen = HashSet::new();
        self.selected.clear();
        for m in mounts {
            let label = self.label_mount_point(&m.mount_point);
            if self.mount_points.ignored(&label) || self.fs_types.ignored(&m.fstype) {
                continue;
            }
            if !seen.insert((m.device.clone(), label.clone(), m.fstype.clone())) {
                continue;
            }
            self.selected.push((m, label));
        }
        // Our own table stands in for pid 1's only until pid 1's reads
        // again: not kept.
        if path.ends_with("1/mountinfo") {
            self.table = Some((table, path));
        }
        Ok(())
    }

    /// The mount point as node_exporter labels it: without the rootfs prefix.
    fn label_mount_point(&self, mp: &str) -> String {
        let root = self.rootfs.to_string_lossy();
        if root == "/" {
            return mp.to_string();
        }
        match mp.strip_prefix(root.trim_end_matches('/')) {
            Some("") => "/".into(),
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => mp.to_string(),
        }
    }
}

fn statfs_path(rootfs: &Path, mp: &str) -> PathBuf {
    rootfs.join(mp.trim_start_matches('/'))
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        self.refresh_mounts()?;
        let selected = &self.selected;

        // Submit every statfs that isn't known to hang, then wait until the deadline.
        let (tx, rx) = mpsc::channel::<Reply>();
        let mut results: Vec<Option<Result<FsStats, String>>> = vec![None; selected.len()];
        let mut pending = 0usize;
        {
            let stuck = self.pool.stuck.lock().map_err(|_| Error::NoData("statfs pool poisoned".into()))?;
            for (i, (_, label)) in selected.iter().enumerate() {
                if stuck.contains(label) {
                    tracing::debug!(mountpoint = %label, "mount point is in an unresponsive state, skipping");
                    results[i] = Some(Err(TIMEOUT_LABEL.to_string()));
                    continue;
                }
                // The label is the host path (any rootfs prefix stripped): stat it under rootfs.
                let job = Job { index: i, key: label.clone(), path: statfs_path(&self.rootfs, label), reply: tx.clone() };
                if self.pool.jobs.send(job).is_ok() {
                    pending += 1;
                }
            }
        }
        drop(tx);
        let deadline = Instant::now() + self.timeout;
        while pending > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, r)) => {
                    pending -= 1;
                    results[i] = Some(r.map_err(|e| sys::error_label(&e)));
                }
                Err(_) => break,
            }
        }
        if pending > 0 {
            // Under the lock: take answers that raced in, mark the rest stuck.
            let mut stuck = self.pool.stuck.lock().map_err(|_| Error::NoData("statfs pool poisoned".into()))?;
            while let Ok((i, r)) = rx.try_recv() {
                results[i] = Some(r.map_err(|e| sys::error_label(&e)));
            }
            let mut hung = 0;
            for (i, (_, label)) in selected.iter().enumerate() {
                if results[i].is_none() {
                    tracing::warn!(mountpoint = %label, timeout = ?self.timeout, "statfs timed out, marking mount point stale");
                    stuck.insert(label.clone());
                    results[i] = Some(Err(TIMEOUT_LABEL.to_string()));
                    hung += 1;
                }
            }
            drop(stuck);
            // Replace the workers now blocked in statfs.
            for _ in 0..hung {
                if self.pool.workers < MAX_WORKERS {
                    self.pool.spawn();
                }
            }
        }

        for ((m, label), res) in selected.iter().zip(results) {
            let res = res.unwrap_or_else(|| Err(TIMEOUT_LABEL.to_string()));
            let err_label = res.as_ref().err().map(String::as_str).unwrap_or("");
            let l =
                [("device", m.device.as_str()), ("device_error", err_label), ("fstype", m.fstype.as_str()), ("mountpoint", label.as_str())];
            sink.family(
                "node_filesystem_device_error",
                "Whether an error occurred while getting statistics for the given device.",
                Kind::Gauge,
            )
            .sample(&l, if res.is_err() { 1.0 } else { 0.0 });
            sink.family("node_filesystem_readonly", "Filesystem read-only status.", Kind::Gauge)
                .sample(&l, if m.read_only { 1.0 } else { 0.0 });
            sink.family("node_filesystem_mount_info", "Filesystem mount information.", Kind::Gauge)
                .sample(&[("device", m.device.as_str()), ("major", &m.major), ("minor", &m.minor), ("mountpoint", label.as_str())], 1.0);
            let Ok(s) = res else { continue };
            for (name, help, v) in [
                ("node_filesystem_size_bytes", "Filesystem size in bytes.", s.size),
                ("node_filesystem_free_bytes", "Filesystem free space in bytes.", s.free),
                ("node_filesystem_avail_bytes", "Filesystem space available to non-root users in bytes.", s.avail),
                ("node_filesystem_files", "Filesystem total file nodes.", s.files),
                ("node_filesystem_files_free", "Filesystem total free file nodes.", s.files_free),
            ] {
                sink.family(name, help, Kind::Gauge).sample(&l, v);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let t = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n\
                 30 22 0:25 / /mnt/my\\040disk ro,nosuid - vfat /dev/sdb1 rw\n\
                 31 22 0:26 / /run rw - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(t).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].device, "/dev/sda1");
        assert_eq!((m[0].major.as_str(), m[0].minor.as_str()), ("8", "1"));
        assert!(!m[0].read_only);
        assert_eq!(m[1].mount_point, "/mnt/my disk");
        assert!(m[1].read_only);
        assert_eq!(m[2].fstype, "tmpfs");
        assert!(parse_mountinfo("1 2 3\n").is_err());
        assert!(parse_mountinfo("22 1 81 / / rw - ext4 /dev/sda1 rw\n").is_err());
    }

    /// The mounts are kept between scrapes while the kernel says the mount
    /// table is unchanged, and a mount or unmount shows in the next scrape
    /// (root only: mounts a tmpfs; CI runs as root).
    #[test]
    fn a_mount_and_an_unmount_show_in_the_next_scrape() {
        let p = crate::Paths { procfs: "/proc".into(), sysfs: "/sys".into(), rootfs: "/".into(), udev_data: "/x".into() };
        let m = crate::registry::command().try_get_matches_from(["node-agent"]).unwrap();
        let mut c = Collector::new(Options::from_flags(&Flags::new(&m)).unwrap(), &p).unwrap();
        let d = tempfile::tempdir().unwrap();
        let point = d.path().to_string_lossy().into_owned();
        let scraped = |c: &mut Collector| {
            let mut sink = Sink::new();
            crate::Collector::update(c, &mut sink).unwrap();
            crate::testutil::rows(&sink)
                .iter()
                .any(|(name, l, _)| name == "node_filesystem_size_bytes" && l.iter().any(|(k, v)| k == "mountpoint" && *v == point))
        };
        assert!(!scraped(&mut c), "not mounted yet");
        let target = std::ffi::CString::new(point.as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings that outlive the call; no data.
        if unsafe { libc::mount(c"none".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null()) } != 0 {
            let e = std::io::Error::last_os_error();
            assert!(std::env::var_os("CI").is_none(), "mount a tmpfs: {e}");
            eprintln!("skipped: cannot mount a tmpfs here ({e})");
            return;
        }
        let mounted = scraped(&mut c);
        let still = scraped(&mut c);
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::umount(target.as_ptr()) }, 0, "unmount: {}", std::io::Error::last_os_error());
        assert!(mounted && still, "the new mount is reported, and again from the kept table");
        assert!(!scraped(&mut c), "the unmount shows in the next scrape");
    }

    #[test]
    fn mount_points_under_rootfs() {
        let p =
            crate::Paths { procfs: "/host/proc".into(), sysfs: "/host/sys".into(), rootfs: "/host/root".into(), udev_data: "/x".into() };
        let m = crate::registry::command().try_get_matches_from(["node-agent"]).unwrap();
        let c = Collector::new(Options::from_flags(&Flags::new(&m)).unwrap(), &p).unwrap();
        assert_eq!(c.label_mount_point("/host/root"), "/");
        assert_eq!(c.label_mount_point("/host/root/home"), "/home");
        assert_eq!(c.label_mount_point("/home"), "/home");
        assert_eq!(statfs_path(&p.rootfs, "/home"), std::path::PathBuf::from("/host/root/home"));
        assert_eq!(statfs_path(&p.rootfs, "/"), std::path::PathBuf::from("/host/root"));
    }

    #[test]
    fn options_refuse_a_zero_timeout_and_bad_worker_counts() {
        let parse = |args: &[&str]| {
            let m = crate::registry::command().no_binary_name(true).try_get_matches_from(args).unwrap();
            Options::from_flags(&Flags::new(&m)).map(|o| (o.timeout, o.workers)).map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]).unwrap(), (Duration::from_secs(5), 4));
        assert_eq!(parse(&["--collector.filesystem.mount-timeout=250ms"]).unwrap().0, Duration::from_millis(250));
        for bad in
            ["--collector.filesystem.mount-timeout=0s", "--collector.filesystem.mount-timeout=5", "--collector.filesystem.stat-workers=0"]
        {
            let e = parse(&[bad]).unwrap_err();
            assert!(e.contains(bad.split('=').next().unwrap()), "{e}");
        }
    }

    #[test]
    fn default_excludes() {
        use regex::Regex;
        let mp = Regex::new(MOUNT_POINTS_EXCLUDE.default).unwrap();
        assert!(mp.is_match("/proc/sys/fs/binfmt_misc"));
        assert!(mp.is_match("/var/lib/docker/overlay2/x"));
        assert!(!mp.is_match("/var/lib/docker"));
        assert!(!mp.is_match("/home"));
        let fs = Regex::new(FS_TYPES_EXCLUDE.default).unwrap();
        assert!(fs.is_match("cgroup2") && fs.is_match("overlay") && !fs.is_match("ext4"));
    }
}
