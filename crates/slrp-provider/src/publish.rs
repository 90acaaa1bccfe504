//! PUBLISH_RESOURCES (spec §5.14): which volumes an agent's publish names, and publishing
//! them.
//!
//! The agent asks for the union of every provider resource its containers use, each time
//! a task starts ("ensure-all", §2.11), so most volumes of a publish are published
//! already; the volume manager answers those without a CSI call. Volumes are published
//! in parallel (each volume's CSI calls stay serialized in the volume manager).
//!
//! Differences from Mesos: a resource without a volume id is an error, not an abort; the
//! first error found is the one reported (Mesos's loop lets a later resource overwrite it,
//! spec §12 item 21).

use std::collections::BTreeSet;

use futures_util::future::join_all;
use slrp_core::provider::resources::{DisplayResource, Resources};
use slrp_core::volume::VolumeManagerHandle;
use slrp_csi::VolumeId;
use slrp_proto::mesos::v1::Resource;
use slrp_proto::mesos::v1::resource::disk_info::source::Type as SourceType;
use slrp_types::DisplayChain;

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

/// Publishes every id in parallel (a published volume is a no-op in the volume manager).
///
/// # Errors
/// The first failure in the order of `ids`, with its causes, for the log line `Failed to
/// publish resources '<resources>': <error>`. Every publish runs to its end either way.
pub async fn publish_all(volumes: &VolumeManagerHandle, ids: Vec<VolumeId>) -> Result<(), String> {
    let results = join_all(ids.iter().map(|id| volumes.publish(id))).await;
    match results.into_iter().find_map(Result::err) {
        None => Ok(()),
        Some(error) => Err(DisplayChain(&error).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use slrp_core::provider::resources::ProviderResources;
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

    mod with_a_volume_manager {
        use slrp_test_support::fake_csi::FakeCsi;
        use slrp_test_support::harness::{Harness, create_req, until, within};

        use super::*;

        #[tokio::test]
        async fn every_volume_is_published_and_a_repeat_is_a_no_op() {
            let h = Harness::new(FakeCsi::full());
            let m = h.start();
            let a = m.handle.create(create_req("a")).await.unwrap().id;
            let b = m.handle.create(create_req("b")).await.unwrap().id;
            within(publish_all(&m.handle, vec![a.clone(), b.clone()]))
                .await
                .unwrap();
            for id in [&a, &b] {
                assert!(h.fake.volume(id).unwrap().published.is_some(), "{id}");
            }
            let calls = h.fake.total_calls();
            within(publish_all(&m.handle, vec![a, b])).await.unwrap();
            assert_eq!(h.fake.total_calls(), calls);
            m.stop().await.unwrap();
        }

        /// One slow volume does not hold the others back.
        #[tokio::test]
        async fn volumes_are_published_in_parallel() {
            let h = Harness::new(FakeCsi::full());
            let m = h.start();
            let slow = m.handle.create(create_req("slow")).await.unwrap().id;
            let fast = m.handle.create(create_req("fast")).await.unwrap().id;
            h.fake.hold(&slow);
            let handle = m.handle.clone();
            let ids = vec![slow.clone(), fast.clone()];
            let all = tokio::spawn(async move { publish_all(&handle, ids).await });
            until(|| h.fake.volume(&fast).unwrap().published.is_some()).await;
            assert!(h.fake.volume(&slow).unwrap().published.is_none());
            assert!(!all.is_finished());
            h.fake.unhold(&slow);
            within(all).await.unwrap().unwrap();
            assert!(h.fake.volume(&slow).unwrap().published.is_some());
            m.stop().await.unwrap();
        }

        #[tokio::test]
        async fn the_first_failure_is_returned_and_the_rest_still_published() {
            let h = Harness::new(FakeCsi::full());
            let m = h.start();
            let known = m.handle.create(create_req("known")).await.unwrap().id;
            let error = within(publish_all(
                &m.handle,
                vec![VolumeId::new("gone"), known.clone(), VolumeId::new("lost")],
            ))
            .await
            .unwrap_err();
            assert_eq!(error, "Cannot publish unknown volume 'gone'");
            assert!(h.fake.volume(&known).unwrap().published.is_some());
            m.stop().await.unwrap();
        }
    }
}
