//! slrp's bundled CSI plugin: node-local volumes backed by directories or loop devices.
//!
//! # Overview
//! `slrp-csi-local` serves the CSI Identity, Controller and Node services over a unix
//! socket, as `csi.v1` or (with `--csi-version v0`) as `csi.v0`. Volumes come from pools
//! configured on the command line and are either a directory (`dir`, MOUNT access) or a
//! sparse image file attached as a loop device (`loop`, MOUNT with ext4/xfs or BLOCK).
//! Snapshots are full copies of a volume's data (reflinked where the file system can),
//! accounted against its pool; CreateVolume restores one or clones a volume.
//! Fault injection (`--faults-file`) lets the provider's tests make RPCs slow, fail or crash
//! the plugin (also in the middle of a copy). `docs/csi-local.md` describes the behaviour
//! per RPC, the consistency of copies and the on-disk layout.
//!
//! # Layout
//! - [`config`]: command line ([`Args`]) and validated [`Config`];
//! - [`plugin`]: the version-agnostic core ([`Plugin`]), all CSI rules and error codes:
//!   shared state and recovery in `plugin/mod.rs`, the Controller service in
//!   `plugin/controller.rs`, snapshots, restores and clones in `plugin/snapshot.rs`, the
//!   Node service in `plugin/node.rs` (Identity needs no core state: the adapters in `csi`
//!   answer it);
//! - [`types`]: the core's request and response types;
//! - [`host`]: mounts, loop devices, mkfs, freezes and data copies behind the [`Host`]
//!   trait ([`RealHost`]);
//! - [`copy`]: copying an image or a tree as `cp -a --reflink=auto --sparse=always` would;
//! - [`tool`]: running external tools with a timeout, killing their process group
//!   ([`ToolRunner`]);
//! - `store`: crash-safe per-volume and per-snapshot records and the root lock;
//! - `ids`: volume and snapshot id, import name and CO path validation;
//! - [`faults`]: the fault-injection rules file;
//! - `csi`: thin v0 and v1 tonic adapters;
//! - [`authority`]: an HTTP/2 frame filter that repairs the `:authority` of clients that
//!   send the socket path there (grpc C-core, grpc-java), so any gRPC client can call;
//! - [`endpoint`]: claiming the socket (one plugin per endpoint) and giving it back;
//! - [`server`]: serving and shutdown; [`shutdown_signal`].
//! - `fuzzing` (hidden): the CSI services on a request's bytes, for the fuzz targets of
//!   `crates/slrp-fuzz`.
//!
//! # Invariants
//! - No request string becomes a path component unless it passed the id check (volume and
//!   snapshot ids are `[A-Za-z0-9._-]`, at most 128 bytes, not starting with a dot); volume
//!   and snapshot names never do. CO paths must be absolute without `..`.
//! - A volume or snapshot record is durable before the storage it describes exists (before
//!   a copy starts) and removed only after that storage is gone; interrupted creations and
//!   copies are rolled back at start, so a crash at any point leaves no half-created volume
//!   or snapshot visible.
//! - A snapshot takes its source's size from the source's pool for as long as it exists;
//!   a copy never leaves its source's pool.
//! - A file system frozen for a copy is recorded first and thawed after it, or at the next
//!   start if the plugin died meanwhile; only a loop volume's own mount is ever frozen
//!   (the real host checks the mount is on the volume's device).
//! - A loop volume is formatted at most once (recorded in its metadata); an image that
//!   already carries a file system is never formatted. An mkfs records its intent first, so
//!   one that was interrupted is redone (forced) rather than its partial result adopted.
//! - Every external tool runs under `--tool-timeout` in its own process group; on timeout
//!   the group is killed and the request fails with DEADLINE_EXCEEDED. No tool outlives
//!   the call that started it (except one stuck in uninterruptible I/O, which is reaped in
//!   the background once it dies).
//! - One process per root (`flock` on `<root>/lock`) and one per endpoint: a live socket
//!   is never taken over, and only the process that bound a socket removes it.
//! - A volume's context never changes (CSI: "SHALL NOT be mutable"): it holds only facts
//!   fixed at creation.
//! - CSI secrets are ignored and requests never logged; mount flags (which may carry
//!   secrets) appear in no log line or status message (`ToolRunner::run_redacted`).
//! - Error codes follow the CSI spec's tables and csi-sanity's expectations;
//!   `docs/csi-local.md` ("Conformance") maps every csi-sanity case to its test.
//!
//! # Limitations
//! - `dir` volumes are not size-limited: their size is accounted against the pool only.
//! - No ControllerPublish, topology, ModifyVolume or multi-node access modes.
//! - Snapshots and clones are full copies, made within the RPC under the controller lock:
//!   without reflinks they cost the data's space and copy time. Only a mounted loop file
//!   system is frozen for a copy: a copy of a BLOCK or dir volume with writers running is
//!   not consistent, and dir copies drop extended attributes and ACLs. Imported volumes
//!   cannot be snapshotted or cloned.
//! - LIST_VOLUMES_PUBLISHED_NODES is not advertised (the spec ties it to
//!   PUBLISH_UNPUBLISH_VOLUME, which a node-local plugin does not serve), though
//!   `published_node_ids` names this node while a volume is staged or published here.
//! - A tool stuck in uninterruptible I/O ignores SIGKILL: the request returns after the
//!   timeout, but the device may stay busy until the kernel lets the process go.

pub mod authority;
pub mod config;
pub mod copy;
mod csi;
pub mod endpoint;
pub mod error;
pub mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
mod ids;
pub mod plugin;
pub mod server;
mod signal;
mod store;
pub mod tool;
pub mod types;

pub use config::{Args, Config, CsiVersion};
pub use endpoint::EndpointError;
pub use error::VolumeError;
pub use host::{Host, RealHost};
pub use plugin::Plugin;
pub use server::{ServeError, serve, serve_with};
pub use signal::shutdown_signal;
pub use store::StoreError;
pub use tool::ToolRunner;
