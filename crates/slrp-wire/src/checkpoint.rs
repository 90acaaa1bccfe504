//! The Mesos agent's checkpoint encodings, read and written byte for byte as Mesos does.
//!
//! # Overview
//! The Mesos storage local resource provider keeps its state in files of length-prefixed
//! protobuf messages (stout's `protobuf::write`/`read`): a `u32` length in host byte order
//! (little-endian on every platform Mesos supports; this module always uses little-endian)
//! followed by the message. Two shapes exist:
//! - a **single-message checkpoint** (`resource_provider.state`, `volume.state`,
//!   `container.info`): one record, replaced atomically (temp file + rename). Read with
//!   [`read_message`], written with [`write_message`];
//! - a **record stream** (`operation.updates`): records appended one by one, so a crash can
//!   leave a torn last record. Read with [`read_records`], appended with [`append_record`].
//!
//! Messages holding `Resource`s are written *downgraded* (pre-reservation-refinement form)
//! and upgraded on read: [`downgrade_resources`] / [`upgrade_resources`] convert one list,
//! [`downgrade_message`] / [`upgrade_message`] every `Resource` nested anywhere in a message,
//! as Mesos's `slave::state::checkpoint` and `slave::state::read` do. The stream records are
//! written verbatim (no downgrade) by Mesos.
//!
//! # Reading rules (stout `protobuf::read`)
//! An empty file is "no message" (`Ok(None)`), not an error. A short length prefix or a
//! short body is [`CheckpointError::Truncated`]. The body must decode and carry every proto2
//! `required` field (C++'s parse checks `IsInitialized`; prost does not, so
//! [`crate::required`] does), and its proto2 enums must hold defined numbers
//! ([`CheckpointError::UndefinedEnum`]). Bytes after the one message of a single-message checkpoint
//! are ignored. A stream stops at its first torn or undecodable record and reports it as
//! its [`Tail`]; whether that is fatal (strict) or dropped (lenient) is the caller's policy.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;

use prost::{Message, Name};
use prost_reflect::{
    DynamicMessage, Kind, MapKey, MessageDescriptor, ReflectMessage as _, Syntax, Value,
};
use slrp_proto::mesos::v1::Resource;
use slrp_proto::mesos::v1::resource::ReservationInfo;
use slrp_proto::mesos::v1::resource::reservation_info::Type as ReservationType;
use slrp_types::AtomicWrite;

use crate::json::descriptor_of;
use crate::required::{MissingField, check_required};

/// Bytes of the length prefix in front of every record.
const PREFIX: usize = 4;

/// Errors from reading a checkpoint record.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The bytes end inside a record: in its 4-byte length prefix (`want` = 4) or in its
    /// body (`want` = 4 + the length the prefix announces).
    #[error("checkpoint record truncated: it needs {want} bytes, only {have} are there")]
    Truncated {
        /// Bytes the whole record (prefix and body) needs.
        want: usize,
        /// Bytes present from the record's start to the end of the data.
        have: usize,
    },
    /// The body is not a valid protobuf encoding of the expected message.
    #[error("checkpoint record is not a valid {message}")]
    Decode {
        /// Full protobuf name of the expected message.
        message: String,
        /// prost's description of the problem.
        #[source]
        source: prost::DecodeError,
    },
    /// The body decodes but lacks a proto2 `required` field.
    #[error("checkpoint record {message} lacks required field '{path}'")]
    MissingRequired {
        /// Full protobuf name of the top-level message.
        message: String,
        /// Path of the missing field from the top-level message, e.g. `status.state`.
        path: String,
        /// The missing field, with the message that declares it.
        #[source]
        source: MissingField,
    },
    /// A proto2 enum field holds a number its enum does not define. C++ parsing moves such
    /// a number to the unknown fields, so a *required* enum holding one is missing there
    /// and Mesos fails to read the file; for an optional or repeated enum Mesos reads the
    /// field as unset. slrp refuses both: it keeps no value it cannot interpret.
    #[error(
        "checkpoint record {message} holds {number} in '{path}', which {enum_name} does not define"
    )]
    UndefinedEnum {
        /// Full protobuf name of the top-level message.
        message: String,
        /// Path of the field from the top-level message, e.g. `status.state`.
        path: String,
        /// Full protobuf name of the enum.
        enum_name: String,
        /// The undefined number.
        number: i32,
    },
    /// The message type is not among slrp-proto's descriptors (a programming error).
    #[error("no descriptor for message {message}")]
    UnknownMessage {
        /// Full protobuf name of the message.
        message: String,
    },
}

/// Records read from a stream, up to its first bad record.
#[derive(Debug, Clone, PartialEq)]
pub struct Records<M> {
    /// Every complete, valid record before the first bad one, in order.
    pub records: Vec<M>,
    /// Byte length of the good prefix: where the first bad record (if any) starts. Mesos
    /// truncates its own file here after recovery; slrp only reports it.
    pub good_len: usize,
    /// What follows the good records.
    pub tail: Tail,
}

/// What a stream holds after its last good record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Nothing: the stream ends exactly after a record.
    Clean,
    /// A record cut short by a crash during an append: `have` of its `want` bytes are there
    /// (`want` = 4 while the length prefix itself is short).
    Torn {
        /// Byte offset of the record's start (= [`Records::good_len`]).
        offset: usize,
        /// Bytes present from `offset` to the end.
        have: usize,
        /// Bytes the whole record (prefix and body) needs.
        want: usize,
    },
    /// A complete record that does not decode as the expected message (wrong message,
    /// garbage, a missing required field).
    Corrupt {
        /// Byte offset of the record's start (= [`Records::good_len`]).
        offset: usize,
        /// Why it does not decode, with the whole cause chain.
        reason: String,
    },
}

/// Where the next record's body lies, or how it is cut short.
enum Frame<'a> {
    End,
    Short { have: usize, want: usize },
    Whole { body: &'a [u8], len: usize },
}

fn frame(bytes: &[u8]) -> Frame<'_> {
    if bytes.is_empty() {
        return Frame::End;
    }
    let Some((prefix, rest)) = bytes.split_first_chunk::<PREFIX>() else {
        return Frame::Short {
            have: bytes.len(),
            want: PREFIX,
        };
    };
    // A u32 always fits in usize on the 32- and 64-bit targets slrp builds for.
    let size = u32::from_le_bytes(*prefix) as usize;
    match rest.get(..size) {
        Some(body) => Frame::Whole {
            body,
            len: PREFIX + size,
        },
        None => Frame::Short {
            have: bytes.len(),
            want: PREFIX.saturating_add(size),
        },
    }
}

/// Decodes one record body as `M`, with the proto2 `required` check C++ parsing does.
fn decode_body<M: Message + Name + Default>(body: &[u8]) -> Result<M, CheckpointError> {
    let descriptor = descriptor::<M>()?;
    let decode_error = |source| CheckpointError::Decode {
        message: M::full_name(),
        source,
    };
    let dynamic = DynamicMessage::decode(descriptor, body).map_err(decode_error)?;
    check_required(&dynamic).map_err(|source| CheckpointError::MissingRequired {
        message: M::full_name(),
        path: source.path.to_string(),
        source,
    })?;
    if let Some(undefined) = undefined_enum(&dynamic) {
        return Err(CheckpointError::UndefinedEnum {
            message: M::full_name(),
            path: undefined.path.join("."),
            enum_name: undefined.enum_name,
            number: undefined.number,
        });
    }
    M::decode(body).map_err(decode_error)
}

/// A proto2 enum field holding an undefined number, with its path (outermost first).
struct Undefined {
    path: Vec<String>,
    enum_name: String,
    number: i32,
}

/// The first proto2 (closed) enum field of `message`, or of a message nested in it, that
/// holds a number its enum does not define. Proto3 enums are open: any number is valid.
fn undefined_enum(message: &DynamicMessage) -> Option<Undefined> {
    let undefined = |name: String, kind: &Kind, value: &Value| {
        let (Kind::Enum(e), Value::EnumNumber(n)) = (kind, value) else {
            return None;
        };
        let closed = e.parent_file().syntax() == Syntax::Proto2;
        (closed && e.get_value(*n).is_none()).then(|| Undefined {
            path: vec![name],
            enum_name: e.full_name().to_owned(),
            number: *n,
        })
    };
    let nested = |name: String, value: &Value| match value {
        Value::Message(inner) => undefined_enum(inner).map(|mut u| {
            u.path.insert(0, name);
            u
        }),
        _ => None,
    };
    for (field, value) in message.fields() {
        let kind = field.kind();
        let name = field.name();
        let found = match value {
            Value::List(items) => items.iter().enumerate().find_map(|(i, item)| {
                let at = format!("{name}[{i}]");
                undefined(at.clone(), &kind, item).or_else(|| nested(at, item))
            }),
            Value::Map(entries) => {
                let Kind::Message(entry) = &kind else {
                    continue;
                };
                let value_kind = entry.map_entry_value_field().kind();
                entries.iter().find_map(|(key, item)| {
                    let at = match key {
                        MapKey::String(key) => format!("{name}[{key:?}]"),
                        other => format!("{name}[{other:?}]"),
                    };
                    undefined(at.clone(), &value_kind, item).or_else(|| nested(at, item))
                })
            }
            single => undefined(name.to_owned(), &kind, single)
                .or_else(|| nested(name.to_owned(), single)),
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

fn descriptor<M: Name>() -> Result<MessageDescriptor, CheckpointError> {
    descriptor_of::<M>().map_err(|_| CheckpointError::UnknownMessage {
        message: M::full_name(),
    })
}

/// Reads a single-message checkpoint (`resource_provider.state`, `volume.state`,
/// `container.info`) from the file's whole content.
///
/// Returns `Ok(None)` for an empty file, which Mesos treats as absent. Resources are
/// returned as stored (downgraded); see [`upgrade_message`].
///
/// # Errors
/// [`CheckpointError::Truncated`] for a short length prefix or body,
/// [`CheckpointError::Decode`] or [`CheckpointError::MissingRequired`] for a body that is
/// not a complete `M`. Bytes after the message are ignored, as Mesos does.
pub fn read_message<M: Message + Name + Default>(
    bytes: &[u8],
) -> Result<Option<M>, CheckpointError> {
    match frame(bytes) {
        Frame::End => Ok(None),
        Frame::Short { have, want } => Err(CheckpointError::Truncated { want, have }),
        Frame::Whole { body, .. } => decode_body(body).map(Some),
    }
}

/// Encodes `msg` as one record: its length as a little-endian `u32`, then the message.
///
/// prost always emits proto2 `required` fields, so the record is complete, as Mesos's
/// writer (which refuses an uninitialized message) requires.
///
/// # Panics
/// If the message encodes to 4 GiB or more, which no checkpoint message comes near (Mesos
/// caps a protobuf at 64 MiB).
#[must_use]
pub fn encode_message<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let prefix = u32::try_from(len).expect("a checkpoint message is smaller than 4 GiB");
    let mut out = Vec::with_capacity(PREFIX + len);
    out.extend_from_slice(&prefix.to_le_bytes());
    msg.encode_raw(&mut out);
    out
}

/// Replaces the single-message checkpoint at `path` atomically, as Mesos's
/// `slave::state::checkpoint` does: the parent directories are created, the record goes to
/// a temporary file with a six-character random name in the same directory (so a crash
/// leaves a `mkstemp`-style leftover, never a torn checkpoint), which is renamed over
/// `path`. With `sync`, the file is fsynced before the rename and the directory after it.
/// The steps are [`slrp_types::AtomicWrite`]'s, with
/// [`random_temp_name`](slrp_types::AtomicWrite::random_temp_name).
///
/// Resources are written as given: call [`downgrade_message`] first to write what Mesos
/// writes.
///
/// # Errors
/// Any I/O error creating the directory, writing, syncing or renaming (the message names
/// the step); the temporary file is removed on failure.
pub fn write_message<M: Message>(path: &Path, msg: &M, sync: bool) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    AtomicWrite::new()
        .random_temp_name()
        .durable(sync)
        .write(path, &encode_message(msg))
        .map_err(io::Error::from)
}

/// Reads a record stream (`operation.updates`): every record up to the first one that is
/// torn or does not decode as a complete `M`, and what follows them.
///
/// Never fails: a bad record ends the stream and is reported in [`Records::tail`] with its
/// offset, so the caller can refuse it (strict) or drop it (lenient).
#[must_use]
pub fn read_records<M: Message + Name + Default>(bytes: &[u8]) -> Records<M> {
    let mut records = Vec::new();
    let mut offset = 0;
    let tail = loop {
        let rest = &bytes[offset..];
        match frame(rest) {
            Frame::End => break Tail::Clean,
            Frame::Short { have, want } => break Tail::Torn { offset, have, want },
            Frame::Whole { body, len } => match decode_body::<M>(body) {
                Ok(record) => {
                    records.push(record);
                    offset += len;
                }
                Err(e) => {
                    break Tail::Corrupt {
                        offset,
                        reason: chain(&e),
                    };
                }
            },
        }
    };
    Records {
        records,
        good_len: offset,
        tail,
    }
}

/// Where each complete record of a stream starts, in order, whether or not it decodes:
/// the offsets to name in a report about the records [`read_records`] returned (its
/// `records[i]` starts at `record_starts(bytes)[i]`). Stops before a torn record.
#[must_use]
pub fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut offset = 0;
    while let Frame::Whole { len, .. } = frame(&bytes[offset..]) {
        starts.push(offset);
        offset += len;
    }
    starts
}

/// Appends `msg` as one record to an open stream and syncs it, as Mesos's status update
/// manager does with its `O_SYNC` descriptor. The record is written with one `write_all`,
/// so only a crash (or a full disk) can leave it torn.
///
/// # Errors
/// Any I/O error writing or syncing.
pub fn append_record<M: Message>(file: &mut File, msg: &M) -> io::Result<()> {
    file.write_all(&encode_message(msg))?;
    file.sync_data()
}

/// `error` and its sources, `: `-separated, for a reason kept as text.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Converts resources to the pre-reservation-refinement form Mesos checkpoints (spec
/// §8.1): unreserved → `role: "*"`; one reservation → `role` and, for a DYNAMIC one, a
/// `reservation` with its principal and labels (a STATIC one has no `reservation`);
/// `reservations` is then cleared. Resources with refined reservations (two or more) have
/// no such form and stay as they are (Mesos gives up on them too and checkpoints them in
/// the new form). A resource already in the old form (`role` set, no `reservations`) is
/// left alone, so the conversion is idempotent.
pub fn downgrade_resources(resources: &mut [Resource]) {
    resources.iter_mut().for_each(downgrade_resource);
}

/// Converts checkpointed resources back to the post-reservation-refinement form (Mesos's
/// `upgradeResources`): with `reservations` present, the legacy `role` and `reservation` are
/// dropped; else `role` `"*"` (or unset) means unreserved and is dropped; else the one
/// reservation becomes `reservations[0]` with that role, DYNAMIC (keeping the
/// reservation's principal and labels) if `reservation` is set, else STATIC. Idempotent.
pub fn upgrade_resources(resources: &mut [Resource]) {
    resources.iter_mut().for_each(upgrade_resource);
}

fn downgrade_resource(resource: &mut Resource) {
    match resource.reservations.as_slice() {
        [] => {
            if resource.role.is_none() {
                resource.role = Some("*".to_owned());
            }
        }
        [only] => {
            let dynamic = only.r#type == Some(ReservationType::Dynamic as i32);
            resource.reservation = dynamic.then(|| ReservationInfo {
                principal: only.principal.clone(),
                labels: only.labels.clone(),
                ..ReservationInfo::default()
            });
            resource.role = Some(only.role.clone().unwrap_or_default());
            resource.reservations.clear();
        }
        [_, _, ..] => {}
    }
}

fn upgrade_resource(resource: &mut Resource) {
    if !resource.reservations.is_empty() {
        resource.role = None;
        resource.reservation = None;
        return;
    }
    let role = resource.role.take().unwrap_or_else(|| "*".to_owned());
    if role == "*" {
        resource.reservation = None;
        return;
    }
    let reservation = match resource.reservation.take() {
        Some(reservation) => ReservationInfo {
            r#type: Some(ReservationType::Dynamic as i32),
            role: Some(role),
            ..reservation
        },
        None => ReservationInfo {
            r#type: Some(ReservationType::Static as i32),
            role: Some(role),
            ..ReservationInfo::default()
        },
    };
    resource.reservations.push(reservation);
}

/// Applies [`downgrade_resources`] to every `mesos.v1.Resource` anywhere inside `msg`
/// (operations' resources, converted resources of statuses, …), as Mesos's
/// `downgradeResources(Message*)` does before checkpointing.
///
/// # Errors
/// [`CheckpointError::UnknownMessage`] if `M` has no descriptor; the others cannot occur
/// for a message prost encoded itself.
pub fn downgrade_message<M: Message + Name + Default>(msg: &mut M) -> Result<(), CheckpointError> {
    convert_message(msg, downgrade_resource)
}

/// Applies [`upgrade_resources`] to every `mesos.v1.Resource` anywhere inside `msg`, as
/// Mesos's `slave::state::read` does after reading a checkpoint.
///
/// # Errors
/// As [`downgrade_message`].
pub fn upgrade_message<M: Message + Name + Default>(msg: &mut M) -> Result<(), CheckpointError> {
    convert_message(msg, upgrade_resource)
}

fn convert_message<M: Message + Name + Default>(
    msg: &mut M,
    convert: fn(&mut Resource),
) -> Result<(), CheckpointError> {
    let descriptor = descriptor::<M>()?;
    let decode_error = |source| CheckpointError::Decode {
        message: M::full_name(),
        source,
    };
    let mut dynamic =
        DynamicMessage::decode(descriptor, msg.encode_to_vec().as_slice()).map_err(decode_error)?;
    convert_dynamic(&mut dynamic, convert).map_err(decode_error)?;
    *msg = M::decode(dynamic.encode_to_vec().as_slice()).map_err(decode_error)?;
    Ok(())
}

fn convert_dynamic(
    message: &mut DynamicMessage,
    convert: fn(&mut Resource),
) -> Result<(), prost::DecodeError> {
    if message.descriptor().full_name() == Resource::full_name() {
        let mut resource: Resource = message.transcode_to()?;
        convert(&mut resource);
        // `transcode_from` merges: start from an empty message so cleared fields go.
        *message = DynamicMessage::new(message.descriptor());
        return message.transcode_from(&resource);
    }
    for (field, value) in message.fields_mut() {
        let Kind::Message(_) = field.kind() else {
            continue;
        };
        match value {
            Value::Message(inner) => convert_dynamic(inner, convert)?,
            Value::List(items) => {
                for item in items {
                    if let Value::Message(inner) = item {
                        convert_dynamic(inner, convert)?;
                    }
                }
            }
            Value::Map(entries) => {
                for entry in entries.values_mut() {
                    if let Value::Message(inner) = entry {
                        convert_dynamic(inner, convert)?;
                    }
                }
            }
            // The field is of message kind: no other value can hold it.
            _ => {}
        }
    }
    Ok(())
}
