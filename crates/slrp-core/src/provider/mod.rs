//! The storage local resource provider's pure parts.
//!
//! # Overview
//!
//! The provider reports its storage to a resource provider manager as Mesos `Resource`s
//! (spec §6). This module holds the arithmetic behind that report, as pure functions over
//! the generated Mesos types: no I/O, no async (only [`state`] reads and writes the store).
//! The driver (issue #10's provider worker)
//! calls the plugin (GetCapacity, ListVolumes), hands the answers to [`resources`] and sends
//! what comes back; [`lifecycle`] tells it what each event means in each state, and
//! [`state`] is what it keeps across restarts.
//!
//! # Layout
//!
//! - [`lifecycle`]: the lifecycle states (§3.1) and what to do with each manager event in
//!   each state (§3.5 with the rules of §3.6), plus the bounded queue of events waiting
//!   for READY.
//! - [`state`]: the durable provider state (identity, total resources, pool profiles), one
//!   store record keyed by the agent id (§3.3, §8.4).
//! - [`ledger`]: what PENDING operations hold of the total, and the checks an operation
//!   passes against it before any CSI call (also when a deferred one resumes).
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

pub mod apply;
pub mod ledger;
pub mod lifecycle;
pub mod machine;
pub mod operations;
pub mod persistent;
pub mod publish;
pub mod resources;
pub mod state;
