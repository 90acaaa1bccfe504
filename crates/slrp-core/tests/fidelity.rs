//! Mesos fidelity of the volume manager, with the in-memory [`FakeCsi`]: target-path
//! post-checks and who creates the target, read-only flags, failed versus interrupted
//! deletions, cleanup before deletion, CreateVolume intents, validation that compares.
//!
//! Real time (the store commits on its own thread, see `manager.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use slrp_core::volume::*;
use slrp_csi::{Code, CsiRpc};
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

fn state_of(recs: &[VolumeRecord], id: &VolumeId) -> StateName {
    recs.iter().find(|r| &r.id == id).unwrap().state.name()
}

/// Starts a manager that retries `rpc` as Mesos does, after a fixed `backoff`.
fn start_retrying(h: &Harness, rpc: CsiRpc, backoff: std::time::Duration) -> Running {
    let policy = slrp_csi::retry::RetryPolicy::mesos()
        .with_jitter(slrp_csi::retry::Jitter::None)
        .with_backoff(slrp_csi::retry::Backoff::new(backoff, backoff).unwrap());
    h.start_with(
        h.config()
            .retry(slrp_csi::RetryConfig::none().with(rpc, policy)),
    )
}

/// Starts the manager again: recovery resumes the interrupted deletion and the volume is
/// gone, from the manager and from the plugin.
async fn the_next_start_finishes_the_deletion(h: &Harness) {
    let m = h.start();
    m.handle.ready().await.unwrap();
    assert!(m.handle.volumes().await.unwrap().is_empty());
    assert!(h.fake.ids().is_empty());
    m.stop().await.unwrap();
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

// === item 4: a failed delete leaves a usable volume; an interrupted one is resumed ===

#[tokio::test]
async fn a_delete_the_plugin_refuses_leaves_a_usable_volume_never_deleted_unasked() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    h.fake
        .fail(CsiRpc::DeleteVolume, Code::FailedPrecondition, 1);
    let err = m.handle.delete(&v.id).await.unwrap_err();
    assert!(matches!(err, VolumeError::Csi { .. }), "{err}");
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert_eq!(rec.state.name(), StateName::Created);
    assert!(!rec.deleting, "a failed deletion is not resumed");
    assert!(
        rec.delete_failed
            .as_deref()
            .is_some_and(|why| why.contains("DeleteVolume")),
        "{rec:?}"
    );
    m.stop().await.unwrap();
    assert!(!h.stored()[0].deleting);

    // The next start leaves it alone, and it is still usable.
    let deletes = h.fake.calls(CsiRpc::DeleteVolume);
    let m = h.start();
    let report = m.handle.ready().await.unwrap();
    assert_eq!(report.jobs, 0, "{report:?}");
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), deletes);
    m.handle.publish(&v.id).await.unwrap();
    // Asked again, it goes.
    assert!(m.handle.delete(&v.id).await.unwrap());
    assert!(m.handle.volumes().await.unwrap().is_empty());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_delete_interrupted_by_a_crash_is_resumed_at_the_next_start() {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    // The process dies at the first call of the deletion.
    fail::cfg(manager::failpoints::BEFORE_CALL, "1*return->off").unwrap();
    assert!(m.handle.delete(&v.id).await.is_err());
    assert!(m.died().await.is_err());
    fail::remove(manager::failpoints::BEFORE_CALL);
    let stored = h.stored();
    assert!(stored[0].deleting && stored[0].delete_failed.is_none());
    the_next_start_finishes_the_deletion(&h).await;
}

#[tokio::test]
async fn a_delete_backing_off_when_the_manager_stops_is_interrupted_not_failed() {
    // DeleteVolume keeps answering UNAVAILABLE and the manager retries it after an hour;
    // stopping the manager ends that backoff. The deletion did not fail: the next start
    // must resume it, not leave the volume "usable" with `delete_failed`.
    let h = Harness::new(FakeCsi::full());
    let m = start_retrying(
        &h,
        CsiRpc::DeleteVolume,
        std::time::Duration::from_secs(3600),
    );
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    h.fake
        .fail(CsiRpc::DeleteVolume, Code::Unavailable, usize::MAX);
    let hd = m.handle.clone();
    let id = v.id.clone();
    let delete = tokio::spawn(async move { hd.delete(&id).await });
    until(|| h.fake.calls(CsiRpc::DeleteVolume) == 1 || delete.is_finished()).await;
    assert!(
        !delete.is_finished(),
        "the delete gave up instead of retrying"
    );
    m.guard.request_stop();
    assert!(within(delete).await.unwrap().is_err());
    within(m.guard.join()).await.unwrap();
    let stored = h.stored();
    assert!(
        stored[0].deleting && stored[0].delete_failed.is_none(),
        "{:?}",
        stored[0]
    );

    h.fake.st().faults.clear();
    the_next_start_finishes_the_deletion(&h).await;
}

#[tokio::test]
async fn a_delete_whose_plugin_endpoint_was_stopped_is_interrupted_not_failed() {
    // The supervisor stopped the plugin for good (slrp is shutting down) before the
    // manager: the deletion was cut short, not refused, and the next start resumes it.
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    h.fake.st().stopped.insert(CsiRpc::DeleteVolume);
    assert!(m.handle.delete(&v.id).await.is_err());
    m.stop().await.unwrap();
    let stored = h.stored();
    assert!(
        stored[0].deleting && stored[0].delete_failed.is_none(),
        "{:?}",
        stored[0]
    );
    h.fake.st().stopped.clear();
    the_next_start_finishes_the_deletion(&h).await;
}

// === item 5: no data crosses between users of the space ===

#[tokio::test]
async fn a_volume_unpublished_since_it_was_used_is_published_again_and_emptied_before_delete() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.handle.unpublish(&v.id).await.unwrap();
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert!(!rec.node_publish_required && rec.needs_cleanup, "{rec:?}");
    let publishes = h.fake.calls(CsiRpc::NodePublishVolume);
    h.fake.fail(CsiRpc::DeleteVolume, Code::Internal, 1);
    assert!(m.handle.delete(&v.id).await.is_err());
    assert_eq!(
        h.fake.calls(CsiRpc::NodePublishVolume),
        publishes + 1,
        "published again for the cleanup"
    );
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert!(!rec.needs_cleanup, "cleaned before DeleteVolume: {rec:?}");
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_cleanup_refuses_to_reach_into_a_mount_below_the_target() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    let nested = target.join("nested");
    std::fs::create_dir(&nested).unwrap();
    std::fs::write(nested.join("theirs"), b"not ours to remove").unwrap();
    h.fake.st().mounted.insert(nested.clone());
    let err = m.handle.delete(&v.id).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Failed to clean up volume '{}'", v.id)
    );
    assert!(nested.join("theirs").exists());
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert!(rec.needs_cleanup && !rec.deleting, "{rec:?}");
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_cleanup_never_follows_a_symbolic_link_at_the_target() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    // A plugin that "published" by linking the target to a directory elsewhere: the
    // cleanup must not empty that directory.
    let elsewhere = h.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("theirs"), b"not in the volume").unwrap();
    std::fs::remove_dir(&target).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &target).unwrap();
    let err = m.handle.delete(&v.id).await.unwrap_err();
    assert!(elsewhere.join("theirs").exists(), "followed the link");
    assert!(matches!(err, VolumeError::Cleanup { .. }), "{err}");
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_cleanup_of_an_unpublished_volume_does_not_make_it_required_published() {
    // Unpublished by its user, then deleted: the cleanup publishes it again and fails.
    // The volume stays usable, but nobody asked for it to be published: the next start
    // must not republish it (and must not wait for that to be ready).
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    m.handle.unpublish(&v.id).await.unwrap();
    // The fake's mount table: something shows as mounted below the target.
    h.fake.st().mounted.insert(target.join("nested"));
    let err = m.handle.delete(&v.id).await.unwrap_err();
    assert!(matches!(err, VolumeError::Cleanup { .. }), "{err}");
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert!(!rec.deleting && rec.delete_failed.is_some(), "{rec:?}");
    assert!(!rec.node_publish_required, "{rec:?}");
    m.stop().await.unwrap();
    let publishes = h.fake.calls(CsiRpc::NodePublishVolume);
    h.fake.st().mounted.remove(&target.join("nested"));
    let m = h.start();
    m.handle.ready().await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::NodePublishVolume), publishes);
    m.stop().await.unwrap();
}

// === item 3: validation compares what the plugin confirmed ===

#[tokio::test]
async fn validation_fails_unless_the_plugin_confirmed_what_was_asked() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    // A pre-existing volume, listed by the plugin.
    let id = m.handle.create(create_req("listed")).await.unwrap().id;
    m.stop().await.unwrap();
    // Forget the record: the volume is the plugin's, unknown to the new manager.
    std::fs::remove_dir_all(h.state_dir()).unwrap();
    let m = h.start();
    m.handle.ready().await.unwrap();
    let req = validate_req(&id);
    let asked = slrp_csi::Confirmed {
        volume_context: req.volume_context.clone(),
        capabilities: vec![req.capability.clone()],
        parameters: req.parameters.clone(),
    };
    let mut block = asked.clone();
    block.capabilities = vec![slrp_csi::VolumeCapability::block()];
    let mut context = asked.clone();
    context.volume_context.insert("other".into(), "x".into());
    let mut parameters = asked.clone();
    parameters.parameters.insert("pool".into(), "fast".into());
    for (confirmed, detail) in [
        (context, "Mismatched volume context"),
        (block, "Unsupported volume capability"),
        (parameters, "Mismatched parameters"),
    ] {
        h.fake.st().confirm = Some(confirmed);
        let err = m.handle.validate(req.clone()).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Validation failed for volume '{id}': {detail}")
        );
        assert!(m.handle.volumes().await.unwrap().is_empty(), "not tracked");
    }
    // Confirmed as asked (with extra capabilities besides): tracked.
    let mut more = asked.clone();
    more.capabilities
        .insert(0, slrp_csi::VolumeCapability::block());
    h.fake.st().confirm = Some(more);
    m.handle.validate(req).await.unwrap();
    assert_eq!(m.handle.volumes().await.unwrap().len(), 1);
    m.stop().await.unwrap();
}

// === item 2: a create intent survives only what may have created the volume ===

#[tokio::test]
async fn a_create_intent_survives_only_answers_that_may_have_created_the_volume() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let refusals = [
        Code::ResourceExhausted,
        Code::OutOfRange,
        Code::InvalidArgument,
        Code::AlreadyExists,
        Code::Unimplemented,
    ];
    let unknown = [
        Code::Aborted,
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::Internal,
    ];
    for code in refusals.iter().chain(&unknown) {
        h.fake.fail(CsiRpc::CreateVolume, *code, 1);
        let name = format!("{code:?}");
        assert!(m.handle.create(create_req(&name)).await.is_err());
    }
    m.stop().await.unwrap();
    let mut kept: Vec<String> = h.stored_intents().into_iter().map(|i| i.name).collect();
    kept.sort();
    let mut expected: Vec<String> = unknown.iter().map(|c| format!("{c:?}")).collect();
    expected.sort();
    assert_eq!(
        kept, expected,
        "refusals drop their intent, the rest keep it"
    );
}

#[tokio::test]
async fn an_intent_survives_a_last_answer_that_rules_out_only_its_own_attempt() {
    // The first attempt creates the volume and its answer is lost (UNAVAILABLE, retried);
    // the retry is refused without effect (a plugin restarting would give NotReady, never
    // sent). The last answer alone says "nothing created", but the first attempt may have:
    // the intent must stay, and the next start must find and track that volume.
    let h = Harness::new(FakeCsi::full());
    let m = start_retrying(
        &h,
        CsiRpc::CreateVolume,
        std::time::Duration::from_millis(1),
    );
    h.fake
        .fail_after_effect(CsiRpc::CreateVolume, Code::Unavailable, 1);
    h.fake
        .fail(CsiRpc::CreateVolume, Code::FailedPrecondition, 1);
    assert!(m.handle.create(create_req("op-1")).await.is_err());
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 2);
    m.stop().await.unwrap();
    assert_eq!(h.stored_intents().len(), 1, "the intent was dropped");

    let m = h.start();
    m.handle.ready().await.unwrap();
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(
        recs.len(),
        1,
        "the volume the first attempt made is tracked"
    );
    assert_eq!(h.fake.ids(), [recs[0].id.clone()]);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn an_unsettled_intent_does_not_block_readiness_under_a_retrying_policy() {
    // Production retries CreateVolume on UNAVAILABLE without limit (Mesos's policy).
    // Recovery's one try of an intent must not sit in those retries: readiness would
    // wait for a plugin that keeps answering UNAVAILABLE.
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    h.fake.fail(CsiRpc::CreateVolume, Code::Unavailable, 1);
    assert!(m.handle.create(create_req("op-1")).await.is_err());
    m.stop().await.unwrap();
    assert_eq!(h.stored_intents().len(), 1);

    h.fake
        .fail(CsiRpc::CreateVolume, Code::Unavailable, usize::MAX);
    let m = start_retrying(
        &h,
        CsiRpc::CreateVolume,
        std::time::Duration::from_secs(3600),
    );
    let report = tokio::time::timeout(std::time::Duration::from_secs(10), m.handle.ready())
        .await
        .expect("readiness waited for the intent's retries")
        .unwrap();
    assert_eq!(report.unsettled_intents, ["op-1"], "{report:?}");
    m.stop().await.unwrap();
    assert_eq!(h.stored_intents().len(), 1);
}

#[tokio::test]
async fn an_intent_recovery_cannot_settle_does_not_block_readiness_and_is_settled_later() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    // The plugin created the volume, the answer was lost.
    h.fake
        .fail_after_effect(CsiRpc::CreateVolume, Code::Unavailable, 1);
    assert!(m.handle.create(create_req("op-1")).await.is_err());
    m.stop().await.unwrap();
    assert_eq!(h.stored_intents().len(), 1);

    // At the next start the plugin is still unavailable for a while.
    h.fake.fail(CsiRpc::CreateVolume, Code::Unavailable, 2);
    let cfg = h
        .config()
        .intent_retry(std::time::Duration::from_millis(20));
    let m = h.start_with(cfg);
    let report = m.handle.ready().await.unwrap();
    assert_eq!(report.unsettled_intents, ["op-1"], "{report:?}");
    assert!(
        report.warnings.iter().any(|w| w.contains("'op-1'")),
        "{report:?}"
    );
    // Settled in the background: the volume the plugin made is tracked under its name.
    volumes_until(&m.handle, |recs| {
        recs.iter().any(|r| r.name.as_deref() == Some("op-1"))
    })
    .await;
    assert_eq!(h.fake.ids().len(), 1, "no second volume");
    let again = m.handle.create(create_req("op-1")).await.unwrap();
    assert_eq!(h.fake.ids(), [again.id]);
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
}
