//! The poller task: one per provider, see the module docs of [`crate::health`] for what it
//! asks and its bounds.
//!
//! # Loop
//!
//! The task owns its schedule (no lock): the volumes it tracks, each with the instant it
//! is next due, in a queue ordered by that instant. Each turn it
//! 1. re-reads the volume list when asked to (a volume moved; debounced) or once per
//!    interval: new volumes are due at a uniformly drawn moment of the next interval,
//!    volumes gone are dropped (cache entry included), a volume published or unpublished
//!    since is due again, not before one interval after its last poll;
//! 2. starts the due polls while fewer than `concurrency` are in flight and no backoff
//!    pause runs;
//! 3. waits for a poll to end, the next due instant, a "volume moved" notice, or
//!    cancellation.
//!
//! A poll that ends records its answer in the [`HealthCache`](super::HealthCache) and makes the volume due one
//! interval after the poll started (or, if that is past, at a moment drawn over the next
//! interval, so that volumes delayed together by a pause do not stay together).
//!
//! # Shutdown
//!
//! Cancellation ends the loop at once; polls in flight are dropped (their calls are
//! cancelled with them, nothing they do is durable), and the cache is cleared so that
//! nobody reads samples that are no longer kept up to date.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use slrp_core::volume::{CallObserver, MountPaths, StateName, VolumeManagerHandle};
use slrp_csi::{
    ConditionPage, CsiError, CsiRpc, CsiServices, ListedCondition, RetryClass, VolumeCondition,
    VolumeId, VolumeStats,
};
use slrp_types::{DisplayChain, Jitter, JitterRng};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cache::{Condition, Usage};
use super::metrics::ProviderHealth;
use super::{ControllerCheck, HealthConfig, Plan, REFRESH_DEBOUNCE, REFRESH_SETTLE};

/// Due instants per interval at most (see `Ticks`).
const TICKS_PER_INTERVAL: u32 = 60;

/// The longest tick: a new volume waits at most this beyond its drawn moment.
const MAX_TICK: Duration = Duration::from_secs(1);

/// Most pages of one `ListVolumes` sweep (a plugin handing out tokens forever is cut off).
const MAX_SWEEP_PAGES: usize = 10_000;

/// The CSI calls the poller makes; implemented by [`CsiServices`] (the poller's own
/// clients) and by fakes in tests.
pub trait HealthCalls: Clone + Send + Sync + 'static {
    /// `NodeGetVolumeStats` of `id` at `path`.
    fn node_stats(
        &self,
        id: &VolumeId,
        path: &str,
    ) -> impl Future<Output = Result<VolumeStats, CsiError>> + Send;
    /// `ControllerGetVolume`'s condition of `id`.
    fn controller_get_volume(
        &self,
        id: &VolumeId,
    ) -> impl Future<Output = Result<Option<VolumeCondition>, CsiError>> + Send;
    /// One `ListVolumes` page with the entries' conditions.
    fn list_conditions_page(
        &self,
        token: Option<String>,
    ) -> impl Future<Output = Result<ConditionPage, CsiError>> + Send;
}

impl HealthCalls for CsiServices {
    async fn node_stats(&self, id: &VolumeId, path: &str) -> Result<VolumeStats, CsiError> {
        self.node().node_stats(id, path).await
    }

    async fn controller_get_volume(
        &self,
        id: &VolumeId,
    ) -> Result<Option<VolumeCondition>, CsiError> {
        CsiServices::controller_get_volume(self, id).await
    }

    async fn list_conditions_page(&self, token: Option<String>) -> Result<ConditionPage, CsiError> {
        CsiServices::list_conditions_page(self, 0, token.as_deref()).await
    }
}

/// A volume the volume manager tracks, as the poller needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedVolume {
    /// The plugin's id.
    pub id: VolumeId,
    /// Whether it is published (at [`VolumeSource::target`]).
    pub published: bool,
}

/// Where the poller learns which volumes exist; implemented by [`ManagerVolumes`] and by
/// fakes in tests.
pub trait VolumeSource: Send + Sync + 'static {
    /// The volumes tracked now; `None` when that cannot be learnt now (the volume manager
    /// stopped): the poller keeps what it knows.
    fn tracked(&self) -> impl Future<Output = Option<Vec<TrackedVolume>>> + Send;
    /// Where a published volume `id` is published (`None`: it has no usable path).
    fn target(&self, id: &VolumeId) -> Option<String>;
}

/// The volume manager's records, read through its snapshot (no job, no lane).
#[derive(Debug, Clone)]
pub struct ManagerVolumes {
    /// The volume manager.
    pub handle: VolumeManagerHandle,
    /// Where it publishes volumes.
    pub paths: MountPaths,
}

impl VolumeSource for ManagerVolumes {
    fn target(&self, id: &VolumeId) -> Option<String> {
        let path = self.paths.target(id).ok()?;
        Some(path.to_string_lossy().into_owned())
    }

    async fn tracked(&self) -> Option<Vec<TrackedVolume>> {
        let records = self.handle.volumes().await.ok()?;
        Some(
            records
                .into_iter()
                .map(|r| {
                    let published = r.state.name() == StateName::Published;
                    TrackedVolume {
                        id: r.id,
                        published,
                    }
                })
                .collect(),
        )
    }
}

/// The volume manager's observer with a notice to the poller: every call and transition
/// is passed on to `inner` (the metrics), and a volume that moved (or a CreateVolume or
/// DeleteVolume that ended) wakes the poller to re-read the volume list.
#[derive(Debug)]
pub struct MovedNotice {
    /// The observer that counts.
    pub inner: Arc<dyn CallObserver>,
    /// What the poller waits on.
    pub moved: Arc<Notify>,
}

impl CallObserver for MovedNotice {
    fn call_ended(&self, rpc: CsiRpc, elapsed: Duration, ok: bool) {
        self.inner.call_ended(rpc, elapsed, ok);
        if matches!(rpc, CsiRpc::CreateVolume | CsiRpc::DeleteVolume) {
            self.moved.notify_one();
        }
    }

    fn volume_call_failed(&self, id: &VolumeId, error: &str) {
        self.inner.volume_call_failed(id, error);
    }

    fn volume_moved(&self, id: &VolumeId) {
        self.inner.volume_moved(id);
        self.moved.notify_one();
    }

    fn create_retrying(&self, name: &str, error: &str, next_retry_in: Duration) {
        self.inner.create_retrying(name, error, next_retry_in);
    }

    fn create_ended(&self, name: &str) {
        self.inner.create_ended(name);
    }
}

/// The poller of one provider, made of its parts; see the module docs.
#[derive(Debug)]
pub struct HealthPoller<C, V> {
    /// Interval, concurrency, deadline, backoff.
    pub cfg: HealthConfig,
    /// What the plugin is asked ([`Plan::of`] its capabilities).
    pub plan: Plan,
    /// The poller's own CSI calls.
    pub calls: C,
    /// Which volumes exist.
    pub source: V,
    /// Where the answers go: the provider's cache and counters.
    pub metrics: ProviderHealth,
    /// Notified when a volume moved (the volume manager's observer, [`MovedNotice`]), so
    /// that the list is re-read soon.
    pub moved: Arc<Notify>,
}

/// The end of one poll.
#[derive(Debug)]
enum Done {
    Volume {
        id: VolumeId,
        started: Instant,
        answer: Result<(Option<Usage>, Option<Condition>), CsiError>,
    },
    Sweep {
        started: Instant,
        answer: Result<Vec<ListedCondition>, CsiError>,
    },
}

type Poll = Pin<Box<dyn Future<Output = Done> + Send>>;

/// A tracked volume in the schedule.
#[derive(Debug)]
struct Entry {
    /// Whether it is published: its target path is asked of the source per poll, not
    /// kept (10,000 paths would be a megabyte).
    published: bool,
    /// When it is next due; `None` while a poll runs or when nothing is asked of it.
    due: Option<Instant>,
    /// When its last poll started.
    last_start: Option<Instant>,
    /// A poll of it is in flight (it reschedules the volume when it ends).
    polling: bool,
    /// The refresh that last saw it.
    seen: u64,
}

/// The poller's schedule and pause.
#[derive(Debug)]
struct Schedule {
    tracked: HashMap<VolumeId, Entry>,
    queue: BTreeSet<(Instant, VolumeId)>,
    sweep_due: Option<Instant>,
    sweeping: bool,
    generation: u64,
    /// Consecutive transient failures, and the end of the pause they caused.
    failures: u32,
    paused_until: Option<Instant>,
    rng: JitterRng,
    ticks: Ticks,
}

/// Due instants are rounded up to a multiple of `tick` after `epoch`, so that the volumes
/// due within one tick are started together: one timer wake-up per tick instead of one
/// per call (at 10,000 volumes a minute, the wake-ups of a call every 6 ms cost more CPU
/// than the calls).
#[derive(Debug, Clone, Copy)]
struct Ticks {
    epoch: Instant,
    tick: Duration,
}

impl Ticks {
    /// `t` rounded up to the next tick (never earlier: a volume is never asked sooner
    /// than one interval after its last poll).
    fn at(&self, t: Instant) -> Instant {
        let tick = self.tick.as_nanos().max(1);
        let since = t.saturating_duration_since(self.epoch).as_nanos();
        let ticks = since.div_ceil(tick);
        let nanos = u64::try_from(ticks.saturating_mul(tick)).unwrap_or(u64::MAX);
        self.epoch + Duration::from_nanos(nanos)
    }
}

impl<C: HealthCalls, V: VolumeSource> HealthPoller<C, V> {
    /// Runs until `cancel` fires; see the module docs. Returns at once for a plan that
    /// asks nothing (or a disabled poller): such a plugin costs nothing.
    pub async fn run(self, cancel: CancellationToken) {
        if self.plan.is_idle() || !self.cfg.enabled {
            return;
        }
        let interval = self.cfg.interval.max(Duration::from_millis(1));
        let mut s = Schedule {
            tracked: HashMap::new(),
            queue: BTreeSet::new(),
            sweep_due: None,
            sweeping: false,
            generation: 0,
            failures: 0,
            paused_until: None,
            rng: JitterRng::new(Jitter::Full),
            ticks: Ticks {
                epoch: Instant::now(),
                tick: (interval / TICKS_PER_INTERVAL).clamp(Duration::from_millis(1), MAX_TICK),
            },
        };
        if self.plan.controller == ControllerCheck::List {
            s.sweep_due = Some(s.ticks.at(Instant::now() + s.rng.sample(interval)));
        }
        let mut inflight: FuturesUnordered<Poll> = FuturesUnordered::new();
        let mut refresh_at = Instant::now();
        // When the list was last read, and the shortest gap before the next read on a
        // notice: the debounce, or a hundred times what the last read took, so that
        // reading the volume manager's records takes at most 1% of its time however
        // many volumes it tracks and however often they move.
        let mut last_refresh: Option<(Instant, Duration)> = None;
        loop {
            let now = Instant::now();
            if now >= refresh_at {
                self.refresh(&mut s, interval, now).await;
                let took = Instant::now().saturating_duration_since(now);
                last_refresh = Some((now, REFRESH_DEBOUNCE.max(took.saturating_mul(100))));
                refresh_at = now + interval;
            }
            let now = Instant::now();
            if s.paused_until.is_some_and(|p| now >= p) {
                s.paused_until = None;
            }
            // While the plugin fails, one call at a time probes it (after each pause).
            let limit = if s.failures > 0 {
                1
            } else {
                self.cfg.concurrency.max(1)
            };
            if s.paused_until.is_none() {
                while inflight.len() < limit {
                    match self.next_poll(&mut s, now) {
                        Some(poll) => inflight.push(poll),
                        None => break,
                    }
                }
            }
            let full = inflight.len() >= limit;
            let next_due = match s.paused_until {
                Some(p) => Some(p),
                None if full => None,
                None => [s.queue.first().map(|(t, _)| *t), s.sweep_due]
                    .into_iter()
                    .flatten()
                    .min(),
            };
            let wake = next_due.map_or(refresh_at, |d| d.min(refresh_at));
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(done) = inflight.next(), if !inflight.is_empty() => {
                    self.finish(&mut s, done, interval);
                }
                () = self.moved.notified() => {
                    let soonest = last_refresh.map_or(now, |(at, gap)| at + gap);
                    refresh_at = refresh_at.min(soonest.max(now + REFRESH_SETTLE));
                }
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        self.metrics.cache().clear();
    }

    /// Whether a volume gets polls of its own (a sweep may still cover its condition).
    fn asked(&self, published: bool) -> bool {
        (published && self.plan.stats)
            || (self.plan.controller == ControllerCheck::GetVolume
                && self.plan.controller_condition(published))
    }

    /// Re-reads the volume list (see the module docs, step 1).
    async fn refresh(&self, s: &mut Schedule, interval: Duration, now: Instant) {
        let listed = match tokio::time::timeout(self.cfg.timeout, self.source.tracked()).await {
            Ok(Some(listed)) => listed,
            Ok(None) | Err(_) => return,
        };
        s.generation += 1;
        let generation = s.generation;
        let cache = self.metrics.cache();
        for TrackedVolume { id, published } in listed {
            let asked = self.asked(published);
            match s.tracked.get_mut(&id) {
                None => {
                    cache.track(&id);
                    let due = asked.then(|| s.ticks.at(now + s.rng.sample(interval)));
                    if let Some(due) = due {
                        s.queue.insert((due, id.clone()));
                    }
                    s.tracked.insert(
                        id,
                        Entry {
                            published,
                            due,
                            last_start: None,
                            polling: false,
                            seen: generation,
                        },
                    );
                }
                Some(entry) => {
                    entry.seen = generation;
                    if entry.published == published {
                        continue;
                    }
                    if !published {
                        cache.drop_usage(&id);
                    }
                    entry.published = published;
                    if let Some(due) = entry.due.take() {
                        s.queue.remove(&(due, id.clone()));
                    }
                    if entry.polling || !asked {
                        // A poll in flight reschedules the volume when it ends.
                        continue;
                    }
                    let earliest = entry.last_start.map_or(now, |t| t + interval);
                    let due = s.ticks.at((now + s.rng.sample(interval)).max(earliest));
                    entry.due = Some(due);
                    s.queue.insert((due, id));
                }
            }
        }
        let queue = &mut s.queue;
        s.tracked.retain(|id, entry| {
            if entry.seen == generation {
                return true;
            }
            if let Some(due) = entry.due {
                queue.remove(&(due, id.clone()));
            }
            cache.forget(id);
            false
        });
    }

    /// The next poll to start at `now`, if one is due.
    fn next_poll(&self, s: &mut Schedule, now: Instant) -> Option<Poll> {
        if !s.sweeping && s.sweep_due.is_some_and(|d| d <= now) {
            s.sweeping = true;
            s.sweep_due = None;
            return Some(Box::pin(sweep(
                self.calls.clone(),
                self.metrics.clone(),
                self.cfg.timeout,
                now,
            )));
        }
        let (due, _) = s.queue.first()?;
        if *due > now {
            return None;
        }
        let (_, id) = s.queue.pop_first()?;
        let entry = s.tracked.get_mut(&id)?;
        entry.due = None;
        entry.last_start = Some(now);
        entry.polling = true;
        let target = entry.published.then(|| self.source.target(&id)).flatten();
        Some(Box::pin(poll_volume(
            self.calls.clone(),
            self.plan,
            self.metrics.clone(),
            self.cfg.timeout,
            id,
            target,
            now,
        )))
    }

    /// Records a poll's answer and schedules what it polled again.
    fn finish(&self, s: &mut Schedule, done: Done, interval: Duration) {
        let now = Instant::now();
        let cache = self.metrics.cache();
        let failure = match done {
            Done::Volume {
                id,
                started,
                answer,
            } => {
                let Some(entry) = s.tracked.get_mut(&id) else {
                    // Dropped while the call was in flight.
                    return;
                };
                entry.polling = false;
                let failure = match answer {
                    Ok((usage, condition)) => {
                        let usage = usage.filter(|_| entry.published);
                        cache.record(&id, usage, condition, now);
                        None
                    }
                    Err(e) => {
                        cache.record_error(&id, DisplayChain(&e).to_string());
                        Some(e)
                    }
                };
                if self.asked(entry.published) {
                    let due = s.ticks.at(next_due(started, interval, now, &mut s.rng));
                    entry.due = Some(due);
                    s.queue.insert((due, id));
                }
                failure
            }
            Done::Sweep { started, answer } => {
                s.sweeping = false;
                s.sweep_due = Some(s.ticks.at(next_due(started, interval, now, &mut s.rng)));
                match answer {
                    Ok(listed) => {
                        for l in listed {
                            let covered = s
                                .tracked
                                .get(&l.volume_id)
                                .is_some_and(|e| self.plan.controller_condition(e.published));
                            if covered {
                                let condition = l
                                    .condition
                                    .map(|c| Condition::from_csi(c, CsiRpc::ListVolumes.as_str()));
                                cache.record(&l.volume_id, None, condition, now);
                            }
                        }
                        None
                    }
                    Err(e) => Some(e),
                }
            }
        };
        match failure {
            None => {
                if s.failures > 0 {
                    tracing::info!(provider = %cache.provider(), "the plugin answers the volume health poller again");
                }
                s.failures = 0;
            }
            Some(e) if e.retry_class() == RetryClass::Transient => {
                s.failures = s.failures.saturating_add(1);
                // At least half the ceiling: a pause drawn near zero would be no pause.
                let ceiling = self.cfg.backoff.ceiling(s.failures);
                let pause = ceiling / 2 + s.rng.sample(ceiling / 2);
                s.paused_until = Some(now + pause);
                if s.failures == 1 {
                    tracing::warn!(provider = %cache.provider(), error = %DisplayChain(&e), ?pause, "a volume health call failed; the poller backs off");
                }
            }
            Some(e) => {
                tracing::debug!(provider = %cache.provider(), error = %DisplayChain(&e), "a volume health call was refused");
            }
        }
    }
}

/// When something polled at `started` is next due: one interval later, or, if that has
/// passed (a slow call, a pause), at a moment drawn over the next interval.
fn next_due(started: Instant, interval: Duration, now: Instant, rng: &mut JitterRng) -> Instant {
    let due = started + interval;
    if due > now {
        due
    } else {
        now + rng.sample(interval)
    }
}

/// Runs `call` within `timeout`, counting it into `metrics` as `rpc`.
async fn counted<T>(
    metrics: &ProviderHealth,
    rpc: CsiRpc,
    timeout: Duration,
    call: impl Future<Output = Result<T, CsiError>>,
) -> Result<T, CsiError> {
    metrics.called(rpc);
    let result = match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(CsiError::Timeout {
            rpc,
            after: timeout,
        }),
    };
    if result.is_err() {
        metrics.failed(rpc);
    }
    result
}

/// One volume's poll: `NodeGetVolumeStats` if it is published (at `target`) and the node
/// serves it, then `ControllerGetVolume` if its condition comes from the controller.
async fn poll_volume<C: HealthCalls>(
    calls: C,
    plan: Plan,
    metrics: ProviderHealth,
    timeout: Duration,
    id: VolumeId,
    target: Option<String>,
    started: Instant,
) -> Done {
    let answer = async {
        let mut usage = None;
        let mut condition = None;
        if let Some(target) = &target
            && plan.stats
        {
            let rpc = CsiRpc::NodeGetVolumeStats;
            let stats = counted(&metrics, rpc, timeout, calls.node_stats(&id, target)).await?;
            usage = Some(Usage::of(&stats));
            if plan.node_condition
                && let Some(abnormal) = stats.abnormal
            {
                condition = Some(Condition {
                    abnormal,
                    message: stats.condition_message.unwrap_or_default(),
                    source: rpc.as_str(),
                });
            }
        }
        if plan.controller == ControllerCheck::GetVolume
            && plan.controller_condition(target.is_some())
        {
            let rpc = CsiRpc::ControllerGetVolume;
            let got = counted(&metrics, rpc, timeout, calls.controller_get_volume(&id)).await?;
            condition = got.map(|c| Condition::from_csi(c, rpc.as_str()));
        }
        Ok((usage, condition))
    }
    .await;
    Done::Volume {
        id,
        started,
        answer,
    }
}

/// One `ListVolumes` sweep, every page within `timeout` each.
async fn sweep<C: HealthCalls>(
    calls: C,
    metrics: ProviderHealth,
    timeout: Duration,
    started: Instant,
) -> Done {
    let answer = async {
        let mut all = Vec::new();
        let mut token = None;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..MAX_SWEEP_PAGES {
            let rpc = CsiRpc::ListVolumes;
            let page = counted(&metrics, rpc, timeout, calls.list_conditions_page(token)).await?;
            all.extend(page.entries);
            match page.next_token {
                Some(next) if seen.insert(next.clone()) => token = Some(next),
                Some(_) | None => break,
            }
        }
        Ok(all)
    }
    .await;
    Done::Sweep { started, answer }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use slrp_csi::{Code, UsageUnit, VolumeUsage};

    use super::*;
    use crate::health::{HealthMetrics, HealthStatus};

    /// What the fake plugin does with a call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Mode {
        /// Answers after 10 ms.
        Answer,
        /// Fails with UNAVAILABLE.
        Unavailable,
        /// Never answers.
        Hang,
    }

    #[derive(Debug, Default)]
    struct Calls {
        by_volume: HashMap<String, Vec<Instant>>,
        by_rpc: HashMap<&'static str, u64>,
        in_flight: usize,
        max_in_flight: usize,
        abnormal: HashMap<String, String>,
        /// The volumes ListVolumes lists.
        listed: Vec<VolumeId>,
    }

    #[derive(Debug, Clone)]
    struct Fake {
        mode: Arc<Mutex<Mode>>,
        calls: Arc<Mutex<Calls>>,
    }

    impl Fake {
        fn new() -> Self {
            Self {
                mode: Arc::new(Mutex::new(Mode::Answer)),
                calls: Arc::default(),
            }
        }

        fn set(&self, mode: Mode) {
            *self.mode.lock().unwrap() = mode;
        }

        fn calls(&self) -> std::sync::MutexGuard<'_, Calls> {
            self.calls.lock().unwrap()
        }

        async fn call(&self, rpc: &'static str, id: Option<&VolumeId>) -> Result<(), CsiError> {
            {
                let mut c = self.calls();
                *c.by_rpc.entry(rpc).or_default() += 1;
                if let Some(id) = id {
                    c.by_volume
                        .entry(id.as_str().to_owned())
                        .or_default()
                        .push(Instant::now());
                }
                c.in_flight += 1;
                c.max_in_flight = c.max_in_flight.max(c.in_flight);
            }
            // Ends the call in the count when the poller drops it (its timeout) too.
            struct Leave(Arc<Mutex<Calls>>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.lock().unwrap().in_flight -= 1;
                }
            }
            let _leave = Leave(self.calls.clone());
            let mode = *self.mode.lock().unwrap();
            match mode {
                Mode::Answer => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok(())
                }
                Mode::Unavailable => Err(CsiError::Rpc {
                    rpc: CsiRpc::NodeGetVolumeStats,
                    code: Code::Unavailable,
                    source: tonic::Status::unavailable("down"),
                }),
                Mode::Hang => std::future::pending().await,
            }
        }

        fn condition(&self, id: &VolumeId) -> VolumeCondition {
            match self.calls().abnormal.get(id.as_str()) {
                Some(message) => VolumeCondition {
                    abnormal: true,
                    message: message.clone(),
                },
                None => VolumeCondition {
                    abnormal: false,
                    message: "ok".into(),
                },
            }
        }
    }

    impl HealthCalls for Fake {
        async fn node_stats(&self, id: &VolumeId, _path: &str) -> Result<VolumeStats, CsiError> {
            self.call("NodeGetVolumeStats", Some(id)).await?;
            let c = self.condition(id);
            Ok(VolumeStats {
                usage: vec![VolumeUsage {
                    unit: UsageUnit::Bytes,
                    total: 100,
                    available: 75,
                    used: 25,
                }],
                abnormal: Some(c.abnormal),
                condition_message: Some(c.message),
            })
        }

        async fn controller_get_volume(
            &self,
            id: &VolumeId,
        ) -> Result<Option<VolumeCondition>, CsiError> {
            self.call("ControllerGetVolume", Some(id)).await?;
            Ok(Some(self.condition(id)))
        }

        async fn list_conditions_page(
            &self,
            _token: Option<String>,
        ) -> Result<ConditionPage, CsiError> {
            self.call("ListVolumes", None).await?;
            let listed = self.calls().listed.clone();
            Ok(ConditionPage {
                entries: listed
                    .into_iter()
                    .map(|id| ListedCondition {
                        condition: Some(self.condition(&id)),
                        volume_id: id,
                    })
                    .collect(),
                next_token: None,
            })
        }
    }

    #[derive(Debug, Clone, Default)]
    struct Source(Arc<Mutex<Vec<TrackedVolume>>>);

    impl Source {
        fn set(&self, volumes: Vec<TrackedVolume>) {
            *self.0.lock().unwrap() = volumes;
        }
    }

    impl VolumeSource for Source {
        fn target(&self, id: &VolumeId) -> Option<String> {
            Some(format!("/t/{id}"))
        }

        async fn tracked(&self) -> Option<Vec<TrackedVolume>> {
            Some(self.0.lock().unwrap().clone())
        }
    }

    fn published(n: usize) -> Vec<TrackedVolume> {
        (0..n)
            .map(|i| TrackedVolume {
                id: VolumeId::new(format!("v{i}")),
                published: true,
            })
            .collect()
    }

    fn cfg() -> HealthConfig {
        HealthConfig {
            interval: Duration::from_secs(60),
            concurrency: 4,
            timeout: Duration::from_secs(10),
            backoff: slrp_types::Backoff::new(Duration::from_secs(5), Duration::from_secs(40))
                .unwrap(),
            enabled: true,
        }
    }

    fn bundled() -> Plan {
        Plan {
            stats: true,
            node_condition: true,
            controller: ControllerCheck::GetVolume,
        }
    }

    struct Running {
        fake: Fake,
        source: Source,
        metrics: ProviderHealth,
        moved: Arc<Notify>,
        cancel: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(plan: Plan, cfg: HealthConfig, volumes: Vec<TrackedVolume>) -> Running {
        let fake = Fake::new();
        let source = Source::default();
        source.set(volumes);
        let metrics = HealthMetrics::default().provider("t.n", None);
        let moved = Arc::new(Notify::new());
        let cancel = CancellationToken::new();
        let poller = HealthPoller {
            cfg,
            plan,
            calls: fake.clone(),
            source: source.clone(),
            metrics: metrics.clone(),
            moved: moved.clone(),
        };
        let task = tokio::spawn(poller.run(cancel.clone()));
        Running {
            fake,
            source,
            metrics,
            moved,
            cancel,
            task,
        }
    }

    async fn sleep(secs: u64) {
        tokio::time::sleep(Duration::from_secs(secs)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn each_volume_is_polled_once_per_interval_spread_over_it_and_bounded() {
        let r = start(bundled(), cfg(), published(1000));
        sleep(30).await;
        let half = r.fake.calls().by_volume.len();
        // Drawn uniformly over the interval: about half are due in its first half.
        assert!((350..=650).contains(&half), "{half} of 1000 in 30 s");
        sleep(29).await;
        {
            let c = r.fake.calls();
            assert!(c.by_volume.values().all(|t| t.len() == 1), "at most once");
            assert!(c.max_in_flight <= 4, "{} in flight", c.max_in_flight);
            assert_eq!(c.by_rpc.get("ControllerGetVolume"), None, "the node tells");
        }
        // Due instants are rounded up to the next tick (1 s at this interval).
        sleep(64).await;
        {
            let c = r.fake.calls();
            assert_eq!(
                c.by_volume.len(),
                1000,
                "every volume by the end of the interval"
            );
            for times in c.by_volume.values() {
                assert!((2..=3).contains(&times.len()), "{times:?}");
                for pair in times.windows(2) {
                    assert!(pair[1] - pair[0] >= Duration::from_secs(60), "{pair:?}");
                }
            }
        }
        let h = r.metrics.cache().get(&VolumeId::new("v1")).unwrap();
        assert_eq!(h.status(), HealthStatus::Ok);
        assert_eq!(h.usage.unwrap().bytes.unwrap().used, 25);
        r.cancel.cancel();
        r.task.await.unwrap();
        assert!(r.metrics.cache().is_empty(), "cleared on stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_plugin_without_the_capabilities_is_never_asked() {
        let r = start(Plan::idle(), cfg(), published(10));
        r.task.await.unwrap();
        assert!(r.fake.calls().by_rpc.is_empty());
        assert!(r.metrics.cache().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn unpublished_volumes_get_the_controller_condition_and_destroyed_ones_are_dropped() {
        let mut volumes = published(2);
        volumes[1].published = false;
        let r = start(bundled(), cfg(), volumes);
        r.fake
            .calls()
            .abnormal
            .insert("v1".into(), "image /x is missing".into());
        sleep(61).await;
        let (v0, v1) = (VolumeId::new("v0"), VolumeId::new("v1"));
        let h1 = r.metrics.cache().get(&v1).unwrap();
        assert_eq!(h1.status(), HealthStatus::Abnormal);
        assert_eq!(h1.usage, None, "no usage for an unpublished volume");
        let c = h1.condition.unwrap();
        assert_eq!(c.message, "image /x is missing");
        assert_eq!(c.source, "ControllerGetVolume");
        assert_eq!(r.metrics.calls(CsiRpc::ControllerGetVolume), 1);
        assert_eq!(r.metrics.calls(CsiRpc::NodeGetVolumeStats), 1);

        // v1 destroyed: gone from the cache as soon as the manager says a volume moved.
        r.source.set(published(1));
        r.moved.notify_one();
        sleep(2).await;
        assert!(r.metrics.cache().get(&v1).is_none());
        assert!(r.metrics.cache().get(&v0).is_some());
        r.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_plugin_backs_the_poller_off_and_a_hanging_one_is_cut_at_the_timeout() {
        let r = start(bundled(), cfg(), published(100));
        r.fake.set(Mode::Unavailable);
        sleep(60).await;
        let failed = r.metrics.failures(CsiRpc::NodeGetVolumeStats);
        // One probe at a time, paused 2.5–5 s, 5–10 s, 10–20 s, then 20–40 s after each
        // failure: a handful of calls in a minute, not one per volume.
        assert!((2..=8).contains(&failed), "{failed} failures in 60 s");
        assert_eq!(failed, r.metrics.calls(CsiRpc::NodeGetVolumeStats));
        let v = r
            .metrics
            .cache()
            .all()
            .into_iter()
            .find(|(_, h)| h.last_error.is_some())
            .unwrap();
        assert!(v.1.last_error.unwrap().contains("NodeGetVolumeStats"));

        r.fake.set(Mode::Hang);
        let before = r.metrics.calls(CsiRpc::NodeGetVolumeStats);
        sleep(200).await;
        let hung = r.metrics.calls(CsiRpc::NodeGetVolumeStats) - before;
        assert!(hung >= 1, "calls go on after the pause");
        assert!(r.fake.calls().in_flight <= 4, "hanging calls are bounded");
        assert_eq!(
            r.metrics.failures(CsiRpc::NodeGetVolumeStats) - failed,
            hung - u64::try_from(r.fake.calls().in_flight).unwrap(),
            "each hanging call ends in a timeout failure"
        );

        r.fake.set(Mode::Answer);
        sleep(300).await;
        let ok = r
            .metrics
            .cache()
            .all()
            .into_iter()
            .filter(|(_, h)| h.usage.is_some())
            .count();
        assert_eq!(ok, 100, "all sampled once the plugin answers again");
        r.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_plugin_is_swept_once_per_interval() {
        let plan = Plan {
            stats: false,
            node_condition: false,
            controller: ControllerCheck::List,
        };
        let mut volumes = published(3);
        for v in &mut volumes {
            v.published = false;
        }
        let r = start(plan, cfg(), volumes.clone());
        r.fake.calls().listed = volumes.iter().map(|v| v.id.clone()).collect();
        r.fake
            .calls()
            .abnormal
            .insert("v2".into(), "directory /d is missing".into());
        sleep(60 * 5 + 59).await;
        let cache = r.metrics.cache();
        assert_eq!(
            cache.get(&VolumeId::new("v0")).unwrap().status(),
            HealthStatus::Ok
        );
        let v2 = cache.get(&VolumeId::new("v2")).unwrap().condition.unwrap();
        assert!(v2.abnormal);
        assert_eq!(v2.message, "directory /d is missing");
        assert_eq!(v2.source, "ListVolumes");
        let sweeps = r.metrics.calls(CsiRpc::ListVolumes);
        assert!((5..=6).contains(&sweeps), "{sweeps} sweeps in 5 intervals");
        assert_eq!(r.metrics.calls(CsiRpc::ControllerGetVolume), 0);
        assert!(r.fake.calls().by_volume.is_empty(), "no per-volume calls");
        r.cancel.cancel();
    }
}
