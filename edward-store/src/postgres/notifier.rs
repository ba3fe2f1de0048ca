//! [`PgNotifier`]: `LISTEN`/`NOTIFY` wake-ups.
//!
//! One shared [`PgListener`] connection per notifier listens on two
//! channels — `{prefix}_events` (payload `run_id:seq`) and
//! `{prefix}_cancels` (payload `run_id`) — and fans notifications out to
//! subscribers: event hints through one channel per run (an in-process
//! [`MemoryNotifier`], so a hint wakes only that run's tailers, never all of
//! them), cancels through one broadcast channel. If the connection drops,
//! the listener reconnects and re-listens; notifications sent meanwhile are
//! lost, which is fine because they are hints (tailers re-read the store and
//! the engine also polls slowly).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use edward_core::memory::MemoryNotifier;
use edward_core::{InfraError, Notifier, RunId};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::common::broadcast_stream;
use crate::error::{ConnectError, infra_err};

const FANOUT_CAPACITY: usize = 1024;

/// Postgres [`Notifier`]. Cloning is cheap; the listener task stops when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct PgNotifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    events_channel: String,
    cancels_channel: String,
    events: Arc<MemoryNotifier>,
    cancels: broadcast::Sender<RunId>,
    _stop: DropGuard,
}

impl PgNotifier {
    /// Connect to `url` with its own two-connection pool (one listener, one
    /// for `pg_notify`) on the default channels `edward_events` and
    /// `edward_cancels`.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await
            .map_err(ConnectError::Connect)?;
        Self::from_pool(pool, "edward").await
    }

    /// Use `pool` (one of its connections is held for listening) with
    /// channels `{prefix}_events` and `{prefix}_cancels`. Returns once the
    /// listener is subscribed, so a notification sent after this returns
    /// reaches every later subscriber.
    pub async fn from_pool(pool: PgPool, prefix: &str) -> Result<Self, ConnectError> {
        if prefix.is_empty()
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(ConnectError::Config(format!(
                "channel prefix `{prefix}` must be [a-z0-9_]+"
            )));
        }
        let events_channel = format!("{prefix}_events");
        let cancels_channel = format!("{prefix}_cancels");
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(ConnectError::Connect)?;
        listener
            .listen_all([events_channel.as_str(), cancels_channel.as_str()])
            .await
            .map_err(ConnectError::Connect)?;
        let events = Arc::new(MemoryNotifier::new());
        let (cancels, _) = broadcast::channel(FANOUT_CAPACITY);
        let stop = CancellationToken::new();
        tokio::spawn(listen_loop(
            listener,
            events_channel.clone(),
            events.clone(),
            cancels.clone(),
            stop.clone(),
        ));
        Ok(PgNotifier {
            inner: Arc::new(Inner {
                pool,
                events_channel,
                cancels_channel,
                events,
                cancels,
                _stop: stop.drop_guard(),
            }),
        })
    }
}

async fn listen_loop(
    mut listener: PgListener,
    events_channel: String,
    events: Arc<MemoryNotifier>,
    cancels: broadcast::Sender<RunId>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.recv() => r,
        };
        match received {
            Ok(notification) => {
                backoff = Duration::from_millis(50);
                let payload = notification.payload();
                if notification.channel() == events_channel {
                    match parse_event_hint(payload) {
                        // No receivers is fine: nobody is tailing that run.
                        Some((run_id, seq)) => drop(events.notify_events(run_id, seq).await),
                        None => tracing::warn!(payload, "malformed event notification"),
                    }
                } else {
                    match payload.parse::<RunId>() {
                        Ok(run_id) => drop(cancels.send(run_id)),
                        Err(_) => tracing::warn!(payload, "malformed cancel notification"),
                    }
                }
            }
            Err(error) => {
                // PgListener reconnects and re-listens on the next recv.
                tracing::warn!(%error, "postgres listener failed; reconnecting");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn parse_event_hint(payload: &str) -> Option<(RunId, u64)> {
    let (run, seq) = payload.rsplit_once(':')?;
    Some((run.parse().ok()?, seq.parse().ok()?))
}

#[async_trait]
impl Notifier for PgNotifier {
    async fn notify_events(&self, run_id: RunId, last_seq: u64) -> Result<(), InfraError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.inner.events_channel)
            .bind(format!("{run_id}:{last_seq}"))
            .execute(&self.inner.pool)
            .await
            .map_err(infra_err)?;
        Ok(())
    }

    async fn subscribe_events(&self, run_id: RunId) -> Result<BoxStream<'static, u64>, InfraError> {
        self.inner.events.subscribe_events(run_id).await
    }

    async fn notify_cancel(&self, run_id: RunId) -> Result<(), InfraError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.inner.cancels_channel)
            .bind(run_id.to_string())
            .execute(&self.inner.pool)
            .await
            .map_err(infra_err)?;
        Ok(())
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
