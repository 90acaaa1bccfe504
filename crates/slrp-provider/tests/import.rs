//! `slrp_provider::import`: a Mesos SLRP's checkpoint tree (written by the
//! `slrp_test_support::mesos` fixture in Mesos's formats) read as Mesos's recovery reads it, mapped to slrp's records, committed in one
//! transaction. No root needed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use slrp_core::provider::state::ProviderState;
use slrp_core::volume::{BootId, MountTable, StateName, VolumeRecord, VolumeState};
use slrp_proto::mesos::csi::state::VolumeState as MesosVolume;
use slrp_proto::mesos::csi::state::volume_state::State;
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::resource_provider::resource_provider_state::Storage;
use slrp_proto::mesos::resource_provider::resource_provider_state::storage::ProfileInfo;
use slrp_proto::mesos::v1::resource_provider_info::Storage as InfoStorage;
use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;
use slrp_proto::mesos::v1::{
    CsiPluginInfo, Operation, OperationState, OperationStatus, Resource, ResourceProviderInfo,
    Secret, Uuid, offer, secret,
};
use slrp_provider::config::ProviderConfig;
use slrp_provider::import::{
    Committed, ImportError, ImportOptions, MesosImport, Refusal, open_store, plan,
};
use slrp_provider::persist::load_operations;
use slrp_store::Store;
use slrp_test_support::mesos::{MesosStream, MesosWorkDir};
use slrp_wire::checkpoint::encode_message;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
const RP_NAME: &str = "test";
const PLUGIN_TYPE: &str = "org.apache.mesos.csi.test";
const PLUGIN_NAME: &str = "local";
const AGENT: &str = "a1b2-S0";
const RP_ID: &str = "rp-1";
const MB: f64 = 1.0;

fn provider() -> ProviderConfig {
    ProviderConfig {
        info: ResourceProviderInfo {
            r#type: RP_TYPE.into(),
            name: RP_NAME.into(),
            storage: Some(InfoStorage {
                plugin: CsiPluginInfo {
                    r#type: PLUGIN_TYPE.into(),
                    name: Some(PLUGIN_NAME.into()),
                    ..CsiPluginInfo::default()
                },
                reconciliation_interval_seconds: None,
            }),
            ..ResourceProviderInfo::default()
        },
        source: PathBuf::from("/etc/rp/test.json"),
    }
}

/// A Mesos agent work directory (the shared fixture) with this test's provider and plugin.
struct Mesos {
    _dir: tempfile::TempDir,
    w: MesosWorkDir,
}

impl Mesos {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let w = MesosWorkDir::new(dir.path()).agent(AGENT);
        Self { _dir: dir, w }
    }

    fn root(&self) -> &Path {
        self.w.root()
    }

    fn boot_id(&self, id: &str) {
        let _ = self.w.clone().boot_id(id);
    }

    fn rp_dir(&self) -> PathBuf {
        self.w
            .agent_dir()
            .join("resource_providers")
            .join(RP_TYPE)
            .join(RP_NAME)
    }

    /// `latest` → `<rp dir>/<rp id>` and, if given, `resource_provider.state`.
    fn provider(&self, state: Option<&ResourceProviderState>) -> PathBuf {
        let p = self.w.provider(RP_TYPE, RP_NAME, RP_ID);
        if let Some(state) = state {
            p.state(state);
        }
        p.state_path()
    }

    /// Operation `op`'s status stream (the provider must exist).
    fn stream(&self, op: uuid::Uuid) -> MesosStream {
        self.w.provider(RP_TYPE, RP_NAME, RP_ID).stream(op)
    }

    fn volume_path(&self, id: &str) -> PathBuf {
        self.w.volume_state_path(PLUGIN_TYPE, PLUGIN_NAME, id)
    }

    fn volume(&self, id: &str, state: &MesosVolume) -> PathBuf {
        self.w.volume(PLUGIN_TYPE, PLUGIN_NAME, id, state)
    }

    fn volume_bytes(&self, id: &str, bytes: &[u8]) -> PathBuf {
        let path = self.volume_path(id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Every file under the work directory with its bytes.
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                if meta.is_symlink() {
                    out.insert(
                        p.clone(),
                        std::fs::read_link(&p)
                            .unwrap()
                            .into_os_string()
                            .into_encoded_bytes(),
                    );
                } else if meta.is_dir() {
                    walk(&p, out);
                } else {
                    out.insert(p.clone(), std::fs::read(&p).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.root(), &mut out);
        out
    }
}

fn resource(json: serde_json::Value) -> Resource {
    slrp_wire::json::from_value(json).unwrap()
}

fn pool(mb: f64) -> Resource {
    resource(serde_json::json!({
        "provider_id": {"value": RP_ID},
        "name": "disk", "type": "SCALAR", "scalar": {"value": mb},
        "reservations": [{"type": "DYNAMIC", "role": "storage", "principal": "ops"}],
        "disk": {"source": {"type": "RAW", "vendor": "org.apache.mesos.csi.test.local", "profile": "fast"}}
    }))
}

fn mount_disk(id: &str, mb: f64) -> Resource {
    resource(serde_json::json!({
        "provider_id": {"value": RP_ID},
        "name": "disk", "type": "SCALAR", "scalar": {"value": mb},
        "reservations": [{"type": "DYNAMIC", "role": "storage", "principal": "ops"}],
        "disk": {"source": {"type": "MOUNT", "vendor": "org.apache.mesos.csi.test.local", "id": id,
                 "mount": {"root": "./csi/org.apache.mesos.csi.test/local/mounts"}, "profile": "fast"}}
    }))
}

fn mount_cap() -> VolumeCapability {
    slrp_wire::json::from_value(serde_json::json!({
        "mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}
    }))
    .unwrap()
}

fn profiles() -> Storage {
    Storage {
        profiles: HashMap::from([(
            "fast".to_owned(),
            ProfileInfo {
                capability: mount_cap(),
                parameters: HashMap::from([("pool".to_owned(), "fast".to_owned())]),
            },
        )]),
    }
}

fn volume_state(state: State, boot_id: &str) -> MesosVolume {
    MesosVolume {
        state: state as i32,
        volume_capability: Some(mount_cap()),
        parameters: HashMap::from([("pool".to_owned(), "fast".to_owned())]),
        volume_context: HashMap::from([("ctx".to_owned(), "1".to_owned())]),
        publish_context: HashMap::from([("pc".to_owned(), "1".to_owned())]),
        boot_id: boot_id.to_owned(),
        ..MesosVolume::default()
    }
}

fn status(state: OperationState, converted: Vec<Resource>) -> OperationStatus {
    OperationStatus {
        state: state as i32,
        uuid: Some(Uuid {
            value: uuid::Uuid::new_v4().as_bytes().to_vec(),
        }),
        converted_resources: converted,
        agent_id: Some(slrp_proto::mesos::v1::AgentId {
            value: AGENT.into(),
        }),
        resource_provider_id: Some(slrp_proto::mesos::v1::ResourceProviderId {
            value: RP_ID.into(),
        }),
        ..OperationStatus::default()
    }
}

/// A CREATE_DISK from the pool, in `latest` with `statuses`.
fn create_disk(
    uuid: &uuid::Uuid,
    latest: OperationStatus,
    statuses: Vec<OperationStatus>,
) -> Operation {
    Operation {
        framework_id: None,
        agent_id: None,
        info: offer::Operation {
            r#type: Some(offer::operation::Type::CreateDisk as i32),
            create_disk: Some(offer::operation::CreateDisk {
                source: pool(100.0 * MB),
                target_type: slrp_proto::mesos::v1::resource::disk_info::source::Type::Mount as i32,
                target_profile: None,
            }),
            ..offer::Operation::default()
        },
        latest_status: latest,
        statuses,
        uuid: Uuid {
            value: uuid.as_bytes().to_vec(),
        },
    }
}

fn pending(uuid: &uuid::Uuid) -> Operation {
    create_disk(
        uuid,
        status(OperationState::OperationPending, vec![]),
        vec![],
    )
}

/// The status uuid of `status`.
fn suuid(status: &OperationStatus) -> uuid::Uuid {
    uuid::Uuid::from_slice(&status.uuid.as_ref().unwrap().value).unwrap()
}

#[derive(Debug)]
struct NoMounts;

impl MountTable for NoMounts {
    fn mounts_under(&self, _dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(Vec::new())
    }
}

fn opts(lenient: bool) -> ImportOptions {
    ImportOptions {
        agent_id: None,
        lenient,
        current_boot: Some(BootId::new("boot-now")),
        mounts: Some(Arc::new(NoMounts)),
    }
}

fn refusals(m: &Mesos, lenient: bool) -> Vec<Refusal> {
    plan(m.root(), &provider(), &opts(lenient)).unwrap_err()
}

fn assert_refused(found: &[Refusal], path: &Path, needles: &[&str]) {
    let r = found
        .iter()
        .find(|r| r.path == path)
        .unwrap_or_else(|| panic!("no refusal of {}: {found:?}", path.display()));
    for needle in needles {
        assert!(r.reason.contains(needle), "{needle:?} not in {r}");
    }
}

/// Imports into a fresh store; returns the store directory (kept) and what was committed.
async fn import(m: &Mesos, lenient: bool) -> (tempfile::TempDir, Store) {
    let plan = plan(m.root(), &provider(), &opts(lenient)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    assert_eq!(plan.commit(&store).await.unwrap(), Committed::Imported);
    (dir, store)
}

async fn volumes(store: &Store) -> BTreeMap<String, VolumeRecord> {
    store
        .load_all::<VolumeRecord>()
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.id.as_str().to_owned(), v))
        .collect()
}

fn basic_state() -> ResourceProviderState {
    ResourceProviderState {
        operations: vec![],
        resources: vec![pool(1000.0 * MB), mount_disk("vol-1", 1024.0 * MB)],
        storage: Some(profiles()),
    }
}

#[tokio::test]
async fn every_volume_state_maps_with_its_boot_id_and_publish_context() {
    let m = Mesos::new();
    m.boot_id("boot-agent");
    m.provider(Some(&basic_state()));
    let cases = [
        ("c", State::Created, ""),
        ("cp", State::ControllerPublish, ""),
        ("nr", State::NodeReady, ""),
        ("cu", State::ControllerUnpublish, ""),
        ("ns", State::NodeStage, ""),
        ("vr", State::VolReady, "boot-old"),
        ("np", State::NodePublish, "boot-old"),
        ("vol-1", State::Published, "boot-old"),
        ("nu", State::NodeUnpublish, "boot-old"),
        ("nx", State::NodeUnstage, "boot-old"),
    ];
    for (id, state, boot) in cases {
        let mut v = volume_state(state, boot);
        v.node_publish_required = state == State::Published;
        v.readonly = id == "vr";
        m.volume(id, &v);
    }
    let (_dir, store) = import(&m, false).await;
    let vols = volumes(&store).await;
    assert_eq!(vols.len(), cases.len());
    let pc: BTreeMap<String, String> = [("pc".to_owned(), "1".to_owned())].into();
    let old = BootId::new("boot-old");
    let expect = |id: &str| vols[id].state.clone();
    assert_eq!(expect("c"), VolumeState::Created);
    assert_eq!(expect("cp"), VolumeState::ControllerPublishing);
    assert_eq!(
        expect("nr"),
        VolumeState::NodeReady {
            publish_context: pc.clone()
        }
    );
    assert_eq!(expect("cu"), VolumeState::ControllerUnpublishing);
    // Mesos's NODE_STAGE has no boot id: the agent's last start is when it was sent.
    assert_eq!(
        expect("ns"),
        VolumeState::NodeStaging {
            boot_id: BootId::new("boot-agent"),
            publish_context: pc.clone()
        }
    );
    assert_eq!(
        expect("vr"),
        VolumeState::VolReady {
            boot_id: old.clone(),
            publish_context: pc.clone()
        }
    );
    assert_eq!(
        expect("np"),
        VolumeState::NodePublishing {
            boot_id: old.clone(),
            publish_context: pc.clone()
        }
    );
    assert_eq!(
        expect("vol-1"),
        VolumeState::Published {
            boot_id: old.clone(),
            publish_context: pc.clone()
        }
    );
    assert_eq!(
        expect("nu"),
        VolumeState::NodeUnpublishing {
            boot_id: old.clone(),
            publish_context: pc.clone()
        }
    );
    assert_eq!(
        expect("nx"),
        VolumeState::NodeUnstaging {
            boot_id: old.clone(),
            publish_context: pc
        }
    );
    let published = &vols["vol-1"];
    assert!(published.node_publish_required && published.needs_cleanup);
    // Capacity from the provider's total; Mesos records none.
    assert_eq!(published.capacity_bytes, 1 << 30);
    assert_eq!(vols["c"].capacity_bytes, 0);
    assert!(vols["vr"].spec.readonly && !published.spec.readonly);
    assert_eq!(published.spec.parameters["pool"], "fast");
    assert_eq!(published.spec.volume_context["ctx"], "1");
    assert_eq!(
        published.spec.capability,
        slrp_csi::VolumeCapability::from_mesos(&mount_cap()).unwrap()
    );
    assert!(
        vols.values()
            .all(|v| v.name.is_none() && !v.deleting && v.delete_failed.is_none())
    );
    assert!(
        vols.values()
            .all(|v| !v.spec.untrack_on_unstage && !v.spec.pre_provisioned)
    );
}

#[tokio::test]
async fn node_stage_without_the_agents_boot_id_is_taken_as_the_current_boot() {
    let m = Mesos::new();
    m.volume("ns", &volume_state(State::NodeStage, ""));
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert_eq!(p.report().boot.node_stage_boot_id, "boot-now");
    assert_eq!(
        p.volumes()[0].record.state.boot_id(),
        Some(&BootId::new("boot-now"))
    );
}

#[tokio::test]
async fn a_staged_state_without_a_boot_id_is_refused_strict_and_current_boot_lenient() {
    let m = Mesos::new();
    let path = m.volume("vr", &volume_state(State::VolReady, ""));
    assert_refused(
        &refusals(&m, false),
        &path,
        &["VOL_READY without a boot id", "--lenient"],
    );
    let p = plan(m.root(), &provider(), &opts(true)).unwrap();
    assert_eq!(
        p.volumes()[0].record.state.boot_id(),
        Some(&BootId::new("boot-now"))
    );
}

#[tokio::test]
async fn secret_references_are_kept_and_secret_values_refused_without_the_value() {
    let m = Mesos::new();
    let mut v = volume_state(State::VolReady, "b");
    v.pre_provisioned = true;
    v.node_stage_secrets.insert(
        "password".into(),
        Secret {
            r#type: Some(secret::Type::Reference as i32),
            reference: Some(secret::Reference {
                name: "db".into(),
                key: Some("pw".into()),
            }),
            value: None,
        },
    );
    m.volume("ref", &v);
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    let rec = &p.volumes()[0].record;
    assert_eq!(rec.spec.node_stage_secrets["password"].name, "db");
    assert_eq!(rec.spec.node_stage_secrets["password"].key, "pw");
    // Mesos's pre_provisioned (a CSI-server volume) means "untrack on unstage".
    assert!(rec.spec.untrack_on_unstage && rec.spec.pre_provisioned);

    v.node_publish_secrets.insert(
        "token".into(),
        Secret {
            r#type: Some(secret::Type::Value as i32),
            reference: None,
            value: Some(secret::Value {
                data: b"hunter2-secret".to_vec(),
            }),
        },
    );
    let path = m.volume("val", &v);
    let found = refusals(&m, true);
    assert_refused(
        &found,
        &path,
        &["'val'", "'token'", "secret value", "references only"],
    );
    for r in &found {
        assert!(!r.to_string().contains("hunter2"), "{r}");
        assert!(!format!("{r:?}").contains("hunter2"), "{r:?}");
    }
}

#[tokio::test]
async fn a_tracked_volume_in_no_resource_is_named_by_its_one_pending_create_disk() {
    let m = Mesos::new();
    let op = uuid::Uuid::new_v4();
    let mut state = basic_state();
    state.operations.push(pending(&op));
    m.provider(Some(&state));
    m.volume("new-vol", &volume_state(State::Created, ""));
    m.volume("vol-1", &volume_state(State::Created, ""));
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    let by_id: BTreeMap<&str, &VolumeRecord> = p
        .volumes()
        .iter()
        .map(|v| (v.record.id.as_str(), &v.record))
        .collect();
    assert_eq!(
        by_id["new-vol"].name.as_deref(),
        Some(op.to_string().as_str())
    );
    // In the total: reported already, nothing to name.
    assert_eq!(by_id["vol-1"].name, None);

    // Two creates could have made it: no guess.
    let m = Mesos::new();
    let mut state = basic_state();
    state.operations.push(pending(&uuid::Uuid::new_v4()));
    state.operations.push(pending(&uuid::Uuid::new_v4()));
    m.provider(Some(&state));
    m.volume("new-vol", &volume_state(State::Created, ""));
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert_eq!(p.volumes()[0].record.name, None);
    assert!(
        p.volumes()[0]
            .notes
            .iter()
            .any(|n| n.contains("2 PENDING CREATE_DISKs"))
    );
}

#[tokio::test]
async fn identity_total_profiles_and_operations_are_taken_over_as_mesos_recovers_them() {
    let m = Mesos::new();
    let finished = uuid::Uuid::new_v4();
    let forgotten = uuid::Uuid::new_v4();
    let waiting = uuid::Uuid::new_v4();
    let resent = uuid::Uuid::new_v4();
    let no_stream = uuid::Uuid::new_v4();
    let converted = vec![mount_disk("vol-1", 1024.0 * MB)];
    let done = status(OperationState::OperationFinished, converted.clone());
    let done2 = status(OperationState::OperationFinished, vec![]);
    let done3 = status(OperationState::OperationFinished, vec![]);
    let done4 = status(OperationState::OperationFailed, vec![]);
    let mut state = basic_state();
    state.operations = vec![
        create_disk(&finished, done.clone(), vec![done.clone()]),
        create_disk(&forgotten, done2.clone(), vec![done2.clone()]),
        pending(&waiting),
        create_disk(&resent, done3.clone(), vec![done3.clone()]),
        create_disk(&no_stream, done4.clone(), vec![done4.clone()]),
    ];
    m.provider(Some(&state));
    // FINISHED, its UPDATE checkpointed, not acknowledged: delivered again.
    m.stream(finished).update(done.clone());
    // Terminal and acknowledged: Mesos forgets it (B.5 item 3).
    m.stream(forgotten).update(done2.clone()).ack(suuid(&done2));
    // The stream directory exists, the first update never reached it: "none".
    std::fs::write(m.stream(resent).path(), b"").unwrap();
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert!(
        p.skipped()
            .iter()
            .any(|s| s.reason.contains(&forgotten.to_string()) && s.reason.contains("forgets")),
        "{:?}",
        p.skipped()
    );
    let (_dir, store) = {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("store")).unwrap();
        p.commit(&store).await.unwrap();
        (dir, store)
    };
    let loaded = slrp_provider::persist::load_state(&store, AGENT)
        .await
        .unwrap();
    assert_eq!(loaded.provider_id.unwrap().value, RP_ID);
    // Upgraded as Mesos reads it: the reservations are back in `reservations`.
    let expected: slrp_core::provider::resources::Resources =
        [pool(1000.0 * MB), mount_disk("vol-1", 1024.0 * MB)]
            .into_iter()
            .collect();
    assert_eq!(loaded.total, expected);
    assert!(
        loaded
            .total
            .iter()
            .all(|r| r.role.is_none() && r.reservations.len() == 1)
    );
    assert_eq!(loaded.profiles["fast"].parameters["pool"], "fast");
    let ops: BTreeMap<uuid::Uuid, _> = load_operations(&store, AGENT)
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.uuid, o))
        .collect();
    assert_eq!(ops.len(), 4);
    assert!(!ops.contains_key(&forgotten));
    let f = &ops[&finished];
    assert_eq!((f.stream.len(), f.acked), (1, 0));
    assert_eq!(f.stream[0].uuid, done.uuid);
    assert_eq!(f.latest_status.converted_resources, converted);
    let w = &ops[&waiting];
    assert!(
        w.stream.is_empty() && w.latest_status.state == OperationState::OperationPending as i32
    );
    // Statuses the stream lacks are queued again (B.5 item 4), also without a file.
    assert_eq!(ops[&resent].stream.len(), 1);
    assert_eq!(ops[&resent].stream[0].uuid, done3.uuid);
    assert_eq!(ops[&no_stream].stream[0].uuid, done4.uuid);
    let marker: MesosImport = store.get(AGENT).await.unwrap().unwrap();
    assert_eq!(marker.provider_id.as_deref(), Some(RP_ID));
    assert_eq!(marker.operations.len(), 4);
    assert!(marker.rp_state.is_some());
}

#[tokio::test]
async fn statuses_beyond_the_stream_are_queued_after_the_checkpointed_ones() {
    let m = Mesos::new();
    let op = uuid::Uuid::new_v4();
    // A non-terminal status acknowledged, then a terminal one Mesos checkpointed in
    // resource_provider.state but crashed before appending to the stream.
    let first = status(OperationState::OperationRecovering, vec![]);
    let second = status(OperationState::OperationFinished, vec![]);
    let mut state = basic_state();
    state.operations = vec![create_disk(
        &op,
        second.clone(),
        vec![first.clone(), second.clone()],
    )];
    m.provider(Some(&state));
    m.stream(op).update(first.clone()).ack(suuid(&first));
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    let o = &p.operations()[0].op;
    assert_eq!(
        o.stream.iter().map(|s| s.uuid.clone()).collect::<Vec<_>>(),
        vec![first.uuid, second.uuid]
    );
    assert_eq!(o.acked, 1);
    assert_eq!(p.report().operations[0].unacknowledged, 1);
}

#[tokio::test]
async fn without_latest_there_is_no_identity_and_the_volumes_are_still_imported() {
    let m = Mesos::new();
    m.volume("v", &volume_state(State::Created, ""));
    let (_dir, store) = import(&m, false).await;
    assert_eq!(
        slrp_provider::persist::load_state(&store, AGENT)
            .await
            .unwrap(),
        ProviderState::default()
    );
    assert_eq!(volumes(&store).await.len(), 1);
}

#[tokio::test]
async fn latest_without_a_state_file_is_an_empty_total() {
    let m = Mesos::new();
    m.provider(None);
    let (_dir, store) = import(&m, false).await;
    let loaded = slrp_provider::persist::load_state(&store, AGENT)
        .await
        .unwrap();
    assert_eq!(loaded.provider_id.unwrap().value, RP_ID);
    assert!(loaded.total.is_empty());
}

#[tokio::test]
async fn a_pool_without_its_profile_is_refused_with_mesoss_message() {
    let m = Mesos::new();
    let mut state = basic_state();
    state.storage = None;
    let path = m.provider(Some(&state));
    assert_refused(
        &refusals(&m, true),
        &path,
        &[
            "Cannot recover profile for storage pool",
            &path.display().to_string(),
        ],
    );
}

#[tokio::test]
async fn operation_directories_not_a_uuid_are_refused_and_unknown_ones_skipped() {
    let m = Mesos::new();
    m.provider(Some(&basic_state()));
    let ops = m.rp_dir().join(RP_ID).join("operations");
    std::fs::create_dir_all(ops.join("not-a-uuid")).unwrap();
    assert_refused(
        &refusals(&m, true),
        &ops.join("not-a-uuid"),
        &["not a UUID"],
    );
    std::fs::remove_dir(ops.join("not-a-uuid")).unwrap();
    let unknown = uuid::Uuid::new_v4();
    std::fs::create_dir_all(ops.join(unknown.to_string())).unwrap();
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert!(
        p.skipped()
            .iter()
            .any(|s| s.path == ops.join(unknown.to_string()))
    );
    assert!(p.operations().is_empty());
}

#[tokio::test]
async fn unreadable_checkpoints_are_refused_with_file_and_reason_in_both_modes() {
    for lenient in [false, true] {
        let m = Mesos::new();
        let state_path = m.provider(Some(&basic_state()));
        let bytes = std::fs::read(&state_path).unwrap();
        std::fs::write(&state_path, &bytes[..bytes.len() - 3]).unwrap();
        let truncated =
            m.volume_bytes("t", &encode_message(&volume_state(State::Created, ""))[..5]);
        let invalid = m.volume(
            "i",
            &MesosVolume {
                state: 42,
                ..volume_state(State::Created, "")
            },
        );
        let unknown = m.volume("u", &volume_state(State::Unknown, ""));
        let found = refusals(&m, lenient);
        assert_refused(
            &found,
            &state_path,
            &["Failed to read resource provider state"],
        );
        assert_refused(&found, &truncated, &["Failed to read volume state"]);
        assert_refused(&found, &invalid, &["Volume 'i' is in INVALID state"]);
        assert_refused(&found, &unknown, &["Volume 'u' is in UNKNOWN state"]);
        assert_eq!(found.len(), 4, "{found:?}");
    }
}

#[tokio::test]
async fn a_torn_tail_is_refused_strict_and_dropped_lenient() {
    let m = Mesos::new();
    let op = uuid::Uuid::new_v4();
    let done = status(OperationState::OperationFinished, vec![]);
    let mut state = basic_state();
    state.operations = vec![create_disk(&op, done.clone(), vec![done.clone()])];
    m.provider(Some(&state));
    let mut stream = m.stream(op);
    stream.update(done.clone());
    let path = stream.path().to_owned();
    let good = std::fs::read(&path).unwrap().len();
    stream.torn_tail(5);
    assert_refused(
        &refusals(&m, false),
        &path,
        &[
            &format!("offset {good}"),
            "torn",
            "--lenient",
            "Mesos agent does even with --strict",
        ],
    );
    let p = plan(m.root(), &provider(), &opts(true)).unwrap();
    let o = &p.operations()[0];
    assert_eq!((o.op.stream.len(), o.op.acked), (1, 0));
    assert!(o.notes.iter().any(|n| n.contains("torn")), "{:?}", o.notes);
}

#[tokio::test]
async fn a_corrupt_record_is_refused_strict_and_dropped_lenient() {
    let m = Mesos::new();
    let op = uuid::Uuid::new_v4();
    let done = status(OperationState::OperationFinished, vec![]);
    let mut state = basic_state();
    state.operations = vec![create_disk(&op, done.clone(), vec![done.clone()])];
    m.provider(Some(&state));
    // As NonStrictRecoveryCorruptedFile: a whole UpdateOperationStatusMessage appended.
    let mut stream = m.stream(op);
    stream.update(done.clone()).corrupt_record();
    let path = stream.path().to_owned();
    assert_refused(
        &refusals(&m, false),
        &path,
        &["unparseable", "--strict=false"],
    );
    let p = plan(m.root(), &provider(), &opts(true)).unwrap();
    assert_eq!(p.operations()[0].op.stream.len(), 1);
    assert!(p.marker().skipped.iter().any(|s| s.contains("unparseable")));
}

#[tokio::test]
async fn an_ack_of_another_status_is_refused_strict_and_popped_lenient() {
    let m = Mesos::new();
    let op = uuid::Uuid::new_v4();
    let done = status(OperationState::OperationFinished, vec![]);
    let other = status(OperationState::OperationFinished, vec![]);
    let mut state = basic_state();
    state.operations = vec![create_disk(&op, done.clone(), vec![done.clone()])];
    m.provider(Some(&state));
    let mut stream = m.stream(op);
    stream.update(done.clone()).ack(suuid(&other));
    assert_refused(
        &refusals(&m, false),
        stream.path(),
        &["acknowledges status", "without comparing uuids"],
    );
    // Lenient follows Mesos: the head is popped; terminal, so the operation is forgotten.
    let p = plan(m.root(), &provider(), &opts(true)).unwrap();
    assert!(p.operations().is_empty());
}

#[tokio::test]
async fn a_refusal_in_the_last_file_writes_nothing_and_no_mesos_file_changes() {
    let m = Mesos::new();
    m.boot_id("b");
    let op = uuid::Uuid::new_v4();
    let done = status(OperationState::OperationFinished, vec![]);
    let mut state = basic_state();
    state.operations = vec![create_disk(&op, done.clone(), vec![done.clone()])];
    m.provider(Some(&state));
    m.stream(op).update(done.clone()).torn_tail(3);
    m.volume("a", &volume_state(State::Published, "b"));
    m.volume("zz-last", &volume_state(State::Unknown, ""));
    let before = m.snapshot();
    let found = refusals(&m, false);
    // Every refusal, not only the first.
    assert_eq!(found.len(), 2, "{found:?}");
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    assert!(store.load_all::<VolumeRecord>().await.unwrap().is_empty());
    assert!(store.load_all::<MesosImport>().await.unwrap().is_empty());
    assert_eq!(m.snapshot(), before);
    // A successful (lenient, without the bad volume) import modifies nothing of Mesos's
    // either: no truncation of the torn stream.
    std::fs::remove_dir_all(m.volume_path("zz-last").parent().unwrap()).unwrap();
    let before = m.snapshot();
    let p = plan(m.root(), &provider(), &opts(true)).unwrap();
    p.commit(&store).await.unwrap();
    assert_eq!(m.snapshot(), before);
}

#[tokio::test]
async fn a_plan_writes_nothing() {
    let m = Mesos::new();
    m.provider(Some(&basic_state()));
    m.volume("vol-1", &volume_state(State::Published, "b"));
    let before = m.snapshot();
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    let report = p.report();
    assert_eq!(report.volumes_by_state["PUBLISHED"], 1);
    assert_eq!(report.provider_id.as_deref(), Some(RP_ID));
    assert!(report.to_string().contains("vol-1 PUBLISHED"));
    assert_eq!(m.snapshot(), before);
}

#[tokio::test]
async fn a_second_import_is_a_no_op_and_changed_checkpoints_are_refused() {
    let m = Mesos::new();
    m.provider(Some(&basic_state()));
    let path = m.volume("vol-1", &volume_state(State::Published, "b"));
    let (_dir, store) = import(&m, false).await;
    let again = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert!(matches!(
        again.commit(&store).await.unwrap(),
        Committed::AlreadyImported { .. }
    ));
    // A Mesos provider ran again: the volume moved on.
    m.volume("vol-1", &volume_state(State::VolReady, "b"));
    let changed = plan(m.root(), &provider(), &opts(false)).unwrap();
    let err = changed.commit(&store).await.unwrap_err();
    assert!(
        matches!(err, ImportError::Changed { .. }) && err.is_refusal(),
        "{err}"
    );
    assert_eq!(
        volumes(&store).await["vol-1"].state.name(),
        StateName::Published
    );
    assert!(path.exists());
}

#[tokio::test]
async fn an_import_never_merges_into_existing_state() {
    let m = Mesos::new();
    m.volume("v", &volume_state(State::Created, ""));
    let other = Mesos::new();
    other.volume("w", &volume_state(State::Created, ""));
    let (_dir, store) = import(&other, false).await;
    // Another agent id's import left a volume record: no merge.
    std::fs::remove_file(m.root().join("meta/slaves/latest")).unwrap();
    let _ = std::fs::remove_dir_all(m.root().join("meta/slaves").join(AGENT));
    std::fs::create_dir_all(m.root().join("meta/slaves/other-S1")).unwrap();
    std::os::unix::fs::symlink(
        m.root().join("meta/slaves/other-S1"),
        m.root().join("meta/slaves/latest"),
    )
    .unwrap();
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert_eq!(p.agent_id(), "other-S1");
    let err = p.commit(&store).await.unwrap_err();
    assert!(
        matches!(&err, ImportError::Merge { found, .. } if found.contains("1 volume records")),
        "{err}"
    );
    assert!(err.is_refusal());
    assert_eq!(volumes(&store).await.len(), 1);
}

#[tokio::test]
async fn the_agent_id_given_must_be_the_work_dirs() {
    let m = Mesos::new();
    let mut o = opts(false);
    o.agent_id = Some("other-S9".into());
    let found = plan(m.root(), &provider(), &o).unwrap_err();
    assert_refused(
        &found,
        &m.root().join("meta/slaves/latest"),
        &["other-S9", AGENT],
    );
    // No `latest`: the given id is used.
    let m = Mesos::new();
    std::fs::remove_file(m.root().join("meta/slaves/latest")).unwrap();
    assert!(plan(m.root(), &provider(), &opts(false)).is_err());
    let mut o = opts(false);
    o.agent_id = Some(AGENT.into());
    assert_eq!(plan(m.root(), &provider(), &o).unwrap().agent_id(), AGENT);
}

#[tokio::test]
async fn a_store_held_by_a_running_slrp_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let _held = Store::open(dir.path()).unwrap();
    let err = open_store(dir.path()).unwrap_err();
    assert!(
        matches!(err, ImportError::Busy { .. }) && err.is_refusal(),
        "{err}"
    );
    assert!(err.to_string().contains("slrp run"), "{err}");
}

#[tokio::test]
async fn mkstemp_leftovers_of_interrupted_checkpoints_are_ignored() {
    let m = Mesos::new();
    let state = m.provider(Some(&basic_state()));
    let volume = m.volume("vol-1", &volume_state(State::Published, "b"));
    m.w.temp_leftover(state.parent().unwrap());
    m.w.temp_leftover(volume.parent().unwrap());
    let p = plan(m.root(), &provider(), &opts(false)).unwrap();
    assert_eq!(p.volumes().len(), 1);
    assert_eq!(p.state().unwrap().total.len(), 2);
}
