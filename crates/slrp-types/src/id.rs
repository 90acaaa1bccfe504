//! [`validate_id`]: Mesos's rules for an ID (agent, framework, provider …).
//!
//! Mesos maps IDs to directories (`meta/slaves/<agent_id>/…`), and so does slrp: the
//! provider's durable identity is keyed by the agent ID. An ID that passes here is one
//! path component and cannot escape its directory.

/// Longest ID Mesos accepts (`NAME_MAX`, a file name).
pub const MAX_ID_LEN: usize = 255;

/// Why an ID is not acceptable; the texts are Mesos's `common::validation::validateID`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The ID is empty.
    #[error("ID must not be empty")]
    Empty,
    /// The ID is longer than [`MAX_ID_LEN`] bytes.
    #[error("ID must not be greater than {MAX_ID_LEN} characters")]
    TooLong,
    /// `.` or `..`.
    #[error("'{0}' is disallowed")]
    Dots(String),
    /// A control character or a path separator.
    #[error("{0:?} contains invalid characters")]
    InvalidCharacters(String),
}

/// Checks `id` as Mesos's `validateID` does.
///
/// # Errors
/// [`IdError`] naming the rule broken.
pub fn validate_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty);
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong);
    }
    if id == "." || id == ".." {
        return Err(IdError::Dots(id.to_owned()));
    }
    if id.chars().any(|c| c.is_control() || c == '/' || c == '\\') {
        return Err(IdError::InvalidCharacters(id.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesos_id_rules() {
        let long = "a".repeat(MAX_ID_LEN + 1);
        let cases: [(&str, Option<IdError>); 8] = [
            ("2c9b0b4b-1d6e-4e8b-9a52-0b6f4c0f6a3e-S0", None),
            ("a.b", None),
            ("", Some(IdError::Empty)),
            (&long, Some(IdError::TooLong)),
            (".", Some(IdError::Dots(".".into()))),
            ("..", Some(IdError::Dots("..".into()))),
            ("a/b", Some(IdError::InvalidCharacters("a/b".into()))),
            ("a\nb", Some(IdError::InvalidCharacters("a\nb".into()))),
        ];
        for (id, expected) in cases {
            assert_eq!(validate_id(id).err(), expected, "{id:?}");
        }
        assert!(validate_id(&"a".repeat(MAX_ID_LEN)).is_ok());
        assert!(validate_id("a\\b").is_err());
    }
}
