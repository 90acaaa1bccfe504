//! The agent client against a scripted fake agent over loopback TCP and a unix socket.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use http::StatusCode;
use slrp_agent::{
    AgentClient, AgentError, AgentHandle, ConnectionState, Metrics, SessionEvent, Token,
};
use slrp_proto::mesos::v1::Uuid;
use slrp_proto::mesos::v1::resource_provider::{Call, Event, call, event};
use slrp_wire::ContentType;
use support::{FakeAgent, StreamWriter, WAIT, info, next_event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PROVIDER: &str = "9d4ba6fb-5b36-4a47-a5b5-5f5bd1f2b9f2";
const STREAM: &str = "2b3c4d5e-0000-4000-8000-000000000001";

fn update_state() -> Call {
    Call {
        r#type: Some(call::Type::UpdateState as i32),
        update_state: Some(call::UpdateState {
            resource_version_uuid: Uuid { value: vec![7; 16] },
            ..call::UpdateState::default()
        }),
        ..Call::default()
    }
}

fn reconcile(n: u8) -> Event {
    Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: vec![Uuid { value: vec![n; 16] }],
        }),
        ..Event::default()
    }
}

struct Client {
    handle: AgentHandle,
    events: mpsc::Receiver<SessionEvent>,
    metrics: Metrics,
    _cancel: tokio_util::sync::DropGuard,
}

fn start(config: slrp_agent::AgentConfig, provider_id: Option<&str>) -> Client {
    let metrics = Metrics::default();
    let cancel = CancellationToken::new();
    let id = provider_id.map(|v| slrp_proto::mesos::v1::ResourceProviderId { value: v.into() });
    let (handle, events) = AgentClient::spawn(config, info(), id, metrics.clone(), cancel.clone())
        .expect("valid config");
    Client {
        handle,
        events,
        metrics,
        _cancel: cancel.drop_guard(),
    }
}

/// Takes a SUBSCRIBE, checks its headers and the provider id it carries, and answers with
/// an open stream starting with SUBSCRIBED.
async fn accept_subscribe(
    agent: &mut FakeAgent,
    ct: ContentType,
    expect_id: Option<&str>,
    stream_id: &str,
) -> StreamWriter {
    let req = agent.next().await;
    assert_eq!(
        req.header("accept"),
        Some(ct.as_str()),
        "Accept admits only {ct}"
    );
    assert_eq!(
        req.header("mesos-stream-id"),
        None,
        "no stream id on SUBSCRIBE"
    );
    let call = req.call(ct);
    assert_eq!(call.r#type, Some(call::Type::Subscribe as i32));
    let info = call
        .subscribe
        .expect("subscribe payload")
        .resource_provider_info;
    assert_eq!(info.id.map(|id| id.value).as_deref(), expect_id);
    assert_eq!(info.name, "test");
    let stream = req.respond_stream(ct, stream_id);
    stream.subscribed(PROVIDER).await;
    stream
}

async fn expect_connected_and_subscribed(client: &mut Client, stream_id: &str) {
    assert!(matches!(
        next_event(&mut client.events).await,
        SessionEvent::Connected
    ));
    match next_event(&mut client.events).await {
        SessionEvent::Subscribed {
            provider_id,
            stream_id: got,
        } => {
            assert_eq!(provider_id.value, PROVIDER);
            assert_eq!(got, stream_id);
        }
        other => panic!("expected Subscribed, got {other:?}"),
    }
}

async fn expect_event(client: &mut Client) -> Event {
    match next_event(&mut client.events).await {
        SessionEvent::Event(event) => *event,
        other => panic!("expected an event, got {other:?}"),
    }
}

async fn expect_disconnected(client: &mut Client) -> std::sync::Arc<AgentError> {
    match next_event(&mut client.events).await {
        SessionEvent::Disconnected { reason } => reason,
        other => panic!("expected Disconnected, got {other:?}"),
    }
}

/// Runs one full session: SUBSCRIBE, SUBSCRIBED, an event, UPDATE_STATE with the stream id.
async fn full_session(mut agent: FakeAgent, ct: ContentType) {
    let mut config = agent.config();
    config.content_type = ct;
    config.token = Some(Token::new("s3cret"));
    let mut client = start(config, None);
    let stream = accept_subscribe(&mut agent, ct, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    stream.event(&reconcile(1)).await;
    assert_eq!(expect_event(&mut client).await, reconcile(1));

    let handle = client.handle.clone();
    let call = tokio::spawn(async move { handle.call(update_state()).await });
    let req = agent.next().await;
    assert_eq!(req.header("mesos-stream-id"), Some(STREAM));
    assert_eq!(req.header("authorization"), Some("Bearer s3cret"));
    assert_eq!(req.header("accept"), Some(ct.as_str()));
    let got = req.call(ct);
    assert_eq!(got.r#type, Some(call::Type::UpdateState as i32));
    assert_eq!(got.resource_provider_id.expect("filled in").value, PROVIDER);
    req.respond(StatusCode::ACCEPTED, "");
    call.await.expect("joined").expect("202 accepted");
    // One event-stream connection and one calls connection.
    assert_eq!(agent.connections.load(Ordering::SeqCst), 2);
    agent.assert_idle();
}

#[tokio::test]
async fn protobuf_session_over_tcp() {
    full_session(FakeAgent::tcp().await, ContentType::Protobuf).await;
}

#[tokio::test]
async fn json_session_over_a_unix_socket() {
    full_session(FakeAgent::unix(), ContentType::Json).await;
}

#[tokio::test]
async fn eof_and_a_cut_record_reconnect_and_resubscribe_with_the_provider_id() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), None);
    let stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    drop(stream);
    assert!(matches!(
        &*expect_disconnected(&mut client).await,
        AgentError::StreamClosed
    ));

    // The resubscription carries the id from SUBSCRIBED.
    let stream = accept_subscribe(&mut agent, ContentType::Protobuf, Some(PROVIDER), "s2").await;
    expect_connected_and_subscribed(&mut client, "s2").await;
    stream.raw(b"100\npartial").await;
    drop(stream);
    let reason = expect_disconnected(&mut client).await;
    assert!(
        matches!(
            &*reason,
            AgentError::Stream(slrp_wire::RecordIoError::Truncated { .. })
        ),
        "{reason:?}"
    );
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, Some(PROVIDER), "s3").await;
    expect_connected_and_subscribed(&mut client, "s3").await;
    assert_eq!(client.metrics.reconnects.get(), 2);
}

#[tokio::test]
async fn a_caller_provided_id_is_used_on_the_first_subscribe() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), Some(PROVIDER));
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, Some(PROVIDER), STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
}

#[tokio::test]
async fn an_undecodable_record_is_skipped_and_a_malformed_header_ends_the_stream() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), None);
    let stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    stream.record(b"\xff\xff\xff not protobuf").await;
    stream.event(&reconcile(2)).await;
    assert_eq!(expect_event(&mut client).await, reconcile(2));
    assert_eq!(client.metrics.undecodable_records.get(), 1);

    stream.raw(b"12x\n").await;
    let reason = expect_disconnected(&mut client).await;
    assert!(
        matches!(
            &*reason,
            AgentError::Stream(slrp_wire::RecordIoError::MalformedHeader { .. })
        ),
        "{reason:?}"
    );
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, Some(PROVIDER), "s2").await;
    expect_connected_and_subscribed(&mut client, "s2").await;
}

#[tokio::test]
async fn service_unavailable_is_retried_with_growing_waits() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), None);
    let mut arrivals = Vec::new();
    for _ in 0..4 {
        let req = agent.next().await;
        arrivals.push(Instant::now());
        req.respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "Resource provider manager is not ready",
        );
        assert!(matches!(
            next_event(&mut client.events).await,
            SessionEvent::Connected
        ));
        match &*expect_disconnected(&mut client).await {
            AgentError::Unavailable { status, body } => {
                assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE);
                assert!(body.contains("not ready"));
            }
            other => panic!("{other:?}"),
        }
    }
    // Jitter is off: the waits are exactly 20, 40, 80 ms.
    for (i, pair) in arrivals.windows(2).enumerate() {
        let floor = Duration::from_millis(20 << i);
        assert!(
            pair[1] - pair[0] >= floor,
            "wait {i} shorter than {floor:?}"
        );
    }
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    assert_eq!(client.metrics.subscribe_attempts.get(), 5);
}

#[tokio::test]
async fn a_refusing_agent_costs_a_bounded_number_of_attempts() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let endpoint = slrp_agent::AgentEndpoint::parse(&format!("http://{addr}")).expect("url");
    let mut config = support::test_config(endpoint);
    config.backoff =
        slrp_types::Backoff::new(Duration::from_millis(50), Duration::from_millis(100))
            .expect("valid");
    let mut client = start(config, None);
    let started = Instant::now();
    for _ in 0..4 {
        let reason = expect_disconnected(&mut client).await;
        assert!(matches!(&*reason, AgentError::Connect { .. }), "{reason:?}");
    }
    // Waits of 50 + 100 + 100 ms separate the four attempts: a busy loop would make
    // thousands in that time.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
    let attempts = client.metrics.subscribe_attempts.get();
    let bound = 2 + elapsed.as_millis() / 100;
    assert!(
        u128::from(attempts) <= bound,
        "{attempts} attempts in {elapsed:?}"
    );

    // The agent comes up on the same address: the client subscribes.
    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind");
    let mut agent = FakeAgent::tcp_on(listener).await;
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    loop {
        if let SessionEvent::Subscribed { .. } = next_event(&mut client.events).await {
            break;
        }
    }
}

#[tokio::test]
async fn a_silent_agent_is_detected_within_the_subscribe_timeout() {
    // Accepts connections and never reads or answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let _hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let endpoint = slrp_agent::AgentEndpoint::parse(&format!("http://{addr}")).expect("url");
    let mut config = support::test_config(endpoint);
    let bound = Duration::from_millis(300);
    config.subscribe_timeout = bound;
    let mut client = start(config, None);
    let started = Instant::now();
    assert!(matches!(
        next_event(&mut client.events).await,
        SessionEvent::Connected
    ));
    let reason = expect_disconnected(&mut client).await;
    assert!(matches!(&*reason, AgentError::Timeout { .. }), "{reason:?}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= bound && elapsed < bound + WAIT / 4,
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn a_stream_that_never_sends_subscribed_is_abandoned() {
    let mut agent = FakeAgent::unix();
    let mut config = agent.config();
    config.subscribe_timeout = Duration::from_millis(300);
    let mut client = start(config, None);
    let req = agent.next().await;
    let _stream = req.respond_stream(ContentType::Protobuf, STREAM);
    assert!(matches!(
        next_event(&mut client.events).await,
        SessionEvent::Connected
    ));
    let reason = expect_disconnected(&mut client).await;
    assert!(matches!(&*reason, AgentError::Timeout { .. }), "{reason:?}");
}

#[tokio::test]
async fn calls_are_refused_locally_before_subscribed() {
    let mut agent = FakeAgent::tcp().await;
    let client = start(agent.config(), None);
    let _held = agent.next().await.hold();
    let err = client
        .handle
        .call(update_state())
        .await
        .expect_err("not subscribed");
    assert!(
        matches!(
            err,
            AgentError::NotSubscribed {
                call: "UPDATE_STATE",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("UPDATE_STATE"), "{err}");
    assert_eq!(
        *client.handle.state().borrow(),
        ConnectionState::Subscribing
    );
    agent.assert_idle();
}

#[tokio::test]
async fn a_400_answer_is_a_permanent_error_with_the_body() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), None);
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    let handle = client.handle.clone();
    let call = tokio::spawn(async move { handle.call(update_state()).await });
    agent.next().await.respond(
        StatusCode::BAD_REQUEST,
        "Resource provider is not subscribed",
    );
    let err = tokio::time::timeout(WAIT, call)
        .await
        .expect("bounded")
        .expect("joined")
        .expect_err("400");
    assert!(!err.is_transient());
    match &err {
        AgentError::Rejected { status, body } => {
            assert_eq!(*status, StatusCode::BAD_REQUEST);
            assert_eq!(body, "Resource provider is not subscribed");
        }
        other => panic!("{other:?}"),
    }
    // A rejected call does not end the session.
    assert_eq!(client.handle.state().borrow().name(), "SUBSCRIBED");
}

#[tokio::test]
async fn a_call_in_flight_fails_at_once_when_the_stream_ends() {
    let mut agent = FakeAgent::tcp().await;
    let mut config = agent.config();
    config.call_timeout = WAIT * 2;
    let mut client = start(config, None);
    let stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    let handle = client.handle.clone();
    let call = tokio::spawn(async move { handle.call(update_state()).await });
    let _held = agent.next().await.hold();
    drop(stream);
    let err = tokio::time::timeout(WAIT, call)
        .await
        .expect("fails before the call timeout")
        .expect("joined")
        .expect_err("session ended");
    assert!(matches!(err, AgentError::SessionEnded), "{err:?}");
    assert!(err.is_transient());
    assert!(matches!(
        &*expect_disconnected(&mut client).await,
        AgentError::StreamClosed
    ));
}

#[tokio::test]
async fn https_with_a_configured_ca() {
    let (mut agent, ca_pem) = FakeAgent::tls().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).expect("write CA");
    let mut config = agent.config();
    config.ca_file = Some(ca_file);
    let mut client = start(config, None);
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
}

#[tokio::test]
async fn https_refuses_an_untrusted_certificate() {
    let (agent, _ca) = FakeAgent::tls().await;
    let (_other, other_ca) = FakeAgent::tls().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("other-ca.pem");
    std::fs::write(&ca_file, other_ca).expect("write CA");
    let mut config = agent.config();
    config.ca_file = Some(ca_file);
    let mut client = start(config, None);
    let reason = expect_disconnected(&mut client).await;
    assert!(
        matches!(&*reason, AgentError::TlsHandshake { .. }),
        "{reason:?}"
    );
    let chain = slrp_types::DisplayChain(&*reason).to_string();
    assert!(
        chain.contains("UnknownIssuer") || chain.contains("certificate"),
        "{chain}"
    );
}

#[tokio::test]
async fn a_bad_ca_file_is_a_config_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, "not a certificate").expect("write");
    let endpoint = slrp_agent::AgentEndpoint::parse("https://127.0.0.1:1").expect("url");
    let mut config = support::test_config(endpoint);
    config.ca_file = Some(ca_file.clone());
    let err = AgentClient::spawn(
        config,
        info(),
        None,
        Metrics::default(),
        CancellationToken::new(),
    )
    .expect_err("no certificate");
    assert!(
        err.to_string().contains(&ca_file.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn an_agent_that_stops_answering_calls_is_detected_within_the_call_timeout() {
    let mut agent = FakeAgent::tcp().await;
    let mut config = agent.config();
    let bound = Duration::from_millis(300);
    config.call_timeout = bound;
    let mut client = start(config, None);
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    let handle = client.handle.clone();
    let started = Instant::now();
    let call = tokio::spawn(async move { handle.call(update_state()).await });
    let _held = agent.next().await.hold();
    let err = tokio::time::timeout(WAIT, call)
        .await
        .expect("bounded")
        .expect("joined")
        .expect_err("no answer");
    assert!(matches!(err, AgentError::Timeout { .. }), "{err:?}");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= bound && elapsed < bound + WAIT / 4,
        "{elapsed:?}"
    );
    // The calls connection is unusable now, so the session ends and is rebuilt.
    let reason = expect_disconnected(&mut client).await;
    assert!(
        matches!(&*reason, AgentError::CallsConnectionLost),
        "{reason:?}"
    );
    let _stream = accept_subscribe(&mut agent, ContentType::Protobuf, Some(PROVIDER), "s2").await;
    expect_connected_and_subscribed(&mut client, "s2").await;
}

#[tokio::test]
async fn a_stream_closed_before_subscribed_means_not_admitted() {
    let mut agent = FakeAgent::tcp().await;
    let mut client = start(agent.config(), Some("unknown-id"));
    drop(
        agent
            .next()
            .await
            .respond_stream(ContentType::Protobuf, STREAM),
    );
    assert!(matches!(
        next_event(&mut client.events).await,
        SessionEvent::Connected
    ));
    let reason = expect_disconnected(&mut client).await;
    assert!(matches!(&*reason, AgentError::NotAdmitted), "{reason:?}");
    assert!(reason.is_transient());
}

fn status_update(n: u8) -> Call {
    Call {
        r#type: Some(call::Type::UpdateOperationStatus as i32),
        update_operation_status: Some(call::UpdateOperationStatus {
            operation_uuid: Uuid { value: vec![n; 16] },
            ..call::UpdateOperationStatus::default()
        }),
        ..Call::default()
    }
}

/// Nothing reaches the agent for `window` (a negative check: the code under test has had
/// the window to send what it must not).
async fn assert_nothing_arrives(agent: &mut FakeAgent, window: Duration) {
    tokio::time::sleep(window).await;
    agent.assert_idle();
}

#[tokio::test]
async fn status_updates_overlap_on_extra_connections_and_other_calls_keep_their_order() {
    let mut agent = FakeAgent::tcp().await;
    let ct = ContentType::Protobuf;
    let mut client = start(agent.config(), None);
    let _stream = accept_subscribe(&mut agent, ct, None, STREAM).await;
    expect_connected_and_subscribed(&mut client, STREAM).await;
    let spawn = |call: Call| {
        let handle = client.handle.clone();
        tokio::spawn(async move { handle.call(call).await })
    };
    let uuid = |req: &support::Incoming| {
        req.call(ct)
            .update_operation_status
            .expect("a status update")
            .operation_uuid
            .value[0]
    };

    // Updates of different operations do not wait for each other's answers: as many as
    // there are connections are at the agent at once, the rest waits for a free one.
    let max = slrp_agent::MAX_CALL_CONNECTIONS;
    let updates: Vec<_> = (0..=max as u8).map(|n| spawn(status_update(n))).collect();
    let mut held = Vec::new();
    for _ in 0..max {
        held.push(agent.next().await);
    }
    assert_eq!(agent.connections.load(Ordering::SeqCst), 1 + max);
    assert_nothing_arrives(&mut agent, Duration::from_millis(300)).await;

    // UPDATE_STATE waits for every update sent before it.
    let state = spawn(update_state());
    held.remove(0).respond(StatusCode::ACCEPTED, "");
    let last = agent.next().await;
    assert_eq!(
        last.call(ct).r#type,
        Some(call::Type::UpdateOperationStatus as i32)
    );
    let mut seen: Vec<u8> = held.iter().map(uuid).chain([uuid(&last)]).collect();
    seen.sort_unstable();
    assert_eq!(seen, (1..=max as u8).collect::<Vec<_>>());
    held.push(last);
    for req in held.drain(..max - 1) {
        req.respond(StatusCode::ACCEPTED, "");
        assert_nothing_arrives(&mut agent, Duration::from_millis(50)).await;
    }
    held.remove(0).respond(StatusCode::ACCEPTED, "");
    let state_req = agent.next().await;
    assert_eq!(
        state_req.call(ct).r#type,
        Some(call::Type::UpdateState as i32)
    );

    // And an update sent after it waits for its answer.
    let after = spawn(status_update(9));
    assert_nothing_arrives(&mut agent, Duration::from_millis(300)).await;
    state_req.respond(StatusCode::ACCEPTED, "");
    let req = agent.next().await;
    assert_eq!(uuid(&req), 9);
    req.respond(StatusCode::ACCEPTED, "");

    for call in updates.into_iter().chain([state, after]) {
        call.await.expect("joined").expect("202 accepted");
    }
    assert_eq!(agent.connections.load(Ordering::SeqCst), 1 + max);
    agent.assert_idle();
}
