//! The volume manager against the real `slrp-csi-local` plugin: real mounts, kill -9 of
//! the plugin and of the manager mid-operation, a simulated reboot, data that survives.
//!
//! Needs root (mounts); without it each test prints why and returns. The plugin binary is
//! found next to this test's target directory, or built with cargo (as in
//! `crates/slrp-csi/tests`). Real time: a separate process cannot follow paused time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use slrp_core::volume::manager::failpoints as vfp;
use slrp_core::volume::*;
use slrp_csi::{ClientConfig, CsiClient, CsiEndpoint, CsiMetrics, VolumeCapability};
use slrp_store::Store;
use tokio_util::sync::CancellationToken;

macro_rules! require_root {
    () => {
        if !slrp_test_support::require_root(&slrp_test_support::current_test()) {
            return;
        }
    };
}

/// Everything a test owns; unmounts whatever is left under its directory on drop, so a
/// failing test leaks no mount.
struct Env {
    dir: tempfile::TempDir,
    plugin: Option<tokio::process::Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.plugin.take() {
            let _ = c.start_kill();
        }
        let root = self.dir.path().to_owned();
        let mut mounts = ProcMountTable.mounts_under(&root).unwrap_or_default();
        // Deepest first.
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        // Detach loop devices the plugin attached for this test's images.
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "losetup -j {}/root/volumes/loop 2>/dev/null | cut -d: -f1 | xargs -r losetup -d",
                root.display()
            ))
            .status();
    }
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            plugin: None,
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    fn faults(&self) -> PathBuf {
        self.dir.path().join("faults.json")
    }

    fn set_faults(&self, json: &str) {
        let tmp = self.faults().with_extension("tmp");
        std::fs::write(&tmp, json).unwrap();
        std::fs::rename(&tmp, self.faults()).unwrap();
    }

    async fn start_plugin(&mut self) {
        if !self.faults().exists() {
            self.set_faults("[]");
        }
        // A socket left by a killed plugin would look ready before the new one listens.
        let _ = std::fs::remove_file(self.socket());
        let child = tokio::process::Command::new(slrp_test_support::csi_local_bin())
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("--root")
            .arg(self.dir.path().join("root"))
            .args(["--node-id", "test-node"])
            .arg("--faults-file")
            .arg(self.faults())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.plugin = Some(child);
        slrp_test_support::wait_until_listening(&self.socket()).await;
    }

    /// kill -9 the plugin and reap it.
    async fn kill_plugin(&mut self) {
        let mut c = self.plugin.take().unwrap();
        c.start_kill().unwrap();
        c.wait().await.unwrap();
    }

    fn client(&self) -> CsiClient {
        CsiClient::new(
            CsiEndpoint::from_path(self.socket()).unwrap(),
            ClientConfig::default().rpc_timeout(Duration::from_secs(30)),
            CsiMetrics::default(),
        )
        .unwrap()
    }

    fn paths(&self) -> MountPaths {
        MountPaths::under_work_dir(&self.dir.path().join("work"), "org.slrp.csi", "local").unwrap()
    }

    async fn manager(&self, boot: BootId) -> Manager {
        let client = self.client();
        let caps = client.capabilities().await.unwrap();
        let node = client.node_info().await.unwrap();
        let target = TargetPath::for_plugin(client.version().await.unwrap(), false);
        let cfg = VolumeManagerConfig::new(self.paths(), node.node_id, caps, boot, target);
        let store = Store::open(self.dir.path().join("state")).unwrap();
        let (handle, guard) =
            VolumeManager::spawn(cfg, store, Arc::new(client), &CancellationToken::new()).unwrap();
        Manager { handle, guard }
    }
}

struct Manager {
    handle: VolumeManagerHandle,
    guard: VolumeManagerGuard,
}

impl Manager {
    async fn stop(self) {
        self.guard.stop().await.unwrap();
    }
}

fn boot() -> BootId {
    read_boot_id().unwrap()
}

fn req(name: &str) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        required_bytes: 16 << 20,
        limit_bytes: 0,
        capability: VolumeCapability::mount_default(),
        parameters: StringMap::new(),
        content_source: None,
    }
}

fn is_mounted(p: &Path) -> bool {
    ProcMountTable
        .mounts_under(p)
        .unwrap()
        .iter()
        .any(|m| m == p)
}

#[tokio::test]
async fn lifecycle_with_kill_9_of_plugin_and_manager() {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    let v = m.handle.create(req("op-1")).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    assert!(is_mounted(&target));
    assert!(is_mounted(&env.paths().staging(&v.id).unwrap()));
    std::fs::write(target.join("data"), b"survives").unwrap();

    // kill -9 of the plugin: mounts stay, a restarted plugin answers repeats with OK.
    env.kill_plugin().await;
    env.start_plugin().await;
    assert_eq!(m.handle.publish(&v.id).await.unwrap(), target);

    // The manager dies right after NodeUnpublishVolume took effect, before it recorded it.
    fail::cfg(vfp::AFTER_CALL, "1*return->off").unwrap();
    assert!(m.handle.unpublish(&v.id).await.is_err());
    fail::remove(vfp::AFTER_CALL);
    assert!(m.guard.join().await.is_err());
    assert!(!is_mounted(&target));

    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    let rec = &m.handle.volumes().await.unwrap()[0];
    assert!(rec.state.in_flight_call().is_none());
    m.handle.unpublish(&v.id).await.unwrap();
    let target = m.handle.publish(&v.id).await.unwrap();
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"survives");

    assert!(m.handle.delete(&v.id).await.unwrap());
    assert!(m.handle.list_all(0).await.unwrap().is_empty());
    assert!(
        ProcMountTable
            .mounts_under(env.dir.path())
            .unwrap()
            .is_empty()
    );
    assert!(!env.paths().volume_dir(&v.id).unwrap().exists());
    m.stop().await;
}

#[tokio::test]
async fn plugin_killed_mid_stage_is_re_driven() {
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    let v = m.handle.create(req("op-1")).await.unwrap();
    // The plugin exits (as if kill -9) when NodeStageVolume arrives.
    env.set_faults(r#"[{"rpc": "NodeStageVolume", "exit": true, "times": 1}]"#);
    let e = m.handle.publish(&v.id).await.unwrap_err();
    assert!(matches!(e, VolumeError::Csi { .. }), "{e}");
    let _ = env.plugin.take().unwrap().wait().await;
    assert_eq!(
        m.handle.volumes().await.unwrap()[0].state.name(),
        StateName::NodeStage
    );
    env.start_plugin().await;
    let target = m.handle.publish(&v.id).await.unwrap();
    std::fs::write(target.join("f"), b"1").unwrap();
    assert!(is_mounted(&target));
    m.handle.delete(&v.id).await.unwrap();
    assert!(
        ProcMountTable
            .mounts_under(env.dir.path())
            .unwrap()
            .is_empty()
    );
    m.stop().await;
}

#[tokio::test]
async fn a_created_volume_is_tracked_even_if_the_manager_dies_before_recording_it() {
    // Tears the fail points down even if this test panics (none leaks into the next).
    let _scenario = fail::FailScenario::setup();
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    fail::cfg(vfp::AFTER_CALL, "1*return->off").unwrap();
    assert!(m.handle.create(req("op-1")).await.is_err());
    fail::remove(vfp::AFTER_CALL);
    assert!(m.guard.join().await.is_err());
    let m = env.manager(boot()).await;
    let r = m.handle.ready().await.unwrap();
    assert_eq!(r.intents, 1);
    let listed = m.handle.list_all(0).await.unwrap();
    let tracked = m.handle.volumes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(tracked.len(), 1);
    assert_eq!(listed[0].volume_id, tracked[0].id);
    // The caller's replay gets the same volume.
    let again = m.handle.create(req("op-1")).await.unwrap();
    assert_eq!(again.id, tracked[0].id);
    assert_eq!(m.handle.list_all(0).await.unwrap().len(), 1);
    m.stop().await;
}

#[tokio::test]
async fn reboot_republishes_published_volumes_and_resets_staged_ones() {
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(BootId::new("boot-before")).await;
    m.handle.ready().await.unwrap();
    let a = m.handle.create(req("published")).await.unwrap().id;
    let target_a = m.handle.publish(&a).await.unwrap();
    std::fs::write(target_a.join("data"), b"kept").unwrap();
    // b gets staged, but its NodePublishVolume fails: only staged.
    let b = m.handle.create(req("staged")).await.unwrap().id;
    env.set_faults(r#"[{"rpc": "NodePublishVolume", "fail": "INTERNAL", "times": 1}]"#);
    assert!(m.handle.publish(&b).await.is_err());
    let staging_b = env.paths().staging(&b).unwrap();
    assert!(is_mounted(&staging_b));
    m.stop().await;
    env.kill_plugin().await;

    // "Reboot": every mount under the test dir goes, the boot id changes.
    let mut mounts = ProcMountTable.mounts_under(env.dir.path()).unwrap();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    assert!(mounts.len() >= 3);
    for p in mounts {
        nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    env.start_plugin().await;
    let m = env.manager(BootId::new("boot-after")).await;
    let r = m.handle.ready().await.unwrap();
    assert_eq!(r.rebooted, 2, "{r:?}");
    assert!(is_mounted(&target_a), "republished before ready");
    assert_eq!(std::fs::read(target_a.join("data")).unwrap(), b"kept");
    let recs = m.handle.volumes().await.unwrap();
    let state = |id: &VolumeId| recs.iter().find(|r| &r.id == id).unwrap().state.clone();
    assert_eq!(state(&a).name(), StateName::Published);
    assert_eq!(state(&a).boot_id(), Some(&BootId::new("boot-after")));
    assert_eq!(state(&b).name(), StateName::NodeReady);
    assert!(!is_mounted(&staging_b));
    for id in [a, b] {
        m.handle.delete(&id).await.unwrap();
    }
    assert!(m.handle.list_all(0).await.unwrap().is_empty());
    m.stop().await;
}

/// A volume of a reader-only profile: Mesos never sets `readonly` for the volumes its
/// provider creates (`VolumeState.readonly` stays false), so the provider can still lay
/// out persistent volumes on it and clean it before deletion.
fn reader_only(name: &str) -> CreateVolume {
    let mut r = req(name);
    r.capability.access_mode = AccessMode::SingleNodeReaderOnly;
    r
}

#[tokio::test]
async fn a_reader_only_volume_is_published_writable_as_mesos_does() {
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    let v = m.handle.create(reader_only("ro-profile")).await.unwrap();
    let rec = &m.handle.volumes().await.unwrap()[0];
    assert!(!rec.spec.readonly);
    let target = m.handle.publish(&v.id).await.unwrap();
    // What creating a persistent volume on the disk does.
    std::fs::create_dir(target.join("persistent")).unwrap();
    std::fs::write(target.join("persistent/data"), b"x").unwrap();
    assert!(m.handle.delete(&v.id).await.unwrap());
    m.stop().await;
}

/// Publishes `v`, lets a "user" write `secret` through `write`, unpublishes it, then
/// deletes it with DeleteVolume refused once: the cleanup ran before the refused call, so
/// publishing it again shows what the next user would see.
async fn cleaned_before_delete(
    env: &Env,
    m: &Manager,
    v: &VolumeId,
    write: impl Fn(&Path),
    read: impl Fn(&Path),
) {
    let target = m.handle.publish(v).await.unwrap();
    write(&target);
    m.handle.unpublish(v).await.unwrap();
    env.set_faults(r#"[{"rpc": "DeleteVolume", "fail": "INTERNAL", "times": 1}]"#);
    assert!(m.handle.delete(v).await.is_err());
    let rec = m.handle.volumes().await.unwrap().remove(0);
    assert!(!rec.deleting && !rec.needs_cleanup, "{rec:?}");
    let target = m.handle.publish(v).await.unwrap();
    read(&target);
    assert!(m.handle.delete(v).await.unwrap());
}

#[tokio::test]
async fn data_written_by_one_user_is_gone_before_the_volume_is_deleted() {
    require_root!();
    let mut env = Env::new();
    env.start_plugin().await;
    let m = env.manager(boot()).await;
    m.handle.ready().await.unwrap();
    let v = m.handle.create(reader_only("mount")).await.unwrap().id;
    let outside = env.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"not the volume's").unwrap();
    cleaned_before_delete(
        &env,
        &m,
        &v,
        |t| {
            std::fs::create_dir(t.join("persistent")).unwrap();
            std::fs::write(t.join("persistent/data"), b"secret").unwrap();
            // A link out of the volume is removed, not followed.
            std::os::unix::fs::symlink(&outside, t.join("link")).unwrap();
        },
        |t| assert_eq!(std::fs::read_dir(t).unwrap().count(), 0, "not emptied"),
    )
    .await;
    assert!(outside.join("keep").exists());

    let mut block = req("block");
    block.capability = VolumeCapability::block();
    block.required_bytes = 4 << 20;
    let b = m.handle.create(block).await.unwrap().id;
    cleaned_before_delete(
        &env,
        &m,
        &b,
        |t| {
            use std::io::Write as _;
            let mut dev = std::fs::OpenOptions::new().write(true).open(t).unwrap();
            dev.write_all(&[0xAB; 4096]).unwrap();
            dev.sync_all().unwrap();
        },
        |t| {
            let bytes = std::fs::read(t).unwrap();
            assert_eq!(bytes.len(), 4 << 20);
            assert!(bytes.iter().all(|&b| b == 0), "not zeroed");
        },
    )
    .await;
    m.stop().await;
}
