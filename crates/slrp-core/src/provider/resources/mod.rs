//! Resource arithmetic of the storage local resource provider (spec §6, §7.3).
//!
//! Everything follows Mesos's `src/resource_provider/storage/provider.cpp`
//! (`createRawDiskResource`, `getStoragePools`, `getExistingVolumes`, `computeConversion`,
//! `reconcileResources`) and the parts of `src/common/resources.cpp` those rely on, so that
//! a provider built on it computes the same totals as a Mesos SLRP. Deliberate differences
//! are named on the function they concern.
//!
//! # Layout
//!
//! Mesos's `Resources`, which knows nothing of this provider:
//! - `resource`: one `Resource` as Mesos sees it: quantities in fixed point, equality
//!   ([`resource_eq`]), whether two merge or one subtracts from the other, the kind key,
//!   accessors on disk sources ([`is_storage_pool`], [`labels_from_context`]) and
//!   [`DisplayResource`].
//! - `algebra`: [`Resources`], the collection with Mesos's algebra (§6.9: add, subtract,
//!   contains, apply a [`Conversion`]).
//! - `index`: the kind index a large [`Resources`] keeps, so that an operation costs what
//!   it touches.
//!
//! The provider's arithmetic on top of it:
//! - `disks`: [`ProviderResources`] (provider id, vendor, default reservations, MOUNT
//!   root), raw disk resources (§6.1), storage pools (§6.2), existing volumes (§6.3),
//!   `computeConversion` (§6.4), reconciliation (§6.5), the conversions of finished
//!   CREATE_DISK and DESTROY_DISK, and the profile-set arithmetic of §7.3.
//!
//! The modules are private; everything public is re-exported here, so an item's path is
//! `slrp_core::provider::resources::Item`.

mod algebra;
mod disks;
mod index;
mod resource;

pub use algebra::{Conversion, Iter, Resources};
pub use disks::{
    ComputedConversion, CreatedKind, CreatedVolume, DestroyedDisk, ExistingVolumes, ProfileChange,
    ProviderResources, Reconciled, pool_profile_changes, pool_profiles, pools_without_profile,
};
pub use resource::{DisplayResource, is_storage_pool, labels_from_context, resource_eq};

/// Errors of the resource arithmetic.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// A conversion consumes resources the total does not hold (Mesos:
    /// "`<total>` does not contain `<consumed>`", where the reference provider aborts).
    #[error("resources {total} do not contain {consumed}")]
    NotContained {
        /// The resources the conversion was applied to.
        total: String,
        /// What the conversion consumes.
        consumed: String,
    },
    /// A plugin type or name that cannot be a single directory component of the MOUNT
    /// root (§6.8).
    #[error("plugin {field} {value:?} is not a single path component")]
    BadPluginName {
        /// `type` or `name`.
        field: &'static str,
        /// The offending value.
        value: String,
    },
    /// `default_reservations` is not a valid reservation stack (§6.7).
    #[error("default reservation {index} is invalid: {reason}")]
    BadReservation {
        /// Position in the stack, from the bottom.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}
