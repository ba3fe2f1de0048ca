//! Tailing a run's events: replay from the store, then live via notifier
//! hints plus a periodic backstop re-read. Every item comes from the store
//! after the last seq seen, so there is no gap and no duplicate; the stream
//! ends after the terminal event.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{Notifier, RunEvent, RunId, RunStore, StoreError};

struct Tail {
    store: Arc<dyn RunStore>,
    notifier: Arc<dyn Notifier>,
    run_id: RunId,
    last: u64,
    buf: VecDeque<RunEvent>,
    hints: Option<BoxStream<'static, u64>>,
    subscribed: bool,
    done: bool,
    /// The last read returned a partial page: nothing more was stored then,
    /// so wait for a hint instead of reading again at once.
    caught_up: bool,
    backstop: Duration,
    /// The backstop timer, moved to a new deadline for each wait rather
    /// than created and dropped per wait (once per batch a tailer sees).
    backstop_timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

const PAGE: usize = 512;

pub(crate) fn tail(
    store: Arc<dyn RunStore>,
    notifier: Arc<dyn Notifier>,
    run_id: RunId,
    after_seq: u64,
    backstop: Duration,
) -> BoxStream<'static, Result<RunEvent, StoreError>> {
    let state = Tail {
        store,
        notifier,
        run_id,
        last: after_seq,
        buf: VecDeque::new(),
        hints: None,
        subscribed: false,
        done: false,
        caught_up: false,
        backstop,
        backstop_timer: None,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.buf.pop_front() {
                if e.seq <= s.last {
                    continue;
                }
                s.last = e.seq;
                if e.is_terminal() {
                    s.done = true;
                    s.buf.clear();
                }
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            // Subscribe before reading so no hint between read and wait is lost.
            if !s.subscribed {
                s.subscribed = true;
                s.hints = s.notifier.subscribe_events(s.run_id).await.ok();
            }
            if std::mem::take(&mut s.caught_up) {
                // One read per hint: the page just drained was partial.
            } else {
                match s.store.events_after(s.run_id, s.last, PAGE).await {
                    Ok(evs) if !evs.is_empty() => {
                        s.caught_up = evs.len() < PAGE;
                        s.buf.extend(evs);
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                }
                match s.store.get_run(s.run_id).await {
                    Ok(None) => {
                        s.done = true;
                        return Some((Err(StoreError::NotFound { run_id: s.run_id }), s));
                    }
                    Ok(Some(run)) if run.status.is_terminal() && run.last_seq <= s.last => {
                        return None;
                    }
                    Ok(Some(_)) => {}
                    Err(e) => {
                        s.done = true;
                        return Some((Err(e), s));
                    }
                }
            }
            // Wait for a hint newer than what we have, or the backstop.
            let at = tokio::time::Instant::now() + s.backstop;
            let deadline = match s.backstop_timer.as_mut() {
                Some(timer) => {
                    timer.as_mut().reset(at);
                    timer
                }
                None => s
                    .backstop_timer
                    .insert(Box::pin(tokio::time::sleep_until(at))),
            };
            loop {
                let hint = match s.hints.as_mut() {
                    Some(h) => {
                        tokio::select! {
                            h = h.next() => h,
                            _ = deadline.as_mut() => break,
                        }
                    }
                    None => {
                        deadline.as_mut().await;
                        break;
                    }
                };
                match hint {
                    Some(seq) if seq > s.last => break,
                    Some(_) => {}
                    None => {
                        s.hints = None;
                    }
                }
            }
        }
    });
    stream.boxed()
}
