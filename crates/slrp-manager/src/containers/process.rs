//! The POSIX launcher: one process group per container, identified by pid and start time.
//!
//! A container's process leads its own group (Mesos's POSIX launcher puts it in a new
//! session), so the launcher's destroy reaches whatever it forked: when the container's
//! process exits, the rest of its group is SIGKILLed before the termination is reported.
//! A process is identified by its pid *and* its `/proc` start time, so that a recycled pid
//! is never mistaken for a container after a manager restart.

use std::io;
use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::CommandInfo;
use slrp_proto::mesos::v1::environment::variable::Type as VariableType;
use tokio::process::{Child, Command};

/// What Mesos's launch helper sets when the environment has no `PATH`.
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Identity of a process that survives pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProcessId {
    /// The pid, also the process group id.
    pub(crate) pid: i32,
    /// `starttime` from `/proc/<pid>/stat`, in clock ticks since boot.
    pub(crate) start_time: u64,
}

/// `(state, starttime)` of `pid`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn stat(pid: i32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat");
    let rest = &text[text.rfind(')').ok_or_else(malformed)? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields
        .next()
        .and_then(|f| f.chars().next())
        .ok_or_else(malformed)?;
    // The fields after the name start at field 3 (state); starttime is field 22.
    let start_time = fields
        .nth(22 - 4)
        .and_then(|f| f.parse().ok())
        .ok_or_else(malformed)?;
    Ok((state, start_time))
}

pub(crate) fn identify(pid: i32) -> io::Result<ProcessId> {
    stat(pid).map(|(_, start_time)| ProcessId { pid, start_time })
}

/// Whether the recorded process still runs (a zombie has exited).
pub(crate) fn is_alive(id: ProcessId) -> bool {
    matches!(stat(id.pid), Ok((state, start)) if start == id.start_time && state != 'Z' && state != 'X')
}

/// Whether the recorded pid now names another process (its start time differs). The
/// recorded one itself, a zombie not yet reaped, is not a recycled pid.
pub(crate) fn recycled(id: ProcessId) -> bool {
    matches!(stat(id.pid), Ok((_, start)) if start != id.start_time)
}

/// Signals the container's own process, as Mesos's `MesosContainerizerProcess::kill` does.
pub(crate) fn signal(pid: i32, number: i32) -> Result<(), nix::Error> {
    let signal = if number == 0 {
        None
    } else {
        Some(Signal::try_from(number)?)
    };
    kill(Pid::from_raw(pid), signal)
}

/// The launcher's destroy: SIGKILL to the whole group. ESRCH (nothing left) is normal.
pub(crate) fn kill_group(pgid: i32) {
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
}

/// Whether any process of the group is left that has not exited. Zombies count as gone:
/// a member orphaned by the container's exit is reaped by init (or never, under an init
/// that does not reap), and it has exited either way.
pub(crate) fn group_alive(pgid: i32) -> bool {
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| matches!(member_state(pid), Some((group, state)) if group == pgid && state != 'Z' && state != 'X'))
}

/// `(pgrp, state)` of `pid` from `/proc/<pid>/stat`.
fn member_state(pid: i32) -> Option<(i32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = text[text.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 4 is ppid, field 5 pgrp.
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((pgrp, state))
}

/// The environment of a container as the Mesos containerizer builds it (the agent's own
/// environment is not inherited): `MESOS_SANDBOX`, then the command's `VALUE` variables
/// (later ones win), `PATH` defaulted. `SECRET` variables are left out: Mesos resolves
/// them in its `environment_secret` isolator, which the embedded manager does not have.
pub(crate) fn environment(command: &CommandInfo, sandbox: &Path) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        vec![("MESOS_SANDBOX".to_owned(), sandbox.display().to_string())];
    for variable in command.environment.iter().flat_map(|e| &e.variables) {
        if variable.r#type() == VariableType::Secret {
            tracing::info!(
                variable = %variable.name,
                "not setting a SECRET environment variable: the embedded manager resolves no secrets"
            );
            continue;
        }
        let value = variable.value.clone().unwrap_or_default();
        env.retain(|(name, _)| *name != variable.name);
        env.push((variable.name.clone(), value));
    }
    if !env.iter().any(|(name, _)| name == "PATH") {
        env.push(("PATH".to_owned(), DEFAULT_PATH.to_owned()));
    }
    env
}

/// Starts the command in `sandbox`: `sh -c <value>` for a shell command, else `value`
/// with `arguments` as argv (`arguments[0]` is argv\[0\]). Output goes to the sandbox's
/// `stdout` and `stderr` files, as with Mesos's sandbox container logger.
pub(crate) fn spawn(command: &CommandInfo, sandbox: &Path) -> io::Result<(Child, ProcessId)> {
    let value = command.value.as_deref().unwrap_or_default();
    let mut cmd = if command.shell() {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg0("sh").arg("-c").arg(value);
        cmd
    } else {
        let mut cmd = Command::new(value);
        if let Some((first, rest)) = command.arguments.split_first() {
            cmd.arg0(first).args(rest);
        }
        cmd
    };
    let output = |name: &str| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(sandbox.join(name))
    };
    cmd.env_clear()
        .envs(environment(command, sandbox))
        .current_dir(sandbox)
        .stdin(Stdio::null())
        .stdout(output("stdout")?)
        .stderr(output("stderr")?)
        .process_group(0)
        // A surviving container must outlive the manager; the owner decides who dies.
        .kill_on_drop(false);
    let child = cmd.spawn()?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| io::Error::other("the new process has no pid"))?;
    // A child we have not reaped keeps its /proc entry, so this read cannot race its exit.
    match identify(pid) {
        Ok(id) => Ok((child, id)),
        Err(error) => {
            kill_group(pid);
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slrp_proto::mesos::v1::{Environment, Secret, environment::Variable};

    fn variable(name: &str, value: &str) -> Variable {
        Variable {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            ..Variable::default()
        }
    }

    #[test]
    fn environment_is_clean_later_entries_win_and_secrets_are_left_out() {
        let command = CommandInfo {
            environment: Some(Environment {
                variables: vec![
                    variable("A", "1"),
                    variable("A", "2"),
                    Variable {
                        name: "TOKEN".to_owned(),
                        r#type: Some(VariableType::Secret as i32),
                        secret: Some(Secret::default()),
                        ..Variable::default()
                    },
                ],
            }),
            ..CommandInfo::default()
        };
        let env = environment(&command, Path::new("/sandbox"));
        assert_eq!(
            env,
            [
                ("MESOS_SANDBOX", "/sandbox"),
                ("A", "2"),
                ("PATH", DEFAULT_PATH)
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
        let with_path = CommandInfo {
            environment: Some(Environment {
                variables: vec![variable("PATH", "/opt")],
            }),
            ..CommandInfo::default()
        };
        assert_eq!(
            environment(&with_path, Path::new("/s"))
                .iter()
                .filter(|(n, _)| n == "PATH")
                .count(),
            1
        );
    }

    #[test]
    fn a_process_is_identified_by_pid_and_start_time() {
        let me = identify(i32::try_from(std::process::id()).unwrap_or(i32::MAX));
        let me = me.expect("our own stat");
        assert!(is_alive(me));
        assert!(!is_alive(ProcessId {
            start_time: me.start_time + 1,
            ..me
        }));
    }
}
