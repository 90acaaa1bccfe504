//! `POST /volumes/unpublish` of `slrp_provider::admin` over a real unix socket, with a
//! real volume manager over the fake plugin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus_client::registry::Registry;
use slrp_core::volume::{StateName, VolumeManagerHandle};
use slrp_csi::{Code, CsiRpc, VolumeId};
use slrp_provider::admin::{AdminListener, AdminProvider, AdminState};
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::{Harness, create_req};
use tokio_util::sync::CancellationToken;

/// A provider whose volume manager is `volumes` (`None`: not running).
struct View {
    key: &'static str,
    volumes: Option<VolumeManagerHandle>,
}

impl AdminProvider for View {
    fn key(&self) -> String {
        self.key.to_owned()
    }
    fn state(&self) -> String {
        if self.volumes.is_some() {
            "READY"
        } else {
            "STARTING_PLUGIN"
        }
        .to_owned()
    }
    fn is_ready(&self) -> bool {
        self.volumes.is_some()
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
    fn volumes(&self) -> Option<VolumeManagerHandle> {
        self.volumes.clone()
    }
}

const A: &str = "org.apache.mesos.rp.local.storage.a";
const B: &str = "org.apache.mesos.rp.local.storage.b";

/// `POST path` with a JSON body: (status, body as JSON).
async fn post(socket: &Path, path: &str, body: &str) -> (u16, serde_json::Value) {
    let answer = http::unix(socket, "POST", path, Some(body)).await;
    (answer.status, answer.json())
}

/// `POST /volumes/unpublish` of `volume_id`, naming `provider` if given.
async fn unpublish(
    socket: &Path,
    provider: Option<&str>,
    volume_id: &str,
) -> (u16, serde_json::Value) {
    let mut body = serde_json::json!({ "volume_id": volume_id });
    if let Some(provider) = provider {
        body["provider"] = provider.into();
    }
    post(socket, "/volumes/unpublish", &body.to_string()).await
}

struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

fn serve(views: Vec<View>) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let views = views
        .into_iter()
        .map(|v| Arc::new(v) as Arc<dyn AdminProvider>)
        .collect();
    let state = AdminState::new(views, Registry::default());
    let listener = AdminListener::bind(&socket).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(listener.serve(state, cancel.clone()));
    Served {
        _dir: dir,
        socket,
        cancel,
        task,
    }
}

/// A published volume on a fresh volume manager.
async fn published(h: &Harness, handle: &VolumeManagerHandle) -> VolumeId {
    let id = handle.create(create_req("op-1")).await.unwrap().id;
    handle.publish(&id).await.unwrap();
    assert!(h.fake.volume(&id).unwrap().published.is_some());
    id
}

async fn state_of(handle: &VolumeManagerHandle, id: &VolumeId) -> StateName {
    let records = handle.volumes().await.unwrap();
    records.iter().find(|r| r.id == *id).unwrap().state.name()
}

fn assert_unpublished(status: u16, json: &serde_json::Value) {
    assert_eq!(
        (status, json["state"].as_str()),
        (200, Some("NODE_READY")),
        "{json}"
    );
}

/// One provider `A` over a volume manager with one published volume.
struct One {
    h: Harness,
    m: slrp_test_support::harness::Running,
    id: VolumeId,
    served: Served,
}

async fn one_provider() -> One {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let id = published(&h, &m.handle).await;
    let served = serve(vec![View {
        key: A,
        volumes: Some(m.handle.clone()),
    }]);
    One { h, m, id, served }
}

#[tokio::test]
async fn a_published_volume_is_unpublished_and_stays_tracked() {
    let One { h, m, id, served } = one_provider().await;

    // One provider: it need not be named.
    let body = serde_json::json!({"volume_id": id.as_str()}).to_string();
    let (status, json) = post(&served.socket, "/volumes/unpublish", &body).await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        json,
        serde_json::json!({"volume_id": id.as_str(), "state": "NODE_READY"})
    );
    let fake = h.fake.volume(&id).unwrap();
    assert!(
        fake.published.is_none() && fake.staged.is_none(),
        "{fake:?}"
    );
    let records = m.handle.volumes().await.unwrap();
    assert_eq!(records.len(), 1);
    assert!(!records[0].node_publish_required);

    // Again: nothing left to do, same answer.
    let (status, json) = post(&served.socket, "/volumes/unpublish", &body).await;
    assert_eq!((status, json["state"].as_str()), (200, Some("NODE_READY")));
    served.stop().await;
    m.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_providers_and_volumes_are_404_and_bad_bodies_400() {
    let One {
        h: _h,
        m,
        id,
        served,
    } = one_provider().await;
    let cases = [
        (
            serde_json::json!({"provider": "nope", "volume_id": id.as_str()}).to_string(),
            404,
            "unknown provider 'nope'".to_owned(),
        ),
        (
            serde_json::json!({"provider": A, "volume_id": "other"}).to_string(),
            404,
            format!("provider '{A}' tracks no volume 'other'"),
        ),
        (
            serde_json::json!({"volume_id": ""}).to_string(),
            400,
            "'volume_id' is empty".to_owned(),
        ),
    ];
    for (body, want_status, want_error) in cases {
        let (status, json) = post(&served.socket, "/volumes/unpublish", &body).await;
        assert_eq!(status, want_status, "{body}: {json}");
        assert_eq!(json["error"], want_error, "{body}");
    }
    for body in [
        "not json",
        "{}",
        r#"{"volume_id": 7}"#,
        r#"{"volume_id": "x", "force": true}"#,
    ] {
        let (status, json) = post(&served.socket, "/volumes/unpublish", body).await;
        assert_eq!(status, 400, "{body}: {json}");
        assert!(
            json["error"]
                .as_str()
                .unwrap()
                .starts_with("the body must be"),
            "{body}: {json}"
        );
    }
    // Nothing was unpublished on the way.
    assert_eq!(state_of(&m.handle, &id).await, StateName::Published);
    served.stop().await;
    m.stop().await.unwrap();
}

#[tokio::test]
async fn with_several_providers_the_provider_is_named() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let id = published(&h, &m.handle).await;
    let served = serve(vec![
        View {
            key: A,
            volumes: None,
        },
        View {
            key: B,
            volumes: Some(m.handle.clone()),
        },
    ]);
    let (status, json) = unpublish(&served.socket, None, id.as_str()).await;
    assert_eq!(status, 400, "{json}");
    assert_eq!(
        json["error"],
        format!("'provider' is required with 2 providers (one of: {A}, {B})")
    );
    // A provider whose plugin stack is not running cannot unpublish anything.
    let (status, json) = unpublish(&served.socket, Some(A), id.as_str()).await;
    assert_eq!(status, 503, "{json}");
    assert_eq!(
        json["error"],
        format!("provider '{A}' has no running volume manager (state STARTING_PLUGIN)")
    );
    let (status, json) = unpublish(&served.socket, Some(B), id.as_str()).await;
    assert_unpublished(status, &json);
    served.stop().await;
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_unpublish_is_reported_with_its_cause() {
    let One { h, m, id, served } = one_provider().await;
    let body = serde_json::json!({"volume_id": id.as_str()}).to_string();
    for (code, want) in [(Code::Internal, 500), (Code::Unavailable, 503)] {
        h.fake.fail(CsiRpc::NodeUnpublishVolume, code, 1);
        let (status, json) = post(&served.socket, "/volumes/unpublish", &body).await;
        assert_eq!(status, want, "{code:?}: {json}");
        let error = json["error"].as_str().unwrap();
        assert!(error.contains("NodeUnpublishVolume"), "{error}");
        assert!(h.fake.volume(&id).unwrap().published.is_some());
    }
    // The failure passed: the next request unpublishes.
    let (status, json) = post(&served.socket, "/volumes/unpublish", &body).await;
    assert_unpublished(status, &json);
    served.stop().await;
    m.stop().await.unwrap();
}
