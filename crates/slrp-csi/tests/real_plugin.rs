//! `CsiClient` against the real `slrp-csi-local` binary, in its v1 and v0 modes, with its
//! fault injection driving the deadline path and a caller's retries (`slrp_csi::retry`).
//! Real time (a separate process cannot follow paused tokio time), so backoffs are
//! scaled down to milliseconds.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::time::Duration;

use slrp_csi::*;
use slrp_test_support::Plugin;
use tokio_util::sync::CancellationToken;

fn client(p: &Plugin, cfg: ClientConfig) -> CsiClient {
    CsiClient::new(
        CsiEndpoint::from_path(&p.socket).unwrap(),
        cfg,
        CsiMetrics::default(),
    )
    .unwrap()
}

/// Mesos's codes, at most 10 attempts 20 ms doubling to 100 ms apart.
fn fast_retries() -> RetryPolicy {
    RetryPolicy::mesos()
        .with_backoff(Backoff::new(Duration::from_millis(20), Duration::from_millis(100)).unwrap())
        .with_jitter(Jitter::None)
        .with_max_attempts(Some(10))
}

/// `CreateVolume` retried by the caller under [`fast_retries`].
async fn create_retried(c: &CsiClient, req: &CreateVolumeRequest) -> Result<Volume, CsiError> {
    let policy = fast_retries();
    retry(
        CsiRpc::CreateVolume,
        Some(&policy),
        &CancellationToken::new(),
        || c.create_volume(req),
    )
    .await
}

fn create(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        required_bytes: bytes,
        limit_bytes: 0,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: Secrets::default(),
        content_source: None,
    }
}

async fn lifecycle(version: &str, expect: CsiVersion, name: &str) {
    let p = Plugin::start(version).await;
    let c = client(&p, ClientConfig::default());
    let probe = c.probe().await.unwrap();
    assert_eq!(probe.version, expect);
    assert!(probe.ready);
    assert_eq!(c.plugin_info().await.unwrap().name, name);
    assert!(c.plugin_capabilities().await.unwrap().controller_service);
    let caps = c.controller_capabilities().await.unwrap();
    assert!(caps.create_delete_volume && caps.list_volumes && caps.get_capacity);
    assert_eq!(c.node_info().await.unwrap().node_id, "test-node");

    let before = c
        .capacity(&[VolumeCapability::mount_default()], &StringMap::new())
        .await
        .unwrap();
    let v = c.create_volume(&create("vol-a", 64 << 20)).await.unwrap();
    assert!(v.capacity_bytes >= 64 << 20);
    // Idempotent: the same name gives the same volume.
    assert_eq!(
        c.create_volume(&create("vol-a", 64 << 20)).await.unwrap(),
        v
    );
    let after = c
        .capacity(&[VolumeCapability::mount_default()], &StringMap::new())
        .await
        .unwrap();
    assert!(after.available_bytes < before.available_bytes);

    let listed = c.list_volumes(1).await.unwrap();
    assert_eq!(
        listed.iter().map(|x| &x.volume_id).collect::<Vec<_>>(),
        vec![&v.volume_id]
    );
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
    c.delete_volume(&v.volume_id, &Secrets::default())
        .await
        .unwrap();
    assert!(c.list_volumes(0).await.unwrap().is_empty());
    // Deleting again is fine either way (OK, or NOT_FOUND = already done).
    if let Err(e) = c.delete_volume(&v.volume_id, &Secrets::default()).await {
        assert_eq!(e.retry_class(), RetryClass::AlreadyDone, "{e:?}");
    }
}

#[tokio::test]
async fn v1_mode_volume_lifecycle() {
    lifecycle("v1", CsiVersion::V1, "slrp-csi-local.slrp.io").await;
}

#[tokio::test]
async fn v0_mode_volume_lifecycle_is_detected_as_v0() {
    lifecycle("v0", CsiVersion::V0, "io.slrp.csi-local").await;
}

#[tokio::test]
async fn injected_unavailable_is_retried_until_success() {
    let p = Plugin::start("v1").await;
    p.set_faults(r#"[{"rpc": "CreateVolume", "fail": "UNAVAILABLE", "times": 3}]"#);
    let c = client(&p, ClientConfig::default());
    create_retried(&c, &create("retried", 1 << 20))
        .await
        .unwrap();
    let m = c.metrics();
    assert_eq!(m.failed(CsiRpc::CreateVolume), 3);
    assert_eq!(m.finished(CsiRpc::CreateVolume), 1);
    assert_eq!(p.faults_left(), serde_json::json!([]));
}

#[tokio::test]
async fn injected_delay_past_the_deadline_is_a_timeout_then_retried() {
    let p = Plugin::start("v1").await;
    let c = client(
        &p,
        ClientConfig::default().rpc_timeout(Duration::from_millis(500)),
    );
    let v = c.create_volume(&create("slow", 1 << 20)).await.unwrap();
    p.set_faults(r#"[{"rpc": "DeleteVolume", "delay_ms": 2000, "times": 1}]"#);
    let (policy, secrets) = (fast_retries(), Secrets::default());
    retry(
        CsiRpc::DeleteVolume,
        Some(&policy),
        &CancellationToken::new(),
        || c.delete_volume(&v.volume_id, &secrets),
    )
    .await
    .unwrap();
    let m = c.metrics();
    assert_eq!(
        m.failed(CsiRpc::DeleteVolume),
        1,
        "the slow attempt hits the deadline"
    );
    assert_eq!(m.finished(CsiRpc::DeleteVolume), 1);

    // Not retried (the client never retries): GetCapacity fails with the deadline.
    p.set_faults(r#"[{"rpc": "GetCapacity", "delay_ms": 2000, "times": 1}]"#);
    let err = c
        .capacity(&[VolumeCapability::mount_default()], &StringMap::new())
        .await
        .unwrap_err();
    assert!(matches!(err, CsiError::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn injected_non_retryable_code_fails_at_once() {
    let p = Plugin::start("v0").await;
    p.set_faults(r#"[{"rpc": "CreateVolume", "fail": "INTERNAL", "message": "boom"}]"#);
    let c = client(&p, ClientConfig::default());
    let err = create_retried(&c, &create("x", 1 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Internal));
    assert_eq!(c.metrics().failed(CsiRpc::CreateVolume), 1);
}

#[tokio::test]
async fn plugin_crash_mid_call_is_unavailable() {
    let mut p = Plugin::start("v1").await;
    p.set_faults(r#"[{"rpc": "GetCapacity", "exit": true, "times": 1}]"#);
    let c = client(&p, ClientConfig::default());
    let err = c
        .capacity(&[VolumeCapability::mount_default()], &StringMap::new())
        .await
        .unwrap_err();
    assert_eq!(err.retry_class(), RetryClass::Transient, "{err:?}");
    let status = p.child.wait().await.unwrap();
    assert_eq!(status.code(), Some(1));
}
