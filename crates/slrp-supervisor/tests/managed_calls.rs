//! CSI calls through the supervisor's managed clients against the real `slrp-csi-local`:
//! a call issued while the plugin is killed and restarted waits for it (Mesos's
//! `ROOT_PublishUnpublishResourcesPluginKilled`), a call whose deadline passes first
//! fails naming its RPC, and controller and node calls reach their own containers.
//!
//! Stage and publish make real bind mounts, so these tests need root; without it each one
//! prints why and returns.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use slrp_csi::*;
use slrp_proto::mesos::v1 as mesos;
use slrp_supervisor::*;
use slrp_test_support::{csi_local_bin, sh_quote};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

macro_rules! require_root {
    () => {
        if !slrp_test_support::require_root(&slrp_test_support::current_test()) {
            return;
        }
    };
}

type ServiceList = Vec<mesos::csi_plugin_container_info::Service>;

/// A test directory; unmounts whatever is left under it on drop.
struct Env {
    dir: tempfile::TempDir,
    metrics: SupervisorMetrics,
}

impl Drop for Env {
    fn drop(&mut self) {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let root = self.dir.path().to_str().unwrap().to_owned();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&root))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in ours {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            metrics: SupervisorMetrics::default(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn container(&self, root: &str, services: ServiceList) -> mesos::CsiPluginContainerInfo {
        let cmd = format!(
            "exec {} --root {} --node-id n1",
            sh_quote(csi_local_bin().to_str().unwrap()),
            sh_quote(self.path(root).to_str().unwrap()),
        );
        mesos::CsiPluginContainerInfo {
            services: services.into_iter().map(|s| s as i32).collect(),
            command: Some(mesos::CommandInfo {
                value: Some(cmd),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn config(&self, restart_after: Duration) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(self.path("run"));
        c.socket_base = self.dir.path().to_owned();
        c.ready_probe_interval = Duration::from_millis(20);
        c.probe_timeout = Duration::from_secs(2);
        c.restart_backoff = Backoff::new(restart_after, restart_after).unwrap();
        c.restart_jitter = Jitter::None;
        c.stop_grace = Duration::from_secs(5);
        c
    }

    async fn start(
        &self,
        containers: Vec<mesos::CsiPluginContainerInfo>,
        restart_after: Duration,
    ) -> SupervisorHandle {
        let info = mesos::CsiPluginInfo {
            r#type: "io.slrp.csi-local".into(),
            name: Some("test".into()),
            containers,
            ..Default::default()
        };
        let PluginDeployment::Managed(spec) = deployment_from_info(&info).unwrap() else {
            panic!("not managed");
        };
        Supervisor::start(
            spec,
            self.config(restart_after),
            CsiProbe::new(Duration::from_secs(2), CsiMetrics::default()),
            self.metrics.clone(),
            CancellationToken::new(),
        )
        .await
        .unwrap()
    }

    /// One container serving both services.
    async fn start_one(&self, restart_after: Duration) -> SupervisorHandle {
        use mesos::csi_plugin_container_info::Service as S;
        let c = self.container("root", vec![S::ControllerService, S::NodeService]);
        let h = self.start(vec![c], restart_after).await;
        h.wait_ready(Service::Node, WAIT).await.unwrap();
        h
    }
}

fn client_config(timeout: Duration) -> ClientConfig {
    ClientConfig::default().rpc_timeout(timeout)
}

fn ready_pid(h: &SupervisorHandle, service: Service) -> i32 {
    match h.state(service).unwrap() {
        ContainerState::Ready { pid } => pid,
        other => panic!("not ready: {other:?}"),
    }
}

/// kill -9 the plugin serving `service` and wait until the supervisor has noticed.
async fn kill_plugin(h: &SupervisorHandle, service: Service) -> i32 {
    let pid = ready_pid(h, service);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut rx = h.watch(service).unwrap();
    tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| !matches!(s, ContainerState::Ready { .. })),
    )
    .await
    .expect("the supervisor never noticed the kill")
    .unwrap();
    pid
}

async fn create(c: &impl CsiVolumes, name: &str) -> VolumeId {
    c.create_volume(&CreateVolumeRequest {
        name: name.into(),
        required_bytes: 1 << 20,
        limit_bytes: 0,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: Secrets::default(),
        content_source: None,
    })
    .await
    .unwrap()
    .volume_id
}

fn stage_request(id: &VolumeId, staging: &Path) -> NodeStageRequest {
    NodeStageRequest {
        volume_id: id.clone(),
        publish_context: StringMap::new(),
        staging_target_path: staging.to_str().unwrap().into(),
        capability: VolumeCapability::mount_default(),
        volume_context: StringMap::new(),
        secrets: Secrets::default(),
    }
}

#[tokio::test]
async fn stage_and_publish_issued_while_the_plugin_is_killed_wait_for_its_restart() {
    require_root!();
    let env = Env::new();
    let h = env.start_one(Duration::from_millis(200)).await;
    let services = h
        .services(client_config(WAIT), CsiMetrics::default())
        .unwrap();
    let caps = services.capabilities().await.unwrap();
    assert!(caps.node.stage_unstage_volume);
    let id = create(&services, "across-a-kill").await;

    let first = kill_plugin(&h, Service::Node).await;
    let staging = env.path("mnt/staging");
    std::fs::create_dir_all(&staging).unwrap();
    services
        .node_stage(&stage_request(&id, &staging))
        .await
        .unwrap();

    kill_plugin(&h, Service::Node).await;
    let target = env.path("mnt/target");
    services
        .node_publish(&NodePublishRequest {
            volume_id: id.clone(),
            publish_context: StringMap::new(),
            staging_target_path: Some(staging.to_str().unwrap().into()),
            target_path: target.to_str().unwrap().into(),
            capability: VolumeCapability::mount_default(),
            readonly: false,
            volume_context: StringMap::new(),
            secrets: Secrets::default(),
        })
        .await
        .unwrap();
    std::fs::write(target.join("data"), b"x").unwrap();
    assert_ne!(ready_pid(&h, Service::Node), first);
    let container = h.containers()[0].0.clone();
    assert_eq!(
        env.metrics
            .terminations(&container, TerminationCause::Exited),
        2
    );

    services
        .node_unpublish(&id, target.to_str().unwrap())
        .await
        .unwrap();
    services
        .node_unstage(&id, staging.to_str().unwrap())
        .await
        .unwrap();
    h.shutdown().await;
}

#[tokio::test]
async fn a_call_whose_deadline_passes_while_the_plugin_is_down_fails_naming_the_rpc() {
    require_root!();
    let env = Env::new();
    // Restarted only long after the call's deadline.
    let h = env.start_one(Duration::from_secs(60)).await;
    let services = h
        .services(
            client_config(Duration::from_millis(300)),
            CsiMetrics::default(),
        )
        .unwrap();
    services.capabilities().await.unwrap();
    let id = create(&services, "deadline").await;
    kill_plugin(&h, Service::Node).await;
    let staging = env.path("mnt/staging");
    std::fs::create_dir_all(&staging).unwrap();
    let err = services
        .node_stage(&stage_request(&id, &staging))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::NotReady {
                rpc: CsiRpc::NodeStageVolume,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("NodeStageVolume"), "{err}");
    h.shutdown().await;
}

#[tokio::test]
async fn controller_and_node_calls_reach_the_containers_that_serve_them() {
    require_root!();
    use mesos::csi_plugin_container_info::Service as S;
    let env = Env::new();
    // Two plugin processes with separate state: a volume exists only where it was made.
    let h = env
        .start(
            vec![
                env.container("controller", vec![S::ControllerService]),
                env.container("node", vec![S::NodeService]),
            ],
            Duration::from_millis(200),
        )
        .await;
    h.wait_ready(Service::Controller, WAIT).await.unwrap();
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let services = h
        .services(client_config(WAIT), CsiMetrics::default())
        .unwrap();
    let id = create(&services, "routed").await;
    let controller = services.controller().unwrap();
    let listed = controller.list_volumes(0).await.unwrap();
    assert!(listed.iter().any(|v| v.volume_id == id), "{listed:?}");
    let on_node = services.node().list_volumes(0).await.unwrap();
    assert!(on_node.iter().all(|v| v.volume_id != id), "{on_node:?}");
    // The node container does not know the volume: the stage went there.
    let staging = env.path("mnt/staging");
    std::fs::create_dir_all(&staging).unwrap();
    let err = services
        .node_stage(&stage_request(&id, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err:?}");
    assert_ne!(
        services.controller().unwrap().endpoint(),
        services.node().endpoint()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_volume_manager_publishes_and_unpublishes_across_plugin_kills() {
    require_root!();
    use slrp_core::volume::{
        MountPaths, TargetPath, VolumeManager, VolumeManagerConfig, read_boot_id,
    };
    let env = Env::new();
    let h = env.start_one(Duration::from_millis(200)).await;
    let services = h
        .services(client_config(WAIT), CsiMetrics::default())
        .unwrap();
    let caps = services.capabilities().await.unwrap();
    let node = services.node_info().await.unwrap();
    let version = services.node().version().await.unwrap();
    let paths = MountPaths::under_work_dir(&env.path("work"), "io.slrp.csi-local", "test").unwrap();
    let cfg = VolumeManagerConfig::new(
        paths,
        node.node_id,
        caps,
        read_boot_id().unwrap(),
        TargetPath::for_plugin(version, false),
    );
    let store = slrp_store::Store::open(env.path("state")).unwrap();
    let cancel = CancellationToken::new();
    let (m, guard) =
        VolumeManager::spawn(cfg, store, std::sync::Arc::new(services), &cancel).unwrap();
    m.ready().await.unwrap();
    let v = m
        .create(slrp_core::volume::CreateVolume {
            name: "op-1".into(),
            required_bytes: 1 << 20,
            limit_bytes: 0,
            capability: VolumeCapability::mount_default(),
            parameters: StringMap::new(),
            content_source: None,
        })
        .await
        .unwrap();
    // NodeStage and NodePublish are issued while the plugin is down.
    kill_plugin(&h, Service::Node).await;
    let target = m.publish(&v.id).await.unwrap();
    std::fs::write(target.join("data"), b"x").unwrap();
    // NodeUnpublish and NodeUnstage too.
    kill_plugin(&h, Service::Node).await;
    m.unpublish(&v.id).await.unwrap();
    kill_plugin(&h, Service::Node).await;
    assert!(m.delete(&v.id).await.unwrap());
    guard.stop().await.unwrap();
    h.shutdown().await;
}
