//! Entry points for the fuzz targets (`crates/slrp-fuzz`), not an API: what the HTTP
//! handlers run on a request body once its media type is known, without the server.

use std::path::{Path, PathBuf};

use slrp_proto::mesos::v1::agent::{Call as AgentCall, call as agent_call};
use slrp_proto::mesos::v1::resource_provider::Call;
use slrp_wire::ContentType;

use crate::containers::checkpoint;
use crate::containers::validate::{display_id, validate_call};

/// A resource provider API body as `POST /api/v1/resource_provider` takes it: decoded
/// (spec §2.2 step 4) and validated (§2.6); the `Err` is the 400 answer's text.
///
/// # Errors
/// The 400 answer's text.
pub fn provider_call(content_type: ContentType, bytes: &[u8]) -> Result<Call, String> {
    let call = crate::server::decode_call(content_type, bytes)?;
    crate::validation::validate(&call, None)
        .map_err(|reason| format!("Failed to validate resource_provider::Call: {reason}"))?;
    Ok(call)
}

/// An operator API body as `POST /api/v1` takes it: decoded and validated; for a
/// `LAUNCH_CONTAINER`, also the sandbox directory and the record file the launch would
/// make under `containers_dir`.
///
/// # Errors
/// The 400 answer's text.
pub fn operator_call(
    content_type: ContentType,
    bytes: &[u8],
    containers_dir: &Path,
) -> Result<(AgentCall, Vec<PathBuf>), String> {
    let call = crate::operator::decode_call(content_type, bytes)?;
    let Some(kind) = call
        .r#type
        .and_then(|raw| agent_call::Type::try_from(raw).ok())
    else {
        return Err("Failed to validate agent::Call: Expecting 'type' to be present".to_owned());
    };
    validate_call(&call, kind)
        .map_err(|reason| format!("Failed to validate agent::Call: {reason}"))?;
    let mut paths = Vec::new();
    if let Some(launch) = call
        .launch_container
        .as_ref()
        .filter(|_| kind == agent_call::Type::LaunchContainer)
    {
        let id = display_id(&launch.container_id);
        paths.push(containers_dir.join(&id));
        paths.push(checkpoint::path(containers_dir, &id));
    }
    Ok((call, paths))
}
