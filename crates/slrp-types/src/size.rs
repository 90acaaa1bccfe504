//! Byte sizes with units, as operators type them: `64MiB`, `10GiB`, `1G`, `1.5GiB`, `4096`.
//!
//! SI prefixes are decimal (`1G` = 10^9 bytes) and IEC prefixes binary (`1GiB` = 2^30), as
//! in Kubernetes quantities; the trailing `B` is optional and case does not matter. A
//! decimal fraction is allowed when the result is a whole number of bytes (`1.5GiB`, but
//! not `1.5B`); it is computed exactly, not through floating point.

/// A size string that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No digits.
    #[error("size {0:?} does not start with a number")]
    NoNumber(String),
    /// Digits and dots that do not form a decimal number (`1.`, `1.2.3`).
    #[error("size {0:?} has a malformed number")]
    BadNumber(String),
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
    /// A fraction that leaves part of a byte (`1.5B`, `0.1KiB`).
    #[error("size {0:?} is not a whole number of bytes")]
    Fraction(String),
    /// The value does not fit in 63 bits (CSI sizes are `int64`).
    #[error("size {0:?} is too large")]
    TooLarge(String),
}

/// At most this many fraction digits: enough for any real size, small enough that the
/// exact computation below cannot overflow `u128`.
const MAX_FRACTION_DIGITS: u32 = 18;

/// Parses a size into bytes. The result fits in an `i64`, as CSI sizes are `int64`.
///
/// # Errors
/// [`SizeError`] naming the input and what is wrong with it.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(number_end);
    if !number.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(SizeError::NoNumber(input.to_owned()));
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if number.contains('.') && (fraction.is_empty() || fraction.contains('.')) {
        return Err(SizeError::BadNumber(input.to_owned()));
    }
    let factor = unit_factor(unit).ok_or_else(|| SizeError::UnknownUnit {
        input: input.to_owned(),
        unit: unit.trim().to_owned(),
    })?;
    let too_large = || SizeError::TooLarge(input.to_owned());
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let mut bytes = whole
        .checked_mul(u128::from(factor))
        .ok_or_else(too_large)?;
    let fraction = fraction.trim_end_matches('0');
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len())
            .ok()
            .filter(|d| *d <= MAX_FRACTION_DIGITS)
            .ok_or_else(|| SizeError::Fraction(input.to_owned()))?;
        let numerator: u128 = fraction.parse().map_err(|_| too_large())?;
        let scaled = numerator * u128::from(factor);
        let denominator = 10u128.pow(digits);
        if !scaled.is_multiple_of(denominator) {
            return Err(SizeError::Fraction(input.to_owned()));
        }
        bytes = bytes
            .checked_add(scaled / denominator)
            .ok_or_else(too_large)?;
    }
    u64::try_from(bytes)
        .ok()
        .filter(|b| i64::try_from(*b).is_ok())
        .ok_or_else(too_large)
}

/// Bytes per unit, for a unit as typed (`Gi`, `GiB`, `gb`, ``).
fn unit_factor(unit: &str) -> Option<u64> {
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    Some(match unit {
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
        _ => return None,
    })
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
        let table: &[(&str, u64)] = &[
            ("64MiB", 64 << 20),
            ("10GiB", 10 << 30),
            ("1G", 1_000_000_000),
            ("1GB", 1_000_000_000),
            ("512mib", 512 << 20),
            ("4096", 4096),
            (" 2 Ki ", 2048),
            ("2 kib", 2048),
            ("1.5GiB", 3 << 29),
            ("1.50GiB", 3 << 29),
            ("0.5KiB", 512),
            ("1.3K", 1300),
            ("2.0", 2),
            ("1P", 1_000_000_000_000_000),
            ("8191PiB", 8191 << 50),
        ];
        for (text, bytes) in table {
            assert_eq!(parse_size(text), Ok(*bytes), "{text:?}");
        }
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        type IsExpected = fn(&SizeError) -> bool;
        let table: &[(&str, IsExpected)] = &[
            ("GiB", |e| matches!(e, SizeError::NoNumber(_))),
            ("", |e| matches!(e, SizeError::NoNumber(_))),
            ("-1G", |e| matches!(e, SizeError::NoNumber(_))),
            (".5G", |e| matches!(e, SizeError::NoNumber(_))),
            ("1.G", |e| matches!(e, SizeError::BadNumber(_))),
            ("1.2.3G", |e| matches!(e, SizeError::BadNumber(_))),
            ("10XB", |e| matches!(e, SizeError::UnknownUnit { .. })),
            ("1,5G", |e| matches!(e, SizeError::UnknownUnit { .. })),
            ("1.5B", |e| matches!(e, SizeError::Fraction(_))),
            ("0.1KiB", |e| matches!(e, SizeError::Fraction(_))),
            ("9000PiB", |e| matches!(e, SizeError::TooLarge(_))),
            ("8192PiB", |e| matches!(e, SizeError::TooLarge(_))),
            ("99999999999999999999999999999999999999999", |e| {
                matches!(e, SizeError::TooLarge(_))
            }),
        ];
        for (text, want) in table {
            let e = parse_size(text).unwrap_err();
            assert!(want(&e), "{text:?}: {e:?}");
            assert!(e.to_string().contains(&format!("{text:?}")), "{e}");
        }
    }

    #[test]
    fn formats_with_largest_exact_unit() {
        assert_eq!(format_size(10 << 30), "10GiB");
        assert_eq!(format_size(1536 << 20), "1536MiB");
        assert_eq!(format_size(1_000_000_000), "1000000000B");
        assert_eq!(format_size(0), "0B");
        for b in [1u64 << 20, 3 << 29, 12345] {
            assert_eq!(parse_size(&format_size(b)), Ok(b));
        }
    }
}
