//! The plugin core: volumes, snapshots, capacity, staging and publishing, independent of
//! CSI version.
//!
//! All methods block (file system calls, mounts, mkfs) and are called from
//! `spawn_blocking` by the adapters.
//!
//! Locking, always taken in this order so no two requests deadlock:
//! 1. `controller`: serializes CreateVolume, DeleteVolume, ControllerExpandVolume,
//!    CreateSnapshot and DeleteSnapshot, which check and change pool accounting (snapshots
//!    take pool capacity) and make or remove the sources of copies;
//! 2. a per-volume lock from `busy`: one operation per volume at a time;
//! 3. `node_claims`: serializes the node-wide checks of NodeStage/NodePublish (staged-volume
//!    limit, staging and target paths owned by other volumes) with the recording of the
//!    intent that claims them; without it, volumes staged concurrently under their own
//!    locks would all pass the checks;
//! 4. `volumes`, then `snapshots`: the in-memory copies of the records, held only for short
//!    lookups/updates.
//!
//! A copy (CreateSnapshot, CreateVolume from a source) holds `controller` and the source
//! volume's lock for its whole run: the source can be neither staged, unstaged, expanded
//! nor deleted meanwhile, and the pool's accounting cannot change under it.
//!
//! Durability: a record is written to disk before the in-memory map changes, and the intent
//! (phase `creating`/`deleting`, a staging path, a publication) is written before the host is
//! touched. See `docs/csi-local.md` for the recovery rules.

mod controller;
mod node;
mod snapshot;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::config::{Config, DEFAULT_POOL};
use slrp_types::DisplayChain;

use crate::error::{Subject, VolumeError};
use crate::faults::Faults;
use crate::host::{Host, HostError};
use crate::ids::{self, IMPORT_DIR_PREFIX, IMPORT_LOOP_PREFIX};
use crate::store::{
    Access, Backend, ContentSource, MetaStore, Origin, Phase, RootLock, SnapshotRecord, StoreError,
    VolumeRecord,
};
use crate::types::{self, VolumeInfo};

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
    /// The size of the file system under the root, which sizes the default pool, could
    /// not be read.
    #[error("reading the size of the file system under {root} to size the default pool")]
    FileSystemSize {
        /// The root directory.
        root: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Rolling back or finishing an interrupted operation failed.
    #[error("recovering {subject} {id}")]
    Recover {
        /// What `id` names.
        subject: Subject,
        /// The volume or snapshot.
        id: String,
        /// The cause (boxed: it is large, and this error is rare).
        #[source]
        source: Box<VolumeError>,
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
    snapshot_meta: PathBuf,
    snapshot_dir: PathBuf,
    snapshot_loop: PathBuf,
}

impl Layout {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            created_dir: root.join("volumes/dir"),
            created_loop: root.join("volumes/loop"),
            import_dir: root.join("import/dir"),
            import_loop: root.join("import/loop"),
            snapshot_meta: root.join("snapshots/meta"),
            snapshot_dir: root.join("snapshots/dir"),
            snapshot_loop: root.join("snapshots/loop"),
        }
    }

    /// Where a snapshot's copy lives: a tree for a dir volume, an image for a loop volume.
    fn snapshot_data(&self, rec: &SnapshotRecord) -> PathBuf {
        match rec.backend {
            Backend::Dir => self.snapshot_dir.join(&rec.id),
            Backend::Loop => self.snapshot_loop.join(format!("{}.img", rec.id)),
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
    store: MetaStore<VolumeRecord>,
    snapshot_store: MetaStore<SnapshotRecord>,
    /// Held for the plugin's life: one process per root.
    _root_lock: RootLock,
    volumes: Mutex<BTreeMap<String, VolumeRecord>>,
    snapshots: Mutex<BTreeMap<String, SnapshotRecord>>,
    /// Fault injection, shared with the CSI adapters: they act on RPCs as they arrive, the
    /// core at points inside them (a crash in the middle of a copy).
    faults: Arc<Faults>,
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

/// What a CreateVolume with a content source leaves unsaid is the source's: its pool,
/// backend and file system (the copy must be able to hold the data). Without a source,
/// all `None`: the plugin's own defaults apply.
#[derive(Debug, Clone, Default)]
struct Defaults {
    pool: Option<String>,
    backend: Option<Backend>,
    fs_type: Option<String>,
}

impl Defaults {
    fn of_volume(rec: &VolumeRecord) -> Self {
        Self {
            pool: rec.pool.clone(),
            backend: Some(rec.backend),
            fs_type: rec.fs_type.clone(),
        }
    }

    fn of_snapshot(rec: &SnapshotRecord) -> Self {
        Self {
            pool: Some(rec.pool.clone()),
            backend: Some(rec.backend),
            fs_type: rec.fs_type.clone(),
        }
    }
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
            &layout.snapshot_dir,
            &layout.snapshot_loop,
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
        let (snapshot_store, snapshot_records, bad) =
            MetaStore::open(layout.snapshot_meta.clone()).map_err(store_err)?;
        for e in &bad {
            tracing::error!(error = %DisplayChain(e), "ignoring unreadable snapshot record; its copy is kept");
        }
        let mut plugin = Self {
            host,
            layout,
            node_id: config.node_id.clone(),
            pools: config.pools.clone(),
            max_volume_size: config.max_volume_size,
            max_volumes_per_node: config.max_volumes_per_node,
            store,
            snapshot_store,
            _root_lock: root_lock,
            volumes: Mutex::new(BTreeMap::new()),
            snapshots: Mutex::new(BTreeMap::new()),
            faults: Arc::new(Faults::new(config.faults_file.clone())),
            controller: Mutex::new(()),
            busy: KeyLocks::default(),
            node_claims: Mutex::new(()),
            warned_imports: Mutex::new(BTreeSet::new()),
        };
        plugin.recover(records, &meta_dir)?;
        plugin.recover_snapshots(snapshot_records)?;
        if plugin.pools.is_empty() {
            let size = plugin.default_pool_size()?;
            tracing::info!(pool = DEFAULT_POOL, size, root = %plugin.layout.root.display(),
                "no --pool given: the default pool is the size of the file system under the root");
            plugin.pools.insert(DEFAULT_POOL.to_owned(), size);
        }
        plugin.adopt_imports();
        Ok(plugin)
    }

    /// The default pool's size: the size of the file system under the root, less the
    /// blocks reserved for the superuser. A file system's size does not change with what
    /// is written, by the pool's volumes or anyone else, so the pool is the same at every
    /// start; the free space would shrink it by every byte written (and make the reported
    /// capacity depend on unrelated writers). The price: on a file system shared with other
    /// data the pool can promise more than is free, as `dir` volumes (accounted, not
    /// allocated) and sparse loop images already can. `--pool` sets a firm size.
    fn default_pool_size(&self) -> Result<u64, OpenError> {
        let st = nix::sys::statvfs::statvfs(&self.layout.root).map_err(|e| {
            OpenError::FileSystemSize {
                root: self.layout.root.clone(),
                source: e.into(),
            }
        })?;
        let reserved = st.blocks_free().saturating_sub(st.blocks_available());
        Ok(st
            .blocks()
            .saturating_sub(reserved)
            .saturating_mul(st.fragment_size()))
    }

    /// The fault injection source the CSI adapters share with the core.
    pub(crate) fn faults(&self) -> Arc<Faults> {
        Arc::clone(&self.faults)
    }

    fn recover(&self, records: Vec<VolumeRecord>, meta_dir: &Path) -> Result<(), OpenError> {
        for mut rec in records {
            match rec.phase {
                Phase::Ready => {
                    if let Some(path) = rec.frozen.take() {
                        self.thaw_after_crash(&rec.id, &path);
                        self.store.put(&rec).map_err(|e| OpenError::Recover {
                            subject: Subject::Volume,
                            id: rec.id.clone(),
                            source: Box::new(VolumeError::store(&rec.id, e)),
                        })?;
                    }
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
                        subject: Subject::Volume,
                        id: rec.id.clone(),
                        source: Box::new(source),
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
                        tracing::warn!(path = %path.display(), error = %slrp_types::DisplayChain(&err), "could not remove orphaned storage");
                    }
                }
            }
        }
        Ok(())
    }

    /// Thaws a file system the plugin froze for a copy and died before thawing. It is
    /// frozen still if the mount survived the crash (the kernel keeps it); after a reboot
    /// the thaw finds nothing mounted and fails, which is fine.
    fn thaw_after_crash(&self, volume_id: &str, path: &Path) {
        match self.host.thaw_fs(path) {
            Ok(()) => tracing::warn!(volume_id, path = %path.display(),
                "thawed a file system left frozen by a copy that was interrupted"),
            Err(e) => tracing::info!(volume_id, path = %path.display(), error = %DisplayChain(&e),
                "a copy was interrupted while the file system was frozen; it is not frozen now"),
        }
    }

    /// Loads snapshot records: a copy that was interrupted (phase `creating`) or a deletion
    /// (`deleting`) is rolled back or finished: its data removed, then its record. Data
    /// with no record at all is removed too (records are written before data and removed
    /// after it, so that is only debris left by hand).
    fn recover_snapshots(&self, records: Vec<SnapshotRecord>) -> Result<(), OpenError> {
        for rec in records {
            match rec.phase {
                Phase::Ready => {
                    lock(&self.snapshots).insert(rec.id.clone(), rec);
                }
                Phase::Creating | Phase::Deleting => {
                    tracing::info!(snapshot_id = %rec.id, phase = ?rec.phase,
                        "removing a snapshot whose copy or deletion was interrupted");
                    let res = self.remove_snapshot_data(&rec).and_then(|()| {
                        self.snapshot_store
                            .remove(&rec.id)
                            .map_err(|e| VolumeError::snapshot_store(&rec.id, e))
                    });
                    res.map_err(|source| OpenError::Recover {
                        subject: Subject::Snapshot,
                        id: rec.id.clone(),
                        source: Box::new(source),
                    })?;
                }
            }
        }
        for (dir, suffix) in [
            (&self.layout.snapshot_dir, ""),
            (&self.layout.snapshot_loop, ".img"),
        ] {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(suffix) else {
                    continue;
                };
                if ids::is_valid_snapshot_id(id) && !self.snapshot_store.has(id) {
                    let path = e.path();
                    tracing::warn!(path = %path.display(), "removing snapshot data without a record");
                    let res = if suffix.is_empty() {
                        fs::remove_dir_all(&path)
                    } else {
                        fs::remove_file(&path)
                    };
                    if let Err(err) = res {
                        tracing::warn!(path = %path.display(), error = %DisplayChain(&err), "could not remove orphaned snapshot data");
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

    /// The CSI name rules, shared by volumes and snapshots: not empty, at most
    /// [`MAX_NAME_LEN`] bytes, none of the control characters the spec bans.
    fn check_name(field: &'static str, name: &str) -> Result<(), VolumeError> {
        if name.is_empty() {
            return Err(VolumeError::invalid(field, "is empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(VolumeError::invalid(
                field,
                format!("is longer than {MAX_NAME_LEN} bytes"),
            ));
        }
        if let Some(c) = name.chars().find(|&c| is_banned_name_char(c)) {
            return Err(VolumeError::invalid(
                field,
                format!("contains the control character U+{:04X}", u32::from(c)),
            ));
        }
        Ok(())
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
        // Node-local: "published on a node" can only mean this node, and the plugin has no
        // ControllerPublish, so a volume counts as published here while it is staged or
        // published here.
        let in_use = rec.staged.is_some() || !rec.published.is_empty();
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
            content_source: rec.content_source.as_ref().map(|s| match s {
                ContentSource::Snapshot(id) => types::ContentSource::Snapshot(id.clone()),
                ContentSource::Volume(id) => types::ContentSource::Volume(id.clone()),
            }),
            condition: None,
            published_node_ids: if in_use {
                vec![self.node_id.clone()]
            } else {
                Vec::new()
            },
        }
    }

    /// Bytes of `pool` taken by its volumes and snapshots (those being created included).
    fn pool_used(&self, pool: &str) -> u64 {
        let volumes: u64 = lock(&self.volumes)
            .values()
            .filter(|r| r.pool.as_deref() == Some(pool))
            .map(|r| r.capacity_bytes)
            .sum();
        let snapshots: u64 = lock(&self.snapshots)
            .values()
            .filter(|r| r.pool == pool)
            .map(|r| r.size_bytes)
            .sum();
        volumes.saturating_add(snapshots)
    }

    fn pool_available(&self, pool: &str) -> Option<u64> {
        let total = *self.pools.get(pool)?;
        Some(total.saturating_sub(self.pool_used(pool)))
    }
}
