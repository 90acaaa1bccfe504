//! Byte sizes with units, as operators type them: `64MiB`, `10GiB`, `1G`, `4096`.
//!
//! SI prefixes are decimal (`1G` = 10^9 bytes) and IEC prefixes binary (`1GiB` = 2^30),
//! as in Kubernetes quantities; the trailing `B` is optional and case does not matter.

/// A size string that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No digits.
    #[error("size {0:?} does not start with a number")]
    NoNumber(String),
    /// Unknown unit suffix.
    #[error(
        "size {input:?} has unknown unit {unit:?} (use B, K, M, G, T, P or KiB, MiB, GiB, TiB, PiB)"
    )]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The value does not fit in 63 bits (CSI sizes are `int64`).
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

/// Parses a size into bytes. The result fits in an `i64`, as CSI sizes are `int64`.
///
/// # Errors
/// [`SizeError`] naming the input and what is wrong with it.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits_end);
    if num.is_empty() {
        return Err(SizeError::NoNumber(input.to_owned()));
    }
    let value: u64 = num
        .parse()
        .map_err(|_| SizeError::TooLarge(input.to_owned()))?;
    let unit_norm = unit.trim().to_ascii_lowercase();
    let unit_norm = unit_norm.strip_suffix('b').unwrap_or(&unit_norm);
    let factor: u64 = match unit_norm {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "p" => 1_000_000_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        "pi" => 1 << 50,
        _ => {
            return Err(SizeError::UnknownUnit {
                input: input.to_owned(),
                unit: unit.trim().to_owned(),
            });
        }
    };
    let bytes = value
        .checked_mul(factor)
        .filter(|b| i64::try_from(*b).is_ok())
        .ok_or_else(|| SizeError::TooLarge(input.to_owned()))?;
    Ok(bytes)
}

/// Formats bytes for humans with the largest IEC unit that divides them (`10GiB`,
/// `1536MiB`, `1000000000B`... falls back to bytes).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, f) in UNITS {
        if bytes >= f && bytes.is_multiple_of(f) {
            return format!("{}{name}", bytes / f);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_documented_forms() {
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("10GiB").unwrap(), 10 << 30);
        assert_eq!(parse_size("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("512mib").unwrap(), 512 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 2 Ki ").unwrap(), 2048);
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(matches!(parse_size("GiB"), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size(""), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size("-1G"), Err(SizeError::NoNumber(_))));
        assert!(matches!(
            parse_size("10XB"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("1.5G"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("9000PiB"), Err(SizeError::TooLarge(_))));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::TooLarge(_))
        ));
    }

    #[test]
    fn formats_with_largest_exact_unit() {
        assert_eq!(format_size(10 << 30), "10GiB");
        assert_eq!(format_size(1536 << 20), "1536MiB");
        assert_eq!(format_size(1_000_000_000), "1000000000B");
        assert_eq!(format_size(0), "0B");
    }
}
