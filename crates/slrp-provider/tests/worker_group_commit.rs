//! Group commit in the provider worker: operations that arrive while a commit is on its
//! way are committed together in the worker's next turn (one fsync), not one by one, and
//! their statuses still leave only once they are durable.
//!
//! Its own test binary: it pauses the store's writer with a fail point, which is global
//! to the process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod worker_env;

use slrp_manager::{ApplyRequest, ManagerMessage};
use slrp_proto::mesos::v1::resource::ReservationInfo;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_proto::mesos::v1::{OperationState, Resource, offer, value};
use slrp_provider::persist::load_operations;
use slrp_store::failpoints::BATCH_START;
use slrp_test_support::fake_csi::FakeCsi;
use slrp_test_support::harness::until;
use worker_env::*;

/// Operations sent while the writer is paused.
const OPERATIONS: usize = 8;

fn reserve_part(pool: &Resource, mb: f64) -> offer::Operation {
    let mut part = pool.clone();
    part.scalar = Some(value::Scalar { value: mb });
    let mut reserved = part.clone();
    reserved.reservations.push(ReservationInfo {
        r#type: Some(ReservationType::Dynamic as i32),
        role: Some("storage".to_owned()),
        ..ReservationInfo::default()
    });
    offer::Operation {
        r#type: Some(offer::operation::Type::Reserve as i32),
        reserve: Some(offer::operation::Reserve {
            source: vec![part],
            resources: vec![reserved],
        }),
        ..offer::Operation::default()
    }
}

/// Eight RESERVEs reach the provider while the store's writer is held: the worker handles
/// the first, waits for its commit, and commits all that arrived meanwhile in one
/// transaction; each operation's FINISHED status is sent after its commit. With a commit
/// awaited per operation this took eight syncs.
#[tokio::test]
async fn operations_arriving_during_a_commit_share_the_next_one() {
    let mut env = Env::new(FakeCsi::full()).await;
    env.with_profiles(&profile_doc(&["test"]));
    let mut deps = env.deps();
    let agent_metrics = slrp_agent::Metrics::default();
    deps.agent_metrics = agent_metrics.clone();
    let provider = env.spawn_with(env.params(None, AGENT_S0), deps).await;
    let (id, pool) = loop {
        let (id, resources) = env.next_update().await;
        if let Some(pool) = resources.iter().find(|r| source_of(r).profile.is_some()) {
            break (id, pool.clone());
        }
    };
    ready(&provider.handle).await;

    let syncs = env.store.stats().syncs;
    let events = agent_metrics.events.get();
    fail::cfg(BATCH_START, "pause").unwrap();
    let mut operations = Vec::new();
    for _ in 0..OPERATIONS {
        let op = env
            .manager()
            .apply_operation(&id, ApplyRequest::new(reserve_part(&pool, 64.0)))
            .await
            .unwrap();
        operations.push(op);
    }
    // Every APPLY_OPERATION reached the provider's client while no commit could finish.
    until(|| agent_metrics.events.get() >= events + OPERATIONS as u64).await;
    fail::remove(BATCH_START);

    let mut finished = std::collections::BTreeSet::new();
    while finished.len() < OPERATIONS {
        let message = tokio::time::timeout(HANG, env.messages.recv())
            .await
            .expect("status updates in time")
            .unwrap();
        if let ManagerMessage::UpdateOperationStatus { update, .. } = message {
            assert_eq!(
                update.status.state,
                OperationState::OperationFinished as i32,
                "{:?}",
                update.status.message
            );
            let op = uuid::Uuid::from_slice(&update.operation_uuid.value).unwrap();
            assert!(operations.contains(&op));
            // Sent only once its FINISHED record was durable.
            let stored = load_operations(&env.store, AGENT_S0).await.unwrap();
            assert!(
                stored.iter().any(|s| s.uuid == op && s.is_terminal()),
                "the status of {op} came before its commit"
            );
            finished.insert(op);
        }
    }
    let used = env.store.stats().syncs - syncs;
    // The turn that was waiting when the writer paused, the turn with the rest, and one
    // more if the last event was still on its way into the worker's queue.
    assert!(
        (1..=3).contains(&used),
        "{OPERATIONS} operations took {used} syncs"
    );
    provider.stop().await;
}
