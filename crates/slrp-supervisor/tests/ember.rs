//! Interop with a real third-party CSI plugin: Ember-CSI 0.9.1 (Python, fake Cinder
//! backend), launched and supervised as a managed plugin, in its CSI v0.2.0 and v1.1.0
//! modes. The venv comes from `.ci/ember-csi.sh`; it is found through
//! `$SLRP_EMBER_CSI_VENV` or `/opt/slrp-ci/ember-venv`. Without it the tests print a skip
//! notice and pass, except under `CI=true`, where a missing venv fails them.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::path::PathBuf;
use std::time::Duration;

use slrp_csi::*;
use slrp_proto::mesos::v1 as mesos;
use slrp_supervisor::*;
use tokio_util::sync::CancellationToken;

/// Ember needs ~4 s to open its socket when warm, 12–15 s on its first start.
const READY: Duration = Duration::from_secs(120);

fn ember_bin() -> Option<PathBuf> {
    let venv = std::env::var_os("SLRP_EMBER_CSI_VENV")
        .map_or_else(|| PathBuf::from("/opt/slrp-ci/ember-venv"), PathBuf::from);
    let bin = venv.join("bin/ember-csi");
    let found = slrp_test_support::require_path(
        &slrp_test_support::current_test(),
        "the Ember-CSI venv (run .ci/ember-csi.sh)",
        &bin,
    );
    found.then_some(bin)
}

fn var(name: &str, value: &str) -> mesos::environment::Variable {
    mesos::environment::Variable {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn spec(bin: &std::path::Path, state: &std::path::Path, spec_version: &str) -> PluginSpec {
    let ember_config = serde_json::json!({
        "project_id": "io.ember-csi",
        "user_id": "io.ember-csi",
        "root_helper": "",
        "state_path": state,
        "file_locks_path": state.join("locks"),
        "plugin_name": "",
        "disabled": [],
    });
    let command = mesos::CommandInfo {
        shell: Some(false),
        value: Some(bin.to_str().unwrap().into()),
        arguments: vec!["ember-csi".into()],
        environment: Some(mesos::Environment {
            variables: vec![
                var("CSI_MODE", "all"),
                var("X_CSI_SPEC_VERSION", spec_version),
                var("X_CSI_NODE_ID", "node1"),
                var("X_CSI_PERSISTENCE_CONFIG", r#"{"storage":"memory"}"#),
                var(
                    "X_CSI_BACKEND_CONFIG",
                    r#"{"name":"fake","driver":"cinder.tests.fake_driver.FakeLoggingVolumeDriver"}"#,
                ),
                var("X_CSI_EMBER_CONFIG", &ember_config.to_string()),
            ],
        }),
        ..Default::default()
    };
    let info = mesos::CsiPluginInfo {
        r#type: "io.ember-csi".into(),
        name: Some(format!("fake-{}", spec_version.replace('.', "-"))),
        containers: vec![mesos::CsiPluginContainerInfo {
            services: vec![
                mesos::csi_plugin_container_info::Service::ControllerService as i32,
                mesos::csi_plugin_container_info::Service::NodeService as i32,
            ],
            command: Some(command),
            ..Default::default()
        }],
        ..Default::default()
    };
    match deployment_from_info(&info).unwrap() {
        PluginDeployment::Managed(s) => s,
        PluginDeployment::Unmanaged { .. } => panic!(),
    }
}

async fn interop(spec_version: &str, expect: CsiVersion, name: &str) {
    let Some(bin) = ember_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(state.join("locks")).unwrap();
    let mut cfg = SupervisorConfig::new(dir.path().join("run"));
    cfg.socket_timeout = READY;
    cfg.ready_timeout = READY;
    cfg.ready_probe_interval = Duration::from_millis(200);
    // Ember takes seconds to exit on SIGTERM.
    cfg.stop_grace = Duration::from_secs(15);
    let metrics = SupervisorMetrics::default();
    let h = Supervisor::start(
        spec(&bin, &state, spec_version),
        cfg,
        CsiProbe::new(Duration::from_secs(10), CsiMetrics::default()),
        metrics.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let ep = match h.wait_ready(Service::Controller, READY).await {
        Ok(ep) => ep,
        Err(e) => {
            let id = &h.containers()[0].0;
            let log = dir
                .path()
                .join("run/containers")
                .join(id)
                .join("stderr.log");
            panic!(
                "Ember never became ready: {e}\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
    };
    let pid = match h.state(Service::Node).unwrap() {
        ContainerState::Ready { pid } => pid,
        other => panic!("{other:?}"),
    };

    let c = CsiClient::new(ep, ClientConfig::default(), CsiMetrics::default()).unwrap();
    // Identity.
    let probe = c.probe().await.unwrap();
    assert_eq!(probe.version, expect);
    assert!(probe.ready);
    assert_eq!(c.plugin_info().await.unwrap().name, name);
    // Capabilities.
    assert!(c.plugin_capabilities().await.unwrap().controller_service);
    let caps = c.controller_capabilities().await.unwrap();
    assert!(caps.create_delete_volume && caps.list_volumes, "{caps:?}");
    c.node_capabilities().await.unwrap();
    // v0.2.0 has no NodeGetInfo: the client falls back to NodeGetId. Ember prefixes the
    // configured node id with its plugin name.
    let node_id = c.node_info().await.unwrap().node_id;
    assert_eq!(node_id, format!("{name}.node1"));
    // Create (Ember rounds up to whole GiB), idempotently.
    let req = CreateVolumeRequest {
        name: "slrp-interop".into(),
        required_bytes: 1 << 20,
        limit_bytes: 0,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: Secrets::default(),
        content_source: None,
    };
    let v = c.create_volume(&req).await.unwrap();
    assert_eq!(v.capacity_bytes, 1 << 30);
    assert_eq!(c.create_volume(&req).await.unwrap().volume_id, v.volume_id);
    // List.
    let listed = c.list_volumes(0).await.unwrap();
    assert!(
        listed.iter().any(|x| x.volume_id == v.volume_id),
        "{listed:?}"
    );
    // Validate.
    let valid = c
        .validate(&ValidateRequest {
            volume_id: v.volume_id.clone(),
            capabilities: vec![VolumeCapability::mount_default()],
            volume_context: v.volume_context.clone(),
            parameters: StringMap::new(),
        })
        .await
        .unwrap();
    assert!(valid.confirmed, "{valid:?}");
    // Delete.
    c.delete_volume(&v.volume_id, &Secrets::default())
        .await
        .unwrap();
    let listed = c.list_volumes(0).await.unwrap();
    assert!(!listed.iter().any(|x| x.volume_id == v.volume_id));

    h.shutdown().await;
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !matches!(
            s[s.rfind(')').unwrap() + 2..].chars().next(),
            Some('Z' | 'X')
        )
    });
    assert!(!alive, "Ember left running");
}

#[tokio::test]
async fn ember_csi_v0_2_managed_interop() {
    interop("v0.2.0", CsiVersion::V0, "io.ember-csi").await;
}

#[tokio::test]
async fn ember_csi_v1_1_managed_interop() {
    interop("v1.1.0", CsiVersion::V1, "ember-csi.io").await;
}
