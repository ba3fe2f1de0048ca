//! [`MemoryNotifier`]: event hints and cancel signals over tokio broadcast channels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};

use super::lock_state;
use crate::error::InfraError;
use crate::traits::Notifier;
use crate::types::RunId;

/// Hints buffered per subscriber of one run before it lags.
const EVENT_CAPACITY: usize = 64;
/// Cancel requests buffered per subscriber before it lags.
const CANCEL_CAPACITY: usize = 1024;

type Channels = Arc<Mutex<HashMap<RunId, broadcast::Sender<u64>>>>;

/// An in-process [`Notifier`].
///
/// Each run gets a broadcast channel when its first subscriber arrives; the
/// channel is dropped when its last subscriber goes away (or on the next
/// notify that finds none), so finished runs leave nothing behind. Notifying
/// a run nobody watches costs one map lookup.
///
/// A subscriber that falls behind does not end its stream: it skips to the
/// newest hint (hints are "events up to seq N exist", so the newest one
/// subsumes the skipped ones). A lagging cancel subscriber skips the lost
/// cancels; the engine's periodic status check is the backstop for those.
#[derive(Debug)]
pub struct MemoryNotifier {
    events: Channels,
    cancels: broadcast::Sender<RunId>,
}

impl Default for MemoryNotifier {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryNotifier {
    /// No subscribers yet.
    pub fn new() -> Self {
        MemoryNotifier {
            events: Arc::new(Mutex::new(HashMap::new())),
            cancels: broadcast::channel(CANCEL_CAPACITY).0,
        }
    }

    /// How many runs currently have an event channel (for tests and metrics).
    pub fn watched_runs(&self) -> usize {
        lock_state(&self.events).len()
    }
}

/// Removes the run's channel once its last receiver is gone.
struct Cleanup {
    channels: Channels,
    run_id: RunId,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let mut channels = lock_state(&self.channels);
        if channels
            .get(&self.run_id)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            channels.remove(&self.run_id);
        }
    }
}

/// A subscription; `rx` is declared first so it is dropped before `_cleanup`
/// counts the remaining receivers.
struct EventSubscription {
    rx: broadcast::Receiver<u64>,
    _cleanup: Cleanup,
}

/// After a lag, drain what is buffered and return the newest hint.
fn newest_after_lag(rx: &mut broadcast::Receiver<u64>) -> Option<u64> {
    let mut newest = None;
    loop {
        match rx.try_recv() {
            Ok(seq) => newest = Some(newest.map_or(seq, |n: u64| n.max(seq))),
            Err(TryRecvError::Lagged(_)) => continue,
            Err(TryRecvError::Empty | TryRecvError::Closed) => return newest,
        }
    }
}

#[async_trait]
impl Notifier for MemoryNotifier {
    async fn notify_events(&self, run_id: RunId, last_seq: u64) -> Result<(), InfraError> {
        let mut channels = lock_state(&self.events);
        if let Some(tx) = channels.get(&run_id)
            && tx.send(last_seq).is_err()
        {
            // No receivers left: the channel is garbage.
            channels.remove(&run_id);
        }
        Ok(())
    }

    async fn subscribe_events(&self, run_id: RunId) -> Result<BoxStream<'static, u64>, InfraError> {
        let rx = {
            let mut channels = lock_state(&self.events);
            channels
                .entry(run_id)
                .or_insert_with(|| broadcast::channel(EVENT_CAPACITY).0)
                .subscribe()
        };
        let subscription = EventSubscription {
            rx,
            _cleanup: Cleanup {
                channels: Arc::clone(&self.events),
                run_id,
            },
        };
        Ok(stream::unfold(subscription, move |mut sub| async move {
            loop {
                match sub.rx.recv().await {
                    Ok(seq) => return Some((seq, sub)),
                    Err(RecvError::Lagged(skipped)) => {
                        tracing::debug!(%run_id, skipped, "event subscriber lagged");
                        if let Some(seq) = newest_after_lag(&mut sub.rx) {
                            return Some((seq, sub));
                        }
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        })
        .boxed())
    }

    async fn notify_cancel(&self, run_id: RunId) -> Result<(), InfraError> {
        // An error only means nobody is subscribed right now.
        let _ = self.cancels.send(run_id);
        Ok(())
    }

    async fn subscribe_cancels(&self) -> Result<BoxStream<'static, RunId>, InfraError> {
        let rx = self.cancels.subscribe();
        Ok(stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(run_id) => return Some((run_id, rx)),
                    Err(RecvError::Lagged(skipped)) => {
                        tracing::warn!(skipped, "cancel subscriber lagged; status checks catch up");
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    #[tokio::test]
    async fn lagged_subscriber_gets_newest_hint_and_keeps_streaming() {
        let notifier = MemoryNotifier::new();
        let run = RunId::new();
        let mut hints = notifier.subscribe_events(run).await.unwrap();
        let total = EVENT_CAPACITY as u64 * 3;
        for seq in 1..=total {
            notifier.notify_events(run, seq).await.unwrap();
        }
        let first = tokio::time::timeout(Duration::from_secs(5), hints.next())
            .await
            .unwrap();
        assert_eq!(first, Some(total), "a lagged stream yields the newest hint");
        notifier.notify_events(run, total + 1).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), hints.next())
            .await
            .unwrap();
        assert_eq!(next, Some(total + 1), "and keeps streaming after the lag");
    }

    #[tokio::test]
    async fn channel_is_removed_with_its_last_subscriber() {
        let notifier = MemoryNotifier::new();
        let run = RunId::new();
        let a = notifier.subscribe_events(run).await.unwrap();
        let b = notifier.subscribe_events(run).await.unwrap();
        assert_eq!(notifier.watched_runs(), 1);
        drop(a);
        assert_eq!(notifier.watched_runs(), 1, "one subscriber is left");
        drop(b);
        assert_eq!(notifier.watched_runs(), 0);
        notifier.notify_events(run, 1).await.unwrap();
        assert_eq!(notifier.watched_runs(), 0, "notify creates no channel");
    }
}
