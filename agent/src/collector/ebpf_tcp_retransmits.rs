//! `ebpf_tcp_retransmits`: TCP segment retransmits counted in the kernel
//! (tcp:tcp_retransmit_skb), by address family.

use agent_common::{CNT_TCP_RETRANS_V4, CNT_TCP_RETRANS_V6};

use super::ebpf_process::{Counter, CounterProbe};
use super::{BuildContext, Paths};
use crate::ebpf::Hook;

const PROGRAMS: [(&str, Hook); 1] = [("tcp_retransmit_skb", Hook::TracePoint("tcp", "tcp_retransmit_skb"))];
const HELP: &str = "TCP segments retransmitted (tcp:tcp_retransmit_skb).";

const COUNTERS: &[Counter<'static>] = &[
    (CNT_TCP_RETRANS_V4, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv4")]),
    (CNT_TCP_RETRANS_V6, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv6")]),
];

/// The collector: the shared counter probe with this module's programs.
pub fn new(_p: &Paths, ctx: &mut BuildContext) -> CounterProbe {
    CounterProbe::new(ctx, &PROGRAMS, COUNTERS)
}
