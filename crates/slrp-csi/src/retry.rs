//! Retry policy (data) and the one retry loop that executes it.
//!
//! Mesos retries only `CreateVolume` and `DeleteVolume`, only on `DEADLINE_EXCEEDED` and
//! `UNAVAILABLE`, forever, and the n-th retry (n ≥ 1) waits a uniformly random time in
//! `[0, min(10 s · 2^(n-1), 10 min)]` (spec §4.3, `src/csi/constants.hpp`). That is the
//! default here; every part of it is configurable per RPC.

use std::collections::HashMap;
use std::future::Future;

use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::error::{CsiError, CsiRpc, RetryClass};

pub use slrp_types::backoff::{
    Backoff, BackoffError, Jitter, JitterRng, MESOS_BACKOFF_BASE, MESOS_BACKOFF_MAX,
};

/// Attempts after which retries are logged at WARN instead of INFO.
const WARN_AFTER_ATTEMPTS: u32 = 3;

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
    E: std::error::Error + 'static,
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
            tracing::warn!(%what, attempt, ?delay, error = %slrp_types::DisplayChain(&err), "retrying after transient failure");
        } else {
            tracing::info!(%what, attempt, ?delay, error = %slrp_types::DisplayChain(&err), "retrying after transient failure");
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

    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

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
                        Err(std::io::Error::other("busy"))
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
        assert!(matches!(out, Some(Ok(42))), "{out:?}");
        // Waits of 10, 20, 40, 80 seconds between the five attempts.
        assert_eq!(*times.lock().unwrap(), vec![0, 10, 30, 70, 150]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_on_permanent_and_on_attempt_limit() {
        let policy = RetryPolicy::mesos()
            .with_jitter(Jitter::None)
            .with_max_attempts(Some(3));
        let calls = AtomicU32::new(0);
        let out: Option<Result<(), std::io::Error>> = retry(
            "t",
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(std::io::Error::other("x")) }
            },
            |_| RetryClass::Transient,
            &policy,
            &CancellationToken::new(),
        )
        .await;
        assert!(matches!(out, Some(Err(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        let calls = AtomicU32::new(0);
        let out: Option<Result<(), std::io::Error>> = retry(
            "t",
            || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(std::io::Error::other("x")) }
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
        let out: Option<Result<(), std::io::Error>> = retry(
            "t",
            || async { Err(std::io::Error::other("busy")) },
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
