//! Bearer token files: one reader for the daemon (`[admin] token_file`,
//! `[agent] token_file`) and for `slrp ctl --token-file`, so both see the same token in the
//! same file.
//!
//! A token is the file's text without the ASCII whitespace at either end (the newline an
//! editor or `echo` adds, a stray space or tab). If the two sides trimmed differently, a
//! file ending in `" \n"` would make the daemon expect `"abc "` while the client sends
//! `"abc"`, and every request would get a 401 that no message explains.

use std::path::{Path, PathBuf};

/// Why a token file gives no token. Neither variant carries the file's content.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("reading the token file {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds nothing but whitespace.
    #[error("the token file {} is empty", .path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The token in `path`: its text with the ASCII whitespace at both ends removed; a file
/// with nothing else is refused.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim_ascii();
    if token.is_empty() {
        return Err(TokenFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;

    fn read(content: &str) -> Result<String, TokenFileError> {
        let dir = std::env::temp_dir().join(format!(
            "slrp-types-token-{}-{}",
            std::process::id(),
            content.len()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{:x}", content.bytes().map(u64::from).sum::<u64>()));
        std::fs::write(&path, content).unwrap();
        let token = read_token_file(&path);
        let _ = std::fs::remove_file(&path);
        token
    }

    #[test]
    fn ascii_whitespace_at_both_ends_is_not_part_of_the_token() {
        for content in [
            "abc",
            "abc\n",
            "abc\r\n",
            "abc \n",
            "abc\t\n",
            " \tabc",
            "\n abc \t\r\n",
        ] {
            assert_eq!(read(content).unwrap(), "abc", "{content:?}");
        }
        // Inside, whitespace is kept: only the ends are an editor's slip.
        assert_eq!(read("a b\tc\n").unwrap(), "a b\tc");
    }

    #[test]
    fn an_empty_or_blank_file_is_refused() {
        for content in ["", "\n", " \t\r\n "] {
            match read(content) {
                Err(TokenFileError::Empty { .. }) => {}
                other => panic!("{content:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let path = Path::new("/nonexistent/slrp-token");
        let err = read_token_file(path).unwrap_err();
        assert!(matches!(err, TokenFileError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/slrp-token"), "{err}");
    }
}
