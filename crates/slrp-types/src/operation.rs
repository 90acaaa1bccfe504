//! Operation states: what the provider, the embedded manager and the admin API agree on.

use slrp_proto::mesos::v1::OperationState;

/// Mesos `protobuf::isTerminalState(OperationState)`: nothing leaves these states. An
/// unknown number is not terminal (a newer peer's state is not taken for an end).
#[must_use]
pub fn is_terminal_state(state: i32) -> bool {
    matches!(
        OperationState::try_from(state),
        Ok(OperationState::OperationFinished
            | OperationState::OperationFailed
            | OperationState::OperationError
            | OperationState::OperationDropped
            | OperationState::OperationGoneByOperator)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_are_mesos_s() {
        let terminal = [
            OperationState::OperationFinished,
            OperationState::OperationFailed,
            OperationState::OperationError,
            OperationState::OperationDropped,
            OperationState::OperationGoneByOperator,
        ];
        let open = [
            OperationState::OperationUnsupported,
            OperationState::OperationPending,
            OperationState::OperationUnreachable,
            OperationState::OperationRecovering,
            OperationState::OperationUnknown,
        ];
        for state in terminal {
            assert!(is_terminal_state(state as i32), "{state:?}");
        }
        for state in open {
            assert!(!is_terminal_state(state as i32), "{state:?}");
        }
        assert!(!is_terminal_state(9999));
    }
}
