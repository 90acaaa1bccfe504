//! Standalone containers of the operator API (LAUNCH/WAIT/KILL/GET_CONTAINERS), run as
//! local processes with the semantics of a Mesos agent's containerizer and POSIX launcher.
//!
//! # Design
//! One owner task holds every container (the manager's worker style): the HTTP side and
//! the handle send it [`Request`]s over a bounded channel. Each container has a watcher
//! task that waits for its process (a child, or a process adopted after a restart, polled
//! through `/proc`), then destroys the rest of its process group and reports the exit; the
//! owner answers the WAITs and forgets the container, so a later WAIT is `404` as on an
//! agent. With a `containers_dir` every container is recorded there and survives the
//! manager (an agent going down leaves its containers running); without one, containers
//! are killed when the manager stops.
//!
//! # Differences from a Mesos agent
//! No isolation: no cgroups, namespaces, filesystem or resource limits; volumes are
//! accepted only where the container path is the host path (what the Mesos SLRP sends).

pub(crate) mod checkpoint;
mod process;
pub(crate) mod validate;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use slrp_proto::mesos::v1::agent::call::LaunchContainer;
use slrp_proto::mesos::v1::{container_info, volume};
use tokio::process::Child;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::ContainerError;
use crate::worker::ManagerMessage;
use process::ProcessId;

/// Requests queued towards the owner before senders wait.
const QUEUE: usize = 256;
/// How often an adopted container's process is looked up in `/proc`.
const ADOPTED_POLL: Duration = Duration::from_millis(50);
/// How long the launcher's destroy waits for the rest of a group to disappear after its
/// SIGKILL (a member stuck in uninterruptible sleep must not block the termination).
const DESTROY_WAIT: Duration = Duration::from_secs(2);
/// Pause between looks at a group being destroyed.
const DESTROY_POLL: Duration = Duration::from_millis(10);

/// One standalone container as the agent sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    /// The container ID (top-level: no parent).
    pub id: String,
    /// The container's process while it runs (GET_CONTAINERS' `executor_pid`).
    pub pid: Option<i32>,
    /// Where it is in its life.
    pub state: ContainerState,
    /// What it was launched with.
    pub launch: LaunchContainer,
    /// Callers waiting for its termination: WAIT_CONTAINER calls, and a running
    /// [`crate::ManagerHandle::destroy_containers`].
    pub waiters: usize,
    /// WAIT_CONTAINER calls received for it since it was launched or adopted (a client
    /// keeping one long poll sends one per container life).
    pub waits: u64,
}

/// The life of a standalone container; an exited one is forgotten at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    /// Its process runs.
    Running,
    /// Its process exited and the rest of its group is being killed; listed without a pid.
    Destroying,
}

/// How a container ended, as WAIT_CONTAINER reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Termination {
    /// The wait(2) status word; `None` for a container adopted after a manager restart,
    /// whose exit status nobody can read (as for a Mesos agent that recovered it).
    pub(crate) status: Option<i32>,
}

/// The answer to a LAUNCH_CONTAINER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LaunchOutcome {
    /// `200`.
    Launched,
    /// `202`: the ID is in use.
    AlreadyLaunched,
    /// `400` "The provided ContainerInfo is not supported".
    NotSupported,
    /// `400` with the failure.
    Failed(String),
    /// `500` "Failed to create sandbox: …".
    Sandbox(String),
}

/// The answer to a KILL_CONTAINER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KillOutcome {
    /// `200`.
    Signalled,
    /// `404`.
    NotFound,
    /// `500` with the failure.
    Failed(String),
}

pub(crate) enum Request {
    Launch {
        launch: Box<LaunchContainer>,
        reply: oneshot::Sender<LaunchOutcome>,
    },
    Wait {
        id: String,
        reply: oneshot::Sender<Option<oneshot::Receiver<Termination>>>,
    },
    Kill {
        id: String,
        signal: i32,
        reply: oneshot::Sender<KillOutcome>,
    },
    Known {
        id: String,
        reply: oneshot::Sender<bool>,
    },
    List {
        reply: oneshot::Sender<Vec<ContainerView>>,
    },
    DestroyAll {
        reply: oneshot::Sender<Vec<oneshot::Receiver<Termination>>>,
    },
    Destroying {
        id: String,
        generation: u64,
    },
    Exited {
        id: String,
        generation: u64,
        status: Option<i32>,
    },
}

/// The HTTP side's and the handle's way to the owner. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Containers {
    requests: mpsc::Sender<Request>,
}

impl Containers {
    async fn ask<T>(&self, request: impl FnOnce(oneshot::Sender<T>) -> Request) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(request(reply)).await.ok()?;
        answer.await.ok()
    }

    /// `None` once the manager stops.
    pub(crate) async fn launch(&self, launch: LaunchContainer) -> Option<LaunchOutcome> {
        let launch = Box::new(launch);
        self.ask(|reply| Request::Launch { launch, reply }).await
    }

    /// Waits for the container's termination: `Some(None)` if it is unknown, `None` if
    /// the manager stopped first.
    pub(crate) async fn wait(&self, id: &str) -> Option<Option<Termination>> {
        let id = id.to_owned();
        match self.ask(|reply| Request::Wait { id, reply }).await? {
            Some(termination) => termination.await.ok().map(Some),
            None => Some(None),
        }
    }

    pub(crate) async fn kill(&self, id: &str, signal: i32) -> Option<KillOutcome> {
        let id = id.to_owned();
        self.ask(|reply| Request::Kill { id, signal, reply }).await
    }

    pub(crate) async fn known(&self, id: &str) -> Option<bool> {
        let id = id.to_owned();
        self.ask(|reply| Request::Known { id, reply }).await
    }

    /// Every container, ordered by ID (empty once the manager stopped).
    pub(crate) async fn list(&self) -> Vec<ContainerView> {
        self.ask(|reply| Request::List { reply })
            .await
            .unwrap_or_default()
    }

    /// SIGKILLs every container's group and waits until each termination is handled.
    pub(crate) async fn destroy_all(&self) {
        let Some(terminations) = self.ask(|reply| Request::DestroyAll { reply }).await else {
            return;
        };
        for termination in terminations {
            let _ = termination.await;
        }
    }
}

/// Where sandboxes go: the configured directory, or a temporary one removed when the last
/// task using it ends.
#[derive(Debug)]
enum Root {
    Configured(PathBuf),
    Temporary(tempfile::TempDir),
}

impl Root {
    fn path(&self) -> &Path {
        match self {
            Self::Configured(path) => path,
            Self::Temporary(dir) => dir.path(),
        }
    }

    /// Only containers under a configured directory are recorded and survive.
    fn survives(&self) -> bool {
        matches!(self, Self::Configured(_))
    }
}

struct Entry {
    launch: LaunchContainer,
    pid: i32,
    state: ContainerState,
    generation: u64,
    waiters: Vec<oneshot::Sender<Termination>>,
    waits: u64,
    record: Option<PathBuf>,
}

impl Entry {
    /// A receiver of the termination. Waiters whose callers went away (a WAIT whose
    /// connection closed) are dropped first, so a client that re-asks cannot grow the list.
    fn add_waiter(&mut self) -> oneshot::Receiver<Termination> {
        self.waiters.retain(|w| !w.is_closed());
        let (tx, rx) = oneshot::channel();
        self.waiters.push(tx);
        rx
    }
}

struct Owner {
    requests: mpsc::Receiver<Request>,
    self_tx: mpsc::Sender<Request>,
    root: Arc<Root>,
    boot_id: Option<String>,
    entries: BTreeMap<String, Entry>,
    next_generation: u64,
    messages: broadcast::Sender<ManagerMessage>,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

/// Recovers the recorded containers (alive → adopted, dead → forgotten) and starts the
/// owner task.
///
/// # Errors
/// [`ContainerError`]: a record that cannot be read, or a sandbox root that cannot be made.
pub(crate) async fn start(
    containers_dir: Option<PathBuf>,
    messages: broadcast::Sender<ManagerMessage>,
    tasks: TaskTracker,
    cancel: CancellationToken,
) -> Result<Containers, ContainerError> {
    let (root, records) = tokio::task::spawn_blocking(move || {
        let Some(dir) = containers_dir else {
            let temp = tempfile::Builder::new()
                .prefix("slrp-manager-containers-")
                .tempdir()
                .map_err(|source| ContainerError::SandboxRoot {
                    path: std::env::temp_dir(),
                    source,
                })?;
            return Ok((Root::Temporary(temp), Vec::new()));
        };
        let records = checkpoint::read_all(&dir)?;
        Ok((Root::Configured(dir), records))
    })
    .await
    .map_err(ContainerError::Task)??;
    let (self_tx, requests) = mpsc::channel(QUEUE);
    let mut owner = Owner {
        requests,
        self_tx: self_tx.clone(),
        root: Arc::new(root),
        boot_id: boot_id(),
        entries: BTreeMap::new(),
        next_generation: 0,
        messages,
        tasks: tasks.clone(),
        cancel: cancel.clone(),
    };
    for record in records {
        owner.recover(record);
    }
    tasks.spawn(owner.run());
    Ok(Containers { requests: self_tx })
}

/// SIGKILLs the process group of every container recorded under `containers_dir` that
/// still runs, without a manager: the guard of a test whose manager may have panicked or
/// stopped with its containers left running (they survive it on purpose).
pub fn kill_recorded_containers(containers_dir: &Path) {
    checkpoint::kill_recorded(containers_dir);
}

fn boot_id() -> Option<String> {
    slrp_types::read_boot_id()
        .ok()
        .map(slrp_types::BootId::into_string)
}

impl Owner {
    async fn run(mut self) {
        loop {
            let request = tokio::select! {
                () = self.cancel.cancelled() => break,
                request = self.requests.recv() => request,
            };
            let Some(request) = request else { break };
            self.handle(request);
        }
        // Waiters of containers that outlive the manager see it stop (their HTTP
        // connections close with the server).
        tracing::debug!(
            containers = self.entries.len(),
            survive = self.root.survives(),
            "standalone containers owner stopped"
        );
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::Launch { launch, reply } => {
                let _ = reply.send(self.launch(*launch));
            }
            Request::Wait { id, reply } => {
                let waiter = self.entries.get_mut(&id).map(|entry| {
                    entry.waits = entry.waits.saturating_add(1);
                    entry.add_waiter()
                });
                let _ = reply.send(waiter);
            }
            Request::Kill { id, signal, reply } => {
                let _ = reply.send(self.kill(&id, signal));
            }
            Request::Known { id, reply } => {
                let _ = reply.send(self.entries.contains_key(&id));
            }
            Request::List { reply } => {
                let _ = reply.send(self.list());
            }
            Request::DestroyAll { reply } => {
                let mut terminations = Vec::new();
                for (id, entry) in &mut self.entries {
                    tracing::info!(container_id = %id, pid = entry.pid, "destroying standalone container");
                    process::kill_group(entry.pid);
                    terminations.push(entry.add_waiter());
                }
                let _ = reply.send(terminations);
            }
            Request::Destroying { id, generation } => {
                if let Some(entry) = self.entries.get_mut(&id)
                    && entry.generation == generation
                {
                    entry.state = ContainerState::Destroying;
                }
            }
            Request::Exited {
                id,
                generation,
                status,
            } => self.exited(id, generation, status),
        }
    }

    fn list(&self) -> Vec<ContainerView> {
        self.entries
            .iter()
            .map(|(id, entry)| ContainerView {
                id: id.clone(),
                pid: (entry.state == ContainerState::Running).then_some(entry.pid),
                state: entry.state,
                launch: entry.launch.clone(),
                waiters: entry.waiters.iter().filter(|w| !w.is_closed()).count(),
                waits: entry.waits,
            })
            .collect()
    }

    fn kill(&self, id: &str, signal: i32) -> KillOutcome {
        let Some(entry) = self.entries.get(id) else {
            return KillOutcome::NotFound;
        };
        if entry.state == ContainerState::Destroying {
            // Its process is gone and the rest of the group is being killed anyway.
            return KillOutcome::Signalled;
        }
        tracing::info!(container_id = %id, pid = entry.pid, signal, "signalling standalone container");
        match process::signal(entry.pid, signal) {
            Ok(()) => KillOutcome::Signalled,
            Err(error) => KillOutcome::Failed(format!(
                "Unable to send signal to container: {}",
                error.desc()
            )),
        }
    }

    fn launch(&mut self, launch: LaunchContainer) -> LaunchOutcome {
        let id = &launch.container_id;
        if let Some(parent) = &id.parent {
            // The agent's containerizer fails a nested launch whose parent is unknown;
            // the embedded manager runs no nested containers at all.
            return LaunchOutcome::Failed(format!(
                "Parent container {} does not exist (the embedded manager runs no nested containers)",
                validate::display_id(parent)
            ));
        }
        let id = id.value.clone();
        let sandbox = self.root.path().join(&id);
        if let Err(error) = std::fs::create_dir_all(&sandbox) {
            return LaunchOutcome::Sandbox(format!("Failed to create sandbox: {error}"));
        }
        if self.entries.contains_key(&id) {
            return LaunchOutcome::AlreadyLaunched;
        }
        if let Some(refusal) = unsupported(&launch) {
            return refusal;
        }
        let command = launch.command.clone().unwrap_or_default();
        if command.value.is_none() {
            return LaunchOutcome::Failed(format!(
                "Failed to launch container '{id}': the command has no 'value' (a shell command or an executable path; the embedded manager runs no images)"
            ));
        }
        let (child, pid) = match process::spawn(&command, &sandbox) {
            Ok(spawned) => spawned,
            Err(error) => {
                return LaunchOutcome::Failed(format!(
                    "Failed to launch container '{id}': {error}"
                ));
            }
        };
        let record = if self.root.survives() {
            match checkpoint::write(self.root.path(), &id, pid, self.boot_id.clone(), &launch) {
                Ok(()) => Some(checkpoint::path(self.root.path(), &id)),
                Err(error) => {
                    process::kill_group(pid.pid);
                    let error = slrp_types::DisplayChain(&error).to_string();
                    return LaunchOutcome::Failed(format!(
                        "Failed to launch container '{id}': {error}"
                    ));
                }
            }
        } else {
            None
        };
        tracing::info!(container_id = %id, pid = pid.pid, sandbox = %sandbox.display(), "launched standalone container");
        let generation = self.insert(id.clone(), launch, pid.pid, record);
        let watcher = Watcher {
            id: id.clone(),
            generation,
            pgid: pid.pid,
            requests: self.self_tx.clone(),
            root: Arc::clone(&self.root),
            done: false,
        };
        let cancel = self.cancel.clone();
        self.tasks.spawn(watcher.child(child, cancel));
        let _ = self.messages.send(ManagerMessage::ContainerLaunched { id });
        LaunchOutcome::Launched
    }

    fn insert(
        &mut self,
        id: String,
        launch: LaunchContainer,
        pid: i32,
        record: Option<PathBuf>,
    ) -> u64 {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.entries.insert(
            id,
            Entry {
                launch,
                pid,
                state: ContainerState::Running,
                generation,
                waiters: Vec::new(),
                waits: 0,
                record,
            },
        );
        generation
    }

    /// A container recorded by an earlier manager: adopted if its process still runs on
    /// this boot, else forgotten (the agent destroys such a container during recovery,
    /// so a WAIT for it is `404`).
    fn recover(&mut self, record: checkpoint::Record) {
        let id = record.launch.container_id.value.clone();
        let same_boot = match (&record.boot_id, &self.boot_id) {
            (Some(recorded), Some(current)) => recorded == current,
            _ => true,
        };
        if !same_boot || !process::is_alive(record.process) {
            // The agent destroys such a container during its recovery: what is left of
            // its group dies. A group id stays allocated while any member lives, so
            // members found with it on this boot, with no process of that pid at all, are
            // the container's (a recycled pid leading a new group would exist itself).
            // The dead container itself may linger as a zombie nobody reaped yet: only
            // another process under its pid means a recycled pid.
            let orphans = same_boot && !process::recycled(record.process);
            if orphans {
                process::kill_group(record.process.pid);
            }
            tracing::info!(container_id = %id, pid = record.process.pid, orphans_killed = orphans, "a recorded standalone container is gone: forgotten");
            checkpoint::remove(&record.path);
            return;
        }
        tracing::info!(container_id = %id, pid = record.process.pid, "adopted a running standalone container");
        let process = record.process;
        let generation = self.insert(id.clone(), record.launch, process.pid, Some(record.path));
        let watcher = Watcher {
            id,
            generation,
            pgid: process.pid,
            requests: self.self_tx.clone(),
            root: Arc::clone(&self.root),
            done: false,
        };
        self.tasks
            .spawn(watcher.adopted(process, self.cancel.clone()));
    }

    fn exited(&mut self, id: String, generation: u64, status: Option<i32>) {
        let Some(entry) = self.entries.get(&id) else {
            return;
        };
        if entry.generation != generation {
            return;
        }
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        if let Some(record) = &entry.record {
            checkpoint::remove(record);
        }
        tracing::info!(container_id = %id, ?status, "standalone container terminated");
        for waiter in entry.waiters {
            let _ = waiter.send(Termination { status });
        }
        let _ = self
            .messages
            .send(ManagerMessage::ContainerTerminated { id, status });
    }
}

/// What the Mesos containerizer (`--containerizers=mesos`, no isolation) refuses: another
/// container type, and volumes it would have to mount.
fn unsupported(launch: &LaunchContainer) -> Option<LaunchOutcome> {
    let info = launch.container.as_ref()?;
    if container_info::Type::try_from(info.r#type) != Ok(container_info::Type::Mesos) {
        return Some(LaunchOutcome::NotSupported);
    }
    if info
        .mesos
        .as_ref()
        .is_some_and(|mesos| mesos.image.is_some())
    {
        return Some(LaunchOutcome::Failed(
            "Failed to launch container: container images need filesystem isolation, which the embedded manager does not have"
                .to_owned(),
        ));
    }
    for v in &info.volumes {
        let host = v.host_path.clone().or_else(|| {
            v.source
                .as_ref()
                .filter(|s| s.r#type() == volume::source::Type::HostPath)
                .and_then(|s| s.host_path.as_ref())
                .map(|h| h.path.clone())
        });
        if host.as_deref() != Some(v.container_path.as_str()) {
            return Some(LaunchOutcome::Failed(format!(
                "Failed to launch container: volume '{}' is not its host path: the embedded manager has no filesystem isolation to mount it",
                v.container_path
            )));
        }
    }
    None
}

/// Waits for one container's process and reports its end to the owner.
struct Watcher {
    id: String,
    generation: u64,
    pgid: i32,
    requests: mpsc::Sender<Request>,
    /// Keeps a temporary sandbox root alive while the container runs.
    root: Arc<Root>,
    /// The group has been destroyed (or is left running on purpose).
    done: bool,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Dropped before its container ended without a shutdown (the runtime went away):
        // a container that does not survive the manager must not outlive it either.
        if !self.done && !self.root.survives() {
            process::kill_group(self.pgid);
        }
    }
}

impl Watcher {
    async fn child(mut self, mut child: Child, cancel: CancellationToken) {
        let status = tokio::select! {
            status = child.wait() => status,
            () = cancel.cancelled() => {
                if self.root.survives() {
                    // Left running, as an agent going down leaves its containers; tokio
                    // reaps the dropped child if it exits while this process lives.
                    return;
                }
                process::kill_group(self.pgid);
                self.done = true;
                let _ = child.wait().await;
                return;
            }
        };
        let status = match status {
            Ok(status) => Some(status.into_raw()),
            Err(error) => {
                tracing::warn!(container_id = %self.id, error = %error, "waiting for a standalone container failed");
                None
            }
        };
        self.destroy(status).await;
    }

    async fn adopted(self, process: ProcessId, cancel: CancellationToken) {
        let mut poll = tokio::time::interval(ADOPTED_POLL);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = poll.tick() => {}
            }
            if !process::is_alive(process) {
                break;
            }
        }
        self.destroy(None).await;
    }

    /// The POSIX launcher's destroy: SIGKILL what is left of the group, wait (bounded)
    /// until it is gone, then report the termination.
    async fn destroy(mut self, status: Option<i32>) {
        let _ = self
            .requests
            .send(Request::Destroying {
                id: self.id.clone(),
                generation: self.generation,
            })
            .await;
        process::kill_group(self.pgid);
        self.done = true;
        let deadline = tokio::time::Instant::now() + DESTROY_WAIT;
        while process::group_alive(self.pgid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(DESTROY_POLL).await;
        }
        let _ = self
            .requests
            .send(Request::Exited {
                id: self.id.clone(),
                generation: self.generation,
                status,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        let (self_tx, requests) = mpsc::channel(1);
        let (messages, _) = broadcast::channel(4);
        let temp = tempfile::tempdir().expect("tempdir");
        Owner {
            requests,
            self_tx,
            root: Arc::new(Root::Temporary(temp)),
            boot_id: None,
            entries: BTreeMap::new(),
            next_generation: 0,
            messages,
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    /// A WAIT whose caller went away (its connection closed) leaves no waiter behind: a
    /// client that asks again keeps one, and every call is counted.
    #[tokio::test]
    async fn waiters_of_gone_callers_are_dropped() {
        let mut owner = owner();
        owner.insert("c".to_owned(), LaunchContainer::default(), 42, None);
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            owner.handle(Request::Wait {
                id: "c".to_owned(),
                reply,
            });
            // The caller's termination receiver, dropped as a closed connection drops it.
            drop(answer.await.unwrap().unwrap());
        }
        let entry = &owner.entries["c"];
        assert_eq!(entry.waiters.len(), 1, "only the last one may be open");
        assert_eq!(owner.list()[0].waits, 3);
    }

    /// A container being destroyed (its process exited, the rest of its group is being
    /// killed) is listed without a pid, as GET_CONTAINERS omits its `executor_pid`; a
    /// report from an earlier container of the same ID changes nothing.
    #[test]
    fn a_destroying_container_is_listed_without_a_pid() {
        let mut owner = owner();
        let generation = owner.insert("c".to_owned(), LaunchContainer::default(), 42, None);
        assert_eq!(owner.list()[0].pid, Some(42));
        owner.handle(Request::Destroying {
            id: "c".to_owned(),
            generation: generation + 1,
        });
        assert_eq!(
            owner.list()[0].state,
            ContainerState::Running,
            "stale report"
        );
        owner.handle(Request::Destroying {
            id: "c".to_owned(),
            generation,
        });
        let listed = owner.list();
        assert_eq!(
            (listed[0].state, listed[0].pid),
            (ContainerState::Destroying, None)
        );
        owner.handle(Request::Exited {
            id: "c".to_owned(),
            generation,
            status: Some(0),
        });
        assert!(owner.list().is_empty());
    }
}
