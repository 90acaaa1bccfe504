//! The storage local resource provider's decisions and arithmetic.
//!
//! # Overview
//!
//! The provider reports its storage to a resource provider manager as Mesos `Resource`s
//! (spec §6) and carries out the manager's operations (§5). Everything it decides lives
//! here; the driver (`slrp_provider::worker`) only carries out what [`machine`] asks for
//! (store commits, calls to the manager, CSI calls, timers) and feeds the results back.
//!
//! # Layout
//!
//! - [`machine`]: the provider machine: one step function over inputs (events, plugin
//!   answers, results, timer ticks) whose output is the store changes to commit and the
//!   effects to carry out once they are durable. It composes the modules below.
//! - [`lifecycle`]: the lifecycle states (§3.1) and what to do with each manager event in
//!   each state (§3.5 with the rules of §3.6), plus the bounded queue of events waiting
//!   for READY.
//! - [`apply`]: what an APPLY_OPERATION does (admission, conversions, CREATE_DISK and
//!   DESTROY_DISK plans, terminal statuses).
//! - [`operations`]: the tracked operations and their status streams (the status update
//!   manager, §8.5).
//! - [`ledger`]: what PENDING operations hold of the total, and the checks an operation
//!   passes against it before any CSI call (also when a deferred one resumes).
//! - [`publish`]: which volumes a PUBLISH_RESOURCES names.
//! - [`state`]: the durable provider state (identity, total resources, pool profiles) and
//!   its records (§3.3, §8.4).
//! - [`resources`]: the Mesos `Resources` algebra (§6.9), the provider context
//!   ([`resources::ProviderResources`]: provider id, vendor, default reservations, MOUNT
//!   root), raw disk resources (§6.1), storage pools (§6.2), existing volumes (§6.3),
//!   `computeConversion` (§6.4), reconciliation (§6.5) and the profile-set arithmetic of
//!   §7.3.
//!
//! # Invariants
//!
//! - Nothing here does I/O or is async: [`machine`] and what it calls stage records into
//!   [`slrp_store::Changes`] and return effects, and the records a driver read are decoded
//!   here ([`state::ProviderState::from_stored`], [`operations::operations_of`]). Reading
//!   and writing the store, and removing a destroyed persistent volume's data, is the
//!   driver's (`slrp_provider::persist`, `slrp_provider::persistent`).
//! - Nothing here fails silently: a conversion that cannot be applied is an error, and
//!   every warning Mesos logs is returned to the caller as data or logged with its cause.
//! - A reconciliation never removes resources that pending operations consume.
//!
//! See `docs/provider.md` and `docs/resources.md`.

pub mod apply;
pub mod ledger;
pub mod lifecycle;
pub mod machine;
pub mod operations;
pub mod publish;
pub mod resources;
pub mod state;
