//! What a reconciliation's findings change (spec §6.5): the plugin's volumes and
//! capacities merged into the total, keeping what PENDING operations hold.

use super::{Gathered, Machine, MachineError, ReconcileError};
use crate::provider::ledger;
use crate::provider::resources::DisplayResource;

impl Machine {
    /// Applies a reconciliation's findings: `Ok(Ok(changed))`, or `Ok(Err(_))` when they
    /// do not apply (everything stays as it was).
    pub(super) fn apply_reconciliation(
        &mut self,
        gathered: Gathered,
    ) -> Result<Result<bool, ReconcileError>, MachineError> {
        let Some(ctx) = &self.ctx else {
            // Jobs start only once subscribed, which sets the context; it is gone only after
            // an agent-id switch, before the new identity's SUBSCRIBED. Nothing to reconcile
            // then, but a profile job's translated set must not be lost: the watch has been
            // read already, so it would not come again until the profiles change.
            self.live_profiles = gathered.profiles;
            return Ok(Ok(false));
        };
        // Growth first: the volume and pool parts below then see the disks at the size
        // they are offered at from now on.
        let grown = ctx.grown_disks(&self.state.total, &gathered.expanded);
        let grown_total = if grown.is_noop() {
            None
        } else {
            match self.state.total.apply(&grown) {
                Ok(total) => Some(total),
                Err(error) => return Ok(Err(ReconcileError::Apply(error))),
            }
        };
        let total = grown_total.as_ref().unwrap_or(&self.state.total);
        let volumes = match ctx.existing_volumes(total, &gathered.listing) {
            Ok(volumes) => volumes,
            Err(error) => return Ok(Err(ReconcileError::Apply(error))),
        };
        let pools = ctx.reconcile_pools(
            total,
            &ctx.storage_pools(gathered.capacities.iter().map(|(p, b)| (p.as_str(), *b))),
            &ledger::in_flight(&self.tracked),
        );
        let reconciled = match ctx.reconcile(total, &volumes, &pools) {
            Ok(reconciled) => reconciled,
            Err(error) => return Ok(Err(ReconcileError::Apply(error))),
        };
        for duplicate in &volumes.duplicates {
            tracing::warn!(resource = %DisplayResource(duplicate), "Removing duplicated volume");
        }
        for id in self.listed_twice.fresh(&volumes.repeated_in_listing) {
            tracing::warn!(volume_id = %id, "Dropping duplicated volume");
        }
        for id in &volumes.drifted {
            tracing::warn!(volume_id = %id, "volume metadata changed; taking the plugin's");
        }
        for missing in volumes
            .merge
            .missing_converted
            .iter()
            .chain(&pools.missing_converted)
        {
            tracing::warn!(
                "Missing converted resource '{}'. This might cause further operations to fail.",
                DisplayResource(missing)
            );
        }
        let profiles_changed = self.live_profiles != gathered.profiles;
        self.live_profiles = gathered.profiles;
        let grew = grown_total.is_some();
        for resource in &grown.converted {
            tracing::info!(resource = %DisplayResource(resource), "disk grown");
        }
        if let Some(total) = reconciled.total.or(grown_total) {
            tracing::info!(
                removed = %reconciled.removed,
                added = %reconciled.added,
                "resources changed"
            );
            self.state.total = total;
        }
        let changed = reconciled.changed || grew;
        if changed || profiles_changed {
            // Only the records of what changed: the cost follows the change, not the
            // number of volumes.
            let touched =
                reconciled.removed + &reconciled.added + &grown.consumed + &grown.converted;
            self.stage_resources(&touched)?;
            self.publish_status();
        }
        Ok(Ok(changed))
    }
}
