//! The jobs: what each request does, from the record a job owns to the change it hands
//! back to the worker.

use std::path::PathBuf;
use std::sync::Arc;

use slrp_csi::{
    CreateVolumeRequest, CsiError, CsiRpc, CsiVolumes, Secrets, StringMap, ValidateRequest,
    Validation, VolumeCapability, VolumeId, VolumePage,
};
use slrp_store::Store;
use slrp_types::DisplayChain;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::driver::is_already_done;
use super::error::{Mismatched, Subject, ValidationFailure, VolumeError, VolumeErrorKind};
use super::fold::{self, DeleteIntent, Fold};
use super::handle::{CreateVolume, Reply, ValidateVolume, VolumeInfo};
use super::manager::{VolumeManagerConfig, failpoints, injected};
use super::plan::RecoveryGoal;
use super::recovery::{RecoveryResult, recovery_summary};
use super::refused::Refusal;
use super::schedule::{Class, Key};
use super::snapshots::SnapshotRecord;
use super::state::{Goal, VolumeRecord, VolumeSpec, VolumeState};

pub(super) enum Job {
    Create {
        req: CreateVolume,
        /// `None` for recovery.
        reply: Option<Reply<VolumeInfo>>,
        /// 0 for a caller's create and recovery's first try of an intent; n > 0 for the
        /// n-th background retry of an intent recovery could not settle.
        attempt: u32,
        /// A caller's create whose intent the caller committed: the record is handed to
        /// it for its next commit.
        fold: Option<Fold<VolumeInfo>>,
    },
    Validate {
        req: ValidateVolume,
        reply: Reply<VolumeInfo>,
    },
    Delete {
        /// `None` for recovery.
        reply: Option<Reply<bool>>,
        /// A caller's deletion whose intent the caller committed: the record's removal is
        /// handed to it for its next commit.
        fold: Option<Fold<bool>>,
    },
    Publish {
        reply: Reply<PathBuf>,
    },
    Unpublish {
        reply: Reply<()>,
    },
    Expand {
        target_bytes: i64,
        reply: Reply<VolumeInfo>,
    },
    /// On the source volume's lane; `reply` is `None` for an intent found at start.
    Snapshot {
        name: String,
        reply: Option<Reply<SnapshotRecord>>,
    },
    /// On the lane of `Key::Name("snapshot <id>")`; `reply` is `None` at start.
    DeleteSnapshot {
        id: String,
        reply: Option<Reply<bool>>,
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
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Create { .. } => "create",
            Self::Validate { .. } => "validate",
            Self::Delete { .. } => "delete",
            Self::Publish { .. } => "publish",
            Self::Unpublish { .. } => "unpublish",
            Self::Expand { .. } => "expand",
            Self::Snapshot { .. } => "snapshot",
            Self::DeleteSnapshot { .. } => "delete snapshot",
            Self::Recover { .. } => "recover",
            Self::Collect { .. } => "collect",
        }
    }

    pub(super) fn is_recovery(&self) -> bool {
        match self {
            Self::Create { reply, attempt, .. } => reply.is_none() && *attempt == 0,
            Self::Delete { reply, .. } => reply.is_none(),
            Self::Recover { .. } | Self::Collect { .. } => true,
            Self::Validate { .. }
            | Self::Publish { .. }
            | Self::Unpublish { .. }
            | Self::Expand { .. }
            // Settled in the background of readiness: a copy may take long, and no
            // volume waits for it.
            | Self::Snapshot { .. }
            | Self::DeleteSnapshot { .. } => false,
        }
    }
}

/// How a job changed the tracked set.
pub(super) enum Change {
    None,
    Put(Box<VolumeRecord>),
    Remove(VolumeId),
}

/// A finished job, handed back to the worker.
pub(super) struct Done {
    pub(super) key: Option<Key>,
    /// How the job counted at the create gate (released when it is applied).
    pub(super) class: Class,
    pub(super) change: Change,
    /// Sends the caller's answer; called after `change` is applied.
    pub(super) answer: Box<dyn FnOnce() + Send>,
    /// A fatal error: the worker stops.
    pub(super) fatal: Option<VolumeError>,
    pub(super) recovery: Option<RecoveryResult>,
    /// An intent recovery could not settle: retried in the background (`attempt`).
    pub(super) retry: Option<(CreateVolume, u32)>,
    /// A background retry whose wait is over: enqueued when this is applied.
    pub(super) requeue: Option<(Key, Job)>,
}

impl Done {
    pub(super) fn plain(answer: Box<dyn FnOnce() + Send>) -> Self {
        Self {
            key: None,
            class: Class::Free,
            change: Change::None,
            answer,
            fatal: None,
            recovery: None,
            retry: None,
            requeue: None,
        }
    }
}

/// Splits a job's result into the caller's answer and, for a fatal error, the error the
/// worker stops with (the caller then hears [`VolumeError::Stopped`]).
pub(super) fn settle<T: Send + 'static>(
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

pub(super) struct Ctx<C> {
    pub(super) csi: Arc<C>,
    pub(super) store: Store,
    pub(super) cfg: VolumeManagerConfig,
    /// Bounds the CSI calls in flight: an attempt holds a permit, a retry backoff holds
    /// none ([`Ctx::call`]).
    pub(super) permits: Arc<Semaphore>,
    /// The manager's cancellation: ends retry backoffs at once on shutdown.
    pub(super) cancel: CancellationToken,
}

/// `readonly` of the volumes the manager creates or validates. Mesos never sets it for
/// provider volumes (`VolumeState.readonly` is only set for pre-provisioned volumes its
/// CSI server publishes for task volumes), whatever the access mode: the provider must
/// be able to lay out persistent volumes on the disk and clean it before deletion, and a
/// reader-only profile is about who may use the volume, not a read-only mount for slrp.
const SLRP_VOLUMES_READONLY: bool = false;

impl<C: CsiVolumes> Ctx<C> {
    /// The volume's target path, or the error naming the volume whose id has none.
    pub(super) fn target_path(&self, id: &VolumeId) -> Result<PathBuf, VolumeError> {
        self.cfg
            .mount_paths
            .target(id)
            .map_err(|source| VolumeError::Path {
                id: id.clone(),
                source,
            })
    }

    pub(super) async fn run_job(
        self: Arc<Self>,
        key: Key,
        class: Class,
        job: Job,
        record: Option<VolumeRecord>,
    ) -> Done {
        let recovery = job.is_recovery();
        let mut retry = None;
        let (change, answer, fatal, result) = match job {
            Job::Create {
                req,
                reply,
                attempt,
                fold,
            } => {
                let name = req.name.clone();
                if attempt > 0
                    && reply.is_none()
                    && matches!(self.intent_kept(&name).await, Ok(false))
                {
                    // Settled meanwhile by a caller's create of the name (created, or
                    // refused and dropped): trying again would write the intent anew and
                    // could create a volume nobody waits for.
                    tracing::info!(%name, attempt, "CreateVolume intent settled meanwhile; background retry ends");
                    return Done {
                        key: Some(key),
                        class,
                        ..Done::plain(Box::new(|| {}))
                    };
                }
                // Recovery's try of an intent and its background retries make one
                // attempt each: the background schedule is their retry, and readiness
                // must not wait out the RPC policy's (unlimited) retries.
                let retried = reply.is_some();
                let (result, change) = self.create(req.clone(), record, retried, fold).await;
                // Recovery never blocks readiness on an intent: a settled one is done, a
                // dropped one reported, and one the plugin may still have acted on is
                // reported by name and retried in the background (caller creates leave
                // theirs to the caller's replay and the next start).
                let kept = match &result {
                    Ok(_) => false,
                    Err(e) => self.intent_kept(&name).await.unwrap_or(!e.is_fatal()),
                };
                // A refused answer's volume still to delete is retried in the background
                // whoever asked: nobody replays a create of a refused name for it.
                let owes_deletion = matches!(&result,
                    Err(VolumeError::CreateRefused { refusal, .. }) if refusal.cleanup.is_pending());
                if kept
                    && (reply.is_none() || owes_deletion)
                    && !matches!(&result, Err(e) if e.is_fatal())
                {
                    retry = Some((req, attempt.saturating_add(1)));
                }
                let summary = match &result {
                    Ok(_) => RecoveryResult::Done,
                    Err(e) if kept => RecoveryResult::Unsettled {
                        name,
                        why: DisplayChain(e).to_string(),
                    },
                    Err(e) => RecoveryResult::Warning(format!(
                        "CreateVolume intent '{name}' dropped: {}",
                        DisplayChain(e)
                    )),
                };
                let (answer, fatal) = settle(reply, result);
                (change, answer, fatal, summary)
            }
            Job::Validate { req, reply } => {
                let (result, change) = self.validate(req, record).await;
                let (answer, fatal) = settle(Some(reply), result);
                (change, answer, fatal, RecoveryResult::Done)
            }
            Job::Delete { reply, fold } => {
                let (result, change) = self.delete(&key.volume_id(), record, fold).await;
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
            Job::Expand {
                target_bytes,
                reply,
            } => {
                let (result, change) = self.expand(&key, record, target_bytes).await;
                let (answer, fatal) = settle(Some(reply), result);
                (change, answer, fatal, RecoveryResult::Done)
            }
            Job::Snapshot { name, reply } => {
                let replay = reply.is_none();
                let result = self
                    .create_snapshot(&key.volume_id(), record.as_ref(), &name, replay)
                    .await;
                if let Err(e) = &result {
                    tracing::warn!(snapshot_name = %name, error = %DisplayChain(e), "snapshot not taken");
                }
                let (answer, fatal) = settle(reply, result);
                (Change::None, answer, fatal, RecoveryResult::Done)
            }
            Job::DeleteSnapshot { id, reply } => {
                let result = self.delete_snapshot(&id).await;
                if let Err(e) = &result {
                    tracing::warn!(snapshot = %id, error = %DisplayChain(e), "snapshot not deleted");
                }
                let (answer, fatal) = settle(reply, result);
                (Change::None, answer, fatal, RecoveryResult::Done)
            }
            Job::Recover { goal } => {
                let (result, change) = self.recover(&key, goal, record).await;
                let summary = recovery_summary(&result, goal.is_required());
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
            retry,
            requeue: None,
        }
    }

    /// Whether something is still owed for `name` after a create job: its CreateVolume
    /// intent is on disk, or a refused answer's volume still has to be deleted.
    async fn intent_kept(&self, name: &str) -> Result<bool, VolumeError> {
        let intent: Option<CreateVolume> =
            self.store
                .get(name)
                .await
                .map_err(|source| VolumeError::Store {
                    subject: Subject::Name(name.to_owned()),
                    source,
                })?;
        if intent.is_some() {
            return Ok(true);
        }
        Ok(self
            .refused_record(name)
            .await?
            .is_some_and(|r| r.cleanup.is_pending()))
    }

    /// A request for a tracked volume succeeds only with the capability and parameters
    /// it is tracked with (Mesos's `validateVolume` of a checkpointed volume).
    fn compare_tracked(
        &self,
        rec: &VolumeRecord,
        capability: &VolumeCapability,
        parameters: &StringMap,
    ) -> Result<VolumeInfo, VolumeError> {
        let what = if rec.spec.capability != *capability {
            Mismatched::Capability
        } else if rec.spec.parameters != *parameters {
            Mismatched::Parameters
        } else {
            return Ok(VolumeInfo::of(rec));
        };
        Err(VolumeError::Mismatch {
            id: rec.id.clone(),
            what,
            version: self.cfg.csi_version,
        })
    }

    /// `retried`: CreateVolume under the configured retry policy, else one attempt.
    /// `fold`: the caller committed the intent and takes the record (see `fold`).
    pub(super) async fn create(
        &self,
        req: CreateVolume,
        existing: Option<VolumeRecord>,
        retried: bool,
        fold: Option<Fold<VolumeInfo>>,
    ) -> (Result<VolumeInfo, VolumeError>, Change) {
        let staged = fold.is_some();
        if let Some(rec) = existing {
            // Already tracked under this name: the earlier attempt's result (spec §12.7).
            let result = self.compare_tracked(&rec, &req.capability, &req.parameters);
            let dropped = if staged {
                self.drop_intent(&req.name).await
            } else {
                Ok(())
            };
            return (dropped.and(result), Change::None);
        }
        let rec = match self.create_steps(&req, retried, staged).await {
            Ok(rec) => rec,
            Err(e) => return (Err(e), Change::None),
        };
        match self.record_created(&rec, &req.name, fold).await {
            Ok(()) => (Ok(VolumeInfo::of(&rec)), Change::Put(Box::new(rec))),
            Err(e) => (Err(e), Change::None),
        }
    }

    /// Makes a created volume's record durable (and its intent gone) in one commit: the
    /// caller's next one when it staged the intent, else the manager's own.
    async fn record_created(
        &self,
        rec: &VolumeRecord,
        name: &str,
        fold: Option<Fold<VolumeInfo>>,
    ) -> Result<(), VolumeError> {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Name(name.to_owned()),
            source,
        };
        if let Some(fold) = fold {
            let changes = fold::created_changes(rec, name).map_err(store_err)?;
            if fold.hand_over(VolumeInfo::of(rec), changes).await {
                tracing::info!(volume = %rec.id, %name, "volume created");
                return Ok(());
            }
        }
        let changes = fold::created_changes(rec, name).map_err(store_err)?;
        self.store
            .transaction_with(changes)
            .commit()
            .await
            .map_err(store_err)?;
        tracing::info!(volume = %rec.id, %name, "volume created");
        Ok(())
    }

    /// Drops the CreateVolume intent of `name` (one commit).
    async fn drop_intent(&self, name: &str) -> Result<(), VolumeError> {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Name(name.to_owned()),
            source,
        };
        let mut tx = self.store.transaction();
        tx.delete::<CreateVolume>(name).map_err(store_err)?;
        tx.commit().await.map_err(store_err)
    }

    /// Everything of a create up to the volume's record, which the caller makes durable
    /// ([`Self::record_created`]). `staged`: the intent is durable already (the caller
    /// committed it for a name never asked for before).
    pub(super) async fn create_steps(
        &self,
        req: &CreateVolume,
        retried: bool,
        staged: bool,
    ) -> Result<VolumeRecord, VolumeError> {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Name(req.name.clone()),
            source,
        };
        if let Err(e) = self.refuse_early(req, retried).await {
            // A caller's staged intent goes with the refusal: nothing was called.
            if staged && !e.is_fatal() {
                self.drop_intent(&req.name).await?;
            }
            return Err(e);
        }
        // A staged intent is the first for its name: no earlier attempt.
        let prior_intent = !staged
            && self
                .store
                .get::<CreateVolume>(&req.name)
                .await
                .map_err(store_err)?
                .is_some();
        if !staged {
            // Intent first: after a crash, recovery finds the name and finishes the
            // creation.
            let mut tx = self.store.transaction();
            tx.put(req).map_err(store_err)?;
            tx.commit().await.map_err(store_err)?;
        }
        injected(failpoints::BEFORE_CALL)?;
        let request = CreateVolumeRequest {
            name: req.name.clone(),
            required_bytes: req.required_bytes,
            limit_bytes: req.limit_bytes,
            capabilities: vec![req.capability.clone()],
            parameters: req.parameters.clone(),
            secrets: Secrets::default(),
            content_source: req.content_source.clone(),
        };
        // Whether any attempt, not only the last, may have created the volume: a retry
        // refused without effect (or never sent, the plugin restarting) says nothing
        // about the attempt before it.
        let effect = std::sync::atomic::AtomicBool::new(false);
        let policy = if retried {
            self.cfg.retry.policy(CsiRpc::CreateVolume)
        } else {
            None
        };
        let result = self
            .create_call(&req.name, policy, || async {
                let r = self.csi.create_volume(&request).await;
                if r.as_ref().is_err_and(CsiError::may_have_taken_effect) {
                    effect.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                r
            })
            .await;
        injected(failpoints::AFTER_CALL)?;
        let volume = match result {
            Ok(v) => v,
            Err(CsiError::InvalidResponse {
                violation, created, ..
            }) => {
                return Err(self
                    .refuse_create(req, Refusal::from(&*violation), created, retried)
                    .await);
            }
            Err(source) => {
                // The intent survives only what may have created the volume: a refusal by
                // the plugin (RESOURCE_EXHAUSTED, OUT_OF_RANGE, INVALID_ARGUMENT, ...)
                // created nothing under this name (a replay would have returned the
                // earlier volume), and neither did a call that was never sent, unless an
                // earlier attempt (the intent was there before) may have. Deadlines,
                // UNAVAILABLE, cancellation and ABORTED ("operation pending") keep it, in
                // any attempt of the call.
                let refused = matches!(source, CsiError::Rpc { .. });
                let effect = effect.load(std::sync::atomic::Ordering::Relaxed)
                    || source.may_have_taken_effect();
                if !effect && (refused || !prior_intent) {
                    let mut tx = self.store.transaction();
                    tx.delete::<CreateVolume>(&req.name).map_err(store_err)?;
                    tx.commit().await.map_err(store_err)?;
                }
                return Err(VolumeError::Csi {
                    rpc: CsiRpc::CreateVolume,
                    subject: Subject::Name(req.name.clone()),
                    source,
                });
            }
        };
        // An id that cannot name the volume's directory under the mount root (an empty
        // one, or one whose encoding exceeds a file name) could never be staged or
        // published: the answer is refused before any record exists and settled like
        // one the client refused (its volume deleted, the name never created again).
        // Found by the `csi_answers` fuzz target.
        if let Err(e) = self.cfg.mount_paths.volume_dir(&volume.volume_id) {
            let id = volume.volume_id;
            let created = (!id.as_str().is_empty()).then_some(id);
            return Err(self
                .refuse_create(req, Refusal::of_path(&e), created, retried)
                .await);
        }
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
            return Err(VolumeError::NameTaken {
                name: req.name.clone(),
                id: other.id,
            });
        }
        let mut rec = VolumeRecord::created(
            volume.volume_id,
            Some(req.name.clone()),
            VolumeSpec {
                capability: req.capability.clone(),
                parameters: req.parameters.clone(),
                volume_context: volume.volume_context,
                readonly: SLRP_VOLUMES_READONLY,
                pre_provisioned: false,
                node_stage_secrets: Default::default(),
                node_publish_secrets: Default::default(),
                untrack_on_unstage: false,
            },
        );
        // Mesos keeps the requested size (§12.28); the plugin's answer is the truth.
        rec.capacity_bytes = if volume.capacity_bytes > 0 {
            volume.capacity_bytes
        } else {
            req.required_bytes
        };
        Ok(rec)
    }

    /// What ends a create before any intent is written: a plugin that cannot create, or
    /// a name whose answer was refused (never created again: the plugin would make the
    /// same volume and slrp would refuse it again; what it owes is the deletion).
    async fn refuse_early(&self, req: &CreateVolume, retried: bool) -> Result<(), VolumeError> {
        if !self.cfg.caps.controller.create_delete_volume {
            return Err(VolumeError::Unsupported {
                capability: "CREATE_DELETE_VOLUME",
                plugin_type: self.cfg.plugin_type.clone(),
                plugin_name: self.cfg.plugin_name.clone(),
            });
        }
        // A content source the plugin cannot take is refused here, by name, rather than
        // by whatever the plugin answers to a field it may not read.
        let source_capability = match &req.content_source {
            Some(slrp_csi::ContentSource::Snapshot(_))
                if !self.cfg.caps.controller.create_delete_snapshot =>
            {
                Some("CREATE_DELETE_SNAPSHOT")
            }
            Some(slrp_csi::ContentSource::Volume(_)) if !self.cfg.caps.controller.clone_volume => {
                Some("CLONE_VOLUME")
            }
            Some(_) | None => None,
        };
        if let Some(capability) = source_capability {
            return Err(VolumeError::Unsupported {
                capability,
                plugin_type: self.cfg.plugin_type.clone(),
                plugin_name: self.cfg.plugin_name.clone(),
            });
        }
        if let Some(refused) = self.refused_record(&req.name).await? {
            return Err(match self.settle_refused(refused, retried).await {
                Ok(refusal) | Err((refusal, None)) => VolumeError::CreateRefused {
                    name: req.name.clone(),
                    refusal: Box::new(refusal),
                },
                Err((_, Some(fatal))) => fatal,
            });
        }
        Ok(())
    }

    pub(super) async fn validate(
        &self,
        req: ValidateVolume,
        existing: Option<VolumeRecord>,
    ) -> (Result<VolumeInfo, VolumeError>, Change) {
        if let Some(rec) = existing {
            let result = self.compare_tracked(&rec, &req.capability, &req.parameters);
            return (result, Change::None);
        }
        let request = ValidateRequest {
            volume_id: req.id.clone(),
            capabilities: vec![req.capability.clone()],
            volume_context: req.volume_context.clone(),
            parameters: req.parameters.clone(),
        };
        let validation = self
            .call(CsiRpc::ValidateVolumeCapabilities, || {
                self.csi.validate(&request)
            })
            .await;
        let result = match validation {
            Err(source) => Err(VolumeError::Csi {
                rpc: CsiRpc::ValidateVolumeCapabilities,
                subject: Subject::Volume(req.id.clone()),
                source,
            }),
            Ok(v) if !v.confirmed => Err(VolumeError::ValidationFailed {
                id: req.id.clone(),
                reason: ValidationFailure::NotConfirmed { message: v.message },
                version: self.cfg.csi_version,
            }),
            Ok(v) if let Some(reason) = confirmed_differs(&v, &request) => {
                Err(VolumeError::ValidationFailed {
                    id: req.id.clone(),
                    reason,
                    version: self.cfg.csi_version,
                })
            }
            Ok(_) => {
                let mut rec = VolumeRecord::created(
                    req.id.clone(),
                    None,
                    VolumeSpec {
                        readonly: SLRP_VOLUMES_READONLY,
                        capability: req.capability,
                        parameters: req.parameters,
                        volume_context: req.volume_context,
                        pre_provisioned: true,
                        node_stage_secrets: req.node_stage_secrets,
                        node_publish_secrets: req.node_publish_secrets,
                        untrack_on_unstage: false,
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

    /// `fold`: the caller committed the deletion intent and takes the record's removal
    /// (see `fold`).
    pub(super) async fn delete(
        &self,
        id: &VolumeId,
        record: Option<VolumeRecord>,
        fold: Option<Fold<bool>>,
    ) -> (Result<bool, VolumeError>, Change) {
        let staged = fold.is_some();
        let Some(mut rec) = record else {
            // Untracked (e.g. listed by the plugin but never validated): only the RPC.
            let result = self.delete_rpc(id).await;
            // A staged intent goes whatever the answer, unless the deletion was cut short
            // (recovery drops an intent without a record): a volume tracked later must
            // not be deleted for it.
            let settled = match &result {
                _ if !staged => Ok(()),
                Err(e) if self.interrupted(e) => Ok(()),
                Ok(deprovisioned) => self.record_deleted(id, *deprovisioned, fold).await,
                Err(_) => self.record_deleted(id, false, None).await,
            };
            return (settled.and(result), Change::None);
        };
        match self.delete_steps(&mut rec, staged).await {
            Ok(deprovisioned) => match self.record_deleted(&rec.id, deprovisioned, fold).await {
                Ok(()) => {
                    tracing::info!(volume = %rec.id, deprovisioned, "volume deleted");
                    (Ok(deprovisioned), Change::Remove(rec.id))
                }
                Err(e) => (Err(e), Change::Put(Box::new(rec))),
            },
            Err(e) => {
                let e = self.delete_ended(&mut rec, e).await;
                (Err(e), Change::Put(Box::new(rec)))
            }
        }
    }

    /// Removes a deleted volume's record and deletion intent in one commit: the caller's
    /// next one when it staged the intent, else the manager's own.
    async fn record_deleted(
        &self,
        id: &VolumeId,
        deprovisioned: bool,
        fold: Option<Fold<bool>>,
    ) -> Result<(), VolumeError> {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Volume(id.clone()),
            source,
        };
        let committed = match fold {
            Some(fold) => {
                let changes = fold::deleted_changes(id).map_err(store_err)?;
                fold.hand_over(deprovisioned, changes).await
            }
            None => false,
        };
        if !committed {
            let changes = fold::deleted_changes(id).map_err(store_err)?;
            self.store
                .transaction_with(changes)
                .commit()
                .await
                .map_err(store_err)?;
        }
        Ok(())
    }

    /// Whether `e` cut a deletion short (shutdown, also one that ends a retry backoff; a
    /// fatal error; a plugin endpoint stopped for good) rather than failed it.
    fn interrupted(&self, e: &VolumeError) -> bool {
        // A shutdown ends a retry backoff with the last (transient) error, not a
        // cancellation: a deletion that ends while the manager stops was cut short.
        e.is_fatal()
            || self.cancel.is_cancelled()
            || e.kind() == VolumeErrorKind::Stopped
            // A plugin endpoint stopped for good: its supervisor is shutting down.
            || matches!(
                e,
                VolumeError::Csi {
                    source: CsiError::Cancelled { .. } | CsiError::EndpointStopped { .. },
                    ..
                }
            )
    }

    /// A deletion ended with `e`. If it *failed* (the plugin refused, a step failed), the
    /// volume is left usable where the failure left it (CREATED after a refused
    /// DeleteVolume) and `deleting` is cleared durably, so that nothing deletes it later
    /// unasked (Mesos: a failed DESTROY_DISK leaves the volume tracked and offered). If it
    /// was *interrupted* (shutdown, also one that ends a retry backoff; a fatal error), `deleting` stays and the next start
    /// resumes it. Returns the error to answer with.
    pub(super) async fn delete_ended(&self, rec: &mut VolumeRecord, e: VolumeError) -> VolumeError {
        if self.interrupted(&e) || !rec.deleting {
            return e;
        }
        let mut failed = rec.clone();
        failed.deleting = false;
        // The deletion cleared it before its first step (as Mesos does); the publish made
        // for the cleanup set it again, and no user asked for that one: recovery must not
        // republish the volume (and hold readiness on it) at every start.
        failed.node_publish_required = false;
        failed.delete_failed = Some(DisplayChain(&e).to_string());
        // A staged deletion intent goes with the mark it stands for.
        match self
            .persist_with(&failed, |tx| {
                tx.delete::<DeleteIntent>(failed.id.as_str()).map(|_| ())
            })
            .await
        {
            Ok(()) => {
                tracing::warn!(volume = %rec.id, state = %failed.state.name(), error = %DisplayChain(&e),
                    "deletion failed; the volume stays tracked and usable");
                *rec = failed;
                e
            }
            // Fatal: `deleting` is still on disk, so the next start resumes the deletion.
            Err(store) => store,
        }
    }

    pub(super) async fn delete_rpc(&self, id: &VolumeId) -> Result<bool, VolumeError> {
        if !self.cfg.caps.controller.create_delete_volume {
            return Ok(false);
        }
        injected(failpoints::BEFORE_CALL)?;
        let secrets = Secrets::default();
        let result = self
            .call(CsiRpc::DeleteVolume, || {
                self.csi.delete_volume(id, &secrets)
            })
            .await;
        injected(failpoints::AFTER_CALL)?;
        match result {
            Ok(()) => Ok(true),
            // CSI: deleting a volume that does not exist succeeds (fixes spec §12.22).
            Err(e) if is_already_done(&e) => Ok(true),
            Err(source) => Err(VolumeError::Csi {
                rpc: CsiRpc::DeleteVolume,
                subject: Subject::Volume(id.clone()),
                source,
            }),
        }
    }

    /// Everything of a deletion up to the removal of the record, which the caller makes
    /// durable ([`Self::record_deleted`]). `staged`: the caller's deletion intent is
    /// durable, and stands for the `deleting` mark.
    pub(super) async fn delete_steps(
        &self,
        rec: &mut VolumeRecord,
        staged: bool,
    ) -> Result<bool, VolumeError> {
        let marked = rec.marked_for_deletion();
        if marked != *rec {
            // Durable before the first step, so that recovery finishes the deletion
            // instead of publishing the volume again: the mark, or the intent recovery
            // turns into the same mark.
            if !staged {
                self.persist(&marked).await?;
            }
            *rec = marked;
        }
        if rec.needs_cleanup {
            // Spec §4.6 delete step 1, also for a volume unpublished since: published again
            // (the data is reachable only through the plugin), its contents removed, and
            // only then made durable, so that a crash in between cleans again and never
            // deletes without cleaning.
            self.drive(rec, Goal::Published).await?;
            self.remove_contents(&rec.id, &rec.spec.capability).await?;
            let mut cleaned = rec.clone();
            cleaned.needs_cleanup = false;
            cleaned.node_publish_required = false;
            self.persist(&cleaned).await?;
            *rec = cleaned;
        }
        self.drive(rec, Goal::Created).await?;
        let deprovisioned = self.delete_rpc(&rec.id).await?;
        if let Ok(dir) = self.cfg.mount_paths.volume_dir(&rec.id)
            && !self.remove_if_unmounted(&dir).await
        {
            tracing::warn!(volume = %rec.id, dir = %dir.display(),
                "mount directory still has mounts; left in place");
        }
        Ok(deprovisioned)
    }

    pub(super) async fn publish(
        &self,
        key: &Key,
        record: Option<VolumeRecord>,
    ) -> (Result<PathBuf, VolumeError>, Change) {
        let Some(mut rec) = record else {
            let id = key.volume_id();
            return (Err(VolumeError::UnknownVolume { id }), Change::None);
        };
        if rec.deleting {
            let id = rec.id.clone();
            return (Err(VolumeError::BeingDeleted { id }), Change::None);
        }
        let result = match self.drive(&mut rec, Goal::Published).await {
            Ok(()) => {
                self.owed_node_expansion(&mut rec).await;
                self.target_path(&rec.id)
            }
            Err(e) => Err(e),
        };
        (result, Change::Put(Box::new(rec)))
    }

    pub(super) async fn unpublish(
        &self,
        record: Option<VolumeRecord>,
    ) -> (Result<(), VolumeError>, Change) {
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
        if result.is_ok() && goal == Goal::NodeReady && rec.spec.untrack_on_unstage {
            return self.untrack(rec).await;
        }
        (result, Change::Put(Box::new(rec)))
    }

    /// Forgets an unstaged volume that Mesos's CSI server had published for a task
    /// (`pre_provisioned` there, spec §4.6 unstage step 6): its record goes, the volume
    /// stays on the plugin, and the next ListVolumes reports it as pre-existing.
    async fn untrack(&self, rec: VolumeRecord) -> (Result<(), VolumeError>, Change) {
        let store_err = |source| VolumeError::Store {
            subject: Subject::Volume(rec.id.clone()),
            source,
        };
        let mut tx = self.store.transaction();
        let result = match tx.delete::<VolumeRecord>(rec.id.as_str()) {
            Err(e) => Err(store_err(e)),
            Ok(_) => Ok(()),
        };
        let result = match result {
            Ok(()) => tx.commit().await.map_err(store_err),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                tracing::info!(volume = %rec.id, "unstaged volume of Mesos's CSI server untracked");
                (Ok(()), Change::Remove(rec.id))
            }
            Err(e) => (Err(e), Change::Put(Box::new(rec))),
        }
    }

    pub(super) async fn list(
        &self,
        max_entries: i32,
        token: Option<&str>,
    ) -> Result<VolumePage, VolumeError> {
        if !self.cfg.caps.controller.list_volumes {
            return Ok(VolumePage {
                volumes: Vec::new(),
                next_token: None,
            });
        }
        self.call(CsiRpc::ListVolumes, || {
            self.csi.list_volumes_page(max_entries, token)
        })
        .await
        .map_err(|source| VolumeError::Csi {
            rpc: CsiRpc::ListVolumes,
            subject: Subject::None,
            source,
        })
    }

    pub(super) async fn capacity(
        &self,
        capability: VolumeCapability,
        parameters: StringMap,
    ) -> Result<i64, VolumeError> {
        if !self.cfg.caps.controller.get_capacity {
            return Ok(0);
        }
        let capabilities = [capability];
        self.call(CsiRpc::GetCapacity, || {
            self.csi.capacity(&capabilities, &parameters)
        })
        .await
        .map(|c| c.available_bytes)
        .map_err(|source| VolumeError::Csi {
            rpc: CsiRpc::GetCapacity,
            subject: Subject::None,
            source,
        })
    }
}

/// Mesos's checks of a v1 `confirmed` answer (`v1_volume_manager.cpp` `validateVolume`,
/// in its order): the confirmed volume context and parameters must equal what was sent,
/// and one confirmed capability must be the requested one. A plugin may confirm less than
/// it was asked about; slrp must then not track the volume as if it had confirmed all.
/// v0 answers only `supported` (no `confirmed_fields`): nothing to compare.
fn confirmed_differs(v: &Validation, sent: &ValidateRequest) -> Option<ValidationFailure> {
    let confirmed = v.confirmed_fields.as_ref()?;
    if confirmed.volume_context != sent.volume_context {
        return Some(ValidationFailure::MismatchedVolumeContext);
    }
    if !confirmed
        .capabilities
        .iter()
        .any(|c| sent.capabilities.contains(c))
    {
        return Some(ValidationFailure::UnsupportedCapability);
    }
    if confirmed.parameters != sent.parameters {
        return Some(ValidationFailure::MismatchedParameters);
    }
    None
}
