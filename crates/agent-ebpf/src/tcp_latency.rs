//! `ebpf_tcp_latency`: on the raw inet_sock_set_state tracepoint, TCP
//! connects timed from SYN_SENT to ESTABLISHED, connects that failed
//! (SYN_SENT to CLOSE), and the smoothed RTT sampled when a connection is
//! established (either side) and when it leaves ESTABLISHED.

use agent_common::tcp_latency::{
    Offsets, CONNECT, DROPPED, FAILED, IPPROTO_TCP, MAX_IN_FLIGHT, NUM_COUNTERS, NUM_HISTS, RTT, TCP_CLOSE, TCP_ESTABLISHED, TCP_SYN_RECV,
    TCP_SYN_SENT,
};
use agent_common::NativeHist;
use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::RawTracePointContext,
    Global,
};

use agent_common::pods::{self as pod_words, TCP_CONN as PODS_TCP_CONN};

use crate::helpers::{inc, now_ns, read_kernel, record_native, BPF_F_NO_PREALLOC};
use crate::pods;

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static TCP_LAT_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static TCP_LAT_HISTS: PerCpuArray<NativeHist> = PerCpuArray::with_max_entries(NUM_HISTS, 0);
#[map]
static TCP_LAT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NUM_COUNTERS, 0);
/// Connects in flight, by socket. Entries never leak: a socket leaves
/// SYN_SENT for ESTABLISHED or CLOSE, and both remove it. Not
/// preallocated: its memory follows the connects in flight.
#[map]
static TCP_CONNECT_STARTS: HashMap<u64, u64> = HashMap::with_max_entries(MAX_IN_FLIGHT, BPF_F_NO_PREALLOC);

#[inline(always)]
fn record(hist: u32, ns: u64) {
    if let Some(h) = TCP_LAT_HISTS.get_ptr_mut(hist) {
        record_native(h, ns);
    }
}

/// Adds `v` to word `field` of the socket's cgroup, with attribution on.
/// The socket carries the cgroup of the task that created it (state
/// changes mostly run in softirq, in no task's context).
#[inline(always)]
fn pod_add(sk: u64, field: usize, v: u64) {
    let pod = pods::offsets();
    if pod.events & PODS_TCP_CONN == 0 {
        return;
    }
    let Some(cgroup) = read_kernel::<u64>(sk, pod.sock_cgroup) else { return };
    if let Some(id) = pods::cgroup_id(cgroup, &pod) {
        pods::add(id, field, v);
    }
}

/// Records the socket's smoothed RTT, when it has one.
#[inline(always)]
fn rtt_sample(sk: u64, off: &Offsets) {
    let srtt: u32 = read_kernel(sk, off.srtt_us).unwrap_or(0);
    // srtt_us holds the smoothed RTT in µs, times 8.
    if srtt != 0 {
        let ns = (srtt >> 3) as u64 * 1000;
        record(RTT, ns);
        pod_add(sk, pod_words::TCP_RTT_NS, ns);
        pod_add(sk, pod_words::TCP_RTT_SAMPLES, 1);
    }
}

fn try_set_state(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)
    let sk: u64 = ctx.arg(0);
    let old = ctx.arg::<u64>(1) as i32;
    let new = ctx.arg::<u64>(2) as i32;
    let off = TCP_LAT_OFFSETS.load();
    let proto: u16 = read_kernel(sk, off.sk_protocol).ok_or(0)?;
    if proto != IPPROTO_TCP {
        return Ok(());
    }
    if new == TCP_SYN_SENT {
        if TCP_CONNECT_STARTS.insert(sk, now_ns(), 0).is_err() {
            inc(&TCP_LAT_COUNTERS, DROPPED);
        }
        return Ok(());
    }
    if old == TCP_SYN_SENT {
        // SAFETY: the value is copied out before the entry is removed.
        let start = unsafe { TCP_CONNECT_STARTS.get(sk) }.copied();
        let _ = TCP_CONNECT_STARTS.remove(sk);
        if new == TCP_ESTABLISHED {
            if let Some(t) = start {
                record(CONNECT, now_ns().saturating_sub(t));
            }
            rtt_sample(sk, &off);
        } else if new == TCP_CLOSE {
            inc(&TCP_LAT_COUNTERS, FAILED);
            pod_add(sk, pod_words::TCP_CONNECT_FAILURES, 1);
        }
        return Ok(());
    }
    if (old == TCP_SYN_RECV && new == TCP_ESTABLISHED) || old == TCP_ESTABLISHED {
        rtt_sample(sk, &off);
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn tcp_set_state(ctx: RawTracePointContext) -> i32 {
    let _ = try_set_state(&ctx);
    0
}
