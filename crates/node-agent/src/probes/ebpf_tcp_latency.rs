//! `ebpf_tcp_latency`: TCP connect latency (SYN_SENT to ESTABLISHED) and
//! smoothed round-trip time, as native histograms (schema 3, ≤ 9.05 %
//! relative error per bucket), and failed connects (SYN_SENT to CLOSE:
//! refused, timed out, reset, or closed before it completed), from one
//! program on the raw inet_sock_set_state tracepoint.
//!
//! The RTT is the kernel's smoothed RTT of the socket (`tcp_sock.srtt_us`),
//! sampled when a connection is established (on either side: the
//! handshake's RTT) and when it leaves ESTABLISHED (the smoothed RTT over
//! its life). Cardinality: two histograms and one counter, unlabelled.
//! The offsets the program reads come from the kernel's BTF; without BTF,
//! or on a kernel whose tracepoint passes other arguments or whose
//! `sk_protocol` is a bitfield (Linux < 5.6), the program is down.

use agent_common::tcp_latency::{Offsets, CONNECT, COUNTERS, DROPPED, FAILED, HISTS, OFFSETS, PROGRAMS, RTT};
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::maps::{self, MapError, NativeSum};
use crate::ebpf::{Globals, Probe};

/// The offsets, from the kernel's BTF.
pub fn globals(k: &Kernel, _ctx: &mut Context, g: &mut Globals) {
    g.set(OFFSETS, &k.tcp_latency().unwrap_or(Offsets::DEFAULT));
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub struct Collector {
    probe: Probe,
    connect: NativeSum,
    rtt: NativeSum,
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let k = Kernel::get();
    let probe = match k.tcp_latency() {
        Ok(_) if !k.at_least(5, 6) => ctx.down(&PROGRAMS, "sock.sk_protocol is a bitfield before Linux 5.6"),
        Ok(_) => ctx.attach(&PROGRAMS),
        Err(why) => ctx.down(&PROGRAMS, why),
    };
    Ok(Box::new(Collector { probe, connect: NativeSum::default(), rtt: NativeSum::default() }))
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        let (failed, dropped) = {
            let ebpf = shared.lock().ok_or(MapError::Poisoned)?;
            maps::sum_native(&maps::native_histogram(&ebpf, HISTS, CONNECT)?, &mut self.connect);
            maps::sum_native(&maps::native_histogram(&ebpf, HISTS, RTT)?, &mut self.rtt);
            (maps::counter(&ebpf, COUNTERS, FAILED)?, maps::counter(&ebpf, COUNTERS, DROPPED)?)
        };
        self.connect.write(
            &mut sink.family(
                "node_ebpf_tcp_connect_latency_seconds",
                "Time TCP connects took from SYN sent to established (native buckets of schema 3).",
                Kind::Histogram,
            ),
            &[],
        );
        self.rtt.write(
            &mut sink.family(
                "node_ebpf_tcp_rtt_seconds",
                "Smoothed round-trip time of TCP connections, sampled when established and when they leave ESTABLISHED (native buckets of schema 3).",
                Kind::Histogram,
            ),
            &[],
        );
        sink.family(
            "node_ebpf_tcp_connect_failures_total",
            "TCP connects that went from SYN sent to closed (refused, timed out, reset).",
            Kind::Counter,
        )
        .sample(&[], failed as f64);
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "tcp_latency")], dropped as f64);
        Ok(())
    }
}
