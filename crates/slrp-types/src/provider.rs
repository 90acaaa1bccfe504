//! [`ProviderKey`]: what a resource provider is matched on.

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
