//! `ebpf_pods`: kernel events counted per cgroup v2 id, named by pod in
//! user space. The run-queue, syscall, syscall-latency, TCP, TCP-latency and packet-drop programs add to these
//! counters too, when the bits of `Offsets::events` say so.

use crate::program::Program;

pub const OFFSETS: &str = "POD_OFFSETS";
/// `u64` cgroup id to `PodCounters`.
pub const STATS: &str = "POD_STATS";
/// Per-CPU `u64` (one entry): events whose cgroup found `POD_STATS` full.
pub const DROPPED: &str = "POD_DROPPED";

/// The OOM victim's cgroup (Linux >= 6.8 passes the task).
pub const OOM_VICTIM: Program = Program::raw("pod_oom_victim", "mark_victim");
/// Older kernels: the cgroup of the task that ran out of memory.
pub const OOM_CURRENT: Program = Program::tracepoint("pod_oom_current", "oom", "mark_victim");
/// Bytes of block requests, for the submitting task (Linux >= 6.5).
pub const BLOCK_PROGRAMS: [Program; 3] = [
    Program::tracepoint("pod_io_start", "block", "block_io_start"),
    Program::tracepoint("pod_bio_backmerge", "block", "block_bio_backmerge"),
    Program::tracepoint("pod_bio_frontmerge", "block", "block_bio_frontmerge"),
];

/// Cgroups tracked (entries of `POD_STATS`); user space deletes the
/// entries of cgroups that are gone.
pub const MAX_CGROUPS: u32 = 4096;

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
    /// Packets of the cgroup's sockets the kernel dropped (skb:kfree_skb).
    pub skb_drops: u64,
    /// Syscalls of the cgroup's tasks that took longer than the slow
    /// threshold (`--collector.ebpf_syscall_latency.slow-threshold`).
    pub slow_syscalls: u64,
    /// TCP connects of the cgroup's sockets that failed (SYN_SENT to
    /// CLOSE), and the smoothed RTT samples of its connections: their sum
    /// (ns) and number.
    pub tcp_connect_failures: u64,
    pub tcp_rtt_ns: u64,
    pub tcp_rtt_samples: u64,
}

impl PodCounters {
    pub const ZERO: PodCounters = PodCounters {
        runq_wait_ns: 0,
        runq_waits: 0,
        oom_kills: 0,
        tcp_retransmits: 0,
        read_bytes: 0,
        write_bytes: 0,
        syscall_errors: 0,
        skb_drops: 0,
        slow_syscalls: 0,
        tcp_connect_failures: 0,
        tcp_rtt_ns: 0,
        tcp_rtt_samples: 0,
    };
}

/// Word indices of `PodCounters` fields, as the programs add to them.
pub const RUNQ_WAIT_NS: usize = 0;
pub const RUNQ_WAITS: usize = 1;
pub const OOM_KILLS: usize = 2;
pub const TCP_RETRANSMITS: usize = 3;
pub const READ_BYTES: usize = 4;
pub const WRITE_BYTES: usize = 5;
pub const SYSCALL_ERRORS: usize = 6;
pub const SKB_DROPS: usize = 7;
pub const SLOW_SYSCALLS: usize = 8;
pub const TCP_CONNECT_FAILURES: usize = 9;
pub const TCP_RTT_NS: usize = 10;
pub const TCP_RTT_SAMPLES: usize = 11;

/// Bits of `Offsets::events`: which events the programs attribute.
pub const SYSCALLS: u32 = 1;
pub const RUNQ: u32 = 2;
pub const OOM: u32 = 4;
pub const TCP: u32 = 8;
pub const BLOCK: u32 = 16;
pub const SKB: u32 = 32;
/// Slow syscalls (counted by the ebpf_syscall_latency programs).
pub const SLOW: u32 = 64;
/// TCP connect failures and RTT samples (counted by the ebpf_tcp_latency
/// program), by socket cgroup.
pub const TCP_CONN: u32 = 128;
pub const ALL: u32 = SYSCALLS | RUNQ | OOM | TCP | BLOCK | SKB | SLOW | TCP_CONN;

/// What attribution needs: the events on, kernel structure offsets from
/// the kernel's BTF (task or socket to cgroup v2 id), and tracepoint
/// offsets from tracefs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// `SYSCALLS | RUNQ | ...` bits (0: off, and the programs skip every
    /// cgroup lookup).
    pub events: u32,
    /// task_struct.cgroups, css_set.dfl_cgrp, cgroup.kn, kernfs_node.id,
    /// sock.sk_cgrp_data.cgroup.
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub sock_cgroup: u32,
    /// block_io_start: `bytes`, `rwbs`.
    pub io_start_bytes: u32,
    pub io_start_rwbs: u32,
    /// block_bio_backmerge / block_bio_frontmerge: `nr_sector`, `rwbs`.
    pub bio_merge_nr_sector: u32,
    pub bio_merge_rwbs: u32,
}

impl Offsets {
    pub const DEFAULT: Offsets = Offsets {
        events: 0,
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        sock_cgroup: 0,
        io_start_bytes: 0,
        io_start_rwbs: 0,
        bio_merge_nr_sector: 0,
        bio_merge_rwbs: 0,
    };
}

crate::pod!(PodCounters, Offsets);
