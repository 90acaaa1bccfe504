//! Where plugin containers run: the seam between the supervisor's workers (readiness,
//! health, backoff: shared) and what launches, waits for, stops and recovers a container.
//!
//! Two backends exist: [`ProcessBackend`] (local processes, pid records under
//! `<runtime_dir>/containers`; the default) and [`crate::agent_backend::AgentBackend`] (the agent's
//! standalone containers through its operator API, Mesos's layout under
//! `<work_dir>/csi/<plugin type>/<plugin name>/containers`).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use slrp_types::DisplayChain;

use crate::agent_backend::AgentBackend;
use crate::metrics::SupervisorMetrics;
use crate::process::{self, ExitInfo, Liveness, PluginProcess, ProcessId};
use crate::spec::{
    ContainerSpec, PluginSpec, SpecChecks, SpecError, command_of, is_safe_component,
};
use crate::supervisor::{
    SupervisorConfig, SupervisorError, io_err, remove_endpoint_dir, remove_if_exists,
};

/// A boxed, sendable future (the trait methods are object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Containers found running by a recovery, by [`ContainerSpec::id`].
pub type Adopted = HashMap<String, Box<dyn PluginRun>>;

/// Where plugin containers run: local processes or the agent's standalone containers.
pub trait ContainerBackend: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs and the admin API (`process`, `agent`).
    fn name(&self) -> &'static str;

    /// The command checks this backend needs ([`crate::deployment_for`]).
    fn checks(&self) -> SpecChecks;

    /// Checks `spec` before anything starts (e.g. the agent's container ID rules).
    ///
    /// # Errors
    /// [`SupervisorError::Spec`] naming the container and the rule.
    fn check(&self, spec: &PluginSpec) -> Result<(), SupervisorError>;

    /// The directory holding one directory per container: `<runtime_dir>/containers`
    /// (processes) or `<work_dir>/csi/<plugin type>/<plugin name>/containers` (agent,
    /// spec §4.1.3).
    fn root(&self, spec: &PluginSpec, cfg: &SupervisorConfig) -> PathBuf;

    /// The name of `c`'s directory under [`ContainerBackend::root`]: its id as this
    /// backend knows it.
    fn dir_name(&self, c: &ContainerSpec) -> String {
        c.id.clone()
    }

    /// Prefix of the short socket directories it creates: `slrp-csi-` or `mesos-csi-`
    /// (so a Mesos provider and slrp re-use each other's). Both are recognised as ours
    /// when a link is cleaned up.
    fn socket_dir_prefix(&self) -> &'static str;

    /// Whether a socket file found before a launch is stale and removed. True for local
    /// processes (an adopted one never gets that far); false for the agent, whose LAUNCH
    /// may re-attach to a running container listening there (recovery and terminations
    /// remove the stale ones, as Mesos's post-stop hook does).
    fn clears_socket_before_launch(&self) -> bool {
        true
    }

    /// Leftovers of a previous run under `root`: adopts what matches `spec`, retires the
    /// rest (stop, wait, remove its directory). Returns the adopted containers by
    /// [`ContainerSpec::id`].
    fn recover<'a>(
        &'a self,
        spec: &'a PluginSpec,
        root: &'a Path,
        cfg: &'a SupervisorConfig,
        metrics: &'a SupervisorMetrics,
    ) -> BoxFuture<'a, Result<Adopted, SupervisorError>>;

    /// Starts (or re-attaches to) one container whose directory is `dir`; `env` holds
    /// `CSI_ENDPOINT` and, for a node container, `MESOS_AGENT_ID`.
    fn launch<'a>(
        &'a self,
        c: &'a ContainerSpec,
        env: &'a [(String, String)],
        dir: &'a Path,
        cfg: &'a SupervisorConfig,
    ) -> BoxFuture<'a, Result<Box<dyn PluginRun>, SupervisorError>>;
}

/// One running container, as a worker sees it.
pub trait PluginRun: Send + Sync + fmt::Debug {
    /// Its pid (for the agent backend the `executor_pid` GET_CONTAINERS reports; 0 when
    /// the agent did not report one).
    fn pid(&self) -> i32;

    /// Whether it was found running rather than launched (a pid record adopted, or the
    /// agent's LAUNCH answered 202).
    fn is_adopted(&self) -> bool;

    /// Waits until it ends.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    fn wait(&mut self) -> BoxFuture<'_, ExitInfo>;

    /// Stops it: SIGTERM, SIGKILL after `grace`, then waits. Returns how it ended and
    /// whether SIGKILL was needed.
    fn stop(&mut self, grace: Duration) -> BoxFuture<'_, (ExitInfo, bool)>;

    /// Leaves it running and forgets it (`plugins_on_exit = "leave"`).
    fn detach(self: Box<Self>);
}

impl PluginRun for PluginProcess {
    fn pid(&self) -> i32 {
        self.id().pid
    }

    fn is_adopted(&self) -> bool {
        PluginProcess::is_adopted(self)
    }

    fn wait(&mut self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(PluginProcess::wait(self))
    }

    fn stop(&mut self, grace: Duration) -> BoxFuture<'_, (ExitInfo, bool)> {
        Box::pin(PluginProcess::stop(self, grace))
    }

    fn detach(self: Box<Self>) {
        PluginProcess::detach(*self);
    }
}

/// What is recorded about a launched plugin, for adoption after a restart of slrp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PidRecord {
    pub(crate) process: ProcessId,
    pub(crate) config_hash: String,
    /// The kernel boot the process ran in. Start times count from boot, so after a
    /// reboot (where early services get the same pids at nearly the same times) pid and
    /// start time alone can name an unrelated live process. Absent in records written
    /// before it was added; those are judged by pid and start time only.
    #[serde(default)]
    pub(crate) boot_id: Option<String>,
}

impl PidRecord {
    /// Whether the recorded process may still exist: not if it ran in another boot.
    fn is_from_this_boot(&self, current: Option<&str>) -> bool {
        match (self.boot_id.as_deref(), current) {
            (Some(recorded), Some(now)) => recorded == now,
            (None, _) | (_, None) => true,
        }
    }
}

/// The pid record's file name in a container directory.
pub(crate) const RECORD: &str = "pid.json";
/// Socket directory prefix of the process backend.
pub(crate) const PROCESS_SOCKET_PREFIX: &str = "slrp-csi-";

fn read_record(dir: &Path) -> Option<PidRecord> {
    let text = std::fs::read(dir.join(RECORD)).ok()?;
    match serde_json::from_slice(&text) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %DisplayChain(&e), "ignoring unreadable pid record");
            None
        }
    }
}

/// Replaces `dir/pid.json` with [`slrp_types::write_atomic`] (via `pid.json.tmp`). Durable
/// before the plugin is probed, the directory included: a record lost in a crash (or a
/// power loss) would let a second copy start.
fn write_record(dir: &Path, record: &PidRecord) -> io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    slrp_types::write_atomic(&dir.join(RECORD), &bytes).map_err(io::Error::from)
}

/// Local processes (the default backend): each container is a process group slrp
/// spawns, recorded in `pid.json` for adoption by the next slrp.
#[derive(Debug, Clone, Default)]
pub struct ProcessBackend {
    /// Where the agent backend (or a Mesos provider) may have left plugin containers.
    agent: Option<AgentBackend>,
}

impl ProcessBackend {
    /// Local processes; at recovery, first retires the plugin containers `agent`'s
    /// layout names (`<work_dir>/csi/<type>/<name>/containers/*`, left by the agent
    /// backend or by a Mesos provider) through the agent's operator API, so a switch of
    /// backends never leaves two copies of a plugin running.
    pub fn retiring_agent_containers(agent: AgentBackend) -> Self {
        Self { agent: Some(agent) }
    }
}

impl ContainerBackend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    fn checks(&self) -> SpecChecks {
        SpecChecks::Process
    }

    fn check(&self, spec: &PluginSpec) -> Result<(), SupervisorError> {
        // A spec made for the agent (`SpecChecks::Agent`) may lack what a process needs.
        let plugin = format!("{}/{}", spec.plugin_type, spec.plugin_name);
        for (index, c) in spec.containers.iter().enumerate() {
            let checked = match &c.raw.0.command {
                Some(command) => command_of(&plugin, index, command, SpecChecks::Process).map(drop),
                None if c.command.value.is_empty() => Err(SpecError::NoCommand {
                    plugin: plugin.clone(),
                    index,
                }),
                None => Ok(()),
            };
            checked.map_err(|source| SupervisorError::Spec {
                backend: "process",
                source,
            })?;
            let ignored = not_applied(&c.raw.0);
            if !ignored.is_empty() {
                // Not refused: a Mesos file written for the agent still runs here. But a
                // plugin configured to run as another user or in an image must not run as
                // slrp's user on the host without a word.
                tracing::warn!(
                    plugin = %plugin,
                    container = index,
                    fields = ?ignored,
                    "the process backend does not apply these fields: the plugin runs its \
                     command on the host as slrp's user; [plugins] backend = \"agent\" has \
                     the agent apply them"
                );
            }
        }
        Ok(())
    }

    fn root(&self, _spec: &PluginSpec, cfg: &SupervisorConfig) -> PathBuf {
        cfg.runtime_dir.join("containers")
    }

    fn socket_dir_prefix(&self) -> &'static str {
        PROCESS_SOCKET_PREFIX
    }

    fn recover<'a>(
        &'a self,
        spec: &'a PluginSpec,
        root: &'a Path,
        cfg: &'a SupervisorConfig,
        metrics: &'a SupervisorMetrics,
    ) -> BoxFuture<'a, Result<Adopted, SupervisorError>> {
        Box::pin(async move {
            if let Some(agent) = &self.agent {
                let agent_root = agent.root(spec, cfg);
                agent
                    .recover_containers(&spec.without_containers(), &agent_root, cfg, metrics)
                    .await?;
            }
            recover_processes(spec, root, cfg, metrics).await
        })
    }

    fn launch<'a>(
        &'a self,
        c: &'a ContainerSpec,
        env: &'a [(String, String)],
        dir: &'a Path,
        cfg: &'a SupervisorConfig,
    ) -> BoxFuture<'a, Result<Box<dyn PluginRun>, SupervisorError>> {
        Box::pin(async move {
            let p = launch_process(c, env, dir, cfg).await?;
            Ok(Box::new(p) as Box<dyn PluginRun>)
        })
    }
}

async fn launch_process(
    c: &ContainerSpec,
    env: &[(String, String)],
    dir: &Path,
    cfg: &SupervisorConfig,
) -> Result<PluginProcess, SupervisorError> {
    let open = |name: &str| {
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err("opening", &path))
    };
    let mut env = env.to_vec();
    // slrp's own log format (its flag, or the variable it inherited), so that plugins
    // reading the variable (the bundled one does) log alike; a value in the plugin's own
    // command wins, as the operator wrote it there.
    if let Some(format) = slrp_log::installed_format()
        && !c
            .command
            .env
            .iter()
            .any(|(name, _)| name == slrp_log::FORMAT_VAR)
    {
        env.push((slrp_log::FORMAT_VAR.to_owned(), format.as_str().to_owned()));
    }
    let p = PluginProcess::spawn(
        &c.command,
        &env,
        dir,
        open("stdout.log")?,
        open("stderr.log")?,
        cfg.proc_reader.as_ref(),
    )
    .await
    .map_err(|source| SupervisorError::Launch {
        container: c.id.clone(),
        source,
    })?;
    write_record(
        dir,
        &PidRecord {
            process: p.id(),
            config_hash: c.config_hash(),
            boot_id: process::boot_id(),
        },
    )
    .map_err(io_err("writing the pid record in", dir))?;
    Ok(p)
}

/// Reads pid records of a previous run: adopts matching live plugins, stops the others,
/// and removes directories of containers no longer configured.
async fn recover_processes(
    spec: &PluginSpec,
    root: &Path,
    cfg: &SupervisorConfig,
    metrics: &SupervisorMetrics,
) -> Result<Adopted, SupervisorError> {
    let mut adopted = Adopted::new();
    let boot = process::boot_id();
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        // Nothing ran here yet (also: the other backend's root, before any process ran).
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(adopted),
        Err(e) => return Err(io_err("listing", root)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err("listing", root))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_safe_component(&name) {
            continue;
        }
        let dir = entry.path();
        let current = spec.containers.iter().find(|c| c.id == name);
        if let Some(rec) = read_record(&dir) {
            // A process of an earlier boot is gone; whatever now has its pid is not ours
            // to adopt or to stop.
            let live = rec.is_from_this_boot(boot.as_deref())
                && process::liveness(rec.process) == Liveness::Alive;
            let matches = current.is_some_and(|c| c.config_hash() == rec.config_hash);
            if live && matches {
                adopted.insert(
                    name.clone(),
                    Box::new(PluginProcess::adopt(rec.process, cfg.adopt_poll)),
                );
                continue;
            }
            if live {
                tracing::info!(container = %name, pid = rec.process.pid, "stopping plugin left by a previous slrp with a different configuration");
                process::stop_foreign(rec.process, cfg.stop_grace, cfg.adopt_poll).await;
                metrics.stopped_leftover(&name);
            }
            let _ = remove_if_exists(&dir.join(RECORD));
        }
        if current.is_none() {
            remove_endpoint_dir(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(adopted)
}

/// Retires every process a previous run of the process backend left under
/// `<runtime_dir>/containers` (the agent backend's start after a switch of backends:
/// otherwise two copies of the plugin would run).
pub(crate) async fn retire_processes(
    spec: &PluginSpec,
    cfg: &SupervisorConfig,
    metrics: &SupervisorMetrics,
) -> Result<(), SupervisorError> {
    let none = spec.without_containers();
    let root = ProcessBackend::default().root(spec, cfg);
    recover_processes(&none, &root, cfg, metrics).await?;
    Ok(())
}

/// The fields of a plugin container's configuration the process backend does not apply
/// (Mesos's agent would): the command's user, the container's resources and its
/// `ContainerInfo` (image, volumes).
fn not_applied(info: &slrp_proto::mesos::v1::CsiPluginContainerInfo) -> Vec<&'static str> {
    [
        (
            "command.user",
            info.command.as_ref().is_some_and(|c| c.user.is_some()),
        ),
        ("resources", !info.resources.is_empty()),
        ("container", info.container.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn record(pid: i32) -> PidRecord {
        PidRecord {
            process: ProcessId { pid, start_time: 7 },
            config_hash: "hash".to_owned(),
            boot_id: Some("boot".to_owned()),
        }
    }

    /// The pid record goes through the crash-safe writer (whose tests cover the fsyncs of
    /// the file and the directory): a crash's leftover does not block it, and it leaves
    /// only `pid.json` behind.
    #[test]
    fn the_pid_record_is_replaced_whole_past_a_crash_s_leftover() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pid.json.tmp"), b"{\"proc").unwrap();
        write_record(dir.path(), &record(1)).unwrap();
        write_record(dir.path(), &record(2)).unwrap();
        assert_eq!(read_record(dir.path()), Some(record(2)));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [RECORD]);
    }

    #[test]
    fn the_fields_the_process_backend_does_not_apply_are_named() {
        use slrp_proto::mesos::v1::{CommandInfo, ContainerInfo, CsiPluginContainerInfo, Resource};
        let mut info = CsiPluginContainerInfo {
            command: Some(CommandInfo {
                value: Some("plugin".to_owned()),
                ..CommandInfo::default()
            }),
            ..CsiPluginContainerInfo::default()
        };
        assert!(super::not_applied(&info).is_empty());
        info.command.as_mut().unwrap().user = Some("nobody".to_owned());
        info.resources.push(Resource::default());
        info.container = Some(ContainerInfo::default());
        assert_eq!(
            super::not_applied(&info),
            ["command.user", "resources", "container"]
        );
    }
}
