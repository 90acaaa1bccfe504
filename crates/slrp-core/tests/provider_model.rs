//! A model-based property test of the provider's resource bookkeeping (issue #21): random
//! sequences of operations (RESERVE, CREATE_DISK from pools and their reserved parts,
//! imports of pre-existing volumes, DESTROY_DISK), plugin answers (success, failure,
//! sizes other than asked), reconciliations (overlapping operations, failing, with
//! volumes vanishing from the listing) and restarts, driven through the same pure
//! functions the worker calls in the same order (`apply::admit`, `ledger`,
//! `apply::plan_create_disk` / `create_disk_conversion` / `destroy_disk_conversion`,
//! `apply_conversions_in_place`, `ProviderResources::{existing_volumes, reconcile_pools,
//! reconcile}`, `Operations`), checked after every step against:
//!
//! 1. everything PENDING operations consume is in the total (every conversion applies);
//! 2. after a reconciliation, per profile, the unreserved free pool is at most what the
//!    plugin reports beyond the parts in flight, and no reserved storage is invented;
//! 3. a FINISHED conversion never changes a quantity except by removing it (a Mesos
//!    master's allocator invariant);
//! 4. every operation gets exactly one terminal status, and all end once the plugin
//!    answers and the reconciliations end;
//! 5. an operation dropped after its deferral made no CSI call.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test"
)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use slrp_core::provider::apply::{self, Admission, AdmissionInput, DiskRequest};
use slrp_core::provider::ledger::{self, Resumption};
use slrp_core::provider::operations::{Operations, StatusRetry, TrackedOperation};
use slrp_core::provider::resources::{ProviderResources, Resources, is_storage_pool};
use slrp_core::volume::VolumeInfo;
use slrp_csi::{Volume, VolumeCapability, VolumeId};
use slrp_proto::mesos::v1::offer::operation::{CreateDisk, DestroyDisk, Reserve};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::resource::{AllocationInfo, ReservationInfo};
use slrp_proto::mesos::v1::{
    AgentId, OperationState, Resource, ResourceProviderId, offer, value::Scalar,
};
use slrp_types::ProfileInfo;

const MB: u64 = 1_048_576;
const PROFILES: [&str; 2] = ["a", "b"];

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
    /// CREATE_DISK of the `n`th pre-existing RAW volume into profile `a`.
    Import { n: usize },
    /// DESTROY_DISK of the `n`th disk.
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
    /// A reconciliation starts (operations arriving now are deferred).
    StartReconcile,
    /// The running reconciliation gets its answers (`fail`: a GetCapacity or ListVolumes
    /// failure: nothing changes, it is retried later).
    EndReconcile { fail: bool },
    /// The plugin loses the `n`th volume (it is no longer listed).
    Lose { n: usize },
    /// The provider restarts: running calls are lost, every PENDING operation is replayed
    /// (before the subscription reconciliation, which then waits for them).
    Restart,
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..2, 1u64..5, any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(profile, mb, reserved, stale)| Step::Create { profile, mb, reserved, stale }
        ),
        1 => (0usize..3).prop_map(|n| Step::Import { n }),
        2 => (0usize..4).prop_map(|n| Step::Destroy { n }),
        2 => (0usize..2, 1u64..4).prop_map(|(profile, mb)| Step::Reserve { profile, mb }),
        5 => (0usize..4, prop::bool::weighted(0.8), 0u64..2, any::<bool>())
            .prop_map(|(n, ok, extra, short)| Step::Answer { n, ok, extra, short }),
        2 => Just(Step::StartReconcile),
        2 => prop::bool::weighted(0.2).prop_map(|fail| Step::EndReconcile { fail }),
        1 => (0usize..4).prop_map(|n| Step::Lose { n }),
        1 => Just(Step::Restart),
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

struct Model {
    ctx: ProviderResources,
    profiles: BTreeMap<String, ProfileInfo>,
    total: Resources,
    ops: Operations,
    /// Operations whose CSI call runs (the worker's `running`).
    running: Vec<uuid::Uuid>,
    deferred: Vec<uuid::Uuid>,
    reconciling: bool,
    version: uuid::Uuid,
    /// Operations for which a CSI call was made.
    called: BTreeSet<uuid::Uuid>,
    /// Terminal statuses seen, per operation.
    terminal: BTreeMap<uuid::Uuid, usize>,
    dropped_after_deferral: BTreeSet<uuid::Uuid>,
    plugin: Plugin,
    agent: AgentId,
    provider: ResourceProviderId,
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

fn operation(kind: offer::operation::Type) -> offer::Operation {
    offer::Operation {
        r#type: Some(kind as i32),
        ..offer::Operation::default()
    }
}

impl Model {
    fn new(default_reservations: bool, pools: (u64, u64), preexisting: usize) -> Self {
        let defaults = if default_reservations {
            vec![ReservationInfo {
                r#type: Some(ReservationType::Dynamic as i32),
                role: Some("storage".to_owned()),
                principal: None,
                labels: None,
            }]
        } else {
            Vec::new()
        };
        let ctx = ProviderResources::new(
            ResourceProviderId {
                value: "rp".to_owned(),
            },
            "org.apache.mesos.csi.test",
            "local",
            defaults,
        )
        .unwrap();
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
        let mut model = Self {
            ctx,
            profiles,
            total: Resources::new(),
            ops: Operations::new(StatusRetry::default()),
            running: Vec::new(),
            deferred: Vec::new(),
            reconciling: false,
            version: uuid::Uuid::from_u128(1),
            called: BTreeSet::new(),
            terminal: BTreeMap::new(),
            dropped_after_deferral: BTreeSet::new(),
            plugin,
            agent: AgentId {
                value: "agent".to_owned(),
            },
            provider: ResourceProviderId {
                value: "rp".to_owned(),
            },
        };
        model.reconciling = true;
        model.end_reconcile();
        model
    }

    /// What PENDING operations hold, all of them.
    fn held(&self) -> Resources {
        self.ops
            .iter()
            .filter(|op| !op.is_terminal())
            .flat_map(|op| ledger::consumed_by(&op.info).into_vec())
            .collect()
    }

    fn available(&self) -> Resources {
        self.total.clone() - &self.held()
    }

    fn is_default(&self, r: &Resource) -> bool {
        r.reservations == self.ctx.default_reservations()
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
                    create_disk: Some(CreateDisk {
                        source: allocated(sized(part, mb)),
                        target_type: SourceType::Mount as i32,
                        target_profile: None,
                    }),
                    ..operation(offer::operation::Type::CreateDisk)
                };
                self.apply(info, stale);
            }
            Step::Import { n } => {
                let raw = self
                    .total
                    .iter()
                    .filter(|r| {
                        source(r)
                            .is_some_and(|s| s.r#type == SourceType::Raw as i32 && s.id.is_some())
                    })
                    .nth(n)
                    .cloned();
                let Some(raw) = raw else { return };
                let info = offer::Operation {
                    create_disk: Some(CreateDisk {
                        source: allocated(raw),
                        target_type: SourceType::Mount as i32,
                        target_profile: Some("a".to_owned()),
                    }),
                    ..operation(offer::operation::Type::CreateDisk)
                };
                self.apply(info, false);
            }
            Step::Destroy { n } => {
                let disk = self
                    .total
                    .iter()
                    .filter(|r| source(r).is_some_and(|s| s.r#type == SourceType::Mount as i32))
                    .nth(n)
                    .cloned();
                let Some(disk) = disk else { return };
                let info = offer::Operation {
                    destroy_disk: Some(DestroyDisk {
                        source: allocated(disk),
                    }),
                    ..operation(offer::operation::Type::DestroyDisk)
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
                    reserve: Some(Reserve {
                        source: Vec::new(),
                        resources: vec![allocated(refine(sized(part, mb)))],
                    }),
                    ..operation(offer::operation::Type::Reserve)
                };
                self.apply(info, false);
            }
            Step::Answer {
                n,
                ok,
                extra,
                short,
            } => {
                if self.running.is_empty() {
                    return;
                }
                let uuid = self.running.remove(n % self.running.len());
                self.answer(uuid, ok, extra, short);
            }
            Step::StartReconcile => self.reconciling = true,
            Step::EndReconcile { fail } => {
                // The job starts only once no disk operation runs (the worker's
                // provider-wide sequence): it never overlaps a CSI call of one.
                if self.reconciling && !fail && self.running.is_empty() {
                    self.end_reconcile();
                }
            }
            Step::Lose { n } => {
                let id = self.plugin.volumes.keys().nth(n).cloned();
                if let Some(id) = id {
                    self.plugin.volumes.remove(&id);
                }
            }
            Step::Restart => {
                // The calls in flight are lost; the PENDING records are replayed (a
                // deferred one waits for the subscription reconciliation, like the rest).
                self.running.clear();
                self.deferred.clear();
                let pending: Vec<_> = self
                    .ops
                    .iter()
                    .filter(|op| !op.is_terminal())
                    .map(|op| op.uuid)
                    .collect();
                for uuid in pending {
                    self.start(uuid);
                }
            }
        }
    }

    /// APPLY_OPERATION in READY: `admit`, then track it and apply, defer or drop it.
    fn apply(&mut self, info: offer::Operation, stale: bool) {
        let uuid = uuid::Uuid::new_v4();
        let received = if stale {
            uuid::Uuid::new_v4()
        } else {
            self.version
        };
        let admission = apply::admit(&AdmissionInput {
            info: &info,
            reconciling: self.reconciling,
            current_version: &self.version,
            received_version: Some(received),
            tracked: false,
        });
        let admission = match admission {
            Admission::Defer => ledger::confirm_deferral(&self.total, &self.ops, &uuid, &info),
            other => other,
        };
        let op = TrackedOperation::pending(uuid, None, info, &self.agent, &self.provider);
        match admission {
            Admission::Duplicate => panic!("a fresh uuid is no duplicate"),
            Admission::Drop(message) => {
                let mut op = op;
                op.latest_status = apply::dropped_status(&op, &message, &self.agent);
                self.ops
                    .insert_dropped(op, tokio::time::Instant::now())
                    .unwrap();
                *self.terminal.entry(uuid).or_default() += 1;
            }
            Admission::Defer => {
                self.ops.insert_pending(op).unwrap();
                self.deferred.push(uuid);
            }
            Admission::Accept => {
                self.ops.insert_pending(op).unwrap();
                self.start(uuid);
            }
        }
    }

    /// The worker's `apply_operation`: the availability check, then the conversion of a
    /// speculative operation or the CSI call of a disk operation.
    fn start(&mut self, uuid: uuid::Uuid) {
        let info = self.ops.get(&uuid).unwrap().info.clone();
        let kind = apply::OperationKind::of(&info);
        if let Err(message) =
            ledger::check_available(&self.total, &self.ops, &uuid, &ledger::consumed_by(&info))
        {
            // A DESTROY_DISK or import of something another PENDING operation holds (the
            // model's frameworks may pick those): FAILED before any call.
            return self.end(uuid, Err(message.to_string()));
        }
        if kind.is_speculative() {
            let conversions = apply::speculative_conversions(&info).unwrap();
            self.end(uuid, Ok(conversions));
        } else {
            self.called.insert(uuid);
            self.running.push(uuid);
        }
    }

    fn answer(&mut self, uuid: uuid::Uuid, ok: bool, extra: u64, short: bool) {
        let info = self.ops.get(&uuid).unwrap().info.clone();
        match apply::OperationKind::of(&info) {
            apply::OperationKind::CreateDisk => {
                let plan = apply::plan_create_disk(&info, &uuid, &self.profiles).unwrap();
                if !ok {
                    return self.end(uuid, Err("plugin refused".to_owned()));
                }
                let id = match &plan.request {
                    DiskRequest::Create(create) => {
                        // CreateVolume by the same name after a restart finds the volume.
                        let id = format!("vol-{}", create.name);
                        let asked = u64::try_from(create.required_bytes).unwrap();
                        let made = if short {
                            asked.saturating_sub(extra * MB / 2).max(1)
                        } else {
                            asked + extra * MB
                        };
                        if !self.plugin.volumes.contains_key(&id) {
                            let free = self.plugin.free.get_mut(plan.profile.as_str()).unwrap();
                            *free = free.saturating_sub(made);
                            self.plugin
                                .volumes
                                .insert(id.clone(), (Some(plan.profile.clone()), made));
                        }
                        id
                    }
                    DiskRequest::Import(validate) => {
                        if !self.plugin.volumes.contains_key(validate.id.as_str()) {
                            return self.end(uuid, Err("volume not found".to_owned()));
                        }
                        validate.id.as_str().to_owned()
                    }
                };
                let bytes = self.plugin.volumes[&id].1;
                let volume = VolumeInfo {
                    id: VolumeId::new(id.as_str()),
                    capacity_bytes: i64::try_from(bytes).unwrap(),
                    volume_context: BTreeMap::new(),
                };
                let conversions = apply::create_disk_outcome(&self.ctx, &plan, Ok(volume));
                self.end(uuid, conversions.map_err(|e| e.to_string()));
            }
            apply::OperationKind::DestroyDisk => {
                if !ok {
                    return self.end(uuid, Err("plugin refused".to_owned()));
                }
                let (id, source) = apply::destroy_disk_target(&info).unwrap();
                if let Some((profile, bytes)) = self.plugin.volumes.remove(id.as_str())
                    && let Some(free) = profile
                        .as_deref()
                        .and_then(|p| PROFILES.iter().find(|q| **q == p))
                        .and_then(|p| self.plugin.free.get_mut(p))
                {
                    *free += bytes;
                }
                let destroyed =
                    apply::destroy_disk_conversion(&self.ctx, &source, true, &self.profiles);
                self.end(uuid, Ok(vec![destroyed.conversion]));
            }
            kind => panic!("{kind:?} makes no CSI call"),
        }
    }

    /// The worker's `complete`: the conversion applied to the total (it must apply), one
    /// terminal status.
    fn end(
        &mut self,
        uuid: uuid::Uuid,
        outcome: Result<Vec<slrp_core::provider::resources::Conversion>, String>,
    ) {
        let op = self.ops.get(&uuid).unwrap().clone();
        let status = match outcome {
            Ok(conversions) => {
                if let Err(message) =
                    apply::apply_conversions_in_place(&mut self.total, &op.info, &conversions)
                {
                    panic!("a PENDING operation's conversion did not apply: {message}");
                }
                for c in &conversions {
                    check_allocator_invariant(c);
                }
                apply::finished_status(&op, &apply::converted_resources(&conversions), &self.agent)
            }
            Err(message) => apply::failed_status(&op, &message, &self.agent),
        };
        self.ops
            .finish(&uuid, status, tokio::time::Instant::now())
            .unwrap();
        *self.terminal.entry(uuid).or_default() += 1;
    }

    /// A successful reconciliation with the plugin's answers now, then the deferred
    /// operations judged against its result.
    fn end_reconcile(&mut self) {
        let capacities: Vec<(&str, u64)> = self.plugin.free.iter().map(|(p, b)| (*p, *b)).collect();
        let in_flight = ledger::in_flight(&self.ops);
        let volumes = self
            .ctx
            .existing_volumes(&self.total, &self.plugin.listing())
            .unwrap();
        let pools = self.ctx.reconcile_pools(
            &self.total,
            &self.ctx.storage_pools(capacities.iter().copied()),
            &in_flight,
        );
        let before = self.total.clone();
        let reconciled = self.ctx.reconcile(&self.total, &volumes, &pools).unwrap();
        if let Some(total) = reconciled.total {
            self.total = total;
            self.version = uuid::Uuid::new_v4();
        }
        self.check_counted_once(&before, &capacities, &in_flight);
        self.reconciling = false;
        for uuid in std::mem::take(&mut self.deferred) {
            match ledger::judge_deferred(&self.total, &self.ops, &uuid) {
                Some(Resumption::Apply) => self.start(uuid),
                Some(Resumption::Drop { message, .. }) => {
                    let op = self.ops.get(&uuid).unwrap().clone();
                    let status = apply::dropped_status(&op, message, &self.agent);
                    self.ops
                        .finish(&uuid, status, tokio::time::Instant::now())
                        .unwrap();
                    *self.terminal.entry(uuid).or_default() += 1;
                    self.dropped_after_deferral.insert(uuid);
                }
                None => {}
            }
        }
    }

    /// Invariant 2, right after a reconciliation (what its UPDATE_STATE would carry).
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
        let free = self.total.clone() - in_flight;
        let was = before.clone() - in_flight;
        for (profile, bytes) in capacities {
            let report = fixed(*bytes as f64 / MB as f64);
            let flying = sum(in_flight, profile, &|_| true);
            let offered = sum(&free, profile, &|r| self.is_default(r));
            assert!(
                offered <= (report - flying).max(0),
                "profile {profile}: {offered} offered unreserved beside {flying} in flight; \
                 the plugin reports {report}"
            );
            let kept = sum(&free, profile, &|r| !self.is_default(r));
            let reserved_before = sum(&was, profile, &|r| !self.is_default(r));
            assert!(kept <= reserved_before, "reserved storage invented");
        }
    }

    /// Invariants 1, 4 (so far) and 5.
    fn check(&self) {
        assert!(
            self.total.contains(&self.held()),
            "the total lacks what PENDING operations consume"
        );
        for (uuid, count) in &self.terminal {
            assert_eq!(*count, 1, "{uuid}: {count} terminal statuses");
        }
        for uuid in &self.dropped_after_deferral {
            assert!(
                !self.called.contains(uuid),
                "{uuid}: dropped after a CSI call"
            );
            let op = self.ops.get(uuid).unwrap();
            assert_eq!(
                op.latest_status.state,
                OperationState::OperationDropped as i32
            );
        }
    }

    /// Lets everything end: every call answered, the reconciliation ended.
    fn drain(&mut self) {
        for _ in 0..64 {
            while let Some(uuid) = self.running.pop() {
                self.answer(uuid, true, 0, false);
                self.check();
            }
            if self.reconciling {
                self.end_reconcile();
                self.check();
            }
            if !self.reconciling && self.running.is_empty() && self.deferred.is_empty() {
                break;
            }
        }
        for op in self.ops.iter() {
            assert!(op.is_terminal(), "{} never ended", op.uuid);
            assert_eq!(self.terminal.get(&op.uuid), Some(&1));
        }
    }
}

/// Invariant 3: the quantities a Mesos master compares (0.001 MB fixed point) are kept,
/// or the consumed side is removed completely.
fn check_allocator_invariant(c: &slrp_core::provider::resources::Conversion) {
    let quantity = |r: &Resources| r.iter().map(|r| fixed(mb_of(r))).sum::<i64>();
    if c.converted.is_empty() {
        return;
    }
    assert_eq!(
        quantity(&c.converted),
        quantity(&c.consumed),
        "a conversion changed a quantity: {} -> {}",
        c.consumed,
        c.converted
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_provider_bookkeeping_holds_its_invariants(
        default_reservations in any::<bool>(),
        pools in (0u64..12, 0u64..12),
        preexisting in 0usize..3,
        steps in prop::collection::vec(arb_step(), 1..60),
    ) {
        let mut model = Model::new(default_reservations, pools, preexisting);
        model.check();
        for step in &steps {
            model.step(step);
            model.check();
        }
        model.drain();
        model.check();
    }
}
