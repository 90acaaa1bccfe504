//! Snapshots, restores and clones against the real binary, with real mounts and loop
//! devices: data written into a published volume (a dir volume, an ext4 or xfs loop
//! volume, a BLOCK volume) is snapshotted, the volume deleted, a new volume created from
//! the snapshot and published, and the data read back; a published volume is cloned; a
//! larger restore has a larger file system; a crash in the middle of a copy (injected with
//! a faults rule) leaves nothing half-made after the restart, and thaws a file system it
//! left frozen.

// An integration test crate is test code throughout: helpers fail by panicking, and the
// tests need no `mod tests` wrapper (the lint targets test code hidden in src/).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::process::Command;

use common::*;
use slrp_proto::csi::v1;
use tonic::Code;
use v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};

const PAYLOAD: &[u8] = b"written before the snapshot";

/// One node-side use of a volume: where it is staged and published.
struct Use {
    id: String,
    cap: v1::VolumeCapability,
    staging: String,
    target: String,
}

impl Use {
    /// Stages and publishes volume `id` under `<tempdir>/<name>/`.
    async fn publish(
        p: &TestPlugin,
        c: &mut V1,
        id: &str,
        cap: v1::VolumeCapability,
        name: &str,
    ) -> Self {
        let staging = p.path_str(&format!("{name}/staging"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(p.path(&format!("{name}/pods"))).unwrap();
        let target = p.path_str(&format!("{name}/pods/target"));
        c.node
            .node_stage_volume(stage_req(id, &staging, cap.clone()))
            .await
            .unwrap();
        c.node
            .node_publish_volume(publish_req(id, &staging, &target, cap.clone()))
            .await
            .unwrap();
        Self {
            id: id.to_owned(),
            cap,
            staging,
            target,
        }
    }

    async fn unpublish(self, c: &mut V1) {
        c.node
            .node_unpublish_volume(unpublish_req(&self.id, &self.target))
            .await
            .unwrap();
        c.node
            .node_unstage_volume(unstage_req(&self.id, &self.staging))
            .await
            .unwrap();
    }

    fn is_block(&self) -> bool {
        matches!(
            self.cap.access_type,
            Some(v1::volume_capability::AccessType::Block(_))
        )
    }

    /// Writes `data` into the volume (a file, or at 1 MiB into the device) and syncs it.
    fn write(&self, data: &[u8]) {
        if self.is_block() {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.target)
                .unwrap();
            f.write_all_at(data, 1 << 20).unwrap();
            f.sync_all().unwrap();
        } else {
            std::fs::create_dir_all(format!("{}/dir", self.target)).unwrap();
            let mut f = std::fs::File::create(format!("{}/dir/data", self.target)).unwrap();
            f.write_all(data).unwrap();
            f.sync_all().unwrap();
        }
    }

    /// What [`Use::write`] wrote, `len` bytes.
    fn read(&self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        if self.is_block() {
            let mut f = std::fs::File::open(&self.target).unwrap();
            f.seek(SeekFrom::Start(1 << 20)).unwrap();
            f.read_exact(&mut buf).unwrap();
        } else {
            let mut f = std::fs::File::open(format!("{}/dir/data", self.target)).unwrap();
            f.read_exact(&mut buf).unwrap();
        }
        buf
    }
}

async fn create(c: &mut V1, req: v1::CreateVolumeRequest) -> v1::Volume {
    c.controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

async fn snapshot(c: &mut V1, name: &str, source: &str) -> v1::Snapshot {
    c.controller
        .create_snapshot(v1::CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: source.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

fn from_snapshot(mut req: v1::CreateVolumeRequest, id: &str) -> v1::CreateVolumeRequest {
    req.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: id.into(),
        })),
    });
    req
}

fn from_volume(mut req: v1::CreateVolumeRequest, id: &str) -> v1::CreateVolumeRequest {
    req.volume_content_source = Some(v1::VolumeContentSource {
        r#type: Some(SourceType::Volume(VolumeSource {
            volume_id: id.into(),
        })),
    });
    req
}

async fn delete(c: &mut V1, id: &str) {
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn free_bytes(c: &mut V1) -> i64 {
    c.controller
        .get_capacity(v1::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

/// Snapshot a published volume holding data, delete the volume, restore the snapshot into
/// a new volume of `restore_bytes`, publish it and read the data back; returns the
/// restored volume's use (published) for further checks.
async fn snapshot_delete_restore(
    p: &TestPlugin,
    c: &mut V1,
    req: v1::CreateVolumeRequest,
    restore_bytes: i64,
) -> Use {
    let cap = req.volume_capabilities[0].clone();
    let v = create(c, req.clone()).await;
    let used = Use::publish(p, c, &v.volume_id, cap.clone(), "source").await;
    used.write(PAYLOAD);
    let s = snapshot(c, "snap", &v.volume_id).await;
    assert!(s.ready_to_use);
    assert_eq!(s.size_bytes, v.capacity_bytes);
    // Written after the snapshot: not in it.
    used.write(b"written after the snapshot!");
    used.unpublish(c).await;
    delete(c, &v.volume_id).await;

    let mut restore = from_snapshot(req, &s.snapshot_id);
    restore.name = "restored".into();
    restore.capacity_range = Some(v1::CapacityRange {
        required_bytes: restore_bytes,
        limit_bytes: 0,
    });
    let r = create(c, restore).await;
    assert_eq!(r.capacity_bytes, restore_bytes);
    let restored = Use::publish(p, c, &r.volume_id, cap, "restored").await;
    assert_eq!(restored.read(PAYLOAD.len()), PAYLOAD);
    restored
}

/// The bytes a mounted volume's file system offers (statvfs of the target).
fn fs_size(path: &str) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    st.blocks() * st.fragment_size()
}

#[tokio::test]
async fn dir_volume_snapshot_restore_and_clone() {
    if !can_mount("dir_volume_snapshot_restore_and_clone") {
        return;
    }
    let p = TestPlugin::start(&["--pool", "default=1GiB"]).await;
    let mut c = p.v1().await;
    let req = create_req("dir", 16 * MIB, mount_cap(""), &[]);
    let restored = snapshot_delete_restore(&p, &mut c, req.clone(), 32 * MIB).await;
    // A clone of the published restored volume holds its data too.
    let mut clone = from_volume(req, &restored.id);
    clone.name = "clone".into();
    // No size: the source's.
    clone.capacity_range = None;
    let cl = create(&mut c, clone).await;
    let cloned = Use::publish(&p, &mut c, &cl.volume_id, mount_cap(""), "clone").await;
    assert_eq!(cloned.read(PAYLOAD.len()), PAYLOAD);
    // Independent copies: a write to the clone does not reach the restored volume.
    cloned.write(b"only in the clone, not elsewhere");
    assert_eq!(restored.read(PAYLOAD.len()), PAYLOAD);
    cloned.unpublish(&mut c).await;
    restored.unpublish(&mut c).await;
    assert!(p.mounts_here().is_empty());
}

/// An ext4 loop volume snapshotted while mounted (frozen for the copy) restores into a
/// larger volume whose file system has grown to the new size at its first stage, with the
/// data; a clone of the published volume has the data as well.
#[tokio::test]
async fn ext4_loop_volume_snapshot_restore_larger_and_clone() {
    let test = "ext4_loop_volume_snapshot_restore_larger_and_clone";
    if !can_mount(test) || !slrp_test_support::require_tool(test, "mkfs.ext4") {
        return;
    }
    let p = TestPlugin::start(&["--pool", "default=1GiB"]).await;
    let mut c = p.v1().await;
    let req = create_req("ext4", 64 * MIB, mount_cap("ext4"), &[("backend", "loop")]);
    let restored = snapshot_delete_restore(&p, &mut c, req.clone(), 160 * MIB).await;
    let size = fs_size(&restored.target);
    assert!(size > 120 * (1 << 20), "the file system has {size} bytes");
    let mut clone = from_volume(req, &restored.id);
    clone.name = "clone".into();
    // No size: the source's.
    clone.capacity_range = None;
    let cl = create(&mut c, clone).await;
    assert_eq!(
        cl.capacity_bytes,
        160 * MIB,
        "a clone's size is its source's"
    );
    let cloned = Use::publish(&p, &mut c, &cl.volume_id, restored.cap.clone(), "clone").await;
    assert_eq!(cloned.read(PAYLOAD.len()), PAYLOAD);
    // The source was thawed after the copy: it takes writes.
    restored.write(b"after the clone was taken");
    cloned.unpublish(&mut c).await;
    restored.unpublish(&mut c).await;
    assert!(p.mounts_here().is_empty());
    assert!(p.loops_after_release().await.is_empty());
}

/// The same for xfs, which grows only while mounted (online, at the stage).
#[tokio::test]
async fn xfs_loop_volume_restores_into_a_larger_file_system() {
    let test = "xfs_loop_volume_restores_into_a_larger_file_system";
    if !can_mount(test) || !slrp_test_support::require_tool(test, "mkfs.xfs") {
        return;
    }
    let p = TestPlugin::start(&["--pool", "default=2GiB"]).await;
    let mut c = p.v1().await;
    let req = create_req("xfs", 320 * MIB, mount_cap("xfs"), &[("backend", "loop")]);
    let restored = snapshot_delete_restore(&p, &mut c, req, 640 * MIB).await;
    let size = fs_size(&restored.target);
    assert!(size > 560 * (1 << 20), "the file system has {size} bytes");
    restored.unpublish(&mut c).await;
    assert!(p.loops_after_release().await.is_empty());
}

/// A BLOCK volume written through its published device: snapshot, restore, and a clone
/// of the published volume, all with the bytes.
#[tokio::test]
async fn block_volume_snapshot_restore_and_clone() {
    if !can_mount("block_volume_snapshot_restore_and_clone") {
        return;
    }
    let p = TestPlugin::start(&["--pool", "default=1GiB"]).await;
    let mut c = p.v1().await;
    let req = create_req("block", 8 * MIB, block_cap(), &[]);
    let restored = snapshot_delete_restore(&p, &mut c, req.clone(), 16 * MIB).await;
    let mut clone = from_volume(req, &restored.id);
    clone.name = "clone".into();
    // No size: the source's.
    clone.capacity_range = None;
    let cl = create(&mut c, clone).await;
    let cloned = Use::publish(&p, &mut c, &cl.volume_id, block_cap(), "clone").await;
    assert_eq!(cloned.read(PAYLOAD.len()), PAYLOAD);
    let dev_size = std::fs::File::open(&cloned.target)
        .unwrap()
        .seek(SeekFrom::End(0))
        .unwrap();
    assert_eq!(dev_size, 16 << 20);
    cloned.unpublish(&mut c).await;
    restored.unpublish(&mut c).await;
    assert!(p.loops_after_release().await.is_empty());
}

/// Snapshots take their size from the pool (GetCapacity and creation checks see them),
/// across a restart and after their volume is deleted.
#[tokio::test]
async fn snapshot_capacity_is_accounted_across_restarts() {
    let mut p = TestPlugin::start(&["--pool", "default=100MiB"]).await;
    let mut c = p.v1().await;
    let v = create(&mut c, create_req("v", 40 * MIB, mount_cap(""), &[])).await;
    snapshot(&mut c, "s", &v.volume_id).await;
    assert_eq!(free_bytes(&mut c).await, 20 * MIB);
    assert_code(
        c.controller
            .create_volume(create_req("w", 30 * MIB, mount_cap(""), &[]))
            .await,
        Code::OutOfRange,
    );
    p.crash_and_restart().await;
    let mut c = p.v1().await;
    assert_eq!(free_bytes(&mut c).await, 20 * MIB);
    delete(&mut c, &v.volume_id).await;
    assert_eq!(free_bytes(&mut c).await, 60 * MIB);
}

/// Records under `<root>/snapshots/meta` and the files and trees under
/// `<root>/snapshots/{dir,loop}`.
fn snapshot_files(p: &TestPlugin) -> (Vec<String>, Vec<String>) {
    let names = |d: &str| {
        let mut v: Vec<String> = std::fs::read_dir(p.root.join(d))
            .map(|e| {
                e.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut data = names("snapshots/dir");
    data.extend(names("snapshots/loop"));
    (names("snapshots/meta"), data)
}

/// A loop volume with 8 MiB of data (several chunks of the copy), staged or not.
async fn volume_with_data(p: &TestPlugin, c: &mut V1) -> (v1::Volume, Use) {
    let v = create(
        c,
        create_req("data", 64 * MIB, mount_cap("ext4"), &[("backend", "loop")]),
    )
    .await;
    let used = Use::publish(p, c, &v.volume_id, mount_cap("ext4"), "source").await;
    let chunk: Vec<u8> = (0u32..8 << 20)
        .map(|i| u8::try_from(i % 251).unwrap() + 1)
        .collect();
    used.write(&chunk);
    (v, used)
}

/// A crash in the middle of a snapshot's copy (the plugin exits after the first chunk,
/// through a faults rule) leaves a `creating` record and part of the copy on disk; the
/// restart removes both: nothing is listed, the capacity is back. The same for a clone.
#[tokio::test]
async fn a_crash_in_the_middle_of_a_copy_leaves_nothing_half_made() {
    let test = "a_crash_in_the_middle_of_a_copy_leaves_nothing_half_made";
    if !can_mount(test) || !slrp_test_support::require_tool(test, "mkfs.ext4") {
        return;
    }
    let mut p = TestPlugin::start(&["--pool", "default=1GiB"]).await;
    let mut c = p.v1().await;
    let (v, used) = volume_with_data(&p, &mut c).await;
    used.unpublish(&mut c).await;
    let free = free_bytes(&mut c).await;

    p.write_faults(r#"[{"rpc": "CreateSnapshot", "exit": true, "at": "copy", "times": 1}]"#);
    let err = c
        .controller
        .create_snapshot(v1::CreateSnapshotRequest {
            name: "cut".into(),
            source_volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_ne!(err.code(), Code::Ok);
    assert!(!p.wait_exit().await.success());
    // Half made: the intent and part of the data.
    let (records, data) = snapshot_files(&p);
    assert_eq!((records.len(), data.len()), (1, 1), "{records:?} {data:?}");
    let record = std::fs::read_to_string(p.root.join("snapshots/meta").join(&records[0])).unwrap();
    assert!(record.contains("\"creating\""), "{record}");
    let partial = std::fs::metadata(p.root.join("snapshots/loop").join(&data[0])).unwrap();
    assert!(
        partial.len() < (64 << 20),
        "the copy stopped half-way: {partial:?}"
    );

    p.spawn().await;
    let mut c = p.v1().await;
    assert_eq!(snapshot_files(&p), (Vec::new(), Vec::new()));
    let listed = c
        .controller
        .list_snapshots(v1::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
    assert_eq!(free_bytes(&mut c).await, free);
    // The retry (the CO's) makes the snapshot.
    let s = snapshot(&mut c, "cut", &v.volume_id).await;

    // A clone cut short the same way leaves no volume.
    p.write_faults(r#"[{"rpc": "CreateVolume", "exit": true, "at": "copy", "times": 1}]"#);
    let mut req = create_req("clone", 64 * MIB, mount_cap("ext4"), &[("backend", "loop")]);
    req = from_snapshot(req, &s.snapshot_id);
    assert!(c.controller.create_volume(req.clone()).await.is_err());
    assert!(!p.wait_exit().await.success());
    p.spawn().await;
    let mut c = p.v1().await;
    let volumes = c
        .controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(volumes.len(), 1, "only the source: {volumes:?}");
    let images = std::fs::read_dir(p.root.join("volumes/loop"))
        .unwrap()
        .count();
    assert_eq!(images, 1);
    let restored = create(&mut c, req).await;
    let used = Use::publish(
        &p,
        &mut c,
        &restored.volume_id,
        mount_cap("ext4"),
        "restored",
    )
    .await;
    assert_eq!(used.read(16), (1..=16).collect::<Vec<u8>>());
    used.unpublish(&mut c).await;
}

/// A crash while a mounted file system is frozen for a copy would block its writers
/// forever; the restart thaws it (the freeze was recorded first).
#[tokio::test]
async fn a_file_system_frozen_by_an_interrupted_copy_is_thawed_at_restart() {
    let test = "a_file_system_frozen_by_an_interrupted_copy_is_thawed_at_restart";
    if !can_mount(test)
        || !slrp_test_support::require_tool(test, "mkfs.ext4")
        || !slrp_test_support::require_tool(test, "fsfreeze")
    {
        return;
    }
    let mut p = TestPlugin::start(&["--pool", "default=1GiB"]).await;
    let mut c = p.v1().await;
    let (v, used) = volume_with_data(&p, &mut c).await;
    // Thaws whatever the test leaves frozen, even when it fails, so the unmounts in the
    // harness's cleanup do not hang on it.
    struct Thaw(String);
    impl Drop for Thaw {
        fn drop(&mut self) {
            let _ = Command::new("fsfreeze").args(["-u", &self.0]).status();
        }
    }
    let _thaw = Thaw(used.staging.clone());
    p.write_faults(r#"[{"rpc": "CreateSnapshot", "exit": true, "at": "copy", "times": 1}]"#);
    assert!(
        c.controller
            .create_snapshot(v1::CreateSnapshotRequest {
                name: "frozen".into(),
                source_volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await
            .is_err()
    );
    assert!(!p.wait_exit().await.success());
    // Frozen now: a thaw by hand would succeed, so check without changing the state: the
    // volume's record says so.
    let record =
        std::fs::read_to_string(p.root.join("meta").join(format!("{}.json", v.volume_id))).unwrap();
    assert!(record.contains("\"frozen\""), "{record}");
    p.spawn().await;
    // Thawed by the restart: a thaw by hand now finds nothing frozen.
    let out = Command::new("fsfreeze")
        .args(["-u", &used.staging])
        .output()
        .unwrap();
    assert!(!out.status.success(), "still frozen after the restart");
    let mut c = p.v1().await;
    used.write(b"writable again");
    assert_eq!(used.read(14), b"writable again");
    used.unpublish(&mut c).await;
}
