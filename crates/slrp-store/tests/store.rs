//! Store behaviour on a real database in a temporary directory.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use slrp_store::inspect::{self, Format};
use slrp_store::{Corruption, IoClass, Kind, Record, Store, StoreError, failpoints};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Vol {
    id: String,
    state: String,
    size: u64,
}

impl Record for Vol {
    const KIND: Kind = Kind::VOLUME;
    fn key(&self) -> String {
        self.id.clone()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Update {
    op: String,
    seq: u32,
    status: String,
}

impl Record for Update {
    const KIND: Kind = Kind::new("update");
    fn key(&self) -> String {
        format!("{}/{:010}", self.op, self.seq)
    }
}

/// The same kind as `Vol` but a newer schema of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct VolV2 {
    id: String,
}

impl Record for VolV2 {
    const KIND: Kind = Kind::VOLUME;
    const SCHEMA_VERSION: u32 = 2;
    fn key(&self) -> String {
        self.id.clone()
    }
}

fn vol(id: &str, state: &str) -> Vol {
    Vol {
        id: id.to_owned(),
        state: state.to_owned(),
        size: 1 << 30,
    }
}

fn files(dir: &Path) -> BTreeMap<String, (u64, SystemTime)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                (m.len(), m.modified().unwrap()),
            )
        })
        .collect()
}

#[tokio::test]
async fn round_trip_and_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let store = Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&vol("a", "CREATED"))?
            .put(&vol("/abs/b c", "NODE_READY"))?;
        tx.commit().await.unwrap();
        assert_eq!(
            store.get::<Vol>("a").await.unwrap(),
            Some(vol("a", "CREATED"))
        );
        assert_eq!(store.get::<Vol>("missing").await.unwrap(), None);

        // Overwrite and delete in one transaction.
        let mut tx = store.transaction();
        tx.put(&vol("a", "PUBLISHED"))?
            .delete::<Vol>("/abs/b c")?
            .put(&vol("z", "CREATED"))?;
        tx.commit().await.unwrap();
        let all: Vec<Vol> = store.load_all().await.unwrap();
        assert_eq!(all, vec![vol("a", "PUBLISHED"), vol("z", "CREATED")]);
    }

    // Same directory, new process state: everything is still there.
    let store = Store::open(dir.path()).unwrap();
    let all: Vec<Vol> = store.load_all().await.unwrap();
    assert_eq!(all, vec![vol("a", "PUBLISHED"), vol("z", "CREATED")]);
    // A clean shutdown leaves no write-ahead log behind.
    drop(store);
    let names: Vec<String> = files(dir.path()).into_keys().collect();
    assert_eq!(names, vec!["state.db", "state.lock"]);
    Ok(())
}

#[tokio::test]
async fn prefix_load_and_delete_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut tx = store.transaction();
    for op in ["op1", "op10", "op2"] {
        for seq in 0..3 {
            tx.put(&Update {
                op: op.into(),
                seq,
                status: "PENDING".into(),
            })
            .unwrap();
        }
    }
    tx.commit().await.unwrap();
    let op1: Vec<Update> = store.load_prefix("op1/").await.unwrap();
    assert_eq!(op1.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(op1.iter().all(|u| u.op == "op1"));

    let mut tx = store.transaction();
    tx.delete_prefix::<Update>("op1/");
    tx.commit().await.unwrap();
    let rest: Vec<Update> = store.load_all().await.unwrap();
    assert_eq!(rest.len(), 6);
    assert!(rest.iter().all(|u| u.op != "op1"));

    let mut tx = store.transaction();
    tx.delete_prefix::<Update>("");
    tx.commit().await.unwrap();
    assert!(store.load_all::<Update>().await.unwrap().is_empty());
}

#[tokio::test]
async fn caller_mistakes_are_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let err = store
        .transaction()
        .put(&vol("", "CREATED"))
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(err, StoreError::InvalidKey { kind: "volume", .. }),
        "{err}"
    );
    assert!(!err.is_fatal());
    // The store still works.
    let mut tx = store.transaction();
    tx.put(&vol("ok", "CREATED")).unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.stats().commits, 1);
}

#[tokio::test]
async fn second_writer_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let _store = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    // Readers are welcome.
    Store::open_read_only(dir.path()).unwrap();
}

#[tokio::test]
async fn many_concurrent_commits_are_all_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut tasks = Vec::new();
    for t in 0..64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                let mut tx = store.transaction();
                tx.put(&vol(&format!("v{t}-{i}"), "CREATED")).unwrap();
                tx.put(&Update {
                    op: format!("op{t}"),
                    seq: i,
                    status: "OK".into(),
                })
                .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.commits, 640);
    assert!(stats.syncs <= stats.commits);
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_all::<Vol>().await.unwrap().len(), 640);
    assert_eq!(store.load_all::<Update>().await.unwrap().len(), 640);
}

/// Holds the writer inside its first batch until 63 more commits are queued: they must
/// all become durable with a single further sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_one_sync() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let hold = std::sync::Mutex::new(Some((entered_tx, release_rx)));
    fail::cfg_callback(failpoints::BATCH_START, move || {
        // Only the first batch is held.
        if let Some((entered, release)) = hold.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
    })
    .unwrap();

    let first = {
        let mut tx = store.transaction();
        tx.put(&vol("first", "CREATED")).unwrap();
        tokio::spawn(tx.commit())
    };
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    let mut rest = Vec::new();
    for i in 0..63 {
        let mut tx = store.transaction();
        tx.put(&vol(&format!("v{i}"), "CREATED")).unwrap();
        rest.push(tokio::spawn(tx.commit()));
    }
    while store.queued() != 63 {
        tokio::task::yield_now().await;
    }
    release_tx.send(()).unwrap();
    first.await.unwrap().unwrap();
    for r in rest {
        r.await.unwrap().unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.commits, 64);
    assert_eq!(stats.syncs, 2, "{stats:?}");
    assert_eq!(stats.max_batch, 63);
    assert_eq!(store.load_all::<Vol>().await.unwrap().len(), 64);
}

#[tokio::test]
async fn failure_before_commit_writes_nothing_and_poisons() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut tx = store.transaction();
    tx.put(&vol("kept", "CREATED")).unwrap();
    tx.commit().await.unwrap();

    fail::cfg(failpoints::BEFORE_COMMIT, "return").unwrap();
    let mut tx = store.transaction();
    tx.put(&vol("a", "CREATED"))
        .unwrap()
        .put(&vol("b", "CREATED"))
        .unwrap();
    tx.delete::<Vol>("kept").unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(err, StoreError::Injected { point } if point == failpoints::BEFORE_COMMIT));
    assert!(err.is_fatal());
    fail::cfg(failpoints::BEFORE_COMMIT, "off").unwrap();

    // Fatal means no more writes from this process.
    let mut tx = store.transaction();
    tx.put(&vol("later", "CREATED")).unwrap();
    assert!(matches!(tx.commit().await, Err(StoreError::Poisoned)));

    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let all: Vec<Vol> = store.load_all().await.unwrap();
    assert_eq!(all, vec![vol("kept", "CREATED")]);
}

#[tokio::test]
async fn failure_after_commit_keeps_the_whole_transaction() {
    let _scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    fail::cfg(failpoints::AFTER_COMMIT, "return").unwrap();
    let mut tx = store.transaction();
    tx.put(&vol("a", "CREATED"))
        .unwrap()
        .put(&vol("b", "CREATED"))
        .unwrap();
    let err = tx.commit().await.unwrap_err();
    assert!(matches!(err, StoreError::Injected { point } if point == failpoints::AFTER_COMMIT));
    fail::cfg(failpoints::AFTER_COMMIT, "off").unwrap();
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.load_all::<Vol>().await.unwrap().len(), 2);
}

/// Flips one byte of a record's value in the database file: opening reports the record by
/// kind and key, and inspection lists it as corrupt without showing it as data.
#[tokio::test]
async fn flipped_byte_is_reported_with_kind_and_key() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&vol("good", "CREATED")).unwrap();
        tx.put(&Vol {
            id: "victim".into(),
            state: "MARKER_STATE_XYZ".into(),
            size: 7,
        })
        .unwrap();
        tx.commit().await.unwrap();
    }
    let db = dir.path().join("state.db");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"MARKER_STATE_XYZ")
        .expect("value in file");
    bytes[at + 3] ^= 0x01;
    std::fs::write(&db, &bytes).unwrap();

    let err = Store::open(dir.path()).unwrap_err();
    match &err {
        StoreError::CorruptRecord {
            kind,
            key,
            problem: Corruption::Checksum { .. },
        } => {
            assert_eq!((kind.as_str(), key.as_str()), ("volume", "victim"));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.is_fatal());
    assert!(err.to_string().contains("volume/victim"), "{err}");

    // Typed reads through a read-only store refuse the record too.
    let ro = Store::open_read_only(dir.path()).unwrap();
    assert!(matches!(
        ro.get_blocking::<Vol>("victim"),
        Err(StoreError::CorruptRecord { .. })
    ));
    assert!(ro.load_all_blocking::<Vol>().is_err());
    assert_eq!(
        ro.get_blocking::<Vol>("good").unwrap(),
        Some(vol("good", "CREATED"))
    );

    let report = inspect::inspect(dir.path()).unwrap();
    assert!(!report.is_clean());
    assert_eq!(report.corrupt.len(), 1);
    assert_eq!(report.corrupt[0].key, "victim");
    assert_eq!(report.records["volume"].len(), 1);
    let human = report.render(Format::Human);
    assert!(
        human.contains("CORRUPT (1)") && human.contains("volume/victim"),
        "{human}"
    );
}

/// A damaged integer column (schema version or checksum no longer a u32, or no longer an
/// integer) is a corrupt record named by kind and key, like a damaged value: it must not
/// fail every read as an I/O error, nor hide the other records from inspection.
#[tokio::test]
async fn damaged_schema_or_checksum_column_is_a_corrupt_record() {
    for (column, bad) in [("schema", "-1"), ("crc", "4294967296"), ("crc", "'x'")] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let mut tx = store.transaction();
            tx.put(&vol("good", "CREATED")).unwrap();
            tx.put(&vol("victim", "CREATED")).unwrap();
            tx.commit().await.unwrap();
        }
        {
            let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
            conn.execute(
                &format!("UPDATE records SET {column} = {bad} WHERE key = 'victim'"),
                [],
            )
            .unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, StoreError::CorruptRecord { kind, key, .. }
                if kind == "volume" && key == "victim"),
            "{column} = {bad}: {err:?}"
        );
        let ro = Store::open_read_only(dir.path()).unwrap();
        assert_eq!(
            ro.get_blocking::<Vol>("good").unwrap(),
            Some(vol("good", "CREATED"))
        );
        let report = inspect::inspect(dir.path()).unwrap();
        assert_eq!(report.corrupt.len(), 1, "{column} = {bad}");
        assert_eq!(report.corrupt[0].key, "victim");
        assert_eq!(report.records["volume"].len(), 1);
    }
}

#[tokio::test]
async fn flipped_byte_in_key_is_caught_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&vol("KEYMARKER_ABCDEF", "CREATED")).unwrap();
        tx.commit().await.unwrap();
    }
    let db = dir.path().join("state.db");
    let mut bytes = std::fs::read(&db).unwrap();
    // The key appears in the table's B-tree cell; damage every copy.
    let mut found = 0;
    while let Some(at) = bytes.windows(16).position(|w| w == b"KEYMARKER_ABCDEF") {
        bytes[at] = b'J';
        found += 1;
    }
    assert!(found > 0);
    std::fs::write(&db, &bytes).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err, StoreError::CorruptRecord { key, .. } if key == "JEYMARKER_ABCDEF")
            || matches!(&err, StoreError::CorruptDatabase { .. }),
        "{err:?}"
    );
}

#[test]
fn garbage_file_is_reported_not_used() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.db"), vec![0x5Au8; 8192]).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::CorruptDatabase { .. }), "{err:?}");
    let err = Store::open_read_only(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::CorruptDatabase { .. }), "{err:?}");
}

#[test]
fn newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
    conn.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(conn);
    for err in [
        Store::open(dir.path()).unwrap_err(),
        Store::open_read_only(dir.path()).unwrap_err(),
    ] {
        match &err {
            StoreError::NewerFormat {
                found: 99,
                supported: 1,
                ..
            } => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("format version 99"), "{err}");
    }
}

#[test]
fn foreign_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
    conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(conn);
    let err = Store::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::NotAStore { found: 0, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn newer_record_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut tx = store.transaction();
    tx.put(&VolV2 { id: "new".into() }).unwrap();
    tx.commit().await.unwrap();
    let err = store.get::<Vol>("new").await.unwrap_err();
    assert!(
        matches!(&err, StoreError::RecordSchema { found: 2, supported: 1, key, .. } if key == "new"),
        "{err:?}"
    );
}

#[tokio::test]
async fn read_only_open_never_writes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&vol("a", "CREATED")).unwrap();
        tx.commit().await.unwrap();
    }
    let before = files(dir.path());
    // mtime granularity: make a write after this point visible.
    std::thread::sleep(std::time::Duration::from_millis(20));
    {
        let ro = Store::open_read_only(dir.path()).unwrap();
        assert!(ro.is_read_only());
        assert_eq!(ro.load_all_blocking::<Vol>().unwrap().len(), 1);
        let mut tx = ro.transaction();
        tx.put(&vol("b", "CREATED")).unwrap();
        assert!(matches!(tx.commit().await, Err(StoreError::ReadOnly)));
        inspect::render(dir.path(), Format::Json).unwrap();
    }
    assert_eq!(
        files(dir.path()),
        before,
        "read-only use changed the directory"
    );

    // A missing store is reported, and nothing is created.
    let empty = tempfile::tempdir().unwrap();
    let missing = empty.path().join("nope");
    assert!(matches!(
        Store::open_read_only(&missing),
        Err(StoreError::NotFound { .. })
    ));
    assert!(!missing.exists());
}

#[tokio::test]
async fn read_only_sees_commits_of_a_live_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut tx = store.transaction();
    tx.put(&vol("a", "CREATED")).unwrap();
    tx.commit().await.unwrap();
    let ro = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(
        ro.get_blocking::<Vol>("a").unwrap(),
        Some(vol("a", "CREATED"))
    );
    let mut tx = store.transaction();
    tx.put(&vol("a", "PUBLISHED")).unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        ro.get_blocking::<Vol>("a").unwrap(),
        Some(vol("a", "PUBLISHED"))
    );
}

#[tokio::test]
async fn inspect_renders_human_and_json() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&vol("v1", "CREATED")).unwrap();
        tx.put(&Update {
            op: "op".into(),
            seq: 0,
            status: "OPERATION_FINISHED".into(),
        })
        .unwrap();
        tx.commit().await.unwrap();
    }
    let human = inspect::render(dir.path(), Format::Human).unwrap();
    assert!(human.contains("format version: 1"), "{human}");
    assert!(human.contains("records: 2, corrupt: 0"), "{human}");
    assert!(
        human.contains("volume (1)") && human.contains(r#"v1  {"id":"v1""#),
        "{human}"
    );
    assert!(human.contains("update (1)"), "{human}");

    let json: serde_json::Value =
        serde_json::from_str(&inspect::render(dir.path(), Format::Json).unwrap()).unwrap();
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["records"]["volume"]["v1"]["state"], "CREATED");
    assert_eq!(
        json["records"]["update"]["op/0000000000"]["status"],
        "OPERATION_FINISHED"
    );
    assert_eq!(json["corrupt"], serde_json::json!([]));
}

/// A full disk surfaces as a typed, fatal error, and poisons the store.
#[tokio::test]
async fn disk_full_is_fatal_and_typed() {
    if !slrp_test_support::require_root("disk_full_is_fatal_and_typed") {
        return;
    }
    let dir = slrp_test_support::Tmpfs::mount("256k");
    let store = Store::open(dir.path()).unwrap();
    let big = "x".repeat(64 * 1024);
    let mut result = Ok(());
    for i in 0..64 {
        let mut tx = store.transaction();
        tx.put(&Vol {
            id: format!("v{i}"),
            state: big.clone(),
            size: 0,
        })
        .unwrap();
        result = tx.commit().await;
        if result.is_err() {
            break;
        }
    }
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Io {
                class: IoClass::DiskFull,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_fatal());
    let mut tx = store.transaction();
    tx.put(&vol("small", "CREATED")).unwrap();
    assert!(matches!(tx.commit().await, Err(StoreError::Poisoned)));
}

#[test]
fn zero_tuning_knobs_are_refused_naming_the_field_and_create_nothing() {
    use slrp_store::StoreConfig;
    for (config, field) in [
        (
            StoreConfig {
                max_batch: 0,
                ..StoreConfig::default()
            },
            "max_batch",
        ),
        (
            StoreConfig {
                queue_depth: 0,
                ..StoreConfig::default()
            },
            "queue_depth",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        match Store::open_with(&state, config) {
            Err(e @ StoreError::Config { field: f, .. }) => {
                assert_eq!(f, field);
                assert!(e.to_string().contains(field), "{e}");
                assert!(!e.is_fatal());
            }
            other => panic!("expected a config error naming {field}, got {other:?}"),
        }
        assert!(
            !state.exists(),
            "a refused config must not create the state directory"
        );
    }
}

/// A submitted transaction is queued before `submit` returns: one committed after it is
/// applied after it, and its `Durable` resolves once it is on disk.
#[tokio::test]
async fn a_submitted_transaction_keeps_the_queue_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut first = store.transaction();
    first.put(&vol("a", "CREATED")).unwrap();
    let durable = first.submit().await.unwrap();
    let mut second = store.transaction();
    second.put(&vol("a", "DELETED")).unwrap();
    second.commit().await.unwrap();
    durable.await.unwrap();
    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let all: Vec<Vol> = store.load_all().await.unwrap();
    assert_eq!(all, vec![vol("a", "DELETED")]);
}
