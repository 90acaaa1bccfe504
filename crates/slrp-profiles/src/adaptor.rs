//! The profile adaptor: a worker task that owns the profile table and a cloneable handle.
//!
//! The worker polls the source, validates each document, applies it to the table, persists
//! the table when it changed, and publishes one view per subscribed provider. Views reach
//! subscribers through `tokio::sync::watch`, after a random delay bounded by
//! `max_random_wait` (Mesos's `watch` advice against thundering herds, which Mesos itself
//! never implemented).
//!
//! # Shutdown
//! The worker stops when its cancellation token fires or when every handle is dropped. Its
//! watch senders drop with it, so subscribers see the channel close. A fetch in flight is
//! abandoned (fetches have no side effects); a state file write in flight completes first,
//! because it runs on the blocking pool and the worker awaits it.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use slrp_types::{DisplayChain, Jitter, JitterRng};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    config::ProfilesConfig,
    document::{DocumentError, ProfileInfo, ProfileMapping, ProviderKey, Selector},
    metrics::Metrics,
    persist,
    source::{FetchError, Fetched, Fetcher},
    table::{ProfileTable, TranslateError},
};

/// What a provider sees: its active, applicable profiles by name.
pub type ProfileView = BTreeMap<String, ProfileInfo>;

const COMMAND_BUFFER: usize = 64;

/// The adaptor has stopped; no more answers will come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the profile adaptor has stopped")]
pub struct AdaptorStopped;

/// Why one update was not applied. The previous mapping stays in force.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The document could not be fetched.
    #[error("fetching the profile document failed")]
    Fetch(#[source] FetchError),
    /// The document was fetched but rejected.
    #[error("the fetched profile document was rejected")]
    Document(#[source] DocumentError),
}

/// The result of one fetch, as reported by [`ProfileAdaptorHandle::poll_now`].
#[derive(Debug, Clone)]
pub enum PollOutcome {
    /// The document was accepted (possibly with ignored conflicting profiles).
    Applied {
        /// Profiles that became active.
        added: BTreeSet<String>,
        /// Profiles that became inactive.
        removed: BTreeSet<String>,
        /// Profiles whose changed definition was ignored.
        conflicts: BTreeSet<String>,
    },
    /// Nothing was applied.
    Failed(Arc<UpdateError>),
}

/// One profile in a [`StatusSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileStatus {
    /// Whether the profile is in force.
    pub active: bool,
    /// Which providers it applies to.
    pub selector: Selector,
    /// What it translates to.
    pub info: ProfileInfo,
}

/// What the adaptor knows, for operators (`slrp ctl profiles`).
#[derive(Debug, Clone)]
pub struct StatusSnapshot {
    /// The source, with secrets redacted.
    pub source: String,
    /// Every profile ever seen.
    pub profiles: BTreeMap<String, ProfileStatus>,
    /// Profiles whose definition changed at the source and is being ignored until renamed,
    /// with the ignored definition.
    pub conflicts: BTreeMap<String, ProfileInfo>,
    /// Fetches completed so far, successful or not.
    pub fetches_completed: u64,
    /// Why the latest fetch was not applied; `None` after a successful one.
    pub last_error: Option<String>,
    /// Whether the table was restored from the state file at start.
    pub restored_from_state: bool,
    /// The latest problem reading or writing the state file.
    pub state_error: Option<String>,
}

enum Command {
    /// Fetch now; owned by `run`, which owns the fetch in flight.
    PollNow { reply: oneshot::Sender<PollOutcome> },
    /// Everything answered from the table alone.
    Query(Query),
}

enum Query {
    Subscribe {
        key: ProviderKey,
        reply: oneshot::Sender<watch::Receiver<ProfileView>>,
    },
    Translate {
        profile: String,
        key: ProviderKey,
        reply: oneshot::Sender<Result<ProfileInfo, TranslateError>>,
    },
    Status {
        reply: oneshot::Sender<StatusSnapshot>,
    },
}

/// Cloneable access to a running adaptor.
#[derive(Debug, Clone)]
pub struct ProfileAdaptorHandle {
    tx: mpsc::Sender<Command>,
}

impl ProfileAdaptorHandle {
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, AdaptorStopped> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| AdaptorStopped)?;
        rx.await.map_err(|_| AdaptorStopped)
    }

    /// Subscribes `provider` to its profile view. The receiver holds the current view at
    /// once (Mesos's `watch` returns immediately when the caller's set differs) and sees
    /// each later change, delayed by up to `max_random_wait`.
    ///
    /// # Errors
    /// [`AdaptorStopped`] if the worker has stopped.
    pub async fn subscribe(
        &self,
        provider: ProviderKey,
    ) -> Result<watch::Receiver<ProfileView>, AdaptorStopped> {
        self.ask(|reply| {
            Command::Query(Query::Subscribe {
                key: provider,
                reply,
            })
        })
        .await
    }

    /// Translates an active profile for `provider`.
    ///
    /// # Errors
    /// Mesos's "not found" and "does not apply" errors, or [`TranslateError::Stopped`].
    pub async fn translate(
        &self,
        profile: &str,
        provider: &ProviderKey,
    ) -> Result<ProfileInfo, TranslateError> {
        self.ask(|reply| {
            Command::Query(Query::Translate {
                profile: profile.to_owned(),
                key: provider.clone(),
                reply,
            })
        })
        .await
        .map_err(|AdaptorStopped| TranslateError::Stopped)?
    }

    /// Fetches now (after any fetch in flight, which may predate the call) and reports what
    /// the fetch did. Watchers are notified as for a scheduled poll.
    ///
    /// # Errors
    /// [`AdaptorStopped`] if the worker has stopped.
    pub async fn poll_now(&self) -> Result<PollOutcome, AdaptorStopped> {
        self.ask(|reply| Command::PollNow { reply }).await
    }

    /// A snapshot of the adaptor's state.
    ///
    /// # Errors
    /// [`AdaptorStopped`] if the worker has stopped.
    pub async fn status(&self) -> Result<StatusSnapshot, AdaptorStopped> {
        self.ask(|reply| Command::Query(Query::Status { reply }))
            .await
    }
}

struct Subscription {
    tx: watch::Sender<ProfileView>,
    /// A changed view waiting for its random delay to pass. A further change before the
    /// deadline replaces the view but keeps the deadline, so a flapping source cannot
    /// postpone delivery forever.
    pending: Option<(Instant, ProfileView)>,
}

type FetchFuture = Pin<Box<dyn Future<Output = Result<Fetched, FetchError>> + Send>>;

/// The task that owns the profile table. Build with [`ProfileAdaptorWorker::new`], run with
/// [`ProfileAdaptorWorker::run`] (or use [`spawn`]).
pub struct ProfileAdaptorWorker {
    fetcher: Arc<Fetcher>,
    poll_interval: Option<Duration>,
    max_random_wait: Duration,
    max_document_bytes: usize,
    state_file: Option<PathBuf>,
    metrics: Metrics,
    rx: mpsc::Receiver<Command>,
    table: ProfileTable,
    subs: BTreeMap<ProviderKey, Subscription>,
    conflicts: BTreeMap<String, ProfileInfo>,
    /// Fetches started; a `poll_now` caller waits for the completion of a given number.
    fetches_started: u64,
    fetches_completed: u64,
    poll_waiters: Vec<(u64, oneshot::Sender<PollOutcome>)>,
    refetch: bool,
    last_error: Option<String>,
    restored_from_state: bool,
    state_error: Option<String>,
}

impl std::fmt::Debug for ProfileAdaptorWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProfileAdaptorWorker")
            .field("source", self.fetcher.source())
            .field("profiles", &self.table.entries().len())
            .field("subscriptions", &self.subs.len())
            .finish_non_exhaustive()
    }
}

/// Spawns the adaptor on the current runtime, in its own `profiles` span.
#[must_use]
pub fn spawn(
    config: ProfilesConfig,
    metrics: Metrics,
    cancel: CancellationToken,
) -> (ProfileAdaptorHandle, JoinHandle<()>) {
    let (worker, handle) = ProfileAdaptorWorker::new(config, metrics);
    let span = tracing::info_span!(parent: None, "profiles");
    (handle, tokio::spawn(worker.run(cancel).instrument(span)))
}

impl ProfileAdaptorWorker {
    /// Builds the worker and its handle. Nothing runs until [`run`](Self::run).
    #[must_use]
    pub fn new(config: ProfilesConfig, metrics: Metrics) -> (Self, ProfileAdaptorHandle) {
        let (tx, rx) = mpsc::channel(COMMAND_BUFFER);
        let worker = Self {
            fetcher: Arc::new(Fetcher::new(
                config.source,
                config.ca_file,
                config.fetch_timeout,
                config.max_document_bytes,
            )),
            poll_interval: config.poll_interval,
            max_random_wait: config.max_random_wait,
            max_document_bytes: config.max_document_bytes,
            state_file: config.state_file,
            metrics,
            rx,
            table: ProfileTable::default(),
            subs: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            fetches_started: 0,
            fetches_completed: 0,
            poll_waiters: Vec::new(),
            refetch: false,
            last_error: None,
            restored_from_state: false,
            state_error: None,
        };
        (worker, ProfileAdaptorHandle { tx })
    }

    /// Restores the persisted table, then polls and serves commands until `cancel` fires or
    /// every handle is dropped.
    pub async fn run(mut self, cancel: CancellationToken) {
        self.restore().await;
        let mut in_flight: Option<FetchFuture> = Some(self.start_fetch());
        let mut next_poll: Option<Instant> = None;
        loop {
            let next_delivery = self.next_delivery();
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                cmd = self.rx.recv() => match cmd {
                    None => break,
                    Some(Command::PollNow { reply }) => {
                        if in_flight.is_some() {
                            // The fetch in flight may have started before the caller's
                            // change at the source: answer after the next one.
                            self.refetch = true;
                            self.poll_waiters.push((self.fetches_started + 1, reply));
                        } else {
                            in_flight = Some(self.start_fetch());
                            next_poll = None;
                            self.poll_waiters.push((self.fetches_started, reply));
                        }
                    }
                    Some(Command::Query(q)) => self.handle(q),
                },
                result = async { in_flight.as_mut().expect("branch enabled only when a fetch is in flight").await }, if in_flight.is_some() => {
                    in_flight = None;
                    let outcome = self.on_fetched(result).await;
                    self.fetches_completed += 1;
                    let done = self.fetches_completed;
                    for (_, reply) in self.poll_waiters.extract_if(.., |(need, _)| *need <= done) {
                        // The caller may have given up waiting; nothing to do then.
                        let _ = reply.send(outcome.clone());
                    }
                    if std::mem::take(&mut self.refetch) {
                        in_flight = Some(self.start_fetch());
                    } else {
                        next_poll = self.poll_interval.map(|d| later(Instant::now(), d));
                    }
                }
                () = tokio::time::sleep_until(next_poll.unwrap_or_else(Instant::now)), if in_flight.is_none() && next_poll.is_some() => {
                    next_poll = None;
                    in_flight = Some(self.start_fetch());
                }
                () = tokio::time::sleep_until(next_delivery.unwrap_or_else(Instant::now)), if next_delivery.is_some() => {
                    self.deliver_due();
                }
            }
        }
        tracing::debug!("profile adaptor stopped");
    }

    fn start_fetch(&mut self) -> FetchFuture {
        self.fetches_started += 1;
        let fetcher = Arc::clone(&self.fetcher);
        Box::pin(async move { fetcher.fetch().await })
    }

    fn handle(&mut self, query: Query) {
        match query {
            Query::Subscribe { key, reply } => {
                let view = self.table.view(&key);
                let sub = self.subs.entry(key).or_insert_with(|| Subscription {
                    tx: watch::channel(view).0,
                    pending: None,
                });
                let _ = reply.send(sub.tx.subscribe());
            }
            Query::Translate {
                profile,
                key,
                reply,
            } => {
                let _ = reply.send(self.table.translate(&profile, &key));
            }
            Query::Status { reply } => {
                let _ = reply.send(self.snapshot());
            }
        }
    }

    fn snapshot(&self) -> StatusSnapshot {
        StatusSnapshot {
            source: self.fetcher.source().to_string(),
            profiles: self
                .table
                .entries()
                .iter()
                .map(|(name, e)| {
                    (
                        name.clone(),
                        ProfileStatus {
                            active: e.active,
                            selector: e.manifest.selector.clone(),
                            info: e.manifest.info.clone(),
                        },
                    )
                })
                .collect(),
            conflicts: self.conflicts.clone(),
            fetches_completed: self.fetches_completed,
            last_error: self.last_error.clone(),
            restored_from_state: self.restored_from_state,
            state_error: self.state_error.clone(),
        }
    }

    async fn restore(&mut self) {
        let Some(path) = self.state_file.clone() else {
            return;
        };
        let limit = persist::state_limit(self.max_document_bytes);
        let shown = path.clone();
        match tokio::task::spawn_blocking(move || persist::load(&path, limit)).await {
            Ok(Ok(Some(table))) => {
                tracing::info!(
                    state_file = %shown.display(),
                    profiles = table.entries().len(),
                    active = table.active_count(),
                    "restored persisted profiles"
                );
                self.table = table;
                self.restored_from_state = true;
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                // Not fatal: the source is the truth; we only lose the head start.
                tracing::warn!(error = %DisplayChain(&e), "ignoring unreadable profile state file");
                self.state_error = Some(DisplayChain(&e).to_string());
            }
            Err(join) => {
                tracing::error!(error = %DisplayChain(&join), "loading the profile state file panicked");
                self.state_error = Some(join.to_string());
            }
        }
        self.metrics
            .active_profiles
            .set(i64::try_from(self.table.active_count()).unwrap_or(i64::MAX));
    }

    async fn on_fetched(&mut self, result: Result<Fetched, FetchError>) -> PollOutcome {
        let source = self.fetcher.source().to_string();
        let fetched = match result {
            Ok(f) => f,
            Err(e) => {
                self.metrics.fetches_failed.inc();
                let e = UpdateError::Fetch(e);
                tracing::warn!(%source, error = %DisplayChain(&e), "keeping the last good profile mapping");
                self.last_error = Some(DisplayChain(&e).to_string());
                return PollOutcome::Failed(Arc::new(e));
            }
        };
        self.metrics.fetches_ok.inc();
        let parsed = match fetched {
            Fetched::Bytes(b) => ProfileMapping::parse(&b),
            Fetched::Value(v) => ProfileMapping::from_value(v),
        };
        let mapping = match parsed {
            Ok(m) => m,
            Err(e) => {
                self.metrics.validation_failures.inc();
                let e = UpdateError::Document(e);
                tracing::warn!(%source, error = %DisplayChain(&e), "keeping the last good profile mapping");
                self.last_error = Some(DisplayChain(&e).to_string());
                return PollOutcome::Failed(Arc::new(e));
            }
        };
        self.last_error = None;
        let outcome = self.table.apply(mapping);
        self.note_conflicts(&outcome.conflicts);
        if outcome.changed {
            tracing::info!(added = ?outcome.added, removed = ?outcome.removed, "profiles changed");
            self.persist().await;
            self.publish();
        }
        self.metrics
            .active_profiles
            .set(i64::try_from(self.table.active_count()).unwrap_or(i64::MAX));
        PollOutcome::Applied {
            added: outcome.added,
            removed: outcome.removed,
            conflicts: outcome.conflicts.into_keys().collect(),
        }
    }

    /// Reports each conflict once when it appears (or its ignored definition changes) and
    /// forgets conflicts the source no longer presents.
    fn note_conflicts(&mut self, found: &BTreeMap<String, ProfileInfo>) {
        for (name, info) in found {
            if self.conflicts.get(name) != Some(info) {
                self.metrics.conflicts.inc();
                tracing::warn!(
                    profile = %name,
                    "profile definition changed under an existing name; profiles are immutable, \
                     so the change is ignored until it is published under a new name"
                );
            }
        }
        for name in self.conflicts.keys() {
            if !found.contains_key(name) {
                tracing::info!(profile = %name, "profile conflict resolved at the source");
            }
        }
        self.conflicts.clone_from(found);
    }

    async fn persist(&mut self) {
        let Some(path) = self.state_file.clone() else {
            return;
        };
        let table = self.table.clone();
        let limit = persist::state_limit(self.max_document_bytes);
        match tokio::task::spawn_blocking(move || persist::save(&path, &table, limit)).await {
            Ok(Ok(())) => self.state_error = None,
            Ok(Err(e)) => {
                // Not fatal: the in-memory table stays correct; only the restart head start
                // is at risk (docs/profiles.md).
                self.metrics.persist_failures.inc();
                tracing::error!(error = %DisplayChain(&e), "failed to persist profiles");
                self.state_error = Some(DisplayChain(&e).to_string());
            }
            Err(join) => {
                self.metrics.persist_failures.inc();
                tracing::error!(error = %DisplayChain(&join), "persisting profiles panicked");
                self.state_error = Some(join.to_string());
            }
        }
    }

    /// Recomputes every subscriber's view and schedules delivery of those that changed.
    fn publish(&mut self) {
        let now = Instant::now();
        self.subs.retain(|_, s| !s.tx.is_closed());
        for (key, sub) in &mut self.subs {
            let view = self.table.view(key);
            if *sub.tx.borrow() == view {
                sub.pending = None;
            } else if self.max_random_wait.is_zero() {
                sub.tx.send_replace(view);
                sub.pending = None;
            } else {
                let deadline = match &sub.pending {
                    Some((deadline, _)) => *deadline,
                    None => later(now, random_wait(self.max_random_wait)),
                };
                sub.pending = Some((deadline, view));
            }
        }
    }

    fn next_delivery(&self) -> Option<Instant> {
        self.subs
            .values()
            .filter_map(|s| s.pending.as_ref().map(|(d, _)| *d))
            .min()
    }

    fn deliver_due(&mut self) {
        let now = Instant::now();
        for sub in self.subs.values_mut() {
            if sub.pending.as_ref().is_some_and(|(d, _)| *d <= now)
                && let Some((_, view)) = sub.pending.take()
            {
                sub.tx.send_replace(view);
            }
        }
    }
}

/// How far ahead a deadline that does not fit in an `Instant` is put: beyond any process's
/// life, and far below the point where adding to an `Instant` overflows.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `now + d`, clamped to [`FAR_FUTURE`]: the config accepts durations (centuries) whose sum
/// with an `Instant` would overflow, which panics.
fn later(now: Instant, d: Duration) -> Instant {
    now + d.min(FAR_FUTURE)
}

/// A uniform random duration in `[0, max]` (Mesos's full jitter).
fn random_wait(max: Duration) -> Duration {
    JitterRng::new(Jitter::Full).sample(max)
}
