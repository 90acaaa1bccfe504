//! The volume manager: drives volumes through CSI, durably, one operation per volume at a
//! time and many volumes at once.
//!
//! # Design
//!
//! A [`VolumeManagerHandle`] (cheap to clone) sends commands over a bounded channel to the
//! worker ([`VolumeManager::spawn`]), which owns every [`VolumeRecord`] outright.
//! Each request becomes a *job* on a *lane*: the lane of its volume id, or for
//! CreateVolume the lane of its name (the id is not known yet). A lane runs one job at
//! a time, in arrival order; a busy lane queues. Jobs of different lanes run as tasks in
//! parallel, each first taking a permit of a semaphore sized
//! [`VolumeManagerConfig::max_concurrent`]. A job that hangs holds its lane and one
//! permit, nothing else, so it never blocks other volumes while permits remain.
//!
//! Lanes alone do not separate a CreateVolume from requests for the id it is about to
//! learn (e.g. a validate or delete of an id the provider saw in ListVolumes while the
//! create's answer was on its way): they run on different lanes. So a *create gate*
//! keeps creates of untracked names and jobs for untracked ids apart (each class runs in
//! parallel with itself, never with the other; see `Gate`): a job that would overlap
//! the other class is parked, its lane kept busy, and started in arrival order once the
//! other class's running jobs have been applied, classified afresh (an id a create just
//! tracked is tracked, so its jobs see the create's record). While anything is parked,
//! new jobs of either class park behind it, so neither starves. Jobs on tracked volumes
//! and names never wait at the gate. [`VolumeManagerHandle::jobs`] shows the counts.
//!
//! A running job owns a copy of its volume's record. When it ends it hands back the
//! new record (or its removal) and the worker applies that *before* the caller hears
//! the answer, so a caller that acts on an answer always finds the state it implies.
//!
//! The driver loop of every transition (conventions §4.6 rule 3):
//! `next_call` (in-memory no-ops for missing capabilities) → `begin` → **commit** (the
//! in-flight state is durable before the RPC is sent) → RPC → `finish` → **commit**.
//! A failed RPC keeps the in-flight state (Mesos's rule): the next request for the
//! volume, or recovery, re-drives or undoes it. `NOT_FOUND` from an undo RPC counts as
//! done. Deadlines and retries of each RPC are the CSI client's (`slrp_csi::ClientConfig`).
//!
//! CreateVolume is made safe by an intent record ([`CreateVolume`], kind
//! `volume_create`, key = name) committed before the RPC; the volume record and the
//! removal of the intent are one transaction after it. A name that is already tracked
//! answers with the tracked volume (fixes spec §12.7). Deletion first marks the record
//! `deleting` (durable), then walks the volume down to CREATED, calls DeleteVolume
//! (`NOT_FOUND` = done), removes its mount directory and finally the record.
//!
//! # Recovery
//!
//! At start the worker loads every record and intent, then:
//! 1. maps each record to the current boot ([`VolumeRecord::recover`]): after a reboot
//!    (changed boot id) a staged or published volume is walked back to NODE_READY through
//!    NodeUnpublish/NodeUnstage (idempotent; they clear what the plugin still records
//!    of mounts the reboot removed) and published again if it must be;
//! 2. in the same boot, compares PUBLISHED/VOL_READY with the mount table: a published
//!    volume whose target is not mounted re-drives NodePublish; a volume that is not
//!    published but whose target is mounted re-drives NodeUnpublish;
//! 3. commits all of that in one transaction, then runs recovery jobs: unfinished
//!    deletions are finished, in-flight states re-driven, volumes with
//!    `node_publish_required` published again, and every CreateVolume intent resolved by
//!    re-issuing CreateVolume with its name (idempotent in CSI) and tracking the result;
//! 4. removes `mounts/<dir>` entries of untracked volumes, but only once nothing is
//!    mounted at or below them (after NodeUnpublish/NodeUnstage of what is).
//!
//! [`VolumeManagerHandle::ready`] answers when this is done: an error if a required
//! publish or an intent failed.
//!
//! # Shutdown
//!
//! On cancellation the worker stops taking commands (those already sent, jobs queued
//! on lanes and jobs parked at the create gate are answered [`VolumeError::Stopped`]), lets running jobs finish for
//! [`VolumeManagerConfig::shutdown_grace`] (their intents are durable, so stopping them
//! is safe too), then aborts the rest. A job that finishes within the grace period is
//! applied and answered as usual; a fatal error meanwhile ends the task with that error. A fatal error (a failed commit) aborts every job
//! at once and ends [`VolumeManager::spawn`]'s task with the error: the process is
//! expected to restart and recover from disk.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use slrp_csi::{
    AccessMode, ControllerPublishRequest, CreateVolumeRequest, CsiCapabilities, CsiError, CsiRpc,
    CsiVolumes, NodePublishRequest, NodeStageRequest, RetryClass, Secrets, StringMap,
    ValidateRequest, VolumeCapability, VolumeId, VolumePage,
};
use slrp_store::{Kind, Record, Store};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::VolumeError;
use super::host::{MountTable, NoSecrets, ProcMountTable, SecretResolver};
use super::paths::{MountPaths, decode_volume_id};
use super::state::{
    BootId, CallOutcome, CsiCall, Goal, SecretRef, VolumeRecord, VolumeSpec, VolumeState,
};

/// Fail point names (feature `failpoints`), evaluated around every CSI call a job makes
/// (transitions, CreateVolume, DeleteVolume). `return` makes the manager stop as if
/// the process died there.
pub mod failpoints {
    /// The intent is durable, the RPC not sent yet.
    pub const BEFORE_CALL: &str = "slrp_core::volume::before_call";
    /// The RPC returned, its result not persisted yet.
    pub const AFTER_CALL: &str = "slrp_core::volume::after_call";
}

#[cfg(feature = "failpoints")]
fn injected(point: &'static str) -> Result<(), VolumeError> {
    match fail::eval(point, |_| ()) {
        Some(()) => Err(VolumeError::Injected { point }),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
fn injected(_point: &'static str) -> Result<(), VolumeError> {
    Ok(())
}

/// A CreateVolume request; also the intent record (kind `volume_create`, key = name)
/// that is durable while the RPC may be in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateVolume {
    /// Idempotency name (the provider uses the operation UUID).
    pub name: String,
    /// `capacity_range.required_bytes` (0 = unset).
    pub required_bytes: i64,
    /// `capacity_range.limit_bytes` (0 = unset).
    pub limit_bytes: i64,
    /// The capability the volume is created for.
    pub capability: VolumeCapability,
    /// Plugin parameters (from the profile).
    #[serde(default)]
    pub parameters: StringMap,
}

impl Record for CreateVolume {
    const KIND: Kind = Kind::new("volume_create");
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// A pre-existing volume to validate and track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateVolume {
    /// The plugin's id.
    pub id: VolumeId,
    /// Capability to confirm.
    pub capability: VolumeCapability,
    /// Parameters to confirm (v1 only).
    pub parameters: StringMap,
    /// The volume context (from ListVolumes or the resource's metadata).
    pub volume_context: StringMap,
    /// Size as listed.
    pub capacity_bytes: i64,
    /// NodeStageVolume secrets by CSI key (references; resolved per call).
    pub node_stage_secrets: BTreeMap<String, SecretRef>,
    /// NodePublishVolume secrets by CSI key.
    pub node_publish_secrets: BTreeMap<String, SecretRef>,
}

/// Whether volumes with `cap` are published read-only (the reader-only access modes).
fn is_read_only(cap: &VolumeCapability) -> bool {
    match cap.access_mode {
        AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly => true,
        AccessMode::SingleNodeWriter
        | AccessMode::MultiNodeSingleWriter
        | AccessMode::MultiNodeMultiWriter
        | AccessMode::SingleNodeSingleWriter
        | AccessMode::SingleNodeMultiWriter => false,
    }
}

/// A tracked volume as callers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeInfo {
    /// The plugin's id.
    pub id: VolumeId,
    /// Capacity in bytes (the plugin's answer; the request's if the plugin gave none).
    pub capacity_bytes: i64,
    /// Volume context.
    pub volume_context: StringMap,
}

impl VolumeInfo {
    fn of(rec: &VolumeRecord) -> Self {
        Self {
            id: rec.id.clone(),
            capacity_bytes: rec.capacity_bytes,
            volume_context: rec.spec.volume_context.clone(),
        }
    }
}

/// What recovery did; see the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Volume records loaded.
    pub volumes: usize,
    /// Volumes whose stored boot id was stale (reset to NODE_READY).
    pub rebooted: usize,
    /// Volumes whose mounts disagreed with their state (a call re-driven for them).
    pub mount_mismatches: usize,
    /// Recovery jobs run (deletions, re-drives, republishes, intents).
    pub jobs: usize,
    /// CreateVolume intents resolved.
    pub intents: usize,
    /// Untracked mount directories removed.
    pub collected: usize,
    /// Failures that do not block readiness (re-drives of in-flight states, directories
    /// that are still mounted).
    pub warnings: Vec<String>,
}

/// How many volume jobs are where, at one moment (see [`VolumeManagerHandle::jobs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobCounts {
    /// Jobs started and not yet applied (including those waiting for a concurrency
    /// permit).
    pub running: usize,
    /// Of the running jobs, CreateVolume jobs for names that were not tracked.
    pub creating: usize,
    /// Jobs parked at the create gate: jobs for untracked ids waiting for running
    /// creates to be applied, or creates waiting for those (module docs, "Lanes").
    pub parked: usize,
    /// Jobs waiting behind another job of their volume (or name).
    pub queued: usize,
}

/// Settings of the volume manager.
#[derive(Debug, Clone)]
pub struct VolumeManagerConfig {
    /// Where staging and target paths live.
    pub mount_paths: MountPaths,
    /// This node's id (`NodeGetInfo`), sent with Controller(Un)PublishVolume.
    pub node_id: String,
    /// The plugin's capabilities; decide which transitions need an RPC.
    pub caps: CsiCapabilities,
    /// The current boot id ([`super::host::read_boot_id`]).
    pub boot_id: BootId,
    /// Most volumes with a job running at once.
    pub max_concurrent: usize,
    /// Commands that may wait for the worker before senders wait (backpressure).
    pub command_buffer: usize,
    /// Create the target directory before NodePublishVolume (CSI v0 plugins expect it;
    /// v1 plugins create it themselves and get only its parent).
    pub create_target_dir: bool,
    /// How long running jobs may take to finish on shutdown.
    pub shutdown_grace: Duration,
    /// The mount table recovery compares states with.
    pub mounts: Arc<dyn MountTable>,
    /// Resolves the secret references of stage and publish requests.
    pub secrets: Arc<dyn SecretResolver>,
}

impl VolumeManagerConfig {
    /// Defaults: 16 concurrent volumes, 256 queued commands, target dir left to the
    /// plugin, 30 s grace, the real mount table, no secrets.
    pub fn new(
        mount_paths: MountPaths,
        node_id: impl Into<String>,
        caps: CsiCapabilities,
        boot_id: BootId,
    ) -> Self {
        Self {
            mount_paths,
            node_id: node_id.into(),
            caps,
            boot_id,
            max_concurrent: 16,
            command_buffer: 256,
            create_target_dir: false,
            shutdown_grace: Duration::from_secs(30),
            mounts: Arc::new(ProcMountTable),
            secrets: Arc::new(NoSecrets),
        }
    }

    /// Sets the concurrency limit (at least 1).
    #[must_use]
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n.max(1);
        self
    }

    /// Sets the command buffer (at least 1).
    #[must_use]
    pub fn command_buffer(mut self, n: usize) -> Self {
        self.command_buffer = n.max(1);
        self
    }

    /// Whether to create the target directory before NodePublishVolume.
    #[must_use]
    pub fn create_target_dir(mut self, yes: bool) -> Self {
        self.create_target_dir = yes;
        self
    }

    /// Sets the shutdown grace period.
    #[must_use]
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Sets the mount table.
    #[must_use]
    pub fn mounts(mut self, m: Arc<dyn MountTable>) -> Self {
        self.mounts = m;
        self
    }

    /// Sets the secret resolver.
    #[must_use]
    pub fn secrets(mut self, s: Arc<dyn SecretResolver>) -> Self {
        self.secrets = s;
        self
    }
}

type Reply<T> = oneshot::Sender<Result<T, VolumeError>>;

/// Where readiness stands.
#[derive(Debug, Clone)]
enum Readiness {
    Recovering,
    Ready(RecoveryReport),
    Failed(Vec<String>),
    Stopped,
}

/// Sends requests to the volume manager. Cheap to clone.
#[derive(Debug, Clone)]
pub struct VolumeManagerHandle {
    tx: mpsc::Sender<Command>,
    ready: watch::Receiver<Readiness>,
}

/// The volume manager's worker; see the module docs.
#[derive(Debug)]
pub struct VolumeManager;

impl VolumeManager {
    /// Starts the worker on the current runtime: it recovers from `store` (see the
    /// module docs) and then serves requests until `cancel` fires or a fatal error.
    ///
    /// The returned task ends with the fatal error, or `Ok` after shutdown; when it has
    /// ended, every job has stopped and the manager holds no clone of `store`.
    pub fn spawn<C: CsiVolumes>(
        config: VolumeManagerConfig,
        store: Store,
        csi: Arc<C>,
        cancel: CancellationToken,
    ) -> (VolumeManagerHandle, JoinHandle<Result<(), VolumeError>>) {
        let (tx, rx) = mpsc::channel(config.command_buffer.max(1));
        let (ready_tx, ready) = watch::channel(Readiness::Recovering);
        let permits = Arc::new(Semaphore::new(config.max_concurrent.max(1)));
        let worker = Worker {
            ctx: Arc::new(Ctx {
                csi,
                store,
                cfg: config,
                permits,
            }),
            rx,
            volumes: HashMap::new(),
            names: HashMap::new(),
            lanes: HashMap::new(),
            gate: Gate::default(),
            tasks: JoinSet::new(),
            ready_tx,
            recovery: None,
        };
        let task = tokio::spawn(
            worker
                .run(cancel)
                .instrument(tracing::info_span!(parent: None, "volume_manager")),
        );
        (VolumeManagerHandle { tx, ready }, task)
    }
}

impl VolumeManagerHandle {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, VolumeError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| VolumeError::Stopped)?;
        rx.await.map_err(|_| VolumeError::Stopped)?
    }

    /// Waits until recovery is done.
    ///
    /// # Errors
    /// [`VolumeError::RecoveryFailed`] if a volume that must be published (or a
    /// CreateVolume intent) could not be recovered; [`VolumeError::Stopped`] if the
    /// manager stopped first.
    pub async fn ready(&self) -> Result<RecoveryReport, VolumeError> {
        let mut rx = self.ready.clone();
        loop {
            match &*rx.borrow_and_update() {
                Readiness::Recovering => {}
                Readiness::Ready(r) => return Ok(r.clone()),
                Readiness::Failed(f) => {
                    return Err(VolumeError::RecoveryFailed { failed: f.clone() });
                }
                Readiness::Stopped => return Err(VolumeError::Stopped),
            }
            rx.changed().await.map_err(|_| VolumeError::Stopped)?;
        }
    }

    /// Creates a volume (or returns the one already tracked under `req.name`).
    ///
    /// # Errors
    /// [`VolumeError::Unsupported`] without `CREATE_DELETE_VOLUME`,
    /// [`VolumeError::Mismatch`] if the name is tracked with another capability or other
    /// parameters, [`VolumeError::Csi`] if CreateVolume failed.
    pub async fn create(&self, req: CreateVolume) -> Result<VolumeInfo, VolumeError> {
        if req.name.is_empty() {
            return Err(VolumeError::InvalidRequest {
                what: "the volume name is empty".into(),
            });
        }
        let key = Key::Name(req.name.clone());
        self.ask(|reply| {
            Command::Job(
                key,
                Job::Create {
                    req,
                    reply: Some(reply),
                },
            )
        })
        .await
    }

    /// Validates a pre-existing volume with ValidateVolumeCapabilities and tracks it
    /// (CREATED, pre-provisioned). A tracked volume is checked against its record only.
    ///
    /// # Errors
    /// [`VolumeError::Mismatch`], [`VolumeError::NotConfirmed`], [`VolumeError::Csi`].
    pub async fn validate(&self, req: ValidateVolume) -> Result<VolumeInfo, VolumeError> {
        let key = Key::Volume(req.id.clone());
        self.ask(|reply| Command::Job(key, Job::Validate { req, reply }))
            .await
    }

    /// Deletes a volume: unpublishes, unstages and detaches it first, then DeleteVolume
    /// (`NOT_FOUND` = success). Returns whether the plugin deprovisioned it (false
    /// without `CREATE_DELETE_VOLUME`: the volume is only untracked).
    ///
    /// # Errors
    /// [`VolumeError::Csi`] if a step failed (the deletion resumes on the next request
    /// or at recovery).
    pub async fn delete(&self, id: &VolumeId) -> Result<bool, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| Command::Job(key, Job::Delete { reply: Some(reply) }))
            .await
    }

    /// Publishes a volume at its target path (attaching and staging it first); returns
    /// the target path.
    ///
    /// # Errors
    /// [`VolumeError::UnknownVolume`], [`VolumeError::Csi`], [`VolumeError::Secret`].
    pub async fn publish(&self, id: &VolumeId) -> Result<PathBuf, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| Command::Job(key, Job::Publish { reply }))
            .await
    }

    /// Unpublishes and unstages a volume (back to NODE_READY, as Mesos does), and clears
    /// `node_publish_required` so that it is not published again after a reboot.
    /// Unknown volumes are a no-op.
    ///
    /// # Errors
    /// [`VolumeError::Csi`].
    pub async fn unpublish(&self, id: &VolumeId) -> Result<(), VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| Command::Job(key, Job::Unpublish { reply }))
            .await
    }

    /// One page of the plugin's ListVolumes (empty without `LIST_VOLUMES`).
    ///
    /// # Errors
    /// [`VolumeError::Csi`].
    pub async fn list(
        &self,
        max_entries: i32,
        token: Option<String>,
    ) -> Result<VolumePage, VolumeError> {
        self.ask(|reply| Command::List {
            max_entries,
            token,
            reply,
        })
        .await
    }

    /// Every volume the plugin lists, following pages of `page_size`.
    ///
    /// # Errors
    /// [`VolumeError::Csi`], or [`VolumeError::InvalidRequest`] if the plugin repeats a
    /// page token.
    pub async fn list_all(&self, page_size: i32) -> Result<Vec<slrp_csi::Volume>, VolumeError> {
        let mut all = Vec::new();
        let mut token = None;
        let mut seen = HashSet::new();
        loop {
            let page = self.list(page_size, token).await?;
            all.extend(page.volumes);
            match page.next_token {
                None => return Ok(all),
                Some(next) => {
                    if !seen.insert(next.clone()) {
                        return Err(VolumeError::InvalidRequest {
                            what: format!("the plugin repeated page token {next:?}"),
                        });
                    }
                    token = Some(next);
                }
            }
        }
    }

    /// Bytes available for volumes with `capability` and `parameters` (0 without
    /// `GET_CAPACITY`).
    ///
    /// # Errors
    /// [`VolumeError::Csi`].
    pub async fn capacity(
        &self,
        capability: VolumeCapability,
        parameters: StringMap,
    ) -> Result<i64, VolumeError> {
        self.ask(|reply| Command::Capacity {
            capability,
            parameters,
            reply,
        })
        .await
    }

    /// Where the manager's jobs are: running, parked at the create gate, queued on their
    /// volume. For the admin endpoint and for tests that must know a request has arrived.
    ///
    /// # Errors
    /// [`VolumeError::Stopped`].
    pub async fn jobs(&self) -> Result<JobCounts, VolumeError> {
        self.ask(|reply| Command::Jobs { reply }).await
    }

    /// The records as last committed, ordered by id.
    ///
    /// # Errors
    /// [`VolumeError::Stopped`].
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, VolumeError> {
        self.ask(|reply| Command::Snapshot { reply }).await
    }
}

// === the worker ===

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Volume(VolumeId),
    Name(String),
}

impl Key {
    /// The volume id of a volume lane (a name lane's name: jobs that need an id are
    /// never queued there).
    fn volume_id(&self) -> VolumeId {
        match self {
            Self::Volume(id) => id.clone(),
            Self::Name(n) => VolumeId::new(n.clone()),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Volume(id) => write!(f, "volume {id}"),
            Self::Name(n) => write!(f, "name {n}"),
        }
    }
}

enum Command {
    Job(Key, Job),
    List {
        max_entries: i32,
        token: Option<String>,
        reply: Reply<VolumePage>,
    },
    Capacity {
        capability: VolumeCapability,
        parameters: StringMap,
        reply: Reply<i64>,
    },
    Snapshot {
        reply: Reply<Vec<VolumeRecord>>,
    },
    Jobs {
        reply: Reply<JobCounts>,
    },
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Job(key, job) => write!(f, "{} on {key}", job.name()),
            Self::List { .. } => f.write_str("list"),
            Self::Capacity { .. } => f.write_str("capacity"),
            Self::Snapshot { .. } => f.write_str("snapshot"),
            Self::Jobs { .. } => f.write_str("jobs"),
        }
    }
}

/// What recovery wants for a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecoveryGoal {
    Reach(Goal),
    /// Publish again: must succeed before the manager is ready.
    Republish,
    /// Back to NODE_READY after a reboot, then (if required) publish again.
    AfterReboot {
        republish: bool,
    },
    Delete,
}

enum Job {
    Create {
        req: CreateVolume,
        /// `None` for recovery.
        reply: Option<Reply<VolumeInfo>>,
    },
    Validate {
        req: ValidateVolume,
        reply: Reply<VolumeInfo>,
    },
    Delete {
        /// `None` for recovery.
        reply: Option<Reply<bool>>,
    },
    Publish {
        reply: Reply<PathBuf>,
    },
    Unpublish {
        reply: Reply<()>,
    },
    Recover {
        goal: RecoveryGoal,
    },
    /// Remove the mount directory of an untracked volume.
    Collect {
        dir: PathBuf,
    },
}

impl Job {
    fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Validate { .. } => "validate",
            Self::Delete { .. } => "delete",
            Self::Publish { .. } => "publish",
            Self::Unpublish { .. } => "unpublish",
            Self::Recover { .. } => "recover",
            Self::Collect { .. } => "collect",
        }
    }

    fn is_recovery(&self) -> bool {
        match self {
            Self::Create { reply, .. } => reply.is_none(),
            Self::Delete { reply } => reply.is_none(),
            Self::Recover { .. } | Self::Collect { .. } => true,
            Self::Validate { .. } | Self::Publish { .. } | Self::Unpublish { .. } => false,
        }
    }
}

/// How a job changed the tracked set.
enum Change {
    None,
    Put(Box<VolumeRecord>),
    Remove(VolumeId),
}

/// What a recovery job reports.
enum RecoveryResult {
    Done,
    Collected,
    /// Did not work, but does not block readiness.
    Warning(String),
    /// Blocks readiness.
    Failed(String),
}

/// A finished job, handed back to the worker.
struct Done {
    key: Option<Key>,
    /// How the job counted at the create gate (released when it is applied).
    class: Class,
    change: Change,
    /// Sends the caller's answer; called after `change` is applied.
    answer: Box<dyn FnOnce() + Send>,
    /// A fatal error: the worker stops.
    fatal: Option<VolumeError>,
    recovery: Option<RecoveryResult>,
}

impl Done {
    fn plain(answer: Box<dyn FnOnce() + Send>) -> Self {
        Self {
            key: None,
            class: Class::Free,
            change: Change::None,
            answer,
            fatal: None,
            recovery: None,
        }
    }
}

/// Splits a job's result into the caller's answer and, for a fatal error, the error the
/// worker stops with (the caller then hears [`VolumeError::Stopped`]).
fn settle<T: Send + 'static>(
    reply: Option<Reply<T>>,
    result: Result<T, VolumeError>,
) -> (Box<dyn FnOnce() + Send>, Option<VolumeError>) {
    let (result, fatal) = match result {
        Err(e) if e.is_fatal() => (Err(VolumeError::Stopped), Some(e)),
        other => (other, None),
    };
    let answer: Box<dyn FnOnce() + Send> = Box::new(move || {
        if let Some(reply) = reply {
            // The caller may have given up waiting; that is its business.
            let _ = reply.send(result);
        }
    });
    (answer, fatal)
}

/// How a lane job counts at the create gate (see [`Gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Touches a tracked volume (or a tracked name): no conflict with creates.
    Free,
    /// A CreateVolume of an untracked name: may track an id nobody knows yet.
    Create,
    /// A job for an id that is not tracked: the id may be the one a create is about to
    /// track.
    Untracked,
}

/// Keeps creates and jobs for untracked ids apart.
///
/// A CreateVolume job learns its volume's id only from the plugin's answer, so it runs
/// on its name's lane; a job for that id on the id's lane would race it (both track the
/// id, or a delete removes it under the create). So [`Class::Create`] and
/// [`Class::Untracked`] jobs never run at the same time: many of one class may, each
/// on its own lane. A job that would conflict is parked here, with its lane kept busy
/// so that later jobs of the lane stay behind it. Parked jobs are started in arrival
/// order once the running jobs of the other class have been applied, after classifying
/// them again: the id a create just tracked is no longer untracked, so its jobs start
/// at once and see the create's record.
///
/// Fairness: while anything is parked, every new job of either class parks behind it
/// (strict FIFO), so neither a stream of creates nor one of untracked-id requests can
/// hold the other class off forever. Free jobs never wait here.
#[derive(Default)]
struct Gate {
    /// Create jobs running (started, not yet applied).
    creates: usize,
    /// Untracked-id jobs running.
    untracked: usize,
    /// Jobs waiting for the other class to drain, in arrival order.
    parked: VecDeque<(Key, Job)>,
}

impl Gate {
    /// Whether a job of `class` may start now, given that `ahead` jobs wait before it.
    fn admits(&self, class: Class, ahead: bool) -> bool {
        match class {
            Class::Free => true,
            Class::Create => !ahead && self.untracked == 0,
            Class::Untracked => !ahead && self.creates == 0,
        }
    }

    fn enter(&mut self, class: Class) {
        match class {
            Class::Free => {}
            Class::Create => self.creates += 1,
            Class::Untracked => self.untracked += 1,
        }
    }

    fn leave(&mut self, class: Class) {
        match class {
            Class::Free => {}
            Class::Create => self.creates = self.creates.saturating_sub(1),
            Class::Untracked => self.untracked = self.untracked.saturating_sub(1),
        }
    }
}

#[derive(Default)]
struct Lane {
    busy: bool,
    queue: VecDeque<Job>,
}

struct RecoveryProgress {
    pending: usize,
    report: RecoveryReport,
    failures: Vec<String>,
}

struct Worker<C> {
    ctx: Arc<Ctx<C>>,
    rx: mpsc::Receiver<Command>,
    /// Every tracked volume, as last committed.
    volumes: HashMap<VolumeId, VolumeRecord>,
    /// CreateVolume name → volume, for the volumes slrp created.
    names: HashMap<String, VolumeId>,
    /// Lanes with a job running, parked or queued (removed when idle and empty).
    lanes: HashMap<Key, Lane>,
    /// Keeps creates and jobs for untracked ids apart; holds the parked jobs. Cleared
    /// on shutdown with the lane queues, so parked callers hear `Stopped` at once.
    gate: Gate,
    tasks: JoinSet<Done>,
    ready_tx: watch::Sender<Readiness>,
    /// `Some` until recovery has finished.
    recovery: Option<RecoveryProgress>,
}

impl<C: CsiVolumes> Worker<C> {
    async fn run(mut self, cancel: CancellationToken) -> Result<(), VolumeError> {
        if let Err(e) = self.start().await {
            tracing::error!(error = %e, "volume manager recovery could not start");
            self.ready_tx.send_replace(Readiness::Stopped);
            return Err(e);
        }
        let mut accepting = true;
        let outcome = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break Ok(()),
                Some(joined) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    let done = match joined {
                        Ok(done) => done,
                        Err(e) => {
                            tracing::error!(error = %e, "a volume job panicked; stopping");
                            break Err(VolumeError::Stopped);
                        }
                    };
                    if let Some(fatal) = self.on_done(done) {
                        tracing::error!(error = %fatal, "fatal volume manager error; stopping");
                        break Err(fatal);
                    }
                }
                cmd = self.rx.recv(), if accepting => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => accepting = false,
                },
                else => break Ok(()),
            }
        };
        self.rx.close();
        // Commands sent before the close are dropped now, so their callers hear `Stopped`
        // at once instead of after the grace period.
        while self.rx.try_recv().is_ok() {}
        let mut outcome = outcome;
        if outcome.is_ok() {
            // Orderly: running jobs may finish (their intents are durable either way), and
            // a job that does is applied and answered like any other, so its caller does
            // not hear `Stopped` for a change that was made. Queued jobs never start; their
            // callers hear `Stopped`. A fatal error meanwhile ends the worker with it.
            for lane in self.lanes.values_mut() {
                lane.queue.clear();
            }
            self.gate.parked.clear();
            let grace = self.ctx.cfg.shutdown_grace;
            let drain = async {
                while let Some(joined) = self.tasks.join_next().await {
                    let done = joined.map_err(|e| {
                        tracing::error!(error = %e, "a volume job panicked during shutdown");
                        VolumeError::Stopped
                    })?;
                    if let Some(fatal) = self.on_done(done) {
                        tracing::error!(error = %fatal, "fatal volume manager error during shutdown");
                        return Err(fatal);
                    }
                }
                Ok(())
            };
            match tokio::time::timeout(grace, drain).await {
                Ok(result) => outcome = result,
                Err(_) => {
                    tracing::warn!(?grace, "volume jobs did not finish in time; aborting them");
                }
            }
        }
        self.tasks.shutdown().await;
        self.ready_tx.send_replace(Readiness::Stopped);
        outcome
    }

    /// Loads the state, maps it to this boot and the mount table, and queues the
    /// recovery jobs.
    async fn start(&mut self) -> Result<(), VolumeError> {
        let store = &self.ctx.store;
        let records: Vec<VolumeRecord> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let intents: Vec<CreateVolume> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let cfg = &self.ctx.cfg;
        let mut report = RecoveryReport {
            volumes: records.len(),
            ..RecoveryReport::default()
        };
        let mounts = cfg.mounts.mounts_under(cfg.mount_paths.root());
        if let Err(e) = &mounts {
            report.warnings.push(format!(
                "mount table unreadable, mounts not reconciled: {e}"
            ));
        }
        let mut changed = Vec::new();
        let mut jobs = Vec::new();
        for stored in records {
            let (mut rec, _) = stored.recover(&cfg.boot_id);
            let rebooted = rec.state != stored.state;
            if rebooted {
                report.rebooted += 1;
                // The mounts are gone, but the plugin may still hold its own record of
                // the staging or publication (slrp-csi-local does): undo them through
                // the plugin (idempotent in CSI) instead of only forgetting them.
                if let Some(state) = undo_after_reboot(&stored.state, &cfg.boot_id) {
                    rec.state = state;
                }
            } else if let Ok(mounts) = &mounts
                && reconcile_mounts(&mut rec, cfg, mounts)
            {
                report.mount_mismatches += 1;
            }
            if rec != stored {
                changed.push(rec.clone());
            }
            let goal = if rebooted && !rec.deleting {
                Some(RecoveryGoal::AfterReboot {
                    republish: rec.node_publish_required,
                })
            } else {
                recovery_goal(&rec)
            };
            if let Some(goal) = goal {
                jobs.push((Key::Volume(rec.id.clone()), Job::Recover { goal }));
            }
            if let Some(name) = &rec.name {
                self.names.insert(name.clone(), rec.id.clone());
            }
            self.volumes.insert(rec.id.clone(), rec);
        }
        if !changed.is_empty() {
            let mut tx = store.transaction();
            for rec in &changed {
                tx.put(rec).map_err(|source| VolumeError::Store {
                    volume: rec.id.to_string(),
                    source,
                })?;
            }
            tx.commit().await.map_err(|source| VolumeError::Store {
                volume: format!("{} recovered volumes", changed.len()),
                source,
            })?;
        }
        for intent in intents {
            report.intents += 1;
            jobs.push((
                Key::Name(intent.name.clone()),
                Job::Create {
                    req: intent,
                    reply: None,
                },
            ));
        }
        match self.untracked_dirs().await {
            Ok(dirs) => {
                for (id, dir) in dirs {
                    jobs.push((Key::Volume(id), Job::Collect { dir }));
                }
            }
            Err(e) => report
                .warnings
                .push(format!("mount root not scanned for leftovers: {e}")),
        }
        report.jobs = jobs.len();
        tracing::info!(
            volumes = report.volumes,
            rebooted = report.rebooted,
            mount_mismatches = report.mount_mismatches,
            jobs = report.jobs,
            "volume state loaded"
        );
        self.recovery = Some(RecoveryProgress {
            pending: jobs.len(),
            report,
            failures: Vec::new(),
        });
        for (key, job) in jobs {
            self.enqueue(key, job);
        }
        self.maybe_ready();
        Ok(())
    }

    /// Mount directories whose volume is not tracked.
    async fn untracked_dirs(&self) -> std::io::Result<Vec<(VolumeId, PathBuf)>> {
        let root = self.ctx.cfg.mount_paths.root().to_owned();
        let names = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<_>> {
            match std::fs::read_dir(&root) {
                Ok(rd) => rd.map(|e| e.map(|e| (e.file_name(), e.path()))).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        })
        .await
        .map_err(std::io::Error::other)??;
        let mut out = Vec::new();
        for (name, path) in names {
            let decoded = name.to_str().map(decode_volume_id);
            match decoded {
                Some(Ok(id)) => {
                    let id = VolumeId::new(id);
                    if !self.volumes.contains_key(&id) {
                        out.push((id, path));
                    }
                }
                // Not ours to touch: Mesos fails recovery here; we leave it alone.
                Some(Err(_)) | None => {
                    tracing::warn!(path = %path.display(), "not an encoded volume id; left alone");
                }
            }
        }
        Ok(out)
    }

    fn maybe_ready(&mut self) {
        if let Some(p) = &self.recovery
            && p.pending == 0
            && let Some(p) = self.recovery.take()
        {
            if p.failures.is_empty() {
                tracing::info!(report = ?p.report, "volume recovery done");
                self.ready_tx.send_replace(Readiness::Ready(p.report));
            } else {
                tracing::error!(failures = ?p.failures, "volume recovery failed");
                self.ready_tx.send_replace(Readiness::Failed(p.failures));
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Job(key, job) => self.enqueue(key, job),
            Command::List {
                max_entries,
                token,
                reply,
            } => {
                let ctx = self.ctx.clone();
                self.tasks.spawn(async move {
                    let result = ctx.list(max_entries, token.as_deref()).await;
                    Done::plain(Box::new(move || {
                        let _ = reply.send(result);
                    }))
                });
            }
            Command::Capacity {
                capability,
                parameters,
                reply,
            } => {
                let ctx = self.ctx.clone();
                self.tasks.spawn(async move {
                    let result = ctx.capacity(capability, parameters).await;
                    Done::plain(Box::new(move || {
                        let _ = reply.send(result);
                    }))
                });
            }
            Command::Snapshot { reply } => {
                let mut all: Vec<VolumeRecord> = self.volumes.values().cloned().collect();
                all.sort_by(|a, b| a.id.cmp(&b.id));
                let _ = reply.send(Ok(all));
            }
            Command::Jobs { reply } => {
                let busy = self.lanes.values().filter(|l| l.busy).count();
                let parked = self.gate.parked.len();
                let _ = reply.send(Ok(JobCounts {
                    running: busy.saturating_sub(parked),
                    creating: self.gate.creates,
                    parked,
                    queued: self.lanes.values().map(|l| l.queue.len()).sum(),
                }));
            }
        }
    }

    fn enqueue(&mut self, key: Key, job: Job) {
        self.lanes
            .entry(key.clone())
            .or_default()
            .queue
            .push_back(job);
        self.maybe_start(&key);
    }

    fn maybe_start(&mut self, key: &Key) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        if lane.busy {
            return;
        }
        let Some(job) = lane.queue.pop_front() else {
            self.lanes.remove(key);
            return;
        };
        lane.busy = true;
        let class = self.classify(key, &job);
        if self.gate.admits(class, !self.gate.parked.is_empty()) {
            self.start_job(key.clone(), job, class);
        } else {
            tracing::debug!(job = job.name(), %key, ?class, "parked until the other class drains");
            self.gate.parked.push_back((key.clone(), job));
        }
    }

    /// See [`Gate`]. Classified when the job is about to start, since what is tracked
    /// changes while it waits.
    fn classify(&self, key: &Key, job: &Job) -> Class {
        match (key, job) {
            (Key::Name(name), Job::Create { .. }) if !self.names.contains_key(name) => {
                Class::Create
            }
            (Key::Volume(id), _) if !self.volumes.contains_key(id) => Class::Untracked,
            (Key::Name(_) | Key::Volume(_), _) => Class::Free,
        }
    }

    /// Starts parked jobs that the gate admits now, in arrival order: the first one that
    /// must still wait keeps every later conflicting one waiting too (fairness).
    fn unpark(&mut self) {
        let mut waiting = VecDeque::new();
        while let Some((key, job)) = self.gate.parked.pop_front() {
            let class = self.classify(&key, &job);
            if self.gate.admits(class, !waiting.is_empty()) {
                self.start_job(key, job, class);
            } else {
                waiting.push_back((key, job));
            }
        }
        self.gate.parked = waiting;
    }

    /// Spawns a job whose lane is already marked busy.
    fn start_job(&mut self, key: Key, job: Job, class: Class) {
        self.gate.enter(class);
        let record = match &key {
            Key::Volume(id) => self.volumes.get(id).cloned(),
            Key::Name(name) => self
                .names
                .get(name)
                .and_then(|id| self.volumes.get(id))
                .cloned(),
        };
        let ctx = self.ctx.clone();
        let span = tracing::info_span!(parent: None, "volume_job", job = job.name(), %key);
        self.tasks
            .spawn(async move { ctx.run_job(key, class, job, record).await }.instrument(span));
    }

    /// Applies a finished job; returns a fatal error if there was one.
    fn on_done(&mut self, done: Done) -> Option<VolumeError> {
        match done.change {
            Change::None => {}
            Change::Put(rec) => {
                if let Some(name) = &rec.name {
                    self.names.insert(name.clone(), rec.id.clone());
                }
                self.volumes.insert(rec.id.clone(), *rec);
            }
            Change::Remove(id) => {
                if let Some(rec) = self.volumes.remove(&id)
                    && let Some(name) = rec.name
                {
                    self.names.remove(&name);
                }
            }
        }
        (done.answer)();
        if let Some(fatal) = done.fatal {
            return Some(fatal);
        }
        // The change is applied: jobs parked behind this one now see it.
        self.gate.leave(done.class);
        if done.class != Class::Free {
            self.unpark();
        }
        if let Some(result) = done.recovery
            && let Some(p) = &mut self.recovery
        {
            p.pending = p.pending.saturating_sub(1);
            match result {
                RecoveryResult::Done => {}
                RecoveryResult::Collected => p.report.collected += 1,
                RecoveryResult::Warning(w) => p.report.warnings.push(w),
                RecoveryResult::Failed(f) => p.failures.push(f),
            }
        }
        if let Some(key) = done.key {
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.busy = false;
            }
            self.maybe_start(&key);
        }
        self.maybe_ready();
        None
    }
}

/// After a reboot: the in-flight undo state that cleans up what the plugin may still
/// record for a volume that was staged or published in an earlier boot.
fn undo_after_reboot(stored: &VolumeState, now: &BootId) -> Option<VolumeState> {
    let publish_context = stored.publish_context()?.clone();
    let boot_id = now.clone();
    match stored {
        VolumeState::Published { .. }
        | VolumeState::NodePublishing { .. }
        | VolumeState::NodeUnpublishing { .. } => Some(VolumeState::NodeUnpublishing {
            boot_id,
            publish_context,
        }),
        VolumeState::VolReady { .. }
        | VolumeState::NodeStaging { .. }
        | VolumeState::NodeUnstaging { .. } => Some(VolumeState::NodeUnstaging {
            boot_id,
            publish_context,
        }),
        VolumeState::Created
        | VolumeState::ControllerPublishing
        | VolumeState::NodeReady { .. }
        | VolumeState::ControllerUnpublishing => None,
    }
}

/// The goal recovery drives a (recovered) record to, if any.
fn recovery_goal(rec: &VolumeRecord) -> Option<RecoveryGoal> {
    if rec.deleting {
        return Some(RecoveryGoal::Delete);
    }
    if rec.node_publish_required {
        return Some(RecoveryGoal::Republish);
    }
    // Finish the interrupted call in its own direction.
    rec.state.in_flight_call().map(|call| {
        RecoveryGoal::Reach(match call {
            CsiCall::ControllerPublish | CsiCall::NodeUnstage => Goal::NodeReady,
            CsiCall::ControllerUnpublish => Goal::Created,
            CsiCall::NodeStage | CsiCall::NodeUnpublish => Goal::VolReady,
            CsiCall::NodePublish => Goal::Published,
        })
    })
}

/// Compares a record with the mount table (same boot only; after a reboot nothing is
/// mounted and [`VolumeRecord::recover`] already reset the state). Returns whether the
/// record was changed to re-drive a call.
fn reconcile_mounts(rec: &mut VolumeRecord, cfg: &VolumeManagerConfig, mounts: &[PathBuf]) -> bool {
    let Ok(target) = cfg.mount_paths.target(&rec.id) else {
        return false;
    };
    let target_mounted = mounts.iter().any(|m| m == &target);
    let next = match &rec.state {
        // Published, but the target is gone (unmounted behind our back): publish again.
        VolumeState::Published {
            boot_id,
            publish_context,
        } if !target_mounted => VolumeState::NodePublishing {
            boot_id: boot_id.clone(),
            publish_context: publish_context.clone(),
        },
        // Not published, but something is mounted at the target: a publish whose
        // record was lost (or a stray mount). NodeUnpublish is idempotent.
        VolumeState::VolReady {
            boot_id,
            publish_context,
        } if target_mounted => VolumeState::NodeUnpublishing {
            boot_id: boot_id.clone(),
            publish_context: publish_context.clone(),
        },
        VolumeState::Created
        | VolumeState::ControllerPublishing
        | VolumeState::NodeReady { .. }
        | VolumeState::ControllerUnpublishing
        | VolumeState::NodeStaging { .. }
        | VolumeState::VolReady { .. }
        | VolumeState::NodePublishing { .. }
        | VolumeState::Published { .. }
        | VolumeState::NodeUnpublishing { .. }
        | VolumeState::NodeUnstaging { .. } => {
            if target_mounted
                && matches!(
                    rec.state,
                    VolumeState::Created | VolumeState::NodeReady { .. }
                )
            {
                tracing::warn!(volume = %rec.id, target = %target.display(),
                    "target is mounted although the volume is not staged; left alone");
            }
            return false;
        }
    };
    tracing::warn!(volume = %rec.id, state = %rec.state.name(), target_mounted,
        "mount table disagrees with the volume state; re-driving");
    rec.state = next;
    true
}

// === the jobs ===

struct Ctx<C> {
    csi: Arc<C>,
    store: Store,
    cfg: VolumeManagerConfig,
    permits: Arc<Semaphore>,
}

/// A built request for one transition RPC (built before the intent is committed, so a
/// missing secret fails without changing anything).
enum Request {
    ControllerPublish(ControllerPublishRequest),
    ControllerUnpublish,
    NodeStage(NodeStageRequest),
    NodeUnstage(String),
    NodePublish(NodePublishRequest),
    NodeUnpublish(String),
}

fn path_str(id: &VolumeId, p: &Path) -> Result<String, VolumeError> {
    p.to_str()
        .map(str::to_owned)
        .ok_or_else(|| VolumeError::InvalidRequest {
            what: format!("mount path of volume {id} is not UTF-8"),
        })
}

fn is_already_done(e: &CsiError) -> bool {
    e.retry_class() == RetryClass::AlreadyDone
}

impl<C: CsiVolumes> Ctx<C> {
    async fn run_job(
        self: Arc<Self>,
        key: Key,
        class: Class,
        job: Job,
        record: Option<VolumeRecord>,
    ) -> Done {
        // The semaphore is never closed; if it were, the job simply runs unlimited.
        let _permit = self.permits.clone().acquire_owned().await.ok();
        let recovery = job.is_recovery();
        let (change, answer, fatal, result) = match job {
            Job::Create { req, reply } => {
                let (result, change) = self.create(req, record).await;
                // A permanent refusal dropped the intent: nothing left to recover.
                let permanent = matches!(&result, Err(VolumeError::Csi { source, .. })
                    if source.retry_class() == RetryClass::Permanent);
                let summary = recovery_summary(&result, !permanent);
                let (answer, fatal) = settle(reply, result);
                (change, answer, fatal, summary)
            }
            Job::Validate { req, reply } => {
                let (result, change) = self.validate(req, record).await;
                let (answer, fatal) = settle(Some(reply), result);
                (change, answer, fatal, RecoveryResult::Done)
            }
            Job::Delete { reply } => {
                let (result, change) = self.delete(&key.volume_id(), record).await;
                let summary = recovery_summary(&result, false);
                let (answer, fatal) = settle(reply, result);
                (change, answer, fatal, summary)
            }
            Job::Publish { reply } => {
                let (result, change) = self.publish(&key, record).await;
                let (answer, fatal) = settle(Some(reply), result);
                (change, answer, fatal, RecoveryResult::Done)
            }
            Job::Unpublish { reply } => {
                let (result, change) = self.unpublish(record).await;
                let (answer, fatal) = settle(Some(reply), result);
                (change, answer, fatal, RecoveryResult::Done)
            }
            Job::Recover { goal } => {
                let (result, change) = self.recover(&key, goal, record).await;
                let required = matches!(
                    goal,
                    RecoveryGoal::Republish | RecoveryGoal::AfterReboot { republish: true }
                );
                let summary = recovery_summary(&result, required);
                let (_, fatal) = settle::<()>(None, result.map(|_| ()));
                (
                    change,
                    Box::new(|| {}) as Box<dyn FnOnce() + Send>,
                    fatal,
                    summary,
                )
            }
            Job::Collect { dir } => {
                let result = self.collect(&key, &dir).await;
                let summary = match &result {
                    Ok(true) => RecoveryResult::Collected,
                    Ok(false) => RecoveryResult::Warning(format!(
                        "{} is still mounted; left in place",
                        dir.display()
                    )),
                    Err(_) => recovery_summary(&result, false),
                };
                let (_, fatal) = settle::<()>(None, result.map(|_| ()));
                (
                    Change::None,
                    Box::new(|| {}) as Box<dyn FnOnce() + Send>,
                    fatal,
                    summary,
                )
            }
        };
        Done {
            key: Some(key),
            class,
            change,
            answer,
            fatal,
            recovery: recovery.then_some(result),
        }
    }

    async fn persist(&self, rec: &VolumeRecord) -> Result<(), VolumeError> {
        let store_err = |source| VolumeError::Store {
            volume: rec.id.to_string(),
            source,
        };
        let mut tx = self.store.transaction();
        tx.put(rec).map_err(store_err)?;
        tx.commit().await.map_err(store_err)
    }

    /// Moves `rec` towards `goal`; `rec` always equals what is durable (or, after a
    /// fatal error, what may be).
    async fn drive(&self, rec: &mut VolumeRecord, goal: Goal) -> Result<(), VolumeError> {
        let (caps, boot) = (&self.cfg.caps, &self.cfg.boot_id);
        // Each round settles one call; the chain has at most three calls in one
        // direction after finishing one undo, so this bound only stops a planning bug.
        for _ in 0..16 {
            let (planned, call) = rec.next_call(goal, caps, boot);
            let Some(call) = call else {
                if planned != *rec {
                    // Only in-memory no-ops led here: make them durable too, so that
                    // memory and disk never disagree.
                    self.persist(&planned).await?;
                    *rec = planned;
                }
                return Ok(());
            };
            let request = self.request(call, &planned)?;
            self.prepare(call, &planned.id).await?;
            let in_flight =
                planned
                    .begin(call, boot)
                    .map_err(|source| VolumeError::Transition {
                        id: planned.id.clone(),
                        state: planned.state.name(),
                        source,
                    })?;
            if in_flight != *rec {
                self.persist(&in_flight).await?;
                *rec = in_flight;
            }
            injected(failpoints::BEFORE_CALL)?;
            let result = self.send(&rec.id, request).await;
            injected(failpoints::AFTER_CALL)?;
            let publish_context = match result {
                Ok(pc) => pc,
                Err(e) if !call.is_forward() && is_already_done(&e) => StringMap::new(),
                Err(source) => {
                    tracing::warn!(volume = %rec.id, rpc = %call, error = %source,
                        "CSI call failed; the volume stays in flight");
                    return Err(VolumeError::Csi {
                        rpc: call.rpc(),
                        volume: rec.id.to_string(),
                        source,
                    });
                }
            };
            let done = rec
                .finish(call, CallOutcome::Succeeded { publish_context })
                .map_err(|source| VolumeError::Transition {
                    id: rec.id.clone(),
                    state: rec.state.name(),
                    source,
                })?;
            self.persist(&done).await?;
            tracing::debug!(volume = %done.id, state = %done.state.name(), "volume moved");
            *rec = done;
        }
        Err(VolumeError::InvalidRequest {
            what: format!("volume {} did not reach {goal:?}", rec.id),
        })
    }

    fn secrets(
        &self,
        id: &VolumeId,
        refs: &BTreeMap<String, SecretRef>,
    ) -> Result<Secrets, VolumeError> {
        let mut out = StringMap::new();
        for (csi_key, r) in refs {
            let value = self
                .cfg
                .secrets
                .resolve(r)
                .ok_or_else(|| VolumeError::Secret {
                    id: id.clone(),
                    name: r.name.clone(),
                    key: r.key.clone(),
                })?;
            out.insert(csi_key.clone(), value);
        }
        Ok(Secrets::new(out))
    }

    fn request(&self, call: CsiCall, rec: &VolumeRecord) -> Result<Request, VolumeError> {
        let id = &rec.id;
        let spec = &rec.spec;
        let paths = &self.cfg.mount_paths;
        let path_err = |source| VolumeError::Path {
            id: id.clone(),
            source,
        };
        let publish_context = rec.state.publish_context().cloned().unwrap_or_default();
        Ok(match call {
            CsiCall::ControllerPublish => Request::ControllerPublish(ControllerPublishRequest {
                volume_id: id.clone(),
                node_id: self.cfg.node_id.clone(),
                capability: spec.capability.clone(),
                readonly: spec.readonly,
                volume_context: spec.volume_context.clone(),
                secrets: Secrets::default(),
            }),
            CsiCall::ControllerUnpublish => Request::ControllerUnpublish,
            CsiCall::NodeStage => Request::NodeStage(NodeStageRequest {
                volume_id: id.clone(),
                publish_context,
                staging_target_path: path_str(id, &paths.staging(id).map_err(path_err)?)?,
                capability: spec.capability.clone(),
                volume_context: spec.volume_context.clone(),
                secrets: self.secrets(id, &spec.node_stage_secrets)?,
            }),
            CsiCall::NodeUnstage => {
                Request::NodeUnstage(path_str(id, &paths.staging(id).map_err(path_err)?)?)
            }
            CsiCall::NodePublish => Request::NodePublish(NodePublishRequest {
                volume_id: id.clone(),
                publish_context,
                staging_target_path: if self.cfg.caps.node_stage() {
                    Some(path_str(id, &paths.staging(id).map_err(path_err)?)?)
                } else {
                    None
                },
                target_path: path_str(id, &paths.target(id).map_err(path_err)?)?,
                capability: spec.capability.clone(),
                readonly: spec.readonly,
                volume_context: spec.volume_context.clone(),
                secrets: self.secrets(id, &spec.node_publish_secrets)?,
            }),
            CsiCall::NodeUnpublish => {
                Request::NodeUnpublish(path_str(id, &paths.target(id).map_err(path_err)?)?)
            }
        })
    }

    /// Creates the directories a call needs (CSI: the CO creates the staging path and
    /// the target's parent).
    async fn prepare(&self, call: CsiCall, id: &VolumeId) -> Result<(), VolumeError> {
        let paths = &self.cfg.mount_paths;
        let path_err = |source| VolumeError::Path {
            id: id.clone(),
            source,
        };
        let dir = match call {
            CsiCall::NodeStage => paths.staging(id).map_err(path_err)?,
            CsiCall::NodePublish if self.cfg.create_target_dir => {
                paths.target(id).map_err(path_err)?
            }
            CsiCall::NodePublish => paths.volume_dir(id).map_err(path_err)?,
            CsiCall::ControllerPublish
            | CsiCall::ControllerUnpublish
            | CsiCall::NodeUnstage
            | CsiCall::NodeUnpublish => return Ok(()),
        };
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|source| VolumeError::Prepare { path: dir, source })
    }

    async fn send(&self, id: &VolumeId, request: Request) -> Result<StringMap, CsiError> {
        let csi = &self.csi;
        match request {
            Request::ControllerPublish(r) => csi.controller_publish(&r).await,
            Request::ControllerUnpublish => csi
                .controller_unpublish(id, &self.cfg.node_id)
                .await
                .map(|()| StringMap::new()),
            Request::NodeStage(r) => csi.node_stage(&r).await.map(|()| StringMap::new()),
            Request::NodeUnstage(p) => csi.node_unstage(id, &p).await.map(|()| StringMap::new()),
            Request::NodePublish(r) => csi.node_publish(&r).await.map(|()| StringMap::new()),
            Request::NodeUnpublish(p) => {
                csi.node_unpublish(id, &p).await.map(|()| StringMap::new())
            }
        }
    }

    async fn create(
        &self,
        req: CreateVolume,
        existing: Option<VolumeRecord>,
    ) -> (Result<VolumeInfo, VolumeError>, Change) {
        if let Some(rec) = existing {
            // Already tracked under this name: the earlier attempt's result (spec §12.7).
            let result = if rec.spec.capability != req.capability {
                Err(VolumeError::Mismatch {
                    id: rec.id.clone(),
                    what: "capability",
                })
            } else if rec.spec.parameters != req.parameters {
                Err(VolumeError::Mismatch {
                    id: rec.id.clone(),
                    what: "parameters",
                })
            } else {
                Ok(VolumeInfo::of(&rec))
            };
            return (result, Change::None);
        }
        match self.create_steps(&req).await {
            Ok(rec) => (Ok(VolumeInfo::of(&rec)), Change::Put(Box::new(rec))),
            Err(e) => (Err(e), Change::None),
        }
    }

    async fn create_steps(&self, req: &CreateVolume) -> Result<VolumeRecord, VolumeError> {
        if !self.cfg.caps.controller.create_delete_volume {
            return Err(VolumeError::Unsupported {
                what: "CREATE_DELETE_VOLUME",
            });
        }
        let store_err = |source| VolumeError::Store {
            volume: req.name.clone(),
            source,
        };
        // Intent first: after a crash, recovery finds the name and finishes the creation.
        let mut tx = self.store.transaction();
        tx.put(req).map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        injected(failpoints::BEFORE_CALL)?;
        let result = self
            .csi
            .create_volume(&CreateVolumeRequest {
                name: req.name.clone(),
                required_bytes: req.required_bytes,
                limit_bytes: req.limit_bytes,
                capabilities: vec![req.capability.clone()],
                parameters: req.parameters.clone(),
                secrets: Secrets::default(),
            })
            .await;
        injected(failpoints::AFTER_CALL)?;
        let volume = match result {
            Ok(v) => v,
            Err(source) => {
                // A permanent refusal created nothing (a replay with the same name would
                // have returned the earlier volume), so the intent can go. After a
                // transient failure the volume may exist: the intent stays for recovery.
                if source.retry_class() == RetryClass::Permanent {
                    let mut tx = self.store.transaction();
                    tx.delete::<CreateVolume>(&req.name).map_err(store_err)?;
                    tx.commit().await.map_err(store_err)?;
                }
                return Err(VolumeError::Csi {
                    rpc: CsiRpc::CreateVolume,
                    volume: req.name.clone(),
                    source,
                });
            }
        };
        // Spec §4.8: an id that is already tracked (validated, or created under another
        // name) is a failure, never a reason to overwrite that volume's record. The intent
        // goes: a replay would get the same answer. Memory equals disk, and the volume's
        // own lane is not this one, so the store is where to look.
        let tracked: Option<VolumeRecord> = self
            .store
            .get(volume.volume_id.as_str())
            .await
            .map_err(store_err)?;
        if let Some(other) = tracked
            && other.name.as_deref() != Some(req.name.as_str())
        {
            let mut tx = self.store.transaction();
            tx.delete::<CreateVolume>(&req.name).map_err(store_err)?;
            tx.commit().await.map_err(store_err)?;
            tracing::warn!(volume = %other.id, name = %req.name,
                "CreateVolume returned a volume that is already tracked");
            return Err(VolumeError::Mismatch {
                id: other.id,
                what: "name",
            });
        }
        let mut rec = VolumeRecord::created(
            volume.volume_id,
            Some(req.name.clone()),
            VolumeSpec {
                capability: req.capability.clone(),
                parameters: req.parameters.clone(),
                volume_context: volume.volume_context,
                readonly: is_read_only(&req.capability),
                pre_provisioned: false,
                node_stage_secrets: Default::default(),
                node_publish_secrets: Default::default(),
            },
        );
        // Mesos keeps the requested size (§12.28); the plugin's answer is the truth.
        rec.capacity_bytes = if volume.capacity_bytes > 0 {
            volume.capacity_bytes
        } else {
            req.required_bytes
        };
        let mut tx = self.store.transaction();
        tx.put(&rec)
            .map_err(store_err)?
            .delete::<CreateVolume>(&req.name)
            .map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        tracing::info!(volume = %rec.id, name = %req.name, "volume created");
        Ok(rec)
    }

    async fn validate(
        &self,
        req: ValidateVolume,
        existing: Option<VolumeRecord>,
    ) -> (Result<VolumeInfo, VolumeError>, Change) {
        if let Some(rec) = existing {
            let result = if rec.spec.capability != req.capability {
                Err(VolumeError::Mismatch {
                    id: rec.id.clone(),
                    what: "capability",
                })
            } else if rec.spec.parameters != req.parameters {
                Err(VolumeError::Mismatch {
                    id: rec.id.clone(),
                    what: "parameters",
                })
            } else {
                Ok(VolumeInfo::of(&rec))
            };
            return (result, Change::None);
        }
        let validation = self
            .csi
            .validate(&ValidateRequest {
                volume_id: req.id.clone(),
                capabilities: vec![req.capability.clone()],
                volume_context: req.volume_context.clone(),
                parameters: req.parameters.clone(),
            })
            .await;
        let result = match validation {
            Err(source) => Err(VolumeError::Csi {
                rpc: CsiRpc::ValidateVolumeCapabilities,
                volume: req.id.to_string(),
                source,
            }),
            Ok(v) if !v.confirmed => Err(VolumeError::NotConfirmed {
                id: req.id.clone(),
                message: v.message,
            }),
            Ok(_) => {
                let mut rec = VolumeRecord::created(
                    req.id.clone(),
                    None,
                    VolumeSpec {
                        readonly: is_read_only(&req.capability),
                        capability: req.capability,
                        parameters: req.parameters,
                        volume_context: req.volume_context,
                        pre_provisioned: true,
                        node_stage_secrets: req.node_stage_secrets,
                        node_publish_secrets: req.node_publish_secrets,
                    },
                );
                rec.capacity_bytes = req.capacity_bytes;
                match self.persist(&rec).await {
                    Ok(()) => return (Ok(VolumeInfo::of(&rec)), Change::Put(Box::new(rec))),
                    Err(e) => Err(e),
                }
            }
        };
        (result, Change::None)
    }

    async fn delete(
        &self,
        id: &VolumeId,
        record: Option<VolumeRecord>,
    ) -> (Result<bool, VolumeError>, Change) {
        let Some(mut rec) = record else {
            // Untracked (e.g. listed by the plugin but never validated): only the RPC.
            return (self.delete_rpc(id).await, Change::None);
        };
        match self.delete_steps(&mut rec).await {
            Ok(deprovisioned) => (Ok(deprovisioned), Change::Remove(rec.id)),
            Err(e) => (Err(e), Change::Put(Box::new(rec))),
        }
    }

    async fn delete_rpc(&self, id: &VolumeId) -> Result<bool, VolumeError> {
        if !self.cfg.caps.controller.create_delete_volume {
            return Ok(false);
        }
        injected(failpoints::BEFORE_CALL)?;
        let result = self.csi.delete_volume(id, &Secrets::default()).await;
        injected(failpoints::AFTER_CALL)?;
        match result {
            Ok(()) => Ok(true),
            // CSI: deleting a volume that does not exist succeeds (fixes spec §12.22).
            Err(e) if is_already_done(&e) => Ok(true),
            Err(source) => Err(VolumeError::Csi {
                rpc: CsiRpc::DeleteVolume,
                volume: id.to_string(),
                source,
            }),
        }
    }

    async fn delete_steps(&self, rec: &mut VolumeRecord) -> Result<bool, VolumeError> {
        if !rec.deleting || rec.node_publish_required {
            // Durable before the first step, so that recovery finishes the deletion
            // instead of publishing the volume again.
            let mut marked = rec.clone();
            marked.deleting = true;
            marked.node_publish_required = false;
            self.persist(&marked).await?;
            *rec = marked;
        }
        self.drive(rec, Goal::Created).await?;
        let deprovisioned = self.delete_rpc(&rec.id).await?;
        if let Ok(dir) = self.cfg.mount_paths.volume_dir(&rec.id)
            && !self.remove_if_unmounted(&dir).await
        {
            tracing::warn!(volume = %rec.id, dir = %dir.display(),
                "mount directory still has mounts; left in place");
        }
        let store_err = |source| VolumeError::Store {
            volume: rec.id.to_string(),
            source,
        };
        let mut tx = self.store.transaction();
        tx.delete::<VolumeRecord>(rec.id.as_str())
            .map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        tracing::info!(volume = %rec.id, deprovisioned, "volume deleted");
        Ok(deprovisioned)
    }

    /// Removes a volume's mount directory unless something is mounted at or below it (or
    /// the mount table cannot tell). Returns whether `dir` is gone.
    ///
    /// Never recursive: only the `staging` and `target` entries the manager creates are
    /// removed, and only when empty, then `dir` itself. `rmdir` fails on a mount point
    /// (EBUSY) and on a non-empty directory, so a mount the table did not show (made after
    /// the check, or in another namespace) or files someone wrote into a bare target are
    /// left for a person to look at rather than deleted. Mesos removes recursively.
    async fn remove_if_unmounted(&self, dir: &Path) -> bool {
        match self.cfg.mounts.mounts_under(dir) {
            Ok(m) if m.is_empty() => {}
            Ok(_) | Err(_) => return false,
        }
        match remove_mount_dir(dir).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e,
                    "mount directory not removed; left in place");
                false
            }
        }
    }

    async fn publish(
        &self,
        key: &Key,
        record: Option<VolumeRecord>,
    ) -> (Result<PathBuf, VolumeError>, Change) {
        let Some(mut rec) = record else {
            let id = key.volume_id();
            return (Err(VolumeError::UnknownVolume { id }), Change::None);
        };
        if rec.deleting {
            let what = format!("volume {} is being deleted", rec.id);
            return (Err(VolumeError::InvalidRequest { what }), Change::None);
        }
        let result = match self.drive(&mut rec, Goal::Published).await {
            Ok(()) => self
                .cfg
                .mount_paths
                .target(&rec.id)
                .map_err(|source| VolumeError::Path {
                    id: rec.id.clone(),
                    source,
                }),
            Err(e) => Err(e),
        };
        (result, Change::Put(Box::new(rec)))
    }

    async fn unpublish(&self, record: Option<VolumeRecord>) -> (Result<(), VolumeError>, Change) {
        let Some(mut rec) = record else {
            // Mesos: unpublishing an unknown volume is a no-op.
            return (Ok(()), Change::None);
        };
        if rec.node_publish_required {
            // Durable with (before) the first step: recovery must not publish it again.
            let mut cleared = rec.clone();
            cleared.node_publish_required = false;
            if let Err(e) = self.persist(&cleared).await {
                return (Err(e), Change::Put(Box::new(rec)));
            }
            rec = cleared;
        }
        // Back to NODE_READY, never forward: a volume that is not attached stays so, and
        // an interrupted attach is undone.
        let goal = match rec.state {
            VolumeState::Created => return (Ok(()), Change::Put(Box::new(rec))),
            VolumeState::ControllerPublishing | VolumeState::ControllerUnpublishing => {
                Goal::Created
            }
            VolumeState::NodeReady { .. }
            | VolumeState::NodeStaging { .. }
            | VolumeState::VolReady { .. }
            | VolumeState::NodePublishing { .. }
            | VolumeState::Published { .. }
            | VolumeState::NodeUnpublishing { .. }
            | VolumeState::NodeUnstaging { .. } => Goal::NodeReady,
        };
        let result = self.drive(&mut rec, goal).await;
        (result, Change::Put(Box::new(rec)))
    }

    async fn recover(
        &self,
        key: &Key,
        goal: RecoveryGoal,
        record: Option<VolumeRecord>,
    ) -> (Result<(), VolumeError>, Change) {
        let Some(mut rec) = record else {
            let what = format!("{key} vanished before recovery");
            return (Err(VolumeError::InvalidRequest { what }), Change::None);
        };
        match goal {
            RecoveryGoal::Delete => match self.delete_steps(&mut rec).await {
                Ok(_) => (Ok(()), Change::Remove(rec.id)),
                Err(e) => (Err(e), Change::Put(Box::new(rec))),
            },
            RecoveryGoal::Republish => {
                let result = self.drive(&mut rec, Goal::Published).await;
                (result, Change::Put(Box::new(rec)))
            }
            RecoveryGoal::AfterReboot { republish } => {
                let mut result = self.drive(&mut rec, Goal::NodeReady).await;
                if result.is_ok() && republish {
                    result = self.drive(&mut rec, Goal::Published).await;
                }
                (result, Change::Put(Box::new(rec)))
            }
            RecoveryGoal::Reach(goal) => {
                let result = self.drive(&mut rec, goal).await;
                (result, Change::Put(Box::new(rec)))
            }
        }
    }

    /// Cleans up the mount directory of an untracked volume: unpublishes and unstages
    /// whatever is still mounted there (both idempotent), then removes the directory if
    /// nothing is mounted any more. Returns whether it is gone.
    async fn collect(&self, key: &Key, dir: &Path) -> Result<bool, VolumeError> {
        let Key::Volume(id) = key else {
            return Ok(false);
        };
        let mounted = match self.cfg.mounts.mounts_under(dir) {
            Ok(m) => m,
            Err(_) => return Ok(false),
        };
        if !mounted.is_empty() {
            let target = dir.join("target");
            let staging = dir.join("staging");
            if mounted.iter().any(|m| m == &target) {
                let p = path_str(id, &target)?;
                if let Err(e) = self.csi.node_unpublish(id, &p).await
                    && !is_already_done(&e)
                {
                    tracing::warn!(volume = %id, error = %e, "NodeUnpublishVolume of a leftover failed");
                }
            }
            if self.cfg.caps.node_stage() && mounted.iter().any(|m| m == &staging) {
                let p = path_str(id, &staging)?;
                if let Err(e) = self.csi.node_unstage(id, &p).await
                    && !is_already_done(&e)
                {
                    tracing::warn!(volume = %id, error = %e, "NodeUnstageVolume of a leftover failed");
                }
            }
        }
        Ok(self.remove_if_unmounted(dir).await)
    }

    async fn list(&self, max_entries: i32, token: Option<&str>) -> Result<VolumePage, VolumeError> {
        if !self.cfg.caps.controller.list_volumes {
            return Ok(VolumePage {
                volumes: Vec::new(),
                next_token: None,
            });
        }
        self.csi
            .list_volumes_page(max_entries, token)
            .await
            .map_err(|source| VolumeError::Csi {
                rpc: CsiRpc::ListVolumes,
                volume: String::new(),
                source,
            })
    }

    async fn capacity(
        &self,
        capability: VolumeCapability,
        parameters: StringMap,
    ) -> Result<i64, VolumeError> {
        if !self.cfg.caps.controller.get_capacity {
            return Ok(0);
        }
        self.csi
            .capacity(&[capability], &parameters)
            .await
            .map(|c| c.available_bytes)
            .map_err(|source| VolumeError::Csi {
                rpc: CsiRpc::GetCapacity,
                volume: String::new(),
                source,
            })
    }
}

fn recovery_summary<T>(result: &Result<T, VolumeError>, required: bool) -> RecoveryResult {
    match result {
        Ok(_) => RecoveryResult::Done,
        Err(e) => {
            let text = error_chain(e);
            if required {
                RecoveryResult::Failed(text)
            } else {
                RecoveryResult::Warning(text)
            }
        }
    }
}

/// `e` and its causes on one line (for reports; logs print chains at the edge).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// See `Ctx::remove_if_unmounted`: removes `dir/staging`, `dir/target` and `dir` without
/// recursing. A missing entry is fine; a block target is an empty regular file.
async fn remove_mount_dir(dir: &Path) -> std::io::Result<()> {
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    for entry in ["staging", "target"] {
        let path = dir.join(entry);
        let meta = match tokio::fs::symlink_metadata(&path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_file() && meta.len() == 0 {
            gone(tokio::fs::remove_file(&path).await)?;
        } else {
            // A directory (removed only if empty and not a mount point); anything else
            // (a non-empty file, a device node, a symlink) makes rmdir fail and stay.
            gone(tokio::fs::remove_dir(&path).await)?;
        }
    }
    gone(tokio::fs::remove_dir(dir).await)
}

#[cfg(test)]
mod tests {
    use super::{Class, Gate};

    #[test]
    fn the_gate_keeps_creates_and_untracked_jobs_apart_and_first_come_first_served() {
        let mut gate = Gate::default();
        // Idle: everything starts; free jobs never wait, even behind parked ones.
        for class in [Class::Free, Class::Create, Class::Untracked] {
            assert!(gate.admits(class, false), "{class:?}");
        }
        assert!(gate.admits(Class::Free, true));
        // Something parked ahead: creates and untracked-id jobs queue behind it.
        assert!(!gate.admits(Class::Create, true));
        assert!(!gate.admits(Class::Untracked, true));

        // Creates run together, never with an untracked-id job.
        gate.enter(Class::Create);
        assert!(gate.admits(Class::Create, false));
        assert!(!gate.admits(Class::Untracked, false));
        gate.enter(Class::Create);
        gate.leave(Class::Create);
        assert!(
            !gate.admits(Class::Untracked, false),
            "one create still runs"
        );
        gate.leave(Class::Create);
        assert!(gate.admits(Class::Untracked, false));

        // And the reverse.
        gate.enter(Class::Untracked);
        assert!(gate.admits(Class::Untracked, false));
        assert!(!gate.admits(Class::Create, false));
        gate.leave(Class::Untracked);
        assert!(gate.admits(Class::Create, false));
        // Free jobs are not counted.
        gate.enter(Class::Free);
        assert_eq!((gate.creates, gate.untracked), (0, 0));
    }
}
