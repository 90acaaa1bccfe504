//! Errors of the agent client.

use std::time::Duration;

use http::StatusCode;

/// An invalid [`crate::AgentConfig`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The agent URL cannot be used.
    #[error("agent URL {url:?}: {reason}")]
    AgentUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A duration that must be positive is zero.
    #[error("agent client setting {name} must be positive")]
    ZeroDuration {
        /// The setting.
        name: &'static str,
    },
    /// A count that must be positive is zero.
    #[error("agent client setting {name} must be at least 1")]
    ZeroCount {
        /// The setting.
        name: &'static str,
    },
    /// Keepalive idle or interval below one second.
    #[error("agent client tcp_keepalive idle and interval must be at least 1 s")]
    KeepaliveTooShort,
    /// `ca_file` could not be read.
    #[error("reading the agent CA file {path}")]
    ReadCaFile {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `ca_file` holds no usable PEM certificate.
    #[error("agent CA file {path} contains no usable PEM certificate")]
    BadCaFile {
        /// The file.
        path: std::path::PathBuf,
        /// The first problem met, if any.
        #[source]
        source: Option<rustls::pki_types::pem::Error>,
    },
    /// The system trust store yielded no root certificate.
    #[error("no usable root certificate in the system trust store for https (set ca_file)")]
    NoSystemRoots,
    /// The agent host is not a valid TLS server name.
    #[error("agent host {host:?} is not a valid TLS server name")]
    ServerName {
        /// The host.
        host: String,
    },
    /// rustls refused the client configuration.
    #[error("building the TLS client configuration for the agent")]
    Tls(#[source] rustls::Error),
    /// The token is empty or cannot be sent in a header (the value itself is not shown).
    #[error("agent token is empty or contains characters not allowed in an HTTP header")]
    BadToken,
}

/// Why a request to the agent failed, or why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A call was made while no subscription exists (as the Mesos driver, spec §2.4).
    #[error("cannot send {call} call: the agent client is {state}")]
    NotSubscribed {
        /// The call type's name.
        call: &'static str,
        /// The connection state's name.
        state: &'static str,
    },
    /// SUBSCRIBE is the client's own business.
    #[error("SUBSCRIBE calls are sent by the agent client itself")]
    SubscribeCall,
    /// The call could not be encoded.
    #[error("encoding the {call} call")]
    Encode {
        /// The call type's name.
        call: &'static str,
        /// The cause.
        #[source]
        source: slrp_wire::JsonError,
    },
    /// [`AgentHandle::encode_update_state`](crate::AgentHandle::encode_update_state) was
    /// given a call it does not encode (a programming error).
    #[error("encoding the {call} call with the resources apart: {problem}")]
    NotAnUpdateState {
        /// The call type's name.
        call: &'static str,
        /// What is wrong with the call.
        problem: &'static str,
    },
    /// Connecting to the agent failed.
    #[error("connecting to the agent at {endpoint}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted or mismatched certificate, or not TLS at all).
    #[error("TLS handshake with the agent at {endpoint} failed")]
    TlsHandshake {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HTTP on an open connection failed (reset, closed, protocol error).
    #[error("HTTP exchange with the agent failed")]
    Http(#[source] hyper::Error),
    /// Something took longer than its configured bound.
    #[error("{what} took longer than {timeout:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// The bound.
        timeout: Duration,
    },
    /// The agent is not ready (503, or 404 before the endpoint exists): retry later.
    #[error("agent answered {status}: {body:?}")]
    Unavailable {
        /// The status.
        status: StatusCode,
        /// The body, as text.
        body: String,
    },
    /// The agent refused the request; the same request will fail again.
    #[error("agent refused the request with {status}: {body:?}")]
    Rejected {
        /// The status.
        status: StatusCode,
        /// The body, as text.
        body: String,
    },
    /// An answer that the protocol does not allow here.
    #[error("agent answered unexpectedly: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
    /// The event stream broke (bad framing, transport error, truncated record).
    #[error("reading the event stream")]
    Stream(#[source] slrp_wire::RecordIoError),
    /// The agent closed the event stream.
    #[error("the agent closed the event stream")]
    StreamClosed,
    /// The stream closed before SUBSCRIBED: the agent did not admit the subscription
    /// (spec §2.7: an unknown provider id, a changed type or name, or a removed provider).
    #[error(
        "the agent closed the stream before SUBSCRIBED: subscription not admitted (unknown or removed provider id, or changed type/name)"
    )]
    NotAdmitted,
    /// The calls connection failed, which ends the session as in Mesos.
    #[error("the calls connection to the agent failed")]
    CallsConnectionLost,
    /// The session ended while the call waited for its answer; it may or may not have
    /// reached the agent.
    #[error("the agent session ended before the call was answered")]
    SessionEnded,
    /// The client was stopped.
    #[error("the agent client has stopped")]
    Stopped,
}

impl AgentError {
    /// Whether the same request may succeed later without change.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            Self::SubscribeCall
                | Self::Encode { .. }
                | Self::NotAnUpdateState { .. }
                | Self::Rejected { .. }
                | Self::Stopped
        )
    }
}
