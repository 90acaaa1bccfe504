//! Serving gRPC clients that send a unix socket path as the HTTP/2 `:authority`.
//!
//! grpc C-core (≥ 1.57: Python grpcio, C++, Ruby …), grpc-java and older grpc-go put the
//! target of a `unix:` channel into `:authority`, raw (`/run/csi.sock`) or percent-encoded
//! (`%2Frun%2Fcsi.sock`). The HTTP/2 server under tonic (h2 0.4) parses `:authority` as a
//! URI authority and resets every such request with PROTOCOL_ERROR before a handler runs.
//! [`FilteredStream`] sits between the accepted socket and tonic and repairs the request
//! headers on the way in: an `:authority` that is not a valid URI authority becomes
//! `localhost` (a unix socket has no host, so nothing is lost).
//!
//! How: client-to-server bytes are parsed as HTTP/2 frames ([`AuthorityFilter`]). Every
//! frame but HEADERS and CONTINUATION passes through as it came (DATA payloads are copied
//! straight into the reader's buffer). A header block (HEADERS plus its CONTINUATIONs) is
//! HPACK-decoded with this connection's decoder (so the client's dynamic table and its size
//! updates are followed across requests), the `:authority` is fixed if needed, and the
//! block is re-encoded as literals without indexing and re-framed. Every block is
//! re-encoded, repaired or not: the server's decoder then never sees an indexed entry, so
//! its dynamic table stays empty and cannot disagree with the client's. Padding is dropped,
//! the priority fields and the END_STREAM flag are kept, and frames are at most 16 384
//! bytes, the smallest SETTINGS_MAX_FRAME_SIZE a server may announce. Server-to-client
//! bytes are not touched.
//!
//! Memory: a connection holds at most one header block being collected (≤
//! [`MAX_HEADER_BLOCK`]) and about 64 KiB of filtered bytes ahead of its reader plus one
//! re-encoded block, however far a block expands (HPACK indexing lets 1 byte stand for a
//! 4 KiB table entry) and however the client paces its bytes. Buffers a large block
//! grew are shrunk once it has passed.
//!
//! A stream that is not HTTP/2 or a header block that does not decode closes the
//! connection (the read fails with `InvalidData`, logged once as a warning); h2 would have
//! closed it too.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Stream dependency and weight of a HEADERS frame with the PRIORITY flag.
const PRIORITY_LEN: usize = 5;
/// Largest payload of a frame this filter writes: the minimum of SETTINGS_MAX_FRAME_SIZE,
/// which every server accepts, whatever it announced.
const OUT_FRAME_MAX: usize = 16_384;
/// Largest header block accepted, encoded or decoded. The limit of tonic's server on a
/// decoded header list (hyper's default, 16 KiB) is smaller, so a block this filter passes
/// is never the one too big for the server.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Most CONTINUATION frames one header block may have. A client that fills frames to the
/// default 16 KiB needs 64 for [`MAX_HEADER_BLOCK`]; empty CONTINUATIONs grow nothing, so
/// without a count a client could keep a block open forever at our CPU's cost (the
/// "CONTINUATION flood" that h2 bounds the same way).
pub const MAX_CONTINUATIONS: usize = 128;
/// Largest HPACK dynamic table a client may ask for with a size update. h2 announces none,
/// so clients keep the default 4 096; the slack costs nothing until a client uses it.
const MAX_TABLE_SIZE: usize = 64 << 10;
/// What replaces an `:authority` that is not a URI authority.
const REPLACEMENT: &[u8] = b"localhost";
const AUTHORITY: &[u8] = b":authority";

/// Why a client connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// The first bytes are not the HTTP/2 client preface.
    #[error("the client did not start with the HTTP/2 connection preface")]
    Preface,
    /// A CONTINUATION frame without a header block to continue.
    #[error("CONTINUATION frame on stream {stream} continues no header block")]
    UnexpectedContinuation {
        /// The frame's stream.
        stream: u32,
    },
    /// Another frame inside a header block (RFC 9113 §6.10 forbids it).
    #[error(
        "frame of type {kind:#x} on stream {stream} interrupts the header block of stream {block_stream}"
    )]
    Interleaved {
        /// The frame's type.
        kind: u8,
        /// The frame's stream.
        stream: u32,
        /// The stream whose header block is open.
        block_stream: u32,
    },
    /// Padding or priority fields longer than the HEADERS frame.
    #[error("HEADERS frame on stream {stream} is shorter than its padding and priority fields")]
    BadHeadersFrame {
        /// The frame's stream.
        stream: u32,
    },
    /// The header block is larger than [`MAX_HEADER_BLOCK`].
    #[error("header block on stream {stream} is larger than {MAX_HEADER_BLOCK} bytes")]
    TooLarge {
        /// The block's stream.
        stream: u32,
    },
    /// The header block has more than [`MAX_CONTINUATIONS`] CONTINUATION frames.
    #[error(
        "header block on stream {stream} has more than {MAX_CONTINUATIONS} CONTINUATION frames"
    )]
    TooManyContinuations {
        /// The block's stream.
        stream: u32,
    },
    /// The header block is not valid HPACK.
    #[error("header block on stream {stream} is not valid HPACK")]
    Hpack {
        /// The block's stream.
        stream: u32,
        /// The decoder's complaint.
        #[source]
        source: loona_hpack::decoder::DecoderError,
    },
}

/// A frame header, parsed.
#[derive(Debug, Clone, Copy)]
struct FrameHead {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHead {
    fn parse(b: &[u8; FRAME_HEADER_LEN]) -> Self {
        Self {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    fn write(self, out: &mut Vec<u8>) {
        let len = u32::try_from(self.len).expect("frames written here are at most 16 KiB");
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// Where the filter is in the client's byte stream.
#[derive(Debug)]
enum State {
    /// Inside the connection preface, `seen` bytes of it checked.
    Preface { seen: usize },
    /// Reading a frame header.
    Head {
        buf: [u8; FRAME_HEADER_LEN],
        have: usize,
    },
    /// Inside the payload of a frame that passes through.
    Pass { left: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    Block { head: FrameHead, left: usize },
}

/// A header block waiting for its END_HEADERS.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
    /// CONTINUATION frames seen so far, bounded by [`MAX_CONTINUATIONS`].
    continuations: usize,
}

/// The client-to-server half of an HTTP/2 connection, with `:authority` repaired.
///
/// Sans-IO: [`AuthorityFilter::feed`] takes bytes as they arrive, in pieces of any size,
/// and appends what the server should read.
pub struct AuthorityFilter {
    state: State,
    payload: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: loona_hpack::Decoder<'static>,
    repaired: u64,
}

impl std::fmt::Debug for AuthorityFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFilter")
            .field("state", &self.state)
            .field("open", &self.open)
            .field("repaired", &self.repaired)
            .finish_non_exhaustive()
    }
}

impl Default for AuthorityFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl AuthorityFilter {
    /// A filter at the start of a connection.
    #[must_use]
    pub fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Self {
            state: State::Preface { seen: 0 },
            payload: Vec::new(),
            open: None,
            decoder,
            repaired: 0,
        }
    }

    /// How many `:authority` values were replaced so far.
    #[must_use]
    pub fn repaired(&self) -> u64 {
        self.repaired
    }

    /// Bytes of a pass-through payload still to come, which a reader may copy without
    /// [`AuthorityFilter::feed`] (then reporting them with [`AuthorityFilter::passed`]).
    #[must_use]
    pub fn passthrough(&self) -> Option<usize> {
        match self.state {
            State::Pass { left } if left > 0 => Some(left),
            State::Pass { .. }
            | State::Preface { .. }
            | State::Head { .. }
            | State::Block { .. } => None,
        }
    }

    /// Records `n` bytes of a pass-through payload copied by the reader itself.
    ///
    /// # Panics
    /// `n` is more than [`AuthorityFilter::passthrough`] allowed.
    pub fn passed(&mut self, n: usize) {
        let State::Pass { left } = &mut self.state else {
            panic!("passed() outside a pass-through payload");
        };
        *left = left.checked_sub(n).expect("passed() beyond the payload");
        if *left == 0 {
            self.state = Self::head();
        }
    }

    fn head() -> State {
        State::Head {
            buf: [0; FRAME_HEADER_LEN],
            have: 0,
        }
    }

    /// Processes client bytes, appending what the server should see to `out`.
    ///
    /// # Errors
    /// The bytes are not an HTTP/2 client stream this filter can follow; the connection
    /// must be closed.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), FilterError> {
        self.feed_until(input, out, usize::MAX).map(drop)
    }

    /// [`AuthorityFilter::feed`] that stops taking input once `out` holds `limit` bytes or
    /// more, and returns how many bytes of `input` it took; the rest must be fed again.
    ///
    /// A header block can expand about 4 000-fold (each one-byte index repeats a table
    /// entry as a literal), so a reader bounds what it buffers with this, not with the
    /// size of its reads: `out` ends at most one re-encoded block (about
    /// [`MAX_HEADER_BLOCK`]) beyond `limit`.
    ///
    /// # Errors
    /// As [`AuthorityFilter::feed`].
    pub fn feed_until(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Result<usize, FilterError> {
        let total = input.len();
        while !input.is_empty() && out.len() < limit {
            match &mut self.state {
                State::Preface { seen } => {
                    let n = (PREFACE.len() - *seen).min(input.len());
                    if input[..n] != PREFACE[*seen..*seen + n] {
                        return Err(FilterError::Preface);
                    }
                    out.extend_from_slice(&input[..n]);
                    *seen += n;
                    input = &input[n..];
                    if *seen == PREFACE.len() {
                        self.state = Self::head();
                    }
                }
                State::Head { buf, have } => {
                    let n = (FRAME_HEADER_LEN - *have).min(input.len());
                    buf[*have..*have + n].copy_from_slice(&input[..n]);
                    *have += n;
                    input = &input[n..];
                    if *have == FRAME_HEADER_LEN {
                        let raw = *buf;
                        self.start_frame(&raw, out)?;
                    }
                }
                State::Pass { left } => {
                    let n = (*left).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.passed(n);
                }
                State::Block { head, left } => {
                    let n = (*left).min(input.len());
                    self.payload.extend_from_slice(&input[..n]);
                    *left -= n;
                    input = &input[n..];
                    if *left == 0 {
                        let head = *head;
                        self.finish_block_frame(head, out)?;
                    }
                }
            }
        }
        Ok(total - input.len())
    }

    fn start_frame(
        &mut self,
        raw: &[u8; FRAME_HEADER_LEN],
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        let head = FrameHead::parse(raw);
        let is_block = head.kind == TYPE_HEADERS || head.kind == TYPE_CONTINUATION;
        match &self.open {
            Some(open) if head.kind != TYPE_CONTINUATION || head.stream != open.stream => {
                return Err(FilterError::Interleaved {
                    kind: head.kind,
                    stream: head.stream,
                    block_stream: open.stream,
                });
            }
            Some(open) if open.fragment.len() + head.len > MAX_HEADER_BLOCK => {
                return Err(FilterError::TooLarge {
                    stream: head.stream,
                });
            }
            Some(open) if open.continuations >= MAX_CONTINUATIONS => {
                return Err(FilterError::TooManyContinuations {
                    stream: head.stream,
                });
            }
            None if head.kind == TYPE_CONTINUATION => {
                return Err(FilterError::UnexpectedContinuation {
                    stream: head.stream,
                });
            }
            None if is_block && head.len > MAX_HEADER_BLOCK => {
                return Err(FilterError::TooLarge {
                    stream: head.stream,
                });
            }
            Some(_) | None => {}
        }
        if is_block {
            self.payload.clear();
            self.state = State::Block {
                head,
                left: head.len,
            };
            if head.len == 0 {
                self.finish_block_frame(head, out)?;
            }
        } else {
            out.extend_from_slice(raw);
            self.state = State::Pass { left: head.len };
            if head.len == 0 {
                self.state = Self::head();
            }
        }
        Ok(())
    }

    /// A HEADERS or CONTINUATION payload is complete.
    fn finish_block_frame(
        &mut self,
        head: FrameHead,
        out: &mut Vec<u8>,
    ) -> Result<(), FilterError> {
        self.state = Self::head();
        if head.kind == TYPE_HEADERS {
            let bad = || FilterError::BadHeadersFrame {
                stream: head.stream,
            };
            let mut p = self.payload.as_slice();
            let mut pad = 0;
            if head.flags & FLAG_PADDED != 0 {
                let (&n, rest) = p.split_first().ok_or_else(bad)?;
                pad = usize::from(n);
                p = rest;
            }
            let mut priority = None;
            if head.flags & FLAG_PRIORITY != 0 {
                let (fields, rest) = p.split_first_chunk::<PRIORITY_LEN>().ok_or_else(bad)?;
                priority = Some(*fields);
                p = rest;
            }
            let fragment = p
                .get(..p.len().checked_sub(pad).ok_or_else(bad)?)
                .ok_or_else(bad)?;
            self.open = Some(OpenBlock {
                stream: head.stream,
                end_stream: head.flags & FLAG_END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
                continuations: 0,
            });
        } else if let Some(open) = &mut self.open {
            open.fragment.extend_from_slice(&self.payload);
            open.continuations += 1;
        }
        self.payload.clear();
        self.payload.shrink_to(KEEP_CAPACITY);
        if head.flags & FLAG_END_HEADERS != 0
            && let Some(block) = self.open.take()
        {
            self.emit(&block, out)?;
        }
        Ok(())
    }

    /// Decodes a complete header block, repairs it and writes it out as new frames.
    fn emit(&mut self, block: &OpenBlock, out: &mut Vec<u8>) -> Result<(), FilterError> {
        let stream = block.stream;
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        let mut decoded_size = 0usize;
        let mut repaired = 0u64;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                // RFC 7541 §4.1's entry size; an indexed field can repeat a large table
                // entry many times, so the bound is on what the fields expand to.
                decoded_size = decoded_size.saturating_add(name.len() + value.len() + 32);
                if decoded_size > MAX_HEADER_BLOCK {
                    return;
                }
                let value: &[u8] = if &*name == AUTHORITY
                    && http::uri::Authority::try_from(&*value).is_err()
                {
                    tracing::debug!(stream, authority = %String::from_utf8_lossy(&value).escape_debug(),
                        "replacing an :authority that is not a URI authority with localhost");
                    repaired += 1;
                    REPLACEMENT
                } else {
                    &value
                };
                encode_literal(&name, value, &mut encoded);
            })
            .map_err(|source| FilterError::Hpack { stream, source })?;
        if decoded_size > MAX_HEADER_BLOCK {
            return Err(FilterError::TooLarge { stream });
        }
        self.repaired += repaired;
        write_header_frames(block, &encoded, out);
        Ok(())
    }
}

/// A literal header field without indexing, new name, no Huffman (RFC 7541 §6.2.2).
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    encode_string(name, out);
    encode_string(value, out);
}

/// A string literal without Huffman coding (RFC 7541 §5.2).
fn encode_string(s: &[u8], out: &mut Vec<u8>) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// An integer with an N-bit prefix (RFC 7541 §5.1); `flags` fills the bits above it.
fn encode_integer(mut value: usize, prefix_bits: u8, flags: u8, out: &mut Vec<u8>) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(flags | u8::try_from(value).expect("below the prefix maximum"));
        return;
    }
    out.push(flags | u8::try_from(max_prefix).expect("prefixes are at most 7 bits here"));
    value -= max_prefix;
    while value >= 0x80 {
        out.push(u8::try_from(value & 0x7f).expect("7 bits") | 0x80);
        value >>= 7;
    }
    out.push(u8::try_from(value).expect("below 0x80"));
}

/// HEADERS (with the block's priority and END_STREAM) and as many CONTINUATIONs as needed.
fn write_header_frames(block: &OpenBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let prio_len = if block.priority.is_some() {
        PRIORITY_LEN
    } else {
        0
    };
    let first_len = encoded.len().min(OUT_FRAME_MAX - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    FrameHead {
        len: prio_len + first.len(),
        kind: TYPE_HEADERS,
        flags,
        stream: block.stream,
    }
    .write(out);
    if let Some(p) = &block.priority {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(OUT_FRAME_MAX));
        rest = tail;
        FrameHead {
            len: chunk.len(),
            kind: TYPE_CONTINUATION,
            flags: if rest.is_empty() { FLAG_END_HEADERS } else { 0 },
            stream: block.stream,
        }
        .write(out);
        out.extend_from_slice(chunk);
    }
}

/// An accepted connection whose client-to-server bytes go through an [`AuthorityFilter`].
#[derive(Debug)]
pub struct FilteredStream<S> {
    inner: S,
    filter: AuthorityFilter,
    /// Filtered bytes not yet handed to the reader, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    /// Where raw bytes land before they are filtered (not used for pass-through payloads);
    /// `scratch[raw_pos..raw_end]` is read but not yet fed.
    scratch: Box<[u8]>,
    raw_pos: usize,
    raw_end: usize,
}

/// Size of one raw read from the socket.
const SCRATCH_LEN: usize = 16 << 10;
/// Filtered bytes buffered before raw input waits for the reader to take them.
const OUT_HIGH_WATER: usize = 64 << 10;
/// Capacity an idle buffer keeps: a large header block's memory is given back once it
/// has passed, so an idle connection holds little however large its past blocks were.
const KEEP_CAPACITY: usize = 2 * OUT_HIGH_WATER;

impl<S> FilteredStream<S> {
    /// Wraps a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            filter: AuthorityFilter::new(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; SCRATCH_LEN].into_boxed_slice(),
            raw_pos: 0,
            raw_end: 0,
        }
    }

    /// The wrapped connection.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FilteredStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                    // One large block must not pin its memory for the connection's life.
                    this.out.shrink_to(KEEP_CAPACITY);
                }
                return Poll::Ready(Ok(()));
            }
            if this.raw_pos < this.raw_end {
                let raw = &this.scratch[this.raw_pos..this.raw_end];
                match this.filter.feed_until(raw, &mut this.out, OUT_HIGH_WATER) {
                    Ok(n) => this.raw_pos += n,
                    Err(e) => {
                        tracing::warn!(error = %slrp_types::DisplayChain(&e),
                            "closing a CSI client connection: its HTTP/2 request headers cannot be read");
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
                continue;
            }
            if let Some(left) = this.filter.passthrough() {
                // DATA and other pass-through payloads go straight into the reader's buffer.
                let dst = buf.initialize_unfilled_to(left.min(buf.remaining()));
                let mut direct = ReadBuf::new(dst);
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut direct))?;
                let n = direct.filled().len();
                buf.advance(n);
                this.filter.passed(n);
                return Poll::Ready(Ok(()));
            }
            let mut raw = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut raw))?;
            if raw.filled().is_empty() {
                // EOF, even inside a frame: h2 sees the truncation and handles it.
                return Poll::Ready(Ok(()));
            }
            this.raw_pos = 0;
            this.raw_end = raw.filled().len();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FilteredStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FilteredStream<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
