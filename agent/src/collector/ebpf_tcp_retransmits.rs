//! `ebpf_tcp_retransmits`: TCP segment retransmits counted in the kernel
//! (tcp:tcp_retransmit_skb), by address family.

use agent_common::{CNT_TCP_RETRANS_V4, CNT_TCP_RETRANS_V6};

use super::{BuildContext, Error, Paths};
use crate::ebpf::{Hook, Probe};
use crate::metrics::Sink;

const PROGRAMS: [(&str, Hook); 1] = [("tcp_retransmit_skb", Hook::TracePoint("tcp", "tcp_retransmit_skb"))];
const HELP: &str = "TCP segments retransmitted (tcp:tcp_retransmit_skb).";

pub struct Collector {
    probe: Probe,
}

impl Collector {
    pub fn new(_p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), &PROGRAMS) }
    }
}

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        super::ebpf_process::emit_counters(
            &self.probe,
            sink,
            &[
                (CNT_TCP_RETRANS_V4, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv4")]),
                (CNT_TCP_RETRANS_V6, "node_ebpf_tcp_retransmits_total", HELP, &[("family", "ipv6")]),
            ],
        )
    }
}
