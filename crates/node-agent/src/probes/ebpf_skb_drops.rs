//! `ebpf_skb_drops`: packets the kernel dropped, by drop reason, counted in
//! the kernel by one program on the raw kfree_skb tracepoint, as
//! `node_ebpf_skb_drops_total{reason}`.
//!
//! The reason names are the kernel's own, read once from its BTF (`enum
//! skb_drop_reason`, the `SKB_DROP_REASON_` prefix stripped), never compiled
//! in; so are the positions of kfree_skb's arguments. Reason values of 255
//! and above (subsystem-coded reasons, whose high 16 bits name a subsystem
//! such as mac80211 or openvswitch) and values the enum does not name count
//! under `reason="OTHER"`. Only reasons seen so far are exported: at most
//! one series per member of the enum, plus `OTHER`. Packets freed after use
//! go to consume_skb, another tracepoint, and are not counted. Where
//! kfree_skb passes no reason (Linux < 5.17), every drop counts under
//! `reason="unknown"`, the only series. A kernel with no BTF reports the
//! program down.

use agent_common::skb_drops::{DropCounts, Offsets, COUNTS, MAX_REASONS, NO_ARG, OFFSETS, OTHER, PROGRAMS, UNKNOWN};
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::{DropReasons, Kernel};
use crate::ebpf::{maps, Globals, Probe};

const FAMILY: &str = "node_ebpf_skb_drops_total";
const HELP: &str = "Packets the kernel dropped, by drop reason (skb:kfree_skb; reason names from the kernel's enum skb_drop_reason; unknown where the kernel passes none, before Linux 5.17).";
/// The label of reason values >= 255 and of values the kernel does not name.
pub const OTHER_LABEL: &str = "OTHER";
/// The label of every drop where kfree_skb passes no reason (Linux < 5.17).
pub const UNKNOWN_LABEL: &str = "unknown";

/// kfree_skb's argument positions and `sk_buff.sk`, from the kernel's BTF.
pub fn globals(k: &Kernel, _ctx: &mut Context, g: &mut Globals) {
    let o = match k.drop_reasons() {
        Ok(d) => Offsets {
            reason_arg: d.reason_arg.unwrap_or(NO_ARG),
            skb_arg: d.skb_arg,
            rx_sk_arg: d.rx_sk_arg.unwrap_or(NO_ARG),
            skb_sk: d.skb_sk.unwrap_or(0),
        },
        Err(_) => Offsets::DEFAULT,
    };
    g.set(OFFSETS, &o);
}

pub struct Collector {
    probe: Probe,
    /// The label of each slot.
    labels: Vec<String>,
    counts: Vec<u64>,
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let (probe, labels) = match Kernel::get().drop_reasons() {
        Ok(d) => (ctx.attach(&PROGRAMS), labels(d)),
        Err(why) => (
            ctx.down(&PROGRAMS, why),
            labels(&DropReasons { reason_arg: Some(0), skb_arg: 0, rx_sk_arg: None, skb_sk: None, names: Vec::new() }),
        ),
    };
    Ok(Box::new(Collector { probe, labels, counts: Vec::new() }))
}

/// Slot labels: the enum's name for each value below `OTHER` (the first
/// name of a value wins), `OTHER` for the rest; where kfree_skb passes no
/// reason, `unknown` for the slot every drop counts in.
pub fn labels(d: &DropReasons) -> Vec<String> {
    let mut out: Vec<Option<String>> = vec![None; MAX_REASONS as usize];
    if d.reason_arg.is_none() {
        if let Some(slot) = out.get_mut(UNKNOWN as usize) {
            *slot = Some(UNKNOWN_LABEL.to_string());
        }
    }
    for (v, name) in &d.names {
        if let Some(slot) = out.get_mut(*v as usize).filter(|_| *v < OTHER as u64) {
            slot.get_or_insert_with(|| name.clone());
        }
    }
    out.into_iter().map(|l| l.unwrap_or_else(|| OTHER_LABEL.to_string())).collect()
}

/// (label, count) of the slots with drops, `OTHER` (summed) last.
pub fn series<'a>(labels: &'a [String], counts: &[u64]) -> Vec<(&'a str, u64)> {
    let mut other = 0u64;
    let mut out = Vec::new();
    for (label, &n) in labels.iter().zip(counts).filter(|(_, n)| **n != 0) {
        if label == OTHER_LABEL {
            other = other.wrapping_add(n);
        } else {
            out.push((label.as_str(), n));
        }
    }
    if other != 0 {
        out.push((OTHER_LABEL, other));
    }
    out
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        {
            let ebpf = shared.lock().ok_or(maps::MapError::Poisoned)?;
            let per_cpu = maps::per_cpu_array::<DropCounts>(&ebpf, COUNTS)?
                .get(&0, 0)
                .map_err(|source| maps::MapError::Map { map: COUNTS, source })?;
            self.counts.clear();
            self.counts.resize(MAX_REASONS as usize, 0);
            for c in per_cpu.iter() {
                for (t, v) in self.counts.iter_mut().zip(c.reasons) {
                    *t = t.wrapping_add(v);
                }
            }
        }
        let mut f = sink.family(FAMILY, HELP, Kind::Counter);
        for (reason, n) in series(&self.labels, &self.counts) {
            f.sample(&[("reason", reason)], n as f64);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_labelled_by_the_kernels_names_and_the_rest_is_other() {
        let d = DropReasons {
            reason_arg: Some(2),
            skb_arg: 0,
            rx_sk_arg: Some(3),
            skb_sk: Some(24),
            names: vec![
                (2, "NOT_SPECIFIED".into()),
                (3, "NO_SOCKET".into()),
                (3, "ALIAS".into()),
                (300, "BIG".into()),
                (0xffff_0000, "SUBSYS_MASK".into()),
            ],
        };
        let l = labels(&d);
        assert_eq!(l.len(), MAX_REASONS as usize);
        assert_eq!(
            (l[2].as_str(), l[3].as_str(), l[4].as_str(), l[OTHER as usize].as_str()),
            ("NOT_SPECIFIED", "NO_SOCKET", "OTHER", "OTHER")
        );
        let mut counts = vec![0u64; MAX_REASONS as usize];
        (counts[3], counts[4], counts[5], counts[OTHER as usize]) = (7, 1, 0, 2);
        assert_eq!(series(&l, &counts), [("NO_SOCKET", 7), ("OTHER", 3)]);
        assert!(series(&l, &[0; MAX_REASONS as usize]).is_empty(), "only reasons seen are exported");
    }

    #[test]
    fn without_reasons_every_drop_is_unknown() {
        let d = DropReasons { reason_arg: None, skb_arg: 0, rx_sk_arg: None, skb_sk: Some(24), names: Vec::new() };
        let l = labels(&d);
        let mut counts = vec![0u64; MAX_REASONS as usize];
        counts[UNKNOWN as usize] = 9;
        assert_eq!(series(&l, &counts), [("unknown", 9)]);
    }
}
