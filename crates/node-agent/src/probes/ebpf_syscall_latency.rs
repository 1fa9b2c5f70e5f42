//! `ebpf_syscall_latency`: how long system calls take, by syscall family,
//! measured in the kernel from the raw sys_enter to the raw sys_exit
//! tracepoint into per-CPU native histograms (Prometheus schema 3: 8
//! buckets per power of two, ≤ 9.05 % relative error per bucket, so a p99
//! read from them is within that), as `node_ebpf_syscall_latency_seconds`.
//!
//! The families are those of `ebpf::syscall_families` (the probe's
//! read-only global maps each syscall number of the running architecture to
//! one). Cardinality: 10 families; per family up to 513 native buckets
//! (only non-empty ones are exposed; in practice a few dozen) and the 24
//! classic buckets of [`CLASSIC_BOUNDS`] plus `+Inf` in the text formats.
//! exit and exit_group, which never return, are not timed.
//!
//! Per pod (with `ebpf_pods` on): syscalls slower than
//! `--collector.ebpf_syscall_latency.slow-threshold` are counted as
//! `node_ebpf_pod_slow_syscalls_total`.

use std::time::Duration;

use agent_common::syscall_latency::{CONFIG, DROPPED, FAMILIES, FAMILY_NAMES, HIST, MAX_IN_FLIGHT, PROGRAMS, START};
use clap::Arg;
use expo::{Kind, Sink};
use host::flags::{self, DurationFlag, Flags};
use host::{ConfigError, Paths};

use super::Context;
use crate::ebpf::kernel::Kernel;
use crate::ebpf::maps::{self, MapError, NativeSum};
use crate::ebpf::{map_stats, syscall_families, Globals, Probe};

pub const SLOW_THRESHOLD: DurationFlag = DurationFlag {
    name: "collector.ebpf_syscall_latency.slow-threshold",
    default: "100ms",
    help: "Syscalls taking at least this long count as slow for their pod (node_ebpf_pod_slow_syscalls_total, with ebpf_pods on); 0 counts none.",
};

/// Classic `le` bounds of the text formats (those of every native
/// histogram: exact, at powers of two of seconds).
pub const CLASSIC_BOUNDS: [f64; 24] = maps::NATIVE_CLASSIC_BOUNDS;

/// The family of every syscall number of this architecture.
pub fn globals(_k: &Kernel, ctx: &mut Context, g: &mut Globals) {
    g.set(FAMILIES, &syscall_families::native_table());
    g.max_entries(START, start_entries(map_stats::node_threads(&ctx.procfs)));
}

/// The entries of the map of syscalls in flight, for a node with `threads`
/// threads now: the map holds one entry per thread that made a timed
/// syscall, so four times the threads (room for the node's threads to
/// grow fourfold after start-up), within [8192, the object's 65536], a
/// power of two (the kernel rounds a hash map's buckets up to one, 16 bytes
/// each, allocated at creation even without preallocation: 1 MiB at 65536).
/// A thread beyond that is not timed, and its syscalls are counted in
/// `node_ebpf_events_dropped_total{probe="syscall_latency"}`.
pub fn start_entries(threads: u64) -> u32 {
    map_stats::sized(threads.saturating_mul(4).checked_next_power_of_two().unwrap_or(u64::MAX), 8192, MAX_IN_FLIGHT)
}

pub fn args() -> Vec<Arg> {
    flags::args(&[&SLOW_THRESHOLD])
}

pub struct Collector {
    probe: Probe,
    sums: Vec<NativeSum>,
}

pub fn build(f: &Flags, _p: &Paths, ctx: &mut Context) -> Result<Box<dyn host::Collector>, ConfigError> {
    let slow = SLOW_THRESHOLD.get(f)?;
    Ok(Box::new(Collector::new(ctx, slow)))
}

impl Collector {
    /// Attaches the programs and sets the slow threshold; a probe that
    /// cannot attach (or set it) is down, never fatal.
    pub fn new(ctx: &mut Context, slow: Duration) -> Collector {
        let shared = ctx.ebpf();
        let mut probe = Probe::attach(shared, &PROGRAMS);
        if let Some(s) = probe.ebpf() {
            if let Err(e) = set_threshold(s, slow) {
                tracing::warn!(err = %e, "ebpf_syscall_latency: slow-syscall threshold not set");
                probe = Probe::down(&PROGRAMS, &format!("setting the slow-syscall threshold: {e}"));
            }
        }
        let probe = ctx.claim(probe);
        Collector { probe, sums: vec![NativeSum::default(); FAMILY_NAMES.len()] }
    }
}

fn set_threshold(shared: &crate::ebpf::Shared, slow: Duration) -> Result<(), MapError> {
    let mut ebpf = shared.lock().ok_or(MapError::Poisoned)?;
    let map = ebpf.map_mut(CONFIG).ok_or(MapError::Missing(CONFIG))?;
    let mut config: aya::maps::Array<_, u64> = aya::maps::Array::try_from(map).map_err(|source| MapError::Map { map: CONFIG, source })?;
    let ns = u64::try_from(slow.as_nanos()).unwrap_or(u64::MAX);
    config.set(0, ns, 0).map_err(|source| MapError::Map { map: CONFIG, source })
}

impl host::Collector for Collector {
    fn update(&mut self, sink: &mut Sink) -> Result<(), host::Error> {
        self.probe.self_metrics(sink);
        let Some(shared) = self.probe.ebpf() else { return Ok(()) };
        let dropped = {
            let ebpf = shared.lock().ok_or(MapError::Poisoned)?;
            for (i, s) in self.sums.iter_mut().enumerate() {
                maps::sum_native(&maps::native_histogram(&ebpf, HIST, i as u32)?, s);
            }
            maps::counter(&ebpf, DROPPED, 0)?
        };
        write(sink, &self.sums);
        sink.family("node_ebpf_events_dropped_total", "Events an eBPF probe could not record (a full map).", Kind::Counter)
            .sample(&[("probe", "syscall_latency")], dropped as f64);
        Ok(())
    }
}

/// Writes the family's histograms, one per syscall family.
fn write(sink: &mut Sink, sums: &[NativeSum]) {
    let mut f = sink.family(
        "node_ebpf_syscall_latency_seconds",
        "Time system calls took from entry to exit, by syscall family (native buckets of schema 3).",
        Kind::Histogram,
    );
    for (name, s) in FAMILY_NAMES.iter().zip(sums) {
        s.write(&mut f, &[("family", name)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_map_is_four_times_the_threads_within_its_bounds() {
        assert_eq!(start_entries(0), 8192);
        assert_eq!(start_entries(290), 8192);
        assert_eq!(start_entries(3000), 16384);
        assert_eq!(start_entries(4096), 16384);
        assert_eq!(start_entries(4097), 32768);
        assert_eq!(start_entries(20_000), 65536);
        assert_eq!(start_entries(u64::MAX), 65536);
    }

    #[test]
    fn a_bad_slow_threshold_is_a_start_up_error_naming_the_flag() {
        let resolve = |v: &str| {
            let args = ["--collector.disable-defaults", "--collector.ebpf_syscall_latency", v];
            let m = crate::cmd::command().no_binary_name(true).try_get_matches_from(args).map_err(|e| e.to_string())?;
            crate::config::resolve(&m).map(|_| ()).map_err(|e| e.to_string())
        };
        for bad in ["--collector.ebpf_syscall_latency.slow-threshold=abc", "--collector.ebpf_syscall_latency.slow-threshold=-5ms"] {
            let e = resolve(bad).expect_err(bad);
            assert!(e.contains("collector.ebpf_syscall_latency.slow-threshold"), "{bad}: {e}");
        }
    }

    #[test]
    fn classic_bounds_are_powers_of_two_of_seconds() {
        for (i, b) in CLASSIC_BOUNDS.iter().enumerate() {
            assert_eq!(*b, (i as f64 - 20.0).exp2());
        }
        assert_eq!(maps::NATIVE_ZERO_THRESHOLD, (-30f64).exp2());
    }

    #[test]
    fn written_with_native_and_exact_classic_buckets() {
        use agent_common::{native_bucket, NativeHist};
        let mut h = NativeHist::ZERO;
        // 200 sleeps of about 1.05 ms, 3 reads of 1 µs, one of exactly 2^-10 s.
        h.buckets[native_bucket(1_050_000)] = 200;
        h.buckets[native_bucket(1_000)] = 3;
        h.buckets[native_bucket(976_562)] = 1; // 2^-10 s = 976562.5 ns: below
        (h.count, h.sum_ns) = (204, 200 * 1_050_000 + 3_000 + 976_562);
        let mut sums = vec![NativeSum::default(); FAMILY_NAMES.len()];
        maps::sum_native(&[h], &mut sums[8]);
        let mut sink = Sink::new();
        write(&mut sink, &sums);
        let fams = sink.families();
        let f = fams.iter().find(|f| f.name() == "node_ebpf_syscall_latency_seconds").expect("family");
        let natives: Vec<_> = f.natives().collect();
        assert_eq!(natives.len(), FAMILY_NAMES.len());
        let (n, buckets) = natives[8];
        assert_eq!(n.schema, 3);
        // 1.05 ms: ceil(8·log2(1.05e-3)) = ceil(-79.16) = -79; 1 µs: -159; 976562 ns: -80.
        assert_eq!(buckets, &[(-159, 3), (-80, 1), (-79, 200)]);
        let mut text = String::new();
        expo::encode(vec![sink], expo::Format::Text, &mut text);
        assert!(text.contains("node_ebpf_syscall_latency_seconds_bucket{family=\"sleep\",le=\"0.0009765625\"} 4"), "{text}");
        assert!(text.contains("node_ebpf_syscall_latency_seconds_bucket{family=\"sleep\",le=\"0.001953125\"} 204"), "{text}");
        assert!(text.contains("node_ebpf_syscall_latency_seconds_count{family=\"sleep\"} 204"), "{text}");
        assert!(text.contains("node_ebpf_syscall_latency_seconds_count{family=\"read\"} 0"), "{text}");
    }
}
