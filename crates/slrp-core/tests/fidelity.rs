//! Mesos fidelity of the volume manager, with the in-memory [`FakeCsi`]: target-path
//! post-checks and who creates the target, read-only flags, failed versus interrupted
//! deletions, cleanup before deletion, CreateVolume intents, validation that compares.
//!
//! Real time (the store commits on its own thread, see `manager.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use slrp_core::volume::*;
use support::*;

fn state_of(recs: &[VolumeRecord], id: &VolumeId) -> StateName {
    recs.iter().find(|r| &r.id == id).unwrap().state.name()
}

// === item 7: target paths ===

#[tokio::test]
async fn a_publish_that_created_no_target_fails_with_mesos_text_and_stays_in_flight() {
    let h = Harness::new(FakeCsi::full());
    h.fake.st().forget_target = true;
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let err = m.handle.publish(&v.id).await.unwrap_err();
    let target = h.paths().target(&v.id).unwrap();
    assert_eq!(
        err.to_string(),
        format!("Target path '{}' not created", target.display())
    );
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(state_of(&recs, &v.id), StateName::NodePublish);
    assert!(!recs[0].node_publish_required);
    // A plugin that does its job next time: the publish is driven again.
    h.fake.st().forget_target = false;
    assert_eq!(m.handle.publish(&v.id).await.unwrap(), target);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn an_unpublish_that_left_the_target_of_a_v1_plugin_fails_and_stays_in_flight() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    h.fake.st().leave_target = true;
    let err = m.handle.unpublish(&v.id).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Target path '{}' not removed", target.display())
    );
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(state_of(&recs, &v.id), StateName::NodeUnpublish);
    h.fake.st().leave_target = false;
    std::fs::remove_dir(&target).unwrap();
    m.handle.unpublish(&v.id).await.unwrap();
    m.stop().await.unwrap();
}

#[tokio::test]
async fn the_target_is_created_by_the_manager_only_for_plugins_that_expect_it() {
    // A CSI 0.x plugin: the CO creates the target and the plugin leaves it in place.
    let h = Harness::new(FakeCsi::full());
    h.fake.st().co_creates_target = true;
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    assert!(target.is_dir());
    m.handle.unpublish(&v.id).await.unwrap();
    assert!(
        target.is_dir(),
        "left for the CO, and no 'not removed' check"
    );
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();

    // The same plugin driven as a v1 plugin: the manager makes only the parent.
    let cfg = h
        .config()
        .max_concurrent(1)
        .mounts(std::sync::Arc::new(FakeMounts(h.fake.clone())));
    let cfg = VolumeManagerConfig {
        target_path: TargetPath::PluginCreates,
        ..cfg
    };
    let m = h.start_with(cfg);
    m.handle.ready().await.unwrap();
    let w = m.handle.create(create_req("op-2")).await.unwrap();
    let err = m.handle.publish(&w.id).await.unwrap_err();
    assert!(matches!(err, VolumeError::Csi { .. }), "{err}");
    assert!(!h.paths().target(&w.id).unwrap().exists());
    assert!(h.paths().volume_dir(&w.id).unwrap().is_dir());
    m.stop().await.unwrap();

    assert_eq!(
        TargetPath::for_plugin(slrp_csi::CsiVersion::V0, false),
        TargetPath::CoCreates
    );
    assert_eq!(
        TargetPath::for_plugin(slrp_csi::CsiVersion::V1, true),
        TargetPath::CoCreates
    );
    assert_eq!(
        TargetPath::for_plugin(slrp_csi::CsiVersion::V1, false),
        TargetPath::PluginCreates
    );
}
