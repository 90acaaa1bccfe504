//! The table of every profile ever seen, and the pure rules that update it.
//!
//! No I/O here: the worker feeds validated mappings in and publishes what comes out.

use std::collections::{BTreeMap, BTreeSet};

use crate::document::{Manifest, ProfileInfo, ProfileMapping, ProviderKey};

/// One profile the adaptor has seen: its manifest, and whether the latest accepted document
/// still carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// The definition first seen under this name (its `info` never changes; the selector
    /// may).
    pub manifest: Manifest,
    /// Whether the profile is in force (offered to providers, translatable).
    pub active: bool,
}

/// Every profile ever seen. Inactive entries are kept so that a name can never come back
/// with a different meaning (Mesos's immutability rule), across restarts too (the table is
/// what gets persisted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileTable {
    entries: BTreeMap<String, TableEntry>,
}

/// What applying one accepted document did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// Profiles that became active.
    pub added: BTreeSet<String>,
    /// Profiles that became inactive.
    pub removed: BTreeSet<String>,
    /// Profiles whose fetched definition differs from the one seen before under the same
    /// name, with the rejected definition. Their entries were left untouched.
    pub conflicts: BTreeMap<String, ProfileInfo>,
    /// Whether the table changed at all (including selector-only changes), i.e. whether it
    /// needs persisting.
    pub changed: bool,
}

/// Why a translation failed. The messages are Mesos's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// Unknown or inactive profile.
    #[error("Profile '{profile}' not found")]
    NotFound {
        /// The profile asked for.
        profile: String,
    },
    /// The profile exists but its selector does not match the provider.
    #[error(
        "Profile '{profile}' does not apply to resource provider with type '{provider_type}' and name '{provider_name}'"
    )]
    NotApplicable {
        /// The profile asked for.
        profile: String,
        /// The provider's type.
        provider_type: String,
        /// The provider's name.
        provider_name: String,
    },
    /// The adaptor has stopped.
    #[error("the profile adaptor has stopped")]
    Stopped,
}

impl ProfileTable {
    /// A table restored from persisted entries.
    pub(crate) fn from_entries(entries: BTreeMap<String, TableEntry>) -> Self {
        Self { entries }
    }

    /// All entries, active or not.
    #[must_use]
    pub fn entries(&self) -> &BTreeMap<String, TableEntry> {
        &self.entries
    }

    /// Number of active profiles.
    #[must_use]
    pub fn active_count(&self) -> usize {
        self.entries.values().filter(|e| e.active).count()
    }

    /// Applies an accepted document.
    ///
    /// Rules (Mesos's, except the conflict rule): profiles missing from the document become
    /// inactive; fetched profiles become (or stay) active with the fetched selector. A fetched
    /// profile whose capability or parameters differ from those seen before under its name is
    /// a conflict: its entry keeps its old definition and its old active flag, and the rest
    /// of the document still applies. (Mesos ignores the entire document instead.)
    pub fn apply(&mut self, mapping: ProfileMapping) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let fetched: BTreeSet<String> = mapping.profiles.keys().cloned().collect();
        for (name, entry) in &mut self.entries {
            if entry.active && !fetched.contains(name) {
                entry.active = false;
                outcome.removed.insert(name.clone());
                outcome.changed = true;
            }
        }
        for (name, manifest) in mapping.profiles {
            match self.entries.get_mut(&name) {
                Some(entry) if entry.manifest.info != manifest.info => {
                    outcome.conflicts.insert(name, manifest.info);
                }
                Some(entry) => {
                    if !entry.active {
                        entry.active = true;
                        outcome.added.insert(name.clone());
                        outcome.changed = true;
                    }
                    if entry.manifest.selector != manifest.selector {
                        entry.manifest.selector = manifest.selector;
                        outcome.changed = true;
                    }
                }
                None => {
                    outcome.added.insert(name.clone());
                    outcome.changed = true;
                    self.entries.insert(
                        name,
                        TableEntry {
                            manifest,
                            active: true,
                        },
                    );
                }
            }
        }
        outcome
    }

    /// The active profiles that apply to `provider`.
    #[must_use]
    pub fn view(&self, provider: &ProviderKey) -> BTreeMap<String, ProfileInfo> {
        self.entries
            .iter()
            .filter(|(_, e)| e.active && e.manifest.applies_to(provider))
            .map(|(n, e)| (n.clone(), e.manifest.info.clone()))
            .collect()
    }

    /// Translates an active profile for `provider` (Mesos's `translate`).
    ///
    /// # Errors
    /// [`TranslateError::NotFound`] for an unknown or inactive profile,
    /// [`TranslateError::NotApplicable`] when the selector does not match.
    pub fn translate(
        &self,
        profile: &str,
        provider: &ProviderKey,
    ) -> Result<ProfileInfo, TranslateError> {
        let entry = self
            .entries
            .get(profile)
            .filter(|e| e.active)
            .ok_or_else(|| TranslateError::NotFound {
                profile: profile.to_owned(),
            })?;
        if !entry.manifest.applies_to(provider) {
            return Err(TranslateError::NotApplicable {
                profile: profile.to_owned(),
                provider_type: provider.provider_type.clone(),
                provider_name: provider.provider_name.clone(),
            });
        }
        Ok(entry.manifest.info.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(doc: &str) -> ProfileMapping {
        ProfileMapping::parse(doc.as_bytes()).unwrap()
    }

    fn profile(mode: &str, plugin: &str) -> String {
        format!(
            r#"{{"csi_plugin_type_selector":{{"plugin_type":"{plugin}"}},
                "volume_capabilities":{{"block":{{}},"access_mode":{{"mode":"{mode}"}}}}}}"#
        )
    }

    fn doc(profiles: &[(&str, &str, &str)]) -> ProfileMapping {
        let body: Vec<String> = profiles
            .iter()
            .map(|(n, m, p)| format!("\"{n}\":{}", profile(m, p)))
            .collect();
        mapping(&format!("{{\"profile_matrix\":{{{}}}}}", body.join(",")))
    }

    fn key() -> ProviderKey {
        ProviderKey::new("rp", "name", Some("plugin".into()))
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn add_remove_and_reactivate() {
        let mut t = ProfileTable::default();
        let o = t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        assert_eq!(o.added, set(&["a"]));
        assert!(o.changed);
        assert_eq!(t.view(&key()).keys().collect::<Vec<_>>(), ["a"]);

        let o = t.apply(doc(&[("b", "SINGLE_NODE_WRITER", "plugin")]));
        assert_eq!((o.added, o.removed), (set(&["b"]), set(&["a"])));
        assert_eq!(
            t.translate("a", &key()),
            Err(TranslateError::NotFound {
                profile: "a".into()
            })
        );

        let o = t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        assert_eq!((o.added, o.removed), (set(&["a"]), set(&["b"])));
        assert_eq!(t.entries().len(), 2);
    }

    #[test]
    fn identical_document_changes_nothing() {
        let mut t = ProfileTable::default();
        t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        let before = t.clone();
        let o = t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        assert_eq!(o, ApplyOutcome::default());
        assert_eq!(t, before);
    }

    #[test]
    fn conflict_keeps_old_definition_and_applies_the_rest() {
        let mut t = ProfileTable::default();
        t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        let old = t.translate("a", &key()).unwrap();
        let o = t.apply(doc(&[
            ("a", "MULTI_NODE_MULTI_WRITER", "plugin"),
            ("b", "SINGLE_NODE_WRITER", "plugin"),
        ]));
        assert_eq!(o.conflicts.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(o.added, set(&["b"]));
        assert_eq!(t.translate("a", &key()).unwrap(), old);
    }

    #[test]
    fn conflict_on_inactive_profile_keeps_it_inactive() {
        let mut t = ProfileTable::default();
        t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        t.apply(doc(&[]));
        let o = t.apply(doc(&[("a", "MULTI_NODE_MULTI_WRITER", "plugin")]));
        assert_eq!(o.conflicts.len(), 1);
        assert!(!o.changed);
        assert!(t.view(&key()).is_empty());
    }

    #[test]
    fn selector_change_is_accepted() {
        let mut t = ProfileTable::default();
        t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "plugin")]));
        let o = t.apply(doc(&[("a", "SINGLE_NODE_WRITER", "other")]));
        assert!(o.changed && o.conflicts.is_empty());
        assert!(t.view(&key()).is_empty());
        assert!(matches!(
            t.translate("a", &key()),
            Err(TranslateError::NotApplicable { .. })
        ));
    }
}
