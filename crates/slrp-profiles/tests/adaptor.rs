//! The adaptor end to end: sources, polling, change detection, selectors, failures,
//! persistence and the random notification delay (Mesos's `FetchFromFile` and
//! `FetchFromHTTP`, and what slrp adds).
//!
//! Tests with an HTTP server run on real time (a paused clock would jump past the per-fetch
//! timeout while the client waits for the socket); they step with `poll_now` or wait for an
//! observable change, with timeouts only as hang guards. File and inline tests use paused
//! time.

#![cfg(test)]

use std::{
    collections::BTreeSet,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, extract::State, http::StatusCode, routing::get};
use prometheus_client::registry::Registry;
use slrp_profiles::{
    DocumentError, FetchError, Metrics, PollOutcome, ProfileAdaptorHandle, ProfileSource,
    ProfileView, ProfilesConfig, ProviderKey, TlsSetupError, TranslateError, UpdateError, spawn,
};
use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
    AccessType, access_mode::Mode,
};
use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

const GUARD: Duration = Duration::from_secs(30);
const RP_TYPE: &str = "resource_provider_type";
const RP_NAME: &str = "resource_provider_name";

fn key() -> ProviderKey {
    ProviderKey::new(RP_TYPE, RP_NAME, None)
}

/// A document whose profiles select the test provider, each with a block capability in
/// the given access mode.
fn doc(profiles: &[(&str, &str)]) -> String {
    let body: Vec<String> = profiles
        .iter()
        .map(|(name, mode)| {
            format!(
                r#""{name}":{{"resource_provider_selector":{{"resource_providers":[{{"type":"{RP_TYPE}","name":"{RP_NAME}"}}]}},
                    "volume_capabilities":{{"block":{{}},"access_mode":{{"mode":"{mode}"}}}}}}"#
            )
        })
        .collect();
    format!(r#"{{"profile_matrix":{{{}}}}}"#, body.join(","))
}

fn names(view: &ProfileView) -> Vec<&str> {
    view.keys().map(String::as_str).collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A running adaptor that is stopped (and joined) when dropped or on `stop`.
struct Running {
    handle: ProfileAdaptorHandle,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    registry: Registry,
}

impl Running {
    fn start(config: ProfilesConfig) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let cancel = CancellationToken::new();
        let (handle, task) = spawn(config, metrics, cancel.clone());
        Self {
            handle,
            cancel,
            task: Some(task),
            registry,
        }
    }

    async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    async fn wait_for_fetches(&self, n: u64) {
        tokio::time::timeout(GUARD, async {
            while self.handle.status().await.unwrap().fetches_completed < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("fetches completed in time");
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn next_view(rx: &mut watch::Receiver<ProfileView>) -> ProfileView {
    tokio::time::timeout(GUARD, rx.changed())
        .await
        .expect("watchers notified in time")
        .expect("adaptor alive");
    rx.borrow_and_update().clone()
}

async fn wait_view(
    rx: &mut watch::Receiver<ProfileView>,
    pred: impl FnMut(&ProfileView) -> bool,
) -> ProfileView {
    tokio::time::timeout(GUARD, rx.wait_for(pred))
        .await
        .expect("view reached in time")
        .expect("adaptor alive")
        .clone()
}

fn applied(outcome: PollOutcome) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    match outcome {
        PollOutcome::Applied {
            added,
            removed,
            conflicts,
        } => (added, removed, conflicts),
        PollOutcome::Failed(e) => panic!("poll failed: {e:?}"),
    }
}

fn failed(outcome: PollOutcome) -> Arc<UpdateError> {
    match outcome {
        PollOutcome::Failed(e) => e,
        PollOutcome::Applied { .. } => panic!("poll unexpectedly applied"),
    }
}

// === A scripted HTTP server on 127.0.0.1:0 ===

#[derive(Clone)]
struct Reply(Arc<Mutex<(StatusCode, String)>>);

struct TestServer {
    url: String,
    reply: Reply,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    async fn start(body: &str) -> Self {
        let reply = Reply(Arc::new(Mutex::new((StatusCode::OK, body.to_owned()))));
        let app = Router::new()
            .route(
                "/profiles",
                get(|State(r): State<Reply>| async move { r.0.lock().unwrap().clone() }),
            )
            .route("/slow", get(std::future::pending::<String>))
            .with_state(reply.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone().cancelled_owned();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await
                .unwrap();
        });
        Self {
            url,
            reply,
            shutdown,
            task: Some(task),
        }
    }

    fn source(&self, path: &str) -> ProfileSource {
        ProfileSource::parse_uri(&format!("{}{path}", self.url)).unwrap()
    }

    fn set(&self, status: StatusCode, body: &str) {
        *self.reply.0.lock().unwrap() = (status, body.to_owned());
    }

    async fn shut_down(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

// === Tests ===

/// Mesos `FetchFromFile`: the first poll finds no file (no profiles); after the file is
/// written, the next poll notifies the watcher and `translate` works.
#[tokio::test(start_paused = true)]
async fn fetch_from_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profiles.json");
    let poll = Duration::from_secs(10);
    let adaptor = Running::start(
        ProfilesConfig::new(ProfileSource::parse_uri(path.to_str().unwrap()).unwrap())
            .poll_interval(poll),
    );
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    adaptor.wait_for_fetches(1).await;
    assert!(rx.borrow_and_update().is_empty());
    let status = adaptor.handle.status().await.unwrap();
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("reading profile file"),
        "{status:?}"
    );

    std::fs::write(&path, doc(&[("profile", "MULTI_NODE_SINGLE_WRITER")])).unwrap();
    tokio::time::sleep(poll).await;
    let view = next_view(&mut rx).await;
    assert_eq!(names(&view), ["profile"]);

    let info = adaptor.handle.translate("profile", &key()).await.unwrap();
    assert!(matches!(
        info.capability.access_type,
        Some(AccessType::Block(_))
    ));
    assert_eq!(
        info.capability.access_mode.mode,
        Mode::MultiNodeSingleWriter as i32
    );
    assert_eq!(view["profile"], info);
    adaptor.stop().await;
}

/// Without `poll_interval` the source is fetched exactly once, as in Mesos.
#[tokio::test(start_paused = true)]
async fn no_poll_interval_fetches_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profiles.json");
    std::fs::write(&path, doc(&[("a", "SINGLE_NODE_WRITER")])).unwrap();
    let adaptor = Running::start(ProfilesConfig::new(ProfileSource::File(path.clone())));
    adaptor.wait_for_fetches(1).await;
    std::fs::write(&path, doc(&[("b", "SINGLE_NODE_WRITER")])).unwrap();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let status = adaptor.handle.status().await.unwrap();
    assert_eq!(status.fetches_completed, 1);
    assert_eq!(
        adaptor
            .handle
            .subscribe(key())
            .await
            .unwrap()
            .borrow()
            .len(),
        1
    );
    adaptor.stop().await;
}

/// Mesos `FetchFromHTTP`, with slrp's per-profile conflict rule: a profile added (watch
/// fires), replaced by another (watch fires), then a response that changes the first
/// profile's definition: the change is ignored and reported, the rest of that document
/// applies (here: the other profile disappears, which Mesos would not have applied), and a
/// corrected response is accepted again.
#[tokio::test]
async fn fetch_from_http() {
    let server = TestServer::start(&doc(&[("profile", "SINGLE_NODE_WRITER")])).await;
    let adaptor = Running::start(ProfilesConfig::new(server.source("/profiles")));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    let view = wait_view(&mut rx, |v| !v.is_empty()).await;
    assert_eq!(names(&view), ["profile"]);

    server.set(
        StatusCode::OK,
        &doc(&[("another-profile", "MULTI_NODE_MULTI_WRITER")]),
    );
    let (added, removed, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(added, set(&["another-profile"]));
    assert_eq!(removed, set(&["profile"]));
    assert!(conflicts.is_empty());
    assert_eq!(names(&next_view(&mut rx).await), ["another-profile"]);

    // "profile" comes back with a different access mode: immutable, so ignored.
    server.set(
        StatusCode::OK,
        &doc(&[("profile", "MULTI_NODE_MULTI_WRITER")]),
    );
    let (added, removed, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert!(added.is_empty());
    assert_eq!(removed, set(&["another-profile"]));
    assert_eq!(conflicts, set(&["profile"]));
    assert!(next_view(&mut rx).await.is_empty());
    assert_eq!(
        adaptor.handle.translate("profile", &key()).await,
        Err(TranslateError::NotFound {
            profile: "profile".into()
        })
    );
    let status = adaptor.handle.status().await.unwrap();
    assert_eq!(
        status.conflicts.keys().collect::<Vec<_>>(),
        ["profile"],
        "{status:?}"
    );
    assert!(
        adaptor
            .metrics_text()
            .contains("profiles_conflicts_total 1")
    );

    // The same conflicting document again: still ignored, reported once.
    applied(adaptor.handle.poll_now().await.unwrap());
    assert!(!rx.has_changed().unwrap());
    assert!(
        adaptor
            .metrics_text()
            .contains("profiles_conflicts_total 1")
    );

    // Corrected: the original definition is accepted and the conflict clears.
    server.set(StatusCode::OK, &doc(&[("profile", "SINGLE_NODE_WRITER")]));
    let (added, _, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(added, set(&["profile"]));
    assert!(conflicts.is_empty());
    assert_eq!(names(&next_view(&mut rx).await), ["profile"]);
    let info = adaptor.handle.translate("profile", &key()).await.unwrap();
    assert_eq!(
        info.capability.access_mode.mode,
        Mode::SingleNodeWriter as i32
    );
    assert!(adaptor.handle.status().await.unwrap().conflicts.is_empty());
    adaptor.stop().await;
    server.shut_down().await;
}

/// A changed definition of an *active* profile keeps the old one in force, while the rest of
/// the document applies; renaming it is the way to publish the new definition.
#[tokio::test]
async fn changed_definition_keeps_old_until_renamed() {
    let server = TestServer::start(&doc(&[("gold", "SINGLE_NODE_WRITER")])).await;
    let adaptor = Running::start(ProfilesConfig::new(server.source("/profiles")));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    wait_view(&mut rx, |v| v.contains_key("gold")).await;

    server.set(
        StatusCode::OK,
        &doc(&[
            ("gold", "MULTI_NODE_READER_ONLY"),
            ("silver", "SINGLE_NODE_WRITER"),
        ]),
    );
    let (added, removed, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(
        (added, removed, conflicts),
        (set(&["silver"]), set(&[]), set(&["gold"]))
    );
    let view = next_view(&mut rx).await;
    assert_eq!(names(&view), ["gold", "silver"]);
    assert_eq!(
        view["gold"].capability.access_mode.mode,
        Mode::SingleNodeWriter as i32,
        "old definition stays in force"
    );

    server.set(
        StatusCode::OK,
        &doc(&[
            ("gold-v2", "MULTI_NODE_READER_ONLY"),
            ("silver", "SINGLE_NODE_WRITER"),
        ]),
    );
    let (added, removed, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(
        (added, removed, conflicts),
        (set(&["gold-v2"]), set(&["gold"]), set(&[]))
    );
    assert_eq!(names(&next_view(&mut rx).await), ["gold-v2", "silver"]);
    adaptor.stop().await;
}

/// Scheduled polling over HTTP picks up a change without being asked.
#[tokio::test]
async fn http_source_is_polled_on_interval() {
    let server = TestServer::start(&doc(&[("profile", "SINGLE_NODE_WRITER")])).await;
    let adaptor = Running::start(
        ProfilesConfig::new(server.source("/profiles")).poll_interval(Duration::from_millis(20)),
    );
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    wait_view(&mut rx, |v| v.contains_key("profile")).await;
    server.set(
        StatusCode::OK,
        &doc(&[
            ("profile", "SINGLE_NODE_WRITER"),
            ("next", "SINGLE_NODE_WRITER"),
        ]),
    );
    let view = wait_view(&mut rx, |v| v.contains_key("next")).await;
    assert_eq!(names(&view), ["next", "profile"]);
    adaptor.stop().await;
}

/// Providers only see profiles whose selector matches them; `translate` fails with Mesos's
/// messages otherwise. The source here is an inline set from slrp's configuration.
#[tokio::test(start_paused = true)]
async fn selectors_pick_profiles_per_provider() {
    let inline = serde_json::json!({
        "profile_matrix": {
            "by-provider": {
                "resource_provider_selector": {"resource_providers": [{"type": "rp", "name": "a"}]},
                "volume_capabilities": {"mount": {"fs_type": "xfs"}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
                "create_parameters": {"tier": "1"}
            },
            "by-plugin": {
                "csi_plugin_type_selector": {"plugin_type": "csi.x"},
                "volume_capabilities": {"block": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}}
            }
        }
    });
    let adaptor = Running::start(ProfilesConfig::new(ProfileSource::Inline(inline)));
    adaptor.wait_for_fetches(1).await;
    let a = ProviderKey::new("rp", "a", Some("csi.x".into()));
    let b = ProviderKey::new("rp", "b", Some("csi.x".into()));
    let c = ProviderKey::new("rp", "c", None);
    let view = |k: ProviderKey| {
        let h = adaptor.handle.clone();
        async move { h.subscribe(k).await.unwrap().borrow().clone() }
    };
    assert_eq!(names(&view(a.clone()).await), ["by-plugin", "by-provider"]);
    assert_eq!(names(&view(b.clone()).await), ["by-plugin"]);
    assert!(view(c).await.is_empty());

    let info = adaptor.handle.translate("by-provider", &a).await.unwrap();
    assert_eq!(info.parameters["tier"], "1");
    let err = adaptor
        .handle
        .translate("by-provider", &b)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Profile 'by-provider' does not apply to resource provider with type 'rp' and name 'b'"
    );
    let err = adaptor.handle.translate("missing", &a).await.unwrap_err();
    assert_eq!(err.to_string(), "Profile 'missing' not found");
    adaptor.stop().await;
}

/// A profile removed from the document disappears from watchers' views and can no longer be
/// translated; with no random wait, watchers know by the time the poll returns.
#[tokio::test(start_paused = true)]
async fn profile_disappearing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profiles.json");
    std::fs::write(
        &path,
        doc(&[("a", "SINGLE_NODE_WRITER"), ("b", "SINGLE_NODE_WRITER")]),
    )
    .unwrap();
    let adaptor = Running::start(ProfilesConfig::new(ProfileSource::File(path.clone())));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    let view = wait_view(&mut rx, |v| v.len() == 2).await;
    assert_eq!(names(&view), ["a", "b"]);

    std::fs::write(&path, doc(&[("a", "SINGLE_NODE_WRITER")])).unwrap();
    let (_, removed, _) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(removed, set(&["b"]));
    assert!(rx.has_changed().unwrap(), "delivered without delay");
    assert_eq!(names(&rx.borrow_and_update()), ["a"]);
    assert!(matches!(
        adaptor.handle.translate("b", &key()).await,
        Err(TranslateError::NotFound { .. })
    ));
    let status = adaptor.handle.status().await.unwrap();
    assert!(!status.profiles["b"].active && status.profiles["a"].active);
    assert!(adaptor.metrics_text().contains("profiles_active 1"));
    adaptor.stop().await;
}

/// Error statuses, malformed and invalid documents, a hanging server and a dead server all
/// keep the last good mapping, are reported in status and counted in metrics.
#[tokio::test]
async fn unreachable_or_bad_source_keeps_last_good() {
    let server = TestServer::start(&doc(&[("profile", "SINGLE_NODE_WRITER")])).await;
    let adaptor = Running::start(ProfilesConfig::new(server.source("/profiles")));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    wait_view(&mut rx, |v| !v.is_empty()).await;

    server.set(StatusCode::INTERNAL_SERVER_ERROR, "oops");
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(&*e, UpdateError::Fetch(FetchError::Status { status, .. }) if *status == StatusCode::INTERNAL_SERVER_ERROR),
        "{e:?}"
    );

    server.set(StatusCode::OK, "{ not json");
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(&*e, UpdateError::Document(DocumentError::Json { .. })),
        "{e:?}"
    );

    server.set(StatusCode::OK, r#"{"profile_matrix":{"profile":{}}}"#);
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(&*e, UpdateError::Document(DocumentError::NoSelector { .. })),
        "{e:?}"
    );
    let status = adaptor.handle.status().await.unwrap();
    assert!(
        status
            .last_error
            .as_deref()
            .unwrap()
            .contains("profile 'profile' has no valid selector"),
        "{status:?}"
    );

    server.shut_down().await;
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(&*e, UpdateError::Fetch(FetchError::Request { .. })),
        "{e:?}"
    );

    assert!(!rx.has_changed().unwrap(), "watchers saw no change");
    assert_eq!(names(&rx.borrow()), ["profile"]);
    adaptor.handle.translate("profile", &key()).await.unwrap();
    let text = adaptor.metrics_text();
    for line in [
        "profiles_fetches_ok_total 3",
        "profiles_fetches_failed_total 2",
        "profiles_validation_failures_total 2",
        "profiles_active 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    adaptor.stop().await;
}

/// A server that never answers is cut off by the per-fetch timeout.
#[tokio::test]
async fn hanging_server_times_out() {
    let server = TestServer::start("").await;
    let adaptor = Running::start(
        ProfilesConfig::new(server.source("/slow")).fetch_timeout(Duration::from_millis(200)),
    );
    adaptor.wait_for_fetches(1).await;
    let status = adaptor.handle.status().await.unwrap();
    assert!(
        status.last_error.as_deref().unwrap().contains("timed out"),
        "{status:?}"
    );
    assert!(status.profiles.is_empty());
    adaptor.stop().await;
}

/// An oversized document is refused without reading it all.
#[tokio::test]
async fn oversized_document_is_refused() {
    let big = doc(&[("profile", "SINGLE_NODE_WRITER")]);
    let server = TestServer::start(&big).await;
    let adaptor = Running::start(
        ProfilesConfig::new(server.source("/profiles")).max_document_bytes(big.len() - 1),
    );
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(&*e, UpdateError::Fetch(FetchError::BodyTooLarge { .. })),
        "{e:?}"
    );
    adaptor.stop().await;
}

/// The last good table is persisted and restored at start, before the first fetch, so a
/// restart with the source down still serves the profiles; inactive entries are restored
/// too, so immutability holds across restarts.
#[tokio::test(start_paused = true)]
async fn persisted_mapping_used_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("profiles.json");
    let state = dir.path().join("state").join("profiles.state");
    std::fs::create_dir(state.parent().unwrap()).unwrap();
    let config = ProfilesConfig::new(ProfileSource::File(source.clone())).state_file(&state);

    std::fs::write(
        &source,
        doc(&[("a", "SINGLE_NODE_WRITER"), ("b", "SINGLE_NODE_WRITER")]),
    )
    .unwrap();
    let adaptor = Running::start(config.clone());
    adaptor.wait_for_fetches(1).await;
    std::fs::write(&source, doc(&[("a", "SINGLE_NODE_WRITER")])).unwrap();
    applied(adaptor.handle.poll_now().await.unwrap());
    adaptor.stop().await;
    assert!(state.exists());

    // The source is gone; the restarted adaptor serves the persisted mapping.
    std::fs::remove_file(&source).unwrap();
    let adaptor = Running::start(config.clone());
    let rx = adaptor.handle.subscribe(key()).await.unwrap();
    assert_eq!(names(&rx.borrow()), ["a"], "available before any fetch");
    adaptor.wait_for_fetches(1).await;
    let status = adaptor.handle.status().await.unwrap();
    assert!(status.restored_from_state);
    assert!(status.last_error.is_some(), "the fetch failed: {status:?}");
    assert_eq!(names(&rx.borrow()), ["a"]);
    adaptor.handle.translate("a", &key()).await.unwrap();

    // "b" was seen before the restart: a different definition under that name conflicts.
    std::fs::write(
        &source,
        doc(&[
            ("a", "SINGLE_NODE_WRITER"),
            ("b", "MULTI_NODE_MULTI_WRITER"),
        ]),
    )
    .unwrap();
    let (added, _, conflicts) = applied(adaptor.handle.poll_now().await.unwrap());
    assert!(added.is_empty());
    assert_eq!(conflicts, set(&["b"]));
    adaptor.stop().await;
}

/// The state file holds every profile ever seen, in a longer form than the documents that
/// brought them: documents within `max_document_bytes` must still leave a state file that
/// the next start can read.
#[tokio::test(start_paused = true)]
async fn state_of_documents_at_the_size_limit_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("profiles.json");
    let state = dir.path().join("profiles.state");
    let compact = |name: &str| {
        format!(
            r#"{{"profile_matrix":{{"{name}":{{"resource_provider_selector":{{"resource_providers":[{{"type":"{RP_TYPE}","name":"{RP_NAME}"}}]}},"volume_capabilities":{{"mount":{{}},"access_mode":{{"mode":1}}}}}}}}}}"#
        )
    };
    let (first, second) = (compact("a"), compact("b"));
    let config = ProfilesConfig::new(ProfileSource::File(source.clone()))
        .state_file(&state)
        .max_document_bytes(first.len().max(second.len()));
    std::fs::write(&source, &first).unwrap();
    let adaptor = Running::start(config.clone());
    adaptor.wait_for_fetches(1).await;
    std::fs::write(&source, &second).unwrap();
    applied(adaptor.handle.poll_now().await.unwrap());
    let status = adaptor.handle.status().await.unwrap();
    assert_eq!(status.state_error, None);
    adaptor.stop().await;

    std::fs::remove_file(&source).unwrap();
    let adaptor = Running::start(config);
    let rx = adaptor.handle.subscribe(key()).await.unwrap();
    let status = adaptor.handle.status().await.unwrap();
    assert!(status.restored_from_state, "{status:?}");
    assert_eq!(names(&rx.borrow()), ["b"]);
    assert_eq!(status.profiles.len(), 2, "inactive 'a' is remembered too");
    adaptor.stop().await;
}

/// Durations that do not fit after "now" (a poll interval or random wait of centuries,
/// accepted by the config parser) mean "not in this process's life", not a panic of the
/// worker.
#[tokio::test(start_paused = true)]
async fn enormous_intervals_do_not_kill_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("profiles.json");
    std::fs::write(&source, doc(&[("a", "SINGLE_NODE_WRITER")])).unwrap();
    let config = ProfilesConfig::new(ProfileSource::File(source.clone()))
        .poll_interval(Duration::MAX)
        .max_random_wait(Duration::MAX);
    let adaptor = Running::start(config);
    // A subscriber, so that a changed view schedules a delivery after the random wait.
    let _rx = adaptor.handle.subscribe(key()).await.unwrap();
    adaptor.wait_for_fetches(1).await;
    std::fs::write(&source, doc(&[("b", "SINGLE_NODE_WRITER")])).unwrap();
    applied(adaptor.handle.poll_now().await.unwrap());
    applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(adaptor.handle.status().await.unwrap().fetches_completed, 3);
    adaptor.stop().await;
}

/// A corrupt state file is reported and ignored, and replaced by the next good state.
#[tokio::test(start_paused = true)]
async fn corrupt_state_file_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("profiles.json");
    let state = dir.path().join("profiles.state");
    std::fs::write(&state, b"slrp-profiles-state 1 crc32=00000000\n{}").unwrap();
    std::fs::write(&source, doc(&[("a", "SINGLE_NODE_WRITER")])).unwrap();
    let config = ProfilesConfig::new(ProfileSource::File(source)).state_file(&state);

    let adaptor = Running::start(config.clone());
    adaptor.wait_for_fetches(1).await;
    let status = adaptor.handle.status().await.unwrap();
    assert!(!status.restored_from_state);
    assert!(
        status.state_error.is_none(),
        "cleared by the successful write that followed: {status:?}"
    );
    assert_eq!(status.profiles.len(), 1);
    adaptor.stop().await;

    let adaptor = Running::start(config);
    let status = adaptor.handle.status().await.unwrap();
    assert!(status.restored_from_state, "{status:?}");
    adaptor.stop().await;
}

/// A corrupt state file with an unchanged source: the error stays visible.
#[tokio::test(start_paused = true)]
async fn corrupt_state_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("profiles.state");
    std::fs::write(&state, b"not a state file").unwrap();
    let config =
        ProfilesConfig::new(ProfileSource::File(dir.path().join("absent.json"))).state_file(&state);
    let adaptor = Running::start(config);
    adaptor.wait_for_fetches(1).await;
    let status = adaptor.handle.status().await.unwrap();
    assert!(
        status
            .state_error
            .as_deref()
            .unwrap()
            .contains("no valid header"),
        "{status:?}"
    );
    assert!(status.profiles.is_empty());
    adaptor.stop().await;
}

/// Each watcher learns about a change after its own uniform random wait in
/// `[0, max_random_wait]` (paused time: the waits are exact virtual durations).
#[tokio::test(start_paused = true)]
async fn max_random_wait_spreads_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profiles.json");
    std::fs::write(&path, r#"{"profile_matrix":{}}"#).unwrap();
    let max = Duration::from_secs(60);
    let adaptor =
        Running::start(ProfilesConfig::new(ProfileSource::File(path.clone())).max_random_wait(max));
    adaptor.wait_for_fetches(1).await;

    let mut receivers = Vec::new();
    for i in 0..20 {
        let k = ProviderKey::new("rp", format!("p{i}"), Some("csi.x".into()));
        receivers.push(adaptor.handle.subscribe(k).await.unwrap());
    }
    std::fs::write(
        &path,
        r#"{"profile_matrix":{"fast":{"csi_plugin_type_selector":{"plugin_type":"csi.x"},
            "volume_capabilities":{"block":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}}}}"#,
    )
    .unwrap();
    let start = Instant::now();
    applied(adaptor.handle.poll_now().await.unwrap());
    assert!(
        receivers.iter().all(|rx| !rx.has_changed().unwrap()),
        "nobody is notified at once"
    );

    let mut waits = tokio::task::JoinSet::new();
    for mut rx in receivers {
        waits.spawn(async move {
            rx.changed().await.unwrap();
            assert_eq!(names(&rx.borrow()), ["fast"]);
            Instant::now() - start
        });
    }
    let elapsed: Vec<Duration> = tokio::time::timeout(2 * max, waits.join_all())
        .await
        .expect("all notified");
    assert!(elapsed.iter().all(|d| *d <= max), "{elapsed:?}");
    let distinct: BTreeSet<Duration> = elapsed.iter().copied().collect();
    assert!(distinct.len() > 1, "waits are random: {elapsed:?}");
    adaptor.stop().await;
}

/// Stopping the adaptor closes the watch channels and makes handle calls fail cleanly.
#[tokio::test(start_paused = true)]
async fn stopped_adaptor_reports_it() {
    let adaptor = Running::start(ProfilesConfig::new(ProfileSource::Inline(
        serde_json::json!({}),
    )));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    let handle = adaptor.handle.clone();
    adaptor.stop().await;
    assert!(rx.changed().await.is_err());
    assert!(handle.status().await.is_err());
    assert_eq!(
        handle.translate("a", &key()).await,
        Err(TranslateError::Stopped)
    );
}

/// Dropping every handle stops the worker.
#[tokio::test(start_paused = true)]
async fn worker_stops_when_handles_are_dropped() {
    let (handle, task) = spawn(
        ProfilesConfig::new(ProfileSource::File(Path::new("/nonexistent/p.json").into())),
        Metrics::default(),
        CancellationToken::new(),
    );
    drop(handle);
    tokio::time::timeout(GUARD, task).await.unwrap().unwrap();
}

// === HTTPS: a server on 127.0.0.1:0 with certificates made at test time ===

/// A certificate authority made for one test.
struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        Self {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    /// Writes the CA certificate as a PEM bundle.
    fn write_pem(&self, path: &Path) {
        std::fs::write(path, self.issuer.pem()).unwrap();
    }

    /// A server configuration presenting a certificate for 127.0.0.1 signed by this CA.
    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], key)
                .unwrap(),
        )
    }
}

/// Serves a fixed body on every path over TLS. One request per connection, so a swapped
/// certificate is seen by the very next fetch (no pooled session survives).
struct TlsServer {
    url: String,
    tls: Arc<Mutex<Arc<rustls::ServerConfig>>>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl TlsServer {
    async fn start(tls: Arc<rustls::ServerConfig>, body: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let tls = Arc::new(Mutex::new(tls));
        let shutdown = CancellationToken::new();
        let (stop, current, body) = (shutdown.clone(), Arc::clone(&tls), body.to_owned());
        let task = tokio::spawn(async move {
            // Dropping the set when the loop ends aborts open connections.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let tcp = tokio::select! {
                    () = stop.cancelled() => break,
                    accepted = listener.accept() => accepted.unwrap().0,
                };
                let acceptor =
                    tokio_rustls::TlsAcceptor::from(Arc::clone(&current.lock().unwrap()));
                let body = bytes::Bytes::from(body.clone());
                connections.spawn(async move {
                    // Refused handshakes are what some tests provoke; nothing to serve then.
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |_request| {
                        let body = body.clone();
                        async move {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(body),
                            ))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(false)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            url,
            tls,
            shutdown,
            task: Some(task),
        }
    }

    fn source(&self) -> ProfileSource {
        ProfileSource::parse_uri(&format!("{}/profiles?token=hunter2", self.url)).unwrap()
    }

    fn present(&self, tls: Arc<rustls::ServerConfig>) {
        *self.tls.lock().unwrap() = tls;
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn tls_failure(e: &UpdateError) -> &rustls::Error {
    match e {
        UpdateError::Fetch(FetchError::Tls { source, .. }) => source,
        other => panic!("expected a TLS failure, got {other:?}"),
    }
}

/// An https source whose server certificate chains to the CA in `ca_file` is fetched; when
/// the server starts presenting a certificate from another CA, the fetch fails with a TLS
/// error naming the cause, the last good mapping stays, and the query string (a token)
/// appears nowhere.
#[tokio::test]
async fn fetch_from_https_with_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("slrp test CA");
    let ca_file = dir.path().join("ca.pem");
    ca.write_pem(&ca_file);
    let server = TlsServer::start(
        ca.server_config(),
        &doc(&[("profile", "SINGLE_NODE_WRITER")]),
    )
    .await;
    let adaptor = Running::start(ProfilesConfig::new(server.source()).ca_file(&ca_file));
    let mut rx = adaptor.handle.subscribe(key()).await.unwrap();
    assert_eq!(
        names(&wait_view(&mut rx, |v| !v.is_empty()).await),
        ["profile"]
    );
    adaptor.handle.translate("profile", &key()).await.unwrap();

    server.present(TestCa::new("someone else").server_config());
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(
        tls_failure(&e),
        &rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
    );
    let status = adaptor.handle.status().await.unwrap();
    let last_error = status.last_error.as_deref().unwrap();
    assert!(
        last_error.contains(&format!(
            "TLS handshake with {}/profiles?<redacted> failed",
            server.url
        )) && last_error.contains("invalid peer certificate"),
        "{last_error}"
    );
    assert!(!format!("{e:?} {status:?}").contains("hunter2"));
    assert!(!rx.has_changed().unwrap(), "watchers saw no change");
    adaptor.handle.translate("profile", &key()).await.unwrap();

    // Trusted again: fetches resume.
    server.present(ca.server_config());
    applied(adaptor.handle.poll_now().await.unwrap());
    assert!(
        adaptor
            .metrics_text()
            .contains("profiles_fetches_failed_total 1")
    );
    adaptor.stop().await;
}

/// Without `ca_file` the system trust store decides, and it does not know a test CA.
#[tokio::test]
async fn https_without_ca_file_uses_the_system_store() {
    let ca = TestCa::new("slrp test CA");
    let server = TlsServer::start(ca.server_config(), &doc(&[])).await;
    let adaptor = Running::start(ProfilesConfig::new(server.source()));
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    if rustls_native_certs::load_native_certs().certs.is_empty() {
        // A machine without ca-certificates: the setup error says what to do.
        assert!(
            matches!(
                &*e,
                UpdateError::Fetch(FetchError::TlsSetup {
                    source: TlsSetupError::NoSystemRoots { .. },
                    ..
                })
            ),
            "{e:?}"
        );
    } else {
        assert_eq!(
            tls_failure(&e),
            &rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        );
    }
    adaptor.stop().await;
}

/// A missing `ca_file` is a fetch failure naming the file, retried on every poll: once the
/// file appears, the next fetch works without a restart.
#[tokio::test]
async fn missing_ca_file_is_reported_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("slrp test CA");
    let ca_file = dir.path().join("ca.pem");
    let server = TlsServer::start(
        ca.server_config(),
        &doc(&[("profile", "SINGLE_NODE_WRITER")]),
    )
    .await;
    let adaptor = Running::start(ProfilesConfig::new(server.source()).ca_file(&ca_file));
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(
            &*e,
            UpdateError::Fetch(FetchError::TlsSetup {
                source: TlsSetupError::ReadCaFile { path, .. },
                ..
            }) if *path == ca_file
        ),
        "{e:?}"
    );

    std::fs::write(&ca_file, "not a certificate\n").unwrap();
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    assert!(
        matches!(
            &*e,
            UpdateError::Fetch(FetchError::TlsSetup {
                source: TlsSetupError::NoCertificates { .. },
                ..
            })
        ),
        "{e:?}"
    );

    ca.write_pem(&ca_file);
    let (added, _, _) = applied(adaptor.handle.poll_now().await.unwrap());
    assert_eq!(added, set(&["profile"]));
    adaptor.stop().await;
}

/// An https URL pointing at a plain-http server fails the handshake; it is never fetched in
/// clear text.
#[tokio::test]
async fn https_to_a_plain_http_server_fails_the_handshake() {
    let server = TestServer::start(&doc(&[("profile", "SINGLE_NODE_WRITER")])).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    TestCa::new("slrp test CA").write_pem(&ca_file);
    let url = server.url.replacen("http://", "https://", 1);
    let source = ProfileSource::parse_uri(&format!("{url}/profiles")).unwrap();
    let adaptor = Running::start(ProfilesConfig::new(source).ca_file(&ca_file));
    let e = failed(adaptor.handle.poll_now().await.unwrap());
    tls_failure(&e);
    assert!(adaptor.handle.status().await.unwrap().profiles.is_empty());
    adaptor.stop().await;
    server.shut_down().await;
}
