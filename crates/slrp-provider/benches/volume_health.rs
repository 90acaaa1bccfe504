//! The volume health poller's cost (issue #22, "Must show"). Not a test: it prints a table
//! and asserts only that every volume was sampled (docs/benchmarks.md has figures).
//!
//! `cargo bench -p slrp-provider --bench volume_health -- [--quick] [--volumes N]...`
//!
//! The poller of one provider ([`HealthPoller`], default settings: 60 s interval,
//! 4 calls in flight) asks `NodeGetVolumeStats` of N published volumes through its real
//! CSI client (gRPC on a unix socket) of a plugin that answers at once: the operations
//! benchmark's plugin, run in a child process (this binary again, with a hidden argument)
//! so that this process's CPU time and memory are the poller's own. The volume list comes
//! from a source that builds it afresh on every read, as the volume manager's snapshot
//! does.
//!
//! For each N (default 1,000 and 10,000): one interval to let every volume come due
//! (spread over it), then one interval measured: the CPU time of this process over it
//! (user + system, from `/proc/self/stat`) as a share of one core, the calls per second,
//! and the resident memory (and live heap) above what the process held before the poller
//! started. `--quick` uses a 6 s interval (the share is then ten times the default's).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs,
    reason = "benchmark binary"
)]

#[allow(
    dead_code,
    reason = "the operations benchmark's plugin; not all of it is used here"
)]
#[path = "operations/plugin.rs"]
mod plugin;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_csi::{ClientConfig, CsiClient, CsiEndpoint, CsiMetrics, CsiServices, CsiVersion};
use slrp_csi::{VersionSelect, VolumeId};
use slrp_provider::health::{
    ControllerCheck, HealthConfig, HealthMetrics, HealthPoller, Plan, TrackedVolume, VolumeSource,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

slrp_provider::use_jemalloc!();

/// The volume list, built afresh on every read (as the volume manager's snapshot is).
struct Published(usize);

impl VolumeSource for Published {
    fn target(&self, id: &VolumeId) -> Option<String> {
        Some(format!(
            "/var/lib/slrp/work/csi/org.slrp.bench/fast/mounts/{id}/target"
        ))
    }

    async fn tracked(&self) -> Option<Vec<TrackedVolume>> {
        Some(
            (0..self.0)
                .map(|i| TrackedVolume {
                    id: VolumeId::new(format!("bench-volume-{i:06}")),
                    published: true,
                })
                .collect(),
        )
    }
}

/// `utime + stime` of this process, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY-free: the clock tick is 100 Hz on every Linux this runs on (USER_HZ).
    ticks / 100.0
}

/// `VmRSS` of this process, KiB.
fn rss_kib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn heap_bytes() -> f64 {
    #[allow(clippy::cast_precision_loss, reason = "MiB for display")]
    let b = slrp_provider::allocator::heap_in_use().unwrap_or(0) as f64;
    b
}

/// The 1-minute load average: the machine is shared, figures depend on it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

struct Figures {
    volumes: usize,
    cpu_share: f64,
    calls_per_second: f64,
    rss_mib: f64,
    heap_mib: f64,
    sampled: usize,
}

async fn measure(socket: &std::path::Path, volumes: usize, interval: Duration) -> Figures {
    let cfg = HealthConfig {
        interval,
        ..HealthConfig::default()
    };
    let client_cfg = ClientConfig::default()
        .version(VersionSelect::Force(CsiVersion::V1))
        .rpc_timeout(cfg.timeout);
    let endpoint = CsiEndpoint::parse(&format!("unix://{}", socket.display())).unwrap();
    let client = CsiClient::new(endpoint, client_cfg, CsiMetrics::default()).unwrap();
    // One call first: the connection is made before the baseline is read.
    client
        .node_stats(&VolumeId::new("warm-up"), "/warm-up")
        .await
        .unwrap();
    let services = CsiServices::node_only(client);
    let plan = Plan {
        stats: true,
        node_condition: true,
        controller: ControllerCheck::None,
    };
    let metrics = HealthMetrics::default().provider("bench.poller", None);
    let poller = HealthPoller {
        cfg,
        plan,
        calls: services,
        source: Published(volumes),
        metrics: metrics.clone(),
        moved: Arc::new(tokio::sync::Notify::new()),
    };
    let (rss_before, heap_before) = (rss_kib(), heap_bytes());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(poller.run(cancel.clone()));
    // One interval for every volume to come due once (spread over it), a little more
    // for the last ones' calls.
    tokio::time::sleep(interval + Duration::from_millis(500)).await;
    let calls_before = metrics.calls(slrp_csi::CsiRpc::NodeGetVolumeStats);
    let (cpu_before, started) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(interval).await;
    let (cpu_after, elapsed) = (cpu_seconds(), started.elapsed().as_secs_f64());
    let calls = metrics.calls(slrp_csi::CsiRpc::NodeGetVolumeStats) - calls_before;
    let (rss_after, heap_after) = (rss_kib(), heap_bytes());
    let sampled = metrics
        .cache()
        .all()
        .iter()
        .filter(|(_, h)| h.usage.is_some())
        .count();
    assert_eq!(
        metrics.failures(slrp_csi::CsiRpc::NodeGetVolumeStats),
        0,
        "the plugin answers every call"
    );
    cancel.cancel();
    task.await.unwrap();
    #[allow(clippy::cast_precision_loss, reason = "rates for display")]
    let calls = calls as f64;
    Figures {
        volumes,
        cpu_share: (cpu_after - cpu_before) / elapsed,
        calls_per_second: calls / elapsed,
        rss_mib: (rss_after - rss_before) / 1024.0,
        heap_mib: (heap_after - heap_before) / (1024.0 * 1024.0),
        sampled,
    }
}

fn serve_plugin(socket: PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        plugin::FastPlugin::default().serve(&socket).unwrap();
        std::future::pending::<()>().await;
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut quick = false;
    let mut counts = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--serve-plugin" => return serve_plugin(PathBuf::from(args.next().unwrap())),
            "--quick" => quick = true,
            "--volumes" => counts.push(args.next().unwrap().parse::<usize>().unwrap()),
            // `cargo bench` passes `--bench`; anything else is ignored likewise.
            _ => {}
        }
    }
    if counts.is_empty() {
        counts = vec![1_000, 10_000];
    }
    let interval = if quick {
        Duration::from_secs(6)
    } else {
        slrp_provider::health::DEFAULT_INTERVAL
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plugin.sock");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--serve-plugin")
        .arg(&socket)
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "the plugin did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut rows = Vec::new();
        for n in counts {
            rows.push(measure(&socket, n, interval).await);
        }
        rows
    });
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "\n### Volume health poller, interval {interval:?}, concurrency {}, load {}\n",
        slrp_provider::health::DEFAULT_CONCURRENCY,
        load()
    );
    println!(
        "| published volumes | CPU (share of one core) | calls/s | extra RSS | extra live heap | sampled |"
    );
    println!("|---|---|---|---|---|---|");
    for f in &rows {
        println!(
            "| {} | {:.3}% | {:.1} | {:.1} MiB | {:.1} MiB | {} |",
            f.volumes,
            f.cpu_share * 100.0,
            f.calls_per_second,
            f.rss_mib,
            f.heap_mib,
            f.sampled
        );
        assert_eq!(f.sampled, f.volumes, "every volume sampled");
    }
}
