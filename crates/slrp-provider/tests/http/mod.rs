//! A minimal HTTP/1.1 client for the admin endpoint's tests: one request per connection
//! (`Connection: close`), over a unix socket or TCP.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// What the endpoint answered: status, head (status line and headers) and body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

impl Answer {
    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

/// Sends `method path` with `body` (as JSON, if any) and `headers` over `stream`.
pub(crate) async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Answer {
    let body = body.unwrap_or("");
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: slrp\r\nConnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    stream.write_all(text.as_bytes()).await.unwrap();
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_string(&mut raw))
        .await
        .expect("the admin endpoint answers")
        .unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// [`exchange`] over the unix socket at `socket`.
pub(crate) async fn unix(socket: &Path, method: &str, path: &str, body: Option<&str>) -> Answer {
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    exchange(stream, method, path, &[], body).await
}
