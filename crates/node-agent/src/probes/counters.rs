//! A probe whose programs only add to slots of a per-CPU counter array
//! (process churn, OOM kills, TCP retransmits): attach, then read each slot
//! into its counter family.

use agent_common::Program;
use expo::{Kind, Sink};

use super::Context;
use crate::ebpf::{maps, Probe};

/// A counter: map slot, family, help, labels.
pub type Counter = (u32, &'static str, &'static str, &'static [(&'static str, &'static str)]);

pub struct CounterProbe {
    probe: Probe,
    map: &'static str,
    counters: &'static [Counter],
}

impl CounterProbe {
    /// Attaches `programs`, whose counters are the slots of `map`.
    pub fn new(ctx: &mut Context, programs: &[Program], map: &'static str, counters: &'static [Counter]) -> Self {
        CounterProbe { probe: ctx.attach(programs), map, counters }
    }
}

impl host::Collector for CounterProbe {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        let ebpf = shared.lock().ok_or(maps::MapError::Poisoned)?;
        for (index, name, help, labels) in self.counters {
            let v = maps::counter(&ebpf, self.map, *index)?;
            sink.family(name, help, Kind::Counter).sample(labels, v as f64);
        }
        Ok(())
    }
}
