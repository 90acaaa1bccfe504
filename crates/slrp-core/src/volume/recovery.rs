//! Recovery: at start, maps the stored records to this boot and the mount table, and
//! queues the jobs that finish what a crash interrupted (see the manager's docs,
//! "Recovery").

use std::path::PathBuf;

use slrp_csi::CsiVolumes;
use slrp_types::DisplayChain;

use super::error::{Subject, VolumeError};
use super::handle::{CreateVolume, Readiness};
use super::jobs::{Change, Ctx, Job};
use super::manager::{VolumeManagerConfig, Worker};
use super::schedule::Key;
use super::state::{BootId, CsiCall, Goal, VolumeRecord, VolumeState};

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

/// What recovery wants for a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecoveryGoal {
    Reach(Goal),
    /// Publish again: must succeed before the manager is ready.
    Republish,
    /// Back to NODE_READY after a reboot, then (if required) publish again.
    AfterReboot {
        republish: bool,
    },
    Delete,
}

/// What a recovery job reports.
pub(super) enum RecoveryResult {
    Done,
    Collected,
    /// Did not work, but does not block readiness.
    Warning(String),
    /// Blocks readiness.
    Failed(String),
}

pub(super) struct RecoveryProgress {
    pub(super) pending: usize,
    pub(super) report: RecoveryReport,
    pub(super) failures: Vec<String>,
}

impl<C: CsiVolumes> Worker<C> {
    /// Loads the state, maps it to this boot and the mount table, and queues the
    /// recovery jobs.
    pub(super) async fn start(&mut self) -> Result<(), VolumeError> {
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
                    subject: Subject::Volume(rec.id.clone()),
                    source,
                })?;
            }
            tx.commit().await.map_err(|source| VolumeError::Store {
                subject: Subject::Recovered {
                    count: changed.len(),
                },
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

    pub(super) fn maybe_ready(&mut self) {
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
            // Served whatever the outcome: readiness tells the caller whether to trust
            // the volumes; the requests themselves are answered on their own merits.
            for cmd in std::mem::take(&mut self.deferred) {
                self.on_command(cmd);
            }
        }
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

impl<C: CsiVolumes> Ctx<C> {
    pub(super) async fn recover(
        &self,
        key: &Key,
        goal: RecoveryGoal,
        record: Option<VolumeRecord>,
    ) -> (Result<(), VolumeError>, Change) {
        let Some(mut rec) = record else {
            let e = VolumeError::Internal {
                subject: key.subject(),
                what: "its record vanished before recovery",
            };
            return (Err(e), Change::None);
        };
        match goal {
            RecoveryGoal::Delete => match self.delete_steps(&mut rec).await {
                Ok(_) => (Ok(()), Change::Remove(rec.id)),
                Err(e) => {
                    let e = self.delete_ended(&mut rec, e).await;
                    (Err(e), Change::Put(Box::new(rec)))
                }
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
}

pub(super) fn recovery_summary<T>(
    result: &Result<T, VolumeError>,
    required: bool,
) -> RecoveryResult {
    match result {
        Ok(_) => RecoveryResult::Done,
        Err(e) => {
            let text = DisplayChain(e).to_string();
            if required {
                RecoveryResult::Failed(text)
            } else {
                RecoveryResult::Warning(text)
            }
        }
    }
}
