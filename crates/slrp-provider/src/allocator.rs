//! The process allocator: jemalloc, with freed pages given back to the system in the
//! background. `slrp` and the operations benchmark install it the same way
//! ([`use_jemalloc!`](crate::use_jemalloc)), so the benchmark's figure of the provider's
//! own memory is what `slrp run` gets.
//!
//! Why not glibc's malloc: a provider with 10,000 volumes held about 45 MiB of live heap
//! but 190-220 MiB resident after a restart. glibc keeps per-thread arenas (up to eight
//! per core) and returns the free pages inside them only on `malloc_trim`, so the
//! recovery's transient peak (the records decoded, UPDATE_STATE built and encoded)
//! stayed resident for good. jemalloc's background thread purges pages left unused for
//! [`DIRTY_DECAY_MS`] (docs/benchmarks.md, "Round of this session", has the figures).

use std::ffi::{CStr, c_char};

pub use tikv_jemallocator::Jemalloc;

/// How long freed pages stay resident (jemalloc `dirty_decay_ms`) before the background
/// thread returns them: long enough that a burst of operations reuses them, short
/// enough that the garbage of a restart does not pile up. A restart with 10,000 volumes
/// frees several times its live heap within half a second; with a decay of 1 s the
/// process peaked at ~200 MiB resident for a 79 MiB peak of live heap, with 250 ms at
/// ~150 MiB, and no loss of throughput could be seen (docs/benchmarks.md).
pub const DIRTY_DECAY_MS: u32 = 250;

/// jemalloc's options, read at its first allocation from the symbol
/// [`use_jemalloc!`](crate::use_jemalloc) exports (the environment variable
/// `_RJEM_MALLOC_CONF` still overrides them). `muzzy_decay_ms:0`: purged pages are
/// unmapped at once (`MADV_DONTNEED`), not kept lazily freed, so the resident set shows
/// them gone. Keep the number in step with [`DIRTY_DECAY_MS`].
pub const MALLOC_CONF: &CStr = c"background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0";

/// A pointer to [`MALLOC_CONF`], the type jemalloc reads its `malloc_conf` symbol as.
#[repr(transparent)]
#[derive(Debug)]
pub struct MallocConf(*const c_char);

#[allow(
    unsafe_code,
    reason = "a static of a raw pointer must be declared Sync"
)]
// SAFETY: the pointer is to an immutable 'static string; nothing writes through it.
unsafe impl Sync for MallocConf {}

impl MallocConf {
    /// Points at [`MALLOC_CONF`].
    #[must_use]
    pub const fn new() -> Self {
        Self(MALLOC_CONF.as_ptr())
    }
}

impl Default for MallocConf {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes the program has allocated and not freed (jemalloc `stats.allocated`, refreshed
/// first); `None` if jemalloc is not the process allocator or cannot tell.
pub fn heap_in_use() -> Option<usize> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    tikv_jemalloc_ctl::stats::allocated::read().ok()
}

/// Bytes resident in jemalloc's own pages (`stats.resident`, refreshed first): the live
/// heap, the allocator's metadata and the freed pages not yet purged.
pub fn allocator_resident() -> Option<usize> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    tikv_jemalloc_ctl::stats::resident::read().ok()
}

/// The `dirty_decay_ms` jemalloc runs with (`opt.dirty_decay_ms`): [`DIRTY_DECAY_MS`]
/// where [`use_jemalloc!`](crate::use_jemalloc) installed it and nothing overrode it.
pub fn dirty_decay_ms() -> Option<isize> {
    #[allow(
        unsafe_code,
        reason = "jemalloc's control interface is typed by the caller"
    )]
    // SAFETY: `opt.dirty_decay_ms` is an ssize_t, read as one.
    let decay = unsafe { tikv_jemalloc_ctl::raw::read::<isize>(b"opt.dirty_decay_ms\0") };
    decay.ok()
}

/// Installs [`Jemalloc`] as the global allocator with [`MALLOC_CONF`]. Invoke once, in
/// the binary's root module.
#[macro_export]
macro_rules! use_jemalloc {
    () => {
        #[global_allocator]
        static GLOBAL_ALLOCATOR: $crate::allocator::Jemalloc = $crate::allocator::Jemalloc;

        // jemalloc (prefixed `_rjem_` by tikv-jemallocator) looks this symbol up at its
        // first allocation.
        #[allow(unsafe_code, reason = "exporting jemalloc's configuration symbol")]
        #[unsafe(export_name = "_rjem_malloc_conf")]
        static JEMALLOC_CONF: $crate::allocator::MallocConf = $crate::allocator::MallocConf::new();
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_string_carries_the_decay_constant() {
        let conf = MALLOC_CONF.to_str().expect("ASCII");
        let options: Vec<&str> = conf.split(',').collect();
        assert!(
            options.contains(&format!("dirty_decay_ms:{DIRTY_DECAY_MS}").as_str()),
            "{conf}"
        );
        assert!(options.contains(&"background_thread:true"), "{conf}");
    }
}
