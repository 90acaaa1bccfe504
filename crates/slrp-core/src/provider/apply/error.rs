//! Why an operation fails: [`OperationError`], whose `Display` is the FAILED status's
//! message (Mesos's texts kept where Mesos has one), so a caller can act on the kind and
//! the agent still reads what a Mesos provider would have said.

/// Why an operation ends FAILED. The text is the status `message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    /// The operation lacks the message of its own kind (the master validates this).
    #[error("{kind} operation without '{field}'")]
    MissingField {
        /// The operation type's name.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// GROW_VOLUME on provider resources (Mesos aborts).
    #[error("Growing a volume from a resource provider is not supported")]
    GrowVolume,
    /// SHRINK_VOLUME on provider resources (Mesos aborts).
    #[error("Shrinking a volume from a resource provider is not supported")]
    ShrinkVolume,
    /// LAUNCH / LAUNCH_GROUP sent to a provider.
    #[error("Operation {name} is not applied by a resource provider")]
    NotForProviders {
        /// The operation type's name.
        name: &'static str,
    },
    /// An operation without a type.
    #[error("Operation has no type")]
    NoType,
    /// A type this build does not know.
    #[error("Operation type {number} is not supported")]
    UnknownType {
        /// The type's number.
        number: i32,
    },
    /// A kind the provider does not apply, found when it is applied.
    #[error("Unsupported operation {name}")]
    Unsupported {
        /// The operation type's name.
        name: &'static str,
    },
    /// CREATE_DISK or DESTROY_DISK asked for conversions without I/O.
    #[error("{kind} is not a speculative operation")]
    NotSpeculative {
        /// The operation type's name.
        kind: &'static str,
    },
    /// DESTROY's data removal asked of another kind.
    #[error("Not a DESTROY operation")]
    NotDestroy,
    /// UNRESERVE (or RESERVE without `source`) of an unreserved resource.
    #[error("Cannot pop a reservation from unreserved resource '{resource}'")]
    Unreserved {
        /// The resource.
        resource: String,
    },
    /// CREATE or DESTROY of a resource that is not a persistent volume.
    #[error("Cannot {verb} resource '{resource}': it is not a persistent volume")]
    NotPersistent {
        /// `create` or `destroy`.
        verb: &'static str,
        /// The resource.
        resource: String,
    },
    /// A persistent volume on a disk other than MOUNT.
    #[error("Cannot {verb} persistent volume '{id}' on a {disk} disk")]
    NotOnMountDisk {
        /// `create` or `destroy`.
        verb: &'static str,
        /// `persistence.id`.
        id: String,
        /// The disk's source type.
        disk: String,
    },
    /// A persistent volume whose disk has no CSI volume id.
    #[error("Cannot {verb} persistent volume '{id}': its disk is not backed by a CSI volume")]
    PersistentNotBacked {
        /// `create` or `destroy`.
        verb: &'static str,
        /// `persistence.id`.
        id: String,
    },
    /// The resources are not (or no longer) available: Mesos's text.
    #[error("{available} does not contain {consumed}")]
    NotContained {
        /// What was available.
        available: String,
        /// What the operation consumes.
        consumed: String,
    },
    /// DESTROY of a shared persistent volume that has other copies.
    #[error("Persistent volume {volume} cannot be removed due to additional shared copies")]
    SharedCopies {
        /// The volume.
        volume: String,
    },
    /// The provider's resource context refuses the conversion.
    #[error("{reason}")]
    Resources {
        /// The resource arithmetic's error.
        reason: String,
    },
    /// CREATE_DISK whose source is not RAW.
    #[error("'source' is not a RAW disk resource")]
    SourceNotRaw,
    /// CREATE_DISK with a `target_type` other than MOUNT or BLOCK.
    #[error("'target_type' is neither MOUNT or BLOCK")]
    BadTargetType,
    /// CREATE_DISK with both a source profile and `target_profile`.
    #[error("'target_profile' must not be set when 'source' has a profile")]
    TwoProfiles,
    /// CREATE_DISK with neither a source profile nor `target_profile`.
    #[error("'target_profile' must be set when 'source' has no profile")]
    NoProfile,
    /// CREATE_DISK of something that is neither a pool nor a pre-existing volume.
    #[error(
        "Cannot create a disk from '{resource}': it is neither a storage pool (a profile and \
         no volume id) nor a pre-existing volume (a volume id and no profile)"
    )]
    NeitherPoolNorVolume {
        /// The source.
        resource: String,
    },
    /// A profile the provider does not know (any more).
    #[error("Profile '{profile}' not found")]
    ProfileNotFound {
        /// The profile.
        profile: String,
    },
    /// A profile whose access type does not make the disk asked for.
    #[error("Profile '{profile}' cannot be used to create a {target} disk")]
    ProfileDoesNotFit {
        /// The profile.
        profile: String,
        /// MOUNT or BLOCK.
        target: &'static str,
    },
    /// A profile whose capability has no CSI form.
    #[error("Profile '{profile}' has a volume capability that cannot be used: {reason}")]
    ProfileCapability {
        /// The profile.
        profile: String,
        /// Why.
        reason: String,
    },
    /// An import whose validation failed, or whose metadata is not a map (Mesos's text).
    #[error("Cannot apply profile '{profile}' to resource '{resource}': {reason}")]
    CannotApplyProfile {
        /// The profile.
        profile: String,
        /// The source.
        resource: String,
        /// Why.
        reason: String,
    },
    /// Labels with a key twice.
    #[error("Repeated key '{key}' in labels")]
    RepeatedLabel {
        /// The key.
        key: String,
    },
    /// A label without a value.
    #[error("Missing value for key '{key}' in labels")]
    LabelWithoutValue {
        /// The key.
        key: String,
    },
    /// DESTROY_DISK of something that is not a disk.
    #[error("'source' is neither a MOUNT, BLOCK or RAW disk resource")]
    SourceNotDisk,
    /// DESTROY_DISK of a disk without a CSI volume.
    #[error("'source' is not backed by a CSI volume")]
    SourceNotBacked,
    /// DESTROY_DISK of a disk that holds a persistent volume (the master's text).
    #[error(
        "A disk resource containing a persistent volume {resource} cannot be destroyed \
         directly. Please destroy the persistent volume first then destroy the disk resource"
    )]
    DiskHoldsPersistentVolume {
        /// The source.
        resource: String,
    },
    /// The volume manager's call failed: its error with its causes.
    #[error("{chain}")]
    Volume {
        /// The error chain.
        chain: String,
    },
    /// DESTROY's data removal failed (`Failed to remove persistent volume …`).
    #[error("{message}")]
    PersistentRemoval {
        /// The removal's message.
        message: String,
    },
}
