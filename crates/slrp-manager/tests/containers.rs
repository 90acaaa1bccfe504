//! The operator API's standalone container calls (LAUNCH/WAIT/KILL/REMOVE/GET_CONTAINERS)
//! against real local processes: every answer of a Mesos agent with its status and text,
//! the containerizer's environment and argv, the POSIX launcher's process groups, JWT
//! `cid_prefix` authorization and survival across a manager restart.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{Client, Harness};
use http::StatusCode;
use slrp_manager::{
    ContainerState, ContainerView, EmbeddedManager, ManagerConfig, ManagerHandle, ManagerMessage,
    Secret,
};
use slrp_proto::mesos::v1::agent::{Call, Response, call, response};
use slrp_proto::mesos::v1::environment::Variable;
use slrp_proto::mesos::v1::{
    CommandInfo, ContainerId, ContainerInfo, Environment, Resource, Secret as ProtoSecret, Volume,
    container_info, environment, resource, value, volume,
};
use slrp_wire::ContentType;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

const OPERATOR: &str = "/slave(1)/api/v1";
const PB: &str = "application/x-protobuf";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn response(&self) -> Response {
        slrp_wire::decode(ContentType::Protobuf, &self.body).expect("a protobuf agent Response")
    }
}

async fn send(client: &Client, body: Vec<u8>, authorization: Option<&str>) -> Answer {
    use http_body_util::BodyExt as _;
    let mut builder = http::Request::post(OPERATOR)
        .header("Host", "localhost")
        .header("Content-Type", PB)
        .header("Accept", PB);
    if let Some(token) = authorization {
        builder = builder.header("Authorization", format!("Bearer {token}"));
    }
    let (status, _, body, connection) = client.send_raw(Client::build(builder, body)).await;
    // A WAIT is a long poll: its body comes when the container ends.
    let body = tokio::time::timeout(Duration::from_secs(60), body.collect())
        .await
        .expect("the body in time")
        .expect("a body")
        .to_bytes();
    connection.abort();
    Answer { status, body }
}

async fn call(client: &Client, call: &Call) -> Answer {
    send(
        client,
        slrp_wire::encode(ContentType::Protobuf, call).expect("encode"),
        None,
    )
    .await
}

async fn call_as(client: &Client, call: &Call, token: &str) -> Answer {
    send(
        client,
        slrp_wire::encode(ContentType::Protobuf, call).expect("encode"),
        Some(token),
    )
    .await
}

fn cid(value: &str) -> ContainerId {
    ContainerId {
        value: value.to_owned(),
        parent: None,
    }
}

fn shell(script: &str) -> CommandInfo {
    CommandInfo {
        value: Some(script.to_owned()),
        ..CommandInfo::default()
    }
}

fn launch_call(id: &str, command: Option<CommandInfo>) -> Call {
    Call {
        r#type: Some(call::Type::LaunchContainer as i32),
        launch_container: Some(call::LaunchContainer {
            container_id: cid(id),
            command,
            ..call::LaunchContainer::default()
        }),
        ..Call::default()
    }
}

fn wait_call(id: ContainerId) -> Call {
    Call {
        r#type: Some(call::Type::WaitContainer as i32),
        wait_container: Some(call::WaitContainer { container_id: id }),
        ..Call::default()
    }
}

fn kill_call(id: ContainerId, signal: Option<i32>) -> Call {
    Call {
        r#type: Some(call::Type::KillContainer as i32),
        kill_container: Some(call::KillContainer {
            container_id: id,
            signal,
        }),
        ..Call::default()
    }
}

fn remove_call(id: ContainerId) -> Call {
    Call {
        r#type: Some(call::Type::RemoveContainer as i32),
        remove_container: Some(call::RemoveContainer { container_id: id }),
        ..Call::default()
    }
}

fn get_containers_call(show_standalone: bool) -> Call {
    Call {
        r#type: Some(call::Type::GetContainers as i32),
        get_containers: Some(call::GetContainers {
            show_nested: Some(false),
            show_standalone: Some(show_standalone),
        }),
        ..Call::default()
    }
}

/// `(container id, executor_pid)` of GET_CONTAINERS.
async fn listed(client: &Client, token: Option<&str>) -> Vec<(String, Option<u32>)> {
    let body = slrp_wire::encode(ContentType::Protobuf, &get_containers_call(true)).expect("e");
    let answer = send(client, body, token).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let response = answer.response();
    assert_eq!(response.r#type, Some(response::Type::GetContainers as i32));
    response
        .get_containers
        .expect("get_containers")
        .containers
        .into_iter()
        .map(|c| {
            let status = c.container_status.expect("container_status");
            assert_eq!(status.container_id.as_ref(), Some(&c.container_id));
            (c.container_id.value, status.executor_pid)
        })
        .collect()
}

async fn view(handle: &ManagerHandle, id: &str) -> Option<ContainerView> {
    handle.containers().await.into_iter().find(|v| v.id == id)
}

/// Polls `check` until it holds (the condition is outside the manager: a file a
/// container writes, a process the kernel reaps).
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + common::WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a WAIT and returns once the manager holds it (so the container's end cannot
/// come first and make it a `404`).
async fn waiting(harness: &Harness, id: &str) -> tokio::task::JoinHandle<Answer> {
    let client = harness.client.clone();
    let wait = wait_call(cid(id));
    let task = tokio::spawn(async move { call(&client, &wait).await });
    let handle = harness.handle.clone();
    let id = id.to_owned();
    eventually("the WAIT to be registered", async || {
        view(&handle, &id).await.filter(|v| v.waiters > 0)
    })
    .await;
    task
}

async fn terminated(messages: &mut broadcast::Receiver<ManagerMessage>, id: &str) -> Option<i32> {
    tokio::time::timeout(common::WAIT, async {
        loop {
            match messages.recv().await.expect("messages") {
                ManagerMessage::ContainerTerminated { id: ended, status } if ended == id => {
                    return status;
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the container's termination")
}

/// Running and the same process (a zombie has exited).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn wait_status(answer: &Answer) -> Option<i32> {
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let response = answer.response();
    assert_eq!(response.r#type, Some(response::Type::WaitContainer as i32));
    response.wait_container.expect("wait_container").exit_status
}

/// A manager on loopback whose sandboxes are `<dir>/sandboxes/<id>`.
async fn start(adjust: impl FnOnce(&mut ManagerConfig)) -> Harness {
    start_on(common::Transport::Tcp, adjust).await
}

async fn start_on(
    transport: common::Transport,
    adjust: impl FnOnce(&mut ManagerConfig),
) -> Harness {
    common::start_with(transport, |config| {
        // The harness puts the state dir at `<dir>/state`.
        config.containers_dir = config
            .state_dir
            .as_deref()
            .and_then(Path::parent)
            .map(|dir| dir.join("sandboxes"));
        adjust(config);
    })
    .await
}

fn sandbox_of(dir: &Path, id: &str) -> PathBuf {
    dir.join("containers").join(id)
}

/// LAUNCH 200 then 202 for the same ID, GET_CONTAINERS with the pid while it runs, WAIT
/// answered on the exit with the wait status (SIGKILL by default), then 404 for WAIT and
/// KILL, nothing listed, and the ID usable again.
#[tokio::test]
async fn launch_wait_kill_follow_the_agent() {
    let harness = start(|c| c.containers_dir = None).await;
    let mut messages = harness.handle.messages();
    let id = "plugin-a";
    let launch = launch_call(id, Some(shell("sleep 1000; true")));
    let first = call(&harness.client, &launch).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert!(first.body.is_empty());
    let again = call(&harness.client, &launch).await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.text());

    let running = view(&harness.handle, id).await.expect("listed");
    assert_eq!(running.state, ContainerState::Running);
    let pid = running.pid.expect("a pid while running");
    assert!(alive(pid));
    assert_eq!(
        listed(&harness.client, None).await,
        [(id.to_owned(), u32::try_from(pid).ok())]
    );
    let hidden = call(&harness.client, &get_containers_call(false)).await;
    assert!(
        hidden
            .response()
            .get_containers
            .expect("get_containers")
            .containers
            .is_empty(),
        "show_standalone false lists no standalone container"
    );

    let invalid = call(&harness.client, &kill_call(cid(id), Some(12345))).await;
    assert_eq!(
        (invalid.status, invalid.text()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Unable to send signal to container: Invalid argument".to_owned()
        )
    );
    assert!(alive(pid), "an invalid signal changes nothing");
    let wait = waiting(&harness, id).await;
    let kill = call(&harness.client, &kill_call(cid(id), None)).await;
    assert_eq!(kill.status, StatusCode::OK, "{}", kill.text());
    let answer = wait.await.expect("the WAIT task");
    assert_eq!(wait_status(&answer), Some(9), "killed by SIGKILL");
    assert_eq!(terminated(&mut messages, id).await, Some(9));
    assert!(!alive(pid));

    let gone = call(&harness.client, &wait_call(cid(id))).await;
    assert_eq!(
        (gone.status, gone.text()),
        (
            StatusCode::NOT_FOUND,
            format!("Container {id} cannot be found")
        )
    );
    let gone = call(&harness.client, &kill_call(cid(id), None)).await;
    assert_eq!(
        (gone.status, gone.text()),
        (
            StatusCode::NOT_FOUND,
            format!("Container '{id}' cannot be found (or is already killed)")
        )
    );
    assert!(listed(&harness.client, None).await.is_empty());
    let relaunch = call(&harness.client, &launch).await;
    assert_eq!(
        relaunch.status,
        StatusCode::OK,
        "a gone ID can be launched again"
    );
    harness.handle.destroy_containers().await;
    assert!(harness.handle.containers().await.is_empty());
    harness.guard.shutdown().await;
}

/// WAIT reports the exit's wait status word; KILL delivers its signal to the container's
/// process (here a trap turns SIGTERM into `exit 7`), and the launcher's destroy kills the
/// rest of the group: the container's own child dies with it.
#[tokio::test]
async fn kill_signals_the_process_and_the_destroy_takes_the_group() {
    let harness = start(|_| {}).await;
    for (id, trap, signal, status) in [
        ("trap", "trap 'exit 7' TERM; ", Some(15), 7 << 8),
        ("default-kill", "", None, 9),
    ] {
        let script = format!("{trap}sleep 1000 & echo $! > child; wait");
        let launched = call(&harness.client, &launch_call(id, Some(shell(&script)))).await;
        assert_eq!(launched.status, StatusCode::OK, "{}", launched.text());
        let sandbox = harness.dir.path().join("sandboxes").join(id);
        let child: i32 = eventually("the child's pid", async || {
            std::fs::read_to_string(sandbox.join("child"))
                .ok()
                .and_then(|text| text.trim().parse().ok())
        })
        .await;
        assert!(alive(child));
        let wait = waiting(&harness, id).await;
        let kill = call(&harness.client, &kill_call(cid(id), signal)).await;
        assert_eq!(kill.status, StatusCode::OK, "{}", kill.text());
        assert_eq!(
            wait_status(&wait.await.expect("WAIT")),
            Some(status),
            "{id}"
        );
        eventually("the group's SIGKILL to reach the child", async || {
            (!alive(child)).then_some(())
        })
        .await;
    }
    harness.guard.shutdown().await;
}

fn variable(name: &str, value: &str) -> Variable {
    Variable {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..Variable::default()
    }
}

/// The exec'ed program's arguments: right after the launch answered, the kernel may still
/// be in the middle of the exec (the close-on-exec pipe closes before the new argv is set).
async fn cmdline(pid: i32) -> Vec<String> {
    eventually("the exec to finish", async || {
        Some(proc_strings(pid, "cmdline")).filter(|args| !args.is_empty())
    })
    .await
}

fn proc_strings(pid: i32, file: &str) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/{file}"))
        .expect("a /proc file of the container")
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The environment is the containerizer's, not the manager's: `MESOS_SANDBOX`, the
/// command's variables (later ones win, SECRET ones left out), `PATH` defaulted; the cwd
/// is the sandbox, output goes to its `stdout`/`stderr`; a shell command runs as
/// `sh -c <value>`, an executable with `arguments` as its argv.
#[tokio::test]
async fn environment_argv_and_sandbox_are_the_containerizers() {
    let harness = start(|_| {}).await;
    let sandboxes = harness.dir.path().join("sandboxes");
    let secret = Variable {
        name: "TOKEN".to_owned(),
        r#type: Some(environment::variable::Type::Secret as i32),
        secret: Some(ProtoSecret {
            r#type: Some(slrp_proto::mesos::v1::secret::Type::Value as i32),
            value: Some(slrp_proto::mesos::v1::secret::Value {
                data: b"hunter2".to_vec(),
            }),
            reference: None,
        }),
        ..Variable::default()
    };
    let mut command = shell("echo out; echo err >&2; sleep 1000; true");
    command.environment = Some(Environment {
        variables: vec![
            variable("CSI_ENDPOINT", "unix:///tmp/x.sock"),
            variable("FOO", "first"),
            secret,
            variable("FOO", "second"),
        ],
    });
    let launched = call(&harness.client, &launch_call("shell", Some(command))).await;
    assert_eq!(launched.status, StatusCode::OK, "{}", launched.text());
    let pid = view(&harness.handle, "shell")
        .await
        .and_then(|v| v.pid)
        .expect("pid");
    let sandbox = sandboxes.join("shell");
    assert_eq!(
        cmdline(pid).await,
        ["sh", "-c", "echo out; echo err >&2; sleep 1000; true"]
    );
    let mut env = proc_strings(pid, "environ");
    env.sort();
    assert_eq!(
        env,
        [
            "CSI_ENDPOINT=unix:///tmp/x.sock".to_owned(),
            "FOO=second".to_owned(),
            format!("MESOS_SANDBOX={}", sandbox.display()),
            format!("PATH={DEFAULT_PATH}"),
        ]
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd"),
        sandbox
    );
    eventually("the output files", async || {
        let out = std::fs::read_to_string(sandbox.join("stdout")).ok()?;
        let err = std::fs::read_to_string(sandbox.join("stderr")).ok()?;
        (out == "out\n" && err == "err\n").then_some(())
    })
    .await;

    let executable = CommandInfo {
        shell: Some(false),
        value: Some("/bin/sleep".to_owned()),
        arguments: vec!["renamed-sleep".to_owned(), "1000".to_owned()],
        environment: Some(Environment {
            variables: vec![variable("PATH", "/opt/bin")],
        }),
        ..CommandInfo::default()
    };
    let launched = call(&harness.client, &launch_call("exec", Some(executable))).await;
    assert_eq!(launched.status, StatusCode::OK, "{}", launched.text());
    let pid = view(&harness.handle, "exec")
        .await
        .and_then(|v| v.pid)
        .expect("pid");
    assert_eq!(cmdline(pid).await, ["renamed-sleep", "1000"]);
    let mut env = proc_strings(pid, "environ");
    env.sort();
    assert_eq!(
        env,
        [
            format!("MESOS_SANDBOX={}", sandboxes.join("exec").display()),
            "PATH=/opt/bin".to_owned(),
        ]
    );
    harness.handle.destroy_containers().await;
    harness.guard.shutdown().await;
}

fn scalar(name: &str, amount: f64) -> Resource {
    Resource {
        name: name.to_owned(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: amount }),
        ..Resource::default()
    }
}

fn launch_with(id: &str, adjust: impl FnOnce(&mut call::LaunchContainer)) -> Call {
    let mut call = launch_call(id, Some(shell("sleep 1000")));
    if let Some(launch) = call.launch_container.as_mut() {
        adjust(launch);
    }
    call
}

fn typed(kind: call::Type) -> Call {
    Call {
        r#type: Some(kind as i32),
        ..Call::default()
    }
}

fn validation(reason: &str) -> (StatusCode, String) {
    (
        StatusCode::BAD_REQUEST,
        format!("Failed to validate agent::Call: {reason}"),
    )
}

/// Every refusal of the container calls with the agent's status and text: the payloads,
/// container IDs, resources of a standalone container, unsupported container infos,
/// unknown containers, a sandbox that cannot be made, REMOVE of a top-level container.
#[tokio::test]
async fn refusals_carry_the_agents_status_and_text() {
    let harness = start(|_| {}).await;
    let long = "x".repeat(243);
    let reserved = {
        let mut r = scalar("cpus", 0.1);
        r.reservations = vec![resource::ReservationInfo {
            r#type: Some(resource::reservation_info::Type::Dynamic as i32),
            role: Some("storage".to_owned()),
            ..resource::ReservationInfo::default()
        }];
        r
    };
    let persistent = {
        let mut r = scalar("disk", 10.0);
        r.disk = Some(resource::DiskInfo {
            persistence: Some(resource::disk_info::Persistence {
                id: "p".to_owned(),
                principal: None,
            }),
            ..resource::DiskInfo::default()
        });
        r
    };
    let revocable = {
        let mut r = scalar("cpus", 0.1);
        r.revocable = Some(resource::RevocableInfo {});
        r
    };
    let nested = ContainerId {
        value: "child".to_owned(),
        parent: Some(Box::new(cid("a b"))),
    };
    let docker = ContainerInfo {
        r#type: container_info::Type::Docker as i32,
        docker: Some(container_info::DockerInfo {
            image: "busybox".to_owned(),
            ..container_info::DockerInfo::default()
        }),
        ..ContainerInfo::default()
    };
    let mapped = ContainerInfo {
        r#type: container_info::Type::Mesos as i32,
        volumes: vec![Volume {
            mode: volume::Mode::Rw as i32,
            container_path: "/inside".to_owned(),
            host_path: Some("/outside".to_owned()),
            ..Volume::default()
        }],
        ..ContainerInfo::default()
    };
    std::fs::create_dir_all(harness.dir.path().join("sandboxes")).expect("mkdir");
    std::fs::write(harness.dir.path().join("sandboxes").join("blocked"), b"").expect("file");
    let cases: Vec<(&str, Call, (StatusCode, String))> = vec![
        (
            "no launch_container",
            typed(call::Type::LaunchContainer),
            validation("Expecting 'launch_container' to be present"),
        ),
        (
            "no wait_container",
            typed(call::Type::WaitContainer),
            validation("Expecting 'wait_container' to be present"),
        ),
        (
            "no kill_container",
            typed(call::Type::KillContainer),
            validation("Expecting 'kill_container' to be present"),
        ),
        (
            "no remove_container",
            typed(call::Type::RemoveContainer),
            validation("Expecting 'remove_container' to be present"),
        ),
        (
            "a period",
            launch_call("a.b", None),
            validation(
                "'launch_container.container_id' is invalid: 'ContainerID.value' 'a.b' contains invalid characters",
            ),
        ),
        (
            "a space",
            wait_call(cid("a b")),
            validation(
                "'wait_container.container_id' is invalid: 'ContainerID.value' 'a b' contains invalid characters",
            ),
        ),
        (
            "a slash",
            kill_call(cid("a/b"), None),
            validation("'kill_container.container_id' is invalid: 'a/b' contains invalid characters"),
        ),
        (
            "empty",
            remove_call(cid("")),
            validation("'remove_container.container_id' is invalid: ID must not be empty"),
        ),
        (
            "dot-dot",
            launch_call("..", None),
            validation("'launch_container.container_id' is invalid: '..' is disallowed"),
        ),
        (
            "243 characters",
            launch_call(&long, None),
            validation(&format!(
                "'launch_container.container_id' is invalid: 'ContainerID.value' '{long}' exceeds the maximum length (242)"
            )),
        ),
        (
            "an invalid parent",
            wait_call(nested),
            validation(
                "'wait_container.container_id' is invalid: 'ContainerID.parent' is invalid: 'ContainerID.value' 'a b' contains invalid characters",
            ),
        ),
        (
            "reserved resources",
            launch_with("r", |l| l.resources = vec![reserved]),
            validation("'launch_container.resources' must be unreserved"),
        ),
        (
            "a persistent volume",
            launch_with("r", |l| l.resources = vec![persistent]),
            validation("'launch_container.resources' may not use persistent volumes"),
        ),
        (
            "revocable resources",
            launch_with("r", |l| l.resources = vec![revocable]),
            validation("'launch_container.resources' must be non-revocable"),
        ),
        (
            "a negative scalar",
            launch_with("r", |l| l.resources = vec![scalar("cpus", -1.0)]),
            validation(
                "Invalid resources: Resource 'cpus:-1' is invalid: Invalid scalar resource: value < 0",
            ),
        ),
        (
            "a VALUE variable without a value",
            launch_with("r", |l| {
                l.command = Some(CommandInfo {
                    value: Some("true".to_owned()),
                    environment: Some(Environment {
                        variables: vec![Variable {
                            name: "X".to_owned(),
                            ..Variable::default()
                        }],
                    }),
                    ..CommandInfo::default()
                });
            }),
            validation(
                "'launch_container.command' is invalid: Environment variable 'X' of type 'VALUE' must have a value set",
            ),
        ),
        (
            "DOCKER",
            launch_with("docker", |l| l.container = Some(docker)),
            (
                StatusCode::BAD_REQUEST,
                "The provided ContainerInfo is not supported".to_owned(),
            ),
        ),
        (
            "a mapped volume",
            launch_with("mapped", |l| l.container = Some(mapped)),
            (
                StatusCode::BAD_REQUEST,
                "Failed to launch container: volume '/inside' is not its host path: the embedded manager has no filesystem isolation to mount it".to_owned(),
            ),
        ),
        (
            "no command value",
            launch_call("novalue", None),
            (
                StatusCode::BAD_REQUEST,
                "Failed to launch container 'novalue': the command has no 'value' (a shell command or an executable path; the embedded manager runs no images)".to_owned(),
            ),
        ),
        (
            "WAIT unknown",
            wait_call(cid("nope")),
            (
                StatusCode::NOT_FOUND,
                "Container nope cannot be found".to_owned(),
            ),
        ),
        (
            "KILL unknown",
            kill_call(cid("nope"), None),
            (
                StatusCode::NOT_FOUND,
                "Container 'nope' cannot be found (or is already killed)".to_owned(),
            ),
        ),
        (
            "REMOVE of a nested container of an unknown root",
            remove_call(ContainerId {
                value: "child".to_owned(),
                parent: Some(Box::new(cid("nope"))),
            }),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Unknown root container".to_owned(),
            ),
        ),
        (
            "GET_STATE",
            typed(call::Type::GetState),
            (
                StatusCode::NOT_IMPLEMENTED,
                "GET_STATE is not served by the embedded manager (only GET_AGENT, GET_CONTAINERS, LAUNCH_CONTAINER, WAIT_CONTAINER, KILL_CONTAINER, REMOVE_CONTAINER)".to_owned(),
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, request, expected) in cases {
        let answer = call(&harness.client, &request).await;
        if (answer.status, answer.text()) != expected {
            failures.push(format!("{name}: got {} {:?}", answer.status, answer.text()));
        }
    }
    let blocked = call(
        &harness.client,
        &launch_call("blocked", Some(shell("true"))),
    )
    .await;
    if blocked.status != StatusCode::INTERNAL_SERVER_ERROR
        || !blocked.text().starts_with("Failed to create sandbox: ")
    {
        failures.push(format!(
            "sandbox: got {} {:?}",
            blocked.status,
            blocked.text()
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        harness.handle.containers().await.is_empty(),
        "nothing refused was launched"
    );
    harness.guard.shutdown().await;
}

/// REMOVE_CONTAINER of a top-level container aborts a Mesos 1.11 agent: answered 500 and
/// recorded as a protocol violation (the e2e harness fails on those), for a running and
/// for an unknown container alike.
#[tokio::test]
async fn removing_a_top_level_container_is_a_protocol_violation() {
    let harness = start(|_| {}).await;
    let mut messages = harness.handle.messages();
    let before = harness.handle.metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS];
    let launched = call(
        &harness.client,
        &launch_call("kept", Some(shell("sleep 1000"))),
    )
    .await;
    assert_eq!(launched.status, StatusCode::OK);
    for id in ["kept", "unknown"] {
        let answer = call(&harness.client, &remove_call(cid(id))).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR, "{id}");
        assert!(
            answer.text().contains("aborts a Mesos agent"),
            "{}",
            answer.text()
        );
    }
    let after = harness.handle.metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS];
    assert!(
        (after - before - 2.0).abs() < f64::EPSILON,
        "{before} → {after}"
    );
    let violation = tokio::time::timeout(common::WAIT, async {
        loop {
            if let ManagerMessage::ProtocolViolation { reason, .. } =
                messages.recv().await.expect("messages")
            {
                return reason;
            }
        }
    })
    .await
    .expect("a violation message");
    assert!(violation.contains("'kept'"), "{violation}");
    assert!(
        view(&harness.handle, "kept").await.is_some(),
        "the container still runs"
    );
    harness.handle.destroy_containers().await;
    harness.guard.shutdown().await;
}

/// With a JWT secret, a token whose `cid_prefix` claim does not prefix the ID is refused
/// `403` (empty body) on all five calls and sees only its own containers; the plain
/// token stays an operator; a token signed with another key is `401`.
#[tokio::test]
async fn a_cid_prefix_claim_limits_the_container_calls() {
    let secret = Secret::new("jwt-key");
    let harness = start(|c| {
        c.token = Some(Secret::new("operator-token"));
        c.jwt_secret = Some(secret.clone());
    })
    .await;
    let provider = slrp_manager::jwt::mint(&secret, r#"{"cid_prefix":"org-apache-mesos-rp--"}"#);
    let unclaimed = slrp_manager::jwt::mint(&secret, r#"{"sub":"someone"}"#);
    let forged = slrp_manager::jwt::mint(&Secret::new("other"), r#"{"cid_prefix":""}"#);
    let mine = "org-apache-mesos-rp--plugin";
    let theirs = "other-plugin";
    let ok = call_as(
        &harness.client,
        &launch_call(mine, Some(shell("sleep 1000"))),
        &provider,
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text());
    let ok = call_as(
        &harness.client,
        &launch_call(theirs, Some(shell("sleep 1000"))),
        "operator-token",
    )
    .await;
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "the operator may launch anything"
    );
    for (token, id) in [(&provider, theirs), (&unclaimed, mine)] {
        for request in [
            launch_call(id, Some(shell("sleep 1000"))),
            wait_call(cid(id)),
            kill_call(cid(id), None),
            remove_call(cid(id)),
        ] {
            let answer = call_as(&harness.client, &request, token).await;
            assert_eq!(
                (answer.status, answer.body.len()),
                (StatusCode::FORBIDDEN, 0),
                "{id}: {}",
                answer.text()
            );
        }
    }
    let by_provider = listed(&harness.client, Some(&provider)).await;
    assert_eq!(
        by_provider
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
        [mine]
    );
    assert!(listed(&harness.client, Some(&unclaimed)).await.is_empty());
    let by_operator = listed(&harness.client, Some("operator-token")).await;
    assert_eq!(by_operator.len(), 2);
    let refused = call_as(&harness.client, &get_containers_call(true), &forged).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        harness.handle.metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS],
        0.0,
        "a refused REMOVE never reaches the containerizer"
    );
    let agent = call_as(&harness.client, &typed(call::Type::GetAgent), &provider).await;
    assert_eq!(
        agent.status,
        StatusCode::OK,
        "GET_AGENT needs no authorization"
    );
    harness.handle.destroy_containers().await;
    harness.guard.shutdown().await;
}

/// With a `containers_dir` the containers outlive the manager: a restarted manager adopts
/// the one still running (same pid, WAIT answered on its exit) and forgets the one that
/// died meanwhile (WAIT 404). Without one, the containers die with the manager.
#[tokio::test]
async fn containers_survive_a_restart_with_a_containers_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let containers_dir = dir.path().join("work").join("containers");
    let config = || {
        let mut config = ManagerConfig::loopback();
        config.containers_dir = Some(containers_dir.clone());
        config
    };
    let (handle, guard) = EmbeddedManager::spawn(config(), CancellationToken::new())
        .await
        .expect("manager");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    for (id, script) in [
        ("survivor", "sleep 1000; true"),
        ("casualty", "sleep 1000 & echo $! > child; wait"),
    ] {
        let answer = call(&client, &launch_call(id, Some(shell(script)))).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
        assert!(sandbox_of(&dir.path().join("work"), id).is_dir());
    }
    let orphan: i32 = eventually("the casualty's child", async || {
        std::fs::read_to_string(sandbox_of(&dir.path().join("work"), "casualty").join("child"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
    })
    .await;
    let pid_of = async |handle: &ManagerHandle, id: &str| {
        view(handle, id).await.and_then(|v| v.pid).expect("a pid")
    };
    let survivor = pid_of(&handle, "survivor").await;
    let casualty = pid_of(&handle, "casualty").await;
    guard.shutdown().await;
    assert!(alive(survivor) && alive(casualty), "left running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(casualty),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    eventually("the casualty to die", async || {
        (!alive(casualty)).then_some(())
    })
    .await;
    assert!(alive(orphan), "its child lives on while no manager runs");

    let (handle, guard) = EmbeddedManager::spawn(config(), CancellationToken::new())
        .await
        .expect("manager restarts");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    let views = handle.containers().await;
    assert_eq!(
        views
            .iter()
            .map(|v| (v.id.as_str(), v.pid))
            .collect::<Vec<_>>(),
        [("survivor", Some(survivor))],
        "adopted the living one only"
    );
    assert_eq!(
        views[0]
            .launch
            .command
            .as_ref()
            .and_then(|c| c.value.as_deref()),
        Some("sleep 1000; true"),
        "the launch config was recorded"
    );
    let relaunch = call(
        &client,
        &launch_call("survivor", Some(shell("sleep 1000; true"))),
    )
    .await;
    assert_eq!(
        relaunch.status,
        StatusCode::ACCEPTED,
        "an adopted container is in use"
    );
    let dead = call(&client, &wait_call(cid("casualty"))).await;
    assert_eq!(dead.status, StatusCode::NOT_FOUND);
    eventually(
        "the recovery to destroy the dead container's group",
        async || (!alive(orphan)).then_some(()),
    )
    .await;
    let mut messages = handle.messages();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { call(&client, &wait_call(cid("survivor"))).await })
    };
    eventually("the WAIT to be registered", async || {
        view(&handle, "survivor").await.filter(|v| v.waiters > 0)
    })
    .await;
    let kill = call(&client, &kill_call(cid("survivor"), Some(15))).await;
    assert_eq!(kill.status, StatusCode::OK);
    let answer = waiting.await.expect("WAIT");
    assert_eq!(
        wait_status(&answer),
        None,
        "nobody can read an adopted container's exit status"
    );
    assert_eq!(terminated(&mut messages, "survivor").await, None);
    assert!(handle.containers().await.is_empty());
    guard.shutdown().await;

    // The records are gone with the containers: a third manager adopts nothing.
    let (handle, guard) = EmbeddedManager::spawn(config(), CancellationToken::new())
        .await
        .expect("manager restarts");
    assert!(handle.containers().await.is_empty());
    guard.shutdown().await;

    let (handle, guard) =
        EmbeddedManager::spawn(ManagerConfig::loopback(), CancellationToken::new())
            .await
            .expect("manager without a containers dir");
    let client = Client {
        endpoint: handle.endpoint().clone(),
    };
    let answer = call(
        &client,
        &launch_call("ephemeral", Some(shell("sleep 1000; true"))),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let ephemeral = pid_of(&handle, "ephemeral").await;
    guard.shutdown().await;
    eventually("the container to die with the manager", async || {
        (!alive(ephemeral)).then_some(())
    })
    .await;
}

/// `destroy_containers` kills every container and returns once each is terminated.
#[tokio::test]
async fn destroy_containers_kills_them_all() {
    let harness = start(|_| {}).await;
    let mut pids = Vec::new();
    for id in ["one", "two"] {
        let answer = call(
            &harness.client,
            &launch_call(id, Some(shell("sleep 1000; true"))),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        pids.push(
            view(&harness.handle, id)
                .await
                .and_then(|v| v.pid)
                .expect("pid"),
        );
    }
    harness.handle.destroy_containers().await;
    assert!(harness.handle.containers().await.is_empty());
    for pid in pids {
        eventually("the process to be reaped", async || {
            (!alive(pid)).then_some(())
        })
        .await;
    }
    harness.guard.shutdown().await;
}

/// A manager whose runtime goes away without a shutdown (a test that panics, a process
/// exiting) still takes its non-surviving containers with it, children included.
#[test]
fn containers_die_with_a_dropped_runtime() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (harness, child) = runtime.block_on(async {
        let harness = start(|c| c.containers_dir = None).await;
        let script = "sleep 1000 & echo $! > \"$MESOS_SANDBOX/child\"; wait";
        let launched = call(&harness.client, &launch_call("leaky", Some(shell(script)))).await;
        assert_eq!(launched.status, StatusCode::OK, "{}", launched.text());
        let view = view(&harness.handle, "leaky").await.expect("listed");
        cmdline(view.pid.expect("pid")).await;
        let env = proc_strings(view.pid.expect("pid"), "environ");
        let sandbox = env
            .iter()
            .find_map(|v| v.strip_prefix("MESOS_SANDBOX="))
            .map(PathBuf::from)
            .expect("MESOS_SANDBOX");
        let child: i32 = eventually("the child's pid", async || {
            std::fs::read_to_string(sandbox.join("child"))
                .ok()
                .and_then(|text| text.trim().parse().ok())
        })
        .await;
        (harness, (view.pid.expect("pid"), child))
    });
    drop(runtime);
    tokio::runtime::Runtime::new()
        .expect("a second runtime")
        .block_on(eventually(
            "the container and its child to die with the runtime",
            async || (!alive(child.0) && !alive(child.1)).then_some(()),
        ));
    drop(harness);
}

/// Over a unix socket and in JSON, as Mesos's container daemon calls (no `Accept`
/// header, so the answers are JSON): LAUNCH, then a WAIT answered with the exit status.
#[tokio::test]
async fn json_without_accept_over_a_unix_socket() {
    use http_body_util::BodyExt as _;
    let harness = start_on(common::Transport::Unix, |_| {}).await;
    let json = |call: &Call| slrp_wire::encode(ContentType::Json, call).expect("json");
    let post = |body: Vec<u8>| {
        let builder = http::Request::post(OPERATOR)
            .header("Host", "localhost")
            .header("Content-Type", "application/json");
        Client::build(builder, body)
    };
    // The container blocks opening its fifo until the test writes to it, so the WAIT is
    // registered before the exit.
    let sandbox = harness.dir.path().join("sandboxes").join("json");
    std::fs::create_dir_all(&sandbox).expect("sandbox");
    let go = sandbox.join("go");
    nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    let launch = launch_call("json", Some(shell("read line < go; exit 3")));
    let reply = harness.client.request(post(json(&launch))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let wait = {
        let client = harness.client.clone();
        let body = json(&wait_call(cid("json")));
        tokio::spawn(async move {
            let (status, headers, body, connection) = client.send_raw(post(body)).await;
            let body = body.collect().await.expect("body").to_bytes();
            connection.abort();
            (status, headers, body)
        })
    };
    eventually("the WAIT to be registered", async || {
        view(&harness.handle, "json")
            .await
            .filter(|v| v.waiters > 0)
    })
    .await;
    tokio::task::spawn_blocking(move || std::fs::write(&go, b"go\n"))
        .await
        .expect("writer")
        .expect("write the fifo");
    let (status, headers, body) = wait.await.expect("WAIT");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers.get("Content-Type").map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    let response: Response = slrp_wire::decode(ContentType::Json, &body).expect("JSON response");
    assert_eq!(
        response.wait_container.and_then(|w| w.exit_status),
        Some(3 << 8)
    );
    harness.guard.shutdown().await;
}

/// A container record that cannot be read fails the spawn, naming the file, rather than
/// lose track of a process that may still run.
#[tokio::test]
async fn an_unreadable_container_record_fails_the_spawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records = dir.path().join(".slrp-runtime");
    std::fs::create_dir_all(&records).expect("mkdir");
    std::fs::write(records.join("plugin.json"), b"{not json").expect("write");
    let mut config = ManagerConfig::loopback();
    config.containers_dir = Some(dir.path().to_owned());
    let error = EmbeddedManager::spawn(config, CancellationToken::new())
        .await
        .expect_err("a corrupt record");
    let text = slrp_types::DisplayChain(&error).to_string();
    assert!(
        text.contains("recovering the container record") && text.contains("plugin.json"),
        "{text}"
    );
}
