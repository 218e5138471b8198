//! Shared by the fuzz targets: an allocator that measures what one input costs.
//!
//! libFuzzer's own `-malloc_limit_mb` only sees allocations through a sanitizer's allocator, and
//! `.ci/fuzz` builds without one (`-s none`, see docs/fuzzing.md). So each target that parses
//! untrusted bytes installs [`Counting`] and asserts, per input, that the peak of memory the
//! parser held at once stays within a linear bound of the input's length: any input that makes
//! memory grow faster than its own size (or without bound) is a crash with a reproducer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The system allocator, counting live bytes and their peak.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Old and new blocks may both exist for a moment; count the larger, as a peak.
            grew(new_size);
            shrank(layout.size());
        }
        p
    }
}

/// Runs `f` and returns its result with the most bytes it had allocated at once (beyond what
/// was live when it started). Only meaningful where no other thread allocates meanwhile.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let result = f();
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    (result, peak)
}

/// Panics (a fuzz crash) when `peak` bytes exceed `per_byte * input_len + fixed`.
///
/// With `IRIS_FUZZ_ALLOC_REPORT=1` in the environment, also prints every new maximum of the
/// ratio peak / (input + 1), which is how the bounds in the targets were chosen.
pub fn check_alloc(what: &str, input_len: usize, peak: usize, per_byte: usize, fixed: usize) {
    static WORST: AtomicUsize = AtomicUsize::new(0);
    if std::env::var_os("IRIS_FUZZ_ALLOC_REPORT").is_some() && input_len >= 64 {
        let ratio_x100 = peak * 100 / (input_len + 1);
        if ratio_x100 > WORST.fetch_max(ratio_x100, Relaxed) {
            eprintln!(
                "alloc report: {what}: {peak} bytes at peak for {input_len} input bytes ({}.{:02} per byte)",
                ratio_x100 / 100,
                ratio_x100 % 100
            );
        }
    }
    let bound = per_byte.saturating_mul(input_len).saturating_add(fixed);
    assert!(
        peak <= bound,
        "{what} held {peak} bytes at once for a {input_len}-byte input (bound: {per_byte} per byte + {fixed})"
    );
}
