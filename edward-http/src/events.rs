//! `GET /v1/runs/{id}/events`: SSE, or a long-poll with `Accept: application/json`.
//!
//! The run's `seq` is the one cursor: `id:` of every SSE event, the
//! `Last-Event-ID` a client resumes from, `?after=N`. The backlog is
//! replayed from the store, then the stream follows the run's shared hub
//! (`hub.rs`: one engine tail per run, each frame encoded once), so a
//! resumed stream has no gap and no duplicate. A client going away only
//! drops its reader: the run is never cancelled by a disconnect.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use edward_core::{Run, RunId, StoreError};
use futures::StreamExt;

use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract;
use crate::hub;
use crate::metrics::SubscriberGuard;
use crate::model::EventView;
use crate::state::AppState;

/// Long-poll answers carry at most this many events.
const LONG_POLL_MAX: usize = 512;
/// Default `wait` of a long-poll.
const LONG_POLL_WAIT: Duration = Duration::from_secs(30);

/// Stream a run's events.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"),
        ("after" = Option<u64>, Query, description = "Only events with seq > after (0 = from the start). `Last-Event-ID` wins when both are given"),
        ("wait" = Option<String>, Query, description = "Long-poll only: how long to wait for the next events (`30s`, `500ms`; default 30 s, capped by the server)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq (sent by SSE clients on reconnect)"),
    ),
    responses(
        (status = 200, description = "`text/event-stream`: `retry:` hint, then `id: <seq>`, `event: <type>`, `data: <event JSON>` per event; `:` comment heartbeats; ends after `run_finished`, or with an `event: reconnect` (`data: {\"after\": seq, \"reason\"}`) at the maximum stream age or shutdown. With `Accept: application/json`: a long-poll answering the next events as a JSON array (empty when `wait` passed)", body = Vec<EventView>),
        (status = 404, body = ErrorBody),
        (status = 422, description = "Invalid `after`, `wait` or `Last-Event-ID`", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let last_event_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("invalid"));
    let after: u64 = match extract::query("Last-Event-ID", last_event_id)? {
        Some(seq) => seq,
        None => extract::query("after", q.get("after").map(String::as_str))?.unwrap_or(0),
    };
    let wait = extract::duration("wait", q.get("wait").map(String::as_str))?;
    let run = extract::owned_run(&state, &caller, &id).await?;
    if wants_json(&headers) {
        let wait = wait.unwrap_or(LONG_POLL_WAIT).min(state.config.max_wait);
        return long_poll(&state, run.id, after, wait).await;
    }
    Ok(sse(state, &run, after))
}

/// `Accept: application/json` without `text/event-stream`.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    accept.contains("application/json") && !accept.contains("text/event-stream")
}

fn sse(state: AppState, run: &Run, after: u64) -> Response {
    let guard = SubscriberGuard::new(&state.metrics.sse_subscribers);
    let retry = Bytes::from(format!(
        "retry: {}\n\n",
        state.config.retry_hint.as_millis()
    ));
    let max_age = state.config.max_stream_age;
    let heartbeat = state.config.heartbeat;
    let shutdown = state.shutdown.clone();
    // Boxed: the generator below then holds a pointer, not a second copy.
    let mut frames = Box::pin(hub::subscribe(
        state.hubs.clone(),
        state.engine.clone(),
        run.id,
        after,
        run.last_seq,
        !run.status.is_terminal(),
    ));
    let stream = async_stream::stream! {
        let _guard = guard;
        yield Ok::<Bytes, Infallible>(retry);
        // Created once: 1,000 subscribers re-registering on the shared
        // token (or re-arming a timer) per event would contend on its lock.
        let stop = shutdown.cancelled();
        tokio::pin!(stop);
        // One timer for both the heartbeat and the maximum age.
        let born = tokio::time::Instant::now();
        let old_at = born + max_age;
        let timer = tokio::time::sleep_until((born + heartbeat).min(old_at));
        tokio::pin!(timer);
        let mut last_write = born;
        let mut last = after;
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => {
                    yield Ok(reconnect(last, "shutdown"));
                    break;
                }
                _ = &mut timer => {
                    let now = tokio::time::Instant::now();
                    if now >= old_at {
                        yield Ok(reconnect(last, "max_stream_age"));
                        break;
                    }
                    // Quiet for a whole interval: a comment, so proxies with
                    // idle timeouts keep the connection. Otherwise wait out
                    // the interval from the last write.
                    if now.duration_since(last_write) >= heartbeat {
                        last_write = now;
                        yield Ok(Bytes::from_static(b":\n\n"));
                    }
                    timer.as_mut().reset((last_write + heartbeat).min(old_at));
                }
                item = frames.next() => match item {
                    Some(Ok(f)) => {
                        last = f.seq;
                        last_write = tokio::time::Instant::now();
                        state.metrics.events_streamed.inc();
                        yield Ok(f.bytes.clone());
                        if f.terminal {
                            break;
                        }
                    }
                    Some(Err(err)) => {
                        yield Ok(error_event(err, last));
                        break;
                    }
                    None => break,
                },
            }
        }
    };
    let mut res = Body::from_stream(stream).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx: do not buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

/// Tells the client to reconnect with `Last-Event-ID`/`after` = `after`.
/// It has no `id:`, so a browser's last event id stays the last real seq.
fn reconnect(after: u64, reason: &str) -> Bytes {
    sse_block(
        "reconnect",
        &serde_json::json!({ "after": after, "reason": reason }),
    )
}

fn error_event(err: StoreError, after: u64) -> Bytes {
    let retryable = err.is_retryable();
    let body = ApiError::from(err).body();
    sse_block(
        "error",
        &serde_json::json!({ "error": body.error, "after": after, "retryable": retryable }),
    )
}

/// `event: kind`, `data: json` (no `id:`).
fn sse_block(kind: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

async fn long_poll(
    state: &AppState,
    run_id: RunId,
    after: u64,
    wait: Duration,
) -> Result<Response, ApiError> {
    let store = state.engine.store();
    let mut out = store.events_after(run_id, after, LONG_POLL_MAX).await?;
    if out.is_empty() && !wait.is_zero() {
        let mut tail = state.engine.raw_events(run_id, after);
        let first = tokio::select! {
            r = tokio::time::timeout(wait, tail.next()) => r.ok().flatten(),
            _ = state.shutdown.cancelled() => None,
        };
        if let Some(first) = first {
            let first = first?;
            let seq = first.seq;
            out.push(first);
            out.extend(store.events_after(run_id, seq, LONG_POLL_MAX - 1).await?);
        }
    }
    let next_after = out.last().map_or(after, |e| e.seq);
    state.metrics.events_streamed.inc_by(out.len() as u64);
    let mut res = Json(out.into_iter().map(EventView::from).collect::<Vec<_>>()).into_response();
    if let Ok(v) = HeaderValue::from_str(&next_after.to_string()) {
        res.headers_mut().insert("x-next-after", v);
    }
    Ok(res)
}
