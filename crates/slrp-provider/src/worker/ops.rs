//! Operations in the worker (spec §5, §8.5): APPLY_OPERATION, ACKNOWLEDGE_OPERATION_STATUS,
//! RECONCILE_OPERATIONS and PUBLISH_RESOURCES in READY, the status update timer, and the
//! replay of recovered PENDING operations.
//!
//! # Design
//! The decisions are pure and live in `slrp_core::provider::{apply, operations}`; this
//! module sequences them with the store, the volume manager and the manager:
//!
//! - **Durable before applied.** An accepted disk operation is committed PENDING before
//!   its CreateVolume / DeleteVolume starts; its completion commits, in one transaction,
//!   the terminal operation record (with its status stream) and the resource records its
//!   conversion changed. A speculative operation without I/O is applied at once, and its
//!   one commit holds the finished operation and its conversion: after a crash either
//!   both are there or neither (the agent then reconciles the unknown operation). So a
//!   recovered PENDING record always means "not applied", and the replay applies it
//!   (CreateVolume by the same name returns the volume already made).
//! - **Disk operations run concurrently**, one task each, their results coming back into
//!   the worker loop; a reconciliation job starts only when none runs (Mesos's
//!   provider-wide sequence), and an operation that must not overlap a reconciliation
//!   (§5.2's table) arriving while one runs or waits is tracked PENDING at once and
//!   applied, in arrival order, when it ends (the "defer, do not drop", §12
//!   item 6).
//! - **One timer** drives the status update manager (`Operations::next_retry`).

use std::collections::VecDeque;
use std::pin::Pin;

use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use slrp_core::provider::apply::{
    self, Admission, AdmissionInput, CreateDiskPlan, DiskRequest, OperationKind,
};
use slrp_core::provider::ledger::{self, Resumption, consumed_by, strip};
use slrp_core::provider::operations::{
    Acked, Operations, TrackedOperation, stage_operation, stage_operation_removal,
};
use slrp_core::provider::persistent::remove_persistent_data;
use slrp_core::provider::resources::{Conversion, Resources, pool_profile_changes, pool_profiles};
use slrp_core::provider::state::StateError;
use slrp_core::volume::{MountPaths, VolumeError, VolumeInfo};
use slrp_proto::mesos::v1::resource_provider::{Call, call, event};
use slrp_proto::mesos::v1::{AgentId, OperationState, Resource, Uuid};
use slrp_store::Transaction;
use slrp_types::DisplayChain;
use tokio::time::{Instant, Sleep};
use tracing::Instrument as _;

use super::{JobKind, ProviderError, Worker, uuid_text};
use crate::publish::{publish_all, publish_targets};

/// The operation part of the worker's state.
pub(super) struct OpFlow {
    /// The tracked operations and their status streams.
    pub(super) tracked: Operations,
    /// Fires at `tracked.next_retry()`.
    pub(super) timer: Pin<Box<Sleep>>,
    /// The deadline `timer` is set to (`None`: disarmed).
    pub(super) armed: Option<Instant>,
    /// CreateVolume / ValidateVolume / DeleteVolume of accepted disk operations.
    pub(super) running: FuturesUnordered<BoxFuture<'static, DiskDone>>,
    /// Operations accepted while a reconciliation ran or waited, in arrival order.
    deferred: VecDeque<uuid::Uuid>,
    /// Recovered PENDING operations, applied at the next subscription reconciliation.
    replay: Vec<uuid::Uuid>,
    /// Bumped when the provider identity changes: results of the old one are ignored.
    identity: u64,
    /// PUBLISH_RESOURCES being carried out.
    pub(super) publishes: FuturesUnordered<BoxFuture<'static, ()>>,
    /// Commits of turns that only forgot acknowledged operations, queued in the store's
    /// order but not awaited by the turn (nothing waits for them; see `Worker::flush`).
    pub(super) acks: FuturesUnordered<slrp_store::Durable>,
    /// The operation counts changed in a turn whose commit is in `acks`: published once
    /// every such commit is durable.
    pub(super) counts_after_acks: bool,
}

impl OpFlow {
    /// The flow over recovered operations: every PENDING one is replayed at the next
    /// subscription reconciliation.
    pub(super) fn new(tracked: Operations) -> Self {
        let replay = tracked
            .iter()
            .filter(|op| !op.is_terminal())
            .map(|op| op.uuid)
            .collect();
        Self {
            tracked,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed: None,
            running: FuturesUnordered::new(),
            deferred: VecDeque::new(),
            replay,
            identity: 0,
            publishes: FuturesUnordered::new(),
            acks: FuturesUnordered::new(),
            counts_after_acks: false,
        }
    }

    /// Replaces the operations with another identity's (an agent-id switch): running
    /// results and deferred operations of the old identity are left behind (their records
    /// stay PENDING under the old agent id, replayed if that identity comes back).
    pub(super) fn switch(&mut self, tracked: Operations) {
        let identity = self.identity + 1;
        // Commits already queued still report their failure.
        let acks = std::mem::take(&mut self.acks);
        *self = Self::new(tracked);
        self.identity = identity;
        self.acks = acks;
    }

    /// The identity the flow serves: results started under another one are stale.
    pub(super) fn identity(&self) -> u64 {
        self.identity
    }

    /// Re-arms the timer if the next retry moved.
    pub(super) fn arm(&mut self) {
        let next = self.tracked.next_retry();
        if next != self.armed {
            if let Some(at) = next {
                self.timer.as_mut().reset(at);
            }
            self.armed = next;
        }
    }
}

/// Waits for the status timer; pending forever when disarmed.
pub(super) async fn status_due(timer: &mut Pin<Box<Sleep>>, armed: bool) {
    if armed {
        timer.as_mut().await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// What a disk operation's volume manager call gave.
pub(super) struct DiskDone {
    uuid: uuid::Uuid,
    identity: u64,
    outcome: DiskOutcome,
}

enum DiskOutcome {
    Created {
        plan: Box<CreateDiskPlan>,
        result: Result<VolumeInfo, VolumeError>,
    },
    Destroyed {
        source: Box<Resource>,
        result: Result<bool, VolumeError>,
    },
}

/// What the current turn of the worker loop changed but has not committed yet, and what
/// must wait for that commit: status updates and volume manager calls leave the process
/// only once the records they follow are durable (spec §5.10). Every operation handled in
/// one turn shares the turn's one commit (one fsync), so concurrent operations no longer
/// wait for each other's commits one by one.
#[derive(Default)]
pub(super) struct Batch {
    /// The turn's changes, in the order they were staged.
    txn: Option<Transaction>,
    /// Status updates to send once `txn` is durable, in order.
    sends: Vec<call::UpdateOperationStatus>,
    /// Volume manager calls of accepted disk operations, started once their PENDING
    /// record is durable.
    disk: Vec<BoxFuture<'static, DiskDone>>,
    /// The operation counts of the status changed.
    counts: bool,
    /// Something other than the removal of acknowledged operations was staged: the turn
    /// waits for its commit.
    awaited: bool,
}

/// Which `provider_resource` records a commit rewrites.
pub(super) enum Touched<'a> {
    /// None (and not the provider record either).
    Nothing,
    /// Those of these resources' identities.
    Some(&'a Resources),
}

/// Metrics counted for an operation that reached `state` (spec §9).
fn count_state(metrics: &crate::metrics::ProviderMetrics, kind: OperationKind, state: i32) {
    let operations = metrics.operations();
    match OperationState::try_from(state) {
        Ok(OperationState::OperationPending) => operations.pending(kind, 1),
        Ok(OperationState::OperationFinished) => operations.finished(kind),
        Ok(OperationState::OperationFailed) => operations.failed(kind),
        Ok(OperationState::OperationDropped) => operations.dropped(kind),
        _ => {}
    }
}

/// Feeds the metrics from the recovered operations' latest states (spec §9, §3.4 step 6),
/// once per identity and process (Mesos counts again at every subscription, §12 item 8).
pub(super) fn count_recovered(metrics: &crate::metrics::ProviderMetrics, tracked: &Operations) {
    for op in tracked.iter() {
        count_state(metrics, OperationKind::of(&op.info), op.latest_status.state);
    }
}

/// Whether a speculative operation has I/O to do before its conversion (DESTROY removes
/// the persistent volumes' data): it is then committed PENDING first, so a crash during
/// the removal replays it instead of losing it.
fn has_io(info: &slrp_proto::mesos::v1::offer::Operation) -> bool {
    OperationKind::of(info) == OperationKind::Destroy
}

/// The span of everything the worker does for one operation (its acceptance, its disk
/// task, its completion, its acknowledgement), so every log line of it names it.
fn operation_span(uuid: &uuid::Uuid, kind: OperationKind) -> tracing::Span {
    tracing::info_span!("operation", operation_uuid = %uuid, operation = ?kind)
}

fn parse_uuid(uuid: &Uuid) -> Option<uuid::Uuid> {
    uuid::Uuid::from_slice(&uuid.value).ok()
}

impl Worker {
    fn agent_id_proto(&self) -> AgentId {
        AgentId {
            value: self.params.agent_id.clone(),
        }
    }

    /// Whether a reconciliation job runs or waits to run (Mesos's `reconciled` future is
    /// pending): operations that must not overlap one are deferred.
    pub(super) fn reconciling(&self) -> bool {
        self.job.is_some() || self.jobs.waiting(self.lifecycle) || !self.ops.deferred.is_empty()
    }

    /// The storage pool resources PENDING operations consume: a reconciliation keeps them
    /// (spec §6.2; `reconcile_pools`' `in_flight`).
    pub(super) fn in_flight(&self) -> Resources {
        ledger::in_flight(&self.ops.tracked)
    }

    /// [`ledger::check_available`] against the current total.
    fn check_available(&self, uuid: &uuid::Uuid, consumed: &Resources) -> Result<(), String> {
        ledger::check_available(&self.state.total, &self.ops.tracked, uuid, consumed)
    }

    /// Commits the records of `ops` (put), `removed` (delete) and the resource records of
    /// `touched` with everything else staged in this turn, and waits until it is durable.
    pub(super) async fn commit_ops(
        &mut self,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
        touched: Touched<'_>,
    ) -> Result<(), ProviderError> {
        self.stage_ops(ops, removed, touched)?;
        self.flush().await
    }

    fn checkpoint_error(&self, source: StateError) -> ProviderError {
        ProviderError::Checkpoint {
            provider: self.label.clone(),
            source: Box::new(source),
        }
    }

    /// [`Self::checkpoint_error`] for a failed commit of the store.
    fn commit_error(&self, source: slrp_store::StoreError) -> ProviderError {
        self.checkpoint_error(StateError::Store {
            store: self.deps.store.path().to_owned(),
            source,
        })
    }

    /// Stages the records of `ops` (put), `removed` (delete) and the resource records of
    /// `touched` into this turn's transaction (written as they are now, in this order);
    /// [`Self::flush`] commits it.
    pub(super) fn stage_ops(
        &mut self,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
        touched: Touched<'_>,
    ) -> Result<(), ProviderError> {
        self.batch.awaited = true;
        self.stage_quiet(ops, removed, touched)
    }

    /// [`Self::stage_ops`] for changes nothing waits for (the removal of an acknowledged
    /// operation): a turn that staged only such changes does not wait for its commit.
    fn stage_quiet(
        &mut self,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
        touched: Touched<'_>,
    ) -> Result<(), ProviderError> {
        let agent_id = self.params.agent_id.clone();
        let mut txn = match self.batch.txn.take() {
            Some(txn) => txn,
            None => self.deps.store.transaction(),
        };
        let staged = self.stage_into(&mut txn, &agent_id, ops, removed, touched);
        self.batch.txn = Some(txn);
        staged.map_err(|source| self.checkpoint_error(source))
    }

    fn stage_into(
        &mut self,
        txn: &mut Transaction,
        agent_id: &str,
        ops: &[uuid::Uuid],
        removed: &[uuid::Uuid],
        touched: Touched<'_>,
    ) -> Result<(), StateError> {
        for uuid in ops {
            if let Some(op) = self.ops.tracked.get(uuid) {
                stage_operation(txn, agent_id, op)?;
            }
        }
        for uuid in removed {
            stage_operation_removal(txn, agent_id, uuid)?;
        }
        if let Touched::Some(resources) = touched {
            self.follow_pool_profiles(resources);
            self.state.stage(txn, agent_id, Some(resources))?;
        }
        Ok(())
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

    /// Commits what this turn staged (one fsync for all of it), then lets out what waited
    /// for it: the status updates, in order, and the volume manager calls.
    pub(super) async fn flush(&mut self) -> Result<(), ProviderError> {
        let batch = std::mem::take(&mut self.batch);
        // A commit awaited here is durable after every queued acknowledgement commit.
        let committed = batch.txn.is_some();
        if let Some(txn) = batch.txn {
            let quiet = !batch.awaited && batch.sends.is_empty() && batch.disk.is_empty();
            let durable = txn.submit().await.map_err(|e| self.commit_error(e))?;
            if quiet {
                // Only acknowledged operations were forgotten: nothing leaves the process
                // because of it, every later commit is queued after it, and a failure
                // poisons the store (no later commit becomes durable) and ends the
                // worker from the loop. So the next event need not wait for its fsync.
                self.ops.acks.push(durable);
                self.ops.counts_after_acks |= batch.counts;
                return Ok(());
            }
            durable.await.map_err(|e| self.commit_error(e))?;
        }
        self.dispatch_updates(batch.sends);
        for disk in batch.disk {
            self.ops.running.push(disk);
        }
        if batch.counts {
            if committed || self.ops.acks.is_empty() {
                self.publish_counts();
            } else {
                self.ops.counts_after_acks = true;
            }
        }
        Ok(())
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

    /// Sends status updates once this turn's changes are durable (reliable ones come from
    /// the status update manager, which keeps them until acknowledged; a failed send is
    /// only logged: the retry resends).
    fn send_updates(&mut self, updates: impl IntoIterator<Item = call::UpdateOperationStatus>) {
        self.batch.sends.extend(updates);
    }

    fn dispatch_updates(&mut self, updates: Vec<call::UpdateOperationStatus>) {
        let Some(id) = self.state.provider_id.clone() else {
            return;
        };
        for update in updates {
            let operation = uuid_text(&update.operation_uuid);
            let call = Call {
                r#type: Some(call::Type::UpdateOperationStatus as i32),
                resource_provider_id: Some(id.clone()),
                update_operation_status: Some(update),
                ..Call::default()
            };
            let agent = self.agent.clone();
            self.replies.push(Box::pin(async move {
                if let Err(error) = agent.call(call).await {
                    tracing::warn!(operation_uuid = %operation, error = %DisplayChain(&error), "sending an operation status update failed");
                }
            }));
        }
    }

    /// Arms the status timer; the counts reach the status with the turn's commit.
    pub(super) fn after_ops_change(&mut self) {
        self.ops.arm();
        self.batch.counts = true;
    }

    /// A queued acknowledgement commit ended: a failure ends the worker; once none is
    /// outstanding the counts they changed are durable and published.
    pub(super) fn on_ack_durable(
        &mut self,
        done: Result<(), slrp_store::StoreError>,
    ) -> Result<(), ProviderError> {
        done.map_err(|e| self.commit_error(e))?;
        if self.ops.acks.is_empty() && std::mem::take(&mut self.ops.counts_after_acks) {
            self.publish_counts();
        }
        Ok(())
    }

    /// Publishes the operation counts: what an observer sees tracked is durable.
    pub(super) fn publish_counts(&mut self) {
        let (operations, unacknowledged) =
            (self.ops.tracked.len(), self.ops.tracked.unacknowledged());
        self.status.send_if_modified(|s| {
            let changed = (s.operations, s.unacknowledged) != (operations, unacknowledged);
            s.operations = operations;
            s.unacknowledged = unacknowledged;
            changed
        });
    }

    /// The status update timer fired: resend the heads that are due.
    pub(super) fn on_status_timer(&mut self) {
        let due = self.ops.tracked.due(Instant::now());
        self.ops.armed = None;
        self.send_updates(due);
        self.ops.arm();
    }

    /// READY: resume the status update manager (every unacknowledged head is resent).
    pub(super) fn resume_statuses(&mut self) {
        let heads = self.ops.tracked.resume(Instant::now());
        self.send_updates(heads);
        self.after_ops_change();
    }

    /// Not READY any more: nothing is sent until the next READY.
    pub(super) fn pause_statuses(&mut self) {
        self.ops.tracked.pause();
        self.after_ops_change();
    }

    /// APPLY_OPERATION. `refused` is the reason it cannot be applied in this state (before
    /// READY): it is then DROPPED as Mesos does (tracked, reliable status).
    pub(super) async fn on_apply(
        &mut self,
        apply: event::ApplyOperation,
        refused: Option<String>,
    ) -> Result<(), ProviderError> {
        let span = match parse_uuid(&apply.operation_uuid) {
            Some(uuid) => operation_span(&uuid, OperationKind::of(&apply.info)),
            None => tracing::Span::none(),
        };
        Box::pin(self.apply_event(apply, refused).instrument(span)).await
    }

    async fn apply_event(
        &mut self,
        apply: event::ApplyOperation,
        refused: Option<String>,
    ) -> Result<(), ProviderError> {
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
        let tracked = self.ops.tracked.contains(&uuid);
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
                ledger::confirm_deferral(&self.state.total, &self.ops.tracked, &uuid, &apply.info)
            }
            other => other,
        };
        let kind = OperationKind::of(&apply.info);
        let resync = apply::agent_applies_speculatively(&apply.info);
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
                let send = match self.ops.tracked.insert_dropped(op, Instant::now()) {
                    Ok(send) => send,
                    Err(error) => {
                        tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot track the dropped operation");
                        return Ok(());
                    }
                };
                self.stage_ops(&[uuid], &[], Touched::Nothing)?;
                self.deps.metrics.operations().dropped(kind);
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
                if let Err(error) = self.ops.tracked.insert_pending(op) {
                    tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot track the operation");
                    return Ok(());
                }
                self.deps.metrics.operations().pending(kind, 1);
                if one_commit {
                    // Its completion commit is the first: nothing to replay before it.
                    self.apply_operation(uuid).await?;
                } else {
                    // A disk operation's call starts only once this is durable (`flush`).
                    self.stage_ops(&[uuid], &[], Touched::Nothing)?;
                    if immediate {
                        self.apply_operation(uuid).await?;
                    } else {
                        self.ops.deferred.push_back(uuid);
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
        let Some(op) = self.ops.tracked.get(uuid) else {
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

    /// Applies a tracked PENDING operation (§5.3–§5.5): speculative ones complete now,
    /// disk operations start their volume manager call.
    async fn apply_operation(&mut self, uuid: uuid::Uuid) -> Result<(), ProviderError> {
        let Some(op) = self.ops.tracked.get(&uuid) else {
            return Ok(());
        };
        let info = op.info.clone();
        let identity = self.ops.identity;
        let kind = OperationKind::of(&info);
        if matches!(kind, OperationKind::CreateDisk | OperationKind::DestroyDisk)
            && let Err(message) = self.check_available(&uuid, &consumed_by(&info))
        {
            // Before any volume manager call: a volume created for resources another
            // operation takes would be in no resource.
            tracing::warn!(operation_uuid = %uuid, operation = ?kind, "the resources are held by another pending operation");
            return self.complete(uuid, Err(message)).await;
        }
        match kind {
            kind if kind.is_speculative() => {
                let result = match apply::speculative_conversions(&info) {
                    // Checked before DESTROY removes any data: a stale DESTROY must not
                    // delete a volume's contents and then fail.
                    Ok(conversions) => match self.check_speculative(&uuid, &info, &conversions) {
                        Ok(()) => {
                            if has_io(&info) {
                                // Data is removed only once the PENDING record is durable:
                                // a crash during the removal replays the operation.
                                self.flush().await?;
                            }
                            remove_persistent(self.params.mount_paths.clone(), &info)
                                .await
                                .map(|()| conversions)
                        }
                        Err(message) => Err(message),
                    },
                    Err(message) => Err(message),
                };
                self.complete(uuid, result).await
            }
            OperationKind::CreateDisk => {
                match apply::plan_create_disk(&info, &uuid, &self.live_profiles) {
                    Err(message) => self.complete(uuid, Err(message)).await,
                    Ok(plan) => {
                        let volumes = self.deps.volumes.clone();
                        let call = async move {
                            let result = match &plan.request {
                                DiskRequest::Create(req) => volumes.create(req.clone()).await,
                                DiskRequest::Import(req) => volumes.validate(req.clone()).await,
                            };
                            DiskDone {
                                uuid,
                                identity,
                                outcome: DiskOutcome::Created {
                                    plan: Box::new(plan),
                                    result,
                                },
                            }
                        };
                        // In the operation's span, like everything else done for it.
                        self.batch
                            .disk
                            .push(Box::pin(call.instrument(tracing::Span::current())));
                        Ok(())
                    }
                }
            }
            OperationKind::DestroyDisk => match apply::destroy_disk_target(&info) {
                Err(message) => self.complete(uuid, Err(message)).await,
                Ok((id, source)) => {
                    let volumes = self.deps.volumes.clone();
                    let call = async move {
                        let result = volumes.delete(&id).await;
                        DiskDone {
                            uuid,
                            identity,
                            outcome: DiskOutcome::Destroyed {
                                source: Box::new(source),
                                result,
                            },
                        }
                    };
                    self.batch
                        .disk
                        .push(Box::pin(call.instrument(tracing::Span::current())));
                    Ok(())
                }
            },
            _ => {
                // GROW_VOLUME, SHRINK_VOLUME, …: the master rejects them for provider
                // resources; Mesos would abort (§5.1). FAILED instead.
                let name = info
                    .r#type
                    .and_then(|t| slrp_proto::mesos::v1::offer::operation::Type::try_from(t).ok())
                    .map_or("UNKNOWN", |t| t.as_str_name());
                self.complete(uuid, Err(format!("Unsupported operation {name}")))
                    .await
            }
        }
    }
}

impl Worker {
    /// A speculative operation's conversions against the total less what the other
    /// PENDING operations hold; a DESTROY also against the total itself, for the shared
    /// copies check, before its data is removed.
    fn check_speculative(
        &self,
        uuid: &uuid::Uuid,
        info: &slrp_proto::mesos::v1::offer::Operation,
        conversions: &[Conversion],
    ) -> Result<(), String> {
        let consumed: Resources = conversions
            .iter()
            .flat_map(|c| c.consumed.iter().map(strip))
            .collect();
        self.check_available(uuid, &consumed)?;
        if has_io(info) {
            apply::apply_conversions(&self.state.total, info, conversions)?;
        }
        Ok(())
    }
}

/// DESTROY of persistent MOUNT volumes removes their data first (§5.3).
async fn remove_persistent(
    paths: Option<MountPaths>,
    info: &slrp_proto::mesos::v1::offer::Operation,
) -> Result<(), String> {
    if OperationKind::of(info) != OperationKind::Destroy {
        return Ok(());
    }
    for target in apply::destroy_targets(info)? {
        let Some(paths) = &paths else {
            return Err(format!(
                "Failed to remove persistent volume '{}': no mount root is configured",
                target.persistence_id
            ));
        };
        remove_persistent_data(paths, &target.volume_id, &target.persistence_id).await?;
    }
    Ok(())
}

impl Worker {
    /// A disk operation's volume manager call ended.
    pub(super) async fn on_disk_done(&mut self, done: DiskDone) -> Result<(), ProviderError> {
        let span = self.tracked_span(&done.uuid);
        self.disk_done(done).instrument(span).await
    }

    /// The span of a tracked operation (none for an unknown uuid).
    fn tracked_span(&self, uuid: &uuid::Uuid) -> tracing::Span {
        match self.ops.tracked.get(uuid) {
            Some(op) => operation_span(uuid, OperationKind::of(&op.info)),
            None => tracing::Span::none(),
        }
    }

    async fn disk_done(&mut self, done: DiskDone) -> Result<(), ProviderError> {
        let DiskDone {
            uuid,
            identity,
            outcome,
        } = done;
        if identity != self.ops.identity {
            tracing::info!(operation_uuid = %uuid, "a disk operation of the previous identity ended; its record stays pending there");
            return Ok(());
        }
        let Some(ctx) = self.ctx.clone() else {
            return Ok(());
        };
        match outcome {
            DiskOutcome::Created { plan, result } => {
                let result = apply::create_disk_outcome(&ctx, &plan, result);
                self.complete(uuid, result).await?;
            }
            DiskOutcome::Destroyed { source, result } => match result {
                Ok(deprovisioned) => {
                    let destroyed = apply::destroy_disk_conversion(
                        &ctx,
                        &source,
                        deprovisioned,
                        &self.live_profiles,
                    );
                    let reconcile = destroyed.reconcile_pools;
                    self.complete(uuid, Ok(vec![destroyed.conversion])).await?;
                    if reconcile && !self.reconciling() {
                        // The freed space had no live profile: let the current profiles
                        // claim it (§5.5 step 3).
                        self.jobs.mark(JobKind::Pools);
                    }
                }
                Err(error) => {
                    let message = DisplayChain(&error).to_string();
                    self.complete(uuid, Err(message)).await?;
                }
            },
        }
        self.after_ops_change();
        Ok(())
    }

    /// Completes a PENDING operation (§5.6): conversions applied to the total (allocation
    /// info stripped), terminal status, one commit of the operation and the resources it
    /// changed, metrics, and for a failed speculative operation a new resource version and
    /// UPDATE_STATE.
    async fn complete(
        &mut self,
        uuid: uuid::Uuid,
        outcome: Result<Vec<Conversion>, String>,
    ) -> Result<(), ProviderError> {
        let Some(op) = self.ops.tracked.get(&uuid) else {
            return Ok(());
        };
        let kind = OperationKind::of(&op.info);
        let agent_id = self.agent_id_proto();
        let resync = apply::agent_applies_speculatively(&op.info);
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
                    Err(message) => apply::failed_status(op, &message, &agent_id),
                }
            }
            Err(message) => apply::failed_status(op, &message, &agent_id),
        };
        self.end(uuid, kind, resync, status, applied)
    }

    /// Ends a tracked PENDING operation with DROPPED and `message` (no conversion, no
    /// call made): one commit, metrics, the status sent reliably.
    fn drop_pending(&mut self, uuid: uuid::Uuid, message: &str) -> Result<(), ProviderError> {
        let Some(op) = self.ops.tracked.get(&uuid) else {
            return Ok(());
        };
        if op.is_terminal() {
            return Ok(());
        }
        let kind = OperationKind::of(&op.info);
        let resync = apply::agent_applies_speculatively(&op.info);
        let status = apply::dropped_status(op, message, &self.agent_id_proto());
        tracing::warn!(operation_uuid = %uuid, "Dropping operation (uuid: {uuid}): {message}");
        self.end(uuid, kind, resync, status, None)
    }

    /// The common end of [`Self::complete`] and [`Self::drop_pending`]: the terminal
    /// `status` recorded, staged with the resources `applied` touched, counted and sent.
    fn end(
        &mut self,
        uuid: uuid::Uuid,
        kind: OperationKind,
        resync: bool,
        status: slrp_proto::mesos::v1::OperationStatus,
        applied: Option<Resources>,
    ) -> Result<(), ProviderError> {
        let state = status.state;
        let failed = state == OperationState::OperationFailed as i32;
        let dropped = state == OperationState::OperationDropped as i32;
        if failed {
            tracing::warn!(operation_uuid = %uuid, operation = ?kind, message = status.message.as_deref().unwrap_or(""), "operation failed");
        } else if !dropped {
            tracing::info!(operation_uuid = %uuid, operation = ?kind, "operation finished");
        }
        let send = match self.ops.tracked.finish(&uuid, status, Instant::now()) {
            Ok(send) => send,
            Err(error) => {
                tracing::error!(operation_uuid = %uuid, error = %DisplayChain(&error), "cannot complete the operation");
                return Ok(());
            }
        };
        let changed = applied.is_some();
        match applied {
            Some(touched) => self.stage_ops(&[uuid], &[], Touched::Some(&touched))?,
            None => self.stage_ops(&[uuid], &[], Touched::Nothing)?,
        }
        self.deps.metrics.operations().pending(kind, -1);
        count_state(&self.deps.metrics, kind, state);
        if (failed || dropped) && resync {
            // The agent applied it already: resynchronize it (§5.3 last paragraph).
            self.resync_agent();
        }
        if changed {
            self.total_changed();
        }
        self.send_updates(send);
        Ok(())
    }

    /// Applies the operations deferred during a reconciliation, in arrival order, each
    /// judged against the reconciled total first: one whose source the reconciliation
    /// took or changed ends DROPPED with Mesos's reconciliation text (Mesos drops every
    /// disk operation that arrives during a reconciliation) before any CSI call, so no
    /// volume is deleted or validated for a resource that is no longer there.
    pub(super) async fn start_deferred(&mut self) -> Result<(), ProviderError> {
        while let Some(uuid) = self.ops.deferred.pop_front() {
            let span = self.tracked_span(&uuid);
            match ledger::judge_deferred(&self.state.total, &self.ops.tracked, &uuid) {
                Some(Resumption::Drop { message, detail }) => span.in_scope(|| {
                    tracing::warn!(operation_uuid = %uuid, %detail, "the reconciliation took or changed the deferred operation's source");
                    self.drop_pending(uuid, message)
                })?,
                Some(Resumption::Apply) => self.apply_operation(uuid).instrument(span).await?,
                None => {}
            }
        }
        self.after_ops_change();
        Ok(())
    }

    /// The recovered PENDING operations, applied at the subscription reconciliation before
    /// resources are reconciled (§3.4 step 7, §5.10); once per process and identity.
    pub(super) async fn start_replay(&mut self) -> Result<(), ProviderError> {
        for uuid in std::mem::take(&mut self.ops.replay) {
            let span = self.tracked_span(&uuid);
            async {
                tracing::info!(operation_uuid = %uuid, "re-applying a pending operation");
                self.apply_operation(uuid).await
            }
            .instrument(span)
            .await?;
        }
        self.after_ops_change();
        Ok(())
    }

    /// ACKNOWLEDGE_OPERATION_STATUS (§5.11): errors are logged, never fatal.
    pub(super) async fn on_acknowledge(
        &mut self,
        ack: event::AcknowledgeOperationStatus,
    ) -> Result<(), ProviderError> {
        let span = match parse_uuid(&ack.operation_uuid) {
            Some(uuid) => self.tracked_span(&uuid),
            None => tracing::Span::none(),
        };
        self.acknowledge(ack).instrument(span).await
    }

    async fn acknowledge(
        &mut self,
        ack: event::AcknowledgeOperationStatus,
    ) -> Result<(), ProviderError> {
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
        match self.ops.tracked.acknowledge(&op, &status, Instant::now()) {
            Err(error) => {
                tracing::error!(operation_uuid = %op, status_uuid = %status, error = %DisplayChain(&error), "Failed to acknowledge operation status");
            }
            Ok(Acked::Pending { send }) => {
                self.stage_ops(&[op], &[], Touched::Nothing)?;
                self.send_updates(send);
            }
            Ok(Acked::Terminated(_)) => {
                tracing::debug!(operation_uuid = %op, "the operation's terminal status was acknowledged; forgetting it");
                self.stage_quiet(&[], &[op], Touched::Nothing)?;
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
            .filter(|raw| !parse_uuid(raw).is_some_and(|u| self.ops.tracked.contains(&u)))
            .map(|raw| call::UpdateOperationStatus {
                framework_id: None,
                status: apply::unknown_operation_status(&agent_id, &provider_id),
                latest_status: None,
                operation_uuid: raw.clone(),
            })
            .collect();
        for update in &unknown {
            tracing::info!(operation_uuid = %uuid_text(&update.operation_uuid), "reconciling an unknown operation: dropped");
            self.deps.metrics.operations().unknown_dropped();
        }
        self.send_updates(unknown);
    }

    /// PUBLISH_RESOURCES in READY (§5.14): the volumes are published in a task (the loop
    /// goes on); the reply says OK iff all were. At most `max_publishes` run at once; more
    /// are answered FAILED at once (the agent's launch fails and is retried by the
    /// framework) rather than queueing without bound.
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
        if self.ops.publishes.len() >= self.params.max_publishes {
            tracing::error!(
                bound = self.params.max_publishes,
                "Failed to publish resources '{text}': too many publishes in progress"
            );
            self.answer_publish(&publish.uuid, false);
            return;
        }
        let volumes = self.deps.volumes.clone();
        let reply = self.publish_reply(&publish.uuid);
        self.ops.publishes.push(Box::pin(async move {
            let ok = match publish_all(&volumes, ids).await {
                Ok(()) => true,
                Err(error) => {
                    tracing::warn!("Failed to publish resources '{text}': {error}");
                    false
                }
            };
            reply(ok).await;
        }));
    }

    /// Answers a PUBLISH_RESOURCES now.
    pub(super) fn answer_publish(&mut self, uuid: &Uuid, ok: bool) {
        let reply = self.publish_reply(uuid);
        self.replies.push(Box::pin(reply(ok)));
    }

    /// The UPDATE_PUBLISH_RESOURCES_STATUS answer to send once the outcome is known.
    fn publish_reply(&self, uuid: &Uuid) -> impl FnOnce(bool) -> BoxFuture<'static, ()> + use<> {
        let agent = self.agent.clone();
        let provider_id = self.state.provider_id.clone();
        let uuid = uuid.clone();
        move |ok| {
            Box::pin(async move {
                use call::update_publish_resources_status::Status;
                let status = if ok { Status::Ok } else { Status::Failed };
                let text = uuid_text(&uuid);
                let call = Call {
                    r#type: Some(call::Type::UpdatePublishResourcesStatus as i32),
                    resource_provider_id: provider_id,
                    update_publish_resources_status: Some(call::UpdatePublishResourcesStatus {
                        uuid,
                        status: status as i32,
                    }),
                    ..Call::default()
                };
                if let Err(error) = agent.call(call).await {
                    tracing::warn!(uuid = %text, error = %DisplayChain(&error), "answering PUBLISH_RESOURCES failed");
                }
            })
        }
    }
}
