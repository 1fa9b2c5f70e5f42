//! Types shared by the eBPF programs (`agent-ebpf`) and the agent: map keys
//! and values, all `#[repr(C)]` with explicit padding, and the constants that
//! fix map layouts. `no_std`; the `user` feature adds `aya::Pod`.

#![no_std]

/// Buckets of a log2 latency histogram. Bucket `i` counts values `v` (in
/// nanoseconds) with `2^(i-1) < v <= 2^i` (bucket 0: `v <= 1`); the last
/// bucket also takes everything larger, and is reported only as `+Inf`.
pub const HIST_BUCKETS: usize = 40;

/// A latency histogram, aggregated in the kernel (one per CPU in a per-CPU map).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Hist {
    pub buckets: [u64; HIST_BUCKETS],
    /// Sum of all values, in nanoseconds.
    pub sum_ns: u64,
    /// Number of values.
    pub count: u64,
}

impl Hist {
    pub const ZERO: Hist = Hist { buckets: [0; HIST_BUCKETS], sum_ns: 0, count: 0 };
}

/// The log2 bucket of `v` nanoseconds: the smallest `i` with `v <= 2^i`,
/// capped at the last bucket. Branch-bounded, no loops (verifier-friendly).
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    if v <= 1 {
        return 0;
    }
    // ceil(log2(v)) = floor(log2(v - 1)) + 1 for v >= 2.
    let mut x = v - 1;
    let mut r = 0usize;
    if x >= 1 << 32 {
        x >>= 32;
        r += 32;
    }
    if x >= 1 << 16 {
        x >>= 16;
        r += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        r += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        r += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        r += 2;
    }
    if x >= 1 << 1 {
        r += 1;
    }
    let b = r + 1;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Block I/O operations, as encoded in `BioKey::op`.
pub const OP_READ: u32 = 0;
pub const OP_WRITE: u32 = 1;
pub const OP_FLUSH: u32 = 2;
pub const OP_DISCARD: u32 = 3;
pub const OP_OTHER: u32 = 4;

/// Key of the block I/O latency histograms: device and operation.
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

/// Syscall numbers counted per syscall (larger numbers go to the last slot).
pub const MAX_SYSCALLS: u32 = 512;

/// Calls and failed calls per syscall number: one value of a one-entry
/// per-CPU array, so user space reads every counter in one lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallCounts {
    pub calls: [u64; MAX_SYSCALLS as usize],
    pub errors: [u64; MAX_SYSCALLS as usize],
}

/// Indices of the event counter array.
pub const CNT_TCP_RETRANS_V4: u32 = 0;
pub const CNT_TCP_RETRANS_V6: u32 = 1;
pub const CNT_OOM_KILLS: u32 = 2;
pub const CNT_EXECS: u32 = 3;
pub const CNT_FORKS: u32 = 4;
pub const CNT_EXITS: u32 = 5;
/// Events the programs could not record (a full map): must stay 0.
pub const CNT_DROPPED_RUNQ: u32 = 6;
pub const CNT_DROPPED_BIO: u32 = 7;
/// Pod attribution: events whose cgroup found `POD_STATS` full.
pub const CNT_DROPPED_POD: u32 = 8;
pub const COUNTERS: u32 = 9;

/// Cgroups tracked by pod attribution (entries of `POD_STATS`); user space
/// deletes the entries of cgroups that are gone.
pub const POD_MAX_CGROUPS: u32 = 4096;

/// Event counters of one cgroup (by cgroup v2 id), added to atomically by
/// every CPU: one entry of the `POD_STATS` hash map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounters {
    /// Time the cgroup's tasks waited on a run queue, and how many waits.
    pub runq_wait_ns: u64,
    pub runq_waits: u64,
    /// Tasks of the cgroup chosen by the OOM killer.
    pub oom_kills: u64,
    /// TCP segments retransmitted by the cgroup's sockets.
    pub tcp_retransmits: u64,
    /// Bytes of block requests submitted by the cgroup's tasks.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Syscalls of the cgroup's tasks that returned an error.
    pub syscall_errors: u64,
    pub _reserved: u64,
}

/// Word indices of `PodCounters` fields, as the programs add to them.
pub const POD_RUNQ_WAIT_NS: usize = 0;
pub const POD_RUNQ_WAITS: usize = 1;
pub const POD_OOM_KILLS: usize = 2;
pub const POD_TCP_RETRANSMITS: usize = 3;
pub const POD_READ_BYTES: usize = 4;
pub const POD_WRITE_BYTES: usize = 5;
pub const POD_SYSCALL_ERRORS: usize = 6;

/// Bits of `Offsets::pods`: which events the programs attribute to cgroups.
pub const PODS_SYSCALLS: u32 = 1;
pub const PODS_RUNQ: u32 = 2;
pub const PODS_OOM: u32 = 4;
pub const PODS_TCP: u32 = 8;
pub const PODS_BLOCK: u32 = 16;
pub const PODS_ALL: u32 = PODS_SYSCALLS | PODS_RUNQ | PODS_OOM | PODS_TCP | PODS_BLOCK;

/// Byte offsets of the tracepoint fields the programs read, taken by the
/// agent from tracefs `format` files and set as a read-only global before
/// loading, so no field layout is compiled in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Offsets {
    /// sched_wakeup / sched_wakeup_new: `pid`.
    pub wakeup_pid: u32,
    /// sched_switch: `prev_pid`, `prev_state`, `next_pid`.
    pub switch_prev_pid: u32,
    pub switch_prev_state: u32,
    pub switch_next_pid: u32,
    /// block_rq_issue / block_rq_complete: `dev`, `sector`, `rwbs`.
    pub rq_issue_dev: u32,
    pub rq_issue_sector: u32,
    pub rq_issue_rwbs: u32,
    pub rq_complete_dev: u32,
    pub rq_complete_sector: u32,
    pub rq_complete_rwbs: u32,
    /// tcp_retransmit_skb: `family`.
    pub tcp_family: u32,
    /// Bits of `prev_state` that mean "not runnable"; a switched-out task
    /// with none of them set (running, or preempted) is still on a run queue.
    pub switch_state_mask: u32,
    /// Offset of the syscall number in `struct pt_regs` (orig_ax / syscallno).
    pub regs_syscall_nr: u32,
    /// tcp_retransmit_skb: `err` (kernels >= 6.10 also trace failed
    /// retransmits); 0 when the field does not exist.
    pub tcp_err: u32,
    /// Pod attribution: `PODS_*` bits of the events attributed to cgroups
    /// (0: off, and the programs skip every cgroup lookup).
    pub pods: u32,
    /// Kernel structure offsets from the kernel's BTF, to go from a task or
    /// a socket to its cgroup v2 id: task_struct.cgroups, css_set.dfl_cgrp,
    /// cgroup.kn, kernfs_node.id, sock.sk_cgrp_data.cgroup.
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub sock_cgroup: u32,
    /// tcp_retransmit_skb: `skaddr`.
    pub tcp_skaddr: u32,
    /// block_io_start: `bytes`, `rwbs`.
    pub io_start_bytes: u32,
    pub io_start_rwbs: u32,
    /// block_bio_backmerge / block_bio_frontmerge: `nr_sector`, `rwbs`.
    pub bio_merge_nr_sector: u32,
    pub bio_merge_rwbs: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all these types are #[repr(C)], made only of integers, with
    // explicit padding fields, so every bit pattern is valid.
    unsafe impl aya::Pod for super::Hist {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BioKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BioReq {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BioStart {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Offsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SyscallCounts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PodCounters {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_first_with_v_le_bound() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(2), 1);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 2);
        assert_eq!(log2_bucket(5), 3);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(1025), 11);
        assert_eq!(log2_bucket(u64::MAX), HIST_BUCKETS - 1);
        for i in 1..HIST_BUCKETS - 1 {
            let bound = 1u64 << i;
            assert_eq!(log2_bucket(bound), i, "2^{i}");
            assert_eq!(log2_bucket(bound + 1), i + 1, "2^{i}+1");
        }
    }
}
