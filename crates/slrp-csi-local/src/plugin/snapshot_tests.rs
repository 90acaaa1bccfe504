//! Unit tests of snapshots, restores, clones and multi-writer publishing against the fake
//! host (the data copies are real, in a tempdir).

use super::tests::{block_cap, config, create, mount_cap, open};
use super::*;
use crate::host::fake::FakeHost;
use crate::types::{
    AccessMode, Capability, CapacityRange, ContentSource as Source, CreateSnapshot, CreateVolume,
    PublishVolume, StageVolume,
};
use tonic::Code;

const MIB: u64 = 1 << 20;

fn snap(name: &str, source: &str) -> CreateSnapshot {
    CreateSnapshot {
        name: name.into(),
        source_volume_id: source.into(),
        parameters: HashMap::new(),
    }
}

fn from(name: &str, size: u64, cap: Capability, source: Source) -> CreateVolume {
    let mut r = create(name, i64::try_from(size).unwrap(), cap);
    r.content_source = Some(source);
    r
}

fn available(p: &Plugin<FakeHost>) -> i64 {
    p.get_capacity(&[], &HashMap::new())
        .unwrap()
        .available_capacity
}

fn backing(p: &Plugin<FakeHost>, id: &str) -> PathBuf {
    p.layout.backing(&lock(&p.volumes)[id])
}

fn loop_req(name: &str, size: u64, cap: Capability) -> CreateVolume {
    let mut r = create(name, i64::try_from(size).unwrap(), cap);
    r.parameters.insert("backend".into(), "loop".into());
    r
}

#[test]
fn snapshots_are_idempotent_listed_paginated_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let a = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
    let b = p.create_volume(&create("b", 1 << 20, mount_cap())).unwrap();
    let s1 = p.create_snapshot(&snap("s1", &a.volume_id)).unwrap();
    assert!(s1.ready_to_use);
    assert!(s1.snapshot_id.starts_with("snap-"), "{}", s1.snapshot_id);
    assert_eq!(s1.source_volume_id, a.volume_id);
    assert_eq!(s1.size_bytes, 1 << 20);
    assert!(s1.creation_time > std::time::UNIX_EPOCH);
    // Same name and source: the same snapshot; same name, other source: ALREADY_EXISTS.
    assert_eq!(p.create_snapshot(&snap("s1", &a.volume_id)).unwrap(), s1);
    let err = p.create_snapshot(&snap("s1", &b.volume_id)).unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    let s2 = p.create_snapshot(&snap("s2", &a.volume_id)).unwrap();
    let s3 = p.create_snapshot(&snap("s3", &b.volume_id)).unwrap();
    assert_eq!(p.get_snapshot(&s2.snapshot_id).unwrap(), s2);

    let ids = |page: crate::types::SnapshotPage| {
        page.entries
            .into_iter()
            .map(|e| e.snapshot_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(p.list_snapshots(0, "", "", "").unwrap().entries.len(), 3);
    assert_eq!(
        ids(p.list_snapshots(0, "", "", &s2.snapshot_id).unwrap()),
        std::slice::from_ref(&s2.snapshot_id)
    );
    let mut of_a = ids(p.list_snapshots(0, "", &a.volume_id, "").unwrap());
    of_a.sort();
    let mut want = vec![s1.snapshot_id.clone(), s2.snapshot_id.clone()];
    want.sort();
    assert_eq!(of_a, want);
    for (source, id) in [
        ("vol-none", ""),
        ("", "none-exist-id"),
        ("", "../x"),
        (&b.volume_id[..], &s1.snapshot_id[..]),
    ] {
        assert!(
            p.list_snapshots(0, "", source, id)
                .unwrap()
                .entries
                .is_empty(),
            "{source:?} {id:?}"
        );
    }
    // Pages of two, then the rest; a token survives the deletion of its snapshot.
    let first = p.list_snapshots(2, "", "", "").unwrap();
    assert_eq!(first.entries.len(), 2);
    assert!(!first.next_token.is_empty());
    let rest = p.list_snapshots(0, &first.next_token, "", "").unwrap();
    assert_eq!(rest.entries.len(), 1);
    assert!(rest.next_token.is_empty());
    let named = first
        .next_token
        .strip_prefix(TOKEN_PREFIX)
        .unwrap()
        .to_owned();
    p.delete_snapshot(&named).unwrap();
    assert!(
        p.list_snapshots(0, &first.next_token, "", "")
            .unwrap()
            .entries
            .is_empty()
    );
    assert_eq!(
        p.list_snapshots(0, "invalid-token", "", "")
            .unwrap_err()
            .code(),
        Code::Aborted
    );
    assert_eq!(
        p.list_snapshots(-1, "", "", "").unwrap_err().code(),
        Code::InvalidArgument
    );

    // Deleting is idempotent; unknown and malformed ids succeed; an empty one does not.
    p.delete_snapshot(&s3.snapshot_id).unwrap();
    p.delete_snapshot(&s3.snapshot_id).unwrap();
    p.delete_snapshot("reallyfakesnapshotid").unwrap();
    p.delete_snapshot("../../etc").unwrap();
    assert_eq!(
        p.delete_snapshot("").unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        p.get_snapshot(&s3.snapshot_id).unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        p.get_snapshot("").unwrap_err().code(),
        Code::InvalidArgument
    );
    assert!(
        !dir.path()
            .join("snapshots/dir")
            .join(&s3.snapshot_id)
            .exists()
    );
}

#[test]
fn create_snapshot_validates_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let a = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
    let code = |r: CreateSnapshot| p.create_snapshot(&r).unwrap_err().code();
    assert_eq!(code(snap("", "testId")), Code::InvalidArgument);
    assert_eq!(code(snap("name", "")), Code::InvalidArgument);
    assert_eq!(code(snap("bad\u{7}", &a.volume_id)), Code::InvalidArgument);
    assert_eq!(
        code(snap(&"n".repeat(1025), &a.volume_id)),
        Code::InvalidArgument
    );
    assert_eq!(code(snap("n", "vol-nope")), Code::NotFound);
    assert_eq!(code(snap("n", "../../etc")), Code::NotFound);
    let mut r = snap("n", &a.volume_id);
    r.parameters.insert("colour".into(), "red".into());
    assert_eq!(code(r), Code::InvalidArgument);
    let mut r = snap("n", &a.volume_id);
    r.parameters
        .insert("csi.storage.k8s.io/volumesnapshot/name".into(), "x".into());
    p.create_snapshot(&r).unwrap();
    // An import has no pool to account the copy against.
    fs::create_dir(dir.path().join("import/dir/data")).unwrap();
    assert_eq!(code(snap("i", "import-dir-data")), Code::InvalidArgument);
}

#[test]
fn snapshots_take_pool_capacity_and_outlive_their_volume() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 100 * MIB);
    let v = p
        .create_volume(&create("v", 40 << 20, mount_cap()))
        .unwrap();
    fs::write(backing(&p, &v.volume_id).join("f"), b"data").unwrap();
    let s = p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
    assert_eq!(available(&p), 20 << 20);
    let err = p.create_snapshot(&snap("t", &v.volume_id)).unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let err = p
        .create_volume(&create("w", 21 << 20, mount_cap()))
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    // The failed snapshot left nothing behind.
    assert_eq!(p.list_snapshots(0, "", "", "").unwrap().entries.len(), 1);
    assert_eq!(
        fs::read_dir(dir.path().join("snapshots/dir"))
            .unwrap()
            .count(),
        1
    );

    p.delete_volume(&v.volume_id).unwrap();
    assert_eq!(available(&p), 60 << 20);
    assert_eq!(p.get_snapshot(&s.snapshot_id).unwrap(), s);
    drop(p);
    // Accounted again after a restart.
    let p = open(dir.path(), 100 * MIB);
    assert_eq!(available(&p), 60 << 20);
    p.delete_snapshot(&s.snapshot_id).unwrap();
    assert_eq!(available(&p), 100 << 20);
}

#[test]
fn restores_and_clones_copy_the_data_and_check_their_source() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let v = p.create_volume(&create("v", 4 << 20, mount_cap())).unwrap();
    fs::create_dir(backing(&p, &v.volume_id).join("sub")).unwrap();
    fs::write(backing(&p, &v.volume_id).join("sub/f"), b"first").unwrap();
    let s = p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
    // Changed after the snapshot: the snapshot keeps the old content.
    fs::write(backing(&p, &v.volume_id).join("sub/f"), b"second").unwrap();

    let snap_src = Source::Snapshot(s.snapshot_id.clone());
    let restored = p
        .create_volume(&from("r", 0, mount_cap(), snap_src.clone()))
        .unwrap();
    assert_eq!(restored.content_source, Some(snap_src.clone()));
    assert_eq!(
        restored.capacity_bytes,
        4 << 20,
        "the source's size by default"
    );
    assert_eq!(
        fs::read(backing(&p, &restored.volume_id).join("sub/f")).unwrap(),
        b"first"
    );
    let vol_src = Source::Volume(v.volume_id.clone());
    let clone = p
        .create_volume(&from("c", 8 << 20, mount_cap(), vol_src.clone()))
        .unwrap();
    assert_eq!(clone.capacity_bytes, 8 << 20);
    assert_eq!(
        fs::read(backing(&p, &clone.volume_id).join("sub/f")).unwrap(),
        b"second"
    );
    // Idempotent by name and source, even once the source is gone.
    p.delete_volume(&v.volume_id).unwrap();
    assert_eq!(
        p.create_volume(&from("c", 8 << 20, mount_cap(), vol_src.clone()))
            .unwrap(),
        clone
    );
    let code = |r: CreateVolume| p.create_volume(&r).unwrap_err().code();
    assert_eq!(
        code(from("c", 8 << 20, mount_cap(), snap_src.clone())),
        Code::AlreadyExists
    );
    assert_eq!(code(create("c", 8 << 20, mount_cap())), Code::AlreadyExists);
    assert_eq!(
        code(from("r", 0, mount_cap(), vol_src.clone())),
        Code::AlreadyExists
    );
    // Missing sources.
    assert_eq!(
        code(from(
            "x",
            0,
            mount_cap(),
            Source::Snapshot("non-existing-snapshot-id".into())
        )),
        Code::NotFound
    );
    assert_eq!(code(from("x", 0, mount_cap(), vol_src)), Code::NotFound);
    assert_eq!(
        code(from("x", 0, mount_cap(), Source::Volume("../etc".into()))),
        Code::NotFound
    );
    assert_eq!(
        code(from("x", 0, mount_cap(), Source::Snapshot(String::new()))),
        Code::InvalidArgument
    );
    // Smaller than the source.
    assert_eq!(
        code(from("x", 1 << 20, mount_cap(), snap_src.clone())),
        Code::OutOfRange
    );
    let mut r = from("x", 0, mount_cap(), snap_src.clone());
    r.capacity_range = Some(CapacityRange {
        required_bytes: 0,
        limit_bytes: 2 << 20,
    });
    assert_eq!(code(r), Code::OutOfRange);
    // Data the new volume cannot hold: BLOCK from a dir volume, another backend.
    assert_eq!(
        code(from("x", 0, block_cap(), snap_src.clone())),
        Code::InvalidArgument
    );
    let mut r = from("x", 0, mount_cap(), snap_src.clone());
    r.parameters.insert("backend".into(), "loop".into());
    assert_eq!(code(r), Code::InvalidArgument);
    // Nothing was created by the refused requests.
    assert_eq!(p.list_volumes(0, "").unwrap().entries.len(), 2);
}

#[test]
fn a_copy_stays_in_its_source_pool() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), 1 << 30);
    cfg.pools.insert("fast".into(), 1 << 30);
    let p = Plugin::open(&cfg, FakeHost::default()).unwrap();
    let mut r = create("v", 1 << 20, mount_cap());
    r.parameters.insert("pool".into(), "fast".into());
    let v = p.create_volume(&r).unwrap();
    let s = p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
    // Unsaid, the pool is the source's; named otherwise, refused with the reason.
    let same = p
        .create_volume(&from(
            "a",
            0,
            mount_cap(),
            Source::Snapshot(s.snapshot_id.clone()),
        ))
        .unwrap();
    assert_eq!(same.volume_context["pool"], "fast");
    let mut other = from("b", 0, mount_cap(), Source::Volume(v.volume_id.clone()));
    other.parameters.insert("pool".into(), "default".into());
    let err = p.create_volume(&other).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("pool"), "{err}");
    let fast = |p: &Plugin<FakeHost>| {
        let params = HashMap::from([("pool".to_owned(), "fast".to_owned())]);
        p.get_capacity(&[], &params).unwrap().available_capacity
    };
    assert_eq!(fast(&p), (1 << 30) - 3 * (1 << 20));
}

/// A snapshot of a mounted loop volume freezes its file system for the copy and thaws it;
/// a restore into a larger volume grows the image at once and the file system at its
/// first stage (ext4: before mounting), without formatting it again.
#[test]
fn loop_copies_freeze_and_larger_restores_grow_at_stage() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let staging = dir.path().join("staging");
    let v = p
        .create_volume(&loop_req("v", 16 << 20, mount_cap()))
        .unwrap();
    let st = |id: &str, path: &Path| StageVolume {
        volume_id: id.to_owned(),
        staging_target_path: path.display().to_string(),
        capability: mount_cap(),
    };
    p.stage_volume(&st(&v.volume_id, &staging)).unwrap();
    let image = backing(&p, &v.volume_id);
    let f = fs::OpenOptions::new().write(true).open(&image).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"superblock", 4096).unwrap();
    let s = p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
    {
        let h = lock(&p.host.state);
        assert_eq!(h.freezes, std::slice::from_ref(&staging));
        assert!(h.frozen.is_empty(), "thawed after the copy");
    }
    assert!(lock(&p.volumes)[&v.volume_id].frozen.is_none());
    let data = dir
        .path()
        .join("snapshots/loop")
        .join(format!("{}.img", s.snapshot_id));
    assert_eq!(fs::read(&data).unwrap(), fs::read(&image).unwrap());

    let r = p
        .create_volume(&{
            let mut r = from("r", 32 << 20, mount_cap(), Source::Snapshot(s.snapshot_id));
            r.parameters.insert("backend".into(), "loop".into());
            r
        })
        .unwrap();
    let rec = lock(&p.volumes)[&r.volume_id].clone();
    assert!(rec.formatted && rec.grow_fs, "{rec:?}");
    assert_eq!(rec.fs_type.as_deref(), Some("ext4"));
    let restored = p.layout.backing(&rec);
    assert_eq!(fs::metadata(&restored).unwrap().len(), 32 << 20);
    let mkfs_before = lock(&p.host.state).mkfs_calls;
    let staging2 = dir.path().join("staging2");
    p.stage_volume(&st(&r.volume_id, &staging2)).unwrap();
    let h = lock(&p.host.state);
    assert_eq!(
        h.mkfs_calls, mkfs_before,
        "a restored file system is not formatted"
    );
    assert_eq!(h.offline_grows.len(), 1, "{h:?}");
    assert!(h.online_grows.is_empty());
    drop(h);
    assert!(!lock(&p.volumes)[&r.volume_id].grow_fs);
    // Staged again: nothing more to grow.
    p.unstage_volume(&r.volume_id, &staging2.display().to_string())
        .unwrap();
    p.stage_volume(&st(&r.volume_id, &staging2)).unwrap();
    assert_eq!(lock(&p.host.state).offline_grows.len(), 1);

    // A clone of the (still staged, mounted) source freezes it too, and one of the same
    // size needs no growth.
    let c = p
        .create_volume(&{
            let mut r = from("c", 0, mount_cap(), Source::Volume(v.volume_id.clone()));
            r.parameters.insert("backend".into(), "loop".into());
            r
        })
        .unwrap();
    assert!(!lock(&p.volumes)[&c.volume_id].grow_fs);
    assert_eq!(lock(&p.host.state).freezes.len(), 2);
}

#[test]
fn a_staged_block_volume_is_flushed_before_its_copy() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let v = p.create_volume(&create("b", 4 << 20, block_cap())).unwrap();
    p.stage_volume(&StageVolume {
        volume_id: v.volume_id.clone(),
        staging_target_path: dir.path().join("staging").display().to_string(),
        capability: block_cap(),
    })
    .unwrap();
    p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
    let h = lock(&p.host.state);
    assert_eq!(h.flushes.len(), 1);
    assert!(h.freezes.is_empty());
}

/// A copy that fails is rolled back at once: no snapshot or volume, no data, no capacity
/// taken.
#[test]
fn a_failed_copy_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let v = p.create_volume(&create("v", 1 << 20, mount_cap())).unwrap();
    fs::write(backing(&p, &v.volume_id).join("f"), b"x").unwrap();
    lock(&p.host.state).copy_failures = 1;
    let err = p.create_snapshot(&snap("s", &v.volume_id)).unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(p.list_snapshots(0, "", "", "").unwrap().entries.is_empty());
    assert_eq!(
        fs::read_dir(dir.path().join("snapshots/dir"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(
        fs::read_dir(dir.path().join("snapshots/meta"))
            .unwrap()
            .count(),
        0
    );
    lock(&p.host.state).copy_failures = 1;
    let err = p
        .create_volume(&from(
            "c",
            0,
            mount_cap(),
            Source::Volume(v.volume_id.clone()),
        ))
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert_eq!(p.list_volumes(0, "").unwrap().entries.len(), 1);
    assert_eq!(available(&p), (1 << 30) - (1 << 20));
    // And the retry works.
    p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
}

/// A crash in the middle of a copy leaves a `creating` record and part of the data; the
/// next start removes both (and data with no record, and thaws a file system left
/// frozen), so nothing half-made is listed or accounted.
#[test]
fn interrupted_copies_are_rolled_back_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (half_snapshot, half_clone, frozen_volume) = {
        let p = open(dir.path(), 1 << 30);
        let v = p.create_volume(&create("v", 1 << 20, mount_cap())).unwrap();
        fs::write(backing(&p, &v.volume_id).join("f"), b"x").unwrap();
        let s = p.create_snapshot(&snap("s", &v.volume_id)).unwrap();
        let mut rec = lock(&p.snapshots)[&s.snapshot_id].clone();
        rec.phase = Phase::Creating;
        p.snapshot_store.put(&rec).unwrap();
        // A clone whose copy was cut short.
        let c = p
            .create_volume(&from(
                "c",
                0,
                mount_cap(),
                Source::Volume(v.volume_id.clone()),
            ))
            .unwrap();
        let mut crec = lock(&p.volumes)[&c.volume_id].clone();
        crec.phase = Phase::Creating;
        p.store.put(&crec).unwrap();
        // A file system recorded frozen.
        let mut vrec = lock(&p.volumes)[&v.volume_id].clone();
        vrec.frozen = Some(dir.path().join("staging"));
        p.store.put(&vrec).unwrap();
        // Snapshot data nobody owns.
        fs::create_dir(dir.path().join("snapshots/dir/snap-orphan")).unwrap();
        (rec, crec, v.volume_id)
    };
    let p = open(dir.path(), 1 << 30);
    assert!(p.list_snapshots(0, "", "", "").unwrap().entries.is_empty());
    assert!(!p.layout.snapshot_data(&half_snapshot).exists());
    assert!(!dir.path().join("snapshots/dir/snap-orphan").exists());
    assert!(!p.layout.backing(&half_clone).exists());
    assert_eq!(p.list_volumes(0, "").unwrap().entries.len(), 1);
    assert!(lock(&p.volumes)[&frozen_volume].frozen.is_none());
    assert_eq!(available(&p), (1 << 30) - (1 << 20));
    drop(p);
    // The repair is durable.
    let p = open(dir.path(), 1 << 30);
    assert!(lock(&p.volumes)[&frozen_volume].frozen.is_none());
}

fn publish(
    p: &Plugin<FakeHost>,
    id: &str,
    staging: &str,
    target: &str,
    mode: AccessMode,
) -> Result<(), VolumeError> {
    let mut capability = mount_cap();
    capability.mode = mode;
    p.publish_volume(&PublishVolume {
        volume_id: id.to_owned(),
        staging_target_path: staging.to_owned(),
        target_path: target.to_owned(),
        capability,
        readonly: false,
    })
}

/// CSI's NodePublishVolume table for plugins with SINGLE_NODE_MULTI_WRITER: a second
/// target is OK only for multi-writer publications, FAILED_PRECONDITION otherwise.
#[test]
fn only_multi_writer_publications_share_a_volume() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let staging = dir.path().join("staging").display().to_string();
    let t = |n: &str| dir.path().join(n).display().to_string();
    let v = p.create_volume(&create("v", 1 << 20, mount_cap())).unwrap();
    let mut cap = mount_cap();
    cap.mode = AccessMode::SingleNodeMultiWriter;
    p.stage_volume(&StageVolume {
        volume_id: v.volume_id.clone(),
        staging_target_path: staging.clone(),
        capability: cap,
    })
    .unwrap();
    let listed = |p: &Plugin<FakeHost>| {
        p.list_volumes(0, "").unwrap().entries[0]
            .published_node_ids
            .clone()
    };
    assert_eq!(listed(&p), ["node-1"], "staged counts as published here");
    let multi = AccessMode::SingleNodeMultiWriter;
    publish(&p, &v.volume_id, &staging, &t("t1"), multi).unwrap();
    publish(&p, &v.volume_id, &staging, &t("t2"), multi).unwrap();
    publish(&p, &v.volume_id, &staging, &t("t2"), multi).unwrap();
    for mode in [
        AccessMode::SingleNodeSingleWriter,
        AccessMode::SingleNodeWriter,
        AccessMode::SingleNodeReaderOnly,
    ] {
        let err = publish(&p, &v.volume_id, &staging, &t("t3"), mode).unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{mode:?}: {err}");
        // The same target with another mode: other arguments.
        let err = publish(&p, &v.volume_id, &staging, &t("t1"), mode).unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{mode:?}: {err}");
    }
    assert_eq!(lock(&p.volumes)[&v.volume_id].published.len(), 2);
    for n in ["t1", "t2"] {
        p.unpublish_volume(&v.volume_id, &t(n)).unwrap();
    }
    // A single-writer publication keeps a later multi-writer one out too.
    publish(
        &p,
        &v.volume_id,
        &staging,
        &t("t1"),
        AccessMode::SingleNodeSingleWriter,
    )
    .unwrap();
    let err = publish(&p, &v.volume_id, &staging, &t("t2"), multi).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    p.unpublish_volume(&v.volume_id, &t("t1")).unwrap();
    p.unstage_volume(&v.volume_id, &staging).unwrap();
    assert!(listed(&p).is_empty());
}
