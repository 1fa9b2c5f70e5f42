//! `infiniband`: InfiniBand (and RDMA) devices from /sys/class/infiniband.
//! For each device it exports `node_infiniband_info` (board id, firmware
//! version, HCA type) and, per port, the state and physical state ids, the
//! signalling rate in bytes per second, and every counter node_exporter
//! knows from the port's `counters` (with the pre-4.5 `counters_ext`) and
//! `hw_counters` directories, as procfs parses them: data counters
//! multiplied by the four lanes, `N/A (no PMA)` values left out, `lifespan`
//! in seconds. Devices may be filtered with `--collector.infiniband.device-*`
//! (every device is still read, so a broken one fails the scrape as in
//! node_exporter).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use clap::Arg;

use crate::filter::DeviceFilter;
use crate::flags::{self, Flags, StringFlag};
use crate::{ConfigError, Error, Paths};
use expo::{Kind, Sink};

pub const EXCLUDE: StringFlag = StringFlag {
    name: "collector.infiniband.device-exclude",
    default: "",
    help: "Regexp of infiniband devices to exclude (mutually exclusive to device-include).",
};
pub const INCLUDE: StringFlag = StringFlag {
    name: "collector.infiniband.device-include",
    default: "",
    help: "Regexp of infiniband devices to include (mutually exclusive to device-exclude).",
};

/// The collector's flags, parsed once.
pub struct Options {
    /// Both patterns apply when both are given, as in node_exporter.
    pub filter: DeviceFilter,
}

impl Options {
    pub fn args() -> Vec<Arg> {
        flags::args(&[&EXCLUDE, &INCLUDE])
    }

    pub fn from_flags(f: &Flags) -> Result<Self, ConfigError> {
        let (exclude, include) = (EXCLUDE.regex(f)?, INCLUDE.regex(f)?);
        if let Some(r) = &include {
            tracing::info!(flag = r.as_str(), "Parsed flag --{}", INCLUDE.name);
        }
        if let Some(r) = &exclude {
            tracing::info!(flag = r.as_str(), "Parsed flag --{}", EXCLUDE.name);
        }
        Ok(Options { filter: DeviceFilter::new(exclude, include) })
    }
}

/// The directory of a port a counter file lives in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    Counters,
    /// 64-bit counters of kernels before 4.5 (read only with `counters`).
    CountersExt,
    HwCounters,
}

/// How a counter file's value becomes a sample.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Conv {
    Plain,
    /// Data counters count per lane: times four (Mellanox).
    Lanes,
    /// `lifespan`, in milliseconds: whole seconds, a gauge.
    Millis,
}

struct Counter {
    dir: Dir,
    file: &'static str,
    family: &'static str,
    help: &'static str,
    conv: Conv,
}

const fn c(dir: Dir, file: &'static str, family: &'static str, help: &'static str) -> Counter {
    Counter { dir, file, family, help, conv: Conv::Plain }
}

const fn lanes(dir: Dir, file: &'static str, family: &'static str, help: &'static str) -> Counter {
    Counter { dir, file, family, help, conv: Conv::Lanes }
}

use Dir::{Counters as C, CountersExt as X, HwCounters as H};

/// Every counter file node_exporter exports, with its family.
const COUNTERS: &[Counter] = &[
    c(X, "port_multicast_rcv_packets", "node_infiniband_legacy_multicast_packets_received_total", "Number of multicast packets received"),
    c(X, "port_multicast_xmit_packets", "node_infiniband_legacy_multicast_packets_transmitted_total", "Number of multicast packets transmitted"),
    lanes(X, "port_rcv_data_64", "node_infiniband_legacy_data_received_bytes_total", "Number of data octets received on all links"),
    c(X, "port_rcv_packets_64", "node_infiniband_legacy_packets_received_total", "Number of data packets received on all links"),
    c(X, "port_unicast_rcv_packets", "node_infiniband_legacy_unicast_packets_received_total", "Number of unicast packets received"),
    c(X, "port_unicast_xmit_packets", "node_infiniband_legacy_unicast_packets_transmitted_total", "Number of unicast packets transmitted"),
    lanes(X, "port_xmit_data_64", "node_infiniband_legacy_data_transmitted_bytes_total", "Number of data octets transmitted on all links"),
    c(X, "port_xmit_packets_64", "node_infiniband_legacy_packets_transmitted_total", "Number of data packets transmitted on all links"),
    c(
        C,
        "excessive_buffer_overrun_errors",
        "node_infiniband_excessive_buffer_overrun_errors_total",
        "Number of times that OverrunErrors consecutive flow control update periods occurred, each having at least one overrun error.",
    ),
    c(C, "link_downed", "node_infiniband_link_downed_total", "Number of times the link failed to recover from an error state and went down"),
    c(C, "link_error_recovery", "node_infiniband_link_error_recovery_total", "Number of times the link successfully recovered from an error state"),
    c(
        C,
        "local_link_integrity_errors",
        "node_infiniband_local_link_integrity_errors_total",
        "Number of times that the count of local physical errors exceeded the threshold specified by LocalPhyErrors.",
    ),
    c(C, "multicast_rcv_packets", "node_infiniband_multicast_packets_received_total", "Number of multicast packets received (including errors)"),
    c(C, "multicast_xmit_packets", "node_infiniband_multicast_packets_transmitted_total", "Number of multicast packets transmitted (including errors)"),
    c(
        C,
        "port_rcv_constraint_errors",
        "node_infiniband_port_constraint_errors_received_total",
        "Number of packets received on the switch physical port that are discarded",
    ),
    lanes(C, "port_rcv_data", "node_infiniband_port_data_received_bytes_total", "Number of data octets received on all links"),
    c(
        C,
        "port_rcv_discards",
        "node_infiniband_port_discards_received_total",
        "Number of inbound packets discarded by the port because the port is down or congested",
    ),
    c(C, "port_rcv_errors", "node_infiniband_port_errors_received_total", "Number of packets containing an error that were received on this port"),
    c(C, "port_rcv_packets", "node_infiniband_port_packets_received_total", "Number of packets received on all VLs by this port (including errors)"),
    c(
        C,
        "port_rcv_remote_physical_errors",
        "node_infiniband_port_receive_remote_physical_errors_total",
        "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.",
    ),
    c(C, "port_rcv_switch_relay_errors", "node_infiniband_port_receive_switch_relay_errors_total", "Number of packets that could not be forwarded by the switch."),
    c(
        C,
        "port_xmit_constraint_errors",
        "node_infiniband_port_constraint_errors_transmitted_total",
        "Number of packets not transmitted from the switch physical port",
    ),
    lanes(C, "port_xmit_data", "node_infiniband_port_data_transmitted_bytes_total", "Number of data octets transmitted on all links"),
    c(
        C,
        "port_xmit_discards",
        "node_infiniband_port_discards_transmitted_total",
        "Number of outbound packets discarded by the port because the port is down or congested",
    ),
    c(
        C,
        "port_xmit_packets",
        "node_infiniband_port_packets_transmitted_total",
        "Number of packets transmitted on all VLs from this port (including errors)",
    ),
    c(
        C,
        "port_xmit_wait",
        "node_infiniband_port_transmit_wait_total",
        "Number of ticks during which the port had data to transmit but no data was sent during the entire tick",
    ),
    c(C, "symbol_error", "node_infiniband_symbol_error_total", "Number of minor link errors detected on one or more physical lanes."),
    c(C, "unicast_rcv_packets", "node_infiniband_unicast_packets_received_total", "Number of unicast packets received (including errors)"),
    c(C, "unicast_xmit_packets", "node_infiniband_unicast_packets_transmitted_total", "Number of unicast packets transmitted (including errors)"),
    c(C, "VL15_dropped", "node_infiniband_vl15_dropped_total", "Number of incoming VL15 packets dropped due to resource limitations."),
    Counter {
        dir: H,
        file: "lifespan",
        family: "node_infiniband_lifespan_seconds",
        help: "The maximum period in ms which defines the aging of the counter reads. Two consecutive reads within this period might return the same values.",
        conv: Conv::Millis,
    },
    c(
        H,
        "duplicate_request",
        "node_infiniband_duplicate_requests_packets_total",
        "The number of received packets. A duplicate request is a request that had been previously executed.",
    ),
    c(
        H,
        "implied_nak_seq_err",
        "node_infiniband_implied_nak_seq_errors_total",
        "The number of time the requested decided an ACK. with a PSN larger than the expected PSN for an RDMA read or response.",
    ),
    c(
        H,
        "local_ack_timeout_err",
        "node_infiniband_local_ack_timeout_errors_total",
        "The number of times QP's ack timer expired for RC, XRC, DCT QPs at the sender side. The QP retry limit was not exceed, therefore it is still recoverable error.",
    ),
    c(
        H,
        "np_cnp_sent",
        "node_infiniband_np_cnp_packets_sent_total",
        "The number of CNP packets sent by the Notification Point when it noticed congestion experienced in the RoCEv2 IP header (ECN bits). The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "np_ecn_marked_roce_packets",
        "node_infiniband_np_ecn_marked_roce_packets_received_total",
        "The number of RoCEv2 packets received by the notification point which were marked for experiencing the congestion (ECN bits where '11' on the ingress RoCE traffic) . The counters was added in MLNX_OFED 4.1",
    ),
    c(H, "out_of_buffer", "node_infiniband_out_of_buffer_drops_total", "The number of drops occurred due to lack of WQE for the associated QPs."),
    c(H, "out_of_sequence", "node_infiniband_out_of_sequence_packets_received_total", "The number of out of sequence packets received."),
    c(
        H,
        "packet_seq_err",
        "node_infiniband_packet_sequence_errors_total",
        "The number of received NAK sequence error packets. The QP retry limit was not exceeded.",
    ),
    c(
        H,
        "req_cqe_error",
        "node_infiniband_req_cqes_errors_total",
        "The number of times requester detected CQEs completed with errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "req_cqe_flush_error",
        "node_infiniband_req_cqes_flush_errors_total",
        "The number of times requester detected CQEs completed with flushed errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "req_remote_access_errors",
        "node_infiniband_req_remote_access_errors_total",
        "The number of times requester detected remote access errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "req_remote_invalid_request",
        "node_infiniband_req_remote_invalid_request_errors_total",
        "The number of times requester detected remote invalid request errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "resp_cqe_error",
        "node_infiniband_resp_cqes_errors_total",
        "The number of times responder detected CQEs completed with errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "resp_cqe_flush_error",
        "node_infiniband_resp_cqes_flush_errors_total",
        "The number of times responder detected CQEs completed with flushed errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "resp_local_length_error",
        "node_infiniband_resp_local_length_errors_total",
        "The number of times responder detected local length errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "resp_remote_access_errors",
        "node_infiniband_resp_remote_access_errors_total",
        "The number of times responder detected remote access errors. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "rnr_nak_retry_err",
        "node_infiniband_rnr_nak_retry_packets_received_total",
        "The number of received RNR NAK packets. The QP retry limit was not exceeded.",
    ),
    c(
        H,
        "roce_adp_retrans",
        "node_infiniband_roce_adp_retransmits_total",
        "The number of adaptive retransmissions for RoCE traffic. The counter was added in MLNX_OFED rev 5.0-1.0.0.0 and kernel v5.6.0",
    ),
    c(
        H,
        "roce_adp_retrans_to",
        "node_infiniband_roce_adp_retransmits_timeout_total",
        "The number of times RoCE traffic reached timeout due to adaptive retransmission. The counter was added in MLNX_OFED rev 5.0-1.0.0.0 and kernel v5.6.0",
    ),
    c(
        H,
        "roce_slow_restart",
        "node_infiniband_roce_slow_restart_used_total",
        "The number of times RoCE slow restart was used. The counter was added in MLNX_OFED rev 5.0-1.0.0.0 and kernel v5.6.0",
    ),
    c(
        H,
        "roce_slow_restart_cnps",
        "node_infiniband_roce_slow_restart_cnps_total",
        "The number of times RoCE slow restart generated CNP packets. The counter was added in MLNX_OFED rev 5.0-1.0.0.0 and kernel v5.6.0",
    ),
    c(
        H,
        "roce_slow_restart_trans",
        "node_infiniband_roce_slow_restart_total",
        "The number of times RoCE slow restart changed state to slow restart. The counter was added in MLNX_OFED rev 5.0-1.0.0.0 and kernel v5.6.0",
    ),
    c(
        H,
        "rp_cnp_handled",
        "node_infiniband_rp_cnp_packets_handled_total",
        "The number of CNP packets handled by the Reaction Point HCA to throttle the transmission rate. The counters was added in MLNX_OFED 4.1",
    ),
    c(
        H,
        "rp_cnp_ignored",
        "node_infiniband_rp_cnp_ignored_packets_received_total",
        "The number of CNP packets received and ignored by the Reaction Point HCA. This counter should not raise if RoCE Congestion Control was enabled in the network. If this counter raise, verify that ECN was enabled on the adapter.",
    ),
    c(H, "rx_atomic_requests", "node_infiniband_rx_atomic_requests_total", "The number of received ATOMIC request for the associated QPs."),
    c(H, "rx_dct_connect", "node_infiniband_rx_dct_connect_requests_total", "The number of received connection requests for the associated DCTs."),
    c(
        H,
        "rx_icrc_encapsulated",
        "node_infiniband_rx_icrc_encapsulated_errors_total",
        "The number of RoCE packets with ICRC errors. This counter was added in MLNX_OFED 4.4 and kernel 4.19",
    ),
    c(H, "rx_read_requests", "node_infiniband_rx_read_requests_total", "The number of received READ requests for the associated QPs."),
    c(H, "rx_write_requests", "node_infiniband_rx_write_requests_total", "The number of received WRITE requests for the associated QPs."),
];

const N: usize = COUNTERS.len();

/// The index in [`COUNTERS`] of the file `file` of directory `dir`.
pub fn counter_index(dir: Dir, file: &str) -> Option<usize> {
    COUNTERS.iter().position(|c| c.dir == dir && c.file == file)
}

/// Parses a port's `state` or `phys_state` (`4: ACTIVE`) into its id.
pub fn parse_state(s: &str) -> Result<u32, String> {
    let mut parts = s.split(':');
    let (Some(id), Some(_name), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("failed to split {s:?} into 'ID: NAME'"));
    };
    let id = id.trim();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("failed to convert {id:?} into uint"));
    }
    id.parse().map_err(|_| format!("failed to convert {id:?} into uint"))
}

/// Parses a port's `rate` (`100 Gb/sec (4X EDR)`) into bytes per second;
/// the number is read as a 32-bit float, as procfs does.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let Some((num, _)) = s.split_once(' ') else { return Err(format!("failed to split {s:?}")) };
    let num = num.trim();
    let v: f32 = num.parse().map_err(|_| format!("failed to convert {num:?} into float"))?;
    if v.is_infinite() && !num.trim_start_matches(['+', '-']).to_ascii_lowercase().starts_with("inf") {
        return Err(format!("{num:?} is out of range"));
    }
    Ok((f64::from(v) * 125_000_000.0) as u64)
}

/// One port of a device.
#[derive(Debug, PartialEq)]
pub struct Port {
    pub state: u32,
    pub phys_state: u32,
    /// Bytes per second.
    pub rate: u64,
    /// Raw values of [`COUNTERS`], by index (`None`: absent or `N/A`).
    pub counters: [Option<u64>; N],
}

/// One device.
#[derive(Debug)]
pub struct Device {
    pub name: String,
    pub board_id: String,
    pub firmware_version: String,
    pub hca_type: String,
    /// By port number.
    pub ports: BTreeMap<u32, Port>,
}

/// Why a read of a counter may be skipped: the file went away, is not
/// readable, or the driver does not support it (`EINVAL` only in
/// `counters`, as in procfs).
fn skippable(e: &io::Error, dir: Dir) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied)
        || e.raw_os_error() == Some(libc::EOPNOTSUPP)
        || (dir == Dir::Counters && e.raw_os_error() == Some(libc::EINVAL))
}

pub struct Collector {
    /// /sys/class/infiniband.
    dir: PathBuf,
    filter: DeviceFilter,
    buf: Vec<u8>,
}

/// Lists a directory's entries, sorted by name.
fn list(dir: &Path) -> Result<Vec<(String, std::fs::DirEntry)>, Error> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::from_read(dir, e))?;
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::from_read(dir, e))?;
        v.push((e.file_name().to_string_lossy().into_owned(), e));
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

impl Collector {
    pub fn new(o: Options, p: &Paths) -> Result<Self, ConfigError> {
        Ok(Collector { dir: p.sys("class/infiniband"), filter: o.filter, buf: Vec::with_capacity(4096) })
    }

    /// Reads a whole file as text.
    fn read_all(&mut self, path: &Path) -> io::Result<String> {
        crate::io::read_into(path, &mut self.buf)?;
        Ok(String::from_utf8_lossy(&self.buf).into_owned())
    }

    /// Reads a sysfs attribute as procfs does: its first 128 bytes, trimmed.
    fn read_attr(&mut self, path: &Path) -> io::Result<String> {
        crate::io::read_into(path, &mut self.buf)?;
        self.buf.truncate(128);
        Ok(String::from_utf8_lossy(&self.buf).trim().to_string())
    }

    /// An optional attribute: absent is empty.
    fn optional(&mut self, path: &Path) -> Result<String, Error> {
        match self.read_attr(path) {
            Ok(v) => Ok(v),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    fn device(&mut self, name: &str) -> Result<Device, Error> {
        let path = self.dir.join(name);
        let fw = path.join("fw_ver");
        let firmware_version = self.read_attr(&fw).map_err(|e| Error::from_read(&fw, e))?;
        let board_id = self.optional(&path.join("board_id"))?;
        let hca_type = self.optional(&path.join("hca_type"))?;
        self.optional(&path.join("node_guid"))?;
        let mut ports = BTreeMap::new();
        for (port, _) in list(&path.join("ports"))? {
            let num = crate::parse::parse_u64(port.as_bytes())
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Error::parse(&path.join("ports"), format!("failed to convert {port:?} into uint")))?;
            let p = self.port(&path.join("ports").join(&port))?;
            ports.insert(num, p);
        }
        Ok(Device { name: name.to_string(), board_id, firmware_version, hca_type, ports })
    }

    fn port(&mut self, path: &Path) -> Result<Port, Error> {
        let mut text = |file: &str| -> Result<(PathBuf, String), Error> {
            let p = path.join(file);
            let t = self.read_all(&p).map_err(|e| Error::from_read(&p, e))?;
            Ok((p, t))
        };
        text("link_layer")?;
        let (p, t) = text("state")?;
        let state = parse_state(&t).map_err(|m| Error::parse(&p, m))?;
        let (p, t) = text("phys_state")?;
        let phys_state = parse_state(&t).map_err(|m| Error::parse(&p, m))?;
        let (p, t) = text("rate")?;
        let rate = parse_rate(&t).map_err(|m| Error::parse(&p, m))?;
        let mut port = Port { state, phys_state, rate, counters: [None; N] };
        let counters = path.join("counters");
        if counters.metadata().is_ok() {
            self.counters(list(&counters)?, Dir::Counters, &mut port.counters)?;
            match list(&path.join("counters_ext")) {
                Ok(entries) => self.counters(entries, Dir::CountersExt, &mut port.counters)?,
                Err(e) if e.is_no_data() => {}
                Err(e) => return Err(e),
            }
        }
        let hw = path.join("hw_counters");
        if hw.metadata().is_ok() {
            self.counters(list(&hw)?, Dir::HwCounters, &mut port.counters)?;
        }
        Ok(port)
    }

    /// Reads every regular file of a counter directory (as procfs does,
    /// also those it does not export) and keeps the known ones.
    fn counters(&mut self, entries: Vec<(String, std::fs::DirEntry)>, kind: Dir, out: &mut [Option<u64>; N]) -> Result<(), Error> {
        for (file, entry) in entries {
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let path = entry.path();
            let value = match self.read_attr(&path) {
                Ok(v) => v,
                Err(e) if skippable(&e, kind) => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            let Some(i) = counter_index(kind, &file) else { continue };
            match crate::parse::parse_go_uint(&value) {
                Some(v) => out[i] = Some(if COUNTERS[i].conv == Conv::Lanes { v.wrapping_mul(4) } else { v }),
                // Drivers without a performance management agent.
                None if value.contains("N/A (no PMA)") => {}
                None => return Err(Error::parse(&path, format!("invalid counter value {value:?}"))),
            }
        }
        Ok(())
    }
}

fn write(sink: &mut Sink, d: &Device) {
    sink.family("node_infiniband_info", "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.", Kind::Gauge).sample(
        &[("board_id", &d.board_id), ("device", &d.name), ("firmware_version", &d.firmware_version), ("hca_type", &d.hca_type)],
        1.0,
    );
    let mut num = itoa::Buffer::new();
    for (n, p) in &d.ports {
        let labels = [("device", d.name.as_str()), ("port", num.format(*n))];
        sink.family(
            "node_infiniband_state_id",
            "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
            Kind::Gauge,
        )
        .sample(&labels, p.state as f64);
        sink.family(
            "node_infiniband_physical_state_id",
            "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, 5: link up, 6: link error recover, 7: phytest)",
            Kind::Gauge,
        )
        .sample(&labels, p.phys_state as f64);
        sink.family("node_infiniband_rate_bytes_per_second", "Maximum signal transfer rate", Kind::Gauge).sample(&labels, p.rate as f64);
        for (c, v) in COUNTERS.iter().zip(&p.counters) {
            let Some(v) = *v else { continue };
            let (kind, v) = match c.conv {
                Conv::Millis => (Kind::Gauge, v / 1000),
                _ => (Kind::Counter, v),
            };
            sink.family(c.family, c.help, kind).sample(&labels, v as f64);
        }
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let names = list(&self.dir).inspect_err(|e| {
            if e.is_no_data() {
                tracing::debug!("infiniband statistics not found, skipping");
            }
        })?;
        // Every device is read, filtered ones too (node_exporter's procfs
        // reads the whole class first); a missing file anywhere is no data.
        let mut devices = Vec::with_capacity(names.len());
        for (name, _) in names {
            devices.push(self.device(&name)?);
        }
        for d in devices.iter().filter(|d| !self.filter.ignored(&d.name)) {
            write(sink, d);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Collector as _;

    #[test]
    fn states_and_rates() {
        assert_eq!(parse_state("4: ACTIVE\n"), Ok(4));
        assert_eq!(parse_state("5: LinkUp"), Ok(5));
        for bad in ["ACTIVE", "4: ACTIVE: x", "x: ACTIVE", "-1: DOWN", "4294967296: X", ""] {
            assert!(parse_state(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_rate("40 Gb/sec (4X QDR)\n"), Ok(5_000_000_000));
        assert_eq!(parse_rate("10 Gb/sec (4X)"), Ok(1_250_000_000));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Ok(312_500_000));
        assert_eq!(parse_rate("56 Gb/sec (4X FDR)"), Ok(7_000_000_000));
        for bad in ["40", "fast Gb/sec", " 40 Gb/sec", "1e39 Gb/sec", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn counter_table() {
        assert_eq!(COUNTERS.len(), 60);
        let mut names: Vec<_> = COUNTERS.iter().map(|c| c.family).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COUNTERS.len(), "one family per file");
        assert!(COUNTERS
            .iter()
            .all(|c| c.family.starts_with("node_infiniband_") && (c.family.ends_with("_total") == (c.conv != Conv::Millis))));
        assert_eq!(counter_index(Dir::Counters, "VL15_dropped").map(|i| COUNTERS[i].family), Some("node_infiniband_vl15_dropped_total"));
        assert_eq!(counter_index(Dir::CountersExt, "port_rcv_data"), None);
    }

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A slice of node_exporter's fixture: mlx4_0 port 1 (counters and
    /// counters_ext) and i40iw0 (no PMA), plus an mlx5 port with hw_counters.
    fn fixture(root: &Path) {
        let d = "class/infiniband/mlx4_0";
        put(root, &format!("{d}/board_id"), "SM_1141000001000\n");
        put(root, &format!("{d}/fw_ver"), "2.31.5050\n");
        put(root, &format!("{d}/hca_type"), "MT4099\n");
        let p = format!("{d}/ports/1");
        put(root, &format!("{p}/link_layer"), "InfiniBand\n");
        put(root, &format!("{p}/state"), "4: ACTIVE\n");
        put(root, &format!("{p}/phys_state"), "5: LinkUp\n");
        put(root, &format!("{p}/rate"), "40 Gb/sec (4X QDR)\n");
        put(root, &format!("{p}/counters/port_rcv_data"), "4631917\n");
        put(root, &format!("{p}/counters/port_xmit_wait"), "4294967295\n");
        put(root, &format!("{p}/counters/port_rcv_packets"), "6825908347\n");
        put(root, &format!("{p}/counters/not_known"), "whatever\n");
        put(root, &format!("{p}/counters_ext/port_xmit_data_64"), "3733440\n");
        put(root, &format!("{p}/counters_ext/port_unicast_rcv_packets"), "61148\n");
        let d = "class/infiniband/i40iw0";
        put(root, &format!("{d}/board_id"), "I40IW Board ID\n");
        put(root, &format!("{d}/fw_ver"), "0.2\n");
        put(root, &format!("{d}/hca_type"), "I40IW\n");
        let p = format!("{d}/ports/1");
        put(root, &format!("{p}/link_layer"), "InfiniBand\n");
        put(root, &format!("{p}/state"), "4: ACTIVE\n");
        put(root, &format!("{p}/phys_state"), "5: LinkUp\n");
        put(root, &format!("{p}/rate"), "10 Gb/sec (4X)\n");
        put(root, &format!("{p}/counters/port_rcv_data"), "N/A (no PMA)\n");
        put(root, &format!("{p}/counters/symbol_error"), "N/A (no PMA)\n");
        let d = "class/infiniband/mlx5_0";
        put(root, &format!("{d}/fw_ver"), "16.35.1012\n");
        let p = format!("{d}/ports/1");
        put(root, &format!("{p}/link_layer"), "Ethernet\n");
        put(root, &format!("{p}/state"), "4: ACTIVE\n");
        put(root, &format!("{p}/phys_state"), "5: LinkUp\n");
        put(root, &format!("{p}/rate"), "25 Gb/sec (1X EDR)\n");
        put(root, &format!("{p}/hw_counters/lifespan"), "10500\n");
        put(root, &format!("{p}/hw_counters/out_of_buffer"), "7\n");
        // counters_ext is read only with counters, as in procfs.
        put(root, &format!("{p}/counters_ext/port_xmit_data_64"), "1\n");
    }

    fn paths(sys: &Path) -> Paths {
        Paths { procfs: "/nonexistent".into(), sysfs: sys.into(), rootfs: "/".into(), udev_data: "/nonexistent".into() }
    }

    /// (family, kind, labels, value) of every sample.
    type Out = Vec<(String, Kind, Vec<(String, String)>, f64)>;

    fn scrape(root: &Path, filter: DeviceFilter) -> Result<Out, Error> {
        let mut c = Collector::new(Options { filter }, &paths(root)).unwrap();
        let mut sink = Sink::new();
        c.update(&mut sink)?;
        let mut out = Vec::new();
        for f in sink.families() {
            for (l, v) in f.samples() {
                out.push((f.name().to_string(), f.kind(), l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), v));
            }
        }
        Ok(out)
    }

    fn find(out: &Out, name: &str, dev: &str) -> Vec<f64> {
        out.iter().filter(|s| s.0 == name && s.2.iter().any(|(k, v)| k == "device" && v == dev)).map(|s| s.3).collect()
    }

    #[test]
    fn reads_the_class() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let out = scrape(dir.path(), DeviceFilter::default()).unwrap();
        let info: Vec<_> = out.iter().filter(|s| s.0 == "node_infiniband_info").map(|s| s.2.clone()).collect();
        assert_eq!(info.len(), 3);
        let l = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert!(info.contains(&l(&[("board_id", ""), ("device", "mlx5_0"), ("firmware_version", "16.35.1012"), ("hca_type", "")])));
        assert_eq!(find(&out, "node_infiniband_port_data_received_bytes_total", "mlx4_0"), [18527668.0], "four lanes");
        assert_eq!(find(&out, "node_infiniband_legacy_data_transmitted_bytes_total", "mlx4_0"), [14933760.0]);
        assert_eq!(find(&out, "node_infiniband_port_packets_received_total", "mlx4_0"), [6825908347.0]);
        assert_eq!(find(&out, "node_infiniband_port_transmit_wait_total", "mlx4_0"), [4294967295.0]);
        assert_eq!(find(&out, "node_infiniband_rate_bytes_per_second", "mlx4_0"), [5e9]);
        assert_eq!(find(&out, "node_infiniband_state_id", "i40iw0"), [4.0]);
        assert_eq!(find(&out, "node_infiniband_physical_state_id", "i40iw0"), [5.0]);
        assert!(find(&out, "node_infiniband_port_data_received_bytes_total", "i40iw0").is_empty(), "N/A (no PMA)");
        assert!(find(&out, "node_infiniband_symbol_error_total", "i40iw0").is_empty());
        assert_eq!(find(&out, "node_infiniband_lifespan_seconds", "mlx5_0"), [10.0]);
        assert_eq!(find(&out, "node_infiniband_out_of_buffer_drops_total", "mlx5_0"), [7.0]);
        assert!(find(&out, "node_infiniband_legacy_data_transmitted_bytes_total", "mlx5_0").is_empty());
        let lifespan = out.iter().find(|s| s.0 == "node_infiniband_lifespan_seconds").unwrap();
        assert_eq!(lifespan.1, Kind::Gauge);
        assert_eq!(lifespan.2, l(&[("device", "mlx5_0"), ("port", "1")]));
        assert!(out.iter().all(|s| s.1 != Kind::Counter || s.0.ends_with("_total")));
    }

    #[test]
    fn filters_devices() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let f = DeviceFilter::new(Some(regex::Regex::new("^mlx").unwrap()), None);
        let out = scrape(dir.path(), f).unwrap();
        assert!(out.iter().all(|s| s.2.iter().any(|(k, v)| k == "device" && v == "i40iw0")));
        assert!(!out.is_empty());
    }

    #[test]
    fn missing_files_are_no_data_and_bad_values_fail() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scrape(dir.path(), DeviceFilter::default()).unwrap_err().is_no_data(), "no class directory");
        fixture(dir.path());
        let ex = DeviceFilter::new(Some(regex::Regex::new("mlx4").unwrap()), None);
        std::fs::remove_file(dir.path().join("class/infiniband/mlx4_0/fw_ver")).unwrap();
        assert!(scrape(dir.path(), ex.clone()).unwrap_err().is_no_data(), "no fw_ver, even on an excluded device");
        put(dir.path(), "class/infiniband/mlx4_0/fw_ver", "1\n");
        put(dir.path(), "class/infiniband/mlx4_0/ports/1/state", "ACTIVE\n");
        assert!(matches!(scrape(dir.path(), ex).unwrap_err(), Error::Parse { .. }));
        put(dir.path(), "class/infiniband/mlx4_0/ports/1/state", "4: ACTIVE\n");
        put(dir.path(), "class/infiniband/mlx4_0/ports/1/counters/link_downed", "lots\n");
        assert!(matches!(scrape(dir.path(), DeviceFilter::default()).unwrap_err(), Error::Parse { .. }));
        std::fs::remove_file(dir.path().join("class/infiniband/mlx4_0/ports/1/counters/link_downed")).unwrap();
        put(dir.path(), "class/infiniband/mlx4_0/ports/x/state", "4: ACTIVE\n");
        assert!(matches!(scrape(dir.path(), DeviceFilter::default()).unwrap_err(), Error::Parse { .. }), "a port that is no number");
        std::fs::remove_dir_all(dir.path().join("class/infiniband/mlx4_0/ports/x")).unwrap();
        std::fs::remove_file(dir.path().join("class/infiniband/mlx4_0/ports/1/link_layer")).unwrap();
        assert!(scrape(dir.path(), DeviceFilter::default()).unwrap_err().is_no_data());
    }
}
