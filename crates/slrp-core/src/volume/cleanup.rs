//! Mount-directory cleanup: finding the directories of untracked volumes, undoing what
//! is still mounted there and removing them without ever recursing; and removing what
//! users wrote to a volume before it is deleted.

use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};

use slrp_csi::{AccessType, CsiRpc, CsiVolumes, VolumeCapability, VolumeId};
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

impl<C: CsiVolumes> Ctx<C> {
    /// Removes what users wrote to a published volume before it is deleted (Mesos
    /// `_deleteVolume`: the contents of the target path, not the target itself), so that
    /// no data passes to the next user of the space.
    ///
    /// MOUNT: every entry below the target (symbolic links are removed, never followed; a
    /// target that is itself a link is refused),
    /// refused if anything is mounted below the target, since a recursive removal would
    /// reach into it. BLOCK: the device published at the target is overwritten with
    /// zeros and synced (Mesos leaves block volumes alone, §12.24).
    pub(super) async fn remove_contents(
        &self,
        id: &VolumeId,
        capability: &VolumeCapability,
    ) -> Result<(), VolumeError> {
        let cleanup_err = |source| VolumeError::Cleanup {
            id: id.clone(),
            source,
        };
        let target = self.target_path(id)?;
        let nested: Vec<PathBuf> = self
            .cfg
            .mounts
            .mounts_under(&target)
            .map_err(cleanup_err)?
            .into_iter()
            .filter(|m| m != &target)
            .collect();
        if let Some(first) = nested.first() {
            return Err(cleanup_err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{} is mounted below the target", first.display()),
            )));
        }
        let block = matches!(capability.access_type, AccessType::Block);
        let path = target.clone();
        tokio::task::spawn_blocking(move || {
            // Opening or listing the target would follow a link there, to whatever it
            // names outside the volume (Mesos's removal does not follow it either).
            if std::fs::symlink_metadata(&path)?.file_type().is_symlink() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is a symbolic link; not followed", path.display()),
                ));
            }
            if block {
                zero_fill(&path)
            } else {
                remove_entries(&path)
            }
        })
        .await
        .map_err(|e| cleanup_err(io::Error::other(e)))?
        .map_err(cleanup_err)?;
        tracing::info!(volume = %id, target = %target.display(), block, "volume contents removed before deletion");
        Ok(())
    }
}

/// Removes every entry of `dir`, not `dir` itself.
fn remove_entries(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        // `file_type` does not follow links: a link to a directory is removed as a link.
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Overwrites the block device at `path` with zeros, end to end, and syncs it.
fn zero_fill(path: &Path) -> io::Result<()> {
    const CHUNK: usize = 1 << 20;
    let mut dev = std::fs::OpenOptions::new().write(true).open(path)?;
    let size = dev.seek(io::SeekFrom::End(0))?;
    dev.seek(io::SeekFrom::Start(0))?;
    let zeros = vec![0u8; CHUNK];
    let mut left = size;
    while left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        dev.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    dev.sync_all()
}
