//! The provider lifecycle (spec §3.1, §3.2) and what to do with each event from the
//! manager in each state (§3.5, with the rules of §3.6), as pure functions.
//!
//! Mesos asserts on events that arrive in the wrong state (ACKNOWLEDGE_OPERATION_STATUS
//! and RECONCILE_OPERATIONS while SUBSCRIBED abort the agent, spec §12 item 10). Here every
//! event has a [`Disposition`]: handled in READY, queued until READY, dropped or answered
//! FAILED before READY, or ignored. The queue of events waiting for READY is bounded
//! ([`PendingEvents`]).

use std::collections::VecDeque;
use std::fmt;

use slrp_proto::mesos::v1::resource_provider::{Event, event};

/// The provider's lifecycle states, in Mesos's enum order (`RECOVERING` = 0 … `READY` = 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lifecycle {
    /// Recovering the durable state; not connected yet.
    Recovering,
    /// Recovered; no session with the manager (or the session ended).
    Disconnected,
    /// Connected; SUBSCRIBE sent, no SUBSCRIBED yet.
    Connected,
    /// Subscribed; the subscription reconciliation (§3.4) runs.
    Subscribed,
    /// The manager's view is current; operations are served.
    Ready,
}

impl Lifecycle {
    /// The Mesos name (`RECOVERING`, `DISCONNECTED`, `CONNECTED`, `SUBSCRIBED`, `READY`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovering => "RECOVERING",
            Self::Disconnected => "DISCONNECTED",
            Self::Connected => "CONNECTED",
            Self::Subscribed => "SUBSCRIBED",
            Self::Ready => "READY",
        }
    }

    /// Whether the provider holds a live subscription (calls can be sent).
    pub fn is_subscribed(self) -> bool {
        match self {
            Self::Subscribed | Self::Ready => true,
            Self::Recovering | Self::Disconnected | Self::Connected => false,
        }
    }
}

impl fmt::Display for Lifecycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The type of an event from the manager, with unrecognised numbers as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `SUBSCRIBED` (the agent client consumes it; one on a subscribed stream is odd).
    Subscribed,
    /// `APPLY_OPERATION`.
    ApplyOperation,
    /// `PUBLISH_RESOURCES`.
    PublishResources,
    /// `ACKNOWLEDGE_OPERATION_STATUS`.
    AcknowledgeOperationStatus,
    /// `RECONCILE_OPERATIONS`.
    ReconcileOperations,
    /// `TEARDOWN`.
    Teardown,
    /// `UNKNOWN`, an absent type, or a type this build does not know.
    Unknown,
}

impl EventKind {
    /// The kind of `event` (proto2: an unknown enum number counts as absent).
    pub fn of(event: &Event) -> Self {
        match event.r#type.and_then(|t| event::Type::try_from(t).ok()) {
            Some(event::Type::Subscribed) => Self::Subscribed,
            Some(event::Type::ApplyOperation) => Self::ApplyOperation,
            Some(event::Type::PublishResources) => Self::PublishResources,
            Some(event::Type::AcknowledgeOperationStatus) => Self::AcknowledgeOperationStatus,
            Some(event::Type::ReconcileOperations) => Self::ReconcileOperations,
            Some(event::Type::Teardown) => Self::Teardown,
            Some(event::Type::Unknown) | None => Self::Unknown,
        }
    }

    /// The Mesos name of the event type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subscribed => "SUBSCRIBED",
            Self::ApplyOperation => "APPLY_OPERATION",
            Self::PublishResources => "PUBLISH_RESOURCES",
            Self::AcknowledgeOperationStatus => "ACKNOWLEDGE_OPERATION_STATUS",
            Self::ReconcileOperations => "RECONCILE_OPERATIONS",
            Self::Teardown => "TEARDOWN",
            Self::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the provider does with one event in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// READY: the event goes to the operation handling (spec §5).
    Handle,
    /// Kept in [`PendingEvents`] and handled once READY (Mesos asserts instead).
    Queue,
    /// The operation is dropped with `message` (Mesos: "Cannot apply operation in
    /// SUBSCRIBED state"): the operation is tracked with OPERATION_DROPPED, sent reliably).
    Drop {
        /// Mesos's reason text.
        message: String,
    },
    /// Answered with `UPDATE_PUBLISH_RESOURCES_STATUS` FAILED; `message` is logged (Mesos
    /// sends no reason, spec §12 item 18).
    AnswerFailed {
        /// Mesos's logged reason.
        message: String,
    },
    /// Ignored without a word (TEARDOWN: Mesos ignores it, spec §12 item 17).
    Ignore,
    /// Ignored with a warning naming `reason`.
    Warn {
        /// Why the event is ignored.
        reason: String,
    },
}

/// The disposition of an event of `kind` arriving in `state` (spec §3.5 with §3.6).
///
/// Events only arrive on a subscribed stream, so the states before SUBSCRIBED are
/// reachable only through an event already in flight when a session ended; they are
/// treated like SUBSCRIBED (queue, drop, answer FAILED) with the state's name in the
/// message, where Mesos asserts.
///
/// `reconciled`: in SUBSCRIBED, the subscription reconciliation of this session is done
/// and its UPDATE_STATE on the way. Mesos is READY from there on, and the manager, which
/// has the UPDATE_STATE, may send operations before its answer reaches the provider:
/// they wait for READY (queued) instead of being dropped as if the provider were still
/// reconciling. It changes nothing in the other states.
pub fn disposition(state: Lifecycle, reconciled: bool, kind: EventKind) -> Disposition {
    match (state, kind) {
        (Lifecycle::Subscribed, EventKind::ApplyOperation | EventKind::PublishResources)
            if reconciled =>
        {
            Disposition::Queue
        }
        (_, EventKind::Teardown) => Disposition::Ignore,
        (_, EventKind::Unknown) => Disposition::Warn {
            reason: "unknown event type".to_owned(),
        },
        (_, EventKind::Subscribed) => Disposition::Warn {
            reason: "SUBSCRIBED on an already subscribed stream".to_owned(),
        },
        (
            Lifecycle::Ready,
            EventKind::ApplyOperation
            | EventKind::PublishResources
            | EventKind::AcknowledgeOperationStatus
            | EventKind::ReconcileOperations,
        ) => Disposition::Handle,
        (
            Lifecycle::Recovering
            | Lifecycle::Disconnected
            | Lifecycle::Connected
            | Lifecycle::Subscribed,
            EventKind::AcknowledgeOperationStatus | EventKind::ReconcileOperations,
        ) => Disposition::Queue,
        (
            Lifecycle::Recovering
            | Lifecycle::Disconnected
            | Lifecycle::Connected
            | Lifecycle::Subscribed,
            EventKind::ApplyOperation,
        ) => Disposition::Drop {
            message: format!("Cannot apply operation in {state} state"),
        },
        (
            Lifecycle::Recovering
            | Lifecycle::Disconnected
            | Lifecycle::Connected
            | Lifecycle::Subscribed,
            EventKind::PublishResources,
        ) => Disposition::AnswerFailed {
            message: format!("Cannot publish resources in {state} state"),
        },
    }
}

/// Default bound of [`PendingEvents`].
pub const DEFAULT_PENDING_EVENTS: usize = 1024;

/// The events queued until READY, in arrival order, at most `capacity`.
///
/// On overflow an operation is never evicted: the oldest ACKNOWLEDGE_OPERATION_STATUS
/// goes first (the status update manager resends the status, so the acknowledgement
/// comes again), then the oldest RECONCILE_OPERATIONS (the agent asks again); when the
/// queue holds only APPLY_OPERATION and PUBLISH_RESOURCES, the arriving event is the one
/// not kept. The caller answers what [`PendingEvents::push`] hands back (an operation
/// DROPPED reliably, a publish FAILED), so nothing is lost silently.
#[derive(Debug, Clone)]
pub struct PendingEvents {
    events: VecDeque<Event>,
    capacity: usize,
}

impl PendingEvents {
    /// An empty queue of at most `capacity` events (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            events: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Queues `event`; returns the event that is not kept (one evicted to make room, or
    /// `event` itself), if any.
    pub fn push(&mut self, event: Event) -> Option<Event> {
        if self.events.len() < self.capacity {
            self.events.push_back(event);
            return None;
        }
        let position = |kind| self.events.iter().position(|e| EventKind::of(e) == kind);
        let victim = position(EventKind::AcknowledgeOperationStatus)
            .or_else(|| position(EventKind::ReconcileOperations));
        match victim {
            Some(victim) => {
                let evicted = self.events.remove(victim);
                self.events.push_back(event);
                evicted
            }
            None => Some(event),
        }
    }

    /// Takes every queued event, oldest first.
    pub fn drain(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// How many events are queued.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATES: [Lifecycle; 5] = [
        Lifecycle::Recovering,
        Lifecycle::Disconnected,
        Lifecycle::Connected,
        Lifecycle::Subscribed,
        Lifecycle::Ready,
    ];

    fn event(kind: event::Type) -> Event {
        Event {
            r#type: Some(kind as i32),
            ..Event::default()
        }
    }

    #[test]
    fn states_are_in_mesos_enum_order() {
        assert!(STATES.windows(2).all(|w| w[0] < w[1]));
        let names: Vec<_> = STATES.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "RECOVERING",
                "DISCONNECTED",
                "CONNECTED",
                "SUBSCRIBED",
                "READY"
            ]
        );
        let subscribed: Vec<_> = STATES.iter().map(|s| s.is_subscribed()).collect();
        assert_eq!(subscribed, [false, false, false, true, true]);
    }

    #[test]
    fn event_table() {
        use Disposition as D;
        use EventKind as K;
        let drop = |s: &str| D::Drop {
            message: format!("Cannot apply operation in {s} state"),
        };
        let failed = |s: &str| D::AnswerFailed {
            message: format!("Cannot publish resources in {s} state"),
        };
        let unknown = D::Warn {
            reason: "unknown event type".into(),
        };
        let resubscribed = D::Warn {
            reason: "SUBSCRIBED on an already subscribed stream".into(),
        };
        let rows: Vec<(K, [D; 5])> = vec![
            (
                K::ApplyOperation,
                [
                    drop("RECOVERING"),
                    drop("DISCONNECTED"),
                    drop("CONNECTED"),
                    drop("SUBSCRIBED"),
                    D::Handle,
                ],
            ),
            (
                K::PublishResources,
                [
                    failed("RECOVERING"),
                    failed("DISCONNECTED"),
                    failed("CONNECTED"),
                    failed("SUBSCRIBED"),
                    D::Handle,
                ],
            ),
            (
                K::AcknowledgeOperationStatus,
                [D::Queue, D::Queue, D::Queue, D::Queue, D::Handle],
            ),
            (
                K::ReconcileOperations,
                [D::Queue, D::Queue, D::Queue, D::Queue, D::Handle],
            ),
            (
                K::Teardown,
                [D::Ignore, D::Ignore, D::Ignore, D::Ignore, D::Ignore],
            ),
            (
                K::Unknown,
                [
                    unknown.clone(),
                    unknown.clone(),
                    unknown.clone(),
                    unknown.clone(),
                    unknown,
                ],
            ),
            (
                K::Subscribed,
                [
                    resubscribed.clone(),
                    resubscribed.clone(),
                    resubscribed.clone(),
                    resubscribed.clone(),
                    resubscribed,
                ],
            ),
        ];
        for (kind, expected) in rows {
            for (state, want) in STATES.iter().zip(expected) {
                assert_eq!(disposition(*state, false, kind), want, "{kind} in {state}");
                // Once the subscription's UPDATE_STATE is on its way, operations wait
                // for READY in SUBSCRIBED; nothing else changes.
                let reconciled = match (*state, kind) {
                    (Lifecycle::Subscribed, K::ApplyOperation | K::PublishResources) => {
                        Disposition::Queue
                    }
                    _ => disposition(*state, false, kind),
                };
                assert_eq!(
                    disposition(*state, true, kind),
                    reconciled,
                    "{kind} in {state}"
                );
            }
        }
    }

    #[test]
    fn event_kinds_from_the_wire() {
        let rows = [
            (Some(event::Type::Subscribed as i32), EventKind::Subscribed),
            (
                Some(event::Type::ApplyOperation as i32),
                EventKind::ApplyOperation,
            ),
            (
                Some(event::Type::PublishResources as i32),
                EventKind::PublishResources,
            ),
            (
                Some(event::Type::AcknowledgeOperationStatus as i32),
                EventKind::AcknowledgeOperationStatus,
            ),
            (
                Some(event::Type::ReconcileOperations as i32),
                EventKind::ReconcileOperations,
            ),
            (Some(event::Type::Teardown as i32), EventKind::Teardown),
            (Some(event::Type::Unknown as i32), EventKind::Unknown),
            (Some(99), EventKind::Unknown),
            (None, EventKind::Unknown),
        ];
        for (number, kind) in rows {
            let e = Event {
                r#type: number,
                ..Event::default()
            };
            assert_eq!(EventKind::of(&e), kind, "{number:?}");
        }
    }

    #[test]
    fn overflow_drops_the_oldest_ack_first() {
        let mut q = PendingEvents::new(3);
        assert!(q.push(event(event::Type::ReconcileOperations)).is_none());
        let mut ack1 = event(event::Type::AcknowledgeOperationStatus);
        ack1.acknowledge_operation_status = Some(event::AcknowledgeOperationStatus {
            status_uuid: slrp_proto::mesos::v1::Uuid { value: vec![1] },
            operation_uuid: slrp_proto::mesos::v1::Uuid { value: vec![1] },
        });
        assert!(q.push(ack1.clone()).is_none());
        assert!(
            q.push(event(event::Type::AcknowledgeOperationStatus))
                .is_none()
        );
        assert_eq!(q.len(), 3);
        let evicted = q.push(event(event::Type::ReconcileOperations));
        assert_eq!(evicted, Some(ack1));
        let kinds: Vec<_> = q.drain().iter().map(EventKind::of).collect();
        assert_eq!(
            kinds,
            [
                EventKind::ReconcileOperations,
                EventKind::AcknowledgeOperationStatus,
                EventKind::ReconcileOperations
            ]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn overflow_without_acks_drops_the_oldest_reconcile() {
        let mut q = PendingEvents::new(2);
        let mut first = event(event::Type::ReconcileOperations);
        first.reconcile_operations = Some(event::ReconcileOperations {
            operation_uuids: vec![slrp_proto::mesos::v1::Uuid { value: vec![7] }],
        });
        q.push(first.clone());
        q.push(event(event::Type::ReconcileOperations));
        assert_eq!(q.push(event(event::Type::ReconcileOperations)), Some(first));
        assert_eq!(q.len(), 2);
    }

    /// Issue #21: an operation waiting for READY is never evicted; a full queue of
    /// operations hands the arriving event back (the worker answers it).
    #[test]
    fn overflow_never_evicts_an_operation() {
        let mut q = PendingEvents::new(2);
        let apply = event(event::Type::ApplyOperation);
        let publish = event(event::Type::PublishResources);
        assert!(q.push(apply.clone()).is_none());
        assert!(q.push(event(event::Type::ReconcileOperations)).is_none());
        // The reconcile makes room for the publish, not the operation.
        assert_eq!(
            q.push(publish.clone()).map(|e| EventKind::of(&e)),
            Some(EventKind::ReconcileOperations)
        );
        // Now only operations: whatever arrives is handed back.
        for arriving in [
            apply.clone(),
            publish.clone(),
            event(event::Type::AcknowledgeOperationStatus),
        ] {
            assert_eq!(q.push(arriving.clone()), Some(arriving));
        }
        let kinds: Vec<_> = q.drain().iter().map(EventKind::of).collect();
        assert_eq!(
            kinds,
            [EventKind::ApplyOperation, EventKind::PublishResources]
        );
    }
}
