//! One provider's plugin stack with the agent backend: the real bundled plugin
//! (`slrp-csi-local`) launched as a standalone container of the embedded manager (the
//! POSIX launcher of a Mesos agent), probed over its socket, prepared as Mesos prepares
//! it, stopped through KILL/WAIT, and re-attached after a hand-over.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_agent::{AgentConfig, AgentEndpoint};
use slrp_manager::{EmbeddedManager, Listen, ManagerConfig, ManagerGuard, ManagerHandle};
use slrp_proto::mesos::v1 as mesos;
use slrp_provider::metrics::ProviderMetrics;
use slrp_provider::stack::{PluginStack, StackConfig, StopPlugins};
use slrp_store::Store;
use slrp_supervisor::{AgentBackend, AgentBackendConfig};
use slrp_test_support::csi_local_bin;
use slrp_test_support::harness::within;
use tokio_util::sync::CancellationToken;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
const CID: &str = "org-apache-mesos-rp-local-storage-test--org-apache-mesos-csi-test-local--CONTROLLER_SERVICE-NODE_SERVICE";

struct Env {
    dir: tempfile::TempDir,
    store: Store,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state/store")).unwrap();
        Self { dir, store }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    async fn manager(&self) -> (ManagerHandle, ManagerGuard) {
        self.manager_with(None).await
    }

    /// A manager (an agent with `--jwt_secret_key` when `secret` is set) whose containers
    /// survive its restart.
    async fn manager_with(&self, secret: Option<&str>) -> (ManagerHandle, ManagerGuard) {
        let mut config = ManagerConfig::new(Listen::Unix(self.path("agent.sock")));
        config.state_dir = Some(self.path("manager"));
        config.containers_dir = Some(self.path("work/containers"));
        config.jwt_secret = secret.map(slrp_manager::Secret::new);
        EmbeddedManager::spawn(config, CancellationToken::new())
            .await
            .unwrap()
    }

    fn info(&self) -> mesos::ResourceProviderInfo {
        let json = serde_json::json!({
            "type": RP_TYPE,
            "name": "test",
            "default_reservations": [ { "type": "DYNAMIC", "role": "storage" } ],
            "storage": {
                "plugin": {
                    "type": "org.apache.mesos.csi.test",
                    "name": "local",
                    "containers": [{
                        "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                        "command": {
                            "shell": false,
                            "value": csi_local_bin(),
                            "arguments": [
                                "slrp-csi-local",
                                "--root", self.path("plugin-root"),
                                "--node-id", "node-1",
                                "--pool", "default=1GiB",
                            ]
                        },
                        "resources": [
                            { "name": "cpus", "type": "SCALAR", "scalar": { "value": 0.1 } }
                        ]
                    }],
                },
            }
        });
        slrp_wire::json::from_value(json).unwrap()
    }

    fn config(&self) -> StackConfig {
        self.config_with(None)
    }

    fn config_with(&self, token: Option<String>) -> StackConfig {
        let url = format!("unix://{}", self.path("agent.sock").display());
        let mut agent = AgentConfig::new(AgentEndpoint::parse(&url).unwrap());
        agent.token = token.map(slrp_agent::Token::new);
        let backend = AgentBackend::new(AgentBackendConfig::new(
            agent,
            self.path("work"),
            RP_TYPE,
            "test",
        ))
        .unwrap();
        let mut cfg = StackConfig::new(
            self.info(),
            self.path("work"),
            self.path("state/plugins"),
            self.store.clone(),
        );
        cfg.supervisor.socket_base = self.dir.path().to_owned();
        cfg.supervisor.ready_probe_interval = Duration::from_millis(20);
        cfg.supervisor.stop_grace = Duration::from_secs(5);
        cfg.supervisor.agent_id = Some("agent-S0".into());
        cfg.supervisor.backend = Arc::new(backend);
        cfg.ready_timeout = Duration::from_secs(30);
        cfg
    }

    async fn start(&self, m: &ProviderMetrics) -> PluginStack {
        within(PluginStack::start(
            self.config(),
            m,
            CancellationToken::new(),
        ))
        .await
        .unwrap()
    }
}

async fn pids(m: &ManagerHandle) -> Vec<(String, Option<i32>)> {
    m.containers()
        .await
        .into_iter()
        .map(|c| (c.id, c.pid))
        .collect()
}

#[tokio::test]
async fn the_real_plugin_runs_as_an_agent_container_and_is_re_attached_after_a_hand_over() {
    let env = Env::new();
    let (manager, guard) = env.manager().await;
    let metrics = ProviderMetrics::new(RP_TYPE, "test");
    let stack = env.start(&metrics).await;
    // Prepared as Mesos prepares a plugin: the CSI calls went over the container's socket.
    assert!(!stack.prepared().plugin_infos.is_empty());
    let running = pids(&manager).await;
    let [(id, Some(pid))] = running.as_slice() else {
        panic!("one running container expected: {running:?}");
    };
    assert_eq!(id, CID);
    let pid = *pid;
    stack.shutdown(StopPlugins::Leave).await;
    assert_eq!(pids(&manager).await, [(CID.to_owned(), Some(pid))]);

    // The next start re-attaches (LAUNCH answered 202): the same process.
    let stack = env.start(&metrics).await;
    assert_eq!(pids(&manager).await, [(CID.to_owned(), Some(pid))]);
    assert_eq!(metrics.supervisor().terminations_total(), 0);
    stack.shutdown(StopPlugins::Stop).await;
    assert!(
        manager.containers().await.is_empty(),
        "KILL and WAIT on stop"
    );
    assert_eq!(
        manager.metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS],
        0.0
    );
    guard.shutdown().await;
}

#[tokio::test]
async fn a_refused_relaunch_fails_the_plugin_for_good() {
    let env = Env::new();
    let (_manager, guard) = env.manager_with(Some("first-secret")).await;
    // The token the agent minted for this provider: its cid_prefix claim.
    let secret = slrp_manager::Secret::new("first-secret");
    let token = slrp_manager::jwt::mint(
        &secret,
        r#"{"cid_prefix":"org-apache-mesos-rp-local-storage-test--"}"#,
    );
    let metrics = ProviderMetrics::new(RP_TYPE, "test");
    let stack = within(PluginStack::start(
        env.config_with(Some(token)),
        &metrics,
        CancellationToken::new(),
    ))
    .await
    .unwrap();
    // The agent comes back with another secret: the provider's token is no longer valid.
    guard.shutdown().await;
    let (manager, guard) = env.manager_with(Some("second-secret")).await;
    let (container, reason) = within(stack.plugin_failed()).await;
    assert_eq!(
        container,
        "org-apache-mesos-csi-test-local--CONTROLLER_SERVICE-NODE_SERVICE"
    );
    assert!(reason.contains("401"), "{reason}");
    assert_eq!(
        metrics
            .supervisor()
            .terminations(&container, slrp_supervisor::TerminationCause::Refused),
        1
    );
    stack.shutdown(StopPlugins::Stop).await;
    manager.destroy_containers().await;
    guard.shutdown().await;
}
