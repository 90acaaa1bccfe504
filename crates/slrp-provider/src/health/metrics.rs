//! The metrics of volume usage and health (docs/metrics.md, "Volume usage and health").
//!
//! # Design
//!
//! The per-volume families are modelled on kubelet's `kubelet_volume_stats_*`, which users
//! know: capacity, available and used bytes, inodes, free and used inodes, and an
//! abnormal gauge, each series labelled `provider`, `volume_id` and `profile`. They are
//! not kept as gauges that would have to be created and removed as volumes come and go:
//! [`HealthMetrics`] is a [`Collector`] that encodes them from each provider's
//! [`HealthCache`] on every scrape, so a destroyed volume's series disappear with its cache
//! entry, and the profile label is the provider's current one (it comes from the
//! provider's resources, which the cache does not keep).
//!
//! The poller's own metrics are per provider: calls and failures by RPC (counters kept
//! here, counted by the poller) and the age of the oldest sample (read from the cache at
//! scrape time).
//!
//! Nothing here reaches `/metrics/snapshot`: Mesos has no such names, and per-volume
//! entries do not belong in a flat snapshot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use slrp_csi::{CsiRpc, VolumeId};
use tokio::time::Instant;

use super::cache::{Amounts, HealthCache, VolumeHealth};
use crate::metrics::PROVIDER_LABEL;

/// Where the profile label of a provider's volumes comes from (the provider's resources).
pub type ProfileLookup = Arc<dyn Fn() -> HashMap<String, String> + Send + Sync>;

type RpcLabels = [(&'static str, String); 2];

/// The RPCs the poller makes, in the order of [`ProviderHealth`]'s counters.
const POLLER_RPCS: [CsiRpc; 3] = [
    CsiRpc::NodeGetVolumeStats,
    CsiRpc::ControllerGetVolume,
    CsiRpc::ListVolumes,
];

/// The poller's counters of one provider; cheap to clone.
#[derive(Clone, Debug)]
pub struct ProviderHealth {
    /// Calls and failures of each of [`POLLER_RPCS`], made once: counting is one atomic
    /// add, with no label built per call.
    counters: Arc<[(CsiRpc, Counter, Counter); 3]>,
    cache: HealthCache,
}

impl ProviderHealth {
    fn counters(&self, rpc: CsiRpc) -> Option<&(CsiRpc, Counter, Counter)> {
        self.counters.iter().find(|(r, _, _)| *r == rpc)
    }

    /// Counts a call of `rpc` sent (one of the poller's RPCs; others count nowhere).
    pub fn called(&self, rpc: CsiRpc) {
        if let Some((_, calls, _)) = self.counters(rpc) {
            calls.inc();
        }
    }

    /// Counts a call of `rpc` that failed.
    pub fn failed(&self, rpc: CsiRpc) {
        if let Some((_, _, failures)) = self.counters(rpc) {
            failures.inc();
        }
    }

    /// Calls of `rpc` sent so far.
    pub fn calls(&self, rpc: CsiRpc) -> u64 {
        self.counters(rpc).map_or(0, |(_, c, _)| c.get())
    }

    /// Calls of `rpc` that failed so far.
    pub fn failures(&self, rpc: CsiRpc) -> u64 {
        self.counters(rpc).map_or(0, |(_, _, f)| f.get())
    }

    /// The provider's cache, which the poller fills and the metrics read.
    pub fn cache(&self) -> &HealthCache {
        &self.cache
    }
}

struct Entry {
    cache: HealthCache,
    profiles: Option<ProfileLookup>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("provider", &self.cache.provider())
            .field("profiles", &self.profiles.is_some())
            .finish()
    }
}

/// The families of every provider of a process; register once per registry.
#[derive(Clone, Debug, Default)]
pub struct HealthMetrics {
    calls: Family<RpcLabels, Counter>,
    failures: Family<RpcLabels, Counter>,
    providers: Arc<Mutex<Vec<Entry>>>,
}

impl HealthMetrics {
    /// The handle of provider `<type>.<name>` with its (empty) cache; `profiles`, when
    /// given, names the profile of each volume id at scrape time.
    pub fn provider(&self, provider: &str, profiles: Option<ProfileLookup>) -> ProviderHealth {
        let cache = HealthCache::new(provider);
        self.providers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Entry {
                cache: cache.clone(),
                profiles,
            });
        let counter = |family: &Family<RpcLabels, Counter>, rpc: CsiRpc| {
            let labels = [
                (PROVIDER_LABEL, provider.to_owned()),
                ("rpc", rpc.as_str().to_owned()),
            ];
            family.get_or_create(&labels).clone()
        };
        ProviderHealth {
            counters: Arc::new(
                POLLER_RPCS
                    .map(|rpc| (rpc, counter(&self.calls, rpc), counter(&self.failures, rpc))),
            ),
            cache,
        }
    }

    /// Registers the poller's counters and the collector of the per-volume families.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "slrp_volume_health_calls",
            "CSI calls of the volume usage and health poller, by RPC",
            self.calls.clone(),
        );
        registry.register(
            "slrp_volume_health_failures",
            "CSI calls of the volume usage and health poller that failed, by RPC",
            self.failures.clone(),
        );
        registry.register_collector(Box::new(self.clone()));
    }
}

/// One per-volume family: its name (unit suffix added by the encoder), help, unit and
/// value.
struct VolumeFamily {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    value: fn(&VolumeHealth) -> Option<i64>,
}

fn amount(a: Option<Amounts>, f: fn(Amounts) -> u64) -> Option<i64> {
    a.map(|a| i64::try_from(f(a)).unwrap_or(i64::MAX))
}

const FAMILIES: [VolumeFamily; 7] = [
    VolumeFamily {
        name: "slrp_volume_stats_capacity",
        help: "Capacity of the volume's file system or device, as the plugin reports it",
        unit: Some(Unit::Bytes),
        value: |h| amount(h.usage.and_then(|u| u.bytes), |a| a.total),
    },
    VolumeFamily {
        name: "slrp_volume_stats_available",
        help: "Bytes available on the volume",
        unit: Some(Unit::Bytes),
        value: |h| amount(h.usage.and_then(|u| u.bytes), |a| a.available),
    },
    VolumeFamily {
        name: "slrp_volume_stats_used",
        help: "Bytes used on the volume",
        unit: Some(Unit::Bytes),
        value: |h| amount(h.usage.and_then(|u| u.bytes), |a| a.used),
    },
    VolumeFamily {
        name: "slrp_volume_stats_inodes",
        help: "Inodes of the volume's file system",
        unit: None,
        value: |h| amount(h.usage.and_then(|u| u.inodes), |a| a.total),
    },
    VolumeFamily {
        name: "slrp_volume_stats_inodes_free",
        help: "Free inodes of the volume's file system",
        unit: None,
        value: |h| amount(h.usage.and_then(|u| u.inodes), |a| a.available),
    },
    VolumeFamily {
        name: "slrp_volume_stats_inodes_used",
        help: "Used inodes of the volume's file system",
        unit: None,
        value: |h| amount(h.usage.and_then(|u| u.inodes), |a| a.used),
    },
    VolumeFamily {
        name: "slrp_volume_stats_health_status_abnormal",
        help: "1 while the plugin reports the volume abnormal, 0 while normal (no series while unknown)",
        unit: None,
        value: |h| h.condition.as_ref().map(|c| i64::from(c.abnormal)),
    },
];

type VolumeLabels = [(&'static str, String); 3];

impl Collector for HealthMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let providers = self
            .providers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // One lookup of each provider's profiles per scrape, not one per family.
        let profiles: Vec<HashMap<String, String>> = providers
            .iter()
            .map(|p| p.profiles.as_ref().map(|f| f()).unwrap_or_default())
            .collect();
        for family in &FAMILIES {
            let mut metric = encoder.encode_descriptor(
                family.name,
                family.help,
                family.unit.as_ref(),
                MetricType::Gauge,
            )?;
            for (entry, profiles) in providers.iter().zip(&profiles) {
                let mut result = Ok(());
                entry.cache.for_each(|id, health| {
                    let Some(value) = (family.value)(health) else {
                        return;
                    };
                    if result.is_err() {
                        return;
                    }
                    let labels: VolumeLabels = [
                        (PROVIDER_LABEL, entry.cache.provider().to_owned()),
                        ("volume_id", id.as_str().to_owned()),
                        ("profile", profile_of(profiles, id)),
                    ];
                    result = metric
                        .encode_family(&labels)
                        .and_then(|m| ConstGauge::new(value).encode(m));
                });
                result?;
            }
        }
        let mut age = encoder.encode_descriptor(
            "slrp_volume_health_oldest_sample_age",
            "Age of the oldest usage or condition sample of the provider's volumes",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for entry in providers.iter() {
            let Some(oldest) = entry.cache.oldest_age(now) else {
                continue;
            };
            let labels = [(PROVIDER_LABEL, entry.cache.provider().to_owned())];
            ConstGauge::new(oldest.as_secs_f64()).encode(age.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn profile_of(profiles: &HashMap<String, String>, id: &VolumeId) -> String {
    profiles.get(id.as_str()).cloned().unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::health::{Condition, Usage};

    #[tokio::test(start_paused = true)]
    async fn per_volume_series_follow_the_cache() {
        let metrics = HealthMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let lookup: ProfileLookup =
            Arc::new(|| HashMap::from([("v1".to_owned(), "fast".to_owned())]));
        let p = metrics.provider("t.n", Some(lookup));
        let (v1, v2) = (VolumeId::new("v1"), VolumeId::new("v2"));
        p.cache().track(&v1);
        p.cache().track(&v2);
        let usage = Usage {
            bytes: Some(Amounts {
                total: 1000,
                available: 600,
                used: 400,
            }),
            inodes: Some(Amounts {
                total: 10,
                available: 7,
                used: 3,
            }),
        };
        p.cache().record(
            &v1,
            Some(usage),
            Some(Condition {
                abnormal: true,
                message: "gone".into(),
                source: "NodeGetVolumeStats",
            }),
            Instant::now(),
        );
        p.called(CsiRpc::NodeGetVolumeStats);
        p.failed(CsiRpc::NodeGetVolumeStats);
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let labels = r#"{provider="t.n",volume_id="v1",profile="fast"}"#;
        for line in [
            format!("slrp_volume_stats_capacity_bytes{labels} 1000"),
            format!("slrp_volume_stats_available_bytes{labels} 600"),
            format!("slrp_volume_stats_used_bytes{labels} 400"),
            format!("slrp_volume_stats_inodes{labels} 10"),
            format!("slrp_volume_stats_inodes_free{labels} 7"),
            format!("slrp_volume_stats_inodes_used{labels} 3"),
            format!("slrp_volume_stats_health_status_abnormal{labels} 1"),
            r#"slrp_volume_health_oldest_sample_age_seconds{provider="t.n"} 3.0"#.to_owned(),
            r#"slrp_volume_health_calls_total{provider="t.n",rpc="NodeGetVolumeStats"} 1"#
                .to_owned(),
            r#"slrp_volume_health_failures_total{provider="t.n",rpc="NodeGetVolumeStats"} 1"#
                .to_owned(),
            "# UNIT slrp_volume_stats_capacity_bytes bytes".to_owned(),
        ] {
            assert!(text.contains(&line), "{line} missing in:\n{text}");
        }
        assert!(
            !text.contains(r#"volume_id="v2""#),
            "v2 has no sample:\n{text}"
        );
        p.cache().forget(&v1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains(r#"volume_id="v1""#), "forgotten:\n{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
