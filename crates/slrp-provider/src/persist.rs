//! The provider's reads and writes of its whole durable state: the I/O edge beside the
//! machine, which only stages changes and decodes what is read here
//! ([`ProviderState::from_loaded`], [`operations_of`]).

use std::sync::Arc;

use slrp_core::provider::operations::{
    OperationRecord, TrackedOperation, operations_of, operations_prefix,
};
use slrp_core::provider::state::{
    ProviderRecord, ProviderResourceRecord, ProviderState, StateError, resource_prefix,
};
use slrp_proto::mesos::v1::Resource;
use slrp_store::Store;

fn store_error(store: &Store) -> impl Fn(slrp_store::StoreError) -> StateError + '_ {
    |source| StateError::Store {
        store: store.path().to_owned(),
        source,
    }
}

/// Loads the state of agent `agent_id` from `store`: the empty state (a brand-new
/// identity, subscribe without id) when there is no record under that agent id. A
/// version-1 provider record (the total inside) is rewritten in the current layout in one
/// transaction (unless the store is read-only).
///
/// # Errors
/// [`StateError::Store`] if the store cannot be read (or the rewrite fails); the errors
/// of [`ProviderState::from_stored`].
pub async fn load_state(store: &Store, agent_id: &str) -> Result<ProviderState, StateError> {
    let record: Option<ProviderRecord> = store.get(agent_id).await.map_err(store_error(store))?;
    // A version-1 record has its total inside: no resource records to read.
    let entries = match &record {
        Some(r) if r.resources.is_empty() => {
            load_resources(store, agent_id, r.provider_id.clone()).await?
        }
        Some(_) | None => Vec::new(),
    };
    let (state, rewrite) = ProviderState::from_loaded(record, entries, store.path())?;
    if rewrite && !store.is_read_only() {
        save_state(&state, store, agent_id).await?;
    }
    Ok(state)
}

/// The entries of agent `agent_id`'s resource records, each record decoded as it is read
/// ([`ProviderState::add_record`]): a large total's stored form is never all in memory.
async fn load_resources(
    store: &Store,
    agent_id: &str,
    provider_id: Option<String>,
) -> Result<Vec<Arc<Resource>>, StateError> {
    let (agent, path) = (agent_id.to_owned(), store.path().to_owned());
    store
        .fold_prefix(
            &resource_prefix(agent_id),
            Vec::new(),
            move |entries, stored: ProviderResourceRecord| {
                ProviderState::add_record(entries, stored, &agent, provider_id.as_deref(), &path)
            },
        )
        .await
        .map_err(store_error(store))?
}

/// Replaces every record of agent `agent_id` in one durable transaction
/// ([`ProviderState::stage`] without `touched`).
///
/// # Errors
/// [`StateError::Encode`], or [`StateError::Store`] if the commit failed (the store is
/// then poisoned: fatal, conventions §4.4 rule 5).
pub async fn save_state(
    state: &ProviderState,
    store: &Store,
    agent_id: &str,
) -> Result<(), StateError> {
    let mut txn = store.transaction();
    state.stage(txn.changes(), agent_id, None)?;
    txn.commit().await.map_err(store_error(store))
}

/// Every operation record of `agent_id`.
///
/// # Errors
/// [`StateError::Store`] if the store cannot be read (a record failing its checksum
/// included); the errors of [`operations_of`].
pub async fn load_operations(
    store: &Store,
    agent_id: &str,
) -> Result<Vec<TrackedOperation>, StateError> {
    let records = store
        .load_prefix::<OperationRecord>(&operations_prefix(agent_id))
        .await
        .map_err(store_error(store))?;
    operations_of(records, agent_id, store.path())
}
