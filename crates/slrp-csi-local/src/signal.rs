//! Process signals that request shutdown.

use std::future::Future;
use std::io;

use tokio::signal::unix::{SignalKind, signal};

/// A future that resolves on the first SIGTERM or SIGINT.
///
/// # Errors
/// The signal handlers could not be installed.
pub fn shutdown_signal() -> io::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
