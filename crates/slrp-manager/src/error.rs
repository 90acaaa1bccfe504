//! Error types of the embedded manager, one enum per concern.

use std::path::PathBuf;

/// A [`crate::ManagerConfig`] that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TCP address is not a loopback address. The resource provider API has no
    /// authentication here, so it is never exposed beyond this host.
    #[error("manager listen address {addr} is not a loopback address")]
    NotLoopback {
        /// The rejected address.
        addr: std::net::SocketAddr,
    },
    /// The configured agent ID is not a valid Mesos ID.
    #[error("manager agent_id {id:?} is not a valid agent ID")]
    AgentId {
        /// The rejected ID.
        id: String,
        /// The rule it breaks.
        #[source]
        source: slrp_types::IdError,
    },
    /// A pre-admitted provider ID is not a valid Mesos ID.
    #[error("manager preadmitted provider ID {id:?} is not a valid resource provider ID")]
    PreadmittedId {
        /// The rejected ID.
        id: String,
        /// The rule it breaks.
        #[source]
        source: slrp_types::IdError,
    },
    /// A text setting that must not be empty is empty.
    #[error("manager setting '{field}' must not be empty")]
    Empty {
        /// The setting's name.
        field: &'static str,
    },
    /// A limit that must be positive is zero.
    #[error("manager setting '{field}' must be positive")]
    Zero {
        /// The setting's name.
        field: &'static str,
    },
}

/// Errors of the registrar, the manager's durable record of admitted providers.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    /// Reading the registry file failed.
    #[error("reading the resource provider registry {path}")]
    Read {
        /// The registry file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The registry file is not a registry.
    #[error("parsing the resource provider registry {path}")]
    Parse {
        /// The registry file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// Writing the registry file failed.
    #[error("writing the resource provider registry {path}")]
    Write {
        /// The registry file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The blocking writer task died.
    #[error("the resource provider registry writer task failed")]
    Task(#[source] tokio::task::JoinError),
    /// The provider was marked removed; it can never be admitted again.
    #[error("resource provider {id} was removed")]
    Removed {
        /// The provider ID.
        id: String,
    },
    /// The provider is not in the registry.
    #[error("attempted to remove an unknown resource provider {id}")]
    Unknown {
        /// The provider ID.
        id: String,
    },
}

/// Errors of [`crate::EmbeddedManager::spawn`] and of handle calls that change state.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The configuration was rejected.
    #[error("invalid manager configuration")]
    Config(#[from] ConfigError),
    /// Binding the listener failed.
    #[error("binding the manager endpoint {endpoint}")]
    Bind {
        /// The address or socket path.
        endpoint: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The registrar failed.
    #[error("resource provider registrar")]
    Registrar(#[from] RegistrarError),
    /// The standalone containers could not be recovered.
    #[error("standalone containers")]
    Containers(#[from] ContainerError),
    /// The provider is not subscribed.
    #[error("resource provider {id} is not subscribed")]
    NotSubscribed {
        /// The provider ID.
        id: String,
    },
    /// The manager has stopped.
    #[error("the resource provider manager has stopped")]
    Stopped,
}

/// Why a publish request failed. The texts follow Mesos's `publishResources` failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The provider owning some of the resources is not subscribed.
    #[error("resource provider {id} is not subscribed")]
    NotSubscribed {
        /// The provider ID.
        id: String,
    },
    /// The provider disconnected (or was replaced or removed) before it replied.
    #[error("failed to publish resources from resource provider {id}: Connection closed")]
    ConnectionClosed {
        /// The provider ID.
        id: String,
    },
    /// The provider replied with a status other than `OK`.
    #[error("failed to publish resources for resource provider {id}: Received {status} status")]
    Failed {
        /// The provider ID.
        id: String,
        /// The status name the provider replied with.
        status: &'static str,
    },
    /// The manager has stopped.
    #[error("the resource provider manager has stopped")]
    Stopped,
}

/// Why [`crate::ManagerHandle::send_event`] refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendEventError {
    /// The provider is not subscribed.
    #[error("resource provider {id} is not subscribed")]
    NotSubscribed {
        /// The provider ID.
        id: String,
    },
    /// The event type is one the manager itself owns (or is invalid).
    #[error(
        "event type {event_type} cannot be sent through send_event (only APPLY_OPERATION, ACKNOWLEDGE_OPERATION_STATUS, RECONCILE_OPERATIONS)"
    )]
    NotAllowed {
        /// The event type's name, or its number if unknown.
        event_type: String,
    },
    /// The event lacks the payload its type needs.
    #[error("event of type {event_type} lacks its '{field}' payload")]
    MissingPayload {
        /// The event type's name.
        event_type: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// The provider's stream could not take the event; the provider was disconnected.
    #[error("resource provider {id} was disconnected: {reason}")]
    Disconnected {
        /// The provider ID.
        id: String,
        /// Why the event could not be queued.
        reason: &'static str,
    },
    /// The manager has stopped.
    #[error("the resource provider manager has stopped")]
    Stopped,
}

/// Why an operation call of [`crate::ManagerHandle`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    /// The provider is not subscribed.
    #[error("resource provider {id} is not subscribed")]
    NotSubscribed {
        /// The provider ID.
        id: String,
    },
    /// The provider has not sent `UPDATE_STATE` yet, so there is no resource version to
    /// send (and no total to validate against).
    #[error("resource provider {id} has not reported its state yet")]
    NoResourceVersion {
        /// The provider ID.
        id: String,
    },
    /// The master's validation refused the operation (the agent's view does not contain
    /// what it consumes, or it is malformed).
    #[error("operation refused by the master's validation: {reason}")]
    Invalid {
        /// What was wrong.
        reason: String,
    },
    /// The `APPLY_OPERATION` event could not be sent.
    #[error("sending APPLY_OPERATION")]
    Send(#[source] SendEventError),
    /// The agent does not know the operation (never applied, or acknowledged terminal
    /// long ago).
    #[error("operation {uuid} is not known to the agent")]
    Unknown {
        /// The operation UUID.
        uuid: uuid::Uuid,
    },
    /// The provider's `UPDATE_STATE` no longer lists the operation, so the agent dropped it
    /// without a terminal status (spec §2.8: the agent generates none), and the master
    /// could not ask the provider about it (its stream closed at that moment).
    #[error("operation {uuid} was dropped from the agent's table without a terminal status")]
    Forgotten {
        /// The operation UUID.
        uuid: uuid::Uuid,
    },
    /// No terminal status within the timeout.
    #[error("operation {uuid} did not become terminal within {timeout:?}")]
    Timeout {
        /// The operation UUID.
        uuid: uuid::Uuid,
        /// How long was waited.
        timeout: std::time::Duration,
    },
    /// The manager has stopped.
    #[error("the resource provider manager has stopped")]
    Stopped,
}

/// Errors of the standalone containers' records (operator API `LAUNCH_CONTAINER`).
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    /// A container's runtime record could not be written.
    #[error("writing the container record {path}")]
    Checkpoint {
        /// The record file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A container's runtime record could not be read back at spawn; the manager does not
    /// start rather than lose track of a running process.
    #[error("recovering the container record {path}")]
    Recover {
        /// The record file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox root could not be created.
    #[error("creating the container sandbox root {path}")]
    SandboxRoot {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The blocking recovery task died.
    #[error("the container recovery task failed")]
    Task(#[source] tokio::task::JoinError),
}
