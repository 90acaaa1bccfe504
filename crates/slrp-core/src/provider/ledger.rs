//! What the provider's PENDING operations hold of the total, and the checks an operation
//! passes against it before any CSI call (spec §5.2, §5.6, §6.2), as pure functions.
//!
//! A PENDING operation's consumed resources stay in the total until it completes (its
//! conversion is applied then), but they are promised: no other operation may take them
//! (a master never offers them; a stale or duplicate event could), and a reconciliation
//! must not take the pool parts pending creates consume ([`in_flight`], which
//! [`super::resources::ProviderResources::reconcile_pools`] keeps). A disk operation
//! deferred during a reconciliation is judged again against the reconciled total when it
//! resumes ([`judge_deferred`]): the volume part of a reconciliation may have taken or
//! changed its source.

use slrp_proto::mesos::v1::Resource;
use slrp_proto::mesos::v1::offer;

use super::apply::{self, Admission, OperationError, OperationKind, RECONCILING_MESSAGE};
use super::operations::Operations;
use super::resources::{Resources, is_storage_pool};

/// `resource` without its allocation info (spec §5.6 step 1).
pub fn strip(resource: &Resource) -> Resource {
    let mut resource = resource.clone();
    resource.allocation_info = None;
    resource
}

/// The resources an operation takes out of the total, allocation info stripped: a disk
/// operation's source, a speculative operation's consumed sides, nothing for the others.
pub fn consumed_by(info: &offer::Operation) -> Resources {
    match OperationKind::of(info) {
        OperationKind::CreateDisk => info.create_disk.iter().map(|c| strip(&c.source)).collect(),
        OperationKind::DestroyDisk => info.destroy_disk.iter().map(|d| strip(&d.source)).collect(),
        OperationKind::Reserve
        | OperationKind::Unreserve
        | OperationKind::Create
        | OperationKind::Destroy => apply::speculative_conversions(info)
            .map(|conversions| {
                conversions
                    .iter()
                    .flat_map(|c| c.consumed.iter().map(strip))
                    .collect()
            })
            .unwrap_or_default(),
        OperationKind::Unsupported => Resources::new(),
    }
}

/// The storage pool resources PENDING operations consume: a reconciliation keeps them
/// (`reconcile_pools`' `in_flight`).
pub fn in_flight(ops: &Operations) -> Resources {
    ops.iter()
        .filter(|op| !op.is_terminal())
        .flat_map(|op| consumed_by(&op.info).into_vec())
        .filter(is_storage_pool)
        .collect()
}

/// What the PENDING operations other than `except` consume (running, deferred or
/// waiting for replay).
pub fn held_by_others(ops: &Operations, except: &uuid::Uuid) -> Resources {
    ops.iter()
        .filter(|op| !op.is_terminal() && op.uuid != *except)
        .flat_map(|op| consumed_by(&op.info).into_vec())
        .collect()
}

/// Whether `total`, less what the PENDING operations other than `uuid` hold, can give
/// `consumed`. Checked on the sum (`total ⊇ held + consumed`), so the total is not copied
/// on the hot path, and also when no other operation is pending: a reconciliation may
/// have taken or changed the source since the operation arrived.
///
/// # Errors
/// Mesos's "`<available>` does not contain `<consumed>`".
pub fn check_available(
    total: &Resources,
    ops: &Operations,
    uuid: &uuid::Uuid,
    consumed: &Resources,
) -> Result<(), OperationError> {
    let held = held_by_others(ops, uuid);
    if total.contains(&(held.clone() + consumed)) {
        return Ok(());
    }
    let available = total.clone() - &held;
    Err(OperationError::NotContained {
        available: available.to_string(),
        consumed: consumed.to_string(),
    })
}

/// [`Admission::Defer`] for the arriving operation `uuid` (`info`) if the total less what
/// the PENDING operations hold can give what it consumes, else its drop with Mesos's
/// reconciliation text: deferred operations must not hold the same resources, or the
/// later one would be judged against a hold that is never released before it.
pub fn confirm_deferral(
    total: &Resources,
    ops: &Operations,
    uuid: &uuid::Uuid,
    info: &offer::Operation,
) -> Admission {
    match check_available(total, ops, uuid, &consumed_by(info)) {
        Ok(()) => Admission::Defer,
        Err(_) => Admission::Drop(RECONCILING_MESSAGE.to_owned()),
    }
}

/// What becomes of a deferred operation when the reconciliation it waited for ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resumption {
    /// Its source is there: apply it.
    Apply,
    /// The reconciliation took or changed its source: it ends DROPPED with `message`
    /// (Mesos's text for an operation that meets a reconciliation) before any CSI call;
    /// `detail` says what is missing, for the log.
    Drop {
        /// The status message.
        message: &'static str,
        /// Why, for the log.
        detail: String,
    },
}

/// Judges the deferred operation `uuid` against the reconciled `total` (`None`: it is no
/// longer tracked, or no longer PENDING).
pub fn judge_deferred(
    total: &Resources,
    ops: &Operations,
    uuid: &uuid::Uuid,
) -> Option<Resumption> {
    let op = ops.get(uuid).filter(|op| !op.is_terminal())?;
    Some(
        match check_available(total, ops, uuid, &consumed_by(&op.info)) {
            Ok(()) => Resumption::Apply,
            Err(detail) => Resumption::Drop {
                message: RECONCILING_MESSAGE,
                detail: detail.to_string(),
            },
        },
    )
}
