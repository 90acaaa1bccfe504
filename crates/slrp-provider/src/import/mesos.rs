//! Reading a Mesos SLRP's checkpoint tree (spec §8.2; layout of `src/slave/paths.cpp` and
//! `src/csi/paths.cpp`) the way Mesos's own recovery reads it, without changing a byte of
//! it: Mesos truncates a stream's bad tail and removes unknown operation directories,
//! slrp only reports them.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use slrp_core::provider::operations::{is_terminal_state, status_uuid};
use slrp_core::volume::{decode_volume_id, encode_volume_id};
use slrp_proto::mesos::csi::state::VolumeState as MesosVolumeState;
use slrp_proto::mesos::internal::UpdateOperationStatusRecord;
use slrp_proto::mesos::internal::update_operation_status_record::Type as RecordType;
use slrp_proto::mesos::resource_provider::ResourceProviderState;
use slrp_proto::mesos::v1::OperationStatus;
use slrp_wire::checkpoint::{
    Records, Tail, read_message, read_records, record_starts, upgrade_message,
};

use super::marker::FileDigest;
use super::{Refusal, Skipped};

/// Refusals and skipped items, collected over the whole tree.
#[derive(Debug)]
pub(super) struct Collect<'a> {
    pub(super) work_dir: &'a Path,
    pub(super) lenient: bool,
    pub(super) refusals: Vec<Refusal>,
    pub(super) skipped: Vec<Skipped>,
}

impl<'a> Collect<'a> {
    pub(super) fn new(work_dir: &'a Path, lenient: bool) -> Self {
        Self {
            work_dir,
            lenient,
            refusals: Vec::new(),
            skipped: Vec::new(),
        }
    }

    pub(super) fn refuse(&mut self, path: &Path, reason: impl Into<String>) {
        self.refusals.push(Refusal {
            path: path.to_owned(),
            reason: reason.into(),
        });
    }

    pub(super) fn skip(&mut self, path: &Path, reason: impl Into<String>) {
        self.skipped.push(Skipped {
            path: path.to_owned(),
            reason: reason.into(),
        });
    }

    /// `path` relative to the work directory (as the marker keeps it).
    pub(super) fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(self.work_dir)
            .map_or_else(|_| path.to_owned(), Path::to_owned)
    }

    /// The bytes of `path`; `None` if it does not exist. A read error is a refusal.
    fn read(&mut self, path: &Path) -> Option<Vec<u8>> {
        match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                self.refuse(path, format!("cannot be read: {e}"));
                None
            }
        }
    }

    /// The entries of `dir`, sorted; none for a missing directory. A read error is a
    /// refusal.
    fn entries(&mut self, dir: &Path) -> Vec<PathBuf> {
        let listed = std::fs::read_dir(dir).and_then(|iter| {
            iter.map(|e| e.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()
        });
        match listed {
            Ok(mut entries) => {
                entries.sort();
                entries
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                self.refuse(dir, format!("the directory cannot be listed: {e}"));
                Vec::new()
            }
        }
    }
}

/// A single path component (what Mesos's ids and slrp's validated names are).
fn is_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// The agent as the work directory knows it.
#[derive(Debug, Clone)]
pub(super) struct AgentRead {
    /// The agent id the provider's identity is under.
    pub(super) id: String,
    /// `meta/boot_id`: the boot of the agent's last start, if recorded.
    pub(super) boot_id: Option<String>,
}

/// `meta/slaves/latest` (the agent's current id, `paths.cpp` getLatestSlavePath) and
/// `meta/boot_id`. `expected` is the id the operator or the agent named.
pub(super) fn read_agent(c: &mut Collect<'_>, expected: Option<&str>) -> Option<AgentRead> {
    let meta = c.work_dir.join("meta");
    let boot_path = meta.join("boot_id");
    let boot_id = c
        .read(&boot_path)
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .filter(|b| !b.is_empty());
    let latest = meta.join("slaves").join("latest");
    let from_latest = match std::fs::symlink_metadata(&latest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            c.refuse(&latest, format!("cannot be read: {e}"));
            return None;
        }
        Ok(_) => match std::fs::canonicalize(&latest) {
            Ok(real) => {
                let id = real
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                Some(id)
            }
            Err(e) => {
                c.refuse(
                    &latest,
                    format!(
                        "does not resolve ({e}): the Mesos agent would start with a new id and \
                         no longer use the providers' state kept under the old one"
                    ),
                );
                return None;
            }
        },
    };
    let id = match (from_latest, expected) {
        (Some(id), Some(expected)) if id != expected => {
            c.refuse(
                &latest,
                format!(
                    "names agent '{id}', but the agent id given is '{expected}': the import \
                     would be kept under an identity the agent no longer has"
                ),
            );
            return None;
        }
        (Some(id), _) => id,
        (None, Some(expected)) => expected.to_owned(),
        (None, None) => {
            c.refuse(
                &latest,
                "is missing, so the Mesos agent id is unknown: give it with --agent-id or \
                 --agent",
            );
            return None;
        }
    };
    if !is_component(&id) {
        c.refuse(&latest, format!("'{id}' is not an agent id"));
        return None;
    }
    Some(AgentRead { id, boot_id })
}

/// One operation's status stream as Mesos's recovery replays it (B.4).
#[derive(Debug, Clone, Default)]
pub(super) struct StreamRead {
    /// The file, as read.
    pub(super) digest: Option<FileDigest>,
    /// The statuses of the UPDATE records, in order.
    pub(super) updates: Vec<OperationStatus>,
    /// How many of them the ACK records acknowledged (a prefix).
    pub(super) acked: usize,
    /// An acknowledged status is terminal: Mesos forgets the operation.
    pub(super) terminated: bool,
    /// What lenient mode dropped or let pass, one line each.
    pub(super) notes: Vec<String>,
}

/// The provider's checkpoints.
#[derive(Debug)]
pub(super) struct ProviderRead {
    /// `…/resource_providers/<type>/<name>/latest`.
    pub(super) latest: PathBuf,
    /// The provider id: the basename of `latest`'s target.
    pub(super) rp_id: String,
    /// `…/<rp id>/resource_provider.state`.
    pub(super) state_path: PathBuf,
    /// Its content, resources upgraded (`None`: no file, or an empty one).
    pub(super) state: Option<ResourceProviderState>,
    /// The file as read.
    pub(super) digest: Option<FileDigest>,
    /// Streams of the operation directories that name an operation of `state`.
    pub(super) streams: BTreeMap<uuid::Uuid, (PathBuf, StreamRead)>,
}

/// `meta/slaves/<agent>/resource_providers/<type>/<name>/…` (provider.cpp recover, B.5
/// items 1 and 2). `None` when the provider has no identity (or a refusal was recorded).
pub(super) fn read_provider(
    c: &mut Collect<'_>,
    agent: &str,
    rp_type: &str,
    rp_name: &str,
) -> Option<ProviderRead> {
    let dir = c
        .work_dir
        .join("meta")
        .join("slaves")
        .join(agent)
        .join("resource_providers")
        .join(rp_type)
        .join(rp_name);
    let latest = dir.join("latest");
    match std::fs::symlink_metadata(&latest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            c.refuse(&latest, format!("cannot be read: {e}"));
            return None;
        }
        Ok(_) => {}
    }
    let real = match std::fs::canonicalize(&latest) {
        Ok(real) => real,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // os::realpath gives None: Mesos starts the provider as a new one.
            c.skip(
                &latest,
                "does not resolve: Mesos would start this provider as a new one, so there is \
                 no identity to take over",
            );
            return None;
        }
        Err(e) => {
            c.refuse(
                &latest,
                format!("Failed to read the latest symlink for resource provider: {e}"),
            );
            return None;
        }
    };
    let rp_id = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !is_component(&rp_id) {
        c.refuse(&latest, format!("'{rp_id}' is not a resource provider id"));
        return None;
    }
    let rp_dir = dir.join(&rp_id);
    let state_path = rp_dir.join("resource_provider.state");
    let (state, digest) = match c.read(&state_path) {
        None => (None, None),
        Some(bytes) => {
            let digest = FileDigest::of(c.relative(&state_path), &bytes);
            match read_message::<ResourceProviderState>(&bytes) {
                Ok(Some(mut state)) => match upgrade_message(&mut state) {
                    Ok(()) => (Some(state), Some(digest)),
                    Err(e) => {
                        c.refuse(
                            &state_path,
                            format!("Failed to read resource provider state: {e}"),
                        );
                        return None;
                    }
                },
                Ok(None) => (None, Some(digest)),
                Err(e) => {
                    c.refuse(
                        &state_path,
                        format!(
                            "Failed to read resource provider state: {}",
                            slrp_types::DisplayChain(&e)
                        ),
                    );
                    return None;
                }
            }
        }
    };
    let known: Vec<uuid::Uuid> = state
        .iter()
        .flat_map(|s| &s.operations)
        .filter_map(|op| uuid::Uuid::from_slice(&op.uuid.value).ok())
        .collect();
    let mut streams = BTreeMap::new();
    for path in c.entries(&rp_dir.join("operations")) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(uuid) = uuid::Uuid::parse_str(&name) else {
            c.refuse(
                &path,
                format!(
                    "Failed to parse operation path: '{name}' is not a UUID (Mesos's recovery \
                     fails on it)"
                ),
            );
            continue;
        };
        if !known.contains(&uuid) {
            c.skip(
                &path,
                format!(
                    "operation {uuid} is not in resource_provider.state: Mesos ignores it and \
                     removes its directory"
                ),
            );
            continue;
        }
        let file = path.join("operation.updates");
        let stream = match c.read(&file) {
            // The directory exists but no update was ever written: state "none".
            None => StreamRead::default(),
            Some(bytes) => match replay(c, &file, &bytes, uuid) {
                Some(stream) => stream,
                None => continue,
            },
        };
        streams.insert(uuid, (file, stream));
    }
    Some(ProviderRead {
        latest,
        rp_id,
        state_path,
        state,
        digest,
        streams,
    })
}

/// Replays one `operation.updates` (status_update_manager_process.hpp recover). `None`
/// after a refusal.
fn replay(
    c: &mut Collect<'_>,
    file: &Path,
    bytes: &[u8],
    operation: uuid::Uuid,
) -> Option<StreamRead> {
    let Records {
        records,
        good_len,
        tail,
    } = read_records::<UpdateOperationStatusRecord>(bytes);
    let offsets = record_starts(bytes);
    let mut stream = StreamRead {
        digest: Some(FileDigest::of(c.relative(file), bytes)),
        ..StreamRead::default()
    };
    let mut pending: VecDeque<OperationStatus> = VecDeque::new();
    // The first record Mesos's replay fails on, with why.
    let mut bad: Option<(usize, String)> = None;
    let mut passed = Vec::new();
    for (i, record) in records.into_iter().enumerate() {
        let offset = offsets.get(i).copied().unwrap_or(good_len);
        match RecordType::try_from(record.r#type) {
            Ok(RecordType::Update) => {
                let Some(update) = record.update else {
                    bad = Some((offset, "an UPDATE record without its update".into()));
                    break;
                };
                if status_uuid(&update.status).is_none() {
                    bad = Some((
                        offset,
                        "an UPDATE whose status has no 16-byte uuid (Mesos aborts on it)".into(),
                    ));
                    break;
                }
                let named = update
                    .operation_uuid
                    .as_ref()
                    .and_then(|u| uuid::Uuid::from_slice(&u.value).ok());
                if named != Some(operation) {
                    let text = format!(
                        "the UPDATE at offset {offset} names operation {} but is in the stream \
                         of operation {operation}",
                        named.map_or_else(|| "(none)".to_owned(), |u| u.to_string())
                    );
                    if !c.lenient {
                        // Not a record Mesos's replay stops at: lenient keeps it.
                        c.refuse(
                            file,
                            format!(
                                "{text}; re-run with --lenient to replay it as this operation's, \
                                 as the Mesos agent does with or without --strict"
                            ),
                        );
                        return None;
                    }
                    passed.push(text);
                }
                stream.updates.push(update.status.clone());
                pending.push_back(update.status);
            }
            Ok(RecordType::Ack) => {
                let acked = record
                    .uuid
                    .as_ref()
                    .and_then(|u| uuid::Uuid::from_slice(&u.value).ok());
                let Some(head) = pending.pop_front() else {
                    bad = Some((
                        offset,
                        format!(
                            "Unexpected operation status update acknowledgment (UUID: {}) for \
                             stream {operation}",
                            acked.map_or_else(|| "(none)".to_owned(), |u| u.to_string())
                        ),
                    ));
                    break;
                };
                if acked != status_uuid(&head) {
                    let text = format!(
                        "the ACK at offset {offset} acknowledges status {} but the first \
                         unacknowledged one is {}",
                        acked.map_or_else(|| "(none)".to_owned(), |u| u.to_string()),
                        status_uuid(&head).map_or_else(|| "(none)".to_owned(), |u| u.to_string())
                    );
                    if !c.lenient {
                        c.refuse(
                            file,
                            format!(
                                "{text}; re-run with --lenient to take it as the acknowledgement \
                                 of the first one, as the Mesos agent does with or without \
                                 --strict (it pops the first unacknowledged status without \
                                 comparing uuids)"
                            ),
                        );
                        return None;
                    }
                    // Mesos pops the head without comparing.
                    passed.push(text);
                }
                stream.acked += 1;
                stream.terminated |= is_terminal_state(head.state);
            }
            Err(_) => {
                bad = Some((
                    offset,
                    format!("a record of unknown type {}", record.r#type),
                ));
                break;
            }
        }
    }
    if let Some((offset, reason)) = bad {
        // Replay stopped early: drop the UPDATEs this cut removed from the counts.
        let kept_bytes = offset;
        let dropped = bytes.len() - kept_bytes;
        if !c.lenient {
            c.refuse(
                file,
                format!(
                    "record at offset {offset}: {reason}; re-run with --lenient to keep the \
                     records before it and drop it and the {dropped} bytes from there on, which \
                     is what a Mesos agent with --strict=false does"
                ),
            );
            return None;
        }
        stream.notes.push(format!(
            "dropped the record at offset {offset} and the {dropped} bytes from there on: \
             {reason}"
        ));
    } else {
        match tail {
            Tail::Clean => {}
            Tail::Torn { offset, have, want } => {
                if !c.lenient {
                    c.refuse(
                        file,
                        format!(
                            "torn last record at offset {offset}: {have} of its {want} bytes are \
                             there; re-run with --lenient to drop it, which is what the Mesos \
                             agent does even with --strict"
                        ),
                    );
                    return None;
                }
                stream.notes.push(format!(
                    "dropped the torn last record at offset {offset} ({have} of its {want} bytes)"
                ));
            }
            Tail::Corrupt { offset, reason } => {
                let dropped = bytes.len() - offset;
                if !c.lenient {
                    c.refuse(
                        file,
                        format!(
                            "unparseable record at offset {offset}: {reason}; re-run with \
                             --lenient to keep the records before it and drop the {dropped} \
                             bytes from there on, which is what a Mesos agent with \
                             --strict=false does"
                        ),
                    );
                    return None;
                }
                stream.notes.push(format!(
                    "dropped the unparseable record at offset {offset} and the {dropped} bytes \
                     from there on: {reason}"
                ));
            }
        }
    }
    stream.notes.extend(passed);
    if stream.updates.is_empty() {
        // Mesos deletes such a file: the stream is "none".
        stream.acked = 0;
        stream.terminated = false;
    }
    Some(stream)
}

/// One `volume.state`.
#[derive(Debug)]
pub(super) struct VolumeRead {
    /// The decoded volume id.
    pub(super) id: String,
    /// The directory name (the encoded id).
    pub(super) dir: String,
    /// The `volume.state` file.
    pub(super) path: PathBuf,
    /// The file as read.
    pub(super) digest: FileDigest,
    /// Its content.
    pub(super) state: MesosVolumeState,
}

/// `csi/<plugin type>/<plugin name>/volumes/*/volume.state` (v1_volume_manager.cpp
/// recover, B.5 item 6).
pub(super) fn read_volumes(
    c: &mut Collect<'_>,
    plugin_type: &str,
    plugin_name: &str,
) -> Vec<VolumeRead> {
    let dir = c
        .work_dir
        .join("csi")
        .join(plugin_type)
        .join(plugin_name)
        .join("volumes");
    let mut volumes = Vec::new();
    for path in c.entries(&dir) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !path.is_dir() {
            c.skip(&path, "not a volume directory");
            continue;
        }
        let id = match decode_volume_id(&name) {
            Ok(id) => id,
            Err(e) => {
                c.refuse(&path, format!("Failed to parse volume path: {e}"));
                continue;
            }
        };
        match encode_volume_id(&id) {
            Ok(enc) if enc == name => {}
            Ok(enc) => {
                c.refuse(
                    &path,
                    format!(
                        "the directory name is not the encoding of volume id '{id}' ('{enc}'): \
                         Mesos did not write it"
                    ),
                );
                continue;
            }
            Err(e) => {
                c.refuse(&path, format!("volume id '{id}': {e}"));
                continue;
            }
        }
        let state_path = path.join("volume.state");
        let Some(bytes) = c.read(&state_path) else {
            if !state_path.exists() {
                c.skip(&path, "no volume.state: Mesos does not track this volume");
            }
            continue;
        };
        match read_message::<MesosVolumeState>(&bytes) {
            Ok(Some(state)) => volumes.push(VolumeRead {
                digest: FileDigest::of(c.relative(&state_path), &bytes),
                id,
                dir: name,
                path: state_path,
                state,
            }),
            Ok(None) => c.skip(&state_path, "empty: Mesos ignores this volume"),
            Err(e) => c.refuse(
                &state_path,
                format!(
                    "Failed to read volume state: {}",
                    slrp_types::DisplayChain(&e)
                ),
            ),
        }
    }
    volumes
}
