//! The manager's worker: owns the registrar, the subscriptions and the agent-side
//! bookkeeping, and processes the calls the HTTP layer has decoded (spec §2.2 step 7,
//! §2.7–§2.12).
//!
//! The worker's state and the commands it takes are declared here, so that its parts
//! (submodules, each an `impl Worker` block) see the fields without their visibility
//! being widened: [`session`] holds the provider's subscription and event stream,
//! [`operations`] the agent's and the master's operation bookkeeping, [`completed`] the
//! bounded memory of operations that left the agent's table.

mod completed;
mod operations;
mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call};
use slrp_proto::mesos::v1::{
    AgentId, FrameworkId, Operation, OperationStatus, Resource, ResourceProviderId,
    ResourceProviderInfo, Uuid as ProtoUuid, offer,
};
use slrp_wire::ContentType;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use self::completed::Completed;
use crate::ApplyRequest;
use crate::config::AckPolicy;
use crate::error::{OperationError, PublishError, RegistrarError, SendEventError};
use crate::metrics::ManagerMetrics;
use crate::registrar::Registrar;
use crate::resources;

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
}
