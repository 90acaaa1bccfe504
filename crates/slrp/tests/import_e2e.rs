//! Taking over from a Mesos SLRP, end to end: the test plays the Mesos SLRP against the
//! embedded manager (its plugin launched through the operator API's LAUNCH_CONTAINER with
//! Mesos's container ID, `container.info` and endpoint link, as
//! `ServiceManagerProcess::getEndpoint` does), then `slrp run --plugin-backend agent` takes
//! the running plugin over (path B of the migration: the agent keeps the container, slrp
//! re-attaches to it with LAUNCH answered 202).

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
use support::{Cluster, DaemonOptions, PLUGIN_TYPE, ProviderSpec, cid_prefix, profiles};
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
