//! `slrp ctl`'s actions against a real `slrp standalone` with its defaults (profiles
//! `mount`, `block`, `ext4`): the tables, `--json`, `--wait` without a spinner when piped,
//! `--type` taken from the profile, the path on publish's last line, and the exit codes of
//! the daemon's refusals.
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

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use support::{WAIT, mounts_under, processes_mentioning, unmount_under};

/// `slrp standalone` on a temporary state directory; on drop it and its plugins are
/// killed and their mounts removed.
struct Daemon {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Daemon {
    /// Starts the daemon and waits until `slrp ctl --json status` says it is ready.
    async fn start() -> Self {
        slrp_test_support::csi_local_bin();
        let dir = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(dir.path().join("slrp.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("standalone")
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("SLRP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut daemon = Self { dir, child };
        let deadline = Instant::now() + WAIT;
        loop {
            let out = daemon.ctl(&["--json", "status"]).await;
            if out.status.success() {
                let status: Value = serde_json::from_slice(&out.stdout).unwrap();
                if status["ready"] == true {
                    return daemon;
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

/// The `resources` row of `profile`, split into cells.
fn pool_row(resources: &str, profile: &str) -> Vec<String> {
    resources
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(profile))
        .unwrap_or_else(|| panic!("no row for {profile}:\n{resources}"))
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

#[tokio::test]
async fn root_ctl_drives_standalone() {
    if !slrp_test_support::require_root("root_ctl_drives_standalone") {
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

    let before = d.ctl_json(&["resources"]).await;
    let row = pool_row(&d.ctl_ok(&["resources"]).await, "mount");
    assert_eq!(row[1], "0B", "nothing used yet: {row:?}");
    assert_eq!(row[2], row[3], "free is the total: {row:?}");
    assert_eq!(row[4], "0");
    assert_eq!(row[5], format!("[{}]", ".".repeat(20)));

    // A MOUNT disk, waited for: piped, --wait draws no spinner (stderr stays empty).
    let op = d
        .ctl_json(&[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            "1GiB",
            "--wait",
        ])
        .await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op}");
    assert_eq!(op["type"], "CREATE_DISK", "{op}");
    let id = op["volume_id"].as_str().unwrap().to_owned();
    let after = d.resources_until("the disk", |r| has_disk(r, &id)).await;
    let table = d.ctl_ok(&["resources"]).await;
    let row = pool_row(&table, "mount");
    assert_eq!(row[1], "1GiB", "{table}");
    assert_eq!(row[4], "1", "{table}");
    assert!(row[5].contains('#'), "{table}");
    assert!(
        (free_mb(&before, "mount") - free_mb(&after, "mount") - 1024.0).abs() < 0.5,
        "the pool shrank by the disk: {before} → {after}"
    );
    assert!(
        table.contains(&format!("{id}  MOUNT  mount    1GiB")),
        "{table}"
    );

    // Publish: the last line is the mount directory, which is mounted.
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
        volumes.contains(&format!("{id}  PUBLISHED  mount  1GiB")),
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
    let row = pool_row(&d.ctl_ok(&["resources"]).await, "mount");
    assert_eq!(row[1], "0B", "the pool is whole again: {row:?}");

    // On a terminal, --wait shows what it waits for (then clears the line). `script`
    // gives the command a pseudo-terminal and copies what is drawn on it.
    let on_terminal = tokio::process::Command::new("script")
        .arg("-qec")
        .arg(format!(
            "{} ctl --admin {} create-disk --profile mount --size 64MiB --wait",
            env!("CARGO_BIN_EXE_slrp"),
            d.admin().display()
        ))
        .arg("/dev/null")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await;
    match on_terminal {
        Ok(out) => {
            let drawn = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{drawn}");
            assert!(
                drawn.contains("creating a mount disk of 64MiB from profile mount ("),
                "the spinner's line: {drawn:?}"
            );
            assert!(drawn.contains("\x1b[2K"), "the line is cleared: {drawn:?}");
            assert!(drawn.contains("created disk vol-"), "{drawn:?}");
        }
        Err(e) => eprintln!("not checking the spinner: `script` cannot run: {e}"),
    }

    // No --type: the profile's own (BLOCK) is used.
    let out = d
        .ctl_ok(&[
            "create-disk",
            "--profile",
            "block",
            "--size",
            "64MiB",
            "--wait",
        ])
        .await;
    let block = out
        .strip_prefix("created disk ")
        .and_then(|s| s.strip_suffix(" (profile block)\n"))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    let volumes = d.ctl_json(&["volumes"]).await;
    let v = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume_id"] == block.as_str())
        .unwrap_or_else(|| panic!("{block} in {volumes}"));
    assert_eq!(v["type"], "block", "{v}");
    let out = d.ctl_ok(&["publish", &block]).await;
    let device = Path::new(out.lines().last().unwrap());
    assert!(
        device.exists(),
        "{} exists once published",
        device.display()
    );
    d.ctl_ok(&["unpublish", &block]).await;

    // Without --wait: the PENDING operation, at once.
    let out = d
        .ctl_ok(&["create-disk", "--profile", "mount", "--size", "64MiB"])
        .await;
    assert!(
        out.starts_with("operation ") && out.ends_with(" (CREATE_DISK): OPERATION_PENDING\n"),
        "{out}"
    );

    // The daemon's refusals.
    let (_, err) = d
        .ctl_exit(&["create-disk", "--profile", "nope", "--size", "1G"], 4)
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
