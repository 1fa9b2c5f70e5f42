//! `fibrechannel`: Fibre Channel host adapters from /sys/class/fc_host. For
//! each host it exports `node_fibrechannel_info` (speed, port state, type,
//! id and name, fabric name, symbolic name, supported classes and speeds,
//! dev_loss_tmo) and the counters of its `statistics` directory, except
//! those the firmware does not implement (all ones); a host whose port
//! state is unknown reports every counter as 0, as node_exporter does.

use std::io;
use std::path::{Path, PathBuf};

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// The attributes of a host, in the order procfs reads them; the `0x` of
/// the four hexadecimal ones is cut.
const ATTRS: [(&str, bool); 11] = [
    ("speed", false),
    ("port_state", false),
    ("port_type", false),
    ("node_name", true),
    ("port_id", true),
    ("port_name", true),
    ("fabric_name", true),
    ("dev_loss_tmo", false),
    ("symbolic_name", false),
    ("supported_classes", false),
    ("supported_speeds", false),
];

/// `node_fibrechannel_info`'s labels (sorted) and the attribute of each.
const INFO: [(&str, &str); 10] = [
    ("dev_loss_tmo", "dev_loss_tmo"),
    ("fabric_name", "fabric_name"),
    ("port_id", "port_id"),
    ("port_name", "port_name"),
    ("port_state", "port_state"),
    ("port_type", "port_type"),
    ("speed", "speed"),
    ("supported_classes", "supported_classes"),
    ("supported_speeds", "supported_speeds"),
    ("symbolic_name", "symbolic_name"),
];

/// (statistics file, family, help).
const COUNTERS: [(&str, &str, &str); 14] = [
    ("dumped_frames", "node_fibrechannel_dumped_frames_total", "Number of dumped frames"),
    ("error_frames", "node_fibrechannel_error_frames_total", "Number of errors in frames"),
    ("invalid_crc_count", "node_fibrechannel_invalid_crc_total", "Invalid Cyclic Redundancy Check count"),
    ("rx_frames", "node_fibrechannel_rx_frames_total", "Number of frames received"),
    ("rx_words", "node_fibrechannel_rx_words_total", "Number of words received by host port"),
    ("tx_frames", "node_fibrechannel_tx_frames_total", "Number of frames transmitted by host port"),
    ("tx_words", "node_fibrechannel_tx_words_total", "Number of words transmitted by host port"),
    ("seconds_since_last_reset", "node_fibrechannel_seconds_since_last_reset_total", "Number of seconds since last host port reset"),
    ("invalid_tx_word_count", "node_fibrechannel_invalid_tx_words_total", "Number of invalid words transmitted by host port"),
    ("link_failure_count", "node_fibrechannel_link_failure_total", "Number of times the host port link has failed"),
    ("loss_of_sync_count", "node_fibrechannel_loss_of_sync_total", "Number of failures on either bit or transmission word boundaries"),
    ("loss_of_signal_count", "node_fibrechannel_loss_of_signal_total", "Number of times signal has been lost"),
    ("nos_count", "node_fibrechannel_nos_total", "Number Not_Operational Primitive Sequence received by host port"),
    ("fcp_packet_aborts", "node_fibrechannel_fcp_packet_aborts_total", "Number of aborted packets"),
];

/// The value of a counter the HBA firmware does not implement.
const UNIMPLEMENTED: u64 = u64::MAX;

/// An attribute as procfs keeps it: the first 128 bytes of the file,
/// trimmed, with the first two characters (`0x`) of hexadecimal ones cut
/// when there is more.
pub fn attr_value(raw: &[u8], hex: bool) -> String {
    let raw = &raw[..raw.len().min(128)];
    let v = String::from_utf8_lossy(raw);
    let v = v.trim();
    if hex && v.len() > 2 {
        String::from_utf8_lossy(&v.as_bytes()[2..]).into_owned()
    } else {
        v.to_string()
    }
}

/// One host: its attributes (`None` when absent) and counters.
#[derive(Debug, Default)]
pub struct Host {
    pub name: String,
    /// By index in [`ATTRS`].
    pub attrs: [Option<String>; ATTRS.len()],
    /// By index in [`COUNTERS`].
    pub counters: [Option<u64>; COUNTERS.len()],
}

impl Host {
    fn attr(&self, name: &str) -> Option<&str> {
        ATTRS.iter().position(|(a, _)| *a == name).and_then(|i| self.attrs[i].as_deref())
    }
}

pub struct Collector {
    /// /sys/class/fc_host.
    dir: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { dir: p.sys("class/fc_host"), buf: Vec::with_capacity(4096) }
    }

    fn host(&mut self, name: &str) -> Result<Host, Error> {
        let path = self.dir.join(name);
        let mut host = Host { name: name.to_string(), ..Default::default() };
        for (i, (attr, hex)) in ATTRS.iter().enumerate() {
            let p = path.join(attr);
            match crate::io::read_into(&p, &mut self.buf) {
                Ok(()) => host.attrs[i] = Some(attr_value(&self.buf, *hex)),
                // Drivers need not expose every attribute.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&p, e)),
            }
        }
        self.statistics(&path.join("statistics"), &mut host)?;
        Ok(host)
    }

    fn statistics(&mut self, dir: &Path, host: &mut Host) -> Result<(), Error> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(dir, e)),
        };
        let mut entries = Vec::new();
        for e in rd {
            let e = e.map_err(|e| Error::io(dir, e))?;
            entries.push((e.file_name().to_string_lossy().into_owned(), e));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (file, entry) in entries {
            if file == "reset_statistics" || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let path = entry.path();
            match crate::io::read_into(&path, &mut self.buf) {
                Ok(()) => {}
                // Write-only and unsupported attributes.
                Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::EOPNOTSUPP) => continue,
                Err(e) => return Err(Error::io(&path, e)),
            }
            let Some(i) = COUNTERS.iter().position(|(f, _, _)| *f == file) else { continue };
            let value = attr_value(&self.buf, false);
            let v = crate::parse::parse_go_uint(&value).ok_or_else(|| Error::parse(&path, format!("invalid counter value {value:?}")))?;
            host.counters[i] = Some(v);
        }
        Ok(())
    }
}

fn write(sink: &mut Sink, host: &Host) {
    let mut labels: Vec<(&str, &str)> = Vec::with_capacity(INFO.len() + 1);
    for (label, attr) in INFO {
        labels.push((label, host.attr(attr).unwrap_or("")));
    }
    labels.insert(2, ("fc_host", &host.name));
    sink.family("node_fibrechannel_info", "Non-numeric data from /sys/class/fc_host/<host>, value is always 1.", Kind::Gauge)
        .sample(&labels, 1.0);
    // A disabled host has no statistics: node_exporter reports zeros.
    let unknown = host.attr("port_state").is_none_or(|s| s == "Unknown");
    for ((_, family, help), v) in COUNTERS.iter().zip(&host.counters) {
        let v = if unknown { Some(0) } else { *v };
        // node_exporter dereferences a missing counter of a known-state
        // host (and panics); it is left out here.
        if let Some(v) = v.filter(|&v| v != UNIMPLEMENTED) {
            sink.family(family, help, Kind::Counter).sample(&[("fc_host", &host.name)], v as f64);
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let rd = std::fs::read_dir(&self.dir).map_err(|e| {
            let e = Error::from_read(&self.dir, e);
            if e.is_no_data() {
                tracing::debug!("fibrechannel statistics not found, skipping");
            }
            e
        })?;
        let mut names = Vec::new();
        for e in rd {
            names.push(e.map_err(|e| Error::io(&self.dir, e))?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        for name in names {
            let host = self.host(&name)?;
            write(sink, &host);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn attribute_values() {
        assert_eq!(attr_value(b"0x1000e0071bce95f2\n", true), "1000e0071bce95f2");
        assert_eq!(attr_value(b"0x0\n", true), "0");
        assert_eq!(attr_value(b"0x\n", true), "0x");
        assert_eq!(attr_value(b"  16 Gbit\n", false), "16 Gbit");
        let long = "x".repeat(200);
        assert_eq!(attr_value(long.as_bytes(), false).len(), 128, "procfs reads 128 bytes");
    }

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// node_exporter's fixture, host0 in part and host1 whole.
    fn fixture(root: &Path) {
        let h = "class/fc_host/host0";
        for (f, v) in [
            ("port_name", "0x1000e0071bce95f2"),
            ("port_type", "Point-To-Point (direct nport connection)"),
            ("port_state", "Online"),
            ("supported_classes", "Class 3"),
            ("node_name", "0x2000e0071bce95f2"),
            ("supported_speeds", "4 Gbit, 8 Gbit, 16 Gbit"),
            ("symbolic_name", "Emulex SN1100E2P FV12.4.270.3 DV12.4.0.0. HN:gotest. OS:Linux"),
            ("dev_loss_tmo", "30"),
            ("speed", "16 Gbit"),
            ("port_id", "0x000002"),
            ("fabric_name", "0x0"),
            ("statistics/fcp_packet_aborts", "0x13"),
            ("statistics/dumped_frames", "0xffffffffffffffff"),
            ("statistics/error_frames", "0x0"),
            ("statistics/tx_words", "0x6"),
            ("statistics/fc_xid_busy", "0x1"),
        ] {
            put(root, &format!("{h}/{f}"), &format!("{v}\n"));
        }
        let h = "class/fc_host/host1";
        put(root, &format!("{h}/port_state"), "Online\n");
        put(root, &format!("{h}/speed"), "8 Gbit\n");
        for (i, (f, _, _)) in COUNTERS.iter().enumerate() {
            let v = if *f == "fcp_packet_aborts" { "0xffffffffffffffff".to_string() } else { format!("{:#x}", i * 16) };
            put(root, &format!("{h}/statistics/{f}"), &format!("{v}\n"));
        }
    }

    type Out = Vec<(String, Vec<(String, String)>, f64)>;

    fn scrape(root: &Path) -> Result<Out, Error> {
        let p = Paths { procfs: "/nonexistent".into(), sysfs: root.into(), rootfs: "/".into(), udev_data: "/nonexistent".into() };
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        let mut out = Vec::new();
        for f in sink.families() {
            assert_eq!(f.kind(), if f.name() == "node_fibrechannel_info" { Kind::Gauge } else { Kind::Counter });
            for (l, v) in f.samples() {
                out.push((f.name().to_string(), l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v));
            }
        }
        Ok(out)
    }

    fn value(out: &Out, name: &str, host: &str) -> Option<f64> {
        out.iter().find(|s| s.0 == name && s.1.iter().any(|(k, v)| k == "fc_host" && v == host)).map(|s| s.2)
    }

    #[test]
    fn reads_hosts() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let out = scrape(dir.path()).unwrap();
        let info: Vec<_> = out.iter().filter(|s| s.0 == "node_fibrechannel_info").collect();
        let l = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(
            info[0].1,
            l(&[
                ("dev_loss_tmo", "30"),
                ("fabric_name", "0"),
                ("fc_host", "host0"),
                ("port_id", "000002"),
                ("port_name", "1000e0071bce95f2"),
                ("port_state", "Online"),
                ("port_type", "Point-To-Point (direct nport connection)"),
                ("speed", "16 Gbit"),
                ("supported_classes", "Class 3"),
                ("supported_speeds", "4 Gbit, 8 Gbit, 16 Gbit"),
                ("symbolic_name", "Emulex SN1100E2P FV12.4.270.3 DV12.4.0.0. HN:gotest. OS:Linux"),
            ])
        );
        assert_eq!(info[1].1.iter().filter(|(_, v)| v.is_empty()).count(), 8, "host1 lacks most attributes");
        assert_eq!(value(&out, "node_fibrechannel_fcp_packet_aborts_total", "host0"), Some(19.0));
        assert_eq!(value(&out, "node_fibrechannel_dumped_frames_total", "host0"), None, "unimplemented");
        assert_eq!(value(&out, "node_fibrechannel_rx_frames_total", "host0"), None, "absent");
        assert_eq!(value(&out, "node_fibrechannel_fcp_packet_aborts_total", "host1"), None);
        assert_eq!(value(&out, "node_fibrechannel_error_frames_total", "host1"), Some(16.0));
        assert_eq!(out.iter().filter(|s| s.1[0].1 == "host1").count(), 13);
    }

    #[test]
    fn an_unknown_port_state_reports_zeros() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "class/fc_host/host7/port_state", "Unknown\n");
        put(dir.path(), "class/fc_host/host8/speed", "unknown\n");
        put(dir.path(), "class/fc_host/host8/statistics/tx_words", "0xffffffffffffffff\n");
        let out = scrape(dir.path()).unwrap();
        for h in ["host7", "host8"] {
            for (_, family, _) in COUNTERS {
                assert_eq!(value(&out, family, h), Some(0.0), "{h} {family}");
            }
        }
    }

    #[test]
    fn errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path()).unwrap_err().is_no_data(), "no fc_host class");
        put(dir.path(), "class/fc_host/host0/port_state", "Online\n");
        put(dir.path(), "class/fc_host/host0/statistics/tx_words", "many\n");
        assert!(matches!(scrape(dir.path()).unwrap_err(), Error::Parse { .. }));
        put(dir.path(), "class/fc_host/host0/statistics/tx_words", "0x1\n");
        put(dir.path(), "class/fc_host/host0/statistics/reset_statistics", "not read\n");
        put(dir.path(), "class/fc_host/host0/statistics/lip_count", "not parsed\n");
        assert_eq!(value(&scrape(dir.path()).unwrap(), "node_fibrechannel_tx_words_total", "host0"), Some(1.0));
        put(dir.path(), "class/fc_host/stray", "a file, not a host\n");
        assert!(matches!(scrape(dir.path()).unwrap_err(), Error::Io { .. }), "node_exporter fails on it too");
    }
}
