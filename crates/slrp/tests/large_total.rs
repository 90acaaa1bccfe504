//! No cliff at the manager's body limit (issue #25): `slrp standalone` with a total larger
//! than the embedded manager's old 4 MiB limit. The bundled plugin is handed tens of
//! thousands of pre-existing volumes (its import directory), so the subscription's
//! UPDATE_STATE carries them all:
//!
//! - with `[manager] max_body_bytes` set to the old limit, the manager refuses it: the
//!   provider says why in `slrp ctl status` and does not become READY;
//! - with the default limit, the daemon becomes READY, and again after a restart on the
//!   same state.
//!
//! Slow by design (the plugin records every import with an fsync at its first listing):
//! about a minute under `CI=true`.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod e2e_support;
mod support;

use e2e_support::Standalone;
use serde_json::Value;

/// Pre-existing volumes: each is one RAW disk of about 140 bytes in the total's protobuf
/// (48,000 made 6.8 MB here), so that the total is well over 4 MiB.
const VOLUMES: usize = 40_000;

/// The embedded manager's limit before issue #25.
const OLD_LIMIT: usize = 4 << 20;

/// How long the first listing of every import may take (one fsync each), with margin.
const LISTED: std::time::Duration = std::time::Duration::from_secs(300);

/// Polls `slrp ctl --json status` (exit 2 while the daemon does not listen yet) until
/// `want` holds.
async fn status_until(d: &Standalone, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + LISTED;
    loop {
        let out = d.ctl(&["--json", "status"]).await;
        if out.code == Some(0)
            && let Ok(v) = serde_json::from_str::<Value>(&out.stdout)
            && want(&v)
        {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            d.fail(&format!(
                "timed out: {what}; last status:\n{}",
                out.describe()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn last_errors(status: &Value) -> Vec<String> {
    status["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["error"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_total_over_the_old_limit_is_refused_loudly_there_and_served_by_default() {
    if !e2e_support::require_root() {
        return;
    }
    let mut d = Standalone::new();
    let imports = d.state_dir().join("csi-local/import/dir");
    std::fs::create_dir_all(&imports).unwrap();
    for n in 0..VOLUMES {
        // An empty directory is a volume of 0 bytes, which is no resource.
        let dir = imports.join(format!("preexisting-{n:05}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("data"), b"x").unwrap();
    }

    // The old limit: the subscription's UPDATE_STATE is refused, and the provider says so.
    let config = d.path("slrp.toml");
    std::fs::write(
        &config,
        format!("[manager]\nmax_body_bytes = \"{OLD_LIMIT}\"\n"),
    )
    .unwrap();
    d.extra_args = vec!["--config".into(), config.display().to_string()];
    d.start();
    let status = status_until(&d, "the refusal in the status", |v| {
        last_errors(v).iter().any(|e| e.contains("refused"))
    })
    .await;
    let errors = last_errors(&status);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("max_body_bytes") && e.contains("413")),
        "the refusal does not name the limit to raise: {errors:?}"
    );
    assert_ne!(status["ready"], true, "READY without its total: {status:#}");
    d.stop_cleanly().await;

    // The default limit: READY, and again after a restart on the same state.
    std::fs::write(&config, "").unwrap();
    d.start();
    status_until(&d, "READY", |v| v["ready"] == true).await;
    let disks = d.ctl_json(&["resources"]).await;
    let count = disks.to_string().matches("import-dir-preexisting-").count();
    assert!(
        count >= VOLUMES,
        "{count} of {VOLUMES} pre-existing volumes offered"
    );
    d.stop_cleanly().await;
    d.start();
    status_until(&d, "READY after the restart", |v| v["ready"] == true).await;
    d.stop_cleanly().await;
}
