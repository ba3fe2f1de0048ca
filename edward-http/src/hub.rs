//! One shared tail per watched run, fanned out to its SSE subscribers.
//!
//! Without it every subscriber ran its own engine tail: one append meant a
//! store read and a JSON encoding per subscriber. A [`Hub`] is created by a
//! run's first subscriber and dropped with its last; its task runs **one**
//! engine tail, encodes each event's SSE frame **once** ([`Frame`], shared
//! `Bytes`) and appends it to a bounded ring of recent frames, then bumps a
//! `watch` channel holding the newest seq.
//!
//! A subscriber ([`subscribe`]) keeps its own cursor (`seq`) and loops:
//! 1. mark the watch value seen, then, under the ring's lock, take the
//!    frames after its cursor (so a frame published after the read wakes
//!    it, one published before is in what it took);
//! 2. if its cursor is older than the ring's oldest frame (the backlog of a
//!    resumed stream, or frames evicted while a slow client was not reading
//!    — a lag), replay that gap from the store first;
//! 3. send, advance the cursor, and wait for the next change.
//!
//! The cursor makes it exact: nothing at or below it is sent again, nothing
//! above it is skipped. An idle subscriber holds a pointer to the hub, its
//! cursor and a `watch` receiver; the ring is allocated as frames arrive.
//! When the hub's tail ends without the terminal event (a store error) its
//! subscribers fall back to their own engine tail from their cursor, which
//! reports the error itself.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use edward_core::engine::Engine;
use edward_core::{RunEvent, RunId, StoreError};
use futures::Stream;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Store pages read during a backlog or gap replay.
const PAGE: usize = 512;
/// Frames a subscriber takes from the ring per lock.
const BATCH: usize = 64;

/// One run event as an SSE frame, encoded once and shared by every
/// subscriber: `id: seq`, `event: type`, `data: {run_id, seq, type, at,
/// payload}`.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) seq: u64,
    pub(crate) terminal: bool,
    pub(crate) bytes: Bytes,
}

impl Frame {
    pub(crate) fn encode(e: &RunEvent) -> Frame {
        let data = serde_json::to_string(e).unwrap_or_else(|_| "{}".to_string());
        // Event types come from the engine; never let one break the framing.
        let kind: String = e
            .kind
            .chars()
            .filter(|c| !matches!(c, '\n' | '\r'))
            .collect();
        // serde_json never writes a raw newline, so `data` is one line.
        let text = format!("id: {}\nevent: {kind}\ndata: {data}\n\n", e.seq);
        Frame {
            seq: e.seq,
            terminal: e.is_terminal(),
            bytes: Bytes::from(text),
        }
    }
}

/// A frame as the ring and the subscribers share it.
pub(crate) type SharedFrame = Arc<Frame>;

/// Tuning of the hubs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HubConfig {
    /// Recent frames each hub keeps: a subscriber further behind (a slow
    /// client, or a resume from an older seq) replays the gap from the store.
    pub(crate) ring: usize,
}

/// Counters the hubs report (registered in `/metrics`).
#[derive(Clone, Default)]
pub(crate) struct HubMetrics {
    /// Hub tails running.
    pub(crate) hubs: Gauge,
    /// Times a subscriber fell behind its hub's ring and replayed from the store.
    pub(crate) lag_recoveries: Counter<u64, AtomicU64>,
}

struct Ring {
    frames: VecDeque<SharedFrame>,
    /// The newest seq published (the tail's start before the first frame).
    last_sent: u64,
    /// The tail ended without the terminal event.
    ended: bool,
}

/// What a subscriber takes from the ring in one look.
enum Take {
    /// Replay `(cursor, upto]` from the store first.
    Replay { upto: u64 },
    /// These frames (possibly none: wait).
    Frames(Vec<SharedFrame>),
    /// Nothing more will come from the hub.
    Ended,
}

struct Shared {
    ring: Mutex<Ring>,
    ring_cap: usize,
    newest: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, frame: SharedFrame) {
        let seq = frame.seq;
        {
            let mut ring = self.lock();
            ring.last_sent = seq;
            if ring.frames.len() >= self.ring_cap.max(1) {
                ring.frames.pop_front();
            }
            ring.frames.push_back(frame);
        }
        self.newest.send_replace(seq);
    }

    fn end(&self) {
        self.lock().ended = true;
        self.newest.send_modify(|_| {});
    }

    fn take(&self, after: u64) -> Take {
        let ring = self.lock();
        let boundary = ring
            .frames
            .front()
            .map_or(ring.last_sent, |f| f.seq.saturating_sub(1));
        if after < boundary {
            return Take::Replay { upto: boundary };
        }
        let frames: Vec<SharedFrame> = ring
            .frames
            .iter()
            .skip_while(|f| f.seq <= after)
            .take(BATCH)
            .cloned()
            .collect();
        if frames.is_empty() && ring.ended {
            return Take::Ended;
        }
        Take::Frames(frames)
    }
}

type HubMap = Mutex<HashMap<RunId, (u64, Weak<Hub>)>>;

/// A run's shared tail. Subscribers hold it; the last one dropping it stops
/// the tail task.
pub(crate) struct Hub {
    id: u64,
    run_id: RunId,
    shared: Arc<Shared>,
    stop: CancellationToken,
    map: Weak<HubMap>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(map) = self.map.upgrade() {
            remove(&map, self.run_id, self.id);
        }
    }
}

fn remove(map: &HubMap, run_id: RunId, id: u64) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.get(&run_id).is_some_and(|(i, _)| *i == id) {
        map.remove(&run_id);
    }
}

/// The hubs of this process, by run.
pub(crate) struct Hubs {
    map: Arc<HubMap>,
    next_id: AtomicU64,
    config: HubConfig,
    pub(crate) metrics: HubMetrics,
}

impl Hubs {
    pub(crate) fn new(config: HubConfig) -> Self {
        Hubs {
            map: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(1),
            config,
            metrics: HubMetrics::default(),
        }
    }

    /// The run's hub, created (its tail starting after `start`) if none is
    /// live.
    fn get(&self, engine: &Engine, run_id: RunId, start: u64) -> Arc<Hub> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hub) = map.get(&run_id).and_then(|(_, w)| w.upgrade()) {
            return hub;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            ring: Mutex::new(Ring {
                frames: VecDeque::new(),
                last_sent: start,
                ended: false,
            }),
            ring_cap: self.config.ring,
            newest: watch::Sender::new(start),
        });
        let stop = CancellationToken::new();
        let hub = Arc::new(Hub {
            id,
            run_id,
            shared: shared.clone(),
            stop: stop.clone(),
            map: Arc::downgrade(&self.map),
        });
        map.insert(run_id, (id, Arc::downgrade(&hub)));
        drop(map);
        let tail = engine.raw_events(run_id, start);
        let gauge = self.metrics.hubs.clone();
        let map = Arc::downgrade(&self.map);
        tokio::spawn(async move {
            gauge.inc();
            let mut tail = tail;
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    item = tail.next() => match item {
                        Some(Ok(e)) => {
                            let frame = Arc::new(Frame::encode(&e));
                            let terminal = frame.terminal;
                            shared.publish(frame);
                            if terminal {
                                break;
                            }
                        }
                        Some(Err(e)) => {
                            tracing::warn!(%run_id, error = %e, "shared tail failed; subscribers read on their own");
                            shared.end();
                            break;
                        }
                        None => {
                            shared.end();
                            break;
                        }
                    },
                }
            }
            // A later subscriber starts a fresh hub rather than join a dead one.
            if let Some(map) = map.upgrade() {
                remove(&map, run_id, id);
            }
            gauge.dec();
        });
        hub
    }

    /// Hubs live now (tests).
    #[cfg(test)]
    fn live(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The run's frames with seq > `after`, ending after the terminal one: the
/// backlog from the store, then the run's shared hub (created with its tail
/// after `start`, the run's last seq when the request came). A finished run
/// (`live == false`) is read from the store alone.
pub(crate) fn subscribe(
    hubs: Arc<Hubs>,
    engine: Engine,
    run_id: RunId,
    after: u64,
    start: u64,
    live: bool,
) -> impl Stream<Item = Result<SharedFrame, StoreError>> + Send + 'static {
    async_stream::try_stream! {
        let mut last = after;
        if live {
            let hub = hubs.get(&engine, run_id, start);
            let mut newest = hub.shared.newest.subscribe();
            let mut first = true;
            loop {
                // Seen before the look: a frame published after it wakes us.
                let seen = *newest.borrow_and_update();
                match hub.shared.take(last) {
                    Take::Replay { upto } => {
                        if !first {
                            tracing::debug!(%run_id, last, upto, "SSE subscriber fell behind the ring; replaying from the store");
                            hubs.metrics.lag_recoveries.inc();
                        }
                        let frames = Box::pin(replay(&engine, run_id, last, upto)).await?;
                        if frames.is_empty() {
                            // The store has less than the hub published: never.
                            break;
                        }
                        for f in frames {
                            last = f.seq;
                            let terminal = f.terminal;
                            yield f;
                            if terminal {
                                return;
                            }
                        }
                    }
                    Take::Frames(frames) if frames.is_empty() => {
                        if newest.changed().await.is_err() {
                            break;
                        }
                    }
                    Take::Frames(frames) => {
                        for f in frames {
                            last = f.seq;
                            let terminal = f.terminal;
                            yield f;
                            if terminal {
                                return;
                            }
                        }
                        // Caught up with what was published at the look:
                        // wait rather than look again.
                        if last >= seen && newest.changed().await.is_err() {
                            break;
                        }
                    }
                    Take::Ended => break,
                }
                first = false;
            }
        }
        // The hub ended early (or the run had finished): our own tail.
        let mut tail = engine.raw_events(run_id, last);
        while let Some(e) = tail.next().await {
            let f = Arc::new(Frame::encode(&e?));
            let terminal = f.terminal;
            yield f;
            if terminal {
                break;
            }
        }
    }
}

/// The stored events in `(after, upto]`, encoded (up to the first terminal).
async fn replay(
    engine: &Engine,
    run_id: RunId,
    mut after: u64,
    upto: u64,
) -> Result<Vec<SharedFrame>, StoreError> {
    let mut out = Vec::new();
    while after < upto {
        let page = engine.store().events_after(run_id, after, PAGE).await?;
        let Some(newest) = page.last().map(|e| e.seq) else {
            break;
        };
        for e in page.iter().filter(|e| e.seq <= upto) {
            let f = Arc::new(Frame::encode(e));
            let terminal = f.terminal;
            out.push(f);
            if terminal {
                return Ok(out);
            }
        }
        if newest <= after {
            break;
        }
        after = newest;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use edward_core::memory::MemoryBackends;
    use edward_core::{Fence, NewEvent, Notifier, RunStatus, RunStore};
    use futures::StreamExt;

    use super::*;

    struct Fixture {
        mem: MemoryBackends,
        engine: Engine,
        run: RunId,
        _dir: tempfile::TempDir,
    }

    async fn fixture() -> Fixture {
        let mem = MemoryBackends::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Engine::builder()
            .backend(edward_core::engine::Backend::new(
                mem.store.clone(),
                mem.queue.clone(),
                mem.notifier.clone(),
            ))
            .sandbox_provider(Arc::new(edward_sandbox::LocalSandboxProvider::new(
                dir.path(),
            )))
            .build()
            .expect("engine");
        let run = engine
            .submit(edward_core::engine::RunRequest::new("u", "c", "p"))
            .await
            .expect("submit");
        mem.store.start_run(run, Fence(1)).await.expect("start");
        Fixture {
            mem,
            engine,
            run,
            _dir: dir,
        }
    }

    impl Fixture {
        async fn append(&self, n: usize) -> u64 {
            let evs = (0..n)
                .map(|i| NewEvent::new("bench", serde_json::json!({ "i": i })))
                .collect();
            let done = self
                .mem
                .store
                .append_events(self.run, Fence(1), evs)
                .await
                .expect("append");
            let seq = done.last().map_or(0, |e| e.seq);
            self.mem
                .notifier
                .notify_events(self.run, seq)
                .await
                .expect("notify");
            seq
        }

        async fn finish(&self) -> u64 {
            let done = self
                .mem
                .store
                .finish_run(
                    self.run,
                    Some(Fence(1)),
                    RunStatus::Completed,
                    "done",
                    vec![NewEvent::new("run_finished", serde_json::json!({}))],
                )
                .await
                .expect("finish");
            let seq = done.last().map_or(0, |e| e.seq);
            self.mem
                .notifier
                .notify_events(self.run, seq)
                .await
                .expect("notify");
            seq
        }
    }

    async fn seqs(s: impl Stream<Item = Result<SharedFrame, StoreError>>) -> Vec<u64> {
        let frames: Vec<_> = tokio::time::timeout(Duration::from_secs(20), s.collect::<Vec<_>>())
            .await
            .expect("stream ends");
        frames.into_iter().map(|f| f.expect("frame").seq).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lagging_subscriber_replays_the_gap_and_misses_nothing() {
        let f = fixture().await;
        let hubs = Arc::new(Hubs::new(HubConfig { ring: 4 }));
        let mut slow = Box::pin(subscribe(hubs.clone(), f.engine.clone(), f.run, 0, 1, true));
        assert_eq!(slow.next().await.expect("first").expect("ok").seq, 1);
        // A fast subscriber drains as the hub publishes; the slow one reads
        // nothing until everything is out, so its channel overruns.
        let fast = tokio::spawn(seqs(subscribe(
            hubs.clone(),
            f.engine.clone(),
            f.run,
            0,
            1,
            true,
        )));
        for _ in 0..20 {
            f.append(3).await;
        }
        let last = f.finish().await;
        assert_eq!(
            fast.await.expect("fast"),
            (1..=last).collect::<Vec<_>>(),
            "the fast subscriber sees every seq once"
        );
        let rest = seqs(slow).await;
        assert_eq!(rest, (2..=last).collect::<Vec<_>>(), "no gap, no duplicate");
        assert!(
            hubs.metrics.lag_recoveries.get() >= 1,
            "the slow subscriber lagged and recovered from the store"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_hub_is_dropped_with_its_last_subscriber() {
        let f = fixture().await;
        let hubs = Arc::new(Hubs::new(HubConfig { ring: 16 }));
        let mut a = Box::pin(subscribe(hubs.clone(), f.engine.clone(), f.run, 0, 1, true));
        let mut b = Box::pin(subscribe(hubs.clone(), f.engine.clone(), f.run, 1, 1, true));
        assert_eq!(a.next().await.expect("a").expect("ok").seq, 1);
        f.append(1).await;
        assert_eq!(a.next().await.expect("a").expect("ok").seq, 2);
        assert_eq!(b.next().await.expect("b").expect("ok").seq, 2);
        assert_eq!(hubs.live(), 1, "two subscribers share one hub");
        // The task's gauge is up once the task runs.
        tokio::time::timeout(Duration::from_secs(5), async {
            while hubs.metrics.hubs.get() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the hub task runs");
        drop(a);
        assert_eq!(hubs.live(), 1, "still one subscriber");
        drop(b);
        assert_eq!(hubs.live(), 0, "the last subscriber dropped the hub");
        tokio::time::timeout(Duration::from_secs(5), async {
            while hubs.metrics.hubs.get() != 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the hub's tail task ends");
        // A new subscriber gets a fresh hub and everything after its cursor.
        f.append(2).await;
        let c = tokio::spawn(seqs(subscribe(
            hubs.clone(),
            f.engine.clone(),
            f.run,
            1,
            4,
            true,
        )));
        let last = f.finish().await;
        assert_eq!(c.await.expect("c"), (2..=last).collect::<Vec<_>>());
    }
}
