//! [`RedisNotifier`]: new-event and cancel signals over pub/sub.
//!
//! One subscriber connection per notifier listens on `{prefix}events`
//! (payload `run_id:seq`) and `{prefix}cancels` (payload `run_id`) and fans
//! messages out in-process through tokio broadcast channels. It pings every
//! few seconds; when the connection drops (or a ping fails) it reconnects
//! with exponential backoff (50 ms doubling to 5 s). Pub/sub keeps nothing
//! for a disconnected subscriber, so after every reconnect each event
//! subscriber gets the hint `u64::MAX` ("something may be missed, re-read
//! the store"); lost cancels are caught by the engine's status check.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use edward_core::{InfraError, Notifier, RunId};
use futures::StreamExt;
use futures::stream::BoxStream;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{RedisBackend, RedisConnectError, infra_err};
use crate::common::broadcast_stream;

const FANOUT_CAPACITY: usize = 1024;
const PING_EVERY: Duration = Duration::from_secs(5);

/// Redis [`Notifier`]. Cloning is cheap; the subscriber task stops when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct RedisNotifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backend: RedisBackend,
    events_channel: String,
    cancels_channel: String,
    /// `(None, RESYNC_HINT)` goes to every run's subscribers.
    events: broadcast::Sender<(Option<RunId>, u64)>,
    cancels: broadcast::Sender<RunId>,
    reconnects: Arc<std::sync::atomic::AtomicU64>,
    _stop: DropGuard,
}

impl RedisNotifier {
    /// The hint every event subscriber gets after the subscriber connection
    /// was re-established: hints may have been lost, re-read the store.
    pub const RESYNC_HINT: u64 = u64::MAX;

    pub(crate) async fn start(backend: RedisBackend) -> Result<Self, RedisConnectError> {
        let events_channel = backend.key("events");
        let cancels_channel = backend.key("cancels");
        let channels = [events_channel.clone(), cancels_channel.clone()];
        let (sink, stream) = subscribe(&backend, &channels).await.map_err(|e| {
            super::classify_connect(&backend.url, backend.url.starts_with("rediss:"), e)
        })?;
        let (events, _) = broadcast::channel(FANOUT_CAPACITY);
        let (cancels, _) = broadcast::channel(FANOUT_CAPACITY);
        let stop = CancellationToken::new();
        let reconnects = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(listen_loop(Listener {
            backend: backend.clone(),
            channels,
            events: events.clone(),
            cancels: cancels.clone(),
            reconnects: reconnects.clone(),
            stop: stop.clone(),
            first: Some((sink, stream)),
        }));
        Ok(RedisNotifier {
            inner: Arc::new(Inner {
                backend,
                events_channel,
                cancels_channel,
                events,
                cancels,
                reconnects,
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// How often the subscriber connection was re-established.
    pub fn reconnects(&self) -> u64 {
        self.inner
            .reconnects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn publish(&self, channel: &str, payload: String) -> Result<(), InfraError> {
        let mut conn = self.inner.backend.conn();
        let _: i64 = redis::cmd("PUBLISH")
            .arg(channel)
            .arg(payload)
            .query_async(&mut conn)
            .await
            .map_err(|e| infra_err(&self.inner.backend.options.prefix, e))?;
        Ok(())
    }
}

async fn subscribe(
    backend: &RedisBackend,
    channels: &[String; 2],
) -> redis::RedisResult<(PubSubSink, PubSubStream)> {
    let timeout = backend.options.connect_timeout;
    let connect = async {
        let mut pubsub = backend.client.get_async_pubsub().await?;
        pubsub.subscribe(&channels[..]).await?;
        Ok(pubsub.split())
    };
    match tokio::time::timeout(timeout * 2, connect).await {
        Ok(r) => r,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "subscribing timed out",
        ))),
    }
}

struct Listener {
    backend: RedisBackend,
    channels: [String; 2],
    events: broadcast::Sender<(Option<RunId>, u64)>,
    cancels: broadcast::Sender<RunId>,
    reconnects: Arc<std::sync::atomic::AtomicU64>,
    stop: CancellationToken,
    first: Option<(PubSubSink, PubSubStream)>,
}

async fn listen_loop(mut l: Listener) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let (mut sink, mut stream) = match l.first.take() {
            Some(pair) => pair,
            None => {
                let subscribed = tokio::select! {
                    () = l.stop.cancelled() => return,
                    r = subscribe(&l.backend, &l.channels) => r,
                };
                match subscribed {
                    Ok(pair) => {
                        l.reconnects
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!("redis subscriber reconnected");
                        // Hints sent while disconnected are gone: tell every
                        // tailer to re-read the store.
                        drop(l.events.send((None, RedisNotifier::RESYNC_HINT)));
                        backoff = Duration::from_millis(50);
                        pair
                    }
                    Err(error) => {
                        tracing::warn!(%error, ?backoff, "redis subscribe failed; retrying");
                        tokio::select! {
                            () = l.stop.cancelled() => return,
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
        };
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.tick().await;
        loop {
            tokio::select! {
                () = l.stop.cancelled() => return,
                msg = stream.next() => match msg {
                    Some(msg) => dispatch(&l, &msg),
                    None => {
                        tracing::warn!("redis subscriber connection closed; reconnecting");
                        break;
                    }
                },
                _ = ping.tick() => {
                    let pong = tokio::time::timeout(PING_EVERY, sink.ping::<redis::Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        tracing::warn!("redis subscriber ping failed; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

fn dispatch(l: &Listener, msg: &redis::Msg) {
    let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) else {
        tracing::warn!("non-UTF-8 notification ignored");
        return;
    };
    if msg.get_channel_name() == l.channels[0] {
        match parse_event_hint(payload) {
            // No receivers is fine: nobody is tailing that run.
            Some((run, seq)) => drop(l.events.send((Some(run), seq))),
            None => tracing::warn!(payload, "malformed event notification ignored"),
        }
    } else {
        match payload.parse::<RunId>() {
            Ok(run) => drop(l.cancels.send(run)),
            Err(_) => tracing::warn!(payload, "malformed cancel notification ignored"),
        }
    }
}

fn parse_event_hint(payload: &str) -> Option<(RunId, u64)> {
    let (run, seq) = payload.rsplit_once(':')?;
    Some((run.parse().ok()?, seq.parse().ok()?))
}

#[async_trait]
impl Notifier for RedisNotifier {
    async fn notify_events(&self, run_id: RunId, last_seq: u64) -> Result<(), InfraError> {
        self.publish(&self.inner.events_channel, format!("{run_id}:{last_seq}"))
            .await
    }

    async fn subscribe_events(&self, run_id: RunId) -> Result<BoxStream<'static, u64>, InfraError> {
        let rx = self.inner.events.subscribe();
        Ok(broadcast_stream(rx)
            .filter_map(move |(id, seq)| async move {
                match id {
                    Some(id) if id != run_id => None,
                    _ => Some(seq),
                }
            })
            .boxed())
    }

    async fn notify_cancel(&self, run_id: RunId) -> Result<(), InfraError> {
        self.publish(&self.inner.cancels_channel, run_id.to_string())
            .await
    }

    async fn subscribe_cancels(&self) -> Result<BoxStream<'static, RunId>, InfraError> {
        Ok(broadcast_stream(self.inner.cancels.subscribe()).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_hint_round_trips() {
        let id = RunId::new();
        assert_eq!(parse_event_hint(&format!("{id}:42")), Some((id, 42)));
        assert_eq!(parse_event_hint("nonsense"), None);
        assert_eq!(parse_event_hint(&format!("{id}:x")), None);
    }
}
