//! The provider's session as the agent holds it: admission, the calls of the current
//! subscription, the event stream and what closes it (disconnection, removal), the
//! resource publishes it carries, and the reports to observers. It is separate from the
//! operation bookkeeping, which outlives a subscription and only sends through it.

use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{OperationState, Resource, ResourceProviderInfo};
use slrp_types::DisplayChain;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    CallReply, Command, ManagerMessage, NewStream, OperationView, PendingPublish, PublishWaiters,
    SubscribedProvider, Subscription, Worker, is_terminal, proto_uuid, provider_id,
};
use crate::error::{PublishError, RegistrarError, SendEventError};
use crate::registrar::ProviderRecord;
use crate::validation::{call_type, validate};

impl Worker {
    /// Admission (spec §2.7). The HTTP response has already been sent; an inadmissible
    /// provider's stream is closed by dropping `stream` here, without any event.
    pub(super) async fn subscribe(
        &mut self,
        mut info: ResourceProviderInfo,
        stream: NewStream,
        cancel: &CancellationToken,
    ) {
        let id = match &info.id {
            None => {
                let id = Uuid::new_v4().to_string();
                let record = ProviderRecord {
                    id: id.clone(),
                    kind: info.r#type.clone(),
                    name: info.name.clone(),
                };
                if let Err(error) = self.registrar.admit(record).await {
                    tracing::warn!(
                        provider = %id,
                        error = %DisplayChain(&error),
                        "not admitting resource provider",
                    );
                    return;
                }
                info.id = Some(provider_id(&id));
                id
            }
            Some(id) => {
                let matches = self
                    .registrar
                    .known(&id.value)
                    .is_some_and(|known| known.kind == info.r#type && known.name == info.name);
                if !matches {
                    tracing::warn!(
                        provider = %id.value,
                        r#type = %info.r#type,
                        name = %info.name,
                        "dropping resubscription: unknown resource provider ID or changed type/name",
                    );
                    return;
                }
                id.value.clone()
            }
        };

        if self.subscribed.contains_key(&id) {
            tracing::info!(provider = %id, "resubscription replaces the existing subscription");
            self.forget(&id);
        }
        self.metrics.subscribed.inc();
        self.metrics.subscribes.inc();
        tracing::info!(provider = %id, stream_id = %stream.stream_id, "resource provider subscribed");

        let NewStream {
            stream_id,
            content_type,
            frames,
            closed,
        } = stream;
        self.subscribed.insert(
            id.clone(),
            Subscription {
                info: info.clone(),
                stream_id,
                content_type,
                frames,
                resources: Vec::new(),
                resource_version_uuid: None,
            },
        );
        // A new subscription starts with no resources until its UPDATE_STATE, as a new
        // provider object on the agent; the operations stay (the next UPDATE_STATE
        // reconciles them), so waiters survive a provider restart.
        self.agents.entry(id.clone()).or_default().total.clear();
        let watcher_tx = self.self_tx.clone();
        let watcher_cancel = cancel.clone();
        let watched_id = id.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = closed => {
                    let _ = watcher_tx
                        .send(Command::StreamClosed { id: watched_id, stream_id })
                        .await;
                }
                () = watcher_cancel.cancelled() => {}
            }
        });

        let subscribed = Event {
            r#type: Some(event::Type::Subscribed as i32),
            subscribed: Some(event::Subscribed {
                provider_id: provider_id(&id),
            }),
            ..Event::default()
        };
        if self.send(&id, &subscribed).is_ok() {
            let _ = self.messages.send(ManagerMessage::Subscribed { info });
        }
    }

    /// Spec §2.2 step 7 for a decoded, context-free-valid, non-SUBSCRIBE call.
    pub(super) fn call(&mut self, call: Call, stream_id: Option<&str>) -> CallReply {
        let id = call
            .resource_provider_id
            .as_ref()
            .map(|id| id.value.clone())
            .unwrap_or_default();
        let Some(sub) = self.subscribed.get(&id) else {
            return CallReply::BadRequest("Resource provider is not subscribed".to_owned());
        };
        if let Err(reason) = validate(&call, sub.info.id.as_ref()) {
            return CallReply::BadRequest(format!("Inconsistent call: {reason}"));
        }
        let Some(stream_id) = stream_id else {
            return CallReply::BadRequest(
                "All non-subscribe calls should include to 'Mesos-Stream-Id' header".to_owned(),
            );
        };
        if stream_id != sub.stream_id.to_string() {
            // The double space is Mesos's.
            return CallReply::BadRequest(format!(
                "The stream ID '{stream_id}' included in this request didn't match the stream ID \
                 currently associated with  resource provider ID {id}"
            ));
        }
        match (call_type(&call), call) {
            (
                Some(call::Type::UpdateState),
                Call {
                    update_state: Some(update),
                    ..
                },
            ) => self.update_state(&id, update),
            (
                Some(call::Type::UpdateOperationStatus),
                Call {
                    update_operation_status: Some(update),
                    ..
                },
            ) => self.update_operation_status(&id, update),
            (
                Some(call::Type::UpdatePublishResourcesStatus),
                Call {
                    update_publish_resources_status: Some(update),
                    ..
                },
            ) => self.update_publish_status(&id, &update),
            // UNKNOWN; SUBSCRIBE never reaches the worker through this path and every
            // payload is present after validation.
            _ => return CallReply::NotImplemented,
        }
        CallReply::Accepted
    }

    /// Something a Mesos agent accepts with `202` and then aborts on: logged, counted
    /// and reported; the manager goes on.
    pub(super) fn violation(&self, id: &str, reason: String) {
        tracing::error!(provider = %id, %reason, "protocol violation");
        self.metrics.violations.inc();
        let _ = self.messages.send(ManagerMessage::ProtocolViolation {
            provider_id: id.to_owned(),
            reason,
        });
    }

    fn update_publish_status(&mut self, id: &str, update: &call::UpdatePublishResourcesStatus) {
        let uuid = Uuid::from_slice(&update.uuid.value).ok();
        let known = uuid.filter(|uuid| {
            self.publishes
                .get(uuid)
                .is_some_and(|pending| pending.provider_id == id)
        });
        let Some(pending) = known.and_then(|uuid| self.publishes.remove(&uuid)) else {
            tracing::warn!(
                provider = %id,
                uuid = ?update.uuid.value,
                "ignoring UPDATE_PUBLISH_RESOURCES_STATUS with an unknown UUID",
            );
            return;
        };
        let status = call::update_publish_resources_status::Status::try_from(update.status)
            .unwrap_or(call::update_publish_resources_status::Status::Unknown);
        let result = match status {
            call::update_publish_resources_status::Status::Ok => Ok(()),
            other => Err(PublishError::Failed {
                id: id.to_owned(),
                status: other.as_str_name(),
            }),
        };
        let _ = pending.reply.send(result);
    }

    pub(super) fn providers(&self) -> Vec<SubscribedProvider> {
        let mut views: Vec<SubscribedProvider> = self
            .subscribed
            .iter()
            .map(|(id, sub)| {
                let mut operations: Vec<OperationView> = self
                    .agents
                    .get(id)
                    .map(|agent| agent.operations.values().cloned().collect())
                    .unwrap_or_default();
                operations.sort_by(|a, b| a.operation_uuid.value.cmp(&b.operation_uuid.value));
                SubscribedProvider {
                    info: sub.info.clone(),
                    stream_id: sub.stream_id,
                    resources: sub.resources.clone(),
                    resource_version_uuid: sub.resource_version_uuid.clone(),
                    operations,
                }
            })
            .collect();
        views.sort_by(|a, b| {
            let key = |view: &SubscribedProvider| view.info.id.as_ref().map(|id| id.value.clone());
            key(a).cmp(&key(b))
        });
        views
    }

    /// The operation-flow events the embedding code may send (the others are the
    /// manager's own: SUBSCRIBED, PUBLISH_RESOURCES, TEARDOWN).
    pub(super) fn send_event(&mut self, id: &str, event: Event) -> Result<(), SendEventError> {
        let kind = event.r#type.and_then(|raw| event::Type::try_from(raw).ok());
        let present = match kind {
            Some(event::Type::ApplyOperation) => event
                .apply_operation
                .is_some()
                .then_some(())
                .ok_or(("APPLY_OPERATION", "apply_operation")),
            Some(event::Type::AcknowledgeOperationStatus) => event
                .acknowledge_operation_status
                .is_some()
                .then_some(())
                .ok_or((
                    "ACKNOWLEDGE_OPERATION_STATUS",
                    "acknowledge_operation_status",
                )),
            Some(event::Type::ReconcileOperations) => event
                .reconcile_operations
                .is_some()
                .then_some(())
                .ok_or(("RECONCILE_OPERATIONS", "reconcile_operations")),
            other => {
                return Err(SendEventError::NotAllowed {
                    event_type: other.map_or_else(
                        || format!("{:?}", event.r#type),
                        |kind| kind.as_str_name().to_owned(),
                    ),
                });
            }
        };
        if let Err((event_type, field)) = present {
            return Err(SendEventError::MissingPayload { event_type, field });
        }
        if !self.subscribed.contains_key(id) {
            return Err(SendEventError::NotSubscribed { id: id.to_owned() });
        }
        self.send(id, &event)
            .map_err(|reason| SendEventError::Disconnected {
                id: id.to_owned(),
                reason,
            })
    }

    /// Mesos `publishResources`: one PUBLISH_RESOURCES per provider involved; resources
    /// without a provider ID are the agent's own and need no publishing.
    pub(super) fn publish(
        &mut self,
        resources: Vec<Resource>,
    ) -> Result<PublishWaiters, PublishError> {
        let mut groups: Vec<(String, Vec<Resource>)> = Vec::new();
        for resource in resources {
            let Some(id) = resource.provider_id.as_ref().map(|id| id.value.clone()) else {
                continue;
            };
            if !self.subscribed.contains_key(&id) {
                return Err(PublishError::NotSubscribed { id });
            }
            match groups.iter_mut().find(|(group, _)| *group == id) {
                Some((_, group)) => group.push(resource),
                None => groups.push((id, vec![resource])),
            }
        }
        let mut waiters = Vec::with_capacity(groups.len());
        for (id, resources) in groups {
            let uuid = Uuid::new_v4();
            let event = Event {
                r#type: Some(event::Type::PublishResources as i32),
                publish_resources: Some(event::PublishResources {
                    uuid: proto_uuid(uuid),
                    resources,
                }),
                ..Event::default()
            };
            tracing::info!(provider = %id, %uuid, "sending PUBLISH_RESOURCES");
            if self.send(&id, &event).is_err() {
                return Err(PublishError::ConnectionClosed { id });
            }
            let (reply, waiter) = oneshot::channel();
            self.publishes.insert(
                uuid,
                PendingPublish {
                    provider_id: id,
                    reply,
                },
            );
            waiters.push(waiter);
        }
        Ok(waiters)
    }

    /// Mesos `removeResourceProvider` (MARK_RESOURCE_PROVIDER_GONE, spec §2.12).
    pub(super) async fn remove(&mut self, id: &str) -> Result<(), RegistrarError> {
        self.registrar.remove(id).await?;
        if self.subscribed.contains_key(id) {
            let teardown = Event {
                r#type: Some(event::Type::Teardown as i32),
                ..Event::default()
            };
            // Best effort, as in Mesos; the stream closes right after the event.
            let _ = self.send(id, &teardown);
            self.forget(id);
        }
        // The agent turns every non-terminal operation of a removed provider into
        // OPERATION_GONE_BY_OPERATOR and forgets them all.
        for (key, mut view) in self
            .agents
            .remove(id)
            .map(|a| a.operations)
            .unwrap_or_default()
        {
            if !is_terminal(view.latest_status.state) {
                view.latest_status.state = OperationState::OperationGoneByOperator as i32;
                self.notify(&key, &Ok(view));
            }
        }
        let orphans: Vec<Vec<u8>> = self
            .orphans
            .iter()
            .filter(|(_, orphan)| orphan.provider_id == id)
            .map(|(key, _)| key.clone())
            .collect();
        for key in orphans {
            if let Some(mut orphan) = self.orphans.remove(&key) {
                orphan.view.latest_status.state = OperationState::OperationGoneByOperator as i32;
                self.notify(&key, &Ok(orphan.view));
            }
        }
        tracing::info!(provider = %id, "resource provider removed");
        let _ = self.messages.send(ManagerMessage::Removed {
            provider_id: id.to_owned(),
        });
        Ok(())
    }

    /// Queues an event on the provider's stream. A full queue means the provider does not
    /// read its stream; it is disconnected rather than buffered without bound.
    pub(super) fn send(&mut self, id: &str, event: &Event) -> Result<(), &'static str> {
        let Some(sub) = self.subscribed.get(id) else {
            return Err("not subscribed");
        };
        let payload = match slrp_wire::encode(sub.content_type, event) {
            Ok(payload) => payload,
            Err(error) => {
                tracing::error!(provider = %id, error = %DisplayChain(&error), "encoding an event failed");
                return Err("encoding the event failed");
            }
        };
        let reason = match sub
            .frames
            .try_send(slrp_wire::recordio::encode_record(&payload))
        {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => "its event queue is full",
            Err(mpsc::error::TrySendError::Closed(_)) => "its stream is closed",
        };
        tracing::warn!(provider = %id, reason, "disconnecting resource provider");
        self.disconnect(id);
        Err(reason)
    }

    pub(super) fn disconnect(&mut self, id: &str) {
        if self.forget(id) {
            self.metrics.disconnects.inc();
            let _ = self.messages.send(ManagerMessage::Disconnected {
                provider_id: id.to_owned(),
            });
        }
    }

    /// Drops the subscription (closing its stream) and fails its pending publishes.
    pub(super) fn forget(&mut self, id: &str) -> bool {
        if self.subscribed.remove(id).is_none() {
            return false;
        }
        self.metrics.subscribed.dec();
        let failed: Vec<Uuid> = self
            .publishes
            .iter()
            .filter(|(_, pending)| pending.provider_id == id)
            .map(|(uuid, _)| *uuid)
            .collect();
        for uuid in failed {
            if let Some(pending) = self.publishes.remove(&uuid) {
                let _ = pending
                    .reply
                    .send(Err(PublishError::ConnectionClosed { id: id.to_owned() }));
            }
        }
        true
    }
}
