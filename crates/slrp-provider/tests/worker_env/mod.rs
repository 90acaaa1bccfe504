//! The environment the worker tests share: a volume manager over the in-memory fake
//! plugin, the embedded manager on a unix socket, the store, and waits on the provider's
//! status.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_agent::{AgentConfig, AgentEndpoint};
use slrp_core::provider::lifecycle::Lifecycle;
use slrp_core::volume::{VolumeManager, VolumeManagerGuard, VolumeManagerHandle};
use slrp_manager::{
    EmbeddedManager, Listen, ManagerConfig, ManagerGuard, ManagerHandle, ManagerMessage,
};
use slrp_profiles::{
    Metrics as ProfileMetrics, ProfileAdaptorHandle, ProfileSource, ProfilesConfig,
};
use slrp_proto::mesos::v1::resource_provider_info::Storage;
use slrp_proto::mesos::v1::{CsiPluginInfo, Resource, ResourceProviderInfo};
use slrp_provider::metrics::ProviderMetrics;
use slrp_provider::worker::{
    Provider, ProviderDeps, ProviderHandle, ProviderParams, ProviderStatus, ProviderTask,
};
use slrp_store::Store;
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::Harness;
use slrp_types::{Backoff, Jitter};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub(crate) const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
pub(crate) const RP_NAME: &str = "test";
pub(crate) const AGENT_S0: &str = "2f7a3c1e-8d4b-4a6f-9e2d-5b8c7a1f0e3d-S0";
pub(crate) const AGENT_S1: &str = "2f7a3c1e-8d4b-4a6f-9e2d-5b8c7a1f0e3d-S1";
/// Bound for waits: a hang guard, not a deadline.
pub(crate) const HANG: Duration = Duration::from_secs(60);

pub(crate) fn info(interval: Option<f64>) -> ResourceProviderInfo {
    ResourceProviderInfo {
        r#type: RP_TYPE.into(),
        name: RP_NAME.into(),
        storage: Some(Storage {
            plugin: CsiPluginInfo {
                r#type: "org.test".into(),
                name: Some("fake".into()),
                ..CsiPluginInfo::default()
            },
            reconciliation_interval_seconds: interval,
        }),
        ..ResourceProviderInfo::default()
    }
}

/// A volume manager over a fake plugin, a manager on a unix socket, and the store.
pub(crate) struct Env {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) harness: Harness,
    pub(crate) store: Store,
    pub(crate) volumes: VolumeManagerHandle,
    pub(crate) _volumes_guard: VolumeManagerGuard,
    pub(crate) manager: Option<(ManagerHandle, ManagerGuard)>,
    pub(crate) messages: broadcast::Receiver<ManagerMessage>,
    pub(crate) profiles: Option<ProfileAdaptorHandle>,
    pub(crate) cancel: CancellationToken,
    /// `resource_version_uuid` of every UPDATE_STATE seen by `next_update`.
    pub(crate) versions: Vec<Vec<u8>>,
}

impl Env {
    pub(crate) async fn new(fake: Arc<FakeCsi>) -> Self {
        let harness = Harness::new(fake);
        let store = Store::open(harness.state_dir()).unwrap();
        let cancel = CancellationToken::new();
        let (volumes, guard) = VolumeManager::spawn(
            harness.config(),
            store.clone(),
            harness.fake.clone(),
            &cancel,
        )
        .unwrap();
        volumes.ready().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (manager, messages) =
            start_manager(dir.path(), 4 * 1024 * 1024, AGENT_S0, &cancel).await;
        Self {
            dir,
            harness,
            store,
            volumes,
            _volumes_guard: guard,
            manager: Some(manager),
            messages,
            profiles: None,
            cancel,
            versions: Vec::new(),
        }
    }

    pub(crate) fn fake(&self) -> &FakeCsi {
        &self.harness.fake
    }

    pub(crate) fn manager(&self) -> &ManagerHandle {
        &self.manager.as_ref().unwrap().0
    }

    pub(crate) fn agent(&self) -> AgentConfig {
        let socket = self.dir.path().join("agent.sock");
        let mut agent = AgentConfig::new(
            AgentEndpoint::parse(&format!("unix://{}", socket.display())).unwrap(),
        );
        agent.backoff =
            Backoff::new(Duration::from_millis(10), Duration::from_millis(200)).unwrap();
        agent.jitter = Jitter::None;
        agent
    }

    pub(crate) fn params(&self, interval: Option<f64>, agent_id: &str) -> ProviderParams {
        let mut params = ProviderParams::new(info(interval), self.agent(), agent_id.into());
        params.jitter = Jitter::None;
        params.update_backoff =
            Backoff::new(Duration::from_millis(20), Duration::from_millis(200)).unwrap();
        params.retry_backoff = params.update_backoff;
        params
    }

    pub(crate) fn deps(&self) -> ProviderDeps {
        ProviderDeps {
            volumes: self.volumes.clone(),
            store: self.store.clone(),
            profiles: self.profiles.clone(),
            metrics: ProviderMetrics::new(RP_TYPE, RP_NAME),
            agent_metrics: slrp_agent::Metrics::default(),
        }
    }

    pub(crate) async fn spawn(&self, params: ProviderParams) -> Running {
        self.spawn_with(params, self.deps()).await
    }

    /// Spawns with `deps` (e.g. metrics the test reads).
    pub(crate) async fn spawn_with(&self, params: ProviderParams, deps: ProviderDeps) -> Running {
        let cancel = self.cancel.child_token();
        let (handle, task) = Provider::spawn(params, deps, cancel.clone()).await.unwrap();
        Running {
            handle,
            task,
            cancel,
        }
    }

    pub(crate) async fn restart_manager(&mut self, max_body_bytes: usize) {
        self.restart_manager_as(max_body_bytes, AGENT_S0).await;
    }

    /// Restarts the manager serving `agent_id` on GET_AGENT (a new id: an empty registry).
    pub(crate) async fn restart_manager_as(&mut self, max_body_bytes: usize, agent_id: &str) {
        if let Some((_, guard)) = self.manager.take() {
            guard.shutdown().await;
        }
        let (manager, messages) =
            start_manager(self.dir.path(), max_body_bytes, agent_id, &self.cancel).await;
        self.manager = Some(manager);
        self.messages = messages;
    }

    pub(crate) async fn stop_manager(&mut self) {
        if let Some((_, guard)) = self.manager.take() {
            guard.shutdown().await;
        }
    }

    /// The next UPDATE_STATE the manager accepted: (provider id, resources).
    pub(crate) async fn next_update(&mut self) -> (String, Vec<Resource>) {
        let messages = &mut self.messages;
        let versions = &mut self.versions;
        tokio::time::timeout(HANG, async {
            loop {
                match messages.recv().await.unwrap() {
                    ManagerMessage::UpdateState {
                        provider_id,
                        resources,
                        resource_version_uuid,
                        ..
                    } => {
                        versions.push(resource_version_uuid.value);
                        return (provider_id, resources);
                    }
                    ManagerMessage::ProtocolViolation { reason, .. } => {
                        panic!("protocol violation: {reason}")
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("no UPDATE_STATE")
    }

    /// Profiles from a file the test rewrites (`poll_now` applies it at once).
    pub(crate) fn with_profiles(&mut self, document: &serde_json::Value) -> PathBuf {
        let path = self.dir.path().join("profiles.json");
        std::fs::write(&path, document.to_string()).unwrap();
        let config = ProfilesConfig::new(ProfileSource::File(path.clone()))
            .poll_interval(Duration::from_secs(3600))
            .max_random_wait(Duration::ZERO);
        let (handle, _task) =
            slrp_profiles::spawn(config, ProfileMetrics::default(), self.cancel.child_token());
        self.profiles = Some(handle);
        path
    }
}

/// A running provider with its own cancellation.
pub(crate) struct Running {
    pub(crate) handle: ProviderHandle,
    pub(crate) task: ProviderTask,
    pub(crate) cancel: CancellationToken,
}

impl Running {
    /// Cancels the provider and checks it ended cleanly.
    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(HANG, self.task)
            .await
            .expect("provider did not stop")
            .unwrap();
    }
}

pub(crate) async fn start_manager(
    dir: &std::path::Path,
    max_body_bytes: usize,
    agent_id: &str,
    cancel: &CancellationToken,
) -> (
    (ManagerHandle, ManagerGuard),
    broadcast::Receiver<ManagerMessage>,
) {
    let mut config = ManagerConfig::new(Listen::Unix(dir.join("agent.sock")));
    config.state_dir = Some(dir.join("manager"));
    config.max_body_bytes = max_body_bytes;
    config.agent_id = Some(agent_id.to_owned());
    // Tests acknowledge themselves (or switch to `Auto`).
    config.ack_policy = slrp_manager::AckPolicy::Manual;
    let (handle, guard) = EmbeddedManager::spawn(config, cancel.child_token())
        .await
        .unwrap();
    let messages = handle.messages();
    ((handle, guard), messages)
}

pub(crate) async fn status_until(
    handle: &ProviderHandle,
    what: &str,
    want: impl Fn(&ProviderStatus) -> bool,
) -> ProviderStatus {
    let mut rx = handle.status();
    let reached = tokio::time::timeout(HANG, async {
        rx.wait_for(|s| want(s)).await.unwrap().clone()
    })
    .await;
    match reached {
        Ok(status) => status,
        Err(_) => panic!(
            "provider never reached: {what}; now {:?}",
            *handle.status().borrow()
        ),
    }
}

pub(crate) async fn ready(handle: &ProviderHandle) -> ProviderStatus {
    status_until(handle, "READY", |s| s.lifecycle == Lifecycle::Ready).await
}

pub(crate) fn profile_doc(names: &[&str]) -> serde_json::Value {
    let matrix: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|name| {
            (
                (*name).to_owned(),
                serde_json::json!({
                    "csi_plugin_type_selector": {"plugin_type": "org.test"},
                    "volume_capabilities": {
                        "mount": {},
                        "access_mode": {"mode": "SINGLE_NODE_WRITER"}
                    }
                }),
            )
        })
        .collect();
    serde_json::json!({ "profile_matrix": matrix })
}

/// A plugin holding one pre-existing volume `vol-1` of 1 GiB.
pub(crate) fn fake_with_one_volume() -> Arc<FakeCsi> {
    let fake = FakeCsi::full();
    fake.st().volumes.insert(
        slrp_core::volume::VolumeId::new("vol-1"),
        slrp_test_support::fake_csi::FakeVolume {
            capacity: 1 << 30,
            ..Default::default()
        },
    );
    fake
}

pub(crate) fn source_of(r: &Resource) -> &slrp_proto::mesos::v1::resource::disk_info::Source {
    r.disk.as_ref().unwrap().source.as_ref().unwrap()
}

pub(crate) fn pool_profiles(resources: &[Resource]) -> Vec<String> {
    resources
        .iter()
        .filter(|r| source_of(r).id.is_none())
        .map(|r| source_of(r).profile.clone().unwrap())
        .collect()
}
