//! The plugin core: volumes, capacity, staging and publishing, independent of CSI version.
//!
//! All methods block (file system calls, mounts, mkfs) and are called from
//! `spawn_blocking` by the adapters.
//!
//! Locking, always taken in this order so no two requests deadlock:
//! 1. `controller`: serializes CreateVolume, DeleteVolume and ControllerExpandVolume, which
//!    check and change pool accounting;
//! 2. a per-volume lock from `busy`: one operation per volume at a time;
//! 3. `node_claims`: serializes the node-wide checks of NodeStage/NodePublish (staged-volume
//!    limit, staging and target paths owned by other volumes) with the recording of the
//!    intent that claims them; without it, volumes staged concurrently under their own
//!    locks would all pass the checks;
//! 4. `volumes`: the in-memory copy of the records, held only for short lookups/updates.
//!
//! Durability: a record is written to disk before the in-memory map changes, and the intent
//! (phase `creating`/`deleting`, a staging path, a publication) is written before the host is
//! touched. See `docs/csi-local.md` for the recovery rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::config::{Config, DEFAULT_POOL};
use slrp_types::DisplayChain;

use crate::error::VolumeError;
use crate::host::{Host, HostError};
use crate::ids::{self, IMPORT_DIR_PREFIX, IMPORT_LOOP_PREFIX};
use crate::store::{
    self, Access, Backend, MetaStore, Origin, Phase, Published, RootLock, Staged, StoreError,
    VolumeRecord,
};
use crate::types::{
    AccessMode, AccessType, Capability, CapacityInfo, CapacityRange, Condition, CreateVolume,
    PublishVolume, StageVolume, Usage, UsageUnit, Validation, VolumeInfo, VolumePage, VolumeStats,
};

/// Size of a volume created without a capacity range.
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;
/// Smallest loop volume formatted with ext2/3/4.
const MIN_EXT_SIZE: u64 = 8 << 20;
/// Smallest file system mkfs.xfs accepts (xfsprogs ≥ 5.19).
const MIN_XFS_SIZE: u64 = 300 << 20;
/// Smallest raw loop volume.
const MIN_BLOCK_SIZE: u64 = 1 << 20;
/// Loop image sizes are whole file system blocks.
const LOOP_GRANULARITY: u64 = 4096;
/// Longest volume name accepted (names are not used in paths; this bounds record size).
const MAX_NAME_LEN: usize = 1024;
/// ListVolumes tokens carry this prefix so foreign strings are recognised as invalid.
const TOKEN_PREFIX: &str = "slrp1:";
/// Parameter keys the Kubernetes external-provisioner adds; accepted and ignored.
const K8S_PARAM_PREFIX: &str = "csi.storage.k8s.io/";
/// File system types a loop MOUNT volume may request.
const LOOP_FS_TYPES: [&str; 4] = ["ext4", "ext3", "ext2", "xfs"];

/// Errors from opening the plugin's root.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The metadata store could not be opened or recovered.
    #[error("opening plugin root {root}")]
    Store {
        /// The root directory.
        root: PathBuf,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// Rolling back or finishing an interrupted operation failed.
    #[error("recovering volume {volume_id}")]
    Recover {
        /// The volume.
        volume_id: String,
        /// The cause.
        #[source]
        source: VolumeError,
    },
}

/// Directory layout under the root; every path is derived from a validated id or name.
#[derive(Debug, Clone)]
struct Layout {
    root: PathBuf,
    created_dir: PathBuf,
    created_loop: PathBuf,
    import_dir: PathBuf,
    import_loop: PathBuf,
}

impl Layout {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            created_dir: root.join("volumes/dir"),
            created_loop: root.join("volumes/loop"),
            import_dir: root.join("import/dir"),
            import_loop: root.join("import/loop"),
        }
    }

    fn backing(&self, rec: &VolumeRecord) -> PathBuf {
        match (rec.origin, rec.backend) {
            (Origin::Created, Backend::Dir) => self.created_dir.join(&rec.id),
            (Origin::Created, Backend::Loop) => self.created_loop.join(format!("{}.img", rec.id)),
            (Origin::Imported, Backend::Dir) => self
                .import_dir
                .join(rec.id.strip_prefix(IMPORT_DIR_PREFIX).unwrap_or(&rec.id)),
            (Origin::Imported, Backend::Loop) => self.import_loop.join(format!(
                "{}.img",
                rec.id.strip_prefix(IMPORT_LOOP_PREFIX).unwrap_or(&rec.id)
            )),
        }
    }
}

/// Per-key mutual exclusion without leaking an entry per key ever seen.
#[derive(Debug, Default)]
struct KeyLocks {
    busy: Mutex<BTreeSet<String>>,
    freed: Condvar,
}

#[derive(Debug)]
struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: String,
}

impl KeyLocks {
    fn lock(&self, key: &str) -> KeyGuard<'_> {
        let mut busy = lock(&self.busy);
        while busy.contains(key) {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        busy.insert(key.to_owned());
        KeyGuard {
            locks: self,
            key: key.to_owned(),
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        lock(&self.locks.busy).remove(&self.key);
        self.locks.freed.notify_all();
    }
}

/// A poisoned lock only means another request panicked; the data is records we re-validate.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The plugin core. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Plugin<H: Host> {
    host: H,
    layout: Layout,
    node_id: String,
    pools: BTreeMap<String, u64>,
    max_volume_size: Option<u64>,
    max_volumes_per_node: u64,
    store: MetaStore,
    /// Held for the plugin's life: one process per root.
    _root_lock: RootLock,
    volumes: Mutex<BTreeMap<String, VolumeRecord>>,
    controller: Mutex<()>,
    busy: KeyLocks,
    /// Held from the node-wide checks of a stage or publish until its intent is recorded.
    node_claims: Mutex<()>,
    /// Import names already warned about, so a bad name is logged once, not per scan.
    warned_imports: Mutex<BTreeSet<String>>,
}

fn io_host<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> HostError + 'a {
    move |source| HostError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The control characters CSI bans from volume names (all but tab, LF and CR).
fn is_banned_name_char(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{b}' | '\u{c}' | '\u{e}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

fn round_up(v: u64, g: u64) -> u64 {
    v.div_ceil(g).saturating_mul(g)
}

/// Bytes allocated under `dir`, not crossing into other file systems (mounts inside).
fn disk_usage(dir: &Path) -> u64 {
    let Ok(root) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let dev = root.dev();
    let mut total = 0u64;
    let mut stack = vec![dir.to_owned()];
    // Bounded walk: stats are advisory and must not stall on a huge tree.
    let mut budget = 1_000_000u32;
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return total;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.dev() != dev {
                continue;
            }
            total = total.saturating_add(md.blocks().saturating_mul(512));
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// What CreateVolume parameters and capabilities ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    pool: String,
    backend: Backend,
    access: Access,
    fs_type: Option<String>,
}

impl<H: Host> Plugin<H> {
    /// Opens the root: takes the root lock, recovers interrupted creations and deletions,
    /// removes backing storage no record owns, and adopts imported volumes.
    ///
    /// # Errors
    /// The root is locked by another process, or the metadata cannot be read or repaired.
    pub fn open(config: &Config, host: H) -> Result<Self, OpenError> {
        let layout = Layout::new(&config.root);
        let store_err = |source| OpenError::Store {
            root: config.root.clone(),
            source,
        };
        for d in [
            &layout.root,
            &layout.created_dir,
            &layout.created_loop,
            &layout.import_dir,
            &layout.import_loop,
        ] {
            fs::create_dir_all(d).map_err(|source| {
                store_err(StoreError::Io {
                    op: "creating",
                    path: d.clone(),
                    source,
                })
            })?;
        }
        let root_lock = RootLock::acquire(&layout.root).map_err(store_err)?;
        let meta_dir = layout.root.join("meta");
        let (store, records, bad) = MetaStore::open(meta_dir.clone()).map_err(store_err)?;
        for e in &bad {
            tracing::error!(error = %DisplayChain(e), "ignoring unreadable volume record; its backing is kept");
        }
        let plugin = Self {
            host,
            layout,
            node_id: config.node_id.clone(),
            pools: config.pools.clone(),
            max_volume_size: config.max_volume_size,
            max_volumes_per_node: config.max_volumes_per_node,
            store,
            _root_lock: root_lock,
            volumes: Mutex::new(BTreeMap::new()),
            controller: Mutex::new(()),
            busy: KeyLocks::default(),
            node_claims: Mutex::new(()),
            warned_imports: Mutex::new(BTreeSet::new()),
        };
        plugin.recover(records, &meta_dir)?;
        plugin.adopt_imports();
        Ok(plugin)
    }

    fn recover(&self, records: Vec<VolumeRecord>, meta_dir: &Path) -> Result<(), OpenError> {
        for rec in records {
            match rec.phase {
                Phase::Ready => {
                    lock(&self.volumes).insert(rec.id.clone(), rec);
                }
                Phase::Creating | Phase::Deleting => {
                    tracing::info!(volume_id = %rec.id, phase = ?rec.phase,
                        "removing a volume whose creation or deletion was interrupted");
                    let res = self.remove_backing(&rec).and_then(|()| {
                        self.store
                            .remove(&rec.id)
                            .map_err(|e| VolumeError::store(&rec.id, e))
                    });
                    res.map_err(|source| OpenError::Recover {
                        volume_id: rec.id.clone(),
                        source,
                    })?;
                }
            }
        }
        // Backing storage with no record file at all is debris of a crash between removing
        // a record and... nothing: records are written first and removed last, so this
        // only finds storage left by hand or by an older, buggy version.
        let has_record = |id: &str| meta_dir.join(format!("{id}.json")).exists();
        for (dir, suffix) in [
            (&self.layout.created_dir, ""),
            (&self.layout.created_loop, ".img"),
        ] {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(suffix) else {
                    continue;
                };
                if ids::is_valid_volume_id(id) && !has_record(id) {
                    tracing::warn!(path = %e.path().display(), "removing volume storage without a record");
                    let path = e.path();
                    let res = if suffix.is_empty() {
                        fs::remove_dir_all(&path)
                    } else {
                        self.detach_all(&path)
                            .map_err(|e| io::Error::other(DisplayChain(&e).to_string()))
                            .and_then(|()| fs::remove_file(&path))
                    };
                    if let Err(err) = res {
                        tracing::warn!(path = %path.display(), error = %err, "could not remove orphaned storage");
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds records for operator-placed volumes under `<root>/import/` not yet known.
    fn adopt_imports(&self) {
        let found = self.scan_imports();
        self.adopt_found(found);
    }

    /// The valid imports under `<root>/import/`: id, backend and path.
    fn scan_imports(&self) -> Vec<(String, Backend, PathBuf)> {
        let mut found = Vec::new();
        for (dir, backend) in [
            (&self.layout.import_dir, Backend::Dir),
            (&self.layout.import_loop, Backend::Loop),
        ] {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let file_name = e.file_name().to_string_lossy().into_owned();
                let Ok(ft) = e.file_type() else { continue };
                let name = match backend {
                    Backend::Dir if ft.is_dir() => file_name.as_str(),
                    Backend::Loop if ft.is_file() => match file_name.strip_suffix(".img") {
                        Some(n) => n,
                        None => continue,
                    },
                    Backend::Dir | Backend::Loop => continue,
                };
                if !ids::is_valid_import_name(name) {
                    if lock(&self.warned_imports).insert(file_name.clone()) {
                        tracing::warn!(path = %e.path().display(),
                            "skipping import: name must be [A-Za-z0-9._-], at most {} bytes, not starting with '.'",
                            ids::MAX_IMPORT_NAME_LEN);
                    }
                    continue;
                }
                let prefix = match backend {
                    Backend::Dir => IMPORT_DIR_PREFIX,
                    Backend::Loop => IMPORT_LOOP_PREFIX,
                };
                found.push((format!("{prefix}{name}"), backend, e.path()));
            }
        }
        found
    }

    fn adopt_found(&self, found: Vec<(String, Backend, PathBuf)>) {
        for (id, backend, path) in found {
            if lock(&self.volumes).contains_key(&id) {
                continue;
            }
            let capacity = match backend {
                Backend::Dir => disk_usage(&path),
                Backend::Loop => fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            };
            let mut rec = VolumeRecord::new(
                id.clone(),
                id.clone(),
                Origin::Imported,
                backend,
                Access::Mount,
                None,
                None,
                capacity,
                BTreeMap::new(),
            );
            rec.phase = Phase::Ready;
            // Check and insert under one lock, without taking the volume's busy lock: the
            // caller may hold it already (a request naming an import not yet seen).
            let mut vols = lock(&self.volumes);
            // Still there? DeleteVolume removes the data before dropping the record (under
            // this lock), so an import deleted since the scan is either still recorded or
            // gone from disk; without this check it would come back as a ghost.
            if vols.contains_key(&id) || fs::symlink_metadata(&path).is_err() {
                continue;
            }
            let res = self.store.put(&rec);
            if res.is_ok() {
                vols.insert(id.clone(), rec);
            }
            drop(vols);
            match res {
                Ok(()) => tracing::info!(volume_id = %id, "adopted imported volume"),
                Err(e) => {
                    tracing::error!(volume_id = %id, error = %DisplayChain(&e), "could not adopt imported volume")
                }
            }
        }
    }

    fn save(&self, rec: VolumeRecord) -> Result<(), VolumeError> {
        self.store
            .put(&rec)
            .map_err(|e| VolumeError::store(&rec.id, e))?;
        lock(&self.volumes).insert(rec.id.clone(), rec);
        Ok(())
    }

    fn forget(&self, id: &str) -> Result<(), VolumeError> {
        self.store
            .remove(id)
            .map_err(|e| VolumeError::store(id, e))?;
        lock(&self.volumes).remove(id);
        Ok(())
    }

    /// The ready record of `id`, adopting an import on first sight.
    fn lookup(&self, id: &str) -> Result<VolumeRecord, VolumeError> {
        let not_found = || VolumeError::VolumeNotFound {
            volume_id: id.to_owned(),
        };
        if !ids::is_valid_volume_id(id) {
            return Err(not_found());
        }
        let found = lock(&self.volumes).get(id).cloned();
        match found {
            Some(r) if r.phase == Phase::Ready => Ok(r),
            Some(_) => Err(not_found()),
            None if id.starts_with("import-") => {
                self.adopt_imports();
                lock(&self.volumes)
                    .get(id)
                    .filter(|r| r.phase == Phase::Ready)
                    .cloned()
                    .ok_or_else(not_found)
            }
            None => Err(not_found()),
        }
    }

    fn info(&self, rec: &VolumeRecord) -> VolumeInfo {
        let mut ctx = HashMap::new();
        ctx.insert("backend".to_owned(), rec.backend.as_str().to_owned());
        if let Some(p) = &rec.pool {
            ctx.insert("pool".to_owned(), p.clone());
        }
        // The context must never change for a volume (CSI: "SHALL NOT be mutable"). An
        // import's file system type is only learnt at its first stage, so only volumes
        // created here, whose type is fixed at creation, report it.
        if let (Origin::Created, Some(fs)) = (rec.origin, &rec.fs_type) {
            ctx.insert("fs_type".to_owned(), fs.clone());
        }
        VolumeInfo {
            volume_id: rec.id.clone(),
            capacity_bytes: to_i64(rec.capacity_bytes),
            volume_context: ctx,
        }
    }

    fn pool_used(&self, pool: &str) -> u64 {
        lock(&self.volumes)
            .values()
            .filter(|r| r.pool.as_deref() == Some(pool))
            .map(|r| r.capacity_bytes)
            .sum()
    }

    fn pool_available(&self, pool: &str) -> Option<u64> {
        let total = *self.pools.get(pool)?;
        Some(total.saturating_sub(self.pool_used(pool)))
    }

    // === Placement and sizes ===

    fn parse_parameters(
        params: &HashMap<String, String>,
    ) -> Result<(String, Option<Backend>), VolumeError> {
        let mut pool = DEFAULT_POOL.to_owned();
        let mut backend = None;
        for (k, v) in params {
            match k.as_str() {
                "pool" => {
                    if v.is_empty() {
                        return Err(VolumeError::invalid("parameters", "pool is empty"));
                    }
                    pool.clone_from(v);
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

    /// Resolves capabilities plus parameters into a placement; `Err` says why unsupported.
    fn placement(
        &self,
        capabilities: &[Capability],
        pool: String,
        backend: Option<Backend>,
    ) -> Result<Placement, String> {
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
        let backend = backend.unwrap_or(match access {
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
                let f = fs_type.unwrap_or_else(|| "ext4".to_owned());
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

    fn min_size(backend: Backend, access: Access, fs_type: Option<&str>) -> (u64, u64) {
        match (backend, access) {
            (Backend::Dir, _) => (1, 1),
            (Backend::Loop, Access::Block) => (MIN_BLOCK_SIZE, LOOP_GRANULARITY),
            (Backend::Loop, Access::Mount) if fs_type == Some("xfs") => {
                (MIN_XFS_SIZE, LOOP_GRANULARITY)
            }
            (Backend::Loop, Access::Mount) => (MIN_EXT_SIZE, LOOP_GRANULARITY),
        }
    }

    fn check_range(range: Option<CapacityRange>) -> Result<(u64, u64), VolumeError> {
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
    fn choose_size(req: u64, lim: u64, min: u64, gran: u64) -> Result<u64, VolumeError> {
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

    fn check_growth(&self, pool: Option<&str>, size: u64, growth: u64) -> Result<(), VolumeError> {
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

    /// CreateVolume: idempotent by name.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for malformed or unsupported requests, ALREADY_EXISTS for a name
    /// reused with incompatible arguments, OUT_OF_RANGE when the size does not fit.
    pub fn create_volume(&self, req: &CreateVolume) -> Result<VolumeInfo, VolumeError> {
        if req.name.is_empty() {
            return Err(VolumeError::invalid("name", "is empty"));
        }
        if req.name.len() > MAX_NAME_LEN {
            return Err(VolumeError::invalid(
                "name",
                format!("is longer than {MAX_NAME_LEN} bytes"),
            ));
        }
        if let Some(c) = req.name.chars().find(|&c| is_banned_name_char(c)) {
            return Err(VolumeError::invalid(
                "name",
                format!("contains the control character U+{:04X}", u32::from(c)),
            ));
        }
        if req.capabilities.is_empty() {
            return Err(VolumeError::invalid("volume_capabilities", "is empty"));
        }
        if req.has_content_source {
            return Err(VolumeError::invalid(
                "volume_content_source",
                "creating volumes from snapshots or volumes is not supported",
            ));
        }
        let (req_bytes, lim_bytes) = Self::check_range(req.capacity_range)?;
        let (pool, backend) = Self::parse_parameters(&req.parameters)?;
        let placement = self
            .placement(&req.capabilities, pool, backend)
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
            return Err(VolumeError::AlreadyExists {
                what: format!(
                    "volume name {:?} is taken by {} with different capacity, capabilities or parameters",
                    req.name, rec.id
                ),
            });
        }

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
        // Phase `creating` is durable before any storage exists: a crash from here on is
        // rolled back at start, never leaving a ghost volume.
        self.save(rec.clone())?;
        if let Err(e) = self.allocate(&rec) {
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
            backend = ready.backend.as_str(), "created volume");
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
    fn detach_all(&self, file: &Path) -> Result<(), HostError> {
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

    fn remove_backing(&self, rec: &VolumeRecord) -> Result<(), VolumeError> {
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

    fn compatible(rec: &VolumeRecord, cap: &Capability) -> Result<(), String> {
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
            entries.push(self.info(rec));
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
        let Ok(placement) = self.placement(capabilities, pool, backend) else {
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
                if !self.host.is_mount_point(&st.path).map_err(host)? {
                    self.host
                        .mount_fs(&dev, &st.path, Some(&fs), &st.mount_flags)
                        .map_err(host)?;
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
        let readonly = req.readonly || req.capability.mode == AccessMode::SingleNodeReaderOnly;
        let mount_flags = match &req.capability.access {
            AccessType::Mount { mount_flags, .. } => mount_flags.clone(),
            AccessType::Block => Vec::new(),
        };
        let wanted = Published {
            target: target.clone(),
            readonly,
            mount_flags,
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
                if let Some(p) = rec.published.first() {
                    return Err(VolumeError::precondition(format!(
                        "single-node volume {} is already published at {}",
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
        if !backing.exists() {
            return abnormal(format!("backing storage {} is missing", backing.display()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CsiVersion;
    use crate::host::fake::FakeHost;

    fn config(root: &Path, pool: u64) -> Config {
        Config {
            endpoint: root.join("csi.sock"),
            root: root.to_owned(),
            node_id: "node-1".into(),
            csi_version: CsiVersion::V1,
            pools: BTreeMap::from([("default".to_owned(), pool)]),
            max_volume_size: None,
            max_volumes_per_node: 0,
            faults_file: None,
            tool_timeout: crate::tool::DEFAULT_TOOL_TIMEOUT,
        }
    }

    fn mount_cap() -> Capability {
        Capability {
            access: AccessType::Mount {
                fs_type: String::new(),
                mount_flags: vec![],
            },
            mode: AccessMode::SingleNodeWriter,
        }
    }

    fn block_cap() -> Capability {
        Capability {
            access: AccessType::Block,
            mode: AccessMode::SingleNodeWriter,
        }
    }

    fn create(name: &str, size: i64, cap: Capability) -> CreateVolume {
        CreateVolume {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: size,
                limit_bytes: 0,
            }),
            capabilities: vec![cap],
            ..Default::default()
        }
    }

    fn open(root: &Path, pool: u64) -> Plugin<FakeHost> {
        Plugin::open(&config(root, pool), FakeHost::default()).unwrap()
    }

    #[test]
    fn create_is_idempotent_by_name_and_accounts_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 100 << 20);
        let a = p
            .create_volume(&create("a", 10 << 20, mount_cap()))
            .unwrap();
        assert_eq!(
            p.create_volume(&create("a", 10 << 20, mount_cap()))
                .unwrap(),
            a
        );
        let err = p
            .create_volume(&create("a", 20 << 20, mount_cap()))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        let cap = p.get_capacity(&[], &HashMap::new()).unwrap();
        assert_eq!(cap.available_capacity, 90 << 20);
        let err = p
            .create_volume(&create("b", 91 << 20, mount_cap()))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        // The failed request changed nothing.
        assert_eq!(p.list_volumes(0, "").unwrap().entries.len(), 1);
        p.delete_volume(&a.volume_id).unwrap();
        p.delete_volume(&a.volume_id).unwrap();
        assert_eq!(
            p.get_capacity(&[], &HashMap::new())
                .unwrap()
                .available_capacity,
            100 << 20
        );
    }

    #[test]
    fn create_validates_its_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        let code = |r: CreateVolume| p.create_volume(&r).unwrap_err().code();
        assert_eq!(
            code(create("", 1, mount_cap())),
            tonic::Code::InvalidArgument
        );
        let mut r = create("x", 1, mount_cap());
        r.capabilities.clear();
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 1, mount_cap());
        r.capabilities[0].mode = AccessMode::MultiNodeMultiWriter;
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 1, block_cap());
        r.parameters.insert("backend".into(), "dir".into());
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 1, mount_cap());
        r.parameters.insert("colour".into(), "red".into());
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 1, mount_cap());
        r.parameters.insert("pool".into(), "nope".into());
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 10, mount_cap());
        r.capacity_range = Some(CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        });
        assert_eq!(code(r), tonic::Code::InvalidArgument);
        let mut r = create("x", 1, block_cap());
        r.capacity_range = Some(CapacityRange {
            required_bytes: 0,
            limit_bytes: 4096,
        });
        assert_eq!(code(r), tonic::Code::OutOfRange);
        let mut r = create("x", 1, mount_cap());
        r.capabilities.push(block_cap());
        assert_eq!(code(r), tonic::Code::InvalidArgument);
    }

    #[test]
    fn sizes_respect_minimum_granularity_and_limit() {
        type P = Plugin<FakeHost>;
        assert_eq!(P::choose_size(0, 0, 1, 1).unwrap(), DEFAULT_VOLUME_SIZE);
        assert_eq!(P::choose_size(0, 5000, 1, 1).unwrap(), 5000);
        assert_eq!(P::choose_size(1, 0, 8192, 4096).unwrap(), 8192);
        assert_eq!(P::choose_size(5000, 0, 1, 4096).unwrap(), 8192);
        assert_eq!(P::choose_size(0, 10_000, 1, 4096).unwrap(), 8192);
        assert!(P::choose_size(5000, 6000, 1, 4096).is_err());
    }

    #[test]
    fn interrupted_create_and_delete_are_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (creating, deleting) = {
            let p = open(dir.path(), 1 << 30);
            let a = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
            let b = p.create_volume(&create("b", 1 << 20, mount_cap())).unwrap();
            let c = p.create_volume(&create("c", 1 << 20, mount_cap())).unwrap();
            // Simulate crashes: a record stuck in `creating` and one stuck in `deleting`.
            let mut ra = lock(&p.volumes).get(&a.volume_id).cloned().unwrap();
            ra.phase = Phase::Creating;
            p.store.put(&ra).unwrap();
            let mut rb = lock(&p.volumes).get(&b.volume_id).cloned().unwrap();
            rb.phase = Phase::Deleting;
            p.store.put(&rb).unwrap();
            // And storage nobody owns.
            fs::create_dir(dir.path().join("volumes/dir/vol-orphan")).unwrap();
            let _ = c;
            (ra, rb)
        };
        let p = open(dir.path(), 1 << 30);
        let page = p.list_volumes(0, "").unwrap();
        assert_eq!(page.entries.len(), 1);
        assert!(!p.layout.backing(&creating).exists());
        assert!(!p.layout.backing(&deleting).exists());
        assert!(!dir.path().join("volumes/dir/vol-orphan").exists());
        assert_eq!(
            p.get_capacity(&[], &HashMap::new())
                .unwrap()
                .available_capacity,
            (1 << 30) - (1 << 20)
        );
    }

    #[test]
    fn second_process_cannot_open_the_same_root() {
        let dir = tempfile::tempdir().unwrap();
        let _p = open(dir.path(), 1 << 30);
        let err = Plugin::open(&config(dir.path(), 1 << 30), FakeHost::default()).unwrap_err();
        assert!(matches!(
            err,
            OpenError::Store {
                source: StoreError::Locked { .. },
                ..
            }
        ));
    }

    #[test]
    fn list_volumes_paginates_and_rejects_foreign_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        for i in 0..5 {
            p.create_volume(&create(&format!("v{i}"), 1 << 20, mount_cap()))
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = p.list_volumes(2, &token).unwrap();
            assert!(page.entries.len() <= 2);
            seen.extend(page.entries.into_iter().map(|e| e.volume_id));
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        assert_eq!(seen.len(), 5);
        let err = p.list_volumes(0, "garbage").unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert_eq!(
            p.list_volumes(-1, "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        // A token whose volume was deleted still works.
        let page = p.list_volumes(2, "").unwrap();
        let next = page
            .next_token
            .strip_prefix(TOKEN_PREFIX)
            .unwrap()
            .to_owned();
        p.delete_volume(&next).unwrap();
        assert_eq!(
            p.list_volumes(0, &page.next_token).unwrap().entries.len(),
            2
        );
    }

    #[test]
    fn stage_publish_idempotency_and_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        let v = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
        let w = p.create_volume(&create("b", 1 << 20, mount_cap())).unwrap();
        let staging = dir.path().join("staging").display().to_string();
        let target = dir.path().join("target").display().to_string();
        let stage = |id: &str, path: &str| {
            p.stage_volume(&StageVolume {
                volume_id: id.into(),
                staging_target_path: path.into(),
                capability: mount_cap(),
            })
        };
        stage(&v.volume_id, &staging).unwrap();
        stage(&v.volume_id, &staging).unwrap();
        assert_eq!(
            stage(&w.volume_id, &staging).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
        assert_eq!(
            stage("vol-nope", &staging).unwrap_err().code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            stage(&v.volume_id, "relative").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let publish = |target: &str, readonly: bool| {
            p.publish_volume(&PublishVolume {
                volume_id: v.volume_id.clone(),
                staging_target_path: staging.clone(),
                target_path: target.into(),
                capability: mount_cap(),
                readonly,
            })
        };
        publish(&target, false).unwrap();
        publish(&target, false).unwrap();
        assert_eq!(
            publish(&target, true).unwrap_err().code(),
            tonic::Code::AlreadyExists
        );
        let other = dir.path().join("t2").display().to_string();
        assert_eq!(
            publish(&other, false).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            p.delete_volume(&v.volume_id).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            p.unstage_volume(&v.volume_id, &staging).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        let stats = p.volume_stats(&v.volume_id, &target).unwrap();
        assert!(!stats.condition.abnormal, "{:?}", stats.condition);
        assert_eq!(
            p.volume_stats(&v.volume_id, &other).unwrap_err().code(),
            tonic::Code::NotFound
        );
        p.unpublish_volume(&v.volume_id, &target).unwrap();
        assert!(!Path::new(&target).exists());
        p.unpublish_volume(&v.volume_id, &target).unwrap();
        p.unstage_volume(&v.volume_id, &staging).unwrap();
        p.unstage_volume(&v.volume_id, &staging).unwrap();
        p.delete_volume(&v.volume_id).unwrap();
        assert!(lock(&p.host.state).mounts.is_empty());
    }

    /// An mkfs killed by the tool timeout leaves its intent recorded: the stage fails with
    /// DEADLINE_EXCEEDED and is undone, and every retry (in the same process, then after a
    /// restart) formats again with force instead of adopting the partial signature the
    /// killed mkfs left; once mkfs succeeded, later stages never format again.
    #[test]
    fn interrupted_mkfs_is_redone_not_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("staging").display().to_string();
        let mut r = create("l", 16 << 20, mount_cap());
        r.parameters.insert("backend".into(), "loop".into());
        let host_state;
        let st;
        {
            let p = open(dir.path(), 1 << 30);
            let id = p.create_volume(&r).unwrap().volume_id;
            st = StageVolume {
                volume_id: id,
                staging_target_path: staging.clone(),
                capability: mount_cap(),
            };
            lock(&p.host.state).mkfs_timeouts = 2;
            for _ in 0..2 {
                let err = p.stage_volume(&st).unwrap_err();
                assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err}");
            }
            let s = lock(&p.host.state);
            assert_eq!(s.mkfs_forced, [false, true]);
            assert!(s.mounts.is_empty() && s.loops.is_empty(), "{s:?}");
            assert_eq!(s.formatted.values().collect::<Vec<_>>(), ["partial-ext4"]);
            host_state = s.formatted.clone();
        }
        let p = open(dir.path(), 1 << 30);
        lock(&p.host.state).formatted = host_state;
        p.stage_volume(&st).unwrap();
        p.unstage_volume(&st.volume_id, &staging).unwrap();
        p.stage_volume(&st).unwrap();
        let s = lock(&p.host.state);
        assert_eq!(s.mkfs_forced, [true]);
        assert_eq!(s.formatted.values().collect::<Vec<_>>(), ["ext4"]);
    }

    /// `losetup -d` of a device that AUTOCLEAR dropped after the listing fails with ENXIO;
    /// the unstage (and a delete) must still succeed, since the device is gone. This failed
    /// NodeUnstageVolume re-driven by the manager's recovery in the SIGKILL soak.
    #[test]
    fn a_loop_device_gone_before_its_detach_counts_as_detached() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("staging").display().to_string();
        let p = open(dir.path(), 1 << 30);
        let mut r = create("l", 16 << 20, mount_cap());
        r.parameters.insert("backend".into(), "loop".into());
        let id = p.create_volume(&r).unwrap().volume_id;
        let st = StageVolume {
            volume_id: id.clone(),
            staging_target_path: staging.clone(),
            capability: mount_cap(),
        };
        p.stage_volume(&st).unwrap();
        lock(&p.host.state).vanished_detaches = 1;
        p.unstage_volume(&id, &staging).unwrap();
        assert!(lock(&p.host.state).loops.is_empty());
        assert!(lock(&p.volumes)[&id].staged.is_none());
        // The same for a delete, which detaches what is left on the image (here a device
        // still listed while its AUTOCLEAR is pending) before removing it.
        let image = p.layout.backing(&lock(&p.volumes)[&id]);
        {
            let mut s = lock(&p.host.state);
            s.loops.insert(PathBuf::from("/dev/fakeloop9"), image);
            s.vanished_detaches = 1;
        }
        p.delete_volume(&id).unwrap();
    }

    #[test]
    fn loop_volume_is_formatted_once_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let staging = dir.path().join("staging").display().to_string();
        let host_state;
        let id;
        {
            let p = open(dir.path(), 1 << 30);
            let mut r = create("l", 16 << 20, mount_cap());
            r.parameters.insert("backend".into(), "loop".into());
            id = p.create_volume(&r).unwrap().volume_id;
            let st = StageVolume {
                volume_id: id.clone(),
                staging_target_path: staging.clone(),
                capability: mount_cap(),
            };
            p.stage_volume(&st).unwrap();
            p.unstage_volume(&id, &staging).unwrap();
            p.stage_volume(&st).unwrap();
            let s = lock(&p.host.state);
            assert_eq!(s.mkfs_calls, 1);
            host_state = s.formatted.clone();
        }
        // A new process with a fresh host (reboot): the fs is still on the image.
        let p = open(dir.path(), 1 << 30);
        lock(&p.host.state).formatted = host_state;
        p.stage_volume(&StageVolume {
            volume_id: id.clone(),
            staging_target_path: staging.clone(),
            capability: mount_cap(),
        })
        .unwrap();
        assert_eq!(lock(&p.host.state).mkfs_calls, 0);
        let (size, node) = p
            .controller_expand_volume(
                &id,
                Some(CapacityRange {
                    required_bytes: 32 << 20,
                    limit_bytes: 0,
                }),
                None,
            )
            .unwrap();
        assert_eq!((size, node), (32 << 20, true));
        assert_eq!(
            p.node_expand_volume(&id, &staging, None, None).unwrap(),
            32 << 20
        );
        assert_eq!(
            p.controller_expand_volume(
                &id,
                Some(CapacityRange {
                    required_bytes: 2 << 30,
                    limit_bytes: 0
                }),
                None
            )
            .unwrap_err()
            .code(),
            tonic::Code::OutOfRange
        );
    }

    #[test]
    fn imports_are_listed_with_deterministic_ids() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        fs::create_dir_all(dir.path().join("import/dir/data1")).unwrap();
        fs::create_dir_all(dir.path().join("import/dir/bad name")).unwrap();
        let img = fs::File::create(dir.path().join("import/loop/disk.img")).unwrap();
        img.set_len(64 << 20).unwrap();
        let page = p.list_volumes(0, "").unwrap();
        let ids: Vec<_> = page.entries.iter().map(|e| e.volume_id.as_str()).collect();
        assert_eq!(ids, ["import-dir-data1", "import-loop-disk"]);
        assert_eq!(page.entries[1].capacity_bytes, 64 << 20);
        // Imports do not consume pool capacity.
        assert_eq!(
            p.get_capacity(&[], &HashMap::new())
                .unwrap()
                .available_capacity,
            1 << 30
        );
        p.delete_volume("import-dir-data1").unwrap();
        assert!(!dir.path().join("import/dir/data1").exists());
        // A request may name an import before any listing has seen it.
        fs::create_dir_all(dir.path().join("import/dir/late")).unwrap();
        p.delete_volume("import-dir-late").unwrap();
        assert!(!dir.path().join("import/dir/late").exists());
    }

    /// Concurrent stages of different volumes (each under its own volume lock) must not
    /// together exceed `max_volumes_per_node`, nor share one staging path.
    #[test]
    fn concurrent_stages_respect_the_node_limit_and_path_ownership() {
        const N: usize = 8;
        // Stages N volumes at once, each at `path(i)`, and counts the successes.
        fn race(limit: u64, path: impl Fn(usize) -> String + Sync) -> usize {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(dir.path(), 1 << 30);
            cfg.max_volumes_per_node = limit;
            let p = Plugin::open(&cfg, FakeHost::default()).unwrap();
            let ids: Vec<String> = (0..N)
                .map(|i| {
                    p.create_volume(&create(&format!("v{i}"), 1 << 20, mount_cap()))
                        .unwrap()
                        .volume_id
                })
                .collect();
            let barrier = std::sync::Barrier::new(N);
            std::thread::scope(|s| {
                let handles: Vec<_> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| {
                        let (p, barrier, path) = (&p, &barrier, &path);
                        s.spawn(move || {
                            barrier.wait();
                            p.stage_volume(&StageVolume {
                                volume_id: id.clone(),
                                staging_target_path: path(i),
                                capability: mount_cap(),
                            })
                            .is_ok()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .filter_map(|h| h.join().unwrap().then_some(()))
                    .count()
            })
        }
        let base = tempfile::tempdir().unwrap();
        let at = |name: String| base.path().join(name).display().to_string();
        for round in 0..4 {
            let staged = race(1, |i| at(format!("r{round}-{i}")));
            assert_eq!(staged, 1, "limit 1, round {round}: {staged} staged");
            let staged = race(0, |_| at(format!("shared-{round}")));
            assert_eq!(staged, 1, "one path, round {round}: {staged} staged");
        }
    }

    /// A scan that saw an import before a concurrent DeleteVolume removed it must not
    /// bring the deleted volume back as a ghost record.
    #[test]
    fn an_import_deleted_during_a_scan_is_not_adopted_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        fs::create_dir_all(dir.path().join("import/dir/data")).unwrap();
        p.lookup("import-dir-data").unwrap();
        let seen = p.scan_imports();
        p.delete_volume("import-dir-data").unwrap();
        p.adopt_found(seen);
        assert_eq!(
            p.lookup("import-dir-data").unwrap_err().code(),
            tonic::Code::NotFound
        );
        assert!(!dir.path().join("meta/import-dir-data.json").exists());
    }

    #[test]
    fn capacity_honours_capabilities_and_parameters() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        let mut params = HashMap::new();
        params.insert("backend".to_owned(), "dir".to_owned());
        assert_eq!(
            p.get_capacity(&[block_cap()], &params)
                .unwrap()
                .available_capacity,
            0
        );
        params.insert("pool".to_owned(), "elsewhere".to_owned());
        assert_eq!(p.get_capacity(&[], &params).unwrap().available_capacity, 0);
        let c = p.get_capacity(&[block_cap()], &HashMap::new()).unwrap();
        assert_eq!(c.available_capacity, 1 << 30);
        assert_eq!(c.minimum_volume_size, Some(to_i64(MIN_BLOCK_SIZE)));
        params.clear();
        params.insert("backend".to_owned(), "tape".to_owned());
        assert_eq!(
            p.get_capacity(&[], &params).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn validate_capabilities_confirms_only_what_the_volume_serves() {
        let dir = tempfile::tempdir().unwrap();
        let p = open(dir.path(), 1 << 30);
        let v = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
        let none = HashMap::new();
        assert_eq!(
            p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &none, &none)
                .unwrap(),
            Validation::Confirmed
        );
        assert_eq!(
            p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &v.volume_context, &none)
                .unwrap(),
            Validation::Confirmed
        );
        let mut stale = v.volume_context.clone();
        stale.insert("backend".into(), "loop".into());
        assert!(matches!(
            p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &stale, &none)
                .unwrap(),
            Validation::Unconfirmed(_)
        ));
        assert!(matches!(
            p.validate_volume_capabilities(&v.volume_id, &[block_cap()], &none, &none)
                .unwrap(),
            Validation::Unconfirmed(_)
        ));
        assert_eq!(
            p.validate_volume_capabilities("vol-x", &[mount_cap()], &none, &none)
                .unwrap_err()
                .code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            p.validate_volume_capabilities(&v.volume_id, &[], &none, &none)
                .unwrap_err()
                .code(),
            tonic::Code::InvalidArgument
        );
    }
}
