//! The store's error type.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// Errors from the state store. `Display` names this layer only; causes are in `source()`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The state directory or its database could not be opened or initialised.
    #[error("opening state store at {path}")]
    Open {
        /// Database file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: SqliteError,
    },
    /// Creating or syncing the state directory failed.
    #[error("preparing state directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the store open for writing.
    #[error("state store {path} is locked by another process")]
    Locked {
        /// Lock file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A tuning knob of [`crate::StoreConfig`] has a value the store cannot work with.
    #[error("store config field {field}: {problem}")]
    Config {
        /// The field, as named in `StoreConfig`.
        field: &'static str,
        /// What is wrong with its value.
        problem: &'static str,
    },
    /// The writer thread could not be started.
    #[error("starting the state store writer thread")]
    WriterSpawn {
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A read-only open found no store.
    #[error("no state store at {path}")]
    NotFound {
        /// Database file that was looked for.
        path: PathBuf,
    },
    /// The file is an SQLite database but not one written by slrp.
    #[error("{path} is not an slrp state store (application id {found:#010x})")]
    NotAStore {
        /// Database file.
        path: PathBuf,
        /// The application id found in the file header.
        found: i32,
    },
    /// The store was written by a newer slrp with a format this build cannot read.
    #[error(
        "state store {path} has format version {found}; this build reads versions up to {supported}"
    )]
    NewerFormat {
        /// Database file.
        path: PathBuf,
        /// Version in the file.
        found: i64,
        /// Newest version this build understands.
        supported: i64,
    },
    /// SQLite reports the database file itself as damaged.
    #[error("state store {path} is corrupt ({detail})")]
    CorruptDatabase {
        /// Database file.
        path: PathBuf,
        /// What the integrity check reported, or the failing step.
        detail: String,
    },
    /// One record failed its checksum or could not be decoded: it is never handed out.
    #[error("record {kind}/{key} is corrupt: {problem}")]
    CorruptRecord {
        /// Kind of the record as stored.
        kind: String,
        /// Key of the record as stored.
        key: String,
        /// What is wrong with it.
        problem: Corruption,
    },
    /// A record was written with a schema version of its type this build cannot read
    /// (a newer one, or an older one without an upgrade path).
    #[error(
        "record {kind}/{key} has schema version {found}, which this build (schema {supported}) cannot read: {reason}"
    )]
    RecordSchema {
        /// Kind of the record.
        kind: String,
        /// Key of the record.
        key: String,
        /// Schema version stored.
        found: u32,
        /// The schema version this build reads and writes.
        supported: u32,
        /// Why it cannot be read.
        reason: String,
    },
    /// A record's JSON did not match its type (after the checksum matched).
    #[error("decoding record {kind}/{key}")]
    Decode {
        /// Kind of the record.
        kind: String,
        /// Key of the record.
        key: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be serialised.
    #[error("encoding record {kind}/{key}")]
    Encode {
        /// Kind of the record.
        kind: &'static str,
        /// Key of the record.
        key: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A key is empty, too long or contains a character keys may not contain.
    #[error("invalid key {key:?} for record kind {kind}: {reason}")]
    InvalidKey {
        /// Kind of the record.
        kind: &'static str,
        /// The rejected key.
        key: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Reading or writing the database failed.
    #[error("state store {op} failed ({class})")]
    Io {
        /// What the store was doing.
        op: StoreOp,
        /// Classification of the failure (disk full, I/O error, ...).
        class: IoClass,
        /// Cause.
        #[source]
        source: SqliteError,
    },
    /// A write was attempted through a store opened with [`crate::Store::open_read_only`].
    #[error("state store was opened read-only")]
    ReadOnly,
    /// An earlier commit failed; the store accepts no further writes in this process.
    #[error("state store refuses writes after an earlier fatal commit failure")]
    Poisoned,
    /// The writer thread is gone (it panicked, or the store is shutting down).
    #[error("state store writer thread stopped")]
    WriterStopped,
    /// A blocking read task could not be joined.
    #[error("state store read task failed")]
    ReadTask {
        /// Cause.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A fault injected through a fail point (feature `failpoints`, tests only).
    #[error("injected failure at fail point {point}")]
    Injected {
        /// Name of the fail point.
        point: &'static str,
    },
}

impl StoreError {
    /// Whether the caller must treat this as fatal: stop, exit non-zero, and let recovery on
    /// the next start sort it out (conventions §4.4 rule 5). Only mistakes of the caller
    /// itself (a bad key, an unserialisable value, writing to a read-only store) are not.
    pub fn is_fatal(&self) -> bool {
        match self {
            Self::InvalidKey { .. }
            | Self::Encode { .. }
            | Self::ReadOnly
            | Self::Config { .. } => false,
            Self::Open { .. }
            | Self::Dir { .. }
            | Self::Locked { .. }
            | Self::WriterSpawn { .. }
            | Self::NotFound { .. }
            | Self::NotAStore { .. }
            | Self::NewerFormat { .. }
            | Self::CorruptDatabase { .. }
            | Self::CorruptRecord { .. }
            | Self::RecordSchema { .. }
            | Self::Decode { .. }
            | Self::Io { .. }
            | Self::Poisoned
            | Self::WriterStopped
            | Self::ReadTask { .. }
            | Self::Injected { .. } => true,
        }
    }
}

/// What the store was doing when an I/O error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// Committing a batch of transactions.
    Commit,
    /// Reading records.
    Read,
    /// Verifying the database.
    Verify,
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Commit => "commit",
            Self::Read => "read",
            Self::Verify => "verify",
        })
    }
}

/// Coarse cause of an I/O failure, for logs and metrics; mirrors the errno behind it where
/// SQLite tells us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    /// ENOSPC / SQLITE_FULL.
    DiskFull,
    /// EIO / SQLITE_IOERR.
    Io,
    /// EROFS or a read-only file / SQLITE_READONLY.
    ReadOnlyFs,
    /// EACCES / SQLITE_PERM, SQLITE_AUTH.
    Permission,
    /// SQLITE_CORRUPT / SQLITE_NOTADB.
    Corrupt,
    /// SQLITE_BUSY / SQLITE_LOCKED: another process holds the database.
    Busy,
    /// Anything else.
    Other,
}

impl fmt::Display for IoClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DiskFull => "disk full",
            Self::Io => "I/O error",
            Self::ReadOnlyFs => "read-only file system",
            Self::Permission => "permission denied",
            Self::Corrupt => "database corrupt",
            Self::Busy => "database busy",
            Self::Other => "other",
        })
    }
}

impl IoClass {
    pub(crate) fn of(e: &rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as C;
        match e.sqlite_error_code() {
            Some(C::DiskFull) => Self::DiskFull,
            Some(C::SystemIoFailure) => Self::Io,
            Some(C::ReadOnly) => Self::ReadOnlyFs,
            Some(C::PermissionDenied | C::AuthorizationForStatementDenied) => Self::Permission,
            Some(C::DatabaseCorrupt | C::NotADatabase) => Self::Corrupt,
            Some(C::DatabaseBusy | C::DatabaseLocked) => Self::Busy,
            Some(_) | None => Self::Other,
        }
    }
}

/// What is wrong with a corrupt record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Corruption {
    /// The stored checksum does not match the stored fields.
    Checksum {
        /// Checksum stored with the record.
        stored: u32,
        /// Checksum computed from the stored fields.
        computed: u32,
    },
    /// An integer column (`schema` or `crc`) does not hold a 32-bit unsigned integer.
    Column {
        /// The column.
        column: &'static str,
    },
    /// The checksum matched but a field is not UTF-8 (a checksum collision).
    NotUtf8,
    /// The checksum matched but the value is not JSON (a checksum collision, or a bug).
    NotJson,
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Checksum { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )
            }
            Self::Column { column } => {
                write!(f, "column {column} does not hold a 32-bit unsigned integer")
            }
            Self::NotUtf8 => f.write_str("a field is not UTF-8"),
            Self::NotJson => f.write_str("value is not JSON"),
        }
    }
}

/// An SQLite error shared between every transaction of a failed batch.
#[derive(Debug, Clone)]
pub struct SqliteError(Arc<rusqlite::Error>);

impl SqliteError {
    /// The underlying SQLite error.
    pub fn inner(&self) -> &rusqlite::Error {
        &self.0
    }
}

impl From<rusqlite::Error> for SqliteError {
    fn from(e: rusqlite::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl fmt::Display for SqliteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SqliteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl StoreError {
    pub(crate) fn io(op: StoreOp, e: rusqlite::Error) -> Self {
        Self::Io {
            op,
            class: IoClass::of(&e),
            source: e.into(),
        }
    }

    /// A copy for every waiter of a failed batch. Only the variants the writer produces are
    /// ever cloned; anything else degrades to `Poisoned`, which is just as fatal.
    pub(crate) fn share(&self) -> Self {
        match self {
            Self::Io { op, class, source } => Self::Io {
                op: *op,
                class: *class,
                source: source.clone(),
            },
            Self::Injected { point } => Self::Injected { point },
            Self::CorruptDatabase { path, detail } => Self::CorruptDatabase {
                path: path.clone(),
                detail: detail.clone(),
            },
            Self::Open { .. }
            | Self::Dir { .. }
            | Self::Locked { .. }
            | Self::WriterSpawn { .. }
            | Self::NotFound { .. }
            | Self::NotAStore { .. }
            | Self::NewerFormat { .. }
            | Self::CorruptRecord { .. }
            | Self::RecordSchema { .. }
            | Self::Decode { .. }
            | Self::Encode { .. }
            | Self::InvalidKey { .. }
            | Self::ReadOnly
            | Self::Poisoned
            | Self::WriterStopped
            | Self::ReadTask { .. }
            | Self::Config { .. } => Self::Poisoned,
        }
    }
}
