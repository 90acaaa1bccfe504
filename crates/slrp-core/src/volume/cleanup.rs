//! Mount-directory cleanup: finding the directories of untracked volumes, undoing what
//! is still mounted there and removing them without ever recursing.

use std::path::{Path, PathBuf};

use slrp_csi::{CsiRpc, CsiVolumes, VolumeId};
use slrp_types::DisplayChain;

use super::driver::{is_already_done, path_str};
use super::error::VolumeError;
use super::jobs::Ctx;
use super::manager::Worker;
use super::paths::decode_volume_id;
use super::schedule::Key;

impl<C: CsiVolumes> Worker<C> {
    /// Mount directories whose volume is not tracked.
    pub(super) async fn untracked_dirs(&self) -> std::io::Result<Vec<(VolumeId, PathBuf)>> {
        let root = self.ctx.cfg.mount_paths.root().to_owned();
        let names = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<_>> {
            match std::fs::read_dir(&root) {
                Ok(rd) => rd.map(|e| e.map(|e| (e.file_name(), e.path()))).collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        })
        .await
        .map_err(std::io::Error::other)??;
        let mut out = Vec::new();
        for (name, path) in names {
            let decoded = name.to_str().map(decode_volume_id);
            match decoded {
                Some(Ok(id)) => {
                    let id = VolumeId::new(id);
                    if !self.volumes.contains_key(&id) {
                        out.push((id, path));
                    }
                }
                // Not ours to touch: Mesos fails recovery here; we leave it alone.
                Some(Err(_)) | None => {
                    tracing::warn!(path = %path.display(), "not an encoded volume id; left alone");
                }
            }
        }
        Ok(out)
    }
}

impl<C: CsiVolumes> Ctx<C> {
    /// Removes a volume's mount directory unless something is mounted at or below it (or
    /// the mount table cannot tell). Returns whether `dir` is gone.
    ///
    /// Never recursive: only the `staging` and `target` entries the manager creates are
    /// removed, and only when empty, then `dir` itself. `rmdir` fails on a mount point
    /// (EBUSY) and on a non-empty directory, so a mount the table did not show (made after
    /// the check, or in another namespace) or files someone wrote into a bare target are
    /// left for a person to look at rather than deleted. Mesos removes recursively.
    pub(super) async fn remove_if_unmounted(&self, dir: &Path) -> bool {
        match self.cfg.mounts.mounts_under(dir) {
            Ok(m) if m.is_empty() => {}
            Ok(_) | Err(_) => return false,
        }
        match remove_mount_dir(dir).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %DisplayChain(&e),
                    "mount directory not removed; left in place");
                false
            }
        }
    }

    /// Cleans up the mount directory of an untracked volume: unpublishes and unstages
    /// whatever is still mounted there (both idempotent), then removes the directory if
    /// nothing is mounted any more. Returns whether it is gone.
    pub(super) async fn collect(&self, key: &Key, dir: &Path) -> Result<bool, VolumeError> {
        let Key::Volume(id) = key else {
            return Ok(false);
        };
        let mounted = match self.cfg.mounts.mounts_under(dir) {
            Ok(m) => m,
            Err(_) => return Ok(false),
        };
        if !mounted.is_empty() {
            let target = dir.join("target");
            let staging = dir.join("staging");
            if mounted.iter().any(|m| m == &target) {
                let p = path_str(id, &target)?;
                if let Err(e) = self
                    .call(CsiRpc::NodeUnpublishVolume, || {
                        self.csi.node_unpublish(id, &p)
                    })
                    .await
                    && !is_already_done(&e)
                {
                    tracing::warn!(volume = %id, error = %DisplayChain(&e), "NodeUnpublishVolume of a leftover failed");
                }
            }
            if self.cfg.caps.node_stage() && mounted.iter().any(|m| m == &staging) {
                let p = path_str(id, &staging)?;
                if let Err(e) = self
                    .call(CsiRpc::NodeUnstageVolume, || self.csi.node_unstage(id, &p))
                    .await
                    && !is_already_done(&e)
                {
                    tracing::warn!(volume = %id, error = %DisplayChain(&e), "NodeUnstageVolume of a leftover failed");
                }
            }
        }
        Ok(self.remove_if_unmounted(dir).await)
    }
}

/// See `Ctx::remove_if_unmounted`: removes `dir/staging`, `dir/target` and `dir` without
/// recursing. A missing entry is fine; a block target is an empty regular file.
async fn remove_mount_dir(dir: &Path) -> std::io::Result<()> {
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    for entry in ["staging", "target"] {
        let path = dir.join(entry);
        let meta = match tokio::fs::symlink_metadata(&path).await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_file() && meta.len() == 0 {
            gone(tokio::fs::remove_file(&path).await)?;
        } else {
            // A directory (removed only if empty and not a mount point); anything else
            // (a non-empty file, a device node, a symlink) makes rmdir fail and stay.
            gone(tokio::fs::remove_dir(&path).await)?;
        }
    }
    gone(tokio::fs::remove_dir(dir).await)
}
