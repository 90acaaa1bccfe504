//! `CsiClient` against the scripted in-process plugin (v1 and v0) over a unix socket.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::registry::Registry;
use slrp_csi::*;
use slrp_proto::csi::{v0 as pb0, v1 as pb1};
use support::{FakePlugin, Serve};
use tokio_util::sync::CancellationToken;
use tonic::Code;

fn client(p: &FakePlugin, cfg: ClientConfig) -> CsiClient {
    let metrics = CsiMetrics::register(&mut Registry::default());
    CsiClient::new(CsiEndpoint::from_path(&p.socket).unwrap(), cfg, metrics).unwrap()
}

fn v1_info(p: &FakePlugin) {
    p.script.reply(
        "GetPluginInfo",
        pb1::GetPluginInfoResponse {
            name: "fake.slrp.io".into(),
            vendor_version: "1.2.3".into(),
            manifest: HashMap::from([("k".into(), "v".into())]),
        },
    );
}

/// Every `CreateVolume` succeeds with volume `v`.
fn reply_volume_v(p: &FakePlugin) {
    p.script.reply(
        "CreateVolume",
        pb1::CreateVolumeResponse {
            volume: Some(pb1::Volume {
                volume_id: "v".into(),
                ..Default::default()
            }),
        },
    );
}

/// A `CreateVolume` of volume `n` with nothing but a default mount capability.
fn plain_create() -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: "n".into(),
        required_bytes: 0,
        limit_bytes: 0,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: Secrets::default(),
        content_source: None,
    }
}

/// Mesos's retry policy without jitter: waits of exactly 10, 20, 40, … s.
fn deterministic() -> RetryPolicy {
    RetryPolicy::mesos().with_jitter(Jitter::None)
}

/// [`plain_create`] retried by the caller, as the volume manager does, under
/// [`deterministic`].
async fn create_retried(c: &CsiClient) -> Result<Volume, CsiError> {
    let (req, policy) = (plain_create(), deterministic());
    retry(
        CsiRpc::CreateVolume,
        Some(&policy),
        &CancellationToken::new(),
        || c.create_volume(&req),
    )
    .await
}

/// A `DeleteVolume` of volume `v` retried by the caller under `policy`.
async fn delete_retried(c: &CsiClient, policy: &RetryPolicy) -> Result<(), CsiError> {
    let (id, secrets) = (VolumeId::new("v"), Secrets::default());
    retry(
        CsiRpc::DeleteVolume,
        Some(policy),
        &CancellationToken::new(),
        || c.delete_volume(&id, &secrets),
    )
    .await
}

#[tokio::test]
async fn v1_plugin_is_detected_and_unset_ready_means_ready() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.reply("Probe", pb1::ProbeResponse { ready: None });
    v1_info(&p);
    let c = client(&p, ClientConfig::default());
    let probe = c.probe().await.unwrap();
    assert_eq!(
        probe,
        ProbeResult {
            version: CsiVersion::V1,
            ready: true
        }
    );
    let info = c.plugin_info().await.unwrap();
    assert_eq!(info.name, "fake.slrp.io");
    assert_eq!(info.manifest.get("k").map(String::as_str), Some("v"));
    assert_eq!(p.script.call_names(), vec!["Probe", "GetPluginInfo"]);
    assert_eq!(c.metrics().finished(CsiRpc::Probe), 1);
    assert_eq!(c.metrics().finished(CsiRpc::GetPluginInfo), 1);
}

#[tokio::test]
async fn v1_ready_false_is_reported_not_ready() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply("Probe", pb1::ProbeResponse { ready: Some(false) });
    let c = client(&p, ClientConfig::default());
    assert!(!c.probe().await.unwrap().ready);
}

#[tokio::test]
async fn v0_plugin_is_detected_after_v1_unimplemented_counted_as_one_probe() {
    let p = FakePlugin::start(Serve::V0).await;
    p.script.reply("Probe", pb0::ProbeResponse { ready: None });
    p.script.reply(
        "GetPluginInfo",
        pb0::GetPluginInfoResponse {
            name: "io.slrp.fake".into(),
            vendor_version: "0.2.0".into(),
            manifest: HashMap::new(),
        },
    );
    let c = client(&p, ClientConfig::default());
    assert_eq!(c.version().await.unwrap(), CsiVersion::V0);
    assert_eq!(c.plugin_info().await.unwrap().name, "io.slrp.fake");
    let m = c.metrics();
    assert_eq!((m.finished(CsiRpc::Probe), m.failed(CsiRpc::Probe)), (1, 0));
    // Only the v0 Probe reached the v0 fake; the v1 one was UNIMPLEMENTED by the server.
    assert_eq!(p.script.call_names(), vec!["Probe", "GetPluginInfo"]);
}

#[tokio::test]
async fn neither_version_is_an_unknown_version_error() {
    let p = FakePlugin::start(Serve::Nothing).await;
    let c = client(&p, ClientConfig::default());
    let err = c.probe().await.unwrap_err();
    assert!(matches!(err, CsiError::UnknownVersion { .. }), "{err:?}");
    assert_eq!(c.known_version(), None);
}

#[tokio::test]
async fn forced_version_skips_probing() {
    let p = FakePlugin::start(Serve::V0).await;
    p.script
        .reply("GetPluginInfo", pb0::GetPluginInfoResponse::default());
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    c.plugin_info().await.unwrap();
    assert_eq!(p.script.call_names(), vec!["GetPluginInfo"]);
}

#[tokio::test]
async fn v0_02_plugin_node_info_falls_back_to_node_get_id() {
    let p = FakePlugin::start(Serve::V0).await;
    p.script.reply(
        "NodeGetId",
        pb0::NodeGetIdResponse {
            node_id: "n1".into(),
        },
    );
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    let info = c.node_info().await.unwrap();
    assert_eq!(info.node_id, "n1");
    assert_eq!(p.script.call_names(), vec!["NodeGetInfo", "NodeGetId"]);
    assert_eq!(c.metrics().finished(CsiRpc::NodeGetInfo), 1);
}

#[tokio::test]
async fn capabilities_are_mapped_and_unknown_values_ignored() {
    use pb1::controller_service_capability as csc;
    let p = FakePlugin::start(Serve::V1).await;
    let rpc = |t: i32| pb1::ControllerServiceCapability {
        r#type: Some(csc::Type::Rpc(csc::Rpc { r#type: t })),
    };
    p.script.reply(
        "ControllerGetCapabilities",
        pb1::ControllerGetCapabilitiesResponse {
            capabilities: vec![rpc(1), rpc(3), rpc(4), rpc(999)],
        },
    );
    p.script.reply(
        "GetPluginCapabilities",
        pb1::GetPluginCapabilitiesResponse {
            capabilities: vec![pb1::PluginCapability {
                r#type: Some(pb1::plugin_capability::Type::Service(
                    pb1::plugin_capability::Service { r#type: 1 },
                )),
            }],
        },
    );
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let caps = c.controller_capabilities().await.unwrap();
    assert!(caps.create_delete_volume && caps.list_volumes && caps.get_capacity);
    assert!(!caps.publish_unpublish_volume && !caps.expand_volume);
    assert!(c.plugin_capabilities().await.unwrap().controller_service);
}

#[tokio::test]
async fn create_volume_v1_sends_domain_request_and_maps_volume() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply_with("CreateVolume", |r: &pb1::CreateVolumeRequest| {
            Ok(pb1::CreateVolumeResponse {
                volume: Some(pb1::Volume {
                    volume_id: format!("id-{}", r.name),
                    capacity_bytes: r.capacity_range.as_ref().map_or(0, |c| c.required_bytes),
                    volume_context: HashMap::from([("pool".into(), "default".into())]),
                    ..Default::default()
                }),
            })
        });
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let req = CreateVolumeRequest {
        name: "op-1".into(),
        required_bytes: 1 << 20,
        limit_bytes: 1 << 20,
        capabilities: vec![VolumeCapability {
            access_type: AccessType::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
            },
            access_mode: AccessMode::SingleNodeWriter,
        }],
        parameters: [("pool".to_owned(), "default".to_owned())].into(),
        secrets: Secrets::new([("token".to_owned(), "s3cr3t".to_owned())].into()),
        content_source: None,
    };
    assert!(
        !format!("{req:?}").contains("s3cr3t"),
        "secrets leak into Debug"
    );
    let v = c.create_volume(&req).await.unwrap();
    assert_eq!(v.volume_id.as_str(), "id-op-1");
    assert_eq!(v.capacity_bytes, 1 << 20);
    assert_eq!(
        v.volume_context.get("pool").map(String::as_str),
        Some("default")
    );
    let sent: Vec<pb1::CreateVolumeRequest> = p.script.requests("CreateVolume");
    let cap = &sent[0].volume_capabilities[0];
    match &cap.access_type {
        Some(pb1::volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "ext4");
            assert_eq!(m.mount_flags, vec!["noatime".to_owned()]);
        }
        other => panic!("unexpected access type {other:?}"),
    }
    assert_eq!(cap.access_mode.unwrap().mode, 1);
    assert_eq!(
        sent[0].secrets.get("token").map(String::as_str),
        Some("s3cr3t")
    );
    assert_eq!(sent[0].capacity_range.unwrap().limit_bytes, 1 << 20);
}

#[tokio::test]
async fn create_volume_v0_uses_v0_field_names() {
    let p = FakePlugin::start(Serve::V0).await;
    p.script
        .reply_with("CreateVolume", |r: &pb0::CreateVolumeRequest| {
            assert!(r.controller_create_secrets.is_empty());
            Ok(pb0::CreateVolumeResponse {
                volume: Some(pb0::Volume {
                    id: "v0-id".into(),
                    capacity_bytes: 1 << 30,
                    attributes: HashMap::from([("a".into(), "b".into())]),
                    ..Default::default()
                }),
            })
        });
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    let v = c
        .create_volume(&CreateVolumeRequest {
            name: "n".into(),
            required_bytes: 1,
            limit_bytes: 0,
            capabilities: vec![VolumeCapability::block()],
            parameters: StringMap::new(),
            secrets: Secrets::default(),
            content_source: None,
        })
        .await
        .unwrap();
    assert_eq!(v.volume_id.as_str(), "v0-id");
    assert_eq!(v.volume_context.get("a").map(String::as_str), Some("b"));
}

#[tokio::test]
async fn v1_only_access_mode_is_rejected_for_v0_without_a_call() {
    let p = FakePlugin::start(Serve::V0).await;
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    let cap = VolumeCapability {
        access_type: AccessType::Block,
        access_mode: AccessMode::SingleNodeSingleWriter,
    };
    let err = c.capacity(&[cap], &StringMap::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::Unsupported {
                version: CsiVersion::V0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(p.script.call_names().is_empty());
    let err = c.node_stats(&VolumeId::new("x"), "/p").await.unwrap_err();
    assert!(matches!(err, CsiError::Unsupported { .. }), "{err:?}");
    // Nothing was sent, so nothing is counted as a failed (or any other) RPC.
    let m = c.metrics();
    for rpc in [CsiRpc::GetCapacity, CsiRpc::NodeGetVolumeStats] {
        assert_eq!(
            (
                m.pending(rpc),
                m.finished(rpc),
                m.failed(rpc),
                m.cancelled(rpc)
            ),
            (0, 0, 0, 0),
            "{rpc}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_caller_retrying_create_volume_follows_the_mesos_schedule() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.fail_times("CreateVolume", Code::Unavailable, 3);
    p.script
        .fail_times("CreateVolume", Code::DeadlineExceeded, 1);
    reply_volume_v(&p);
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let v = create_retried(&c).await.unwrap();
    assert_eq!(v.volume_id.as_str(), "v");
    // Waits of 10, 20, 40 and 80 s (ceilings, jitter off) between five attempts.
    assert_eq!(
        p.script.call_times("CreateVolume"),
        vec![0, 10, 30, 70, 150]
    );
    let m = c.metrics();
    assert_eq!(
        (
            m.failed(CsiRpc::CreateVolume),
            m.finished(CsiRpc::CreateVolume)
        ),
        (4, 1)
    );
    assert_eq!(m.pending(CsiRpc::CreateVolume), 0);
}

#[tokio::test(start_paused = true)]
async fn version_detection_is_part_of_the_call_a_caller_retries() {
    // The plugin is still starting when the first call (a CreateVolume) arrives: the
    // probe that detects its version fails the call, and the caller's retry of the
    // CreateVolume detects again, as its own retries would.
    let p = FakePlugin::start(Serve::V1).await;
    p.script.fail_times("Probe", Code::Unavailable, 2);
    p.script.reply("Probe", pb1::ProbeResponse { ready: None });
    reply_volume_v(&p);
    let c = client(&p, ClientConfig::default());
    let v = create_retried(&c).await.unwrap();
    assert_eq!(v.volume_id.as_str(), "v");
    assert_eq!(c.known_version(), Some(CsiVersion::V1));
    assert_eq!(p.script.call_times("Probe"), vec![0, 10, 30]);
    assert_eq!(p.script.call_times("CreateVolume"), vec![30]);
}

#[tokio::test(start_paused = true)]
async fn full_jitter_waits_stay_below_their_ceilings() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.fail_times("DeleteVolume", Code::Unavailable, 6);
    p.script.reply("DeleteVolume", pb1::DeleteVolumeResponse {});
    let policy = RetryPolicy::mesos().with_jitter(Jitter::Seeded(42));
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    delete_retried(&c, &policy).await.unwrap();
    let times = p.script.call_times("DeleteVolume");
    assert_eq!(times.len(), 7);
    for (n, w) in times.windows(2).enumerate() {
        let ceiling = Backoff::MESOS
            .ceiling(u32::try_from(n).unwrap() + 1)
            .as_secs();
        assert!(
            w[1] - w[0] <= ceiling,
            "wait {n} = {} > {ceiling}",
            w[1] - w[0]
        );
    }
    // With full jitter the total is (almost surely) below the sum of the ceilings.
    assert!(times[6] < 10 + 20 + 40 + 80 + 160 + 320);
}

/// The client never retries, not even the calls Mesos retries: a retry there would be a
/// second layer under the volume manager's (a call retried once per layer).
#[tokio::test(start_paused = true)]
async fn every_call_is_one_attempt_even_create_and_delete_volume() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.fail_times("CreateVolume", Code::Unavailable, 1);
    reply_volume_v(&p);
    p.script
        .fail_times("DeleteVolume", Code::DeadlineExceeded, 1);
    p.script.reply("DeleteVolume", pb1::DeleteVolumeResponse {});
    p.script.fail_times("GetCapacity", Code::Unavailable, 1);
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let err = c.create_volume(&plain_create()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable));
    let err = c
        .delete_volume(&VolumeId::new("v"), &Secrets::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::DeadlineExceeded));
    let err = c
        .capacity(&[VolumeCapability::mount_default()], &StringMap::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert_eq!(err.retry_class(), RetryClass::Transient);
    assert_eq!(
        p.script.call_names(),
        vec!["CreateVolume", "DeleteVolume", "GetCapacity"]
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_expires_as_timeout_and_a_caller_retries_it_for_delete() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.reply("DeleteVolume", pb1::DeleteVolumeResponse {});
    p.script
        .delay_once("DeleteVolume", Duration::from_secs(120));
    p.script
        .reply("GetPluginInfo", pb1::GetPluginInfoResponse::default());
    p.script
        .delay_once("GetPluginInfo", Duration::from_secs(120));
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let err = c.plugin_info().await.unwrap_err();
    assert!(
        matches!(err, CsiError::Timeout { after, .. } if after == DEFAULT_RPC_TIMEOUT),
        "{err:?}"
    );
    delete_retried(&c, &deterministic()).await.unwrap();
    // First attempt hits the 60 s deadline, the retry follows 10 s later.
    let times = p.script.call_times("DeleteVolume");
    assert_eq!(times.len(), 2);
    assert_eq!(times[1] - times[0], 70);
    assert_eq!(c.metrics().failed(CsiRpc::DeleteVolume), 1);
}

#[tokio::test(start_paused = true)]
async fn cancellation_ends_a_call_in_flight_at_once() {
    let p = FakePlugin::start(Serve::V1).await;
    reply_volume_v(&p);
    p.script.delay_once("CreateVolume", Duration::from_secs(50));
    let cancel = CancellationToken::new();
    let c = client(
        &p,
        ClientConfig::default()
            .version(VersionSelect::Force(CsiVersion::V1))
            .cancel(cancel.clone()),
    );
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(25)).await;
        c2.cancel();
    });
    let start = tokio::time::Instant::now();
    let err = c.create_volume(&plain_create()).await.unwrap_err();
    assert!(
        matches!(
            err,
            CsiError::Cancelled {
                rpc: CsiRpc::CreateVolume
            }
        ),
        "{err:?}"
    );
    assert_eq!(start.elapsed().as_secs(), 25);
    assert_eq!(p.script.call_times("CreateVolume"), vec![0]);
    assert_eq!(c.metrics().cancelled(CsiRpc::CreateVolume), 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_call_counts_as_cancelled_not_pending() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply("GetPluginInfo", pb1::GetPluginInfoResponse::default());
    p.script
        .delay_once("GetPluginInfo", Duration::from_secs(30));
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let r = tokio::time::timeout(Duration::from_secs(5), c.plugin_info()).await;
    assert!(r.is_err());
    let m = c.metrics();
    assert_eq!(m.pending(CsiRpc::GetPluginInfo), 0);
    assert_eq!(m.cancelled(CsiRpc::GetPluginInfo), 1);
    assert_eq!(
        m.failed(CsiRpc::GetPluginInfo) + m.finished(CsiRpc::GetPluginInfo),
        0
    );
}

#[tokio::test]
async fn delete_not_found_is_classified_already_done() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script.fail_times("DeleteVolume", Code::NotFound, 1);
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let err = c
        .delete_volume(&VolumeId::new("gone"), &Secrets::default())
        .await
        .unwrap_err();
    assert_eq!(err.retry_class(), RetryClass::AlreadyDone);
    assert_eq!(
        p.script.call_names().len(),
        1,
        "NOT_FOUND must not be retried"
    );
}

#[tokio::test]
async fn list_volumes_follows_pages_and_rejects_a_token_loop() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply_with("ListVolumes", |r: &pb1::ListVolumesRequest| {
            let start: usize = r.starting_token.parse().unwrap_or(0);
            let n = usize::try_from(r.max_entries).unwrap();
            let end = (start + n).min(5);
            Ok(pb1::ListVolumesResponse {
                entries: (start..end)
                    .map(|i| pb1::list_volumes_response::Entry {
                        volume: Some(pb1::Volume {
                            volume_id: format!("v{i}"),
                            ..Default::default()
                        }),
                        status: None,
                    })
                    .collect(),
                next_token: if end < 5 {
                    end.to_string()
                } else {
                    String::new()
                },
            })
        });
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let all = c.list_volumes(2).await.unwrap();
    let ids: Vec<_> = all
        .iter()
        .map(|v| v.volume_id.as_str().to_owned())
        .collect();
    assert_eq!(ids, vec!["v0", "v1", "v2", "v3", "v4"]);
    let reqs: Vec<pb1::ListVolumesRequest> = p.script.requests("ListVolumes");
    let tokens: Vec<_> = reqs.iter().map(|r| r.starting_token.clone()).collect();
    assert_eq!(tokens, vec!["", "2", "4"]);

    let looping = FakePlugin::start(Serve::V1).await;
    looping.script.reply(
        "ListVolumes",
        pb1::ListVolumesResponse {
            entries: vec![],
            next_token: "again".into(),
        },
    );
    let c = client(
        &looping,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let err = c.list_volumes(0).await.unwrap_err();
    assert!(matches!(err, CsiError::InvalidResponse { .. }), "{err:?}");
}

#[tokio::test]
async fn validate_maps_confirmed_and_supported() {
    let p1 = FakePlugin::start(Serve::V1).await;
    p1.script.reply_with(
        "ValidateVolumeCapabilities",
        |r: &pb1::ValidateVolumeCapabilitiesRequest| {
            Ok(pb1::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(pb1::validate_volume_capabilities_response::Confirmed {
                    volume_context: r.volume_context.clone(),
                    volume_capabilities: r.volume_capabilities.clone(),
                    parameters: r.parameters.clone(),
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            })
        },
    );
    let p0 = FakePlugin::start(Serve::V0).await;
    p0.script.reply(
        "ValidateVolumeCapabilities",
        pb0::ValidateVolumeCapabilitiesResponse {
            supported: false,
            message: "no".into(),
        },
    );
    let req = ValidateRequest {
        volume_id: VolumeId::new("v"),
        capabilities: vec![VolumeCapability::mount_default()],
        volume_context: [("a".to_owned(), "b".to_owned())].into(),
        parameters: StringMap::new(),
    };
    let c1 = client(
        &p1,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    assert!(c1.validate(&req).await.unwrap().confirmed);
    let c0 = client(
        &p0,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    let v = c0.validate(&req).await.unwrap();
    assert!(!v.confirmed);
    assert_eq!(v.message, "no");
    let sent: Vec<pb0::ValidateVolumeCapabilitiesRequest> =
        p0.script.requests("ValidateVolumeCapabilities");
    assert_eq!(
        sent[0].volume_attributes.get("a").map(String::as_str),
        Some("b")
    );
}

#[tokio::test]
async fn node_calls_carry_paths_and_publish_context() {
    let p = FakePlugin::start(Serve::V1).await;
    p.script
        .reply("NodeStageVolume", pb1::NodeStageVolumeResponse {});
    p.script
        .reply("NodePublishVolume", pb1::NodePublishVolumeResponse {});
    p.script.reply(
        "NodeGetVolumeStats",
        pb1::NodeGetVolumeStatsResponse {
            usage: vec![pb1::VolumeUsage {
                available: 5,
                total: 10,
                used: 5,
                unit: 1,
            }],
            volume_condition: None,
        },
    );
    let c = client(&p, ClientConfig::default());
    c.probe().await.unwrap_err(); // Probe unscripted: UNIMPLEMENTED in v1 ...
    // ... so the v1 fake is seen as speaking neither version; force v1 instead.
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let id = VolumeId::new("vol");
    c.node_stage(&NodeStageRequest {
        volume_id: id.clone(),
        publish_context: [("dev".to_owned(), "/dev/x".to_owned())].into(),
        staging_target_path: "/stage".into(),
        capability: VolumeCapability::mount_default(),
        volume_context: StringMap::new(),
        secrets: Secrets::default(),
    })
    .await
    .unwrap();
    c.node_publish(&NodePublishRequest {
        volume_id: id.clone(),
        publish_context: StringMap::new(),
        staging_target_path: Some("/stage".into()),
        target_path: "/target".into(),
        capability: VolumeCapability::mount_default(),
        readonly: true,
        volume_context: StringMap::new(),
        secrets: Secrets::default(),
    })
    .await
    .unwrap();
    let stats = c.node_stats(&id, "/target").await.unwrap();
    assert_eq!(stats.usage[0].unit, UsageUnit::Bytes);
    assert_eq!(stats.usage[0].total, 10);
    let stage: Vec<pb1::NodeStageVolumeRequest> = p.script.requests("NodeStageVolume");
    assert_eq!(stage[0].staging_target_path, "/stage");
    assert_eq!(
        stage[0].publish_context.get("dev").map(String::as_str),
        Some("/dev/x")
    );
    let publish: Vec<pb1::NodePublishVolumeRequest> = p.script.requests("NodePublishVolume");
    assert!(publish[0].readonly);
    assert_eq!(publish[0].target_path, "/target");
}

#[tokio::test]
async fn socket_path_longer_than_sun_path_is_reached_through_an_alias() {
    // The plugin binds a short path; the client is given a >107-byte path that reaches it
    // through a symlinked directory (the layout a supervisor creates, as Mesos does).
    let short = tempfile::tempdir().unwrap();
    let long_root = tempfile::tempdir().unwrap();
    let mut long_dir = long_root.path().to_owned();
    for _ in 0..6 {
        long_dir.push("a-rather-long-directory-name");
    }
    std::fs::create_dir_all(&long_dir).unwrap();
    std::os::unix::fs::symlink(short.path(), long_dir.join("endpoint")).unwrap();
    let long_socket = long_dir.join("endpoint").join("endpoint.sock");
    assert!(long_socket.as_os_str().len() > MAX_SOCKET_PATH);

    let p = FakePlugin::start_at(Serve::V1, &short.path().join("endpoint.sock")).await;
    p.script
        .reply("Probe", pb1::ProbeResponse { ready: Some(true) });
    let c = CsiClient::new(
        CsiEndpoint::from_path(&long_socket).unwrap(),
        ClientConfig::default(),
        CsiMetrics::default(),
    )
    .unwrap();
    assert_eq!(c.probe().await.unwrap().version, CsiVersion::V1);
    assert_eq!(c.endpoint().path(), long_socket);
}

#[tokio::test]
async fn missing_socket_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let c = CsiClient::new(
        CsiEndpoint::from_path(dir.path().join("nope.sock")).unwrap(),
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
        CsiMetrics::default(),
    )
    .unwrap();
    let err = c.plugin_info().await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err:?}");
}

/// Volume health (issue #22): the controller's GET_VOLUME and VOLUME_CONDITION
/// capabilities are read; ControllerGetVolume and a ListVolumes page give the conditions
/// (an entry without a volume is skipped, an over-long message cut); a v0 plugin is not
/// asked (Unsupported, nothing sent).
#[tokio::test]
async fn volume_conditions_come_from_get_volume_and_listings() {
    use pb1::controller_service_capability::{Rpc, Type, rpc::Type as R};
    let p = FakePlugin::start(Serve::V1).await;
    let cap = |t: R| pb1::ControllerServiceCapability {
        r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
    };
    p.script.reply(
        "ControllerGetCapabilities",
        pb1::ControllerGetCapabilitiesResponse {
            capabilities: vec![cap(R::GetVolume), cap(R::VolumeCondition)],
        },
    );
    let condition = |abnormal, message: &str| pb1::VolumeCondition {
        abnormal,
        message: message.into(),
    };
    p.script.reply(
        "ControllerGetVolume",
        pb1::ControllerGetVolumeResponse {
            volume: Some(pb1::Volume {
                volume_id: "v".into(),
                ..Default::default()
            }),
            status: Some(pb1::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(condition(true, &"x".repeat(10_000))),
            }),
        },
    );
    let entry = |id: Option<&str>, c| pb1::list_volumes_response::Entry {
        volume: id.map(|id| pb1::Volume {
            volume_id: id.into(),
            ..Default::default()
        }),
        status: Some(pb1::list_volumes_response::VolumeStatus {
            published_node_ids: Vec::new(),
            volume_condition: c,
        }),
    };
    p.script.reply(
        "ListVolumes",
        pb1::ListVolumesResponse {
            entries: vec![
                entry(Some("a"), Some(condition(false, "ok"))),
                entry(None, Some(condition(true, "lost"))),
                entry(Some("b"), None),
            ],
            next_token: "next".into(),
        },
    );
    let c = client(
        &p,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V1)),
    );
    let caps = c.controller_capabilities().await.unwrap();
    assert!(caps.get_volume && caps.volume_condition, "{caps:?}");
    assert!(!caps.list_volumes);

    let got = c
        .controller_get_volume(&VolumeId::new("v"))
        .await
        .unwrap()
        .unwrap();
    assert!(got.abnormal);
    assert_eq!(got.message.len(), AnswerLimits::default().max_string_bytes);
    let sent: Vec<pb1::ControllerGetVolumeRequest> = p.script.requests("ControllerGetVolume");
    assert_eq!(sent[0].volume_id, "v");

    let page = c.list_conditions_page(0, Some("start")).await.unwrap();
    assert_eq!(page.next_token.as_deref(), Some("next"));
    assert_eq!(
        page.entries,
        vec![
            ListedCondition {
                volume_id: VolumeId::new("a"),
                condition: Some(VolumeCondition {
                    abnormal: false,
                    message: "ok".into()
                }),
            },
            ListedCondition {
                volume_id: VolumeId::new("b"),
                condition: None,
            },
        ]
    );
    let listed: Vec<pb1::ListVolumesRequest> = p.script.requests("ListVolumes");
    assert_eq!(listed[0].starting_token, "start");
    assert!(matches!(
        c.list_conditions_page(-1, None).await,
        Err(CsiError::InvalidRequest { .. })
    ));

    let p0 = FakePlugin::start(Serve::V0).await;
    let c0 = client(
        &p0,
        ClientConfig::default().version(VersionSelect::Force(CsiVersion::V0)),
    );
    assert!(matches!(
        c0.controller_get_volume(&VolumeId::new("v")).await,
        Err(CsiError::Unsupported { .. })
    ));
    assert!(matches!(
        c0.list_conditions_page(0, None).await,
        Err(CsiError::Unsupported { .. })
    ));
    assert!(p0.script.call_names().is_empty(), "nothing sent to v0");
}
