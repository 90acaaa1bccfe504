//! Serving CSI on a unix socket, and the shutdown protocol.
//!
//! Shutdown: when `shutdown` resolves the server stops accepting connections and
//! tells clients to go away (HTTP/2 GOAWAY); in-flight RPCs get [`SHUTDOWN_GRACE`] to
//! finish (they are idempotent, so an abandoned one is retried by the CO); then the
//! socket file is removed. Blocking work already handed to the thread pool finishes
//! before the runtime exits, so no metadata write is cut short by a clean shutdown.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::config::{Config, CsiVersion};
use crate::csi::{Shared, v0::CsiV0, v1::CsiV1};
use crate::faults::Faults;
use crate::host::{Host, RealHost};
use crate::plugin::{OpenError, Plugin};
use crate::tool::ToolRunner;

/// How long in-flight RPCs may run after shutdown is requested.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why the plugin could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The root could not be opened.
    #[error("opening the plugin")]
    Open(#[source] OpenError),
    /// The socket could not be prepared or bound.
    #[error("{op} socket {path}")]
    Socket {
        /// What was attempted.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("serving CSI")]
    Transport(#[source] tonic::transport::Error),
    /// The blocking open task failed.
    #[error("opening the plugin (task failed)")]
    Join(#[source] tokio::task::JoinError),
}

fn socket_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ServeError + 'a {
    move |source| ServeError::Socket {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Removes a stale socket left by a previous run; refuses to delete anything else.
fn clear_stale_socket(path: &Path) -> Result<(), ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(socket_err("removing stale", path))
        }
        Ok(_) => Err(socket_err("refusing to replace non-socket", path)(
            io::Error::from(io::ErrorKind::AlreadyExists),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(socket_err("inspecting", path)(e)),
    }
}

/// Serves the configured CSI package with the real host until `shutdown` resolves.
///
/// # Errors
/// See [`ServeError`].
pub async fn serve(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let host = RealHost::new(ToolRunner::from_env(config.tool_timeout));
    serve_with(config, host, shutdown).await
}

/// [`serve`] with a chosen [`Host`].
///
/// # Errors
/// See [`ServeError`].
pub async fn serve_with<H: Host>(
    config: Config,
    host: H,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let faults = Arc::new(Faults::new(config.faults_file.clone()));
    let open_cfg = config.clone();
    let plugin = tokio::task::spawn_blocking(move || Plugin::open(&open_cfg, host))
        .await
        .map_err(ServeError::Join)?
        .map_err(ServeError::Open)?;
    let shared = Shared {
        plugin: Arc::new(plugin),
        faults,
    };

    let path = &config.endpoint;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(socket_err("creating directory of", path))?;
    }
    clear_stale_socket(path)?;
    let listener = UnixListener::bind(path).map_err(socket_err("binding", path))?;
    let incoming = UnixListenerStream::new(listener);

    let mut builder = Server::builder();
    let router = match config.csi_version {
        CsiVersion::V1 => {
            use slrp_proto::csi::v1::{
                controller_server::ControllerServer, identity_server::IdentityServer,
                node_server::NodeServer,
            };
            let svc = CsiV1(shared);
            builder
                .add_service(IdentityServer::new(svc.clone()))
                .add_service(ControllerServer::new(svc.clone()))
                .add_service(NodeServer::new(svc))
        }
        CsiVersion::V0 => {
            use slrp_proto::csi::v0::{
                controller_server::ControllerServer, identity_server::IdentityServer,
                node_server::NodeServer,
            };
            let svc = CsiV0(shared);
            builder
                .add_service(IdentityServer::new(svc.clone()))
                .add_service(ControllerServer::new(svc.clone()))
                .add_service(NodeServer::new(svc))
        }
    };
    tracing::info!(endpoint = %path.display(), version = ?config.csi_version,
        node_id = %config.node_id, root = %config.root.display(), "serving CSI");

    let stop = CancellationToken::new();
    let server = router.serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned());
    tokio::pin!(server);
    let result = tokio::select! {
        res = &mut server => res.map_err(ServeError::Transport),
        () = shutdown => {
            tracing::info!("shutting down");
            stop.cancel();
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(res) => res.map_err(ServeError::Transport),
                Err(_) => {
                    tracing::warn!(grace = ?SHUTDOWN_GRACE, "in-flight requests did not finish in time");
                    Ok(())
                }
            }
        }
    };
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(endpoint = %path.display(), error = %e, "could not remove socket");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_sockets_are_removed_other_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(l);
        clear_stale_socket(&sock).unwrap();
        assert!(!sock.exists());
        clear_stale_socket(&sock).unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(clear_stale_socket(&file).is_err());
        assert!(file.exists());
    }
}
