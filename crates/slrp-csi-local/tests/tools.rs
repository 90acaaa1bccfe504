//! External tools under `--tool-timeout`, against the real binary with real loop devices:
//! a hung mkfs is killed with its helpers, NodeStageVolume fails with DEADLINE_EXCEEDED and
//! is undone, and the CO's retry formats the volume cleanly even though the killed mkfs left
//! a file system signature behind.
//!
//! Fake tools are shell scripts in a directory put first on the plugin's `PATH`; the fake
//! mkfs hangs on its first call only and then hands over to the real one.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use slrp_proto::csi::v1;

fn real_tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

fn write_script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Dead: no /proc entry, or a zombie left for its new parent (init) to reap.
async fn assert_gone(pid: i32, what: &str) {
    for _ in 0..500 {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(stat)
                if stat
                    .rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])) =>
            {
                return;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    panic!("{what} (pid {pid}) is still running");
}

/// The first 4 KiB of a real file system of this type and size: what a killed mkfs can
/// leave behind (a superblock that blkid recognises, nothing else).
fn partial_signature(fs: &str, size: u64, scratch_dir: &Path) -> Vec<u8> {
    let img = scratch_dir.join("scratch.img");
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let mut mkfs = std::process::Command::new(real_tool(&format!("mkfs.{fs}")).unwrap());
    match fs {
        "xfs" => mkfs.args(["-q", "-K"]),
        _ => mkfs.args(["-q", "-F", "-E", "nodiscard"]),
    };
    assert!(mkfs.arg(&img).status().unwrap().success());
    let mut head = std::fs::read(&img).unwrap();
    head.truncate(4096);
    std::fs::remove_file(&img).unwrap();
    head
}

async fn interrupted_mkfs_is_redone(test: &str, fs: &str, size: i64) {
    if !can_mount(test) {
        return;
    }
    let mkfs = format!("mkfs.{fs}");
    if !slrp_test_support::require_tool(test, &mkfs) {
        return;
    }
    let real_mkfs = real_tool(&mkfs).expect("require_tool found it");
    let tools = tempfile::tempdir().unwrap();
    let t = tools.path().display().to_string();
    std::fs::write(
        tools.path().join("partial.bin"),
        partial_signature(fs, u64::try_from(size).unwrap(), tools.path()),
    )
    .unwrap();
    write_script(
        &tools.path().join(format!("mkfs.{fs}")),
        &format!(
            r#"echo "$@" >> {t}/calls
for a in "$@"; do dev="$a"; done
if [ ! -e {t}/hung ]; then
  : > {t}/hung
  echo $$ > {t}/mkfs.pid
  dd if={t}/partial.bin of="$dev" bs=4096 count=1 conv=notrunc,fsync 2>/dev/null
  echo "mkfs.{fs}: writing metadata" >&2
  sleep 1000 &
  echo $! > {t}/helper.pid
  wait
fi
exec {real} "$@""#,
            real = real_mkfs.display()
        ),
    );
    let path = format!("{t}:{}", std::env::var("PATH").unwrap_or_default());
    let p = TestPlugin::start_with_env(&["--tool-timeout", "2s"], &[("PATH", &path)]).await;
    let mut c = p.v1().await;
    let vol = c
        .controller
        .create_volume(create_req("v", size, mount_cap(fs), &[("backend", "loop")]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = p.path_str("staging");
    let stage = v1::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.clone(),
        volume_capability: Some(mount_cap(fs)),
        ..Default::default()
    };

    let err = c.node.node_stage_volume(stage.clone()).await.unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::DeadlineExceeded,
        "{}",
        err.message()
    );
    assert!(
        err.message().contains("did not finish within 2s")
            && err
                .message()
                .contains(&format!("mkfs.{fs}: writing metadata")),
        "{}",
        err.message()
    );
    assert_gone(read_pid(&tools.path().join("mkfs.pid")), "hung mkfs").await;
    assert_gone(read_pid(&tools.path().join("helper.pid")), "mkfs helper").await;
    // The failed stage was undone: nothing mounted, the loop device detached.
    assert!(p.mounts_here().is_empty(), "{:?}", p.mounts_here());
    assert!(p.loops_here().is_empty(), "{:?}", p.loops_here());

    // The CO retries: the partial signature is not adopted, mkfs runs again (forced).
    c.node.node_stage_volume(stage.clone()).await.unwrap();
    std::fs::write(Path::new(&staging).join("data"), b"kept").unwrap();
    c.node
        .node_unstage_volume(v1::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap();
    c.node.node_stage_volume(stage).await.unwrap();
    assert_eq!(
        std::fs::read(Path::new(&staging).join("data")).unwrap(),
        b"kept"
    );
    let calls = std::fs::read_to_string(tools.path().join("calls")).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len(), 2, "mkfs runs: {calls:?}");
    if fs == "xfs" {
        // Without -f, mkfs.xfs refuses a device with a signature on it.
        assert!(
            !calls[0].contains("-f") && calls[1].contains("-f"),
            "{calls:?}"
        );
    }
    c.node
        .node_unstage_volume(v1::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging,
        })
        .await
        .unwrap();
    c.controller
        .delete_volume(v1::DeleteVolumeRequest {
            volume_id: vol.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn hung_mkfs_xfs_times_out_and_the_retry_formats_cleanly() {
    interrupted_mkfs_is_redone(
        "hung_mkfs_xfs_times_out_and_the_retry_formats_cleanly",
        "xfs",
        300 * MIB,
    )
    .await;
}

#[tokio::test]
async fn hung_mkfs_ext4_times_out_and_the_retry_formats_cleanly() {
    interrupted_mkfs_is_redone(
        "hung_mkfs_ext4_times_out_and_the_retry_formats_cleanly",
        "ext4",
        16 * MIB,
    )
    .await;
}

/// A bad `--tool-timeout` is a usage error (exit 64) naming the flag.
#[test]
fn bad_tool_timeout_is_a_usage_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp-csi-local"))
        .args([
            "--endpoint",
            "/tmp/never.sock",
            "--node-id",
            "n",
            "--tool-timeout",
            "0s",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--tool-timeout \"0s\" must be a positive duration"),
        "{stderr}"
    );
}
