//! Crash-safe metadata (one record per volume under `<root>/meta/`, one per snapshot under
//! `<root>/snapshots/meta/`) and the root lock.
//!
//! One JSON file per record, `<id>.json`, replaced atomically by
//! [`slrp_types::write_atomic`]: write `<id>.json.tmp` → fsync → rename over `<id>.json` →
//! fsync the directory. A reader therefore sees either the old or the new record, never a
//! torn one, and a record that `put` returned for survives a crash. Leftover `.tmp` files
//! are the debris of a crash mid-write and are removed on open.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ids;

/// Current record format; bumped on incompatible changes.
const FORMAT: u32 = 1;
/// A record larger than this is corrupt, not a volume.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// How a volume came to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Origin {
    /// Created by CreateVolume; its backing lives under `<root>/volumes/`.
    Created,
    /// Placed by an operator under `<root>/import/`.
    Imported,
}

/// Storage behind a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Backend {
    /// A directory; MOUNT access only; size accounted, not enforced.
    Dir,
    /// A sparse image file attached as a loop device.
    Loop,
}

impl Backend {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Dir => "dir",
            Self::Loop => "loop",
        }
    }
}

/// Access type the volume was created for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Access {
    /// A mounted file system.
    Mount,
    /// The raw block device.
    Block,
}

/// Lifecycle of a volume's backing storage or a snapshot's copy (two-phase create and
/// delete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Intent written, backing (or copy) maybe partly allocated or written; rolled back on
    /// start.
    Creating,
    /// Usable.
    Ready,
    /// Deletion started; finished on start.
    Deleting,
}

/// Where and how the volume is staged on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Staged {
    /// The CO's staging path.
    pub(crate) path: PathBuf,
    /// `fs_type` and mount flags the stage was done with (empty for block).
    pub(crate) fs_type: String,
    pub(crate) mount_flags: Vec<String>,
}

/// One publication of the volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Published {
    /// The CO's target path.
    pub(crate) target: PathBuf,
    /// Whether it was published read-only.
    pub(crate) readonly: bool,
    /// Mount flags requested at publish time.
    pub(crate) mount_flags: Vec<String>,
    /// Published with SINGLE_NODE_MULTI_WRITER: other targets on this node may be added
    /// while it stays, if they ask for that mode too. Absent in records written before it
    /// existed (those publications are single-writer).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) multi_writer: bool,
}

/// Where a volume's initial data came from (CreateVolume's `volume_content_source`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub(crate) enum ContentSource {
    /// Restored from this snapshot.
    Snapshot(String),
    /// Cloned from this volume.
    Volume(String),
}

/// Everything the plugin knows about one volume; the unit of durability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VolumeRecord {
    pub(crate) format: u32,
    pub(crate) id: String,
    /// The CO's name (CreateVolume idempotency key); never used in paths.
    pub(crate) name: String,
    pub(crate) origin: Origin,
    pub(crate) backend: Backend,
    pub(crate) access: Access,
    /// File system of a loop MOUNT volume (`None`: detect at stage, imported images).
    pub(crate) fs_type: Option<String>,
    /// Pool the capacity is accounted against (`None` for imported volumes).
    pub(crate) pool: Option<String>,
    pub(crate) capacity_bytes: u64,
    /// CreateVolume parameters, for idempotency checks.
    pub(crate) parameters: BTreeMap<String, String>,
    pub(crate) phase: Phase,
    /// Set once mkfs succeeded, so a restart never formats the volume again.
    pub(crate) formatted: bool,
    /// Set durably just before mkfs starts on a device that blkid found empty, cleared when
    /// `formatted` is set. Found set, it means an mkfs of ours was interrupted (timeout,
    /// crash): any signature on the device is that attempt's partial work, which a forced
    /// mkfs may overwrite. Absent in records written before it existed.
    #[serde(default)]
    pub(crate) formatting: bool,
    pub(crate) staged: Option<Staged>,
    pub(crate) published: Vec<Published>,
    /// The snapshot or volume this volume was created from; part of CreateVolume's
    /// idempotency (same name, other source → ALREADY_EXISTS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content_source: Option<ContentSource>,
    /// A loop MOUNT volume copied from a smaller source: its file system is still the
    /// source's size and is grown at its next stage (cleared once grown, or when the volume
    /// is formatted afresh).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) grow_fs: bool,
    /// Set durably just before the volume's file system (mounted at this staging path) is
    /// frozen for a copy, cleared after the thaw. Found set at start, it means the plugin
    /// died while the file system was frozen: it is thawed then, or every writer on it
    /// would hang forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) frozen: Option<PathBuf>,
}

impl VolumeRecord {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: String,
        name: String,
        origin: Origin,
        backend: Backend,
        access: Access,
        fs_type: Option<String>,
        pool: Option<String>,
        capacity_bytes: u64,
        parameters: BTreeMap<String, String>,
    ) -> Self {
        Self {
            format: FORMAT,
            id,
            name,
            origin,
            backend,
            access,
            fs_type,
            pool,
            capacity_bytes,
            parameters,
            phase: Phase::Creating,
            formatted: false,
            formatting: false,
            staged: None,
            published: Vec::new(),
            content_source: None,
            grow_fs: false,
            frozen: None,
        }
    }
}

/// Everything the plugin knows about one snapshot; the unit of durability.
///
/// A snapshot is a full copy of its source volume's data (a directory tree or an image
/// file), so it outlives the volume and restores need nothing else. It carries the facts a
/// restore needs to make an equivalent volume: backend, access type and file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotRecord {
    pub(crate) format: u32,
    pub(crate) id: String,
    /// The CO's name (CreateSnapshot idempotency key); never used in paths.
    pub(crate) name: String,
    pub(crate) source_volume_id: String,
    /// Pool the copy is accounted against: the source volume's.
    pub(crate) pool: String,
    pub(crate) backend: Backend,
    pub(crate) access: Access,
    /// The source's file system type (loop MOUNT volumes).
    pub(crate) fs_type: Option<String>,
    /// The source's `formatted` and `formatting` flags when the copy was taken: a restore
    /// inherits them, so it is neither formatted over its data nor left with a partial
    /// mkfs adopted.
    pub(crate) formatted: bool,
    pub(crate) formatting: bool,
    /// The source volume's size when the copy was taken: the least a restore may be.
    pub(crate) size_bytes: u64,
    /// When the copy started (after a freeze, if any), as seconds and nanoseconds since the
    /// Unix epoch: the point in time the data is from.
    pub(crate) created_secs: i64,
    pub(crate) created_nanos: u32,
    /// CreateSnapshot parameters (only the Kubernetes sidecars' keys are accepted).
    pub(crate) parameters: BTreeMap<String, String>,
    pub(crate) phase: Phase,
}

impl SnapshotRecord {
    /// A record in phase `creating` for a copy of `source` taken now.
    pub(crate) fn new(
        id: String,
        name: String,
        source: &VolumeRecord,
        pool: String,
        created: std::time::SystemTime,
        parameters: BTreeMap<String, String>,
    ) -> Self {
        let since_epoch = created
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            format: FORMAT,
            id,
            name,
            source_volume_id: source.id.clone(),
            pool,
            backend: source.backend,
            access: source.access,
            fs_type: source.fs_type.clone(),
            formatted: source.formatted,
            formatting: source.formatting,
            size_bytes: source.capacity_bytes,
            created_secs: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
            created_nanos: since_epoch.subsec_nanos(),
            parameters,
            phase: Phase::Creating,
        }
    }
}

/// A record kept by a [`MetaStore`]: serialized as JSON under its id.
pub(crate) trait Record: Serialize + DeserializeOwned {
    /// The id the record is stored under (a checked id: it becomes a file name).
    fn id(&self) -> &str;
    /// The record's format number.
    fn format(&self) -> u32;
}

impl Record for VolumeRecord {
    fn id(&self) -> &str {
        &self.id
    }
    fn format(&self) -> u32 {
        self.format
    }
}

impl Record for SnapshotRecord {
    fn id(&self) -> &str {
        &self.id
    }
    fn format(&self) -> u32 {
        self.format
    }
}

/// Failure of a metadata or lock operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system call failed.
    #[error("{op} {path}")]
    Io {
        /// The call.
        op: &'static str,
        /// Its path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A record does not decode.
    #[error("decoding {path}")]
    Decode {
        /// The record file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A record is from a newer format or names a different id than its file.
    #[error("record {path} is not a format-{FORMAT} record of its own id")]
    Incompatible {
        /// The record file.
        path: PathBuf,
    },
    /// Another process holds the root.
    #[error("root {path} is in use by another slrp-csi-local process")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Writes `data` to `path` atomically and durably (see the module docs).
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), StoreError> {
    slrp_types::write_atomic(path, data).map_err(|e| StoreError::Io {
        op: e.step.as_str(),
        path: e.path,
        source: e.source,
    })
}

/// Makes a directory entry change (create, rename, unlink) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    slrp_types::sync_dir(dir).map_err(io_err("fsyncing directory", dir))
}

/// A directory of records of one kind (`<root>/meta` for volumes, `<root>/snapshots/meta`
/// for snapshots).
#[derive(Debug)]
pub(crate) struct MetaStore<R> {
    dir: PathBuf,
    records: PhantomData<fn() -> R>,
}

impl<R: Record> MetaStore<R> {
    /// Opens (creating) the metadata directory and loads every record.
    ///
    /// Unreadable records are returned as errors next to the good ones, so one corrupt
    /// file does not hide the other volumes.
    pub(crate) fn open(dir: PathBuf) -> Result<(Self, Vec<R>, Vec<StoreError>), StoreError> {
        fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        let mut records = Vec::new();
        let mut bad = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
            let entry = entry.map_err(io_err("listing", &dir))?;
            let path = entry.path();
            let Some(fname) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if fname.ends_with(".json.tmp") {
                fs::remove_file(&path).map_err(io_err("removing", &path))?;
                continue;
            }
            let Some(id) = fname.strip_suffix(".json") else {
                continue;
            };
            match load(&path, id) {
                Ok(r) => records.push(r),
                Err(e) => bad.push(e),
            }
        }
        records.sort_by(|a: &R, b: &R| a.id().cmp(b.id()));
        Ok((
            Self {
                dir,
                records: PhantomData,
            },
            records,
            bad,
        ))
    }

    fn path(&self, id: &str) -> PathBuf {
        debug_assert!(ids::is_valid_volume_id(id));
        self.dir.join(format!("{id}.json"))
    }

    /// Whether a record file exists for `id` (read or not).
    pub(crate) fn has(&self, id: &str) -> bool {
        self.path(id).exists()
    }

    /// Durably replaces the record of `rec.id()`.
    pub(crate) fn put(&self, rec: &R) -> Result<(), StoreError> {
        let path = self.path(rec.id());
        let data = serde_json::to_vec_pretty(rec).map_err(|source| StoreError::Decode {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &data)
    }

    /// Durably removes the record of `id` (absent is fine).
    pub(crate) fn remove(&self, id: &str) -> Result<(), StoreError> {
        let path = self.path(id);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &path)(e)),
        }
    }
}

fn load<R: Record>(path: &Path, id: &str) -> Result<R, StoreError> {
    let len = fs::metadata(path).map_err(io_err("reading", path))?.len();
    if len > MAX_RECORD_BYTES {
        return Err(StoreError::Incompatible {
            path: path.to_owned(),
        });
    }
    let data = fs::read(path).map_err(io_err("reading", path))?;
    let rec: R = serde_json::from_slice(&data).map_err(|source| StoreError::Decode {
        path: path.to_owned(),
        source,
    })?;
    if rec.format() != FORMAT || rec.id() != id || !ids::is_valid_volume_id(id) {
        return Err(StoreError::Incompatible {
            path: path.to_owned(),
        });
    }
    Ok(rec)
}

/// Exclusive `flock` on `<root>/lock`, held for the life of the plugin so two processes
/// never manage the same volumes. The kernel drops it when the process dies, even on kill -9.
#[derive(Debug)]
pub(crate) struct RootLock {
    _lock: Flock<File>,
}

impl RootLock {
    pub(crate) fn acquire(root: &Path) -> Result<Self, StoreError> {
        let path = root.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("opening", &path))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|_| StoreError::Locked { path: path.clone() })?;
        Ok(Self { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> VolumeRecord {
        VolumeRecord::new(
            id.into(),
            format!("name of {id}"),
            Origin::Created,
            Backend::Dir,
            Access::Mount,
            None,
            Some("default".into()),
            1 << 20,
            BTreeMap::new(),
        )
    }

    #[test]
    fn put_load_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        let (store, recs, bad) = MetaStore::<VolumeRecord>::open(meta.clone()).unwrap();
        assert!(recs.is_empty() && bad.is_empty());
        let mut a = record("vol-a");
        store.put(&a).unwrap();
        a.phase = Phase::Ready;
        store.put(&a).unwrap();
        store.put(&record("vol-b")).unwrap();
        let (store, recs, _) = MetaStore::<VolumeRecord>::open(meta.clone()).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0], a);
        store.remove("vol-b").unwrap();
        store.remove("vol-b").unwrap();
        let (_, recs, _) = MetaStore::<VolumeRecord>::open(meta).unwrap();
        assert_eq!(recs, vec![a]);
    }

    #[test]
    fn crash_debris_and_corrupt_records() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        fs::create_dir_all(&meta).unwrap();
        fs::write(meta.join("vol-x.json.tmp"), b"{half").unwrap();
        fs::write(meta.join("vol-y.json"), b"not json").unwrap();
        let other = record("vol-other");
        fs::write(meta.join("vol-z.json"), serde_json::to_vec(&other).unwrap()).unwrap();
        let (_, recs, bad) = MetaStore::<VolumeRecord>::open(meta.clone()).unwrap();
        assert!(recs.is_empty());
        assert_eq!(bad.len(), 2);
        assert!(!meta.join("vol-x.json.tmp").exists());
    }

    /// Records written before the snapshot fields existed load unchanged (the new fields
    /// default to absent), and snapshot records round-trip in their own directory.
    #[test]
    fn older_volume_records_load_and_snapshot_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("meta");
        fs::create_dir_all(&meta).unwrap();
        let mut old = serde_json::to_value(record("vol-old")).unwrap();
        let fields = old.as_object_mut().unwrap();
        for new in ["content_source", "grow_fs", "frozen"] {
            fields.remove(new);
        }
        fs::write(meta.join("vol-old.json"), old.to_string()).unwrap();
        let (_, recs, bad) = MetaStore::<VolumeRecord>::open(meta).unwrap();
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(recs, vec![record("vol-old")]);

        let mut source = record("vol-src");
        source.content_source = Some(ContentSource::Snapshot("snap-a".into()));
        source.frozen = Some(PathBuf::from("/staging"));
        let snap = SnapshotRecord::new(
            "snap-b".into(),
            "name".into(),
            &source,
            "default".into(),
            std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 42),
            BTreeMap::new(),
        );
        assert_eq!((snap.created_secs, snap.created_nanos), (1_700_000_000, 42));
        let smeta = dir.path().join("snapshots/meta");
        let (store, _, _) = MetaStore::<SnapshotRecord>::open(smeta.clone()).unwrap();
        store.put(&snap).unwrap();
        assert!(store.has("snap-b"));
        let (_, snaps, bad) = MetaStore::<SnapshotRecord>::open(smeta.clone()).unwrap();
        assert!(bad.is_empty());
        assert_eq!(snaps, vec![snap]);
        // A volume record is not a snapshot record.
        fs::write(
            smeta.join("vol-src.json"),
            serde_json::to_vec(&source).unwrap(),
        )
        .unwrap();
        let (_, _, bad) = MetaStore::<SnapshotRecord>::open(smeta).unwrap();
        assert_eq!(bad.len(), 1);
    }

    #[test]
    fn root_lock_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let first = RootLock::acquire(dir.path()).unwrap();
        assert!(matches!(
            RootLock::acquire(dir.path()),
            Err(StoreError::Locked { .. })
        ));
        drop(first);
        RootLock::acquire(dir.path()).unwrap();
    }
}
