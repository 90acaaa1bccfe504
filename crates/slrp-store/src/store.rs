//! [`Store`]: opening, reading, and the transaction API in front of the writer thread.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use nix::fcntl::{Flock, FlockArg};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use crate::crc32c::record_checksum;
use crate::error::{StoreError, StoreOp};
use crate::record::{Kind, PREFIX_END, RawRecord, Record, StoredRow, check_key};
use crate::writer::{self, Op, Request};

/// Name of the database file inside the state directory.
pub const DB_FILE: &str = "state.db";
/// Name of the lock file that keeps a second writer out.
pub const LOCK_FILE: &str = "state.lock";
/// On-disk format version this build writes (`PRAGMA user_version`).
pub const FORMAT_VERSION: i64 = 1;
/// `PRAGMA application_id` of an slrp store: ASCII `SLRP`.
pub const APPLICATION_ID: i32 = 0x534C_5250;

/// Tuning knobs; the defaults suit the provider.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Most transactions the writer folds into one SQLite commit (one fsync).
    pub max_batch: usize,
    /// Transactions that may wait for the writer before `commit` applies backpressure.
    pub queue_depth: usize,
}

impl StoreConfig {
    /// Refuses values the store cannot work with, naming the field, instead of quietly
    /// raising them: a zero here is a configuration mistake, not a request for one.
    ///
    /// # Errors
    /// [`StoreError::Config`] for a zero `max_batch` or `queue_depth`.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.max_batch == 0 {
            return Err(StoreError::Config {
                field: "max_batch",
                problem: "must be at least 1",
            });
        }
        if self.queue_depth == 0 {
            return Err(StoreError::Config {
                field: "queue_depth",
                problem: "must be at least 1",
            });
        }
        Ok(())
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            max_batch: 512,
            queue_depth: 1024,
        }
    }
}

/// Counters of the writer, for metrics and for tests of group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Transactions committed durably.
    pub commits: u64,
    /// SQLite commits, each of which ends with one fsync of the write-ahead log
    /// (`synchronous=FULL`). `commits / syncs` is the group-commit factor.
    pub syncs: u64,
    /// Largest number of transactions folded into one sync so far.
    pub max_batch: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) commits: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) max_batch: AtomicU64,
    /// Set when a commit failed: nothing else may be written by this process, because the
    /// caller of the failed commit will exit and recover from what is on disk.
    pub(crate) poisoned: AtomicBool,
}

/// The durable state store. Cheap to clone; every clone talks to the same writer thread.
///
/// Open it once per state directory and process: [`Store::open`] takes an exclusive lock.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// `None` only while dropping.
    reader: Mutex<Option<Connection>>,
    writer: Option<Writer>,
    shared: Arc<Shared>,
    /// Held for the store's lifetime; `None` for read-only stores.
    _lock: Option<Flock<File>>,
}

struct Writer {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The reader goes first so that the writer's connection is the last one: SQLite then
        // checkpoints the log into the database and removes it, leaving a clean directory.
        drop(
            self.reader
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if let Some(w) = &mut self.writer {
            // Closing the channel ends the writer loop once it has answered what is queued;
            // joining makes sure the database is closed before a reopen in the same process.
            drop(w.tx.take());
            if let Some(t) = w.thread.take()
                && t.join().is_err()
            {
                tracing::error!(path = %self.path.display(), "state store writer thread panicked");
            }
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .field("read_only", &self.inner.writer.is_none())
            .finish_non_exhaustive()
    }
}

fn sync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Dir {
            path: path.to_owned(),
            source,
        })
}

/// Creates `dir` (and missing parents), fsyncing each new directory's parent so the
/// directory entry itself is durable.
fn create_dir_durable(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(source) => {
            return Err(StoreError::Dir {
                path: dir.to_owned(),
                source,
            });
        }
    }
    sync_dir(dir)?;
    match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

fn open_error(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            StoreError::CorruptDatabase {
                path: path.to_owned(),
                detail: e.to_string(),
            }
        }
        Some(_) | None => StoreError::Open {
            path: path.to_owned(),
            source: e.into(),
        },
    }
}

const SCHEMA: &str = "
CREATE TABLE records (
    kind   TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    schema INTEGER NOT NULL,
    value  TEXT    NOT NULL,
    crc    INTEGER NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
";

/// Checks the header fields that say whose file this is and which format it has; on a
/// fresh file (writable open only) creates the schema.
fn check_or_init(conn: &mut Connection, path: &Path, writable: bool) -> Result<(), StoreError> {
    let oe = |e| open_error(path, e);
    let app_id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(oe)?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(oe)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(oe)?;
    if app_id == 0 && version == 0 && tables == 0 {
        if !writable {
            return Err(StoreError::NotFound {
                path: path.to_owned(),
            });
        }
        let tx = conn.transaction().map_err(oe)?;
        tx.execute_batch(SCHEMA).map_err(oe)?;
        tx.execute_batch(&format!(
            "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {FORMAT_VERSION};"
        ))
        .map_err(oe)?;
        tx.commit().map_err(oe)?;
        return Ok(());
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::NotAStore {
            path: path.to_owned(),
            found: app_id,
        });
    }
    if version > FORMAT_VERSION {
        return Err(StoreError::NewerFormat {
            path: path.to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if version < 1 {
        return Err(StoreError::CorruptDatabase {
            path: path.to_owned(),
            detail: format!("format version {version} was never written by slrp"),
        });
    }
    // Version 1 is the first format: there is nothing to migrate from yet.
    let check: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(oe)?;
    if check != "ok" {
        return Err(StoreError::CorruptDatabase {
            path: path.to_owned(),
            detail: check,
        });
    }
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the store in `dir` for reading and writing.
    ///
    /// Blocking: call it before the runtime starts serving, or from `spawn_blocking`. It
    /// takes an exclusive lock on `dir/state.lock`, checks the format, runs SQLite's
    /// `quick_check`, verifies the checksum of every record (so a damaged record fails the
    /// start instead of being found later), and starts the writer thread.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(dir, StoreConfig::default())
    }

    /// [`Store::open`] with explicit tuning.
    pub fn open_with(dir: impl AsRef<Path>, config: StoreConfig) -> Result<Self, StoreError> {
        config.validate()?;
        let dir = dir.as_ref();
        create_dir_durable(dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| StoreError::Dir {
                path: lock_path.clone(),
                source,
            })?;
        let lock =
            Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
                StoreError::Locked {
                    path: lock_path.clone(),
                    source: std::io::Error::from(errno),
                }
            })?;

        let path = dir.join(DB_FILE);
        let existed = path.exists();
        let mut conn = Connection::open(&path).map_err(|e| open_error(&path, e))?;
        let oe = |e| open_error(&path, e);
        // WAL + synchronous=FULL: a commit returns only after the log is fsynced, and a
        // torn log tail (checksummed frames) is discarded on the next open.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(oe)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::CorruptDatabase {
                path: path.clone(),
                detail: format!("journal mode {mode} instead of wal"),
            });
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")
            .map_err(oe)?;
        check_or_init(&mut conn, &path, true)?;
        if !existed {
            sync_dir(dir)?;
        }

        let reader = Self::open_reader(&path)?;
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel(config.queue_depth);
        let thread = {
            let shared = shared.clone();
            let max_batch = config.max_batch;
            std::thread::Builder::new()
                .name("slrp-store-writer".to_owned())
                .spawn(move || writer::run(conn, rx, shared, max_batch))
                .map_err(|source| StoreError::WriterSpawn { source })?
        };
        let store = Self {
            inner: Arc::new(Inner {
                path,
                reader: Mutex::new(Some(reader)),
                writer: Some(Writer {
                    tx: Some(tx),
                    thread: Some(thread),
                }),
                shared,
                _lock: Some(lock),
            }),
        };
        store.verify_blocking()?;
        Ok(store)
    }

    /// Opens an existing store for reading only, e.g. for `slrp inspect` while the daemon
    /// runs. Never writes the database or its log, never creates a missing store, and
    /// takes no lock. Records are verified as they are read, not at open.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().join(DB_FILE);
        if !path.is_file() {
            return Err(StoreError::NotFound { path });
        }
        let mut conn = Self::open_reader(&path)?;
        check_or_init(&mut conn, &path, false)?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                reader: Mutex::new(Some(conn)),
                writer: None,
                shared: Arc::new(Shared::default()),
                _lock: None,
            }),
        })
    }

    fn open_reader(path: &Path) -> Result<Connection, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| open_error(path, e))?;
        conn.execute_batch("PRAGMA query_only = 1; PRAGMA busy_timeout = 5000;")
            .map_err(|e| open_error(path, e))?;
        Ok(conn)
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether this store was opened with [`Store::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.writer.is_none()
    }

    /// Writer counters.
    pub fn stats(&self) -> StoreStats {
        let s = &self.inner.shared;
        StoreStats {
            commits: s.commits.load(Ordering::Relaxed),
            syncs: s.syncs.load(Ordering::Relaxed),
            max_batch: s.max_batch.load(Ordering::Relaxed),
        }
    }

    /// Transactions waiting for the writer right now.
    pub fn queued(&self) -> usize {
        match self.inner.writer.as_ref().and_then(|w| w.tx.as_ref()) {
            Some(tx) => tx.max_capacity() - tx.capacity(),
            None => 0,
        }
    }

    /// Starts a transaction. Nothing is written until [`Transaction::commit`].
    pub fn transaction(&self) -> Transaction {
        self.transaction_with(Changes::new())
    }

    /// A transaction of `changes` staged elsewhere.
    pub fn transaction_with(&self, changes: Changes) -> Transaction {
        Transaction {
            store: self.clone(),
            changes,
        }
    }

    fn reader(&self) -> MutexGuard<'_, Option<Connection>> {
        // A panic while reading leaves the connection usable: reads change nothing.
        self.inner.reader.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn query(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<StoredRow>, StoreError> {
        let mut rows = Vec::new();
        self.query_each(sql, args, |row| {
            rows.push(row);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(rows)
    }

    /// Runs `sql` and hands each row to `each` as it is read, so that a caller decoding
    /// rows never holds every row's text and every decoded record at once (with 100,000
    /// volumes the rows alone are tens of MiB). The reader is held until the last row,
    /// or until `each` breaks.
    fn query_each(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
        mut each: impl FnMut(StoredRow) -> Result<ControlFlow<()>, StoreError>,
    ) -> Result<(), StoreError> {
        let guard = self.reader();
        // The connection is only taken out in `Drop`, when no `&self` exists any more.
        let conn = guard.as_ref().ok_or(StoreError::WriterStopped)?;
        let read_error = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                StoreError::CorruptDatabase {
                    path: self.inner.path.clone(),
                    detail: e.to_string(),
                }
            }
            Some(_) | None => StoreError::io(StoreOp::Read, e),
        };
        let stored = |r: &rusqlite::Row<'_>| -> rusqlite::Result<StoredRow> {
            Ok(StoredRow {
                kind: raw_bytes(r, 0)?,
                key: raw_bytes(r, 1)?,
                schema: raw_u32(r, 2)?,
                value: raw_bytes(r, 3)?,
                crc: raw_u32(r, 4)?,
            })
        };
        let mut stmt = conn.prepare_cached(sql).map_err(read_error)?;
        let mut rows = stmt.query(args).map_err(read_error)?;
        while let Some(r) = rows.next().map_err(read_error)? {
            if each(stored(r).map_err(read_error)?)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Reads one record. Blocking; see [`Store::get`] for async code.
    pub fn get_blocking<R: Record>(&self, key: &str) -> Result<Option<R>, StoreError> {
        check_key(R::KIND, key)?;
        let rows = self.query(
            "SELECT kind, key, schema, value, crc FROM records WHERE kind = ?1 AND key = ?2",
            &[&R::KIND.as_str(), &key],
        )?;
        rows.into_iter()
            .next()
            .map(|r| r.verify()?.decode())
            .transpose()
    }

    /// Reads every record of `R`'s kind, ordered by key. Blocking.
    pub fn load_all_blocking<R: Record>(&self) -> Result<Vec<R>, StoreError> {
        self.load_prefix_blocking("")
    }

    /// Reads every record of `R`'s kind whose key starts with `prefix`, ordered by key.
    /// Blocking.
    pub fn load_prefix_blocking<R: Record>(&self, prefix: &str) -> Result<Vec<R>, StoreError> {
        self.fold_prefix_blocking(prefix, Vec::new(), |records, record| {
            records.push(record);
            Ok::<_, std::convert::Infallible>(())
        })?
        .map_err(|never| match never {})
    }

    /// Folds every record of `R`'s kind whose key starts with `prefix` into `init` with
    /// `step`, in key order, each decoded as it is read: a caller that turns records into
    /// something smaller (the provider's total from its resource records) never holds
    /// them all. `Ok(Err(_))` is `step`'s error, which stops the fold. Blocking. `step`
    /// runs with the store's reader held: it must not read this store (it would wait for
    /// itself), and other reads wait until the fold ends.
    ///
    /// # Errors
    /// A read that fails, or a record that fails its checksum or does not decode.
    pub fn fold_prefix_blocking<R: Record, A, E>(
        &self,
        prefix: &str,
        init: A,
        mut step: impl FnMut(&mut A, R) -> Result<(), E>,
    ) -> Result<Result<A, E>, StoreError> {
        let upper = format!("{prefix}{PREFIX_END}");
        let mut acc = init;
        let mut stopped = None;
        self.query_each(
            "SELECT kind, key, schema, value, crc FROM records
             WHERE kind = ?1 AND key >= ?2 AND key < ?3 ORDER BY key",
            &[&R::KIND.as_str(), &prefix, &upper],
            |row| {
                let record = row.verify()?.decode()?;
                Ok(match step(&mut acc, record) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(error) => {
                        stopped = Some(error);
                        ControlFlow::Break(())
                    }
                })
            },
        )?;
        Ok(stopped.map_or(Ok(acc), Err))
    }

    /// Every record of every kind (or of `kind`), each verified on its own: a corrupt record
    /// yields an `Err` in its place and does not hide the others. Blocking. For inspection
    /// and for kinds the caller has no type for.
    pub fn load_raw_blocking(
        &self,
        kind: Option<&str>,
    ) -> Result<Vec<Result<RawRecord, StoreError>>, StoreError> {
        let rows = match kind {
            Some(kind) => self.query(
                "SELECT kind, key, schema, value, crc FROM records WHERE kind = ?1 ORDER BY kind, key",
                &[&kind],
            )?,
            None => self.query(
                "SELECT kind, key, schema, value, crc FROM records ORDER BY kind, key",
                &[],
            )?,
        };
        Ok(rows.into_iter().map(|r| r.verify()?.into_raw()).collect())
    }

    /// Checks every record's checksum; the first damaged record is the error. Blocking.
    pub fn verify_blocking(&self) -> Result<usize, StoreError> {
        let rows = self.query("SELECT kind, key, schema, value, crc FROM records", &[])?;
        let n = rows.len();
        for r in rows {
            r.verify()?;
        }
        Ok(n)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(store))
            .await
            .map_err(|source| StoreError::ReadTask { source })?
    }

    /// Reads one record.
    pub async fn get<R: Record>(&self, key: &str) -> Result<Option<R>, StoreError> {
        let key = key.to_owned();
        self.blocking(move |s| s.get_blocking(&key)).await
    }

    /// Reads every record of `R`'s kind, ordered by key.
    pub async fn load_all<R: Record>(&self) -> Result<Vec<R>, StoreError> {
        self.blocking(|s| s.load_all_blocking()).await
    }

    /// Reads every record of `R`'s kind whose key starts with `prefix`, ordered by key.
    pub async fn load_prefix<R: Record>(&self, prefix: &str) -> Result<Vec<R>, StoreError> {
        let prefix = prefix.to_owned();
        self.blocking(move |s| s.load_prefix_blocking(&prefix))
            .await
    }

    /// [`Store::fold_prefix_blocking`] on a blocking thread.
    ///
    /// # Errors
    /// As [`Store::fold_prefix_blocking`].
    pub async fn fold_prefix<R, A, E>(
        &self,
        prefix: &str,
        init: A,
        step: impl FnMut(&mut A, R) -> Result<(), E> + Send + 'static,
    ) -> Result<Result<A, E>, StoreError>
    where
        R: Record,
        A: Send + 'static,
        E: Send + 'static,
    {
        let prefix = prefix.to_owned();
        self.blocking(move |s| s.fold_prefix_blocking(&prefix, init, step))
            .await
    }

    fn sender(&self) -> Result<&mpsc::Sender<Request>, StoreError> {
        let tx = self.inner.writer.as_ref().ok_or(StoreError::ReadOnly)?;
        if self.inner.shared.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Poisoned);
        }
        tx.tx.as_ref().ok_or(StoreError::WriterStopped)
    }
}

fn raw_bytes(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Vec<u8>> {
    use rusqlite::types::ValueRef;
    match r.get_ref(i)? {
        ValueRef::Text(b) | ValueRef::Blob(b) => Ok(b.to_vec()),
        ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => Ok(Vec::new()),
    }
}

/// An integer column of a row, `None` if the stored value is not a `u32` (damage that
/// [`StoredRow::verify`] reports as a corrupt record rather than failing the whole read).
fn raw_u32(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<u32>> {
    use rusqlite::types::ValueRef;
    Ok(match r.get_ref(i)? {
        ValueRef::Integer(n) => u32::try_from(n).ok(),
        ValueRef::Null | ValueRef::Real(_) | ValueRef::Text(_) | ValueRef::Blob(_) => None,
    })
}

/// A submitted transaction ([`Transaction::submit`]): resolves once it is durable, with
/// the commit's error otherwise.
#[must_use = "a submitted transaction's failure is only seen by awaiting it"]
#[derive(Debug)]
pub struct Durable(Option<oneshot::Receiver<Result<(), StoreError>>>);

impl std::future::Future for Durable {
    type Output = Result<(), StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.0 {
            None => std::task::Poll::Ready(Ok(())),
            Some(done) => std::pin::Pin::new(done)
                .poll(cx)
                .map(|reply| reply.map_err(|_| StoreError::WriterStopped)?),
        }
    }
}

/// Changes to the store, staged without touching it: the pure half of a
/// [`Transaction`]. Code that decides what to write (the provider machine) builds these
/// without a store handle; [`Store::transaction_with`] or [`Transaction::append`] makes
/// them a transaction.
///
/// Changes apply in the order they were added.
#[derive(Default)]
pub struct Changes {
    ops: Vec<Op>,
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may hold operator data; show only what is touched.
        let touched: Vec<String> = self.ops.iter().map(Op::describe).collect();
        f.debug_struct("Changes").field("ops", &touched).finish()
    }
}

impl Changes {
    /// No changes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces `record` under its key.
    ///
    /// # Errors
    /// For a key the store refuses (empty, too long, with NUL) or a record that does not
    /// encode.
    pub fn put<R: Record>(&mut self, record: &R) -> Result<&mut Self, StoreError> {
        let key = record.key();
        check_key(R::KIND, &key)?;
        let value = serde_json::to_string(record).map_err(|source| StoreError::Encode {
            kind: R::KIND.as_str(),
            key: key.clone(),
            source,
        })?;
        let crc = record_checksum(
            R::KIND.as_str().as_bytes(),
            key.as_bytes(),
            R::SCHEMA_VERSION,
            value.as_bytes(),
        );
        self.ops.push(Op::Put {
            kind: R::KIND,
            key,
            schema: R::SCHEMA_VERSION,
            value,
            crc,
        });
        Ok(self)
    }

    /// Deletes the record of `R`'s kind under `key` (nothing happens if there is none).
    ///
    /// # Errors
    /// For a key the store refuses.
    pub fn delete<R: Record>(&mut self, key: &str) -> Result<&mut Self, StoreError> {
        self.delete_kind(R::KIND, key)
    }

    /// Deletes the record of `kind` under `key`, for kinds the caller has no type for.
    ///
    /// # Errors
    /// For a key the store refuses.
    pub fn delete_kind(&mut self, kind: Kind, key: &str) -> Result<&mut Self, StoreError> {
        check_key(kind, key)?;
        self.ops.push(Op::Delete {
            kind,
            key: key.to_owned(),
        });
        Ok(self)
    }

    /// Deletes every record of `R`'s kind whose key starts with `prefix` (all of them for an
    /// empty prefix), e.g. an operation's whole status stream.
    pub fn delete_prefix<R: Record>(&mut self, prefix: &str) -> &mut Self {
        self.ops.push(Op::DeletePrefix {
            kind: R::KIND,
            prefix: prefix.to_owned(),
            upper: format!("{prefix}{PREFIX_END}"),
        });
        self
    }

    /// Adds `other`'s changes after these.
    pub fn append(&mut self, other: Changes) {
        self.ops.extend(other.ops);
    }

    /// Number of changes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no changes.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A set of changes that becomes durable all together or not at all.
///
/// Changes apply in the order they were added. Many transactions committed at the same
/// time from different tasks share one fsync (group commit), but each stays atomic.
#[must_use = "a transaction does nothing until committed"]
pub struct Transaction {
    store: Store,
    changes: Changes,
}

impl fmt::Debug for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("changes", &self.changes)
            .finish()
    }
}

impl Transaction {
    /// Inserts or replaces `record` under its key.
    pub fn put<R: Record>(&mut self, record: &R) -> Result<&mut Self, StoreError> {
        self.changes.put(record)?;
        Ok(self)
    }

    /// Deletes the record of `R`'s kind under `key` (nothing happens if there is none).
    pub fn delete<R: Record>(&mut self, key: &str) -> Result<&mut Self, StoreError> {
        self.changes.delete::<R>(key)?;
        Ok(self)
    }

    /// Deletes the record of `kind` under `key`, for kinds the caller has no type for.
    pub fn delete_kind(&mut self, kind: Kind, key: &str) -> Result<&mut Self, StoreError> {
        self.changes.delete_kind(kind, key)?;
        Ok(self)
    }

    /// Deletes every record of `R`'s kind whose key starts with `prefix` (all of them for an
    /// empty prefix), e.g. an operation's whole status stream.
    pub fn delete_prefix<R: Record>(&mut self, prefix: &str) -> &mut Self {
        self.changes.delete_prefix::<R>(prefix);
        self
    }

    /// The staged changes, for code that stages into [`Changes`].
    pub fn changes(&mut self) -> &mut Changes {
        &mut self.changes
    }

    /// Adds `changes` after what is staged.
    pub fn append(&mut self, changes: Changes) {
        self.changes.append(changes);
    }

    /// Number of changes in the transaction.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// Whether the transaction has no changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Makes every change durable, atomically. Returns once they are on stable storage.
    ///
    /// An error is fatal unless [`StoreError::is_fatal`] says otherwise: after a failed
    /// commit the store refuses further writes ([`StoreError::Poisoned`]), and whether the
    /// failed transaction reached the disk is for recovery to find out.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.submit().await?.await
    }

    /// Queues the transaction in the store's commit order and returns once it is queued,
    /// not once it is durable: the returned [`Durable`] resolves then. A transaction
    /// committed or submitted after this returns is applied after this one, and if this
    /// one fails the store is poisoned, so no later one becomes durable either: a caller
    /// whose next changes need not wait for this one's fsync can go on at once.
    pub async fn submit(self) -> Result<Durable, StoreError> {
        if self.changes.is_empty() {
            return Ok(Durable(None));
        }
        // Keys only (`Changes`'s Debug): which records each commit touches, for counting
        // the commits of one operation.
        tracing::trace!(changes = ?self.changes, "transaction submitted");
        let (reply, done) = oneshot::channel();
        let tx = self.store.sender()?.clone();
        tx.send(Request {
            ops: self.changes.ops,
            reply,
        })
        .await
        .map_err(|_| StoreError::WriterStopped)?;
        Ok(Durable(Some(done)))
    }

    /// [`Transaction::commit`] for threads outside the async runtime.
    ///
    /// # Panics
    /// When called from within an async execution context (tokio forbids blocking there).
    pub fn commit_blocking(self) -> Result<(), StoreError> {
        if self.changes.is_empty() {
            return Ok(());
        }
        let (reply, done) = oneshot::channel();
        let tx = self.store.sender()?.clone();
        tx.blocking_send(Request {
            ops: self.changes.ops,
            reply,
        })
        .map_err(|_| StoreError::WriterStopped)?;
        done.blocking_recv()
            .map_err(|_| StoreError::WriterStopped)?
    }
}
