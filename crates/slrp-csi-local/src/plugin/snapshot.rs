//! Snapshots (CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot) and volumes
//! created from a content source (a snapshot restored, a volume cloned).
//!
//! A snapshot is a full copy of its source volume's data under `<root>/snapshots/`: the
//! directory tree of a `dir` volume, the image file of a `loop` volume (a reflink where the
//! file system shares blocks, else a sparse copy; see [`crate::copy`]). It takes its
//! source's size from the source's pool, outlives the source, and needs nothing else to be
//! restored. A restore or clone copies the data into the new volume's backing, then grows
//! a loop image to the new size; its file system is grown at its first stage.
//!
//! Consistency of a copy of a volume in use (see also `docs/csi-local.md`):
//! - a loop MOUNT volume mounted at its staging path is frozen (`fsfreeze`) for the copy:
//!   the copy holds the file system as a clean crash would leave it, with every write that
//!   completed before the freeze; writers block until the thaw. The freeze is recorded
//!   first, so a crash while frozen is thawed at the next start;
//! - a loop BLOCK volume staged here has its device's cached writes flushed first; writes
//!   made during the copy may or may not be in it, possibly torn: quiesce the writer first;
//! - a dir volume is copied file by file while writers may run: files written during the
//!   copy may be torn or from different moments: quiesce the writers first.
//!
//! Crash safety: the record (phase `creating`) is durable before the copy starts and is
//! marked ready only after the copy is durable; at start, a `creating` snapshot has its
//! partial copy and its record removed, so a crash at any point lists nothing half-made.
//! Restores and clones are volume creations and are rolled back the same way.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use slrp_types::DisplayChain;

use super::{Defaults, K8S_PARAM_PREFIX, Plugin, TOKEN_PREFIX, io_host, lock, to_i64};
use crate::copy::CopyMethod;
use crate::error::VolumeError;
use crate::host::{Host, HostError};
use crate::ids;
use crate::store::{
    self, Access, Backend, ContentSource, Origin, Phase, SnapshotRecord, VolumeRecord,
};
use crate::types::{
    AccessType, CreateSnapshot, CreateVolume, SnapshotInfo, SnapshotPage, VolumeInfo,
};

/// The fault-injection point inside a copy (see [`crate::faults`]).
const COPY_POINT: &str = "copy";

/// What a content source offers a new volume: where its data is and what it is.
struct Source {
    /// "snapshot snap-…" or "volume vol-…", for messages.
    label: String,
    defaults: Defaults,
    pool: String,
    backend: Backend,
    access: Access,
    fs_type: Option<String>,
    formatted: bool,
    formatting: bool,
    size: u64,
}

fn access_name(access: Access) -> &'static str {
    match access {
        Access::Mount => "MOUNT",
        Access::Block => "BLOCK",
    }
}

/// Builds an error for a failed host step of a copy.
type HostErr<'a> = &'a dyn Fn(&'static str, HostError) -> VolumeError;

impl<H: Host> Plugin<H> {
    // === Snapshots ===

    /// CreateSnapshot: copies the volume's data, synchronously, and returns the snapshot
    /// ready to use. Idempotent by name: the same name and source return the same
    /// snapshot.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (missing or malformed fields, unknown parameters, an imported
    /// source), NOT_FOUND (no such volume), ALREADY_EXISTS (the name is a snapshot of
    /// another volume), RESOURCE_EXHAUSTED (the pool has no room for the copy),
    /// FAILED_PRECONDITION (the volume's storage is missing), INTERNAL (the copy failed).
    pub fn create_snapshot(&self, req: &CreateSnapshot) -> Result<SnapshotInfo, VolumeError> {
        Self::check_name("name", &req.name)?;
        if req.source_volume_id.is_empty() {
            return Err(VolumeError::invalid("source_volume_id", "is empty"));
        }
        let parameters = Self::parse_snapshot_parameters(&req.parameters)?;

        let _c = lock(&self.controller);
        let existing = lock(&self.snapshots)
            .values()
            .find(|r| r.name == req.name)
            .cloned();
        if let Some(rec) = existing {
            if rec.source_volume_id == req.source_volume_id {
                return Ok(Self::snapshot_info(&rec));
            }
            return Err(VolumeError::AlreadyExists {
                what: format!(
                    "snapshot name {:?} is taken by {}, a snapshot of volume {}",
                    req.name, rec.id, rec.source_volume_id
                ),
            });
        }
        let _v = self.busy.lock(&req.source_volume_id);
        let mut source = self.lookup(&req.source_volume_id)?;
        let pool = match (&source.origin, &source.pool) {
            (Origin::Created, Some(pool)) => pool.clone(),
            (Origin::Imported, _) | (Origin::Created, None) => {
                return Err(VolumeError::invalid(
                    "source_volume_id",
                    format!(
                        "volume {} is imported: it belongs to no pool to account a copy against, so it cannot be snapshotted",
                        source.id
                    ),
                ));
            }
        };
        let available = self.pool_available(&pool).unwrap_or(0);
        if source.capacity_bytes > available {
            return Err(VolumeError::NoSpace {
                reason: format!(
                    "a snapshot of volume {} takes {} bytes but pool {pool:?} has {available} bytes available",
                    source.id, source.capacity_bytes
                ),
            });
        }
        let rec = SnapshotRecord::new(
            ids::new_snapshot_id(),
            req.name.clone(),
            &source,
            pool,
            SystemTime::now(),
            parameters,
        );
        // Phase `creating` is durable before the copy starts: a crash from here on is
        // rolled back at start, never leaving a half-made snapshot listed.
        self.save_snapshot(rec.clone())?;
        let dest = self.layout.snapshot_data(&rec);
        let snapshot_id = rec.id.clone();
        let err = |action, e| VolumeError::snapshot_host(action, &snapshot_id, e);
        let copied = self
            .copy_from_volume(&mut source, &dest, "CreateSnapshot", &err)
            .and_then(|method| {
                let parent = dest.parent().unwrap_or(&self.layout.root);
                store::sync_dir(parent).map_err(|e| VolumeError::snapshot_store(&rec.id, e))?;
                Ok(method)
            });
        let method = match copied {
            Ok(m) => m,
            Err(e) => {
                let _ = self.remove_snapshot_data(&rec);
                if let Err(fe) = self.forget_snapshot(&rec.id) {
                    tracing::error!(snapshot_id = %rec.id, error = %DisplayChain(&fe), "could not drop the record of a failed snapshot; it is rolled back at next start");
                }
                return Err(e);
            }
        };
        let mut ready = rec;
        ready.phase = Phase::Ready;
        self.save_snapshot(ready.clone())?;
        tracing::info!(snapshot_id = %ready.id, name = %ready.name, source_volume_id = %ready.source_volume_id,
            size = ready.size_bytes, method = method.as_str(), "created snapshot");
        Ok(Self::snapshot_info(&ready))
    }

    /// CreateSnapshot parameters: only the keys Kubernetes' sidecars add are accepted (and
    /// ignored); anything else is refused, so a typo is caught.
    fn parse_snapshot_parameters(
        params: &HashMap<String, String>,
    ) -> Result<BTreeMap<String, String>, VolumeError> {
        if let Some(k) = params.keys().find(|k| !k.starts_with(K8S_PARAM_PREFIX)) {
            return Err(VolumeError::invalid(
                "parameters",
                format!("unknown parameter {k:?} (snapshots take none)"),
            ));
        }
        Ok(params.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// DeleteSnapshot: unknown ids succeed. Volumes restored from the snapshot are full
    /// copies, so a snapshot is never in use.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for an empty id, INTERNAL if the copy cannot be removed.
    pub fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), VolumeError> {
        if snapshot_id.is_empty() {
            return Err(VolumeError::invalid("snapshot_id", "is empty"));
        }
        if !ids::is_valid_snapshot_id(snapshot_id) {
            return Ok(());
        }
        let _c = lock(&self.controller);
        let Some(mut rec) = lock(&self.snapshots).get(snapshot_id).cloned() else {
            return Ok(());
        };
        rec.phase = Phase::Deleting;
        self.save_snapshot(rec.clone())?;
        self.remove_snapshot_data(&rec)?;
        self.forget_snapshot(snapshot_id)?;
        tracing::info!(snapshot_id, "deleted snapshot");
        Ok(())
    }

    /// GetSnapshot.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for an empty id, NOT_FOUND for a snapshot the plugin does not have.
    pub fn get_snapshot(&self, snapshot_id: &str) -> Result<SnapshotInfo, VolumeError> {
        if snapshot_id.is_empty() {
            return Err(VolumeError::invalid("snapshot_id", "is empty"));
        }
        self.ready_snapshot(snapshot_id)
            .map(|rec| Self::snapshot_info(&rec))
    }

    /// ListSnapshots, sorted by id, optionally only `snapshot_id` and/or only the snapshots
    /// of `source_volume_id` (an unknown one lists nothing). Tokens name the first id of
    /// the next page, as ListVolumes's do.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for negative `max_entries`, ABORTED for a foreign token.
    pub fn list_snapshots(
        &self,
        max_entries: i32,
        starting_token: &str,
        source_volume_id: &str,
        snapshot_id: &str,
    ) -> Result<SnapshotPage, VolumeError> {
        let max = usize::try_from(max_entries)
            .map_err(|_| VolumeError::invalid("max_entries", "is negative"))?;
        let start = if starting_token.is_empty() {
            String::new()
        } else {
            match starting_token.strip_prefix(TOKEN_PREFIX) {
                Some(id) if ids::is_valid_snapshot_id(id) => id.to_owned(),
                _ => {
                    return Err(VolumeError::InvalidToken {
                        token: starting_token.to_owned(),
                    });
                }
            }
        };
        let snapshots = lock(&self.snapshots);
        let mut matching = snapshots.range(start..).map(|(_, r)| r).filter(|r| {
            r.phase == Phase::Ready
                && (snapshot_id.is_empty() || r.id == snapshot_id)
                && (source_volume_id.is_empty() || r.source_volume_id == source_volume_id)
        });
        let mut entries = Vec::new();
        let mut next_token = String::new();
        for rec in matching.by_ref() {
            if max > 0 && entries.len() == max {
                next_token = format!("{TOKEN_PREFIX}{}", rec.id);
                break;
            }
            entries.push(Self::snapshot_info(rec));
        }
        Ok(SnapshotPage {
            entries,
            next_token,
        })
    }

    fn snapshot_info(rec: &SnapshotRecord) -> SnapshotInfo {
        let since_epoch = Duration::new(
            u64::try_from(rec.created_secs).unwrap_or(0),
            rec.created_nanos,
        );
        SnapshotInfo {
            snapshot_id: rec.id.clone(),
            source_volume_id: rec.source_volume_id.clone(),
            size_bytes: to_i64(rec.size_bytes),
            creation_time: SystemTime::UNIX_EPOCH + since_epoch,
            ready_to_use: rec.phase == Phase::Ready,
        }
    }

    /// The ready record of snapshot `id`.
    fn ready_snapshot(&self, id: &str) -> Result<SnapshotRecord, VolumeError> {
        let found = ids::is_valid_snapshot_id(id)
            .then(|| lock(&self.snapshots).get(id).cloned())
            .flatten()
            .filter(|r| r.phase == Phase::Ready);
        found.ok_or_else(|| VolumeError::SnapshotNotFound {
            snapshot_id: id.to_owned(),
        })
    }

    fn save_snapshot(&self, rec: SnapshotRecord) -> Result<(), VolumeError> {
        self.snapshot_store
            .put(&rec)
            .map_err(|e| VolumeError::snapshot_store(&rec.id, e))?;
        lock(&self.snapshots).insert(rec.id.clone(), rec);
        Ok(())
    }

    fn forget_snapshot(&self, id: &str) -> Result<(), VolumeError> {
        self.snapshot_store
            .remove(id)
            .map_err(|e| VolumeError::snapshot_store(id, e))?;
        lock(&self.snapshots).remove(id);
        Ok(())
    }

    /// Removes a snapshot's copy (absent is fine) and makes the removal durable.
    pub(super) fn remove_snapshot_data(&self, rec: &SnapshotRecord) -> Result<(), VolumeError> {
        let path = self.layout.snapshot_data(rec);
        let res = match rec.backend {
            Backend::Dir => fs::remove_dir_all(&path),
            Backend::Loop => fs::remove_file(&path),
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(VolumeError::snapshot_host(
                    "removing the copy",
                    &rec.id,
                    io_host("removing", &path)(e),
                ));
            }
        }
        let parent = path.parent().unwrap_or(&self.layout.root);
        store::sync_dir(parent).map_err(|e| VolumeError::snapshot_store(&rec.id, e))
    }

    // === Copies ===

    /// Copies `from` to `to` (a tree or an image), exiting half-way if a fault rule says
    /// so for `rpc` (a crash in the middle of a copy, for the recovery tests).
    fn copy_data(
        &self,
        backend: Backend,
        from: &Path,
        to: &Path,
        rpc: &'static str,
    ) -> Result<CopyMethod, HostError> {
        let crash = self.faults.take_at(rpc, COPY_POINT);
        let exit = || {
            tracing::warn!(rpc, "fault injection: exiting in the middle of a copy");
            // A crash as the CO would see it: no reply, no cleanup.
            std::process::exit(1)
        };
        let mut progress = || {
            if crash {
                exit();
            }
        };
        let method = match backend {
            Backend::Dir => self.host.copy_tree(from, to, &mut progress),
            Backend::Loop => self.host.copy_image(from, to, &mut progress),
        }?;
        if crash {
            // A copy that had nothing to report (an empty tree, an image of holes) still
            // crashes before it is recorded complete.
            exit();
        }
        Ok(method)
    }

    /// Copies the data of `source` (whose lock the caller holds) to `dest`, as consistent
    /// as the volume's use allows (see the module docs): a mounted loop file system is
    /// frozen for the copy, a staged block device flushed first.
    fn copy_from_volume(
        &self,
        source: &mut VolumeRecord,
        dest: &Path,
        rpc: &'static str,
        err: HostErr<'_>,
    ) -> Result<CopyMethod, VolumeError> {
        let condition = self.backing_condition(source);
        if condition.abnormal {
            return Err(VolumeError::precondition(condition.message));
        }
        let from = self.layout.backing(source);
        let staged = source.staged.clone();
        let copy = |e| err("copying the volume's data", e);
        match (source.backend, source.access, staged) {
            (Backend::Loop, Access::Mount, Some(st))
                if self
                    .host
                    .is_mount_point(&st.path)
                    .map_err(|e| err("reading mounts", e))? =>
            {
                let device = self
                    .host
                    .loop_devices_of(&from)
                    .map_err(|e| err("finding the loop device", e))?
                    .into_iter()
                    .next();
                let Some(device) = device else {
                    return Err(VolumeError::precondition(format!(
                        "volume {} is mounted at {} but no loop device serves its image; stage it again",
                        source.id,
                        st.path.display()
                    )));
                };
                // Intent first: a crash while frozen is thawed at the next start.
                source.frozen = Some(st.path.clone());
                self.save(source.clone())?;
                if let Err(e) = self.host.freeze_fs(&device, &st.path) {
                    source.frozen = None;
                    self.save(source.clone())?;
                    return Err(err("freezing the file system", e));
                }
                let copied = self.copy_data(Backend::Loop, &from, dest, rpc);
                if let Err(e) = self.host.thaw_fs(&st.path) {
                    // `frozen` stays recorded, so the next start tries again.
                    tracing::error!(volume_id = %source.id, path = %st.path.display(), error = %DisplayChain(&e),
                        "could not thaw the file system after a copy; its writers are blocked");
                    return Err(err("thawing the file system", e));
                }
                source.frozen = None;
                self.save(source.clone())?;
                copied.map_err(copy)
            }
            (Backend::Loop, Access::Block, Some(_)) => {
                for device in self
                    .host
                    .loop_devices_of(&from)
                    .map_err(|e| err("finding the loop device", e))?
                {
                    self.host
                        .flush_device(&device)
                        .map_err(|e| err("flushing the loop device", e))?;
                }
                self.copy_data(Backend::Loop, &from, dest, rpc)
                    .map_err(copy)
            }
            (Backend::Loop, _, _) | (Backend::Dir, _, _) => self
                .copy_data(source.backend, &from, dest, rpc)
                .map_err(copy),
        }
    }

    // === Volumes from a content source ===

    /// What `source` offers, or why it cannot be used: NOT_FOUND if it does not exist,
    /// INVALID_ARGUMENT for an imported volume (no pool to account the copy against).
    fn resolve_source(&self, source: &ContentSource) -> Result<Source, VolumeError> {
        match source {
            ContentSource::Snapshot(id) => {
                let snap = self.ready_snapshot(id)?;
                Ok(Source {
                    label: format!("snapshot {id}"),
                    defaults: Defaults::of_snapshot(&snap),
                    pool: snap.pool,
                    backend: snap.backend,
                    access: snap.access,
                    fs_type: snap.fs_type,
                    formatted: snap.formatted,
                    formatting: snap.formatting,
                    size: snap.size_bytes,
                })
            }
            ContentSource::Volume(id) => {
                let vol = self.lookup(id)?;
                let Some(pool) = vol.pool.clone().filter(|_| vol.origin == Origin::Created) else {
                    return Err(VolumeError::invalid(
                        "volume_content_source",
                        format!(
                            "volume {id} is imported: it belongs to no pool to account a copy against, so it cannot be cloned"
                        ),
                    ));
                };
                Ok(Source {
                    label: format!("volume {id}"),
                    defaults: Defaults::of_volume(&vol),
                    pool,
                    backend: vol.backend,
                    access: vol.access,
                    fs_type: vol.fs_type,
                    formatted: vol.formatted,
                    formatting: vol.formatting,
                    size: vol.capacity_bytes,
                })
            }
        }
    }

    /// CreateVolume with a content source, name not taken (the caller holds the
    /// controller lock): checks that the new volume can hold the source's data, then
    /// creates it with a copy of that data.
    pub(super) fn create_from_source(
        &self,
        req: &CreateVolume,
        source: &ContentSource,
        pool: Option<String>,
        backend: Option<Backend>,
        parameters: BTreeMap<String, String>,
    ) -> Result<VolumeInfo, VolumeError> {
        let src = self.resolve_source(source)?;
        let cannot_hold = |why: String| {
            VolumeError::invalid(
                "volume_content_source",
                format!("{} cannot be copied into this volume: {why}", src.label),
            )
        };
        for cap in &req.capabilities {
            let wanted = match cap.access {
                AccessType::Mount { .. } => Access::Mount,
                AccessType::Block => Access::Block,
            };
            if wanted != src.access {
                return Err(cannot_hold(format!(
                    "it holds a {} volume's data, and a {} volume was asked for",
                    access_name(src.access),
                    access_name(wanted)
                )));
            }
        }
        let placement = self.checked_placement(&req.capabilities, pool, backend, &src.defaults)?;
        if placement.pool != src.pool {
            return Err(cannot_hold(format!(
                "it is in pool {:?} and the new volume would be in pool {:?}; a copy stays in its source's pool",
                src.pool, placement.pool
            )));
        }
        if placement.backend != src.backend {
            return Err(cannot_hold(format!(
                "it is a {} volume's data and the new volume would be a {} volume",
                src.backend.as_str(),
                placement.backend.as_str()
            )));
        }
        if placement.fs_type != src.fs_type {
            return Err(cannot_hold(format!(
                "it holds a {} file system and {} was asked for",
                src.fs_type.as_deref().unwrap_or("(no)"),
                placement.fs_type.as_deref().unwrap_or("none")
            )));
        }
        let (req_bytes, lim_bytes) = Self::check_range(req.capacity_range)?;
        // CSI: "trying to create a volume smaller than the source snapshot" is OUT_OF_RANGE.
        for (field, bytes) in [("required_bytes", req_bytes), ("limit_bytes", lim_bytes)] {
            if bytes > 0 && bytes < src.size {
                return Err(VolumeError::OutOfRange {
                    reason: format!(
                        "{field} {bytes} is below the {} bytes of {}; a copy is at least as large as its source",
                        src.size, src.label
                    ),
                });
            }
        }
        let (min, gran) = Self::min_size(
            placement.backend,
            placement.access,
            placement.fs_type.as_deref(),
        );
        let size = Self::choose_size(req_bytes.max(src.size), lim_bytes, min, gran)?;
        self.check_growth(Some(&placement.pool), size, size)?;

        let mut rec = VolumeRecord::new(
            ids::new_volume_id(),
            req.name.clone(),
            Origin::Created,
            placement.backend,
            placement.access,
            placement.fs_type,
            Some(placement.pool),
            size,
            parameters,
        );
        rec.content_source = Some(source.clone());
        rec.formatted = src.formatted;
        rec.formatting = src.formatting;
        // Only a file system that exists needs growing; one never made is made full size.
        rec.grow_fs = rec.backend == Backend::Loop
            && rec.access == Access::Mount
            && src.formatted
            && size > src.size;
        self.create_durably(rec, |rec| self.fill_from_source(rec, source))
    }

    /// Copies the source's data into the (new, `creating`) volume's backing, then grows a
    /// loop image to the volume's size, durably.
    fn fill_from_source(
        &self,
        rec: &VolumeRecord,
        source: &ContentSource,
    ) -> Result<(), VolumeError> {
        let dest = self.layout.backing(rec);
        let err = |action, e| VolumeError::host(action, &rec.id, e);
        let method = match source {
            ContentSource::Snapshot(id) => {
                let snap = self.ready_snapshot(id)?;
                let from = self.layout.snapshot_data(&snap);
                self.copy_data(rec.backend, &from, &dest, "CreateVolume")
                    .map_err(|e| err("restoring the snapshot's data", e))?
            }
            ContentSource::Volume(id) => {
                let _v = self.busy.lock(id);
                let mut vol = self.lookup(id)?;
                self.copy_from_volume(&mut vol, &dest, "CreateVolume", &err)?
            }
        };
        if rec.backend == Backend::Loop {
            let f = OpenOptions::new()
                .write(true)
                .open(&dest)
                .map_err(|e| err("growing the image", io_host("opening", &dest)(e)))?;
            let len = f
                .metadata()
                .map_err(|e| err("growing the image", io_host("reading", &dest)(e)))?
                .len();
            if len < rec.capacity_bytes {
                f.set_len(rec.capacity_bytes)
                    .map_err(|e| err("growing the image", io_host("sizing", &dest)(e)))?;
                f.sync_all()
                    .map_err(|e| err("growing the image", io_host("fsyncing", &dest)(e)))?;
            }
        }
        let parent = dest.parent().unwrap_or(&self.layout.root);
        store::sync_dir(parent).map_err(|e| VolumeError::store(&rec.id, e))?;
        tracing::info!(volume_id = %rec.id, source = ?source, method = method.as_str(), "copied the source's data");
        Ok(())
    }
}
