//! [`ProfileInfo`]: what a disk profile means (spec §7.3).

use std::collections::BTreeMap;

use slrp_proto::mesos::v1::volume::source::csi_volume::VolumeCapability;

/// What a profile translates to: the capability and the `CreateVolume` parameters
/// (Mesos's `DiskProfileAdaptor::ProfileInfo`; spec §7.3: name → capability and
/// parameters). The profile adaptor answers with it, and the provider keeps one for each
/// profile of its storage pools.
///
/// Equality is protobuf equality of the capability (the devolved Mesos form always sets
/// `fs_type`, so "unset" and "empty" cannot differ) plus map equality of the parameters,
/// which is what Mesos compares when it enforces immutability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileInfo {
    /// The volume capability in the Mesos form used in checkpoints.
    pub capability: VolumeCapability,
    /// Passed verbatim to `CreateVolume`, `GetCapacity` and `ValidateVolumeCapabilities`.
    pub parameters: BTreeMap<String, String>,
}
