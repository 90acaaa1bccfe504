//! slrp's own configuration: the TOML file (`--config FILE`, e.g. `slrp.toml`) and the
//! flags of `slrp run` merged over it, resolved into a [`DaemonConfig`].
//!
//! # Two stages
//!
//! [`DaemonConfigFile`] is the raw form: what the TOML file (`--config FILE`) says, with
//! the command-line flags merged over it ([`DaemonConfigFile::apply`]). It does no I/O
//! beyond reading the file. [`DaemonConfig::resolve`] then validates everything, reads the
//! token file and the provider directory, and returns the typed configuration, or a
//! [`ConfigError`] naming the file and the field. Nothing is bound or spawned before that.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use slrp_agent::{AgentConfig, AgentEndpoint, Token};
use slrp_proto::mesos::v1::ResourceProviderInfo;
use slrp_types::Backoff;
use slrp_wire::ContentType;

use super::{ConfigError, ProviderConfig, check_plugin_backend, load_provider_dir, provider_key};

/// The state directory when neither a flag nor the file names one.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/slrp";

/// The admin socket's file name inside the state directory.
pub const ADMIN_SOCKET_NAME: &str = "admin.sock";

/// How long shutdown waits for providers and plugins before giving up on them.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// A setting's value that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    /// Not a duration.
    #[error("{value:?} is not a duration (e.g. 10s, 1m 30s, 10secs)")]
    Duration {
        /// The value given.
        value: String,
    },
    /// A duration that must be positive is zero.
    #[error("must be greater than zero")]
    Zero,
    /// A value outside the allowed set.
    #[error("{value:?} is not one of {allowed}")]
    OneOf {
        /// The value given.
        value: String,
        /// The allowed values.
        allowed: &'static str,
    },
    /// An empty path.
    #[error("the path is empty")]
    EmptyPath,
    /// The token file is empty.
    #[error("the token file is empty")]
    EmptyToken,
    /// `admin.listen` without a token: TCP is never served unauthenticated.
    #[error(
        "'admin.listen' needs a token file: the TCP endpoint is only served with a bearer token (give 'admin.token_file' or --admin-token-file)"
    )]
    TokenRequired,
    /// A token file for a TCP endpoint that is not configured.
    #[error("there is no TCP endpoint to protect: give 'admin.listen' (or --admin-listen) too")]
    TokenWithoutListen,
    /// Not a socket address.
    #[error("{value:?} is not an address and port (e.g. 127.0.0.1:5051, [::1]:5051)")]
    Address {
        /// The value given.
        value: String,
    },
    /// The agent client refuses the setting.
    #[error("the agent client refuses it")]
    Agent(#[source] slrp_agent::ConfigError),
    /// Bad backoff bounds.
    #[error("bad backoff bounds")]
    Backoff(#[source] slrp_types::BackoffError),
    /// The profile adaptor refuses its settings.
    #[error("the profile adaptor refuses them")]
    Profiles(#[source] slrp_profiles::ConfigError),
    /// A bound that must be at least 1 is 0.
    #[error("must be at least 1")]
    ZeroBound,
    /// A bound above what slrp can hold.
    #[error("{value} is over {max}: {why}")]
    BoundTooHigh {
        /// The value given.
        value: usize,
        /// The highest value allowed.
        max: usize,
        /// Why that is the highest.
        why: &'static str,
    },
    /// Not a size.
    #[error("not a size")]
    Size(#[source] slrp_types::SizeError),
}

fn setting(field: &'static str, source: SettingError) -> ConfigError {
    ConfigError::Setting { field, source }
}

/// Where the admin endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    /// A unix socket at this path (mode 0600).
    Unix(PathBuf),
}

/// The admin endpoint's optional TCP listener (`[admin] listen` + `token_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTcp {
    /// Where to listen.
    pub listen: SocketAddr,
    /// What every TCP request must carry as `Authorization: Bearer <token>`.
    pub token: AdminToken,
    /// The file the token was read from (the daemon warns at start when others can read
    /// it).
    pub token_file: PathBuf,
}

/// The admin endpoint's bearer token. Its `Debug` never shows it, so it cannot reach a
/// log through a config dump.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<[u8]>);

impl AdminToken {
    /// A token of these bytes.
    pub fn new(token: impl AsRef<[u8]>) -> Self {
        Self(Arc::from(token.as_ref()))
    }

    /// Whether `candidate` is the token, in time that depends only on the lengths (not on
    /// where the bytes differ), so the token cannot be guessed byte by byte.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let token: &[u8] = &self.0;
        // The length is not secret enough to hide: tokens are long and random.
        if candidate.len() != token.len() {
            return false;
        }
        let diff = token
            .iter()
            .zip(candidate)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// What happens to the plugins when the daemon stops (`plugins_on_exit`, `--plugins-on-exit`):
/// the plugin stack's own setting, `stop` (the default) or `leave` (the next slrp adopts
/// them: no plugin restart across an upgrade).
pub type PluginsOnExit = crate::stack::StopPlugins;

/// Parses `stop` or `leave`.
fn parse_plugins_on_exit(value: &str) -> Result<PluginsOnExit, SettingError> {
    match value {
        "stop" => Ok(PluginsOnExit::Stop),
        "leave" => Ok(PluginsOnExit::Leave),
        _ => Err(SettingError::OneOf {
            value: value.to_owned(),
            allowed: "stop, leave",
        }),
    }
}

/// Where the plugin containers run (`[plugins] backend`, `slrp run --plugin-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PluginBackend {
    /// Local processes slrp spawns (the default).
    #[default]
    Process,
    /// The agent's standalone containers, through its operator API (spec §4.1), as the
    /// Mesos provider runs them.
    Agent,
}

/// What happens to retired agent containers' sandboxes (`[plugins] remove_sandboxes`).
pub type RemoveSandboxes = slrp_supervisor::RemoveSandboxes;

fn parse_plugin_backend(value: &str) -> Result<PluginBackend, SettingError> {
    match value {
        "process" => Ok(PluginBackend::Process),
        "agent" => Ok(PluginBackend::Agent),
        _ => Err(SettingError::OneOf {
            value: value.to_owned(),
            allowed: "process, agent",
        }),
    }
}

fn parse_remove_sandboxes(value: &str) -> Result<RemoveSandboxes, SettingError> {
    match value {
        "never" => Ok(RemoveSandboxes::Never),
        "files" => Ok(RemoveSandboxes::Files),
        _ => Err(SettingError::OneOf {
            value: value.to_owned(),
            allowed: "never, files",
        }),
    }
}

/// The validated daemon configuration.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The manager (a Mesos agent, or an embedded manager) every provider subscribes to.
    pub agent: AgentConfig,
    /// The agent's work directory: volumes are mounted under
    /// `<work_dir>/csi/<plugin type>/<plugin name>/mounts/`.
    pub work_dir: PathBuf,
    /// slrp's own state: `providers/<type>.<name>/{store,plugins}`.
    pub state_dir: PathBuf,
    /// The providers, one per file.
    pub providers: Vec<ProviderConfig>,
    /// The profile adaptor's configuration; `None` runs without profiles (no pools).
    pub profiles: Option<slrp_profiles::ProfilesConfig>,
    /// Where the admin endpoint listens.
    pub admin: AdminListen,
    /// Where the admin endpoint also listens on TCP, with its bearer token.
    pub admin_tcp: Option<AdminTcp>,
    /// Stop the plugins on exit, or leave them for the next slrp to adopt.
    pub plugins_on_exit: PluginsOnExit,
    /// Where the plugin containers run: local processes (default) or the agent's
    /// standalone containers, reached at the operator API of `agent` with its token.
    pub plugin_backend: PluginBackend,
    /// With the agent backend: whether slrp deletes a retired container's sandbox
    /// (`<work_dir>/containers/<id>`); never by default (REMOVE_CONTAINER is never sent).
    pub remove_sandboxes: RemoveSandboxes,
    /// Bound on the whole shutdown; what has not stopped by then is abandoned.
    pub shutdown_grace: Duration,
    /// How long a provider's plugin may take to become ready (socket and probes) before
    /// the provider fails; `None`: the plugin stack's default (Mesos's 1 min + 1 min).
    pub plugin_ready_timeout: Option<Duration>,
    /// Bounds of the resend interval of unacknowledged operation status updates (Mesos:
    /// 10 s doubling to 10 min, spec §8.5).
    pub status_update_retry: Backoff,
    /// Bounds of the retries of CreateVolume and DeleteVolume after `DEADLINE_EXCEEDED` or
    /// `UNAVAILABLE` (Mesos: 10 s doubling to 10 min, spec §4.3).
    pub csi_retry: Backoff,
    /// `[manager] max_body_bytes`: the embedded manager's body limit (`None`: its
    /// default, `slrp_manager::DEFAULT_MAX_BODY_BYTES`).
    pub manager_max_body_bytes: Option<usize>,
    /// How much of a plugin's answers slrp accepts (`[csi]`, docs/csi-client.md).
    pub csi_limits: slrp_csi::AnswerLimits,
    /// The volume usage and health poller (`[volume_health]`, `crate::health`).
    pub volume_health: crate::health::HealthConfig,
}

/// The `[volume_health]` table: the volume usage and health poller of each provider
/// (`crate::health`); each unset setting keeps its default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VolumeHealthFile {
    /// `false` turns the poller off (default `true`).
    pub enabled: Option<bool>,
    /// How often each volume is asked about (default 60s; jittered).
    pub interval: Option<String>,
    /// Calls in flight per provider, at most (default 4).
    pub concurrency: Option<usize>,
    /// Deadline of one call (default 10s).
    pub timeout: Option<String>,
}

/// The poller's settings of `file` over the defaults.
fn volume_health(file: &VolumeHealthFile) -> Result<crate::health::HealthConfig, ConfigError> {
    let mut cfg = crate::health::HealthConfig::default();
    if let Some(enabled) = file.enabled {
        cfg.enabled = enabled;
    }
    if let Some(d) = duration("volume_health.interval", file.interval.as_ref())? {
        cfg.interval = d;
    }
    if let Some(d) = duration("volume_health.timeout", file.timeout.as_ref())? {
        cfg.timeout = d;
    }
    match file.concurrency {
        None => {}
        Some(0) => {
            return Err(setting(
                "volume_health.concurrency",
                SettingError::ZeroBound,
            ));
        }
        Some(n) => cfg.concurrency = n,
    }
    Ok(cfg)
}

/// The `[csi]` table: the bounds on plugin answers (`slrp_csi::answer`); each unset one
/// keeps its default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CsiFile {
    /// Longest volume or node id, in bytes (1024, the most the state store holds).
    pub max_id_bytes: Option<usize>,
    /// Longest other string (page tokens, names, messages), in bytes (4096).
    pub max_string_bytes: Option<usize>,
    /// Largest string map (a volume or publish context), in bytes (16384).
    pub max_map_bytes: Option<usize>,
    /// Most pages in one ListVolumes listing (100000).
    pub max_list_pages: Option<usize>,
    /// Most volumes in one listing (500000).
    pub max_list_entries: Option<usize>,
    /// Most bytes (ids, contexts, tokens) in one listing (67108864).
    pub max_list_bytes: Option<usize>,
}

/// The answer bounds of `file` over the defaults: each at least 1, ids no longer than a
/// state store key.
fn csi_limits(file: &CsiFile) -> Result<slrp_csi::AnswerLimits, ConfigError> {
    let mut limits = slrp_csi::AnswerLimits::default();
    let settings: [(&'static str, Option<usize>, &mut usize); 6] = [
        (
            "csi.max_id_bytes",
            file.max_id_bytes,
            &mut limits.max_id_bytes,
        ),
        (
            "csi.max_string_bytes",
            file.max_string_bytes,
            &mut limits.max_string_bytes,
        ),
        (
            "csi.max_map_bytes",
            file.max_map_bytes,
            &mut limits.max_map_bytes,
        ),
        (
            "csi.max_list_pages",
            file.max_list_pages,
            &mut limits.max_list_pages,
        ),
        (
            "csi.max_list_entries",
            file.max_list_entries,
            &mut limits.max_list_entries,
        ),
        (
            "csi.max_list_bytes",
            file.max_list_bytes,
            &mut limits.max_list_bytes,
        ),
    ];
    for (field, value, slot) in settings {
        match value {
            None => {}
            Some(0) => return Err(setting(field, SettingError::ZeroBound)),
            Some(v) => *slot = v,
        }
    }
    if limits.max_id_bytes > slrp_store::MAX_KEY_LEN {
        return Err(setting(
            "csi.max_id_bytes",
            SettingError::BoundTooHigh {
                value: limits.max_id_bytes,
                max: slrp_store::MAX_KEY_LEN,
                why: "ids are keys of the state store, which holds no longer ones",
            },
        ));
    }
    Ok(limits)
}

/// The `[retries]` table: Mesos's retry intervals, shortened by tests (no test may wait
/// Mesos's 10 s).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RetriesFile {
    /// First wait before an unacknowledged operation status update is resent (10s).
    pub status_update_min: Option<String>,
    /// Longest wait between resends of one status update (10min).
    pub status_update_max: Option<String>,
    /// First wait before a transiently failed CreateVolume/DeleteVolume is retried (10s).
    pub csi_min: Option<String>,
    /// Longest wait between those retries (10min).
    pub csi_max: Option<String>,
}

/// The `[agent]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    /// `http[s]://HOST[:PORT][/PATH]` or `unix:///SOCKET`; the resource provider path is
    /// appended when there is none.
    pub url: Option<String>,
    /// A file holding the bearer token (never the token itself: it would show in `ps`).
    pub token_file: Option<PathBuf>,
    /// PEM bundle that replaces the system trust store for `https://`.
    pub ca_file: Option<PathBuf>,
    /// `protobuf` (default, as the reference provider) or `json`.
    pub content_type: Option<String>,
    /// Bound on opening one connection.
    pub connect_timeout: Option<String>,
    /// Bound from SUBSCRIBE to SUBSCRIBED.
    pub subscribe_timeout: Option<String>,
    /// Bound on one call.
    pub call_timeout: Option<String>,
    /// First wait between connection attempts.
    pub backoff_base: Option<String>,
    /// Longest wait between connection attempts.
    pub backoff_max: Option<String>,
}

/// The `[plugins]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PluginsFile {
    /// `process` (default) or `agent`.
    pub backend: Option<String>,
    /// `never` (default) or `files`.
    pub remove_sandboxes: Option<String>,
}

/// The `[admin]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// The unix socket's path (default `<state_dir>/admin.sock`).
    pub socket: Option<PathBuf>,
    /// Also serve the API on TCP at `HOST:PORT` (only with `token_file`).
    pub listen: Option<String>,
    /// A file holding the bearer token TCP clients must send (never the token itself).
    pub token_file: Option<PathBuf>,
}

/// The TOML config file, as written, with the flags merged in. Relative paths in the file
/// are relative to the file's directory; relative paths from flags to the working
/// directory.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfigFile {
    /// The agent connection.
    #[serde(default)]
    pub agent: AgentFile,
    /// The agent's work directory (default `<state_dir>/work`).
    pub work_dir: Option<PathBuf>,
    /// slrp's state directory (default `/var/lib/slrp`).
    pub state_dir: Option<PathBuf>,
    /// The directory of ResourceProviderInfo JSON files.
    pub resource_provider_config_dir: Option<PathBuf>,
    /// The `[profiles]` table (also accepted as `[disk_profiles]`, after the flag): the
    /// profile adaptor, with Mesos's URI disk profile adaptor parameters (`uri`,
    /// `poll_interval`, …). `--disk-profiles URI` sets its `uri`.
    #[serde(alias = "disk_profiles")]
    pub profiles: Option<slrp_profiles::ProfilesConfigFile>,
    /// The admin endpoint.
    #[serde(default)]
    pub admin: AdminFile,
    /// `stop` (default) or `leave`.
    pub plugins_on_exit: Option<String>,
    /// The plugin backend.
    #[serde(default)]
    pub plugins: PluginsFile,
    /// Bound on the whole shutdown (default 30s).
    pub shutdown_grace: Option<String>,
    /// How long a plugin may take to become ready (default: Mesos's 2 min in all).
    pub plugin_ready_timeout: Option<String>,
    /// Retry intervals of status updates and CSI calls.
    #[serde(default)]
    pub retries: RetriesFile,
    /// Bounds on plugin answers.
    #[serde(default)]
    pub csi: CsiFile,
    /// The volume usage and health poller.
    #[serde(default)]
    pub volume_health: VolumeHealthFile,
    /// The embedded manager of `slrp standalone`.
    #[serde(default)]
    pub manager: ManagerFile,
}

/// The `[manager]` table: the embedded resource provider manager of `slrp standalone`
/// (`slrp run` talks to a Mesos agent and refuses the table).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerFile {
    /// Largest request body the manager accepts (a size: `128MiB`, `1GiB`). A provider's
    /// UPDATE_STATE carries its whole total, ~390 bytes per volume in JSON.
    pub max_body_bytes: Option<String>,
}

/// The flags of `slrp run`, each overriding its config file setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--agent`.
    pub agent: Option<String>,
    /// `--agent-token-file`.
    pub agent_token_file: Option<PathBuf>,
    /// `--work-dir`.
    pub work_dir: Option<PathBuf>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// `--resource-provider-config-dir`.
    pub resource_provider_config_dir: Option<PathBuf>,
    /// `--disk-profiles`.
    pub disk_profiles: Option<String>,
    /// `--admin-socket`.
    pub admin_socket: Option<PathBuf>,
    /// `--admin-listen`.
    pub admin_listen: Option<String>,
    /// `--admin-token-file`.
    pub admin_token_file: Option<PathBuf>,
    /// `--plugins-on-exit`.
    pub plugins_on_exit: Option<String>,
    /// `--plugin-backend`.
    pub plugin_backend: Option<String>,
}

fn relative_to(base: &Path, path: Option<PathBuf>) -> Option<PathBuf> {
    path.map(|p| if p.is_absolute() { p } else { base.join(p) })
}

impl DaemonConfigFile {
    /// Reads and parses a TOML config file; relative paths in it become relative to its
    /// directory.
    ///
    /// # Errors
    /// [`ConfigError::ReadConfig`] or [`ConfigError::ParseConfig`] (which names an unknown
    /// key and its line).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses the text of the config file at `path` (which only names the file in errors
    /// and is the base of its relative paths): what [`DaemonConfigFile::load`] does after
    /// reading the file. The fuzz target `daemon_config` calls it.
    ///
    /// # Errors
    /// [`ConfigError::ParseConfig`] (which names an unknown key and its line).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let mut file: Self = toml::from_str(text).map_err(|source| ConfigError::ParseConfig {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        file.rebase(base);
        Ok(file)
    }

    fn rebase(&mut self, base: &Path) {
        self.work_dir = relative_to(base, self.work_dir.take());
        self.state_dir = relative_to(base, self.state_dir.take());
        self.resource_provider_config_dir =
            relative_to(base, self.resource_provider_config_dir.take());
        self.agent.token_file = relative_to(base, self.agent.token_file.take());
        self.agent.ca_file = relative_to(base, self.agent.ca_file.take());
        self.admin.socket = relative_to(base, self.admin.socket.take());
        self.admin.token_file = relative_to(base, self.admin.token_file.take());
        if let Some(p) = &mut self.profiles {
            if let Some(uri) = &p.uri
                && !uri.contains("://")
                && !Path::new(uri).is_absolute()
            {
                p.uri = Some(base.join(uri).to_string_lossy().into_owned());
            }
            p.ca_file = relative_to(base, p.ca_file.take());
            p.state_file = relative_to(base, p.state_file.take());
        }
    }

    /// Merges the flags over the file: a flag given wins.
    #[must_use]
    pub fn apply(mut self, flags: Overrides) -> Self {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let here = |p: Option<PathBuf>| relative_to(&cwd, p);
        if let Some(url) = flags.agent {
            self.agent.url = Some(url);
        }
        if let Some(p) = here(flags.agent_token_file) {
            self.agent.token_file = Some(p);
        }
        if let Some(p) = here(flags.work_dir) {
            self.work_dir = Some(p);
        }
        if let Some(p) = here(flags.state_dir) {
            self.state_dir = Some(p);
        }
        if let Some(p) = here(flags.resource_provider_config_dir) {
            self.resource_provider_config_dir = Some(p);
        }
        if let Some(p) = here(flags.admin_socket) {
            self.admin.socket = Some(p);
        }
        if let Some(addr) = flags.admin_listen {
            self.admin.listen = Some(addr);
        }
        if let Some(p) = here(flags.admin_token_file) {
            self.admin.token_file = Some(p);
        }
        if let Some(v) = flags.plugins_on_exit {
            self.plugins_on_exit = Some(v);
        }
        if let Some(v) = flags.plugin_backend {
            self.plugins.backend = Some(v);
        }
        if let Some(mut uri) = flags.disk_profiles {
            if !uri.contains("://") && !Path::new(&uri).is_absolute() {
                uri = cwd.join(uri).to_string_lossy().into_owned();
            }
            let mut profiles = self.profiles.take().unwrap_or_default();
            // A URI from the command line replaces an inline set from the file.
            profiles.inline = None;
            profiles.uri = Some(uri);
            self.profiles = Some(profiles);
        }
        self
    }
}

fn duration(field: &'static str, value: Option<&String>) -> Result<Option<Duration>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let d = slrp_profiles::config::parse_duration(field, value).map_err(|_| {
        setting(
            field,
            SettingError::Duration {
                value: value.clone(),
            },
        )
    })?;
    if d.is_zero() {
        return Err(setting(field, SettingError::Zero));
    }
    Ok(Some(d))
}

/// Backoff bounds from a `(field, value)` pair of settings, each defaulting to `default`'s.
fn backoff(
    base: (&'static str, Option<&String>),
    max: (&'static str, Option<&String>),
    default: Backoff,
) -> Result<Backoff, ConfigError> {
    let b = duration(base.0, base.1)?;
    let m = duration(max.0, max.1)?;
    if b.is_none() && m.is_none() {
        return Ok(default);
    }
    Backoff::new(b.unwrap_or(default.base()), m.unwrap_or(default.max()))
        .map_err(|e| setting(max.0, SettingError::Backoff(e)))
}

fn non_empty(field: &'static str, path: Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    match path {
        Some(p) if p.as_os_str().is_empty() => Err(setting(field, SettingError::EmptyPath)),
        other => Ok(other),
    }
}

/// The token in the file `path` of setting `field`, read as `slrp ctl` reads it
/// ([`slrp_types::read_token_file`]: ASCII whitespace at both ends dropped); an empty one
/// is refused.
fn read_token(field: &'static str, path: &Path) -> Result<String, ConfigError> {
    slrp_types::read_token_file(path).map_err(|e| match e {
        slrp_types::TokenFileError::Read { path, source } => ConfigError::TokenFile {
            field,
            path,
            source,
        },
        slrp_types::TokenFileError::Empty { .. } => setting(field, SettingError::EmptyToken),
    })
}

/// The `[admin]` TCP listener, if `listen` is set: refused without a token.
fn admin_tcp(file: &AdminFile) -> Result<Option<AdminTcp>, ConfigError> {
    let token_file = non_empty("admin.token_file", file.token_file.clone())?;
    let Some(listen) = &file.listen else {
        return match token_file {
            Some(_) => Err(setting(
                "admin.token_file",
                SettingError::TokenWithoutListen,
            )),
            None => Ok(None),
        };
    };
    let addr: SocketAddr = listen.parse().map_err(|_| {
        setting(
            "admin.listen",
            SettingError::Address {
                value: listen.clone(),
            },
        )
    })?;
    let token_file =
        token_file.ok_or_else(|| setting("admin.token_file", SettingError::TokenRequired))?;
    let token = read_token("admin.token_file", &token_file)?;
    Ok(Some(AdminTcp {
        listen: addr,
        token: AdminToken::new(token),
        token_file,
    }))
}

fn agent_config(file: AgentFile) -> Result<AgentConfig, ConfigError> {
    let url = file.url.ok_or(ConfigError::NoAgent)?;
    let endpoint =
        AgentEndpoint::parse(&url).map_err(|e| setting("agent.url", SettingError::Agent(e)))?;
    let mut agent = AgentConfig::new(endpoint);
    agent.ca_file = non_empty("agent.ca_file", file.ca_file)?;
    if let Some(kind) = &file.content_type {
        agent.content_type = match kind.as_str() {
            "protobuf" => ContentType::Protobuf,
            "json" => ContentType::Json,
            _ => {
                return Err(setting(
                    "agent.content_type",
                    SettingError::OneOf {
                        value: kind.clone(),
                        allowed: "protobuf, json",
                    },
                ));
            }
        };
    }
    if let Some(d) = duration("agent.connect_timeout", file.connect_timeout.as_ref())? {
        agent.connect_timeout = d;
    }
    if let Some(d) = duration("agent.subscribe_timeout", file.subscribe_timeout.as_ref())? {
        agent.subscribe_timeout = d;
    }
    if let Some(d) = duration("agent.call_timeout", file.call_timeout.as_ref())? {
        agent.call_timeout = d;
    }
    agent.backoff = backoff(
        ("agent.backoff_base", file.backoff_base.as_ref()),
        ("agent.backoff_max", file.backoff_max.as_ref()),
        agent.backoff,
    )?;
    if let Some(path) = non_empty("agent.token_file", file.token_file)? {
        let token = read_token("agent.token_file", &path)?;
        agent.token = Some(Token::new(token));
    }
    agent
        .validate()
        .map_err(|e| setting("agent", SettingError::Agent(e)))?;
    Ok(agent)
}

impl DaemonConfig {
    /// Validates the merged file and flags, reads the token file and the provider
    /// directory.
    ///
    /// # Errors
    /// The first [`ConfigError`] found.
    pub fn resolve(file: DaemonConfigFile) -> Result<Self, ConfigError> {
        let agent = agent_config(file.agent)?;
        let state_dir = non_empty("state_dir", file.state_dir)?
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let work_dir =
            non_empty("work_dir", file.work_dir)?.unwrap_or_else(|| state_dir.join("work"));
        let admin_tcp = admin_tcp(&file.admin)?;
        let admin = AdminListen::Unix(
            non_empty("admin.socket", file.admin.socket)?
                .unwrap_or_else(|| state_dir.join(ADMIN_SOCKET_NAME)),
        );
        let plugins_on_exit = match &file.plugins_on_exit {
            None => PluginsOnExit::default(),
            Some(v) => parse_plugins_on_exit(v).map_err(|e| setting("plugins_on_exit", e))?,
        };
        let plugin_backend = match &file.plugins.backend {
            None => PluginBackend::default(),
            Some(v) => parse_plugin_backend(v).map_err(|e| setting("plugins.backend", e))?,
        };
        let remove_sandboxes = match &file.plugins.remove_sandboxes {
            None => RemoveSandboxes::default(),
            Some(v) => {
                parse_remove_sandboxes(v).map_err(|e| setting("plugins.remove_sandboxes", e))?
            }
        };
        let shutdown_grace = duration("shutdown_grace", file.shutdown_grace.as_ref())?
            .unwrap_or(DEFAULT_SHUTDOWN_GRACE);
        let plugin_ready_timeout =
            duration("plugin_ready_timeout", file.plugin_ready_timeout.as_ref())?;
        let retries = &file.retries;
        let status_update_retry = backoff(
            (
                "retries.status_update_min",
                retries.status_update_min.as_ref(),
            ),
            (
                "retries.status_update_max",
                retries.status_update_max.as_ref(),
            ),
            Backoff::MESOS,
        )?;
        let csi_retry = backoff(
            ("retries.csi_min", retries.csi_min.as_ref()),
            ("retries.csi_max", retries.csi_max.as_ref()),
            Backoff::MESOS,
        )?;
        let csi_limits = csi_limits(&file.csi)?;
        let volume_health = volume_health(&file.volume_health)?;
        let manager_max_body_bytes = match &file.manager.max_body_bytes {
            None => None,
            Some(v) => {
                let bytes = slrp_types::parse_size(v)
                    .map_err(|e| setting("manager.max_body_bytes", SettingError::Size(e)))?;
                if bytes == 0 {
                    return Err(setting("manager.max_body_bytes", SettingError::Zero));
                }
                Some(usize::try_from(bytes).unwrap_or(usize::MAX))
            }
        };
        let profiles = file
            .profiles
            .map(slrp_profiles::ProfilesConfig::try_from)
            .transpose()
            .map_err(|e| setting("profiles", SettingError::Profiles(e)))?;
        let dir = non_empty(
            "resource_provider_config_dir",
            file.resource_provider_config_dir,
        )?
        .ok_or(ConfigError::NoProviderDir)?;
        let providers = load_provider_dir(&dir)?;
        for provider in &providers {
            check_plugin_backend(provider, plugin_backend)?;
        }
        Ok(Self {
            agent,
            work_dir,
            state_dir,
            providers,
            profiles,
            admin,
            admin_tcp,
            plugins_on_exit,
            plugin_backend,
            remove_sandboxes,
            shutdown_grace,
            plugin_ready_timeout,
            status_update_retry,
            csi_retry,
            csi_limits,
            volume_health,
            manager_max_body_bytes,
        })
    }

    /// `S/providers/<type>.<name>`: one provider's state directory. The type and name are
    /// validated (§10.1 character rules), so this never leaves `S/providers`.
    pub fn provider_dir(&self, provider: &ProviderConfig) -> PathBuf {
        provider_state_dir(&self.state_dir, &provider.info)
    }
}

/// `<state_dir>/providers/<type>.<name>` for a validated provider.
pub fn provider_state_dir(state_dir: &Path, info: &ResourceProviderInfo) -> PathBuf {
    state_dir.join("providers").join(provider_key(info))
}

impl fmt::Display for AdminListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}
