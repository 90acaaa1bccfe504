//! Per-provider metrics with Mesos's names (spec §9).
//!
//! # Design
//! One [`ProviderMetrics`] per provider, made before anything counts into it. Its parts
//! are the metrics of the layers below, handed to them by the plugin stack:
//! - [`ProviderMetrics::csi`]: what every CSI client of the provider counts into
//!   (`csi_plugin/rpcs_*`): version detection, `prepareServices`, the volume manager.
//! - [`ProviderMetrics::health_probes`]: what the supervisor's readiness and health
//!   probes count into. Mesos's startup budget (test `CsiPluginRpcMetrics`) has no
//!   periodic probes, so they are kept apart from `csi()` and never reach the
//!   `csi_plugin/rpcs_*` names.
//! - [`ProviderMetrics::supervisor`]: the supervisor's termination counts
//!   (`csi_plugin/container_terminations`, all containers and causes summed).
//!
//! [`ProviderMetrics::snapshot`] gives the Mesos names, prefixed with
//! `resource_providers/<type>.<name>/`, as Mesos's `/metrics/snapshot` does.
//! [`ProviderMetrics::register`] puts the per-RPC and per-container families into an
//! OpenMetrics registry under the label `provider="<type>.<name>"`.
//!
//! # Limitations
//! Each provider registers its own copy of every family: with several providers in one
//! registry the text exposition repeats each family's `# HELP`/`# TYPE` lines per
//! provider, which Prometheus rejects (see `docs/provider-stack.md`). The snapshot is
//! not affected.
//!
//! Issue #11 adds the `operations/<type>/*` metrics here (another part beside these).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use slrp_csi::CsiMetrics;
use slrp_supervisor::SupervisorMetrics;

/// The label that tells providers apart in an OpenMetrics registry.
pub const PROVIDER_LABEL: &str = "provider";

/// The metrics of one provider; cheap to clone (clones count into the same values).
#[derive(Clone, Debug)]
pub struct ProviderMetrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `<type>.<name>`.
    id: String,
    csi: CsiMetrics,
    health_probes: CsiMetrics,
    supervisor: SupervisorMetrics,
}

impl ProviderMetrics {
    /// Metrics of the provider with ResourceProviderInfo `type` `rp_type` and `name`
    /// `rp_name`; their Mesos names start with `resource_providers/<type>.<name>/`.
    pub fn new(rp_type: &str, rp_name: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                id: format!("{rp_type}.{rp_name}"),
                csi: CsiMetrics::default(),
                health_probes: CsiMetrics::default(),
                supervisor: SupervisorMetrics::default(),
            }),
        }
    }

    /// `<type>.<name>`: the provider as Mesos names it in metric names and the value of
    /// the [`PROVIDER_LABEL`] label.
    pub fn provider(&self) -> &str {
        &self.inner.id
    }

    /// What the provider's CSI clients count into (`csi_plugin/rpcs_*`). Health probes
    /// of the supervisor must not count here (use [`ProviderMetrics::health_probes`]).
    pub fn csi(&self) -> CsiMetrics {
        self.inner.csi.clone()
    }

    /// What the supervisor's readiness and health probes count into: exported for
    /// OpenMetrics (`health_csi_*`), never part of the Mesos `csi_plugin/rpcs_*` names.
    pub fn health_probes(&self) -> CsiMetrics {
        self.inner.health_probes.clone()
    }

    /// What the supervisor counts into (`csi_plugin/container_terminations`).
    pub fn supervisor(&self) -> SupervisorMetrics {
        self.inner.supervisor.clone()
    }

    /// The Mesos names and their current values, e.g.
    /// `resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/rpcs_finished`.
    pub fn snapshot(&self) -> BTreeMap<String, f64> {
        let csi = &self.inner.csi;
        // Counters stay far below 2^53 in any real run, so the f64 (what Mesos's JSON
        // snapshot carries) is exact.
        #[allow(clippy::cast_precision_loss)]
        let values = [
            ("csi_plugin/rpcs_pending", csi.pending_total() as f64),
            ("csi_plugin/rpcs_finished", csi.finished_total() as f64),
            ("csi_plugin/rpcs_failed", csi.failed_total() as f64),
            ("csi_plugin/rpcs_cancelled", csi.cancelled_total() as f64),
            (
                "csi_plugin/container_terminations",
                self.inner.supervisor.terminations_total() as f64,
            ),
        ];
        values
            .into_iter()
            .map(|(name, v)| (format!("{}{name}", self.prefix()), v))
            .collect()
    }

    /// `resource_providers/<type>.<name>/`.
    pub fn prefix(&self) -> String {
        format!("resource_providers/{}/", self.inner.id)
    }

    /// Registers the per-RPC (`csi_rpcs_*{rpc=…}`), health-probe (`health_csi_*`) and
    /// per-container (`csi_plugin_container_*`) families into `registry`, all labelled
    /// `provider="<type>.<name>"`. Register each provider once per registry.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_label((
            Cow::Borrowed(PROVIDER_LABEL),
            Cow::Owned(self.inner.id.clone()),
        ));
        self.inner.csi.register_in(sub);
        self.inner
            .health_probes
            .register_in(sub.sub_registry_with_prefix("health"));
        self.inner.supervisor.register_in(sub);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_mesos_names_under_the_provider_prefix() {
        let m = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "test");
        let snap = m.snapshot();
        let names: Vec<&str> = snap.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/container_terminations",
                "resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/rpcs_cancelled",
                "resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/rpcs_failed",
                "resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/rpcs_finished",
                "resource_providers/org.apache.mesos.rp.local.storage.test/csi_plugin/rpcs_pending",
            ]
        );
        assert!(snap.values().all(|v| *v == 0.0));
    }

    #[test]
    fn two_providers_register_into_one_registry_apart() {
        let a = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "a");
        let b = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "b");
        let mut reg = Registry::default();
        a.register(&mut reg);
        b.register(&mut reg);
        // Clones count into the same values; the other provider's stay untouched.
        let probe = a.clone().health_probes();
        let _ = probe.finished(slrp_csi::CsiRpc::Probe);
        let _ = a.csi().finished(slrp_csi::CsiRpc::Probe);
        let _ = b.csi().finished(slrp_csi::CsiRpc::Probe);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for p in ["a", "b"] {
            let want = format!(
                "csi_rpcs_finished_total{{provider=\"org.apache.mesos.rp.local.storage.{p}\",rpc=\"Probe\"}} 0"
            );
            assert!(text.contains(&want), "{want} missing in:\n{text}");
        }
        assert!(
            text.contains("health_csi_rpcs_finished_total{provider=\"org.apache.mesos.rp.local.storage.a\",rpc=\"Probe\"} 0"),
            "{text}"
        );
        assert!(
            !text.contains(
                "health_csi_rpcs_finished_total{provider=\"org.apache.mesos.rp.local.storage.b\""
            ),
            "{text}"
        );
    }
}
