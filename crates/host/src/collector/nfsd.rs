//! `nfsd`: the kernel NFS server's statistics from /proc/net/rpc/nfsd (reply
//! cache, stale file handles, bytes read and written, threads, read-ahead
//! cache, network packets and connections, RPC calls and errors, and the
//! calls of the NFSv2 and v3 procedures and v4 operations), exported as
//! node_exporter's `node_nfsd_*` families. No file (no NFS server module) is
//! no data; a malformed line fails the scrape, as procfs's parser does.

use std::path::PathBuf;

use crate::io::read_file;
use crate::rpc::{counted, exact, first, parse_lines, V2_PROCEDURES, V3_PROCEDURES};
use crate::{Error, Paths};
use expo::{Kind, Sink};

pub struct Collector {
    path: PathBuf,
    buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { path: p.proc("net/rpc/nfsd"), buf: Vec::new() }
    }
}

/// Everything node_exporter exports from /proc/net/rpc/nfsd; a line the
/// file lacks leaves its counters at zero (they are exported all the same).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerStats {
    /// `rc`: hits, misses, nocache.
    pub reply_cache: [u64; 3],
    /// `fh`: stale, then four counters the kernel no longer updates.
    pub file_handles: [u64; 5],
    /// `io`: bytes read, bytes written.
    pub io: [u64; 2],
    /// `th`: threads, and the times all were busy (the rest is ignored).
    pub threads: [u64; 2],
    /// `ra`: the cache size (its histogram and not-found count follow).
    pub read_ahead_size: u64,
    pub read_ahead_not_found: u64,
    /// `net`: packets, UDP packets, TCP packets, TCP connections.
    pub network: [u64; 4],
    /// `rpc`: calls, bad calls, bad format, bad auth, bad client.
    pub rpc: [u64; 5],
    /// `proc2` after its count: Null first, as [`V2_PROCEDURES`].
    pub v2: [u64; 18],
    /// `proc3` after its count: Null first, as [`V3_PROCEDURES`].
    pub v3: [u64; 22],
    /// `proc4ops` after its count: operations 0 to 39 (39 is zero on
    /// kernels that give only 39).
    pub v4_ops: [u64; 40],
    /// `wdeleg_getattr`.
    pub wdeleg_getattr: u64,
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            reply_cache: [0; 3],
            file_handles: [0; 5],
            io: [0; 2],
            threads: [0; 2],
            read_ahead_size: 0,
            read_ahead_not_found: 0,
            network: [0; 4],
            rpc: [0; 5],
            v2: [0; 18],
            v3: [0; 22],
            v4_ops: [0; 40],
            wdeleg_getattr: 0,
        }
    }
}

/// The NFSv4 operations node_exporter exports, with their index in
/// `proc4ops` after the count (0-2 are unused, PutPubFH and PutRootFH are
/// not exported).
pub const V4_OPERATIONS: [(&str, usize); 35] = [
    ("Access", 3),
    ("Close", 4),
    ("Commit", 5),
    ("Create", 6),
    ("DelegPurge", 7),
    ("DelegReturn", 8),
    ("GetAttr", 9),
    ("GetFH", 10),
    ("Link", 11),
    ("Lock", 12),
    ("Lockt", 13),
    ("Locku", 14),
    ("Lookup", 15),
    ("LookupRoot", 16),
    ("Nverify", 17),
    ("Open", 18),
    ("OpenAttr", 19),
    ("OpenConfirm", 20),
    ("OpenDgrd", 21),
    ("PutFH", 22),
    ("Read", 25),
    ("ReadDir", 26),
    ("ReadLink", 27),
    ("Remove", 28),
    ("Rename", 29),
    ("Renew", 30),
    ("RestoreFH", 31),
    ("SaveFH", 32),
    ("SecInfo", 33),
    ("SetAttr", 34),
    ("SetClientID", 35),
    ("SetClientIDConfirm", 36),
    ("Verify", 37),
    ("Write", 38),
    ("RelLockOwner", 39),
];

/// Parses /proc/net/rpc/nfsd as procfs does: every line is a known key and
/// unsigned integers, with the counts it requires (of `th` only the first
/// two values are read: older kernels follow them with a histogram of
/// floats).
pub fn parse_server_stats(text: &str) -> Result<ServerStats, String> {
    let mut stats = ServerStats::default();
    parse_lines(
        text,
        "NFSd",
        |key| (key == "th").then_some(2),
        |key, values| {
            match key {
                "rc" => stats.reply_cache = exact(key, values)?,
                "fh" => stats.file_handles = exact(key, values)?,
                "io" => stats.io = exact(key, values)?,
                "th" => stats.threads = exact(key, values)?,
                "ra" => {
                    let ra: [u64; 12] = exact(key, values)?;
                    (stats.read_ahead_size, stats.read_ahead_not_found) = (ra[0], ra[11]);
                }
                "net" => stats.network = exact(key, values)?,
                "rpc" => stats.rpc = exact(key, values)?,
                "proc2" => stats.v2 = first(counted(key, values, 18, usize::MAX)?),
                "proc3" => stats.v3 = first(counted(key, values, 22, usize::MAX)?),
                "proc4" => {
                    counted(key, values, 2, 2)?;
                }
                "proc4ops" => stats.v4_ops = first(counted(key, values, 39, usize::MAX)?),
                "wdeleg_getattr" => stats.wdeleg_getattr = values.first().copied().unwrap_or(0),
                _ => return Err(format!("unknown NFSd metric line {key:?}")),
            }
            Ok(())
        },
    )?;
    Ok(stats)
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        read_file(&self.path, &mut self.buf)?;
        let s = parse_server_stats(&String::from_utf8_lossy(&self.buf)).map_err(|m| Error::parse(&self.path, m))?;

        let [hits, misses, nocache] = s.reply_cache;
        sink.single(
            "node_nfsd_reply_cache_hits_total",
            "Total number of NFSd Reply Cache hits (client lost server response).",
            Kind::Counter,
            hits as f64,
        );
        sink.single(
            "node_nfsd_reply_cache_misses_total",
            "Total number of NFSd Reply Cache an operation that requires caching (idempotent).",
            Kind::Counter,
            misses as f64,
        );
        sink.single(
            "node_nfsd_reply_cache_nocache_total",
            "Total number of NFSd Reply Cache non-idempotent operations (rename/delete/…).",
            Kind::Counter,
            nocache as f64,
        );
        sink.single(
            "node_nfsd_file_handles_stale_total",
            "Total number of NFSd stale file handles",
            Kind::Counter,
            s.file_handles[0] as f64,
        );
        sink.single("node_nfsd_disk_bytes_read_total", "Total NFSd bytes read.", Kind::Counter, s.io[0] as f64);
        sink.single("node_nfsd_disk_bytes_written_total", "Total NFSd bytes written.", Kind::Counter, s.io[1] as f64);
        sink.single("node_nfsd_server_threads", "Total number of NFSd kernel threads that are running.", Kind::Gauge, s.threads[0] as f64);
        sink.single(
            "node_nfsd_read_ahead_cache_size_blocks",
            "How large the read ahead cache is in blocks.",
            Kind::Gauge,
            s.read_ahead_size as f64,
        );
        sink.single(
            "node_nfsd_read_ahead_cache_not_found_total",
            "Total number of NFSd read ahead cache not found.",
            Kind::Counter,
            s.read_ahead_not_found as f64,
        );

        let [_, udp, tcp, connections] = s.network;
        sink.new_family("node_nfsd_packets_total", "Total NFSd network packets (sent+received) by protocol type.", Kind::Counter)
            .sample(&[("proto", "udp")], udp as f64)
            .sample(&[("proto", "tcp")], tcp as f64);
        sink.single("node_nfsd_connections_total", "Total number of NFSd TCP connections.", Kind::Counter, connections as f64);

        let [calls, _, bad_fmt, bad_auth, bad_client] = s.rpc;
        sink.new_family("node_nfsd_rpc_errors_total", "Total number of NFSd RPC errors by error type.", Kind::Counter)
            .sample(&[("error", "fmt")], bad_fmt as f64)
            .sample(&[("error", "auth")], bad_auth as f64)
            .sample(&[("error", "cInt")], bad_client as f64);
        sink.single("node_nfsd_server_rpcs_total", "Total number of NFSd RPCs.", Kind::Counter, calls as f64);

        let mut f = sink.new_family("node_nfsd_requests_total", "Total number NFSd Requests by method and protocol.", Kind::Counter);
        f.reserve(V2_PROCEDURES.len() + V3_PROCEDURES.len() + V4_OPERATIONS.len());
        // node_exporter skips the Null procedures.
        for (method, &v) in V2_PROCEDURES.iter().zip(&s.v2).skip(1) {
            f.sample(&[("method", method), ("proto", "2")], v as f64);
        }
        for (method, &v) in V3_PROCEDURES.iter().zip(&s.v3).skip(1) {
            f.sample(&[("method", method), ("proto", "3")], v as f64);
        }
        for &(method, i) in &V4_OPERATIONS {
            f.sample(&[("method", method), ("proto", "4")], s.v4_ops[i] as f64);
        }
        f.sample(&[("method", "WdelegGetattr"), ("proto", "4")], s.wdeleg_getattr as f64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node_exporter's fixture (collector/fixtures/proc/net/rpc/nfsd).
    const FIXTURE: &str = "rc 0 6 18622
fh 0 0 0 0 0
io 157286400 72864
th 8 0 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000 0.000
ra 32 0 0 0 0 0 0 0 0 0 0 0
net 972 55 917 1
rpc 18628 3 1 2 0
proc2 18 2 69 0 0 4410 0 0 0 0 0 0 0 0 0 0 0 99 2
proc3 22 2 112 0 2719 111 0 0 0 0 0 0 0 0 0 0 0 27 216 0 2 1 0
proc4 2 2 10853
proc4ops 72 0 0 0 1098 2 0 0 0 0 8179 5896 0 0 0 0 5900 0 0 2 0 2 0 9609 0 2 150 1272 0 0 0 1236 0 0 0 0 3 3 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
wdeleg_getattr 15
";

    fn op(s: &ServerStats, name: &str) -> u64 {
        s.v4_ops[V4_OPERATIONS.iter().find(|(n, _)| *n == name).unwrap().1]
    }

    #[test]
    fn parses_the_fixture() {
        let s = parse_server_stats(FIXTURE).unwrap();
        assert_eq!(s.reply_cache, [0, 6, 18622]);
        assert_eq!(s.io, [157286400, 72864]);
        assert_eq!(s.threads, [8, 0]);
        assert_eq!((s.read_ahead_size, s.read_ahead_not_found), (32, 0));
        assert_eq!(s.network, [972, 55, 917, 1]);
        assert_eq!(s.rpc, [18628, 3, 1, 2, 0]);
        assert_eq!((s.v2[1], s.v2[4], s.v2[16], s.v2[17]), (69, 4410, 99, 2));
        assert_eq!((s.v3[1], s.v3[3], s.v3[18]), (112, 2719, 0));
        assert_eq!((op(&s, "Access"), op(&s, "GetAttr"), op(&s, "GetFH"), op(&s, "Lookup")), (1098, 8179, 5896, 5900));
        assert_eq!((op(&s, "PutFH"), op(&s, "Read"), op(&s, "ReadDir"), op(&s, "Renew")), (9609, 150, 1272, 1236));
        assert_eq!(op(&s, "RelLockOwner"), 0);
        assert_eq!(s.wdeleg_getattr, 15);
    }

    #[test]
    fn old_kernels_thirty_nine_operations_and_a_bare_th_line() {
        let mut line = String::from("proc4ops 39");
        for i in 1..=39 {
            line.push_str(&format!(" {i}"));
        }
        let s = parse_server_stats(&format!("th 4 7\n{line}\n")).unwrap();
        assert_eq!(s.threads, [4, 7]);
        assert_eq!((op(&s, "Access"), op(&s, "Write"), op(&s, "RelLockOwner")), (4, 39, 0));
        let s = parse_server_stats(&line.replace("proc4ops 39", "proc4ops 40").replace(" 39", " 39 40")).unwrap();
        assert_eq!(op(&s, "RelLockOwner"), 40);
    }

    #[test]
    fn missing_lines_and_an_empty_file_leave_zeros() {
        assert_eq!(parse_server_stats("").unwrap(), ServerStats::default());
        let s = parse_server_stats("wdeleg_getattr 3 4 5\n").unwrap();
        assert_eq!(s.wdeleg_getattr, 3);
        assert_eq!(s.rpc, [0; 5]);
    }

    #[test]
    fn malformed_lines_are_errors() {
        for bad in [
            "rc 1 2\n",
            "fh 1 2 3 4\n",
            "io 1\n",
            "th 8\n",       // th needs two values
            "th 8 x 0.0\n", // the two must be integers
            "ra 32 0 0\n",
            "net 1 2 3\n",
            "rpc 1 2 3 4\n", // the server's rpc has 5
            "rc\n",          // a key alone
            "\n",            // a blank line
            "rc 0 0 0\n\nio 1 2\n",
            "rc 0 -1 0\n",
            "rc 0 +1 0\n",
            "rc 0 99999999999999999999 0\n",
            "io 1 2.5\n",
            "proc2 17 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n",
            "proc3 23 1 2\n",
            "proc4 3 1 2 3\n", // exactly 2
            "proc4 1 1\n",
            "proc4ops 38 1 2 3\n",
            "wdeleg_getattr x\n",
            "nosuchline 1\n",
        ] {
            assert!(parse_server_stats(bad).is_err(), "{bad:?} must not parse");
        }
        assert!(parse_server_stats(&format!("io 1 {}2", "0".repeat(crate::parse::GO_MAX_LINE))).is_err());
    }

    #[test]
    fn exports_node_exporters_families() {
        let dir = tempfile::tempdir().unwrap();
        crate::testutil::write(dir.path(), "proc/net/rpc/nfsd", FIXTURE);
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        assert_eq!(fams.len(), 14);
        let req = fams.iter().find(|f| f.name() == "node_nfsd_requests_total").unwrap();
        assert_eq!(req.len(), 17 + 21 + 35 + 1);
        let samples: Vec<_> = req.samples().collect();
        let get = |m: &str, p: &str| samples.iter().find(|(l, _)| l == &vec![("method", m), ("proto", p)]).map(|s| s.1);
        assert_eq!(get("Null", "2"), None);
        assert_eq!(get("Lookup", "2"), Some(4410.0));
        assert_eq!(get("WdelegGetattr", "4"), Some(15.0));

        let p2 = Paths { procfs: dir.path().join("none"), ..p };
        let mut c = Collector::new(&p2);
        let err = crate::Collector::update(&mut c, &mut Sink::new()).unwrap_err();
        assert!(err.is_no_data(), "{err}");
    }
}
