//! [`FakeCsi`]: an in-memory CSI plugin that checks its callers like a real one (feature
//! `volume`), with scripted faults, held calls and concurrency counters, and
//! [`FakeMounts`], its mounts as a volume manager's mount table.
//!
//! A fake only does what a test scripts and what CSI requires; anything else answers the
//! gRPC error a strict plugin would, so a manager bug shows as a failed call.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::{
    Capacity, Code, Confirmed, ControllerPublishRequest, CreateVolumeRequest, CsiError, CsiRpc,
    CsiVolumes, NodePublishRequest, NodeStageRequest, Secrets, ValidateRequest, Validation, Volume,
    VolumePage,
};
use tokio::sync::Notify;

/// One volume as the fake plugin knows it.
#[derive(Debug, Clone, Default)]
pub struct FakeVolume {
    /// The CreateVolume name (empty for volumes a test inserted as pre-existing).
    pub name: String,
    /// Capacity in bytes.
    pub capacity: i64,
    /// Whether ControllerPublishVolume attached it (and no ControllerUnpublish since).
    pub controller_published: bool,
    /// The staging path it is staged at.
    pub staged: Option<String>,
    /// The target path it is published at, and whether read-only.
    pub published: Option<(String, bool)>,
    /// The size of its file system, as NodeExpandVolume last grew it (0: never).
    pub fs_bytes: i64,
}

/// A scripted failure.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The RPC that fails.
    pub rpc: CsiRpc,
    /// The gRPC code it fails with.
    pub code: Code,
    /// Fail after applying the effect (the reply is lost), not before.
    pub after_effect: bool,
    /// How many more calls fail.
    pub times: usize,
}

/// Everything the fake plugin knows and counts; tests read and script it through
/// [`FakeCsi::st`].
#[derive(Debug, Default)]
pub struct FakeState {
    /// The plugin's volumes.
    pub volumes: BTreeMap<VolumeId, FakeVolume>,
    /// CreateVolume name → volume (CreateVolume is idempotent by name).
    pub by_name: HashMap<String, VolumeId>,
    /// CreateVolume calls that created a new volume.
    pub created: usize,
    /// The number in the next created volume's id (`vol-<n>`, from 1).
    pub next_id: usize,
    /// Calls received, per RPC (also those that failed or are held).
    pub calls: HashMap<CsiRpc, usize>,
    /// Scripted failures, consumed in order per RPC.
    pub faults: Vec<Fault>,
    /// Secrets seen by NodeStage/NodePublish, per volume.
    pub secrets_seen: Vec<(VolumeId, CsiRpc, StringMap)>,
    /// Calls running per volume, and the most ever seen at once (per volume / overall).
    pub running: HashMap<VolumeId, usize>,
    /// Whether two calls for one volume ever ran at once (a serialization bug).
    pub overlap_on_one_volume: bool,
    /// Calls running now, over all volumes.
    pub running_total: usize,
    /// The most calls ever running at once.
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
    /// What ValidateVolumeCapabilities confirms instead of echoing the request.
    pub confirm: Option<Confirmed>,
    /// The container serving these RPCs is down: their calls wait, unsent and
    /// uncounted, as a managed client's do ([`FakeCsi::set_down`]), both in
    /// `endpoint_ready` and inside the call.
    pub down: HashSet<CsiRpc>,
    /// Calls waiting now because their RPC is [`FakeState::down`].
    pub waiting_for_endpoint: usize,
    /// ControllerExpandVolume answers `node_expansion_required` (a file system to grow).
    pub node_expansion_required: bool,
    /// Snapshots by id: (CreateSnapshot name, source volume, size).
    pub snapshots: BTreeMap<String, (String, VolumeId, i64)>,
    /// CreateSnapshot calls that took a new snapshot.
    pub snapshots_taken: usize,
    /// The container serving these RPCs was stopped for good (slrp is shutting down):
    /// their calls fail unsent with [`CsiError::EndpointStopped`], as a managed
    /// client's do.
    pub stopped: HashSet<CsiRpc>,
}

/// The in-memory plugin.
#[derive(Debug)]
pub struct FakeCsi {
    /// The capabilities it reports (and enforces: an RPC without its capability fails).
    pub caps: CsiCapabilities,
    /// Its volumes, counters and scripted faults.
    pub state: Mutex<FakeState>,
    /// Every call takes this long (paused time makes it free).
    pub delay: Mutex<Duration>,
    /// Calls for these volumes wait until [`FakeCsi::release`].
    pub held: Mutex<HashSet<VolumeId>>,
    /// CreateVolume calls with these names create the volume, then wait with the answer
    /// until [`FakeCsi::unhold_create`]: the plugin-side volume exists, the manager does
    /// not know its id yet.
    pub held_creates: Mutex<HashSet<String>>,
    /// Wakes held calls to look again whether they are still held.
    pub release: Notify,
    /// GetCapacity's answer.
    pub total_bytes: i64,
}

impl FakeCsi {
    /// A plugin with `caps` and no volumes.
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

    /// The plugin's state, locked (do not hold it across an await).
    pub fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// How many `rpc` calls arrived.
    pub fn calls(&self, rpc: CsiRpc) -> usize {
        self.st().calls.get(&rpc).copied().unwrap_or(0)
    }

    /// How many calls arrived, over all RPCs.
    pub fn total_calls(&self) -> usize {
        self.st().calls.values().sum()
    }

    /// The next `times` calls of `rpc` fail with `code` before any effect.
    pub fn fail(&self, rpc: CsiRpc, code: Code, times: usize) {
        self.st().faults.push(Fault {
            rpc,
            code,
            after_effect: false,
            times,
        });
    }

    /// The next `times` calls of `rpc` take effect, then fail with `code` (the answer is
    /// lost).
    pub fn fail_after_effect(&self, rpc: CsiRpc, code: Code, times: usize) {
        self.st().faults.push(Fault {
            rpc,
            code,
            after_effect: true,
            times,
        });
    }

    /// Calls for `id` wait (after counting) until [`Self::unhold`].
    pub fn hold(&self, id: &VolumeId) {
        self.held.lock().unwrap().insert(id.clone());
    }

    /// Lets held calls for `id` go on.
    pub fn unhold(&self, id: &VolumeId) {
        self.held.lock().unwrap().remove(id);
        self.release.notify_waiters();
    }

    /// A CreateVolume of `name` creates the volume, then waits with its answer until
    /// [`Self::unhold_create`].
    pub fn hold_create(&self, name: &str) {
        self.held_creates.lock().unwrap().insert(name.to_owned());
    }

    /// Lets a held CreateVolume of `name` answer.
    pub fn unhold_create(&self, name: &str) {
        self.held_creates.lock().unwrap().remove(name);
        self.release.notify_waiters();
    }

    /// The id the plugin gave the volume named `name`, once it exists.
    pub fn id_of(&self, name: &str) -> Option<VolumeId> {
        self.st().by_name.get(name).cloned()
    }

    /// Every call takes `d` from now on.
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

    /// The ids of the plugin's volumes, ordered.
    pub fn ids(&self) -> Vec<VolumeId> {
        self.st().volumes.keys().cloned().collect()
    }

    /// The plugin's view of volume `id`.
    pub fn volume(&self, id: &VolumeId) -> Option<FakeVolume> {
        self.st().volumes.get(id).cloned()
    }

    /// Marks the container serving `rpc` down (its calls wait) or up again.
    pub fn set_down(&self, rpc: CsiRpc, down: bool) {
        if down {
            self.st().down.insert(rpc);
        } else {
            self.st().down.remove(&rpc);
        }
        self.release.notify_waiters();
    }

    /// Waits while `rpc`'s container is down (see [`FakeState::down`]).
    async fn wait_up(&self, rpc: CsiRpc) {
        let mut counted = false;
        loop {
            let notified = self.release.notified();
            {
                let mut st = self.st();
                if !st.down.contains(&rpc) {
                    if counted {
                        st.waiting_for_endpoint -= 1;
                    }
                    return;
                }
                if !counted {
                    st.waiting_for_endpoint += 1;
                    counted = true;
                }
            }
            notified.await;
        }
    }

    /// Bookkeeping around one call on `vol`: concurrency counters, delay, hold.
    async fn enter<T>(
        &self,
        rpc: CsiRpc,
        vol: Option<&VolumeId>,
        f: impl FnOnce(&mut FakeState) -> Result<T, CsiError>,
    ) -> Result<T, CsiError> {
        self.wait_up(rpc).await;
        if self.st().stopped.contains(&rpc) {
            return Err(CsiError::EndpointStopped {
                rpc,
                endpoint: "unix:///fake.sock".into(),
            });
        }
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

/// Every capability the volume manager uses (controller publish, staging, create/delete,
/// list, capacity).
pub fn full_caps() -> CsiCapabilities {
    let mut c = CsiCapabilities::with_publish_stage(true, true);
    c.plugin.controller_service = true;
    c.controller.create_delete_volume = true;
    c.controller.list_volumes = true;
    c.controller.get_capacity = true;
    c
}

/// [`full_caps`] with CREATE_DELETE_SNAPSHOT and LIST_SNAPSHOTS.
pub fn snapshot_caps() -> CsiCapabilities {
    let mut c = full_caps();
    c.controller.create_delete_snapshot = true;
    c.controller.list_snapshots = true;
    c
}

/// [`full_caps`] with EXPAND_VOLUME on both services and ONLINE expansion.
pub fn expanding_caps() -> CsiCapabilities {
    let mut c = full_caps();
    c.controller.expand_volume = true;
    c.node.expand_volume = true;
    c.plugin.expansion_online = true;
    c
}

impl CsiVolumes for FakeCsi {
    async fn endpoint_ready(&self, rpc: CsiRpc) -> Result<(), CsiError> {
        self.wait_up(rpc).await;
        Ok(())
    }

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
                            // A test may choose the id (one the manager must refuse).
                            let id = VolumeId::new(
                                req.parameters
                                    .get("volume_id")
                                    .cloned()
                                    .unwrap_or_else(|| format!("vol-{}", st.next_id)),
                            );
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
                    // What the CSI client does with an answer it refuses (an id slrp
                    // cannot store, a volume over limit_bytes): the plugin has created the
                    // volume; the caller hears which one, if the id can be sent back.
                    if let Some(how) = req.parameters.get("refused_answer") {
                        return Err(CsiError::InvalidResponse {
                            rpc: CsiRpc::CreateVolume,
                            violation: Box::new(slrp_csi::Violation::AboveLimit {
                                capacity: i64::MAX,
                                limit: req.limit_bytes,
                            }),
                            created: (how != "no_id").then(|| id.clone()),
                        });
                    }
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
                let echo = Confirmed {
                    volume_context: req.volume_context.clone(),
                    capabilities: req.capabilities.clone(),
                    parameters: req.parameters.clone(),
                };
                Ok(Validation {
                    confirmed,
                    message: if confirmed {
                        String::new()
                    } else {
                        "nope".into()
                    },
                    confirmed_fields: confirmed.then(|| st.confirm.clone().unwrap_or(echo)),
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
        // A pool the plugin refuses outright, whatever its state: a permanent answer.
        let refused = parameters.get("pool").is_some_and(|p| p == "refused");
        async move {
            self.enter(CsiRpc::GetCapacity, None, move |st| {
                if refused {
                    return Err(CsiError::status(
                        CsiRpc::GetCapacity,
                        Code::InvalidArgument,
                        "pool \"refused\" is not served",
                    ));
                }
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

    fn create_snapshot(
        &self,
        req: &slrp_csi::CreateSnapshotRequest,
    ) -> impl Future<Output = Result<slrp_csi::Snapshot, CsiError>> + Send {
        let req = req.clone();
        async move {
            let rpc = CsiRpc::CreateSnapshot;
            if !self.caps.controller.create_delete_snapshot {
                return Err(err(rpc, Code::Unimplemented, "no CREATE_DELETE_SNAPSHOT"));
            }
            let source = req.source_volume_id.clone();
            self.enter(rpc, Some(&source.clone()), move |st| {
                let taken = st
                    .snapshots
                    .iter()
                    .find(|(_, (name, _, _))| *name == req.name)
                    .map(|(id, (_, of, size))| (id.clone(), of.clone(), *size));
                let (id, size) = match taken {
                    Some((_, of, _)) if of != source => {
                        return Err(err(rpc, Code::AlreadyExists, "name taken"));
                    }
                    Some((id, _, size)) => (id, size),
                    None => {
                        let size = st
                            .volumes
                            .get(&source)
                            .ok_or_else(|| err(rpc, Code::NotFound, "no such volume"))?
                            .capacity;
                        st.snapshots_taken += 1;
                        let id = format!("snap-{}", st.snapshots_taken);
                        st.snapshots
                            .insert(id.clone(), (req.name.clone(), source.clone(), size));
                        (id, size)
                    }
                };
                Ok(slrp_csi::Snapshot {
                    snapshot_id: id,
                    source_volume_id: source,
                    size_bytes: size,
                    creation_time: Some(1_700_000_000),
                    ready_to_use: true,
                })
            })
            .await
        }
    }

    fn delete_snapshot(
        &self,
        snapshot_id: &str,
    ) -> impl Future<Output = Result<(), CsiError>> + Send {
        let id = snapshot_id.to_owned();
        async move {
            let rpc = CsiRpc::DeleteSnapshot;
            if !self.caps.controller.create_delete_snapshot {
                return Err(err(rpc, Code::Unimplemented, "no CREATE_DELETE_SNAPSHOT"));
            }
            self.enter(rpc, None, move |st| {
                st.snapshots
                    .remove(&id)
                    .map(|_| ())
                    .ok_or_else(|| err(rpc, Code::NotFound, "no such snapshot"))
            })
            .await
        }
    }

    fn controller_expand(
        &self,
        id: &VolumeId,
        required_bytes: i64,
        capability: Option<&VolumeCapability>,
    ) -> impl Future<Output = Result<slrp_csi::ControllerExpansion, CsiError>> + Send {
        let id = id.clone();
        let has_capability = capability.is_some();
        async move {
            let rpc = CsiRpc::ControllerExpandVolume;
            if !self.caps.controller.expand_volume {
                return Err(err(rpc, Code::Unimplemented, "no EXPAND_VOLUME"));
            }
            self.enter(rpc, Some(&id.clone()), move |st| {
                if !has_capability {
                    return Err(err(rpc, Code::InvalidArgument, "no volume_capability"));
                }
                let total: i64 = st.volumes.values().map(|v| v.capacity).sum();
                let v = st
                    .volumes
                    .get(&id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                let growth = required_bytes - v.capacity;
                if growth > 0 && total + growth > self.total_bytes {
                    return Err(err(rpc, Code::OutOfRange, "not enough space"));
                }
                let node_expansion_required = st.node_expansion_required;
                let v = st.volumes.get_mut(&id).expect("checked");
                v.capacity = v.capacity.max(required_bytes);
                Ok(slrp_csi::ControllerExpansion {
                    capacity_bytes: v.capacity,
                    node_expansion_required,
                })
            })
            .await
        }
    }

    fn node_expand(
        &self,
        req: &slrp_csi::NodeExpandRequest,
    ) -> impl Future<Output = Result<i64, CsiError>> + Send {
        let req = req.clone();
        async move {
            let rpc = CsiRpc::NodeExpandVolume;
            if !self.caps.node.expand_volume {
                return Err(err(rpc, Code::Unimplemented, "no EXPAND_VOLUME"));
            }
            let id = req.volume_id.clone();
            self.enter(rpc, Some(&id.clone()), move |st| {
                let v = st
                    .volumes
                    .get_mut(&id)
                    .ok_or_else(|| err(rpc, Code::NotFound, "unknown"))?;
                let at_path = v
                    .published
                    .as_ref()
                    .is_some_and(|(p, _)| *p == req.volume_path)
                    || v.staged.as_deref() == Some(req.volume_path.as_str());
                if !at_path {
                    return Err(err(rpc, Code::NotFound, "not available at volume_path"));
                }
                if req.required_bytes > v.capacity {
                    return Err(err(rpc, Code::OutOfRange, "larger than the volume"));
                }
                v.fs_bytes = v.fs_bytes.max(req.required_bytes);
                Ok(v.fs_bytes)
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
