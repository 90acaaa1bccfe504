//! SCRATCH-STUB (not committed)
#![allow(missing_docs, unused)]
use slrp_core::provider::resources::Resources;
use slrp_core::volume::{VolumeId, VolumeManagerHandle};
use slrp_proto::mesos::v1::Resource;
/// stub
pub fn publish_targets(total: &Resources, resources: &[Resource]) -> Result<Vec<VolumeId>, String> {
    unimplemented!()
}
/// stub
pub async fn publish_all(volumes: &VolumeManagerHandle, ids: Vec<VolumeId>) -> Result<(), String> {
    unimplemented!()
}
