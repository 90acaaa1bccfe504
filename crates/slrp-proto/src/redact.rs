//! `Debug` for the generated messages that carry secret values, with the values redacted.
//!
//! CSI says secrets "MUST be treated as such (not logged, etc.)"; Mesos `Secret` values and
//! `Credential`s are passwords and tokens. prost derives a `Debug` that prints every field,
//! so one `?request` in a log line would leak them. `cargo xtask codegen` skips the derived
//! impl for the messages in [`REDACTED`] (its list `REDACTED_DEBUG` must match; a mismatch
//! does not compile), and this module formats them through reflection instead: every field
//! as prost would show it, except that secret values print as `<redacted>` (map keys stay,
//! so a log still says which secrets were sent). Messages nesting a Mesos `Secret` need no
//! impl of their own: the derived `Debug` reaches `Secret.Value`'s, which redacts.
//!
//! What counts as secret ([`is_secret_field`]): a field named `secrets`, `*_secrets` or
//! `secret` that holds strings or bytes (directly or as map values), and the data of a
//! `mesos.v1.Secret.Value`.

use std::fmt::{self, Write as _};

use prost::Message;
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MapKey, ReflectMessage, Value};

use crate::csi::{v0, v1};
use crate::descriptor_pool;
use crate::mesos::v1 as mesos;

/// What a secret value prints as.
pub const REDACTED_TEXT: &str = "<redacted>";

/// The full name of a Mesos secret's value.
const SECRET_VALUE: &str = "mesos.v1.Secret.Value";

macro_rules! redacted_debug {
    ($($ty:ty => $name:literal),* $(,)?) => {
        /// The messages whose `Debug` redacts secret values (full protobuf names).
        pub const REDACTED: &[&str] = &[$($name),*];
        $(
            impl fmt::Debug for $ty {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    fmt_redacted($name, &self.encode_to_vec(), f)
                }
            }
        )*
    };
}

redacted_debug! {
    v0::ControllerPublishVolumeRequest => "csi.v0.ControllerPublishVolumeRequest",
    v0::ControllerUnpublishVolumeRequest => "csi.v0.ControllerUnpublishVolumeRequest",
    v0::CreateSnapshotRequest => "csi.v0.CreateSnapshotRequest",
    v0::CreateVolumeRequest => "csi.v0.CreateVolumeRequest",
    v0::DeleteSnapshotRequest => "csi.v0.DeleteSnapshotRequest",
    v0::DeleteVolumeRequest => "csi.v0.DeleteVolumeRequest",
    v0::NodePublishVolumeRequest => "csi.v0.NodePublishVolumeRequest",
    v0::NodeStageVolumeRequest => "csi.v0.NodeStageVolumeRequest",
    v1::ControllerExpandVolumeRequest => "csi.v1.ControllerExpandVolumeRequest",
    v1::ControllerModifyVolumeRequest => "csi.v1.ControllerModifyVolumeRequest",
    v1::ControllerPublishVolumeRequest => "csi.v1.ControllerPublishVolumeRequest",
    v1::ControllerUnpublishVolumeRequest => "csi.v1.ControllerUnpublishVolumeRequest",
    v1::CreateSnapshotRequest => "csi.v1.CreateSnapshotRequest",
    v1::CreateVolumeGroupSnapshotRequest => "csi.v1.CreateVolumeGroupSnapshotRequest",
    v1::CreateVolumeRequest => "csi.v1.CreateVolumeRequest",
    v1::DeleteSnapshotRequest => "csi.v1.DeleteSnapshotRequest",
    v1::DeleteVolumeGroupSnapshotRequest => "csi.v1.DeleteVolumeGroupSnapshotRequest",
    v1::DeleteVolumeRequest => "csi.v1.DeleteVolumeRequest",
    v1::GetMetadataAllocatedRequest => "csi.v1.GetMetadataAllocatedRequest",
    v1::GetMetadataDeltaRequest => "csi.v1.GetMetadataDeltaRequest",
    v1::GetSnapshotRequest => "csi.v1.GetSnapshotRequest",
    v1::GetVolumeGroupSnapshotRequest => "csi.v1.GetVolumeGroupSnapshotRequest",
    v1::ListSnapshotsRequest => "csi.v1.ListSnapshotsRequest",
    v1::NodeExpandVolumeRequest => "csi.v1.NodeExpandVolumeRequest",
    v1::NodePublishVolumeRequest => "csi.v1.NodePublishVolumeRequest",
    v1::NodeStageVolumeRequest => "csi.v1.NodeStageVolumeRequest",
    v1::ValidateVolumeCapabilitiesRequest => "csi.v1.ValidateVolumeCapabilitiesRequest",
    mesos::Credential => "mesos.v1.Credential",
    mesos::secret::Value => "mesos.v1.Secret.Value",
}

/// Whether `field` holds secret values (see the module docs).
pub fn is_secret_field(field: &FieldDescriptor) -> bool {
    let name = field.name();
    if !(name == "secrets" || name == "secret" || name.ends_with("_secrets")) {
        return false;
    }
    let kind = match field.kind() {
        Kind::Message(entry) if field.is_map() => entry.map_entry_value_field().kind(),
        kind => kind,
    };
    matches!(kind, Kind::String | Kind::Bytes)
}

/// Formats the message `name`, given encoded, with its secret values redacted. A message
/// that does not decode (it always does: it was just encoded) prints no field at all.
fn fmt_redacted(name: &str, encoded: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let decoded = descriptor_pool()
        .get_message_by_name(name)
        .and_then(|desc| DynamicMessage::decode(desc, encoded).ok());
    match decoded {
        Some(message) => write_message(f, &message),
        None => write!(f, "{name} {{ {REDACTED_TEXT} }}"),
    }
}

fn write_message(f: &mut fmt::Formatter<'_>, message: &DynamicMessage) -> fmt::Result {
    let desc = message.descriptor();
    write!(f, "{} {{", desc.name())?;
    if desc.full_name() == SECRET_VALUE {
        return write!(f, " data: {REDACTED_TEXT} }}");
    }
    let mut any = false;
    for (field, value) in message.fields() {
        f.write_str(if any { ", " } else { " " })?;
        any = true;
        write!(f, "{}: ", field.name())?;
        if is_secret_field(&field) {
            write_redacted(f, value)?;
        } else {
            write_value(f, value)?;
        }
    }
    f.write_str(if any { " }" } else { "}" })
}

/// Map keys in a stable order (the map is a `HashMap`).
fn sorted_entries(map: &std::collections::HashMap<MapKey, Value>) -> Vec<(String, &Value)> {
    let mut entries: Vec<_> = map.iter().map(|(k, v)| (key_text(k), v)).collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

fn key_text(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => format!("{s:?}"),
    }
}

fn write_redacted(f: &mut fmt::Formatter<'_>, value: &Value) -> fmt::Result {
    match value {
        Value::Map(map) => {
            f.write_char('{')?;
            for (i, (key, _)) in sorted_entries(map).into_iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(f, "{sep}{key}: {REDACTED_TEXT}")?;
            }
            f.write_char('}')
        }
        _ => f.write_str(REDACTED_TEXT),
    }
}

fn write_value(f: &mut fmt::Formatter<'_>, value: &Value) -> fmt::Result {
    match value {
        Value::Bool(b) => write!(f, "{b}"),
        Value::I32(n) | Value::EnumNumber(n) => write!(f, "{n}"),
        Value::I64(n) => write!(f, "{n}"),
        Value::U32(n) => write!(f, "{n}"),
        Value::U64(n) => write!(f, "{n}"),
        Value::F32(x) => write!(f, "{x}"),
        Value::F64(x) => write!(f, "{x}"),
        Value::String(s) => write!(f, "{s:?}"),
        Value::Bytes(b) => write!(f, "{:?}", b.as_ref()),
        Value::Message(m) => write_message(f, m),
        Value::List(items) => {
            f.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write_value(f, item)?;
            }
            f.write_char(']')
        }
        Value::Map(map) => {
            f.write_char('{')?;
            for (i, (key, v)) in sorted_entries(map).into_iter().enumerate() {
                write!(f, "{}{key}: ", if i == 0 { "" } else { ", " })?;
                write_value(f, v)?;
            }
            f.write_char('}')
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const SECRET: &str = "s3cret-Value-4711";

    fn secrets() -> HashMap<String, String> {
        HashMap::from([("password".to_owned(), SECRET.to_owned())])
    }

    /// Every message of the pool that holds a secret value has a redacting `Debug`, so a
    /// new CSI or Mesos field cannot bring back the derived one unnoticed.
    #[test]
    fn every_message_with_a_secret_field_is_redacted() {
        let mut want: Vec<String> = descriptor_pool()
            .all_messages()
            .filter(|m| m.full_name() == SECRET_VALUE || m.fields().any(|f| is_secret_field(&f)))
            .map(|m| m.full_name().to_owned())
            .collect();
        want.sort();
        let mut have: Vec<String> = REDACTED.iter().map(|s| (*s).to_owned()).collect();
        have.sort();
        assert_eq!(have, want);
    }

    fn assert_redacted(text: &str, shown: &[&str]) {
        assert!(!text.contains(SECRET), "secret leaked: {text}");
        assert!(text.contains(REDACTED_TEXT), "{text}");
        for s in shown {
            assert!(text.contains(s), "{s:?} missing from {text}");
        }
    }

    #[test]
    fn csi_requests_show_everything_but_the_secret_values() {
        let create = v1::CreateVolumeRequest {
            name: "vol-1".into(),
            secrets: secrets(),
            parameters: HashMap::from([("pool".to_owned(), "fast".to_owned())]),
            ..Default::default()
        };
        assert_redacted(
            &format!("{create:?}"),
            &[
                "CreateVolumeRequest {",
                "name: \"vol-1\"",
                "\"password\": <redacted>",
                "\"pool\": \"fast\"",
            ],
        );
        let stage = v1::NodeStageVolumeRequest {
            volume_id: "v1".into(),
            staging_target_path: "/stage".into(),
            secrets: secrets(),
            ..Default::default()
        };
        assert_redacted(&format!("{stage:?}"), &["volume_id: \"v1\"", "/stage"]);
        let publish = v1::NodePublishVolumeRequest {
            volume_id: "v1".into(),
            secrets: secrets(),
            readonly: true,
            ..Default::default()
        };
        assert_redacted(&format!("{publish:?}"), &["readonly: true"]);
        let delete = v1::DeleteVolumeRequest {
            volume_id: "v1".into(),
            secrets: secrets(),
        };
        assert_redacted(&format!("{delete:#?}"), &["DeleteVolumeRequest"]);
        let v0_stage = v0::NodeStageVolumeRequest {
            volume_id: "v0".into(),
            node_stage_secrets: secrets(),
            ..Default::default()
        };
        assert_redacted(
            &format!("{v0_stage:?}"),
            &["node_stage_secrets: {\"password\""],
        );
    }

    #[test]
    fn mesos_secret_values_and_credentials_are_redacted_where_they_nest() {
        let var = mesos::environment::Variable {
            name: "TOKEN".into(),
            r#type: Some(mesos::environment::variable::Type::Secret as i32),
            secret: Some(mesos::Secret {
                r#type: Some(mesos::secret::Type::Value as i32),
                value: Some(mesos::secret::Value {
                    data: SECRET.as_bytes().to_vec(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // The derived `Debug` of the enclosing messages reaches the redacting one.
        assert_redacted(
            &format!("{var:?}"),
            &["TOKEN", "Value { data: <redacted> }"],
        );
        let credential = mesos::Credential {
            principal: "ops".into(),
            secret: Some(SECRET.into()),
        };
        assert_redacted(&format!("{credential:?}"), &["principal: \"ops\""]);
    }
}
