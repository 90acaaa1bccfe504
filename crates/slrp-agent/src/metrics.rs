//! Client metrics, registered under the `agent` prefix of the caller's registry.

use prometheus_client::{metrics::counter::Counter, registry::Registry};

/// Counters of one agent client. Clones share the same series.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Sessions started (connect + SUBSCRIBE attempts).
    pub subscribe_attempts: Counter,
    /// Sessions that ended and were followed by a reconnect.
    pub reconnects: Counter,
    /// Events delivered after SUBSCRIBED.
    pub events: Counter,
    /// Event records that could not be decoded and were skipped.
    pub undecodable_records: Counter,
    /// Non-SUBSCRIBE calls sent.
    pub calls: Counter,
    /// Calls that did not get a 202.
    pub call_failures: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them under `agent_` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("agent");
        r.register(
            "subscribe_attempts",
            "Connection and SUBSCRIBE attempts to the agent",
            m.subscribe_attempts.clone(),
        );
        r.register(
            "reconnects",
            "Agent sessions that ended and were retried after a backoff",
            m.reconnects.clone(),
        );
        r.register("events", "Events received from the agent", m.events.clone());
        r.register(
            "undecodable_records",
            "Agent event records skipped because they could not be decoded",
            m.undecodable_records.clone(),
        );
        r.register("calls", "Calls sent to the agent", m.calls.clone());
        r.register(
            "call_failures",
            "Calls to the agent that were not accepted",
            m.call_failures.clone(),
        );
        m
    }
}
