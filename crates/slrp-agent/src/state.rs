//! The connection state machine's pure parts: the observable state and the reconnect
//! policy (how long to wait after a session ends).

use std::time::Duration;

use slrp_types::{Backoff, JitterRng};

/// Where the client is. Every error moves it back to `Disconnected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionState {
    /// Not connected; waiting before the next attempt.
    Disconnected {
        /// Consecutive failed sessions so far.
        failures: u32,
    },
    /// Opening the event-stream and calls connections.
    Connecting,
    /// SUBSCRIBE sent; waiting for SUBSCRIBED.
    Subscribing,
    /// Subscribed: calls are accepted.
    Subscribed {
        /// The stream id of this subscription.
        stream_id: String,
        /// The provider id the agent assigned or confirmed.
        provider_id: String,
    },
    /// The client stopped (cancelled, or the event receiver was dropped).
    Stopped,
}

impl ConnectionState {
    /// The state's name, as used in error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Disconnected { .. } => "DISCONNECTED",
            Self::Connecting => "CONNECTING",
            Self::Subscribing => "SUBSCRIBING",
            Self::Subscribed { .. } => "SUBSCRIBED",
            Self::Stopped => "STOPPED",
        }
    }
}

/// Decides the wait before the next connection attempt. Unlike Mesos's driver, which
/// reconnects at once, every failure waits, and the wait grows while failures continue.
#[derive(Debug, Clone)]
pub struct ReconnectPolicy {
    backoff: Backoff,
    reset_after: Duration,
    failures: u32,
}

impl ReconnectPolicy {
    /// A policy with no failures yet.
    pub fn new(backoff: Backoff, reset_after: Duration) -> Self {
        Self {
            backoff,
            reset_after,
            failures: 0,
        }
    }

    /// Consecutive failures counted so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Records the end of a session and returns how long to wait. `subscribed_for` is how
    /// long the session was subscribed, `None` if it never was. A subscription that lasted
    /// `reset_after` counts as healthy: the failure count starts again at one.
    pub fn after_session(
        &mut self,
        subscribed_for: Option<Duration>,
        jitter: &mut JitterRng,
    ) -> Duration {
        if subscribed_for.is_some_and(|d| d >= self.reset_after) {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures, jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slrp_types::Jitter;

    fn policy() -> ReconnectPolicy {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8)).expect("valid");
        ReconnectPolicy::new(backoff, Duration::from_secs(60))
    }

    #[test]
    fn failures_back_off_exponentially_up_to_the_cap() {
        let mut p = policy();
        let mut j = JitterRng::new(Jitter::None);
        let waits: Vec<u64> = (0..6)
            .map(|_| p.after_session(None, &mut j).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
        // A short subscription does not reset the count.
        assert_eq!(
            p.after_session(Some(Duration::from_secs(5)), &mut j)
                .as_secs(),
            8
        );
    }

    #[test]
    fn a_long_subscription_resets_the_backoff() {
        let mut p = policy();
        let mut j = JitterRng::new(Jitter::None);
        for _ in 0..5 {
            p.after_session(None, &mut j);
        }
        assert_eq!(
            p.after_session(Some(Duration::from_secs(60)), &mut j),
            Duration::from_secs(1)
        );
        assert_eq!(p.failures(), 1);
    }

    #[test]
    fn jittered_waits_stay_below_the_ceiling_and_are_never_all_zero() {
        let mut p = policy();
        let mut j = JitterRng::new(Jitter::Seeded(7));
        let waits: Vec<Duration> = (0..20).map(|_| p.after_session(None, &mut j)).collect();
        assert!(waits.iter().all(|w| *w <= Duration::from_secs(8)));
        assert!(waits.iter().any(|w| !w.is_zero()));
    }
}
