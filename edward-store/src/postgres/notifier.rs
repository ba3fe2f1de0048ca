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
//!
//! Event hints reach this process's own subscribers at once (no round trip
//! through the server), and go to other processes through one sender task
//! that coalesces what is waiting — the newest seq per run — into one
//! `pg_notify` statement. Each hint carries this notifier's origin tag, so
//! the listener skips its own hints when they come back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use edward_core::memory::MemoryNotifier;
use edward_core::{InfraError, Notifier, RunId};
use futures::StreamExt;
use futures::stream::BoxStream;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::common::broadcast_stream;
use crate::error::{ConnectError, infra_err};

const FANOUT_CAPACITY: usize = 1024;

/// Hints sent in one `pg_notify` statement at most.
const MAX_HINTS_PER_STATEMENT: usize = 1024;

/// Postgres [`Notifier`]. Cloning is cheap; the listener task stops when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct PgNotifier {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    cancels_channel: String,
    events: Arc<MemoryNotifier>,
    cancels: broadcast::Sender<RunId>,
    /// Hints for other processes, to the sender task.
    outgoing: mpsc::UnboundedSender<(RunId, u64)>,
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
        let origin = uuid::Uuid::new_v4().simple().to_string();
        tokio::spawn(listen_loop(
            listener,
            Channel {
                name: events_channel.clone(),
                origin: origin.clone(),
            },
            events.clone(),
            cancels.clone(),
            stop.clone(),
        ));
        let (outgoing, hints) = mpsc::unbounded_channel();
        // Its own connection: hints must not wait behind a busy shared pool.
        let sender = super::own_pool(&pool, 1);
        tokio::spawn(send_loop(
            sender,
            Channel {
                name: events_channel,
                origin,
            },
            hints,
        ));
        Ok(PgNotifier {
            inner: Arc::new(Inner {
                pool,
                cancels_channel,
                events,
                cancels,
                outgoing,
                _stop: stop.drop_guard(),
            }),
        })
    }
}

/// The events channel and this notifier's tag on it.
struct Channel {
    name: String,
    origin: String,
}

/// Send the waiting hints — the newest seq per run — in one statement, until
/// every notifier handle is dropped.
async fn send_loop(
    pool: PgPool,
    channel: Channel,
    mut hints: mpsc::UnboundedReceiver<(RunId, u64)>,
) {
    let mut newest: HashMap<RunId, u64> = HashMap::new();
    while let Some((run_id, seq)) = hints.recv().await {
        newest.insert(run_id, seq);
        while newest.len() < MAX_HINTS_PER_STATEMENT {
            let Ok((run_id, seq)) = hints.try_recv() else {
                break;
            };
            let kept = newest.entry(run_id).or_insert(seq);
            *kept = (*kept).max(seq);
        }
        let payloads = hint_payloads(&channel.origin, newest.drain());
        if let Err(error) = sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
            .bind(&channel.name)
            .bind(&payloads)
            .execute(&pool)
            .await
        {
            // Hints: other processes' tailers poll and catch up.
            tracing::warn!(%error, hints = payloads.len(), "pg_notify of event hints failed");
        }
    }
}

async fn listen_loop(
    mut listener: PgListener,
    events_channel: Channel,
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
                if notification.channel() == events_channel.name {
                    match parse_event_hints(payload) {
                        // Our own hints, already delivered here when sent.
                        Some((Some(origin), _)) if origin == events_channel.origin => {}
                        Some((_, hints)) => {
                            for (run_id, seq) in hints {
                                // No receivers is fine: nobody tails that run.
                                drop(events.notify_events(run_id, seq).await);
                            }
                        }
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

/// One event hint: the run and its newest seq.
type Hint = (RunId, u64);

/// Hints packed into as few notifications as fit: `origin/run_id:seq,…`,
/// each under Postgres' 8,000-byte payload limit (one notification per
/// hint was one message per hint for every listening process to read).
fn hint_payloads(origin: &str, hints: impl Iterator<Item = (RunId, u64)>) -> Vec<String> {
    const MAX_PAYLOAD: usize = 7_900;
    let mut payloads = Vec::new();
    let mut payload = String::new();
    for (run_id, seq) in hints {
        let hint = format!("{run_id}:{seq}");
        if !payload.is_empty() && payload.len() + 1 + hint.len() > MAX_PAYLOAD {
            payloads.push(std::mem::take(&mut payload));
        }
        if payload.is_empty() {
            payload.push_str(origin);
            payload.push('/');
        } else {
            payload.push(',');
        }
        payload.push_str(&hint);
    }
    if !payload.is_empty() {
        payloads.push(payload);
    }
    payloads
}

/// `origin/run_id:seq,run_id:seq…` (or one `run_id:seq`, from a sender
/// without a tag): the origin and the hints, or `None` if any is malformed.
fn parse_event_hints(payload: &str) -> Option<(Option<&str>, Vec<Hint>)> {
    let (origin, hints) = match payload.split_once('/') {
        Some((origin, hints)) => (Some(origin), hints),
        None => (None, payload),
    };
    let hints = hints
        .split(',')
        .map(|hint| {
            let (run, seq) = hint.rsplit_once(':')?;
            Some((run.parse().ok()?, seq.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((origin, hints))
}

#[async_trait]
impl Notifier for PgNotifier {
    async fn notify_events(&self, run_id: RunId, last_seq: u64) -> Result<(), InfraError> {
        // No receivers here is fine: nobody in this process tails that run.
        drop(self.inner.events.notify_events(run_id, last_seq).await);
        self.inner
            .outgoing
            .send((run_id, last_seq))
            .map_err(|_| InfraError::Backend {
                message: "postgres hint sender stopped".into(),
                retryable: false,
            })?;
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
    fn event_hints_round_trip() {
        let id = RunId::new();
        assert_eq!(
            parse_event_hints(&format!("{id}:42")),
            Some((None, vec![(id, 42)]))
        );
        assert_eq!(parse_event_hints("nonsense"), None);
        assert_eq!(parse_event_hints(&format!("{id}:x")), None);
        assert_eq!(parse_event_hints(&format!("o/{id}:1,bad")), None);
        let hints: Vec<(RunId, u64)> = (0..500).map(|i| (RunId::new(), i)).collect();
        let payloads = hint_payloads("abc", hints.iter().copied());
        assert!(payloads.len() > 1, "500 hints do not fit one payload");
        let mut back = Vec::new();
        for payload in &payloads {
            assert!(payload.len() < 8_000, "{}", payload.len());
            let (origin, got) = parse_event_hints(payload).expect("parses");
            assert_eq!(origin, Some("abc"));
            back.extend(got);
        }
        assert_eq!(back, hints);
        assert!(hint_payloads("abc", std::iter::empty()).is_empty());
    }
}
