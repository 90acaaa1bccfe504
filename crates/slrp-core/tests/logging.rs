//! Logged errors carry their whole cause chain: a fatal store failure names the store's
//! error, not only "persisting the state of volume ... failed". Also what only a log line
//! shows: a background CreateVolume retry that ends because its intent was settled.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use slrp_core::volume::*;
use slrp_test_support::fake_csi::*;
use slrp_test_support::harness::*;
use tracing_subscriber::fmt::MakeWriter;

/// Collects every formatted log line.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

// A current-thread runtime: the worker and its jobs run on this thread, where the
// capturing subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn a_fatal_store_failure_is_logged_with_its_cause() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let scenario = fail::FailScenario::setup();

    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    let v = m.handle.create(create_req("op")).await.unwrap();
    fail::cfg(slrp_store::failpoints::BEFORE_COMMIT, "return").unwrap();
    assert!(matches!(
        m.handle.publish(&v.id).await,
        Err(VolumeError::Stopped)
    ));
    let r = m.died().await;
    scenario.teardown();
    let e = r.unwrap_err();
    assert!(matches!(e, VolumeError::Store { .. }), "{e:?}");

    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("fatal volume manager error"))
        .unwrap_or_else(|| panic!("no fatal error logged:\n{text}"));
    let cause = std::error::Error::source(&e).unwrap().to_string();
    assert!(line.contains(&e.to_string()), "{line}");
    assert!(
        line.contains(&cause),
        "the cause {cause:?} is missing: {line}"
    );
}

// A current-thread runtime, for the capturing subscriber (see above).
#[tokio::test(flavor = "current_thread")]
async fn a_background_intent_retry_never_revives_an_intent_a_caller_settled() {
    use slrp_csi::{Code, CsiRpc};
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let h = Harness::new(FakeCsi::full());
    let m = h.start();
    h.fake.fail(CsiRpc::CreateVolume, Code::Unavailable, 2);
    assert!(m.handle.create(create_req("op-1")).await.is_err());
    m.stop().await.unwrap();
    assert_eq!(h.stored_intents().len(), 1);

    // Recovery cannot settle the intent and schedules a background retry; before it
    // fires (2 s: the caller's create below takes milliseconds), the caller's replay of
    // the create is refused for good, which drops the intent.
    let cfg = h.config().intent_retry(std::time::Duration::from_secs(2));
    let m = h.start_with(cfg);
    let report = m.handle.ready().await.unwrap();
    assert_eq!(report.unsettled_intents, ["op-1"], "{report:?}");
    h.fake
        .fail(CsiRpc::CreateVolume, Code::ResourceExhausted, 1);
    assert!(m.handle.create(create_req("op-1")).await.is_err());
    let calls = h.fake.calls(CsiRpc::CreateVolume);

    // The retry fires: it must end without a call (the plugin would accept it now).
    until(|| {
        logs.text().contains("background retry ends") || h.fake.calls(CsiRpc::CreateVolume) > calls
    })
    .await;
    assert_eq!(
        h.fake.calls(CsiRpc::CreateVolume),
        calls,
        "the retry created a volume nobody waits for"
    );
    assert!(h.fake.ids().is_empty());
    m.stop().await.unwrap();
    assert!(h.stored_intents().is_empty());
}
