//! `ebpf_syscalls`: system calls and failed system calls per syscall,
//! counted in the kernel by one program on the sys_exit raw tracepoint
//! (exit and exit_group, which never return, are not counted).

use agent_common::syscalls::{Offsets, SyscallCounts, COUNTS, MAX_SYSCALLS, OFFSETS, PROGRAMS};
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::Flags;
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::{maps, syscall_names, Globals, Probe};

/// Where the syscall number is in `struct pt_regs`.
pub fn globals(k: &Kernel, _ctx: &mut Context, g: &mut Globals) {
    g.set(OFFSETS, &Offsets { regs_syscall_nr: k.regs_syscall_nr() });
}

pub struct Collector {
    probe: Probe,
    calls: Vec<u64>,
    errors: Vec<u64>,
}

pub fn args() -> Vec<Arg> {
    Vec::new()
}

pub fn build(_f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    Ok(Box::new(Collector { probe: ctx.attach(&PROGRAMS), calls: Vec::new(), errors: Vec::new() }))
}

/// The label of syscall slot `nr`: its name, `other` for the overflow slot.
fn label(nr: usize) -> &'static str {
    if nr == MAX_SYSCALLS as usize - 1 {
        return "other";
    }
    syscall_names::name(nr).unwrap_or("unknown")
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        {
            let ebpf = shared.lock().ok_or(maps::MapError::Poisoned)?;
            let per_cpu = maps::per_cpu_array::<SyscallCounts>(&ebpf, COUNTS)?
                .get(&0, 0)
                .map_err(|source| maps::MapError::Map { map: COUNTS, source })?;
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
