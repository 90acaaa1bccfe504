//! Applying operations (spec §5): the acceptance pipeline, the conversions of the
//! speculative operations, CREATE_DISK / DESTROY_DISK planning and the terminal statuses.
//!
//! Pure: no I/O, no clock. The provider worker asks [`admit`] what to do with an
//! APPLY_OPERATION, runs the plan through the volume manager and turns the result into a
//! status with the builders here. See `docs/operations-apply.md`.

use slrp_proto::mesos::v1::offer;
use slrp_proto::mesos::v1::offer::operation::Type as OperationType;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn of_type(t: OperationType) -> offer::Operation {
        offer::Operation {
            r#type: Some(t as i32),
            ..Default::default()
        }
    }

    #[test]
    fn kinds_follow_the_type_field() {
        let cases = [
            (
                OperationType::Reserve,
                OperationKind::Reserve,
                Some("reserve"),
                true,
            ),
            (
                OperationType::Unreserve,
                OperationKind::Unreserve,
                Some("unreserve"),
                true,
            ),
            (
                OperationType::Create,
                OperationKind::Create,
                Some("create"),
                true,
            ),
            (
                OperationType::Destroy,
                OperationKind::Destroy,
                Some("destroy"),
                true,
            ),
            (
                OperationType::CreateDisk,
                OperationKind::CreateDisk,
                Some("create_disk"),
                false,
            ),
            (
                OperationType::DestroyDisk,
                OperationKind::DestroyDisk,
                Some("destroy_disk"),
                false,
            ),
            (
                OperationType::GrowVolume,
                OperationKind::Unsupported,
                None,
                false,
            ),
            (
                OperationType::ShrinkVolume,
                OperationKind::Unsupported,
                None,
                false,
            ),
            (
                OperationType::Launch,
                OperationKind::Unsupported,
                None,
                false,
            ),
            (
                OperationType::LaunchGroup,
                OperationKind::Unsupported,
                None,
                false,
            ),
            (
                OperationType::Unknown,
                OperationKind::Unsupported,
                None,
                false,
            ),
        ];
        for (t, kind, name, speculative) in cases {
            let got = OperationKind::of(&of_type(t));
            assert_eq!(got, kind, "{t:?}");
            assert_eq!(got.metric_name(), name, "{t:?}");
            assert_eq!(got.is_speculative(), speculative, "{t:?}");
        }
    }

    #[test]
    fn absent_or_unknown_type_numbers_are_unsupported() {
        assert_eq!(
            OperationKind::of(&offer::Operation::default()),
            OperationKind::Unsupported
        );
        let odd = offer::Operation {
            r#type: Some(99),
            ..Default::default()
        };
        assert_eq!(OperationKind::of(&odd), OperationKind::Unsupported);
    }

    #[test]
    fn every_counted_kind_has_a_distinct_metric_name() {
        let names: std::collections::BTreeSet<_> = OperationKind::COUNTED
            .iter()
            .map(|k| k.metric_name().expect("counted kinds are named"))
            .collect();
        assert_eq!(names.len(), OperationKind::COUNTED.len());
        assert!(!OperationKind::COUNTED.contains(&OperationKind::Unsupported));
    }
}
