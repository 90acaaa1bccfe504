//! The provider worker: subscribes to the resource provider manager and keeps its view of
//! the provider's storage true (spec §2.7, §2.8, §3, §6.5, §7.3).
//!
//! # Design
//! [`Provider::spawn`] recovers the durable state ([`ProviderState`], keyed by the agent
//! id) before anything connects, then starts the agent client and one task that owns
//! everything else. That task reacts to session events and runs the provider's work one
//! job at a time (Mesos's provider-wide sequence): the subscription reconciliation after
//! every SUBSCRIBED, the periodic reconciliation and the profile change. A job gathers
//! GetCapacity per profile and ListVolumes concurrently while the task keeps reading
//! events, so events that arrive during a reconciliation are queued, dropped or answered
//! as [`disposition`] says instead of waiting in the channel.
//!
//! The lifecycle follows spec §3.2 with the fixes of §12: READY only after the
//! subscription reconciliation's UPDATE_STATE was accepted *in the same session* (a
//! reconciliation that finishes after a disconnect does not set READY, §12 item 9); the
//! periodic loop and the profile watch start once per process, at the first READY, and a
//! resubscription only reconciles and sends UPDATE_STATE (§12 item 8); failed
//! reconciliations and UPDATE_STATEs are retried with jittered backoff, never fatal
//! (§12 items 12, 13). Only a failed store write is fatal (conventions §4.4 rule 5).
//!
//! Operations (APPLY, ACKNOWLEDGE, RECONCILE, PUBLISH in READY) reach
//! `Worker::on_ready_event` and are carried out by the `ops` submodule: durable before
//! applied, disk operations concurrent and never overlapping a reconciliation (deferred,
//! not dropped), the status update manager driven by one timer, paused when not READY.

mod ops;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt as _, OptionFuture, join_all};
use futures_util::stream::{FuturesUnordered, StreamExt};
use slrp_agent::operator::OperatorError;
use slrp_agent::{AgentClient, AgentConfig, AgentError, AgentHandle, SessionEvent};
use slrp_core::provider::apply::OperationKind;
use slrp_core::provider::lifecycle::{
    DEFAULT_PENDING_EVENTS, Disposition, EventKind, Lifecycle, PendingEvents, disposition,
};
use slrp_core::provider::operations::{
    Operations, StatusRetry, load_operations, stage_operation_removal,
};
use slrp_core::provider::resources::{
    DisplayResource, ProfileChange, ProviderResources, ResourceError, Resources,
};
use slrp_core::provider::state::{ProviderState, StateError};
use slrp_core::volume::{MountPaths, VolumeError, VolumeManagerHandle};
use slrp_profiles::{ProfileAdaptorHandle, ProfileInfo, ProfileView, ProviderKey};
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call};
use slrp_proto::mesos::v1::{ResourceProviderId, ResourceProviderInfo, Uuid};
use slrp_store::Store;
use slrp_types::{Backoff, DisplayChain, Jitter, JitterRng, VolumeCapability};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::metrics::ProviderMetrics;

/// How long a total changed by operations waits at least before [`ProviderStatus::total`]
/// shows it (the status is for observers; the manager hears of changes through operation
/// statuses and UPDATE_STATE, which are not delayed). See [`status_total_delay`].
pub const STATUS_TOTAL_INTERVAL: Duration = Duration::from_millis(50);

/// The longest a total changed by operations waits before the status shows it.
pub const STATUS_TOTAL_MAX_INTERVAL: Duration = Duration::from_secs(1);

/// How long a total of `entries` entries changed by operations waits before the status
/// shows it: [`STATUS_TOTAL_INTERVAL`] plus 50 µs per entry, at most
/// [`STATUS_TOTAL_MAX_INTERVAL`]. The copy costs about a microsecond per entry, so it
/// takes a bounded share of the worker's time whatever the volume count (at a fixed
/// 50 ms, copying 10,000 entries was most of the worker's allocations under load).
pub fn status_total_delay(entries: usize) -> Duration {
    let per_entry =
        Duration::from_micros(50).saturating_mul(u32::try_from(entries).unwrap_or(u32::MAX));
    STATUS_TOTAL_INTERVAL
        .saturating_add(per_entry)
        .min(STATUS_TOTAL_MAX_INTERVAL)
}

/// Most ready events one turn of the worker loop handles before committing them together.
const MAX_TURN: usize = 256;

/// Mesos's `DEFAULT_STORAGE_RECONCILIATION_INTERVAL`.
pub const DEFAULT_RECONCILIATION_INTERVAL: Duration = Duration::from_secs(10);

/// What one provider is and where its manager is.
#[derive(Debug, Clone)]
pub struct ProviderParams {
    /// The validated ResourceProviderInfo, `id` unset (the durable state supplies it).
    pub info: ResourceProviderInfo,
    /// How to reach the manager.
    pub agent: AgentConfig,
    /// The agent id (learnt by the daemon with `slrp_agent::operator::get_agent_id`). The
    /// provider's durable identity is keyed by it (spec §3.6, §8.6): a new agent id is a
    /// new provider identity.
    pub agent_id: String,
    /// `None` disables periodic reconciliation (non-positive
    /// `reconciliation_interval_seconds`).
    pub reconciliation_interval: Option<Duration>,
    /// Waits between attempts of a failed UPDATE_STATE in the same session.
    pub update_backoff: Backoff,
    /// Waits between attempts of a failed reconciliation (GetCapacity or ListVolumes
    /// failed, or its result did not apply).
    pub retry_backoff: Backoff,
    /// How the waits above are drawn below their ceiling.
    pub jitter: Jitter,
    /// At most this many ACKNOWLEDGE_OPERATION_STATUS / RECONCILE_OPERATIONS events wait
    /// for READY; beyond it the oldest ACK is dropped.
    pub pending_events: usize,
    /// ListVolumes page size (`max_entries`; 0 lets the plugin choose).
    pub list_page_size: i32,
    /// When the manager does not admit the provider's subscription, ask the agent for its
    /// id (GET_AGENT); a new agent id switches to that id's identity in this process
    /// (spec §3.6: a new provider identity, volumes reappear as pre-existing).
    pub follow_agent_id: bool,
    /// How unacknowledged operation status updates are resent (spec §8.5; Mesos: 10 s
    /// doubling to 10 min).
    pub status_retry: StatusRetry,
    /// Where the volume manager publishes volumes (`<root>/<enc(id)>/target`): DESTROY of
    /// a persistent MOUNT volume removes its data there (spec §5.3). `None` fails such a
    /// DESTROY.
    pub mount_paths: Option<MountPaths>,
    /// At most this many PUBLISH_RESOURCES are carried out at once; more are answered
    /// FAILED at once.
    pub max_publishes: usize,
}

/// Default of [`ProviderParams::max_publishes`].
pub const DEFAULT_MAX_PUBLISHES: usize = 1024;

impl ProviderParams {
    /// Defaults: the interval from `info` ([`reconciliation_interval`]), backoff 1 s
    /// doubling to 1 min with full jitter, 1024 pending events, plugin-chosen pages.
    pub fn new(info: ResourceProviderInfo, agent: AgentConfig, agent_id: String) -> Self {
        let backoff = Backoff::PLUGIN_RESTART;
        Self {
            reconciliation_interval: reconciliation_interval(&info),
            info,
            agent,
            agent_id,
            update_backoff: backoff,
            retry_backoff: backoff,
            jitter: Jitter::Full,
            pending_events: DEFAULT_PENDING_EVENTS,
            list_page_size: 0,
            follow_agent_id: true,
            status_retry: StatusRetry::default(),
            mount_paths: None,
            max_publishes: DEFAULT_MAX_PUBLISHES,
        }
    }
}

/// The periodic reconciliation interval of `info`: `reconciliation_interval_seconds`
/// (default 10 s); zero, negative or not finite disables it.
///
/// Differences from Mesos (spec §12 item 30): fractions of a second are kept (Mesos
/// truncates, so 0.5 disables it there) and a negative value disables the loop as the
/// proto documents (Mesos lets it fire without delay).
pub fn reconciliation_interval(info: &ResourceProviderInfo) -> Option<Duration> {
    let seconds = info
        .storage
        .as_ref()
        .and_then(|s| s.reconciliation_interval_seconds);
    match seconds {
        None => Some(DEFAULT_RECONCILIATION_INTERVAL),
        Some(s) if s.is_finite() && s > 0.0 => Duration::try_from_secs_f64(s).ok(),
        Some(_) => None,
    }
}

/// What the worker uses from the layers around it.
#[derive(Debug, Clone)]
pub struct ProviderDeps {
    /// The provider's volume manager (GetCapacity, ListVolumes).
    pub volumes: VolumeManagerHandle,
    /// The provider's store: its durable state lives beside the volume records.
    pub store: Store,
    /// `None`: no profiles (no storage pools), as a Mesos agent without an adaptor.
    pub profiles: Option<ProfileAdaptorHandle>,
    /// The provider's metrics (the worker counts the operation metrics, spec §9).
    pub metrics: ProviderMetrics,
    /// What the agent client counts into.
    pub agent_metrics: slrp_agent::Metrics,
}

/// Errors of the provider worker.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The ResourceProviderInfo cannot serve as a storage provider.
    #[error("resource provider {provider}: {problem}")]
    Info {
        /// `<type>.<name>`.
        provider: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// The plugin name or the default reservations are unusable.
    #[error("resource provider {provider}: invalid resource context")]
    Resources {
        /// `<type>.<name>`.
        provider: String,
        /// Why.
        #[source]
        source: ResourceError,
    },
    /// Recovering the durable state failed (Mesos: "Failed to recover resource provider
    /// with type '…' and name '…'").
    #[error("Failed to recover resource provider with type '{rp_type}' and name '{rp_name}'")]
    Recover {
        /// `ResourceProviderInfo.type`.
        rp_type: String,
        /// `ResourceProviderInfo.name`.
        rp_name: String,
        /// Why.
        #[source]
        source: Box<StateError>,
    },
    /// Writing the durable state failed; the process should exit and recover from disk.
    #[error("resource provider {provider}: checkpointing the provider state failed")]
    Checkpoint {
        /// `<type>.<name>`.
        provider: String,
        /// Why.
        #[source]
        source: Box<StateError>,
    },
    /// The agent client refused its configuration.
    #[error("resource provider {provider}: agent client")]
    Agent {
        /// `<type>.<name>`.
        provider: String,
        /// Why.
        #[source]
        source: slrp_agent::ConfigError,
    },
    /// The agent client stopped without being cancelled.
    #[error("resource provider {provider}: the agent client stopped")]
    AgentStopped {
        /// `<type>.<name>`.
        provider: String,
    },
    /// The worker task panicked.
    #[error("resource provider worker task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// What a provider looks like from outside.
#[derive(Clone, Debug)]
pub struct ProviderStatus {
    /// Where the lifecycle is.
    pub lifecycle: Lifecycle,
    /// The agent id the identity belongs to.
    pub agent_id: String,
    /// The provider id, once assigned.
    pub provider_id: Option<String>,
    /// The total resources last computed (after operations, within
    /// [`status_total_delay`]), in the total's order ([`Resources::iter`]). Shared
    /// copy-on-write with the worker's own total, not a copy of it: at rest the process
    /// holds the total once.
    pub total: Resources,
    /// The last failure (a session that ended, a reconciliation, an UPDATE_STATE), with
    /// its cause chain; cleared by the next accepted UPDATE_STATE.
    pub last_error: Option<String>,
    /// Reconciliations completed (successfully) since the start.
    pub reconciliations: u64,
    /// UPDATE_STATE calls the manager accepted since the start.
    pub updates_sent: u64,
    /// What happened to the manager's events.
    pub events: EventStats,
    /// Operations tracked (PENDING, and terminal ones until their status is acknowledged).
    pub operations: usize,
    /// Operations with a status update not yet acknowledged.
    pub unacknowledged: usize,
}

/// Counts of manager events by what the lifecycle made of them (spec §3.5, §3.6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventStats {
    /// ACKNOWLEDGE_OPERATION_STATUS / RECONCILE_OPERATIONS waiting for READY now.
    pub queued: usize,
    /// Queued events dropped because the queue was full.
    pub overflowed: u64,
    /// APPLY_OPERATIONs dropped before READY (OPERATION_DROPPED, reliably).
    pub dropped: u64,
    /// PUBLISH_RESOURCES answered FAILED before READY.
    pub publish_failed: u64,
    /// Events handed to the READY-state handling.
    pub handled: u64,
}

/// Observes a running provider. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ProviderHandle {
    status: watch::Receiver<ProviderStatus>,
}

impl ProviderHandle {
    /// The provider's status, kept current by the worker.
    pub fn status(&self) -> watch::Receiver<ProviderStatus> {
        self.status.clone()
    }
}

/// The worker's task. Awaiting it yields the worker's end: `Ok` on cancel, `Err` on a
/// fatal error (a failed checkpoint, a stopped agent client, a panic).
#[derive(Debug)]
pub struct ProviderTask {
    join: JoinHandle<Result<(), ProviderError>>,
}

impl Future for ProviderTask {
    type Output = Result<(), ProviderError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.join)
            .poll(cx)
            .map(|joined| joined.unwrap_or_else(|e| Err(ProviderError::Task(e))))
    }
}

/// Entry point: [`Provider::spawn`].
#[derive(Debug)]
pub struct Provider;

impl Provider {
    /// Recovers the durable provider state of `params.agent_id` (before subscribing), then
    /// starts the agent client (with the recovered provider id, if any) and the worker.
    /// The worker runs until `cancel` fires or it fails fatally.
    ///
    /// # Errors
    /// [`ProviderError::Info`] without `storage.plugin`; [`ProviderError::Resources`] for
    /// an unusable plugin name or default reservations; [`ProviderError::Recover`] if the
    /// state cannot be read or a storage pool's profile is missing from it;
    /// [`ProviderError::Agent`] for an unusable agent configuration.
    pub async fn spawn(
        params: ProviderParams,
        deps: ProviderDeps,
        cancel: CancellationToken,
    ) -> Result<(ProviderHandle, ProviderTask), ProviderError> {
        let info = &params.info;
        let label = format!("{}.{}", info.r#type, info.name);
        let Some(plugin) = info.storage.as_ref().map(|s| &s.plugin) else {
            return Err(ProviderError::Info {
                provider: label,
                problem: "no storage.plugin",
            });
        };
        let Some(plugin_name) = plugin.name.clone() else {
            return Err(ProviderError::Info {
                provider: label,
                problem: "no storage.plugin.name",
            });
        };
        let plugin_type = plugin.r#type.clone();
        let reservations = info.default_reservations.clone();
        // Checks the plugin name and reservations now rather than at the first SUBSCRIBED.
        let context = |id: ResourceProviderId| {
            ProviderResources::new(id, &plugin_type, &plugin_name, reservations.clone())
        };
        context(ResourceProviderId::default()).map_err(|source| ProviderError::Resources {
            provider: label.clone(),
            source,
        })?;

        let (state, tracked) = recover_identity(&deps, &params, &params.agent_id).await?;
        tracing::info!(
            provider = %label,
            agent_id = %params.agent_id,
            provider_id = ?state.provider_id.as_ref().map(|id| &id.value),
            resources = %state.total,
            "recovered resource provider state"
        );
        let ctx = match &state.provider_id {
            Some(id) => Some(
                context(id.clone()).map_err(|source| ProviderError::Resources {
                    provider: label.clone(),
                    source,
                })?,
            ),
            None => None,
        };

        let cancel = cancel.child_token();
        let client_cancel = cancel.child_token();
        let (agent, sessions) = AgentClient::spawn(
            params.agent.clone(),
            params.info.clone(),
            state.provider_id.clone(),
            deps.agent_metrics.clone(),
            client_cancel.clone(),
        )
        .map_err(|source| ProviderError::Agent {
            provider: label.clone(),
            source,
        })?;

        let (status_tx, status) = watch::channel(ProviderStatus {
            lifecycle: Lifecycle::Disconnected,
            agent_id: params.agent_id.clone(),
            provider_id: state.provider_id.as_ref().map(|id| id.value.clone()),
            total: state.total.clone(),
            last_error: None,
            reconciliations: 0,
            updates_sent: 0,
            events: EventStats::default(),
            operations: tracked.len(),
            unacknowledged: 0,
        });
        let key = ProviderKey::new(
            info.r#type.clone(),
            info.name.clone(),
            Some(plugin.r#type.clone()),
        );
        let mut worker = Worker {
            label: label.clone(),
            key,
            plugin: (plugin_type.clone(), plugin_name.clone()),
            agent,
            sessions,
            client_cancel,
            agent_check: None,
            status: status_tx,
            lifecycle: Lifecycle::Disconnected,
            session: 0,
            ctx,
            live_profiles: state.profiles.clone(),
            profiles_basis: None,
            state,
            pending_events: PendingEvents::new(params.pending_events),
            ops: ops::OpFlow::new(tracked),
            batch: ops::Batch::default(),
            resource_version: uuid::Uuid::new_v4(),
            jobs: Jobs::default(),
            job: None,
            retry: None,
            job_failures: 0,
            listed_twice: crate::warn_once::WarnOnChange::default(),
            periodic: None,
            loops_started: false,
            watch: None,
            update_needed: false,
            sending: None,
            send_seq: 0,
            ready_from_send: None,
            send_retry: None,
            send_failures: 0,
            status_total: None,
            replies: FuturesUnordered::new(),
            jitter: JitterRng::new(params.jitter),
            deps,
            params,
        };
        worker.after_ops_change();
        let span = tracing::info_span!(parent: None, "provider", provider = %label);
        let join = tokio::spawn(worker.run(cancel).instrument(span));
        Ok((ProviderHandle { status }, ProviderTask { join }))
    }
}

/// The jobs of the provider-wide sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    /// After SUBSCRIBED: reconcile, always send UPDATE_STATE, then READY.
    Subscription,
    /// The periodic reconciliation.
    Periodic,
    /// The profile set changed: update the profile map, then reconcile.
    Profiles,
    /// A DESTROY_DISK freed space of no live profile: reconcile the pools (§5.5 step 3).
    Pools,
}

impl JobKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Subscription => "subscription reconciliation",
            Self::Periodic => "periodic reconciliation",
            Self::Profiles => "profile update",
            Self::Pools => "storage pool reconciliation",
        }
    }
}

/// Jobs waiting to run: at most one of each kind (a second request joins the first).
#[derive(Debug, Default)]
struct Jobs {
    subscription: bool,
    periodic: bool,
    profiles: bool,
    pools: bool,
}

impl Jobs {
    fn mark(&mut self, kind: JobKind) {
        match kind {
            JobKind::Subscription => self.subscription = true,
            JobKind::Periodic => self.periodic = true,
            JobKind::Profiles => self.profiles = true,
            JobKind::Pools => self.pools = true,
        }
    }

    /// Whether a job waits that may start in `state`.
    fn waiting(&self, state: Lifecycle) -> bool {
        match state {
            Lifecycle::Ready => self.subscription || self.periodic || self.profiles || self.pools,
            state if state.is_subscribed() => self.subscription,
            _ => false,
        }
    }

    /// The next job that may start in `state`: the subscription reconciliation once
    /// subscribed, the others only when READY.
    fn take(&mut self, state: Lifecycle) -> Option<JobKind> {
        if !state.is_subscribed() {
            return None;
        }
        if std::mem::take(&mut self.subscription) {
            return Some(JobKind::Subscription);
        }
        if state != Lifecycle::Ready {
            return None;
        }
        if std::mem::take(&mut self.profiles) {
            return Some(JobKind::Profiles);
        }
        if std::mem::take(&mut self.pools) {
            return Some(JobKind::Pools);
        }
        std::mem::take(&mut self.periodic).then_some(JobKind::Periodic)
    }
}

/// What a reconciliation learnt from the plugin (and, for a profile job, the adaptor).
struct Gathered {
    /// The profile map to use from now on.
    profiles: BTreeMap<String, ProfileInfo>,
    /// Available bytes per profile.
    capacities: Vec<(String, u64)>,
    /// Every volume the plugin lists.
    listing: Vec<slrp_csi::Volume>,
}

/// Why a reconciliation failed.
#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("GetCapacity for profile {profile:?}")]
    Capacity {
        profile: String,
        #[source]
        source: VolumeError,
    },
    #[error("the capability of profile {profile:?} is not usable")]
    Capability {
        profile: String,
        #[source]
        source: slrp_types::CapabilityError,
    },
    #[error("ListVolumes")]
    List(#[source] VolumeError),
    #[error("applying the reconciled resources")]
    Apply(#[source] ResourceError),
}

struct JobDone {
    kind: JobKind,
    session: u64,
    /// `OpFlow::identity` when it started: a job of an older identity listed another
    /// identity's volumes against another total.
    identity: u64,
    result: Result<Gathered, ReconcileError>,
}

struct SendDone {
    seq: u64,
    session: u64,
    result: Result<(), AgentError>,
}

struct Worker {
    label: String,
    key: ProviderKey,
    plugin: (String, String),
    params: ProviderParams,
    deps: ProviderDeps,
    agent: AgentHandle,
    sessions: mpsc::Receiver<SessionEvent>,
    /// Stops the current agent client (replaced when the agent id changes).
    client_cancel: CancellationToken,
    /// GET_AGENT after a subscription that was not admitted.
    agent_check: Option<BoxFuture<'static, Result<String, OperatorError>>>,
    status: watch::Sender<ProviderStatus>,
    lifecycle: Lifecycle,
    /// Counts SUBSCRIBED events: results of an older session do not make this one READY.
    session: u64,
    /// The resource context, once a provider id is known.
    ctx: Option<ProviderResources>,
    /// Identity, total and the checkpointed pool profiles.
    state: ProviderState,
    /// The profile map (§7.3): every profile translated for this provider.
    live_profiles: BTreeMap<String, ProfileInfo>,
    /// `live_profiles` when `state.profiles` was last computed from the whole total: while
    /// the map is the same, a commit updates only the profiles of the pools it touched.
    profiles_basis: Option<BTreeMap<String, ProfileInfo>>,
    pending_events: PendingEvents,
    /// Tracked operations, running disk operations, deferred ones, the status timer.
    ops: ops::OpFlow,
    /// This turn's uncommitted changes and what waits for them; empty between turns.
    batch: ops::Batch,
    /// The resource version (spec §6.6): changed with every change of the total the
    /// agent does not learn from an operation status, and sent in UPDATE_STATE.
    resource_version: uuid::Uuid,
    jobs: Jobs,
    job: Option<BoxFuture<'static, JobDone>>,
    /// A failed job waits here for its next attempt.
    retry: Option<(Pin<Box<Sleep>>, JobKind)>,
    job_failures: u32,
    /// Volumes the plugin lists twice, warned about once per change (`warn_once`).
    listed_twice: crate::warn_once::WarnOnChange,
    periodic: Option<Pin<Box<Sleep>>>,
    /// The periodic loop and the profile watch run once per process (§3.6).
    loops_started: bool,
    watch: Option<watch::Receiver<ProfileView>>,
    update_needed: bool,
    sending: Option<BoxFuture<'static, SendDone>>,
    send_seq: u64,
    /// READY comes with the first accepted UPDATE_STATE numbered at least this, sent in
    /// the session that ran the subscription reconciliation.
    ready_from_send: Option<(u64, u64)>,
    send_retry: Option<Pin<Box<Sleep>>>,
    send_failures: u32,
    /// Set when operations changed the total: the status gets it when this fires.
    /// Copying a 10,000-volume total into the status after every operation made each
    /// operation's cost grow with the volume count; batched, it is one copy per interval.
    status_total: Option<Pin<Box<Sleep>>>,
    /// Answers to events (UPDATE_PUBLISH_RESOURCES_STATUS); failures are logged.
    replies: FuturesUnordered<BoxFuture<'static, ()>>,
    jitter: JitterRng,
}

/// Waits for an optional timer; pending forever without one.
async fn fire(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn changed(watch: &mut Option<watch::Receiver<ProfileView>>) -> bool {
    match watch {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

impl Worker {
    async fn run(mut self, cancel: CancellationToken) -> Result<(), ProviderError> {
        loop {
            Box::pin(self.start_work()).await?;
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                Some(done) = self.ops.acks.next(), if !self.ops.acks.is_empty() => {
                    self.on_ack_durable(done)?;
                }
                session = self.sessions.recv() => match session {
                    Some(session) => Box::pin(self.on_session(session)).await?,
                    None if cancel.is_cancelled() => return Ok(()),
                    None => return Err(ProviderError::AgentStopped { provider: self.label.clone() }),
                },
                Some(done) = OptionFuture::from(self.job.as_mut()) => {
                    self.job = None;
                    self.on_job_done(done).await?;
                }
                Some(checked) = OptionFuture::from(self.agent_check.as_mut()) => {
                    self.agent_check = None;
                    self.on_agent_id(checked, &cancel).await?;
                }
                Some(sent) = OptionFuture::from(self.sending.as_mut()) => {
                    self.sending = None;
                    Box::pin(self.on_sent(sent)).await?;
                }
                () = fire(&mut self.send_retry) => self.send_retry = None,
                () = fire(&mut self.status_total) => self.publish_status(),
                () = fire(&mut self.periodic) => {
                    self.periodic = None;
                    self.on_periodic_tick();
                }
                () = async {
                    match &mut self.retry {
                        Some((sleep, _)) => sleep.as_mut().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some((_, kind)) = self.retry.take() {
                        self.jobs.mark(kind);
                    }
                }
                alive = changed(&mut self.watch) => self.on_profiles_changed(alive),
                Some(done) = self.ops.running.next(), if !self.ops.running.is_empty() => {
                    Box::pin(self.on_disk_done(done)).await?;
                }
                () = ops::status_due(&mut self.ops.timer, self.ops.armed.is_some()) => {
                    self.on_status_timer();
                }
                Some(()) = self.replies.next(), if !self.replies.is_empty() => {}
                Some(()) = self.ops.publishes.next(), if !self.ops.publishes.is_empty() => {}
            }
            Box::pin(self.drain_ready()).await?;
            Box::pin(self.flush()).await?;
        }
    }

    /// Handles the disk operation results and manager events that are ready now in the
    /// same turn, so that their commits become one (group commit): with every commit
    /// awaited on its own, 64 concurrent operations ran no faster than one. Their
    /// effects still leave only after the commit (`flush`), so what the manager and the
    /// plugin see is what a commit per event would have shown.
    async fn drain_ready(&mut self) -> Result<(), ProviderError> {
        for _ in 0..MAX_TURN {
            if !self.ops.running.is_empty()
                && let Some(Some(done)) = self.ops.running.next().now_or_never()
            {
                Box::pin(self.on_disk_done(done)).await?;
                continue;
            }
            match self.sessions.try_recv() {
                Ok(session) => Box::pin(self.on_session(session)).await?,
                // Empty, or closed: the loop's `recv` sees the end.
                Err(_) => break,
            }
        }
        Ok(())
    }

    fn publish_status(&mut self) {
        self.status_total = None;
        self.status.send_modify(|s| {
            s.lifecycle = self.lifecycle;
            s.agent_id.clone_from(&self.params.agent_id);
            s.provider_id = self.state.provider_id.as_ref().map(|id| id.value.clone());
            s.total = self.state.total.clone();
        });
    }

    /// Operations changed the total: it reaches the status within
    /// [`status_total_delay`], once for every operation completed meanwhile.
    fn total_changed(&mut self) {
        if self.status_total.is_none() {
            let delay = status_total_delay(self.state.total.len());
            self.status_total = Some(Box::pin(tokio::time::sleep(delay)));
        }
    }

    fn set_error(&self, error: String) {
        self.status.send_modify(|s| s.last_error = Some(error));
    }

    fn enter(&mut self, state: Lifecycle) {
        if self.lifecycle != state {
            tracing::info!(from = %self.lifecycle, to = %state, "resource provider state changed");
        }
        self.lifecycle = state;
        self.publish_status();
    }

    async fn on_session(&mut self, session: SessionEvent) -> Result<(), ProviderError> {
        match session {
            SessionEvent::Connected => self.enter(Lifecycle::Connected),
            SessionEvent::Disconnected { reason } => {
                let chain = DisplayChain(&*reason).to_string();
                tracing::info!(reason = %chain, "disconnected from the resource provider manager");
                // Operators see why the provider is not READY (e.g. a provider id the
                // manager does not admit keeps failing here).
                self.set_error(format!("disconnected: {chain}"));
                self.enter(Lifecycle::Disconnected);
                self.pause_statuses();
                if matches!(*reason, AgentError::NotAdmitted)
                    && self.params.follow_agent_id
                    && self.agent_check.is_none()
                {
                    let config = self.params.agent.clone();
                    self.agent_check = Some(Box::pin(async move {
                        slrp_agent::operator::get_agent_id(&config).await
                    }));
                }
            }
            SessionEvent::Subscribed { provider_id, .. } => self.on_subscribed(provider_id).await?,
            SessionEvent::Event(event) => Box::pin(self.on_event(*event)).await?,
        }
        Ok(())
    }

    /// The agent's id after a subscription was not admitted: a new one is a new provider
    /// identity (spec §3.6, §8.6), recovered from the store like at start and subscribed
    /// with a new agent client; the volumes stay in the volume manager.
    async fn on_agent_id(
        &mut self,
        checked: Result<String, OperatorError>,
        cancel: &CancellationToken,
    ) -> Result<(), ProviderError> {
        let agent_id = match checked {
            Ok(agent_id) if agent_id == self.params.agent_id => {
                tracing::info!(%agent_id, "the agent id is unchanged; the manager does not admit this provider id");
                return Ok(());
            }
            Ok(agent_id) => agent_id,
            Err(error) => {
                tracing::warn!(error = %DisplayChain(&error), "cannot learn the agent id after a subscription was not admitted");
                return Ok(());
            }
        };
        tracing::warn!(
            old = %self.params.agent_id,
            new = %agent_id,
            "the agent has a new agent id: this is a new provider identity"
        );
        let (state, tracked) = recover_identity(&self.deps, &self.params, &agent_id).await?;
        self.ctx = match &state.provider_id {
            Some(id) => Some(self.context(id.clone())?),
            None => None,
        };
        // The old identity's PENDING operations leave the gauge (their records stay).
        for op in self.ops.tracked.iter().filter(|op| !op.is_terminal()) {
            self.deps
                .metrics
                .operations()
                .pending(OperationKind::of(&op.info), -1);
        }
        self.ops.switch(tracked);
        self.client_cancel.cancel();
        self.client_cancel = cancel.child_token();
        let (agent, sessions) = AgentClient::spawn(
            self.params.agent.clone(),
            self.params.info.clone(),
            state.provider_id.clone(),
            self.deps.agent_metrics.clone(),
            self.client_cancel.clone(),
        )
        .map_err(|source| ProviderError::Agent {
            provider: self.label.clone(),
            source,
        })?;
        self.agent = agent;
        self.sessions = sessions;
        self.params.agent_id = agent_id;
        self.state = state;
        self.profiles_basis = None;
        // Nothing of the old identity's sessions carries over.
        self.session += 1;
        self.ready_from_send = None;
        self.update_needed = false;
        self.sending = None;
        self.send_retry = None;
        self.jobs.subscription = false;
        self.pending_events = PendingEvents::new(self.params.pending_events);
        self.status.send_modify(|s| s.events.queued = 0);
        self.enter(Lifecycle::Disconnected);
        self.pause_statuses();
        Ok(())
    }

    fn context(&self, id: ResourceProviderId) -> Result<ProviderResources, ProviderError> {
        ProviderResources::new(
            id,
            &self.plugin.0,
            &self.plugin.1,
            self.params.info.default_reservations.clone(),
        )
        .map_err(|source| ProviderError::Resources {
            provider: self.label.clone(),
            source,
        })
    }

    async fn on_subscribed(&mut self, id: ResourceProviderId) -> Result<(), ProviderError> {
        if self.state.provider_id.as_ref() != Some(&id) {
            if let Some(old) = &self.state.provider_id {
                // The client resubscribes with the id it has; a different answer means the
                // manager gave us a new identity, to which the old resources do not belong.
                tracing::warn!(old = %old.value, new = %id.value, "the manager assigned a new provider id; starting as a new identity");
                self.state.total = Resources::new();
                self.state.profiles.clear();
            }
            self.ctx = Some(self.context(id.clone())?);
            self.state.provider_id = Some(id.clone());
            self.checkpoint().await?;
            tracing::info!(provider_id = %id.value, "subscribed with a new provider id");
        } else {
            tracing::info!(provider_id = %id.value, "subscribed");
        }
        self.session += 1;
        self.ready_from_send = None;
        // What the last session did not send, the subscription reconciliation sends.
        self.update_needed = false;
        self.send_failures = 0;
        self.send_retry = None;
        self.enter(Lifecycle::Subscribed);
        // Recovered PENDING operations first: the reconciliation waits for them (§3.4
        // step 7), so their results are in the total it starts from.
        Box::pin(self.start_replay()).await?;
        self.jobs.mark(JobKind::Subscription);
        Ok(())
    }

    async fn checkpoint(&mut self) -> Result<(), ProviderError> {
        // What the turn staged first: the store applies commits in order.
        self.flush().await?;
        // Pools that outlived their profile (converted ones, §12 item 11) keep the profile
        // they were checkpointed with.
        let mut known = self.live_profiles.clone();
        for (name, def) in &self.state.profiles {
            known.entry(name.clone()).or_insert_with(|| def.clone());
        }
        let state = ProviderState::checkpoint(
            self.state.provider_id.clone(),
            self.state.total.clone(),
            &known,
        );
        state
            .save(&self.deps.store, &self.params.agent_id)
            .await
            .map_err(|source| ProviderError::Checkpoint {
                provider: self.label.clone(),
                source: Box::new(source),
            })?;
        self.state = state;
        Ok(())
    }

    async fn on_event(&mut self, event: Event) -> Result<(), ProviderError> {
        let kind = EventKind::of(&event);
        let reconciled = self.lifecycle == Lifecycle::Subscribed
            && self
                .ready_from_send
                .is_some_and(|(_, session)| session == self.session);
        let disposition = disposition(self.lifecycle, reconciled, kind);
        match disposition {
            Disposition::Handle => Box::pin(self.on_ready_event(event)).await?,
            Disposition::Queue => {
                tracing::info!(event = %kind, state = %self.lifecycle, "queueing the event until READY");
                let evicted = self.pending_events.push(event);
                let queued = self.pending_events.len();
                self.status.send_modify(|s| {
                    s.events.queued = queued;
                    s.events.overflowed += u64::from(evicted.is_some());
                });
                if let Some(unkept) = evicted {
                    Box::pin(self.not_queued(unkept)).await?;
                }
            }
            Disposition::Drop { message } => {
                self.status.send_modify(|s| s.events.dropped += 1);
                match event.apply_operation {
                    Some(apply) => Box::pin(self.on_apply(apply, Some(message))).await?,
                    None => tracing::warn!("APPLY_OPERATION without its payload; ignored"),
                }
            }
            Disposition::AnswerFailed { message } => {
                tracing::warn!(uuid = %event_operation(&event), "{message}");
                self.answer_publish_failed(&event);
                self.status.send_modify(|s| s.events.publish_failed += 1);
            }
            Disposition::Ignore => {
                tracing::info!(event = %kind, "ignoring the event");
            }
            Disposition::Warn { reason } => {
                tracing::warn!(event = %kind, "ignoring the event: {reason}");
            }
        }
        Ok(())
    }

    /// An event the full queue of events waiting for READY did not keep: an operation is
    /// DROPPED (tracked, its status sent reliably) and a publish answered FAILED, with the
    /// texts of a provider that is not READY; an acknowledgement or reconciliation comes
    /// again (the status is resent, the agent asks again).
    async fn not_queued(&mut self, event: Event) -> Result<(), ProviderError> {
        let kind = EventKind::of(&event);
        tracing::error!(
            event = %kind,
            operation_uuid = %event_operation(&event),
            bound = self.params.pending_events,
            "too many events waiting for READY; this one is not kept"
        );
        let refused = match disposition(Lifecycle::Subscribed, false, kind) {
            Disposition::Drop { message } | Disposition::AnswerFailed { message } => message,
            _ => return Ok(()),
        };
        match kind {
            EventKind::ApplyOperation => {
                let Some(apply) = event.apply_operation else {
                    return Ok(());
                };
                self.status.send_modify(|s| s.events.dropped += 1);
                Box::pin(self.on_apply(apply, Some(refused))).await?;
            }
            EventKind::PublishResources => {
                tracing::warn!(uuid = %event_operation(&event), "{refused}");
                self.answer_publish_failed(&event);
                self.status.send_modify(|s| s.events.publish_failed += 1);
            }
            _ => {}
        }
        Ok(())
    }

    /// Every operation-flow event in READY arrives here (spec §5, carried out in `ops`).
    async fn on_ready_event(&mut self, event: Event) -> Result<(), ProviderError> {
        let kind = EventKind::of(&event);
        self.status.send_modify(|s| s.events.handled += 1);
        let Event {
            apply_operation,
            publish_resources,
            acknowledge_operation_status,
            reconcile_operations,
            ..
        } = event;
        match (
            kind,
            apply_operation,
            publish_resources,
            acknowledge_operation_status,
            reconcile_operations,
        ) {
            (EventKind::ApplyOperation, Some(apply), ..) => {
                Box::pin(self.on_apply(apply, None)).await?
            }
            (EventKind::PublishResources, _, Some(publish), ..) => self.on_publish(publish),
            (EventKind::AcknowledgeOperationStatus, _, _, Some(ack), _) => {
                Box::pin(self.on_acknowledge(ack)).await?;
            }
            (EventKind::ReconcileOperations, .., Some(reconcile)) => self.on_reconcile(&reconcile),
            (kind, ..) => tracing::warn!(event = %kind, "an event without its payload; ignored"),
        }
        Ok(())
    }

    fn answer_publish_failed(&mut self, event: &Event) {
        let Some(publish) = &event.publish_resources else {
            tracing::warn!("PUBLISH_RESOURCES without its payload; nothing to answer");
            return;
        };
        self.answer_publish(&publish.uuid, false);
    }

    async fn become_ready(&mut self) -> Result<(), ProviderError> {
        self.enter(Lifecycle::Ready);
        self.resume_statuses();
        if !self.loops_started {
            self.loops_started = true;
            self.start_loops().await;
        }
        // After the loops: a disk operation queued for READY is deferred behind the first
        // profile update (Mesos drops it then) instead of meeting an empty profile map.
        for event in self.pending_events.drain() {
            Box::pin(self.on_ready_event(event)).await?;
        }
        self.status.send_modify(|s| s.events.queued = 0);
        Ok(())
    }

    /// The periodic loop and the profile watch, once per process (§3.6).
    async fn start_loops(&mut self) {
        self.arm_periodic();
        if let Some(profiles) = &self.deps.profiles {
            match profiles.subscribe(self.key.clone()).await {
                Ok(mut rx) => {
                    // Mesos's `watch` returns at once only when the adaptor's set differs
                    // from the provider's (the profiles of its checkpointed pools): then
                    // update now. Otherwise the subscription reconciliation, which used
                    // those profiles, is current, and the next change wakes the watch.
                    let differs = !rx.borrow_and_update().keys().eq(self.live_profiles.keys());
                    self.watch = Some(rx);
                    if differs {
                        self.jobs.mark(JobKind::Profiles);
                    }
                }
                Err(error) => {
                    tracing::error!(error = %DisplayChain(&error), "the disk profile adaptor stopped; profiles are not watched");
                }
            }
        }
    }

    fn arm_periodic(&mut self) {
        if let Some(interval) = self.params.reconciliation_interval {
            self.periodic = Some(Box::pin(tokio::time::sleep(interval)));
        }
    }

    fn on_periodic_tick(&mut self) {
        if self.lifecycle == Lifecycle::Ready {
            self.jobs.mark(JobKind::Periodic);
        } else {
            // Not connected: the next subscription reconciles anyway.
            self.arm_periodic();
        }
    }

    fn on_profiles_changed(&mut self, alive: bool) {
        if alive {
            self.jobs.mark(JobKind::Profiles);
        } else {
            tracing::error!("the disk profile adaptor stopped; profiles are no longer watched");
            self.watch = None;
        }
    }

    /// Starts the next job and the next UPDATE_STATE when their turn has come.
    async fn start_work(&mut self) -> Result<(), ProviderError> {
        // Deferred operations wait for a reconciliation; none runs or waits any more (one
        // ended in another state, or an identity switch dropped it).
        if self.job.is_none() && !self.jobs.waiting(self.lifecycle) {
            self.start_deferred().await?;
        }
        // Before a job (it waits for the disk operations, which start here) and before an
        // UPDATE_STATE (it must show only what is durable).
        self.flush().await?;
        // A job waiting out its retry backoff does not hold up the others (a resubscription
        // must not wait for a failed periodic reconciliation's next attempt). A job waits
        // for the disk operations that run (Mesos's provider-wide sequence).
        if self.job.is_none()
            && self.ops.running.is_empty()
            && let Some(kind) = self.jobs.take(self.lifecycle)
        {
            self.start_job(kind);
        }
        self.maybe_send();
        Ok(())
    }

    /// The total changed in a way the agent does not learn from an operation status: a
    /// new resource version, sent in the next UPDATE_STATE (spec §6.6).
    fn state_changed(&mut self) {
        self.resource_version = uuid::Uuid::new_v4();
        self.update_needed = true;
    }

    fn start_job(&mut self, kind: JobKind) {
        let volumes = self.deps.volumes.clone();
        let page = self.params.list_page_size;
        let mut profiles = self.live_profiles.clone();
        let adaptor = self.deps.profiles.clone();
        let key = self.key.clone();
        let reported: Option<BTreeSet<String>> = match (&mut self.watch, kind) {
            (Some(rx), JobKind::Profiles) => Some(rx.borrow_and_update().keys().cloned().collect()),
            (None, JobKind::Profiles)
            | (_, JobKind::Subscription | JobKind::Periodic | JobKind::Pools) => None,
        };
        let session = self.session;
        let identity = self.ops.identity();
        tracing::debug!(job = kind.as_str(), "starting");
        self.job = Some(Box::pin(async move {
            let result = async {
                if let (Some(adaptor), Some(reported)) = (adaptor, reported) {
                    update_profiles(&adaptor, &key, &mut profiles, &reported).await;
                }
                let (capacities, listing) =
                    tokio::join!(capacities(&volumes, &profiles), volumes.list_all(page));
                Ok(Gathered {
                    capacities: capacities?,
                    listing: listing.map_err(ReconcileError::List)?,
                    profiles,
                })
            }
            .await;
            JobDone {
                kind,
                session,
                identity,
                result,
            }
        }));
    }

    async fn on_job_done(&mut self, done: JobDone) -> Result<(), ProviderError> {
        let JobDone {
            kind,
            session,
            identity,
            result,
        } = done;
        if identity != self.ops.identity() {
            return Box::pin(self.on_stale_job(kind, result)).await;
        }
        let outcome = match result {
            Ok(gathered) => self.apply(gathered).await?,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(changed) => {
                self.job_failures = 0;
                self.status.send_modify(|s| s.reconciliations += 1);
                // Before READY only this session's subscription reconciliation sends: the
                // first UPDATE_STATE of a session is its (Mesos). A job of the previous
                // session ending now has changed the total that reconciliation starts from.
                let own_subscription = kind == JobKind::Subscription && session == self.session;
                if own_subscription || (changed && self.lifecycle == Lifecycle::Ready) {
                    self.state_changed();
                }
                match kind {
                    JobKind::Subscription if session == self.session => {
                        self.ready_from_send = Some((self.send_seq + 1, session));
                    }
                    JobKind::Subscription => {}
                    JobKind::Periodic => self.arm_periodic(),
                    JobKind::Profiles | JobKind::Pools => {}
                }
            }
            Err(error) => {
                let delay = self
                    .params
                    .retry_backoff
                    .delay(self.job_failures, &mut self.jitter);
                self.job_failures = self.job_failures.saturating_add(1);
                let chain = format!("{} failed: {}", kind.as_str(), DisplayChain(&error));
                tracing::warn!(retry_in = ?delay, "{chain}");
                self.set_error(chain);
                let sleep = Box::pin(tokio::time::sleep(delay));
                match kind {
                    // The periodic loop retries by ticking early; it never stops.
                    JobKind::Periodic => self.periodic = Some(sleep),
                    // Mesos only logs it; the next periodic reconciliation recovers the space.
                    JobKind::Pools => {}
                    // A stale subscription job is not retried: the new session has its own.
                    JobKind::Subscription if session != self.session => {}
                    JobKind::Subscription | JobKind::Profiles => {
                        if let Some((_, other)) = self.retry.replace((sleep, kind))
                            && other != kind
                        {
                            // One retry slot: the job it held runs now instead of being lost.
                            self.jobs.mark(other);
                        }
                    }
                }
            }
        }
        // The reconciliation ended: what arrived meanwhile goes now, before the next job.
        Box::pin(self.start_deferred()).await
    }

    /// A job started before an agent-id switch ended: only what does not depend on the
    /// identity (the translated profiles) is kept; its listing is not applied to the new
    /// identity's total. The new identity's subscription reconciliation is marked at its
    /// SUBSCRIBED and starts now that the sequence is free; a periodic or profile job is
    /// not lost.
    async fn on_stale_job(
        &mut self,
        kind: JobKind,
        result: Result<Gathered, ReconcileError>,
    ) -> Result<(), ProviderError> {
        tracing::info!(
            job = kind.as_str(),
            "a reconciliation of the previous identity ended; not applying it"
        );
        let ok = match result {
            Ok(gathered) => {
                self.live_profiles = gathered.profiles;
                true
            }
            Err(_) => false,
        };
        match kind {
            JobKind::Periodic => self.arm_periodic(),
            // The watch was read when it started: its change would not come again.
            JobKind::Profiles if !ok => self.jobs.mark(JobKind::Profiles),
            JobKind::Profiles | JobKind::Subscription | JobKind::Pools => {}
        }
        self.start_deferred().await
    }

    /// Applies a reconciliation's findings (§6.5). `Ok(Err(_))` leaves everything as it
    /// was; `Err(_)` is a failed checkpoint (fatal).
    async fn apply(
        &mut self,
        gathered: Gathered,
    ) -> Result<Result<bool, ReconcileError>, ProviderError> {
        let Some(ctx) = &self.ctx else {
            // Jobs start only once subscribed, which sets the context; it is gone only after
            // an agent-id switch, before the new identity's SUBSCRIBED. Nothing to reconcile
            // then, but a profile job's translated set must not be lost: the watch has been
            // read already, so it would not come again until the profiles change.
            self.live_profiles = gathered.profiles;
            return Ok(Ok(false));
        };
        let total = &self.state.total;
        let volumes = match ctx.existing_volumes(total, &gathered.listing) {
            Ok(volumes) => volumes,
            Err(error) => return Ok(Err(ReconcileError::Apply(error))),
        };
        let pools = ctx.reconcile_pools(
            total,
            &ctx.storage_pools(gathered.capacities.iter().map(|(p, b)| (p.as_str(), *b))),
            &self.in_flight(),
        );
        let reconciled = match ctx.reconcile(total, &volumes, &pools) {
            Ok(reconciled) => reconciled,
            Err(error) => return Ok(Err(ReconcileError::Apply(error))),
        };
        for duplicate in &volumes.duplicates {
            tracing::warn!(resource = %DisplayResource(duplicate), "Removing duplicated volume");
        }
        for id in self.listed_twice.fresh(&volumes.repeated_in_listing) {
            tracing::warn!(volume_id = %id, "Dropping duplicated volume");
        }
        for id in &volumes.drifted {
            tracing::warn!(volume_id = %id, "volume metadata changed; taking the plugin's");
        }
        for missing in volumes
            .merge
            .missing_converted
            .iter()
            .chain(&pools.missing_converted)
        {
            tracing::warn!(
                "Missing converted resource '{}'. This might cause further operations to fail.",
                DisplayResource(missing)
            );
        }
        let profiles_changed = self.live_profiles != gathered.profiles;
        self.live_profiles = gathered.profiles;
        if let Some(total) = reconciled.total {
            tracing::info!(
                removed = %reconciled.removed,
                added = %reconciled.added,
                "resources changed"
            );
            self.state.total = total;
        }
        if reconciled.changed || profiles_changed {
            // Only the records of what changed: the cost follows the change, not the
            // number of volumes.
            let touched = reconciled.removed + &reconciled.added;
            Box::pin(self.commit_ops(&[], &[], ops::Touched::Some(&touched))).await?;
            self.publish_status();
        }
        Ok(Ok(reconciled.changed))
    }

    fn maybe_send(&mut self) {
        if self.sending.is_some()
            || self.send_retry.is_some()
            || !self.update_needed
            || !self.lifecycle.is_subscribed()
        {
            return;
        }
        let Some(id) = self.state.provider_id.clone() else {
            return;
        };
        self.update_needed = false;
        self.send_seq += 1;
        let version = self.resource_version;
        let call = Call {
            r#type: Some(call::Type::UpdateState as i32),
            resource_provider_id: Some(id),
            update_state: Some(call::UpdateState {
                operations: self.ops.tracked.to_mesos(),
                resources: self.state.total.as_slice().to_vec(),
                resource_version_uuid: Uuid {
                    value: version.as_bytes().to_vec(),
                },
            }),
            ..Call::default()
        };
        let agent = self.agent.clone();
        let (seq, session) = (self.send_seq, self.session);
        tracing::debug!(%version, resources = %self.state.total, "sending UPDATE_STATE");
        self.sending = Some(Box::pin(async move {
            SendDone {
                seq,
                session,
                result: agent.call(call).await,
            }
        }));
    }

    async fn on_sent(&mut self, sent: SendDone) -> Result<(), ProviderError> {
        let current = sent.session == self.session && self.lifecycle.is_subscribed();
        match sent.result {
            Ok(()) => {
                self.send_failures = 0;
                self.status.send_modify(|s| {
                    s.last_error = None;
                    s.updates_sent += 1;
                });
                if let Some((from, session)) = self.ready_from_send
                    && current
                    && sent.seq >= from
                    && session == sent.session
                {
                    self.ready_from_send = None;
                    Box::pin(self.become_ready()).await?;
                }
            }
            Err(error) => {
                let chain = format!("UPDATE_STATE failed: {}", DisplayChain(&error));
                self.set_error(chain.clone());
                if !current {
                    // The next subscription reconciles and sends again.
                    tracing::info!("{chain}; the session ended");
                    return Ok(());
                }
                let delay = self
                    .params
                    .update_backoff
                    .delay(self.send_failures, &mut self.jitter);
                self.send_failures = self.send_failures.saturating_add(1);
                tracing::warn!(retry_in = ?delay, "{chain}");
                self.update_needed = true;
                self.send_retry = Some(Box::pin(tokio::time::sleep(delay)));
            }
        }
        Ok(())
    }
}

/// The operations of identity `agent_id` (spec §3.4 steps 2–6 over the store): the ones
/// whose terminal status was acknowledged are forgotten (their records deleted), the
/// metrics are fed from every other one's latest state.
/// The durable state of identity `agent_id` (spec §3.3 step 4, §8.4): the provider record
/// and its tracked operations; failing either is Mesos's "Failed to recover resource
/// provider".
async fn recover_identity(
    deps: &ProviderDeps,
    params: &ProviderParams,
    agent_id: &str,
) -> Result<(ProviderState, Operations), ProviderError> {
    let recovered = async {
        let state = ProviderState::load(&deps.store, agent_id).await?;
        let tracked = recover_operations(deps, params, agent_id).await?;
        Ok((state, tracked))
    };
    recovered.await.map_err(|source| ProviderError::Recover {
        rp_type: params.info.r#type.clone(),
        rp_name: params.info.name.clone(),
        source: Box::new(source),
    })
}

async fn recover_operations(
    deps: &ProviderDeps,
    params: &ProviderParams,
    agent_id: &str,
) -> Result<Operations, StateError> {
    let records = load_operations(&deps.store, agent_id).await?;
    let (tracked, terminated) = Operations::recover(records, params.status_retry);
    if !terminated.is_empty() {
        let mut txn = deps.store.transaction();
        for op in &terminated {
            stage_operation_removal(&mut txn, agent_id, &op.uuid)?;
        }
        txn.commit().await.map_err(|source| StateError::Store {
            store: deps.store.path().to_owned(),
            source,
        })?;
    }
    ops::count_recovered(&deps.metrics, &tracked);
    tracing::info!(
        %agent_id,
        operations = tracked.len(),
        forgotten = terminated.len(),
        "recovered operations"
    );
    Ok(tracked)
}

/// The profile update of §7.3: drop names no longer reported, translate new ones (in
/// parallel); a failed translation leaves the name out (the next change retries it).
async fn update_profiles(
    adaptor: &ProfileAdaptorHandle,
    key: &ProviderKey,
    profiles: &mut BTreeMap<String, ProfileInfo>,
    reported: &BTreeSet<String>,
) {
    let change = ProfileChange::between(profiles.keys().map(String::as_str), reported);
    for name in &change.removed {
        profiles.remove(name);
    }
    let translated = join_all(
        change
            .to_translate
            .iter()
            .map(|name| async move { (name, adaptor.translate(name, key).await) }),
    )
    .await;
    for (name, result) in translated {
        match result {
            Ok(info) => {
                profiles.insert(name.clone(), info);
            }
            Err(error) => {
                tracing::warn!(profile = %name, error = %DisplayChain(&error), "cannot translate profile; leaving it out");
            }
        }
    }
}

/// GetCapacity for every profile, concurrently (§6.2).
///
/// Mesos fails the whole reconciliation on any failure, so one profile the plugin will
/// never accept (parameters it refuses, a capability slrp cannot express) keeps every
/// other pool from being reported and, after a subscription, the provider from READY —
/// for good. Here such a profile gets no pool (as a zero capacity, logged) and the others
/// are reported; a failure that may pass (plugin down, deadline) still fails the
/// reconciliation, which is retried, so a transient error never removes a pool.
async fn capacities(
    volumes: &VolumeManagerHandle,
    profiles: &BTreeMap<String, ProfileInfo>,
) -> Result<Vec<(String, u64)>, ReconcileError> {
    let asks = profiles.iter().map(|(name, def)| async move {
        let capability = match VolumeCapability::from_mesos(&def.capability) {
            Ok(capability) => capability,
            Err(source) => {
                let error = ReconcileError::Capability {
                    profile: name.clone(),
                    source,
                };
                tracing::warn!(error = %DisplayChain(&error), "no storage pool for this profile");
                return Ok(None);
            }
        };
        match volumes
            .capacity(capability, def.parameters.clone())
            .await
        {
            Ok(bytes) => Ok(Some((name.clone(), u64::try_from(bytes).unwrap_or(0)))),
            Err(source) => {
                let permanent = capacity_refusal_is_permanent(&source);
                let error = ReconcileError::Capacity {
                    profile: name.clone(),
                    source,
                };
                if permanent {
                    tracing::error!(error = %DisplayChain(&error), "the plugin refuses this profile; no storage pool for it");
                    Ok(None)
                } else {
                    Err(error)
                }
            }
        }
    });
    let answers: Result<Vec<_>, _> = join_all(asks).await.into_iter().collect();
    Ok(answers?.into_iter().flatten().collect())
}

/// Whether a GetCapacity failure is the plugin's verdict on this profile: the same
/// question always gets the same answer. Only INVALID_ARGUMENT (the plugin refuses the
/// capability or parameters) and OUT_OF_RANGE say that; UNKNOWN, INTERNAL,
/// FAILED_PRECONDITION, ABORTED and every failure without a code (a bad answer, a stopped
/// manager) may pass, so the reconciliation fails and is retried and the pool stays as it
/// was: one transient error must not remove a pool and rescind its offers.
fn capacity_refusal_is_permanent(error: &VolumeError) -> bool {
    match error {
        VolumeError::Csi { source, .. } => matches!(
            source.code(),
            Some(slrp_csi::Code::InvalidArgument | slrp_csi::Code::OutOfRange)
        ),
        _ => false,
    }
}

/// A UUID in its text form (Mesos's `id::UUID::toString`), or hex for other lengths.
fn uuid_text(uuid: &Uuid) -> String {
    match uuid::Uuid::from_slice(&uuid.value) {
        Ok(u) => u.to_string(),
        Err(_) => uuid.value.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

/// The operation (or publish) UUID an event concerns, for logs.
fn event_operation(event: &Event) -> String {
    let uuid = event
        .apply_operation
        .as_ref()
        .map(|a| &a.operation_uuid)
        .or(event
            .acknowledge_operation_status
            .as_ref()
            .map(|a| &a.operation_uuid))
        .or(event.publish_resources.as_ref().map(|p| &p.uuid));
    match (uuid, &event.reconcile_operations) {
        (Some(uuid), _) => uuid_text(uuid),
        (None, Some(r)) => r
            .operation_uuids
            .iter()
            .map(uuid_text)
            .collect::<Vec<_>>()
            .join(","),
        (None, None) => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(seconds: Option<f64>) -> ResourceProviderInfo {
        ResourceProviderInfo {
            storage: Some(slrp_proto::mesos::v1::resource_provider_info::Storage {
                plugin: Default::default(),
                reconciliation_interval_seconds: seconds,
            }),
            ..ResourceProviderInfo::default()
        }
    }

    #[tokio::test]
    async fn profile_update_drops_gone_names_and_leaves_untranslatable_ones_out() {
        let document = serde_json::json!({"profile_matrix": {"fast": {
            "csi_plugin_type_selector": {"plugin_type": "org.test"},
            "volume_capabilities": {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
            "create_parameters": {"tier": "1"}}}});
        let config =
            slrp_profiles::ProfilesConfig::new(slrp_profiles::ProfileSource::Inline(document));
        let cancel = CancellationToken::new();
        let (adaptor, task) =
            slrp_profiles::spawn(config, slrp_profiles::Metrics::default(), cancel.clone());
        let key = ProviderKey::new("t", "n", Some("org.test".to_owned()));
        let mut view = adaptor.subscribe(key.clone()).await.unwrap();
        view.wait_for(|v| v.contains_key("fast")).await.unwrap();

        let old = ProfileInfo {
            capability: Default::default(),
            parameters: BTreeMap::new(),
        };
        let mut profiles = BTreeMap::from([("gone".to_owned(), old)]);
        // "unknown" is reported but the adaptor cannot translate it: left out.
        let reported = BTreeSet::from(["fast".to_owned(), "unknown".to_owned()]);
        update_profiles(&adaptor, &key, &mut profiles, &reported).await;
        assert_eq!(profiles.keys().collect::<Vec<_>>(), ["fast"]);
        assert_eq!(profiles["fast"].parameters["tier"], "1");
        cancel.cancel();
        task.await.unwrap();
    }

    #[test]
    fn jobs_run_in_sequence_order_and_only_when_allowed() {
        let mut jobs = Jobs::default();
        for kind in [JobKind::Periodic, JobKind::Profiles, JobKind::Subscription] {
            jobs.mark(kind);
            // A second request joins the first.
            jobs.mark(kind);
        }
        for state in [
            Lifecycle::Recovering,
            Lifecycle::Disconnected,
            Lifecycle::Connected,
        ] {
            assert_eq!(jobs.take(state), None, "{state}");
        }
        assert_eq!(
            jobs.take(Lifecycle::Subscribed),
            Some(JobKind::Subscription)
        );
        // Before READY only the subscription reconciliation runs.
        assert_eq!(jobs.take(Lifecycle::Subscribed), None);
        assert_eq!(jobs.take(Lifecycle::Ready), Some(JobKind::Profiles));
        assert_eq!(jobs.take(Lifecycle::Ready), Some(JobKind::Periodic));
        assert_eq!(jobs.take(Lifecycle::Ready), None);
    }

    #[test]
    fn the_status_total_waits_longer_for_a_larger_total_up_to_a_second() {
        assert_eq!(status_total_delay(0), STATUS_TOTAL_INTERVAL);
        assert_eq!(status_total_delay(100), Duration::from_millis(55));
        assert_eq!(status_total_delay(10_000), Duration::from_millis(550));
        assert_eq!(status_total_delay(1_000_000), STATUS_TOTAL_MAX_INTERVAL);
        assert_eq!(status_total_delay(usize::MAX), STATUS_TOTAL_MAX_INTERVAL);
    }

    #[test]
    fn reconciliation_interval_rules() {
        let rows = [
            (None, Some(Duration::from_secs(10))),
            (Some(10.0), Some(Duration::from_secs(10))),
            (Some(0.5), Some(Duration::from_millis(500))),
            (Some(0.0), None),
            (Some(-5.0), None),
            (Some(f64::NAN), None),
            (Some(f64::INFINITY), None),
        ];
        for (seconds, want) in rows {
            assert_eq!(reconciliation_interval(&info(seconds)), want, "{seconds:?}");
        }
    }
}
