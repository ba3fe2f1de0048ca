//! [`SqliteStore`]: the embedded durable store and queue on one SQLite file.
//!
//! Writes go through a single pooled connection and every write transaction
//! is `BEGIN IMMEDIATE`, so a transaction that reads before it writes (admit,
//! append, claim) holds the database's write lock from its first statement:
//! admission is an exact check-and-insert, and seqs and fences cannot race.
//! One writer task group-commits the writes of all runs: whatever is queued
//! when a transaction ends goes into the next one, each request answered
//! with its own result (see `sqlite/writer.rs`). The WAL is checkpointed by a
//! connection of its own, in the background, never inside a commit.
//! Other processes opening the same file wait for the lock up to the
//! configured timeout (`busy_timeout`), then fail retryably. Reads use a
//! separate pool of readers (WAL mode lets them run beside the writer).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use edward_core::Durability;
use edward_core::engine::Backend;
use edward_core::memory::MemoryNotifier;
use edward_core::{
    AdmissionError, AdmissionLimits, AdmitError, BuildJob, BuildResult, ChatMessage, Checkpoint,
    DeadLetter, EffectRecord, Fence, Lease, NewEvent, NewMessage, NewRun, QueueError, RetryOutcome,
    RetryPolicy, Run, RunEvent, RunFilter, RunId, RunQueue, RunStatus, RunStore, StoreError,
};
use futures::future::BoxFuture;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};
use uuid::Uuid;

use crate::common::{
    StoreOptions, backoff_with_jitter, check_append_events, check_finish, checkpoint_from_columns,
    diagnose, json_text, lease_lost, lease_ms, parse_effect_state, parse_json, parse_status,
    queue_corrupt, queue_range, to_i64, to_u64,
};
use crate::error::{ConnectError, corrupt, queue_err, store_err};

mod chats;
mod credentials;
mod writer;

use writer::{Writer, WriterPool, writer_pool};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

const RUN_COLUMNS: &str = "id, user_id, chat_id, status, request, fence, last_seq, \
     created_at, updated_at, finished_at, terminal_reason, cancel_requested_at";

/// SQLite [`RunStore`] + [`RunQueue`]: the embedded durable default.
///
/// Cloning is cheap (the pools are shared).
///
/// ```no_run
/// # async fn demo() -> Result<(), edward_store::ConnectError> {
/// let store = edward_store::SqliteStore::open("edward.db").await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The single-connection writer pool (recovered when left broken).
    writer: Arc<WriterPool>,
    /// The group-commit writer task every write goes through.
    jobs: Writer,
    /// Events this process appended lately, for its own tailers.
    recent: Arc<crate::recent::Recent>,
    reader: SqlitePool,
    in_memory: bool,
}

impl SqliteStore {
    /// Open (creating if missing) the database file at `path` with default options.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ConnectError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        Self::connect_with(options, StoreOptions::default()).await
    }

    /// Connect to a `sqlite:` URL (e.g. `sqlite://edward.db`, `sqlite::memory:`),
    /// creating the file if missing.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| ConnectError::Config(e.to_string()))?
            .create_if_missing(true);
        Self::connect_with(options, StoreOptions::default()).await
    }

    /// A private in-memory database (one connection; gone when dropped).
    pub async fn in_memory() -> Result<Self, ConnectError> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")
            .map_err(|e| ConnectError::Config(e.to_string()))?;
        Self::connect_with(options, StoreOptions::default()).await
    }

    /// Connect with explicit sqlx connect options and store options.
    /// WAL journaling, `synchronous = NORMAL` and a busy timeout of
    /// `store.acquire_timeout` are applied on top of `connect`.
    pub async fn connect_with(
        connect: SqliteConnectOptions,
        store: StoreOptions,
    ) -> Result<Self, ConnectError> {
        // sqlx rewrites `:memory:` to a named shared-cache memory database.
        let in_memory = {
            let name = connect.get_filename().to_string_lossy();
            name == ":memory:"
                || name.starts_with("file:sqlx-in-memory")
                || name.contains("mode=memory")
        };
        let connect = connect
            .journal_mode(if in_memory {
                SqliteJournalMode::Memory
            } else {
                SqliteJournalMode::Wal
            })
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(store.acquire_timeout);
        // The writer never checkpoints the WAL on commit (a checkpoint
        // copies pages and fsyncs: hundreds of ms in the middle of a group
        // commit); a connection of its own does, in the background.
        let writer_connect = if in_memory {
            connect.clone()
        } else {
            connect
                .clone()
                .pragma("wal_autocheckpoint", "0")
                // Statement journals (every multi-row statement inside a
                // transaction keeps one) in memory, not in temp files that
                // are created and unlinked per statement; and room for a
                // group commit's pages without spilling them mid-transaction.
                .pragma("temp_store", "memory")
                .pragma("cache_size", "-16384")
        };
        let writer = writer_pool(&writer_connect, &store, in_memory)
            .await
            .map_err(ConnectError::Connect)?;
        if store.run_migrations {
            MIGRATOR.run(&writer).await?;
        }
        let reader = if in_memory {
            writer.clone()
        } else {
            SqlitePoolOptions::new()
                .max_connections(store.max_connections)
                .acquire_timeout(store.acquire_timeout)
                // A ping before every read is one more thread hand-off per
                // query; a dead embedded connection fails the query anyway.
                .test_before_acquire(false)
                .connect_with(connect.clone().read_only(true))
                .await
                .map_err(ConnectError::Connect)?
        };
        let checkpoint = if in_memory {
            None
        } else {
            Some(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(store.acquire_timeout)
                    .connect_with(connect.clone())
                    .await
                    .map_err(ConnectError::Connect)?,
            )
        };
        let writer = Arc::new(WriterPool::new(
            writer,
            (!in_memory).then_some((writer_connect, store)),
            checkpoint,
        ));
        let jobs =
            Writer::spawn(writer.clone()).map_err(|e| ConnectError::Connect(sqlx::Error::Io(e)))?;
        Ok(SqliteStore {
            writer,
            jobs,
            recent: Arc::default(),
            reader,
            in_memory,
        })
    }

    /// This store as the engine's [`Backend`]: it is both the run store and
    /// the queue; the notifier is in-process, so tailers in *other*
    /// processes see live events on their store re-read
    /// (`EngineConfig::tail_backstop`, 1 s) and cancels from other processes
    /// arrive within the worker's status-check period.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = edward_store::SqliteStore::open("edward.db").await?;
    /// let builder = edward_core::engine::Engine::builder().backend(store.backend());
    /// # let _ = builder; Ok(()) }
    /// ```
    pub fn backend(&self) -> Backend {
        Backend::new(
            Arc::new(self.clone()),
            Arc::new(self.clone()),
            Arc::new(MemoryNotifier::new()),
        )
    }

    /// Close both pools.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    pub(crate) fn writer(&self) -> SqlitePool {
        self.writer.pool()
    }

    /// A `BEGIN IMMEDIATE` transaction on the writer connection, outside
    /// the group-commit writer (for rare writes such as credentials).
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.writer.begin().await
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| corrupt(format!("timestamp {us}")))
}

fn run_from_row(row: &SqliteRow) -> Result<Run, StoreError> {
    let id: Uuid = row.try_get("id").map_err(store_err)?;
    let status: String = row.try_get("status").map_err(store_err)?;
    let request: String = row.try_get("request").map_err(store_err)?;
    let finished_at: Option<i64> = row.try_get("finished_at").map_err(store_err)?;
    let cancel_requested_at: Option<i64> = row.try_get("cancel_requested_at").map_err(store_err)?;
    Ok(Run {
        id: RunId(id),
        user_id: row.try_get("user_id").map_err(store_err)?,
        chat_id: row.try_get("chat_id").map_err(store_err)?,
        status: parse_status(&status)?,
        request: parse_json(&request)?,
        fence: Fence(to_u64(row.try_get("fence").map_err(store_err)?, "fence")?),
        last_seq: to_u64(row.try_get("last_seq").map_err(store_err)?, "last_seq")?,
        created_at: from_micros(row.try_get("created_at").map_err(store_err)?)?,
        updated_at: from_micros(row.try_get("updated_at").map_err(store_err)?)?,
        finished_at: finished_at.map(from_micros).transpose()?,
        terminal_reason: row.try_get("terminal_reason").map_err(store_err)?,
        cancel_requested_at: cancel_requested_at.map(from_micros).transpose()?,
    })
}

fn event_from_row(run_id: RunId, row: &SqliteRow) -> Result<RunEvent, StoreError> {
    let payload: String = row.try_get("payload").map_err(store_err)?;
    Ok(RunEvent {
        run_id,
        seq: to_u64(row.try_get("seq").map_err(store_err)?, "seq")?,
        kind: row.try_get("kind").map_err(store_err)?,
        at: from_micros(row.try_get("at").map_err(store_err)?)?,
        payload: parse_json(&payload)?,
    })
}

fn effect_from_row(key: &str, row: &SqliteRow) -> Result<EffectRecord, StoreError> {
    let state: String = row.try_get("state").map_err(store_err)?;
    let request: String = row.try_get("request").map_err(store_err)?;
    let result: Option<String> = row.try_get("result").map_err(store_err)?;
    let attempts: i64 = row.try_get("attempts").map_err(store_err)?;
    Ok(EffectRecord {
        key: key.to_owned(),
        state: parse_effect_state(&state)?,
        request: parse_json(&request)?,
        result: result.as_deref().map(parse_json).transpose()?,
        attempts: u32::try_from(attempts).map_err(|_| corrupt(format!("attempts {attempts}")))?,
    })
}

/// `(status, fence, last_seq)` of a run, on the writer connection.
async fn run_state(
    conn: &mut SqliteConnection,
    run_id: RunId,
) -> Result<Option<(RunStatus, Fence, i64)>, StoreError> {
    let row = sqlx::query("SELECT status, fence, last_seq FROM runs WHERE id = ?")
        .bind(run_id.0)
        .fetch_optional(&mut *conn)
        .await
        .map_err(store_err)?;
    match row {
        None => Ok(None),
        Some(row) => {
            let status: String = row.try_get(0).map_err(store_err)?;
            let fence: i64 = row.try_get(1).map_err(store_err)?;
            let last_seq: i64 = row.try_get(2).map_err(store_err)?;
            Ok(Some((
                parse_status(&status)?,
                Fence(to_u64(fence, "fence")?),
                last_seq,
            )))
        }
    }
}

async fn diagnose_in(
    conn: &mut SqliteConnection,
    run_id: RunId,
    given: Fence,
    check_finished: bool,
) -> StoreError {
    match run_state(conn, run_id).await {
        Ok(found) => diagnose(run_id, found.map(|(s, f, _)| (s, f)), given, check_finished),
        Err(e) => e,
    }
}

/// Rows per multi-row `INSERT` (5 parameters each, far below SQLite's limit).
const INSERT_CHUNK: usize = 128;

/// Insert `events` with seqs `first_seq..`, all stamped `at`, as multi-row
/// `INSERT`s (one statement per [`INSERT_CHUNK`] events).
async fn insert_events(
    conn: &mut SqliteConnection,
    run_id: RunId,
    first_seq: i64,
    at: DateTime<Utc>,
    events: &[NewEvent],
) -> Result<Vec<RunEvent>, StoreError> {
    let at_us = micros(at);
    let payloads: Vec<String> = events.iter().map(|e| json_text(&e.payload)).collect();
    let mut offset = 0usize;
    for chunk in events.chunks(INSERT_CHUNK) {
        let mut builder: sqlx::QueryBuilder<'_, Sqlite> =
            sqlx::QueryBuilder::new("INSERT INTO run_events (run_id, seq, kind, at, payload) ");
        builder.push_values(chunk.iter().enumerate(), |mut row, (i, event)| {
            row.push_bind(run_id.0)
                .push_bind(first_seq + (offset + i) as i64)
                .push_bind(event.kind.as_str())
                .push_bind(at_us)
                .push_bind(payloads[offset + i].as_str());
        });
        builder
            .build()
            .execute(&mut *conn)
            .await
            .map_err(store_err)?;
        offset += chunk.len();
    }
    events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            Ok(RunEvent {
                run_id,
                seq: to_u64(first_seq + i as i64, "seq")?,
                kind: event.kind.clone(),
                at,
                payload: event.payload.clone(),
            })
        })
        .collect()
}

/// Truncate to the stored precision so returned values equal re-read ones.
pub(crate) fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

async fn count_active(
    conn: &mut SqliteConnection,
    sql: &str,
    key: Option<&str>,
) -> Result<u32, StoreError> {
    let mut query = sqlx::query_scalar::<_, i64>(sql);
    if let Some(key) = key {
        query = query.bind(key);
    }
    let n = query.fetch_one(&mut *conn).await.map_err(store_err)?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

// Bodies of the writes. Each runs inside the group-commit writer's
// transaction (see `writer.rs`), borrowing its request so that it can run
// again alone; a refusal writes nothing before it is returned.

fn admit_in<'c>(
    conn: &'c mut SqliteConnection,
    (run, limits): &'c (NewRun, AdmissionLimits),
) -> BoxFuture<'c, Result<Run, AdmitError>> {
    Box::pin(async move {
        let exists = sqlx::query("SELECT 1 FROM runs WHERE id = ?")
            .bind(run.id.0)
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_err)?;
        if exists.is_some() {
            return Err(StoreError::AlreadyExists { run_id: run.id }.into());
        }
        // A chat belongs to its user: another user's chat of the same id is another chat.
        let chat: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM runs WHERE user_id = ? AND chat_id = ? \
             AND status IN ('queued', 'running')",
        )
        .bind(&run.user_id)
        .bind(&run.chat_id)
        .fetch_one(&mut *conn)
        .await
        .map_err(store_err)?;
        let chat = u32::try_from(chat).unwrap_or(u32::MAX);
        if chat >= limits.per_chat {
            return Err(AdmissionError::ChatLimit {
                limit: limits.per_chat,
            }
            .into());
        }
        let user = count_active(
            conn,
            "SELECT COUNT(*) FROM runs WHERE user_id = ? AND status IN ('queued', 'running')",
            Some(&run.user_id),
        )
        .await?;
        if user >= limits.per_user {
            return Err(AdmissionError::UserLimit {
                limit: limits.per_user,
            }
            .into());
        }
        let global = count_active(
            conn,
            "SELECT COUNT(*) FROM runs WHERE status IN ('queued', 'running')",
            None,
        )
        .await?;
        if global >= limits.global {
            return Err(AdmissionError::GlobalLimit {
                limit: limits.global,
            }
            .into());
        }
        let at = now();
        let row = sqlx::query(&format!(
            "INSERT INTO runs (id, user_id, chat_id, status, request, fence, last_seq, created_at, updated_at) \
             VALUES (?, ?, ?, 'queued', ?, 0, 1, ?, ?) RETURNING {RUN_COLUMNS}"
        ))
        .bind(run.id.0)
        .bind(&run.user_id)
        .bind(&run.chat_id)
        .bind(json_text(&run.request))
        .bind(micros(at))
        .bind(micros(at))
        .fetch_one(&mut *conn)
        .await
        .map_err(store_err)?;
        let stored = run_from_row(&row)?;
        insert_events(conn, run.id, 1, at, std::slice::from_ref(&run.first_event)).await?;
        // The queue lives in the same database: the run is enqueued in the
        // admitting transaction, so a crash can never leave it admitted
        // (holding a slot) but unqueued. `enqueue` afterwards is a no-op.
        sqlx::query(
            "INSERT INTO queue (run_id, run_at) VALUES (?, ?) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(run.id.0)
        .bind(micros(at))
        .execute(&mut *conn)
        .await
        .map_err(store_err)?;
        Ok(stored)
    })
}

fn start_run_in<'c>(
    conn: &'c mut SqliteConnection,
    &(run_id, fence): &'c (RunId, Fence),
) -> BoxFuture<'c, Result<Run, StoreError>> {
    Box::pin(async move {
        let given = to_i64(fence.0, "fence")?;
        let row = sqlx::query(&format!(
            "UPDATE runs SET fence = ?, status = 'running', updated_at = ? \
             WHERE id = ? AND fence <= ? AND status IN ('queued', 'running') \
             RETURNING {RUN_COLUMNS}"
        ))
        .bind(given)
        .bind(micros(now()))
        .bind(run_id.0)
        .bind(given)
        .fetch_optional(&mut *conn)
        .await
        .map_err(store_err)?;
        let Some(row) = row else {
            return Err(diagnose_in(conn, run_id, fence, true).await);
        };
        run_from_row(&row)
    })
}

struct Finish {
    run_id: RunId,
    fence: Option<Fence>,
    status: RunStatus,
    reason: String,
    events: Vec<NewEvent>,
}

fn finish_run_in<'c>(
    conn: &'c mut SqliteConnection,
    f: &'c Finish,
) -> BoxFuture<'c, Result<Vec<RunEvent>, StoreError>> {
    Box::pin(async move {
        let run_id = f.run_id;
        let Some((current, current_fence, last_seq)) = run_state(conn, run_id).await? else {
            return Err(StoreError::NotFound { run_id });
        };
        check_finish(run_id, current, current_fence, f.fence, f.status, &f.events)?;
        let at = now();
        let n = f.events.len() as i64;
        sqlx::query(
            "UPDATE runs SET status = ?, terminal_reason = ?, finished_at = ?, updated_at = ?, \
             last_seq = last_seq + ? WHERE id = ?",
        )
        .bind(f.status.as_str())
        .bind(&f.reason)
        .bind(micros(at))
        .bind(micros(at))
        .bind(n)
        .bind(run_id.0)
        .execute(&mut *conn)
        .await
        .map_err(store_err)?;
        insert_events(conn, run_id, last_seq + 1, at, &f.events).await
    })
}

fn save_checkpoint_in<'c>(
    conn: &'c mut SqliteConnection,
    (run_id, fence, checkpoint): &'c (RunId, Fence, Checkpoint),
) -> BoxFuture<'c, Result<(), StoreError>> {
    Box::pin(async move {
        let given = to_i64(fence.0, "fence")?;
        let done = sqlx::query(
            "UPDATE runs SET checkpoint_turn = ?, checkpoint = ?, updated_at = ? \
             WHERE id = ? AND fence <= ?",
        )
        .bind(i64::from(checkpoint.turn))
        .bind(json_text(&checkpoint.state))
        .bind(micros(now()))
        .bind(run_id.0)
        .bind(given)
        .execute(&mut *conn)
        .await
        .map_err(store_err)?;
        if done.rows_affected() == 0 {
            return Err(diagnose_in(conn, *run_id, *fence, false).await);
        }
        Ok(())
    })
}

struct Effect {
    run_id: RunId,
    fence: Fence,
    key: String,
    value: serde_json::Value,
}

fn begin_effect_in<'c>(
    conn: &'c mut SqliteConnection,
    e: &'c Effect,
) -> BoxFuture<'c, Result<EffectRecord, StoreError>> {
    Box::pin(async move {
        let run_id = e.run_id;
        let Some((_, current, _)) = run_state(conn, run_id).await? else {
            return Err(StoreError::NotFound { run_id });
        };
        crate::common::check_fence(run_id, current, e.fence)?;
        let at = micros(now());
        let row = sqlx::query(
            "INSERT INTO effects (run_id, key, state, request, result, attempts, created_at, updated_at) \
             VALUES (?, ?, 'started', ?, NULL, 1, ?, ?) \
             ON CONFLICT (run_id, key) DO UPDATE SET \
               attempts = effects.attempts + (effects.state = 'started'), \
               updated_at = excluded.updated_at \
             RETURNING state, request, result, attempts",
        )
        .bind(run_id.0)
        .bind(&e.key)
        .bind(json_text(&e.value))
        .bind(at)
        .bind(at)
        .fetch_one(&mut *conn)
        .await
        .map_err(store_err)?;
        effect_from_row(&e.key, &row)
    })
}

fn complete_effect_in<'c>(
    conn: &'c mut SqliteConnection,
    e: &'c Effect,
) -> BoxFuture<'c, Result<(), StoreError>> {
    Box::pin(async move {
        let run_id = e.run_id;
        let Some((_, current, _)) = run_state(conn, run_id).await? else {
            return Err(StoreError::NotFound { run_id });
        };
        crate::common::check_fence(run_id, current, e.fence)?;
        let at = micros(now());
        sqlx::query(
            "INSERT INTO effects (run_id, key, state, request, result, attempts, created_at, updated_at) \
             VALUES (?, ?, 'completed', 'null', ?, 1, ?, ?) \
             ON CONFLICT (run_id, key) DO UPDATE SET \
               state = 'completed', result = excluded.result, updated_at = excluded.updated_at",
        )
        .bind(run_id.0)
        .bind(&e.key)
        .bind(json_text(&e.value))
        .bind(at)
        .bind(at)
        .execute(&mut *conn)
        .await
        .map_err(store_err)?;
        Ok(())
    })
}

fn request_cancel_in<'c>(
    conn: &'c mut SqliteConnection,
    (run_id, event): &'c (RunId, NewEvent),
) -> BoxFuture<'c, Result<Run, StoreError>> {
    Box::pin(async move {
        let run_id = *run_id;
        let Some((current, _, last_seq)) = run_state(conn, run_id).await? else {
            return Err(StoreError::NotFound { run_id });
        };
        if !current.is_terminal() {
            let at = now();
            let updated = sqlx::query(
                "UPDATE runs SET cancel_requested_at = ?, updated_at = ?, last_seq = last_seq + 1 \
                 WHERE id = ? AND cancel_requested_at IS NULL",
            )
            .bind(micros(at))
            .bind(micros(at))
            .bind(run_id.0)
            .execute(&mut *conn)
            .await
            .map_err(store_err)?;
            if updated.rows_affected() == 1 {
                insert_events(conn, run_id, last_seq + 1, at, std::slice::from_ref(event)).await?;
            }
        }
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?");
        let row = sqlx::query(&sql)
            .bind(run_id.0)
            .fetch_one(&mut *conn)
            .await
            .map_err(store_err)?;
        run_from_row(&row)
    })
}

#[async_trait]
impl RunStore for SqliteStore {
    fn durability(&self) -> Durability {
        if self.in_memory {
            Durability::InProcess
        } else {
            Durability::Durable
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(run_id = %run.id))]
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        self.jobs.priority((run, limits), admit_in).await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"))
            .bind(run_id.0)
            .fetch_optional(&self.reader)
            .await
            .map_err(store_err)?;
        row.as_ref().map(run_from_row).transpose()
    }

    #[tracing::instrument(level = "debug", skip(self), fields(run_id = %run_id, fence = %fence))]
    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        self.jobs.run((run_id, fence), start_run_in).await
    }

    #[tracing::instrument(level = "debug", skip(self, events), fields(run_id = %run_id, n = events.len()))]
    async fn append_events(
        &self,
        run_id: RunId,
        fence: Fence,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        check_append_events(run_id, &events)?;
        let given = to_i64(fence.0, "fence")?;
        match self.jobs.append(run_id, fence, given, events).await {
            Ok(events) => {
                self.recent.record(run_id, &events);
                Ok(events)
            }
            Err(e) => {
                self.recent.forget(run_id);
                Err(e)
            }
        }
    }

    #[tracing::instrument(level = "debug", skip(self, events), fields(run_id = %run_id, status = %status))]
    async fn finish_run(
        &self,
        run_id: RunId,
        fence: Option<Fence>,
        status: RunStatus,
        reason: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let finish = Finish {
            run_id,
            fence,
            status,
            reason: reason.to_owned(),
            events,
        };
        let finished = self.jobs.run(finish, finish_run_in).await;
        self.recent.forget(run_id);
        finished
    }

    async fn events_after(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        if let Some(events) = self.recent.after(run_id, after_seq, limit) {
            // Committed by this process just now: no round trip.
            return Ok(events);
        }
        let after = i64::try_from(after_seq).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(
            "SELECT seq, kind, at, payload FROM run_events WHERE run_id = ? AND seq > ? \
             ORDER BY seq LIMIT ?",
        )
        .bind(run_id.0)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.reader)
        .await
        .map_err(store_err)?;
        if rows.is_empty() && self.get_run(run_id).await?.is_none() {
            return Err(StoreError::NotFound { run_id });
        }
        rows.iter().map(|r| event_from_row(run_id, r)).collect()
    }

    async fn save_checkpoint(
        &self,
        run_id: RunId,
        fence: Fence,
        checkpoint: Checkpoint,
    ) -> Result<(), StoreError> {
        self.jobs
            .run((run_id, fence, checkpoint), save_checkpoint_in)
            .await
    }

    async fn load_checkpoint(&self, run_id: RunId) -> Result<Option<Checkpoint>, StoreError> {
        let row = sqlx::query("SELECT checkpoint_turn, checkpoint FROM runs WHERE id = ?")
            .bind(run_id.0)
            .fetch_optional(&self.reader)
            .await
            .map_err(store_err)?;
        let Some(row) = row else {
            return Err(StoreError::NotFound { run_id });
        };
        let turn: Option<i64> = row.try_get(0).map_err(store_err)?;
        let state: Option<String> = row.try_get(1).map_err(store_err)?;
        checkpoint_from_columns(turn, state)
    }

    async fn begin_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        request: serde_json::Value,
    ) -> Result<EffectRecord, StoreError> {
        let effect = Effect {
            run_id,
            fence,
            key: key.to_owned(),
            value: request,
        };
        self.jobs.run(effect, begin_effect_in).await
    }

    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        let effect = Effect {
            run_id,
            fence,
            key: key.to_owned(),
            value: result,
        };
        self.jobs.run(effect, complete_effect_in).await
    }

    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError> {
        let run = self.jobs.run((run_id, event), request_cancel_in).await;
        self.recent.forget(run_id);
        run
    }

    async fn list_runs(&self, status: RunStatus, limit: usize) -> Result<Vec<Run>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE status = ? ORDER BY created_at, id LIMIT ?"
        ))
        .bind(status.as_str())
        .bind(limit)
        .fetch_all(&self.reader)
        .await
        .map_err(store_err)?;
        rows.iter().map(run_from_row).collect()
    }

    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let chat = filter.chat_id.as_deref();
        let status = filter.status.map(RunStatus::as_str);
        let before = before.map(|id| id.0);
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE user_id = ? AND (? IS NULL OR chat_id = ?) AND (? IS NULL OR status = ?) \
             AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?"
        ))
        .bind(user_id)
        .bind(chat)
        .bind(chat)
        .bind(status)
        .bind(status)
        .bind(before)
        .bind(before)
        .bind(limit)
        .fetch_all(&self.reader)
        .await
        .map_err(store_err)?;
        rows.iter().map(run_from_row).collect()
    }

    // ------------------------------------------------------------ chats (sqlite/chats.rs)

    async fn put_messages(
        &self,
        run_id: RunId,
        fence: Fence,
        turn: u32,
        messages: Vec<NewMessage>,
    ) -> Result<(), StoreError> {
        self.put_chat_messages(run_id, fence, turn, messages).await
    }

    async fn chat_messages(
        &self,
        user_id: &str,
        chat_id: &str,
        before_run: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<ChatMessage>, StoreError> {
        self.read_chat_messages(user_id, chat_id, before_run, limit)
            .await
    }

    async fn create_build(
        &self,
        run_id: RunId,
        fence: Fence,
        number: u32,
        command: Vec<String>,
    ) -> Result<BuildJob, StoreError> {
        self.create_build_job(run_id, fence, number, command).await
    }

    async fn claim_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        worker: &str,
    ) -> Result<Option<BuildJob>, StoreError> {
        self.claim_build_job(run_id, number, fence, worker).await
    }

    async fn finish_build(
        &self,
        run_id: RunId,
        number: u32,
        fence: Fence,
        result: BuildResult,
    ) -> Result<BuildJob, StoreError> {
        self.finish_build_job(run_id, number, fence, result).await
    }

    async fn builds(&self, run_id: RunId) -> Result<Vec<BuildJob>, StoreError> {
        self.list_builds(run_id).await
    }
}

fn queue_time(us: i64) -> Result<DateTime<Utc>, QueueError> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| queue_corrupt(format!("timestamp {us}")))
}

fn lease_from_row(row: &SqliteRow) -> Result<Lease, QueueError> {
    let id: Uuid = row.try_get("run_id").map_err(queue_err)?;
    let fence: i64 = row.try_get("fence").map_err(queue_err)?;
    let attempts: i64 = row.try_get("attempts").map_err(queue_err)?;
    let expires: i64 = row.try_get("lease_expires_at").map_err(queue_err)?;
    Ok(Lease {
        run_id: RunId(id),
        owner: row.try_get("owner").map_err(queue_err)?,
        fence: Fence(u64::try_from(fence).map_err(|_| queue_corrupt(format!("fence {fence}")))?),
        attempt: u32::try_from(attempts)
            .map_err(|_| queue_corrupt(format!("attempts {attempts}")))?,
        expires_at: queue_time(expires)?,
    })
}

fn enqueue_in<'c>(
    conn: &'c mut SqliteConnection,
    run_id: &'c RunId,
) -> BoxFuture<'c, Result<(), QueueError>> {
    Box::pin(async move {
        sqlx::query(
            "INSERT INTO queue (run_id, run_at) VALUES (?, ?) ON CONFLICT (run_id) DO NOTHING",
        )
        .bind(run_id.0)
        .bind(micros(now()))
        .execute(&mut *conn)
        .await
        .map_err(queue_err)?;
        Ok(())
    })
}

/// Claim up to `max` claimable jobs, oldest first: one fence per job from
/// the counter, in claim order.
fn claim_in<'c>(
    conn: &'c mut SqliteConnection,
    (owner, lease_for, max): &'c (String, Duration, usize),
) -> BoxFuture<'c, Result<Vec<Lease>, QueueError>> {
    Box::pin(async move {
        let now_us = micros(now());
        let candidates: Vec<i64> = sqlx::query_scalar(
            "SELECT seq FROM queue WHERE dead_lettered_at IS NULL AND run_at <= ? \
             AND (owner IS NULL OR lease_expires_at <= ?) ORDER BY run_at, seq LIMIT ?",
        )
        .bind(now_us)
        .bind(now_us)
        .bind(i64::try_from(*max).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(queue_err)?;
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let k = candidates.len() as i64;
        let last_fence: i64 = sqlx::query_scalar(
            "UPDATE fence_counter SET value = value + ? WHERE id = 1 RETURNING value",
        )
        .bind(k)
        .fetch_one(&mut *conn)
        .await
        .map_err(queue_err)?;
        let expires = now_us.saturating_add(lease_ms(*lease_for).saturating_mul(1000));
        let mut leases = Vec::with_capacity(candidates.len());
        for (i, seq) in candidates.into_iter().enumerate() {
            let row = sqlx::query(
                "UPDATE queue SET owner = ?, fence = ?, attempts = attempts + 1, lease_expires_at = ? \
                 WHERE seq = ? RETURNING run_id, owner, fence, attempts, lease_expires_at",
            )
            .bind(owner)
            .bind(last_fence - k + 1 + i as i64)
            .bind(expires)
            .bind(seq)
            .fetch_one(&mut *conn)
            .await
            .map_err(queue_err)?;
            leases.push(lease_from_row(&row)?);
        }
        Ok(leases)
    })
}

fn heartbeat_in<'c>(
    conn: &'c mut SqliteConnection,
    (lease, lease_for): &'c (Lease, Duration),
) -> BoxFuture<'c, Result<Lease, QueueError>> {
    Box::pin(async move {
        let expires = micros(now()).saturating_add(lease_ms(*lease_for).saturating_mul(1000));
        let row = sqlx::query(
            "UPDATE queue SET lease_expires_at = ? WHERE run_id = ? AND owner = ? AND fence = ? \
             AND dead_lettered_at IS NULL RETURNING run_id, owner, fence, attempts, lease_expires_at",
        )
        .bind(expires)
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .fetch_optional(&mut *conn)
        .await
        .map_err(queue_err)?;
        match row {
            Some(row) => lease_from_row(&row),
            None => Err(lease_lost(lease.run_id, lease.fence)),
        }
    })
}

fn ack_in<'c>(
    conn: &'c mut SqliteConnection,
    lease: &'c Lease,
) -> BoxFuture<'c, Result<(), QueueError>> {
    Box::pin(async move {
        let done = sqlx::query(
            "DELETE FROM queue WHERE run_id = ? AND owner = ? AND fence = ? AND dead_lettered_at IS NULL",
        )
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .execute(&mut *conn)
        .await
        .map_err(queue_err)?;
        if done.rows_affected() == 0 {
            return Err(lease_lost(lease.run_id, lease.fence));
        }
        Ok(())
    })
}

fn retry_in<'c>(
    conn: &'c mut SqliteConnection,
    (lease, error, policy): &'c (Lease, String, RetryPolicy),
) -> BoxFuture<'c, Result<RetryOutcome, QueueError>> {
    Box::pin(async move {
        let attempts: Option<i64> = sqlx::query_scalar(
            "SELECT attempts FROM queue WHERE run_id = ? AND owner = ? AND fence = ? \
             AND dead_lettered_at IS NULL",
        )
        .bind(lease.run_id.0)
        .bind(&lease.owner)
        .bind(queue_range(lease.fence.0)?)
        .fetch_optional(&mut *conn)
        .await
        .map_err(queue_err)?;
        let Some(attempts) = attempts else {
            return Err(lease_lost(lease.run_id, lease.fence));
        };
        let attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
        let at = now();
        if attempts >= policy.max_attempts {
            sqlx::query(
                "UPDATE queue SET owner = NULL, lease_expires_at = NULL, last_error = ?, \
                 dead_lettered_at = ? WHERE run_id = ?",
            )
            .bind(error)
            .bind(micros(at))
            .bind(lease.run_id.0)
            .execute(&mut *conn)
            .await
            .map_err(queue_err)?;
            tracing::warn!(run_id = %lease.run_id, attempts, error, "job dead-lettered");
            Ok(RetryOutcome::DeadLettered)
        } else {
            let delay = backoff_with_jitter(policy, attempts);
            let run_at = at + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            sqlx::query(
                "UPDATE queue SET owner = NULL, lease_expires_at = NULL, last_error = ?, run_at = ? \
                 WHERE run_id = ?",
            )
            .bind(error)
            .bind(micros(run_at))
            .bind(lease.run_id.0)
            .execute(&mut *conn)
            .await
            .map_err(queue_err)?;
            Ok(RetryOutcome::Scheduled { at: run_at })
        }
    })
}

#[async_trait]
impl RunQueue for SqliteStore {
    fn durability(&self) -> Durability {
        RunStore::durability(self)
    }

    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError> {
        self.jobs.priority(run_id, enqueue_in).await
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError> {
        let leases = self
            .jobs
            .priority((owner.to_owned(), lease_for, 1), claim_in)
            .await?;
        let lease = leases.into_iter().next();
        if let Some(lease) = &lease {
            tracing::debug!(run_id = %lease.run_id, fence = %lease.fence, attempt = lease.attempt, "claimed");
        }
        Ok(lease)
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim_many(
        &self,
        owner: &str,
        lease_for: Duration,
        max: usize,
    ) -> Result<Vec<Lease>, QueueError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.jobs
            .priority((owner.to_owned(), lease_for, max), claim_in)
            .await
    }

    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError> {
        self.jobs
            .run((lease.clone(), lease_for), heartbeat_in)
            .await
    }

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.jobs.run(lease.clone(), ack_in).await
    }

    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError> {
        self.jobs
            .run((lease.clone(), error.to_owned(), policy), retry_in)
            .await
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = sqlx::query(
            "SELECT run_id, attempts, last_error, dead_lettered_at FROM queue \
             WHERE dead_lettered_at IS NOT NULL ORDER BY dead_lettered_at DESC, seq DESC LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.reader)
        .await
        .map_err(queue_err)?;
        rows.iter()
            .map(|row| {
                let id: Uuid = row.try_get(0).map_err(queue_err)?;
                let attempts: i64 = row.try_get(1).map_err(queue_err)?;
                let at: i64 = row.try_get(3).map_err(queue_err)?;
                Ok(DeadLetter {
                    run_id: RunId(id),
                    attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
                    last_error: row.try_get(2).map_err(queue_err)?,
                    at: queue_time(at)?,
                })
            })
            .collect()
    }
}

impl From<SqliteStore> for Backend {
    fn from(store: SqliteStore) -> Self {
        store.backend()
    }
}
