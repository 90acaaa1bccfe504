//! The agent operator API subset on `/slave(1)/api/v1`, the parent path of the resource
//! provider endpoint (spec §2.1): `GET_AGENT`, and the standalone container calls
//! `LAUNCH_CONTAINER`, `WAIT_CONTAINER`, `KILL_CONTAINER`, `REMOVE_CONTAINER` and
//! `GET_CONTAINERS` that a Mesos SLRP runs its plugins with (spec §4.1).
//!
//! A provider learns its agent's ID through GET_AGENT (the resource provider API never
//! tells it, spec §3.6), and keys its durable identity by it. The checks and their texts
//! follow the agent's `Http::api` (`src/slave/http.cpp`) in its order, then the call's
//! validation (`src/slave/validation.cpp`), then its authorization (`403`); every other
//! call is answered `501`, as the agent answers `UNKNOWN`, so a provider that relies on
//! more of the operator API fails here instead of in production.

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use slrp_proto::mesos::v1::agent::{Call, Response as AgentResponse, call, response};
use slrp_proto::mesos::v1::{AgentId, AgentInfo, ContainerId, ContainerStatus};
use slrp_types::DisplayChain;
use slrp_wire::{ContentType, JsonError};

use crate::Endpoint;
use crate::containers::validate::{display_id, validate_call};
use crate::containers::{ContainerState, KillOutcome, LaunchOutcome};
use crate::server::{
    Body, Ctx, Principal, accepts, empty, exact_content_type, no_content_type, read_body,
    refuse_non_post, text,
};
use crate::worker::ManagerMessage;

/// `SIGKILL`: KILL_CONTAINER's default signal (http.cpp).
const SIGKILL: i32 = 9;

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

pub(crate) async fn respond(
    request: Request<Incoming>,
    ctx: &Ctx,
    principal: &Principal,
) -> Response<Body> {
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
    if let Err(reason) = validate_call(&call, kind) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("Failed to validate agent::Call: {reason}"),
        );
    }
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
        call::Type::GetContainers => get_containers(&call, ctx, principal, accept).await,
        call::Type::LaunchContainer => launch_container(call, ctx, principal).await,
        call::Type::WaitContainer => wait_container(&call, ctx, principal, accept).await,
        call::Type::KillContainer => kill_container(&call, ctx, principal).await,
        call::Type::RemoveContainer => remove_container(&call, ctx, principal).await,
        other => text(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "{} is not served by the embedded manager (only GET_AGENT, GET_CONTAINERS, LAUNCH_CONTAINER, WAIT_CONTAINER, KILL_CONTAINER, REMOVE_CONTAINER)",
                other.as_str_name()
            ),
        ),
    }
}

/// The root of a (possibly nested) container ID: what the authorizer and the container
/// registry key by.
fn root_of(id: &ContainerId) -> &ContainerId {
    id.parent.as_deref().map_or(id, root_of)
}

fn stopped() -> Response<Body> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "The embedded manager is shutting down",
    )
}

fn forbidden() -> Response<Body> {
    empty(StatusCode::FORBIDDEN)
}

/// `200` with a serialized response, or `500` if it cannot be serialized.
fn answer(accept: ContentType, answer: &AgentResponse, what: &str) -> Response<Body> {
    match slrp_wire::encode(accept, answer) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(accept.as_str()));
            response
        }
        Err(error) => {
            tracing::error!(error = %DisplayChain(&error), "encoding the {what} response");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Failed to serialize the {what} response: {error}"),
            )
        }
    }
}

async fn launch_container(call: Call, ctx: &Ctx, principal: &Principal) -> Response<Body> {
    // Validation guarantees the payload.
    let Some(launch) = call.launch_container else {
        return text(
            StatusCode::BAD_REQUEST,
            "Expecting 'launch_container' to be present",
        );
    };
    if !principal.may_use_container(&root_of(&launch.container_id).value) {
        return forbidden();
    }
    match ctx.containers.launch(launch).await {
        None => stopped(),
        Some(LaunchOutcome::Launched) => empty(StatusCode::OK),
        Some(LaunchOutcome::AlreadyLaunched) => empty(StatusCode::ACCEPTED),
        Some(LaunchOutcome::NotSupported) => text(
            StatusCode::BAD_REQUEST,
            "The provided ContainerInfo is not supported",
        ),
        Some(LaunchOutcome::Failed(reason)) => text(StatusCode::BAD_REQUEST, reason),
        Some(LaunchOutcome::Sandbox(reason)) => text(StatusCode::INTERNAL_SERVER_ERROR, reason),
    }
}

async fn wait_container(
    call: &Call,
    ctx: &Ctx,
    principal: &Principal,
    accept: ContentType,
) -> Response<Body> {
    let Some(wait) = &call.wait_container else {
        return text(
            StatusCode::BAD_REQUEST,
            "Expecting 'wait_container' to be present",
        );
    };
    let id = &wait.container_id;
    if !principal.may_use_container(&root_of(id).value) {
        return forbidden();
    }
    let termination = if id.parent.is_some() {
        // No nested container ever runs here.
        Some(None)
    } else {
        ctx.containers.wait(&id.value).await
    };
    match termination {
        None => stopped(),
        Some(None) => text(
            StatusCode::NOT_FOUND,
            format!("Container {} cannot be found", display_id(id)),
        ),
        Some(Some(termination)) => answer(
            accept,
            &AgentResponse {
                r#type: Some(response::Type::WaitContainer as i32),
                wait_container: Some(response::WaitContainer {
                    exit_status: termination.status,
                    ..response::WaitContainer::default()
                }),
                ..AgentResponse::default()
            },
            "WAIT_CONTAINER",
        ),
    }
}

async fn kill_container(call: &Call, ctx: &Ctx, principal: &Principal) -> Response<Body> {
    let Some(kill) = &call.kill_container else {
        return text(
            StatusCode::BAD_REQUEST,
            "Expecting 'kill_container' to be present",
        );
    };
    let id = &kill.container_id;
    if !principal.may_use_container(&root_of(id).value) {
        return forbidden();
    }
    let outcome = if id.parent.is_some() {
        Some(KillOutcome::NotFound)
    } else {
        ctx.containers
            .kill(&id.value, kill.signal.unwrap_or(SIGKILL))
            .await
    };
    match outcome {
        None => stopped(),
        Some(KillOutcome::Signalled) => empty(StatusCode::OK),
        Some(KillOutcome::NotFound) => text(
            StatusCode::NOT_FOUND,
            format!(
                "Container '{}' cannot be found (or is already killed)",
                display_id(id)
            ),
        ),
        Some(KillOutcome::Failed(reason)) => text(StatusCode::INTERNAL_SERVER_ERROR, reason),
    }
}

/// A Mesos 1.11 agent removes only nested containers: `MesosContainerizerProcess::remove`
/// starts with `CHECK(containerId.has_parent())`, so REMOVE_CONTAINER of a top-level
/// container aborts the agent. Answered `500` here, and counted as a protocol violation,
/// so that a test fails if slrp ever sends one.
async fn remove_container(call: &Call, ctx: &Ctx, principal: &Principal) -> Response<Body> {
    let Some(remove) = &call.remove_container else {
        return text(
            StatusCode::BAD_REQUEST,
            "Expecting 'remove_container' to be present",
        );
    };
    let id = &remove.container_id;
    if !principal.may_use_container(&root_of(id).value) {
        return forbidden();
    }
    if id.parent.is_none() {
        let reason = format!(
            "REMOVE_CONTAINER of top-level container '{}' aborts a Mesos agent (CHECK(containerId.has_parent()) in MesosContainerizerProcess::remove)",
            id.value
        );
        tracing::error!(container_id = %id.value, "protocol violation: {reason}");
        ctx.metrics.violations.inc();
        let _ = ctx.messages.send(ManagerMessage::ProtocolViolation {
            provider_id: String::new(),
            reason: reason.clone(),
        });
        return text(StatusCode::INTERNAL_SERVER_ERROR, reason);
    }
    match ctx.containers.known(&root_of(id).value).await {
        None => stopped(),
        // The nested container itself never exists here, so there is nothing to remove.
        Some(true) => empty(StatusCode::OK),
        Some(false) => text(StatusCode::INTERNAL_SERVER_ERROR, "Unknown root container"),
    }
}

/// The standalone containers (all of this manager's are), if asked for, that the
/// principal may view (`VIEW_STANDALONE_CONTAINER`); `executor_pid` only while running.
async fn get_containers(
    call: &Call,
    ctx: &Ctx,
    principal: &Principal,
    accept: ContentType,
) -> Response<Body> {
    let show_standalone = call
        .get_containers
        .as_ref()
        .and_then(|get| get.show_standalone)
        .unwrap_or(false);
    let containers = if show_standalone {
        ctx.containers.list().await
    } else {
        Vec::new()
    };
    let containers = containers
        .into_iter()
        .filter(|view| principal.may_use_container(&view.id))
        .map(|view| {
            let container_id = ContainerId {
                value: view.id,
                parent: None,
            };
            response::get_containers::Container {
                container_status: Some(ContainerStatus {
                    container_id: Some(container_id.clone()),
                    executor_pid: match view.state {
                        ContainerState::Running => view.pid.and_then(|pid| u32::try_from(pid).ok()),
                        ContainerState::Destroying => None,
                    },
                    ..ContainerStatus::default()
                }),
                container_id,
                ..response::get_containers::Container::default()
            }
        })
        .collect();
    answer(
        accept,
        &AgentResponse {
            r#type: Some(response::Type::GetContainers as i32),
            get_containers: Some(response::GetContainers { containers }),
            ..AgentResponse::default()
        },
        "GET_CONTAINERS",
    )
}

fn get_agent(agent: &AgentInfo, accept: ContentType) -> Response<Body> {
    let response = AgentResponse {
        r#type: Some(response::Type::GetAgent as i32),
        get_agent: Some(response::GetAgent {
            agent_info: Some(agent.clone()),
            ..response::GetAgent::default()
        }),
        ..AgentResponse::default()
    };
    answer(accept, &response, "GET_AGENT")
}

/// Mesos's `deserialize<v1::agent::Call>` texts; after the prefix the parser's own words.
pub(crate) fn decode_call(content_type: ContentType, bytes: &[u8]) -> Result<Call, String> {
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
