//! The agent operator API subset on the parent path of the resource provider endpoint
//! (GET_AGENT here, the container calls in `containers.rs`): answers in both media types
//! over TCP and a unix socket, every refusal with the agent's status and text, the agent
//! ID's life across manager restarts, and pre-admitted providers.

mod common;

use bytes::Bytes;
use common::{Client, Transport};
use http::StatusCode;
use slrp_manager::{EmbeddedManager, ManagerConfig};
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_wire::ContentType;
use tokio_util::sync::CancellationToken;

const OPERATOR: &str = "/slave(1)/api/v1";

fn request(
    path: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> http::Request<http_body_util::Full<Bytes>> {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header("Host", "localhost");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    Client::build(builder, body)
}

/// Status, headers and the raw body (protobuf is not text).
async fn exchange(
    client: &Client,
    request: http::Request<http_body_util::Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    use http_body_util::BodyExt as _;
    let (status, headers, body, connection) = client.send_raw(request).await;
    let body = tokio::time::timeout(common::WAIT, body.collect())
        .await
        .expect("the body in time")
        .expect("a body")
        .to_bytes();
    connection.abort();
    (status, headers, body)
}

fn typed(kind: call::Type) -> Call {
    Call {
        r#type: Some(kind as i32),
        ..Call::default()
    }
}

fn encoded(ct: ContentType, call: &Call) -> Vec<u8> {
    slrp_wire::encode(ct, call).expect("encode")
}

/// GET_AGENT answers with the manager's agent ID, in the media type `Accept` asks for
/// (JSON when `Accept` is absent, as on the agent).
async fn get_agent(transport: Transport) {
    let harness = common::start(transport).await;
    let expected_id = harness.handle.agent_id().to_owned();
    assert!(expected_id.ends_with("-S0"), "{expected_id}");
    let call = typed(call::Type::GetAgent);
    for (path, ct, accept) in [
        (
            OPERATOR,
            ContentType::Protobuf,
            Some("application/x-protobuf"),
        ),
        (OPERATOR, ContentType::Json, Some("application/json")),
        (OPERATOR, ContentType::Protobuf, None),
        (
            "/api/v1",
            ContentType::Protobuf,
            Some("application/x-protobuf"),
        ),
    ] {
        let mut headers = vec![("Content-Type", ct.as_str())];
        if let Some(accept) = accept {
            headers.push(("Accept", accept));
        }
        let (status, headers, body) = exchange(
            &harness.client,
            request(path, "POST", &headers, encoded(ct, &call)),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{path} {accept:?}: {body:?}");
        let answered = accept.map_or(ContentType::Json, |_| ct);
        assert_eq!(
            headers.get("Content-Type").map(|v| v.as_bytes()),
            Some(answered.as_str().as_bytes())
        );
        let answer: Response = slrp_wire::decode(answered, &body).expect("a GET_AGENT response");
        assert_eq!(answer.r#type, Some(response::Type::GetAgent as i32));
        let info = answer
            .get_agent
            .and_then(|get| get.agent_info)
            .expect("agent_info");
        assert_eq!(info.id.map(|id| id.value).as_deref(), Some(&*expected_id));
        assert_eq!(info.hostname, "localhost");
        if let slrp_manager::Endpoint::Tcp(addr) = harness.handle.endpoint() {
            assert_eq!(info.port, Some(i32::from(addr.port())));
        }
    }
}

#[tokio::test]
async fn get_agent_tcp() {
    get_agent(Transport::Tcp).await;
}

#[tokio::test]
async fn get_agent_unix() {
    get_agent(Transport::Unix).await;
}

/// Name, method, headers, body, expected status and text.
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Vec<u8>,
    StatusCode,
    &'a str,
);

#[tokio::test]
async fn refusals_carry_the_agents_status_and_text() {
    let harness = common::start(Transport::Tcp).await;
    let pb = "application/x-protobuf";
    let json = "application/json";
    let get_agent = encoded(ContentType::Protobuf, &typed(call::Type::GetAgent));
    // Call{type: 99}: a number the enum does not know.
    let unknown_number: &[u8] = &[0x08, 99];
    let cases: Vec<Case<'_>> = vec![
        (
            "GET",
            "GET",
            vec![("Content-Type", pb)],
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "Expecting one of { 'POST' }, but received 'GET'",
        ),
        (
            "no Content-Type",
            "POST",
            vec![],
            get_agent.clone(),
            StatusCode::BAD_REQUEST,
            "Expecting 'Content-Type' to be present",
        ),
        (
            "text/plain",
            "POST",
            vec![("Content-Type", "text/plain")],
            get_agent.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expecting 'Content-Type' of application/json or application/x-protobuf or application/recordio",
        ),
        (
            "recordio request",
            "POST",
            vec![("Content-Type", "application/recordio")],
            get_agent.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Streaming 'Content-Type' application/recordio is not supported by this agent",
        ),
        (
            "Message-Content-Type on a plain request",
            "POST",
            vec![("Content-Type", pb), ("Message-Content-Type", pb)],
            get_agent.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expecting 'Message-Content-Type' to be not set for non-streaming requests",
        ),
        (
            "Accept not satisfiable",
            "POST",
            vec![("Content-Type", pb), ("Accept", "text/html")],
            get_agent.clone(),
            StatusCode::NOT_ACCEPTABLE,
            "Expecting 'Accept' to allow application/json or application/x-protobuf or application/recordio",
        ),
        (
            "Message-Accept on a plain response",
            "POST",
            vec![("Content-Type", pb), ("Accept", pb), ("Message-Accept", pb)],
            get_agent.clone(),
            StatusCode::NOT_ACCEPTABLE,
            "Expecting 'Message-Accept' to be not set for non-streaming responses",
        ),
        (
            "streaming Accept",
            "POST",
            vec![("Content-Type", pb), ("Accept", "application/recordio")],
            get_agent.clone(),
            StatusCode::NOT_ACCEPTABLE,
            "Streaming response is not supported for GET_AGENT call",
        ),
        (
            "bad protobuf",
            "POST",
            vec![("Content-Type", pb), ("Accept", pb)],
            b"MALFORMED".to_vec(),
            StatusCode::BAD_REQUEST,
            "Failed to parse body into a protobuf object",
        ),
        (
            "bad JSON",
            "POST",
            vec![("Content-Type", json)],
            b"MALFORMED".to_vec(),
            StatusCode::BAD_REQUEST,
            "Failed to parse body into JSON: expected value at line 1 column 1",
        ),
        (
            "no type",
            "POST",
            vec![("Content-Type", json)],
            b"{}".to_vec(),
            StatusCode::BAD_REQUEST,
            "Failed to validate agent::Call: Expecting 'type' to be present",
        ),
        (
            "unknown type number",
            "POST",
            vec![("Content-Type", pb), ("Accept", pb)],
            unknown_number.to_vec(),
            StatusCode::BAD_REQUEST,
            "Failed to validate agent::Call: Expecting 'type' to be present",
        ),
        (
            "UNKNOWN",
            "POST",
            vec![("Content-Type", json)],
            br#"{"type": "UNKNOWN"}"#.to_vec(),
            StatusCode::NOT_IMPLEMENTED,
            "",
        ),
        (
            "GET_STATE",
            "POST",
            vec![("Content-Type", json)],
            br#"{"type": "GET_STATE"}"#.to_vec(),
            StatusCode::NOT_IMPLEMENTED,
            "GET_STATE is not served by the embedded manager (only GET_AGENT, GET_CONTAINERS, LAUNCH_CONTAINER, WAIT_CONTAINER, KILL_CONTAINER, REMOVE_CONTAINER)",
        ),
    ];
    let mut failures = Vec::new();
    for (name, method, headers, body, status, text) in cases {
        let reply = harness
            .client
            .request(request(OPERATOR, method, &headers, body))
            .await;
        if reply.status != status || reply.body != text {
            failures.push(format!("{name}: got {} {:?}", reply.status, reply.body));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

async fn served_agent_id(client: &Client) -> String {
    let reply = client
        .request(request(
            OPERATOR,
            "POST",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json"),
            ],
            encoded(ContentType::Json, &typed(call::Type::GetAgent)),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let answer: Response =
        slrp_wire::decode(ContentType::Json, reply.body.as_bytes()).expect("json");
    answer
        .get_agent
        .and_then(|get| get.agent_info)
        .and_then(|info| info.id)
        .map(|id| id.value)
        .expect("an agent id")
}

/// The ID survives a restart on the same state dir; a configured new ID is a re-registered
/// agent, whose registry knows none of the providers admitted before.
#[tokio::test]
async fn agent_id_is_stable_until_a_new_one_is_configured() {
    let harness = common::start(Transport::Tcp).await;
    let first_id = served_agent_id(&harness.client).await;
    assert_eq!(first_id, harness.handle.agent_id());
    let mut stream = harness
        .client
        .subscribe(ContentType::Protobuf, common::info(None))
        .await;
    let provider = stream.subscribed().await;
    drop(stream);
    let state_dir = harness.dir.path().join("state");
    harness.guard.shutdown().await;

    let restart = |agent_id: Option<&str>| {
        let mut config = ManagerConfig::loopback();
        config.state_dir = Some(state_dir.clone());
        config.agent_id = agent_id.map(str::to_owned);
        EmbeddedManager::spawn(config, CancellationToken::new())
    };
    let (handle, guard) = restart(None).await.expect("restart");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    assert_eq!(served_agent_id(&client).await, first_id);
    let mut again = client
        .subscribe(ContentType::Protobuf, common::info(Some(&provider)))
        .await;
    assert_eq!(again.subscribed().await, provider, "same agent: admitted");
    drop(again);
    guard.shutdown().await;

    let new_id = "6d1a9e40-0d53-4c1e-b1c5-9a2b8c1f0e77-S1";
    let (handle, guard) = restart(Some(new_id)).await.expect("restart with a new ID");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    assert_eq!(served_agent_id(&client).await, new_id);
    assert_eq!(handle.agent_id(), new_id);
    let mut stale = client
        .subscribe(ContentType::Protobuf, common::info(Some(&provider)))
        .await;
    assert!(
        stale.next().await.is_none(),
        "a provider ID of the old agent ID is unknown: the stream closes without an event"
    );
    guard.shutdown().await;
}

#[tokio::test]
async fn an_invalid_configured_agent_id_is_refused() {
    let mut config = ManagerConfig::loopback();
    config.agent_id = Some("../escape".to_owned());
    let error = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect_err("a slash in the agent ID");
    assert!(
        slrp_types::DisplayChain(&error)
            .to_string()
            .contains("invalid characters"),
        "{}",
        slrp_types::DisplayChain(&error)
    );
}

/// With a token configured, both APIs answer `401` with libprocess's JWT authenticator
/// challenge unless the request carries `Authorization: Bearer <token>`; authentication
/// comes before any other check (a GET is `401`, not `405`).
#[tokio::test]
async fn a_configured_token_is_required_on_both_apis() {
    let harness = common::start_with(Transport::Tcp, |config| {
        config.token = Some(slrp_manager::Secret::new("s3cret"));
    })
    .await;
    let get_agent = encoded(ContentType::Protobuf, &typed(call::Type::GetAgent));
    let pb = "application/x-protobuf";
    let invalid = |realm: &str, description: &str| {
        format!(
            "Bearer realm=\"{realm}\", error=\"invalid_token\", error_description=\"{description}\""
        )
    };
    for (path, realm) in [
        (OPERATOR, "mesos-agent-readwrite"),
        (common::PATH, "mesos-agent-resource-provider"),
    ] {
        for (authorization, method, challenge) in [
            (None, "POST", format!("Bearer realm=\"{realm}\"")),
            (None, "GET", format!("Bearer realm=\"{realm}\"")),
            (
                Some("Bearer"),
                "POST",
                invalid(realm, "Malformed 'Authorization' header"),
            ),
            (
                Some("Basic czNjcmV0"),
                "POST",
                invalid(realm, "Scheme 'Basic' unsupported"),
            ),
            (
                Some("Bearer wrong"),
                "POST",
                invalid(realm, "Invalid token"),
            ),
        ] {
            let mut headers = vec![("Content-Type", pb), ("Accept", pb)];
            if let Some(authorization) = authorization {
                headers.push(("Authorization", authorization));
            }
            let reply = harness
                .client
                .request(request(path, method, &headers, get_agent.clone()))
                .await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{path} {authorization:?}"
            );
            assert_eq!(reply.body, "401 Unauthorized.");
            assert_eq!(
                reply
                    .headers
                    .get("WWW-Authenticate")
                    .map(|v| v.to_str().unwrap_or_default()),
                Some(challenge.as_str()),
                "{path} {authorization:?}"
            );
        }
    }
    let authorized = [
        ("Content-Type", pb),
        ("Accept", pb),
        ("Authorization", "Bearer s3cret"),
    ];
    let (status, _, _) = exchange(
        &harness.client,
        request(OPERATOR, "POST", &authorized, get_agent.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // Past authentication, the resource provider API's own checks apply.
    let reply = harness
        .client
        .request(request(
            common::PATH,
            "POST",
            &authorized,
            b"MALFORMED".to_vec(),
        ))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.body, "Failed to parse body into Call protobuf");
}

/// A pre-admitted provider ID is admitted on its first subscription, as by an agent whose
/// registrar knew it (the provider was taken over from a Mesos SLRP), and recorded under
/// the state dir; an unknown ID is not.
#[tokio::test]
async fn a_preadmitted_provider_is_admitted() {
    let known = "6d1a9e40-0d53-4c1e-b1c5-9a2b8c1f0e77";
    let harness = common::start_with(Transport::Tcp, |config| {
        config.preadmitted = vec![slrp_manager::registrar::ProviderRecord {
            id: known.to_owned(),
            kind: common::RP_TYPE.to_owned(),
            name: common::RP_NAME.to_owned(),
        }];
    })
    .await;
    let mut stream = harness
        .client
        .subscribe(ContentType::Protobuf, common::info(Some(known)))
        .await;
    assert_eq!(stream.subscribed().await, known);
    drop(stream);
    let mut unknown = harness
        .client
        .subscribe(ContentType::Protobuf, common::info(Some("not-admitted")))
        .await;
    assert!(
        unknown.next().await.is_none(),
        "an unknown ID is not admitted"
    );
    let state_dir = harness.dir.path().join("state");
    harness.guard.shutdown().await;

    let mut config = ManagerConfig::loopback();
    config.state_dir = Some(state_dir);
    let (handle, guard) = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect("restart without preadmitted");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    let mut again = client
        .subscribe(ContentType::Protobuf, common::info(Some(known)))
        .await;
    assert_eq!(again.subscribed().await, known, "recorded in the registry");
    drop(again);
    guard.shutdown().await;
}
