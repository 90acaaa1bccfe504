//! Unit tests of the plugin core against the fake host.

use super::*;
use crate::config::CsiVersion;
use crate::host::fake::FakeHost;
use crate::types::{
    AccessMode, AccessType, Capability, CapacityRange, CreateVolume, PublishVolume, StageVolume,
    Validation,
};

pub(super) fn config(root: &Path, pool: u64) -> Config {
    Config {
        endpoint: root.join("csi.sock"),
        root: root.to_owned(),
        node_id: "node-1".into(),
        csi_version: CsiVersion::V1,
        pools: BTreeMap::from([("default".to_owned(), pool)]),
        max_volume_size: None,
        max_volumes_per_node: 0,
        faults_file: None,
        tool_timeout: crate::tool::DEFAULT_TOOL_TIMEOUT,
    }
}

pub(super) fn mount_cap() -> Capability {
    Capability {
        access: AccessType::Mount {
            fs_type: String::new(),
            mount_flags: vec![],
        },
        mode: AccessMode::SingleNodeWriter,
    }
}

pub(super) fn block_cap() -> Capability {
    Capability {
        access: AccessType::Block,
        mode: AccessMode::SingleNodeWriter,
    }
}

pub(super) fn create(name: &str, size: i64, cap: Capability) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        capabilities: vec![cap],
        ..Default::default()
    }
}

pub(super) fn open(root: &Path, pool: u64) -> Plugin<FakeHost> {
    Plugin::open(&config(root, pool), FakeHost::default()).unwrap()
}

#[test]
fn create_is_idempotent_by_name_and_accounts_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 100 << 20);
    let a = p
        .create_volume(&create("a", 10 << 20, mount_cap()))
        .unwrap();
    assert_eq!(
        p.create_volume(&create("a", 10 << 20, mount_cap()))
            .unwrap(),
        a
    );
    let err = p
        .create_volume(&create("a", 20 << 20, mount_cap()))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    let cap = p.get_capacity(&[], &HashMap::new()).unwrap();
    assert_eq!(cap.available_capacity, 90 << 20);
    let err = p
        .create_volume(&create("b", 91 << 20, mount_cap()))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    // The failed request changed nothing.
    assert_eq!(p.list_volumes(0, "").unwrap().entries.len(), 1);
    p.delete_volume(&a.volume_id).unwrap();
    p.delete_volume(&a.volume_id).unwrap();
    assert_eq!(
        p.get_capacity(&[], &HashMap::new())
            .unwrap()
            .available_capacity,
        100 << 20
    );
}

#[test]
fn create_validates_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let code = |r: CreateVolume| p.create_volume(&r).unwrap_err().code();
    assert_eq!(
        code(create("", 1, mount_cap())),
        tonic::Code::InvalidArgument
    );
    let mut r = create("x", 1, mount_cap());
    r.capabilities.clear();
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 1, mount_cap());
    r.capabilities[0].mode = AccessMode::MultiNodeMultiWriter;
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 1, block_cap());
    r.parameters.insert("backend".into(), "dir".into());
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 1, mount_cap());
    r.parameters.insert("colour".into(), "red".into());
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 1, mount_cap());
    r.parameters.insert("pool".into(), "nope".into());
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 10, mount_cap());
    r.capacity_range = Some(CapacityRange {
        required_bytes: 10,
        limit_bytes: 5,
    });
    assert_eq!(code(r), tonic::Code::InvalidArgument);
    let mut r = create("x", 1, block_cap());
    r.capacity_range = Some(CapacityRange {
        required_bytes: 0,
        limit_bytes: 4096,
    });
    assert_eq!(code(r), tonic::Code::OutOfRange);
    let mut r = create("x", 1, mount_cap());
    r.capabilities.push(block_cap());
    assert_eq!(code(r), tonic::Code::InvalidArgument);
}

#[test]
fn sizes_respect_minimum_granularity_and_limit() {
    type P = Plugin<FakeHost>;
    assert_eq!(P::choose_size(0, 0, 1, 1).unwrap(), DEFAULT_VOLUME_SIZE);
    assert_eq!(P::choose_size(0, 5000, 1, 1).unwrap(), 5000);
    assert_eq!(P::choose_size(1, 0, 8192, 4096).unwrap(), 8192);
    assert_eq!(P::choose_size(5000, 0, 1, 4096).unwrap(), 8192);
    assert_eq!(P::choose_size(0, 10_000, 1, 4096).unwrap(), 8192);
    assert!(P::choose_size(5000, 6000, 1, 4096).is_err());
}

#[test]
fn interrupted_create_and_delete_are_finished_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (creating, deleting) = {
        let p = open(dir.path(), 1 << 30);
        let a = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
        let b = p.create_volume(&create("b", 1 << 20, mount_cap())).unwrap();
        let c = p.create_volume(&create("c", 1 << 20, mount_cap())).unwrap();
        // Simulate crashes: a record stuck in `creating` and one stuck in `deleting`.
        let mut ra = lock(&p.volumes).get(&a.volume_id).cloned().unwrap();
        ra.phase = Phase::Creating;
        p.store.put(&ra).unwrap();
        let mut rb = lock(&p.volumes).get(&b.volume_id).cloned().unwrap();
        rb.phase = Phase::Deleting;
        p.store.put(&rb).unwrap();
        // And storage nobody owns.
        fs::create_dir(dir.path().join("volumes/dir/vol-orphan")).unwrap();
        let _ = c;
        (ra, rb)
    };
    let p = open(dir.path(), 1 << 30);
    let page = p.list_volumes(0, "").unwrap();
    assert_eq!(page.entries.len(), 1);
    assert!(!p.layout.backing(&creating).exists());
    assert!(!p.layout.backing(&deleting).exists());
    assert!(!dir.path().join("volumes/dir/vol-orphan").exists());
    assert_eq!(
        p.get_capacity(&[], &HashMap::new())
            .unwrap()
            .available_capacity,
        (1 << 30) - (1 << 20)
    );
}

#[test]
fn second_process_cannot_open_the_same_root() {
    let dir = tempfile::tempdir().unwrap();
    let _p = open(dir.path(), 1 << 30);
    let err = Plugin::open(&config(dir.path(), 1 << 30), FakeHost::default()).unwrap_err();
    assert!(matches!(
        err,
        OpenError::Store {
            source: StoreError::Locked { .. },
            ..
        }
    ));
}

#[test]
fn list_volumes_paginates_and_rejects_foreign_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    for i in 0..5 {
        p.create_volume(&create(&format!("v{i}"), 1 << 20, mount_cap()))
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = p.list_volumes(2, &token).unwrap();
        assert!(page.entries.len() <= 2);
        seen.extend(page.entries.into_iter().map(|e| e.volume_id));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen.len(), 5);
    let err = p.list_volumes(0, "garbage").unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    assert_eq!(
        p.list_volumes(-1, "").unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    // A token whose volume was deleted still works.
    let page = p.list_volumes(2, "").unwrap();
    let next = page
        .next_token
        .strip_prefix(TOKEN_PREFIX)
        .unwrap()
        .to_owned();
    p.delete_volume(&next).unwrap();
    assert_eq!(
        p.list_volumes(0, &page.next_token).unwrap().entries.len(),
        2
    );
}

#[test]
fn stage_publish_idempotency_and_conflicts() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let v = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
    let w = p.create_volume(&create("b", 1 << 20, mount_cap())).unwrap();
    let staging = dir.path().join("staging").display().to_string();
    let target = dir.path().join("target").display().to_string();
    let stage = |id: &str, path: &str| {
        p.stage_volume(&StageVolume {
            volume_id: id.into(),
            staging_target_path: path.into(),
            capability: mount_cap(),
        })
    };
    stage(&v.volume_id, &staging).unwrap();
    stage(&v.volume_id, &staging).unwrap();
    assert_eq!(
        stage(&w.volume_id, &staging).unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    assert_eq!(
        stage("vol-nope", &staging).unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        stage(&v.volume_id, "relative").unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let publish = |target: &str, readonly: bool| {
        p.publish_volume(&PublishVolume {
            volume_id: v.volume_id.clone(),
            staging_target_path: staging.clone(),
            target_path: target.into(),
            capability: mount_cap(),
            readonly,
        })
    };
    publish(&target, false).unwrap();
    publish(&target, false).unwrap();
    assert_eq!(
        publish(&target, true).unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    let other = dir.path().join("t2").display().to_string();
    assert_eq!(
        publish(&other, false).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        p.delete_volume(&v.volume_id).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert_eq!(
        p.unstage_volume(&v.volume_id, &staging).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    let stats = p.volume_stats(&v.volume_id, &target).unwrap();
    assert!(!stats.condition.abnormal, "{:?}", stats.condition);
    assert_eq!(
        p.volume_stats(&v.volume_id, &other).unwrap_err().code(),
        tonic::Code::NotFound
    );
    p.unpublish_volume(&v.volume_id, &target).unwrap();
    assert!(!Path::new(&target).exists());
    p.unpublish_volume(&v.volume_id, &target).unwrap();
    p.unstage_volume(&v.volume_id, &staging).unwrap();
    p.unstage_volume(&v.volume_id, &staging).unwrap();
    p.delete_volume(&v.volume_id).unwrap();
    assert!(lock(&p.host.state).mounts.is_empty());
}

/// An mkfs killed by the tool timeout leaves its intent recorded: the stage fails with
/// DEADLINE_EXCEEDED and is undone, and every retry (in the same process, then after a
/// restart) formats again with force instead of adopting the partial signature the
/// killed mkfs left; once mkfs succeeded, later stages never format again.
#[test]
fn interrupted_mkfs_is_redone_not_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging").display().to_string();
    let mut r = create("l", 16 << 20, mount_cap());
    r.parameters.insert("backend".into(), "loop".into());
    let host_state;
    let st;
    {
        let p = open(dir.path(), 1 << 30);
        let id = p.create_volume(&r).unwrap().volume_id;
        st = StageVolume {
            volume_id: id,
            staging_target_path: staging.clone(),
            capability: mount_cap(),
        };
        lock(&p.host.state).mkfs_timeouts = 2;
        for _ in 0..2 {
            let err = p.stage_volume(&st).unwrap_err();
            assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err}");
        }
        let s = lock(&p.host.state);
        assert_eq!(s.mkfs_forced, [false, true]);
        assert!(s.mounts.is_empty() && s.loops.is_empty(), "{s:?}");
        assert_eq!(s.formatted.values().collect::<Vec<_>>(), ["partial-ext4"]);
        host_state = s.formatted.clone();
    }
    let p = open(dir.path(), 1 << 30);
    lock(&p.host.state).formatted = host_state;
    p.stage_volume(&st).unwrap();
    p.unstage_volume(&st.volume_id, &staging).unwrap();
    p.stage_volume(&st).unwrap();
    let s = lock(&p.host.state);
    assert_eq!(s.mkfs_forced, [true]);
    assert_eq!(s.formatted.values().collect::<Vec<_>>(), ["ext4"]);
}

/// `losetup -d` of a device that AUTOCLEAR dropped after the listing fails with ENXIO;
/// the unstage (and a delete) must still succeed, since the device is gone. This failed
/// NodeUnstageVolume re-driven by the manager's recovery in the SIGKILL soak.
#[test]
fn a_loop_device_gone_before_its_detach_counts_as_detached() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging").display().to_string();
    let p = open(dir.path(), 1 << 30);
    let mut r = create("l", 16 << 20, mount_cap());
    r.parameters.insert("backend".into(), "loop".into());
    let id = p.create_volume(&r).unwrap().volume_id;
    let st = StageVolume {
        volume_id: id.clone(),
        staging_target_path: staging.clone(),
        capability: mount_cap(),
    };
    p.stage_volume(&st).unwrap();
    lock(&p.host.state).vanished_detaches = 1;
    p.unstage_volume(&id, &staging).unwrap();
    assert!(lock(&p.host.state).loops.is_empty());
    assert!(lock(&p.volumes)[&id].staged.is_none());
    // The same for a delete, which detaches what is left on the image (here a device
    // still listed while its AUTOCLEAR is pending) before removing it.
    let image = p.layout.backing(&lock(&p.volumes)[&id]);
    {
        let mut s = lock(&p.host.state);
        s.loops.insert(PathBuf::from("/dev/fakeloop9"), image);
        s.vanished_detaches = 1;
    }
    p.delete_volume(&id).unwrap();
}

#[test]
fn loop_volume_is_formatted_once_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging").display().to_string();
    let host_state;
    let id;
    {
        let p = open(dir.path(), 1 << 30);
        let mut r = create("l", 16 << 20, mount_cap());
        r.parameters.insert("backend".into(), "loop".into());
        id = p.create_volume(&r).unwrap().volume_id;
        let st = StageVolume {
            volume_id: id.clone(),
            staging_target_path: staging.clone(),
            capability: mount_cap(),
        };
        p.stage_volume(&st).unwrap();
        p.unstage_volume(&id, &staging).unwrap();
        p.stage_volume(&st).unwrap();
        let s = lock(&p.host.state);
        assert_eq!(s.mkfs_calls, 1);
        host_state = s.formatted.clone();
    }
    // A new process with a fresh host (reboot): the fs is still on the image.
    let p = open(dir.path(), 1 << 30);
    lock(&p.host.state).formatted = host_state;
    p.stage_volume(&StageVolume {
        volume_id: id.clone(),
        staging_target_path: staging.clone(),
        capability: mount_cap(),
    })
    .unwrap();
    assert_eq!(lock(&p.host.state).mkfs_calls, 0);
    let (size, node) = p
        .controller_expand_volume(
            &id,
            Some(CapacityRange {
                required_bytes: 32 << 20,
                limit_bytes: 0,
            }),
            None,
        )
        .unwrap();
    assert_eq!((size, node), (32 << 20, true));
    assert_eq!(
        p.node_expand_volume(&id, &staging, None, None).unwrap(),
        32 << 20
    );
    assert_eq!(
        p.controller_expand_volume(
            &id,
            Some(CapacityRange {
                required_bytes: 2 << 30,
                limit_bytes: 0
            }),
            None
        )
        .unwrap_err()
        .code(),
        tonic::Code::OutOfRange
    );
}

#[test]
fn imports_are_listed_with_deterministic_ids() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    fs::create_dir_all(dir.path().join("import/dir/data1")).unwrap();
    fs::create_dir_all(dir.path().join("import/dir/bad name")).unwrap();
    let img = fs::File::create(dir.path().join("import/loop/disk.img")).unwrap();
    img.set_len(64 << 20).unwrap();
    let page = p.list_volumes(0, "").unwrap();
    let ids: Vec<_> = page.entries.iter().map(|e| e.volume_id.as_str()).collect();
    assert_eq!(ids, ["import-dir-data1", "import-loop-disk"]);
    assert_eq!(page.entries[1].capacity_bytes, 64 << 20);
    // Imports do not consume pool capacity.
    assert_eq!(
        p.get_capacity(&[], &HashMap::new())
            .unwrap()
            .available_capacity,
        1 << 30
    );
    p.delete_volume("import-dir-data1").unwrap();
    assert!(!dir.path().join("import/dir/data1").exists());
    // A request may name an import before any listing has seen it.
    fs::create_dir_all(dir.path().join("import/dir/late")).unwrap();
    p.delete_volume("import-dir-late").unwrap();
    assert!(!dir.path().join("import/dir/late").exists());
}

/// Concurrent stages of different volumes (each under its own volume lock) must not
/// together exceed `max_volumes_per_node`, nor share one staging path.
#[test]
fn concurrent_stages_respect_the_node_limit_and_path_ownership() {
    const N: usize = 8;
    // Stages N volumes at once, each at `path(i)`, and counts the successes.
    fn race(limit: u64, path: impl Fn(usize) -> String + Sync) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path(), 1 << 30);
        cfg.max_volumes_per_node = limit;
        let p = Plugin::open(&cfg, FakeHost::default()).unwrap();
        let ids: Vec<String> = (0..N)
            .map(|i| {
                p.create_volume(&create(&format!("v{i}"), 1 << 20, mount_cap()))
                    .unwrap()
                    .volume_id
            })
            .collect();
        let barrier = std::sync::Barrier::new(N);
        std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let (p, barrier, path) = (&p, &barrier, &path);
                    s.spawn(move || {
                        barrier.wait();
                        p.stage_volume(&StageVolume {
                            volume_id: id.clone(),
                            staging_target_path: path(i),
                            capability: mount_cap(),
                        })
                        .is_ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().unwrap().then_some(()))
                .count()
        })
    }
    let base = tempfile::tempdir().unwrap();
    let at = |name: String| base.path().join(name).display().to_string();
    for round in 0..4 {
        let staged = race(1, |i| at(format!("r{round}-{i}")));
        assert_eq!(staged, 1, "limit 1, round {round}: {staged} staged");
        let staged = race(0, |_| at(format!("shared-{round}")));
        assert_eq!(staged, 1, "one path, round {round}: {staged} staged");
    }
}

/// A scan that saw an import before a concurrent DeleteVolume removed it must not
/// bring the deleted volume back as a ghost record.
#[test]
fn an_import_deleted_during_a_scan_is_not_adopted_again() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    fs::create_dir_all(dir.path().join("import/dir/data")).unwrap();
    p.lookup("import-dir-data").unwrap();
    let seen = p.scan_imports();
    p.delete_volume("import-dir-data").unwrap();
    p.adopt_found(seen);
    assert_eq!(
        p.lookup("import-dir-data").unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert!(!dir.path().join("meta/import-dir-data.json").exists());
}

#[test]
fn capacity_honours_capabilities_and_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let mut params = HashMap::new();
    params.insert("backend".to_owned(), "dir".to_owned());
    assert_eq!(
        p.get_capacity(&[block_cap()], &params)
            .unwrap()
            .available_capacity,
        0
    );
    params.insert("pool".to_owned(), "elsewhere".to_owned());
    assert_eq!(p.get_capacity(&[], &params).unwrap().available_capacity, 0);
    let c = p.get_capacity(&[block_cap()], &HashMap::new()).unwrap();
    assert_eq!(c.available_capacity, 1 << 30);
    assert_eq!(c.minimum_volume_size, Some(to_i64(MIN_BLOCK_SIZE)));
    params.clear();
    params.insert("backend".to_owned(), "tape".to_owned());
    assert_eq!(
        p.get_capacity(&[], &params).unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[test]
fn validate_capabilities_confirms_only_what_the_volume_serves() {
    let dir = tempfile::tempdir().unwrap();
    let p = open(dir.path(), 1 << 30);
    let v = p.create_volume(&create("a", 1 << 20, mount_cap())).unwrap();
    let none = HashMap::new();
    assert_eq!(
        p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &none, &none)
            .unwrap(),
        Validation::Confirmed
    );
    assert_eq!(
        p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &v.volume_context, &none)
            .unwrap(),
        Validation::Confirmed
    );
    let mut stale = v.volume_context.clone();
    stale.insert("backend".into(), "loop".into());
    assert!(matches!(
        p.validate_volume_capabilities(&v.volume_id, &[mount_cap()], &stale, &none)
            .unwrap(),
        Validation::Unconfirmed(_)
    ));
    assert!(matches!(
        p.validate_volume_capabilities(&v.volume_id, &[block_cap()], &none, &none)
            .unwrap(),
        Validation::Unconfirmed(_)
    ));
    assert_eq!(
        p.validate_volume_capabilities("vol-x", &[mount_cap()], &none, &none)
            .unwrap_err()
            .code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        p.validate_volume_capabilities(&v.volume_id, &[], &none, &none)
            .unwrap_err()
            .code(),
        tonic::Code::InvalidArgument
    );
}
