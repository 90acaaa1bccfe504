//! What waits for what: requests wait for recovery (every Mesos volume manager call waits
//! for `recovered`), and a call waiting out a retry backoff holds no concurrency permit.
//!
//! Each test holds a call at the fake plugin, sends the requests that must (or must not)
//! wait, waits until the manager reports where they sit ([`VolumeManagerHandle::jobs`])
//! or until one of them escapes, then checks the order of events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::retry::{Backoff, Jitter, RetryPolicy};
use slrp_csi::{Code, CsiRpc, RetryConfig};
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

/// A manager in recovery: a published volume whose target the fake forgot while the
/// manager was down, its NodePublishVolume re-drive held at the plugin. Returns the
/// running manager and the volume.
async fn recovering(h: &Harness) -> (Running, VolumeId) {
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
    h.fake.st().mounted.clear();
    h.fake.hold(&v.id);
    let m = h.start();
    until(|| h.fake.calls(CsiRpc::NodePublishVolume) == 2).await;
    (m, v.id)
}

/// Waits for `m` to be ready and tracks a pre-existing volume (validated), which a
/// publish can use without any controller call that a test holds up.
async fn ready_with_a_validated_volume(h: &Harness, m: &Running) -> VolumeId {
    within(m.handle.ready()).await.unwrap();
    let id = VolumeId::new("pre-1");
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    m.handle.validate(validate_req(&id)).await.unwrap();
    id
}

/// `n` concurrent creates (`op-0` …), each on its own task.
fn spawn_creates(
    handle: &VolumeManagerHandle,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<VolumeInfo, VolumeError>>> {
    (0..n)
        .map(|i| {
            let hd = handle.clone();
            tokio::spawn(async move { hd.create(create_req(&format!("op-{i}"))).await })
        })
        .collect()
}

#[tokio::test]
async fn list_and_capacity_issued_during_recovery_are_answered_after_it() {
    let h = Harness::new(FakeCsi::full());
    let (m, id) = recovering(&h).await;

    let hd = m.handle.clone();
    let list = tokio::spawn(async move { hd.list_all(0).await });
    let hd = m.handle.clone();
    let capacity = tokio::spawn(async move { hd.capacity(mount_cap(), StringMap::new()).await });
    let escaped = || list.is_finished() || capacity.is_finished();
    let jobs = jobs_until(&m.handle, |j| j.deferred == 2, escaped).await;
    assert!(!escaped(), "answered during recovery: {jobs:?}");
    assert_eq!(h.fake.calls(CsiRpc::ListVolumes), 0);
    assert_eq!(h.fake.calls(CsiRpc::GetCapacity), 0);

    h.fake.unhold(&id);
    within(m.handle.ready()).await.unwrap();
    let listed = within(list).await.unwrap().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(within(capacity).await.unwrap().unwrap() > 0);
    assert_eq!(m.handle.jobs().await.unwrap().deferred, 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_request_that_arrives_during_recovery_waits_even_on_another_volume() {
    let h = Harness::new(FakeCsi::full());
    let (m, id) = recovering(&h).await;

    let hd = m.handle.clone();
    let create = tokio::spawn(async move { hd.create(create_req("other")).await });
    let escaped = || create.is_finished() || h.fake.calls(CsiRpc::CreateVolume) > 1;
    jobs_until(&m.handle, |j| j.deferred == 1, escaped).await;
    assert!(!escaped(), "CreateVolume ran during recovery");

    h.fake.unhold(&id);
    within(create).await.unwrap().unwrap();
    m.stop().await.unwrap();
}

/// With 4 permits and 16 creates backing off (an hour each) on an unavailable
/// controller, a publish still completes at once, and every create is still retrying.
#[tokio::test]
async fn creates_backing_off_hold_no_permit_so_a_publish_completes() {
    let mut h = Harness::new(FakeCsi::full());
    h.max_concurrent = 4;
    let hour = Duration::from_secs(3600);
    let policy = RetryPolicy::mesos()
        .with_jitter(Jitter::None)
        .with_backoff(Backoff::new(hour, hour).unwrap());
    let m = h.start_with(
        h.config()
            .retry(RetryConfig::none().with(CsiRpc::CreateVolume, policy)),
    );
    let id = ready_with_a_validated_volume(&h, &m).await;

    h.fake
        .fail(CsiRpc::CreateVolume, Code::Unavailable, usize::MAX);
    let creates = spawn_creates(&m.handle, 16);
    let answered = || creates.iter().any(|c| c.is_finished());
    until(|| h.fake.calls(CsiRpc::CreateVolume) == 16 || answered()).await;
    assert!(!answered(), "a create gave up instead of retrying");

    let published = tokio::time::timeout(Duration::from_secs(20), m.handle.publish(&id)).await;
    assert!(
        matches!(published, Ok(Ok(_))),
        "publish stalled behind backing-off creates: {published:?}"
    );
    assert!(!answered(), "a create gave up instead of retrying");
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 16, "one attempt each");

    // Shutdown ends the backoffs at once: each create hears its last (transient) error
    // and keeps its intent for recovery.
    m.guard.request_stop();
    for c in creates {
        let e = within(c).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), VolumeErrorKind::Unavailable, "{e}");
    }
    within(m.guard.join()).await.unwrap();
    assert_eq!(h.stored_intents().len(), 16);
}

/// With 4 permits and 16 creates waiting for the controller's container (down, as a
/// managed client sees it while the plugin restarts), a publish through the node service
/// still completes at once: a call waiting for its endpoint holds no permit.
#[tokio::test]
async fn creates_waiting_for_a_restarting_controller_hold_no_permit() {
    let mut h = Harness::new(FakeCsi::full());
    h.max_concurrent = 4;
    let m = h.start();
    let id = ready_with_a_validated_volume(&h, &m).await;

    h.fake.set_down(CsiRpc::CreateVolume, true);
    let creates = spawn_creates(&m.handle, 16);
    let answered = || creates.iter().any(|c| c.is_finished());
    until(|| h.fake.st().waiting_for_endpoint >= 4 || answered()).await;
    assert!(!answered(), "a create did not wait for its endpoint");

    let published = tokio::time::timeout(Duration::from_secs(20), m.handle.publish(&id)).await;
    assert!(
        matches!(published, Ok(Ok(_))),
        "publish stalled behind creates waiting for their endpoint: {published:?}"
    );
    until(|| h.fake.st().waiting_for_endpoint == 16 || answered()).await;
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 0, "sent while down");

    h.fake.set_down(CsiRpc::CreateVolume, false);
    for c in creates {
        within(c).await.unwrap().unwrap();
    }
    assert_eq!(h.fake.ids().len(), 17);
    m.stop().await.unwrap();
}
