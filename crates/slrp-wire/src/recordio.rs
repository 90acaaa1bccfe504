//! RecordIO framing, as used by Mesos HTTP event streams.
//!
//! A stream is a sequence of records, each written as `<decimal length>\n<payload>`: the
//! length is ASCII base 10 with no sign, and there is no other delimiter. The decoder works
//! incrementally, so a record may arrive split across any number of chunks, and it bounds
//! both the header and the record size so a hostile or broken peer cannot make it buffer
//! without limit. It never panics on input.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// The largest record accepted by [`RecordIoDecoder::default`]: 64 MiB. Mesos events carry
/// resource lists and operations; even large agents stay far below this.
pub const DEFAULT_MAX_RECORD_LEN: usize = 64 * 1024 * 1024;

/// How far ahead of the received bytes the decoder reserves buffer space.
const RESERVE_AHEAD: usize = 64 * 1024;

/// Digits in the decimal form of `u64::MAX`: a longer header cannot be a valid length.
const MAX_HEADER_DIGITS: usize = 20;

/// Errors from decoding a RecordIO stream. After any of them the stream is unusable: the
/// framing is lost, and Mesos treats the connection as broken.
#[derive(Debug, thiserror::Error)]
pub enum RecordIoError {
    /// Reading the underlying byte stream failed.
    #[error("reading the RecordIO stream")]
    Io(#[from] std::io::Error),
    /// The header before `\n` was empty or held something other than decimal digits.
    #[error("malformed RecordIO header {header:?}: expected decimal digits followed by a newline")]
    MalformedHeader {
        /// The offending header bytes, lossily decoded (at most 20 bytes).
        header: String,
    },
    /// No newline appeared within the longest possible header.
    #[error("RecordIO header longer than {MAX_HEADER_DIGITS} bytes: {prefix:?}")]
    HeaderTooLong {
        /// The first bytes of the header, lossily decoded.
        prefix: String,
    },
    /// The announced record length exceeds the configured maximum.
    #[error("RecordIO record of {len} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge {
        /// Length announced by the header.
        len: u64,
        /// Configured maximum.
        max: usize,
    },
    /// The stream ended in the middle of a header or record.
    #[error("RecordIO stream ended inside a record ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the incomplete record that were received.
        buffered: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for `<digits>\n`.
    Header,
    /// Header read; waiting for this many payload bytes.
    Payload(usize),
}

/// Incremental RecordIO decoder for `tokio_util::codec::FramedRead`.
#[derive(Debug, Clone)]
pub struct RecordIoDecoder {
    max_record_len: usize,
    state: State,
}

impl Default for RecordIoDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RECORD_LEN)
    }
}

impl RecordIoDecoder {
    /// A decoder that rejects records longer than `max_record_len` bytes.
    #[must_use]
    pub fn new(max_record_len: usize) -> Self {
        Self {
            max_record_len,
            state: State::Header,
        }
    }

    /// The configured maximum record length.
    #[must_use]
    pub fn max_record_len(&self) -> usize {
        self.max_record_len
    }

    fn parse_header(&self, digits: &[u8]) -> Result<usize, RecordIoError> {
        let malformed = || RecordIoError::MalformedHeader {
            header: String::from_utf8_lossy(digits).into_owned(),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(malformed());
        }
        let len: u64 = std::str::from_utf8(digits)
            .map_err(|_| malformed())?
            .parse()
            .map_err(|_| malformed())?;
        match usize::try_from(len) {
            Ok(n) if n <= self.max_record_len => Ok(n),
            _ => Err(RecordIoError::RecordTooLarge {
                len,
                max: self.max_record_len,
            }),
        }
    }
}

impl Decoder for RecordIoDecoder {
    type Item = Bytes;
    type Error = RecordIoError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        loop {
            match self.state {
                State::Header => {
                    let window = &src[..src.len().min(MAX_HEADER_DIGITS + 1)];
                    let Some(newline) = window.iter().position(|b| *b == b'\n') else {
                        if src.len() > MAX_HEADER_DIGITS {
                            return Err(RecordIoError::HeaderTooLong {
                                prefix: String::from_utf8_lossy(&src[..MAX_HEADER_DIGITS])
                                    .into_owned(),
                            });
                        }
                        // Reject garbage early instead of waiting for a newline that may
                        // never come.
                        if let Some(bad) = src.iter().position(|b| !b.is_ascii_digit()) {
                            return Err(RecordIoError::MalformedHeader {
                                header: String::from_utf8_lossy(&src[..=bad]).into_owned(),
                            });
                        }
                        src.reserve(MAX_HEADER_DIGITS + 1 - src.len());
                        return Ok(None);
                    };
                    let len = self.parse_header(&src[..newline])?;
                    src.advance(newline + 1);
                    self.state = State::Payload(len);
                }
                State::Payload(len) => {
                    if src.len() < len {
                        // Grow with the data rather than by the announced length, so a
                        // peer that sends only a large header cannot make us allocate it.
                        src.reserve((len - src.len()).min(RESERVE_AHEAD));
                        return Ok(None);
                    }
                    self.state = State::Header;
                    return Ok(Some(src.split_to(len).freeze()));
                }
            }
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, RecordIoError> {
        match self.decode(src)? {
            Some(record) => Ok(Some(record)),
            None if src.is_empty() && self.state == State::Header => Ok(None),
            None => Err(RecordIoError::Truncated {
                buffered: src.len(),
            }),
        }
    }
}

/// RecordIO encoder: writes `<len>\n<payload>` for every item.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordIoEncoder;

impl<T: AsRef<[u8]>> Encoder<T> for RecordIoEncoder {
    type Error = std::io::Error;

    fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        let payload = item.as_ref();
        let header = payload.len().to_string();
        dst.reserve(header.len() + 1 + payload.len());
        dst.put_slice(header.as_bytes());
        dst.put_u8(b'\n');
        dst.put_slice(payload);
        Ok(())
    }
}

/// Frames one record; convenient for building an HTTP body by hand.
#[must_use]
pub fn encode_record(payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::new();
    RecordIoEncoder
        .encode(payload, &mut buf)
        .expect("encoding into memory cannot fail");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(
        decoder: &mut RecordIoDecoder,
        chunks: &[&[u8]],
    ) -> Result<Vec<Bytes>, RecordIoError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(record) = decoder.decode(&mut buf)? {
                out.push(record);
            }
        }
        while let Some(record) = decoder.decode_eof(&mut buf)? {
            out.push(record);
        }
        Ok(out)
    }

    fn stream_of(records: &[&[u8]]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|r| encode_record(r).to_vec())
            .collect()
    }

    #[test]
    fn decodes_records_including_empty_ones() {
        let stream = stream_of(&[b"hello", b"", b"world\n2\nxx"]);
        let got = decode_all(&mut RecordIoDecoder::default(), &[&stream]).unwrap();
        assert_eq!(got, vec![&b"hello"[..], b"", b"world\n2\nxx"]);
    }

    #[test]
    fn decodes_a_stream_split_at_every_byte_offset() {
        let records: [&[u8]; 4] = [
            b"{\"type\":\"SUBSCRIBED\"}",
            b"",
            b"x",
            &[0u8, 10, 255, 49, 10],
        ];
        let stream = stream_of(&records);
        for split in 0..=stream.len() {
            let (a, b) = stream.split_at(split);
            let got = decode_all(&mut RecordIoDecoder::default(), &[a, b]).unwrap();
            assert_eq!(got, records, "split at {split}");
        }
        // One byte per chunk.
        let chunks: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(
            decode_all(&mut RecordIoDecoder::default(), &chunks).unwrap(),
            records
        );
    }

    #[test]
    fn rejects_non_digit_headers_without_waiting_for_a_newline() {
        for bad in [
            &b"-5\nabcde"[..],
            b"+5\n",
            b"5 \n",
            b" 5\n",
            b"\n",
            b"0x10\n",
            b"abc",
        ] {
            let err = decode_all(&mut RecordIoDecoder::default(), &[bad]).unwrap_err();
            assert!(
                matches!(err, RecordIoError::MalformedHeader { .. }),
                "{bad:?}: {err:?}"
            );
        }
    }

    #[test]
    fn rejects_overlong_headers_and_oversized_records() {
        let err = decode_all(&mut RecordIoDecoder::default(), &[&[b'1'; 25]]).unwrap_err();
        assert!(
            matches!(err, RecordIoError::HeaderTooLong { .. }),
            "{err:?}"
        );

        let err = decode_all(&mut RecordIoDecoder::new(4), &[b"5\nhello"]).unwrap_err();
        assert!(
            matches!(err, RecordIoError::RecordTooLarge { len: 5, max: 4 }),
            "{err:?}"
        );

        // Larger than u64: rejected as too large, not as an overflow panic.
        let err = decode_all(
            &mut RecordIoDecoder::default(),
            &[b"99999999999999999999\n"],
        )
        .unwrap_err();
        assert!(
            matches!(err, RecordIoError::MalformedHeader { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn reports_truncation_at_eof() {
        for partial in [&b"5\nhel"[..], b"12", b"3\n"] {
            let err = decode_all(&mut RecordIoDecoder::default(), &[partial]).unwrap_err();
            assert!(
                matches!(err, RecordIoError::Truncated { .. }),
                "{partial:?}: {err:?}"
            );
        }
        assert!(
            decode_all(&mut RecordIoDecoder::default(), &[b""])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_large_header_alone_does_not_allocate_the_announced_length() {
        let mut decoder = RecordIoDecoder::default();
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"67108864\nab");
        assert!(decoder.decode(&mut buf).unwrap().is_none());
        assert!(buf.capacity() < 1024 * 1024, "capacity {}", buf.capacity());
    }

    #[test]
    fn record_exactly_at_the_limit_is_accepted() {
        let got = decode_all(&mut RecordIoDecoder::new(5), &[b"5\nhello"]).unwrap();
        assert_eq!(got, vec![&b"hello"[..]]);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512),
                                       cut in 0usize..512) {
            let cut = cut.min(data.len());
            let _ = decode_all(&mut RecordIoDecoder::new(256), &[&data[..cut], &data[cut..]]);
        }

        #[test]
        fn round_trips_arbitrary_records(records in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..64), 0..16),
                chunk in 1usize..17) {
            let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
            let stream = stream_of(&refs);
            let chunks: Vec<&[u8]> = stream.chunks(chunk).collect();
            let got = decode_all(&mut RecordIoDecoder::default(), &chunks).unwrap();
            prop_assert_eq!(got, refs);
        }
    }
}
