//! `runit` (deprecated in node_exporter, default off): the state of every
//! runit service under `--collector.runit.servicedir`, read as
//! node_exporter 1.12.1 reads it through github.com/prometheus-community/go-runit:
//! each directory or symlink in the service directory is a service, and its
//! `supervise/status` record (runsv's 20 bytes: TAI64N time of the last
//! change, little-endian pid, paused/want/term flags, state) gives
//! `node_service_state` (0 down, 1 run, 2 finish), `node_service_desired_state`
//! (want `u` 1, else 0), `node_service_state_last_change_timestamp_seconds`,
//! and `node_service_normal_state` (1 unless `supervise/down` exists: go-runit
//! looks there, not at the service's own `down` file, and so does this), all
//! labelled `service` and the constant `supervisor="runit"`. A service whose
//! status cannot be read is skipped (logged at debug); an unreadable service
//! directory fails the scrape, as in node_exporter.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::flags::{Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const SERVICEDIR: StringFlag =
    StringFlag { name: "collector.runit.servicedir", default: "/etc/service", help: "Path to runit service directory." };

/// runit's TAI64 label of the Unix epoch: 2^62 + 10 (TAI-UTC in 1970).
const TAI_OFFSET: i64 = 4_611_686_018_427_387_914;
/// The length of runsv's `supervise/status` record.
pub const STATUS_LEN: usize = 20;

pub struct Options {
    pub servicedir: PathBuf,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        vec![SERVICEDIR.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        // go-runit reads /etc/service when given an empty directory
        let dir = SERVICEDIR.get(f);
        Ok(Options { servicedir: PathBuf::from(if dir.is_empty() { "/etc/service" } else { dir.as_str() }) })
    }
}

/// One service's `supervise/status`, decoded as go-runit does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Seconds since the Unix epoch of the last state change.
    pub timestamp: i64,
    pub pid: u32,
    /// 0 down, 1 run, 2 finish (the raw byte).
    pub state: u8,
    /// 1 when runsv wants the service up (`u`), else 0.
    pub want: u8,
}

/// Decodes runsv's status record: bytes 0..8 the TAI64 seconds (big
/// endian), 8..12 nanoseconds (unused), 12..16 the pid (little endian),
/// 16 paused, 17 want (`u`/`d`), 18 got TERM, 19 state. `buf` holds what
/// one read returned (go-runit reads once into a 20-byte buffer, so a
/// short record reads as zero-padded); an empty one is an error.
pub fn parse_status(buf: &[u8]) -> Result<Status, String> {
    if buf.is_empty() {
        return Err("empty status file".into());
    }
    let mut rec = [0u8; STATUS_LEN];
    let n = buf.len().min(STATUS_LEN);
    rec[..n].copy_from_slice(&buf[..n]);
    let tai = rec[..8].iter().fold(0i64, |acc, &b| acc.wrapping_shl(8).wrapping_add(i64::from(b)));
    let pid = u32::from_le_bytes([rec[12], rec[13], rec[14], rec[15]]);
    let want = u8::from(rec[17] == b'u');
    Ok(Status { timestamp: tai.wrapping_sub(TAI_OFFSET), pid, state: rec[19], want })
}

pub struct Collector {
    servicedir: PathBuf,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        tracing::warn!(collector = "runit", "This collector is deprecated and will be removed in the next major version release.");
        Ok(Collector { servicedir: o.servicedir })
    }
}

/// The services of `dir` (directories and symlinks), sorted by name as Go's
/// `os.ReadDir` returns them.
fn services(dir: &Path) -> Result<Vec<String>, Error> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let Ok(t) = entry.file_type() else { continue };
        if t.is_dir() || t.is_symlink() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// One read of at most 20 bytes, as go-runit does (non-blocking open: a FIFO
/// planted there must not hang the scrape).
fn read_status(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = crate::io::open_nonblocking(path)?;
    let mut buf = [0u8; STATUS_LEN];
    let n = f.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        for name in services(&self.servicedir)? {
            let supervise = self.servicedir.join(&name).join("supervise");
            let path = supervise.join("status");
            let status = match read_status(&path).map_err(|e| e.to_string()).and_then(|b| parse_status(&b)) {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(service = %name, err = %e, "Couldn't get status");
                    continue;
                }
            };
            let normally_up = std::fs::metadata(supervise.join("down")).is_err();
            tracing::debug!(service = %name, status = status.state, pid = status.pid, "duration");
            let labels = [("service", name.as_str()), ("supervisor", "runit")];
            sink.family("node_service_state", "State of runit service.", Kind::Gauge).sample(&labels, f64::from(status.state));
            sink.family("node_service_desired_state", "Desired state of runit service.", Kind::Gauge)
                .sample(&labels, f64::from(status.want));
            sink.family(
                "node_service_state_last_change_timestamp_seconds",
                "Unix timestamp of the last runit service state change.",
                Kind::Gauge,
            )
            .sample(&labels, status.timestamp as f64);
            sink.family("node_service_normal_state", "Normal state of runit service.", Kind::Gauge)
                .sample(&labels, if normally_up { 1.0 } else { 0.0 });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    /// A record as runsv writes it: TAI64N of 2024-01-02T03:04:05Z, pid
    /// 0x01020304, not paused, want up, no TERM, state run.
    fn record(unix: i64, pid: u32, want: u8, state: u8) -> [u8; 20] {
        let mut r = [0u8; 20];
        r[..8].copy_from_slice(&((unix + TAI_OFFSET) as u64).to_be_bytes());
        r[8..12].copy_from_slice(&123_456_789u32.to_be_bytes());
        r[12..16].copy_from_slice(&pid.to_le_bytes());
        r[17] = want;
        r[19] = state;
        r
    }

    #[test]
    fn decodes_runsv_record() {
        let s = parse_status(&record(1_704_164_645, 0x0102_0304, b'u', 1)).unwrap();
        assert_eq!(s, Status { timestamp: 1_704_164_645, pid: 0x0102_0304, state: 1, want: 1 });
        let s = parse_status(&record(1_000, 0, b'd', 0)).unwrap();
        assert_eq!((s.timestamp, s.pid, s.state, s.want), (1_000, 0, 0, 0));
        // finish state; a want byte other than u/d leaves go-runit's zero
        let s = parse_status(&record(5, 77, b'x', 2)).unwrap();
        assert_eq!((s.state, s.want, s.pid), (2, 0, 77));
    }

    #[test]
    fn go_runit_fixture() {
        // go-runit's runit/fixtures/service/foo/supervise/status: pid 123, up, want up
        let raw = [0x40, 0, 0, 0, 0x52, 0x74, 0xcd, 0xd7, 0x1c, 0x9d, 0x08, 0xfc, 0x7b, 0, 0, 0, 0, 0x75, 0, 1];
        let s = parse_status(&raw).unwrap();
        assert_eq!(s, Status { timestamp: 0x5274_cdd7 - 10, pid: 123, state: 1, want: 1 });
        // 2013-11-02T10:02:53Z (11:02:53 CET, go-runit's fooTimeStamp)
        assert_eq!(s.timestamp, 1_383_386_573);
    }

    #[test]
    fn short_and_empty_records() {
        assert!(parse_status(&[]).is_err());
        // a short read is zero-padded, as go-runit's single Read into 20 bytes
        let s = parse_status(&[0x40, 0, 0, 0, 0, 0, 0, 10]).unwrap();
        assert_eq!((s.timestamp, s.pid, s.state, s.want), (0, 0, 0, 0));
        // a garbage TAI label wraps as Go's int64 arithmetic does, never panics
        let s = parse_status(&[0xff; 20]).unwrap();
        assert_eq!(s.timestamp, (-1i64).wrapping_sub(TAI_OFFSET));
        assert_eq!(s.pid, u32::MAX);
    }

    #[test]
    fn collects_a_service_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (name, rec) in [("a", record(100, 5, b'u', 1)), ("b", record(200, 0, b'd', 0))] {
            std::fs::create_dir_all(root.join(name).join("supervise")).unwrap();
            std::fs::write(root.join(name).join("supervise/status"), rec).unwrap();
        }
        // b is normally down the way go-runit looks for it
        std::fs::write(root.join("b/supervise/down"), "").unwrap();
        // a service without a status record is skipped; a plain file is no service
        std::fs::create_dir_all(root.join("c")).unwrap();
        std::fs::write(root.join("README"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("d")).unwrap();
        let p = crate::testutil::paths(Path::new("/nonexistent"));
        let mut c = Collector::new(Options { servicedir: root.to_path_buf() }, &p).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        let mut got = Vec::new();
        for f in sink.families() {
            for (l, v) in f.samples() {
                got.push(format!("{}{{{}}} {v}", f.name(), l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")));
            }
        }
        got.sort();
        let want = [
            "node_service_desired_state{service=a,supervisor=runit} 1",
            "node_service_desired_state{service=b,supervisor=runit} 0",
            "node_service_desired_state{service=d,supervisor=runit} 1",
            "node_service_normal_state{service=a,supervisor=runit} 1",
            "node_service_normal_state{service=b,supervisor=runit} 0",
            "node_service_normal_state{service=d,supervisor=runit} 1",
            "node_service_state_last_change_timestamp_seconds{service=a,supervisor=runit} 100",
            "node_service_state_last_change_timestamp_seconds{service=b,supervisor=runit} 200",
            "node_service_state_last_change_timestamp_seconds{service=d,supervisor=runit} 100",
            "node_service_state{service=a,supervisor=runit} 1",
            "node_service_state{service=b,supervisor=runit} 0",
            "node_service_state{service=d,supervisor=runit} 1",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn missing_service_dir_fails() {
        let p = crate::testutil::paths(Path::new("/nonexistent"));
        let mut c = Collector::new(Options { servicedir: "/nonexistent/runit".into() }, &p).unwrap();
        let e = c.update(&mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data(), "node_exporter returns the ReadDir error: {e}");
    }
}
