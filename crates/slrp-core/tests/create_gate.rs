//! The create gate: a CreateVolume learns its id only from the plugin's answer, so
//! requests for an id that is not tracked must not run while a create may be about to
//! track it (and a create must not run while such a request may be tracking or deleting
//! the id it will return).
//!
//! Each test holds a CreateVolume (or a ValidateVolumeCapabilities) at the fake plugin
//! after its effect, sends the conflicting requests, waits until the manager reports
//! where they sit ([`VolumeManagerHandle::jobs`]), releases the held call and checks
//! the answers and that store, memory and plugin agree. The waits also end as soon as
//! the plugin sees a call that must not have happened yet, so a manager without the gate
//! fails on an assertion, not on a timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::CsiRpc;
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;
use tokio::task::JoinHandle;

fn spawn_create(
    handle: &VolumeManagerHandle,
    name: &str,
) -> JoinHandle<Result<VolumeInfo, VolumeError>> {
    let (hd, req) = (handle.clone(), create_req(name));
    tokio::spawn(async move { hd.create(req).await })
}

fn spawn_validate(
    handle: &VolumeManagerHandle,
    req: ValidateVolume,
) -> JoinHandle<Result<VolumeInfo, VolumeError>> {
    let hd = handle.clone();
    tokio::spawn(async move { hd.validate(req).await })
}

fn spawn_delete(
    handle: &VolumeManagerHandle,
    id: &VolumeId,
) -> JoinHandle<Result<bool, VolumeError>> {
    let (hd, id) = (handle.clone(), id.clone());
    tokio::spawn(async move { hd.delete(&id).await })
}

/// Starts a create of `name` and waits until the plugin has created the volume and holds
/// the answer; returns the id the create is about to learn.
async fn create_held_after_effect(
    h: &Harness,
    handle: &VolumeManagerHandle,
    name: &str,
) -> (VolumeId, JoinHandle<Result<VolumeInfo, VolumeError>>) {
    h.fake.hold_create(name);
    let creating = spawn_create(handle, name);
    until(|| h.fake.id_of(name).is_some()).await;
    (h.fake.id_of(name).unwrap(), creating)
}

/// Store, memory and plugin agree: the records on disk equal the manager's, and the
/// plugin's volumes are exactly the tracked ones. The manager must be stopped.
fn assert_consistent(h: &Harness, in_memory: &[VolumeRecord]) {
    assert_eq!(h.stored(), in_memory, "store and memory disagree");
    let tracked: Vec<VolumeId> = in_memory.iter().map(|r| r.id.clone()).collect();
    assert_eq!(h.fake.ids(), tracked, "plugin volumes != tracked volumes");
    assert!(h.stored_intents().is_empty());
}

/// A provider reconciling ListVolumes validates the id a running create is about to
/// track: the validate waits for the create and is then answered from its record (or
/// with the spec's mismatch error); it never tracks the volume as pre-existing.
#[tokio::test]
async fn a_validate_of_the_id_a_create_is_returning_waits_and_sees_its_record() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let (id, creating) = create_held_after_effect(&h, &m.handle, "op").await;
    // The provider learns the id the way it would: from ListVolumes.
    let listed = m.handle.list_all(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].volume_id, id);

    let ran = || h.fake.calls(CsiRpc::ValidateVolumeCapabilities) > 0;
    let same = spawn_validate(&m.handle, validate_req(&id));
    jobs_until(&m.handle, |j| j.parked == 1, ran).await;
    let mut other_req = validate_req(&id);
    other_req.parameters.insert("k".into(), "v".into());
    let other = spawn_validate(&m.handle, other_req);
    let jobs = jobs_until(&m.handle, |j| j.queued == 1, ran).await;
    assert!(!ran(), "ValidateVolumeCapabilities ran under the create");
    assert_eq!(
        jobs,
        JobCounts {
            running: 1,
            creating: 1,
            parked: 1,
            queued: 1,
            deferred: 0,
        }
    );

    h.fake.unhold_create("op");
    let created = within(creating).await.unwrap().unwrap();
    assert_eq!(created.id, id);
    // Tracked by the time the validates run: compared with the record, no RPC.
    assert_eq!(within(same).await.unwrap().unwrap(), created);
    let e = within(other).await.unwrap().unwrap_err();
    assert!(
        matches!(&e, VolumeError::Mismatch { id: got, what: Mismatched::Parameters, .. } if got == &id),
        "{e:?}"
    );
    assert!(!ran());
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].name.as_deref(), Some("op"));
    assert!(!recs[0].spec.pre_provisioned);
    m.stop().await.unwrap();
    assert_consistent(&h, &recs);
}

/// A delete of the id a running create is about to track follows the create instead of
/// deleting the volume under it (which would leave a tracked volume the plugin no longer
/// has). A validate sent before it runs first, in arrival order.
#[tokio::test]
async fn a_delete_of_the_id_a_create_is_returning_runs_after_the_create() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let (id, creating) = create_held_after_effect(&h, &m.handle, "op").await;

    let ran = || {
        h.fake.calls(CsiRpc::ValidateVolumeCapabilities) + h.fake.calls(CsiRpc::DeleteVolume) > 0
    };
    let validating = spawn_validate(&m.handle, validate_req(&id));
    jobs_until(&m.handle, |j| j.parked == 1, ran).await;
    let deleting = spawn_delete(&m.handle, &id);
    jobs_until(&m.handle, |j| j.queued == 1, ran).await;
    assert!(!ran(), "a call for the id ran under the create");
    assert!(h.fake.ids().contains(&id));

    h.fake.unhold_create("op");
    let created = within(creating).await.unwrap().unwrap();
    assert_eq!(within(validating).await.unwrap().unwrap(), created);
    assert!(within(deleting).await.unwrap().unwrap());
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 1);
    assert_eq!(h.fake.calls(CsiRpc::ValidateVolumeCapabilities), 0);
    let recs = m.handle.volumes().await.unwrap();
    assert!(recs.is_empty());
    assert!(h.fake.ids().is_empty());
    m.stop().await.unwrap();
    assert_consistent(&h, &recs);
}

/// The other direction: while a validate of an untracked id runs, a create that will
/// return that id waits; it then finds the id tracked and fails with the spec's error
/// instead of overwriting the validated record.
#[tokio::test]
async fn a_create_waits_for_a_running_validate_of_the_id_it_will_return() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    // The plugin already has a volume named "op" (its creation was never tracked).
    let id = VolumeId::new("vol-7");
    {
        let mut st = h.fake.st();
        st.volumes.insert(
            id.clone(),
            FakeVolume {
                name: "op".into(),
                capacity: 1 << 20,
                ..FakeVolume::default()
            },
        );
        st.by_name.insert("op".into(), id.clone());
    }
    h.fake.hold(&id);
    let validating = spawn_validate(&m.handle, validate_req(&id));
    until(|| h.fake.calls(CsiRpc::ValidateVolumeCapabilities) == 1).await;

    let ran = || h.fake.calls(CsiRpc::CreateVolume) > 0;
    let creating = spawn_create(&m.handle, "op");
    let jobs = jobs_until(&m.handle, |j| j.parked == 1, ran).await;
    assert!(!ran(), "CreateVolume ran under the validate");
    assert_eq!(jobs.running, 1);
    assert_eq!(jobs.creating, 0);

    h.fake.unhold(&id);
    let validated = within(validating).await.unwrap().unwrap();
    assert_eq!(validated.id, id);
    let e = within(creating).await.unwrap().unwrap_err();
    assert!(
        matches!(&e, VolumeError::NameTaken { id: got, .. } if got == &id),
        "{e:?}"
    );
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert!(recs[0].spec.pre_provisioned && recs[0].name.is_none());
    m.stop().await.unwrap();
    assert_consistent(&h, &recs);
}

/// A parked request is not starved by a stream of creates: creates that arrive after it
/// queue behind it, and run (in parallel, each on its own name) once it is done.
#[tokio::test]
async fn a_parked_request_runs_before_creates_that_arrive_after_it() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let pre = VolumeId::new("pre-1");
    h.fake
        .st()
        .volumes
        .insert(pre.clone(), FakeVolume::default());
    let stream = ["c1", "c2", "c3"];
    for name in stream {
        h.fake.hold_create(name);
    }
    let (_, first) = create_held_after_effect(&h, &m.handle, "c0").await;

    let validated = || h.fake.calls(CsiRpc::ValidateVolumeCapabilities) > 0;
    let validating = spawn_validate(&m.handle, validate_req(&pre));
    jobs_until(&m.handle, |j| j.parked == 1, validated).await;
    assert!(
        !validated(),
        "ValidateVolumeCapabilities ran under a create"
    );
    let more_creates = || h.fake.calls(CsiRpc::CreateVolume) > 1;
    let later: Vec<_> = stream
        .iter()
        .map(|name| spawn_create(&m.handle, name))
        .collect();
    let jobs = jobs_until(&m.handle, |j| j.parked == 4, more_creates).await;
    assert!(!more_creates(), "a create overtook the parked validate");
    assert_eq!(jobs.creating, 1);

    h.fake.unhold_create("c0");
    within(first).await.unwrap().unwrap();
    // The later creates reach the plugin together (they are held there) and only after
    // the validate has been applied.
    until(|| h.fake.calls(CsiRpc::CreateVolume) == 4).await;
    assert_eq!(h.fake.calls(CsiRpc::ValidateVolumeCapabilities), 1);
    assert_eq!(within(validating).await.unwrap().unwrap().id, pre);
    assert!(
        m.handle
            .volumes()
            .await
            .unwrap()
            .iter()
            .any(|r| r.id == pre)
    );
    assert_eq!(m.handle.jobs().await.unwrap().creating, 3);

    for name in stream {
        h.fake.unhold_create(name);
    }
    for t in later {
        within(t).await.unwrap().unwrap();
    }
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 5);
    m.stop().await.unwrap();
    assert_consistent(&h, &recs);
}

/// Shutdown answers parked requests (and those queued behind them) with `Stopped` at
/// once and never starts them, while the running create may finish within the grace.
#[tokio::test]
async fn shutdown_answers_parked_requests_and_never_runs_them() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start_with(h.config().shutdown_grace(Duration::from_secs(30)));
    within(m.handle.ready()).await.unwrap();
    let (id, creating) = create_held_after_effect(&h, &m.handle, "op").await;
    let ran = || {
        h.fake.calls(CsiRpc::ValidateVolumeCapabilities) + h.fake.calls(CsiRpc::DeleteVolume) > 0
    };
    let validating = spawn_validate(&m.handle, validate_req(&id));
    jobs_until(&m.handle, |j| j.parked == 1, ran).await;
    let deleting = spawn_delete(&m.handle, &id);
    jobs_until(&m.handle, |j| j.queued == 1, ran).await;
    assert!(!ran(), "a call for the id ran under the create");

    m.guard.request_stop();
    wait_until_not_accepting(&m.handle).await;
    // Answered while the create is still held, not after the grace period.
    assert!(matches!(
        within(validating).await.unwrap(),
        Err(VolumeError::Stopped)
    ));
    assert!(matches!(
        within(deleting).await.unwrap(),
        Err(VolumeError::Stopped)
    ));
    h.fake.unhold_create("op");
    assert_eq!(within(creating).await.unwrap().unwrap().id, id);
    within(m.guard.join()).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::ValidateVolumeCapabilities), 0);
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
    let stored = h.stored();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].name.as_deref(), Some("op"));
    assert_eq!(h.fake.ids(), vec![id]);
    assert!(h.stored_intents().is_empty());
}
