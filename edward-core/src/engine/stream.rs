//! The nameable, `Unpin` event streams [`Engine::events`](super::Engine::events)
//! and [`Engine::raw_events`](super::Engine::raw_events) return.

use std::pin::Pin;
use std::task::{Context, Poll};

use chrono::{DateTime, Utc};
use futures::Stream;
use futures::stream::BoxStream;
use serde::{Serialize, Serializer};

use super::events::EngineEvent;
use crate::{RunEvent, RunId, StoreError};

/// One persisted run event, decoded into the engine's vocabulary.
///
/// Serialises to the same JSON object as the stored [`RunEvent`]
/// (`{"run_id","seq","type","at","payload"}`), which [`TypedEvent::raw`] also
/// gives back.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TypedEvent {
    /// The run.
    pub run_id: RunId,
    /// 1, 2, 3 … gap-free per run.
    pub seq: u64,
    /// When it was persisted.
    pub at: DateTime<Utc>,
    /// What happened.
    pub event: EngineEvent,
    raw: RunEvent,
}

impl TypedEvent {
    /// Decode a stored event.
    pub fn decode(raw: RunEvent) -> Result<Self, EventStreamError> {
        // Read in place: the raw event is kept, so the payload is not
        // copied to add the tag first.
        match EngineEvent::decode_stored(&raw.kind, &raw.payload) {
            Ok(event) => Ok(TypedEvent {
                run_id: raw.run_id,
                seq: raw.seq,
                at: raw.at,
                event,
                raw,
            }),
            Err(source) => Err(EventStreamError::Undecodable {
                run_id: raw.run_id,
                seq: raw.seq,
                kind: raw.kind,
                source,
            }),
        }
    }

    /// The stored form, with the payload as JSON.
    pub fn raw(&self) -> &RunEvent {
        &self.raw
    }

    /// The stored form, by value.
    pub fn into_raw(self) -> RunEvent {
        self.raw
    }

    /// Whether this is the run's terminal event (`run_finished`).
    pub fn is_terminal(&self) -> bool {
        self.raw.is_terminal()
    }
}

impl Serialize for TypedEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

/// Why an event stream yielded an error item.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventStreamError {
    /// Reading the store failed; the stream ends after this item. Resume with
    /// [`Engine::events`](super::Engine::events) from the last seq received.
    #[error("reading run events failed")]
    Store(#[from] StoreError),
    /// A stored event is not in this version's vocabulary (written by a newer
    /// version, or corrupt). The stream goes on with the next event; the raw
    /// event is still readable through [`Engine::raw_events`](super::Engine::raw_events).
    #[error("run {run_id}: event {seq} of type `{kind}` cannot be decoded")]
    Undecodable {
        /// The run.
        run_id: RunId,
        /// The event's seq.
        seq: u64,
        /// Its stored type.
        kind: String,
        /// What the decoder said.
        #[source]
        source: serde_json::Error,
    },
}

impl EventStreamError {
    /// Whether retrying (resuming the stream) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            EventStreamError::Store(e) => e.is_retryable(),
            EventStreamError::Undecodable { .. } => false,
        }
    }
}

/// A run's stored events, replayed then live, ending after `run_finished`.
/// `Unpin`: call [`RawEventStream::next`] (or `StreamExt::next`) directly.
pub struct RawEventStream {
    inner: BoxStream<'static, Result<RunEvent, StoreError>>,
}

impl RawEventStream {
    pub(crate) fn new(inner: BoxStream<'static, Result<RunEvent, StoreError>>) -> Self {
        RawEventStream { inner }
    }

    /// The next event; `None` after the terminal event (or after an error).
    pub async fn next(&mut self) -> Option<Result<RunEvent, StoreError>> {
        futures::StreamExt::next(&mut self.inner).await
    }
}

impl Stream for RawEventStream {
    type Item = Result<RunEvent, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for RawEventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawEventStream").finish_non_exhaustive()
    }
}

/// A run's events decoded into [`TypedEvent`]s: replayed from the store after
/// the given seq, then live, ending after `run_finished`. No gap, no
/// duplicate. `Unpin`: call [`EventStream::next`] (or `StreamExt::next`).
#[derive(Debug)]
pub struct EventStream {
    raw: RawEventStream,
}

impl EventStream {
    pub(crate) fn new(raw: RawEventStream) -> Self {
        EventStream { raw }
    }

    /// The next event; `None` after the terminal event (or after a store error).
    pub async fn next(&mut self) -> Option<Result<TypedEvent, EventStreamError>> {
        futures::StreamExt::next(self).await
    }
}

impl Stream for EventStream {
    type Item = Result<TypedEvent, EventStreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.raw).poll_next(cx).map(|item| {
            item.map(|r| match r {
                Ok(raw) => TypedEvent::decode(raw),
                Err(e) => Err(EventStreamError::Store(e)),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: &str, payload: serde_json::Value) -> RunEvent {
        RunEvent {
            run_id: RunId::new(),
            seq: 7,
            kind: kind.into(),
            at: Utc::now(),
            payload,
        }
    }

    #[test]
    fn decodes_known_events_and_keeps_the_raw_json() {
        let r = raw("text_delta", serde_json::json!({"content": "hi"}));
        let t = TypedEvent::decode(r.clone()).expect("decodes");
        assert_eq!(t.seq, 7);
        assert_eq!(
            t.event,
            EngineEvent::TextDelta {
                content: "hi".into()
            }
        );
        assert_eq!(t.raw(), &r);
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::to_value(&r).unwrap()
        );
    }

    #[test]
    fn an_unreadable_payload_is_an_error_not_none() {
        let r = raw("text_delta", serde_json::json!({"content": 5}));
        let e = TypedEvent::decode(r).expect_err("wrong field type");
        assert!(matches!(e, EventStreamError::Undecodable { seq: 7, .. }));
        let e = TypedEvent::decode(raw("from_the_future", serde_json::json!({}))).unwrap_err();
        assert!(e.to_string().contains("from_the_future"));
        assert!(!e.is_retryable());
    }

    #[test]
    fn streams_are_unpin_and_send() {
        fn check<T: Unpin + Send + 'static>() {}
        check::<EventStream>();
        check::<RawEventStream>();
    }
}
