//! A peer that vanishes under a subscribed, idle stream (no FIN, no RST) is detected by TCP
//! keepalive within `idle + interval * count`. The test runs in a private network namespace
//! (root) whose loopback it takes down, so nothing on the host is touched.

mod support;

use std::process::Command;
use std::time::Duration;

use slrp_agent::{AgentClient, AgentError, Metrics, SessionEvent, TcpKeepalive};
use slrp_wire::ContentType;
use support::{FakeAgent, WAIT, info, next_event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {args:?}: {status}");
}

#[test]
fn keepalive_detects_a_vanished_peer_on_an_idle_stream() {
    // Namespaces are per thread: everything below runs on this one thread.
    let worker = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare(CLONE_NEWNET) needs root");
        ip(&["link", "set", "lo", "up"]);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(scenario());
    });
    worker.join().expect("scenario passed");
}

async fn scenario() {
    let mut agent = FakeAgent::tcp().await;
    let mut config = agent.config();
    let keepalive = TcpKeepalive {
        idle: Duration::from_secs(1),
        interval: Duration::from_secs(1),
        count: 2,
    };
    config.tcp_keepalive = Some(keepalive);
    config.tcp_user_timeout = Some(keepalive.detection_bound());
    let cancel = CancellationToken::new();
    let (_handle, mut events) =
        AgentClient::spawn(config, info(), None, Metrics::default(), cancel.clone())
            .expect("client");
    let req = agent.next().await;
    let stream = req.respond_stream(ContentType::Protobuf, "stream");
    stream.subscribed("provider").await;
    assert!(matches!(
        next_event(&mut events).await,
        SessionEvent::Connected
    ));
    assert!(matches!(
        next_event(&mut events).await,
        SessionEvent::Subscribed { .. }
    ));

    // From now on no packet gets through, and no FIN or RST is ever seen.
    ip(&["link", "set", "lo", "down"]);
    let started = Instant::now();
    let reason = match next_event(&mut events).await {
        SessionEvent::Disconnected { reason } => reason,
        other => panic!("expected Disconnected, got {other:?}"),
    };
    let elapsed = started.elapsed();
    assert!(matches!(&*reason, AgentError::Stream(_)), "{reason:?}");
    let bound = keepalive.detection_bound() + Duration::from_secs(2);
    assert!(
        elapsed < bound,
        "detected after {elapsed:?}, bound {bound:?}"
    );
    assert!(elapsed < WAIT);
    cancel.cancel();
    drop(stream);
}
