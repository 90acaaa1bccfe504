//! What the admin API can do on an operator's behalf in standalone mode, through the
//! embedded manager: the manager plays agent and master, so an operator's create, destroy
//! and publish go the way a framework's operations would (`slrp standalone` implements
//! [`ManagerActions`] over `slrp_manager::ManagerHandle`; this crate does not depend on the
//! manager).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use axum::http::StatusCode;
use prometheus_client::registry::Registry;

use super::api::{CreateDisk, DestroyDisk, ErrorBody, OperationSummary, VolumeRef};

/// A boxed future, as the object-safe trait methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A refused or failed action: the HTTP status and the body the admin API answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionError {
    /// 400 (a bad field), 404 (unknown provider, profile or volume), 409 (not enough free
    /// space, a volume in use), 503 (the provider is not READY), 504 (the wait timed out),
    /// 500.
    pub status: StatusCode,
    /// What to tell the operator.
    pub body: ErrorBody,
}

impl ActionError {
    /// An error without a field.
    #[must_use]
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: error.into(),
                field: None,
            },
        }
    }

    /// An error naming the request field that was wrong.
    #[must_use]
    pub fn field(status: StatusCode, field: &str, error: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: error.into(),
                field: Some(field.to_owned()),
            },
        }
    }
}

/// The embedded manager's side of the admin API (standalone mode only).
pub trait ManagerActions: Send + Sync + 'static {
    /// CREATE_DISK from the pool of `request.profile` (a RAW resource of that profile
    /// with no id, split to `size_bytes` rounded up to MiB), applied through the
    /// manager with the provider's current resource version. Answers at once with the
    /// PENDING operation, or with its terminal record when `request.wait`.
    fn create_disk(
        &self,
        request: CreateDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>>;

    /// CREATE_DISK of the RAW disk `volume_id` the provider offers without a profile (a
    /// restore or clone the volume manager just created), to `request.profile` as
    /// `target_profile`: the provider validates the volume against the profile and turns
    /// it into a MOUNT or BLOCK disk. Answers as [`Self::create_disk`].
    fn adopt_disk(
        &self,
        request: CreateDisk,
        volume_id: String,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>> {
        let _ = (request, volume_id);
        Box::pin(async {
            Err(ActionError::new(
                StatusCode::NOT_IMPLEMENTED,
                "creating a disk from a snapshot or a disk is not offered here",
            ))
        })
    }
    /// DESTROY_DISK of the disk resource whose `disk.source.id` is `request.volume_id`.
    fn destroy_disk(
        &self,
        request: DestroyDisk,
    ) -> BoxFuture<'_, Result<OperationSummary, ActionError>>;

    /// PUBLISH_RESOURCES of the disk resource whose `disk.source.id` is
    /// `request.volume_id`, as an agent does before a task starts.
    fn publish(&self, request: VolumeRef) -> BoxFuture<'_, Result<(), ActionError>>;

    /// The operations the manager (as agent and master) knows, terminal ones included
    /// for a while after their acknowledgement.
    fn operations(&self) -> BoxFuture<'_, Vec<OperationSummary>>;

    /// The manager's Mesos-named metrics (`resource_provider_manager/…`), for
    /// `/metrics/snapshot`.
    fn snapshot(&self) -> BTreeMap<String, f64>;

    /// Registers the manager's metrics for `/metrics`.
    fn register_metrics(&self, registry: &mut Registry);
}
