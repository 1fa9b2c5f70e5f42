//! Reading the probes' maps: per-CPU counters and histograms, summed, and
//! the histograms in Prometheus form. Errors are typed and become the
//! collector's error (`node_scrape_collector_success 0`).

use agent_common::{Hist, NativeHist, HIST_BUCKETS, NATIVE_OFFSET};
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

/// Every entry of hash map `map` (a hash or LRU hash of `K` to `V`;
/// entries that vanish while it is read are left out), read in batches of
/// up to [`BATCH`] entries, one bpf(2) call each (`BPF_MAP_LOOKUP_BATCH`,
/// Linux 5.6+), where a walk takes two calls an entry; a kernel without
/// batches is walked.
pub fn hash_entries<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, map: &'static str) -> Result<Vec<(K, V)>, MapError> {
    let data = ebpf.map(map).ok_or(MapError::Missing(map))?;
    // The type and the key and value sizes checked, as aya checks them.
    let m: aya::maps::HashMap<_, K, V> = aya::maps::HashMap::try_from(data).map_err(|source| MapError::Map { map, source })?;
    if let Some(entries) = raw_fd(data).and_then(|fd| lookup_batch::<K, V>(fd)) {
        return Ok(entries);
    }
    Ok(m.iter().filter_map(Result::ok).collect())
}

/// Entries asked for per `BPF_MAP_LOOKUP_BATCH` call: a hash map's batch
/// ends at a bucket's end, so a call returns at most this many.
pub const BATCH: usize = 256;

/// The raw descriptor of a map (None for types this agent does not use).
pub fn raw_fd(map: &aya::maps::Map) -> Option<i32> {
    use aya::maps::Map;
    use std::os::fd::{AsFd, AsRawFd};
    let d = match map {
        Map::Array(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::RingBuf(d)
        | Map::PerfEventArray(d)
        | Map::Unsupported(d) => d,
        _ => return None,
    };
    Some(d.fd().as_fd().as_raw_fd())
}

/// `union bpf_attr`'s member for the `BPF_MAP_*_BATCH` commands.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Every entry of the hash map `fd` through `BPF_MAP_LOOKUP_BATCH`, or None
/// when the kernel refuses the command (older than 5.6) or fails otherwise
/// (the caller walks the map instead).
fn lookup_batch<K: aya::Pod, V: aya::Pod>(fd: i32) -> Option<Vec<(K, V)>> {
    let mut chunk = BATCH;
    let mut out: Vec<(K, V)> = Vec::new();
    // The batch position: a hash map's bucket index (a u32), kept in a u64.
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    let (mut keys, mut values): (Vec<std::mem::MaybeUninit<K>>, Vec<std::mem::MaybeUninit<V>>) = (Vec::new(), Vec::new());
    loop {
        keys.resize_with(chunk, std::mem::MaybeUninit::uninit);
        values.resize_with(chunk, std::mem::MaybeUninit::uninit);
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &mut token_in as *mut u64 as u64 },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            elem_flags: 0,
            flags: 0,
        };
        let (attr_ptr, attr_size) = (&mut attr as *mut BatchAttr, std::mem::size_of::<BatchAttr>());
        // SAFETY: BPF_MAP_LOOKUP_BATCH writes at most `count` keys and values
        // (the map's sizes, checked equal to K's and V's by the caller) into
        // buffers of that capacity, its position into `token_out` and the
        // count back into `attr`; all outlive the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, attr_ptr, attr_size) };
        let errno = (rc < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        if errno == Some(libc::ENOSPC) && attr.count == 0 {
            // One bucket holds more than a batch: ask for more at once.
            chunk = chunk.checked_mul(2).filter(|c| *c <= 1 << 20)?;
            continue;
        }
        if errno.is_some_and(|e| e != libc::ENOENT) {
            return None;
        }
        let n = (attr.count as usize).min(chunk);
        for (k, v) in keys.iter().zip(&values).take(n) {
            // SAFETY: the kernel initialized the first `n` keys and values;
            // K and V are Pod (any bytes are a valid value).
            out.push(unsafe { (k.assume_init_read(), v.assume_init_read()) });
        }
        if errno == Some(libc::ENOENT) {
            return Some(out);
        }
        token_in = token_out;
        first = false;
    }
}

/// Deletes `keys` from hash map `map` (keys already gone are no error).
pub fn hash_delete<K: aya::Pod, V: aya::Pod>(ebpf: &mut Ebpf, map: &'static str, keys: &[K]) -> Result<(), MapError> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut m: aya::maps::HashMap<_, K, V> =
        aya::maps::HashMap::try_from(ebpf.map_mut(map).ok_or(MapError::Missing(map))?).map_err(|source| MapError::Map { map, source })?;
    for k in keys {
        let _ = m.remove(k);
    }
    Ok(())
}

/// Takes `keys` out of hash map `map`: each deleted, with the value it
/// held when it was deleted (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`, Linux 5.14+
/// for hash maps), so that nothing the programs add between a read and the
/// delete is lost. Older kernels read the value, then delete (a count added
/// in between is lost). Keys not in the map are left out of the result.
pub fn hash_take<K: aya::Pod, V: aya::Pod>(ebpf: &mut Ebpf, map: &'static str, keys: &[K]) -> Result<Vec<(K, V)>, MapError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let data = ebpf.map_mut(map).ok_or(MapError::Missing(map))?;
    let fd = raw_fd(data);
    let mut m: aya::maps::HashMap<_, K, V> = aya::maps::HashMap::try_from(data).map_err(|source| MapError::Map { map, source })?;
    let mut out = Vec::with_capacity(keys.len());
    let mut atomic = fd.is_some();
    for k in keys {
        if atomic {
            match fd.map(|fd| lookup_and_delete::<K, V>(fd, k)) {
                Some(Ok(Some(v))) => out.push((*k, v)),
                Some(Ok(None)) => {}
                // Not for this map type on this kernel: read, then delete.
                _ => atomic = false,
            }
            if atomic {
                continue;
            }
        }
        if let Ok(v) = m.get(k, 0) {
            if m.remove(k).is_ok() {
                out.push((*k, v));
            }
        }
    }
    Ok(out)
}

/// `union bpf_attr`'s member for the `BPF_MAP_*_ELEM` commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// `key`'s value, deleted with it from the hash map `fd`: Ok(None) when it
/// is not there, Err when the kernel cannot do this for the map.
fn lookup_and_delete<K: aya::Pod, V: aya::Pod>(fd: i32, key: &K) -> Result<Option<V>, i32> {
    let mut value = std::mem::MaybeUninit::<V>::uninit();
    let attr = ElemAttr { map_fd: fd as u32, _pad: 0, key: key as *const K as u64, value: value.as_mut_ptr() as u64, flags: 0 };
    // SAFETY: BPF_MAP_LOOKUP_AND_DELETE_ELEM reads the map's key size from
    // `key` and writes its value size into `value` (both checked equal to
    // K's and V's by the caller); both outlive the call.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_AND_DELETE_ELEM, &attr as *const ElemAttr, std::mem::size_of::<ElemAttr>()) };
    if rc == 0 {
        // SAFETY: the kernel wrote the value; V is Pod (any bytes are valid).
        return Ok(Some(unsafe { value.assume_init() }));
    }
    match std::io::Error::last_os_error().raw_os_error().unwrap_or(0) {
        libc::ENOENT => Ok(None),
        e => Err(e),
    }
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

/// Classic `le` bounds native histograms are written with in the text
/// formats: the powers of two of seconds from 2^-20 s (≈ 0.95 µs) to 2^3 s
/// (8 s), which are native bucket boundaries, so the classic counts are
/// exact.
pub const NATIVE_CLASSIC_BOUNDS: [f64; 24] = classic_bounds();

const fn classic_bounds() -> [f64; 24] {
    let mut b = [0.0; 24];
    let mut i = 0;
    while i < 24 {
        // 2^(i-20): exact in f64.
        b[i] = if i < 20 { 1.0 / (1u64 << (20 - i)) as f64 } else { (1u64 << (i - 20)) as f64 };
        i += 1;
    }
    b
}

/// Values at or below this (only 0 ns: the first native bucket holds 1 ns)
/// count in the zero bucket: 2^-30 s, the first bucket's lower bound.
pub const NATIVE_ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;

impl NativeSum {
    /// Writes this histogram as a sample of `f`: native buckets, and the
    /// classic ones of [`NATIVE_CLASSIC_BOUNDS`].
    pub fn write(&self, f: &mut expo::FamilyMut, labels: &[(&str, &str)]) {
        let native = expo::Native {
            schema: agent_common::NATIVE_SCHEMA,
            zero_threshold: NATIVE_ZERO_THRESHOLD,
            zero_count: self.zero,
            buckets: &self.buckets,
        };
        f.native_histogram(labels, self.sum, self.count, &native, &NATIVE_CLASSIC_BOUNDS);
    }
}

/// Entry `index` of a per-CPU array of native histograms, per CPU.
pub fn native_histogram(ebpf: &Ebpf, map: &'static str, index: u32) -> Result<PerCpuValues<NativeHist>, MapError> {
    per_cpu_array::<NativeHist>(ebpf, map)?.get(&index, 0).map_err(|source| MapError::Map { map, source })
}

/// A native histogram summed over CPUs, in Prometheus form.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NativeSum {
    /// Latencies of 0 (the zero bucket).
    pub zero: u64,
    /// (native bucket index, count), ascending, non-empty buckets only.
    pub buckets: Vec<(i32, u64)>,
    /// Sum in seconds.
    pub sum: f64,
    pub count: u64,
}

/// Sums per-CPU native histograms into `out` (its vector reused).
pub fn sum_native(per_cpu: &[NativeHist], out: &mut NativeSum) {
    let (mut zero, mut sum, mut count) = (0u64, 0u64, 0u64);
    out.buckets.clear();
    for h in per_cpu {
        zero = zero.wrapping_add(h.zero);
        sum = sum.wrapping_add(h.sum_ns);
        count = count.wrapping_add(h.count);
    }
    for slot in 0..agent_common::NATIVE_SLOTS {
        let n = per_cpu.iter().fold(0u64, |a, h| a.wrapping_add(h.buckets[slot]));
        if n > 0 {
            out.buckets.push((slot as i32 + NATIVE_OFFSET, n));
        }
    }
    out.zero = zero;
    out.sum = sum as f64 / 1e9;
    out.count = count;
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

    #[test]
    fn native_histogram_sums_over_cpus_by_native_index() {
        use agent_common::native_bucket;
        let mut a = NativeHist::ZERO;
        let mut b = NativeHist::ZERO;
        // 1 ms: native index ceil(8·log2(1e-3)) = ceil(-79.73) = -79.
        a.buckets[native_bucket(1_000_000)] += 2;
        b.buckets[native_bucket(1_000_000)] += 1;
        // 1 s: exactly the upper bound of bucket 0.
        b.buckets[native_bucket(1_000_000_000)] += 1;
        // 1 ns: the first slot, index -239.
        a.buckets[native_bucket(1)] += 1;
        a.zero = 1;
        (a.sum_ns, a.count) = (2_000_001, 4);
        (b.sum_ns, b.count) = (1_001_000_000, 2);
        let mut s = NativeSum::default();
        sum_native(&[a, b], &mut s);
        assert_eq!(s.buckets, vec![(-239, 1), (-79, 3), (0, 1)]);
        assert_eq!((s.zero, s.count), (1, 6));
        assert!((s.sum - 1.003000001).abs() < 1e-12);
        // The indices mean what Prometheus says: bucket i is (2^((i-1)/8), 2^(i/8)] s.
        for &(i, _) in &s.buckets {
            let (lo, hi) = (f64::from(i - 1) / 8.0, f64::from(i) / 8.0);
            let v = match i {
                -239 => 1e-9,
                -79 => 1e-3,
                _ => 1.0,
            };
            assert!(lo.exp2() < v && v <= hi.exp2() * (1.0 + 1e-15), "{v} s in bucket {i}");
        }
    }

    /// A hash map of the kernel's, made and filled with bpf(2) directly.
    fn hash_map_with(entries: &[(u64, [u64; 3])], map_type: u32, flags: u32) -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd;
        #[repr(C)]
        struct Create {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        #[repr(C)]
        struct Update {
            map_fd: u32,
            _pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        let attr = Create { map_type, key_size: 8, value_size: 24, max_entries: 4096, map_flags: flags };
        // SAFETY: BPF_MAP_CREATE (0) reads the attribute of the size given.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, &attr as *const Create, std::mem::size_of::<Create>()) };
        assert!(fd >= 0, "BPF_MAP_CREATE: {} (the test needs CAP_BPF, as root)", std::io::Error::last_os_error());
        // SAFETY: the kernel just returned this new descriptor.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        for (k, v) in entries {
            let u = Update {
                map_fd: std::os::fd::AsRawFd::as_raw_fd(&fd) as u32,
                _pad: 0,
                key: k as *const u64 as u64,
                value: v.as_ptr() as u64,
                flags: 0,
            };
            // SAFETY: BPF_MAP_UPDATE_ELEM (2) reads 8 key and 24 value bytes.
            let rc = unsafe { libc::syscall(libc::SYS_bpf, 2, &u as *const Update, std::mem::size_of::<Update>()) };
            assert_eq!(rc, 0, "BPF_MAP_UPDATE_ELEM: {}", std::io::Error::last_os_error());
        }
        fd
    }

    /// Taking entries returns each one's value and leaves the others.
    #[test]
    fn taken_entries_leave_with_their_values() {
        use std::os::fd::AsRawFd;
        for (map_type, flags) in [(1, 0), (1, 1), (9, 0)] {
            let fd = hash_map_with(&[(1, [1, 2, 3]), (2, [4, 5, 6]), (3, [7, 8, 9])], map_type, flags);
            assert_eq!(lookup_and_delete::<u64, [u64; 3]>(fd.as_raw_fd(), &2), Ok(Some([4, 5, 6])), "type {map_type}");
            assert_eq!(lookup_and_delete::<u64, [u64; 3]>(fd.as_raw_fd(), &2), Ok(None), "gone");
            assert_eq!(lookup_and_delete::<u64, [u64; 3]>(fd.as_raw_fd(), &9), Ok(None), "never there");
            let mut left = lookup_batch::<u64, [u64; 3]>(fd.as_raw_fd()).expect("batch");
            left.sort_unstable();
            assert_eq!(left, [(1, [1, 2, 3]), (3, [7, 8, 9])]);
        }
    }

    /// Batches read every entry once, over several calls (more entries
    /// than [`BATCH`]), from an empty map, a hash without preallocation
    /// and an LRU hash.
    #[test]
    fn batches_read_every_entry_once() {
        use std::os::fd::AsRawFd;
        for (map_type, flags) in [(1, 0), (1, 1), (9, 0)] {
            for n in [0u64, 1, 1000] {
                let want: Vec<(u64, [u64; 3])> = (0..n).map(|i| (i * 7919 + 1, [i, i * 2, !i])).collect();
                let fd = hash_map_with(&want, map_type, flags);
                let mut got = lookup_batch::<u64, [u64; 3]>(fd.as_raw_fd()).expect("BPF_MAP_LOOKUP_BATCH");
                got.sort_unstable();
                assert_eq!(got, want, "type {map_type} flags {flags}, {n} entries");
            }
        }
    }
}
