//! The profile document: Mesos's `DiskProfileMapping` in its JSON form, and the validated
//! domain types it turns into.
//!
//! The accepted format is the proto3 JSON mapping of Mesos's
//! `mesos.resource_provider.DiskProfileMapping` (`src/resource_provider/storage/disk_profile.proto`)
//! as Mesos's URI adaptor parses it: both `snake_case` and `lowerCamelCase` field names, `null`
//! meaning "unset", unknown fields ignored, the selector and the access type each a oneof, and
//! the access mode given by its CSI v0 enum name (or number). Validation then applies Mesos's
//! rules (`disk_profile_utils.cpp`). Every error names the profile and the field.
//!
//! The wire structs here are also the on-disk form of persisted manifests (see `persist`),
//! so a persisted table is re-validated by exactly the same code as a fetched document.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::volume::source::csi_volume::{
    VolumeCapability,
    volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode},
};

use crate::lenient;

/// Mesos caps the summed length of all mount flags of one capability at 4 KB (the CSI spec's
/// limit for repeated string fields), counting only the flag bytes.
pub const MAX_MOUNT_FLAGS_BYTES: usize = 4096;

// === Wire form ===

/// `DiskProfileMapping`: profile name → manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireMapping {
    #[serde(default, alias = "profileMatrix")]
    pub(crate) profile_matrix: Option<BTreeMap<String, WireManifest>>,
}

/// `DiskProfileMapping.CSIManifest`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireManifest {
    #[serde(
        default,
        alias = "volumeCapabilities",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) volume_capabilities: Option<WireCapability>,
    #[serde(
        default,
        alias = "createParameters",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) create_parameters: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        alias = "resourceProviderSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) resource_provider_selector: Option<WireProviderSelector>,
    #[serde(
        default,
        alias = "csiPluginTypeSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) csi_plugin_type_selector: Option<WirePluginTypeSelector>,
}

/// `ResourceProviderSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireProviderSelector {
    #[serde(default, alias = "resourceProviders")]
    pub(crate) resource_providers: Option<Vec<WireProviderRef>>,
}

/// `ResourceProviderSelector.ResourceProvider`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireProviderRef {
    #[serde(default, rename = "type")]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// `CSIPluginTypeSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WirePluginTypeSelector {
    #[serde(default, alias = "pluginType")]
    pub(crate) plugin_type: Option<String>,
}

/// `csi.v0.VolumeCapability`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireCapability {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) block: Option<WireBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) mount: Option<WireMount>,
    #[serde(default, alias = "accessMode", skip_serializing_if = "Option::is_none")]
    pub(crate) access_mode: Option<WireAccessMode>,
}

/// `csi.v0.VolumeCapability.BlockVolume` (no fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireBlock {}

/// `csi.v0.VolumeCapability.MountVolume`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireMount {
    #[serde(default, alias = "fsType")]
    pub(crate) fs_type: Option<String>,
    #[serde(default, alias = "mountFlags")]
    pub(crate) mount_flags: Option<Vec<String>>,
}

/// `csi.v0.VolumeCapability.AccessMode`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireAccessMode {
    #[serde(default)]
    pub(crate) mode: Option<WireMode>,
}

/// An enum value in proto3 JSON: its name, or its number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum WireMode {
    Name(String),
    Number(i64),
}

// === Domain types ===

/// Which resource providers a profile applies to (`CSIManifest.selector`, a oneof).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Applies to every listed provider, matched on both type and name.
    ResourceProviders(Vec<ProviderRef>),
    /// Applies to every provider whose CSI plugin has this type.
    CsiPluginType(String),
}

/// One `(type, name)` entry of a resource provider selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProviderRef {
    /// Resource provider type, e.g. `org.apache.mesos.rp.local.storage`.
    pub provider_type: String,
    /// Resource provider name.
    pub provider_name: String,
}

pub use slrp_types::{ProfileInfo, ProviderKey};

/// One validated profile: its selector and its translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Which providers the profile applies to.
    pub selector: Selector,
    /// What the profile means.
    pub info: ProfileInfo,
}

impl Manifest {
    /// Whether this profile applies to `provider` (Mesos's `isSelectedResourceProvider`).
    #[must_use]
    pub fn applies_to(&self, provider: &ProviderKey) -> bool {
        match &self.selector {
            Selector::ResourceProviders(refs) => refs.iter().any(|r| {
                r.provider_type == provider.provider_type
                    && r.provider_name == provider.provider_name
            }),
            Selector::CsiPluginType(plugin_type) => {
                provider.plugin_type.as_deref() == Some(plugin_type.as_str())
            }
        }
    }

    pub(crate) fn to_wire(&self) -> WireManifest {
        let (resource_provider_selector, csi_plugin_type_selector) = match &self.selector {
            Selector::ResourceProviders(refs) => (
                Some(WireProviderSelector {
                    resource_providers: Some(
                        refs.iter()
                            .map(|r| WireProviderRef {
                                kind: Some(r.provider_type.clone()),
                                name: Some(r.provider_name.clone()),
                            })
                            .collect(),
                    ),
                }),
                None,
            ),
            Selector::CsiPluginType(t) => (
                None,
                Some(WirePluginTypeSelector {
                    plugin_type: Some(t.clone()),
                }),
            ),
        };
        let cap = &self.info.capability;
        let (block, mount) = match &cap.access_type {
            Some(AccessType::Block(_)) => (Some(WireBlock {}), None),
            Some(AccessType::Mount(m)) => (
                None,
                Some(WireMount {
                    fs_type: m.fs_type.clone(),
                    mount_flags: Some(m.mount_flags.clone()),
                }),
            ),
            None => (None, None),
        };
        let mode = Mode::try_from(cap.access_mode.mode).unwrap_or(Mode::Unknown);
        WireManifest {
            volume_capabilities: Some(WireCapability {
                block,
                mount,
                access_mode: Some(WireAccessMode {
                    mode: Some(WireMode::Name(mode.as_str_name().to_owned())),
                }),
            }),
            create_parameters: Some(self.info.parameters.clone()),
            resource_provider_selector,
            csi_plugin_type_selector,
        }
    }
}

/// A validated profile document: profile name → manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileMapping {
    /// Every profile of the document.
    pub profiles: BTreeMap<String, Manifest>,
}

// === Errors ===

/// Why a profile document was rejected. Any error rejects the whole document, as in Mesos.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The bytes are not JSON at all (not even in the dialect Mesos accepts).
    #[error("profile document is not valid JSON at line {line}, column {column}")]
    Json {
        /// 1-based line in the document as given.
        line: usize,
        /// 1-based column (in bytes) in the document as given.
        column: usize,
        /// What the JSON parser found there.
        #[source]
        source: JsonSyntaxError,
    },
    /// The document is JSON but not an object.
    #[error("profile document must be a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A field has the wrong JSON type (or an unparsable value).
    #[error("{}field '{field}' has the wrong type", profile_prefix(.profile.as_deref()))]
    WrongType {
        /// The profile the field belongs to, if the error is inside `profile_matrix`.
        profile: Option<String>,
        /// Dotted path of the field, relative to the profile (or the document).
        field: String,
        /// The JSON decoder's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// Neither `resource_provider_selector` nor `csi_plugin_type_selector` is set.
    #[error(
        "profile '{profile}' has no valid selector: expecting 'resource_provider_selector' or 'csi_plugin_type_selector'"
    )]
    NoSelector {
        /// The profile.
        profile: String,
    },
    /// Both selectors are set (they are a oneof).
    #[error(
        "profile '{profile}' sets both 'resource_provider_selector' and 'csi_plugin_type_selector'; only one selector is allowed"
    )]
    TwoSelectors {
        /// The profile.
        profile: String,
    },
    /// A resource provider selector entry has an empty or missing `type`.
    #[error(
        "profile '{profile}': 'resource_provider_selector.resource_providers[{index}].type' is required"
    )]
    ProviderTypeMissing {
        /// The profile.
        profile: String,
        /// Index of the entry.
        index: usize,
    },
    /// A resource provider selector entry has an empty or missing `name`.
    #[error(
        "profile '{profile}': 'resource_provider_selector.resource_providers[{index}].name' is required"
    )]
    ProviderNameMissing {
        /// The profile.
        profile: String,
        /// Index of the entry.
        index: usize,
    },
    /// The plugin type selector has an empty or missing `plugin_type`.
    #[error("profile '{profile}': 'csi_plugin_type_selector.plugin_type' is required")]
    PluginTypeMissing {
        /// The profile.
        profile: String,
    },
    /// `volume_capabilities` is missing.
    #[error("profile '{profile}' is missing the required field 'volume_capabilities'")]
    CapabilityMissing {
        /// The profile.
        profile: String,
    },
    /// Both `mount` and `block` are set (they are a oneof).
    #[error(
        "profile '{profile}': 'volume_capabilities' sets both 'mount' and 'block'; only one is allowed"
    )]
    TwoAccessTypes {
        /// The profile.
        profile: String,
    },
    /// The mount flags add up to more than [`MAX_MOUNT_FLAGS_BYTES`].
    #[error(
        "profile '{profile}': 'volume_capabilities.mount.mount_flags' total {bytes} bytes, more than the 4 KB allowed"
    )]
    MountFlagsTooLong {
        /// The profile.
        profile: String,
        /// Summed length of the flags.
        bytes: usize,
    },
    /// `access_mode` is missing.
    #[error("profile '{profile}': 'volume_capabilities.access_mode' is required")]
    AccessModeMissing {
        /// The profile.
        profile: String,
    },
    /// `access_mode.mode` is unset or `UNKNOWN`.
    #[error("profile '{profile}': 'volume_capabilities.access_mode.mode' is unknown or not set")]
    AccessModeUnset {
        /// The profile.
        profile: String,
    },
    /// `access_mode.mode` names no CSI v0 access mode.
    #[error(
        "profile '{profile}': 'volume_capabilities.access_mode.mode' has no access mode named {value}"
    )]
    AccessModeUnrecognized {
        /// The profile.
        profile: String,
        /// The value found, as written (JSON).
        value: String,
    },
}

fn profile_prefix(profile: Option<&str>) -> String {
    profile.map_or_else(String::new, |p| format!("profile '{p}': "))
}

impl DocumentError {
    /// The profile the error is about, if it is about one.
    #[must_use]
    pub fn profile(&self) -> Option<&str> {
        match self {
            Self::Json { .. } | Self::NotAnObject { .. } => None,
            Self::WrongType { profile, .. } => profile.as_deref(),
            Self::NoSelector { profile }
            | Self::TwoSelectors { profile }
            | Self::ProviderTypeMissing { profile, .. }
            | Self::ProviderNameMissing { profile, .. }
            | Self::PluginTypeMissing { profile }
            | Self::CapabilityMissing { profile }
            | Self::TwoAccessTypes { profile }
            | Self::MountFlagsTooLong { profile, .. }
            | Self::AccessModeMissing { profile }
            | Self::AccessModeUnset { profile }
            | Self::AccessModeUnrecognized { profile, .. } => Some(profile),
        }
    }
}

/// A JSON syntax error, without the parser's own position (which refers to the normalised
/// text; [`DocumentError::Json`] carries the position in the document as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JsonSyntaxError(pub String);

impl DocumentError {
    /// A syntax error of `serde_json` at (`line`, `column`) of the document as given.
    pub(crate) fn json_at(e: &serde_json::Error, line: usize, column: usize) -> Self {
        let text = e.to_string();
        // serde_json appends " at line L column C" (its own coordinates): drop it.
        let message = match text.rfind(" at line ") {
            Some(i) => text[..i].to_owned(),
            None => text,
        };
        Self::Json {
            line,
            column,
            source: JsonSyntaxError(message),
        }
    }
}

// === Parsing and validation ===

impl ProfileMapping {
    /// Parses and validates a profile document.
    ///
    /// The document is read in the JSON dialect of protobuf's parser, which Mesos uses
    /// (single quotes, unquoted keys, trailing commas, ...; see `docs/profiles.md`), so a
    /// file Mesos loads loads here unchanged.
    ///
    /// # Errors
    /// The first problem found: a syntax error with the line and column of the document
    /// as given, or a validation error naming the profile and field; the document is
    /// rejected as a whole.
    pub fn parse(bytes: &[u8]) -> Result<Self, DocumentError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let before = &bytes[..e.valid_up_to()];
            let line = before.iter().filter(|b| **b == b'\n').count() + 1;
            let start = before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |p| p + 1);
            DocumentError::Json {
                line,
                column: e.valid_up_to() - start + 1,
                source: JsonSyntaxError("the document is not UTF-8".to_owned()),
            }
        })?;
        let strict = lenient::normalize(text);
        let value: serde_json::Value = serde_json::from_str(&strict.text).map_err(|e| {
            let (line, column) = strict.input_position(text, e.line(), e.column());
            DocumentError::json_at(&e, line, column)
        })?;
        Self::from_value(value)
    }

    /// Parses and validates a profile document that is already a JSON value (an inline set
    /// from slrp's own configuration).
    ///
    /// # Errors
    /// As [`ProfileMapping::parse`].
    pub fn from_value(value: serde_json::Value) -> Result<Self, DocumentError> {
        if !value.is_object() {
            return Err(DocumentError::NotAnObject {
                found: json_type(&value),
            });
        }
        let wire: WireMapping = serde_path_to_error::deserialize(value).map_err(|e| {
            let (profile, field) = split_path(e.path());
            DocumentError::WrongType {
                profile,
                field,
                source: e.into_inner(),
            }
        })?;
        let mut profiles = BTreeMap::new();
        for (name, manifest) in wire.profile_matrix.unwrap_or_default() {
            let manifest = validate_manifest(&name, manifest)?;
            profiles.insert(name, manifest);
        }
        Ok(Self { profiles })
    }
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Splits `profile_matrix.<name>.a.b[2]` into the profile name and `a.b[2]`.
fn split_path(path: &serde_path_to_error::Path) -> (Option<String>, String) {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let join = |segs: &[&Segment]| {
        let mut out = String::new();
        for seg in segs {
            match seg {
                Segment::Seq { index } => out.push_str(&format!("[{index}]")),
                Segment::Map { key } => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                Segment::Enum { variant } => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(variant);
                }
                Segment::Unknown => out.push_str(".?"),
            }
        }
        out
    };
    match segments.as_slice() {
        [
            Segment::Map { key: top },
            Segment::Map { key: profile },
            rest @ ..,
        ] if top == "profile_matrix" || top == "profileMatrix" => {
            let field = if rest.is_empty() {
                "(the profile itself)".to_owned()
            } else {
                join(rest)
            };
            (Some(profile.clone()), field)
        }
        _ => (None, join(&segments)),
    }
}

/// Validates one manifest (Mesos's `validate(DiskProfileMapping)` for one entry) and devolves
/// its capability to the Mesos type.
pub(crate) fn validate_manifest(name: &str, wire: WireManifest) -> Result<Manifest, DocumentError> {
    let profile = || name.to_owned();
    let selector = match (
        wire.resource_provider_selector,
        wire.csi_plugin_type_selector,
    ) {
        (Some(_), Some(_)) => return Err(DocumentError::TwoSelectors { profile: profile() }),
        (None, None) => return Err(DocumentError::NoSelector { profile: profile() }),
        (Some(rp), None) => {
            let mut refs = Vec::new();
            for (index, r) in rp
                .resource_providers
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                let provider_type = r.kind.unwrap_or_default();
                if provider_type.is_empty() {
                    return Err(DocumentError::ProviderTypeMissing {
                        profile: profile(),
                        index,
                    });
                }
                let provider_name = r.name.unwrap_or_default();
                if provider_name.is_empty() {
                    return Err(DocumentError::ProviderNameMissing {
                        profile: profile(),
                        index,
                    });
                }
                refs.push(ProviderRef {
                    provider_type,
                    provider_name,
                });
            }
            Selector::ResourceProviders(refs)
        }
        (None, Some(pt)) => {
            let plugin_type = pt.plugin_type.unwrap_or_default();
            if plugin_type.is_empty() {
                return Err(DocumentError::PluginTypeMissing { profile: profile() });
            }
            Selector::CsiPluginType(plugin_type)
        }
    };

    let Some(cap) = wire.volume_capabilities else {
        return Err(DocumentError::CapabilityMissing { profile: profile() });
    };
    // Mesos does not require one of `mount`/`block` (see docs/profiles.md); a oneof still
    // cannot hold both.
    let access_type = match (cap.block, cap.mount) {
        (Some(_), Some(_)) => return Err(DocumentError::TwoAccessTypes { profile: profile() }),
        (Some(WireBlock {}), None) => Some(AccessType::Block(BlockVolume {})),
        (None, Some(mount)) => {
            let mount_flags = mount.mount_flags.unwrap_or_default();
            let bytes: usize = mount_flags.iter().map(String::len).sum();
            if bytes > MAX_MOUNT_FLAGS_BYTES {
                return Err(DocumentError::MountFlagsTooLong {
                    profile: profile(),
                    bytes,
                });
            }
            // Mesos's devolve() always sets fs_type, even when empty.
            Some(AccessType::Mount(MountVolume {
                fs_type: Some(mount.fs_type.unwrap_or_default()),
                mount_flags,
            }))
        }
        (None, None) => None,
    };
    let Some(access_mode) = cap.access_mode else {
        return Err(DocumentError::AccessModeMissing { profile: profile() });
    };
    let mode = match access_mode.mode {
        None => Mode::Unknown,
        Some(WireMode::Name(n)) => {
            Mode::from_str_name(&n).ok_or_else(|| DocumentError::AccessModeUnrecognized {
                profile: profile(),
                value: format!("{n:?}"),
            })?
        }
        Some(WireMode::Number(n)) => i32::try_from(n)
            .ok()
            .and_then(|n| Mode::try_from(n).ok())
            .ok_or_else(|| DocumentError::AccessModeUnrecognized {
                profile: profile(),
                value: n.to_string(),
            })?,
    };
    if mode == Mode::Unknown {
        return Err(DocumentError::AccessModeUnset { profile: profile() });
    }

    Ok(Manifest {
        selector,
        info: ProfileInfo {
            capability: VolumeCapability {
                access_mode: AccessMode { mode: mode as i32 },
                access_type,
            },
            parameters: wire.create_parameters.unwrap_or_default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_wire_round_trips() {
        let doc = br#"{"profile_matrix":{
            "a":{"csi_plugin_type_selector":{"plugin_type":"t"},
                 "volume_capabilities":{"mount":{"fs_type":"xfs","mount_flags":["noatime"]},
                                        "access_mode":{"mode":"MULTI_NODE_MULTI_WRITER"}},
                 "create_parameters":{"k":"v"}},
            "b":{"resource_provider_selector":{"resource_providers":[{"type":"t","name":"n"}]},
                 "volume_capabilities":{"block":{},"access_mode":{"mode":1}}}}}"#;
        let mapping = ProfileMapping::parse(doc).unwrap();
        for (name, manifest) in &mapping.profiles {
            let again = validate_manifest(name, manifest.to_wire()).unwrap();
            assert_eq!(&again, manifest);
        }
    }

    #[test]
    fn wrong_type_error_names_profile_and_field() {
        let doc = br#"{"profileMatrix":{"p":{"volumeCapabilities":{"mount":{"fsType":[1]}}}}}"#;
        let err = ProfileMapping::parse(doc).unwrap_err();
        let DocumentError::WrongType { profile, field, .. } = &err else {
            panic!("unexpected {err:?}");
        };
        assert_eq!(profile.as_deref(), Some("p"));
        assert_eq!(field, "volumeCapabilities.mount.fsType");
        assert_eq!(
            err.to_string(),
            "profile 'p': field 'volumeCapabilities.mount.fsType' has the wrong type"
        );
    }
}
