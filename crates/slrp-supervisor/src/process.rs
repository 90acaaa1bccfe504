//! Plugin processes: launching, identifying (pid + start time), stopping, never leaking.
//!
//! # Design
//! Every plugin runs as the leader of its own process group, so a stop reaches whatever it
//! forked (a shell wrapper, Python workers). A process is identified by its pid *and* its
//! start time from `/proc/<pid>/stat`, so a recycled pid is never mistaken for the plugin.
//! [`PluginProcess`] is either our child or a process adopted from a previous slrp run;
//! dropping it SIGKILLs the group unless it was explicitly detached.
//!
//! # Limitations
//! After the group leader exits, members it left behind are killed by group id; if the
//! kernel had already recycled that id for a new group in between (which needs the whole
//! old group to be gone), the kill finds nothing to do rather than a wrong target.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::spec::LaunchCommand;

/// Identity of a process that survives pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    /// The pid (and process group id: plugins lead their own group).
    pub pid: i32,
    /// `starttime` from `/proc/<pid>/stat`, in clock ticks since boot.
    pub start_time: u64,
}

/// Liveness of a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Running, and it is the same process (start time matches).
    Alive,
    /// Gone, a zombie, or the pid now belongs to another process.
    Gone,
}

/// Reads `(state, starttime)` of `pid` from `/proc/<pid>/stat`.
fn stat(pid: i32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the *last* `)`.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields after the name start at field 3 (state); starttime is field 22.
    let start_time = fields.nth(22 - 4)?.parse().ok()?;
    Some((state, start_time))
}

/// Reads start times of processes: the `/proc` boundary of a launch, as a trait so tests
/// can make `/proc` unreadable.
pub trait ProcReader: Send + Sync + std::fmt::Debug {
    /// `starttime` of `pid` from `/proc/<pid>/stat`, in clock ticks since boot.
    ///
    /// # Errors
    /// Whatever kept it from being read or parsed.
    fn start_time(&self, pid: i32) -> io::Result<u64>;
}

/// The real [`ProcReader`]: `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcFs;

impl ProcReader for ProcFs {
    fn start_time(&self, pid: i32) -> io::Result<u64> {
        identify(pid).map(|id| id.start_time)
    }
}

/// Reads of a new child's start time before the launch is given up. A child we have not
/// reaped keeps its `/proc` entry even after it exits, so a failure here is `/proc`
/// itself failing (not mounted, hidepid, fd exhaustion), which may pass.
const IDENTIFY_ATTEMPTS: u32 = 5;
/// Pause between those reads.
const IDENTIFY_RETRY: Duration = Duration::from_millis(20);

/// Why a plugin process could not be launched.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The command could not be started.
    #[error("starting the plugin command")]
    Spawn(#[source] io::Error),
    /// The new process's start time could not be read, so it could not be recorded
    /// unambiguously for adoption; the process was killed.
    #[error(
        "reading the start time of new plugin process {pid} failed {attempts} times; killed it rather than record an ambiguous pid"
    )]
    UnknownStartTime {
        /// The killed process.
        pid: i32,
        /// How many reads were tried.
        attempts: u32,
        /// The last failure.
        #[source]
        source: io::Error,
    },
}

/// The id of the running kernel boot, if readable (records without one are judged by pid
/// and start time only).
pub(crate) fn boot_id() -> Option<String> {
    slrp_types::read_boot_id()
        .ok()
        .map(slrp_types::BootId::into_string)
}

/// The identity of a running process.
pub(crate) fn identify(pid: i32) -> io::Result<ProcessId> {
    let (_, start_time) = stat(pid)?;
    Ok(ProcessId { pid, start_time })
}

pub(crate) fn liveness(id: ProcessId) -> Liveness {
    match stat(id.pid) {
        Ok((state, start)) if start == id.start_time && state != 'Z' && state != 'X' => {
            Liveness::Alive
        }
        Ok(_) | Err(_) => Liveness::Gone,
    }
}

fn signal_group(pid: i32, sig: Signal) {
    // ESRCH (nothing left in the group) is the normal outcome after an exit.
    let _ = killpg(Pid::from_raw(pid), sig);
}

/// How a plugin process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// Our child exited with this status.
    Status(ExitStatus),
    /// An adopted process disappeared (its status went to its real parent).
    Vanished,
    /// The agent's WAIT_CONTAINER answered: the container ended, with this `wait(2)`
    /// status word if the agent knew it.
    Waited {
        /// The status word.
        exit_status: Option<i32>,
    },
    /// The agent does not know the container any more (WAIT_CONTAINER 404).
    Gone,
    /// The agent refused to let slrp watch the container (WAIT_CONTAINER 401/403: the
    /// token no longer allows it); it is treated as ended, and the relaunch that follows
    /// is refused in turn, failing the container for good.
    RefusedWait {
        /// 401 or 403.
        status: u16,
    },
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status(s) => write!(f, "{s}"),
            Self::Vanished => f.write_str("adopted process exited"),
            Self::Waited {
                exit_status: Some(status),
            } => write!(f, "agent container ended with wait status {status}"),
            Self::Waited { exit_status: None } => f.write_str("agent container ended"),
            Self::Gone => f.write_str("the agent does not know the container (404)"),
            Self::RefusedWait { status } => {
                write!(
                    f,
                    "the agent refused to let slrp watch the container ({status})"
                )
            }
        }
    }
}

#[derive(Debug)]
enum Kind {
    Child(Child),
    Adopted { poll: Duration },
}

/// A running plugin process (group leader). Killed with its group on drop unless
/// [`PluginProcess::detach`]ed.
#[derive(Debug)]
pub struct PluginProcess {
    id: ProcessId,
    kind: Kind,
    /// Set once the process is known to have ended (and, for a child, been reaped).
    exited: Option<ExitInfo>,
    detached: bool,
}

impl PluginProcess {
    /// Starts `cmd` in its own process group with `CSI_ENDPOINT` (and the extra `env`) set,
    /// stdout/stderr appended to the given files and the working directory `cwd`, and
    /// identifies it through `proc`.
    ///
    /// # Errors
    /// [`LaunchError::Spawn`] if it cannot be started; [`LaunchError::UnknownStartTime`]
    /// if its start time stays unreadable, in which case it has been killed and reaped: a
    /// record with an unknown start time could neither be adopted nor stopped by the next
    /// slrp, so the process would leak.
    pub(crate) async fn spawn(
        cmd: &LaunchCommand,
        extra_env: &[(String, String)],
        cwd: &Path,
        stdout: File,
        stderr: File,
        proc: &dyn ProcReader,
    ) -> Result<Self, LaunchError> {
        let mut c = if cmd.shell {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(&cmd.value);
            c
        } else {
            let mut c = Command::new(&cmd.value);
            if let Some((argv0, rest)) = cmd.arguments.split_first() {
                c.arg0(argv0).args(rest);
            }
            c
        };
        c.envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0)
            // Our Drop kills the whole group; tokio's kill_on_drop would hit the leader only.
            .kill_on_drop(false);
        let mut child = c.spawn().map_err(LaunchError::Spawn)?;
        let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
            // Not reaped yet, so this cannot happen; if it does, do not leave it running.
            let _ = child.kill().await;
            return Err(LaunchError::Spawn(io::Error::other(
                "spawned child has no pid",
            )));
        };
        let mut attempt = 1;
        let start_time = loop {
            match proc.start_time(pid) {
                Ok(t) => break t,
                Err(source) if attempt >= IDENTIFY_ATTEMPTS => {
                    // Ours and just launched: killing it is safe, and reaping it here
                    // keeps the group id pinned until the signal has been sent.
                    signal_group(pid, Signal::SIGKILL);
                    let _ = child.wait().await;
                    return Err(LaunchError::UnknownStartTime {
                        pid,
                        attempts: attempt,
                        source,
                    });
                }
                Err(e) => {
                    tracing::debug!(pid, attempt, error = %slrp_types::DisplayChain(&e), "start time of new plugin process unreadable; retrying");
                    attempt += 1;
                    tokio::time::sleep(IDENTIFY_RETRY).await;
                }
            }
        };
        Ok(Self {
            id: ProcessId { pid, start_time },
            kind: Kind::Child(child),
            exited: None,
            detached: false,
        })
    }

    /// Takes over a process left running by a previous slrp. Its exit is noticed by
    /// polling `/proc` every `poll`, because it is not our child.
    pub(crate) fn adopt(id: ProcessId, poll: Duration) -> Self {
        Self {
            id,
            kind: Kind::Adopted { poll },
            exited: None,
            detached: false,
        }
    }

    /// Its identity.
    pub fn id(&self) -> ProcessId {
        self.id
    }

    /// Whether it was adopted rather than launched by this supervisor.
    pub fn is_adopted(&self) -> bool {
        matches!(self.kind, Kind::Adopted { .. })
    }

    /// Waits until the process ends. Afterwards, leftovers of its group are killed.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    pub async fn wait(&mut self) -> ExitInfo {
        if let Some(e) = self.exited {
            return e;
        }
        let info = match &mut self.kind {
            Kind::Child(child) => match child.wait().await {
                Ok(status) => ExitInfo::Status(status),
                // wait() fails only if the child was already reaped elsewhere.
                Err(_) => ExitInfo::Vanished,
            },
            Kind::Adopted { poll } => {
                while liveness(self.id) == Liveness::Alive {
                    tokio::time::sleep(*poll).await;
                }
                ExitInfo::Vanished
            }
        };
        self.exited = Some(info);
        signal_group(self.id.pid, Signal::SIGKILL);
        info
    }

    /// Stops the process: SIGTERM to its group, then SIGKILL after `grace`, then waits.
    /// Returns how it ended and whether SIGKILL was needed.
    pub async fn stop(&mut self, grace: Duration) -> (ExitInfo, bool) {
        if let Some(e) = self.exited {
            return (e, false);
        }
        signal_group(self.id.pid, Signal::SIGTERM);
        if let Ok(info) = tokio::time::timeout(grace, self.wait()).await {
            return (info, false);
        }
        signal_group(self.id.pid, Signal::SIGKILL);
        (self.wait().await, true)
    }

    /// Leaves the process running and forgets it (for a hand-over to the next slrp, which
    /// adopts it through its pid record). A child is then reaped by tokio's orphan handling.
    pub fn detach(mut self) {
        self.detached = true;
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if self.detached || self.exited.is_some() {
            return;
        }
        // The no-leak guarantee: whatever path dropped us, the plugin goes with us.
        let signal = match self.kind {
            // Our child is not reaped until `wait` returns, so even as a zombie it pins its
            // pid and with it the group id: signalling is safe, and needed, because members
            // the leader left behind (a crashed wrapper's workers) are still running.
            Kind::Child(_) => true,
            // Not our child: only signal while the pid still names the same process.
            Kind::Adopted { .. } => liveness(self.id) == Liveness::Alive,
        };
        if signal {
            signal_group(self.id.pid, Signal::SIGKILL);
        }
    }
}

/// Stops a process that is not ours (a leftover from a previous slrp run) by pid: SIGTERM
/// to its group, SIGKILL after `grace`, polling `/proc` every `poll`.
pub(crate) async fn stop_foreign(id: ProcessId, grace: Duration, poll: Duration) -> bool {
    let mut p = PluginProcess::adopt(id, poll);
    let (_, killed) = p.stop(grace).await;
    killed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_counts_from_the_last_parenthesis() {
        let line = "1234 (weird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    /// Kills a stray test process if an assertion fails before the code under test did.
    struct KillOnDrop(i32);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(Pid::from_raw(self.0), Signal::SIGKILL);
        }
    }

    async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn shell(script: String) -> LaunchCommand {
        LaunchCommand {
            shell: true,
            value: script,
            arguments: Vec::new(),
            env: Vec::new(),
        }
    }

    async fn spawn_in(dir: &Path, script: String) -> PluginProcess {
        let log = || File::create(dir.join("log")).unwrap();
        PluginProcess::spawn(&shell(script), &[], dir, log(), log(), &ProcFs)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn drop_kills_the_group_when_the_leader_already_exited_unreaped() {
        let dir = tempfile::tempdir().unwrap();
        let member_pid = dir.path().join("member.pid");
        // The leader leaves a member of its group behind and exits; nobody waits for it,
        // so it stays a zombie (as when a worker is dropped before it noticed the exit).
        let p = spawn_in(
            dir.path(),
            format!("sleep 1000 & echo $! > {}; exit 0", member_pid.display()),
        )
        .await;
        let leader = p.id().pid;
        eventually("leader exit", || matches!(stat(leader), Ok(('Z', _)))).await;
        let member: i32 = std::fs::read_to_string(&member_pid)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let _guard = KillOnDrop(member);
        let member = identify(member).unwrap();
        assert_eq!(liveness(member), Liveness::Alive);
        drop(p);
        eventually("group member killed", || liveness(member) == Liveness::Gone).await;
    }

    /// A `/proc` that fails the first `failures` reads, then answers truthfully.
    #[derive(Debug)]
    struct FlakyProc {
        failures: std::sync::Mutex<u32>,
        asked: std::sync::Mutex<Vec<i32>>,
    }

    impl FlakyProc {
        fn new(failures: u32) -> Self {
            Self {
                failures: std::sync::Mutex::new(failures),
                asked: std::sync::Mutex::new(Vec::new()),
            }
        }
    }

    impl ProcReader for FlakyProc {
        fn start_time(&self, pid: i32) -> io::Result<u64> {
            self.asked.lock().unwrap().push(pid);
            let mut left = self.failures.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                return Err(io::Error::other("simulated /proc failure"));
            }
            ProcFs.start_time(pid)
        }
    }

    async fn spawn_with(dir: &Path, proc: &FlakyProc) -> Result<PluginProcess, LaunchError> {
        let log = || File::create(dir.join("log")).unwrap();
        PluginProcess::spawn(
            &shell("exec sleep 1000".into()),
            &[],
            dir,
            log(),
            log(),
            proc,
        )
        .await
    }

    #[tokio::test]
    async fn an_unreadable_start_time_kills_the_new_process_instead_of_recording_zero() {
        let dir = tempfile::tempdir().unwrap();
        let proc = FlakyProc::new(u32::MAX);
        let err = spawn_with(dir.path(), &proc).await.unwrap_err();
        let LaunchError::UnknownStartTime { pid, attempts, .. } = err else {
            panic!("unexpected {err:?}")
        };
        let _guard = KillOnDrop(pid);
        assert_eq!(attempts, IDENTIFY_ATTEMPTS);
        assert_eq!(*proc.asked.lock().unwrap(), vec![pid; 5]);
        // Killed and reaped before the error was returned: no /proc entry at all.
        assert!(
            stat(pid).is_err(),
            "the unidentified process is still there"
        );
    }

    #[tokio::test]
    async fn a_briefly_unreadable_start_time_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        let proc = FlakyProc::new(IDENTIFY_ATTEMPTS - 1);
        let mut p = spawn_with(dir.path(), &proc).await.unwrap();
        let real = identify(p.id().pid).unwrap();
        assert_eq!(p.id(), real);
        assert_eq!(proc.asked.lock().unwrap().len(), 5);
        p.stop(Duration::from_secs(5)).await;
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_gone() {
        let me = identify(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert_eq!(liveness(me), Liveness::Alive);
        let impostor = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(liveness(impostor), Liveness::Gone);
    }
}
