//! The agent operator API subset a provider needs: `GET_AGENT`, for the agent ID.
//!
//! The resource provider API never tells a provider its agent's ID, yet the provider's
//! durable identity is keyed by it (spec §3.6, §8.6: a new agent ID is a new provider
//! identity). The operator API is the parent path of the resource provider endpoint
//! (spec §2.1: `/slave(1)/api/v1/resource_provider` → `/slave(1)/api/v1`) on the same
//! listener, so the same transport (TCP, TLS or unix socket), token and time bounds apply.

use bytes::Bytes;
use http::{StatusCode, header};
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_wire::ContentType;

use crate::client::{build_request, read_body};
use crate::config::{AgentConfig, AgentEndpoint};
use crate::error::{AgentError, ConfigError};
use crate::transport::Connector;

/// A GET_AGENT answer is one `AgentInfo` with its resources: far below this.
const MAX_RESPONSE: usize = 4 * 1024 * 1024;

/// Why the agent ID could not be learnt.
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
    #[error("GET_AGENT call to {endpoint}")]
    Request {
        /// The operator endpoint.
        endpoint: String,
        /// The cause (boxed: it is large and this path is cold).
        #[source]
        source: Box<AgentError>,
    },
    /// The agent answered with a status other than `200 OK`.
    #[error("GET_AGENT call to {endpoint} answered {status}: {body:?}")]
    Status {
        /// The operator endpoint.
        endpoint: String,
        /// The status.
        status: StatusCode,
        /// The body, as text (Mesos puts the reason there).
        body: String,
    },
    /// The answer does not decode as a `mesos.v1.agent.Response`.
    #[error("GET_AGENT call to {endpoint}: the answer is not a mesos.v1.agent.Response")]
    Decode {
        /// The operator endpoint.
        endpoint: String,
        /// The decoder's error (boxed, as above).
        #[source]
        source: Box<slrp_wire::DecodeError>,
    },
    /// The answer is a response, but not the GET_AGENT one asked for.
    #[error("GET_AGENT call to {endpoint}: unexpected answer: {detail}")]
    Unexpected {
        /// The operator endpoint.
        endpoint: String,
        /// What was wrong.
        detail: String,
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
    config.validate().map_err(OperatorError::Config)?;
    let mut operator = config.clone();
    operator.endpoint = operator_endpoint(&config.endpoint)?;
    // The answer's media type follows `Accept`; protobuf, as the reference provider.
    operator.content_type = ContentType::Protobuf;
    let endpoint = operator.endpoint.to_string();
    let request_error = |source| OperatorError::Request {
        endpoint: endpoint.clone(),
        source: Box::new(source),
    };
    let connector = Connector::new(&operator).map_err(OperatorError::Config)?;
    let mut connection = connector.connect(&operator).await.map_err(request_error)?;
    let call = Call {
        r#type: Some(call::Type::GetAgent as i32),
        ..Call::default()
    };
    let body = slrp_wire::encode(ContentType::Protobuf, &call).map_err(|source| {
        request_error(AgentError::Encode {
            call: "GET_AGENT",
            source,
        })
    })?;
    let request = build_request(&operator, body, None);
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
    let (parts, bytes) = tokio::time::timeout(operator.call_timeout, exchange)
        .await
        .map_err(|_| {
            request_error(AgentError::Timeout {
                what: "a GET_AGENT call to the agent",
                timeout: operator.call_timeout,
            })
        })?
        .map_err(request_error)?;
    if parts.status != StatusCode::OK {
        return Err(OperatorError::Status {
            endpoint,
            status: parts.status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    agent_id_of(&endpoint, &parts.headers, &bytes)
}

fn agent_id_of(
    endpoint: &str,
    headers: &http::HeaderMap,
    bytes: &Bytes,
) -> Result<String, OperatorError> {
    let unexpected = |detail: String| OperatorError::Unexpected {
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
            endpoint: endpoint.to_owned(),
            source: Box::new(source),
        }
    })?;
    if answer.r#type != Some(response::Type::GetAgent as i32) {
        let name = answer
            .r#type
            .and_then(|t| response::Type::try_from(t).ok())
            .map_or_else(
                || format!("{:?}", answer.r#type),
                |t| t.as_str_name().to_owned(),
            );
        return Err(unexpected(format!("response type {name}")));
    }
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
