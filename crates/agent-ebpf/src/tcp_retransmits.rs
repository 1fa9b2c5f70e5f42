//! `ebpf_tcp_retransmits`: TCP segments retransmitted, by address family
//! (and per socket cgroup for pods).

use agent_common::pods::{self as pod_words, TCP as PODS_TCP};
use agent_common::tcp_retransmits::{Offsets, COUNTERS, V4, V6};
use aya_ebpf::{
    macros::{map, raw_tracepoint, tracepoint},
    maps::PerCpuArray,
    programs::{RawTracePointContext, TracePointContext},
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
    let family: u16 = if off.family != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        unsafe { ctx.read_at(off.family as usize)? }
    } else {
        // No `family` field (Linux 5.10): the socket's own, by its BTF
        // offset (a field is never at offset 0, the common header's).
        // SAFETY: the offset comes from this tracepoint's format file.
        let sk: u64 = unsafe { ctx.read_at(off.skaddr as usize)? };
        read_kernel(sk, off.sk_family).ok_or(0)?
    };
    // Count retransmits that went out, as RetransSegs does.
    if off.err != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        let err: i32 = unsafe { ctx.read_at(off.err as usize)? };
        if err != 0 {
            return Ok(());
        }
    }
    let pod = pods::offsets();
    let sk: u64 = if pod.events & PODS_TCP != 0 {
        // SAFETY: the offset comes from this tracepoint's format file.
        unsafe { ctx.read_at(off.skaddr as usize)? }
    } else {
        0
    };
    count(family, sk);
    Ok(())
}

/// Counts a retransmit of `family` and, with attribution on, for the
/// socket's cgroup.
#[inline(always)]
fn count(family: u16, sk: u64) {
    match family {
        2 => inc(&TCP_RETRANSMITS, V4),
        10 => inc(&TCP_RETRANSMITS, V6),
        _ => {}
    }
    // Retransmits mostly run from timers, in no task's context: the socket
    // carries the cgroup of the task that created it.
    let pod = pods::offsets();
    if pod.events & PODS_TCP != 0 {
        let Some(cgroup) = read_kernel::<u64>(sk, pod.sock_cgroup) else { return };
        if let Some(id) = pods::cgroup_id(cgroup, &pod) {
            pods::add(id, pod_words::TCP_RETRANSMITS, 1);
        }
    }
}

fn try_tcp_retransmit_raw(ctx: &RawTracePointContext) -> Result<(), i32> {
    let off = TCP_OFFSETS.load();
    let sk: u64 = ctx.arg(0);
    // Count retransmits that went out, as RetransSegs does.
    if off.raw_err != 0 && ctx.arg::<u64>(2) as i32 != 0 {
        return Ok(());
    }
    let family: u16 = read_kernel(sk, off.sk_family).ok_or(0)?;
    count(family, sk);
    Ok(())
}

#[raw_tracepoint(tracepoint = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_tcp_retransmit_raw(&ctx);
    0
}

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let _ = try_tcp_retransmit(&ctx);
    0
}
