//! `qdisc`: the statistics of every device's root queueing discipline, as
//! node_exporter 1.12 reads them through github.com/ema/qdisc: an
//! RTM_GETQDISC netlink dump (bytes, packets, drops, requeues, overlimits,
//! queue length and backlog from TCA_STATS2 and the legacy TCA_STATS), or,
//! with `--collector.qdisc.fixtures=DIR`, the JSON list of that library's
//! `QdiscInfo` records in `DIR/results.json`. Exported as `node_qdisc_*`
//! labelled by device and qdisc kind; devices are filtered by
//! `--collector.qdisc.device-include`/`-exclude`.

use std::collections::HashMap;
use std::path::PathBuf;

use netlink_packet_route::link::LinkAttribute;
use netlink_packet_route::tc::{TcAttribute, TcMessage, TcStats2};

use crate::filter::DeviceFilter;
use crate::flags::{self, Flags, Hidden, StringFlag};
use crate::netlink::{attr, Route};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const FIXTURES: StringFlag =
    StringFlag { name: "collector.qdisc.fixtures", default: "", help: "test fixtures to use for qdisc collector end-to-end testing" };
pub const INCLUDE: StringFlag = StringFlag {
    name: "collector.qdisc.device-include",
    default: "",
    help: "Regexp of qdisc devices to include (mutually exclusive to device-exclude).",
};
/// Read through [`INCLUDE`] (`StringFlag::value`).
pub const OLD_INCLUDE: Hidden<StringFlag> =
    Hidden(StringFlag { name: "collector.qdisk.device-include", default: "", help: "DEPRECATED: Use collector.qdisc.device-include" });
pub const EXCLUDE: StringFlag = StringFlag {
    name: "collector.qdisc.device-exclude",
    default: "",
    help: "Regexp of qdisc devices to exclude (mutually exclusive to device-include).",
};
/// Read through [`EXCLUDE`] (`StringFlag::value`).
pub const OLD_EXCLUDE: Hidden<StringFlag> =
    Hidden(StringFlag { name: "collector.qdisk.device-exclude", default: "", help: "DEPRECATED: Use collector.qdisc.device-exclude" });

pub struct Options {
    /// The fixtures directory; `None` reads the kernel.
    pub fixtures: Option<PathBuf>,
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<clap::Arg> {
        flags::args(&[&FIXTURES, &INCLUDE, &OLD_INCLUDE, &EXCLUDE, &OLD_EXCLUDE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        // `value` resolves the deprecated `qdisk` spellings (with
        // node_exporter's warning, or its error when both are given).
        let (exclude, _) = EXCLUDE.value(f)?;
        let (include, _) = INCLUDE.value(f)?;
        if !exclude.is_empty() && !include.is_empty() {
            return Err(INCLUDE.invalid(format!("{} and {} are mutaly exclusive", INCLUDE.name, EXCLUDE.name)));
        }
        let filter = DeviceFilter::new(EXCLUDE.compile(exclude)?, INCLUDE.compile(include)?);
        let fixtures = FIXTURES.get(f);
        Ok(Options { fixtures: (!fixtures.is_empty()).then(|| PathBuf::from(fixtures)), filter })
    }
}

/// One qdisc, the fields of ema/qdisc's `QdiscInfo` node_exporter reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QdiscInfo {
    pub iface_name: String,
    /// 0 for a root qdisc (the kernel's TC_H_ROOT is mapped to 0).
    pub parent: u32,
    pub kind: String,
    pub bytes: u64,
    pub packets: u32,
    pub drops: u32,
    pub requeues: u32,
    pub overlimits: u32,
    pub qlen: u32,
    pub backlog: u32,
}

/// The kernel's TC_H_ROOT parent handle.
const TC_H_ROOT: u32 = u32::MAX;

/// One qdisc of a netlink dump, as ema/qdisc reads it: attributes in the
/// kernel's order, TCA_STATS2 setting every counter (zero when its basic or
/// queue part is absent) and the legacy TCA_STATS, when it follows, setting
/// all but requeues again. A device the link dump did not name is "".
pub fn info(msg: &TcMessage, names: &HashMap<u32, String>) -> QdiscInfo {
    let parent = u32::from(msg.header.parent);
    let mut q = QdiscInfo {
        iface_name: u32::try_from(msg.header.index).ok().and_then(|i| names.get(&i)).cloned().unwrap_or_default(),
        parent: if parent == TC_H_ROOT { 0 } else { parent },
        ..QdiscInfo::default()
    };
    for a in &msg.attributes {
        match a {
            TcAttribute::Kind(k) => q.kind = k.clone(),
            TcAttribute::Stats2(parts) => {
                let (mut bytes, mut packets, mut qlen, mut backlog, mut drops, mut requeues, mut overlimits) = (0, 0, 0, 0, 0, 0, 0);
                for p in parts {
                    match p {
                        TcStats2::Basic(b) => (bytes, packets) = (b.bytes, b.packets),
                        TcStats2::Queue(s) => {
                            (qlen, backlog, drops, requeues, overlimits) = (s.qlen, s.backlog, s.drops, s.requeues, s.overlimits)
                        }
                        _ => {}
                    }
                }
                q.bytes = bytes;
                q.packets = packets;
                q.drops = drops;
                q.requeues = requeues;
                q.overlimits = overlimits;
                q.qlen = qlen;
                q.backlog = backlog;
            }
            TcAttribute::Stats(s) => {
                q.bytes = s.bytes;
                q.packets = s.packets;
                q.drops = s.drops;
                q.overlimits = s.overlimits;
                q.qlen = s.qlen;
                q.backlog = s.backlog;
            }
            _ => {}
        }
    }
    q
}

/// ema/qdisc's `QdiscInfo` as the fixtures spell it (Go's encoding of the
/// struct: its field names, no tags). Every field is decoded, read or not,
/// so that a value of the wrong type or out of its field's range is an
/// error as in Go; `null` leaves a field zero. Unlike Go, keys match the
/// field names exactly (no case-insensitive fallback) and a repeated key is
/// an error.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
#[allow(dead_code)] // Handle and the fq counters: decoded for the type check.
struct GoQdiscInfo {
    iface_name: Option<String>,
    parent: Option<u32>,
    handle: Option<u32>,
    kind: Option<String>,
    bytes: Option<u64>,
    packets: Option<u32>,
    drops: Option<u32>,
    requeues: Option<u32>,
    overlimits: Option<u32>,
    gc_flows: Option<u64>,
    throttled: Option<u64>,
    flows_plimit: Option<u64>,
    qlen: Option<u32>,
    backlog: Option<u32>,
}

impl From<GoQdiscInfo> for QdiscInfo {
    fn from(q: GoQdiscInfo) -> Self {
        QdiscInfo {
            iface_name: q.iface_name.unwrap_or_default(),
            parent: q.parent.unwrap_or_default(),
            kind: q.kind.unwrap_or_default(),
            bytes: q.bytes.unwrap_or_default(),
            packets: q.packets.unwrap_or_default(),
            drops: q.drops.unwrap_or_default(),
            requeues: q.requeues.unwrap_or_default(),
            overlimits: q.overlimits.unwrap_or_default(),
            qlen: q.qlen.unwrap_or_default(),
            backlog: q.backlog.unwrap_or_default(),
        }
    }
}

/// The fixtures' `results.json`: a JSON array of `QdiscInfo` objects, as a
/// Go `[]qdisc.QdiscInfo` (`null`, for the array or an element, is empty
/// or the zero record). Unknown fields are ignored.
pub fn parse_results(text: &str) -> Result<Vec<QdiscInfo>, String> {
    let items: Option<Vec<Option<GoQdiscInfo>>> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(items.unwrap_or_default().into_iter().map(|q| q.map(QdiscInfo::from).unwrap_or_default()).collect())
}

pub struct Collector {
    fixtures: Option<PathBuf>,
    filter: DeviceFilter,
    route: Route,
}

impl Collector {
    pub fn new(o: Options, _p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { fixtures: o.fixtures, filter: o.filter, route: Route::new() })
    }

    fn read(&mut self) -> Result<Vec<QdiscInfo>, Error> {
        if let Some(dir) = &self.fixtures {
            let path = dir.join("results.json");
            let text = crate::io::read_text(&path).map_err(|e| Error::io(&path, e))?;
            return parse_results(&text).map_err(|msg| Error::parse(&path, msg));
        }
        let qdiscs = self.route.qdiscs()?;
        let names: HashMap<u32, String> = self
            .route
            .links_with(&[attr::IFNAME])?
            .into_iter()
            .filter_map(|l| {
                l.attributes
                    .into_iter()
                    .find_map(|a| match a {
                        LinkAttribute::IfName(n) => Some(n),
                        _ => None,
                    })
                    .map(|n| (l.header.index, n))
            })
            .collect();
        Ok(qdiscs.iter().map(|m| info(m, &names)).collect())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let all = self.read()?;
        let roots: Vec<&QdiscInfo> = all.iter().filter(|q| q.parent == 0 && !self.filter.ignored(&q.iface_name)).collect();
        type Field = fn(&QdiscInfo) -> f64;
        let families: [(&str, &str, Kind, Field); 7] = [
            ("node_qdisc_bytes_total", "Number of bytes sent.", Kind::Counter, |q| q.bytes as f64),
            ("node_qdisc_packets_total", "Number of packets sent.", Kind::Counter, |q| f64::from(q.packets)),
            ("node_qdisc_drops_total", "Number of packets dropped.", Kind::Counter, |q| f64::from(q.drops)),
            ("node_qdisc_requeues_total", "Number of packets dequeued, not transmitted, and requeued.", Kind::Counter, |q| {
                f64::from(q.requeues)
            }),
            ("node_qdisc_overlimits_total", "Number of overlimit packets.", Kind::Counter, |q| f64::from(q.overlimits)),
            ("node_qdisc_current_queue_length", "Number of packets currently in queue to be sent.", Kind::Gauge, |q| f64::from(q.qlen)),
            ("node_qdisc_backlog", "Number of bytes currently in queue to be sent.", Kind::Gauge, |q| f64::from(q.backlog)),
        ];
        for (name, help, kind, value) in families {
            let mut f = sink.family(name, help, kind);
            for q in &roots {
                f.sample(&[("device", &q.iface_name), ("kind", &q.kind)], value(q));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::tc::{TcHeader, TcStats, TcStatsBasic, TcStatsQueue};

    /// node_exporter's fixture (`qdisc/results.json`).
    const RESULTS: &str = r#"[
    {
        "IfaceName": "wlan0",
        "Bytes": 42,
        "Packets": 42,
        "Requeues": 1,
        "Kind": "fq",
        "Drops": 1
    },
    {
        "IfaceName": "eth0",
        "Bytes": 83,
        "Packets": 83,
        "Requeues": 2,
        "Kind": "pfifo_fast"
    }
]"#;

    #[test]
    fn reads_the_fixture() {
        let r = parse_results(RESULTS).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            QdiscInfo {
                iface_name: "wlan0".into(),
                kind: "fq".into(),
                bytes: 42,
                packets: 42,
                requeues: 1,
                drops: 1,
                ..Default::default()
            }
        );
        assert_eq!(r[1].iface_name, "eth0");
        assert_eq!((r[1].bytes, r[1].requeues, r[1].drops), (83, 2, 0));
    }

    #[test]
    fn json_as_go_decodes_it() {
        // Unknown fields, nulls, escapes; null elements are zero records.
        let r = parse_results(r#"[{"IfaceName":"a\u00e9\n","Parent":7,"Other":{"x":[1,2.5e3,true]},"Kind":null,"Qlen":4294967295}, null]"#)
            .unwrap();
        assert_eq!(r[0].iface_name, "aé\n");
        assert_eq!((r[0].parent, r[0].qlen, r[0].kind.as_str()), (7, u32::MAX, ""));
        assert_eq!(r[1], QdiscInfo::default());
        assert_eq!(parse_results("null").unwrap(), vec![]);
        assert_eq!(parse_results(" [] ").unwrap(), vec![]);
        assert_eq!(parse_results(r#"[{"Bytes":18446744073709551615}]"#).unwrap()[0].bytes, u64::MAX);
        // Keys match exactly: another spelling is an unknown field.
        assert_eq!(parse_results(r#"[{"ifacename":"x"}]"#).unwrap()[0].iface_name, "");
    }

    #[test]
    fn malformed_json_is_an_error() {
        for bad in [
            "",
            "{}",
            "[1]",
            r#"[{"Packets":4294967296}]"#,
            r#"[{"Packets":-1}]"#,
            r#"[{"Packets":1.5}]"#,
            r#"[{"Packets":"1"}]"#,
            r#"[{"Kind":1}]"#,
            r#"[{"Handle":-1}]"#,
            r#"[{"GcFlows":"1"}]"#,
            r#"[{"Kind":"a","Kind":"b"}]"#,
            r#"[{"Kind":"x"}"#,
            r#"[{"Kind":"x"}] x"#,
            r#"[{"Kind":"\q"}]"#,
            "[01]",
            "[1.]",
            r#"["a"#,
            "[tru]",
        ] {
            assert!(parse_results(bad).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(5000);
        assert!(parse_results(&deep).is_err());
    }

    fn msg(index: i32, parent: u32, attributes: Vec<TcAttribute>) -> TcMessage {
        let header = TcHeader { index, parent: parent.into(), ..Default::default() };
        TcMessage::from_parts(header, attributes)
    }

    #[test]
    fn netlink_qdiscs_as_ema_qdisc_reads_them() {
        let names: HashMap<u32, String> = [(2, "eth0".to_string())].into();
        let mut basic = TcStatsBasic::default();
        (basic.bytes, basic.packets) = (1000, 10);
        let mut queue = TcStatsQueue::default();
        (queue.qlen, queue.backlog, queue.drops, queue.requeues, queue.overlimits) = (1, 2, 3, 4, 5);
        let stats2 = TcAttribute::Stats2(vec![TcStats2::Basic(basic), TcStats2::Queue(queue)]);
        let mut old = TcStats::default();
        (old.bytes, old.packets, old.drops, old.overlimits, old.qlen, old.backlog) = (1001, 11, 6, 7, 8, 9);
        let legacy = TcAttribute::Stats(old);
        let q = info(&msg(2, u32::MAX, vec![TcAttribute::Kind("fq_codel".into()), stats2.clone(), legacy.clone()]), &names);
        assert_eq!(
            q,
            QdiscInfo {
                iface_name: "eth0".into(),
                parent: 0,
                kind: "fq_codel".into(),
                bytes: 1001,
                packets: 11,
                drops: 6,
                requeues: 4,
                overlimits: 7,
                qlen: 8,
                backlog: 9
            }
        );
        // TCA_STATS2 after the legacy one wins, and zeroes what it lacks.
        let q = info(&msg(3, 0x10000, vec![legacy, TcAttribute::Stats2(vec![])]), &names);
        assert_eq!(q, QdiscInfo { parent: 0x10000, ..Default::default() });
    }

    fn options(args: &[&str]) -> Result<Options, ConfigError> {
        let m = crate::registry::command().no_binary_name(true).try_get_matches_from(args).unwrap();
        Options::from_flags(&Flags::new(&m))
    }

    #[test]
    fn flags() {
        let o = options(&["--collector.qdisc.device-include=eth0"]).unwrap();
        assert!(o.fixtures.is_none());
        assert!(o.filter.ignored("wlan0") && !o.filter.ignored("eth0"));
        assert!(options(&["--collector.qdisc.device-include=a", "--collector.qdisc.device-exclude=b"]).is_err());
        assert!(options(&["--collector.qdisc.device-include=a", "--collector.qdisk.device-include=b"]).is_err());
        assert!(options(&["--collector.qdisc.device-include=("]).is_err());
        let o = options(&["--collector.qdisk.device-exclude=lo", "--collector.qdisc.fixtures=/x"]).unwrap();
        assert!(o.filter.ignored("lo") && !o.filter.ignored("eth0"));
        assert_eq!(o.fixtures, Some(PathBuf::from("/x")));
        let o = options(&[]).unwrap();
        assert!(!o.filter.ignored("anything"));
    }

    #[test]
    fn fixture_mode_writes_root_qdiscs_of_included_devices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("results.json"),
            r#"[{"IfaceName":"eth0","Kind":"mq","Bytes":5,"Qlen":2},
            {"IfaceName":"eth0","Kind":"fq","Parent":65537},{"IfaceName":"lo","Kind":"noqueue"}]"#,
        )
        .unwrap();
        let o =
            options(&[&format!("--collector.qdisc.fixtures={}", dir.path().display()), "--collector.qdisc.device-exclude=^lo$"]).unwrap();
        let mut c = Collector::new(o, &crate::testutil::paths(dir.path())).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let rows = crate::testutil::rows(&sink);
        assert_eq!(rows.len(), 7, "{rows:?}");
        let label = vec![("device".to_string(), "eth0".to_string()), ("kind".to_string(), "mq".to_string())];
        assert!(rows.contains(&("node_qdisc_bytes_total".into(), label.clone(), 5.0)));
        assert!(rows.contains(&("node_qdisc_current_queue_length".into(), label, 2.0)));
        // A missing file is an error (node_exporter's os.ReadFile), not "no data".
        std::fs::remove_file(dir.path().join("results.json")).unwrap();
        assert!(matches!(crate::Collector::update(&mut c, &mut Sink::new()), Err(Error::Io { .. })));
        std::fs::write(dir.path().join("results.json"), "[{").unwrap();
        assert!(matches!(crate::Collector::update(&mut c, &mut Sink::new()), Err(Error::Parse { .. })));
    }

    /// Against this kernel: loopback's root qdisc (`noqueue`) is in the dump.
    #[test]
    fn dumps_this_hosts_qdiscs() {
        let p = crate::testutil::paths(std::path::Path::new("/"));
        let mut c = Collector::new(Options { fixtures: None, filter: DeviceFilter::new(None, None) }, &p).unwrap();
        let all = c.read().expect("qdisc dump");
        assert!(all.iter().any(|q| q.iface_name == "lo" && q.parent == 0), "{all:?}");
    }
}
