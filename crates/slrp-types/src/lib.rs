//! Shared domain types and pure helpers of slrp: the one home of pieces several crates need.
//!
//! # Overview
//! Everything here is a type or a pure computation that more than one layer uses: how an
//! error is printed with its causes, how a file is replaced crash-safely, the kernel boot
//! id, gRPC code names, size strings, the backoff schedule, the provider key profiles are
//! selected by, what a profile translates to, and volume capabilities with their Mesos and
//! CSI conversions. Crates above re-export what is part of their own API (e.g.
//! `slrp_csi::VolumeCapability`), so callers need not know the home.
//!
//! # Layout
//! - [`chain`]: [`DisplayChain`], `outer: cause: root cause` for logs and messages.
//! - [`atomic`]: [`write_atomic`] and [`AtomicWrite`], the one crash-safe file writer
//!   (temporary file, fsync, rename, fsync of the directory) every durable file outside the
//!   state store goes through.
//! - [`boot`]: [`BootId`] and [`read_boot_id`].
//! - [`grpc`]: [`parse_code`] (gRPC code names).
//! - [`size`]: [`parse_size`], [`format_size`] (`64MiB`, `10GiB`, `1G`, `1.5GiB`).
//! - [`backoff`]: [`Backoff`], [`Jitter`], [`JitterRng`] (full-jitter exponential).
//! - [`provider`]: [`ProviderKey`], what profile selectors match.
//! - [`profile`]: [`ProfileInfo`], what a profile translates to.
//! - [`id`]: [`validate_id`], Mesos's rules for IDs that name directories.
//! - [`operation`]: [`is_terminal_state`], Mesos's terminal operation states.
//! - [`capability`]: [`VolumeCapability`] and its Mesos / CSI v0 / CSI v1 conversions.
//! - [`token`]: [`read_token_file`], the one reader of bearer token files.
//!
//! # Invariants
//! - No tokio and no async: nothing here waits. The only I/O is reading the boot id, one
//!   small file under `/proc`, and a token file, done synchronously because each happens
//!   once at start-up (or once per `slrp ctl` run), and replacing a file with
//!   [`write_atomic`], synchronous `std` I/O that async callers run in `spawn_blocking`.
//! - Wire types come from `slrp-proto` (which links tonic, and so tokio, into the graph:
//!   accepted, since every user of this crate already links both; this crate's own code
//!   uses neither runtime). `tonic` is used only for its `Code` enum.
//! - Conversions never substitute: a value a target form cannot carry is an error.
//!
//! # Limitations
//! - The CSI v1 `volume_mount_group` field is not modelled (nothing in Mesos sets it).

pub mod atomic;
pub mod backoff;
pub mod boot;
pub mod capability;
pub mod chain;
pub mod grpc;
pub mod id;
pub mod operation;
pub mod profile;
pub mod provider;
pub mod size;
pub mod token;

pub use atomic::{AtomicWrite, AtomicWriteError, AtomicWriteStep, sync_dir, write_atomic};
pub use backoff::{
    Backoff, BackoffError, Jitter, JitterRng, MESOS_BACKOFF_BASE, MESOS_BACKOFF_MAX,
};
pub use boot::{BOOT_ID_FILE_ENV, BOOT_ID_PATH, BootId, read_boot_id};
pub use capability::{AccessMode, AccessType, CapabilityError, CapabilityForm, VolumeCapability};
pub use chain::DisplayChain;
pub use grpc::parse_code;
pub use id::{IdError, validate_id};
pub use operation::is_terminal_state;
pub use profile::ProfileInfo;
pub use provider::ProviderKey;
pub use size::{SizeError, format_size, parse_size};
pub use token::{TokenFileError, read_token_file};

#[cfg(test)]
mod tests {
    /// The crate stays free of async: no runtime among its direct dependencies (see the
    /// crate docs for why the transitive one through `slrp-proto` is accepted).
    #[test]
    fn no_async_runtime_is_a_direct_dependency() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .expect("a [dependencies] table");
        for line in deps.lines().map(str::trim) {
            for banned in ["tokio", "futures", "async-"] {
                assert!(!line.starts_with(banned), "slrp-types depends on {line:?}");
            }
        }
        assert!(deps.contains("slrp-proto"), "the table was found: {deps}");
    }
}
