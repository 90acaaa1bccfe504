//! The manager's strictness: every malformed or inconsistent call of spec §2.2 and §2.6,
//! over loopback TCP and a unix socket, protobuf and JSON, with exact status and body.

mod common;

use bytes::Bytes;
use common::{Client, Transport};
use http::StatusCode;
use slrp_proto::mesos::v1::resource_provider::{Call, call};
use slrp_proto::mesos::v1::{OperationState, OperationStatus};
use slrp_wire::ContentType;

enum Expect {
    Exact(&'static str),
    Owned(String),
    Prefix(&'static str),
}

struct Case {
    name: String,
    request: http::Request<http_body_util::Full<Bytes>>,
    status: StatusCode,
    body: Expect,
}

fn raw(
    name: &str,
    method: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: StatusCode,
    expect: Expect,
) -> Case {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(common::PATH)
        .header("Host", "localhost");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    Case {
        name: name.to_owned(),
        request: Client::build(builder, Bytes::copy_from_slice(body)),
        status,
        body: expect,
    }
}

fn with_call(
    name: &str,
    ct: ContentType,
    call: &Call,
    stream_id: Option<&str>,
    status: StatusCode,
    expect: Expect,
) -> Case {
    let body = slrp_wire::encode(ct, call).expect("encode");
    let mut headers = vec![("Content-Type", ct.as_str()), ("Accept", ct.as_str())];
    if let Some(stream_id) = stream_id {
        headers.push(("Mesos-Stream-Id", stream_id));
    }
    raw(
        &format!("{name} ({ct})"),
        "POST",
        &headers,
        &body,
        status,
        expect,
    )
}

fn typed(kind: call::Type, id: Option<&str>) -> Call {
    Call {
        resource_provider_id: id.map(common::provider_id),
        r#type: Some(kind as i32),
        ..Call::default()
    }
}

fn status_update(id: &str, status_provider: Option<&str>) -> Call {
    Call {
        update_operation_status: Some(call::UpdateOperationStatus {
            framework_id: None,
            status: OperationStatus {
                state: OperationState::OperationFinished as i32,
                resource_provider_id: status_provider.map(common::provider_id),
                uuid: Some(common::uuid()),
                ..OperationStatus::default()
            },
            latest_status: None,
            operation_uuid: common::uuid(),
        }),
        ..typed(call::Type::UpdateOperationStatus, Some(id))
    }
}

async fn strictness(transport: Transport) {
    let harness = common::start(transport).await;
    let client = &harness.client;
    let mut stream = client
        .subscribe(ContentType::Protobuf, common::info(None))
        .await;
    let id = stream.subscribed().await;
    let sid = stream.stream_id.clone();
    let bad = StatusCode::BAD_REQUEST;
    let protobuf = [("Content-Type", "application/x-protobuf")];
    let json = [("Content-Type", "application/json")];
    // Call{type: UPDATE_STATE, resource_provider_id, update_state: {}}: lacks the required
    // resource_version_uuid, which prost cannot produce.
    let incomplete: &[u8] = &[0x0a, 0x03, 0x0a, 0x01, b'x', 0x10, 0x03, 0x2a, 0x00];

    let mut cases = vec![
        raw("GET", "GET", &protobuf, b"", StatusCode::METHOD_NOT_ALLOWED,
            Expect::Exact("Expecting one of { 'POST' }, but received 'GET'")),
        raw("no Content-Type", "POST", &[], b"", bad,
            Expect::Exact("Expecting 'Content-Type' to be present")),
        raw("bad protobuf", "POST", &protobuf, b"MALFORMED_CONTENT", bad,
            Expect::Exact("Failed to parse body into Call protobuf")),
        raw("protobuf lacking a required field", "POST", &protobuf, incomplete, bad,
            Expect::Exact("Failed to parse body into Call protobuf")),
        raw("bad JSON", "POST", &json, b"MALFORMED_CONTENT", bad,
            Expect::Prefix("Failed to parse body into JSON: ")),
        raw("JSON that is not a Call", "POST", &json, br#"{"type": {"nested": 1}}"#, bad,
            Expect::Prefix("Failed to convert JSON into Call protobuf: ")),
        raw("JSON lacking a required field", "POST", &json,
            br#"{"type": "UPDATE_STATE", "resource_provider_id": {"value": "x"}, "update_state": {}}"#, bad,
            Expect::Exact("Failed to convert JSON into Call protobuf: Missing required fields: update_state.resource_version_uuid")),
        raw("valid JSON, no type", "POST", &json, br#"{"string": "valid_json"}"#, bad,
            Expect::Exact("Failed to validate resource_provider::Call: Expecting 'type' to be present")),
        raw("unsupported media type", "POST", &[("Content-Type", "text/plain")], b"x",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Expect::Exact("Expecting 'Content-Type' of application/json or application/x-protobuf")),
        raw("media type with parameters", "POST", &[("Content-Type", "application/json; charset=utf-8")], b"{}",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Expect::Exact("Expecting 'Content-Type' of application/json or application/x-protobuf")),
        raw("Accept not satisfiable", "POST",
            &[("Content-Type", "application/x-protobuf"), ("Accept", "text/html")],
            &slrp_wire::encode(ContentType::Protobuf, &common::subscribe_call(common::info(None))).expect("encode"),
            StatusCode::NOT_ACCEPTABLE,
            Expect::Exact("Expecting 'Accept' to allow 'application/x-protobuf' or 'application/json'")),
    ];
    for ct in [ContentType::Protobuf, ContentType::Json] {
        let validate = |reason: &str| {
            Expect::Owned(format!(
                "Failed to validate resource_provider::Call: {reason}"
            ))
        };
        cases.extend([
            with_call("missing type", ct, &Call::default(), None, bad,
                validate("Expecting 'type' to be present")),
            with_call("SUBSCRIBE without payload", ct, &typed(call::Type::Subscribe, None), None, bad,
                validate("Expecting 'subscribe' to be present")),
            with_call("UPDATE_STATE without resource_provider_id", ct,
                &Call { resource_provider_id: None, ..common::update_state(&id, vec![]) }, Some(&sid), bad,
                validate("Expecting 'resource_provider_id' to be present")),
            with_call("UPDATE_STATE without payload", ct, &typed(call::Type::UpdateState, Some(&id)), Some(&sid), bad,
                validate("Expecting 'update_state' to be present")),
            with_call("UPDATE_OPERATION_STATUS without payload", ct,
                &typed(call::Type::UpdateOperationStatus, Some(&id)), Some(&sid), bad,
                validate("Expecting 'update_operation_status' to be present")),
            with_call("UPDATE_PUBLISH_RESOURCES_STATUS without payload", ct,
                &typed(call::Type::UpdatePublishResourcesStatus, Some(&id)), Some(&sid), bad,
                validate("Expecting 'update_publish_resources_status' to be present.")),
            with_call("SUBSCRIBE with a stream id", ct, &common::subscribe_call(common::info(None)), Some(&sid), bad,
                Expect::Exact("Subscribe calls should not include the 'Mesos-Stream-Id' header")),
            with_call("not subscribed", ct, &common::update_state("unknown", vec![]), Some(&sid), bad,
                Expect::Exact("Resource provider is not subscribed")),
            with_call("UNKNOWN without a subscribed id", ct, &typed(call::Type::Unknown, None), Some(&sid), bad,
                Expect::Exact("Resource provider is not subscribed")),
            with_call("update_state resource of another provider", ct,
                &common::update_state(&id, vec![common::disk("other", 1.0)]), Some(&sid), bad,
                Expect::Exact("Inconsistent call: Inconsistent resource provider ID in 'update_state'")),
            with_call("update_state resource without provider_id", ct,
                &common::update_state(&id, vec![slrp_proto::mesos::v1::Resource { provider_id: None, ..common::disk(&id, 1.0) }]),
                Some(&sid), bad,
                Expect::Exact("Inconsistent call: Inconsistent resource provider ID in 'update_state'")),
            with_call("update_operation_status without status provider id", ct,
                &status_update(&id, None), Some(&sid), bad,
                Expect::Exact("Inconsistent call: Inconsistent resource provider ID in 'update_operation_status'")),
            with_call("update_operation_status of another provider", ct,
                &status_update(&id, Some("other")), Some(&sid), bad,
                Expect::Exact("Inconsistent call: Inconsistent resource provider ID in 'update_operation_status'")),
            with_call("missing stream id", ct, &common::update_state(&id, vec![]), None, bad,
                Expect::Exact("All non-subscribe calls should include to 'Mesos-Stream-Id' header")),
            with_call("mismatched stream id", ct, &common::update_state(&id, vec![]), Some("not-the-stream"), bad,
                Expect::Owned(format!("The stream ID 'not-the-stream' included in this request didn't match the stream ID currently associated with  resource provider ID {id}"))),
            with_call("UNKNOWN", ct, &typed(call::Type::Unknown, Some(&id)), Some(&sid),
                StatusCode::NOT_IMPLEMENTED, Expect::Exact("")),
            with_call("valid UPDATE_STATE", ct, &common::update_state(&id, vec![common::disk(&id, 1.0)]), Some(&sid),
                StatusCode::ACCEPTED, Expect::Exact("")),
            with_call("valid UPDATE_OPERATION_STATUS", ct, &status_update(&id, Some(&id)), Some(&sid),
                StatusCode::ACCEPTED, Expect::Exact("")),
        ]);
    }

    let mut failures = Vec::new();
    for case in cases {
        let reply = client.request(case.request).await;
        let body_ok = match &case.body {
            Expect::Exact(text) => reply.body == *text,
            Expect::Owned(text) => reply.body == *text,
            Expect::Prefix(text) => reply.body.starts_with(text),
        };
        let allow_ok = case.status != StatusCode::METHOD_NOT_ALLOWED
            || reply
                .headers
                .get("Allow")
                .is_some_and(|allow| allow == "POST");
        if reply.status != case.status || !body_ok || !allow_ok {
            failures.push(format!(
                "{}: got {} {:?}",
                case.name, reply.status, reply.body
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{transport:?}:\n{}",
        failures.join("\n")
    );
    // None of the rejected calls disturbed the subscription.
    assert_eq!(
        harness.handle.providers().await.expect("providers").len(),
        1
    );
}

#[tokio::test]
async fn strictness_table_tcp() {
    strictness(Transport::Tcp).await;
}

#[tokio::test]
async fn strictness_table_unix() {
    strictness(Transport::Unix).await;
}

#[tokio::test]
async fn unprefixed_path_is_served_and_others_are_not() {
    let harness = common::start(Transport::Tcp).await;
    let body = slrp_wire::encode(ContentType::Json, &Call::default()).expect("encode");
    for (path, status) in [
        ("/api/v1/resource_provider", StatusCode::BAD_REQUEST),
        ("/slave(1)/api/v1/other", StatusCode::NOT_FOUND),
    ] {
        let builder = http::Request::post(path)
            .header("Host", "localhost")
            .header("Content-Type", "application/json");
        let reply = harness
            .client
            .request(Client::build(builder, body.clone()))
            .await;
        assert_eq!(reply.status, status, "{path}");
    }
}

#[tokio::test]
async fn oversized_body_is_413() {
    let harness = common::start_with(Transport::Unix, |config| config.max_body_bytes = 64).await;
    let builder = Client::post(Some("application/json"), "");
    let reply = harness
        .client
        .request(Client::build(builder, vec![b' '; 65]))
        .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.body, "Request body exceeds the limit of 64 bytes");
}

#[tokio::test]
async fn subscribe_response_media_type_follows_accept() {
    let harness = common::start(Transport::Tcp).await;
    let body = slrp_wire::encode(
        ContentType::Protobuf,
        &common::subscribe_call(common::info(None)),
    )
    .expect("encode");
    for (accept, expected) in [
        (None, "application/json"),
        (Some("*/*"), "application/json"),
        (Some("application/x-protobuf"), "application/x-protobuf"),
        (
            Some("application/json;q=0, application/x-protobuf"),
            "application/x-protobuf",
        ),
    ] {
        let mut builder = Client::post(Some("application/x-protobuf"), "");
        if let Some(accept) = accept {
            builder = builder.header("Accept", accept);
        }
        let (status, headers, _body, connection) = harness
            .client
            .send_raw(Client::build(builder, body.clone()))
            .await;
        connection.abort();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers.get("Content-Type").expect("content type"),
            expected,
            "{accept:?}"
        );
        assert_eq!(
            headers.get("Transfer-Encoding").expect("chunked"),
            "chunked"
        );
        let stream_id = headers
            .get("Mesos-Stream-Id")
            .expect("stream id")
            .to_str()
            .expect("ascii");
        assert!(uuid::Uuid::parse_str(stream_id).is_ok(), "{stream_id}");
    }
}

#[tokio::test]
async fn slow_body_is_408() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let harness = common::start_with(Transport::Tcp, |config| {
        config.body_timeout = std::time::Duration::from_millis(200);
    })
    .await;
    let slrp_manager::Endpoint::Tcp(addr) = harness.handle.endpoint() else {
        panic!("tcp endpoint");
    };
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Promise 100 bytes, send one, then stall.
    socket
        .write_all(
            b"POST /slave(1)/api/v1/resource_provider HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .expect("write");
    let mut response = Vec::new();
    let read = tokio::time::timeout(common::WAIT, async {
        let mut chunk = [0_u8; 1024];
        while !String::from_utf8_lossy(&response).contains("Timed out") {
            let n = socket.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            response.extend_from_slice(&chunk[..n]);
        }
    });
    read.await.expect("a response in time");
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("Timed out reading the request body after 0.2s"),
        "{text}"
    );
}
