//! Reading the probes' maps: per-CPU counters and histograms, summed, and
//! the histograms in Prometheus form. Errors are typed and become the
//! collector's error (`node_scrape_collector_success 0`).

use agent_common::{Hist, HIST_BUCKETS};
use aya::maps::{PerCpuArray, PerCpuValues};
use aya::Ebpf;

/// Why a map could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("bpf map {0}: not in the object")]
    Missing(&'static str),
    #[error("bpf map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("eBPF state poisoned by an earlier panic")]
    Poisoned,
}

impl From<MapError> for host::Error {
    fn from(e: MapError) -> Self {
        host::Error::Other(Box::new(e))
    }
}

/// A per-CPU array of `T`, looked up by name.
pub fn per_cpu_array<'a, T: aya::Pod>(ebpf: &'a Ebpf, map: &'static str) -> Result<PerCpuArray<&'a aya::maps::MapData, T>, MapError> {
    let m = ebpf.map(map).ok_or(MapError::Missing(map))?;
    PerCpuArray::try_from(m).map_err(|source| MapError::Map { map, source })
}

/// Slot `index` of a per-CPU `u64` array, summed over CPUs.
pub fn counter(ebpf: &Ebpf, map: &'static str, index: u32) -> Result<u64, MapError> {
    let arr = per_cpu_array::<u64>(ebpf, map)?;
    let v = arr.get(&index, 0).map_err(|source| MapError::Map { map, source })?;
    Ok(v.iter().fold(0u64, |a, b| a.wrapping_add(*b)))
}

/// The one histogram of a one-entry per-CPU array, per CPU.
pub fn histogram(ebpf: &Ebpf, map: &'static str) -> Result<PerCpuValues<Hist>, MapError> {
    per_cpu_array::<Hist>(ebpf, map)?.get(&0, 0).map_err(|source| MapError::Map { map, source })
}

/// Histogram bounds exposed: `le` = 2^i ns for i in this range (1.024 µs to
/// about 275 s); smaller kernel buckets fold into the first.
pub const FIRST_BUCKET: usize = 10;

/// Sums per-CPU histograms and converts them to Prometheus form: cumulative
/// (le seconds, count) pairs, sum in seconds, count.
pub fn to_prometheus(per_cpu: &[Hist]) -> (Vec<(f64, u64)>, f64, u64) {
    let mut buckets = [0u64; HIST_BUCKETS];
    let (mut sum, mut count) = (0u64, 0u64);
    for h in per_cpu {
        for (b, v) in buckets.iter_mut().zip(h.buckets) {
            *b = b.wrapping_add(v);
        }
        sum = sum.wrapping_add(h.sum_ns);
        count = count.wrapping_add(h.count);
    }
    let mut out = Vec::with_capacity(HIST_BUCKETS - FIRST_BUCKET);
    let mut cum = 0u64;
    for (i, b) in buckets.iter().enumerate().take(HIST_BUCKETS - 1) {
        cum += b;
        if i >= FIRST_BUCKET {
            out.push(((1u64 << i) as f64 / 1e9, cum));
        }
    }
    (out, sum as f64 / 1e9, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_conversion() {
        let mut h = Hist::ZERO;
        h.buckets[0] = 1; // <= 1 ns
        h.buckets[11] = 2; // (1024, 2048] ns
        h.buckets[HIST_BUCKETS - 1] = 1; // overflow: only in +Inf
        h.sum_ns = 2_000_000_000;
        h.count = 4;
        let (b, sum, count) = to_prometheus(&[h, Hist::ZERO]);
        assert_eq!(b[0], (1024.0 / 1e9, 1));
        assert_eq!(b[1], (2048.0 / 1e9, 3));
        assert_eq!(b.last().map(|x| x.1), Some(3));
        assert_eq!((sum, count), (2.0, 4));
    }
}
