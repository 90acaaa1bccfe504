//! CSI plugin answers into the volume manager: a scripted plugin ([`CsiVolumes`]) whose
//! every answer (volume ids, contexts, capacities, pagination tokens, validation
//! verdicts, error codes) comes from the input, under a real [`VolumeManager`] on a
//! scratch store, driven by a sequence of requests also taken from the input.
//!
//! Input: one byte stream read by both sides in turn: the driver takes a request byte
//! (create, list all, capacity, validate, publish, unpublish, delete, with a volume
//! picked among those known), the plugin takes what each call it receives answers.
//! When the input runs out, the plugin answers with empty successes.
//!
//! Properties:
//! - the manager answers every request with a value or a typed [`VolumeError`], never a
//!   panic or a hang;
//! - a CreateVolume that fails with the plugin's refusal (an RPC error), or whose answer
//!   the manager rejects, leaves no record and no intent under its name; one that
//!   succeeds leaves a record whose id maps to exactly one directory under the mount root;
//! - every record the manager holds has such an id, and after a stop the store holds
//!   exactly what the manager last reported.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_core::volume::{
    BootId, CreateVolume, MountPaths, MountTable, TargetPath, ValidateVolume, VolumeError,
    VolumeManager, VolumeManagerConfig, VolumeRecord,
};
use slrp_csi::{
    Capacity, Code, Confirmed, ControllerPublishRequest, CreateVolumeRequest, CsiCapabilities,
    CsiError, CsiRpc, CsiVolumes, NodePublishRequest, NodeStageRequest, RetryConfig, Secrets,
    StringMap, ValidateRequest, Validation, Volume, VolumeCapability, VolumeId, VolumePage,
};
use slrp_store::Store;
use tokio_util::sync::CancellationToken;

use crate::util::{byte, inside, runtime, scratch, take};

/// The plugin's script: the rest of the input.
#[derive(Debug)]
struct Script(Mutex<Vec<u8>>);

impl Script {
    fn with<T>(&self, f: impl FnOnce(&mut &[u8]) -> T) -> T {
        let mut bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut view: &[u8] = &bytes;
        let out = f(&mut view);
        let used = bytes.len() - view.len();
        bytes.drain(..used);
        out
    }
}

fn string(d: &mut &[u8]) -> String {
    let len = usize::from(byte(d));
    String::from_utf8_lossy(take(d, len)).into_owned()
}

fn int(d: &mut &[u8]) -> i64 {
    let mut b = [0u8; 8];
    let got = take(d, 8);
    b[..got.len()].copy_from_slice(got);
    i64::from_le_bytes(b)
}

fn map(d: &mut &[u8]) -> StringMap {
    (0..byte(d) % 4).map(|_| (string(d), string(d))).collect()
}

/// A refusal, when the answer's first byte says so (its high bit).
fn refusal(d: &mut &[u8], rpc: CsiRpc) -> Result<(), CsiError> {
    let b = byte(d);
    if b & 0x80 == 0 {
        return Ok(());
    }
    let code = Code::from_i32(i32::from(b & 0x0f) + 1);
    Err(CsiError::status(rpc, code, "scripted"))
}

fn volume(d: &mut &[u8]) -> Volume {
    Volume {
        volume_id: VolumeId::new(string(d)),
        capacity_bytes: int(d),
        volume_context: map(d),
    }
}

impl CsiVolumes for Script {
    async fn create_volume(&self, _req: &CreateVolumeRequest) -> Result<Volume, CsiError> {
        self.with(|d| {
            refusal(d, CsiRpc::CreateVolume)?;
            Ok(volume(d))
        })
    }
    async fn delete_volume(&self, _id: &VolumeId, _s: &Secrets) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::DeleteVolume))
    }
    async fn validate(&self, req: &ValidateRequest) -> Result<Validation, CsiError> {
        let req = req.clone();
        self.with(move |d| {
            refusal(d, CsiRpc::ValidateVolumeCapabilities)?;
            let how = byte(d);
            let confirmed = how & 1 == 1;
            // Bit 1: confirm what was asked; else what the script says.
            let confirmed_fields = (confirmed && how & 4 == 0).then(|| {
                if how & 2 == 2 {
                    Confirmed {
                        volume_context: req.volume_context.clone(),
                        capabilities: req.capabilities.clone(),
                        parameters: req.parameters.clone(),
                    }
                } else {
                    Confirmed {
                        volume_context: map(d),
                        capabilities: vec![VolumeCapability::mount_default()],
                        parameters: map(d),
                    }
                }
            });
            Ok(Validation {
                confirmed,
                message: string(d),
                confirmed_fields,
            })
        })
    }
    async fn list_volumes_page(
        &self,
        _max_entries: i32,
        _token: Option<&str>,
    ) -> Result<VolumePage, CsiError> {
        self.with(|d| {
            refusal(d, CsiRpc::ListVolumes)?;
            let volumes = (0..byte(d) % 4).map(|_| volume(d)).collect();
            let token = string(d);
            Ok(VolumePage {
                volumes,
                next_token: (!token.is_empty()).then_some(token),
            })
        })
    }
    async fn capacity(
        &self,
        _c: &[VolumeCapability],
        _p: &StringMap,
    ) -> Result<Capacity, CsiError> {
        self.with(|d| {
            refusal(d, CsiRpc::GetCapacity)?;
            let available_bytes = int(d);
            let max = int(d);
            Ok(Capacity {
                available_bytes,
                maximum_volume_size: (max != 0).then_some(max),
            })
        })
    }
    async fn controller_publish(
        &self,
        _r: &ControllerPublishRequest,
    ) -> Result<StringMap, CsiError> {
        self.with(|d| {
            refusal(d, CsiRpc::ControllerPublishVolume)?;
            Ok(map(d))
        })
    }
    async fn controller_unpublish(&self, _id: &VolumeId, _n: &str) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::ControllerUnpublishVolume))
    }
    async fn node_stage(&self, _r: &NodeStageRequest) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::NodeStageVolume))
    }
    async fn node_unstage(&self, _id: &VolumeId, _p: &str) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::NodeUnstageVolume))
    }
    async fn node_publish(&self, _r: &NodePublishRequest) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::NodePublishVolume))
    }
    async fn node_unpublish(&self, _id: &VolumeId, _p: &str) -> Result<(), CsiError> {
        self.with(|d| refusal(d, CsiRpc::NodeUnpublishVolume))
    }
}

/// Nothing is mounted (the scripted plugin mounts nothing).
#[derive(Debug)]
struct NoMounts;

impl MountTable for NoMounts {
    fn mounts_under(&self, _dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(Vec::new())
    }
}

fn caps() -> CsiCapabilities {
    let mut c = CsiCapabilities::with_publish_stage(true, true);
    c.plugin.controller_service = true;
    c.controller.create_delete_volume = true;
    c.controller.list_volumes = true;
    c.controller.get_capacity = true;
    c
}

fn check_record(paths: &MountPaths, rec: &VolumeRecord) {
    let dir = paths
        .volume_dir(&rec.id)
        .unwrap_or_else(|e| panic!("record {:?} has no volume directory: {e}", rec.id));
    assert!(
        inside(paths.root(), &dir) && dir.parent() == Some(paths.root()),
        "volume {:?} maps to {} outside {}",
        rec.id,
        dir.display(),
        paths.root().display()
    );
}

/// The target.
pub fn run(data: &[u8]) {
    let Some((&first, _)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let paths = MountPaths::under_work_dir(&dir.path().join("work"), "org.fuzz", "script")
        .expect("fixed plugin names are path components");
    let config = VolumeManagerConfig::new(
        paths.clone(),
        "node-1",
        caps(),
        BootId::new("boot-1"),
        if first & 1 == 1 {
            TargetPath::CoCreates
        } else {
            TargetPath::PluginCreates
        },
    )
    .plugin("org.fuzz", "script", slrp_csi::CsiVersion::V1)
    .retry(RetryConfig::none())
    .shutdown_grace(Duration::from_secs(5))
    .mounts(Arc::new(NoMounts));
    let script = Arc::new(Script(Mutex::new(data[1..].to_vec())));
    let state = dir.path().join("state");
    runtime().block_on(async {
        let store = Store::open(&state).expect("opening the scratch store");
        let (handle, guard) =
            VolumeManager::spawn(config, store, script.clone(), &CancellationToken::new())
                .expect("the fixed config is valid");
        if handle.ready().await.is_err() {
            let _ = guard.stop().await;
            return;
        }
        let mut known: Vec<VolumeId> = Vec::new();
        for _ in 0..8 {
            let op = script.with(byte);
            let pick = |k: &[VolumeId], i: u8| {
                k.get(usize::from(i) % k.len().max(1))
                    .cloned()
                    .unwrap_or_else(|| VolumeId::new("unknown"))
            };
            let which = op >> 4;
            match op % 8 {
                0 => {
                    let name = format!("op-{}", which % 4);
                    let req = CreateVolume {
                        name: name.clone(),
                        required_bytes: 1 << 20,
                        limit_bytes: 0,
                        capability: VolumeCapability::mount_default(),
                        parameters: StringMap::new(),
                        content_source: None,
                    };
                    let result = handle.create(req).await;
                    let records = handle.volumes().await.unwrap_or_default();
                    match &result {
                        Ok(info) => {
                            let rec = records
                                .iter()
                                .find(|r| r.id == info.id)
                                .unwrap_or_else(|| panic!("created {:?} has no record", info.id));
                            check_record(&paths, rec);
                            known.push(info.id.clone());
                        }
                        Err(e) if refused_create(e) => {
                            let named: Vec<_> = records
                                .iter()
                                .filter(|r| r.name.as_deref() == Some(&name))
                                .collect();
                            // A refusal may answer for an earlier, tracked creation.
                            let earlier = known.iter().any(|id| named.iter().any(|r| &r.id == id));
                            assert!(
                                named.is_empty() || earlier,
                                "refused CreateVolume {name} left a record: {e:?}"
                            );
                        }
                        Err(_) => {}
                    }
                }
                1 => {
                    if let Ok(listed) = handle.list_all(i32::from(which)).await {
                        known.extend(listed.into_iter().map(|v| v.volume_id));
                    }
                }
                2 => {
                    let _ = handle
                        .capacity(VolumeCapability::mount_default(), StringMap::new())
                        .await;
                }
                3 => {
                    let id = pick(&known, which);
                    let _ = handle
                        .validate(ValidateVolume {
                            id,
                            capability: VolumeCapability::mount_default(),
                            parameters: StringMap::new(),
                            volume_context: StringMap::new(),
                            capacity_bytes: 4096,
                            node_stage_secrets: Default::default(),
                            node_publish_secrets: Default::default(),
                        })
                        .await;
                }
                4 => {
                    if let Ok(target) = handle.publish(&pick(&known, which)).await {
                        assert!(
                            inside(paths.root(), &target),
                            "published at {} outside the mount root",
                            target.display()
                        );
                    }
                }
                5 => {
                    let _ = handle.unpublish(&pick(&known, which)).await;
                }
                6 => {
                    let _ = handle.delete(&pick(&known, which)).await;
                }
                _ => {}
            }
        }
        let records = handle.volumes().await.unwrap_or_default();
        for rec in &records {
            check_record(&paths, rec);
        }
        drop(handle);
        let _ = guard.stop().await;
        let store = Store::open_read_only(&state).expect("reopening the scratch store");
        let mut stored: Vec<VolumeRecord> = store.load_all().await.expect("reading records");
        stored.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        let mut held = records;
        held.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        assert_eq!(
            stored.iter().map(|r| &r.id).collect::<Vec<_>>(),
            held.iter().map(|r| &r.id).collect::<Vec<_>>(),
            "the store and the manager disagree on the volumes"
        );
        let intents: Vec<CreateVolume> = store.load_all().await.expect("reading intents");
        for intent in intents {
            assert!(
                stored
                    .iter()
                    .all(|r| r.name.as_deref() != Some(&intent.name)),
                "intent {} beside its volume's record",
                intent.name
            );
        }
    });
}

/// Whether a CreateVolume failed on the plugin's refusal or on its answer (nothing that
/// may have created the volume).
fn refused_create(e: &VolumeError) -> bool {
    match e {
        VolumeError::Csi { source, .. } => {
            matches!(source, CsiError::Rpc { .. }) && !source.may_have_taken_effect()
        }
        _ => false,
    }
}
