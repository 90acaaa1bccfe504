//! The provider worker: the driver of the provider machine
//! ([`slrp_core::provider::machine`]), which makes every decision (spec §2.7, §2.8, §3,
//! §5, §6.5, §7.3).
//!
//! # Design
//! [`Provider::spawn`] recovers the durable state ([`ProviderState`] and the tracked
//! operations, keyed by the agent id) before anything connects, then starts the agent
//! client and one task that owns the machine and everything with I/O: the agent client's
//! sessions, the store, the volume manager, the profile adaptor, timers. Each turn of its
//! loop feeds the machine what happened ([`Input`]) and carries out the machine's
//! [`Ready`]: one store commit for everything the turn staged (group commit: 64
//! concurrent operations share an fsync), then, once it is durable, the effects, in
//! order (status updates, CreateVolume/DeleteVolume, UPDATE_STATE, reconciliation jobs,
//! timers). The results of the effects come back as inputs.
//!
//! Nothing here decides: what an event means, when a job runs, when UPDATE_STATE goes,
//! what an operation converts are the machine's. This module only knows how to do what it
//! is told and how to report how it went. Only a failed store write (or an agent client
//! that stops unasked) is fatal (conventions §4.4 rule 5).

mod io;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt as _};
use futures_util::stream::{FuturesUnordered, StreamExt};
use slrp_agent::{AgentClient, AgentConfig, AgentError, AgentHandle, SessionEvent};
use slrp_core::provider::apply::OperationError;
use slrp_core::provider::lifecycle::{DEFAULT_PENDING_EVENTS, Lifecycle};
use slrp_core::provider::machine::{
    self, Config, DiskCall, DiskDone, DiskOutcome, Effect, Input, JobDone, JobKind, Machine,
    MachineError, Notice, OpMetric, Ready, Timer, operation_span,
};
use slrp_core::provider::operations::{Operations, StatusRetry};
use slrp_core::provider::resources::{ResourceError, Resources};
use slrp_core::provider::state::{ProviderState, StateError};
use slrp_core::volume::{MountPaths, Owed, Staged, VolumeError, VolumeManagerHandle};
use slrp_profiles::{ProfileAdaptorHandle, ProfileView, ProviderKey};
use slrp_proto::mesos::v1::ResourceProviderInfo;
use slrp_proto::mesos::v1::resource_provider::Call;
use slrp_store::Store;
use slrp_types::{Backoff, DisplayChain, Jitter};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use slrp_core::provider::machine::{
    EventStats, STATUS_TOTAL_INTERVAL, STATUS_TOTAL_MAX_INTERVAL, status_total_delay,
};

use crate::metrics::ProviderMetrics;

/// Most ready inputs one turn of the worker loop handles before committing them together.
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

/// Observes a running provider. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ProviderHandle {
    status: watch::Receiver<ProviderStatus>,
    reconcile: Arc<tokio::sync::Notify>,
}

impl ProviderHandle {
    /// The provider's status, kept current by the worker.
    pub fn status(&self) -> watch::Receiver<ProviderStatus> {
        self.status.clone()
    }

    /// Asks for a reconciliation soon (the plugin's volumes changed outside an
    /// operation: a disk was grown). Requests made while one waits are one.
    pub fn request_reconciliation(&self) {
        self.reconcile.notify_one();
    }

    /// [`Self::request_reconciliation`] as a cloneable handle of its own.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler(self.reconcile.clone())
    }
}

/// Asks a provider's worker for a reconciliation ([`ProviderHandle::reconciler`]).
#[derive(Debug, Clone)]
pub struct Reconciler(Arc<tokio::sync::Notify>);

impl Reconciler {
    /// See [`ProviderHandle::request_reconciliation`].
    pub fn request(&self) {
        self.0.notify_one();
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
        let key = ProviderKey::from(info);
        let label = key.to_string();
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
        let cfg = Config {
            agent_id: params.agent_id.clone(),
            plugin_type: plugin.r#type.clone(),
            plugin_name,
            default_reservations: info.default_reservations.clone(),
            reconciliation_interval: params.reconciliation_interval,
            update_backoff: params.update_backoff,
            retry_backoff: params.retry_backoff,
            jitter: params.jitter,
            pending_events: params.pending_events,
            follow_agent_id: params.follow_agent_id,
            max_publishes: params.max_publishes,
            watches_profiles: deps.profiles.is_some(),
        };
        // The plugin name and reservations are checked before anything is read.
        let unusable = |source| ProviderError::Resources {
            provider: label.clone(),
            source,
        };
        Machine::new(
            cfg.clone(),
            ProviderState::default(),
            Operations::new(params.status_retry),
        )
        .map_err(|e| match e {
            MachineError::Resources(source) => unusable(source),
            MachineError::Stage(source) => checkpoint_error(&label, source),
        })?;

        let (state, tracked) = io::recover_identity(&deps, &params, &params.agent_id).await?;
        tracing::info!(
            provider = %label,
            agent_id = %params.agent_id,
            provider_id = ?state.provider_id.as_ref().map(|id| &id.value),
            resources = %state.total,
            "recovered resource provider state"
        );
        let operations = tracked.len();
        let machine = Machine::new(cfg, state, tracked).map_err(|e| match e {
            MachineError::Resources(source) => unusable(source),
            MachineError::Stage(source) => checkpoint_error(&label, source),
        })?;

        let cancel = cancel.child_token();
        let client_cancel = cancel.child_token();
        let (agent, sessions) = AgentClient::spawn(
            params.agent.clone(),
            params.info.clone(),
            machine.state().provider_id.clone(),
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
            provider_id: machine
                .state()
                .provider_id
                .as_ref()
                .map(|id| id.value.clone()),
            total: machine.total().clone(),
            last_error: None,
            reconciliations: 0,
            updates_sent: 0,
            events: EventStats::default(),
            operations,
            unacknowledged: 0,
        });
        let reconcile = Arc::new(tokio::sync::Notify::new());
        let worker = Worker {
            label: label.clone(),
            key,
            machine,
            agent,
            sessions,
            reconcile: reconcile.clone(),
            cancel: cancel.clone(),
            client_cancel,
            status: status_tx,
            watch: None,
            timers: Timers::default(),
            tasks: FuturesUnordered::new(),
            replies: FuturesUnordered::new(),
            acks: FuturesUnordered::new(),
            counts_after_acks: false,
            deps,
            params,
        };
        let span = tracing::info_span!(parent: None, "provider", provider = %label);
        let join = tokio::spawn(worker.run().instrument(span));
        Ok((ProviderHandle { status, reconcile }, ProviderTask { join }))
    }
}

/// A staged call's answer as the machine takes it: the result, and the record change the
/// volume manager left to the next commit.
fn unstage<T>(staged: Result<Staged<T>, VolumeError>) -> (Result<T, VolumeError>, Option<Owed>) {
    match staged {
        Ok(Staged { value, owed }) => (Ok(value), owed),
        Err(e) => (Err(e), None),
    }
}

/// What the machine learns of a failed UPDATE_STATE whose body was `bytes` bytes (in the
/// agent's content type): a refusal (4xx) is not resent unchanged, and one for the body's
/// size says which limit and how to raise it (only slrp's embedded manager has one; a
/// Mesos agent takes any size).
fn send_failure(error: &AgentError, bytes: usize) -> machine::SendFailure {
    let message = DisplayChain(error).to_string();
    match error {
        AgentError::Rejected { status, .. } if status.as_u16() == 413 => machine::SendFailure {
            message: format!(
                "{message}: the UPDATE_STATE with the provider's total is {bytes} bytes; \
                     raise the manager's body limit (slrp standalone: max_body_bytes in the [manager] \
                     table of slrp.toml)"
            ),
            refused: true,
        },
        AgentError::Rejected { .. } => machine::SendFailure {
            message,
            refused: true,
        },
        _ => machine::SendFailure {
            message,
            refused: false,
        },
    }
}

fn checkpoint_error(label: &str, source: StateError) -> ProviderError {
    ProviderError::Checkpoint {
        provider: label.to_owned(),
        source: Box::new(source),
    }
}

/// The machine's timers, each a deadline or nothing.
#[derive(Default)]
struct Timers {
    slots: Vec<(Timer, Pin<Box<Sleep>>)>,
}

impl Timers {
    fn arm(&mut self, timer: Timer, at: Instant) {
        match self.slots.iter_mut().find(|(t, _)| *t == timer) {
            Some((_, sleep)) => sleep.as_mut().reset(at),
            None => self
                .slots
                .push((timer, Box::pin(tokio::time::sleep_until(at)))),
        }
    }

    fn disarm(&mut self, timer: Timer) {
        self.slots.retain(|(t, _)| *t != timer);
    }

    /// The next timer to fire (disarmed as it fires); pending forever with none armed.
    fn next(&mut self) -> impl Future<Output = Timer> + '_ {
        std::future::poll_fn(move |cx| {
            let fired = self
                .slots
                .iter_mut()
                .position(|(_, sleep)| sleep.as_mut().poll(cx).is_ready());
            match fired {
                Some(i) => Poll::Ready(self.slots.swap_remove(i).0),
                None => Poll::Pending,
            }
        })
    }
}

struct Worker {
    label: String,
    key: ProviderKey,
    params: ProviderParams,
    deps: ProviderDeps,
    machine: Machine,
    agent: AgentHandle,
    sessions: mpsc::Receiver<SessionEvent>,
    /// Reconciliations asked for from outside ([`ProviderHandle::request_reconciliation`]).
    reconcile: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
    /// Stops the current agent client (replaced when the agent id changes).
    client_cancel: CancellationToken,
    status: watch::Sender<ProviderStatus>,
    watch: Option<watch::Receiver<ProfileView>>,
    timers: Timers,
    /// Work whose result goes back to the machine: jobs, UPDATE_STATE, disk calls, data
    /// removals, publishes, GET_AGENT.
    tasks: FuturesUnordered<BoxFuture<'static, Input>>,
    /// Calls whose failure is only logged.
    replies: FuturesUnordered<BoxFuture<'static, ()>>,
    /// Commits of turns that only forgot acknowledged operations, queued in the store's
    /// order but not awaited by the turn (nothing waits for them).
    acks: FuturesUnordered<slrp_store::Durable>,
    /// The operation counts changed in a turn whose commit is in `acks`: published once
    /// every such commit is durable.
    counts_after_acks: bool,
}

async fn changed(watch: &mut Option<watch::Receiver<ProfileView>>) -> bool {
    match watch {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

impl Worker {
    async fn run(mut self) -> Result<(), ProviderError> {
        loop {
            Box::pin(self.settle()).await?;
            let cancel = self.cancel.clone();
            let reconcile = self.reconcile.clone();
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(()),
                Some(done) = self.acks.next(), if !self.acks.is_empty() => {
                    self.on_ack_durable(done)?;
                }
                session = self.sessions.recv(), if self.machine.accepts_events() => match session {
                    Some(session) => self.on_session(session)?,
                    None if self.cancel.is_cancelled() => return Ok(()),
                    None => return Err(ProviderError::AgentStopped { provider: self.label.clone() }),
                },
                Some(input) = self.tasks.next(), if !self.tasks.is_empty() => self.step(input)?,
                timer = self.timers.next() => self.step(Input::Fired(timer))?,
                () = reconcile.notified() => self.step(Input::Reconcile)?,
                alive = changed(&mut self.watch) => {
                    if !alive {
                        self.watch = None;
                    }
                    self.step(Input::ProfilesChanged { alive })?;
                }
                Some(()) = self.replies.next(), if !self.replies.is_empty() => {}
            }
            self.drain_ready()?;
        }
    }

    /// Handles the results and manager events that are ready now in the same turn, so
    /// that their commits become one (group commit): with every commit awaited on its
    /// own, 64 concurrent operations ran no faster than one. Their effects still leave
    /// only after the commit, so what the manager and the plugin see is what a commit per
    /// event would have shown.
    fn drain_ready(&mut self) -> Result<(), ProviderError> {
        for _ in 0..MAX_TURN {
            if !self.tasks.is_empty()
                && let Some(Some(input)) = self.tasks.next().now_or_never()
            {
                self.step(input)?;
                continue;
            }
            if !self.machine.accepts_events() {
                break;
            }
            match self.sessions.try_recv() {
                Ok(session) => self.on_session(session)?,
                // Empty, or closed: the loop's `recv` sees the end.
                Err(_) => break,
            }
        }
        Ok(())
    }

    fn step(&mut self, input: Input) -> Result<(), ProviderError> {
        self.machine
            .step(input, Instant::now())
            .map_err(|e| self.machine_error(e))
    }

    fn machine_error(&self, error: MachineError) -> ProviderError {
        match error {
            MachineError::Stage(source) => checkpoint_error(&self.label, source),
            MachineError::Resources(source) => ProviderError::Resources {
                provider: self.label.clone(),
                source,
            },
        }
    }

    fn commit_error(&self, source: slrp_store::StoreError) -> ProviderError {
        checkpoint_error(
            &self.label,
            StateError::Store {
                store: self.deps.store.path().to_owned(),
                source,
            },
        )
    }

    fn on_session(&mut self, session: SessionEvent) -> Result<(), ProviderError> {
        let input = match session {
            SessionEvent::Connected => Input::Connected,
            SessionEvent::Disconnected { reason } => Input::Disconnected {
                not_admitted: matches!(*reason, AgentError::NotAdmitted),
                reason: DisplayChain(&*reason).to_string(),
            },
            SessionEvent::Subscribed { provider_id, .. } => Input::Subscribed { provider_id },
            SessionEvent::Event(event) => Input::Event(event),
        };
        self.step(input)
    }

    /// Carries out what the machine has ready until it has nothing more: an effect carried
    /// out inline (the profile watch, an identity switch) feeds the machine again.
    async fn settle(&mut self) -> Result<(), ProviderError> {
        loop {
            let ready = self
                .machine
                .take_ready(Instant::now())
                .map_err(|e| self.machine_error(e))?;
            if ready.changes.is_empty() && ready.effects.is_empty() {
                break;
            }
            Box::pin(self.carry_out(ready)).await?;
        }
        if let Some(observed) = self.machine.observed() {
            let observed = observed.clone();
            self.status.send_modify(|s| {
                s.lifecycle = observed.lifecycle;
                s.agent_id = observed.agent_id;
                s.provider_id = observed.provider_id;
                s.last_error = observed.last_error;
                s.reconciliations = observed.reconciliations;
                s.updates_sent = observed.updates_sent;
                s.events = observed.events;
            });
        }
        Ok(())
    }

    /// Commits the turn's changes (one fsync for all of them), then carries out the
    /// effects that waited for it.
    async fn carry_out(&mut self, ready: Ready) -> Result<(), ProviderError> {
        let Ready {
            changes,
            quiet,
            effects,
        } = ready;
        let committed = !changes.is_empty();
        if committed {
            let txn = self.deps.store.transaction_with(changes);
            let durable = txn.submit().await.map_err(|e| self.commit_error(e))?;
            if quiet {
                // Only acknowledged operations were forgotten: nothing leaves the process
                // because of it, every later commit is queued after it, and a failure
                // poisons the store (no later commit becomes durable) and ends the
                // worker from the loop. So the next event need not wait for its fsync.
                self.acks.push(durable);
            } else {
                durable.await.map_err(|e| self.commit_error(e))?;
            }
        }
        for effect in effects {
            match effect {
                Effect::PublishCounts if (committed && !quiet) || self.acks.is_empty() => {
                    self.publish_counts();
                }
                Effect::PublishCounts => self.counts_after_acks = true,
                effect => Box::pin(self.execute(effect)).await?,
            }
        }
        Ok(())
    }

    async fn execute(&mut self, effect: Effect) -> Result<(), ProviderError> {
        match effect {
            Effect::Notify { call, about } => self.notify(*call, about),
            Effect::UpdateState {
                seq,
                session,
                call,
                resources,
            } => {
                let agent = self.agent.clone();
                // Encoded here, before the machine's next step: the total is shared with
                // the machine's until then, and a change to it would copy it whole.
                let encoded = agent.encode_update_state(*call, resources.as_slice());
                drop(resources);
                self.tasks.push(Box::pin(async move {
                    let result = match encoded {
                        Ok(encoded) => {
                            // Named in the error of a refusal: the size is what a limit
                            // compares.
                            let bytes = encoded.len();
                            agent
                                .send(encoded)
                                .await
                                .map_err(|e| send_failure(&e, bytes))
                        }
                        Err(error) => Err(send_failure(&error, 0)),
                    };
                    Input::Sent {
                        seq,
                        session,
                        result,
                    }
                }));
            }
            Effect::Disk {
                uuid,
                kind,
                identity,
                call,
            } => {
                let volumes = self.deps.volumes.clone();
                let work = async move {
                    let (outcome, owed) = match call {
                        DiskCall::Create { req, staged: true } => {
                            let (result, owed) = unstage(volumes.create_staged(req).await);
                            (DiskOutcome::Created(result), owed)
                        }
                        DiskCall::Create { req, staged: false } => {
                            (DiskOutcome::Created(volumes.create(req).await), None)
                        }
                        DiskCall::Validate(req) => {
                            (DiskOutcome::Created(volumes.validate(req).await), None)
                        }
                        DiskCall::Delete { id, staged: true } => {
                            let (result, owed) = unstage(volumes.delete_staged(&id).await);
                            (DiskOutcome::Destroyed(result), owed)
                        }
                        DiskCall::Delete { id, staged: false } => {
                            (DiskOutcome::Destroyed(volumes.delete(&id).await), None)
                        }
                    };
                    Input::DiskDone(DiskDone {
                        uuid,
                        identity,
                        outcome,
                        owed,
                    })
                };
                // In the operation's span, like everything else done for it.
                self.tasks
                    .push(Box::pin(work.instrument(operation_span(&uuid, kind))));
            }
            Effect::RemovePersistent {
                uuid,
                identity,
                targets,
            } => {
                let paths = self.params.mount_paths.clone();
                let span =
                    operation_span(&uuid, slrp_core::provider::apply::OperationKind::Destroy);
                self.tasks.push(Box::pin(
                    async move {
                        let result = io::remove_persistent(paths, targets)
                            .await
                            .map_err(|message| OperationError::PersistentRemoval { message });
                        Input::PersistentRemoved {
                            uuid,
                            identity,
                            result,
                        }
                    }
                    .instrument(span),
                ));
            }
            Effect::Publish {
                provider_id,
                uuid,
                ids,
                text,
            } => {
                let volumes = self.deps.volumes.clone();
                let agent = self.agent.clone();
                self.tasks.push(Box::pin(async move {
                    let ok = match crate::publish::publish_all(&volumes, ids).await {
                        Ok(()) => true,
                        Err(error) => {
                            tracing::warn!("Failed to publish resources '{text}': {error}");
                            false
                        }
                    };
                    let answer = machine::publish_answer(provider_id, uuid.clone(), ok);
                    if let Err(error) = agent.call(answer).await {
                        tracing::warn!(uuid = %machine::uuid_text(&uuid), error = %DisplayChain(&error), "answering PUBLISH_RESOURCES failed");
                    }
                    Input::PublishDone
                }));
            }
            Effect::StartJob { ticket, profiles } => self.start_job(ticket, profiles),
            Effect::WatchProfiles => {
                let reported = self.watch_profiles().await;
                self.step(Input::ProfilesWatched(reported))?;
            }
            Effect::CheckAgentId => {
                let config = self.params.agent.clone();
                self.tasks.push(Box::pin(async move {
                    let checked = slrp_agent::operator::get_agent_id(&config)
                        .await
                        .map_err(|e| DisplayChain(&e).to_string());
                    Input::AgentIdChecked(checked)
                }));
            }
            Effect::RecoverIdentity { agent_id } => {
                Box::pin(self.switch_identity(agent_id)).await?
            }
            Effect::Arm(timer, at) => self.timers.arm(timer, at),
            Effect::Disarm(timer) => self.timers.disarm(timer),
            Effect::VolumeRecorded(committed) => committed.done(),
            Effect::PublishTotal => {
                let total: Resources = self.machine.total().clone();
                self.status.send_modify(|s| s.total = total);
            }
            Effect::PublishCounts => self.publish_counts(),
            Effect::Metric(metric) => self.count(metric),
        }
        Ok(())
    }

    fn notify(&mut self, call: Call, about: Notice) {
        let agent = self.agent.clone();
        self.replies.push(Box::pin(async move {
            if let Err(error) = agent.call(call).await {
                let error = DisplayChain(&error);
                match about {
                    Notice::Status(operation) => {
                        tracing::warn!(operation_uuid = %operation, %error, "sending an operation status update failed");
                    }
                    Notice::PublishAnswer(uuid) => {
                        tracing::warn!(%uuid, %error, "answering PUBLISH_RESOURCES failed");
                    }
                }
            }
        }));
    }

    fn count(&self, metric: OpMetric) {
        let operations = self.deps.metrics.operations();
        match metric {
            OpMetric::Pending(kind, delta) => operations.pending(kind, delta),
            OpMetric::Reached(kind, state) => io::count_state(&self.deps.metrics, kind, state),
            OpMetric::UnknownDropped => operations.unknown_dropped(),
        }
    }

    /// A job gathers GetCapacity per profile and ListVolumes concurrently while the loop
    /// keeps reading events (a profile job first updates the profile map from the
    /// adaptor's current set).
    fn start_job(
        &mut self,
        ticket: machine::JobTicket,
        mut profiles: BTreeMap<String, slrp_profiles::ProfileInfo>,
    ) {
        let volumes = self.deps.volumes.clone();
        let page = self.params.list_page_size;
        let adaptor = self.deps.profiles.clone();
        let key = self.key.clone();
        let reported = match (&mut self.watch, ticket.kind()) {
            (Some(rx), JobKind::Profiles) => Some(rx.borrow_and_update().keys().cloned().collect()),
            (None, JobKind::Profiles)
            | (_, JobKind::Subscription | JobKind::Periodic | JobKind::Pools) => None,
        };
        self.tasks.push(Box::pin(async move {
            if let (Some(adaptor), Some(reported)) = (adaptor, reported) {
                io::update_profiles(&adaptor, &key, &mut profiles, &reported).await;
            }
            let result = io::gather(&volumes, page, profiles).await;
            Input::JobDone(JobDone { ticket, result })
        }));
    }

    /// Subscribes to the profile adaptor: the names it reports now, or `None`.
    async fn watch_profiles(&mut self) -> Option<std::collections::BTreeSet<String>> {
        let profiles = self.deps.profiles.as_ref()?;
        match profiles.subscribe(self.key.clone()).await {
            Ok(mut rx) => {
                // Read now: the next change wakes the watch.
                let reported = rx.borrow_and_update().keys().cloned().collect();
                self.watch = Some(rx);
                Some(reported)
            }
            Err(error) => {
                tracing::error!(error = %DisplayChain(&error), "the disk profile adaptor stopped; profiles are not watched");
                None
            }
        }
    }

    /// The agent has a new id: that identity's durable state, recovered from the store like
    /// at start, and a new agent client subscribing with its provider id.
    async fn switch_identity(&mut self, agent_id: String) -> Result<(), ProviderError> {
        let (state, tracked) = io::recover_identity(&self.deps, &self.params, &agent_id).await?;
        self.client_cancel.cancel();
        self.client_cancel = self.cancel.child_token();
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
        self.params.agent_id.clone_from(&agent_id);
        self.step(Input::IdentityRecovered {
            agent_id,
            state: Box::new(state),
            tracked: Box::new(tracked),
        })
    }

    /// A queued acknowledgement commit ended: a failure ends the worker; once none is
    /// outstanding the counts they changed are durable and published.
    fn on_ack_durable(
        &mut self,
        done: Result<(), slrp_store::StoreError>,
    ) -> Result<(), ProviderError> {
        done.map_err(|e| self.commit_error(e))?;
        if self.acks.is_empty() && std::mem::take(&mut self.counts_after_acks) {
            self.publish_counts();
        }
        Ok(())
    }

    /// Publishes the operation counts: what an observer sees tracked is durable.
    fn publish_counts(&mut self) {
        let (operations, unacknowledged) = self.machine.counts();
        self.status.send_if_modified(|s| {
            let changed = (s.operations, s.unacknowledged) != (operations, unacknowledged);
            s.operations = operations;
            s.unacknowledged = unacknowledged;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

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

        let old = slrp_profiles::ProfileInfo {
            capability: Default::default(),
            parameters: BTreeMap::new(),
        };
        let mut profiles = BTreeMap::from([("gone".to_owned(), old)]);
        // "unknown" is reported but the adaptor cannot translate it: left out.
        let reported = BTreeSet::from(["fast".to_owned(), "unknown".to_owned()]);
        io::update_profiles(&adaptor, &key, &mut profiles, &reported).await;
        assert_eq!(profiles.keys().collect::<Vec<_>>(), ["fast"]);
        assert_eq!(profiles["fast"].parameters["tier"], "1");
        cancel.cancel();
        task.await.unwrap();
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
