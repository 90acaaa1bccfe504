//! DESTROY of a persistent MOUNT volume (spec §5.3): the volume's data goes, the disk
//! stays.
//!
//! Mesos deletes everything inside `<work dir>/csi/<type>/<name>/mounts/<enc(id)>/target`
//! (keeping the directory) on the provider actor, crossing into whatever is mounted
//! below it, and fails with EBUSY only once it reaches the mount point. Here:
//!
//! - the path comes from the volume manager's [`MountPaths`], so it honours
//!   `target_path_root` (spec §12 item 27) and no volume id can name a path outside the
//!   root;
//! - the target itself may be a mount point (a published volume: its contents are the
//!   data), but anything mounted *below* it (a task's bind mount left behind) fails the
//!   operation with EBUSY before anything is deleted, instead of Mesos's partial deletion
//!   through the mount;
//! - symbolic links are removed, never followed;
//! - the work runs on the blocking pool, not on the provider's event loop (§12 item 2).

use std::path::Path;

use slrp_csi::VolumeId;

use slrp_core::volume::MountPaths;
use slrp_core::volume::host::{MountTable, ProcMountTable};

/// Linux `EBUSY`: what `rmdir` of a mount point fails with, reported for a mount found
/// below the target before deleting anything.
const EBUSY: i32 = 16;

/// DESTROY of a persistent MOUNT volume (§5.3): removes everything inside
/// `<mount root>/<enc(volume id)>/target` (keeps the directory; missing = nothing to do).
///
/// # Errors
/// The FAILED message `Failed to remove persistent volume '<persistence id>' at
/// '<path>': <error>` (EBUSY when something is mounted inside); for a volume id that has
/// no path (empty, too long) `Failed to remove persistent volume '<persistence id>':
/// <why>`.
pub async fn remove_persistent_data(
    paths: &MountPaths,
    volume_id: &VolumeId,
    persistence_id: &str,
) -> Result<(), String> {
    remove_with(paths, volume_id, persistence_id, ProcMountTable).await
}

/// [`remove_persistent_data`] with an injected mount table.
async fn remove_with(
    paths: &MountPaths,
    volume_id: &VolumeId,
    persistence_id: &str,
    mounts: impl MountTable,
) -> Result<(), String> {
    let target = paths.target(volume_id).map_err(|error| {
        format!("Failed to remove persistent volume '{persistence_id}': {error}")
    })?;
    let at = target.clone();
    let outcome = tokio::task::spawn_blocking(move || remove_contents(&at, &mounts)).await;
    let error = match outcome {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(error)) => error.to_string(),
        Err(join) => format!("the removal did not complete: {join}"),
    };
    Err(format!(
        "Failed to remove persistent volume '{persistence_id}' at '{}': {error}",
        target.display()
    ))
}

fn remove_contents(target: &Path, mounts: &dyn MountTable) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(target) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if mounts.mounts_under(target)?.iter().any(|m| m != target) {
        return Err(std::io::Error::from_raw_os_error(EBUSY));
    }
    for entry in entries {
        let entry = entry?;
        // `file_type` does not follow symbolic links: a link is removed as a file.
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A mount table that lists what it is given.
    #[derive(Debug)]
    struct Listed(Vec<PathBuf>);

    impl MountTable for Listed {
        fn mounts_under(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
            Ok(self
                .0
                .iter()
                .filter(|m| m.starts_with(dir))
                .cloned()
                .collect())
        }
    }

    /// The paths of volume `v` under `root`.
    fn volume_v(root: &Path) -> (MountPaths, VolumeId, PathBuf) {
        let paths = MountPaths::new(root);
        let id = VolumeId::new("v");
        let target = paths.target(&id).unwrap();
        (paths, id, target)
    }

    fn fill(dir: &Path) {
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/data"), b"x").unwrap();
        std::fs::write(dir.join("top"), b"y").unwrap();
    }

    fn contents(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn removes_everything_inside_the_target_and_keeps_it() {
        let root = tempfile::tempdir().unwrap();
        let paths = MountPaths::new(root.path());
        let id = VolumeId::new("vol/1");
        let target = paths.target(&id).unwrap();
        fill(&target);
        // A link to data outside the target: the link goes, the data stays.
        let outside = root.path().join("outside");
        fill(&outside);
        std::os::unix::fs::symlink(&outside, target.join("link")).unwrap();

        remove_persistent_data(&paths, &id, "pv").await.unwrap();

        assert!(target.is_dir());
        assert!(contents(&target).is_empty());
        assert_eq!(contents(&outside), ["a", "top"]);
    }

    #[tokio::test]
    async fn a_missing_target_is_nothing_to_do() {
        let root = tempfile::tempdir().unwrap();
        let paths = MountPaths::new(root.path().join("mounts"));
        remove_persistent_data(&paths, &VolumeId::new("never-published"), "pv")
            .await
            .unwrap();
        assert!(!root.path().join("mounts").exists());
    }

    #[tokio::test]
    async fn ids_never_reach_outside_the_mount_root() {
        let root = tempfile::tempdir().unwrap();
        let mounts = root.path().join("mounts");
        let paths = MountPaths::new(&mounts);
        // What `..`/`../x` would name if ids were joined as paths.
        fill(&root.path().join("target"));
        fill(&root.path().join("x").join("target"));
        for id in ["..", "../x", "."] {
            remove_persistent_data(&paths, &VolumeId::new(id), "pv")
                .await
                .unwrap();
        }
        assert_eq!(contents(&root.path().join("target")), ["a", "top"]);
        assert_eq!(contents(&root.path().join("x/target")), ["a", "top"]);
        assert_eq!(
            remove_persistent_data(&paths, &VolumeId::new(""), "pv").await,
            Err("Failed to remove persistent volume 'pv': volume id is empty".to_owned())
        );
    }

    #[tokio::test]
    async fn a_failure_names_the_persistent_volume_and_the_path() {
        let root = tempfile::tempdir().unwrap();
        let (paths, id, target) = volume_v(root.path());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        // A file where the directory should be: not a directory.
        std::fs::write(&target, b"").unwrap();
        let error = remove_persistent_data(&paths, &id, "pv7")
            .await
            .unwrap_err();
        let prefix = format!(
            "Failed to remove persistent volume 'pv7' at '{}': ",
            target.display()
        );
        assert!(error.starts_with(&prefix), "{error}");
        assert!(error.contains("Not a directory"), "{error}");
    }

    #[tokio::test]
    async fn a_mount_below_the_target_is_busy_and_nothing_is_deleted() {
        let root = tempfile::tempdir().unwrap();
        let (paths, id, target) = volume_v(root.path());
        fill(&target);
        let table = Listed(vec![target.clone(), target.join("a")]);
        let error = remove_with(&paths, &id, "pv", table).await.unwrap_err();
        assert_eq!(
            error,
            format!(
                "Failed to remove persistent volume 'pv' at '{}': {}",
                target.display(),
                std::io::Error::from_raw_os_error(EBUSY)
            )
        );
        assert_eq!(contents(&target), ["a", "top"]);
        // The target itself being mounted (a published volume) is what DESTROY expects.
        remove_with(&paths, &id, "pv", Listed(vec![target.clone()]))
            .await
            .unwrap();
        assert!(contents(&target).is_empty());
    }

    /// Unmounts (lazily) on drop, so a failing assertion leaves no mount behind.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    fn bind(from: &Path, at: &Path) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        nix::mount::mount(
            Some(from),
            at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        Mounted(at.to_owned())
    }

    /// Spec §5.3: "EBUSY when something is bind-mounted inside". With a real bind mount
    /// below the target the operation fails and neither the target's files nor the bind
    /// mount's source lose anything (Mesos deletes through the mount first).
    #[tokio::test]
    async fn a_real_bind_mount_inside_the_target_fails_with_ebusy() {
        if !slrp_test_support::require_root("a_real_bind_mount_inside_the_target_fails_with_ebusy")
        {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let (paths, id, target) = volume_v(&root.path().join("mounts"));
        fill(&target);
        let source = root.path().join("task-data");
        fill(&source);
        let _mounted = bind(&source, &target.join("a/b/sandbox"));

        let error = remove_persistent_data(&paths, &id, "pv").await.unwrap_err();
        assert!(
            error.starts_with(&format!(
                "Failed to remove persistent volume 'pv' at '{}': ",
                target.display()
            )),
            "{error}"
        );
        assert!(error.contains("busy"), "{error}");
        assert_eq!(contents(&source), ["a", "top"]);
        assert_eq!(contents(&target), ["a", "top"]);
    }

    /// A published volume: the target is a mount point, and its contents are the data
    /// DESTROY removes; the mount stays.
    #[tokio::test]
    async fn a_mounted_target_is_emptied() {
        if !slrp_test_support::require_root("a_mounted_target_is_emptied") {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let (paths, id, target) = volume_v(&root.path().join("mounts"));
        let volume = root.path().join("volume");
        fill(&volume);
        let _mounted = bind(&volume, &target);

        remove_persistent_data(&paths, &id, "pv").await.unwrap();
        assert!(contents(&target).is_empty());
        assert!(contents(&volume).is_empty());
    }
}
