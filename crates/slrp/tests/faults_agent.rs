//! `slrp run` against a broken agent connection (issue #10; spec §2.4, §12 item 16): the
//! daemon's `--agent` is a [`FaultProxy`] in front of the embedded manager, which cuts the
//! event stream mid-record, answers 503, refuses (resets) connections, or black-holes
//! them. Each test checks what a Mesos agent would see afterwards: a resubscription with
//! the same provider id and a fresh UPDATE_STATE.
//!
//! The manager restarting under a running daemon with the same agent id, and a daemon
//! restarted with an agent that got a new id, are `run_provider.rs`'s
//! `manager_restart_resubscribes_with_the_same_id` and `agent_registered_with_new_id`.

#![allow(
    clippy::tests_outside_test_module,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use slrp_proto::mesos::v1::resource_provider::{Event, event};
use slrp_test_support::proxy::{FaultProxy, Mode, Stats};
use support::{Cluster, DaemonOptions, ProviderSpec, Update};

/// The harness's reconnect backoff (`support::Cluster::write_config`): 100 ms doubling to
/// 1 s, full jitter.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Scheduling slack in the detection bounds. These tests show that a configured 2 s bound
/// is what ends a wait on a silent agent (the default is 30 s), not how fast slrp is, so the
/// slack is wide enough for a loaded CI machine and still far below the default.
const SLACK: Duration = Duration::from_secs(5);

fn id_of(info: &serde_json::Value) -> String {
    info["id"]["value"].as_str().unwrap().to_owned()
}

fn manager_addr(c: &Cluster) -> SocketAddr {
    match c.manager().endpoint() {
        slrp_manager::Endpoint::Tcp(addr) => *addr,
        slrp_manager::Endpoint::Unix(_) => unreachable!("the harness listens on TCP"),
    }
}

/// A fixture cluster whose daemon reaches the manager through a proxy, with extra
/// `[agent]` settings; the daemon is started and subscribed. Returns the cluster, the
/// proxy, the provider id and its first UPDATE_STATE.
async fn behind_proxy(agent_settings: &[&str]) -> (Cluster, FaultProxy, String, Update) {
    behind_proxy_with(agent_settings, DaemonOptions::default()).await
}

/// [`behind_proxy`] with more daemon options.
async fn behind_proxy_with(
    agent_settings: &[&str],
    options: DaemonOptions,
) -> (Cluster, FaultProxy, String, Update) {
    let (mut c, proxy) = proxied(agent_settings, options).await;
    c.start_daemon();
    let id = id_of(&c.next_subscribed().await);
    let first = c.next_update().await;
    assert_eq!(first.provider_id, id);
    (c, proxy, id, first)
}

/// A fixture cluster whose daemon (not started) will reach the manager through a proxy.
async fn proxied(agent_settings: &[&str], options: DaemonOptions) -> (Cluster, FaultProxy) {
    // The proxy's address goes into the daemon's flags, the manager's address into the
    // proxy: start the proxy first and point it at the manager once that runs.
    let placeholder = SocketAddr::from(([127, 0, 0, 1], 9));
    let proxy = FaultProxy::start(placeholder).await.unwrap();
    let options = DaemonOptions {
        agent_url: Some(proxy.url()),
        agent_settings: agent_settings.iter().map(|s| (*s).to_owned()).collect(),
        ..options
    };
    let c = Cluster::new(vec![ProviderSpec::fixture()], options).await;
    proxy.set_target(manager_addr(&c));
    (c, proxy)
}

/// After a fault: the next SUBSCRIBE carries the same provider id, and an UPDATE_STATE of
/// that id with a new resource version and the same resources follows.
async fn resubscribed(c: &mut Cluster, id: &str, before: &Update) -> Update {
    let info = c.next_subscribed().await;
    assert_eq!(
        id_of(&info),
        id,
        "resubscribed with the provider id it was given"
    );
    let update = c.next_update().await;
    assert_eq!(update.provider_id, id);
    assert_ne!(
        update.resource_version, before.resource_version,
        "every UPDATE_STATE has a fresh resource version"
    );
    assert_eq!(
        support::sorted(&update.resources),
        support::sorted(&before.resources)
    );
    update
}

async fn proxy_saw(
    c: &Cluster,
    proxy: &FaultProxy,
    what: &str,
    ready: impl FnMut(&Stats) -> bool,
) -> Stats {
    match proxy.wait_for(support::WAIT, ready).await {
        Ok(stats) => stats,
        Err(stats) => c.fail(&format!("the proxy never saw {what}: {stats:?}")),
    }
}

/// The stream is cut inside a record (5 bytes into the next event's chunk: its size line
/// and the start of the record; the daemon's HTTP layer sees the body end early) → the
/// daemon reconnects and resubscribes with the same provider id, then sends one fresh
/// UPDATE_STATE.
#[tokio::test]
async fn stream_cut_mid_record_resubscribes_with_the_same_id() {
    let (mut c, proxy, id, first) = behind_proxy(&[]).await;
    proxy.cut_stream_after(5);
    // Any event makes bytes flow on the idle stream; an empty reconciliation asks nothing
    // of the provider.
    let event = Event {
        r#type: Some(event::Type::ReconcileOperations as i32),
        reconcile_operations: Some(event::ReconcileOperations {
            operation_uuids: Vec::new(),
        }),
        ..Event::default()
    };
    c.manager().send_event(&id, event).await.unwrap();
    proxy_saw(&c, &proxy, "the cut", |s| s.stream_cuts == 1).await;
    resubscribed(&mut c, &id, &first).await;
    assert!(c.daemon_running(), "a cut stream is not fatal");
    c.finish().await;
}

/// The agent answers 503 for a while (as an agent whose resource provider manager does not
/// exist yet) → each is an ordinary retry; the daemon subscribes afterwards and keeps its
/// provider id.
#[tokio::test]
async fn agent_answering_503_for_a_while_is_retried() {
    let (mut c, proxy, id, first) = behind_proxy(&[]).await;
    proxy.answer_503(4);
    // Closing the live connections makes the daemon reconnect into the 503s.
    proxy.cut_all();
    let stats = proxy_saw(&c, &proxy, "four 503 answers", |s| s.answered_503 == 4).await;
    assert_eq!(stats.answered_503, 4);
    resubscribed(&mut c, &id, &first).await;
    assert!(c.daemon_running(), "503 is not fatal");
    c.finish().await;
}

/// Connections fail for a while (every attempt accepted and reset: a dead agent whose
/// attempts the proxy can count) → the attempts over the window stay within what the
/// backoff allows, far from a busy loop; afterwards the daemon resubscribes.
///
/// The bound: with full jitter the n-th wait is uniform below `min(base·2^(n-1), max)`,
/// so once the ceiling reached `max` (after `log2(max/base)` attempts) the waits average
/// `max/2`. Over a window `W` that is about `ramp + W/(max/2)` attempts; three times that
/// leaves the sum of uniform waits no realistic chance to exceed it, while a client
/// without backoff makes thousands of attempts per second. Each attempt opens two
/// connections (the event stream and the calls connection) before the first fails, and
/// the proxy counts connections.
#[tokio::test]
async fn refused_connections_cost_no_busy_loop() {
    let (mut c, proxy, id, first) = behind_proxy(&[]).await;
    let window = Duration::from_secs(4);
    proxy.set_mode(Mode::Reset);
    let before = proxy.stats().borrow().resets;
    // The window is the measurement itself (attempts per time), not a wait for an event.
    tokio::time::sleep(window).await;
    let attempts = proxy.stats().borrow().resets - before;
    proxy.set_mode(Mode::PassThrough);

    let ramp = (BACKOFF_MAX.as_secs_f64() / BACKOFF_BASE.as_secs_f64())
        .log2()
        .ceil()
        + 1.0;
    let expected = ramp + window.as_secs_f64() / (BACKOFF_MAX.as_secs_f64() / 2.0);
    let connections_per_attempt = 2.0;
    let bound = (3.0 * expected * connections_per_attempt).ceil() as u64;
    eprintln!("{attempts} connection attempts in {window:?} (bound {bound})");
    assert!(attempts >= 1, "the daemon kept trying: {attempts}");
    assert!(
        attempts <= bound,
        "{attempts} connection attempts in {window:?} (bound {bound} from the backoff)"
    );
    resubscribed(&mut c, &id, &first).await;
    c.finish().await;
}

/// A half-open agent: connections are accepted and nothing comes back → the daemon gives
/// up on each attempt within its configured bound (`subscribe_timeout` 2 s here), backs
/// off and tries again; once the agent answers it resubscribes with the same id.
#[tokio::test]
async fn half_open_agent_is_detected_within_the_bound() {
    let subscribe_timeout = Duration::from_secs(2);
    let (mut c, proxy, id, first) = behind_proxy(&[
        "connect_timeout = \"2s\"",
        "subscribe_timeout = \"2s\"",
        "call_timeout = \"2s\"",
    ])
    .await;
    proxy.set_mode(Mode::BlackHole);
    proxy.cut_all();
    // Two connections given up: the first one's bound is not a fluke.
    let stats = proxy_saw(&c, &proxy, "two abandoned black-holed connections", |s| {
        s.black_hole_held.len() >= 2
    })
    .await;
    // Generous slack for a loaded CI machine (2 cores, tests in parallel): the bound must
    // only tell the configured 2 s from the 30 s default (or never). A session's calls
    // connection is given up with its stream, so every held connection is within it.
    let bound = subscribe_timeout + SLACK;
    eprintln!(
        "black-holed connections held for {:?}",
        stats.black_hole_held
    );
    for held in &stats.black_hole_held {
        assert!(
            *held <= bound,
            "a silent agent was waited on for {held:?} (bound {bound:?}): {stats:?}"
        );
    }
    proxy.set_mode(Mode::PassThrough);
    resubscribed(&mut c, &id, &first).await;
    c.finish().await;
}

/// A live session whose agent goes silent: the stream stays idle (nothing can tell a
/// silent agent from an idle one), but the next call (the UPDATE_STATE for a profile that
/// appeared) is unanswered → the session ends within `call_timeout` and the daemon
/// reconnects; once the agent answers again it resubscribes with the same id and reports
/// the new pool.
#[tokio::test]
async fn silent_agent_under_a_live_session_is_detected_by_the_call_bound() {
    let call_timeout = Duration::from_secs(2);
    let (mut c, proxy, id, _) = behind_proxy_with(
        &["subscribe_timeout = \"2s\"", "call_timeout = \"2s\""],
        DaemonOptions::with_profiles(),
    )
    .await;
    proxy.set_mode(Mode::BlackHole);
    let silent_since = tokio::time::Instant::now();
    c.set_profiles(&support::profiles(&["test"]));
    // A new connection in the hole: the daemon gave up on the live session.
    proxy_saw(
        &c,
        &proxy,
        "a reconnection after the unanswered call",
        |s| s.black_holed >= 1,
    )
    .await;
    let detected = silent_since.elapsed();
    eprintln!("the silent agent was noticed after {detected:?}");
    // The profile poll (100 ms), the call bound, the first reconnect wait (at most the
    // 100 ms base) and slack for a loaded machine (see SLACK).
    let bound = call_timeout + Duration::from_millis(200) + SLACK;
    assert!(
        detected <= bound,
        "the silent agent was noticed after {detected:?} (bound {bound:?})"
    );
    proxy.set_mode(Mode::PassThrough);
    let info = c.next_subscribed().await;
    assert_eq!(id_of(&info), id);
    let update = c.update_where(|u| u.pool("test").is_some()).await;
    assert_eq!(update.provider_id, id);
    c.finish().await;
}

/// The agent is down when the daemon starts (slrp started before the Mesos agent), then
/// answers 503 once (still recovering): the daemon keeps asking for the agent id with a
/// backoff, and subscribes as soon as the agent answers.
#[tokio::test]
async fn agent_down_at_start_is_waited_for() {
    let (mut c, proxy) = proxied(&[], DaemonOptions::default()).await;
    proxy.set_mode(Mode::Reset);
    c.start_daemon();
    proxy_saw(&c, &proxy, "two attempts of the daemon", |s| s.resets >= 2).await;
    assert!(c.daemon_running(), "an absent agent is not fatal");
    proxy.answer_503(1);
    proxy.set_mode(Mode::PassThrough);
    let info = c.next_subscribed().await;
    assert_eq!(proxy.stats().borrow().answered_503, 1);
    let update = c.next_update().await;
    assert_eq!(update.provider_id, id_of(&info));
    c.finish().await;
}

/// The agent comes back under a new agent ID while the daemon keeps running (spec §3.6,
/// §8.6): the old provider id is not admitted any more, so the daemon learns the new
/// agent ID and subscribes as a new provider; the plugin's volume reappears as a
/// pre-existing RAW disk of that provider. (The variant where the daemon restarts with
/// the agent is `run_provider.rs`'s `agent_registered_with_new_id`.)
#[tokio::test]
async fn new_agent_id_under_a_running_daemon_is_a_new_identity() {
    let (mut c, proxy) = proxied(&[], DaemonOptions::default()).await;
    let volume = c.import_volume("test", "vol2g", 2 << 30);
    c.start_daemon();
    let old = id_of(&c.next_subscribed().await);
    let first = c.next_update().await;
    assert_eq!(first.disks().len(), 1, "{:?}", first.resources);

    c.restart_manager_with_agent_id("11111111-2222-3333-4444-555555555555-S1")
        .await;
    proxy.set_target(manager_addr(&c));
    let new = id_of(&c.next_subscribed().await);
    assert_ne!(new, old, "a new agent ID is a new provider identity");
    let update = c.next_update().await;
    assert_eq!(update.provider_id, new);
    let disks = update.disks();
    assert_eq!(disks.len(), 1, "{:?}", update.resources);
    assert_eq!(support::source(disks[0])["id"], volume.as_str());
    assert_eq!(support::source(disks[0])["type"], "RAW");
    assert_eq!(disks[0]["provider_id"]["value"], new.as_str());
    assert_eq!(support::mb(disks[0]), 2048.0);
    c.finish().await;
}
