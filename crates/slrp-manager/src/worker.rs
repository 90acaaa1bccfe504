//! The manager's worker: owns the registrar, the subscriptions and the agent-side
//! bookkeeping, and processes the calls the HTTP layer has decoded (spec §2.2 step 7,
//! §2.7–§2.12).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{
    AgentId, FrameworkId, Operation, OperationState, OperationStatus, Resource, ResourceProviderId,
    ResourceProviderInfo, Uuid as ProtoUuid, offer,
};
use slrp_types::DisplayChain;
use slrp_wire::ContentType;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::ApplyRequest;
use crate::config::AckPolicy;
use crate::error::{OperationError, PublishError, RegistrarError, SendEventError};
use crate::metrics::ManagerMetrics;
use crate::registrar::{ProviderRecord, Registrar};
use crate::resources;
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
    /// `provider_id` is empty for an operator API call that would abort an agent
    /// (REMOVE_CONTAINER of a top-level container).
    ProtocolViolation {
        /// The provider ID.
        provider_id: String,
        /// What was wrong.
        reason: String,
    },
    /// A standalone container was launched (LAUNCH_CONTAINER answered `200`).
    ContainerLaunched {
        /// The container ID.
        id: String,
    },
    /// A standalone container's process exited and the rest of its process group was
    /// killed; the WAITs for it are answered.
    ContainerTerminated {
        /// The container ID.
        id: String,
        /// The wait(2) status word; `None` for a container adopted after a restart.
        status: Option<i32>,
    },
}

/// The agent's view of one subscribed provider.
#[derive(Debug, Clone)]
pub struct SubscribedProvider {
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

/// Terminal operations removed from the agent's table that
/// [`crate::ManagerHandle::wait_terminal`] still answers for (a waiter that asks after
/// the acknowledgement removed the operation). Bounded: the oldest are forgotten.
const COMPLETED_KEPT: usize = 4096;

/// Mesos `protobuf::isTerminalState`.
pub(crate) use slrp_types::is_terminal_state as is_terminal;

/// The master's acknowledgement policy, shared with the handle so that
/// [`crate::ManagerHandle::set_ack_policy`] needs no round trip.
#[derive(Debug)]
pub(crate) struct AckState {
    policy: AckPolicy,
    /// For `DropFirst`: how many more updates to ignore.
    to_drop: usize,
}

impl AckState {
    pub(crate) fn new(policy: AckPolicy) -> Self {
        let mut state = Self {
            policy: AckPolicy::Auto,
            to_drop: 0,
        };
        state.set(policy);
        state
    }

    pub(crate) fn set(&mut self, policy: AckPolicy) {
        self.policy = policy;
        self.to_drop = match policy {
            AckPolicy::DropFirst(n) => n,
            AckPolicy::Auto | AckPolicy::Manual => 0,
        };
    }

    /// Whether the master acknowledges the next update carrying a status UUID.
    fn take(&mut self) -> bool {
        match self.policy {
            AckPolicy::Auto => true,
            AckPolicy::Manual => false,
            AckPolicy::DropFirst(_) if self.to_drop > 0 => {
                self.to_drop -= 1;
                false
            }
            AckPolicy::DropFirst(_) => true,
        }
    }
}

pub(crate) type SharedAcks = Arc<Mutex<AckState>>;

type Waiter = oneshot::Sender<Result<OperationView, OperationError>>;

/// What the agent keeps of a provider across its subscriptions: its total with the
/// agent's own applications, and its operations.
#[derive(Default)]
struct AgentProvider {
    total: resources::Total,
    operations: HashMap<Vec<u8>, OperationView>,
}

/// Bounded memory of operations removed from the agent's table after their terminal
/// acknowledgement.
#[derive(Default)]
struct Completed {
    order: VecDeque<Vec<u8>>,
    views: HashMap<Vec<u8>, CompactView>,
}

/// An [`OperationView`] kept protobuf-encoded: a view holds an `offer::Operation` inline
/// (about 7.5 KB however little it contains) and statuses with their resources, so the
/// 4,096 kept views took about 60 MB; encoded, a few hundred bytes each.
struct CompactView {
    operation_uuid: ProtoUuid,
    framework_id: Option<FrameworkId>,
    info: Option<Vec<u8>>,
    latest_status: Vec<u8>,
    statuses: Vec<Vec<u8>>,
}

impl CompactView {
    fn new(view: &OperationView) -> Self {
        use prost::Message as _;
        Self {
            operation_uuid: view.operation_uuid.clone(),
            framework_id: view.framework_id.clone(),
            info: view.info.as_ref().map(|info| info.encode_to_vec()),
            latest_status: view.latest_status.encode_to_vec(),
            statuses: view.statuses.iter().map(|s| s.encode_to_vec()).collect(),
        }
    }

    /// The view again; `None` only if the encoding did not decode (it always does: it is
    /// prost's own).
    fn view(&self) -> Option<OperationView> {
        use prost::Message as _;
        let info = match &self.info {
            Some(bytes) => Some(offer::Operation::decode(bytes.as_slice()).ok()?),
            None => None,
        };
        let statuses = self
            .statuses
            .iter()
            .map(|bytes| OperationStatus::decode(bytes.as_slice()).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(OperationView {
            operation_uuid: self.operation_uuid.clone(),
            framework_id: self.framework_id.clone(),
            info,
            latest_status: OperationStatus::decode(self.latest_status.as_slice()).ok()?,
            statuses,
        })
    }
}

impl Completed {
    fn insert(&mut self, key: Vec<u8>, view: &OperationView) {
        if self
            .views
            .insert(key.clone(), CompactView::new(view))
            .is_none()
        {
            self.order.push_back(key);
        }
        while self.order.len() > COMPLETED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.views.remove(&old);
            }
        }
    }
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
        reply: oneshot::Sender<Vec<SubscribedProvider>>,
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
    Apply {
        id: String,
        request: Box<ApplyRequest>,
        reply: oneshot::Sender<Result<Uuid, OperationError>>,
    },
    Acknowledge {
        id: String,
        operation: Uuid,
        status: Uuid,
        reply: oneshot::Sender<Result<(), SendEventError>>,
    },
    WaitTerminal {
        operation: Uuid,
        reply: Waiter,
    },
    AgentTotal {
        id: String,
        reply: oneshot::Sender<Option<Vec<Resource>>>,
    },
}

struct Subscription {
    info: ResourceProviderInfo,
    stream_id: Uuid,
    content_type: ContentType,
    frames: mpsc::Sender<Bytes>,
    resources: Vec<Resource>,
    resource_version_uuid: Option<ProtoUuid>,
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
    pub(crate) acks: SharedAcks,
    agent_id: AgentId,
    subscribed: HashMap<String, Subscription>,
    agents: HashMap<String, AgentProvider>,
    waiters: HashMap<Vec<u8>, Vec<Waiter>>,
    completed: Completed,
    /// The master's record of operations the agent's table dropped while they were not
    /// terminal (absent from an `UPDATE_STATE`), by operation UUID. The agent forgets
    /// them as Mesos's does; the master asks the provider about them (Mesos's TODO in
    /// `Slave::handleResourceProviderMessage`: "send a `Reconcile` message") and keeps
    /// them until the answer: the provider's own status (it had the operation after
    /// all) or its unreliable DROPPED "Unknown operation".
    orphans: HashMap<Vec<u8>, Orphan>,
    publishes: HashMap<Uuid, PendingPublish>,
}

/// An operation the agent forgot and the master still waits a status for.
struct Orphan {
    /// The provider it was applied to.
    provider_id: String,
    view: OperationView,
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
        acks: SharedAcks,
    ) -> Self {
        let agent_id = AgentId {
            value: registrar.agent_id().to_owned(),
        };
        Self {
            commands,
            self_tx,
            registrar,
            messages,
            metrics,
            tasks,
            acks,
            agent_id,
            subscribed: HashMap::new(),
            agents: HashMap::new(),
            waiters: HashMap::new(),
            completed: Completed::default(),
            orphans: HashMap::new(),
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
            Command::Apply { id, request, reply } => {
                let _ = reply.send(self.apply_operation(&id, *request));
            }
            Command::Acknowledge {
                id,
                operation,
                status,
                reply,
            } => {
                let _ =
                    reply.send(self.acknowledge(&id, &proto_uuid(operation), proto_uuid(status)));
            }
            Command::WaitTerminal { operation, reply } => self.wait_terminal(operation, reply),
            Command::AgentTotal { id, reply } => {
                let total = self.subscribed.contains_key(&id).then(|| {
                    self.agents
                        .get(&id)
                        .map(|a| a.total.to_vec())
                        .unwrap_or_default()
                });
                let _ = reply.send(total);
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

    /// The agent's `UPDATE_STATE` handling (spec §2.8, Mesos
    /// `handleResourceProviderMessage`): replace the total, reconcile the operation table,
    /// store the version.
    fn update_state(&mut self, id: &str, update: call::UpdateState) {
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
    fn update_operation_status(&mut self, id: &str, mut update: call::UpdateOperationStatus) {
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
    fn acknowledge(
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
    fn apply_operation(&mut self, id: &str, request: ApplyRequest) -> Result<Uuid, OperationError> {
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

    fn wait_terminal(&mut self, operation: Uuid, reply: Waiter) {
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

    fn notify(&mut self, key: &[u8], result: &Result<OperationView, OperationError>) {
        for waiter in self.waiters.remove(key).unwrap_or_default() {
            let _ = waiter.send(result.clone());
        }
    }

    /// Something a Mesos agent accepts with `202` and then aborts on: logged, counted
    /// and reported; the manager goes on.
    fn violation(&self, id: &str, reason: String) {
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

    fn providers(&self) -> Vec<SubscribedProvider> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_view_is_kept_encoded_and_answered_as_it_was() {
        let status = OperationStatus {
            state: OperationState::OperationFinished as i32,
            message: Some("done".to_owned()),
            converted_resources: vec![Resource {
                name: "disk".to_owned(),
                ..Resource::default()
            }],
            uuid: Some(proto_uuid(Uuid::new_v4())),
            ..OperationStatus::default()
        };
        let view = OperationView {
            operation_uuid: proto_uuid(Uuid::new_v4()),
            framework_id: Some(FrameworkId {
                value: "framework".to_owned(),
            }),
            info: Some(offer::Operation {
                r#type: Some(offer::operation::Type::CreateDisk as i32),
                ..offer::Operation::default()
            }),
            latest_status: status.clone(),
            statuses: vec![status],
        };
        let mut completed = Completed::default();
        let key = view.operation_uuid.value.clone();
        completed.insert(key.clone(), &view);
        assert_eq!(completed.views[&key].view(), Some(view.clone()));
        let without_info = OperationView { info: None, ..view };
        assert_eq!(CompactView::new(&without_info).view(), Some(without_info));
    }

    #[test]
    fn completed_views_are_bounded_oldest_first() {
        let mut completed = Completed::default();
        let view = |n: usize| OperationView {
            operation_uuid: ProtoUuid {
                value: n.to_be_bytes().to_vec(),
            },
            framework_id: None,
            info: None,
            latest_status: OperationStatus::default(),
            statuses: Vec::new(),
        };
        for n in 0..=COMPLETED_KEPT {
            let v = view(n);
            completed.insert(v.operation_uuid.value.clone(), &v);
        }
        assert_eq!(completed.views.len(), COMPLETED_KEPT);
        assert!(
            !completed
                .views
                .contains_key(0usize.to_be_bytes().as_slice())
        );
    }
}
