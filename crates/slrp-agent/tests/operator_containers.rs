//! `OperatorClient`'s container calls against the scripted fake agent: the exact request
//! (path, media types, token, call and payload) and every answer of the agent's table
//! (200, 202, 400, 401, 403, 404, 500, a cut connection) mapped to its typed outcome.

mod support;

use std::time::Duration;

use http::StatusCode;
use slrp_agent::{Kill, Launch, OperatorClient, OperatorError, Token, Wait};
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_proto::mesos::v1::{ContainerId, ContainerStatus};
use support::{FakeAgent, Incoming, WAIT, decode_protobuf};

const OPERATOR_PATH: &str = "/slave(1)/api/v1";
const PROTOBUF: &str = "application/x-protobuf";

fn cid(value: &str) -> ContainerId {
    ContainerId {
        value: value.to_owned(),
        parent: None,
    }
}

fn client(fake: &FakeAgent, token: Option<&str>) -> OperatorClient {
    let mut config = fake.config();
    config.token = token.map(Token::new);
    OperatorClient::new(&config).expect("client")
}

/// Takes the next request, checks the envelope and returns it with its decoded call.
async fn take(fake: &mut FakeAgent, token: Option<&str>, kind: call::Type) -> (Incoming, Call) {
    let request = fake.next_at(OPERATOR_PATH).await;
    assert_eq!(request.header("content-type"), Some(PROTOBUF));
    assert_eq!(request.header("accept"), Some(PROTOBUF));
    let auth = token.map(|t| format!("Bearer {t}"));
    assert_eq!(request.header("authorization"), auth.as_deref());
    let call: Call = decode_protobuf(&request.body);
    assert_eq!(call.r#type, Some(kind as i32));
    (request, call)
}

async fn done<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("in time")
        .expect("task")
}

fn launch_call(id: &str) -> call::LaunchContainer {
    call::LaunchContainer {
        container_id: cid(id),
        command: Some(slrp_proto::mesos::v1::CommandInfo {
            value: Some("exec plugin".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn launch_maps_every_answer() {
    type Expect = fn(&Result<Launch, OperatorError>) -> bool;
    let cases: Vec<(StatusCode, &str, Expect)> = vec![
        (StatusCode::OK, "", |r| matches!(r, Ok(Launch::Launched))),
        (StatusCode::ACCEPTED, "", |r| {
            matches!(r, Ok(Launch::AlreadyRunning))
        }),
        (StatusCode::UNAUTHORIZED, "no", |r| {
            matches!(r, Err(e @ OperatorError::Refused { status, .. })
                if *status == StatusCode::UNAUTHORIZED && !e.is_transient())
        }),
        (StatusCode::FORBIDDEN, "", |r| {
            matches!(r, Err(e @ OperatorError::Refused { status, .. })
                if *status == StatusCode::FORBIDDEN && !e.is_transient())
        }),
        (
            StatusCode::BAD_REQUEST,
            "The provided ContainerInfo is not supported",
            |r| {
                matches!(r, Err(e @ OperatorError::Status { status, body, call, .. })
                if *status == StatusCode::BAD_REQUEST && body.contains("not supported")
                    && *call == "LAUNCH_CONTAINER" && !e.is_transient())
            },
        ),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Failed to create sandbox",
            |r| matches!(r, Err(e @ OperatorError::Status { .. }) if e.is_transient()),
        ),
    ];
    for (status, body, expect) in cases {
        let mut fake = FakeAgent::tcp().await;
        let c = client(&fake, Some("s3cret"));
        let task = tokio::spawn(async move { c.launch_container(launch_call("x--NODE")).await });
        let (request, call) = take(&mut fake, Some("s3cret"), call::Type::LaunchContainer).await;
        assert_eq!(call.launch_container, Some(launch_call("x--NODE")));
        request.respond(status, body);
        let outcome = done(task).await;
        assert!(expect(&outcome), "{status}: {outcome:?}");
        fake.assert_idle();
    }
}

#[tokio::test]
async fn wait_is_a_long_poll_beyond_the_call_timeout() {
    let mut fake = FakeAgent::unix();
    let mut config = fake.config();
    config.call_timeout = Duration::from_millis(50);
    let c = OperatorClient::new(&config).expect("client");
    let task = tokio::spawn(async move { c.wait_container(&cid("p")).await });
    let (request, call) = take(&mut fake, None, call::Type::WaitContainer).await;
    assert_eq!(
        call.wait_container,
        Some(call::WaitContainer {
            container_id: cid("p")
        })
    );
    // The container runs for longer than any call may take: the wait must outlast it.
    tokio::time::sleep(config.call_timeout * 4).await;
    assert!(!task.is_finished(), "WAIT gave up while the container ran");
    let answer = Response {
        r#type: Some(response::Type::WaitContainer as i32),
        wait_container: Some(response::WaitContainer {
            exit_status: Some(9),
            ..Default::default()
        }),
        ..Default::default()
    };
    request.respond_bytes(
        StatusCode::OK,
        PROTOBUF,
        slrp_wire::encode(slrp_wire::ContentType::Protobuf, &answer).expect("encode"),
    );
    match done(task).await {
        Ok(Wait::Exited(w)) => assert_eq!(w.exit_status, Some(9)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn wait_404_is_not_found_and_a_cut_connection_is_a_transient_error() {
    let mut fake = FakeAgent::tcp().await;
    let c = client(&fake, None);
    let task = tokio::spawn(async move { c.wait_container(&cid("p")).await });
    let (request, _) = take(&mut fake, None, call::Type::WaitContainer).await;
    request.respond(StatusCode::NOT_FOUND, "Container p cannot be found");
    assert!(matches!(done(task).await, Ok(Wait::NotFound)));

    fake.assert_idle();

    // An agent that goes away mid-poll: it reads the request, then closes the connection.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let config = support::test_config(slrp_agent::AgentEndpoint::parse(&url).expect("url"));
    let c = OperatorClient::new(&config).expect("client");
    let task = tokio::spawn(async move { c.wait_container(&cid("p")).await });
    let (mut stream, _) = listener.accept().await.expect("accept");
    let mut buf = [0u8; 64];
    let n = tokio::io::AsyncReadExt::read(&mut stream, &mut buf)
        .await
        .expect("read");
    assert!(n > 0, "the request arrived");
    drop(stream);
    match done(task).await {
        Err(e @ OperatorError::Request { call, .. }) => {
            assert_eq!(call, "WAIT_CONTAINER");
            assert!(e.is_transient(), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn kill_sends_the_signal_and_maps_404_and_403() {
    for (status, signal) in [
        (StatusCode::OK, Some(15)),
        (StatusCode::NOT_FOUND, None),
        (StatusCode::FORBIDDEN, Some(9)),
    ] {
        let mut fake = FakeAgent::tcp().await;
        let c = client(&fake, None);
        let task = tokio::spawn(async move { c.kill_container(&cid("p"), signal).await });
        let (request, call) = take(&mut fake, None, call::Type::KillContainer).await;
        assert_eq!(
            call.kill_container,
            Some(call::KillContainer {
                container_id: cid("p"),
                signal
            })
        );
        request.respond(status, "");
        let outcome = done(task).await;
        match status {
            StatusCode::OK => assert!(matches!(outcome, Ok(Kill::Signalled)), "{outcome:?}"),
            StatusCode::NOT_FOUND => assert!(matches!(outcome, Ok(Kill::NotFound)), "{outcome:?}"),
            _ => assert!(
                matches!(outcome, Err(OperatorError::Refused { .. })),
                "{outcome:?}"
            ),
        }
    }
}

#[tokio::test]
async fn remove_is_ok_on_200_only() {
    for status in [StatusCode::OK, StatusCode::INTERNAL_SERVER_ERROR] {
        let mut fake = FakeAgent::tcp().await;
        let c = client(&fake, None);
        let task = tokio::spawn(async move { c.remove_container(&cid("p")).await });
        let (request, call) = take(&mut fake, None, call::Type::RemoveContainer).await;
        assert_eq!(
            call.remove_container,
            Some(call::RemoveContainer {
                container_id: cid("p")
            })
        );
        request.respond(status, "Root container p not found");
        let outcome = done(task).await;
        if status == StatusCode::OK {
            assert!(outcome.is_ok(), "{outcome:?}");
        } else {
            let e = outcome.expect_err("500");
            assert!(e.to_string().contains("Root container p not found"), "{e}");
        }
    }
}

#[tokio::test]
async fn get_containers_decodes_the_list_and_names_a_wrong_answer() {
    let mut fake = FakeAgent::tcp().await;
    let c = client(&fake, Some("t"));
    let c2 = c.clone();
    let task = tokio::spawn(async move { c2.get_containers(false, true).await });
    let (request, call) = take(&mut fake, Some("t"), call::Type::GetContainers).await;
    assert_eq!(
        call.get_containers,
        Some(call::GetContainers {
            show_nested: Some(false),
            show_standalone: Some(true)
        })
    );
    let answer = Response {
        r#type: Some(response::Type::GetContainers as i32),
        get_containers: Some(response::GetContainers {
            containers: vec![
                response::get_containers::Container {
                    container_id: cid("running"),
                    container_status: Some(ContainerStatus {
                        executor_pid: Some(4242),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                response::get_containers::Container {
                    container_id: cid("dying"),
                    ..Default::default()
                },
            ],
        }),
        ..Default::default()
    };
    request.respond_bytes(
        StatusCode::OK,
        PROTOBUF,
        slrp_wire::encode(slrp_wire::ContentType::Protobuf, &answer).expect("encode"),
    );
    let list = done(task).await.expect("list");
    assert_eq!(list.len(), 2);
    assert_eq!(
        list[0]
            .container_status
            .as_ref()
            .and_then(|s| s.executor_pid),
        Some(4242)
    );
    assert!(list[1].container_status.is_none());

    let c2 = c.clone();
    let task = tokio::spawn(async move { c2.get_containers(false, true).await });
    let (request, _) = take(&mut fake, Some("t"), call::Type::GetContainers).await;
    request.respond_bytes(StatusCode::OK, "application/json", b"{}".to_vec());
    assert!(matches!(
        done(task).await,
        Err(OperatorError::Unexpected {
            call: "GET_CONTAINERS",
            ..
        })
    ));

    let task = tokio::spawn(async move { c.get_containers(false, true).await });
    let (request, _) = take(&mut fake, Some("t"), call::Type::GetContainers).await;
    request.respond(
        StatusCode::SERVICE_UNAVAILABLE,
        "Agent has not finished recovery",
    );
    match done(task).await {
        Err(e @ OperatorError::Status { .. }) => {
            assert!(e.is_transient());
            assert!(e.to_string().contains("finished recovery"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    fake.assert_idle();
}
