//! The poller's answers per volume, shared with the admin API and the metrics.
//!
//! The cache is a map behind a `std::sync::Mutex`: the poller writes one entry per
//! answer, readers copy what they need; no lock is held across an await. A change of a
//! volume's condition (to abnormal, and back) is logged here, once per change, with the
//! plugin's message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use slrp_csi::{UsageUnit, VolumeCondition, VolumeId, VolumeStats};
use tokio::time::Instant;

/// Total, available and used amounts of one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Amounts {
    /// Total.
    pub total: u64,
    /// Available.
    pub available: u64,
    /// Used.
    pub used: u64,
}

/// What `NodeGetVolumeStats` said of a volume's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    /// Bytes, if the plugin reported them.
    pub bytes: Option<Amounts>,
    /// Inodes, if the plugin reported them.
    pub inodes: Option<Amounts>,
}

impl Usage {
    /// The usage entries of `stats` (negative amounts read as 0; entries of unknown unit
    /// ignored; the last entry of a unit wins).
    pub fn of(stats: &VolumeStats) -> Self {
        let mut usage = Self::default();
        for u in &stats.usage {
            let amounts = Amounts {
                total: u64::try_from(u.total).unwrap_or(0),
                available: u64::try_from(u.available).unwrap_or(0),
                used: u64::try_from(u.used).unwrap_or(0),
            };
            match u.unit {
                UsageUnit::Bytes => usage.bytes = Some(amounts),
                UsageUnit::Inodes => usage.inodes = Some(amounts),
                UsageUnit::Unknown => {}
            }
        }
        usage
    }

    /// Whether the plugin reported nothing usable.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_none() && self.inodes.is_none()
    }
}

/// A volume's condition and which call reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Condition {
    /// Whether the plugin reports the volume abnormal.
    pub abnormal: bool,
    /// The plugin's message.
    pub message: String,
    /// The CSI call that said so (`NodeGetVolumeStats`, `ControllerGetVolume`,
    /// `ListVolumes`).
    pub source: &'static str,
}

impl Condition {
    /// `c` as reported by `source`.
    pub fn from_csi(c: VolumeCondition, source: &'static str) -> Self {
        Self {
            abnormal: c.abnormal,
            message: c.message,
            source,
        }
    }
}

/// `ok`, `abnormal`, or `-` when the plugin cannot tell (or has not been asked yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// The plugin reports the volume normal.
    Ok,
    /// The plugin reports it abnormal.
    Abnormal,
    /// No condition is known.
    Unknown,
}

impl HealthStatus {
    /// `ok`, `abnormal` or `-`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Abnormal => "abnormal",
            Self::Unknown => "-",
        }
    }
}

/// What is known of one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeHealth {
    /// The last usage sample (published volumes only; dropped on unpublish).
    pub usage: Option<Usage>,
    /// The last condition reported.
    pub condition: Option<Condition>,
    /// When the last successful answer arrived (monotonic: ages are computed from it;
    /// the wall clock time shown is now less the age).
    pub sampled_at: Option<Instant>,
    /// The last call's failure, until a call succeeds.
    pub last_error: Option<String>,
}

impl VolumeHealth {
    fn empty() -> Self {
        Self {
            usage: None,
            condition: None,
            sampled_at: None,
            last_error: None,
        }
    }

    /// `ok`, `abnormal` or unknown.
    pub fn status(&self) -> HealthStatus {
        match &self.condition {
            Some(c) if c.abnormal => HealthStatus::Abnormal,
            Some(_) => HealthStatus::Ok,
            None => HealthStatus::Unknown,
        }
    }

    /// How old the last sample is at `now`.
    pub fn age(&self, now: Instant) -> Option<Duration> {
        self.sampled_at.map(|t| now.saturating_duration_since(t))
    }
}

/// One provider's samples; cheap to clone (clones share the map).
#[derive(Debug, Clone)]
pub struct HealthCache {
    provider: Arc<str>,
    volumes: Arc<Mutex<HashMap<VolumeId, VolumeHealth>>>,
}

impl HealthCache {
    /// An empty cache for the provider `<type>.<name>` (named in its log lines).
    pub fn new(provider: &str) -> Self {
        Self {
            provider: Arc::from(provider),
            volumes: Arc::default(),
        }
    }

    /// `<type>.<name>` of the provider.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<VolumeId, VolumeHealth>) -> T) -> T {
        let mut map = self.volumes.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut map)
    }

    /// What is known of volume `id`.
    pub fn get(&self, id: &VolumeId) -> Option<VolumeHealth> {
        self.with(|m| m.get(id).cloned())
    }

    /// Every volume's entry, in no particular order.
    pub fn all(&self) -> Vec<(VolumeId, VolumeHealth)> {
        self.with(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Calls `f` with every entry, under the lock (for the metrics: no copy).
    pub fn for_each(&self, mut f: impl FnMut(&VolumeId, &VolumeHealth)) {
        self.with(|m| m.iter().for_each(|(k, v)| f(k, v)));
    }

    /// Volumes with an entry.
    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    /// Whether no volume has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The age of the oldest sample at `now` (`None` without samples).
    pub fn oldest_age(&self, now: Instant) -> Option<Duration> {
        self.with(|m| m.values().filter_map(|v| v.age(now)).max())
    }

    /// Starts tracking `id` (no sample yet); an entry that exists is kept.
    pub fn track(&self, id: &VolumeId) {
        self.with(|m| {
            m.entry(id.clone()).or_insert_with(VolumeHealth::empty);
        });
    }

    /// Drops volume `id` (destroyed, or no longer tracked).
    pub fn forget(&self, id: &VolumeId) {
        self.with(|m| m.remove(id));
    }

    /// Drops every volume `keep` refuses.
    pub fn retain(&self, mut keep: impl FnMut(&VolumeId) -> bool) {
        self.with(|m| m.retain(|id, _| keep(id)));
    }

    /// Drops everything (the poller stopped: its samples would only grow stale).
    pub fn clear(&self) {
        self.with(HashMap::clear);
    }

    /// Forgets the usage of `id` (it was unpublished: usage is no longer asked).
    pub fn drop_usage(&self, id: &VolumeId) {
        self.with(|m| {
            if let Some(v) = m.get_mut(id) {
                v.usage = None;
            }
        });
    }

    /// Records a successful answer about a tracked volume `id` at `now`: its usage (if
    /// asked) and condition (if given). A volume no longer tracked (forgotten while the
    /// call was in flight) is not brought back. A change of the condition is logged.
    pub fn record(
        &self,
        id: &VolumeId,
        usage: Option<Usage>,
        condition: Option<Condition>,
        now: Instant,
    ) {
        let change = self.with(|m| {
            let entry = m.get_mut(id)?;
            if let Some(usage) = usage {
                entry.usage = Some(usage);
            }
            entry.sampled_at = Some(now);
            entry.last_error = None;
            let condition = condition?;
            let was = entry.condition.as_ref().map(|c| c.abnormal);
            let change = (was != Some(condition.abnormal)).then(|| (was, condition.clone()));
            entry.condition = Some(condition);
            change
        });
        if let Some((was, now)) = change {
            log_change(&self.provider, id, was, &now);
        }
    }

    /// Records a failed call about `id` (the last sample is kept).
    pub fn record_error(&self, id: &VolumeId, error: String) {
        self.with(|m| {
            if let Some(v) = m.get_mut(id) {
                v.last_error = Some(error);
            }
        });
    }
}

/// Logs a change of condition: once per change, with the plugin's message. A first sample
/// that is normal is no change worth a line.
fn log_change(provider: &str, id: &VolumeId, was: Option<bool>, now: &Condition) {
    match (was, now.abnormal) {
        (_, true) => tracing::warn!(
            provider,
            volume_id = %id,
            source = now.source,
            message = %now.message,
            "the plugin reports the volume abnormal"
        ),
        (Some(true), false) => tracing::info!(
            provider,
            volume_id = %id,
            source = now.source,
            message = %now.message,
            "the plugin reports the volume normal again"
        ),
        (None | Some(false), false) => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use slrp_csi::VolumeUsage;

    fn cond(abnormal: bool, message: &str) -> Option<Condition> {
        Some(Condition {
            abnormal,
            message: message.to_owned(),
            source: "ControllerGetVolume",
        })
    }

    #[test]
    fn usage_reads_bytes_and_inodes_and_ignores_the_rest() {
        let stats = VolumeStats {
            usage: vec![
                VolumeUsage {
                    unit: UsageUnit::Bytes,
                    total: 100,
                    available: 60,
                    used: 40,
                },
                VolumeUsage {
                    unit: UsageUnit::Inodes,
                    total: 10,
                    available: -1,
                    used: 3,
                },
                VolumeUsage {
                    unit: UsageUnit::Unknown,
                    total: 1,
                    available: 1,
                    used: 1,
                },
            ],
            abnormal: None,
            condition_message: None,
        };
        let u = Usage::of(&stats);
        assert_eq!(
            u.bytes,
            Some(Amounts {
                total: 100,
                available: 60,
                used: 40
            })
        );
        assert_eq!(
            u.inodes,
            Some(Amounts {
                total: 10,
                available: 0,
                used: 3
            })
        );
        assert!(Usage::default().is_empty());
    }

    #[test]
    fn only_tracked_volumes_are_recorded_and_forgetting_drops_them() {
        let cache = HealthCache::new("t.n");
        let id = VolumeId::new("v1");
        let now = Instant::now();
        cache.record(&id, Some(Usage::default()), cond(false, "ok"), now);
        assert!(cache.get(&id).is_none(), "not tracked: not recorded");
        cache.track(&id);
        assert_eq!(cache.get(&id).unwrap().status(), HealthStatus::Unknown);
        cache.record(&id, None, cond(true, "image gone"), now);
        let h = cache.get(&id).unwrap();
        assert_eq!(h.status(), HealthStatus::Abnormal);
        assert_eq!(h.condition.unwrap().message, "image gone");
        cache.record_error(&id, "boom".into());
        assert_eq!(cache.get(&id).unwrap().last_error.as_deref(), Some("boom"));
        assert_eq!(cache.get(&id).unwrap().status(), HealthStatus::Abnormal);
        cache.record(&id, None, cond(false, "ok"), now);
        let h = cache.get(&id).unwrap();
        assert_eq!(h.status(), HealthStatus::Ok);
        assert_eq!(h.last_error, None);
        cache.forget(&id);
        assert!(cache.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_age_is_the_oldest_sample() {
        let cache = HealthCache::new("t.n");
        let (a, b) = (VolumeId::new("a"), VolumeId::new("b"));
        cache.track(&a);
        cache.track(&b);
        assert_eq!(cache.oldest_age(Instant::now()), None, "no sample yet");
        cache.record(&a, None, None, Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        cache.record(&b, None, None, Instant::now());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            cache.oldest_age(Instant::now()),
            Some(Duration::from_secs(6))
        );
    }
}
