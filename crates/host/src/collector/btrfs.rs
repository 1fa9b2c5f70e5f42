//! `btrfs`: Btrfs filesystems, from `/sys/fs/btrfs/<uuid>/` (label, global
//! reserve, commit statistics, bytes reserved per block group type, used
//! and allocated bytes and the allocation ratio per layout, device sizes),
//! exported as `node_btrfs_*` with a `uuid` label. For the filesystems
//! mounted under `--path.rootfs` (found in pid 1's mountinfo), the device
//! sizes, unused bytes and error counters come from the `BTRFS_IOC_DEV_INFO`
//! and `BTRFS_IOC_GET_DEV_STATS` ioctls instead, with a `btrfs_dev_uuid`
//! label; a mount that cannot be queried falls back to sysfs. A host with
//! no Btrfs filesystem succeeds with no samples, as node_exporter does.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::parse;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The sysfs sector size: device sizes are given in 512-byte sectors.
const SECTOR_SIZE: u64 = 512;
/// procfs reads a sysfs attribute with one read of at most this many bytes.
const ATTR_MAX: usize = 128;
/// The block group types, in node_exporter's order.
const BLOCK_GROUP_TYPES: [&str; 3] = ["data", "metadata", "system"];
/// The device error counters, in the order of the kernel's `btrfs_dev_stat_values`.
const ERROR_TYPES: [&str; 5] = ["write", "read", "flush", "corruption", "generation"];

/// `commit_stats` (Linux 6.0 and later).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CommitStats {
    pub commits: u64,
    pub last_commit_ms: u64,
    pub max_commit_ms: u64,
    pub total_commit_ms: u64,
}

/// Parses `commit_stats`: lines of a key and a value; unknown keys are
/// ignored, a line of anything but two fields is an error.
pub fn parse_commit_stats(text: &str) -> Result<CommitStats, String> {
    let mut s = CommitStats::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(key), Some(value), None) = (f.next(), f.next(), f.next()) else {
            return Err(format!("invalid commit_stats line {line:?}"));
        };
        let v = parse::parse_u64(value.as_bytes()).ok_or_else(|| format!("invalid value in commit_stats line {line:?}"))?;
        match key {
            "commits" => s.commits = v,
            "last_commit_ms" => s.last_commit_ms = v,
            "max_commit_ms" => s.max_commit_ms = v,
            "total_commit_ms" => s.total_commit_ms = v,
            _ => {}
        }
    }
    Ok(s)
}

/// A sysfs number as procfs reads it: anything but a decimal u64 is 0.
pub fn parse_value(s: &str) -> u64 {
    parse::parse_u64(s.as_bytes()).unwrap_or(0)
}

/// How many bytes of disk a byte of a layout takes, given the number of
/// devices of the filesystem (0 for an unknown layout).
pub fn layout_ratio(mode: &str, devices: usize) -> f64 {
    let n = devices as f64;
    match mode {
        "single" | "raid0" => 1.0,
        "dup" | "raid1" | "raid10" => 2.0,
        "raid1c3" => 3.0,
        "raid1c4" => 4.0,
        "raid5" => n / (n - 1.0),
        "raid6" => n / (n - 2.0),
        _ => 0.0,
    }
}

/// One layout (raid profile) of a block group type.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub mode: String,
    pub used: u64,
    pub total: u64,
    pub ratio: f64,
}

/// One block group type: `allocation/<type>/`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Allocation {
    pub reserved: u64,
    pub layouts: Vec<Layout>,
}

/// What sysfs says about one filesystem.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FsStats {
    pub uuid: String,
    pub label: String,
    pub global_rsv_size: u64,
    pub commits: CommitStats,
    /// data, metadata, system.
    pub allocation: [Allocation; 3],
    /// Device name and size in bytes, by name.
    pub devices: Vec<(String, u64)>,
}

/// Reads the attributes of one directory the way procfs's Btrfs reader
/// does: a missing attribute is empty (0), any other failure is remembered
/// (the last one wins) and, once there is one, numbers read as 0.
struct Reader<'a> {
    dir: PathBuf,
    err: Option<Error>,
    buf: &'a mut Vec<u8>,
}

impl<'a> Reader<'a> {
    fn new(dir: PathBuf, buf: &'a mut Vec<u8>) -> Self {
        Reader { dir, err: None, buf }
    }

    fn text(&mut self, rel: &str) -> String {
        let path = self.dir.join(rel);
        match crate::io::read_into(&path, self.buf) {
            Ok(()) => {
                self.buf.truncate(ATTR_MAX);
                String::from_utf8_lossy(self.buf).trim().to_string()
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound {
                    self.err = Some(Error::io(&path, e));
                }
                String::new()
            }
        }
    }

    fn value(&mut self, rel: &str) -> u64 {
        let s = self.text(rel);
        if self.err.is_some() {
            return 0;
        }
        parse_value(&s)
    }

    /// The entries of a subdirectory, sorted, with whether each is a
    /// directory (not following symlinks).
    fn list(&mut self, rel: &str) -> Vec<(String, bool)> {
        let path = if rel.is_empty() { self.dir.clone() } else { self.dir.join(rel) };
        let entries = match std::fs::read_dir(&path) {
            Ok(d) => d.collect::<Result<Vec<_>, _>>(),
            Err(e) => Err(e),
        };
        match entries {
            Ok(entries) => {
                let mut v: Vec<(String, bool)> = entries
                    .into_iter()
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.file_type().is_ok_and(|t| t.is_dir())))
                    .collect();
                v.sort_unstable();
                v
            }
            Err(e) => {
                self.err = Some(Error::io(&path, e));
                Vec::new()
            }
        }
    }

    /// `allocation/<type>/` read on its own; its error is returned apart.
    fn allocation(dir: PathBuf, buf: &mut Vec<u8>, devices: usize) -> (Allocation, Option<Error>) {
        let mut r = Reader::new(dir, buf);
        let reserved = r.value("bytes_reserved");
        let mut layouts = Vec::new();
        for (mode, is_dir) in r.list("") {
            if !is_dir {
                continue;
            }
            let total = r.value(&format!("{mode}/total_bytes"));
            let used = r.value(&format!("{mode}/used_bytes"));
            let ratio = layout_ratio(&mode, devices);
            layouts.push(Layout { mode, used, total, ratio });
        }
        (Allocation { reserved, layouts }, r.err)
    }

    fn commit_stats(&mut self) -> CommitStats {
        let path = self.dir.join("commit_stats");
        match crate::io::read_into(&path, self.buf) {
            Ok(()) => match parse_commit_stats(&String::from_utf8_lossy(self.buf)) {
                Ok(s) => s,
                Err(m) => {
                    self.err = Some(Error::parse(&path, m));
                    CommitStats::default()
                }
            },
            // Before Linux 6.0 there are no commit statistics.
            Err(e) if e.kind() == io::ErrorKind::NotFound => CommitStats::default(),
            Err(e) => {
                self.err = Some(Error::io(&path, e));
                CommitStats::default()
            }
        }
    }
}

/// Reads one filesystem's directory `/sys/fs/btrfs/<uuid>`. Errors follow
/// procfs: a missing `devices` or `features` directory, or an unreadable
/// label, only zeroes the global reserve; an unreadable block group
/// directory fails the filesystem only if it is the last one (system), as
/// does a malformed `commit_stats`. Attributes node_exporter reads but
/// never exports (nodesize, flags, bytes_used, ...) are not read.
fn read_fs(dir: &Path, buf: &mut Vec<u8>) -> Result<FsStats, Error> {
    let mut r = Reader::new(dir.to_path_buf(), buf);
    let mut devices = Vec::new();
    for (name, _) in r.list("devices") {
        let sectors = r.value(&format!("devices/{name}/size"));
        devices.push((name, SECTOR_SIZE.wrapping_mul(sectors)));
    }
    let label = r.text("label");
    let mut uuid = r.text("metadata_uuid");
    r.list("features");
    let global_rsv_size = r.value("allocation/global_rsv_size");
    let mut allocation: [Allocation; 3] = Default::default();
    let mut last_err = None;
    for (a, name) in allocation.iter_mut().zip(BLOCK_GROUP_TYPES) {
        let (stats, err) = Reader::allocation(dir.join("allocation").join(name), r.buf, devices.len());
        *a = stats;
        last_err = err;
    }
    r.err = last_err;
    let commits = r.commit_stats();
    if let Some(e) = r.err {
        return Err(e);
    }
    if uuid.is_empty() {
        uuid = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    }
    Ok(FsStats { uuid, label, global_rsv_size, commits, allocation, devices })
}

/// The filesystem directories: entries of `/sys/fs/btrfs` whose name has a
/// dash (node_exporter's glob `fs/btrfs/*-*`), sorted.
fn fs_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> =
        entries.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().contains('-')).map(|e| e.path()).collect();
    v.sort_unstable();
    v
}

/// A mounted Btrfs filesystem from mountinfo: its mount point (with `\040`
/// and `\011` undone, as node_exporter does) and its source device.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub mount_point: String,
    pub device: String,
}

/// The Btrfs mounts of a mountinfo file. Like procfs, a malformed line
/// fails the whole file.
pub fn parse_btrfs_mounts(text: &str) -> Result<Vec<Mount>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split(' ').collect();
        let len = f.len();
        if len < 10 {
            return Err(format!("line {}: too few fields", n + 1));
        }
        if f[len - 4] != "-" {
            return Err(format!("line {}: no separator", n + 1));
        }
        if f[0].parse::<i64>().is_err() || f[1].parse::<i64>().is_err() {
            return Err(format!("line {}: bad mount ID", n + 1));
        }
        let majmin_ok = f[2].split_once(':').is_some_and(|(a, b)| a.parse::<i64>().is_ok() && b.parse::<i64>().is_ok());
        if !majmin_ok {
            return Err(format!("line {}: malformed major:minor {:?}", n + 1, f[2]));
        }
        if f[len - 3] == "btrfs" {
            out.push(Mount { mount_point: f[4].replace("\\040", " ").replace("\\011", "\t"), device: f[len - 2].to_string() });
        }
    }
    Ok(out)
}

/// Where a mount point is seen from here: under `rootfs`, once (a mount
/// point already under it is not prefixed twice).
fn under_rootfs(rootfs: &Path, mount_point: &str) -> PathBuf {
    let root = rootfs.to_string_lossy();
    if root == "/" {
        return PathBuf::from(mount_point);
    }
    let stripped = mount_point.strip_prefix(root.as_ref()).unwrap_or(mount_point);
    rootfs.join(stripped.trim_start_matches('/'))
}

/// Lowercase hex of bytes (a filesystem ID as node_exporter prints it).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A device UUID as 8-4-4-4-12 hex; `<zero>` when all zero (as the Go
/// btrfs library prints it).
pub fn dashed_uuid(b: &[u8; 16]) -> String {
    if b.iter().all(|&x| x == 0) {
        return "<zero>".into();
    }
    format!("{}-{}-{}-{}-{}", hex(&b[..4]), hex(&b[4..6]), hex(&b[6..8]), hex(&b[8..10]), hex(&b[10..]))
}

/// The last element of a device path (`/dev/sda` is `sda`).
pub fn device_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The Btrfs ioctls node_exporter uses (through github.com/dennwc/btrfs).
mod ioctl {
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    const BTRFS_IOCTL_MAGIC: u32 = 0x94;
    const BTRFS_SUPER_MAGIC: u32 = 0x9123_683E;
    /// The inode number of a subvolume's root directory.
    const FIRST_FREE_OBJECTID: u64 = 256;
    const DEV_STAT_VALUES_MAX: usize = 5;

    /// `struct btrfs_ioctl_fs_info_args` (1 KiB).
    #[repr(C)]
    pub struct FsInfo {
        pub max_id: u64,
        pub num_devices: u64,
        pub fsid: [u8; 16],
        nodesize: u32,
        sectorsize: u32,
        clone_alignment: u32,
        reserved: [u8; 980],
    }

    /// `struct btrfs_ioctl_dev_info_args` (4 KiB).
    #[repr(C)]
    pub struct DevInfo {
        devid: u64,
        pub uuid: [u8; 16],
        pub bytes_used: u64,
        pub total_bytes: u64,
        unused: [u64; 379],
        pub path: [u8; 1024],
    }

    /// `struct btrfs_ioctl_get_dev_stats` (1 KiB + 8 bytes).
    #[repr(C)]
    struct DevStats {
        devid: u64,
        nr_items: u64,
        flags: u64,
        values: [u64; DEV_STAT_VALUES_MAX],
        unused: [u64; 128 - 2 - DEV_STAT_VALUES_MAX],
    }

    const _: () = assert!(std::mem::size_of::<FsInfo>() == 1024);
    const _: () = assert!(std::mem::size_of::<DevInfo>() == 4096);
    const _: () = assert!(std::mem::size_of::<DevStats>() == 1032);

    const IOC_FS_INFO: libc::Ioctl = libc::_IOR::<FsInfo>(BTRFS_IOCTL_MAGIC, 31);
    const IOC_DEV_INFO: libc::Ioctl = libc::_IOWR::<DevInfo>(BTRFS_IOCTL_MAGIC, 30);
    const IOC_GET_DEV_STATS: libc::Ioctl = libc::_IOWR::<DevStats>(BTRFS_IOCTL_MAGIC, 52);

    /// Opens the root of a mounted Btrfs subvolume; anything else is an error.
    pub fn open(path: &Path) -> io::Result<File> {
        let md = std::fs::metadata(path)?;
        if !md.is_dir() || md.ino() != FIRST_FREE_OBJECTID {
            return Err(io::Error::other("not the root of a btrfs subvolume"));
        }
        let f = File::open(path)?;
        // SAFETY: statfs is plain data; all zeroes is a valid value.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid open descriptor and a writable statfs.
        if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.f_type as u32 != BTRFS_SUPER_MAGIC {
            return Err(io::Error::other("not a btrfs filesystem"));
        }
        Ok(f)
    }

    pub fn fs_info(f: &File) -> io::Result<FsInfo> {
        let mut arg =
            FsInfo { max_id: 0, num_devices: 0, fsid: [0; 16], nodesize: 0, sectorsize: 0, clone_alignment: 0, reserved: [0; 980] };
        // SAFETY: BTRFS_IOC_FS_INFO writes at most size_of::<FsInfo>() bytes
        // (encoded in the request number) into `arg`, a valid, exclusively
        // borrowed repr(C) struct of that size.
        if unsafe { libc::ioctl(f.as_raw_fd(), IOC_FS_INFO, &mut arg as *mut FsInfo) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg)
    }

    pub fn dev_info(f: &File, devid: u64) -> io::Result<DevInfo> {
        let mut arg = DevInfo { devid, uuid: [0; 16], bytes_used: 0, total_bytes: 0, unused: [0; 379], path: [0; 1024] };
        // SAFETY: BTRFS_IOC_DEV_INFO reads and writes at most
        // size_of::<DevInfo>() bytes of `arg`, a valid, exclusively borrowed
        // repr(C) struct of that size.
        if unsafe { libc::ioctl(f.as_raw_fd(), IOC_DEV_INFO, &mut arg as *mut DevInfo) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg)
    }

    /// The error counters of a device (write, read, flush, corruption,
    /// generation), without resetting them.
    pub fn dev_stats(f: &File, devid: u64) -> io::Result<[u64; DEV_STAT_VALUES_MAX]> {
        let mut arg = DevStats {
            devid,
            nr_items: DEV_STAT_VALUES_MAX as u64,
            flags: 0,
            values: [0; DEV_STAT_VALUES_MAX],
            unused: [0; 128 - 2 - DEV_STAT_VALUES_MAX],
        };
        // SAFETY: BTRFS_IOC_GET_DEV_STATS reads and writes at most
        // size_of::<DevStats>() bytes of `arg`, a valid, exclusively borrowed
        // repr(C) struct of that size; nr_items bounds the values it fills.
        if unsafe { libc::ioctl(f.as_raw_fd(), IOC_GET_DEV_STATS, &mut arg as *mut DevStats) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(arg.values)
    }
}

/// One device of a mounted filesystem, from the ioctls.
#[derive(Debug, Clone, PartialEq)]
pub struct IoctlDevice {
    pub name: String,
    pub uuid: String,
    pub bytes_used: u64,
    pub total_bytes: u64,
    pub errors: [u64; 5],
}

/// The devices of an open filesystem: device IDs 0 to max_id (not all in
/// use: ENODEV is skipped), until num_devices have been found.
fn ioctl_devices(f: &std::fs::File, info: &ioctl::FsInfo) -> io::Result<Vec<IoctlDevice>> {
    let mut out = Vec::new();
    for id in 0..=info.max_id {
        let dev = match ioctl::dev_info(f, id) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => continue,
            Err(e) => return Err(e),
        };
        let errors = ioctl::dev_stats(f, id)?;
        let end = dev.path.iter().position(|&c| c == 0).unwrap_or(dev.path.len());
        let path = String::from_utf8_lossy(&dev.path[..end]);
        out.push(IoctlDevice {
            name: device_name(&path).to_string(),
            uuid: dashed_uuid(&dev.uuid),
            bytes_used: dev.bytes_used,
            total_bytes: dev.total_bytes,
            errors,
        });
        if out.len() as u64 == info.num_devices {
            break;
        }
    }
    Ok(out)
}

pub struct Collector {
    sys: PathBuf,
    proc: PathBuf,
    rootfs: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { sys: p.sys("fs/btrfs"), proc: p.procfs.clone(), rootfs: p.rootfs.clone(), buf: Vec::with_capacity(4096) }
    }

    /// The devices of every mounted Btrfs filesystem that answers the
    /// ioctls, by filesystem ID (hex, no dashes). Failures are logged at
    /// debug and leave the filesystem to sysfs.
    fn ioctl_stats(&mut self) -> HashMap<String, Vec<IoctlDevice>> {
        let mut out = HashMap::new();
        let mut path = self.proc.join("1/mountinfo");
        let mut text = crate::io::read_into(&path, &mut self.buf);
        if matches!(&text, Err(e) if e.kind() == io::ErrorKind::NotFound) {
            path = self.proc.join("self/mountinfo");
            text = crate::io::read_into(&path, &mut self.buf);
        }
        if let Err(e) = text {
            tracing::debug!(path = %path.display(), err = %e, "Error querying btrfs device stats with ioctl");
            return out;
        }
        let mounts = match parse_btrfs_mounts(&String::from_utf8_lossy(&self.buf)) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(path = %path.display(), err = %e, "Error querying btrfs device stats with ioctl");
                return out;
            }
        };
        let mut devices_done = std::collections::HashSet::new();
        for m in mounts {
            if devices_done.contains(&m.device) {
                continue;
            }
            let mount_path = under_rootfs(&self.rootfs, &m.mount_point);
            let f = match ioctl::open(&mount_path) {
                Ok(f) => f,
                Err(e) => {
                    tracing::debug!(mount_point = %mount_path.display(), err = %e, "Error inspecting btrfs mountpoint");
                    continue;
                }
            };
            let info = match ioctl::fs_info(&f) {
                Ok(i) => i,
                Err(e) => {
                    tracing::debug!(mount_point = %mount_path.display(), err = %e, "Error querying btrfs filesystem");
                    continue;
                }
            };
            let fsid = hex(&info.fsid);
            if out.contains_key(&fsid) {
                continue;
            }
            match ioctl_devices(&f, &info) {
                Ok(devs) => {
                    devices_done.insert(m.device);
                    out.insert(fsid, devs);
                }
                Err(e) => tracing::debug!(mount_point = %mount_path.display(), err = %e, "Error querying btrfs device stats"),
            }
        }
        out
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut all = Vec::new();
        for dir in fs_dirs(&self.sys) {
            all.push(read_fs(&dir, &mut self.buf)?);
        }
        if all.is_empty() {
            return Ok(());
        }
        let ioctl = self.ioctl_stats();

        let mut f = sink.new_family("node_btrfs_info", "Filesystem information", Kind::Gauge);
        for s in &all {
            f.sample(&[("label", &s.label), ("uuid", &s.uuid)], 1.0);
        }
        type Field = fn(&FsStats) -> f64;
        let per_fs: [(&str, &str, Kind, Field); 5] = [
            ("node_btrfs_global_rsv_size_bytes", "Size of global reserve.", Kind::Gauge, |s| s.global_rsv_size as f64),
            ("node_btrfs_commits_total", "The total number of commits that have occurred.", Kind::Counter, |s| s.commits.commits as f64),
            ("node_btrfs_last_commit_seconds", "Duration of the most recent commit, in seconds.", Kind::Gauge, |s| {
                s.commits.last_commit_ms as f64 / 1000.0
            }),
            ("node_btrfs_max_commit_seconds", "Duration of the slowest commit, in seconds.", Kind::Gauge, |s| {
                s.commits.max_commit_ms as f64 / 1000.0
            }),
            ("node_btrfs_commit_seconds_total", "Sum of the duration of all commits, in seconds.", Kind::Counter, |s| {
                s.commits.total_commit_ms as f64 / 1000.0
            }),
        ];
        for (name, help, kind, value) in per_fs {
            let mut f = sink.new_family(name, help, kind);
            for s in &all {
                f.sample(&[("uuid", &s.uuid)], value(s));
            }
        }

        let mut f = sink.new_family("node_btrfs_reserved_bytes", "Amount of space reserved for a data type", Kind::Gauge);
        for s in &all {
            for (a, t) in s.allocation.iter().zip(BLOCK_GROUP_TYPES) {
                f.sample(&[("block_group_type", t), ("uuid", &s.uuid)], a.reserved as f64);
            }
        }
        type LayoutField = fn(&Layout) -> f64;
        let per_layout: [(&str, &str, LayoutField); 3] = [
            ("node_btrfs_used_bytes", "Amount of used space by a layout/data type", |l| l.used as f64),
            ("node_btrfs_size_bytes", "Amount of space allocated for a layout/data type", |l| l.total as f64),
            ("node_btrfs_allocation_ratio", "Data allocation ratio for a layout/data type", |l| l.ratio),
        ];
        for (name, help, value) in per_layout {
            let mut f = sink.new_family(name, help, Kind::Gauge);
            for s in &all {
                for (a, t) in s.allocation.iter().zip(BLOCK_GROUP_TYPES) {
                    for l in &a.layouts {
                        f.sample(&[("block_group_type", t), ("mode", &l.mode), ("uuid", &s.uuid)], value(l));
                    }
                }
            }
        }

        const SIZE: &str = "node_btrfs_device_size_bytes";
        const SIZE_HELP: &str = "Size of a device that is part of the filesystem.";
        for s in &all {
            match ioctl.get(&s.uuid.replace('-', "")) {
                None => {
                    let mut f = sink.family(SIZE, SIZE_HELP, Kind::Gauge);
                    for (dev, size) in &s.devices {
                        f.sample(&[("device", dev), ("uuid", &s.uuid)], *size as f64);
                    }
                }
                Some(devs) => {
                    for d in devs {
                        let labels = [("btrfs_dev_uuid", d.uuid.as_str()), ("device", &d.name), ("uuid", &s.uuid)];
                        sink.family(SIZE, SIZE_HELP, Kind::Gauge).sample(&labels, d.total_bytes as f64);
                        sink.family(
                            "node_btrfs_device_unused_bytes",
                            "Unused bytes unused on a device that is part of the filesystem.",
                            Kind::Gauge,
                        )
                        .sample(&labels, d.total_bytes.wrapping_sub(d.bytes_used) as f64);
                        let mut f = sink.family("node_btrfs_device_errors_total", "Errors reported for the device", Kind::Counter);
                        for (t, v) in ERROR_TYPES.iter().zip(d.errors) {
                            f.sample(&[labels[0], labels[1], ("type", t), labels[2]], v as f64);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::write;

    /// node_exporter's fixture sys/fs/btrfs/0abb23a9-.../commit_stats.
    const COMMIT_STATS: &str = "commits 258051\nlast_commit_ms 1000\nmax_commit_ms 51462\ntotal_commit_ms 47836090\n";

    #[test]
    fn parses_commit_stats() {
        let s = parse_commit_stats(COMMIT_STATS).unwrap();
        assert_eq!(s, CommitStats { commits: 258051, last_commit_ms: 1000, max_commit_ms: 51462, total_commit_ms: 47836090 });
        assert_eq!(parse_commit_stats("").unwrap(), CommitStats::default());
        assert_eq!(parse_commit_stats("future_key 5\ncommits 2").unwrap().commits, 2);
        for bad in ["commits\n", "commits 1 2\n", "commits -1\n", "commits x\n", "commits 1\n\nmax_commit_ms 2\n"] {
            assert!(parse_commit_stats(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn ratios_by_layout() {
        assert_eq!(layout_ratio("raid0", 2), 1.0);
        assert_eq!(layout_ratio("single", 1), 1.0);
        assert_eq!(layout_ratio("dup", 1), 2.0);
        assert_eq!(layout_ratio("raid10", 4), 2.0);
        assert_eq!(layout_ratio("raid1c3", 3), 3.0);
        assert_eq!(layout_ratio("raid1c4", 4), 4.0);
        assert_eq!(layout_ratio("raid5", 4), 4.0 / 3.0);
        assert_eq!(layout_ratio("raid6", 4), 2.0);
        assert_eq!(layout_ratio("raid5", 1), f64::INFINITY);
        assert_eq!(layout_ratio("weird", 4), 0.0);
        assert_eq!(parse_value("16777216"), 16777216);
        assert_eq!(parse_value("-1"), 0);
        assert_eq!(parse_value(""), 0);
    }

    #[test]
    fn formats_ids() {
        let mut u = [0u8; 16];
        assert_eq!(dashed_uuid(&u), "<zero>");
        for (i, b) in u.iter_mut().enumerate() {
            *b = (i as u8) * 17;
        }
        assert_eq!(dashed_uuid(&u), "00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(hex(&u), "00112233445566778899aabbccddeeff");
        assert_eq!(device_name("/dev/sda"), "sda");
        assert_eq!(device_name("/rootfs/dev/md1"), "md1");
        assert_eq!(device_name("loop0"), "loop0");
    }

    #[test]
    fn parses_mountinfo() {
        let text = "21 1 8:1 / / rw,relatime shared:1 - btrfs /dev/sda1 rw,space_cache\n\
22 21 0:5 / /proc rw - proc proc rw\n\
23 21 8:2 /@home /home\\040dir rw - btrfs /dev/sda2 rw\n";
        let m = parse_btrfs_mounts(text).unwrap();
        assert_eq!(
            m,
            vec![
                Mount { mount_point: "/".into(), device: "/dev/sda1".into() },
                Mount { mount_point: "/home dir".into(), device: "/dev/sda2".into() },
            ]
        );
        assert!(parse_btrfs_mounts("21 1 8:1 / / rw - btrfs\n").is_err());
        assert!(parse_btrfs_mounts("21 1 8:1 / / rw x btrfs /dev/sda1 rw\n").is_err());
        assert!(parse_btrfs_mounts("x 1 8:1 / / rw - btrfs /dev/sda1 rw\n").is_err());
        assert!(parse_btrfs_mounts("21 1 81 / / rw - btrfs /dev/sda1 rw\n").is_err());
        assert!(parse_btrfs_mounts("").unwrap().is_empty());
        assert_eq!(under_rootfs(Path::new("/"), "/home"), PathBuf::from("/home"));
        assert_eq!(under_rootfs(Path::new("/host"), "/home"), PathBuf::from("/host/home"));
        assert_eq!(under_rootfs(Path::new("/host"), "/host/home"), PathBuf::from("/host/home"));
    }

    /// A filesystem laid out as node_exporter's first fixture.
    fn fixture(root: &Path) -> PathBuf {
        let fs = root.join("fs/btrfs/0abb23a9-579b-43e6-ad30-227ef47fcb9d");
        write(&fs, "label", "fixture\n");
        write(&fs, "metadata_uuid", "0abb23a9-579b-43e6-ad30-227ef47fcb9d\n");
        write(&fs, "features/big_metadata", "0\n");
        write(&fs, "commit_stats", COMMIT_STATS);
        write(&fs, "devices/loop25/size", "20971520\n");
        write(&fs, "devices/loop26/size", "20971520\n");
        write(&fs, "allocation/global_rsv_size", "16777216\n");
        for (t, mode, total, used) in [
            ("data", "raid0", "2147483648", "808189952"),
            ("metadata", "raid1", "1073741824", "933888"),
            ("system", "raid1", "8388608", "16384"),
        ] {
            write(&fs, &format!("allocation/{t}/bytes_reserved"), "0\n");
            write(&fs, &format!("allocation/{t}/total_bytes"), "1\n");
            write(&fs, &format!("allocation/{t}/{mode}/total_bytes"), total);
            write(&fs, &format!("allocation/{t}/{mode}/used_bytes"), used);
        }
        fs
    }

    #[test]
    fn reads_a_filesystem() {
        let d = tempfile::tempdir().unwrap();
        let fs = fixture(d.path());
        let mut buf = Vec::new();
        let s = read_fs(&fs, &mut buf).unwrap();
        assert_eq!(s.uuid, "0abb23a9-579b-43e6-ad30-227ef47fcb9d");
        assert_eq!(s.label, "fixture");
        assert_eq!(s.global_rsv_size, 16777216);
        assert_eq!(s.commits.max_commit_ms, 51462);
        assert_eq!(s.devices, vec![("loop25".into(), 10737418240), ("loop26".into(), 10737418240)]);
        assert_eq!(s.allocation[0].layouts, vec![Layout { mode: "raid0".into(), used: 808189952, total: 2147483648, ratio: 1.0 }]);
        assert_eq!(s.allocation[2].layouts[0].ratio, 2.0);

        // Without metadata_uuid (before Linux 5.0) the directory names it;
        // without commit_stats (before 6.0) the commits are zero.
        std::fs::remove_file(fs.join("metadata_uuid")).unwrap();
        std::fs::remove_file(fs.join("commit_stats")).unwrap();
        let s = read_fs(&fs, &mut buf).unwrap();
        assert_eq!(s.uuid, "0abb23a9-579b-43e6-ad30-227ef47fcb9d");
        assert_eq!(s.commits, CommitStats::default());

        // procfs's quirks: a missing devices directory zeroes the global
        // reserve but does not fail; a missing system directory does.
        std::fs::remove_dir_all(fs.join("devices")).unwrap();
        let s = read_fs(&fs, &mut buf).unwrap();
        assert_eq!((s.global_rsv_size, s.devices.len()), (0, 0));
        std::fs::remove_dir_all(fs.join("allocation/data")).unwrap();
        let s = read_fs(&fs, &mut buf).unwrap();
        assert!(s.allocation[0].layouts.is_empty());
        std::fs::remove_dir_all(fs.join("allocation/system")).unwrap();
        assert!(read_fs(&fs, &mut buf).is_err());

        write(&fs, "allocation/system/bytes_reserved", "0\n");
        write(&fs, "commit_stats", "commits\n");
        assert!(matches!(read_fs(&fs, &mut buf), Err(Error::Parse { .. })));
    }

    #[test]
    fn exports_the_families() {
        let d = tempfile::tempdir().unwrap();
        fixture(d.path());
        // Not a filesystem: no dash.
        write(d.path(), "fs/btrfs/features/raid56", "0\n");
        let p = Paths {
            procfs: d.path().join("proc"),
            sysfs: d.path().to_path_buf(),
            rootfs: d.path().to_path_buf(),
            udev_data: d.path().to_path_buf(),
        };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 11);
        let get = |name: &str| fams.iter().find(|f| f.name() == name).unwrap().samples().collect::<Vec<_>>();
        let uuid = "0abb23a9-579b-43e6-ad30-227ef47fcb9d";
        assert_eq!(get("node_btrfs_info"), vec![(vec![("label", "fixture"), ("uuid", uuid)], 1.0)]);
        assert_eq!(get("node_btrfs_commit_seconds_total"), vec![(vec![("uuid", uuid)], 47836.09)]);
        assert_eq!(get("node_btrfs_device_size_bytes").len(), 2);
        assert_eq!(get("node_btrfs_allocation_ratio")[1], (vec![("block_group_type", "metadata"), ("mode", "raid1"), ("uuid", uuid)], 2.0));

        let p = Paths { sysfs: d.path().join("none"), ..p };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        assert!(sink.families().is_empty());
    }
}
