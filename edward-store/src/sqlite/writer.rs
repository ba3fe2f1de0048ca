//! Group commit for [`super::SqliteStore`]: one writer task (on its own
//! thread) drains the write requests of every run — appends, claims,
//! heartbeats, checkpoints, effects, status changes — into **one**
//! `BEGIN IMMEDIATE` transaction per tick, then answers each request with its
//! own result.
//!
//! A tick runs claims and admissions first (so starting runs is never
//! starved by a flood of appends), then the other jobs in arrival order, then all
//! appends of the tick together: one `SELECT` of the runs' fences and last
//! seqs, the checks in Rust, one `UPDATE … FROM (VALUES …)` of the last seqs
//! and multi-row `INSERT`s of all events. Seqs stay gap-free per run because
//! they are computed inside the write transaction from the stored `last_seq`.
//!
//! Requests in one tick were all pending at once (none was answered before
//! the commit), so any order among them is a valid serialization.
//!
//! A request refused by a check (stale fence, finished run, lost lease …)
//! writes nothing before it is refused, so it does not disturb the others. A
//! request that fails in the database (or cannot be decoded) may have left
//! part of its writes in the transaction: the tick is rolled back and each of
//! its requests is run again alone, in its own transaction, so one bad
//! request never fails the others.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use edward_core::{AdmitError, Fence, NewEvent, QueueError, RunEvent, RunId, StoreError};
use futures::future::BoxFuture;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::common::{StoreOptions, diagnose, json_text, parse_status, to_u64};
use crate::error::is_retryable;

/// Requests taken into one tick at most (bounds a tick's latency).
const MAX_TICK: usize = 1024;

/// Rows per multi-row `INSERT` of events (5 parameters each; SQLite allows 32,766).
const INSERT_ROWS: usize = 512;

/// The one-connection writer pool, replaced when its connection is left
/// broken (a failed `COMMIT` on a full disk).
#[derive(Debug)]
pub(crate) struct WriterPool {
    current: RwLock<(u64, SqlitePool)>,
    /// How to build a new writer pool (`None` for in-memory databases,
    /// whose data lives in the one connection).
    rebuild: Option<(SqliteConnectOptions, StoreOptions)>,
    /// The connection that checkpoints the WAL (`None` in memory).
    checkpoint: Option<SqlitePool>,
}

impl WriterPool {
    pub(crate) fn new(
        pool: SqlitePool,
        rebuild: Option<(SqliteConnectOptions, StoreOptions)>,
        checkpoint: Option<SqlitePool>,
    ) -> Self {
        WriterPool {
            current: RwLock::new((0, pool)),
            rebuild,
            checkpoint,
        }
    }

    /// Close the writer and checkpoint connections.
    pub(crate) async fn close(&self) {
        self.pool().close().await;
        if let Some(checkpoint) = &self.checkpoint {
            checkpoint.close().await;
        }
    }

    /// The writer pool and its generation.
    fn current(&self) -> (u64, SqlitePool) {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn pool(&self) -> SqlitePool {
        self.current().1
    }

    /// `BEGIN IMMEDIATE` on the writer connection, replacing it first if
    /// it is broken.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        let (generation, pool) = self.current();
        match pool.begin_with("BEGIN IMMEDIATE").await {
            Err(e) if connection_is_broken(&e) => {
                // A failed COMMIT (e.g. "database or disk is full") can leave
                // the one writer connection inside a transaction that sqlx
                // no longer tracks: every later write would fail. Replace it.
                self.recover(generation, &e).await?;
                self.pool().begin_with("BEGIN IMMEDIATE").await
            }
            r => r,
        }
    }

    /// Replace the writer pool of generation `broken` (if no one did already)
    /// with a new one; the old connection is closed, which rolls back
    /// whatever it had open.
    async fn recover(&self, broken: u64, cause: &sqlx::Error) -> Result<(), sqlx::Error> {
        let Some((connect, options)) = &self.rebuild else {
            return Ok(());
        };
        tracing::warn!(error = %cause, "SQLite writer connection is broken; reconnecting");
        let fresh = writer_pool(connect, options, false).await?;
        let old = {
            let mut w = self
                .current
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if w.0 != broken {
                None
            } else {
                Some(std::mem::replace(&mut *w, (broken + 1, fresh.clone())).1)
            }
        };
        match old {
            Some(old) => old.close().await,
            None => fresh.close().await,
        }
        Ok(())
    }
}

/// The one-connection writer pool.
pub(crate) async fn writer_pool(
    connect: &SqliteConnectOptions,
    store: &StoreOptions,
    in_memory: bool,
) -> Result<SqlitePool, sqlx::Error> {
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(store.acquire_timeout)
        .test_before_acquire(false)
        // An in-memory database lives only as long as its connection.
        .idle_timeout(if in_memory {
            None
        } else {
            Some(Duration::from_secs(600))
        })
        .max_lifetime(if in_memory {
            None
        } else {
            Some(Duration::from_secs(1800))
        })
        .connect_with(connect.clone())
        .await
}

/// Whether the writer connection can no longer start transactions: sqlx
/// still counts an earlier transaction as open (its COMMIT failed).
fn connection_is_broken(e: &sqlx::Error) -> bool {
    e.to_string().contains("non-zero transaction depth")
}

/// An error type a job can answer with.
pub(crate) trait JobError: Send + 'static {
    /// The request's transaction did not commit (or never began).
    fn from_sqlx(err: &sqlx::Error) -> Self;
    /// The writer is gone (the store was dropped while a request waited).
    fn writer_gone() -> Self;
    /// Whether the failure may have left part of the job's writes behind
    /// (a database or decoding error), so the tick must be rolled back.
    fn suspect(&self) -> bool;
}

fn backend_message(err: &sqlx::Error) -> (String, bool) {
    let retryable = is_retryable(err);
    tracing::debug!(error = %err, retryable, "SQLite write failed");
    (err.to_string(), retryable)
}

const WRITER_GONE: &str = "the SQLite writer has stopped (store closed)";

impl JobError for StoreError {
    fn from_sqlx(err: &sqlx::Error) -> Self {
        let (message, retryable) = backend_message(err);
        StoreError::Backend { message, retryable }
    }
    fn writer_gone() -> Self {
        StoreError::permanent(WRITER_GONE)
    }
    fn suspect(&self) -> bool {
        matches!(self, StoreError::Backend { .. } | StoreError::Corrupt(_))
    }
}

impl JobError for QueueError {
    fn from_sqlx(err: &sqlx::Error) -> Self {
        let (message, retryable) = backend_message(err);
        QueueError::Backend { message, retryable }
    }
    fn writer_gone() -> Self {
        QueueError::Backend {
            message: WRITER_GONE.into(),
            retryable: false,
        }
    }
    fn suspect(&self) -> bool {
        matches!(self, QueueError::Backend { .. })
    }
}

impl JobError for AdmitError {
    fn from_sqlx(err: &sqlx::Error) -> Self {
        AdmitError::Store(StoreError::from_sqlx(err))
    }
    fn writer_gone() -> Self {
        AdmitError::Store(StoreError::writer_gone())
    }
    fn suspect(&self) -> bool {
        match self {
            AdmitError::Store(e) => e.suspect(),
            _ => false,
        }
    }
}

/// The body of a job: runs on the writer connection inside the tick's
/// transaction, borrowing the job's data (so it can run again alone).
pub(crate) type Exec<D, T, E> =
    for<'c> fn(&'c mut SqliteConnection, &'c D) -> BoxFuture<'c, Result<T, E>>;

/// Something a tick runs in its transaction.
trait Work: Send {
    /// Run in the open transaction; `true` if it failed suspectly.
    fn run<'c>(&'c mut self, conn: &'c mut SqliteConnection) -> BoxFuture<'c, bool>;
}

/// A queued write other than an append.
trait Job: Work {
    /// Answer with the job's result, or with `failed` when its transaction
    /// did not commit.
    fn answer(self: Box<Self>, failed: Option<&sqlx::Error>);
}

struct OpJob<D, T, E> {
    data: D,
    exec: Exec<D, T, E>,
    result: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<D, T, E> Work for OpJob<D, T, E>
where
    D: Send + Sync,
    T: Send,
    E: JobError,
{
    fn run<'c>(&'c mut self, conn: &'c mut SqliteConnection) -> BoxFuture<'c, bool> {
        Box::pin(async move {
            let result = (self.exec)(conn, &self.data).await;
            let suspect = matches!(&result, Err(e) if e.suspect());
            self.result = Some(result);
            suspect
        })
    }
}

impl<D, T, E> Job for OpJob<D, T, E>
where
    D: Send + Sync,
    T: Send,
    E: JobError,
{
    fn answer(self: Box<Self>, failed: Option<&sqlx::Error>) {
        let result = match (failed, self.result) {
            (Some(err), _) => Err(E::from_sqlx(err)),
            (None, Some(result)) => result,
            (None, None) => Err(E::writer_gone()),
        };
        let _ = self.reply.send(result);
    }
}

/// An `append_events` request (checked for the terminal event and the
/// fence range before it was queued).
struct Append {
    run_id: RunId,
    fence: Fence,
    fence_i64: i64,
    events: Vec<NewEvent>,
    /// First seq and time, once placed in the tick's transaction.
    placed: Option<Result<(i64, DateTime<Utc>), StoreError>>,
    reply: oneshot::Sender<Result<Vec<RunEvent>, StoreError>>,
}

impl Work for Append {
    fn run<'c>(&'c mut self, conn: &'c mut SqliteConnection) -> BoxFuture<'c, bool> {
        Box::pin(async move {
            match place_appends(conn, std::slice::from_mut(self)).await {
                Ok(()) => false,
                Err(e) => {
                    self.placed = Some(Err(StoreError::from_sqlx(&e)));
                    true
                }
            }
        })
    }
}

impl Append {
    fn answer(self, failed: Option<&sqlx::Error>) {
        let result = match (failed, self.placed) {
            (Some(err), _) => Err(StoreError::from_sqlx(err)),
            (None, Some(Ok((first, at)))) => self
                .events
                .into_iter()
                .enumerate()
                .map(|(i, e)| {
                    Ok(RunEvent {
                        run_id: self.run_id,
                        seq: to_u64(first + i as i64, "seq")?,
                        kind: e.kind,
                        at,
                        payload: e.payload,
                    })
                })
                .collect(),
            (None, Some(Err(e))) => Err(e),
            (None, None) => Err(StoreError::writer_gone()),
        };
        let _ = self.reply.send(result);
    }
}

enum Request {
    Priority(Box<dyn Job>),
    Job(Box<dyn Job>),
    Append(Append),
}

/// Handle to the writer task; cheap to clone. The task ends when the last
/// handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    tx: mpsc::UnboundedSender<Request>,
}

impl Writer {
    /// Start the writer task on its own thread (a current-thread runtime),
    /// so it does not depend on the caller's runtime staying alive.
    pub(crate) fn spawn(pool: Arc<WriterPool>) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("edward-sqlite-writer".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let checkpoints = pool
                        .checkpoint
                        .clone()
                        .map(|c| tokio::spawn(checkpoints(c)));
                    writer_loop(pool, rx).await;
                    if let Some(task) = checkpoints {
                        task.abort();
                    }
                })
            })?;
        Ok(Writer { tx })
    }

    /// Queue a job and wait for its answer.
    pub(crate) async fn run<D, T, E>(&self, data: D, exec: Exec<D, T, E>) -> Result<T, E>
    where
        D: Send + Sync + 'static,
        T: Send + 'static,
        E: JobError,
    {
        self.send(data, exec, false).await
    }

    /// Queue a claim or an admission (served first in its tick, so that
    /// starting runs never waits behind a flood of appends) and wait for
    /// its answer.
    pub(crate) async fn priority<D, T, E>(&self, data: D, exec: Exec<D, T, E>) -> Result<T, E>
    where
        D: Send + Sync + 'static,
        T: Send + 'static,
        E: JobError,
    {
        self.send(data, exec, true).await
    }

    async fn send<D, T, E>(&self, data: D, exec: Exec<D, T, E>, claim: bool) -> Result<T, E>
    where
        D: Send + Sync + 'static,
        T: Send + 'static,
        E: JobError,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(OpJob {
            data,
            exec,
            result: None,
            reply,
        });
        let request = if claim {
            Request::Priority(job)
        } else {
            Request::Job(job)
        };
        if self.tx.send(request).is_err() {
            return Err(E::writer_gone());
        }
        answer.await.unwrap_or_else(|_| Err(E::writer_gone()))
    }

    /// Queue an append (checked by the caller) and wait for its events.
    pub(crate) async fn append(
        &self,
        run_id: RunId,
        fence: Fence,
        fence_i64: i64,
        events: Vec<NewEvent>,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let append = Append {
            run_id,
            fence,
            fence_i64,
            events,
            placed: None,
            reply,
        };
        if self.tx.send(Request::Append(append)).is_err() {
            return Err(StoreError::writer_gone());
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::writer_gone()))
    }
}

/// How often the WAL is checkpointed (passively: never waits for readers
/// or the writer).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

async fn checkpoints(pool: SqlitePool) {
    let mut every = tokio::time::interval(CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if pool.is_closed() {
            return;
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            tracing::debug!(error = %e, "WAL checkpoint failed; retrying later");
        }
    }
}

async fn writer_loop(pool: Arc<WriterPool>, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut buf = Vec::with_capacity(MAX_TICK);
    while rx.recv_many(&mut buf, MAX_TICK).await > 0 {
        let mut jobs: Vec<Box<dyn Job>> = Vec::with_capacity(buf.len());
        let mut others = Vec::new();
        let mut appends = Vec::new();
        for request in buf.drain(..) {
            match request {
                Request::Priority(job) => jobs.push(job),
                Request::Job(job) => others.push(job),
                Request::Append(append) => appends.push(append),
            }
        }
        jobs.append(&mut others);
        let (n_jobs, n_appends) = (jobs.len(), appends.len());
        let began = std::time::Instant::now();
        tick(&pool, jobs, appends).await;
        tracing::trace!(
            jobs = n_jobs,
            appends = n_appends,
            us = began.elapsed().as_micros() as u64,
            "group commit"
        );
    }
}

/// One tick: everything in one transaction; on a suspect failure or a
/// failed commit, every request again alone.
async fn tick(pool: &WriterPool, mut jobs: Vec<Box<dyn Job>>, mut appends: Vec<Append>) {
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            // The write lock could not be had (another process held it past
            // the busy timeout) or the connection failed: nothing was done.
            for job in jobs {
                job.answer(Some(&e));
            }
            for append in appends {
                append.answer(Some(&e));
            }
            return;
        }
    };
    let mut suspect = false;
    for job in jobs.iter_mut() {
        if job.run(&mut tx).await {
            suspect = true;
            break;
        }
    }
    if !suspect && !appends.is_empty() {
        suspect = place_appends(&mut tx, &mut appends).await.is_err();
    }
    if !suspect {
        match tx.commit().await {
            Ok(()) => {
                for job in jobs {
                    job.answer(None);
                }
                for append in appends {
                    append.answer(None);
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "group commit failed; retrying its requests one by one")
            }
        }
    } else {
        if let Err(e) = tx.rollback().await {
            tracing::warn!(error = %e, "rolling back a group commit failed");
        }
        tracing::debug!("a request failed inside a group commit; retrying them one by one");
    }
    for mut job in jobs {
        let failed = alone(pool, &mut *job).await;
        job.answer(failed.as_ref());
    }
    for mut append in appends {
        let failed = alone(pool, &mut append).await;
        append.answer(failed.as_ref());
    }
}

/// Run one request in its own transaction. Its own (suspect) failure rolls
/// back its transaction and is its answer; `Some` when it could not commit.
async fn alone(pool: &WriterPool, work: &mut dyn Work) -> Option<sqlx::Error> {
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return Some(e),
    };
    if work.run(&mut tx).await {
        // Its own failure is its answer.
        let _ = tx.rollback().await;
        return None;
    }
    tx.commit().await.err()
}

/// Place every append of the tick: check each against its run's stored
/// fence and status (in order, so two appends of one run both get seqs),
/// then write all seqs and events. `Err` only for a database failure; a
/// refused append gets its error in `placed` and writes nothing.
async fn place_appends(
    conn: &mut SqliteConnection,
    appends: &mut [Append],
) -> Result<(), sqlx::Error> {
    // The stored state of each run, in one query.
    let mut ids: Vec<Uuid> = appends.iter().map(|a| a.run_id.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut state: HashMap<Uuid, Result<(edward_core::RunStatus, i64, i64), StoreError>> =
        HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(INSERT_ROWS) {
        let mut select: sqlx::QueryBuilder<'_, Sqlite> =
            sqlx::QueryBuilder::new("SELECT id, status, fence, last_seq FROM runs WHERE id IN (");
        let mut list = select.separated(", ");
        for id in chunk {
            list.push_bind(*id);
        }
        select.push(")");
        for row in select.build().fetch_all(&mut *conn).await? {
            let id: Uuid = row.try_get(0)?;
            let status: String = row.try_get(1)?;
            let fence: i64 = row.try_get(2)?;
            let last_seq: i64 = row.try_get(3)?;
            state.insert(id, parse_status(&status).map(|s| (s, fence, last_seq)));
        }
    }
    // Checks and seqs, in arrival order.
    let at = super::now();
    let mut last_seqs: HashMap<Uuid, i64> = HashMap::new();
    for a in appends.iter_mut() {
        let placed = match state.get_mut(&a.run_id.0) {
            None => Err(StoreError::NotFound { run_id: a.run_id }),
            Some(Err(e)) => Err(StoreError::Corrupt(e.to_string())),
            Some(Ok((status, fence, last_seq))) => {
                if *fence <= a.fence_i64 && !status.is_terminal() {
                    let first = *last_seq + 1;
                    let n = a.events.len() as i64;
                    if n > 0 {
                        *last_seq += n;
                        last_seqs.insert(a.run_id.0, *last_seq);
                    }
                    Ok((first, at))
                } else {
                    let current = to_u64(*fence, "fence").map(Fence);
                    match current {
                        Ok(current) => {
                            Err(diagnose(a.run_id, Some((*status, current)), a.fence, true))
                        }
                        Err(e) => Err(e),
                    }
                }
            }
        };
        a.placed = Some(placed);
    }
    if last_seqs.is_empty() {
        return Ok(());
    }
    // One UPDATE of the runs' last seqs.
    let at_us = at.timestamp_micros();
    let runs: Vec<(Uuid, i64)> = last_seqs.into_iter().collect();
    for chunk in runs.chunks(INSERT_ROWS) {
        let mut update: sqlx::QueryBuilder<'_, Sqlite> = sqlx::QueryBuilder::new(
            "UPDATE runs SET last_seq = v.column2, updated_at = v.column3 FROM (",
        );
        update.push_values(chunk, |mut row, (id, last)| {
            row.push_bind(*id).push_bind(*last).push_bind(at_us);
        });
        update.push(") AS v WHERE runs.id = v.column1");
        update.build().execute(&mut *conn).await?;
    }
    // Multi-row INSERTs of every placed event.
    let rows: Vec<(Uuid, i64, &str, String)> = appends
        .iter()
        .filter_map(|a| match &a.placed {
            Some(Ok((first, _))) => Some((a, *first)),
            _ => None,
        })
        .flat_map(|(a, first)| {
            a.events.iter().enumerate().map(move |(i, e)| {
                (
                    a.run_id.0,
                    first + i as i64,
                    e.kind.as_str(),
                    json_text(&e.payload),
                )
            })
        })
        .collect();
    for chunk in rows.chunks(INSERT_ROWS) {
        let mut insert: sqlx::QueryBuilder<'_, Sqlite> =
            sqlx::QueryBuilder::new("INSERT INTO run_events (run_id, seq, kind, at, payload) ");
        insert.push_values(chunk, |mut row, (id, seq, kind, payload)| {
            row.push_bind(*id)
                .push_bind(*seq)
                .push_bind(*kind)
                .push_bind(at_us)
                .push_bind(payload.as_str());
        });
        insert.build().execute(&mut *conn).await?;
    }
    Ok(())
}
