//! Tracked operations and the operation status update manager (spec §5.7, §5.11, §5.12,
//! §8.5), as a pure state machine, and their durable records.
//!
//! # Design
//! Mesos keeps the operations inside `resource_provider.state` and each operation's
//! reliable status stream in its own append-only `operation.updates` file, written at
//! different moments (the source of spec §12 item 20). Here one [`TrackedOperation`]
//! holds both: the Mesos `Operation` (info, latest status, statuses) and its stream (the
//! reliable updates queued in order, and how many of them, a prefix, are acknowledged).
//! It is stored as one [`OperationRecord`] (kind `operation`, key
//! `<agent id>/<operation uuid>`), so one store transaction writes an operation, its
//! stream and the resources it changes together.
//!
//! [`Operations`] is the status update manager over those streams: no I/O, time comes in
//! as `now`. The caller (the provider worker) persists the records of what changed and
//! drives one timer at [`Operations::next_retry`]. Only the head (first unacknowledged
//! update) of each stream is ever in flight; a head is resent with a doubling,
//! jittered interval until its acknowledgement arrives ([`StatusRetry`]).
//!
//! See `docs/operation-status.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use slrp_proto::mesos::v1::resource_provider::call;
use slrp_proto::mesos::v1::{
    AgentId, FrameworkId, Operation, OperationState, OperationStatus, ResourceProviderId, Uuid,
    offer,
};
use slrp_store::{Changes, Kind, Record};
use slrp_types::{Jitter, JitterRng};
use tokio::time::Instant;

use super::state::StateError;

/// Mesos `protobuf::isTerminalState(OperationState)` (its home is `slrp-types`, shared
/// with the embedded manager).
pub use slrp_types::is_terminal_state;

/// The status uuid of `status`, if it has a well-formed one.
pub fn status_uuid(status: &OperationStatus) -> Option<uuid::Uuid> {
    status
        .uuid
        .as_ref()
        .and_then(|u| uuid::Uuid::from_slice(&u.value).ok())
}

/// `uuid` as a Mesos `UUID` message (its 16 bytes).
pub fn proto_uuid(uuid: &uuid::Uuid) -> Uuid {
    Uuid {
        value: uuid.as_bytes().to_vec(),
    }
}

/// One tracked operation (Mesos `Operation`) and its reliable status stream (§8.5).
#[derive(Debug, Clone, PartialEq)]
pub struct TrackedOperation {
    /// The operation UUID.
    pub uuid: uuid::Uuid,
    /// The framework that asked for it, if any (operator operations have none).
    pub framework_id: Option<FrameworkId>,
    /// What was asked.
    pub info: offer::Operation,
    /// The newest status.
    pub latest_status: OperationStatus,
    /// Mesos `Operation.statuses`: the terminal status once completed; empty while PENDING
    /// and for an operation DROPPED at acceptance (§5.8).
    pub statuses: Vec<OperationStatus>,
    /// The reliable updates in the order queued (each has a status `uuid`) …
    pub stream: Vec<OperationStatus>,
    /// … and how many of them (a prefix) are acknowledged.
    pub acked: usize,
}

impl TrackedOperation {
    /// A just-accepted operation: latest_status {state PENDING, operation_id?, agent_id,
    /// resource_provider_id}, no status uuid, empty statuses and stream.
    pub fn pending(
        uuid: uuid::Uuid,
        framework_id: Option<FrameworkId>,
        info: offer::Operation,
        agent_id: &AgentId,
        provider_id: &ResourceProviderId,
    ) -> Self {
        let latest_status = OperationStatus {
            operation_id: info.id.clone(),
            state: OperationState::OperationPending as i32,
            message: None,
            converted_resources: Vec::new(),
            uuid: None,
            agent_id: Some(agent_id.clone()),
            resource_provider_id: Some(provider_id.clone()),
        };
        Self {
            uuid,
            framework_id,
            info,
            latest_status,
            statuses: Vec::new(),
            stream: Vec::new(),
            acked: 0,
        }
    }

    /// Whether `latest_status` is terminal (FINISHED, FAILED, ERROR, DROPPED,
    /// GONE_BY_OPERATOR).
    pub fn is_terminal(&self) -> bool {
        is_terminal_state(self.latest_status.state)
    }

    /// What UPDATE_STATE carries (Mesos `Operation`, with `uuid` bytes and `info`). The
    /// agent id is the one the provider stamped on the operation's statuses.
    pub fn to_mesos(&self) -> Operation {
        Operation {
            framework_id: self.framework_id.clone(),
            agent_id: self.latest_status.agent_id.clone(),
            info: self.info.clone(),
            latest_status: self.latest_status.clone(),
            statuses: self.statuses.clone(),
            uuid: proto_uuid(&self.uuid),
        }
    }

    /// The first unacknowledged update (the one in flight), if any.
    pub fn head(&self) -> Option<&OperationStatus> {
        self.stream.get(self.acked)
    }

    /// Whether the stream is closed: an acknowledged update is terminal (Mesos
    /// `terminated`). Such an operation is forgotten.
    pub fn stream_terminated(&self) -> bool {
        self.stream[..self.acked.min(self.stream.len())]
            .iter()
            .any(|s| is_terminal_state(s.state))
    }

    fn has_status(&self, uuid: &uuid::Uuid) -> bool {
        self.stream.iter().any(|s| status_uuid(s) == Some(*uuid))
    }

    /// The update that forwards the head: `latest_status` is the status of the last
    /// queued update (§8.5 "forward").
    fn forward(&self) -> Option<call::UpdateOperationStatus> {
        let head = self.head()?;
        Some(call::UpdateOperationStatus {
            framework_id: self.framework_id.clone(),
            status: head.clone(),
            latest_status: self.stream.last().cloned(),
            operation_uuid: proto_uuid(&self.uuid),
        })
    }

    /// The durable form, for agent `agent_id`.
    ///
    /// # Errors
    /// [`StateError::Encode`] if a message cannot be written as Mesos JSON (a build
    /// problem).
    pub fn to_record(&self, agent_id: &str) -> Result<OperationRecord, StateError> {
        let encode = StateError::encode;
        let operation =
            slrp_wire::json::to_value(&self.to_mesos()).map_err(encode("an operation"))?;
        let stream = self
            .stream
            .iter()
            .map(|s| slrp_wire::json::to_value(s).map_err(encode("an operation status update")))
            .collect::<Result<_, _>>()?;
        Ok(OperationRecord {
            agent_id: agent_id.to_owned(),
            uuid: self.uuid.to_string(),
            operation,
            stream,
            acked: self.acked,
        })
    }

    /// The operation a record holds. `store` names where it came from in errors.
    ///
    /// # Errors
    /// [`StateError::Decode`] for a message that is not valid Mesos JSON;
    /// [`StateError::InvalidOperation`] for a record that contradicts itself (key and
    /// operation uuid differ, more acknowledged than queued, an update without status
    /// uuid). Both name the record's key.
    pub fn from_record(record: OperationRecord, store: &Path) -> Result<Self, StateError> {
        let key = record.key();
        let invalid = |reason: String| StateError::InvalidOperation {
            key: key.clone(),
            store: store.to_owned(),
            reason,
        };
        let decode = |what| StateError::decode(store, what);
        let uuid = uuid::Uuid::parse_str(&record.uuid)
            .map_err(|e| invalid(format!("'{}' is not a UUID: {e}", record.uuid)))?;
        let operation: Operation = slrp_wire::json::from_value(record.operation)
            .map_err(decode(format!("operation record '{key}'")))?;
        if uuid::Uuid::from_slice(&operation.uuid.value).ok() != Some(uuid) {
            return Err(invalid("the operation's uuid differs from the key".into()));
        }
        let stream: Vec<OperationStatus> = record
            .stream
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                slrp_wire::json::from_value(value).map_err(decode(format!(
                    "status update {i} of operation record '{key}'"
                )))
            })
            .collect::<Result<_, _>>()?;
        if record.acked > stream.len() {
            return Err(invalid(format!(
                "{} updates acknowledged but {} queued",
                record.acked,
                stream.len()
            )));
        }
        if let Some(i) = stream.iter().position(|s| status_uuid(s).is_none()) {
            return Err(invalid(format!("status update {i} has no status uuid")));
        }
        Ok(Self {
            uuid,
            framework_id: operation.framework_id,
            info: operation.info,
            latest_status: operation.latest_status,
            statuses: operation.statuses,
            stream,
            acked: record.acked,
        })
    }
}

/// §8.5 retry policy of status updates: the first resend after `min`, each next one
/// after twice the previous interval, capped at `max`.
///
/// Each wait is drawn uniformly from `[interval / 2, interval]` with `jitter`'s
/// generator, so streams resumed together spread out again while no resend comes sooner
/// than half the interval (a full-jitter draw from `[0, interval]` would resend some
/// heads at once, before the manager had time to acknowledge). [`Jitter::None`] gives
/// Mesos's exact schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusRetry {
    /// First interval (Mesos `STATUS_UPDATE_RETRY_INTERVAL_MIN`, 10 s).
    pub min: Duration,
    /// Cap (Mesos `STATUS_UPDATE_RETRY_INTERVAL_MAX`, 10 min).
    pub max: Duration,
    /// How waits are drawn below the interval.
    pub jitter: Jitter,
}

impl StatusRetry {
    /// Mesos's `STATUS_UPDATE_RETRY_INTERVAL_MIN`.
    pub const MESOS_MIN: Duration = Duration::from_secs(10);
    /// Mesos's `STATUS_UPDATE_RETRY_INTERVAL_MAX`.
    pub const MESOS_MAX: Duration = Duration::from_secs(600);

    /// The interval after `interval`: doubled, capped at `max` (and never below `min`).
    pub fn next_interval(&self, interval: Duration) -> Duration {
        interval.saturating_mul(2).min(self.max).max(self.min)
    }
}

impl Default for StatusRetry {
    /// Mesos's bounds (10 s doubling to 10 min) with OS-seeded jitter.
    fn default() -> Self {
        Self {
            min: Self::MESOS_MIN,
            max: Self::MESOS_MAX,
            jitter: Jitter::Full,
        }
    }
}

/// When a stream's head is resent next, and the interval that wait was drawn from.
#[derive(Debug, Clone, Copy)]
struct Timer {
    at: Instant,
    interval: Duration,
}

#[derive(Debug)]
struct Entry {
    op: TrackedOperation,
    /// Armed while the head is in flight and the manager is not paused.
    timer: Option<Timer>,
}

/// The tracked operations and the status update manager over their streams. Pure: no
/// I/O, time comes in as `now`; the worker persists records and drives one timer at
/// [`Operations::next_retry`]. Starts paused (nothing is sent before READY).
#[derive(Debug)]
pub struct Operations {
    retry: StatusRetry,
    rng: JitterRng,
    paused: bool,
    ops: BTreeMap<uuid::Uuid, Entry>,
    /// Armed timers, ordered by deadline (so `due` and `next_retry` never scan every
    /// stream).
    timers: BTreeSet<(Instant, uuid::Uuid)>,
}

impl Operations {
    /// No operations, paused.
    pub fn new(retry: StatusRetry) -> Self {
        Self {
            retry,
            rng: JitterRng::new(retry.jitter),
            paused: true,
            ops: BTreeMap::new(),
            timers: BTreeSet::new(),
        }
    }

    /// From the records of one identity: returns the manager (paused) and the operations
    /// whose terminal status was already acknowledged (delete their records; spec §5.7).
    ///
    /// An operation with an empty stream (Mesos's state "none": the stream was never
    /// written) gets its statuses queued again, as Mesos re-submits them; an operation
    /// DROPPED at acceptance whose DROPPED status never reached its stream (spec §12
    /// item 20) gets that status queued, so it is delivered and can be forgotten.
    pub fn recover(
        ops: Vec<TrackedOperation>,
        retry: StatusRetry,
    ) -> (Self, Vec<TrackedOperation>) {
        let mut manager = Self::new(retry);
        let mut terminated = Vec::new();
        for mut op in ops {
            op.acked = op.acked.min(op.stream.len());
            if op.stream_terminated() {
                terminated.push(op);
                continue;
            }
            if op.stream.is_empty() {
                let mut queued: Vec<OperationStatus> = op
                    .statuses
                    .iter()
                    .filter(|s| status_uuid(s).is_some())
                    .cloned()
                    .collect();
                let latest = &op.latest_status;
                if is_terminal_state(latest.state)
                    && status_uuid(latest).is_some()
                    && !queued.iter().any(|s| s.uuid == latest.uuid)
                {
                    queued.push(latest.clone());
                }
                op.stream = queued;
            }
            manager.ops.insert(op.uuid, Entry { op, timer: None });
        }
        (manager, terminated)
    }

    /// The tracked operation `uuid`.
    pub fn get(&self, uuid: &uuid::Uuid) -> Option<&TrackedOperation> {
        self.ops.get(uuid).map(|e| &e.op)
    }

    /// Whether `uuid` is tracked.
    pub fn contains(&self, uuid: &uuid::Uuid) -> bool {
        self.ops.contains_key(uuid)
    }

    /// Every tracked operation, by uuid.
    pub fn iter(&self) -> impl Iterator<Item = &TrackedOperation> {
        self.ops.values().map(|e| &e.op)
    }

    /// Number of tracked operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no operation is tracked.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of operations with an unacknowledged update.
    pub fn unacknowledged(&self) -> usize {
        self.ops.values().filter(|e| e.op.head().is_some()).count()
    }

    /// Whether the manager is paused (disconnected, or not READY yet).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Tracks an accepted operation (PENDING).
    ///
    /// # Errors
    /// [`OperationsError::Duplicate`] if `op.uuid` is already tracked (nothing changes).
    pub fn insert_pending(&mut self, op: TrackedOperation) -> Result<(), OperationsError> {
        if self.ops.contains_key(&op.uuid) {
            return Err(OperationsError::Duplicate { operation: op.uuid });
        }
        self.ops.insert(op.uuid, Entry { op, timer: None });
        Ok(())
    }

    /// Tracks an operation DROPPED at acceptance (`op.latest_status` = the DROPPED status
    /// with a status uuid; statuses empty) and queues that status on its stream. Returns
    /// the update to send now (none while paused).
    ///
    /// # Errors
    /// [`OperationsError::Duplicate`] for a tracked uuid; [`OperationsError::NotDropped`]
    /// or [`OperationsError::MissingStatusUuid`] for a wrong latest status.
    pub fn insert_dropped(
        &mut self,
        mut op: TrackedOperation,
        now: Instant,
    ) -> Result<Option<call::UpdateOperationStatus>, OperationsError> {
        if self.ops.contains_key(&op.uuid) {
            return Err(OperationsError::Duplicate { operation: op.uuid });
        }
        if op.latest_status.state != OperationState::OperationDropped as i32 {
            return Err(OperationsError::NotDropped { operation: op.uuid });
        }
        if status_uuid(&op.latest_status).is_none() {
            return Err(OperationsError::MissingStatusUuid { operation: op.uuid });
        }
        let uuid = op.uuid;
        op.stream = vec![op.latest_status.clone()];
        op.acked = 0;
        self.ops.insert(uuid, Entry { op, timer: None });
        Ok(self.start_head(&uuid, now))
    }

    /// Completes a PENDING operation: `status` (terminal, with a status uuid) becomes
    /// latest_status, is appended to statuses and queued on the stream. Returns the
    /// update to send now (none while paused or while an earlier update is in flight).
    /// A status whose uuid the stream already holds is ignored (Mesos ignores duplicate
    /// updates): `Ok(None)`, nothing changes.
    ///
    /// # Errors
    /// [`OperationsError::Unknown`], [`OperationsError::MissingStatusUuid`],
    /// [`OperationsError::NotTerminal`] for a non-terminal `status`,
    /// [`OperationsError::AlreadyTerminal`] for an operation that is no longer PENDING.
    pub fn finish(
        &mut self,
        uuid: &uuid::Uuid,
        status: OperationStatus,
        now: Instant,
    ) -> Result<Option<call::UpdateOperationStatus>, OperationsError> {
        let Some(op) = self.new_status(uuid, &status)? else {
            return Ok(None);
        };
        if !is_terminal_state(status.state) {
            return Err(OperationsError::NotTerminal { operation: *uuid });
        }
        if op.is_terminal() {
            return Err(OperationsError::AlreadyTerminal { operation: *uuid });
        }
        Ok(self.queue(uuid, status, now))
    }

    /// Queues `status` (with a status uuid) on the stream of `uuid`: the general form of
    /// [`Self::finish`], which also takes non-terminal statuses. Unless the operation is
    /// terminal already, `status` becomes its latest status; a terminal one is appended
    /// to its statuses. An update queued after a terminal one waits behind it and is
    /// discarded with a warning when the terminal one is acknowledged (Mesos). A status
    /// uuid the stream already holds is ignored (`Ok(None)`).
    ///
    /// # Errors
    /// [`OperationsError::Unknown`], [`OperationsError::MissingStatusUuid`].
    pub fn update(
        &mut self,
        uuid: &uuid::Uuid,
        status: OperationStatus,
        now: Instant,
    ) -> Result<Option<call::UpdateOperationStatus>, OperationsError> {
        if self.new_status(uuid, &status)?.is_none() {
            tracing::warn!(operation = %uuid, "ignoring a duplicate operation status update");
            return Ok(None);
        }
        Ok(self.queue(uuid, status, now))
    }

    /// The operation `status` would be queued on, or `None` if its stream holds that
    /// status uuid already (a duplicate, ignored).
    fn new_status(
        &self,
        uuid: &uuid::Uuid,
        status: &OperationStatus,
    ) -> Result<Option<&TrackedOperation>, OperationsError> {
        let op = self
            .get(uuid)
            .ok_or(OperationsError::Unknown { operation: *uuid })?;
        let status_id =
            status_uuid(status).ok_or(OperationsError::MissingStatusUuid { operation: *uuid })?;
        Ok((!op.has_status(&status_id)).then_some(op))
    }

    /// Queues a checked `status`; forwards it if the stream had nothing in flight.
    fn queue(
        &mut self,
        uuid: &uuid::Uuid,
        status: OperationStatus,
        now: Instant,
    ) -> Option<call::UpdateOperationStatus> {
        let op = &mut self.ops.get_mut(uuid)?.op;
        if !op.is_terminal() {
            op.latest_status = status.clone();
            if is_terminal_state(status.state) {
                op.statuses.push(status.clone());
            }
        }
        op.stream.push(status);
        // Only a stream whose queue was empty starts sending; others wait for their head.
        if op.stream.len() - op.acked == 1 {
            self.start_head(uuid, now)
        } else {
            None
        }
    }

    /// §5.11 matching of an acknowledgement of status `status` of operation `op`. Errors
    /// carry Mesos's texts; the caller only logs them (an acknowledgement racing a resend
    /// is the normal source).
    ///
    /// # Errors
    /// [`AckError::UnknownStream`], [`AckError::Unexpected`] (nothing unacknowledged),
    /// [`AckError::Duplicate`] (already acknowledged, or not the head's status).
    pub fn acknowledge(
        &mut self,
        op: &uuid::Uuid,
        status: &uuid::Uuid,
        now: Instant,
    ) -> Result<Acked, AckError> {
        let entry = self
            .ops
            .get_mut(op)
            .ok_or(AckError::UnknownStream { operation: *op })?;
        let head = entry.op.head().ok_or(AckError::Unexpected {
            operation: *op,
            status: *status,
        })?;
        if status_uuid(head) != Some(*status) {
            return Err(AckError::Duplicate {
                operation: *op,
                status: *status,
            });
        }
        let terminal = is_terminal_state(head.state);
        entry.op.acked += 1;
        self.disarm(op);
        if terminal && let Some(Entry { op: mut done, .. }) = self.ops.remove(op) {
            if done.stream.len() > done.acked {
                tracing::warn!(operation = %done.uuid, discarded = done.stream.len() - done.acked,
                    "acknowledged a terminal operation status update but updates are still pending");
                done.stream.truncate(done.acked);
            }
            return Ok(Acked::Terminated(done));
        }
        Ok(Acked::Pending {
            send: self.start_head(op, now),
        })
    }

    /// Heads whose retry is due at `now`, each re-armed with the doubled interval (capped).
    /// Nothing while paused.
    pub fn due(&mut self, now: Instant) -> Vec<call::UpdateOperationStatus> {
        if self.paused {
            return Vec::new();
        }
        let mut sends = Vec::new();
        while let Some(&(at, uuid)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let Some(entry) = self.ops.get_mut(&uuid) else {
                continue;
            };
            let interval = entry.timer.map_or(self.retry.min, |t| t.interval);
            entry.timer = None;
            let Some(send) = entry.op.forward() else {
                continue;
            };
            tracing::warn!(operation = %uuid, "resending operation status update");
            sends.push(send);
            let next = self.retry.next_interval(interval);
            self.arm(&uuid, next, now);
        }
        sends
    }

    /// When [`Self::due`] has something next (`None`: nothing in flight, or paused).
    pub fn next_retry(&self) -> Option<Instant> {
        if self.paused {
            return None;
        }
        self.timers.first().map(|&(at, _)| at)
    }

    /// Stops forwarding and retries (disconnected, or not READY).
    pub fn pause(&mut self) {
        self.paused = true;
        self.timers.clear();
        for entry in self.ops.values_mut() {
            entry.timer = None;
        }
    }

    /// Unpauses and returns every unacknowledged head, each re-armed at `min`.
    pub fn resume(&mut self, now: Instant) -> Vec<call::UpdateOperationStatus> {
        self.paused = false;
        let heads: Vec<uuid::Uuid> = self
            .ops
            .iter()
            .filter(|(_, e)| e.op.head().is_some())
            .map(|(uuid, _)| *uuid)
            .collect();
        heads
            .iter()
            .filter_map(|uuid| self.start_head(uuid, now))
            .collect()
    }

    /// For UPDATE_STATE (every tracked operation, including unacknowledged terminal ones).
    pub fn to_mesos(&self) -> Vec<Operation> {
        self.iter().map(TrackedOperation::to_mesos).collect()
    }

    /// Forwards the head of `uuid` (if any and not paused) and arms its timer at `min`.
    fn start_head(
        &mut self,
        uuid: &uuid::Uuid,
        now: Instant,
    ) -> Option<call::UpdateOperationStatus> {
        if self.paused {
            return None;
        }
        let send = self.ops.get(uuid)?.op.forward()?;
        self.arm(uuid, self.retry.min, now);
        Some(send)
    }

    fn arm(&mut self, uuid: &uuid::Uuid, interval: Duration, now: Instant) {
        self.disarm(uuid);
        let half = interval / 2;
        let wait = half + self.rng.sample(interval - half);
        let at = now + wait;
        if let Some(entry) = self.ops.get_mut(uuid) {
            entry.timer = Some(Timer { at, interval });
            self.timers.insert((at, *uuid));
        }
    }

    fn disarm(&mut self, uuid: &uuid::Uuid) {
        if let Some(timer) = self.ops.get_mut(uuid).and_then(|e| e.timer.take()) {
            self.timers.remove(&(timer.at, *uuid));
        }
    }
}

/// What an acknowledgement did.
// Returned once per acknowledgement and taken apart at once: boxing the forgotten
// operation would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Acked {
    /// The stream goes on; `send` is the next head to forward now (if any and not
    /// paused). The operation changed: write its record.
    Pending {
        /// The next head, forwarded now.
        send: Option<call::UpdateOperationStatus>,
    },
    /// The terminal status was acknowledged: the operation is forgotten (removed from the
    /// map, returned here); delete its record.
    Terminated(TrackedOperation),
}

/// A refused acknowledgement, with Mesos's texts. Only logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// No stream for the operation (unknown, or already forgotten).
    #[error("Cannot find the operation status update stream {operation}")]
    UnknownStream {
        /// The operation uuid acknowledged.
        operation: uuid::Uuid,
    },
    /// The stream has no unacknowledged update (e.g. both a send and its resend were
    /// acknowledged).
    #[error(
        "Unexpected acknowledgment (UUID: {status}) for operation status update stream {operation}"
    )]
    Unexpected {
        /// The operation.
        operation: uuid::Uuid,
        /// The status uuid acknowledged.
        status: uuid::Uuid,
    },
    /// The status was acknowledged already, or is not the one in flight.
    #[error("Duplicate operation status update acknowledgement")]
    Duplicate {
        /// The operation.
        operation: uuid::Uuid,
        /// The status uuid acknowledged.
        status: uuid::Uuid,
    },
}

/// A change [`Operations`] refuses (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationsError {
    /// The uuid is already tracked.
    #[error("operation {operation} is already tracked")]
    Duplicate {
        /// The operation.
        operation: uuid::Uuid,
    },
    /// The uuid is not tracked.
    #[error("operation {operation} is not tracked")]
    Unknown {
        /// The operation.
        operation: uuid::Uuid,
    },
    /// A reliable status without a (16-byte) status uuid (Mesos: "Status update is
    /// missing 'uuid'").
    #[error("Status update is missing 'uuid' (operation {operation})")]
    MissingStatusUuid {
        /// The operation.
        operation: uuid::Uuid,
    },
    /// `insert_dropped` with a latest status that is not DROPPED.
    #[error("operation {operation} is not DROPPED")]
    NotDropped {
        /// The operation.
        operation: uuid::Uuid,
    },
    /// `finish` with a status that is not terminal.
    #[error("the status completing operation {operation} is not terminal")]
    NotTerminal {
        /// The operation.
        operation: uuid::Uuid,
    },
    /// `finish` of an operation that is terminal already.
    #[error("operation {operation} is terminal already")]
    AlreadyTerminal {
        /// The operation.
        operation: uuid::Uuid,
    },
}

/// Record kind of tracked operations.
pub const OPERATION_KIND: Kind = Kind::OPERATION;

/// Durable form of a [`TrackedOperation`] (kind `operation`, key `<agent id>/<uuid>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    /// The agent the provider identity belongs to.
    pub agent_id: String,
    /// The operation uuid, canonical lowercase text.
    pub uuid: String,
    /// `mesos.v1.Operation` in Mesos JSON (framework id, agent id, info, latest status,
    /// statuses, uuid).
    pub operation: serde_json::Value,
    /// The status stream: `mesos.v1.OperationStatus` in Mesos JSON, in the order queued.
    pub stream: Vec<serde_json::Value>,
    /// How many updates of `stream` (a prefix) are acknowledged.
    pub acked: usize,
}

impl Record for OperationRecord {
    const KIND: Kind = OPERATION_KIND;
    const SCHEMA_VERSION: u32 = 1;

    fn key(&self) -> String {
        operation_key(&self.agent_id, &self.uuid)
    }
}

fn operation_key(agent_id: &str, uuid: &impl std::fmt::Display) -> String {
    format!("{agent_id}/{uuid}")
}

/// The key prefix of agent `agent_id`'s operation records.
pub fn operations_prefix(agent_id: &str) -> String {
    format!("{agent_id}/")
}

/// The operations of `agent_id` from the operation records a driver read under
/// [`operations_prefix`] (a record that does not decode is an error naming its key;
/// recovery then fails as Mesos's strict recovery does). `store` names where they came
/// from in errors.
///
/// # Errors
/// The errors of [`TrackedOperation::from_record`].
pub fn operations_of(
    records: Vec<OperationRecord>,
    agent_id: &str,
    store: &Path,
) -> Result<Vec<TrackedOperation>, StateError> {
    records
        .into_iter()
        // An agent id with a '/' of its own would share the prefix.
        .filter(|r| r.agent_id == agent_id)
        .map(|r| TrackedOperation::from_record(r, store))
        .collect()
}

/// Adds the put of `op`'s record to `txn`.
///
/// # Errors
/// [`StateError::Encode`]; [`StateError::Stage`] for a key the store refuses.
pub fn stage_operation(
    txn: &mut Changes,
    agent_id: &str,
    op: &TrackedOperation,
) -> Result<(), StateError> {
    let record = op.to_record(agent_id)?;
    txn.put(&record).map_err(|source| StateError::Stage {
        key: record.key(),
        source,
    })?;
    Ok(())
}

/// Adds the delete of operation `uuid`'s record to `txn`.
///
/// # Errors
/// [`StateError::Stage`] for a key the store refuses.
pub fn stage_operation_removal(
    txn: &mut Changes,
    agent_id: &str,
    uuid: &uuid::Uuid,
) -> Result<(), StateError> {
    let key = operation_key(agent_id, uuid);
    txn.delete::<OperationRecord>(&key)
        .map_err(|source| StateError::Stage { key, source })?;
    Ok(())
}

#[cfg(test)]
mod tests;
