//! The provider as a state machine: every decision of a storage resource provider, behind
//! one step function, with no I/O and nothing async.
//!
//! # Design
//! In the style of the volume layer's `state`/`plan` split and raft-rs's `Ready`: the
//! driver (`slrp_provider::worker`) feeds [`Machine::step`] what happened ([`Input`]:
//! manager events, session changes, plugin answers, results of calls, timer ticks) and,
//! once per turn of its loop, takes a [`Ready`]: the store changes to commit together,
//! whether anything waits for that commit, and the [`Effect`]s to carry out once it is
//! durable (calls to the manager, CSI work, reconciliation jobs, timers to arm). So a
//! status update, a CreateVolume or an UPDATE_STATE never leaves before the records it
//! follows are on disk (spec §5.10), and every decision can be tested by feeding inputs
//! and reading effects, without a socket.
//!
//! What the machine decides:
//! - the lifecycle (spec §3.2 with the fixes of §12: READY only after this session's
//!   subscription reconciliation's UPDATE_STATE was accepted, §12 item 9; the periodic
//!   loop and the profile watch once per process, §12 item 8) and what each manager event
//!   means in each state ([`super::lifecycle::disposition`]);
//! - the provider-wide sequence of reconciliation jobs (subscription, periodic, profile
//!   update, pool reconciliation after a DESTROY_DISK), one at a time and never while a
//!   disk operation runs, retried with jittered backoff, never fatal (§12 items 12, 13);
//! - UPDATE_STATE: when one is needed, its resource version (§6.6), its retries;
//! - operations (the `ops` part): admission, deferral during a reconciliation (§12 item
//!   6), conversions, terminal statuses, the status update manager's retries and pauses,
//!   acknowledgements, RECONCILE_OPERATIONS, PUBLISH_RESOURCES bookkeeping;
//! - what a reconciliation's findings change in the total (the `reconcile` part).
//!
//! Fatal errors are only those of staging a record ([`MachineError::Stage`]) and an
//! unusable resource context ([`MachineError::Resources`]); everything else is an
//! outcome the machine handles.

mod interface;
mod ops;
mod reconcile;
#[cfg(test)]
mod tests;

pub use interface::{
    Config, DiskCall, DiskDone, DiskOutcome, Effect, EventStats, Gathered, Input, JobDone, JobKind,
    JobTicket, MachineError, Notice, Observed, OpMetric, Ready, ReconcileError,
    STATUS_TOTAL_INTERVAL, STATUS_TOTAL_MAX_INTERVAL, SendFailure, Timer, status_total_delay,
};
pub use ops::operation_span;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use slrp_proto::mesos::v1::resource_provider::{Call, Event, call};
use slrp_proto::mesos::v1::{ResourceProviderId, Uuid};
use slrp_types::{DisplayChain, JitterRng, ProfileInfo};
use tokio::time::Instant;

use super::apply::{CreateDiskPlan, OperationKind};
use super::lifecycle::{EventKind, Lifecycle, PendingEvents};
use super::operations::Operations;
use super::resources::{ProviderResources, Resources};
use super::state::ProviderState;

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
            Lifecycle::Subscribed => self.subscription,
            Lifecycle::Recovering | Lifecycle::Disconnected | Lifecycle::Connected => false,
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

/// What a running disk operation becomes when its call ends.
#[derive(Debug)]
enum Running {
    Create(Box<CreateDiskPlan>),
    Destroy(Box<slrp_proto::mesos::v1::Resource>),
    Persistent(Vec<super::resources::Conversion>),
}

/// The UPDATE_STATE side of the machine.
#[derive(Debug, Default)]
struct Sender {
    /// The total changed in a way the agent does not learn from an operation status.
    needed: bool,
    /// The UPDATE_STATE on its way: (seq, session).
    in_flight: Option<(u64, u64)>,
    seq: u64,
    /// READY comes with the first accepted UPDATE_STATE numbered at least this, sent in
    /// the session that ran the subscription reconciliation: (seq, session).
    ready_from: Option<(u64, u64)>,
    retry_armed: bool,
    failures: u32,
}

/// The provider's decisions; see the module docs.
#[derive(Debug)]
pub struct Machine {
    cfg: Config,
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
    /// The tracked operations and their status streams.
    tracked: Operations,
    /// Operations accepted while a reconciliation ran or waited, in arrival order.
    deferred: VecDeque<uuid::Uuid>,
    /// Recovered PENDING operations, applied at the next subscription reconciliation.
    replay: Vec<uuid::Uuid>,
    /// Bumped when the provider identity changes: results of the old one are ignored.
    identity: u64,
    /// Disk operations (and DESTROY's data removals) whose call runs.
    running: HashMap<uuid::Uuid, Running>,
    /// PUBLISH_RESOURCES being carried out.
    publishes: usize,
    /// Events that arrived while a DESTROY removed its data, in arrival order.
    held: VecDeque<Event>,
    /// The status retry deadline armed (`None`: disarmed).
    status_armed: Option<Instant>,
    /// The resource version (spec §6.6): changed with every change of the total the agent
    /// does not learn from an operation status, and sent in UPDATE_STATE.
    resource_version: uuid::Uuid,
    jobs: Jobs,
    /// The job that runs.
    job: Option<JobTicket>,
    /// A failed job waits for its next attempt.
    retry: Option<JobKind>,
    job_failures: u32,
    /// Volumes the plugin lists twice, warned about once per change (issue #26).
    listed_twice: crate::warn_once::WarnOnChange,
    /// The periodic loop and the profile watch run once per process (§3.6).
    loops_started: bool,
    watching: bool,
    send: Sender,
    status_total_armed: bool,
    /// GET_AGENT asked after a subscription that was not admitted.
    agent_check: bool,
    jitter: JitterRng,
    observed: Observed,
    observed_changed: bool,
    /// This turn's output so far.
    out: Ready,
    /// Something other than the removal of acknowledged operations was staged.
    awaited: bool,
    /// The operation counts changed this turn.
    counts_changed: bool,
}

impl Machine {
    /// The machine of a provider recovered with `state` and `tracked` (spec §3.3, §3.4):
    /// DISCONNECTED, every PENDING operation replayed at the first subscription.
    ///
    /// # Errors
    /// [`MachineError::Resources`] for an unusable plugin name or default reservations.
    pub fn new(
        cfg: Config,
        state: ProviderState,
        tracked: Operations,
    ) -> Result<Self, MachineError> {
        let ctx = match &state.provider_id {
            Some(id) => Some(context(&cfg, id.clone())?),
            None => {
                // Checked now rather than at the first SUBSCRIBED.
                context(&cfg, ResourceProviderId::default())?;
                None
            }
        };
        let replay = pending_uuids(&tracked);
        let observed = Observed {
            lifecycle: Lifecycle::Disconnected,
            agent_id: cfg.agent_id.clone(),
            provider_id: state.provider_id.as_ref().map(|id| id.value.clone()),
            last_error: None,
            reconciliations: 0,
            updates_sent: 0,
            events: EventStats::default(),
        };
        let mut machine = Self {
            lifecycle: Lifecycle::Disconnected,
            session: 0,
            ctx,
            live_profiles: state.profiles.clone(),
            profiles_basis: None,
            state,
            pending_events: PendingEvents::new(cfg.pending_events),
            tracked,
            deferred: VecDeque::new(),
            replay,
            identity: 0,
            running: HashMap::new(),
            publishes: 0,
            held: VecDeque::new(),
            status_armed: None,
            resource_version: uuid::Uuid::new_v4(),
            jobs: Jobs::default(),
            job: None,
            retry: None,
            job_failures: 0,
            listed_twice: crate::warn_once::WarnOnChange::default(),
            loops_started: false,
            watching: false,
            send: Sender::default(),
            status_total_armed: false,
            agent_check: false,
            jitter: JitterRng::new(cfg.jitter),
            observed,
            observed_changed: true,
            out: Ready::default(),
            awaited: false,
            counts_changed: false,
            cfg,
        };
        machine.after_ops_change();
        Ok(machine)
    }

    /// Feeds one input at time `now`.
    ///
    /// # Errors
    /// Only fatal ones ([`MachineError`]); the driver stops the provider.
    pub fn step(&mut self, input: Input, now: Instant) -> Result<(), MachineError> {
        match input {
            Input::Connected => self.enter(Lifecycle::Connected),
            Input::Disconnected {
                reason,
                not_admitted,
            } => self.on_disconnected(reason, not_admitted),
            Input::Subscribed { provider_id } => self.on_subscribed(provider_id, now)?,
            Input::Event(event) => self.on_event(*event, now)?,
            Input::AgentIdChecked(checked) => self.on_agent_id(checked),
            Input::IdentityRecovered {
                agent_id,
                state,
                tracked,
            } => self.on_identity(agent_id, *state, *tracked)?,
            Input::JobDone(done) => self.on_job_done(done, now)?,
            Input::Sent {
                seq,
                session,
                result,
            } => self.on_sent(seq, session, result, now)?,
            Input::Fired(timer) => self.on_timer(timer, now)?,
            Input::ProfilesWatched(reported) => self.on_watch_started(reported),
            Input::ProfilesChanged { alive } => {
                if alive {
                    self.jobs.mark(JobKind::Profiles);
                } else {
                    tracing::error!(
                        "the disk profile adaptor stopped; profiles are no longer watched"
                    );
                    self.watching = false;
                }
            }
            Input::DiskDone(done) => self.on_disk_done(done, now)?,
            Input::PersistentRemoved {
                uuid,
                identity,
                result,
            } => self.on_persistent_removed(uuid, identity, result, now)?,
            Input::PublishDone => self.publishes = self.publishes.saturating_sub(1),
            Input::Reconcile => self.jobs.mark(JobKind::Pools),
        }
        Ok(())
    }

    /// Ends the turn: starts what may start now (deferred operations, the next job, an
    /// UPDATE_STATE), re-arms the status timer, and hands over what the turn staged and
    /// what follows from it.
    ///
    /// # Errors
    /// As [`Self::step`].
    pub fn take_ready(&mut self, now: Instant) -> Result<Ready, MachineError> {
        // Deferred operations wait for a reconciliation; none runs or waits any more (one
        // ended in another state, or an identity switch dropped it).
        if self.job.is_none() && !self.jobs.waiting(self.lifecycle) {
            self.start_deferred(now)?;
        }
        // A job waiting out its retry backoff does not hold up the others (a resubscription
        // must not wait for a failed periodic reconciliation's next attempt). A job waits
        // for the disk operations that run (Mesos's provider-wide sequence).
        if self.job.is_none()
            && self.running.is_empty()
            && let Some(kind) = self.jobs.take(self.lifecycle)
        {
            self.start_job(kind);
        }
        self.maybe_send();
        self.arm_status_timer();
        if std::mem::take(&mut self.counts_changed) {
            self.out.effects.push(Effect::PublishCounts);
        }
        let mut ready = std::mem::take(&mut self.out);
        ready.quiet = !std::mem::take(&mut self.awaited)
            && !ready.effects.iter().any(|e| {
                matches!(
                    e,
                    Effect::Notify { .. }
                        | Effect::Disk { .. }
                        | Effect::RemovePersistent { .. }
                        | Effect::UpdateState { .. }
                )
            });
        Ok(ready)
    }

    /// What the observer's status should show, if it changed since the last call.
    pub fn observed(&mut self) -> Option<&Observed> {
        std::mem::take(&mut self.observed_changed).then_some(&self.observed)
    }

    /// The total resources (copy-on-write: cloning it is cheap).
    pub fn total(&self) -> &Resources {
        &self.state.total
    }

    /// The provider's durable state as the machine has it.
    pub fn state(&self) -> &ProviderState {
        &self.state
    }

    /// Operations tracked and, of them, those with an unacknowledged status update.
    pub fn counts(&self) -> (usize, usize) {
        (self.tracked.len(), self.tracked.unacknowledged())
    }

    /// The tracked operations.
    pub fn tracked(&self) -> &Operations {
        &self.tracked
    }

    /// Where the lifecycle is.
    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle
    }

    /// The identity results must carry (bumped by an agent-id switch).
    pub fn identity(&self) -> u64 {
        self.identity
    }

    /// Whether the machine takes manager events now: not while a DESTROY removes its
    /// persistent volumes' data (the agent applied it already, so it must be complete
    /// before the next operation is looked at, as Mesos's synchronous removal is). Events
    /// fed meanwhile are held in order; the driver stops reading them, which keeps the
    /// manager's stream under backpressure as a blocked Mesos actor would.
    pub fn accepts_events(&self) -> bool {
        !self.removing()
    }

    fn removing(&self) -> bool {
        self.running
            .values()
            .any(|r| matches!(r, Running::Persistent(_)))
    }

    /// Handles the events held during a data removal, until another removal starts.
    fn release_held(&mut self, now: Instant) -> Result<(), MachineError> {
        while !self.removing()
            && let Some(event) = self.held.pop_front()
        {
            self.on_event(event, now)?;
        }
        Ok(())
    }

    /// The agent id of the current identity.
    pub fn agent_id(&self) -> &str {
        &self.cfg.agent_id
    }

    /// The current resource version (spec §6.6).
    pub fn resource_version(&self) -> uuid::Uuid {
        self.resource_version
    }

    fn effect(&mut self, effect: Effect) {
        self.out.effects.push(effect);
    }

    fn observe(&mut self, change: impl FnOnce(&mut Observed)) {
        change(&mut self.observed);
        self.observed_changed = true;
    }

    fn set_error(&mut self, error: String) {
        self.observe(|o| o.last_error = Some(error));
    }

    /// The status shows the lifecycle, the ids and the total now.
    fn publish_status(&mut self) {
        let (lifecycle, agent_id) = (self.lifecycle, self.cfg.agent_id.clone());
        let provider_id = self.state.provider_id.as_ref().map(|id| id.value.clone());
        self.observe(|o| {
            o.lifecycle = lifecycle;
            o.agent_id = agent_id;
            o.provider_id = provider_id;
        });
        if std::mem::take(&mut self.status_total_armed) {
            self.effect(Effect::Disarm(Timer::StatusTotal));
        }
        self.effect(Effect::PublishTotal);
    }

    /// Operations changed the total: it reaches the status within
    /// [`status_total_delay`], once for every operation completed meanwhile.
    fn total_changed(&mut self, now: Instant) {
        if !self.status_total_armed {
            self.status_total_armed = true;
            let delay = status_total_delay(self.state.total.len());
            self.effect(Effect::Arm(Timer::StatusTotal, now + delay));
        }
    }

    fn enter(&mut self, state: Lifecycle) {
        if self.lifecycle != state {
            tracing::info!(from = %self.lifecycle, to = %state, "resource provider state changed");
        }
        self.lifecycle = state;
        self.publish_status();
    }

    fn on_disconnected(&mut self, reason: String, not_admitted: bool) {
        tracing::info!(%reason, "disconnected from the resource provider manager");
        // Operators see why the provider is not READY (e.g. a provider id the manager
        // does not admit keeps failing here).
        self.set_error(format!("disconnected: {reason}"));
        self.enter(Lifecycle::Disconnected);
        self.pause_statuses();
        if not_admitted && self.cfg.follow_agent_id && !self.agent_check {
            self.agent_check = true;
            self.effect(Effect::CheckAgentId);
        }
    }

    /// The agent's id after a subscription was not admitted: a new one is a new provider
    /// identity (spec §3.6, §8.6), recovered by the driver like at start.
    fn on_agent_id(&mut self, checked: Result<String, String>) {
        self.agent_check = false;
        match checked {
            Ok(agent_id) if agent_id == self.cfg.agent_id => {
                tracing::info!(%agent_id, "the agent id is unchanged; the manager does not admit this provider id");
            }
            Ok(agent_id) => {
                tracing::warn!(
                    old = %self.cfg.agent_id,
                    new = %agent_id,
                    "the agent has a new agent id: this is a new provider identity"
                );
                self.effect(Effect::RecoverIdentity { agent_id });
            }
            Err(error) => {
                tracing::warn!(%error, "cannot learn the agent id after a subscription was not admitted");
            }
        }
    }

    /// The new identity is recovered and its agent client started: nothing of the old
    /// identity's sessions carries over; the volumes stay in the volume manager.
    fn on_identity(
        &mut self,
        agent_id: String,
        state: ProviderState,
        tracked: Operations,
    ) -> Result<(), MachineError> {
        self.ctx = match &state.provider_id {
            Some(id) => Some(context(&self.cfg, id.clone())?),
            None => None,
        };
        // The old identity's PENDING operations leave the gauge (their records stay).
        let pending: Vec<OperationKind> = self
            .tracked
            .iter()
            .filter(|op| !op.is_terminal())
            .map(|op| OperationKind::of(&op.info))
            .collect();
        for kind in pending {
            self.effect(Effect::Metric(OpMetric::Pending(kind, -1)));
        }
        // Running results and deferred operations of the old identity are left behind:
        // their records stay PENDING under the old agent id, replayed if it comes back.
        self.identity += 1;
        self.replay = pending_uuids(&tracked);
        self.tracked = tracked;
        self.deferred.clear();
        self.running.clear();
        self.held.clear();
        self.cfg.agent_id = agent_id;
        self.state = state;
        self.profiles_basis = None;
        self.session += 1;
        self.send.ready_from = None;
        self.send.needed = false;
        self.send.in_flight = None;
        if std::mem::take(&mut self.send.retry_armed) {
            self.effect(Effect::Disarm(Timer::SendRetry));
        }
        self.jobs.subscription = false;
        self.pending_events = PendingEvents::new(self.cfg.pending_events);
        self.observe(|o| o.events.queued = 0);
        self.enter(Lifecycle::Disconnected);
        self.pause_statuses();
        Ok(())
    }

    fn on_subscribed(&mut self, id: ResourceProviderId, now: Instant) -> Result<(), MachineError> {
        if self.state.provider_id.as_ref() != Some(&id) {
            if let Some(old) = &self.state.provider_id {
                // The client resubscribes with the id it has; a different answer means the
                // manager gave us a new identity, to which the old resources do not belong.
                tracing::warn!(old = %old.value, new = %id.value, "the manager assigned a new provider id; starting as a new identity");
                self.state.total = Resources::new();
                self.state.profiles.clear();
            }
            self.ctx = Some(context(&self.cfg, id.clone())?);
            self.state.provider_id = Some(id.clone());
            self.checkpoint()?;
            tracing::info!(provider_id = %id.value, "subscribed with a new provider id");
        } else {
            tracing::info!(provider_id = %id.value, "subscribed");
        }
        self.session += 1;
        self.send.ready_from = None;
        // An UPDATE_STATE of the last session fails with it; its answer is stale, and this
        // session's first UPDATE_STATE must not wait for it.
        self.send.in_flight = None;
        // What the last session did not send, the subscription reconciliation sends.
        self.send.needed = false;
        self.send.failures = 0;
        if std::mem::take(&mut self.send.retry_armed) {
            self.effect(Effect::Disarm(Timer::SendRetry));
        }
        self.enter(Lifecycle::Subscribed);
        // Recovered PENDING operations first: the reconciliation waits for them (§3.4
        // step 7), so their results are in the total it starts from.
        self.start_replay(now)?;
        self.jobs.mark(JobKind::Subscription);
        Ok(())
    }

    /// Stages the whole provider state (identity, total, pool profiles).
    fn checkpoint(&mut self) -> Result<(), MachineError> {
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
            .stage(&mut self.out.changes, &self.cfg.agent_id, None)
            .map_err(MachineError::Stage)?;
        self.awaited = true;
        self.state = state;
        Ok(())
    }

    fn on_event(&mut self, event: Event, now: Instant) -> Result<(), MachineError> {
        use super::lifecycle::{Disposition, disposition};
        if self.removing() {
            self.held.push_back(event);
            return Ok(());
        }
        let kind = EventKind::of(&event);
        let reconciled = self.lifecycle == Lifecycle::Subscribed
            && self
                .send
                .ready_from
                .is_some_and(|(_, session)| session == self.session);
        match disposition(self.lifecycle, reconciled, kind) {
            Disposition::Handle => self.on_ready_event(event, now)?,
            Disposition::Queue => {
                tracing::info!(event = %kind, state = %self.lifecycle, "queueing the event until READY");
                let evicted = self.pending_events.push(event);
                let queued = self.pending_events.len();
                let overflowed = u64::from(evicted.is_some());
                self.observe(|o| {
                    o.events.queued = queued;
                    o.events.overflowed += overflowed;
                });
                if let Some(unkept) = evicted {
                    self.not_queued(unkept, now)?;
                }
            }
            Disposition::Drop { message } => {
                self.observe(|o| o.events.dropped += 1);
                match event.apply_operation {
                    Some(apply) => self.on_apply(apply, Some(message), now)?,
                    None => tracing::warn!("APPLY_OPERATION without its payload; ignored"),
                }
            }
            Disposition::AnswerFailed { message } => {
                tracing::warn!(uuid = %event_operation(&event), "{message}");
                self.answer_publish_failed(&event);
            }
            Disposition::Ignore => tracing::info!(event = %kind, "ignoring the event"),
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
    fn not_queued(&mut self, event: Event, now: Instant) -> Result<(), MachineError> {
        use super::lifecycle::{Disposition, disposition};
        let kind = EventKind::of(&event);
        tracing::error!(
            event = %kind,
            operation_uuid = %event_operation(&event),
            bound = self.cfg.pending_events,
            "too many events waiting for READY; this one is not kept"
        );
        let refused = match disposition(Lifecycle::Subscribed, false, kind) {
            Disposition::Drop { message } | Disposition::AnswerFailed { message } => message,
            Disposition::Handle
            | Disposition::Queue
            | Disposition::Ignore
            | Disposition::Warn { .. } => return Ok(()),
        };
        match kind {
            EventKind::ApplyOperation => {
                let Some(apply) = event.apply_operation else {
                    return Ok(());
                };
                self.observe(|o| o.events.dropped += 1);
                self.on_apply(apply, Some(refused), now)?;
            }
            EventKind::PublishResources => {
                tracing::warn!(uuid = %event_operation(&event), "{refused}");
                self.answer_publish_failed(&event);
            }
            EventKind::Subscribed
            | EventKind::AcknowledgeOperationStatus
            | EventKind::ReconcileOperations
            | EventKind::Teardown
            | EventKind::Unknown => {}
        }
        Ok(())
    }

    /// Every operation-flow event in READY arrives here (spec §5; the `ops` part).
    fn on_ready_event(&mut self, event: Event, now: Instant) -> Result<(), MachineError> {
        let kind = EventKind::of(&event);
        self.observe(|o| o.events.handled += 1);
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
            (EventKind::ApplyOperation, Some(apply), ..) => self.on_apply(apply, None, now)?,
            (EventKind::PublishResources, _, Some(publish), ..) => self.on_publish(publish),
            (EventKind::AcknowledgeOperationStatus, _, _, Some(ack), _) => {
                self.on_acknowledge(&ack, now)?;
            }
            (EventKind::ReconcileOperations, .., Some(reconcile)) => self.on_reconcile(&reconcile),
            (kind, ..) => tracing::warn!(event = %kind, "an event without its payload; ignored"),
        }
        Ok(())
    }

    fn answer_publish_failed(&mut self, event: &Event) {
        self.observe(|o| o.events.publish_failed += 1);
        let Some(publish) = &event.publish_resources else {
            tracing::warn!("PUBLISH_RESOURCES without its payload; nothing to answer");
            return;
        };
        self.answer_publish(&publish.uuid, false);
    }

    fn become_ready(&mut self, now: Instant) -> Result<(), MachineError> {
        self.enter(Lifecycle::Ready);
        self.resume_statuses(now);
        if !self.loops_started {
            self.loops_started = true;
            self.arm_periodic(now);
            if self.cfg.watches_profiles {
                self.effect(Effect::WatchProfiles);
            }
        }
        // After the loops: a disk operation queued for READY is deferred behind the first
        // profile update (Mesos drops it then) instead of meeting an empty profile map.
        for event in self.pending_events.drain() {
            if self.removing() {
                self.held.push_back(event);
            } else {
                self.on_ready_event(event, now)?;
            }
        }
        self.observe(|o| o.events.queued = 0);
        Ok(())
    }

    /// The profile watch started (§3.6, once per process).
    fn on_watch_started(&mut self, reported: Option<BTreeSet<String>>) {
        let Some(reported) = reported else {
            return;
        };
        self.watching = true;
        // Mesos's `watch` returns at once only when the adaptor's set differs from the
        // provider's (the profiles of its checkpointed pools): then update now. Otherwise
        // the subscription reconciliation, which used those profiles, is current, and the
        // next change wakes the watch.
        if !reported.iter().eq(self.live_profiles.keys()) {
            self.jobs.mark(JobKind::Profiles);
        }
    }

    fn arm_periodic(&mut self, now: Instant) {
        if let Some(interval) = self.cfg.reconciliation_interval {
            self.effect(Effect::Arm(Timer::Periodic, now + interval));
        }
    }

    fn on_timer(&mut self, timer: Timer, now: Instant) -> Result<(), MachineError> {
        match timer {
            Timer::Periodic => {
                if self.lifecycle == Lifecycle::Ready {
                    self.jobs.mark(JobKind::Periodic);
                } else {
                    // Not connected: the next subscription reconciles anyway.
                    self.arm_periodic(now);
                }
            }
            Timer::JobRetry => {
                if let Some(kind) = self.retry.take() {
                    self.jobs.mark(kind);
                }
            }
            Timer::SendRetry => self.send.retry_armed = false,
            Timer::StatusTotal => self.publish_status(),
            Timer::StatusRetry => self.on_status_timer(now),
        }
        Ok(())
    }

    /// The total changed in a way the agent does not learn from an operation status: a
    /// new resource version, sent in the next UPDATE_STATE (spec §6.6).
    fn state_changed(&mut self) {
        self.resource_version = uuid::Uuid::new_v4();
        self.send.needed = true;
    }

    fn start_job(&mut self, kind: JobKind) {
        let ticket = JobTicket {
            kind,
            session: self.session,
            identity: self.identity,
        };
        tracing::debug!(job = kind.as_str(), "starting");
        self.job = Some(ticket);
        let profiles = self.live_profiles.clone();
        self.effect(Effect::StartJob { ticket, profiles });
    }

    /// Whether a reconciliation job runs or waits to run (Mesos's `reconciled` future is
    /// pending): operations that must not overlap one are deferred.
    fn reconciling(&self) -> bool {
        self.job.is_some() || self.jobs.waiting(self.lifecycle) || !self.deferred.is_empty()
    }

    fn on_job_done(&mut self, done: JobDone, now: Instant) -> Result<(), MachineError> {
        let JobDone { ticket, result } = done;
        if self.job == Some(ticket) {
            self.job = None;
        }
        let JobTicket {
            kind,
            session,
            identity,
        } = ticket;
        if identity != self.identity {
            self.on_stale_job(kind, result, now);
            return self.start_deferred(now);
        }
        let outcome = match result {
            Ok(gathered) => self.apply_reconciliation(gathered)?,
            Err(error) => Err(error),
        };
        match outcome {
            Ok(changed) => {
                self.job_failures = 0;
                self.observe(|o| o.reconciliations += 1);
                // Before READY only this session's subscription reconciliation sends: the
                // first UPDATE_STATE of a session is its (Mesos). A job of the previous
                // session ending now has changed the total that reconciliation starts from.
                let own_subscription = kind == JobKind::Subscription && session == self.session;
                if own_subscription || (changed && self.lifecycle == Lifecycle::Ready) {
                    self.state_changed();
                }
                match kind {
                    JobKind::Subscription if session == self.session => {
                        self.send.ready_from = Some((self.send.seq + 1, session));
                    }
                    JobKind::Subscription | JobKind::Profiles | JobKind::Pools => {}
                    JobKind::Periodic => self.arm_periodic(now),
                }
            }
            Err(error) => {
                let delay = self
                    .cfg
                    .retry_backoff
                    .delay(self.job_failures, &mut self.jitter);
                self.job_failures = self.job_failures.saturating_add(1);
                let chain = format!("{} failed: {}", kind.as_str(), DisplayChain(&error));
                tracing::warn!(retry_in = ?delay, "{chain}");
                self.set_error(chain);
                match kind {
                    // The periodic loop retries by ticking early; it never stops.
                    JobKind::Periodic => self.effect(Effect::Arm(Timer::Periodic, now + delay)),
                    // Mesos only logs it; the next periodic reconciliation recovers the space.
                    JobKind::Pools => {}
                    // A stale subscription job is not retried: the new session has its own.
                    JobKind::Subscription if session != self.session => {}
                    JobKind::Subscription | JobKind::Profiles => {
                        if let Some(other) = self.retry.replace(kind)
                            && other != kind
                        {
                            // One retry slot: the job it held runs now instead of being lost.
                            self.jobs.mark(other);
                        }
                        self.effect(Effect::Arm(Timer::JobRetry, now + delay));
                    }
                }
            }
        }
        // The reconciliation ended: what arrived meanwhile goes now, before the next job.
        self.start_deferred(now)
    }

    /// A job started before an agent-id switch ended: only what does not depend on the
    /// identity (the translated profiles) is kept; its listing is not applied to the new
    /// identity's total. The new identity's subscription reconciliation is marked at its
    /// SUBSCRIBED and starts now that the sequence is free; a periodic or profile job is
    /// not lost.
    fn on_stale_job(
        &mut self,
        kind: JobKind,
        result: Result<Gathered, ReconcileError>,
        now: Instant,
    ) {
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
            JobKind::Periodic => self.arm_periodic(now),
            // The watch was read when it started: its change would not come again.
            JobKind::Profiles if !ok => self.jobs.mark(JobKind::Profiles),
            JobKind::Profiles | JobKind::Subscription | JobKind::Pools => {}
        }
    }

    fn maybe_send(&mut self) {
        if self.send.in_flight.is_some()
            || self.send.retry_armed
            || !self.send.needed
            || !self.lifecycle.is_subscribed()
        {
            return;
        }
        let Some(id) = self.state.provider_id.clone() else {
            return;
        };
        self.send.needed = false;
        self.send.seq += 1;
        let version = self.resource_version;
        let call = Call {
            r#type: Some(call::Type::UpdateState as i32),
            resource_provider_id: Some(id),
            update_state: Some(call::UpdateState {
                operations: self.tracked.to_mesos(),
                resources: Vec::new(),
                resource_version_uuid: Uuid {
                    value: version.as_bytes().to_vec(),
                },
            }),
            ..Call::default()
        };
        let (seq, session) = (self.send.seq, self.session);
        self.send.in_flight = Some((seq, session));
        tracing::debug!(%version, resources = %self.state.total, "sending UPDATE_STATE");
        self.effect(Effect::UpdateState {
            seq,
            session,
            call: Box::new(call),
            resources: self.state.total.clone(),
        });
    }

    fn on_sent(
        &mut self,
        seq: u64,
        session: u64,
        result: Result<(), SendFailure>,
        now: Instant,
    ) -> Result<(), MachineError> {
        if self.send.in_flight == Some((seq, session)) {
            self.send.in_flight = None;
        }
        let current = session == self.session && self.lifecycle.is_subscribed();
        match result {
            Ok(()) => {
                self.send.failures = 0;
                self.observe(|o| {
                    o.last_error = None;
                    o.updates_sent += 1;
                });
                if let Some((from, ready_session)) = self.send.ready_from
                    && current
                    && seq >= from
                    && ready_session == session
                {
                    self.send.ready_from = None;
                    self.become_ready(now)?;
                }
            }
            Err(failure) if failure.refused => {
                // The same body would be refused again (e.g. a total over the manager's
                // body limit): resending it unchanged every backoff only fills the log.
                // The next change of the total, or the next session (a manager restarted
                // with a higher limit), sends again.
                let chain = format!("UPDATE_STATE refused by the manager: {}", failure.message);
                tracing::error!(
                    "{chain}; not resent until the total changes or the provider resubscribes"
                );
                self.set_error(chain);
            }
            Err(failure) => {
                let chain = format!("UPDATE_STATE failed: {}", failure.message);
                self.set_error(chain.clone());
                if !current {
                    // The next subscription reconciles and sends again.
                    tracing::info!("{chain}; the session ended");
                    return Ok(());
                }
                let delay = self
                    .cfg
                    .update_backoff
                    .delay(self.send.failures, &mut self.jitter);
                self.send.failures = self.send.failures.saturating_add(1);
                tracing::warn!(retry_in = ?delay, "{chain}");
                self.send.needed = true;
                self.send.retry_armed = true;
                self.effect(Effect::Arm(Timer::SendRetry, now + delay));
            }
        }
        Ok(())
    }
}

/// The resource context of provider `id`.
fn context(cfg: &Config, id: ResourceProviderId) -> Result<ProviderResources, MachineError> {
    ProviderResources::new(
        id,
        &cfg.plugin_type,
        &cfg.plugin_name,
        cfg.default_reservations.clone(),
    )
    .map_err(MachineError::Resources)
}

fn pending_uuids(tracked: &Operations) -> Vec<uuid::Uuid> {
    tracked
        .iter()
        .filter(|op| !op.is_terminal())
        .map(|op| op.uuid)
        .collect()
}

/// A UUID in its text form (Mesos's `id::UUID::toString`), or hex for other lengths.
pub fn uuid_text(uuid: &Uuid) -> String {
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

/// The UPDATE_PUBLISH_RESOURCES_STATUS answer to a PUBLISH_RESOURCES.
pub fn publish_answer(provider_id: Option<ResourceProviderId>, uuid: Uuid, ok: bool) -> Call {
    use call::update_publish_resources_status::Status;
    let status = if ok { Status::Ok } else { Status::Failed };
    Call {
        r#type: Some(call::Type::UpdatePublishResourcesStatus as i32),
        resource_provider_id: provider_id,
        update_publish_resources_status: Some(call::UpdatePublishResourcesStatus {
            uuid,
            status: status as i32,
        }),
        ..Call::default()
    }
}
