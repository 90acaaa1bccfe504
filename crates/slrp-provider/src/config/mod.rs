//! The daemon's configuration: the ResourceProviderInfo files in Mesos's format, and slrp's
//! own TOML file and flags.
//!
//! # Layout
//!
//! - `provider_files`: the provider files (spec §10.1), ResourceProviderInfo JSON files
//!   read from the agent's resource provider config directory ([`load_provider_dir`]) and
//!   validated as Mesos validates them ([`validate_info`]).
//! - `daemon`: slrp's own TOML file and the flags merged over it ([`DaemonConfigFile`]),
//!   resolved into a [`DaemonConfig`] (which reads the provider files).
//!
//! Both report a [`ConfigError`] naming the file and the field. Everything is re-exported
//! here: the submodules are not part of the paths.

use std::path::PathBuf;

mod daemon;
mod provider_files;

pub use daemon::{
    ADMIN_SOCKET_NAME, AdminFile, AdminListen, AdminTcp, AdminToken, AgentFile,
    DEFAULT_SHUTDOWN_GRACE, DEFAULT_STATE_DIR, DaemonConfig, DaemonConfigFile, ManagerFile,
    Overrides, PluginBackend, PluginsFile, PluginsOnExit, RemoveSandboxes, RetriesFile,
    SettingError, VolumeHealthFile, provider_state_dir,
};
pub use provider_files::{
    DecodeError, InfoError, ProviderConfig, STORAGE_PROVIDER_TYPE, check_plugin_backend,
    load_provider_dir, load_provider_file, parse_provider_file, provider_key, validate_info,
};

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
