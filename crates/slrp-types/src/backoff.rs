//! Jittered exponential backoff: the pure computation of how long the n-th wait is.
//!
//! The n-th wait (n ≥ 1) is drawn uniformly from `[0, min(base · 2^(n-1), max)]` ("full
//! jitter"). With Mesos's RPC bounds ([`Backoff::MESOS`]: 10 s doubling to 10 min, spec
//! §4.3, `src/csi/constants.hpp`) this is exactly Mesos's retry schedule; the plugin
//! supervisor uses the same rule with [`Backoff::PLUGIN_RESTART`] (1 s doubling to 1 min).
//! The waiting itself (timers, cancellation) belongs to the callers.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Mesos's `DEFAULT_RPC_RETRY_BACKOFF_FACTOR`.
pub const MESOS_BACKOFF_BASE: Duration = Duration::from_secs(10);
/// Mesos's `DEFAULT_RPC_RETRY_INTERVAL_MAX`.
pub const MESOS_BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Invalid backoff bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

    /// The plugin supervisor's restart bounds: 1 s doubling, capped at 1 min. Fast enough
    /// for a crash, slow enough not to spin on a plugin that cannot start.
    pub const PLUGIN_RESTART: Backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(60),
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

    /// A wait in `[0, ceiling]`, at nanosecond resolution.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesos_ceilings_double_and_cap_at_ten_minutes() {
        let b = Backoff::MESOS;
        let secs: Vec<u64> = (1..=9).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(secs, vec![10, 20, 40, 80, 160, 320, 600, 600, 600]);
        assert_eq!(b.ceiling(0), b.ceiling(1));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn plugin_restart_ceilings_double_and_cap_at_one_minute() {
        let b = Backoff::PLUGIN_RESTART;
        let secs: Vec<u64> = (1..=8).map(|n| b.ceiling(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            Ok(b)
        );
    }

    #[test]
    fn backoff_rejects_bad_bounds() {
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::from_secs(1)),
            Err(BackoffError::ZeroBase)
        );
        assert!(matches!(
            Backoff::new(Duration::from_secs(2), Duration::from_secs(1)),
            Err(BackoffError::MaxBelowBase { .. })
        ));
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
        // Both halves of the range are used: uniform, not clustered near the ceiling.
        assert!(samples.iter().any(|d| *d < ceiling / 2));
        assert!(samples.iter().any(|d| *d > ceiling / 2));
        let mut again = JitterRng::new(Jitter::Seeded(7));
        assert_eq!(
            again.sample(ceiling),
            samples[0],
            "same seed, same schedule"
        );
    }

    #[test]
    fn no_jitter_waits_the_ceiling() {
        let mut rng = JitterRng::new(Jitter::None);
        let b = Backoff::MESOS;
        assert_eq!(b.delay(3, &mut rng), Duration::from_secs(40));
    }
}
