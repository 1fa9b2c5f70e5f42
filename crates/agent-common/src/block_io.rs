//! `ebpf_block_io`: block request latency, issue to completion, by device
//! and operation.

use crate::program::Program;

pub const OFFSETS: &str = "BLOCK_OFFSETS";
/// In-flight requests: `BioReq` to `BioStart`.
pub const START: &str = "BIO_START";
/// Per-CPU `Hist` by `BioKey`.
pub const HIST: &str = "BIO_HIST";
/// Per-CPU `u64` (one entry): requests not recorded because a map was full.
pub const DROPPED: &str = "BIO_DROPPED";

/// In-flight requests of the raw programs: the `struct request *` to
/// `RqStart`.
pub const RQ_START: &str = "BIO_RQ_START";

/// The classic tracepoints (Linux < 5.11, or without BTF): requests keyed
/// by (device, sector).
pub const PROGRAMS: [Program; 2] = [
    Program::tracepoint("block_rq_issue", "block", "block_rq_issue"),
    Program::tracepoint("block_rq_complete", "block", "block_rq_complete"),
];
/// The raw tracepoints: requests keyed by their address, exact, and each
/// program guarded on its own (a classic tracepoint program is skipped
/// while any other runs on that CPU).
pub const RAW_PROGRAMS: [Program; 2] =
    [Program::raw("block_rq_issue_raw", "block_rq_issue"), Program::raw("block_rq_complete_raw", "block_rq_complete")];

/// Block I/O operations, as encoded in `BioKey::op`.
pub const OP_READ: u32 = 0;
pub const OP_WRITE: u32 = 1;
pub const OP_FLUSH: u32 = 2;
pub const OP_DISCARD: u32 = 3;
pub const OP_OTHER: u32 = 4;

/// Key of the latency histograms: device and operation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BioKey {
    /// Kernel-internal dev_t: major << 20 | minor.
    pub dev: u32,
    pub op: u32,
}

/// An in-flight block request, keyed by device and start sector.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BioReq {
    pub dev: u32,
    pub _pad: u32,
    pub sector: u64,
}

/// Issue time and operation of an in-flight block request.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BioStart {
    pub ts_ns: u64,
    pub op: u32,
    pub _pad: u32,
}

/// Issue time, operation and device of an in-flight request (raw programs).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RqStart {
    pub ts_ns: u64,
    pub op: u32,
    pub dev: u32,
}

/// Field offsets of block_rq_issue and block_rq_complete, from tracefs
/// (classic programs), and member offsets from the kernel's BTF (raw
/// programs: `request.q`, `request.cmd_flags`, `request_queue.disk`,
/// `gendisk.major`, `gendisk.first_minor`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub rq_issue_dev: u32,
    pub rq_issue_sector: u32,
    pub rq_issue_rwbs: u32,
    pub rq_complete_dev: u32,
    pub rq_complete_sector: u32,
    pub rq_complete_rwbs: u32,
    pub rq_q: u32,
    pub rq_cmd_flags: u32,
    pub q_disk: u32,
    pub disk_major: u32,
    pub disk_first_minor: u32,
    pub _pad: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets {
        rq_issue_dev: 0,
        rq_issue_sector: 0,
        rq_issue_rwbs: 0,
        rq_complete_dev: 0,
        rq_complete_sector: 0,
        rq_complete_rwbs: 0,
        rq_q: 0,
        rq_cmd_flags: 0,
        q_disk: 0,
        disk_major: 0,
        disk_first_minor: 0,
        _pad: 0,
    };
}

/// `REQ_OP_MASK` of `request.cmd_flags`; the operations below it are
/// `REQ_OP_READ` 0, `REQ_OP_WRITE` 1, `REQ_OP_FLUSH` 2, `REQ_OP_DISCARD` 3,
/// the same numbers as `OP_*`.
pub const REQ_OP_MASK: u32 = 0xff;

crate::pod!(BioKey, BioReq, BioStart, RqStart, Offsets);
