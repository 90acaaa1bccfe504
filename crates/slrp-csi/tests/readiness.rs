//! Managed clients wait for their endpoint (Mesos's `getServiceEndpoint` before every
//! attempt), and `CsiServices` sends controller and node calls to their own containers.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod support;

use std::path::Path;
use std::time::Duration;

use slrp_csi::*;
use slrp_proto::csi::v1 as pb1;
use support::{FakePlugin, Serve};
use tokio::sync::watch;

fn config(timeout: Duration) -> ClientConfig {
    ClientConfig::default().rpc_timeout(timeout)
}

fn managed(socket: &Path, ready: EndpointReadiness, timeout: Duration) -> CsiClient {
    CsiClient::managed(
        CsiEndpoint::from_path(socket).unwrap(),
        ready,
        config(timeout),
        CsiMetrics::default(),
    )
    .unwrap()
}

fn stage_request() -> NodeStageRequest {
    NodeStageRequest {
        volume_id: VolumeId::new("v"),
        publish_context: StringMap::new(),
        staging_target_path: "/stage".into(),
        capability: VolumeCapability::mount_default(),
        volume_context: StringMap::new(),
        secrets: Secrets::default(),
    }
}

fn serve_stage(p: &FakePlugin) {
    p.script
        .reply("Probe", pb1::ProbeResponse { ready: Some(true) });
    p.script
        .reply("NodeStageVolume", pb1::NodeStageVolumeResponse {});
}

#[tokio::test(start_paused = true)]
async fn a_call_waits_while_its_endpoint_is_down_and_goes_out_once_it_is_up() {
    let p = FakePlugin::start(Serve::V1).await;
    serve_stage(&p);
    let (tx, rx) = watch::channel(EndpointStatus::Down);
    let c = managed(
        &p.socket,
        EndpointReadiness::new(rx),
        Duration::from_secs(60),
    );
    let call = tokio::spawn(async move { c.node_stage(&stage_request()).await });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!call.is_finished());
    assert!(
        p.script.call_names().is_empty(),
        "nothing is sent while the endpoint is down: {:?}",
        p.script.call_names()
    );
    tx.send_replace(EndpointStatus::Up);
    call.await.unwrap().unwrap();
    assert_eq!(p.script.call_names(), ["Probe", "NodeStageVolume"]);
}

#[tokio::test(start_paused = true)]
async fn a_call_whose_deadline_passes_while_the_endpoint_is_down_names_the_rpc() {
    let p = FakePlugin::start(Serve::V1).await;
    serve_stage(&p);
    let (_tx, rx) = watch::channel(EndpointStatus::Down);
    let c = managed(
        &p.socket,
        EndpointReadiness::new(rx),
        Duration::from_secs(5),
    );
    let err = c.node_stage(&stage_request()).await.unwrap_err();
    assert!(
        matches!(
            &err,
            CsiError::NotReady { rpc: CsiRpc::NodeStageVolume, after, .. }
                if *after == Duration::from_secs(5)
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("NodeStageVolume"), "{err}");
    assert!(!err.may_have_taken_effect());
    assert_eq!(err.code(), Some(Code::DeadlineExceeded));
    assert!(p.script.call_names().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_to_an_endpoint_reported_up_waits_for_the_socket() {
    // The supervisor has not noticed yet that the plugin is gone (or it is binding its
    // socket): the call is not sent, so it may wait instead of failing UNAVAILABLE.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let c = managed(
        &socket,
        EndpointReadiness::fixed(EndpointStatus::Up),
        Duration::from_secs(60),
    );
    let call = tokio::spawn(async move { c.node_stage(&stage_request()).await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!call.is_finished());
    let p = FakePlugin::start_at(Serve::V1, &socket).await;
    serve_stage(&p);
    call.await.unwrap().unwrap();
    assert_eq!(p.script.call_names(), ["Probe", "NodeStageVolume"]);
}

#[tokio::test(start_paused = true)]
async fn an_unmanaged_client_still_fails_at_once_on_a_missing_socket() {
    let dir = tempfile::tempdir().unwrap();
    let c = CsiClient::new(
        CsiEndpoint::from_path(dir.path().join("csi.sock")).unwrap(),
        config(Duration::from_secs(60)).version(VersionSelect::Force(CsiVersion::V1)),
        CsiMetrics::default(),
    )
    .unwrap();
    let err = c.node_stage(&stage_request()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err:?}");
}

#[tokio::test]
async fn a_stopped_endpoint_fails_the_call_without_sending_it() {
    let p = FakePlugin::start(Serve::V1).await;
    serve_stage(&p);
    let (tx, rx) = watch::channel(EndpointStatus::Up);
    let c = managed(
        &p.socket,
        EndpointReadiness::new(rx),
        Duration::from_secs(60),
    );
    tx.send_replace(EndpointStatus::Stopped);
    let err = c.node_stage(&stage_request()).await.unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::EndpointStopped {
                rpc: CsiRpc::NodeStageVolume,
                ..
            }
        ),
        "{err:?}"
    );
    drop(tx);
    assert!(p.script.call_names().is_empty());
}

#[tokio::test]
async fn controller_calls_go_to_the_controller_container_and_node_calls_to_the_node_one() {
    let controller = FakePlugin::start(Serve::V1).await;
    let node = FakePlugin::start(Serve::V1).await;
    for p in [&controller, &node] {
        p.script
            .reply("Probe", pb1::ProbeResponse { ready: Some(true) });
        p.script.reply(
            "GetPluginCapabilities",
            pb1::GetPluginCapabilitiesResponse {
                capabilities: vec![pb1::PluginCapability {
                    r#type: Some(pb1::plugin_capability::Type::Service(
                        pb1::plugin_capability::Service {
                            r#type: pb1::plugin_capability::service::Type::ControllerService as i32,
                        },
                    )),
                }],
            },
        );
    }
    controller.script.reply(
        "ControllerGetCapabilities",
        pb1::ControllerGetCapabilitiesResponse::default(),
    );
    controller.script.reply(
        "CreateVolume",
        pb1::CreateVolumeResponse {
            volume: Some(pb1::Volume {
                volume_id: "v".into(),
                ..Default::default()
            }),
        },
    );
    node.script.reply(
        "NodeGetCapabilities",
        pb1::NodeGetCapabilitiesResponse::default(),
    );
    node.script
        .reply("NodeStageVolume", pb1::NodeStageVolumeResponse {});
    let up = || EndpointReadiness::fixed(EndpointStatus::Up);
    let services = CsiServices::new(
        managed(&controller.socket, up(), Duration::from_secs(60)),
        managed(&node.socket, up(), Duration::from_secs(60)),
    );
    services.capabilities().await.unwrap();
    let volume = services
        .create_volume(&CreateVolumeRequest {
            name: "n".into(),
            required_bytes: 0,
            limit_bytes: 0,
            capabilities: vec![VolumeCapability::mount_default()],
            parameters: StringMap::new(),
            secrets: Secrets::default(),
            content_source: None,
        })
        .await
        .unwrap();
    assert_eq!(volume.volume_id.as_str(), "v");
    services.node_stage(&stage_request()).await.unwrap();
    assert_eq!(
        controller.script.call_names(),
        [
            "Probe",
            "GetPluginCapabilities",
            "ControllerGetCapabilities",
            "CreateVolume"
        ]
    );
    assert_eq!(
        node.script.call_names(),
        ["Probe", "NodeGetCapabilities", "NodeStageVolume"]
    );

    // Without a controller container, controller calls fail without being sent.
    let node_only = CsiServices::node_only(managed(&node.socket, up(), Duration::from_secs(60)));
    let err = node_only
        .delete_volume(&VolumeId::new("v"), &Secrets::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::NoService {
                rpc: CsiRpc::DeleteVolume,
                ..
            }
        ),
        "{err:?}"
    );
    let caps = node_only.capabilities().await.unwrap();
    assert!(!caps.controller.create_delete_volume);
}

/// `CsiVolumes::endpoint_ready` waits for the container serving the RPC (so a caller can
/// wait before taking a concurrency slot), within one call deadline, sending nothing.
#[tokio::test(start_paused = true)]
async fn endpoint_ready_waits_for_the_container_serving_the_rpc() {
    let controller = FakePlugin::start(Serve::V1).await;
    let node = FakePlugin::start(Serve::V1).await;
    let (ctl_tx, ctl_rx) = watch::channel(EndpointStatus::Down);
    let services = CsiServices::new(
        managed(
            &controller.socket,
            EndpointReadiness::new(ctl_rx),
            Duration::from_secs(5),
        ),
        managed(
            &node.socket,
            EndpointReadiness::fixed(EndpointStatus::Up),
            Duration::from_secs(5),
        ),
    );
    // The node's calls do not wait for the controller's container.
    services
        .endpoint_ready(CsiRpc::NodePublishVolume)
        .await
        .unwrap();
    let err = services
        .endpoint_ready(CsiRpc::CreateVolume)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::NotReady {
                rpc: CsiRpc::CreateVolume,
                ..
            }
        ),
        "{err:?}"
    );
    let wait = tokio::spawn({
        let services = services.clone();
        async move { services.endpoint_ready(CsiRpc::DeleteVolume).await }
    });
    tokio::task::yield_now().await;
    ctl_tx.send_replace(EndpointStatus::Up);
    wait.await.unwrap().unwrap();
    ctl_tx.send_replace(EndpointStatus::Stopped);
    assert!(matches!(
        services.endpoint_ready(CsiRpc::ListVolumes).await,
        Err(CsiError::EndpointStopped { .. })
    ));
    assert!(controller.script.call_names().is_empty());
    assert!(node.script.call_names().is_empty());
    let node_only = CsiServices::node_only(services.node().clone());
    assert!(matches!(
        node_only.endpoint_ready(CsiRpc::GetCapacity).await,
        Err(CsiError::NoService { .. })
    ));
}
