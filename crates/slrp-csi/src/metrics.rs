//! Per-RPC metrics with Mesos's semantics (spec §9, `src/csi/metrics.cpp`).
//!
//! # Design
//! Every *attempt* is counted: `pending` goes up when it starts and down when it ends, and
//! exactly one of `finished` (OK), `failed` (gRPC error or local deadline) or `cancelled`
//! (the future was dropped, or cancellation fired) is incremented. The outcome is recorded
//! by a drop guard, so an attempt that is dropped half-way cannot stay pending. The probe
//! sequence of version detection (v1, then v0) counts as one `Probe` attempt, as in Mesos.
//! A request refused before it is sent (a v1-only feature against a v0 plugin) is no RPC
//! and counts nowhere.
//!
//! Several owners (the providers of one process) share one set of families: each counts
//! through a handle made by [`CsiMetrics::with_label`], which adds a constant label
//! (e.g. `provider="<type>.<name>"`) to every series it touches. The families are then
//! registered once, so the text exposition has one `# TYPE` line per name, as
//! Prometheus's parsers require.
//!
//! # Limitations
//! Metric names follow Prometheus conventions (`csi_rpcs_finished_total{rpc="..."}`); the
//! Mesos-style names (`csi_plugin/rpcs_finished`) are a mapping for the admin endpoint.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;

use tokio::time::Instant;

use crate::error::CsiRpc;

/// Label set of the per-RPC metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RpcLabels {
    /// CSI method name.
    pub rpc: &'static str,
}

/// Label set of `csi_answer_violations_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ViolationLabels {
    /// CSI method name.
    pub rpc: &'static str,
    /// The rule broken ([`crate::answer::Violation::rule`]).
    pub rule: &'static str,
}

/// Constant labels a handle adds before its own (see [`CsiMetrics::with_label`]).
pub type ConstLabels = Vec<(&'static str, Arc<str>)>;

/// The full label set of a series: the handle's constant labels, then the RPC.
type SeriesLabels = (ConstLabels, RpcLabels);

type HistogramFamily = Family<SeriesLabels, Histogram, fn() -> Histogram>;

/// CSI client metrics. Cheap to clone (handles to shared atomics).
#[derive(Debug, Clone)]
pub struct CsiMetrics {
    pending: Family<SeriesLabels, Gauge>,
    finished: Family<SeriesLabels, Counter>,
    failed: Family<SeriesLabels, Counter>,
    cancelled: Family<SeriesLabels, Counter>,
    latency: HistogramFamily,
    /// Plugin answers (or parts of them) that broke a rule of [`crate::answer`].
    violations: Family<(ConstLabels, ViolationLabels), Counter>,
    /// What this handle counts under; empty for the default handle.
    scope: ConstLabels,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~9 min: covers a local probe as well as a slow CreateVolume near the 60 s
    // default deadline and retried calls' individual attempts.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 3.0, 13,
    ))
}

impl Default for CsiMetrics {
    fn default() -> Self {
        Self {
            pending: Family::default(),
            finished: Family::default(),
            failed: Family::default(),
            cancelled: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            violations: Family::default(),
            scope: ConstLabels::new(),
        }
    }
}

impl CsiMetrics {
    /// Creates the metrics and registers them under the `csi` prefix of `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        m.register_in(registry);
        m
    }

    /// A handle to the same families whose series all carry the label `name="value"`
    /// (after this handle's own constant labels), e.g. one provider's share of metrics
    /// registered once for the whole process. Its getters read only its own series.
    #[must_use]
    pub fn with_label(&self, name: &'static str, value: &str) -> Self {
        let mut scoped = self.clone();
        scoped.scope.push((name, Arc::from(value)));
        scoped
    }

    /// Registers these (already counting) families under the `csi` prefix of
    /// `registry`: the series of every handle made from them with
    /// [`CsiMetrics::with_label`]. Register them once per registry.
    pub fn register_in(&self, registry: &mut Registry) {
        let m = self;
        let sub = registry.sub_registry_with_prefix("csi");
        sub.register(
            "rpcs_pending",
            "CSI RPC attempts in flight",
            m.pending.clone(),
        );
        sub.register(
            "rpcs_finished",
            "CSI RPC attempts that returned OK",
            m.finished.clone(),
        );
        sub.register(
            "rpcs_failed",
            "CSI RPC attempts that failed (each retry counted)",
            m.failed.clone(),
        );
        sub.register(
            "rpcs_cancelled",
            "CSI RPC attempts that were abandoned before completing",
            m.cancelled.clone(),
        );
        sub.register(
            "rpc_duration_seconds",
            "Latency of completed CSI RPC attempts",
            m.latency.clone(),
        );
        sub.register(
            "answer_violations",
            "Plugin answers, or entries of them, that broke a CSI rule or a bound of slrp's (refused, skipped or repaired)",
            m.violations.clone(),
        );
    }

    fn labels(&self, rpc: CsiRpc) -> SeriesLabels {
        (self.scope.clone(), RpcLabels { rpc: rpc.as_str() })
    }

    /// Attempts of `rpc` in flight.
    pub fn pending(&self, rpc: CsiRpc) -> i64 {
        self.pending.get_or_create(&self.labels(rpc)).get()
    }

    /// Attempts of `rpc` that returned OK.
    pub fn finished(&self, rpc: CsiRpc) -> u64 {
        self.finished.get_or_create(&self.labels(rpc)).get()
    }

    /// Attempts of `rpc` that failed.
    pub fn failed(&self, rpc: CsiRpc) -> u64 {
        self.failed.get_or_create(&self.labels(rpc)).get()
    }

    /// Attempts of `rpc` that were cancelled.
    pub fn cancelled(&self, rpc: CsiRpc) -> u64 {
        self.cancelled.get_or_create(&self.labels(rpc)).get()
    }

    /// Sum over all RPCs of attempts that returned OK.
    pub fn finished_total(&self) -> u64 {
        CsiRpc::ALL.into_iter().map(|r| self.finished(r)).sum()
    }

    /// Sum over all RPCs of attempts in flight (Mesos's `csi_plugin/rpcs_pending`).
    pub fn pending_total(&self) -> i64 {
        CsiRpc::ALL.into_iter().map(|r| self.pending(r)).sum()
    }

    /// Sum over all RPCs of attempts that failed (Mesos's `csi_plugin/rpcs_failed`).
    pub fn failed_total(&self) -> u64 {
        CsiRpc::ALL.into_iter().map(|r| self.failed(r)).sum()
    }

    /// Sum over all RPCs of attempts that were cancelled (`csi_plugin/rpcs_cancelled`).
    pub fn cancelled_total(&self) -> u64 {
        CsiRpc::ALL.into_iter().map(|r| self.cancelled(r)).sum()
    }

    /// Answers of `rpc` (or entries of them) that broke `rule`.
    pub fn answer_violations(&self, rpc: CsiRpc, rule: &'static str) -> u64 {
        self.violations
            .get_or_create(&(
                self.scope.clone(),
                ViolationLabels {
                    rpc: rpc.as_str(),
                    rule,
                },
            ))
            .get()
    }

    pub(crate) fn answer_violation(&self, rpc: CsiRpc, rule: &'static str) {
        self.violations
            .get_or_create(&(
                self.scope.clone(),
                ViolationLabels {
                    rpc: rpc.as_str(),
                    rule,
                },
            ))
            .inc();
    }

    pub(crate) fn start(&self, rpc: CsiRpc) -> AttemptGuard {
        self.pending.get_or_create(&self.labels(rpc)).inc();
        AttemptGuard {
            metrics: self.clone(),
            rpc,
            started: Instant::now(),
            outcome: None,
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Finished,
    Failed,
    /// The request was refused locally before it was sent; only `pending` is undone.
    NotSent,
}

/// Records one attempt; counts it as cancelled if dropped before [`AttemptGuard::finish`].
#[derive(Debug)]
pub(crate) struct AttemptGuard {
    metrics: CsiMetrics,
    rpc: CsiRpc,
    started: Instant,
    outcome: Option<Outcome>,
}

impl AttemptGuard {
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        let labels = self.metrics.labels(self.rpc);
        self.metrics.pending.get_or_create(&labels).dec();
        match self.outcome {
            Some(Outcome::Finished) => {
                self.metrics.finished.get_or_create(&labels).inc();
            }
            Some(Outcome::Failed) => {
                self.metrics.failed.get_or_create(&labels).inc();
            }
            None => {
                self.metrics.cancelled.get_or_create(&labels).inc();
                return;
            }
            Some(Outcome::NotSent) => return,
        }
        self.metrics
            .latency
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_exactly_one_outcome() {
        let mut reg = Registry::default();
        let m = CsiMetrics::register(&mut reg);
        let g = m.start(CsiRpc::Probe);
        assert_eq!(m.pending(CsiRpc::Probe), 1);
        g.finish(Outcome::Finished);
        let g = m.start(CsiRpc::Probe);
        g.finish(Outcome::Failed);
        let g = m.start(CsiRpc::Probe);
        drop(g);
        let g = m.start(CsiRpc::Probe);
        g.finish(Outcome::NotSent);
        assert_eq!(m.pending(CsiRpc::Probe), 0);
        assert_eq!(m.finished(CsiRpc::Probe), 1);
        assert_eq!(m.failed(CsiRpc::Probe), 1);
        assert_eq!(m.cancelled(CsiRpc::Probe), 1);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("csi_rpcs_finished_total{rpc=\"Probe\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("csi_rpc_duration_seconds_count{rpc=\"Probe\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn labelled_handles_share_one_family_and_count_apart() {
        let mut reg = Registry::default();
        let shared = CsiMetrics::register(&mut reg);
        let a = shared.with_label("provider", "a");
        let b = shared.with_label("provider", "b");
        a.start(CsiRpc::Probe).finish(Outcome::Finished);
        a.start(CsiRpc::Probe).finish(Outcome::Finished);
        b.start(CsiRpc::Probe).finish(Outcome::Failed);
        assert_eq!((a.finished_total(), a.failed_total()), (2, 0));
        assert_eq!((b.finished_total(), b.failed_total()), (0, 1));
        assert_eq!(
            shared.finished_total(),
            0,
            "the unlabelled handle has its own series"
        );

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert_eq!(
            text.matches("# TYPE csi_rpcs_finished counter").count(),
            1,
            "{text}"
        );
        for want in [
            "csi_rpcs_finished_total{provider=\"a\",rpc=\"Probe\"} 2",
            "csi_rpcs_failed_total{provider=\"b\",rpc=\"Probe\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }
}
