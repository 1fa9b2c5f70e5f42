//! `nfs`: the NFS client's RPC statistics from /proc/net/rpc/nfs (network
//! packets and TCP connections, RPC calls, retransmissions and credential
//! refreshes, and the calls of every NFSv2, v3 and v4 procedure), exported as
//! node_exporter's `node_nfs_*` counters. No file (no NFS client module) is
//! no data; a malformed line fails the scrape, as procfs's parser does.

use std::path::PathBuf;

use crate::io::read_file;
use crate::rpc::{self, exact, first, parse_lines, V2_PROCEDURES, V3_PROCEDURES};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("net/rpc/nfs"), buf: Vec::new() }
    }
}

/// The `net` line: packets in all, over UDP, over TCP, and TCP connections.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Network {
    pub packets: u64,
    pub udp: u64,
    pub tcp: u64,
    pub tcp_connections: u64,
}

/// The client's `rpc` line.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ClientRpc {
    pub calls: u64,
    pub retransmissions: u64,
    pub auth_refreshes: u64,
}

/// Everything node_exporter exports from /proc/net/rpc/nfs; a line the file
/// lacks leaves its counters at zero (they are exported all the same).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientStats {
    pub network: Network,
    pub rpc: ClientRpc,
    /// `proc2`, in the order of [`V2_PROCEDURES`].
    pub v2: [u64; 18],
    /// `proc3`, in the order of [`V3_PROCEDURES`].
    pub v3: [u64; 22],
    /// `proc4`, in the order of [`V4_PROCEDURES`]; older kernels give fewer.
    pub v4: [u64; 59],
}

impl Default for ClientStats {
    fn default() -> Self {
        ClientStats { network: Network::default(), rpc: ClientRpc::default(), v2: [0; 18], v3: [0; 22], v4: [0; 59] }
    }
}

/// The `method` labels of the client's `proc4` counters, in the file's
/// order (node_exporter names them after procfs's struct fields).
pub const V4_PROCEDURES: [&str; 59] = [
    "Null",
    "Read",
    "Write",
    "Commit",
    "Open",
    "OpenConfirm",
    "OpenNoattr",
    "OpenDowngrade",
    "Close",
    "Setattr",
    "FsInfo",
    "Renew",
    "SetClientID",
    "SetClientIDConfirm",
    "Lock",
    "Lockt",
    "Locku",
    "Access",
    "Getattr",
    "Lookup",
    "LookupRoot",
    "Remove",
    "Rename",
    "Link",
    "Symlink",
    "Create",
    "Pathconf",
    "StatFs",
    "ReadLink",
    "ReadDir",
    "ServerCaps",
    "DelegReturn",
    "GetACL",
    "SetACL",
    "FsLocations",
    "ReleaseLockowner",
    "Secinfo",
    "FsidPresent",
    "ExchangeID",
    "CreateSession",
    "DestroySession",
    "Sequence",
    "GetLeaseTime",
    "ReclaimComplete",
    "GetDeviceInfo",
    "LayoutGet",
    "LayoutCommit",
    "LayoutReturn",
    "SecinfoNoName",
    "TestStateID",
    "FreeStateID",
    "GetDeviceList",
    "BindConnToSession",
    "DestroyClientID",
    "Seek",
    "Allocate",
    "DeAllocate",
    "LayoutStats",
    "Clone",
];

/// A `procN` line: a count, then that many values, at least `N` of them,
/// of which the first `N` are kept.
fn at_least<const N: usize>(key: &str, v: &[u64]) -> Result<[u64; N], String> {
    let (&n, rest) = v.split_first().ok_or_else(|| format!("invalid {key} line: no values"))?;
    if n != rest.len() as u64 || rest.len() < N {
        return Err(format!("invalid {key} line: count {n}, {} values, want at least {N}", rest.len()));
    }
    Ok(first(rest))
}

/// Parses /proc/net/rpc/nfs as procfs does: every line is a known key and
/// unsigned integers, with the counts it requires (`proc4` may be short:
/// the procedures an older kernel lacks stay zero).
pub fn parse_client_stats(text: &str) -> Result<ClientStats, String> {
    let mut stats = ClientStats::default();
    parse_lines(
        text,
        "NFS",
        |_| None,
        |key, values| {
            match key {
                "net" => {
                    let [packets, udp, tcp, tcp_connections] = exact(key, values)?;
                    stats.network = Network { packets, udp, tcp, tcp_connections };
                }
                "rpc" => {
                    let [calls, retransmissions, auth_refreshes] = exact(key, values)?;
                    stats.rpc = ClientRpc { calls, retransmissions, auth_refreshes };
                }
                "proc2" => stats.v2 = at_least(key, values)?,
                "proc3" => stats.v3 = at_least(key, values)?,
                "proc4" => stats.v4 = first(rpc::counted(key, values, 0, usize::MAX)?),
                _ => return Err(format!("unknown NFS metric line {key:?}")),
            }
            Ok(())
        },
    )?;
    Ok(stats)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let s = parse_client_stats(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.path, m))?;

        sink.new_family("node_nfs_packets_total", "Total NFSd network packets (sent+received) by protocol type.", Kind::Counter)
            .sample(&[("protocol", "udp")], s.network.udp as f64)
            .sample(&[("protocol", "tcp")], s.network.tcp as f64);
        sink.single("node_nfs_connections_total", "Total number of NFSd TCP connections.", Kind::Counter, s.network.tcp_connections as f64);
        sink.single("node_nfs_rpcs_total", "Total number of RPCs performed.", Kind::Counter, s.rpc.calls as f64);
        sink.single(
            "node_nfs_rpc_retransmissions_total",
            "Number of RPC transmissions performed.",
            Kind::Counter,
            s.rpc.retransmissions as f64,
        );
        sink.single(
            "node_nfs_rpc_authentication_refreshes_total",
            "Number of RPC authentication refreshes performed.",
            Kind::Counter,
            s.rpc.auth_refreshes as f64,
        );

        let mut f = sink.new_family("node_nfs_requests_total", "Number of NFS procedures invoked.", Kind::Counter);
        f.reserve(V2_PROCEDURES.len() + V3_PROCEDURES.len() + V4_PROCEDURES.len());
        let versions: [(&str, &[&str], &[u64]); 3] =
            [("2", &V2_PROCEDURES, &s.v2), ("3", &V3_PROCEDURES, &s.v3), ("4", &V4_PROCEDURES, &s.v4)];
        for (proto, names, values) in versions {
            for (method, &v) in names.iter().zip(values) {
                f.sample(&[("method", method), ("proto", proto)], v as f64);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter's fixture (collector/fixtures/proc/net/rpc/nfs).
    const FIXTURE: &str = "net 70 70 69 45
rpc 1218785755 374636 1218815394
proc2 18 16 57 74 52 71 73 45 86 0 52 83 61 17 53 50 23 70 82
proc3 22 0 1061909262 48906 4077635 117661341 5 29391916 2570425 2993289 590 0 0 7815 15 1130 0 3983 92385 13332 2 1 23729
proc4 48 98 51 54 83 85 23 24 1 28 73 68 83 12 84 39 68 59 58 88 29 74 69 96 21 84 15 53 86 54 66 56 97 36 49 32 85 81 11 58 32 67 13 28 35 1 90 26 0
";

    fn v4(s: &ClientStats, name: &str) -> u64 {
        s.v4[V4_PROCEDURES.iter().position(|n| *n == name).unwrap()]
    }

    #[test]
    fn parses_the_fixture() {
        let s = parse_client_stats(FIXTURE).unwrap();
        assert_eq!(s.network, Network { packets: 70, udp: 70, tcp: 69, tcp_connections: 45 });
        assert_eq!(s.rpc, ClientRpc { calls: 1218785755, retransmissions: 374636, auth_refreshes: 1218815394 });
        assert_eq!((s.v2[0], s.v2[1], s.v2[17]), (16, 57, 82));
        assert_eq!((s.v3[1], s.v3[21]), (1061909262, 23729));
        // 48 procedures: the rest of the 59 stay zero.
        assert_eq!((v4(&s, "Null"), v4(&s, "Read"), v4(&s, "ReclaimComplete")), (98, 51, 35));
        assert_eq!((v4(&s, "GetDeviceInfo"), v4(&s, "LayoutGet"), v4(&s, "Clone")), (1, 90, 0));
        assert_eq!(v4(&s, "SecinfoNoName"), 0);
    }

    #[test]
    fn a_full_proc4_line_fills_every_procedure_and_more_are_ignored() {
        let mut line = String::from("proc4 61");
        for i in 1..=61 {
            line.push_str(&format!(" {i}"));
        }
        let s = parse_client_stats(&line).unwrap();
        assert_eq!((s.v4[0], s.v4[58]), (1, 59));
        assert_eq!(v4(&s, "Clone"), 59);
    }

    #[test]
    fn missing_lines_and_an_empty_file_leave_zeros() {
        assert_eq!(parse_client_stats("").unwrap(), ClientStats::default());
        let s = parse_client_stats("rpc 1 2 3\n").unwrap();
        assert_eq!(s.rpc.calls, 1);
        assert_eq!(s.network, Network::default());
        assert_eq!(parse_client_stats("proc4 0\n").unwrap().v4, [0; 59]);
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "net 1 2 3\n",                                          // too few values
            "net 1 2 3 4 5\n",                                      // too many
            "rpc 1 2\n",                                            // client rpc has 3
            "net\n",                                                // a key alone
            "\n",                                                   // a blank line
            "net 1 2 3 4\n\nrpc 1 2 3\n",                           // a blank line inside
            "net 1 2 x 4\n",                                        // not a number
            "net 1 2 -3 4\n",                                       // signed
            "net 1 2 +3 4\n",                                       // signed
            "net 1 2 18446744073709551616 4\n",                     // overflow
            "proc2 17 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n", // fewer than 18
            "proc2 19 1 2 3\n",                                     // count disagrees
            "proc3 3 1 2 3\n",
            "proc4 3 1 2\n",
            "proc9 1 1\n", // unknown key
        ] {
            assert!(parse_client_stats(bad).is_err(), "{bad:?} must not parse");
        }
        assert!(parse_client_stats(&format!("net {}1 2 3 4", "0".repeat(crate::parse::GO_MAX_LINE))).is_err());
    }

    #[test]
    fn exports_node_exporters_families() {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/net/rpc/nfs", FIXTURE);
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 6);
        let req = fams.iter().find(|f| f.name() == "node_nfs_requests_total").unwrap();
        assert_eq!(req.len(), 18 + 22 + 59);
        let samples: Vec<_> = req.samples().collect();
        let get = |m: &str, p: &str| samples.iter().find(|(l, _)| l == &vec![("method", m), ("proto", p)]).map(|s| s.1);
        assert_eq!(get("Null", "2"), Some(16.0));
        assert_eq!(get("Commit", "3"), Some(23729.0));
        assert_eq!(get("LayoutGet", "4"), Some(90.0));

        let p2 = Paths { procfs: dir.path().join("none"), ..p };
        let mut c = Collector::new(&p2);
        let err = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(err.is_no_data(), "{err}");
    }
}
