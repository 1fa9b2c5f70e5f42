//! `ebpf_tcp_retransmits`: TCP segments retransmitted, by address family
//! (and per socket cgroup for pods).

use agent_common::pods::{self as pod_words, TCP as PODS_TCP};
use agent_common::tcp_retransmits::{Offsets, COUNTERS, V4, V6};
use aya_ebpf::{
    macros::{map, tracepoint},
    maps::PerCpuArray,
    programs::TracePointContext,
    Global,
};

use crate::helpers::{inc, read_kernel};
use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static TCP_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static TCP_RETRANSMITS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

fn try_tcp_retransmit(ctx: &TracePointContext) -> Result<(), i32> {
    let off = TCP_OFFSETS.load();
    // SAFETY: the offset comes from this tracepoint's format file.
    let family: u16 = unsafe { ctx.read_at(off.family as usize)? };
    // Count retransmits that went out, as RetransSegs does.
    if off.err != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        let err: i32 = unsafe { ctx.read_at(off.err as usize)? };
        if err != 0 {
            return Ok(());
        }
    }
    match family {
        2 => inc(&TCP_RETRANSMITS, V4),
        10 => inc(&TCP_RETRANSMITS, V6),
        _ => {}
    }
    // Retransmits mostly run from timers, in no task's context: the socket
    // carries the cgroup of the task that created it.
    let pod = pods::offsets();
    if pod.events & PODS_TCP != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        let sk: u64 = unsafe { ctx.read_at(off.skaddr as usize)? };
        let cgroup: u64 = read_kernel(sk, pod.sock_cgroup).ok_or(0)?;
        if let Some(id) = pods::cgroup_id(cgroup, &pod) {
            pods::add(id, pod_words::TCP_RETRANSMITS, 1);
        }
    }
    Ok(())
}

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_retransmit(&ctx);
    0
}
