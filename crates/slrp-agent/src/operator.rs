//! The agent operator API subset a provider needs: `GET_AGENT`, for the agent ID, and the
//! standalone container calls its plugins run through ([`OperatorClient`], spec §4.1).
//!
//! The resource provider API never tells a provider its agent's ID, yet the provider's
//! durable identity is keyed by it (spec §3.6, §8.6: a new agent ID is a new provider
//! identity). The operator API is the parent path of the resource provider endpoint
//! (spec §2.1: `/slave(1)/api/v1/resource_provider` → `/slave(1)/api/v1`) on the same
//! listener, so the same transport (TCP, TLS or unix socket), token and time bounds apply.
//!
//! Every call is one protobuf `mesos.v1.agent.Call` on its own connection, with
//! `Accept: application/x-protobuf` and the bearer token when one is configured. Calls are
//! bounded by `call_timeout`, except `WAIT_CONTAINER`: a long poll the agent answers when
//! the container ends, so only its connection is bounded (TCP keepalive notices a dead
//! agent).

use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, header};
use slrp_proto::mesos::v1::ContainerId;
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_wire::ContentType;

use crate::client::{build_request, read_body};
use crate::config::{AgentConfig, AgentEndpoint};
use crate::error::{AgentError, ConfigError};
use crate::transport::Connector;

/// A GET_AGENT answer is one `AgentInfo` with its resources: far below this.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// Why an operator API call failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The resource provider path has no parent to serve the operator API.
    #[error("no agent operator API path can be derived from the resource provider path {path:?}")]
    Path {
        /// The resource provider endpoint's path.
        path: String,
    },
    /// The client configuration is unusable.
    #[error("agent operator API client configuration")]
    Config(#[source] ConfigError),
    /// Connecting, sending or reading failed, or took longer than its bound.
    #[error("{call} call to {endpoint}")]
    Request {
        /// The call type's name.
        call: &'static str,
        /// The operator endpoint.
        endpoint: String,
        /// The cause (boxed: it is large and this path is cold).
        #[source]
        source: Box<AgentError>,
    },
    /// The agent answered with a status the call does not expect.
    #[error("{call} call to {endpoint} answered {status}: {body:?}")]
    Status {
        /// The call type's name.
        call: &'static str,
        /// The operator endpoint.
        endpoint: String,
        /// The status.
        status: StatusCode,
        /// The body, as text (Mesos puts the reason there).
        body: String,
    },
    /// The answer does not decode as a `mesos.v1.agent.Response`.
    #[error("{call} call to {endpoint}: the answer is not a mesos.v1.agent.Response")]
    Decode {
        /// The call type's name.
        call: &'static str,
        /// The operator endpoint.
        endpoint: String,
        /// The decoder's error (boxed, as above).
        #[source]
        source: Box<slrp_wire::DecodeError>,
    },
    /// The answer is a response, but not the one asked for.
    #[error("{call} call to {endpoint}: unexpected answer: {detail}")]
    Unexpected {
        /// The call type's name.
        call: &'static str,
        /// The operator endpoint.
        endpoint: String,
        /// What was wrong.
        detail: String,
    },
    /// The agent refused a container call (401 Unauthorized, 403 Forbidden: the token
    /// does not allow this container ID). Permanent: the same call fails again.
    #[error("the agent refused the call: {status}: {body:?}")]
    Refused {
        /// 401 or 403.
        status: StatusCode,
        /// The body, as text.
        body: String,
    },
    /// `agent_info` has no ID: the agent has not registered with a master yet.
    #[error("the agent at {endpoint} has no agent ID yet (not registered with a master)")]
    NotRegistered {
        /// The operator endpoint.
        endpoint: String,
    },
    /// The ID cannot be an agent ID (it would not be one directory name).
    #[error("the agent at {endpoint} reported an invalid agent ID {id:?}")]
    InvalidId {
        /// The operator endpoint.
        endpoint: String,
        /// The ID as reported.
        id: String,
        /// The rule it breaks.
        #[source]
        source: slrp_types::IdError,
    },
}

impl OperatorError {
    /// Whether asking again later may succeed: an agent not registered yet, a `5xx` other
    /// than `501`, or a transient transport failure.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::NotRegistered { .. } => true,
            Self::Request { source, .. } => source.is_transient(),
            Self::Status { status, .. } => {
                status.is_server_error() && *status != StatusCode::NOT_IMPLEMENTED
            }
            Self::Path { .. }
            | Self::Refused { .. }
            | Self::Config(_)
            | Self::Decode { .. }
            | Self::Unexpected { .. }
            | Self::InvalidId { .. } => false,
        }
    }
}

/// The operator API endpoint of a resource provider endpoint: the same listener, the
/// parent path (`/slave(1)/api/v1/resource_provider` → `/slave(1)/api/v1`).
///
/// # Errors
/// [`OperatorError::Path`] when the path has no parent (`/resource_provider`).
pub fn operator_endpoint(endpoint: &AgentEndpoint) -> Result<AgentEndpoint, OperatorError> {
    let rp_path = endpoint.path();
    let parent = rp_path
        .trim_end_matches('/')
        .rsplit_once('/')
        .map(|(parent, _)| parent)
        .filter(|parent| !parent.is_empty())
        .ok_or_else(|| OperatorError::Path {
            path: rp_path.to_owned(),
        })?
        .to_owned();
    Ok(match endpoint {
        AgentEndpoint::Tcp {
            host, port, tls, ..
        } => AgentEndpoint::Tcp {
            host: host.clone(),
            port: *port,
            path: parent,
            tls: *tls,
        },
        AgentEndpoint::Unix { socket, .. } => AgentEndpoint::Unix {
            socket: socket.clone(),
            path: parent,
        },
    })
}

/// GET_AGENT on the agent operator API (`/slave(1)/api/v1`, the parent path of the resource
/// provider endpoint; for a unix socket the same socket), with the client's token, in
/// protobuf. Returns `agent_info.id`, checked to be a valid Mesos ID. The connection is
/// bounded by `connect_timeout`, the exchange by `call_timeout`. TLS trust roots are read
/// from disk (blocking) on each call: the daemon calls this once per start.
///
/// # Errors
/// [`OperatorError`] naming what was wrong; [`OperatorError::is_transient`] tells whether
/// to retry (e.g. [`OperatorError::NotRegistered`]: agent not registered yet).
pub async fn get_agent_id(config: &AgentConfig) -> Result<String, OperatorError> {
    let client = OperatorClient::new(config)?;
    let call = Call {
        r#type: Some(call::Type::GetAgent as i32),
        ..Call::default()
    };
    let answer = client.exchange("GET_AGENT", &call, Bound::Call).await?;
    if answer.status != StatusCode::OK {
        return Err(answer.status_error(&client));
    }
    agent_id_of(&client.endpoint, &answer.headers, &answer.body)
}

/// How long an exchange may take once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// `call_timeout`.
    Call,
    /// Unbounded: a long poll (WAIT_CONTAINER).
    LongPoll,
}

/// One answer: status, headers, body.
struct Answer {
    call: &'static str,
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn status_error(&self, client: &OperatorClient) -> OperatorError {
        OperatorError::Status {
            call: self.call,
            endpoint: client.endpoint.clone(),
            status: self.status,
            body: self.text(),
        }
    }

    /// 401/403 → [`OperatorError::Refused`]; anything else → [`OperatorError::Status`].
    fn refusal_or_status(&self, client: &OperatorClient) -> OperatorError {
        if matches!(
            self.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            OperatorError::Refused {
                status: self.status,
                body: self.text(),
            }
        } else {
            self.status_error(client)
        }
    }
}

/// How LAUNCH_CONTAINER ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// `200 OK`: launched now.
    Launched,
    /// `202 Accepted`: a container with this ID already runs (Mesos's re-use of a
    /// surviving plugin container).
    AlreadyRunning,
}

/// How WAIT_CONTAINER ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// `200 OK`: the container ended, as the agent tells it.
    Exited(response::WaitContainer),
    /// `404 Not Found`: the agent does not know the container (never launched, or gone:
    /// an agent forgets an ended standalone container).
    NotFound,
}

/// How KILL_CONTAINER ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// `200 OK`: the signal was sent.
    Signalled,
    /// `404 Not Found`: unknown, or already being killed.
    NotFound,
}

/// A client of the agent operator API's container calls (and GET_AGENT).
#[derive(Debug, Clone)]
pub struct OperatorClient {
    config: AgentConfig,
    connector: Connector,
    endpoint: String,
}

impl OperatorClient {
    /// A client of the operator API at the parent path of `config`'s resource provider
    /// endpoint, with its transport, token and time bounds (protobuf whatever
    /// `config.content_type` says). TLS trust roots are read now (blocking).
    ///
    /// # Errors
    /// [`OperatorError::Config`] or [`OperatorError::Path`].
    pub fn new(config: &AgentConfig) -> Result<Self, OperatorError> {
        config.validate().map_err(OperatorError::Config)?;
        let mut operator = config.clone();
        operator.endpoint = operator_endpoint(&config.endpoint)?;
        // The answer's media type follows `Accept`; protobuf, as the reference provider.
        operator.content_type = ContentType::Protobuf;
        let connector = Connector::new(&operator).map_err(OperatorError::Config)?;
        Ok(Self {
            endpoint: operator.endpoint.to_string(),
            config: operator,
            connector,
        })
    }

    /// The operator endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn exchange(
        &self,
        name: &'static str,
        call: &Call,
        bound: Bound,
    ) -> Result<Answer, OperatorError> {
        let request_error = |source| OperatorError::Request {
            call: name,
            endpoint: self.endpoint.clone(),
            source: Box::new(source),
        };
        let mut connection = self
            .connector
            .connect(&self.config)
            .await
            .map_err(request_error)?;
        let body = slrp_wire::encode(ContentType::Protobuf, call)
            .map_err(|source| request_error(AgentError::Encode { call: name, source }))?;
        let request = build_request(&self.config, body, None);
        let exchange = async {
            connection.sender.ready().await.map_err(AgentError::Http)?;
            let answer = connection
                .sender
                .send_request(request)
                .await
                .map_err(AgentError::Http)?;
            let (parts, body) = answer.into_parts();
            let bytes = read_body(body, MAX_RESPONSE).await?;
            Ok::<_, AgentError>((parts, bytes))
        };
        let (parts, body) = match bound {
            Bound::Call => tokio::time::timeout(self.config.call_timeout, exchange)
                .await
                .map_err(|_| {
                    request_error(AgentError::Timeout {
                        what: "a call to the agent operator API",
                        timeout: self.config.call_timeout,
                    })
                })?
                .map_err(request_error)?,
            Bound::LongPoll => exchange.await.map_err(request_error)?,
        };
        Ok(Answer {
            call: name,
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// The `call_timeout` of calls other than WAIT_CONTAINER.
    pub fn call_timeout(&self) -> Duration {
        self.config.call_timeout
    }

    /// LAUNCH_CONTAINER.
    ///
    /// # Errors
    /// [`OperatorError::Refused`] on 401/403 (permanent), [`OperatorError::Status`] on
    /// any other status but 200/202 (400 names the failure), or a transport error.
    pub async fn launch_container(
        &self,
        launch: call::LaunchContainer,
    ) -> Result<Launch, OperatorError> {
        let call = Call {
            r#type: Some(call::Type::LaunchContainer as i32),
            launch_container: Some(launch),
            ..Call::default()
        };
        let answer = self
            .exchange("LAUNCH_CONTAINER", &call, Bound::Call)
            .await?;
        match answer.status {
            StatusCode::OK => Ok(Launch::Launched),
            StatusCode::ACCEPTED => Ok(Launch::AlreadyRunning),
            _ => Err(answer.refusal_or_status(self)),
        }
    }

    /// WAIT_CONTAINER: a long poll answered when the container ends.
    ///
    /// # Errors
    /// [`OperatorError::Refused`] on 401/403, [`OperatorError::Status`] on another
    /// status but 200/404, a bad answer, or a transport error (the agent restarting: not
    /// an answer about the container).
    pub async fn wait_container(&self, id: &ContainerId) -> Result<Wait, OperatorError> {
        let call = Call {
            r#type: Some(call::Type::WaitContainer as i32),
            wait_container: Some(call::WaitContainer {
                container_id: id.clone(),
            }),
            ..Call::default()
        };
        let answer = self
            .exchange("WAIT_CONTAINER", &call, Bound::LongPoll)
            .await?;
        match answer.status {
            StatusCode::OK => {
                let response = self.response(&answer, response::Type::WaitContainer)?;
                Ok(Wait::Exited(response.wait_container.unwrap_or_default()))
            }
            StatusCode::NOT_FOUND => Ok(Wait::NotFound),
            _ => Err(answer.refusal_or_status(self)),
        }
    }

    /// KILL_CONTAINER with `signal` (the agent's default, SIGKILL, when `None`).
    ///
    /// # Errors
    /// As [`OperatorClient::launch_container`], with 404 an answer ([`Kill::NotFound`]).
    pub async fn kill_container(
        &self,
        id: &ContainerId,
        signal: Option<i32>,
    ) -> Result<Kill, OperatorError> {
        let call = Call {
            r#type: Some(call::Type::KillContainer as i32),
            kill_container: Some(call::KillContainer {
                container_id: id.clone(),
                signal,
            }),
            ..Call::default()
        };
        let answer = self.exchange("KILL_CONTAINER", &call, Bound::Call).await?;
        match answer.status {
            StatusCode::OK => Ok(Kill::Signalled),
            StatusCode::NOT_FOUND => Ok(Kill::NotFound),
            _ => Err(answer.refusal_or_status(self)),
        }
    }

    /// REMOVE_CONTAINER. Never send it for a top-level container to a Mesos agent: a
    /// 1.11 agent aborts on it (`CHECK(containerId.has_parent())`).
    ///
    /// # Errors
    /// [`OperatorError::Refused`] on 401/403, [`OperatorError::Status`] on anything but
    /// 200 (500: still running, or unknown), or a transport error.
    pub async fn remove_container(&self, id: &ContainerId) -> Result<(), OperatorError> {
        let call = Call {
            r#type: Some(call::Type::RemoveContainer as i32),
            remove_container: Some(call::RemoveContainer {
                container_id: id.clone(),
            }),
            ..Call::default()
        };
        let answer = self
            .exchange("REMOVE_CONTAINER", &call, Bound::Call)
            .await?;
        match answer.status {
            StatusCode::OK => Ok(()),
            _ => Err(answer.refusal_or_status(self)),
        }
    }

    /// GET_CONTAINERS: the containers the token may see.
    ///
    /// # Errors
    /// [`OperatorError::Status`] on anything but 200 (as Mesos's "Failed to get
    /// containers: Unexpected response"), a bad answer, or a transport error.
    pub async fn get_containers(
        &self,
        show_nested: bool,
        show_standalone: bool,
    ) -> Result<Vec<response::get_containers::Container>, OperatorError> {
        let call = Call {
            r#type: Some(call::Type::GetContainers as i32),
            get_containers: Some(call::GetContainers {
                show_nested: Some(show_nested),
                show_standalone: Some(show_standalone),
            }),
            ..Call::default()
        };
        let answer = self.exchange("GET_CONTAINERS", &call, Bound::Call).await?;
        if answer.status != StatusCode::OK {
            return Err(answer.refusal_or_status(self));
        }
        let response = self.response(&answer, response::Type::GetContainers)?;
        Ok(response
            .get_containers
            .map(|g| g.containers)
            .unwrap_or_default())
    }

    /// Decodes a protobuf `Response` of type `want`.
    fn response(&self, answer: &Answer, want: response::Type) -> Result<Response, OperatorError> {
        decode_response(
            answer.call,
            &self.endpoint,
            &answer.headers,
            &answer.body,
            want,
        )
    }
}

fn decode_response(
    call: &'static str,
    endpoint: &str,
    headers: &http::HeaderMap,
    bytes: &Bytes,
    want: response::Type,
) -> Result<Response, OperatorError> {
    let unexpected = |detail: String| OperatorError::Unexpected {
        call,
        endpoint: endpoint.to_owned(),
        detail,
    };
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes());
    if content_type != Some(ContentType::Protobuf.as_str().as_bytes()) {
        return Err(unexpected(format!(
            "Content-Type {:?} instead of {}",
            content_type.map(String::from_utf8_lossy),
            ContentType::Protobuf
        )));
    }
    let answer: Response = slrp_wire::decode(ContentType::Protobuf, bytes).map_err(|source| {
        OperatorError::Decode {
            call,
            endpoint: endpoint.to_owned(),
            source: Box::new(source),
        }
    })?;
    if answer.r#type != Some(want as i32) {
        let name = answer
            .r#type
            .and_then(|t| response::Type::try_from(t).ok())
            .map_or_else(
                || format!("{:?}", answer.r#type),
                |t| t.as_str_name().to_owned(),
            );
        return Err(unexpected(format!("response type {name}")));
    }
    Ok(answer)
}

fn agent_id_of(
    endpoint: &str,
    headers: &http::HeaderMap,
    bytes: &Bytes,
) -> Result<String, OperatorError> {
    let unexpected = |detail: String| OperatorError::Unexpected {
        call: "GET_AGENT",
        endpoint: endpoint.to_owned(),
        detail,
    };
    let answer = decode_response(
        "GET_AGENT",
        endpoint,
        headers,
        bytes,
        response::Type::GetAgent,
    )?;
    let info = answer
        .get_agent
        .and_then(|get| get.agent_info)
        .ok_or_else(|| unexpected("no get_agent.agent_info".to_owned()))?;
    let id = match info.id {
        Some(id) if !id.value.is_empty() => id.value,
        _ => {
            return Err(OperatorError::NotRegistered {
                endpoint: endpoint.to_owned(),
            });
        }
    };
    slrp_types::validate_id(&id).map_err(|source| OperatorError::InvalidId {
        endpoint: endpoint.to_owned(),
        id: id.clone(),
        source,
    })?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_path_is_the_parent_path() {
        for (url, expected) in [
            (
                "http://127.0.0.1:5051",
                "http://127.0.0.1:5051/slave(1)/api/v1",
            ),
            (
                "https://agent:5051/slave(1)/api/v1/resource_provider",
                "https://agent:5051/slave(1)/api/v1",
            ),
            (
                "http://agent:5051/api/v1/resource_provider",
                "http://agent:5051/api/v1",
            ),
            (
                "unix:///run/agent.sock",
                "unix:///run/agent.sock/slave(1)/api/v1",
            ),
        ] {
            let endpoint = AgentEndpoint::parse(url).expect("valid");
            let operator = operator_endpoint(&endpoint).expect("a parent");
            assert_eq!(operator.to_string(), expected, "{url}");
        }
        let endpoint = AgentEndpoint::parse("http://agent:5051/resource_provider").expect("url");
        let error = operator_endpoint(&endpoint).expect_err("no parent");
        assert!(error.to_string().contains("/resource_provider"), "{error}");
    }
}
