//! A fatal store failure is logged with its whole cause chain: the log line of a failed
//! commit names the disk error, not only "commit failed".
//!
//! Its own test binary, because it installs a process-wide tracing subscriber (the
//! writer runs on its own thread, which a thread-local subscriber would not see).

#![allow(clippy::unwrap_used)]

use std::error::Error as _;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use slrp_store::{Kind, Record, Store};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blob {
    id: String,
    data: String,
}

impl Record for Blob {
    const KIND: Kind = Kind::VOLUME;
    fn key(&self) -> String {
        self.id.clone()
    }
}

/// Log output, shared between the subscriber and the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("a test thread panicked while logging")
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_commit_is_logged_with_the_disk_error() {
    if !slrp_test_support::require_root("a_failed_commit_is_logged_with_the_disk_error") {
        return;
    }
    let logs = Captured::default();
    let writer = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .unwrap();

    let dir = slrp_test_support::Tmpfs::mount("256k");
    let store = Store::open(dir.path()).unwrap();
    let data = "x".repeat(64 * 1024);
    let mut failure = None;
    for i in 0..64 {
        let mut tx = store.transaction();
        tx.put(&Blob {
            id: format!("b{i}"),
            data: data.clone(),
        })
        .unwrap();
        if let Err(e) = tx.commit().await {
            failure = Some(e);
            break;
        }
    }
    let err = failure.expect("a 256 KiB tmpfs fills up");
    let cause = err
        .source()
        .expect("an I/O failure has a cause")
        .to_string();
    drop(store);

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("state store commit failed"))
        .unwrap_or_else(|| panic!("no commit failure logged in:\n{text}"));
    assert!(line.contains(&err.to_string()), "{line}");
    assert!(
        line.contains(&format!("{err}: {cause}")),
        "the log line lacks the cause {cause:?}: {line}"
    );
}
