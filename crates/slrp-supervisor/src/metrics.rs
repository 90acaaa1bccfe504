//! Supervisor metrics: terminations by cause, restarts and readiness per container.
//!
//! `terminations` corresponds to Mesos's `csi_plugin/container_terminations` (spec §9),
//! with the cause as a label.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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

/// Supervisor metrics; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct SupervisorMetrics {
    terminations: Family<TerminationLabels, Counter>,
    restarts: Family<ContainerLabels, Counter>,
    ready: Family<ContainerLabels, Gauge>,
    adoptions: Family<ContainerLabels, Counter>,
    /// All terminations of the containers this supervisor ran or adopted: Mesos's single
    /// `container_terminations` counter (a `Family` cannot be summed without knowing its
    /// label values).
    terminations_total: Counter,
}

impl SupervisorMetrics {
    /// Creates the metrics under the `csi_plugin` prefix of `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register_in(registry);
        m
    }

    /// Registers these (already counting) metrics under the `csi_plugin` prefix of
    /// `registry`, e.g. a per-provider sub-registry.
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

    fn labels(container: &str) -> ContainerLabels {
        ContainerLabels {
            container: container.to_owned(),
        }
    }

    /// Terminations of `container` with `cause`.
    pub fn terminations(&self, container: &str, cause: TerminationCause) -> u64 {
        self.terminations
            .get_or_create(&TerminationLabels {
                container: container.to_owned(),
                cause,
            })
            .get()
    }

    /// Terminations of the plugins this supervisor ran or adopted, whatever the cause
    /// (Mesos's `csi_plugin/container_terminations`). A leftover of a previous slrp that
    /// recovery stops is not one of them: Mesos's service manager kills such containers
    /// before any container daemon watches them, so its post-stop hook never counts them.
    /// They count only under their container and cause ([`Self::terminations`]).
    pub fn terminations_total(&self) -> u64 {
        self.terminations_total.get()
    }

    /// Restarts of `container`.
    pub fn restarts(&self, container: &str) -> u64 {
        self.restarts.get_or_create(&Self::labels(container)).get()
    }

    /// Adoptions of `container`.
    pub fn adoptions(&self, container: &str) -> u64 {
        self.adoptions.get_or_create(&Self::labels(container)).get()
    }

    pub(crate) fn terminated(&self, container: &str, cause: TerminationCause) {
        self.count_cause(container, cause);
        self.terminations_total.inc();
    }

    fn count_cause(&self, container: &str, cause: TerminationCause) {
        self.terminations
            .get_or_create(&TerminationLabels {
                container: container.to_owned(),
                cause,
            })
            .inc();
    }

    /// A leftover of a previous run stopped by recovery: counted under its container and
    /// cause, not in [`Self::terminations_total`].
    pub(crate) fn stopped_leftover(&self, container: &str) {
        self.count_cause(container, TerminationCause::Stopped);
    }

    pub(crate) fn restarted(&self, container: &str) {
        self.restarts.get_or_create(&Self::labels(container)).inc();
    }

    pub(crate) fn adopted(&self, container: &str) {
        self.adoptions.get_or_create(&Self::labels(container)).inc();
    }

    pub(crate) fn set_ready(&self, container: &str, ready: bool) {
        self.ready
            .get_or_create(&Self::labels(container))
            .set(i64::from(ready));
    }
}
