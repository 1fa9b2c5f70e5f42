//! `ebpf_syscalls`: system calls and failed system calls per syscall,
//! counted in the kernel by one program on the sys_exit raw tracepoint
//! (exit and exit_group, which never return, are not counted).

use agent_common::{SyscallCounts, MAX_SYSCALLS};
use aya::maps::PerCpuArray;

use super::{BuildContext, Error, Paths};
use crate::ebpf::{syscalls, Hook, Probe};
use crate::metrics::{Kind, Sink};

const PROGRAMS: [(&str, Hook); 1] = [("sys_exit", Hook::RawTracePoint("sys_exit"))];

pub struct Collector {
    probe: Probe,
    calls: Vec<u64>,
    errors: Vec<u64>,
}

impl Collector {
    pub fn new(_p: &Paths, ctx: &mut BuildContext) -> Self {
        Collector { probe: Probe::attach(ctx.ebpf(), &PROGRAMS), calls: Vec::new(), errors: Vec::new() }
    }
}

/// The collector.
pub fn new(p: &Paths, ctx: &mut BuildContext) -> Collector {
    Collector::new(p, ctx)
}

fn map_err(e: impl std::fmt::Display) -> Error {
    Error::parse(std::path::Path::new("bpf map SYSCALLS"), e.to_string())
}

/// The label of syscall slot `nr`: its name, `other` for the overflow slot.
fn label(nr: usize) -> &'static str {
    if nr == MAX_SYSCALLS as usize - 1 {
        return "other";
    }
    syscalls::name(nr).unwrap_or("unknown")
}

impl super::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), Error> {
        self.probe.self_metrics(sink);
        let (Some(shared), true) = (&self.probe.shared, self.probe.up()) else { return Ok(()) };
        {
            let ebpf = shared.lock().ok_or_else(|| map_err("eBPF state poisoned"))?;
            let map = ebpf.map("SYSCALLS").ok_or_else(|| map_err("missing"))?;
            let arr: PerCpuArray<_, SyscallCounts> = PerCpuArray::try_from(map).map_err(map_err)?;
            let per_cpu = arr.get(&0, 0).map_err(map_err)?;
            self.calls.clear();
            self.calls.resize(MAX_SYSCALLS as usize, 0);
            self.errors.clear();
            self.errors.resize(MAX_SYSCALLS as usize, 0);
            for c in per_cpu.iter() {
                for (t, v) in self.calls.iter_mut().zip(c.calls) {
                    *t = t.wrapping_add(v);
                }
                for (t, v) in self.errors.iter_mut().zip(c.errors) {
                    *t = t.wrapping_add(v);
                }
            }
        }
        // Unnamed numbers share one `unknown` series.
        let mut unknown = (0u64, 0u64);
        for nr in 0..MAX_SYSCALLS as usize {
            let (calls, errors) = (self.calls[nr], self.errors[nr]);
            if calls == 0 && errors == 0 {
                continue;
            }
            let name = label(nr);
            if name == "unknown" {
                unknown.0 += calls;
                unknown.1 += errors;
                continue;
            }
            sink.family("node_ebpf_syscalls_total", "System calls made, by syscall.", Kind::Counter)
                .sample(&[("syscall", name)], calls as f64);
            if errors > 0 {
                sink.family("node_ebpf_syscall_errors_total", "System calls that returned an error, by syscall.", Kind::Counter)
                    .sample(&[("syscall", name)], errors as f64);
            }
        }
        if unknown != (0, 0) {
            sink.family("node_ebpf_syscalls_total", "System calls made, by syscall.", Kind::Counter)
                .sample(&[("syscall", "unknown")], unknown.0 as f64);
            sink.family("node_ebpf_syscall_errors_total", "System calls that returned an error, by syscall.", Kind::Counter)
                .sample(&[("syscall", "unknown")], unknown.1 as f64);
        }
        Ok(())
    }
}
