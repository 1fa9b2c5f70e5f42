//! `mountstats`: per-NFS-mount client statistics from the mountstats file
//! of node_agent's own process (`<procfs>/<pid>/mountstats`, the pid being
//! where `<procfs>/self` points, as node_exporter's `procfs.FS.Self()`
//! resolves it), read as procfs's `parseMountStats` does: age, byte and
//! event counters, per-transport (`xprt:`) and per-operation RPC figures.
//! The server address (`mountaddr`) comes from the `addr=` super option of
//! the same-numbered line of `<procfs>/<pid>/mountinfo`. Exported as the
//! `node_mountstats_nfs_*` families, one set per (export, protocol,
//! mountaddr), plus `node_mountstats_nfs_mountpoint_info` per mount point.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::io::read_file;
use crate::parse::GoNumError;
use crate::{Error, Paths};
use expo::{Kind, Sink};

/// 2^53: node_exporter wraps the idle time and the cumulative times at the
/// float64 mantissa.
const MANTISSA: u64 = 1 << 53;

pub struct Collector {
    procfs: PathBuf,
    /// `<procfs>/<pid>`, once `<procfs>/self` has been resolved.
    pid_dir: Option<PathBuf>,
    stats_buf: Vec<u8>,
    info_buf: Vec<u8>,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        // node_exporter resolves /proc/self when it builds the collector
        // (and refuses to start without it); we resolve it then too, and
        // again at scrape time if it failed, reporting the failure there.
        let pid_dir = resolve_self(&p.procfs).ok();
        Collector { procfs: p.procfs.clone(), pid_dir, stats_buf: Vec::new(), info_buf: Vec::new() }
    }
}

/// `<procfs>/<pid>` for the pid `<procfs>/self` links to: procfs's `Self()`
/// reads the link, removes the procfs path from it, takes the rest as the
/// pid and checks that its directory exists.
pub fn resolve_self(procfs: &Path) -> Result<PathBuf, Error> {
    let link = procfs.join("self");
    let target = std::fs::read_link(&link).map_err(|e| Error::io(&link, e))?;
    let target = target.to_string_lossy().replace(&*procfs.to_string_lossy(), "");
    let pid: i64 = target.parse().map_err(|_| Error::parse(&link, format!("link target {target:?} is not a pid")))?;
    let dir = procfs.join(pid.to_string());
    std::fs::metadata(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

/// One `device ... mounted on ... with fstype ...` entry of mountstats.
#[derive(Debug, PartialEq)]
pub struct Mount<'a> {
    pub device: &'a str,
    pub mount_point: &'a str,
    pub fstype: &'a str,
    /// The statistics of an NFS mount that has them (`statvers=`).
    pub nfs: Option<Nfs<'a>>,
}

/// The statistics of one NFS mount.
#[derive(Debug, Default, PartialEq)]
pub struct Nfs<'a> {
    pub age_seconds: f64,
    /// read, write, direct read, direct write, total read, total write,
    /// read pages, write pages.
    pub bytes: [u64; 8],
    /// The 27 `events:` counters, in the kernel's order.
    pub events: [u64; 27],
    pub transports: Vec<Transport<'a>>,
    pub operations: Vec<Operation<'a>>,
}

/// One `xprt:` line, with procfs's placement of each protocol's fields
/// (fields a protocol or statistics version lacks are 0).
#[derive(Debug, Default, PartialEq)]
pub struct Transport<'a> {
    pub protocol: &'a str,
    pub bind: u64,
    pub connect: u64,
    pub idle_time_seconds: u64,
    pub sends: u64,
    pub receives: u64,
    pub bad_xids: u64,
    pub backlog: u64,
    pub max_slots: u64,
    pub sending_queue: u64,
    pub pending_queue: u64,
}

/// One line of the per-op statistics.
#[derive(Debug, Default, PartialEq)]
pub struct Operation<'a> {
    pub name: &'a str,
    pub requests: u64,
    pub transmissions: u64,
    pub major_timeouts: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub queue_ms: u64,
    pub response_ms: u64,
    pub request_ms: u64,
}

/// Go's `strconv.ParseUint(s, 10, 64)`: decimal digits only.
fn parse_dec(s: &str) -> Result<u64, String> {
    crate::parse::parse_go_dec_uint(s).map_err(|e| match e {
        GoNumError::Syntax => format!("{s:?} is not an unsigned integer"),
        GoNumError::Range => format!("{s:?} is out of range"),
    })
}

fn parse_all<const N: usize>(what: &str, ss: &[&str]) -> Result<[u64; N], String> {
    if ss.len() != N {
        return Err(format!("{what}: {} fields, want {N}", ss.len()));
    }
    let mut out = [0u64; N];
    for (o, s) in out.iter_mut().zip(ss) {
        *o = parse_dec(s)?;
    }
    Ok(out)
}

/// Parses a whole mountstats file. A `device` line with a statistics
/// version must be an NFS mount, and its statistics must be well formed;
/// other lines between entries are skipped.
pub fn parse_mountstats(text: &str) -> Result<Vec<Mount<'_>>, String> {
    let mut lines = crate::parse::go_lines(text);
    let mut mounts = Vec::new();
    while let Some(line) = lines.next() {
        let ss: Vec<&str> = line.split_whitespace().collect();
        if ss.first() != Some(&"device") {
            continue;
        }
        if ss.len() < 8 || ss[2] != "mounted" || ss[3] != "on" || ss[5] != "with" || ss[6] != "fstype" {
            return Err(format!("invalid device line {line:?}"));
        }
        let mut mount = Mount { device: ss[1], mount_point: ss[4], fstype: ss[7], nfs: None };
        if ss.len() > 8 {
            if mount.fstype != "nfs" && mount.fstype != "nfs4" {
                return Err(format!("cannot parse mount statistics of fstype {:?}", mount.fstype));
            }
            let version = ss[8].strip_prefix("statvers=").unwrap_or(ss[8]);
            mount.nfs = Some(parse_nfs(&mut lines, version)?);
        }
        mounts.push(mount);
    }
    Ok(mounts)
}

/// The statistics after an NFS `device` line: up to an empty line or the
/// `per-op statistics` line, then the operations up to an empty line.
fn parse_nfs<'a>(lines: &mut impl Iterator<Item = &'a str>, version: &str) -> Result<Nfs<'a>, String> {
    let mut nfs = Nfs::default();
    for line in lines.by_ref() {
        let ss: Vec<&str> = line.split_whitespace().collect();
        let Some(&key) = ss.first() else { break };
        let incomplete = |min: usize| if ss.len() < min { Err(format!("incomplete NFS statistics line {line:?}")) } else { Ok(()) };
        match key {
            "opts:" => incomplete(2)?,
            "age:" => {
                incomplete(2)?;
                nfs.age_seconds = parse_age(ss[1]).ok_or_else(|| format!("invalid age {:?}", ss[1]))?;
            }
            "bytes:" => {
                incomplete(2)?;
                nfs.bytes = parse_all("bytes", &ss[1..])?;
            }
            "events:" => {
                incomplete(2)?;
                nfs.events = parse_all("events", &ss[1..])?;
            }
            "xprt:" => {
                incomplete(3)?;
                nfs.transports.push(parse_transport(ss[1], &ss[2..], version)?);
            }
            "per-op" => break,
            _ => {}
        }
    }
    for line in lines {
        let ss: Vec<&str> = line.split_whitespace().collect();
        if ss.is_empty() {
            break;
        }
        if ss.len() < 9 {
            return Err(format!("invalid NFS per-operation statistics {line:?}"));
        }
        let n = ss[1..].iter().map(|s| parse_dec(s)).collect::<Result<Vec<u64>, _>>()?;
        nfs.operations.push(Operation {
            name: ss[0].strip_suffix(':').unwrap_or(ss[0]),
            requests: n[0],
            transmissions: n[1],
            major_timeouts: n[2],
            bytes_sent: n[3],
            bytes_received: n[4],
            queue_ms: n[5],
            response_ms: n[6],
            request_ms: n[7],
        });
    }
    Ok(nfs)
}

/// One `xprt:` line's values after the protocol. Statistics 1.0 has tcp
/// (10 values) and udp (7); 1.1 adds the slot and queue figures (13 and
/// 10) and rdma (at least 20). udp has no connect counters; rdma's values
/// after the backlog are RDMA counters, not the slot and queue figures.
pub fn parse_transport<'a>(protocol: &'a str, ss: &[&str], version: &str) -> Result<Transport<'a>, String> {
    let ok = match (version, protocol) {
        ("1.0", "tcp") => ss.len() == 10,
        ("1.0", "udp") => ss.len() == 7,
        ("1.1", "tcp") => ss.len() == 13,
        ("1.1", "udp") => ss.len() == 10,
        // procfs has room for 31 values.
        ("1.1", "rdma") => (20..=31).contains(&ss.len()),
        ("1.0" | "1.1", _) => return Err(format!("invalid NFS protocol {protocol:?} in statistics {version}")),
        _ => return Err(format!("unrecognized NFS statistics version {version:?}")),
    };
    if !ok {
        return Err(format!("invalid NFS {protocol} transport statistics {version}: {} values", ss.len()));
    }
    let n = ss.iter().map(|s| parse_dec(s)).collect::<Result<Vec<u64>, _>>()?;
    let at = |i: usize| n.get(i).copied().unwrap_or(0);
    let t = match protocol {
        "udp" => Transport {
            protocol,
            bind: at(1),
            sends: at(2),
            receives: at(3),
            bad_xids: at(4),
            backlog: at(6),
            max_slots: at(7),
            sending_queue: at(8),
            pending_queue: at(9),
            ..Transport::default()
        },
        _ => {
            let slots = protocol != "rdma";
            Transport {
                protocol,
                bind: at(1),
                connect: at(2),
                idle_time_seconds: at(4),
                sends: at(5),
                receives: at(6),
                bad_xids: at(7),
                backlog: at(9),
                max_slots: if slots { at(10) } else { 0 },
                sending_queue: if slots { at(11) } else { 0 },
                pending_queue: if slots { at(12) } else { 0 },
            }
        }
    };
    Ok(t)
}

/// The `age:` value in seconds, as Go's `time.ParseDuration(age + "s")`
/// reads it (so a Go duration whose last unit is left off, such as `1m5`,
/// is accepted too), through its nanosecond `Duration`.
pub fn parse_age(age: &str) -> Option<f64> {
    let d = parse_go_duration(&format!("{age}s"))?;
    Some((d / 1_000_000_000) as f64 + (d % 1_000_000_000) as f64 / 1e9)
}

/// Go's `time.ParseDuration`, in nanoseconds.
fn parse_go_duration(s: &str) -> Option<i64> {
    const LIMIT: u64 = 1 << 63;
    let (neg, mut s) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        let b = s.as_bytes();
        if !(b[0] == b'.' || b[0].is_ascii_digit()) {
            return None;
        }
        // The integer part.
        let int_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let mut v: u64 = 0;
        for &c in &b[..int_len] {
            if v > LIMIT / 10 {
                return None;
            }
            v = v * 10 + u64::from(c - b'0');
            if v > LIMIT {
                return None;
            }
        }
        s = &s[int_len..];
        // The fraction: digits past 64 bits of precision are dropped.
        let (mut f, mut scale) = (0u64, 1f64);
        if let Some(rest) = s.strip_prefix('.') {
            let frac_len = rest.bytes().take_while(|c| c.is_ascii_digit()).count();
            let mut overflow = false;
            for c in rest.bytes().take(frac_len) {
                if overflow || f > (LIMIT - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let y = f * 10 + u64::from(c - b'0');
                if y > LIMIT {
                    overflow = true;
                    continue;
                }
                f = y;
                scale *= 10.0;
            }
            s = &rest[frac_len..];
            if int_len == 0 && frac_len == 0 {
                return None;
            }
        } else if int_len == 0 {
            return None;
        }
        let unit_len = s.bytes().take_while(|&c| c != b'.' && !c.is_ascii_digit()).count();
        let unit: u64 = match &s[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        s = &s[unit_len..];
        if v > LIMIT / unit {
            return None;
        }
        v *= unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return None;
            }
        }
        total = total.checked_add(v)?;
        if total > LIMIT {
            return None;
        }
    }
    if neg {
        return Some((total as i64).wrapping_neg());
    }
    i64::try_from(total).ok()
}

/// The `addr=` super option of each line of a mountinfo file ("" when a
/// line has none), checking each line as procfs's `parseMountInfo` does: at
/// least 10 space-separated fields, `-` fourth from the end, numeric mount
/// and parent IDs.
pub fn parse_mountinfo_addrs(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    for line in crate::parse::go_lines(text) {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 10 {
            return Err(format!("too few fields in mount line {line:?}"));
        }
        if f[f.len() - 4] != "-" {
            return Err(format!("no separator in mount line {line:?}"));
        }
        if f[0].parse::<i64>().is_err() || f[1].parse::<i64>().is_err() {
            return Err(format!("invalid mount or parent ID in mount line {line:?}"));
        }
        let mut addr = "";
        for opt in f[f.len() - 1].split(',') {
            let mut kv = opt.split('=');
            if kv.next() == Some("addr") {
                addr = kv.next().unwrap_or("");
            }
        }
        out.push(addr);
    }
    Ok(out)
}

type Get = fn(&Nfs) -> u64;
type TransportGet = fn(&Transport) -> f64;
type OperationGet = fn(&Operation) -> f64;

/// Per-mount counters: family, help, value.
const MOUNT_COUNTERS: [(&str, &str, Get); 34] = [
    ("node_mountstats_nfs_read_bytes_total", "Number of bytes read using the read() syscall.", |s| s.bytes[0]),
    ("node_mountstats_nfs_write_bytes_total", "Number of bytes written using the write() syscall.", |s| s.bytes[1]),
    ("node_mountstats_nfs_direct_read_bytes_total", "Number of bytes read using the read() syscall in O_DIRECT mode.", |s| s.bytes[2]),
    ("node_mountstats_nfs_direct_write_bytes_total", "Number of bytes written using the write() syscall in O_DIRECT mode.", |s| s.bytes[3]),
    ("node_mountstats_nfs_total_read_bytes_total", "Number of bytes read from the NFS server, in total.", |s| s.bytes[4]),
    ("node_mountstats_nfs_total_write_bytes_total", "Number of bytes written to the NFS server, in total.", |s| s.bytes[5]),
    ("node_mountstats_nfs_read_pages_total", "Number of pages read directly via mmap()'d files.", |s| s.bytes[6]),
    ("node_mountstats_nfs_write_pages_total", "Number of pages written directly via mmap()'d files.", |s| s.bytes[7]),
    (
        "node_mountstats_nfs_event_inode_revalidate_total",
        "Number of times cached inode attributes are re-validated from the server.",
        |s| s.events[0],
    ),
    ("node_mountstats_nfs_event_dnode_revalidate_total", "Number of times cached dentry nodes are re-validated from the server.", |s| {
        s.events[1]
    }),
    ("node_mountstats_nfs_event_data_invalidate_total", "Number of times an inode cache is cleared.", |s| s.events[2]),
    ("node_mountstats_nfs_event_attribute_invalidate_total", "Number of times cached inode attributes are invalidated.", |s| s.events[3]),
    // node_exporter's help repeats the one above; this says what it counts.
    ("node_mountstats_nfs_event_vfs_open_total", "Number of times files or directories have been opened.", |s| s.events[4]),
    ("node_mountstats_nfs_event_vfs_lookup_total", "Number of times a directory lookup has occurred.", |s| s.events[5]),
    ("node_mountstats_nfs_event_vfs_access_total", "Number of times permissions have been checked.", |s| s.events[6]),
    ("node_mountstats_nfs_event_vfs_update_page_total", "Number of updates (and potential writes) to pages.", |s| s.events[7]),
    ("node_mountstats_nfs_event_vfs_read_page_total", "Number of pages read directly via mmap()'d files.", |s| s.events[8]),
    ("node_mountstats_nfs_event_vfs_read_pages_total", "Number of times a group of pages have been read.", |s| s.events[9]),
    ("node_mountstats_nfs_event_vfs_write_page_total", "Number of pages written directly via mmap()'d files.", |s| s.events[10]),
    ("node_mountstats_nfs_event_vfs_write_pages_total", "Number of times a group of pages have been written.", |s| s.events[11]),
    ("node_mountstats_nfs_event_vfs_getdents_total", "Number of times directory entries have been read with getdents().", |s| s.events[12]),
    // node_exporter's help repeats the getdents one; this says what it counts.
    ("node_mountstats_nfs_event_vfs_setattr_total", "Number of times file attributes have been set with setattr().", |s| s.events[13]),
    ("node_mountstats_nfs_event_vfs_flush_total", "Number of pending writes that have been forcefully flushed to the server.", |s| {
        s.events[14]
    }),
    ("node_mountstats_nfs_event_vfs_fsync_total", "Number of times fsync() has been called on directories and files.", |s| s.events[15]),
    ("node_mountstats_nfs_event_vfs_lock_total", "Number of times locking has been attempted on a file.", |s| s.events[16]),
    ("node_mountstats_nfs_event_vfs_file_release_total", "Number of times files have been closed and released.", |s| s.events[17]),
    // events[18] is the congestion wait count, which node_exporter does not export.
    ("node_mountstats_nfs_event_truncation_total", "Number of times files have been truncated.", |s| s.events[19]),
    (
        "node_mountstats_nfs_event_write_extension_total",
        "Number of times a file has been grown due to writes beyond its existing end.",
        |s| s.events[20],
    ),
    ("node_mountstats_nfs_event_silly_rename_total", "Number of times a file was removed while still open by another process.", |s| {
        s.events[21]
    }),
    ("node_mountstats_nfs_event_short_read_total", "Number of times the NFS server gave less data than expected while reading.", |s| {
        s.events[22]
    }),
    ("node_mountstats_nfs_event_short_write_total", "Number of times the NFS server wrote less data than expected while writing.", |s| {
        s.events[23]
    }),
    (
        "node_mountstats_nfs_event_jukebox_delay_total",
        "Number of times the NFS server indicated EJUKEBOX; retrieving data from offline storage.",
        |s| s.events[24],
    ),
    ("node_mountstats_nfs_event_pnfs_read_total", "Number of NFS v4.1+ pNFS reads.", |s| s.events[25]),
    ("node_mountstats_nfs_event_pnfs_write_total", "Number of NFS v4.1+ pNFS writes.", |s| s.events[26]),
];

/// Per-transport figures: family, help, kind, value.
const TRANSPORT: [(&str, &str, Kind, TransportGet); 10] = [
    (
        "node_mountstats_nfs_transport_bind_total",
        "Number of times the client has had to establish a connection from scratch to the NFS server.",
        Kind::Counter,
        |t| t.bind as f64,
    ),
    (
        "node_mountstats_nfs_transport_connect_total",
        "Number of times the client has made a TCP connection to the NFS server.",
        Kind::Counter,
        |t| t.connect as f64,
    ),
    (
        "node_mountstats_nfs_transport_idle_time_seconds",
        "Duration since the NFS mount last saw any RPC traffic, in seconds.",
        Kind::Gauge,
        |t| (t.idle_time_seconds % MANTISSA) as f64,
    ),
    ("node_mountstats_nfs_transport_sends_total", "Number of RPC requests for this mount sent to the NFS server.", Kind::Counter, |t| {
        t.sends as f64
    }),
    (
        "node_mountstats_nfs_transport_receives_total",
        "Number of RPC responses for this mount received from the NFS server.",
        Kind::Counter,
        |t| t.receives as f64,
    ),
    (
        "node_mountstats_nfs_transport_bad_transaction_ids_total",
        "Number of times the NFS server sent a response with a transaction ID unknown to this client.",
        Kind::Counter,
        |t| t.bad_xids as f64,
    ),
    ("node_mountstats_nfs_transport_backlog_queue_total", "Total number of items added to the RPC backlog queue.", Kind::Counter, |t| {
        t.backlog as f64
    }),
    (
        "node_mountstats_nfs_transport_maximum_rpc_slots",
        "Maximum number of simultaneously active RPC requests ever used.",
        Kind::Gauge,
        |t| t.max_slots as f64,
    ),
    (
        "node_mountstats_nfs_transport_sending_queue_total",
        "Total number of items added to the RPC transmission sending queue.",
        Kind::Counter,
        |t| t.sending_queue as f64,
    ),
    (
        "node_mountstats_nfs_transport_pending_queue_total",
        "Total number of items added to the RPC transmission pending queue.",
        Kind::Counter,
        |t| t.pending_queue as f64,
    ),
];

fn ms_to_seconds(ms: u64) -> f64 {
    (ms % MANTISSA) as f64 / 1000.0
}

/// Per-operation counters: family, help, value.
const OPERATION: [(&str, &str, OperationGet); 8] = [
    ("node_mountstats_nfs_operations_requests_total", "Number of requests performed for a given operation.", |o| o.requests as f64),
    (
        "node_mountstats_nfs_operations_transmissions_total",
        "Number of times an actual RPC request has been transmitted for a given operation.",
        |o| o.transmissions as f64,
    ),
    (
        "node_mountstats_nfs_operations_major_timeouts_total",
        "Number of times a request has had a major timeout for a given operation.",
        |o| o.major_timeouts as f64,
    ),
    (
        "node_mountstats_nfs_operations_sent_bytes_total",
        "Number of bytes sent for a given operation, including RPC headers and payload.",
        |o| o.bytes_sent as f64,
    ),
    (
        "node_mountstats_nfs_operations_received_bytes_total",
        "Number of bytes received for a given operation, including RPC headers and payload.",
        |o| o.bytes_received as f64,
    ),
    (
        "node_mountstats_nfs_operations_queue_time_seconds_total",
        "Duration all requests spent queued for transmission for a given operation before they were sent, in seconds.",
        |o| ms_to_seconds(o.queue_ms),
    ),
    (
        "node_mountstats_nfs_operations_response_time_seconds_total",
        "Duration all requests took to get a reply back after a request for a given operation was transmitted, in seconds.",
        |o| ms_to_seconds(o.response_ms),
    ),
    (
        "node_mountstats_nfs_operations_request_time_seconds_total",
        "Duration all requests took from when a request was enqueued to when it was completely handled for a given operation, in seconds.",
        |o| ms_to_seconds(o.request_ms),
    ),
];

/// Writes the statistics of one NFS mount under (export, protocol, mountaddr).
fn write_stats(sink: &mut Sink, s: &Nfs, export: &str, protocol: &str, addr: &str) {
    let l = [("export", export), ("mountaddr", addr), ("protocol", protocol)];
    sink.family("node_mountstats_nfs_age_seconds_total", "The age of the NFS mount in seconds.", Kind::Counter).sample(&l, s.age_seconds);
    for (name, help, get) in MOUNT_COUNTERS {
        sink.family(name, help, Kind::Counter).sample(&l, get(s) as f64);
    }
    let mut ib = itoa::Buffer::new();
    for (i, t) in s.transports.iter().enumerate() {
        let l = [("export", export), ("mountaddr", addr), ("protocol", protocol), ("transport", ib.format(i))];
        for (name, help, kind, get) in TRANSPORT {
            sink.family(name, help, kind).sample(&l, get(t));
        }
    }
    for o in &s.operations {
        let l = [("export", export), ("mountaddr", addr), ("operation", o.name), ("protocol", protocol)];
        for (name, help, get) in OPERATION {
            sink.family(name, help, Kind::Counter).sample(&l, get(o));
        }
    }
}

/// Writes every NFS mount as node_exporter does: one mountpoint_info per
/// (export, protocol, mountaddr, mount point), and the statistics of the
/// first mount of each (export, protocol, mountaddr), labelled with the
/// protocol of the transport that made it new; a transport whose
/// (export, protocol, mountaddr) was already written ends its mount's turn.
pub fn write(sink: &mut Sink, mounts: &[Mount], addrs: &[&str]) {
    let mut mount_points: HashSet<(&str, &str, &str, &str)> = HashSet::new();
    let mut devices: HashSet<(&str, &str, &str)> = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let Some(s) = &m.nfs else { continue };
        let addr = addrs.get(i).copied().unwrap_or("");
        for t in &s.transports {
            if mount_points.insert((m.device, t.protocol, addr, m.mount_point)) {
                sink.family("node_mountstats_nfs_mountpoint_info", "Info metric for an NFS mountpoint.", Kind::Gauge)
                    .sample(&[("export", m.device), ("mountaddr", addr), ("mountpoint", m.mount_point), ("protocol", t.protocol)], 1.0);
            }
            if !devices.insert((m.device, t.protocol, addr)) {
                tracing::debug!(device = m.device, protocol = t.protocol, mountaddr = addr, "skipping duplicate NFS device entry");
                break;
            }
            write_stats(sink, s, m.device, t.protocol, addr);
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let dir = match &self.pid_dir {
            Some(d) => d.clone(),
            None => {
                let d = resolve_self(&self.procfs)?;
                self.pid_dir = Some(d.clone());
                d
            }
        };
        let stats_path = dir.join("mountstats");
        read_file(&stats_path, &mut self.stats_buf)?;
        let info_path = dir.join("mountinfo");
        read_file(&info_path, &mut self.info_buf)?;
        let stats: Cow<str> = String::from_utf8_lossy(&self.stats_buf);
        let mounts = parse_mountstats(&stats).map_err(|m| Error::parse(&stats_path, m))?;
        let info: Cow<str> = String::from_utf8_lossy(&self.info_buf);
        let addrs = parse_mountinfo_addrs(&info).map_err(|m| Error::parse(&info_path, m))?;
        write(sink, &mounts, &addrs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{rows, Row};

    const NFS4: &str = "device rootfs mounted on / with fstype rootfs
device 192.168.1.1:/srv/test mounted on /mnt/nfs/test with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.0,rsize=1048576,wsize=1048576,proto=tcp,port=0
\tage:\t13968
\tcaps:\tcaps=0xfff7,wtmult=512,dtsize=32768,bsize=0,namlen=255
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t52 226 0 0 1 13 398 0 0 331 0 47 0 0 77 0 0 77 0 0 0 0 0 0 0 0 0
\tbytes:\t1207640230 0 0 0 1210214218 0 295483 0
\tRPC iostats version: 1.0  p/v: 100003/4 (nfs)
\txprt:\ttcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726
\tper-op statistics
\t        NULL: 0 0 0 0 0 0 0 0
\t        READ: 1298 1298 0 207680 1210292152 6 79386 79407
\t      ACCESS: 2927395007 2927394995 0 526931094212 362996810236 18446743919241604546 1667369447 1953587717

";

    const DUPES: &str = "device 192.168.1.1:/srv/test mounted on /mnt/nfs/test with fstype nfs4 statvers=1.1
\tage:\t10
\txprt:\ttcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726
\tper-op statistics
\t        READ: 1 1 0 2 3 6 7 8

device 192.168.1.1:/srv/test mounted on /mnt/nfs/test-dupe with fstype nfs4 statvers=1.1
\tage:\t10
\txprt:\ttcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726
\tper-op statistics
\t       WRITE: 0 0 0 0 0 0 0 0

device 192.168.1.1:/srv/test mounted on /mnt/nfs/test-dupe with fstype nfs statvers=1.1
\tage:\t10
\txprt:\tudp 832 0 6428 6428 0 12154 0 24 26 5726
\tper-op statistics
\t        READ: 1 1 0 2 3 6 7 8

";

    const MOUNTINFO: &str = "\
194 21 0:42 / /mnt/nfs/test rw shared:144 - nfs4 192.168.1.1:/srv/test rw,vers=4.0,clientaddr=192.168.1.5,addr=192.168.1.1,local_lock=none
177 21 0:42 / /mnt/nfs/test-dupe rw shared:130 - nfs4 192.168.1.1:/srv/test rw,vers=4.0,addr=192.168.1.1,local_lock=none
1398 798 0:44 / /mnt/nfs/test-dupe rw,relatime shared:1154 - nfs 192.168.1.1:/srv/test rw,vers=3,mountaddr=192.168.1.2,addr=192.168.1.1
";

    fn find<'a>(rows: &'a [Row], name: &str, labels: &[(&str, &str)]) -> Option<&'a Row> {
        rows.iter().find(|r| r.0 == name && r.1.iter().map(|(a, b)| (a.as_str(), b.as_str())).eq(labels.iter().copied()))
    }

    #[test]
    fn parses_an_nfs4_mount() {
        let m = parse_mountstats(NFS4).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].device, m[0].fstype, m[0].nfs.is_none()), ("rootfs", "rootfs", true));
        assert_eq!((m[1].device, m[1].mount_point, m[1].fstype), ("192.168.1.1:/srv/test", "/mnt/nfs/test", "nfs4"));
        let s = m[1].nfs.as_ref().unwrap();
        assert_eq!(s.age_seconds, 13968.0);
        assert_eq!(s.bytes, [1207640230, 0, 0, 0, 1210214218, 0, 295483, 0]);
        assert_eq!((s.events[0], s.events[1], s.events[9], s.events[17]), (52, 226, 331, 77));
        assert_eq!(
            s.transports,
            vec![Transport {
                protocol: "tcp",
                bind: 0,
                connect: 1,
                idle_time_seconds: 11,
                sends: 6428,
                receives: 6428,
                bad_xids: 0,
                backlog: 0,
                max_slots: 24,
                sending_queue: 26,
                pending_queue: 5726,
            }]
        );
        assert_eq!(s.operations.len(), 3);
        assert_eq!(s.operations[1].name, "READ");
        assert_eq!((s.operations[1].requests, s.operations[1].queue_ms, s.operations[1].request_ms), (1298, 6, 79407));
        assert_eq!(s.operations[2].queue_ms, 18446743919241604546);
    }

    #[test]
    fn places_transport_fields_by_protocol_and_version() {
        let udp11 = parse_transport("udp", &"832 1 6428 6427 3 12154 5 24 26 5726".split(' ').collect::<Vec<_>>(), "1.1").unwrap();
        assert_eq!((udp11.bind, udp11.connect, udp11.idle_time_seconds, udp11.sends, udp11.receives), (1, 0, 0, 6428, 6427));
        assert_eq!((udp11.bad_xids, udp11.backlog, udp11.max_slots, udp11.pending_queue), (3, 5, 24, 5726));
        let udp10 = parse_transport("udp", &"832 1 2 3 4 5 6".split(' ').collect::<Vec<_>>(), "1.0").unwrap();
        assert_eq!((udp10.sends, udp10.backlog, udp10.max_slots), (2, 6, 0));
        let tcp10 = parse_transport("tcp", &"1 2 3 4 5 6 7 8 9 10".split(' ').collect::<Vec<_>>(), "1.0").unwrap();
        assert_eq!((tcp10.connect, tcp10.idle_time_seconds, tcp10.backlog, tcp10.max_slots), (3, 5, 10, 0));
        let rdma: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
        let rdma: Vec<&str> = rdma.iter().map(String::as_str).collect();
        let r = parse_transport("rdma", &rdma, "1.1").unwrap();
        assert_eq!((r.sends, r.backlog, r.max_slots, r.sending_queue, r.pending_queue), (6, 10, 0, 0, 0));
        assert!(parse_transport("rdma", &rdma[..19], "1.1").is_err());
        assert!(parse_transport("rdma", &rdma, "1.0").is_err());
        assert!(parse_transport("tcp", &rdma[..12], "1.1").is_err());
        assert!(parse_transport("sctp", &rdma[..10], "1.1").is_err());
        assert!(parse_transport("tcp", &rdma[..10], "2.0").is_err());
        assert!(parse_transport("tcp", &["1", "2", "3", "4", "5", "6", "7", "8", "9", "-1"], "1.0").is_err());
    }

    #[test]
    fn rejects_malformed_statistics() {
        let dev = "device a:/b mounted on /c with fstype nfs statvers=1.1\n";
        for bad in [
            "device a:/b mounted on /c with\n",
            "device a:/b mounted at /c with fstype nfs\n",
            "device a:/b mounted on /c with fstype ext4 statvers=1.1\n",
        ] {
            assert!(parse_mountstats(bad).is_err(), "{bad}");
        }
        for body in [
            "\tage:\n",
            "\tage:\tx\n",
            "\topts:\n",
            "\tbytes:\t1 2 3\n",
            "\tbytes:\t1 2 3 4 5 6 7 +8\n",
            "\tevents:\t1 2\n",
            "\txprt:\ttcp\n",
            "\txprt:\ttcp 1 2\n",
            "\tper-op statistics\n\tREAD: 1 2 3\n",
            "\tper-op statistics\n\tREAD: 1 2 3 4 5 6 7 x\n",
        ] {
            assert!(parse_mountstats(&format!("{dev}{body}")).is_err(), "{body}");
        }
        // Without a per-op line, the statistics end at the empty line and
        // the lines after it are read as operations (as procfs reads them).
        assert!(parse_mountstats(&format!("{dev}\tage:\t1\n\n{dev}")).is_err());
        // A mount without statistics, unknown lines and a bare mount are fine.
        let ok = parse_mountstats("device a mounted on /b with fstype nfs\nno device here\n\n").unwrap();
        assert_eq!(ok.len(), 1);
        assert!(ok[0].nfs.is_none());
    }

    #[test]
    fn reads_the_age_as_a_go_duration() {
        assert_eq!(parse_age("13968"), Some(13968.0));
        assert_eq!(parse_age("1.5"), Some(1.5));
        assert_eq!(parse_age("-2"), Some(-2.0));
        assert_eq!(parse_age("1m5"), Some(65.0));
        assert_eq!(parse_age("."), None);
        assert_eq!(parse_age("x"), None);
        assert_eq!(parse_age("99999999999999999999"), None);
        assert_eq!(parse_age("9223372037"), None, "past 2^63 ns");
    }

    #[test]
    fn reads_addr_from_mountinfo() {
        assert_eq!(parse_mountinfo_addrs(MOUNTINFO).unwrap(), vec!["192.168.1.1"; 3]);
        assert_eq!(parse_mountinfo_addrs("1 2 0:1 / / rw shared:1 - ext4 /dev/sda1 rw,addr\n").unwrap(), vec![""]);
        assert!(parse_mountinfo_addrs("1 2 0:1 / / rw - ext4 /dev/sda1\n").is_err(), "too few fields");
        assert!(parse_mountinfo_addrs("1 2 0:1 / / rw shared:1 x ext4 /dev/sda1 rw\n").is_err(), "no separator");
        assert!(parse_mountinfo_addrs("x 2 0:1 / / rw shared:1 - ext4 /dev/sda1 rw\n").is_err(), "mount ID");
        assert!(parse_mountinfo_addrs("1 2 0:1 / / rw shared:1 - ext4 /dev/sda1 rw\n\n").is_err(), "an empty line");
        assert!(parse_mountinfo_addrs("").unwrap().is_empty());
    }

    #[test]
    fn wraps_times_at_the_mantissa() {
        let m = parse_mountstats(NFS4).unwrap();
        let mut sink = Sink::new();
        write(&mut sink, &m, &["", "10.0.0.1"]);
        let rows = rows(&sink);
        let l = [("export", "192.168.1.1:/srv/test"), ("mountaddr", "10.0.0.1"), ("operation", "ACCESS"), ("protocol", "tcp")];
        let q = find(&rows, "node_mountstats_nfs_operations_queue_time_seconds_total", &l).unwrap();
        assert_eq!(q.2, 9.007044786793922e12);
        let r = find(&rows, "node_mountstats_nfs_operations_request_time_seconds_total", &l).unwrap();
        assert_eq!(r.2, 1953587.717);
        let l = [("export", "192.168.1.1:/srv/test"), ("mountaddr", "10.0.0.1"), ("protocol", "tcp"), ("transport", "0")];
        assert_eq!(find(&rows, "node_mountstats_nfs_transport_idle_time_seconds", &l).unwrap().2, 11.0);
        // 34 mount counters + age, 10 transport figures, 3 operations × 8, 1 info.
        assert_eq!(rows.len(), 35 + 10 + 24 + 1);
    }

    #[test]
    fn deduplicates_as_node_exporter() {
        let m = parse_mountstats(DUPES).unwrap();
        let addrs = parse_mountinfo_addrs(MOUNTINFO).unwrap();
        let mut sink = Sink::new();
        write(&mut sink, &m, &addrs);
        let rows = rows(&sink);
        let infos: Vec<_> = rows.iter().filter(|r| r.0 == "node_mountstats_nfs_mountpoint_info").collect();
        assert_eq!(infos.len(), 3, "{infos:?}");
        let ages: Vec<_> = rows.iter().filter(|r| r.0 == "node_mountstats_nfs_age_seconds_total").collect();
        assert_eq!(ages.len(), 2, "the second tcp mount of the export is skipped: {ages:?}");
        let op = |o: &str, p: &str| {
            find(
                &rows,
                "node_mountstats_nfs_operations_requests_total",
                &[("export", "192.168.1.1:/srv/test"), ("mountaddr", "192.168.1.1"), ("operation", o), ("protocol", p)],
            )
            .is_some()
        };
        assert!(op("READ", "tcp") && op("READ", "udp"));
        assert!(!op("WRITE", "tcp"), "the duplicate's operations are not written");
        let mut seen = HashSet::new();
        for r in &rows {
            assert!(seen.insert((r.0.clone(), r.1.clone())), "duplicate series {r:?}");
        }
    }

    #[test]
    fn reads_the_files_of_the_pid_self_links_to() {
        use crate::Collector as _;
        let dir = tempfile::tempdir().unwrap();
        let p = crate::testutil::paths(dir.path());
        let mut c = Collector::new(&p);
        assert!(c.update(&mut Sink::new()).is_err(), "no proc/self");
        crate::testutil::write(dir.path(), "proc/10/mountstats", DUPES);
        std::os::unix::fs::symlink("10", dir.path().join("proc/self")).unwrap();
        assert!(c.update(&mut Sink::new()).unwrap_err().is_no_data(), "no mountinfo");
        crate::testutil::write(dir.path(), "proc/10/mountinfo", MOUNTINFO);
        let mut sink = Sink::new();
        c.update(&mut sink).unwrap();
        assert_eq!(rows(&sink).iter().filter(|r| r.0 == "node_mountstats_nfs_mountpoint_info").count(), 3);
        crate::testutil::write(dir.path(), "proc/10/mountinfo", "garbage\n");
        assert!(matches!(c.update(&mut Sink::new()), Err(Error::Parse { .. })));
    }
}
