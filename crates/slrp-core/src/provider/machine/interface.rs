//! What goes in and out of the machine: its configuration, inputs, effects and the
//! answers the driver feeds back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use slrp_csi::VolumeId;
use slrp_proto::mesos::v1::resource::ReservationInfo;
use slrp_proto::mesos::v1::resource_provider::{Call, Event};
use slrp_proto::mesos::v1::{ResourceProviderId, Uuid};
use slrp_store::Changes;
use slrp_types::{Backoff, Jitter, ProfileInfo};
use tokio::time::Instant;

use crate::provider::apply::{OperationError, OperationKind, PersistentVolume};
use crate::provider::lifecycle::Lifecycle;
use crate::provider::operations::Operations;
use crate::provider::resources::{ResourceError, Resources};
use crate::provider::state::{ProviderState, StateError};
use crate::volume::{Committed, CreateVolume, Owed, ValidateVolume, VolumeError, VolumeInfo};

/// How long a total changed by operations waits at least before the observed status
/// shows it (observers only: the manager hears of changes through operation statuses
/// and UPDATE_STATE, which are not delayed). See [`status_total_delay`].
pub const STATUS_TOTAL_INTERVAL: Duration = Duration::from_millis(50);

/// The longest a total changed by operations waits before the observed status shows it.
pub const STATUS_TOTAL_MAX_INTERVAL: Duration = Duration::from_secs(1);

/// How long a total of `entries` entries changed by operations waits before the status
/// shows it: [`STATUS_TOTAL_INTERVAL`] plus 50 µs per entry, at most
/// [`STATUS_TOTAL_MAX_INTERVAL`]. The worker's next change after a publish copies the
/// total's vector of pointers and its index (about 50 ns per entry; the resources
/// themselves are shared: `Resources`), so it takes a bounded share of the worker's time
/// whatever the volume count (at a fixed 50 ms, copying 10,000 whole entries was most of
/// the worker's allocations under load).
pub fn status_total_delay(entries: usize) -> Duration {
    let per_entry =
        Duration::from_micros(50).saturating_mul(u32::try_from(entries).unwrap_or(u32::MAX));
    STATUS_TOTAL_INTERVAL
        .saturating_add(per_entry)
        .min(STATUS_TOTAL_MAX_INTERVAL)
}

/// What the machine needs to know of the provider it runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The agent id the identity belongs to (spec §3.6, §8.6).
    pub agent_id: String,
    /// `storage.plugin.type` and `.name`: the resource context's vendor (§6).
    pub plugin_type: String,
    /// See `plugin_type`.
    pub plugin_name: String,
    /// `ResourceProviderInfo.default_reservations`.
    pub default_reservations: Vec<ReservationInfo>,
    /// `None`: no periodic reconciliation.
    pub reconciliation_interval: Option<Duration>,
    /// Waits between attempts of a failed UPDATE_STATE in the same session.
    pub update_backoff: Backoff,
    /// Waits between attempts of a failed reconciliation.
    pub retry_backoff: Backoff,
    /// How the waits above are drawn below their ceiling.
    pub jitter: Jitter,
    /// The bound of the queue of events waiting for READY.
    pub pending_events: usize,
    /// After a subscription the manager did not admit, ask the agent for its id.
    pub follow_agent_id: bool,
    /// At most this many PUBLISH_RESOURCES carried out at once.
    pub max_publishes: usize,
    /// Whether a disk profile adaptor serves this provider (otherwise: no profiles).
    pub watches_profiles: bool,
}

/// Everything the machine can be told.
#[derive(Debug)]
pub enum Input {
    /// The agent client connected (SUBSCRIBE sent).
    Connected,
    /// The session ended.
    Disconnected {
        /// Why, with its causes.
        reason: String,
        /// The manager does not admit this provider id (a new agent id may be why).
        not_admitted: bool,
    },
    /// SUBSCRIBED.
    Subscribed {
        /// The provider id the manager assigned or confirmed.
        provider_id: ResourceProviderId,
    },
    /// Any other event of the manager.
    Event(Box<Event>),
    /// The answer of [`Effect::CheckAgentId`]: the agent's id, or why it is not known.
    AgentIdChecked(Result<String, String>),
    /// The answer of [`Effect::RecoverIdentity`]: the new identity's durable state.
    IdentityRecovered {
        /// The new agent id.
        agent_id: String,
        /// Its provider state.
        state: Box<ProviderState>,
        /// Its tracked operations.
        tracked: Box<Operations>,
    },
    /// A job of [`Effect::StartJob`] ended.
    JobDone(JobDone),
    /// An UPDATE_STATE of [`Effect::UpdateState`] was answered.
    Sent {
        /// The `seq` of the effect.
        seq: u64,
        /// The `session` of the effect.
        session: u64,
        /// The manager's verdict, or the failure.
        result: Result<(), SendFailure>,
    },
    /// A timer armed with [`Effect::Arm`] fired.
    Fired(Timer),
    /// The answer of [`Effect::WatchProfiles`]: the profile names the adaptor reports
    /// now, or `None` when the watch could not start.
    ProfilesWatched(Option<BTreeSet<String>>),
    /// The profile adaptor's set changed (`alive`), or its watch ended (`!alive`).
    ProfilesChanged {
        /// Whether the watch goes on.
        alive: bool,
    },
    /// A volume manager call of [`Effect::Disk`] ended.
    DiskDone(DiskDone),
    /// The data removal of [`Effect::RemovePersistent`] ended.
    PersistentRemoved {
        /// The DESTROY operation.
        uuid: uuid::Uuid,
        /// The `identity` of the effect.
        identity: u64,
        /// Done, or why not.
        result: Result<(), OperationError>,
    },
    /// A publish of [`Effect::Publish`] was answered.
    PublishDone,
    /// Someone changed the plugin's volumes outside an operation (the operator grew a
    /// disk): reconcile soon, as after a DESTROY_DISK (a pool reconciliation, which asks
    /// the plugin everything a reconciliation asks), once READY and no disk operation
    /// runs.
    Reconcile,
}

/// Why an UPDATE_STATE was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// What happened, with its causes (and, for a refusal, what to change).
    pub message: String,
    /// The manager refused this call itself (a 4xx: a body over its limit, a call it does
    /// not take): the same call would be refused again.
    pub refused: bool,
}

/// The timers the machine arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    /// The next periodic reconciliation (or its early retry).
    Periodic,
    /// The retry of a failed subscription or profile job.
    JobRetry,
    /// The retry of a failed UPDATE_STATE.
    SendRetry,
    /// The observed total catches up with the operations.
    StatusTotal,
    /// The status update manager's next resend.
    StatusRetry,
}

/// What to carry out once the [`Ready`]'s changes are durable, in order.
#[derive(Debug)]
pub enum Effect {
    /// Send a call whose failure is only logged (its retry comes from the machine:
    /// operation status updates, PUBLISH_RESOURCES answers).
    Notify {
        /// The call.
        call: Box<Call>,
        /// What it is about, for the log line of a failure.
        about: Notice,
    },
    /// Send UPDATE_STATE; answer with [`Input::Sent`].
    UpdateState {
        /// Its number.
        seq: u64,
        /// The session it belongs to.
        session: u64,
        /// The call, without its `update_state.resources`: those are `resources`.
        call: Box<Call>,
        /// The total to send as `update_state.resources`, shared with the machine's
        /// (not copied): encoded straight from it (`AgentHandle::encode_update_state`),
        /// the copy a call holding 100,000 resources needs is never made.
        resources: Resources,
    },
    /// Start a volume manager call for a disk operation; answer with [`Input::DiskDone`].
    Disk {
        /// The operation.
        uuid: uuid::Uuid,
        /// Its kind (for the log span).
        kind: OperationKind,
        /// The identity it was started under.
        identity: u64,
        /// The call.
        call: DiskCall,
    },
    /// Tell the volume manager that the record changes it owed are durable (they were in
    /// this turn's commit).
    VolumeRecorded(Committed),
    /// Remove the data of DESTROY's persistent volumes; answer with
    /// [`Input::PersistentRemoved`].
    RemovePersistent {
        /// The operation.
        uuid: uuid::Uuid,
        /// The identity it was started under.
        identity: u64,
        /// The persistent volumes whose data goes.
        targets: Vec<PersistentVolume>,
    },
    /// Publish these volumes (in parallel; the answer says OK iff all were), answer the
    /// manager with [`publish_answer`](super::publish_answer), then [`Input::PublishDone`].
    Publish {
        /// The provider id to answer with.
        provider_id: Option<ResourceProviderId>,
        /// The PUBLISH_RESOURCES uuid.
        uuid: Uuid,
        /// The volumes.
        ids: Vec<VolumeId>,
        /// The resources, for the log line of a failure.
        text: String,
    },
    /// Start a reconciliation job; answer with [`Input::JobDone`] carrying `ticket`.
    StartJob {
        /// What it is.
        ticket: JobTicket,
        /// The profile map to start from: a profile job first brings it up to date with
        /// the adaptor's watch (drops names no longer reported, translates new ones).
        profiles: BTreeMap<String, ProfileInfo>,
    },
    /// Start watching the profile adaptor; answer with [`Input::ProfilesWatched`].
    WatchProfiles,
    /// Ask the agent for its id; answer with [`Input::AgentIdChecked`].
    CheckAgentId,
    /// The agent has a new id: load its identity, start a new agent client and answer
    /// with [`Input::IdentityRecovered`].
    RecoverIdentity {
        /// The new agent id.
        agent_id: String,
    },
    /// Arm `timer` to fire at the instant (replacing its previous deadline).
    Arm(Timer, Instant),
    /// Disarm `timer`.
    Disarm(Timer),
    /// The observed total is out of date: copy [`Machine::total`](super::Machine::total) into the status.
    PublishTotal,
    /// The operation counts changed; publish [`Machine::counts`](super::Machine::counts) once every commit
    /// staged so far is durable.
    PublishCounts,
    /// Count into the operation metrics (spec §9).
    Metric(OpMetric),
}

/// What an [`Effect::Notify`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// An operation status update of this operation uuid.
    Status(String),
    /// The answer to the PUBLISH_RESOURCES of this uuid.
    PublishAnswer(String),
}

/// An operation metric change (spec §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpMetric {
    /// The `pending` gauge of the kind moves by this much.
    Pending(OperationKind, i64),
    /// An operation of the kind reached this `OperationState` (finished, failed, dropped
    /// counters).
    Reached(OperationKind, i32),
    /// RECONCILE_OPERATIONS named an operation nobody knows.
    UnknownDropped,
}

/// A volume manager call of a disk operation.
#[derive(Debug, Clone)]
pub enum DiskCall {
    /// CREATE_DISK from a storage pool.
    Create {
        /// The request.
        req: CreateVolume,
        /// Its intent was committed with the operation's PENDING record
        /// ([`stage_create`](crate::volume::stage_create)): call
        /// [`create_staged`](crate::volume::VolumeManagerHandle::create_staged).
        staged: bool,
    },
    /// CREATE_DISK of a pre-existing volume.
    Validate(ValidateVolume),
    /// DESTROY_DISK.
    Delete {
        /// The volume.
        id: VolumeId,
        /// Its deletion intent was committed with the operation's PENDING record
        /// ([`stage_delete`](crate::volume::stage_delete)): call
        /// [`delete_staged`](crate::volume::VolumeManagerHandle::delete_staged).
        staged: bool,
    },
}

/// The answer of an [`Effect::Disk`].
#[derive(Debug)]
pub struct DiskDone {
    /// The operation.
    pub uuid: uuid::Uuid,
    /// The identity of the effect.
    pub identity: u64,
    /// What the call gave.
    pub outcome: DiskOutcome,
    /// The volume manager's record change of a staged call, for the next commit (the
    /// one with the operation's terminal record).
    pub owed: Option<Owed>,
}

/// What a volume manager call gave.
#[derive(Debug)]
pub enum DiskOutcome {
    /// CreateVolume / ValidateVolume.
    Created(Result<VolumeInfo, VolumeError>),
    /// DeleteVolume: whether the volume was deprovisioned.
    Destroyed(Result<bool, VolumeError>),
}

/// The jobs of the provider-wide sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
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
    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subscription => "subscription reconciliation",
            Self::Periodic => "periodic reconciliation",
            Self::Profiles => "profile update",
            Self::Pools => "storage pool reconciliation",
        }
    }
}

/// Which job an answer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobTicket {
    pub(super) kind: JobKind,
    pub(super) session: u64,
    pub(super) identity: u64,
}

impl JobTicket {
    /// The job's kind.
    pub fn kind(&self) -> JobKind {
        self.kind
    }
}

/// The answer of an [`Effect::StartJob`].
#[derive(Debug)]
pub struct JobDone {
    /// The effect's ticket.
    pub ticket: JobTicket,
    /// What the plugin (and the adaptor) said.
    pub result: Result<Gathered, ReconcileError>,
}

/// What a reconciliation learnt from the plugin (and, for a profile job, the adaptor).
#[derive(Debug)]
pub struct Gathered {
    /// The profile map to use from now on.
    pub profiles: BTreeMap<String, ProfileInfo>,
    /// Available bytes per profile.
    pub capacities: Vec<(String, u64)>,
    /// Every volume the plugin lists.
    pub listing: Vec<slrp_csi::Volume>,
    /// The volumes slrp grew, by id, with the bytes each was grown to (the volume
    /// manager's `expanded_bytes`): their disks are offered at that size.
    pub expanded: BTreeMap<String, u64>,
}

/// Why a reconciliation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// GetCapacity failed in a way that may pass.
    #[error("GetCapacity for profile {profile:?}")]
    Capacity {
        /// The profile asked for.
        profile: String,
        /// Why.
        #[source]
        source: VolumeError,
    },
    /// A profile's capability cannot be expressed to the plugin.
    #[error("the capability of profile {profile:?} is not usable")]
    Capability {
        /// The profile.
        profile: String,
        /// Why.
        #[source]
        source: slrp_types::CapabilityError,
    },
    /// ListVolumes failed.
    #[error("ListVolumes")]
    List(#[source] VolumeError),
    /// The answers did not apply to the total.
    #[error("applying the reconciled resources")]
    Apply(#[source] ResourceError),
}

/// Fatal errors of a step: the driver stops the provider (conventions §4.4 rule 5).
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// A record could not be staged (a build problem, or a key the store refuses).
    #[error("staging the provider's records")]
    Stage(#[source] StateError),
    /// The plugin name or default reservations make no resource context.
    #[error("the resource context")]
    Resources(#[source] ResourceError),
}

/// One turn's output: commit `changes` (one transaction), wait for it unless `quiet`,
/// then carry out `effects` in order.
#[derive(Debug, Default)]
pub struct Ready {
    /// The records to write, in order.
    pub changes: Changes,
    /// Nothing waits for the commit: only acknowledged operations were forgotten, and no
    /// effect follows from it (the driver may go on before the fsync; a failure still
    /// poisons the store and every later commit).
    pub quiet: bool,
    /// What to do once the changes are durable.
    pub effects: Vec<Effect>,
}

/// What the machine shows an observer (the driver's status), besides the total and the
/// operation counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Where the lifecycle is.
    pub lifecycle: Lifecycle,
    /// The agent id the identity belongs to.
    pub agent_id: String,
    /// The provider id, once assigned.
    pub provider_id: Option<String>,
    /// The last failure (a session that ended, a reconciliation, an UPDATE_STATE), with
    /// its causes; cleared by the next accepted UPDATE_STATE.
    pub last_error: Option<String>,
    /// Reconciliations completed (successfully).
    pub reconciliations: u64,
    /// UPDATE_STATE calls the manager accepted.
    pub updates_sent: u64,
    /// What happened to the manager's events.
    pub events: EventStats,
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
