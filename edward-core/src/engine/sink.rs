//! The per-run event pipeline: coalesces content deltas (time window and
//! size), appends in batches (one `append_events` per batch), and sends a
//! notification hint after each batch. A stale fence or a finished run stops
//! all further writing at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::events::EngineEvent;
use crate::{Fence, NewEvent, Notifier, RunId, RunStore, StoreError};

/// Why the log cannot write any more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LogError {
    /// Another worker owns the run, or it is already finished.
    #[error("run lost: {0}")]
    Lost(String),
    /// The store failed permanently.
    #[error("event store failed: {0}")]
    Failed(String),
}

enum Msg {
    Event(EngineEvent),
    Close,
    Flush(oneshot::Sender<Result<u64, LogError>>),
}

#[derive(Default)]
struct Shared {
    lost: AtomicBool,
    last_seq: AtomicU64,
    failure: Mutex<Option<LogError>>,
}

/// Handle to a run's event writer; cheap to clone.
#[derive(Clone)]
pub(crate) struct RunLog {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
}

/// Settings of the writer.
#[derive(Clone, Copy)]
pub(crate) struct LogTuning {
    pub window: Duration,
    pub max_bytes: usize,
}

impl RunLog {
    /// Create the handle and the writer future (run it alongside the run).
    /// `lost` is cancelled when the run is lost (stale fence / finished).
    pub(crate) fn new(
        store: Arc<dyn RunStore>,
        notifier: Arc<dyn Notifier>,
        run_id: RunId,
        fence: Fence,
        tuning: LogTuning,
        start_seq: u64,
        lost: CancellationToken,
    ) -> (
        RunLog,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::channel(4096);
        let shared = Arc::new(Shared::default());
        shared.last_seq.store(start_seq, Ordering::SeqCst);
        let writer = Writer {
            store,
            notifier,
            run_id,
            fence,
            tuning,
            shared: shared.clone(),
            lost,
            pending: Vec::new(),
            pending_bytes: 0,
            first_at: None,
        };
        (RunLog { tx, shared }, writer.run(rx))
    }

    /// Queue an event (dropped silently once the run is lost: nothing may be written then).
    pub(crate) async fn emit(&self, e: EngineEvent) {
        if self.shared.lost.load(Ordering::SeqCst) {
            return;
        }
        let _ = self.tx.send(Msg::Event(e)).await;
    }

    /// Write everything queued so far; returns the last persisted seq.
    pub(crate) async fn flush(&self) -> Result<u64, LogError> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_err() {
            return Err(self
                .failure()
                .unwrap_or(LogError::Failed("writer gone".into())));
        }
        rx.await
            .unwrap_or_else(|_| Err(LogError::Failed("writer gone".into())))
    }

    /// Write what is queued and stop the writer; later events are dropped.
    pub(crate) async fn close(&self) {
        let _ = self.tx.send(Msg::Close).await;
    }

    /// The error that stopped the writer, if any.
    pub(crate) fn failure(&self) -> Option<LogError> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

struct Writer {
    store: Arc<dyn RunStore>,
    notifier: Arc<dyn Notifier>,
    run_id: RunId,
    fence: Fence,
    tuning: LogTuning,
    shared: Arc<Shared>,
    lost: CancellationToken,
    pending: Vec<EngineEvent>,
    pending_bytes: usize,
    first_at: Option<Instant>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        loop {
            let deadline = self.first_at.map(|t| t + self.tuning.window);
            let msg = tokio::select! {
                m = rx.recv() => m,
                _ = sleep_until_opt(deadline), if deadline.is_some() => {
                    let _ = self.flush().await;
                    continue;
                }
            };
            match msg {
                None => {
                    let _ = self.flush().await;
                    return;
                }
                Some(Msg::Event(e)) => {
                    self.push(e);
                    if self.pending_bytes >= self.tuning.max_bytes {
                        let _ = self.flush().await;
                    }
                }
                Some(Msg::Close) => {
                    let _ = self.flush().await;
                    return;
                }
                Some(Msg::Flush(reply)) => {
                    let r = self.flush().await;
                    let _ = reply.send(r);
                }
            }
        }
    }

    fn push(&mut self, e: EngineEvent) {
        if self.first_at.is_none() {
            self.first_at = Some(Instant::now());
        }
        self.pending_bytes += e.approx_bytes();
        if e.is_content() {
            if let Some(last) = self.pending.last_mut() {
                match last.try_merge(e, self.tuning.max_bytes) {
                    None => return,
                    Some(e) => {
                        self.pending.push(e);
                        return;
                    }
                }
            }
        }
        self.pending.push(e);
    }

    async fn flush(&mut self) -> Result<u64, LogError> {
        self.first_at = None;
        self.pending_bytes = 0;
        if let Some(f) = self.failure() {
            self.pending.clear();
            return Err(f);
        }
        if self.pending.is_empty() {
            return Ok(self.shared.last_seq.load(Ordering::SeqCst));
        }
        let events: Vec<NewEvent> = self
            .pending
            .drain(..)
            .map(EngineEvent::into_new_event)
            .collect();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match self
                .store
                .append_events(self.run_id, self.fence, events.clone())
                .await
            {
                Ok(written) => {
                    if let Some(last) = written.last() {
                        self.shared.last_seq.store(last.seq, Ordering::SeqCst);
                        let _ = self.notifier.notify_events(self.run_id, last.seq).await;
                    }
                    return Ok(self.shared.last_seq.load(Ordering::SeqCst));
                }
                Err(e @ (StoreError::StaleFence { .. } | StoreError::Finished { .. })) => {
                    tracing::warn!(run_id = %self.run_id, error = %e, "run lost; stopping writes");
                    return Err(self.fail(LogError::Lost(e.to_string())));
                }
                Err(e) if e.is_retryable() && attempt < 5 => {
                    tracing::warn!(run_id = %self.run_id, error = %e, attempt, "append failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(e) => {
                    tracing::error!(run_id = %self.run_id, error = %e, "append failed");
                    return Err(self.fail(LogError::Failed(e.to_string())));
                }
            }
        }
    }

    fn failure(&self) -> Option<LogError> {
        self.shared
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, e: LogError) -> LogError {
        *self
            .shared
            .failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e.clone());
        if matches!(e, LogError::Lost(_)) {
            self.shared.lost.store(true, Ordering::SeqCst);
        }
        self.lost.cancel();
        e
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryNotifier, MemoryRunStore};
    use crate::{AdmissionLimits, NewRun};

    async fn setup() -> (Arc<MemoryRunStore>, RunId) {
        let store = Arc::new(MemoryRunStore::new());
        let id = RunId::new();
        store
            .admit(
                NewRun {
                    id,
                    user_id: "u".into(),
                    chat_id: "c".into(),
                    request: serde_json::json!({}),
                    first_event: NewEvent::new("run_queued", serde_json::json!({})),
                },
                AdmissionLimits::default(),
            )
            .await
            .unwrap();
        store.start_run(id, Fence(1)).await.unwrap();
        (store, id)
    }

    fn log(
        store: Arc<MemoryRunStore>,
        id: RunId,
        fence: u64,
        lost: CancellationToken,
    ) -> (RunLog, tokio::task::JoinHandle<()>) {
        let (log, writer) = RunLog::new(
            store,
            Arc::new(MemoryNotifier::new()),
            id,
            Fence(fence),
            LogTuning {
                window: Duration::from_secs(3600),
                max_bytes: 16 * 1024,
            },
            1,
            lost,
        );
        (log, tokio::spawn(writer))
    }

    #[tokio::test]
    async fn coalesces_content_and_keeps_order() {
        let (store, id) = setup().await;
        let (log, writer) = log(store.clone(), id, 1, CancellationToken::new());
        for _ in 0..100 {
            log.emit(EngineEvent::TextDelta {
                content: "0123456789".into(),
            })
            .await;
        }
        log.emit(EngineEvent::TurnStarted {
            turn: 1,
            estimated_input_tokens: 0,
        })
        .await;
        for _ in 0..10 {
            log.emit(EngineEvent::FileDelta {
                path: "a".into(),
                content: "x".into(),
            })
            .await;
        }
        let seq = log.flush().await.unwrap();
        let evs = store.events_after(id, 1, 100).await.unwrap();
        let kinds: Vec<_> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["text_delta", "turn_started", "file_delta"]);
        assert_eq!(evs[0].payload["content"].as_str().unwrap().len(), 1000);
        assert_eq!(evs[2].payload["content"], "x".repeat(10));
        assert_eq!(seq, 4);
        log.close().await;
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn size_cap_splits_deltas_and_flushes() {
        let (store, id) = setup().await;
        let (log, writer) = log(store.clone(), id, 1, CancellationToken::new());
        let chunk = "y".repeat(1024);
        for _ in 0..40 {
            log.emit(EngineEvent::TextDelta {
                content: chunk.clone(),
            })
            .await;
        }
        log.flush().await.unwrap();
        let evs = store.events_after(id, 1, 100).await.unwrap();
        assert!(evs.len() >= 3, "40 KiB in ≤16 KiB deltas");
        let total: usize = evs
            .iter()
            .map(|e| e.payload["content"].as_str().unwrap().len())
            .sum();
        assert_eq!(total, 40 * 1024);
        assert!(
            evs.iter()
                .all(|e| e.payload["content"].as_str().unwrap().len() <= 16 * 1024)
        );
        log.close().await;
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn stale_fence_stops_writing_and_fires_lost() {
        let (store, id) = setup().await;
        let lost = CancellationToken::new();
        let (log, writer) = log(store.clone(), id, 1, lost.clone());
        store.start_run(id, Fence(2)).await.unwrap();
        log.emit(EngineEvent::TextDelta {
            content: "late".into(),
        })
        .await;
        assert!(matches!(log.flush().await, Err(LogError::Lost(_))));
        assert!(lost.is_cancelled());
        log.emit(EngineEvent::TextDelta {
            content: "later".into(),
        })
        .await;
        assert!(log.flush().await.is_err());
        assert!(store.events_after(id, 1, 10).await.unwrap().is_empty());
        log.close().await;
        writer.await.unwrap();
    }
}
