//! [`ProviderKey`]: what a resource provider is matched on, and what it is called.

use std::fmt;

use slrp_proto::mesos::v1::ResourceProviderInfo;

/// What a provider is matched on: the fields of Mesos's `ResourceProviderInfo` that
/// profile selectors read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProviderKey {
    /// `ResourceProviderInfo.type`.
    pub provider_type: String,
    /// `ResourceProviderInfo.name`.
    pub provider_name: String,
    /// `ResourceProviderInfo.storage.plugin.type`, `None` when the provider has no `storage`
    /// part (such a provider never matches a plugin type selector, as in Mesos).
    pub plugin_type: Option<String>,
}

impl ProviderKey {
    /// A storage provider key.
    #[must_use]
    pub fn new(
        provider_type: impl Into<String>,
        provider_name: impl Into<String>,
        plugin_type: Option<String>,
    ) -> Self {
        Self {
            provider_type: provider_type.into(),
            provider_name: provider_name.into(),
            plugin_type,
        }
    }
}

/// `<type>.<name>`: the provider's name in logs, errors, metric labels, admin requests and
/// its state directory.
impl fmt::Display for ProviderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.provider_type, self.provider_name)
    }
}

/// The key of the provider `info` describes: its type and name, and its plugin's type
/// (`None` without a `storage` part).
impl From<&ResourceProviderInfo> for ProviderKey {
    fn from(info: &ResourceProviderInfo) -> Self {
        Self {
            provider_type: info.r#type.clone(),
            provider_name: info.name.clone(),
            plugin_type: info.storage.as_ref().map(|s| s.plugin.r#type.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use slrp_proto::mesos::v1::CsiPluginInfo;
    use slrp_proto::mesos::v1::resource_provider_info::Storage;

    use super::*;

    #[test]
    fn displays_as_type_dot_name() {
        let key = ProviderKey::new("org.apache.mesos.rp.local.storage", "lvm", None);
        assert_eq!(key.to_string(), "org.apache.mesos.rp.local.storage.lvm");
    }

    #[test]
    fn from_info_takes_type_name_and_plugin_type() {
        let mut info = ResourceProviderInfo {
            r#type: "rp.t".to_owned(),
            name: "n".to_owned(),
            ..ResourceProviderInfo::default()
        };
        assert_eq!(
            ProviderKey::from(&info),
            ProviderKey::new("rp.t", "n", None)
        );
        info.storage = Some(Storage {
            plugin: CsiPluginInfo {
                r#type: "csi.x".to_owned(),
                ..CsiPluginInfo::default()
            },
            ..Storage::default()
        });
        assert_eq!(
            ProviderKey::from(&info),
            ProviderKey::new("rp.t", "n", Some("csi.x".to_owned()))
        );
    }
}
