//! Group commit for [`super::SqliteStore`]: one writer **thread** owns the
//! one write connection (rusqlite, synchronous) and drains the write
//! requests of every run — appends, claims, admissions, heartbeats,
//! checkpoints, effects, status changes — into **one** `BEGIN IMMEDIATE`
//! transaction per tick, then answers each request with its own result.
//!
//! Why a plain thread and a synchronous connection: every statement on an
//! async SQLite connection is a hand-off to the connection's worker thread
//! and back (a context switch each way, and on a busy two-core machine a
//! wait for the scheduler). A tick of a few hundred appends made of a few
//! thousand statements then spent most of its time in hand-offs. Here a
//! tick runs its statements back to back, with cached prepared statements.
//!
//! A tick runs claims and admissions first (so starting runs is never
//! starved by a flood of appends), then the other jobs in arrival order,
//! then the appends. Each request runs inside its own `SAVEPOINT`: a
//! request that fails (refused by a check, or by the database) is rolled
//! back to its savepoint and answered with its error, and the others commit.
//! Seqs stay gap-free per run because each append reads the run's newest
//! stored seq inside the write transaction (two appends of one run in a
//! tick see each other's events).
//!
//! Requests in one tick were all pending at once (none was answered before
//! the commit), so any order among them is a valid serialization.
//!
//! The WAL is kept short: see [`super::checkpoint`]. The writer takes part
//! only at the end of a cycle, when the background checkpointer has copied
//! nearly everything: it copies the last few frames itself between two
//! ticks, so that its next transaction starts the WAL over from the
//! beginning (a checkpoint running beside a busy writer can never finish
//! all frames, and without that the WAL grew by gigabytes under load).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use edward_core::{AdmitError, Fence, NewEvent, QueueError, RunEvent, RunId, StoreError};
use rusqlite::{Connection, OpenFlags, params};
use tokio::sync::oneshot;

use super::checkpoint::Checkpointer;
use crate::common::{diagnose, json_text, parse_status, to_u64};

/// Requests taken into one tick at most (bounds a tick's latency).
const MAX_TICK: usize = 2048;

/// A request body that takes longer than this is logged (debug).
const SLOW_REQUEST: Duration = Duration::from_millis(2);

/// Prepared statements kept per connection.
const STATEMENT_CACHE: usize = 128;

/// How the writer thread opens (and, after a failure, reopens) its connection.
#[derive(Debug, Clone)]
pub(crate) struct WriterConfig {
    /// The database file.
    pub path: PathBuf,
    /// How long a write waits for the lock held by another process.
    pub busy_timeout: Duration,
}

impl WriterConfig {
    /// Open the write connection with its pragmas.
    pub(crate) fn open(&self) -> rusqlite::Result<Connection> {
        // Not `CREATE`: the file was created and migrated when the store
        // was opened; if it is gone, writing must fail, not start afresh.
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(self.busy_timeout)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             -- The writer never checkpoints on commit: a checkpoint copies
             -- pages and fsyncs, in the middle of a group commit. The
             -- checkpointer thread does, beside it (super::checkpoint).
             PRAGMA wal_autocheckpoint = 0;
             -- After the WAL starts over, a file grown larger by a burst
             -- is cut back to this (bytes); below it, the file is reused.
             PRAGMA journal_size_limit = 268435456;
             -- Statement journals of savepoints in memory, not temp files.
             PRAGMA temp_store = MEMORY;
             -- Room for a tick's pages without spilling them mid-transaction.
             PRAGMA cache_size = -16384;",
        )?;
        Ok(conn)
    }
}

/// The writer's connection, reopened when it is left unusable.
struct WriteConn {
    config: WriterConfig,
    conn: Option<Connection>,
}

impl WriteConn {
    fn get(&mut self) -> rusqlite::Result<&Connection> {
        let conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.config.open()?,
        };
        Ok(self.conn.insert(conn))
    }

    /// Make sure no transaction is left open (a failed `COMMIT`, e.g. on a
    /// full disk, may leave one); drop the connection if that fails, so the
    /// next tick opens a fresh one.
    fn settle(&mut self) {
        let Some(conn) = &self.conn else { return };
        if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
            tracing::warn!("SQLite writer connection is broken; reopening it");
            self.conn = None;
        }
    }
}

/// Whether retrying may help after `err`: `BUSY`/`LOCKED` (another
/// process), I/O errors and a full disk (space can be freed).
pub(crate) fn sqlite_retryable(err: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        err.sqlite_error_code(),
        Some(DatabaseBusy | DatabaseLocked | SystemIoFailure | DiskFull)
    )
}

/// `err` as a store error (retryable when [`sqlite_retryable`]).
pub(crate) fn sqlite_store_err(err: &rusqlite::Error) -> StoreError {
    let retryable = sqlite_retryable(err);
    tracing::debug!(error = %err, retryable, "SQLite write failed");
    StoreError::Backend {
        message: err.to_string(),
        retryable,
    }
}

/// `err` as a queue error (retryable when [`sqlite_retryable`]).
pub(crate) fn sqlite_queue_err(err: &rusqlite::Error) -> QueueError {
    QueueError::Backend {
        message: err.to_string(),
        retryable: sqlite_retryable(err),
    }
}

/// An error type a job can answer with.
pub(crate) trait JobError: Send + 'static {
    /// The request's transaction did not commit (or never began).
    fn from_sqlite(err: &rusqlite::Error) -> Self;
    /// The writer is gone (the store was closed while a request waited).
    fn writer_gone() -> Self;
}

const WRITER_GONE: &str = "the SQLite writer has stopped (store closed)";

impl JobError for StoreError {
    fn from_sqlite(err: &rusqlite::Error) -> Self {
        sqlite_store_err(err)
    }
    fn writer_gone() -> Self {
        StoreError::permanent(WRITER_GONE)
    }
}

impl JobError for QueueError {
    fn from_sqlite(err: &rusqlite::Error) -> Self {
        sqlite_queue_err(err)
    }
    fn writer_gone() -> Self {
        QueueError::Backend {
            message: WRITER_GONE.into(),
            retryable: false,
        }
    }
}

impl JobError for AdmitError {
    fn from_sqlite(err: &rusqlite::Error) -> Self {
        AdmitError::Store(StoreError::from_sqlite(err))
    }
    fn writer_gone() -> Self {
        AdmitError::Store(StoreError::writer_gone())
    }
}

/// The body of a job: runs on the writer connection inside the tick's
/// transaction (in a savepoint of its own). An `Err` rolls back whatever it
/// wrote.
pub(crate) type Exec<D, T, E> = fn(&Connection, &D) -> Result<T, E>;

/// A queued write other than an append.
trait Job: Send {
    /// Run inside the open transaction, in its own savepoint. `Err` when the
    /// savepoint itself failed: the transaction may then hold part of the
    /// job's writes and must be rolled back whole.
    fn run(&mut self, conn: &Connection) -> rusqlite::Result<()>;
    /// Answer with the job's result, or with `failed` when the tick's
    /// transaction did not commit.
    fn answer(self: Box<Self>, failed: Option<&rusqlite::Error>);
}

struct OpJob<D, T, E> {
    data: D,
    exec: Exec<D, T, E>,
    result: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<D, T, E> Job for OpJob<D, T, E>
where
    D: Send,
    T: Send,
    E: JobError,
{
    fn run(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let began = Instant::now();
        self.result = Some(in_savepoint(conn, || (self.exec)(conn, &self.data))?);
        let took = began.elapsed();
        if took > SLOW_REQUEST {
            tracing::debug!(
                request = std::any::type_name::<D>(),
                us = took.as_micros() as u64,
                "slow SQLite write request"
            );
        }
        Ok(())
    }

    fn answer(self: Box<Self>, failed: Option<&rusqlite::Error>) {
        let result = match (failed, self.result) {
            (Some(err), _) => Err(E::from_sqlite(err)),
            (None, Some(result)) => result,
            (None, None) => Err(E::writer_gone()),
        };
        let _ = self.reply.send(result);
    }
}

/// Run `body` in a savepoint: released when it succeeds, rolled back when
/// it fails, so a failed request leaves nothing in the tick's transaction.
/// The outer `Err`: the savepoint statements themselves failed.
fn in_savepoint<T, E>(
    conn: &Connection,
    body: impl FnOnce() -> Result<T, E>,
) -> rusqlite::Result<Result<T, E>> {
    let step = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([]));
    step("SAVEPOINT request")?;
    let result = body();
    if result.is_err() {
        step("ROLLBACK TO request")?;
    }
    step("RELEASE request")?;
    Ok(result)
}

/// An `append_events` request (checked for the terminal event and the
/// fence range before it was queued).
struct Append {
    run_id: RunId,
    fence: Fence,
    fence_i64: i64,
    events: Vec<NewEvent>,
    /// The payloads as JSON text, made by the caller (the writer thread
    /// is the one thread every append goes through: it should only write).
    payloads: Vec<String>,
    /// First seq and time, once placed in the tick's transaction.
    placed: Option<Result<(i64, DateTime<Utc>), StoreError>>,
    reply: oneshot::Sender<Result<Vec<RunEvent>, StoreError>>,
}

impl Append {
    fn answer(self, failed: Option<&rusqlite::Error>) {
        let result = match (failed, self.placed) {
            (Some(err), _) => Err(StoreError::from_sqlite(err)),
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
    /// Stop after the requests queued before it.
    Close(oneshot::Sender<()>),
}

/// Handle to the writer thread; cheap to clone. The thread ends when the
/// store is closed or the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Request>,
}

impl Writer {
    /// Start the writer thread, and the checkpointer thread beside it.
    pub(crate) fn spawn(config: WriterConfig) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel();
        let checkpointer = Checkpointer::spawn(config.clone())?;
        std::thread::Builder::new()
            .name("edward-sqlite-writer".into())
            .spawn(move || {
                let conn = WriteConn { config, conn: None };
                writer_loop(conn, rx, &checkpointer);
                checkpointer.stop();
            })?;
        Ok(Writer { tx })
    }

    /// Queue a job and wait for its answer.
    pub(crate) async fn run<D, T, E>(&self, data: D, exec: Exec<D, T, E>) -> Result<T, E>
    where
        D: Send + 'static,
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
        D: Send + 'static,
        T: Send + 'static,
        E: JobError,
    {
        self.send(data, exec, true).await
    }

    async fn send<D, T, E>(&self, data: D, exec: Exec<D, T, E>, first: bool) -> Result<T, E>
    where
        D: Send + 'static,
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
        let request = if first {
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
        let payloads = events.iter().map(|e| json_text(&e.payload)).collect();
        let append = Append {
            run_id,
            fence,
            fence_i64,
            events,
            payloads,
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

    /// Stop the writer after what is queued; later requests fail with
    /// "writer stopped". Returns when its connection is closed.
    pub(crate) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.tx.send(Request::Close(done)).is_ok() {
            let _ = closed.await;
        }
    }
}

/// What one turn of the writer loop decided.
enum Turn {
    Continue,
    Stop,
}

fn writer_loop(mut conn: WriteConn, rx: mpsc::Receiver<Request>, checkpointer: &Checkpointer) {
    let mut pending: VecDeque<Request> = VecDeque::new();
    loop {
        // Nothing may stop the store's only writer — not a bug in a request
        // body, not a log line that cannot be written (tracing reports a
        // failed write to stderr with `eprintln!`, which panics when stderr
        // is a closed pipe): the requests of the turn lose their answers
        // (their callers see the writer as gone), the connection is rolled
        // back, and the loop goes on.
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            writer_turn(&mut conn, &rx, &mut pending, checkpointer)
        }));
        match turn {
            Ok(Turn::Continue) => {}
            Ok(Turn::Stop) => return,
            Err(_) => {
                conn.settle();
                let _ = std::panic::catch_unwind(|| {
                    tracing::error!("the SQLite writer panicked; its tick was rolled back");
                });
            }
        }
    }
}

fn writer_turn(
    conn: &mut WriteConn,
    rx: &mpsc::Receiver<Request>,
    pending: &mut VecDeque<Request>,
    checkpointer: &Checkpointer,
) -> Turn {
    // Wait for work, then take everything queued (up to MAX_TICK).
    if pending.is_empty() {
        match rx.recv() {
            Ok(r) => pending.push_back(r),
            Err(_) => return Turn::Stop,
        }
    }
    while pending.len() < MAX_TICK {
        match rx.try_recv() {
            Ok(r) => pending.push_back(r),
            Err(_) => break,
        }
    }
    let mut jobs: Vec<Box<dyn Job>> = Vec::new();
    let mut others: Vec<Box<dyn Job>> = Vec::new();
    let mut appends = Vec::new();
    let mut close = None;
    while let Some(request) = pending.pop_front() {
        match request {
            Request::Priority(job) => jobs.push(job),
            Request::Job(job) => others.push(job),
            Request::Append(append) => appends.push(append),
            Request::Close(done) => {
                close = Some(done);
                break;
            }
        }
    }
    jobs.append(&mut others);
    if !jobs.is_empty() || !appends.is_empty() {
        tick(conn, jobs, appends);
    }
    if let Some(done) = close {
        // Answer what arrived after the close, then stop.
        while let Ok(request) = rx.try_recv() {
            refuse(request);
        }
        for request in pending.drain(..) {
            refuse(request);
        }
        conn.conn = None;
        let _ = done.send(());
        return Turn::Stop;
    }
    if checkpointer.take_reset_request() {
        finish_cycle(conn);
    }
    Turn::Continue
}

fn refuse(request: Request) {
    match request {
        Request::Priority(job) | Request::Job(job) => job.answer(None),
        Request::Append(append) => append.answer(None),
        Request::Close(done) => {
            let _ = done.send(());
        }
    }
}

/// Copy the WAL frames the checkpointer has not yet copied, between two
/// ticks (no frame is added meanwhile), so that the next transaction starts
/// the WAL over. Passive: a reader still using old frames makes it stop
/// short, and the checkpointer asks again later.
fn finish_cycle(conn: &mut WriteConn) {
    let Ok(c) = conn.get() else { return };
    let began = Instant::now();
    let result: rusqlite::Result<(i64, i64, i64)> =
        c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        });
    match result {
        Ok((busy, log, done)) => tracing::debug!(
            busy,
            log,
            done,
            us = began.elapsed().as_micros() as u64,
            "writer finished a WAL cycle"
        ),
        Err(e) => tracing::debug!(error = %e, "writer checkpoint failed; the checkpointer retries"),
    }
}

/// One tick: everything in one transaction, each request in its own
/// savepoint; when the transaction cannot begin or commit (or a savepoint
/// fails), it is rolled back and every request is answered with that error.
fn tick(conn: &mut WriteConn, mut jobs: Vec<Box<dyn Job>>, mut appends: Vec<Append>) {
    let failed = match conn.get() {
        Err(e) => Some(e),
        Ok(c) => run_tick(c, &mut jobs, &mut appends).err(),
    };
    if let Some(e) = &failed {
        tracing::warn!(error = %e, jobs = jobs.len(), appends = appends.len(), "SQLite group commit failed");
        conn.settle();
    }
    for job in jobs {
        job.answer(failed.as_ref());
    }
    for append in appends {
        append.answer(failed.as_ref());
    }
}

fn run_tick(
    c: &Connection,
    jobs: &mut [Box<dyn Job>],
    appends: &mut [Append],
) -> rusqlite::Result<()> {
    let began = Instant::now();
    c.execute_batch("BEGIN IMMEDIATE")?;
    let locked = began.elapsed();
    for job in jobs.iter_mut() {
        job.run(c)?;
    }
    let jobs_done = began.elapsed();
    place_appends(c, appends)?;
    let appends_done = began.elapsed();
    c.execute_batch("COMMIT")?;
    let us = |d: Duration| d.as_micros() as u64;
    tracing::trace!(
        jobs = jobs.len(),
        appends = appends.len(),
        begin_us = us(locked),
        jobs_us = us(jobs_done - locked),
        appends_us = us(appends_done - jobs_done),
        commit_us = us(began.elapsed() - appends_done),
        "group commit"
    );
    Ok(())
}

/// Place every append of the tick, in arrival order: check it against its
/// run's stored fence and status and insert its events with the seqs after
/// its newest — each append in its own savepoint. The run's row is not
/// written (its last seq is its newest event's).
fn place_appends(conn: &Connection, appends: &mut [Append]) -> rusqlite::Result<()> {
    let at = super::now();
    let at_us = at.timestamp_micros();
    for a in appends.iter_mut() {
        let placed = in_savepoint(conn, || place_one(conn, a, at_us))?;
        a.placed = Some(placed.map(|first| (first, at)));
    }
    Ok(())
}

/// One append; `Ok(first seq)`.
fn place_one(conn: &Connection, a: &Append, at_us: i64) -> Result<i64, StoreError> {
    let err = |e: rusqlite::Error| StoreError::from_sqlite(&e);
    let state = {
        let mut select = conn
            .prepare_cached(super::ops::LAST_SEQ_STATE)
            .map_err(err)?;
        let mut rows = select.query(params![a.run_id.0]).map_err(err)?;
        match rows.next().map_err(err)? {
            None => return Err(StoreError::NotFound { run_id: a.run_id }),
            Some(row) => {
                let status: String = row.get(0).map_err(err)?;
                let fence: i64 = row.get(1).map_err(err)?;
                let last_seq: i64 = row.get(2).map_err(err)?;
                (parse_status(&status)?, fence, last_seq)
            }
        }
    };
    let (status, fence, last_seq) = state;
    if fence > a.fence_i64 || status.is_terminal() {
        let current = Fence(to_u64(fence, "fence")?);
        return Err(diagnose(a.run_id, Some((status, current)), a.fence, true));
    }
    let first = last_seq + 1;
    if a.events.is_empty() {
        return Ok(first);
    }
    {
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO run_events (run_id, seq, kind, at, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(err)?;
        for (i, (e, payload)) in a.events.iter().zip(&a.payloads).enumerate() {
            insert
                .execute(params![
                    a.run_id.0,
                    first + i as i64,
                    e.kind,
                    at_us,
                    payload
                ])
                .map_err(err)?;
        }
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_file() -> (tempfile::TempDir, WriterConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("w.db");
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER);")
            .expect("schema");
        let config = WriterConfig {
            path,
            busy_timeout: Duration::from_secs(5),
        };
        (dir, config)
    }

    fn insert(conn: &Connection, x: &i64) -> Result<usize, StoreError> {
        conn.execute("INSERT INTO t (x) VALUES (?1)", [x])
            .map_err(|e| sqlite_store_err(&e))
    }

    fn insert_then_panic(conn: &Connection, x: &i64) -> Result<usize, StoreError> {
        insert(conn, x)?;
        panic!("a bug in a request body");
    }

    fn insert_then_refuse(conn: &Connection, x: &i64) -> Result<usize, StoreError> {
        insert(conn, x)?;
        Err(StoreError::permanent("refused after writing"))
    }

    fn count(conn: &Connection, _: &()) -> Result<i64, StoreError> {
        conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .map_err(|e| sqlite_store_err(&e))
    }

    #[tokio::test]
    async fn a_refused_request_leaves_nothing_and_the_others_commit() {
        let (_dir, config) = store_file();
        let writer = Writer::spawn(config).expect("spawn");
        let (a, b, c) = tokio::join!(
            writer.run(1, insert),
            writer.run(2, insert_then_refuse),
            writer.run(3, insert)
        );
        assert_eq!(a.expect("first"), 1);
        assert!(b.is_err());
        assert_eq!(c.expect("third"), 1);
        assert_eq!(writer.run((), count).await.expect("count"), 2);
        writer.close().await;
    }

    #[tokio::test]
    async fn a_panicking_request_does_not_stop_the_writer() {
        let (_dir, config) = store_file();
        let writer = Writer::spawn(config).expect("spawn");
        writer.run(1, insert).await.expect("before");
        let panicked = writer.run(2, insert_then_panic).await;
        assert!(panicked.is_err(), "the panicking request gets an error");
        // Its tick was rolled back; the writer still serves requests.
        writer.run(3, insert).await.expect("after");
        assert_eq!(writer.run((), count).await.expect("count"), 2);
        writer.close().await;
        assert!(writer.run(4, insert).await.is_err(), "closed");
    }
}
