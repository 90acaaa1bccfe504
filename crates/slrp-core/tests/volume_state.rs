//! Table tests of the volume state machine: every state × goal × capability set.

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;

use slrp_core::volume::state::*;
use slrp_core::volume::{
    AccessMode, AccessType, CsiCapabilities, MountPaths, PlannedJob, RecoveryGoal, StringMap,
    VolumeCapability, VolumeId, plan_recovery,
};

use CsiCall::{
    ControllerPublish as CP, ControllerUnpublish as CU, NodePublish as NP, NodeStage as NS,
    NodeUnpublish as NUP, NodeUnstage as NU,
};

const GOALS: [Goal; 4] = [
    Goal::Created,
    Goal::NodeReady,
    Goal::VolReady,
    Goal::Published,
];

fn boot(n: u8) -> BootId {
    BootId::new(format!("boot-{n}"))
}

fn pc() -> StringMap {
    BTreeMap::from([("device".to_owned(), "/dev/x".to_owned())])
}

/// One sample of every state, staged in boot 1.
fn samples() -> Vec<VolumeState> {
    let (b, p) = (boot(1), pc());
    vec![
        VolumeState::Created,
        VolumeState::ControllerPublishing,
        VolumeState::NodeReady {
            publish_context: p.clone(),
        },
        VolumeState::ControllerUnpublishing,
        VolumeState::NodeStaging {
            boot_id: b.clone(),
            publish_context: p.clone(),
        },
        VolumeState::VolReady {
            boot_id: b.clone(),
            publish_context: p.clone(),
        },
        VolumeState::NodePublishing {
            boot_id: b.clone(),
            publish_context: p.clone(),
        },
        VolumeState::Published {
            boot_id: b.clone(),
            publish_context: p.clone(),
        },
        VolumeState::NodeUnpublishing {
            boot_id: b.clone(),
            publish_context: p.clone(),
        },
        VolumeState::NodeUnstaging {
            boot_id: b,
            publish_context: p,
        },
    ]
}

fn all_caps() -> Vec<CsiCapabilities> {
    let mut v = Vec::new();
    for controller_publish in [false, true] {
        for node_stage in [false, true] {
            v.push(CsiCapabilities::with_publish_stage(
                controller_publish,
                node_stage,
            ));
        }
    }
    v
}

fn full() -> CsiCapabilities {
    CsiCapabilities::with_publish_stage(true, true)
}

/// Next call by state, for goals Created, NodeReady, VolReady, Published (Mesos §4.6).
const PLAN: &[(StateName, [Option<CsiCall>; 4])] = &[
    (StateName::Created, [None, Some(CP), Some(CP), Some(CP)]),
    (
        StateName::ControllerPublish,
        [Some(CU), Some(CP), Some(CP), Some(CP)],
    ),
    (StateName::NodeReady, [Some(CU), None, Some(NS), Some(NS)]),
    (
        StateName::ControllerUnpublish,
        [Some(CU), Some(CU), Some(CU), Some(CU)],
    ),
    (
        StateName::NodeStage,
        [Some(NU), Some(NU), Some(NS), Some(NS)],
    ),
    (StateName::VolReady, [Some(NU), Some(NU), None, Some(NP)]),
    (
        StateName::NodePublish,
        [Some(NUP), Some(NUP), Some(NUP), Some(NP)],
    ),
    (
        StateName::Published,
        [Some(NUP), Some(NUP), Some(NUP), None],
    ),
    (
        StateName::NodeUnpublish,
        [Some(NUP), Some(NUP), Some(NUP), Some(NUP)],
    ),
    (
        StateName::NodeUnstage,
        [Some(NU), Some(NU), Some(NU), Some(NU)],
    ),
];

/// For each call: the in-flight state `begin` enters and the state a success settles in.
const CALLS: &[(CsiCall, StateName, StateName)] = &[
    (CP, StateName::ControllerPublish, StateName::NodeReady),
    (CU, StateName::ControllerUnpublish, StateName::Created),
    (NS, StateName::NodeStage, StateName::VolReady),
    (NU, StateName::NodeUnstage, StateName::NodeReady),
    (NP, StateName::NodePublish, StateName::Published),
    (NUP, StateName::NodeUnpublish, StateName::VolReady),
];

/// Whether `state` is at `goal` exactly (no step left, whatever the capabilities).
fn is_at(state: &VolumeState, goal: Goal) -> bool {
    state.next_step(goal, &CsiCapabilities::default()).is_none()
}

fn call_row(call: CsiCall) -> (StateName, StateName) {
    let (_, a, b) = CALLS.iter().find(|(c, _, _)| *c == call).unwrap();
    (*a, *b)
}

#[test]
fn plan_table_covers_every_state_goal_and_capability_set() {
    let states = samples();
    assert_eq!(states.len(), PLAN.len());
    let mut checked = 0;
    for state in &states {
        let (_, row) = PLAN.iter().find(|(n, _)| *n == state.name()).unwrap();
        for (goal, expected) in GOALS.iter().zip(row) {
            for caps in all_caps() {
                let step = state.next_step(*goal, &caps);
                let want = expected.map(|c| {
                    if c.is_supported(&caps) {
                        Step::Call(c)
                    } else {
                        Step::Skip(c)
                    }
                });
                assert_eq!(step, want, "{} → {goal:?} with {caps:?}", state.name());
                assert_eq!(is_at(state, *goal), expected.is_none());
                if let Some(c) = expected {
                    assert!(
                        state.can_begin(*c),
                        "planned {c} cannot begin from {}",
                        state.name()
                    );
                    // begin → the in-flight state; finish(ok) → the target state.
                    let (flight, target) = call_row(*c);
                    let started = state.begin(*c, &boot(2)).unwrap();
                    assert_eq!(started.name(), flight);
                    let done = started.finish(*c, StringMap::new()).unwrap();
                    assert_eq!(done.name(), target);
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 10 * 4 * 4);
}

/// From every state, with every capability set, driving towards every goal reaches it with
/// only RPCs the plugin supports, and the publish chain keeps the publish context and the
/// boot id where they belong.
#[test]
fn every_state_converges_to_every_goal() {
    for start in samples() {
        for goal in GOALS {
            for caps in all_caps() {
                let now = boot(2);
                let mut state = start.clone();
                let mut rpcs = Vec::new();
                loop {
                    let (settled, call) = state.next_call(goal, &caps, &now);
                    state = settled;
                    let Some(call) = call else { break };
                    assert!(call.is_supported(&caps), "{call} sent without capability");
                    state = state.begin(call, &now).unwrap();
                    state = state.finish(call, pc()).unwrap();
                    rpcs.push(call);
                    assert!(
                        rpcs.len() <= 8,
                        "{} → {goal:?}: no convergence: {rpcs:?}",
                        start.name()
                    );
                }
                assert!(
                    is_at(&state, goal),
                    "{} → {goal:?} ended in {}",
                    start.name(),
                    state.name()
                );
                if goal >= Goal::NodeReady {
                    let want = if caps.controller_publish() || start.publish_context().is_some() {
                        Some(pc())
                    } else {
                        Some(StringMap::new())
                    };
                    assert_eq!(
                        state.publish_context().cloned(),
                        want,
                        "{} → {goal:?}",
                        start.name()
                    );
                }
            }
        }
    }
}

#[test]
fn without_capabilities_only_node_publish_is_sent() {
    let none = CsiCapabilities::default();
    let (state, call) = VolumeState::Created.next_call(Goal::Published, &none, &boot(3));
    assert_eq!(call, Some(NP));
    // The no-op stage recorded the current boot.
    assert_eq!(
        state,
        VolumeState::VolReady {
            boot_id: boot(3),
            publish_context: StringMap::new()
        }
    );
    let (state, call) = state.next_call(Goal::Created, &none, &boot(3));
    assert_eq!((state, call), (VolumeState::Created, None));
}

#[test]
fn begin_is_allowed_exactly_per_table_and_failure_leaves_state_unchanged() {
    let mut allowed = 0;
    for state in samples() {
        for call in CsiCall::ALL {
            let before = state.clone();
            match state.begin(call, &boot(2)) {
                Ok(next) => {
                    allowed += 1;
                    assert!(state.can_begin(call));
                    assert_eq!(next.in_flight_call(), Some(call));
                    // A staged volume keeps the boot it was staged in; a new stage takes now.
                    let want_boot = state
                        .boot_id()
                        .cloned()
                        .or_else(|| (call == NS).then(|| boot(2)));
                    assert_eq!(
                        next.boot_id().cloned(),
                        want_boot,
                        "{} {call}",
                        state.name()
                    );
                }
                Err(e) => {
                    assert!(!state.can_begin(call));
                    assert_eq!(
                        e,
                        TransitionError::CannotStart {
                            call,
                            state: state.name()
                        }
                    );
                    assert!(e.to_string().contains(call.rpc_name()));
                }
            }
            assert_eq!(state, before);
        }
    }
    assert_eq!(allowed, 15);
}

#[test]
fn finish_only_settles_the_call_in_flight() {
    for state in samples() {
        for call in CsiCall::ALL {
            let before = state.clone();
            let r = state.finish(call, StringMap::new());
            if state.in_flight_call() == Some(call) {
                assert!(r.is_ok());
            } else {
                assert_eq!(
                    r,
                    Err(TransitionError::NotInFlight {
                        call,
                        state: state.name()
                    })
                );
            }
            assert_eq!(state, before);
        }
    }
}

fn spec() -> VolumeSpec {
    VolumeSpec {
        capability: VolumeCapability {
            access_type: AccessType::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
            },
            access_mode: AccessMode::SingleNodeWriter,
        },
        parameters: BTreeMap::from([("pool".into(), "fast".into())]),
        volume_context: BTreeMap::from([("ctx".into(), "1".into())]),
        readonly: true,
        pre_provisioned: false,
        node_stage_secrets: BTreeMap::from([(
            "password".into(),
            SecretRef {
                name: "db-secret".into(),
                key: "password".into(),
            },
        )]),
        node_publish_secrets: BTreeMap::new(),
        untrack_on_unstage: false,
    }
}

#[test]
fn record_publish_sets_node_publish_required_and_reboot_republishes() {
    let caps = full();
    let now = boot(1);
    let mut rec = VolumeRecord::created(VolumeId::new("v1"), Some("op-uuid".into()), spec());
    assert!(!rec.node_publish_required);
    loop {
        let (r, call) = rec.next_call(Goal::Published, &caps, &now);
        let Some(call) = call else {
            rec = r;
            break;
        };
        rec = r.begin(call, &now).unwrap();
        rec = rec.finish(call, StringMap::new()).unwrap();
    }
    assert!(rec.node_publish_required);
    assert_eq!(rec.state.name(), StateName::Published);

    // Reboot: walked back to NODE_READY, and recovery must publish it again.
    let plan = plan_recovery(
        vec![rec.clone()],
        Vec::new(),
        &boot(2),
        Some(&[]),
        &MountPaths::new("/m"),
    );
    assert_eq!(
        plan.jobs,
        vec![PlannedJob::Recover {
            id: rec.id.clone(),
            goal: RecoveryGoal::AfterReboot { republish: true },
        }]
    );
    let after = &plan.records[0];
    assert_eq!(after.state.name(), StateName::NodeUnpublish);
    let (_, call) = after.next_call(Goal::NodeReady, &caps, &boot(2));
    assert_eq!(call, Some(NUP));
    // Unpublishing does not clear the flag (only deletion does).
    let unpub = rec
        .begin(NUP, &now)
        .unwrap()
        .finish(NUP, StringMap::new())
        .unwrap();
    assert!(unpub.node_publish_required);
}

#[test]
fn record_serde_round_trip_every_state() {
    for state in samples() {
        let rec = VolumeRecord {
            id: VolumeId::new("/abs/vol 1"),
            name: Some("2b9f8a6e-0000-4000-8000-000000000000".into()),
            spec: spec(),
            state: state.clone(),
            node_publish_required: true,
            capacity_bytes: 1 << 30,
            deleting: false,
            needs_cleanup: true,
            delete_failed: Some("DeleteVolume failed".into()),
            expansion: Some(slrp_core::volume::Expansion {
                target_bytes: 2 << 30,
                node_owed: true,
            }),
            expanded_bytes: Some(2 << 30),
        };
        let json = serde_json::to_value(&rec).unwrap();
        assert_eq!(json["state"]["state"], state.name().as_str());
        // Only the secret's reference is stored.
        assert_eq!(
            json["spec"]["node_stage_secrets"]["password"]["name"],
            "db-secret"
        );
        let back: VolumeRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, rec);
    }
    // Absent optional fields default.
    let minimal = serde_json::json!({
        "id": "v", "state": {"state": "CREATED"},
        "spec": {"capability": {"access_type": "block", "access_mode": "SINGLE_NODE_WRITER"}}
    });
    let rec: VolumeRecord = serde_json::from_value(minimal).unwrap();
    assert_eq!(rec.state, VolumeState::Created);
    assert!(!rec.node_publish_required && rec.name.is_none());
    // Unknown states are refused, never guessed.
    let bad = serde_json::json!({"state": "UNKNOWN"});
    assert!(serde_json::from_value::<VolumeState>(bad).is_err());
}

#[test]
fn records_survive_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let rec = VolumeRecord::created(VolumeId::new("/abs/vol 1"), Some("op".into()), spec());
    {
        let store = slrp_store::Store::open(dir.path()).unwrap();
        let mut tx = store.transaction();
        tx.put(&rec).unwrap();
        tx.commit_blocking().unwrap();
    }
    let store = slrp_store::Store::open(dir.path()).unwrap();
    assert_eq!(
        store.load_all_blocking::<VolumeRecord>().unwrap(),
        vec![rec]
    );
}

#[test]
fn state_names_match_mesos() {
    let names: Vec<String> = samples().iter().map(|s| s.name().to_string()).collect();
    assert_eq!(
        names,
        [
            "CREATED",
            "CONTROLLER_PUBLISH",
            "NODE_READY",
            "CONTROLLER_UNPUBLISH",
            "NODE_STAGE",
            "VOL_READY",
            "NODE_PUBLISH",
            "PUBLISHED",
            "NODE_UNPUBLISH",
            "NODE_UNSTAGE",
        ]
    );
}
