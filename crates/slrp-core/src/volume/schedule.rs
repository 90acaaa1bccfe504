//! Scheduling: lanes (one job per volume or name at a time, in arrival order) and the
//! create gate that keeps creates of untracked names apart from jobs for untracked ids.

use std::collections::VecDeque;
use std::fmt;

use serde::Serialize;
use slrp_csi::{CsiVolumes, VolumeId};
use tracing::Instrument;

use super::error::Subject;
use super::jobs::Job;
use super::manager::Worker;

/// How many volume jobs are where, at one moment (see [`VolumeManagerHandle::jobs`](super::VolumeManagerHandle::jobs)).
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
    /// Requests waiting for recovery to finish.
    pub deferred: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Volume(VolumeId),
    Name(String),
}

impl Key {
    /// The volume id of a volume lane (a name lane's name: jobs that need an id are
    /// never queued there).
    pub(super) fn volume_id(&self) -> VolumeId {
        match self {
            Self::Volume(id) => id.clone(),
            Self::Name(n) => VolumeId::new(n.clone()),
        }
    }
}

impl Key {
    /// What an error about this lane's job is about.
    pub(super) fn subject(&self) -> Subject {
        match self {
            Self::Volume(id) => Subject::Volume(id.clone()),
            Self::Name(n) => Subject::Name(n.clone()),
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

/// How a lane job counts at the create gate (see [`Gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
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
pub(super) struct Gate {
    /// Create jobs running (started, not yet applied).
    pub(super) creates: usize,
    /// Untracked-id jobs running.
    pub(super) untracked: usize,
    /// Jobs waiting for the other class to drain, in arrival order.
    pub(super) parked: VecDeque<(Key, Job)>,
}

impl Gate {
    /// Whether a job of `class` may start now, given that `ahead` jobs wait before it.
    pub(super) fn admits(&self, class: Class, ahead: bool) -> bool {
        match class {
            Class::Free => true,
            Class::Create => !ahead && self.untracked == 0,
            Class::Untracked => !ahead && self.creates == 0,
        }
    }

    pub(super) fn enter(&mut self, class: Class) {
        match class {
            Class::Free => {}
            Class::Create => self.creates += 1,
            Class::Untracked => self.untracked += 1,
        }
    }

    pub(super) fn leave(&mut self, class: Class) {
        match class {
            Class::Free => {}
            Class::Create => self.creates = self.creates.saturating_sub(1),
            Class::Untracked => self.untracked = self.untracked.saturating_sub(1),
        }
    }
}

#[derive(Default)]
pub(super) struct Lane {
    pub(super) busy: bool,
    pub(super) queue: VecDeque<Job>,
}

impl<C: CsiVolumes> Worker<C> {
    pub(super) fn enqueue(&mut self, key: Key, job: Job) {
        self.lanes
            .entry(key.clone())
            .or_default()
            .queue
            .push_back(job);
        self.maybe_start(&key);
    }

    pub(super) fn maybe_start(&mut self, key: &Key) {
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
    pub(super) fn classify(&self, key: &Key, job: &Job) -> Class {
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
    pub(super) fn unpark(&mut self) {
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
    pub(super) fn start_job(&mut self, key: Key, job: Job, class: Class) {
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
