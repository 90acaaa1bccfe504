//! Benchmark behind the state store decision (docs/state-store.md). Not a test: it prints
//! figures and asserts nothing.
//!
//! `cargo bench -p slrp-store --bench store_bench -- [--dir DIR] [--only cost|group]`
//!
//! 1. Cost of one durable change with 100, 10 000 and 100 000 records tracked, for
//!    - this store (SQLite, WAL, synchronous=FULL),
//!    - a file per record (temp file, fsync, rename, fsync directory: Mesos's volume.state),
//!    - one file holding every record, rewritten per change (Mesos's resource_provider.state).
//! 2. Throughput of durable commits with 1 and with 64 concurrent writers.
//!
//! DIR must be on the disk under test (default: the system temp dir; not a tmpfs).

#![allow(clippy::unwrap_used, missing_docs, reason = "benchmark binary")]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use slrp_store::{Kind, Record, Store};
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Vol {
    id: String,
    state: String,
    boot_id: String,
    capability: String,
    parameters: std::collections::BTreeMap<String, String>,
}

impl Record for Vol {
    const KIND: Kind = Kind::VOLUME;
    fn key(&self) -> String {
        self.id.clone()
    }
}

fn vol(i: usize, state: &str) -> Vol {
    Vol {
        id: format!("vol-{i:08}"),
        state: state.to_owned(),
        boot_id: "0f4c3a6e-2d1b-4c55-9a7e-3e1f0b2c9d88".to_owned(),
        capability: "mount/ext4/SINGLE_NODE_WRITER".to_owned(),
        parameters: [
            ("pool".to_owned(), "default".to_owned()),
            ("backend".to_owned(), "dir".to_owned()),
        ]
        .into_iter()
        .collect(),
    }
}

/// A cheap deterministic generator, so runs pick the same records.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

struct Summary {
    mean: Duration,
    p50: Duration,
    p99: Duration,
}

fn summarize(mut v: Vec<Duration>) -> Summary {
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    Summary {
        mean,
        p50: v[v.len() / 2],
        p99: v[(v.len() * 99 / 100).min(v.len() - 1)],
    }
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn sqlite_cost(root: &Path, n: usize, iters: usize) -> Summary {
    let dir = root.join(format!("sqlite-{n}"));
    let store = Store::open(&dir).unwrap();
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let mut tx = store.transaction();
        for &i in chunk {
            tx.put(&vol(i, "CREATED")).unwrap();
        }
        tx.commit_blocking().unwrap();
    }
    let mut rng = Lcg(n as u64);
    let mut samples = Vec::with_capacity(iters);
    for k in 0..iters {
        let mut tx = store.transaction();
        tx.put(&vol(
            rng.next(n),
            if k % 2 == 0 {
                "NODE_STAGE"
            } else {
                "VOL_READY"
            },
        ))
        .unwrap();
        let t = Instant::now();
        tx.commit_blocking().unwrap();
        samples.push(t.elapsed());
    }
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
    summarize(samples)
}

fn sync_dir(dir: &Path) {
    File::open(dir).unwrap().sync_all().unwrap();
}

/// Write `bytes` to `path` crash-safely: temp file in the same directory, fsync, rename,
/// fsync the directory.
fn atomic_replace(path: &Path, bytes: &[u8]) {
    let dir = path.parent().unwrap();
    let tmp = dir.join(format!(
        ".tmp-{}",
        path.file_name().unwrap().to_string_lossy()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    std::fs::rename(&tmp, path).unwrap();
    sync_dir(dir);
}

fn files_cost(root: &Path, n: usize, iters: usize) -> Summary {
    let dir = root.join(format!("files-{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        let v = vol(i, "CREATED");
        std::fs::write(dir.join(&v.id), serde_json::to_vec(&v).unwrap()).unwrap();
    }
    nix::unistd::sync();
    let mut rng = Lcg(n as u64);
    let mut samples = Vec::with_capacity(iters);
    for k in 0..iters {
        let v = vol(
            rng.next(n),
            if k % 2 == 0 {
                "NODE_STAGE"
            } else {
                "VOL_READY"
            },
        );
        let bytes = serde_json::to_vec(&v).unwrap();
        let t = Instant::now();
        atomic_replace(&dir.join(&v.id), &bytes);
        samples.push(t.elapsed());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    summarize(samples)
}

fn whole_file_cost(root: &Path, n: usize, iters: usize) -> Summary {
    let dir = root.join(format!("whole-{n}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut all: Vec<Vol> = (0..n).map(|i| vol(i, "CREATED")).collect();
    let mut rng = Lcg(n as u64);
    let mut samples = Vec::with_capacity(iters);
    for k in 0..iters {
        let i = rng.next(n);
        all[i].state = if k % 2 == 0 {
            "NODE_STAGE"
        } else {
            "VOL_READY"
        }
        .to_owned();
        let t = Instant::now();
        // Serialising is part of the cost: Mesos re-serialises the whole state each time.
        let bytes = serde_json::to_vec(&all).unwrap();
        atomic_replace(&dir.join("resource_provider.state"), &bytes);
        samples.push(t.elapsed());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    summarize(samples)
}

fn group_commit(root: &Path, writers: usize, total: usize) -> (f64, u64, u64) {
    let dir = root.join(format!("group-{writers}"));
    let store = Store::open(&dir).unwrap();
    let mut tx = store.transaction();
    for i in 0..10_000 {
        tx.put(&vol(i, "CREATED")).unwrap();
    }
    tx.commit_blocking().unwrap();
    let before = store.stats();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let per = total / writers;
    let t = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..writers {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0..per {
                    let mut tx = store.transaction();
                    tx.put(&vol((w * per + k) % 10_000, "PUBLISHED")).unwrap();
                    tx.commit().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let after = store.stats();
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
    (
        (per * writers) as f64 / secs,
        after.commits - before.commits,
        after.syncs - before.syncs,
    )
}

fn files_concurrent(root: &Path, writers: usize, total: usize) -> f64 {
    let dir = root.join(format!("files-conc-{writers}"));
    std::fs::create_dir_all(&dir).unwrap();
    let per = total / writers;
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let dir = &dir;
            s.spawn(move || {
                for k in 0..per {
                    let v = vol(w * per + k, "PUBLISHED");
                    atomic_replace(&dir.join(&v.id), &serde_json::to_vec(&v).unwrap());
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).unwrap();
    (per * writers) as f64 / secs
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let base = arg("--dir")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let only = arg("--only");
    let root = tempfile::Builder::new()
        .prefix("slrp-store-bench-")
        .tempdir_in(&base)
        .unwrap();
    println!("# slrp-store benchmark in {}", root.path().display());

    if only.as_deref().is_none_or(|o| o == "cost") {
        println!("\n## One durable change (µs): mean / p50 / p99\n");
        println!("| records tracked | SQLite store | file per record | whole-state file |");
        println!("|---:|---|---|---|");
        for n in [100, 10_000, 100_000] {
            let s = sqlite_cost(root.path(), n, 500);
            let f = files_cost(root.path(), n, 500);
            let w = whole_file_cost(root.path(), n, if n >= 100_000 { 10 } else { 100 });
            let fmt = |s: &Summary| format!("{} / {} / {}", us(s.mean), us(s.p50), us(s.p99));
            println!("| {n} | {} | {} | {} |", fmt(&s), fmt(&f), fmt(&w));
        }
    }
    if only.as_deref().is_none_or(|o| o == "group") {
        println!("\n## Throughput of durable commits (10 000 records tracked)\n");
        println!(
            "| writers | SQLite commits/s | SQLite syncs for commits | file-per-record commits/s |"
        );
        println!("|---:|---:|---|---:|");
        for (writers, total) in [(1, 2000), (64, 12_800)] {
            let (rate, commits, syncs) = group_commit(root.path(), writers, total);
            let frate = files_concurrent(root.path(), writers, total.min(6400));
            println!("| {writers} | {rate:.0} | {syncs} for {commits} | {frate:.0} |");
        }
    }
}
