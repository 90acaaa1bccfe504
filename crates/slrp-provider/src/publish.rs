//! PUBLISH_RESOURCES (spec §5.14): publishing the volumes a publish names (which ones,
//! the machine decides: `slrp_core::provider::publish`).
//!
//! Volumes are published in parallel (each volume's CSI calls stay serialized in the
//! volume manager); a published volume is answered by the volume manager without a CSI
//! call.

use futures_util::future::try_join_all;
use slrp_core::volume::VolumeManagerHandle;
use slrp_csi::VolumeId;
use slrp_types::DisplayChain;

/// Publishes every id in parallel (a published volume is a no-op in the volume manager).
///
/// # Errors
/// The first failure to come back, with its causes, for the log line `Failed to publish
/// resources '<resources>': <error>`: the answer goes at once, as Mesos's `collect`
/// fails at the first failure (the agent's launch fails; the framework retries it). The
/// publishes already handed to the volume manager run to their end there (it carries out
/// a call whose caller stopped waiting).
pub async fn publish_all(volumes: &VolumeManagerHandle, ids: Vec<VolumeId>) -> Result<(), String> {
    try_join_all(ids.iter().map(|id| volumes.publish(id)))
        .await
        .map(drop)
        .map_err(|error| DisplayChain(&error).to_string())
}

#[cfg(test)]
mod tests {
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

    /// Mesos's `collect`: the answer goes at the first failure, not after the slowest
    /// volume (with every publish awaited, a held volume kept the answer back); a
    /// publish already handed to the volume manager still completes.
    #[tokio::test]
    async fn the_first_failure_answers_at_once_and_the_rest_still_publish() {
        let h = Harness::new(FakeCsi::full());
        let m = h.start();
        let slow = m.handle.create(create_req("slow")).await.unwrap().id;
        h.fake.hold(&slow);
        let error = within(publish_all(
            &m.handle,
            vec![slow.clone(), VolumeId::new("gone")],
        ))
        .await
        .unwrap_err();
        assert_eq!(error, "Cannot publish unknown volume 'gone'");
        assert!(h.fake.volume(&slow).unwrap().published.is_none());
        h.fake.unhold(&slow);
        until(|| h.fake.volume(&slow).unwrap().published.is_some()).await;
        m.stop().await.unwrap();
    }
}
