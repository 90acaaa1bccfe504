//! Table test of recovery planning ([`plan_recovery`]): every stored state × same/new
//! boot id × target mounted or not × `node_publish_required` × deleting × an intent
//! present, against a table written from the rules in `docs/volume-manager.md`
//! ("Recovery").

#![allow(clippy::unwrap_used, reason = "test helpers outside #[test] functions")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use slrp_core::volume::*;

use StateName as S;

const NOW: &str = "boot-now";

fn pc() -> StringMap {
    BTreeMap::from([("device".to_owned(), "/dev/x".to_owned())])
}

/// A state named `name`, staged (where it carries a boot id) in `boot`.
fn state(name: StateName, boot: &str) -> VolumeState {
    let (boot_id, publish_context) = (BootId::new(boot), pc());
    match name {
        S::Created => VolumeState::Created,
        S::ControllerPublish => VolumeState::ControllerPublishing,
        S::NodeReady => VolumeState::NodeReady { publish_context },
        S::ControllerUnpublish => VolumeState::ControllerUnpublishing,
        S::NodeStage => VolumeState::NodeStaging {
            boot_id,
            publish_context,
        },
        S::VolReady => VolumeState::VolReady {
            boot_id,
            publish_context,
        },
        S::NodePublish => VolumeState::NodePublishing {
            boot_id,
            publish_context,
        },
        S::Published => VolumeState::Published {
            boot_id,
            publish_context,
        },
        S::NodeUnpublish => VolumeState::NodeUnpublishing {
            boot_id,
            publish_context,
        },
        S::NodeUnstage => VolumeState::NodeUnstaging {
            boot_id,
            publish_context,
        },
    }
}

/// A volume created under the name `op`, in `state`.
fn record(id: &VolumeId, state: VolumeState) -> VolumeRecord {
    let spec = VolumeSpec {
        capability: VolumeCapability::mount_default(),
        parameters: StringMap::new(),
        volume_context: StringMap::new(),
        readonly: false,
        pre_provisioned: false,
        node_stage_secrets: BTreeMap::new(),
        node_publish_secrets: BTreeMap::new(),
        untrack_on_unstage: false,
    };
    let mut rec = VolumeRecord::created(id.clone(), Some("op".into()), spec);
    rec.state = state;
    rec
}

/// Per stored state: whether it records a boot id, the state after a reboot, and the
/// state in the same boot with the target mounted / not mounted.
const TABLE: [(StateName, bool, StateName, StateName, StateName); 10] = [
    (S::Created, false, S::Created, S::Created, S::Created),
    (
        S::ControllerPublish,
        false,
        S::ControllerPublish,
        S::ControllerPublish,
        S::ControllerPublish,
    ),
    (
        S::NodeReady,
        false,
        S::NodeReady,
        S::NodeReady,
        S::NodeReady,
    ),
    (
        S::ControllerUnpublish,
        false,
        S::ControllerUnpublish,
        S::ControllerUnpublish,
        S::ControllerUnpublish,
    ),
    (
        S::NodeStage,
        true,
        S::NodeUnstage,
        S::NodeStage,
        S::NodeStage,
    ),
    // A target mounted although only staged: a publish whose record was lost.
    (
        S::VolReady,
        true,
        S::NodeUnstage,
        S::NodeUnpublish,
        S::VolReady,
    ),
    (
        S::NodePublish,
        true,
        S::NodeUnpublish,
        S::NodePublish,
        S::NodePublish,
    ),
    // A target unmounted behind our back: publish again.
    (
        S::Published,
        true,
        S::NodeUnpublish,
        S::Published,
        S::NodePublish,
    ),
    (
        S::NodeUnpublish,
        true,
        S::NodeUnpublish,
        S::NodeUnpublish,
        S::NodeUnpublish,
    ),
    (
        S::NodeUnstage,
        true,
        S::NodeUnstage,
        S::NodeUnstage,
        S::NodeUnstage,
    ),
];

/// The goal that finishes an interrupted call in its own direction.
fn finishing(after: StateName) -> Option<Goal> {
    match after {
        S::ControllerPublish | S::NodeUnstage => Some(Goal::NodeReady),
        S::ControllerUnpublish => Some(Goal::Created),
        S::NodeStage | S::NodeUnpublish => Some(Goal::VolReady),
        S::NodePublish => Some(Goal::Published),
        S::Created | S::NodeReady | S::VolReady | S::Published => None,
    }
}

#[test]
fn recovery_plan_table() {
    let paths = MountPaths::new("/m");
    let id = VolumeId::new("vol-1");
    let target = paths.target(&id).unwrap();
    let now = BootId::new(NOW);
    let mut cases = 0;
    for (stored_name, has_boot, after_reboot, same_mounted, same_unmounted) in TABLE {
        for new_boot in [false, true] {
            for mounted in [false, true] {
                for npr in [false, true] {
                    for deleting in [false, true] {
                        for intent in [false, true] {
                            cases += 1;
                            let boot = if new_boot { "boot-old" } else { NOW };
                            let mut stored = record(&id, state(stored_name, boot));
                            stored.node_publish_required = npr;
                            stored.deleting = deleting;
                            let intents = if intent {
                                vec![CreateVolume {
                                    name: "op-2".into(),
                                    required_bytes: 1,
                                    limit_bytes: 0,
                                    capability: VolumeCapability::mount_default(),
                                    parameters: StringMap::new(),
                                    content_source: None,
                                }]
                            } else {
                                Vec::new()
                            };
                            let mounts: Vec<PathBuf> = if mounted {
                                vec![target.clone()]
                            } else {
                                Vec::new()
                            };
                            let case = format!(
                                "{stored_name} new_boot={new_boot} mounted={mounted} \
                                 npr={npr} deleting={deleting} intent={intent}"
                            );
                            let plan = plan_recovery(
                                vec![stored.clone()],
                                intents.clone(),
                                &now,
                                Some(&mounts),
                                &paths,
                            );

                            let rebooted = new_boot && has_boot;
                            let after = match (rebooted, mounted) {
                                (true, _) => after_reboot,
                                (false, true) => same_mounted,
                                (false, false) => same_unmounted,
                            };
                            assert_eq!(plan.records.len(), 1, "{case}");
                            let rec = &plan.records[0];
                            assert_eq!(rec.state.name(), after, "{case}");
                            assert_eq!(
                                rec.state.publish_context(),
                                stored.state.publish_context(),
                                "{case}"
                            );
                            let boot_after = if rebooted {
                                Some(NOW)
                            } else {
                                has_boot.then_some(boot)
                            };
                            assert_eq!(
                                rec.state.boot_id().map(BootId::as_str),
                                boot_after,
                                "{case}"
                            );
                            assert_eq!(
                                (rec.node_publish_required, rec.deleting),
                                (npr, deleting),
                                "{case}"
                            );
                            assert_eq!(plan.rebooted, usize::from(rebooted), "{case}");
                            let changed = after != stored_name || rebooted;
                            assert_eq!(plan.changed.len(), usize::from(changed), "{case}");
                            if changed {
                                assert_eq!(&plan.changed[0], rec, "{case}");
                            }

                            let redriven = !rebooted && after != stored_name;
                            let stray = !rebooted
                                && mounted
                                && matches!(stored_name, S::Created | S::NodeReady);
                            let mismatches: Vec<(bool, bool)> = plan
                                .mismatches
                                .iter()
                                .map(|m| (m.redriven, m.target_mounted))
                                .collect();
                            let want: Vec<(bool, bool)> = match (redriven, stray) {
                                (true, _) => vec![(true, mounted)],
                                (false, true) => vec![(false, true)],
                                (false, false) => Vec::new(),
                            };
                            assert_eq!(mismatches, want, "{case}");

                            let goal = if deleting {
                                Some(RecoveryGoal::Delete)
                            } else if rebooted {
                                Some(RecoveryGoal::AfterReboot { republish: npr })
                            } else if npr {
                                Some(RecoveryGoal::Republish)
                            } else {
                                finishing(after).map(RecoveryGoal::Reach)
                            };
                            let mut jobs: Vec<PlannedJob> = goal
                                .map(|goal| PlannedJob::Recover {
                                    id: id.clone(),
                                    goal,
                                })
                                .into_iter()
                                .collect();
                            jobs.extend(intents.into_iter().map(PlannedJob::Create));
                            assert_eq!(plan.jobs, jobs, "{case}");
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 10 * 2 * 2 * 2 * 2 * 2);
}

#[test]
fn an_unreadable_mount_table_reconciles_nothing() {
    let paths = MountPaths::new("/m");
    let now = BootId::new(NOW);
    // Published, and nothing mounted would re-drive NodePublish; an unknown table must not.
    let rec = record(&VolumeId::new("vol-1"), state(S::Published, NOW));
    let plan = plan_recovery(vec![rec.clone()], Vec::new(), &now, None, &paths);
    assert_eq!(plan.records, vec![rec]);
    assert!(plan.changed.is_empty() && plan.mismatches.is_empty() && plan.jobs.is_empty());
}

#[test]
fn goals_that_block_readiness() {
    let required = [
        (RecoveryGoal::Republish, true),
        (RecoveryGoal::AfterReboot { republish: true }, true),
        (RecoveryGoal::AfterReboot { republish: false }, false),
        (RecoveryGoal::Delete, false),
        (RecoveryGoal::Reach(Goal::Published), false),
    ];
    for (goal, want) in required {
        assert_eq!(goal.is_required(), want, "{goal:?}");
    }
}
