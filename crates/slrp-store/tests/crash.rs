//! A writer process killed with SIGKILL in the middle of a stream of commits: after reopening,
//! every acknowledged transaction is there and every transaction is all-or-nothing.
//!
//! The child is this test binary itself, re-run with `--exact crash_child --ignored` and the
//! state directory in `SLRP_STORE_CRASH_DIR`.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde::{Deserialize, Serialize};
use slrp_store::{Kind, Record, Store};

const DIR_ENV: &str = "SLRP_STORE_CRASH_DIR";
const WRITERS: u64 = 8;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Part {
    writer: u64,
    seq: u64,
    half: u8,
    /// Padding so that transactions span several pages of the log.
    pad: String,
}

impl Record for Part {
    const KIND: Kind = Kind::new("crash_part");
    fn key(&self) -> String {
        format!("{:02}/{:08}/{}", self.writer, self.seq, self.half)
    }
}

/// Kills the child even when an assertion fails first.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child's body: `WRITERS` tasks commit two-record transactions forever and print
/// `<writer> <seq>` after each commit returned.
#[test]
#[ignore = "run only as the child of sigkill_mid_stream_loses_nothing_acknowledged"]
fn crash_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = Store::open(&dir).unwrap();
        let (out_tx, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        for writer in 0..WRITERS {
            let store = store.clone();
            let out_tx = out_tx.clone();
            tokio::spawn(async move {
                for seq in 0.. {
                    let mut tx = store.transaction();
                    for half in 0..2 {
                        let pad = "p".repeat(1500);
                        tx.put(&Part {
                            writer,
                            seq,
                            half,
                            pad,
                        })
                        .unwrap();
                    }
                    tx.commit().await.unwrap();
                    out_tx.send(format!("{writer} {seq}")).unwrap();
                }
            });
        }
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        while let Some(line) = out_rx.recv().await {
            writeln!(stdout, "{line}").unwrap();
            stdout.flush().unwrap();
        }
    });
}

#[test]
fn sigkill_mid_stream_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let stdout = child.0.stdout.take().unwrap();
        let mut acked = vec![None::<u64>; WRITERS as usize];
        let mut lines = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let mut it = line.split(' ').map(|x| x.parse::<u64>());
            let (Some(Ok(w)), Some(Ok(seq))) = (it.next(), it.next()) else {
                continue;
            };
            acked[w as usize] = Some(seq);
            lines += 1;
            if lines == 300 {
                // SIGKILL: no destructor, no checkpoint, commits in flight.
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.0.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                break;
            }
        }
        drop(child);
        assert_eq!(lines, 300, "round {round}: child stopped early");

        // Reopen: verification of every record runs here.
        let store = Store::open(dir.path()).unwrap();
        let parts: Vec<Part> = store.load_all_blocking().unwrap();
        drop(store);
        for w in 0..WRITERS {
            let mine: Vec<&Part> = parts.iter().filter(|p| p.writer == w).collect();
            assert_eq!(
                mine.len() % 2,
                0,
                "round {round}: writer {w} has half a transaction"
            );
            // Each writer's own sequence restarts at 0 in every round, so keys repeat;
            // halves of the same seq must both be there.
            for pair in mine.chunks(2) {
                assert_eq!(
                    (pair[0].seq, pair[0].half, pair[1].seq, pair[1].half),
                    (pair[0].seq, 0, pair[0].seq, 1)
                );
            }
            let seqs: Vec<u64> = mine.chunks(2).map(|p| p[0].seq).collect();
            // Commits of one writer are sequential: what survived is a prefix 0..=n ...
            assert!(
                seqs.iter().enumerate().all(|(i, s)| *s == i as u64),
                "round {round}: gap for writer {w}"
            );
            // ... and covers everything the child acknowledged before it was killed.
            if let Some(last) = acked[w as usize] {
                assert!(
                    seqs.len() as u64 > last,
                    "round {round}: writer {w} lost acknowledged seq {last}"
                );
            }
        }
    }
}
