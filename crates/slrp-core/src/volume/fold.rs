//! Folded commits: a caller that keeps its own durable records (the provider, whose
//! operation records bracket every CreateVolume and DeleteVolume it asks for) writes the
//! volume manager's records in its own transactions instead of beside them.
//!
//! Without folding, a disk operation waits for four commits in series: the caller's
//! PENDING record, the manager's intent (or `deleting` mark), the manager's volume record
//! (or its removal) and the caller's terminal record. Folded, the caller stages the
//! intent in its PENDING commit ([`stage_create`], [`stage_delete`]) and the manager hands
//! the record change back ([`Owed`]) for the caller's next commit, which carries the
//! terminal record: two commits.
//!
//! What the manager guarantees does not change:
//! - **Durable before the call.** The intent is durable before CreateVolume or the first
//!   step of a deletion: the caller commits it before it asks ([`VolumeManagerHandle::create_staged`]
//!   and [`VolumeManagerHandle::delete_staged`] are only for intents already committed).
//! - **Memory follows disk.** The manager applies an owed change to its memory, and frees
//!   the volume's lane, only once the caller says the change is durable
//!   ([`Committed::done`]). A caller that drops the [`Owed`] without committing it leaves
//!   the manager to commit it itself, as without folding.
//! - **Recovery.** A [`CreateVolume`] intent staged by a caller is the same record the
//!   manager writes itself, recovered the same way. A [`DeleteIntent`] stands for the
//!   record's `deleting` mark: recovery marks the record (durably) and drops the intent,
//!   so a deletion interrupted at any point is finished at the next start, as a marked
//!   record's is; an intent without a record (the volume was never tracked, or is gone)
//!   is dropped.
//!
//! [`VolumeManagerHandle::create_staged`]: super::VolumeManagerHandle::create_staged
//! [`VolumeManagerHandle::delete_staged`]: super::VolumeManagerHandle::delete_staged

use serde::{Deserialize, Serialize};
use slrp_csi::VolumeId;
use slrp_store::{Changes, Kind, Record, StoreError};
use tokio::sync::oneshot;

use super::error::VolumeError;
use super::handle::CreateVolume;
use super::state::VolumeRecord;

/// A deletion a caller asked for, durable in the caller's own commit before it asks: it
/// stands for the volume record's `deleting` mark (kind `volume_delete`, key = volume id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteIntent {
    /// The volume to delete.
    pub id: VolumeId,
}

impl Record for DeleteIntent {
    const KIND: Kind = Kind::new("volume_delete");
    fn key(&self) -> String {
        self.id.as_str().to_owned()
    }
}

/// Stages `req`'s CreateVolume intent in a caller's changes, for
/// [`VolumeManagerHandle::create_staged`](super::VolumeManagerHandle::create_staged) once
/// they are durable. Only for a name never asked for before (the provider's names are
/// fresh operation uuids): the manager then knows no earlier attempt may have created a
/// volume under it.
///
/// # Errors
/// A name the store refuses as a key.
pub fn stage_create(changes: &mut Changes, req: &CreateVolume) -> Result<(), StoreError> {
    changes.put(req).map(|_| ())
}

/// Stages the deletion intent of `id` in a caller's changes, for
/// [`VolumeManagerHandle::delete_staged`](super::VolumeManagerHandle::delete_staged) once
/// they are durable.
///
/// # Errors
/// An id the store refuses as a key.
pub fn stage_delete(changes: &mut Changes, id: &VolumeId) -> Result<(), StoreError> {
    changes.put(&DeleteIntent { id: id.clone() }).map(|_| ())
}

/// Record changes the volume manager leaves to its caller's next commit.
#[derive(Debug)]
pub struct Owed {
    /// What to commit (in the caller's transaction, in any order with its own changes:
    /// the keys are the manager's alone).
    pub changes: Changes,
    /// Said once `changes` are durable.
    pub committed: Committed,
}

impl Owed {
    /// Owed `changes` and the receiver of their [`Committed::done`]: what a stand-in for
    /// the volume manager hands a caller.
    pub fn new(changes: Changes) -> (Self, oneshot::Receiver<()>) {
        let (ack, acked) = oneshot::channel();
        let owed = Self {
            changes,
            committed: Committed(ack),
        };
        (owed, acked)
    }
}

/// Tells the volume manager that owed changes are durable: it then applies them to its
/// memory and frees the volume's lane. Dropped unsaid, the manager commits them itself.
#[derive(Debug)]
pub struct Committed(oneshot::Sender<()>);

impl Committed {
    /// The owed changes are durable.
    pub fn done(self) {
        // A manager that stopped meanwhile recovers from disk, where the changes are.
        let _ = self.0.send(());
    }
}

/// What a staged call gives: its answer and, when the manager left its record change
/// to the caller, what is owed.
#[derive(Debug)]
pub struct Staged<T> {
    /// The call's answer.
    pub value: T,
    /// The record change to commit, then to confirm with [`Committed::done`].
    pub owed: Option<Owed>,
}

/// The job's side of a staged call: where to hand the answer and the owed changes
/// before the job ends. A job that ends without handing over drops it, and the caller
/// then hears the job's ordinary answer.
pub(super) struct Fold<T>(oneshot::Sender<(T, Owed)>);

impl<T> Fold<T> {
    pub(super) fn new() -> (Self, oneshot::Receiver<(T, Owed)>) {
        let (tx, rx) = oneshot::channel();
        (Self(tx), rx)
    }

    /// Hands `value` and `changes` to the caller and waits until it committed them.
    /// False if the caller is gone or dropped them: the job must commit them itself.
    pub(super) async fn hand_over(self, value: T, changes: Changes) -> bool {
        let (owed, acked) = Owed::new(changes);
        if self.0.send((value, owed)).is_err() {
            return false;
        }
        acked.await.is_ok()
    }
}

/// The changes that record a created volume: its record in, its intent out.
pub(super) fn created_changes(rec: &VolumeRecord, name: &str) -> Result<Changes, StoreError> {
    let mut changes = Changes::new();
    changes.put(rec)?.delete::<CreateVolume>(name)?;
    Ok(changes)
}

/// The changes that forget a deleted volume: its record and its deletion intent out.
pub(super) fn deleted_changes(id: &VolumeId) -> Result<Changes, StoreError> {
    let mut changes = Changes::new();
    changes
        .delete::<VolumeRecord>(id.as_str())?
        .delete::<DeleteIntent>(id.as_str())?;
    Ok(changes)
}

/// Waits for a staged call's answer: the owed changes if the job handed them over, else
/// the job's ordinary answer.
pub(super) async fn receive<T>(
    folded: oneshot::Receiver<(T, Owed)>,
    answer: oneshot::Receiver<Result<T, VolumeError>>,
) -> Result<Staged<T>, VolumeError> {
    match folded.await {
        Ok((value, owed)) => Ok(Staged {
            value,
            owed: Some(owed),
        }),
        Err(_) => answer
            .await
            .map_err(|_| VolumeError::Stopped)?
            .map(|value| Staged { value, owed: None }),
    }
}
