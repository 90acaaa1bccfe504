//! `slrp standalone`: the embedded resource provider manager (playing agent and master)
//! and the providers with their supervised plugins, in one foreground process, with a
//! working default when no flag is given (`docs/standalone.md`).
//!
//! # Start
//!
//! 1. Root is required (the bundled plugin mounts volumes and attaches loop devices):
//!    otherwise one line on stderr and exit 77 (`EX_NOPERM`).
//! 2. The configuration is `slrp run`'s (TOML file and flags), without an agent: the
//!    state directory is created (0700) and locked, so a second `slrp standalone` on it
//!    is refused before it touches anything. The ResourceProviderInfo directory and the
//!    profile document are the generated defaults ([`defaults`]) unless given.
//! 3. The manager is spawned on `<state dir>/manager.sock` with its registrar in
//!    `<state dir>/manager` (the agent id and the admitted provider ids survive
//!    restarts, so the providers keep their identity), acknowledging every status update
//!    at once as a master does for operator operations.
//! 4. The daemon runs against it (`slrp_provider::daemon::run_with`), mode `standalone`,
//!    with [`actions::StandaloneActions`] serving the admin API's actions.
//!
//! # Stop
//!
//! SIGTERM or SIGINT stops the daemon (providers, volume managers, plugins, in that
//! order), then the manager. Everything is durable when it is written, so SIGKILL loses
//! nothing: the next start recovers the same agent id, provider ids and volumes.
//!
//! # Exit status
//!
//! 0 after a clean stop; 1 when the daemon fails while running or a second signal forced
//! the exit; 64 (`EX_USAGE`) for a bad command line; 77 (`EX_NOPERM`) without root;
//! 78 (`EX_CONFIG`) for a configuration or state problem (bad config file, a state
//! directory in use, the bundled plugin not found, an unreadable store).

mod actions;
mod defaults;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use slrp_manager::{AckPolicy, EmbeddedManager, Listen, ManagerConfig};
use slrp_profiles::ProfilesConfigFile;
use slrp_provider::admin::{DaemonExtras, api::Mode};
use slrp_provider::config::{DEFAULT_STATE_DIR, DaemonConfig, DaemonConfigFile, Overrides};
use slrp_types::DisplayChain;
use tokio_util::sync::CancellationToken;

use crate::daemon_common::{AdminArgs, EX_CONFIG, daemon_exit, daemon_runtime, handle_signals};
use defaults::Layout;

/// `EX_NOPERM` from sysexits.h: the user lacks a permission.
pub(crate) const EX_NOPERM: u8 = 77;

/// How often the profile document is read again when the configuration does not say
/// (Mesos reads it once): an edit takes effect within seconds, without a restart.
const PROFILE_POLL: &str = "5s";

/// How long the manager may take to stop after the daemon (its tasks only close
/// connections).
const MANAGER_STOP: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, Args)]
pub(crate) struct StandaloneArgs {
    /// slrp's TOML config file, as for `slrp run` but without `[agent] url` (the embedded
    /// manager is the agent); flags win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// slrp's state directory, created 0700 (default `/var/lib/slrp`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// One ResourceProviderInfo JSON file per provider, in Mesos's format, instead of the
    /// generated default (`<state dir>/config/resource-providers/`).
    #[arg(long, value_name = "DIR")]
    resource_provider_config_dir: Option<PathBuf>,
    /// A profile document in the format of Mesos's URI disk profile adaptor (a path,
    /// `file://`, `http://` or `https://`) instead of the generated default
    /// (`<state dir>/config/profiles.json`).
    #[arg(long, value_name = "URI")]
    disk_profiles: Option<String>,
    /// Where volumes are mounted: `DIR/csi/<plugin type>/<plugin name>/mounts/`
    /// (default `<state dir>/work`).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    #[command(flatten)]
    admin: AdminArgs,
}

impl StandaloneArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            state_dir: self.state_dir.clone(),
            resource_provider_config_dir: self.resource_provider_config_dir.clone(),
            disk_profiles: self.disk_profiles.clone(),
            work_dir: self.work_dir.clone(),
            ..self.admin.overrides()
        }
    }
}

/// Why standalone mode cannot start (before the daemon runs).
#[derive(Debug, thiserror::Error)]
enum StandaloneError {
    /// The file's own error names it already.
    #[error(transparent)]
    Config(slrp_provider::config::ConfigError),
    #[error(
        "config file {path}: 'agent.url' is for slrp run; slrp standalone serves its own manager (remove the setting)"
    )]
    AgentInConfig { path: PathBuf },
    #[error("creating the state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the state directory {path} is in use by another slrp standalone{holder}; stop it first or give another --state-dir"
    )]
    Busy { path: PathBuf, holder: String },
    #[error("locking the state directory with {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("making the default configuration")]
    Defaults(#[source] defaults::DefaultsError),
    #[error("the configuration")]
    Resolve(#[source] slrp_provider::config::ConfigError),
    #[error("starting the embedded resource provider manager")]
    Manager(#[source] slrp_manager::ManagerError),
}

/// The exclusive lock on the state directory, held while the process lives (the kernel
/// drops it when the process dies, however it dies).
#[derive(Debug)]
struct StateLock(#[allow(dead_code, reason = "held for its lock only")] File);

/// Locks `<state dir>/standalone.lock` and writes this process's id into it.
fn lock_state_dir(layout: &Layout, state_dir: &Path) -> Result<StateLock, StandaloneError> {
    use std::io::{Read as _, Seek as _, Write as _};
    let path = layout.lock_file();
    let failed = |source| StandaloneError::Lock {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let holder = match file.read_to_string(&mut text) {
                Ok(_) if !text.trim().is_empty() => format!(" (pid {})", text.trim()),
                _ => String::new(),
            };
            return Err(StandaloneError::Busy {
                path: state_dir.to_owned(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(failed(e)),
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .map_err(failed)?;
    Ok(StateLock(file))
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The configuration ready to run, with the state directory locked.
struct Prepared {
    config: DaemonConfig,
    layout: Layout,
    lock: StateLock,
}

/// Reads the configuration, locks the state directory and fills in the defaults.
fn prepare(args: &StandaloneArgs) -> Result<Prepared, StandaloneError> {
    let file = match &args.config {
        Some(path) => {
            let file = DaemonConfigFile::load(path).map_err(StandaloneError::Config)?;
            if file.agent.url.is_some() {
                return Err(StandaloneError::AgentInConfig { path: path.clone() });
            }
            file
        }
        None => DaemonConfigFile::default(),
    };
    let mut file = file.apply(args.overrides());
    let state_dir = file
        .state_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    create_private_dir(&state_dir).map_err(|source| StandaloneError::StateDir {
        path: state_dir.clone(),
        source,
    })?;
    let layout = Layout::new(state_dir.clone());
    let lock = lock_state_dir(&layout, &state_dir)?;
    if file.resource_provider_config_dir.is_none() {
        defaults::ensure_provider_file(&layout)
            .and_then(|()| defaults::check_provider_file(&layout))
            .map_err(StandaloneError::Defaults)?;
        file.resource_provider_config_dir = Some(layout.provider_dir());
    }
    let profiles = match file.profiles.take() {
        Some(profiles) => profiles,
        None => {
            defaults::ensure_profiles_file(&layout).map_err(StandaloneError::Defaults)?;
            ProfilesConfigFile {
                uri: Some(format!("file://{}", layout.profiles_file().display())),
                ..ProfilesConfigFile::default()
            }
        }
    };
    file.profiles = Some(with_poll(profiles));
    file.state_dir = Some(state_dir);
    file.agent.url = Some(format!("unix://{}", layout.manager_socket().display()));
    let config = DaemonConfig::resolve(file).map_err(StandaloneError::Resolve)?;
    Ok(Prepared {
        config,
        layout,
        lock,
    })
}

/// A fetched document is read again every [`PROFILE_POLL`] unless the configuration says
/// otherwise; an inline set never changes.
fn with_poll(mut profiles: ProfilesConfigFile) -> ProfilesConfigFile {
    if profiles.uri.is_some() && profiles.poll_interval.is_none() {
        profiles.poll_interval = Some(PROFILE_POLL.to_owned());
    }
    profiles
}

/// Whether this process may do what the bundled plugin does (mounts, loop devices).
fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs standalone mode until a signal stops it.
pub(crate) fn run(args: &StandaloneArgs) -> ExitCode {
    if !is_root() {
        eprintln!(
            "error: slrp standalone needs root: its bundled CSI plugin mounts volumes and attaches loop devices (run it with sudo)"
        );
        return ExitCode::from(EX_NOPERM);
    }
    let prepared = match prepare(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}", DisplayChain(&e));
            return ExitCode::from(EX_CONFIG);
        }
    };
    let runtime = match daemon_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = runtime.block_on(serve(prepared.config, &prepared.layout));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(prepared.lock);
    code
}

/// The manager, then the daemon against it; the daemon stops first.
async fn serve(config: DaemonConfig, layout: &Layout) -> ExitCode {
    let shutdown = CancellationToken::new();
    if let Err(e) = handle_signals(shutdown.clone()) {
        eprintln!("error: installing the signal handlers: {e}");
        return ExitCode::FAILURE;
    }
    let mut manager_config = ManagerConfig::new(Listen::Unix(layout.manager_socket()));
    manager_config.state_dir = Some(layout.manager_dir());
    if let Some(bytes) = config.manager_max_body_bytes {
        manager_config.max_body_bytes = bytes;
    }
    manager_config.ack_policy = AckPolicy::Auto;
    let ack_policy = manager_config.ack_policy;
    // Its own token: the manager must outlive the daemon's shutdown, so that the
    // providers' last calls are answered.
    let (manager, guard) =
        match EmbeddedManager::spawn(manager_config, CancellationToken::new()).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("error: {}", DisplayChain(&StandaloneError::Manager(e)));
                return ExitCode::from(EX_CONFIG);
            }
        };
    tracing::info!(
        agent_id = manager.agent_id(),
        providers = config.providers.len(),
        state_dir = %config.state_dir.display(),
        admin = %config.admin,
        "starting standalone"
    );
    let extras = DaemonExtras {
        mode: Mode::Standalone,
        actions: Some(Arc::new(actions::StandaloneActions::new(
            manager, ack_policy,
        ))),
    };
    let result = slrp_provider::daemon::run_with(config, extras, shutdown).await;
    if tokio::time::timeout(MANAGER_STOP, guard.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the embedded manager did not stop in time; abandoning it");
    }
    daemon_exit(result)
}
