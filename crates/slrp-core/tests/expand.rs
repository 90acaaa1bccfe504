//! Growing a volume and creating one from a source (issue #24): what the manager sends,
//! what it refuses before sending anything, and what stays owed. The crash matrix
//! (`crash.rs`, `Op::Expand`) covers every crash point of an expansion.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use slrp_core::volume::*;
use slrp_csi::{Code, CsiRpc};
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

const GIB: i64 = 1 << 30;

fn expanding(node_expansion_required: bool) -> Arc<FakeCsi> {
    let fake = FakeCsi::new(expanding_caps());
    fake.st().node_expansion_required = node_expansion_required;
    fake
}

async fn record(m: &Running, id: &VolumeId) -> VolumeRecord {
    m.handle
        .volumes()
        .await
        .unwrap()
        .into_iter()
        .find(|r| &r.id == id)
        .unwrap()
}

#[tokio::test]
async fn a_published_volume_grows_on_the_controller_and_the_node() {
    let h = Harness::new(expanding(true));
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();

    let grown = m.handle.expand(&v.id, 2 * GIB).await.unwrap();
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    let fv = h.fake.volume(&v.id).unwrap();
    assert_eq!((fv.capacity, fv.fs_bytes), (2 * GIB, 2 * GIB));
    let rec = record(&m, &v.id).await;
    assert_eq!(rec.expansion, None);
    assert_eq!(rec.expanded_bytes, Some(2 * GIB));
    m.stop().await.unwrap();
    // Durable as answered.
    let stored = h.stored();
    assert_eq!(stored[0].expanded_bytes, Some(2 * GIB));
    assert_eq!(stored[0].capacity_bytes, 2 * GIB);
}

#[tokio::test]
async fn node_expansion_of_a_volume_not_published_waits_for_its_next_publish() {
    let h = Harness::new(expanding(true));
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();

    m.handle.expand(&v.id, 2 * GIB).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::NodeExpandVolume), 0);
    let rec = record(&m, &v.id).await;
    assert_eq!(
        rec.expansion,
        Some(Expansion {
            target_bytes: 2 * GIB,
            node_owed: true
        })
    );
    // Owed across a restart too: recovery does not publish a volume for it.
    m.stop().await.unwrap();
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::NodeExpandVolume), 0);
    assert_eq!(h.fake.volume(&v.id).unwrap().published, None);

    m.handle.publish(&v.id).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::NodeExpandVolume), 1);
    assert_eq!(h.fake.volume(&v.id).unwrap().fs_bytes, 2 * GIB);
    assert_eq!(record(&m, &v.id).await.expansion, None);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn refusals_send_nothing() {
    // No EXPAND_VOLUME anywhere.
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let e = m.handle.expand(&v.id, 2 * GIB).await.unwrap_err();
    assert!(matches!(e, VolumeError::CannotExpand { .. }), "{e}");
    assert!(e.to_string().contains("EXPAND_VOLUME"), "{e}");
    m.stop().await.unwrap();

    // Smaller than the volume.
    let h = Harness::new(expanding(false));
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let e = m.handle.expand(&v.id, 1 << 19).await.unwrap_err();
    assert!(e.to_string().contains("do not shrink"), "{e}");
    assert_eq!(e.kind(), VolumeErrorKind::Invalid);
    // Unknown volume.
    let e = m
        .handle
        .expand(&VolumeId::new("nope"), 2 * GIB)
        .await
        .unwrap_err();
    assert!(matches!(e, VolumeError::UnknownVolume { .. }), "{e}");
    assert_eq!(h.fake.calls(CsiRpc::ControllerExpandVolume), 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn an_offline_plugin_grows_only_a_volume_not_in_use() {
    let mut caps = expanding_caps();
    caps.plugin.expansion_online = false;
    caps.plugin.expansion_offline = true;
    let h = Harness::new(FakeCsi::new(caps));
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    let e = m.handle.expand(&v.id, 2 * GIB).await.unwrap_err();
    assert!(matches!(e, VolumeError::ExpandOffline { .. }), "{e}");
    assert!(e.to_string().contains("unpublish it first"), "{e}");
    assert_eq!(h.fake.calls(CsiRpc::ControllerExpandVolume), 0);
    // slrp's unpublish stops at NODE_READY, still attached (ControllerPublished) with
    // this plugin: only a volume that was never published is offline here.
    let w = m.handle.create(create_req("op-2")).await.unwrap();
    m.handle.expand(&w.id, 2 * GIB).await.unwrap();
    assert_eq!(h.fake.volume(&w.id).unwrap().capacity, 2 * GIB);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_expansion_is_dropped_and_a_transient_one_kept() {
    let h = Harness::new(expanding(false));
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();

    // The plugin has no room: refused for good, nothing owed.
    let e = m.handle.expand(&v.id, 1 << 41).await.unwrap_err();
    assert_eq!(e.kind(), VolumeErrorKind::Rejected, "{e}");
    let rec = record(&m, &v.id).await;
    assert_eq!((rec.expansion, rec.expanded_bytes), (None, None));

    // Lost answers until the retry policy gives up: kept, and the next start finishes.
    h.fake
        .fail_after_effect(CsiRpc::ControllerExpandVolume, Code::Unavailable, 1000);
    let cfg = {
        let mut cfg = h.config();
        cfg.retry = slrp_csi::RetryConfig::none();
        cfg
    };
    m.stop().await.unwrap();
    let m = h.start_with(cfg);
    within(m.handle.ready()).await.unwrap();
    let e = m.handle.expand(&v.id, 2 * GIB).await.unwrap_err();
    assert_eq!(e.kind(), VolumeErrorKind::Unavailable, "{e}");
    assert_eq!(
        record(&m, &v.id).await.expansion,
        Some(Expansion {
            target_bytes: 2 * GIB,
            node_owed: false
        })
    );
    m.stop().await.unwrap();
    h.fake.st().faults.clear();
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    // Recovery runs it in the background of readiness.
    volumes_until(&m.handle, |v| {
        v.iter()
            .all(|r| r.expansion.is_none() && r.expanded_bytes == Some(2 * GIB))
    })
    .await;
    assert_eq!(h.fake.volume(&v.id).unwrap().capacity, 2 * GIB);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_content_source_the_plugin_cannot_take_is_refused_by_name() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    for (source, capability) in [
        (
            slrp_csi::ContentSource::Snapshot("snap-1".into()),
            "CREATE_DELETE_SNAPSHOT",
        ),
        (
            slrp_csi::ContentSource::Volume(VolumeId::new("vol-1")),
            "CLONE_VOLUME",
        ),
    ] {
        let mut req = create_req("op-1");
        req.content_source = Some(source);
        let e = m.handle.create(req).await.unwrap_err();
        assert!(e.to_string().contains(capability), "{e}");
    }
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 0);
    m.stop().await.unwrap();
    assert!(
        h.stored_intents().is_empty(),
        "no intent for a refused create"
    );
}
