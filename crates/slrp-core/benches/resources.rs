//! Benchmark of the resource algebra on a provider's total. Not a test: it prints a table
//! and asserts nothing (docs/resources.md has the figures).
//!
//! `cargo bench -p slrp-core --bench resources`
//!
//! One step is what a CREATE_DISK followed by a DESTROY_DISK does to the total: a 1 MiB
//! piece of the storage pool becomes a MOUNT disk with a fresh id, then that disk becomes
//! pool space again. The total holds one pool and `n` MOUNT disks (n = 100 and 10,000),
//! so the ratio of the two rows says how the cost of an operation grows with the number
//! of volumes: 1 means flat.
//!
//! - `apply`: `total = total.apply(&conversion)?` (the result is a new total: one clone);
//! - `apply_in_place`: `total.apply_in_place(&conversion)?` (checks, then mutates only the
//!   touched entries);
//! - `apply_in_place + to_vec`: the same plus a copy of the whole total after each
//!   conversion (what publishing the total in the provider's status costs).

#![allow(clippy::unwrap_used, missing_docs, reason = "benchmark binary")]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use tokio::time::Instant;

use slrp_core::provider::resources::{
    Conversion, CreatedKind, CreatedVolume, ProviderResources, Resources,
};
use slrp_proto::mesos::v1::ResourceProviderId;

const MIB: u64 = 1 << 20;
/// Each measurement runs at least this long (and at least `MIN_STEPS` steps).
const MEASURE: Duration = Duration::from_millis(400);
const MIN_STEPS: u32 = 10;

fn context() -> ProviderResources {
    ProviderResources::new(
        ResourceProviderId {
            value: "rp".to_owned(),
        },
        "org.apache.mesos.csi.test",
        "local",
        Vec::new(),
    )
    .unwrap()
}

fn create(ctx: &ProviderResources, id: &str) -> Conversion {
    let context = BTreeMap::new();
    ctx.created_disk(
        &ctx.raw_disk(MIB, Some("fast"), None, None),
        &CreatedVolume {
            id,
            context: &context,
            profile: "fast",
        },
        CreatedKind::Mount,
    )
}

/// One pool (big enough for every disk) and `n` MOUNT disks.
fn total(ctx: &ProviderResources, n: usize) -> Resources {
    let mut total = Resources::from(ctx.raw_disk(1 << 50, Some("fast"), None, None));
    for i in 0..n {
        total = total.apply(&create(ctx, &format!("vol-{i:08}"))).unwrap();
    }
    total
}

/// The create and destroy conversions of step `i`.
fn step(ctx: &ProviderResources, i: u32) -> [Conversion; 2] {
    let created = create(ctx, &format!("new-{i:08}"));
    let disk = created.converted.iter().next().unwrap().clone();
    let destroyed = ctx.destroyed_disk(&disk, true, |_| true).conversion;
    [created, destroyed]
}

/// Mean time of one step (two conversions), the conversions built outside the clock.
fn measure(
    ctx: &ProviderResources,
    n: usize,
    apply: impl Fn(&mut Resources, &Conversion),
) -> Duration {
    let mut total = total(ctx, n);
    let mut spent = Duration::ZERO;
    let mut steps = 0;
    while spent < MEASURE || steps < MIN_STEPS {
        let conversions = step(ctx, steps);
        let start = Instant::now();
        for conversion in &conversions {
            apply(&mut total, conversion);
        }
        spent += start.elapsed();
        steps += 1;
    }
    assert_eq!(total.len(), n + 1, "every step gives the disk back");
    black_box(&total);
    spent / steps
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let ctx = context();
    type Way = (&'static str, fn(&mut Resources, &Conversion));
    let ways: [Way; 3] = [
        ("apply", |total, c| *total = total.apply(c).unwrap()),
        ("apply_in_place", |total, c| {
            total.apply_in_place(c).unwrap()
        }),
        // What publishing the whole total after each operation adds (a copy per step).
        ("apply_in_place + to_vec", |total, c| {
            total.apply_in_place(c).unwrap();
            black_box(total.to_vec());
        }),
    ];
    println!("| method | 100 volumes (µs/step) | 10,000 volumes (µs/step) | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, way) in ways {
        let small = measure(&ctx, 100, way);
        let large = measure(&ctx, 10_000, way);
        println!(
            "| `{name}` | {} | {} | {:.1} |",
            micros(small),
            micros(large),
            large.as_secs_f64() / small.as_secs_f64()
        );
    }
}
