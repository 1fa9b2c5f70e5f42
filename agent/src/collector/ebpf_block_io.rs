//! `ebpf_block_io`: block I/O latency from issue to completion, measured in
//! the kernel (block_rq_issue, block_rq_complete), per device and operation,
//! as `node_ebpf_block_io_latency_seconds{device,operation}`.

use std::collections::HashMap;
use std::path::PathBuf;

use agent_common::{BioKey, Hist, CNT_DROPPED_BIO, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE};
use aya::maps::PerCpuHashMap;

use super::{BuildContext, Error, Paths};
use crate::ebpf::{to_prometheus, Hook, Probe};
use crate::metrics::{Kind, Sink};

const PROGRAMS: [(&str, Hook); 2] = [
    ("block_rq_issue", Hook::TracePoint("block", "block_rq_issue")),
    ("block_rq_complete", Hook::TracePoint("block", "block_rq_complete")),
];

pub struct Collector {
    probe: Probe,
    sys_dev_block: PathBuf,
    names: HashMap<u32, String>,
}

impl Collector {
    pub fn new(p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), &PROGRAMS), sys_dev_block: p.sys("dev/block"), names: HashMap::new() }
    }

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

/// The collector.
pub fn new(p: &Paths, ctx: &mut BuildContext) -> Collector {
    Collector::new(p, ctx)
}

fn map_err(e: impl std::fmt::Display) -> Error {
    Error::parse(std::path::Path::new("bpf map BIO_HIST"), e.to_string())
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

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.shared.clone() else { return Ok(()) };
        if !self.probe.up() {
            return Ok(());
        }
        let (series, dropped) = {
            let ebpf = shared.lock().ok_or_else(|| map_err("eBPF state poisoned"))?;
            let map = ebpf.map("BIO_HIST").ok_or_else(|| map_err("missing"))?;
            let hists: PerCpuHashMap<_, BioKey, Hist> = PerCpuHashMap::try_from(map).map_err(map_err)?;
            let mut series = Vec::new();
            for item in hists.iter() {
                let (key, per_cpu) = item.map_err(map_err)?;
                series.push((key, to_prometheus(&per_cpu)));
            }
            (series, super::ebpf_process::read_counter(&ebpf, CNT_DROPPED_BIO)?)
        };
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
