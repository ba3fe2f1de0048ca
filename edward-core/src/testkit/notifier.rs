//! Conformance suite for [`Notifier`] adapters.
//!
//! Every wait is bounded by [`PROMPT`](super::PROMPT), so a lost
//! notification fails the check instead of hanging it. A notification sent
//! after `subscribe_*` returned must be delivered.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;

use super::within;
use crate::{Notifier, RunId};

/// The next hint of `stream`, or a panic.
async fn next_hint(stream: &mut BoxStream<'static, u64>, what: &str) -> u64 {
    within(what, stream.next())
        .await
        .unwrap_or_else(|| panic!("event stream ended while waiting for {what}"))
}

/// Wait until `stream` yields `run`, skipping cancels of other runs (a
/// shared backend carries other tests' cancels).
async fn await_cancel(stream: &mut BoxStream<'static, RunId>, run: RunId) {
    within("a cancel", async {
        while let Some(got) = stream.next().await {
            if got == run {
                return;
            }
        }
        panic!("cancel stream ended before run {run} arrived");
    })
    .await
}

/// Subscribe, then notify: the hints arrive, in order (an adapter may
/// coalesce them, never reorder them).
pub async fn check_subscribe_then_notify<N: Notifier + ?Sized>(notifier: &N) {
    let run = RunId::new();
    let mut hints = notifier.subscribe_events(run).await.expect("subscribe");
    for seq in 1..=3 {
        notifier.notify_events(run, seq).await.expect("notify");
    }
    let mut last = 0;
    while last < 3 {
        let seq = next_hint(&mut hints, "hint 3").await;
        assert!((1..=3).contains(&seq), "unexpected hint {seq}");
        assert!(seq > last, "hints out of order: {seq} after {last}");
        last = seq;
    }
}

/// Hints of one run never reach another run's subscribers; every
/// subscriber of a run gets its hints.
pub async fn check_per_run_isolation<N: Notifier + ?Sized>(notifier: &N) {
    let (a, b) = (RunId::new(), RunId::new());
    let mut a1 = notifier.subscribe_events(a).await.expect("subscribe");
    let mut a2 = notifier.subscribe_events(a).await.expect("subscribe");
    let mut b1 = notifier.subscribe_events(b).await.expect("subscribe");
    notifier.notify_events(b, 5).await.expect("notify");
    notifier.notify_events(a, 7).await.expect("notify");
    assert_eq!(
        next_hint(&mut a1, "a's hint").await,
        7,
        "a sees only its own hint"
    );
    assert_eq!(
        next_hint(&mut a2, "a's hint").await,
        7,
        "every subscriber sees it"
    );
    assert_eq!(next_hint(&mut b1, "b's hint").await, 5);

    // Dropping one subscriber leaves the other working.
    drop(a1);
    notifier.notify_events(a, 8).await.expect("notify");
    assert_eq!(next_hint(&mut a2, "a's second hint").await, 8);
}

/// Notifying a run nobody watches is fine.
pub async fn check_notify_without_subscribers<N: Notifier + ?Sized>(notifier: &N) {
    let run = RunId::new();
    notifier.notify_events(run, 1).await.expect("notify nobody");
    let stream = notifier.subscribe_events(run).await.expect("subscribe");
    drop(stream);
    notifier
        .notify_events(run, 2)
        .await
        .expect("notify after unsubscribe");
    notifier.notify_cancel(run).await.expect("cancel nobody");
}

/// A cancel reaches every cancel subscriber.
pub async fn check_cancel_broadcast<N: Notifier + ?Sized>(notifier: &N) {
    let run = RunId::new();
    let mut first = notifier.subscribe_cancels().await.expect("subscribe");
    let mut second = notifier.subscribe_cancels().await.expect("subscribe");
    notifier.notify_cancel(run).await.expect("cancel");
    await_cancel(&mut first, run).await;
    await_cancel(&mut second, run).await;

    let other = RunId::new();
    notifier.notify_cancel(other).await.expect("cancel");
    await_cancel(&mut first, other).await;
}

/// Every check of this suite.
pub async fn run_all(notifier: Arc<dyn Notifier>) {
    check_subscribe_then_notify(&*notifier).await;
    check_per_run_isolation(&*notifier).await;
    check_notify_without_subscribers(&*notifier).await;
    check_cancel_broadcast(&*notifier).await;
}
