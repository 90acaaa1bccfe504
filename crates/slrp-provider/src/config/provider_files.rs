//! The provider files (spec §10.1): ResourceProviderInfo JSON files in Mesos's format, one
//! provider each, read from `--resource-provider-config-dir`, and their validation.
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
use std::path::{Path, PathBuf};

use slrp_proto::mesos::v1::csi_plugin_container_info::Service;
use slrp_proto::mesos::v1::{ResourceProviderId, ResourceProviderInfo};
use slrp_types::ProviderKey;

use super::{ConfigError, PluginBackend};

/// The only local resource provider type Mesos registers (spec §10.1).
pub const STORAGE_PROVIDER_TYPE: &str = "org.apache.mesos.rp.local.storage";

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
    ProviderKey::from(info).to_string()
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
        PluginBackend::Agent => slrp_supervisor::agent_backend::check_container_ids(
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
    parse_provider_file(path, &text)
}

/// Decodes and validates the bytes of the provider file at `path` (which only names the
/// file in errors): what [`load_provider_file`] does after reading it. The fuzz target
/// `provider_info` calls it.
///
/// # Errors
/// [`ConfigError::DecodeProvider`] or [`ConfigError::InvalidProvider`], naming the file
/// (and the field).
pub fn parse_provider_file(path: &Path, text: &[u8]) -> Result<ProviderConfig, ConfigError> {
    let decode_failed = |(field, source): (String, DecodeError)| ConfigError::DecodeProvider {
        path: path.to_owned(),
        field,
        source: Box::new(source),
    };
    let value: serde_json::Value = serde_json::from_slice(text)
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
