//! `ebpf_skb_drops`: packets dropped, counted per CPU by drop reason on the
//! raw kfree_skb tracepoint (and per socket cgroup for pods); where
//! kfree_skb passes no reason (Linux < 5.17), every drop in slot `UNKNOWN`.

use core::arch::asm;

use agent_common::pods::{self as pod_words, SKB as PODS_SKB};
use agent_common::skb_drops::{DropCounts, Offsets, NO_ARG, OTHER, UNKNOWN};
use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
    EbpfContext, Global,
};

use crate::helpers::read_kernel;
use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static SKB_DROPS_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static SKB_DROPS: PerCpuArray<DropCounts> = PerCpuArray::with_max_entries(1, 0);

/// Raw tracepoint argument `i`, for an index known at load time (the
/// global is read-only, so the verifier follows only the arm taken). Each
/// arm is its own load at a constant offset: written as Rust, LLVM merges
/// the arms into one load at a computed offset, a context access the
/// verifier refuses ("dereference of modified ctx ptr").
#[inline(always)]
fn arg(ctx: &RawTracePointContext, i: u32) -> Option<u64> {
    let p = ctx.as_ptr();
    let v: u64;
    macro_rules! load {
        ($off:literal) => {
            // SAFETY: reads one u64 of the raw tracepoint's argument array,
            // at a constant offset the verifier checks against the
            // tracepoint's argument count; no memory is written.
            unsafe { asm!(concat!("{v} = *(u64 *)({p} + ", $off, ")"), v = out(reg) v, p = in(reg) p, options(readonly, nostack)) }
        };
    }
    match i {
        0 => load!(0),
        1 => load!(8),
        2 => load!(16),
        3 => load!(24),
        _ => return None,
    }
    Some(v)
}

fn try_kfree_skb(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason
    // reason, struct sock *rx_sk) on Linux 6.18, (skb, location) before
    // 5.17; the indices come from BTF.
    let off = SKB_DROPS_OFFSETS.load();
    let slot = if off.reason_arg == NO_ARG {
        UNKNOWN as usize
    } else {
        let reason = arg(ctx, off.reason_arg).ok_or(0)? as u32;
        if reason < OTHER {
            reason as usize
        } else {
            OTHER as usize
        }
    };
    if let Some(c) = SKB_DROPS.get_ptr_mut(0) {
        // SAFETY: this CPU's value, written only by this CPU with
        // preemption off; `slot` is bounds-checked by `get_mut`.
        unsafe {
            if let Some(n) = (*c).reasons.get_mut(slot) {
                *n += 1;
            }
        }
    }
    // The receiving socket where the stack found one, else the socket the
    // packet belongs to (sent packets), which carries its creator's cgroup.
    let pod = pods::offsets();
    if pod.events & PODS_SKB != 0 {
        let mut sk = if off.rx_sk_arg != NO_ARG { arg(ctx, off.rx_sk_arg).unwrap_or(0) } else { 0 };
        if sk == 0 {
            let skb = arg(ctx, off.skb_arg).ok_or(0)?;
            sk = read_kernel(skb, off.skb_sk).ok_or(0)?;
        }
        let cgroup: u64 = read_kernel(sk, pod.sock_cgroup).ok_or(0)?;
        if let Some(id) = pods::cgroup_id(cgroup, &pod) {
            pods::add(id, pod_words::SKB_DROPS, 1);
        }
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn skb_kfree_skb(ctx: RawTracePointContext) -> i32 {
    let _ = try_kfree_skb(&ctx);
    0
}
