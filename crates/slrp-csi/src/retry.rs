//! Retry policy (data) and the one retry loop that executes it.
//!
//! Mesos retries only `CreateVolume` and `DeleteVolume`, only on `DEADLINE_EXCEEDED` and
//! `UNAVAILABLE`, forever, and the n-th retry (n ≥ 1) waits a uniformly random time in
//! `[0, min(10 s · 2^(n-1), 10 min)]` (spec §4.3, `src/csi/constants.hpp`). That is the
//! default here; every part of it is configurable per RPC.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::error::{CsiError, CsiRpc, RetryClass};

/// Mesos's `DEFAULT_RPC_RETRY_BACKOFF_FACTOR`.
pub const MESOS_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// Mesos's `DEFAULT_RPC_RETRY_INTERVAL_MAX`.
pub const MESOS_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Attempts after which retries are logged at WARN instead of INFO.
const WARN_AFTER_ATTEMPTS: u32 = 3;

/// Invalid backoff bounds.
#[derive(Debug, thiserror::Error)]
pub enum BackoffError {
    /// `base` is zero.
    #[error("backoff base must be positive")]
    ZeroBase,
    /// `max` < `base`.
    #[error("backoff maximum {max:?} is smaller than its base {base:?}")]
    MaxBelowBase {
        /// The base.
        base: Duration,
        /// The maximum.
        max: Duration,
    },
}

/// Exponential backoff bounds: the n-th wait (n ≥ 1) is at most `min(base · 2^(n-1), max)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// Mesos's RPC retry bounds: 10 s doubling, capped at 10 min.
    pub const MESOS: Backoff = Backoff {
        base: MESOS_BACKOFF_BASE,
        max: MESOS_BACKOFF_MAX,
    };

    /// Validated bounds.
    ///
    /// # Errors
    /// [`BackoffError`] if `base` is zero or `max < base`.
    pub fn new(base: Duration, max: Duration) -> Result<Self, BackoffError> {
        if base.is_zero() {
            return Err(BackoffError::ZeroBase);
        }
        if max < base {
            return Err(BackoffError::MaxBelowBase { base, max });
        }
        Ok(Self { base, max })
    }

    /// The base (first ceiling).
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Upper bound of the `n`-th wait (`n` ≥ 1; 0 is treated as 1).
    pub fn ceiling(&self, n: u32) -> Duration {
        let shift = n.saturating_sub(1).min(63);
        let factor = 1u64 << shift;
        let nanos = u64::try_from(self.base.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(nanos.saturating_mul(factor)).min(self.max)
    }

    /// The `n`-th wait, drawn with `jitter`.
    pub fn delay(&self, n: u32, jitter: &mut JitterRng) -> Duration {
        jitter.sample(self.ceiling(n))
    }
}

/// How a wait is drawn below its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in `[0, ceiling]` from an OS-seeded generator (Mesos's behaviour).
    Full,
    /// Uniform in `[0, ceiling]` from a generator with this seed (reproducible runs).
    Seeded(u64),
    /// Always the ceiling (deterministic; for tests and for operators who want it).
    None,
}

/// A jitter source made from a [`Jitter`] setting.
#[derive(Debug)]
pub struct JitterRng {
    rng: Option<StdRng>,
}

impl JitterRng {
    /// Creates the generator for `jitter`.
    pub fn new(jitter: Jitter) -> Self {
        let rng = match jitter {
            Jitter::Full => Some(StdRng::from_rng(&mut rand::rng())),
            Jitter::Seeded(seed) => Some(StdRng::seed_from_u64(seed)),
            Jitter::None => None,
        };
        Self { rng }
    }

    /// A wait in `[0, ceiling]`.
    pub fn sample(&mut self, ceiling: Duration) -> Duration {
        match &mut self.rng {
            None => ceiling,
            Some(rng) => {
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rng.random_range(0..=nanos))
            }
        }
    }
}

/// Retry policy of one RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait bounds.
    pub backoff: Backoff,
    /// How waits are drawn.
    pub jitter: Jitter,
    /// gRPC codes that are retried (a local deadline counts as `DEADLINE_EXCEEDED`).
    pub retry_on: Vec<Code>,
    /// Total attempts including the first; `None` = unlimited (Mesos).
    pub max_attempts: Option<u32>,
}

impl RetryPolicy {
    /// Mesos's policy: `DEADLINE_EXCEEDED` and `UNAVAILABLE`, full jitter, no limit.
    pub fn mesos() -> Self {
        Self {
            backoff: Backoff::MESOS,
            jitter: Jitter::Full,
            retry_on: vec![Code::DeadlineExceeded, Code::Unavailable],
            max_attempts: None,
        }
    }

    /// Whether this policy retries `err`.
    pub fn retries(&self, err: &CsiError) -> bool {
        err.code().is_some_and(|c| self.retry_on.contains(&c))
    }

    /// Replaces the jitter setting.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Replaces the backoff bounds.
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Limits the number of attempts.
    #[must_use]
    pub fn with_max_attempts(mut self, max: Option<u32>) -> Self {
        self.max_attempts = max;
        self
    }
}

/// Which RPCs are retried and how. RPCs without a policy fail on the first error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    policies: HashMap<CsiRpc, RetryPolicy>,
}

impl Default for RetryConfig {
    /// Mesos: only `CreateVolume` and `DeleteVolume` are retried (MESOS-9517).
    fn default() -> Self {
        Self::none()
            .with(CsiRpc::CreateVolume, RetryPolicy::mesos())
            .with(CsiRpc::DeleteVolume, RetryPolicy::mesos())
    }
}

impl RetryConfig {
    /// No RPC is retried.
    pub fn none() -> Self {
        Self {
            policies: HashMap::new(),
        }
    }

    /// Sets the policy of `rpc`.
    #[must_use]
    pub fn with(mut self, rpc: CsiRpc, policy: RetryPolicy) -> Self {
        self.policies.insert(rpc, policy);
        self
    }

    /// Removes the policy of `rpc` (it then fails on the first error).
    #[must_use]
    pub fn without(mut self, rpc: CsiRpc) -> Self {
        self.policies.remove(&rpc);
        self
    }

    /// The policy of `rpc`, if it is retried.
    pub fn policy(&self, rpc: CsiRpc) -> Option<&RetryPolicy> {
        self.policies.get(&rpc)
    }
}

/// Runs `op` until it succeeds, fails with a non-transient error, runs out of attempts,
/// or `cancel` fires.
///
/// Returns `None` when cancelled; the attempt in flight at that moment is dropped at once.
/// `what` names the operation in every log line.
///
/// # Cancel safety
/// Dropping the returned future drops the attempt in flight; nothing else is left behind.
pub async fn retry<T, E, F, Fut>(
    what: &str,
    mut op: F,
    classify: impl Fn(&E) -> RetryClass,
    policy: &RetryPolicy,
    cancel: &CancellationToken,
) -> Option<Result<T, E>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut jitter = JitterRng::new(policy.jitter);
    let mut attempt: u32 = 1;
    loop {
        let result = tokio::select! {
            biased;
            () = cancel.cancelled() => return None,
            r = op() => r,
        };
        let err = match result {
            Ok(v) => return Some(Ok(v)),
            Err(e) => e,
        };
        let class = classify(&err);
        let exhausted = policy.max_attempts.is_some_and(|max| attempt >= max);
        if class != RetryClass::Transient || exhausted {
            return Some(Err(err));
        }
        let delay = policy.backoff.delay(attempt, &mut jitter);
        if attempt >= WARN_AFTER_ATTEMPTS {
            tracing::warn!(%what, attempt, ?delay, error = %err, "retrying after transient failure");
        } else {
            tracing::info!(%what, attempt, ?delay, error = %err, "retrying after transient failure");
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tokio::time::Instant;

    use super::*;

    #[test]
    fn mesos_ceilings_double_and_cap_at_ten_minutes() {
        let b = Backoff::MESOS;
        let secs: Vec<u64> = (1..=9).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(secs, vec![10, 20, 40, 80, 160, 320, 600, 600, 600]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn backoff_rejects_bad_bounds() {
        assert!(Backoff::new(Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(Backoff::new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
        assert!(Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn full_jitter_stays_within_ceiling_and_varies() {
        let mut rng = JitterRng::new(Jitter::Seeded(7));
        let ceiling = Duration::from_secs(10);
        let samples: Vec<Duration> = (0..200).map(|_| rng.sample(ceiling)).collect();
        assert!(samples.iter().all(|d| *d <= ceiling));
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(distinct.len() > 150, "jitter should spread waits");
        // Same seed, same schedule.
        let mut again = JitterRng::new(Jitter::Seeded(7));
        assert_eq!(again.sample(ceiling), samples[0]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_follows_schedule_until_success() {
        let calls = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let policy = RetryPolicy::mesos().with_jitter(Jitter::None);
        let out = retry(
            "test",
            || {
                let calls = calls.clone();
                let times = times.clone();
                async move {
                    times.lock().unwrap().push(start.elapsed().as_secs());
                    if calls.fetch_add(1, Ordering::SeqCst) < 4 {
                        Err("busy".to_owned())
                    } else {
                        Ok(42)
                    }
                }
            },
            |_| RetryClass::Transient,
            &policy,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(out, Some(Ok(42)));
        // Waits of 10, 20, 40, 80 seconds between the five attempts.
        assert_eq!(*times.lock().unwrap(), vec![0, 10, 30, 70, 150]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_on_permanent_and_on_attempt_limit() {
        let policy = RetryPolicy::mesos()
            .with_jitter(Jitter::None)
            .with_max_attempts(Some(3));
        let calls = AtomicU32::new(0);
        let out: Option<Result<(), String>> = retry(
            "t",
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err("x".to_owned()) }
            },
            |_| RetryClass::Transient,
            &policy,
            &CancellationToken::new(),
        )
        .await;
        assert!(matches!(out, Some(Err(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let out: Option<Result<(), String>> = retry(
            "t",
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err("x".to_owned()) }
            },
            |_| RetryClass::Permanent,
            &RetryPolicy::mesos(),
            &CancellationToken::new(),
        )
        .await;
        assert!(matches!(out, Some(Err(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_stops_a_backoff_wait_at_once() {
        let cancel = CancellationToken::new();
        let policy = RetryPolicy::mesos().with_jitter(Jitter::None);
        let c2 = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(15)).await;
            c2.cancel();
        });
        let start = Instant::now();
        let out: Option<Result<(), String>> = retry(
            "t",
            || async { Err("busy".to_owned()) },
            |_| RetryClass::Transient,
            &policy,
            &cancel,
        )
        .await;
        assert!(out.is_none());
        // Cancelled during the second wait (10 s + 20 s), at 15 s, not at its end.
        assert_eq!(start.elapsed().as_secs(), 15);
    }
}
