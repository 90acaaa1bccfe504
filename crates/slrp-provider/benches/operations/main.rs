//! The operations benchmark (issue #11, "Must show"). Not a test: it prints a table and
//! asserts only that the operations it drives succeed (docs/benchmarks.md has figures).
//!
//! `cargo bench -p slrp-provider --bench operations -- [--quick] [--dir DIR]`
//!
//! Everything goes the way of a deployment: the embedded manager (as agent and master)
//! over real HTTP on a unix socket, the provider worker and its plugin stack, and a CSI v1
//! plugin on a real unix socket that answers at once (`plugin.rs`, volumes in a map), so
//! the figures are the provider's own cost. One process, except for the restarted
//! provider of step 4, which runs in a child process (this binary again, with a hidden
//! argument) so that its resident memory is its own.
//!
//! 1. Bare CSI: CreateVolume + DeleteVolume pairs straight to the plugin through
//!    `slrp_csi::CsiClient`, at concurrency 1, 16 and 64.
//! 2. CREATE_DISK + DESTROY_DISK pairs through the manager (apply, wait for the terminal
//!    status, acknowledged automatically) with `small` volumes tracked, at 1, 16 and 64.
//! 3. The same with `large` volumes tracked (cost flat with volume count?).
//! 4. `unacked` operations left unacknowledged, the provider stopped and started again
//!    on the same state, in a child process: time from start to READY (and until every
//!    unacknowledged status was resent and acknowledged), and its resident memory.
//!
//! DIR holds the store; it must be on the disk under test (default: the system temp dir).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs,
    reason = "benchmark binary"
)]

mod plugin;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use slrp_agent::{AgentConfig, AgentEndpoint};
use slrp_core::provider::lifecycle::Lifecycle;
use slrp_csi::{ClientConfig, CreateVolumeRequest, CsiClient, CsiEndpoint, CsiMetrics, Secrets};
use slrp_manager::{
    AckPolicy, ApplyRequest, EmbeddedManager, Listen, ManagerConfig, ManagerGuard, ManagerHandle,
    ManagerMessage,
};
use slrp_profiles::{
    Metrics as ProfileMetrics, ProfileAdaptorHandle, ProfileSource, ProfilesConfig,
};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::{
    CsiPluginEndpoint, CsiPluginInfo, OperationState, Resource, ResourceProviderInfo, offer,
    resource_provider_info::Storage, value,
};
use slrp_provider::metrics::ProviderMetrics;
use slrp_provider::stack::{PluginStack, StackConfig, StopPlugins};
use slrp_provider::worker::{Provider, ProviderDeps, ProviderHandle, ProviderParams, ProviderTask};
use slrp_store::Store;
use slrp_types::capability::VolumeCapability;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::plugin::FastPlugin;

const RP_TYPE: &str = "org.apache.mesos.rp.local.storage";
const PLUGIN_TYPE: &str = "org.slrp.bench";
const PROFILE: &str = "fast";
/// Bound for any single wait (a hang guard).
const HANG: Duration = Duration::from_secs(120);
/// Volume size of every CREATE_DISK, in MB.
const VOLUME_MB: f64 = 1.0;

struct Sizes {
    small: usize,
    large: usize,
    unacked: usize,
    /// Pairs measured per concurrency level.
    pairs: [(usize, usize); 3],
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                small: 10,
                large: 200,
                unacked: 20,
                pairs: [(1, 20), (16, 64), (64, 128)],
            }
        } else {
            Self {
                small: 100,
                large: 10_000,
                unacked: 1_000,
                pairs: [(1, 300), (16, 2_000), (64, 4_000)],
            }
        }
    }
}

struct Row {
    what: String,
    value: String,
    target: &'static str,
}

/// The process's resident set as `VmRSS` MiB (`RssAnon` MiB) from /proc/self/status:
/// the anonymous part is the heap, the rest mostly the binary's mapped pages.
fn rss() -> String {
    let (rss, anon, _) = status_kib();
    format!("{:.1} MiB (anonymous {:.1})", rss / 1024.0, anon / 1024.0)
}

// The allocator `slrp` installs (jemalloc with background purging), so that the
// provider child's memory is what `slrp run` gets; with the feature
// `bench-system-allocator`, glibc's, for heaptrack (the heap figures then read 0).
#[cfg(not(feature = "bench-system-allocator"))]
slrp_provider::use_jemalloc!();

/// Bytes of heap in use (jemalloc's `stats.allocated`): what is live, without the free
/// pages the resident set may still count.
fn heap_bytes() -> usize {
    slrp_provider::allocator::heap_in_use().unwrap_or(0)
}

#[allow(clippy::cast_precision_loss, reason = "MiB for display")]
fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The 1-minute load average: the machine is shared, figures depend on it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}

fn info(socket: &Path) -> ResourceProviderInfo {
    let endpoint = format!("unix://{}", socket.display());
    ResourceProviderInfo {
        r#type: RP_TYPE.into(),
        name: "bench".into(),
        storage: Some(Storage {
            plugin: CsiPluginInfo {
                r#type: PLUGIN_TYPE.into(),
                name: Some("fast".into()),
                endpoints: ["CONTROLLER_SERVICE", "NODE_SERVICE"]
                    .into_iter()
                    .map(|service| CsiPluginEndpoint {
                        csi_service:
                            slrp_proto::mesos::v1::csi_plugin_container_info::Service::from_str_name(
                                service,
                            )
                            .unwrap() as i32,
                        endpoint: endpoint.clone(),
                    })
                    .collect(),
                ..CsiPluginInfo::default()
            },
            // Periodic reconciliation off: it would interleave with the measured
            // operations at random points.
            reconciliation_interval_seconds: Some(0.0),
        }),
        ..ResourceProviderInfo::default()
    }
}

struct Bench {
    dir: PathBuf,
    socket: PathBuf,
    manager: ManagerHandle,
    _manager_guard: ManagerGuard,
    profiles: ProfileAdaptorHandle,
    plugin: FastPlugin,
    cancel: CancellationToken,
}

struct Running {
    stack: PluginStack,
    /// The provider's store: its commit counters.
    store: Store,
    /// The agent client's metrics (the largest call sent).
    agent_metrics: slrp_agent::Metrics,
    handle: ProviderHandle,
    task: ProviderTask,
    cancel: CancellationToken,
}

impl Bench {
    async fn new(base: &Path) -> Self {
        let dir = base.to_owned();
        let socket = dir.join("plugin.sock");
        let plugin = FastPlugin::default();
        plugin.serve(&socket).expect("plugin socket");
        let cancel = CancellationToken::new();
        let mut config = ManagerConfig::new(Listen::Unix(dir.join("agent.sock")));
        config.state_dir = Some(dir.join("manager"));
        config.ack_policy = AckPolicy::Auto;
        // Thousands of status updates may be in flight; observers are not the point.
        config.event_queue = 1 << 16;
        // Only the restart's resent statuses are read through a receiver (as they come);
        // every slot of a broadcast buffer is allocated up front (65,536 took 26 MB).
        config.message_buffer = 1 << 13;
        let (manager, guard) = EmbeddedManager::spawn(config, cancel.child_token())
            .await
            .expect("manager");
        let profiles = profile_adaptor(&dir, &cancel);
        Self {
            dir,
            socket,
            manager,
            _manager_guard: guard,
            profiles,
            plugin,
            cancel,
        }
    }

    /// Starts the plugin stack and the provider worker on the bench's state; returns
    /// once it is READY, with the time that took.
    async fn start(&self) -> (Running, Duration) {
        start_provider(
            &self.dir,
            &self.socket,
            self.manager.agent_id(),
            &self.profiles,
            &self.cancel,
        )
        .await
    }

    async fn stop(running: Running) {
        running.cancel.cancel();
        let _ = running.task.await;
        running.stack.shutdown(StopPlugins::Leave).await;
    }

    fn provider_id(running: &Running) -> String {
        running
            .handle
            .status()
            .borrow()
            .provider_id
            .clone()
            .expect("subscribed")
    }

    /// The storage pool as the agent sees it, once the provider reported it.
    async fn pool(&self, id: &str) -> Resource {
        let is_pool = |r: &Resource| {
            r.disk
                .as_ref()
                .and_then(|d| d.source.as_ref())
                .is_some_and(|s| s.r#type == SourceType::Raw as i32 && s.id.is_none())
        };
        // Subscribed before looking, so the UPDATE_STATE that brings it cannot be missed.
        let mut messages = self.manager.messages();
        tokio::time::timeout(HANG, async {
            loop {
                let total = self.manager.agent_total(id).await.expect("agent total");
                if let Some(pool) = total.into_iter().find(is_pool) {
                    return pool;
                }
                while !matches!(
                    messages.recv().await.expect("manager messages"),
                    ManagerMessage::UpdateState { .. }
                ) {}
            }
        })
        .await
        .expect("a storage pool reported in time")
    }
}

/// The profile adaptor over the bench's one profile (written to `dir/profiles.json`).
fn profile_adaptor(dir: &Path, cancel: &CancellationToken) -> ProfileAdaptorHandle {
    let profiles_file = dir.join("profiles.json");
    let document = serde_json::json!({
        "profile_matrix": {
            PROFILE: {
                "csi_plugin_type_selector": {"plugin_type": PLUGIN_TYPE},
                "volume_capabilities": {
                    "mount": {},
                    "access_mode": {"mode": "SINGLE_NODE_WRITER"}
                }
            }
        }
    });
    std::fs::write(&profiles_file, document.to_string()).unwrap();
    let config = ProfilesConfig::new(ProfileSource::File(profiles_file))
        .poll_interval(Duration::from_secs(3600))
        .max_random_wait(Duration::ZERO);
    let (profiles, _task) =
        slrp_profiles::spawn(config, ProfileMetrics::default(), cancel.child_token());
    profiles
}

/// Starts the plugin stack and the provider worker on the state in `dir`, against the
/// manager on `dir/agent.sock` and the plugin on `socket`; returns once it is READY,
/// with the time that took.
async fn start_provider(
    dir: &Path,
    socket: &Path,
    agent_id: &str,
    profiles: &ProfileAdaptorHandle,
    cancel: &CancellationToken,
) -> (Running, Duration) {
    let started = Instant::now();
    let store = Store::open(dir.join("state/store")).expect("store");
    let info = info(socket);
    let metrics = ProviderMetrics::new(RP_TYPE, "bench");
    let agent_metrics = slrp_agent::Metrics::default();
    let stack_config = StackConfig::new(
        info.clone(),
        dir.join("work"),
        dir.join("run"),
        store.clone(),
    );
    let stack = PluginStack::start(stack_config, &metrics, CancellationToken::new())
        .await
        .expect("plugin stack");
    let agent_socket = dir.join("agent.sock");
    let agent = AgentConfig::new(
        AgentEndpoint::parse(&format!("unix://{}", agent_socket.display())).unwrap(),
    );
    let params = ProviderParams::new(info, agent, agent_id.to_owned());
    let deps = ProviderDeps {
        volumes: stack.volumes().clone(),
        store: store.clone(),
        profiles: Some(profiles.clone()),
        metrics,
        agent_metrics: agent_metrics.clone(),
    };
    let cancel = cancel.child_token();
    let (handle, task) = Provider::spawn(params, deps, cancel.clone())
        .await
        .expect("provider");
    let mut status = handle.status();
    tokio::time::timeout(
        HANG,
        status.wait_for(|status| status.lifecycle == Lifecycle::Ready),
    )
    .await
    .expect("READY in time")
    .expect("provider running");
    let ready = started.elapsed();
    (
        Running {
            stack,
            store,
            agent_metrics,
            handle,
            task,
            cancel,
        },
        ready,
    )
}

/// Applies `info` and waits for its terminal status; returns the converted resources.
async fn run_operation(manager: &ManagerHandle, id: &str, info: offer::Operation) -> Vec<Resource> {
    let uuid = manager
        .apply_operation(id, ApplyRequest::new(info))
        .await
        .expect("apply");
    let view = manager.wait_terminal(uuid, HANG).await.expect("terminal");
    assert_eq!(
        view.latest_status.state,
        OperationState::OperationFinished as i32,
        "{:?}",
        view.latest_status
    );
    view.latest_status.converted_resources
}

async fn create_disk(manager: &ManagerHandle, id: &str, pool: &Resource) -> Resource {
    let mut source = pool.clone();
    source.scalar = Some(value::Scalar { value: VOLUME_MB });
    let info = offer::Operation {
        r#type: Some(offer::operation::Type::CreateDisk as i32),
        create_disk: Some(offer::operation::CreateDisk {
            source,
            target_type: SourceType::Mount as i32,
            target_profile: None,
        }),
        ..offer::Operation::default()
    };
    let mut converted = run_operation(manager, id, info).await;
    assert_eq!(converted.len(), 1, "{converted:?}");
    let mut volume = converted.remove(0);
    volume.allocation_info = None;
    volume
}

async fn destroy_disk(manager: &ManagerHandle, id: &str, volume: Resource) {
    let info = offer::Operation {
        r#type: Some(offer::operation::Type::DestroyDisk as i32),
        destroy_disk: Some(offer::operation::DestroyDisk { source: volume }),
        ..offer::Operation::default()
    };
    run_operation(manager, id, info).await;
}

/// What [`throughput`] measured.
struct Rate {
    /// Units per second.
    per_second: f64,
    /// Each unit's time from start to end, sorted.
    latencies: Vec<Duration>,
}

impl Rate {
    /// The `q` quantile (0..=1) of the units' times, in ms.
    fn quantile_ms(&self, q: f64) -> f64 {
        // The index is within the sorted list; both casts are of small numbers.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let index = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[index].as_secs_f64() * 1000.0
    }

    /// "median … ms, p90 …, p99 …, max …": the spread of the units' times.
    fn spread(&self) -> String {
        format!(
            "median {:.2} ms, p90 {:.2}, p99 {:.2}, max {:.2}",
            self.quantile_ms(0.5),
            self.quantile_ms(0.9),
            self.quantile_ms(0.99),
            self.quantile_ms(1.0)
        )
    }
}

/// Runs `total` units of `work` on `concurrency` tasks; returns units per second and
/// each unit's time.
async fn throughput<F, Fut>(concurrency: usize, total: usize, work: F) -> Rate
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let work = Arc::new(work);
    let left = Arc::new(AtomicUsize::new(total));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let work = work.clone();
            let left = left.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let unit = Instant::now();
                    work().await;
                    latencies.push(unit.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(total);
    for task in tasks {
        latencies.extend(task.await.expect("worker task"));
    }
    // Counts are far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let per_second = total as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Rate {
        per_second,
        latencies,
    }
}

async fn bare_pairs(socket: &Path, concurrency: usize, total: usize) -> Rate {
    let endpoint = CsiEndpoint::parse(&format!("unix://{}", socket.display())).unwrap();
    let client =
        CsiClient::new(endpoint, ClientConfig::default(), CsiMetrics::default()).expect("client");
    throughput(concurrency, total, move || {
        let client = client.clone();
        async move {
            let request = CreateVolumeRequest {
                name: uuid::Uuid::new_v4().to_string(),
                required_bytes: 1 << 20,
                limit_bytes: 0,
                capabilities: vec![VolumeCapability::mount_default()],
                parameters: Default::default(),
                secrets: Secrets::default(),
                content_source: None,
            };
            let volume = client.create_volume(&request).await.expect("CreateVolume");
            client
                .delete_volume(&volume.volume_id, &Secrets::default())
                .await
                .expect("DeleteVolume");
        }
    })
    .await
}

async fn provider_pairs(
    manager: &ManagerHandle,
    id: &str,
    pool: &Resource,
    concurrency: usize,
    total: usize,
) -> Rate {
    let (manager, id, pool) = (manager.clone(), id.to_owned(), pool.clone());
    throughput(concurrency, total, move || {
        let (manager, id, pool) = (manager.clone(), id.clone(), pool.clone());
        async move {
            let volume = create_disk(&manager, &id, &pool).await;
            destroy_disk(&manager, &id, volume).await;
        }
    })
    .await
}

/// Creates volumes until `count` exist (64 at a time); returns them.
async fn fill(manager: &ManagerHandle, id: &str, pool: &Resource, count: usize) -> Vec<Resource> {
    let mut volumes = Vec::with_capacity(count);
    let mut batch = tokio::task::JoinSet::new();
    let mut queued = 0;
    while volumes.len() < count {
        while queued < count && batch.len() < 64 {
            let (manager, id, pool) = (manager.clone(), id.to_owned(), pool.clone());
            batch.spawn(async move { create_disk(&manager, &id, &pool).await });
            queued += 1;
        }
        volumes.push(batch.join_next().await.unwrap().expect("create task"));
        if volumes.len() % 1000 == 0 {
            eprintln!("  {} of {count} volumes created", volumes.len());
        }
    }
    volumes
}

/// The mean time of four durable writes in series (4 KiB written at the start of a file
/// in `dir`, then `fdatasync`), `pairs` times: what a CREATE_DISK + DESTROY_DISK pair
/// must wait for at the least, whatever else it does (each operation's PENDING record
/// before its CSI call and its terminal record before its status is sent). SQLite's WAL
/// commit is the same write and sync, so the figure is the disk's, not the store's.
async fn durable_floor(dir: &Path, pairs: usize) -> Duration {
    let path = dir.join("durable-floor");
    let elapsed = tokio::task::spawn_blocking(move || {
        use std::io::{Seek as _, Write as _};
        let mut file = std::fs::File::create(&path).expect("floor file");
        let block = [0x5a_u8; 4096];
        let start = Instant::now();
        for _ in 0..pairs * 4 {
            file.rewind().expect("rewind");
            file.write_all(&block).expect("write");
            file.sync_data().expect("fdatasync");
        }
        let elapsed = start.elapsed();
        std::fs::remove_file(&path).expect("remove floor file");
        elapsed
    })
    .await
    .expect("floor task");
    elapsed / u32::try_from(pairs).expect("pairs")
}

/// What the provider child reports of itself.
struct OwnMemory {
    rss_kib: f64,
    anon_kib: f64,
    heap: usize,
    /// `VmHWM`: the most the process was ever resident, KiB.
    peak_rss_kib: f64,
    /// The most heap in use seen by [`HeapSampler`] since the child started.
    peak_heap: usize,
    /// The child's jemalloc `dirty_decay_ms`, or `unknown` if jemalloc could not tell.
    decay_ms: String,
    /// The largest call body the child's provider sent the manager (`agent_largest_call_bytes`):
    /// the subscription's UPDATE_STATE with the whole total.
    largest_call: u64,
}

/// `VmRSS`, `RssAnon` and `VmHWM` of this process, KiB.
fn status_kib() -> (f64, f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(f64::NAN)
    };
    (field("VmRSS:"), field("RssAnon:"), field("VmHWM:"))
}

/// The heap in use, read every [`HeapSampler::EVERY`] on a thread of its own: the peak of
/// the live heap during the restart (jemalloc keeps no such figure, and `VmHWM` also
/// counts the freed pages it has not yet returned).
struct HeapSampler {
    peak: Arc<AtomicUsize>,
}

impl HeapSampler {
    const EVERY: Duration = Duration::from_millis(2);

    fn start() -> Self {
        let peak = Arc::new(AtomicUsize::new(heap_bytes()));
        let weak = Arc::downgrade(&peak);
        std::thread::spawn(move || {
            while let Some(peak) = weak.upgrade() {
                peak.fetch_max(heap_bytes(), Ordering::Relaxed);
                drop(peak);
                std::thread::sleep(Self::EVERY);
            }
        });
        Self { peak }
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// The bench binary again with [`CHILD_ARG`]: a provider on the bench's state in a
/// process of its own. It prints `ready <µs>` once READY (timed from its store's open,
/// as [`start_provider`] times it), answers each `report` line on its stdin with
/// `memory <VmRSS KiB> <RssAnon KiB> <heap bytes> <VmHWM KiB> <peak heap bytes> <dirty_decay_ms> <largest call bytes>`,
/// and stops at the end of its stdin.
struct ProviderChild {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// Run under `SLRP_BENCH_CHILD_WRAPPER`, whose own lines (heaptrack's, say) share
    /// the child's stdout.
    wrapped: bool,
}

const CHILD_ARG: &str = "--provider-child";

impl ProviderChild {
    fn spawn(dir: &Path, agent_id: &str) -> Self {
        use std::process::Stdio;
        use tokio::io::AsyncBufReadExt as _;
        // `SLRP_BENCH_CHILD_WRAPPER="perf record -g -o FILE --"` runs the child under a
        // profiler (words split at whitespace), to see the restart's phases on their own.
        let exe = std::env::current_exe().unwrap();
        let wrapper = std::env::var("SLRP_BENCH_CHILD_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut command = tokio::process::Command::new(program);
                command.args(words).arg(exe);
                command
            }
            None => tokio::process::Command::new(exe),
        };
        let mut child = command
            .arg(CHILD_ARG)
            .arg(dir)
            .arg(agent_id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("provider child");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("child stdout");
        Self {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            wrapped: !wrapper.trim().is_empty(),
        }
    }

    async fn line(&mut self, prefix: &str) -> String {
        loop {
            let line = tokio::time::timeout(HANG, self.lines.next_line())
                .await
                .expect("provider child answers in time")
                .expect("provider child stdout")
                .expect("provider child running");
            match line.strip_prefix(prefix) {
                Some(rest) => return rest.to_owned(),
                None if self.wrapped => eprintln!("{line}"),
                None => panic!("provider child said {line:?}, not {prefix:?}"),
            }
        }
    }

    async fn ready(&mut self) -> Duration {
        let micros = self.line("ready ").await;
        Duration::from_micros(micros.parse().expect("READY time"))
    }

    async fn report(&mut self) -> OwnMemory {
        use tokio::io::AsyncWriteExt as _;
        let stdin = self.stdin.as_mut().expect("child stdin");
        stdin.write_all(b"report\n").await.expect("child stdin");
        stdin.flush().await.expect("child stdin");
        let text = self.line("memory ").await;
        let fields: Vec<&str> = text.split_whitespace().collect();
        OwnMemory {
            rss_kib: fields[0].parse().expect("VmRSS"),
            anon_kib: fields[1].parse().expect("RssAnon"),
            heap: fields[2].parse().expect("heap"),
            peak_rss_kib: fields[3].parse().expect("VmHWM"),
            peak_heap: fields[4].parse().expect("peak heap"),
            decay_ms: fields[5].to_owned(),
            largest_call: fields[6].parse().expect("largest call"),
        }
    }

    async fn stop(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(HANG, self.child.wait())
            .await
            .expect("provider child stops in time")
            .expect("provider child");
        assert!(status.success(), "provider child: {status}");
    }
}

/// The provider child's side of [`ProviderChild`].
fn provider_child(dir: PathBuf, agent_id: String) {
    let sampler = HeapSampler::start();
    let runtime = runtime();
    runtime.block_on(async {
        let cancel = CancellationToken::new();
        let profiles = profile_adaptor(&dir, &cancel);
        let socket = dir.join("plugin.sock");
        let (running, ready) = start_provider(&dir, &socket, &agent_id, &profiles, &cancel).await;
        println!("ready {}", ready.as_micros());
        let agent_metrics = running.agent_metrics.clone();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                match line.as_deref() {
                    Ok("report") => {
                        let (rss, anon, peak) = status_kib();
                        println!(
                            "memory {rss} {anon} {} {peak} {} {} {}",
                            heap_bytes(),
                            sampler.peak(),
                            slrp_provider::allocator::dirty_decay_ms()
                                .map_or_else(|| "unknown".to_owned(), |ms| ms.to_string()),
                            agent_metrics.largest_call_bytes.get(),
                        );
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let _ = done_tx.send(());
        });
        let _ = done_rx.await;
        Bench::stop(running).await;
        cancel.cancel();
    });
}

/// The bench's runtime: two worker threads, as the machine has two cores.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn print_table(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| figure | value | target |");
    println!("|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} |", row.what, row.value, row.target);
    }
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let mut quick = false;
    let mut dir: Option<PathBuf> = None;
    let mut large = None;
    let mut unacked = None;
    let mut args = std::env::args().skip(1);
    let number = |value: Option<String>| -> Option<usize> { value.and_then(|v| v.parse().ok()) };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            CHILD_ARG => {
                let dir = args.next().map(PathBuf::from).expect("state dir");
                let agent_id = args.next().expect("agent id");
                provider_child(dir, agent_id);
                return;
            }
            "--quick" => quick = true,
            "--dir" => dir = args.next().map(PathBuf::from),
            "--volumes" => large = number(args.next()),
            "--unacked" => unacked = number(args.next()),
            // cargo bench passes --bench; anything else is a mistake.
            "--bench" => {}
            other => {
                eprintln!(
                    "usage: operations [--quick] [--dir DIR] [--volumes N] [--unacked N] \
                     (unknown argument {other})"
                );
                std::process::exit(2);
            }
        }
    }
    let runtime = runtime();
    let mut sizes = Sizes::new(quick);
    sizes.large = large.unwrap_or(sizes.large).max(sizes.small);
    sizes.unacked = unacked.unwrap_or(sizes.unacked);
    runtime.block_on(run(sizes, quick, dir));
}

async fn run(sizes: Sizes, quick: bool, dir: Option<PathBuf>) {
    let base = dir.unwrap_or_else(std::env::temp_dir);
    let temp = tempfile::tempdir_in(&base).expect("bench dir");
    let bench = Bench::new(temp.path()).await;
    let mut rows = Vec::new();
    let rss_empty = rss();
    let heap_empty = heap_bytes();
    let load_start = load();

    let (running, first_ready) = bench.start().await;
    let id = Bench::provider_id(&running);
    let pool = bench.pool(&id).await;
    eprintln!("provider READY in {first_ready:?} (empty state)");

    // 1: bare CSI, before the provider has volumes (the plugin's map is as small).
    let mut bare = Vec::new();
    for (concurrency, total) in sizes.pairs {
        let rate = bare_pairs(&bench.socket, concurrency, total).await;
        eprintln!(
            "concurrency {concurrency}: bare CSI {:.0} pairs/s",
            rate.per_second
        );
        bare.push(rate);
    }

    // The floor a durable provider cannot go under at concurrency 1, measured on the
    // store's disk in this run: four commits in series per pair.
    let floor = durable_floor(temp.path(), sizes.pairs[0].1).await;
    rows.push(Row {
        what: "the durable floor of a pair: 4 writes of 4 KiB + fdatasync in series, in the store's directory"
            .to_owned(),
        value: format!(
            "{:.3} ms = {:.1}× the bare CSI pair at concurrency 1 ({:.3} ms)",
            floor.as_secs_f64() * 1000.0,
            floor.as_secs_f64() * bare[0].per_second,
            1000.0 / bare[0].per_second
        ),
        target: "",
    });

    // 2: the provider with `small` volumes.
    let _small = fill(&bench.manager, &id, &pool, sizes.small).await;
    // The commits a pair waits for, counted by the store: one pair at a time, nothing
    // acknowledged meanwhile (an acknowledgement's removal is a commit nothing waits
    // for), so every transaction is one the pair waited for. The statuses are
    // acknowledged at the restart of figure 4 with the others.
    bench.manager.set_ack_policy(AckPolicy::Manual);
    // The fill's last acknowledgements are removed meanwhile.
    let mut before = running.store.stats();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = running.store.stats();
        if now == before {
            break;
        }
        before = now;
    }
    let counted = 20;
    provider_pairs(&bench.manager, &id, &pool, 1, counted).await;
    let after = running.store.stats();
    bench.manager.set_ack_policy(AckPolicy::Auto);
    #[allow(clippy::cast_precision_loss, reason = "per-pair figures for display")]
    let per_pair = |n: u64| n as f64 / counted as f64;
    rows.push(Row {
        what: "commits a pair waits for, in series (concurrency 1, counted by the store)"
            .to_owned(),
        value: format!(
            "{:.2} (fsyncs {:.2}; {counted} pairs, no acknowledgement meanwhile)",
            per_pair(after.commits - before.commits),
            per_pair(after.syncs - before.syncs)
        ),
        target: "4",
    });
    let mut at_small = Vec::new();
    for (&(concurrency, total), bare) in sizes.pairs.iter().zip(&bare) {
        let rate = provider_pairs(&bench.manager, &id, &pool, concurrency, total).await;
        let (ops, bare_ops) = (rate.per_second, bare.per_second);
        eprintln!(
            "concurrency {concurrency}: bare {bare_ops:.0} pairs/s, provider {ops:.0} pairs/s"
        );
        at_small.push(ops);
        rows.push(Row {
            what: format!(
                "CREATE_DISK+DESTROY_DISK pairs/s, concurrency {concurrency} ({} volumes)",
                sizes.small
            ),
            value: format!(
                "{ops:.0} pairs/s = {:.0} disk ops/s; bare CSI {bare_ops:.0} pairs/s; overhead {:.2}×",
                ops * 2.0,
                bare_ops / ops
            ),
            target: match concurrency {
                1 => "overhead ≤ 2×",
                64 => "≥ 4,000 disk ops/s (issue #21)",
                _ => "",
            },
        });
        if concurrency == 1 {
            rows.push(Row {
                what: "… a pair's time at concurrency 1".to_owned(),
                value: format!(
                    "through the provider: {}, median = {:.1}× the durable floor; bare CSI: {}",
                    rate.spread(),
                    rate.quantile_ms(0.5) / (floor.as_secs_f64() * 1000.0),
                    bare.spread()
                ),
                target: "median ≤ 3× the durable floor",
            });
        }
    }

    // 3: the same with `large` volumes tracked.
    let filled = Instant::now();
    let _large = fill(&bench.manager, &id, &pool, sizes.large - sizes.small).await;
    eprintln!(
        "filled to {} volumes in {:?}",
        sizes.large,
        filled.elapsed()
    );
    let rss_large = rss();
    let heap_large = heap_bytes();
    for (index, (concurrency, total)) in sizes.pairs.into_iter().enumerate() {
        if concurrency == 16 {
            continue;
        }
        let ops = provider_pairs(&bench.manager, &id, &pool, concurrency, total)
            .await
            .per_second;
        rows.push(Row {
            what: format!(
                "pairs/s, concurrency {concurrency}: {} vs {} volumes tracked",
                sizes.small, sizes.large
            ),
            value: format!(
                "{:.0} vs {ops:.0} pairs/s ({:.2}×)",
                at_small[index],
                ops / at_small[index]
            ),
            target: "flat",
        });
    }

    // 4: unacknowledged streams, then a restart on the same state.
    bench.manager.set_ack_policy(AckPolicy::Manual);
    provider_pairs(&bench.manager, &id, &pool, 64, sizes.unacked / 2).await;
    let unacked = bench.manager.providers().await.expect("providers")[0]
        .operations
        .len();
    // The first provider's own heap: what stopping it gives back (the manager, the
    // plugin and the driver keep theirs).
    let heap_filled = heap_bytes();
    Bench::stop(running).await;
    let heap_first_share = heap_filled.saturating_sub(heap_bytes());
    bench.manager.set_ack_policy(AckPolicy::Auto);
    let mut messages = bench.manager.messages();
    // The restarted provider runs in a process of its own, so that its resident set is
    // its own and not that of the manager, the plugin and this driver too.
    let mut child = ProviderChild::spawn(&bench.dir, bench.manager.agent_id());
    let ready = child.ready().await;
    let restarted = Instant::now() - ready;
    // Every unacknowledged status is resent after READY and acknowledged at once.
    let mut resent = 0;
    let drained = tokio::time::timeout(HANG, async {
        while resent < unacked {
            match messages.recv().await {
                Ok(ManagerMessage::UpdateOperationStatus { .. }) => resent += 1,
                Ok(_) => {}
                Err(error) => panic!("manager messages: {error}"),
            }
        }
        restarted.elapsed()
    })
    .await
    .unwrap_or(HANG);
    let own = child.report().await;
    let rss_rest = rss();
    // jemalloc's background thread returns freed pages over `DIRTY_DECAY_MS`: what the
    // provider keeps resident once the restart's garbage is gone.
    tokio::time::sleep(Duration::from_millis(
        2 * u64::from(slrp_provider::allocator::DIRTY_DECAY_MS) + 500,
    ))
    .await;
    let settled = child.report().await;
    rows.push(Row {
        what: format!(
            "start → READY, {} volumes, {unacked} unacknowledged operations",
            sizes.large
        ),
        value: format!(
            "{:.0} ms (all {resent} statuses resent and acknowledged after {:.0} ms)",
            ready.as_secs_f64() * 1000.0,
            drained.as_secs_f64() * 1000.0
        ),
        target: if sizes.large > 10_000 {
            "< 5 s (issue #25)"
        } else {
            "< 1 s"
        },
    });
    #[allow(clippy::cast_precision_loss, reason = "KiB per volume for display")]
    let per_volume = |bytes: usize| bytes as f64 / 1024.0 / sizes.large as f64;
    rows.push(Row {
        what: format!(
            "resident memory, {} volumes: the restarted provider's own process, settled",
            sizes.large
        ),
        value: format!(
            "{:.1} MiB (anonymous {:.1}); heap in use {:.1} MiB = {:.1} KiB per volume \
             (jemalloc dirty_decay_ms {})",
            settled.rss_kib / 1024.0,
            settled.anon_kib / 1024.0,
            mib(settled.heap),
            per_volume(settled.heap),
            settled.decay_ms,
        ),
        target: if sizes.large > 10_000 {
            "< 2.5 KiB per volume + 30 MiB (issue #25)"
        } else {
            "< 64 MiB"
        },
    });
    rows.push(Row {
        what: "… at the last acknowledgement; the restart's peak".to_owned(),
        value: format!(
            "{:.1} MiB (anonymous {:.1}; heap in use {:.1} MiB); peak {:.1} MiB resident \
             (`VmHWM`), {:.1} MiB of heap in use = {:.2}× the settled heap (sampled every \
             {} ms)",
            own.rss_kib / 1024.0,
            own.anon_kib / 1024.0,
            mib(own.heap),
            settled.peak_rss_kib / 1024.0,
            mib(settled.peak_heap),
            mib(settled.peak_heap) / mib(settled.heap).max(f64::MIN_POSITIVE),
            HeapSampler::EVERY.as_millis(),
        ),
        target: "peak heap < 3× the settled heap (issue #25)",
    });
    #[allow(clippy::cast_precision_loss, reason = "bytes for display")]
    rows.push(Row {
        what: format!(
            "the largest call the restarted provider sent, {} volumes",
            sizes.large
        ),
        value: format!(
            "{:.2} MiB = {:.0} B per volume (the subscription's UPDATE_STATE, protobuf; `agent_largest_call_bytes`)",
            settled.largest_call as f64 / 1_048_576.0,
            settled.largest_call as f64 / sizes.large as f64,
        ),
        target: "under the manager's max_body_bytes (128 MiB by default)",
    });
    rows.push(Row {
        what: format!("resident memory, {} volumes (whole bench process)", sizes.large),
        value: format!(
            "{rss_large} after filling (the provider in it); {rss_rest} with the provider in its own process; {rss_empty} before the provider started"
        ),
        target: "",
    });
    assert_eq!(
        bench.plugin.volume_count(),
        sizes.large,
        "the plugin holds exactly the volumes created"
    );
    child.stop().await;
    rows.push(Row {
        what: format!("heap in use, {} volumes (bench process)", sizes.large),
        value: format!(
            "{:.1} MiB after filling, of which the first provider's own share {:.1} MiB = {:.1} KiB per volume; \
             {:.1} MiB before the provider started",
            mib(heap_large),
            mib(heap_first_share),
            per_volume(heap_first_share),
            mib(heap_empty),
        ),
        target: "",
    });
    bench.cancel.cancel();

    print_table(
        &format!(
            "Operations benchmark ({}; store in {}; load average {} at the start, {} at the end)",
            if quick { "--quick" } else { "full" },
            base.display(),
            load_start,
            load()
        ),
        &rows,
    );
}
