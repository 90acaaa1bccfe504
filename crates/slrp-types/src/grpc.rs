//! gRPC status code names as the gRPC spec spells them.

pub use tonic::Code;

/// Parses a gRPC code name as written in the gRPC spec (`UNAVAILABLE`, `DEADLINE_EXCEEDED`).
/// Case matters: `unavailable` is not a code name.
pub fn parse_code(name: &str) -> Option<Code> {
    let code = match name {
        "OK" => Code::Ok,
        "CANCELLED" => Code::Cancelled,
        "UNKNOWN" => Code::Unknown,
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "DEADLINE_EXCEEDED" => Code::DeadlineExceeded,
        "NOT_FOUND" => Code::NotFound,
        "ALREADY_EXISTS" => Code::AlreadyExists,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "ABORTED" => Code::Aborted,
        "OUT_OF_RANGE" => Code::OutOfRange,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "INTERNAL" => Code::Internal,
        "UNAVAILABLE" => Code::Unavailable,
        "DATA_LOSS" => Code::DataLoss,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        _ => return None,
    };
    Some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_name_parses_to_its_number() {
        let names = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        // The gRPC spec numbers the codes 0..=16 in this order.
        for (number, name) in (0..).zip(names) {
            assert_eq!(parse_code(name), Some(Code::from_i32(number)), "{name}");
        }
    }

    #[test]
    fn other_spellings_are_not_codes() {
        for bad in ["unavailable", "Unavailable", "", "14", "UNAVAILABLE "] {
            assert_eq!(parse_code(bad), None, "{bad:?}");
        }
    }
}
