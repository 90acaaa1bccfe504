//! Running external tools (`losetup`, `blkid`, `mkfs.*`, `mount`, `resize2fs`,
//! `xfs_growfs`) with a bound on their run time.
//!
//! A hung tool (a stuck device, a tool waiting on a lock) would otherwise hold the volume's
//! lock forever. Every tool therefore runs in its own process group under a timeout; when
//! the timeout fires, the whole group gets SIGKILL, so helpers the tool started die with
//! it, and the call fails with [`HostError::Timeout`] carrying the tail of the tool's
//! standard error.
//!
//! Process handling, in order:
//! 1. the tool is resolved to an absolute path in the configured directories;
//! 2. it starts as the leader of a new process group, stdin from `/dev/null`, stdout and
//!    stderr piped (each drained by its own thread, so a chatty tool never blocks on a full
//!    pipe; stdout is bounded, stderr keeps only its tail);
//! 3. a waiter thread observes the leader's exit *without reaping it* (`waitid` with
//!    `WNOWAIT`): while the leader is an unreaped zombie its pid, which is also the group
//!    id, cannot be reused, so the `killpg` that follows can never hit an unrelated group;
//! 4. after the leader exits, or when the timeout fires, the group is killed (after a normal
//!    exit this only removes stragglers that would otherwise hold the pipes open), then the
//!    leader is reaped;
//! 5. a process that survives SIGKILL (uninterruptible sleep on a dead device) is left to a
//!    detached reaper thread after [`KILL_GRACE`], and the call still returns at once: the
//!    request is not held hostage by the kernel.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

use crate::host::{HostError, ToolTimeout};

/// Default bound on one tool run. mkfs of a large sparse image (lazy inode tables, no
/// discard) and online growth take seconds; two minutes leaves room for slow disks while
/// still unblocking a hung volume.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a killed tool may take to die before it is left to a background reaper.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// Largest stdout accepted from a tool (our tools print a line or two).
const MAX_STDOUT: usize = 1 << 20;
/// Bytes of stderr kept while reading; the error message keeps the last [`STDERR_TAIL`]
/// characters of them.
const STDERR_KEEP: usize = 16 << 10;
/// Characters of stderr quoted in errors.
const STDERR_TAIL: usize = 1000;
/// Searched after `PATH`: tools live in sbin, which a service's `PATH` often lacks.
const SYSTEM_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Where tools are looked up and how long each may run.
#[derive(Debug, Clone)]
pub struct ToolRunner {
    dirs: Vec<PathBuf>,
    timeout: Duration,
}

impl Default for ToolRunner {
    fn default() -> Self {
        Self::from_env(DEFAULT_TOOL_TIMEOUT)
    }
}

impl ToolRunner {
    /// Looks tools up in `PATH`, then in the system sbin/bin directories.
    #[must_use]
    pub fn from_env(timeout: Duration) -> Self {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs = std::env::split_paths(&path)
            .filter(|d| d.is_absolute())
            .chain(SYSTEM_DIRS.map(PathBuf::from))
            .collect();
        Self { dirs, timeout }
    }

    /// Looks tools up only in `dirs` (tests put fakes there).
    #[must_use]
    pub fn with_dirs(dirs: Vec<PathBuf>, timeout: Duration) -> Self {
        Self { dirs, timeout }
    }

    /// The bound on one tool run.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The absolute path of `program`, if one of the directories holds an executable file
    /// of that name.
    #[must_use]
    pub fn find(&self, program: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        self.dirs.iter().map(|d| d.join(program)).find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    }

    /// Runs `program` with `args` and `LC_ALL=C`, and returns its stdout.
    ///
    /// # Errors
    /// [`HostError::Spawn`] (not found, not startable), [`HostError::Command`] (non-zero
    /// exit), [`HostError::Timeout`] (killed after the timeout), [`HostError::Output`]
    /// (stdout larger than 1 MiB).
    pub fn run<I, S>(&self, program: &str, args: I) -> Result<String, HostError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_redacted(program, args, &[])
    }

    /// [`ToolRunner::run`], with the arguments at the indices in `redacted` shown as
    /// `<redacted>` in every log line and error (they may carry secrets, e.g. mount options).
    ///
    /// # Errors
    /// As [`ToolRunner::run`].
    pub fn run_redacted<I, S>(
        &self,
        program: &str,
        args: I,
        redacted: &[usize],
    ) -> Result<String, HostError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let command = std::iter::once(program.to_owned())
            .chain(args.iter().enumerate().map(|(i, a)| {
                if redacted.contains(&i) {
                    "<redacted>".to_owned()
                } else {
                    a.to_string_lossy().into_owned()
                }
            }))
            .collect::<Vec<_>>()
            .join(" ");
        let spawn_err = |source| HostError::Spawn {
            program: program.to_owned(),
            source,
        };
        let path = self.find(program).ok_or_else(|| {
            spawn_err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("not found in {}", self.dirs_display()),
            ))
        })?;
        tracing::debug!(%command, timeout = ?self.timeout, "running");
        let mut cmd = Command::new(&path);
        cmd.args(&args)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(spawn_err)?;
        match Running::start(&mut child) {
            Ok(running) => {
                let res = running.finish(child, command.clone(), self.timeout);
                // Tool outputs name devices and paths, never secrets (mount options are
                // redacted in `command`, and mount prints nothing).
                match &res {
                    Ok(out) => tracing::debug!(%command, output = %out.trim(), "ran"),
                    Err(e) => {
                        tracing::debug!(%command, error = %slrp_types::DisplayChain(e), "failed")
                    }
                }
                res
            }
            Err(e) => {
                // Could not watch it, so do not let it run unwatched.
                if let Ok(raw) = i32::try_from(child.id()) {
                    kill_group(Pid::from_raw(raw));
                }
                let _ = child.wait();
                Err(spawn_err(e))
            }
        }
    }

    fn dirs_display(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// The threads watching one started tool.
struct Running {
    pid: Pid,
    exited: mpsc::Receiver<nix::Result<()>>,
    stdout: mpsc::Receiver<io::Result<(Vec<u8>, bool)>>,
    stderr: mpsc::Receiver<Vec<u8>>,
}

impl Running {
    fn start(child: &mut Child) -> io::Result<Self> {
        let raw = i32::try_from(child.id()).map_err(io::Error::other)?;
        let pid = Pid::from_raw(raw);
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            // Both were configured as pipes; std always creates them.
            return Err(io::Error::other("tool pipes were not created"));
        };
        let (exit_tx, exited) = mpsc::channel();
        thread::Builder::new()
            .name("tool-wait".into())
            .spawn(move || {
                let r = loop {
                    match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                        Err(nix::errno::Errno::EINTR) => {}
                        other => break other.map(drop),
                    }
                };
                let _ = exit_tx.send(r);
            })?;
        let (out_tx, stdout) = mpsc::channel();
        thread::Builder::new()
            .name("tool-stdout".into())
            .spawn(move || {
                let _ = out_tx.send(read_bounded(out));
            })?;
        let (err_tx, stderr) = mpsc::channel();
        thread::Builder::new()
            .name("tool-stderr".into())
            .spawn(move || {
                let _ = err_tx.send(read_tail(err));
            })?;
        Ok(Self {
            pid,
            exited,
            stdout,
            stderr,
        })
    }

    fn finish(
        self,
        mut child: Child,
        command: String,
        timeout: Duration,
    ) -> Result<String, HostError> {
        let exited = match self.exited.recv_timeout(timeout) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => Some(Err(nix::errno::Errno::ECHILD)),
        };
        // The leader is alive or an unreaped zombie here, so the group id is still ours.
        kill_group(self.pid);
        if exited.is_none() {
            tracing::warn!(%command, ?timeout, pid = self.pid.as_raw(), "tool timed out; killed its process group");
            if self.exited.recv_timeout(KILL_GRACE).is_err() {
                tracing::error!(%command, pid = self.pid.as_raw(),
                    "tool did not die within {KILL_GRACE:?} of SIGKILL (uninterruptible I/O?); reaping it in the background");
                let _ = thread::Builder::new()
                    .name("tool-reap".into())
                    .spawn(move || drop(child.wait()));
                return Err(HostError::Timeout(Box::new(ToolTimeout {
                    command,
                    after: timeout,
                    stderr: String::new(),
                })));
            }
        }
        let status = child.wait();
        // Every member of the group is dead, so the pipes are closed unless a process that
        // left the group holds them; do not wait for such a one for long.
        let stderr = self
            .stderr
            .recv_timeout(KILL_GRACE)
            .map(|b| tail(&b))
            .unwrap_or_default();
        let Some(exited) = exited else {
            return Err(HostError::Timeout(Box::new(ToolTimeout {
                command,
                after: timeout,
                stderr,
            })));
        };
        let status = exited
            .map_err(io::Error::from)
            .and(status)
            .map_err(|source| HostError::Wait {
                command: command.clone(),
                source,
            })?;
        if !status.success() {
            return Err(HostError::Command {
                command,
                status,
                stderr,
            });
        }
        match self.stdout.recv_timeout(KILL_GRACE) {
            Ok(Ok((out, false))) => Ok(String::from_utf8_lossy(&out).into_owned()),
            Ok(Ok((_, true))) => Err(HostError::Output {
                command,
                output: format!("more than {MAX_STDOUT} bytes"),
            }),
            Ok(Err(source)) => Err(HostError::Wait { command, source }),
            Err(_) => Err(HostError::Wait {
                command,
                source: io::Error::other(
                    "stdout was held open by a process outside the tool's process group",
                ),
            }),
        }
    }
}

/// Makes the tool die with the plugin: SIGKILL when the thread that started it goes away.
///
/// A tool runs in its own process group (for the timeout's `killpg`), so a SIGKILL of the
/// plugin does not reach it. Left running, it would go on changing the host *after* a
/// restarted plugin has recovered: a `losetup --find --show` that was sleeping in its EBUSY
/// retry attached the image once more after the new plugin had unstaged the volume (a loop
/// device with no volume staged), a `mount` mounted a staging path the new plugin had
/// just unstaged. The thread that spawns a tool waits for it in [`ToolRunner::run`], so the
/// parent-death signal fires only when the whole plugin dies (or that call has already
/// killed the tool).
///
/// A plugin that died between the fork and the `prctl` is caught by comparing the parent:
/// the tool then does not start at all.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and calls only `prctl` and
    // `getppid` (async-signal-safe system calls; no allocation, no locks), as `pre_exec`
    // requires.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if nix::unistd::getppid() != parent {
                // ESRCH: the parent is gone. An OS error, since allocating is not allowed here.
                return Err(io::Error::from(nix::errno::Errno::ESRCH));
            }
            Ok(())
        });
    }
}

/// SIGKILL to the whole group; a group that is already gone is fine.
fn kill_group(pid: Pid) {
    match killpg(pid, Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(pgid = pid.as_raw(), error = %slrp_types::DisplayChain(&e), "killing tool process group")
        }
    }
}

/// Reads all of stdout, keeping at most [`MAX_STDOUT`] bytes; `true` if more came.
fn read_bounded(mut out: ChildStdout) -> io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut buf = [0u8; 8192];
    loop {
        let n = match out.read(&mut buf) {
            Ok(0) => return Ok((kept, overflow)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let room = MAX_STDOUT - kept.len();
        kept.extend_from_slice(&buf[..n.min(room)]);
        overflow |= n > room;
    }
}

/// Reads all of stderr, keeping the last [`STDERR_KEEP`] bytes.
fn read_tail(mut err: ChildStderr) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match err.read(&mut buf) {
            Ok(0) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * STDERR_KEEP {
                    kept.drain(..kept.len() - STDERR_KEEP);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return kept,
        }
    }
}

/// The last [`STDERR_TAIL`] characters, trimmed.
fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    let skip = text.chars().count().saturating_sub(STDERR_TAIL);
    text.chars().skip(skip).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn write_script(dir: &Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn runner(dir: &Path, timeout: Duration) -> ToolRunner {
        ToolRunner::with_dirs(vec![dir.to_owned()], timeout)
    }

    /// Dead means: no /proc entry, or a zombie waiting for a parent that is not us.
    fn is_gone(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        }
    }

    fn read_pid(path: &Path) -> i32 {
        std::fs::read_to_string(path)
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid")
    }

    /// Waits (bounded, a hang guard) for a killed process to disappear.
    fn assert_gone(pid: i32, what: &str) {
        for _ in 0..500 {
            if is_gone(pid) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("{what} (pid {pid}) is still alive");
    }

    #[test]
    fn output_of_a_successful_tool() {
        let dir = tempfile::tempdir().unwrap();
        write_script(dir.path(), "hello", r#"echo "hello $1""#);
        let out = runner(dir.path(), Duration::from_secs(30))
            .run("hello", ["world"])
            .unwrap();
        assert_eq!(out, "hello world\n");
    }

    #[test]
    fn failure_carries_exit_status_and_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        // 3000 lines of noise, then the line that matters.
        write_script(
            dir.path(),
            "fail",
            "i=0; while [ $i -lt 3000 ]; do echo noise >&2; i=$((i+1)); done\necho 'the real reason' >&2\nexit 3",
        );
        let err = runner(dir.path(), Duration::from_secs(30))
            .run("fail", ["x"])
            .unwrap_err();
        let HostError::Command {
            command,
            status,
            stderr,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!(command, "fail x");
        assert_eq!(status.code(), Some(3));
        assert!(stderr.ends_with("the real reason"), "{stderr}");
        assert!(stderr.chars().count() <= STDERR_TAIL);
    }

    #[test]
    fn redacted_arguments_reach_the_tool_but_not_the_error() {
        let dir = tempfile::tempdir().unwrap();
        write_script(dir.path(), "leaky", "echo \"got $2\" > \"$3\"; exit 1");
        let seen = dir.path().join("seen");
        let seen_arg = seen.display().to_string();
        let err = runner(dir.path(), Duration::from_secs(30))
            .run_redacted("leaky", ["-o", "password=hunter2", &seen_arg], &[1])
            .unwrap_err();
        let HostError::Command { command, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(command, &format!("leaky -o <redacted> {seen_arg}"));
        assert!(
            !slrp_types::DisplayChain(&err)
                .to_string()
                .contains("hunter2")
        );
        assert_eq!(
            std::fs::read_to_string(&seen).unwrap(),
            "got password=hunter2\n"
        );
    }

    #[test]
    fn missing_tool_names_the_search_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = runner(dir.path(), Duration::from_secs(30))
            .run("mkfs.nothing", ["/dev/x"])
            .unwrap_err();
        assert!(matches!(&err, HostError::Spawn { program, .. } if program == "mkfs.nothing"));
        let msg = slrp_types::DisplayChain(&err).to_string();
        assert!(
            msg.contains("not found in") && msg.contains(&dir.path().display().to_string()),
            "{msg}"
        );
        // A non-executable file is not a tool.
        std::fs::write(dir.path().join("plain"), "#!/bin/sh\n").unwrap();
        assert!(
            runner(dir.path(), Duration::from_secs(30))
                .find("plain")
                .is_none()
        );
    }

    /// The hang guard: a tool that never finishes (and started a helper that would hold
    /// its pipes open) is killed with its whole process group when the timeout fires; the
    /// error says so and quotes what it printed; neither process survives.
    #[test]
    fn hung_tool_is_killed_with_its_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().display();
        write_script(
            dir.path(),
            "mkfs.hang",
            &format!(
                "sleep 1000 &\necho $! > {pids}/helper.pid\necho $$ > {pids}/tool.pid\necho 'Discarding device blocks' >&2\nwait"
            ),
        );
        let err = runner(dir.path(), Duration::from_millis(300))
            .run("mkfs.hang", ["-q", "/dev/loop99"])
            .unwrap_err();
        let HostError::Timeout(t) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(
            **t,
            ToolTimeout {
                command: "mkfs.hang -q /dev/loop99".into(),
                after: Duration::from_millis(300),
                stderr: "Discarding device blocks".into(),
            }
        );
        assert!(
            err.to_string().contains("did not finish within 300ms"),
            "{err}"
        );
        // The leader was reaped by us: no /proc entry at all, not even a zombie.
        let tool = read_pid(&dir.path().join("tool.pid"));
        assert!(
            !Path::new(&format!("/proc/{tool}")).exists(),
            "tool {tool} left behind"
        );
        assert_gone(read_pid(&dir.path().join("helper.pid")), "helper");
    }

    /// A tool that exits but leaves a helper behind in its group holding stdout: the helper
    /// is killed and the call returns the tool's result instead of waiting for the helper.
    #[test]
    fn stragglers_of_a_finished_tool_are_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pids = dir.path().display();
        write_script(
            dir.path(),
            "forks",
            &format!("sleep 1000 &\necho $! > {pids}/helper.pid\necho done"),
        );
        let out = runner(dir.path(), Duration::from_secs(30))
            .run("forks", Vec::<String>::new())
            .unwrap();
        assert_eq!(out, "done\n");
        assert_gone(read_pid(&dir.path().join("helper.pid")), "helper");
    }

    const ORPHAN_DIR_ENV: &str = "SLRP_TOOL_ORPHAN_DIR";

    /// The child of `a_tool_dies_with_the_plugin`: a "plugin" running a slow tool.
    #[test]
    #[ignore = "run only as the child of a_tool_dies_with_the_plugin"]
    fn orphan_child() {
        let Some(dir) = std::env::var_os(ORPHAN_DIR_ENV) else {
            return;
        };
        let dir = PathBuf::from(dir);
        // Stands for a `losetup --find --show` sleeping in its EBUSY retry.
        let _ = runner(&dir, Duration::from_secs(600)).run("slow", Vec::<String>::new());
    }

    /// A SIGKILLed plugin takes its running tool with it: a tool outliving the plugin would
    /// change the host (attach a loop device, mount) after a restarted plugin recovered.
    /// (Seen in the SIGKILL soak of slrp-core: a loop device attached to an unstaged volume.)
    #[test]
    fn a_tool_dies_with_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("tool.pid");
        write_script(
            dir.path(),
            "slow",
            &format!(
                "echo $$ > {}.tmp\nmv {0}.tmp {0}\nexec sleep 1000",
                pid_file.display()
            ),
        );
        let mut plugin = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tool::tests::orphan_child",
                "--ignored",
                "--test-threads=1",
            ])
            .env(ORPHAN_DIR_ENV, dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Hang guard only: the child writes the file within milliseconds.
        for _ in 0..3000 {
            if pid_file.exists() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let tool = read_pid(&pid_file);
        let plugin_pid = Pid::from_raw(i32::try_from(plugin.id()).unwrap());
        nix::sys::signal::kill(plugin_pid, Signal::SIGKILL).unwrap();
        plugin.wait().unwrap();
        let gone = (0..500).any(|_| {
            thread::sleep(Duration::from_millis(10));
            is_gone(tool)
        });
        if !gone {
            // Do not leave the sleeper behind when the check fails.
            let _ = nix::sys::signal::kill(Pid::from_raw(tool), Signal::SIGKILL);
        }
        assert!(gone, "tool {tool} outlived the SIGKILLed plugin");
    }

    #[test]
    fn oversized_stdout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_script(dir.path(), "chatty", "head -c 2000000 /dev/zero");
        let err = runner(dir.path(), Duration::from_secs(30))
            .run("chatty", Vec::<String>::new())
            .unwrap_err();
        assert!(matches!(err, HostError::Output { .. }), "{err:?}");
    }
}
