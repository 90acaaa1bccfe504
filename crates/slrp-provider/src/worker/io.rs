//! The worker's I/O on behalf of the machine: recovering an identity from the store, the
//! plugin and adaptor calls of a reconciliation job, DESTROY's data removal, metrics.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::future::join_all;
use slrp_core::provider::apply::{OperationKind, PersistentVolume};
use slrp_core::provider::machine::{Gathered, ReconcileError};
use slrp_core::provider::operations::{Operations, stage_operation_removal};
use slrp_core::provider::resources::ProfileChange;
use slrp_core::provider::state::{ProviderState, StateError};
use slrp_core::volume::{MountPaths, VolumeError, VolumeManagerHandle};
use slrp_profiles::{ProfileAdaptorHandle, ProfileInfo, ProviderKey};
use slrp_proto::mesos::v1::OperationState;
use slrp_types::{DisplayChain, VolumeCapability};

use super::{ProviderDeps, ProviderError, ProviderParams};
use crate::metrics::ProviderMetrics;
use crate::persist::{load_operations, load_state};
use crate::persistent::remove_persistent_data;

/// The durable state of identity `agent_id` (spec §3.3 step 4, §8.4): the provider record
/// and its tracked operations; failing either is Mesos's "Failed to recover resource
/// provider".
pub(super) async fn recover_identity(
    deps: &ProviderDeps,
    params: &ProviderParams,
    agent_id: &str,
) -> Result<(ProviderState, Operations), ProviderError> {
    let recovered = async {
        let state = load_state(&deps.store, agent_id).await?;
        let tracked = recover_operations(deps, params, agent_id).await?;
        Ok((state, tracked))
    };
    recovered.await.map_err(|source| ProviderError::Recover {
        rp_type: params.info.r#type.clone(),
        rp_name: params.info.name.clone(),
        source: Box::new(source),
    })
}

/// The operations of identity `agent_id` (spec §3.4 steps 2–6 over the store): the ones
/// whose terminal status was acknowledged are forgotten (their records deleted), the
/// metrics are fed from every other one's latest state.
async fn recover_operations(
    deps: &ProviderDeps,
    params: &ProviderParams,
    agent_id: &str,
) -> Result<Operations, StateError> {
    let records = load_operations(&deps.store, agent_id).await?;
    let (tracked, terminated) = Operations::recover(records, params.status_retry);
    if !terminated.is_empty() {
        let mut txn = deps.store.transaction();
        for op in &terminated {
            stage_operation_removal(txn.changes(), agent_id, &op.uuid)?;
        }
        txn.commit().await.map_err(|source| StateError::Store {
            store: deps.store.path().to_owned(),
            source,
        })?;
    }
    // Once per identity and process (Mesos counts again at every subscription, §12 item 8).
    for op in tracked.iter() {
        count_state(
            &deps.metrics,
            OperationKind::of(&op.info),
            op.latest_status.state,
        );
    }
    tracing::info!(
        %agent_id,
        operations = tracked.len(),
        forgotten = terminated.len(),
        "recovered operations"
    );
    Ok(tracked)
}

/// Metrics counted for an operation that reached `state` (spec §9).
pub(super) fn count_state(metrics: &ProviderMetrics, kind: OperationKind, state: i32) {
    let operations = metrics.operations();
    match OperationState::try_from(state) {
        Ok(OperationState::OperationPending) => operations.pending(kind, 1),
        Ok(OperationState::OperationFinished) => operations.finished(kind),
        Ok(OperationState::OperationFailed) => operations.failed(kind),
        Ok(OperationState::OperationDropped) => operations.dropped(kind),
        _ => {}
    }
}

/// The profile update of §7.3: drop names no longer reported, translate new ones (in
/// parallel); a failed translation leaves the name out (the next change retries it).
pub(super) async fn update_profiles(
    adaptor: &ProfileAdaptorHandle,
    key: &ProviderKey,
    profiles: &mut BTreeMap<String, ProfileInfo>,
    reported: &BTreeSet<String>,
) {
    let change = ProfileChange::between(profiles.keys().map(String::as_str), reported);
    for name in &change.removed {
        profiles.remove(name);
    }
    let translated = join_all(
        change
            .to_translate
            .iter()
            .map(|name| async move { (name, adaptor.translate(name, key).await) }),
    )
    .await;
    for (name, result) in translated {
        match result {
            Ok(info) => {
                profiles.insert(name.clone(), info);
            }
            Err(error) => {
                tracing::warn!(profile = %name, error = %DisplayChain(&error), "cannot translate profile; leaving it out");
            }
        }
    }
}

/// A reconciliation's questions to the plugin: GetCapacity per profile and ListVolumes,
/// concurrently.
pub(super) async fn gather(
    volumes: &VolumeManagerHandle,
    page: i32,
    profiles: BTreeMap<String, ProfileInfo>,
) -> Result<Gathered, ReconcileError> {
    let (capacities, listing, expanded) = tokio::join!(
        capacities(volumes, &profiles),
        volumes.list_all(page),
        volumes.expanded()
    );
    let expanded = expanded
        .map_err(ReconcileError::List)?
        .into_iter()
        .map(|(id, bytes)| (id.as_str().to_owned(), u64::try_from(bytes).unwrap_or(0)))
        .collect();
    Ok(Gathered {
        capacities: capacities?,
        listing: listing.map_err(ReconcileError::List)?,
        expanded,
        profiles,
    })
}

/// GetCapacity for every profile, concurrently (§6.2).
///
/// Mesos fails the whole reconciliation on any failure, so one profile the plugin will
/// never accept (parameters it refuses, a capability slrp cannot express) keeps every
/// other pool from being reported and, after a subscription, the provider from READY —
/// for good. Here such a profile gets no pool (as a zero capacity, logged) and the others
/// are reported; a failure that may pass (plugin down, deadline) still fails the
/// reconciliation, which is retried, so a transient error never removes a pool.
async fn capacities(
    volumes: &VolumeManagerHandle,
    profiles: &BTreeMap<String, ProfileInfo>,
) -> Result<Vec<(String, u64)>, ReconcileError> {
    let asks = profiles.iter().map(|(name, def)| async move {
        let capability = match VolumeCapability::from_mesos(&def.capability) {
            Ok(capability) => capability,
            Err(source) => {
                let error = ReconcileError::Capability {
                    profile: name.clone(),
                    source,
                };
                tracing::warn!(error = %DisplayChain(&error), "no storage pool for this profile");
                return Ok(None);
            }
        };
        match volumes
            .capacity(capability, def.parameters.clone())
            .await
        {
            Ok(bytes) => Ok(Some((name.clone(), u64::try_from(bytes).unwrap_or(0)))),
            Err(source) => {
                let permanent = capacity_refusal_is_permanent(&source);
                let error = ReconcileError::Capacity {
                    profile: name.clone(),
                    source,
                };
                if permanent {
                    tracing::error!(error = %DisplayChain(&error), "the plugin refuses this profile; no storage pool for it");
                    Ok(None)
                } else {
                    Err(error)
                }
            }
        }
    });
    let answers: Result<Vec<_>, _> = join_all(asks).await.into_iter().collect();
    Ok(answers?.into_iter().flatten().collect())
}

/// Whether a GetCapacity failure is the plugin's verdict on this profile: the same
/// question always gets the same answer. Only INVALID_ARGUMENT (the plugin refuses the
/// capability or parameters) and OUT_OF_RANGE say that; UNKNOWN, INTERNAL,
/// FAILED_PRECONDITION, ABORTED and every failure without a code (a bad answer, a stopped
/// manager) may pass, so the reconciliation fails and is retried and the pool stays as it
/// was: one transient error must not remove a pool and rescind its offers.
pub(super) fn capacity_refusal_is_permanent(error: &VolumeError) -> bool {
    match error {
        VolumeError::Csi { source, .. } => matches!(
            source.code(),
            Some(slrp_csi::Code::InvalidArgument | slrp_csi::Code::OutOfRange)
        ),
        _ => false,
    }
}

/// DESTROY of persistent MOUNT volumes removes their data first (§5.3).
pub(super) async fn remove_persistent(
    paths: Option<MountPaths>,
    targets: Vec<PersistentVolume>,
) -> Result<(), String> {
    for target in targets {
        let Some(paths) = &paths else {
            return Err(format!(
                "Failed to remove persistent volume '{}': no mount root is configured",
                target.persistence_id
            ));
        };
        remove_persistent_data(paths, &target.volume_id, &target.persistence_id).await?;
    }
    Ok(())
}
