//! Thin CSI adapters: proto ⇄ [`crate::types`], fault injection, and blocking work off the
//! async runtime. One module per CSI package; the logic lives in [`crate::Plugin`].

use std::sync::Arc;

use tonic::Status;

use crate::error::VolumeError;
use crate::faults::{Fault, Faults, ListEdit};
use crate::host::Host;
use crate::plugin::Plugin;
use crate::types::{AccessMode, AccessType, Capability, CapacityRange};

pub(crate) mod v0;
pub(crate) mod v1;

/// Version of this crate, reported as `vendor_version`.
pub(crate) const VENDOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// State shared by every service of one CSI package.
#[derive(Debug)]
pub(crate) struct Shared<H: Host> {
    pub(crate) plugin: Arc<Plugin<H>>,
    pub(crate) faults: Arc<Faults>,
}

impl<H: Host> Clone for Shared<H> {
    fn clone(&self) -> Self {
        Self {
            plugin: Arc::clone(&self.plugin),
            faults: Arc::clone(&self.faults),
        }
    }
}

fn join_error(e: tokio::task::JoinError) -> Status {
    tracing::error!(error = %slrp_types::DisplayChain(&e), "request task failed");
    Status::internal(format!("request task failed: {e}"))
}

impl<H: Host> Shared<H> {
    /// Applies fault injection for `rpc`; `Err` is the injected failure, `Ok` what to
    /// change in a ListVolumes answer.
    pub(crate) async fn enter(&self, rpc: &'static str) -> Result<ListEdit, Status> {
        tracing::debug!(rpc, "request");
        let faults = Arc::clone(&self.faults);
        let fault = tokio::task::spawn_blocking(move || faults.take(rpc))
            .await
            .map_err(join_error)?;
        let delay = match &fault {
            Fault::Proceed { delay, .. } | Fault::Fail { delay, .. } | Fault::Exit { delay } => {
                *delay
            }
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        match fault {
            Fault::Proceed { edit, .. } => Ok(edit),
            Fault::Fail { code, message, .. } => Err(Status::new(code, message)),
            Fault::Exit { .. } => {
                tracing::warn!(rpc, "fault injection: exiting without replying");
                // A crash as the CO would see it: no reply, no cleanup.
                std::process::exit(1)
            }
        }
    }

    /// One ListVolumes page, altered as the fault rules say.
    pub(crate) async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> Result<crate::types::VolumePage, Status> {
        let edit = self.enter("ListVolumes").await?;
        let mut page = self
            .run(move |p| p.list_volumes(max_entries, &starting_token))
            .await?;
        page.entries = edit.apply(page.entries);
        Ok(page)
    }

    /// Runs blocking plugin work off the async runtime.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Plugin<H>) -> Result<T, VolumeError> + Send + 'static,
    {
        let plugin = Arc::clone(&self.plugin);
        tokio::task::spawn_blocking(move || f(&plugin))
            .await
            .map_err(join_error)?
            .map_err(Status::from)
    }
}

pub(crate) fn range(required_bytes: i64, limit_bytes: i64) -> CapacityRange {
    CapacityRange {
        required_bytes,
        limit_bytes,
    }
}

/// Builds a domain capability from the parts both CSI packages share.
pub(crate) fn capability(
    field: &'static str,
    access: Option<AccessType>,
    mode: Option<AccessMode>,
) -> Result<Capability, Status> {
    let access = access
        .ok_or_else(|| Status::from(VolumeError::invalid(field, "access_type is missing")))?;
    let mode = mode.ok_or_else(|| {
        Status::from(VolumeError::invalid(
            field,
            "access_mode is missing or UNKNOWN",
        ))
    })?;
    Ok(Capability { access, mode })
}
