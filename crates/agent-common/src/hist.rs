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
    let r = floor_log2(v - 1) as usize;
    let b = r + 1;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Prometheus native-histogram schema of [`NativeHist`]: 2^3 = 8 buckets
/// per power of two, each at most 2^(1/8) - 1 ≈ 9.05 % wider than its lower
/// bound.
pub const NATIVE_SCHEMA: i8 = 3;

/// Slots of [`NativeHist::buckets`]: slot `p` is the native bucket of index
/// `p + NATIVE_OFFSET`, for every latency from 1 ns to `u64::MAX` ns (about
/// 584 years), so nothing overflows.
pub const NATIVE_SLOTS: usize = 513;

/// Native index of slot 0: the bucket (2^-30 s, 2^(-239/8) s], holding 1 ns.
pub const NATIVE_OFFSET: i32 = -239;

/// The thresholds of [`native_bucket`]: `floor(2^((j + f)/8) · 2^63)` for
/// `j` in 0..8, `f = frac(8·log2(1e9)) ≈ 0.178822832`. A normalised
/// mantissa (an integer `m · 2^63`, `1 <= m < 2`) is above the real
/// threshold exactly when it is above its floor, since the thresholds are
/// irrational but for the last, `1e9 · 2^34`, which is exact (the bucket
/// boundaries at powers of two of seconds).
pub const NATIVE_THRESHOLDS: [u64; 8] = [
    9_367_390_095_664_785_123,
    10_215_211_334_214_395_865,
    11_139_766_950_770_582_417,
    12_148_001_999_904_198_769,
    13_247_490_117_328_543_392,
    14_446_490_411_353_358_019,
    15_754_009_503_455_335_899,
    17_179_869_184_000_000_000,
];

/// A latency histogram in Prometheus native buckets of [`NATIVE_SCHEMA`],
/// aggregated in the kernel (one per CPU and syscall family).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NativeHist {
    /// Latencies of 0 ns (the zero bucket; its threshold is 2^-30 s).
    pub zero: u64,
    /// Slot `p`: latencies in native bucket `p + NATIVE_OFFSET`.
    pub buckets: [u64; NATIVE_SLOTS],
    /// Sum of all latencies, in nanoseconds.
    pub sum_ns: u64,
    /// Number of latencies (the zero bucket's included).
    pub count: u64,
}

impl NativeHist {
    pub const ZERO: NativeHist = NativeHist { zero: 0, buckets: [0; NATIVE_SLOTS], sum_ns: 0, count: 0 };
}

crate::pod!(NativeHist);

/// `floor(log2(v))` for `v >= 1` (0 for 0). Branch-bounded, no loops.
#[inline(always)]
pub fn floor_log2(v: u64) -> u32 {
    let mut x = v;
    let mut r = 0u32;
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
    r
}

/// The slot of [`NativeHist::buckets`] for `ns` nanoseconds (`ns >= 1`;
/// 0 ns goes to [`NativeHist::zero`]): the native index
/// `ceil(8·log2(ns·1e-9))` minus [`NATIVE_OFFSET`], exactly.
///
/// With `ns = 2^k · m` (`1 <= m < 2`), `8·log2(ns·1e-9) = 8k - 239 - f +
/// 8·log2(m)`, so the index is `8k - 239 + c` with `c = ceil(8·log2(m) - f)`,
/// the number of `j` in 0..8 with `m > 2^((j+f)/8)`: eight comparisons of
/// the mantissa, shifted to the top of a u64, with [`NATIVE_THRESHOLDS`].
/// The slot is `8k + c`, in 0..=512. No loops, no floats, no division.
#[inline(always)]
pub fn native_bucket(ns: u64) -> usize {
    let k = floor_log2(ns);
    // ns >= 1: bit k is set, so the shifted value has its top bit set.
    let m = ns << (63 - (k & 63));
    let t = &NATIVE_THRESHOLDS;
    let c = (m > t[0]) as usize
        + (m > t[1]) as usize
        + (m > t[2]) as usize
        + (m > t[3]) as usize
        + (m > t[4]) as usize
        + (m > t[5]) as usize
        + (m > t[6]) as usize
        + (m > t[7]) as usize;
    8 * k as usize + c
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

    extern crate std;
    use std::vec::Vec;

    /// The native index of `ns` from its definition, in f64.
    fn reference(ns: u64) -> i32 {
        (8.0 * (ns as f64 * 1e-9).log2()).ceil() as i32
    }

    /// Bucket `i`'s upper bound in ns, `2^(i/8)·1e9`, as precisely as f64
    /// allows: whole powers of two times `2^(q/8)` (exact up to an ulp).
    fn upper_ns(i: i32) -> f64 {
        let (p, q) = (i.div_euclid(8), i.rem_euclid(8));
        1e9 * (p as f64).exp2() * (q as f64 / 8.0).exp2()
    }

    /// The index by the precise boundaries: `upper(j-1) < ns <= upper(j)`.
    fn precise(ns: u64) -> i32 {
        let mut j = reference(ns);
        while ns as f64 > upper_ns(j) {
            j += 1;
        }
        while ns as f64 <= upper_ns(j - 1) {
            j -= 1;
        }
        j
    }

    fn index(ns: u64) -> i32 {
        native_bucket(ns) as i32 + NATIVE_OFFSET
    }

    #[test]
    fn thresholds_are_the_floors_of_the_mantissa_boundaries() {
        let f = (8.0 * 1e9f64.log2()).fract();
        assert!((f - 0.178_822_831_890_089).abs() < 1e-12, "f = {f}");
        for (j, t) in NATIVE_THRESHOLDS.iter().enumerate() {
            // 2^((j+f)/8) = 2^((j-7)/8) · 1e9/2^29: from the exact last one.
            let real = ((j as f64 - 7.0) / 8.0).exp2() * 1e9 * 2f64.powi(34);
            assert!((*t as f64 - real).abs() / real < 1e-15, "threshold {j}: {t} vs {real}");
        }
        assert_eq!(NATIVE_THRESHOLDS[7], 1_000_000_000u64 << 34);
        assert!(NATIVE_THRESHOLDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn native_bucket_ends() {
        assert_eq!(index(1), -239, "1 ns is in (2^-30 s, 2^(-239/8) s]");
        assert_eq!(native_bucket(1), 0);
        assert_eq!(native_bucket(u64::MAX), NATIVE_SLOTS - 1);
        assert_eq!(index(u64::MAX), reference(u64::MAX));
        // The slots are monotonic in ns, and within range.
        let mut last = 0;
        for k in 6..64 {
            for s in 0..64u64 {
                let ns = (1u64 << k) + (s << (k - 6));
                let b = native_bucket(ns);
                assert!(b >= last && b < NATIVE_SLOTS, "ns {ns}: slot {b} after {last}");
                last = b;
            }
        }
    }

    /// Powers of two of seconds are bucket boundaries (and the classic
    /// bounds): exact, upper-inclusive.
    #[test]
    fn power_of_two_seconds_are_exact_boundaries() {
        for n in -9i32..=34 {
            let ns = if n >= 0 { 1_000_000_000u64 << n } else { 1_000_000_000u64 >> -n };
            assert_eq!(index(ns), 8 * n, "2^{n} s = {ns} ns");
            assert_eq!(index(ns + 1), 8 * n + 1, "2^{n} s + 1 ns");
            assert_eq!(index(ns - 1), 8 * n, "2^{n} s - 1 ns");
        }
    }

    /// Every boundary from 1 ns to 2^50 ns (13 days), and the nanoseconds
    /// around it: the index is the definition's. f64 is exact for these
    /// integers and the boundaries are good to a fraction of a ns, so a
    /// disagreement is allowed only within 1 ns of a boundary. (The
    /// comparison itself is exact in integers; where f64 disagrees, f64 is
    /// wrong: see below.)
    #[test]
    fn native_bucket_matches_the_definition_around_every_boundary() {
        let mut checked = 0u64;
        let mut near: Vec<(u64, i32, i32)> = Vec::new();
        for i in -239..=(8 * 50 - 240) {
            let b = upper_ns(i);
            let base = b.floor() as u64;
            for ns in base.saturating_sub(3).max(1)..=base + 3 {
                let want = precise(ns);
                let got = index(ns);
                checked += 1;
                if got != want {
                    let edge = upper_ns(got.min(want));
                    assert!((ns as f64 - edge).abs() < 1.0, "ns {ns}: index {got}, want {want} (boundary {edge})");
                    near.push((ns, got, want));
                }
            }
        }
        assert!(checked > 2000);
        // The one f64 gets wrong: 2^(158/8)·1e9 = 881743799521078.98067… ns
        // (50 digits, by Python's decimal), so 881743799521079 ns is above
        // it, in bucket 159, as native_bucket says.
        assert_eq!(near, [(881_743_799_521_079, 159, 158)]);
    }

    #[test]
    fn native_bucket_matches_the_definition_everywhere_sampled() {
        for ns in 1..200_000u64 {
            assert_eq!(index(ns), reference(ns), "{ns} ns");
        }
        // A pseudo-random walk over 1 ns .. 2^52 ns.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1_000_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ns = (x >> (x % 52 + 12)).max(1);
            let (got, want) = (index(ns), precise(ns));
            if got != want {
                let b = upper_ns(got.min(want));
                assert!((ns as f64 - b).abs() < 1.0, "ns {ns}: index {got}, reference {want} (boundary {b})");
            }
        }
    }
}
