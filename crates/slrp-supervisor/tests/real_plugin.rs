//! The supervisor managing the real `slrp-csi-local` binary (v1 and v0 modes), ready by
//! CSI `Probe` through `CsiProbe`; its fault injection crashes the plugin to prove the
//! restart backoff, and fails probes to prove health restarts.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::PathBuf;
use std::time::Duration;

use slrp_csi::{ClientConfig, CsiClient, CsiMetrics, CsiVersion};
use slrp_proto::mesos::v1 as mesos;
use slrp_supervisor::*;
use slrp_test_support::{csi_local_bin, sh_quote};
use slrp_types::{Backoff, Jitter};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

struct Env {
    dir: tempfile::TempDir,
    metrics: SupervisorMetrics,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            metrics: SupervisorMetrics::default(),
        }
    }

    fn faults(&self) -> PathBuf {
        self.dir.path().join("faults.json")
    }

    fn set_faults(&self, json: &str) {
        let tmp = self.dir.path().join("faults.tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, self.faults()).unwrap();
    }

    fn spec(&self, version: &str) -> PluginSpec {
        // As Mesos does: the command line takes the endpoint from CSI_ENDPOINT.
        let cmd = format!(
            "exec {} --root {} --node-id n1 --csi-version {version} --faults-file {}",
            sh_quote(csi_local_bin().to_str().unwrap()),
            sh_quote(self.dir.path().join("root").to_str().unwrap()),
            sh_quote(self.faults().to_str().unwrap()),
        );
        let info = mesos::CsiPluginInfo {
            r#type: "io.slrp.csi-local".into(),
            name: Some("test".into()),
            containers: vec![mesos::CsiPluginContainerInfo {
                services: vec![
                    mesos::csi_plugin_container_info::Service::ControllerService as i32,
                    mesos::csi_plugin_container_info::Service::NodeService as i32,
                ],
                command: Some(mesos::CommandInfo {
                    value: Some(cmd),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        match deployment_from_info(&info).unwrap() {
            PluginDeployment::Managed(s) => s,
            PluginDeployment::Unmanaged { .. } => panic!(),
        }
    }

    fn config(&self) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(self.dir.path().join("run"));
        c.socket_base = self.dir.path().to_owned();
        c.ready_probe_interval = Duration::from_millis(20);
        c.probe_timeout = Duration::from_secs(2);
        c.health_interval = Duration::from_millis(100);
        c.unhealthy_after = 2;
        c.restart_backoff =
            Backoff::new(Duration::from_millis(100), Duration::from_millis(400)).unwrap();
        c.restart_jitter = Jitter::None;
        c.stop_grace = Duration::from_secs(5);
        c.adopt_poll = Duration::from_millis(20);
        c
    }

    async fn start(&self, version: &str) -> SupervisorHandle {
        self.set_faults("[]");
        Supervisor::start(
            self.spec(version),
            self.config(),
            CsiProbe::new(Duration::from_secs(2), CsiMetrics::default()),
            self.metrics.clone(),
            CancellationToken::new(),
        )
        .await
        .unwrap()
    }
}

fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !matches!(
                s[s.rfind(')').unwrap() + 2..].chars().next(),
                Some('Z' | 'X')
            )
        })
        .unwrap_or(false)
}

fn pid(h: &SupervisorHandle) -> i32 {
    match h.state(Service::Node).unwrap() {
        ContainerState::Ready { pid } => pid,
        other => panic!("not ready: {other:?}"),
    }
}

async fn managed(version: &str, expect: CsiVersion) {
    let env = Env::new();
    let h = env.start(version).await;
    let ep = h.wait_ready(Service::Controller, WAIT).await.unwrap();
    let client = CsiClient::new(ep, ClientConfig::default(), CsiMetrics::default()).unwrap();
    assert_eq!(client.version().await.unwrap(), expect);
    assert_eq!(client.node_info().await.unwrap().node_id, "n1");
    let p = pid(&h);
    h.shutdown().await;
    assert!(!running(p), "plugin left running");
}

#[tokio::test]
async fn managed_csi_local_v1() {
    managed("v1", CsiVersion::V1).await;
}

#[tokio::test]
async fn managed_csi_local_v0() {
    managed("v0", CsiVersion::V0).await;
}

#[tokio::test]
async fn crashing_plugin_is_restarted_with_backoff_and_the_client_keeps_working() {
    let env = Env::new();
    let h = env.start("v1").await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = pid(&h);
    let client = CsiClient::new(ep, ClientConfig::default(), CsiMetrics::default()).unwrap();
    client.plugin_info().await.unwrap();
    let mut rx = h.watch(Service::Node).unwrap();
    // The next three Probes crash the plugin: the health probe of the running one, then
    // the start-up probes of the next two launches.
    env.set_faults(r#"[{"rpc": "Probe", "exit": true, "times": 3}]"#);
    let mut delays = Vec::new();
    while delays.len() < 3 {
        rx.changed().await.unwrap();
        if let ContainerState::BackingOff { delay, .. } = *rx.borrow_and_update() {
            delays.push(delay.as_millis());
        }
    }
    assert_eq!(delays, vec![100, 200, 400]);
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    assert_ne!(pid(&h), first);
    let id = h.containers()[0].0.clone();
    assert_eq!(env.metrics.terminations(&id, TerminationCause::Exited), 3);
    // The same client (same socket path) reaches the restarted plugin.
    client.plugin_info().await.unwrap();
    h.shutdown().await;
}

#[tokio::test]
async fn failing_health_probes_restart_the_plugin() {
    let env = Env::new();
    let h = env.start("v1").await;
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = pid(&h);
    env.set_faults(r#"[{"rpc": "Probe", "fail": "UNAVAILABLE", "times": 2}]"#);
    let id = h.containers()[0].0.clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.metrics.terminations(&id, TerminationCause::Unhealthy) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never marked unhealthy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    assert_ne!(pid(&h), first);
    assert!(!running(first));
    h.shutdown().await;
}

#[tokio::test]
async fn restarted_supervisor_adopts_the_running_plugin() {
    let env = Env::new();
    let h = env.start("v1").await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let p = pid(&h);
    h.detach().await;
    let h2 = env.start("v1").await;
    assert_eq!(h2.wait_ready(Service::Node, WAIT).await.unwrap(), ep);
    assert_eq!(pid(&h2), p);
    let client = CsiClient::new(ep, ClientConfig::default(), CsiMetrics::default()).unwrap();
    client.plugin_info().await.unwrap();
    h2.shutdown().await;
    assert!(!running(p));
}

#[tokio::test]
async fn plugin_binds_again_after_its_socket_directory_was_removed() {
    use std::os::unix::fs::PermissionsExt as _;
    let env = Env::new();
    let h = env.start("v1").await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = pid(&h);
    let client =
        CsiClient::new(ep.clone(), ClientConfig::default(), CsiMetrics::default()).unwrap();
    client.plugin_info().await.unwrap();
    // A tmp cleaner removes the socket directory; later the plugin dies.
    std::fs::remove_dir_all(ep.path().parent().unwrap()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut rx = h.watch(Service::Node).unwrap();
    tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| matches!(s, ContainerState::Ready { pid } if *pid != first)),
    )
    .await
    .expect("the plugin never came back ready")
    .unwrap();
    // The client made before still works: same socket path.
    client.plugin_info().await.unwrap();
    // slrp-csi-local would create a missing directory itself, with its umask's mode; the
    // supervisor recreates it first, private as it was made.
    let mode = std::fs::metadata(ep.path().parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    h.shutdown().await;
}

#[tokio::test]
async fn a_running_plugin_whose_socket_directory_was_removed_is_restarted() {
    let env = Env::new();
    let h = env.start("v1").await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = pid(&h);
    // The health probe's connection stays open, but nobody else can connect any more.
    std::fs::remove_dir_all(ep.path().parent().unwrap()).unwrap();
    let mut rx = h.watch(Service::Node).unwrap();
    tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| matches!(s, ContainerState::Ready { pid } if *pid != first)),
    )
    .await
    .expect("the plugin was never restarted")
    .unwrap();
    let id = h.containers()[0].0.clone();
    assert_eq!(
        env.metrics.terminations(&id, TerminationCause::Unhealthy),
        1
    );
    assert!(!running(first));
    let client = CsiClient::new(ep, ClientConfig::default(), CsiMetrics::default()).unwrap();
    client.plugin_info().await.unwrap();
    h.shutdown().await;
}
