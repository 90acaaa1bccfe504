//! Benchmark of the volume manager with the in-memory fake plugin and the real store.
//! Not a test: it prints figures and asserts nothing (docs/volume-manager.md has them).
//!
//! `cargo bench -p slrp-core --bench manager_bench -- [--dir DIR]`
//!
//! 1. Cost of one durable volume state change with 100, 10 000 and 100 000 volumes
//!    tracked: publish/unpublish cycles on random volumes, one at a time; every cycle is
//!    11 commits (full capabilities: ControllerPublish, NodeStage, NodePublish and back),
//!    so per-change cost = cycle time / commits. Also the start (recovery) time.
//! 2. Throughput of publish/unpublish cycles with 1 and with 64 volumes at once
//!    (10 000 tracked), with the store's group-commit factor.
//!
//! DIR must be on the disk under test (default: the system temp dir; not a tmpfs).

#![allow(clippy::unwrap_used, missing_docs, reason = "benchmark binary")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_core::volume::*;
use slrp_store::Store;
use slrp_test_support::fake_csi::{FakeCsi, FakeMounts, FakeVolume};
use slrp_test_support::harness::mount_cap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Setup {
    _dir: tempfile::TempDir,
    store: Store,
    handle: VolumeManagerHandle,
    guard: VolumeManagerGuard,
    ids: Vec<VolumeId>,
    start: Duration,
}

fn id(i: usize) -> VolumeId {
    VolumeId::new(format!("vol-{i:08}"))
}

async fn setup(base: &PathBuf, n: usize, max_concurrent: usize) -> Setup {
    let dir = tempfile::tempdir_in(base).unwrap();
    let fake = FakeCsi::full();
    let ids: Vec<VolumeId> = (0..n).map(id).collect();
    {
        let mut st = fake.st();
        for v in &ids {
            st.volumes.insert(v.clone(), FakeVolume::default());
        }
        st.created = n;
    }
    let state = dir.path().join("state");
    {
        let store = Store::open(&state).unwrap();
        for chunk in ids.chunks(10_000) {
            let mut tx = store.transaction();
            for v in chunk {
                let mut rec = VolumeRecord::created(
                    v.clone(),
                    Some(format!("name-{v}")),
                    VolumeSpec {
                        capability: mount_cap(),
                        parameters: [("pool".to_owned(), "default".to_owned())].into(),
                        volume_context: [("name".to_owned(), v.to_string())].into(),
                        readonly: false,
                        pre_provisioned: false,
                        node_stage_secrets: Default::default(),
                        node_publish_secrets: Default::default(),
                        untrack_on_unstage: false,
                    },
                );
                rec.capacity_bytes = 1 << 30;
                tx.put(&rec).unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
    let paths = MountPaths::under_work_dir(&dir.path().join("work"), "org.bench", "fake").unwrap();
    let cfg = VolumeManagerConfig::new(
        paths,
        "node-1",
        fake.caps,
        BootId::new("boot-1"),
        TargetPath::PluginCreates,
    )
    .max_concurrent(max_concurrent)
    .mounts(Arc::new(FakeMounts(fake.clone())));
    let t0 = Instant::now();
    let store = Store::open(&state).unwrap();
    let (handle, guard) =
        VolumeManager::spawn(cfg, store.clone(), fake, &CancellationToken::new()).unwrap();
    handle.ready().await.unwrap();
    let start = t0.elapsed();
    Setup {
        _dir: dir,
        store,
        handle,
        guard,
        ids,
        start,
    }
}

impl Setup {
    async fn finish(self) {
        self.guard.stop().await.unwrap();
    }
}

/// A cheap deterministic generator, so runs pick the same volumes.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }
}

async fn cycle(h: &VolumeManagerHandle, v: &VolumeId) {
    h.publish(v).await.unwrap();
    h.unpublish(v).await.unwrap();
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn cost(base: &PathBuf) {
    println!("## Cost of one durable state change (sequential publish/unpublish cycles)\n");
    println!(
        "| volumes tracked | start (recovery) | per cycle mean / p50 / p99 µs | commits per cycle | per change µs |"
    );
    println!("|---:|---:|---|---:|---:|");
    for n in [100, 10_000, 100_000] {
        let s = setup(base, n, 16).await;
        let mut rng = Lcg(42);
        // Warm-up: create the mount directories and page the B-tree in.
        for _ in 0..20 {
            cycle(&s.handle, &s.ids[rng.next(n)]).await;
        }
        let cycles = 300;
        let before = s.store.stats();
        let mut lat = Vec::with_capacity(cycles);
        let t0 = Instant::now();
        for _ in 0..cycles {
            let v = &s.ids[rng.next(n)];
            let t = Instant::now();
            cycle(&s.handle, v).await;
            lat.push(t.elapsed());
        }
        let total = t0.elapsed();
        let commits = s.store.stats().commits - before.commits;
        lat.sort();
        let per_cycle = total / cycles as u32;
        let per_commit = total / commits as u32;
        println!(
            "| {n} | {:.0} ms | {:.0} / {:.0} / {:.0} | {:.1} | {:.0} |",
            s.start.as_secs_f64() * 1e3,
            us(per_cycle),
            us(lat[cycles / 2]),
            us(lat[cycles * 99 / 100]),
            commits as f64 / cycles as f64,
            us(per_commit),
        );
        s.finish().await;
    }
    println!();
}

async fn throughput(base: &PathBuf) {
    println!("## Throughput of publish/unpublish cycles (10 000 volumes tracked)\n");
    println!("| volumes at once | cycles/s | durable changes/s | commits per sync |");
    println!("|---:|---:|---:|---:|");
    for concurrent in [1usize, 64] {
        let s = setup(base, 10_000, 64).await;
        let per_worker = if concurrent == 1 { 300 } else { 20 };
        let before = s.store.stats();
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for w in 0..concurrent {
            let h = s.handle.clone();
            let v = s.ids[w * 97 % s.ids.len()].clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_worker {
                    cycle(&h, &v).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let total = t0.elapsed().as_secs_f64();
        let after = s.store.stats();
        let commits = after.commits - before.commits;
        let syncs = after.syncs - before.syncs;
        let cycles = concurrent * per_worker;
        println!(
            "| {concurrent} | {:.0} | {:.0} | {:.1} |",
            cycles as f64 / total,
            commits as f64 / total,
            commits as f64 / syncs.max(1) as f64,
        );
        s.finish().await;
    }
    println!();
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut base = std::env::temp_dir();
    while let Some(a) = args.next() {
        if a == "--dir" {
            base = PathBuf::from(args.next().expect("--dir DIR"));
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        cost(&base).await;
        throughput(&base).await;
    });
}
