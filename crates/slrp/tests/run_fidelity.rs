//! Issue #21, section 1 (provider fidelity), as a Mesos agent sees it: `slrp run` with the
//! bundled plugin and the embedded manager, the plugin's fault injection holding or
//! failing the calls that make reconciliations overlap operations. Each test fails on the
//! code before the fix it shows (commit 5ad186b; the before and after results are in
//! docs/testing.md, "Provider fidelity").
//!
//! - a conversion never shrinks: a CREATE_DISK on Mesos's fixed-point rounding edge keeps
//!   the consumed size, and later reconciliations (which list the plugin's real size) make
//!   no second resource of the volume;
//! - a failed call never removes resources: GetCapacity failing with INTERNAL or UNKNOWN
//!   keeps the pool; only a refusal (INVALID_ARGUMENT) withholds a pool, that profile's;
//! - storage is never counted twice: a reconciliation that a CREATE_DISK on a RESERVEd part
//!   of the pool waits for reports no more storage than the plugin has;
//! - a deferred operation is judged against the reconciled total: a DESTROY_DISK of a
//!   volume the reconciliation took, or an import of a volume whose metadata it changed,
//!   is DROPPED as Mesos drops it, without a CSI call.
//!
//! "Held" here is a delay of the plugin's answer (fault injection): the operation is sent
//! once the held call has started, and the test then requires the daemon to have deferred
//! it (`deferred=true` in its log), so a run where the hold did not overlap the operation
//! fails instead of passing without testing anything.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::float_cmp
)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use slrp_manager::ManagerMessage;
use support::ops::{self, FRAMEWORK_ROLE, allocated, create_disk, destroy_disk, reserve};
use support::{Cluster, DaemonOptions, ProviderSpec, Update, mb, metadata, profiles, source};

/// The message of Mesos's drop of a disk operation during a storage reconciliation.
const RECONCILING: &str = "Cannot apply operation when reconciling storage pools";

/// The uses of a counting rule, as [`Cluster::count_calls`] writes them (so that
/// [`Cluster::calls`] reads rules written here too).
const COUNTER: u64 = 1_000_000;

/// How long a held plugin call takes: the operation is sent as soon as the call has
/// started, so this only has to cover one APPLY_OPERATION's way from the manager to the
/// daemon's worker (milliseconds), with a wide margin for loaded cores.
const HOLD_MS: u64 = 2_000;

/// The fixture's pool (4 GiB) in MB.
const POOL_MB: f64 = 4096.0;

/// Mesos's fixed point, in which a master compares and adds scalars: `llround(v * 1000)`.
fn fixed(value: f64) -> i64 {
    // An exact conversion of a small rounded value (MB sizes of at most a few TB).
    #[allow(clippy::cast_possible_truncation)]
    let millis = (value * 1000.0).round() as i64;
    millis
}

/// A counting rule for `rpc` (see [`COUNTER`]).
fn counter(rpc: &str) -> Value {
    json!({"rpc": rpc, "delay_ms": 0, "times": COUNTER})
}

/// The fixture with profile `test`, periodic reconciliation every `interval` seconds (0:
/// none) and the profile document polled; started, with its `test` pool.
async fn started(interval: f64, prepare: impl FnOnce(&Cluster)) -> (Cluster, Update) {
    let mut spec = ProviderSpec::fixture();
    spec.reconciliation_interval_seconds = interval;
    let mut c = Cluster::new(vec![spec], DaemonOptions::with_profiles()).await;
    c.set_profiles(&profiles(&["test"]));
    prepare(&c);
    c.start_daemon();
    let u = c.update_where(|u| u.pool("test").is_some()).await;
    (c, u)
}

/// Waits until the plugin has taken the last use of the counted rule of `rpc` (it removes
/// a spent rule from its file before acting on it): that call has started.
async fn rule_taken(c: &Cluster, rpc: &str) {
    c.within(&format!("the plugin to take the {rpc} rule"), async {
        while c
            .faults_left("test")
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["rpc"] == rpc)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Whether the daemon deferred operation `uuid` (accepted it during a reconciliation).
fn was_deferred(c: &Cluster, uuid: uuid::Uuid) -> bool {
    let uuid = uuid.to_string();
    c.daemon_log().lines().any(|l| {
        l.contains("accepted operation") && l.contains(&uuid) && l.contains("deferred=true")
    })
}

/// The plugin's endpoint, as its supervisor gave it (`CSI_ENDPOINT` of its process).
fn plugin_endpoint(c: &Cluster) -> String {
    let pid = c.plugin_pid("test");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("CSI_ENDPOINT="))
        .map(str::to_owned)
        .unwrap_or_else(|| c.fail("the plugin process has no CSI_ENDPOINT"))
}

/// `slrp csi --json ARGS` against the running plugin (another client of its socket, as an
/// operator's tool would be); its JSON answer.
fn plugin_cli(c: &Cluster, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .arg("csi")
        .arg("--endpoint")
        .arg(plugin_endpoint(c))
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        c.fail(&format!(
            "slrp csi {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The storage of `profile` in `resources` (its pools, whatever their reservations, and
/// its disks), in Mesos's fixed point.
fn profile_storage<'a>(resources: impl IntoIterator<Item = &'a Value>, profile: &str) -> i64 {
    resources
        .into_iter()
        .filter(|r| source(r)["profile"] == profile)
        .map(|r| fixed(mb(r)))
        .sum()
}

/// The id of a disk.
fn id(disk: &Value) -> String {
    source(disk)["id"].as_str().unwrap().to_owned()
}

/// Reads the manager's messages until an UPDATE_STATE for which `last` holds, passing each
/// UPDATE_STATE (that one included) to `check` first: the provider sends its updates in
/// order, so when `last` is the answer to a change the test made, `check` has seen every
/// update sent before it.
async fn updates_until(
    c: &mut Cluster,
    mut check: impl FnMut(&Update),
    last: impl Fn(&Update) -> bool,
) -> Update {
    loop {
        let m = c.next_message().await;
        if let ManagerMessage::UpdateState {
            provider_id,
            resources,
            resource_version_uuid,
            ..
        } = &m
        {
            let u = Update::new(provider_id.clone(), resources, resource_version_uuid);
            check(&u);
            if last(&u) {
                return u;
            }
        }
    }
}

/// Mesos's rounding edge: 1.0015 MB is 1002 thousandths in a master's fixed point, but
/// the 1,050,148 bytes a CreateVolume asks for it (and the plugin makes) are 1.0014992 MB,
/// 1001 thousandths.
const EDGE_MB: f64 = 1.0015;
const EDGE_BYTES: u64 = 1_050_148;

/// A conversion never shrinks (issue #21, MESOS-8825): a CREATE_DISK of 1.0015 MB of the
/// pool FINISHES with a disk of exactly the consumed size, and the manager, which checks
/// a master allocator's invariant on FINISHED conversions, counts no violation. The plugin
/// made and lists the 1,050,148 bytes asked (1001 thousandths); periodic reconciliations
/// and a profile change's reconciliation (each listing the volume with that size) keep
/// one resource of the volume, of 1.0015 MB.
///
/// Before the fix the disk took the size the plugin reported: 1.0014992 MB, a conversion
/// into something smaller than what it consumed, on which a Mesos master aborts.
#[tokio::test]
async fn a_conversion_on_the_rounding_edge_keeps_the_consumed_size() {
    let (mut c, u) = started(0.2, |_| {}).await;
    let pool = u.pool("test").unwrap().clone();
    let from = allocated(&ops::portion(&pool, EDGE_MB), FRAMEWORK_ROLE);
    let disk = c.finished_one(create_disk(&from, "MOUNT", None)).await;
    assert_eq!(mb(&disk), EDGE_MB, "the consumed size: {disk}");
    assert_eq!(fixed(mb(&disk)), 1002);
    c.assert_no_protocol_violation();
    let volume = id(&disk);

    // The plugin made what was asked and lists that, a size below the disk's in Mesos's
    // fixed point.
    let listed = plugin_cli(&c, &["list-volumes"]);
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume_id"] == volume.as_str())
        .unwrap_or_else(|| panic!("the plugin lists {volume}: {listed}"));
    assert_eq!(entry["capacity_bytes"], EDGE_BYTES, "{entry}");
    assert_eq!(fixed(EDGE_BYTES as f64 / 1_048_576.0), 1001);

    // Two periodic reconciliations list it, then a profile change's (a third listing)
    // whose UPDATE_STATE comes after every earlier one.
    c.count_calls("test", &["ListVolumes"]);
    c.within("two periodic reconciliations", async {
        while c.calls("test", "ListVolumes") < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    c.set_profiles(&profiles(&["test", "test2"]));
    let mut seen = 0;
    let last = updates_until(
        &mut c,
        |u| {
            seen += 1;
            let copies: Vec<&Value> = u
                .resources
                .iter()
                .filter(|r| source(r)["id"] == volume.as_str())
                .collect();
            assert!(copies.len() <= 1, "one resource of {volume}: {copies:?}");
            for copy in copies {
                assert_eq!(mb(copy), EDGE_MB, "{copy}");
                assert_eq!(source(copy)["type"], "MOUNT", "{copy}");
            }
        },
        |u| u.pool("test2").is_some(),
    )
    .await;
    assert!(seen >= 1);
    assert!(c.calls("test", "ListVolumes") >= 3);
    let [kept] = &last.disks()[..] else {
        panic!("one disk: {:?}", last.resources)
    };
    assert_eq!(id(kept), volume);
    assert_eq!(mb(kept), EDGE_MB, "{kept}");
    c.finish().await;
}

/// A failed call never removes resources (issue #21): GetCapacity failing with INTERNAL
/// (twice), then with UNKNOWN (twice), fails those periodic reconciliations, which are
/// retried; no UPDATE_STATE without the pool reaches the manager, and the pool is reported
/// unchanged after each (a profile change's UPDATE_STATE, sent after all the earlier
/// ones, closes each round). A profile the plugin refuses (INVALID_ARGUMENT: a `backend`
/// it does not know) gets no pool, and only that profile.
///
/// Before the fix INTERNAL and UNKNOWN were taken as the plugin's refusal of the profile:
/// the pool was removed (its offers rescinded) until the next reconciliation.
#[tokio::test]
async fn a_failed_capacity_call_never_removes_the_pool() {
    let (mut c, u) = started(0.1, |_| {}).await;
    let pool = u.pool("test").unwrap().clone();
    let mut names = vec!["test"];
    for (code, barrier) in [("INTERNAL", "test2"), ("UNKNOWN", "test3")] {
        c.set_faults(
            "test",
            &json!([{"rpc": "GetCapacity", "fail": code, "times": 2}]),
        );
        rule_taken(&c, "GetCapacity").await;
        names.push(barrier);
        c.set_profiles(&profiles(&names));
        updates_until(
            &mut c,
            |u| {
                assert_eq!(
                    u.pool("test"),
                    Some(&pool),
                    "GetCapacity {code}: the pool as it was in every UPDATE_STATE: {:?}",
                    u.resources
                );
            },
            |u| u.pool(barrier).is_some(),
        )
        .await;
    }
    assert!(
        c.daemon_log().contains("periodic reconciliation failed"),
        "the failures failed reconciliations"
    );

    // A refusal withholds that profile's pool only.
    names.push("test4");
    let mut doc = profiles(&names);
    doc["profile_matrix"]["refused"] = json!({
        "csi_plugin_type_selector": {"plugin_type": support::PLUGIN_TYPE},
        "volume_capabilities": {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
        "create_parameters": {"backend": "none-such"},
    });
    c.set_profiles(&doc);
    let last = updates_until(
        &mut c,
        |u| assert_eq!(u.pool("test"), Some(&pool), "{:?}", u.resources),
        |u| u.pool("test4").is_some(),
    )
    .await;
    assert!(last.pool("refused").is_none(), "{:?}", last.resources);
    let mut reported: Vec<&str> = last
        .pools()
        .iter()
        .filter_map(|p| source(p)["profile"].as_str())
        .collect();
    reported.sort_unstable();
    assert_eq!(reported, ["test", "test2", "test3", "test4"]);
    assert!(
        c.daemon_log()
            .contains("the plugin refuses this profile; no storage pool for it"),
        "the refusal was met"
    );
    c.finish().await;
}

/// Storage is never counted twice (issue #21): 1 GiB of the 4 GiB pool is RESERVEd for
/// the framework's role; a periodic reconciliation is held (its GetCapacity delayed) and a
/// CREATE_DISK of the reserved part arrives meanwhile, so it waits for the reconciliation
/// (deferred) and its source is in flight when the reconciliation applies the plugin's
/// answer (still 4 GiB: nothing is created yet). Its CreateVolume is slowed too. No
/// UPDATE_STATE up to the operation's FINISHED (nor the agent's total after it) holds
/// more storage of the profile than the plugin's 4 GiB, and the manager counts no
/// violation.
///
/// Before the fix the in-flight part was taken out of the plugin's answer as it is in
/// the total (reserved to the role), from which it subtracted nothing: the reconciliation
/// added a 1 GiB pool beside the reserved gigabyte it was about to become a disk, 5 GiB
/// in all.
#[tokio::test]
async fn a_deferred_create_disk_on_reserved_storage_is_not_counted_twice() {
    let (mut c, u) = started(0.2, |_| {}).await;
    let pool = u.pool("test").unwrap().clone();
    let plugin_has = fixed(POOL_MB);
    let offered = allocated(&ops::portion(&pool, 1024.0), FRAMEWORK_ROLE);
    let (reserve_op, reserved) = reserve(&offered, FRAMEWORK_ROLE);
    c.finished(reserve_op).await;

    c.set_faults(
        "test",
        &json!([
            {"rpc": "GetCapacity", "delay_ms": HOLD_MS, "times": 1},
            {"rpc": "CreateVolume", "delay_ms": 500, "times": 1},
        ]),
    );
    rule_taken(&c, "GetCapacity").await;
    let uuid = c
        .apply(create_disk(
            &allocated(&reserved, FRAMEWORK_ROLE),
            "MOUNT",
            None,
        ))
        .await;
    let status = loop {
        match c.next_message().await {
            ManagerMessage::UpdateState { resources, .. } => {
                let json: Vec<Value> = resources.iter().map(ops::json_of).collect();
                let held = profile_storage(&json, "test");
                assert!(
                    held <= plugin_has,
                    "an UPDATE_STATE holds {held} thousandths of a MB of profile test, the \
                     plugin has {plugin_has}: {json:#?}"
                );
            }
            ManagerMessage::UpdateOperationStatus { update, .. }
                if update.operation_uuid.value == uuid.as_bytes()
                    && ops::state_name(&update.status) != "OPERATION_PENDING" =>
            {
                break update.status;
            }
            _ => {}
        }
    };
    assert_eq!(
        ops::state_name(&status),
        "OPERATION_FINISHED",
        "{}",
        ops::status_json(&status)
    );
    assert!(
        was_deferred(&c, uuid),
        "the CREATE_DISK waited for the held reconciliation"
    );
    assert!(
        c.faults_left("test").as_array().unwrap().is_empty(),
        "the slowed CreateVolume was called: {}",
        c.faults_left("test")
    );
    let total: Vec<Value> = c
        .agent_total()
        .await
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    // The agent's view: the rest of the pool and the disk, exactly the plugin's 4 GiB.
    assert_eq!(
        profile_storage(&total, "test"),
        plugin_has,
        "the agent's total: {total:#?}"
    );
    c.finish().await;
}

/// Holds the next reconciliation: a profile change starts one whose ListVolumes the
/// plugin answers after [`HOLD_MS`] (with `edit`, a ListVolumes edit of the fault rules,
/// applied to that answer only); returns once the held call has started. From then on the
/// plugin counts its DeleteVolume, ValidateVolumeCapabilities and CreateVolume calls.
async fn hold_a_reconciliation(c: &Cluster, edit: Value) {
    let mut held = json!({"rpc": "ListVolumes", "delay_ms": HOLD_MS, "times": 1});
    for (k, v) in edit.as_object().unwrap() {
        held[k] = v.clone();
    }
    c.set_faults(
        "test",
        &json!([
            held,
            counter("DeleteVolume"),
            counter("ValidateVolumeCapabilities"),
            counter("CreateVolume"),
        ]),
    );
    c.set_profiles(&profiles(&["test", "test2"]));
    rule_taken(c, "ListVolumes").await;
}

/// Asserts `uuid` ended DROPPED with Mesos's reconciliation text after waiting for the
/// reconciliation, and that the plugin was asked nothing for it.
async fn dropped_uncalled(c: &Cluster, uuid: uuid::Uuid) {
    let status = c.terminal(uuid).await.latest_status;
    let calls: Vec<(&str, u64)> = ["DeleteVolume", "ValidateVolumeCapabilities", "CreateVolume"]
        .into_iter()
        .map(|rpc| (rpc, c.calls("test", rpc)))
        .collect();
    assert_eq!(
        (
            ops::state_name(&status).as_str(),
            status.message.as_deref(),
            calls
        ),
        (
            "OPERATION_DROPPED",
            Some(RECONCILING),
            vec![
                ("DeleteVolume", 0),
                ("ValidateVolumeCapabilities", 0),
                ("CreateVolume", 0)
            ]
        ),
        "the terminal status and the plugin's calls since the hold: {}",
        ops::status_json(&status)
    );
    assert!(
        was_deferred(c, uuid),
        "it waited for the held reconciliation"
    );
}

/// A deferred operation is judged against the reconciled total (issue #21): a 2 GiB
/// pre-existing volume is deleted behind the provider's back (DeleteVolume by another
/// client of the plugin's socket); a reconciliation is held and a DESTROY_DISK of the
/// volume arrives meanwhile (deferred: its resource version is the current one). The
/// reconciliation takes the volume away, so the DESTROY_DISK is DROPPED with Mesos's
/// text ("Cannot apply operation when reconciling storage pools") without a DeleteVolume;
/// the agent's total has no disk, and the manager counts no violation.
///
/// Before the fix a deferred operation ran as it was accepted: the DeleteVolume was made
/// for a volume the total no longer had.
#[tokio::test]
async fn a_deferred_destroy_of_a_volume_the_reconciliation_took_is_dropped_uncalled() {
    let (mut c, u) = started(0.0, |c| {
        c.import_volume("test", "a", 2 << 30);
    })
    .await;
    let [raw] = &u.disks()[..] else {
        panic!("one pre-existing volume: {:?}", u.resources)
    };
    let raw = (*raw).clone();
    let volume = id(&raw);
    let deleted = plugin_cli(&c, &["delete-volume", &volume]);
    assert_eq!(deleted["volume_id"], volume.as_str());

    hold_a_reconciliation(&c, json!({})).await;
    let uuid = c
        .apply(destroy_disk(&allocated(&raw, FRAMEWORK_ROLE)))
        .await;
    dropped_uncalled(&c, uuid).await;
    let after = c.update_where(|u| u.pool("test2").is_some()).await;
    assert!(after.disks().is_empty(), "{:?}", after.resources);
    assert!(
        c.agent_total()
            .await
            .iter()
            .all(|r| !r.contains(volume.as_str())),
        "{:?}",
        c.agent_total().await
    );
    c.finish().await;
}

/// The same for an import: a reconciliation is held whose listing reports new metadata
/// for a 2 GiB pre-existing volume (`label=bar`, a ListVolumes edit of that answer), and a
/// CREATE_DISK with `target_profile` `test` of the volume as it was offered (metadata
/// `backend=loop`) arrives meanwhile. Its source changed, so it is DROPPED with Mesos's reconciliation
/// text without a ValidateVolumeCapabilities; the volume stays a RAW disk, now with the
/// plugin's metadata.
///
/// Before the fix the deferred import ran against a source the total no longer had.
#[tokio::test]
async fn a_deferred_import_of_a_volume_the_reconciliation_changed_is_dropped_uncalled() {
    let (mut c, u) = started(0.0, |c| {
        c.import_volume("test", "b", 2 << 30);
    })
    .await;
    let [raw] = &u.disks()[..] else {
        panic!("one pre-existing volume: {:?}", u.resources)
    };
    let raw = (*raw).clone();
    let volume = id(&raw);
    let listed = [("backend".to_owned(), "loop".to_owned())].into();
    assert_eq!(metadata(&raw), listed, "the plugin's context: {raw}");

    hold_a_reconciliation(
        &c,
        json!({"volume_context": {"label": "bar"}, "volume_id": volume}),
    )
    .await;
    let uuid = c
        .apply(create_disk(
            &allocated(&raw, FRAMEWORK_ROLE),
            "MOUNT",
            Some("test"),
        ))
        .await;
    dropped_uncalled(&c, uuid).await;
    let after = c.update_where(|u| u.pool("test2").is_some()).await;
    let [disk] = &after.disks()[..] else {
        panic!("one disk: {:?}", after.resources)
    };
    assert_eq!(id(disk), volume);
    assert_eq!(source(disk)["type"], "RAW", "{disk}");
    assert_eq!(
        metadata(disk),
        [("label".to_owned(), "bar".to_owned())].into(),
        "{disk}"
    );
    c.finish().await;
}
