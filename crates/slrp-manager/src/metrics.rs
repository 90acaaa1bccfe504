//! The manager's metrics under Mesos's names (spec §9).
//!
//! Prometheus names replace `/` with `_` (`resource_provider_manager_subscribed`, counters
//! with `_total`); [`ManagerMetrics::snapshot`] gives the Mesos names for a
//! `/metrics/snapshot`-style endpoint.

use std::collections::BTreeMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Mesos name of the subscribed-providers gauge.
pub const SUBSCRIBED: &str = "resource_provider_manager/subscribed";
/// Mesos name of the subscription counter.
pub const EVENTS_SUBSCRIBE: &str = "resource_provider_manager/events/subscribe";
/// Mesos name of the disconnection counter.
pub const EVENTS_DISCONNECT: &str = "resource_provider_manager/events/disconnect";

/// Name of the counter of provider messages a Mesos agent would abort on (slrp's own;
/// Mesos has none, its agent crashes instead).
pub const PROTOCOL_VIOLATIONS: &str = "resource_provider_manager/protocol_violations";

/// Metrics handles; cheap to clone (shared atomics).
#[derive(Debug, Clone, Default)]
pub struct ManagerMetrics {
    pub(crate) subscribed: Gauge,
    pub(crate) subscribes: Counter,
    pub(crate) disconnects: Counter,
    pub(crate) violations: Counter,
}

impl ManagerMetrics {
    /// Registers the metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("resource_provider_manager");
        sub.register(
            "subscribed",
            "Number of subscribed resource providers",
            self.subscribed.clone(),
        );
        sub.register(
            "events_subscribe",
            "Number of resource provider subscriptions",
            self.subscribes.clone(),
        );
        sub.register(
            "events_disconnect",
            "Number of resource provider disconnections",
            self.disconnects.clone(),
        );
        sub.register(
            "protocol_violations",
            "Number of provider messages a Mesos agent would abort on",
            self.violations.clone(),
        );
    }

    /// Current values under the Mesos names.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<&'static str, f64> {
        // Counts are far below 2^53, so the conversions are exact.
        #[allow(clippy::cast_precision_loss)]
        BTreeMap::from([
            (SUBSCRIBED, self.subscribed.get() as f64),
            (EVENTS_SUBSCRIBE, self.subscribes.get() as f64),
            (EVENTS_DISCONNECT, self.disconnects.get() as f64),
            (PROTOCOL_VIOLATIONS, self.violations.get() as f64),
        ])
    }
}
