//! slrp's core: the state machines of the provider and the managers that drive them.
//!
//! # Overview
//!
//! The core is split into a pure part (state machines that take a state and return the
//! next one plus what to do, without I/O) and drivers that do the I/O, having made the
//! intent durable first (conventions §4.6). This crate holds the volume state machine and
//! the volume manager that drives it through CSI (`slrp_csi::CsiVolumes`) with the state
//! in `slrp_store`. See `docs/state-machines.md` and `docs/volume-manager.md`.
//!
//! # Layout
//!
//! - [`volume`]: [`volume::state`] (the pure volume state machine and the durable
//!   [`volume::VolumeRecord`]), [`volume::paths`] (volume id ↔ mount directory),
//!   [`volume::manager`] (the worker; with private modules beside it for the handle,
//!   per-volume lanes and the create gate, the jobs, the durable driver loop, recovery
//!   and mount-directory cleanup), [`volume::plan`] (recovery planning as one pure
//!   function), [`volume::host`] (boot id, mount table, secrets) and [`volume::error`].
//! - [`provider`]: [`provider::resources`], the provider's resource arithmetic (resource
//!   shapes, storage pools, pre-existing volumes, Mesos's `computeConversion` and the
//!   `Resources` algebra), pure; the provider's driver comes with issue #10.
//! - [`warn_once`]: [`warn_once::WarnOnChange`], a warning that would repeat at every
//!   reconciliation, let through once per change.
//!
//! # Invariants
//!
//! - State machine functions never perform I/O and never mutate on error: fallible
//!   transitions take `&self` and return the new state.
//! - Matches on state and call enums have no wildcard arms (the lint below), so a new
//!   variant breaks compilation wherever it matters.
//! - No volume id maps to a path outside its mount root.
//! - An in-flight state (and a CreateVolume intent) is durable before its RPC is sent; the
//!   manager's in-memory records always equal what is durable.
//! - One job per volume at a time; a caller hears an answer only after the state change
//!   it implies is applied.
//! - A CreateVolume of an untracked name never runs at the same time as a job for an
//!   untracked volume id (the id it returns may be that one).
//!
//! # Limitations
//!
//! - No metrics yet (volumes by state, job latency).
//! - Readiness reports a failed republish; retrying recovery is the caller's decision.

#![warn(clippy::wildcard_enum_match_arm)]

pub mod provider;
pub mod volume;
pub mod warn_once;
