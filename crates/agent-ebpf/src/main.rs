//! node-agent's eBPF programs, one module per probe: tracepoints, raw
//! tracepoints and (`dns`) cgroup socket-buffer and socket-address programs
//! that always let the packet or the call through; every event aggregated in the kernel (per-CPU arrays,
//! log2 histograms); nothing per event reaches user space. Entry points
//! wrap a `try_` function where they can fail; no panics. Field offsets come
//! from the agent (read from tracefs and the kernel's BTF) through each
//! probe's read-only global. Map, global and program names are the
//! constants of `agent-common`'s module of the same probe.

#![no_std]
#![no_main]
// Atomic adds: the bpf target has no compare-and-swap, so core::sync::atomic
// offers no fetch_add there, while the BPF instruction set has an atomic add.
#![feature(core_intrinsics)]
// Inline BPF assembly (skb_drops: one context load per argument index).
#![feature(asm_experimental_arch)]
#![allow(internal_features)]

mod block_io;
mod dns;
mod helpers;
mod oom_kills;
mod peer_maps;
mod pods;
mod process;
mod runqueue;
mod skb_drops;
mod syscall_latency;
mod syscalls;
mod tcp_latency;
mod tcp_peers;
mod tcp_retransmits;
#[cfg(feature = "test-programs")]
mod test_programs;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// `agent_common::LICENSE`, NUL-terminated (a `static` initialiser cannot
/// copy a `&str` into an array, so the bytes are spelled out; a test checks
/// them against the constant).
// SAFETY: the kernel reads the program's license from this section and
// symbol; nothing else is placed there.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
