//! Helpers shared by the supervisor's test binaries.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use slrp_supervisor::{
    PluginSpec, ReadinessCheck, Supervisor, SupervisorConfig, SupervisorHandle, SupervisorMetrics,
};
use tokio_util::sync::CancellationToken;

/// Every wait of a test is bounded by this.
pub const WAIT: Duration = Duration::from_secs(20);

/// Whether a process with this pid exists and is not a zombie.
pub fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s[s.rfind(')').unwrap() + 2..].chars().next().unwrap();
            state != 'Z' && state != 'X'
        }
        Err(_) => false,
    }
}

/// Polls `f` every 10 ms until it holds, failing after [`WAIT`].
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts a supervisor that must start.
pub async fn start(
    spec: PluginSpec,
    cfg: SupervisorConfig,
    readiness: Arc<dyn ReadinessCheck>,
    metrics: &SupervisorMetrics,
) -> SupervisorHandle {
    Supervisor::start(
        spec,
        cfg,
        readiness,
        metrics.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap()
}
