#![allow(clippy::unwrap_used)]

use super::*;
use crate::provider::state::open_store;
use slrp_proto::mesos::v1::OperationId;
use slrp_proto::mesos::v1::offer::operation::{Reserve, Type};

const SECOND: Duration = Duration::from_secs(1);

fn exact() -> StatusRetry {
    StatusRetry {
        jitter: Jitter::None,
        ..StatusRetry::default()
    }
}

fn agent() -> AgentId {
    AgentId {
        value: "agent-S0".into(),
    }
}

fn info() -> offer::Operation {
    offer::Operation {
        r#type: Some(Type::Reserve as i32),
        id: Some(OperationId {
            value: "op-1".into(),
        }),
        reserve: Some(Reserve::default()),
        ..Default::default()
    }
}

fn pending() -> TrackedOperation {
    TrackedOperation::pending(
        uuid::Uuid::new_v4(),
        Some(FrameworkId {
            value: "fw-1".into(),
        }),
        info(),
        &agent(),
        &ResourceProviderId {
            value: "rp-1".into(),
        },
    )
}

fn status(state: OperationState) -> OperationStatus {
    OperationStatus {
        operation_id: info().id,
        state: state as i32,
        message: None,
        converted_resources: Vec::new(),
        uuid: Some(proto_uuid(&uuid::Uuid::new_v4())),
        agent_id: Some(agent()),
        resource_provider_id: None,
    }
}

fn id(status: &OperationStatus) -> uuid::Uuid {
    status_uuid(status).unwrap()
}

/// A resumed manager tracking one PENDING operation.
fn running(retry: StatusRetry, now: Instant) -> (Operations, uuid::Uuid) {
    let mut ops = Operations::new(retry);
    assert!(ops.resume(now).is_empty());
    let op = pending();
    let uuid = op.uuid;
    ops.insert_pending(op).unwrap();
    (ops, uuid)
}

#[test]
fn update_and_ack() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let finished = status(OperationState::OperationFinished);
    let sent = ops.finish(&op, finished.clone(), t0).unwrap().unwrap();
    assert_eq!(sent.status, finished);
    assert_eq!(sent.latest_status.as_ref(), Some(&finished));
    assert_eq!(sent.operation_uuid, proto_uuid(&op));
    assert_eq!(sent.framework_id.unwrap().value, "fw-1");
    let tracked = ops.get(&op).unwrap();
    assert!(tracked.is_terminal());
    assert_eq!(tracked.statuses, vec![finished.clone()]);
    assert_eq!(ops.next_retry(), Some(t0 + 10 * SECOND));
    assert_eq!(ops.unacknowledged(), 1);

    let acked = ops.acknowledge(&op, &id(&finished), t0 + SECOND).unwrap();
    let Acked::Terminated(done) = acked else {
        panic!("a terminal ack terminates: {acked:?}");
    };
    assert_eq!((done.uuid, done.acked), (op, 1));
    assert!(ops.is_empty());
    assert_eq!(ops.next_retry(), None);
    assert!(ops.due(t0 + 3600 * SECOND).is_empty());
}

#[test]
fn update_and_ack_non_terminal_update() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let progress = status(OperationState::OperationPending);
    assert!(ops.update(&op, progress.clone(), t0).unwrap().is_some());
    let acked = ops.acknowledge(&op, &id(&progress), t0).unwrap();
    assert_eq!(acked, Acked::Pending { send: None });
    assert!(ops.contains(&op));
    assert_eq!(ops.get(&op).unwrap().acked, 1);
    assert_eq!(ops.next_retry(), None);
    assert!(ops.due(t0 + 3600 * SECOND).is_empty());
}

#[test]
fn resend_unacknowledged_with_doubling_interval() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let failed = status(OperationState::OperationFailed);
    ops.finish(&op, failed.clone(), t0).unwrap().unwrap();
    assert!(ops.due(t0 + 9 * SECOND).is_empty());
    let resent = ops.due(t0 + 10 * SECOND);
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].status, failed);
    assert_eq!(ops.next_retry(), Some(t0 + 30 * SECOND));
    assert_eq!(ops.due(t0 + 30 * SECOND).len(), 1);
    assert_eq!(ops.next_retry(), Some(t0 + 70 * SECOND));
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let retry = StatusRetry {
        min: SECOND,
        max: 5 * SECOND,
        jitter: Jitter::None,
    };
    let t0 = Instant::now();
    let (mut ops, op) = running(retry, t0);
    ops.finish(&op, status(OperationState::OperationFinished), t0)
        .unwrap()
        .unwrap();
    let mut waits = Vec::new();
    let mut now = t0;
    for _ in 0..6 {
        let next = ops.next_retry().unwrap();
        waits.push((next - now).as_secs());
        now = next;
        assert_eq!(ops.due(now).len(), 1);
    }
    assert_eq!(waits, [1, 2, 4, 5, 5, 5]);
}

#[test]
fn jittered_waits_stay_between_half_and_the_whole_interval() {
    let retry = StatusRetry {
        min: 8 * SECOND,
        max: 64 * SECOND,
        jitter: Jitter::Seeded(11),
    };
    let t0 = Instant::now();
    let (mut ops, op) = running(retry, t0);
    ops.finish(&op, status(OperationState::OperationFinished), t0)
        .unwrap()
        .unwrap();
    let mut now = t0;
    let mut interval = 8 * SECOND;
    let mut waits = BTreeSet::new();
    for _ in 0..8 {
        let next = ops.next_retry().unwrap();
        let wait = next - now;
        assert!(
            wait >= interval / 2 && wait <= interval,
            "{wait:?} for {interval:?}"
        );
        waits.insert(wait);
        now = next;
        ops.due(now);
        interval = (interval * 2).min(64 * SECOND);
    }
    assert!(waits.len() > 1, "the waits are drawn, not fixed: {waits:?}");
}

#[test]
fn later_updates_wait_for_the_head_and_carry_the_latest_status() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let first = status(OperationState::OperationPending);
    let sent = ops.update(&op, first.clone(), t0).unwrap().unwrap();
    assert_eq!(sent.latest_status.as_ref(), Some(&first));
    let second = status(OperationState::OperationFinished);
    // The head is in flight: the second update waits.
    assert_eq!(ops.update(&op, second.clone(), t0).unwrap(), None);
    // UpdateLatestWhenResending: the resent head carries the newest status.
    let resent = ops.due(t0 + 10 * SECOND);
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].status, first);
    assert_eq!(resent[0].latest_status.as_ref(), Some(&second));
    let Acked::Pending { send: Some(next) } =
        ops.acknowledge(&op, &id(&first), t0 + 11 * SECOND).unwrap()
    else {
        panic!("the next update is forwarded on ack");
    };
    assert_eq!(next.status, second);
    assert_eq!(next.latest_status.as_ref(), Some(&second));
    // Re-armed at the minimum, not the doubled interval.
    assert_eq!(ops.next_retry(), Some(t0 + 21 * SECOND));
}

#[test]
fn updates_after_a_terminal_one_are_discarded_when_it_is_acknowledged() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let finished = status(OperationState::OperationFinished);
    ops.finish(&op, finished.clone(), t0).unwrap();
    let late = status(OperationState::OperationPending);
    assert_eq!(ops.update(&op, late, t0).unwrap(), None);
    // A terminal operation keeps its terminal latest status.
    assert_eq!(ops.get(&op).unwrap().latest_status, finished);
    let Acked::Terminated(done) = ops.acknowledge(&op, &id(&finished), t0).unwrap() else {
        panic!("terminal ack");
    };
    assert_eq!(done.stream, vec![finished]);
    assert!(ops.is_empty());
}

#[test]
fn ignore_duplicate_update() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let progress = status(OperationState::OperationPending);
    ops.update(&op, progress.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&progress), t0).unwrap();
    // A duplicate of an acknowledged update.
    assert_eq!(ops.update(&op, progress.clone(), t0).unwrap(), None);
    let finished = status(OperationState::OperationFinished);
    assert!(ops.finish(&op, finished.clone(), t0).unwrap().is_some());
    // A duplicate of an unacknowledged one, through `finish`.
    assert_eq!(ops.finish(&op, finished.clone(), t0).unwrap(), None);
    let tracked = ops.get(&op).unwrap();
    assert_eq!(tracked.stream, vec![progress, finished.clone()]);
    assert_eq!(tracked.statuses, vec![finished]);
}

#[test]
fn ignore_duplicate_update_after_recover() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let progress = status(OperationState::OperationPending);
    ops.update(&op, progress.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&progress), t0).unwrap();
    let (mut ops, terminated) =
        Operations::recover(vec![round_trip(ops.get(&op).unwrap())], exact());
    assert!(terminated.is_empty());
    ops.resume(t0);
    assert_eq!(ops.update(&op, progress, t0).unwrap(), None);
    assert_eq!(ops.get(&op).unwrap().stream.len(), 1);
}

#[test]
fn reject_duplicate_ack() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let first = status(OperationState::OperationPending);
    ops.update(&op, first.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&first), t0).unwrap();
    // Nothing in flight: Mesos's "Unexpected acknowledgment".
    let error = ops.acknowledge(&op, &id(&first), t0).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "Unexpected acknowledgment (UUID: {}) for operation status update stream {op}",
            id(&first)
        )
    );
    // With a new head in flight: a duplicate.
    ops.update(&op, status(OperationState::OperationFinished), t0)
        .unwrap();
    let error = ops.acknowledge(&op, &id(&first), t0).unwrap_err();
    assert!(matches!(error, AckError::Duplicate { .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "Duplicate operation status update acknowledgement"
    );
    // Nothing changed.
    assert_eq!(ops.get(&op).unwrap().acked, 1);
}

#[test]
fn reject_duplicate_ack_after_recover() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let first = status(OperationState::OperationPending);
    ops.update(&op, first.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&first), t0).unwrap();
    ops.update(&op, status(OperationState::OperationFinished), t0)
        .unwrap();
    let (mut ops, _) = Operations::recover(vec![round_trip(ops.get(&op).unwrap())], exact());
    let error = ops.acknowledge(&op, &id(&first), t0).unwrap_err();
    assert!(matches!(error, AckError::Duplicate { .. }), "{error}");
}

#[test]
fn acks_of_unknown_streams_and_stale_uuids_are_errors() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let stranger = uuid::Uuid::new_v4();
    let error = ops.acknowledge(&stranger, &stranger, t0).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("Cannot find the operation status update stream {stranger}")
    );
    // PENDING without any update queued.
    let error = ops.acknowledge(&op, &stranger, t0).unwrap_err();
    assert!(matches!(error, AckError::Unexpected { .. }), "{error}");
    ops.finish(&op, status(OperationState::OperationFinished), t0)
        .unwrap();
    let error = ops.acknowledge(&op, &stranger, t0).unwrap_err();
    assert!(matches!(error, AckError::Duplicate { .. }), "{error}");
    assert_eq!(ops.get(&op).unwrap().acked, 0);
    assert_eq!(ops.next_retry(), Some(t0 + 10 * SECOND));
}

#[test]
fn recover_checkpointed_stream() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let finished = status(OperationState::OperationFinished);
    ops.finish(&op, finished.clone(), t0).unwrap();
    let (mut recovered, terminated) =
        Operations::recover(vec![round_trip(ops.get(&op).unwrap())], exact());
    assert!(terminated.is_empty());
    // Paused until READY.
    assert!(recovered.is_paused());
    assert_eq!(recovered.next_retry(), None);
    assert!(recovered.due(t0 + 3600 * SECOND).is_empty());
    let sent = recovered.resume(t0);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, finished);
    assert_eq!(recovered.next_retry(), Some(t0 + 10 * SECOND));
}

#[test]
fn recover_empty_stream() {
    let op = pending();
    let (mut ops, terminated) = Operations::recover(vec![round_trip(&op)], exact());
    assert!(terminated.is_empty());
    assert_eq!(ops.len(), 1);
    assert!(ops.resume(Instant::now()).is_empty());
    assert_eq!(ops.unacknowledged(), 0);
    assert_eq!(ops.get(&op.uuid).unwrap(), &op);
}

#[test]
fn recover_terminated_stream() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let progress = status(OperationState::OperationPending);
    let finished = status(OperationState::OperationFinished);
    ops.update(&op, progress.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&progress), t0).unwrap();
    ops.finish(&op, finished.clone(), t0).unwrap();
    // As if the process died after writing the terminal ack but before deleting.
    let mut done = ops.get(&op).unwrap().clone();
    done.acked = 2;
    let (mut recovered, terminated) = Operations::recover(vec![round_trip(&done)], exact());
    assert_eq!(terminated, vec![done]);
    assert!(recovered.is_empty());
    assert!(recovered.resume(t0).is_empty());
}

#[test]
fn a_dropped_status_missing_from_its_stream_is_queued_on_recovery() {
    // Spec §12 item 20: Mesos's state "operation DROPPED, stream never written".
    let mut op = pending();
    op.latest_status = status(OperationState::OperationDropped);
    let (mut ops, terminated) = Operations::recover(vec![op.clone()], exact());
    assert!(terminated.is_empty());
    let sent = ops.resume(Instant::now());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, op.latest_status);
    // And a completed operation whose stream was lost re-submits its statuses.
    let mut finished = pending();
    let status = status(OperationState::OperationFinished);
    finished.latest_status = status.clone();
    finished.statuses = vec![status.clone()];
    let (mut ops, _) = Operations::recover(vec![finished], exact());
    assert_eq!(ops.resume(Instant::now())[0].status, status);
}

#[test]
fn pause_stops_retries_and_resume_resends_every_head() {
    let t0 = Instant::now();
    let mut ops = Operations::new(exact());
    ops.resume(t0);
    let mut uuids = Vec::new();
    for _ in 0..3 {
        let op = pending();
        uuids.push(op.uuid);
        ops.insert_pending(op).unwrap();
    }
    ops.finish(&uuids[0], status(OperationState::OperationFinished), t0)
        .unwrap()
        .unwrap();
    ops.finish(&uuids[1], status(OperationState::OperationFailed), t0)
        .unwrap()
        .unwrap();
    ops.pause();
    assert_eq!(ops.next_retry(), None);
    assert!(ops.due(t0 + 3600 * SECOND).is_empty());
    // Completed while paused: queued, not sent.
    assert_eq!(
        ops.finish(&uuids[2], status(OperationState::OperationFinished), t0)
            .unwrap(),
        None
    );
    let t1 = t0 + 100 * SECOND;
    let sent = ops.resume(t1);
    let mut sent: Vec<_> = sent
        .iter()
        .map(|s| uuid::Uuid::from_slice(&s.operation_uuid.value).unwrap())
        .collect();
    sent.sort();
    uuids.sort();
    assert_eq!(sent, uuids);
    assert_eq!(ops.next_retry(), Some(t1 + 10 * SECOND));
    assert_eq!(ops.due(t1 + 10 * SECOND).len(), 3);
}

#[test]
fn dropped_operations_are_reported_until_acknowledged() {
    let t0 = Instant::now();
    let mut ops = Operations::new(exact());
    let mut op = pending();
    op.latest_status = status(OperationState::OperationDropped);
    let dropped = op.latest_status.clone();
    // Paused: tracked and queued, sent on resume.
    assert_eq!(ops.insert_dropped(op.clone(), t0).unwrap(), None);
    assert!(matches!(
        ops.insert_dropped(op.clone(), t0),
        Err(OperationsError::Duplicate { .. })
    ));
    assert!(matches!(
        ops.insert_pending(pending_with(op.uuid)),
        Err(OperationsError::Duplicate { .. })
    ));
    let reported = ops.to_mesos();
    assert_eq!(reported.len(), 1);
    assert_eq!(reported[0].latest_status, dropped);
    assert!(reported[0].statuses.is_empty());
    assert_eq!(reported[0].agent_id, Some(agent()));
    assert_eq!(ops.resume(t0).len(), 1);
    assert!(matches!(
        ops.acknowledge(&op.uuid, &id(&dropped), t0),
        Ok(Acked::Terminated(_))
    ));
    assert!(ops.to_mesos().is_empty());
}

#[test]
fn refused_changes_name_what_is_wrong() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let mut not_dropped = pending();
    not_dropped.latest_status = status(OperationState::OperationFinished);
    assert!(matches!(
        ops.insert_dropped(not_dropped, t0),
        Err(OperationsError::NotDropped { .. })
    ));
    let mut no_uuid = status(OperationState::OperationFinished);
    no_uuid.uuid = None;
    let error = ops.finish(&op, no_uuid, t0).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("Status update is missing 'uuid'")
    );
    assert!(matches!(
        ops.finish(&op, status(OperationState::OperationPending), t0),
        Err(OperationsError::NotTerminal { .. })
    ));
    ops.finish(&op, status(OperationState::OperationFinished), t0)
        .unwrap();
    assert!(matches!(
        ops.finish(&op, status(OperationState::OperationFailed), t0),
        Err(OperationsError::AlreadyTerminal { .. })
    ));
    let stranger = uuid::Uuid::new_v4();
    assert!(matches!(
        ops.finish(&stranger, status(OperationState::OperationFailed), t0),
        Err(OperationsError::Unknown { .. })
    ));
}

fn pending_with(uuid: uuid::Uuid) -> TrackedOperation {
    TrackedOperation { uuid, ..pending() }
}

/// Through the record and the store's JSON, as written and read.
fn round_trip(op: &TrackedOperation) -> TrackedOperation {
    let record = op.to_record("agent-S0").unwrap();
    let json = serde_json::to_string(&record).unwrap();
    let back: OperationRecord = serde_json::from_str(&json).unwrap();
    TrackedOperation::from_record(back, Path::new("/s")).unwrap()
}

#[test]
fn record_round_trip() {
    let t0 = Instant::now();
    let (mut ops, op) = running(exact(), t0);
    let progress = status(OperationState::OperationPending);
    ops.update(&op, progress.clone(), t0).unwrap();
    ops.acknowledge(&op, &id(&progress), t0).unwrap();
    ops.finish(&op, status(OperationState::OperationFinished), t0)
        .unwrap();
    let tracked = ops.get(&op).unwrap();
    let record = tracked.to_record("agent-S0").unwrap();
    assert_eq!(record.key(), format!("agent-S0/{op}"));
    assert_eq!(&round_trip(tracked), tracked);
    // An operator operation (no framework).
    let mut operator = pending();
    operator.framework_id = None;
    assert_eq!(round_trip(&operator), operator);
}

#[test]
fn a_record_that_does_not_decode_is_an_error_naming_its_key() {
    let op = pending();
    let mut record = op.to_record("agent-S0").unwrap();
    record.operation = serde_json::json!({"info": 5});
    let key = record.key();
    let error = TrackedOperation::from_record(record, Path::new("/s")).unwrap_err();
    assert!(matches!(error, StateError::Decode { .. }), "{error}");
    assert!(error.to_string().contains(&key), "{error}");

    let mut record = op.to_record("agent-S0").unwrap();
    record.stream = vec![serde_json::json!({"state": "NOT_A_STATE"})];
    let error = TrackedOperation::from_record(record, Path::new("/s")).unwrap_err();
    assert!(error.to_string().contains(&key), "{error}");

    let mut record = op.to_record("agent-S0").unwrap();
    record.uuid = uuid::Uuid::new_v4().to_string();
    let error = TrackedOperation::from_record(record, Path::new("/s")).unwrap_err();
    assert!(
        matches!(error, StateError::InvalidOperation { .. }),
        "{error}"
    );

    let mut record = op.to_record("agent-S0").unwrap();
    record.acked = 1;
    let error = TrackedOperation::from_record(record, Path::new("/s")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("1 updates acknowledged but 0 queued"),
        "{error}"
    );
}

#[tokio::test]
async fn stage_load_and_remove_by_agent_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let (a, b, other) = (pending(), pending(), pending());
    let mut txn = store.transaction();
    stage_operation(txn.changes(), "agent-1", &a).unwrap();
    stage_operation(txn.changes(), "agent-1", &b).unwrap();
    stage_operation(txn.changes(), "agent-2", &other).unwrap();
    txn.commit().await.unwrap();
    let mut loaded = crate::provider::state::test_io::load_operations(&store, "agent-1")
        .await
        .unwrap();
    loaded.sort_by_key(|op| op.uuid);
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort_by_key(|op| op.uuid);
    assert_eq!(loaded, expected);

    let mut txn = store.transaction();
    stage_operation_removal(txn.changes(), "agent-1", &a.uuid).unwrap();
    txn.commit().await.unwrap();
    assert_eq!(
        crate::provider::state::test_io::load_operations(&store, "agent-1")
            .await
            .unwrap(),
        vec![b]
    );
    assert_eq!(
        crate::provider::state::test_io::load_operations(&store, "agent-2")
            .await
            .unwrap(),
        vec![other]
    );
}

#[tokio::test]
async fn loading_a_broken_record_fails_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path()).await;
    let op = pending();
    let mut record = op.to_record("agent-1").unwrap();
    record.operation = serde_json::json!({"uuid": "not base64 !"});
    let mut txn = store.transaction();
    txn.put(&record).unwrap();
    txn.commit().await.unwrap();
    let error = crate::provider::state::test_io::load_operations(&store, "agent-1")
        .await
        .unwrap_err();
    assert!(error.to_string().contains(&record.key()), "{error}");
}
