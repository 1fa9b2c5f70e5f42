//! `ebpf_block_io`: block request latency from issue to completion, by
//! device and operation, keyed in flight by (device, sector).

use agent_common::block_io::{BioKey, BioReq, BioStart, Offsets, RqStart, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE, REQ_OP_MASK};
use agent_common::Hist;
use aya_ebpf::{
    macros::{map, raw_tracepoint, tracepoint},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::{RawTracePointContext, TracePointContext},
    EbpfContext, Global,
};
use aya_log_ebpf::warn;

use crate::helpers::{inc, now_ns, read_kernel, record, BPF_F_NO_PREALLOC};

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static BLOCK_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static BIO_START: LruHashMap<BioReq, BioStart> = LruHashMap::with_max_entries(16384, 0);
/// Raw programs: issue times by request address. blk-mq preallocates a
/// queue's requests (one per tag), so the same few addresses come back
/// with every I/O: each has one entry, written in place when its request is
/// issued and marked done (`ts_ns` 0) when it completes, rather than
/// inserted and deleted per I/O (an insert takes an element from the free
/// list and links it under the bucket's lock, a delete unlinks and frees
/// it; a write after the lookup does neither, and the entries touched stay
/// as few as the requests). A request reissued after a requeue overwrites
/// its entry. LRU, so the requests of a removed device are the entries
/// reused when the map is full.
#[map]
static BIO_RQ_START: LruHashMap<u64, RqStart> = LruHashMap::with_max_entries(16384, 0);
/// Histograms by (device, operation): a handful of keys, each with a
/// histogram per CPU. Not preallocated: preallocated, the 1024 possible
/// keys cost 1024 histograms a CPU (0.3 MB a CPU, 20 MB on 64 CPUs).
#[map]
static BIO_HIST: PerCpuHashMap<BioKey, Hist> = PerCpuHashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);
#[map]
static BIO_DROPPED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A zeroed histogram in read-only data, used to create map entries.
static ZERO_HIST: Hist = Hist::ZERO;

/// The operation of a request from its `rwbs` string.
#[inline(always)]
pub fn rwbs_op(rwbs: [u8; 4]) -> Option<u32> {
    // A leading 'F' is REQ_PREFLUSH when an operation letter follows.
    let c = if rwbs[0] == b'F' && matches!(rwbs[1], b'R' | b'W' | b'D' | b'F' | b'N') { rwbs[1] } else { rwbs[0] };
    match c {
        b'R' => Some(OP_READ),
        b'W' => Some(OP_WRITE),
        b'F' => Some(OP_FLUSH),
        b'D' => Some(OP_DISCARD),
        _ => None,
    }
}

fn try_rq_issue(ctx: &TracePointContext) -> Result<(), i32> {
    let off = BLOCK_OFFSETS.load();
    // SAFETY: offsets come from this tracepoint's format file.
    let (dev, sector, rwbs) = unsafe {
        (
            ctx.read_at::<u32>(off.rq_issue_dev as usize)?,
            ctx.read_at::<u64>(off.rq_issue_sector as usize)?,
            ctx.read_at::<[u8; 4]>(off.rq_issue_rwbs as usize)?,
        )
    };
    let Some(op) = rwbs_op(rwbs) else { return Ok(()) };
    let key = BioReq { dev, _pad: 0, sector };
    if BIO_START.insert(key, BioStart { ts_ns: now_ns(), op, _pad: 0 }, 0).is_err() {
        inc(&BIO_DROPPED, 0);
    }
    Ok(())
}

#[tracepoint(category = "block", name = "block_rq_issue")]
pub fn block_rq_issue(ctx: TracePointContext) -> u32 {
    let _ = try_rq_issue(&ctx);
    0
}

fn try_rq_complete(ctx: &TracePointContext) -> Result<(), i32> {
    let off = BLOCK_OFFSETS.load();
    // SAFETY: offsets come from this tracepoint's format file.
    let (dev, sector) =
        unsafe { (ctx.read_at::<u32>(off.rq_complete_dev as usize)?, ctx.read_at::<u64>(off.rq_complete_sector as usize)?) };
    let req = BioReq { dev, _pad: 0, sector };
    // SAFETY: the value is copied out before the entry is removed.
    let Some(start) = (unsafe { BIO_START.get(req) }).copied() else { return Ok(()) };
    let _ = BIO_START.remove(req);
    record_latency(ctx, BioKey { dev, op: start.op }, now_ns().saturating_sub(start.ts_ns));
    Ok(())
}

/// Records `delta` ns into this CPU's histogram of `key`, creating it.
#[inline(always)]
fn record_latency<C: EbpfContext>(ctx: &C, key: BioKey, delta: u64) {
    let dev = key.dev;
    let h = match BIO_HIST.get_ptr_mut(key) {
        Some(h) => h,
        None => {
            if BIO_HIST.insert(key, ZERO_HIST, 1 /* BPF_NOEXIST */).is_err() {
                // Another CPU may have created it meanwhile; otherwise the map is full.
                if BIO_HIST.get_ptr_mut(key).is_none() {
                    inc(&BIO_DROPPED, 0);
                    warn!(ctx, "block I/O histogram map full, dropping device {}", dev);
                    return;
                }
            }
            match BIO_HIST.get_ptr_mut(key) {
                Some(h) => h,
                None => return,
            }
        }
    };
    record(h, delta);
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    let _ = try_rq_complete(&ctx);
    0
}

/// The operation of `request.cmd_flags`, among those counted.
#[inline(always)]
fn req_op(flags: u32) -> Option<u32> {
    match flags & REQ_OP_MASK {
        0 => Some(OP_READ),
        1 => Some(OP_WRITE),
        2 => Some(OP_FLUSH),
        3 => Some(OP_DISCARD),
        _ => None,
    }
}

fn try_rq_issue_raw(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(struct request *rq) since Linux 5.11.
    let rq: u64 = ctx.arg(0);
    let off = BLOCK_OFFSETS.load();
    let flags: u32 = read_kernel(rq, off.rq_cmd_flags).ok_or(0)?;
    let Some(op) = req_op(flags) else { return Ok(()) };
    // The whole disk's device number, as the classic tracepoint's `dev`:
    // MKDEV(disk->major, disk->first_minor).
    let q: u64 = read_kernel(rq, off.rq_q).ok_or(0)?;
    let disk: u64 = read_kernel(q, off.q_disk).ok_or(0)?;
    let major: u32 = read_kernel(disk, off.disk_major).ok_or(0)?;
    let minor: u32 = read_kernel(disk, off.disk_first_minor).ok_or(0)?;
    let start = RqStart { ts_ns: now_ns(), op, dev: (major << 20) | (minor & 0xf_ffff) };
    if let Some(s) = BIO_RQ_START.get_ptr_mut(rq) {
        // SAFETY: a live entry of the map; a request is issued and
        // completed one event at a time (the block layer orders them).
        unsafe { *s = start };
    } else if BIO_RQ_START.insert(rq, start, 0).is_err() {
        inc(&BIO_DROPPED, 0);
    }
    Ok(())
}

#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn block_rq_issue_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_rq_issue_raw(&ctx);
    0
}

fn try_rq_complete_raw(ctx: &RawTracePointContext) -> Result<(), i32> {
    // TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes)
    let rq: u64 = ctx.arg(0);
    let Some(s) = BIO_RQ_START.get_ptr_mut(rq) else { return Ok(()) };
    // SAFETY: a live entry of the map, read and marked done by the one
    // completion of the request it was issued for.
    let start = unsafe {
        let start = *s;
        (*s).ts_ns = 0;
        start
    };
    if start.ts_ns == 0 {
        // Not issued since it last completed.
        return Ok(());
    }
    record_latency(ctx, BioKey { dev: start.dev, op: start.op }, now_ns().saturating_sub(start.ts_ns));
    Ok(())
}

#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete_raw(ctx: RawTracePointContext) -> i32 {
    let _ = try_rq_complete_raw(&ctx);
    0
}
