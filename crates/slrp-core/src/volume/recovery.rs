//! Recovery: at start, maps the stored records to this boot and the mount table, and
//! queues the jobs that finish what a crash interrupted (see the manager's docs,
//! "Recovery").

use std::collections::HashSet;

use slrp_csi::{CsiVolumes, VolumeId};
use slrp_types::DisplayChain;

use super::error::{Subject, VolumeError};
use super::fold::DeleteIntent;
use super::handle::{CreateVolume, Readiness};
use super::jobs::{Change, Ctx, Job};
use super::manager::Worker;
use super::plan::{PlannedJob, RecoveryGoal, plan_recovery};
use super::refused::RefusedCreate;
use super::schedule::Key;
use super::state::{Goal, VolumeRecord};

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
    /// CreateVolume intents found (each tried once during recovery).
    pub intents: usize,
    /// Refused CreateVolume answers whose volume was still to be deleted (each deletion
    /// tried once during recovery, then in the background; never a CreateVolume).
    pub refused_deletions: usize,
    /// Names of CreateVolume intents recovery could not settle (the plugin may have
    /// created the volume but did not say so): kept, retried in the background, and
    /// not blocking readiness.
    pub unsettled_intents: Vec<String>,
    /// Untracked mount directories removed.
    pub collected: usize,
    /// Failures that do not block readiness (re-drives of in-flight states, directories
    /// that are still mounted).
    pub warnings: Vec<String>,
}

/// What a recovery job reports.
pub(super) enum RecoveryResult {
    Done,
    Collected,
    /// Did not work, but does not block readiness.
    Warning(String),
    /// Blocks readiness.
    Failed(String),
    /// A CreateVolume intent that stays (does not block readiness).
    Unsettled {
        /// The CreateVolume name.
        name: String,
        /// The last attempt's failure.
        why: String,
    },
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
        let mut records: Vec<VolumeRecord> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        // A caller's deletion intent is the `deleting` mark it stood for: marked here
        // (made durable with the plan's changes below, the intents dropped with them),
        // the deletion is finished like any interrupted one.
        let deletions: Vec<DeleteIntent> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let mut marked = Vec::new();
        if !deletions.is_empty() {
            let ids: HashSet<&VolumeId> = deletions.iter().map(|d| &d.id).collect();
            for rec in &mut records {
                if ids.contains(&rec.id) {
                    let mark = rec.marked_for_deletion();
                    if mark != *rec {
                        *rec = mark;
                        marked.push(rec.clone());
                    }
                }
            }
            tracing::info!(
                intents = deletions.len(),
                marked = marked.len(),
                "deletion intents found"
            );
        }
        let intents: Vec<CreateVolume> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let refused: Vec<RefusedCreate> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let owed: Vec<CreateVolume> = refused
            .into_iter()
            .filter(|r| r.cleanup.is_pending())
            .map(|r| r.request)
            .collect();
        let cfg = &self.ctx.cfg;
        let mut report = RecoveryReport {
            volumes: records.len(),
            intents: intents.len(),
            refused_deletions: owed.len(),
            ..RecoveryReport::default()
        };
        let mounts = cfg.mounts.mounts_under(cfg.mount_paths.root());
        if let Err(e) = &mounts {
            report.warnings.push(format!(
                "mount table unreadable, mounts not reconciled: {}",
                DisplayChain(e)
            ));
        }
        let mounts = mounts.as_deref().ok();
        let mut plan = plan_recovery(records, intents, &cfg.boot_id, mounts, &cfg.mount_paths);
        for rec in marked {
            if !plan.changed.iter().any(|c| c.id == rec.id) {
                plan.changed.push(rec);
            }
        }
        report.rebooted = plan.rebooted;
        for m in &plan.mismatches {
            if m.redriven {
                report.mount_mismatches += 1;
                tracing::warn!(volume = %m.id, state = %m.state, target_mounted = m.target_mounted,
                    "mount table disagrees with the volume state; re-driving");
            } else {
                tracing::warn!(volume = %m.id, state = %m.state,
                    "target is mounted although the volume is not staged; left alone");
            }
        }
        if !plan.changed.is_empty() || !deletions.is_empty() {
            let mut tx = store.transaction();
            for rec in &plan.changed {
                tx.put(rec).map_err(|source| VolumeError::Store {
                    subject: Subject::Volume(rec.id.clone()),
                    source,
                })?;
            }
            for intent in &deletions {
                tx.delete::<DeleteIntent>(intent.id.as_str())
                    .map_err(|source| VolumeError::Store {
                        subject: Subject::Volume(intent.id.clone()),
                        source,
                    })?;
            }
            tx.commit().await.map_err(|source| VolumeError::Store {
                subject: Subject::Recovered {
                    count: plan.changed.len(),
                },
                source,
            })?;
        }
        // Sized once: growing a map of 100,000 records rehashes it into a table twice
        // the size while the old one is alive, a transient of tens of MiB at the start.
        self.volumes.reserve(plan.records.len());
        self.names
            .reserve(plan.records.iter().filter(|r| r.name.is_some()).count());
        for rec in plan.records {
            if let Some(name) = &rec.name {
                self.names.insert(name.clone(), rec.id.clone());
            }
            self.volumes.insert(rec.id.clone(), rec);
        }
        let mut jobs: Vec<(Key, Job)> = plan
            .jobs
            .into_iter()
            .map(|job| match job {
                PlannedJob::Recover { id, goal } => (Key::Volume(id), Job::Recover { goal }),
                PlannedJob::Create(req) => (
                    Key::Name(req.name.clone()),
                    Job::Create {
                        req,
                        reply: None,
                        attempt: 0,
                        fold: None,
                    },
                ),
            })
            .collect();
        // A create job of a refused name only settles what it owes (the DeleteVolume),
        // on the name's lane like an intent, and is retried in the background the same
        // way when that fails.
        jobs.extend(owed.into_iter().map(|req| {
            (
                Key::Name(req.name.clone()),
                Job::Create {
                    req,
                    reply: None,
                    attempt: 0,
                    fold: None,
                },
            )
        }));
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
        // Snapshots settle beside readiness (no volume waits for them): an intent is
        // sent again to learn what its lost answer was, a deletion is finished.
        let store = self.ctx.store.clone();
        let snapshot_intents: Vec<super::SnapshotIntent> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        let snapshots: Vec<super::SnapshotRecord> = store
            .load_all()
            .await
            .map_err(|source| VolumeError::Load { source })?;
        for intent in snapshot_intents {
            tracing::info!(snapshot_name = %intent.name, volume = %intent.source_volume_id,
                "settling an interrupted CreateSnapshot");
            self.enqueue(
                Key::Volume(intent.source_volume_id),
                Job::Snapshot {
                    name: intent.name,
                    reply: None,
                },
            );
        }
        for snapshot in snapshots.into_iter().filter(|s| s.deleting) {
            tracing::info!(snapshot = %snapshot.id, "finishing an interrupted DeleteSnapshot");
            self.enqueue(
                Key::Name(format!("snapshot {}", snapshot.id)),
                Job::DeleteSnapshot {
                    id: snapshot.id,
                    reply: None,
                },
            );
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
        let mut result = match goal {
            RecoveryGoal::Delete => {
                let id = rec.id.clone();
                let (result, change) = self.delete(&id, Some(rec), None).await;
                return (result.map(|_| ()), change);
            }
            RecoveryGoal::Republish => self.drive(&mut rec, Goal::Published).await,
            RecoveryGoal::AfterReboot { republish } => {
                let mut result = self.drive(&mut rec, Goal::NodeReady).await;
                if result.is_ok() && republish {
                    result = self.drive(&mut rec, Goal::Published).await;
                }
                result
            }
            RecoveryGoal::Reach(goal) => self.drive(&mut rec, goal).await,
            RecoveryGoal::Expand => Ok(()),
        };
        if result.is_ok() && rec.expansion.is_some() {
            // An expansion is not required for readiness: the volume is usable at its
            // old size. A transient failure keeps it for the next start.
            if let Err(e) = self.resume_expansion(&mut rec).await {
                if e.is_fatal() {
                    result = Err(e);
                } else {
                    tracing::warn!(volume = %rec.id, error = %slrp_types::DisplayChain(&e),
                        "the interrupted expansion did not finish");
                }
            }
        }
        (result, Change::Put(Box::new(rec)))
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
