//! `slrp run`: the providers of `--resource-provider-config-dir` against an external
//! resource provider manager (a Mesos agent), in the foreground.
//!
//! Exit status: 0 after a clean stop (SIGTERM or SIGINT), 64 for a command line that is
//! wrong (bad flag, no `--agent`), 78 (`EX_CONFIG`) for a configuration or state problem
//! (a bad config file or ResourceProviderInfo, a refused work directory, an unreadable
//! store, a busy admin socket), 1 when the daemon fails while running (every provider
//! failed) or a second signal forced the exit.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use slrp_provider::config::{ConfigError, DaemonConfig, DaemonConfigFile, Overrides};
use slrp_types::DisplayChain;
use tokio_util::sync::CancellationToken;

use crate::cli::EX_USAGE;
use crate::daemon_common::{AdminArgs, EX_CONFIG, daemon_exit, daemon_runtime, handle_signals};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// slrp's TOML config file; every flag below can be set there too, flags win.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The agent: `http://HOST:PORT` (the resource provider endpoint
    /// `/slave(1)/api/v1/resource_provider` is appended when the URL has no path),
    /// `https://…` or `unix:///SOCKET`.
    #[arg(long, value_name = "URL")]
    agent: Option<String>,
    /// A file holding the agent's bearer token (never the token itself).
    #[arg(long, value_name = "FILE")]
    agent_token_file: Option<PathBuf>,
    /// The agent's work directory: volumes are mounted under
    /// `DIR/csi/<plugin type>/<plugin name>/mounts/` (default: `<state dir>/work`).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// One ResourceProviderInfo JSON file per provider, in Mesos's format (as the agent's
    /// `--resource_provider_config_dir`).
    #[arg(long, value_name = "DIR")]
    resource_provider_config_dir: Option<PathBuf>,
    /// A profile document in the format of Mesos's URI disk profile adaptor: a path,
    /// `file://`, `http://` or `https://`.
    #[arg(long, value_name = "URI")]
    disk_profiles: Option<String>,
    /// slrp's state directory (default `/var/lib/slrp`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Where the plugin containers run: `process` (local processes, default) or `agent`
    /// (the agent's standalone containers through its operator API, as the Mesos provider
    /// runs them; needs `--work-dir` to be the agent's work directory).
    #[arg(long, value_name = "process|agent")]
    plugin_backend: Option<String>,
    #[command(flatten)]
    admin: AdminArgs,
}

impl RunArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            agent: self.agent.clone(),
            agent_token_file: self.agent_token_file.clone(),
            work_dir: self.work_dir.clone(),
            state_dir: self.state_dir.clone(),
            resource_provider_config_dir: self.resource_provider_config_dir.clone(),
            disk_profiles: self.disk_profiles.clone(),
            plugin_backend: self.plugin_backend.clone(),
            ..self.admin.overrides()
        }
    }
}

/// Reads the configuration; the exit status on failure.
fn configure(args: &RunArgs) -> Result<DaemonConfig, ExitCode> {
    let file = match &args.config {
        Some(path) => DaemonConfigFile::load(path),
        None => Ok(DaemonConfigFile::default()),
    };
    let resolved = file.and_then(|file| DaemonConfig::resolve(file.apply(args.overrides())));
    if let Ok(config) = &resolved
        && config.manager_max_body_bytes.is_some()
    {
        // A setting that would do nothing is a mistake to point out, not to ignore.
        eprintln!(
            "error: '[manager] max_body_bytes' is for slrp standalone's embedded manager; slrp run talks to a Mesos agent, which sets no body limit (remove the setting)"
        );
        return Err(ExitCode::from(EX_CONFIG));
    }
    resolved.map_err(|e| {
        eprintln!("error: {}", DisplayChain(&e));
        match e {
            ConfigError::NoAgent | ConfigError::NoProviderDir => ExitCode::from(EX_USAGE),
            _ => ExitCode::from(EX_CONFIG),
        }
    })
}

/// Runs the daemon until a signal stops it.
pub(crate) fn run(args: &RunArgs) -> ExitCode {
    let config = match configure(args) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = match daemon_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let code = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        if let Err(e) = handle_signals(shutdown.clone()) {
            eprintln!("error: installing the signal handlers: {e}");
            return ExitCode::FAILURE;
        }
        tracing::info!(
            agent = %config.agent.endpoint,
            providers = config.providers.len(),
            state_dir = %config.state_dir.display(),
            work_dir = %config.work_dir.display(),
            "starting"
        );
        daemon_exit(slrp_provider::daemon::run(config, shutdown).await)
    });
    // Whatever was abandoned after the shutdown grace must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}
