//! An embedded, strict Mesos resource provider manager.
//!
//! # Overview
//! This is the agent side of the Mesos v1 resource provider API (spec §2): it serves
//! `POST /slave(1)/api/v1/resource_provider` (and the unprefixed path libprocess also
//! routes) over HTTP/1.1 on a loopback TCP port or a unix socket, answers every call with
//! the status and body a Mesos 1.11 agent gives, admits providers through a registrar,
//! streams RecordIO events and keeps the agent's bookkeeping of each provider. A protocol
//! mistake of a provider fails here as it would on a real agent. It serves standalone mode
//! (the daemon without an agent) and the tests. See `docs/embedded-manager.md`.
//!
//! # Layout
//! - [`config`]: [`ManagerConfig`], validated at spawn.
//! - `server`: HTTP routing, media types, body limits, decoding (§2.2 steps 2–6).
//! - `operator`: the agent operator API subset (`GET_AGENT`, the standalone container
//!   calls) on the parent path.
//! - `containers`: standalone containers as local processes (a POSIX launcher).
//! - [`jwt`]: HS256 tokens of `--jwt_secret_key`.
//! - `worker`: admission, step 7, bookkeeping, publish, removal; owns all state.
//! - [`validation`]: Mesos's call validation (§2.6).
//! - [`registrar`]: durable record of admitted and removed provider IDs.
//! - [`metrics`]: Mesos-named metrics.
//! - `fuzzing` (hidden): the body decoding and validation of both APIs, for the fuzz
//!   targets of `crates/slrp-fuzz`.
//! - this file: [`EmbeddedManager::spawn`], [`ManagerHandle`], [`ManagerGuard`].
//!
//! # Invariants
//! - The worker owns every piece of state; the HTTP layer and the handle talk to it over a
//!   bounded channel.
//! - Every queue is bounded: request bodies (`413`), body read time (`408`), per-stream
//!   events (a provider that does not read is disconnected), observations (lagging
//!   subscribers lose messages, never the worker).

pub mod config;
mod containers;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod jwt;
pub mod metrics;
mod operator;
pub mod registrar;
mod resources;
mod server;
pub mod validation;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_proto::mesos::v1::resource_provider::{Event, event};
use slrp_proto::mesos::v1::{FrameworkId, Resource, Uuid as ProtoUuid, offer};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{AckPolicy, DEFAULT_MAX_BODY_BYTES, Listen, ManagerConfig, Secret};
pub use containers::{ContainerState, ContainerView, kill_recorded_containers};
pub use error::{
    ConfigError, ContainerError, ManagerError, OperationError, PublishError, RegistrarError,
    SendEventError,
};
pub use metrics::ManagerMetrics;
pub use operator::OPERATOR_PATHS;
pub use server::{ENDPOINT_PATHS, STREAM_ID_HEADER};
pub use worker::{ManagerMessage, OperationView, SubscribedProvider};

use crate::registrar::Registrar;
use crate::server::{Ctx, Listener};
use crate::worker::{AckState, Command, SharedAcks, Worker};

/// Commands queued towards the worker before senders wait.
const COMMAND_QUEUE: usize = 256;

/// Where a running manager can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The bound TCP address (with the real port when port 0 was configured).
    Tcp(SocketAddr),
    /// The unix socket path.
    Unix(PathBuf),
}

impl Endpoint {
    /// The agent operator API URL (the parent path of [`Endpoint::url`]); see
    /// [`Endpoint::url`] for the unix-socket form.
    #[must_use]
    pub fn operator_url(&self) -> String {
        self.url_of(OPERATOR_PATHS[0])
    }

    /// The resource provider API URL as a Mesos agent advertises it. A unix socket has no
    /// URL authority, so its URL uses `localhost` and the client must connect to the path.
    #[must_use]
    pub fn url(&self) -> String {
        self.url_of(ENDPOINT_PATHS[0])
    }

    fn url_of(&self, path: &str) -> String {
        match self {
            Self::Tcp(addr) => format!("http://{addr}{path}"),
            Self::Unix(_) => format!("http://localhost{path}"),
        }
    }
}

/// Entry point: see [`EmbeddedManager::spawn`].
#[derive(Debug)]
pub struct EmbeddedManager;

impl EmbeddedManager {
    /// Validates `config`, recovers the registrar, binds the endpoint and starts serving.
    /// Requests are served only once recovery is done, so nothing needs queueing.
    ///
    /// # Errors
    /// [`ManagerError`] for a bad configuration, an unreadable registry or a bind failure.
    pub async fn spawn(
        config: ManagerConfig,
        cancel: CancellationToken,
    ) -> Result<(ManagerHandle, ManagerGuard), ManagerError> {
        config.validate()?;
        let state_dir = config.state_dir.clone();
        let configured = config.agent_id.clone();
        let preadmitted = config.preadmitted.clone();
        let registrar = tokio::task::spawn_blocking(move || {
            let mut registrar = Registrar::recover(state_dir.as_deref(), configured.as_deref())?;
            registrar.preadmit(&preadmitted)?;
            Ok::<_, RegistrarError>(registrar)
        })
        .await
        .map_err(RegistrarError::Task)??;
        let agent_id = registrar.agent_id().to_owned();
        let (listener, endpoint) = bind(&config.listen).await?;
        let agent = operator::agent_info(&config.hostname, &agent_id, &endpoint);

        let cancel = cancel.child_token();
        let tasks = TaskTracker::new();
        let metrics = ManagerMetrics::default();
        let (messages, _) = broadcast::channel(config.message_buffer);
        let (commands, commands_rx) = mpsc::channel(COMMAND_QUEUE);
        let acks: SharedAcks = Arc::new(Mutex::new(AckState::new(config.ack_policy)));
        let worker = Worker::new(
            commands_rx,
            commands.clone(),
            registrar,
            messages.clone(),
            metrics.clone(),
            tasks.clone(),
            acks.clone(),
        );
        tasks.spawn(worker.run(cancel.clone()));
        let containers = match containers::start(
            config.containers_dir.clone(),
            messages.clone(),
            tasks.clone(),
            cancel.clone(),
        )
        .await
        {
            Ok(containers) => containers,
            Err(error) => {
                cancel.cancel();
                return Err(error.into());
            }
        };
        let ctx = Arc::new(Ctx {
            commands: commands.clone(),
            max_body_bytes: config.max_body_bytes,
            body_timeout: config.body_timeout,
            event_queue: config.event_queue,
            agent,
            token: config.token.clone(),
            jwt_secret: config.jwt_secret.clone(),
            containers: containers.clone(),
            metrics: metrics.clone(),
            messages: messages.clone(),
        });
        tasks.spawn(server::serve(listener, ctx, tasks.clone(), cancel.clone()));
        tracing::info!(url = %endpoint.url(), ?endpoint, %agent_id, "resource provider manager serving");
        Ok((
            ManagerHandle {
                commands,
                messages,
                metrics,
                endpoint,
                agent_id,
                acks,
                containers,
            },
            ManagerGuard { cancel, tasks },
        ))
    }
}

async fn bind(listen: &Listen) -> Result<(Listener, Endpoint), ManagerError> {
    match listen {
        Listen::Tcp(addr) => {
            let error = |source| ManagerError::Bind {
                endpoint: addr.to_string(),
                source,
            };
            let listener = TcpListener::bind(addr).await.map_err(error)?;
            let bound = listener.local_addr().map_err(error)?;
            Ok((Listener::Tcp(listener), Endpoint::Tcp(bound)))
        }
        Listen::Unix(path) => {
            let error = |source| ManagerError::Bind {
                endpoint: path.display().to_string(),
                source,
            };
            remove_stale_socket(path).map_err(error)?;
            let listener = UnixListener::bind(path).map_err(error)?;
            Ok((Listener::Unix(listener), Endpoint::Unix(path.clone())))
        }
    }
}

/// A socket left by an earlier run is replaced; anything else at the path is not ours.
fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a file that is not a socket exists at the path",
        )),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Stops the manager when dropped or on [`ManagerGuard::shutdown`]: every stream closes
/// and pending publishes fail. Standalone containers are killed, unless
/// [`ManagerConfig::containers_dir`] is set: then they keep running (as under an agent that
/// goes down) and the next manager with that directory adopts them.
#[derive(Debug)]
pub struct ManagerGuard {
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl ManagerGuard {
    /// Cancels the manager and waits for all its tasks.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

impl Drop for ManagerGuard {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The embedding code's view of a running manager. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ManagerHandle {
    commands: mpsc::Sender<Command>,
    messages: broadcast::Sender<ManagerMessage>,
    metrics: ManagerMetrics,
    endpoint: Endpoint,
    agent_id: String,
    acks: SharedAcks,
    containers: containers::Containers,
}

/// An operation for [`ManagerHandle::apply_operation`], as a master's
/// `ApplyOperationMessage`.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    /// The operation.
    pub info: offer::Operation,
    /// The framework, `None` for an operator operation.
    pub framework_id: Option<FrameworkId>,
    /// `None`: a fresh random uuid.
    pub operation_uuid: Option<uuid::Uuid>,
    /// `None`: the provider's current resource version (from its last UPDATE_STATE);
    /// `Some`: sent as is (to test mismatches).
    pub resource_version: Option<ProtoUuid>,
    /// `false`: record the operation as the master would but do not deliver the event
    /// (an `ApplyOperationMessage` lost in transit, test ReconcileDroppedOperation).
    pub deliver: bool,
}

impl ApplyRequest {
    /// An operator operation (no framework) with a fresh uuid and the current version,
    /// delivered.
    #[must_use]
    pub fn new(info: offer::Operation) -> Self {
        Self {
            info,
            framework_id: None,
            operation_uuid: None,
            resource_version: None,
            deliver: true,
        }
    }
}

impl ManagerHandle {
    /// The agent ID this manager serves on GET_AGENT.
    #[must_use]
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// Where the manager serves.
    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The manager's metrics (register them, or read [`ManagerMetrics::snapshot`]).
    #[must_use]
    pub fn metrics(&self) -> &ManagerMetrics {
        &self.metrics
    }

    /// Observations from now on, in order.
    #[must_use]
    pub fn messages(&self) -> broadcast::Receiver<ManagerMessage> {
        self.messages.subscribe()
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(command(reply)).await.ok()?;
        answer.await.ok()
    }

    /// The standalone containers launched through the operator API (and adopted from an
    /// earlier manager with the same `containers_dir`), ordered by ID; empty once the
    /// manager stopped.
    pub async fn containers(&self) -> Vec<ContainerView> {
        self.containers.list().await
    }

    /// SIGKILLs every standalone container's process group and returns when each one's
    /// termination has been handled (WAITs answered, records removed): for test cleanup
    /// and a standalone shutdown, since [`ManagerGuard::shutdown`] leaves surviving
    /// containers running.
    pub async fn destroy_containers(&self) {
        self.containers.destroy_all().await;
    }

    /// The subscribed providers and the agent's view of each.
    ///
    /// # Errors
    /// [`ManagerError::Stopped`].
    pub async fn providers(&self) -> Result<Vec<SubscribedProvider>, ManagerError> {
        self.ask(|reply| Command::Providers { reply })
            .await
            .ok_or(ManagerError::Stopped)
    }

    /// Sends an operation-flow event (APPLY_OPERATION, ACKNOWLEDGE_OPERATION_STATUS,
    /// RECONCILE_OPERATIONS) to a subscribed provider.
    ///
    /// # Errors
    /// [`SendEventError`]: another event type, a missing payload, not subscribed, or the
    /// provider's queue was full (it is then disconnected).
    pub async fn send_event(&self, provider_id: &str, event: Event) -> Result<(), SendEventError> {
        let id = provider_id.to_owned();
        let event = Box::new(event);
        Box::pin(self.ask(|reply| Command::SendEvent { id, event, reply }))
            .await
            .unwrap_or(Err(SendEventError::Stopped))
    }

    /// Publishes provider resources (Mesos `publishResources`): one PUBLISH_RESOURCES per
    /// provider involved, completing when every provider has replied.
    ///
    /// # Errors
    /// [`PublishError`]: a provider is not subscribed, replied FAILED, or disconnected.
    pub async fn publish(&self, resources: Vec<Resource>) -> Result<(), PublishError> {
        let waiters = self
            .ask(|reply| Command::Publish { resources, reply })
            .await
            .unwrap_or(Err(PublishError::Stopped))?;
        for waiter in waiters {
            waiter.await.unwrap_or(Err(PublishError::Stopped))?;
        }
        Ok(())
    }

    /// As the agent (spec §2.9 steps 1–3): records the operation PENDING and, if it is
    /// speculative (RESERVE, UNRESERVE, CREATE, DESTROY), applies its conversion to the
    /// agent's view of the total at once; then sends APPLY_OPERATION. Returns the
    /// operation uuid. A uuid the agent already tracks is sent again without being
    /// recorded or applied again.
    ///
    /// # Errors
    /// [`OperationError`]: the provider is not subscribed or has not reported its state,
    /// the master's validation refuses it (the agent's view does not contain what it
    /// consumes), or the event could not be sent.
    pub async fn apply_operation(
        &self,
        provider_id: &str,
        req: ApplyRequest,
    ) -> Result<uuid::Uuid, OperationError> {
        let id = provider_id.to_owned();
        let request = Box::new(req);
        Box::pin(self.ask(|reply| Command::Apply { id, request, reply }))
            .await
            .unwrap_or(Err(OperationError::Stopped))
    }

    /// Changes how the manager acknowledges operation status updates from now on
    /// (`DropFirst(n)` counts from this call).
    pub fn set_ack_policy(&self, policy: AckPolicy) {
        self.acks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .set(policy);
    }

    /// Acknowledges one status of an operation as the master does (spec §2.9 step 7):
    /// ACKNOWLEDGE_OPERATION_STATUS to the provider; if the operation's last status is
    /// terminal, the agent forgets the operation. An operation the agent does not track
    /// (never applied through it, forgotten, or already acknowledged terminal) gets no
    /// event: the agent drops the acknowledgement with a warning, as Mesos's
    /// `operationStatusAcknowledgement` does, and the call succeeds as the master's send.
    ///
    /// # Errors
    /// [`SendEventError`]: not subscribed, or the event could not be queued.
    pub async fn acknowledge(
        &self,
        provider_id: &str,
        operation_uuid: uuid::Uuid,
        status_uuid: uuid::Uuid,
    ) -> Result<(), SendEventError> {
        let id = provider_id.to_owned();
        self.ask(|reply| Command::Acknowledge {
            id,
            operation: operation_uuid,
            status: status_uuid,
            reply,
        })
        .await
        .unwrap_or(Err(SendEventError::Stopped))
    }

    /// Sends RECONCILE_OPERATIONS for `operations` (the master's reconciliation of
    /// operations it believes pending).
    ///
    /// # Errors
    /// [`SendEventError`]: not subscribed, or the event could not be queued.
    pub async fn reconcile_operations(
        &self,
        provider_id: &str,
        operations: Vec<uuid::Uuid>,
    ) -> Result<(), SendEventError> {
        let event = Event {
            r#type: Some(event::Type::ReconcileOperations as i32),
            reconcile_operations: Some(event::ReconcileOperations {
                operation_uuids: operations
                    .iter()
                    .map(|uuid| ProtoUuid {
                        value: uuid.as_bytes().to_vec(),
                    })
                    .collect(),
            }),
            ..Event::default()
        };
        self.send_event(provider_id, event).await
    }

    /// Waits until the agent's record of the operation is terminal and returns it (also
    /// when the terminal status was already acknowledged and the operation removed, for
    /// the last few thousand operations).
    ///
    /// # Errors
    /// [`OperationError::Unknown`] if the agent does not know the operation,
    /// [`OperationError::Forgotten`] if the provider's state dropped it and the provider
    /// could not be asked about it (its stream closed right then); an operation the
    /// agent's table dropped is otherwise reconciled with the provider, and its answer
    /// (the provider's own status, or DROPPED "Unknown operation") is the result,
    /// [`OperationError::Timeout`].
    pub async fn wait_terminal(
        &self,
        operation_uuid: uuid::Uuid,
        timeout: Duration,
    ) -> Result<worker::OperationView, OperationError> {
        let answer = async {
            let waiter = self
                .ask(|reply| Command::WaitTerminal {
                    operation: operation_uuid,
                    reply,
                })
                .await;
            waiter.unwrap_or(Err(OperationError::Stopped))
        };
        tokio::time::timeout(timeout, answer)
            .await
            .unwrap_or(Err(OperationError::Timeout {
                uuid: operation_uuid,
                timeout,
            }))
    }

    /// The agent's view of a provider's total: the last UPDATE_STATE's resources with the
    /// agent's own applications since (speculative at apply, `total − consumed +
    /// converted` at a FINISHED non-speculative terminal status). A consumed resource
    /// missing from it is a [`ManagerMessage::ProtocolViolation`] (a Mesos agent aborts),
    /// counted in [`metrics::PROTOCOL_VIOLATIONS`].
    ///
    /// # Errors
    /// [`ManagerError::NotSubscribed`], [`ManagerError::Stopped`].
    pub async fn agent_total(&self, provider_id: &str) -> Result<Vec<Resource>, ManagerError> {
        let id = provider_id.to_owned();
        self.ask(|reply| Command::AgentTotal { id, reply })
            .await
            .ok_or(ManagerError::Stopped)?
            .ok_or_else(|| ManagerError::NotSubscribed {
                id: provider_id.to_owned(),
            })
    }

    /// Removes a provider for good (MARK_RESOURCE_PROVIDER_GONE): sends TEARDOWN if it is
    /// subscribed, closes its stream, and refuses its later subscriptions.
    ///
    /// # Errors
    /// [`ManagerError::Registrar`] if the ID is unknown or the registry cannot be written.
    pub async fn remove_provider(&self, provider_id: &str) -> Result<(), ManagerError> {
        let id = provider_id.to_owned();
        self.ask(|reply| Command::Remove { id, reply })
            .await
            .ok_or(ManagerError::Stopped)?
            .map_err(ManagerError::from)
    }
}
