//! `diskstats`: block device I/O statistics from /proc/diskstats, with
//! `node_disk_info` and friends from udev's database and sysfs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Arg;

use crate::flags::{self, Flags, StringFlag};

use crate::filter::DeviceFilter;
use crate::io::read_file;
use crate::parse::{fields, lines, parse_u64};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const DEVICE_EXCLUDE: StringFlag = StringFlag {
    name: "collector.diskstats.device-exclude",
    default: r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$",
    help: "Regexp of diskstats devices to exclude (mutually exclusive to device-include).",
};
pub const DEVICE_INCLUDE: StringFlag = StringFlag {
    name: "collector.diskstats.device-include",
    default: "",
    help: "Regexp of diskstats devices to include (mutually exclusive to device-exclude).",
};
/// udev properties and the rotational flag barely ever change: re-read them
/// at most this often instead of on every scrape.
const INFO_TTL: Duration = Duration::from_secs(60);

/// The collector's flags, parsed once.
pub struct Options {
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&DEVICE_EXCLUDE, &DEVICE_INCLUDE])
    }

    /// The exclude pattern may be given as the deprecated
    /// `--collector.diskstats.ignored-devices`.
    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { filter: flags::filter(f, &DEVICE_EXCLUDE, &DEVICE_INCLUDE)? })
    }
}

/// One line of /proc/diskstats.
#[derive(Debug, PartialEq)]
pub struct DiskStat<'a> {
    pub major: u32,
    pub minor: u32,
    pub name: &'a [u8],
    /// The statistics columns present (11, 15 or 17 of them).
    pub stats: Vec<u64>,
}

/// Parses /proc/diskstats.
pub fn parse(buf: &[u8]) -> Option<Vec<DiskStat<'_>>> {
    let mut out = Vec::new();
    for line in lines(buf) {
        let mut f = fields(line);
        let major = parse_u64(f.next()?)? as u32;
        let minor = parse_u64(f.next()?)? as u32;
        let name = f.next()?;
        let mut stats: Vec<u64> = f.map(parse_u64).collect::<Option<_>>()?;
        // A short line's missing columns are 0, as procfs's Sscanf leaves them.
        if stats.len() < 11 {
            stats.resize(11, 0);
        }
        out.push(DiskStat { major, minor, name, stats });
    }
    Some(out)
}

/// The `E:` properties of a udev database file.
pub fn parse_udev(buf: &str) -> HashMap<String, String> {
    buf.lines()
        .filter_map(|l| l.strip_prefix("E:"))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// (metric, help, kind, scale) for each statistics column in order.
const STATS: [(&str, &str, Kind, f64); 17] = [
    ("node_disk_reads_completed_total", "The total number of reads completed successfully.", Kind::Counter, 1.0),
    ("node_disk_reads_merged_total", "The total number of reads merged.", Kind::Counter, 1.0),
    ("node_disk_read_bytes_total", "The total number of bytes read successfully.", Kind::Counter, 512.0),
    ("node_disk_read_time_seconds_total", "The total number of seconds spent by all reads.", Kind::Counter, 0.001),
    ("node_disk_writes_completed_total", "The total number of writes completed successfully.", Kind::Counter, 1.0),
    ("node_disk_writes_merged_total", "The number of writes merged.", Kind::Counter, 1.0),
    ("node_disk_written_bytes_total", "The total number of bytes written successfully.", Kind::Counter, 512.0),
    ("node_disk_write_time_seconds_total", "This is the total number of seconds spent by all writes.", Kind::Counter, 0.001),
    ("node_disk_io_now", "The number of I/Os currently in progress.", Kind::Gauge, 1.0),
    ("node_disk_io_time_seconds_total", "Total seconds spent doing I/Os.", Kind::Counter, 0.001),
    ("node_disk_io_time_weighted_seconds_total", "The weighted # of seconds spent doing I/Os.", Kind::Counter, 0.001),
    ("node_disk_discards_completed_total", "The total number of discards completed successfully.", Kind::Counter, 1.0),
    ("node_disk_discards_merged_total", "The total number of discards merged.", Kind::Counter, 1.0),
    ("node_disk_discarded_sectors_total", "The total number of sectors discarded successfully.", Kind::Counter, 1.0),
    ("node_disk_discard_time_seconds_total", "This is the total number of seconds spent by all discards.", Kind::Counter, 0.001),
    ("node_disk_flush_requests_total", "The total number of flush requests completed successfully", Kind::Counter, 1.0),
    (
        "node_disk_flush_requests_time_seconds_total",
        "This is the total number of seconds spent by all flush requests.",
        Kind::Counter,
        0.001,
    ),
];

const ATA: [(&str, &str, &str); 3] = [
    ("ID_ATA_WRITE_CACHE", "node_disk_ata_write_cache", "ATA disk has a write cache."),
    ("ID_ATA_WRITE_CACHE_ENABLED", "node_disk_ata_write_cache_enabled", "ATA disk has its write cache enabled."),
    ("ID_ATA_ROTATION_RATE_RPM", "node_disk_ata_rotation_rate_rpm", "ATA disk rotation rate in RPMs (0 for SSDs)."),
];

struct DeviceInfo {
    read_at: Instant,
    udev: HashMap<String, String>,
    rotational: String,
}

pub struct Collector {
    path: PathBuf,
    sys_block: PathBuf,
    udev_dir: Option<PathBuf>,
    filter: DeviceFilter,
    buf: Vec<u8>,
    info: HashMap<(u32, u32, String), DeviceInfo>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let udev_dir = p.udev_data.is_dir().then(|| p.udev_data.clone());
        if udev_dir.is_none() {
            tracing::info!(path = %p.udev_data.display(), "udev data directory not readable, disabling udev device properties");
        }
        Ok(Collector {
            path: p.proc("diskstats"),
            sys_block: p.sys("block"),
            udev_dir,
            filter: o.filter,
            buf: Vec::new(),
            info: HashMap::new(),
        })
    }

    fn device_info(&mut self, major: u32, minor: u32, dev: &str, now: Instant) -> &DeviceInfo {
        let key = (major, minor, dev.to_string());
        let fresh = self.info.get(&key).is_some_and(|i| now.duration_since(i.read_at) < INFO_TTL);
        if !fresh {
            let udev = self
                .udev_dir
                .as_ref()
                .and_then(|d| crate::io::read_text(&d.join(format!("b{major}:{minor}"))).ok())
                .map(|s| parse_udev(&s))
                .unwrap_or_default();
            let rotational = crate::io::read_u64(&self.sys_block.join(dev).join("queue/rotational"))
                .map(|v| format!("{v:b}"))
                .unwrap_or_else(|| "0".into());
            self.info.insert(key.clone(), DeviceInfo { read_at: now, udev, rotational });
        }
        &self.info[&key]
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut buf = std::mem::take(&mut self.buf);
        let res = read_file(&self.path, &mut buf).and_then(|_| {
            let disks = parse(&buf).ok_or_else(|| Error::parse(&self.path, "malformed line"))?;
            let now = Instant::now();
            let mut maj = itoa::Buffer::new();
            let mut min = itoa::Buffer::new();
            let mut seen = Vec::with_capacity(disks.len());
            for d in &disks {
                let dev = std::str::from_utf8(d.name).map_err(|_| Error::parse(&self.path, "invalid UTF-8"))?;
                if self.filter.ignored(dev) {
                    continue;
                }
                seen.push((d.major, d.minor, dev.to_string()));
                let info = self.device_info(d.major, d.minor, dev, now);
                let u = |k: &str| info.udev.get(k).map(String::as_str).unwrap_or("");
                let serial =
                    [u("SCSI_IDENT_SERIAL"), u("ID_SERIAL_SHORT"), u("ID_SERIAL")].into_iter().find(|s| !s.is_empty()).unwrap_or("");
                sink.family("node_disk_info", "Info of /sys/block/<block_device>.", Kind::Gauge).sample(
                    &[
                        ("device", dev),
                        ("major", maj.format(d.major)),
                        ("minor", min.format(d.minor)),
                        ("model", u("ID_MODEL")),
                        ("path", u("ID_PATH")),
                        ("revision", u("ID_REVISION")),
                        ("rotational", &info.rotational),
                        ("serial", serial),
                        ("wwn", u("ID_WWN")),
                    ],
                    1.0,
                );
                for ((name, help, kind, scale), v) in STATS.iter().zip(&d.stats) {
                    sink.family(name, help, *kind).sample(&[("device", dev)], *v as f64 * scale);
                }
                if !u("ID_FS_TYPE").is_empty() {
                    sink.family("node_disk_filesystem_info", "Info about disk filesystem.", Kind::Gauge).sample(
                        &[
                            ("device", dev),
                            ("type", u("ID_FS_TYPE")),
                            ("usage", u("ID_FS_USAGE")),
                            ("uuid", u("ID_FS_UUID")),
                            ("version", u("ID_FS_VERSION")),
                        ],
                        1.0,
                    );
                }
                if !u("DM_NAME").is_empty() {
                    sink.family("node_disk_device_mapper_info", "Info about disk device mapper.", Kind::Gauge).sample(
                        &[
                            ("device", dev),
                            ("lv_layer", u("DM_LV_LAYER")),
                            ("lv_name", u("DM_LV_NAME")),
                            ("name", u("DM_NAME")),
                            ("uuid", u("DM_UUID")),
                            ("vg_name", u("DM_VG_NAME")),
                        ],
                        1.0,
                    );
                }
                if !u("ID_ATA").is_empty() {
                    for (prop, name, help) in ATA {
                        if let Some(v) = info.udev.get(prop).and_then(|v| v.parse::<f64>().ok()) {
                            sink.family(name, help, Kind::Gauge).sample(&[("device", dev)], v);
                        }
                    }
                }
            }
            // Forget devices that went away.
            if self.info.len() > seen.len() {
                self.info.retain(|k, _| seen.contains(k));
            }
            Ok(())
        });
        self.buf = buf;
        res
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        let b = b"   8       0 sda 25354637 34367663 1003346126 18492372 28444756 11134226 505697032 63877960 0 9653880 82621804\n 259 0 nvme0n1 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n";
        let d = super::parse(b).unwrap();
        assert_eq!(d[0].name, b"sda");
        assert_eq!(d[0].stats.len(), 11);
        assert_eq!(d[1].stats.len(), 17);
        assert_eq!(
            super::parse(b"8 0 sda 1 2 3\n").map(|d| d[0].stats.clone()),
            Some(vec![1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0]),
            "short: zero-filled, as procfs"
        );
        assert!(super::parse(b"8 0 sda 1 x 3\n").is_none());
        assert!(super::parse(b"8 0 sda 1 2 3 4 5 6 7 8 9 10 x\n").is_none());
    }

    #[test]
    fn udev_properties() {
        let p = super::parse_udev("S:disk/by-id/x\nE:ID_MODEL=TOSHIBA\nE:ID_PATH=pci-0000:3b:00.0\nW:702\n");
        assert_eq!(p["ID_MODEL"], "TOSHIBA");
        assert_eq!(p["ID_PATH"], "pci-0000:3b:00.0");
        assert_eq!(p.len(), 2);
    }
}
