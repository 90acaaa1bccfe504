//! The agent backend against the embedded manager's standalone containers (a Mesos agent
//! with the POSIX launcher): Mesos's container daemon tests (RestartOnTermination,
//! FailedAuthorization), the LAUNCH call field for field, recovery (adopt or retire), the
//! keep-alive loop across an agent restart, and switching backends.
//!
//! The plugins are `/bin/sh` scripts that `touch` their socket path; readiness is "the
//! socket path exists", as in tests/processes.rs.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{WAIT, eventually, running};
use prometheus_client::registry::Registry;
use slrp_agent::{AgentConfig, AgentEndpoint, Token};
use slrp_manager::{EmbeddedManager, Listen, ManagerConfig, ManagerGuard, ManagerHandle, Secret};
use slrp_proto::mesos::v1 as mesos;
use slrp_proto::mesos::v1::agent::call::LaunchContainer;
use slrp_supervisor::*;
use slrp_types::{Backoff, Jitter};
use tokio_util::sync::CancellationToken;

use mesos::csi_plugin_container_info::Service as S;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
const RP_NAME: &str = "test";
const PREFIX: &str = "org-apache-mesos-rp-local-storage-test--";

/// Ready iff the socket path exists (the scripts `touch` it).
struct FileReadiness;

impl ReadinessCheck for FileReadiness {
    fn check<'a>(&'a self, socket: &'a Path) -> CheckFuture<'a> {
        Box::pin(async move {
            if socket.exists() {
                Readiness::Ready
            } else {
                Readiness::Failed("no socket".into())
            }
        })
    }
}

/// A plugin that creates its "socket", drops a marker in its sandbox (its working
/// directory under the agent) and runs until killed.
const PLUGIN: &str = r#"s="${CSI_ENDPOINT#unix://}"; touch "$s" marker; exec sleep 1000"#;

fn container(services: &[S], script: &str) -> mesos::CsiPluginContainerInfo {
    mesos::CsiPluginContainerInfo {
        services: services.iter().map(|s| *s as i32).collect(),
        command: Some(mesos::CommandInfo {
            value: Some(script.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn spec_of(containers: Vec<mesos::CsiPluginContainerInfo>, checks: SpecChecks) -> PluginSpec {
    let info = mesos::CsiPluginInfo {
        r#type: "io.slrp.test".into(),
        name: Some("p".into()),
        containers,
        ..Default::default()
    };
    match deployment_for(&info, checks).unwrap() {
        PluginDeployment::Managed(s) => s,
        PluginDeployment::Unmanaged { .. } => panic!("managed expected"),
    }
}

fn spec(script: &str) -> PluginSpec {
    spec_of(
        vec![container(&[S::ControllerService, S::NodeService], script)],
        SpecChecks::Agent,
    )
}

/// The container's id in slrp (metrics labels, the admin API).
const SPEC_ID: &str = "io-slrp-test-p--CONTROLLER_SERVICE-NODE_SERVICE";
/// Its id in the agent: the provider's `cid_prefix` in front.
const CID: &str =
    "org-apache-mesos-rp-local-storage-test--io-slrp-test-p--CONTROLLER_SERVICE-NODE_SERVICE";

struct Env {
    dir: tempfile::TempDir,
    metrics: SupervisorMetrics,
    secret: Option<Secret>,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            metrics: SupervisorMetrics::register(&mut Registry::default()),
            secret: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn work_dir(&self) -> PathBuf {
        self.path("work")
    }

    fn sandbox(&self, id: &str) -> PathBuf {
        self.work_dir().join("containers").join(id)
    }

    /// A manager on a unix socket whose containers survive its restart (an agent with a
    /// work dir): a second call after `shutdown` is the same agent restarted.
    async fn manager(&self) -> (ManagerHandle, ManagerGuard) {
        let mut config = ManagerConfig::new(Listen::Unix(self.path("agent.sock")));
        config.state_dir = Some(self.path("manager"));
        config.containers_dir = Some(self.work_dir().join("containers"));
        config.jwt_secret = self.secret.clone();
        EmbeddedManager::spawn(config, CancellationToken::new())
            .await
            .unwrap()
    }

    fn agent(&self, token: Option<String>) -> AgentConfig {
        let url = format!("unix://{}", self.path("agent.sock").display());
        let mut agent = AgentConfig::new(AgentEndpoint::parse(&url).unwrap());
        agent.token = token.map(Token::new);
        agent.connect_timeout = Duration::from_secs(2);
        agent.call_timeout = Duration::from_secs(5);
        agent
    }

    fn backend_with(&self, token: Option<String>, sandboxes: RemoveSandboxes) -> AgentBackend {
        let mut cfg = AgentBackendConfig::new(self.agent(token), self.work_dir(), RP_TYPE, RP_NAME);
        cfg.remove_sandboxes = sandboxes;
        cfg.wait_retry =
            Backoff::new(Duration::from_millis(20), Duration::from_millis(100)).unwrap();
        AgentBackend::new(cfg).unwrap()
    }

    fn backend(&self) -> AgentBackend {
        self.backend_with(None, RemoveSandboxes::Never)
    }

    fn config(&self, backend: Arc<dyn ContainerBackend>) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(self.path("run"));
        c.socket_base = self.dir.path().to_owned();
        c.socket_poll = Duration::from_millis(5);
        c.ready_probe_interval = Duration::from_millis(20);
        c.health_interval = Duration::from_millis(50);
        c.restart_backoff =
            Backoff::new(Duration::from_millis(20), Duration::from_millis(80)).unwrap();
        c.restart_jitter = Jitter::None;
        c.stop_grace = Duration::from_millis(500);
        c.adopt_poll = Duration::from_millis(20);
        c.agent_id = Some("agent-S1".into());
        c.backend = backend;
        c
    }

    async fn start(&self, spec: PluginSpec, cfg: SupervisorConfig) -> SupervisorHandle {
        common::start(spec, cfg, Arc::new(FileReadiness), &self.metrics).await
    }
}

async fn ready_pid(h: &SupervisorHandle) -> i32 {
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    match h.state(Service::Node).unwrap() {
        ContainerState::Ready { pid } => pid,
        other => panic!("not ready: {other:?}"),
    }
}

/// The manager's running containers: id → pid.
async fn containers(m: &ManagerHandle) -> HashMap<String, Option<i32>> {
    m.containers()
        .await
        .into_iter()
        .map(|c| (c.id, c.pid))
        .collect()
}

fn violations(m: &ManagerHandle) -> f64 {
    m.metrics().snapshot()[slrp_manager::metrics::PROTOCOL_VIOLATIONS]
}

/// Counts `ContainerLaunched` observations (LAUNCH answered 200) of `id`.
struct Launches {
    rx: tokio::sync::broadcast::Receiver<slrp_manager::ManagerMessage>,
    seen: usize,
}

impl Launches {
    fn of(m: &ManagerHandle) -> Self {
        Self {
            rx: m.messages(),
            seen: 0,
        }
    }

    fn drain(&mut self) -> usize {
        while let Ok(msg) = self.rx.try_recv() {
            if matches!(msg, slrp_manager::ManagerMessage::ContainerLaunched { .. }) {
                self.seen += 1;
            }
        }
        self.seen
    }
}

#[tokio::test]
async fn restart_on_termination() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let mut launches = Launches::of(&m);
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(80)).unwrap();
    let h = env
        .start(spec("exit 0"), env.config(Arc::new(env.backend())))
        .await;
    let mut rx = h.watch(Service::Node).unwrap();
    let mut delays = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while launches.drain() < 5 || delays.len() < 5 {
        tokio::time::timeout_at(deadline, rx.changed())
            .await
            .expect("five relaunches in time")
            .unwrap();
        match rx.borrow_and_update().clone() {
            ContainerState::BackingOff { delay, failures } => delays.push((failures, delay)),
            ContainerState::Failed { reason } => panic!("the daemon failed: {reason}"),
            ContainerState::Stopped => panic!("the supervisor stopped"),
            ContainerState::Starting { .. } | ContainerState::Ready { .. } => {}
        }
    }
    // Each relaunch waited the backoff of its failure count (Mesos relaunches at once).
    let mut jitter = slrp_types::JitterRng::new(Jitter::None);
    for (failures, delay) in &delays {
        assert_eq!(*delay, backoff.delay(*failures, &mut jitter), "{delays:?}");
    }
    assert!(env.metrics.terminations_total() >= 5);
    assert!(env.metrics.terminations(SPEC_ID, TerminationCause::Exited) >= 5);
    assert!(!matches!(
        h.state(Service::Node).unwrap(),
        ContainerState::Failed { .. } | ContainerState::Stopped
    ));
    h.shutdown().await;
    assert_eq!(violations(&m), 0.0);
    guard.shutdown().await;
}

#[tokio::test]
async fn failed_authorization() {
    let mut env = Env::new();
    let secret = Secret::new("jwt-secret");
    env.secret = Some(secret.clone());
    let (m, guard) = env.manager().await;
    let mut launches = Launches::of(&m);
    // A token for some other provider: its cid_prefix does not prefix our container ID.
    let token = slrp_manager::jwt::mint(&secret, r#"{"cid_prefix":"some-other-prefix--"}"#);
    let backend = env.backend_with(Some(token), RemoveSandboxes::Never);
    let h = env.start(spec(PLUGIN), env.config(Arc::new(backend))).await;
    let err = h.wait_ready(Service::Node, WAIT).await.unwrap_err();
    let text = slrp_types::DisplayChain(&err).to_string();
    assert!(matches!(err, SupervisorError::Failed { .. }), "{err:?}");
    assert!(text.contains("403"), "{text}");
    assert!(
        matches!(
            h.state(Service::Node).unwrap(),
            ContainerState::Failed { .. }
        ),
        "terminal"
    );
    // Nothing retried: one refused launch, no relaunch, nothing running.
    assert_eq!(
        env.metrics.terminations(SPEC_ID, TerminationCause::Refused),
        1
    );
    assert_eq!(env.metrics.restarts(SPEC_ID), 0);
    assert_eq!(launches.drain(), 0);
    assert!(m.containers().await.is_empty());
    h.shutdown().await;
    guard.shutdown().await;
}

#[tokio::test]
async fn launch_call_is_mesos_s() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let mut node = container(&[S::NodeService], PLUGIN);
    node.command.as_mut().unwrap().environment = Some(mesos::Environment {
        variables: vec![mesos::environment::Variable {
            name: "FOO".into(),
            value: Some("bar".into()),
            ..Default::default()
        }],
    });
    node.resources = vec![mesos::Resource {
        name: "cpus".into(),
        r#type: mesos::value::Type::Scalar as i32,
        scalar: Some(mesos::value::Scalar { value: 0.1 }),
        ..Default::default()
    }];
    let controller = container(&[S::ControllerService], PLUGIN);
    let spec = spec_of(vec![node.clone(), controller.clone()], SpecChecks::Agent);
    let h = env.start(spec, env.config(Arc::new(env.backend()))).await;
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    h.wait_ready(Service::Controller, WAIT).await.unwrap();
    let plugin_dir = env.work_dir().join("csi/io.slrp.test/p");
    let mount_root = plugin_dir.join("mounts");
    assert!(mount_root.is_dir());
    let views: HashMap<String, LaunchContainer> = m
        .containers()
        .await
        .into_iter()
        .map(|c| (c.id, c.launch))
        .collect();
    assert_eq!(views.len(), 2, "{views:?}");
    for (raw, service, suffix) in [
        (&node, Service::Node, "NODE_SERVICE"),
        (&controller, Service::Controller, "CONTROLLER_SERVICE"),
    ] {
        let id = format!("{PREFIX}io-slrp-test-p--{suffix}");
        let dir = plugin_dir.join("containers").join(&id);
        let socket = h.endpoint(service).unwrap().path().to_owned();
        let endpoint_dir = socket.parent().unwrap();
        // The endpoint link names the mesos-csi-XXXXXX directory of the socket.
        assert_eq!(
            std::fs::read_link(dir.join("endpoint")).unwrap(),
            endpoint_dir
        );
        assert!(
            endpoint_dir
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("mesos-csi-")
        );
        let mut command = raw.command.clone().unwrap();
        let vars = &mut command
            .environment
            .get_or_insert_with(Default::default)
            .variables;
        vars.push(mesos::environment::Variable {
            name: "CSI_ENDPOINT".into(),
            value: Some(format!("unix://{}", socket.display())),
            ..Default::default()
        });
        if service == Service::Node {
            vars.push(mesos::environment::Variable {
                name: "MESOS_AGENT_ID".into(),
                value: Some("agent-S1".into()),
                ..Default::default()
            });
        }
        let endpoint_dir = endpoint_dir.display().to_string();
        let mount_root = mount_root.display().to_string();
        let want = LaunchContainer {
            container_id: mesos::ContainerId {
                value: id.clone(),
                parent: None,
            },
            command: Some(command),
            resources: raw.resources.clone(),
            container: Some(mesos::ContainerInfo {
                r#type: mesos::container_info::Type::Mesos as i32,
                volumes: vec![
                    mesos::Volume {
                        mode: mesos::volume::Mode::Rw as i32,
                        container_path: endpoint_dir.clone(),
                        host_path: Some(endpoint_dir),
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
                                    mode: Some(
                                        mesos::mount_propagation::Mode::Bidirectional as i32,
                                    ),
                                }),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            limits: HashMap::new(),
        };
        assert_eq!(views[&id], want, "{id}");
        // container.info: the configured CSIPluginContainerInfo in Mesos's format, resources
        // downgraded.
        let bytes = std::fs::read(dir.join("container.info")).unwrap();
        let mut recorded: mesos::CsiPluginContainerInfo =
            slrp_wire::checkpoint::read_message(&bytes)
                .unwrap()
                .unwrap();
        let mut downgraded = raw.clone();
        slrp_wire::checkpoint::downgrade_resources(&mut downgraded.resources);
        assert_eq!(recorded, downgraded);
        slrp_wire::checkpoint::upgrade_resources(&mut recorded.resources);
        assert_eq!(&recorded, raw);
    }
    h.shutdown().await;
    assert_eq!(violations(&m), 0.0, "no REMOVE_CONTAINER");
    guard.shutdown().await;
}

#[tokio::test]
async fn adopts_a_running_container_with_the_same_info() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let mut launches = Launches::of(&m);
    let cfg = env.config(Arc::new(env.backend()));
    let h = env.start(spec(PLUGIN), cfg.clone()).await;
    let first = ready_pid(&h).await;
    assert!(first > 0 && running(first));
    h.detach().await;
    assert_eq!(launches.drain(), 1);

    let h = env.start(spec(PLUGIN), cfg).await;
    let second = ready_pid(&h).await;
    assert_eq!(second, first, "the same process");
    assert_eq!(env.metrics.adoptions(SPEC_ID), 1, "LAUNCH answered 202");
    assert_eq!(launches.drain(), 1, "no second launch");
    assert_eq!(
        containers(&m).await,
        HashMap::from([(CID.to_owned(), Some(first))])
    );
    assert_eq!(env.metrics.terminations_total(), 0);
    h.shutdown().await;
    assert!(m.containers().await.is_empty(), "stopped on shutdown");
    assert_eq!(violations(&m), 0.0);
    guard.shutdown().await;
}

#[tokio::test]
async fn retires_a_container_with_changed_info() {
    for sandboxes in [RemoveSandboxes::Never, RemoveSandboxes::Files] {
        let env = Env::new();
        let (m, guard) = env.manager().await;
        let backend = Arc::new(env.backend_with(None, sandboxes));
        let old = format!("touch old; {PLUGIN}");
        let h = env.start(spec(&old), env.config(backend.clone())).await;
        let first = ready_pid(&h).await;
        let old_socket_dir = h
            .endpoint(Service::Node)
            .unwrap()
            .path()
            .parent()
            .unwrap()
            .to_owned();
        h.detach().await;
        let old_marker = env.sandbox(CID).join("old");
        assert!(old_marker.exists());

        // The same container ID with another command: not this configuration's container.
        let h = env.start(spec(PLUGIN), env.config(backend)).await;
        let second = ready_pid(&h).await;
        assert_ne!(second, first);
        assert!(!running(first), "the old container was killed");
        assert!(
            !old_socket_dir.exists(),
            "its endpoint directory was removed"
        );
        assert_eq!(
            env.metrics.terminations(SPEC_ID, TerminationCause::Stopped),
            1
        );
        assert_eq!(
            env.metrics.terminations_total(),
            0,
            "a leftover is not a termination"
        );
        assert_eq!(env.metrics.adoptions(SPEC_ID), 0);
        // The old sandbox: deleted by slrp with `files`, left to accumulate with `never`.
        assert_eq!(
            old_marker.exists(),
            sandboxes == RemoveSandboxes::Never,
            "{sandboxes:?}"
        );
        assert_eq!(
            containers(&m).await,
            HashMap::from([(CID.to_owned(), Some(second))])
        );
        h.shutdown().await;
        assert_eq!(violations(&m), 0.0, "no REMOVE_CONTAINER sent");
        guard.shutdown().await;
    }
}

#[tokio::test]
async fn wait_transport_error_is_not_a_termination() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let mut launches = Launches::of(&m);
    let h = env
        .start(spec(PLUGIN), env.config(Arc::new(env.backend())))
        .await;
    let pid = ready_pid(&h).await;
    assert_eq!(launches.drain(), 1);
    eventually_waiting(&m).await;
    // The agent goes away (its containers keep running) and comes back.
    guard.shutdown().await;
    assert!(running(pid));
    let (m, guard) = env.manager().await;
    // The keep-alive loop asks again and waits on the restarted agent.
    eventually_waiting(&m).await;
    assert_eq!(
        containers(&m).await,
        HashMap::from([(CID.to_owned(), Some(pid))])
    );
    assert_eq!(
        h.state(Service::Node).unwrap(),
        ContainerState::Ready { pid }
    );
    assert_eq!(env.metrics.terminations_total(), 0);
    assert_eq!(env.metrics.restarts(SPEC_ID), 0);
    h.shutdown().await;
    guard.shutdown().await;
}

/// Until the manager has a WAIT_CONTAINER pending on our container.
async fn eventually_waiting(m: &ManagerHandle) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let views = m.containers().await;
        if views.iter().any(|c| c.id == CID && c.waiters > 0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no WAIT pending: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn agent_404_relaunches() {
    let env = Env::new();
    let (_m, guard) = env.manager().await;
    let h = env
        .start(spec(PLUGIN), env.config(Arc::new(env.backend())))
        .await;
    let first = ready_pid(&h).await;
    eventually_waiting(&_m).await;
    guard.shutdown().await;
    // The plugin dies while the agent is down: the restarted agent forgets it.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually("the plugin to die", || !running(first)).await;
    let (m, guard) = env.manager().await;
    let mut rx = h.watch(Service::Node).unwrap();
    let relaunched = tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| matches!(s, ContainerState::Ready { pid } if *pid != first)),
    )
    .await
    .expect("relaunched in time")
    .unwrap()
    .clone();
    let ContainerState::Ready { pid: second } = relaunched else {
        unreachable!()
    };
    assert_eq!(
        env.metrics.terminations_total(),
        1,
        "one termination (WAIT 404)"
    );
    assert_eq!(env.metrics.restarts(SPEC_ID), 1, "one relaunch");
    assert_eq!(
        containers(&m).await,
        HashMap::from([(CID.to_owned(), Some(second))])
    );
    h.shutdown().await;
    guard.shutdown().await;
}

#[tokio::test]
async fn switching_backends_leaves_one_plugin() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let process_spec = spec_of(
        vec![container(&[S::ControllerService, S::NodeService], PLUGIN)],
        SpecChecks::Process,
    );
    // Processes, left running for the next slrp.
    let h = env
        .start(
            process_spec.clone(),
            env.config(Arc::new(ProcessBackend::default())),
        )
        .await;
    let local = ready_pid(&h).await;
    h.detach().await;
    assert!(running(local));

    // The agent backend retires the local process before it launches its container.
    let agent = env.backend();
    let h = env
        .start(process_spec.clone(), env.config(Arc::new(agent.clone())))
        .await;
    let in_agent = ready_pid(&h).await;
    assert!(!running(local), "the local plugin was stopped");
    assert_eq!(
        containers(&m).await,
        HashMap::from([(CID.to_owned(), Some(in_agent))])
    );
    h.detach().await;

    // And back: the process backend retires the agent's container first.
    let h = env
        .start(
            process_spec,
            env.config(Arc::new(ProcessBackend::retiring_agent_containers(agent))),
        )
        .await;
    let local = ready_pid(&h).await;
    assert!(running(local));
    assert!(!running(in_agent), "the agent's container was killed");
    assert!(m.containers().await.is_empty());
    assert!(
        !env.work_dir()
            .join("csi/io.slrp.test/p/containers")
            .join(CID)
            .exists()
    );
    h.shutdown().await;
    assert_eq!(violations(&m), 0.0);
    guard.shutdown().await;
}

#[tokio::test]
async fn an_agent_id_change_leaves_the_node_plugin_running() {
    let env = Env::new();
    let (m, guard) = env.manager().await;
    let mut launches = Launches::of(&m);
    let node = container(&[S::NodeService], PLUGIN);
    let controller = container(&[S::ControllerService], PLUGIN);
    let spec = spec_of(vec![controller, node], SpecChecks::Agent);
    let h = env.start(spec, env.config(Arc::new(env.backend()))).await;
    let pid = ready_pid(&h).await;
    h.wait_ready(Service::Controller, WAIT).await.unwrap();
    assert!(h.agent_id_changed("agent-S1").is_empty(), "not a change");
    // Only the node container had MESOS_AGENT_ID; it is named, not restarted.
    assert_eq!(
        h.agent_id_changed("agent-S2"),
        ["io-slrp-test-p--NODE_SERVICE"]
    );
    assert_eq!(
        h.state(Service::Node).unwrap(),
        ContainerState::Ready { pid }
    );
    assert_eq!(launches.drain(), 2);
    assert_eq!(env.metrics.terminations_total(), 0);
    h.shutdown().await;
    guard.shutdown().await;
}
