//! The HTTP side: routing, media types, body limits and decoding (spec §2.2 steps 2–6);
//! everything that needs the manager's state is done by the worker.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, ALLOW, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use slrp_proto::mesos::v1::AgentInfo;
use slrp_proto::mesos::v1::resource_provider::{Call, call};
use slrp_types::DisplayChain;
use slrp_wire::{ContentType, JsonError};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::validation::{call_type, validate};
use crate::worker::{CallReply, Command, NewStream};

/// The path a Mesos agent serves, and the unprefixed form libprocess also routes.
pub const ENDPOINT_PATHS: [&str; 2] = [
    "/slave(1)/api/v1/resource_provider",
    "/api/v1/resource_provider",
];

/// Header carrying the subscription's stream ID.
pub const STREAM_ID_HEADER: &str = "Mesos-Stream-Id";

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) struct Ctx {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) max_body_bytes: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) event_queue: usize,
    /// What GET_AGENT answers.
    pub(crate) agent: AgentInfo,
    /// The bearer token every request must carry, if any.
    pub(crate) token: Option<crate::config::Secret>,
    /// The key of JWT bearer tokens, if any.
    pub(crate) jwt_secret: Option<crate::config::Secret>,
    /// The standalone containers of the operator API.
    pub(crate) containers: crate::containers::Containers,
    /// For protocol violations found on the operator API.
    pub(crate) metrics: crate::metrics::ManagerMetrics,
    /// For protocol violations found on the operator API.
    pub(crate) messages: tokio::sync::broadcast::Sender<crate::worker::ManagerMessage>,
}

/// Who made a request, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Principal {
    /// No authentication configured, or the plain token: an operator allowed everything.
    Operator,
    /// A JWT's claims (libprocess's `Principal::claims`).
    Claims(std::collections::BTreeMap<String, String>),
}

impl Principal {
    /// The local authorizer's implicit approver of a provider's principal: the container
    /// actions on IDs starting with its `cid_prefix` claim, nothing without the claim.
    pub(crate) fn may_use_container(&self, id: &str) -> bool {
        match self {
            Self::Operator => true,
            Self::Claims(claims) => claims
                .get("cid_prefix")
                .is_some_and(|prefix| id.starts_with(prefix.as_str())),
        }
    }
}

pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

pub(crate) async fn serve(
    listener: Listener,
    ctx: Arc<Ctx>,
    tasks: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = accept(&listener) => accepted,
        };
        match accepted {
            Ok(Accepted::Tcp(io)) => spawn_connection(io, &ctx, &tasks, &cancel),
            Ok(Accepted::Unix(io)) => spawn_connection(io, &ctx, &tasks, &cancel),
            Err(error) => {
                tracing::warn!(error = %DisplayChain(&error), "accepting a connection failed");
                // Out of file descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(listener) => Ok(Accepted::Tcp(listener.accept().await?.0)),
        Listener::Unix(listener) => Ok(Accepted::Unix(listener.accept().await?.0)),
    }
}

fn spawn_connection<IO>(io: IO, ctx: &Arc<Ctx>, tasks: &TaskTracker, cancel: &CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let ctx = Arc::clone(ctx);
    let cancel = cancel.clone();
    tasks.spawn(async move {
        let timeout = ctx.body_timeout;
        let service = hyper::service::service_fn(move |request| {
            let ctx = Arc::clone(&ctx);
            async move { Ok::<_, Infallible>(Box::pin(respond(request, &ctx)).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(timeout)
            .serve_connection(TokioIo::new(io), service);
        tokio::select! {
            result = connection => {
                if let Err(error) = result {
                    tracing::debug!(error = %DisplayChain(&error), "connection ended with an error");
                }
            }
            () = cancel.cancelled() => {}
        }
    });
}

pub(crate) fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let body: String = body.into();
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().boxed_unsync());
    *response.status_mut() = status;
    response
}

/// libprocess's realms of the two APIs (the agent's `READWRITE_HTTP_AUTHENTICATION_REALM`
/// and `RESOURCE_PROVIDER_HTTP_AUTHENTICATION_REALM`).
const OPERATOR_REALM: &str = "mesos-agent-readwrite";
const RESOURCE_PROVIDER_REALM: &str = "mesos-agent-resource-provider";

async fn respond(request: Request<Incoming>, ctx: &Ctx) -> Response<Body> {
    let path = request.uri().path();
    let realm = if crate::operator::OPERATOR_PATHS.contains(&path) {
        OPERATOR_REALM
    } else if ENDPOINT_PATHS.contains(&path) {
        RESOURCE_PROVIDER_REALM
    } else {
        return empty(StatusCode::NOT_FOUND);
    };
    // Authentication comes first, as libprocess authenticates before any handler runs.
    let principal = match authenticate(request.headers(), ctx, realm) {
        Ok(principal) => principal,
        Err(refusal) => return *refusal,
    };
    if realm == OPERATOR_REALM {
        return Box::pin(crate::operator::respond(request, ctx, &principal)).await;
    }
    if let Some(response) = refuse_non_post(&request) {
        return response;
    }
    let Some(content_type) = request.headers().get(CONTENT_TYPE) else {
        return no_content_type();
    };
    // An exact match, as on the agent: a provider sending `application/json; charset=utf-8`
    // must fail here as it would there.
    let Some(content_type) = exact_content_type(content_type) else {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expecting 'Content-Type' of application/json or application/x-protobuf",
        );
    };
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body, ctx).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let call = match decode_call(content_type, &bytes) {
        Ok(call) => call,
        Err(body) => return text(StatusCode::BAD_REQUEST, body),
    };
    if let Err(reason) = validate(&call, None) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("Failed to validate resource_provider::Call: {reason}"),
        );
    }
    if call_type(&call) == Some(call::Type::Subscribe) {
        return Box::pin(subscribe(&parts.headers, call, ctx)).await;
    }
    let stream_id = parts
        .headers
        .get(STREAM_ID_HEADER)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let (reply, answer) = oneshot::channel();
    let command = Command::Call {
        call: Box::new(call),
        stream_id,
        reply,
    };
    if ctx.commands.send(command).await.is_err() {
        return stopped();
    }
    match answer.await {
        Ok(CallReply::BadRequest(body)) => text(StatusCode::BAD_REQUEST, body),
        Ok(CallReply::NotImplemented) => empty(StatusCode::NOT_IMPLEMENTED),
        Ok(CallReply::Accepted) => empty(StatusCode::ACCEPTED),
        Err(_) => stopped(),
    }
}

/// The request's principal, or `401` with the challenge libprocess's JWT authenticator
/// sends. Without a token and a JWT secret nothing is checked; the plain token is an
/// operator; a JWT valid under the secret carries its claims.
fn authenticate(
    headers: &HeaderMap,
    ctx: &Ctx,
    realm: &str,
) -> Result<Principal, Box<Response<Body>>> {
    if ctx.token.is_none() && ctx.jwt_secret.is_none() {
        return Ok(Principal::Operator);
    }
    let challenge = |error: Option<String>| {
        let mut value = format!("Bearer realm=\"{realm}\"");
        if let Some(description) = error {
            value.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{description}\""
            ));
        }
        let mut response = text(StatusCode::UNAUTHORIZED, "401 Unauthorized.");
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(http::header::WWW_AUTHENTICATE, value);
        }
        Err(Box::new(response))
    };
    // RFC 6750 §3.1: a request without credentials gets no error details.
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return challenge(None);
    };
    let value = String::from_utf8_lossy(value.as_bytes());
    let parts: Vec<&str> = value.split(' ').collect();
    let [scheme, presented] = parts.as_slice() else {
        return challenge(Some("Malformed 'Authorization' header".to_owned()));
    };
    if *scheme != "Bearer" {
        return challenge(Some(format!("Scheme '{scheme}' unsupported")));
    }
    if let Some(token) = &ctx.token
        && constant_time_eq(presented.as_bytes(), token.expose().as_bytes())
    {
        return Ok(Principal::Operator);
    }
    let Some(secret) = &ctx.jwt_secret else {
        return challenge(Some("Invalid token".to_owned()));
    };
    match crate::jwt::verify(secret, presented) {
        Ok(claims) if claims.is_empty() => challenge(Some("JWT claims missing".to_owned())),
        Ok(claims) => Ok(Principal::Claims(claims)),
        // The error names only the token's structure, never the secret.
        Err(error) => challenge(Some(format!("Invalid JWT: {error}"))),
    }
}

/// Compares without an early exit, so the time taken does not tell how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `405` with libprocess's text for anything but `POST` (both APIs take only `POST`).
pub(crate) fn refuse_non_post<B>(request: &Request<B>) -> Option<Response<Body>> {
    if request.method() == Method::POST {
        return None;
    }
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "Expecting one of {{ 'POST' }}, but received '{}'",
            request.method()
        ),
    );
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static("POST"));
    Some(response)
}

pub(crate) fn no_content_type() -> Response<Body> {
    text(
        StatusCode::BAD_REQUEST,
        "Expecting 'Content-Type' to be present",
    )
}

/// The two media types both APIs decode, compared exactly as Mesos does.
pub(crate) fn exact_content_type(value: &HeaderValue) -> Option<ContentType> {
    match value.as_bytes() {
        b"application/x-protobuf" => Some(ContentType::Protobuf),
        b"application/json" => Some(ContentType::Json),
        _ => None,
    }
}

/// The whole request body within the configured size and time bounds, or the answer
/// (`413`, `408`, `400`) to send instead.
pub(crate) async fn read_body(body: Incoming, ctx: &Ctx) -> Result<Bytes, Response<Body>> {
    let limited = Limited::new(body, ctx.max_body_bytes).collect();
    match tokio::time::timeout(ctx.body_timeout, limited).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "Request body exceeds the limit of {} bytes",
                ctx.max_body_bytes
            ),
        )),
        Ok(Err(error)) => Err(text(
            StatusCode::BAD_REQUEST,
            format!("Failed to read the request body: {}", DisplayChain(&*error)),
        )),
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "Timed out reading the request body after {}s",
                ctx.body_timeout.as_secs_f64()
            ),
        )),
    }
}

fn stopped() -> Response<Body> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "The resource provider manager is shutting down",
    )
}

/// Spec §2.2 step 4, with Mesos's texts. The parser's own message differs from Mesos's
/// (serde_json vs picojson); the prefix is the same.
pub(crate) fn decode_call(content_type: ContentType, bytes: &[u8]) -> Result<Call, String> {
    match content_type {
        ContentType::Protobuf => slrp_wire::decode::<Call>(ContentType::Protobuf, bytes)
            .map_err(|_| "Failed to parse body into Call protobuf".to_owned()),
        ContentType::Json => {
            let value: serde_json::Value = serde_json::from_slice(bytes)
                .map_err(|error| format!("Failed to parse body into JSON: {error}"))?;
            slrp_wire::json::from_value::<Call>(value).map_err(|error| match &error {
                JsonError::Required { source, .. } => format!(
                    "Failed to convert JSON into Call protobuf: Missing required fields: {}",
                    source.path
                ),
                other => format!(
                    "Failed to convert JSON into Call protobuf: {}",
                    DisplayChain(other)
                ),
            })
        }
    }
}

async fn subscribe(headers: &HeaderMap, call: Call, ctx: &Ctx) -> Response<Body> {
    // JSON first, so that a missing Accept or `*/*` gets JSON, as on the agent.
    let content_type = if accepts(headers, ContentType::Json.as_str()) {
        ContentType::Json
    } else if accepts(headers, ContentType::Protobuf.as_str()) {
        ContentType::Protobuf
    } else {
        return text(
            StatusCode::NOT_ACCEPTABLE,
            "Expecting 'Accept' to allow 'application/x-protobuf' or 'application/json'",
        );
    };
    if headers.contains_key(STREAM_ID_HEADER) {
        return text(
            StatusCode::BAD_REQUEST,
            "Subscribe calls should not include the 'Mesos-Stream-Id' header",
        );
    }
    let Some(subscribe) = call.subscribe else {
        // Validation guarantees the payload; answer as validation would.
        return text(
            StatusCode::BAD_REQUEST,
            "Failed to validate resource_provider::Call: Expecting 'subscribe' to be present",
        );
    };
    let stream_id = Uuid::new_v4();
    let (frames, frames_rx) = mpsc::channel(ctx.event_queue);
    let (closed_tx, closed) = oneshot::channel();
    let command = Command::Subscribe {
        info: Box::new(subscribe.resource_provider_info),
        stream: NewStream {
            stream_id,
            content_type,
            frames,
            closed,
        },
    };
    if ctx.commands.send(command).await.is_err() {
        return stopped();
    }
    let events = futures_util::stream::unfold(
        (frames_rx, closed_tx),
        |(mut frames, closed_tx)| async move {
            let frame = frames.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(frame)), (frames, closed_tx)))
        },
    );
    let mut response = Response::new(StreamBody::new(events).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(content_type.as_str()),
    );
    if let Ok(value) = HeaderValue::from_str(&stream_id.to_string()) {
        headers.insert(STREAM_ID_HEADER, value);
    }
    response
}

/// Whether the `Accept` headers admit `media` (`type/subtype`): the most specific
/// matching range decides, and `q=0` excludes. No `Accept` admits everything.
pub(crate) fn accepts(headers: &HeaderMap, media: &str) -> bool {
    let mut values = headers.get_all(ACCEPT).iter().peekable();
    if values.peek().is_none() {
        return true;
    }
    let main_type = media.split('/').next().unwrap_or_default();
    let mut best: Option<(u8, bool)> = None;
    for value in values {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut fields = item.split(';');
            let range = fields
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase();
            let specificity = if range == media {
                2
            } else if range == format!("{main_type}/*") {
                1
            } else if range == "*/*" {
                0
            } else {
                continue;
            };
            let quality = fields
                .filter_map(|param| param.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, q)| q.trim().parse::<f64>().ok())
                .unwrap_or(1.0);
            if best.is_none_or(|(known, _)| specificity > known) {
                best = Some((specificity, quality > 0.0));
            }
        }
    }
    best.is_some_and(|(_, acceptable)| acceptable)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(ACCEPT, value);
        }
        headers
    }

    #[test]
    fn accept_negotiation() {
        let json = "application/json";
        let protobuf = "application/x-protobuf";
        assert!(accepts(&HeaderMap::new(), json));
        assert!(accepts(&accept("*/*"), json));
        assert!(accepts(&accept("application/*"), json));
        assert!(!accepts(&accept(protobuf), json));
        assert!(accepts(&accept(protobuf), protobuf));
        assert!(!accepts(&accept("application/json;q=0, */*"), json));
        assert!(accepts(&accept("application/json;q=0, */*"), protobuf));
        assert!(!accepts(&accept("text/plain"), protobuf));
    }
}
