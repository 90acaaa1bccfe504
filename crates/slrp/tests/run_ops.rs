//! Mesos's operation tests (spec §11.1) as real-process tests of `slrp run`: disks and
//! persistent volumes. The embedded manager plays agent and master (it applies speculative
//! conversions at once and `total − consumed + converted` at a FINISHED disk operation, and
//! counts a protocol violation where an agent would abort); the daemon and its
//! `slrp-csi-local` plugin are children; `ROOT_` tests publish for real (mounts) and play
//! the task by writing into the published path.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::float_cmp
)]

#[macro_use]
mod support;

use serde_json::{Value, json};
use slrp_manager::ApplyRequest;
use support::ops::{
    self, FRAMEWORK_ROLE, allocated, create, create_disk, destroy, destroy_disk, persistent,
    popped, reserve, unallocated, unpersisted, unreserve,
};
use support::{
    Cluster, DaemonOptions, ProviderSpec, Update, mb, profiles, sorted, sorted_one, source,
};

/// Where the agent finds MOUNT disks of the fixture's plugin, relative to its work dir
/// (spec §5.4 step 4: the exact string).
const MOUNT_ROOT: &str = "./csi/org.apache.mesos.csi.test/local/mounts";

/// Starts `spec` with the profile document `doc`, after `prepare` (faults, imports), and
/// waits for an UPDATE_STATE for which `ready` holds.
async fn started(
    spec: ProviderSpec,
    doc: &Value,
    prepare: impl FnOnce(&Cluster),
    ready: impl Fn(&Update) -> bool,
) -> (Cluster, Update) {
    let mut c = Cluster::new(vec![spec], DaemonOptions::with_profiles()).await;
    c.set_profiles(doc);
    prepare(&c);
    c.start_daemon();
    let u = c.update_where(ready).await;
    (c, u)
}

/// The size of the disks the tests create (Mesos's tests take their whole 4 GiB pool).
const DISK_MB: f64 = 4096.0;

/// The fixture (CSI `csi`) with profile `test`, started; its `test` pool.
async fn with_pool(csi: &'static str) -> (Cluster, Value) {
    with_pool_of(csi, "4GiB").await
}

/// The same with 1 GiB more than the disk takes, for the tests that restart the provider
/// before destroying: at recovery a provider knows only the profiles of its checkpointed
/// pools (spec §7.3), so a DESTROY_DISK before the profile watch has run would find the
/// profile unknown and convert nothing (spec §5.5; Mesos's CreateDestroyDiskWithRecovery
/// keeps an extra 1 GB for the same reason, MESOS-9553).
async fn with_spare_pool(csi: &'static str) -> (Cluster, Value) {
    with_pool_of(csi, "5GiB").await
}

async fn with_pool_of(csi: &'static str, size: &str) -> (Cluster, Value) {
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.pools = vec![format!("default={size}")];
    let (c, u) = started(
        spec,
        &profiles(&["test"]),
        |_| {},
        |u| u.pool("test").is_some(),
    )
    .await;
    let pool = u.pool("test").unwrap().clone();
    (c, pool)
}

/// Asserts `disk` is a MOUNT disk of profile `profile` made from `source` (spec §5.4 step
/// 4): the source's scalar, reservations and allocation, a plugin volume id, the relative
/// mount root.
fn assert_mount_disk(disk: &Value, from: &Value, profile: &str) {
    assert_eq!(source(disk)["type"], "MOUNT", "{disk}");
    assert_eq!(source(disk)["profile"], profile, "{disk}");
    assert_eq!(source(disk)["mount"]["root"], MOUNT_ROOT, "{disk}");
    assert!(source(disk)["id"].is_string(), "{disk}");
    assert_eq!(mb(disk), mb(from), "{disk}");
    assert_eq!(disk["reservations"], from["reservations"], "{disk}");
    assert_eq!(disk["allocation_info"], from["allocation_info"], "{disk}");
    assert_eq!(source(disk)["vendor"], source(from)["vendor"], "{disk}");
}

/// The id of a disk.
fn id(disk: &Value) -> String {
    source(disk)["id"].as_str().unwrap().to_owned()
}

/// CreateDestroyDisk (§11.1 test 5): pipelined RESERVE (refined to the framework's role) +
/// CREATE_DISK(MOUNT) of the 4 GiB pool → a MOUNT disk with the relative mount root, and
/// the plugin holds the volume; pipelined CREATE, DESTROY, UNRESERVE, DESTROY_DISK → the
/// original RAW pool again and the plugin volume is gone. The agent's total agrees at
/// every step (the manager counts a violation where an agent would abort).
async fn create_destroy_disk(csi: &'static str) {
    let (mut c, pool) = with_pool(csi).await;
    let disk = create_reserved_disk(&c, &pool).await;
    destroy_reserved_disk(&mut c, &disk, &pool).await;
    c.finish().await;
}
csi_versions!(create_destroy_disk);

/// What is left of `pool` once a [`DISK_MB`] disk is made from it (nothing, or a pool).
fn rest_of(pool: &Value) -> Vec<Value> {
    let left = mb(pool) - DISK_MB;
    if left > 0.0 {
        vec![ops::portion(pool, left)]
    } else {
        Vec::new()
    }
}

/// `resources` and the rest of `pool`, as [`sorted`] texts.
fn with_rest(resources: &[Value], pool: &Value) -> Vec<String> {
    let mut all = resources.to_vec();
    all.extend(rest_of(pool));
    sorted(&all)
}

/// Waits for the UPDATE_STATE of a recovered provider: its disk and, when there is spare
/// capacity, the rest of the pool (whose checkpointed profile the provider knows).
async fn recovered(c: &mut Cluster, pool: &Value) -> support::Update {
    let spare = !rest_of(pool).is_empty();
    c.update_where(|u| !u.disks().is_empty() && (!spare || u.pool("test").is_some()))
        .await
}

/// RESERVE + CREATE_DISK(MOUNT) of [`DISK_MB`] of `pool`, pipelined; returns the disk
/// (unallocated, as the totals hold it).
async fn create_reserved_disk(c: &Cluster, pool: &Value) -> Value {
    let offered = allocated(&ops::portion(pool, DISK_MB), FRAMEWORK_ROLE);
    let (reserve_op, reserved) = reserve(&offered, FRAMEWORK_ROLE);
    let r = c.apply(reserve_op).await;
    let d = c
        .apply(create_disk(
            &allocated(&reserved, FRAMEWORK_ROLE),
            "MOUNT",
            None,
        ))
        .await;
    let r = c.terminal(r).await.latest_status;
    assert_eq!(
        ops::state_name(&r),
        "OPERATION_FINISHED",
        "{}",
        ops::status_json(&r)
    );
    let d = c.terminal(d).await.latest_status;
    assert_eq!(
        ops::state_name(&d),
        "OPERATION_FINISHED",
        "{}",
        ops::status_json(&d)
    );
    let [disk] = &ops::converted(&d)[..] else {
        panic!("one converted disk: {}", ops::status_json(&d))
    };
    assert_mount_disk(disk, &allocated(&reserved, FRAMEWORK_ROLE), "test");
    assert!(
        c.plugin_volumes("test").contains(&id(disk)),
        "the plugin holds {}: {:?}",
        id(disk),
        c.plugin_volumes("test")
    );
    let disk = unallocated(disk);
    assert_eq!(
        c.agent_total().await,
        with_rest(std::slice::from_ref(&disk), pool)
    );
    disk
}

/// CREATE + DESTROY of a persistent volume, UNRESERVE, DESTROY_DISK, pipelined; the
/// pool is back and the plugin holds no volume.
async fn destroy_reserved_disk(c: &mut Cluster, disk: &Value, pool: &Value) {
    let volume = allocated(&persistent(disk, "id1"), FRAMEWORK_ROLE);
    let offered = allocated(disk, FRAMEWORK_ROLE);
    let uuids = [
        c.apply(create(std::slice::from_ref(&volume))).await,
        c.apply(destroy(std::slice::from_ref(&volume))).await,
        c.apply(unreserve(&offered)).await,
        c.apply(destroy_disk(&allocated(&popped(disk), FRAMEWORK_ROLE)))
            .await,
    ];
    let mut last = None;
    for uuid in uuids {
        let s = c.terminal(uuid).await.latest_status;
        assert_eq!(
            ops::state_name(&s),
            "OPERATION_FINISHED",
            "{}",
            ops::status_json(&s)
        );
        last = Some(s);
    }
    let converted = ops::converted(&last.unwrap());
    assert_eq!(
        sorted(&converted.iter().map(unallocated).collect::<Vec<_>>()),
        sorted_one(&ops::portion(pool, DISK_MB)),
        "DESTROY_DISK gives the pool back"
    );
    assert_eq!(c.agent_total().await, sorted_one(pool));
    assert!(
        c.plugin_volumes("test").is_empty(),
        "{:?}",
        c.plugin_volumes("test")
    );
}

/// CreateDestroyDiskWithRecovery (§11.1 test 6): as CreateDestroyDisk with a daemon
/// restart between create and destroy: the recovered provider reports the MOUNT disk
/// unchanged, and the destroy pipeline works on it.
async fn create_destroy_disk_with_recovery(csi: &'static str) {
    let (mut c, pool) = with_spare_pool(csi).await;
    let disk = create_reserved_disk(&c, &pool).await;
    c.restart_daemon().await;
    let u = recovered(&mut c, &pool).await;
    assert_eq!(
        sorted(&u.resources),
        with_rest(std::slice::from_ref(&disk), &pool),
        "the disk unchanged"
    );
    destroy_reserved_disk(&mut c, &disk, &pool).await;
    c.finish().await;
}
csi_versions!(create_destroy_disk_with_recovery);

/// CREATE_DISK(MOUNT) of [`DISK_MB`] of the pool and CREATE of a persistent volume on it;
/// returns the disk and the volume (unallocated).
async fn persistent_volume(c: &Cluster, pool: &Value) -> (Value, Value) {
    let source = allocated(&ops::portion(pool, DISK_MB), FRAMEWORK_ROLE);
    let disk = c.finished_one(create_disk(&source, "MOUNT", None)).await;
    assert_mount_disk(&disk, &source, "test");
    let disk = unallocated(&disk);
    let volume = persistent(&disk, "id1");
    let created = c
        .finished(create(&[allocated(&volume, FRAMEWORK_ROLE)]))
        .await;
    assert_eq!(
        sorted(&created.iter().map(unallocated).collect::<Vec<_>>()),
        sorted_one(&volume)
    );
    assert_eq!(
        c.agent_total().await,
        with_rest(std::slice::from_ref(&volume), pool)
    );
    (disk, volume)
}

/// The "task" of the persistent volume tests: publishes `volume` (as an agent does before
/// a launch) and writes `file` into it.
async fn task_writes(c: &Cluster, volume: &Value, text: &str) {
    c.published(&[allocated(volume, FRAMEWORK_ROLE)]).await;
    let target = c.volume_path(volume);
    assert!(
        support::mounts_under(&c.path("work")).contains(&target),
        "{} is a mount point after the publish",
        target.display()
    );
    std::fs::write(target.join("file"), text).unwrap();
}

/// A later task: publishes `volume` again and reads `file`.
async fn task_reads(c: &Cluster, volume: &Value) -> String {
    c.published(&[allocated(volume, FRAMEWORK_ROLE)]).await;
    std::fs::read_to_string(c.volume_path(volume).join("file")).unwrap_or_else(|e| {
        c.fail(&format!(
            "reading {}: {e}",
            c.volume_path(volume).join("file").display()
        ))
    })
}

/// DESTROY (the file goes, the directory stays) then DESTROY_DISK (the plugin volume
/// goes, the pool is back).
async fn destroy_persistent_volume(c: &Cluster, disk: &Value, volume: &Value, pool: &Value) {
    let converted = c
        .finished(destroy(&[allocated(volume, FRAMEWORK_ROLE)]))
        .await;
    assert_eq!(
        sorted(&converted.iter().map(unallocated).collect::<Vec<_>>()),
        sorted(&[unpersisted(volume)])
    );
    let target = c.volume_path(volume);
    assert!(target.is_dir(), "{} stays", target.display());
    assert!(
        !target.join("file").exists(),
        "DESTROY removed the data in {}",
        target.display()
    );
    c.finished(destroy_disk(&allocated(disk, FRAMEWORK_ROLE)))
        .await;
    assert!(
        c.plugin_volumes("test").is_empty(),
        "{:?}",
        c.plugin_volumes("test")
    );
    assert_eq!(c.agent_total().await, sorted_one(pool));
}

/// ROOT_CreateDestroyPersistentMountVolume (§11.1 test 12): CREATE_DISK, CREATE, a task
/// writes a file; DESTROY finishes and the volume directory exists but the file is gone;
/// DESTROY_DISK finishes and the volume is deleted.
async fn create_destroy_persistent_mount_volume(csi: &'static str) {
    if !slrp_test_support::require_root("create_destroy_persistent_mount_volume") {
        return;
    }
    let (c, pool) = with_pool(csi).await;
    let (disk, volume) = persistent_volume(&c, &pool).await;
    task_writes(&c, &volume, "data").await;
    destroy_persistent_volume(&c, &disk, &volume, &pool).await;
    c.finish().await;
}
csi_versions!(create_destroy_persistent_mount_volume);

/// What happens to the provider between two steps of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    None,
    /// A clean restart of the daemon (Mesos: an agent restart).
    Restart,
    /// A simulated reboot ([`Cluster::simulate_reboot`]).
    Reboot,
}

impl Interruption {
    /// Interrupts the provider and waits until it has recovered; returns its
    /// UPDATE_STATE (`None` for no interruption).
    async fn apply(self, c: &mut Cluster, pool: &Value) -> Option<support::Update> {
        match self {
            Self::None => return None,
            Self::Restart => c.restart_daemon().await,
            Self::Reboot => {
                c.simulate_reboot().await;
                assert!(support::mounts_under(c.dir.path()).is_empty());
                c.start_daemon();
            }
        }
        Some(recovered(c, pool).await)
    }
}

/// The persistent volume tests with `interruption` between the tasks and before the
/// destroy: the second task reads the file (republished after the recovery) and the
/// cleanup still works.
async fn persistent_mount_volume_across(csi: &'static str, interruption: Interruption) {
    let (mut c, pool) = with_spare_pool(csi).await;
    let (disk, volume) = persistent_volume(&c, &pool).await;
    task_writes(&c, &volume, "data").await;
    interruption.apply(&mut c, &pool).await;
    assert_eq!(task_reads(&c, &volume).await, "data");
    let u = interruption.apply(&mut c, &pool).await.unwrap();
    assert_eq!(
        sorted(&u.resources),
        with_rest(std::slice::from_ref(&volume), &pool)
    );
    destroy_persistent_volume(&c, &disk, &volume, &pool).await;
    c.finish().await;
}

/// ROOT_CreateDestroyPersistentMountVolumeWithRecovery (§11.1 test 13): daemon restarts.
async fn create_destroy_persistent_mount_volume_with_recovery(csi: &'static str) {
    if !slrp_test_support::require_root("create_destroy_persistent_mount_volume_with_recovery") {
        return;
    }
    persistent_mount_volume_across(csi, Interruption::Restart).await;
}
csi_versions!(create_destroy_persistent_mount_volume_with_recovery);

/// ROOT_CreateDestroyPersistentMountVolumeWithReboot (§11.1 test 14): simulated reboots
/// (every mount of the test gone, a new boot id): the provider restages and republishes,
/// the file survives.
async fn create_destroy_persistent_mount_volume_with_reboot(csi: &'static str) {
    if !slrp_test_support::require_root("create_destroy_persistent_mount_volume_with_reboot") {
        return;
    }
    persistent_mount_volume_across(csi, Interruption::Reboot).await;
}
csi_versions!(create_destroy_persistent_mount_volume_with_reboot);

/// CreatePersistentBlockVolume (§11.1 test 16): CREATE_DISK to BLOCK (a block profile)
/// finishes; CREATE of a persistent volume on the BLOCK disk fails with Mesos's message,
/// and the provider resynchronises the agent (new resource version, UPDATE_STATE with the
/// disk); the disk can then be destroyed.
async fn create_persistent_block_volume(csi: &'static str) {
    let doc = ops::profile_doc(&[("block", "block", json!({}))]);
    let (mut c, u) = started(
        ProviderSpec::fixture().csi(csi),
        &doc,
        |_| {},
        |u| u.pool("block").is_some(),
    )
    .await;
    let pool = u.pool("block").unwrap().clone();
    let disk = c
        .finished_one(create_disk(
            &allocated(&pool, FRAMEWORK_ROLE),
            "BLOCK",
            None,
        ))
        .await;
    assert_eq!(source(&disk)["type"], "BLOCK", "{disk}");
    assert!(source(&disk)["mount"].is_null(), "{disk}");
    let disk = unallocated(&disk);
    let before = c.current_version().await;
    let message = c
        .ended(
            create(&[allocated(&persistent(&disk, "id1"), FRAMEWORK_ROLE)]),
            "OPERATION_FAILED",
        )
        .await;
    assert_eq!(
        message,
        "Cannot create persistent volume 'id1' on a BLOCK disk"
    );
    let resynced = c
        .update_where(|u| u.resource_version != before && !u.disks().is_empty())
        .await;
    assert_eq!(sorted(&resynced.resources), sorted_one(&disk));
    assert_eq!(c.agent_total().await, sorted_one(&disk));
    c.finished(destroy_disk(&allocated(&disk, FRAMEWORK_ROLE)))
        .await;
    assert!(c.plugin_volumes("test").is_empty());
    c.finish().await;
}
csi_versions!(create_persistent_block_volume);

/// DestroyUnpublishedPersistentVolume (§11.1 tests 17–19): the plugin answers
/// UNIMPLEMENTED to NodePublishVolume, so the publish for the task fails (the agent's
/// TASK_FAILED); after `interruption`, DESTROY and DESTROY_DISK nevertheless both finish
/// and the volume is deleted.
async fn destroy_unpublished(csi: &'static str, interruption: Interruption) {
    let (mut c, pool) = with_spare_pool(csi).await;
    c.set_faults(
        "test",
        &json!([{"rpc": "NodePublishVolume", "fail": "UNIMPLEMENTED"}]),
    );
    let (disk, volume) = persistent_volume(&c, &pool).await;
    let publish = c.publish(&[allocated(&volume, FRAMEWORK_ROLE)]).await;
    assert!(publish.is_err(), "the publish fails: {publish:?}");
    interruption.apply(&mut c, &pool).await;
    c.finished(destroy(&[allocated(&volume, FRAMEWORK_ROLE)]))
        .await;
    c.finished(destroy_disk(&allocated(&disk, FRAMEWORK_ROLE)))
        .await;
    assert!(
        c.plugin_volumes("test").is_empty(),
        "{:?}",
        c.plugin_volumes("test")
    );
    assert_eq!(c.agent_total().await, sorted_one(&pool));
    c.finish().await;
}

/// §11.1 test 17.
async fn destroy_unpublished_persistent_volume(csi: &'static str) {
    destroy_unpublished(csi, Interruption::None).await;
}
csi_versions!(destroy_unpublished_persistent_volume);

/// §11.1 test 18: with a daemon restart before the destroy.
async fn destroy_unpublished_persistent_volume_with_recovery(csi: &'static str) {
    destroy_unpublished(csi, Interruption::Restart).await;
}
csi_versions!(destroy_unpublished_persistent_volume_with_recovery);

/// §11.1 test 19: with a simulated reboot before the destroy (root: the reboot unmounts
/// the volume's staging).
async fn destroy_unpublished_persistent_volume_with_reboot(csi: &'static str) {
    if !slrp_test_support::require_root("destroy_unpublished_persistent_volume_with_reboot") {
        return;
    }
    destroy_unpublished(csi, Interruption::Reboot).await;
}
csi_versions!(destroy_unpublished_persistent_volume_with_reboot);

/// CreateDestroyPreprovisionedVolume (§11.1 test 21): a 1 GiB pool and two 2 GiB
/// pre-existing volumes: CREATE_DISK with `target_profile` `test` finishes (the volume is
/// validated and imported as a MOUNT disk of that profile), with `unknown` fails ("Profile
/// 'unknown' not found"); DESTROY_DISK of the imported MOUNT disk (its space joins the
/// `test` pool) and of the untouched RAW volume (it vanishes; the reconciliation that
/// follows reports the plugin's real pool) both finish and the plugin deletes both
/// volumes.
async fn create_destroy_preprovisioned_volume(csi: &'static str) {
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.pools = vec!["default=1GiB".into()];
    let (mut c, u) = started(
        spec,
        &profiles(&["test"]),
        |c| {
            c.import_volume("test", "a", 2 << 30);
            c.import_volume("test", "b", 2 << 30);
        },
        |u| u.pool("test").is_some() && u.disks().len() == 2,
    )
    .await;
    let pool = u.pool("test").unwrap().clone();
    assert_eq!(mb(&pool), 1024.0);
    let raw: Vec<Value> = u.disks().into_iter().cloned().collect();
    for d in &raw {
        assert_eq!(source(d)["type"], "RAW", "{d}");
        assert!(source(d)["profile"].is_null(), "{d}");
        assert_eq!(mb(d), 2048.0, "{d}");
    }
    let imported = c
        .finished_one(create_disk(
            &allocated(&raw[0], FRAMEWORK_ROLE),
            "MOUNT",
            Some("test"),
        ))
        .await;
    assert_mount_disk(&imported, &allocated(&raw[0], FRAMEWORK_ROLE), "test");
    assert_eq!(id(&imported), id(&raw[0]), "the same volume, imported");
    let message = c
        .ended(
            create_disk(
                &allocated(&raw[1], FRAMEWORK_ROLE),
                "MOUNT",
                Some("unknown"),
            ),
            "OPERATION_FAILED",
        )
        .await;
    assert_eq!(message, "Profile 'unknown' not found");
    // A profiled disk's space returns to its pool (spec §5.5 step 3) ...
    let back = c.finished_one(destroy_disk(&imported)).await;
    assert_eq!(source(&back)["profile"], "test", "{back}");
    assert!(source(&back)["id"].is_null(), "{back}");
    assert_eq!(
        c.agent_total().await,
        sorted(&[ops::portion(&pool, 1024.0 + 2048.0), raw[1].clone()])
    );
    // ... an unprofiled one's disappears and a reconciliation asks the plugin again: it
    // does not count imports in its pools, so the pool is 1 GiB again.
    let gone = c
        .finished(destroy_disk(&allocated(&raw[1], FRAMEWORK_ROLE)))
        .await;
    assert!(gone.is_empty(), "{gone:?}");
    assert!(
        c.plugin_volumes("test").is_empty(),
        "{:?}",
        c.plugin_volumes("test")
    );
    c.update_where(|u| u.disks().is_empty() && u.pool("test").is_some_and(|p| mb(p) == 1024.0))
        .await;
    assert_eq!(c.agent_total().await, sorted_one(&pool));
    c.finish().await;
}
csi_versions!(create_destroy_preprovisioned_volume);

/// ROOT_PublishUnpublishResourcesPluginKilled (§11.1 test 15): the plugin is SIGKILLed
/// before CREATE_DISK, before the task's publish and before DESTROY + DESTROY_DISK; each
/// time the supervisor relaunches it and the step succeeds.
async fn publish_unpublish_resources_plugin_killed(csi: &'static str) {
    if !slrp_test_support::require_root("publish_unpublish_resources_plugin_killed") {
        return;
    }
    let (c, pool) = with_pool(csi).await;
    let killed = c.kill_plugin("test").await;
    let pid = c.plugin_relaunched("test", killed).await;
    let (disk, volume) = persistent_volume(&c, &pool).await;
    let killed = c.kill_plugin("test").await;
    assert_eq!(killed, pid);
    let pid = c.plugin_relaunched("test", killed).await;
    task_writes(&c, &volume, "data").await;
    let killed = c.kill_plugin("test").await;
    assert_eq!(killed, pid);
    c.plugin_relaunched("test", killed).await;
    destroy_persistent_volume(&c, &disk, &volume, &pool).await;
    c.finish().await;
}
csi_versions!(publish_unpublish_resources_plugin_killed);

/// ProfileDisappeared (§11.1 test 9), with operations: a 2 GiB MOUNT disk from the 4 GiB
/// `test1` pool; the mapping switches to `test2` (a new resource version); a DESTROY_DISK
/// carrying the old version is DROPPED ("Mismatched resource version"); with the current
/// one it finishes with empty converted resources (the profile is gone), and the freed
/// space shows up: a 4 GiB `test2` pool.
async fn profile_disappeared(csi: &'static str) {
    let (c, u) = started(
        ProviderSpec::fixture().csi(csi),
        &profiles(&["test1"]),
        |_| {},
        |u| u.pool("test1").is_some(),
    )
    .await;
    let mut c = c;
    let pool = u.pool("test1").unwrap().clone();
    let disk = c
        .finished_one(create_disk(
            &allocated(&ops::portion(&pool, 2048.0), FRAMEWORK_ROLE),
            "MOUNT",
            None,
        ))
        .await;
    let old = c.current_version().await;
    c.set_profiles(&profiles(&["test2"]));
    let switched = c
        .update_where(|u| u.pool("test2").is_some() && u.pool("test1").is_none())
        .await;
    assert_eq!(mb(switched.pool("test2").unwrap()), 2048.0);
    let mut stale = ApplyRequest::new(destroy_disk(&disk));
    stale.resource_version = Some(slrp_proto::mesos::v1::Uuid { value: old.clone() });
    let uuid = c.apply_request(stale).await;
    let s = c.terminal(uuid).await.latest_status;
    assert_eq!(
        ops::state_name(&s),
        "OPERATION_DROPPED",
        "{}",
        ops::status_json(&s)
    );
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.starts_with("Mismatched resource version")),
        "{:?}",
        s.message
    );
    let converted = c.finished(destroy_disk(&disk)).await;
    assert!(converted.is_empty(), "{converted:?}");
    let freed = c
        .update_where(|u| u.pool("test2").is_some_and(|p| mb(p) == 4096.0))
        .await;
    assert!(freed.disks().is_empty(), "{:?}", freed.resources);
    assert!(c.plugin_volumes("test").is_empty());
    c.finish().await;
}
csi_versions!(profile_disappeared);

/// ROOT_AgentRegisteredWithNewId (§11.1 test 11), with operations: 2 GiB and 3 GiB MOUNT
/// disks of profile `good` (whose parameters the plugin created them with) get persistent
/// volumes and files; the agent comes back under a new agent ID; both volumes reappear as
/// pre-existing RAW volumes of a new provider id; CREATE_DISK with `target_profile` `good`
/// finishes and with `bad` (other parameters) fails; the imported disk holds the file a
/// task reads; DESTROY_DISK of the other deletes it.
async fn agent_registered_with_new_id(csi: &'static str) {
    if !slrp_test_support::require_root("agent_registered_with_new_id") {
        return;
    }
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.pools = vec!["default=8GiB".into()];
    let doc = ops::profile_doc(&[
        ("good", "mount", json!({"backend": "dir"})),
        ("bad", "mount", json!({"backend": "loop"})),
    ]);
    let (mut c, u) = started(spec, &doc, |_| {}, |u| u.pool("good").is_some()).await;
    let old_id = u.provider_id.clone();
    let pool = u.pool("good").unwrap().clone();
    let mut volumes = Vec::new();
    for (size, pid) in [(2048.0, "id2"), (3072.0, "id3")] {
        let disk = c
            .finished_one(create_disk(
                &allocated(&ops::portion(&pool, size), FRAMEWORK_ROLE),
                "MOUNT",
                None,
            ))
            .await;
        let volume = persistent(&unallocated(&disk), pid);
        c.finished(create(&[allocated(&volume, FRAMEWORK_ROLE)]))
            .await;
        task_writes(&c, &volume, pid).await;
        volumes.push(volume);
    }
    c.stop_daemon_cleanly().await;
    c.restart_manager_with_agent_id("new-agent-S1").await;
    c.start_daemon();
    let info = c.next_subscribed().await;
    let new_id = info["id"]["value"].as_str().unwrap().to_owned();
    assert_ne!(new_id, old_id, "a new agent id is a new provider");
    // The CREATE_DISKs need the profiles: wait until the new identity's profile watch
    // brought its pools.
    let u = c
        .update_where(|u| u.disks().len() == 2 && u.pool("good").is_some())
        .await;
    let mut raw: Vec<Value> = u.disks().into_iter().cloned().collect();
    raw.sort_by(|a, b| mb(a).total_cmp(&mb(b)));
    for (r, v) in raw.iter().zip(&volumes) {
        assert_eq!(source(r)["type"], "RAW", "{r}");
        assert!(source(r)["profile"].is_null(), "{r}");
        assert_eq!(r["provider_id"]["value"], new_id.as_str(), "{r}");
        assert_eq!(id(r), id(v));
    }
    let imported = c
        .finished_one(create_disk(
            &allocated(&raw[0], FRAMEWORK_ROLE),
            "MOUNT",
            Some("good"),
        ))
        .await;
    c.ended(
        create_disk(&allocated(&raw[1], FRAMEWORK_ROLE), "MOUNT", Some("bad")),
        "OPERATION_FAILED",
    )
    .await;
    let imported = unallocated(&imported);
    assert_eq!(task_reads(&c, &imported).await, "id2");
    c.finished(destroy_disk(&allocated(&raw[1], FRAMEWORK_ROLE)))
        .await;
    assert!(!c.plugin_volumes("test").contains(&id(&raw[1])));
    assert!(c.plugin_volumes("test").contains(&id(&raw[0])));
    c.finish().await;
}
csi_versions!(agent_registered_with_new_id);

/// No Mesos counterpart (Mesos never unpublishes, spec §12 item 25): the operator
/// unpublishes a volume no task uses through the admin API (`POST /volumes/unpublish`);
/// its target is no longer mounted, but the data is kept: a later task's publish mounts
/// it again with the file. An unpublished volume is not republished by the recovery
/// after a reboot (only when a task needs it), and it can still be destroyed.
async fn unpublish_through_the_admin_api_keeps_the_data(csi: &'static str) {
    if !slrp_test_support::require_root("unpublish_through_the_admin_api_keeps_the_data") {
        return;
    }
    let (mut c, pool) = with_spare_pool(csi).await;
    let (disk, volume) = persistent_volume(&c, &pool).await;
    task_writes(&c, &volume, "data").await;
    let target = c.volume_path(&volume);
    let request = json!({"volume_id": id(&volume)});
    let (status, body) = c.admin_post("/volumes/unpublish", &request).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !support::mounts_under(c.dir.path()).contains(&target),
        "{} is no longer mounted",
        target.display()
    );
    assert!(
        !target.join("file").exists(),
        "the data is not visible unpublished"
    );
    assert_eq!(
        task_reads(&c, &volume).await,
        "data",
        "republished with its data"
    );

    let (status, body) = c.admin_post("/volumes/unpublish", &request).await;
    assert_eq!(status, 200, "{body}");
    c.simulate_reboot().await;
    c.start_daemon();
    recovered(&mut c, &pool).await;
    assert!(
        !support::mounts_under(c.dir.path()).contains(&target),
        "the recovery does not republish an unpublished volume"
    );
    assert_eq!(task_reads(&c, &volume).await, "data");
    destroy_persistent_volume(&c, &disk, &volume, &pool).await;
    c.finish().await;
}
csi_versions!(unpublish_through_the_admin_api_keeps_the_data);

/// RecoverDiskWithChangedMetadata (§11.1 test 7) with a created disk (the part the RAW
/// replay in `run_provider.rs` cannot tell apart, MESOS-9395): a MOUNT disk made by
/// CREATE_DISK carries the plugin's volume context as metadata; after a restart the
/// plugin lists the volume with `label=bar`: exactly one disk, still MOUNT of profile
/// `test` with its mount root, its metadata now `label=bar`.
async fn recover_created_disk_with_changed_metadata(csi: &'static str) {
    let (mut c, pool) = with_spare_pool(csi).await;
    let from = allocated(&ops::portion(&pool, DISK_MB), FRAMEWORK_ROLE);
    let disk = unallocated(&c.finished_one(create_disk(&from, "MOUNT", None)).await);
    assert_eq!(
        support::metadata(&disk).get("backend").map(String::as_str),
        Some("dir"),
        "{disk}"
    );
    c.stop_daemon_cleanly().await;
    c.set_faults(
        "test",
        &json!([{"rpc": "ListVolumes", "volume_context": {"label": "bar"}, "volume_id": id(&disk)}]),
    );
    c.start_daemon();
    let u = recovered(&mut c, &pool).await;
    let [d] = &u.disks()[..] else {
        panic!("exactly one disk: {:?}", u.resources)
    };
    assert_eq!(id(d), id(&disk));
    assert_eq!(source(d)["type"], "MOUNT", "{d}");
    assert_eq!(source(d)["profile"], "test", "{d}");
    assert_eq!(source(d)["mount"]["root"], MOUNT_ROOT, "{d}");
    assert_eq!(
        support::metadata(d),
        [("label".to_owned(), "bar".to_owned())].into(),
        "{d}"
    );
    c.finish().await;
}
csi_versions!(recover_created_disk_with_changed_metadata);

/// Spec §12.6 (Mesos drops them: "Cannot apply operation when reconciling storage
/// pools"): with periodic reconciliations running nearly all the time (every 100 ms, each
/// held 300 ms by a slow ListVolumes), CREATE_DISKs and DESTROY_DISKs wait for the running
/// reconciliation and all finish; none is dropped.
async fn disk_operations_during_a_reconciliation_are_deferred(csi: &'static str) {
    let mut spec = ProviderSpec::fixture().csi(csi);
    spec.reconciliation_interval_seconds = 0.1;
    let (c, u) = started(
        spec,
        &profiles(&["test"]),
        |_| {},
        |u| u.pool("test").is_some(),
    )
    .await;
    let pool = u.pool("test").unwrap().clone();
    c.set_faults(
        "test",
        &json!([{"rpc": "ListVolumes", "delay_ms": 300, "times": 1_000_000}]),
    );
    // Reconciliations are running now (the slow listing has been asked for).
    c.within("a slowed reconciliation", async {
        while c.calls("test", "ListVolumes") == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut disks = Vec::new();
    for _ in 0..4 {
        let from = allocated(&ops::portion(&pool, 512.0), FRAMEWORK_ROLE);
        disks.push(c.finished_one(create_disk(&from, "MOUNT", None)).await);
    }
    for d in &disks {
        c.finished(destroy_disk(d)).await;
    }
    assert!(
        c.daemon_log().contains("deferred=true"),
        "at least one operation waited for a reconciliation"
    );
    assert!(c.plugin_volumes("test").is_empty());
    c.finish().await;
}
csi_versions!(disk_operations_during_a_reconciliation_are_deferred);

/// `GET path` on the daemon's admin socket: a 200 with a JSON body.
async fn admin_json(c: &Cluster, path: &str) -> Value {
    let (status, body) = c.admin_get(path).await.unwrap();
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// No Mesos counterpart: the admin API's read routes (docs/admin-api.md) against the
/// running daemon, as its providers' status, volume manager, store, supervisor and
/// profile adaptor know them, and the volume manager's metrics.
async fn admin_reads_the_running_daemon(csi: &'static str) {
    let (c, pool) = with_pool(csi).await;
    let disk = create_reserved_disk(&c, &pool).await;
    let vol = id(&disk);

    let status = admin_json(&c, "/status").await;
    assert_eq!(
        (&status["mode"], &status["ready"]),
        (&json!("run"), &json!(true)),
        "{status}"
    );
    assert!(status["agent_id"].is_string(), "{status}");
    let p = &status["providers"][0];
    assert_eq!(
        (&p["state"], &p["volumes"]),
        (&json!("READY"), &json!(1)),
        "{status}"
    );
    assert!(p["resource_provider_id"].is_string(), "{status}");

    // The status carries the total within 50 ms of an operation's end: poll for it, as
    // `GET /resources` documents.
    c.within("the disk in GET /resources", async {
        loop {
            let resources = admin_json(&c, "/resources").await;
            if resources
                .as_array()
                .unwrap()
                .iter()
                .any(|r| source(r)["id"] == json!(vol))
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;

    let volumes = admin_json(&c, "/volumes").await;
    assert_eq!(volumes.as_array().unwrap().len(), 1, "{volumes}");
    let v = &volumes[0];
    assert_eq!(v["volume_id"], json!(vol), "{volumes}");
    assert_eq!(
        (&v["profile"], &v["type"]),
        (&json!("test"), &json!("mount")),
        "{volumes}"
    );
    assert_eq!(v["capacity_bytes"], json!(4096u64 << 20), "{volumes}");
    let state = v["state"].as_str().unwrap().to_owned();
    assert_eq!(admin_json(&c, &format!("/volumes/{vol}")).await, *v);

    let plugins = admin_json(&c, "/plugins").await;
    let plugin = &plugins[0];
    assert_eq!(
        (&plugin["healthy"], &plugin["csi_version"]),
        (&json!(true), &json!(csi)),
        "{plugins}"
    );
    assert!(plugin["container"].is_string(), "{plugins}");

    let profiles = admin_json(&c, "/profiles").await;
    assert_eq!(profiles[0]["name"], "test", "{profiles}");
    assert!(admin_json(&c, "/operations").await.is_array());

    let (_, metrics) = c.admin_get("/metrics").await.unwrap();
    let has = |family: &str, labels: &[&str], value: &str| {
        metrics.lines().any(|l| {
            l.starts_with(&format!("{family}{{"))
                && labels.iter().all(|want| l.contains(want))
                && l.ends_with(&format!(" {value}"))
        })
    };
    assert!(
        has("volumes", &[&format!("state=\"{state}\"")], "1"),
        "{metrics}"
    );
    assert!(
        has(
            "volume_call_duration_seconds_count",
            &["call=\"create\"", "outcome=\"ok\""],
            "1"
        ),
        "{metrics}"
    );
    c.finish().await;
}
csi_versions!(admin_reads_the_running_daemon);
