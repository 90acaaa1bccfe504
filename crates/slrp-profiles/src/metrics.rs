//! Adaptor metrics, registered under the `profiles` prefix of the caller's registry.

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// Counters and gauges of one profile adaptor. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Fetches that returned a document (valid or not).
    pub fetches_ok: Counter,
    /// Fetches that failed (unreachable, bad status, timeout, unreadable file).
    pub fetches_failed: Counter,
    /// Fetched documents rejected by parsing or validation.
    pub validation_failures: Counter,
    /// Newly detected changed definitions under an existing name.
    pub conflicts: Counter,
    /// Failed writes of the state file.
    pub persist_failures: Counter,
    /// Profiles currently active.
    pub active_profiles: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them under `profiles_` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("profiles");
        r.register(
            "fetches_ok",
            "Profile document fetches that returned a document",
            m.fetches_ok.clone(),
        );
        r.register(
            "fetches_failed",
            "Profile document fetches that failed; the last good mapping was kept",
            m.fetches_failed.clone(),
        );
        r.register(
            "validation_failures",
            "Fetched profile documents rejected as malformed or invalid",
            m.validation_failures.clone(),
        );
        r.register(
            "conflicts",
            "Changed profile definitions under an existing name, ignored until renamed",
            m.conflicts.clone(),
        );
        r.register(
            "persist_failures",
            "Failed writes of the persisted profile table",
            m.persist_failures.clone(),
        );
        r.register(
            "active",
            "Profiles currently active",
            m.active_profiles.clone(),
        );
        m
    }
}
