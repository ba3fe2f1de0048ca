//! [`Gated`]: a future polled only after it asked to be woken.
//!
//! A run is one task: `join!`/`select!` inside it poll every branch each
//! time anything in the run wakes the task — at model pace, once per streamed
//! chunk. Branches that rarely have work (the side-effect handler, the event
//! writer, the deadline watch, heartbeats, status checks, a cancellation
//! wait) would pay a poll each time: a channel's cold cache lines, a
//! cancellation token's mutex, a timer's waker registration. Gated, such a
//! branch is polled for real only when its own waker fired (as
//! `FuturesUnordered` does for its members).
//!
//! The gates of one run share a [`Gates`] word that every gate's wake-up
//! bumps: while it is unchanged, no gate of the run was woken, and a poll of
//! each gate is a compare against that one (shared) cache line instead of a
//! read of the gate's own flag.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::task::ArcWake;

/// The wake-up counter shared by the gates of one task (one run). Cheap to
/// clone. Gates of different tasks may share it too: it is a hint, never
/// where a wake-up is stored.
#[derive(Clone, Default)]
pub(crate) struct Gates {
    epoch: Arc<AtomicU64>,
}

impl Gates {
    /// Gate `inner` (boxed: the enclosing future stays small to move).
    pub(crate) fn gate<F: Future>(&self, inner: F) -> Gated<F> {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            epoch: self.epoch.clone(),
            task: Mutex::new(None),
        });
        Gated {
            inner: Box::pin(inner),
            epoch: self.epoch.clone(),
            seen: None,
            waker: futures::task::waker(flag.clone()),
            flag,
            registered: None,
        }
    }
}

/// A future polled only on its first poll and after its own waker fired.
///
/// Correct for any future: a future that returned `Pending` has arranged to
/// be woken, so skipping polls nobody asked for changes nothing but cost.
pub(crate) struct Gated<F> {
    inner: Pin<Box<F>>,
    /// The set's counter, and its value when this gate last read its flag.
    epoch: Arc<AtomicU64>,
    seen: Option<u64>,
    flag: Arc<Flag>,
    /// The waker handed to `inner`: raises the flag, then wakes the task.
    waker: Waker,
    /// The task's waker as last registered in `flag`: while the task's
    /// waker stays the same (it does for a task), nothing is registered.
    registered: Option<Waker>,
}

struct Flag {
    woken: AtomicBool,
    epoch: Arc<AtomicU64>,
    /// Woken by reference, never taken: registered once per task.
    task: Mutex<Option<Waker>>,
}

impl ArcWake for Flag {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        // Flag first, then the counter: a poll that sees the new count sees
        // the flag; one that does not is polled again after the wake below.
        arc_self.woken.store(true, Ordering::Release);
        arc_self.epoch.fetch_add(1, Ordering::AcqRel);
        if let Some(task) = arc_self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            task.wake_by_ref();
        }
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if !this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            // Registered before the counter and flag are read (the mutex
            // orders the two): a wake-up after the reads reaches this task.
            let task = cx.waker().clone();
            *this
                .flag
                .task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task.clone());
            this.registered = Some(task);
        }
        let epoch = this.epoch.load(Ordering::Acquire);
        if this.seen == Some(epoch) {
            return Poll::Pending;
        }
        this.seen = Some(epoch);
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn completes_like_the_inner_future() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let gated = Gates::default().gate(rx);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let _ = tx.send(7);
        });
        assert_eq!(gated.await.unwrap(), 7);
    }

    #[tokio::test]
    async fn inner_is_polled_only_when_woken() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = {
            let polls = polls.clone();
            let mut sleep = Box::pin(tokio::time::sleep(Duration::from_millis(30)));
            std::future::poll_fn(move |cx| {
                polls.fetch_add(1, Ordering::Relaxed);
                sleep.as_mut().poll(cx)
            })
        };
        let gates = Gates::default();
        // A sibling gate of the same set, woken now and then.
        let mut other = gates.gate(tokio::time::sleep(Duration::from_millis(10)));
        let mut gated = gates.gate(counted);
        // A sibling that wakes the task a hundred times before the sleep ends.
        let mut ticks = 0;
        let busy = std::future::poll_fn(|cx| {
            ticks += 1;
            if ticks < 100 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        });
        tokio::pin!(busy);
        std::future::poll_fn(|cx| {
            let _ = busy.as_mut().poll(cx);
            let _ = Pin::new(&mut other).poll(cx);
            Pin::new(&mut gated).poll(cx)
        })
        .await;
        // The first poll, then the timer's own wake-up.
        assert!(polls.load(Ordering::Relaxed) <= 3, "{polls:?}");
    }
}
