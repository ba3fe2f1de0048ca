//! Postgres adapters: [`PgStore`] ([`edward_core::RunStore`]), [`PgQueue`]
//! ([`edward_core::RunQueue`]), [`PgNotifier`] ([`edward_core::Notifier`])
//! and [`PgLock`] ([`edward_core::Lock`]).
//!
//! All times come from the database (`now()`), so worker clock skew does not
//! matter for leases and backoff.

mod appender;
mod chats;
mod credentials;
mod lock;
mod notifier;
mod queue;
mod reader;
mod store;

use std::collections::VecDeque;
use std::str::FromStr;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use lock::PgLock;
pub use notifier::PgNotifier;
pub use queue::PgQueue;
pub use store::PgStore;

use crate::common::StoreOptions;
use crate::error::ConnectError;

/// A small pool of `connections` of its own, opened (lazily) as `pool`'s
/// are: for a task whose statements must not queue behind a busy shared
/// pool (group commit, grouped reads, hints).
fn own_pool(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

/// The loop of a task that gathers requests into ticks (group commit,
/// grouped reads): what is waiting goes to `take`, which returns the next
/// tick (empty: nothing can go now); up to `max_in_flight` ticks run at
/// once; each finished tick's output goes to `done`. Ends once every sender
/// is gone and no tick is in flight.
async fn tick_loop<R, S, O, F>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<R>,
    max_in_flight: usize,
    mut state: S,
    take: impl Fn(&mut S, &mut VecDeque<R>) -> Vec<R>,
    run: impl Fn(Vec<R>) -> F,
    done: impl Fn(&mut S, O),
) where
    F: std::future::Future<Output = O>,
{
    let mut waiting = VecDeque::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    loop {
        while let Ok(request) = rx.try_recv() {
            waiting.push_back(request);
        }
        while in_flight.len() < max_in_flight {
            let tick = take(&mut state, &mut waiting);
            if tick.is_empty() {
                break;
            }
            in_flight.push(run(tick));
        }
        if in_flight.is_empty() {
            if !open {
                return;
            }
            open = recv_into(&mut rx, &mut waiting).await;
            continue;
        }
        tokio::select! {
            Some(out) = in_flight.next() => done(&mut state, out),
            more = recv_into(&mut rx, &mut waiting), if open => open = more,
        }
    }
}

/// Waits for the next request into `waiting`; `false` once every sender is
/// gone.
async fn recv_into<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    waiting: &mut VecDeque<T>,
) -> bool {
    match rx.recv().await {
        Some(request) => {
            waiting.push_back(request);
            true
        }
        None => false,
    }
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Options of the Postgres adapters.
///
/// ```
/// let options = edward_store::PgOptions::default().schema("tenant_a");
/// assert_eq!(options.schema.as_deref(), Some("tenant_a"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PgOptions {
    /// Pool size, migrations on connect, timeouts.
    pub store: StoreOptions,
    /// Put Edward's tables in this schema (created if missing) instead of
    /// the connection's default `search_path`. Lets several independent
    /// Edward deployments (or test binaries) share one database. Only
    /// `[a-z0-9_]` names are accepted.
    pub schema: Option<String>,
}

impl PgOptions {
    /// Use `schema` for Edward's tables.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Replace the common store options.
    pub fn store(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }
}

/// Open a pool on `url` honouring `options` and run migrations if asked.
pub(crate) async fn connect_pool(url: &str, options: &PgOptions) -> Result<PgPool, ConnectError> {
    let mut connect =
        PgConnectOptions::from_str(url).map_err(|e| ConnectError::Config(e.to_string()))?;
    if let Some(schema) = &options.schema {
        if schema.is_empty()
            || !schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(ConnectError::Config(format!(
                "schema name `{schema}` must be [a-z0-9_]+"
            )));
        }
        // Create it once over a plain connection, then make it every pooled
        // connection's search_path through the startup options.
        let bootstrap = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.store.acquire_timeout)
            .connect_with(connect.clone())
            .await
            .map_err(ConnectError::Connect)?;
        let created = sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .execute(&bootstrap)
            .await;
        bootstrap.close().await;
        if let Err(e) = created {
            // A concurrent creator may win the race; that is fine.
            if !crate::error::is_unique_violation(&e) {
                return Err(ConnectError::Connect(e));
            }
        }
        connect = connect.options([("search_path", schema.as_str())]);
    }
    let pool = PgPoolOptions::new()
        .max_connections(options.store.max_connections)
        .acquire_timeout(options.store.acquire_timeout)
        .connect_with(connect)
        .await
        .map_err(ConnectError::Connect)?;
    if options.store.run_migrations {
        MIGRATOR.run(&pool).await?;
    }
    Ok(pool)
}

/// Run the embedded Postgres migrations on `pool` (for callers that build
/// their own pool and turned migrations on connect off).
pub async fn migrate(pool: &PgPool) -> Result<(), ConnectError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}
