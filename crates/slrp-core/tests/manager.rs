//! Component tests of the volume manager: the worker with the in-memory [`FakeCsi`] and
//! a real store in a temporary directory.
//!
//! Real time, with fake-plugin delays of milliseconds: the store commits on its own OS
//! thread, which paused tokio time cannot see, so paused time would auto-advance past
//! every commit and fire the tests' timeouts. Nothing asserts on durations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use slrp_core::volume::*;
use slrp_csi::{Code, CsiRpc};
use slrp_store::Store;
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;

fn published_target(h: &Harness, id: &VolumeId) -> String {
    h.paths().target(id).unwrap().to_str().unwrap().to_owned()
}

#[tokio::test]
async fn lifecycle_create_publish_unpublish_delete() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r, RecoveryReport::default());

    let v = m.handle.create(create_req("op-1")).await.unwrap();
    assert_eq!(v.capacity_bytes, 1 << 20);
    assert_eq!(v.volume_context["name"], "op-1");
    let target = m.handle.publish(&v.id).await.unwrap();
    assert_eq!(target, h.paths().target(&v.id).unwrap());
    let fv = h.fake.volume(&v.id).unwrap();
    assert!(fv.controller_published);
    assert_eq!(
        fv.staged.as_deref(),
        h.paths().staging(&v.id).unwrap().to_str()
    );
    assert_eq!(fv.published, Some((published_target(&h, &v.id), false)));
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].state.name(), StateName::Published);
    assert!(recs[0].node_publish_required);
    assert_eq!(recs[0].name.as_deref(), Some("op-1"));
    // Publishing again is a no-op.
    let calls = h.fake.total_calls();
    m.handle.publish(&v.id).await.unwrap();
    assert_eq!(h.fake.total_calls(), calls);

    m.handle.unpublish(&v.id).await.unwrap();
    let fv = h.fake.volume(&v.id).unwrap();
    assert!(fv.published.is_none() && fv.staged.is_none() && fv.controller_published);
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs[0].state.name(), StateName::NodeReady);
    assert!(!recs[0].node_publish_required);

    assert!(m.handle.delete(&v.id).await.unwrap());
    assert!(h.fake.ids().is_empty());
    assert!(m.handle.volumes().await.unwrap().is_empty());
    assert!(!h.paths().volume_dir(&v.id).unwrap().exists());
    m.stop().await.unwrap();
    assert!(h.stored().is_empty());
    assert!(h.stored_intents().is_empty());
}

/// Mesos's `pre_provisioned` (a volume its CSI server published for a task), imported as
/// `untrack_on_unstage`: the unpublish that unstages it forgets it, the plugin keeps it.
#[tokio::test]
async fn an_untrack_on_unstage_volume_is_forgotten_once_unstaged() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let kept = m.handle.create(create_req("op-kept")).await.unwrap();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&kept.id).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
    {
        let store = Store::open(h.state_dir()).unwrap();
        let mut rec: VolumeRecord = store.get(v.id.as_str()).await.unwrap().unwrap();
        rec.spec.untrack_on_unstage = true;
        let mut tx = store.transaction();
        tx.put(&rec).unwrap();
        tx.commit().await.unwrap();
    }
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    m.handle.unpublish(&v.id).await.unwrap();
    m.handle.unpublish(&kept.id).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::NodeUnstageVolume), 2);
    let ids: Vec<VolumeId> = m
        .handle
        .volumes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, vec![kept.id.clone()]);
    m.stop().await.unwrap();
    let stored: Vec<VolumeId> = h.stored().into_iter().map(|r| r.id).collect();
    assert_eq!(stored, vec![kept.id.clone()]);
    // Untracked, not deleted: the plugin still has it.
    assert!(h.fake.ids().contains(&v.id));
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
}

#[tokio::test]
async fn delete_of_a_published_volume_walks_it_down_first() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op-1")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    assert!(m.handle.delete(&v.id).await.unwrap());
    for rpc in [
        CsiRpc::NodeUnpublishVolume,
        CsiRpc::NodeUnstageVolume,
        CsiRpc::ControllerUnpublishVolume,
        CsiRpc::DeleteVolume,
    ] {
        assert_eq!(h.fake.calls(rpc), 1, "{rpc}");
    }
    assert!(h.fake.ids().is_empty());
    m.stop().await.unwrap();
    assert!(h.stored().is_empty());
}

#[tokio::test]
async fn create_with_a_tracked_name_is_success_also_after_restart() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let a = m.handle.create(create_req("op-1")).await.unwrap();
    let b = m.handle.create(create_req("op-1")).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    // Another capability under the same name is refused.
    let mut other = create_req("op-1");
    other.capability = VolumeCapability::block();
    assert!(matches!(
        m.handle.create(other).await,
        Err(VolumeError::Mismatch {
            what: Mismatched::Capability,
            ..
        })
    ));
    m.stop().await.unwrap();

    // Spec §12.7: the replay after a restart finds the tracked volume.
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let c = m.handle.create(create_req("op-1")).await.unwrap();
    assert_eq!(c, a);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    assert_eq!(h.fake.st().created, 1);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn concurrent_creates_with_one_name_create_once() {
    let h = Harness::new(FakeCsi::full());
    h.fake.set_delay(Duration::from_millis(10));
    let m = h.start();
    let futs: Vec<_> = (0..8)
        .map(|_| {
            let hd = m.handle.clone();
            tokio::spawn(async move { hd.create(create_req("same")).await })
        })
        .collect();
    let mut ids = Vec::new();
    for f in futs {
        ids.push(f.await.unwrap().unwrap().id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1);
    assert_eq!(h.fake.calls(CsiRpc::CreateVolume), 1);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn transitions_follow_the_plugin_capabilities() {
    for (cpub, stage) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut caps = full_caps();
        caps.controller.publish_unpublish_volume = cpub;
        caps.node.stage_unstage_volume = stage;
        let h = Harness::new(FakeCsi::new(caps));
        let m = h.start();
        let v = m.handle.create(create_req("op")).await.unwrap();
        // The fake answers UNIMPLEMENTED to calls without their capability and checks the
        // staging path is sent iff staging is supported: success proves both.
        m.handle.publish(&v.id).await.unwrap();
        let want = |has: bool| usize::from(has);
        assert_eq!(h.fake.calls(CsiRpc::ControllerPublishVolume), want(cpub));
        assert_eq!(h.fake.calls(CsiRpc::NodeStageVolume), want(stage));
        assert_eq!(h.fake.calls(CsiRpc::NodePublishVolume), 1);
        let rec = &m.handle.volumes().await.unwrap()[0];
        assert_eq!(rec.state.name(), StateName::Published);
        // The stored state equals the in-memory one even when steps were no-ops.
        m.handle.delete(&v.id).await.unwrap();
        assert_eq!(h.fake.calls(CsiRpc::ControllerUnpublishVolume), want(cpub));
        assert_eq!(h.fake.calls(CsiRpc::NodeUnstageVolume), want(stage));
        assert!(h.fake.ids().is_empty());
        m.stop().await.unwrap();
        assert!(h.stored().is_empty());
    }
}

#[tokio::test]
async fn without_create_delete_capability_create_fails_and_delete_untracks() {
    let mut caps = full_caps();
    caps.controller.create_delete_volume = false;
    let h = Harness::new(FakeCsi::new(caps));
    let m = h.start();
    let e = m.handle.create(create_req("x")).await.unwrap_err();
    assert!(matches!(e, VolumeError::Unsupported { .. }), "{e:?}");
    // Mesos's text, with its missing closing quote, naming the configured plugin.
    assert_eq!(
        e.to_string(),
        "CREATE_DELETE_VOLUME controller capability is not supported for CSI plugin type \
         'org.test' and name 'fake"
    );
    // A pre-existing volume, validated, then deleted: only untracked.
    let fake = h.fake.clone();
    let id = {
        let mut st = fake.st();
        st.volumes
            .insert(VolumeId::new("pre-1"), FakeVolume::default());
        VolumeId::new("pre-1")
    };
    m.handle.validate(validate_req(&id)).await.unwrap();
    assert!(!m.handle.delete(&id).await.unwrap());
    assert_eq!(h.fake.calls(CsiRpc::DeleteVolume), 0);
    assert!(m.handle.volumes().await.unwrap().is_empty());
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
}

#[tokio::test]
async fn validate_tracks_pre_existing_volumes() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let id = VolumeId::new("pre-1");
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    // Unknown to the plugin: NOT_FOUND, nothing tracked.
    let missing = m
        .handle
        .validate(validate_req(&VolumeId::new("nope")))
        .await;
    assert!(matches!(missing, Err(VolumeError::Csi { .. })));
    // Not confirmed.
    let mut bad = validate_req(&id);
    bad.parameters.insert("unsupported".into(), "1".into());
    let e = m.handle.validate(bad).await.unwrap_err();
    assert!(matches!(e, VolumeError::ValidationFailed { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("Validation failed for volume 'pre-1': "),
        "{e}"
    );
    assert!(m.handle.volumes().await.unwrap().is_empty());

    let info = m.handle.validate(validate_req(&id)).await.unwrap();
    assert_eq!(info.capacity_bytes, 4096);
    assert_eq!(info.volume_context["from"], "list");
    let rec = &m.handle.volumes().await.unwrap()[0];
    assert!(rec.spec.pre_provisioned && rec.name.is_none());
    // Tracked: checked against the record, no RPC.
    let calls = h.fake.calls(CsiRpc::ValidateVolumeCapabilities);
    m.handle.validate(validate_req(&id)).await.unwrap();
    assert_eq!(h.fake.calls(CsiRpc::ValidateVolumeCapabilities), calls);
    let mut other = validate_req(&id);
    other.parameters.insert("k".into(), "v".into());
    assert!(matches!(
        m.handle.validate(other).await,
        Err(VolumeError::Mismatch {
            what: Mismatched::Parameters,
            ..
        })
    ));
    m.handle.publish(&id).await.unwrap();
    m.stop().await.unwrap();
    assert_eq!(h.stored().len(), 1);
}

#[tokio::test]
async fn reader_only_volumes_are_published_writable_as_mesos_does() {
    // Mesos never sets `readonly` for provider volumes (v1_volume_manager.cpp): the
    // provider lays out persistent volumes and cleans the disk through the mount.
    for mode in [
        AccessMode::SingleNodeReaderOnly,
        AccessMode::MultiNodeReaderOnly,
    ] {
        let h = Harness::new(FakeCsi::full());
        let m = h.start();
        let mut req = create_req("ro");
        req.capability.access_mode = mode;
        let v = m.handle.create(req).await.unwrap();
        m.handle.publish(&v.id).await.unwrap();
        assert_eq!(
            h.fake.volume(&v.id).unwrap().published,
            Some((published_target(&h, &v.id), false))
        );
        assert!(!m.handle.volumes().await.unwrap()[0].spec.readonly);
        m.stop().await.unwrap();
    }
}

#[tokio::test]
async fn operations_on_one_volume_are_serialized() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    h.fake.set_delay(Duration::from_millis(5));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let hd = m.handle.clone();
        let id = v.id.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                hd.publish(&id).await.map(|_| ())
            } else {
                hd.unpublish(&id).await
            }
        }));
    }
    for t in tasks {
        within(t).await.unwrap().unwrap();
    }
    assert!(!h.fake.st().overlap_on_one_volume);
    // Arrival order: the last request was an unpublish.
    let rec = &m.handle.volumes().await.unwrap()[0];
    assert_eq!(rec.state.name(), StateName::NodeReady);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn volumes_run_in_parallel_up_to_the_limit() {
    let mut h = Harness::new(FakeCsi::full());
    h.max_concurrent = 3;
    let m = h.start();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(
            m.handle
                .create(create_req(&format!("op-{i}")))
                .await
                .unwrap()
                .id,
        );
    }
    h.fake.set_delay(Duration::from_millis(30));
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let hd = m.handle.clone();
            let id = id.clone();
            tokio::spawn(async move { hd.publish(&id).await })
        })
        .collect();
    for t in tasks {
        within(t).await.unwrap().unwrap();
    }
    let (max, overlap) = {
        let st = h.fake.st();
        (st.max_running_total, st.overlap_on_one_volume)
    };
    assert_eq!(max, 3, "limit reached but not exceeded");
    assert!(!overlap);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_stuck_volume_does_not_block_the_others() {
    let mut h = Harness::new(FakeCsi::full());
    h.max_concurrent = 2;
    let m = h.start();
    let a = m.handle.create(create_req("a")).await.unwrap().id;
    let b = m.handle.create(create_req("b")).await.unwrap().id;
    let c = m.handle.create(create_req("c")).await.unwrap().id;
    h.fake.hold(&a);
    let hd = m.handle.clone();
    let (a2, hd2) = (a.clone(), m.handle.clone());
    let stuck = tokio::spawn(async move { hd.publish(&a2).await });
    // A second request for the stuck volume queues behind it...
    let queued = tokio::spawn(async move { hd2.unpublish(&a).await });
    // ...while other volumes proceed (one permit is left).
    within(m.handle.publish(&b)).await.unwrap();
    within(m.handle.publish(&c)).await.unwrap();
    within(m.handle.volumes()).await.unwrap();
    assert!(!stuck.is_finished() && !queued.is_finished());
    h.fake.unhold(&VolumeId::new("vol-1"));
    within(stuck).await.unwrap().unwrap();
    within(queued).await.unwrap().unwrap();
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_call_keeps_the_in_flight_state_and_the_next_request_re_drives() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    h.fake.fail(CsiRpc::NodeStageVolume, Code::Internal, 1);
    let e = m.handle.publish(&v.id).await.unwrap_err();
    assert!(matches!(
        e,
        VolumeError::Csi {
            rpc: CsiRpc::NodeStageVolume,
            ..
        }
    ));
    let mem = m.handle.volumes().await.unwrap();
    assert_eq!(mem[0].state.name(), StateName::NodeStage);
    m.stop().await.unwrap();
    // Memory and disk agree.
    assert_eq!(h.stored(), mem);

    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    // Recovery re-drove the interrupted NodeStage.
    assert_eq!(
        m.handle.volumes().await.unwrap()[0].state.name(),
        StateName::VolReady
    );
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
}

#[tokio::test]
async fn failures_before_any_call_change_nothing() {
    let mut h = Harness::new(FakeCsi::full());
    h.secrets = Arc::new(StaticSecrets::default().with("db", "pw", "s3cret"));
    let m = h.start();
    let e = m.handle.publish(&VolumeId::new("nope")).await.unwrap_err();
    assert!(matches!(e, VolumeError::UnknownVolume { .. }), "{e:?}");
    assert_eq!(e.to_string(), "Cannot publish unknown volume 'nope'");
    let id = VolumeId::new("pre");
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    let mut req = validate_req(&id);
    req.node_publish_secrets.insert(
        "password".into(),
        SecretRef {
            name: "db".into(),
            key: "missing".into(),
        },
    );
    m.handle.validate(req).await.unwrap();
    m.handle.volumes().await.unwrap();
    let before = h.fake.total_calls();
    // Stage works, publish needs the missing secret: refused before its intent.
    let e = m.handle.publish(&id).await.unwrap_err();
    assert!(matches!(e, VolumeError::Secret { .. }), "{e}");
    assert!(!format!("{e:?}").contains("s3cret"));
    assert_eq!(h.fake.calls(CsiRpc::NodePublishVolume), 0);
    assert!(h.fake.total_calls() > before);
    let rec = &m.handle.volumes().await.unwrap()[0];
    assert_eq!(rec.state.name(), StateName::VolReady);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn secrets_reach_the_plugin_and_never_the_disk() {
    let mut h = Harness::new(FakeCsi::full());
    h.secrets = Arc::new(
        StaticSecrets::default()
            .with("db", "pw", "s3cret")
            .with("db", "user", "admin"),
    );
    let m = h.start();
    let id = VolumeId::new("pre");
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    let mut req = validate_req(&id);
    let r = |key: &str| SecretRef {
        name: "db".into(),
        key: key.into(),
    };
    req.node_stage_secrets.insert("user".into(), r("user"));
    req.node_publish_secrets.insert("password".into(), r("pw"));
    m.handle.validate(req).await.unwrap();
    m.handle.publish(&id).await.unwrap();
    let seen = h.fake.st().secrets_seen.clone();
    assert_eq!(seen[0].1, CsiRpc::NodeStageVolume);
    assert_eq!(seen[0].2["user"], "admin");
    assert_eq!(seen[1].1, CsiRpc::NodePublishVolume);
    assert_eq!(seen[1].2["password"], "s3cret");
    m.stop().await.unwrap();
    let raw = std::fs::read(h.state_dir().join("state.db")).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("s3cret") && !text.contains("admin"));
    assert!(text.contains("\"pw\""), "the reference is stored");
}

#[tokio::test]
async fn not_found_from_undo_calls_and_delete_is_success() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    // The plugin lost the volume behind our back: every undo answers NOT_FOUND.
    {
        let mut st = h.fake.st();
        st.volumes.clear();
        st.by_name.clear();
    }
    h.fake.fail(CsiRpc::DeleteVolume, Code::NotFound, 1);
    assert!(m.handle.delete(&v.id).await.unwrap());
    assert!(m.handle.volumes().await.unwrap().is_empty());
    // Untracked delete: just the RPC.
    h.fake.fail(CsiRpc::DeleteVolume, Code::NotFound, 1);
    assert!(m.handle.delete(&VolumeId::new("other")).await.unwrap());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn list_is_paginated_and_capacity_follows_parameters() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    for i in 0..5 {
        m.handle
            .create(create_req(&format!("op-{i}")))
            .await
            .unwrap();
    }
    let page = m.handle.list(2, None).await.unwrap();
    assert_eq!(page.volumes.len(), 2);
    assert_eq!(page.next_token.as_deref(), Some("2"));
    let all = m.handle.list_all(2).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(h.fake.calls(CsiRpc::ListVolumes), 4);
    let cap = m
        .handle
        .capacity(mount_cap(), StringMap::new())
        .await
        .unwrap();
    assert_eq!(cap, (1 << 40) - 5 * (1 << 20));
    let unknown_pool = BTreeMap::from([("pool".into(), "x".into())]);
    assert_eq!(
        m.handle.capacity(mount_cap(), unknown_pool).await.unwrap(),
        0
    );
    m.stop().await.unwrap();

    // Without LIST_VOLUMES / GET_CAPACITY: empty and 0, no RPC.
    let mut caps = full_caps();
    caps.controller.list_volumes = false;
    caps.controller.get_capacity = false;
    let h = Harness::new(FakeCsi::new(caps));
    let m = h.start();
    m.handle.create(create_req("a")).await.unwrap();
    assert!(m.handle.list_all(0).await.unwrap().is_empty());
    assert_eq!(
        m.handle
            .capacity(mount_cap(), StringMap::new())
            .await
            .unwrap(),
        0
    );
    assert_eq!(h.fake.calls(CsiRpc::ListVolumes), 0);
    assert_eq!(h.fake.calls(CsiRpc::GetCapacity), 0);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_permanent_create_failure_leaves_no_intent_a_transient_one_does() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let mut refused = create_req("refused");
    refused.parameters.insert("refuse".into(), "1".into());
    assert!(matches!(
        m.handle.create(refused).await,
        Err(VolumeError::Csi { .. })
    ));
    h.fake
        .fail_after_effect(CsiRpc::CreateVolume, Code::Unavailable, 1);
    assert!(m.handle.create(create_req("lost")).await.is_err());
    m.stop().await.unwrap();
    let intents = h.stored_intents();
    assert_eq!(intents.len(), 1);
    assert_eq!(intents[0].name, "lost");
    assert!(h.stored().is_empty());
    // Recovery finishes the creation; the plugin's volume is tracked, created once.
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.intents, 1);
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].name.as_deref(), Some("lost"));
    assert_eq!(h.fake.st().created, 1);
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
}

#[tokio::test]
async fn restart_in_the_same_boot_keeps_published_volumes_without_calls() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
    let calls = h.fake.total_calls();
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.volumes, 1);
    // The published volume is republished (node_publish_required), which is a no-op.
    assert_eq!(r.jobs, 1);
    assert_eq!(h.fake.total_calls(), calls);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_target_unmounted_behind_our_back_is_published_again() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
    let target = h.paths().target(&v.id).unwrap();
    assert!(h.fake.st().mounted.remove(&target));
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.mount_mismatches, 1);
    assert_eq!(h.fake.calls(CsiRpc::NodePublishVolume), 2);
    assert!(h.fake.st().mounted.contains(&target));
    m.stop().await.unwrap();
}

#[tokio::test]
async fn reboot_publishes_again_what_must_be_and_resets_the_rest() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let a = m.handle.create(create_req("published")).await.unwrap().id;
    m.handle.publish(&a).await.unwrap();
    let b = m.handle.create(create_req("staged")).await.unwrap().id;
    m.handle.publish(&b).await.unwrap();
    // b: the caller unpublished it, but NodeUnstage failed: staged only, not required.
    h.fake.fail(CsiRpc::NodeUnstageVolume, Code::Internal, 1);
    assert!(m.handle.unpublish(&b).await.is_err());
    let c = m.handle.create(create_req("created")).await.unwrap().id;
    m.stop().await.unwrap();
    let before: BTreeMap<_, _> = h
        .stored()
        .into_iter()
        .map(|r| (r.id.clone(), r.state.name()))
        .collect();
    assert_eq!(before[&a], StateName::Published);
    assert_eq!(before[&b], StateName::NodeUnstage);
    assert_eq!(before[&c], StateName::Created);

    // Reboot: new boot id, every mount gone.
    h.fake.reboot();
    let mut h = h;
    h.boot = BootId::new("boot-2");
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.rebooted, 2);
    let after: BTreeMap<_, _> = m
        .handle
        .volumes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.id.clone(), r))
        .collect();
    assert_eq!(after[&a].state.name(), StateName::Published);
    assert_eq!(after[&a].state.boot_id(), Some(&BootId::new("boot-2")));
    assert_eq!(after[&b].state.name(), StateName::NodeReady);
    assert_eq!(after[&c].state.name(), StateName::Created);
    assert!(h.fake.volume(&a).unwrap().published.is_some());
    assert!(h.fake.volume(&b).unwrap().staged.is_none());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn recovery_fails_readiness_when_a_republish_fails() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let a = m.handle.create(create_req("a")).await.unwrap().id;
    m.handle.publish(&a).await.unwrap();
    m.stop().await.unwrap();
    h.fake.reboot();
    let mut h = h;
    h.boot = BootId::new("boot-2");
    h.fake.fail(CsiRpc::NodeStageVolume, Code::Internal, 1);
    let m = h.start();
    let e = within(m.handle.ready()).await.unwrap_err();
    assert!(matches!(e, VolumeError::RecoveryFailed { ref failed } if failed.len() == 1));
    // The manager keeps serving: the caller can retry.
    m.handle.publish(&a).await.unwrap();
    m.stop().await.unwrap();
}

#[tokio::test]
async fn untracked_mount_dirs_are_collected_only_when_unmounted() {
    let h = Harness::new(FakeCsi::full());
    let root = h.paths().root().to_owned();
    let loose = root.join("gone-1");
    std::fs::create_dir_all(loose.join("target")).unwrap();
    std::fs::create_dir_all(loose.join("staging")).unwrap();
    // A block volume's target is an empty file.
    let loose_block = root.join("gone-2");
    std::fs::create_dir_all(&loose_block).unwrap();
    std::fs::write(loose_block.join("target"), b"").unwrap();
    // Files written into a bare target (nothing mounted there) are never deleted.
    let littered = root.join("littered-1");
    std::fs::create_dir_all(littered.join("target")).unwrap();
    std::fs::write(littered.join("target/file"), b"x").unwrap();
    // A leftover the plugin still has mounted.
    let held = root.join("held-1");
    std::fs::create_dir_all(held.join("target")).unwrap();
    {
        let mut st = h.fake.st();
        st.volumes.insert(
            VolumeId::new("held-1"),
            FakeVolume {
                published: Some((held.join("target").to_str().unwrap().into(), false)),
                ..FakeVolume::default()
            },
        );
        st.mounted.insert(held.join("target"));
    }
    // Not an encoding of anything: never touched.
    let foreign = root.join("%zz");
    std::fs::create_dir_all(&foreign).unwrap();
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.collected, 3, "{r:?}");
    assert!(!loose.exists() && !loose_block.exists() && !held.exists());
    assert!(foreign.exists());
    assert_eq!(std::fs::read(littered.join("target/file")).unwrap(), b"x");
    assert_eq!(h.fake.calls(CsiRpc::NodeUnpublishVolume), 1);
    m.stop().await.unwrap();

    // Still mounted after NodeUnpublish failed: left in place.
    let h = Harness::new(FakeCsi::full());
    let stuck = h.paths().root().join("stuck-1");
    std::fs::create_dir_all(stuck.join("target")).unwrap();
    h.fake.st().mounted.insert(stuck.join("target"));
    h.fake.fail(CsiRpc::NodeUnpublishVolume, Code::Internal, 1);
    let m = h.start();
    let r = within(m.handle.ready()).await.unwrap();
    assert_eq!(r.collected, 0);
    assert_eq!(r.warnings.len(), 1);
    assert!(stuck.join("target").exists());
    m.stop().await.unwrap();
}

#[tokio::test]
async fn a_full_command_buffer_does_not_deadlock() {
    let h = Harness::new(FakeCsi::full());
    let cfg = h.config().command_buffer(1).max_concurrent(2);
    let m = h.start_with(cfg);
    h.fake.set_delay(Duration::from_millis(1));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let hd = m.handle.clone();
            tokio::spawn(async move {
                let v = hd.create(create_req(&format!("op-{}", i % 16))).await?;
                hd.publish(&v.id).await?;
                hd.volumes().await.map(|_| ())
            })
        })
        .collect();
    for t in tasks {
        within(t).await.unwrap().unwrap();
    }
    assert_eq!(m.handle.volumes().await.unwrap().len(), 16);
    m.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_stops_serving_and_releases_the_store() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    let handle = m.handle.clone();
    m.stop().await.unwrap();
    assert!(matches!(
        handle.publish(&v.id).await,
        Err(VolumeError::Stopped)
    ));
    assert!(matches!(handle.ready().await, Err(VolumeError::Stopped)));
    // The store lock is free again.
    drop(Store::open(h.state_dir()).unwrap());
}

#[tokio::test]
async fn shutdown_aborts_a_stuck_job_after_the_grace_period() {
    let (h, m, _, stuck) = publish_held_at_the_plugin(Duration::from_millis(100)).await;
    within(m.stop()).await.unwrap();
    assert!(matches!(
        within(stuck).await.unwrap(),
        Err(VolumeError::Stopped)
    ));
    // The intent was durable before the call.
    assert_eq!(h.stored()[0].state.name(), StateName::ControllerPublish);
}

/// A manager (shutdown grace `grace`) with one created volume whose publish is held
/// inside ControllerPublish.
async fn publish_held_at_the_plugin(
    grace: Duration,
) -> (
    Harness,
    Running,
    VolumeInfo,
    tokio::task::JoinHandle<Result<std::path::PathBuf, VolumeError>>,
) {
    let h = Harness::new(FakeCsi::full());
    let m = h.start_with(h.config().shutdown_grace(grace));
    let v = m.handle.create(create_req("op")).await.unwrap();
    h.fake.hold(&v.id);
    let hd = m.handle.clone();
    let id = v.id.clone();
    let publishing = tokio::spawn(async move { hd.publish(&id).await });
    until(|| h.fake.calls(CsiRpc::ControllerPublishVolume) > 0).await;
    (h, m, v, publishing)
}

#[tokio::test]
async fn a_job_that_finishes_within_the_shutdown_grace_is_applied_and_answered() {
    let (h, m, v, publishing) = publish_held_at_the_plugin(Duration::from_secs(5)).await;
    // A second request queued behind it never starts once shutdown began.
    let hd = m.handle.clone();
    let id = v.id.clone();
    let queued = tokio::spawn(async move { hd.unpublish(&id).await });
    // Queued on the lane behind the held publish before shutdown begins.
    let escaped = || queued.is_finished();
    jobs_until(&m.handle, |j| j.queued == 1, escaped).await;
    assert!(
        !queued.is_finished(),
        "the unpublish ran beside the held publish"
    );
    m.guard.request_stop();
    wait_until_not_accepting(&m.handle).await;
    // The running job may finish: its work is durable and its caller hears the result.
    h.fake.unhold(&v.id);
    let target = within(publishing).await.unwrap().unwrap();
    assert_eq!(target, h.paths().target(&v.id).unwrap());
    assert!(matches!(
        within(queued).await.unwrap(),
        Err(VolumeError::Stopped)
    ));
    within(m.guard.join()).await.unwrap();
    assert_eq!(h.stored()[0].state.name(), StateName::Published);
}

#[tokio::test]
async fn a_fatal_error_within_the_shutdown_grace_ends_the_worker_with_it() {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    let (h, m, v, publishing) = publish_held_at_the_plugin(Duration::from_secs(5)).await;
    m.guard.request_stop();
    wait_until_not_accepting(&m.handle).await;
    // The commit after the call fails: the process must learn that shutdown was not clean.
    fail::cfg(slrp_store::failpoints::BEFORE_COMMIT, "return").unwrap();
    h.fake.unhold(&v.id);
    assert!(matches!(
        within(publishing).await.unwrap(),
        Err(VolumeError::Stopped)
    ));
    let r = within(m.guard.join()).await;
    fail::cfg(slrp_store::failpoints::BEFORE_COMMIT, "off").unwrap();
    assert!(
        matches!(r, Err(VolumeError::Store { .. })),
        "worker ended with {r:?}"
    );
}

/// A volume id the store cannot hold (here longer than its 1024-byte key limit) is a bad
/// request for that volume, not a reason to stop the whole manager.
#[tokio::test]
async fn a_volume_id_the_store_cannot_hold_fails_only_its_request() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let id = VolumeId::new("x".repeat(2000));
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    let e = m.handle.validate(validate_req(&id)).await.unwrap_err();
    assert!(
        matches!(e, VolumeError::Store { .. }) && !e.is_fatal(),
        "{e:?}"
    );
    // Still serving.
    assert!(m.handle.volumes().await.unwrap().is_empty());
    let v = m.handle.create(create_req("op")).await.unwrap();
    m.handle.publish(&v.id).await.unwrap();
    m.stop().await.unwrap();
}

/// Spec §4.8: a CreateVolume that returns the id of a volume already tracked (under another
/// name, or validated) fails; it must not overwrite that volume's record (which would
/// forget that it is published).
#[tokio::test]
async fn create_returning_an_already_tracked_id_fails_and_keeps_the_record() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    // The fake names its first created volume `vol-1`: make that id a tracked, published
    // pre-existing volume first.
    let id = VolumeId::new("vol-1");
    h.fake
        .st()
        .volumes
        .insert(id.clone(), FakeVolume::default());
    m.handle.validate(validate_req(&id)).await.unwrap();
    m.handle.publish(&id).await.unwrap();
    let e = m.handle.create(create_req("op")).await.unwrap_err();
    assert!(
        matches!(&e, VolumeError::NameTaken { id: got, .. } if got == &id),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "Volume with name 'op' already exists");
    let recs = m.handle.volumes().await.unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].state.name(), StateName::Published);
    assert!(recs[0].spec.pre_provisioned && recs[0].name.is_none());
    m.stop().await.unwrap();
    assert_eq!(h.stored(), recs);
    // Nothing left for recovery to re-create.
    assert!(h.stored_intents().is_empty());
}

/// Settings that cannot work are refused by name, not silently clamped, and nothing is
/// started.
#[tokio::test]
async fn unusable_configs_are_refused_naming_the_field() {
    let h = Harness::new(FakeCsi::full());
    let relative = VolumeManagerConfig {
        mount_paths: MountPaths::new("relative/mounts"),
        ..h.config()
    };
    let cases = [
        (h.config().max_concurrent(0), "max_concurrent"),
        (h.config().command_buffer(0), "command_buffer"),
        (relative, "mount_paths"),
        (
            VolumeManagerConfig {
                node_id: String::new(),
                ..h.config()
            },
            "node_id",
        ),
    ];
    for (cfg, want) in cases {
        let store = Store::open(h.state_dir()).unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        match VolumeManager::spawn(cfg, store, h.fake.clone(), &shutdown) {
            Err(e @ VolumeError::Config { field, .. }) => {
                assert_eq!(field, want, "{e}");
                assert!(e.to_string().contains(want), "{e}");
            }
            Err(e) => panic!("{want}: {e:?}"),
            Ok(_) => panic!("{want}: started"),
        }
    }
    // Without PUBLISH_UNPUBLISH_VOLUME no node id is needed.
    let mut caps = full_caps();
    caps.controller.publish_unpublish_volume = false;
    let h = Harness::new(FakeCsi::new(caps));
    let cfg = VolumeManagerConfig {
        node_id: String::new(),
        ..h.config()
    };
    assert!(cfg.validate().is_ok());
}

/// Dropping the guard stops the manager: nothing keeps running unowned.
#[tokio::test]
async fn dropping_the_guard_stops_the_manager() {
    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    within(m.handle.ready()).await.unwrap();
    let handle = m.handle.clone();
    drop(m);
    wait_until_not_accepting(&handle).await;
    assert!(matches!(
        handle.create(create_req("late")).await,
        Err(VolumeError::Stopped)
    ));
}
