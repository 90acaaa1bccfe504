//! Recovery planning, pure: what the stored state means in this boot, given the mount
//! table, and which jobs finish what a crash or a reboot interrupted. No I/O, no clock,
//! no tokio: [`plan_recovery`] takes the loaded records and intents, the boot id and
//! the mounts, and returns a [`RecoveryPlan`] the manager commits and runs (see the
//! manager's docs, "Recovery", and `docs/volume-manager.md`).

use std::path::PathBuf;

use slrp_csi::VolumeId;

use super::handle::CreateVolume;
use super::paths::MountPaths;
use super::state::{BootId, CsiCall, Goal, StateName, VolumeRecord, VolumeState};

/// What recovery wants for a tracked volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryGoal {
    /// Finish the interrupted call in its own direction.
    Reach(Goal),
    /// Publish again (`node_publish_required`): must succeed before the manager is
    /// ready.
    Republish,
    /// Back to NODE_READY after a reboot (undoing what the plugin may still record of
    /// the earlier boot's stagings and publications), then publish again if required.
    AfterReboot {
        /// Whether the volume must be published again (`node_publish_required`).
        republish: bool,
    },
    /// Finish an interrupted deletion.
    Delete,
    /// Finish an interrupted expansion (the record holds an `expansion` and nothing
    /// else to recover; the other goals finish one too, after their own work).
    Expand,
}

impl RecoveryGoal {
    /// Whether failing to reach the goal keeps the manager from being ready.
    pub fn is_required(self) -> bool {
        match self {
            Self::Republish | Self::AfterReboot { republish: true } => true,
            Self::Reach(_)
            | Self::AfterReboot { republish: false }
            | Self::Delete
            | Self::Expand => false,
        }
    }
}

/// A job recovery runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedJob {
    /// Drive a tracked volume to a goal.
    Recover {
        /// The volume.
        id: VolumeId,
        /// Where to.
        goal: RecoveryGoal,
    },
    /// Re-issue CreateVolume for an intent (idempotent by name in CSI) and track the
    /// result.
    Create(CreateVolume),
}

/// A volume whose state disagrees with the mount table (same boot), with what the plan
/// does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountMismatch {
    /// The volume.
    pub id: VolumeId,
    /// Its stored state.
    pub state: StateName,
    /// Whether its target path is mounted.
    pub target_mounted: bool,
    /// Whether the plan re-drives a call for it (otherwise it is only reported: a
    /// target mounted although the volume is not even staged is left alone).
    pub redriven: bool,
}

/// What recovery does; [`plan_recovery`]'s answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Every record, mapped to this boot and the mount table: what the manager tracks.
    pub records: Vec<VolumeRecord>,
    /// The records that differ from what is stored: committed (in one transaction)
    /// before any job runs.
    pub changed: Vec<VolumeRecord>,
    /// The jobs to run, records' first (in the order given), then intents'.
    pub jobs: Vec<PlannedJob>,
    /// Records whose stored boot id is stale.
    pub rebooted: usize,
    /// Records whose state disagrees with the mount table.
    pub mismatches: Vec<MountMismatch>,
}

/// Plans recovery: maps each stored record to boot `now` and, where the boot is the
/// same, to the mount table (`mounts`: the mount points under the mount root; `None`
/// when the table could not be read, and then mounts are not reconciled), and names the
/// job that finishes its interrupted work. Every intent becomes a CreateVolume job.
///
/// - A stale boot id means every mount of the volume is gone, but the plugin may still
///   record its staging or publication: a published (or publishing, or unpublishing)
///   volume goes to NODE_UNPUBLISH and a staged one to NODE_UNSTAGE, both in boot `now`,
///   and is walked back to NODE_READY (then published again if it must be).
/// - In the same boot, a PUBLISHED volume whose target is not mounted re-drives
///   NodePublish, and a VOL_READY one whose target is mounted re-drives NodeUnpublish.
/// - Then: a deletion is finished; a volume with `node_publish_required` is published
///   again; an in-flight call is finished in its own direction.
pub fn plan_recovery(
    stored: Vec<VolumeRecord>,
    intents: Vec<CreateVolume>,
    now: &BootId,
    mounts: Option<&[PathBuf]>,
    paths: &MountPaths,
) -> RecoveryPlan {
    let mut plan = RecoveryPlan::default();
    for old in stored {
        let mut rec = old.clone();
        let rebooted = old.state.boot_id().is_some_and(|b| b != now);
        if rebooted {
            plan.rebooted += 1;
            if let Some(state) = undo_after_reboot(&old.state, now) {
                rec.state = state;
            }
        } else if let Some(mounts) = mounts
            && let Some(mismatch) = reconcile_mounts(&mut rec, paths, mounts)
        {
            plan.mismatches.push(mismatch);
        }
        let goal = if rebooted && !rec.deleting {
            Some(RecoveryGoal::AfterReboot {
                republish: rec.node_publish_required,
            })
        } else {
            recovery_goal(&rec)
        };
        if let Some(goal) = goal {
            let id = rec.id.clone();
            plan.jobs.push(PlannedJob::Recover { id, goal });
        }
        if rec != old {
            plan.changed.push(rec.clone());
        }
        plan.records.push(rec);
    }
    plan.jobs
        .extend(intents.into_iter().map(PlannedJob::Create));
    plan
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

/// The goal recovery drives a (mapped) record to, if any.
fn recovery_goal(rec: &VolumeRecord) -> Option<RecoveryGoal> {
    if rec.deleting {
        return Some(RecoveryGoal::Delete);
    }
    if rec.node_publish_required {
        return Some(RecoveryGoal::Republish);
    }
    let reach = rec.state.in_flight_call().map(|call| {
        RecoveryGoal::Reach(match call {
            CsiCall::ControllerPublish | CsiCall::NodeUnstage => Goal::NodeReady,
            CsiCall::ControllerUnpublish => Goal::Created,
            CsiCall::NodeStage | CsiCall::NodeUnpublish => Goal::VolReady,
            CsiCall::NodePublish => Goal::Published,
        })
    });
    // An expansion owing only NodeExpandVolume waits for the volume's next publish.
    let expansion = rec
        .expansion
        .as_ref()
        .is_some_and(|e| !e.node_owed || rec.state.name() == StateName::Published);
    reach.or(expansion.then_some(RecoveryGoal::Expand))
}

/// Compares a record with the mount table (same boot only: after a reboot nothing of
/// the earlier boot is mounted). Changes the record to re-drive a call where the table
/// shows the state is wrong; returns the disagreement, if any.
fn reconcile_mounts(
    rec: &mut VolumeRecord,
    paths: &MountPaths,
    mounts: &[PathBuf],
) -> Option<MountMismatch> {
    let target = paths.target(&rec.id).ok()?;
    let target_mounted = mounts.iter().any(|m| m == &target);
    let next = match &rec.state {
        // Published, but the target is gone (unmounted behind our back): publish again.
        VolumeState::Published {
            boot_id,
            publish_context,
        } if !target_mounted => Some(VolumeState::NodePublishing {
            boot_id: boot_id.clone(),
            publish_context: publish_context.clone(),
        }),
        // Not published, but something is mounted at the target: a publish whose
        // record was lost (or a stray mount). NodeUnpublish is idempotent.
        VolumeState::VolReady {
            boot_id,
            publish_context,
        } if target_mounted => Some(VolumeState::NodeUnpublishing {
            boot_id: boot_id.clone(),
            publish_context: publish_context.clone(),
        }),
        // Mounted although not even staged: not ours to undo, only reported.
        VolumeState::Created | VolumeState::NodeReady { .. } if target_mounted => None,
        VolumeState::Created
        | VolumeState::ControllerPublishing
        | VolumeState::NodeReady { .. }
        | VolumeState::ControllerUnpublishing
        | VolumeState::NodeStaging { .. }
        | VolumeState::VolReady { .. }
        | VolumeState::NodePublishing { .. }
        | VolumeState::Published { .. }
        | VolumeState::NodeUnpublishing { .. }
        | VolumeState::NodeUnstaging { .. } => return None,
    };
    let mismatch = MountMismatch {
        id: rec.id.clone(),
        state: rec.state.name(),
        target_mounted,
        redriven: next.is_some(),
    };
    if let Some(next) = next {
        rec.state = next;
    }
    Some(mismatch)
}
