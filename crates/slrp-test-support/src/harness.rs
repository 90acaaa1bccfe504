//! [`Harness`]: a volume manager on a temporary state directory over a shared
//! [`FakeCsi`], that can be stopped, crashed (fail points) and restarted on the same
//! state (feature `volume`); request builders and waiting helpers for its tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slrp_core::volume::*;
use slrp_store::Store;
use tokio_util::sync::CancellationToken;

use crate::fake_csi::{FakeCsi, FakeMounts};

/// A manager on a temporary state directory, over a shared fake plugin. Each
/// [`Harness::start`] opens the same store, so a stop (or a crash) and a start is a
/// restart.
#[derive(Debug)]
pub struct Harness {
    /// Holds `state/` (the store) and `work/` (the mount root); removed on drop.
    pub dir: tempfile::TempDir,
    /// The plugin every start talks to; it outlives restarts like a real plugin.
    pub fake: Arc<FakeCsi>,
    /// The boot id the next start uses (change it to simulate a reboot).
    pub boot: BootId,
    /// `max_concurrent` of the next start.
    pub max_concurrent: usize,
    /// The secret resolver of the next start.
    pub secrets: Arc<dyn SecretResolver>,
}

/// A started manager.
#[derive(Debug)]
pub struct Running {
    /// Sends it requests.
    pub handle: VolumeManagerHandle,
    /// Owns its worker: dropping the `Running` stops it.
    pub guard: VolumeManagerGuard,
}

impl Running {
    /// Orderly stop; returns the worker's result.
    pub async fn stop(self) -> Result<(), VolumeError> {
        self.guard.stop().await
    }

    /// Waits for the worker to die (after a fatal fail point); returns its result.
    pub async fn died(self) -> Result<(), VolumeError> {
        let r = tokio::time::timeout(Duration::from_secs(60), self.guard.join())
            .await
            .expect("manager did not stop");
        drop(self.handle);
        r
    }
}

impl Harness {
    /// A fresh state directory over `fake`, in boot `boot-1`, 16 concurrent calls, no
    /// secrets.
    pub fn new(fake: Arc<FakeCsi>) -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            fake,
            boot: BootId::new("boot-1"),
            max_concurrent: 16,
            secrets: Arc::new(NoSecrets),
        }
    }

    /// The store's directory.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The agent work directory the mount root lives under.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The mount paths (plugin type `org.test`, name `fake`).
    pub fn paths(&self) -> MountPaths {
        MountPaths::under_work_dir(&self.work_dir(), "org.test", "fake").unwrap()
    }

    /// The config [`Self::start`] uses: the fake's capabilities and target-path mode, no
    /// manager retries (tests script transient failures and expect to hear them), a 5 s
    /// shutdown grace, the fake's mounts.
    pub fn config(&self) -> VolumeManagerConfig {
        let target = if self.fake.st().co_creates_target {
            TargetPath::CoCreates
        } else {
            TargetPath::PluginCreates
        };
        VolumeManagerConfig::new(
            self.paths(),
            "node-1",
            self.fake.caps,
            self.boot.clone(),
            target,
        )
        .plugin("org.test", "fake", slrp_csi::CsiVersion::V1)
        // Tests script transient failures and expect to hear them; the retry tests
        // set their own policy.
        .retry(slrp_csi::RetryConfig::none())
        .max_concurrent(self.max_concurrent)
        .shutdown_grace(Duration::from_secs(5))
        .mounts(Arc::new(FakeMounts(self.fake.clone())))
        .secrets(self.secrets.clone())
    }

    /// Starts a manager with [`Self::config`].
    ///
    /// # Panics
    /// If the store cannot be opened (e.g. a manager is still running on it).
    pub fn start(&self) -> Running {
        self.start_with(self.config())
    }

    /// Starts a manager with `cfg`.
    ///
    /// # Panics
    /// If the store cannot be opened or `cfg` is refused.
    pub fn start_with(&self, cfg: VolumeManagerConfig) -> Running {
        self.start_sharing(cfg).0
    }

    /// Starts a manager and hands out its store too, for a test that plays a caller
    /// committing in it (folded commits). Drop the store before the next start: it holds
    /// the state directory's lock.
    ///
    /// # Panics
    /// If the store cannot be opened or `cfg` is refused.
    pub fn start_sharing(&self, cfg: VolumeManagerConfig) -> (Running, Store) {
        let store = Store::open(self.state_dir()).unwrap();
        let (handle, guard) = VolumeManager::spawn(
            cfg,
            store.clone(),
            self.fake.clone(),
            &CancellationToken::new(),
        )
        .unwrap();
        (Running { handle, guard }, store)
    }

    /// The records on disk (the manager must be stopped).
    pub fn stored(&self) -> Vec<VolumeRecord> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }

    /// The CreateVolume intents on disk (the manager must be stopped).
    pub fn stored_intents(&self) -> Vec<CreateVolume> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }

    /// The deletion intents on disk (the manager must be stopped).
    pub fn stored_deletions(&self) -> Vec<DeleteIntent> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }

    /// The refused CreateVolume answers on disk (the manager must be stopped).
    pub fn stored_refusals(&self) -> Vec<RefusedCreate> {
        self.stored_all()
    }

    /// Every record of `R`'s kind on disk (the manager must be stopped).
    pub fn stored_all<R: slrp_store::Record>(&self) -> Vec<R> {
        let store = Store::open_read_only(self.state_dir()).unwrap();
        store.load_all_blocking().unwrap()
    }
}

/// The default mount capability.
pub fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount_default()
}

/// A CreateVolume of 1 MiB with the mount capability and no parameters.
pub fn create_req(name: &str) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        required_bytes: 1 << 20,
        limit_bytes: 0,
        capability: mount_cap(),
        parameters: StringMap::new(),
        content_source: None,
    }
}

/// A CreateVolume whose answer the fake plugin's client refuses after the plugin created
/// the volume (`how`: `"id"`, the refusal names the volume; `"no_id"`, it names none).
pub fn refused_create_req(name: &str, how: &str) -> CreateVolume {
    let mut req = create_req(name);
    req.parameters.insert("refused_answer".into(), how.into());
    req
}

/// A ValidateVolume for a volume listed by the plugin (mount, no parameters).
pub fn validate_req(id: &VolumeId) -> ValidateVolume {
    ValidateVolume {
        id: id.clone(),
        capability: mount_cap(),
        parameters: StringMap::new(),
        volume_context: BTreeMap::from([("from".into(), "list".into())]),
        capacity_bytes: 4096,
        node_stage_secrets: BTreeMap::new(),
        node_publish_secrets: BTreeMap::new(),
    }
}

/// Polls the manager's job counts until `want` holds or `escape` does (a call reached
/// the plugin that should have waited); returns the counts seen last.
pub async fn jobs_until(
    handle: &VolumeManagerHandle,
    want: impl Fn(&JobCounts) -> bool,
    escape: impl Fn() -> bool,
) -> JobCounts {
    within(async {
        loop {
            let jobs = handle.jobs().await.unwrap();
            if want(&jobs) || escape() {
                return jobs;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Polls the manager's records (as last committed) until `want` holds; returns them.
/// A hang guard ([`within`]), not a deadline.
///
/// # Panics
/// If the manager stops first, or `want` never holds within a minute.
pub async fn volumes_until(
    handle: &VolumeManagerHandle,
    want: impl Fn(&[VolumeRecord]) -> bool,
) -> Vec<VolumeRecord> {
    within(async {
        loop {
            let recs = handle.volumes().await.unwrap();
            if want(&recs) {
                return recs;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Waits until the worker has stopped taking commands (it is shutting down).
pub async fn wait_until_not_accepting(handle: &VolumeManagerHandle) {
    within(async {
        while !matches!(handle.volumes().await, Err(VolumeError::Stopped)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Polls until `cond` holds (a hang guard, not a deadline: see [`within`]).
pub async fn until(mut cond: impl FnMut() -> bool) {
    within(async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Fails the test if `f` does not finish within a minute (a hang, not a slow run).
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("timed out")
}
