//! The Controller service: placement, sizes, and the volume lifecycle (create, delete,
//! expand, validate, list, capacity).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::path::Path;

use super::{
    DEFAULT_VOLUME_SIZE, Defaults, K8S_PARAM_PREFIX, LOOP_FS_TYPES, LOOP_GRANULARITY,
    MIN_BLOCK_SIZE, MIN_EXT_SIZE, MIN_XFS_SIZE, Placement, Plugin, TOKEN_PREFIX, io_host, lock,
    round_up, to_i64,
};
use crate::config::DEFAULT_POOL;
use slrp_types::DisplayChain;

use crate::error::VolumeError;
use crate::host::{Host, HostError};
use crate::ids;
use crate::store::{self, Access, Backend, ContentSource, Origin, Phase, VolumeRecord};
use crate::types::{
    self, AccessType, Capability, CapacityInfo, CapacityRange, Condition, CreateVolume, Validation,
    VolumeInfo, VolumePage,
};

impl<H: Host> Plugin<H> {
    // === Placement and sizes ===

    /// The `pool` and `backend` parameters, each `None` when not given.
    fn parse_parameters(
        params: &HashMap<String, String>,
    ) -> Result<(Option<String>, Option<Backend>), VolumeError> {
        let mut pool = None;
        let mut backend = None;
        for (k, v) in params {
            match k.as_str() {
                "pool" => {
                    if v.is_empty() {
                        return Err(VolumeError::invalid("parameters", "pool is empty"));
                    }
                    pool = Some(v.clone());
                }
                "backend" => {
                    backend = Some(match v.as_str() {
                        "dir" => Backend::Dir,
                        "loop" => Backend::Loop,
                        _ => {
                            return Err(VolumeError::invalid(
                                "parameters",
                                format!("backend {v:?} is not \"dir\" or \"loop\""),
                            ));
                        }
                    });
                }
                k if k.starts_with(K8S_PARAM_PREFIX) => {}
                _ => {
                    return Err(VolumeError::invalid(
                        "parameters",
                        format!("unknown parameter {k:?} (known: pool, backend)"),
                    ));
                }
            }
        }
        Ok((pool, backend))
    }

    /// Resolves capabilities plus parameters into a placement; what they leave open comes
    /// from `defaults` (a content source's), else the plugin's defaults. `Err` says why
    /// unsupported.
    fn placement(
        &self,
        capabilities: &[Capability],
        pool: Option<String>,
        backend: Option<Backend>,
        defaults: &Defaults,
    ) -> Result<Placement, String> {
        let pool = pool
            .or_else(|| defaults.pool.clone())
            .unwrap_or_else(|| DEFAULT_POOL.to_owned());
        let mut access = None;
        let mut fs_type: Option<String> = None;
        for cap in capabilities {
            if !cap.mode.is_supported() {
                return Err(format!(
                    "access mode {:?} is not supported by node-local volumes",
                    cap.mode
                ));
            }
            let this = match &cap.access {
                AccessType::Block => Access::Block,
                AccessType::Mount { fs_type: f, .. } => {
                    if !f.is_empty() {
                        if fs_type.as_deref().is_some_and(|prev| prev != f) {
                            return Err("capabilities ask for different fs_types".to_owned());
                        }
                        fs_type = Some(f.clone());
                    }
                    Access::Mount
                }
            };
            if access.is_some_and(|a| a != this) {
                return Err("a volume is either MOUNT or BLOCK, not both".to_owned());
            }
            access = Some(this);
        }
        let access = access.unwrap_or(Access::Mount);
        let backend = backend.or(defaults.backend).unwrap_or(match access {
            Access::Mount => Backend::Dir,
            Access::Block => Backend::Loop,
        });
        match (backend, access) {
            (Backend::Dir, Access::Block) => {
                return Err("the dir backend supports MOUNT access only".to_owned());
            }
            (Backend::Dir, Access::Mount) => {
                if let Some(f) = fs_type {
                    return Err(format!(
                        "the dir backend does not format a file system (fs_type {f:?}); use parameter backend=loop"
                    ));
                }
            }
            (Backend::Loop, Access::Block) => fs_type = None,
            (Backend::Loop, Access::Mount) => {
                let f = fs_type
                    .or_else(|| defaults.fs_type.clone())
                    .unwrap_or_else(|| "ext4".to_owned());
                if !LOOP_FS_TYPES.contains(&f.as_str()) {
                    return Err(format!(
                        "fs_type {f:?} is not supported (supported: {LOOP_FS_TYPES:?})"
                    ));
                }
                if !self.host.has_mkfs(&f) {
                    return Err(format!(
                        "fs_type {f:?} needs mkfs.{f}, which is not installed"
                    ));
                }
                fs_type = Some(f);
            }
        }
        Ok(Placement {
            pool,
            backend,
            access,
            fs_type,
        })
    }

    /// [`Plugin::placement`] for CreateVolume: unsupported capabilities and unknown pools
    /// are INVALID_ARGUMENT.
    pub(super) fn checked_placement(
        &self,
        capabilities: &[Capability],
        pool: Option<String>,
        backend: Option<Backend>,
        defaults: &Defaults,
    ) -> Result<Placement, VolumeError> {
        let placement = self
            .placement(capabilities, pool, backend, defaults)
            .map_err(|r| VolumeError::invalid("volume_capabilities", r))?;
        if !self.pools.contains_key(&placement.pool) {
            return Err(VolumeError::invalid(
                "parameters",
                format!(
                    "pool {:?} is not configured (pools: {:?})",
                    placement.pool,
                    self.pools.keys().collect::<Vec<_>>()
                ),
            ));
        }
        Ok(placement)
    }

    pub(super) fn min_size(backend: Backend, access: Access, fs_type: Option<&str>) -> (u64, u64) {
        match (backend, access) {
            (Backend::Dir, _) => (1, 1),
            (Backend::Loop, Access::Block) => (MIN_BLOCK_SIZE, LOOP_GRANULARITY),
            (Backend::Loop, Access::Mount) if fs_type == Some("xfs") => {
                (MIN_XFS_SIZE, LOOP_GRANULARITY)
            }
            (Backend::Loop, Access::Mount) => (MIN_EXT_SIZE, LOOP_GRANULARITY),
        }
    }

    pub(super) fn check_range(range: Option<CapacityRange>) -> Result<(u64, u64), VolumeError> {
        let r = range.unwrap_or_default();
        let req = u64::try_from(r.required_bytes)
            .map_err(|_| VolumeError::invalid("capacity_range", "required_bytes is negative"))?;
        let lim = u64::try_from(r.limit_bytes)
            .map_err(|_| VolumeError::invalid("capacity_range", "limit_bytes is negative"))?;
        if lim > 0 && req > lim {
            return Err(VolumeError::invalid(
                "capacity_range",
                format!("required_bytes {req} exceeds limit_bytes {lim}"),
            ));
        }
        Ok((req, lim))
    }

    /// The size to allocate for a range, given the backend's minimum and granularity.
    pub(super) fn choose_size(req: u64, lim: u64, min: u64, gran: u64) -> Result<u64, VolumeError> {
        let want = if req > 0 {
            req
        } else if lim > 0 {
            lim.min(DEFAULT_VOLUME_SIZE)
        } else {
            DEFAULT_VOLUME_SIZE
        }
        .max(min);
        let mut size = round_up(want, gran);
        if lim > 0 && size > lim {
            let down = lim / gran * gran;
            if down >= req.max(min) && down > 0 {
                size = down;
            } else {
                return Err(VolumeError::OutOfRange {
                    reason: format!(
                        "limit_bytes {lim} is below the smallest possible size {}",
                        round_up(req.max(min), gran)
                    ),
                });
            }
        }
        Ok(size)
    }

    pub(super) fn check_growth(
        &self,
        pool: Option<&str>,
        size: u64,
        growth: u64,
    ) -> Result<(), VolumeError> {
        if let Some(max) = self.max_volume_size
            && size > max
        {
            return Err(VolumeError::OutOfRange {
                reason: format!("{size} bytes exceeds the maximum volume size {max}"),
            });
        }
        if let Some(pool) = pool {
            let available = self.pool_available(pool).unwrap_or(0);
            if growth > available {
                return Err(VolumeError::OutOfRange {
                    reason: format!(
                        "{growth} more bytes needed but pool {pool:?} has {available} bytes available"
                    ),
                });
            }
        }
        Ok(())
    }

    // === Controller ===

    /// CreateVolume: idempotent by name (and content source). With a content source, the
    /// new volume holds a copy of the snapshot's or volume's data (see `plugin/snapshot.rs`).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for malformed or unsupported requests (a source the new volume
    /// cannot hold included), NOT_FOUND for a source that does not exist, ALREADY_EXISTS
    /// for a name reused with incompatible arguments, OUT_OF_RANGE when the size does not
    /// fit (or is below the source's).
    pub fn create_volume(&self, req: &CreateVolume) -> Result<VolumeInfo, VolumeError> {
        Self::check_name("name", &req.name)?;
        if req.capabilities.is_empty() {
            return Err(VolumeError::invalid("volume_capabilities", "is empty"));
        }
        let source = match &req.content_source {
            None => None,
            Some(types::ContentSource::Snapshot(id)) if id.is_empty() => {
                return Err(VolumeError::invalid(
                    "volume_content_source",
                    "snapshot_id is empty",
                ));
            }
            Some(types::ContentSource::Volume(id)) if id.is_empty() => {
                return Err(VolumeError::invalid(
                    "volume_content_source",
                    "volume_id is empty",
                ));
            }
            Some(types::ContentSource::Snapshot(id)) => Some(ContentSource::Snapshot(id.clone())),
            Some(types::ContentSource::Volume(id)) => Some(ContentSource::Volume(id.clone())),
        };
        let (req_bytes, lim_bytes) = Self::check_range(req.capacity_range)?;
        let (pool, backend) = Self::parse_parameters(&req.parameters)?;
        // Without a source everything is known now: refuse before taking the lock.
        let fresh_placement = match source {
            None => Some(self.checked_placement(
                &req.capabilities,
                pool.clone(),
                backend,
                &Defaults::default(),
            )?),
            Some(_) => None,
        };
        let parameters: BTreeMap<String, String> = req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();

        let _c = lock(&self.controller);
        let existing = lock(&self.volumes)
            .values()
            .find(|r| r.origin == Origin::Created && r.name == req.name)
            .cloned();
        if let Some(rec) = existing {
            let taken = |what: &str| VolumeError::AlreadyExists {
                what: format!(
                    "volume name {:?} is taken by {} with {what}",
                    req.name, rec.id
                ),
            };
            if rec.content_source != source {
                return Err(taken("a different content source"));
            }
            // A source may be gone since; what the request left open was taken from it,
            // and the record holds what that was.
            let placement = match fresh_placement {
                Some(p) => p,
                None => self.checked_placement(
                    &req.capabilities,
                    pool,
                    backend,
                    &Defaults::of_volume(&rec),
                )?,
            };
            let same = rec.pool.as_deref() == Some(placement.pool.as_str())
                && rec.backend == placement.backend
                && rec.access == placement.access
                && rec.fs_type == placement.fs_type
                && rec.parameters == parameters
                && rec.capacity_bytes >= req_bytes
                && (lim_bytes == 0 || rec.capacity_bytes <= lim_bytes);
            if same {
                return Ok(self.info(&rec));
            }
            return Err(taken("different capacity, capabilities or parameters"));
        }

        let Some(placement) = fresh_placement else {
            let source = source.expect("no placement yet only with a source");
            return self.create_from_source(req, &source, pool, backend, parameters);
        };
        let (min, gran) = Self::min_size(
            placement.backend,
            placement.access,
            placement.fs_type.as_deref(),
        );
        let size = Self::choose_size(req_bytes, lim_bytes, min, gran)?;
        self.check_growth(Some(&placement.pool), size, size)?;

        let rec = VolumeRecord::new(
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
        self.create_durably(rec, |rec| self.allocate(rec))
    }

    /// Creates the storage of `rec` with `make`, crash-safely: phase `creating` is durable
    /// before any storage exists, so a crash from there on is rolled back at start and
    /// never leaves a ghost volume; a failure is rolled back at once.
    pub(super) fn create_durably(
        &self,
        rec: VolumeRecord,
        make: impl FnOnce(&VolumeRecord) -> Result<(), VolumeError>,
    ) -> Result<VolumeInfo, VolumeError> {
        self.save(rec.clone())?;
        if let Err(e) = make(&rec) {
            let _ = self.remove_backing(&rec);
            if let Err(fe) = self.forget(&rec.id) {
                tracing::error!(volume_id = %rec.id, error = %DisplayChain(&fe), "could not drop the record of a failed creation; it is rolled back at next start");
            }
            return Err(e);
        }
        let mut ready = rec;
        ready.phase = Phase::Ready;
        self.save(ready.clone())?;
        tracing::info!(volume_id = %ready.id, name = %ready.name, size = ready.capacity_bytes,
            backend = ready.backend.as_str(), source = ?ready.content_source, "created volume");
        Ok(self.info(&ready))
    }

    fn allocate(&self, rec: &VolumeRecord) -> Result<(), VolumeError> {
        let path = self.layout.backing(rec);
        let parent = path.parent().unwrap_or(&self.layout.root).to_owned();
        let host = |e| VolumeError::host("allocating storage", &rec.id, e);
        match rec.backend {
            Backend::Dir => {
                fs::create_dir(&path).map_err(|e| host(io_host("creating", &path)(e)))?;
            }
            Backend::Loop => {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| host(io_host("creating", &path)(e)))?;
                // Sparse: no blocks are allocated until written.
                f.set_len(rec.capacity_bytes)
                    .map_err(|e| host(io_host("sizing", &path)(e)))?;
                f.sync_all()
                    .map_err(|e| host(io_host("fsyncing", &path)(e)))?;
            }
        }
        store::sync_dir(&parent).map_err(|e| VolumeError::store(&rec.id, e))
    }

    /// Detaches every loop device of `file`.
    ///
    /// A detach while another process has the device open (any `losetup -j`, e.g. of
    /// another volume, opens every device to compare backing files) only marks it
    /// AUTOCLEAR; the kernel drops it at that process's close. If that close falls between
    /// the listing and our `losetup -d`, the device is already gone and the kernel answers
    /// ENXIO. Gone is what was asked for, so a failed detach counts as done when the device
    /// no longer serves the file.
    pub(super) fn detach_all(&self, file: &Path) -> Result<(), HostError> {
        for dev in self.host.loop_devices_of(file)? {
            if let Err(e) = self.host.loop_detach(&dev) {
                if self.host.loop_devices_of(file)?.contains(&dev) {
                    return Err(e);
                }
                tracing::debug!(device = %dev.display(), file = %file.display(),
                    "loop device went away before its detach");
            }
        }
        Ok(())
    }

    pub(super) fn remove_backing(&self, rec: &VolumeRecord) -> Result<(), VolumeError> {
        let path = self.layout.backing(rec);
        let host = |e| VolumeError::host("removing storage", &rec.id, e);
        let res = match rec.backend {
            Backend::Dir => fs::remove_dir_all(&path),
            Backend::Loop => {
                if path.exists() {
                    self.detach_all(&path).map_err(host)?;
                }
                fs::remove_file(&path)
            }
        };
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(host(io_host("removing", &path)(e))),
        }
        if let Some(parent) = path.parent() {
            store::sync_dir(parent).map_err(|e| VolumeError::store(&rec.id, e))?;
        }
        Ok(())
    }

    /// DeleteVolume: unknown ids succeed.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for an empty id, FAILED_PRECONDITION while staged or published.
    pub fn delete_volume(&self, volume_id: &str) -> Result<(), VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let _c = lock(&self.controller);
        let _v = self.busy.lock(volume_id);
        let mut rec = match self.lookup(volume_id) {
            Ok(r) => r,
            Err(VolumeError::VolumeNotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        if let Some(s) = &rec.staged {
            return Err(VolumeError::precondition(format!(
                "volume {volume_id} is staged at {}",
                s.path.display()
            )));
        }
        if let Some(p) = rec.published.first() {
            return Err(VolumeError::precondition(format!(
                "volume {volume_id} is published at {}",
                p.target.display()
            )));
        }
        rec.phase = Phase::Deleting;
        self.save(rec.clone())?;
        self.remove_backing(&rec)?;
        self.forget(volume_id)?;
        tracing::info!(volume_id, "deleted volume");
        Ok(())
    }

    /// ControllerGetVolume: the volume with its condition (`status.volume_condition`).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for an empty id, NOT_FOUND for a volume the plugin does not have.
    pub fn get_volume(&self, volume_id: &str) -> Result<VolumeInfo, VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        let rec = self.lookup(volume_id)?;
        let mut info = self.info(&rec);
        info.condition = Some(self.backing_condition(&rec));
        Ok(info)
    }

    /// The controller's view of a volume's health: whether its backing storage is there
    /// and usable (a dir volume's directory, a loop volume's image file), with a message
    /// naming what is wrong. What is mounted is the node's business (NodeGetVolumeStats).
    pub(super) fn backing_condition(&self, rec: &VolumeRecord) -> Condition {
        let backing = self.layout.backing(rec);
        let (what, want_dir) = match rec.backend {
            Backend::Dir => ("directory", true),
            Backend::Loop => ("image", false),
        };
        let problem = match fs::metadata(&backing) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some("is missing".to_owned()),
            Err(e) => Some(format!("is unreadable: {e}")),
            Ok(md) if want_dir && !md.is_dir() => Some("is not a directory".to_owned()),
            Ok(md) if !want_dir && !md.is_file() => Some("is not a regular file".to_owned()),
            Ok(_) if want_dir => fs::read_dir(&backing)
                .err()
                .map(|e| format!("is unreadable: {e}")),
            Ok(_) => fs::File::open(&backing)
                .err()
                .map(|e| format!("is unreadable: {e}")),
        };
        match problem {
            Some(problem) => Condition {
                abnormal: true,
                message: format!(
                    "{what} {} of volume {} {problem}",
                    backing.display(),
                    rec.id
                ),
            },
            None => Condition {
                abnormal: false,
                message: "ok".to_owned(),
            },
        }
    }

    pub(super) fn compatible(rec: &VolumeRecord, cap: &Capability) -> Result<(), String> {
        if !cap.mode.is_supported() {
            return Err(format!("access mode {:?} is not supported", cap.mode));
        }
        match (&cap.access, rec.access) {
            (AccessType::Block, Access::Block) => Ok(()),
            (AccessType::Mount { fs_type, .. }, Access::Mount) => {
                if fs_type.is_empty() {
                    return Ok(());
                }
                match (rec.backend, &rec.fs_type) {
                    (Backend::Dir, _) => Err(format!(
                        "volume {} is a directory and has no fs_type {fs_type:?}",
                        rec.id
                    )),
                    (Backend::Loop, Some(f)) if f != fs_type => Err(format!(
                        "volume {} has fs_type {f:?}, not {fs_type:?}",
                        rec.id
                    )),
                    (Backend::Loop, _) => Ok(()),
                }
            }
            (AccessType::Block, Access::Mount) => {
                Err(format!("volume {} is a MOUNT volume", rec.id))
            }
            (AccessType::Mount { .. }, Access::Block) => {
                Err(format!("volume {} is a BLOCK volume", rec.id))
            }
        }
    }

    /// ValidateVolumeCapabilities: `Confirmed` only if every capability fits the volume and
    /// the `volume_context` and `parameters` given (if any) are the volume's own.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for missing fields, NOT_FOUND for an unknown volume.
    pub fn validate_volume_capabilities(
        &self,
        volume_id: &str,
        capabilities: &[Capability],
        volume_context: &HashMap<String, String>,
        parameters: &HashMap<String, String>,
    ) -> Result<Validation, VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        if capabilities.is_empty() {
            return Err(VolumeError::invalid("volume_capabilities", "is empty"));
        }
        let rec = self.lookup(volume_id)?;
        for cap in capabilities {
            if let Err(why) = Self::compatible(&rec, cap) {
                return Ok(Validation::Unconfirmed(why));
            }
        }
        if !volume_context.is_empty() && *volume_context != self.info(&rec).volume_context {
            return Ok(Validation::Unconfirmed(format!(
                "volume_context differs from the context of volume {volume_id}"
            )));
        }
        let theirs: BTreeMap<_, _> = parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !parameters.is_empty() && theirs != rec.parameters {
            return Ok(Validation::Unconfirmed(
                "parameters differ from those the volume was created with".to_owned(),
            ));
        }
        Ok(Validation::Confirmed)
    }

    /// ListVolumes with pagination. Tokens name the first id of the next page, so deleting
    /// volumes between pages never makes a token invalid.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for negative `max_entries`, ABORTED for a foreign token.
    pub fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<VolumePage, VolumeError> {
        let max = usize::try_from(max_entries)
            .map_err(|_| VolumeError::invalid("max_entries", "is negative"))?;
        let start = if starting_token.is_empty() {
            None
        } else {
            match starting_token.strip_prefix(TOKEN_PREFIX) {
                Some(id) if ids::is_valid_volume_id(id) => Some(id.to_owned()),
                _ => {
                    return Err(VolumeError::InvalidToken {
                        token: starting_token.to_owned(),
                    });
                }
            }
        };
        self.adopt_imports();
        let vols = lock(&self.volumes);
        let mut ready = vols
            .range(start.unwrap_or_default()..)
            .map(|(_, r)| r)
            .filter(|r| r.phase == Phase::Ready);
        let mut entries = Vec::new();
        let mut next_token = String::new();
        for rec in ready.by_ref() {
            if max > 0 && entries.len() == max {
                next_token = format!("{TOKEN_PREFIX}{}", rec.id);
                break;
            }
            let mut info = self.info(rec);
            info.condition = Some(self.backing_condition(rec));
            entries.push(info);
        }
        Ok(VolumePage {
            entries,
            next_token,
        })
    }

    /// GetCapacity for the pool and backend the parameters and capabilities select.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for malformed parameters.
    pub fn get_capacity(
        &self,
        capabilities: &[Capability],
        parameters: &HashMap<String, String>,
    ) -> Result<CapacityInfo, VolumeError> {
        let (pool, backend) = Self::parse_parameters(parameters)?;
        let zero = CapacityInfo {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: None,
        };
        let Ok(placement) = self.placement(capabilities, pool, backend, &Defaults::default())
        else {
            return Ok(zero);
        };
        let Some(available) = self.pool_available(&placement.pool) else {
            return Ok(zero);
        };
        let (min, gran) = Self::min_size(
            placement.backend,
            placement.access,
            placement.fs_type.as_deref(),
        );
        let mut max = available / gran * gran;
        if let Some(m) = self.max_volume_size {
            max = max.min(m);
        }
        if max < min {
            max = 0;
        }
        Ok(CapacityInfo {
            available_capacity: to_i64(available),
            maximum_volume_size: Some(to_i64(max)),
            minimum_volume_size: (min > 1).then(|| to_i64(min)),
        })
    }

    /// ControllerExpandVolume: grows the accounting and, for loop volumes, the image file.
    /// Returns the new size and whether NodeExpandVolume must follow.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for missing fields or an incompatible capability, NOT_FOUND,
    /// OUT_OF_RANGE for shrinking or exceeding the pool.
    pub fn controller_expand_volume(
        &self,
        volume_id: &str,
        range: Option<CapacityRange>,
        capability: Option<&Capability>,
    ) -> Result<(u64, bool), VolumeError> {
        if volume_id.is_empty() {
            return Err(VolumeError::invalid("volume_id", "is empty"));
        }
        if range.is_none() {
            return Err(VolumeError::invalid("capacity_range", "is missing"));
        }
        let (req, lim) = Self::check_range(range)?;
        let _c = lock(&self.controller);
        let _v = self.busy.lock(volume_id);
        let mut rec = self.lookup(volume_id)?;
        if let Some(cap) = capability {
            Self::compatible(&rec, cap)
                .map_err(|r| VolumeError::invalid("volume_capability", r))?;
        }
        let current = rec.capacity_bytes;
        if lim > 0 && current > lim {
            return Err(VolumeError::OutOfRange {
                reason: format!("volume has {current} bytes; shrinking to {lim} is not supported"),
            });
        }
        let (min, gran) = Self::min_size(rec.backend, rec.access, rec.fs_type.as_deref());
        let wanted = if req == 0 && lim == 0 {
            current
        } else {
            Self::choose_size(req, lim, min, gran)?
        };
        let new = wanted.max(current);
        if new > current {
            self.check_growth(rec.pool.as_deref(), new, new - current)?;
        }
        if rec.backend == Backend::Loop {
            let path = self.layout.backing(&rec);
            let host = |e| VolumeError::host("growing image", volume_id, e);
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| host(io_host("opening", &path)(e)))?;
            let len = f
                .metadata()
                .map_err(|e| host(io_host("reading", &path)(e)))?
                .len();
            // The file grows before the record: a crash in between leaves a record smaller
            // than the file, which a retry repairs; the reverse would skip the growth.
            if len < new {
                f.set_len(new)
                    .map_err(|e| host(io_host("sizing", &path)(e)))?;
                f.sync_all()
                    .map_err(|e| host(io_host("fsyncing", &path)(e)))?;
            }
        }
        if new != current {
            rec.capacity_bytes = new;
            self.save(rec.clone())?;
            tracing::info!(volume_id, from = current, to = new, "expanded volume");
        }
        Ok((new, rec.backend == Backend::Loop))
    }
}
