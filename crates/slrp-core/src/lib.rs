//! slrp's core: the state machines of the provider and the managers that drive them.
//!
//! # Overview
//!
//! The core is split into a pure part (state machines that take a state and return the
//! next one plus what to do, without I/O) and drivers that do the I/O, having made the
//! intent durable first (conventions §4.6). This crate currently holds the volume state
//! machine; the volume manager that drives it through CSI comes with the CSI client layer.
//!
//! # Layout
//!
//! - [`volume`]: [`volume::state`] (the pure volume state machine and the durable
//!   [`volume::VolumeRecord`]) and [`volume::paths`] (volume id ↔ mount directory).
//!
//! # Invariants
//!
//! - State machine functions never perform I/O and never mutate on error: fallible
//!   transitions take `&self` and return the new state.
//! - Matches on state and call enums have no wildcard arms (the lint below), so a new
//!   variant breaks compilation wherever it matters.
//! - No volume id maps to a path outside its mount root.
//!
//! # Limitations
//!
//! - The volume manager (async driver, recovery, per-volume serialization) is not here yet.

#![warn(clippy::wildcard_enum_match_arm)]

pub mod volume;
