//! How the supervisor decides that a plugin is ready and healthy.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use slrp_csi::{ClientConfig, CsiClient, CsiEndpoint, CsiMetrics};
use slrp_types::DisplayChain;

/// Result of one readiness check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Serving.
    Ready,
    /// Answering, but not ready yet (CSI `Probe` with `ready = false`).
    NotReady,
    /// Not answering properly.
    Failed(String),
}

/// A boxed future returned by [`ReadinessCheck::check`].
pub type CheckFuture<'a> = Pin<Box<dyn Future<Output = Readiness> + Send + 'a>>;

/// Checks a plugin at its socket. The supervisor calls it until ready at start, then
/// periodically for health. A seam so process supervision can be tested with plain
/// scripts; production uses [`CsiProbe`].
pub trait ReadinessCheck: Send + Sync + 'static {
    /// Checks the plugin listening on `socket`.
    fn check<'a>(&'a self, socket: &'a Path) -> CheckFuture<'a>;
}

/// Readiness through CSI `Probe` (detecting v1/v0 on first use, as Mesos does).
#[derive(Debug)]
pub struct CsiProbe {
    timeout: Duration,
    metrics: CsiMetrics,
    /// One client per socket, so the detected version and the connection are reused.
    clients: Mutex<HashMap<PathBuf, CsiClient>>,
}

impl CsiProbe {
    /// A prober whose probes time out after `timeout`, recorded in `metrics`.
    pub fn new(timeout: Duration, metrics: CsiMetrics) -> Arc<Self> {
        Arc::new(Self {
            timeout,
            metrics,
            clients: Mutex::new(HashMap::new()),
        })
    }

    fn client(&self, socket: &Path) -> Result<CsiClient, String> {
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| "probe client cache poisoned".to_owned())?;
        if let Some(c) = clients.get(socket) {
            return Ok(c.clone());
        }
        let endpoint = CsiEndpoint::from_path(socket).map_err(|e| e.to_string())?;
        let cfg = ClientConfig::default().rpc_timeout(self.timeout);
        let c = CsiClient::new(endpoint, cfg, self.metrics.clone()).map_err(|e| e.to_string())?;
        clients.insert(socket.to_owned(), c.clone());
        Ok(c)
    }
}

impl ReadinessCheck for CsiProbe {
    fn check<'a>(&'a self, socket: &'a Path) -> CheckFuture<'a> {
        Box::pin(async move {
            let client = match self.client(socket) {
                Ok(c) => c,
                Err(e) => return Readiness::Failed(e),
            };
            match client.probe().await {
                Ok(p) if p.ready => Readiness::Ready,
                Ok(_) => Readiness::NotReady,
                Err(e) => Readiness::Failed(DisplayChain(&e).to_string()),
            }
        })
    }
}
