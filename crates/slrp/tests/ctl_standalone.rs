//! `slrp ctl`'s actions against a real `slrp standalone` with its defaults (profiles
//! `mount` on pool `dir`, `block` and `ext4` on pool `loop`): the tables, `--json`,
//! `--wait` without a spinner when piped and with one on a terminal, `--type` taken from
//! the profile, the path on publish's last line (a mounted directory, or a block device
//! that goes on unpublish), and the exit codes of the daemon's refusals. One daemon per
//! test, so that a failure in one story does not hide the others.
//!
//! Disks are [`DISK`] (64 MiB): the default pools are a quarter of the free space under
//! the state directory, so a small CI disk still has room; [`Daemon::start`] fails with
//! what it found when it has not.
//!
//! The bundled plugin must be found beside the `slrp` binary (`csi_local_bin()` builds it
//! if missing). Root is needed (standalone refuses to run without it).

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use support::{WAIT, mounts_under, processes_mentioning, unmount_under};

/// The size of the disks the tests create, and its MB (2^20 bytes).
const DISK: &str = "64MiB";
const DISK_MB: f64 = 64.0;

/// `slrp standalone` on a temporary state directory; on drop it and its plugins are
/// killed and their mounts removed.
struct Daemon {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Daemon {
    /// Starts the daemon and waits until `slrp ctl --json status` says it is ready.
    async fn start() -> Self {
        Self::start_with(None).await
    }

    /// [`Self::start`], with `profiles` as the profile document instead of the default
    /// one (standalone writes its default only where there is none).
    async fn start_with(profiles: Option<Value>) -> Self {
        slrp_test_support::csi_local_bin();
        let dir = tempfile::tempdir().unwrap();
        if let Some(profiles) = profiles {
            let config = dir.path().join("state").join("config");
            std::fs::create_dir_all(&config).unwrap();
            std::fs::write(config.join("profiles.json"), profiles.to_string()).unwrap();
        }
        let child = Self::spawn(dir.path());
        let mut daemon = Self { dir, child };
        daemon.until_ready().await;
        daemon
    }

    /// `slrp standalone` on `dir`'s state directory, logging to `dir/slrp.log` (appended:
    /// a restarted daemon's log follows the one before).
    fn spawn(dir: &std::path::Path) -> std::process::Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("slrp.log"))
            .unwrap();
        Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("standalone")
            .arg("--state-dir")
            .arg(dir.join("state"))
            .env("SLRP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// SIGKILL, then a new daemon on the same state directory (its plugin, left running,
    /// is killed too: a crash of the node's slrp takes nothing else down, but the test
    /// wants the plugin's own recovery as well).
    async fn kill_and_restart(&mut self) {
        let _ = kill(
            Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            Signal::SIGKILL,
        );
        let _ = self.child.wait();
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        self.child = Self::spawn(self.dir.path());
        self.until_ready().await;
    }

    async fn until_ready(&mut self) {
        let daemon = self;
        let deadline = Instant::now() + WAIT;
        loop {
            let out = daemon.ctl(&["--json", "status"]).await;
            if out.status.success() {
                let status: Value = serde_json::from_slice(&out.stdout).unwrap();
                if status["ready"] == true {
                    daemon.check_room().await;
                    return;
                }
            }
            if let Some(exit) = daemon.child.try_wait().unwrap() {
                daemon.fail(&format!("slrp standalone exited ({exit}) before READY"));
            }
            if Instant::now() > deadline {
                daemon.fail("not READY in time");
            }
            // Polling a separate process's readiness, bounded by the deadline above.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The plugin's snapshots: the records under its root (one JSON file per snapshot).
    fn plugin_snapshots(&self) -> BTreeSet<String> {
        let meta = self.dir.path().join("state/csi-local/snapshots/meta");
        std::fs::read_dir(&meta)
            .map(|d| {
                d.filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".json").map(str::to_owned)
                })
                .collect()
            })
            .unwrap_or_default()
    }

    /// Fails, saying why, unless each pool has room for the disks a test creates (three).
    async fn check_room(&self) {
        // The pools follow READY: the profile watch starts at the first READY (spec §3.6).
        let resources = self
            .resources_until("the mount and block pools", |r| {
                free_mb(r, "mount") > 0.0 && free_mb(r, "block") > 0.0
            })
            .await;
        for profile in ["mount", "block"] {
            let free = free_mb(&resources, profile);
            assert!(
                free >= 3.0 * DISK_MB,
                "profile {profile}'s pool has {free} MB free, less than three {DISK} disks: \
                 the default pools are a quarter of the free space under {}",
                self.dir.path().display()
            );
        }
    }

    fn admin(&self) -> PathBuf {
        self.dir.path().join("state").join("admin.sock")
    }

    fn fail(&self, what: &str) -> ! {
        let log = std::fs::read_to_string(self.dir.path().join("slrp.log")).unwrap_or_default();
        panic!("{what}\n---- slrp log ----\n{log}---- end ----")
    }

    /// `slrp ctl --admin <socket> ARGS`, output piped (not a terminal).
    async fn ctl(&self, args: &[&str]) -> Output {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("ctl")
            .arg("--admin")
            .arg(self.admin())
            .args(args)
            .env_remove("SLRP_ADMIN")
            .env_remove("SLRP_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .unwrap()
    }

    /// `slrp ctl ARGS` that must exit `code`; its stdout and stderr.
    async fn ctl_exit(&self, args: &[&str], code: i32) -> (String, String) {
        let out = self.ctl(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.code() != Some(code) {
            self.fail(&format!(
                "slrp ctl {args:?}: {} instead of exit {code}\nstdout: {stdout}\nstderr: {stderr}",
                out.status
            ));
        }
        (stdout, stderr)
    }

    /// `slrp ctl ARGS` that must succeed and write nothing on stderr.
    async fn ctl_ok(&self, args: &[&str]) -> String {
        let (stdout, stderr) = self.ctl_exit(args, 0).await;
        assert_eq!(stderr, "", "slrp ctl {args:?} wrote on stderr");
        stdout
    }

    async fn ctl_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ctl_ok(&all).await).unwrap()
    }

    /// `slrp ctl --json resources` once `want` holds: the providers' totals follow a
    /// finished operation shortly after the operation's answer.
    async fn resources_until(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let resources = self.ctl_json(&["resources"]).await;
            if want(&resources) {
                return resources;
            }
            if Instant::now() > deadline {
                self.fail(&format!("resources never showed {what}: {resources}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = kill(
            Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            Signal::SIGKILL,
        );
        let _ = self.child.wait();
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        unmount_under(self.dir.path());
    }
}

/// The `resources` row of CSI pool `pool`, split into cells: POOL PROFILES USED FREE
/// TOTAL DISKS USAGE.
fn pool_row(resources: &str, pool: &str) -> Vec<String> {
    resources
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(pool))
        .unwrap_or_else(|| panic!("no row for {pool}:\n{resources}"))
}

/// Free MB of `profile`'s pool in `/resources` (the RAW resource with no id).
fn free_mb(resources: &Value, profile: &str) -> f64 {
    resources
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["disk"]["source"]["profile"] == profile && r["disk"]["source"]["id"].is_null()
        })
        .map(|r| r["scalar"]["value"].as_f64().unwrap())
        .sum()
}

fn has_disk(resources: &Value, id: &str) -> bool {
    resources
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["disk"]["source"]["id"] == id)
}

/// The id in `created disk ID (profile P)`.
fn created_id(out: &str, profile: &str) -> String {
    out.strip_prefix("created disk ")
        .and_then(|s| s.strip_suffix(&format!(" (profile {profile})\n")))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned()
}

#[tokio::test]
async fn root_ctl_shows_status_profiles_and_pools() {
    if !slrp_test_support::require_root("root_ctl_shows_status_profiles_and_pools") {
        return;
    }
    let d = Daemon::start().await;
    let status = d.ctl_ok(&["status"]).await;
    assert!(status.starts_with("mode:     standalone\n"), "{status}");
    assert!(
        status.contains("org.apache.mesos.rp.local.storage.local  READY  yes"),
        "{status}"
    );
    let profiles = d.ctl_ok(&["profiles"]).await;
    for row in ["block    block", "ext4     mount  ext4", "mount    mount"] {
        assert!(profiles.contains(row), "{row} in\n{profiles}");
    }
    // One row per CSI pool: `block` and `ext4` share `loop`, whose free space shows once.
    let table = d.ctl_ok(&["resources"]).await;
    let dir = pool_row(&table, "dir");
    assert_eq!(dir[1], "mount", "{table}");
    assert_eq!(dir[2], "0B", "nothing used yet: {table}");
    assert_eq!(dir[3], dir[4], "free is the total: {table}");
    assert_eq!(dir[5], "0", "{table}");
    assert_eq!(dir[6], format!("[{}]", ".".repeat(20)), "{table}");
    let loop_row = pool_row(&table, "loop");
    assert_eq!(loop_row[1], "block,ext4", "{table}");
    assert_eq!(
        table.lines().filter(|l| l.contains("block")).count(),
        1,
        "no separate row for a profile of a shared pool: {table}"
    );
}

/// A MOUNT disk's whole life through `slrp ctl`: create (waited for, piped: no spinner),
/// the pool's row, publish (the last line is mounted), the volume and operation details,
/// unpublish, destroy (the pool whole again).
#[tokio::test]
async fn root_ctl_mount_disk_create_publish_destroy() {
    if !slrp_test_support::require_root("root_ctl_mount_disk_create_publish_destroy") {
        return;
    }
    let d = Daemon::start().await;
    let before = d.ctl_json(&["resources"]).await;
    let op = d
        .ctl_json(&[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            DISK,
            "--wait",
        ])
        .await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op}");
    assert_eq!(op["type"], "CREATE_DISK", "{op}");
    let id = op["volume_id"].as_str().unwrap().to_owned();
    let after = d.resources_until("the disk", |r| has_disk(r, &id)).await;
    let table = d.ctl_ok(&["resources"]).await;
    let row = pool_row(&table, "dir");
    assert_eq!(row[2], DISK, "{table}");
    assert_eq!(row[5], "1", "{table}");
    assert!(row[6].contains('#'), "{table}");
    assert!(
        (free_mb(&before, "mount") - free_mb(&after, "mount") - DISK_MB).abs() < 0.5,
        "the pool shrank by the disk: {before} → {after}"
    );
    assert!(
        table.contains(&format!("{id}  MOUNT  mount    {DISK}")),
        "{table}"
    );

    let out = d.ctl_ok(&["publish", &id]).await;
    let path = PathBuf::from(out.lines().last().unwrap());
    assert!(
        out.starts_with(&format!("published {id} (PUBLISHED)\n")),
        "{out}"
    );
    assert!(
        mounts_under(d.dir.path()).contains(&path),
        "{} mounted",
        path.display()
    );
    let volumes = d.ctl_ok(&["volumes"]).await;
    assert!(
        volumes.contains(&format!("{id}  PUBLISHED  mount  {DISK}")),
        "{volumes}"
    );
    assert!(volumes.contains(&path.display().to_string()), "{volumes}");
    let one = d.ctl_ok(&["volumes", &id]).await;
    assert!(one.starts_with(&format!("volume:       {id}\n")), "{one}");
    assert!(one.contains("state:        PUBLISHED\n"), "{one}");
    assert!(
        one.contains(&format!("target path:  {}\n", path.display())),
        "{one}"
    );
    let one = d.ctl_json(&["volumes", &id]).await;
    assert_eq!(one["volume_id"], id.as_str(), "{one}");
    let uuid = op["operation_uuid"].as_str().unwrap();
    let detail = d.ctl_ok(&["operations", uuid]).await;
    assert!(
        detail.contains("state:     OPERATION_FINISHED\n"),
        "{detail}"
    );
    assert!(
        detail.contains("STATUS") && detail.contains("  OPERATION_FINISHED"),
        "the status updates: {detail}"
    );
    let out = d.ctl_ok(&["unpublish", &id]).await;
    assert_eq!(out, format!("unpublished {id} (NODE_READY)\n"));
    assert!(!mounts_under(d.dir.path()).contains(&path));

    let out = d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
    assert_eq!(out, format!("destroyed disk {id}\n"));
    d.resources_until("the disk gone", |r| !has_disk(r, &id))
        .await;
    let row = pool_row(&d.ctl_ok(&["resources"]).await, "dir");
    assert_eq!(row[2], "0B", "the pool is whole again: {row:?}");
}

/// No --type: the `block` profile's own type. Publish gives a block device, which goes
/// on unpublish; the disk shows in the row of pool `loop` (shared with `ext4`).
#[tokio::test]
async fn root_ctl_block_disk_device_appears_and_goes() {
    if !slrp_test_support::require_root("root_ctl_block_disk_device_appears_and_goes") {
        return;
    }
    let d = Daemon::start().await;
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            "block",
            "--size",
            DISK,
            "--wait",
        ])
        .await;
    let block = created_id(&out, "block");
    let volumes = d.ctl_json(&["volumes"]).await;
    let v = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume_id"] == block.as_str())
        .unwrap_or_else(|| panic!("{block} in {volumes}"));
    assert_eq!(v["type"], "block", "{v}");
    d.resources_until("the disk", |r| has_disk(r, &block)).await;
    let table = d.ctl_ok(&["resources"]).await;
    let row = pool_row(&table, "loop");
    assert_eq!((row[2].as_str(), row[5].as_str()), (DISK, "1"), "{table}");

    let out = d.ctl_ok(&["publish", &block]).await;
    let device = PathBuf::from(out.lines().last().unwrap());
    let meta = std::fs::metadata(&device)
        .unwrap_or_else(|e| panic!("{} once published: {e}\n{out}", device.display()));
    assert!(
        meta.file_type().is_block_device(),
        "{} is a block device once published: {meta:?}",
        device.display()
    );
    d.ctl_ok(&["unpublish", &block]).await;
    match std::fs::metadata(&device) {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}"),
        Ok(meta) => assert!(
            !meta.file_type().is_block_device(),
            "{} is no block device once unpublished",
            device.display()
        ),
    }
}

/// On a terminal, --wait shows what it waits for, with the size the daemon makes (`100M`
/// is 95.4 MiB, rounded up to 96 MiB), then clears the line. `script` gives the command a
/// pseudo-terminal and copies what is drawn on it.
#[tokio::test]
async fn root_ctl_wait_on_a_terminal_draws_a_spinner() {
    const TEST: &str = "root_ctl_wait_on_a_terminal_draws_a_spinner";
    if !slrp_test_support::require_root(TEST) || !slrp_test_support::require_tool(TEST, "script") {
        return;
    }
    let d = Daemon::start().await;
    let out = tokio::process::Command::new("script")
        .arg("-qec")
        .arg(format!(
            "{} ctl --admin {} create-disk --profile mount --size 100M --wait",
            env!("CARGO_BIN_EXE_slrp"),
            d.admin().display()
        ))
        .arg("/dev/null")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("running script");
    let drawn = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{drawn}");
    assert!(
        drawn.contains("creating a mount disk of 96MiB from profile mount ("),
        "the spinner's line: {drawn:?}"
    );
    assert!(drawn.contains("\x1b[2K"), "the line is cleared: {drawn:?}");
    assert!(drawn.contains("created disk vol-"), "{drawn:?}");
}

/// Without --wait the PENDING operation comes at once; the daemon's refusals keep their
/// exit codes.
#[tokio::test]
async fn root_ctl_pending_and_refusals() {
    if !slrp_test_support::require_root("root_ctl_pending_and_refusals") {
        return;
    }
    let d = Daemon::start().await;
    let out = d
        .ctl_ok(&["create-disk", "--profile", "mount", "--size", DISK])
        .await;
    assert!(
        out.starts_with("operation ") && out.ends_with(" (CREATE_DISK): OPERATION_PENDING\n"),
        "{out}"
    );

    let (_, err) = d
        .ctl_exit(&["create-disk", "--profile", "nope", "--size", DISK], 4)
        .await;
    assert!(
        err.contains("unknown profile 'nope'") && err.contains("mount"),
        "{err}"
    );
    let (_, err) = d
        .ctl_exit(
            &[
                "create-disk",
                "--profile",
                "mount",
                "--size",
                "1PiB",
                "--wait",
            ],
            1,
        )
        .await;
    assert!(err.contains("(HTTP 409)"), "{err}");
    let (_, err) = d.ctl_exit(&["destroy-disk", "vol-nope", "--wait"], 4).await;
    assert!(err.contains("vol-nope"), "{err}");
    let (_, err) = d.ctl_exit(&["volumes", "vol-nope"], 4).await;
    assert!(
        err.contains("`slrp ctl volumes` lists the volumes"),
        "{err}"
    );
    d.ctl_exit(&["operations", "5f276ecb-d3fe-410e-a8d5-0c881e04279a"], 4)
        .await;
    let (_, err) = d.ctl_exit(&["publish", "vol-nope"], 4).await;
    assert!(err.contains("vol-nope"), "{err}");
    assert!(
        err.contains("`slrp ctl volumes` lists the volumes"),
        "{err}"
    );
}

#[tokio::test]
async fn root_destroy_of_a_published_disk_is_refused_and_keeps_the_data() {
    if !slrp_test_support::require_root(
        "root_destroy_of_a_published_disk_is_refused_and_keeps_the_data",
    ) {
        return;
    }
    let d = Daemon::start().await;
    let op = d
        .ctl_json(&[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            "8MiB",
            "--wait",
        ])
        .await;
    let id = op["volume_id"].as_str().unwrap().to_owned();
    let out = d.ctl_ok(&["publish", &id]).await;
    let path = PathBuf::from(out.lines().last().unwrap());
    std::fs::write(path.join("data"), "in use").unwrap();

    // Published: the operator's publish stands in for a task, so no destroy under it.
    let (_, err) = d.ctl_exit(&["destroy-disk", &id, "--wait"], 1).await;
    assert!(
        err.contains(&format!("published at {}", path.display()))
            && err.contains(&format!("slrp ctl unpublish {id}")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("data")).unwrap(),
        "in use"
    );
    let one = d.ctl_ok(&["volumes", &id]).await;
    assert!(one.contains("state:        PUBLISHED\n"), "{one}");

    d.ctl_ok(&["unpublish", &id]).await;
    let out = d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
    assert_eq!(out, format!("destroyed disk {id}\n"));
}

/// Read your own writes (issue #22): once `create-disk --wait` or `destroy-disk --wait`
/// returns, the very next `resources` and `volumes` show the change (the disk with its
/// profile; then no disk), with no wait in between. Three disks of each kind, one after
/// the other, so that a lag of the provider's total shows.
#[tokio::test]
async fn root_ctl_reads_its_own_writes_after_waited_create_and_destroy() {
    if !slrp_test_support::require_root(
        "root_ctl_reads_its_own_writes_after_waited_create_and_destroy",
    ) {
        return;
    }
    let d = Daemon::start().await;
    for profile in ["mount", "block", "mount"] {
        let op = d
            .ctl_json(&[
                "create-disk",
                "--profile",
                profile,
                "--size",
                DISK,
                "--wait",
            ])
            .await;
        let id = op["volume_id"].as_str().unwrap().to_owned();
        let resources = d.ctl_json(&["resources"]).await;
        assert!(has_disk(&resources, &id), "{id} not in {resources:#}");
        let volume = d.ctl_json(&["volumes", &id]).await;
        assert_eq!(volume["profile"], profile, "{volume:#}");
        let table = d.ctl_ok(&["volumes"]).await;
        let row = table.lines().find(|l| l.starts_with(&id)).unwrap();
        assert!(row.contains(&format!("  {profile}  ")), "PROFILE: {row:?}");

        d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
        let resources = d.ctl_json(&["resources"]).await;
        assert!(!has_disk(&resources, &id), "{id} still in {resources:#}");
        let volumes = d.ctl_json(&["volumes"]).await;
        assert!(
            volumes
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v["volume_id"] != id.as_str()),
            "{volumes:#}"
        );
    }
}

/// The default profiles (`mount`, `block`, `ext4`) and `xfs`, an xfs file system on a
/// loop device of pool `loop`.
fn profiles_with_xfs() -> Value {
    let profile = |capability: Value, pool: &str| {
        let mut capabilities = capability;
        capabilities["access_mode"] = serde_json::json!({"mode": "SINGLE_NODE_WRITER"});
        serde_json::json!({
            "csi_plugin_type_selector": {"plugin_type": "io.slrp.csi.local"},
            "volume_capabilities": capabilities,
            "create_parameters": {"pool": pool, "backend": pool},
        })
    };
    serde_json::json!({
        "profile_matrix": {
            "mount": profile(serde_json::json!({"mount": {}}), "dir"),
            "block": profile(serde_json::json!({"block": {}}), "loop"),
            "ext4": profile(serde_json::json!({"mount": {"fs_type": "ext4"}}), "loop"),
            "xfs": profile(serde_json::json!({"mount": {"fs_type": "xfs"}}), "loop"),
        }
    })
}

/// The size in MB of disk `id` in `/resources`.
fn disk_mb(resources: &Value, id: &str) -> f64 {
    resources
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["disk"]["source"]["id"] == id)
        .map(|r| r["scalar"]["value"].as_f64().unwrap())
        .sum()
}

/// The size in bytes of the file system mounted at `path`, as a task sees it.
fn fs_bytes(path: &std::path::Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).unwrap();
    s.blocks() * s.fragment_size()
}

/// `expand-disk` of a published disk of `profile` from `from` to `to` MiB: the file
/// system a task sees grows, its data stays, the disk is offered at the new size and the
/// pool gives the difference; a smaller size is refused; destroying it gives the whole
/// space back.
///
/// `online`: the plugin can grow the mounted file system. Without it (ext4 without
/// CAP_SYS_RESOURCE: resize2fs may not grow a mounted ext4 then), expand-disk fails
/// naming NodeExpandVolume and the refusal, the file system and its data are as they
/// were, and the volume and the disk have grown all the same (the plugin took the
/// space); NodeExpandVolume stays owed (sent again at the next publish or start).
async fn grows_a_published_disk(profile: &str, from: u64, to: u64, online: bool) {
    let d = Daemon::start_with(Some(profiles_with_xfs())).await;
    let size = format!("{from}MiB");
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            profile,
            "--size",
            &size,
            "--wait",
        ])
        .await;
    let id = created_id(&out, profile);
    let out = d.ctl_ok(&["publish", &id]).await;
    let path = PathBuf::from(out.lines().last().unwrap());
    std::fs::write(path.join("data"), b"kept across the growth").unwrap();
    let before_fs = fs_bytes(&path);
    let before = d.resources_until("the disk", |r| has_disk(r, &id)).await;
    #[allow(clippy::cast_precision_loss)]
    let (from_mb, to_mb) = (from as f64, to as f64);
    assert!((disk_mb(&before, &id) - from_mb).abs() < 0.5, "{before}");

    let grown = format!("{to}MiB");
    let args = ["expand-disk", &id, "--size", &grown, "--wait"];
    if online {
        let out = d.ctl_ok(&args).await;
        assert_eq!(out, format!("expanded disk {id} to {grown}\n"));
    } else {
        let (_, err) = d.ctl_exit(&args, 1).await;
        assert!(
            err.contains("NodeExpandVolume failed") && err.contains("Permission denied"),
            "{err}"
        );
    }
    let after_fs = fs_bytes(&path);
    #[allow(clippy::cast_precision_loss)]
    let ratio = after_fs as f64 / before_fs as f64;
    #[allow(clippy::cast_precision_loss)]
    let want = if online { to_mb / from_mb } else { 1.0 };
    assert!(
        ratio > want * 0.9 && ratio < want * 1.1,
        "{profile}: the mounted file system grew {before_fs} → {after_fs} bytes ({ratio:.2}×, want about {want:.2}×)"
    );
    assert_eq!(
        std::fs::read(path.join("data")).unwrap(),
        b"kept across the growth"
    );
    let after = d
        .resources_until("the grown disk", |r| (disk_mb(r, &id) - to_mb).abs() < 0.5)
        .await;
    assert!(
        (free_mb(&before, profile) - free_mb(&after, profile) - (to_mb - from_mb)).abs() < 1.0,
        "the pool gave the growth: {before} → {after}"
    );
    let (_, err) = d.ctl_exit(&["expand-disk", &id, "--size", &size], 1).await;
    assert!(
        err.contains("(HTTP 409)") && err.contains("shrink"),
        "{err}"
    );

    d.ctl_ok(&["unpublish", &id]).await;
    d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
    d.resources_until("the disk gone and its space back", |r| {
        !has_disk(r, &id) && (free_mb(r, profile) - free_mb(&before, profile) - from_mb).abs() < 1.0
    })
    .await;
}

#[tokio::test]
async fn root_expand_disk_grows_a_published_ext4_disk() {
    if !slrp_test_support::require_root("root_expand_disk_grows_a_published_ext4_disk") {
        return;
    }
    let online = slrp_test_support::has_cap(slrp_test_support::Cap::SysResource);
    grows_a_published_disk("ext4", 64, 128, online).await;
}

#[tokio::test]
async fn root_expand_disk_grows_a_published_xfs_disk() {
    if !slrp_test_support::require_root("root_expand_disk_grows_a_published_xfs_disk")
        || !slrp_test_support::require_tool(
            "root_expand_disk_grows_a_published_xfs_disk",
            "mkfs.xfs",
        )
    {
        return;
    }
    grows_a_published_disk("xfs", 320, 400, true).await;
}

/// A disk that is not published grows on the plugin now and its file system at the
/// next publish; a directory disk (no file system to grow) grows at once.
#[tokio::test]
async fn root_expand_disk_of_a_disk_not_published_grows_at_the_next_publish() {
    if !slrp_test_support::require_root(
        "root_expand_disk_of_a_disk_not_published_grows_at_the_next_publish",
    ) {
        return;
    }
    let d = Daemon::start().await;
    let out = d
        .ctl_ok(&["create-disk", "--profile", "ext4", "--size", DISK, "--wait"])
        .await;
    let id = created_id(&out, "ext4");
    let out = d
        .ctl_ok(&["expand-disk", &id, "--size", "128MiB", "--wait"])
        .await;
    assert_eq!(
        out,
        format!("expanded disk {id} to 128MiB (its file system grows when it is next published)\n")
    );
    let out = d.ctl_ok(&["publish", &id]).await;
    let path = PathBuf::from(out.lines().last().unwrap());
    let bytes = fs_bytes(&path);
    assert!(bytes > 100 << 20, "grown at publish: {bytes} bytes");
    let one = d.ctl_json(&["volumes", &id]).await;
    assert_eq!(one["state"], "PUBLISHED", "{one}");

    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            DISK,
            "--wait",
        ])
        .await;
    let dir = created_id(&out, "mount");
    let out = d
        .ctl_ok(&["--json", "expand-disk", &dir, "--size", "96MiB"])
        .await;
    let grown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(grown["size_bytes"], 96u64 << 20, "{grown}");
    assert_eq!(grown["node_expansion_owed"], false, "{grown}");
    d.resources_until("the dir disk at 96 MiB", |r| {
        (disk_mb(r, &dir) - 96.0).abs() < 0.5
    })
    .await;
    // Unknown disks and sizes the pool cannot give are refused before any call.
    let (_, err) = d
        .ctl_exit(&["expand-disk", "vol-nope", "--size", "1GiB"], 4)
        .await;
    assert!(err.contains("vol-nope"), "{err}");
    let (_, err) = d
        .ctl_exit(&["expand-disk", &dir, "--size", "1PiB"], 1)
        .await;
    assert!(
        err.contains("(HTTP 409)") && err.contains("not enough free space"),
        "{err}"
    );
}

/// `slrp ctl snapshot ID --json`'s snapshot id.
async fn snapshot_of(d: &Daemon, id: &str, name: &str) -> String {
    let taken = d.ctl_json(&["snapshot", id, "--name", name]).await;
    assert_eq!(taken["source_volume_id"], id, "{taken}");
    assert_eq!(taken["name"], name, "{taken}");
    assert_eq!(taken["ready_to_use"], true, "{taken}");
    taken["snapshot_id"].as_str().unwrap().to_owned()
}

/// Issue #24's story on a published disk of `profile`: data written, a snapshot taken
/// (its space leaves the pool), the disk destroyed, a disk restored from the snapshot
/// holds the data; a clone of that published disk holds it too; the snapshot deleted
/// gives its space back. `write` and `read` put data on the published path and get it
/// back (a file for MOUNT, the device's first bytes for BLOCK).
async fn snapshot_restore_clone(
    profile: &str,
    write: impl Fn(&std::path::Path, &[u8]),
    read: impl Fn(&std::path::Path, usize) -> Vec<u8>,
) {
    const DATA: &[u8] = b"written before the snapshot";
    let d = Daemon::start().await;
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            profile,
            "--size",
            DISK,
            "--wait",
        ])
        .await;
    let id = created_id(&out, profile);
    let out = d.ctl_ok(&["publish", &id]).await;
    write(&PathBuf::from(out.lines().last().unwrap()), DATA);
    let before = d.resources_until("the disk", |r| has_disk(r, &id)).await;

    let snap = snapshot_of(&d, &id, "before-upgrade").await;
    let listed = d.ctl_ok(&["snapshots"]).await;
    assert!(
        listed.starts_with("SNAPSHOT") && listed.contains(&snap) && listed.contains("ready"),
        "{listed}"
    );
    assert_eq!(
        d.ctl_ok(&["snapshots", "vol-other"]).await,
        "no snapshots of vol-other\n"
    );
    // The copy counts against the pool.
    d.resources_until("the snapshot's space out of the pool", |r| {
        (free_mb(&before, profile) - free_mb(r, profile) - DISK_MB).abs() < 1.0
    })
    .await;
    let table = d.ctl_ok(&["resources"]).await;
    assert!(
        table.ends_with(&format!(
            "\nsnapshots: 1 holding {DISK} of their disks' pools (`slrp ctl snapshots`)\n"
        )),
        "{table}"
    );
    // Taking it again by name answers the same snapshot.
    assert_eq!(snapshot_of(&d, &id, "before-upgrade").await, snap);

    d.ctl_ok(&["unpublish", &id]).await;
    d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            profile,
            "--size",
            DISK,
            "--from-snapshot",
            &snap,
            "--wait",
        ])
        .await;
    let restored = created_id(&out, profile);
    assert_ne!(restored, id);
    let volumes = d.ctl_json(&["volumes", &restored]).await;
    assert_eq!(volumes["profile"], profile, "{volumes}");
    let out = d.ctl_ok(&["publish", &restored]).await;
    let path = PathBuf::from(out.lines().last().unwrap());
    assert_eq!(read(&path, DATA.len()), DATA, "restored from {snap}");

    // A clone of the published, restored disk.
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            profile,
            "--size",
            DISK,
            "--from-disk",
            &restored,
            "--wait",
        ])
        .await;
    let clone = created_id(&out, profile);
    let out = d.ctl_ok(&["publish", &clone]).await;
    assert_eq!(
        read(&PathBuf::from(out.lines().last().unwrap()), DATA.len()),
        DATA,
        "cloned from {restored}"
    );

    let free = free_mb(&d.ctl_json(&["resources"]).await, profile);
    assert_eq!(
        d.ctl_ok(&["delete-snapshot", &snap]).await,
        format!("deleted snapshot {snap}\n")
    );
    assert_eq!(d.ctl_ok(&["snapshots"]).await, "no snapshots\n");
    d.resources_until("the snapshot's space back in the pool", |r| {
        (free_mb(r, profile) - free - DISK_MB).abs() < 1.0
    })
    .await;
    let (_, err) = d.ctl_exit(&["delete-snapshot", &snap], 4).await;
    assert!(
        err.contains("`slrp ctl snapshots` lists the snapshots"),
        "{err}"
    );
    let (_, err) = d
        .ctl_exit(
            &[
                "create-disk",
                "--profile",
                profile,
                "--size",
                DISK,
                "--from-snapshot",
                &snap,
            ],
            4,
        )
        .await;
    assert!(err.contains(&snap), "{err}");
}

#[tokio::test]
async fn root_snapshot_restore_and_clone_of_an_ext4_disk() {
    if !slrp_test_support::require_root("root_snapshot_restore_and_clone_of_an_ext4_disk") {
        return;
    }
    snapshot_restore_clone(
        "ext4",
        |path, data| std::fs::write(path.join("data"), data).unwrap(),
        |path, _| std::fs::read(path.join("data")).unwrap(),
    )
    .await;
}

#[tokio::test]
async fn root_snapshot_restore_and_clone_of_a_block_disk() {
    if !slrp_test_support::require_root("root_snapshot_restore_and_clone_of_a_block_disk") {
        return;
    }
    snapshot_restore_clone(
        "block",
        |device, data| {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(device)
                .unwrap();
            f.write_all(data).unwrap();
            f.sync_all().unwrap();
        },
        |device, len| {
            use std::io::Read as _;
            let mut buf = vec![0; len];
            std::fs::File::open(device)
                .unwrap()
                .read_exact(&mut buf)
                .unwrap();
            buf
        },
    )
    .await;
}

/// Under `slrp run`-like refusals are in admin_refusals; here: a snapshot of a disk the
/// provider does not track is 404, and `--from-snapshot` with `--from-disk` is a usage
/// error.
#[tokio::test]
async fn root_snapshot_refusals() {
    if !slrp_test_support::require_root("root_snapshot_refusals") {
        return;
    }
    let d = Daemon::start().await;
    let (_, err) = d.ctl_exit(&["snapshot", "vol-nope"], 4).await;
    assert!(err.contains("vol-nope"), "{err}");
    let (_, err) = d
        .ctl_exit(
            &[
                "create-disk",
                "--profile",
                "mount",
                "--size",
                DISK,
                "--from-snapshot",
                "a",
                "--from-disk",
                "b",
            ],
            64,
        )
        .await;
    assert!(err.contains("cannot be used with"), "{err}");
}

/// kill -9 of the daemon (and its plugin) while a snapshot and an expansion of a
/// published ext4 disk run, five times at different moments: after each restart the
/// snapshots slrp records are exactly the plugin's once the interrupted calls settled;
/// at the end the pool holds the disk's offered size and the snapshots' and nothing
/// more, and deleting everything gives the whole pool back.
#[tokio::test]
async fn root_kill_9_during_snapshots_and_expansions_leaks_nothing() {
    if !slrp_test_support::require_root("root_kill_9_during_snapshots_and_expansions_leaks_nothing")
    {
        return;
    }
    let mut d = Daemon::start().await;
    let empty = d.ctl_json(&["resources"]).await;
    let out = d
        .ctl_ok(&["create-disk", "--profile", "ext4", "--size", DISK, "--wait"])
        .await;
    let id = created_id(&out, "ext4");
    d.ctl_ok(&["publish", &id]).await;
    let admin = d.admin();
    let ctl = |args: Vec<String>| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("ctl")
            .arg("--admin")
            .arg(&admin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    for round in 0..5u64 {
        let snap = ctl(vec![
            "snapshot".into(),
            id.clone(),
            "--name".into(),
            format!("round-{round}"),
        ]);
        let grow = ctl(vec![
            "expand-disk".into(),
            id.clone(),
            "--size".into(),
            format!("{}MiB", 64 + 8 * (round + 1)),
        ]);
        tokio::time::sleep(Duration::from_millis(25 * round)).await;
        d.kill_and_restart().await;
        drop((snap, grow));
        settled_snapshots(&d, &format!("round {round}")).await;
    }
    // Every round's name now answers one snapshot (taken then, or now), and only one.
    for round in 0..5u64 {
        snapshot_of(&d, &id, &format!("round-{round}")).await;
    }
    let recorded = settled_snapshots(&d, "after the rounds").await;
    assert_eq!(recorded.len(), 5, "{recorded:?}");
    // What left the pool is the disk's offered size and the snapshots' copies.
    let volume = d.ctl_json(&["volumes", &id]).await;
    let resources = d
        .resources_until("the disk at its volume's size", |r| {
            #[allow(clippy::cast_precision_loss)]
            let capacity = volume["capacity_bytes"].as_u64().unwrap() as f64 / 1_048_576.0;
            (disk_mb(r, &id) - capacity).abs() < 1.0
        })
        .await;
    let snapshots = d.ctl_json(&["snapshots"]).await;
    #[allow(clippy::cast_precision_loss)]
    let snapshot_mb: f64 = snapshots
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["size_bytes"].as_u64().unwrap() as f64 / 1_048_576.0)
        .sum();
    let taken = free_mb(&empty, "ext4") - free_mb(&resources, "ext4");
    assert!(
        (taken - disk_mb(&resources, &id) - snapshot_mb).abs() < 1.0,
        "the pool lost {taken} MB for a {} MB disk and {snapshot_mb} MB of snapshots",
        disk_mb(&resources, &id)
    );
    for snapshot in recorded {
        d.ctl_ok(&["delete-snapshot", &snapshot]).await;
    }
    assert!(d.plugin_snapshots().is_empty());
    // What the kills interrupted, for the record (the moments are fixed, what they hit
    // depends on the machine's speed).
    let log = std::fs::read_to_string(d.dir.path().join("slrp.log")).unwrap_or_default();
    for what in [
        "settling an interrupted CreateSnapshot",
        "interrupted copy",
        "the interrupted expansion",
        "ControllerExpandVolume done",
        "snapshot taken",
    ] {
        eprintln!("{what}: {}", log.matches(what).count());
    }
    d.ctl_ok(&["unpublish", &id]).await;
    d.ctl_ok(&["destroy-disk", &id, "--wait"]).await;
    d.resources_until("the whole pool back", |r| {
        (free_mb(r, "ext4") - free_mb(&empty, "ext4")).abs() < 1.0
    })
    .await;
}

/// Waits until slrp's snapshots (none being deleted) are exactly the plugin's; returns
/// their ids.
async fn settled_snapshots(d: &Daemon, what: &str) -> BTreeSet<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = d.ctl_json(&["snapshots"]).await;
        let recorded: BTreeSet<String> = listed
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["deleting"] == false)
            .map(|s| s["snapshot_id"].as_str().unwrap().to_owned())
            .collect();
        let plugin = d.plugin_snapshots();
        if recorded == plugin && recorded.len() == listed.as_array().unwrap().len() {
            return recorded;
        }
        if Instant::now() > deadline {
            d.fail(&format!(
                "{what}: slrp records {recorded:?}, the plugin has {plugin:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
