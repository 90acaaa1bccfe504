//! Snapshots of tracked volumes (`slrp ctl snapshot`, issue #24): durable records in the
//! manager's store, each CreateSnapshot behind an intent and each DeleteSnapshot behind
//! a mark, so that a crash leaves no snapshot the store does not know.
//!
//! - create: COMMIT intent `snapshot_create/<name>` → CreateSnapshot(name, source) →
//!   COMMIT {put `snapshot/<id>`, delete intent}. The name is the idempotency key (CSI:
//!   the same name and source give the same snapshot), so a replay after a crash finds
//!   the snapshot the lost answer was about instead of taking another. A refusal that
//!   cannot have taken a snapshot drops the intent; an answer lost (deadline, plugin
//!   gone) keeps it, and the next start settles it. The job runs on the source volume's
//!   lane: no deletion or expansion of the source runs beside it.
//! - delete: COMMIT `deleting` → DeleteSnapshot (NOT_FOUND is done) → COMMIT delete
//!   record. A refusal clears the mark (the snapshot stays listed, with why); an
//!   interrupted deletion keeps it, and the next start finishes it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use slrp_csi::{CreateSnapshotRequest, CsiError, CsiRpc, CsiVolumes, RetryClass, VolumeId};
use slrp_store::{Kind, Record};
use slrp_types::DisplayChain;

use super::error::{Subject, VolumeError};
use super::jobs::Ctx;
use super::manager::{failpoints, injected};
use super::state::VolumeRecord;

/// A snapshot slrp took: store kind `snapshot`, key = the plugin's snapshot id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The plugin's id.
    pub id: String,
    /// The CreateSnapshot name it was taken with.
    pub name: String,
    /// The volume it was taken of (it may be gone since: snapshots outlive their source).
    pub source_volume_id: VolumeId,
    /// Its size in bytes, as the plugin reported it (0: unknown).
    pub size_bytes: i64,
    /// When it was taken, seconds since the Unix epoch: the plugin's time, else when
    /// slrp recorded it.
    pub created_at: i64,
    /// Whether it can be restored from.
    #[serde(default)]
    pub ready_to_use: bool,
    /// A deletion is in progress: durable before DeleteSnapshot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    /// Why the last deletion failed, for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_failed: Option<String>,
}

impl Record for SnapshotRecord {
    const KIND: Kind = Kind::new("snapshot");
    fn key(&self) -> String {
        self.id.clone()
    }
}

/// A CreateSnapshot that may have been sent: store kind `snapshot_create`, key = name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotIntent {
    /// The CreateSnapshot name.
    pub name: String,
    /// The volume to snapshot.
    pub source_volume_id: VolumeId,
}

impl Record for SnapshotIntent {
    const KIND: Kind = Kind::new("snapshot_create");
    fn key(&self) -> String {
        self.name.clone()
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl<C: CsiVolumes> Ctx<C> {
    fn store_err(&self, subject: Subject) -> impl Fn(slrp_store::StoreError) -> VolumeError {
        move |source| VolumeError::Store {
            subject: subject.clone(),
            source,
        }
    }

    /// The snapshot taken with `name`, if one is recorded.
    async fn snapshot_named(&self, name: &str) -> Result<Option<SnapshotRecord>, VolumeError> {
        let all: Vec<SnapshotRecord> = self
            .store
            .load_all()
            .await
            .map_err(self.store_err(Subject::Name(name.to_owned())))?;
        Ok(all.into_iter().find(|s| s.name == name))
    }

    /// The `snapshot` job: takes snapshot `name` of `source` (`record`: its volume).
    /// `record` is `None` for a volume that is not tracked; a replayed intent (`replay`)
    /// is sent all the same, to learn what the lost answer was.
    pub(super) async fn create_snapshot(
        &self,
        source: &VolumeId,
        record: Option<&VolumeRecord>,
        name: &str,
        replay: bool,
    ) -> Result<SnapshotRecord, VolumeError> {
        if let Some(done) = self.snapshot_named(name).await? {
            if done.source_volume_id != *source {
                return Err(VolumeError::SnapshotNameTaken {
                    name: name.to_owned(),
                    of: done.source_volume_id,
                });
            }
            self.drop_snapshot_intent(name).await?;
            return Ok(done);
        }
        if !replay {
            match record {
                None => {
                    return Err(VolumeError::UnknownVolume { id: source.clone() });
                }
                Some(r) if r.deleting => {
                    return Err(VolumeError::BeingDeleted { id: source.clone() });
                }
                Some(_) => {}
            }
            if !self.cfg.caps.controller.create_delete_snapshot {
                return Err(VolumeError::Unsupported {
                    capability: "CREATE_DELETE_SNAPSHOT",
                    plugin_type: self.cfg.plugin_type.clone(),
                    plugin_name: self.cfg.plugin_name.clone(),
                });
            }
            let intent = SnapshotIntent {
                name: name.to_owned(),
                source_volume_id: source.clone(),
            };
            let mut tx = self.store.transaction();
            let err = self.store_err(Subject::Name(name.to_owned()));
            tx.put(&intent).map_err(&err)?;
            tx.commit().await.map_err(&err)?;
        }
        injected(failpoints::BEFORE_CALL)?;
        let req = CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source.clone(),
            parameters: slrp_csi::StringMap::new(),
        };
        let result = self
            .call(CsiRpc::CreateSnapshot, || self.csi.create_snapshot(&req))
            .await;
        injected(failpoints::AFTER_CALL)?;
        let snapshot = match result {
            Ok(s) => s,
            Err(e) => {
                if !e.may_have_taken_effect() {
                    self.drop_snapshot_intent(name).await?;
                }
                return Err(VolumeError::Csi {
                    rpc: CsiRpc::CreateSnapshot,
                    subject: Subject::Volume(source.clone()),
                    source: e,
                });
            }
        };
        let rec = SnapshotRecord {
            id: snapshot.snapshot_id,
            name: name.to_owned(),
            source_volume_id: source.clone(),
            size_bytes: snapshot.size_bytes,
            created_at: snapshot.creation_time.unwrap_or_else(now_secs),
            ready_to_use: snapshot.ready_to_use,
            deleting: false,
            delete_failed: None,
        };
        let err = self.store_err(Subject::Name(name.to_owned()));
        let mut tx = self.store.transaction();
        tx.put(&rec).map_err(&err)?;
        tx.delete::<SnapshotIntent>(name).map_err(&err)?;
        tx.commit().await.map_err(&err)?;
        tracing::info!(snapshot = %rec.id, volume = %source, bytes = rec.size_bytes, "snapshot taken");
        Ok(rec)
    }

    async fn drop_snapshot_intent(&self, name: &str) -> Result<(), VolumeError> {
        let err = self.store_err(Subject::Name(name.to_owned()));
        if self
            .store
            .get::<SnapshotIntent>(name)
            .await
            .map_err(&err)?
            .is_some()
        {
            let mut tx = self.store.transaction();
            tx.delete::<SnapshotIntent>(name).map_err(&err)?;
            tx.commit().await.map_err(&err)?;
        }
        Ok(())
    }

    /// The `delete snapshot` job. `Ok(false)`: slrp recorded no such snapshot.
    pub(super) async fn delete_snapshot(&self, id: &str) -> Result<bool, VolumeError> {
        let err = self.store_err(Subject::Name(id.to_owned()));
        let Some(rec) = self.store.get::<SnapshotRecord>(id).await.map_err(&err)? else {
            return Ok(false);
        };
        let mut marked = rec.clone();
        marked.deleting = true;
        marked.delete_failed = None;
        if marked != rec {
            let mut tx = self.store.transaction();
            tx.put(&marked).map_err(&err)?;
            tx.commit().await.map_err(&err)?;
        }
        injected(failpoints::BEFORE_CALL)?;
        let result = self
            .call(CsiRpc::DeleteSnapshot, || self.csi.delete_snapshot(id))
            .await;
        injected(failpoints::AFTER_CALL)?;
        match result {
            Err(e) if e.retry_class() != RetryClass::AlreadyDone => {
                let interrupted = e.retry_class() == RetryClass::Transient
                    || self.cancel.is_cancelled()
                    || matches!(
                        e,
                        CsiError::Cancelled { .. } | CsiError::EndpointStopped { .. }
                    );
                let e = VolumeError::Csi {
                    rpc: CsiRpc::DeleteSnapshot,
                    subject: Subject::Name(id.to_owned()),
                    source: e,
                };
                if !interrupted {
                    marked.deleting = false;
                    marked.delete_failed = Some(DisplayChain(&e).to_string());
                    let mut tx = self.store.transaction();
                    tx.put(&marked).map_err(&err)?;
                    tx.commit().await.map_err(&err)?;
                }
                Err(e)
            }
            Ok(()) | Err(_) => {
                let mut tx = self.store.transaction();
                tx.delete::<SnapshotRecord>(id).map_err(&err)?;
                tx.commit().await.map_err(&err)?;
                tracing::info!(snapshot = %id, "snapshot deleted");
                Ok(true)
            }
        }
    }
}
