//! `ebpf_tcp_retransmits`: TCP segment retransmits counted in the kernel
//! (tcp:tcp_retransmit_skb), by address family.

use agent_common::tcp_retransmits::{Offsets, OFFSETS, PROGRAMS, RAW_PROGRAMS, RETRANSMITS, V4, V6};
use clap::Arg;
use host::flags::Flags;
use host::{Collector, ConfigError, Paths};

use super::counters::{Counter, CounterProbe};
use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::Globals;

const HELP: &str = "TCP segments retransmitted (tcp:tcp_retransmit_skb).";

const COUNTERS: &[Counter] = &[
    (V4, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv4")]),
    (V6, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv6")]),
];

/// tcp_retransmit_skb's `family`, `err` (Linux >= 6.17) and `skaddr`
/// (classic), and the socket's family offset (raw, and classic where the
/// tracepoint has no `family`: Linux 5.10 has none, and the program reads
/// it from the socket).
pub fn globals(k: &Kernel, _ctx: &mut Context, g: &mut Globals) {
    let f = k.format("tcp", "tcp_retransmit_skb");
    let raw = k.retransmit_raw().ok();
    let sk_family = raw.or_else(|| if f.has("family") { None } else { k.sock_family().ok() });
    if raw.is_none() && !f.has("family") && sk_family.is_none() {
        tracing::warn!(
            "tcp_retransmit_skb has no family field and the kernel no BTF to read a socket's: retransmits are not counted by family"
        );
    }
    g.set(
        OFFSETS,
        &Offsets {
            family: f.offset("family"),
            err: f.offset("err"),
            skaddr: f.offset("skaddr"),
            sk_family: sk_family.unwrap_or(0),
            raw_err: u32::from(raw.is_some()),
        },
    );
}

/// The program for this kernel: raw where it can, classic otherwise.
pub fn programs(k: &Kernel) -> &'static [agent_common::Program] {
    if k.retransmit_raw().is_ok() {
        &RAW_PROGRAMS
    } else {
        &PROGRAMS
    }
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn Collector>, ConfigError> {
    Ok(Box::new(CounterProbe::new(ctx, programs(Kernel::get()), RETRANSMITS, COUNTERS)))
}
