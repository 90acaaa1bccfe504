//! `get_agent_id`: against slrp's embedded manager (TCP and unix socket), and against the
//! scripted fake agent for the exact request and every way the answer can be wrong.

mod support;

use std::time::Duration;

use http::StatusCode;
use slrp_agent::{AgentEndpoint, OperatorError, Token, get_agent_id};
use slrp_manager::{EmbeddedManager, Endpoint, Listen, ManagerConfig};
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_proto::mesos::v1::{AgentId, AgentInfo};
use slrp_wire::ContentType;
use support::{FakeAgent, WAIT, decode_protobuf, test_config};
use tokio_util::sync::CancellationToken;

const OPERATOR_PATH: &str = "/slave(1)/api/v1";
const PROTOBUF: &str = "application/x-protobuf";

fn agent_url(endpoint: &Endpoint) -> String {
    match endpoint {
        Endpoint::Tcp(addr) => format!("http://{addr}"),
        Endpoint::Unix(path) => format!("unix://{}", path.display()),
    }
}

async fn against_the_manager(listen: Listen, agent_id: Option<&str>) {
    let mut config = ManagerConfig::new(listen);
    config.agent_id = agent_id.map(str::to_owned);
    let (manager, guard) = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect("manager");
    let endpoint = AgentEndpoint::parse(&agent_url(manager.endpoint())).expect("url");
    let id = tokio::time::timeout(WAIT, get_agent_id(&test_config(endpoint)))
        .await
        .expect("in time")
        .expect("the agent id");
    assert_eq!(id, manager.agent_id());
    if let Some(configured) = agent_id {
        assert_eq!(id, configured);
    }
    guard.shutdown().await;
}

#[tokio::test]
async fn the_embedded_manager_over_tcp() {
    let addr = "127.0.0.1:0".parse().expect("addr");
    against_the_manager(Listen::Tcp(addr), None).await;
}

#[tokio::test]
async fn the_embedded_manager_over_a_unix_socket_with_a_configured_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    against_the_manager(
        Listen::Unix(dir.path().join("agent.sock")),
        Some("0c8d3bd2-8a42-4b0c-9bb0-5f0c3c5c1d2e-S7"),
    )
    .await;
}

fn get_agent_response(id: Option<&str>) -> Vec<u8> {
    let answer = Response {
        r#type: Some(response::Type::GetAgent as i32),
        get_agent: Some(response::GetAgent {
            agent_info: Some(AgentInfo {
                hostname: "agent".to_owned(),
                id: id.map(|value| AgentId {
                    value: value.to_owned(),
                }),
                ..AgentInfo::default()
            }),
            ..response::GetAgent::default()
        }),
        ..Response::default()
    };
    slrp_wire::encode(ContentType::Protobuf, &answer).expect("encode")
}

/// Runs `get_agent_id` against the fake, lets `answer` respond to the one request after
/// checking it, and returns the outcome.
async fn exchange(
    mut fake: FakeAgent,
    token: Option<&str>,
    answer: impl FnOnce(support::Incoming),
) -> Result<String, OperatorError> {
    let mut config = fake.config();
    config.token = token.map(Token::new);
    let task = tokio::spawn(async move { get_agent_id(&config).await });
    let request = fake.next_at(OPERATOR_PATH).await;
    assert_eq!(request.header("content-type"), Some(PROTOBUF));
    assert_eq!(request.header("accept"), Some(PROTOBUF));
    let expected_auth = token.map(|token| format!("Bearer {token}"));
    assert_eq!(request.header("authorization"), expected_auth.as_deref());
    assert!(request.header("mesos-stream-id").is_none());
    let call: Call = decode_protobuf(&request.body);
    assert_eq!(call.r#type, Some(call::Type::GetAgent as i32));
    answer(request);
    let outcome = tokio::time::timeout(WAIT, task)
        .await
        .expect("in time")
        .expect("task");
    fake.assert_idle();
    outcome
}

#[tokio::test]
async fn the_request_is_protobuf_with_the_token_on_the_parent_path() {
    let outcome = exchange(FakeAgent::tcp().await, Some("s3cret"), |request| {
        request.respond_bytes(StatusCode::OK, PROTOBUF, get_agent_response(Some("a-S0")));
    })
    .await;
    assert_eq!(outcome.expect("an id"), "a-S0");
    let outcome = exchange(FakeAgent::unix(), None, |request| {
        request.respond_bytes(StatusCode::OK, PROTOBUF, get_agent_response(Some("b-S1")));
    })
    .await;
    assert_eq!(outcome.expect("an id"), "b-S1");
}

type Check = fn(&OperatorError) -> bool;
/// Name, status, media type, body, the expected error, and whether it is transient.
type WrongAnswer = (&'static str, StatusCode, &'static str, Vec<u8>, Check, bool);

#[tokio::test]
async fn wrong_answers_are_named_and_classified() {
    let cases: Vec<WrongAnswer> = vec![
        (
            "no id yet",
            StatusCode::OK,
            PROTOBUF,
            get_agent_response(None),
            |e| matches!(e, OperatorError::NotRegistered { .. }),
            true,
        ),
        (
            "empty id",
            StatusCode::OK,
            PROTOBUF,
            get_agent_response(Some("")),
            |e| matches!(e, OperatorError::NotRegistered { .. }),
            true,
        ),
        (
            "an id that is a path",
            StatusCode::OK,
            PROTOBUF,
            get_agent_response(Some("../x")),
            |e| matches!(e, OperatorError::InvalidId { id, .. } if id == "../x"),
            false,
        ),
        (
            "recovering",
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            b"Agent has not finished recovery".to_vec(),
            |e| {
                matches!(e, OperatorError::Status { status, body, .. }
                if *status == StatusCode::SERVICE_UNAVAILABLE && body == "Agent has not finished recovery")
            },
            true,
        ),
        (
            "unauthorized",
            StatusCode::UNAUTHORIZED,
            "text/plain",
            Vec::new(),
            |e| matches!(e, OperatorError::Status { status, .. } if *status == StatusCode::UNAUTHORIZED),
            false,
        ),
        (
            "not implemented",
            StatusCode::NOT_IMPLEMENTED,
            "text/plain",
            Vec::new(),
            |e| matches!(e, OperatorError::Status { .. }),
            false,
        ),
        (
            "not protobuf",
            StatusCode::OK,
            PROTOBUF,
            b"\xff\xff\xff".to_vec(),
            |e| matches!(e, OperatorError::Decode { .. }),
            false,
        ),
        (
            "JSON instead of protobuf",
            StatusCode::OK,
            "application/json",
            b"{}".to_vec(),
            |e| matches!(e, OperatorError::Unexpected { detail, .. } if detail.contains("application/json")),
            false,
        ),
        (
            "another response type",
            StatusCode::OK,
            PROTOBUF,
            slrp_wire::encode(
                ContentType::Protobuf,
                &Response {
                    r#type: Some(response::Type::GetHealth as i32),
                    ..Response::default()
                },
            )
            .expect("encode"),
            |e| matches!(e, OperatorError::Unexpected { detail, .. } if detail.contains("GET_HEALTH")),
            false,
        ),
    ];
    for (name, status, content_type, body, check, transient) in cases {
        let outcome = exchange(FakeAgent::tcp().await, None, move |request| {
            request.respond_bytes(status, content_type, body);
        })
        .await;
        let error = outcome.expect_err(name);
        assert!(check(&error), "{name}: {error:?}");
        assert_eq!(error.is_transient(), transient, "{name}: {error:?}");
        assert!(
            error.to_string().contains(OPERATOR_PATH),
            "{name}: the message names the endpoint: {error}"
        );
    }
}

#[tokio::test]
async fn a_silent_agent_is_bounded_by_the_call_timeout() {
    let mut fake = FakeAgent::tcp().await;
    let mut config = fake.config();
    config.call_timeout = Duration::from_millis(300);
    let task = tokio::spawn(async move { get_agent_id(&config).await });
    let request = fake.next_at(OPERATOR_PATH).await;
    let _held = request.hold();
    let error = tokio::time::timeout(WAIT, task)
        .await
        .expect("bounded")
        .expect("task")
        .expect_err("no answer");
    assert!(
        matches!(&error, OperatorError::Request { source, .. }
            if matches!(**source, slrp_agent::AgentError::Timeout { .. })),
        "{error:?}"
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn a_refused_connection_is_transient_and_a_pathless_url_is_not() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let endpoint = AgentEndpoint::parse(&format!("http://127.0.0.1:{port}")).expect("url");
    let error = get_agent_id(&test_config(endpoint))
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(&error, OperatorError::Request { source, .. }
            if matches!(**source, slrp_agent::AgentError::Connect { .. })),
        "{error:?}"
    );
    assert!(error.is_transient());

    let endpoint = AgentEndpoint::parse(&format!("http://127.0.0.1:{port}/rp")).expect("url");
    let error = get_agent_id(&test_config(endpoint))
        .await
        .expect_err("no parent path");
    assert!(matches!(error, OperatorError::Path { .. }), "{error:?}");
    assert!(!error.is_transient());
}

/// The client's token reaches the manager's authentication; without it the answer is a
/// permanent `401`.
#[tokio::test]
async fn the_token_is_checked_by_a_manager_that_requires_one() {
    let mut config = ManagerConfig::new(Listen::Tcp("127.0.0.1:0".parse().expect("addr")));
    config.token = Some(slrp_manager::Secret::new("s3cret"));
    let (manager, guard) = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect("manager");
    let endpoint = AgentEndpoint::parse(&agent_url(manager.endpoint())).expect("url");
    let mut client = test_config(endpoint);
    let error = get_agent_id(&client).await.expect_err("no token");
    assert!(
        matches!(&error, OperatorError::Status { status, .. } if *status == StatusCode::UNAUTHORIZED),
        "{error:?}"
    );
    assert!(!error.is_transient());
    client.token = Some(Token::new("s3cret"));
    assert_eq!(
        get_agent_id(&client).await.expect("authorized"),
        manager.agent_id()
    );
    guard.shutdown().await;
}
