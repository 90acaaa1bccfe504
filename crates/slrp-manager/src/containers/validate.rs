//! Mesos's validation of the container calls (`src/slave/validation.cpp`,
//! `src/common/validation.cpp`, `Resources::validate`), with its texts. The caller
//! prefixes `Failed to validate agent::Call: `.

use slrp_proto::mesos::v1::agent::{Call, call};
use slrp_proto::mesos::v1::environment::variable::Type as VariableType;
use slrp_proto::mesos::v1::{ContainerId, Resource, secret, value};

/// `NAME_MAX` on Linux: Mesos's common ID rule.
const NAME_MAX: usize = 255;
/// `MAX_CONTAINER_ID_LENGTH` (`src/slave/constants.hpp`): AUFS's directory name limit.
pub(crate) const MAX_CONTAINER_ID_LENGTH: usize = 242;

/// The common ID rules (`common::validation::validateID`).
fn validate_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("ID must not be empty".to_owned());
    }
    if id.len() > NAME_MAX {
        return Err(format!("ID must not be greater than {NAME_MAX} characters"));
    }
    if id == "." || id == ".." {
        return Err(format!("'{id}' is disallowed"));
    }
    if id
        .bytes()
        .any(|b| b.is_ascii_control() || b == b'/' || b == b'\\')
    {
        return Err(format!("'{id}' contains invalid characters"));
    }
    Ok(())
}

/// `validateContainerId`: the common rules, at most 242 bytes, no `.` or space, and the
/// same for every `parent`.
pub(crate) fn validate_container_id(id: &ContainerId) -> Result<(), String> {
    validate_id(&id.value)?;
    if id.value.len() > MAX_CONTAINER_ID_LENGTH {
        return Err(format!(
            "'ContainerID.value' '{}' exceeds the maximum length ({MAX_CONTAINER_ID_LENGTH})",
            id.value
        ));
    }
    if id.value.contains(['.', ' ']) {
        return Err(format!(
            "'ContainerID.value' '{}' contains invalid characters",
            id.value
        ));
    }
    if let Some(parent) = &id.parent {
        validate_container_id(parent)
            .map_err(|error| format!("'ContainerID.parent' is invalid: {error}"))?;
    }
    Ok(())
}

/// Mesos's `stringify(ContainerID)`: `parent.child`.
pub(crate) fn display_id(id: &ContainerId) -> String {
    match &id.parent {
        Some(parent) => format!("{}.{}", display_id(parent), id.value),
        None => id.value.clone(),
    }
}

/// The checks of one container call of `validation::agent::call::validate` (the call
/// types served here); `Ok` for every other type.
pub(crate) fn validate_call(call: &Call, kind: call::Type) -> Result<(), String> {
    let id = |field: &str, id: &ContainerId| {
        validate_container_id(id)
            .map_err(|error| format!("'{field}.container_id' is invalid: {error}"))
    };
    match kind {
        call::Type::LaunchContainer => {
            let launch = call
                .launch_container
                .as_ref()
                .ok_or("Expecting 'launch_container' to be present")?;
            id("launch_container", &launch.container_id)?;
            validate_launch(launch)
        }
        call::Type::WaitContainer => id(
            "wait_container",
            &call
                .wait_container
                .as_ref()
                .ok_or("Expecting 'wait_container' to be present")?
                .container_id,
        ),
        call::Type::KillContainer => id(
            "kill_container",
            &call
                .kill_container
                .as_ref()
                .ok_or("Expecting 'kill_container' to be present")?
                .container_id,
        ),
        call::Type::RemoveContainer => id(
            "remove_container",
            &call
                .remove_container
                .as_ref()
                .ok_or("Expecting 'remove_container' to be present")?
                .container_id,
        ),
        _ => Ok(()),
    }
}

fn validate_launch(launch: &call::LaunchContainer) -> Result<(), String> {
    for resource in &launch.resources {
        validate_resource(resource).map_err(|error| {
            format!(
                "Invalid resources: Resource '{}' is invalid: {error}",
                describe(resource)
            )
        })?;
    }
    if launch.container_id.parent.is_none() {
        for resource in &launch.resources {
            if is_reserved(resource) {
                return Err("'launch_container.resources' must be unreserved".to_owned());
            }
            if resource
                .disk
                .as_ref()
                .is_some_and(|disk| disk.persistence.is_some())
            {
                return Err(
                    "'launch_container.resources' may not use persistent volumes".to_owned(),
                );
            }
            if resource.revocable.is_some() {
                return Err("'launch_container.resources' must be non-revocable".to_owned());
            }
        }
    }
    if let Some(command) = &launch.command {
        validate_environment(command.environment.iter().flat_map(|e| &e.variables))
            .map_err(|error| format!("'launch_container.command' is invalid: {error}"))?;
    }
    Ok(())
}

/// Reserved in either format: refined `reservations`, or the pre-refinement `role` /
/// `reservation` (Mesos upgrades those before it asks).
fn is_reserved(resource: &Resource) -> bool {
    !resource.reservations.is_empty()
        || resource.reservation.is_some()
        || resource.role.as_deref().is_some_and(|role| role != "*")
}

/// The value checks of `Resources::validate(const Resource&)`.
fn validate_resource(resource: &Resource) -> Result<(), &'static str> {
    if resource.name.is_empty() {
        return Err("Empty resource name");
    }
    let (scalar, ranges, set) = (
        resource.scalar.is_some(),
        resource.ranges.is_some(),
        resource.set.is_some(),
    );
    match value::Type::try_from(resource.r#type) {
        Ok(value::Type::Scalar) => {
            if !scalar || ranges || set {
                return Err("Invalid scalar resource");
            }
            if resource.scalar.as_ref().is_some_and(|s| s.value < 0.0) {
                return Err("Invalid scalar resource: value < 0");
            }
        }
        Ok(value::Type::Ranges) => {
            if scalar || !ranges || set {
                return Err("Invalid ranges resource");
            }
        }
        Ok(value::Type::Set) => {
            if scalar || ranges || !set {
                return Err("Invalid set resource");
            }
        }
        Ok(_) => return Err("Unsupported resource type"),
        Err(_) => return Err("Invalid resource type"),
    }
    if resource.disk.is_some() && resource.name != "disk" {
        return Err("DiskInfo should not be set for this resource");
    }
    Ok(())
}

/// A short form for messages, `name:amount` (Mesos prints more of the resource).
fn describe(resource: &Resource) -> String {
    match &resource.scalar {
        Some(scalar) => format!("{}:{}", resource.name, scalar.value),
        None => resource.name.clone(),
    }
}

/// `validateEnvironment`.
fn validate_environment<'a>(
    variables: impl Iterator<Item = &'a slrp_proto::mesos::v1::environment::Variable>,
) -> Result<(), String> {
    for variable in variables {
        let name = &variable.name;
        match variable.r#type() {
            VariableType::Secret => {
                let Some(secret) = &variable.secret else {
                    return Err(format!(
                        "Environment variable '{name}' of type 'SECRET' must have a secret set"
                    ));
                };
                if variable.value.is_some() {
                    return Err(format!(
                        "Environment variable '{name}' of type 'SECRET' must not have a value set"
                    ));
                }
                let invalid = match secret.r#type() {
                    secret::Type::Reference if secret.reference.is_none() => {
                        Some("Secret of type REFERENCE must have the 'reference' field set")
                    }
                    secret::Type::Reference if secret.value.is_some() => {
                        Some("Secret of type REFERENCE must not have the 'value' field set")
                    }
                    secret::Type::Value if secret.value.is_none() => {
                        Some("Secret of type VALUE must have the 'value' field set")
                    }
                    secret::Type::Value if secret.reference.is_some() => {
                        Some("Secret of type VALUE must not have the 'reference' field set")
                    }
                    _ => None,
                };
                if let Some(invalid) = invalid {
                    return Err(format!(
                        "Environment variable '{name}' specifies an invalid secret: {invalid}"
                    ));
                }
            }
            VariableType::Value => {
                if variable.value.is_none() {
                    return Err(format!(
                        "Environment variable '{name}' of type 'VALUE' must have a value set"
                    ));
                }
                if variable.secret.is_some() {
                    return Err(format!(
                        "Environment variable '{name}' of type 'VALUE' must not have a secret set"
                    ));
                }
            }
            VariableType::Unknown => {
                return Err("Environment variable of type 'UNKNOWN' is not allowed".to_owned());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cid(value: &str) -> ContainerId {
        ContainerId {
            value: value.to_owned(),
            parent: None,
        }
    }

    #[test]
    fn container_ids_follow_mesos_rules() {
        let long = "a".repeat(MAX_CONTAINER_ID_LENGTH);
        assert_eq!(validate_container_id(&cid(&long)), Ok(()));
        let too_long = "a".repeat(MAX_CONTAINER_ID_LENGTH + 1);
        assert_eq!(
            validate_container_id(&cid(&too_long)),
            Err(format!(
                "'ContainerID.value' '{too_long}' exceeds the maximum length (242)"
            ))
        );
        assert_eq!(
            validate_container_id(&cid(&"b".repeat(256))),
            Err("ID must not be greater than 255 characters".to_owned())
        );
        for (id, error) in [
            ("", "ID must not be empty".to_owned()),
            ("..", "'..' is disallowed".to_owned()),
            ("a/b", "'a/b' contains invalid characters".to_owned()),
            ("a\\b", "'a\\b' contains invalid characters".to_owned()),
            ("a\nb", "'a\nb' contains invalid characters".to_owned()),
            (
                "a.b",
                "'ContainerID.value' 'a.b' contains invalid characters".to_owned(),
            ),
            (
                "a b",
                "'ContainerID.value' 'a b' contains invalid characters".to_owned(),
            ),
        ] {
            assert_eq!(validate_container_id(&cid(id)), Err(error), "{id:?}");
        }
        let nested = ContainerId {
            value: "child".to_owned(),
            parent: Some(Box::new(cid("a b"))),
        };
        assert_eq!(
            validate_container_id(&nested),
            Err(
                "'ContainerID.parent' is invalid: 'ContainerID.value' 'a b' contains invalid characters"
                    .to_owned()
            )
        );
        assert_eq!(display_id(&nested), "a b.child");
    }
}
