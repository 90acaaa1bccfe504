//! Volume ids as directory names, and the staging and target paths built from them.
//!
//! Layout (Mesos's, spec §8.2): `<work dir>/csi/<plugin type>/<plugin name>/mounts/<enc(id)>/`
//! with `staging/` and `target/` inside, or `<target_path_root>/<enc(id)>/...` when the
//! plugin configures a root. `enc()` percent-encodes every byte in Mesos's set (below) as
//! `%XX` with upper-case hex; decoding is plain percent decoding, so directories written by
//! Mesos decode to the same ids.
//!
//! One deliberate difference: Mesos leaves `.` alone, so the ids `.` and `..` would name the
//! mounts directory itself or its parent. Here every `.` of those two ids is encoded
//! (`%2E`), which decodes back to the same id. Empty ids and ids whose encoding exceeds a
//! file name's 255 bytes are refused. Hence every id maps to exactly one path component
//! under the root, and no id can escape it.

use std::path::{Path, PathBuf};

use slrp_csi::VolumeId;

/// Longest file name Linux accepts (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// A volume id or directory name that cannot be mapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Volume ids must not be empty.
    #[error("volume id is empty")]
    EmptyId,
    /// The encoded id does not fit in a file name.
    #[error("volume id {id:?} encodes to {len} bytes, more than a file name may have (255)")]
    TooLong {
        /// The id.
        id: String,
        /// Length of its encoding.
        len: usize,
    },
    /// A directory name is not a valid encoding.
    #[error("directory name {name:?} is not an encoded volume id: {reason}")]
    BadEncoding {
        /// The directory name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A plugin type or name cannot be a single path component.
    #[error("CSI plugin {what} {value:?} cannot be used as a directory name")]
    BadPluginName {
        /// `type` or `name`.
        what: &'static str,
        /// The rejected value.
        value: String,
    },
}

/// Whether Mesos encodes byte `b` (spec §8.2).
fn must_encode(b: u8) -> bool {
    !(0x20..=0x7F).contains(&b) || b"$&+,/:;=?@ \"<>#%{}|\\^~[]`".contains(&b)
}

/// Encodes a volume id as one directory name.
pub fn encode_volume_id(id: &str) -> Result<String, PathError> {
    if id.is_empty() {
        return Err(PathError::EmptyId);
    }
    let dots_only = id == "." || id == "..";
    let mut out = String::with_capacity(id.len());
    for &b in id.as_bytes() {
        if must_encode(b) || (dots_only && b == b'.') {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    if out.len() > NAME_MAX {
        return Err(PathError::TooLong {
            id: id.to_owned(),
            len: out.len(),
        });
    }
    Ok(out)
}

/// Decodes a directory name back into the volume id.
pub fn decode_volume_id(name: &str) -> Result<String, PathError> {
    let bad = |reason| PathError::BadEncoding {
        name: name.to_owned(),
        reason,
    };
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or_else(|| bad("truncated %-escape"))?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad("invalid %-escape"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad("invalid %-escape"))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let id = String::from_utf8(out).map_err(|_| bad("decodes to bytes that are not UTF-8"))?;
    if id.is_empty() {
        return Err(bad("empty"));
    }
    Ok(id)
}

/// The mount root of one plugin and the per-volume paths under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPaths {
    root: PathBuf,
}

fn check_component(what: &'static str, value: &str) -> Result<(), PathError> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.contains('/')
        || value.contains('\0')
    {
        return Err(PathError::BadPluginName {
            what,
            value: value.to_owned(),
        });
    }
    Ok(())
}

impl MountPaths {
    /// Mounts under an explicit root (`CSIPluginInfo.target_path_root`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Mesos's default root: `<work_dir>/csi/<plugin type>/<plugin name>/mounts`.
    pub fn under_work_dir(
        work_dir: &Path,
        plugin_type: &str,
        plugin_name: &str,
    ) -> Result<Self, PathError> {
        check_component("type", plugin_type)?;
        check_component("name", plugin_name)?;
        Ok(Self::new(
            work_dir
                .join("csi")
                .join(plugin_type)
                .join(plugin_name)
                .join("mounts"),
        ))
    }

    /// The mount root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<enc(id)>`: everything slrp keeps for the volume on this node.
    pub fn volume_dir(&self, id: &VolumeId) -> Result<PathBuf, PathError> {
        Ok(self.root.join(encode_volume_id(id.as_str())?))
    }

    /// `<root>/<enc(id)>/staging`: NodeStageVolume's `staging_target_path`.
    pub fn staging(&self, id: &VolumeId) -> Result<PathBuf, PathError> {
        Ok(self.volume_dir(id)?.join("staging"))
    }

    /// `<root>/<enc(id)>/target`: NodePublishVolume's `target_path`.
    pub fn target(&self, id: &VolumeId) -> Result<PathBuf, PathError> {
        Ok(self.volume_dir(id)?.join("target"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Component;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn mesos_encoding() {
        assert_eq!(encode_volume_id("vol-1_a.b").unwrap(), "vol-1_a.b");
        assert_eq!(
            encode_volume_id("/var/lib/csi/v 1").unwrap(),
            "%2Fvar%2Flib%2Fcsi%2Fv%201"
        );
        assert_eq!(encode_volume_id("a%b:c").unwrap(), "a%25b%3Ac");
        assert_eq!(encode_volume_id("é").unwrap(), "%C3%A9");
        assert_eq!(encode_volume_id("\x7F").unwrap(), "\x7F");
        assert_eq!(decode_volume_id("%2Fvar%2flib").unwrap(), "/var/lib");
    }

    #[test]
    fn dot_ids_do_not_escape() {
        assert_eq!(encode_volume_id(".").unwrap(), "%2E");
        assert_eq!(encode_volume_id("..").unwrap(), "%2E%2E");
        assert_eq!(encode_volume_id("...").unwrap(), "...");
        assert_eq!(decode_volume_id("%2E%2E").unwrap(), "..");
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(encode_volume_id(""), Err(PathError::EmptyId));
        assert!(matches!(
            encode_volume_id(&"/".repeat(100)),
            Err(PathError::TooLong { len: 300, .. })
        ));
        for bad in ["%", "%2", "%zz", "%FF", ""] {
            assert!(
                matches!(decode_volume_id(bad), Err(PathError::BadEncoding { .. })),
                "{bad:?}"
            );
        }
        for (t, n) in [("..", "x"), ("a/b", "x"), ("t", ""), ("t", ".")] {
            assert!(
                MountPaths::under_work_dir(Path::new("/w"), t, n).is_err(),
                "{t:?} {n:?}"
            );
        }
    }

    #[test]
    fn mesos_layout() {
        let p =
            MountPaths::under_work_dir(Path::new("/work"), "org.apache.mesos.csi.test", "local")
                .unwrap();
        let id = VolumeId::new("/tmp/vol 1");
        assert_eq!(
            p.staging(&id).unwrap(),
            Path::new("/work/csi/org.apache.mesos.csi.test/local/mounts/%2Ftmp%2Fvol%201/staging")
        );
        assert_eq!(
            p.target(&id).unwrap(),
            Path::new("/work/csi/org.apache.mesos.csi.test/local/mounts/%2Ftmp%2Fvol%201/target")
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any id encodes to a single normal path component, directly under the root, and
        /// decodes back to itself.
        #[test]
        fn no_id_escapes(id in prop_oneof![
            ".{1,80}",
            "[./%a]{1,6}",
            proptest::collection::vec(any::<char>(), 1..40).prop_map(|v| v.into_iter().collect::<String>()),
        ]) {
            match encode_volume_id(&id) {
                Ok(enc) => {
                    prop_assert!(!enc.is_empty() && enc != "." && enc != "..");
                    prop_assert!(!enc.contains('/') && !enc.contains('\0'));
                    let root = MountPaths::new("/root/mounts");
                    let dir = root.volume_dir(&VolumeId::new(id.clone())).unwrap();
                    let comps: Vec<Component<'_>> = dir.strip_prefix("/root/mounts").unwrap().components().collect();
                    prop_assert_eq!(comps.len(), 1);
                    prop_assert!(matches!(comps[0], Component::Normal(_)));
                    prop_assert_eq!(decode_volume_id(&enc).unwrap(), id);
                }
                Err(PathError::TooLong { len, .. }) => prop_assert!(len > 255),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
