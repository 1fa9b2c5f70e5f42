//! Latency histograms aggregated in the kernel.

/// Buckets of a log2 latency histogram. Bucket `i` counts values `v` (in
/// nanoseconds) with `2^(i-1) < v <= 2^i` (bucket 0: `v <= 1`); the last
/// bucket also takes everything larger, and is reported only as `+Inf`.
pub const HIST_BUCKETS: usize = 40;

/// A latency histogram, aggregated in the kernel (one per CPU in a per-CPU map).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Hist {
    pub buckets: [u64; HIST_BUCKETS],
    /// Sum of all values, in nanoseconds.
    pub sum_ns: u64,
    /// Number of values.
    pub count: u64,
}

impl Hist {
    pub const ZERO: Hist = Hist { buckets: [0; HIST_BUCKETS], sum_ns: 0, count: 0 };
}

crate::pod!(Hist);

/// The log2 bucket of `v` nanoseconds: the smallest `i` with `v <= 2^i`,
/// capped at the last bucket. Branch-bounded, no loops (verifier-friendly).
#[inline(always)]
pub fn log2_bucket(v: u64) -> usize {
    if v <= 1 {
        return 0;
    }
    // ceil(log2(v)) = floor(log2(v - 1)) + 1 for v >= 2.
    let mut x = v - 1;
    let mut r = 0usize;
    if x >= 1 << 32 {
        x >>= 32;
        r += 32;
    }
    if x >= 1 << 16 {
        x >>= 16;
        r += 16;
    }
    if x >= 1 << 8 {
        x >>= 8;
        r += 8;
    }
    if x >= 1 << 4 {
        x >>= 4;
        r += 4;
    }
    if x >= 1 << 2 {
        x >>= 2;
        r += 2;
    }
    if x >= 1 << 1 {
        r += 1;
    }
    let b = r + 1;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_first_with_v_le_bound() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 0);
        assert_eq!(log2_bucket(2), 1);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 2);
        assert_eq!(log2_bucket(5), 3);
        assert_eq!(log2_bucket(1024), 10);
        assert_eq!(log2_bucket(1025), 11);
        assert_eq!(log2_bucket(u64::MAX), HIST_BUCKETS - 1);
        for i in 1..HIST_BUCKETS - 1 {
            let bound = 1u64 << i;
            assert_eq!(log2_bucket(bound), i, "2^{i}");
            assert_eq!(log2_bucket(bound + 1), i + 1, "2^{i}+1");
        }
    }
}
