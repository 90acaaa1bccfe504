//! `slrp standalone` against a CSI plugin that misbehaves on purpose (issue #26): the
//! test process serves `slrp_test_support::hostile::HostilePlugin` on a unix socket, and
//! the provider's plugin container (a Mesos SLRP needs one) only links the endpoint the
//! supervisor gives it to that socket, so the daemon's CSI calls reach the test's plugin
//! through its ordinary supervised client. Each test
//! makes the plugin break one rule and checks what an operator sees: `slrp ctl`, the
//! admin API, the daemon's log, its peak memory (`VmHWM`), and what the plugin was asked.
//!
//! Each test failed before its fix (the figures are in the commit messages and
//! docs/csi-client.md): the endless listing grew the daemon past 1 GiB, the oversized
//! volume was FINISHED as an 8192 PiB disk, the 2 MB contexts were stored, a refused
//! answer was created again after a restart, create-disk before READY answered 409, a
//! newline in an id forged a log line, an empty id kept the provider out of READY, and
//! duplicates and negative sizes were logged at every reconciliation or never.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod e2e_support;
mod support;

use std::time::Duration;

use e2e_support::{Standalone, pool_mb};
use serde_json::{Value, json};
use slrp_test_support::hostile::{
    Code, CreateAnswer, HealthAnswer, HostilePlugin, ListAnswer, Misbehaviour,
};

const PROVIDER: &str = "org.apache.mesos.rp.local.storage.hostile";
const PROFILE: &str = "hostile";
const MIB: i64 = 1 << 20;

/// A daemon whose only provider's plugin is `plugin`, reconciling every second, with
/// millisecond CSI retries.
struct Setup {
    d: Standalone,
    plugin: HostilePlugin,
}

impl Setup {
    /// `None` where standalone may not run (no root, outside CI).
    fn new(m: Misbehaviour) -> Option<Self> {
        if !e2e_support::require_root() {
            return None;
        }
        let mut d = Standalone::new();
        let plugin = HostilePlugin::start_at(&d.path("hostile.sock"));
        plugin.set(m);
        let rp = d.path("rp");
        std::fs::create_dir_all(&rp).unwrap();
        // The container stands in for the plugin: its endpoint is a link to the test's
        // socket. It names the test's directory, so the harness finds it to kill.
        let container = format!(
            "ln -sf '{}' \"${{CSI_ENDPOINT#unix://}}\" && while :; do sleep 1; done",
            plugin.socket.display()
        );
        let info = json!({
            "type": "org.apache.mesos.rp.local.storage",
            "name": "hostile",
            "default_reservations": [{"type": "DYNAMIC", "role": "storage"}],
            "storage": {
                "plugin": {
                    "type": "io.slrp.hostile",
                    "name": "hostile",
                    "containers": [{
                        "services": ["CONTROLLER_SERVICE", "NODE_SERVICE"],
                        "command": {"shell": true, "value": container}
                    }]
                },
                "reconciliation_interval_seconds": 1
            }
        });
        std::fs::write(rp.join("hostile.json"), info.to_string()).unwrap();
        let profiles = json!({"profile_matrix": {PROFILE: {
            "csi_plugin_type_selector": {"plugin_type": "io.slrp.hostile"},
            "volume_capabilities": {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_WRITER"}},
            "create_parameters": {}
        }}});
        std::fs::write(d.path("profiles.json"), profiles.to_string()).unwrap();
        std::fs::write(
            d.path("slrp.toml"),
            // The volume health poller asks every 200 ms, and waits a minute for an answer
            // (longer than any bound a test puts on an operation).
            "[retries]\nstatus_update_min = \"200ms\"\nstatus_update_max = \"1600ms\"\ncsi_min = \"50ms\"\ncsi_max = \"400ms\"\n\
             [volume_health]\ninterval = \"200ms\"\ntimeout = \"60s\"\n",
        )
        .unwrap();
        d.extra_args = vec![
            "--config".into(),
            d.path("slrp.toml").display().to_string(),
            "--resource-provider-config-dir".into(),
            rp.display().to_string(),
            "--disk-profiles".into(),
            d.path("profiles.json").display().to_string(),
        ];
        Some(Self { d, plugin })
    }

    /// Starts the daemon and waits until it is READY and offers the profile's pool.
    async fn ready(&mut self) {
        self.d.start_ready().await;
        self.d
            .ctl_json_until(&["resources"], "the hostile pool", |r| {
                pool_mb(r, PROFILE).is_some()
            })
            .await;
    }

    /// `ctl --json create-disk --wait` of `size`; the operation, whatever its outcome.
    async fn create_disk(&self, size: &str) -> Value {
        let out = self
            .d
            .ctl(&[
                "--json",
                "create-disk",
                "--profile",
                PROFILE,
                "--size",
                size,
                "--wait",
            ])
            .await;
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| self.d.fail(&format!("not JSON ({e}): {}", out.describe())))
    }

    /// The daemon's peak resident memory so far (`VmHWM`), in MiB.
    fn peak_mib(&self) -> u64 {
        let pid = self.d.pid().expect("the daemon runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb / 1024
    }

    /// Waits until the plugin has answered `pages` more ListVolumes pages: reconciliations
    /// went by (the plugin's side of them, seen without any timing assumption).
    async fn reconciliations(&self, pages: usize) {
        let start = self.plugin.seen().list_pages;
        self.d
            .within("reconciliations", async {
                while self.plugin.seen().list_pages < start + pages {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
    }

    /// Polls `ctl --json status` (which fails while the admin socket is not up yet)
    /// until `want` holds.
    async fn status_until(&self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + e2e_support::WAIT;
        loop {
            let out = self.d.ctl(&["--json", "status"]).await;
            if let Ok(v) = serde_json::from_str::<Value>(&out.stdout)
                && want(&v)
            {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                self.d
                    .fail(&format!("timed out: {what}; last: {}", out.describe()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn provider_status(status: &Value) -> &Value {
        &status["providers"][0]
    }

    /// Lines of the daemon's log that contain `needle`.
    fn log_lines(&self, needle: &str) -> usize {
        self.d.log().lines().filter(|l| l.contains(needle)).count()
    }
}

/// Size of everything under `path`, in bytes.
fn tree_bytes(path: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            tree_bytes(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// Defect 1: a ListVolumes that hands out a new token on every page (500 volumes of
/// 1 KiB each per page) was followed for ever, every page kept. Now the listing stops at
/// `csi.max_list_bytes` (64 MiB) with an error naming it, the provider says so, and the
/// daemon's peak memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_listing_is_stopped_at_its_bound_with_bounded_memory() {
    const CEILING_MIB: u64 = 1024;
    let Some(mut s) = Setup::new(Misbehaviour {
        list: ListAnswer::Endless {
            entries: 500,
            context_bytes: 1000,
        },
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.d.start();
    let deadline = tokio::time::Instant::now() + e2e_support::WAIT;
    let status = loop {
        if let Some(st) = s.d.exited() {
            s.d.fail(&format!("the daemon exited with {st}"));
        }
        let peak = s.peak_mib();
        if peak > CEILING_MIB {
            s.d.fail(&format!(
                "peak memory {peak} MiB after {} pages and rising: the listing is not bounded",
                s.plugin.seen().list_pages
            ));
        }
        let out = s.d.ctl(&["--json", "status"]).await;
        if let Ok(v) = serde_json::from_str::<Value>(&out.stdout)
            && Setup::provider_status(&v)["error"]
                .as_str()
                .is_some_and(|e| e.contains("csi.max_list_bytes"))
        {
            break v;
        }
        assert!(tokio::time::Instant::now() < deadline, "no listing error");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let error = Setup::provider_status(&status)["error"].as_str().unwrap();
    assert!(
        error.contains("the listing passed 67108864 bytes (setting csi.max_list_bytes)"),
        "{error}"
    );
    assert_eq!(Setup::provider_status(&status)["ready"], false);
    // Let it retry a few times: each listing is bounded, none accumulates.
    s.reconciliations(3 * 140).await;
    let peak = s.peak_mib();
    eprintln!(
        "endless listing: {} pages asked, daemon peak {peak} MiB",
        s.plugin.seen().list_pages
    );
    assert!(peak < 512, "peak {peak} MiB");
    // The daemon still answers.
    s.d.ctl_ok(&["status"]).await;
}

/// Defect 2: CreateVolume of exactly 1 MiB answered with 2^63-1 bytes was FINISHED as an
/// 8192 PiB disk. Now the answer is refused, the plugin's volume deleted, the operation
/// FAILED saying why, and the pool is what the plugin reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_above_limit_bytes_is_refused_and_deleted() {
    let Some(mut s) = Setup::new(Misbehaviour {
        create: CreateAnswer::Capacity(i64::MAX),
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.ready().await;
    let pool_before = pool_mb(&s.d.ctl_json(&["resources"]).await, PROFILE).unwrap();
    let op = s.create_disk("1MiB").await;
    assert_eq!(op["state"], "OPERATION_FAILED", "{op:#}");
    let message = op["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("capacity_bytes 9223372036854775807 is above the limit_bytes 1048576"),
        "{message}"
    );
    assert!(message.contains("was deleted"), "{message}");
    let seen = s.plugin.seen();
    assert_eq!(seen.deletes, vec!["vol-1".to_owned()], "{seen:?}");
    assert!(s.plugin.volumes().is_empty());
    let volumes = s.d.ctl_json(&["volumes"]).await;
    let refused: Vec<_> = volumes
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["state"] == "CREATE_REFUSED")
        .collect();
    assert_eq!(refused.len(), 1, "{volumes:#}");
    assert_eq!(refused[0]["volume_id"], "vol-1");
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["capacity_bytes"].as_u64().unwrap_or(0) < 1 << 40),
        "{volumes:#}"
    );
    let resources =
        s.d.ctl_json_until(&["resources"], "the pool as before", |r| {
            pool_mb(r, PROFILE) == Some(pool_before)
        })
        .await;
    let disks: Vec<_> = resources
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["disk"]["source"]["id"].is_null())
        .collect();
    assert!(disks.is_empty(), "{resources:#}");
}

/// Defect 3: a CreateVolume answer whose context held 2 MB in 5,000 entries was stored
/// and copied into the disk's metadata (25 of them: ~590 MiB peak, 115 MiB of state).
/// Now each is refused at the 16 KiB map bound and its volume deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_volume_contexts_are_refused_and_memory_and_state_stay_small() {
    let Some(mut s) = Setup::new(Misbehaviour {
        create: CreateAnswer::Context {
            entries: 5000,
            value_bytes: 400,
        },
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.ready().await;
    for _ in 0..25 {
        let op = s.create_disk("1MiB").await;
        assert_eq!(op["state"], "OPERATION_FAILED", "{op:#}");
        let message = op["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("volume_context holds 2050000 bytes in 5000 entries, over the bound of 16384 (setting csi.max_map_bytes)"),
            "{message}"
        );
    }
    assert_eq!(s.plugin.seen().deletes.len(), 25);
    assert!(s.plugin.volumes().is_empty());
    let resources = s.d.http("GET", "/resources", &[], None).await;
    let state = tree_bytes(&s.d.state_dir().join("providers"));
    let peak = s.peak_mib();
    eprintln!(
        "25 refused 2 MB contexts: daemon peak {peak} MiB, provider state {state} bytes, /resources {} bytes",
        resources.body.len()
    );
    assert!(peak < 256, "peak {peak} MiB");
    assert!(state < 16 << 20, "state {state} bytes");
    assert!(
        resources.body.len() < 64 << 10,
        "{} bytes",
        resources.body.len()
    );
}

/// Defect 4: a CreateVolume answer slrp could not store (an id with NUL, one of 10,000
/// bytes) left an intent that was sent again at every start, so the plugin created the
/// volume again. Now the answer is settled: the volume deleted by the id the plugin gave,
/// the name never created again, after a restart either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_is_settled_and_never_created_again() {
    let Some(mut s) = Setup::new(Misbehaviour::default()) else {
        return;
    };
    s.ready().await;
    let long = "L".repeat(10_000);
    let ids = [String::from("with\0nul"), long];
    let mut ops = Vec::new();
    for id in &ids {
        s.plugin.set(Misbehaviour {
            create: CreateAnswer::Id(id.clone()),
            ..Misbehaviour::default()
        });
        ops.push(s.create_disk("1MiB").await);
    }
    let creates_before = s.plugin.seen().creates;
    assert_eq!(creates_before.len(), 2, "{creates_before:?}");
    assert!(
        creates_before.values().all(|n| *n == 1),
        "{creates_before:?}"
    );

    // The defect: after a restart the refused creates were sent again.
    s.plugin.set(Misbehaviour::default());
    s.d.kill9().await;
    s.ready().await;
    s.reconciliations(2).await;
    assert_eq!(
        s.plugin.seen().creates,
        creates_before,
        "created again after the restart"
    );

    // How they were settled: failed, deleted by the ids the plugin gave, listed.
    for op in &ops {
        assert_eq!(op["state"], "OPERATION_FAILED", "{op:#}");
        assert!(
            op["message"]
                .as_str()
                .unwrap_or_default()
                .contains("was deleted"),
            "{op:#}"
        );
    }
    assert_eq!(s.plugin.seen().deletes, ids.to_vec());
    assert!(
        s.plugin.volumes().is_empty(),
        "{:?}",
        s.plugin.volumes().keys()
    );
    let volumes = s.d.ctl(&["volumes"]).await;
    assert_eq!(
        volumes.stdout.matches("CREATE_REFUSED").count(),
        2,
        "{}",
        volumes.describe()
    );
}

/// Defect 5: with ListVolumes failing, the provider stays out of READY and create-disk
/// answered 409 "0 MiB free". Now it is 503 saying the provider is not READY and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_disk_before_ready_is_503_with_the_reason() {
    let Some(mut s) = Setup::new(Misbehaviour {
        list: ListAnswer::Fail(Code::Internal, "the backend is unreachable".into()),
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.d.start();
    s.status_until("the listing failure reported", |v| {
        Setup::provider_status(v)["error"]
            .as_str()
            .is_some_and(|e| e.contains("the backend is unreachable"))
    })
    .await;
    let answer =
        s.d.http(
            "POST",
            "/disks",
            &[("content-type", "application/json")],
            Some(&json!({"profile": PROFILE, "size_bytes": MIB}).to_string()),
        )
        .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    let error = answer.json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.contains(&format!("provider '{PROVIDER}' is not READY")),
        "{error}"
    );
    assert!(error.contains("the backend is unreachable"), "{error}");
    assert!(s.plugin.seen().creates.is_empty());
}

/// Defect 6: plugin strings went unescaped into the text log; an id with a newline
/// forged a log line, a NUL made the log binary. Now every line of the log is a line
/// the daemon wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_strings_cannot_forge_log_lines() {
    const FORGED: &str = "2030-01-01T00:00:00.000000Z ERROR slrp: FORGED";
    let Some(mut s) = Setup::new(Misbehaviour::default()) else {
        return;
    };
    s.ready().await;
    s.plugin.set(Misbehaviour {
        create: CreateAnswer::Id(format!("ok\n{FORGED} id\0")),
        ..Misbehaviour::default()
    });
    let _ = s.create_disk("1MiB").await;
    s.plugin.set(Misbehaviour {
        create: CreateAnswer::Fail(Code::Internal, format!("boom\n{FORGED} message\x1b[2J")),
        ..Misbehaviour::default()
    });
    let _ = s.create_disk("1MiB").await;
    s.plugin.set(Misbehaviour {
        list: ListAnswer::Extra(vec![(format!("listed\n{FORGED} listed"), MIB)]),
        ..Misbehaviour::default()
    });
    s.reconciliations(2).await;
    let raw = std::fs::read(s.d.path("daemon.log")).unwrap();
    let log = String::from_utf8_lossy(&raw);
    assert!(
        log.contains("FORGED"),
        "the plugin's strings were logged: {log}"
    );
    let forged: Vec<_> = log.lines().filter(|l| l.starts_with("2030-")).collect();
    assert!(forged.is_empty(), "forged lines: {forged:#?}");
    for line in log.lines() {
        assert!(
            line.starts_with("20") || line.starts_with("==== daemon start"),
            "a line the daemon did not write: {line:?}"
        );
    }
    assert!(!raw.contains(&0), "a NUL byte in the log");
    assert!(!raw.contains(&0x1b), "an escape sequence in the log");
}

/// Note: one ListVolumes entry with an empty id kept the provider out of READY for good.
/// Now it is skipped, counted, and warned about once; the other volumes are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_id_in_a_listing_is_skipped_and_warned_once() {
    let Some(mut s) = Setup::new(Misbehaviour {
        list: ListAnswer::Extra(vec![(String::new(), MIB)]),
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.plugin.add_volume("pre-existing", 64 * MIB);
    s.ready().await;
    s.d.ctl_json_until(&["resources"], "the listed volume", |r| {
        e2e_support::disk(r, "pre-existing").is_some()
    })
    .await;
    s.reconciliations(4).await;
    assert_eq!(s.log_lines("rule=\"empty\""), 1, "{}", s.d.log());
    let metrics = s.d.http("GET", "/metrics", &[], None).await;
    let skipped = e2e_support::parse_openmetrics(&metrics.body)
        .into_iter()
        .find(|(name, labels, _)| {
            name == "csi_answer_violations_total"
                && labels.get("rule").map(String::as_str) == Some("empty")
        })
        .map(|(_, _, v)| v);
    assert!(skipped.is_some_and(|n| n >= 4.0), "{skipped:?}");
}

/// Note: "Dropping duplicated volume" was logged once per duplicate per reconciliation.
/// Now once per change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicated_volume_is_warned_once_per_change() {
    let Some(mut s) = Setup::new(Misbehaviour {
        list: ListAnswer::Twice,
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.plugin.add_volume("listed-twice", 64 * MIB);
    s.ready().await;
    s.reconciliations(5).await;
    assert_eq!(
        s.log_lines("Dropping duplicated volume"),
        1,
        "{}",
        s.d.log()
    );
    // A change is news: listed once, then twice again.
    s.plugin.set(Misbehaviour::default());
    s.reconciliations(2).await;
    s.plugin.set(Misbehaviour {
        list: ListAnswer::Twice,
        ..Misbehaviour::default()
    });
    s.reconciliations(3).await;
    assert_eq!(
        s.log_lines("Dropping duplicated volume"),
        2,
        "{}",
        s.d.log()
    );
}

/// Note: a negative GetCapacity was read as no space without a word. Now it is warned
/// about, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_capacity_is_warned_once() {
    let Some(mut s) = Setup::new(Misbehaviour {
        capacity: Some(-1),
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.d.start_ready().await;
    s.reconciliations(4).await;
    assert_eq!(
        s.log_lines("available_capacity is negative (-1)"),
        1,
        "{}",
        s.d.log()
    );
}

/// Note: a CreateVolume that timed out was visible only in the log at INFO, while
/// `operations` said PENDING with no reason. Now the pending operation carries the last
/// error and the time of the next retry until the call ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_shows_its_last_error_and_next_retry() {
    let Some(mut s) = Setup::new(Misbehaviour::default()) else {
        return;
    };
    s.ready().await;
    s.plugin.set(Misbehaviour {
        create: CreateAnswer::Fail(Code::DeadlineExceeded, "the backend is slow".into()),
        ..Misbehaviour::default()
    });
    let started =
        s.d.ctl_json(&["create-disk", "--profile", PROFILE, "--size", "1MiB"])
            .await;
    let uuid = started["operation_uuid"].as_str().unwrap().to_owned();
    let ops =
        s.d.ctl_json_until(&["operations"], "the retried create's last error", |v| {
            v.as_array().unwrap().iter().any(|o| {
                o["operation_uuid"] == uuid.as_str()
                    && o["last_error"]
                        .as_str()
                        .is_some_and(|e| e.contains("the backend is slow"))
            })
        })
        .await;
    let op = ops
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["operation_uuid"] == uuid.as_str())
        .unwrap();
    assert_eq!(op["state"], "OPERATION_PENDING", "{op:#}");
    assert!(
        op["last_error"]
            .as_str()
            .unwrap()
            .starts_with("CreateVolume failed with DeadlineExceeded"),
        "{op:#}"
    );
    assert!(
        op["next_retry"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{op:#}"
    );
    let text = s.d.ctl(&["operations"]).await;
    assert!(text.stdout.contains("retrying at"), "{}", text.describe());
    let detail = s.d.ctl(&["operations", &uuid]).await;
    assert!(
        detail.stdout.contains("last error:") && detail.stdout.contains("next retry:"),
        "{}",
        detail.describe()
    );
    // Once the plugin answers, the operation finishes and the retry state is gone.
    s.plugin.set(Misbehaviour::default());
    let ops =
        s.d.ctl_json_until(&["operations"], "the create finished", |v| {
            v.as_array()
                .unwrap()
                .iter()
                .any(|o| o["operation_uuid"] == uuid.as_str() && o["state"] == "OPERATION_FINISHED")
        })
        .await;
    let op = ops
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["operation_uuid"] == uuid.as_str())
        .unwrap();
    assert!(op["last_error"].is_null(), "{op:#}");
}

/// `ctl --json create-disk --wait` of 1 MiB, FINISHED; the volume id.
async fn created(s: &Setup) -> String {
    let op = s.create_disk("1MiB").await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op:#}");
    op["volume_id"].as_str().unwrap().to_owned()
}

/// Volume health (issue #22): a plugin that advertises none of GET_VOLUME_STATS,
/// GET_VOLUME and VOLUME_CONDITION is never asked them, published volumes included, while
/// the poller would ask every 200 ms; its volumes' HEALTH is `-`, with no usage and no
/// `slrp_volume_stats_*` series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_without_the_health_capabilities_is_never_asked_about_its_volumes() {
    let Some(mut s) = Setup::new(Misbehaviour::default()) else {
        return;
    };
    s.ready().await;
    let id = created(&s).await;
    s.d.ctl_ok(&["publish", &id]).await;
    // Three reconciliations (1 s apart) are fifteen poller intervals.
    s.reconciliations(3).await;
    let seen = s.plugin.seen();
    assert_eq!(
        (seen.stats_calls, seen.get_volume_calls),
        (0, 0),
        "{seen:?}"
    );
    let volumes = s.d.ctl_json(&["volumes"]).await;
    let v = e2e_support::volume(&volumes, &id).unwrap();
    assert_eq!(v["state"], "PUBLISHED", "{v:#}");
    assert!(v.get("health").is_none(), "{v:#}");
    let table = s.d.ctl_ok(&["volumes"]).await;
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{}", table.describe()));
    assert!(row.ends_with("-     -"), "USED and HEALTH are '-': {row:?}");
    let metrics = s.d.http("GET", "/metrics", &[], None).await;
    assert!(
        !metrics.body.contains("slrp_volume_stats_used_bytes{"),
        "{}",
        metrics.body
    );
}

/// Volume health (issue #22): a plugin that hangs in every NodeGetVolumeStats (the poller
/// waits a minute for each) delays neither CREATE_DISK nor a publish: both finish within a
/// bound far below that minute while the poller's calls are still hanging (none has
/// failed yet: its failure counter is still 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_hanging_in_node_get_volume_stats_delays_neither_create_disk_nor_publish() {
    let Some(mut s) = Setup::new(Misbehaviour {
        health: HealthAnswer::HangStats,
        ..Misbehaviour::default()
    }) else {
        return;
    };
    s.ready().await;
    let first = created(&s).await;
    s.d.ctl_ok(&["publish", &first]).await;
    s.d.within("the poller's first NodeGetVolumeStats", async {
        while s.plugin.seen().stats_calls == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;

    // The bound: a quarter of the poller's 60 s deadline, for both operations together.
    let bound = Duration::from_secs(15);
    let started = tokio::time::Instant::now();
    let second = created(&s).await;
    s.d.ctl_ok(&["publish", &second]).await;
    let took = started.elapsed();
    assert!(
        took < bound,
        "create-disk and publish took {took:?} while NodeGetVolumeStats hangs"
    );
    assert!(s.plugin.seen().stats_calls >= 1);
    let metrics = s.d.http("GET", "/metrics", &[], None).await;
    let samples = e2e_support::parse_openmetrics(&metrics.body);
    let failed = samples
        .iter()
        .find(|(name, labels, _)| {
            name == "slrp_volume_health_failures_total"
                && labels.get("rpc").map(String::as_str) == Some("NodeGetVolumeStats")
        })
        .map_or(0.0, |(_, _, v)| *v);
    assert_eq!(failed, 0.0, "the hanging calls are still in flight");
    let calls = samples
        .iter()
        .find(|(name, labels, _)| {
            name == "slrp_volume_health_calls_total"
                && labels.get("rpc").map(String::as_str) == Some("NodeGetVolumeStats")
        })
        .map_or(0.0, |(_, _, v)| *v);
    assert!(calls >= 1.0, "{}", metrics.body);
}
