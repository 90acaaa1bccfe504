//! The daemon's configuration: the ResourceProviderInfo files in Mesos's format, and slrp's
//! own TOML file and flags.
//!
//! # Two stages
//!
//! [`DaemonConfigFile`] is the raw form: what the TOML file (`--config FILE`) says, with
//! the command-line flags merged over it ([`DaemonConfigFile::apply`]). It does no I/O
//! beyond reading the file. [`DaemonConfig::resolve`] then validates everything, reads the
//! token file and the provider directory, and returns the typed configuration, or a
//! [`ConfigError`] naming the file and the field. Nothing is bound or spawned before that.
//!
//! # Provider files (spec §10.1)
//!
//! [`load_provider_dir`] reads every `*.json` file of the directory, as a Mesos agent reads
//! its `--resource_provider_config_dir`, and validates each as Mesos's
//! `StorageLocalResourceProvider::validate` does, with Mesos's texts. Differences from the
//! agent, all on the side of refusing early:
//!
//! - Only `*.json` files are read (the agent reads every regular file); hidden files and
//!   directories (such as the `.staging` directory the agent keeps there) are skipped.
//! - A bad file stops the daemon (the agent logs it and runs the others): a provider that
//!   silently does not start is harder to notice than a daemon that does not start.
//! - Unknown JSON fields, and unknown enum names of optional fields, are ignored, as stout's
//!   JSON-to-protobuf conversion ignores them (proto2 rules), so a file an agent accepts is
//!   accepted unchanged; the first one is logged as a warning naming its path, because in a
//!   hand-written file it is usually a typo (`CONTROLER_SERVICE`).
//! - A plugin with no `CONTROLLER_SERVICE` container is accepted as a node-only plugin (the
//!   agent's validation accepts it too, then aborts on an assertion, spec §12): it reports
//!   no storage pools and can create no disks.
//! - Each container must have a `command` (slrp launches processes; it has no containerizer).
//! - A negative or zero `reconciliation_interval_seconds` disables periodic reconciliation
//!   (the proto's documentation; Mesos checks only for zero; see
//!   `worker::reconciliation_interval`); NaN or infinity is refused.
//! - An absent `storage.plugin.name` is set to `default`, the proto default, when the file
//!   is read.
//! - The default reservations are checked as a reservation stack when the file is read.
//! - Two files with the same provider type and name are refused naming both files, and so
//!   are two providers with the same plugin type and name: their volumes would share
//!   `<work dir>/csi/<plugin type>/<plugin name>/`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use slrp_agent::{AgentConfig, AgentEndpoint, Token};
use slrp_proto::mesos::v1::csi_plugin_container_info::Service;
use slrp_proto::mesos::v1::{ResourceProviderId, ResourceProviderInfo};
use slrp_types::Backoff;
use slrp_wire::ContentType;

/// The only local resource provider type Mesos registers (spec §10.1).
pub const STORAGE_PROVIDER_TYPE: &str = "org.apache.mesos.rp.local.storage";

/// The state directory when neither a flag nor the file names one.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/slrp";

/// The admin socket's file name inside the state directory.
pub const ADMIN_SOCKET_NAME: &str = "admin.sock";

/// How long shutdown waits for providers and plugins before giving up on them.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The CSI plugin name Mesos uses when `CSIPluginInfo.name` is absent (the proto default).
const DEFAULT_PLUGIN_NAME: &str = "default";

/// One provider's configuration, as read from one file.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    /// The provider, validated as spec §10.1; `id` is unset.
    pub info: ResourceProviderInfo,
    /// The JSON file it came from (for messages).
    pub source: PathBuf,
}

impl ProviderConfig {
    /// `<rp type>.<rp name>`: the provider's directory name under the state directory and
    /// the infix of its metric names (spec §9).
    pub fn key(&self) -> String {
        provider_key(&self.info)
    }

    /// The plugin's type and name (the name defaulted as Mesos defaults it).
    pub fn plugin(&self) -> (String, String) {
        plugin_of(&self.info)
    }
}

/// `<rp type>.<rp name>` of a provider.
pub fn provider_key(info: &ResourceProviderInfo) -> String {
    format!("{}.{}", info.r#type, info.name)
}

fn plugin_of(info: &ResourceProviderInfo) -> (String, String) {
    let plugin = info.storage.as_ref().map(|s| &s.plugin);
    (
        plugin.map(|p| p.r#type.clone()).unwrap_or_default(),
        plugin
            .and_then(|p| p.name.clone())
            .unwrap_or_else(|| DEFAULT_PLUGIN_NAME.to_owned()),
    )
}

/// A ResourceProviderInfo that Mesos (or slrp) would not run. `Display` is Mesos's text
/// where Mesos has one.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// `type` is not the storage provider's.
    #[error("Unknown local resource provider type '{provider_type}'")]
    UnknownType {
        /// The type given.
        provider_type: String,
    },
    /// `id` is set (the manager assigns it).
    #[error("'ResourceProviderInfo.id' must not be set")]
    IdSet,
    /// `name` is empty or has characters other than `[A-Za-z0-9_]`.
    #[error("Resource provider name '{name}' does not follow Java package naming convention")]
    BadName {
        /// The name given.
        name: String,
    },
    /// `storage` is absent.
    #[error("'ResourceProviderInfo.storage' must be set")]
    NoStorage,
    /// The plugin type is not a dotted Java package name, or its name not an identifier.
    #[error(
        "CSI plugin type '{plugin_type}' and name '{plugin_name}' does not follow Java package naming convention"
    )]
    BadPlugin {
        /// `storage.plugin.type`.
        plugin_type: String,
        /// `storage.plugin.name` (defaulted).
        plugin_name: String,
    },
    /// No container lists `NODE_SERVICE`.
    #[error("NODE_SERVICE not found")]
    NoNodeService,
    /// `reconciliation_interval_seconds` is NaN or infinite.
    #[error("{value} is not a number of seconds")]
    BadInterval {
        /// The value given.
        value: f64,
    },
    /// The default reservations are not a valid reservation stack.
    #[error("the default reservations are not a valid reservation stack")]
    Reservations(#[source] slrp_core::provider::resources::ResourceError),
    /// The plugin's containers cannot be launched by slrp.
    #[error("slrp cannot run this plugin")]
    Plugin(#[source] slrp_supervisor::SpecError),
}

impl InfoError {
    /// The field of the ResourceProviderInfo at fault.
    pub fn field(&self) -> &'static str {
        match self {
            Self::UnknownType { .. } => "type",
            Self::IdSet => "id",
            Self::BadName { .. } => "name",
            Self::NoStorage => "storage",
            Self::BadPlugin { .. } => "storage.plugin",
            Self::NoNodeService => "storage.plugin.containers",
            Self::BadInterval { .. } => "storage.reconciliation_interval_seconds",
            Self::Reservations(_) => "default_reservations",
            Self::Plugin(_) => "storage.plugin.containers",
        }
    }
}

/// Mesos's `isValidName`: a non-empty Java identifier made of `[A-Za-z0-9_]`.
fn is_valid_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Mesos's `isValidType`: dot-separated valid names.
fn is_valid_type(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(is_valid_name)
}

/// Validates a provider as spec §10.1 (Mesos's `LocalResourceProvider::validate` and
/// `StorageLocalResourceProvider::validate`, in their order), then checks that slrp can run
/// its plugin.
///
/// # Errors
/// The first [`InfoError`] found.
pub fn validate_info(info: &ResourceProviderInfo) -> Result<(), InfoError> {
    if info.r#type != STORAGE_PROVIDER_TYPE {
        return Err(InfoError::UnknownType {
            provider_type: info.r#type.clone(),
        });
    }
    if info.id.is_some() {
        return Err(InfoError::IdSet);
    }
    if !is_valid_name(&info.name) {
        return Err(InfoError::BadName {
            name: info.name.clone(),
        });
    }
    let storage = info.storage.as_ref().ok_or(InfoError::NoStorage)?;
    let (plugin_type, plugin_name) = plugin_of(info);
    if !is_valid_type(&plugin_type) || !is_valid_name(&plugin_name) {
        return Err(InfoError::BadPlugin {
            plugin_type,
            plugin_name,
        });
    }
    let node = Service::NodeService as i32;
    if !storage
        .plugin
        .containers
        .iter()
        .any(|c| c.services.contains(&node))
    {
        return Err(InfoError::NoNodeService);
    }
    if let Some(value) = storage.reconciliation_interval_seconds
        && !value.is_finite()
    {
        return Err(InfoError::BadInterval { value });
    }
    // The provider id is not known yet; any valid one checks the rest of the context.
    slrp_core::provider::resources::ProviderResources::new(
        ResourceProviderId {
            value: "validation".to_owned(),
        },
        &plugin_type,
        &plugin_name,
        info.default_reservations.clone(),
    )
    .map_err(InfoError::Reservations)?;
    // The structural checks only: what a command needs depends on the plugin backend,
    // checked by `DaemonConfig::resolve` (and by the supervisor at start).
    slrp_supervisor::deployment_for(&storage.plugin, slrp_supervisor::SpecChecks::Agent)
        .map_err(InfoError::Plugin)?;
    Ok(())
}

/// Checks that `provider`'s plugin can run on `backend`: a command and secret values for
/// local processes; container IDs the agent accepts for agent containers.
///
/// # Errors
/// [`ConfigError::InvalidProvider`] naming the file and the rule.
pub fn check_plugin_backend(
    provider: &ProviderConfig,
    backend: PluginBackend,
) -> Result<(), ConfigError> {
    let Some(storage) = provider.info.storage.as_ref() else {
        return Ok(());
    };
    let checked = match backend {
        PluginBackend::Process => slrp_supervisor::deployment_from_info(&storage.plugin).map(drop),
        PluginBackend::Agent => slrp_supervisor::agent::check_container_ids(
            &provider.info.r#type,
            &provider.info.name,
            &storage.plugin,
        ),
    };
    checked.map_err(|e| ConfigError::InvalidProvider {
        path: provider.source.clone(),
        source: InfoError::Plugin(e),
    })
}

/// Why the configuration cannot be used. Every variant names the file or the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML config file cannot be read.
    #[error("reading the config file {path}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML config file is not valid (syntax, type, or an unknown key, named).
    #[error("config file {path}")]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// What and where.
        #[source]
        source: toml::de::Error,
    },
    /// No agent URL anywhere.
    #[error("no agent: give --agent URL (or 'agent.url' in the config file)")]
    NoAgent,
    /// No provider directory anywhere.
    #[error(
        "no resource providers: give --resource-provider-config-dir DIR (or 'resource_provider_config_dir' in the config file)"
    )]
    NoProviderDir,
    /// A setting has a value that cannot work.
    #[error("setting '{field}'")]
    Setting {
        /// The setting, as spelled in the config file.
        field: &'static str,
        /// Why.
        #[source]
        source: SettingError,
    },
    /// A token file cannot be read.
    #[error("setting '{field}': reading {path}")]
    TokenFile {
        /// The setting (`agent.token_file`, `admin.token_file`).
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The provider directory cannot be listed.
    #[error("listing the resource provider config directory {dir}")]
    ProviderDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The provider directory holds no `*.json` file.
    #[error("the resource provider config directory {dir} holds no *.json file")]
    NoProviders {
        /// The directory.
        dir: PathBuf,
    },
    /// A provider file cannot be read.
    #[error("reading the resource provider config {path}")]
    ReadProvider {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A provider file is not a ResourceProviderInfo in Mesos's JSON form.
    #[error("resource provider config {path}: field '{field}' is not valid")]
    DecodeProvider {
        /// The file.
        path: PathBuf,
        /// JSON path of the offending field (`.` for the document itself).
        field: String,
        /// What the decoder objected to.
        #[source]
        source: Box<DecodeError>,
    },
    /// A provider file decodes but is not a provider Mesos (or slrp) would run.
    #[error("resource provider config {path}: field '{field}'", field = source.field())]
    InvalidProvider {
        /// The file.
        path: PathBuf,
        /// What is wrong, in Mesos's words.
        #[source]
        source: InfoError,
    },
    /// Two files configure the same provider type and name.
    #[error(
        "Multiple resource providers with type '{provider_type}' and name '{name}': {first} and {second}"
    )]
    DuplicateProvider {
        /// The type.
        provider_type: String,
        /// The name.
        name: String,
        /// The first file.
        first: PathBuf,
        /// The second file.
        second: PathBuf,
    },
    /// Two providers would run the same plugin and share its volume directories.
    #[error(
        "resource provider configs {first} and {second} both use CSI plugin type '{plugin_type}' and name '{plugin_name}'; their volumes would share one directory"
    )]
    DuplicatePlugin {
        /// The plugin type.
        plugin_type: String,
        /// The plugin name.
        plugin_name: String,
        /// The first file.
        first: PathBuf,
        /// The second file.
        second: PathBuf,
    },
}

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
}

/// Why a provider file does not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or a value of the wrong type.
    #[error("invalid JSON")]
    Json(#[source] serde_json::Error),
    /// A proto2 `required` field is missing.
    #[error("a required field is missing")]
    Required(#[source] slrp_wire::required::MissingField),
    /// The message has no descriptor (a build defect).
    #[error("looking up the message descriptor")]
    Descriptor(#[source] slrp_wire::JsonError),
    /// The generated type does not match the descriptor (a build defect).
    #[error("transcoding to the generated type")]
    Transcode(#[source] prost::DecodeError),
}

fn setting(field: &'static str, source: SettingError) -> ConfigError {
    ConfigError::Setting { field, source }
}

/// One JSON decoding attempt: on failure, the JSON path where the decoder stopped.
fn decode_info(
    value: &serde_json::Value,
    deny_unknown: bool,
) -> Result<ResourceProviderInfo, (String, DecodeError)> {
    use prost_reflect::{DeserializeOptions, DynamicMessage};
    let descriptor = slrp_wire::json::descriptor_of::<ResourceProviderInfo>()
        .map_err(|e| (".".to_owned(), DecodeError::Descriptor(e)))?;
    let options = DeserializeOptions::new().deny_unknown_fields(deny_unknown);
    let mut track = serde_path_to_error::Track::new();
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor,
        serde_path_to_error::Deserializer::new(value, &mut track),
        &options,
    )
    .map_err(|e| (track.path().to_string(), DecodeError::Json(e)))?;
    slrp_wire::required::check_required(&dynamic)
        .map_err(|m| (m.path.to_string(), DecodeError::Required(m)))?;
    dynamic
        .transcode_to::<ResourceProviderInfo>()
        .map_err(|e| (".".to_owned(), DecodeError::Transcode(e)))
}

/// Reads and validates one provider file.
///
/// # Errors
/// [`ConfigError::ReadProvider`], [`ConfigError::DecodeProvider`] or
/// [`ConfigError::InvalidProvider`], naming the file (and the field).
pub fn load_provider_file(path: &Path) -> Result<ProviderConfig, ConfigError> {
    let text = std::fs::read(path).map_err(|source| ConfigError::ReadProvider {
        path: path.to_owned(),
        source,
    })?;
    let decode_failed = |(field, source): (String, DecodeError)| ConfigError::DecodeProvider {
        path: path.to_owned(),
        field,
        source: Box::new(source),
    };
    let value: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| decode_failed((".".to_owned(), DecodeError::Json(e))))?;
    let info = match decode_info(&value, true) {
        Ok(info) => info,
        Err(strict) => {
            let info = decode_info(&value, false).map_err(decode_failed)?;
            // Only the unknown-name complaint remains once unknown names are allowed.
            tracing::warn!(
                file = %path.display(),
                field = %strict.0,
                error = %slrp_types::DisplayChain(&strict.1),
                "ignoring an unknown field of a resource provider config, as Mesos does"
            );
            info
        }
    };
    let mut info = info;
    validate_info(&info).map_err(|source| ConfigError::InvalidProvider {
        path: path.to_owned(),
        source,
    })?;
    // The proto default made explicit, so that no later layer defaults it differently.
    if let Some(storage) = &mut info.storage {
        storage
            .plugin
            .name
            .get_or_insert_with(|| DEFAULT_PLUGIN_NAME.to_owned());
    }
    Ok(ProviderConfig {
        info,
        source: path.to_owned(),
    })
}

/// Reads every `*.json` of `dir` (Mesos's ResourceProviderInfo JSON, as the agent's
/// `--resource_provider_config_dir`), validates each (spec §10.1) and refuses duplicates of
/// provider type and name (and of plugin type and name). Hidden files and directories are
/// skipped. The result is in file name order.
///
/// # Errors
/// The first [`ConfigError`] found, naming the file and the field.
pub fn load_provider_dir(dir: &Path) -> Result<Vec<ProviderConfig>, ConfigError> {
    let listing_failed = |source| ConfigError::ProviderDir {
        dir: dir.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing_failed)? {
        let entry = entry.map_err(listing_failed)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if name.starts_with('.') || !name.ends_with(".json") || path.is_dir() {
            continue;
        }
        files.push(path);
    }
    files.sort();
    let mut providers: Vec<ProviderConfig> = Vec::with_capacity(files.len());
    let mut by_key: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut by_plugin: BTreeMap<(String, String), usize> = BTreeMap::new();
    for path in files {
        let config = load_provider_file(&path)?;
        let key = (config.info.r#type.clone(), config.info.name.clone());
        if let Some(&first) = by_key.get(&key) {
            return Err(ConfigError::DuplicateProvider {
                provider_type: key.0,
                name: key.1,
                first: providers[first].source.clone(),
                second: path,
            });
        }
        let plugin = config.plugin();
        if let Some(&first) = by_plugin.get(&plugin) {
            return Err(ConfigError::DuplicatePlugin {
                plugin_type: plugin.0,
                plugin_name: plugin.1,
                first: providers[first].source.clone(),
                second: path,
            });
        }
        by_key.insert(key, providers.len());
        by_plugin.insert(plugin, providers.len());
        providers.push(config);
    }
    if providers.is_empty() {
        return Err(ConfigError::NoProviders {
            dir: dir.to_owned(),
        });
    }
    Ok(providers)
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
        let mut file: Self = toml::from_str(&text).map_err(|source| ConfigError::ParseConfig {
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
