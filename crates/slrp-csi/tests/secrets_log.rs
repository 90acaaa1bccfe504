//! No secret value reaches a log line, with every crate logging at `trace` (tonic, h2,
//! hyper and tower included): CSI calls that carry secrets (CreateVolume, NodeStageVolume,
//! NodePublishVolume, DeleteVolume) against the real `slrp-csi-local`, and the requests
//! themselves logged with `?request`, as domain types and as the wire messages.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

use slrp_csi::*;
use slrp_log::MemoryWriter;
use slrp_proto::csi::v1 as proto;
use slrp_test_support::Plugin;

const SECRET: &str = "s3cret-Value-4711";

fn secrets() -> Secrets {
    Secrets::new(StringMap::from([(
        "password".to_owned(),
        SECRET.to_owned(),
    )]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_log_at_trace_level() {
    let captured = MemoryWriter::default();
    // Global (not per thread): the runtime's worker threads log too. One test per binary.
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_ansi(false)
            .with_writer(captured.clone())
            .finish(),
    )
    .unwrap();

    let p = Plugin::start("v1").await;
    let c = CsiClient::new(
        CsiEndpoint::from_path(&p.socket).unwrap(),
        ClientConfig::default(),
        CsiMetrics::default(),
    )
    .unwrap();
    let create = CreateVolumeRequest {
        name: "secret-vol".into(),
        required_bytes: 4 << 20,
        limit_bytes: 0,
        capabilities: vec![VolumeCapability::mount_default()],
        parameters: StringMap::new(),
        secrets: secrets(),
        content_source: None,
    };
    tracing::trace!(request = ?create, "sending");
    let v = c.create_volume(&create).await.unwrap();

    if slrp_test_support::require_root("secrets_never_reach_the_log_at_trace_level (mounts)") {
        let staging = p.dir.path().join("staging");
        let target = p.dir.path().join("target");
        let stage = NodeStageRequest {
            volume_id: v.volume_id.clone(),
            publish_context: StringMap::new(),
            staging_target_path: staging.display().to_string(),
            capability: VolumeCapability::mount_default(),
            volume_context: v.volume_context.clone(),
            secrets: secrets(),
        };
        tracing::trace!(request = ?stage, "sending");
        c.node_stage(&stage).await.unwrap();
        let publish = NodePublishRequest {
            volume_id: v.volume_id.clone(),
            publish_context: StringMap::new(),
            staging_target_path: Some(staging.display().to_string()),
            target_path: target.display().to_string(),
            capability: VolumeCapability::mount_default(),
            readonly: false,
            volume_context: v.volume_context.clone(),
            secrets: secrets(),
        };
        tracing::trace!(request = ?publish, "sending");
        c.node_publish(&publish).await.unwrap();
        c.node_unpublish(&v.volume_id, &target.display().to_string())
            .await
            .unwrap();
        c.node_unstage(&v.volume_id, &staging.display().to_string())
            .await
            .unwrap();
    }
    c.delete_volume(&v.volume_id, &secrets()).await.unwrap();

    // The wire messages, as a careless `?request` in a transport would log them.
    let wire = secrets().expose().clone().into_iter().collect();
    tracing::trace!(request = ?proto::DeleteVolumeRequest { volume_id: "x".into(), secrets: wire }, "wire");

    let log = captured.text();
    assert!(log.contains("TRACE"), "logging was at its most verbose");
    assert!(
        log.contains("h2") || log.contains("hyper"),
        "transport crates logged too"
    );
    assert!(log.contains("password"), "the requests were logged: {log}");
    assert!(
        !log.contains(SECRET),
        "a secret leaked into the log:\n{log}"
    );
}
