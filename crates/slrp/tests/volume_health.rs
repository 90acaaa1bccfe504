//! Volume usage and health (issue #22, "Must show") with `slrp standalone` and the
//! bundled plugin, polled every 500 ms: a published MOUNT volume filled with data shows its
//! use in `slrp ctl volumes` (table and `--json`) and in `/metrics`; a dir volume whose
//! directory is removed and a loop volume whose image is removed become abnormal with the
//! plugin's reason (`ctl`, metrics, one log line per change), and normal again once
//! repaired. The plugins without the capabilities and the hanging plugin are in
//! `hostile_plugin.rs`.
//!
//! Root is needed (standalone refuses to run without it). Every wait is bounded
//! ([`e2e_support::WAIT`]); no assertion is about how fast anything is.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod e2e_support;
mod support;

use std::path::{Path, PathBuf};

use e2e_support::{PROVIDER, Standalone, create_disk};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A READY standalone daemon whose poller asks every 500 ms, or `None` without root.
async fn daemon() -> Option<Standalone> {
    if !e2e_support::require_root() {
        return None;
    }
    let mut d = Standalone::new();
    std::fs::write(
        d.path("slrp.toml"),
        "[volume_health]\ninterval = \"500ms\"\n",
    )
    .unwrap();
    d.extra_args = vec!["--config".into(), d.path("slrp.toml").display().to_string()];
    d.start_ready().await;
    Some(d)
}

/// `ctl --json volumes ID` once `want` holds of it.
async fn volume_until(
    d: &Standalone,
    id: &str,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    d.ctl_json_until(&["volumes", id], what, want).await
}

/// The `slrp_volume_stats_*` sample `family` of volume `id`, if any.
async fn stat(d: &Standalone, family: &str, id: &str) -> Option<(f64, String)> {
    let answer = d.http("GET", "/metrics", &[], None).await;
    e2e_support::parse_openmetrics(&answer.body)
        .into_iter()
        .find(|(name, labels, _)| {
            name == family && labels.get("volume_id").map(String::as_str) == Some(id)
        })
        .map(|(_, labels, v)| {
            assert_eq!(labels["provider"], PROVIDER, "{labels:?}");
            (v, labels["profile"].clone())
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_mount_volume_filled_with_data_shows_its_use_in_ctl_and_metrics() {
    let Some(d) = daemon().await else {
        return;
    };
    let id = create_disk(&d, "mount", &[]).await;
    let out = d.ctl_ok(&["publish", &id]).await;
    let path = PathBuf::from(out.last_line());
    // 16 MiB of data, synced, in the published directory.
    let data = vec![0x5a_u8; usize::try_from(16 * MIB).unwrap()];
    let file = path.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();

    let v = volume_until(&d, &id, "16 MiB used in the health sample", |v| {
        v["health"]["usage"]["bytes"]["used"]
            .as_u64()
            .is_some_and(|u| u >= 16 * MIB)
    })
    .await;
    let h = &v["health"];
    assert_eq!(h["status"], "ok", "{v:#}");
    assert_eq!(h["source"], "NodeGetVolumeStats", "{v:#}");
    assert!(
        h["sampled_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v:#}"
    );
    assert!(h["age_seconds"].as_f64().is_some(), "{v:#}");
    let total = h["usage"]["bytes"]["total"].as_u64().unwrap();
    assert!(total >= 64 * MIB, "{v:#}");
    assert!(h["usage"]["inodes"]["used"].as_u64().is_some(), "{v:#}");

    // The table: USED (bytes and share) and HEALTH, appended after the existing columns.
    let table = d.ctl_ok(&["volumes"]).await;
    let header = table.stdout.lines().next().unwrap();
    // Added after the existing columns, which keep their order.
    let columns: Vec<&str> = header
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        columns[6..],
        ["LAST ERROR", "USED", "HEALTH"],
        "{}",
        table.describe()
    );
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{}", table.describe()));
    assert!(row.ends_with(" ok"), "{row:?}");
    assert!(row.contains("MiB (") && row.contains("%)"), "{row:?}");
    let detail = d.ctl_ok(&["volumes", &id]).await;
    for line in ["health:", "used:", "bytes:", "inodes:", "sampled:"] {
        assert!(
            detail.stdout.lines().any(|l| l.starts_with(line)),
            "{line} missing: {}",
            detail.describe()
        );
    }

    // The metrics: used bytes with the provider, the volume and its profile.
    let (used, profile) = stat(&d, "slrp_volume_stats_used_bytes", &id).await.unwrap();
    assert!(used >= (16 * MIB) as f64, "{used}");
    assert_eq!(profile, "mount");
    let (capacity, _) = stat(&d, "slrp_volume_stats_capacity_bytes", &id)
        .await
        .unwrap();
    assert!(capacity >= used);
    let (abnormal, _) = stat(&d, "slrp_volume_stats_health_status_abnormal", &id)
        .await
        .unwrap();
    assert_eq!(abnormal, 0.0);
    // Nothing per volume in Mesos's snapshot.
    let snapshot = d.http("GET", "/metrics/snapshot", &[], None).await;
    assert!(!snapshot.body.contains(&id), "{}", snapshot.body);

    // Unpublished and destroyed: no usage any more, then no series at all.
    d.ctl_ok(&["unpublish", &id]).await;
    volume_until(&d, &id, "no usage once unpublished", |v| {
        v["health"]["usage"].is_null()
    })
    .await;
    let op = d.ctl_json(&["destroy-disk", &id, "--wait"]).await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op:#}");
    d.within("the destroyed volume's series to go", async {
        while stat(&d, "slrp_volume_stats_health_status_abnormal", &id)
            .await
            .is_some()
        {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// Moves `path` aside (a rename in the same directory) and returns where it went.
fn remove(path: &Path) -> PathBuf {
    let aside = path.with_extension("removed-by-test");
    std::fs::rename(path, &aside)
        .unwrap_or_else(|e| panic!("moving {} aside: {e}", path.display()));
    aside
}

/// Waits until volume `id` is `status` in `ctl --json volumes ID`; returns its health.
async fn health_until(d: &Standalone, id: &str, status: &str) -> Value {
    let v = volume_until(d, id, &format!("volume {id} {status}"), |v| {
        v["health"]["status"] == status
    })
    .await;
    v["health"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_directory_or_loop_image_is_abnormal_with_the_reason_until_repaired() {
    let Some(d) = daemon().await else {
        return;
    };
    let root = d.state_dir().join("csi-local").join("volumes");
    let dir_id = create_disk(&d, "mount", &[]).await;
    let loop_id = create_disk(&d, "ext4", &[]).await;
    let cases = [
        (dir_id.clone(), root.join("dir").join(&dir_id), "directory"),
        (
            loop_id.clone(),
            root.join("loop").join(format!("{loop_id}.img")),
            "image",
        ),
    ];
    for (id, backing, what) in &cases {
        assert!(
            backing.exists(),
            "{} is not where the plugin keeps it",
            backing.display()
        );
        let ok = health_until(&d, id, "ok").await;
        assert_eq!(ok["source"], "ControllerGetVolume", "{ok:#}");

        let aside = remove(backing);
        let bad = health_until(&d, id, "abnormal").await;
        let message = bad["message"].as_str().unwrap();
        assert!(
            message.starts_with(what)
                && message.contains(&backing.display().to_string())
                && message.ends_with("is missing"),
            "{bad:#}"
        );
        let table = d.ctl_ok(&["volumes"]).await;
        let row = table
            .stdout
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap();
        assert!(row.ends_with(" abnormal"), "{row:?}");
        let (gauge, _) = stat(&d, "slrp_volume_stats_health_status_abnormal", id)
            .await
            .unwrap();
        assert_eq!(gauge, 1.0);
        let detail = d.ctl_ok(&["volumes", id]).await;
        assert!(detail.stdout.contains(message), "{}", detail.describe());

        std::fs::rename(&aside, backing).unwrap();
        let repaired = health_until(&d, id, "ok").await;
        assert_eq!(repaired["message"], "ok", "{repaired:#}");
        let (gauge, _) = stat(&d, "slrp_volume_stats_health_status_abnormal", id)
            .await
            .unwrap();
        assert_eq!(gauge, 0.0);
    }
    // One line per change, with the plugin's message: each volume went abnormal once
    // and back once, however many polls saw it abnormal meanwhile.
    let log = d.log();
    for (id, _, what) in &cases {
        let lines = |needle: &str| {
            log.lines()
                .filter(|l| l.contains(needle) && l.contains(id.as_str()))
                .collect::<Vec<_>>()
        };
        let abnormal = lines("the plugin reports the volume abnormal");
        assert_eq!(abnormal.len(), 1, "{abnormal:#?}");
        assert!(abnormal[0].contains(what), "{abnormal:#?}");
        assert_eq!(lines("the plugin reports the volume normal again").len(), 1);
    }
}
