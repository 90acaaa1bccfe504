//! Taking over from a Mesos SLRP, end to end: the test plays the Mesos SLRP against the
//! embedded manager (its plugin launched through the operator API's LAUNCH_CONTAINER with
//! Mesos's container ID, `container.info` and endpoint link, as
//! `ServiceManagerProcess::getEndpoint` does; its volumes created, staged and published with
//! that plugin at Mesos's paths; its checkpoints written by `MesosWorkDir`), then
//! `slrp import-mesos` takes the state over and `slrp run --plugin-backend agent` the
//! plugin: re-attached with LAUNCH answered 202 (path B of the migration: the agent kept
//! the container) or relaunched (path A: the agent killed it), with no mount changed.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::float_cmp
)]

#[macro_use]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use prost::Message as _;
use slrp_manager::ManagerMessage;
use slrp_proto::mesos::v1 as mesos;
use slrp_proto::mesos::v1::agent;
use slrp_test_support::mesos::MesosWorkDir;
use support::{Cluster, DaemonOptions, PLUGIN_TYPE, ProviderSpec, cid_prefix, profiles, sorted};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The Mesos agent's ID (`meta/slaves/latest`), which the manager serves.
const AGENT_ID: &str = "a1b2c3d4-0000-4000-8000-000000000001-S0";

/// The provider's plugin container as a Mesos SLRP runs it.
struct MesosPlugin {
    /// `cid_prefix` + `<plugin type with . → ->-<plugin name>--<services>`.
    id: String,
    /// `<endpoint link's target>/endpoint.sock`.
    socket: PathBuf,
}

/// The plugin container config of the cluster's `provider` (its `rp/<name>.json`).
fn container_info(c: &Cluster, provider: &str) -> mesos::CsiPluginContainerInfo {
    let rp: serde_json::Value = serde_json::from_slice(
        &std::fs::read(c.path("rp").join(format!("{provider}.json"))).unwrap(),
    )
    .unwrap();
    slrp_wire::json::from_value(rp["storage"]["plugin"]["containers"][0].clone()).unwrap()
}

/// What `ServiceManagerProcess::getEndpoint` does (brief A.4): checkpoints
/// `container.info` (resources downgraded), links `endpoint` to a fresh
/// `$TMPDIR/mesos-csi-XXXXXX`, creates the mount root, and LAUNCHes the container with
/// `CSI_ENDPOINT`, `MESOS_AGENT_ID` and the two volumes; then waits for the socket.
async fn launch_as_mesos(c: &Cluster, mesos_dir: &MesosWorkDir, provider: &str) -> MesosPlugin {
    let spec = c.spec(provider);
    let info = container_info(c, provider);
    let services: Vec<&str> = info.services().map(|s| s.as_str_name()).collect();
    let id = format!(
        "{}{}-{}--{}",
        cid_prefix(provider),
        PLUGIN_TYPE.replace('.', "-"),
        spec.plugin_name,
        services.join("-")
    );
    let dir = mesos_dir.container(PLUGIN_TYPE, &spec.plugin_name, &id, &info);
    let socket_dir = std::fs::read_link(dir.join("endpoint")).unwrap();
    let socket = socket_dir.join("endpoint.sock");
    let mount_root = mesos_dir
        .plugin_dir(PLUGIN_TYPE, &spec.plugin_name)
        .join("mounts");
    std::fs::create_dir_all(&mount_root).unwrap();

    let mut command = info.command.clone().unwrap_or_default();
    let vars = &mut command
        .environment
        .get_or_insert_with(Default::default)
        .variables;
    for (name, value) in [
        ("CSI_ENDPOINT", format!("unix://{}", socket.display())),
        ("MESOS_AGENT_ID", AGENT_ID.to_owned()),
    ] {
        vars.push(mesos::environment::Variable {
            name: name.into(),
            value: Some(value),
            ..Default::default()
        });
    }
    let socket_dir = socket_dir.display().to_string();
    let mount_root = mount_root.display().to_string();
    let container = mesos::ContainerInfo {
        r#type: mesos::container_info::Type::Mesos as i32,
        volumes: vec![
            mesos::Volume {
                mode: mesos::volume::Mode::Rw as i32,
                container_path: socket_dir.clone(),
                host_path: Some(socket_dir),
                ..Default::default()
            },
            mesos::Volume {
                mode: mesos::volume::Mode::Rw as i32,
                container_path: mount_root.clone(),
                source: Some(mesos::volume::Source {
                    r#type: Some(mesos::volume::source::Type::HostPath as i32),
                    host_path: Some(mesos::volume::source::HostPath {
                        path: mount_root,
                        mount_propagation: Some(mesos::MountPropagation {
                            mode: Some(mesos::mount_propagation::Mode::Bidirectional as i32),
                        }),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let call = agent::Call {
        r#type: Some(agent::call::Type::LaunchContainer as i32),
        launch_container: Some(agent::call::LaunchContainer {
            container_id: mesos::ContainerId {
                value: id.clone(),
                parent: None,
            },
            command: Some(command),
            resources: info.resources.clone(),
            container: Some(container),
            limits: Default::default(),
        }),
        ..Default::default()
    };
    let (status, body) = operator_call(c, &call).await;
    assert_eq!(status, 200, "LAUNCH_CONTAINER as Mesos: {body}");
    c.within("the Mesos-launched plugin's socket", async {
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    MesosPlugin { id, socket }
}

/// One operator API call to the manager (`POST /slave(1)/api/v1`, protobuf) with the
/// provider's token, as a Mesos SLRP's service manager sends it: `(status, body)`.
async fn operator_call(c: &Cluster, call: &agent::Call) -> (u16, String) {
    let token = std::fs::read_to_string(c.path("agent.token")).unwrap();
    let url = c.agent_url();
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let body = call.encode_to_vec();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /slave(1)/api/v1 HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nAccept: application/x-protobuf\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let mut raw = Vec::new();
    c.within("the operator API's answer", s.read_to_end(&mut raw))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text}"));
    (status, text)
}

/// Path B of the migration with no Mesos checkpoint but the plugin's: the plugin a Mesos
/// SLRP launched keeps running under the agent, and `slrp run --plugin-backend agent`
/// builds the same container ID and `container.info`, so its LAUNCH is answered 202 and
/// it re-uses that process (no second plugin, no termination) and its socket.
async fn a_plugin_a_mesos_slrp_launched_is_adopted(csi: &'static str) {
    let options = DaemonOptions {
        agent_backend: true,
        manager_agent_id: Some(AGENT_ID.into()),
        ..DaemonOptions::with_profiles()
    };
    let mut c = Cluster::new(vec![ProviderSpec::fixture().csi(csi)], options).await;
    c.set_profiles(&profiles(&["test"]));
    let mesos_dir = MesosWorkDir::new(c.path("work")).temp_dir(c.path("tmp"));
    let plugin = launch_as_mesos(&c, &mesos_dir, "test").await;
    let pid = c.plugin_pid("test");
    assert_eq!(c.agent_plugin_container("test").await.pid, Some(pid));
    let info_path = mesos_dir
        .plugin_dir(PLUGIN_TYPE, "local")
        .join("containers")
        .join(&plugin.id)
        .join("container.info");
    let info_before = std::fs::read(&info_path).unwrap();

    c.drain_messages();
    c.start_daemon();
    let mut launched = Vec::new();
    let update = loop {
        match c.next_message().await {
            ManagerMessage::ContainerLaunched { id } => launched.push(id),
            ManagerMessage::UpdateState {
                provider_id,
                resources,
                resource_version_uuid,
                ..
            } => {
                let u = support::Update::new(provider_id, &resources, &resource_version_uuid);
                if u.pool("test").is_some() {
                    break u;
                }
            }
            _ => {}
        }
    };
    assert!(
        launched.is_empty(),
        "the Mesos container is re-used, not launched again: {launched:?}"
    );
    assert_eq!(update.pools().len(), 1, "{:?}", update.resources);
    assert_eq!(c.plugin_pids("test"), [pid], "one plugin process, Mesos's");
    let view = c.agent_plugin_container("test").await;
    assert_eq!((view.id, view.pid), (plugin.id.clone(), Some(pid)));
    assert!(plugin.socket.exists(), "the socket Mesos's plugin serves");
    let key = format!(
        "resource_providers/{}/csi_plugin/container_terminations",
        c.spec("test").key()
    );
    assert_eq!(c.snapshot().await.get(&key), Some(&0.0));
    // slrp's checkpoint of the container is Mesos's, byte for byte (the keep rule of a
    // later Mesos or slrp recovery compares it).
    assert_eq!(std::fs::read(&info_path).unwrap(), info_before);
    c.finish().await;
}
csi_versions!(a_plugin_a_mesos_slrp_launched_is_adopted);

/// The Mesos provider's id, as its `latest` link and the agent's registrar know it.
const RP_ID: &str = "mesos-rp-0001";

/// `slrp csi --endpoint unix://<socket> --json ARGS`: the calls Mesos's volume manager
/// makes, with the plugin Mesos launched. Its JSON answer.
fn csi(socket: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("csi")
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--json")
        .args(args)
        .env_remove("SLRP_LOG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "slrp csi {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

/// A Mesos disk resource of the provider as JSON (before the downgrade the fixture does).
fn mesos_disk(mb: f64, source: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "name": "disk", "type": "SCALAR", "scalar": {"value": mb},
        "provider_id": {"value": RP_ID},
        "reservations": [{"type": "DYNAMIC", "role": support::DEFAULT_ROLE}],
        "disk": {"source": source}
    })
}

fn mesos_uuid(u: uuid::Uuid) -> mesos::Uuid {
    mesos::Uuid {
        value: u.as_bytes().to_vec(),
    }
}

fn status(state: mesos::OperationState, converted: &[serde_json::Value]) -> mesos::OperationStatus {
    mesos::OperationStatus {
        state: state as i32,
        uuid: Some(mesos_uuid(uuid::Uuid::new_v4())),
        converted_resources: converted.iter().map(support::ops::resource).collect(),
        resource_provider_id: Some(mesos::ResourceProviderId {
            value: RP_ID.into(),
        }),
        agent_id: Some(mesos::AgentId {
            value: AGENT_ID.into(),
        }),
        ..Default::default()
    }
}

fn create_disk(
    uuid: uuid::Uuid,
    source: &serde_json::Value,
    latest: mesos::OperationStatus,
    statuses: Vec<mesos::OperationStatus>,
) -> mesos::Operation {
    mesos::Operation {
        framework_id: Some(support::framework_id()),
        agent_id: Some(mesos::AgentId {
            value: AGENT_ID.into(),
        }),
        info: slrp_wire::json::from_value(serde_json::json!({
            "type": "CREATE_DISK",
            "create_disk": {"source": source, "target_type": "MOUNT"}
        }))
        .unwrap(),
        latest_status: latest,
        statuses,
        uuid: mesos_uuid(uuid),
    }
}

/// The mount points under the test's directory with their sources (mountinfo fields 4, 5
/// and 10), to compare the mount table before and after.
fn mount_table(under: &std::path::Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut rows: Vec<String> = info
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| p.starts_with(&*under.to_string_lossy()))
        })
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            format!(
                "{} {} {}",
                f[3],
                f[4],
                f.get(f.len().saturating_sub(2)).unwrap_or(&"")
            )
        })
        .collect();
    rows.sort();
    rows
}

/// Everything under `root` that is a regular file, with its bytes (Mesos's checkpoints
/// must stay untouched).
fn files(root: &std::path::Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &std::path::Path, out: &mut std::collections::BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(&p, out);
            } else if meta.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, &mut out);
    out
}

/// A volume as the Mesos volume manager leaves it: created (name = the CREATE_DISK's
/// uuid), and per `stage`/`publish` staged and published at Mesos's paths; its
/// `volume.state` checkpointed. Returns its id and disk resource (as the RP state has it).
fn mesos_volume(
    mesos_dir: &MesosWorkDir,
    socket: &std::path::Path,
    name: uuid::Uuid,
    state: slrp_proto::mesos::csi::state::volume_state::State,
    boot_id: &str,
) -> (String, serde_json::Value) {
    use slrp_proto::mesos::csi::state::volume_state::State;
    let created = csi(
        socket,
        &[
            "create-volume",
            "--name",
            &name.to_string(),
            "--size",
            "1GiB",
        ],
    );
    let id = created["volume_id"].as_str().unwrap().to_owned();
    let context: std::collections::HashMap<String, String> = created["volume_context"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let context_args: Vec<String> = context.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let (staging, target) = mesos_dir.mount_dirs(PLUGIN_TYPE, "local", &id);
    let (staging, target) = (staging.display().to_string(), target.display().to_string());
    let with_context = |mut args: Vec<String>| {
        for c in &context_args {
            args.extend(["--context".to_owned(), c.clone()]);
        }
        args
    };
    if matches!(state, State::VolReady | State::Published) {
        let args = with_context(vec![
            "stage".into(),
            id.clone(),
            "--staging-path".into(),
            staging.clone(),
        ]);
        csi(socket, &args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    if state == State::Published {
        let args = with_context(vec![
            "publish".into(),
            id.clone(),
            "--target-path".into(),
            target.clone(),
            "--staging-path".into(),
            staging,
        ]);
        csi(socket, &args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let capability = slrp_wire::json::from_value(serde_json::json!({
        "mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}
    }))
    .unwrap();
    let staged = state != State::Created;
    mesos_dir.volume(
        PLUGIN_TYPE,
        "local",
        &id,
        &slrp_proto::mesos::csi::state::VolumeState {
            state: state as i32,
            volume_capability: Some(capability),
            volume_context: context.clone(),
            boot_id: if staged {
                boot_id.to_owned()
            } else {
                String::new()
            },
            node_publish_required: state == State::Published,
            ..Default::default()
        },
    );
    let labels: Vec<serde_json::Value> = {
        let mut l: Vec<_> = context.iter().collect();
        l.sort();
        l.into_iter()
            .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
            .collect()
    };
    let mut source = serde_json::json!({
        "type": "MOUNT",
        "mount": {"root": format!("./csi/{PLUGIN_TYPE}/local/mounts")},
        "vendor": format!("{PLUGIN_TYPE}.local"),
        "id": id,
        "profile": "test",
    });
    if !labels.is_empty() {
        source["metadata"] = serde_json::json!({"labels": labels});
    }
    (id, mesos_disk(1024.0, source))
}

/// Runs `slrp import-mesos` on the cluster's directories with `extra` flags.
fn import(c: &Cluster, extra: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("import-mesos")
        .arg("--work-dir")
        .arg(c.path("work"))
        .arg("--resource-provider-config-dir")
        .arg(c.path("rp"))
        .arg("--state-dir")
        .arg(c.state_dir())
        .arg("--config")
        .arg(c.path("slrp.toml"))
        .args(extra)
        .env_remove("SLRP_LOG")
        .output()
        .unwrap()
}

/// The brief's "Must show" of #13 (path B): the test plays a Mesos SLRP that launched its
/// plugin through the agent, created three volumes (PUBLISHED with a file in it, VOL_READY,
/// CREATED), and checkpointed its state: the RP state with downgraded resources, a FINISHED
/// CREATE_DISK whose update was never acknowledged (its stream torn at the end), a FINISHED
/// one acknowledged (forgotten), and a PENDING CREATE_DISK not applied yet. Then
/// `slrp import-mesos` refuses strictly (exit 78, naming the torn stream), reports with
/// `--lenient --dry-run` writing nothing, imports with `--lenient`, and
/// `slrp run --plugin-backend agent` takes over: the same provider id (pre-admitted by the
/// agent's registrar), the plugin adopted (same pid), no NodeUnpublish / NodeUnstage /
/// DeleteVolume, the mount table unchanged, the unacknowledged status delivered and
/// acknowledged, the PENDING CREATE_DISK finished, nothing of the forgotten operation resent,
/// the file still readable.
#[tokio::test]
async fn import_takes_over_a_mesos_provider() {
    if slrp_test_support::require_root("import_takes_over_a_mesos_provider") {
        take_over(StopPath::B).await;
    }
}

/// Path A of the migration: the Mesos provider's plugin container was killed before the
/// import (as REMOVE_RESOURCE_PROVIDER_CONFIG does: KILL, then WAIT), its published and
/// staged mounts staying in the host's mount table. slrp relaunches the plugin through
/// LAUNCH_CONTAINER under the same container ID and keeps every mount (no NodeUnpublish,
/// NodeUnstage or DeleteVolume, the mount table unchanged, the file readable); the rest as
/// [`import_takes_over_a_mesos_provider`].
#[tokio::test]
async fn import_path_a_relaunches_the_plugin_and_keeps_mounts() {
    if slrp_test_support::require_root("import_path_a_relaunches_the_plugin_and_keeps_mounts") {
        take_over(StopPath::A).await;
    }
}

/// How the Mesos provider was stopped before the import (docs/migrating-from-mesos.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopPath {
    /// REMOVE_RESOURCE_PROVIDER_CONFIG: the agent killed the plugin container.
    A,
    /// The agent restarted without the provider's config: the container runs on.
    B,
}

/// The Mesos SLRP's state as above, stopped by `path`, imported and taken over.
async fn take_over(path: StopPath) {
    use slrp_proto::mesos::csi::state::volume_state::State;
    let options = DaemonOptions {
        agent_backend: true,
        manager_agent_id: Some(AGENT_ID.into()),
        preadmitted: vec![slrp_manager::registrar::ProviderRecord {
            id: RP_ID.into(),
            kind: support::RP_TYPE.into(),
            name: "test".into(),
        }],
        ..DaemonOptions::with_profiles()
    };
    let mut c = Cluster::new(vec![ProviderSpec::fixture()], options).await;
    c.set_profiles(&profiles(&["test"]));
    let boot = slrp_types::read_boot_id().unwrap().to_string();
    let mesos_dir = MesosWorkDir::new(c.path("work"))
        .temp_dir(c.path("tmp"))
        .agent(AGENT_ID)
        .boot_id(&boot);
    let plugin = launch_as_mesos(&c, &mesos_dir, "test").await;
    let pid = c.plugin_pid("test");

    // The Mesos volume manager's work.
    let (op_a, op_b, op_pending) = (
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
    );
    let (vol_a, disk_a) = mesos_volume(&mesos_dir, &plugin.socket, op_a, State::Published, &boot);
    let (_vol_b, disk_b) = mesos_volume(&mesos_dir, &plugin.socket, op_b, State::VolReady, &boot);
    let (_vol_c, disk_c) = mesos_volume(
        &mesos_dir,
        &plugin.socket,
        uuid::Uuid::new_v4(),
        State::Created,
        &boot,
    );
    let target_a = mesos_dir.mount_dirs(PLUGIN_TYPE, "local", &vol_a).1;
    std::fs::write(target_a.join("data"), b"written under Mesos").unwrap();

    // The provider's checkpoints: 4096 MB pool less three 1 GiB disks.
    let pool = |mb: f64| {
        mesos_disk(
            mb,
            serde_json::json!({"type": "RAW", "vendor": format!("{PLUGIN_TYPE}.local"), "profile": "test"}),
        )
    };
    let finished_a = status(
        mesos::OperationState::OperationFinished,
        std::slice::from_ref(&disk_a),
    );
    let finished_b = status(
        mesos::OperationState::OperationFinished,
        std::slice::from_ref(&disk_b),
    );
    let pending = status(mesos::OperationState::OperationPending, &[]);
    let pending_source = pool(512.0);
    let operations = vec![
        create_disk(
            op_a,
            &pool(1024.0),
            finished_a.clone(),
            vec![finished_a.clone()],
        ),
        create_disk(
            op_b,
            &pool(1024.0),
            finished_b.clone(),
            vec![finished_b.clone()],
        ),
        create_disk(op_pending, &pending_source, pending, vec![]),
    ];
    let total = [pool(1024.0), disk_a.clone(), disk_b.clone(), disk_c.clone()];
    let capability = slrp_wire::json::from_value(serde_json::json!({
        "mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}
    }))
    .unwrap();
    let rp = mesos_dir.provider(support::RP_TYPE, "test", RP_ID);
    rp.state(slrp_proto::mesos::resource_provider::ResourceProviderState {
        operations,
        resources: total.iter().map(support::ops::resource).collect(),
        storage: Some(slrp_proto::mesos::resource_provider::resource_provider_state::Storage {
            profiles: [(
                "test".to_owned(),
                slrp_proto::mesos::resource_provider::resource_provider_state::storage::ProfileInfo {
                    capability,
                    parameters: Default::default(),
                },
            )]
            .into(),
        }),
    });
    let mut stream_a = rp.stream(op_a);
    stream_a.update(finished_a.clone()).torn_tail(10);
    let torn = stream_a.path().to_owned();
    let status_b = uuid::Uuid::from_slice(&finished_b.uuid.as_ref().unwrap().value).unwrap();
    rp.stream(op_b).update(finished_b.clone()).ack(status_b);

    if path == StopPath::A {
        let id = mesos::ContainerId {
            value: plugin.id.clone(),
            parent: None,
        };
        let kill = agent::Call {
            r#type: Some(agent::call::Type::KillContainer as i32),
            kill_container: Some(agent::call::KillContainer {
                container_id: id.clone(),
                signal: None,
            }),
            ..Default::default()
        };
        assert_eq!(operator_call(&c, &kill).await.0, 200);
        let wait = agent::Call {
            r#type: Some(agent::call::Type::WaitContainer as i32),
            wait_container: Some(agent::call::WaitContainer { container_id: id }),
            ..Default::default()
        };
        assert!(matches!(operator_call(&c, &wait).await.0, 200 | 404));
        c.within("the killed Mesos plugin to be gone", async {
            while !c.plugin_pids("test").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }
    let mounts_before = mount_table(c.dir.path());
    assert_eq!(
        mounts_before.len(),
        3,
        "published and staged: {mounts_before:?}"
    );
    let mesos_files = files(&c.path("work").join("meta"));
    c.count_calls(
        "test",
        &[
            "NodeUnpublishVolume",
            "NodeUnstageVolume",
            "DeleteVolume",
            "CreateVolume",
        ],
    );

    // Strict: refused, naming the torn stream; nothing written.
    let out = import(&c, &[]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains(&*torn.to_string_lossy()), "{err}");
    assert!(!c.state_dir().join("providers").exists(), "nothing written");
    // A lenient dry run reports and writes nothing.
    let out = import(&c, &["--lenient", "--dry-run"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [RP_ID, AGENT_ID, "dry run", "torn"] {
        assert!(report.contains(needle), "{needle:?} not in {report}");
    }
    assert!(!c.state_dir().join("providers").exists(), "nothing written");
    // Imported.
    let out = import(&c, &["--lenient"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    c.drain_messages();
    c.start_daemon();
    let mut launched = Vec::new();
    let mut subscribed = None;
    let mut resent_a = 0;
    let mut pending_done = None;
    let mut first_update = None;
    while subscribed.is_none() || resent_a == 0 || pending_done.is_none() {
        match c.next_message().await {
            ManagerMessage::Subscribed { info } => subscribed = info.id.map(|i| i.value),
            ManagerMessage::ContainerLaunched { id } => launched.push(id),
            ManagerMessage::UpdateState {
                resources,
                operations,
                ..
            } if first_update.is_none() => {
                first_update = Some((
                    resources
                        .iter()
                        .map(support::ops::json_of)
                        .collect::<Vec<_>>(),
                    operations
                        .iter()
                        .map(|o| uuid::Uuid::from_slice(&o.uuid.value).unwrap())
                        .collect::<std::collections::BTreeSet<_>>(),
                ));
            }
            ManagerMessage::UpdateOperationStatus { update, .. } => {
                let op = uuid::Uuid::from_slice(&update.operation_uuid.value).unwrap();
                assert_ne!(
                    op, op_b,
                    "the acknowledged operation is forgotten, never resent"
                );
                if op == op_a {
                    assert_eq!(
                        update.status.uuid, finished_a.uuid,
                        "the unacknowledged status itself"
                    );
                    resent_a += 1;
                }
                if op == op_pending
                    && support::ops::state_name(&update.status) == "OPERATION_FINISHED"
                {
                    pending_done = Some(update.status.clone());
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        subscribed.as_deref(),
        Some(RP_ID),
        "the Mesos provider's id"
    );
    match path {
        StopPath::B => {
            assert!(launched.is_empty(), "the plugin is adopted: {launched:?}");
            assert_eq!(c.plugin_pids("test"), [pid], "Mesos's plugin process");
        }
        StopPath::A => {
            assert_eq!(
                launched,
                std::slice::from_ref(&plugin.id),
                "relaunched under Mesos's ID"
            );
            let view = c.agent_plugin_container("test").await;
            assert_eq!(
                c.plugin_pids("test"),
                view.pid.into_iter().collect::<Vec<_>>()
            );
            assert_ne!(view.pid, Some(pid));
        }
    }
    let converted = support::ops::converted(&pending_done.unwrap());
    assert_eq!(converted.len(), 1, "{converted:?}");
    assert_eq!(support::mb(&converted[0]), 512.0);

    // The agent's view: Mesos's total with the PENDING CREATE_DISK applied.
    // Both FINISHED statuses were acknowledged by the master: the agent's table forgets an
    // operation once its terminal status is acknowledged.
    c.within("the acknowledgements of both statuses", async {
        loop {
            let views = c.manager().providers().await.unwrap();
            if views.iter().all(|v| v.operations.is_empty()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let views = c.manager().providers().await.unwrap();
    let view = views.iter().find(|v| v.info.name == "test").unwrap();
    let disks: std::collections::BTreeSet<String> = view
        .resources
        .iter()
        .map(support::ops::json_of)
        .filter_map(|r| support::source(&r)["id"].as_str().map(str::to_owned))
        .collect();
    let mut want: std::collections::BTreeSet<String> = [&disk_a, &disk_b, &disk_c]
        .iter()
        .map(|d| support::source(d)["id"].as_str().unwrap().to_owned())
        .collect();
    want.insert(
        support::source(&converted[0])["id"]
            .as_str()
            .unwrap()
            .to_owned(),
    );
    assert_eq!(disks, want);
    let pools: Vec<f64> = view
        .resources
        .iter()
        .map(support::ops::json_of)
        .filter(|r| support::source(r)["type"] == "RAW")
        .map(|r| support::mb(&r))
        .collect();
    assert_eq!(
        pools,
        [512.0],
        "the pool less the PENDING CREATE_DISK's disk"
    );
    // The first UPDATE_STATE: Mesos's state, upgraded, and its operations less the
    // forgotten one.
    let (first_total, first_ops) = first_update.expect("an UPDATE_STATE");
    let normal = |rs: &[serde_json::Value]| {
        sorted(
            &rs.iter()
                .map(|r| support::ops::json_of(&support::ops::resource(r)))
                .collect::<Vec<_>>(),
        )
    };
    // slrp re-applies the PENDING CREATE_DISK before its first UPDATE_STATE (as Mesos's
    // recovery does): Mesos's total with that conversion.
    let mut want_total = vec![pool(512.0), disk_a.clone(), disk_b.clone(), disk_c.clone()];
    want_total.push(converted[0].clone());
    assert_eq!(
        normal(&first_total),
        normal(&want_total),
        "Mesos's total, upgraded"
    );
    let want_ops = std::collections::BTreeSet::from([op_a, op_pending]);
    assert_eq!(
        first_ops, want_ops,
        "Mesos's operations less the acknowledged one"
    );

    assert_eq!(c.calls("test", "NodeUnpublishVolume"), 0);
    assert_eq!(c.calls("test", "NodeUnstageVolume"), 0);
    assert_eq!(c.calls("test", "DeleteVolume"), 0);
    assert_eq!(
        c.calls("test", "CreateVolume"),
        1,
        "the PENDING CREATE_DISK only"
    );
    assert_eq!(mount_table(c.dir.path()), mounts_before, "no mount changed");
    assert_eq!(
        std::fs::read(target_a.join("data")).unwrap(),
        b"written under Mesos"
    );
    assert_eq!(
        files(&c.path("work").join("meta")),
        mesos_files,
        "Mesos's files untouched"
    );
    c.finish().await;
}
