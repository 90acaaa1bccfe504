//! The bodies of slrp's fuzz targets: one per edge where slrp reads bytes it did not
//! write, each calling the code the daemon runs on them and asserting a property.
//!
//! # Overview
//! [`TARGETS`] lists them by name. Each `run` takes arbitrary bytes and returns normally
//! when the property holds; a violated property panics (an `assert!`), which the fuzzer
//! saves as a crash. The libFuzzer driver in `fuzz/` (outside the workspace: it is built
//! with coverage instrumentation, see `docs/testing.md`) calls [`run`] with the target
//! named by `SLRP_FUZZ_TARGET`; `tests/corpus.rs` replays every committed corpus file and
//! reproducer through the same function under the ordinary test command.
//!
//! # Layout
//! - [`agent_stream`]: the agent's RecordIO event stream, protobuf and JSON, in arbitrary
//!   chunks.
//! - [`provider_info`]: ResourceProviderInfo files.
//! - [`profiles`]: profile documents (lenient and strict) and the profiles state file.
//! - [`daemon_config`]: the daemon's TOML configuration.
//! - [`mesos_import`]: a Mesos SLRP's checkpoint tree as `slrp import-mesos` plans it.
//! - [`admin_api`]: admin API requests (method, path, headers, body).
//! - [`manager_calls`]: the embedded manager's resource provider and operator API bodies.
//! - [`csi_answers`]: CSI plugin answers into the volume manager.
//! - [`csi_local`]: CSI requests into the bundled plugin.
//! - `util`: shared helpers (runtime, scratch directories, path checks).
//!
//! # Invariants
//! - A target never touches the host outside its scratch directory (a fresh temporary
//!   directory per input, under `/dev/shm` when there is one).
//! - A target is deterministic for its input, up to timing of the volume manager's tasks.
//!
//! # Limitations
//! - The targets run the code in process; the HTTP and gRPC transports around the
//!   decoders are not fuzzed (hyper, tonic).

pub mod admin_api;
pub mod agent_stream;
pub mod csi_answers;
pub mod csi_local;
pub mod daemon_config;
pub mod manager_calls;
pub mod mesos_import;
pub mod profiles;
pub mod provider_info;
mod util;

/// A fuzz target: its name (the corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("agent_stream", agent_stream::run),
    ("provider_info", provider_info::run),
    ("profiles", profiles::run),
    ("daemon_config", daemon_config::run),
    ("mesos_import", mesos_import::run),
    ("admin_api", admin_api::run),
    ("manager_calls", manager_calls::run),
    ("csi_answers", csi_answers::run),
    ("csi_local", csi_local::run),
];

/// The body of the target called `name`, if there is one.
#[must_use]
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// Runs the target called `name` on `data`.
///
/// # Panics
/// For an unknown name, and wherever the target's property fails.
pub fn run(name: &str, data: &[u8]) {
    let f = target(name).unwrap_or_else(|| panic!("no fuzz target {name:?}"));
    f(data);
}
