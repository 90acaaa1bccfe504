//! Volume and snapshot ids, import names and CO-supplied paths: the only strings that reach
//! the file system.
//!
//! Volume and snapshot *names* from the CO are arbitrary strings and never become path
//! components. *Ids* are generated here from a fixed alphabet and validated on every
//! request, so an id read from a request can be joined to a directory without escaping it.

use std::path::{Component, Path, PathBuf};

/// Prefix of ids the plugin generates for volumes it creates.
pub(crate) const CREATED_PREFIX: &str = "vol-";
/// Prefix of ids the plugin generates for snapshots.
pub(crate) const SNAPSHOT_PREFIX: &str = "snap-";
/// Prefix of ids of operator-placed directory volumes (`<root>/import/dir/<name>/`).
pub(crate) const IMPORT_DIR_PREFIX: &str = "import-dir-";
/// Prefix of ids of operator-placed image volumes (`<root>/import/loop/<name>.img`).
pub(crate) const IMPORT_LOOP_PREFIX: &str = "import-loop-";

/// Longest id accepted; the CSI spec's general size limit for strings is 128 bytes.
const MAX_ID_LEN: usize = 128;
/// Longest import name; keeps `import-loop-<name>` within [`MAX_ID_LEN`].
pub(crate) const MAX_IMPORT_NAME_LEN: usize = MAX_ID_LEN - IMPORT_LOOP_PREFIX.len();
/// Longest CO path accepted (Linux `PATH_MAX`).
const MAX_PATH_LEN: usize = 4096;

/// A fresh id for a volume the plugin creates.
pub(crate) fn new_volume_id() -> String {
    format!("{CREATED_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// A fresh id for a snapshot.
pub(crate) fn new_snapshot_id() -> String {
    format!("{SNAPSHOT_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// Whether `s` is safe as a single file name: `[A-Za-z0-9._-]`, not starting with a dot.
fn is_safe_component(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Whether `id` could be a volume id of this plugin. Anything else is an unknown volume.
pub(crate) fn is_valid_volume_id(id: &str) -> bool {
    is_safe_component(id, MAX_ID_LEN)
}

/// Whether `id` could be a snapshot id of this plugin (the rules of volume ids: the id
/// becomes a file name under `<root>/snapshots/`). Anything else is an unknown snapshot.
pub(crate) fn is_valid_snapshot_id(id: &str) -> bool {
    is_safe_component(id, MAX_ID_LEN)
}

/// Whether an operator-chosen import name may become part of a volume id and a path.
pub(crate) fn is_valid_import_name(name: &str) -> bool {
    is_safe_component(name, MAX_IMPORT_NAME_LEN)
}

/// Why a CO-supplied path was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathRejection {
    #[error("is empty")]
    Empty,
    #[error("is not absolute")]
    Relative,
    #[error("contains a '..' component")]
    ParentComponent,
    #[error("contains a NUL byte")]
    Nul,
    #[error("is longer than {MAX_PATH_LEN} bytes")]
    TooLong,
    #[error("is the root directory")]
    Root,
}

/// Checks a staging or target path from the CO: absolute, no `..`, no NUL, not `/`.
/// Returns the path with `.` components and duplicate slashes removed.
pub(crate) fn co_path(raw: &str) -> Result<PathBuf, PathRejection> {
    if raw.is_empty() {
        return Err(PathRejection::Empty);
    }
    if raw.len() > MAX_PATH_LEN {
        return Err(PathRejection::TooLong);
    }
    if raw.contains('\0') {
        return Err(PathRejection::Nul);
    }
    let path = Path::new(raw);
    if !path.is_absolute() {
        return Err(PathRejection::Relative);
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(PathRejection::ParentComponent),
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return Err(PathRejection::Relative),
        }
    }
    if out == Path::new("/") {
        return Err(PathRejection::Root);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid() {
        let id = new_volume_id();
        assert!(is_valid_volume_id(&id), "{id}");
        assert_ne!(id, new_volume_id());
        let snap = new_snapshot_id();
        assert!(is_valid_snapshot_id(&snap), "{snap}");
        assert!(snap.starts_with(SNAPSHOT_PREFIX));
        assert_ne!(snap, new_snapshot_id());
    }

    #[test]
    fn ids_that_could_escape_are_rejected() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            ".hidden",
            "a\0b",
            "sp ace",
            "ü",
            &"x".repeat(129),
        ] {
            assert!(!is_valid_volume_id(bad), "{bad:?} accepted");
            assert!(
                !is_valid_snapshot_id(bad),
                "{bad:?} accepted as a snapshot id"
            );
        }
        assert!(is_valid_volume_id("import-dir-data_1.v2"));
        assert!(is_valid_volume_id(&"x".repeat(128)));
    }

    #[test]
    fn import_names_fit_in_an_id() {
        let longest = "n".repeat(MAX_IMPORT_NAME_LEN);
        assert!(is_valid_import_name(&longest));
        assert!(is_valid_volume_id(&format!(
            "{IMPORT_LOOP_PREFIX}{longest}"
        )));
        assert!(!is_valid_import_name(&format!("{longest}n")));
    }

    #[test]
    fn co_paths_are_absolute_and_normalised() {
        assert_eq!(co_path("/a//b/./c/").unwrap(), PathBuf::from("/a/b/c"));
        assert_eq!(co_path(""), Err(PathRejection::Empty));
        assert_eq!(co_path("rel/x"), Err(PathRejection::Relative));
        assert_eq!(co_path("/a/../etc"), Err(PathRejection::ParentComponent));
        assert_eq!(co_path("/a\0"), Err(PathRejection::Nul));
        assert_eq!(co_path("/"), Err(PathRejection::Root));
        assert_eq!(
            co_path(&format!("/{}", "a".repeat(5000))),
            Err(PathRejection::TooLong)
        );
    }
}
