//! The manager's handle: what callers send ([`CreateVolume`], [`ValidateVolume`]) and
//! hear back ([`VolumeInfo`]), and the commands that carry them to the worker.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use slrp_csi::{
    CsiError, CsiRpc, ListingBudget, StringMap, VolumeCapability, VolumeId, VolumePage,
};
use slrp_store::{Kind, Record};
use tokio::sync::{mpsc, oneshot, watch};

use super::error::{Subject, VolumeError};
use super::fold::{self, Fold, Staged};
use super::jobs::Job;
use super::recovery::RecoveryReport;
use super::refused::RefusedCreate;
use super::schedule::{JobCounts, Key};
use super::state::{SecretRef, VolumeRecord};

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
    /// What the new volume holds at first: a snapshot restored or a volume cloned. Part
    /// of the intent, so that a replay after a crash asks for the same contents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_source: Option<slrp_csi::ContentSource>,
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
    pub(super) fn of(rec: &VolumeRecord) -> Self {
        Self {
            id: rec.id.clone(),
            capacity_bytes: rec.capacity_bytes,
            volume_context: rec.spec.volume_context.clone(),
        }
    }
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, VolumeError>>;

/// Where readiness stands.
#[derive(Debug, Clone)]
pub(super) enum Readiness {
    Recovering,
    Ready(RecoveryReport),
    Failed(Vec<String>),
    Stopped,
}

/// Sends requests to the volume manager. Cheap to clone.
#[derive(Debug, Clone)]
pub struct VolumeManagerHandle {
    pub(super) tx: mpsc::Sender<Command>,
    pub(super) ready: watch::Receiver<Readiness>,
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
    /// [`VolumeError::BadRequest`] for an empty name, [`VolumeError::Unsupported`]
    /// without `CREATE_DELETE_VOLUME`, [`VolumeError::Mismatch`] if the name is tracked
    /// with another capability or other parameters, [`VolumeError::NameTaken`] if the
    /// plugin returned a volume tracked otherwise, [`VolumeError::Csi`] if CreateVolume
    /// failed.
    pub async fn create(&self, req: CreateVolume) -> Result<VolumeInfo, VolumeError> {
        if req.name.is_empty() {
            return Err(VolumeError::BadRequest {
                field: "name",
                problem: "is empty",
            });
        }
        let key = Key::Name(req.name.clone());
        self.ask(|reply| {
            Command::Job(
                key,
                Job::Create {
                    req,
                    reply: Some(reply),
                    attempt: 0,
                    fold: None,
                },
            )
        })
        .await
    }

    /// [`create`](Self::create) of a name whose intent the caller committed itself
    /// ([`stage_create`](super::stage_create)): the manager writes no intent, and leaves
    /// the record of a created volume to the caller's next commit ([`Staged::owed`]).
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn create_staged(
        &self,
        req: CreateVolume,
    ) -> Result<Staged<VolumeInfo>, VolumeError> {
        if req.name.is_empty() {
            return Err(VolumeError::BadRequest {
                field: "name",
                problem: "is empty",
            });
        }
        let key = Key::Name(req.name.clone());
        self.ask_staged(key, |reply, fold| Job::Create {
            req,
            reply: Some(reply),
            attempt: 0,
            fold: Some(fold),
        })
        .await
    }

    /// Sends the job `make` builds with the reply and the fold of a staged call, and
    /// waits for what it hands over (or its ordinary answer).
    async fn ask_staged<T>(
        &self,
        key: Key,
        make: impl FnOnce(Reply<T>, Fold<T>) -> Job,
    ) -> Result<Staged<T>, VolumeError> {
        let (fold, folded) = Fold::new();
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Job(key, make(reply, fold)))
            .await
            .map_err(|_| VolumeError::Stopped)?;
        fold::receive(folded, answer).await
    }

    /// Validates a pre-existing volume with ValidateVolumeCapabilities and tracks it
    /// (CREATED, pre-provisioned). A tracked volume is checked against its record only.
    ///
    /// # Errors
    /// [`VolumeError::Mismatch`], [`VolumeError::ValidationFailed`], [`VolumeError::Csi`].
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
    /// [`VolumeError::Csi`] if a step failed, [`VolumeError::Cleanup`] if the contents of
    /// a once-published volume could not be removed: the volume stays tracked and usable
    /// (`delete_failed` says why) and is deleted only when asked again. A deletion
    /// interrupted by a crash or a shutdown ([`VolumeError::Stopped`], or the error a
    /// shutdown cut short) is resumed at the next start.
    pub async fn delete(&self, id: &VolumeId) -> Result<bool, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| {
            Command::Job(
                key,
                Job::Delete {
                    reply: Some(reply),
                    fold: None,
                },
            )
        })
        .await
    }

    /// [`delete`](Self::delete) of a volume whose deletion intent the caller committed
    /// itself ([`stage_delete`](super::stage_delete)): the manager writes no `deleting`
    /// mark, and leaves the removal of the record to the caller's next commit
    /// ([`Staged::owed`]).
    ///
    /// # Errors
    /// As [`delete`](Self::delete).
    pub async fn delete_staged(&self, id: &VolumeId) -> Result<Staged<bool>, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask_staged(key, |reply, fold| Job::Delete {
            reply: Some(reply),
            fold: Some(fold),
        })
        .await
    }

    /// Publishes a volume at its target path (attaching and staging it first); returns
    /// the target path.
    ///
    /// # Errors
    /// [`VolumeError::UnknownVolume`], [`VolumeError::BeingDeleted`], [`VolumeError::Csi`],
    /// [`VolumeError::Secret`], [`VolumeError::Prepare`].
    pub async fn publish(&self, id: &VolumeId) -> Result<PathBuf, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| Command::Job(key, Job::Publish { reply }))
            .await
    }

    /// Grows the volume to `target_bytes` (ControllerExpandVolume, then NodeExpandVolume
    /// if the plugin asks for it and the volume is published; see `expand`). Answers the
    /// volume with its new capacity.
    ///
    /// # Errors
    /// [`VolumeError::UnknownVolume`], [`VolumeError::CannotExpand`] (nothing sent),
    /// [`VolumeError::ExpandOffline`], a failed call.
    pub async fn expand(
        &self,
        id: &VolumeId,
        target_bytes: i64,
    ) -> Result<VolumeInfo, VolumeError> {
        let key = Key::Volume(id.clone());
        self.ask(|reply| {
            Command::Job(
                key,
                Job::Expand {
                    target_bytes,
                    reply,
                },
            )
        })
        .await
    }

    /// Takes snapshot `name` of volume `source` (CreateSnapshot; the same name and source
    /// answer the snapshot taken before). Answers its record.
    ///
    /// # Errors
    /// [`VolumeError::UnknownVolume`], [`VolumeError::Unsupported`] without
    /// CREATE_DELETE_SNAPSHOT, [`VolumeError::SnapshotNameTaken`], a failed call.
    pub async fn snapshot(
        &self,
        source: &VolumeId,
        name: String,
    ) -> Result<super::SnapshotRecord, VolumeError> {
        if name.is_empty() {
            return Err(VolumeError::BadRequest {
                field: "name",
                problem: "is empty",
            });
        }
        let key = Key::Volume(source.clone());
        self.ask(|reply| {
            Command::Job(
                key,
                Job::Snapshot {
                    name,
                    reply: Some(reply),
                },
            )
        })
        .await
    }

    /// Deletes snapshot `id` (DeleteSnapshot; NOT_FOUND is done). `Ok(false)`: no such
    /// snapshot is recorded.
    ///
    /// # Errors
    /// A failed call.
    pub async fn delete_snapshot(&self, id: &str) -> Result<bool, VolumeError> {
        let key = Key::Name(format!("snapshot {id}"));
        let id = id.to_owned();
        self.ask(|reply| {
            Command::Job(
                key,
                Job::DeleteSnapshot {
                    id,
                    reply: Some(reply),
                },
            )
        })
        .await
    }

    /// The snapshots recorded, ordered by id (read from the store).
    ///
    /// # Errors
    /// [`VolumeError::Stopped`], or a failed read of the store.
    pub async fn snapshots(&self) -> Result<Vec<super::SnapshotRecord>, VolumeError> {
        self.ask(|reply| Command::Snapshots { reply }).await
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

    /// Every volume the plugin lists, following pages of `page_size`, within the bounds
    /// of the client's [`ListingBudget`](slrp_csi::ListingBudget) (pages, volumes, bytes,
    /// and no token twice), so a plugin that hands out tokens forever is stopped with
    /// bounded memory.
    ///
    /// # Errors
    /// [`VolumeError::Csi`]: a page's failure, or [`CsiError::InvalidResponse`] naming the
    /// bound the listing passed or the repeated token.
    pub async fn list_all(&self, page_size: i32) -> Result<Vec<slrp_csi::Volume>, VolumeError> {
        let mut budget = self.ask(|reply| Command::Budget { reply }).await?;
        let mut all = Vec::new();
        let mut token = None;
        loop {
            let page = self.list(page_size, token).await?;
            if let Err(violation) = budget.take(&page) {
                return Err(VolumeError::Csi {
                    rpc: CsiRpc::ListVolumes,
                    subject: Subject::None,
                    source: CsiError::InvalidResponse {
                        rpc: CsiRpc::ListVolumes,
                        violation: Box::new(violation),
                        created: None,
                    },
                });
            }
            all.extend(page.volumes);
            match page.next_token {
                None => return Ok(all),
                Some(next) => token = Some(next),
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

    /// The volumes slrp grew, with the size each was grown to
    /// ([`VolumeRecord::expanded_bytes`]): the provider's reconciliation offers their disks
    /// at that size. Scans the records without copying them.
    ///
    /// # Errors
    /// [`VolumeError::Stopped`].
    pub async fn expanded(&self) -> Result<BTreeMap<VolumeId, i64>, VolumeError> {
        self.ask(|reply| Command::Expanded { reply }).await
    }

    /// The CreateVolume answers the client refused, with what became of their volumes
    /// (see [`RefusedCreate`]), as last committed, ordered by name.
    ///
    /// # Errors
    /// [`VolumeError::Stopped`], or a failed read of the store.
    pub async fn refused_creates(&self) -> Result<Vec<RefusedCreate>, VolumeError> {
        self.ask(|reply| Command::Refused { reply }).await
    }
}

pub(super) enum Command {
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
    Expanded {
        reply: Reply<BTreeMap<VolumeId, i64>>,
    },
    Snapshots {
        reply: Reply<Vec<super::SnapshotRecord>>,
    },
    Jobs {
        reply: Reply<JobCounts>,
    },
    Refused {
        reply: Reply<Vec<RefusedCreate>>,
    },
    Budget {
        reply: Reply<ListingBudget>,
    },
}

impl Command {
    /// Whether the command waits until recovery is done (everything but introspection).
    pub(super) fn waits_for_recovery(&self) -> bool {
        match self {
            Self::Job(..) | Self::List { .. } | Self::Capacity { .. } | Self::Expanded { .. } => {
                true
            }
            Self::Snapshot { .. }
            | Self::Snapshots { .. }
            | Self::Jobs { .. }
            | Self::Refused { .. }
            | Self::Budget { .. } => false,
        }
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Job(key, job) => write!(f, "{} on {key}", job.name()),
            Self::List { .. } => f.write_str("list"),
            Self::Capacity { .. } => f.write_str("capacity"),
            Self::Snapshot { .. } => f.write_str("snapshot"),
            Self::Expanded { .. } => f.write_str("expanded"),
            Self::Snapshots { .. } => f.write_str("snapshots"),
            Self::Jobs { .. } => f.write_str("jobs"),
            Self::Refused { .. } => f.write_str("refused creates"),
            Self::Budget { .. } => f.write_str("listing budget"),
        }
    }
}
