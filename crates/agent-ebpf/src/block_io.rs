//! `ebpf_block_io`: block request latency from issue to completion, by
//! device and operation, keyed in flight by (device, sector).

use agent_common::block_io::{BioKey, BioReq, BioStart, Offsets, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE};
use agent_common::Hist;
use aya_ebpf::{
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
    Global,
};
use aya_log_ebpf::warn;

use crate::helpers::{inc, now_ns, record};

// SAFETY: the symbol name is unique in the object; user space finds the
// global by it (EbpfLoader::set_global) and nothing else defines it.
#[unsafe(no_mangle)]
static BLOCK_OFFSETS: Global<Offsets> = Global::new(Offsets::DEFAULT);

#[map]
static BIO_START: LruHashMap<BioReq, BioStart> = LruHashMap::with_max_entries(16384, 0);
#[map]
static BIO_HIST: PerCpuHashMap<BioKey, Hist> = PerCpuHashMap::with_max_entries(1024, 0);
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
    let delta = now_ns().saturating_sub(start.ts_ns);
    let key = BioKey { dev, op: start.op };
    let h = match BIO_HIST.get_ptr_mut(key) {
        Some(h) => h,
        None => {
            if BIO_HIST.insert(key, ZERO_HIST, 1 /* BPF_NOEXIST */).is_err() {
                // Another CPU may have created it meanwhile; otherwise the map is full.
                if BIO_HIST.get_ptr_mut(key).is_none() {
                    inc(&BIO_DROPPED, 0);
                    warn!(ctx, "block I/O histogram map full, dropping device {}", dev);
                    return Ok(());
                }
            }
            match BIO_HIST.get_ptr_mut(key) {
                Some(h) => h,
                None => return Ok(()),
            }
        }
    };
    record(h, delta);
    Ok(())
}

#[tracepoint(category = "block", name = "block_rq_complete")]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    let _ = try_rq_complete(&ctx);
    0
}
