//! The filter's tests, apart from the filter so that its file stays readable: RFC 7541's
//! examples, splitting, re-framing, bounds, malformed input and the stream's buffering.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    FrameHead {
        len: payload.len(),
        kind,
        flags,
        stream,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    out
}

/// A client connection: the preface, an empty SETTINGS frame, then `frames`.
fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    for f in frames {
        out.extend_from_slice(f);
    }
    out
}

fn filter_all(input: &[u8]) -> Result<Vec<u8>, FilterError> {
    let mut out = Vec::new();
    AuthorityFilter::new().feed(input, &mut out)?;
    Ok(out)
}

/// The frames after the preface: (header, payload).
fn frames_of(bytes: &[u8]) -> Vec<(FrameHead, Vec<u8>)> {
    assert_eq!(&bytes[..PREFACE.len()], PREFACE);
    let mut rest = &bytes[PREFACE.len()..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let head = FrameHead::parse(rest[..FRAME_HEADER_LEN].try_into().unwrap());
        let end = FRAME_HEADER_LEN + head.len;
        out.push((head, rest[FRAME_HEADER_LEN..end].to_vec()));
        rest = &rest[end..];
    }
    out
}

/// A header block as the server reads it.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<Vec<u8>>,
    fields: Fields,
}

/// The header blocks the server reads. Each is decoded with a fresh decoder: what the
/// filter writes must not index anything.
fn blocks_of(bytes: &[u8]) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(Block, Vec<u8>)> = None;
    for (head, payload) in frames_of(bytes) {
        match head.kind {
            TYPE_HEADERS => {
                assert!(open.is_none() && head.flags & FLAG_PADDED == 0);
                let (priority, fragment) = if head.flags & FLAG_PRIORITY != 0 {
                    (Some(payload[..5].to_vec()), payload[5..].to_vec())
                } else {
                    (None, payload)
                };
                let block = Block {
                    stream: head.stream,
                    end_stream: head.flags & FLAG_END_STREAM != 0,
                    priority,
                    fields: Vec::new(),
                };
                open = Some((block, fragment));
            }
            TYPE_CONTINUATION => open.as_mut().unwrap().1.extend(payload),
            _ => {
                assert!(open.is_none(), "a frame inside a header block");
                continue;
            }
        }
        assert!(head.len <= OUT_FRAME_MAX);
        if head.flags & FLAG_END_HEADERS != 0 {
            let (mut block, fragment) = open.take().unwrap();
            block.fields = loona_hpack::Decoder::new().decode(&fragment).unwrap();
            blocks.push(block);
        }
    }
    blocks
}

fn headers_frame(stream: u32, block: &[u8]) -> Vec<u8> {
    frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block)
}

/// RFC 7541 Appendix C.3 (literals) and C.4 (Huffman): three requests in a row, the
/// later ones indexing entries the earlier ones added to the dynamic table.
#[test]
fn rfc7541_request_examples_decode_across_the_dynamic_table() {
    let expected = [
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    let c3 = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    let c4 = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    for example in [c3, c4] {
        let frames: Vec<_> = example
            .iter()
            .zip([1, 3, 5])
            .map(|(h, stream)| headers_frame(stream, &hex(h)))
            .collect();
        let out = filter_all(&connection(&frames)).unwrap();
        let blocks = blocks_of(&out);
        let got: Vec<_> = blocks.iter().map(|b| b.fields.clone()).collect();
        assert_eq!(got, expected);
        assert_eq!(
            blocks.iter().map(|b| b.stream).collect::<Vec<_>>(),
            [1, 3, 5]
        );
    }
}

#[test]
fn an_authority_that_is_not_a_uri_authority_becomes_localhost() {
    let mut enc = loona_hpack::Encoder::new();
    let request = |authority: &str| {
        fields(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/csi.v1.Identity/Probe"),
            (":authority", authority),
            ("te", "trailers"),
        ])
    };
    let cases = [
        ("/run/csi/csi.sock", "localhost"),
        ("%2Frun%2Fcsi%2Fcsi.sock", "localhost"),
        ("", "localhost"),
        ("localhost", "localhost"),
        ("[::]:50051", "[::]:50051"),
        ("www.example.com:443", "www.example.com:443"),
    ];
    let frames: Vec<_> = cases
        .iter()
        .zip((1u32..).step_by(2))
        .map(|((authority, _), stream)| {
            let f = request(authority);
            headers_frame(
                stream,
                &enc.encode(f.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))),
            )
        })
        .collect();
    let mut filter = AuthorityFilter::new();
    let mut out = Vec::new();
    filter.feed(&connection(&frames), &mut out).unwrap();
    assert_eq!(filter.repaired(), 3);
    for ((_, want), block) in cases.iter().zip(blocks_of(&out)) {
        assert_eq!(block.fields, request(want));
    }
}

/// A connection mixing everything the filter handles: pass-through frames, DATA,
/// a block split into CONTINUATIONs, padding and priority, trailers.
fn mixed_connection() -> Vec<u8> {
    let mut enc = loona_hpack::Encoder::new();
    let mut block =
        |list: &[(&str, &str)]| enc.encode(list.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    let req = block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Controller/CreateVolume"),
        (":authority", "/tmp/csi.sock"),
        ("content-type", "application/grpc"),
        ("x-long", &"v".repeat(300)),
    ]);
    let (a, b) = req.split_at(100);
    let mut padded = vec![3u8];
    padded.extend_from_slice(&[0x80, 0, 0, 1, 15]);
    padded.extend(block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Identity/Probe"),
        (":authority", "/tmp/csi.sock"),
    ]));
    padded.extend_from_slice(&[0, 0, 0]);
    connection(&[
        frame(0x8, 0, 0, &[0, 1, 0, 0]),
        frame(TYPE_HEADERS, 0, 1, a),
        frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b),
        frame(0x0, 0, 1, &[7u8; 700]),
        headers_frame(1, &block(&[("grpc-timeout", "10S")])),
        frame(
            TYPE_HEADERS,
            FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &padded,
        ),
        frame(0x6, 0, 0, &[1; 8]),
    ])
}

#[test]
fn the_output_does_not_depend_on_how_the_input_is_split() {
    let input = mixed_connection();
    let whole = filter_all(&input).unwrap();
    for split in 0..=input.len() {
        let mut filter = AuthorityFilter::new();
        let mut out = Vec::new();
        filter.feed(&input[..split], &mut out).unwrap();
        filter.feed(&input[split..], &mut out).unwrap();
        assert_eq!(out, whole, "split at {split}");
    }
    let mut filter = AuthorityFilter::new();
    let mut out = Vec::new();
    for b in &input {
        filter.feed(std::slice::from_ref(b), &mut out).unwrap();
    }
    assert_eq!(out, whole, "one byte at a time");

    let frames = frames_of(&whole);
    let kinds: Vec<u8> = frames.iter().map(|(h, _)| h.kind).collect();
    // SETTINGS, WINDOW_UPDATE, request, DATA, trailers, padded request, PING.
    assert_eq!(
        kinds,
        [0x4, 0x8, TYPE_HEADERS, 0x0, TYPE_HEADERS, TYPE_HEADERS, 0x6]
    );
    assert_eq!(frames[3].1, vec![7u8; 700]);
    let blocks = blocks_of(&whole);
    let localhost = (b":authority".to_vec(), b"localhost".to_vec());
    assert_eq!(blocks[0].fields[3], localhost);
    assert_eq!(blocks[0].fields[5].1, "v".repeat(300).into_bytes());
    assert_eq!(blocks[1].fields, fields(&[("grpc-timeout", "10S")]));
    let padded = &blocks[2];
    assert_eq!((padded.stream, padded.end_stream), (3, true));
    assert_eq!(padded.priority.as_deref(), Some(&[0x80, 0, 0, 1, 15][..]));
    assert_eq!(padded.fields[3], localhost);
}

#[test]
fn a_huge_header_block_is_reframed_into_continuations() {
    let value = "x".repeat(100_000);
    let list = fields(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/p"),
        (":authority", "/run/x.sock"),
        ("x-huge", &value),
    ]);
    let block =
        loona_hpack::Encoder::new().encode(list.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
    let mut frames = Vec::new();
    let chunks: Vec<_> = block.chunks(20_000).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = if i + 1 == chunks.len() {
            FLAG_END_HEADERS
        } else {
            0
        };
        let kind = if i == 0 {
            TYPE_HEADERS
        } else {
            TYPE_CONTINUATION
        };
        let end_stream = if i == 0 { FLAG_END_STREAM } else { 0 };
        frames.push(frame(kind, last | end_stream, 7, c));
    }
    let out = filter_all(&connection(&frames)).unwrap();
    let out_frames = frames_of(&out);
    assert!(
        out_frames.len() > 7,
        "100 kB needs at least 7 frames of 16 KiB"
    );
    assert!(out_frames.iter().all(|(h, _)| h.len <= OUT_FRAME_MAX));
    let blocks = blocks_of(&out);
    assert_eq!(blocks.len(), 1);
    assert!(blocks[0].end_stream, "END_STREAM kept");
    assert_eq!(blocks[0].fields[3].1, b"localhost");
    assert_eq!(blocks[0].fields[4].1, value.into_bytes());
}

#[test]
fn oversized_blocks_are_refused_encoded_or_decoded() {
    // One frame announcing more than the limit.
    let mut head = Vec::new();
    FrameHead {
        len: MAX_HEADER_BLOCK + 1,
        kind: TYPE_HEADERS,
        flags: 0,
        stream: 1,
    }
    .write(&mut head);
    let mut input = connection(&[]);
    input.extend(head);
    assert!(matches!(
        filter_all(&input),
        Err(FilterError::TooLarge { stream: 1 })
    ));
    // CONTINUATIONs adding up past it.
    let chunk = vec![0u8; 600_000];
    let input = connection(&[
        frame(TYPE_HEADERS, 0, 1, &chunk),
        frame(TYPE_CONTINUATION, 0, 1, &chunk),
    ]);
    assert!(matches!(
        filter_all(&input),
        Err(FilterError::TooLarge { .. })
    ));
    // Empty CONTINUATIONs grow nothing but are counted: a flood of them is refused.
    let mut frames = vec![frame(TYPE_HEADERS, 0, 1, &[0x82])];
    frames.extend((0..=MAX_CONTINUATIONS).map(|_| frame(TYPE_CONTINUATION, 0, 1, &[])));
    assert!(matches!(
        filter_all(&connection(&frames)),
        Err(FilterError::TooManyContinuations { stream: 1 })
    ));
    // As many as a full-size block needs still pass.
    let mut frames = vec![frame(TYPE_HEADERS, 0, 1, &[0x82])];
    frames.extend((1..MAX_CONTINUATIONS).map(|_| frame(TYPE_CONTINUATION, 0, 1, &[])));
    frames.push(frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x84]));
    assert!(filter_all(&connection(&frames)).is_ok());
    // A small block that expands: one 4 000-byte table entry indexed 300 times.
    let mut first = Vec::new();
    first.push(0x40);
    encode_string(b"x-big", &mut first);
    encode_string(&[b'b'; 4000], &mut first);
    let bomb = vec![0x80 | 62; 300];
    let input = connection(&[headers_frame(1, &first), headers_frame(3, &bomb)]);
    assert!(matches!(
        filter_all(&input),
        Err(FilterError::TooLarge { stream: 3 })
    ));
}

#[test]
fn table_size_updates_are_honoured() {
    // Size 0 empties the table, so the entry added after it is gone at once and the
    // next block's reference to it is invalid.
    let mut first = vec![0x20, 0x40];
    encode_string(b"x-a", &mut first);
    encode_string(b"1", &mut first);
    let input = connection(&[headers_frame(1, &first), headers_frame(3, &[0x80 | 62])]);
    assert!(matches!(
        filter_all(&input),
        Err(FilterError::Hpack { stream: 3, .. })
    ));
    // Without the update the same reference is fine.
    let input = connection(&[
        headers_frame(1, &first[1..]),
        headers_frame(3, &[0x80 | 62]),
    ]);
    let blocks = blocks_of(&filter_all(&input).unwrap());
    assert_eq!(blocks[1].fields, fields(&[("x-a", "1")]));
    // A size beyond what the filter allows.
    let mut update = Vec::new();
    encode_integer(MAX_TABLE_SIZE + 1, 5, 0x20, &mut update);
    update.push(0x82);
    let input = connection(&[headers_frame(1, &update)]);
    assert!(matches!(filter_all(&input), Err(FilterError::Hpack { .. })));
}

#[test]
fn malformed_streams_are_errors() {
    assert!(matches!(
        filter_all(b"GET / HTTP/1.1\r\n"),
        Err(FilterError::Preface)
    ));
    let cont = connection(&[frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82])]);
    assert!(matches!(
        filter_all(&cont),
        Err(FilterError::UnexpectedContinuation { stream: 1 })
    ));
    let interleaved = connection(&[
        frame(TYPE_HEADERS, 0, 1, &[0x82]),
        frame(0x0, 0, 1, b"data"),
    ]);
    assert!(matches!(
        filter_all(&interleaved),
        Err(FilterError::Interleaved {
            kind: 0,
            stream: 1,
            block_stream: 1
        })
    ));
    let other_stream = connection(&[
        frame(TYPE_HEADERS, 0, 1, &[0x82]),
        frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[0x84]),
    ]);
    assert!(matches!(
        filter_all(&other_stream),
        Err(FilterError::Interleaved {
            block_stream: 1,
            ..
        })
    ));
    let bad_index = connection(&[headers_frame(1, &[0x80 | 70])]);
    assert!(matches!(
        filter_all(&bad_index),
        Err(FilterError::Hpack { stream: 1, .. })
    ));
    let bad_padding = connection(&[frame(
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_END_HEADERS,
        1,
        &[9, 0x82],
    )]);
    assert!(matches!(
        filter_all(&bad_padding),
        Err(FilterError::BadHeadersFrame { stream: 1 })
    ));
}

#[test]
fn integers_encode_as_rfc7541_c1_shows() {
    let enc = |v, prefix| {
        let mut out = Vec::new();
        encode_integer(v, prefix, 0, &mut out);
        out
    };
    assert_eq!(enc(10, 5), [0x0a]);
    assert_eq!(enc(1337, 5), [0x1f, 0x9a, 0x0a]);
    assert_eq!(enc(42, 8), [0x2a]);
    assert_eq!(enc(127, 7), [0x7f, 0x00]);
}

/// 16 KiB of header blocks that each index one 4 000-byte table entry 250 times: every
/// block re-encodes to about 1 MB. The stream must not filter a whole read ahead of its
/// reader (that buffered about 60 MB from one 16 KiB read).
#[tokio::test]
async fn an_expanding_read_is_buffered_one_block_at_a_time() {
    let mut first = vec![0x40];
    encode_string(b"x-big", &mut first);
    encode_string(&[b'b'; 4000], &mut first);
    let mut frames = vec![headers_frame(1, &first)];
    let bomb = [0x80 | 62; 250];
    let mut stream = 3;
    while frames.iter().map(Vec::len).sum::<usize>() < SCRATCH_LEN {
        frames.push(headers_frame(stream, &bomb));
        stream += 2;
    }
    let input = connection(&frames);
    let (mut client, server) = tokio::io::duplex(input.len() + 1);
    client.write_all(&input).await.unwrap();
    let mut filtered = FilteredStream::new(server);
    let mut byte = [0u8; 1];
    filtered.read_exact(&mut byte).await.unwrap();
    let buffered = filtered.out.len() - filtered.out_pos;
    assert!(
        buffered <= OUT_HIGH_WATER + MAX_HEADER_BLOCK + (64 << 10),
        "{buffered} bytes buffered after one byte was read"
    );
    // Everything still arrives, in order and complete.
    drop(client);
    let mut rest = byte.to_vec();
    filtered.read_to_end(&mut rest).await.unwrap();
    assert_eq!(rest, filter_all(&input).unwrap());
}

/// After a 1 MB header block has passed, an idle connection gives its memory back.
#[tokio::test]
async fn a_passed_large_block_does_not_keep_its_buffers() {
    let value = "x".repeat(900_000);
    let list = fields(&[(":authority", "/run/x.sock"), ("x-huge", &value)]);
    let block =
        loona_hpack::Encoder::new().encode(list.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
    let input = connection(&[headers_frame(1, &block)]);
    let (mut client, server) = tokio::io::duplex(64 << 10);
    let writer = tokio::spawn(async move { client.write_all(&input).await.unwrap() });
    let mut filtered = FilteredStream::new(server);
    let want = filter_all(&connection(&[headers_frame(1, &block)])).unwrap();
    let mut got = vec![0u8; want.len()];
    filtered.read_exact(&mut got).await.unwrap();
    writer.await.unwrap();
    assert_eq!(got, want);
    let held = filtered.out.capacity() + filtered.filter.payload.capacity();
    assert!(
        held <= 2 * KEEP_CAPACITY,
        "{held} bytes kept by an idle connection"
    );
}

#[tokio::test]
async fn the_stream_reads_filtered_bytes_and_fails_on_malformed_input() {
    let input = mixed_connection();
    let want = filter_all(&input).unwrap();
    let (mut client, server) = tokio::io::duplex(64);
    let writer = tokio::spawn(async move {
        client.write_all(&input).await.unwrap();
    });
    let mut got = Vec::new();
    FilteredStream::new(server)
        .read_to_end(&mut got)
        .await
        .unwrap();
    writer.await.unwrap();
    assert_eq!(got, want);

    let (mut client, server) = tokio::io::duplex(64);
    client.write_all(b"not http/2 at all").await.unwrap();
    let mut buf = [0u8; 64];
    let err = FilteredStream::new(server)
        .read(&mut buf)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}
