//! Disk profiles for slrp: Mesos's URI disk profile adaptor, done as a tokio component.
//!
//! # Overview
//! A disk profile maps a name ("fast", "gold") to a CSI volume capability and `CreateVolume`
//! parameters; providers expose one storage pool per profile. Profiles come from a document
//! in the format of Mesos's URI disk profile adaptor (`DiskProfileMapping` in JSON), read from
//! a local file, an `http://` or `https://` URL, or inline from slrp's own configuration.
//! HTTPS uses rustls (ring provider) and verifies the server against the system trust store,
//! or only against a configured `ca_file` bundle. The adaptor polls
//! the source, validates what it gets, enforces Mesos's rule that a profile never changes
//! meaning under its name, and tells each provider which profiles apply to it, selected by
//! provider type and name or by CSI plugin type.
//!
//! ```
//! use slrp_profiles::{Metrics, ProfileSource, ProfilesConfig, ProviderKey, spawn};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let document = serde_json::json!({"profile_matrix": {"fast": {
//!     "csi_plugin_type_selector": {"plugin_type": "local"},
//!     "volume_capabilities": {"mount": {"fs_type": "ext4"},
//!                             "access_mode": {"mode": "SINGLE_NODE_WRITER"}}}}});
//! let config = ProfilesConfig::new(ProfileSource::Inline(document));
//! let cancel = CancellationToken::new();
//! let (profiles, task) = spawn(config, Metrics::default(), cancel.clone());
//!
//! let me = ProviderKey::new("org.apache.mesos.rp.local.storage", "local", Some("local".into()));
//! let mut view = profiles.subscribe(me.clone()).await.unwrap();
//! view.wait_for(|v| v.contains_key("fast")).await.unwrap();
//! let fast = profiles.translate("fast", &me).await.unwrap();
//! assert!(fast.parameters.is_empty());
//!
//! cancel.cancel();
//! task.await.unwrap();
//! # }
//! ```
//!
//! # Layout
//! - [`document`]: the JSON format, validation, and the domain types ([`ProfileInfo`],
//!   [`Manifest`], [`Selector`], [`ProviderKey`]).
//! - `lenient`: the JSON dialect Mesos reads documents in (protobuf's parser), rewritten to
//!   strict JSON with positions kept.
//! - [`table`]: the pure table of every profile ever seen and the update rules.
//! - [`source`]: where documents come from and how they are fetched (file, HTTP, HTTPS with
//!   its trust roots).
//! - [`config`]: raw and validated configuration, duration parsing.
//! - [`adaptor`]: the worker task and its handle (subscribe, translate, poll, status).
//! - [`metrics`]: the adaptor's prometheus metrics.
//! - `persist`: the crash-safe state file with the last good table.
//! - `fuzzing` (hidden): entry points for the fuzz targets of `crates/slrp-fuzz`.
//!
//! # Invariants
//! - A name, once seen, keeps its capability and parameters forever (also across restarts,
//!   because inactive entries are persisted too). A changed definition is reported and
//!   ignored; its selector may change.
//! - A failed fetch, a malformed or invalid document, or an unreadable state file never
//!   clears or alters the table; the last good mapping stays in force.
//! - Watchers only ever see active profiles that apply to them; every change reaches them,
//!   at most `max_random_wait` late.
//!
//! # Limitations
//! - HTTPS: server authentication only (no client certificates), no proxies, no redirects.
//!   The trust roots are loaded on the first https fetch and kept once that succeeds, so a
//!   replaced `ca_file` takes effect at the next restart (a missing or broken one is retried
//!   on every poll).
//! - A capability with neither `mount` nor `block` is accepted, as in Mesos; the plugin will
//!   reject volumes created with it.
//! - A failed state file write is reported but not fatal: the running adaptor is unaffected,
//!   only the next restart starts from an older table.
//! - See docs/profiles.md for the differences from Mesos.

pub mod adaptor;
pub mod config;
pub mod document;
#[doc(hidden)]
pub mod fuzzing;
mod lenient;
pub mod metrics;
mod persist;
pub mod source;
pub mod table;

pub use adaptor::{
    AdaptorStopped, PollOutcome, ProfileAdaptorHandle, ProfileAdaptorWorker, ProfileStatus,
    ProfileView, StatusSnapshot, UpdateError, spawn,
};
pub use config::{ConfigError, ProfilesConfig, ProfilesConfigFile};
pub use document::{
    DocumentError, JsonSyntaxError, Manifest, ProfileInfo, ProfileMapping, ProviderKey,
    ProviderRef, Selector,
};
pub use metrics::Metrics;
pub use persist::PersistError;
pub use source::{FetchError, ProfileSource, TlsSetupError};
pub use table::{ProfileTable, TranslateError};
