//! `drbd`: the DRBD 8 status file /proc/drbd, read word by word as
//! node_exporter does: each `N:` word starts device `drbdN`, and the
//! `key:value` words after it become `node_drbd_*` families: the byte and
//! request counters and gauges (`ns`, `nr`, `dw`, `dr`, `al`, `bm`, `lo`,
//! `pe`, `ua`, `ap`, `ep`, `oos`; the KiB ones scaled to bytes), the
//! local/remote role and disk state (`ro`, `ds`) as 0/1 per node, and the
//! connection state (`cs`). No /proc/drbd is no data.

use std::path::PathBuf;

use crate::{Error, Paths};
use expo::{Kind, Sink};

/// A numeric field of /proc/drbd and the family it becomes.
pub struct Numeric {
    pub key: &'static str,
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// The field's unit in bytes (KiB fields are 1024), or 1.
    pub multiplier: f64,
}

const fn num(key: &'static str, name: &'static str, help: &'static str, kind: Kind, multiplier: f64) -> Numeric {
    Numeric { key, name, help, kind, multiplier }
}

pub const NUMERIC: &[Numeric] = &[
    num("ns", "node_drbd_network_sent_bytes_total", "Total number of bytes sent via the network.", Kind::Counter, 1024.0),
    num("nr", "node_drbd_network_received_bytes_total", "Total number of bytes received via the network.", Kind::Counter, 1.0),
    num("dw", "node_drbd_disk_written_bytes_total", "Net data written on local hard disk; in bytes.", Kind::Counter, 1024.0),
    num("dr", "node_drbd_disk_read_bytes_total", "Net data read from local hard disk; in bytes.", Kind::Counter, 1024.0),
    num("al", "node_drbd_activitylog_writes_total", "Number of updates of the activity log area of the meta data.", Kind::Counter, 1.0),
    num("bm", "node_drbd_bitmap_writes_total", "Number of updates of the bitmap area of the meta data.", Kind::Counter, 1.0),
    num("lo", "node_drbd_local_pending", "Number of open requests to the local I/O sub-system.", Kind::Gauge, 1.0),
    num(
        "pe",
        "node_drbd_remote_pending",
        "Number of requests sent to the peer, but that have not yet been answered by the latter.",
        Kind::Gauge,
        1.0,
    ),
    num(
        "ua",
        "node_drbd_remote_unacknowledged",
        "Number of requests received by the peer via the network connection, but that have not yet been answered.",
        Kind::Gauge,
        1.0,
    ),
    num(
        "ap",
        "node_drbd_application_pending",
        "Number of block I/O requests forwarded to DRBD, but not yet answered by DRBD.",
        Kind::Gauge,
        1.0,
    ),
    num("ep", "node_drbd_epochs", "Number of Epochs currently on the fly.", Kind::Gauge, 1.0),
    num("oos", "node_drbd_out_of_sync_bytes", "Amount of data known to be out of sync; in bytes.", Kind::Gauge, 1024.0),
];

/// A `local/remote` field of /proc/drbd, 1 where a side equals `ok`.
pub struct Pair {
    pub key: &'static str,
    pub name: &'static str,
    pub help: &'static str,
    pub ok: &'static str,
}

pub const PAIRS: &[Pair] = &[
    Pair {
        key: "ro",
        name: "node_drbd_node_role_is_primary",
        help: "Whether the role of the node is in the primary state.",
        ok: "Primary",
    },
    Pair { key: "ds", name: "node_drbd_disk_state_is_up_to_date", help: "Whether the disk of the node is up to date.", ok: "UpToDate" },
];

const CONNECTED: &str = "node_drbd_connected";
const CONNECTED_HELP: &str = "Whether DRBD is connected to the peer.";

/// One value of one device, in file order.
#[derive(Debug, PartialEq)]
pub enum Value {
    /// `NUMERIC[i]`, already scaled.
    Numeric(usize, f64),
    /// `PAIRS[i]`: local and remote.
    Pair(usize, f64, f64),
    /// `cs:Connected` or not.
    Connected(bool),
}

/// A value and its device (`drbdN`, or `unknown` before the first `N:`).
#[derive(Debug, PartialEq)]
pub struct Stat {
    pub device: String,
    pub value: Value,
}

/// Parses /proc/drbd. Words that are not one `key:value` pair, and keys
/// it does not know, are skipped; a numeric field that is not a number
/// (or a pair field without `/`) is an error.
pub fn parse_drbd(text: &str) -> Result<Vec<Stat>, String> {
    let mut out = Vec::new();
    let mut device = String::from("unknown");
    for word in text.split_whitespace() {
        let mut kv = word.split(':');
        let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else { continue };
        if value.is_empty() && !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(id) = key.parse::<u64>() {
                device = format!("drbd{id}");
                continue;
            }
        }
        let value = if let Some(i) = NUMERIC.iter().position(|m| m.key == key) {
            let v: f64 = value.parse().map_err(|_| format!("{key}: not a number: {value:?}"))?;
            Value::Numeric(i, v * NUMERIC[i].multiplier)
        } else if let Some(i) = PAIRS.iter().position(|m| m.key == key) {
            let mut sides = value.split('/');
            let (Some(local), Some(remote)) = (sides.next(), sides.next()) else {
                return Err(format!("{key}: not a local/remote pair: {value:?}"));
            };
            let ok = |s: &str| if s == PAIRS[i].ok { 1.0 } else { 0.0 };
            Value::Pair(i, ok(local), ok(remote))
        } else if key == "cs" {
            Value::Connected(value == "Connected")
        } else {
            tracing::trace!(key, value, "drbd: unhandled key-value pair");
            continue;
        };
        out.push(Stat { device: device.clone(), value });
    }
    Ok(out)
}

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("drbd"), buf: Vec::with_capacity(4096) }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        crate::io::read_file(&self.path, &mut self.buf)?;
        let text = String::from_utf8_lossy(&self.buf);
        let stats = parse_drbd(&text).map_err(|m| Error::parse(&self.path, m))?;
        for s in &stats {
            let dev = s.device.as_str();
            match s.value {
                Value::Numeric(i, v) => {
                    let m = &NUMERIC[i];
                    sink.family(m.name, m.help, m.kind).sample(&[("device", dev)], v);
                }
                Value::Pair(i, local, remote) => {
                    let m = &PAIRS[i];
                    sink.family(m.name, m.help, Kind::Gauge)
                        .sample(&[("device", dev), ("node", "local")], local)
                        .sample(&[("device", dev), ("node", "remote")], remote);
                }
                Value::Connected(c) => {
                    sink.family(CONNECTED, CONNECTED_HELP, Kind::Gauge).sample(&[("device", dev)], if c { 1.0 } else { 0.0 });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    const FIXTURE: &str = "Version: 8.4.3 (api:1/proto:86-101)
srcversion: 1A9F77B1CA5FF92235C2213 

 1: cs:Connected ro:Primary/Primary ds:UpToDate/UpToDate C r-----
    ns:17324442 nr:10961011 dw:28263521 dr:118696670 al:1100 bm:221 lo:12345 pe:12346 ua:12347 ap:12348 ep:1 wo:d oos:12349
";

    #[test]
    fn parses_the_fixture() {
        let s = parse_drbd(FIXTURE).unwrap();
        assert_eq!(s.len(), 15);
        assert!(s.iter().all(|s| s.device == "drbd1"));
        assert_eq!(s[0].value, Value::Connected(true));
        assert_eq!(s[1].value, Value::Pair(0, 1.0, 1.0));
        assert_eq!(s[3].value, Value::Numeric(0, 17324442.0 * 1024.0));
        assert_eq!(s[4].value, Value::Numeric(1, 10961011.0));
        assert_eq!(s[14].value, Value::Numeric(11, 12349.0 * 1024.0));
    }

    #[test]
    fn devices_states_and_unknown() {
        let s = parse_drbd("ep:2 0: cs:WFConnection ro:Secondary/Unknown ds:UpToDate/DUnknown 12: lo:3 +3: a:b:c").unwrap();
        assert_eq!(
            s,
            vec![
                Stat { device: "unknown".into(), value: Value::Numeric(10, 2.0) },
                Stat { device: "drbd0".into(), value: Value::Connected(false) },
                Stat { device: "drbd0".into(), value: Value::Pair(0, 0.0, 0.0) },
                Stat { device: "drbd0".into(), value: Value::Pair(1, 1.0, 0.0) },
                Stat { device: "drbd12".into(), value: Value::Numeric(6, 3.0) },
            ]
        );
    }

    #[test]
    fn malformed_values_are_errors() {
        assert!(parse_drbd("1: ns:abc").is_err());
        assert!(parse_drbd("1: ro:Primary").is_err());
        assert!(parse_drbd("").unwrap().is_empty());
    }

    #[test]
    fn collects_and_reports_no_data() {
        let d = tempfile::tempdir().unwrap();
        let p = testutil::paths(d.path());
        let mut c = Collector::new(&p);
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(e.is_no_data(), "{e}");
        testutil::write(d.path(), "proc/drbd", FIXTURE);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let rows = testutil::rows(&sink);
        assert_eq!(rows.len(), 17);
        let ro: Vec<_> = rows.iter().filter(|r| r.0 == "node_drbd_node_role_is_primary").collect();
        assert_eq!(ro.len(), 2);
        assert_eq!(ro[1].1, vec![("device".into(), "drbd1".into()), ("node".into(), "remote".into())]);
        testutil::write(d.path(), "proc/drbd", "1: ns:x\n");
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data(), "{e}");
    }
}
