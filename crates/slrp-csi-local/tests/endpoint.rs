//! One plugin per endpoint, with real processes: a live socket is never taken over, a
//! stale one is, and a stopping plugin removes only the socket it bound itself.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::tests_outside_test_module
)]

mod common;

use common::*;
use slrp_proto::csi::v1;

async fn probe_ok(p: &TestPlugin) -> bool {
    let Ok(ch) = p.channel().await else {
        return false;
    };
    v1::identity_client::IdentityClient::new(ch)
        .probe(v1::ProbeRequest {})
        .await
        .is_ok()
}

fn sigterm(p: &TestPlugin) {
    let pid = p.child.as_ref().expect("running").id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

#[tokio::test]
async fn a_second_plugin_on_a_live_endpoint_exits_with_an_error() {
    let first = TestPlugin::start(&[]).await;
    let mut second = TestPlugin::on_socket(&first.socket);
    second.spawn_child();
    let status = second.wait_exit().await;
    assert!(!status.success(), "{status}");
    let log = second.log();
    assert!(
        log.contains(&format!("endpoint {} is in use", first.socket.display())),
        "{log}"
    );
    assert!(probe_ok(&first).await, "the first plugin must keep serving");
}

#[tokio::test]
async fn a_plugin_killed_with_sigkill_leaves_a_stale_socket_that_the_next_one_replaces() {
    let mut first = TestPlugin::start(&[]).await;
    first.kill();
    assert!(first.socket.exists(), "SIGKILL leaves the socket behind");
    let mut second = TestPlugin::on_socket(&first.socket);
    second.spawn().await;
    assert!(probe_ok(&second).await);
    assert!(
        second.log().contains("removing stale socket"),
        "{}",
        second.log()
    );
}

#[tokio::test]
async fn a_stopping_plugin_leaves_a_socket_that_replaced_its_own() {
    let mut first = TestPlugin::start(&[]).await;
    // Someone removes the socket under the running plugin and a new one takes the path.
    std::fs::remove_file(&first.socket).unwrap();
    let mut second = TestPlugin::on_socket(&first.socket);
    second.spawn().await;
    sigterm(&first);
    let status = first.wait_exit().await;
    assert!(status.success(), "{status}");
    assert!(
        first.socket.exists(),
        "the replacement's socket must survive"
    );
    assert!(probe_ok(&second).await, "the replacement must keep serving");
    // And the replacement, the socket's owner, removes it when it stops.
    sigterm(&second);
    assert!(second.wait_exit().await.success());
    assert!(!second.socket.exists());
}
