//! What the two daemon commands (`slrp run`, `slrp standalone`) share: the runtime, the
//! signal handling and the exit status of the daemon's result.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use slrp_provider::config::Overrides;
use slrp_provider::daemon::DaemonError;
use slrp_types::DisplayChain;
use tokio_util::sync::CancellationToken;

/// `EX_CONFIG` from sysexits.h: a configuration error.
pub(crate) const EX_CONFIG: u8 = 78;

/// The flags of the admin endpoint and of the plugins' fate, alike in both daemon modes.
#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// The admin socket (default `<state dir>/admin.sock`).
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,
    /// Also serve the admin API on TCP at `HOST:PORT` (needs `--admin-token-file`).
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// A file holding the bearer token TCP clients of the admin API must send (never the
    /// token itself).
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// What happens to the plugins when slrp stops: `stop` them (default) or `leave` them
    /// running for the next slrp to adopt.
    #[arg(long, value_name = "stop|leave")]
    plugins_on_exit: Option<String>,
}

impl AdminArgs {
    /// These flags as config overrides (every other field unset).
    pub(crate) fn overrides(&self) -> Overrides {
        Overrides {
            admin_socket: self.admin_socket.clone(),
            admin_listen: self.admin_listen.clone(),
            admin_token_file: self.admin_token_file.clone(),
            plugins_on_exit: self.plugins_on_exit.clone(),
            ..Overrides::default()
        }
    }
}

/// The daemon's multi-threaded runtime, or the exit status when it cannot be built.
pub(crate) fn daemon_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("slrp")
        .build()
        .map_err(|e| {
            eprintln!("error: starting the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// Cancels `token` on the first SIGTERM or SIGINT; exits the process on the second.
pub(crate) fn handle_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            seen += 1;
            if seen == 1 {
                tracing::info!(signal = name, "stopping; a second signal forces the exit");
                token.cancel();
            } else {
                eprintln!("error: {name} again: exiting without a clean stop");
                std::process::exit(1);
            }
        }
    });
    Ok(())
}

/// The exit status of the daemon's end: 0 after a clean stop, 78 for a configuration or
/// state problem, 1 for a failure while running (the error is printed).
pub(crate) fn daemon_exit(result: Result<(), DaemonError>) -> ExitCode {
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", DisplayChain(&e));
            if e.is_config() {
                ExitCode::from(EX_CONFIG)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
