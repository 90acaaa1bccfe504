//! Supervision of managed CSI plugins (Mesos's service manager and container daemon,
//! spec §4.1): as local processes (the default) or as the agent's standalone containers
//! through its operator API ([`AgentBackend`]).
//!
//! # Overview
//! [`deployment_from_info`] turns a Mesos `CSIPluginInfo` into either a managed
//! [`PluginSpec`] (containers slrp launches) or unmanaged endpoints. For a managed plugin,
//! [`Supervisor::start`] launches each container's command with `CSI_ENDPOINT=unix://…`
//! in its own process group, waits for its socket, probes it until ready (through a
//! [`ReadinessCheck`]; [`CsiProbe`] in production), health-probes it, restarts it with
//! jittered exponential backoff on exit or sustained probe failure, and stops it with
//! SIGTERM then SIGKILL. Plugins left running by a previous slrp are adopted or stopped.
//!
//! # Layout
//! - [`spec`]: `CSIPluginInfo` → [`PluginDeployment`] (service assignment, commands, ids).
//! - [`supervisor`]: [`Supervisor`], [`SupervisorHandle`], [`SupervisorConfig`], workers.
//! - [`backend`]: the [`ContainerBackend`] / [`PluginRun`] seam and [`ProcessBackend`].
//! - [`agent_backend`]: [`AgentBackend`], containers through the agent's operator API.
//! - [`process`]: process groups, identity by pid + start time ([`ProcReader`] seam),
//!   the no-leak guard.
//! - [`readiness`]: [`ReadinessCheck`] and [`CsiProbe`].
//! - [`metrics`]: terminations by cause, restarts, readiness, adoptions.
//!
//! # Invariants
//! - A plugin process never outlives its supervisor unless explicitly detached: stop,
//!   cancel, handle drop and task drop all end in a signal to its process group. (An
//!   agent container is the agent's: a dropped supervisor leaves it running, and the next
//!   start adopts or retires it.)
//! - At most one copy of a container runs: leftovers are adopted or stopped before any
//!   launch, and a launch is recorded (fsync'd) before it is probed.
//! - Socket paths handed to plugins fit in `sun_path`: they live in a short temporary
//!   directory that the container directory links to as `endpoint`. Its path never
//!   changes while the supervisor runs; before every launch it is recreated (0700) if a
//!   tmp cleaner removed it, and a launch into a path someone else took is refused.
//! - A pid record always names a start time read from `/proc` ([`ProcReader`]): a process
//!   whose start time cannot be read is killed and its launch fails, so the next slrp
//!   can always adopt or stop what a record names.
//!
//! # Limitations
//! - With [`ProcessBackend`]: no container isolation (`ContainerInfo`, resources and
//!   `user` are ignored); the plugin inherits slrp's environment plus the configured
//!   variables; secret environment variables must be `VALUE` secrets (references are
//!   rejected). [`AgentBackend`] hands all of these to the agent.
//! - [`AgentBackend`] never sends REMOVE_CONTAINER (a Mesos 1.11 agent aborts on one for
//!   a top-level container): sandboxes stay unless [`RemoveSandboxes::Files`].
//! - An adopted plugin's exit is noticed by polling `/proc` (`adopt_poll`), and its exit
//!   status is unknown.
//! - A socket removed under a running plugin is noticed by the next health probe and
//!   repaired by a restart, not in place.

pub mod agent_backend;
pub mod backend;
pub mod metrics;
pub mod process;
pub mod readiness;
pub mod spec;
pub mod supervisor;

pub use agent_backend::{AgentBackend, AgentBackendConfig, RemoveSandboxes};
pub use backend::{ContainerBackend, PluginRun, ProcessBackend};
pub use metrics::{SupervisorMetrics, TerminationCause};
pub use process::{LaunchError, ProcFs, ProcReader};
pub use readiness::{CheckFuture, CsiProbe, Readiness, ReadinessCheck};
pub use spec::{
    ContainerSpec, LaunchCommand, PluginDeployment, PluginSpec, RawContainerInfo, Service,
    SpecChecks, SpecError, deployment_for, deployment_from_info,
};
pub use supervisor::{
    ContainerState, Supervisor, SupervisorConfig, SupervisorError, SupervisorHandle,
};
