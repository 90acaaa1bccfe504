//! Full volume lifecycles against the real binary, with real mounts and loop devices, and a
//! kill -9 of the plugin in the middle: create → stage → publish → write → crash/restart →
//! verify → unpublish → unstage → restage/republish (data kept, no reformat) → delete.

// An integration test crate is test code throughout: helpers fail by panicking, and the
// tests need no `mod tests` wrapper (the lint targets test code hidden in src/).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::*;
use slrp_proto::csi::{v0, v1};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Mount,
    Block,
}

async fn lifecycle_v1(
    p: &mut TestPlugin,
    cap: v1::VolumeCapability,
    params: &[(&str, &str)],
    kind: Kind,
) {
    let mut c = p.v1().await;
    let vol = c
        .controller
        .create_volume(create_req("life", 32 * MIB, cap.clone(), params))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(vol.capacity_bytes >= 32 * MIB);
    let staging = p.path_str("staging");
    std::fs::create_dir(&staging).unwrap();
    std::fs::create_dir(p.path("pods")).unwrap();
    let target = p.path_str("pods/target");
    let stage = v1::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.clone(),
        volume_capability: Some(cap.clone()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    };
    let publish = v1::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.clone(),
        target_path: target.clone(),
        volume_capability: Some(cap.clone()),
        readonly: false,
        ..Default::default()
    };
    c.node.node_stage_volume(stage.clone()).await.unwrap();
    c.node.node_publish_volume(publish.clone()).await.unwrap();

    let payload = b"slrp-csi-local survives restarts";
    match kind {
        Kind::Mount => {
            let mut f = std::fs::File::create(p.path("pods/target/hello.txt")).unwrap();
            f.write_all(payload).unwrap();
            f.sync_all().unwrap();
        }
        Kind::Block => {
            let md = std::fs::metadata(&target).unwrap();
            use std::os::unix::fs::FileTypeExt;
            assert!(
                md.file_type().is_block_device(),
                "target is not a block device"
            );
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .unwrap();
            f.seek(SeekFrom::Start(4096)).unwrap();
            f.write_all(payload).unwrap();
            f.sync_all().unwrap();
        }
    }

    p.crash_and_restart().await;
    let mut c = p.v1().await;
    let listed = c
        .controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 1);
    // Repeats after the restart are idempotent.
    c.node.node_stage_volume(stage.clone()).await.unwrap();
    c.node.node_publish_volume(publish.clone()).await.unwrap();
    if kind == Kind::Mount {
        let stats = c
            .node
            .node_get_volume_stats(v1::NodeGetVolumeStatsRequest {
                volume_id: vol.volume_id.clone(),
                volume_path: target.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(stats.usage.len(), 2);
        let cond = stats.volume_condition.unwrap();
        assert!(!cond.abnormal, "{}", cond.message);
    }

    let unpublish = v1::NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: target.clone(),
    };
    let unstage = v1::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.clone(),
    };
    c.node
        .node_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    assert!(
        !std::path::Path::new(&target).exists(),
        "target not removed"
    );
    c.node
        .node_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    c.node.node_unstage_volume(unstage.clone()).await.unwrap();
    c.node.node_unstage_volume(unstage.clone()).await.unwrap();
    assert!(
        p.mounts_here().is_empty(),
        "mounts left: {:?}",
        p.mounts_here()
    );
    let loops = p.loops_after_release().await;
    assert!(loops.is_empty(), "loop devices left: {loops:?}");

    // Stage and publish again: the data is still there (a loop volume is not reformatted).
    c.node.node_stage_volume(stage).await.unwrap();
    c.node.node_publish_volume(publish).await.unwrap();
    let mut got = vec![0u8; payload.len()];
    match kind {
        Kind::Mount => {
            got = std::fs::read(p.path("pods/target/hello.txt")).unwrap();
        }
        Kind::Block => {
            let mut f = std::fs::File::open(&target).unwrap();
            f.seek(SeekFrom::Start(4096)).unwrap();
            f.read_exact(&mut got).unwrap();
        }
    }
    assert_eq!(got, payload);
    assert_code(
        c.controller
            .delete_volume(v1::DeleteVolumeRequest {
                volume_id: vol.volume_id.clone(),
                ..Default::default()
            })
            .await,
        tonic::Code::FailedPrecondition,
    );
    c.node.node_unpublish_volume(unpublish).await.unwrap();
    c.node.node_unstage_volume(unstage).await.unwrap();
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let listed = c
        .controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
    assert!(p.mounts_here().is_empty());
    assert!(p.loops_after_release().await.is_empty());
    let leftovers: Vec<_> = ["root/volumes/dir", "root/volumes/loop"]
        .iter()
        .flat_map(|d| std::fs::read_dir(p.path(d)).unwrap())
        .collect();
    assert!(leftovers.is_empty(), "backing storage left: {leftovers:?}");
}

#[tokio::test]
async fn dir_mount_lifecycle_with_restart() {
    if !can_mount("dir_mount_lifecycle_with_restart") {
        return;
    }
    let mut p = TestPlugin::start(&[]).await;
    lifecycle_v1(&mut p, mount_cap(""), &[], Kind::Mount).await;
}

#[tokio::test]
async fn loop_ext4_mount_lifecycle_with_restart() {
    if !can_mount("loop_ext4_mount_lifecycle_with_restart") {
        return;
    }
    let mut p = TestPlugin::start(&[]).await;
    lifecycle_v1(
        &mut p,
        mount_cap("ext4"),
        &[("backend", "loop")],
        Kind::Mount,
    )
    .await;
}

#[tokio::test]
async fn loop_xfs_mount_lifecycle_with_restart() {
    if !can_mount("loop_xfs_mount_lifecycle_with_restart") {
        return;
    }
    if !slrp_test_support::require_tool("loop_xfs_mount_lifecycle_with_restart", "mkfs.xfs") {
        return;
    }
    let mut p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    // xfs needs at least 300 MiB; a smaller request is rounded up to the minimum.
    let vol = c
        .controller
        .create_volume(create_req(
            "x",
            32 * MIB,
            mount_cap("xfs"),
            &[("backend", "loop")],
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.capacity_bytes, 300 * MIB);
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: vol.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    lifecycle_v1(
        &mut p,
        mount_cap("xfs"),
        &[("backend", "loop")],
        Kind::Mount,
    )
    .await;
}

#[tokio::test]
async fn loop_block_lifecycle_with_restart() {
    if !can_mount("loop_block_lifecycle_with_restart") {
        return;
    }
    let mut p = TestPlugin::start(&[]).await;
    lifecycle_v1(&mut p, block_cap(), &[], Kind::Block).await;
}

#[tokio::test]
async fn readonly_publish_is_read_only() {
    if !can_mount("readonly_publish_is_read_only") {
        return;
    }
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let vol = c
        .controller
        .create_volume(create_req("ro", MIB, mount_cap(""), &[]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = p.path_str("staging");
    let target = p.path_str("target");
    c.node
        .node_stage_volume(v1::NodeStageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(mount_cap("")),
            ..Default::default()
        })
        .await
        .unwrap();
    c.node
        .node_publish_volume(v1::NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.clone(),
            target_path: target.clone(),
            volume_capability: Some(mount_cap("")),
            readonly: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let err = std::fs::write(p.path("target/x"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS));
    // The staging path stays writable.
    std::fs::write(p.path("staging/y"), b"y").unwrap();
    c.node
        .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            target_path: target,
        })
        .await
        .unwrap();
    c.node
        .node_unstage_volume(v1::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id,
            staging_target_path: staging,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn loop_volume_expands_online() {
    if !can_mount("loop_volume_expands_online") {
        return;
    }
    // Online ext4 growth needs CAP_SYS_RESOURCE (containers often drop it); xfs does not.
    let (fs, small, big) = if has_tool("mkfs.xfs") {
        ("xfs", 320 * MIB, 640 * MIB)
    } else if has_cap_sys_resource() {
        ("ext4", 32 * MIB, 128 * MIB)
    } else {
        let _ = slrp_test_support::require(
            "loop_volume_expands_online",
            "mkfs.xfs, or CAP_SYS_RESOURCE for online ext4 resize",
            false,
        );
        return;
    };
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let cap = mount_cap(fs);
    let vol = c
        .controller
        .create_volume(create_req(
            "grow",
            small,
            cap.clone(),
            &[("backend", "loop")],
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = p.path_str("staging");
    let target = p.path_str("target");
    c.node
        .node_stage_volume(v1::NodeStageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    c.node
        .node_publish_volume(v1::NodePublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.clone(),
            target_path: target.clone(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let total = |c: &mut V1| {
        let req = v1::NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.clone(),
            ..Default::default()
        };
        let mut node = c.node.clone();
        async move {
            node.node_get_volume_stats(req)
                .await
                .unwrap()
                .into_inner()
                .usage[0]
                .total
        }
    };
    let before = total(&mut c).await;
    let resp = c
        .controller
        .controller_expand_volume(v1::ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes: big,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.capacity_bytes, big);
    assert!(resp.node_expansion_required);
    let node = c
        .node
        .node_expand_volume(v1::NodeExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.clone(),
            capacity_range: Some(v1::CapacityRange {
                required_bytes: big,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.capacity_bytes, big);
    let after = total(&mut c).await;
    assert!(
        after > before + (big - small) / 2,
        "file system did not grow: {before} -> {after}"
    );
    c.node
        .node_unpublish_volume(v1::NodeUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            target_path: target,
        })
        .await
        .unwrap();
    c.node
        .node_unstage_volume(v1::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id,
            staging_target_path: staging,
        })
        .await
        .unwrap();
}

fn v0_cap(block: bool) -> v0::VolumeCapability {
    use v0::volume_capability::{
        AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
    };
    v0::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        }),
    }
}

#[tokio::test]
async fn v0_lifecycle_with_restart() {
    if !can_mount("v0_lifecycle_with_restart") {
        return;
    }
    let mut p = TestPlugin::start(&["--csi-version", "v0"]).await;
    let mut c = p.v0().await;
    let info = c
        .identity
        .get_plugin_info(v0::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "io.slrp.csi-local");
    #[allow(deprecated)] // CSI 0.3 deprecates NodeGetId, but 0.2 COs (Mesos) call it.
    let id = c
        .node
        .node_get_id(v0::NodeGetIdRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(id.node_id, "test-node");
    for block in [false, true] {
        let vol = c
            .controller
            .create_volume(v0::CreateVolumeRequest {
                name: format!("v0-{block}"),
                capacity_range: Some(v0::CapacityRange {
                    required_bytes: 16 * MIB,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![v0_cap(block)],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        let staging = p.path_str(&format!("staging-{block}"));
        let target = p.path_str(&format!("target-{block}"));
        c.node
            .node_stage_volume(v0::NodeStageVolumeRequest {
                volume_id: vol.id.clone(),
                staging_target_path: staging.clone(),
                volume_capability: Some(v0_cap(block)),
                ..Default::default()
            })
            .await
            .unwrap();
        c.node
            .node_publish_volume(v0::NodePublishVolumeRequest {
                volume_id: vol.id.clone(),
                staging_target_path: staging.clone(),
                target_path: target.clone(),
                volume_capability: Some(v0_cap(block)),
                ..Default::default()
            })
            .await
            .unwrap();
        if !block {
            std::fs::write(p.path(&format!("target-{block}/f")), b"v0").unwrap();
        }
        p.crash_and_restart().await;
        c = p.v0().await;
        if !block {
            assert_eq!(
                std::fs::read(p.path(&format!("target-{block}/f"))).unwrap(),
                b"v0"
            );
        }
        c.node
            .node_unpublish_volume(v0::NodeUnpublishVolumeRequest {
                volume_id: vol.id.clone(),
                target_path: target,
            })
            .await
            .unwrap();
        c.node
            .node_unstage_volume(v0::NodeUnstageVolumeRequest {
                volume_id: vol.id.clone(),
                staging_target_path: staging,
            })
            .await
            .unwrap();
        c.controller
            .delete_volume(v0::DeleteVolumeRequest {
                volume_id: vol.id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert!(p.mounts_here().is_empty());
    assert!(p.loops_after_release().await.is_empty());
}

/// A symlink planted at a staging or target path must not redirect a mount: the plugin would
/// otherwise bind-mount the volume (or the loop device) over whatever the link points to,
/// and a later unpublish would unmount a foreign mount the link points to.
#[tokio::test]
async fn symlinks_at_staging_and_target_paths_are_refused() {
    if !can_mount("symlinks_at_staging_and_target_paths_are_refused") {
        return;
    }
    let p = TestPlugin::start(&[]).await;
    let mut c = p.v1().await;
    let victim = p.path("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("precious"), b"x").unwrap();
    // A directory with a mount of its own, which an unpublish must never unmount.
    let mounted = p.path("mounted");
    std::fs::create_dir(&mounted).unwrap();
    std::fs::create_dir(p.path("mounted-src")).unwrap();
    nix::mount::mount(
        Some(&p.path("mounted-src")),
        &mounted,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let victim_file = p.path("victim-file");
    std::fs::write(&victim_file, b"secret").unwrap();
    let is_mounted = |path: &std::path::Path| {
        let canonical = std::fs::canonicalize(path).unwrap();
        p.mounts_here().contains(&canonical)
    };
    let link = |to: &std::path::Path, name: &str| {
        std::os::unix::fs::symlink(to, p.path(name)).unwrap();
        p.path_str(name)
    };

    let mut volumes = Vec::new();
    for (name, cap) in [("sym", mount_cap("")), ("sym-blk", block_cap())] {
        let req = create_req(name, MIB, cap.clone(), &[]);
        let vol = c.controller.create_volume(req).await.unwrap();
        volumes.push((vol.into_inner().volume.unwrap().volume_id, cap));
    }
    let (vol, mount) = &volumes[0];
    let res = c
        .node
        .node_stage_volume(stage_req(
            vol,
            &link(&victim, "staging-link"),
            mount.clone(),
        ))
        .await;
    assert_code(res, tonic::Code::InvalidArgument);
    assert!(!is_mounted(&victim), "staging followed the symlink");

    let targets = [
        (&volumes[0], link(&victim, "target-link")),
        (&volumes[0], link(&mounted, "target-link2")),
        (&volumes[1], link(&victim_file, "blk-link")),
    ];
    for ((vol, cap), target) in targets {
        let staging = p.path_str(&format!("staging-{vol}"));
        c.node
            .node_stage_volume(stage_req(vol, &staging, cap.clone()))
            .await
            .unwrap();
        let res = c
            .node
            .node_publish_volume(publish_req(vol, &staging, &target, cap.clone()))
            .await;
        assert_code(res, tonic::Code::InvalidArgument);
        c.node
            .node_unpublish_volume(unpublish_req(vol, &target))
            .await
            .unwrap();
        c.node
            .node_unstage_volume(unstage_req(vol, &staging))
            .await
            .unwrap();
    }
    assert!(!is_mounted(&victim), "publishing followed the symlink");
    assert!(
        !is_mounted(&victim_file),
        "block publish followed the symlink"
    );
    assert!(is_mounted(&mounted), "a foreign mount was unmounted");
    assert!(victim.join("precious").exists());
    assert_eq!(std::fs::read(&victim_file).unwrap(), b"secret");
    nix::mount::umount2(&mounted, nix::mount::MntFlags::empty()).unwrap();
}
