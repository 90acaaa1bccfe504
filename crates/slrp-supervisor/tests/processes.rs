//! The supervisor with real child processes (`/bin/sh` scripts) and a file-based
//! readiness check: launch, environment, readiness, restart backoff, health restarts,
//! SIGKILL escalation, no leaks, adoption after a restart of slrp.

// An integration-test crate: all of it is test code (the lints target library code).
#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used
)]

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{WAIT, eventually, running};
use prometheus_client::registry::Registry;
use slrp_proto::mesos::v1 as mesos;
use slrp_supervisor::*;
use slrp_types::{Backoff, Jitter};
use tokio_util::sync::CancellationToken;

/// Ready iff the socket path exists (the scripts `touch` it) and no `sick` file is next
/// to it.
struct FileReadiness;

impl ReadinessCheck for FileReadiness {
    fn check<'a>(&'a self, socket: &'a Path) -> CheckFuture<'a> {
        Box::pin(async move {
            let sick = socket.parent().unwrap().join("sick");
            if sick.exists() {
                Readiness::Failed("sick".into())
            } else if socket.exists() {
                Readiness::Ready
            } else {
                Readiness::Failed("no socket".into())
            }
        })
    }
}

fn spec(cmd: &str) -> PluginSpec {
    spec_with(mesos::CommandInfo {
        value: Some(cmd.to_owned()),
        ..Default::default()
    })
}

fn spec_with(command: mesos::CommandInfo) -> PluginSpec {
    let info = mesos::CsiPluginInfo {
        r#type: "io.slrp.test".into(),
        name: Some("p".into()),
        containers: vec![mesos::CsiPluginContainerInfo {
            services: vec![
                mesos::csi_plugin_container_info::Service::ControllerService as i32,
                mesos::csi_plugin_container_info::Service::NodeService as i32,
            ],
            command: Some(command),
            ..Default::default()
        }],
        ..Default::default()
    };
    match deployment_from_info(&info).unwrap() {
        PluginDeployment::Managed(s) => s,
        PluginDeployment::Unmanaged { .. } => panic!("managed expected"),
    }
}

struct Env {
    dir: tempfile::TempDir,
    metrics: SupervisorMetrics,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            metrics: SupervisorMetrics::register(&mut Registry::default()),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self) -> SupervisorConfig {
        let mut c = SupervisorConfig::new(self.path("run"));
        c.socket_base = self.dir.path().to_owned();
        c.socket_poll = Duration::from_millis(5);
        c.ready_probe_interval = Duration::from_millis(20);
        c.health_interval = Duration::from_millis(50);
        c.unhealthy_after = 2;
        c.restart_backoff =
            Backoff::new(Duration::from_millis(100), Duration::from_millis(400)).unwrap();
        c.restart_jitter = Jitter::None;
        c.stop_grace = Duration::from_millis(500);
        c.adopt_poll = Duration::from_millis(20);
        c
    }

    async fn start(&self, spec: PluginSpec, cfg: SupervisorConfig) -> SupervisorHandle {
        common::start(spec, cfg, Arc::new(FileReadiness), &self.metrics).await
    }
}

fn ready_pid(h: &SupervisorHandle) -> i32 {
    match h.state(Service::Node).unwrap() {
        ContainerState::Ready { pid } => pid,
        other => panic!("not ready: {other:?}"),
    }
}

/// The script's common prefix: the socket path from CSI_ENDPOINT.
const SOCK: &str = r#"S="${CSI_ENDPOINT#unix://}";"#;

#[tokio::test]
async fn launches_with_csi_endpoint_and_environment_then_stops_cleanly() {
    let env = Env::new();
    let out = env.path("out");
    let mut cmd = mesos::CommandInfo {
        value: Some(format!(
            r#"{SOCK} echo "$CSI_ENDPOINT|$GREETING|$MESOS_AGENT_ID" > {}; touch "$S"; exec sleep 1000"#,
            out.display()
        )),
        ..Default::default()
    };
    cmd.environment = Some(mesos::Environment {
        variables: vec![mesos::environment::Variable {
            name: "GREETING".into(),
            value: Some("hello".into()),
            ..Default::default()
        }],
    });
    let mut cfg = env.config();
    cfg.agent_id = Some("agent-1".into());
    let h = env.start(spec_with(cmd), cfg).await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    assert_eq!(h.endpoint(Service::Controller).unwrap(), ep);
    let pid = ready_pid(&h);
    assert!(running(pid));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.trim(), format!("{}|hello|agent-1", ep.uri()));
    // The long-lived container directory links to the short socket directory.
    let cdir = env.path("run/containers/io-slrp-test-p--CONTROLLER_SERVICE-NODE_SERVICE");
    assert_eq!(
        std::fs::read_link(cdir.join("endpoint")).unwrap(),
        ep.path().parent().unwrap()
    );
    assert!(cdir.join("pid.json").exists());

    h.shutdown().await;
    assert!(!running(pid), "plugin survived shutdown");
    assert!(!ep.path().exists(), "socket left behind");
    assert!(!cdir.join("pid.json").exists(), "pid record left behind");
}

#[tokio::test]
async fn argv_commands_run_without_a_shell() {
    let env = Env::new();
    let argv0 = env.path("argv0");
    let cmd = mesos::CommandInfo {
        shell: Some(false),
        value: Some("/bin/sh".into()),
        arguments: vec![
            "my-plugin".into(),
            "-c".into(),
            format!(
                r#"{SOCK} echo "$0" > {}; touch "$S"; exec sleep 1000"#,
                argv0.display()
            ),
        ],
        ..Default::default()
    };
    let h = env.start(spec_with(cmd), env.config()).await;
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    assert_eq!(std::fs::read_to_string(&argv0).unwrap().trim(), "my-plugin");
    h.shutdown().await;
}

#[tokio::test]
async fn crash_loop_backs_off_exponentially_up_to_the_cap() {
    let env = Env::new();
    let launches = env.path("launches");
    let h = env
        .start(
            spec(&format!(
                r#"{SOCK} echo x >> {}; touch "$S"; sleep 0.05; exit 3"#,
                launches.display()
            )),
            env.config(),
        )
        .await;
    let mut rx = h.watch(Service::Node).unwrap();
    let mut delays = Vec::new();
    while delays.len() < 5 {
        rx.changed().await.unwrap();
        if let ContainerState::BackingOff { delay, .. } = *rx.borrow_and_update() {
            delays.push(delay.as_millis());
        }
    }
    // 100 ms doubling, capped at 400 ms; jitter off.
    assert_eq!(delays, vec![100, 200, 400, 400, 400]);
    let id = &h.containers()[0].0;
    assert!(env.metrics.terminations(id, TerminationCause::Exited) >= 5);
    assert!(env.metrics.restarts(id) >= 4);
    h.shutdown().await;
    let n = std::fs::read_to_string(&launches).unwrap().lines().count();
    assert!(n >= 5, "{n} launches");
}

#[tokio::test]
async fn backoff_resets_after_a_healthy_period() {
    let env = Env::new();
    let mut cfg = env.config();
    let healthy_reset = Duration::from_millis(100);
    cfg.healthy_reset = healthy_reset;
    // Each run exits only when told to (the file `exit-now` appears), and the test tells
    // it only after it has been ready for longer than `healthy_reset`: how long a run
    // stays ready is the test's decision, not a race against the machine's speed.
    let exit_now = env.path("exit-now");
    let h = env
        .start(
            spec(&format!(
                r#"{SOCK} touch "$S"; while [ ! -e {go} ]; do sleep 0.01; done; rm -f {go}; exit 1"#,
                go = exit_now.display()
            )),
            cfg,
        )
        .await;
    let mut rx = h.watch(Service::Node).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        rx.changed().await.unwrap();
        let state = rx.borrow_and_update().clone();
        match state {
            ContainerState::Ready { .. } => {
                // The supervisor saw it ready before we did, so this is a lower bound.
                tokio::time::sleep(healthy_reset * 2).await;
                std::fs::write(&exit_now, b"").unwrap();
            }
            ContainerState::BackingOff { delay, failures } => {
                seen.push((delay.as_millis(), failures));
            }
            _ => {}
        }
    }
    assert_eq!(seen, vec![(100, 1), (100, 1), (100, 1)]);
    h.shutdown().await;
}

#[tokio::test]
async fn unhealthy_plugin_is_restarted_and_recovers() {
    let env = Env::new();
    let h = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = ready_pid(&h);
    let sick = ep.path().parent().unwrap().join("sick");
    std::fs::write(&sick, b"").unwrap();
    let id = h.containers()[0].0.clone();
    let m = env.metrics.clone();
    eventually("unhealthy termination", || {
        m.terminations(&id, TerminationCause::Unhealthy) == 1
    })
    .await;
    assert!(!running(first), "unhealthy plugin not stopped");
    std::fs::remove_file(&sick).unwrap();
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let second = ready_pid(&h);
    assert_ne!(first, second);
    h.shutdown().await;
    assert!(!running(second));
}

#[tokio::test]
async fn missing_socket_is_a_start_timeout() {
    let env = Env::new();
    let mut cfg = env.config();
    cfg.socket_timeout = Duration::from_millis(200);
    let h = env.start(spec("exec sleep 1000"), cfg).await;
    let id = h.containers()[0].0.clone();
    let m = env.metrics.clone();
    eventually("start timeout", || {
        m.terminations(&id, TerminationCause::StartTimeout) >= 1
    })
    .await;
    h.shutdown().await;
}

#[tokio::test]
async fn stop_escalates_to_sigkill_and_takes_the_whole_group() {
    let env = Env::new();
    let child_pid = env.path("child.pid");
    // Ignores SIGTERM (inherited by its background child) so only SIGKILL works.
    let h = env
        .start(
            spec(&format!(
                r#"{SOCK} trap '' TERM; sleep 1000 & echo $! > {}; touch "$S"; wait"#,
                child_pid.display()
            )),
            env.config(),
        )
        .await;
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let leader = ready_pid(&h);
    let child: i32 = std::fs::read_to_string(&child_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(running(leader) && running(child));
    h.shutdown().await;
    assert!(!running(leader), "leader survived");
    eventually("grandchild killed", || !running(child)).await;
}

#[test]
fn dropping_the_runtime_kills_the_plugin() {
    let env = Env::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pid = rt.block_on(async {
        let h = env
            .start(
                spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
                env.config(),
            )
            .await;
        h.wait_ready(Service::Node, WAIT).await.unwrap();
        let pid = ready_pid(&h);
        // Leak the handle so nothing shuts down in an orderly way.
        std::mem::forget(h);
        pid
    });
    assert!(running(pid));
    drop(rt);
    // SIGKILL was sent synchronously by the worker's drop; the zombie is reaped by init
    // or stays ours until the test process ends, both of which `running` treats as gone.
    let deadline = std::time::Duration::from_secs(5);
    let start = std::time::SystemTime::now();
    while running(pid) {
        assert!(start.elapsed().unwrap() < deadline, "plugin leaked");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn restarted_supervisor_adopts_a_matching_plugin_instead_of_launching_another() {
    let env = Env::new();
    let launches = env.path("launches");
    let cmd = format!(
        r#"{SOCK} echo x >> {}; touch "$S"; exec sleep 1000"#,
        launches.display()
    );
    let first = env.start(spec(&cmd), env.config()).await;
    let ep1 = first.wait_ready(Service::Node, WAIT).await.unwrap();
    let pid = ready_pid(&first);
    first.detach().await;
    assert!(running(pid), "detach must leave the plugin running");

    let second = env.start(spec(&cmd), env.config()).await;
    let ep2 = second.wait_ready(Service::Node, WAIT).await.unwrap();
    assert_eq!(ready_pid(&second), pid, "a second copy was launched");
    assert_eq!(ep1, ep2, "the adopted plugin keeps its socket");
    let id = second.containers()[0].0.clone();
    assert_eq!(env.metrics.adoptions(&id), 1);
    assert_eq!(
        std::fs::read_to_string(&launches).unwrap().lines().count(),
        1
    );

    // An adopted plugin that dies is noticed (by polling) and relaunched.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let m = env.metrics.clone();
    eventually("adopted exit noticed", || {
        m.terminations(&id, TerminationCause::Exited) == 1
    })
    .await;
    second.wait_ready(Service::Node, WAIT).await.unwrap();
    let relaunched = ready_pid(&second);
    assert_ne!(relaunched, pid);
    second.shutdown().await;
    assert!(!running(relaunched));
}

#[tokio::test]
async fn restarted_supervisor_stops_a_plugin_with_an_outdated_configuration() {
    let env = Env::new();
    let old = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    old.wait_ready(Service::Node, WAIT).await.unwrap();
    let old_pid = ready_pid(&old);
    old.detach().await;

    let new = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 999"#)),
            env.config(),
        )
        .await;
    // The old copy is gone before the new one is launched.
    assert!(!running(old_pid), "outdated plugin still running");
    new.wait_ready(Service::Node, WAIT).await.unwrap();
    let new_pid = ready_pid(&new);
    assert_ne!(new_pid, old_pid);
    let id = new.containers()[0].0.clone();
    assert_eq!(env.metrics.terminations(&id, TerminationCause::Stopped), 1);
    new.shutdown().await;
}

#[tokio::test]
async fn leftover_of_a_removed_container_is_stopped_and_its_directory_removed() {
    let env = Env::new();
    let old = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    old.wait_ready(Service::Node, WAIT).await.unwrap();
    let old_pid = ready_pid(&old);
    let old_id = old.containers()[0].0.clone();
    old.detach().await;

    // A different plugin name means a different container id.
    let info = mesos::CsiPluginInfo {
        r#type: "io.slrp.test".into(),
        name: Some("other".into()),
        containers: vec![mesos::CsiPluginContainerInfo {
            services: vec![mesos::csi_plugin_container_info::Service::NodeService as i32],
            command: Some(mesos::CommandInfo {
                value: Some(format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let PluginDeployment::Managed(spec2) = deployment_from_info(&info).unwrap() else {
        panic!()
    };
    let new = env.start(spec2, env.config()).await;
    assert!(!running(old_pid));
    assert!(!env.path("run/containers").join(&old_id).exists());
    new.wait_ready(Service::Node, WAIT).await.unwrap();
    new.shutdown().await;
}

#[tokio::test]
async fn long_runtime_directory_gets_a_short_socket() {
    let env = Env::new();
    let mut cfg = env.config();
    let mut long = env.path("run");
    for _ in 0..5 {
        long.push("a-quite-long-directory-name-for-testing");
    }
    cfg.runtime_dir = long.clone();
    let h = env
        .start(spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)), cfg)
        .await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    assert!(ep.path().as_os_str().len() <= slrp_csi::MAX_SOCKET_PATH);
    let cdir = long.join("containers").join(&h.containers()[0].0);
    let via_link = cdir.join("endpoint").join("endpoint.sock");
    assert!(via_link.as_os_str().len() > slrp_csi::MAX_SOCKET_PATH);
    assert!(
        via_link.exists(),
        "the long path must reach the socket through the link"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_failed_start_leaves_no_plugin_running() {
    let env = Env::new();
    let node_pid = env.path("node.pid");
    let container = |service: mesos::csi_plugin_container_info::Service, cmd: String| {
        mesos::CsiPluginContainerInfo {
            services: vec![service as i32],
            command: Some(mesos::CommandInfo {
                value: Some(cmd),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let info = mesos::CsiPluginInfo {
        r#type: "io.slrp.test".into(),
        name: Some("split".into()),
        containers: vec![
            container(
                mesos::csi_plugin_container_info::Service::NodeService,
                format!(
                    r#"{SOCK} echo $$ > {}; touch "$S"; exec sleep 1000"#,
                    node_pid.display()
                ),
            ),
            container(
                mesos::csi_plugin_container_info::Service::ControllerService,
                format!(r#"{SOCK} touch "$S"; exec sleep 1000"#),
            ),
        ],
        ..Default::default()
    };
    let PluginDeployment::Managed(spec) = deployment_from_info(&info).unwrap() else {
        panic!()
    };
    // The second container's directory cannot be created: a file is in the way.
    let containers = env.path("run/containers");
    std::fs::create_dir_all(&containers).unwrap();
    std::fs::write(containers.join(&spec.containers[1].id), b"").unwrap();

    let result = Supervisor::start(
        spec,
        env.config(),
        Arc::new(FileReadiness),
        env.metrics.clone(),
        CancellationToken::new(),
    )
    .await;
    assert!(result.is_err(), "start must fail");
    // `start` does every fallible step before it spawns its first worker, so a failed
    // start must leave no task behind that could launch a plugin later (checked now, not
    // after a wait that could be too short), and must have launched nothing.
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    if let Ok(text) = std::fs::read_to_string(&node_pid) {
        let pid: i32 = text.trim().parse().unwrap();
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        panic!("a failed start launched plugin {pid}");
    }
    assert_eq!(tasks, 0, "a failed start left {tasks} task(s) running");
}

/// SIGKILLs a test's bystander process group even if an assertion fails first.
struct KillGroupOnDrop(i32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[tokio::test]
async fn a_pid_record_from_an_earlier_boot_is_neither_adopted_nor_stopped() {
    // After a reboot, early-boot services get the same pids at nearly the same start
    // times: a record from the previous boot can name a live, unrelated process.
    let env = Env::new();
    let mut bystander = std::process::Command::new("sleep")
        .arg("1000")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = i32::try_from(bystander.id()).unwrap();
    let _guard = KillGroupOnDrop(pid);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start_time: u64 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();

    let spec = spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#));
    let dir = env.path("run/containers").join(&spec.containers[0].id);
    std::fs::create_dir_all(&dir).unwrap();
    let record = serde_json::json!({
        "process": { "pid": pid, "start_time": start_time },
        "config_hash": spec.containers[0].config_hash(),
        "boot_id": "00000000-0000-0000-0000-000000000000",
    });
    std::fs::write(dir.join("pid.json"), record.to_string()).unwrap();

    let mut cfg = env.config();
    cfg.socket_timeout = Duration::from_millis(200);
    let h = env.start(spec, cfg).await;
    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let id = h.containers()[0].0.clone();
    assert_eq!(env.metrics.adoptions(&id), 0, "adopted a stranger");
    assert!(running(pid), "a stranger's process was stopped");
    assert_ne!(ready_pid(&h), pid);
    h.shutdown().await;
    assert!(running(pid));
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

#[tokio::test]
async fn a_removed_socket_directory_is_recreated_before_the_relaunch() {
    use std::os::unix::fs::PermissionsExt as _;
    let env = Env::new();
    let h = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = ready_pid(&h);
    let sock_dir = ep.path().parent().unwrap().to_owned();
    // A tmp cleaner removes the directory during the run, then the plugin dies.
    std::fs::remove_dir_all(&sock_dir).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut rx = h.watch(Service::Node).unwrap();
    let relaunched = tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| matches!(s, ContainerState::Ready { pid } if *pid != first)),
    )
    .await
    .expect("the plugin never came back ready")
    .unwrap()
    .clone();
    let ContainerState::Ready { pid: second } = relaunched else {
        unreachable!()
    };
    // Same path, so endpoints handed out before stay valid; private again.
    assert_eq!(h.endpoint(Service::Node).unwrap(), ep);
    assert!(ep.path().exists());
    let mode = std::fs::metadata(&sock_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let cdir = env.path("run/containers").join(&h.containers()[0].0);
    assert_eq!(std::fs::read_link(cdir.join("endpoint")).unwrap(), sock_dir);
    h.shutdown().await;
    assert!(!running(second));
    assert!(!sock_dir.exists(), "socket directory left behind");
}

#[tokio::test]
async fn a_socket_directory_taken_by_another_file_is_refused() {
    let env = Env::new();
    let h = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    let ep = h.wait_ready(Service::Node, WAIT).await.unwrap();
    let first = ready_pid(&h);
    let sock_dir = ep.path().parent().unwrap().to_owned();
    // The name in the shared directory is taken by something that is not ours to use.
    std::fs::remove_dir_all(&sock_dir).unwrap();
    std::fs::write(&sock_dir, b"squatter").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let id = h.containers()[0].0.clone();
    let m = env.metrics.clone();
    eventually("launch refused", || {
        m.terminations(&id, TerminationCause::LaunchFailed) >= 1
    })
    .await;
    assert_eq!(std::fs::read(&sock_dir).unwrap(), b"squatter");
    h.shutdown().await;
    assert_eq!(std::fs::read(&sock_dir).unwrap(), b"squatter");
}

/// A `/proc` reader that fails the first `failures` reads and remembers every pid asked.
#[derive(Debug)]
struct FlakyProc {
    failures: std::sync::Mutex<u32>,
    asked: std::sync::Mutex<Vec<i32>>,
}

impl ProcReader for FlakyProc {
    fn start_time(&self, pid: i32) -> std::io::Result<u64> {
        self.asked.lock().unwrap().push(pid);
        let mut left = self.failures.lock().unwrap();
        if *left > 0 {
            *left -= 1;
            return Err(std::io::Error::other("simulated /proc failure"));
        }
        ProcFs.start_time(pid)
    }
}

#[tokio::test]
async fn an_unreadable_start_time_fails_the_launch_without_a_record_and_is_retried() {
    let env = Env::new();
    // Enough failures to exhaust the first launch's reads and part of the second's.
    let proc = Arc::new(FlakyProc {
        failures: std::sync::Mutex::new(7),
        asked: std::sync::Mutex::new(Vec::new()),
    });
    let mut cfg = env.config();
    cfg.proc_reader = proc.clone();
    let spec = spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#));
    let record = env
        .path("run/containers")
        .join(&spec.containers[0].id)
        .join("pid.json");
    let h = env.start(spec, cfg).await;
    let mut rx = h.watch(Service::Node).unwrap();
    tokio::time::timeout(
        WAIT,
        rx.wait_for(|s| matches!(s, ContainerState::BackingOff { .. })),
    )
    .await
    .expect("the launch did not fail")
    .unwrap();
    assert!(
        !record.exists(),
        "a record was written for an unidentified process"
    );
    let id = h.containers()[0].0.clone();
    assert_eq!(
        env.metrics
            .terminations(&id, TerminationCause::LaunchFailed),
        1
    );

    h.wait_ready(Service::Node, WAIT).await.unwrap();
    let pid = ready_pid(&h);
    let asked = proc.asked.lock().unwrap().clone();
    let unidentified = asked[0];
    assert_eq!(asked[..5], [unidentified; 5]);
    assert_eq!(asked[5..], [pid; 3]);
    assert!(
        !running(unidentified),
        "the unidentified process was left running"
    );
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(rec["process"]["pid"], pid);
    assert_eq!(
        rec["process"]["start_time"],
        ProcFs.start_time(pid).unwrap()
    );
    h.shutdown().await;
    assert!(!running(pid));
}

/// Removes a test's directory under the system temp directory even if an assertion fails.
struct RemoveDirOnDrop(PathBuf);

impl Drop for RemoveDirOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn start_sweeps_socket_aliases_left_by_a_killed_slrp() {
    // A CSI client's alias whose process was SIGKILLed: creator gone, target gone.
    let mut dead = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let pid = dead.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start_time: u64 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    dead.kill().unwrap();
    dead.wait().unwrap();
    let alias = std::env::temp_dir().join(format!("slrp-csi-alias-{pid}-{start_time}-sweepT"));
    let _cleanup = RemoveDirOnDrop(alias.clone());
    std::fs::create_dir(&alias).unwrap();
    let env = Env::new();
    std::os::unix::fs::symlink(env.path("gone.sock"), alias.join("endpoint.sock")).unwrap();

    let h = env
        .start(
            spec(&format!(r#"{SOCK} touch "$S"; exec sleep 1000"#)),
            env.config(),
        )
        .await;
    assert!(!alias.exists(), "stale alias not swept");
    h.shutdown().await;
}
