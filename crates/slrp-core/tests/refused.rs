//! CreateVolume answers that are refused (by the CSI client, or by the manager for an id
//! that cannot name a mount directory) end settled: the plugin's volume deleted by the id
//! it gave, or recorded as left in the plugin when there is none; the name never created
//! again; a failed deletion retried in the background and at the next start, never a
//! CreateVolume. The crash matrix (`tests/crash.rs`, `Op::CreateRefused`) covers the
//! crash points.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::{Code, CsiRpc};
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

fn refusal(result: Result<VolumeInfo, VolumeError>) -> RefusedCreate {
    match result {
        Err(VolumeError::CreateRefused { refusal, .. }) => *refusal,
        other => panic!("not a refused create: {other:?}"),
    }
}

#[tokio::test]
async fn a_refused_answer_deletes_the_volume_and_the_name_is_never_created_again() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let r = refusal(m.handle.create(refused_create_req("op-1", "id")).await);
    assert_eq!(r.rule, "above_limit");
    assert_eq!(
        r.cleanup,
        RefusedCleanup::Deleted {
            volume_id: VolumeId::new("vol-1")
        }
    );
    assert!(h.fake.ids().is_empty());
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 1);
    // Whoever asks again, nothing is sent: the plugin would make the same volume.
    let again = refusal(m.handle.create(create_req("op-1")).await);
    assert_eq!(again, r);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    assert_eq!(m.handle.refused_creates().await.unwrap(), vec![r.clone()]);
    assert!(m.handle.volumes().await.unwrap().is_empty());
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
    assert_eq!(h.stored_refusals(), vec![r]);
}

#[tokio::test]
async fn a_refused_answer_without_a_usable_id_is_recorded_as_left_in_the_plugin() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let r = refusal(m.handle.create(refused_create_req("op-1", "no_id")).await);
    assert_eq!(r.cleanup, RefusedCleanup::Orphaned);
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
    assert_eq!(h.fake.ids().len(), 1, "nothing to delete it by");
    let text = VolumeError::CreateRefused {
        name: "op-1".into(),
        refusal: Box::new(r),
    }
    .to_string();
    assert!(
        text.contains("whatever it created is left in the plugin"),
        "{text}"
    );
    m.stop().await.unwrap();
    // A restart neither deletes nor creates anything for it.
    let m = h.start();
    let report = within(m.handle.ready()).await.unwrap();
    assert_eq!((report.intents, report.refused_deletions), (0, 0));
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_deletion_is_retried_in_the_background_never_a_create() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start_with(h.config().intent_retry(Duration::from_millis(20)));
    within(m.handle.ready()).await.unwrap();
    h.fake
        .fail(CsiRpc::DeleteVolume, Code::FailedPrecondition, 2);
    let r = refusal(m.handle.create(refused_create_req("op-1", "id")).await);
    let RefusedCleanup::Deleting {
        last_error: Some(error),
        ..
    } = &r.cleanup
    else {
        panic!("{r:?}");
    };
    assert!(error.contains("FailedPrecondition"), "{error}");
    // Two failures, then the background retry deletes it; the job that did is let
    // finish by the stop (its commit is in the shutdown grace).
    until(|| h.fake.ids().is_empty()).await;
    m.stop().await.unwrap();
    let all = h.stored_refusals();
    assert!(
        matches!(all[0].cleanup, RefusedCleanup::Deleted { .. }),
        "{all:?}"
    );
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 3);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
}

#[tokio::test]
async fn a_deletion_still_owed_at_a_restart_is_done_by_recovery() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    h.fake.fail(CsiRpc::DeleteVolume, Code::Unavailable, 1);
    let r = refusal(m.handle.create(refused_create_req("op-1", "id")).await);
    assert!(r.cleanup.is_pending(), "{r:?}");
    m.stop().await.unwrap();
    let m = h.start();
    let report = within(m.handle.ready()).await.unwrap();
    assert_eq!(report.refused_deletions, 1);
    assert!(h.fake.ids().is_empty());
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    let all = m.handle.refused_creates().await.unwrap();
    assert!(
        matches!(all[0].cleanup, RefusedCleanup::Deleted { .. }),
        "{all:?}"
    );
    m.stop().await.unwrap();
}

/// An id the client accepts but that cannot name the volume's mount directory (its
/// encoding over 255 bytes) is refused by the manager and settled the same way.
#[tokio::test]
async fn an_id_that_cannot_be_a_directory_name_is_refused_and_deleted() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let long = "x".repeat(300);
    let mut req = create_req("op-1");
    req.parameters.insert("volume_id".into(), long.clone());
    let r = refusal(m.handle.create(req).await);
    assert_eq!(r.rule, "unusable_id");
    assert_eq!(
        r.reason,
        "volume_id encodes to 300 bytes, more than a directory name may have (255)"
    );
    assert_eq!(
        r.cleanup,
        RefusedCleanup::Deleted {
            volume_id: VolumeId::new(long)
        }
    );
    assert!(h.fake.ids().is_empty());
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
}
