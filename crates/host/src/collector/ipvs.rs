//! `ipvs`: IP Virtual Server statistics. Reads the totals of
//! /proc/net/ip_vs_stats (connections, packets and bytes in and out, as
//! hexadecimal counters) and the virtual/real server table of /proc/net/ip_vs,
//! and exports the totals as counters and, per backend (summed over the
//! labels chosen with `--collector.ipvs.backend-labels`), its active and
//! inactive connections and weight as gauges, as node_exporter does.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use clap::Arg;

use crate::flags::{Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const BACKEND_LABELS: StringFlag = StringFlag {
    name: "collector.ipvs.backend-labels",
    default: "local_address,local_port,remote_address,remote_port,proto,local_mark",
    help: "Comma separated list for IPVS backend stats labels.",
};

/// A label of the backend families, in node_exporter's canonical order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Label {
    LocalAddress,
    LocalPort,
    RemoteAddress,
    RemotePort,
    Proto,
    LocalMark,
}

impl Label {
    const ALL: [Label; 6] =
        [Label::LocalAddress, Label::LocalPort, Label::RemoteAddress, Label::RemotePort, Label::Proto, Label::LocalMark];

    pub fn name(self) -> &'static str {
        match self {
            Label::LocalAddress => "local_address",
            Label::LocalPort => "local_port",
            Label::RemoteAddress => "remote_address",
            Label::RemotePort => "remote_port",
            Label::Proto => "proto",
            Label::LocalMark => "local_mark",
        }
    }

    fn value(self, b: &Backend) -> String {
        match self {
            Label::LocalAddress => b.local_address.clone(),
            Label::LocalPort => b.local_port.to_string(),
            Label::RemoteAddress => b.remote_address.clone(),
            Label::RemotePort => b.remote_port.to_string(),
            Label::Proto => b.proto.clone(),
            Label::LocalMark => b.local_mark.clone(),
        }
    }
}

/// Parses the comma-separated label list of `--collector.ipvs.backend-labels`:
/// empty items are ignored, the result is in canonical order, and unknown
/// names are an error naming them (sorted), as node_exporter's parseIpvsLabels.
pub fn parse_labels(s: &str) -> Result<Vec<Label>, String> {
    let wanted: Vec<&str> = s.split(',').filter(|l| !l.is_empty()).collect();
    let mut unknown: Vec<&str> = wanted.iter().copied().filter(|w| !Label::ALL.iter().any(|l| l.name() == *w)).collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        unknown.dedup();
        return Err(format!("unknown IPVS backend labels: {:?}", unknown.join(", ")));
    }
    Ok(Label::ALL.into_iter().filter(|l| wanted.contains(&l.name())).collect())
}

/// The collector's flags, parsed once.
pub struct Options {
    /// The backend labels, in canonical order.
    pub labels: Vec<Label>,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        vec![BACKEND_LABELS.arg()]
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        Ok(Options { labels: BACKEND_LABELS.parse_with(f, parse_labels)? })
    }
}

/// The totals of /proc/net/ip_vs_stats.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub connections: u64,
    pub incoming_packets: u64,
    pub outgoing_packets: u64,
    pub incoming_bytes: u64,
    pub outgoing_bytes: u64,
}

/// A hexadecimal counter (Go's `ParseUint(s, 16, 64)`: no sign, no prefix).
fn hex_u64(s: &str) -> Result<u64, String> {
    if s.starts_with('+') {
        return Err(format!("invalid hexadecimal number {s:?}"));
    }
    u64::from_str_radix(s, 16).map_err(|_| format!("invalid hexadecimal number {s:?}"))
}

/// Parses /proc/net/ip_vs_stats: two header lines, then the five totals.
pub fn parse_stats(text: &str) -> Result<Stats, String> {
    let lines: Vec<&str> = text.splitn(4, '\n').collect();
    if lines.len() != 4 {
        return Err("ip_vs_stats corrupt: too short".into());
    }
    let f: Vec<&str> = lines[2].split_whitespace().collect();
    if f.len() != 5 {
        return Err("ip_vs_stats corrupt: unexpected number of fields".into());
    }
    Ok(Stats {
        connections: hex_u64(f[0])?,
        incoming_packets: hex_u64(f[1])?,
        outgoing_packets: hex_u64(f[2])?,
        incoming_bytes: hex_u64(f[3])?,
        outgoing_bytes: hex_u64(f[4])?,
    })
}

/// One virtual/real server pair of /proc/net/ip_vs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    /// Empty for a firewall-mark service.
    pub local_address: String,
    pub local_port: u16,
    pub local_mark: String,
    pub remote_address: String,
    pub remote_port: u16,
    pub proto: String,
    pub weight: u64,
    pub active: u64,
    pub inactive: u64,
}

/// An address as Go's net.IP prints it: dotted quad for IPv4 and
/// IPv4-mapped IPv6, RFC 5952 otherwise.
fn ip_string(v6: Ipv6Addr) -> String {
    match v6.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => v6.to_string(),
    }
}

/// Parses `C0A80016:0CEA` (IPv4, hexadecimal) or
/// `[2620:0000:…:0001]:0050` (IPv6, 46 characters) into address and port.
pub fn parse_ip_port(s: &str) -> Result<(String, u16), String> {
    let bad = || format!("unexpected IP:Port {s:?}");
    let ip = match s.len() {
        13 => {
            let hex = s.get(..8).ok_or_else(bad)?;
            let n = hex_u64(hex).map_err(|_| bad())?;
            Ipv4Addr::from(n as u32).to_string()
        }
        46 => {
            let inner = s.get(1..40).ok_or_else(bad)?;
            ip_string(inner.parse::<Ipv6Addr>().map_err(|_| format!("invalid IPv6 address {inner:?}"))?)
        }
        _ => return Err(bad()),
    };
    let port = s.get(s.len() - 4..).ok_or_else(bad)?;
    if port.starts_with('+') {
        return Err(bad());
    }
    let port = u16::from_str_radix(port, 16).map_err(|_| bad())?;
    Ok((ip, port))
}

fn dec_u64(s: &str) -> Result<u64, String> {
    crate::parse::parse_u64(s.as_bytes()).ok_or_else(|| format!("invalid number {s:?}"))
}

/// Parses /proc/net/ip_vs: a service line (`TCP`/`UDP` address:port, or
/// `FWM` mark) followed by its `->` real servers. Lines of other services
/// (SCTP) are skipped, as node_exporter's procfs does, so their servers
/// count under the service before them.
pub fn parse_backends(text: &str) -> Result<Vec<Backend>, String> {
    let mut out = Vec::new();
    let (mut proto, mut mark, mut addr, mut port) = (String::new(), String::new(), String::new(), 0u16);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(&first), second) = (f.first(), f.get(1)) else { continue };
        if first == "IP" || first == "Prot" {
            continue;
        }
        // node_exporter indexes the second field unchecked here; a line of
        // one field is skipped.
        let Some(&second) = second else { continue };
        if second == "RemoteAddress:Port" {
            continue;
        }
        match first {
            "TCP" | "UDP" => {
                proto = first.to_string();
                mark.clear();
                (addr, port) = parse_ip_port(second)?;
            }
            "FWM" => {
                proto = first.to_string();
                mark = second.to_string();
                addr.clear();
                port = 0;
            }
            "->" if f.len() >= 6 => {
                let (remote_address, remote_port) = parse_ip_port(second)?;
                out.push(Backend {
                    local_address: addr.clone(),
                    local_port: port,
                    local_mark: mark.clone(),
                    remote_address,
                    remote_port,
                    proto: proto.clone(),
                    weight: dec_u64(f[3])?,
                    active: dec_u64(f[4])?,
                    inactive: dec_u64(f[5])?,
                });
            }
            _ => {}
        }
    }
    Ok(out)
}

#[derive(Clone, Copy, Default)]
struct Sums {
    active: u64,
    inactive: u64,
    weight: u64,
}

pub struct Collector {
    stats_path: PathBuf,
    table_path: PathBuf,
    labels: Vec<Label>,
    /// `labels` indices in ascending order of label name.
    order: Vec<usize>,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        let mut order: Vec<usize> = (0..o.labels.len()).collect();
        order.sort_by_key(|&i| o.labels[i].name());
        Ok(Collector {
            stats_path: p.proc("net/ip_vs_stats"),
            table_path: p.proc("net/ip_vs"),
            labels: o.labels,
            order,
            buf: Vec::with_capacity(4096),
        })
    }
}

type Field = fn(&Sums) -> u64;

const BACKEND_FAMILIES: [(&str, &str, Field); 3] = [
    ("node_ipvs_backend_connections_active", "The current active connections by local and remote address.", |s| s.active),
    ("node_ipvs_backend_connections_inactive", "The current inactive connections by local and remote address.", |s| s.inactive),
    ("node_ipvs_backend_weight", "The current backend weight by local and remote address.", |s| s.weight),
];

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        // No ip_vs_stats: IPVS is not loaded (no data); any other failure is one.
        crate::io::read_file(&self.stats_path, &mut self.buf)?;
        let stats = parse_stats(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.stats_path, m))?;
        sink.single("node_ipvs_connections_total", "The total number of connections made.", Kind::Counter, stats.connections as f64);
        sink.single(
            "node_ipvs_incoming_packets_total",
            "The total number of incoming packets.",
            Kind::Counter,
            stats.incoming_packets as f64,
        );
        sink.single(
            "node_ipvs_outgoing_packets_total",
            "The total number of outgoing packets.",
            Kind::Counter,
            stats.outgoing_packets as f64,
        );
        sink.single("node_ipvs_incoming_bytes_total", "The total amount of incoming data.", Kind::Counter, stats.incoming_bytes as f64);
        sink.single("node_ipvs_outgoing_bytes_total", "The total amount of outgoing data.", Kind::Counter, stats.outgoing_bytes as f64);

        // With the totals present, a missing table is an error, as in node_exporter.
        crate::io::read_required(&self.table_path, &mut self.buf)?;
        let backends = parse_backends(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.table_path, m))?;
        let mut sums: BTreeMap<Vec<String>, Sums> = BTreeMap::new();
        for b in &backends {
            let key: Vec<String> = self.labels.iter().map(|l| l.value(b)).collect();
            let s = sums.entry(key).or_default();
            s.active = s.active.wrapping_add(b.active);
            s.inactive = s.inactive.wrapping_add(b.inactive);
            s.weight = s.weight.wrapping_add(b.weight);
        }
        if sums.is_empty() {
            return Ok(());
        }
        let mut labels: Vec<(&str, &str)> = Vec::with_capacity(self.order.len());
        for (name, help, value) in BACKEND_FAMILIES {
            let mut fam = sink.new_family(name, help, Kind::Gauge);
            for (key, s) in &sums {
                labels.clear();
                labels.extend(self.order.iter().map(|&i| (self.labels[i].name(), key[i].as_str())));
                fam.sample(&labels, value(s) as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "   Total Incoming Outgoing         Incoming         Outgoing
   Conns  Packets  Packets            Bytes            Bytes
 16AA370 E33656E5        0     51D8C8883AB3                0

 Conns/s   Pkts/s   Pkts/s          Bytes/s          Bytes/s
       4    1FB3C        0          1282A8F                0
";

    const TABLE: &str = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  C0A80016:0CEA wlc  
  -> C0A85216:0CEA      Tunnel  100    248        2         
  -> C0A85318:0CEA      Tunnel  100    248        2         
TCP  C0A80039:0CEA wlc  
  -> C0A85416:0CEA      Tunnel  0      0          0         
FWM  10001000 wlc   
  -> C0A8321A:0CEA      Tunnel  20     64         1         
  -> C0A83120:0CEA      Tunnel  100    321        5         
";

    #[test]
    fn parses_totals() {
        let s = parse_stats(STATS).unwrap();
        assert_eq!(
            s,
            Stats {
                connections: 23765872,
                incoming_packets: 3811989221,
                outgoing_packets: 0,
                incoming_bytes: 89991519156915,
                outgoing_bytes: 0
            }
        );
    }

    #[test]
    fn malformed_totals_are_errors() {
        assert!(parse_stats("").is_err());
        assert!(parse_stats("a\nb\n").is_err(), "too short");
        assert!(parse_stats("a\nb\n1 2 3 4\n").is_err(), "four fields");
        assert!(parse_stats("a\nb\n1 2 3 4 +5\n").is_err(), "a sign");
        assert!(parse_stats("a\nb\n1 2 3 4 xyz\n").is_err());
        assert!(parse_stats("a\nb\n1 2 3 4 11111111111111111\n").is_err(), "overflow");
        // Exactly three newlines is enough, as in procfs.
        assert_eq!(parse_stats("a\nb\n1 2 3 4 ff\n").unwrap().outgoing_bytes, 255);
    }

    #[test]
    fn parses_backends() {
        let b = parse_backends(TABLE).unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(
            b[0],
            Backend {
                local_address: "192.168.0.22".into(),
                local_port: 3306,
                local_mark: "".into(),
                remote_address: "192.168.82.22".into(),
                remote_port: 3306,
                proto: "TCP".into(),
                weight: 100,
                active: 248,
                inactive: 2,
            }
        );
        assert_eq!(b[2].local_address, "192.168.0.57");
        assert_eq!((b[3].local_address.as_str(), b[3].local_port, b[3].local_mark.as_str()), ("", 0, "10001000"));
        assert_eq!((b[3].proto.as_str(), b[3].weight, b[3].active, b[3].inactive), ("FWM", 20, 64, 1));
    }

    #[test]
    fn parses_ipv6_and_mapped_addresses() {
        let (ip, port) = parse_ip_port("[2620:0000:0000:0000:0000:0000:0000:0001]:0050").unwrap();
        assert_eq!((ip.as_str(), port), ("2620::1", 80));
        let (ip, _) = parse_ip_port("[0000:0000:0000:0000:0000:ffff:c0a8:0001]:0050").unwrap();
        assert_eq!(ip, "192.168.0.1", "Go prints IPv4-mapped addresses dotted");
        let t = "UDP  [fe80:0000:0000:0000:0000:0000:0000:0001]:0035 rr\n  -> [2001:0db8:0000:0000:0001:0000:0000:0001]:0035 Masq 1 2 3\n";
        let b = parse_backends(t).unwrap();
        assert_eq!((b[0].local_address.as_str(), b[0].remote_address.as_str()), ("fe80::1", "2001:db8::1:0:0:1"));
    }

    #[test]
    fn malformed_tables_are_errors_not_panics() {
        assert!(parse_backends("TCP  C0A8001:0CEA wlc\n").is_err(), "short address");
        assert!(parse_backends("TCP  C0A8001G:0CEA wlc\n").is_err(), "bad hex");
        assert!(parse_backends("TCP  C0A80016:0CEX wlc\n").is_err(), "bad port");
        assert!(parse_backends("TCP  [zz00:0000:0000:0000:0000:0000:0000:0001]:0050 wlc\n").is_err());
        assert!(parse_backends("TCP  C0A80016:0CEA\n  -> C0A85216:0CEA Tunnel x 1 2\n").is_err(), "bad weight");
        assert!(parse_backends("TCP  C0A80016:0CEA\n  -> C0A85216:0CEA Tunnel 1 -1 2\n").is_err(), "negative");
        assert!(parse_backends("TCP  C0A80016:0CEA\n  -> C0A85216:0CEA Tunnel 1 1\n").unwrap().is_empty(), "short line");
        assert!(parse_backends("TCP  aaaaaaaéxxxx wlc\n").is_err(), "a character across the address end");
        assert!(parse_backends("TCP  C0A80016éaaa wlc\n").is_err(), "a character across the port start");
        assert!(parse_backends("X\n\n  ->\nTCP\n").unwrap().is_empty(), "one-field lines");
    }

    #[test]
    fn label_flag() {
        assert_eq!(parse_labels("local_address,local_port,remote_address,remote_port,proto,local_mark").unwrap(), Label::ALL);
        assert_eq!(parse_labels("proto,,local_address").unwrap(), [Label::LocalAddress, Label::Proto]);
        assert!(parse_labels("").unwrap().is_empty());
        let e = parse_labels("zz,proto,aa,zz").unwrap_err();
        assert_eq!(e, r#"unknown IPVS backend labels: "aa, zz""#);
    }

    fn scrape(labels: &str) -> Result<Sink, Error> {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/net/ip_vs_stats", STATS);
        crate::testutil::write(dir.path(), "proc/net/ip_vs", TABLE);
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(Options { labels: parse_labels(labels).unwrap() }, &p).unwrap();
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).map(|_| sink)
    }

    #[test]
    fn sums_backends_over_the_chosen_labels() {
        let sink = scrape("proto").unwrap();
        let fams = sink.families();
        let active = fams.iter().find(|f| f.name() == "node_ipvs_backend_connections_active").unwrap();
        let mut got: Vec<(Vec<(&str, &str)>, f64)> = active.samples().collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, vec![(vec![("proto", "FWM")], 385.0), (vec![("proto", "TCP")], 496.0)]);
        let sink = scrape("").unwrap();
        let fams = sink.families();
        let weight = fams.iter().find(|f| f.name() == "node_ipvs_backend_weight").unwrap();
        assert_eq!(weight.samples().collect::<Vec<_>>(), vec![(vec![], 320.0)]);
    }

    #[test]
    fn labels_are_sorted_by_name() {
        let sink = scrape("local_address,local_port,remote_address,remote_port,proto,local_mark").unwrap();
        let fams = sink.families();
        let w = fams.iter().find(|f| f.name() == "node_ipvs_backend_weight").unwrap();
        for (labels, _) in w.samples() {
            let names: Vec<&str> = labels.iter().map(|l| l.0).collect();
            assert_eq!(names, ["local_address", "local_mark", "local_port", "proto", "remote_address", "remote_port"]);
        }
    }

    #[test]
    fn missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(Options { labels: vec![] }, &p).unwrap();
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(e.is_no_data(), "{e}");
        crate::testutil::write(dir.path(), "proc/net/ip_vs_stats", STATS);
        let e = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(!e.is_no_data(), "totals without a table is an error: {e}");
    }
}
