//! Mesos operations on provider resources, built as a framework (or the operator API) would
//! build them from the resources it was offered, in Mesos's JSON form.
//!
//! Resources stay JSON here (as [`super::Update`] holds them); [`operation`] turns a JSON
//! operation into the `offer::Operation` the manager sends. Every builder mirrors a helper
//! of Mesos's tests (`RESERVE`, `CREATE_DISK`, `createPersistentVolume`, …).

use serde_json::{Value, json};
use slrp_proto::mesos::v1::{OperationStatus, Resource, offer};

/// The role frameworks use in Mesos's SLRP tests: a child of the default reservation's
/// role, so RESERVE refines the provider's reservation.
pub const FRAMEWORK_ROLE: &str = "storage/role";
/// The principal of the tests' framework reservations and persistent volumes.
pub const PRINCIPAL: &str = "test-principal";

/// A JSON operation as the proto the manager sends.
pub fn operation(v: Value) -> offer::Operation {
    slrp_wire::json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("not an Offer.Operation: {e}: {v}"))
}

/// A JSON resource as a proto.
pub fn resource(v: &Value) -> Resource {
    slrp_wire::json::from_value(v.clone()).unwrap_or_else(|e| panic!("not a Resource: {e}: {v}"))
}

/// A proto resource as JSON.
pub fn json_of(r: &Resource) -> Value {
    slrp_wire::json::to_value(r).unwrap()
}

/// A status as JSON (`state`, `message`, `converted_resources`, `uuid`, …).
pub fn status_json(s: &OperationStatus) -> Value {
    slrp_wire::json::to_value(s).unwrap()
}

/// The resources of a status, as JSON.
pub fn converted(s: &OperationStatus) -> Vec<Value> {
    s.converted_resources.iter().map(json_of).collect()
}

/// `r` as offered to a framework of `role` (Mesos sets `allocation_info` on every offered
/// resource; operations carry it back and the provider must strip it).
pub fn allocated(r: &Value, role: &str) -> Value {
    let mut r = r.clone();
    r["allocation_info"] = json!({"role": role});
    r
}

/// `r` without `allocation_info` (as the agent's and the provider's totals hold it).
pub fn unallocated(r: &Value) -> Value {
    let mut r = r.clone();
    if let Some(o) = r.as_object_mut() {
        o.remove("allocation_info");
    }
    r
}

/// `r` with one more reservation (a refinement to `role` by [`PRINCIPAL`]).
pub fn refined(r: &Value, role: &str) -> Value {
    let mut r = r.clone();
    let mut stack = r["reservations"].as_array().cloned().unwrap_or_default();
    stack.push(json!({"type": "DYNAMIC", "role": role, "principal": PRINCIPAL}));
    r["reservations"] = Value::Array(stack);
    r
}

/// `r` with its last reservation popped (what UNRESERVE converts it to).
pub fn popped(r: &Value) -> Value {
    let mut r = r.clone();
    let mut stack = r["reservations"].as_array().cloned().unwrap_or_default();
    stack.pop();
    r["reservations"] = Value::Array(stack);
    r
}

/// RESERVE of `source` refined to `role`; returns the operation and the reserved
/// resource (what the total holds afterwards).
pub fn reserve(source: &Value, role: &str) -> (offer::Operation, Value) {
    let reserved = refined(&unallocated(source), role);
    let op = operation(json!({
        "type": "RESERVE",
        "reserve": {
            "source": [source],
            "resources": [allocated(&reserved, role)],
        }
    }));
    (op, reserved)
}

/// UNRESERVE of `r`'s last reservation.
pub fn unreserve(r: &Value) -> offer::Operation {
    operation(json!({"type": "UNRESERVE", "unreserve": {"resources": [r]}}))
}

/// CREATE_DISK of `source` into a `target` (`"MOUNT"` or `"BLOCK"`) disk; `target_profile`
/// for a pre-existing volume (a source with an id and no profile).
pub fn create_disk(source: &Value, target: &str, target_profile: Option<&str>) -> offer::Operation {
    let mut create = json!({"source": source, "target_type": target});
    if let Some(p) = target_profile {
        create["target_profile"] = p.into();
    }
    operation(json!({"type": "CREATE_DISK", "create_disk": create}))
}

/// DESTROY_DISK of `source`.
pub fn destroy_disk(source: &Value) -> offer::Operation {
    operation(json!({"type": "DESTROY_DISK", "destroy_disk": {"source": source}}))
}

/// Mesos's `createPersistentVolume(disk, id, "path1", principal)`: `disk` with
/// `disk.persistence` and a read-write `disk.volume`.
pub fn persistent(disk: &Value, persistence_id: &str) -> Value {
    let mut v = disk.clone();
    v["disk"]["persistence"] = json!({"id": persistence_id, "principal": PRINCIPAL});
    v["disk"]["volume"] = json!({"container_path": "path1", "mode": "RW"});
    v
}

/// `v` without its persistence (what DESTROY converts a persistent volume to).
pub fn unpersisted(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(d) = v["disk"].as_object_mut() {
        d.remove("persistence");
        d.remove("volume");
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("shared");
    }
    v
}

/// CREATE of persistent volumes.
pub fn create(volumes: &[Value]) -> offer::Operation {
    operation(json!({"type": "CREATE", "create": {"volumes": volumes}}))
}

/// DESTROY of persistent volumes.
pub fn destroy(volumes: &[Value]) -> offer::Operation {
    operation(json!({"type": "DESTROY", "destroy": {"volumes": volumes}}))
}

/// `op` with an operation id (a v1 framework's operation, which gets status updates).
pub fn with_id(mut op: offer::Operation, id: &str) -> offer::Operation {
    op.id = Some(slrp_proto::mesos::v1::OperationId { value: id.into() });
    op
}

/// The state name of a status (`"OPERATION_FINISHED"`, …).
pub fn state_name(s: &OperationStatus) -> String {
    status_json(s)["state"].as_str().unwrap_or("?").to_owned()
}

/// `r` with a scalar of `mb` (a part of a storage pool, as a framework takes it).
pub fn portion(r: &Value, mb: f64) -> Value {
    let mut r = r.clone();
    r["scalar"]["value"] = mb.into();
    r
}

/// A profile document whose profiles each give an access type (`"mount"` or `"block"`)
/// and CreateVolume parameters, for the test plugin type, SINGLE_NODE_WRITER.
pub fn profile_doc(entries: &[(&str, &str, Value)]) -> Value {
    let matrix: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(name, access, parameters)| {
            (
                (*name).to_owned(),
                json!({
                    "csi_plugin_type_selector": {"plugin_type": super::PLUGIN_TYPE},
                    "volume_capabilities": {
                        *access: {},
                        "access_mode": {"mode": "SINGLE_NODE_WRITER"}
                    },
                    "create_parameters": parameters,
                }),
            )
        })
        .collect();
    json!({ "profile_matrix": matrix })
}
