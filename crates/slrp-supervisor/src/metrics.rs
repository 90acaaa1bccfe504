//! Supervisor metrics: terminations by cause, restarts and readiness per container.
//!
//! `terminations` corresponds to Mesos's `csi_plugin/container_terminations` (spec §9),
//! with the cause as a label.
//!
//! As [`slrp_csi::CsiMetrics`], several owners share one set of families through
//! handles made by [`SupervisorMetrics::with_label`], so the families are registered
//! once however many supervisors count into them.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use slrp_csi::metrics::ConstLabels;

/// Why a plugin process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum TerminationCause {
    /// It exited (or crashed) on its own.
    Exited,
    /// It failed consecutive health probes and was restarted.
    Unhealthy,
    /// Its socket did not appear, or it did not become ready, in time.
    StartTimeout,
    /// It could not be launched at all.
    LaunchFailed,
    /// slrp stopped it (shutdown, or a leftover with a different configuration).
    Stopped,
    /// The agent refused to launch it (401/403); it is not retried.
    Refused,
}

impl TerminationCause {
    /// A lower-case label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exited => "exited",
            Self::Unhealthy => "unhealthy",
            Self::StartTimeout => "start_timeout",
            Self::LaunchFailed => "launch_failed",
            Self::Stopped => "stopped",
            Self::Refused => "refused",
        }
    }
}

/// Labels of per-container metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ContainerLabels {
    /// Container id.
    pub container: String,
}

/// Labels of the termination counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TerminationLabels {
    /// Container id.
    pub container: String,
    /// Cause.
    pub cause: TerminationCause,
}

type Scoped<L> = (ConstLabels, L);

/// Supervisor metrics; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SupervisorMetrics {
    terminations: Family<Scoped<TerminationLabels>, Counter>,
    restarts: Family<Scoped<ContainerLabels>, Counter>,
    ready: Family<Scoped<ContainerLabels>, Gauge>,
    adoptions: Family<Scoped<ContainerLabels>, Counter>,
    /// All terminations of the containers each handle's supervisor ran or adopted:
    /// Mesos's single `container_terminations` counter (a `Family` cannot be summed
    /// without knowing its label values). Not exported, keyed by the handle's labels.
    terminations_total: Family<ConstLabels, Counter>,
    /// What this handle counts under; empty for the default handle.
    scope: ConstLabels,
}

impl SupervisorMetrics {
    /// Creates the metrics under the `csi_plugin` prefix of `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register_in(registry);
        m
    }

    /// A handle to the same families whose series all carry the label `name="value"`
    /// (after this handle's own constant labels), e.g. one provider's supervisor among
    /// several of a process. Its getters read only its own series.
    #[must_use]
    pub fn with_label(&self, name: &'static str, value: &str) -> Self {
        let mut scoped = self.clone();
        scoped.scope.push((name, value.into()));
        scoped
    }

    /// Registers these (already counting) families under the `csi_plugin` prefix of
    /// `registry`: the series of every handle made from them with
    /// [`SupervisorMetrics::with_label`]. Register them once per registry.
    pub fn register_in(&self, registry: &mut Registry) {
        let m = self;
        let sub = registry.sub_registry_with_prefix("csi_plugin");
        sub.register(
            "container_terminations",
            "Plugin process terminations by cause",
            m.terminations.clone(),
        );
        sub.register(
            "container_restarts",
            "Plugin process launches after the first",
            m.restarts.clone(),
        );
        sub.register(
            "container_ready",
            "1 while the plugin container is ready",
            m.ready.clone(),
        );
        sub.register(
            "container_adoptions",
            "Plugin processes adopted from a previous slrp run",
            m.adoptions.clone(),
        );
    }

    fn labels(&self, container: &str) -> Scoped<ContainerLabels> {
        (
            self.scope.clone(),
            ContainerLabels {
                container: container.to_owned(),
            },
        )
    }

    fn termination_labels(
        &self,
        container: &str,
        cause: TerminationCause,
    ) -> Scoped<TerminationLabels> {
        (
            self.scope.clone(),
            TerminationLabels {
                container: container.to_owned(),
                cause,
            },
        )
    }

    /// Terminations of `container` with `cause`.
    pub fn terminations(&self, container: &str, cause: TerminationCause) -> u64 {
        self.terminations
            .get_or_create(&self.termination_labels(container, cause))
            .get()
    }

    /// Terminations of the plugins this supervisor ran or adopted, whatever the cause
    /// (Mesos's `csi_plugin/container_terminations`). A leftover of a previous slrp that
    /// recovery stops is not one of them: Mesos's service manager kills such containers
    /// before any container daemon watches them, so its post-stop hook never counts them.
    /// They count only under their container and cause ([`Self::terminations`]).
    pub fn terminations_total(&self) -> u64 {
        self.terminations_total.get_or_create(&self.scope).get()
    }

    /// Restarts of `container`.
    pub fn restarts(&self, container: &str) -> u64 {
        self.restarts.get_or_create(&self.labels(container)).get()
    }

    /// Adoptions of `container`.
    pub fn adoptions(&self, container: &str) -> u64 {
        self.adoptions.get_or_create(&self.labels(container)).get()
    }

    pub(crate) fn terminated(&self, container: &str, cause: TerminationCause) {
        self.count_cause(container, cause);
        self.terminations_total.get_or_create(&self.scope).inc();
    }

    fn count_cause(&self, container: &str, cause: TerminationCause) {
        self.terminations
            .get_or_create(&self.termination_labels(container, cause))
            .inc();
    }

    /// A leftover of a previous run stopped by recovery: counted under its container and
    /// cause, not in [`Self::terminations_total`].
    pub(crate) fn stopped_leftover(&self, container: &str) {
        self.count_cause(container, TerminationCause::Stopped);
    }

    pub(crate) fn restarted(&self, container: &str) {
        self.restarts.get_or_create(&self.labels(container)).inc();
    }

    pub(crate) fn adopted(&self, container: &str) {
        self.adoptions.get_or_create(&self.labels(container)).inc();
    }

    pub(crate) fn set_ready(&self, container: &str, ready: bool) {
        self.ready
            .get_or_create(&self.labels(container))
            .set(i64::from(ready));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn labelled_handles_share_one_family_and_count_apart() {
        let mut reg = Registry::default();
        let shared = SupervisorMetrics::register(&mut reg);
        let a = shared.with_label("provider", "a");
        let b = shared.with_label("provider", "b");
        a.terminated("plugin", TerminationCause::Exited);
        a.terminated("plugin", TerminationCause::Exited);
        b.stopped_leftover("plugin");
        b.set_ready("plugin", true);
        assert_eq!(a.terminations_total(), 2);
        assert_eq!(b.terminations_total(), 0);
        assert_eq!(b.terminations("plugin", TerminationCause::Stopped), 1);
        assert_eq!(a.terminations("plugin", TerminationCause::Stopped), 0);
        assert_eq!(shared.terminations_total(), 0);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert_eq!(
            text.matches("# TYPE csi_plugin_container_terminations counter")
                .count(),
            1,
            "{text}"
        );
        for want in [
            "csi_plugin_container_terminations_total{provider=\"a\",container=\"plugin\",cause=\"Exited\"} 2",
            "csi_plugin_container_terminations_total{provider=\"b\",container=\"plugin\",cause=\"Stopped\"} 1",
            "csi_plugin_container_ready{provider=\"b\",container=\"plugin\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }
}
