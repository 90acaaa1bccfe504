//! Folded commits (issue #21, section 3): a caller that commits the volume manager's
//! intents and record changes in its own transactions, as the provider does with its
//! PENDING and terminal records. The crash matrix (`crash.rs`, the staged ops) covers
//! every crash point; these pin down what the manager does and does not write, and when
//! its memory follows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use slrp_core::volume::*;
use slrp_csi::{Code, CsiRpc};
use slrp_store::Store;
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

async fn stage(store: &Store, f: impl FnOnce(&mut slrp_store::Changes)) {
    let mut tx = store.transaction();
    f(tx.changes());
    tx.commit().await.unwrap();
}

async fn commit(store: &Store, owed: Owed) {
    store.transaction_with(owed.changes).commit().await.unwrap();
    owed.committed.done();
}

async fn tracked(m: &Running) -> Vec<VolumeId> {
    m.handle
        .volumes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect()
}

#[tokio::test]
async fn a_staged_create_and_delete_leave_every_commit_to_the_caller() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let before = store.stats().commits;

    let req = create_req("op-1");
    stage(&store, |c| stage_create(c, &req).unwrap()).await;
    let created = m.handle.create_staged(req).await.unwrap();
    let owed = created.owed.expect("the record is left to the caller");
    // Memory follows disk: not tracked until the caller's commit is done.
    assert!(tracked(&m).await.is_empty());
    commit(&store, owed).await;
    let id = created.value.id.clone();
    volumes_until(&m.handle, |v| v.iter().any(|r| r.id == id)).await;

    stage(&store, |c| stage_delete(c, &id).unwrap()).await;
    let deleted = m.handle.delete_staged(&id).await.unwrap();
    assert!(deleted.value, "deprovisioned");
    let owed = deleted.owed.expect("the removal is left to the caller");
    assert_eq!(
        tracked(&m).await,
        vec![id.clone()],
        "still tracked before the commit"
    );
    commit(&store, owed).await;
    volumes_until(&m.handle, <[VolumeRecord]>::is_empty).await;

    // Two commits per call, both the caller's: none of the manager's own.
    assert_eq!(store.stats().commits - before, 4);
    drop(store);
    m.stop().await.unwrap();
    assert!(h.stored().is_empty());
    assert!(h.stored_intents().is_empty());
    assert!(h.stored_deletions().is_empty());
    assert!(h.fake.ids().is_empty());
}

#[tokio::test]
async fn owed_changes_the_caller_drops_are_committed_by_the_manager() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let req = create_req("op-1");
    stage(&store, |c| stage_create(c, &req).unwrap()).await;
    let created = m.handle.create_staged(req).await.unwrap();
    drop(created.owed);
    let id = created.value.id;
    volumes_until(&m.handle, |v| v.iter().any(|r| r.id == id)).await;
    drop(store);
    m.stop().await.unwrap();
    assert_eq!(h.stored().len(), 1);
    assert!(h.stored_intents().is_empty());
}

#[tokio::test]
async fn a_deletion_intent_without_its_call_is_finished_by_recovery() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    // The caller's PENDING commit, then the process dies before the call.
    stage(&store, |c| stage_delete(c, &v.id).unwrap()).await;
    drop(store);
    m.stop().await.unwrap();

    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    assert!(
        tracked(&m).await.is_empty(),
        "recovery finished the deletion"
    );
    drop(store);
    m.stop().await.unwrap();
    assert!(h.fake.ids().is_empty());
    assert!(h.stored_deletions().is_empty());
    // The published volume was cleaned first, as a marked deletion is.
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 1);
}

#[tokio::test]
async fn a_refused_staged_delete_drops_its_intent_and_keeps_the_volume() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    h.fake
        .fail(CsiRpc::DeleteVolume, Code::FailedPrecondition, 1);
    stage(&store, |c| stage_delete(c, &v.id).unwrap()).await;
    let err = m.handle.delete_staged(&v.id).await.unwrap_err();
    assert!(matches!(err, VolumeError::Csi { .. }), "{err:?}");
    drop(store);
    m.stop().await.unwrap();
    // Nothing deletes it unasked at the next start (Mesos leaves it tracked).
    assert!(h.stored_deletions().is_empty());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    assert_eq!(tracked(&m).await, vec![v.id.clone()]);
    drop(store);
    m.stop().await.unwrap();
    assert_eq!(h.fake.ids(), vec![v.id]);
}

#[tokio::test]
async fn a_staged_create_of_a_tracked_name_drops_its_intent() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let req = create_req("op-1");
    let v = m.handle.create(req.clone()).await.unwrap();
    stage(&store, |c| stage_create(c, &req).unwrap()).await;
    let again = m.handle.create_staged(req).await.unwrap();
    assert_eq!(again.value.id, v.id);
    assert!(again.owed.is_none(), "nothing to record");
    drop(store);
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
    assert_eq!(h.fake.st().created, 1);
}

#[tokio::test]
async fn a_staged_delete_of_an_untracked_volume_drops_its_intent() {
    let h = Harness::new(FakeCsi::full());
    let (m, store) = h.start_sharing(h.config());
    within(m.handle.ready()).await.unwrap();
    let id = VolumeId::new("never-tracked");
    stage(&store, |c| stage_delete(c, &id).unwrap()).await;
    let deleted = m.handle.delete_staged(&id).await.unwrap();
    commit(
        &store,
        deleted
            .owed
            .expect("the intent goes with the caller's commit"),
    )
    .await;
    drop(store);
    m.stop().await.unwrap();
    assert!(h.stored_deletions().is_empty());
}
