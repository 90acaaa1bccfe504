//! The admin API's refusals (issue #12, "Must show"), as a user meets them through `slrp
//! ctl` and as a client meets them on the wire: the socket's permissions, TCP without or
//! with a wrong bearer token (and a daemon that will not serve TCP without one), malformed
//! JSON, unknown volumes, profiles and operations, and the actions `slrp run` does not
//! offer.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod e2e_support;
mod support;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use e2e_support::{Answer, Ctl, Standalone, ctl_at, http_unix};
use serde_json::Value;

/// `nobody` on Debian and most distributions.
const NOBODY: u32 = 65534;

/// Exit codes of `slrp ctl` (p12 contract, docs/cli.md).
const EXIT_ERROR: i32 = 1;
const EXIT_UNREACHABLE: i32 = 2;
const EXIT_PERMISSION: i32 = 3;
const EXIT_NOT_FOUND: i32 = 4;

/// Asserts `out` exited with `code` and said `needle` (case-insensitive) on stderr.
fn assert_exit(out: &Ctl, code: i32, needle: &str) {
    assert_eq!(out.code, Some(code), "{}", out.describe());
    assert!(
        out.stderr.to_lowercase().contains(&needle.to_lowercase()),
        "stderr does not say {needle:?}: {}",
        out.describe()
    );
}

/// Asserts an error answer: `status`, and an `ErrorBody` with a non-empty `error` and, if
/// given, `field`.
fn assert_refused(answer: &Answer, status: u16, field: Option<&str>) -> Value {
    assert_eq!(answer.status, status, "{answer:?}");
    let body = answer.json();
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "no error message: {answer:?}"
    );
    if let Some(field) = field {
        assert_eq!(body["field"], field, "{answer:?}");
    }
    body
}

/// A copy of `slrp` (a hard link where possible) that another user can run: the build's
/// target directory may be private to root.
fn public_slrp(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = bin.join("slrp");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_slrp"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_slrp"), &exe).unwrap();
    }
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

#[tokio::test]
async fn another_user_is_refused_by_the_socket_mode() {
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let socket = d.admin_socket();
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(
        meta.mode() & 0o777,
        0o600,
        "admin.sock mode {:o}",
        meta.mode()
    );
    assert_eq!(meta.uid(), 0, "admin.sock owner");

    // Only the socket's own mode may stand in the way: the directories above it are
    // opened up for the test.
    for dir in [d.dir.path().to_owned(), d.state_dir()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let slrp = public_slrp(d.dir.path());
    let args: Vec<String> = ["ctl", "--admin", socket.to_str().unwrap(), "status"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let refused = d.run_slrp(&slrp, &args, Some(NOBODY)).await;
    assert_exit(&refused, EXIT_PERMISSION, "permission");
    assert!(
        refused.stderr.contains(socket.to_str().unwrap()),
        "the message names the socket: {}",
        refused.describe()
    );

    // The same user and binary get through once the socket's mode lets them: the
    // refusal above was the mode.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let allowed = d.run_slrp(&slrp, &args, Some(NOBODY)).await;
    assert_eq!(allowed.code, Some(0), "{}", allowed.describe());
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    d.stop_cleanly().await;
}

#[tokio::test]
async fn ctl_without_a_daemon_exits_2_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let out = ctl_at(socket.to_str().unwrap(), &["status"]).await;
    assert_eq!(out.code, Some(EXIT_UNREACHABLE), "{}", out.describe());
    assert!(
        out.stderr.contains(socket.to_str().unwrap()),
        "the message names the socket: {}",
        out.describe()
    );
    // A stale socket file nobody listens on: connection refused, the same answer.
    let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(stale);
    let out = ctl_at(socket.to_str().unwrap(), &["status"]).await;
    assert_eq!(out.code, Some(EXIT_UNREACHABLE), "{}", out.describe());
}

/// A free loopback port (the listener is closed again: the daemon binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP request over TCP to `port` on loopback.
async fn http_tcp(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    e2e_support::exchange(
        stream,
        &e2e_support::http_request("GET", path, headers, None),
    )
    .await
}

/// Gives `d` a `--config` with these `[admin]` settings.
fn admin_config(d: &mut Standalone, admin: &str) {
    let config = d.path("slrp.toml");
    std::fs::write(&config, format!("[admin]\n{admin}")).unwrap();
    d.extra_args = vec!["--config".into(), config.display().to_string()];
}

#[tokio::test]
async fn tcp_needs_the_bearer_token() {
    if !e2e_support::require_root() {
        return;
    }
    let token = format!("t-{}", uuid::Uuid::new_v4().simple());
    let port = free_port();
    let mut d = Standalone::new();
    let token_file = d.path("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let wrong_file = d.path("wrong-token");
    std::fs::write(&wrong_file, "not-the-token\n").unwrap();
    admin_config(
        &mut d,
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
            token_file.display()
        ),
    );
    d.start_ready().await;

    let answer = d
        .within("the TCP listener", async {
            loop {
                if let Some(a) = http_tcp(port, "/status", &[]).await {
                    return a;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await;
    assert_refused(&answer, 401, None);
    assert!(
        answer
            .headers
            .get("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer")),
        "no WWW-Authenticate: Bearer: {answer:?}"
    );
    for bad in ["Bearer not-the-token", "Basic dXNlcjpwYXNz", "Bearer"] {
        let a = http_tcp(port, "/status", &[("Authorization", bad)])
            .await
            .unwrap();
        assert_refused(&a, 401, None);
    }
    let metrics = http_tcp(port, "/metrics/snapshot", &[]).await.unwrap();
    assert_refused(&metrics, 401, None);
    let good_header = format!("Bearer {token}");
    let ok = http_tcp(port, "/status", &[("Authorization", &good_header)])
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.json()["mode"], "standalone", "{ok:?}");

    let url = format!("http://127.0.0.1:{port}");
    let wrong = ctl_at(
        &url,
        &["--token-file", wrong_file.to_str().unwrap(), "status"],
    )
    .await;
    assert_eq!(wrong.code, Some(EXIT_PERMISSION), "{}", wrong.describe());
    let missing = ctl_at(&url, &["status"]).await;
    assert_eq!(
        missing.code,
        Some(EXIT_PERMISSION),
        "{}",
        missing.describe()
    );
    let right = ctl_at(
        &url,
        &["--token-file", token_file.to_str().unwrap(), "status"],
    )
    .await;
    assert_eq!(right.code, Some(0), "{}", right.describe());

    // The unix socket needs no token.
    d.ctl_ok(&["status"]).await;
    d.stop_cleanly().await;
    assert!(
        !d.log().contains(&token),
        "the token is in the daemon's log"
    );
}

#[tokio::test]
async fn tcp_without_a_token_is_refused_at_start() {
    if !e2e_support::require_root() {
        return;
    }
    let port = free_port();
    let mut d = Standalone::new();
    admin_config(&mut d, &format!("listen = \"127.0.0.1:{port}\"\n"));
    d.start();
    let status = d.wait_exit().await;
    assert!(!status.success(), "started with TCP and no token file");
    assert!(
        d.log().contains("token_file"),
        "the refusal does not name token_file:\n{}",
        d.log()
    );
    assert!(http_tcp(port, "/health", &[]).await.is_none(), "TCP served");

    let mut d = Standalone::new();
    let empty = d.path("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    admin_config(
        &mut d,
        &format!(
            "listen = \"127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
            empty.display()
        ),
    );
    d.start();
    let status = d.wait_exit().await;
    assert!(!status.success(), "started with an empty token");
    assert!(
        d.log().to_lowercase().contains("token"),
        "the refusal does not name the token:\n{}",
        d.log()
    );
}

#[tokio::test]
async fn malformed_requests_get_400_naming_the_field() {
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("/disks", r#"{"profile": "mount", "size_bytes": "#, None),
        ("/disks", "not json at all", None),
        ("/disks", r#"["profile", "mount"]"#, None),
        ("/disks", r#"{"size_bytes": 67108864}"#, Some("profile")),
        ("/disks", r#"{"profile": "mount"}"#, Some("size_bytes")),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": "big"}"#,
            Some("size_bytes"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": -1}"#,
            Some("size_bytes"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 0}"#,
            Some("size_bytes"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 67108864, "type": "floppy"}"#,
            Some("type"),
        ),
        (
            "/disks",
            r#"{"profile": "mount", "size_bytes": 67108864, "sise": 1}"#,
            Some("sise"),
        ),
        ("/disks/destroy", r#"{}"#, Some("volume_id")),
        ("/disks/destroy", r#"{"volume_id": 7}"#, Some("volume_id")),
        (
            "/disks/expand",
            r#"{"volume_id": "v", "size_bytes": 0}"#,
            Some("size_bytes"),
        ),
        (
            "/disks/expand",
            r#"{"size_bytes": 1048576}"#,
            Some("volume_id"),
        ),
        ("/volumes/publish", r#"{"volume": "x"}"#, Some("volume")),
        (
            "/volumes/unpublish",
            r#"{"volume_id": ["x"]}"#,
            Some("volume_id"),
        ),
    ];
    for (path, body, field) in cases {
        let answer = d.http("POST", path, &[], Some(body)).await;
        let error = assert_refused(&answer, 400, *field);
        eprintln!("POST {path} {body} → 400 {error}");
    }
    // Nothing was created by any of them.
    let volumes = d.ctl_json(&["volumes"]).await;
    assert_eq!(volumes, Value::Array(vec![]), "{volumes:#}");
    d.stop_cleanly().await;
}

#[tokio::test]
async fn unknown_names_are_404_and_ctl_exits_4() {
    let Some(mut d) = Standalone::ready_as_root().await else {
        return;
    };
    let missing = "no-such-volume";
    for (method, path, body) in [
        ("GET", format!("/volumes/{missing}"), None),
        ("GET", format!("/operations/{}", uuid::Uuid::new_v4()), None),
        ("GET", "/no/such/route".to_owned(), None),
        (
            "POST",
            "/volumes/publish".to_owned(),
            Some(format!(r#"{{"volume_id": "{missing}"}}"#)),
        ),
        (
            "POST",
            "/volumes/unpublish".to_owned(),
            Some(format!(r#"{{"volume_id": "{missing}"}}"#)),
        ),
        (
            "POST",
            "/disks/destroy".to_owned(),
            Some(format!(r#"{{"volume_id": "{missing}", "wait": true}}"#)),
        ),
        (
            "POST",
            "/disks".to_owned(),
            Some(r#"{"profile": "no-such-profile", "size_bytes": 67108864}"#.to_owned()),
        ),
        (
            "POST",
            "/disks".to_owned(),
            Some(
                r#"{"provider": "no.such.provider", "profile": "mount", "size_bytes": 67108864}"#
                    .to_owned(),
            ),
        ),
    ] {
        let answer = d.http(method, &path, &[], body.as_deref()).await;
        assert_refused(&answer, 404, None);
    }

    for args in [
        vec!["publish", missing],
        vec!["unpublish", missing],
        vec!["destroy-disk", missing, "--wait"],
    ] {
        let out = d.ctl(&args).await;
        assert_exit(&out, EXIT_NOT_FOUND, missing);
    }
    let out = d
        .ctl(&[
            "create-disk",
            "--profile",
            "no-such-profile",
            "--size",
            "64MiB",
        ])
        .await;
    assert_exit(&out, EXIT_NOT_FOUND, "no-such-profile");

    // More than the pool holds: 409 on the wire, exit 1 from ctl, and no volume.
    let answer = d
        .http(
            "POST",
            "/disks",
            &[],
            Some(r#"{"profile": "mount", "size_bytes": 1125899906842624}"#),
        )
        .await;
    assert_refused(&answer, 409, None);
    let out = d
        .ctl(&[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            "1024TiB",
            "--wait",
        ])
        .await;
    assert_eq!(out.code, Some(EXIT_ERROR), "{}", out.describe());
    let volumes = d.ctl_json(&["volumes"]).await;
    assert_eq!(volumes, Value::Array(vec![]), "{volumes:#}");
    d.stop_cleanly().await;
}

#[tokio::test]
async fn actions_under_slrp_run_are_403_except_unpublish() {
    let mut c = support::Cluster::fixture().await;
    c.start_daemon();
    c.next_subscribed().await;
    c.admin_ok("/ready").await;
    let socket = c.admin_socket();
    let post = |path: &'static str, body: &'static str| {
        let socket = socket.clone();
        async move {
            http_unix(&socket, "POST", path, &[], Some(body))
                .await
                .unwrap_or_else(|| panic!("POST {path}: no answer"))
        }
    };
    let status = http_unix(&socket, "GET", "/status", &[], None)
        .await
        .unwrap();
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(status.json()["mode"], "run", "{status:?}");
    for (path, body) in [
        ("/disks", r#"{"profile": "test", "size_bytes": 67108864}"#),
        ("/disks/destroy", r#"{"volume_id": "v"}"#),
        ("/volumes/publish", r#"{"volume_id": "v"}"#),
        (
            "/disks/expand",
            r#"{"volume_id": "v", "size_bytes": 67108864}"#,
        ),
        ("/snapshots", r#"{"volume_id": "v"}"#),
        ("/snapshots/delete", r#"{"snapshot_id": "s"}"#),
    ] {
        let body = assert_refused(&post(path, body).await, 403, None);
        assert!(
            body["error"].as_str().unwrap().contains("standalone"),
            "the refusal does not say where the action is offered: {body}"
        );
    }
    // Unpublish is offered under `slrp run`: an unknown volume is a 404, not a 403.
    assert_refused(
        &post("/volumes/unpublish", r#"{"volume_id": "v"}"#).await,
        404,
        None,
    );

    let admin = socket.to_str().unwrap();
    // `--type` spares ctl its profile lookup: the request itself is what is refused.
    let out = ctl_at(
        admin,
        &[
            "create-disk",
            "--profile",
            "test",
            "--size",
            "64MiB",
            "--type",
            "mount",
        ],
    )
    .await;
    assert_exit(&out, EXIT_ERROR, "standalone");
    let out = ctl_at(admin, &["unpublish", "v"]).await;
    assert_eq!(out.code, Some(EXIT_NOT_FOUND), "{}", out.describe());
    c.finish().await;
}
