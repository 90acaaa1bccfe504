//! Retry policy (data) and the one loop that executes it, for the callers of a
//! [`CsiClient`](crate::CsiClient).
//!
//! The client makes exactly one attempt per call; a caller that retries runs its calls
//! through [`retry()`]. In the daemon that caller is the volume manager (its
//! `VolumeManagerConfig::retry`, wrapping each attempt in its concurrency permit and the
//! wait for a restarting plugin); `slrp csi --retries N` is the other one. One layer
//! retries, so a call is never retried once per layer.
//!
//! Mesos retries only `CreateVolume` and `DeleteVolume`, only on `DEADLINE_EXCEEDED` and
//! `UNAVAILABLE`, forever, and the n-th retry (n ≥ 1) waits a uniformly random time in
//! `[0, min(10 s · 2^(n-1), 10 min)]` (spec §4.3 and §12 item 15, `src/csi/constants.hpp`);
//! every other RPC and code fails on its first error. That is [`RetryConfig::default`];
//! every part of it is configurable per RPC.

use std::collections::HashMap;
use std::future::Future;

use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::error::{CsiError, CsiRpc};

pub use slrp_types::backoff::{
    Backoff, BackoffError, Jitter, JitterRng, MESOS_BACKOFF_BASE, MESOS_BACKOFF_MAX,
};

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

/// Runs `attempt` under `policy` (`None`: one attempt) until it succeeds, fails with an
/// error the policy does not retry, runs out of attempts, or `cancel` fires during a
/// backoff.
///
/// Each attempt is awaited to its end: bounding it is the client's business (its
/// deadline and [`ClientConfig::cancel`](crate::ClientConfig::cancel)). A `cancel` during
/// a backoff ends the call at once with the last attempt's error, so the caller treats
/// it as any failed call (the volume manager keeps the volume in flight, or its
/// CreateVolume intent). Every retry is logged at INFO, naming `rpc`, the attempt, the
/// wait and the error.
///
/// # Errors
/// The last attempt's error.
///
/// # Cancel safety
/// Dropping the returned future drops the attempt in flight; nothing else is left behind.
pub async fn retry<T, F, Fut>(
    rpc: CsiRpc,
    policy: Option<&RetryPolicy>,
    cancel: &CancellationToken,
    attempt: F,
) -> Result<T, CsiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CsiError>>,
{
    retry_observed(rpc, policy, cancel, attempt, |_, _, _| {}).await
}

/// [`retry()`], telling `on_retry` of every failed attempt that is retried (its error,
/// its number from 1, and the wait before the next one) before the wait begins: what a
/// caller shows while a call is stuck ("last error, next retry").
///
/// # Errors
/// The last attempt's error.
///
/// # Cancel safety
/// As [`retry()`].
pub async fn retry_observed<T, F, Fut, O>(
    rpc: CsiRpc,
    policy: Option<&RetryPolicy>,
    cancel: &CancellationToken,
    mut attempt: F,
    mut on_retry: O,
) -> Result<T, CsiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CsiError>>,
    O: FnMut(&CsiError, u32, std::time::Duration),
{
    let mut jitter = policy.map(|p| JitterRng::new(p.jitter));
    let mut n: u32 = 1;
    loop {
        let err = match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let (Some(policy), Some(jitter)) = (policy, jitter.as_mut()) else {
            return Err(err);
        };
        let exhausted = policy.max_attempts.is_some_and(|max| n >= max);
        if !policy.retries(&err) || exhausted {
            return Err(err);
        }
        let delay = policy.backoff.delay(n, jitter);
        tracing::info!(%rpc, attempt = n, ?delay, error = %slrp_types::DisplayChain(&err),
            "CSI call failed transiently; retrying after a backoff");
        on_retry(&err, n, delay);
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(err),
            () = tokio::time::sleep(delay) => {}
        }
        n = n.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    fn status(code: Code) -> CsiError {
        CsiError::status(CsiRpc::CreateVolume, code, "scripted")
    }

    #[tokio::test(start_paused = true)]
    async fn retry_follows_the_mesos_schedule_until_success() {
        let calls = AtomicU32::new(0);
        let start = Instant::now();
        let times = Mutex::new(Vec::new());
        let policy = RetryPolicy::mesos().with_jitter(Jitter::None);
        let out = retry(
            CsiRpc::CreateVolume,
            Some(&policy),
            &CancellationToken::new(),
            || {
                times.lock().unwrap().push(start.elapsed().as_secs());
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 | 1 => Err(status(Code::Unavailable)),
                        2 | 3 => Err(status(Code::DeadlineExceeded)),
                        _ => Ok(42),
                    }
                }
            },
        )
        .await;
        assert_eq!(out.unwrap(), 42);
        // Waits of 10, 20, 40, 80 seconds between the five attempts.
        assert_eq!(*times.lock().unwrap(), vec![0, 10, 30, 70, 150]);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_on_an_unretried_code_on_the_attempt_limit_and_without_a_policy() {
        let policy = RetryPolicy::mesos()
            .with_jitter(Jitter::None)
            .with_max_attempts(Some(3));
        let count = |policy: Option<&RetryPolicy>, code: Code| {
            let policy = policy.cloned();
            async move {
                let calls = AtomicU32::new(0);
                let out: Result<(), CsiError> = retry(
                    CsiRpc::CreateVolume,
                    policy.as_ref(),
                    &CancellationToken::new(),
                    || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        async move { Err(status(code)) }
                    },
                )
                .await;
                assert_eq!(out.unwrap_err().code(), Some(code));
                calls.load(Ordering::SeqCst)
            }
        };
        assert_eq!(count(Some(&policy), Code::Unavailable).await, 3);
        // ABORTED is transient (`retry_class`) but not in Mesos's codes.
        assert_eq!(count(Some(&policy), Code::Aborted).await, 1);
        assert_eq!(count(Some(&policy), Code::Internal).await, 1);
        assert_eq!(count(None, Code::Unavailable).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancellation_ends_a_backoff_at_once_with_the_last_error() {
        let cancel = CancellationToken::new();
        let policy = RetryPolicy::mesos().with_jitter(Jitter::None);
        let c2 = cancel.clone();
        tokio::spawn(async move {
            // Not synchronisation: the elapsed time is the stimulus (a cancel that
            // arrives during the second backoff).
            tokio::time::sleep(Duration::from_secs(15)).await;
            c2.cancel();
        });
        let start = Instant::now();
        let calls = AtomicU32::new(0);
        let out: Result<(), CsiError> = retry(CsiRpc::DeleteVolume, Some(&policy), &cancel, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(status(Code::Unavailable)) }
        })
        .await;
        assert_eq!(out.unwrap_err().code(), Some(Code::Unavailable));
        // Cancelled during the second wait (10 s + 20 s), at 15 s, not at its end.
        assert_eq!(start.elapsed().as_secs(), 15);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
