//! A model-based property test of the provider machine (issue #21, section 2): the real
//! [`Machine`] driven by random sequences of manager events (CREATE_DISK from pools and
//! their reserved parts, DESTROY_DISK, RESERVE, acknowledgements, disconnects), plugin
//! answers (success, failure, sizes other than asked, answers in any order and late),
//! reconciliation results (failing, overlapping operations, volumes vanishing), timer
//! ticks, and crashes at every point between effects, the machine's records committed
//! to a real store and recovered from it after each crash. Checked after every step:
//!
//! 1. everything PENDING operations consume is in the total;
//! 2. after each reconciliation, per profile, the unreserved free pool is at most what the
//!    plugin reports beyond the parts in flight, and no reserved storage is invented (no
//!    storage counted twice);
//! 3. a FINISHED conversion keeps the quantity it consumed (a Mesos master's allocator
//!    invariant, 0.001 MB fixed point);
//! 4. every operation has exactly one terminal status (one status uuid, however often it
//!    is resent, across crashes), and all end once the plugin answers;
//! 5. an operation that ends DROPPED made no CSI call;
//! 6. no volume is in the total twice, and an acknowledged operation is forgotten for good
//!    (not tracked, not recovered after a crash);
//! 7. one commit per step (section 3): a volume manager intent staged with a PENDING
//!    record is durable before its call, and gone (the manager's record change folded in)
//!    in the commit that makes the operation FINISHED.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use slrp_core::provider::apply::OperationKind;
use slrp_core::provider::ledger;
use slrp_core::provider::lifecycle::Lifecycle;
use slrp_core::provider::machine::{
    Config, DiskCall, DiskDone, DiskOutcome, Effect, Gathered, Input, JobDone, JobKind, JobTicket,
    Machine, ReconcileError, SendFailure, Timer,
};
use slrp_core::provider::operations::{
    OperationRecord, Operations, StatusRetry, operations_of, operations_prefix,
};
use slrp_core::provider::resources::{Resources, is_storage_pool};
use slrp_core::provider::state::{ProviderState, resource_prefix};
use slrp_core::volume::{CreateVolume, DeleteIntent, Owed, VolumeError, VolumeInfo};
use slrp_csi::{Volume, VolumeCapability, VolumeId};
use slrp_proto::mesos::v1::offer::operation::{CreateDisk, DestroyDisk, Reserve};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{AllocationInfo, ReservationInfo};
use slrp_proto::mesos::v1::resource_provider::{Event, event};
use slrp_proto::mesos::v1::{
    OperationState, Resource, ResourceProviderId, Uuid, offer, value::Scalar,
};
use slrp_store::{Changes, Store};
use slrp_types::{Backoff, Jitter, ProfileInfo};
use tokio::time::Instant;

const MB: u64 = 1_048_576;
const PROFILES: [&str; 2] = ["a", "b"];
const AGENT: &str = "agent";

#[derive(Debug, Clone)]
enum Step {
    /// CREATE_DISK of `mb` from profile `profile`'s pool, its reserved part if `reserved`;
    /// built on a stale resource version if `stale`.
    Create {
        profile: usize,
        mb: u64,
        reserved: bool,
        stale: bool,
    },
    /// DESTROY_DISK of the `n`th MOUNT disk.
    Destroy { n: usize },
    /// RESERVE `mb` of profile `profile`'s unreserved pool for a framework.
    Reserve { profile: usize, mb: u64 },
    /// The plugin answers the `n`th running call: `ok`, having made `extra` MB more than
    /// asked (or less, if `short`).
    Answer {
        n: usize,
        ok: bool,
        extra: u64,
        short: bool,
    },
    /// The running reconciliation job gets its answers (or fails).
    Job { fail: bool },
    /// The manager answers the UPDATE_STATE on its way.
    Sent { ok: bool },
    /// The agent acknowledges the `n`th status it has not acknowledged yet.
    Ack { n: usize },
    /// The `n`th armed timer fires.
    Tick { n: usize },
    /// The plugin loses the `n`th volume (it is no longer listed).
    Lose { n: usize },
    /// The session ends and a new one subscribes.
    Resubscribe,
    /// The process crashes: every effect not carried out is lost; the machine is
    /// recovered from the store.
    Crash,
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..2, 1u64..5, any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(profile, mb, reserved, stale)| Step::Create { profile, mb, reserved, stale }
        ),
        2 => (0usize..4).prop_map(|n| Step::Destroy { n }),
        1 => (0usize..2, 1u64..4).prop_map(|(profile, mb)| Step::Reserve { profile, mb }),
        5 => (0usize..4, prop::bool::weighted(0.8), 0u64..2, any::<bool>())
            .prop_map(|(n, ok, extra, short)| Step::Answer { n, ok, extra, short }),
        3 => prop::bool::weighted(0.2).prop_map(|fail| Step::Job { fail }),
        3 => prop::bool::weighted(0.85).prop_map(|ok| Step::Sent { ok }),
        3 => (0usize..4).prop_map(|n| Step::Ack { n }),
        2 => (0usize..5).prop_map(|n| Step::Tick { n }),
        1 => (0usize..4).prop_map(|n| Step::Lose { n }),
        1 => Just(Step::Resubscribe),
        1 => Just(Step::Crash),
    ]
}

/// The plugin: free space per profile, and its volumes (id → (profile, bytes)).
#[derive(Debug, Default)]
struct Plugin {
    free: BTreeMap<&'static str, u64>,
    volumes: BTreeMap<String, (Option<String>, u64)>,
}

impl Plugin {
    fn listing(&self) -> Vec<Volume> {
        self.volumes
            .iter()
            .map(|(id, (_, bytes))| Volume {
                volume_id: VolumeId::new(id.as_str()),
                capacity_bytes: i64::try_from(*bytes).unwrap(),
                volume_context: BTreeMap::new(),
            })
            .collect()
    }
}

/// What the agent saw of one operation.
#[derive(Debug, Default)]
struct Seen {
    kind: Option<OperationKind>,
    /// Distinct terminal status uuids.
    terminal: BTreeSet<uuid::Uuid>,
    state: i32,
    acked: bool,
    /// Any CSI call was started for it.
    called: bool,
    /// The latest status uuid, to acknowledge.
    status: Option<uuid::Uuid>,
}

struct World {
    rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    store: Store,
    cfg: Config,
    machine: Machine,
    profiles: BTreeMap<String, ProfileInfo>,
    plugin: Plugin,
    default_reservations: bool,
    /// Effects the world has not answered yet.
    jobs: Vec<(JobTicket, BTreeMap<String, ProfileInfo>)>,
    disks: Vec<(uuid::Uuid, u64, DiskCall)>,
    sends: Vec<(u64, u64)>,
    timers: BTreeMap<&'static str, Timer>,
    seen: BTreeMap<uuid::Uuid, Seen>,
    now: Instant,
}

fn timer_name(timer: Timer) -> &'static str {
    match timer {
        Timer::Periodic => "periodic",
        Timer::JobRetry => "job-retry",
        Timer::SendRetry => "send-retry",
        Timer::StatusTotal => "status-total",
        Timer::StatusRetry => "status-retry",
    }
}

fn fixed(value: f64) -> i64 {
    (value * 1000.0).round() as i64
}

fn mb_of(r: &Resource) -> f64 {
    r.scalar.map_or(0.0, |s| s.value)
}

fn source(r: &Resource) -> Option<&slrp_proto::mesos::v1::resource::disk_info::Source> {
    r.disk.as_ref().and_then(|d| d.source.as_ref())
}

fn refine(mut r: Resource) -> Resource {
    r.reservations.push(ReservationInfo {
        r#type: Some(ReservationType::Dynamic as i32),
        role: Some("storage/fw".to_owned()),
        principal: None,
        labels: None,
    });
    r
}

fn allocated(mut r: Resource) -> Resource {
    r.allocation_info = Some(AllocationInfo {
        role: Some("storage".to_owned()),
    });
    r
}

fn sized(mut r: Resource, mb: f64) -> Resource {
    r.scalar = Some(Scalar { value: mb });
    r
}

fn proto_uuid(uuid: uuid::Uuid) -> Uuid {
    Uuid {
        value: uuid.as_bytes().to_vec(),
    }
}

fn provider_id() -> ResourceProviderId {
    ResourceProviderId {
        value: "rp".to_owned(),
    }
}

impl World {
    fn new(default_reservations: bool, pools: (u64, u64), preexisting: usize) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let dir = tempfile::tempdir_in(scratch()).unwrap();
        let path = dir.path().to_owned();
        let store = rt
            .block_on(async { tokio::task::spawn_blocking(move || Store::open(path)).await })
            .unwrap()
            .unwrap();
        let reservations = if default_reservations {
            vec![ReservationInfo {
                r#type: Some(ReservationType::Dynamic as i32),
                role: Some("storage".to_owned()),
                principal: None,
                labels: None,
            }]
        } else {
            Vec::new()
        };
        let cfg = Config {
            agent_id: AGENT.to_owned(),
            plugin_type: "org.apache.mesos.csi.test".to_owned(),
            plugin_name: "local".to_owned(),
            default_reservations: reservations,
            reconciliation_interval: Some(Duration::from_secs(10)),
            update_backoff: Backoff::PLUGIN_RESTART,
            retry_backoff: Backoff::PLUGIN_RESTART,
            jitter: Jitter::None,
            pending_events: 64,
            follow_agent_id: false,
            max_publishes: 8,
            watches_profiles: true,
        };
        let def = ProfileInfo {
            capability: VolumeCapability::mount_default().to_mesos().unwrap(),
            parameters: BTreeMap::new(),
        };
        let profiles = PROFILES
            .iter()
            .map(|p| ((*p).to_owned(), def.clone()))
            .collect();
        let mut plugin = Plugin::default();
        plugin.free.insert("a", pools.0 * MB);
        plugin.free.insert("b", pools.1 * MB);
        for n in 0..preexisting {
            plugin
                .volumes
                .insert(format!("pre-{n}"), (None, (n as u64 + 1) * MB));
        }
        let machine = Machine::new(
            cfg.clone(),
            ProviderState::default(),
            Operations::new(StatusRetry::default()),
        )
        .unwrap();
        let now = rt.block_on(async { Instant::now() });
        let mut world = Self {
            rt,
            _dir: dir,
            store,
            cfg,
            machine,
            profiles,
            plugin,
            default_reservations,
            jobs: Vec::new(),
            disks: Vec::new(),
            sends: Vec::new(),
            timers: BTreeMap::new(),
            seen: BTreeMap::new(),
            now,
        };
        world.subscribe();
        world.settle_to_ready();
        world
    }

    fn feed(&mut self, input: Input) {
        self.machine.step(input, self.now).unwrap();
        self.turn();
    }

    /// One turn: commit what the machine staged, then take in its effects.
    fn turn(&mut self) {
        loop {
            let ready = self.machine.take_ready(self.now).unwrap();
            if ready.changes.is_empty() && ready.effects.is_empty() {
                return;
            }
            if !ready.changes.is_empty() {
                let txn = self.store.transaction_with(ready.changes);
                self.rt.block_on(txn.commit()).unwrap();
            }
            for effect in ready.effects {
                self.take(effect);
            }
        }
    }

    fn take(&mut self, effect: Effect) {
        match effect {
            Effect::Notify { call, .. } => {
                if let Some(update) = call.update_operation_status {
                    self.saw_status(&update);
                }
            }
            Effect::UpdateState { seq, session, .. } => self.sends.push((seq, session)),
            Effect::Disk {
                uuid,
                identity,
                call,
                ..
            } => {
                match &call {
                    DiskCall::Create { req, staged: true } => {
                        assert!(
                            self.stored::<CreateVolume>(&req.name),
                            "{uuid}: called before its intent was durable"
                        );
                    }
                    DiskCall::Delete { id, staged: true } => {
                        assert!(
                            self.stored::<DeleteIntent>(id.as_str()),
                            "{uuid}: called before its intent was durable"
                        );
                    }
                    DiskCall::Create { .. } | DiskCall::Delete { .. } | DiskCall::Validate(_) => {}
                }
                self.seen.entry(uuid).or_default().called = true;
                self.disks.push((uuid, identity, call));
            }
            Effect::VolumeRecorded(committed) => committed.done(),
            Effect::RemovePersistent { .. } | Effect::Publish { .. } => {
                panic!("the model sends no DESTROY or PUBLISH_RESOURCES")
            }
            Effect::StartJob { ticket, profiles } => self.jobs.push((ticket, profiles)),
            Effect::WatchProfiles => {
                let names = self.profiles.keys().cloned().collect();
                self.machine
                    .step(Input::ProfilesWatched(Some(names)), self.now)
                    .unwrap();
            }
            Effect::CheckAgentId | Effect::RecoverIdentity { .. } => {
                panic!("the subscription is always admitted")
            }
            Effect::Arm(timer, _) => {
                self.timers.insert(timer_name(timer), timer);
            }
            Effect::Disarm(timer) => {
                self.timers.remove(timer_name(timer));
            }
            Effect::PublishTotal | Effect::PublishCounts | Effect::Metric(_) => {}
        }
    }

    fn saw_status(
        &mut self,
        update: &slrp_proto::mesos::v1::resource_provider::call::UpdateOperationStatus,
    ) {
        let uuid = uuid::Uuid::from_slice(&update.operation_uuid.value).unwrap();
        let status = &update.status;
        let terminal = status.state != OperationState::OperationPending as i32;
        let Some(status_uuid) = status.uuid.as_ref() else {
            // RECONCILE_OPERATIONS' unreliable answer; the model sends none.
            return;
        };
        let status_uuid = uuid::Uuid::from_slice(&status_uuid.value).unwrap();
        let seen = self.seen.entry(uuid).or_default();
        seen.state = status.state;
        seen.status = Some(status_uuid);
        if terminal {
            seen.terminal.insert(status_uuid);
        }
    }

    fn subscribe(&mut self) {
        self.feed(Input::Connected);
        self.feed(Input::Subscribed {
            provider_id: provider_id(),
        });
    }

    /// Answers jobs and sends until READY (the subscription must succeed eventually).
    fn settle_to_ready(&mut self) {
        for _ in 0..16 {
            if self.machine.lifecycle() == Lifecycle::Ready {
                return;
            }
            while !self.disks.is_empty() {
                self.answer(0, true, 0, false);
            }
            if !self.jobs.is_empty() {
                self.job(false);
            }
            if !self.sends.is_empty() {
                self.sent(true);
            }
            if self.jobs.is_empty() && self.sends.is_empty() && self.disks.is_empty() {
                // A failed job or send waits for its retry timer.
                for name in ["job-retry", "send-retry"] {
                    if let Some(timer) = self.timers.remove(name) {
                        self.feed(Input::Fired(timer));
                    }
                }
            }
        }
        assert_eq!(self.machine.lifecycle(), Lifecycle::Ready, "never READY");
    }

    fn is_default(&self, r: &Resource) -> bool {
        let defaults = &self.cfg.default_reservations;
        r.reservations == *defaults
    }

    fn held(&self) -> Resources {
        self.machine
            .tracked()
            .iter()
            .filter(|op| !op.is_terminal())
            .flat_map(|op| ledger::consumed_by(&op.info).into_vec())
            .collect()
    }

    fn available(&self) -> Resources {
        self.machine.total().clone() - &self.held()
    }

    fn apply(&mut self, info: offer::Operation, stale: bool) {
        let uuid = uuid::Uuid::new_v4();
        let version = if stale {
            uuid::Uuid::new_v4()
        } else {
            self.machine.resource_version()
        };
        self.seen.entry(uuid).or_default().kind = Some(OperationKind::of(&info));
        let event = Event {
            r#type: Some(event::Type::ApplyOperation as i32),
            apply_operation: Some(event::ApplyOperation {
                framework_id: None,
                info,
                operation_uuid: proto_uuid(uuid),
                resource_version_uuid: proto_uuid(version),
            }),
            ..Event::default()
        };
        self.feed(Input::Event(Box::new(event)));
    }

    fn step(&mut self, step: &Step) {
        match *step {
            Step::Create {
                profile,
                mb,
                reserved,
                stale,
            } => {
                let profile = PROFILES[profile];
                let available = self.available();
                let part = available.iter().find(|r| {
                    is_storage_pool(r)
                        && source(r).and_then(|s| s.profile.as_deref()) == Some(profile)
                        && self.is_default(r) != reserved
                });
                let Some(part) = part.cloned() else { return };
                let mb = (mb as f64).min(mb_of(&part));
                let info = offer::Operation {
                    r#type: Some(offer::operation::Type::CreateDisk as i32),
                    create_disk: Some(CreateDisk {
                        source: allocated(sized(part, mb)),
                        target_type: SourceType::Mount as i32,
                        target_profile: None,
                    }),
                    ..offer::Operation::default()
                };
                self.apply(info, stale);
            }
            Step::Destroy { n } => {
                let disk = self
                    .available()
                    .iter()
                    .filter(|r| source(r).is_some_and(|s| s.r#type == SourceType::Mount as i32))
                    .nth(n)
                    .cloned();
                let Some(disk) = disk else { return };
                let info = offer::Operation {
                    r#type: Some(offer::operation::Type::DestroyDisk as i32),
                    destroy_disk: Some(DestroyDisk {
                        source: allocated(disk),
                    }),
                    ..offer::Operation::default()
                };
                self.apply(info, false);
            }
            Step::Reserve { profile, mb } => {
                let profile = PROFILES[profile];
                let available = self.available();
                let part = available.iter().find(|r| {
                    is_storage_pool(r)
                        && source(r).and_then(|s| s.profile.as_deref()) == Some(profile)
                        && self.is_default(r)
                });
                let Some(part) = part.cloned() else { return };
                let mb = (mb as f64).min(mb_of(&part));
                let info = offer::Operation {
                    r#type: Some(offer::operation::Type::Reserve as i32),
                    reserve: Some(Reserve {
                        source: Vec::new(),
                        resources: vec![allocated(refine(sized(part, mb)))],
                    }),
                    ..offer::Operation::default()
                };
                self.apply(info, false);
            }
            Step::Answer {
                n,
                ok,
                extra,
                short,
            } => {
                if !self.disks.is_empty() {
                    self.answer(n % self.disks.len(), ok, extra, short);
                }
            }
            Step::Job { fail } => {
                if !self.jobs.is_empty() {
                    self.job(fail);
                }
            }
            Step::Sent { ok } => {
                if !self.sends.is_empty() {
                    self.sent(ok);
                }
            }
            Step::Ack { n } => self.ack(n),
            Step::Tick { n } => {
                let name = self
                    .timers
                    .keys()
                    .nth(n % self.timers.len().max(1))
                    .copied();
                if let Some(timer) = name.and_then(|name| self.timers.remove(name)) {
                    self.now += Duration::from_secs(600);
                    self.feed(Input::Fired(timer));
                }
            }
            Step::Lose { n } => {
                let id = self.plugin.volumes.keys().nth(n).cloned();
                if let Some(id) = id {
                    self.plugin.volumes.remove(&id);
                }
            }
            Step::Resubscribe => {
                self.feed(Input::Disconnected {
                    reason: "the model's agent went away".to_owned(),
                    not_admitted: false,
                });
                self.sends.clear();
                self.subscribe();
            }
            Step::Crash => self.crash(),
        }
    }

    /// The plugin answers the `n`th running call.
    fn answer(&mut self, n: usize, ok: bool, extra: u64, short: bool) {
        let (uuid, identity, call) = self.disks.remove(n);
        // The volume manager's side of a staged call: its intent goes with the record
        // change it hands back (the record itself is not modelled).
        let mut owed = None;
        let outcome = match call {
            DiskCall::Create {
                req: create,
                staged,
            } => {
                if !ok {
                    DiskOutcome::Created(Err(VolumeError::Stopped))
                } else {
                    // CreateVolume by the same name (after a crash) finds the volume.
                    let id = format!("vol-{}", create.name);
                    let asked = u64::try_from(create.required_bytes).unwrap();
                    let made = if short {
                        asked.saturating_sub(extra * MB / 2).max(1)
                    } else {
                        asked + extra * MB
                    };
                    let profile = self
                        .machine
                        .tracked()
                        .get(&uuid)
                        .and_then(|op| op.info.create_disk.as_ref())
                        .and_then(|c| source(&c.source))
                        .and_then(|s| s.profile.clone())
                        .unwrap();
                    if !self.plugin.volumes.contains_key(&id) {
                        let key = PROFILES.iter().find(|p| **p == profile).unwrap();
                        let free = self.plugin.free.get_mut(key).unwrap();
                        *free = free.saturating_sub(made);
                        self.plugin
                            .volumes
                            .insert(id.clone(), (Some(profile), made));
                    }
                    let bytes = self.plugin.volumes[&id].1;
                    if staged {
                        let mut changes = Changes::new();
                        changes.delete::<CreateVolume>(&create.name).unwrap();
                        owed = Some(Owed::new(changes).0);
                    }
                    DiskOutcome::Created(Ok(VolumeInfo {
                        id: VolumeId::new(id.as_str()),
                        capacity_bytes: i64::try_from(bytes).unwrap(),
                        volume_context: BTreeMap::new(),
                    }))
                }
            }
            DiskCall::Validate(_) => panic!("the model imports nothing"),
            DiskCall::Delete { id, staged } => {
                if !ok {
                    DiskOutcome::Destroyed(Err(VolumeError::Stopped))
                } else {
                    if staged {
                        let mut changes = Changes::new();
                        changes.delete::<DeleteIntent>(id.as_str()).unwrap();
                        owed = Some(Owed::new(changes).0);
                    }
                    let existed = self.plugin.volumes.remove(id.as_str());
                    if let Some((Some(profile), bytes)) = &existed
                        && let Some(key) = PROFILES.iter().find(|p| **p == profile)
                    {
                        *self.plugin.free.get_mut(key).unwrap() += bytes;
                    }
                    DiskOutcome::Destroyed(Ok(true))
                }
            }
        };
        self.feed(Input::DiskDone(DiskDone {
            uuid,
            identity,
            outcome,
            owed,
        }));
    }

    /// The oldest job gets the plugin's answers now.
    fn job(&mut self, fail: bool) {
        let (ticket, profiles) = self.jobs.remove(0);
        // A profile job brings the map up to date with the adaptor (the driver's
        // translation); GetCapacity is asked for the profiles of the map only.
        let profiles = match ticket.kind() {
            JobKind::Profiles => self.profiles.clone(),
            JobKind::Subscription | JobKind::Periodic | JobKind::Pools => profiles,
        };
        let capacities: Vec<(&str, u64)> = self
            .plugin
            .free
            .iter()
            .filter(|(p, _)| profiles.contains_key(**p))
            .map(|(p, b)| (*p, *b))
            .collect();
        let result = if fail {
            Err(ReconcileError::List(VolumeError::Stopped))
        } else {
            Ok(Gathered {
                capacities: capacities
                    .iter()
                    .map(|(p, b)| ((*p).to_owned(), *b))
                    .collect(),
                profiles,
                listing: self.plugin.listing(),
                expanded: std::collections::BTreeMap::new(),
            })
        };
        let before = self.machine.total().clone();
        let in_flight = ledger::in_flight(self.machine.tracked());
        self.feed(Input::JobDone(JobDone { ticket, result }));
        if !fail {
            self.check_counted_once(&before, &capacities, &in_flight);
        }
    }

    fn sent(&mut self, ok: bool) {
        let (seq, session) = self.sends.remove(0);
        let result = if ok {
            Ok(())
        } else {
            Err(SendFailure {
                message: "503 Service Unavailable".to_owned(),
                refused: false,
            })
        };
        self.feed(Input::Sent {
            seq,
            session,
            result,
        });
    }

    /// The agent acknowledges the `n`th unacknowledged status it saw.
    fn ack(&mut self, n: usize) {
        let open: Vec<(uuid::Uuid, uuid::Uuid)> = self
            .seen
            .iter()
            .filter(|(_, s)| !s.acked)
            .filter_map(|(op, s)| s.status.map(|st| (*op, st)))
            .collect();
        if open.is_empty() {
            return;
        }
        let (op, status) = open[n % open.len()];
        let terminal = !self.seen[&op].terminal.is_empty();
        let event = Event {
            r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
            acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
                operation_uuid: proto_uuid(op),
                status_uuid: proto_uuid(status),
            }),
            ..Event::default()
        };
        let ready = self.machine.lifecycle() == Lifecycle::Ready;
        self.feed(Input::Event(Box::new(event)));
        if terminal && ready {
            self.seen.get_mut(&op).unwrap().acked = true;
            assert!(
                !self.machine.tracked().contains(&op),
                "{op}: acknowledged and still tracked"
            );
        }
    }

    /// A crash: nothing the world has not answered survives, the machine is recovered from
    /// the store, and a new session subscribes.
    fn crash(&mut self) {
        self.jobs.clear();
        self.disks.clear();
        self.sends.clear();
        self.timers.clear();
        let store = self.store.clone();
        // The volume manager's recovery settles every intent (CreateVolume again, the
        // deletion finished) before the provider applies anything.
        let mut settled = store.transaction();
        settled
            .delete_prefix::<CreateVolume>("")
            .delete_prefix::<DeleteIntent>("");
        self.rt.block_on(settled.commit()).unwrap();
        let (state, records) = self.rt.block_on(async {
            // What the driver's load does (`slrp_provider::persist`); the model's
            // records are all of the current layout.
            let record = store.get(AGENT).await.unwrap();
            let resources = store.load_prefix(&resource_prefix(AGENT)).await.unwrap();
            let (state, rewrite) =
                ProviderState::from_stored(record, resources, AGENT, store.path()).unwrap();
            assert!(!rewrite);
            let records: Vec<OperationRecord> =
                store.load_prefix(&operations_prefix(AGENT)).await.unwrap();
            let records = operations_of(records, AGENT, store.path()).unwrap();
            (state, records)
        });
        let (tracked, terminated) = Operations::recover(records, StatusRetry::default());
        for op in tracked.iter() {
            let seen = &self.seen[&op.uuid];
            assert!(!seen.acked, "{}: acknowledged and recovered", op.uuid);
        }
        drop(terminated);
        self.machine = Machine::new(self.cfg.clone(), state, tracked).unwrap();
        self.subscribe();
    }

    /// Invariant 2, right after a reconciliation (what its UPDATE_STATE carries).
    fn check_counted_once(
        &self,
        before: &Resources,
        capacities: &[(&str, u64)],
        in_flight: &Resources,
    ) {
        let sum = |resources: &Resources, profile: &str, keep: &dyn Fn(&Resource) -> bool| {
            resources
                .iter()
                .filter(|r| is_storage_pool(r))
                .filter(|r| source(r).and_then(|s| s.profile.as_deref()) == Some(profile))
                .filter(|r| keep(r))
                .map(|r| fixed(mb_of(r)))
                .sum::<i64>()
        };
        let free = self.machine.total().clone() - in_flight;
        let was = before.clone() - in_flight;
        for (profile, bytes) in capacities {
            let report = fixed(*bytes as f64 / MB as f64);
            let flying = sum(in_flight, profile, &|_| true);
            let offered = sum(&free, profile, &|r| self.is_default(r));
            assert!(
                offered <= (report - flying).max(0),
                "profile {profile}: {offered} offered unreserved beside {flying} in flight; \
                 the plugin reports {report} (default reservations: {})",
                self.default_reservations
            );
            let kept = sum(&free, profile, &|r| !self.is_default(r));
            let reserved_before = sum(&was, profile, &|r| !self.is_default(r));
            assert!(kept <= reserved_before, "reserved storage invented");
        }
    }

    fn stored<R: slrp_store::Record>(&self, key: &str) -> bool {
        self.rt
            .block_on(self.store.get::<R>(key))
            .unwrap()
            .is_some()
    }

    /// Invariants 1, 3, 4 (so far), 5, 6, 7.
    fn check(&self) {
        let total = self.machine.total();
        assert!(
            total.contains(&self.held()),
            "the total lacks what PENDING operations consume"
        );
        let mut ids = BTreeSet::new();
        for r in total.iter() {
            if let Some(id) = source(r).and_then(|s| s.id.as_ref()) {
                assert!(ids.insert(id.clone()), "volume {id} is in the total twice");
            }
        }
        for (uuid, seen) in &self.seen {
            assert!(
                seen.terminal.len() <= 1,
                "{uuid}: {} terminal statuses",
                seen.terminal.len()
            );
            if seen.state == OperationState::OperationDropped as i32 {
                assert!(!seen.called, "{uuid}: dropped after a CSI call");
            }
        }
        for op in self.machine.tracked().iter() {
            if let Some(create) = &op.info.create_disk
                && op.latest_status.state == OperationState::OperationFinished as i32
            {
                let converted: f64 = op.latest_status.converted_resources.iter().map(mb_of).sum();
                assert_eq!(
                    fixed(converted),
                    fixed(mb_of(&create.source)),
                    "{}: a CREATE_DISK converted another quantity than it consumed",
                    op.uuid
                );
                assert!(
                    !self.stored::<CreateVolume>(&op.uuid.to_string()),
                    "{}: FINISHED, and its CreateVolume intent still stored",
                    op.uuid
                );
            }
            if let Some(destroy) = &op.info.destroy_disk
                && op.latest_status.state == OperationState::OperationFinished as i32
                && let Some(id) = source(&destroy.source).and_then(|s| s.id.as_deref())
            {
                assert!(
                    !self.stored::<DeleteIntent>(id),
                    "{}: FINISHED, and its deletion intent still stored",
                    op.uuid
                );
            }
        }
    }

    /// Lets everything end: every call answered, every job and send succeeds, READY.
    fn drain(&mut self) {
        for _ in 0..64 {
            while !self.disks.is_empty() {
                self.answer(0, true, 0, false);
                self.check();
            }
            if !self.jobs.is_empty() {
                self.job(false);
                self.check();
            }
            if !self.sends.is_empty() {
                self.sent(true);
                self.check();
            }
            if self.disks.is_empty() && self.jobs.is_empty() && self.sends.is_empty() {
                let retry: Vec<Timer> = ["job-retry", "send-retry"]
                    .iter()
                    .filter_map(|name| self.timers.remove(name))
                    .collect();
                if retry.is_empty() {
                    break;
                }
                for timer in retry {
                    self.feed(Input::Fired(timer));
                }
            }
        }
        assert_eq!(self.machine.lifecycle(), Lifecycle::Ready);
        for op in self.machine.tracked().iter() {
            assert!(op.is_terminal(), "{} never ended", op.uuid);
            let seen = &self.seen[&op.uuid];
            assert_eq!(
                seen.terminal.len(),
                1,
                "{}: no terminal status sent",
                op.uuid
            );
        }
    }
}

/// Where the stores of the cases go: memory when the machine has it (512 cases commit a
/// few thousand transactions; an fsync each on a disk is most of the test's time).
fn scratch() -> std::path::PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_provider_machine_holds_its_invariants(
        default_reservations in any::<bool>(),
        pools in (0u64..12, 0u64..12),
        preexisting in 0usize..3,
        steps in prop::collection::vec(arb_step(), 1..60),
    ) {
        let mut world = World::new(default_reservations, pools, preexisting);
        world.check();
        for step in &steps {
            world.step(step);
            world.check();
        }
        world.drain();
        world.check();
    }
}
