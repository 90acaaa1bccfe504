//! slrp's resource provider and the daemon that runs it.
//!
//! # Overview
//!
//! A provider reports one CSI plugin's storage to a resource provider manager (a Mesos
//! agent, or slrp's embedded manager) as Mesos resources, and keeps that report true
//! (spec §2, §3, §6, §7.3). This crate wires the layers below into that: the plugin stack
//! of one provider (supervised plugin, CSI services prepared as Mesos prepares them, the
//! volume manager), the provider worker (lifecycle RECOVERING → … → READY, reconciliation,
//! UPDATE_STATE), the configuration in Mesos's formats, and the daemon that runs several
//! providers in one process (`slrp run`).
//!
//! # Layout
//!
//! - [`allocator`]: the process allocator the `slrp` binary installs
//!   ([`use_jemalloc!`](crate::use_jemalloc)).
//! - [`config`]: the daemon's configuration and the ResourceProviderInfo files of
//!   `--resource-provider-config-dir`, validated as Mesos validates them.
//! - [`workdir`]: the refusal to start on a work directory that holds a Mesos SLRP's
//!   checkpoints for the same plugin (lifted for what an import took over).
//! - [`import`]: `slrp import-mesos`, taking a Mesos SLRP's checkpoints over.
//! - [`metrics`]: per-provider metrics with Mesos's names (spec §9).
//! - [`persist`]: reading and writing the provider's whole durable state (the machine
//!   only stages changes and decodes records).
//! - [`persistent`]: removing a destroyed persistent volume's data (spec §5.3).
//! - [`publish`]: PUBLISH_RESOURCES: the volumes a publish names, published in parallel
//!   (spec §5.14).
//! - [`services`]: `prepareServices` (spec §4.4).
//! - [`stack`]: one provider's plugin stack (supervisor, version, services, volume manager).
//! - [`worker`]: the provider worker.
//! - [`health`]: the volume usage and health poller of each provider, its cache and its
//!   `slrp_volume_stats_*` metrics.
//! - [`daemon`]: the process: providers, admin endpoint, shutdown order.
//! - [`admin`]: the admin endpoint's HTTP server (metrics, health, readiness).

pub mod admin;
pub mod allocator;
pub mod config;
pub mod daemon;
pub mod health;
pub mod import;
pub mod metrics;
pub mod persist;
pub mod persistent;
pub mod publish;
pub mod services;
pub mod stack;
pub mod workdir;
pub mod worker;
