//! Helpers every probe uses: counting into per-CPU arrays, recording into a
//! histogram, reading kernel memory.

use agent_common::{log2_bucket, native_bucket, Hist, NativeHist};
use aya_ebpf::{helpers::bpf_probe_read_kernel, maps::PerCpuArray};

/// A hash map's flag: elements are allocated on insert, not preallocated
/// when the map is created (its memory then follows its entries).
pub const BPF_F_NO_PREALLOC: u32 = aya_ebpf::bindings::BPF_F_NO_PREALLOC;

/// Adds one to slot `index` of a per-CPU counter array.
#[inline(always)]
pub fn inc(map: &PerCpuArray<u64>, index: u32) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only by this CPU with preemption off.
        unsafe { *p += 1 };
    }
}

/// Records `delta_ns` into this CPU's histogram `h`.
#[inline(always)]
pub fn record(h: *mut Hist, delta_ns: u64) {
    let b = log2_bucket(delta_ns);
    // SAFETY: `h` points to this CPU's map value; `b` < HIST_BUCKETS.
    unsafe {
        if let Some(slot) = (*h).buckets.get_mut(b) {
            *slot += 1;
        }
        (*h).sum_ns += delta_ns;
        (*h).count += 1;
    }
}

/// Reads a kernel pointer or integer at `base + off`.
#[inline(always)]
pub fn read_kernel<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; a bad one fails.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// Nanoseconds since boot.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}

/// Records `ns` into this CPU's native histogram `h` (0 ns in its zero
/// bucket).
#[inline(always)]
pub fn record_native(h: *mut NativeHist, ns: u64) {
    // SAFETY: `h` points to this CPU's map value; the slot is
    // bounds-checked by `get_mut`.
    unsafe {
        if ns == 0 {
            (*h).zero += 1;
        } else if let Some(slot) = (*h).buckets.get_mut(native_bucket(ns)) {
            *slot += 1;
        }
        (*h).sum_ns += ns;
        (*h).count += 1;
    }
}

/// Stores `v` at `dst` by 8-byte words. LLVM turns a run of equal bytes
/// (a struct's zero padding, an all-ones address) into a call to memset,
/// and a copy between pointers it cannot tell apart into memmove: loops
/// the verifier walks byte by byte on every path, their counters made
/// precise (which keeps it from pruning the paths after them). Volatile
/// stores of words are never merged into either.
#[inline(always)]
pub fn store<T: Copy>(dst: *mut T, v: T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
    let src = &v as *const T as *const u64;
    let dst = dst as *mut u64;
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: `dst` (the caller's) and `src` (a local) each hold
        // size_of::<T>() / 8 aligned words.
        unsafe { core::ptr::write_volatile(dst.add(i), *src.add(i)) };
    }
}

/// Copies the `T` at `src` to `dst` by 8-byte words (as [`store`]); `dst`
/// may be `src`.
#[inline(always)]
pub fn copy<T: Copy>(dst: *mut T, src: *const T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
    let (src, dst) = (src as *const u64, dst as *mut u64);
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: both point to the caller's aligned `T`s, of
        // size_of::<T>() / 8 words each.
        unsafe { core::ptr::write_volatile(dst.add(i), core::ptr::read_volatile(src.add(i))) };
    }
}
