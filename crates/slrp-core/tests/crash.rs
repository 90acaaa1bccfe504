//! Crash tests: every durability step and every CSI call of every volume operation is a
//! crash point. For each operation, each fail point and each hit count `k`, the manager
//! is made to die at the `k`-th evaluation of that point (the store's fail points poison
//! the store like a dying process; the manager's own stop it before or after the RPC).
//! Then a fresh manager recovers from the same state directory, the caller retries the
//! operation (as the provider replays an unfinished operation), and the test checks:
//!
//! - recovery leaves no in-flight state, no unfinished deletion and no CreateVolume intent;
//! - the operation converges to its goal;
//! - nothing leaked: the plugin's volumes are exactly the tracked ones;
//! - nothing was created twice: the plugin created exactly one volume;
//! - a CreateVolume answer the client refuses (`Op::CreateRefused`) ends with its volume
//!   deleted, a `RefusedCreate` record and no intent, and the name is never created
//!   again, whatever the crash point.
//!
//! The staged ops (`StagedCreate`, `StagedDelete`) play the provider's folded commits: the
//! test commits the intent in its own transaction, asks with `create_staged` /
//! `delete_staged`, and commits what the manager owes in another, every commit of its own
//! a crash point too (a caller whose commit fails dies with the manager, as the provider
//! process does); after a crash it replays the operation unstaged, as the provider replays
//! a recovered PENDING operation.
//!
//! The enumeration stops for a point once the operation completes without reaching its
//! `k`-th evaluation, so every reachable crash point is covered, whatever the number of
//! commits and calls an operation makes. Fail-point configuration is process-global:
//! nextest runs each test in its own process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use slrp_core::volume::manager::failpoints as vfp;
use slrp_core::volume::*;
use slrp_csi::CsiRpc;
use slrp_store::failpoints as sfp;
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

const POINTS: [&str; 5] = [
    sfp::BATCH_START,
    sfp::BEFORE_COMMIT,
    sfp::AFTER_COMMIT,
    vfp::BEFORE_CALL,
    vfp::AFTER_CALL,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    /// A create whose answer the client refuses after the plugin made the volume.
    CreateRefused,
    Publish,
    Unpublish,
    Delete,
    /// A create whose intent and record the caller commits (folded).
    StagedCreate,
    /// A delete whose intent and the record's removal the caller commits (folded).
    StagedDelete,
    /// Growing a published volume: ControllerExpandVolume, then NodeExpandVolume.
    Expand,
    /// Taking a snapshot of a published volume.
    Snapshot,
    /// Deleting a snapshot.
    DeleteSnapshot,
}

impl Op {
    /// The operation a caller replays after a crash.
    fn replayed(self) -> Self {
        match self {
            Self::StagedCreate => Self::Create,
            Self::StagedDelete => Self::Delete,
            op @ (Self::Create
            | Self::CreateRefused
            | Self::Publish
            | Self::Unpublish
            | Self::Delete
            | Self::Expand
            | Self::Snapshot
            | Self::DeleteSnapshot) => op,
        }
    }
}

/// A caller's own commit failed: it dies with the manager, as the provider process does.
fn caller_died(source: slrp_store::StoreError) -> VolumeError {
    VolumeError::Store {
        subject: Subject::Name(NAME.to_owned()),
        source,
    }
}

/// Commits `changes` as the caller, then tells the manager.
async fn commit_owed(store: &slrp_store::Store, owed: Option<Owed>) -> Result<(), VolumeError> {
    if let Some(owed) = owed {
        let tx = store.transaction_with(owed.changes);
        tx.commit().await.map_err(caller_died)?;
        owed.committed.done();
    }
    Ok(())
}

const NAME: &str = "op-uuid-1";

/// The snapshot name `Op::Snapshot` and `Op::DeleteSnapshot` use.
const SNAPSHOT: &str = "snap-name-1";

/// What `Op::Expand` grows the volume to (it is created with 1 MiB).
const GROWN: i64 = 3 << 30;

/// The plugin of `op`: every capability the manager uses, and for `Op::Expand` online
/// expansion on both services with a file system to grow on the node.
fn plugin(op: Op) -> std::sync::Arc<FakeCsi> {
    match op {
        Op::Expand => {
            let fake = FakeCsi::new(expanding_caps());
            fake.st().node_expansion_required = true;
            fake
        }
        Op::Snapshot | Op::DeleteSnapshot => FakeCsi::new(snapshot_caps()),
        _ => FakeCsi::full(),
    }
}

/// Brings the volume into the state the operation starts from; returns its id.
async fn setup(op: Op, handle: &VolumeManagerHandle) -> Option<VolumeId> {
    if matches!(op, Op::Create | Op::CreateRefused | Op::StagedCreate) {
        return None;
    }
    let v = handle.create(create_req(NAME)).await.unwrap();
    if matches!(
        op,
        Op::Unpublish | Op::Delete | Op::StagedDelete | Op::Expand | Op::Snapshot
    ) {
        handle.publish(&v.id).await.unwrap();
    }
    if op == Op::DeleteSnapshot {
        handle.snapshot(&v.id, SNAPSHOT.to_owned()).await.unwrap();
    }
    Some(v.id)
}

async fn run(
    op: Op,
    m: &Running,
    store: &slrp_store::Store,
    id: Option<&VolumeId>,
) -> Result<(), VolumeError> {
    let handle = &m.handle;
    match op {
        Op::StagedCreate => {
            let req = create_req(NAME);
            let mut tx = store.transaction();
            stage_create(tx.changes(), &req).unwrap();
            tx.commit().await.map_err(caller_died)?;
            let staged = handle.create_staged(req).await?;
            commit_owed(store, staged.owed).await
        }
        Op::StagedDelete => {
            let id = id.unwrap();
            let mut tx = store.transaction();
            stage_delete(tx.changes(), id).unwrap();
            tx.commit().await.map_err(caller_died)?;
            let staged = handle.delete_staged(id).await?;
            commit_owed(store, staged.owed).await
        }
        Op::Create => handle.create(create_req(NAME)).await.map(|_| ()),
        // Settled is done: the refusal is the operation's end, whatever the point.
        Op::CreateRefused => match handle.create(refused_create_req(NAME, "id")).await {
            Err(VolumeError::CreateRefused { refusal, .. }) => {
                assert!(
                    matches!(refusal.cleanup, RefusedCleanup::Deleted { .. }),
                    "{refusal:?}"
                );
                Ok(())
            }
            Ok(v) => panic!("a refused answer created {v:?}"),
            Err(e) => Err(e),
        },
        Op::Publish => handle.publish(id.unwrap()).await.map(|_| ()),
        Op::Unpublish => handle.unpublish(id.unwrap()).await,
        Op::Delete => handle.delete(id.unwrap()).await.map(|_| ()),
        Op::Expand => handle.expand(id.unwrap(), GROWN).await.map(|_| ()),
        Op::Snapshot => handle
            .snapshot(id.unwrap(), SNAPSHOT.to_owned())
            .await
            .map(|_| ()),
        Op::DeleteSnapshot => {
            let snapshots = handle.snapshots().await?;
            match snapshots.first() {
                Some(s) => handle.delete_snapshot(&s.id).await.map(|_| ()),
                // Deleted before the crash took the answer.
                None => Ok(()),
            }
        }
    }
}

/// The id the operation is about (created by recovery if the crash hit a create).
fn the_id(h: &Harness) -> Option<VolumeId> {
    h.fake.ids().into_iter().next()
}

async fn check_converged(op: Op, h: &Harness, m: &Running, what: &str) {
    let recs = m.handle.volumes().await.unwrap();
    let tracked: BTreeSet<VolumeId> = recs.iter().map(|r| r.id.clone()).collect();
    let plugin: BTreeSet<VolumeId> = h.fake.ids().into_iter().collect();
    assert_eq!(tracked, plugin, "{what}: tracked vs plugin (leak)");
    assert_eq!(h.fake.st().created, 1, "{what}: created exactly once");
    let want = match op {
        Op::Create | Op::StagedCreate => Some(StateName::Created),
        Op::CreateRefused => None,
        Op::Publish | Op::Expand | Op::Snapshot => Some(StateName::Published),
        Op::DeleteSnapshot => Some(StateName::Created),
        Op::Unpublish => Some(StateName::NodeReady),
        Op::Delete | Op::StagedDelete => None,
    };
    let snapshots = m.handle.snapshots().await.unwrap();
    let plugin_snapshots: Vec<String> = h.fake.st().snapshots.keys().cloned().collect();
    let recorded: Vec<String> = snapshots.iter().map(|s| s.id.clone()).collect();
    assert_eq!(
        recorded, plugin_snapshots,
        "{what}: snapshots recorded vs plugin's"
    );
    assert!(
        snapshots.iter().all(|s| !s.deleting),
        "{what}: {snapshots:?}"
    );
    match op {
        Op::Snapshot => {
            assert_eq!(recorded.len(), 1, "{what}");
            assert_eq!(h.fake.st().snapshots_taken, 1, "{what}: taken once");
            assert_eq!(snapshots[0].name, SNAPSHOT, "{what}");
        }
        Op::DeleteSnapshot => assert!(recorded.is_empty(), "{what}: deleted"),
        _ => {}
    }
    match want {
        None => assert!(recs.is_empty(), "{what}: deleted"),
        Some(state) => {
            assert_eq!(recs.len(), 1, "{what}");
            assert_eq!(recs[0].state.name(), state, "{what}");
            let fv = h.fake.volume(&recs[0].id).unwrap();
            assert_eq!(
                fv.published.is_some(),
                state == StateName::Published,
                "{what}"
            );
            assert_eq!(
                fv.staged.is_some(),
                state == StateName::Published,
                "{what}: staged"
            );
            assert_eq!(
                recs[0].node_publish_required,
                state == StateName::Published,
                "{what}"
            );
            if op == Op::Expand {
                assert_eq!(recs[0].expansion, None, "{what}: expansion left");
                assert_eq!(recs[0].expanded_bytes, Some(GROWN), "{what}");
                assert_eq!(recs[0].capacity_bytes, GROWN, "{what}");
                assert_eq!(fv.capacity, GROWN, "{what}: plugin's size");
                assert_eq!(fv.fs_bytes, GROWN, "{what}: file system grown");
            }
        }
    }
}

async fn crash_everywhere(op: Op) {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    let mut crashes = 0;
    for point in POINTS {
        for k in 0.. {
            let what = format!("{op:?}, crash at {point} #{}", k + 1);
            let h = Harness::new(plugin(op));
            let (m, store) = h.start_sharing(h.config());
            within(m.handle.ready()).await.unwrap();
            let id = setup(op, &m.handle).await;
            fail::cfg(point, &format!("{k}*off->1*return->off")).unwrap();
            let result = within(run(op, &m, &store, id.as_ref())).await;
            fail::remove(point);
            // The store's lock goes with the manager.
            drop(store);
            if result.is_ok() {
                // The operation needs fewer than k+1 evaluations of this point: done.
                m.stop().await.unwrap();
                check_after_restart(op, &h, &what, false).await;
                break;
            }
            crashes += 1;
            if matches!(result, Err(VolumeError::Store { .. })) {
                // The caller's own commit: the process dies, the manager with it.
                let _ = m.stop().await;
            } else {
                assert!(
                    matches!(result, Err(VolumeError::Stopped)),
                    "{what}: {result:?}"
                );
                let died = m.died().await;
                assert!(died.is_err(), "{what}: the manager must stop");
            }
            check_after_restart(op, &h, &what, true).await;
            assert!(k < 50, "{what}: runaway enumeration");
        }
    }
    // Every operation has at least two commits and one call: something was crashed.
    assert!(
        crashes >= POINTS.len(),
        "{op:?}: only {crashes} crash points"
    );
    eprintln!("{op:?}: {crashes} crash points recovered");
}

async fn check_after_restart(op: Op, h: &Harness, what: &str, crashed: bool) {
    let (m, store) = h.start_sharing(h.config());
    let report = within(m.handle.ready()).await.unwrap();
    let recs = m.handle.volumes().await.unwrap();
    for r in &recs {
        assert!(
            r.state.in_flight_call().is_none(),
            "{what}: {:?} after recovery",
            r.state
        );
        assert!(!r.deleting, "{what}: deletion left unfinished");
        // With nothing in flight, the record describes the plugin exactly.
        let fv = h
            .fake
            .volume(&r.id)
            .expect("tracked volume exists in the plugin");
        let s = r.state.name();
        assert_eq!(
            fv.published.is_some(),
            s == StateName::Published,
            "{what}: {s}"
        );
        assert_eq!(
            fv.staged.is_some(),
            matches!(s, StateName::VolReady | StateName::Published),
            "{what}: {s}"
        );
        assert_eq!(
            fv.controller_published,
            s != StateName::Created,
            "{what}: {s}"
        );
    }
    // Nothing the plugin has is unknown to the state, even before the caller retries.
    let plugin: BTreeSet<VolumeId> = h.fake.ids().into_iter().collect();
    let tracked: BTreeSet<VolumeId> = recs.iter().map(|r| r.id.clone()).collect();
    assert_eq!(plugin, tracked, "{what}: leak after recovery");
    // Retry the operation, as the provider replays an operation it has no result for.
    if crashed {
        let id = the_id(h).or_else(|| recs.first().map(|r| r.id.clone()));
        match (op.replayed(), id) {
            (Op::Delete, None) => {} // deleted by recovery already
            (Op::Delete, Some(id)) => {
                m.handle.delete(&id).await.unwrap();
            }
            (replayed, id) => within(run(replayed, &m, &store, id.as_ref()))
                .await
                .unwrap(),
        }
    }
    drop(store);
    check_converged(op, h, &m, what).await;
    let _ = report;
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty(), "{what}: intent left");
    assert!(
        h.stored_deletions().is_empty(),
        "{what}: deletion intent left"
    );
    assert!(
        h.stored_all::<SnapshotIntent>().is_empty(),
        "{what}: snapshot intent left"
    );
    if op == Op::CreateRefused {
        let refusals = h.stored_refusals();
        assert_eq!(refusals.len(), 1, "{what}: {refusals:?}");
        assert!(
            matches!(refusals[0].cleanup, RefusedCleanup::Deleted { .. }),
            "{what}: {refusals:?}"
        );
        // Converged means settled for good: another create of the name sends nothing.
        let m = h.start();
        within(m.handle.ready()).await.unwrap();
        let calls = h.fake.calls(CsiRpc::CreateVolume);
        assert!(matches!(
            m.handle.create(refused_create_req(NAME, "id")).await,
            Err(VolumeError::CreateRefused { .. })
        ));
        assert_eq!(
            h.fake.calls(CsiRpc::CreateVolume),
            calls,
            "{what}: re-created"
        );
        assert_eq!(h.fake.st().created, 1, "{what}");
        m.stop().await.unwrap();
    }
}

#[tokio::test]
async fn crash_anywhere_in_create() {
    crash_everywhere(Op::Create).await;
}

#[tokio::test]
async fn crash_anywhere_in_a_refused_create() {
    crash_everywhere(Op::CreateRefused).await;
}

#[tokio::test]
async fn crash_anywhere_in_publish() {
    crash_everywhere(Op::Publish).await;
}

#[tokio::test]
async fn crash_anywhere_in_unpublish() {
    crash_everywhere(Op::Unpublish).await;
}

#[tokio::test]
async fn crash_anywhere_in_delete() {
    crash_everywhere(Op::Delete).await;
}

#[tokio::test]
async fn crash_anywhere_in_a_staged_create() {
    crash_everywhere(Op::StagedCreate).await;
}

#[tokio::test]
async fn crash_anywhere_in_a_staged_delete() {
    crash_everywhere(Op::StagedDelete).await;
}

#[tokio::test]
async fn crash_anywhere_in_an_expansion() {
    crash_everywhere(Op::Expand).await;
}

#[tokio::test]
async fn crash_anywhere_in_a_snapshot() {
    crash_everywhere(Op::Snapshot).await;
}

#[tokio::test]
async fn crash_anywhere_in_a_snapshot_deletion() {
    crash_everywhere(Op::DeleteSnapshot).await;
}

/// A crash while CreateVolume's answer is lost *and* the caller never retries: recovery
/// alone must track the volume (no leak), created once.
#[tokio::test]
async fn crash_after_create_without_a_retry_tracks_the_volume() {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    fail::cfg(vfp::AFTER_CALL, "1*return->off").unwrap();
    assert!(m.handle.create(create_req(NAME)).await.is_err());
    fail::remove(vfp::AFTER_CALL);
    assert!(m.died().await.is_err());
    assert_eq!(h.stored_intents().len(), 1);
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.intents, 1);
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(h.fake.ids(), vec![recs[0].id.clone()]);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 2);
    assert_eq!(h.fake.st().created, 1);
    m.stop().await.unwrap();
}
