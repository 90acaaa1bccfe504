//! The provider worker against the real embedded manager (HTTP on a unix socket) and a
//! volume manager over the in-memory fake plugin: Mesos's provider tests that need no
//! operations (spec §11.1) and the lifecycle rules of §3.6 / §12.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod worker_env;

use std::time::Duration;

use slrp_core::provider::lifecycle::Lifecycle;
use slrp_core::provider::resources::{ProviderResources, Resources};
use slrp_core::provider::state::ProviderState;
use slrp_csi::CsiRpc;
use slrp_manager::ManagerMessage;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource_provider::{Event, event};
use slrp_proto::mesos::v1::{Resource, ResourceProviderId, Uuid};
use slrp_provider::worker::{Provider, ProviderError};
use slrp_test_support::fake_csi::FakeCsi;
use slrp_types::ProfileInfo;
use worker_env::*;

/// Mesos NoResource: without profiles and volumes, the first UPDATE_STATE after
/// SUBSCRIBED reports nothing, and the provider gets READY.
#[tokio::test]
async fn no_resource() {
    let mut env = Env::new(FakeCsi::full()).await;
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (id, resources) = env.next_update().await;
    assert!(resources.is_empty(), "{resources:?}");
    let status = ready(&provider.handle).await;
    assert_eq!(status.provider_id.as_deref(), Some(id.as_str()));
    assert_eq!(status.updates_sent, 1);
    provider.stop().await;
}

/// The same over the JSON transport (`application/json` both ways).
#[tokio::test]
async fn no_resource_over_json() {
    let mut env = Env::new(fake_with_one_volume()).await;
    let mut params = env.params(None, AGENT_S0);
    params.agent.content_type = slrp_wire::ContentType::Json;
    let provider = env.spawn(params).await;
    let (id, resources) = env.next_update().await;
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert_eq!(source_of(&resources[0]).id.as_deref(), Some("vol-1"));
    let status = ready(&provider.handle).await;
    assert_eq!(status.provider_id.as_deref(), Some(id.as_str()));
    provider.stop().await;
}

/// Mesos ProfileAppeared and ProfileDisappeared: a profile the adaptor starts reporting
/// becomes a storage pool with GetCapacity's value; one it stops reporting goes.
#[tokio::test]
async fn profile_appeared_and_disappeared() {
    let mut env = Env::new(FakeCsi::full()).await;
    let file = env.with_profiles(&profile_doc(&[]));
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (_, first) = env.next_update().await;
    assert!(first.is_empty(), "{first:?}");
    ready(&provider.handle).await;

    std::fs::write(&file, profile_doc(&["test"]).to_string()).unwrap();
    env.profiles.as_ref().unwrap().poll_now().await.unwrap();
    let (_, resources) = env.next_update().await;
    assert_eq!(pool_profiles(&resources), ["test"]);
    let mb = resources[0].scalar.unwrap().value;
    assert_eq!(mb, (env.fake().total_bytes as f64) / 1_048_576.0);

    std::fs::write(&file, profile_doc(&[]).to_string()).unwrap();
    env.profiles.as_ref().unwrap().poll_now().await.unwrap();
    let (_, resources) = env.next_update().await;
    assert!(resources.is_empty(), "{resources:?}");
    // Spec §6.6: every UPDATE_STATE carries a fresh random UUID.
    assert_eq!(env.versions.len(), 3);
    assert!(
        env.versions.iter().all(|v| v.len() == 16),
        "{:?}",
        env.versions
    );
    let distinct: std::collections::BTreeSet<_> = env.versions.iter().collect();
    assert_eq!(distinct.len(), 3, "{:?}", env.versions);
    provider.stop().await;
}

/// A profile the plugin refuses (INVALID_ARGUMENT to its GetCapacity, every time) gets no
/// pool, and the other profiles' pools are reported. Mesos fails the whole reconciliation
/// on it, so no pool would ever be reported.
#[tokio::test]
async fn a_profile_the_plugin_refuses_does_not_hold_back_the_others() {
    let mut env = Env::new(FakeCsi::full()).await;
    let mut doc = profile_doc(&["good", "bad"]);
    doc["profile_matrix"]["bad"]["create_parameters"] = serde_json::json!({"pool": "refused"});
    env.with_profiles(&doc);
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (_, first) = env.next_update().await;
    assert!(first.is_empty(), "{first:?}");
    ready(&provider.handle).await;
    // The profile watch starts at READY; its reconciliation reports the good pool.
    let (_, resources) = env.next_update().await;
    assert_eq!(pool_profiles(&resources), ["good"]);
    assert!(env.fake().calls(CsiRpc::GetCapacity) >= 2);
    provider.stop().await;
}

/// Spec §3.6 / §12 item 8: a resubscription after a manager restart keeps the provider id,
/// reconciles once and starts no second periodic loop.
///
/// Counted in ListVolumes calls: one loop waits a whole interval after each reconciliation,
/// so a window of `W` holds at most `W / interval + 1` of them whatever the machine's load;
/// a loop per SUBSCRIBED makes about twice that.
#[tokio::test]
async fn resubscription_keeps_the_id_and_a_single_periodic_loop() {
    let interval = Duration::from_millis(100);
    let mut env = Env::new(FakeCsi::full()).await;
    let provider = env
        .spawn(env.params(Some(interval.as_secs_f64()), AGENT_S0))
        .await;
    let (id, _) = env.next_update().await;
    ready(&provider.handle).await;

    env.restart_manager(4 * 1024 * 1024).await;
    let (again, _) = env.next_update().await;
    assert_eq!(again, id, "the resubscription kept the provider id");
    let status = ready(&provider.handle).await;
    assert_eq!(status.provider_id.as_deref(), Some(id.as_str()));

    let start = tokio::time::Instant::now();
    let before = env.fake().calls(CsiRpc::ListVolumes);
    // An observation window, not a synchronisation: the bound holds for any length.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let periodic = env.fake().calls(CsiRpc::ListVolumes) - before;
    let window = start.elapsed();
    let bound = (window.as_millis() / interval.as_millis()) as usize + 1;
    assert!(
        periodic >= 1,
        "the periodic loop survived the resubscription"
    );
    assert!(
        periodic <= bound,
        "{periodic} reconciliations in {window:?} of a {interval:?} interval (at most {bound})"
    );
    provider.stop().await;
}

/// Spec §6.5 and §12 item 30: a zero or negative interval disables periodic
/// reconciliation (Mesos lets a negative one fire without delay).
#[tokio::test]
async fn non_positive_interval_disables_periodic_reconciliation() {
    for seconds in [0.0, -1.0] {
        let mut env = Env::new(FakeCsi::full()).await;
        let provider = env.spawn(env.params(Some(seconds), AGENT_S0)).await;
        env.next_update().await;
        ready(&provider.handle).await;
        let before = env.fake().calls(CsiRpc::ListVolumes);
        // An observation window: nothing may happen in it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            env.fake().calls(CsiRpc::ListVolumes),
            before,
            "interval {seconds}"
        );
        provider.stop().await;
    }
}

fn uuid(byte: u8) -> Uuid {
    Uuid {
        value: vec![byte; 16],
    }
}

/// Spec §3.5 / §3.6 (§12 item 10): while the subscription reconciliation runs
/// (ListVolumes held), ACKNOWLEDGE_OPERATION_STATUS and RECONCILE_OPERATIONS are queued
/// (Mesos aborts), APPLY_OPERATION is dropped and PUBLISH_RESOURCES answered FAILED; the
/// queued events are handled once READY.
#[tokio::test]
async fn events_before_ready_are_queued_dropped_or_answered() {
    let env = Env::new(FakeCsi::full()).await;
    env.fake().set_down(CsiRpc::ListVolumes, true);
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let status = status_until(&provider.handle, "SUBSCRIBED", |s| {
        s.lifecycle == Lifecycle::Subscribed
    })
    .await;
    let id = status.provider_id.unwrap();
    slrp_test_support::harness::until(|| env.fake().st().waiting_for_endpoint == 1).await;

    let manager = env.manager().clone();
    let ack = Event {
        r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
        acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
            status_uuid: uuid(1),
            operation_uuid: uuid(2),
        }),
        ..Event::default()
    };
    let reconcile = Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: vec![uuid(2)],
        }),
        ..Event::default()
    };
    let apply = Event {
        r#type: Some(event::Type::ApplyOperation as i32),
        apply_operation: Some(event::ApplyOperation {
            framework_id: None,
            info: Default::default(),
            operation_uuid: uuid(3),
            resource_version_uuid: uuid(4),
        }),
        ..Event::default()
    };
    for e in [ack, reconcile, apply] {
        manager.send_event(&id, e).await.unwrap();
    }
    let disk = Resource {
        provider_id: Some(ResourceProviderId { value: id.clone() }),
        ..ProviderResources::new(
            ResourceProviderId { value: id.clone() },
            "org.test",
            "fake",
            Vec::new(),
        )
        .unwrap()
        .raw_disk(1 << 20, None, Some("v"), None)
    };
    let published = tokio::time::timeout(HANG, manager.publish(vec![disk]))
        .await
        .unwrap();
    assert!(published.is_err(), "a publish before READY fails");

    let status = status_until(&provider.handle, "events sorted", |s| {
        s.events.queued == 2 && s.events.dropped == 1 && s.events.publish_failed == 1
    })
    .await;
    assert_eq!(status.lifecycle, Lifecycle::Subscribed);
    assert_eq!(status.events.handled, 0);

    env.fake().set_down(CsiRpc::ListVolumes, false);
    let status = ready(&provider.handle).await;
    assert_eq!(status.events.queued, 0);
    assert_eq!(
        status.events.handled, 2,
        "the queued ACK and RECONCILE reach READY"
    );
    provider.stop().await;
}

/// Spec §12 item 9: a subscription reconciliation that finishes after the manager went
/// away does not make the provider READY; the next subscription does.
#[tokio::test]
async fn reconciliation_finishing_after_a_disconnect_does_not_set_ready() {
    let mut env = Env::new(FakeCsi::full()).await;
    env.fake().set_down(CsiRpc::ListVolumes, true);
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    status_until(&provider.handle, "SUBSCRIBED", |s| {
        s.lifecycle == Lifecycle::Subscribed
    })
    .await;
    slrp_test_support::harness::until(|| env.fake().st().waiting_for_endpoint == 1).await;

    env.stop_manager().await;
    status_until(&provider.handle, "DISCONNECTED", |s| {
        !s.lifecycle.is_subscribed()
    })
    .await;
    env.fake().set_down(CsiRpc::ListVolumes, false);
    let status = status_until(&provider.handle, "reconciled", |s| s.reconciliations == 1).await;
    assert_ne!(status.lifecycle, Lifecycle::Ready, "{status:?}");
    assert_eq!(status.updates_sent, 0);

    env.restart_manager(4 * 1024 * 1024).await;
    let status = ready(&provider.handle).await;
    assert_eq!(status.reconciliations, 2);
    provider.stop().await;
}

/// Spec §12 item 12: an UPDATE_STATE the manager refuses (its body is over the manager's
/// limit) is retried with backoff and is not fatal; the next subscription sends it again.
#[tokio::test]
async fn a_refused_update_state_says_why_and_recovers_when_the_limit_is_raised() {
    let fake = FakeCsi::full();
    for n in 0..20 {
        let id = format!("volume-with-a-long-name-to-make-the-update-large-{n:03}");
        fake.st()
            .volumes
            .insert(slrp_core::volume::VolumeId::new(id), Default::default());
    }
    let mut env = Env::new(fake).await;
    for v in env.fake().st().volumes.values_mut() {
        v.capacity = 1 << 20;
    }
    // SUBSCRIBE fits, an UPDATE_STATE with 20 volumes does not.
    env.restart_manager(2048).await;
    let metrics = slrp_agent::Metrics::default();
    let mut deps = env.deps();
    deps.agent_metrics = metrics.clone();
    let cancel = env.cancel.child_token();
    let (handle, task) = Provider::spawn(env.params(None, AGENT_S0), deps, cancel.clone())
        .await
        .unwrap();
    let provider = Running {
        handle,
        task,
        cancel,
    };
    // The only call before READY is the UPDATE_STATE; the manager refuses its body.
    slrp_test_support::harness::until(|| metrics.calls_refused.get() >= 1).await;
    let mut status = provider.handle.status();
    let status = status
        .wait_for(|s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("refused"))
        })
        .await
        .unwrap()
        .clone();
    assert_ne!(status.lifecycle, Lifecycle::Ready);
    let error = status.last_error.unwrap();
    for part in [
        "exceeds the limit of 2048 bytes",
        "max_body_bytes",
        "the UPDATE_STATE with the provider's total is",
    ] {
        assert!(error.contains(part), "{part:?} missing in {error:?}");
    }
    // Not resent unchanged: the provider's backoff is milliseconds here, so a retry loop
    // would have sent it again many times meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metrics.calls_refused.get(), 1);
    assert_eq!(metrics.call_failures.get(), 1);

    // A manager with a higher limit is a new session: the subscription sends again.
    env.restart_manager(4 * 1024 * 1024).await;
    let (_, resources) = env.next_update().await;
    assert_eq!(resources.len(), 20);
    let status = ready(&provider.handle).await;
    assert!(status.last_error.is_none());
    provider.stop().await;
}

/// A plugin that already has volume `vol-1` of 1 GiB (pre-existing, no CreateVolume).
fn mount_profile() -> ProfileInfo {
    use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;
    use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::{
        AccessMode, AccessType, MountVolume, access_mode,
    };
    ProfileInfo {
        capability: VolumeCapability {
            access_mode: AccessMode {
                mode: access_mode::Mode::SingleNodeWriter as i32,
            },
            access_type: Some(AccessType::Mount(MountVolume::default())),
        },
        parameters: Default::default(),
    }
}

/// Spec §3.3 step 4 / §8.4: a recovered storage pool whose profile is not recorded fails
/// recovery with Mesos's text, naming the pool and the store.
#[tokio::test]
async fn recovery_refuses_a_pool_without_its_profile() {
    let env = Env::new(FakeCsi::full()).await;
    let ctx = ProviderResources::new(
        ResourceProviderId { value: "rp".into() },
        "org.test",
        "fake",
        Vec::new(),
    )
    .unwrap();
    let state = ProviderState {
        provider_id: Some(ctx.provider_id().clone()),
        total: Resources::from(ctx.raw_disk(1 << 30, Some("gone"), None, None)),
        profiles: Default::default(),
    };
    slrp_provider::persist::save_state(&state, &env.store, AGENT_S0)
        .await
        .unwrap();
    let error = Provider::spawn(
        env.params(None, AGENT_S0),
        env.deps(),
        env.cancel.child_token(),
    )
    .await
    .expect_err("recovery must fail");
    let chain = slrp_types::DisplayChain(&error).to_string();
    assert!(matches!(error, ProviderError::Recover { .. }), "{chain}");
    assert!(
        chain.contains("Failed to recover resource provider with type"),
        "{chain}"
    );
    assert!(
        chain.contains("Cannot recover profile for storage pool"),
        "{chain}"
    );
    assert!(chain.contains("gone"), "{chain}");
    assert!(
        chain.contains(&env.harness.state_dir().display().to_string()),
        "{chain}"
    );
}

/// Mesos ROOT_AgentRegisteredWithNewId: under a new agent id the provider subscribes as a
/// new identity; a disk frameworks made (MOUNT, with a profile) comes back as a
/// pre-existing RAW volume without profile, under the new provider id. The old identity's
/// record is left alone.
#[tokio::test]
async fn a_new_agent_id_is_a_new_identity() {
    let mut env = Env::new(fake_with_one_volume()).await;

    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (old_id, resources) = env.next_update().await;
    assert_eq!(resources.len(), 1);
    ready(&provider.handle).await;
    provider.stop().await;

    // What a CREATE_DISK of issue #11 would have left: vol-1 as a MOUNT disk of "fast".
    let mut state = slrp_provider::persist::load_state(&env.store, AGENT_S0)
        .await
        .unwrap();
    let mut disk = state.total.to_vec()[0].clone();
    {
        let source = disk.disk.as_mut().unwrap().source.as_mut().unwrap();
        source.r#type = SourceType::Mount as i32;
        source.profile = Some("fast".into());
    }
    state.total = Resources::from(disk);
    state.profiles.insert("fast".into(), mount_profile());
    slrp_provider::persist::save_state(&state, &env.store, AGENT_S0)
        .await
        .unwrap();

    env.restart_manager(4 * 1024 * 1024).await;
    let provider = env.spawn(env.params(None, AGENT_S1)).await;
    let (new_id, resources) = env.next_update().await;
    assert_ne!(new_id, old_id);
    assert_eq!(resources.len(), 1, "{resources:?}");
    let source = source_of(&resources[0]);
    assert_eq!(source.id.as_deref(), Some("vol-1"));
    assert_eq!(source.r#type, SourceType::Raw as i32);
    assert_eq!(source.profile, None);
    assert_eq!(resources[0].provider_id.as_ref().unwrap().value, new_id);
    ready(&provider.handle).await;
    provider.stop().await;

    let old = slrp_provider::persist::load_state(&env.store, AGENT_S0)
        .await
        .unwrap();
    assert_eq!(old.provider_id.unwrap().value, old_id);
    assert_eq!(
        source_of(&old.total.to_vec()[0]).r#type,
        SourceType::Mount as i32
    );
}

/// Spec §12 item 13: the periodic loop survives failed reconciliations (Mesos stops it
/// for good at the first one) and goes on after a backoff.
#[tokio::test]
async fn periodic_reconciliation_survives_failures() {
    let mut env = Env::new(FakeCsi::full()).await;
    let provider = env.spawn(env.params(Some(0.05), AGENT_S0)).await;
    env.next_update().await;
    ready(&provider.handle).await;

    env.fake()
        .fail(CsiRpc::ListVolumes, slrp_csi::Code::Unavailable, 2);
    let failed = status_until(&provider.handle, "a failed periodic reconciliation", |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("periodic reconciliation failed"))
    })
    .await;
    let status = status_until(&provider.handle, "reconciling again", |s| {
        s.reconciliations > failed.reconciliations
    })
    .await;
    assert_eq!(status.lifecycle, Lifecycle::Ready);
    assert!(env.fake().calls(CsiRpc::ListVolumes) >= 4);
    provider.stop().await;
}

/// A failed call never removes resources (issue #21): GetCapacity failing with INTERNAL
/// or UNKNOWN (or any code but INVALID_ARGUMENT and OUT_OF_RANGE) fails the
/// reconciliation, which is retried, and the pool stays: no UPDATE_STATE without it, no
/// rescinded offers. Classed as the plugin's refusal of the profile, one INTERNAL removed
/// the pool until the next reconciliation.
#[tokio::test]
async fn a_transient_capacity_failure_keeps_the_pool() {
    for code in [slrp_csi::Code::Internal, slrp_csi::Code::Unknown] {
        let mut env = Env::new(FakeCsi::full()).await;
        env.with_profiles(&profile_doc(&["test"]));
        let provider = env.spawn(env.params(Some(0.05), AGENT_S0)).await;
        env.next_update().await;
        ready(&provider.handle).await;
        let (_, resources) = env.next_update().await;
        assert_eq!(pool_profiles(&resources), ["test"]);
        let before = status_until(&provider.handle, "the pool in the status", |s| {
            s.updates_sent >= 2 && !s.total.is_empty()
        })
        .await;

        env.fake().fail(CsiRpc::GetCapacity, code, 1);
        let failed = status_until(&provider.handle, "a failed reconciliation", |s| {
            s.last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("periodic reconciliation failed"))
        })
        .await;
        let after = status_until(&provider.handle, "two reconciliations more", |s| {
            s.reconciliations >= failed.reconciliations + 2
        })
        .await;
        assert_eq!(after.updates_sent, before.updates_sent, "{code:?}");
        assert_eq!(after.total, before.total, "{code:?}");
        provider.stop().await;
    }
}

/// Spec §3.3: the identity is recovered before subscribing, so a restarted provider
/// resubscribes with its id (the manager admits only a known id) and reports the total it
/// checkpointed plus what the plugin lists now.
#[tokio::test]
async fn a_restarted_provider_resubscribes_with_its_recovered_id() {
    let mut env = Env::new(fake_with_one_volume()).await;

    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (id, first) = env.next_update().await;
    assert_eq!(first.len(), 1);
    ready(&provider.handle).await;
    provider.stop().await;

    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let recovered = provider.handle.status().borrow().clone();
    assert_eq!(recovered.provider_id.as_deref(), Some(id.as_str()));
    assert_eq!(
        recovered.total.to_vec(),
        first,
        "the checkpointed total is recovered"
    );
    let (again, resources) = env.next_update().await;
    assert_eq!(again, id);
    assert_eq!(resources, first);
    ready(&provider.handle).await;
    provider.stop().await;
}

/// Spec §3.6: the agent comes back with a new agent id while slrp runs. The manager does
/// not admit the old provider id; the worker asks the agent for its id (GET_AGENT), takes
/// the new agent id's identity (none recorded yet: subscribe without id) with a new agent
/// client, and the plugin's volumes reappear under the new provider id. Without
/// `follow_agent_id` it would retry the unknown id for ever.
#[tokio::test]
async fn an_agent_id_change_while_running_switches_identity() {
    let mut env = Env::new(fake_with_one_volume()).await;
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    let (old_id, _) = env.next_update().await;
    ready(&provider.handle).await;

    env.restart_manager_as(4 * 1024 * 1024, AGENT_S1).await;
    let (new_id, resources) = env.next_update().await;
    assert_ne!(new_id, old_id);
    assert_eq!(resources.len(), 1, "{resources:?}");
    assert_eq!(source_of(&resources[0]).id.as_deref(), Some("vol-1"));
    assert_eq!(resources[0].provider_id.as_ref().unwrap().value, new_id);
    let status = ready(&provider.handle).await;
    assert_eq!(status.agent_id, AGENT_S1);
    assert_eq!(status.provider_id.as_deref(), Some(new_id.as_str()));
    provider.stop().await;

    for (agent_id, id) in [(AGENT_S0, &old_id), (AGENT_S1, &new_id)] {
        let state = slrp_provider::persist::load_state(&env.store, agent_id)
            .await
            .unwrap();
        assert_eq!(&state.provider_id.unwrap().value, id, "{agent_id}");
    }
}

/// The queue of events waiting for READY is bounded: beyond `pending_events` the oldest
/// ACKNOWLEDGE_OPERATION_STATUS goes (the status update manager resends its status).
#[tokio::test]
async fn events_waiting_for_ready_are_bounded() {
    let env = Env::new(FakeCsi::full()).await;
    env.fake().set_down(CsiRpc::ListVolumes, true);
    let mut params = env.params(None, AGENT_S0);
    params.pending_events = 2;
    let provider = env.spawn(params).await;
    let status = status_until(&provider.handle, "SUBSCRIBED", |s| {
        s.lifecycle == Lifecycle::Subscribed
    })
    .await;
    let id = status.provider_id.unwrap();
    for n in 0..3 {
        let ack = Event {
            r#type: Some(event::Type::AcknowledgeOperationStatus as i32),
            acknowledge_operation_status: Some(event::AcknowledgeOperationStatus {
                status_uuid: uuid(n),
                operation_uuid: uuid(n),
            }),
            ..Event::default()
        };
        env.manager().send_event(&id, ack).await.unwrap();
    }
    let status = status_until(&provider.handle, "the queue overflowed", |s| {
        s.events.overflowed == 1
    })
    .await;
    assert_eq!(status.events.queued, 2);

    env.fake().set_down(CsiRpc::ListVolumes, false);
    let status = ready(&provider.handle).await;
    assert_eq!(status.events.handled, 2);
    provider.stop().await;
}

/// Mesos sends the first UPDATE_STATE of a subscription from the subscription
/// reconciliation ("so that the total resources contain existing volumes", and, with
/// issue #11, after the status streams are recovered). A periodic reconciliation of the
/// previous session that ends after the resubscription with a changed total must not
/// send its own UPDATE_STATE ahead of it: the subscription reconciliation that follows
/// reports the change.
#[tokio::test]
async fn a_stale_reconciliation_does_not_send_before_the_subscription_one() {
    let mut env = Env::new(FakeCsi::full()).await;
    let provider = env.spawn(env.params(Some(0.05), AGENT_S0)).await;
    let (id, first) = env.next_update().await;
    assert!(first.is_empty(), "{first:?}");
    ready(&provider.handle).await;

    // Hold the next periodic reconciliation in ListVolumes, with a volume to find.
    env.fake().set_down(CsiRpc::ListVolumes, true);
    slrp_test_support::harness::until(|| env.fake().st().waiting_for_endpoint == 1).await;
    env.fake().st().volumes.insert(
        slrp_core::volume::VolumeId::new("vol-1"),
        slrp_test_support::fake_csi::FakeVolume {
            capacity: 1 << 20,
            ..Default::default()
        },
    );
    let before = provider.handle.status().borrow().reconciliations;
    env.restart_manager(4 * 1024 * 1024).await;
    status_until(&provider.handle, "resubscribed", |s| {
        s.lifecycle == Lifecycle::Subscribed
    })
    .await;
    env.fake().set_down(CsiRpc::ListVolumes, false);
    let status = ready(&provider.handle).await;
    assert!(status.reconciliations >= before + 2, "{status:?}");

    // READY follows the accepted subscription UPDATE_STATE: every update of this
    // session is in the channel now.
    let mut updates = Vec::new();
    while let Ok(message) = env.messages.try_recv() {
        if let ManagerMessage::UpdateState {
            provider_id,
            resources,
            ..
        } = message
        {
            updates.push((provider_id, resources));
        }
    }
    assert_eq!(
        updates.len(),
        1,
        "one UPDATE_STATE per subscription: {updates:?}"
    );
    assert_eq!(updates[0].0, id);
    assert_eq!(updates[0].1.len(), 1, "{:?}", updates[0].1);
    provider.stop().await;
}

/// A reconciliation started under the old identity that ends after an agent-id switch is
/// not applied to the new identity (its listing was taken for the old one); only its
/// translated profiles are kept, and the new identity's own subscription reconciliation
/// runs and reports them. Counted: exactly one reconciliation after the stale one.
#[tokio::test]
async fn a_reconciliation_of_the_old_identity_is_not_applied_to_the_new_one() {
    let mut env = Env::new(FakeCsi::full()).await;
    let file = env.with_profiles(&profile_doc(&[]));
    let provider = env.spawn(env.params(None, AGENT_S0)).await;
    ready(&provider.handle).await;
    std::fs::write(&file, profile_doc(&["test"]).to_string()).unwrap();
    env.profiles.as_ref().unwrap().poll_now().await.unwrap();
    loop {
        let (_, resources) = env.next_update().await;
        if pool_profiles(&resources) == ["test"] {
            break;
        }
    }

    // A profile job of the old identity waits on ListVolumes.
    env.fake().set_down(CsiRpc::ListVolumes, true);
    std::fs::write(&file, profile_doc(&["other", "test"]).to_string()).unwrap();
    env.profiles.as_ref().unwrap().poll_now().await.unwrap();
    slrp_test_support::harness::until(|| env.fake().st().waiting_for_endpoint > 0).await;

    env.restart_manager_as(4 * 1024 * 1024, AGENT_S1).await;
    status_until(&provider.handle, "the new identity subscribed", |s| {
        s.agent_id == AGENT_S1 && s.lifecycle == Lifecycle::Subscribed
    })
    .await;
    // Jobs run one at a time: nothing else ran or runs while the stale one waits.
    let before = provider.handle.status().borrow().reconciliations;
    env.fake().set_down(CsiRpc::ListVolumes, false);
    let status = ready(&provider.handle).await;
    assert_eq!(
        status.reconciliations,
        before + 1,
        "only the new identity's subscription reconciliation is applied"
    );
    assert_eq!(pool_profiles(&status.total.to_vec()), ["other", "test"]);
    provider.stop().await;
}
