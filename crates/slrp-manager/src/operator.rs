//! The agent operator API subset: `GET_AGENT` on `/slave(1)/api/v1`, the parent path of the
//! resource provider endpoint (spec §2.1).
//!
//! A provider learns its agent's ID this way (the resource provider API never tells it,
//! spec §3.6), and keys its durable identity by it. The checks and their texts follow the
//! agent's `Http::api` (`src/slave/http.cpp`) in its order; every call but `GET_AGENT` is
//! answered `501`, as the agent answers `UNKNOWN`, so a provider that relies on more of the
//! operator API fails here instead of in production.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use slrp_proto::mesos::v1::agent::{Call, Response as AgentResponse, call, response};
use slrp_proto::mesos::v1::{AgentId, AgentInfo};
use slrp_types::DisplayChain;
use slrp_wire::{ContentType, JsonError};

use crate::Endpoint;
use crate::server::{
    Body, Ctx, accepts, empty, exact_content_type, no_content_type, read_body, refuse_non_post,
    text,
};

/// The operator API paths: the agent's, and the unprefixed form libprocess also routes.
pub const OPERATOR_PATHS: [&str; 2] = ["/slave(1)/api/v1", "/api/v1"];

const RECORDIO: &str = "application/recordio";
const MESSAGE_CONTENT_TYPE: &str = "Message-Content-Type";
const MESSAGE_ACCEPT: &str = "Message-Accept";

/// What GET_AGENT reports: the configured host name, the agent ID and, on TCP, the port.
pub(crate) fn agent_info(hostname: &str, agent_id: &str, endpoint: &Endpoint) -> AgentInfo {
    AgentInfo {
        hostname: hostname.to_owned(),
        port: match endpoint {
            Endpoint::Tcp(addr) => Some(i32::from(addr.port())),
            Endpoint::Unix(_) => None,
        },
        id: Some(AgentId {
            value: agent_id.to_owned(),
        }),
        ..AgentInfo::default()
    }
}

/// The answer's media type, from `Accept` as the agent picks it (JSON first).
enum Answer {
    Plain(ContentType),
    /// Only `application/recordio` is acceptable: no call served here streams.
    Streaming,
}

pub(crate) async fn respond(request: Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    if let Some(response) = refuse_non_post(&request) {
        return response;
    }
    let headers = request.headers();
    let Some(content_type) = headers.get(CONTENT_TYPE) else {
        return no_content_type();
    };
    let Some(content_type) = exact_content_type(content_type) else {
        if content_type.as_bytes() == RECORDIO.as_bytes() {
            // The agent reads streaming requests only for ATTACH_CONTAINER_INPUT.
            return text(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Streaming 'Content-Type' {RECORDIO} is not supported by this agent"),
            );
        }
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Expecting 'Content-Type' of application/json or application/x-protobuf or {RECORDIO}"
            ),
        );
    };
    if headers.contains_key(MESSAGE_CONTENT_TYPE) {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Expecting '{MESSAGE_CONTENT_TYPE}' to be not set for non-streaming requests"),
        );
    }
    let answer = if accepts(headers, ContentType::Json.as_str()) {
        Answer::Plain(ContentType::Json)
    } else if accepts(headers, ContentType::Protobuf.as_str()) {
        Answer::Plain(ContentType::Protobuf)
    } else if accepts(headers, RECORDIO) {
        Answer::Streaming
    } else {
        return text(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "Expecting 'Accept' to allow application/json or application/x-protobuf or {RECORDIO}"
            ),
        );
    };
    if matches!(answer, Answer::Plain(_)) && headers.contains_key(MESSAGE_ACCEPT) {
        return text(
            StatusCode::NOT_ACCEPTABLE,
            format!("Expecting '{MESSAGE_ACCEPT}' to be not set for non-streaming responses"),
        );
    }
    let bytes = match read_body(request.into_body(), ctx).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let call = match decode_call(content_type, &bytes) {
        Ok(call) => call,
        Err(body) => return text(StatusCode::BAD_REQUEST, body),
    };
    // proto2 C++ keeps an unknown enum number among the unknown fields: `has_type()` is
    // false, so it counts as absent.
    let Some(kind) = call.r#type.and_then(|raw| call::Type::try_from(raw).ok()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate agent::Call: Expecting 'type' to be present",
        );
    };
    let accept = match answer {
        Answer::Plain(accept) => accept,
        Answer::Streaming => {
            return text(
                StatusCode::NOT_ACCEPTABLE,
                format!(
                    "Streaming response is not supported for {} call",
                    kind.as_str_name()
                ),
            );
        }
    };
    match kind {
        call::Type::Unknown => empty(StatusCode::NOT_IMPLEMENTED),
        call::Type::GetAgent => get_agent(&ctx.agent, accept),
        other => text(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "{} is not served by the embedded manager (only GET_AGENT)",
                other.as_str_name()
            ),
        ),
    }
}

fn get_agent(agent: &AgentInfo, accept: ContentType) -> Response<Body> {
    let answer = AgentResponse {
        r#type: Some(response::Type::GetAgent as i32),
        get_agent: Some(response::GetAgent {
            agent_info: Some(agent.clone()),
            ..response::GetAgent::default()
        }),
        ..AgentResponse::default()
    };
    match slrp_wire::encode(accept, &answer) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(accept.as_str()));
            response
        }
        Err(error) => {
            tracing::error!(error = %DisplayChain(&error), "encoding the GET_AGENT response");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to serialize the GET_AGENT response: {error}"),
            )
        }
    }
}

/// Mesos's `deserialize<v1::agent::Call>` texts; after the prefix the parser's own words.
fn decode_call(content_type: ContentType, bytes: &[u8]) -> Result<Call, String> {
    match content_type {
        ContentType::Protobuf => slrp_wire::decode::<Call>(ContentType::Protobuf, bytes)
            .map_err(|_| "Failed to parse body into a protobuf object".to_owned()),
        ContentType::Json => {
            let value: serde_json::Value = serde_json::from_slice(bytes)
                .map_err(|error| format!("Failed to parse body into JSON: {error}"))?;
            slrp_wire::json::from_value::<Call>(value).map_err(|error| match &error {
                JsonError::Required { source, .. } => {
                    format!("Missing required fields: {}", source.path)
                }
                other => DisplayChain(other).to_string(),
            })
        }
    }
}
