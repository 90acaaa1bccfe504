//! Serving CSI on a unix socket, and the shutdown protocol.
//!
//! Shutdown: when `shutdown` resolves the server stops accepting connections and
//! tells clients to go away (HTTP/2 GOAWAY); in-flight RPCs get [`SHUTDOWN_GRACE`] to
//! finish (they are idempotent, so an abandoned one is retried by the CO); then the
//! socket file is removed if it is still the one this process bound (see
//! [`crate::endpoint`]: one plugin per endpoint). Blocking work already handed to the thread pool finishes
//! before the runtime exits, so no metadata write is cut short by a clean shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::authority::FilteredStream;
use crate::config::{Config, CsiVersion};
use crate::csi::{Shared, v0::CsiV0, v1::CsiV1};
use crate::endpoint::{self, EndpointError, Liveness};
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
    /// The endpoint is served by another process, or could not be claimed.
    #[error("claiming the endpoint")]
    Endpoint(#[source] EndpointError),
    /// The gRPC server failed.
    #[error("serving CSI")]
    Transport(#[source] tonic::transport::Error),
    /// The blocking open task failed.
    #[error("opening the plugin (task failed)")]
    Join(#[source] tokio::task::JoinError),
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
    // Refuse early, before recovery touches the root, if the endpoint is taken; `claim`
    // checks again under the directory lock.
    if endpoint::probe(&config.endpoint)
        .await
        .map_err(ServeError::Endpoint)?
        == Liveness::Live
    {
        return Err(ServeError::Endpoint(EndpointError::InUse {
            path: config.endpoint.clone(),
        }));
    }
    let open_cfg = config.clone();
    let plugin = tokio::task::spawn_blocking(move || Plugin::open(&open_cfg, host))
        .await
        .map_err(ServeError::Join)?
        .map_err(ServeError::Open)?;
    let shared = Shared {
        faults: plugin.faults(),
        plugin: Arc::new(plugin),
    };

    let path = &config.endpoint;
    let (listener, claimed) = endpoint::claim(path).await.map_err(ServeError::Endpoint)?;
    // Every connection goes through the :authority filter, so clients that send the
    // socket path as :authority (grpc C-core, grpc-java) are served too.
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(FilteredStream::new));

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
    let mut claimed = Some(claimed);
    let result = tokio::select! {
        res = &mut server => res.map_err(ServeError::Transport),
        () = shutdown => {
            tracing::info!("shutting down");
            // The socket goes first, so new connections are refused at once while in-flight
            // requests finish here. A successor on another --root can bind at once; one on
            // this root waits for the root lock, which is released only when this process
            // exits.
            release(claimed.take()).await;
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
    release(claimed.take()).await;
    result
}

/// Gives the socket back (see [`endpoint::Claimed::release`]) off the async runtime.
async fn release(claimed: Option<endpoint::Claimed>) {
    if let Some(c) = claimed
        && let Err(e) = tokio::task::spawn_blocking(move || c.release()).await
    {
        tracing::warn!(error = %slrp_types::DisplayChain(&e), "releasing the socket failed");
    }
}
