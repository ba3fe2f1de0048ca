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
