//! Call validation, as Mesos's `src/resource_provider/validation.cpp` (spec §2.6).
//!
//! Required fields are enforced earlier, while decoding (`slrp-wire`), as the C++ parser
//! does; what is left here is the per-type presence rules and, with provider context, the
//! consistency of the provider IDs inside the call.

use slrp_proto::mesos::v1::ResourceProviderId;
use slrp_proto::mesos::v1::resource_provider::{Call, call};

/// The type of a call, treating an unknown enum number as absent: proto2 C++ keeps an
/// unknown enum value in the unknown fields, so `has_type()` is false there.
#[must_use]
pub fn call_type(call: &Call) -> Option<call::Type> {
    call.r#type.and_then(|raw| call::Type::try_from(raw).ok())
}

/// Validates `call`; with `provider` (the subscribed provider's ID) also its consistency.
///
/// # Errors
/// Mesos's reason text, e.g. `Expecting 'type' to be present`.
pub fn validate(call: &Call, provider: Option<&ResourceProviderId>) -> Result<(), &'static str> {
    let Some(kind) = call_type(call) else {
        return Err("Expecting 'type' to be present");
    };
    let needs_id = matches!(
        kind,
        call::Type::UpdateState
            | call::Type::UpdateOperationStatus
            | call::Type::UpdatePublishResourcesStatus
    );
    if needs_id && call.resource_provider_id.is_none() {
        return Err("Expecting 'resource_provider_id' to be present");
    }
    match kind {
        call::Type::Unknown => Ok(()),
        call::Type::Subscribe => match call.subscribe {
            Some(_) => Ok(()),
            None => Err("Expecting 'subscribe' to be present"),
        },
        call::Type::UpdateOperationStatus => {
            let Some(update) = &call.update_operation_status else {
                return Err("Expecting 'update_operation_status' to be present");
            };
            match provider {
                Some(id) if update.status.resource_provider_id.as_ref() != Some(id) => {
                    Err("Inconsistent resource provider ID in 'update_operation_status'")
                }
                _ => Ok(()),
            }
        }
        call::Type::UpdateState => {
            let Some(update) = &call.update_state else {
                return Err("Expecting 'update_state' to be present");
            };
            match provider {
                Some(id)
                    if update
                        .resources
                        .iter()
                        .any(|resource| resource.provider_id.as_ref() != Some(id)) =>
                {
                    Err("Inconsistent resource provider ID in 'update_state'")
                }
                _ => Ok(()),
            }
        }
        // The trailing period is Mesos's.
        call::Type::UpdatePublishResourcesStatus => match call.update_publish_resources_status {
            Some(_) => Ok(()),
            None => Err("Expecting 'update_publish_resources_status' to be present."),
        },
    }
}

#[cfg(test)]
mod tests {
    use slrp_proto::mesos::v1::{OperationStatus, Resource, ResourceProviderInfo, Uuid};

    use super::*;

    fn id(value: &str) -> ResourceProviderId {
        ResourceProviderId {
            value: value.to_owned(),
        }
    }

    fn typed(kind: call::Type) -> Call {
        Call {
            r#type: Some(kind as i32),
            ..Call::default()
        }
    }

    // Mesos ResourceProviderCallValidationTest.Subscribe.
    #[test]
    fn subscribe() {
        let mut call = typed(call::Type::Subscribe);
        assert!(validate(&call, None).is_err());
        call.subscribe = Some(call::Subscribe {
            resource_provider_info: ResourceProviderInfo {
                r#type: "org.apache.mesos.rp.test".to_owned(),
                name: "test".to_owned(),
                ..ResourceProviderInfo::default()
            },
        });
        assert_eq!(validate(&call, None), Ok(()));
    }

    // Mesos ResourceProviderCallValidationTest.UpdateOperationStatus.
    #[test]
    fn update_operation_status() {
        let mut call = typed(call::Type::UpdateOperationStatus);
        assert_eq!(
            validate(&call, None),
            Err("Expecting 'resource_provider_id' to be present")
        );
        call.resource_provider_id = Some(id("rp"));
        assert_eq!(
            validate(&call, None),
            Err("Expecting 'update_operation_status' to be present")
        );
        call.update_operation_status = Some(call::UpdateOperationStatus {
            framework_id: None,
            status: OperationStatus::default(),
            latest_status: None,
            operation_uuid: Uuid::default(),
        });
        assert_eq!(validate(&call, None), Ok(()));
        let inconsistent = Err("Inconsistent resource provider ID in 'update_operation_status'");
        assert_eq!(validate(&call, Some(&id("rp"))), inconsistent);
        if let Some(update) = call.update_operation_status.as_mut() {
            update.status.resource_provider_id = Some(id("other"));
        }
        assert_eq!(validate(&call, Some(&id("rp"))), inconsistent);
        if let Some(update) = call.update_operation_status.as_mut() {
            update.status.resource_provider_id = Some(id("rp"));
        }
        assert_eq!(validate(&call, Some(&id("rp"))), Ok(()));
    }

    // Mesos ResourceProviderCallValidationTest.UpdateState.
    #[test]
    fn update_state() {
        let mut call = typed(call::Type::UpdateState);
        assert!(validate(&call, None).is_err());
        call.resource_provider_id = Some(id("rp"));
        assert_eq!(
            validate(&call, None),
            Err("Expecting 'update_state' to be present")
        );
        let resource = Resource {
            name: "disk".to_owned(),
            ..Resource::default()
        };
        call.update_state = Some(call::UpdateState {
            operations: Vec::new(),
            resources: vec![resource],
            resource_version_uuid: Uuid::default(),
        });
        assert_eq!(validate(&call, None), Ok(()));
        let inconsistent = Err("Inconsistent resource provider ID in 'update_state'");
        assert_eq!(validate(&call, Some(&id("rp"))), inconsistent);
        if let Some(update) = call.update_state.as_mut() {
            update.resources[0].provider_id = Some(id("rp"));
        }
        assert_eq!(validate(&call, Some(&id("rp"))), Ok(()));
    }

    #[test]
    fn unknown_enum_number_is_a_missing_type() {
        let call = Call {
            r#type: Some(99),
            ..Call::default()
        };
        assert_eq!(validate(&call, None), Err("Expecting 'type' to be present"));
    }
}
