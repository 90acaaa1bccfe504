//! CRC-32C (Castagnoli), the checksum of every record envelope.
//!
//! Table-driven and small on purpose: records are a few hundred bytes, so the checksum is
//! noise next to the fsync that every commit pays, and a dependency would buy nothing.

const POLY: u32 = 0x82F6_3B78; // reflected Castagnoli polynomial

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Incremental CRC-32C.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crc32c(u32);

impl Crc32c {
    pub(crate) fn new() -> Self {
        Self(!0)
    }

    pub(crate) fn update(mut self, bytes: &[u8]) -> Self {
        for &b in bytes {
            self.0 = TABLE[((self.0 ^ u32::from(b)) & 0xFF) as usize] ^ (self.0 >> 8);
        }
        self
    }

    pub(crate) fn finish(self) -> u32 {
        !self.0
    }
}

/// Checksum of one record: every field that identifies or carries it, each length-prefixed so
/// that bytes cannot move between fields without changing the sum.
pub(crate) fn record_checksum(kind: &[u8], key: &[u8], schema: u32, value: &[u8]) -> u32 {
    let mut c = Crc32c::new();
    for field in [kind, key] {
        c = c.update(&(field.len() as u64).to_le_bytes()).update(field);
    }
    c.update(&schema.to_le_bytes())
        .update(&(value.len() as u64).to_le_bytes())
        .update(value)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_check_value() {
        // The check value every CRC-32C implementation publishes.
        assert_eq!(Crc32c::new().update(b"123456789").finish(), 0xE306_9283);
    }

    #[test]
    fn fields_are_framed() {
        assert_ne!(
            record_checksum(b"ab", b"c", 1, b"{}"),
            record_checksum(b"a", b"bc", 1, b"{}")
        );
        assert_ne!(
            record_checksum(b"a", b"b", 1, b"{}"),
            record_checksum(b"a", b"b", 2, b"{}")
        );
    }
}
