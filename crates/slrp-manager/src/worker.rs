//! The manager's worker: owns the registrar, the subscriptions and the agent-side
//! bookkeeping, and processes the calls the HTTP layer has decoded (spec §2.2 step 7,
//! §2.7–§2.12).

use std::collections::HashMap;

use bytes::Bytes;
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{
    FrameworkId, Operation, OperationStatus, Resource, ResourceProviderId, ResourceProviderInfo,
    Uuid as ProtoUuid, offer,
};
use slrp_types::DisplayChain;
use slrp_wire::ContentType;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::error::{PublishError, RegistrarError, SendEventError};
use crate::metrics::ManagerMetrics;
use crate::registrar::{ProviderRecord, Registrar};
use crate::validation::{call_type, validate};

/// What the manager observed, in the order it happened: the messages a Mesos manager
/// passes to its agent (`ResourceProviderMessage`), plus protocol violations that would
/// crash a real agent.
#[derive(Debug, Clone)]
pub enum ManagerMessage {
    /// A provider was admitted; `info.id` is set.
    Subscribed {
        /// The provider's info as it subscribed, with its ID.
        info: ResourceProviderInfo,
    },
    /// A provider reported its state.
    UpdateState {
        /// The provider ID.
        provider_id: String,
        /// Its complete total resources.
        resources: Vec<Resource>,
        /// The operations it tracks.
        operations: Vec<Operation>,
        /// The new resource version.
        resource_version_uuid: ProtoUuid,
    },
    /// A provider sent an operation status update.
    UpdateOperationStatus {
        /// The provider ID.
        provider_id: String,
        /// The update as received.
        update: call::UpdateOperationStatus,
    },
    /// A provider's stream closed (or it was disconnected for not reading it).
    Disconnected {
        /// The provider ID.
        provider_id: String,
    },
    /// A provider was removed through [`crate::ManagerHandle::remove_provider`].
    Removed {
        /// The provider ID.
        provider_id: String,
    },
    /// The provider sent something a Mesos agent accepts with `202` but then aborts on.
    ProtocolViolation {
        /// The provider ID.
        provider_id: String,
        /// What was wrong.
        reason: String,
    },
}

/// The agent's view of one subscribed provider.
#[derive(Debug, Clone)]
pub struct ProviderView {
    /// The provider's info, with its ID.
    pub info: ResourceProviderInfo,
    /// The current subscription's stream ID.
    pub stream_id: Uuid,
    /// The total resources from the latest `UPDATE_STATE` (empty before the first).
    pub resources: Vec<Resource>,
    /// The resource version from the latest `UPDATE_STATE`.
    pub resource_version_uuid: Option<ProtoUuid>,
    /// The operations the agent tracks for this provider, ordered by operation UUID.
    pub operations: Vec<OperationView>,
}

/// The agent's record of one operation of a provider.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationView {
    /// The operation UUID.
    pub operation_uuid: ProtoUuid,
    /// The framework, if any.
    pub framework_id: Option<FrameworkId>,
    /// The operation, when known from an `UPDATE_STATE`.
    pub info: Option<offer::Operation>,
    /// The newest status.
    pub latest_status: OperationStatus,
    /// Statuses received, deduplicated by status UUID.
    pub statuses: Vec<OperationStatus>,
}

pub(crate) struct NewStream {
    pub(crate) stream_id: Uuid,
    pub(crate) content_type: ContentType,
    pub(crate) frames: mpsc::Sender<Bytes>,
    /// Fails when the HTTP layer drops the response body, i.e. the stream closed.
    pub(crate) closed: oneshot::Receiver<()>,
}

pub(crate) enum CallReply {
    BadRequest(String),
    NotImplemented,
    Accepted,
}

type PublishWaiters = Vec<oneshot::Receiver<Result<(), PublishError>>>;

pub(crate) enum Command {
    Subscribe {
        info: Box<ResourceProviderInfo>,
        stream: NewStream,
    },
    Call {
        call: Box<Call>,
        stream_id: Option<String>,
        reply: oneshot::Sender<CallReply>,
    },
    StreamClosed {
        id: String,
        stream_id: Uuid,
    },
    Providers {
        reply: oneshot::Sender<Vec<ProviderView>>,
    },
    SendEvent {
        id: String,
        event: Box<Event>,
        reply: oneshot::Sender<Result<(), SendEventError>>,
    },
    Publish {
        resources: Vec<Resource>,
        reply: oneshot::Sender<Result<PublishWaiters, PublishError>>,
    },
    Remove {
        id: String,
        reply: oneshot::Sender<Result<(), RegistrarError>>,
    },
}

struct Subscription {
    info: ResourceProviderInfo,
    stream_id: Uuid,
    content_type: ContentType,
    frames: mpsc::Sender<Bytes>,
    resources: Vec<Resource>,
    resource_version_uuid: Option<ProtoUuid>,
    operations: HashMap<Vec<u8>, OperationView>,
}

struct PendingPublish {
    provider_id: String,
    reply: oneshot::Sender<Result<(), PublishError>>,
}

pub(crate) struct Worker {
    pub(crate) commands: mpsc::Receiver<Command>,
    pub(crate) self_tx: mpsc::Sender<Command>,
    pub(crate) registrar: Registrar,
    pub(crate) messages: broadcast::Sender<ManagerMessage>,
    pub(crate) metrics: ManagerMetrics,
    pub(crate) tasks: TaskTracker,
    subscribed: HashMap<String, Subscription>,
    publishes: HashMap<Uuid, PendingPublish>,
}

fn provider_id(id: &str) -> ResourceProviderId {
    ResourceProviderId {
        value: id.to_owned(),
    }
}

fn proto_uuid(uuid: Uuid) -> ProtoUuid {
    ProtoUuid {
        value: uuid.as_bytes().to_vec(),
    }
}

impl Worker {
    pub(crate) fn new(
        commands: mpsc::Receiver<Command>,
        self_tx: mpsc::Sender<Command>,
        registrar: Registrar,
        messages: broadcast::Sender<ManagerMessage>,
        metrics: ManagerMetrics,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            commands,
            self_tx,
            registrar,
            messages,
            metrics,
            tasks,
            subscribed: HashMap::new(),
            publishes: HashMap::new(),
        }
    }

    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            let command = tokio::select! {
                () = cancel.cancelled() => break,
                command = self.commands.recv() => command,
            };
            let Some(command) = command else { break };
            self.handle(command, &cancel).await;
        }
        // Dropping the subscriptions closes every stream; pending publishes fail.
        let ids: Vec<String> = self.subscribed.keys().cloned().collect();
        for id in ids {
            self.forget(&id);
        }
    }

    async fn handle(&mut self, command: Command, cancel: &CancellationToken) {
        match command {
            Command::Subscribe { info, stream } => self.subscribe(*info, stream, cancel).await,
            Command::Call {
                call,
                stream_id,
                reply,
            } => {
                let _ = reply.send(self.call(*call, stream_id.as_deref()));
            }
            Command::StreamClosed { id, stream_id } => {
                if self
                    .subscribed
                    .get(&id)
                    .is_some_and(|sub| sub.stream_id == stream_id)
                {
                    tracing::info!(provider = %id, %stream_id, "resource provider disconnected");
                    self.disconnect(&id);
                }
            }
            Command::Providers { reply } => {
                let _ = reply.send(self.providers());
            }
            Command::SendEvent { id, event, reply } => {
                let _ = reply.send(self.send_event(&id, *event));
            }
            Command::Publish { resources, reply } => {
                let _ = reply.send(self.publish(resources));
            }
            Command::Remove { id, reply } => {
                let _ = reply.send(self.remove(&id).await);
            }
        }
    }

    /// Admission (spec §2.7). The HTTP response has already been sent; an inadmissible
    /// provider's stream is closed by dropping `stream` here, without any event.
    async fn subscribe(
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
                operations: HashMap::new(),
            },
        );
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
    fn call(&mut self, call: Call, stream_id: Option<&str>) -> CallReply {
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

    /// The agent's `UPDATE_STATE` handling (spec §2.8): replace the total, reconcile the
    /// operation table, store the version.
    fn update_state(&mut self, id: &str, update: call::UpdateState) {
        let Some(sub) = self.subscribed.get_mut(id) else {
            return;
        };
        let mut previous = std::mem::take(&mut sub.operations);
        for operation in &update.operations {
            let key = operation.uuid.value.clone();
            let mut statuses = previous
                .remove(&key)
                .map(|old| old.statuses)
                .unwrap_or_default();
            for status in &operation.statuses {
                push_dedup(&mut statuses, status);
            }
            sub.operations.insert(
                key,
                OperationView {
                    operation_uuid: operation.uuid.clone(),
                    framework_id: operation.framework_id.clone(),
                    info: Some(operation.info.clone()),
                    latest_status: operation.latest_status.clone(),
                    statuses,
                },
            );
        }
        sub.resources.clone_from(&update.resources);
        sub.resource_version_uuid = Some(update.resource_version_uuid.clone());
        let _ = self.messages.send(ManagerMessage::UpdateState {
            provider_id: id.to_owned(),
            resources: update.resources,
            operations: update.operations,
            resource_version_uuid: update.resource_version_uuid,
        });
    }

    /// The agent's bookkeeping of an operation status update (spec §2.9 step 5).
    fn update_operation_status(&mut self, id: &str, update: call::UpdateOperationStatus) {
        let Some(sub) = self.subscribed.get_mut(id) else {
            return;
        };
        if let Some(latest) = &update.latest_status
            && latest.resource_provider_id.as_ref() != sub.info.id.as_ref()
        {
            // Mesos CHECK-fails here after having answered 202.
            let reason = "'update_operation_status.latest_status.resource_provider_id' does not \
                          match the provider (a Mesos agent aborts on this)"
                .to_owned();
            tracing::error!(provider = %id, %reason, "protocol violation");
            let _ = self.messages.send(ManagerMessage::ProtocolViolation {
                provider_id: id.to_owned(),
                reason,
            });
        }
        let latest = update
            .latest_status
            .clone()
            .unwrap_or_else(|| update.status.clone());
        let record = sub
            .operations
            .entry(update.operation_uuid.value.clone())
            .or_insert_with(|| OperationView {
                operation_uuid: update.operation_uuid.clone(),
                framework_id: update.framework_id.clone(),
                info: None,
                latest_status: latest.clone(),
                statuses: Vec::new(),
            });
        record.latest_status = latest;
        if update.framework_id.is_some() {
            record.framework_id.clone_from(&update.framework_id);
        }
        push_dedup(&mut record.statuses, &update.status);
        let _ = self.messages.send(ManagerMessage::UpdateOperationStatus {
            provider_id: id.to_owned(),
            update,
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

    fn providers(&self) -> Vec<ProviderView> {
        let mut views: Vec<ProviderView> = self
            .subscribed
            .values()
            .map(|sub| {
                let mut operations: Vec<OperationView> = sub.operations.values().cloned().collect();
                operations.sort_by(|a, b| a.operation_uuid.value.cmp(&b.operation_uuid.value));
                ProviderView {
                    info: sub.info.clone(),
                    stream_id: sub.stream_id,
                    resources: sub.resources.clone(),
                    resource_version_uuid: sub.resource_version_uuid.clone(),
                    operations,
                }
            })
            .collect();
        views.sort_by(|a, b| {
            let key = |view: &ProviderView| view.info.id.as_ref().map(|id| id.value.clone());
            key(a).cmp(&key(b))
        });
        views
    }

    /// The operation-flow events the embedding code may send (the others are the
    /// manager's own: SUBSCRIBED, PUBLISH_RESOURCES, TEARDOWN).
    fn send_event(&mut self, id: &str, event: Event) -> Result<(), SendEventError> {
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
    fn publish(&mut self, resources: Vec<Resource>) -> Result<PublishWaiters, PublishError> {
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
    async fn remove(&mut self, id: &str) -> Result<(), RegistrarError> {
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
        tracing::info!(provider = %id, "resource provider removed");
        let _ = self.messages.send(ManagerMessage::Removed {
            provider_id: id.to_owned(),
        });
        Ok(())
    }

    /// Queues an event on the provider's stream. A full queue means the provider does not
    /// read its stream; it is disconnected rather than buffered without bound.
    fn send(&mut self, id: &str, event: &Event) -> Result<(), &'static str> {
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

    fn disconnect(&mut self, id: &str) {
        if self.forget(id) {
            self.metrics.disconnects.inc();
            let _ = self.messages.send(ManagerMessage::Disconnected {
                provider_id: id.to_owned(),
            });
        }
    }

    /// Drops the subscription (closing its stream) and fails its pending publishes.
    fn forget(&mut self, id: &str) -> bool {
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

/// Appends `status` unless one with the same status UUID is already recorded (retried
/// updates are harmless, as on the agent).
fn push_dedup(statuses: &mut Vec<OperationStatus>, status: &OperationStatus) {
    let seen = status.uuid.is_some() && statuses.iter().any(|known| known.uuid == status.uuid);
    if !seen {
        statuses.push(status.clone());
    }
}
