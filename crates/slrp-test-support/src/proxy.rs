//! [`FaultProxy`]: a loopback TCP proxy in front of an agent (or the embedded manager)
//! whose behaviour a test switches at run time, to show how the provider copes with a
//! broken agent connection (issue #10: spec §2.4 and §12 item 16).
//!
//! # Modes ([`Mode`], for connections accepted from then on)
//! - [`Mode::PassThrough`]: bytes are forwarded both ways. A target that does not accept
//!   gets the client's connection reset, as a refusing agent.
//! - [`Mode::Refuse`]: the listener is closed, so the kernel refuses connections
//!   (`ECONNREFUSED`); live connections are closed. The kernel's refusals cannot be seen
//!   from user space, so they are not counted.
//! - [`Mode::Reset`]: the listener stays open; every connection is counted
//!   ([`Stats::resets`]) and reset at once (`SO_LINGER` 0). The client sees each attempt
//!   fail at its first I/O, which is how a test counts the attempts of a client facing a
//!   dead agent. Live connections are closed.
//! - [`Mode::BlackHole`]: connections are accepted and kept open, and nothing is forwarded
//!   in either direction, also on live connections: a peer that stopped answering. The
//!   proxy's kernel still acknowledges every segment and answers keepalive probes, so only
//!   the client's own timeouts (subscribe, call) can notice; a vanished host is the
//!   network-namespace test of `slrp-agent` (`vanished_peer.rs`).
//!
//! # One-shot faults (armed on live and future connections)
//! - [`FaultProxy::answer_503`]: the next `n` HTTP/1 requests are answered
//!   `503 Service Unavailable` by the proxy (the request is not forwarded) and their
//!   connection is closed. Requests are framed by `Content-Length`; a request with
//!   `Transfer-Encoding` switches that connection to plain forwarding.
//! - [`FaultProxy::cut_stream_after`]: the next event stream (a response carrying
//!   `Mesos-Stream-Id`) is cut after `k` more bytes of its body: mid-record for a small
//!   `k`.
//! - [`FaultProxy::cut_all`]: every live connection is closed now.
//!
//! [`FaultProxy::stats`] is a `watch` of [`Stats`], so tests wait for a count instead of
//! sleeping.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with new connections (and, for some modes, live ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    PassThrough,
    /// Stop listening: connections are refused by the kernel; live ones are closed.
    Refuse,
    /// Accept, count and reset every connection at once; live ones are closed.
    Reset,
    /// Accept and hold connections, forwarding nothing (also on live connections).
    BlackHole,
}

/// Counters of what the proxy did, for tests to wait on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections forwarded to the target.
    pub forwarded: u64,
    /// Connections reset in [`Mode::Reset`] (connection attempts of the client).
    pub resets: u64,
    /// Connections accepted in [`Mode::PassThrough`] whose target did not accept.
    pub target_refused: u64,
    /// Requests seen on forwarded connections (including those answered 503).
    pub requests: u64,
    /// Requests answered 503 by the proxy.
    pub answered_503: u64,
    /// Event streams cut by [`FaultProxy::cut_stream_after`].
    pub stream_cuts: u64,
    /// Connections accepted in [`Mode::BlackHole`].
    pub black_holed: u64,
    /// How long each black-holed connection stayed open until its client closed it, in
    /// order: how long the client took to give up on a silent peer.
    pub black_hole_held: Vec<Duration>,
}

struct Shared {
    target: Mutex<SocketAddr>,
    mode: watch::Sender<Mode>,
    /// Bumped by `cut_all`; every connection ends when it changes.
    epoch: watch::Sender<u64>,
    pending_503: Mutex<u64>,
    /// Bytes of stream body still to forward before the armed cut.
    cut_after: Mutex<Option<usize>>,
    stats: watch::Sender<Stats>,
}

impl Shared {
    fn count(&self, update: impl FnOnce(&mut Stats)) {
        self.stats.send_modify(update);
    }

    fn take_503(&self) -> bool {
        let mut pending = self
            .pending_503
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *pending == 0 {
            return false;
        }
        *pending -= 1;
        true
    }
}

/// The proxy; dropping it stops it and closes every connection.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("mode", &*self.shared.mode.borrow())
            .finish_non_exhaustive()
    }
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    // Re-listening on the same port after `Refuse` must not wait for TIME_WAIT sockets.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl FaultProxy {
    /// Listens on a free loopback port, forwarding to `target`, in [`Mode::PassThrough`].
    ///
    /// # Errors
    /// Binding the listener failed.
    pub async fn start(target: SocketAddr) -> io::Result<Self> {
        let listener = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            mode: watch::Sender::new(Mode::PassThrough),
            epoch: watch::Sender::new(0),
            pending_503: Mutex::new(0),
            cut_after: Mutex::new(None),
            stats: watch::Sender::new(Stats::default()),
        });
        let accept = tokio::spawn(accept_loop(Arc::clone(&shared), listener, addr));
        Ok(Self {
            shared,
            addr,
            accept,
        })
    }

    /// The proxy's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`: an `--agent` URL that reaches the target through the proxy.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Forwards new connections to `target` from now on (e.g. a restarted manager).
    pub fn set_target(&self, target: SocketAddr) {
        *self
            .shared
            .target
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = target;
    }

    /// Switches the mode (see [`Mode`]).
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// The current mode.
    #[must_use]
    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Answers the next `n` requests `503 Service Unavailable` (added to any still pending).
    pub fn answer_503(&self, n: u64) {
        *self
            .shared
            .pending_503
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += n;
    }

    /// Cuts the next event stream after `k` more bytes of its body (its connection is
    /// closed). One-shot.
    pub fn cut_stream_after(&self, k: usize) {
        *self
            .shared
            .cut_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(k);
    }

    /// Closes every live connection now.
    pub fn cut_all(&self) {
        self.shared.epoch.send_modify(|epoch| *epoch += 1);
    }

    /// The counters, updated as things happen.
    #[must_use]
    pub fn stats(&self) -> watch::Receiver<Stats> {
        self.shared.stats.subscribe()
    }

    /// Waits until `ready` holds for the counters, at most `within`.
    ///
    /// # Errors
    /// The counters as they were when the time ran out.
    pub async fn wait_for(
        &self,
        within: Duration,
        ready: impl FnMut(&Stats) -> bool,
    ) -> Result<Stats, Stats> {
        let mut stats = self.stats();
        let seen = tokio::time::timeout(within, stats.wait_for(ready))
            .await
            .map(|seen| seen.map(|seen| seen.clone()));
        match seen {
            Ok(Ok(seen)) => Ok(seen),
            _ => Err(stats.borrow().clone()),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Live connections end on Refuse.
        self.shared.mode.send_replace(Mode::Refuse);
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, addr: SocketAddr) {
    let mut mode = shared.mode.subscribe();
    let mut listener = Some(listener);
    loop {
        let current = *mode.borrow_and_update();
        if current == Mode::Refuse {
            listener = None;
            if mode.changed().await.is_err() {
                return;
            }
            continue;
        }
        let active = match listener.take() {
            Some(active) => active,
            None => match rebind(addr).await {
                Some(active) => active,
                None => return,
            },
        };
        tokio::select! {
            accepted = active.accept() => {
                if let Ok((stream, _)) = accepted {
                    handle(&shared, stream, current);
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        listener = Some(active);
    }
}

/// Listens on the same port again after [`Mode::Refuse`]. The port was ours a moment ago;
/// a few tries cover a racing ephemeral connect that took it meanwhile.
async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..50 {
        if let Ok(listener) = bind(addr) {
            return Some(listener);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("fault proxy: cannot listen on {addr} again; it stops");
    None
}

fn handle(shared: &Arc<Shared>, stream: TcpStream, mode: Mode) {
    match mode {
        Mode::Refuse => {}
        Mode::Reset => {
            shared.count(|s| s.resets += 1);
            reset(&stream);
        }
        Mode::BlackHole => {
            shared.count(|s| s.black_holed += 1);
            tokio::spawn(black_hole(Arc::clone(shared), stream));
        }
        Mode::PassThrough => {
            tokio::spawn(forward(Arc::clone(shared), stream));
        }
    }
}

/// Closes `stream` with a reset instead of a FIN: what a client sees from a refusing peer
/// at its first I/O.
fn reset(stream: &TcpStream) {
    // Without the option the close is a FIN, which still fails the client's attempt.
    let _ = stream.set_zero_linger();
}

/// Holds the connection, reading and discarding, until the client closes it or the
/// connection is cut.
async fn black_hole(shared: Arc<Shared>, mut stream: TcpStream) {
    let opened = tokio::time::Instant::now();
    let mut epoch = shared.epoch.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let held = opened.elapsed();
                    shared.count(|s| s.black_hole_held.push(held));
                    return;
                }
                Ok(_) => {}
            },
            _ = epoch.changed() => return,
        }
    }
}

/// Resolves when the connection must end: a cut, or a mode that closes live connections.
async fn ended(shared: &Shared) {
    let mut epoch = shared.epoch.subscribe();
    let mut mode = shared.mode.subscribe();
    let closes = |mode: &Mode| matches!(mode, Mode::Refuse | Mode::Reset);
    tokio::select! {
        _ = epoch.changed() => {}
        _ = mode.wait_for(closes) => {}
    }
}

async fn forward(shared: Arc<Shared>, client: TcpStream) {
    let target = *shared.target.lock().unwrap_or_else(PoisonError::into_inner);
    let Ok(server) = TcpStream::connect(target).await else {
        shared.count(|s| s.target_refused += 1);
        reset(&client);
        return;
    };
    shared.count(|s| s.forwarded += 1);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let client_write = Arc::new(tokio::sync::Mutex::new(client_write));
    tokio::select! {
        () = requests(&shared, client_read, server_write, Arc::clone(&client_write)) => {}
        () = responses(&shared, server_read, client_write) => {}
        () = ended(&shared) => {}
    }
}

/// The next bytes to forward, or `None` at EOF or an error. In [`Mode::BlackHole`] what is
/// read is dropped.
async fn read_forwardable(
    shared: &Shared,
    from: &mut OwnedReadHalf,
    buf: &mut [u8],
) -> Option<usize> {
    loop {
        match from.read(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) if *shared.mode.borrow() == Mode::BlackHole => {}
            Ok(n) => return Some(n),
        }
    }
}

/// Position just past the `\r\n\r\n` ending an HTTP/1 head, if `buf` holds one.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// The value of header `name` in an HTTP/1 head (case-insensitive name).
fn header<'a>(head: &'a [u8], name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(head).ok()?;
    text.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then_some(value.trim())
    })
}

const SERVICE_UNAVAILABLE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
    Content-Type: text/plain; charset=utf-8\r\n\
    Content-Length: 30\r\n\
    Connection: close\r\n\r\n\
    Injected by the test proxy 503";

/// Client → target: frames requests (head + `Content-Length` body) so that one can be
/// answered 503 instead of forwarded.
async fn requests(
    shared: &Shared,
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    client: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    // Body bytes of the current request still to pass through unparsed.
    let mut body_left = 0usize;
    let mut framed = true;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Some(n) = read_forwardable(shared, &mut from, &mut buf).await else {
            return;
        };
        if !framed {
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        loop {
            if body_left > 0 {
                let take = body_left.min(pending.len());
                if take == 0 {
                    break;
                }
                if to.write_all(&pending[..take]).await.is_err() {
                    return;
                }
                pending.drain(..take);
                body_left -= take;
                continue;
            }
            let Some(end) = head_end(&pending) else { break };
            shared.count(|s| s.requests += 1);
            if shared.take_503() {
                shared.count(|s| s.answered_503 += 1);
                let mut client = client.lock().await;
                let _ = client.write_all(SERVICE_UNAVAILABLE).await;
                let _ = client.shutdown().await;
                return;
            }
            let head = &pending[..end];
            if header(head, "transfer-encoding").is_some() {
                framed = false;
            }
            body_left = header(head, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if to.write_all(head).await.is_err() {
                return;
            }
            pending.drain(..end);
            if !framed {
                if to.write_all(&pending).await.is_err() {
                    return;
                }
                pending.clear();
                break;
            }
        }
    }
}

/// With a cut armed: how much of the next `len` bytes to pass before cutting, if the cut
/// lands within them (disarming it); otherwise counts them against it.
fn take_cut(shared: &Shared, len: usize) -> Option<usize> {
    let mut armed = shared
        .cut_after
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match *armed {
        Some(left) if left <= len => {
            *armed = None;
            Some(left)
        }
        Some(left) => {
            *armed = Some(left - len);
            None
        }
        None => None,
    }
}

/// Target → client: forwards, spotting an event stream by its first response head so that
/// an armed cut lands inside its body.
async fn responses(
    shared: &Shared,
    mut from: OwnedReadHalf,
    to: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
) {
    let mut head: Option<Vec<u8>> = Some(Vec::new());
    let mut stream = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Some(n) = read_forwardable(shared, &mut from, &mut buf).await else {
            return;
        };
        let mut chunk = &buf[..n];
        let mut out = to.lock().await;
        if let Some(seen) = head.as_mut() {
            seen.extend_from_slice(chunk);
            let Some(end) = head_end(seen) else {
                if out.write_all(chunk).await.is_err() {
                    return;
                }
                continue;
            };
            stream = header(&seen[..end], "mesos-stream-id").is_some();
            // Forward the rest of the head; what follows it is body.
            let head_in_chunk = chunk.len() - (seen.len() - end);
            if out.write_all(&chunk[..head_in_chunk]).await.is_err() {
                return;
            }
            chunk = &chunk[head_in_chunk..];
            head = None;
        }
        if stream && let Some(pass) = take_cut(shared, chunk.len()) {
            let _ = out.write_all(&chunk[..pass]).await;
            let _ = out.flush().await;
            shared.count(|s| s.stream_cuts += 1);
            return;
        }
        if out.write_all(chunk).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// A target that echoes what it reads, counting its connections.
    async fn echo() -> (SocketAddr, watch::Receiver<u64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (count, counted) = watch::channel(0u64);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                count.send_modify(|n| *n += 1);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (addr, counted)
    }

    /// A proxy in front of [`echo`], and a connection through it that round-tripped a
    /// request.
    async fn echo_proxy() -> (FaultProxy, TcpStream, watch::Receiver<u64>) {
        let (target, connections) = echo().await;
        let proxy = FaultProxy::start(target).await.expect("proxy");
        let mut live = TcpStream::connect(proxy.addr()).await.expect("connect");
        round_trip(&mut live).await;
        (proxy, live, connections)
    }

    async fn round_trip(stream: &mut TcpStream) {
        let sent = request("ping");
        stream.write_all(&sent).await.expect("write");
        assert_eq!(read_some(stream, sent.len()).await, sent);
    }

    async fn read_some(stream: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        tokio::time::timeout(WAIT, stream.read_exact(&mut out))
            .await
            .expect("in time")
            .expect("read");
        out
    }

    /// Reads until EOF or an error; `true` when the peer closed (EOF or reset).
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = vec![0u8; 4096];
        loop {
            match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    fn request(body: &str) -> Vec<u8> {
        format!(
            "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn passes_through_and_answers_503_to_the_next_requests() {
        let (proxy, mut client, _) = echo_proxy().await;

        proxy.answer_503(1);
        client.write_all(&request("two")).await.expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(WAIT, client.read_to_end(&mut answer))
            .await
            .expect("in time")
            .expect("read");
        assert!(answer.starts_with(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(answer.ends_with(b"Injected by the test proxy 503"));

        // The fault was one-shot: the next connection passes again.
        let mut again = TcpStream::connect(proxy.addr()).await.expect("connect");
        round_trip(&mut again).await;
        let stats = proxy.stats().borrow().clone();
        assert_eq!(
            (stats.requests, stats.answered_503, stats.forwarded),
            (3, 1, 2)
        );
    }

    #[tokio::test]
    async fn refuses_resets_and_counts_then_listens_again() {
        let (proxy, mut live, _) = echo_proxy().await;

        proxy.set_mode(Mode::Refuse);
        assert!(closed(&mut live).await, "a live connection is closed");
        let mut early = 0;
        let refused = loop {
            // The listener closes asynchronously; until then a connect may still land.
            match TcpStream::connect(proxy.addr()).await {
                Err(error) => break error,
                Ok(mut stream) => assert!(closed(&mut stream).await),
            }
            early += 1;
            assert!(early < 100, "the listener was not closed");
        };
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);

        proxy.set_mode(Mode::Reset);
        let mut attempts = 0;
        while proxy.stats().borrow().resets < 3 {
            if let Ok(mut attempt) = TcpStream::connect(proxy.addr()).await {
                attempts += 1;
                let _ = attempt.write_all(b"x").await;
                assert!(closed(&mut attempt).await, "reset at once");
            }
            assert!(attempts < 100, "the listener came back in Reset mode");
        }
        assert_eq!(proxy.stats().borrow().resets, attempts);

        proxy.set_mode(Mode::PassThrough);
        let mut back = loop {
            if let Ok(stream) = TcpStream::connect(proxy.addr()).await {
                break stream;
            }
        };
        round_trip(&mut back).await;
    }

    #[tokio::test]
    async fn black_hole_holds_connections_and_forwards_nothing() {
        let (proxy, mut live, connections) = echo_proxy().await;

        proxy.set_mode(Mode::BlackHole);
        let mut held = TcpStream::connect(proxy.addr()).await.expect("accepted");
        held.write_all(&request("b"))
            .await
            .expect("written into the hole");
        live.write_all(&request("c"))
            .await
            .expect("written into the hole");
        proxy
            .wait_for(WAIT, |s| s.black_holed == 1)
            .await
            .expect("held");
        // Silence can only be observed for a while: a read that returns data or EOF
        // within 200 ms fails here (the echo target would answer in microseconds).
        let mut buf = [0u8; 1];
        let silent = tokio::time::timeout(Duration::from_millis(200), held.read(&mut buf)).await;
        assert!(silent.is_err(), "the black hole answered: {silent:?}");
        let silent = tokio::time::timeout(Duration::from_millis(200), live.read(&mut buf)).await;
        assert!(silent.is_err(), "the live connection answered: {silent:?}");
        assert_eq!(*connections.borrow(), 1, "nothing reached the target");

        drop(held);
        let stats = proxy
            .wait_for(WAIT, |s| s.black_hole_held.len() == 1)
            .await
            .expect("the client's close is seen");
        assert!(stats.black_hole_held[0] >= Duration::from_millis(200));
    }

    const STREAM_HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\nMesos-Stream-Id: s\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[tokio::test]
    async fn cuts_an_event_stream_after_k_body_bytes() {
        // A target answering like the manager's SUBSCRIBE: a head, then records.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = listener.local_addr().expect("addr");
        let (more, mut more_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let _ = stream.read(&mut buf).await;
            stream.write_all(STREAM_HEAD).await.expect("head");
            while let Some(bytes) = more_rx.recv().await {
                if stream.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        });
        let proxy = FaultProxy::start(target).await.expect("proxy");
        let mut client = TcpStream::connect(proxy.addr()).await.expect("connect");
        client
            .write_all(&request("subscribe"))
            .await
            .expect("write");
        let first = b"6\r\n3\nabc\r\n".to_vec();
        more.send(first.clone()).await.expect("send");
        let got = read_some(&mut client, STREAM_HEAD.len() + first.len()).await;
        assert!(got.ends_with(&first));

        proxy.cut_stream_after(5);
        more.send(b"9\r\n6\nabcdef\r\n".to_vec())
            .await
            .expect("send");
        assert_eq!(read_some(&mut client, 5).await, b"9\r\n6\n");
        assert!(closed(&mut client).await, "cut after 5 bytes, mid-record");
        assert_eq!(proxy.stats().borrow().stream_cuts, 1);
    }

    #[test]
    fn heads_and_headers_are_found() {
        let head = b"POST / HTTP/1.1\r\nContent-Length: 12\r\nmesos-stream-id: x\r\n\r\nbody";
        let end = head_end(head).expect("a head");
        assert_eq!(&head[end..], b"body");
        assert_eq!(header(&head[..end], "content-length"), Some("12"));
        assert_eq!(header(&head[..end], "Mesos-Stream-Id"), Some("x"));
        assert_eq!(header(&head[..end], "transfer-encoding"), None);
        assert_eq!(head_end(b"POST / HTTP/1.1\r\n"), None);
    }
}
