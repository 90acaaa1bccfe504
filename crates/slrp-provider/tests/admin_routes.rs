//! The read and action routes of `docs/admin-api.md` over a real unix socket, with fakes
//! of `AdminProvider` and `ManagerActions` and a real volume manager over the fake plugin.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use prometheus_client::registry::Registry;
use slrp_core::provider::operations::{TrackedOperation, proto_uuid};
use slrp_core::provider::state::StateError;
use slrp_core::volume::{MountPaths, VolumeManagerHandle};
use slrp_csi::VolumeId;
use slrp_proto::mesos::v1::resource::DiskInfo;
use slrp_proto::mesos::v1::resource::disk_info::{Source, source};
use slrp_proto::mesos::v1::{
    AgentId, FrameworkId, OperationState, OperationStatus, Resource, ResourceProviderId, offer,
    value,
};
use slrp_provider::admin::api::{
    self, CreateDisk, DestroyDisk, Mode, OperationSummary, PluginHealth, ProfileSummary, VolumeRef,
};
use slrp_provider::admin::{
    ActionError, AdminListener, AdminProvider, AdminState, BoxFuture, DaemonExtras, ManagerActions,
};
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::{Harness, create_req};
use tokio_util::sync::CancellationToken;

const A: &str = "org.apache.mesos.rp.local.storage.a";
const AGENT: &str = "agent-1";
const RP: &str = "rp-1";

/// A provider over a real volume manager, with a fixed total and operations.
struct View {
    volumes: VolumeManagerHandle,
    paths: MountPaths,
    /// Set: the provider's stack went away (no mount paths) as a plugin restart does.
    paths_gone: Arc<AtomicBool>,
    total: Vec<Resource>,
    operations: Vec<TrackedOperation>,
}

impl AdminProvider for View {
    fn key(&self) -> String {
        A.to_owned()
    }
    fn state(&self) -> String {
        "READY".to_owned()
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([(
            format!("resource_providers/{A}/csi_plugin/rpcs_finished"),
            4.0,
        )])
    }
    fn volumes(&self) -> Option<VolumeManagerHandle> {
        Some(self.volumes.clone())
    }
    fn mount_paths(&self) -> Option<MountPaths> {
        (!self.paths_gone.load(Ordering::SeqCst)).then(|| self.paths.clone())
    }
    fn agent_id(&self) -> Option<String> {
        Some(AGENT.to_owned())
    }
    fn provider_id(&self) -> Option<String> {
        Some(RP.to_owned())
    }
    fn total(&self) -> Vec<Resource> {
        self.total.clone()
    }
    fn operation_counts(&self) -> (usize, usize) {
        (self.operations.len(), 1)
    }
    fn operations(&self) -> BoxFuture<'_, Result<Vec<TrackedOperation>, StateError>> {
        Box::pin(async { Ok(self.operations.clone()) })
    }
    fn profiles(&self) -> BoxFuture<'_, Vec<ProfileSummary>> {
        Box::pin(async {
            vec![ProfileSummary {
                name: "mount".to_owned(),
                r#type: "mount".to_owned(),
                fs_type: None,
                parameters: BTreeMap::from([("pool".to_owned(), "dir".to_owned())]),
            }]
        })
    }
    fn plugins(&self) -> Vec<PluginHealth> {
        vec![PluginHealth {
            provider: A.to_owned(),
            plugin: "org.apache.mesos.csi.local".to_owned(),
            csi_version: Some("v1".to_owned()),
            healthy: true,
            restarts: 2,
            error: None,
            container: Some("plugin".to_owned()),
        }]
    }
}

/// A MOUNT disk resource of `mb` MB with `id` (none: RAW) and `profile`.
fn disk(id: Option<&str>, profile: &str, mb: f64) -> Resource {
    Resource {
        name: "disk".to_owned(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value: mb }),
        provider_id: Some(ResourceProviderId {
            value: RP.to_owned(),
        }),
        disk: Some(DiskInfo {
            source: Some(Source {
                r#type: if id.is_some() {
                    source::Type::Mount
                } else {
                    source::Type::Raw
                } as i32,
                id: id.map(str::to_owned),
                profile: Some(profile.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An operation CREATE_DISK from the RAW pool, pending; and one finished into `volume`
/// with two reliable updates of which the first is acknowledged.
fn tracked(volume: &str) -> (TrackedOperation, TrackedOperation) {
    let info = offer::Operation {
        r#type: Some(offer::operation::Type::CreateDisk as i32),
        create_disk: Some(offer::operation::CreateDisk {
            source: disk(None, "mount", 64.0),
            target_type: source::Type::Mount as i32,
            target_profile: None,
        }),
        ..Default::default()
    };
    let agent = AgentId {
        value: AGENT.to_owned(),
    };
    let rp = ResourceProviderId {
        value: RP.to_owned(),
    };
    let pending =
        TrackedOperation::pending(uuid::Uuid::from_u128(1), None, info.clone(), &agent, &rp);
    let mut finished = TrackedOperation::pending(
        uuid::Uuid::from_u128(2),
        Some(FrameworkId {
            value: "fw".to_owned(),
        }),
        info,
        &agent,
        &rp,
    );
    let status = |n: u128, state: OperationState, converted: Vec<Resource>| OperationStatus {
        state: state as i32,
        message: Some(format!("update {n}")),
        uuid: Some(proto_uuid(&uuid::Uuid::from_u128(n))),
        converted_resources: converted,
        ..Default::default()
    };
    finished.latest_status = status(
        11,
        OperationState::OperationFinished,
        vec![disk(Some(volume), "mount", 1.0)],
    );
    finished.statuses = vec![finished.latest_status.clone()];
    finished.stream = vec![
        status(10, OperationState::OperationPending, Vec::new()),
        finished.latest_status.clone(),
    ];
    finished.acked = 1;
    (pending, finished)
}

/// What the fake manager was asked, and what it answers.
#[derive(Default)]
struct FakeManager {
    asked: Mutex<Vec<String>>,
    /// The volume manager publishes go to.
    volumes: Mutex<Option<VolumeManagerHandle>>,
    /// Its record of operations.
    operations: Vec<OperationSummary>,
    /// When set, a publish ends with the provider's mount paths gone (a plugin restart
    /// right after it), via the view's flag.
    lose_paths_on_publish: AtomicBool,
    paths_gone: Arc<AtomicBool>,
}

fn op_summary(uuid: u128, state: &str) -> OperationSummary {
    OperationSummary {
        provider: A.to_owned(),
        operation_uuid: uuid::Uuid::from_u128(uuid).hyphenated().to_string(),
        r#type: "CREATE_DISK".to_owned(),
        state: state.to_owned(),
        message: None,
        framework_id: None,
        volume_id: None,
        converted_resources: Vec::new(),
        statuses: Vec::new(),
        last_error: None,
        next_retry: None,
    }
}

impl ManagerActions for FakeManager {
    fn create_disk(
        &self,
        request: CreateDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(async move {
            self.asked
                .lock()
                .unwrap()
                .push(format!("create {} {}", request.profile, request.size_bytes));
            if request.profile == "full" {
                return Err(ActionError::field(
                    StatusCode::CONFLICT,
                    "size_bytes",
                    "not enough free space in pool 'dir'",
                ));
            }
            let state = if request.wait {
                "OPERATION_FINISHED"
            } else {
                "OPERATION_PENDING"
            };
            Ok(op_summary(7, state))
        })
    }
    fn destroy_disk(
        &self,
        request: DestroyDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        Box::pin(async move {
            self.asked
                .lock()
                .unwrap()
                .push(format!("destroy {}", request.volume_id));
            Ok(op_summary(8, "OPERATION_PENDING"))
        })
    }
    fn publish(&self, request: VolumeRef) -> BoxFuture<'_, Result<(), ActionError>> {
        Box::pin(async move {
            self.asked
                .lock()
                .unwrap()
                .push(format!("publish {}", request.volume_id));
            let handle = self.volumes.lock().unwrap().clone().unwrap();
            let published = handle
                .publish(&VolumeId::new(request.volume_id))
                .await
                .map(|_| ())
                .map_err(|e| ActionError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()));
            if self.lose_paths_on_publish.load(Ordering::SeqCst) {
                self.paths_gone.store(true, Ordering::SeqCst);
            }
            published
        })
    }
    fn operations(&self) -> BoxFuture<'_, Vec<OperationSummary>> {
        Box::pin(async { self.operations.clone() })
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([("resource_provider_manager/subscribed".to_owned(), 1.0)])
    }
    fn register_metrics(&self, registry: &mut Registry) {
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        counter.inc();
        registry.register(
            "fake_manager_things",
            "Counted by the fake manager",
            counter,
        );
    }
}

async fn get_json(socket: &Path, path: &str) -> (u16, serde_json::Value) {
    let answer = http::unix(socket, "GET", path, None).await;
    (answer.status, answer.json())
}

async fn post_json(socket: &Path, path: &str, body: &str) -> (u16, serde_json::Value) {
    let answer = http::unix(socket, "POST", path, Some(body)).await;
    (answer.status, answer.json())
}

struct Setup {
    h: Harness,
    m: slrp_test_support::harness::Running,
    id: VolumeId,
    _dir: tempfile::TempDir,
    socket: PathBuf,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    manager: Option<Arc<FakeManager>>,
}

impl Setup {
    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
        self.m.stop().await.unwrap();
    }
}

/// One provider with one created (not published) volume; standalone with a fake
/// manager when `standalone`.
async fn setup(standalone: bool) -> Setup {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let id = m.handle.create(create_req("op-1")).await.unwrap().id;
    let (pending, finished) = tracked(id.as_str());
    let paths_gone = Arc::new(AtomicBool::new(false));
    let view = View {
        volumes: m.handle.clone(),
        paths: h.paths(),
        paths_gone: paths_gone.clone(),
        total: vec![
            disk(None, "mount", 1000.0),
            disk(Some(id.as_str()), "mount", 1.0),
        ],
        operations: vec![pending, finished],
    };
    let manager = standalone.then(|| {
        Arc::new(FakeManager {
            volumes: Mutex::new(Some(m.handle.clone())),
            // One the provider tracks too (deduplicated), one it forgot.
            operations: vec![
                op_summary(2, "OPERATION_FINISHED"),
                op_summary(3, "OPERATION_FAILED"),
            ],
            paths_gone,
            ..FakeManager::default()
        })
    });
    let extras = match &manager {
        Some(manager) => DaemonExtras {
            mode: Mode::Standalone,
            actions: Some(manager.clone() as Arc<dyn ManagerActions>),
        },
        None => DaemonExtras::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let state = AdminState::with_extras(vec![Arc::new(view)], Registry::default(), extras);
    let listener = AdminListener::bind(&socket).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(listener.serve(state, cancel.clone()));
    Setup {
        h,
        m,
        id,
        _dir: dir,
        socket,
        cancel,
        task,
        manager,
    }
}

#[tokio::test]
async fn status_resources_profiles_and_plugins_answer_the_api_bodies() {
    let s = setup(false).await;
    let (status, json) = get_json(&s.socket, "/status").await;
    assert_eq!(status, 200, "{json}");
    let parsed: api::Status = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(parsed.mode, Mode::Run);
    assert_eq!(parsed.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(parsed.agent_id.as_deref(), Some(AGENT));
    assert!(parsed.ready);
    assert_eq!(parsed.providers.len(), 1);
    let p = &parsed.providers[0];
    assert_eq!(
        (
            p.provider.as_str(),
            p.state.as_str(),
            p.resource_provider_id.as_deref()
        ),
        (A, "READY", Some(RP))
    );
    assert_eq!((p.operations, p.unacknowledged, p.volumes), (2, 1, Some(1)));

    let (status, json) = get_json(&s.socket, "/resources").await;
    assert_eq!(status, 200, "{json}");
    let resources = json.as_array().unwrap();
    assert_eq!(resources.len(), 2, "{json}");
    assert_eq!(resources[1]["name"], "disk");
    assert_eq!(resources[1]["type"], "SCALAR");
    assert_eq!(resources[1]["scalar"]["value"], 1.0);
    assert_eq!(resources[1]["disk"]["source"]["type"], "MOUNT");
    assert_eq!(resources[1]["disk"]["source"]["id"], s.id.as_str());
    assert_eq!(resources[1]["disk"]["source"]["profile"], "mount");
    assert_eq!(resources[1]["provider_id"]["value"], RP);
    assert_eq!(resources[0]["disk"]["source"]["type"], "RAW");

    let (status, json) = get_json(&s.socket, "/profiles").await;
    assert_eq!(status, 200);
    let profiles: Vec<ProfileSummary> = serde_json::from_value(json).unwrap();
    assert_eq!(profiles.len(), 1);
    assert_eq!(profiles[0].parameters["pool"], "dir");

    let (status, json) = get_json(&s.socket, "/plugins").await;
    assert_eq!(status, 200);
    let plugins: Vec<PluginHealth> = serde_json::from_value(json).unwrap();
    assert_eq!((plugins[0].healthy, plugins[0].restarts), (true, 2));
    s.stop().await;
}

#[tokio::test]
async fn volumes_show_state_paths_type_size_and_profile() {
    let s = setup(false).await;
    let (status, json) = get_json(&s.socket, "/volumes").await;
    assert_eq!(status, 200, "{json}");
    let volumes: Vec<api::VolumeSummary> = serde_json::from_value(json).unwrap();
    assert_eq!(volumes.len(), 1);
    let v = &volumes[0];
    assert_eq!(
        (v.provider.as_str(), v.volume_id.as_str(), v.state.as_str()),
        (A, s.id.as_str(), "CREATED")
    );
    assert_eq!(v.r#type.as_deref(), Some("mount"));
    assert_eq!(v.capacity_bytes, Some(1 << 20));
    assert_eq!(v.profile.as_deref(), Some("mount"));
    assert_eq!((&v.staging_path, &v.target_path), (&None, &None));

    s.m.handle.publish(&s.id).await.unwrap();
    let path = format!("/volumes/{}", s.id.as_str());
    let (status, json) = get_json(&s.socket, &path).await;
    assert_eq!(status, 200, "{json}");
    let v: api::VolumeSummary = serde_json::from_value(json).unwrap();
    assert_eq!(v.state, "PUBLISHED");
    let paths = s.h.paths();
    assert_eq!(
        v.target_path.as_deref(),
        Some(paths.target(&s.id).unwrap().to_str().unwrap())
    );
    assert_eq!(
        v.staging_path.as_deref(),
        Some(paths.staging(&s.id).unwrap().to_str().unwrap())
    );

    let (status, json) = get_json(&s.socket, "/volumes/nope").await;
    assert_eq!(
        (status, json["field"].as_str()),
        (404, Some("volume_id")),
        "{json}"
    );
    assert!(json["error"].as_str().unwrap().contains("'nope'"), "{json}");
    s.stop().await;
}

#[tokio::test]
async fn operations_carry_mesos_names_uuids_and_their_streams() {
    let s = setup(false).await;
    let (status, json) = get_json(&s.socket, "/operations").await;
    assert_eq!(status, 200, "{json}");
    let ops: Vec<OperationSummary> = serde_json::from_value(json).unwrap();
    assert_eq!(ops.len(), 2);
    assert_eq!(
        ops[0].operation_uuid,
        "00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(
        (ops[0].r#type.as_str(), ops[0].state.as_str()),
        ("CREATE_DISK", "OPERATION_PENDING")
    );
    assert_eq!(
        ops[0].volume_id, None,
        "a pending CREATE_DISK has no volume yet"
    );
    assert!(ops[0].statuses.is_empty());
    let done = &ops[1];
    assert_eq!(done.state, "OPERATION_FINISHED");
    assert_eq!(done.message.as_deref(), Some("update 11"));
    assert_eq!(done.framework_id.as_deref(), Some("fw"));
    assert_eq!(done.volume_id.as_deref(), Some(s.id.as_str()));
    assert_eq!(
        done.converted_resources[0]["disk"]["source"]["id"],
        s.id.as_str()
    );
    let stream: Vec<_> = done
        .statuses
        .iter()
        .map(|st| {
            (
                st.status_uuid.clone().unwrap(),
                st.state.as_str(),
                st.acknowledged,
            )
        })
        .collect();
    assert_eq!(
        stream,
        [
            (
                "00000000-0000-0000-0000-00000000000a".to_owned(),
                "OPERATION_PENDING",
                Some(true)
            ),
            (
                "00000000-0000-0000-0000-00000000000b".to_owned(),
                "OPERATION_FINISHED",
                Some(false)
            ),
        ]
    );

    // Any spelling of the uuid finds it; the answer is canonical.
    let (status, json) = get_json(&s.socket, "/operations/00000000000000000000000000000002").await;
    assert_eq!(status, 200, "{json}");
    assert_eq!(
        json["operation_uuid"],
        "00000000-0000-0000-0000-000000000002"
    );
    let (status, json) = get_json(
        &s.socket,
        "/operations/00000000-0000-0000-0000-000000000009",
    )
    .await;
    assert_eq!(
        (status, json["field"].as_str()),
        (404, Some("uuid")),
        "{json}"
    );
    let (status, json) = get_json(&s.socket, "/operations/not-a-uuid").await;
    assert_eq!(
        (status, json["field"].as_str()),
        (400, Some("uuid")),
        "{json}"
    );
    s.stop().await;
}

#[tokio::test]
async fn under_run_mode_the_manager_actions_are_403_and_unknown_routes_404() {
    let s = setup(false).await;
    let id = s.id.as_str();
    for (path, body) in [
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 1048576}"#.to_owned(),
        ),
        ("/disks/destroy", format!(r#"{{"volume_id": "{id}"}}"#)),
        ("/volumes/publish", format!(r#"{{"volume_id": "{id}"}}"#)),
        (
            "/disks/expand",
            format!(r#"{{"volume_id": "{id}", "size_bytes": 1048576}}"#),
        ),
        ("/snapshots", format!(r#"{{"volume_id": "{id}"}}"#)),
        ("/snapshots/delete", r#"{"snapshot_id": "s"}"#.to_owned()),
    ] {
        let (status, json) = post_json(&s.socket, path, &body).await;
        assert_eq!(status, 403, "{path}: {json}");
        assert!(
            json["error"].as_str().unwrap().contains("slrp standalone"),
            "{path}: {json}"
        );
    }
    let (status, json) = get_json(&s.socket, "/nothing").await;
    assert_eq!(status, 404, "{json}");
    let (status, json) = get_json(&s.socket, "/disks").await;
    assert_eq!(status, 405, "{json}");
    assert!(json["error"].is_string(), "{json}");
    // A path parameter that is not UTF-8 once percent-decoded: the API's JSON error, not
    // axum's plain text (the admin_api fuzz target's first finding).
    for path in ["/operations/12%9a", "/volumes/v%ff"] {
        let (status, json) = get_json(&s.socket, path).await;
        assert_eq!(status, 400, "{path}: {json}");
        assert!(json["error"].is_string(), "{path}: {json}");
    }
    s.stop().await;
}

#[tokio::test]
async fn malformed_bodies_are_400_naming_the_field() {
    let s = setup(true).await;
    let cases: [(&str, &str, Option<&str>); 12] = [
        ("/disks", r#"{"size_bytes": 1}"#, Some("profile")),
        ("/disks", r#"{"profile": "mount"}"#, Some("size_bytes")),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 0}"#,
            Some("size_bytes"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": -1}"#,
            Some("size_bytes"),
        ),
        (
            "/disks",
            r#"{"profile": "", "size_bytes": 1}"#,
            Some("profile"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 1, "type": "nfs"}"#,
            Some("type"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 1, "sise": 2}"#,
            Some("sise"),
        ),
        ("/disks", "not json", None),
        ("/disks/destroy", r#"{"volume_id": ""}"#, Some("volume_id")),
        ("/volumes/publish", r#"{"volume_id": 7}"#, Some("volume_id")),
        ("/volumes/unpublish", "{}", Some("volume_id")),
        ("/volumes/unpublish", r#"{"volume_id": "x"} trailing"#, None),
    ];
    for (path, body, field) in cases {
        let (status, json) = post_json(&s.socket, path, body).await;
        assert_eq!(status, 400, "{path} {body}: {json}");
        assert_eq!(json["field"].as_str(), field, "{path} {body}: {json}");
        assert!(
            json["error"]
                .as_str()
                .unwrap()
                .starts_with("the body must be")
                || field.is_some(),
            "{json}"
        );
    }
    assert!(
        s.manager.as_ref().unwrap().asked.lock().unwrap().is_empty(),
        "nothing malformed reached the manager"
    );
    s.stop().await;
}

#[tokio::test]
async fn standalone_actions_go_through_the_manager() {
    let s = setup(true).await;
    let manager = s.manager.clone().unwrap();
    let (status, json) = post_json(
        &s.socket,
        "/disks",
        r#"{"profile": "mount", "size_bytes": 1048576}"#,
    )
    .await;
    assert_eq!(
        (status, json["state"].as_str()),
        (202, Some("OPERATION_PENDING")),
        "{json}"
    );
    let (status, json) = post_json(
        &s.socket,
        "/disks",
        r#"{"profile": "mount", "size_bytes": 1048576, "type": "block", "wait": true}"#,
    )
    .await;
    assert_eq!(
        (status, json["state"].as_str()),
        (200, Some("OPERATION_FINISHED")),
        "{json}"
    );
    // The manager's refusal passes with its status and field.
    let (status, json) = post_json(
        &s.socket,
        "/disks",
        r#"{"profile": "full", "size_bytes": 1}"#,
    )
    .await;
    assert_eq!(
        (status, json["field"].as_str()),
        (409, Some("size_bytes")),
        "{json}"
    );

    let id = s.id.as_str();
    // The answer's path is that of the volume manager that published, even when the
    // provider's stack goes away before the answer is made.
    manager.lose_paths_on_publish.store(true, Ordering::SeqCst);
    let (status, json) = post_json(
        &s.socket,
        "/disks/destroy",
        &format!(r#"{{"volume_id": "{id}"}}"#),
    )
    .await;
    assert_eq!(status, 202, "{json}");

    let (status, json) = post_json(
        &s.socket,
        "/volumes/publish",
        &format!(r#"{{"volume_id": "{id}"}}"#),
    )
    .await;
    assert_eq!(status, 200, "{json}");
    let target = s.h.paths().target(&s.id).unwrap();
    assert_eq!(json["state"], "PUBLISHED", "{json}");
    assert_eq!(json["path"], target.to_str().unwrap(), "{json}");
    assert!(s.h.fake.volume(&s.id).unwrap().published.is_some());

    // A published volume is not destroyed under its user: 409, and the manager is not
    // asked.
    let (status, json) = post_json(
        &s.socket,
        "/disks/destroy",
        &format!(r#"{{"volume_id": "{id}"}}"#),
    )
    .await;
    assert_eq!(
        (status, json["field"].as_str()),
        (409, Some("volume_id")),
        "{json}"
    );
    let error = json["error"].as_str().unwrap();
    // (The provider's paths are gone here, so the message cannot say where.)
    assert!(
        error.contains(&format!("volume {id} is published"))
            && error.contains(&format!("slrp ctl unpublish {id}")),
        "{json}"
    );
    assert!(s.h.fake.volume(&s.id).unwrap().published.is_some());

    // An unknown volume never reaches the manager.
    let (status, json) = post_json(&s.socket, "/volumes/publish", r#"{"volume_id": "nope"}"#).await;
    assert_eq!(
        (status, json["field"].as_str()),
        (404, Some("volume_id")),
        "{json}"
    );
    let (status, json) = post_json(
        &s.socket,
        "/volumes/unpublish",
        &format!(r#"{{"volume_id": "{id}"}}"#),
    )
    .await;
    assert_eq!(
        (status, json["state"].as_str()),
        (200, Some("NODE_READY")),
        "{json}"
    );

    assert_eq!(
        *manager.asked.lock().unwrap(),
        [
            "create mount 1048576".to_owned(),
            "create mount 1048576".to_owned(),
            "create full 1".to_owned(),
            format!("destroy {id}"),
            format!("publish {id}"),
        ]
    );

    // The manager's record joins the providers', deduplicated by uuid.
    let (status, json) = get_json(&s.socket, "/operations").await;
    assert_eq!(status, 200);
    let uuids: Vec<_> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["operation_uuid"].as_str().unwrap().to_owned(),
                o["state"].clone(),
            )
        })
        .collect();
    assert_eq!(uuids.len(), 3, "{json}");
    assert_eq!(uuids[1].1, "OPERATION_FINISHED");
    assert_eq!(uuids[2].0, "00000000-0000-0000-0000-000000000003");

    let (_, json) = get_json(&s.socket, "/metrics/snapshot").await;
    assert_eq!(json["resource_provider_manager/subscribed"], 1.0, "{json}");
    assert_eq!(
        json[format!("resource_providers/{A}/csi_plugin/rpcs_finished")],
        4.0
    );
    let text = http::unix(&s.socket, "GET", "/metrics", None).await.body;
    assert!(text.contains("fake_manager_things_total 1"), "{text}");
    s.stop().await;
}
