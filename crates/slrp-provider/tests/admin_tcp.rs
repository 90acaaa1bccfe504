//! The admin endpoint on loopback TCP: every request needs the bearer token, compared
//! whole; refusals are 401 with `WWW-Authenticate: Bearer`, and no token is ever logged.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod http;

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use slrp_provider::admin::{AdminProvider, AdminState, AdminTcpListener};
use slrp_provider::config::AdminToken;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "expected-token-7f3a";

struct Ready;

impl AdminProvider for Ready {
    fn key(&self) -> String {
        "org.apache.mesos.rp.local.storage.a".to_owned()
    }
    fn state(&self) -> String {
        "READY".to_owned()
    }
    fn is_ready(&self) -> bool {
        true
    }
    fn snapshot(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
}

async fn get(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> http::Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    http::exchange(stream, "GET", path, headers, None).await
}

#[tokio::test]
async fn tcp_requests_need_the_bearer_token() {
    let log = slrp_log::MemoryWriter::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // The test runtime runs every task on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    let listener = AdminTcpListener::bind("127.0.0.1:0".parse().unwrap(), AdminToken::new(TOKEN))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    assert!(addr.ip().is_loopback());
    let state = AdminState::new(vec![Arc::new(Ready)], Registry::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(listener.serve(state, cancel.clone()));

    let wrong = "wrong-token-value-1234";
    let refused: [&[(&str, &str)]; 6] = [
        &[],
        &[("Authorization", &format!("Bearer {wrong}"))],
        // A prefix of the token, and the token with one more byte.
        &[("Authorization", "Bearer expected-token-7f3")],
        &[("Authorization", &format!("Bearer {TOKEN}x"))],
        &[("Authorization", &format!("Basic {TOKEN}"))],
        &[("Authorization", TOKEN)],
    ];
    for headers in refused {
        for path in ["/status", "/health", "/no-such-route"] {
            let answer = get(addr, path, headers).await;
            assert_eq!(answer.status, 401, "{path} {headers:?}: {}", answer.body);
            assert!(
                answer
                    .head
                    .to_ascii_lowercase()
                    .contains("www-authenticate: bearer"),
                "{}",
                answer.head
            );
            let json = answer.json();
            assert!(json["error"].as_str().unwrap().contains("token"), "{json}");
        }
    }

    for scheme in ["Bearer", "bearer"] {
        let auth = format!("{scheme} {TOKEN}");
        let answer = get(addr, "/status", &[("Authorization", &auth)]).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.json()["ready"], true);
    }

    cancel.cancel();
    task.await.unwrap();
    let text = log.text();
    assert!(text.contains("refused an admin request on TCP"), "{text}");
    assert!(
        !text.contains(TOKEN),
        "the expected token is never logged: {text}"
    );
    assert!(
        !text.contains("expected-token"),
        "nor a prefix of it: {text}"
    );
    assert!(
        !text.contains(wrong),
        "the presented token is never logged: {text}"
    );
}

#[test]
fn the_token_compares_whole_and_never_shows() {
    let token = AdminToken::new("abc");
    assert!(token.matches(b"abc"));
    for other in [&b"abd"[..], b"ab", b"abcd", b"", b"ABC"] {
        assert!(!token.matches(other), "{other:?}");
    }
    assert_eq!(format!("{token:?}"), "AdminToken(<redacted>)");
}
