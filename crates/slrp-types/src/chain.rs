//! [`DisplayChain`]: the one way an error is printed with its causes.

use std::error::Error;
use std::fmt;

/// Displays an error and every `source()` below it, joined with `": "`:
/// `outer: cause: root cause`.
///
/// Our error types name only their own layer in `Display` (the cause sits in `#[source]`),
/// so printing `%e` alone would drop the reason an operation failed. Wrap the error where
/// it is handled: `tracing::error!(error = %DisplayChain(&e), "...")`.
#[derive(Clone, Copy)]
pub struct DisplayChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Debug for DisplayChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            write!(f, ": {cause}")?;
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing checkpoint for volume {volume}")]
    struct Outer {
        volume: &'static str,
        #[source]
        source: Middle,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("committing transaction")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn prints_every_layer_once_outermost_first() {
        let e = Outer {
            volume: "v1",
            source: Middle(std::io::Error::other("disk I/O error")),
        };
        assert_eq!(
            DisplayChain(&e).to_string(),
            "writing checkpoint for volume v1: committing transaction: disk I/O error"
        );
        assert_eq!(
            format!("{:?}", DisplayChain(&e)),
            DisplayChain(&e).to_string()
        );
    }

    #[test]
    fn an_error_without_cause_prints_alone() {
        let e = std::io::Error::other("boom");
        assert_eq!(DisplayChain(&e).to_string(), "boom");
    }
}
