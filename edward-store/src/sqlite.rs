//! [`SqliteStore`]: the embedded durable store and queue on one SQLite file.
//!
//! Writes go through one connection owned by the writer thread
//! (`sqlite/writer.rs`, rusqlite), and every write transaction is
//! `BEGIN IMMEDIATE`, so a transaction that reads before it writes (admit,
//! append, claim) holds the database's write lock from its first statement:
//! admission is an exact check-and-insert, and seqs and fences cannot race.
//! The writer group-commits the writes of all runs: whatever is queued when
//! a transaction ends goes into the next one, each request answered with
//! its own result. The WAL is kept short by a checkpointer thread beside it
//! (`sqlite/checkpoint.rs`). Other processes opening the same file wait for
//! the lock up to the configured timeout (`busy_timeout`), then fail
//! retryably. Reads use a separate pool of sqlx readers (WAL mode lets them
//! run beside the writer). Migrations are sqlx's, run on open.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use edward_core::Durability;
use edward_core::engine::Backend;
use edward_core::memory::MemoryNotifier;
use edward_core::{
    AdmissionLimits, AdmitError, BuildJob, BuildResult, ChatMessage, Checkpoint, DeadLetter,
    EffectRecord, Fence, Lease, NewEvent, NewMessage, NewRun, QueueError, RetryOutcome,
    RetryPolicy, Run, RunEvent, RunFilter, RunId, RunQueue, RunStatus, RunStore, StoreError,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use std::time::Duration;
use uuid::Uuid;

use crate::common::{
    StoreOptions, check_append_events, checkpoint_from_columns, parse_json, queue_corrupt, to_i64,
    to_u64,
};
use crate::error::{ConnectError, corrupt, queue_err, store_err};

mod chats;
mod checkpoint;
mod credentials;
mod ops;
mod rows;
mod writer;

use rows::{RUN_COLUMNS, run_from};
use writer::{Writer, WriterConfig};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// SQLite [`RunStore`] + [`RunQueue`]: the embedded durable default.
///
/// Cloning is cheap (the pools and the writer thread are shared).
///
/// ```no_run
/// # async fn demo() -> Result<(), edward_store::ConnectError> {
/// let store = edward_store::SqliteStore::open("edward.db").await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The group-commit writer thread every write goes through.
    jobs: Writer,
    /// Events this process appended lately, for its own tailers.
    recent: Arc<crate::recent::Recent>,
    reader: SqlitePool,
    /// The private directory of an "in-memory" store (removed with the
    /// last clone); `None` for a file the caller named.
    scratch: Option<Arc<tempfile::TempDir>>,
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

    /// A private store that lives as long as the value (and its clones):
    /// its file is in a private temporary directory, removed with the last
    /// clone. Its [`RunStore::durability`] is `InProcess`.
    pub async fn in_memory() -> Result<Self, ConnectError> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")
            .map_err(|e| ConnectError::Config(e.to_string()))?;
        Self::connect_with(options, StoreOptions::default()).await
    }

    /// Connect with explicit sqlx connect options and store options.
    /// WAL journaling, `synchronous = NORMAL` and a busy timeout of
    /// `store.acquire_timeout` are applied on top of `connect`. An
    /// in-memory URL (`sqlite::memory:`) gives a private store as
    /// [`SqliteStore::in_memory`] does: the writer thread and the readers
    /// need one database they all can open, so it is a file in a private
    /// temporary directory.
    pub async fn connect_with(
        connect: SqliteConnectOptions,
        store: StoreOptions,
    ) -> Result<Self, ConnectError> {
        let in_memory = {
            let name = connect.get_filename().to_string_lossy();
            name == ":memory:"
                || name.starts_with("file:sqlx-in-memory")
                || name.contains("mode=memory")
        };
        let (connect, scratch) = if in_memory {
            let dir = tempfile::Builder::new()
                .prefix("edward-sqlite-")
                .tempdir()
                .map_err(|e| ConnectError::Connect(sqlx::Error::Io(e)))?;
            let options = SqliteConnectOptions::new()
                .filename(dir.path().join("edward.db"))
                .create_if_missing(true);
            (options, Some(Arc::new(dir)))
        } else {
            (connect, None)
        };
        let connect = connect
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(store.acquire_timeout);
        let path: PathBuf = connect.get_filename().to_path_buf();
        // Create the file, switch it to WAL and migrate it on one connection,
        // then hand writing over to the writer thread.
        {
            let mut setup = connect.connect().await.map_err(ConnectError::Connect)?;
            if store.run_migrations {
                MIGRATOR.run(&mut setup).await?;
            }
            sqlx::Connection::close(setup)
                .await
                .map_err(ConnectError::Connect)?;
        }
        let reader = SqlitePoolOptions::new()
            .max_connections(store.max_connections)
            .acquire_timeout(store.acquire_timeout)
            // A ping before every read is one more thread hand-off per
            // query; a dead embedded connection fails the query anyway.
            .test_before_acquire(false)
            .connect_with(connect.clone().read_only(true))
            .await
            .map_err(ConnectError::Connect)?;
        let jobs = Writer::spawn(WriterConfig {
            path,
            busy_timeout: store.acquire_timeout,
        })
        .map_err(|e| ConnectError::Connect(sqlx::Error::Io(e)))?;
        Ok(SqliteStore {
            jobs,
            recent: Arc::default(),
            reader,
            scratch,
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

    /// Stop the writer (after what is queued) and close the readers. Later
    /// calls on this store or its clones fail.
    pub async fn close(&self) {
        self.jobs.close().await;
        self.reader.close().await;
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

fn from_micros(us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| corrupt(format!("timestamp {us}")))
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

pub(crate) fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

#[async_trait]
impl RunStore for SqliteStore {
    fn durability(&self) -> Durability {
        if self.scratch.is_some() {
            Durability::InProcess
        } else {
            Durability::Durable
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(run_id = %run.id))]
    async fn admit(&self, run: NewRun, limits: AdmissionLimits) -> Result<Run, AdmitError> {
        self.jobs.priority((run, limits), ops::admit).await
    }

    async fn get_run(&self, run_id: RunId) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?"))
            .bind(run_id.0)
            .fetch_optional(&self.reader)
            .await
            .map_err(store_err)?;
        row.as_ref().map(run_from).transpose()
    }

    #[tracing::instrument(level = "debug", skip(self), fields(run_id = %run_id, fence = %fence))]
    async fn start_run(&self, run_id: RunId, fence: Fence) -> Result<Run, StoreError> {
        self.jobs.run((run_id, fence), ops::start_run).await
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
        let finish = ops::Finish {
            run_id,
            fence,
            status,
            reason: reason.to_owned(),
            events,
        };
        let finished = self.jobs.run(finish, ops::finish_run).await;
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
            .run((run_id, fence, checkpoint), ops::save_checkpoint)
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
        let effect = ops::Effect {
            run_id,
            fence,
            key: key.to_owned(),
            value: request,
        };
        self.jobs.run(effect, ops::begin_effect).await
    }

    async fn complete_effect(
        &self,
        run_id: RunId,
        fence: Fence,
        key: &str,
        result: serde_json::Value,
    ) -> Result<(), StoreError> {
        let effect = ops::Effect {
            run_id,
            fence,
            key: key.to_owned(),
            value: result,
        };
        self.jobs.run(effect, ops::complete_effect).await
    }

    async fn request_cancel(&self, run_id: RunId, event: NewEvent) -> Result<Run, StoreError> {
        let run = self.jobs.run((run_id, event), ops::request_cancel).await;
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
        rows.iter().map(run_from).collect()
    }

    async fn list_user_runs(
        &self,
        user_id: &str,
        filter: &RunFilter,
        before: Option<RunId>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let sql = crate::common::user_runs_sql(
            &format!("SELECT {RUN_COLUMNS} FROM runs"),
            |_| "?".to_owned(),
            filter,
            before,
        );
        let rows = crate::common::bind_user_runs(&sql, user_id, filter, before, limit)
            .fetch_all(&self.reader)
            .await
            .map_err(store_err)?;
        rows.iter().map(run_from).collect()
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

#[async_trait]
impl RunQueue for SqliteStore {
    fn durability(&self) -> Durability {
        RunStore::durability(self)
    }

    async fn enqueue(&self, run_id: RunId) -> Result<(), QueueError> {
        self.jobs.priority(run_id, ops::enqueue).await
    }

    #[tracing::instrument(level = "debug", skip(self))]
    async fn claim(&self, owner: &str, lease_for: Duration) -> Result<Option<Lease>, QueueError> {
        let leases = self
            .jobs
            .priority((owner.to_owned(), lease_for, 1), ops::claim)
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
            .priority((owner.to_owned(), lease_for, max), ops::claim)
            .await
    }

    async fn heartbeat(&self, lease: &Lease, lease_for: Duration) -> Result<Lease, QueueError> {
        self.jobs
            .run((lease.clone(), lease_for), ops::heartbeat)
            .await
    }

    async fn ack(&self, lease: &Lease) -> Result<(), QueueError> {
        self.jobs.run(lease.clone(), ops::ack).await
    }

    async fn retry(
        &self,
        lease: &Lease,
        error: &str,
        policy: RetryPolicy,
    ) -> Result<RetryOutcome, QueueError> {
        self.jobs
            .run((lease.clone(), error.to_owned(), policy), ops::retry)
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
