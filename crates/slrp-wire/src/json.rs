//! Mesos-compatible JSON for protobuf messages.
//!
//! Mesos does not speak canonical proto3 JSON. Its parser and printer (stout's `protobuf`
//! helpers) use the proto field names (`snake_case`), enum values by name, 64-bit integers
//! as JSON *numbers* (a string for an `int64` field is an error there), `bytes` as standard
//! base64, `null` as "unset", and they ignore unknown fields. This module produces and
//! accepts exactly that, by reflection over the descriptors in `slrp-proto`.
//!
//! Unknown names are ignored by default, as Mesos does; [`Unknown::Reject`] is for files an
//! operator wrote, where an unknown name is a typo.
//!
//! Decoding also enforces proto2 `required` fields (see [`crate::required`]), because a
//! config file or call that lacks one is rejected by Mesos and must be rejected by slrp
//! with a message that names the field.

use prost::{Message, Name};
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};

use crate::required::{MissingField, check_required};

/// Errors from converting between JSON and protobuf messages.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The message type has no descriptor in `slrp-proto` (a programming error).
    #[error("no descriptor for message type {message}")]
    UnknownMessage {
        /// The full name that was looked up.
        message: String,
    },
    /// The text is not JSON, or does not match the message's fields and types.
    #[error("invalid JSON for {message}")]
    Invalid {
        /// Full name of the message being decoded.
        message: String,
        /// What the parser objected to, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON is well-formed but lacks a proto2 `required` field.
    #[error("incomplete {message}")]
    Required {
        /// Full name of the top-level message.
        message: String,
        /// The missing field.
        #[source]
        source: MissingField,
    },
    /// Converting between the reflected and the generated representation failed.
    #[error("converting {message} between reflected and generated form")]
    Transcode {
        /// Full name of the message.
        message: String,
        /// The protobuf decoding error.
        #[source]
        source: prost::DecodeError,
    },
    /// Rendering the message as JSON failed.
    #[error("serializing {message} as JSON")]
    Serialize {
        /// Full name of the message.
        message: String,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
}

/// The descriptor of a generated message type.
///
/// # Errors
/// [`JsonError::UnknownMessage`] when `M` is not one of `slrp-proto`'s messages.
pub fn descriptor_of<M: Name>() -> Result<MessageDescriptor, JsonError> {
    let name = M::full_name();
    slrp_proto::descriptor_pool()
        .get_message_by_name(&name)
        .ok_or(JsonError::UnknownMessage { message: name })
}

fn serialize_options() -> SerializeOptions {
    SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .use_enum_numbers(false)
        .skip_default_fields(true)
}

/// What to do with JSON the descriptors do not know: an unknown field, or an enum value
/// name that the enum does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unknown {
    /// Drop it silently, as Mesos does. Right for messages from peers, which may be newer
    /// than we are.
    #[default]
    Ignore,
    /// Reject it. Right for files an operator wrote, where an unknown name is a typo
    /// (`CONTROLER_SERVICE`) that would otherwise vanish without a trace.
    Reject,
}

fn deserialize_options(unknown: Unknown) -> DeserializeOptions {
    DeserializeOptions::new().deny_unknown_fields(unknown == Unknown::Reject)
}

fn to_dynamic<M: Message + Name>(message: &M) -> Result<DynamicMessage, JsonError> {
    let descriptor = descriptor_of::<M>()?;
    DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice()).map_err(|source| {
        JsonError::Transcode {
            message: M::full_name(),
            source,
        }
    })
}

/// Renders `message` as a Mesos-style JSON value.
///
/// # Errors
/// See [`JsonError`]; none occur for messages generated in `slrp-proto`.
pub fn to_value<M: Message + Name>(message: &M) -> Result<serde_json::Value, JsonError> {
    let dynamic = to_dynamic(message)?;
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &serialize_options())
        .map_err(|source| JsonError::Serialize {
            message: M::full_name(),
            source,
        })
}

/// Renders `message` as compact Mesos-style JSON text.
///
/// # Errors
/// See [`to_value`].
pub fn to_vec<M: Message + Name>(message: &M) -> Result<Vec<u8>, JsonError> {
    protobuf_to_vec::<M>(&message.encode_to_vec())
}

/// Renders the protobuf encoding of an `M` as compact Mesos-style JSON text: for a caller
/// that encodes a large message itself rather than building it (the UPDATE_STATE of a
/// large total).
///
/// # Errors
/// [`JsonError::Transcode`] if `protobuf` is not an `M`; otherwise as [`to_value`].
pub fn protobuf_to_vec<M: Name>(protobuf: &[u8]) -> Result<Vec<u8>, JsonError> {
    let descriptor = descriptor_of::<M>()?;
    let dynamic =
        DynamicMessage::decode(descriptor, protobuf).map_err(|source| JsonError::Transcode {
            message: M::full_name(),
            source,
        })?;
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::new(&mut out);
    dynamic
        .serialize_with_options(&mut serializer, &serialize_options())
        .map_err(|source| JsonError::Serialize {
            message: M::full_name(),
            source,
        })?;
    Ok(out)
}

/// Renders `message` as indented Mesos-style JSON text, for files people read.
///
/// # Errors
/// See [`to_value`].
pub fn to_string_pretty<M: Message + Name>(message: &M) -> Result<String, JsonError> {
    let value = to_value(message)?;
    serde_json::to_string_pretty(&value).map_err(|source| JsonError::Serialize {
        message: M::full_name(),
        source,
    })
}

fn finish<M: Message + Name + Default>(dynamic: DynamicMessage) -> Result<M, JsonError> {
    check_required(&dynamic).map_err(|source| JsonError::Required {
        message: M::full_name(),
        source,
    })?;
    dynamic
        .transcode_to::<M>()
        .map_err(|source| JsonError::Transcode {
            message: M::full_name(),
            source,
        })
}

/// Parses Mesos-style JSON text into `M`, rejecting a missing required field.
///
/// # Errors
/// [`JsonError::Invalid`] for text that is not JSON or does not fit `M` (wrong types,
/// unknown enum names); [`JsonError::Required`] when a required field is absent.
pub fn from_slice<M: Message + Name + Default>(text: &[u8]) -> Result<M, JsonError> {
    from_slice_with(text, Unknown::Ignore)
}

/// Parses Mesos-style JSON text into `M`, with a choice about unknown names.
///
/// # Errors
/// As [`from_slice`]; with [`Unknown::Reject`] also [`JsonError::Invalid`] naming an
/// unknown field or enum value.
pub fn from_slice_with<M: Message + Name + Default>(
    text: &[u8],
    unknown: Unknown,
) -> Result<M, JsonError> {
    let descriptor = descriptor_of::<M>()?;
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor,
        &mut deserializer,
        &deserialize_options(unknown),
    )
    .and_then(|m| deserializer.end().map(|()| m))
    .map_err(|source| JsonError::Invalid {
        message: M::full_name(),
        source,
    })?;
    finish(dynamic)
}

/// Parses an already-parsed JSON value into `M`.
///
/// # Errors
/// As [`from_slice`].
pub fn from_value<M: Message + Name + Default>(value: serde_json::Value) -> Result<M, JsonError> {
    from_value_with(value, Unknown::Ignore)
}

/// Converts an already-parsed JSON value into `M`, with a choice about unknown names.
///
/// # Errors
/// As [`from_slice_with`].
pub fn from_value_with<M: Message + Name + Default>(
    value: serde_json::Value,
    unknown: Unknown,
) -> Result<M, JsonError> {
    let descriptor = descriptor_of::<M>()?;
    let dynamic =
        DynamicMessage::deserialize_with_options(descriptor, value, &deserialize_options(unknown))
            .map_err(|source| JsonError::Invalid {
                message: M::full_name(),
                source,
            })?;
    finish(dynamic)
}
