//! Applying operations (spec §5): the acceptance pipeline, the conversions of the
//! speculative operations, CREATE_DISK / DESTROY_DISK planning and the terminal statuses.
//!
//! Pure: no I/O, no clock. The provider worker asks [`admit`] what to do with an
//! APPLY_OPERATION, runs the plan through the volume manager and turns the result into a
//! status with the builders here. See `docs/operations-apply.md`.

use std::collections::BTreeMap;

use slrp_csi::{StringMap, VolumeCapability, VolumeId};
use slrp_proto::mesos::v1::offer;
use slrp_proto::mesos::v1::offer::operation::Type as OperationType;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_proto::mesos::v1::volume::source::csi_volume::volume_capability::AccessType as MesosAccessType;
use slrp_proto::mesos::v1::{
    AgentId, Labels, OperationState, OperationStatus, Resource, ResourceProviderId,
};
use slrp_types::ProfileInfo;

use super::operations::{TrackedOperation, proto_uuid};
use super::resources::{
    Conversion, CreatedKind, CreatedVolume, DisplayResource, ProviderResources, ResourceError,
    Resources,
};
use crate::volume::{CreateVolume, ValidateVolume, VolumeError, VolumeInfo};

mod error;
pub use error::OperationError;

/// The operation types the provider tells apart, for metrics and for how it applies them.
///
/// GROW_VOLUME, SHRINK_VOLUME, LAUNCH, LAUNCH_GROUP and UNKNOWN (or an absent or
/// unrecognised type) are [`OperationKind::Unsupported`]: the master never forwards them
/// to a provider (spec §5.1), so Mesos keeps no metrics for them either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationKind {
    /// RESERVE (speculative).
    Reserve,
    /// UNRESERVE (speculative).
    Unreserve,
    /// CREATE: a persistent volume (speculative).
    Create,
    /// DESTROY: a persistent volume (speculative; removes the volume's data).
    Destroy,
    /// CREATE_DISK (through the volume manager).
    CreateDisk,
    /// DESTROY_DISK (through the volume manager).
    DestroyDisk,
    /// Anything else.
    Unsupported,
}

impl OperationKind {
    /// The kinds Mesos keeps `operations/<type>/…` metrics for, in Mesos's order.
    pub const COUNTED: [OperationKind; 6] = [
        OperationKind::Reserve,
        OperationKind::Unreserve,
        OperationKind::Create,
        OperationKind::Destroy,
        OperationKind::CreateDisk,
        OperationKind::DestroyDisk,
    ];

    /// The kind of an operation, from its `type` field.
    pub fn of(info: &offer::Operation) -> Self {
        match info.r#type.and_then(|t| OperationType::try_from(t).ok()) {
            Some(OperationType::Reserve) => OperationKind::Reserve,
            Some(OperationType::Unreserve) => OperationKind::Unreserve,
            Some(OperationType::Create) => OperationKind::Create,
            Some(OperationType::Destroy) => OperationKind::Destroy,
            Some(OperationType::CreateDisk) => OperationKind::CreateDisk,
            Some(OperationType::DestroyDisk) => OperationKind::DestroyDisk,
            _ => OperationKind::Unsupported,
        }
    }

    /// The lower-case Mesos name used in metric keys (`operations/<name>/…`); `None` for
    /// [`OperationKind::Unsupported`], which is never counted under a type.
    pub fn metric_name(self) -> Option<&'static str> {
        match self {
            OperationKind::Reserve => Some("reserve"),
            OperationKind::Unreserve => Some("unreserve"),
            OperationKind::Create => Some("create"),
            OperationKind::Destroy => Some("destroy"),
            OperationKind::CreateDisk => Some("create_disk"),
            OperationKind::DestroyDisk => Some("destroy_disk"),
            OperationKind::Unsupported => None,
        }
    }

    /// Whether the agent applies the operation's conversion itself at once (spec §2.9
    /// step 2) and the provider completes it before handling the next event.
    pub fn is_speculative(self) -> bool {
        matches!(
            self,
            OperationKind::Reserve
                | OperationKind::Unreserve
                | OperationKind::Create
                | OperationKind::Destroy
        )
    }
}

/// The drop message for an APPLY_OPERATION that arrives before the provider is READY
/// (spec §5.2 step 1; the worker checks the state itself, [`admit`] is for READY).
pub const NOT_READY_MESSAGE: &str = "Cannot apply operation in SUBSCRIBED state";

/// Mesos's DROPPED message for a disk operation that cannot be applied because of a
/// storage reconciliation (Mesos drops every such operation while one runs; slrp defers
/// those it can still apply, see [`admit`]).
pub const RECONCILING_MESSAGE: &str = "Cannot apply operation when reconciling storage pools";

/// The message of the unreliable DROPPED answer to RECONCILE_OPERATIONS (§5.8(2)).
pub const UNKNOWN_OPERATION_MESSAGE: &str = "Unknown operation";

/// Mesos `isSpeculativeOperation` as the *agent* applies it (spec §2.9 step 2): besides the
/// four speculative kinds, GROW_VOLUME and SHRINK_VOLUME, which the agent applies to its
/// view at once although no provider supports them. When such an operation is dropped or
/// fails, the agent's view holds a conversion the provider's total does not: the worker
/// sends a new resource version with UPDATE_STATE (§5.3 last paragraph).
pub fn agent_applies_speculatively(info: &offer::Operation) -> bool {
    OperationKind::of(info).is_speculative()
        || matches!(
            operation_type(info),
            Some(OperationType::GrowVolume | OperationType::ShrinkVolume)
        )
}

fn operation_type(info: &offer::Operation) -> Option<OperationType> {
    info.r#type.and_then(|t| OperationType::try_from(t).ok())
}

/// Spec §5.2's table: whether `info` may run while storage pools are being reconciled.
///
/// RESERVE and UNRESERVE may, unless they consume a RAW disk with a profile (part of a
/// storage pool); CREATE and DESTROY may; CREATE_DISK and DESTROY_DISK may not (they
/// change what the plugin reports). Unsupported kinds are never applied: `false`.
pub fn allows_reconciliation(info: &offer::Operation) -> bool {
    match OperationKind::of(info) {
        OperationKind::Reserve | OperationKind::Unreserve => {
            !reservation_consumed(info).iter().any(is_profiled_raw)
        }
        OperationKind::Create | OperationKind::Destroy => true,
        OperationKind::CreateDisk | OperationKind::DestroyDisk | OperationKind::Unsupported => {
            false
        }
    }
}

/// Mesos `getConsumedResources` for RESERVE / UNRESERVE, as far as the disk sources go
/// (popping a reservation does not change them).
fn reservation_consumed(info: &offer::Operation) -> &[Resource] {
    match (&info.reserve, &info.unreserve, OperationKind::of(info)) {
        (Some(reserve), _, OperationKind::Reserve) if !reserve.source.is_empty() => &reserve.source,
        (Some(reserve), _, OperationKind::Reserve) => &reserve.resources,
        (_, Some(unreserve), OperationKind::Unreserve) => &unreserve.resources,
        _ => &[],
    }
}

fn disk_source(resource: &Resource) -> Option<&slrp_proto::mesos::v1::resource::disk_info::Source> {
    resource.disk.as_ref()?.source.as_ref()
}

fn is_profiled_raw(resource: &Resource) -> bool {
    disk_source(resource).is_some_and(|s| s.profile.is_some() && s.r#type == SourceType::Raw as i32)
}

/// The source type's Mesos name (`stringify(Resource::DiskInfo::Source::Type)`); a disk
/// without a source is `UNKNOWN`, as the protobuf default makes it in Mesos.
fn source_type_name(resource: &Resource) -> String {
    let number = disk_source(resource).map_or(SourceType::Unknown as i32, |s| s.r#type);
    SourceType::try_from(number).map_or_else(|_| number.to_string(), |t| t.as_str_name().to_owned())
}

/// What the acceptance pipeline decides for an APPLY_OPERATION in READY (§5.2, with the
/// issue's changes: a disk operation during a reconciliation is deferred, not dropped; a
/// duplicate uuid is answered with its latest status, not an abort).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Track it (PENDING, durable) and apply it now.
    Accept,
    /// Track it (PENDING, durable) now and apply it when the running reconciliation ends.
    Defer,
    /// Drop it with this message (e.g. `Mismatched resource version <received>
    /// (expected: <current>)`).
    Drop(String),
    /// Already tracked: resend its latest status, change nothing.
    Duplicate,
}

/// What [`admit`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionInput<'a> {
    /// The operation.
    pub info: &'a offer::Operation,
    /// Whether a storage reconciliation is running or waiting to run (Mesos's pending
    /// `reconciled` future, §5.9).
    pub reconciling: bool,
    /// The provider's current resource version.
    pub current_version: &'a uuid::Uuid,
    /// The event's `resource_version_uuid` (`None`: absent or not 16 bytes).
    pub received_version: Option<uuid::Uuid>,
    /// Whether the operation uuid is already tracked.
    pub tracked: bool,
}

/// The acceptance pipeline of spec §5.2 for a provider in READY, in Mesos's order (the
/// state was checked before: [`super::lifecycle::disposition`]):
///
/// 1. an operation already tracked is a [`Admission::Duplicate`] (Mesos aborts). It comes
///    first: a re-delivered APPLY_OPERATION must not start a second status stream for the
///    same uuid, whatever the version is now;
/// 2. a kind no provider applies (GROW_VOLUME, SHRINK_VOLUME, LAUNCH, …) is dropped with
///    the master's text (Mesos aborts; spec §5.1 "should drop/fail them");
/// 3. during a storage reconciliation, CREATE_DISK and DESTROY_DISK are
///    [`Admission::Defer`]red instead of Mesos's drop (§12.6) when their resource version
///    is the current one; one built on another version is dropped with Mesos's
///    reconciliation text ([`RECONCILING_MESSAGE`]), as Mesos would drop it, before its
///    version is looked at. A deferred operation is judged again against the reconciled
///    total when it resumes (the worker drops it with the same text if its source is
///    gone or changed), so no CSI call is made for resources the reconciliation took;
/// 4. a resource version other than the current one is dropped: `Mismatched resource
///    version <received> (expected: <current>)`, both in canonical text.
///
/// RESERVE and UNRESERVE of a storage pool, which Mesos also drops while reconciling,
/// are accepted at once: their conversion changes no capacity the plugin reports, and the
/// worker computes a reconciliation's conversion against the total when its answers are
/// in, so nothing races. Deferring them would break the rule that a speculative
/// operation is complete before the next event (the agent has applied it already).
pub fn admit(input: &AdmissionInput<'_>) -> Admission {
    if input.tracked {
        return Admission::Duplicate;
    }
    let kind = OperationKind::of(input.info);
    if kind == OperationKind::Unsupported {
        return Admission::Drop(unsupported(input.info).to_string());
    }
    let current = input.current_version;
    let matches = input.received_version == Some(*current);
    if input.reconciling && !kind.is_speculative() {
        return if matches {
            Admission::Defer
        } else {
            Admission::Drop(RECONCILING_MESSAGE.to_owned())
        };
    }
    match input.received_version {
        _ if matches => Admission::Accept,
        Some(received) => Admission::Drop(format!(
            "Mismatched resource version {received} (expected: {current})"
        )),
        None => Admission::Drop(format!(
            "Missing or malformed resource version (expected: {current})"
        )),
    }
}

/// Why an operation of an unsupported kind is refused. GROW_VOLUME and SHRINK_VOLUME get
/// the master's texts (`src/master/validation.cpp`).
fn unsupported(info: &offer::Operation) -> OperationError {
    match (info.r#type, operation_type(info)) {
        (_, Some(OperationType::GrowVolume)) => OperationError::GrowVolume,
        (_, Some(OperationType::ShrinkVolume)) => OperationError::ShrinkVolume,
        (_, Some(t @ (OperationType::Launch | OperationType::LaunchGroup))) => {
            OperationError::NotForProviders {
                name: t.as_str_name(),
            }
        }
        (None, _) => OperationError::NoType,
        (Some(number), _) => OperationError::UnknownType { number },
    }
}

fn missing_field(kind: &'static str, field: &'static str) -> OperationError {
    OperationError::MissingField { kind, field }
}

/// Mesos `popReservation` on one resource.
fn pop_reservation(resource: &Resource) -> Result<Resource, OperationError> {
    let mut popped = resource.clone();
    if popped.reservations.pop().is_none() {
        return Err(OperationError::Unreserved {
            resource: DisplayResource(resource).to_string(),
        });
    }
    Ok(popped)
}

/// A persistent volume without its persistence (Mesos strips `persistence`, `volume`
/// and `shared`; a resource without a disk source loses its whole `disk`).
fn without_persistence(volume: &Resource) -> Resource {
    let mut stripped = volume.clone();
    match stripped.disk.as_mut() {
        Some(disk) if disk.source.is_some() => {
            disk.persistence = None;
            disk.volume = None;
        }
        _ => stripped.disk = None,
    }
    stripped.shared = None;
    stripped
}

/// A persistent volume as the provider can create or destroy it: on a MOUNT disk backed
/// by a CSI volume (Mesos asserts all but the type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentVolume {
    /// The CSI volume the persistent volume lives on.
    pub volume_id: VolumeId,
    /// `disk.persistence.id`.
    pub persistence_id: String,
}

fn persistent_volume(
    volume: &Resource,
    verb: &'static str,
) -> Result<PersistentVolume, OperationError> {
    let Some(persistence) = volume.disk.as_ref().and_then(|d| d.persistence.as_ref()) else {
        return Err(OperationError::NotPersistent {
            verb,
            resource: DisplayResource(volume).to_string(),
        });
    };
    let pid = &persistence.id;
    if disk_source(volume).map(|s| s.r#type) != Some(SourceType::Mount as i32) {
        return Err(OperationError::NotOnMountDisk {
            verb,
            id: pid.clone(),
            disk: source_type_name(volume),
        });
    }
    let Some(id) = disk_source(volume).and_then(|s| s.id.as_deref()) else {
        return Err(OperationError::PersistentNotBacked {
            verb,
            id: pid.clone(),
        });
    };
    Ok(PersistentVolume {
        volume_id: VolumeId::new(id),
        persistence_id: pid.clone(),
    })
}

fn volumes_of(info: &offer::Operation, create: bool) -> Result<&[Resource], OperationError> {
    if create {
        info.create
            .as_ref()
            .map(|c| c.volumes.as_slice())
            .ok_or_else(|| missing_field("CREATE", "create"))
    } else {
        info.destroy
            .as_ref()
            .map(|d| d.volumes.as_slice())
            .ok_or_else(|| missing_field("DESTROY", "destroy"))
    }
}

/// DESTROY: the persistent volumes whose data must be removed before the conversion is
/// applied (§5.3; see `slrp_provider::persistent::remove_persistent_data`).
///
/// # Errors
/// The FAILED message for a volume that is not a persistent MOUNT volume backed by a CSI
/// volume, or an operation that is not a DESTROY.
pub fn destroy_targets(info: &offer::Operation) -> Result<Vec<PersistentVolume>, OperationError> {
    if OperationKind::of(info) != OperationKind::Destroy {
        return Err(OperationError::NotDestroy);
    }
    volumes_of(info, false)?
        .iter()
        .map(|v| persistent_volume(v, "destroy"))
        .collect()
}

/// §5.3: the conversions of a speculative operation (Mesos `getResourceConversions` plus
/// the provider's prechecks), as the operation gives them (allocation info kept; see
/// [`apply_conversions`]).
///
/// - RESERVE: `source` (or `resources` with the last reservation popped) → `resources`;
/// - UNRESERVE: each resource → itself with the last reservation popped;
/// - CREATE: each volume without persistence → the volume; every volume must be a
///   persistent MOUNT disk: `Cannot create persistent volume '<id>' on a BLOCK disk`;
/// - DESTROY: each volume → itself without persistence (same checks). The data removal
///   is separate ([`destroy_targets`]).
///
/// # Errors
/// The FAILED message. Where Mesos asserts (no persistence, no volume id, nothing to pop)
/// this is a message too; CREATE_DISK, DESTROY_DISK and unsupported kinds are refused.
pub fn speculative_conversions(info: &offer::Operation) -> Result<Vec<Conversion>, OperationError> {
    let kind = OperationKind::of(info);
    match kind {
        OperationKind::Reserve => {
            let reserve = info
                .reserve
                .as_ref()
                .ok_or_else(|| missing_field("RESERVE", "reserve"))?;
            let reserved: Resources = reserve.resources.iter().collect();
            let consumed = if reserve.source.is_empty() {
                reserved
                    .iter()
                    .map(pop_reservation)
                    .collect::<Result<Resources, OperationError>>()?
            } else {
                reserve.source.iter().collect()
            };
            Ok(vec![Conversion {
                consumed,
                converted: reserved,
            }])
        }
        OperationKind::Unreserve => info
            .unreserve
            .as_ref()
            .ok_or_else(|| missing_field("UNRESERVE", "unreserve"))?
            .resources
            .iter()
            .map(|reserved| {
                Ok(Conversion {
                    consumed: Resources::from(reserved.clone()),
                    converted: Resources::from(pop_reservation(reserved)?),
                })
            })
            .collect(),
        OperationKind::Create | OperationKind::Destroy => {
            let verb = if kind == OperationKind::Create {
                "create"
            } else {
                "destroy"
            };
            volumes_of(info, kind == OperationKind::Create)?
                .iter()
                .map(|volume| {
                    persistent_volume(volume, verb)?;
                    let (whole, stripped) = (
                        Resources::from(volume.clone()),
                        Resources::from(without_persistence(volume)),
                    );
                    Ok(if kind == OperationKind::Create {
                        Conversion {
                            consumed: stripped,
                            converted: whole,
                        }
                    } else {
                        Conversion {
                            consumed: whole,
                            converted: stripped,
                        }
                    })
                })
                .collect()
        }
        OperationKind::CreateDisk | OperationKind::DestroyDisk => {
            Err(OperationError::NotSpeculative {
                kind: operation_type(info).map_or("?", |t| t.as_str_name()),
            })
        }
        OperationKind::Unsupported => Err(unsupported(info)),
    }
}

/// A copy without `allocation_info`, which the provider's total never carries.
fn unallocated(resources: &Resources) -> Resources {
    resources
        .iter()
        .map(|r| Resource {
            allocation_info: None,
            ..r.clone()
        })
        .collect()
}

/// §5.6 step 1: `total` with `conversions` applied in order, allocation info stripped
/// from both sides. For DESTROY, Mesos's check that no other shared copy of a destroyed
/// volume remains. A copy of `total`: the provider applies
/// [`apply_conversions_in_place`].
///
/// # Errors
/// The FAILED message: `<total> does not contain <consumed>`, or `Persistent volume
/// '<r>' cannot be removed due to additional shared copies`.
pub fn apply_conversions(
    total: &Resources,
    info: &offer::Operation,
    conversions: &[Conversion],
) -> Result<Resources, OperationError> {
    let mut result = total.clone();
    apply_conversions_in_place(&mut result, info, conversions)?;
    Ok(result)
}

/// [`apply_conversions`] on `total` itself, at the cost of what the conversions touch;
/// on error `total` is unchanged.
///
/// # Errors
/// As [`apply_conversions`].
pub fn apply_conversions_in_place(
    total: &mut Resources,
    info: &offer::Operation,
    conversions: &[Conversion],
) -> Result<(), OperationError> {
    let stripped: Vec<Conversion> = conversions
        .iter()
        .map(|c| Conversion {
            consumed: unallocated(&c.consumed),
            converted: unallocated(&c.converted),
        })
        .collect();
    if OperationKind::of(info) == OperationKind::Destroy
        && let Some(destroy) = &info.destroy
    {
        // Checked before anything changes: the converted sides hold no persistent volume,
        // so the result would still hold a destroyed volume exactly if `total` holds it
        // beside everything consumed (and then the conversions apply).
        let consumed = stripped
            .iter()
            .fold(Resources::new(), |sum, c| sum + &c.consumed);
        for volume in &destroy.volumes {
            let volume = unallocated(&Resources::from(volume.clone()));
            if total.contains(&(consumed.clone() + &volume)) {
                return Err(OperationError::SharedCopies {
                    volume: volume.to_string(),
                });
            }
        }
    }
    total
        .apply_all_in_place(&stripped)
        .map_err(|error| match error {
            ResourceError::NotContained { total, consumed } => OperationError::NotContained {
                available: total,
                consumed,
            },
            other
            @ (ResourceError::BadPluginName { .. } | ResourceError::BadReservation { .. }) => {
                OperationError::Resources {
                    reason: other.to_string(),
                }
            }
        })
}

/// The FINISHED status's `converted_resources`: every conversion's converted side as the
/// operation gave it (allocation info kept, §5.4 last line).
pub fn converted_resources(conversions: &[Conversion]) -> Resources {
    conversions
        .iter()
        .fold(Resources::new(), |sum, c| sum + &c.converted)
}

/// §5.4 steps 1–3: what CREATE_DISK asks of the volume manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskRequest {
    /// (A) from a storage pool: CreateVolume named by the operation uuid text.
    Create(CreateVolume),
    /// (B) a pre-existing volume: ValidateVolume with the profile's capability/parameters.
    Import(ValidateVolume),
}

/// A CREATE_DISK ready to run: the request and what the result becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateDiskPlan {
    /// What to ask the volume manager.
    pub request: DiskRequest,
    /// The profile the disk gets (the source's, or `target_profile` for an import).
    pub profile: String,
    /// MOUNT or BLOCK.
    pub kind: CreatedKind,
    /// `create_disk.source` as the operation carried it (allocation info kept).
    pub source: Resource,
}

impl CreateDiskPlan {
    /// The FAILED message for a volume manager error: for an import, a failed validation
    /// becomes `Cannot apply profile '<p>' to resource '<r>': <error>` (Mesos); anything
    /// else is the error with its causes.
    pub fn failure(&self, error: &VolumeError) -> OperationError {
        let chain = slrp_types::DisplayChain(error).to_string();
        match (&self.request, error) {
            (
                DiskRequest::Import(_),
                VolumeError::Mismatch { .. } | VolumeError::ValidationFailed { .. },
            ) => import_failure(&self.profile, &self.source, chain),
            _ => OperationError::Volume { chain },
        }
    }
}

fn import_failure(profile: &str, source: &Resource, reason: String) -> OperationError {
    OperationError::CannotApplyProfile {
        profile: profile.to_owned(),
        resource: DisplayResource(source).to_string(),
        reason,
    }
}

/// Mesos `convertLabelsToStringMap`, with its texts; Mesos aborts on these errors when
/// importing a volume, here they fail the operation.
fn labels_to_map(labels: Option<&Labels>) -> Result<StringMap, OperationError> {
    let mut map = StringMap::new();
    for label in labels.map(|l| l.labels.as_slice()).unwrap_or_default() {
        if map.contains_key(&label.key) {
            return Err(OperationError::RepeatedLabel {
                key: label.key.clone(),
            });
        }
        let Some(value) = &label.value else {
            return Err(OperationError::LabelWithoutValue {
                key: label.key.clone(),
            });
        };
        map.insert(label.key.clone(), value.clone());
    }
    Ok(map)
}

/// Mesos `scalar × Bytes::MEGABYTES`: the product truncated to whole bytes (a negative
/// or NaN size is 0, where Mesos's conversion to `uint64_t` is undefined).
fn megabytes_to_bytes(megabytes: f64) -> i64 {
    let bytes = (megabytes * 1_048_576.0).trunc();
    if bytes.is_nan() || bytes <= 0.0 {
        0
    } else {
        // Saturates above i64::MAX, which no plugin can create anyway.
        bytes as i64
    }
}

/// §5.4 steps 1–3 for CREATE_DISK `info` with uuid `operation` and the provider's
/// current profile map.
///
/// # Errors
/// The FAILED message: `Profile '<p>' not found`, `Profile '<p>' cannot be used to create
/// a MOUNT disk` (or BLOCK), the master's texts for a malformed operation (`'source' is
/// not a RAW disk resource`, `'target_type' is neither MOUNT or BLOCK`, `'target_profile'
/// must (not) be set …`), `Cannot apply profile '<p>' to resource '<r>': Repeated key
/// '<k>' in labels` (or "Missing value for key …") for an import whose metadata is not a
/// map (Mesos aborts).
pub fn plan_create_disk(
    info: &offer::Operation,
    operation: &uuid::Uuid,
    profiles: &BTreeMap<String, ProfileInfo>,
) -> Result<CreateDiskPlan, OperationError> {
    let create = info
        .create_disk
        .as_ref()
        .ok_or_else(|| missing_field("CREATE_DISK", "create_disk"))?;
    let source = &create.source;
    let Some(disk) = disk_source(source).filter(|s| s.r#type == SourceType::Raw as i32) else {
        return Err(OperationError::SourceNotRaw);
    };
    let kind = match SourceType::try_from(create.target_type) {
        Ok(SourceType::Mount) => CreatedKind::Mount,
        Ok(SourceType::Block) => CreatedKind::Block,
        _ => return Err(OperationError::BadTargetType),
    };
    let profile = match (&disk.profile, &create.target_profile, &disk.id) {
        (Some(_), Some(_), _) => {
            return Err(OperationError::TwoProfiles);
        }
        (None, None, _) => {
            return Err(OperationError::NoProfile);
        }
        (Some(profile), None, None) | (None, Some(profile), Some(_)) => profile.clone(),
        (Some(_), None, Some(_)) | (None, Some(_), None) => {
            return Err(OperationError::NeitherPoolNorVolume {
                resource: DisplayResource(source).to_string(),
            });
        }
    };
    let Some(def) = profiles.get(&profile) else {
        return Err(OperationError::ProfileNotFound { profile });
    };
    let (fits, target) = match (kind, &def.capability.access_type) {
        (CreatedKind::Mount, access) => {
            (matches!(access, Some(MesosAccessType::Mount(_))), "MOUNT")
        }
        (CreatedKind::Block, access) => {
            (matches!(access, Some(MesosAccessType::Block(_))), "BLOCK")
        }
    };
    if !fits {
        return Err(OperationError::ProfileDoesNotFit { profile, target });
    }
    let capability = VolumeCapability::from_mesos(&def.capability).map_err(|error| {
        OperationError::ProfileCapability {
            profile: profile.clone(),
            reason: error.to_string(),
        }
    })?;
    let bytes = megabytes_to_bytes(source.scalar.map_or(0.0, |s| s.value));
    let request = match &disk.id {
        None => DiskRequest::Create(CreateVolume {
            name: operation.to_string(),
            required_bytes: bytes,
            limit_bytes: bytes,
            capability,
            parameters: def.parameters.clone(),
            content_source: None,
        }),
        Some(id) => DiskRequest::Import(ValidateVolume {
            id: VolumeId::new(id.as_str()),
            capability,
            parameters: def.parameters.clone(),
            volume_context: labels_to_map(disk.metadata.as_ref())
                .map_err(|why| import_failure(&profile, source, why.to_string()))?,
            capacity_bytes: bytes,
            node_stage_secrets: BTreeMap::new(),
            node_publish_secrets: BTreeMap::new(),
        }),
    };
    Ok(CreateDiskPlan {
        request,
        profile,
        kind,
        source: source.clone(),
    })
}

/// The conversion of a finished CREATE_DISK (Mesos `applyCreateDisk`, through
/// [`ProviderResources::created_disk`]): the source → a `plan.kind` disk with the volume
/// id, the profile, the volume context as metadata (the source's kept if empty) and, for
/// MOUNT, the MOUNT root. Both sides keep the operation's `allocation_info` (the FINISHED
/// status reports the converted side so, §5.4 last line; [`apply_conversions`] strips it
/// for the total).
///
/// The disk keeps the size the operation consumed, whatever the plugin created or the
/// listing said (a Mesos master aborts on a conversion that shrinks; the real size is in
/// the volume manager's record).
pub fn create_disk_conversion(
    ctx: &ProviderResources,
    plan: &CreateDiskPlan,
    volume: &VolumeInfo,
) -> Conversion {
    ctx.created_disk(
        &plan.source,
        &CreatedVolume {
            id: volume.id.as_str(),
            context: &volume.volume_context,
            profile: &plan.profile,
        },
        plan.kind,
    )
}

/// A finished CREATE_DISK's outcome as [`apply_conversions`] takes it: the conversion of
/// the volume the volume manager created or validated, or the FAILED message
/// ([`CreateDiskPlan::failure`]: Mesos's "Cannot apply profile …" for a failed
/// import).
///
/// # Errors
/// The FAILED message of a volume manager error.
pub fn create_disk_outcome(
    ctx: &ProviderResources,
    plan: &CreateDiskPlan,
    result: Result<VolumeInfo, VolumeError>,
) -> Result<Vec<Conversion>, OperationError> {
    match result {
        Ok(volume) => Ok(vec![create_disk_conversion(ctx, plan, &volume)]),
        Err(error) => Err(plan.failure(&error)),
    }
}

/// DESTROY_DISK: the volume id to delete and `destroy_disk.source` as the operation
/// carried it.
///
/// # Errors
/// The master's texts for what it should have refused: "'source' is neither a MOUNT, BLOCK
/// or RAW disk resource", "'source' is not backed by a CSI volume", `A disk resource
/// containing a persistent volume <r> cannot be destroyed directly. …`.
pub fn destroy_disk_target(
    info: &offer::Operation,
) -> Result<(VolumeId, Resource), OperationError> {
    let source = &info
        .destroy_disk
        .as_ref()
        .ok_or_else(|| missing_field("DESTROY_DISK", "destroy_disk"))?
        .source;
    let disk = disk_source(source).filter(|s| {
        [SourceType::Mount, SourceType::Block, SourceType::Raw]
            .iter()
            .any(|t| s.r#type == *t as i32)
    });
    let Some(disk) = disk else {
        return Err(OperationError::SourceNotDisk);
    };
    let Some(id) = &disk.id else {
        return Err(OperationError::SourceNotBacked);
    };
    if source
        .disk
        .as_ref()
        .is_some_and(|d| d.persistence.is_some())
    {
        return Err(OperationError::DiskHoldsPersistentVolume {
            resource: DisplayResource(source).to_string(),
        });
    }
    Ok((VolumeId::new(id.as_str()), source.clone()))
}

/// The conversion of a finished DESTROY_DISK (Mesos `applyDestroyDisk`, through
/// [`ProviderResources::destroyed_disk`]) with `profiles` as the live profile map: a
/// freed volume of an unknown or absent profile is converted to nothing and asks for a
/// pool reconciliation (spec §5.5).
pub fn destroy_disk_conversion(
    ctx: &ProviderResources,
    source: &Resource,
    deprovisioned: bool,
    profiles: &BTreeMap<String, ProfileInfo>,
) -> super::resources::DestroyedDisk {
    ctx.destroyed_disk(source, deprovisioned, |p| profiles.contains_key(p))
}

// ---------------------------------------------------------------------------------------
// Statuses (§5.6, §5.8).

/// A terminal status of `op` with a fresh status uuid, `operation_id` from `info.id`, the
/// agent id given and the provider id the operation was tracked with.
fn terminal_status(
    op: &TrackedOperation,
    state: OperationState,
    message: Option<&str>,
    converted: &Resources,
    agent_id: &AgentId,
) -> OperationStatus {
    OperationStatus {
        operation_id: op.info.id.clone(),
        state: state as i32,
        message: message.map(str::to_owned),
        converted_resources: converted.to_vec(),
        uuid: Some(proto_uuid(&uuid::Uuid::new_v4())),
        agent_id: Some(agent_id.clone()),
        resource_provider_id: op.latest_status.resource_provider_id.clone(),
    }
}

/// §5.6 step 2: FINISHED with `converted` (what [`converted_resources`] gives: allocation
/// info as the operation carried it; may be empty).
pub fn finished_status(
    op: &TrackedOperation,
    converted: &Resources,
    agent_id: &AgentId,
) -> OperationStatus {
    terminal_status(
        op,
        OperationState::OperationFinished,
        None,
        converted,
        agent_id,
    )
}

/// §5.6 step 2: FAILED with `message`, no converted resources.
pub fn failed_status(op: &TrackedOperation, message: &str, agent_id: &AgentId) -> OperationStatus {
    terminal_status(
        op,
        OperationState::OperationFailed,
        Some(message),
        &Resources::new(),
        agent_id,
    )
}

/// §5.8(1): DROPPED at acceptance with `message` (reliable: it has a status uuid).
pub fn dropped_status(op: &TrackedOperation, message: &str, agent_id: &AgentId) -> OperationStatus {
    terminal_status(
        op,
        OperationState::OperationDropped,
        Some(message),
        &Resources::new(),
        agent_id,
    )
}

/// §5.8(2): the unreliable "Unknown operation" DROPPED for RECONCILE_OPERATIONS: no
/// status uuid, no operation id.
pub fn unknown_operation_status(
    agent_id: &AgentId,
    provider_id: &ResourceProviderId,
) -> OperationStatus {
    OperationStatus {
        operation_id: None,
        state: OperationState::OperationDropped as i32,
        message: Some(UNKNOWN_OPERATION_MESSAGE.to_owned()),
        converted_resources: Vec::new(),
        uuid: None,
        agent_id: Some(agent_id.clone()),
        resource_provider_id: Some(provider_id.clone()),
    }
}

#[cfg(test)]
mod tests;
