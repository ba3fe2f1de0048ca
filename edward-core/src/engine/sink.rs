//! The per-run event pipeline: coalesces content deltas (time window and
//! size), appends in batches (one `append_events` per batch), and sends a
//! notification hint after each batch. A stale fence or a finished run stops
//! all further writing at once.
//!
//! Emitters push into a queue shared with the writer (a mutex held for a
//! push, never across an await) instead of sending one channel message per
//! event: coalescing happens as an event is queued, and the writer is woken
//! only when there is something for it to do — a batch to time (its first
//! event), a batch that reached the size cap, a flush or the close. At model
//! pace that is one wake-up per window instead of one per streamed chunk.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::events::{DeltaRef, EngineEvent};
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

/// Events queued and not yet taken by the writer after which `emit` waits:
/// the bound the writer's channel had (4096 messages), so a slow store
/// holds the run back exactly as much as before.
const QUEUE_CAPACITY: usize = 4096;

type FlushReply = oneshot::Sender<Result<u64, LogError>>;

/// Events the writer appends in one `append_events`: content deltas merged
/// as they were queued, sealed once `bytes` reaches the size cap.
struct Batch {
    /// The batch's events before `last`.
    events: Vec<EngineEvent>,
    /// Its last event while that is a content delta (the one the next delta
    /// merges into), kept apart: the open batch lives inside [`Queue`], so a
    /// streamed chunk touches the queue and this delta's text, not a vector.
    last: Option<EngineEvent>,
    /// Approximate bytes of everything queued into it (merged or not).
    bytes: usize,
    /// When its first event was queued: the coalescing window starts here.
    first_at: Instant,
}

impl Batch {
    fn len(&self) -> usize {
        self.events.len() + usize::from(self.last.is_some())
    }

    fn into_events(mut self) -> Vec<EngineEvent> {
        self.events.extend(self.last.take());
        self.events
    }

    /// The length of its last content delta, if it has one.
    fn last_delta_len(&self) -> Option<usize> {
        self.last
            .iter()
            .chain(self.events.iter().rev())
            .find_map(EngineEvent::content_len)
    }
}

/// What emitters and the writer share, under one mutex.
#[derive(Default)]
struct Queue {
    /// The batch events go into (none until an event comes).
    open: Option<Batch>,
    /// Full batches before it, oldest first (only while the writer is busy).
    sealed: VecDeque<Batch>,
    /// Events queued after merging: what a channel would have held while
    /// the writer was busy (an idle writer merged at once).
    queued: usize,
    /// Callers of [`RunLog::flush`] waiting for everything queued before them.
    flushes: Vec<FlushReply>,
    /// `close` was called (or every handle is gone): write what is queued, stop.
    closing: bool,
    /// The writer stopped (returned or was dropped): nothing is written any more.
    gone: bool,
    /// The writer, while it waits for work.
    writer: Option<Waker>,
    /// An emitter waits for room (`queued` reached [`QUEUE_CAPACITY`]).
    waiting_for_room: bool,
    /// Bytes of the last content delta the writer took: the capacity a new
    /// delta starts with.
    delta_room: usize,
}

/// `repr(C)`: `lost` and the queue's lock, read for every streamed chunk,
/// share a cache line.
#[repr(C)]
struct Shared {
    lost: AtomicBool,
    queue: Mutex<Queue>,
    last_seq: AtomicU64,
    failure: Mutex<Option<LogError>>,
    /// Emitters waiting for room in a full queue.
    room: Notify,
    /// Live [`RunLog`] handles: the last one dropped closes the log.
    handles: AtomicUsize,
    tuning: LogTuning,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn failure(&self) -> Option<LogError> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The writer is gone: drop what is queued, fail pending flushes (their
    /// senders are dropped), release emitters waiting for room.
    fn writer_gone(&self) {
        let mut q = self.queue();
        q.gone = true;
        q.open = None;
        q.sealed.clear();
        q.queued = 0;
        q.flushes.clear();
        q.writer = None;
        drop(q);
        self.room.notify_waiters();
    }
}

impl Queue {
    /// Queue `e`, merging a content delta into the open batch's last event.
    /// Returns whether the writer has something new to do (a batch to time
    /// or a full one to append).
    fn push(&mut self, e: EngineEvent, tuning: &LogTuning) -> bool {
        let (open, new) = self.open_batch(tuning);
        open.bytes += e.approx_bytes();
        let added = if !e.is_content() {
            open.events.extend(open.last.take());
            open.events.push(e);
            true
        } else if let Some(last) = open.last.as_mut() {
            match last.try_merge(e, tuning.max_bytes) {
                None => false,
                Some(e) => {
                    open.events.push(std::mem::replace(last, e));
                    true
                }
            }
        } else {
            open.last = Some(e);
            true
        };
        self.queued += usize::from(added);
        self.writer_has_work(new, tuning)
    }

    /// [`Queue::push`] of a borrowed delta: copied into the open batch's
    /// last event when it merges, made an owned event only when it does not.
    fn push_delta(&mut self, delta: DeltaRef<'_>, tuning: &LogTuning) -> bool {
        // Room for what the previous window gathered: at a steady pace a
        // delta is built without a reallocation per chunk.
        let room = self.delta_room.min(tuning.max_bytes);
        let (open, new) = self.open_batch(tuning);
        open.bytes += delta.approx_bytes();
        let merged = open
            .last
            .as_mut()
            .is_some_and(|last| last.try_merge_ref(delta, tuning.max_bytes));
        if !merged {
            open.events.extend(open.last.take());
            open.last = Some(delta.to_event_with_room(room));
            self.queued += 1;
        }
        self.writer_has_work(new, tuning)
    }

    /// The batch events go into (a new one after a sealed one), and whether
    /// it is new.
    fn open_batch(&mut self, tuning: &LogTuning) -> (&mut Batch, bool) {
        let new = self
            .open
            .as_ref()
            .is_none_or(|b| b.bytes >= tuning.max_bytes);
        if new {
            self.sealed.extend(self.open.take());
        }
        let open = self.open.get_or_insert_with(|| Batch {
            events: Vec::new(),
            last: None,
            bytes: 0,
            first_at: Instant::now(),
        });
        (open, new)
    }

    /// After a push: the writer must time a new batch or append a full one.
    fn writer_has_work(&self, new_batch: bool, tuning: &LogTuning) -> bool {
        new_batch
            || self
                .open
                .as_ref()
                .is_some_and(|b| b.bytes >= tuning.max_bytes)
    }

    fn wake_writer(&mut self) {
        if let Some(w) = self.writer.take() {
            w.wake();
        }
    }
}

/// Handle to a run's event writer; cheap to clone.
pub(crate) struct RunLog {
    shared: Arc<Shared>,
}

impl Clone for RunLog {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        RunLog {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        // As a channel closes with its last sender: the writer writes what is
        // queued and stops.
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            let mut q = self.shared.queue();
            q.closing = true;
            q.wake_writer();
        }
    }
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
    ) -> (RunLog, impl Future<Output = ()> + Send + 'static) {
        let shared = Arc::new(Shared {
            lost: AtomicBool::new(false),
            last_seq: AtomicU64::new(start_seq),
            failure: Mutex::new(None),
            queue: Mutex::new(Queue::default()),
            room: Notify::new(),
            handles: AtomicUsize::new(1),
            tuning,
        });
        let writer = Writer {
            store,
            notifier,
            run_id,
            fence,
            shared: shared.clone(),
            lost,
        };
        (RunLog { shared }, writer.run())
    }

    /// Queue an event (dropped silently once the run is lost: nothing may be
    /// written then). Waits only while the writer is far behind.
    pub(crate) async fn emit(&self, e: EngineEvent) {
        if self.shared.lost.load(Ordering::SeqCst) {
            return;
        }
        // A channel send spent the task's cooperative budget; so does this,
        // so a model that never makes the run wait still yields now and then.
        tokio::task::coop::consume_budget().await;
        let mut e = Some(e);
        loop {
            let room = {
                let mut q = self.shared.queue();
                if q.closing || q.gone {
                    return;
                }
                if q.queued < QUEUE_CAPACITY {
                    if q.push(e.take().expect("not queued yet"), &self.shared.tuning) {
                        q.wake_writer();
                    }
                    return;
                }
                // Registered before the lock is released, so the writer's
                // notification after it takes a batch cannot be missed.
                q.waiting_for_room = true;
                let room = self.shared.room.notified();
                q.wake_writer();
                room
            };
            room.await;
        }
    }

    /// Queue a content delta without waiting and, when it merges into the
    /// previous delta, without an owned copy (the model's streamed bytes are
    /// copied once, into the batch). `false`: the queue is full; emit the
    /// owned event instead, which waits for room. Dropped (`true`) once the
    /// run is lost or the log closed, as [`RunLog::emit`] drops it.
    pub(crate) fn push_delta(&self, delta: DeltaRef<'_>) -> bool {
        if self.shared.lost.load(Ordering::SeqCst) {
            return true;
        }
        let mut q = self.shared.queue();
        if q.closing || q.gone {
            return true;
        }
        if q.queued >= QUEUE_CAPACITY {
            return false;
        }
        if q.push_delta(delta, &self.shared.tuning) {
            q.wake_writer();
        }
        true
    }

    /// Write everything queued so far; returns the last persisted seq.
    pub(crate) async fn flush(&self) -> Result<u64, LogError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self.shared.queue();
            if q.gone || q.closing {
                drop(q);
                return Err(self
                    .failure()
                    .unwrap_or(LogError::Failed("writer gone".into())));
            }
            q.flushes.push(tx);
            q.wake_writer();
        }
        rx.await
            .unwrap_or_else(|_| Err(LogError::Failed("writer gone".into())))
    }

    /// Write what is queued and stop the writer; later events are dropped.
    pub(crate) async fn close(&self) {
        let mut q = self.shared.queue();
        q.closing = true;
        q.wake_writer();
    }

    /// The error that stopped the writer, if any.
    pub(crate) fn failure(&self) -> Option<LogError> {
        self.shared.failure()
    }
}

/// What the writer took from the queue to do next.
struct Work {
    batches: Vec<Batch>,
    flushes: Vec<FlushReply>,
    close: bool,
}

struct Writer {
    store: Arc<dyn RunStore>,
    notifier: Arc<dyn Notifier>,
    run_id: RunId,
    fence: Fence,
    shared: Arc<Shared>,
    lost: CancellationToken,
}

/// Marks the writer gone however it ends (returned or dropped with the run).
struct GoneOnDrop(Arc<Shared>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.writer_gone();
    }
}

impl Writer {
    async fn run(mut self) {
        let _gone = GoneOnDrop(self.shared.clone());
        // One timer for the run, moved to each batch's deadline: no timer
        // registered and dropped per event.
        let sleep = tokio::time::sleep_until(Instant::now());
        tokio::pin!(sleep);
        let mut armed: Option<Instant> = None;
        loop {
            let work = std::future::poll_fn(|cx| {
                let shared = &*self.shared;
                let mut q = shared.queue();
                let urgent = q.closing || !q.flushes.is_empty();
                // An emitter waits for room: the front batch goes now. A
                // sealed batch is due at once; the open one when full or
                // when its window is over.
                let due = urgent
                    || q.waiting_for_room
                    || !q.sealed.is_empty()
                    || q.open.as_ref().is_some_and(|front| {
                        if front.bytes >= shared.tuning.max_bytes {
                            return true;
                        }
                        let deadline = front.first_at + shared.tuning.window;
                        if armed != Some(deadline) {
                            sleep.as_mut().reset(deadline);
                            armed = Some(deadline);
                        }
                        sleep.as_mut().poll(cx).is_ready()
                    });
                if !due {
                    if !q.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        q.writer = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
                // A flush or the close takes everything queued; otherwise
                // the due batch (the front: sealed, or alone and timed out).
                let batches: Vec<Batch> = if urgent {
                    let open = q.open.take();
                    q.sealed.drain(..).chain(open).collect()
                } else {
                    match q.sealed.pop_front() {
                        Some(front) => vec![front],
                        None => q.open.take().into_iter().collect(),
                    }
                };
                q.queued -= batches.iter().map(Batch::len).sum::<usize>();
                if let Some(len) = batches.iter().rev().find_map(Batch::last_delta_len) {
                    q.delta_room = len;
                }
                // Busy until it looks again: an emit need not wake it.
                q.writer = None;
                let work = Work {
                    batches,
                    flushes: std::mem::take(&mut q.flushes),
                    close: q.closing,
                };
                if std::mem::take(&mut q.waiting_for_room) {
                    drop(q);
                    shared.room.notify_waiters();
                }
                Poll::Ready(work)
            })
            .await;
            let mut result = None;
            for batch in work.batches {
                result = Some(self.append(batch.into_events()).await);
            }
            if result.is_some() {
                // Events queued while the writer was appending are coalesced
                // from now, when it looks at them again, as the writer with
                // a channel did (it read them only after its append): a slow
                // store gets batches no smaller than before.
                let now = Instant::now();
                if let Some(open) = self.shared.queue().open.as_mut() {
                    open.first_at = open.first_at.max(now);
                }
            }
            if !work.flushes.is_empty() {
                let r = match result {
                    Some(r) => r,
                    None => self.append(Vec::new()).await,
                };
                for reply in work.flushes {
                    let _ = reply.send(r.clone());
                }
            }
            if work.close {
                return;
            }
        }
    }

    /// Append one batch (retrying transient failures); after a failure,
    /// drops it instead. Returns the last persisted seq.
    async fn append(&mut self, pending: Vec<EngineEvent>) -> Result<u64, LogError> {
        if let Some(f) = self.shared.failure() {
            return Err(f);
        }
        if pending.is_empty() {
            return Ok(self.shared.last_seq.load(Ordering::SeqCst));
        }
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            // Converted per attempt from the batch itself: no copy of the
            // converted events is kept for a retry that rarely comes.
            let events: Vec<NewEvent> = pending.iter().map(EngineEvent::to_new_event).collect();
            match self
                .store
                .append_events(self.run_id, self.fence, events)
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

    fn unspawned(
        store: Arc<MemoryRunStore>,
        id: RunId,
        window: Duration,
    ) -> (RunLog, impl Future<Output = ()> + Send + 'static) {
        RunLog::new(
            store,
            Arc::new(MemoryNotifier::new()),
            id,
            Fence(1),
            LogTuning {
                window,
                max_bytes: 16 * 1024,
            },
            1,
            CancellationToken::new(),
        )
    }

    fn delta(s: &str) -> EngineEvent {
        EngineEvent::TextDelta { content: s.into() }
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_flushes_without_a_later_event() {
        let (store, id) = setup().await;
        let (log, writer) = unspawned(store.clone(), id, Duration::from_millis(50));
        let writer = tokio::spawn(writer);
        log.emit(delta("a")).await;
        log.emit(delta("b")).await;
        tokio::time::sleep(Duration::from_millis(49)).await;
        assert!(store.events_after(id, 1, 10).await.unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(2)).await;
        let evs = store.events_after(id, 1, 10).await.unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].payload["content"], "ab");
        // The next window starts at its own first event.
        tokio::time::sleep(Duration::from_millis(500)).await;
        log.emit(delta("c")).await;
        tokio::time::sleep(Duration::from_millis(51)).await;
        assert_eq!(store.events_after(id, 1, 10).await.unwrap().len(), 2);
        log.close().await;
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn dropping_every_handle_writes_what_is_queued_and_stops() {
        let (store, id) = setup().await;
        let (log, writer) = unspawned(store.clone(), id, Duration::from_secs(3600));
        let writer = tokio::spawn(writer);
        let other = log.clone();
        log.emit(delta("x")).await;
        drop(log);
        other.emit(delta("y")).await;
        drop(other);
        writer.await.unwrap();
        let evs = store.events_after(id, 1, 10).await.unwrap();
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].payload["content"], "xy");
    }

    #[tokio::test]
    async fn a_full_queue_waits_for_the_writer_and_a_dropped_writer_fails_flushes() {
        let (store, id) = setup().await;
        let (log, writer) = unspawned(store.clone(), id, Duration::from_secs(3600));
        // Nothing merges: each event takes a place in the queue.
        let started = |turn| EngineEvent::TurnStarted {
            turn,
            estimated_input_tokens: 0,
        };
        for turn in 0..QUEUE_CAPACITY as u32 {
            log.emit(started(turn)).await;
        }
        let one_more = log.emit(started(u32::MAX));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), one_more)
                .await
                .is_err(),
            "a full queue makes emit wait"
        );
        let writer = tokio::spawn(writer);
        tokio::time::timeout(Duration::from_secs(5), log.emit(started(u32::MAX)))
            .await
            .expect("the writer makes room");
        assert_eq!(log.flush().await.unwrap(), 1 + QUEUE_CAPACITY as u64 + 1);
        writer.abort();
        let _ = writer.await;
        assert!(log.flush().await.is_err(), "no writer: flush fails");
        log.emit(started(0)).await;
    }

    #[test]
    fn queued_batches_hold_what_merging_each_event_into_the_last_gives() {
        let pieces = [
            DeltaRef::Text("ab"),
            DeltaRef::File {
                path: "a",
                content: "0123456789",
            },
            DeltaRef::File {
                path: "b",
                content: "xy",
            },
            DeltaRef::Thinking("t"),
        ];
        // A small deterministic generator: every mix of borrowed, owned and
        // non-content events, across size-cap seals.
        let mut seed = 7u64;
        for round in 0..400 {
            // Half the rounds seal batches at a small cap, half never do.
            let tuning = LogTuning {
                window: Duration::from_secs(3600),
                max_bytes: if round % 2 == 0 { 40 } else { 1 << 20 },
            };
            let mut q = Queue::default();
            let mut reference: Vec<EngineEvent> = Vec::new();
            for _ in 0..60 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let pick = (seed >> 33) as usize % 6;
                let e = match pick {
                    4 => EngineEvent::TurnStarted {
                        turn: 1,
                        estimated_input_tokens: 0,
                    },
                    5 => pieces[(seed >> 40) as usize % 4].to_event(),
                    i => {
                        q.push_delta(pieces[i], &tuning);
                        let e = pieces[i].to_event();
                        merge_into(&mut reference, e, tuning.max_bytes);
                        continue;
                    }
                };
                q.push(e.clone(), &tuning);
                merge_into(&mut reference, e, tuning.max_bytes);
            }
            let queued = q.queued;
            let all: Vec<EngineEvent> = q
                .sealed
                .drain(..)
                .chain(q.open.take())
                .flat_map(Batch::into_events)
                .collect();
            assert_eq!(all.len(), queued);
            // Batches may split a merge at a seal; joined, the text is the same.
            let text = |evs: &[EngineEvent]| {
                evs.iter()
                    .map(|e| format!("{}:{}", e.kind(), e.content_len().unwrap_or(0)))
                    .collect::<Vec<_>>()
            };
            let total = |evs: &[EngineEvent]| -> usize {
                evs.iter().filter_map(EngineEvent::content_len).sum()
            };
            assert_eq!(total(&all), total(&reference));
            assert!(all.len() >= reference.len(), "{:?}", text(&all));
            if tuning.max_bytes == 1 << 20 {
                assert_eq!(all, reference);
            }
        }
    }

    /// Merge as the writer did, one event at a time, into its pending list.
    fn merge_into(pending: &mut Vec<EngineEvent>, e: EngineEvent, cap: usize) {
        if e.is_content() {
            if let Some(last) = pending.last_mut() {
                if let Some(e) = last.try_merge(e, cap) {
                    pending.push(e);
                }
                return;
            }
        }
        pending.push(e);
    }
}
