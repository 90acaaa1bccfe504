//! The agent's event stream, as `slrp-agent`'s session reads it: RecordIO frames
//! ([`RecordIoDecoder`] under `FramedRead`) of `resource_provider::Event`s, decoded with
//! [`slrp_wire::decode`] in the session's content type.
//!
//! Input: one flags byte (bit 0: JSON instead of protobuf; bit 1: a 64-byte record limit
//! instead of the daemon's default), one chunking seed, then the stream's bytes.
//!
//! Properties:
//! - framing does not depend on how the stream is cut: the records (and whether the
//!   stream ends in an error) are those of the stream read in one piece;
//! - every record that decodes encodes and decodes again to the same event, in its own
//!   content type and in the other one;
//! - errors are typed (`RecordIoError`, `DecodeError`), never panics; no allocation beyond
//!   the driver's cap, whatever the headers announce.

use bytes::{Bytes, BytesMut};
use slrp_proto::mesos::v1::resource_provider::Event;
use slrp_wire::recordio::DEFAULT_MAX_RECORD_LEN;
use slrp_wire::{ContentType, RecordIoDecoder, RecordIoError};
use tokio_util::codec::Decoder as _;

use crate::util::{byte, same};

/// The records of a stream fed in `chunks`, and the error that ended it, if any, as
/// `FramedRead` yields them (decode while a frame is ready; `decode_eof` at the end).
fn frames<'a>(
    chunks: impl Iterator<Item = &'a [u8]>,
    max: usize,
) -> (Vec<Bytes>, Option<RecordIoError>) {
    let mut decoder = RecordIoDecoder::new(max);
    let mut buf = BytesMut::new();
    let mut records = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(r)) => records.push(r),
                Ok(None) => break,
                Err(e) => return (records, Some(e)),
            }
        }
    }
    loop {
        match decoder.decode_eof(&mut buf) {
            Ok(Some(r)) => records.push(r),
            Ok(None) => return (records, None),
            Err(e) => return (records, Some(e)),
        }
    }
}

/// Cuts `stream` into pieces of pseudo-random lengths (1 to 1 + `seed % 32`) drawn from
/// `seed`; seed 0 gives single bytes.
fn cut(stream: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    let span = u32::from(seed % 32) + 1;
    let mut out = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = usize::try_from(state % span + 1)
            .unwrap_or(1)
            .min(rest.len());
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

/// The target.
pub fn run(data: &[u8]) {
    let mut data = data;
    let flags = byte(&mut data);
    let seed = byte(&mut data);
    let content_type = if flags & 1 == 0 {
        ContentType::Protobuf
    } else {
        ContentType::Json
    };
    let max = if flags & 2 == 0 {
        DEFAULT_MAX_RECORD_LEN
    } else {
        64
    };
    let (whole, whole_err) = frames(std::iter::once(data), max);
    let (cut_records, cut_err) = frames(cut(data, seed).into_iter(), max);
    assert_eq!(whole, cut_records, "records depend on the chunking");
    // Whether the stream ends in an error must not depend on the cuts; which error may: a
    // header is refused as soon as a non-digit arrives (`MalformedHeader`), while the
    // whole stream can show first that no newline comes in time (`HeaderTooLong`).
    assert_eq!(
        whole_err.is_some(),
        cut_err.is_some(),
        "the stream's end depends on the chunking: {whole_err:?} vs {cut_err:?}"
    );
    for record in &whole {
        check_event(content_type, record);
    }
}

fn check_event(content_type: ContentType, record: &[u8]) {
    let Ok(event) = slrp_wire::decode::<Event>(content_type, record) else {
        return;
    };
    for ct in [ContentType::Protobuf, ContentType::Json] {
        let Ok(bytes) = slrp_wire::encode(ct, &event) else {
            // JSON has no NaN or infinities: a typed refusal.
            assert_eq!(ct, ContentType::Json, "protobuf encoding cannot fail");
            continue;
        };
        let again = slrp_wire::decode::<Event>(ct, &bytes)
            .unwrap_or_else(|e| panic!("{ct} encoding of a decoded event does not decode: {e:?}"));
        assert!(
            same(&event, &again),
            "{ct} round trip changed the event:\n{event:?}\n{again:?}"
        );
    }
}

/// A seed input: `flags`, chunking `seed` and the records framed as RecordIO.
#[must_use]
pub fn seed(json: bool, chunk_seed: u8, records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![u8::from(json), chunk_seed];
    for r in records {
        out.extend_from_slice(&slrp_wire::recordio::encode_record(r));
    }
    out
}
