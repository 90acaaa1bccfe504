//! `slrp standalone` as a user runs it (issue #12, "Must show"): the real binaries, the
//! FIXED defaults (one provider `local`, profiles `mount` and `block`), and `slrp ctl` for
//! everything: create a disk, publish it, write through it, `kill -9` the daemon, start it
//! again, find the data and the state intact, unpublish, destroy, see the pool's capacity
//! restored, read the metrics in both formats.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod e2e_support;
mod support;

use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};

use e2e_support::{PROVIDER, Standalone, create_disk, disk, is_mount_point, pool_mb, volume};
use serde_json::Value;

/// `ctl publish ID`: exit 0, the path on its last line (absolute, under the state dir's
/// `work/csi/`).
async fn publish(d: &Standalone, id: &str) -> PathBuf {
    let out = d.ctl_ok(&["publish", id]).await;
    let path = PathBuf::from(out.last_line());
    let csi = d.state_dir().join("work").join("csi");
    assert!(
        path.is_absolute() && path.starts_with(&csi),
        "the last line of publish is not a path under {}: {}",
        csi.display(),
        out.describe()
    );
    path
}

/// Waits until `resources --json` offers the pool of `profile` (its profile reaches the
/// provider from the profile adaptor, possibly after READY, and the pool with the
/// reconciliation that follows); returns the resources.
async fn pool_offered(d: &Standalone, profile: &str) -> Value {
    d.ctl_json_until(
        &["resources"],
        &format!("the {profile} pool in the resources"),
        |r| pool_mb(r, profile).is_some(),
    )
    .await
}

/// Waits until `resources --json` lists the disk `id` (the provider's total reaches the
/// admin API a little after the operation's status); returns it.
async fn disk_listed(d: &Standalone, id: &str) -> Value {
    let r = d
        .ctl_json_until(
            &["resources"],
            &format!("disk {id} in the resources"),
            |r| disk(r, id).is_some(),
        )
        .await;
    disk(&r, id).unwrap().clone()
}

/// Waits until the pool of `profile` is `mb` again (the total reaches the admin API a
/// little after the operation's status).
async fn pool_restored(d: &Standalone, profile: &str, mb: f64) {
    d.ctl_json_until(
        &["resources"],
        &format!("the {profile} pool back at {mb} MB"),
        |r| pool_mb(r, profile) == Some(mb),
    )
    .await;
}

/// `ctl destroy-disk ID --wait`: exit 0; then the volume is gone from `ctl volumes`.
async fn destroy_disk(d: &Standalone, id: &str) {
    let op = d.ctl_json(&["destroy-disk", id, "--wait"]).await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op:#}");
    assert_eq!(op["type"], "DESTROY_DISK", "{op:#}");
    let volumes = d.ctl_json(&["volumes"]).await;
    assert!(
        volume(&volumes, id).is_none(),
        "{id} still listed: {volumes:#}"
    );
}

/// `/metrics` over the admin socket: OpenMetrics, `# EOF` last, and the provider's
/// operations counter of `kind` at least 1; the manager's subscription gauge is 1.
async fn openmetrics_count(d: &Standalone, kind: &str) {
    let answer = d.http("GET", "/metrics", &[], None).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let content_type = answer
        .headers
        .get("content-type")
        .cloned()
        .unwrap_or_default();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "content type {content_type:?}"
    );
    let samples = e2e_support::parse_openmetrics(&answer.body);
    let finished = samples
        .iter()
        .find(|(name, labels, _)| {
            name.contains("operations_finished")
                && labels.get("type").map(String::as_str) == Some(kind)
                && labels
                    .values()
                    .any(|v| v == PROVIDER || v.ends_with(".local"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no operations_finished sample of type {kind} for {PROVIDER}:\n{}",
                answer.body
            )
        });
    assert!(finished.2 >= 1.0, "{finished:?}\n{}", answer.body);
    let subscribed = samples
        .iter()
        .find(|(name, _, _)| name == "resource_provider_manager_subscribed")
        .unwrap_or_else(|| panic!("no resource_provider_manager_subscribed:\n{}", answer.body));
    assert!((subscribed.2 - 1.0).abs() < f64::EPSILON, "{subscribed:?}");
}

/// `/metrics/snapshot` over the admin socket: Mesos's names (spec §9), the manager's
/// `resource_provider_manager/subscribed` 1 and the provider's `operations/<kind>/finished`
/// at least 1.
async fn snapshot_count(d: &Standalone, kind: &str) {
    let answer = d.http("GET", "/metrics/snapshot", &[], None).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let snap = answer.json();
    assert!(snap.is_object(), "not a JSON object: {}", answer.body);
    assert_eq!(
        snap["resource_provider_manager/subscribed"].as_f64(),
        Some(1.0),
        "{snap:#}"
    );
    assert!(
        snap["resource_provider_manager/events/subscribe"]
            .as_f64()
            .is_some_and(|v| v >= 1.0),
        "{snap:#}"
    );
    let key = format!("resource_providers/{PROVIDER}/operations/{kind}/finished");
    assert!(
        snap[&key].as_f64().is_some_and(|v| v >= 1.0),
        "{key} missing or 0: {snap:#}"
    );
    let rpcs = format!("resource_providers/{PROVIDER}/csi_plugin/rpcs_finished");
    assert!(
        snap[&rpcs].as_f64().is_some_and(|v| v >= 1.0),
        "{rpcs} missing or 0: {snap:#}"
    );
}

/// `ctl volumes`: the human table lists the volume with `state`; `--json` says the same.
async fn volume_state(d: &Standalone, id: &str, state: &str) -> Value {
    let table = d.ctl_ok(&["volumes"]).await;
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.contains(id) && l.contains(state)),
        "no line with {id} and {state}: {}",
        table.describe()
    );
    let volumes = d.ctl_json(&["volumes"]).await;
    let v = volume(&volumes, id)
        .unwrap_or_else(|| d.fail(&format!("{id} not in volumes --json: {volumes:#}")))
        .clone();
    assert_eq!(v["state"], state, "{v:#}");
    v
}

/// `ctl unpublish ID` (exit 0), then `ctl volumes` shows the state it answered with, no
/// longer PUBLISHED and without a target path.
async fn unpublish(d: &Standalone, id: &str) {
    let changed = d.ctl_json(&["unpublish", id]).await;
    assert_eq!(changed["volume_id"], id, "{changed:#}");
    let state = changed["state"].as_str().unwrap_or_default().to_owned();
    assert!(!state.is_empty() && state != "PUBLISHED", "{changed:#}");
    let v = volume_state(d, id, &state).await;
    assert!(v["target_path"].is_null(), "{v:#}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[tokio::test]
async fn mount_disk_survives_kill_9_and_is_destroyed_with_its_pool_restored() {
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let status = d.ctl_json(&["status"]).await;
    assert_eq!(status["mode"], "standalone", "{status:#}");
    let provider_id = status["providers"][0]["resource_provider_id"].clone();
    assert!(provider_id.is_string(), "{status:#}");
    assert_eq!(status["providers"][0]["provider"], PROVIDER, "{status:#}");

    let before = pool_offered(&d, "mount").await;
    let pool_before = pool_mb(&before, "mount")
        .unwrap_or_else(|| d.fail(&format!("no mount pool in {before:#}")));
    assert!(pool_before >= 64.0, "{before:#}");

    let id = create_disk(&d, "mount", &[]).await;
    let disk_before = disk_listed(&d, &id).await;
    assert_eq!(
        e2e_support::source(&disk_before)["type"],
        "MOUNT",
        "{disk_before:#}"
    );
    assert_eq!(
        e2e_support::source(&disk_before)["profile"],
        "mount",
        "{disk_before:#}"
    );
    assert_eq!(
        disk_before["scalar"]["value"].as_f64(),
        Some(64.0),
        "{disk_before:#}"
    );

    let path = publish(&d, &id).await;
    assert!(is_mount_point(&path), "{} is not mounted", path.display());
    let file = path.join("hello.txt");
    std::fs::write(&file, "written through the mount\n").unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    volume_state(&d, &id, "PUBLISHED").await;
    // Counters of the operations so far: a restart starts them again from what the
    // provider still tracks (spec §9), and the create is acknowledged by then.
    openmetrics_count(&d, "create_disk").await;
    snapshot_count(&d, "create_disk").await;

    d.kill9().await;
    d.start_ready().await;

    assert_eq!(read(&file), "written through the mount\n");
    let v = volume_state(&d, &id, "PUBLISHED").await;
    assert_eq!(
        v["target_path"].as_str(),
        Some(path.to_str().unwrap()),
        "{v:#}"
    );
    let status = d.ctl_json(&["status"]).await;
    assert_eq!(
        status["providers"][0]["resource_provider_id"], provider_id,
        "the provider id changed across the crash: {status:#}"
    );
    let after = disk_listed(&d, &id).await;
    assert_eq!(
        after, disk_before,
        "the disk changed across the crash: {after:#}"
    );

    unpublish(&d, &id).await;
    assert!(!is_mount_point(&path), "{} still mounted", path.display());
    assert!(!file.exists(), "the file is visible without the mount");

    destroy_disk(&d, &id).await;
    pool_restored(&d, "mount", pool_before).await;
    assert!(
        support::mounts_under(d.dir.path()).is_empty(),
        "mounts left after the destroy: {:?}",
        support::mounts_under(d.dir.path())
    );

    openmetrics_count(&d, "destroy_disk").await;
    snapshot_count(&d, "destroy_disk").await;
    d.stop_cleanly().await;
}

#[tokio::test]
async fn block_disk_device_appears_on_publish_and_goes_on_unpublish() {
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let before = pool_offered(&d, "block").await;
    let pool_before = pool_mb(&before, "block")
        .unwrap_or_else(|| d.fail(&format!("no block pool in {before:#}")));

    let id = create_disk(&d, "block", &["--type", "block"]).await;
    let disk = disk_listed(&d, &id).await;
    assert_eq!(e2e_support::source(&disk)["type"], "BLOCK", "{disk:#}");
    assert_eq!(e2e_support::source(&disk)["profile"], "block", "{disk:#}");

    let path = publish(&d, &id).await;
    let meta = std::fs::metadata(&path)
        .unwrap_or_else(|e| d.fail(&format!("nothing at {}: {e}", path.display())));
    assert!(
        meta.file_type().is_block_device(),
        "{} is not a block device: {:?}",
        path.display(),
        meta.file_type()
    );
    // The device is the disk: 64 MiB, writable.
    let mut dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let size = std::io::Seek::seek(&mut dev, std::io::SeekFrom::End(0)).unwrap();
    assert_eq!(size, 64 << 20, "device size");
    std::io::Seek::seek(&mut dev, std::io::SeekFrom::Start(0)).unwrap();
    std::io::Write::write_all(&mut dev, &[0x5a; 4096]).unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    volume_state(&d, &id, "PUBLISHED").await;

    unpublish(&d, &id).await;
    let gone = std::fs::metadata(&path)
        .map(|m| !m.file_type().is_block_device())
        .unwrap_or(true);
    assert!(gone, "a block device is still at {}", path.display());

    destroy_disk(&d, &id).await;
    pool_restored(&d, "block", pool_before).await;
    snapshot_count(&d, "destroy_disk").await;
    d.stop_cleanly().await;
}

/// The file system type of the mount at `path` (from `/proc/self/mountinfo`).
fn fs_type(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (left.split(' ').nth(4) == path.to_str())
            .then(|| right.split(' ').next().map(str::to_owned))
            .flatten()
    })
}

#[tokio::test]
async fn ext4_disk_is_an_ext4_mount_that_keeps_its_file_across_publishes() {
    if !slrp_test_support::require_tool(&slrp_test_support::current_test(), "mkfs.ext4") {
        return;
    }
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let id = create_disk(&d, "ext4", &[]).await;
    let listed = disk_listed(&d, &id).await;
    assert_eq!(e2e_support::source(&listed)["type"], "MOUNT", "{listed:#}");

    let path = publish(&d, &id).await;
    assert_eq!(
        fs_type(&path).as_deref(),
        Some("ext4"),
        "{}",
        path.display()
    );
    std::fs::write(path.join("kept.txt"), "on ext4\n").unwrap();
    std::fs::File::open(path.join("kept.txt"))
        .unwrap()
        .sync_all()
        .unwrap();
    unpublish(&d, &id).await;
    assert!(!is_mount_point(&path), "{} still mounted", path.display());

    // Published again, the same file system with the file.
    let again = publish(&d, &id).await;
    assert_eq!(read(&again.join("kept.txt")), "on ext4\n");
    unpublish(&d, &id).await;
    destroy_disk(&d, &id).await;
    d.stop_cleanly().await;
}
