//! A Mesos agent work directory as the Mesos storage local resource provider leaves it, for
//! the tests of `slrp import-mesos` and of the refusal of a Mesos work dir.
//!
//! # Overview
//! [`MesosWorkDir`] writes Mesos's exact layout (Mesos `src/slave/paths.cpp`,
//! `src/csi/paths.cpp`) and encodings (`slrp_wire::checkpoint`) under a root directory:
//!
//! ```text
//! meta/boot_id                                          plain text, no length prefix
//! meta/slaves/latest -> <root>/meta/slaves/<agent id>   absolute target
//! meta/slaves/<agent>/resource_providers/<type>/<name>/latest -> …/<rp id>
//! meta/slaves/<agent>/resource_providers/<type>/<name>/<rp id>/resource_provider.state
//! meta/slaves/<agent>/resource_providers/<type>/<name>/<rp id>/operations/<uuid>/operation.updates
//! csi/<plugin type>/<plugin name>/volumes/<enc(volume id)>/volume.state
//! csi/<plugin type>/<plugin name>/containers/<container id>/container.info
//! csi/<plugin type>/<plugin name>/containers/<container id>/endpoint -> <temp>/mesos-csi-XXXXXX
//! csi/<plugin type>/<plugin name>/mounts/<enc(volume id)>/{staging,target}
//! ```
//!
//! Single-message checkpoints are written as `slave::state::checkpoint` does: resources
//! downgraded, through a temporary file and a rename, synced for `resource_provider.state`
//! and `volume.state`. Status streams get one record per UPDATE or ACK, verbatim, as the
//! operation status update manager appends them; [`MesosStream::torn_tail`] and
//! [`MesosStream::corrupt_record`] damage them the two ways Mesos's recovery knows.
//!
//! Volume ids are encoded with slrp's own encoder (`slrp_core::volume::paths`), which
//! matches Mesos's for every id except `.` and `..`; the tests of this module check the
//! encoding of Mesos's special characters against literals, so a change there fails here
//! as well as in slrp-core.
//!
//! # Limitations
//! Setup failures panic. Only what the Mesos SLRP writes is covered: no `slave.info`, no
//! agent registrar, no sandboxes.

use std::borrow::Borrow;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use slrp_proto::mesos::csi::state::VolumeState;
use slrp_proto::mesos::internal::{
    UpdateOperationStatusMessage, UpdateOperationStatusRecord, update_operation_status_record,
};
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::v1::{AgentId, CsiPluginContainerInfo, OperationStatus, Uuid as MesosUuid};
use slrp_wire::checkpoint::{append_record, downgrade_message, encode_message, write_message};
use uuid::Uuid;

/// The `mesos.UUID` holding `uuid`'s 16 raw bytes, as Mesos stores operation and status ids.
pub fn mesos_uuid(uuid: Uuid) -> MesosUuid {
    MesosUuid {
        value: uuid.as_bytes().to_vec(),
    }
}

/// Creates a `mkstemp`-style name (`XXXXXX`: six random alphanumerics) in `dir` with
/// `prefix` and returns its path, making a directory or an empty file.
fn mkstemp(dir: &Path, prefix: &str, make_dir: bool) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let builder = tempfile::Builder::new()
        .prefix(prefix)
        .suffix("")
        .rand_bytes(6)
        .to_owned();
    if make_dir {
        builder.tempdir_in(dir).unwrap().keep()
    } else {
        let (_, path) = builder.tempfile_in(dir).unwrap().keep().unwrap();
        path
    }
}

/// Replaces whatever is at `link` with a symlink to `target`.
fn relink(target: &Path, link: &Path) {
    fs::create_dir_all(link.parent().unwrap()).unwrap();
    match fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("removing {}: {e}", link.display()),
    }
    symlink(target, link).unwrap();
}

/// A Mesos agent work directory under construction. See the module docs for the layout.
#[derive(Debug, Clone)]
pub struct MesosWorkDir {
    root: PathBuf,
    agent: Option<String>,
    temp_dir: PathBuf,
}

impl MesosWorkDir {
    /// An empty work directory at `root` (created if missing). Plugin endpoint directories
    /// go to `<root>/tmp` (Mesos uses `$TMPDIR`) unless [`Self::temp_dir`] says otherwise.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        fs::create_dir_all(&root).unwrap();
        // Absolute, as Mesos's own paths are: `latest` links carry absolute targets.
        let root = fs::canonicalize(&root).unwrap();
        let temp_dir = root.join("tmp");
        Self {
            root,
            agent: None,
            temp_dir,
        }
    }

    /// The work directory (absolute).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Makes `id` the agent's current id: creates `meta/slaves/<id>/` and points
    /// `meta/slaves/latest` at it (absolute target). Providers created afterwards belong to
    /// this agent; calling it again models an agent that came back with a new id.
    pub fn agent(mut self, id: &str) -> Self {
        let dir = self.root.join("meta/slaves").join(id);
        fs::create_dir_all(&dir).unwrap();
        relink(&dir, &self.root.join("meta/slaves/latest"));
        self.agent = Some(id.to_owned());
        self
    }

    /// Writes `meta/boot_id` (plain text, as the agent writes it after its recovery).
    pub fn boot_id(self, boot_id: &str) -> Self {
        fs::create_dir_all(self.root.join("meta")).unwrap();
        fs::write(self.boot_id_path(), boot_id).unwrap();
        self
    }

    /// Where plugin endpoint directories (`mesos-csi-XXXXXX`) are created.
    pub fn temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = dir.into();
        self
    }

    /// `meta/boot_id`.
    pub fn boot_id_path(&self) -> PathBuf {
        self.root.join("meta/boot_id")
    }

    /// `meta/slaves/<current agent id>`.
    ///
    /// # Panics
    /// If no agent id was set with [`Self::agent`].
    pub fn agent_dir(&self) -> PathBuf {
        let agent = self
            .agent
            .as_deref()
            .expect("MesosWorkDir::agent must be called first");
        self.root.join("meta/slaves").join(agent)
    }

    /// A resource provider of the current agent: creates
    /// `resource_providers/<type>/<name>/<rp id>/` and its `latest` link (absolute target).
    /// Nothing is checkpointed until [`MesosProvider::state`] or a stream is written.
    pub fn provider(&self, rp_type: &str, rp_name: &str, rp_id: &str) -> MesosProvider {
        let parent = self
            .agent_dir()
            .join("resource_providers")
            .join(rp_type)
            .join(rp_name);
        let dir = parent.join(rp_id);
        fs::create_dir_all(&dir).unwrap();
        relink(&dir, &parent.join("latest"));
        MesosProvider {
            dir,
            agent: self.agent.clone().unwrap_or_default(),
        }
    }

    /// `csi/<plugin type>/<plugin name>`.
    pub fn plugin_dir(&self, plugin_type: &str, plugin_name: &str) -> PathBuf {
        self.root.join("csi").join(plugin_type).join(plugin_name)
    }

    /// `csi/<plugin type>/<plugin name>/volumes/<enc(id)>/volume.state`, where it is
    /// written by [`Self::volume`].
    pub fn volume_state_path(&self, plugin_type: &str, plugin_name: &str, id: &str) -> PathBuf {
        let name = slrp_core::volume::paths::encode_volume_id(id).unwrap();
        self.plugin_dir(plugin_type, plugin_name)
            .join("volumes")
            .join(name)
            .join("volume.state")
    }

    /// Checkpoints a volume's state as Mesos's volume manager does (synced) and returns the
    /// file's path.
    pub fn volume(
        &self,
        plugin_type: &str,
        plugin_name: &str,
        id: &str,
        state: impl Borrow<VolumeState>,
    ) -> PathBuf {
        let path = self.volume_state_path(plugin_type, plugin_name, id);
        write_message(&path, state.borrow(), true).unwrap();
        path
    }

    /// Creates `csi/<type>/<name>/mounts/<enc(id)>/{staging,target}` and returns both.
    pub fn mount_dirs(&self, plugin_type: &str, plugin_name: &str, id: &str) -> (PathBuf, PathBuf) {
        let name = slrp_core::volume::paths::encode_volume_id(id).unwrap();
        let dir = self
            .plugin_dir(plugin_type, plugin_name)
            .join("mounts")
            .join(name);
        let (staging, target) = (dir.join("staging"), dir.join("target"));
        fs::create_dir_all(&staging).unwrap();
        fs::create_dir_all(&target).unwrap();
        (staging, target)
    }

    /// Checkpoints a plugin container's `container.info` (not synced, as Mesos) and links
    /// its `endpoint` to a fresh `mesos-csi-XXXXXX` directory under the temp dir, where the
    /// plugin's `endpoint.sock` would be. Returns the container's directory.
    pub fn container(
        &self,
        plugin_type: &str,
        plugin_name: &str,
        container_id: &str,
        info: impl Borrow<CsiPluginContainerInfo>,
    ) -> PathBuf {
        let dir = self
            .plugin_dir(plugin_type, plugin_name)
            .join("containers")
            .join(container_id);
        let mut info = info.borrow().clone();
        downgrade_message(&mut info).unwrap();
        write_message(&dir.join("container.info"), &info, false).unwrap();
        let endpoint = mkstemp(&self.temp_dir, "mesos-csi-", true);
        relink(&endpoint, &dir.join("endpoint"));
        dir
    }

    /// Leaves a `mkstemp` temporary file (`<dir>/XXXXXX`, holding the start of a record) as
    /// a crash during an atomic checkpoint does, and returns its path.
    pub fn temp_leftover(&self, dir: &Path) -> PathBuf {
        let path = mkstemp(dir, "", false);
        fs::write(&path, [0x40, 0, 0, 0, 0x08]).unwrap();
        path
    }
}

/// One resource provider's checkpoint directory, `…/resource_providers/<type>/<name>/<rp id>`.
#[derive(Debug, Clone)]
pub struct MesosProvider {
    dir: PathBuf,
    agent: String,
}

impl MesosProvider {
    /// The provider's directory (`<rp id>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `latest` link naming this provider's id.
    pub fn latest_path(&self) -> PathBuf {
        self.dir.parent().unwrap().join("latest")
    }

    /// `resource_provider.state`.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("resource_provider.state")
    }

    /// Checkpoints the provider's state as Mesos does: resources downgraded, synced.
    pub fn state(&self, state: impl Borrow<ResourceProviderState>) -> &Self {
        let mut state = state.borrow().clone();
        downgrade_message(&mut state).unwrap();
        write_message(&self.state_path(), &state, true).unwrap();
        self
    }

    /// `operations/<name>/operation.updates`.
    pub fn stream_path(&self, dir_name: &str) -> PathBuf {
        self.dir
            .join("operations")
            .join(dir_name)
            .join("operation.updates")
    }

    /// The status stream of the operation with `operation_uuid`, in
    /// `operations/<uuid, hyphenated>/`: the directory is created, the file on the first
    /// record (so a stream with no record models "directory present, file missing").
    pub fn stream(&self, operation_uuid: Uuid) -> MesosStream {
        self.stream_named(
            &operation_uuid.hyphenated().to_string(),
            Some(operation_uuid),
        )
    }

    /// A stream in `operations/<dir_name>/`, for directory names that are not the
    /// operation's uuid (Mesos fails on them); UPDATE records carry `operation_uuid`.
    pub fn stream_named(&self, dir_name: &str, operation_uuid: Option<Uuid>) -> MesosStream {
        let path = self.stream_path(dir_name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        MesosStream {
            path,
            agent: self.agent.clone(),
            operation_uuid,
            last: None,
        }
    }
}

/// One operation's `operation.updates` record stream.
#[derive(Debug)]
pub struct MesosStream {
    path: PathBuf,
    agent: String,
    operation_uuid: Option<Uuid>,
    last: Option<UpdateOperationStatusMessage>,
}

impl MesosStream {
    /// `operation.updates`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self) -> File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .unwrap()
    }

    /// The update Mesos checkpoints for `status`: the agent's id, the operation's uuid,
    /// no framework (set one with [`Self::update_message`]) and no `latest_status` (only
    /// set when forwarding).
    pub fn message_for(&self, status: OperationStatus) -> UpdateOperationStatusMessage {
        UpdateOperationStatusMessage {
            framework_id: None,
            slave_id: Some(AgentId {
                value: self.agent.clone(),
            }),
            status,
            latest_status: None,
            operation_uuid: self.operation_uuid.map(mesos_uuid),
        }
    }

    /// Appends the UPDATE record of `status` (see [`Self::message_for`]).
    pub fn update(&mut self, status: OperationStatus) -> &mut Self {
        let message = self.message_for(status);
        self.update_message(message)
    }

    /// Appends an UPDATE record holding `message` verbatim.
    pub fn update_message(&mut self, message: UpdateOperationStatusMessage) -> &mut Self {
        let record = UpdateOperationStatusRecord {
            r#type: update_operation_status_record::Type::Update as i32,
            update: Some(message.clone()),
            uuid: None,
        };
        append_record(&mut self.file(), &record).unwrap();
        self.last = Some(message);
        self
    }

    /// Appends the ACK record of the status with `status_uuid` (its 16 raw bytes, as
    /// Mesos copies `update.status().uuid()`).
    pub fn ack(&mut self, status_uuid: Uuid) -> &mut Self {
        let record = UpdateOperationStatusRecord {
            r#type: update_operation_status_record::Type::Ack as i32,
            update: None,
            uuid: Some(mesos_uuid(status_uuid)),
        };
        append_record(&mut self.file(), &record).unwrap();
        self
    }

    /// Appends the first `bytes` bytes of an ACK record (26 bytes: a 4-byte length prefix
    /// and a 22-byte body), as a crash in the middle of an append leaves: fewer than 4 tear
    /// the length prefix, more tear the body.
    ///
    /// # Panics
    /// If `bytes` is 0 or not shorter than the record.
    pub fn torn_tail(&mut self, bytes: usize) -> &mut Self {
        let record = encode_message(&UpdateOperationStatusRecord {
            r#type: update_operation_status_record::Type::Ack as i32,
            update: None,
            uuid: Some(mesos_uuid(Uuid::nil())),
        });
        assert!(
            (1..record.len()).contains(&bytes),
            "a torn tail has 1 to {} bytes, not {bytes}",
            record.len() - 1
        );
        let mut file = self.file();
        file.write_all(&record[..bytes]).unwrap();
        file.sync_data().unwrap();
        self
    }

    /// Appends a whole `UpdateOperationStatusMessage` (the last update written, else one for
    /// a PENDING status) with a valid length prefix: a complete record that is not an
    /// `UpdateOperationStatusRecord`, as Mesos's `NonStrictRecoveryCorruptedFile` test writes.
    pub fn corrupt_record(&mut self) -> &mut Self {
        let message = self.last.clone().unwrap_or_else(|| {
            self.message_for(OperationStatus {
                state: slrp_proto::mesos::v1::OperationState::OperationPending as i32,
                uuid: Some(mesos_uuid(Uuid::new_v4())),
                ..OperationStatus::default()
            })
        });
        let mut file = self.file();
        file.write_all(&encode_message(&message)).unwrap();
        file.sync_data().unwrap();
        self
    }
}
