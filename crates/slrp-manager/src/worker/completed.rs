//! The bounded memory of operations removed from the agent's table after their terminal
//! acknowledgement, kept so that a waiter asking late is still answered. It is separate
//! because its compact encoding is a memory concern of its own: the worker only inserts
//! and looks up, and the encoding's round trip and the bound are tested here, next to
//! the private fields they check.

use std::collections::{HashMap, VecDeque};

use slrp_proto::mesos::v1::{FrameworkId, OperationStatus, Uuid as ProtoUuid, offer};

use super::OperationView;

/// Terminal operations removed from the agent's table that
/// [`crate::ManagerHandle::wait_terminal`] still answers for (a waiter that asks after
/// the acknowledgement removed the operation). Bounded: the oldest are forgotten.
const COMPLETED_KEPT: usize = 4096;

/// Bounded memory of operations removed from the agent's table after their terminal
/// acknowledgement.
#[derive(Default)]
pub(super) struct Completed {
    order: VecDeque<Vec<u8>>,
    pub(super) views: HashMap<Vec<u8>, CompactView>,
}

/// An [`OperationView`] kept protobuf-encoded: a view holds an `offer::Operation` inline
/// (about 7.5 KB however little it contains) and statuses with their resources, so the
/// 4,096 kept views took about 60 MB; encoded, a few hundred bytes each.
pub(super) struct CompactView {
    operation_uuid: ProtoUuid,
    framework_id: Option<FrameworkId>,
    info: Option<Vec<u8>>,
    latest_status: Vec<u8>,
    statuses: Vec<Vec<u8>>,
}

impl CompactView {
    fn new(view: &OperationView) -> Self {
        use prost::Message as _;
        Self {
            operation_uuid: view.operation_uuid.clone(),
            framework_id: view.framework_id.clone(),
            info: view.info.as_ref().map(|info| info.encode_to_vec()),
            latest_status: view.latest_status.encode_to_vec(),
            statuses: view.statuses.iter().map(|s| s.encode_to_vec()).collect(),
        }
    }

    /// The view again; `None` only if the encoding did not decode (it always does: it is
    /// prost's own).
    pub(super) fn view(&self) -> Option<OperationView> {
        use prost::Message as _;
        let info = match &self.info {
            Some(bytes) => Some(offer::Operation::decode(bytes.as_slice()).ok()?),
            None => None,
        };
        let statuses = self
            .statuses
            .iter()
            .map(|bytes| OperationStatus::decode(bytes.as_slice()).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(OperationView {
            operation_uuid: self.operation_uuid.clone(),
            framework_id: self.framework_id.clone(),
            info,
            latest_status: OperationStatus::decode(self.latest_status.as_slice()).ok()?,
            statuses,
        })
    }
}

impl Completed {
    pub(super) fn insert(&mut self, key: Vec<u8>, view: &OperationView) {
        if self
            .views
            .insert(key.clone(), CompactView::new(view))
            .is_none()
        {
            self.order.push_back(key);
        }
        while self.order.len() > COMPLETED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.views.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use slrp_proto::mesos::v1::{OperationState, Resource};
    use uuid::Uuid;

    use super::*;
    use crate::worker::proto_uuid;

    #[test]
    fn a_completed_view_is_kept_encoded_and_answered_as_it_was() {
        let status = OperationStatus {
            state: OperationState::OperationFinished as i32,
            message: Some("done".to_owned()),
            converted_resources: vec![Resource {
                name: "disk".to_owned(),
                ..Resource::default()
            }],
            uuid: Some(proto_uuid(Uuid::new_v4())),
            ..OperationStatus::default()
        };
        let view = OperationView {
            operation_uuid: proto_uuid(Uuid::new_v4()),
            framework_id: Some(FrameworkId {
                value: "framework".to_owned(),
            }),
            info: Some(offer::Operation {
                r#type: Some(offer::operation::Type::CreateDisk as i32),
                ..offer::Operation::default()
            }),
            latest_status: status.clone(),
            statuses: vec![status],
        };
        let mut completed = Completed::default();
        let key = view.operation_uuid.value.clone();
        completed.insert(key.clone(), &view);
        assert_eq!(completed.views[&key].view(), Some(view.clone()));
        let without_info = OperationView { info: None, ..view };
        assert_eq!(CompactView::new(&without_info).view(), Some(without_info));
    }

    #[test]
    fn completed_views_are_bounded_oldest_first() {
        let mut completed = Completed::default();
        let view = |n: usize| OperationView {
            operation_uuid: ProtoUuid {
                value: n.to_be_bytes().to_vec(),
            },
            framework_id: None,
            info: None,
            latest_status: OperationStatus::default(),
            statuses: Vec::new(),
        };
        for n in 0..=COMPLETED_KEPT {
            let v = view(n);
            completed.insert(v.operation_uuid.value.clone(), &v);
        }
        assert_eq!(completed.views.len(), COMPLETED_KEPT);
        assert!(
            !completed
                .views
                .contains_key(0usize.to_be_bytes().as_slice())
        );
    }
}
