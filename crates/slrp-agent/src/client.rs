//! The session worker (subscribe, read events, reconnect) and the handle for calls.

use std::borrow::Borrow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, BodyStream, Full, Limited};
use hyper::body::Incoming;
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_proto::mesos::v1::{Resource, ResourceProviderId, ResourceProviderInfo};
use slrp_types::{DisplayChain, JitterRng};
use slrp_wire::{ContentType, RecordIoDecoder};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;
use tokio_util::sync::CancellationToken;

use crate::config::AgentConfig;
use crate::error::{AgentError, ConfigError};
use crate::metrics::Metrics;
use crate::state::{ConnectionState, ReconnectPolicy};
use crate::transport::{Connection, Connector};

/// The header carrying the subscription's stream id (spec §2.2).
pub const STREAM_ID_HEADER: &str = "Mesos-Stream-Id";

/// Error bodies are read only this far: they are one line of text in Mesos.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// What the worker reports, in order, to the provider.
#[derive(Debug, Clone)]
pub enum SessionEvent {
    /// Both connections are open; SUBSCRIBE is being sent.
    Connected,
    /// The agent admitted the subscription. Calls are accepted from now on.
    Subscribed {
        /// The provider id assigned (or confirmed) by the agent; durable provider state.
        provider_id: ResourceProviderId,
        /// The stream id sent with every call of this session.
        stream_id: String,
    },
    /// An event after SUBSCRIBED, in stream order.
    Event(Box<Event>),
    /// The session ended; the worker reconnects after a backoff.
    Disconnected {
        /// Why.
        reason: Arc<AgentError>,
    },
}

/// How many connections status updates may use at once (the first is the session's calls
/// connection; the others are opened only when every open one is busy).
pub const MAX_CALL_CONNECTIONS: usize = 4;

/// What calls need from the current session.
struct CallSession {
    stream_id: String,
    provider_id: ResourceProviderId,
    // HTTP/1 carries one request at a time and hyper does not pipeline, so one connection
    // makes every status update wait for the agent's answer to the one before (Mesos
    // pipelines them on its one connection instead). Status updates of different operations
    // are independent (each stream has one update in flight), so they share out over up to
    // MAX_CALL_CONNECTIONS; every other call (UPDATE_STATE, UPDATE_PUBLISH_RESOURCES_STATUS)
    // takes `order` exclusively, so it reaches the agent after the updates sent before it and
    // before those sent after it, as on one connection.
    conns: tokio::sync::Mutex<Pool>,
    order: tokio::sync::RwLock<()>,
    lost: CancellationToken,
}

/// The session's calls connections, and how many more are being opened (they count
/// against [`MAX_CALL_CONNECTIONS`] already).
struct Pool {
    open: Vec<Arc<tokio::sync::Mutex<Connection>>>,
    opening: usize,
}

impl CallSession {
    fn new(
        stream_id: String,
        provider_id: ResourceProviderId,
        first: Connection,
        lost: CancellationToken,
    ) -> Self {
        Self {
            stream_id,
            provider_id,
            conns: tokio::sync::Mutex::new(Pool {
                open: vec![Arc::new(tokio::sync::Mutex::new(first))],
                opening: 0,
            }),
            order: tokio::sync::RwLock::new(()),
            lost,
        }
    }

    /// An idle connection, a new one while there are fewer than [`MAX_CALL_CONNECTIONS`],
    /// or else the first to become idle.
    async fn connection(
        &self,
        shared: &Shared,
    ) -> Result<tokio::sync::OwnedMutexGuard<Connection>, AgentError> {
        let busy = {
            let mut pool = self.conns.lock().await;
            let idle = pool
                .open
                .iter()
                .find_map(|c| Arc::clone(c).try_lock_owned().ok());
            if let Some(idle) = idle {
                return Ok(idle);
            }
            let full = pool.open.len() + pool.opening >= MAX_CALL_CONNECTIONS;
            if !full {
                pool.opening += 1;
            }
            full.then(|| pool.open.clone())
        };
        match busy {
            Some(conns) => {
                let waits = conns.into_iter().map(|c| Box::pin(c.lock_owned()));
                Ok(futures_util::future::select_all(waits).await.0)
            }
            None => {
                let opened = shared.connector.connect(&shared.config).await;
                let mut pool = self.conns.lock().await;
                pool.opening -= 1;
                let conn = Arc::new(tokio::sync::Mutex::new(opened?));
                let Ok(guard) = Arc::clone(&conn).try_lock_owned() else {
                    unreachable!("a connection nobody else has seen is not locked")
                };
                pool.open.push(conn);
                Ok(guard)
            }
        }
    }
}

struct Shared {
    config: AgentConfig,
    connector: Connector,
    state: watch::Sender<ConnectionState>,
    session: Mutex<Option<Arc<CallSession>>>,
    metrics: Metrics,
}

/// Sends calls on the current session. Cheap to clone.
#[derive(Clone)]
pub struct AgentHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("endpoint", &self.shared.config.endpoint)
            .field("state", &*self.shared.state.borrow())
            .finish()
    }
}

/// Entry point: [`AgentClient::spawn`].
#[derive(Debug)]
pub struct AgentClient;

impl AgentClient {
    /// Validates `config`, loads the TLS trust roots for `https://` (blocking file reads),
    /// and starts the session worker, which connects, subscribes with
    /// `info` (its `id` replaced by `provider_id` when one is known) and keeps doing so
    /// until `cancel` fires or the event receiver is dropped.
    ///
    /// # Errors
    /// [`ConfigError`] for an unusable configuration.
    pub fn spawn(
        config: AgentConfig,
        info: ResourceProviderInfo,
        provider_id: Option<ResourceProviderId>,
        metrics: Metrics,
        cancel: CancellationToken,
    ) -> Result<(AgentHandle, mpsc::Receiver<SessionEvent>), ConfigError> {
        config.validate()?;
        let connector = Connector::new(&config)?;
        let (events_tx, events_rx) = mpsc::channel(config.event_buffer);
        let shared = Arc::new(Shared {
            state: watch::Sender::new(ConnectionState::Disconnected { failures: 0 }),
            session: Mutex::new(None),
            metrics,
            connector,
            config,
        });
        let worker = Worker {
            shared: Arc::clone(&shared),
            info,
            provider_id,
            events: events_tx,
            cancel,
        };
        tokio::spawn(worker.run());
        Ok((AgentHandle { shared }, events_rx))
    }
}

impl AgentHandle {
    /// The connection state, observable for readiness and status reports.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.shared.state.subscribe()
    }

    /// Sends a non-SUBSCRIBE call with the session's stream id, filling in the provider id
    /// when the caller left it out. Returns when the agent accepted it (202).
    ///
    /// # Errors
    /// [`AgentError::NotSubscribed`] before SUBSCRIBED (nothing is sent);
    /// [`AgentError::Rejected`] for a 4xx answer (the body names the reason);
    /// transient errors for 503 and transport failures, which also end the session.
    pub async fn call(&self, call: Call) -> Result<(), AgentError> {
        let encoded = self.encode::<Resource>(call, &[])?;
        self.send(encoded).await
    }

    /// An UPDATE_STATE `call` (its `resources` left empty) encoded with `resources` in
    /// them, for [`Self::send`]: the same bytes as the call holding them, without the
    /// copy of a large total the call would need. Encoded for the current session, as
    /// [`Self::call`] encodes.
    ///
    /// # Errors
    /// [`AgentError::NotSubscribed`] before SUBSCRIBED; [`AgentError::NotAnUpdateState`]
    /// if, with `resources`, the call is not an UPDATE_STATE or holds resources itself;
    /// [`AgentError::Encode`] if it does not render in the configured content type.
    pub fn encode_update_state<R: Borrow<Resource>>(
        &self,
        call: Call,
        resources: &[R],
    ) -> Result<EncodedCall, AgentError> {
        self.encode(call, resources)
    }

    fn encode<R: Borrow<Resource>>(
        &self,
        mut call: Call,
        resources: &[R],
    ) -> Result<EncodedCall, AgentError> {
        let name = call_name(&call);
        if call.r#type == Some(call::Type::Subscribe as i32) {
            return Err(AgentError::SubscribeCall);
        }
        let session = self
            .shared
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(session) = session else {
            return Err(AgentError::NotSubscribed {
                call: name,
                state: self.shared.state.borrow().name(),
            });
        };
        if call.resource_provider_id.is_none() {
            call.resource_provider_id = Some(session.provider_id.clone());
        }
        let independent = call.r#type == Some(call::Type::UpdateOperationStatus as i32);
        // Encoded up front and the message dropped: an UPDATE_STATE holds a copy of the
        // whole total, several times the size of its encoding, and the exchange may wait
        // long for the agent's answer.
        let body = if resources.is_empty() {
            encode_call(&self.shared.config, &call)?
        } else {
            let protobuf = update_state_protobuf(call, resources).map_err(|problem| {
                AgentError::NotAnUpdateState {
                    call: name,
                    problem,
                }
            })?;
            match self.shared.config.content_type {
                ContentType::Protobuf => protobuf,
                ContentType::Json => slrp_wire::json::protobuf_to_vec::<Call>(&protobuf)
                    .map_err(|source| AgentError::Encode { call: name, source })?,
            }
        };
        Ok(EncodedCall {
            name,
            independent,
            session,
            body,
        })
    }

    /// Sends a call [`Self::encode_update_state`] encoded, on the session it was encoded
    /// for. Returns when the agent accepted it (202).
    ///
    /// # Errors
    /// As [`Self::call`]; [`AgentError::SessionEnded`] if that session is over.
    pub async fn send(&self, call: EncodedCall) -> Result<(), AgentError> {
        let EncodedCall {
            name,
            independent,
            session,
            body,
        } = call;
        let config = &self.shared.config;
        self.shared.metrics.call_sent(body.len());
        let exchange = async {
            // Held for the whole exchange (see `CallSession`).
            let (_shared, _exclusive);
            if independent {
                _shared = session.order.read().await;
            } else {
                _exclusive = session.order.write().await;
            }
            let mut conn = session.connection(&self.shared).await?;
            let response = send(&mut conn, config, body, Some(&session.stream_id)).await?;
            let status = response.status();
            let body = read_error_body(response).await?;
            Ok::<_, AgentError>((status, body))
        };
        let outcome = tokio::select! {
            // Whatever the answer would be, it cannot count once the session is gone.
            () = session.lost.cancelled() => Err(AgentError::SessionEnded),
            answer = tokio::time::timeout(config.call_timeout, exchange) => match answer {
                Ok(outcome) => outcome,
                Err(_) => Err(AgentError::Timeout {
                    what: "a call to the agent",
                    timeout: config.call_timeout,
                }),
            },
        };
        self.shared.metrics.calls.inc();
        let (status, body) = match outcome {
            Ok(answer) => answer,
            Err(error) => {
                // A broken calls connection ends the session (Mesos does the same).
                session.lost.cancel();
                self.shared.metrics.call_failures.inc();
                return Err(error);
            }
        };
        let result = match status {
            StatusCode::ACCEPTED => Ok(()),
            s if s == StatusCode::SERVICE_UNAVAILABLE || s == StatusCode::NOT_FOUND => {
                Err(AgentError::Unavailable { status, body })
            }
            s if s.is_client_error() => {
                self.shared.metrics.calls_refused.inc();
                Err(AgentError::Rejected { status, body })
            }
            s => Err(AgentError::Protocol {
                detail: format!("{s} to a {name} call: {body:?}"),
            }),
        };
        if result.is_err() {
            self.shared.metrics.call_failures.inc();
        }
        result
    }
}

fn call_name(call: &Call) -> &'static str {
    call.r#type
        .and_then(|t| call::Type::try_from(t).ok())
        .map_or("UNKNOWN", |t| t.as_str_name())
}

/// A call encoded for the wire by [`AgentHandle::encode_update_state`], bound to the
/// session it was encoded for.
pub struct EncodedCall {
    name: &'static str,
    independent: bool,
    session: Arc<CallSession>,
    body: Vec<u8>,
}

impl EncodedCall {
    /// The body's size in bytes, what a body limit compares.
    #[must_use]
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether the body is empty (never for a call this crate encoded).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

impl std::fmt::Debug for EncodedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncodedCall")
            .field("call", &self.name)
            .field("bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// The protobuf encoding of the UPDATE_STATE `call` with `resources` as its
/// `update_state.resources`, byte for byte what prost gives for the call holding them
/// (fields in number order), written without that call: `update_state` (field 5) is the
/// last field an UPDATE_STATE has, so it is appended to the rest of the call, its
/// length computed from its three fields.
fn update_state_protobuf<R: Borrow<Resource>>(
    mut call: Call,
    resources: &[R],
) -> Result<Vec<u8>, &'static str> {
    use prost::Message as _;
    use prost::encoding::{
        WireType, encode_key, encode_varint, encoded_len_varint, key_len, message,
    };
    if call.r#type != Some(call::Type::UpdateState as i32) {
        return Err("not an UPDATE_STATE call");
    }
    if call.update_publish_resources_status.is_some() {
        return Err("the call has a field after update_state");
    }
    let state = call
        .update_state
        .take()
        .ok_or("the call has no update_state")?;
    if !state.resources.is_empty() {
        return Err("the call holds resources of its own");
    }
    let inner = message::encoded_len_repeated(1, &state.operations)
        + resources
            .iter()
            .map(|r| message::encoded_len(2, r.borrow()))
            .sum::<usize>()
        + message::encoded_len(3, &state.resource_version_uuid);
    let total = call.encoded_len() + key_len(5) + encoded_len_varint(inner as u64) + inner;
    let mut buf = Vec::with_capacity(total);
    call.encode_raw(&mut buf);
    encode_key(5, WireType::LengthDelimited, &mut buf);
    encode_varint(inner as u64, &mut buf);
    for operation in &state.operations {
        message::encode(1, operation, &mut buf);
    }
    for resource in resources {
        message::encode(2, resource.borrow(), &mut buf);
    }
    message::encode(3, &state.resource_version_uuid, &mut buf);
    Ok(buf)
}

/// `call` in the configured content type.
fn encode_call(config: &AgentConfig, call: &Call) -> Result<Vec<u8>, AgentError> {
    slrp_wire::encode(config.content_type, call).map_err(|source| AgentError::Encode {
        call: call_name(call),
        source,
    })
}

/// Sends an encoded call on `conn`, returning the answer's head and body.
async fn send(
    conn: &mut Connection,
    config: &AgentConfig,
    body: Vec<u8>,
    stream_id: Option<&str>,
) -> Result<Response<Incoming>, AgentError> {
    let request = build_request(config, body, stream_id);
    conn.sender.ready().await.map_err(AgentError::Http)?;
    conn.sender
        .send_request(request)
        .await
        .map_err(AgentError::Http)
}

pub(crate) fn build_request(
    config: &AgentConfig,
    body: Vec<u8>,
    stream_id: Option<&str>,
) -> Request<Full<Bytes>> {
    let media = HeaderValue::from_static(config.content_type.as_str());
    let mut request = Request::new(Full::new(Bytes::from(body)));
    *request.method_mut() = Method::POST;
    // The path was checked when the URL was parsed; a bad one fails the request instead.
    *request.uri_mut() = config
        .endpoint
        .path()
        .parse()
        .unwrap_or_else(|_| http::Uri::from_static("/"));
    let headers = request.headers_mut();
    if let Ok(host) = HeaderValue::from_str(&config.endpoint.host_header()) {
        headers.insert(header::HOST, host);
    }
    headers.insert(header::CONTENT_TYPE, media.clone());
    // Exactly one media type: an Accept that also admitted JSON would get a JSON stream.
    headers.insert(header::ACCEPT, media);
    // The token was checked by `AgentConfig::validate`.
    if let Some(mut value) = config
        .token
        .as_ref()
        .and_then(|t| HeaderValue::from_str(&format!("Bearer {}", t.expose())).ok())
    {
        value.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, value);
    }
    if let Some(id) = stream_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        headers.insert(STREAM_ID_HEADER, id);
    }
    request
}

async fn read_error_body(response: Response<Incoming>) -> Result<String, AgentError> {
    let bytes = read_body(response.into_body(), MAX_ERROR_BODY).await?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A whole answer body of at most `limit` bytes.
pub(crate) async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, AgentError> {
    let collected = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|error| match error.downcast::<hyper::Error>() {
            Ok(e) => AgentError::Http(*e),
            Err(e) => AgentError::Protocol {
                detail: format!("answer body: {e}"),
            },
        })?;
    Ok(collected.to_bytes())
}

type EventFrames = FramedRead<
    StreamReader<futures_util::stream::BoxStream<'static, std::io::Result<Bytes>>, Bytes>,
    RecordIoDecoder,
>;

struct Worker {
    shared: Arc<Shared>,
    info: ResourceProviderInfo,
    provider_id: Option<ResourceProviderId>,
    events: mpsc::Sender<SessionEvent>,
    cancel: CancellationToken,
}

/// How a session ended.
enum End {
    Stop,
    Failed {
        error: AgentError,
        subscribed_for: Option<Duration>,
    },
}

impl Worker {
    async fn run(mut self) {
        let config = self.shared.config.clone();
        let mut policy = ReconnectPolicy::new(config.backoff, config.backoff_reset_after);
        let mut jitter = JitterRng::new(config.jitter);
        let mut delay = Duration::ZERO;
        loop {
            if !delay.is_zero() {
                tokio::select! {
                    () = self.cancel.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            match self.session(&config).await {
                End::Stop => break,
                End::Failed {
                    error,
                    subscribed_for,
                } => {
                    *self
                        .shared
                        .session
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                    delay = policy.after_session(subscribed_for, &mut jitter);
                    self.shared
                        .state
                        .send_replace(ConnectionState::Disconnected {
                            failures: policy.failures(),
                        });
                    self.shared.metrics.reconnects.inc();
                    tracing::warn!(
                        endpoint = %config.endpoint,
                        error = %DisplayChain(&error),
                        retry_in = ?delay,
                        "agent session ended"
                    );
                    let reason = Arc::new(error);
                    if self
                        .events
                        .send(SessionEvent::Disconnected { reason })
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        *self
            .shared
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.shared.state.send_replace(ConnectionState::Stopped);
    }

    async fn session(&mut self, config: &AgentConfig) -> End {
        let cancel = self.cancel.clone();
        tokio::select! {
            () = cancel.cancelled() => End::Stop,
            end = self.session_inner(config) => end,
        }
    }

    async fn session_inner(&mut self, config: &AgentConfig) -> End {
        let failed = |error| End::Failed {
            error,
            subscribed_for: None,
        };
        self.shared.metrics.subscribe_attempts.inc();
        self.shared.state.send_replace(ConnectionState::Connecting);
        let (stream_conn, calls_conn) = match tokio::try_join!(
            self.shared.connector.connect(config),
            self.shared.connector.connect(config)
        ) {
            Ok(pair) => pair,
            Err(error) => return failed(error),
        };
        if self.events.send(SessionEvent::Connected).await.is_err() {
            return End::Stop;
        }
        self.shared.state.send_replace(ConnectionState::Subscribing);
        let deadline = Instant::now() + config.subscribe_timeout;
        let timeout = || AgentError::Timeout {
            what: "subscribing to the agent",
            timeout: config.subscribe_timeout,
        };
        let subscribed =
            tokio::time::timeout_at(deadline, self.subscribe(config, stream_conn)).await;
        let (mut frames, stream_id, provider_id, _stream_conn) = match subscribed {
            Err(_) => return failed(timeout()),
            Ok(Err(error)) => return failed(error),
            Ok(Ok(s)) => s,
        };
        self.provider_id = Some(provider_id.clone());
        let lost = CancellationToken::new();
        // However the session ends, calls still waiting on it fail at once.
        let _fail_pending_calls = lost.clone().drop_guard();
        *self
            .shared
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(CallSession::new(
            stream_id.clone(),
            provider_id.clone(),
            calls_conn,
            lost.clone(),
        )));
        self.shared.state.send_replace(ConnectionState::Subscribed {
            stream_id: stream_id.clone(),
            provider_id: provider_id.value.clone(),
        });
        tracing::info!(provider_id = %provider_id.value, %stream_id, "subscribed to the agent");
        let since = Instant::now();
        if self
            .events
            .send(SessionEvent::Subscribed {
                provider_id,
                stream_id,
            })
            .await
            .is_err()
        {
            return End::Stop;
        }
        let error = loop {
            let next = tokio::select! {
                () = lost.cancelled() => break AgentError::CallsConnectionLost,
                next = frames.next() => next,
            };
            match next {
                None => break AgentError::StreamClosed,
                Some(Err(error)) => break AgentError::Stream(error),
                Some(Ok(record)) => {
                    let Some(event) = self.decode(config.content_type, &record) else {
                        continue;
                    };
                    self.shared.metrics.events.inc();
                    if self
                        .events
                        .send(SessionEvent::Event(Box::new(event)))
                        .await
                        .is_err()
                    {
                        return End::Stop;
                    }
                }
            }
        };
        End::Failed {
            error,
            subscribed_for: Some(since.elapsed()),
        }
    }

    /// Sends SUBSCRIBE and reads up to the SUBSCRIBED event. The connection is returned so
    /// that it lives as long as the stream.
    async fn subscribe(
        &self,
        config: &AgentConfig,
        mut conn: Connection,
    ) -> Result<(EventFrames, String, ResourceProviderId, Connection), AgentError> {
        let mut info = self.info.clone();
        if let Some(id) = &self.provider_id {
            info.id = Some(id.clone());
        }
        let call = Call {
            r#type: Some(call::Type::Subscribe as i32),
            subscribe: Some(call::Subscribe {
                resource_provider_info: info,
            }),
            ..Call::default()
        };
        let response = send(&mut conn, config, encode_call(config, &call)?, None).await?;
        let status = response.status();
        match status {
            StatusCode::OK => {}
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::NOT_FOUND => {
                let body = read_error_body(response).await?;
                return Err(AgentError::Unavailable { status, body });
            }
            _ => {
                let body = read_error_body(response).await?;
                return Err(AgentError::Protocol {
                    detail: format!("{status} to SUBSCRIBE: {body:?}"),
                });
            }
        }
        let stream_id = check_stream_headers(config.content_type, response.headers())?;
        let body = BodyStream::new(response.into_body())
            .filter_map(|frame| async move {
                match frame {
                    Ok(frame) => frame.into_data().ok().map(Ok),
                    Err(error) => Some(Err(std::io::Error::other(error))),
                }
            })
            .boxed();
        let mut frames = FramedRead::new(
            StreamReader::new(body),
            RecordIoDecoder::new(config.max_record_len),
        );
        loop {
            let record = match frames.next().await {
                None => return Err(AgentError::NotAdmitted),
                Some(Err(error)) => return Err(AgentError::Stream(error)),
                Some(Ok(record)) => record,
            };
            let Some(event) = self.decode(config.content_type, &record) else {
                continue;
            };
            match event.subscribed {
                Some(event::Subscribed { provider_id })
                    if event.r#type == Some(event::Type::Subscribed as i32) =>
                {
                    return Ok((frames, stream_id, provider_id, conn));
                }
                _ => {
                    // The manager sends SUBSCRIBED first; anything earlier cannot be acted
                    // on without a provider id.
                    tracing::warn!(event_type = ?event.r#type, "agent event before SUBSCRIBED ignored");
                }
            }
        }
    }

    fn decode(&self, content_type: ContentType, record: &Bytes) -> Option<Event> {
        match slrp_wire::decode::<Event>(content_type, record) {
            Ok(event) => Some(event),
            Err(error) => {
                self.shared.metrics.undecodable_records.inc();
                tracing::warn!(
                    len = record.len(),
                    error = %DisplayChain(&error),
                    "undecodable agent event skipped"
                );
                None
            }
        }
    }
}

fn check_stream_headers(expected: ContentType, headers: &HeaderMap) -> Result<String, AgentError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(ContentType::from_header);
    if media != Some(expected) {
        return Err(AgentError::Protocol {
            detail: format!(
                "SUBSCRIBE answered with Content-Type {:?}, expected {expected}",
                headers.get(header::CONTENT_TYPE)
            ),
        });
    }
    headers
        .get(STREAM_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| AgentError::Protocol {
            detail: format!("SUBSCRIBE answer has no {STREAM_ID_HEADER} header"),
        })
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use slrp_proto::mesos::v1::value::{Scalar, Type as ValueType};
    use slrp_proto::mesos::v1::{Operation, Uuid};

    use super::*;

    fn resource(i: usize) -> Resource {
        Resource {
            provider_id: Some(ResourceProviderId {
                value: "rp-1".into(),
            }),
            name: "disk".into(),
            r#type: ValueType::Scalar as i32,
            // Sizes that make lengths of one, two and three varint bytes.
            role: Some("r".repeat(i % 3 * 100 + i % 7)),
            scalar: Some(Scalar {
                value: i as f64 * 1.5,
            }),
            ..Resource::default()
        }
    }

    fn update_state(resources: Vec<Resource>, operations: usize) -> Call {
        Call {
            resource_provider_id: Some(ResourceProviderId {
                value: "rp-1".into(),
            }),
            r#type: Some(call::Type::UpdateState as i32),
            update_state: Some(call::UpdateState {
                operations: (0..operations)
                    .map(|i| Operation {
                        uuid: Uuid {
                            value: vec![u8::try_from(i).unwrap(); 16],
                        },
                        ..Operation::default()
                    })
                    .collect(),
                resources,
                resource_version_uuid: Uuid { value: vec![7; 16] },
            }),
            ..Call::default()
        }
    }

    #[test]
    fn update_state_is_encoded_apart_byte_for_byte() {
        for (count, operations) in [(1, 0), (3, 2), (200, 5), (2_000, 0)] {
            let resources: Vec<Resource> = (0..count).map(resource).collect();
            let whole = update_state(resources.clone(), operations);
            let apart =
                update_state_protobuf(update_state(Vec::new(), operations), &resources).unwrap();
            assert_eq!(apart, whole.encode_to_vec(), "{count} resources");
            // Shared entries, as a provider's total holds them.
            let shared: Vec<Arc<Resource>> = resources.iter().cloned().map(Arc::new).collect();
            let from_shared =
                update_state_protobuf(update_state(Vec::new(), operations), &shared).unwrap();
            assert_eq!(from_shared, apart);
            assert_eq!(
                slrp_wire::json::protobuf_to_vec::<Call>(&apart).unwrap(),
                slrp_wire::json::to_vec(&whole).unwrap(),
                "{count} resources, JSON"
            );
        }
    }

    #[test]
    fn only_an_update_state_without_resources_is_encoded_apart() {
        let resources = [resource(1)];
        let mut status = update_state(Vec::new(), 0);
        status.r#type = Some(call::Type::UpdateOperationStatus as i32);
        let holding = update_state(vec![resource(2)], 0);
        let mut without = update_state(Vec::new(), 0);
        without.update_state = None;
        let mut after = update_state(Vec::new(), 0);
        after.update_publish_resources_status = Some(call::UpdatePublishResourcesStatus::default());
        for (call, problem) in [
            (status, "not an UPDATE_STATE call"),
            (holding, "the call holds resources of its own"),
            (without, "the call has no update_state"),
            (after, "the call has a field after update_state"),
        ] {
            assert_eq!(update_state_protobuf(call, &resources), Err(problem));
        }
    }
}
