//! `ebpf_block_io`: block I/O latency from issue to completion, measured in
//! the kernel (block_rq_issue, block_rq_complete), per device and operation,
//! as `node_ebpf_block_io_latency_seconds{device,operation}`.
//!
//! On the raw tracepoints where the kernel passes the request alone to
//! block_rq_issue (Linux >= 5.11) and has BTF: requests keyed by address,
//! exact. Otherwise on the classic tracepoints, keyed by (device, sector),
//! where a run the kernel skips (another BPF program running on that CPU,
//! e.g. an interrupt's completion during an issue) is counted in
//! `node_ebpf_program_misses_total`.

use std::collections::HashMap;
use std::path::PathBuf;

use agent_common::block_io::{
    BioKey, Offsets, DROPPED, HIST, OFFSETS, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE, PROGRAMS, RAW_PROGRAMS, RQ_START, START,
};
use agent_common::Hist;
use aya::maps::PerCpuHashMap;
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::maps::{self, MapError};
use crate::ebpf::{map_stats, Globals, Probe};

/// block_rq_issue's and block_rq_complete's `dev`, `sector` and `rwbs`
/// (classic), and the request members the raw programs read.
pub fn globals(k: &Kernel, ctx: &mut Context, g: &mut Globals) {
    let i = k.format("block", "block_rq_issue");
    let c = k.format("block", "block_rq_complete");
    let mut o = Offsets {
        rq_issue_dev: i.offset("dev"),
        rq_issue_sector: i.offset("sector"),
        rq_issue_rwbs: i.offset("rwbs"),
        rq_complete_dev: c.offset("dev"),
        rq_complete_sector: c.offset("sector"),
        rq_complete_rwbs: c.offset("rwbs"),
        ..Offsets::DEFAULT
    };
    // The requests in flight are at most the queues' depths: twice their
    // sum (a device added later is within the room), within [1024, the
    // object's 16384]; the variant not in use never writes its map.
    let entries = map_stats::sized(2 * map_stats::block_requests(&ctx.sysfs.join("block")), 1024, 16384);
    let (used, unused) = if k.block_raw().is_ok() { (RQ_START, START) } else { (START, RQ_START) };
    g.max_entries(used, entries);
    g.max_entries(unused, 1);
    if let Ok(r) = k.block_raw() {
        (o.rq_q, o.rq_cmd_flags, o.q_disk, o.disk_major, o.disk_first_minor) =
            (r.rq_q, r.rq_cmd_flags, r.q_disk, r.disk_major, r.disk_first_minor);
    }
    g.set(OFFSETS, &o);
}

/// The programs for this kernel: raw where it can, classic otherwise.
pub fn programs(k: &Kernel) -> &'static [agent_common::Program] {
    match k.block_raw() {
        Ok(_) => &RAW_PROGRAMS,
        Err(why) => {
            tracing::info!(reason = why, "block I/O latency on the classic tracepoints");
            &PROGRAMS
        }
    }
}

pub struct Collector {
    probe: Probe,
    sys_dev_block: PathBuf,
    names: HashMap<u32, String>,
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let programs = programs(Kernel::get());
    Ok(Box::new(Collector { probe: ctx.attach(programs), sys_dev_block: p.sys("dev/block"), names: HashMap::new() }))
}

impl Collector {
    /// The device name as node_disk_* labels it (from sysfs), else MAJ:MIN.
    fn device(&mut self, dev: u32) -> &str {
        let dir = &self.sys_dev_block;
        self.names.entry(dev).or_insert_with(|| {
            let (major, minor) = (dev >> 20, dev & 0xf_ffff);
            std::fs::read_to_string(dir.join(format!("{major}:{minor}/uevent")))
                .ok()
                .and_then(|u| u.lines().find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string)))
                .unwrap_or_else(|| format!("{major}:{minor}"))
        })
    }
}

fn op_label(op: u32) -> Option<&'static str> {
    match op {
        OP_READ => Some("read"),
        OP_WRITE => Some("write"),
        OP_FLUSH => Some("flush"),
        OP_DISCARD => Some("discard"),
        _ => None,
    }
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        let Some(shared) = self.probe.ebpf().cloned() else {
            self.probe.self_metrics(sink);
            return Ok(());
        };
        let read = || -> Result<_, MapError> {
            let ebpf = shared.lock().ok_or(MapError::Poisoned)?;
            let err = |source| MapError::Map { map: HIST, source };
            let map = ebpf.map(HIST).ok_or(MapError::Missing(HIST))?;
            let hists: PerCpuHashMap<_, BioKey, Hist> = PerCpuHashMap::try_from(map).map_err(err)?;
            let mut series = Vec::new();
            for item in hists.iter() {
                let (key, per_cpu) = item.map_err(err)?;
                series.push((key, maps::to_prometheus(&per_cpu)));
            }
            // Read whole: the maps' figures take this count, not a walk of their own.
            shared.note_entries(HIST, series.len());
            Ok((series, maps::counter(&ebpf, DROPPED, 0)?))
        };
        let read = read();
        self.probe.self_metrics(sink);
        let (series, dropped) = read?;
        for (key, (buckets, sum, count)) in series {
            let Some(op) = op_label(key.op) else { continue };
            let device = self.device(key.dev).to_string();
            sink.family("node_ebpf_block_io_latency_seconds", "Block I/O latency from issue to completion.", Kind::Histogram).histogram(
                &[("device", &device), ("operation", op)],
                sum,
                count,
                &buckets,
            );
        }
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "block_io")], dropped as f64);
        Ok(())
    }
}
