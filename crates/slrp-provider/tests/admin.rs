//! `slrp_provider::admin` over a real unix socket.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use slrp_provider::admin::{AdminError, AdminListener, AdminProvider, AdminState};
use tokio_util::sync::CancellationToken;

struct Fake {
    key: &'static str,
    state: Mutex<&'static str>,
    value: f64,
}

impl AdminProvider for Fake {
    fn key(&self) -> String {
        self.key.to_owned()
    }
    fn state(&self) -> String {
        (*self.state.lock().unwrap()).to_owned()
    }
    fn is_ready(&self) -> bool {
        *self.state.lock().unwrap() == "READY"
    }
    fn error(&self) -> Option<String> {
        (*self.state.lock().unwrap() == "FAILED")
            .then(|| "the plugin stack did not start".to_owned())
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([(
            format!("resource_providers/{}/csi_plugin/rpcs_finished", self.key),
            self.value,
        )])
    }
}

/// `GET path`: (status, headers, body).
async fn get(socket: &Path, path: &str) -> (u16, String, String) {
    let answer = http::unix(socket, "GET", path, None).await;
    (answer.status, answer.head, answer.body)
}

struct Running {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    a: Arc<Fake>,
    counter: Counter,
}

fn start() -> Running {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("state").join("admin.sock");
    let a = Arc::new(Fake {
        key: "org.apache.mesos.rp.local.storage.a",
        state: Mutex::new("SUBSCRIBED"),
        value: 3.0,
    });
    let b = Arc::new(Fake {
        key: "org.apache.mesos.rp.local.storage.b",
        state: Mutex::new("READY"),
        value: 7.0,
    });
    let mut registry = Registry::default();
    let counter = Counter::default();
    registry.register("test_things", "Things counted by the test", counter.clone());
    let state = AdminState::new(vec![a.clone(), b], registry);
    let listener = AdminListener::bind(&socket).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(listener.serve(state, cancel.clone()));
    Running {
        _dir: dir,
        socket,
        cancel,
        task,
        a,
        counter,
    }
}

#[tokio::test]
async fn health_ready_and_metrics_answer_over_a_0600_socket() {
    let r = start();
    let mode = std::fs::metadata(&r.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let (status, _, body) = get(&r.socket, "/health").await;
    assert_eq!((status, body.as_str()), (200, "OK\n"));

    let (status, _, body) = get(&r.socket, "/ready").await;
    assert_eq!(status, 503, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], false);
    assert_eq!(
        json["not_ready"],
        serde_json::json!(["org.apache.mesos.rp.local.storage.a"])
    );
    assert_eq!(json["providers"][0]["state"], "SUBSCRIBED");
    assert_eq!(json["providers"][1]["state"], "READY");

    assert!(json["providers"][0].get("error").is_none(), "{body}");

    *r.a.state.lock().unwrap() = "FAILED";
    let (status, _, body) = get(&r.socket, "/ready").await;
    assert_eq!(status, 503, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        json["providers"][0]["error"],
        "the plugin stack did not start"
    );

    *r.a.state.lock().unwrap() = "READY";
    let (status, _, body) = get(&r.socket, "/ready").await;
    assert_eq!(status, 200, "{body}");

    r.counter.inc_by(5);
    let (status, head, body) = get(&r.socket, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("application/openmetrics-text"),
        "{head}"
    );
    assert!(body.contains("test_things_total 5"), "{body}");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");

    let (status, _, body) = get(&r.socket, "/metrics/snapshot").await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        json["resource_providers/org.apache.mesos.rp.local.storage.a/csi_plugin/rpcs_finished"],
        3.0
    );
    assert_eq!(
        json["resource_providers/org.apache.mesos.rp.local.storage.b/csi_plugin/rpcs_finished"],
        7.0
    );

    let (status, _, body) = get(&r.socket, "/no-such-route").await;
    assert_eq!(status, 404, "{body}");

    r.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), r.task)
        .await
        .unwrap()
        .unwrap();
    assert!(!r.socket.exists(), "stopping removes the socket");
}

#[tokio::test]
async fn a_live_socket_is_refused_and_a_stale_one_replaced() {
    let r = start();
    let err = AdminListener::bind(&r.socket).unwrap_err();
    assert!(matches!(err, AdminError::InUse { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&r.socket.display().to_string()),
        "{err}"
    );
    let (status, _, _) = get(&r.socket, "/health").await;
    assert_eq!(status, 200, "the refused bind left the live socket alone");
    r.cancel.cancel();
    r.task.await.unwrap();

    // A dead daemon's socket: the file stays, nobody listens.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("admin.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let listener = AdminListener::bind(&stale).unwrap();
    let cancel = CancellationToken::new();
    let task =
        tokio::spawn(listener.serve(AdminState::new(vec![], Registry::default()), cancel.clone()));
    let (status, _, body) = get(&stale, "/ready").await;
    assert_eq!(status, 200, "no providers, nothing not ready: {body}");
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_path_that_is_not_a_socket_is_never_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    std::fs::write(&path, "precious").unwrap();
    let err = AdminListener::bind(&path).unwrap_err();
    assert!(matches!(err, AdminError::NotASocket { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
}

#[tokio::test]
async fn stopping_leaves_a_socket_another_daemon_put_in_place() {
    let r = start();
    // Another daemon replaced the socket (ours was removed by hand, theirs bound).
    std::fs::remove_file(&r.socket).unwrap();
    let theirs = std::os::unix::net::UnixListener::bind(&r.socket).unwrap();
    r.cancel.cancel();
    r.task.await.unwrap();
    assert!(r.socket.exists(), "not ours, not removed");
    drop(theirs);
}
