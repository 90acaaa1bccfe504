//! The CSI client layer of slrp: slrp's only window onto CSI plugins.
//!
//! # Overview
//! [`CsiClient`] talks to one plugin endpoint (a unix socket) and offers one typed,
//! version-neutral API (the domain types in [`types`]). Behind it, calls go to `csi.v1`
//! or `csi.v0` (0.2 and 0.3 plugins): the version is detected on first use by probing v1
//! and then v0 on `UNIMPLEMENTED` (as Mesos does, spec §4.1.5) or forced by
//! [`ClientConfig::version`]. Every attempt has a deadline ([`DEFAULT_RPC_TIMEOUT`]),
//! is counted in [`CsiMetrics`] with Mesos's semantics. A call is one attempt: the client
//! never retries. Callers that do (the volume manager, `slrp csi --retries`) run their
//! calls through the one loop, [`retry()`], under a per-RPC [`RetryPolicy`] (by default
//! Mesos's: `CreateVolume` and `DeleteVolume` on `DEADLINE_EXCEEDED`/`UNAVAILABLE`,
//! jittered exponential backoff 10 s … 10 min), so no call is retried at two layers.
//!
//! # Layout
//! - [`answer`]: the checks every plugin answer passes ([`AnswerLimits`], [`Violation`],
//!   [`ListingBudget`]): one place, before anything is stored or used.
//! - [`client`]: [`CsiClient`], [`ClientConfig`], version detection, the attempt wrapper.
//! - [`types`]: domain types (volumes, capabilities, requests, results).
//! - [`error`]: [`CsiError`], [`CsiRpc`], [`RetryClass`] and the code classification.
//! - [`retry`](mod@retry): [`RetryPolicy`], [`RetryConfig`] and the [`retry()`] loop, for
//!   the client's callers (backoff bounds and jitter come from `slrp_types::backoff` and
//!   are re-exported).
//! - Capability types ([`VolumeCapability`], [`AccessMode`], [`AccessType`]) and their
//!   wire conversions live in `slrp-types` and are re-exported through [`types`].
//! - [`metrics`]: [`CsiMetrics`] (pending/finished/failed/cancelled, latency).
//! - [`endpoint`]: endpoint parsing, the `sun_path` limit and [`SocketAlias`].
//! - [`readiness`]: [`EndpointReadiness`] (a supervised endpoint's status, waited on
//!   before each attempt of a [`CsiClient::managed`] client) and [`CsiServices`]
//!   (controller calls to the controller's container, node calls to the node's).
//! - [`volumes`]: [`CsiVolumes`], the trait the volume manager is generic over.
//! - `v0`, `v1`: the per-version backends (private).
//!
//! # Invariants
//! - Nothing outside this crate sees `tonic` or `csi.v0`/`csi.v1` types.
//! - Nothing outside this crate sees an answer [`answer`] has not checked: a refused one
//!   is a [`CsiError::InvalidResponse`] naming the rule.
//! - The version of a client never changes once detected; a plugin that later answers
//!   with another version gets `UNIMPLEMENTED` errors, not silent re-detection.
//! - Every attempt sent ends in exactly one of finished/failed/cancelled (drop guard);
//!   one refused before sending (`Unsupported`) counts nowhere.
//! - Cancellation ([`ClientConfig::cancel`]) ends an attempt at once.
//! - The client makes one attempt per call; only [`retry()`] retries.
//! - A managed client sends nothing while its endpoint is down; the wait counts against
//!   the attempt's deadline and ends in [`CsiError::NotReady`] (nothing sent).
//!
//! # Limitations
//! - No snapshots, topology requirements, or `ControllerModifyVolume`; `ControllerGetVolume`
//!   and the conditions of `ListVolumes` are read for volume health only.
//! - A request that needs a v1-only feature fails with [`CsiError::Unsupported`] against a
//!   v0 plugin instead of being degraded silently.
//! - Retries cover whole RPCs; there is no per-plugin retry budget or circuit breaker.

pub mod answer;
pub mod client;
pub mod endpoint;
pub mod error;
pub mod metrics;
pub mod readiness;
pub mod retry;
pub mod types;
mod v0;
mod v1;
pub mod volumes;

pub use answer::{AnswerLimits, ListingBudget, Violation};
pub use client::{ClientConfig, CsiClient, DEFAULT_RPC_TIMEOUT, VersionSelect};
pub use endpoint::{CsiEndpoint, MAX_SOCKET_PATH, SocketAlias};
pub use error::{CsiError, CsiRpc, RetryClass};
pub use metrics::CsiMetrics;
pub use readiness::{CsiServices, EndpointReadiness, EndpointStatus};
pub use retry::{Backoff, Jitter, RetryConfig, RetryPolicy, retry, retry_observed};
pub use types::*;
pub use volumes::CsiVolumes;

/// gRPC status codes, as used by [`RetryPolicy::retry_on`] and [`CsiError::code`].
pub use tonic::Code;
