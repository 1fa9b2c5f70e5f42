//! `tcpstat`: the TCP sockets of the agent's network namespace counted by
//! state, as node_exporter 1.12 reads them: an inet_diag dump
//! (`SOCK_DIAG_BY_FAMILY`, all of states 1–11, over NETLINK_SOCK_DIAG) for
//! IPv4 and, when `<procfs>/net/tcp6` exists, IPv6, built and decoded with
//! `netlink-packet-sock-diag`. Exported as one gauge family,
//! `node_tcp_connection_states{state}`: one sample per state seen
//! (`established`, `listen`, `time_wait`, …) plus `rx_queued_bytes` and
//! `tx_queued_bytes`, the sums of every socket's receive and send queue
//! (for a listener the kernel reports its accept queue and backlog there,
//! and node_exporter adds those as they are). No socket at all is no
//! sample and success, as in node_exporter; a failed dump fails the scrape.

use std::collections::BTreeMap;
use std::path::PathBuf;

use netlink_packet_sock_diag::{AF_INET, AF_INET6, IPPROTO_TCP};

use crate::netlink::Channel;
use crate::{Error, Paths};
use expo::{Kind, Sink};

const FAMILY: &str = "node_tcp_connection_states";
const HELP: &str = "Number of connection states.";

/// node_exporter's state mask, `TCPFAll` (bits 0–11: every state up to
/// TCP_CLOSING; the kernel adds NEW_SYN_RECV request sockets, reported as
/// SYN_RECV).
const TCPF_ALL: u32 = 0xFFF;

/// node_exporter's keys: the kernel's TCP states 1–11, then its two
/// queue sums. A socket in state 12 or 13 would land on a queue key, as it
/// does in node_exporter's map (the mask never asks for those states).
const RX_QUEUED: u8 = 12;
const TX_QUEUED: u8 = 13;

pub struct Collector {
    channel: Channel,
    tcp6: PathBuf,
}

impl Collector {
    pub fn new(p: &Paths) -> Self {
        Collector { channel: Channel::sock_diag(), tcp6: p.proc("net/tcp6") }
    }

    fn dump(&mut self, family: u8, counts: &mut Counts) -> Result<(), Error> {
        // node_exporter asks for INET_DIAG_INFO too but reads none of it;
        // the answer's header is all it counts.
        let name = if family == AF_INET6 { "inet_diag dump (tcp6)" } else { "inet_diag dump (tcp)" };
        for h in self.channel.inet_sockets(name, family, IPPROTO_TCP, TCPF_ALL)? {
            counts.add(h.state, h.recv_queue, h.send_queue);
        }
        Ok(())
    }
}

impl crate::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let mut counts = Counts::default();
        self.dump(AF_INET, &mut counts)?;
        // node_exporter: "if enabled ipv6 system".
        if std::fs::metadata(&self.tcp6).is_ok() {
            self.dump(AF_INET6, &mut counts)?;
        }
        let samples = counts.samples();
        if !samples.is_empty() {
            let mut f = sink.family(FAMILY, HELP, Kind::Gauge);
            for (state, v) in samples {
                f.sample(&[("state", state)], v);
            }
        }
        Ok(())
    }
}

/// node_exporter's `map[tcpConnectionState]float64`: a key exists once a
/// socket added to it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Counts(BTreeMap<u8, f64>);

impl Counts {
    /// One socket: its state counted, its queues added to the two sums.
    pub fn add(&mut self, state: u8, recv_queue: u32, send_queue: u32) {
        *self.0.entry(TX_QUEUED).or_default() += f64::from(send_queue);
        *self.0.entry(RX_QUEUED).or_default() += f64::from(recv_queue);
        *self.0.entry(state).or_default() += 1.0;
    }

    /// The samples, by label value as client_golang sorts them. States
    /// node_exporter has no name for share its `unknown` label.
    pub fn samples(&self) -> Vec<(&'static str, f64)> {
        let mut out: Vec<(&'static str, f64)> = Vec::with_capacity(self.0.len());
        for (&state, &v) in &self.0 {
            let label = state_name(state);
            match out.iter_mut().find(|(l, _)| *l == label) {
                Some((_, sum)) => *sum += v,
                None => out.push((label, v)),
            }
        }
        out.sort_by(|a, b| a.0.cmp(b.0));
        out
    }
}

/// node_exporter's label of a state key.
pub fn state_name(state: u8) -> &'static str {
    match state {
        1 => "established",
        2 => "syn_sent",
        3 => "syn_recv",
        4 => "fin_wait1",
        5 => "fin_wait2",
        6 => "time_wait",
        7 => "close",
        8 => "close_wait",
        9 => "last_ack",
        10 => "listen",
        11 => "closing",
        RX_QUEUED => "rx_queued_bytes",
        TX_QUEUED => "tx_queued_bytes",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_states_and_sums_queues_as_node_exporter() {
        let mut c = Counts::default();
        assert!(c.samples().is_empty(), "no socket, no sample");
        c.add(10, 0, 128); // listener: accept queue 0, backlog 128
        c.add(10, 1, 4096);
        c.add(1, 100, 0);
        c.add(1, 0, 5000);
        c.add(6, 0, 0);
        c.add(99, 0, 0);
        c.add(0, 0, 0);
        assert_eq!(
            c.samples(),
            vec![
                ("established", 2.0),
                ("listen", 2.0),
                ("rx_queued_bytes", 101.0),
                ("time_wait", 1.0),
                ("tx_queued_bytes", 9224.0),
                ("unknown", 2.0),
            ]
        );
        // A state 12 socket lands on node_exporter's rx_queued_bytes key.
        let mut c = Counts::default();
        c.add(12, 5, 0);
        assert_eq!(c.samples(), vec![("rx_queued_bytes", 6.0), ("tx_queued_bytes", 0.0)]);
    }

    #[test]
    fn state_names() {
        let names: Vec<&str> = (1..=13).map(state_name).collect();
        assert_eq!(
            names,
            [
                "established",
                "syn_sent",
                "syn_recv",
                "fin_wait1",
                "fin_wait2",
                "time_wait",
                "close",
                "close_wait",
                "last_ack",
                "listen",
                "closing",
                "rx_queued_bytes",
                "tx_queued_bytes"
            ]
        );
        assert_eq!(state_name(0), "unknown");
        assert_eq!(state_name(14), "unknown");
    }

    /// This host's own sockets (the dump needs no privilege).
    #[test]
    fn dumps_this_hosts_tcp_sockets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let paths = crate::Paths { procfs: "/proc".into(), sysfs: "/sys".into(), rootfs: "/".into(), udev_data: "/run/udev/data".into() };
        let mut c = Collector::new(&paths);
        let mut sink = Sink::new();
        crate::Collector::update(&mut c, &mut sink).unwrap();
        let fams = sink.families();
        let f = fams.iter().find(|f| f.name() == FAMILY).expect("family");
        let listen = f.samples().find(|(l, _)| l == &vec![("state", "listen")]).map(|(_, v)| v).unwrap_or(0.0);
        assert!(listen >= 1.0);
        drop(l);
    }
}
