//! Volume usage and health: a poller per provider that asks the plugin how full each
//! volume is and whether it is well, a cache of the answers, and their metrics.
//!
//! # Overview
//!
//! Mesos's SLRP never asks a plugin about a volume once it exists; kubelet does, and pays
//! for it with load spikes on busy nodes. The [`poller`] asks, at a cost that stays flat as
//! the volume count grows:
//!
//! - published volumes: `NodeGetVolumeStats` on the target path (bytes and inodes, and the
//!   node's `volume_condition` when the node advertises `VOLUME_CONDITION`);
//! - the others (and published ones whose node gives no condition): `ControllerGetVolume`
//!   when the controller advertises `GET_VOLUME` and `VOLUME_CONDITION`, or else one sweep
//!   of `ListVolumes` per interval reading each entry's `status.volume_condition`, when it
//!   advertises `LIST_VOLUMES` and `VOLUME_CONDITION`.
//!
//! Only calls the plugin advertises are made ([`Plan::of`]); a plugin with none of them
//! gets no poller at all.
//!
//! # Bounds
//!
//! - At most [`HealthConfig::concurrency`] calls in flight per provider (default
//!   [`DEFAULT_CONCURRENCY`]), each bounded by [`HealthConfig::timeout`].
//! - Each volume at most once per [`HealthConfig::interval`] (default 60 s). A volume's
//!   first poll is drawn uniformly over one interval, so volumes that appear together (a
//!   restart, 10,000 published at once) are spread over it instead of coming due together.
//! - A call that fails transiently (unavailable, deadline, timeout) pauses the poller for a
//!   doubling wait drawn between half and all of its ceiling ([`HealthConfig::backoff`]);
//!   after each pause a single call probes the plugin, and only its success brings the
//!   poller back to full concurrency.
//! - The poller has its own CSI clients (own connection, own deadline, own metrics) and
//!   reads the volume manager only through its snapshot ([`slrp_core::volume::VolumeManagerHandle::volumes`]):
//!   it never holds a volume lane, a job or a permit an operation needs, so a plugin that
//!   hangs in `NodeGetVolumeStats` cannot delay CREATE_DISK or a publish.
//! - The list of volumes is re-read when the volume manager reports that a volume moved
//!   (a moment later, [`REFRESH_SETTLE`], and at most once per [`REFRESH_DEBOUNCE`] or
//!   per a hundred times what the last read took, whichever is longer: the reads take
//!   at most 1% of the volume manager's time however often volumes move) and
//!   once per interval otherwise; a volume gone from it is dropped from the cache (and so
//!   from the metrics) then.
//!
//! # Layout
//!
//! - [`cache`]: [`HealthCache`], the samples per volume, and the log of condition changes.
//! - [`poller`]: [`HealthPoller`], the task; [`HealthCalls`] and [`VolumeSource`], its
//!   boundaries (real: [`slrp_csi::CsiServices`] and the volume manager; fakes in tests).
//! - [`metrics`]: [`HealthMetrics`], the per-volume `slrp_volume_stats_*` families and the
//!   poller's own counters, encoded from the caches on every scrape.
//!
//! # Limitations
//!
//! - Usage is asked only of published volumes: CSI defines `NodeGetVolumeStats` on a
//!   staging or target path, and an unpublished volume has neither.
//! - The cache is not durable: after a restart every volume is `-` until its first poll.

pub mod cache;
pub mod metrics;
pub mod poller;

use std::time::Duration;

use slrp_csi::{CsiCapabilities, CsiVersion};
use slrp_types::Backoff;

pub use cache::{Amounts, Condition, HealthCache, HealthStatus, Usage, VolumeHealth};
pub use metrics::{HealthMetrics, ProviderHealth};
pub use poller::{
    HealthCalls, HealthPoller, ManagerVolumes, MovedNotice, TrackedVolume, VolumeSource,
};

/// How often each volume is asked about by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// Calls in flight per provider by default: enough to keep up with 10,000 volumes per
/// minute against a plugin answering in 10 ms, small enough to leave the plugin to the
/// operations.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// Deadline of one poller call by default (the volume manager's calls have Mesos's 1 min).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause after a transiently failed call by default: Mesos's RPC retry bounds, 10 s
/// doubling up to 10 min.
pub const DEFAULT_BACKOFF: Backoff = Backoff::MESOS;

/// The shortest time between two reads of the volume manager's records for the poller.
pub const REFRESH_DEBOUNCE: Duration = Duration::from_secs(1);

/// How long after a "volume moved" notice the records are read: the notice of a
/// DeleteVolume comes as the call ends, before the manager drops the record.
pub const REFRESH_SETTLE: Duration = Duration::from_millis(250);

/// The poller's settings (`[volume_health]` in the daemon's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// How often each volume is asked about (at most once per interval).
    pub interval: Duration,
    /// Calls in flight per provider, at most.
    pub concurrency: usize,
    /// Deadline of one call.
    pub timeout: Duration,
    /// The pause after a transient failure (doubling from `base` up to `max`, jittered).
    pub backoff: Backoff,
    /// Whether the poller runs at all.
    pub enabled: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_INTERVAL,
            concurrency: DEFAULT_CONCURRENCY,
            timeout: DEFAULT_TIMEOUT,
            backoff: DEFAULT_BACKOFF,
            enabled: true,
        }
    }
}

/// How the controller is asked about conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerCheck {
    /// Not at all (no `VOLUME_CONDITION`, or neither `GET_VOLUME` nor `LIST_VOLUMES`).
    None,
    /// `ControllerGetVolume` per volume.
    GetVolume,
    /// One `ListVolumes` sweep per interval.
    List,
}

/// What the poller asks a plugin, from what the plugin advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// `NodeGetVolumeStats` for published volumes (`GET_VOLUME_STATS`).
    pub stats: bool,
    /// Its answers carry a condition (node `VOLUME_CONDITION`).
    pub node_condition: bool,
    /// Conditions from the controller.
    pub controller: ControllerCheck,
}

impl Plan {
    /// The calls `caps` allow. CSI 0.x has none of them.
    pub fn of(caps: &CsiCapabilities, version: CsiVersion) -> Self {
        if version == CsiVersion::V0 {
            return Self::idle();
        }
        let c = &caps.controller;
        let controller = match (c.volume_condition, c.get_volume, c.list_volumes) {
            (true, true, _) => ControllerCheck::GetVolume,
            (true, false, true) => ControllerCheck::List,
            (true, false, false) | (false, _, _) => ControllerCheck::None,
        };
        Self {
            stats: caps.node.get_volume_stats,
            node_condition: caps.node.get_volume_stats && caps.node.volume_condition,
            controller,
        }
    }

    /// A plan that asks nothing.
    pub fn idle() -> Self {
        Self {
            stats: false,
            node_condition: false,
            controller: ControllerCheck::None,
        }
    }

    /// Whether nothing is ever asked (no poller is started).
    pub fn is_idle(&self) -> bool {
        !self.stats && self.controller == ControllerCheck::None
    }

    /// Whether the condition of a volume (published or not) comes from the controller.
    pub fn controller_condition(&self, published: bool) -> bool {
        self.controller != ControllerCheck::None && !(published && self.node_condition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(
        stats: bool,
        node_cond: bool,
        get: bool,
        list: bool,
        ctl_cond: bool,
    ) -> CsiCapabilities {
        let mut c = CsiCapabilities::default();
        c.node.get_volume_stats = stats;
        c.node.volume_condition = node_cond;
        c.controller.get_volume = get;
        c.controller.list_volumes = list;
        c.controller.volume_condition = ctl_cond;
        c
    }

    #[test]
    fn the_plan_asks_only_what_is_advertised() {
        let none = Plan::of(&caps(false, false, false, false, false), CsiVersion::V1);
        assert!(none.is_idle());
        // GET_VOLUME or LIST_VOLUMES without VOLUME_CONDITION tell nothing of health.
        assert!(Plan::of(&caps(false, false, true, true, false), CsiVersion::V1).is_idle());
        // A node condition without stats is no call.
        assert!(Plan::of(&caps(false, true, false, false, false), CsiVersion::V1).is_idle());

        let bundled = Plan::of(&caps(true, true, true, true, true), CsiVersion::V1);
        assert_eq!(
            bundled,
            Plan {
                stats: true,
                node_condition: true,
                controller: ControllerCheck::GetVolume
            }
        );
        assert!(!bundled.controller_condition(true));
        assert!(bundled.controller_condition(false));

        let listing = Plan::of(&caps(true, false, false, true, true), CsiVersion::V1);
        assert_eq!(listing.controller, ControllerCheck::List);
        assert!(listing.controller_condition(true), "the node gives none");

        let all = caps(true, true, true, true, true);
        assert!(Plan::of(&all, CsiVersion::V0).is_idle(), "CSI 0.x has none");
    }
}
