//! Mesos's checkpoint messages as slrp's records (the mapping table of
//! `docs/migrating-from-mesos.md`).

use std::collections::BTreeMap;

use slrp_core::provider::apply::{DiskRequest, plan_create_disk};
use slrp_core::provider::operations::{TrackedOperation, status_uuid};
use slrp_core::volume::{BootId, SecretRef, VolumeRecord, VolumeSpec, VolumeState};
use slrp_csi::{StringMap, VolumeCapability, VolumeId};
use slrp_proto::mesos::csi::state::volume_state::State as Mesos;
use slrp_proto::mesos::v1::secret::Type as SecretType;
use slrp_proto::mesos::v1::{Operation, OperationState, Resource, Secret};
use slrp_types::ProfileInfo;

use super::mesos::{StreamRead, VolumeRead};

/// What the volume mapping needs besides the volume itself.
#[derive(Debug)]
pub(super) struct VolumeCtx<'a> {
    pub(super) lenient: bool,
    /// `meta/boot_id`, if readable.
    pub(super) meta_boot: Option<&'a BootId>,
    /// The host's boot now.
    pub(super) current_boot: &'a BootId,
    /// The provider's total (upgraded).
    pub(super) total: &'a [Resource],
    /// PENDING CREATE_DISKs from a storage pool: (operation uuid, capability, parameters).
    pub(super) pending_creates: &'a [(uuid::Uuid, VolumeCapability, StringMap)],
}

/// A mapped volume and what the report should say about it.
#[derive(Debug)]
pub(super) struct MappedVolume {
    pub(super) record: VolumeRecord,
    pub(super) notes: Vec<String>,
}

/// The PENDING CREATE_DISKs of `operations` that create from a storage pool, with the
/// capability and parameters their profile gives the volume (what Mesos's CreateVolume,
/// named by the operation uuid, was sent).
pub(super) fn pending_creates(
    operations: &[Operation],
    profiles: &BTreeMap<String, ProfileInfo>,
) -> Vec<(uuid::Uuid, VolumeCapability, StringMap)> {
    operations
        .iter()
        .filter(|op| op.latest_status.state == OperationState::OperationPending as i32)
        .filter_map(|op| {
            let uuid = uuid::Uuid::from_slice(&op.uuid.value).ok()?;
            match plan_create_disk(&op.info, &uuid, profiles).ok()?.request {
                DiskRequest::Create(req) => Some((uuid, req.capability, req.parameters)),
                DiskRequest::Import(_) => None,
            }
        })
        .collect()
}

/// MB of a Mesos disk resource as bytes, rounded.
fn megabytes_to_bytes(megabytes: f64) -> i64 {
    let bytes = (megabytes * 1_048_576.0).round();
    if bytes.is_nan() || bytes <= 0.0 {
        0
    } else {
        // Saturates above i64::MAX, which no plugin can create anyway.
        bytes as i64
    }
}

/// The total's resource of volume `id`.
fn resource_of<'a>(total: &'a [Resource], id: &str) -> Option<&'a Resource> {
    total.iter().find(|r| {
        r.disk
            .as_ref()
            .and_then(|d| d.source.as_ref())
            .and_then(|s| s.id.as_deref())
            == Some(id)
    })
}

fn secrets(
    kind: &str,
    secrets: &std::collections::HashMap<String, Secret>,
    id: &str,
    reasons: &mut Vec<String>,
) -> BTreeMap<String, SecretRef> {
    let mut out = BTreeMap::new();
    let mut keys: Vec<&String> = secrets.keys().collect();
    keys.sort();
    for key in keys {
        let secret = &secrets[key];
        match (secret.r#type.map(SecretType::try_from), &secret.reference) {
            (Some(Ok(SecretType::Reference)), Some(reference)) => {
                out.insert(
                    key.clone(),
                    SecretRef {
                        name: reference.name.clone(),
                        key: reference.key.clone().unwrap_or_default(),
                    },
                );
            }
            (Some(Ok(SecretType::Value)), _) => reasons.push(format!(
                "volume '{id}' has a secret value for {kind} secret '{key}': slrp keeps secret \
                 references only; a secret value would be written to its store"
            )),
            _ => reasons.push(format!(
                "volume '{id}' has {kind} secret '{key}' that is neither a reference nor a value"
            )),
        }
    }
    out
}

/// `volume.state` as a [`VolumeRecord`]; `Err` holds every reason to refuse it.
pub(super) fn volume(v: &VolumeRead, ctx: &VolumeCtx<'_>) -> Result<MappedVolume, Vec<String>> {
    let id = v.id.as_str();
    let s = &v.state;
    let mut reasons = Vec::new();
    let mut notes = Vec::new();
    let capability = match s.volume_capability.as_ref() {
        None => {
            reasons.push(format!("volume '{id}' has no volume capability"));
            None
        }
        Some(c) => match VolumeCapability::from_mesos(c) {
            Ok(c) => Some(c),
            Err(e) => {
                reasons.push(format!("volume '{id}' has an unusable capability: {e}"));
                None
            }
        },
    };
    let node_stage_secrets = secrets("node stage", &s.node_stage_secrets, id, &mut reasons);
    let node_publish_secrets = secrets("node publish", &s.node_publish_secrets, id, &mut reasons);
    let pc: StringMap = s
        .publish_context
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mesos_boot = || -> Option<BootId> {
        if !s.boot_id.is_empty() {
            return Some(BootId::new(s.boot_id.clone()));
        }
        None
    };
    let staged_boot = |reasons: &mut Vec<String>, notes: &mut Vec<String>, name: &str| {
        mesos_boot().or_else(|| {
            if ctx.lenient {
                notes.push(format!(
                    "{name} without a boot id: taken as staged in the current boot"
                ));
                Some(ctx.current_boot.clone())
            } else {
                reasons.push(format!(
                    "volume '{id}' is {name} without a boot id, which Mesos never writes; \
                     re-run with --lenient to take it as staged in the current boot"
                ));
                None
            }
        })
    };
    let state = match Mesos::try_from(s.state) {
        Err(_) => {
            reasons.push(format!("Volume '{id}' is in INVALID state"));
            None
        }
        Ok(Mesos::Unknown) => {
            reasons.push(format!("Volume '{id}' is in UNKNOWN state"));
            None
        }
        Ok(Mesos::Created) => Some(VolumeState::Created),
        Ok(Mesos::ControllerPublish) => Some(VolumeState::ControllerPublishing),
        Ok(Mesos::NodeReady) => Some(VolumeState::NodeReady {
            publish_context: pc.clone(),
        }),
        Ok(Mesos::ControllerUnpublish) => Some(VolumeState::ControllerUnpublishing),
        Ok(Mesos::NodeStage) => {
            // Mesos writes NODE_STAGE with no boot id (it is set on reaching VOL_READY):
            // the boot the agent last started in is when the provider sent NodeStage.
            let (boot_id, from) = match ctx.meta_boot {
                Some(b) => (b.clone(), "meta/boot_id"),
                None => (ctx.current_boot.clone(), "the current boot"),
            };
            notes.push(format!("NODE_STAGE: boot id {} ({from})", boot_id.as_str()));
            Some(VolumeState::NodeStaging {
                boot_id,
                publish_context: pc.clone(),
            })
        }
        Ok(
            m @ (Mesos::VolReady
            | Mesos::NodePublish
            | Mesos::Published
            | Mesos::NodeUnpublish
            | Mesos::NodeUnstage),
        ) => staged_boot(&mut reasons, &mut notes, m.as_str_name()).map(|boot_id| {
            let publish_context = pc.clone();
            match m {
                Mesos::VolReady => VolumeState::VolReady {
                    boot_id,
                    publish_context,
                },
                Mesos::NodePublish => VolumeState::NodePublishing {
                    boot_id,
                    publish_context,
                },
                Mesos::Published => VolumeState::Published {
                    boot_id,
                    publish_context,
                },
                Mesos::NodeUnpublish => VolumeState::NodeUnpublishing {
                    boot_id,
                    publish_context,
                },
                _ => VolumeState::NodeUnstaging {
                    boot_id,
                    publish_context,
                },
            }
        }),
    };
    let (Some(capability), Some(state), true) = (capability, state, reasons.is_empty()) else {
        return Err(reasons);
    };
    let parameters: StringMap = s
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let resource = resource_of(ctx.total, id);
    let capacity_bytes = resource
        .and_then(|r| r.scalar.as_ref())
        .map_or(0, |s| megabytes_to_bytes(s.value));
    if resource.is_none() {
        notes.push("in no resource of the provider's total: capacity unknown (0)".into());
    }
    // Mesos records no name. A volume it tracks but has not reported yet is the result
    // of a PENDING CREATE_DISK (named by its uuid) if exactly one such create asked for
    // this capability and these parameters: the name lets slrp's replay of that create
    // recognise the volume instead of failing on it (spec §12.1 item 7).
    let name = if resource.is_some() {
        None
    } else {
        let matching: Vec<&uuid::Uuid> = ctx
            .pending_creates
            .iter()
            .filter(|(_, c, p)| *c == capability && *p == parameters)
            .map(|(u, _, _)| u)
            .collect();
        match matching.as_slice() {
            [one] => {
                notes.push(format!(
                    "named {one}: the PENDING CREATE_DISK that created it"
                ));
                Some(one.to_string())
            }
            [] => None,
            many => {
                notes.push(format!(
                    "{} PENDING CREATE_DISKs could have created it; left unnamed",
                    many.len()
                ));
                None
            }
        }
    };
    if s.pre_provisioned {
        notes.push("CSI-server (task) volume: untracked once unstaged, as Mesos does".to_owned());
    }
    let spec = VolumeSpec {
        capability,
        parameters,
        volume_context: s
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        readonly: s.readonly,
        pre_provisioned: s.pre_provisioned,
        node_stage_secrets,
        node_publish_secrets,
        untrack_on_unstage: s.pre_provisioned,
    };
    let mut record = VolumeRecord::created(VolumeId::new(id), name, spec);
    record.state = state;
    record.node_publish_required = s.node_publish_required;
    // Mesos cleans a volume before DeleteVolume exactly when it must be republished.
    record.needs_cleanup = s.node_publish_required;
    record.capacity_bytes = capacity_bytes;
    Ok(MappedVolume { record, notes })
}

/// One `Operation` of `resource_provider.state` and its stream as a [`TrackedOperation`]
/// (B.5 items 3 and 4: statuses beyond the stream are queued again).
pub(super) fn operation(op: &Operation, stream: &StreamRead) -> Result<TrackedOperation, String> {
    let uuid = uuid::Uuid::from_slice(&op.uuid.value)
        .map_err(|_| "an operation's uuid is not 16 bytes".to_owned())?;
    let mut queued = stream.updates.clone();
    if op.latest_status.state != OperationState::OperationPending as i32 {
        for (i, status) in op.statuses.iter().enumerate().skip(stream.updates.len()) {
            if status_uuid(status).is_none() {
                return Err(format!(
                    "status {i} of operation {uuid} has no 16-byte status uuid (Mesos aborts \
                     re-sending it)"
                ));
            }
            queued.push(status.clone());
        }
    }
    Ok(TrackedOperation {
        uuid,
        framework_id: op.framework_id.clone(),
        info: op.info.clone(),
        latest_status: op.latest_status.clone(),
        statuses: op.statuses.clone(),
        stream: queued,
        acked: stream.acked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_rounded_megabytes() {
        assert_eq!(megabytes_to_bytes(1.0), 1 << 20);
        assert_eq!(megabytes_to_bytes(0.5), 1 << 19);
        assert_eq!(megabytes_to_bytes(-1.0), 0);
        assert_eq!(megabytes_to_bytes(f64::NAN), 0);
    }
}
