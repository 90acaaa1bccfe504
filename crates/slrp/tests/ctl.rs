//! `slrp ctl` as an operator runs it: the real binary against a real admin endpoint (a
//! `slrp run` daemon beside the embedded manager), or against no daemon at all. The exit
//! codes are the FIXED contract of docs/cli.md.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use support::ops::{FRAMEWORK_ROLE, allocated, create_disk};
use support::{Cluster, DaemonOptions, ProviderSpec, profiles, source};

/// `slrp ctl --admin ADMIN ARGS…`, with no `SLRP_ADMIN*` from the test's environment.
fn ctl(admin: &Path, args: &[&str]) -> Output {
    ctl_command(admin, args).output().unwrap()
}

fn ctl_command(admin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slrp"));
    cmd.arg("ctl")
        .arg("--admin")
        .arg(admin)
        .args(args)
        .env_remove("SLRP_ADMIN")
        .env_remove("SLRP_ADMIN_TOKEN_FILE")
        .env_remove("SLRP_LOG");
    cmd
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
}

#[test]
fn no_daemon_exits_2_and_says_how_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let out = ctl(&socket, &["status"]);
    assert_exit(&out, 2);
    assert_eq!(
        stderr(&out),
        format!(
            "error: slrp is not running (no admin socket at {}); start it with `slrp standalone` or pass --admin\n",
            socket.display()
        )
    );
    assert!(out.stdout.is_empty());

    // SLRP_ADMIN names the socket when --admin is not given; unix:// is accepted.
    let out = Command::new(env!("CARGO_BIN_EXE_slrp"))
        .args(["ctl", "volumes"])
        .env("SLRP_ADMIN", format!("unix://{}", socket.display()))
        .output()
        .unwrap();
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains(&socket.display().to_string()),
        "{}",
        stderr(&out)
    );

    // A socket file a dead daemon left behind: nothing listens.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = ctl(&stale, &["resources"]);
    assert_exit(&out, 2);
    assert!(
        stderr(&out).contains("slrp is not running (nothing listens on"),
        "{}",
        stderr(&out)
    );

    // A closed TCP port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = ctl(
        Path::new(&format!("http://127.0.0.1:{port}")),
        &["operations"],
    );
    assert_exit(&out, 2);
}

#[test]
fn usage_errors_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    for args in [
        &["create-disk", "--profile", "mount", "--size", "12 parsecs"][..],
        &["create-disk", "--profile", "mount", "--size", "0"],
        &["create-disk", "--profile", "mount"],
        &["destroy-disk", "v", "--wait", "--timeout", "0"],
        // --timeout bounds --wait only: alone it would be ignored.
        &["destroy-disk", "v", "--timeout", "10"],
        &[
            "create-disk",
            "--profile",
            "mount",
            "--size",
            "64MiB",
            "--timeout",
            "10",
        ],
        &["no-such-command"],
    ] {
        let out = ctl(&socket, args);
        assert_exit(&out, 64);
    }
    let out = ctl(Path::new("https://127.0.0.1:1"), &["status"]);
    assert_exit(&out, 64);
    assert!(stderr(&out).contains("--admin"), "{}", stderr(&out));
    // A TCP endpoint's token file that does not exist is a usage error, found before any
    // connection.
    let out = ctl(
        Path::new("http://127.0.0.1:1"),
        &["--token-file", "/nonexistent/token", "status"],
    );
    assert_exit(&out, 64);
    assert!(
        stderr(&out).contains("/nonexistent/token"),
        "{}",
        stderr(&out)
    );
}

/// The fixture with profile `test` and its pool, started.
async fn started() -> (Cluster, Value) {
    let mut spec = ProviderSpec::fixture();
    spec.pools = vec!["default=4GiB".to_owned()];
    let mut c = Cluster::new(vec![spec], DaemonOptions::with_profiles()).await;
    c.set_profiles(&profiles(&["test"]));
    c.start_daemon();
    let pool = c.update_where(|u| u.pool("test").is_some()).await;
    let pool = pool.pool("test").unwrap().clone();
    c.admin_ok("/health").await;
    (c, pool)
}

/// Runs `slrp ctl` on the daemon's admin socket off the test's runtime (the daemon and the
/// manager run on it).
async fn ctl_on(c: &Cluster, args: &[&str]) -> Output {
    let socket = c.admin_socket();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ctl(&socket, &args)
    })
    .await
    .unwrap()
}

/// Under `slrp run`: the read commands show the daemon's view (`resources --json` is
/// `/resources` as is), an action of standalone mode is refused (403, exit 1), an unknown
/// volume is exit 4 with the daemon's text, and a known one is unpublished (run mode's
/// only action): its target is no longer mounted.
#[tokio::test]
async fn root_unpublish_and_an_unknown_volume() {
    if !slrp_test_support::require_root("root_unpublish_and_an_unknown_volume") {
        return;
    }
    let (c, pool) = started().await;
    let out = ctl_on(&c, &["unpublish", "no-such-volume"]).await;
    assert_exit(&out, 4);
    assert!(
        stderr(&out).starts_with("error: ") && stderr(&out).contains("no-such-volume"),
        "{}",
        stderr(&out)
    );

    let from = allocated(&pool, FRAMEWORK_ROLE);
    let disk = c.finished_one(create_disk(&from, "MOUNT", None)).await;
    c.published(std::slice::from_ref(&disk)).await;
    let target = c.volume_path(&disk);
    assert!(support::mounts_under(c.dir.path()).contains(&target));
    let id = source(&disk)["id"].as_str().unwrap().to_owned();

    let out = ctl_on(&c, &["status"]).await;
    assert_exit(&out, 0);
    assert!(
        stdout(&out).starts_with("mode:     run\n"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("org.apache.mesos.rp.local.storage.test  READY  yes"),
        "{}",
        stdout(&out)
    );
    let out = ctl_on(&c, &["volumes"]).await;
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(&format!("{id}  PUBLISHED")),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains(&format!("/mounts/{id}/target")),
        "{}",
        stdout(&out)
    );
    // The total reaches the status a little after an operation's status (up to
    // STATUS_TOTAL_MAX_INTERVAL): compare once the served total shows the disk and two
    // reads agree.
    let mut attempts = 0;
    loop {
        let out = ctl_on(&c, &["--json", "resources"]).await;
        assert_exit(&out, 0);
        let (status, body) = c.admin_get("/resources").await.unwrap();
        assert_eq!(status, 200);
        let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
        let served: Value = serde_json::from_str(&body).unwrap();
        attempts += 1;
        let settled = body.contains(&id) && printed == served;
        if settled || attempts == 50 {
            assert!(body.contains(&id), "the total shows {id}: {body}");
            assert_eq!(printed, served, "--json prints /resources as is");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let out = ctl_on(&c, &["resources"]).await;
    assert_exit(&out, 0);
    assert!(
        stdout(&out).contains(&format!("{id}  MOUNT  test")),
        "{}",
        stdout(&out)
    );
    let out = ctl_on(&c, &["publish", &id]).await;
    assert_exit(&out, 1);
    assert!(stderr(&out).contains("(HTTP 403)"), "{}", stderr(&out));

    let out = ctl_on(&c, &["unpublish", &id]).await;
    assert_exit(&out, 0);
    assert_eq!(stdout(&out), format!("unpublished {id} (NODE_READY)\n"));
    assert!(
        !support::mounts_under(c.dir.path()).contains(&target),
        "{} is no longer mounted",
        target.display()
    );
    // --json prints the daemon's body.
    let out = ctl_on(&c, &["--json", "unpublish", &id]).await;
    assert_exit(&out, 0);
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["volume_id"], id.as_str(), "{body}");
    assert_eq!(body["state"], "NODE_READY", "{body}");
    c.finish().await;
}

/// The daemon's socket is mode 0600: another user gets exit 3 and what to do, even with
/// every directory on the way open to it.
#[tokio::test]
async fn root_the_socket_refuses_another_user() {
    if !slrp_test_support::require_root("root_the_socket_refuses_another_user")
        || !slrp_test_support::require_tool("root_the_socket_refuses_another_user", "setpriv")
    {
        return;
    }
    let (c, _pool) = started().await;
    let socket = c.admin_socket();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", socket.display());
    for dir in socket.ancestors().skip(1) {
        if dir == Path::new("/") || dir == std::env::temp_dir() {
            break;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let as_nobody = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "--",
                env!("CARGO_BIN_EXE_slrp"),
                "ctl",
                "--admin",
            ])
            .arg(&socket)
            .arg("status")
            .env_remove("SLRP_ADMIN");
            cmd.output()
        })
        .await
        .unwrap()
    };
    let out = as_nobody.expect("running setpriv");
    assert_exit(&out, 3);
    assert_eq!(
        stderr(&out),
        format!(
            "error: cannot open {}: permission denied; run as root or as the daemon's user\n",
            socket.display()
        )
    );
    c.finish().await;
}

/// Runs `slrp ctl ARGS` (no `--admin` added) with `env`, off the test's runtime.
async fn ctl_env(args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("ctl")
            .args(&args)
            .env_remove("SLRP_ADMIN")
            .env_remove("SLRP_ADMIN_TOKEN_FILE")
            .env_remove("SLRP_LOG")
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The admin API on TCP (`slrp run --admin-listen` with a token file): `slrp ctl` sends
/// the token read from `--token-file` or `SLRP_ADMIN_TOKEN_FILE`; without it, or with a
/// wrong one, the daemon's 401 is exit 3 saying which flag to pass. The token never
/// shows in the output.
#[tokio::test]
async fn tcp_needs_the_token_file() {
    const TOKEN: &str = "ctl-test-token-5d1c";
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut spec = ProviderSpec::fixture();
    spec.pools = vec!["default=4GiB".to_owned()];
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    // The daemon and ctl read the same file the same way, even when it ends in a stray
    // space and tab (an `echo "$T " >` slip), not only in the newline.
    std::fs::write(&token_file, format!("{TOKEN} \t\n")).unwrap();
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, "not-the-token\n").unwrap();
    let mut options = DaemonOptions::with_profiles();
    options.extra_args = vec![
        "--admin-listen".to_owned(),
        format!("127.0.0.1:{port}"),
        "--admin-token-file".to_owned(),
        token_file.display().to_string(),
    ];
    let mut c = Cluster::new(vec![spec], options).await;
    c.set_profiles(&profiles(&["test"]));
    c.start_daemon();
    c.update_where(|u| u.pool("test").is_some()).await;
    c.admin_ok("/health").await;

    let url = format!("http://127.0.0.1:{port}");
    let with = |extra: &[&str]| -> Vec<String> {
        let mut args = vec!["--admin".to_owned(), url.clone()];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    };
    let token_arg = token_file.display().to_string();
    let out = ctl_env(
        with(&["--token-file", &token_arg, "--json", "status"]),
        vec![],
    )
    .await;
    assert_exit(&out, 0);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["mode"], "run", "{status}");

    let out = ctl_env(
        with(&["status"]),
        vec![("SLRP_ADMIN_TOKEN_FILE", token_arg.clone())],
    )
    .await;
    assert_exit(&out, 0);
    // SLRP_ADMIN names the TCP endpoint as well.
    let out = ctl_env(
        vec!["volumes".to_owned()],
        vec![
            ("SLRP_ADMIN", url.clone()),
            ("SLRP_ADMIN_TOKEN_FILE", token_arg.clone()),
        ],
    )
    .await;
    assert_exit(&out, 0);

    let out = ctl_env(with(&["status"]), vec![]).await;
    assert_exit(&out, 3);
    assert!(stderr(&out).contains("--token-file"), "{}", stderr(&out));
    let wrong_arg = wrong_file.display().to_string();
    let out = ctl_env(with(&["--token-file", &wrong_arg, "resources"]), vec![]).await;
    assert_exit(&out, 3);
    assert!(!stdout(&out).contains(TOKEN) && !stderr(&out).contains(TOKEN));
    assert!(!stderr(&out).contains("not-the-token"), "{}", stderr(&out));
    c.finish().await;
}
