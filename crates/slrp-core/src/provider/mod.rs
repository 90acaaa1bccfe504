//! The storage local resource provider's pure parts.
//!
//! # Overview
//!
//! The provider reports its storage to a resource provider manager as Mesos `Resource`s
//! (spec §6). This module holds the arithmetic behind that report, as pure functions over
//! the generated Mesos types: no I/O, no async. The driver (issue #10's provider worker)
//! calls the plugin (GetCapacity, ListVolumes), hands the answers to [`resources`] and sends
//! what comes back.
//!
//! # Layout
//!
//! - [`resources`]: the Mesos `Resources` algebra (§6.9), the provider context
//!   ([`resources::ProviderResources`]: provider id, vendor, default reservations, MOUNT
//!   root), raw disk resources (§6.1), storage pools (§6.2), existing volumes (§6.3),
//!   `computeConversion` (§6.4), reconciliation (§6.5) and the profile-set arithmetic of
//!   §7.3.
//!
//! # Invariants
//!
//! - Nothing here fails silently: a conversion that cannot be applied is an error, and
//!   every warning Mesos logs is returned to the caller as data.
//! - A reconciliation never removes resources that pending operations consume.
//!
//! See `docs/resources.md`.

pub mod resources;
