//! Volume capabilities: the version-neutral form slrp works with, and its conversions to
//! and from the three wire forms (as Mesos's `csi/v0_utils` and `csi/v1_utils` do).
//!
//! - Mesos `Volume.Source.CSIVolume.VolumeCapability`: what profiles translate to and
//!   what checkpoints hold (Mesos's `devolve`d form). Five access modes.
//! - CSI v0 `csi.v0.VolumeCapability`: the same five modes.
//! - CSI v1 `csi.v1.VolumeCapability`: adds `SINGLE_NODE_SINGLE_WRITER` and
//!   `SINGLE_NODE_MULTI_WRITER` (CSI 1.5).
//!
//! All three number the shared modes alike (1 = `SINGLE_NODE_WRITER` ... 5 =
//! `MULTI_NODE_MULTI_WRITER`), so a mode converts by its number. A mode a form cannot
//! carry is an error, never a silent substitute: a v1-only mode sent to a v0 plugin would
//! otherwise change what the volume promises. Converting *from* a wire form rejects
//! `UNKNOWN` and a missing access type, which Mesos rules out by validating profiles first.
//!
//! Which Mesos disk a capability makes ([`VolumeCapability::disk_source_type`]) follows
//! the provider: a block capability makes a `BLOCK` disk, a mount one a `MOUNT` disk
//! (spec §5.4, `provider.cpp` "cannot be used to create a MOUNT disk").

use std::fmt;

use serde::{Deserialize, Serialize};
use slrp_proto::csi::{v0 as csi0, v1 as csi1};
use slrp_proto::mesos::v1::resource::disk_info::source::Type as DiskSourceType;
use slrp_proto::mesos::v1::volume::source::csi_volume as mesos;

/// CSI access mode. `SingleNodeSingleWriter` and `SingleNodeMultiWriter` exist only in
/// CSI v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessMode {
    /// `SINGLE_NODE_WRITER`.
    SingleNodeWriter,
    /// `SINGLE_NODE_READER_ONLY`.
    SingleNodeReaderOnly,
    /// `MULTI_NODE_READER_ONLY`.
    MultiNodeReaderOnly,
    /// `MULTI_NODE_SINGLE_WRITER`.
    MultiNodeSingleWriter,
    /// `MULTI_NODE_MULTI_WRITER`.
    MultiNodeMultiWriter,
    /// `SINGLE_NODE_SINGLE_WRITER` (v1 only).
    SingleNodeSingleWriter,
    /// `SINGLE_NODE_MULTI_WRITER` (v1 only).
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// All modes, in wire-number order, for parsers and help texts.
    pub const ALL: [AccessMode; 7] = [
        Self::SingleNodeWriter,
        Self::SingleNodeReaderOnly,
        Self::MultiNodeReaderOnly,
        Self::MultiNodeSingleWriter,
        Self::MultiNodeMultiWriter,
        Self::SingleNodeSingleWriter,
        Self::SingleNodeMultiWriter,
    ];

    /// The CSI enum name, e.g. `SINGLE_NODE_WRITER`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SingleNodeWriter => "SINGLE_NODE_WRITER",
            Self::SingleNodeReaderOnly => "SINGLE_NODE_READER_ONLY",
            Self::MultiNodeReaderOnly => "MULTI_NODE_READER_ONLY",
            Self::MultiNodeSingleWriter => "MULTI_NODE_SINGLE_WRITER",
            Self::MultiNodeMultiWriter => "MULTI_NODE_MULTI_WRITER",
            Self::SingleNodeSingleWriter => "SINGLE_NODE_SINGLE_WRITER",
            Self::SingleNodeMultiWriter => "SINGLE_NODE_MULTI_WRITER",
        }
    }

    /// Parses a CSI enum name, case-insensitively; `-` may stand for `_`.
    pub fn parse(s: &str) -> Option<Self> {
        let norm = s.trim().to_ascii_uppercase().replace('-', "_");
        Self::ALL.into_iter().find(|m| m.as_str() == norm)
    }

    /// The enum number shared by the Mesos, CSI v0 and CSI v1 definitions (1..=7).
    pub fn number(self) -> i32 {
        match self {
            Self::SingleNodeWriter => 1,
            Self::SingleNodeReaderOnly => 2,
            Self::MultiNodeReaderOnly => 3,
            Self::MultiNodeSingleWriter => 4,
            Self::MultiNodeMultiWriter => 5,
            Self::SingleNodeSingleWriter => 6,
            Self::SingleNodeMultiWriter => 7,
        }
    }

    /// The mode with this enum number; `None` for `UNKNOWN` (0) and numbers no version
    /// defines.
    pub fn from_number(n: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.number() == n)
    }

    /// Whether `form` can carry this mode.
    pub fn exists_in(self, form: CapabilityForm) -> bool {
        match form {
            CapabilityForm::CsiV1 => true,
            CapabilityForm::Mesos | CapabilityForm::CsiV0 => self.number() <= 5,
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a volume is accessed: as a raw block device or as a mounted filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessType {
    /// `BlockVolume`.
    Block,
    /// `MountVolume`.
    Mount {
        /// Filesystem type; empty = plugin default.
        #[serde(default)]
        fs_type: String,
        /// Mount flags.
        #[serde(default)]
        mount_flags: Vec<String>,
    },
}

/// `VolumeCapability`, version-neutral.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VolumeCapability {
    /// Block or mount.
    pub access_type: AccessType,
    /// Access mode.
    pub access_mode: AccessMode,
}

/// One of the wire forms a capability converts to or from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapabilityForm {
    /// Mesos `Volume.Source.CSIVolume.VolumeCapability`.
    Mesos,
    /// `csi.v0.VolumeCapability`.
    CsiV0,
    /// `csi.v1.VolumeCapability`.
    CsiV1,
}

impl fmt::Display for CapabilityForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Mesos => "Mesos CSIVolume.VolumeCapability",
            Self::CsiV0 => "csi.v0.VolumeCapability",
            Self::CsiV1 => "csi.v1.VolumeCapability",
        })
    }
}

/// A capability that cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// The access mode does not exist in the target form.
    #[error("access mode {mode} cannot be expressed as a {form}")]
    ModeNotInForm {
        /// The mode.
        mode: AccessMode,
        /// The target form.
        form: CapabilityForm,
    },
    /// The access mode is absent, `UNKNOWN` or a number the form does not define.
    #[error("{form} has no valid access mode (got {number:?})")]
    BadMode {
        /// The source form.
        form: CapabilityForm,
        /// The number found; `None` when `access_mode` is absent.
        number: Option<i32>,
    },
    /// Neither `block` nor `mount` is set.
    #[error("{form} sets neither block nor mount")]
    NoAccessType {
        /// The source form.
        form: CapabilityForm,
    },
}

impl VolumeCapability {
    /// A mount capability with the plugin's default filesystem, single-node writer.
    pub fn mount_default() -> Self {
        Self {
            access_type: AccessType::Mount {
                fs_type: String::new(),
                mount_flags: Vec::new(),
            },
            access_mode: AccessMode::SingleNodeWriter,
        }
    }

    /// A block capability, single-node writer.
    pub fn block() -> Self {
        Self {
            access_type: AccessType::Block,
            access_mode: AccessMode::SingleNodeWriter,
        }
    }

    /// The kind of Mesos disk a volume with this capability is offered as.
    pub fn disk_source_type(&self) -> DiskSourceType {
        match self.access_type {
            AccessType::Block => DiskSourceType::Block,
            AccessType::Mount { .. } => DiskSourceType::Mount,
        }
    }

    /// Whether a profile with this capability can create a disk of `target` type (Mesos
    /// refuses e.g. a `MOUNT` disk from a block profile).
    pub fn can_create(&self, target: DiskSourceType) -> bool {
        self.disk_source_type() == target
    }

    fn mode_for(&self, form: CapabilityForm) -> Result<i32, CapabilityError> {
        let mode = self.access_mode;
        if mode.exists_in(form) {
            Ok(mode.number())
        } else {
            Err(CapabilityError::ModeNotInForm { mode, form })
        }
    }

    /// The Mesos form (Mesos's `devolve`): `fs_type` is always set, as in Mesos, so an
    /// empty and an unset file system type compare equal.
    ///
    /// # Errors
    /// [`CapabilityError::ModeNotInForm`] for a v1-only access mode.
    pub fn to_mesos(&self) -> Result<mesos::VolumeCapability, CapabilityError> {
        use mesos::volume_capability::{AccessMode as Mode, AccessType as Type};
        let access_type = match &self.access_type {
            AccessType::Block => Type::Block(mesos::volume_capability::BlockVolume {}),
            AccessType::Mount {
                fs_type,
                mount_flags,
            } => Type::Mount(mesos::volume_capability::MountVolume {
                fs_type: Some(fs_type.clone()),
                mount_flags: mount_flags.clone(),
            }),
        };
        Ok(mesos::VolumeCapability {
            access_mode: Mode {
                mode: self.mode_for(CapabilityForm::Mesos)?,
            },
            access_type: Some(access_type),
        })
    }

    /// From the Mesos form.
    ///
    /// # Errors
    /// [`CapabilityError`] for an `UNKNOWN` or undefined mode, or no access type.
    pub fn from_mesos(c: &mesos::VolumeCapability) -> Result<Self, CapabilityError> {
        use mesos::volume_capability::AccessType as Type;
        let access_type = c.access_type.as_ref().map(|t| match t {
            Type::Block(_) => AccessType::Block,
            Type::Mount(m) => mount(m.fs_type.as_deref().unwrap_or_default(), &m.mount_flags),
        });
        assemble(CapabilityForm::Mesos, access_type, Some(c.access_mode.mode))
    }

    /// The CSI v1 form (every mode exists in v1).
    pub fn to_csi_v1(&self) -> csi1::VolumeCapability {
        use csi1::volume_capability::{AccessMode as Mode, AccessType as Type};
        let access_type = match &self.access_type {
            AccessType::Block => Type::Block(csi1::volume_capability::BlockVolume {}),
            AccessType::Mount {
                fs_type,
                mount_flags,
            } => Type::Mount(csi1::volume_capability::MountVolume {
                fs_type: fs_type.clone(),
                mount_flags: mount_flags.clone(),
                volume_mount_group: String::new(),
            }),
        };
        csi1::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(Mode {
                mode: self.access_mode.number(),
            }),
        }
    }

    /// From the CSI v1 form. `volume_mount_group` is not modelled and is dropped.
    ///
    /// # Errors
    /// [`CapabilityError`] for a missing, `UNKNOWN` or undefined mode, or no access type.
    pub fn from_csi_v1(c: &csi1::VolumeCapability) -> Result<Self, CapabilityError> {
        use csi1::volume_capability::AccessType as Type;
        let access_type = c.access_type.as_ref().map(|t| match t {
            Type::Block(_) => AccessType::Block,
            Type::Mount(m) => mount(&m.fs_type, &m.mount_flags),
        });
        assemble(
            CapabilityForm::CsiV1,
            access_type,
            c.access_mode.map(|m| m.mode),
        )
    }

    /// The CSI v0 form.
    ///
    /// # Errors
    /// [`CapabilityError::ModeNotInForm`] for a v1-only access mode.
    pub fn to_csi_v0(&self) -> Result<csi0::VolumeCapability, CapabilityError> {
        use csi0::volume_capability::{AccessMode as Mode, AccessType as Type};
        let access_type = match &self.access_type {
            AccessType::Block => Type::Block(csi0::volume_capability::BlockVolume {}),
            AccessType::Mount {
                fs_type,
                mount_flags,
            } => Type::Mount(csi0::volume_capability::MountVolume {
                fs_type: fs_type.clone(),
                mount_flags: mount_flags.clone(),
            }),
        };
        Ok(csi0::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(Mode {
                mode: self.mode_for(CapabilityForm::CsiV0)?,
            }),
        })
    }

    /// From the CSI v0 form.
    ///
    /// # Errors
    /// [`CapabilityError`] for a missing, `UNKNOWN` or undefined mode, or no access type.
    pub fn from_csi_v0(c: &csi0::VolumeCapability) -> Result<Self, CapabilityError> {
        use csi0::volume_capability::AccessType as Type;
        let access_type = c.access_type.as_ref().map(|t| match t {
            Type::Block(_) => AccessType::Block,
            Type::Mount(m) => mount(&m.fs_type, &m.mount_flags),
        });
        assemble(
            CapabilityForm::CsiV0,
            access_type,
            c.access_mode.map(|m| m.mode),
        )
    }
}

fn mount(fs_type: &str, mount_flags: &[String]) -> AccessType {
    AccessType::Mount {
        fs_type: fs_type.to_owned(),
        mount_flags: mount_flags.to_vec(),
    }
}

/// A capability from the parts of a wire form, checking what every form requires.
fn assemble(
    form: CapabilityForm,
    access_type: Option<AccessType>,
    mode: Option<i32>,
) -> Result<VolumeCapability, CapabilityError> {
    Ok(VolumeCapability {
        access_type: access_type.ok_or(CapabilityError::NoAccessType { form })?,
        access_mode: mode_from(form, mode)?,
    })
}

/// The mode numbered `number` if `form` defines it.
fn mode_from(form: CapabilityForm, number: Option<i32>) -> Result<AccessMode, CapabilityError> {
    number
        .and_then(AccessMode::from_number)
        .filter(|m| m.exists_in(form))
        .ok_or(CapabilityError::BadMode { form, number })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(fs: &str, flags: &[&str], mode: AccessMode) -> VolumeCapability {
        VolumeCapability {
            access_type: AccessType::Mount {
                fs_type: fs.to_owned(),
                mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            },
            access_mode: mode,
        }
    }

    fn block(mode: AccessMode) -> VolumeCapability {
        VolumeCapability {
            access_type: AccessType::Block,
            access_mode: mode,
        }
    }

    /// Every capability shape and mode: (capability, exists in Mesos and v0).
    fn table() -> Vec<(VolumeCapability, bool)> {
        let mut rows = Vec::new();
        for mode in AccessMode::ALL {
            let shared = mode.number() <= 5;
            rows.push((block(mode), shared));
            rows.push((mount("", &[], mode), shared));
            rows.push((mount("xfs", &["noatime", "nodiscard"], mode), shared));
        }
        rows
    }

    #[test]
    fn wire_numbers_match_every_generated_enum() {
        use csi0::volume_capability::access_mode::Mode as V0;
        use csi1::volume_capability::access_mode::Mode as V1;
        use mesos::volume_capability::access_mode::Mode as M;
        for mode in AccessMode::ALL {
            let n = mode.number();
            let v1 = V1::try_from(n).unwrap();
            assert_eq!(v1.as_str_name(), mode.as_str());
            if n <= 5 {
                assert_eq!(V0::try_from(n).unwrap().as_str_name(), mode.as_str());
                assert_eq!(M::try_from(n).unwrap().as_str_name(), mode.as_str());
            } else {
                assert!(V0::try_from(n).is_err() && M::try_from(n).is_err());
            }
            assert_eq!(AccessMode::from_number(n), Some(mode));
            assert_eq!(AccessMode::parse(&mode.as_str().to_lowercase()), Some(mode));
        }
        assert_eq!(AccessMode::from_number(0), None);
        assert_eq!(AccessMode::from_number(8), None);
    }

    #[test]
    fn every_capability_round_trips_through_every_form_that_has_its_mode() {
        for (cap, shared) in table() {
            assert_eq!(
                VolumeCapability::from_csi_v1(&cap.to_csi_v1()),
                Ok(cap.clone())
            );
            let v0 = cap.to_csi_v0();
            let m = cap.to_mesos();
            if shared {
                assert_eq!(VolumeCapability::from_csi_v0(&v0.unwrap()), Ok(cap.clone()));
                assert_eq!(VolumeCapability::from_mesos(&m.unwrap()), Ok(cap.clone()));
            } else {
                let mode = cap.access_mode;
                assert_eq!(
                    v0,
                    Err(CapabilityError::ModeNotInForm {
                        mode,
                        form: CapabilityForm::CsiV0
                    })
                );
                assert_eq!(
                    m,
                    Err(CapabilityError::ModeNotInForm {
                        mode,
                        form: CapabilityForm::Mesos
                    })
                );
            }
        }
    }

    #[test]
    fn mesos_to_csi_matches_the_fields_field_by_field() {
        // Mesos's `evolve`: the profile capability of spec §7.2 as the provider sends it.
        let m = mesos::VolumeCapability {
            access_mode: mesos::volume_capability::AccessMode { mode: 1 },
            access_type: Some(mesos::volume_capability::AccessType::Mount(
                mesos::volume_capability::MountVolume {
                    fs_type: Some("xfs".into()),
                    mount_flags: vec!["noatime".into()],
                },
            )),
        };
        let cap = VolumeCapability::from_mesos(&m).unwrap();
        let v1 = cap.to_csi_v1();
        let Some(csi1::volume_capability::AccessType::Mount(mv)) = &v1.access_type else {
            panic!("mount expected: {v1:?}");
        };
        assert_eq!(
            (mv.fs_type.as_str(), mv.mount_flags.as_slice()),
            ("xfs", &["noatime".to_owned()][..])
        );
        assert_eq!(v1.access_mode.map(|a| a.mode), Some(1));
        let v0 = cap.to_csi_v0().unwrap();
        assert_eq!(v0.access_mode.map(|a| a.mode), Some(1));
        // Unset and empty fs_type are the same capability.
        let mut unset = m.clone();
        if let Some(mesos::volume_capability::AccessType::Mount(mv)) = &mut unset.access_type {
            mv.fs_type = None;
        }
        assert_eq!(
            VolumeCapability::from_mesos(&unset)
                .unwrap()
                .to_mesos()
                .unwrap(),
            mount("", &["noatime"], AccessMode::SingleNodeWriter)
                .to_mesos()
                .unwrap()
        );
    }

    #[test]
    fn malformed_wire_capabilities_are_rejected_with_the_form_named() {
        let no_type = csi1::VolumeCapability {
            access_type: None,
            access_mode: Some(csi1::volume_capability::AccessMode { mode: 1 }),
        };
        let e = VolumeCapability::from_csi_v1(&no_type).unwrap_err();
        assert_eq!(
            e,
            CapabilityError::NoAccessType {
                form: CapabilityForm::CsiV1
            }
        );
        assert_eq!(
            e.to_string(),
            "csi.v1.VolumeCapability sets neither block nor mount"
        );

        let mut no_mode = block(AccessMode::SingleNodeWriter).to_csi_v1();
        no_mode.access_mode = None;
        assert_eq!(
            VolumeCapability::from_csi_v1(&no_mode),
            Err(CapabilityError::BadMode {
                form: CapabilityForm::CsiV1,
                number: None
            })
        );
        let mut unknown = block(AccessMode::SingleNodeWriter).to_csi_v0().unwrap();
        unknown.access_mode = Some(csi0::volume_capability::AccessMode { mode: 0 });
        assert_eq!(
            VolumeCapability::from_csi_v0(&unknown),
            Err(CapabilityError::BadMode {
                form: CapabilityForm::CsiV0,
                number: Some(0)
            })
        );
        // A v1-only number arriving in a v0 message is not a v0 mode.
        unknown.access_mode = Some(csi0::volume_capability::AccessMode { mode: 6 });
        assert!(VolumeCapability::from_csi_v0(&unknown).is_err());
        let mut m = block(AccessMode::SingleNodeWriter).to_mesos().unwrap();
        m.access_mode.mode = 0;
        assert!(VolumeCapability::from_mesos(&m).is_err());
        m.access_mode.mode = 1;
        m.access_type = None;
        assert_eq!(
            VolumeCapability::from_mesos(&m),
            Err(CapabilityError::NoAccessType {
                form: CapabilityForm::Mesos
            })
        );
    }

    #[test]
    fn disk_source_type_follows_the_access_type() {
        let b = block(AccessMode::SingleNodeWriter);
        let m = mount("ext4", &[], AccessMode::SingleNodeWriter);
        assert_eq!(b.disk_source_type(), DiskSourceType::Block);
        assert_eq!(m.disk_source_type(), DiskSourceType::Mount);
        assert!(b.can_create(DiskSourceType::Block) && !b.can_create(DiskSourceType::Mount));
        assert!(m.can_create(DiskSourceType::Mount) && !m.can_create(DiskSourceType::Block));
        assert!(!m.can_create(DiskSourceType::Raw) && !m.can_create(DiskSourceType::Path));
    }

    #[test]
    fn serde_form_is_unchanged() {
        // Checkpoints hold this JSON; its shape must not move with the type.
        let json =
            serde_json::to_value(mount("xfs", &["ro"], AccessMode::MultiNodeReaderOnly)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "access_type": {"mount": {"fs_type": "xfs", "mount_flags": ["ro"]}},
                "access_mode": "MULTI_NODE_READER_ONLY"
            })
        );
        let b: VolumeCapability = serde_json::from_value(serde_json::json!({
            "access_type": "block", "access_mode": "SINGLE_NODE_WRITER"
        }))
        .unwrap();
        assert_eq!(b, block(AccessMode::SingleNodeWriter));
    }
}
