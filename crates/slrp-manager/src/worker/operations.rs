//! The operations of each provider: the agent's table (applies, status updates,
//! `UPDATE_STATE` reconciliation, acknowledgements and the total they convert) and the
//! master's record of operations the agent forgot, with the waiters for terminal
//! statuses. It is separate because it outlives any one subscription: the session only
//! routes calls here, and this sends its events through the session.

use std::collections::HashMap;

use slrp_proto::mesos::v1::resource_provider::{Event, call, event};
use slrp_proto::mesos::v1::{OperationState, OperationStatus, Resource, Uuid as ProtoUuid, offer};
use slrp_types::DisplayChain;
use uuid::Uuid;

use super::completed::CompactView;
use super::{
    ManagerMessage, OperationView, Orphan, Waiter, Worker, is_terminal, proto_uuid, provider_id,
};
use crate::ApplyRequest;
use crate::error::{OperationError, SendEventError};
use crate::resources;

impl Worker {
    /// The agent's `UPDATE_STATE` handling (spec §2.8, Mesos
    /// `handleResourceProviderMessage`): replace the total, reconcile the operation table,
    /// store the version.
    pub(super) fn update_state(&mut self, id: &str, update: call::UpdateState) {
        let Some(sub) = self.subscribed.get_mut(id) else {
            return;
        };
        sub.resources.clone_from(&update.resources);
        sub.resource_version_uuid = Some(update.resource_version_uuid.clone());
        let agent = self.agents.entry(id.to_owned()).or_default();
        agent.total = resources::Total::from_resources(&update.resources);
        let mut previous = std::mem::take(&mut agent.operations);
        let mut became_terminal = Vec::new();
        for operation in &update.operations {
            let key = operation.uuid.value.clone();
            // Known to the provider again: the agent's table has it from here on.
            self.orphans.remove(&key);
            let record = match previous.remove(&key) {
                // Known to both: a terminal state in the update is already reflected in
                // its total, so it only overwrites the agent's non-terminal latest status
                // (and the later status update then converts nothing). Only
                // `latest_status` is taken, as by Mesos's agent: its `statuses` stay those
                // of the status updates the agent received (an acknowledgement removes the
                // operation once the last of them is terminal).
                Some(mut known) => {
                    if is_terminal(operation.latest_status.state)
                        && !is_terminal(known.latest_status.state)
                    {
                        known.latest_status = operation.latest_status.clone();
                        became_terminal.push(known.clone());
                    }
                    known
                }
                // Unknown to the agent (it restarted, or the apply was not seen): adopted
                // whole, as Mesos's `addOperation(new Operation(...))`.
                None => {
                    let view = OperationView {
                        operation_uuid: operation.uuid.clone(),
                        framework_id: operation.framework_id.clone(),
                        info: Some(operation.info.clone()),
                        latest_status: operation.latest_status.clone(),
                        statuses: operation.statuses.clone(),
                    };
                    // One the master waits for (e.g. an operation this update's
                    // predecessor orphaned, dropped by the provider meanwhile) ends here:
                    // its status update, if it comes after, finds it terminal and would
                    // wake nobody.
                    if is_terminal(view.latest_status.state) {
                        became_terminal.push(view.clone());
                    }
                    view
                }
            };
            agent.operations.insert(key, record);
        }
        for view in became_terminal {
            self.notify(&view.operation_uuid.value.clone(), &Ok(view));
        }
        self.orphan(id, previous);
        let _ = self.messages.send(ManagerMessage::UpdateState {
            provider_id: id.to_owned(),
            resources: update.resources,
            operations: update.operations,
            resource_version_uuid: update.resource_version_uuid,
        });
    }

    /// Operations known to the agent and absent from the provider's `UPDATE_STATE` (an
    /// APPLY_OPERATION that crossed the update, or one the provider never committed
    /// before it failed over). The agent's table drops them, as Mesos's does; the master
    /// keeps them and asks the provider with RECONCILE_OPERATIONS (together with those
    /// of earlier updates still unanswered), so every one of them ends with a status.
    fn orphan(&mut self, id: &str, dropped: HashMap<Vec<u8>, OperationView>) {
        for (key, view) in dropped {
            tracing::warn!(
                provider = %id,
                operation = %display_uuid(&view.operation_uuid),
                "operation not in the provider's UPDATE_STATE; the agent forgets it, the master asks the provider",
            );
            if is_terminal(view.latest_status.state) {
                // Its terminal status was seen: nothing to ask.
                self.completed.insert(key, &view);
                continue;
            }
            self.orphans.insert(
                key,
                Orphan {
                    provider_id: id.to_owned(),
                    view,
                },
            );
        }
        let asked: Vec<ProtoUuid> = self
            .orphans
            .values()
            .filter(|orphan| orphan.provider_id == id)
            .map(|orphan| orphan.view.operation_uuid.clone())
            .collect();
        if asked.is_empty() {
            return;
        }
        let event = Event {
            r#type: Some(event::Type::ReconcileOperations as i32),
            reconcile_operations: Some(event::ReconcileOperations {
                operation_uuids: asked.clone(),
            }),
            ..Event::default()
        };
        if let Err(reason) = self.send(id, &event) {
            // Nobody can answer for them now; whoever waits learns that.
            tracing::warn!(provider = %id, reason, "cannot ask the provider about the operations the agent forgot");
            for uuid in asked {
                self.orphans.remove(&uuid.value);
                let forgotten = Uuid::from_slice(&uuid.value).unwrap_or_default();
                self.notify(
                    &uuid.value,
                    &Err(OperationError::Forgotten { uuid: forgotten }),
                );
            }
        }
    }

    /// The master's record of an operation the agent forgot takes the provider's
    /// status; returns the record once terminal. A terminal status without a UUID (the
    /// unreliable DROPPED "Unknown operation") is never acknowledged: the record is
    /// complete at once; one with a UUID is complete once acknowledged.
    fn orphan_status(
        &mut self,
        id: &str,
        key: &[u8],
        status: &OperationStatus,
    ) -> Option<OperationView> {
        let orphan = self
            .orphans
            .get_mut(key)
            .filter(|orphan| orphan.provider_id == id)?;
        let view = &mut orphan.view;
        if is_terminal(view.latest_status.state) {
            return None;
        }
        view.latest_status = status.clone();
        if let Some(operation_id) = view.info.as_ref().and_then(|info| info.id.clone()) {
            view.latest_status.operation_id = Some(operation_id);
        }
        push_dedup(&mut view.statuses, &view.latest_status);
        if !is_terminal(status.state) {
            return None;
        }
        let view = view.clone();
        if status.uuid.is_none()
            && let Some(orphan) = self.orphans.remove(key)
        {
            self.completed.insert(key.to_vec(), &orphan.view);
        }
        Some(view)
    }

    /// The agent's handling of an operation status update (spec §2.9 step 5, Mesos
    /// `updateOperation`), then the master's acknowledgement (step 6).
    pub(super) fn update_operation_status(
        &mut self,
        id: &str,
        mut update: call::UpdateOperationStatus,
    ) {
        let Some(sub) = self.subscribed.get(id) else {
            return;
        };
        if let Some(latest) = &update.latest_status
            && latest.resource_provider_id.as_ref() != sub.info.id.as_ref()
        {
            // Mesos CHECK-fails here after having answered 202.
            self.violation(
                id,
                "'update_operation_status.latest_status.resource_provider_id' does not match \
                 the provider (a Mesos agent aborts on this)"
                    .to_owned(),
            );
        }
        let key = update.operation_uuid.value.clone();
        let agent = self.agents.entry(id.to_owned()).or_default();
        let mut violation = None;
        let mut became_terminal = None;
        // An operation the agent does not know (acknowledged terminal before, or never
        // applied through it) is forwarded but changes nothing, as on the agent.
        if let Some(record) = agent.operations.get_mut(&key) {
            // The provider may forget or miscopy the operation ID; the agent's is used.
            if let Some(operation_id) = record.info.as_ref().and_then(|info| info.id.clone()) {
                if let Some(latest) = update.latest_status.as_mut() {
                    latest.operation_id = Some(operation_id.clone());
                }
                update.status.operation_id = Some(operation_id);
            }
            let latest = update
                .latest_status
                .clone()
                .unwrap_or_else(|| update.status.clone());
            let terminated = !is_terminal(record.latest_status.state) && is_terminal(latest.state);
            if !is_terminal(record.latest_status.state) {
                record.latest_status = latest;
            }
            if update.framework_id.is_some() {
                record.framework_id.clone_from(&update.framework_id);
            }
            push_dedup(&mut record.statuses, &update.status);
            let info = record.info.clone().unwrap_or_default();
            if terminated
                && !resources::is_speculative(&info)
                && record.latest_status.state == OperationState::OperationFinished as i32
            {
                violation = apply_finished(&mut agent.total, &info, &record.latest_status)
                    .err()
                    .map(|reason| {
                        format!(
                            "FINISHED operation {}: {reason} (a Mesos agent aborts on this)",
                            display_uuid(&record.operation_uuid)
                        )
                    });
            }
            if terminated {
                became_terminal = Some(record.clone());
            }
        }
        if let Some(reason) = violation {
            self.violation(id, reason);
        }
        if became_terminal.is_none()
            && !self
                .agents
                .get(id)
                .is_some_and(|agent| agent.operations.contains_key(&key))
        {
            let status = update
                .latest_status
                .clone()
                .unwrap_or_else(|| update.status.clone());
            became_terminal = self.orphan_status(id, &key, &status);
        }
        if let Some(reason) = became_terminal.as_ref().and_then(allocation_violation) {
            self.violation(id, reason);
        }
        let operation_uuid = update.operation_uuid.clone();
        let status_uuid = update.status.uuid.clone();
        let _ = self.messages.send(ManagerMessage::UpdateOperationStatus {
            provider_id: id.to_owned(),
            update,
        });
        if let Some(view) = became_terminal {
            self.notify(&key, &Ok(view));
        }
        let acknowledge = status_uuid.is_some()
            && self
                .acks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
        if let (true, Some(status_uuid)) = (acknowledge, status_uuid)
            && let Err(error) = self.acknowledge(id, &operation_uuid, status_uuid)
        {
            tracing::warn!(provider = %id, error = %DisplayChain(&error), "acknowledging an operation status failed");
        }
    }

    /// The master's acknowledgement as the agent handles it (spec §2.9 step 7, Mesos
    /// `Slave::operationStatusAcknowledgement`). The master's record of an operation the
    /// agent forgot ends with the acknowledgement of its terminal status. The agent looks
    /// the operation up in its table: one it does not track (never applied through it,
    /// forgotten by an `UPDATE_STATE`, or removed by an earlier acknowledgement) drops the
    /// acknowledgement with a warning, so the provider gets nothing and keeps retrying
    /// until an `UPDATE_STATE` brings the operation back, as with Mesos. A tracked one is
    /// forwarded to the provider and, if its last status is terminal, leaves the table
    /// (even if the provider could not be reached: its next `UPDATE_STATE` brings it
    /// back, as on the agent).
    pub(super) fn acknowledge(
        &mut self,
        id: &str,
        operation_uuid: &ProtoUuid,
        status_uuid: ProtoUuid,
    ) -> Result<(), SendEventError> {
        let key = &operation_uuid.value;
        if self.orphans.get(key).is_some_and(|orphan| {
            orphan.provider_id == id && is_terminal(orphan.view.latest_status.state)
        }) && let Some(orphan) = self.orphans.remove(key)
        {
            self.completed.insert(key.clone(), &orphan.view);
        }
        let tracked = self
            .agents
            .get(id)
            .is_some_and(|agent| agent.operations.contains_key(key));
        if !tracked {
            tracing::warn!(
                provider = %id,
                operation = %display_uuid(operation_uuid),
                status = %display_uuid(&status_uuid),
                "dropping operation status acknowledgement: the agent does not track the operation",
            );
            return Ok(());
        }
        let event = Event {
            r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
            acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
                status_uuid,
                operation_uuid: operation_uuid.clone(),
            }),
            ..Event::default()
        };
        let sent = self.send_event(id, event);
        if let Some(agent) = self.agents.get_mut(id) {
            let terminal = agent
                .operations
                .get(key)
                .and_then(|record| record.statuses.last())
                .is_some_and(|status| is_terminal(status.state));
            if terminal && let Some(view) = agent.operations.remove(key) {
                self.completed.insert(key.clone(), &view);
            }
        }
        sent
    }

    /// As the agent (spec §2.9 steps 1–3): validate as the master, record PENDING, apply
    /// a speculative conversion at once, then send APPLY_OPERATION.
    pub(super) fn apply_operation(
        &mut self,
        id: &str,
        request: ApplyRequest,
    ) -> Result<Uuid, OperationError> {
        let Some(sub) = self.subscribed.get(id) else {
            return Err(OperationError::NotSubscribed { id: id.to_owned() });
        };
        let version = match request.resource_version {
            Some(version) => version,
            None => sub
                .resource_version_uuid
                .clone()
                .ok_or_else(|| OperationError::NoResourceVersion { id: id.to_owned() })?,
        };
        let uuid = request.operation_uuid.unwrap_or_else(Uuid::new_v4);
        let key = uuid.as_bytes().to_vec();
        let info = request.info;
        let agent = self.agents.entry(id.to_owned()).or_default();
        // A uuid the agent already tracks is sent again unchanged (tests of the
        // provider's duplicate handling); it is not recorded or applied twice.
        if !agent.operations.contains_key(&key) {
            let invalid = |reason| OperationError::Invalid { reason };
            // A master never offers what a pending disk operation consumes: validate
            // against the total without it (the agent's total keeps it until FINISHED).
            let held = || {
                agent
                    .operations
                    .values()
                    .filter(|op| !is_terminal(op.latest_status.state))
                    .filter_map(|op| op.info.as_ref().and_then(resources::disk_source))
            };
            let consumed = if resources::is_speculative(&info) {
                let conversions = resources::speculative_conversions(&info).map_err(invalid)?;
                let consumed: Vec<Resource> = conversions
                    .iter()
                    .flat_map(|(consumed, _)| consumed.iter().cloned())
                    .collect();
                Some((consumed, Some(conversions)))
            } else {
                resources::disk_consumed(&info).map(|consumed| (consumed, None))
            };
            if let Some((consumed, conversions)) = consumed {
                // Checked on the sum, so the total is copied only for the message. Only
                // what pending operations hold of the same resources matters: the rest of
                // `held` was checked when those operations were applied, and weighing it
                // again made every apply cost pending operations × the total.
                let mut wanted = resources::unallocated(
                    &held()
                        .filter(|h| {
                            consumed
                                .iter()
                                .any(|c| resources::related_unallocated(h, c))
                        })
                        .cloned()
                        .collect::<Vec<_>>(),
                );
                wanted.extend_from_slice(&consumed);
                if !resources::contains(&agent.total, &wanted) {
                    let held = resources::unallocated(&held().cloned().collect::<Vec<_>>());
                    let mut offered = agent.total.clone();
                    resources::apply(&mut offered, &[(held, Vec::new())]).map_err(invalid)?;
                    return Err(invalid(format!(
                        "{} does not contain {}",
                        resources::describe(offered.iter()),
                        resources::describe(&consumed)
                    )));
                }
                if let Some(conversions) = conversions {
                    resources::apply(&mut agent.total, &conversions).map_err(invalid)?;
                }
            }
            let pending = OperationStatus {
                state: OperationState::OperationPending as i32,
                operation_id: info.id.clone(),
                agent_id: Some(self.agent_id.clone()),
                resource_provider_id: Some(provider_id(id)),
                ..OperationStatus::default()
            };
            agent.operations.insert(
                key,
                OperationView {
                    operation_uuid: proto_uuid(uuid),
                    framework_id: request.framework_id.clone(),
                    info: Some(info.clone()),
                    latest_status: pending,
                    statuses: Vec::new(),
                },
            );
        }
        if request.deliver {
            let event = Event {
                r#type: Some(event::Type::ApplyOperation as i32),
                apply_operation: Some(event::ApplyOperation {
                    framework_id: request.framework_id,
                    info,
                    operation_uuid: proto_uuid(uuid),
                    resource_version_uuid: version,
                }),
                ..Event::default()
            };
            self.send_event(id, event).map_err(OperationError::Send)?;
        }
        Ok(uuid)
    }

    pub(super) fn wait_terminal(&mut self, operation: Uuid, reply: Waiter) {
        let key = operation.as_bytes().to_vec();
        let tracked = self
            .agents
            .values()
            .find_map(|agent| agent.operations.get(&key))
            .or_else(|| self.orphans.get(&key).map(|orphan| &orphan.view));
        match tracked {
            Some(view) if is_terminal(view.latest_status.state) => {
                let _ = reply.send(Ok(view.clone()));
            }
            Some(_) => {
                let waiters = self.waiters.entry(key).or_default();
                // Waiters that timed out are gone; do not keep their senders.
                waiters.retain(|waiter| !waiter.is_closed());
                waiters.push(reply);
            }
            None => {
                let _ = reply.send(
                    self.completed
                        .views
                        .get(&key)
                        .and_then(CompactView::view)
                        .ok_or(OperationError::Unknown { uuid: operation }),
                );
            }
        }
    }

    pub(super) fn notify(&mut self, key: &[u8], result: &Result<OperationView, OperationError>) {
        for waiter in self.waiters.remove(key).unwrap_or_default() {
            let _ = waiter.send(result.clone());
        }
    }
}

fn display_uuid(uuid: &ProtoUuid) -> String {
    Uuid::from_slice(&uuid.value).map_or_else(|_| format!("{:?}", uuid.value), |u| u.to_string())
}

/// `total − consumed + converted` of a FINISHED non-speculative operation, allocation
/// info stripped from both (Mesos `Slave::apply`). Err: why it cannot be applied.
fn apply_finished(
    total: &mut resources::Total,
    info: &offer::Operation,
    latest: &OperationStatus,
) -> Result<(), String> {
    let consumed = resources::disk_consumed(info).ok_or_else(|| {
        let kind = resources::kind(info).map_or("UNKNOWN", |kind| kind.as_str_name());
        format!("the agent has no conversion for a finished {kind} operation")
    })?;
    let converted = resources::unallocated(&latest.converted_resources);
    resources::apply(total, &[(consumed, converted)])
}

/// The master's check of an operation whose record just became terminal: a
/// FINISHED CREATE_DISK or DESTROY_DISK converts the framework's allocation
/// (`Master::updateOperation` → `HierarchicalAllocatorProcess::updateAllocation`), which
/// aborts the master unless the conversion keeps its scalar quantities or converts what
/// it consumed into nothing (MESOS-8825, [`resources::check_quantities`]). Speculative
/// operations are not checked: the master applied their conversion (its own, from the
/// operation) when it accepted them, and ignores what the provider reports.
fn allocation_violation(view: &OperationView) -> Option<String> {
    let info = view.info.as_ref()?;
    let finished = view.latest_status.state == OperationState::OperationFinished as i32;
    if !finished || resources::is_speculative(info) {
        return None;
    }
    let consumed = resources::disk_consumed(info)?;
    let reason =
        resources::check_quantities(&consumed, &view.latest_status.converted_resources).err()?;
    let kind = resources::kind(info).map_or("UNKNOWN", |kind| kind.as_str_name());
    Some(format!(
        "FINISHED {kind} operation {}: {reason}; a conversion must keep its scalar quantities \
         or convert what it consumes into nothing (a Mesos master's allocator aborts on this, \
         MESOS-8825)",
        display_uuid(&view.operation_uuid)
    ))
}

/// Appends `status` unless one with the same status UUID is already recorded (retried
/// updates are harmless, as on the agent).
fn push_dedup(statuses: &mut Vec<OperationStatus>, status: &OperationStatus) {
    let seen = status.uuid.is_some() && statuses.iter().any(|known| known.uuid == status.uuid);
    if !seen {
        statuses.push(status.clone());
    }
}
