//! The writer thread: the only code that writes the database.
//!
//! It blocks for the first queued transaction, then takes whatever else is queued (up to
//! `max_batch`) and applies all of it in one SQLite transaction, so one WAL fsync makes
//! the whole batch durable (group commit). Every waiter is answered only after that
//! commit returned. Transactions in a batch apply in queue order, so the result equals
//! committing them one by one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rusqlite::{Connection, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use crate::error::{StoreError, StoreOp};
use crate::record::Kind;
use crate::store::Shared;

/// Fail point names (feature `failpoints`). Each is evaluated once per batch.
pub mod failpoints {
    /// After the batch was taken from the queue, before anything is written.
    pub const BATCH_START: &str = "slrp_store::batch_start";
    /// After every change was applied, before the COMMIT (nothing is durable yet).
    pub const BEFORE_COMMIT: &str = "slrp_store::before_commit";
    /// After the COMMIT returned (the batch is durable), before the waiters are answered.
    pub const AFTER_COMMIT: &str = "slrp_store::after_commit";
}

/// One change.
pub(crate) enum Op {
    Put {
        kind: Kind,
        key: String,
        schema: u32,
        value: String,
        crc: u32,
    },
    Delete {
        kind: Kind,
        key: String,
    },
    DeletePrefix {
        kind: Kind,
        prefix: String,
        upper: String,
    },
}

impl Op {
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Put { kind, key, .. } => format!("put {kind}/{key}"),
            Self::Delete { kind, key } => format!("delete {kind}/{key}"),
            Self::DeletePrefix { kind, prefix, .. } => format!("delete {kind}/{prefix}*"),
        }
    }
}

/// One transaction waiting for the writer.
pub(crate) struct Request {
    pub(crate) ops: Vec<Op>,
    pub(crate) reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Whether the fail point `point` fired (always false without the `failpoints` feature).
/// Actions like `pause` and `sleep(ms)` block here; `return` makes it fire.
#[cfg(feature = "failpoints")]
fn injected(point: &'static str) -> bool {
    fail::eval(point, |_| ()).is_some()
}

#[cfg(not(feature = "failpoints"))]
fn injected(_point: &'static str) -> bool {
    false
}

pub(crate) fn run(
    mut conn: Connection,
    mut rx: mpsc::Receiver<Request>,
    shared: Arc<Shared>,
    max_batch: usize,
) {
    let mut batch = Vec::with_capacity(max_batch);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let result = if shared.poisoned.load(Ordering::Acquire) {
            Err(StoreError::Poisoned)
        } else {
            apply(&mut conn, &batch)
        };
        match result {
            Ok(()) => {
                let n = batch.len() as u64;
                shared.commits.fetch_add(n, Ordering::Relaxed);
                shared.syncs.fetch_add(1, Ordering::Relaxed);
                shared.max_batch.fetch_max(n, Ordering::Relaxed);
                for r in batch.drain(..) {
                    // A waiter that went away (cancelled) still had its changes committed.
                    let _ = r.reply.send(Ok(()));
                }
            }
            Err(e) => {
                if !matches!(e, StoreError::Poisoned) {
                    tracing::error!(error = %slrp_types::DisplayChain(&e), "state store commit failed; refusing further writes");
                }
                shared.poisoned.store(true, Ordering::Release);
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(e.share()));
                }
            }
        }
    }
    // Clean shutdown: leave the file in rollback-journal mode, so that a later read-only
    // open (`slrp inspect`) reads it without creating a log. This checkpoints the log into
    // the database first. Best effort: a reader that is still attached keeps WAL mode, and
    // the next `Store::open` switches back to WAL anyway.
    if !shared.poisoned.load(Ordering::Acquire)
        && let Err(e) = conn.query_row("PRAGMA journal_mode = DELETE", [], |r| {
            r.get::<_, String>(0)
        })
    {
        tracing::debug!(error = %slrp_types::DisplayChain(&e), "state store stays in WAL mode at shutdown");
    }
}

fn apply(conn: &mut Connection, batch: &[Request]) -> Result<(), StoreError> {
    let io = |e| StoreError::io(StoreOp::Commit, e);
    if injected(failpoints::BATCH_START) {
        return Err(StoreError::Injected {
            point: failpoints::BATCH_START,
        });
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(io)?;
    {
        let mut put = tx
            .prepare_cached(
                "INSERT INTO records (kind, key, schema, value, crc) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (kind, key) DO UPDATE
                 SET schema = excluded.schema, value = excluded.value, crc = excluded.crc",
            )
            .map_err(io)?;
        let mut delete = tx
            .prepare_cached("DELETE FROM records WHERE kind = ?1 AND key = ?2")
            .map_err(io)?;
        let mut delete_range = tx
            .prepare_cached("DELETE FROM records WHERE kind = ?1 AND key >= ?2 AND key < ?3")
            .map_err(io)?;
        for op in batch.iter().flat_map(|r| &r.ops) {
            match op {
                Op::Put {
                    kind,
                    key,
                    schema,
                    value,
                    crc,
                } => put
                    .execute(params![kind.as_str(), key, schema, value, crc])
                    .map_err(io)?,
                Op::Delete { kind, key } => {
                    delete.execute(params![kind.as_str(), key]).map_err(io)?
                }
                Op::DeletePrefix {
                    kind,
                    prefix,
                    upper,
                } => delete_range
                    .execute(params![kind.as_str(), prefix, upper])
                    .map_err(io)?,
            };
        }
    }
    if injected(failpoints::BEFORE_COMMIT) {
        // Dropping `tx` rolls back: nothing of this batch reaches the disk.
        return Err(StoreError::Injected {
            point: failpoints::BEFORE_COMMIT,
        });
    }
    tx.commit().map_err(io)?;
    if injected(failpoints::AFTER_COMMIT) {
        return Err(StoreError::Injected {
            point: failpoints::AFTER_COMMIT,
        });
    }
    Ok(())
}
