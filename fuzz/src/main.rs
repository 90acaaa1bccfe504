//! libFuzzer's entry point for every slrp fuzz target: the target is named by the
//! environment variable `SLRP_FUZZ_TARGET` (read once), its body is
//! `slrp_fuzz::run`. Rust allocations are capped (`ALLOCATION_CAP`): an input that makes
//! one allocation beyond it aborts, and libFuzzer saves it as a crash.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::OnceLock;

/// The largest single allocation a target may make (inputs are at most a few hundred
/// KiB; a daemon-side bound such as the 64 MiB RecordIO limit is not reached by one).
const ALLOCATION_CAP: usize = 256 << 20;

/// The system allocator, refusing allocations above [`ALLOCATION_CAP`].
struct Capped;

// SAFETY: every method forwards to `System` with the caller's arguments, or returns null
// (which `GlobalAlloc` allows for `alloc` and `realloc` to report failure); the layout
// contract is the caller's, unchanged.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Capped = Capped;

fn target() -> fn(&[u8]) {
    static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();
    *TARGET.get_or_init(|| {
        let name = std::env::var("SLRP_FUZZ_TARGET").unwrap_or_default();
        slrp_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<_> = slrp_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
            eprintln!("SLRP_FUZZ_TARGET={name:?} is none of {names:?}");
            std::process::exit(2)
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    target()(data);
});
