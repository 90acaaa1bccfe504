//! Test support for the volume manager: [`FakeCsi`], an in-memory CSI plugin that checks
//! its callers like a real one, and [`Harness`], a manager on a temporary state directory
//! that can be crashed and restarted.

// Test-only helper module: panicking on setup failures is the point.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::{
    Capacity, Code, ControllerPublishRequest, CreateVolumeRequest, CsiError, CsiRpc, CsiVolumes,
    NodePublishRequest, NodeStageRequest, Secrets, ValidateRequest, Validation, Volume, VolumePage,
};
use slrp_store::Store;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One volume as the fake plugin knows it.
#[derive(Debug, Clone, Default)]
pub struct FakeVolume {
    pub name: String,
    pub capacity: i64,
    pub controller_published: bool,
    pub staged: Option<String>,
    pub published: Option<(String, bool)>,
}

/// A scripted failure.
#[derive(Debug, Clone)]
pub struct Fault {
    pub rpc: CsiRpc,
    pub code: Code,
    /// Fail after applying the effect (the reply is lost), not before.
    pub after_effect: bool,
    pub times: usize,
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub volumes: BTreeMap<VolumeId, FakeVolume>,
    pub by_name: HashMap<String, VolumeId>,
    /// CreateVolume calls that created a new volume.
    pub created: usize,
    pub next_id: usize,
    pub calls: HashMap<CsiRpc, usize>,
    pub faults: Vec<Fault>,
    /// Secrets seen by NodeStage/NodePublish, per volume.
    pub secrets_seen: Vec<(VolumeId, CsiRpc, StringMap)>,
    /// Calls running per volume, and the most ever seen at once (per volume / overall).
    pub running: HashMap<VolumeId, usize>,
    pub overlap_on_one_volume: bool,
    pub running_total: usize,
    pub max_running_total: usize,
    /// Mount points that exist (staging and target paths).
    pub mounted: HashSet<PathBuf>,
    /// Behave like a CSI 0.x plugin: the CO creates the target path (NodePublish
    /// requires it) and NodeUnpublish leaves it. Otherwise (v1) NodePublish creates the
    /// target directory and NodeUnpublish removes it.
    pub co_creates_target: bool,
    /// A broken plugin: NodePublish succeeds without creating the target (v1 mode).
    pub forget_target: bool,
    /// A broken plugin: NodeUnpublish succeeds but leaves the target (v1 mode).
    pub leave_target: bool,
}

/// The in-memory plugin.
#[derive(Debug)]
pub struct FakeCsi {
    pub caps: CsiCapabilities,
    pub state: Mutex<FakeState>,
    /// Every call takes this long (paused time makes it free).
    pub delay: Mutex<Duration>,
    /// Calls for these volumes wait until [`FakeCsi::release`].
    pub held: Mutex<HashSet<VolumeId>>,
    /// CreateVolume calls with these names create the volume, then wait with the answer
    /// until [`FakeCsi::unhold_create`]: the plugin-side volume exists, the manager does
    /// not know its id yet.
    pub held_creates: Mutex<HashSet<String>>,
    pub release: Notify,
    pub total_bytes: i64,
}

impl FakeCsi {
    pub fn new(caps: CsiCapabilities) -> Arc<Self> {
        Arc::new(Self {
            caps,
            state: Mutex::new(FakeState::default()),
            delay: Mutex::new(Duration::ZERO),
            held: Mutex::new(HashSet::new()),
            held_creates: Mutex::new(HashSet::new()),
            release: Notify::new(),
            total_bytes: 1 << 40,
        })
    }

    /// A plugin with every capability the manager uses.
    pub fn full() -> Arc<Self> {
        Self::new(full_caps())
    }

    pub fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    pub fn calls(&self, rpc: CsiRpc) -> usize {
        self.st().calls.get(&rpc).copied().unwrap_or(0)
    }

    pub fn total_calls(&self) -> usize {
        self.st().calls.values().sum()
    }

    pub fn fail(&self, rpc: CsiRpc, code: Code, times: usize) {
        self.st().faults.push(Fault {
            rpc,
            code,
            after_effect: false,
            times,
        });
    }

    pub fn fail_after_effect(&self, rpc: CsiRpc, code: Code, times: usize) {
        self.st().faults.push(Fault {
            rpc,
            code,
            after_effect: true,
            times,
        });
    }

    pub fn hold(&self, id: &VolumeId) {
        self.held.lock().unwrap().insert(id.clone());
    }

    pub fn unhold(&self, id: &VolumeId) {
        self.held.lock().unwrap().remove(id);
        self.release.notify_waiters();
    }

    pub fn hold_create(&self, name: &str) {
        self.held_creates.lock().unwrap().insert(name.to_owned());
    }

    pub fn unhold_create(&self, name: &str) {
        self.held_creates.lock().unwrap().remove(name);
        self.release.notify_waiters();
    }

    /// The id the plugin gave the volume named `name`, once it exists.
    pub fn id_of(&self, name: &str) -> Option<VolumeId> {
        self.st().by_name.get(name).cloned()
    }

    pub fn set_delay(&self, d: Duration) {
        *self.delay.lock().unwrap() = d;
    }

    /// A reboot of the node: every mount is gone; the plugin's node-side state with it.
    pub fn reboot(&self) {
        let mut st = self.st();
        st.mounted.clear();
        for v in st.volumes.values_mut() {
            v.staged = None;
            v.published = None;
        }
    }

    pub fn ids(&self) -> Vec<VolumeId> {
        self.st().volumes.keys().cloned().collect()
    }

    pub fn volume(&self, id: &VolumeId) -> Option<FakeVolume> {
        self.st().volumes.get(id).cloned()
    }

    /// Bookkeeping around one call on `vol`: concurrency counters, delay, hold.
    async fn enter<T>(
        &self,
        rpc: CsiRpc,
        vol: Option<&VolumeId>,
        f: impl FnOnce(&mut FakeState) -> Result<T, CsiError>,
    ) -> Result<T, CsiError> {
        {
            let mut st = self.st();
            *st.calls.entry(rpc).or_default() += 1;
            st.running_total += 1;
            st.max_running_total = st.max_running_total.max(st.running_total);
            if let Some(v) = vol {
                let n = st.running.entry(v.clone()).or_default();
                *n += 1;
                if *n > 1 {
                    st.overlap_on_one_volume = true;
                }
            }
        }
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if let Some(v) = vol {
            loop {
                let notified = self.release.notified();
                if !self.held.lock().unwrap().contains(v) {
                    break;
                }
                notified.await;
            }
        }
        let mut st = self.st();
        st.running_total -= 1;
        if let Some(v) = vol {
            *st.running.get_mut(v).unwrap() -= 1;
        }
        // Scripted faults: before or after the effect.
        let fault = st
            .faults
            .iter_mut()
            .find(|f| f.rpc == rpc && f.times > 0)
            .map(|f| {
                f.times -= 1;
                (f.code, f.after_effect)
            });
        match fault {
            Some((code, false)) => Err(CsiError::status(rpc, code, "injected")),
            Some((code, true)) => {
                // The effect happens, the answer is lost.
                let _ = f(&mut st);
                Err(CsiError::status(rpc, code, "injected after effect"))
            }
            None => f(&mut st),
        }
    }
}

fn err(rpc: CsiRpc, code: Code, msg: &str) -> CsiError {
    CsiError::status(rpc, code, msg)
}

pub fn full_caps() -> CsiCapabilities {
    let mut c = CsiCapabilities::with_publish_stage(true, true);
    c.plugin.controller_service = true;
    c.controller.create_delete_volume = true;
    c.controller.list_volumes = true;
    c.controller.get_capacity = true;
    c
}

impl CsiVolumes for FakeCsi {
    fn create_volume(
        &self,
        req: &CreateVolumeRequest,
    ) -> impl Future<Output = Result<Volume, CsiError>> + Send {
        let req = req.clone();
        let name = req.name.clone();
        async move {
            let answer = self
                .enter(CsiRpc::CreateVolume, None, move |st| {
                    if req.name.is_empty() {
                        return Err(err(CsiRpc::CreateVolume, Code::InvalidArgument, "no name"));
                    }
                    if req.parameters.contains_key("refuse") {
                        return Err(err(CsiRpc::CreateVolume, Code::OutOfRange, "refused"));
                    }
                    let id = match st.by_name.get(&req.name) {
                        Some(id) => id.clone(),
                        None => {
                            st.next_id += 1;
                            st.created += 1;
                            let id = VolumeId::new(format!("vol-{}", st.next_id));
                            st.by_name.insert(req.name.clone(), id.clone());
                            st.volumes.insert(
                                id.clone(),
                                FakeVolume {
                                    name: req.name.clone(),
                                    capacity: req.required_bytes,
                                    ..FakeVolume::default()
                                },
                            );
                            id
                        }
                    };
                    let v = &st.volumes[&id];
                    Ok(Volume {
                        volume_id: id.clone(),
                        capacity_bytes: v.capacity,
                        volume_context: BTreeMap::from([("name".into(), v.name.clone())]),
                    })
                })
                .await;
            loop {
                let notified = self.release.notified();
                if !self.held_creates.lock().unwrap().contains(&name) {
                    break;
                }
                notified.await;
            }
            answer
        }
    }

    fn delete_volume(
        &self,
        id: &VolumeId,
        _secrets: &Secrets,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let id = id.clone();
        async move {
            self.enter(CsiRpc::DeleteVolume, Some(&id.clone()), move |st| {
                let Some(v) = st.volumes.get(&id) else {
                    return Ok(());
                };
                if v.controller_published || v.staged.is_some() || v.published.is_some() {
                    return Err(err(
                        CsiRpc::DeleteVolume,
                        Code::FailedPrecondition,
                        "in use",
                    ));
                }
                let v = st.volumes.remove(&id).unwrap();
                st.by_name.remove(&v.name);
                Ok(())
            })
            .await
        }
    }

    fn validate(
        &self,
        req: &ValidateRequest,
    ) -> impl Future<Output = Result<Validation, CsiError>> + Send {
        let req = req.clone();
        async move {
            let id = req.volume_id.clone();
            self.enter(CsiRpc::ValidateVolumeCapabilities, Some(&id), move |st| {
                if !st.volumes.contains_key(&req.volume_id) {
                    return Err(err(
                        CsiRpc::ValidateVolumeCapabilities,
                        Code::NotFound,
                        "no",
                    ));
                }
                let confirmed = !req.parameters.contains_key("unsupported");
                Ok(Validation {
                    confirmed,
                    message: if confirmed {
                        String::new()
                    } else {
                        "nope".into()
                    },
                })
            })
            .await
        }
    }

    fn list_volumes_page(
        &self,
        max_entries: i32,
        starting_token: Option<&str>,
    ) -> impl Future<Output = Result<VolumePage, CsiError>> + Send {
        let token = starting_token.map(str::to_owned);
        async move {
            self.enter(CsiRpc::ListVolumes, None, move |st| {
                let start: usize = match &token {
                    None => 0,
                    Some(t) => t
                        .parse()
                        .map_err(|_| err(CsiRpc::ListVolumes, Code::Aborted, "bad token"))?,
                };
                let all: Vec<_> = st.volumes.iter().collect();
                let n = if max_entries <= 0 {
                    all.len()
                } else {
                    max_entries as usize
                };
                let page: Vec<Volume> = all
                    .iter()
                    .skip(start)
                    .take(n)
                    .map(|(id, v)| Volume {
                        volume_id: (*id).clone(),
                        capacity_bytes: v.capacity,
                        volume_context: BTreeMap::new(),
                    })
                    .collect();
                let next = start + page.len();
                Ok(VolumePage {
                    volumes: page,
                    next_token: (next < all.len()).then(|| next.to_string()),
                })
            })
            .await
        }
    }

    fn capacity(
        &self,
        _capabilities: &[VolumeCapability],
        parameters: &StringMap,
    ) -> impl Future<Output = Result<Capacity, CsiError>> + Send {
        let pool_known = !parameters.contains_key("pool") || parameters["pool"] == "default";
        async move {
            self.enter(CsiRpc::GetCapacity, None, move |st| {
                let used: i64 = st.volumes.values().map(|v| v.capacity).sum();
                Ok(Capacity {
                    available_bytes: if pool_known {
                        self.total_bytes - used
                    } else {
                        0
                    },
                    maximum_volume_size: None,
                })
            })
            .await
        }
    }

    fn controller_publish(
        &self,
        req: &ControllerPublishRequest,
    ) -> impl Future<Output = Result<StringMap, CsiError>> + Send {
        let req = req.clone();
        let has = self.caps.controller_publish();
        async move {
            let id = req.volume_id.clone();
            self.enter(CsiRpc::ControllerPublishVolume, Some(&id), move |st| {
                if !has {
                    return Err(err(
                        CsiRpc::ControllerPublishVolume,
                        Code::Unimplemented,
                        "",
                    ));
                }
                let v = st.volumes.get_mut(&req.volume_id).ok_or_else(|| {
                    err(CsiRpc::ControllerPublishVolume, Code::NotFound, "unknown")
                })?;
                v.controller_published = true;
                Ok(BTreeMap::from([(
                    "device".into(),
                    format!("/dev/fake/{}", req.volume_id),
                )]))
            })
            .await
        }
    }

    fn controller_unpublish(
        &self,
        id: &VolumeId,
        _node_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let id = id.clone();
        let has = self.caps.controller_publish();
        async move {
            self.enter(
                CsiRpc::ControllerUnpublishVolume,
                Some(&id.clone()),
                move |st| {
                    if !has {
                        return Err(err(
                            CsiRpc::ControllerUnpublishVolume,
                            Code::Unimplemented,
                            "",
                        ));
                    }
                    let v = st.volumes.get_mut(&id).ok_or_else(|| {
                        err(CsiRpc::ControllerUnpublishVolume, Code::NotFound, "unknown")
                    })?;
                    if v.staged.is_some() {
                        return Err(err(
                            CsiRpc::ControllerUnpublishVolume,
                            Code::FailedPrecondition,
                            "staged",
                        ));
                    }
                    v.controller_published = false;
                    Ok(())
                },
            )
            .await
        }
    }

    fn node_stage(
        &self,
        req: &NodeStageRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let req = req.clone();
        let caps = self.caps;
        async move {
            let id = req.volume_id.clone();
            self.enter(CsiRpc::NodeStageVolume, Some(&id), move |st| {
                let rpc = CsiRpc::NodeStageVolume;
                if !caps.node_stage() {
                    return Err(err(rpc, Code::Unimplemented, ""));
                }
                if !Path::new(&req.staging_target_path).is_dir() {
                    return Err(err(rpc, Code::InvalidArgument, "staging path missing"));
                }
                st.secrets_seen
                    .push((req.volume_id.clone(), rpc, req.secrets.expose().clone()));
                let v = st
                    .volumes
                    .get_mut(&req.volume_id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                if caps.controller_publish()
                    && (!v.controller_published
                        || req.publish_context.get("device")
                            != Some(&format!("/dev/fake/{}", req.volume_id)))
                {
                    return Err(err(rpc, Code::FailedPrecondition, "not attached"));
                }
                match &v.staged {
                    Some(p) if p != &req.staging_target_path => {
                        return Err(err(rpc, Code::FailedPrecondition, "staged elsewhere"));
                    }
                    Some(_) | None => {}
                }
                v.staged = Some(req.staging_target_path.clone());
                st.mounted.insert(PathBuf::from(&req.staging_target_path));
                Ok(())
            })
            .await
        }
    }

    fn node_unstage(
        &self,
        id: &VolumeId,
        staging_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let id = id.clone();
        let path = staging_path.to_owned();
        let caps = self.caps;
        async move {
            self.enter(CsiRpc::NodeUnstageVolume, Some(&id.clone()), move |st| {
                let rpc = CsiRpc::NodeUnstageVolume;
                if !caps.node_stage() {
                    return Err(err(rpc, Code::Unimplemented, ""));
                }
                let v = st
                    .volumes
                    .get_mut(&id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                if v.published.is_some() {
                    return Err(err(rpc, Code::FailedPrecondition, "published"));
                }
                v.staged = None;
                st.mounted.remove(Path::new(&path));
                Ok(())
            })
            .await
        }
    }

    fn node_publish(
        &self,
        req: &NodePublishRequest,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let req = req.clone();
        let caps = self.caps;
        async move {
            let id = req.volume_id.clone();
            self.enter(CsiRpc::NodePublishVolume, Some(&id), move |st| {
                let rpc = CsiRpc::NodePublishVolume;
                let parent_ok = Path::new(&req.target_path)
                    .parent()
                    .is_some_and(Path::is_dir);
                if !parent_ok {
                    return Err(err(rpc, Code::InvalidArgument, "target parent missing"));
                }
                st.secrets_seen
                    .push((req.volume_id.clone(), rpc, req.secrets.expose().clone()));
                let v = st
                    .volumes
                    .get_mut(&req.volume_id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                if caps.node_stage() {
                    if req.staging_target_path.is_none()
                        || v.staged.as_deref() != req.staging_target_path.as_deref()
                    {
                        return Err(err(rpc, Code::FailedPrecondition, "not staged there"));
                    }
                } else {
                    if req.staging_target_path.is_some() {
                        return Err(err(rpc, Code::InvalidArgument, "unexpected staging path"));
                    }
                    if caps.controller_publish() && !v.controller_published {
                        return Err(err(rpc, Code::FailedPrecondition, "not attached"));
                    }
                }
                match &v.published {
                    Some((t, ro)) if t != &req.target_path || *ro != req.readonly => {
                        return Err(err(rpc, Code::AlreadyExists, "published differently"));
                    }
                    Some(_) | None => {}
                }
                let target = PathBuf::from(&req.target_path);
                if st.co_creates_target {
                    if !target.is_dir() {
                        return Err(err(rpc, Code::InvalidArgument, "target missing"));
                    }
                } else if !st.forget_target {
                    std::fs::create_dir_all(&target)
                        .map_err(|e| err(rpc, Code::Internal, &e.to_string()))?;
                }
                let v = st.volumes.get_mut(&req.volume_id).unwrap();
                v.published = Some((req.target_path.clone(), req.readonly));
                st.mounted.insert(target);
                Ok(())
            })
            .await
        }
    }

    fn node_unpublish(
        &self,
        id: &VolumeId,
        target_path: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let id = id.clone();
        let path = target_path.to_owned();
        async move {
            self.enter(CsiRpc::NodeUnpublishVolume, Some(&id.clone()), move |st| {
                let rpc = CsiRpc::NodeUnpublishVolume;
                st.mounted.remove(Path::new(&path));
                if !st.co_creates_target && !st.leave_target {
                    match std::fs::remove_dir(&path) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(err(rpc, Code::Internal, &e.to_string()));
                        }
                        Ok(()) | Err(_) => {}
                    }
                }
                let v = st
                    .volumes
                    .get_mut(&id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                v.published = None;
                Ok(())
            })
            .await
        }
    }
}

/// The fake's mounts as the manager's mount table.
#[derive(Debug, Clone)]
pub struct FakeMounts(pub Arc<FakeCsi>);

impl MountTable for FakeMounts {
    fn mounts_under(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(self
            .0
            .st()
            .mounted
            .iter()
            .filter(|p| p.starts_with(dir))
            .cloned()
            .collect())
    }
}

/// A manager on a temporary state directory, over a shared fake plugin.
pub struct Harness {
    pub dir: tempfile::TempDir,
    pub fake: Arc<FakeCsi>,
    pub boot: BootId,
    pub max_concurrent: usize,
    pub secrets: Arc<dyn SecretResolver>,
}

pub struct Running {
    pub handle: VolumeManagerHandle,
    pub guard: VolumeManagerGuard,
}

impl Running {
    /// Orderly stop; returns the worker's result.
    pub async fn stop(self) -> Result<(), VolumeError> {
        self.guard.stop().await
    }

    /// Waits for the worker to die (after a fatal fail point); returns its result.
    pub async fn died(self) -> Result<(), VolumeError> {
        let r = tokio::time::timeout(Duration::from_secs(60), self.guard.join())
            .await
            .expect("manager did not stop");
        drop(self.handle);
        r
    }
}

impl Harness {
    pub fn new(fake: Arc<FakeCsi>) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            fake,
            boot: BootId::new("boot-1"),
            max_concurrent: 16,
            secrets: Arc::new(NoSecrets),
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    pub fn paths(&self) -> MountPaths {
        MountPaths::under_work_dir(&self.work_dir(), "org.test", "fake").unwrap()
    }

    pub fn config(&self) -> VolumeManagerConfig {
        let target = if self.fake.st().co_creates_target {
            TargetPath::CoCreates
        } else {
            TargetPath::PluginCreates
        };
        VolumeManagerConfig::new(
            self.paths(),
            "node-1",
            self.fake.caps,
            self.boot.clone(),
            target,
        )
        .plugin("org.test", "fake", slrp_csi::CsiVersion::V1)
        // Tests script transient failures and expect to hear them; the retry tests
        // set their own policy.
        .retry(slrp_csi::RetryConfig::none())
        .max_concurrent(self.max_concurrent)
        .shutdown_grace(Duration::from_secs(5))
        .mounts(Arc::new(FakeMounts(self.fake.clone())))
        .secrets(self.secrets.clone())
    }

    pub fn start(&self) -> Running {
        self.start_with(self.config())
    }

    pub fn start_with(&self, cfg: VolumeManagerConfig) -> Running {
        let store = Store::open(self.state_dir()).unwrap();
        let (handle, guard) =
            VolumeManager::spawn(cfg, store, self.fake.clone(), &CancellationToken::new()).unwrap();
        Running { handle, guard }
    }

    /// The records on disk (the manager must be stopped).
    pub fn stored(&self) -> Vec<VolumeRecord> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }

    pub fn stored_intents(&self) -> Vec<CreateVolume> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }
}

pub fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount_default()
}

pub fn create_req(name: &str) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        required_bytes: 1 << 20,
        limit_bytes: 0,
        capability: mount_cap(),
        parameters: StringMap::new(),
    }
}

/// A ValidateVolume for a volume listed by the plugin (mount, no parameters).
pub fn validate_req(id: &VolumeId) -> ValidateVolume {
    ValidateVolume {
        id: id.clone(),
        capability: mount_cap(),
        parameters: StringMap::new(),
        volume_context: BTreeMap::from([("from".into(), "list".into())]),
        capacity_bytes: 4096,
        node_stage_secrets: BTreeMap::new(),
        node_publish_secrets: BTreeMap::new(),
    }
}

/// Polls the manager's job counts until `want` holds or `escape` does (a call reached
/// the plugin that should have waited); returns the counts seen last.
pub async fn jobs_until(
    handle: &VolumeManagerHandle,
    want: impl Fn(&JobCounts) -> bool,
    escape: impl Fn() -> bool,
) -> JobCounts {
    within(async {
        loop {
            let jobs = handle.jobs().await.unwrap();
            if want(&jobs) || escape() {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Waits until the worker has stopped taking commands (it is shutting down).
pub async fn wait_until_not_accepting(handle: &VolumeManagerHandle) {
    within(async {
        while !matches!(handle.volumes().await, Err(VolumeError::Stopped)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Polls until `cond` holds (a hang guard, not a deadline: see [`within`]).
pub async fn until(mut cond: impl FnMut() -> bool) {
    within(async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Fails the test if `f` does not finish within a minute (a hang, not a slow run).
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("timed out")
}
