//! Wire codecs for slrp.
//!
//! # Overview
//! The Mesos resource provider API carries protobuf messages either as binary protobuf or
//! as Mesos-style JSON, and streams events as RecordIO records. This crate turns bytes into
//! checked messages and back; it does no network I/O of its own.
//!
//! # Layout
//! - [`recordio`]: incremental RecordIO framing for `tokio_util::codec`.
//! - [`json`]: Mesos-compatible JSON (snake_case names, enums by name, int64 as numbers).
//! - [`required`]: proto2 `required` field enforcement, which prost does not do.
//! - [`checkpoint`]: the Mesos agent's length-prefixed checkpoint files and record streams,
//!   and the resource downgrade/upgrade Mesos applies to them.
//! - this file: [`ContentType`] and the [`decode`]/[`encode`] entry points used on the wire.
//!
//! # Invariants
//! Every decoder here returns an error, never panics, on arbitrary input (property-tested),
//! and a message that [`decode`] returns has all its required fields set.

pub mod checkpoint;
pub mod json;
pub mod recordio;
pub mod required;

use prost::{Message, Name};
use prost_reflect::DynamicMessage;

pub use checkpoint::{CheckpointError, Records, Tail};
pub use json::JsonError;
pub use recordio::{RecordIoDecoder, RecordIoEncoder, RecordIoError};
pub use required::MissingField;

/// The two media types of the Mesos v1 HTTP APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContentType {
    /// `application/x-protobuf`: binary protobuf.
    Protobuf,
    /// `application/json`: Mesos-style JSON.
    Json,
}

impl ContentType {
    /// The media type string, as sent in `Content-Type` and `Accept`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Protobuf => "application/x-protobuf",
            Self::Json => "application/json",
        }
    }

    /// Parses a `Content-Type` header value, ignoring parameters such as `charset` and the
    /// case of the type (Mesos compares exactly; we are lenient in what we accept).
    #[must_use]
    pub fn from_header(value: &str) -> Option<Self> {
        let essence = value.split(';').next().unwrap_or_default().trim();
        if essence.eq_ignore_ascii_case(Self::Protobuf.as_str()) {
            Some(Self::Protobuf)
        } else if essence.eq_ignore_ascii_case(Self::Json.as_str()) {
            Some(Self::Json)
        } else {
            None
        }
    }
}

impl std::fmt::Display for ContentType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors from [`decode`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not a valid protobuf encoding of the message.
    #[error("malformed protobuf {message}")]
    Protobuf {
        /// Full name of the expected message.
        message: String,
        /// prost's description of the problem.
        #[source]
        source: prost::DecodeError,
    },
    /// The protobuf is well-formed but lacks a required field.
    #[error("incomplete protobuf {message}")]
    Required {
        /// Full name of the top-level message.
        message: String,
        /// The missing field.
        #[source]
        source: MissingField,
    },
    /// The JSON form could not be decoded.
    #[error("decoding JSON")]
    Json(#[from] JsonError),
}

fn check_protobuf<M: Message + Name>(bytes: &[u8]) -> Result<(), DecodeError> {
    let descriptor = json::descriptor_of::<M>()?;
    let dynamic =
        DynamicMessage::decode(descriptor, bytes).map_err(|source| DecodeError::Protobuf {
            message: M::full_name(),
            source,
        })?;
    required::check_required(&dynamic).map_err(|source| DecodeError::Required {
        message: M::full_name(),
        source,
    })
}

/// Decodes a message received with the given content type, enforcing required fields.
///
/// # Errors
/// [`DecodeError`] naming the message and, for a missing field, its path.
pub fn decode<M: Message + Name + Default>(
    content_type: ContentType,
    bytes: &[u8],
) -> Result<M, DecodeError> {
    match content_type {
        ContentType::Protobuf => {
            check_protobuf::<M>(bytes)?;
            M::decode(bytes).map_err(|source| DecodeError::Protobuf {
                message: M::full_name(),
                source,
            })
        }
        ContentType::Json => Ok(json::from_slice(bytes)?),
    }
}

/// Encodes a message for sending with the given content type.
///
/// No required-field check is needed here: prost represents proto2 `required` fields as
/// plain (non-optional) fields and always emits them, so a generated message cannot be
/// incomplete on the way out. Only inbound bytes need [`decode`]'s check.
///
/// # Errors
/// [`JsonError`] if rendering JSON fails (it does not for `slrp-proto` messages).
pub fn encode<M: Message + Name>(
    content_type: ContentType,
    message: &M,
) -> Result<Vec<u8>, JsonError> {
    match content_type {
        ContentType::Protobuf => Ok(message.encode_to_vec()),
        ContentType::Json => json::to_vec(message),
    }
}
