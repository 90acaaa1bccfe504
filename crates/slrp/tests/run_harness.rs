//! The harness of the `slrp run` tests checked on its own: the plugin command it writes
//! into a provider config starts the bundled plugin, and a dropped cluster leaves no
//! process behind.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use support::{Cluster, processes_mentioning};

/// Starts the plugin exactly as the provider config says (Mesos's `CommandInfo` with
/// `shell: false`: `value` is the program, `arguments` its argv including argv[0]) and with
/// `CSI_ENDPOINT`, as the daemon will.
async fn start_configured_plugin(c: &Cluster, provider: &str, socket: &std::path::Path) {
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(c.path("rp").join(format!("{provider}.json"))).unwrap(),
    )
    .unwrap();
    let command = &info["storage"]["plugin"]["containers"][0]["command"];
    assert_eq!(command["shell"], false);
    let args: Vec<String> = command["arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    // Detached on purpose (not kill_on_drop, not waited for): the cluster's drop must
    // find and kill it, as it must for plugins a SIGKILLed daemon left behind.
    let child = std::process::Command::new(command["value"].as_str().unwrap())
        .args(&args[1..])
        .env("CSI_ENDPOINT", format!("unix://{}", socket.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::mem::forget(child);
    slrp_test_support::wait_until_listening(socket).await;
}

#[tokio::test]
async fn the_configured_plugin_runs_and_a_dropped_cluster_kills_it() {
    let c = Cluster::fixture().await;
    let socket = c.path("probe.sock");
    start_configured_plugin(&c, "test", &socket).await;
    let pids = c.plugin_pids("test");
    assert_eq!(pids.len(), 1, "one plugin process expected: {pids:?}");
    // The plugin takes the fixture's pool and the faults file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(["csi", "--endpoint"])
        .arg(format!("unix://{}", socket.display()))
        .args(["--json", "capacity"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cap["available_bytes"], 4u64 << 30, "{cap}");
    c.count_calls("test", &["ListVolumes"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(["csi", "--endpoint"])
        .arg(format!("unix://{}", socket.display()))
        .arg("list-volumes")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.calls("test", "ListVolumes"), 1);

    let dir = c.dir.path().to_owned();
    drop(c);
    // SIGKILL is delivered before kill(2) returns, but the process lingers until it is
    // reaped (by init: it was detached); a zombie is not a leak.
    let gone = tokio::time::timeout(support::WAIT, async {
        while !processes_mentioning(&dir).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "plugin left running: {:?}",
        processes_mentioning(&dir)
    );
}

/// A wait that times out lists the manager messages earlier waits passed over: the
/// two-provider test once hung for the full hang guard because waiting for the second
/// SUBSCRIBED consumed the first provider's pool update, and its log did not say so.
#[tokio::test]
#[should_panic(expected = "SUBSCRIBED test (id ")]
async fn a_timed_out_wait_lists_the_messages_earlier_waits_passed_over() {
    let mut c = Cluster::new(
        vec![support::ProviderSpec::fixture()],
        support::DaemonOptions::with_profiles(),
    )
    .await;
    c.set_profiles(&support::profiles(&["test"]));
    c.start_daemon();
    // Passes over SUBSCRIBED and the update without a pool.
    c.update_where(|u| u.pool("test").is_some()).await;
    // Nothing more comes: this wait times out, naming the SUBSCRIBED it cannot see.
    c.wait = std::time::Duration::from_secs(2);
    c.next_subscribed().await;
}

/// Mounts a tmpfs at `path` (a stand-in for a published volume).
fn mount_tmpfs(path: &std::path::Path) {
    std::fs::create_dir_all(path).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        path,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
}

/// The simulated reboot unmounts everything under the test directory (nested mounts
/// first) and gives the next daemon start a boot id other than the kernel's; a dropped
/// cluster unmounts what is left, so its directory can go.
#[tokio::test]
async fn a_simulated_reboot_and_the_drop_leave_no_mount() {
    if !slrp_test_support::require_root("a_simulated_reboot_and_the_drop_leave_no_mount") {
        return;
    }
    let mut c = Cluster::fixture().await;
    let outer = c.path("work/csi/mounts/vol/target");
    mount_tmpfs(&outer);
    let inner = outer.join("inner");
    mount_tmpfs(&inner);
    assert_eq!(support::mounts_under(c.dir.path()), vec![inner, outer]);
    c.simulate_reboot().await;
    assert!(support::mounts_under(c.dir.path()).is_empty());
    let boot = std::fs::read_to_string(c.path("boot_id")).unwrap();
    let kernel = std::fs::read_to_string(slrp_types::BOOT_ID_PATH).unwrap();
    assert_ne!(boot.trim(), kernel.trim());

    mount_tmpfs(&c.path("work/again"));
    let dir = c.dir.path().to_owned();
    drop(c);
    assert!(!dir.exists(), "{} removed", dir.display());
    assert!(support::mounts_under(&dir).is_empty());
}
