//! Tables of the machine's decisions, each fed as inputs and read as effects (no socket,
//! no store). The model-based test is `tests/provider_machine.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::wildcard_enum_match_arm,
    reason = "tests pick one effect out of many"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use slrp_types::{Backoff, Jitter};

use slrp_proto::mesos::v1::offer::operation::{Destroy, Type as OpType, Unreserve};
use slrp_proto::mesos::v1::resource::DiskInfo;
use slrp_proto::mesos::v1::resource::disk_info::Persistence;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::resource_provider::event;
use slrp_proto::mesos::v1::{Resource, offer};

use super::*;
use crate::provider::operations::StatusRetry;

fn config() -> Config {
    Config {
        agent_id: "agent".to_owned(),
        plugin_type: "org.test".to_owned(),
        plugin_name: "local".to_owned(),
        default_reservations: Vec::new(),
        reconciliation_interval: Some(Duration::from_secs(10)),
        update_backoff: Backoff::PLUGIN_RESTART,
        retry_backoff: Backoff::PLUGIN_RESTART,
        jitter: Jitter::None,
        pending_events: 16,
        follow_agent_id: false,
        max_publishes: 4,
        watches_profiles: false,
    }
}

fn rp() -> ResourceProviderId {
    ResourceProviderId {
        value: "rp".to_owned(),
    }
}

fn machine(total: Resources) -> Machine {
    let state = ProviderState {
        provider_id: Some(rp()),
        total,
        profiles: BTreeMap::new(),
    };
    Machine::new(config(), state, Operations::new(StatusRetry::default())).unwrap()
}

fn step(m: &mut Machine, input: Input) -> Vec<Effect> {
    let now = Instant::now();
    m.step(input, now).unwrap();
    m.take_ready(now).unwrap().effects
}

fn job(effects: &[Effect]) -> Option<JobTicket> {
    effects.iter().find_map(|e| match e {
        Effect::StartJob { ticket, .. } => Some(*ticket),
        _ => None,
    })
}

fn send(effects: &[Effect]) -> Option<(u64, u64)> {
    effects.iter().find_map(|e| match e {
        Effect::UpdateState { seq, session, .. } => Some((*seq, *session)),
        _ => None,
    })
}

fn nothing_found(ticket: JobTicket) -> Input {
    Input::JobDone(JobDone {
        ticket,
        result: Ok(Gathered {
            profiles: BTreeMap::new(),
            capacities: Vec::new(),
            listing: Vec::new(),
            expanded: BTreeMap::new(),
        }),
    })
}

/// Connected, SUBSCRIBED, the subscription reconciliation and its UPDATE_STATE answered.
fn ready(m: &mut Machine) {
    step(m, Input::Connected);
    let effects = step(m, Input::Subscribed { provider_id: rp() });
    let effects = step(m, nothing_found(job(&effects).unwrap()));
    let (seq, session) = send(&effects).unwrap();
    step(
        m,
        Input::Sent {
            seq,
            session,
            result: Ok(()),
        },
    );
    assert_eq!(m.lifecycle(), Lifecycle::Ready);
}

fn apply(m: &Machine, uuid: uuid::Uuid, info: offer::Operation) -> Input {
    Input::Event(Box::new(Event {
        r#type: Some(event::Type::ApplyOperation as i32),
        apply_operation: Some(event::ApplyOperation {
            framework_id: None,
            info,
            operation_uuid: Uuid {
                value: uuid.as_bytes().to_vec(),
            },
            resource_version_uuid: Uuid {
                value: m.resource_version().as_bytes().to_vec(),
            },
        }),
        ..Event::default()
    }))
}

fn terminal_state(m: &Machine, uuid: &uuid::Uuid) -> Option<i32> {
    m.tracked()
        .get(uuid)
        .filter(|op| op.is_terminal())
        .map(|op| op.latest_status.state)
}

#[test]
fn jobs_run_in_sequence_order_and_only_when_allowed() {
    let mut jobs = Jobs::default();
    for kind in [JobKind::Periodic, JobKind::Profiles, JobKind::Subscription] {
        jobs.mark(kind);
        // A second request joins the first.
        jobs.mark(kind);
    }
    for state in [
        Lifecycle::Recovering,
        Lifecycle::Disconnected,
        Lifecycle::Connected,
    ] {
        assert_eq!(jobs.take(state), None, "{state}");
    }
    assert_eq!(
        jobs.take(Lifecycle::Subscribed),
        Some(JobKind::Subscription)
    );
    // Before READY only the subscription reconciliation runs.
    assert_eq!(jobs.take(Lifecycle::Subscribed), None);
    assert_eq!(jobs.take(Lifecycle::Ready), Some(JobKind::Profiles));
    assert_eq!(jobs.take(Lifecycle::Ready), Some(JobKind::Periodic));
    assert_eq!(jobs.take(Lifecycle::Ready), None);
}

#[test]
fn the_status_total_waits_longer_for_a_larger_total_up_to_a_second() {
    assert_eq!(status_total_delay(0), STATUS_TOTAL_INTERVAL);
    assert_eq!(status_total_delay(100), Duration::from_millis(55));
    assert_eq!(status_total_delay(10_000), Duration::from_millis(550));
    assert_eq!(status_total_delay(1_000_000), STATUS_TOTAL_MAX_INTERVAL);
    assert_eq!(status_total_delay(usize::MAX), STATUS_TOTAL_MAX_INTERVAL);
}

/// §12 item 9: a subscription reconciliation that ends after its session did makes
/// nothing READY and sends nothing; the new session's does.
#[test]
fn only_this_sessions_reconciliation_makes_ready() {
    let mut m = machine(Resources::new());
    step(&mut m, Input::Connected);
    let first = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    step(
        &mut m,
        Input::Disconnected {
            reason: "gone".to_owned(),
            not_admitted: false,
        },
    );
    step(&mut m, Input::Connected);
    // The new session's job waits for the running one (one job at a time).
    let effects = step(&mut m, Input::Subscribed { provider_id: rp() });
    assert_eq!(job(&effects), None);
    let effects = step(&mut m, nothing_found(first));
    assert_eq!(send(&effects), None, "a stale job sends nothing");
    let second = job(&effects).expect("the new session's reconciliation starts");
    let (seq, session) = send(&step(&mut m, nothing_found(second))).unwrap();
    assert_eq!(m.lifecycle(), Lifecycle::Subscribed);
    step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Ok(()),
        },
    );
    assert_eq!(m.lifecycle(), Lifecycle::Ready);
}

/// An UPDATE_STATE still on its way when its session ended (its answer comes late or
/// never) does not hold back the next session's: found by the model-based test.
#[test]
fn an_update_state_of_an_ended_session_does_not_block_the_next() {
    let mut m = machine(Resources::new());
    step(&mut m, Input::Connected);
    let ticket = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    let stale = send(&step(&mut m, nothing_found(ticket))).unwrap();
    step(
        &mut m,
        Input::Disconnected {
            reason: "gone".to_owned(),
            not_admitted: false,
        },
    );
    step(&mut m, Input::Connected);
    let ticket = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    let fresh = send(&step(&mut m, nothing_found(ticket))).expect("sent without waiting");
    assert_ne!(fresh, stale);
    let (seq, session) = stale;
    step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Err(SendFailure {
                message: "session ended".to_owned(),
                refused: false,
            }),
        },
    );
    assert_eq!(
        m.lifecycle(),
        Lifecycle::Subscribed,
        "a stale answer changes nothing"
    );
    let (seq, session) = fresh;
    step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Ok(()),
        },
    );
    assert_eq!(m.lifecycle(), Lifecycle::Ready);
}

/// A failed UPDATE_STATE is retried when its backoff timer fires, in the same session.
#[test]
fn a_failed_update_state_is_resent_when_its_timer_fires() {
    let mut m = machine(Resources::new());
    step(&mut m, Input::Connected);
    let ticket = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    let (seq, session) = send(&step(&mut m, nothing_found(ticket))).unwrap();
    let effects = step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Err(SendFailure {
                message: "503".to_owned(),
                refused: false,
            }),
        },
    );
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Arm(Timer::SendRetry, _)))
    );
    assert_eq!(send(&effects), None, "not before the backoff");
    let (again, _) = send(&step(&mut m, Input::Fired(Timer::SendRetry))).unwrap();
    assert!(again > seq);
}

fn persistent_disk(id: &str, reserved: bool) -> Resource {
    let ctx = ProviderResources::new(rp(), "org.test", "local", Vec::new()).unwrap();
    let mut disk = ctx.raw_disk(4 * 1_048_576, Some("p"), Some(id), None);
    if let Some(source) = disk.disk.as_mut().and_then(|d| d.source.as_mut()) {
        source.r#type = SourceType::Mount as i32;
        source.mount = Some(ctx.mount_source());
    }
    if reserved {
        disk.reservations
            .push(slrp_proto::mesos::v1::resource::ReservationInfo {
                r#type: Some(
                    slrp_proto::mesos::v1::resource::reservation_info::Type::Dynamic as i32,
                ),
                role: Some("role".to_owned()),
                principal: None,
                labels: None,
            });
    }
    disk
}

fn with_persistence(mut disk: Resource) -> Resource {
    let info = disk.disk.get_or_insert_with(DiskInfo::default);
    info.persistence = Some(Persistence {
        id: "id1".to_owned(),
        principal: None,
    });
    disk
}

/// The agent applies DESTROY and a pipelined UNRESERVE of the same disk speculatively,
/// in order: the UNRESERVE must meet the total after the DESTROY, so it waits (held)
/// while the DESTROY's data removal runs, and the driver stops reading events.
#[test]
fn operations_after_a_destroy_wait_for_its_data_removal() {
    let disk = persistent_disk("vol-1", true);
    let volume = with_persistence(disk.clone());
    let mut m = machine(Resources::from(volume.clone()));
    ready(&mut m);
    let destroy = uuid::Uuid::new_v4();
    let input = apply(
        &m,
        destroy,
        offer::Operation {
            r#type: Some(OpType::Destroy as i32),
            destroy: Some(Destroy {
                volumes: vec![volume],
            }),
            ..offer::Operation::default()
        },
    );
    let effects = step(&mut m, input);
    let (identity, targets) = effects
        .iter()
        .find_map(|e| match e {
            Effect::RemovePersistent {
                identity, targets, ..
            } => Some((*identity, targets.clone())),
            _ => None,
        })
        .expect("the data removal starts once the PENDING record is durable");
    assert_eq!(targets[0].persistence_id, "id1");
    assert!(!m.accepts_events());
    let unreserve = uuid::Uuid::new_v4();
    let input = apply(
        &m,
        unreserve,
        offer::Operation {
            r#type: Some(OpType::Unreserve as i32),
            unreserve: Some(Unreserve {
                resources: vec![disk],
            }),
            ..offer::Operation::default()
        },
    );
    step(&mut m, input);
    assert!(!m.tracked().contains(&unreserve), "held, not looked at");
    step(
        &mut m,
        Input::PersistentRemoved {
            uuid: destroy,
            identity,
            result: Ok(()),
        },
    );
    let finished = Some(slrp_proto::mesos::v1::OperationState::OperationFinished as i32);
    assert_eq!(terminal_state(&m, &destroy), finished);
    assert_eq!(
        terminal_state(&m, &unreserve),
        finished,
        "{:?}",
        m.tracked()
            .get(&unreserve)
            .map(|op| &op.latest_status.message)
    );
    assert!(m.accepts_events());
}

/// Difference O4 (docs/mesos-differences.md): a speculative operation dropped in READY
/// (here for a stale resource version) gets a new resource version and an UPDATE_STATE,
/// since the agent applied it already; a dropped disk operation changes neither.
#[test]
fn a_dropped_speculative_operation_resynchronizes_the_agent() {
    let pool = persistent_disk("vol-1", false);
    let mut m = machine(Resources::from(pool.clone()));
    ready(&mut m);
    let stale = |m: &Machine, info: offer::Operation| {
        let mut input = apply(m, uuid::Uuid::new_v4(), info);
        if let Input::Event(event) = &mut input
            && let Some(apply) = event.apply_operation.as_mut()
        {
            apply.resource_version_uuid = Uuid {
                value: uuid::Uuid::new_v4().as_bytes().to_vec(),
            };
        }
        input
    };
    let before = m.resource_version();
    let unreserve = offer::Operation {
        r#type: Some(OpType::Unreserve as i32),
        unreserve: Some(Unreserve {
            resources: vec![pool.clone()],
        }),
        ..offer::Operation::default()
    };
    let input = stale(&m, unreserve);
    let effects = step(&mut m, input);
    assert_ne!(m.resource_version(), before, "a new resource version");
    let Some(Effect::UpdateState { call, .. }) = effects
        .iter()
        .find(|e| matches!(e, Effect::UpdateState { .. }))
    else {
        panic!("an UPDATE_STATE resynchronizes the agent: {effects:?}");
    };
    let sent = call.update_state.as_ref().unwrap();
    assert_eq!(
        sent.resource_version_uuid.value,
        m.resource_version().as_bytes().to_vec()
    );

    let version = m.resource_version();
    let destroy_disk = offer::Operation {
        r#type: Some(OpType::DestroyDisk as i32),
        destroy_disk: Some(slrp_proto::mesos::v1::offer::operation::DestroyDisk { source: pool }),
        ..offer::Operation::default()
    };
    let input = stale(&m, destroy_disk);
    let effects = step(&mut m, input);
    assert_eq!(m.resource_version(), version);
    assert_eq!(
        send(&effects),
        None,
        "the agent applies no disk operation itself"
    );
}

/// Issue #25: an UPDATE_STATE the manager refuses (a total over its body limit) is not
/// resent unchanged every backoff; its reason stays in the status, and the next session
/// (a manager restarted with a higher limit) sends again and becomes READY.
#[test]
fn a_refused_update_state_is_not_resent_unchanged() {
    let mut m = machine(Resources::new());
    step(&mut m, Input::Connected);
    let ticket = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    let (seq, session) = send(&step(&mut m, nothing_found(ticket))).unwrap();
    let message = "413 Request body exceeds the limit of 4194304 bytes".to_owned();
    let effects = step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Err(SendFailure {
                message: message.clone(),
                refused: true,
            }),
        },
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Arm(Timer::SendRetry, _))),
        "no retry of the same body: {effects:?}"
    );
    assert_eq!(send(&effects), None);
    let error = m.observed().unwrap().last_error.clone().unwrap();
    assert!(error.contains(&message), "{error}");
    assert_eq!(m.lifecycle(), Lifecycle::Subscribed);

    step(
        &mut m,
        Input::Disconnected {
            reason: "manager restarted".to_owned(),
            not_admitted: false,
        },
    );
    step(&mut m, Input::Connected);
    let ticket = job(&step(&mut m, Input::Subscribed { provider_id: rp() })).unwrap();
    let (seq, session) = send(&step(&mut m, nothing_found(ticket))).expect("sent again");
    step(
        &mut m,
        Input::Sent {
            seq,
            session,
            result: Ok(()),
        },
    );
    assert_eq!(m.lifecycle(), Lifecycle::Ready);
}

/// `Input::Reconcile` (a disk grown by the operator): a reconciliation starts at once
/// when READY, and its findings (the volume manager's `expanded`) grow the disk in the
/// total, staged and followed by an UPDATE_STATE.
#[test]
fn a_requested_reconciliation_grows_an_expanded_disk() {
    let disk = persistent_disk("vol-1", false);
    let mut m = machine(std::iter::once(&disk).collect());
    ready(&mut m);
    let effects = step(&mut m, Input::Reconcile);
    let ticket = job(&effects).expect("a reconciliation starts");
    let listed = slrp_csi::Volume {
        volume_id: slrp_csi::VolumeId::new("vol-1"),
        capacity_bytes: 8 * 1_048_576,
        volume_context: BTreeMap::new(),
    };
    let effects = step(
        &mut m,
        Input::JobDone(JobDone {
            ticket,
            result: Ok(Gathered {
                profiles: BTreeMap::new(),
                capacities: Vec::new(),
                listing: vec![listed],
                expanded: BTreeMap::from([("vol-1".to_owned(), 8 * 1_048_576)]),
            }),
        }),
    );
    assert!(
        send(&effects).is_some(),
        "the grown total is sent: {effects:?}"
    );
    let sizes: Vec<f64> = m
        .total()
        .iter()
        .filter_map(|r| r.scalar.map(|s| s.value))
        .collect();
    assert_eq!(sizes, vec![8.0], "{:?}", m.total());
    let grown = m.total().iter().next().unwrap();
    let source = grown.disk.as_ref().unwrap().source.as_ref().unwrap();
    assert_eq!(source.r#type, SourceType::Mount as i32, "still MOUNT");
}
