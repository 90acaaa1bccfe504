//! The user-level harness: `slrp standalone` as a child process on a temporary state
//! directory, and `slrp ctl` run as a user runs it, reading only what a user reads (its
//! output and exit code, the admin endpoint, the files under the mount).
//!
//! Every wait is bounded ([`WAIT`]) and fails with the daemon's log. Dropping a
//! [`Standalone`] (also while panicking) SIGKILLs the daemon and every process whose
//! command line names the test's directory (the plugin a SIGKILLed daemon leaves behind),
//! then unmounts whatever is mounted under it and detaches its loop devices, so nothing
//! outlives the test.

// Shared by several test binaries; each uses a part.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{processes_mentioning, unmount_under};

/// How long any single wait may take (a hang guard, never a timing assertion).
pub const WAIT: Duration = Duration::from_secs(90);

/// The default provider's key (`<type>.<name>`, FIXED defaults of `slrp standalone`).
pub const PROVIDER: &str = "org.apache.mesos.rp.local.storage.local";

/// What `slrp ctl` did: its exit code and output.
#[derive(Debug)]
pub struct Ctl {
    /// The command line, for failure messages.
    pub args: Vec<String>,
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ctl {
    /// The last non-empty line of the standard output.
    pub fn last_line(&self) -> &str {
        self.stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default()
            .trim()
    }

    /// For failure messages.
    pub fn describe(&self) -> String {
        format!(
            "slrp {}: exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }
}

/// An HTTP answer: status, headers (names lower-cased) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Answer {
    /// The body as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// A `slrp standalone` daemon on its own temporary directory.
#[derive(Debug)]
pub struct Standalone {
    /// The test's directory: `state/` (`--state-dir`), `daemon.log`, whatever the test adds.
    pub dir: tempfile::TempDir,
    /// Flags after `slrp standalone --state-dir <state>`.
    pub extra_args: Vec<String>,
    child: Option<tokio::process::Child>,
    starts: usize,
    log_shown: std::cell::Cell<bool>,
}

impl Standalone {
    /// A directory for the daemon; nothing is started. The bundled plugin is built beside
    /// `slrp` if absent (standalone finds it there).
    pub fn new() -> Self {
        let plugin = slrp_test_support::csi_local_bin();
        let beside = Path::new(env!("CARGO_BIN_EXE_slrp")).with_file_name("slrp-csi-local");
        assert!(
            beside.exists(),
            "slrp-csi-local is not beside slrp ({} vs {})",
            plugin.display(),
            beside.display()
        );
        let dir = tempfile::tempdir().unwrap();
        Self {
            dir,
            extra_args: Vec::new(),
            child: None,
            starts: 0,
            log_shown: std::cell::Cell::new(false),
        }
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn admin_socket(&self) -> PathBuf {
        self.state_dir().join("admin.sock")
    }

    /// Starts `slrp standalone --state-dir <state> <extra args>` with its output appended
    /// to `daemon.log` (a banner per start).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the daemon is already running");
        self.starts += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("daemon.log"))
            .unwrap();
        std::io::Write::write_all(
            &mut log,
            format!("==== daemon start {} ====\n", self.starts).as_bytes(),
        )
        .unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_slrp"))
            .arg("standalone")
            .arg("--state-dir")
            .arg(self.state_dir())
            .args(&self.extra_args)
            .env("SLRP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Starts the daemon and waits until `slrp ctl status` says it is ready.
    pub async fn start_ready(&mut self) {
        self.start();
        self.wait_ready().await;
    }

    /// A READY daemon with the defaults, or `None` where the test may not run (no root,
    /// outside CI: [`require_root`]).
    pub async fn ready_as_root() -> Option<Self> {
        if !require_root() {
            return None;
        }
        let mut d = Self::new();
        d.start_ready().await;
        Some(d)
    }

    /// The daemon's pid while it runs.
    pub fn pid(&self) -> Option<Pid> {
        self.child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .and_then(|p| i32::try_from(p).ok())
            .map(Pid::from_raw)
    }

    /// Whether the daemon has exited on its own: its status if so.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// Waits for the daemon to exit on its own (e.g. refusing its config).
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon not started");
        match tokio::time::timeout(WAIT, child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                self.child = Some(child);
                self.fail("the daemon did not exit")
            }
        }
    }

    /// SIGKILL, as a crash; the plugin it started may live on.
    pub async fn kill9(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGKILL).await
    }

    /// SIGTERM; returns the exit status.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGTERM).await
    }

    /// SIGTERM: the exit status must be 0 and no process of this test's directory may be
    /// left (the plugins are stopped with the daemon).
    pub async fn stop_cleanly(&mut self) {
        let status = self.terminate().await;
        if !status.success() {
            self.fail(&format!("the daemon exited with {status} after SIGTERM"));
        }
        let dir = self.dir.path().to_owned();
        self.within("the plugins to stop with the daemon", async {
            while !processes_mentioning(&dir).is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    async fn signal_and_wait(&mut self, signal: Signal) -> ExitStatus {
        let Some(pid) = self.pid() else {
            self.fail("the daemon is not running")
        };
        kill(pid, signal).unwrap();
        self.wait_exit().await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    /// Panics with `what` and the daemon's log.
    pub fn fail(&self, what: &str) -> ! {
        self.log_shown.set(true);
        panic!(
            "{what}\n---- daemon log ({}) ----\n{}---- end of daemon log ----",
            self.path("daemon.log").display(),
            self.log()
        )
    }

    /// Runs `f` under the hang guard; on timeout fails with `what` and the log.
    pub async fn within<T>(&self, what: &str, f: impl Future<Output = T>) -> T {
        match tokio::time::timeout(WAIT, f).await {
            Ok(v) => v,
            Err(_) => self.fail(&format!("timed out: {what}")),
        }
    }

    // ---- slrp ctl ----

    /// `slrp ctl --admin <state>/admin.sock ARGS`.
    pub async fn ctl(&self, args: &[&str]) -> Ctl {
        let mut full = vec!["ctl".to_owned(), "--admin".to_owned()];
        full.push(self.admin_socket().display().to_string());
        full.extend(args.iter().map(|a| (*a).to_owned()));
        self.run_slrp(env!("CARGO_BIN_EXE_slrp").as_ref(), &full, None)
            .await
    }

    /// `program ARGS` (a `slrp` binary), optionally as another user; bounded by [`WAIT`].
    pub async fn run_slrp(&self, program: &Path, args: &[String], uid: Option<u32>) -> Ctl {
        run_bounded(program, args, uid)
            .await
            .unwrap_or_else(|e| self.fail(&e))
    }

    /// `slrp ctl ARGS`, which must exit 0.
    pub async fn ctl_ok(&self, args: &[&str]) -> Ctl {
        let out = self.ctl(args).await;
        if out.code != Some(0) {
            self.fail(&format!("expected exit 0: {}", out.describe()));
        }
        out
    }

    /// `slrp ctl --json ARGS`, which must exit 0 and print JSON.
    pub async fn ctl_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["--json"];
        full.extend_from_slice(args);
        let out = self.ctl_ok(&full).await;
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            self.fail(&format!("not JSON ({e}): {}", out.describe()));
        })
    }

    /// Polls `slrp ctl --json status` until the daemon says it is ready (exit 2 while it
    /// does not listen yet); fails at once if the daemon exits.
    pub async fn wait_ready(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = None;
        loop {
            if let Some(status) = self.exited() {
                self.fail(&format!("the daemon exited with {status} before READY"));
            }
            let out = self.ctl(&["--json", "status"]).await;
            if out.code == Some(0)
                && let Ok(v) = serde_json::from_str::<Value>(&out.stdout)
                && v["ready"] == true
            {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                let last = last.map_or_else(String::new, |o: Ctl| o.describe());
                self.fail(&format!("timed out: READY; last status:\n{last}"));
            }
            last = Some(out);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Polls `slrp ctl --json ARGS` until `want` holds; returns the value.
    pub async fn ctl_json_until(
        &self,
        args: &[&str],
        what: &str,
        want: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let v = self.ctl_json(args).await;
            if want(&v) {
                return v;
            }
            if tokio::time::Instant::now() > deadline {
                self.fail(&format!("timed out: {what}; last answer: {v:#}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // ---- the admin endpoint, raw ----

    /// One HTTP request on the admin socket; fails the test if nothing answers.
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Answer {
        http_unix(&self.admin_socket(), method, path, headers, body)
            .await
            .unwrap_or_else(|| {
                self.fail(&format!("{method} {path}: no answer on the admin socket"))
            })
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.log_shown.get() {
            eprintln!(
                "---- daemon log at the failure ----\n{}---- end ----",
                self.log()
            );
        }
        if let Some(pid) = self.pid() {
            let _ = kill(pid, Signal::SIGKILL);
        }
        // A SIGKILLed daemon leaves its plugin; only processes naming this test's
        // directory are ours, killed by pid.
        for pid in processes_mentioning(self.dir.path()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        unmount_under(self.dir.path());
    }
}

/// `program ARGS` (a `slrp` binary), optionally as user and group `uid`, without the
/// environment's `SLRP_ADMIN*`; `Err` if it runs longer than [`WAIT`].
pub async fn run_bounded(program: &Path, args: &[String], uid: Option<u32>) -> Result<Ctl, String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_remove("SLRP_ADMIN")
        .env_remove("SLRP_ADMIN_TOKEN_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(uid) = uid {
        // std drops the supplementary groups when root sets a uid.
        cmd.uid(uid).gid(uid);
    }
    let out = match tokio::time::timeout(WAIT, cmd.output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => {
            return Err(format!(
                "timed out: {} {}",
                program.display(),
                args.join(" ")
            ));
        }
    };
    Ok(Ctl {
        args: args.to_vec(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `slrp ctl --admin ADMIN ARGS` with this build's `slrp`.
pub async fn ctl_at(admin: &str, args: &[&str]) -> Ctl {
    let mut full = vec!["ctl".to_owned(), "--admin".to_owned(), admin.to_owned()];
    full.extend(args.iter().map(|a| (*a).to_owned()));
    run_bounded(env!("CARGO_BIN_EXE_slrp").as_ref(), &full, None)
        .await
        .unwrap()
}

/// One HTTP request on a unix socket; `None` if nothing answers.
pub async fn http_unix(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Option<Answer> {
    let stream = tokio::net::UnixStream::connect(socket).await.ok()?;
    exchange(stream, &http_request(method, path, headers, body)).await
}

/// An HTTP/1.0 request with `Connection: close` (the answer ends with the connection).
pub fn http_request(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> String {
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or_default());
    req
}

/// Writes `request`, reads the answer to the end; `None` if it is cut short or malformed.
pub async fn exchange<S>(mut stream: S, request: &str) -> Option<Answer>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A resource's `disk.source`.
pub fn source(r: &Value) -> &Value {
    &r["disk"]["source"]
}

/// The storage pool of `profile` in `resources` (RAW, that profile, no id): its size in MB.
pub fn pool_mb(resources: &Value, profile: &str) -> Option<f64> {
    resources.as_array()?.iter().find_map(|r| {
        let s = source(r);
        (s["type"] == "RAW" && s["profile"] == profile && s["id"].is_null())
            .then(|| r["scalar"]["value"].as_f64())
            .flatten()
    })
}

/// The disk resource whose `disk.source.id` is `id`.
pub fn disk<'a>(resources: &'a Value, id: &str) -> Option<&'a Value> {
    resources.as_array()?.iter().find(|r| source(r)["id"] == id)
}

/// The volume `id` in `ctl --json volumes`.
pub fn volume<'a>(volumes: &'a Value, id: &str) -> Option<&'a Value> {
    volumes.as_array()?.iter().find(|v| v["volume_id"] == id)
}

/// Whether `path` is a mount point (listed in `/proc/self/mountinfo`).
pub fn is_mount_point(path: &Path) -> bool {
    crate::support::mounts_under(path.parent().unwrap_or(path))
        .iter()
        .any(|p| p == path)
}

/// OpenMetrics text parsed into `(name{labels}, value)` samples; panics with the text
/// unless it is well-formed: every sample line `name[{labels}] value`, `# TYPE`/`# HELP`/
/// `# UNIT` comments, and `# EOF` as the last line.
pub fn parse_openmetrics(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "no final # EOF:\n{text}");
    let mut samples = Vec::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                ["TYPE ", "HELP ", "UNIT "]
                    .iter()
                    .any(|k| comment.starts_with(k)),
                "unexpected comment {line:?}:\n{text}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}:\n{text}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("bad value in {line:?} ({e}):\n{text}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let rest = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels in {line:?}:\n{text}"));
                let labels = rest
                    .split(',')
                    .filter(|l| !l.is_empty())
                    .map(|l| {
                        let (k, v) = l
                            .split_once('=')
                            .unwrap_or_else(|| panic!("bad label in {line:?}:\n{text}"));
                        (k.to_owned(), v.trim_matches('"').to_owned())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}:\n{text}"
        );
        samples.push((name.to_owned(), labels, value));
    }
    samples
}

/// `ctl create-disk --wait --json`: the operation FINISHED; its `volume_id`.
pub async fn create_disk(d: &Standalone, profile: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "create-disk",
        "--profile",
        profile,
        "--size",
        "64MiB",
        "--wait",
    ];
    args.extend_from_slice(extra);
    let op = d.ctl_json(&args).await;
    assert_eq!(op["state"], "OPERATION_FINISHED", "{op:#}");
    assert_eq!(op["type"], "CREATE_DISK", "{op:#}");
    match op["volume_id"].as_str() {
        Some(id) if !id.is_empty() => id.to_owned(),
        _ => d.fail(&format!("create-disk --json has no volume_id: {op:#}")),
    }
}

/// The root check of every test here: standalone needs root (mounts, loop devices).
pub fn require_root() -> bool {
    slrp_test_support::require_root(&slrp_test_support::current_test())
}
