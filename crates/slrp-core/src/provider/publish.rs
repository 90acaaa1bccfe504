//! PUBLISH_RESOURCES (spec §5.14): which volumes an agent's publish names.
//!
//! The agent asks for the union of every provider resource its containers use, each time
//! a task starts ("ensure-all", §2.11), so most volumes of a publish are published
//! already. Differences from Mesos: a resource without a volume id is an error, not an
//! abort; the first error found is the one reported (Mesos's loop lets a later resource
//! overwrite it, spec §12 item 21).

use std::collections::BTreeSet;

use slrp_csi::VolumeId;
use slrp_proto::mesos::v1::Resource;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;

use super::resources::{DisplayResource, Resources};

/// §5.14 step 2: the distinct volume ids to publish, in id order, or the FAILED reason
/// (`Cannot publish unknown resource '<r>'`, "Cannot publish volume of RAW type").
/// Allocation info is stripped before anything is compared with `total`.
///
/// # Errors
/// The first resource `total` does not contain, or that is not a PATH, MOUNT or BLOCK disk
/// with a volume id.
pub fn publish_targets(total: &Resources, resources: &[Resource]) -> Result<Vec<VolumeId>, String> {
    let asked: Resources = resources
        .iter()
        .map(|r| Resource {
            allocation_info: None,
            ..r.clone()
        })
        .collect();
    let mut ids = BTreeSet::new();
    for resource in &asked {
        if !total.contains(&Resources::from(resource.clone())) {
            return Err(format!(
                "Cannot publish unknown resource '{}'",
                DisplayResource(resource)
            ));
        }
        let source = resource.disk.as_ref().and_then(|d| d.source.as_ref());
        let number = source.map_or(SourceType::Unknown as i32, |s| s.r#type);
        match SourceType::try_from(number) {
            Ok(SourceType::Path | SourceType::Mount | SourceType::Block) => {
                let Some(id) = source.and_then(|s| s.id.as_deref()) else {
                    return Err(format!(
                        "Cannot publish resource '{}': it has no volume id",
                        DisplayResource(resource)
                    ));
                };
                ids.insert(VolumeId::new(id));
            }
            Ok(kind @ (SourceType::Raw | SourceType::Unknown)) => {
                return Err(format!(
                    "Cannot publish volume of {} type",
                    kind.as_str_name()
                ));
            }
            Err(_) => return Err(format!("Cannot publish volume of {number} type")),
        }
    }
    Ok(ids.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use crate::provider::resources::ProviderResources;
    use slrp_proto::mesos::v1::ResourceProviderId;
    use slrp_proto::mesos::v1::resource::AllocationInfo;
    use slrp_proto::mesos::v1::resource::disk_info::source::Mount;

    use super::*;

    const MB: u64 = 1_048_576;

    fn ctx() -> ProviderResources {
        ProviderResources::new(
            ResourceProviderId {
                value: "rp".to_owned(),
            },
            "org.test",
            "fake",
            vec![],
        )
        .unwrap()
    }

    fn disk(kind: SourceType, id: &str) -> Resource {
        let mut r = ctx().raw_disk(8 * MB, Some("p"), Some(id), None);
        let s = r.disk.as_mut().unwrap().source.as_mut().unwrap();
        s.r#type = kind as i32;
        if kind == SourceType::Mount {
            s.mount = Some(Mount {
                root: Some(ctx().mount_root().to_owned()),
            });
        }
        r
    }

    fn allocated(mut r: Resource) -> Resource {
        r.allocation_info = Some(AllocationInfo {
            role: Some("web".to_owned()),
        });
        r
    }

    #[test]
    fn distinct_ids_of_known_disks_without_allocation_info() {
        let total: Resources = [
            disk(SourceType::Mount, "b"),
            disk(SourceType::Block, "a"),
            ctx().raw_disk(100 * MB, Some("p"), None, None),
        ]
        .into_iter()
        .collect();
        let asked = [
            allocated(disk(SourceType::Mount, "b")),
            allocated(disk(SourceType::Block, "a")),
            allocated(disk(SourceType::Mount, "b")),
        ];
        // The agent's union may name a volume twice (two containers use it): one id.
        assert_eq!(
            publish_targets(&total, &asked).unwrap(),
            vec![VolumeId::new("a"), VolumeId::new("b")]
        );
        assert!(publish_targets(&total, &[]).unwrap().is_empty());
    }

    #[test]
    fn unknown_and_raw_resources_fail_with_mesos_texts() {
        let pool = ctx().raw_disk(100 * MB, Some("p"), None, None);
        let preexisting = ctx().raw_disk(5 * MB, None, Some("pre"), None);
        let total: Resources = [
            disk(SourceType::Mount, "m"),
            pool.clone(),
            preexisting.clone(),
        ]
        .into_iter()
        .collect();
        let stranger = disk(SourceType::Mount, "elsewhere");
        assert_eq!(
            publish_targets(&total, &[allocated(stranger.clone())]),
            Err(format!(
                "Cannot publish unknown resource '{}'",
                DisplayResource(&stranger)
            ))
        );
        for raw in [pool, preexisting] {
            assert_eq!(
                publish_targets(&total, &[disk(SourceType::Mount, "m"), allocated(raw)]),
                Err("Cannot publish volume of RAW type".to_owned())
            );
        }
    }

    #[test]
    fn the_first_error_is_the_one_reported() {
        let pool = ctx().raw_disk(100 * MB, Some("p"), None, None);
        let total = Resources::from(pool.clone());
        let stranger = disk(SourceType::Block, "x");
        // Mesos reports the last error of the loop; the first is what went wrong first.
        assert_eq!(
            publish_targets(&total, &[pool, stranger]),
            Err("Cannot publish volume of RAW type".to_owned())
        );
    }
}
