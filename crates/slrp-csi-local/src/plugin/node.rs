//! The Node service: staging, publishing, stats and node-side expansion.

use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::{Plugin, disk_usage, io_host, lock, to_i64};
use slrp_types::DisplayChain;

use crate::error::VolumeError;
use crate::host::Host;
use crate::ids;
use crate::store::{Access, Backend, Published, Staged, VolumeRecord};
use crate::types::{
    AccessMode, AccessType, Capability, CapacityRange, Condition, PublishVolume, StageVolume,
    Usage, UsageUnit, VolumeStats,
};

impl<H: Host> Plugin<H> {
    // === Node ===

    /// The node id and per-node volume limit.
    pub fn node_info(&self) -> (String, u64) {
        (self.node_id.clone(), self.max_volumes_per_node)
    }

    fn node_path(field: &'static str, raw: &str) -> Result<PathBuf, VolumeError> {
        ids::co_path(raw).map_err(|r| VolumeError::invalid(field, format!("{raw:?} {r}")))
    }

    /// A path the plugin is about to mount onto, which must not be a symbolic link: mount(2)
    /// follows it, so a link planted there would put the volume over whatever it points to
    /// (and an unmount there would take down a foreign mount). `RealHost::bind_mount`
    /// re-checks at the mount itself, closing the window after this check.
    fn mount_path(field: &'static str, raw: &str) -> Result<PathBuf, VolumeError> {
        let path = Self::node_path(field, raw)?;
        match fs::symlink_metadata(&path) {
            Ok(md) if md.file_type().is_symlink() => Err(VolumeError::invalid(
                field,
                format!(
                    "{raw:?} is a symbolic link; mount points must be real directories or files"
                ),
            )),
            _ => Ok(path),
        }
    }

    fn ensure_attached(&self, rec: &VolumeRecord) -> Result<PathBuf, VolumeError> {
        let file = self.layout.backing(rec);
        let host = |e| VolumeError::host("attaching loop device", &rec.id, e);
        if !file.is_file() {
            return Err(VolumeError::precondition(format!(
                "image {} of volume {} is missing",
                file.display(),
                rec.id
            )));
        }
        if let Some(dev) = self
            .host
            .loop_devices_of(&file)
            .map_err(host)?
            .into_iter()
            .next()
        {
            return Ok(dev);
        }
        self.host.loop_attach(&file).map_err(host)
    }

    /// Makes sure the device carries a file system, formatting only a volume never
    /// formatted before. Returns the file system type.
    ///
    /// An mkfs that was interrupted (tool timeout, plugin crash) left `formatting` set; it is
    /// redone with `force`, whatever blkid finds: a killed mkfs.xfs leaves a signature that
    /// blkid reports as xfs but that neither mounts nor lets a plain mkfs.xfs run.
    fn ensure_formatted(&self, rec: &mut VolumeRecord, dev: &Path) -> Result<String, VolumeError> {
        if !rec.formatted && rec.formatting {
            tracing::warn!(volume_id = %rec.id, "an earlier mkfs of this volume did not complete; formatting again");
            return self.format(rec, dev, true);
        }
        let host = |e| VolumeError::host("preparing file system", &rec.id, e);
        let found = self.host.probe_fs(dev).map_err(host)?;
        match (found, rec.formatted) {
            (Some(fs), _) => {
                if !rec.formatted || rec.fs_type.as_deref() != Some(fs.as_str()) {
                    rec.formatted = true;
                    rec.fs_type = Some(fs.clone());
                    self.save(rec.clone())?;
                }
                Ok(fs)
            }
            (None, true) => Err(VolumeError::precondition(format!(
                "volume {} was formatted but no file system is found on {}; refusing to format it again",
                rec.id,
                dev.display()
            ))),
            (None, false) => self.format(rec, dev, false),
        }
    }

    /// Runs mkfs with its intent recorded first (see [`VolumeRecord::formatting`]).
    fn format(
        &self,
        rec: &mut VolumeRecord,
        dev: &Path,
        force: bool,
    ) -> Result<String, VolumeError> {
        let fs = rec.fs_type.clone().unwrap_or_else(|| "ext4".to_owned());
        if !rec.formatting {
            rec.formatting = true;
            self.save(rec.clone())?;
        }
        self.host
            .mkfs(dev, &fs, force)
            .map_err(|e| VolumeError::host("formatting", &rec.id, e))?;
        rec.formatted = true;
        rec.formatting = false;
        // A fresh file system fills the device: nothing left to grow.
        rec.grow_fs = false;
        rec.fs_type = Some(fs.clone());
        self.save(rec.clone())?;
        tracing::info!(volume_id = %rec.id, fs_type = %fs, "formatted volume");
        Ok(fs)
    }

    fn ensure_dir(path: &Path, volume_id: &str) -> Result<(), VolumeError> {
        fs::create_dir_all(path).map_err(|e| {
            VolumeError::host(
                "creating mount point",
                volume_id,
                io_host("creating", path)(e),
            )
        })
    }

    /// NodeStageVolume.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS (path used by another volume or staged
    /// with other arguments), FAILED_PRECONDITION (capability the volume cannot serve),
    /// RESOURCE_EXHAUSTED (`max_volumes_per_node`).
    pub fn stage_volume(&self, req: &StageVolume) -> Result<(), VolumeError> {
        if req.volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let path = Self::mount_path("staging_target_path", &req.staging_target_path)?;
        let _v = self.busy.lock(&req.volume_id);
        let mut rec = self.lookup(&req.volume_id)?;
        Self::compatible(&rec, &req.capability).map_err(VolumeError::precondition)?;
        let (fs_type, mount_flags) = match &req.capability.access {
            AccessType::Mount {
                fs_type,
                mount_flags,
            } => (fs_type.clone(), mount_flags.clone()),
            AccessType::Block => (String::new(), Vec::new()),
        };
        let wanted = Staged {
            path: path.clone(),
            fs_type,
            mount_flags,
        };
        let claims = lock(&self.node_claims);
        let (others_here, staged_count) = {
            let vols = lock(&self.volumes);
            let here = vols
                .values()
                .find(|r| r.id != rec.id && r.staged.as_ref().is_some_and(|s| s.path == path))
                .map(|r| r.id.clone());
            (here, vols.values().filter(|r| r.staged.is_some()).count())
        };
        if let Some(other) = others_here {
            return Err(VolumeError::AlreadyExists {
                what: format!("{} is the staging path of volume {other}", path.display()),
            });
        }
        let fresh = match &rec.staged {
            Some(s) if *s == wanted => false,
            Some(s) if s.path == path => {
                return Err(VolumeError::AlreadyExists {
                    what: format!(
                        "volume {} is staged at {} with a different capability",
                        rec.id,
                        path.display()
                    ),
                });
            }
            Some(s) => {
                return Err(VolumeError::precondition(format!(
                    "volume {} is already staged at {}",
                    rec.id,
                    s.path.display()
                )));
            }
            None => {
                if self.max_volumes_per_node > 0 && staged_count as u64 >= self.max_volumes_per_node
                {
                    return Err(VolumeError::TooManyVolumes {
                        limit: self.max_volumes_per_node,
                    });
                }
                rec.staged = Some(wanted.clone());
                self.save(rec.clone())?;
                true
            }
        };
        drop(claims);
        match self.do_stage(&mut rec, &wanted) {
            Ok(()) => {
                if fresh {
                    tracing::info!(volume_id = %rec.id, path = %path.display(), "staged volume");
                }
                Ok(())
            }
            Err(e) => {
                if fresh {
                    self.undo_stage(&mut rec, &path);
                }
                Err(e)
            }
        }
    }

    fn do_stage(&self, rec: &mut VolumeRecord, st: &Staged) -> Result<(), VolumeError> {
        let id = rec.id.clone();
        let host = |e| VolumeError::host("staging", &id, e);
        match (rec.backend, rec.access) {
            (Backend::Dir, _) => {
                let backing = self.layout.backing(rec);
                if !backing.is_dir() {
                    return Err(VolumeError::precondition(format!(
                        "directory {} of volume {} is missing",
                        backing.display(),
                        rec.id
                    )));
                }
                Self::ensure_dir(&st.path, &rec.id)?;
                if !self.host.is_mount_point(&st.path).map_err(host)? {
                    self.host
                        .bind_mount(&backing, &st.path, false)
                        .map_err(host)?;
                }
            }
            (Backend::Loop, Access::Mount) => {
                let dev = self.ensure_attached(rec)?;
                let fs = self.ensure_formatted(rec, &dev)?;
                Self::ensure_dir(&st.path, &rec.id)?;
                let mounted = self.host.is_mount_point(&st.path).map_err(host)?;
                // A volume restored or cloned into a larger size still has its source's
                // file system size. ext* grows before the mount (offline growth needs no
                // CAP_SYS_RESOURCE, which containers often lack); xfs only grows mounted.
                if rec.grow_fs && !mounted && fs.starts_with("ext") {
                    self.host
                        .grow_fs_offline(&dev, &fs)
                        .map_err(|e| VolumeError::host("growing the file system", &id, e))?;
                    rec.grow_fs = false;
                    self.save(rec.clone())?;
                    tracing::info!(volume_id = %id, fs_type = %fs, "grew the file system to the volume's size");
                }
                if !mounted {
                    self.host
                        .mount_fs(&dev, &st.path, Some(&fs), &st.mount_flags)
                        .map_err(host)?;
                }
                if rec.grow_fs {
                    self.host
                        .grow_fs(&dev, &st.path, &fs)
                        .map_err(|e| VolumeError::host("growing the file system", &id, e))?;
                    rec.grow_fs = false;
                    self.save(rec.clone())?;
                    tracing::info!(volume_id = %id, fs_type = %fs, "grew the file system to the volume's size");
                }
            }
            (Backend::Loop, Access::Block) => {
                self.ensure_attached(rec)?;
            }
        }
        Ok(())
    }

    fn undo_stage(&self, rec: &mut VolumeRecord, path: &Path) {
        let _ = self.host.unmount_all(path);
        if rec.backend == Backend::Loop {
            let _ = self.detach_all(&self.layout.backing(rec));
        }
        rec.staged = None;
        if let Err(e) = self.save(rec.clone()) {
            tracing::error!(volume_id = %rec.id, error = %DisplayChain(&e), "could not record a failed stage as undone");
        }
    }

    /// NodeUnstageVolume: unmounts the staging path and detaches loop devices.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION while still published.
    pub fn unstage_volume(&self, volume_id: &str, staging_path: &str) -> Result<(), VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let path = Self::node_path("staging_target_path", staging_path)?;
        let _v = self.busy.lock(volume_id);
        let mut rec = self.lookup(volume_id)?;
        if rec.staged.as_ref().is_none_or(|s| s.path != path) {
            return Ok(());
        }
        if let Some(p) = rec.published.first() {
            return Err(VolumeError::precondition(format!(
                "volume {volume_id} is still published at {}",
                p.target.display()
            )));
        }
        let host = |e| VolumeError::host("unstaging", volume_id, e);
        self.host.unmount_all(&path).map_err(host)?;
        if rec.backend == Backend::Loop {
            self.detach_all(&self.layout.backing(&rec)).map_err(host)?;
        }
        rec.staged = None;
        self.save(rec)?;
        tracing::info!(volume_id, path = %path.display(), "unstaged volume");
        Ok(())
    }

    /// NodePublishVolume.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS (same target, other arguments),
    /// FAILED_PRECONDITION (not staged there, published elsewhere, unsupported capability).
    pub fn publish_volume(&self, req: &PublishVolume) -> Result<(), VolumeError> {
        if req.volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let target = Self::mount_path("target_path", &req.target_path)?;
        if req.staging_target_path.is_empty() {
            return Err(VolumeError::precondition(
                "staging_target_path is not set; the plugin has STAGE_UNSTAGE_VOLUME, call NodeStageVolume first",
            ));
        }
        let staging = Self::node_path("staging_target_path", &req.staging_target_path)?;
        let _v = self.busy.lock(&req.volume_id);
        let mut rec = self.lookup(&req.volume_id)?;
        Self::compatible(&rec, &req.capability).map_err(VolumeError::precondition)?;
        if rec.staged.as_ref().is_none_or(|s| s.path != staging) {
            return Err(VolumeError::precondition(format!(
                "volume {} is not staged at {}",
                rec.id,
                staging.display()
            )));
        }
        // Only the request's flag, as Mesos's test plugin does: the CO decides. A CO that
        // publishes a reader-only volume writable (Mesos, for persistent-volume layout
        // and cleanup) must get a writable mount.
        let readonly = req.readonly;
        let mount_flags = match &req.capability.access {
            AccessType::Mount { mount_flags, .. } => mount_flags.clone(),
            AccessType::Block => Vec::new(),
        };
        let wanted = Published {
            target: target.clone(),
            readonly,
            mount_flags,
            multi_writer: req.capability.mode == AccessMode::SingleNodeMultiWriter,
        };
        let claims = lock(&self.node_claims);
        let other_owner = lock(&self.volumes)
            .values()
            .find(|r| r.id != rec.id && r.published.iter().any(|p| p.target == target))
            .map(|r| r.id.clone());
        if let Some(other) = other_owner {
            return Err(VolumeError::AlreadyExists {
                what: format!("{} is the target of volume {other}", target.display()),
            });
        }
        let fresh = match rec.published.iter().find(|p| p.target == target) {
            Some(p) if *p == wanted => false,
            Some(_) => {
                return Err(VolumeError::AlreadyExists {
                    what: format!(
                        "volume {} is published at {} with a different readonly flag or capability",
                        rec.id,
                        target.display()
                    ),
                });
            }
            None => {
                // CSI's second table for NodePublishVolume: only SINGLE_NODE_MULTI_WRITER
                // lets a volume be published at several targets of the node.
                let shared = wanted.multi_writer && rec.published.iter().all(|p| p.multi_writer);
                if let Some(p) = rec.published.first()
                    && !shared
                {
                    return Err(VolumeError::precondition(format!(
                        "volume {} is already published at {}; only SINGLE_NODE_MULTI_WRITER publications share a volume",
                        rec.id,
                        p.target.display()
                    )));
                }
                rec.published.push(wanted.clone());
                self.save(rec.clone())?;
                true
            }
        };
        drop(claims);
        match self.do_publish(&rec, &staging, &wanted) {
            Ok(()) => {
                if fresh {
                    tracing::info!(volume_id = %rec.id, target = %target.display(), readonly, "published volume");
                }
                Ok(())
            }
            Err(e) => {
                if fresh {
                    let _ = self.host.unmount_all(&target);
                    rec.published.retain(|p| p.target != target);
                    if let Err(se) = self.save(rec.clone()) {
                        tracing::error!(volume_id = %rec.id, error = %DisplayChain(&se), "could not record a failed publish as undone");
                    }
                }
                Err(e)
            }
        }
    }

    fn do_publish(
        &self,
        rec: &VolumeRecord,
        staging: &Path,
        p: &Published,
    ) -> Result<(), VolumeError> {
        let host = |e| VolumeError::host("publishing", &rec.id, e);
        match rec.access {
            Access::Mount => {
                Self::ensure_dir(&p.target, &rec.id)?;
                if !self.host.is_mount_point(&p.target).map_err(host)? {
                    if !self.host.is_mount_point(staging).map_err(host)? {
                        return Err(VolumeError::precondition(format!(
                            "nothing is mounted at staging path {}; stage the volume again",
                            staging.display()
                        )));
                    }
                    self.host
                        .bind_mount(staging, &p.target, p.readonly)
                        .map_err(host)?;
                }
            }
            Access::Block => {
                // After a reboot the loop device is gone even though the record says staged.
                let dev = self.ensure_attached(rec)?;
                if !p.target.exists() {
                    if let Some(parent) = p.target.parent() {
                        Self::ensure_dir(parent, &rec.id)?;
                    }
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&p.target)
                        .map_err(|e| host(io_host("creating", &p.target)(e)))?;
                }
                if !self.host.is_mount_point(&p.target).map_err(host)? {
                    self.host
                        .bind_mount(&dev, &p.target, p.readonly)
                        .map_err(host)?;
                }
            }
        }
        Ok(())
    }

    /// NodeUnpublishVolume: unmounts and removes the target.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, NOT_FOUND.
    pub fn unpublish_volume(&self, volume_id: &str, target_path: &str) -> Result<(), VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let target = Self::node_path("target_path", target_path)?;
        let _v = self.busy.lock(volume_id);
        let mut rec = self.lookup(volume_id)?;
        if !rec.published.iter().any(|p| p.target == target) {
            return Ok(());
        }
        let host = |e| VolumeError::host("unpublishing", volume_id, e);
        self.host.unmount_all(&target).map_err(host)?;
        // The spec makes the SP delete what it created at the target.
        let removed = match fs::symlink_metadata(&target) {
            Ok(md) if md.is_dir() => fs::remove_dir(&target),
            Ok(_) => fs::remove_file(&target),
            Err(e) => Err(e),
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(host(io_host("removing", &target)(e))),
        }
        rec.published.retain(|p| p.target != target);
        self.save(rec)?;
        tracing::info!(volume_id, target = %target.display(), "unpublished volume");
        Ok(())
    }

    /// The volume and one of its recorded staging or target paths, for the calls that name
    /// a volume by a path it is available at.
    ///
    /// Only an empty path is INVALID_ARGUMENT. Any other path that is not one of the
    /// volume's is NOT_FOUND, even a relative or malformed one: the volume does not exist
    /// there (the CSI row for these calls), and csi-sanity sends `some/path` expecting
    /// NOT_FOUND. Such a path is only compared with the records, never used.
    fn node_record_at(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<(VolumeRecord, PathBuf), VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        if volume_path.is_empty() {
            return Err(VolumeError::invalid("volume_path", "is empty"));
        }
        let rec = self.lookup(volume_id)?;
        let not_here = || VolumeError::PathNotFound {
            volume_id: volume_id.to_owned(),
            path: PathBuf::from(volume_path),
        };
        let path = ids::co_path(volume_path).map_err(|_| not_here())?;
        let known = rec.staged.as_ref().is_some_and(|s| s.path == path)
            || rec.published.iter().any(|p| p.target == path);
        if !known || !path.exists() {
            return Err(not_here());
        }
        Ok((rec, path))
    }

    fn condition(&self, rec: &VolumeRecord, path: &Path) -> Condition {
        let backing = self.layout.backing(rec);
        let abnormal = |m: String| Condition {
            abnormal: true,
            message: m,
        };
        let stored = self.backing_condition(rec);
        if stored.abnormal {
            return stored;
        }
        let must_be_mounted =
            rec.access == Access::Mount || rec.published.iter().any(|p| p.target == path);
        if must_be_mounted {
            match self.host.is_mount_point(path) {
                Ok(true) => {}
                Ok(false) => return abnormal(format!("nothing is mounted at {}", path.display())),
                Err(e) => return abnormal(format!("cannot read mounts: {}", DisplayChain(&e))),
            }
        }
        if rec.backend == Backend::Loop
            && rec.staged.is_some()
            && self
                .host
                .loop_devices_of(&backing)
                .map(|d| d.is_empty())
                .unwrap_or(true)
        {
            return abnormal("no loop device is attached".to_owned());
        }
        Condition {
            abnormal: false,
            message: "ok".to_owned(),
        }
    }

    /// NodeGetVolumeStats for a staging or target path of the volume.
    ///
    /// # Errors
    /// INVALID_ARGUMENT, NOT_FOUND (unknown volume, or not available at that path).
    pub fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<VolumeStats, VolumeError> {
        let (rec, path) = self.node_record_at(volume_id, volume_path)?;
        let condition = self.condition(&rec, &path);
        let mut usage = Vec::new();
        match rec.access {
            Access::Block => {
                let size = fs::metadata(self.layout.backing(&rec))
                    .map(|m| m.len())
                    .unwrap_or(rec.capacity_bytes);
                usage.push(Usage {
                    unit: UsageUnit::Bytes,
                    total: to_i64(size),
                    used: 0,
                    available: 0,
                });
            }
            Access::Mount => {
                let st = self
                    .host
                    .fs_stats(&path)
                    .map_err(|e| VolumeError::host("reading usage", volume_id, e))?;
                let bytes = match rec.backend {
                    // A directory shares its file system: report the volume's own share.
                    Backend::Dir => {
                        let used = disk_usage(&self.layout.backing(&rec));
                        let total = rec.capacity_bytes.max(used);
                        Usage {
                            unit: UsageUnit::Bytes,
                            total: to_i64(total),
                            used: to_i64(used),
                            available: to_i64((total - used).min(st.available_bytes)),
                        }
                    }
                    Backend::Loop => Usage {
                        unit: UsageUnit::Bytes,
                        total: to_i64(st.total_bytes),
                        used: to_i64(st.used_bytes),
                        available: to_i64(st.available_bytes),
                    },
                };
                usage.push(bytes);
                usage.push(Usage {
                    unit: UsageUnit::Inodes,
                    total: to_i64(st.total_inodes),
                    used: to_i64(st.total_inodes.saturating_sub(st.free_inodes)),
                    available: to_i64(st.free_inodes),
                });
            }
        }
        Ok(VolumeStats { usage, condition })
    }

    /// NodeExpandVolume: lets the loop device and file system use the grown image.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (also for a capability the volume does not serve), NOT_FOUND,
    /// OUT_OF_RANGE (more than ControllerExpandVolume granted, or a limit below the
    /// current size), FAILED_PRECONDITION (not staged).
    pub fn node_expand_volume(
        &self,
        volume_id: &str,
        volume_path: &str,
        range: Option<CapacityRange>,
        capability: Option<&Capability>,
    ) -> Result<u64, VolumeError> {
        let (req, lim) = Self::check_range(range)?;
        let _v = self.busy.lock(volume_id);
        let (rec, _path) = self.node_record_at(volume_id, volume_path)?;
        if let Some(cap) = capability {
            Self::compatible(&rec, cap)
                .map_err(|r| VolumeError::invalid("volume_capability", r))?;
        }
        if req > rec.capacity_bytes {
            return Err(VolumeError::OutOfRange {
                reason: format!(
                    "required_bytes {req} exceeds the volume's {} bytes; call ControllerExpandVolume first",
                    rec.capacity_bytes
                ),
            });
        }
        if lim > 0 && lim < rec.capacity_bytes {
            return Err(VolumeError::OutOfRange {
                reason: format!(
                    "volume has {} bytes; shrinking to {lim} is not supported",
                    rec.capacity_bytes
                ),
            });
        }
        if rec.backend == Backend::Loop {
            let host = |e| VolumeError::host("expanding", volume_id, e);
            let backing = self.layout.backing(&rec);
            let dev = self
                .host
                .loop_devices_of(&backing)
                .map_err(host)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    VolumeError::precondition(format!("volume {volume_id} is not staged"))
                })?;
            self.host.loop_refresh_size(&dev).map_err(host)?;
            if let (Access::Mount, Some(st)) = (rec.access, &rec.staged) {
                let fs = rec.fs_type.as_deref().unwrap_or("ext4");
                self.host.grow_fs(&dev, &st.path, fs).map_err(host)?;
            }
            tracing::info!(
                volume_id,
                size = rec.capacity_bytes,
                "expanded volume on node"
            );
        }
        Ok(rec.capacity_bytes)
    }
}
