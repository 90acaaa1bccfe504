//! The volume manager's metrics on the admin endpoint: volumes per state and jobs
//! (refreshed on each scrape), per-stage call latency (observed by the volume manager),
//! in OpenMetrics and in the snapshot.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use slrp_core::volume::VolumeManagerHandle;
use slrp_csi::{Code, CsiRpc};
use slrp_provider::admin::{AdminListener, AdminProvider, AdminState, BoxFuture};
use slrp_provider::metrics::ProviderMetrics;
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::{Harness, create_req};
use tokio_util::sync::CancellationToken;

const TYPE: &str = "org.apache.mesos.rp.local.storage";
const KEY: &str = "org.apache.mesos.rp.local.storage.a";

struct View {
    metrics: ProviderMetrics,
    volumes: Option<VolumeManagerHandle>,
}

impl AdminProvider for View {
    fn key(&self) -> String {
        KEY.to_owned()
    }
    fn state(&self) -> String {
        "READY".to_owned()
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        self.metrics.snapshot()
    }
    fn volumes(&self) -> Option<VolumeManagerHandle> {
        self.volumes.clone()
    }
    fn volume_error(&self, id: &slrp_csi::VolumeId) -> Option<String> {
        self.metrics.volumes().last_error(id.as_str())
    }
    fn refresh_metrics(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.metrics.volumes().refresh(self.volumes.as_ref()))
    }
}

/// The sample lines of `text` that start with `name{`, with the provider label dropped.
fn samples(text: &str, name: &str) -> Vec<String> {
    let provider = format!("provider=\"{KEY}\"");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| {
            l.replace(&format!("{provider},"), "")
                .replace(&format!(",{provider}"), "")
                .replace(&provider, "")
        })
        .collect()
}

#[tokio::test]
async fn volumes_jobs_and_stage_latency_reach_both_formats() {
    let metrics = ProviderMetrics::new(TYPE, "a");
    let h = Harness::new(FakeCsi::full());
    let m = h.start_with(h.config().observer(Arc::new(metrics.volumes().clone())));
    let created = m.handle.create(create_req("op-1")).await.unwrap().id;
    let published = m.handle.create(create_req("op-2")).await.unwrap().id;
    m.handle.publish(&published).await.unwrap();
    let deleted = m.handle.create(create_req("op-3")).await.unwrap().id;
    assert!(m.handle.delete(&deleted).await.unwrap());
    h.fake.fail(CsiRpc::NodeStageVolume, Code::Internal, 1);
    m.handle.publish(&created).await.unwrap_err();

    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let view = Arc::new(View {
        metrics: metrics.clone(),
        volumes: Some(m.handle.clone()),
    });
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let listener = AdminListener::bind(&socket).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(listener.serve(AdminState::new(vec![view], registry), cancel.clone()));

    let text = http::unix(&socket, "GET", "/metrics", None).await.body;
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE volumes gauge"), "{text}");
    assert!(
        text.contains("# TYPE volume_call_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT volume_call_duration_seconds seconds"),
        "{text}"
    );
    let volumes = samples(&text, "volumes");
    assert_eq!(volumes.len(), 10, "every state has a series: {volumes:?}");
    assert!(
        volumes.contains(&"volumes{state=\"PUBLISHED\"} 1".to_owned()),
        "{volumes:?}"
    );
    assert!(
        volumes.contains(&"volumes{state=\"NODE_READY\"} 0".to_owned()),
        "{volumes:?}"
    );
    // The failed NodeStageVolume left the volume in flight.
    assert!(
        volumes.contains(&"volumes{state=\"NODE_STAGE\"} 1".to_owned()),
        "{volumes:?}"
    );
    assert!(samples(&text, "volume_jobs").contains(&"volume_jobs{state=\"running\"} 0".to_owned()));
    let counts = samples(&text, "volume_call_duration_seconds_count");
    for (call, outcome, n) in [
        ("create", "ok", 3),
        ("stage", "ok", 1),
        ("stage", "failed", 1),
        ("publish", "ok", 1),
        ("delete", "ok", 1),
    ] {
        let want = format!(
            "volume_call_duration_seconds_count{{call=\"{call}\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(counts.contains(&want), "{want} missing in {counts:?}");
    }
    assert!(
        !counts.iter().any(|c| c.contains("call=\"unpublish\"")),
        "no call, no series: {counts:?}"
    );

    let snapshot = http::unix(&socket, "GET", "/metrics/snapshot", None)
        .await
        .json();
    let prefix = format!("resource_providers/{KEY}/volume_manager");
    assert_eq!(
        snapshot[format!("{prefix}/volumes/PUBLISHED")],
        1.0,
        "{snapshot}"
    );
    assert_eq!(
        snapshot[format!("{prefix}/volumes/CREATED")],
        0.0,
        "{snapshot}"
    );
    assert_eq!(snapshot[format!("{prefix}/jobs/queued")], 0.0, "{snapshot}");

    // The failed call is the volume's last error until the volume moves again.
    let path = format!("/volumes/{}", created.as_str());
    let volume = http::unix(&socket, "GET", &path, None).await.json();
    let error = volume["last_error"].as_str().unwrap_or_default();
    assert!(error.starts_with("NodeStageVolume: "), "{volume}");
    m.handle.publish(&created).await.unwrap();
    let volume = http::unix(&socket, "GET", &path, None).await.json();
    assert_eq!(volume["state"], "PUBLISHED", "{volume}");
    assert!(volume.get("last_error").is_none(), "{volume}");

    let text = http::unix(&socket, "GET", "/metrics", None).await.body;
    assert!(
        samples(&text, "volumes").contains(&"volumes{state=\"PUBLISHED\"} 2".to_owned()),
        "{text}"
    );

    // A stopped volume manager (a plugin restart) does not read as every volume gone:
    // the gauges keep the last values, in both formats.
    m.stop().await.unwrap();
    let text = http::unix(&socket, "GET", "/metrics", None).await.body;
    let volumes = samples(&text, "volumes");
    assert!(
        volumes.contains(&"volumes{state=\"PUBLISHED\"} 2".to_owned()),
        "{volumes:?}"
    );
    assert!(
        volumes.contains(&"volumes{state=\"NODE_STAGE\"} 0".to_owned()),
        "{volumes:?}"
    );
    let snapshot = http::unix(&socket, "GET", "/metrics/snapshot", None)
        .await
        .json();
    assert_eq!(
        snapshot[format!("{prefix}/volumes/PUBLISHED")],
        2.0,
        "{snapshot}"
    );
    cancel.cancel();
    task.await.unwrap();
}
