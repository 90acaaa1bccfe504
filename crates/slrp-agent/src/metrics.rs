//! Client metrics, registered under the `agent` prefix of the caller's registry.
//!
//! One client registers its [`Metrics`] with [`Metrics::register`]. Several clients of
//! one process (one per resource provider) count into one [`MetricFamilies`] instead,
//! each through a handle made by [`MetricFamilies::with_label`]: the families are
//! registered once, so the text exposition has one `# TYPE` line per name, as
//! Prometheus's parsers require.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

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
    /// Calls the agent refused with a 4xx other than 404 (a body over its limit, a call it
    /// does not accept): the same call would be refused again, so it is not resent as is.
    pub calls_refused: Counter,
    /// The largest call body sent, in bytes as encoded for the wire (UPDATE_STATE with
    /// the whole total is the large one): what a manager's body limit compares.
    pub largest_call_bytes: Gauge,
}

impl Metrics {
    /// Counts a call body of `bytes` into [`Metrics::largest_call_bytes`].
    pub fn call_sent(&self, bytes: usize) {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.largest_call_bytes
            .inner()
            .fetch_max(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

const LARGEST_CALL: (&str, &str) = (
    "largest_call_bytes",
    "The largest call body sent to the agent, as encoded for the wire",
);

/// Names and help texts, in the order of [`Metrics`]' fields.
const DESCRIPTIONS: [(&str, &str); 7] = [
    (
        "subscribe_attempts",
        "Connection and SUBSCRIBE attempts to the agent",
    ),
    (
        "reconnects",
        "Agent sessions that ended and were retried after a backoff",
    ),
    ("events", "Events received from the agent"),
    (
        "undecodable_records",
        "Agent event records skipped because they could not be decoded",
    ),
    ("calls", "Calls sent to the agent"),
    ("call_failures", "Calls to the agent that were not accepted"),
    (
        "calls_refused",
        "Calls the agent refused (4xx): the same call would be refused again",
    ),
];

/// Registers `metrics` (in the order of [`DESCRIPTIONS`]) under `agent_`.
fn register_all<M: Metric + Clone>(registry: &mut Registry, metrics: [&M; 7]) {
    let sub = registry.sub_registry_with_prefix("agent");
    for ((name, help), metric) in DESCRIPTIONS.into_iter().zip(metrics) {
        sub.register(name, help, metric.clone());
    }
}

impl Metrics {
    /// Creates the metrics and registers them under `agent_` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.sub_registry_with_prefix("agent").register(
            LARGEST_CALL.0,
            LARGEST_CALL.1,
            m.largest_call_bytes.clone(),
        );
        register_all(
            registry,
            [
                &m.subscribe_attempts,
                &m.reconnects,
                &m.events,
                &m.undecodable_records,
                &m.calls,
                &m.call_failures,
                &m.calls_refused,
            ],
        );
        m
    }
}

/// Constant labels of one client's series in [`MetricFamilies`].
type ConstLabels = Vec<(&'static str, Arc<str>)>;

type CounterFamily = Family<ConstLabels, Counter>;

/// The agent metric families of a process with several clients; cheap to clone.
/// Fields as [`Metrics`]'.
#[derive(Debug, Clone, Default)]
pub struct MetricFamilies {
    subscribe_attempts: CounterFamily,
    reconnects: CounterFamily,
    events: CounterFamily,
    undecodable_records: CounterFamily,
    calls: CounterFamily,
    call_failures: CounterFamily,
    calls_refused: CounterFamily,
    largest_call_bytes: Family<ConstLabels, Gauge>,
}

impl MetricFamilies {
    /// The counters of one client: its series carry the label `name="value"`
    /// (e.g. `provider="<type>.<name>"`). Asking twice with the same label gives
    /// counters of the same series.
    pub fn with_label(&self, name: &'static str, value: &str) -> Metrics {
        let labels: ConstLabels = vec![(name, Arc::from(value))];
        let series = |family: &CounterFamily| family.get_or_create_owned(&labels);
        Metrics {
            subscribe_attempts: series(&self.subscribe_attempts),
            reconnects: series(&self.reconnects),
            events: series(&self.events),
            undecodable_records: series(&self.undecodable_records),
            calls: series(&self.calls),
            call_failures: series(&self.call_failures),
            calls_refused: series(&self.calls_refused),
            largest_call_bytes: self.largest_call_bytes.get_or_create_owned(&labels),
        }
    }

    /// Registers the families under `agent_` in `registry`, once per registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("agent").register(
            LARGEST_CALL.0,
            LARGEST_CALL.1,
            self.largest_call_bytes.clone(),
        );
        register_all(
            registry,
            [
                &self.subscribe_attempts,
                &self.reconnects,
                &self.events,
                &self.undecodable_records,
                &self.calls,
                &self.call_failures,
                &self.calls_refused,
            ],
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn labelled_clients_share_one_family_and_count_apart() {
        let families = MetricFamilies::default();
        let mut reg = Registry::default();
        families.register(&mut reg);
        let a = families.with_label("provider", "a");
        let b = families.with_label("provider", "b");
        a.calls.inc();
        a.calls.inc();
        b.call_failures.inc();
        assert_eq!(families.with_label("provider", "a").calls.get(), 2);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for (name, _) in DESCRIPTIONS {
            let kind = format!("# TYPE agent_{name} counter\n");
            assert_eq!(text.matches(&kind).count(), 1, "{kind} in:\n{text}");
        }
        for want in [
            "agent_calls_total{provider=\"a\"} 2",
            "agent_calls_total{provider=\"b\"} 0",
            "agent_call_failures_total{provider=\"b\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }

    #[test]
    fn one_client_registers_unlabelled_counters() {
        let mut reg = Registry::default();
        let m = Metrics::register(&mut reg);
        m.events.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("agent_events_total 1\n"), "{text}");
        assert!(text.contains("# HELP agent_reconnects "), "{text}");
    }
}
