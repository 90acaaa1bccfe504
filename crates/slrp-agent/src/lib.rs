//! Client of a Mesos agent's resource provider API (`/slave(1)/api/v1/resource_provider`).
//!
//! # Overview
//! The client holds a session with the agent as the Mesos driver does (spec §2): one
//! HTTP/1.1 connection carries SUBSCRIBE and its RecordIO event stream, another carries
//! every other call with the session's `Mesos-Stream-Id`. Unlike the driver it waits with
//! jittered exponential backoff between attempts, bounds every step in time, and uses TCP
//! keepalive and `TCP_USER_TIMEOUT` so that a dead agent is noticed (spec §12 item 16).
//!
//! # Layout
//! - [`config`]: [`AgentConfig`], the `--agent` URL forms ([`AgentEndpoint`]).
//! - [`state`]: the observable [`ConnectionState`] and the pure [`ReconnectPolicy`].
//! - [`client`]: the session worker and [`AgentHandle`] for calls.
//! - [`operator`]: [`operator::get_agent_id`] (GET_AGENT) and [`OperatorClient`], the
//!   standalone container calls of the agent operator API.
//! - [`error`], [`metrics`]; `transport`: opening one connection over TCP, TLS or a unix
//!   socket.
//!
//! # Invariants
//! Calls are refused locally unless subscribed; every error ends in `Disconnected` and a
//! wait of at least a jittered backoff; the token is never logged.

pub mod client;
pub mod config;
pub mod error;
pub mod metrics;
pub mod operator;
pub mod state;
mod transport;

pub use client::{
    AgentClient, AgentHandle, EncodedCall, MAX_CALL_CONNECTIONS, STREAM_ID_HEADER, SessionEvent,
};
pub use config::{AgentConfig, AgentEndpoint, RESOURCE_PROVIDER_PATH, TcpKeepalive, Token};
pub use error::{AgentError, ConfigError};
pub use metrics::{MetricFamilies, Metrics};
pub use operator::{Kill, Launch, OperatorClient, OperatorError, Wait, get_agent_id};
pub use state::{ConnectionState, ReconnectPolicy};
