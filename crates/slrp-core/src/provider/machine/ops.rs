//! The operation part of the machine (spec §5, §8.5): APPLY_OPERATION,
//! ACKNOWLEDGE_OPERATION_STATUS, RECONCILE_OPERATIONS and PUBLISH_RESOURCES in READY, the
//! status update manager's timer, and the replay of recovered PENDING operations.
//!
//! - **Durable before applied.** An accepted disk operation is staged PENDING, and its
//!   volume manager call is an effect, so it starts only once that record is durable; its
//!   completion stages, in one transaction, the terminal operation record (with its
//!   status stream) and the resource records its conversion changed. A speculative
//!   operation without I/O is applied at once, and its one commit holds the finished
//!   operation and its conversion: after a crash either both are there or neither (the
//!   agent then reconciles the unknown operation). So a recovered PENDING record always
//!   means "not applied", and the replay applies it (CreateVolume by the same name
//!   returns the volume already made). A DESTROY removes its persistent volumes' data
//!   only once its PENDING record is durable, so a crash during the removal replays it.
//! - **Disk operations run concurrently**; a reconciliation job starts only when none
//!   runs (Mesos's provider-wide sequence), and an operation that must not overlap a
//!   reconciliation (§5.2's table) arriving while one runs or waits is tracked PENDING at
//!   once and applied, in arrival order, when it ends (§12 item 6), judged again against
//!   the reconciled total first.
//! - **One timer** drives the status update manager (`Operations::next_retry`).

use slrp_proto::mesos::v1::offer::Operation as OfferOperation;
use slrp_proto::mesos::v1::resource_provider::{Call, call, event};
use slrp_proto::mesos::v1::{AgentId, OperationState, OperationStatus, Uuid};
use slrp_types::DisplayChain;
use tokio::time::Instant;

use super::{
    DiskCall, DiskDone, DiskOutcome, Effect, JobKind, Machine, MachineError, Notice, OpMetric,
    Running, Timer, uuid_text,
};
use crate::provider::apply::{
    self, Admission, AdmissionInput, DiskRequest, OperationError, OperationKind,
    agent_applies_speculatively,
};
use crate::provider::ledger::{self, Resumption, consumed_by, strip};
use crate::provider::operations::{
    Acked, TrackedOperation, stage_operation, stage_operation_removal,
};
use crate::provider::publish::publish_targets;
use crate::provider::resources::{Conversion, Resources, pool_profile_changes, pool_profiles};
use crate::volume;

/// Whether an operation is applied for the first time, or replayed after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// Accepted (or released from deferral) in this process: its volume name was never
    /// asked for, so the volume manager's intent can be staged with the PENDING record.
    First,
    /// A recovered PENDING operation: an intent of an earlier attempt may exist, so the
    /// volume manager writes its own (and reads what was there).
    Replay,
}

/// Whether a speculative operation has I/O to do before its conversion (DESTROY removes
/// the persistent volumes' data): it is then committed PENDING first, so a crash during
/// the removal replays it instead of losing it.
fn has_io(info: &OfferOperation) -> bool {
    OperationKind::of(info) == OperationKind::Destroy
}

/// The span of everything done for one operation (its acceptance, its disk task, its
/// completion, its acknowledgement), so every log line of it names it.
pub fn operation_span(uuid: &uuid::Uuid, kind: OperationKind) -> tracing::Span {
    tracing::info_span!("operation", operation_uuid = %uuid, operation = ?kind)
}

fn parse_uuid(uuid: &Uuid) -> Option<uuid::Uuid> {
    uuid::Uuid::from_slice(&uuid.value).ok()
}

impl Machine {
    fn agent_id_proto(&self) -> AgentId {
        AgentId {
            value: self.cfg.agent_id.clone(),
        }
    }

    /// The span of a tracked operation (none for an unknown uuid).
    fn tracked_span(&self, uuid: &uuid::Uuid) -> tracing::Span {
        match self.tracked.get(uuid) {
            Some(op) => operation_span(uuid, OperationKind::of(&op.info)),
            None => tracing::Span::none(),
        }
    }

    /// Stages the records of `ops` (put) and `removed` (delete) as they are now; the turn
    /// waits for their commit.
    fn stage_ops(
        &mut self,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
    ) -> Result<(), MachineError> {
        self.awaited = true;
        self.stage_quiet(ops, removed)
    }

    /// [`Self::stage_ops`] for changes nothing waits for (the removal of an acknowledged
    /// operation): a turn that staged only such changes does not wait for its commit.
    fn stage_quiet(
        &mut self,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
    ) -> Result<(), MachineError> {
        let agent_id = self.cfg.agent_id.clone();
        for uuid in ops {
            if let Some(op) = self.tracked.get(uuid) {
                stage_operation(&mut self.out.changes, &agent_id, op)
                    .map_err(MachineError::Stage)?;
            }
        }
        for uuid in removed {
            stage_operation_removal(&mut self.out.changes, &agent_id, uuid)
                .map_err(MachineError::Stage)?;
        }
        Ok(())
    }

    /// Stages the provider record and the resource records of `touched`'s identities.
    pub(super) fn stage_resources(&mut self, touched: &Resources) -> Result<(), MachineError> {
        self.awaited = true;
        self.follow_pool_profiles(touched);
        self.state
            .stage(&mut self.out.changes, &self.cfg.agent_id, Some(touched))
            .map_err(MachineError::Stage)
    }

    /// The pool profiles checkpointed follow the total (§8.2): the profiles of its storage
    /// pools, each with its definition from the profile map, or the one it was
    /// checkpointed with when the map lost it (a converted pool outlives its profile,
    /// §12 item 11). Recomputed from the whole total when the profile map changed since
    /// the last time; otherwise only the profiles of the pools in `touched` (the
    /// resources the total changed in) can have changed: a scan of a 10,000-volume total
    /// per commit was a tenth of the worker's time.
    fn follow_pool_profiles(&mut self, touched: &Resources) {
        if self.profiles_basis.as_ref() != Some(&self.live_profiles) {
            let mut known = self.live_profiles.clone();
            for (name, def) in &self.state.profiles {
                known.entry(name.clone()).or_insert_with(|| def.clone());
            }
            self.state.profiles = pool_profiles(&self.state.total)
                .into_iter()
                .filter_map(|name| known.get(&name).map(|def| (name, def.clone())))
                .collect();
            self.profiles_basis = Some(self.live_profiles.clone());
            return;
        }
        for (name, present) in pool_profile_changes(&self.state.total, touched) {
            if !present {
                self.state.profiles.remove(&name);
            } else if !self.state.profiles.contains_key(&name)
                && let Some(def) = self.live_profiles.get(&name)
            {
                self.state.profiles.insert(name, def.clone());
            }
        }
    }

    /// Sends status updates once this turn's changes are durable (reliable ones come from
    /// the status update manager, which keeps them until acknowledged; a failed send is
    /// only logged: the retry resends).
    fn send_updates(&mut self, updates: impl IntoIterator<Item = call::UpdateOperationStatus>) {
        let Some(id) = self.state.provider_id.clone() else {
            return;
        };
        for update in updates {
            let about = Notice::Status(uuid_text(&update.operation_uuid));
            let call = Call {
                r#type: Some(call::Type::UpdateOperationStatus as i32),
                resource_provider_id: Some(id.clone()),
                update_operation_status: Some(update),
                ..Call::default()
            };
            self.effect(Effect::Notify {
                call: Box::new(call),
                about,
            });
        }
    }

    /// The agent applied an operation the provider did not (dropped or failed): a new
    /// resource version and an UPDATE_STATE resynchronize it (§5.3). Before READY the
    /// subscription reconciliation's UPDATE_STATE, which comes anyway with a fresh
    /// version, does it (it must be the session's first).
    fn resync_agent(&mut self) {
        if self.lifecycle == super::Lifecycle::Ready {
            self.state_changed();
        }
    }

    /// The operation counts reach the status with the turn's commit.
    pub(super) fn after_ops_change(&mut self) {
        self.counts_changed = true;
    }

    /// Re-arms the status timer if the next retry moved.
    pub(super) fn arm_status_timer(&mut self) {
        let next = self.tracked.next_retry();
        if next != self.status_armed {
            self.effect(match next {
                Some(at) => Effect::Arm(Timer::StatusRetry, at),
                None => Effect::Disarm(Timer::StatusRetry),
            });
            self.status_armed = next;
        }
    }

    /// The status update timer fired: resend the heads that are due.
    pub(super) fn on_status_timer(&mut self, now: Instant) {
        self.status_armed = None;
        let due = self.tracked.due(now);
        self.send_updates(due);
    }

    /// READY: resume the status update manager (every unacknowledged head is resent).
    pub(super) fn resume_statuses(&mut self, now: Instant) {
        let heads = self.tracked.resume(now);
        self.send_updates(heads);
        self.after_ops_change();
    }

    /// Not READY any more: nothing is sent until the next READY.
    pub(super) fn pause_statuses(&mut self) {
        self.tracked.pause();
        self.after_ops_change();
    }

    /// APPLY_OPERATION. `refused` is the reason it cannot be applied in this state (before
    /// READY): it is then DROPPED as Mesos does (tracked, reliable status).
    pub(super) fn on_apply(
        &mut self,
        apply: event::ApplyOperation,
        refused: Option<String>,
        now: Instant,
    ) -> Result<(), MachineError> {
        let span = match parse_uuid(&apply.operation_uuid) {
            Some(uuid) => operation_span(&uuid, OperationKind::of(&apply.info)),
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        self.apply_event(apply, refused, now)
    }

    fn apply_event(
        &mut self,
        apply: event::ApplyOperation,
        refused: Option<String>,
        now: Instant,
    ) -> Result<(), MachineError> {
        let Some(uuid) = parse_uuid(&apply.operation_uuid) else {
            tracing::warn!(
                operation_uuid = %uuid_text(&apply.operation_uuid),
                "ignoring APPLY_OPERATION whose operation uuid is not 16 bytes"
            );
            return Ok(());
        };
        let Some(provider_id) = self.state.provider_id.clone() else {
            tracing::warn!(operation_uuid = %uuid, "ignoring APPLY_OPERATION before a provider id is known");
            return Ok(());
        };
        let tracked = self.tracked.contains(&uuid);
        let admission = match refused {
            Some(_) if tracked => Admission::Duplicate,
            Some(message) => Admission::Drop(message),
            None => apply::admit(&AdmissionInput {
                info: &apply.info,
                reconciling: self.reconciling(),
                current_version: &self.resource_version,
                received_version: parse_uuid(&apply.resource_version_uuid),
                tracked,
            }),
        };
        let admission = match admission {
            Admission::Defer => {
                ledger::confirm_deferral(&self.state.total, &self.tracked, &uuid, &apply.info)
            }
            decided @ (Admission::Accept | Admission::Drop(_) | Admission::Duplicate) => decided,
        };
        let kind = OperationKind::of(&apply.info);
        let resync = agent_applies_speculatively(&apply.info);
        let agent_id = self.agent_id_proto();
        let mut op = TrackedOperation::pending(
            uuid,
            apply.framework_id,
            apply.info,
            &agent_id,
            &provider_id,
        );
        match admission {
            Admission::Duplicate => {
                self.resend_latest(&uuid);
                return Ok(());
            }
            Admission::Drop(message) => {
                tracing::warn!(operation_uuid = %uuid, "Dropping operation (uuid: {uuid}): {message}");
                op.latest_status = apply::dropped_status(&op, &message, &agent_id);
                let send = match self.tracked.insert_dropped(op, now) {
                    Ok(send) => send,
                    Err(error) => {
                        tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot track the dropped operation");
                        return Ok(());
                    }
                };
                self.stage_ops(&[uuid], &[])?;
                self.effect(Effect::Metric(OpMetric::Reached(
                    kind,
                    OperationState::OperationDropped as i32,
                )));
                self.send_updates(send);
                if resync {
                    // The agent applied it to its view already (§5.3 last paragraph).
                    self.resync_agent();
                }
            }
            admission @ (Admission::Accept | Admission::Defer) => {
                tracing::info!(operation_uuid = %uuid, operation = ?kind, deferred = matches!(admission, Admission::Defer), "accepted operation");
                let immediate = matches!(admission, Admission::Accept);
                let one_commit = immediate && kind.is_speculative() && !has_io(&op.info);
                if let Err(error) = self.tracked.insert_pending(op) {
                    tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot track the operation");
                    return Ok(());
                }
                self.effect(Effect::Metric(OpMetric::Pending(kind, 1)));
                if one_commit {
                    // Its completion commit is the first: nothing to replay before it.
                    self.apply_operation(uuid, now, Attempt::First)?;
                } else {
                    // A disk operation's call starts only once this is durable.
                    self.stage_ops(&[uuid], &[])?;
                    if immediate {
                        self.apply_operation(uuid, now, Attempt::First)?;
                    } else {
                        self.deferred.push_back(uuid);
                    }
                }
            }
        }
        self.after_ops_change();
        Ok(())
    }

    /// A duplicate APPLY_OPERATION: the latest status again if it is terminal and not yet
    /// acknowledged (a PENDING one's terminal status comes when it completes).
    fn resend_latest(&mut self, uuid: &uuid::Uuid) {
        let Some(op) = self.tracked.get(uuid) else {
            return;
        };
        if !op.is_terminal() {
            tracing::info!(operation_uuid = %uuid, "duplicate APPLY_OPERATION of a pending operation; it is being applied");
            return;
        }
        tracing::info!(operation_uuid = %uuid, "duplicate APPLY_OPERATION; resending its latest status");
        let update = call::UpdateOperationStatus {
            framework_id: op.framework_id.clone(),
            status: op.latest_status.clone(),
            latest_status: Some(op.latest_status.clone()),
            operation_uuid: Uuid {
                value: uuid.as_bytes().to_vec(),
            },
        };
        if self.lifecycle == super::Lifecycle::Ready {
            self.send_updates([update]);
        }
    }

    /// Applies a tracked PENDING operation (§5.3–§5.5): speculative ones complete now (a
    /// DESTROY once its data is removed), disk operations start their volume manager call.
    fn apply_operation(
        &mut self,
        uuid: uuid::Uuid,
        now: Instant,
        attempt: Attempt,
    ) -> Result<(), MachineError> {
        let Some(op) = self.tracked.get(&uuid) else {
            return Ok(());
        };
        let info = op.info.clone();
        let kind = OperationKind::of(&info);
        if matches!(kind, OperationKind::CreateDisk | OperationKind::DestroyDisk)
            && let Err(message) = ledger::check_available(
                &self.state.total,
                &self.tracked,
                &uuid,
                &consumed_by(&info),
            )
        {
            // Before any volume manager call: a volume created for resources another
            // operation takes would be in no resource.
            tracing::warn!(operation_uuid = %uuid, operation = ?kind, "the resources are held by another pending operation");
            return self.complete(uuid, Err(message), now);
        }
        match kind {
            kind if kind.is_speculative() => {
                let checked = apply::speculative_conversions(&info)
                    .and_then(|c| self.check_speculative(&uuid, &info, &c).map(|()| c));
                let conversions = match checked {
                    Ok(conversions) => conversions,
                    Err(message) => return self.complete(uuid, Err(message), now),
                };
                if !has_io(&info) {
                    return self.complete(uuid, Ok(conversions), now);
                }
                match apply::destroy_targets(&info) {
                    Err(message) => self.complete(uuid, Err(message), now),
                    Ok(targets) => {
                        // Data is removed only once the PENDING record is durable (the
                        // effect follows the commit): a crash during the removal replays
                        // the operation.
                        self.running.insert(uuid, Running::Persistent(conversions));
                        let identity = self.identity;
                        self.effect(Effect::RemovePersistent {
                            uuid,
                            identity,
                            targets,
                        });
                        Ok(())
                    }
                }
            }
            OperationKind::CreateDisk => {
                match apply::plan_create_disk(&info, &uuid, &self.live_profiles) {
                    Err(message) => self.complete(uuid, Err(message), now),
                    Ok(plan) => {
                        let call = match &plan.request {
                            DiskRequest::Create(req) => DiskCall::Create {
                                req: req.clone(),
                                staged: attempt == Attempt::First
                                    && self.stage_volume(&uuid, |c| volume::stage_create(c, req)),
                            },
                            DiskRequest::Import(req) => DiskCall::Validate(req.clone()),
                        };
                        self.running.insert(uuid, Running::Create(Box::new(plan)));
                        self.start_disk(uuid, kind, call);
                        Ok(())
                    }
                }
            }
            OperationKind::DestroyDisk => match apply::destroy_disk_target(&info) {
                Err(message) => self.complete(uuid, Err(message), now),
                Ok((id, source)) => {
                    self.running
                        .insert(uuid, Running::Destroy(Box::new(source)));
                    let staged = attempt == Attempt::First
                        && self.stage_volume(&uuid, |c| volume::stage_delete(c, &id));
                    self.start_disk(uuid, kind, DiskCall::Delete { id, staged });
                    Ok(())
                }
            },
            OperationKind::Reserve
            | OperationKind::Unreserve
            | OperationKind::Create
            | OperationKind::Destroy
            | OperationKind::Unsupported => {
                // GROW_VOLUME, SHRINK_VOLUME, …: the master rejects them for provider
                // resources; Mesos would abort (§5.1). FAILED instead.
                let name = info
                    .r#type
                    .and_then(|t| slrp_proto::mesos::v1::offer::operation::Type::try_from(t).ok())
                    .map_or("UNKNOWN", |t| t.as_str_name());
                self.complete(uuid, Err(OperationError::Unsupported { name }), now)
            }
        }
    }

    /// Stages a volume manager intent with the operation's PENDING record (one commit
    /// instead of two in series; see `volume::fold`). False, and nothing staged, if the
    /// store refuses it: the volume manager then writes the intent itself and reports the
    /// problem as the call's error.
    fn stage_volume(
        &mut self,
        uuid: &uuid::Uuid,
        stage: impl FnOnce(&mut slrp_store::Changes) -> Result<(), slrp_store::StoreError>,
    ) -> bool {
        let mut changes = slrp_store::Changes::new();
        match stage(&mut changes) {
            Ok(()) => {
                self.awaited = true;
                self.out.changes.append(changes);
                true
            }
            Err(error) => {
                tracing::warn!(operation_uuid = %uuid, error = %DisplayChain(&error), "the volume manager's intent cannot be staged; it writes its own");
                false
            }
        }
    }

    fn start_disk(&mut self, uuid: uuid::Uuid, kind: OperationKind, call: DiskCall) {
        let identity = self.identity;
        self.effect(Effect::Disk {
            uuid,
            kind,
            identity,
            call,
        });
    }

    /// A speculative operation's conversions against the total less what the other
    /// PENDING operations hold; a DESTROY also against the total itself, for the shared
    /// copies check, before its data is removed.
    fn check_speculative(
        &self,
        uuid: &uuid::Uuid,
        info: &OfferOperation,
        conversions: &[Conversion],
    ) -> Result<(), OperationError> {
        let consumed: Resources = conversions
            .iter()
            .flat_map(|c| c.consumed.iter().map(strip))
            .collect();
        ledger::check_available(&self.state.total, &self.tracked, uuid, &consumed)?;
        if has_io(info) {
            apply::apply_conversions(&self.state.total, info, conversions)?;
        }
        Ok(())
    }

    /// A disk operation's volume manager call ended.
    pub(super) fn on_disk_done(
        &mut self,
        done: DiskDone,
        now: Instant,
    ) -> Result<(), MachineError> {
        let DiskDone {
            uuid,
            identity,
            outcome,
            owed,
        } = done;
        if let Some(owed) = owed {
            // Whatever becomes of the operation: the volume manager's record is the
            // plugin's truth, and the manager waits for it to be durable.
            self.awaited = true;
            self.out.changes.append(owed.changes);
            self.effect(Effect::VolumeRecorded(owed.committed));
        }
        let span = self.tracked_span(&uuid);
        let _entered = span.enter();
        if identity != self.identity {
            tracing::info!(operation_uuid = %uuid, "a disk operation of the previous identity ended; its record stays pending there");
            return Ok(());
        }
        let running = self.running.remove(&uuid);
        let Some(ctx) = self.ctx.clone() else {
            return Ok(());
        };
        match (running, outcome) {
            (Some(Running::Create(plan)), DiskOutcome::Created(result)) => {
                let result = apply::create_disk_outcome(&ctx, &plan, result);
                self.complete(uuid, result, now)?;
            }
            (Some(Running::Destroy(source)), DiskOutcome::Destroyed(result)) => match result {
                Ok(deprovisioned) => {
                    let destroyed = apply::destroy_disk_conversion(
                        &ctx,
                        &source,
                        deprovisioned,
                        &self.live_profiles,
                    );
                    let reconcile = destroyed.reconcile_pools;
                    self.complete(uuid, Ok(vec![destroyed.conversion]), now)?;
                    if reconcile && !self.reconciling() {
                        // The freed space had no live profile: let the current profiles
                        // claim it (§5.5 step 3).
                        self.jobs.mark(JobKind::Pools);
                    }
                }
                Err(error) => {
                    let chain = DisplayChain(&error).to_string();
                    self.complete(uuid, Err(OperationError::Volume { chain }), now)?;
                }
            },
            (running, outcome) => {
                tracing::error!(operation_uuid = %uuid, ?running, ?outcome, "a disk operation result matches no running call; ignored");
            }
        }
        self.after_ops_change();
        Ok(())
    }

    /// DESTROY's data removal ended: complete it with its conversions.
    pub(super) fn on_persistent_removed(
        &mut self,
        uuid: uuid::Uuid,
        identity: u64,
        result: Result<(), OperationError>,
        now: Instant,
    ) -> Result<(), MachineError> {
        if identity != self.identity {
            return Ok(());
        }
        let Some(Running::Persistent(conversions)) = self.running.remove(&uuid) else {
            return Ok(());
        };
        let span = self.tracked_span(&uuid);
        let entered = span.enter();
        self.complete(uuid, result.map(|()| conversions), now)?;
        self.after_ops_change();
        drop(entered);
        self.release_held(now)
    }

    /// Completes a PENDING operation (§5.6): conversions applied to the total (allocation
    /// info stripped), terminal status, one commit of the operation and the resources it
    /// changed, metrics, and for a failed speculative operation a new resource version and
    /// UPDATE_STATE.
    fn complete(
        &mut self,
        uuid: uuid::Uuid,
        outcome: Result<Vec<Conversion>, OperationError>,
        now: Instant,
    ) -> Result<(), MachineError> {
        let Some(op) = self.tracked.get(&uuid) else {
            return Ok(());
        };
        let kind = OperationKind::of(&op.info);
        let agent_id = self.agent_id_proto();
        let resync = agent_applies_speculatively(&op.info);
        if op.is_terminal() {
            // `finish` refuses it, and the total must not change (it is changed in place).
            tracing::error!(operation_uuid = %uuid, "cannot complete the operation: it is terminal already");
            return Ok(());
        }
        let mut applied = None;
        let status = match outcome {
            Ok(conversions) => {
                match apply::apply_conversions_in_place(
                    &mut self.state.total,
                    &op.info,
                    &conversions,
                ) {
                    Ok(()) => {
                        let touched: Resources = conversions
                            .iter()
                            .flat_map(|c| c.consumed.iter().chain(c.converted.iter()))
                            .map(strip)
                            .collect();
                        applied = Some(touched);
                        let converted = apply::converted_resources(&conversions);
                        apply::finished_status(op, &converted, &agent_id)
                    }
                    Err(error) => apply::failed_status(op, &error.to_string(), &agent_id),
                }
            }
            Err(error) => apply::failed_status(op, &error.to_string(), &agent_id),
        };
        self.end(uuid, kind, resync, status, applied, now)
    }

    /// Ends a tracked PENDING operation with DROPPED and `message` (no conversion, no
    /// call made): one commit, metrics, the status sent reliably.
    fn drop_pending(
        &mut self,
        uuid: uuid::Uuid,
        message: &str,
        now: Instant,
    ) -> Result<(), MachineError> {
        let Some(op) = self.tracked.get(&uuid) else {
            return Ok(());
        };
        if op.is_terminal() {
            return Ok(());
        }
        let kind = OperationKind::of(&op.info);
        let resync = agent_applies_speculatively(&op.info);
        let status = apply::dropped_status(op, message, &self.agent_id_proto());
        tracing::warn!(operation_uuid = %uuid, "Dropping operation (uuid: {uuid}): {message}");
        self.end(uuid, kind, resync, status, None, now)
    }

    /// The common end of [`Self::complete`] and [`Self::drop_pending`]: the terminal
    /// `status` recorded, staged with the resources `applied` touched, counted and sent.
    fn end(
        &mut self,
        uuid: uuid::Uuid,
        kind: OperationKind,
        resync: bool,
        status: OperationStatus,
        applied: Option<Resources>,
        now: Instant,
    ) -> Result<(), MachineError> {
        let state = status.state;
        let failed = state == OperationState::OperationFailed as i32;
        let dropped = state == OperationState::OperationDropped as i32;
        if failed {
            tracing::warn!(operation_uuid = %uuid, operation = ?kind, message = status.message.as_deref().unwrap_or(""), "operation failed");
        } else if !dropped {
            tracing::info!(operation_uuid = %uuid, operation = ?kind, "operation finished");
        }
        let send = match self.tracked.finish(&uuid, status, now) {
            Ok(send) => send,
            Err(error) => {
                tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot complete the operation");
                return Ok(());
            }
        };
        self.stage_ops(&[uuid], &[])?;
        let changed = applied.is_some();
        if let Some(touched) = applied {
            self.stage_resources(&touched)?;
        }
        self.effect(Effect::Metric(OpMetric::Pending(kind, -1)));
        self.effect(Effect::Metric(OpMetric::Reached(kind, state)));
        if (failed || dropped) && resync {
            // The agent applied it already: resynchronize it (§5.3 last paragraph).
            self.resync_agent();
        }
        if changed {
            self.total_changed(now);
        }
        self.send_updates(send);
        Ok(())
    }

    /// Applies the operations deferred during a reconciliation, in arrival order, each
    /// judged against the reconciled total first: one whose source the reconciliation
    /// took or changed ends DROPPED with Mesos's reconciliation text (Mesos drops every
    /// disk operation that arrives during a reconciliation) before any CSI call, so no
    /// volume is deleted or validated for a resource that is no longer there.
    pub(super) fn start_deferred(&mut self, now: Instant) -> Result<(), MachineError> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        while let Some(uuid) = self.deferred.pop_front() {
            let span = self.tracked_span(&uuid);
            let _entered = span.enter();
            match ledger::judge_deferred(&self.state.total, &self.tracked, &uuid) {
                Some(Resumption::Drop { message, detail }) => {
                    tracing::warn!(operation_uuid = %uuid, %detail, "the reconciliation took or changed the deferred operation's source");
                    self.drop_pending(uuid, message, now)?;
                }
                Some(Resumption::Apply) => self.apply_operation(uuid, now, Attempt::First)?,
                None => {}
            }
        }
        self.after_ops_change();
        Ok(())
    }

    /// The recovered PENDING operations, applied at the subscription reconciliation before
    /// resources are reconciled (§3.4 step 7, §5.10); once per process and identity.
    pub(super) fn start_replay(&mut self, now: Instant) -> Result<(), MachineError> {
        for uuid in std::mem::take(&mut self.replay) {
            let span = self.tracked_span(&uuid);
            let _entered = span.enter();
            tracing::info!(operation_uuid = %uuid, "re-applying a pending operation");
            self.apply_operation(uuid, now, Attempt::Replay)?;
        }
        self.after_ops_change();
        Ok(())
    }

    /// ACKNOWLEDGE_OPERATION_STATUS (§5.11): errors are logged, never fatal.
    pub(super) fn on_acknowledge(
        &mut self,
        ack: &event::AcknowledgeOperationStatus,
        now: Instant,
    ) -> Result<(), MachineError> {
        let (Some(op), Some(status)) = (
            parse_uuid(&ack.operation_uuid),
            parse_uuid(&ack.status_uuid),
        ) else {
            tracing::error!(
                operation_uuid = %uuid_text(&ack.operation_uuid),
                status_uuid = %uuid_text(&ack.status_uuid),
                "Failed to acknowledge operation status: the uuids are not 16 bytes"
            );
            return Ok(());
        };
        let span = self.tracked_span(&op);
        let _entered = span.enter();
        match self.tracked.acknowledge(&op, &status, now) {
            Err(error) => {
                tracing::error!(operation_uuid = %op, status_uuid = %status, error = %DisplayChain(&error), "Failed to acknowledge operation status");
            }
            Ok(Acked::Pending { send }) => {
                self.stage_ops(&[op], &[])?;
                self.send_updates(send);
            }
            Ok(Acked::Terminated(_)) => {
                tracing::debug!(operation_uuid = %op, "the operation's terminal status was acknowledged; forgetting it");
                self.stage_quiet(&[], &[op])?;
            }
        }
        self.after_ops_change();
        Ok(())
    }

    /// RECONCILE_OPERATIONS (§5.12): unknown uuids get the unreliable "Unknown operation"
    /// DROPPED; tracked ones nothing (their status comes through the stream).
    pub(super) fn on_reconcile(&mut self, reconcile: &event::ReconcileOperations) {
        let Some(provider_id) = self.state.provider_id.clone() else {
            return;
        };
        let agent_id = self.agent_id_proto();
        let unknown: Vec<_> = reconcile
            .operation_uuids
            .iter()
            .filter(|raw| !parse_uuid(raw).is_some_and(|u| self.tracked.contains(&u)))
            .map(|raw| call::UpdateOperationStatus {
                framework_id: None,
                status: apply::unknown_operation_status(&agent_id, &provider_id),
                latest_status: None,
                operation_uuid: raw.clone(),
            })
            .collect();
        for update in &unknown {
            tracing::info!(operation_uuid = %uuid_text(&update.operation_uuid), "reconciling an unknown operation: dropped");
            self.effect(Effect::Metric(OpMetric::UnknownDropped));
        }
        self.send_updates(unknown);
    }

    /// PUBLISH_RESOURCES in READY (§5.14): the volumes are published by the driver; the
    /// answer says OK iff all were. At most `max_publishes` run at once; more are answered
    /// FAILED at once (the agent's launch fails and is retried by the framework) rather
    /// than queueing without bound.
    pub(super) fn on_publish(&mut self, publish: event::PublishResources) {
        let text = Resources::from_iter(publish.resources.iter().cloned()).to_string();
        let ids = match publish_targets(&self.state.total, &publish.resources) {
            Ok(ids) => ids,
            Err(reason) => {
                tracing::warn!("Failed to publish resources '{text}': {reason}");
                self.answer_publish(&publish.uuid, false);
                return;
            }
        };
        if self.publishes >= self.cfg.max_publishes {
            tracing::error!(
                bound = self.cfg.max_publishes,
                "Failed to publish resources '{text}': too many publishes in progress"
            );
            self.answer_publish(&publish.uuid, false);
            return;
        }
        self.publishes += 1;
        let provider_id = self.state.provider_id.clone();
        self.effect(Effect::Publish {
            provider_id,
            uuid: publish.uuid,
            ids,
            text,
        });
    }

    /// Answers a PUBLISH_RESOURCES now.
    pub(super) fn answer_publish(&mut self, uuid: &Uuid, ok: bool) {
        let call = super::publish_answer(self.state.provider_id.clone(), uuid.clone(), ok);
        self.effect(Effect::Notify {
            call: Box::new(call),
            about: Notice::PublishAnswer(uuid_text(uuid)),
        });
    }
}
