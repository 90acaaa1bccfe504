//! Durable state store for slrp.
//!
//! # Overview
//!
//! Everything the provider must not lose (volumes, operations, status update streams, the
//! provider's identity, profiles) is kept as typed records keyed by *kind* + *key* in one
//! SQLite database in write-ahead-log mode with `synchronous=FULL`. A [`Transaction`]
//! changes any number of records atomically; [`Transaction::commit`] returns once the
//! change is on stable storage. One writer thread applies whatever transactions are queued
//! in a single SQLite commit, so concurrent commits share one fsync (group commit). The
//! cost of a commit depends on its size, not on how many records are stored. Why SQLite
//! rather than a file layout, the numbers behind that, and the on-disk layout are in
//! `docs/state-store.md`.
//!
//! ```no_run
//! # use slrp_store::{Kind, Record, Store};
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Vol { id: String }
//! # impl Record for Vol { const KIND: Kind = Kind::VOLUME; fn key(&self) -> String { self.id.clone() } }
//! # async fn f() -> Result<(), slrp_store::StoreError> {
//! let store = Store::open("/var/lib/slrp/state")?;
//! let mut tx = store.transaction();
//! tx.put(&Vol { id: "a".into() })?.put(&Vol { id: "b".into() })?;
//! tx.commit().await?; // both durable, or (after a crash) neither
//! let vols: Vec<Vol> = store.load_all().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - `store`: [`Store`] (open, read-only open, reads) and [`Transaction`].
//! - `writer`: the writer thread and its group commit; fail point names in [`failpoints`].
//! - `record`: [`Kind`], the [`Record`] trait, the checksummed envelope, [`RawRecord`].
//! - `error`: [`StoreError`] and its classification.
//! - [`inspect`]: read-only rendering for `slrp inspect`.
//! - `crc32c`: the record checksum.
//!
//! # Invariants
//!
//! - A commit that returned `Ok` is durable; a transaction is applied entirely or not at all,
//!   also across a crash at any point.
//! - Every record is stored with a CRC-32C over kind, key, schema version and value. A record
//!   whose checksum does not match is reported as [`StoreError::CorruptRecord`] with its
//!   kind and key and is never decoded. [`Store::open`] checks every record, so damage is
//!   found at start, not in the middle of an operation.
//! - The file says what it is: `application_id` `SLRP` and `user_version` = format version.
//!   A newer format is refused ([`StoreError::NewerFormat`]), never guessed at.
//! - After any failed commit the store refuses all further writes ([`StoreError::Poisoned`]):
//!   failures are fatal and the next start recovers from what is on disk.
//! - Only one process writes a state directory (`state.lock`, `flock`).
//!
//! # Limitations
//!
//! - Reads go through one connection behind a mutex; that is enough for recovery and
//!   inspection, which is what reads are for (the provider keeps its state in memory).
//! - A read-only open of a store whose writer crashed may write SQLite's shared-memory
//!   index file (`state.db-shm`); it never writes the database or its log.
//! - There is no in-memory implementation: tests use a store in a temporary directory,
//!   which costs well under a millisecond per commit.

mod crc32c;
mod error;
pub mod inspect;
mod record;
mod store;
mod writer;

pub use error::{Corruption, IoClass, SqliteError, StoreError, StoreOp};
pub use record::{Kind, MAX_KEY_LEN, RawRecord, Record};
pub use store::{
    APPLICATION_ID, Changes, DB_FILE, Durable, FORMAT_VERSION, LOCK_FILE, Store, StoreConfig,
    StoreStats, Transaction,
};
pub use writer::failpoints;
