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

pub const PROGRAMS: [Program; 2] = [
    Program::tracepoint("block_rq_issue", "block", "block_rq_issue"),
    Program::tracepoint("block_rq_complete", "block", "block_rq_complete"),
];

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

/// Field offsets of block_rq_issue and block_rq_complete, from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    pub rq_issue_dev: u32,
    pub rq_issue_sector: u32,
    pub rq_issue_rwbs: u32,
    pub rq_complete_dev: u32,
    pub rq_complete_sector: u32,
    pub rq_complete_rwbs: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets =
        Offsets { rq_issue_dev: 0, rq_issue_sector: 0, rq_issue_rwbs: 0, rq_complete_dev: 0, rq_complete_sector: 0, rq_complete_rwbs: 0 };
}

crate::pod!(BioKey, BioReq, BioStart, Offsets);
