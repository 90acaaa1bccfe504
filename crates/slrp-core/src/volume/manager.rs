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
//! parallel; each CSI call attempt they make takes a permit of a semaphore sized
//! [`VolumeManagerConfig::max_concurrent`], and a retry backoff between attempts holds
//! none (Mesos retries CreateVolume and DeleteVolume without limit, so creates waiting
//! out an unavailable controller would otherwise starve every other call). A call that
//! hangs holds its lane and one permit, nothing else, so it never blocks other volumes
//! while permits remain.
//!
//! Every request waits until recovery is done (as every Mesos volume manager call
//! waits for `recovered`): commands that arrive before are held in arrival order and
//! handled when recovery ends, whatever its outcome. Only the introspection commands
//! ([`VolumeManagerHandle::volumes`], [`VolumeManagerHandle::jobs`]) are answered at
//! once.
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
//! done. Deadlines of each RPC are the CSI client's (`slrp_csi::ClientConfig`); retries are
//! the manager's alone ([`VolumeManagerConfig::retry`], run through `slrp_csi::retry`),
//! since the client makes one attempt per call.
//!
//! CreateVolume is made safe by an intent record ([`CreateVolume`], kind
//! `volume_create`, key = name) committed before the RPC; the volume record and the
//! removal of the intent are one transaction after it. A name that is already tracked
//! answers with the tracked volume (fixes spec §12.7). Deletion first marks the record
//! `deleting` (durable), then walks the volume down to CREATED, calls DeleteVolume
//! (`NOT_FOUND` = done), removes its mount directory and finally the record.
//!
//! A caller with durable records of its own (the provider) may write these in its own
//! commits instead (`fold`): it commits the intent (a [`CreateVolume`], or a
//! [`DeleteIntent`](super::DeleteIntent) standing for the `deleting` mark) before it asks
//! with [`VolumeManagerHandle::create_staged`] / [`VolumeManagerHandle::delete_staged`],
//! and commits the record change the manager hands back with its own next commit; the
//! manager applies it to memory once told it is durable.
//!
//! # Recovery
//!
//! At start the worker loads every record and intent (a deletion intent marks its record
//! `deleting` and is dropped with the step-3 commit), then:
//! 1. maps each record to the current boot ([`plan_recovery`](super::plan_recovery)): after a reboot
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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use slrp_csi::{CsiCapabilities, CsiVersion, CsiVolumes, RetryConfig, VolumeId};
use slrp_store::Store;
use slrp_types::DisplayChain;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::VolumeError;
use super::handle::{Command, CreateVolume, Readiness, VolumeManagerHandle};
use super::host::{MountTable, NoSecrets, ProcMountTable, SecretResolver};
use super::jobs::{Change, Ctx, Done, Job};
use super::paths::MountPaths;
use super::recovery::{RecoveryProgress, RecoveryResult};
use super::refused::RefusedCreate;
use super::schedule::{Class, Gate, JobCounts, Key, Lane};
use super::state::{BootId, VolumeRecord};

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
pub(super) fn injected(point: &'static str) -> Result<(), VolumeError> {
    match fail::eval(point, |_| ()) {
        Some(()) => Err(VolumeError::Injected { point }),
        None => Ok(()),
    }
}

#[cfg(not(feature = "failpoints"))]
pub(super) fn injected(_point: &'static str) -> Result<(), VolumeError> {
    Ok(())
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
    /// The plugin's CSI version: picks Mesos's wording of validation errors.
    pub csi_version: CsiVersion,
    /// The plugin's type (Mesos `CSIPluginInfo.type`), named in error messages.
    pub plugin_type: String,
    /// The plugin's name (Mesos `CSIPluginInfo.name`), named in error messages.
    pub plugin_name: String,
    /// The current boot id ([`super::host::read_boot_id`]).
    pub boot_id: BootId,
    /// Most CSI call attempts in flight at once (retry backoffs hold no permit).
    pub max_concurrent: usize,
    /// Commands that may wait for the worker before senders wait (backpressure).
    pub command_buffer: usize,
    /// Who creates the target path of NodePublishVolume: follows the plugin's CSI
    /// version and `CSIPluginInfo.target_path_exists` ([`TargetPath::for_plugin`]).
    pub target_path: TargetPath,
    /// How long running jobs may take to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Which CSI calls the manager retries, and how (default Mesos's, spec §4.3:
    /// CreateVolume and DeleteVolume on `UNAVAILABLE`/`DEADLINE_EXCEEDED`, without limit,
    /// jittered backoff 10 s doubling to 10 min). The only retries of the manager's calls:
    /// the CSI client makes one attempt per call. A call waiting out a backoff holds no
    /// concurrency permit.
    pub retry: RetryConfig,
    /// First wait before a CreateVolume intent that recovery could not settle is tried
    /// again in the background; doubled per attempt up to 10 min. Default 10 s (Mesos's
    /// RPC backoff factor).
    pub intent_retry: Duration,
    /// The mount table recovery compares states with.
    pub mounts: Arc<dyn MountTable>,
    /// Resolves the secret references of stage and publish requests.
    pub secrets: Arc<dyn SecretResolver>,
    /// Told how long each of the manager's CSI calls took (metrics); `None` by default.
    pub observer: Option<Arc<dyn CallObserver>>,
}

/// What the volume manager reports about its CSI calls, for metrics. Kept to one method so
/// that the manager knows nothing of how they are exported.
pub trait CallObserver: Send + Sync + std::fmt::Debug {
    /// The call `rpc` for one volume (or name) ended after `elapsed`, retries and their
    /// backoffs included, successfully or not.
    fn call_ended(&self, rpc: slrp_csi::CsiRpc, elapsed: Duration, ok: bool);

    /// A transition call of volume `id` failed (the volume stays in flight), with the
    /// error's cause chain: what operators see as the volume's last error.
    fn volume_call_failed(&self, id: &slrp_csi::VolumeId, error: &str) {
        let _ = (id, error);
    }

    /// Volume `id` completed a transition: its last error, if any, is over.
    fn volume_moved(&self, id: &slrp_csi::VolumeId) {
        let _ = id;
    }

    /// The CreateVolume of `name` failed transiently (`error`, its cause chain) and is
    /// tried again after `next_retry_in`: what operators see of a create that is stuck.
    fn create_retrying(&self, name: &str, error: &str, next_retry_in: Duration) {
        let _ = (name, error, next_retry_in);
    }

    /// The CreateVolume of `name` ended, whatever the outcome: no retry is pending.
    fn create_ended(&self, name: &str) {
        let _ = name;
    }
}

/// Who creates the target path of NodePublishVolume, and so what the manager checks
/// after NodeUnpublishVolume. A property of the plugin, never a default: pass
/// [`TargetPath::for_plugin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetPath {
    /// CSI v1: the CO creates the parent directory and the plugin the target ("Creation
    /// of target_path is the responsibility of the SP"), which it removes again on
    /// NodeUnpublishVolume; the manager checks that it is gone afterwards.
    PluginCreates,
    /// CSI 0.2/0.3 ("The CO SHALL ensure that the path exists"), or a v1 plugin
    /// configured with `target_path_exists`: the manager creates the target directory
    /// and does not expect the plugin to remove it.
    CoCreates,
}

impl TargetPath {
    /// As Mesos decides: v0 always creates the target (`v0_volume_manager.cpp`), v1 only
    /// if `CSIPluginInfo.target_path_exists` is set.
    pub fn for_plugin(version: CsiVersion, target_path_exists: bool) -> Self {
        match version {
            CsiVersion::V0 => Self::CoCreates,
            CsiVersion::V1 if target_path_exists => Self::CoCreates,
            CsiVersion::V1 => Self::PluginCreates,
        }
    }
}

impl VolumeManagerConfig {
    /// Defaults: CSI v1 and an unnamed plugin (for messages), 16 concurrent volumes, 256
    /// queued commands, 30 s grace, the real mount table, no secrets.
    pub fn new(
        mount_paths: MountPaths,
        node_id: impl Into<String>,
        caps: CsiCapabilities,
        boot_id: BootId,
        target_path: TargetPath,
    ) -> Self {
        Self {
            mount_paths,
            node_id: node_id.into(),
            caps,
            csi_version: CsiVersion::V1,
            plugin_type: String::new(),
            plugin_name: String::new(),
            boot_id,
            max_concurrent: 16,
            command_buffer: 256,
            target_path,
            shutdown_grace: Duration::from_secs(30),
            intent_retry: Duration::from_secs(10),
            retry: RetryConfig::default(),
            mounts: Arc::new(ProcMountTable),
            secrets: Arc::new(NoSecrets),
            observer: None,
        }
    }

    /// Reports the duration of every CSI call to `observer`.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Sets the concurrency limit (at least 1; [`Self::validate`]).
    #[must_use]
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n;
        self
    }

    /// Sets the command buffer (at least 1; [`Self::validate`]).
    #[must_use]
    pub fn command_buffer(mut self, n: usize) -> Self {
        self.command_buffer = n;
        self
    }

    /// Checks the settings; [`VolumeManager::spawn`] refuses a config that fails this.
    ///
    /// # Errors
    /// [`VolumeError::Config`] naming the first field at fault: `max_concurrent` or
    /// `command_buffer` of 0 (nothing could run, or nobody could send), a mount root
    /// that is relative or not UTF-8 (CSI paths are strings), or an empty `node_id` for a
    /// plugin with PUBLISH_UNPUBLISH_VOLUME (ControllerPublishVolume needs it).
    pub fn validate(&self) -> Result<(), VolumeError> {
        let bad = |field, problem| Err(VolumeError::Config { field, problem });
        let root = self.mount_paths.root();
        if self.max_concurrent == 0 {
            return bad("max_concurrent", "must be at least 1");
        }
        if self.command_buffer == 0 {
            return bad("command_buffer", "must be at least 1");
        }
        if !root.is_absolute() {
            return bad("mount_paths", "must be an absolute path");
        }
        if root.to_str().is_none() {
            return bad("mount_paths", "must be UTF-8");
        }
        if self.node_id.is_empty() && self.caps.controller_publish() {
            return bad(
                "node_id",
                "must not be empty for a plugin with PUBLISH_UNPUBLISH_VOLUME",
            );
        }
        Ok(())
    }

    /// Names the plugin (Mesos `CSIPluginInfo` type and name) and its CSI version, for
    /// error messages.
    #[must_use]
    pub fn plugin(
        mut self,
        plugin_type: impl Into<String>,
        plugin_name: impl Into<String>,
        version: CsiVersion,
    ) -> Self {
        self.plugin_type = plugin_type.into();
        self.plugin_name = plugin_name.into();
        self.csi_version = version;
        self
    }

    /// Sets the first wait before an unsettled CreateVolume intent is retried.
    #[must_use]
    pub fn intent_retry(mut self, d: Duration) -> Self {
        self.intent_retry = d;
        self
    }

    /// Sets the shutdown grace period.
    #[must_use]
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Sets the manager's retry policies.
    #[must_use]
    pub fn retry(mut self, r: RetryConfig) -> Self {
        self.retry = r;
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

/// The volume manager's worker; see the module docs.
#[derive(Debug)]
pub struct VolumeManager;

impl VolumeManager {
    /// Starts the worker on the current runtime: it recovers from `store` (see the
    /// module docs) and then serves requests until `shutdown` fires, the guard stops it
    /// (or is dropped), or a fatal error.
    ///
    /// The worker's task ends with the fatal error, or `Ok` after shutdown; when it has
    /// ended, every job has stopped and the manager holds no clone of `store`.
    ///
    /// # Errors
    /// [`VolumeError::Config`] if `config` fails [`VolumeManagerConfig::validate`];
    /// nothing is started then.
    pub fn spawn<C: CsiVolumes>(
        config: VolumeManagerConfig,
        store: Store,
        csi: Arc<C>,
        shutdown: &CancellationToken,
    ) -> Result<(VolumeManagerHandle, VolumeManagerGuard), VolumeError> {
        config.validate()?;
        let cancel = shutdown.child_token();
        let (tx, rx) = mpsc::channel(config.command_buffer);
        let (ready_tx, ready) = watch::channel(Readiness::Recovering);
        let permits = Arc::new(Semaphore::new(config.max_concurrent));
        let worker = Worker {
            ctx: Arc::new(Ctx {
                csi,
                store,
                cfg: config,
                permits,
                cancel: cancel.clone(),
            }),
            rx,
            volumes: HashMap::new(),
            names: HashMap::new(),
            lanes: HashMap::new(),
            gate: Gate::default(),
            tasks: JoinSet::new(),
            ready_tx,
            recovery: None,
            deferred: VecDeque::new(),
        };
        let task = tokio::spawn(
            worker
                .run(cancel.clone())
                .instrument(tracing::info_span!(parent: None, "volume_manager")),
        );
        let guard = VolumeManagerGuard {
            cancel,
            task: Some(task),
        };
        Ok((VolumeManagerHandle { tx, ready }, guard))
    }
}

/// The running manager, kept by whoever started it: stopping it, and learning that it
/// stopped by itself (a fatal error), go through this guard. Dropping it requests a stop
/// (the shutdown in the module docs) without waiting for it.
#[derive(Debug)]
#[must_use = "dropping the guard stops the manager"]
pub struct VolumeManagerGuard {
    /// The worker's own token, a child of the caller's shutdown token: cancelled by
    /// [`Self::request_stop`], [`Self::stop`] and on drop.
    cancel: CancellationToken,
    /// The worker's task; `None` once joined.
    task: Option<JoinHandle<Result<(), VolumeError>>>,
}

impl VolumeManagerGuard {
    /// Starts the shutdown and returns at once; [`Self::join`] waits for it.
    pub fn request_stop(&self) {
        self.cancel.cancel();
    }

    /// Stops the manager and waits until its task has ended.
    ///
    /// # Errors
    /// The fatal error the worker ended with, if any (also one that happened during the
    /// shutdown grace period).
    pub async fn stop(self) -> Result<(), VolumeError> {
        self.request_stop();
        self.join().await
    }

    /// Waits until the worker's task has ended, by a stop or by itself.
    ///
    /// # Errors
    /// The fatal error the worker ended with; [`VolumeError::Stopped`] if the runtime
    /// dropped the task.
    ///
    /// # Panics
    /// If the worker panicked (the panic is resumed here).
    pub async fn join(mut self) -> Result<(), VolumeError> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(VolumeError::Stopped),
        }
    }

    /// Whether the worker's task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for VolumeManagerGuard {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(super) struct Worker<C> {
    pub(super) ctx: Arc<Ctx<C>>,
    pub(super) rx: mpsc::Receiver<Command>,
    /// Every tracked volume, as last committed.
    pub(super) volumes: HashMap<VolumeId, VolumeRecord>,
    /// CreateVolume name → volume, for the volumes slrp created.
    pub(super) names: HashMap<String, VolumeId>,
    /// Lanes with a job running, parked or queued (removed when idle and empty).
    pub(super) lanes: HashMap<Key, Lane>,
    /// Keeps creates and jobs for untracked ids apart; holds the parked jobs. Cleared
    /// on shutdown with the lane queues, so parked callers hear `Stopped` at once.
    pub(super) gate: Gate,
    pub(super) tasks: JoinSet<Done>,
    pub(super) ready_tx: watch::Sender<Readiness>,
    /// `Some` until recovery has finished.
    pub(super) recovery: Option<RecoveryProgress>,
    /// Requests that arrived during recovery, in arrival order; handled when it ends.
    /// Cleared on shutdown, so their callers hear `Stopped`.
    pub(super) deferred: VecDeque<Command>,
}

impl<C: CsiVolumes> Worker<C> {
    /// Schedules the `attempt`-th background retry of a CreateVolume intent recovery
    /// could not settle: after `intent_retry · 2^(attempt-1)` (at most 10 min, as Mesos's
    /// RPC backoff), a create job with no caller on the name's lane. The wait holds no
    /// lane and no permit, and ends at once on shutdown (the intent stays on disk for the
    /// next start).
    fn retry_intent_later(&mut self, req: CreateVolume, attempt: u32) {
        const MAX: Duration = Duration::from_secs(600);
        let exp = attempt.saturating_sub(1).min(16);
        let delay = self.ctx.cfg.intent_retry.saturating_mul(1 << exp).min(MAX);
        tracing::info!(name = %req.name, attempt, ?delay, "CreateVolume intent not settled; retrying in the background");
        let cancel = self.ctx.cancel.clone();
        self.tasks.spawn(async move {
            let mut done = Done::plain(Box::new(|| {}));
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(delay) => {
                    let key = Key::Name(req.name.clone());
                    done.requeue = Some((key, Job::Create { req, reply: None, attempt, fold: None }));
                }
            }
            done
        });
    }

    async fn run(mut self, cancel: CancellationToken) -> Result<(), VolumeError> {
        if let Err(e) = self.start().await {
            tracing::error!(error = %DisplayChain(&e), "volume manager recovery could not start");
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
                            tracing::error!(error = %DisplayChain(&e), "a volume job panicked; stopping");
                            break Err(VolumeError::Stopped);
                        }
                    };
                    if let Some(fatal) = self.on_done(done) {
                        tracing::error!(error = %DisplayChain(&fatal), "fatal volume manager error; stopping");
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
            self.deferred.clear();
            let grace = self.ctx.cfg.shutdown_grace;
            let drain = async {
                while let Some(joined) = self.tasks.join_next().await {
                    let done = joined.map_err(|e| {
                        tracing::error!(error = %DisplayChain(&e), "a volume job panicked during shutdown");
                        VolumeError::Stopped
                    })?;
                    if let Some(fatal) = self.on_done(done) {
                        tracing::error!(error = %DisplayChain(&fatal), "fatal volume manager error during shutdown");
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

    pub(super) fn on_command(&mut self, cmd: Command) {
        if self.recovery.is_some() && cmd.waits_for_recovery() {
            self.deferred.push_back(cmd);
            return;
        }
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
            Command::Snapshots { reply } => {
                let ctx = self.ctx.clone();
                self.tasks.spawn(async move {
                    let result =
                        ctx.store
                            .load_all::<super::SnapshotRecord>()
                            .await
                            .map_err(|source| VolumeError::Store {
                                subject: super::error::Subject::None,
                                source,
                            });
                    Done::plain(Box::new(move || {
                        let _ = reply.send(result);
                    }))
                });
            }
            Command::Expanded { reply } => {
                let grown = self
                    .volumes
                    .values()
                    .filter_map(|r| Some((r.id.clone(), r.expanded_bytes?)))
                    .collect();
                let _ = reply.send(Ok(grown));
            }
            Command::Refused { reply } => {
                let ctx = self.ctx.clone();
                self.tasks.spawn(async move {
                    let result = ctx
                        .store
                        .load_all::<RefusedCreate>()
                        .await
                        .map_err(|source| VolumeError::Store {
                            subject: super::error::Subject::None,
                            source,
                        });
                    Done::plain(Box::new(move || {
                        let _ = reply.send(result);
                    }))
                });
            }
            Command::Budget { reply } => {
                let _ = reply.send(Ok(self.ctx.csi.listing_budget()));
            }
            Command::Jobs { reply } => {
                let busy = self.lanes.values().filter(|l| l.busy).count();
                let parked = self.gate.parked.len();
                let _ = reply.send(Ok(JobCounts {
                    running: busy.saturating_sub(parked),
                    creating: self.gate.creates,
                    parked,
                    queued: self.lanes.values().map(|l| l.queue.len()).sum(),
                    deferred: self.deferred.len(),
                }));
            }
        }
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
                RecoveryResult::Unsettled { name, why } => {
                    p.report
                        .warnings
                        .push(format!("CreateVolume intent '{name}' not settled: {why}"));
                    p.report.unsettled_intents.push(name);
                }
            }
        }
        if let Some((req, attempt)) = done.retry {
            self.retry_intent_later(req, attempt);
        }
        if let Some((key, job)) = done.requeue
            && !self.ctx.cancel.is_cancelled()
        {
            self.enqueue(key, job);
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
