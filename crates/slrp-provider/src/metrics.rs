//! Per-provider metrics with Mesos's names (spec §9).
//!
//! # Design
//! One [`ProviderMetrics`] per provider, made before anything counts into it. Its parts
//! are the metrics of the layers below, handed to them by the plugin stack and the
//! worker:
//! - [`ProviderMetrics::csi`]: what every CSI client of the provider counts into
//!   (`csi_plugin/rpcs_*`): version detection, `prepareServices`, the volume manager.
//! - [`ProviderMetrics::health_probes`]: what the supervisor's readiness and health
//!   probes count into. Mesos's startup budget (test `CsiPluginRpcMetrics`) has no
//!   periodic probes, so they are kept apart from `csi()` and never reach the
//!   `csi_plugin/rpcs_*` names.
//! - [`ProviderMetrics::supervisor`]: the supervisor's termination counts
//!   (`csi_plugin/container_terminations`, all containers and causes summed).
//! - [`ProviderMetrics::agent`]: the agent client's counters (`agent_*`).
//! - [`ProviderMetrics::operations`]: the worker's operation counts
//!   (`operations/<type>/{pending,finished,failed,dropped}` for the six types Mesos
//!   counts, and `operations/unknown/dropped`; spec §9). In OpenMetrics they are the
//!   families `operations_pending`, `operations_finished`, `operations_failed` and
//!   `operations_dropped` with a `type` label (`unknown` for the DROPPED answers to the
//!   reconciliation of unknown operations).
//!
//! [`ProviderMetrics::snapshot`] gives the Mesos names, prefixed with
//! `resource_providers/<type>.<name>/`, as Mesos's `/metrics/snapshot` does.
//!
//! For OpenMetrics, every provider of a process counts into one [`MetricsFamilies`]:
//! [`MetricsFamilies::provider`] hands out a provider's handles, whose series carry the
//! label `provider="<type>.<name>"`, and [`MetricsFamilies::register`] registers each
//! family once. The text exposition thus has one `# HELP`/`# TYPE` per name holding
//! every provider's series, as Prometheus's parsers require (a second `# TYPE` line for
//! a name is rejected). [`ProviderMetrics::new`] makes a provider with families of its
//! own, for a process (or test) with one provider.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use slrp_core::provider::apply::OperationKind;
use slrp_core::volume::{CallObserver, JobCounts, StateName, VolumeManagerHandle, VolumeRecord};
use slrp_csi::{CsiMetrics, CsiRpc, VolumeId};
use slrp_supervisor::SupervisorMetrics;
use slrp_types::{DisplayChain, ProviderKey};

/// The label that tells providers apart in an OpenMetrics registry.
pub const PROVIDER_LABEL: &str = "provider";

/// The metric families every provider of a process counts into; cheap to clone (clones
/// share the families). Register them once per registry.
#[derive(Clone, Debug, Default)]
pub struct MetricsFamilies {
    csi: CsiMetrics,
    health_probes: CsiMetrics,
    supervisor: SupervisorMetrics,
    agent: slrp_agent::MetricFamilies,
    operations: OperationFamilies,
    volumes: VolumeFamilies,
}

impl MetricsFamilies {
    /// The metrics of the provider with ResourceProviderInfo `type` `rp_type` and
    /// `name` `rp_name`, counting into these families under
    /// `provider="<type>.<name>"`. Make one per provider: a second one for the same
    /// provider would share its exported series but not its snapshot's termination
    /// total.
    pub fn provider(&self, rp_type: &str, rp_name: &str) -> ProviderMetrics {
        let id = ProviderKey::new(rp_type, rp_name, None).to_string();
        ProviderMetrics {
            inner: Arc::new(Inner {
                csi: self.csi.with_label(PROVIDER_LABEL, &id),
                health_probes: self.health_probes.with_label(PROVIDER_LABEL, &id),
                supervisor: self.supervisor.with_label(PROVIDER_LABEL, &id),
                agent: self.agent.with_label(PROVIDER_LABEL, &id),
                operations: self.operations.provider(&id),
                volumes: self.volumes.provider(&id),
                families: self.clone(),
                id,
            }),
        }
    }

    /// Registers the per-RPC (`csi_rpcs_*{rpc=…}`), health-probe (`health_csi_*`),
    /// per-container (`csi_plugin_container_*`), agent client (`agent_*`) and operation
    /// (`operations_*{type=…}`) families into `registry`, each once, with the series of
    /// every provider made from them.
    pub fn register(&self, registry: &mut Registry) {
        self.csi.register_in(registry);
        self.health_probes
            .register_in(registry.sub_registry_with_prefix("health"));
        self.supervisor.register_in(registry);
        self.agent.register(registry);
        self.operations.register(registry);
        self.volumes.register(registry);
    }
}

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
    agent: slrp_agent::Metrics,
    operations: OperationMetrics,
    volumes: VolumeMetrics,
    /// What the handles above count into.
    families: MetricsFamilies,
}

impl ProviderMetrics {
    /// Metrics of the provider with ResourceProviderInfo `type` `rp_type` and `name`
    /// `rp_name`, with families of its own (a process with one provider); their Mesos
    /// names start with `resource_providers/<type>.<name>/`. Several providers of one
    /// registry come from one [`MetricsFamilies`] instead.
    pub fn new(rp_type: &str, rp_name: &str) -> Self {
        MetricsFamilies::default().provider(rp_type, rp_name)
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

    /// What the provider's agent client counts into (`agent_*`).
    pub fn agent(&self) -> slrp_agent::Metrics {
        self.inner.agent.clone()
    }

    /// What the worker counts operations into (`operations/<type>/*`).
    pub fn operations(&self) -> &OperationMetrics {
        &self.inner.operations
    }

    /// What the volume manager reports into (its gauges are refreshed by
    /// [`VolumeMetrics::refresh`], its call latencies observed as they happen).
    pub fn volumes(&self) -> &VolumeMetrics {
        &self.inner.volumes
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
        let prefix = self.prefix();
        values
            .into_iter()
            .map(|(name, v)| (format!("{prefix}{name}"), v))
            .chain(
                self.inner
                    .operations
                    .snapshot()
                    .chain(self.inner.volumes.snapshot())
                    .map(|(name, v)| (format!("{prefix}{name}"), v)),
            )
            .collect()
    }

    /// `resource_providers/<type>.<name>/`.
    pub fn prefix(&self) -> String {
        format!("resource_providers/{}/", self.inner.id)
    }

    /// The families this provider counts into.
    pub fn families(&self) -> &MetricsFamilies {
        &self.inner.families
    }

    /// Registers the families this provider counts into ([`MetricsFamilies::register`]):
    /// its series, labelled `provider="<type>.<name>"`, and those of every other provider
    /// made from the same [`MetricsFamilies`]. Register one set of families once per
    /// registry: two providers made by [`ProviderMetrics::new`] cannot share a registry.
    pub fn register(&self, registry: &mut Registry) {
        self.inner.families.register(registry);
    }
}

/// The label of the operation families that names the operation type.
pub const TYPE_LABEL: &str = "type";

/// Labels of one provider's series of one operation type.
type OperationLabels = Vec<(&'static str, Arc<str>)>;

/// The operation metric families every provider of a process counts into.
#[derive(Clone, Debug, Default)]
struct OperationFamilies {
    pending: Family<OperationLabels, Gauge>,
    finished: Family<OperationLabels, Counter>,
    failed: Family<OperationLabels, Counter>,
    dropped: Family<OperationLabels, Counter>,
}

impl OperationFamilies {
    /// The handles of provider `id`, every series created (Mesos registers all of them
    /// at start, so a snapshot lists them before anything is counted).
    fn provider(&self, id: &str) -> OperationMetrics {
        let provider: Arc<str> = Arc::from(id);
        let labels = |kind: &'static str| -> OperationLabels {
            vec![
                (PROVIDER_LABEL, provider.clone()),
                (TYPE_LABEL, Arc::from(kind)),
            ]
        };
        let kinds = OperationKind::COUNTED.map(|kind| {
            let labels = labels(kind.metric_name().unwrap_or("unsupported"));
            KindMetrics {
                kind,
                pending: self.pending.get_or_create_owned(&labels),
                finished: self.finished.get_or_create_owned(&labels),
                failed: self.failed.get_or_create_owned(&labels),
                dropped: self.dropped.get_or_create_owned(&labels),
            }
        });
        OperationMetrics {
            kinds,
            unknown_dropped: self.dropped.get_or_create_owned(&labels("unknown")),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "operations_pending",
            "Operations currently pending, by type",
            self.pending.clone(),
        );
        registry.register(
            "operations_finished",
            "Operations completed FINISHED, by type",
            self.finished.clone(),
        );
        registry.register(
            "operations_failed",
            "Operations completed FAILED, by type",
            self.failed.clone(),
        );
        registry.register(
            "operations_dropped",
            "Operations DROPPED at acceptance, by type; type unknown: DROPPED answers to \
             the reconciliation of unknown operations",
            self.dropped.clone(),
        );
    }
}

#[derive(Clone, Debug)]
struct KindMetrics {
    kind: OperationKind,
    pending: Gauge,
    finished: Counter,
    failed: Counter,
    dropped: Counter,
}

/// One provider's operation metrics (spec §9); cheap to clone (clones count into the
/// same values). [`OperationKind::Unsupported`] is never counted: Mesos keeps no
/// metrics for the types the master does not send to providers.
#[derive(Clone, Debug)]
pub struct OperationMetrics {
    /// In the order of [`OperationKind::COUNTED`].
    kinds: [KindMetrics; 6],
    unknown_dropped: Counter,
}

impl OperationMetrics {
    fn of(&self, kind: OperationKind) -> Option<&KindMetrics> {
        self.kinds.iter().find(|k| k.kind == kind)
    }

    /// Adds `delta` to `operations/<kind>/pending` (+1 when accepted, −1 when completed).
    pub fn pending(&self, kind: OperationKind, delta: i64) {
        if let Some(k) = self.of(kind) {
            k.pending.inc_by(delta);
        }
    }

    /// Counts an operation completed FINISHED.
    pub fn finished(&self, kind: OperationKind) {
        if let Some(k) = self.of(kind) {
            k.finished.inc();
        }
    }

    /// Counts an operation completed FAILED.
    pub fn failed(&self, kind: OperationKind) {
        if let Some(k) = self.of(kind) {
            k.failed.inc();
        }
    }

    /// Counts an operation DROPPED at acceptance.
    pub fn dropped(&self, kind: OperationKind) {
        if let Some(k) = self.of(kind) {
            k.dropped.inc();
        }
    }

    /// Counts a DROPPED answer to the reconciliation of an unknown operation
    /// (`operations/unknown/dropped`).
    pub fn unknown_dropped(&self) {
        self.unknown_dropped.inc();
    }

    /// The Mesos names (without the provider prefix) and values.
    // Counts stay far below 2^53, so the f64 Mesos's JSON carries is exact.
    #[allow(clippy::cast_precision_loss)]
    fn snapshot(&self) -> impl Iterator<Item = (String, f64)> + '_ {
        self.kinds
            .iter()
            .filter_map(|k| k.kind.metric_name().map(|name| (name, k)))
            .flat_map(|(name, k)| {
                [
                    ("pending", k.pending.get() as f64),
                    ("finished", k.finished.get() as f64),
                    ("failed", k.failed.get() as f64),
                    ("dropped", k.dropped.get() as f64),
                ]
                .map(|(what, v)| (format!("operations/{name}/{what}"), v))
            })
            .chain(std::iter::once((
                "operations/unknown/dropped".to_owned(),
                self.unknown_dropped.get() as f64,
            )))
    }
}

/// The label of the volume families that names a volume state (`CREATED`, …).
pub const STATE_LABEL: &str = "state";
/// The label of the volume call histogram that names the call (`create`, `stage`, …).
pub const CALL_LABEL: &str = "call";
/// The label of the volume call histogram that says how the call ended (`ok`, `failed`).
pub const OUTCOME_LABEL: &str = "outcome";

/// Every volume state, in Mesos's checkpoint order: each gets a series, zero or not.
const VOLUME_STATES: [StateName; 10] = [
    StateName::Created,
    StateName::NodeReady,
    StateName::Published,
    StateName::ControllerPublish,
    StateName::ControllerUnpublish,
    StateName::NodePublish,
    StateName::NodeUnpublish,
    StateName::VolReady,
    StateName::NodeStage,
    StateName::NodeUnstage,
];

/// The kinds of [`JobCounts`] exported, by the name of the `state` label.
const JOB_STATES: [&str; 4] = ["running", "queued", "parked", "deferred"];

/// The volume manager's CSI calls as the latency histogram names them; `None` for the
/// calls that are not a volume's stage (ListVolumes, GetCapacity).
fn call_name(rpc: CsiRpc) -> Option<&'static str> {
    Some(match rpc {
        CsiRpc::CreateVolume => "create",
        CsiRpc::ValidateVolumeCapabilities => "validate",
        CsiRpc::ControllerPublishVolume => "controller_publish",
        CsiRpc::NodeStageVolume => "stage",
        CsiRpc::NodePublishVolume => "publish",
        CsiRpc::NodeUnpublishVolume => "unpublish",
        CsiRpc::NodeUnstageVolume => "unstage",
        CsiRpc::ControllerUnpublishVolume => "controller_unpublish",
        CsiRpc::DeleteVolume => "delete",
        _ => return None,
    })
}

fn call_histogram() -> Histogram {
    // 1 ms to about 9 min: a local plugin answers in milliseconds, a call retried through
    // Mesos's backoff takes minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

type HistogramFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// The volume manager families every provider of a process counts into.
#[derive(Clone, Debug)]
struct VolumeFamilies {
    volumes: Family<OperationLabels, Gauge>,
    jobs: Family<OperationLabels, Gauge>,
    calls: HistogramFamily,
    snapshots: Family<OperationLabels, Gauge>,
    snapshot_bytes: Family<OperationLabels, Gauge>,
}

impl Default for VolumeFamilies {
    fn default() -> Self {
        Self {
            volumes: Family::default(),
            jobs: Family::default(),
            calls: Family::new_with_constructor(call_histogram as fn() -> Histogram),
            snapshots: Family::default(),
            snapshot_bytes: Family::default(),
        }
    }
}

impl VolumeFamilies {
    fn provider(&self, id: &str) -> VolumeMetrics {
        let provider: Arc<str> = Arc::from(id);
        let labelled = |family: &Family<OperationLabels, Gauge>, state: &str| {
            family.get_or_create_owned(&vec![
                (PROVIDER_LABEL, provider.clone()),
                (STATE_LABEL, Arc::from(state)),
            ])
        };
        VolumeMetrics {
            states: VOLUME_STATES.map(|s| (s, labelled(&self.volumes, s.as_str()))),
            jobs: JOB_STATES.map(|j| (j, labelled(&self.jobs, j))),
            calls: self.calls.clone(),
            errors: Arc::default(),
            creates: Arc::default(),
            snapshots: self
                .snapshots
                .get_or_create_owned(&vec![(PROVIDER_LABEL, provider.clone())]),
            snapshot_bytes: self
                .snapshot_bytes
                .get_or_create_owned(&vec![(PROVIDER_LABEL, provider.clone())]),
            provider,
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "volumes",
            "Volumes the volume manager tracks, by state (refreshed on each scrape; the last \
             values while the volume manager is not running or does not answer within 1 s)",
            self.volumes.clone(),
        );
        registry.register(
            "volume_jobs",
            "The volume manager's jobs: running, queued behind another job of their volume, \
             parked at the create gate, deferred until recovery ends (refreshed on each scrape)",
            self.jobs.clone(),
        );
        registry.register(
            "snapshots",
            "Snapshots the volume manager recorded (refreshed on each scrape)",
            self.snapshots.clone(),
        );
        registry.register_with_unit(
            "snapshot",
            "The snapshots' size as their plugin reported it (refreshed on each scrape)",
            Unit::Bytes,
            self.snapshot_bytes.clone(),
        );
        registry.register_with_unit(
            "volume_call_duration",
            "Duration of the volume manager's CSI calls per stage, retries and their \
             backoffs included",
            Unit::Seconds,
            self.calls.clone(),
        );
    }
}

/// A CreateVolume that failed transiently and waits for its next attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRetry {
    /// The last attempt's error, with its cause chain.
    pub last_error: String,
    /// When the next attempt goes out.
    pub next_retry: std::time::SystemTime,
}

/// How long a scrape waits for each of the volume manager's answers.
pub const REFRESH_BOUND: Duration = Duration::from_secs(1);

/// One provider's volume manager metrics; cheap to clone. It is the volume manager's
/// [`CallObserver`].
#[derive(Clone, Debug)]
pub struct VolumeMetrics {
    provider: Arc<str>,
    /// The last failed transition call of each volume still in flight after it.
    errors: Arc<std::sync::Mutex<BTreeMap<String, String>>>,
    /// CreateVolume calls waiting for a retry, by name: the last error and when the next
    /// attempt goes out.
    creates: Arc<std::sync::Mutex<BTreeMap<String, CreateRetry>>>,
    states: [(StateName, Gauge); 10],
    jobs: [(&'static str, Gauge); 4],
    calls: HistogramFamily,
    snapshots: Gauge,
    snapshot_bytes: Gauge,
}

impl VolumeMetrics {
    /// Sets the gauges from the volume manager's records and job counts. While it is not
    /// running (`None`), stopped meanwhile, or slower than [`REFRESH_BOUND`] to answer, the
    /// gauges keep their last values: a plugin restart or a busy manager must neither
    /// show every volume vanishing on a dashboard nor stall the scrape.
    pub async fn refresh(&self, volumes: Option<&VolumeManagerHandle>) {
        let Some(handle) = volumes else {
            return;
        };
        self.refresh_from(handle.volumes(), handle.jobs()).await;
        match tokio::time::timeout(REFRESH_BOUND, handle.snapshots()).await {
            Ok(Ok(snapshots)) => {
                self.snapshots
                    .set(i64::try_from(snapshots.len()).unwrap_or(i64::MAX));
                self.snapshot_bytes
                    .set(snapshots.iter().map(|s| s.size_bytes.max(0)).sum());
            }
            Ok(Err(e)) => self.kept("snapshots", &DisplayChain(&e).to_string()),
            Err(_) => self.timed_out("snapshots"),
        }
    }

    /// [`VolumeMetrics::refresh`] over the two answers, each bounded by [`REFRESH_BOUND`]
    /// (together: they are awaited at once).
    async fn refresh_from<E: std::error::Error + 'static>(
        &self,
        records: impl Future<Output = Result<Vec<VolumeRecord>, E>>,
        jobs: impl Future<Output = Result<JobCounts, E>>,
    ) {
        let (records, jobs) = tokio::join!(
            tokio::time::timeout(REFRESH_BOUND, records),
            tokio::time::timeout(REFRESH_BOUND, jobs)
        );
        match records {
            Ok(Ok(records)) => {
                for (state, gauge) in &self.states {
                    let n = records.iter().filter(|r| r.state.name() == *state).count();
                    gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            Ok(Err(e)) => self.kept("volumes", &DisplayChain(&e).to_string()),
            Err(_) => self.timed_out("volumes"),
        }
        match jobs {
            Ok(Ok(jobs)) => {
                for (kind, gauge) in &self.jobs {
                    let n = match *kind {
                        "running" => jobs.running,
                        "queued" => jobs.queued,
                        "parked" => jobs.parked,
                        _ => jobs.deferred,
                    };
                    gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            Ok(Err(e)) => self.kept("volume_jobs", &DisplayChain(&e).to_string()),
            Err(_) => self.timed_out("volume_jobs"),
        }
    }

    /// A busy or stuck volume manager is worth a warning; a stopped one (plugin restart)
    /// is not, so [`VolumeMetrics::kept`] only debugs.
    fn timed_out(&self, gauges: &str) {
        tracing::warn!(provider = %self.provider, gauges, bound = ?REFRESH_BOUND, "the volume manager did not answer the metrics refresh in time: the gauges keep their last values");
    }

    fn kept(&self, gauges: &str, why: &str) {
        tracing::debug!(provider = %self.provider, gauges, error = why, "the volume manager did not answer the metrics refresh: the gauges keep their last values");
    }

    /// The last failed transition call of volume `id` (the RPC and its cause chain),
    /// until the volume completes a transition.
    pub fn last_error(&self, id: &str) -> Option<String> {
        self.errors().get(id).cloned()
    }

    /// The CreateVolume of `name` if it waits for a retry: its last error and when the
    /// next attempt goes out.
    pub fn create_retry(&self, name: &str) -> Option<CreateRetry> {
        self.creates().get(name).cloned()
    }

    fn creates(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, CreateRetry>> {
        self.creates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn errors(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `volume_manager/volumes/<STATE>` and `volume_manager/jobs/<kind>` (slrp's own
    /// names; Mesos has none for them), as last refreshed.
    // Counts stay far below 2^53, so the f64 is exact.
    #[allow(clippy::cast_precision_loss)]
    fn snapshot(&self) -> impl Iterator<Item = (String, f64)> + '_ {
        let states = self.states.iter().map(|(state, g)| {
            (
                format!("volume_manager/volumes/{}", state.as_str()),
                g.get() as f64,
            )
        });
        let jobs = self
            .jobs
            .iter()
            .map(|(kind, g)| (format!("volume_manager/jobs/{kind}"), g.get() as f64));
        states.chain(jobs)
    }
}

impl CallObserver for VolumeMetrics {
    fn call_ended(&self, rpc: CsiRpc, elapsed: Duration, ok: bool) {
        let Some(call) = call_name(rpc) else {
            return;
        };
        self.calls
            .get_or_create(&vec![
                (PROVIDER_LABEL, self.provider.clone()),
                (CALL_LABEL, Arc::from(call)),
                (OUTCOME_LABEL, Arc::from(if ok { "ok" } else { "failed" })),
            ])
            .observe(elapsed.as_secs_f64());
    }

    fn volume_call_failed(&self, id: &VolumeId, error: &str) {
        self.errors()
            .insert(id.as_str().to_owned(), error.to_owned());
    }

    fn volume_moved(&self, id: &VolumeId) {
        let mut errors = self.errors();
        if !errors.is_empty() {
            errors.remove(id.as_str());
        }
    }

    fn create_retrying(&self, name: &str, error: &str, next_retry_in: Duration) {
        self.creates().insert(
            name.to_owned(),
            CreateRetry {
                last_error: error.to_owned(),
                next_retry: std::time::SystemTime::now() + next_retry_in,
            },
        );
    }

    fn create_ended(&self, name: &str) {
        let mut creates = self.creates();
        if !creates.is_empty() {
            creates.remove(name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The gauges of `m`'s volume metrics, in order (states, then jobs).
    fn volume_gauges(m: &VolumeMetrics) -> Vec<i64> {
        let states = m.states.iter().map(|(_, g)| g.get());
        states.chain(m.jobs.iter().map(|(_, g)| g.get())).collect()
    }

    /// A volume manager that does not answer, or answers with an error, leaves the
    /// gauges as they were, and a scrape waits at most [`REFRESH_BOUND`] for it.
    #[tokio::test(start_paused = true)]
    async fn a_silent_or_failing_volume_manager_keeps_the_last_values_within_the_bound() {
        let m = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "test");
        let v = m.volumes();
        for (i, (_, g)) in v.states.iter().enumerate() {
            g.set(i64::try_from(i).unwrap() + 1);
        }
        for (_, g) in &v.jobs {
            g.set(7);
        }
        let before = volume_gauges(v);

        let started = tokio::time::Instant::now();
        v.refresh_from(
            std::future::pending::<Result<Vec<VolumeRecord>, slrp_core::volume::VolumeError>>(),
            std::future::pending(),
        )
        .await;
        assert_eq!(
            started.elapsed(),
            REFRESH_BOUND,
            "both answers are awaited at once"
        );
        assert_eq!(volume_gauges(v), before);

        v.refresh_from(
            std::future::ready(Err(slrp_core::volume::VolumeError::Stopped)),
            std::future::ready(Err(slrp_core::volume::VolumeError::Stopped)),
        )
        .await;
        assert_eq!(volume_gauges(v), before);
        v.refresh(None).await;
        assert_eq!(volume_gauges(v), before);

        // An answer still counts: the jobs are read, the silent records keep theirs.
        v.refresh_from(
            std::future::pending::<Result<Vec<VolumeRecord>, slrp_core::volume::VolumeError>>(),
            std::future::ready(Ok(JobCounts::default())),
        )
        .await;
        let after = volume_gauges(v);
        assert_eq!(after[..10], before[..10]);
        assert_eq!(after[10..], [0, 0, 0, 0]);
    }

    #[test]
    fn snapshot_names_are_mesos_names_under_the_provider_prefix() {
        let m = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "test");
        let snap = m.snapshot();
        let prefix = "resource_providers/org.apache.mesos.rp.local.storage.test/";
        let names: Vec<&str> = snap
            .keys()
            .map(|k| k.strip_prefix(prefix).unwrap())
            .collect();
        let mut expected = vec![
            "csi_plugin/container_terminations".to_owned(),
            "csi_plugin/rpcs_cancelled".to_owned(),
            "csi_plugin/rpcs_failed".to_owned(),
            "csi_plugin/rpcs_finished".to_owned(),
            "csi_plugin/rpcs_pending".to_owned(),
            "operations/unknown/dropped".to_owned(),
        ];
        for kind in [
            "reserve",
            "unreserve",
            "create",
            "destroy",
            "create_disk",
            "destroy_disk",
        ] {
            for what in ["pending", "finished", "failed", "dropped"] {
                expected.push(format!("operations/{kind}/{what}"));
            }
        }
        // slrp's own volume manager names, beside Mesos's.
        for kind in ["running", "queued", "parked", "deferred"] {
            expected.push(format!("volume_manager/jobs/{kind}"));
        }
        for state in VOLUME_STATES {
            expected.push(format!("volume_manager/volumes/{}", state.as_str()));
        }
        expected.sort();
        assert_eq!(names, expected);
        assert!(snap.values().all(|v| *v == 0.0));
    }

    #[test]
    fn operations_count_by_type_in_the_snapshot() {
        let m = ProviderMetrics::new("org.apache.mesos.rp.local.storage", "test");
        let ops = m.operations();
        ops.pending(OperationKind::CreateDisk, 1);
        ops.pending(OperationKind::CreateDisk, 1);
        ops.pending(OperationKind::CreateDisk, -1);
        ops.finished(OperationKind::CreateDisk);
        ops.failed(OperationKind::DestroyDisk);
        ops.dropped(OperationKind::Reserve);
        ops.unknown_dropped();
        // Never counted under a type.
        ops.pending(OperationKind::Unsupported, 5);
        ops.finished(OperationKind::Unsupported);
        // A clone counts into the same values.
        m.clone().operations().dropped(OperationKind::Reserve);
        let snap = m.snapshot();
        let value = |name: &str| {
            snap[&format!("resource_providers/org.apache.mesos.rp.local.storage.test/{name}")]
        };
        assert_eq!(value("operations/create_disk/pending"), 1.0);
        assert_eq!(value("operations/create_disk/finished"), 1.0);
        assert_eq!(value("operations/destroy_disk/failed"), 1.0);
        assert_eq!(value("operations/reserve/dropped"), 2.0);
        assert_eq!(value("operations/unknown/dropped"), 1.0);
        let total: f64 = snap.values().sum();
        assert_eq!(total, 6.0, "nothing else counted: {snap:?}");
    }

    const TYPE: &str = "org.apache.mesos.rp.local.storage";

    /// A registry with the families of two providers `a` and `b` of type [`TYPE`].
    fn two_providers() -> (Registry, ProviderMetrics, ProviderMetrics) {
        let families = MetricsFamilies::default();
        let mut reg = Registry::default();
        families.register(&mut reg);
        let a = families.provider(TYPE, "a");
        let b = families.provider(TYPE, "b");
        (reg, a, b)
    }

    #[test]
    fn operation_families_carry_type_and_provider_labels() {
        let (reg, a, b) = two_providers();
        a.operations().pending(OperationKind::CreateDisk, 1);
        b.operations().finished(OperationKind::Destroy);
        b.operations().unknown_dropped();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let parsed = families_of(&text).unwrap_or_else(|e| panic!("{e} in:\n{text}"));
        let has = |family: &str, sample: String| {
            assert!(
                parsed[family].contains(&sample.as_str()),
                "{sample} missing in:\n{text}"
            );
        };
        has(
            "operations_pending",
            format!("operations_pending{{provider=\"{TYPE}.a\",type=\"create_disk\"}} 1"),
        );
        has(
            "operations_pending",
            format!("operations_pending{{provider=\"{TYPE}.b\",type=\"create_disk\"}} 0"),
        );
        has(
            "operations_finished",
            format!("operations_finished_total{{provider=\"{TYPE}.b\",type=\"destroy\"}} 1"),
        );
        has(
            "operations_dropped",
            format!("operations_dropped_total{{provider=\"{TYPE}.b\",type=\"unknown\"}} 1"),
        );
        has(
            "operations_failed",
            format!("operations_failed_total{{provider=\"{TYPE}.a\",type=\"reserve\"}} 0"),
        );
        // Six types (and `unknown` for dropped) for each of the two providers.
        assert_eq!(parsed["operations_pending"].len(), 12);
        assert_eq!(parsed["operations_dropped"].len(), 14);
    }

    /// The families of an OpenMetrics text (name → its sample lines), or what makes the
    /// text unscrapeable: a second `# TYPE` for a name, a sample outside the family
    /// its descriptor opened, or no `# EOF` at the end.
    fn families_of(text: &str) -> Result<BTreeMap<&str, Vec<&str>>, String> {
        let mut families: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut current = None;
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            if line == "# EOF" {
                return match lines.peek() {
                    None => Ok(families),
                    Some(after) => Err(format!("{after:?} after # EOF")),
                };
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default();
                if families.insert(name, Vec::new()).is_some() {
                    return Err(format!("a second # TYPE line for {name}"));
                }
                current = Some(name);
            } else if !line.starts_with('#') {
                let sample = line.split(['{', ' ']).next().unwrap_or_default();
                match current {
                    Some(family) if sample.starts_with(family) => {
                        families.entry(family).or_default().push(line);
                    }
                    _ => return Err(format!("sample {line:?} outside its family")),
                }
            }
        }
        Err("no # EOF".to_owned())
    }

    #[test]
    fn two_providers_make_one_scrapeable_page() {
        let (reg, a, b) = two_providers();
        // Something counted by each part of each provider (the getters create series).
        for m in [&a, &b] {
            let _ = m.csi().finished_total();
            let _ = m.health_probes().finished_total();
            let _ = m
                .supervisor()
                .terminations("plugin", slrp_supervisor::TerminationCause::Exited);
            m.agent().calls.inc();
        }
        a.agent().calls.inc();

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let parsed = families_of(&text).unwrap_or_else(|e| panic!("{e} in:\n{text}"));
        for family in [
            "csi_rpcs_finished",
            "health_csi_rpcs_finished",
            "csi_plugin_container_terminations",
            "agent_calls",
        ] {
            let samples = &parsed[family];
            for p in ["a", "b"] {
                let label = format!("{{provider=\"{TYPE}.{p}\"");
                assert!(
                    samples.iter().any(|s| s.contains(&label)),
                    "{family}: no series of {p} in:\n{text}"
                );
            }
            assert!(
                samples.iter().all(|s| s.contains("{provider=\"")),
                "{family}: a series without its provider in:\n{text}"
            );
        }
        let calls = &parsed["agent_calls"];
        assert!(
            calls
                .contains(&"agent_calls_total{provider=\"org.apache.mesos.rp.local.storage.a\"} 2"),
            "{calls:?}"
        );
        assert!(
            calls
                .contains(&"agent_calls_total{provider=\"org.apache.mesos.rp.local.storage.b\"} 1"),
            "{calls:?}"
        );
    }

    #[test]
    fn the_check_rejects_a_repeated_type() {
        let text = "# TYPE x counter\nx_total 1\n# TYPE x counter\nx_total 2\n# EOF\n";
        assert!(families_of(text).unwrap_err().contains("second # TYPE"));
        let text = "# TYPE x counter\nx_total 1\n# TYPE y counter\nx_total 2\n# EOF\n";
        assert!(
            families_of(text)
                .unwrap_err()
                .contains("outside its family")
        );
        assert!(families_of("# TYPE x counter\nx_total 1\n").is_err());
    }

    #[test]
    fn two_providers_count_apart_in_shared_families() {
        let families = MetricsFamilies::default();
        let a = families.provider("org.apache.mesos.rp.local.storage", "a");
        let b = families.provider("org.apache.mesos.rp.local.storage", "b");
        let mut reg = Registry::default();
        a.register(&mut reg);
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
